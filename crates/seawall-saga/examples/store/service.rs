//! The store as three services (stock, payment, shipping), each with its own
//! SQLite database, its own outbox relay and its own inbox consumer, talking
//! only through one Redis stream.
//!
//! - `order_placed` → stock reserves (`stock_reserved`);
//! - `stock_reserved` → payment charges (`payment_charged`);
//! - `payment_charged` → shipping ships (`order_shipped`), or, for the orders
//!   [`ships`] refuses, cancels (`order_cancelled`);
//! - `order_cancelled` → payment refunds and stock releases, each on its own.
//!
//! Each effect, its outgoing event and the inbox record of the message that
//! caused it are written in one local transaction: a service killed anywhere
//! redoes nothing that was committed and loses nothing that was not.
//!
//! Shared by the `store` example, the `store_chaos` test and the
//! `seawall-demo choreography` subcommand.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{params, Connection, OpenFlags, Transaction};
use seawall_saga::broker::redis_streams::RedisStreams;
use seawall_saga::broker::{Broker, Delivery, Envelope, Subscription};
use seawall_saga::outbox::{self, Inbox, Outbox, Relay, RelayOptions};

/// The stream every service publishes to and reads from.
pub(crate) const STREAM: &str = "store:events";

/// The source name of the orders placed by [`place_order`].
pub(crate) const ORDERS: &str = "orders";

/// How long a delivered message may stay unacknowledged before the service
/// (restarted after a crash) takes it over again.
const STALE: Duration = Duration::from_millis(300);

/// One of the three services.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Role {
    /// Reserves and releases stock.
    Stock,
    /// Charges and refunds.
    Payment,
    /// Ships, or cancels the order.
    Shipping,
}

impl Role {
    /// The three services.
    pub(crate) const ALL: [Role; 3] = [Role::Stock, Role::Payment, Role::Shipping];

    /// The service named `name`.
    pub(crate) fn parse(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.name() == name)
    }

    /// The service's name (its consumer group and outbox source).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Role::Stock => "stock",
            Role::Payment => "payment",
            Role::Shipping => "shipping",
        }
    }
}

/// Whether shipping ships order `order` (it cancels every fifth order, from
/// the fourth on: 3, 8, 13, ...).
pub(crate) fn ships(order: u64) -> bool {
    order % 5 != 3
}

/// An effect a service committed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Effect {
    /// The service.
    pub(crate) role: Role,
    /// The order.
    pub(crate) order: u64,
    /// What was done (`reserved`, `charged`, `shipped`, `cancelled`,
    /// `refunded`, `released`).
    pub(crate) effect: &'static str,
}

/// Any error of a service.
pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;

/// Opens (creating it if needed) the database of a service at `path`: WAL,
/// the outbox tables and the `effects` table (one row per effect, no unique
/// constraint, so that a duplicate effect would show).
pub(crate) fn open_db(path: &Path) -> Result<Connection, Error> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    outbox::migrate(&conn)?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS effects (
             seq INTEGER PRIMARY KEY AUTOINCREMENT,
             order_id INTEGER NOT NULL,
             effect TEXT NOT NULL
         )",
    )?;
    Ok(conn)
}

/// Publishes `order_placed` for order `order` (the event id is the same on
/// every call: placing an order twice places it once).
pub(crate) async fn place_order(broker: &impl Broker, order: u64) -> Result<(), Error> {
    let envelope = Envelope {
        event_id: format!("{ORDERS}:{order}"),
        aggregate: format!("order-{order}"),
        event_type: "order_placed".to_owned(),
        payload: order.to_string(),
        created_at_ms: 0,
    };
    broker.publish(STREAM, &[envelope]).await?;
    Ok(())
}

/// Whether `effect` of `order` was committed in `tx`.
fn has(tx: &Transaction<'_>, order: u64, effect: &str) -> Result<bool, rusqlite::Error> {
    tx.query_row(
        "SELECT EXISTS (SELECT 1 FROM effects WHERE order_id = ?1 AND effect = ?2)",
        params![order as i64, effect],
        |r| r.get(0),
    )
}

