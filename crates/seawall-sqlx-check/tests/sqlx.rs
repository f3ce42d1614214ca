//! seawall-saga in a service on sqlx: sagas whose steps write the service's
//! state and its outbox events in one sqlx transaction, on a real SQLite
//! file (the saga log in another file, through rusqlite: one SQLite library
//! for both) and on Postgres (the saga log through tokio-postgres, the
//! service's writes through sqlx), then relayed and de-duplicated.

#[path = "../../seawall-saga/tests/support/mod.rs"]
mod support;

use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

use seawall_saga::broker::{Broker, BrokerError, BrokerFuture, Delivery, Envelope, Subscription};
use seawall_saga::outbox::{
    sqlx_postgres, sqlx_sqlite, OutboxError, Relay, RelayOptions, SCHEMA_VERSION,
};
use seawall_saga::{Orchestrator, Saga, SagaLog, SagaStatus, SqliteLog, Step, StepContext};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{PgPool, SqlitePool};

/// A broker that keeps what is published.
#[derive(Default)]
struct Recording(Mutex<Vec<Envelope>>);

impl Recording {
    fn published(&self) -> Vec<(String, String, String)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e.event_id.clone(),
                    e.aggregate.clone(),
                    e.event_type.clone(),
                )
            })
            .collect()
    }
}

fn unused<'a, T: Send + 'a>() -> BrokerFuture<'a, T> {
    Box::pin(async {
        Err(BrokerError::Unavailable {
            operation: "consume".into(),
            detail: "this broker only records publications".into(),
        })
    })
}

impl Broker for Recording {
    fn publish<'a>(&'a self, _: &'a str, events: &'a [Envelope]) -> BrokerFuture<'a, ()> {
        self.0.lock().unwrap().extend_from_slice(events);
        Box::pin(async { Ok(()) })
    }
    fn create_group<'a>(&'a self, _: &'a Subscription) -> BrokerFuture<'a, ()> {
        unused()
    }
    fn read<'a>(
        &'a self,
        _: &'a Subscription,
        _: usize,
        _: Duration,
    ) -> BrokerFuture<'a, Vec<Delivery>> {
        unused()
    }
    fn ack<'a>(&'a self, _: &'a Subscription, _: &'a [String]) -> BrokerFuture<'a, ()> {
        unused()
    }
    fn claim_stale<'a>(
        &'a self,
        _: &'a Subscription,
        _: Duration,
        _: usize,
    ) -> BrokerFuture<'a, Vec<Delivery>> {
        unused()
    }
    fn dead_letter<'a>(
        &'a self,
        _: &'a Subscription,
        _: &'a Delivery,
        _: &'a str,
    ) -> BrokerFuture<'a, ()> {
        unused()
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Order {
    id: String,
    cents: u64,
}

type Effect = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// The service's own database, through sqlx: the order's state and its
/// event, one transaction each.
trait Shop: Clone + Send + Sync + 'static {
    /// Records the order as placed with its `order_placed` event (once:
    /// a repeat after a crash finds the order and writes nothing).
    fn place(&self, id: String) -> Effect;
    /// Marks the order cancelled with its `order_cancelled` event (once).
    fn cancel(&self, id: String) -> Effect;
}

// The statements are the same on both databases: SQLite reads `$1` too.
const PLACE: &str =
    "INSERT INTO orders (id, status) VALUES ($1, 'placed') ON CONFLICT (id) DO NOTHING";
const CANCEL: &str =
    "UPDATE orders SET status = 'cancelled' WHERE id = $1 AND status <> 'cancelled'";

impl Shop for SqlitePool {
    fn place(&self, id: String) -> Effect {
        let pool = self.clone();
        Box::pin(async move {
            let mut tx = pool.begin().await.map_err(|e| e.to_string())?;
            let placed = sqlx::query(PLACE).bind(&id).execute(&mut *tx).await;
            if placed.map_err(|e| e.to_string())?.rows_affected() == 1 {
                sqlx_sqlite::enqueue(&mut tx, &id, "order_placed", "{}")
                    .await
                    .map_err(|e| e.to_string())?;
            }
            tx.commit().await.map_err(|e| e.to_string())
        })
    }