/// Applies `effect` to `order` in `tx` and enqueues `event` (if any).
fn apply(
    tx: &Transaction<'_>,
    role: Role,
    order: u64,
    effect: &'static str,
    event: Option<&str>,
) -> Result<Effect, Error> {
    tx.execute(
        "INSERT INTO effects (order_id, effect) VALUES (?1, ?2)",
        params![order as i64, effect],
    )?;
    if let Some(event) = event {
        Outbox::enqueue(tx, &format!("order-{order}"), event, &order.to_string())?;
    }
    Ok(Effect {
        role,
        order,
        effect,
    })
}

/// Handles one message in one transaction: the inbox record, the effect and
/// the outgoing event. Returns the effect, if there is one (none for a
/// duplicate or an event this service does not react to).
fn handle(conn: &mut Connection, role: Role, delivery: &Delivery) -> Result<Option<Effect>, Error> {
    let envelope = &delivery.envelope;
    let reacts = matches!(
        (role, envelope.event_type.as_str()),
        (Role::Stock, "order_placed" | "order_cancelled")
            | (Role::Payment, "stock_reserved" | "order_cancelled")
            | (Role::Shipping, "payment_charged")
    );
    if !reacts {
        return Ok(None);
    }
    let order: u64 = envelope
        .payload
        .parse()
        .map_err(|e| format!("order id {:?}: {e}", envelope.payload))?;
    let tx = conn.transaction()?;
    if !Inbox::handle(&tx, role.name(), &envelope.event_id)? {
        return Ok(None);
    }
    let effect = match (role, envelope.event_type.as_str()) {
        (Role::Stock, "order_placed") => {
            Some(apply(&tx, role, order, "reserved", Some("stock_reserved"))?)
        }
        (Role::Payment, "stock_reserved") => {
            Some(apply(&tx, role, order, "charged", Some("payment_charged"))?)
        }
        (Role::Shipping, _) if ships(order) => {
            Some(apply(&tx, role, order, "shipped", Some("order_shipped"))?)
        }
        (Role::Shipping, _) => Some(apply(
            &tx,
            role,
            order,
            "cancelled",
            Some("order_cancelled"),
        )?),
        (Role::Stock, _) if has(&tx, order, "reserved")? => {
            Some(apply(&tx, role, order, "released", None)?)
        }
        (Role::Payment, _) if has(&tx, order, "charged")? => {
            Some(apply(&tx, role, order, "refunded", None)?)
        }
        _ => None,
    };
    tx.commit()?;
    Ok(effect)
}