    fn cancel(&self, id: String) -> Effect {
        let pool = self.clone();
        Box::pin(async move {
            let mut tx = pool.begin().await.map_err(|e| e.to_string())?;
            let cancelled = sqlx::query(CANCEL).bind(&id).execute(&mut *tx).await;
            if cancelled.map_err(|e| e.to_string())?.rows_affected() == 1 {
                sqlx_sqlite::enqueue(&mut tx, &id, "order_cancelled", "{}")
                    .await
                    .map_err(|e| e.to_string())?;
            }
            tx.commit().await.map_err(|e| e.to_string())
        })
    }
}

impl Shop for PgPool {
    fn place(&self, id: String) -> Effect {
        let pool = self.clone();
        Box::pin(async move {
            let mut tx = pool.begin().await.map_err(|e| e.to_string())?;
            let placed = sqlx::query(PLACE).bind(&id).execute(&mut *tx).await;
            if placed.map_err(|e| e.to_string())?.rows_affected() == 1 {
                sqlx_postgres::enqueue(&mut tx, &id, "order_placed", "{}")
                    .await
                    .map_err(|e| e.to_string())?;
            }
            tx.commit().await.map_err(|e| e.to_string())
        })
    }

    fn cancel(&self, id: String) -> Effect {
        let pool = self.clone();
        Box::pin(async move {
            let mut tx = pool.begin().await.map_err(|e| e.to_string())?;
            let cancelled = sqlx::query(CANCEL).bind(&id).execute(&mut *tx).await;
            if cancelled.map_err(|e| e.to_string())?.rows_affected() == 1 {
                sqlx_postgres::enqueue(&mut tx, &id, "order_cancelled", "{}")
                    .await
                    .map_err(|e| e.to_string())?;
            }
            tx.commit().await.map_err(|e| e.to_string())
        })
    }
}

/// Place the order in the shop's database, then charge it (declined above
/// 10 €, which cancels the order).
fn place_order<S: Shop>(shop: S) -> Saga<Order> {
    let cancelling = shop.clone();
    Saga::<Order>::builder("place_order")
        .step(
            Step::new("record", move |ctx: StepContext<Order>| {
                shop.place(ctx.input().id.clone())
            })
            .compensate(move |ctx: StepContext<Order>, ()| {
                cancelling.cancel(ctx.input().id.clone())
            }),
        )
        .step(Step::new("charge", |ctx: StepContext<Order>| async move {
            if ctx.input().cents > 1000 {
                Err("card declined")
            } else {
                Ok(())
            }
        }))
        .build()
        .expect("saga")
}

/// Runs the two orders of every test: one completed, one compensated.
async fn run_orders<S: Shop>(shop: S, log: impl SagaLog) {
    let saga = place_order(shop);
    let orchestrator = Orchestrator::builder(log)
        .saga(&saga)
        .build()
        .expect("orchestrator");
    let paid = Order {
        id: "o-1".into(),
        cents: 500,
    };
    let declined = Order {
        id: "o-2".into(),
        cents: 5000,
    };
    let outcome = orchestrator.start(&saga, paid).await.unwrap();
    assert_eq!(outcome.status, SagaStatus::Completed);
    let outcome = orchestrator.start(&saga, declined).await.unwrap();
    assert_eq!(outcome.status, SagaStatus::Compensated);
    assert_eq!(outcome.failure.unwrap().step.name, "charge");
}

fn expected_events(source: &str) -> Vec<(String, String, String)> {
    [
        (1, "o-1", "order_placed"),
        (2, "o-2", "order_placed"),
        (3, "o-2", "order_cancelled"),
    ]
    .into_iter()
    .map(|(n, aggregate, kind)| (format!("{source}:{n}"), aggregate.into(), kind.into()))
    .collect()
}