/// Runs the service `role` on the database at `db` and the Redis server at
/// `redis_url` until `shutdown` resolves: its outbox relay and its consumer.
/// `on_effect` is called after each committed effect.
pub(crate) async fn run(
    role: Role,
    db: &Path,
    redis_url: &str,
    shutdown: impl Future<Output = ()>,
    mut on_effect: impl FnMut(&Effect),
) -> Result<(), Error> {
    let mut conn = open_db(db)?;
    let broker = Arc::new(RedisStreams::open(redis_url)?.timeout(Duration::from_secs(1)));
    let relay = Relay::open(
        db,
        Arc::clone(&broker),
        RelayOptions::new(role.name(), STREAM)
            .poll_interval(Duration::from_millis(10))
            .retry_interval(Duration::from_millis(100)),
    )?;
    let (stop_relay, relay_stopped) = tokio::sync::oneshot::channel::<()>();
    let relay = tokio::spawn(async move {
        relay
            .run(async {
                let _ = relay_stopped.await;
            })
            .await
    });
    let subscription = Subscription::new(STREAM, role.name(), format!("{}-1", role.name()));
    let mut shutdown = std::pin::pin!(shutdown);
    let consume = async {
        while let Err(e) = broker.create_group(&subscription).await {
            if !e.is_unavailable() {
                return Err::<(), Error>(e.into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        loop {
            // A failure to claim is a failure to reach Redis: reading below
            // reports it too.
            let mut batch: Vec<Delivery> = broker
                .claim_stale(&subscription, STALE, 32)
                .await
                .unwrap_or_default();
            if batch.is_empty() {
                match broker
                    .read(&subscription, 32, Duration::from_millis(100))
                    .await
                {
                    Ok(read) => batch = read,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                }
            }
            let mut ids = Vec::with_capacity(batch.len());
            for delivery in &batch {
                if let Some(effect) = handle(&mut conn, role, delivery)? {
                    on_effect(&effect);
                }
                ids.push(delivery.id.clone());
            }
            if !ids.is_empty() {
                // A lost acknowledgement only means a redelivery, which the
                // inbox drops.
                let _ = broker.ack(&subscription, &ids).await;
            }
        }
    };
    let outcome = tokio::select! {
        () = &mut shutdown => Ok(()),
        outcome = consume => outcome,
    };
    let _ = stop_relay.send(());
    let _ = relay.await;
    outcome
}

/// Where the orders stand, from the three databases.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Orders reserved, charged and shipped, and nothing else.
    pub(crate) done: u64,
    /// Orders reserved and released, charged and refunded, and cancelled.
    pub(crate) undone: u64,
    /// Orders in neither state (still flowing, or wrong).
    pub(crate) pending: u64,
    /// Effects committed more than once.
    pub(crate) duplicates: u64,
    /// Orders settled in the wrong way (shipped one that [`ships`] refuses,
    /// or the other way round).
    pub(crate) wrong: u64,
}

impl Summary {
    /// The summary as one JSON line.
    pub(crate) fn json(&self, orders: u64) -> String {
        format!(
            "{{\"orders\":{orders},\"done\":{},\"undone\":{},\"pending\":{},\"duplicates\":{},\"wrong\":{}}}",
            self.done, self.undone, self.pending, self.duplicates, self.wrong
        )
    }
}

/// The effects committed in the database at `path`: (order, effect) → count.
fn effects(path: &Path) -> Result<BTreeMap<(u64, String), u64>, Error> {
    let mut map = BTreeMap::new();
    if !path.exists() {
        return Ok(map);
    }
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    let table: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'effects')",
        [],
        |r| r.get(0),
    )?;
    if !table {
        return Ok(map);
    }
    let mut stmt =
        conn.prepare("SELECT order_id, effect, count(*) FROM effects GROUP BY order_id, effect")?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })?;
    for row in rows {
        let (order, effect, count) = row?;
        map.insert((order as u64, effect), count as u64);
    }
    Ok(map)
}

/// Reads the three databases (`{dir}/{service}.db`) and classifies orders
/// `0..orders`.
pub(crate) fn summary(dir: &Path, orders: u64) -> Result<Summary, Error> {
    let mut all = BTreeMap::new();
    for role in Role::ALL {
        for ((order, effect), count) in effects(&db_path(dir, role))? {
            all.insert((order, role, effect), count);
        }
    }
    let mut summary = Summary {
        duplicates: all.values().map(|&c| c.saturating_sub(1)).sum(),
        ..Summary::default()
    };
    for order in 0..orders {
        let of: BTreeSet<(Role, &str)> = all
            .keys()
            .filter(|(o, _, _)| *o == order)
            .map(|(_, r, e)| (*r, e.as_str()))
            .collect();
        let done = [
            (Role::Stock, "reserved"),
            (Role::Payment, "charged"),
            (Role::Shipping, "shipped"),
        ];
        let undone = [
            (Role::Stock, "reserved"),
            (Role::Stock, "released"),
            (Role::Payment, "charged"),
            (Role::Payment, "refunded"),
            (Role::Shipping, "cancelled"),
        ];
        if of == BTreeSet::from(done) {
            summary.done += 1;
            summary.wrong += u64::from(!ships(order));
        } else if of == BTreeSet::from(undone) {
            summary.undone += 1;
            summary.wrong += u64::from(ships(order));
        } else {
            summary.pending += 1;
        }
    }
    Ok(summary)
}

/// The database of `role` in `dir`.
pub(crate) fn db_path(dir: &Path, role: Role) -> std::path::PathBuf {
    dir.join(format!("{}.db", role.name()))
}