async fn sqlite_pool(path: &std::path::Path) -> SqlitePool {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5));
    SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .expect("sqlite pool")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_a_saga_writes_state_and_events_in_sqlx_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let app = dir.path().join("shop.db");
    let pool = sqlite_pool(&app).await;

    // Not migrated yet: refused, nothing written.
    let mut tx = pool.begin().await.unwrap();
    let missing = sqlx_sqlite::enqueue(&mut tx, "o-0", "order_placed", "{}").await;
    assert!(
        matches!(missing, Err(OutboxError::NotMigrated { .. })),
        "{missing:?}"
    );
    drop(tx);
    sqlx_sqlite::migrate(&pool).await.unwrap();
    sqlx_sqlite::migrate(&pool).await.unwrap();
    sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY, status TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();

    // The saga log in a file of its own, through rusqlite; the shop's writes
    // through sqlx: one process, one SQLite library.
    let log = SqliteLog::open(dir.path().join("sagas.db")).unwrap();
    run_orders(pool.clone(), log).await;

    let orders: Vec<(String, String)> = sqlx::query_as("SELECT id, status FROM orders ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        orders,
        [
            ("o-1".to_owned(), "placed".to_owned()),
            ("o-2".to_owned(), "cancelled".to_owned())
        ]
    );

    // An enqueue in a transaction that rolls back publishes nothing; bad input
    // is refused.
    let mut tx = pool.begin().await.unwrap();
    sqlx_sqlite::enqueue(&mut tx, "o-9", "order_placed", "{}")
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let empty = sqlx_sqlite::enqueue(&mut tx, "", "order_placed", "{}").await;
    assert!(matches!(empty, Err(OutboxError::Invalid(_))), "{empty:?}");
    drop(tx);

    // The relay on the sqlx pool publishes the committed events, in order.
    let relay = Relay::sqlx_sqlite(
        pool.clone(),
        Recording::default(),
        RelayOptions::new("shop", "orders"),
    )
    .await
    .unwrap();
    assert_eq!(relay.pending().await.unwrap(), 3);
    assert_eq!(relay.relay_once().await.unwrap(), 3);
    assert_eq!(relay.relay_once().await.unwrap(), 0);
    assert_eq!(relay.broker().published(), expected_events("shop"));
    assert_eq!(relay.purge_sent(Duration::ZERO).await.unwrap(), 3);

    // The same file through rusqlite: an event written with sqlx is relayed
    // by the rusqlite relay.
    let rusqlite_relay = Relay::open(
        &app,
        Recording::default(),
        RelayOptions::new("shop", "orders"),
    )
    .unwrap();
    assert_eq!(rusqlite_relay.pending().await.unwrap(), 0);
    let mut tx = pool.begin().await.unwrap();
    let id = sqlx_sqlite::enqueue(&mut tx, "o-3", "order_placed", "{}")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // Row ids are never reused (AUTOINCREMENT): the purged ones stay taken.
    assert_eq!(id, 4);
    assert_eq!(rusqlite_relay.relay_once().await.unwrap(), 1);
    assert_eq!(
        rusqlite_relay.broker().published(),
        [(
            "shop:4".to_owned(),
            "o-3".to_owned(),
            "order_placed".to_owned()
        )]
    );

    // A consumer's inbox in a sqlx transaction: a redelivery has no effect.
    for (expected, commit) in [(true, false), (true, true), (false, true)] {
        let mut tx = pool.begin().await.unwrap();
        let first = sqlx_sqlite::handle(&mut tx, "billing", "shop:1")
            .await
            .unwrap();
        assert_eq!(first, expected);
        if commit {
            tx.commit().await.unwrap();
        }
    }
    let mut tx = pool.begin().await.unwrap();
    let bad = sqlx_sqlite::handle(&mut tx, "billing", "").await;
    assert!(matches!(bad, Err(OutboxError::Invalid(_))), "{bad:?}");
}

#[tokio::test]
async fn on_sqlite_a_newer_schema_and_a_bare_database_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pool = sqlite_pool(&dir.path().join("bare.db")).await;
    let relay = Relay::sqlx_sqlite(
        pool.clone(),
        Recording::default(),
        RelayOptions::new("shop", "orders"),
    )
    .await;
    assert!(
        matches!(relay, Err(OutboxError::NotMigrated { .. })),
        "{relay:?}"
    );
    // Migrated inside the caller's transaction, which rolls back: nothing stays.
    let mut tx = pool.begin().await.unwrap();
    sqlx_sqlite::migrate(&mut *tx).await.unwrap();
    tx.rollback().await.unwrap();
    let tables: i64 =
        sqlx::query_scalar("SELECT count(*) FROM sqlite_master WHERE name LIKE 'seawall_%'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(tables, 0);

    sqlx_sqlite::migrate(&pool).await.unwrap();
    sqlx::query("UPDATE seawall_outbox_schema SET version = $1")
        .bind(i64::from(SCHEMA_VERSION) + 1)
        .execute(&pool)
        .await
        .unwrap();
    let newer = sqlx_sqlite::migrate(&pool).await;
    assert!(
        matches!(&newer, Err(OutboxError::UnsupportedSchema { found, .. }) if *found == (SCHEMA_VERSION + 1).to_string()),
        "{newer:?}"
    );
    let relay = Relay::sqlx_sqlite(
        pool.clone(),
        Recording::default(),
        RelayOptions::new("shop", "orders"),
    )
    .await;
    assert!(
        matches!(relay, Err(OutboxError::UnsupportedSchema { .. })),
        "{relay:?}"
    );
}

/// A pool whose connections use `schema` (created if needed).
async fn pg_pool(schema: &str) -> PgPool {
    let options = PgConnectOptions::from_str(&support::postgres_url())
        .expect("postgres url")
        .options([("search_path", schema)]);
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .expect("postgres pool");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA IF NOT EXISTS \"{schema}\""
    )))
    .execute(&pool)
    .await
    .expect("schema");
    pool
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_saga_writes_state_and_events_in_sqlx_transactions() {
    let schema = support::schema_name("sqlx_shop");
    let log_schema = support::schema_name("sqlx_shop_log");
    support::reset_schema(&schema).await;
    support::reset_schema(&log_schema).await;
    let pool = pg_pool(&schema).await;

    let mut tx = pool.begin().await.unwrap();
    let missing = sqlx_postgres::enqueue(&mut tx, "o-0", "order_placed", "{}").await;
    assert!(
        matches!(missing, Err(OutboxError::NotMigrated { .. })),
        "{missing:?}"
    );
    drop(tx);
    sqlx_postgres::migrate(&pool).await.unwrap();
    sqlx_postgres::migrate(&pool).await.unwrap();
    sqlx::query("CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();

    // The saga log through tokio-postgres, the shop's writes through sqlx.
    let log = support::pg_log(&log_schema, Duration::from_secs(30), "sqlx-check").await;
    run_orders(pool.clone(), log).await;

    let orders: Vec<(String, String)> = sqlx::query_as("SELECT id, status FROM orders ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        orders,
        [
            ("o-1".to_owned(), "placed".to_owned()),
            ("o-2".to_owned(), "cancelled".to_owned())
        ]
    );

    let mut tx = pool.begin().await.unwrap();
    sqlx_postgres::enqueue(&mut tx, "o-9", "order_placed", "{}")
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    let relay = Relay::sqlx_postgres(
        pool.clone(),
        Recording::default(),
        RelayOptions::new("shop", "orders"),
    )
    .await
    .unwrap();
    assert_eq!(relay.pending().await.unwrap(), 3);
    assert_eq!(relay.relay_once().await.unwrap(), 3);
    assert_eq!(relay.relay_once().await.unwrap(), 0);
    assert_eq!(relay.broker().published(), expected_events("shop"));
    assert_eq!(relay.purge_sent(Duration::ZERO).await.unwrap(), 3);

    // The same tables through tokio-postgres: what sqlx wrote is relayed by
    // the tokio-postgres relay.
    let client = support::pg_client().await;
    client
        .batch_execute(&format!("SET search_path TO \"{schema}\""))
        .await
        .unwrap();
    let tokio_relay = Relay::postgres(
        client,
        Recording::default(),
        RelayOptions::new("shop", "orders"),
    )
    .await
    .unwrap();
    let mut tx = pool.begin().await.unwrap();
    let id = sqlx_postgres::enqueue(&mut tx, "o-3", "order_placed", "{}")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // The sequence is never rolled back: the rolled-back event took id 4.
    assert_eq!(id, 5);
    assert_eq!(tokio_relay.relay_once().await.unwrap(), 1);
    assert_eq!(
        tokio_relay.broker().published(),
        [(
            "shop:5".to_owned(),
            "o-3".to_owned(),
            "order_placed".to_owned()
        )]
    );

    for (expected, commit) in [(true, false), (true, true), (false, true)] {
        let mut tx = pool.begin().await.unwrap();
        let first = sqlx_postgres::handle(&mut tx, "billing", "shop:1")
            .await
            .unwrap();
        assert_eq!(first, expected);
        if commit {
            tx.commit().await.unwrap();
        }
    }

    sqlx::query("UPDATE seawall_outbox_schema SET version = $1")
        .bind(i32::try_from(SCHEMA_VERSION).unwrap() + 1)
        .execute(&pool)
        .await
        .unwrap();
    let newer = sqlx_postgres::migrate(&pool).await;
    assert!(
        matches!(&newer, Err(OutboxError::UnsupportedSchema { found, .. }) if *found == (SCHEMA_VERSION + 1).to_string()),
        "{newer:?}"
    );
    pool.close().await;
    support::reset_schema(&schema).await;
    support::reset_schema(&log_schema).await;
}
