//! What the outbox tests on a real broker share, whichever the broker: the
//! service and consumer databases, the relay drained, a consumer that
//! records each message in its inbox with its effect, and a broker that
//! dies after publishing.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use rusqlite::Connection;
use seawall_saga::broker::{Broker, BrokerError, BrokerFuture, Delivery, Envelope, Subscription};
use seawall_saga::outbox::{self, Inbox, Outbox, Relay};

pub(crate) fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A service database with the outbox tables, in WAL mode.
pub(crate) fn service_db(dir: &Path, name: &str) -> (PathBuf, Connection) {
    let path = dir.join(format!("{name}.db"));
    let conn = Connection::open(&path).unwrap();
    conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
        .unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    outbox::migrate(&conn).unwrap();
    (path, conn)
}

/// A consumer database: the outbox schema (for the inbox) and an effects table.
pub(crate) fn consumer_db(dir: &Path, name: &str) -> Connection {
    let (_, conn) = service_db(dir, name);
    conn.execute_batch(
        "CREATE TABLE effects (n INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL,
         aggregate TEXT NOT NULL, payload TEXT NOT NULL)",
    )
    .unwrap();
    conn
}

/// Enqueues `(aggregate, payload)` events, each in its own transaction.
pub(crate) fn enqueue(conn: &mut Connection, events: &[(&str, String)]) {
    for (aggregate, payload) in events {
        let tx = conn.transaction().unwrap();
        Outbox::enqueue(&tx, aggregate, "changed", payload).unwrap();
        tx.commit().unwrap();
    }
}

/// Relays until the outbox is empty (bounded).
pub(crate) async fn drain<B: Broker>(relay: &Relay<B>) {
    for _ in 0..1000 {
        if relay.relay_once().await.unwrap() == 0 {
            return;
        }
    }
    panic!("the outbox did not drain");
}

/// Handles one delivery: the effect and the inbox record in one transaction,
/// then the acknowledgement. Returns whether it had an effect.
pub(crate) async fn handle<B: Broker>(
    db: &mut Connection,
    broker: &B,
    sub: &Subscription,
    delivery: &Delivery,
) -> bool {
    let e = &delivery.envelope;
    let tx = db.transaction().unwrap();
    // The inbox is per group: the consumers of a group share its effects.
    let first = Inbox::handle(&tx, &sub.group, &e.event_id).unwrap();
    if first {
        tx.execute(
            "INSERT INTO effects (event_id, aggregate, payload) VALUES (?1, ?2, ?3)",
            [&e.event_id, &e.aggregate, &e.payload],
        )
        .unwrap();
    }
    tx.commit().unwrap();
    broker
        .ack(sub, std::slice::from_ref(&delivery.id))
        .await
        .unwrap();
    first
}

/// Reads and handles until a read returns nothing. Returns (effects, duplicates).
pub(crate) async fn consume<B: Broker>(
    db: &mut Connection,
    broker: &B,
    sub: &Subscription,
) -> (usize, usize) {
    let (mut applied, mut duplicates) = (0, 0);
    for _ in 0..1000 {
        let batch = broker.read(sub, 50, Duration::ZERO).await.unwrap();
        if batch.is_empty() {
            return (applied, duplicates);
        }
        for d in &batch {
            if handle(db, broker, sub, d).await {
                applied += 1;
            } else {
                duplicates += 1;
            }
        }
    }
    panic!("the stream did not drain");
}

/// The payloads applied per aggregate, in the order applied.
pub(crate) fn effects(db: &Connection, aggregate: &str) -> Vec<String> {
    let mut stmt = db
        .prepare("SELECT payload FROM effects WHERE aggregate = ?1 ORDER BY n")
        .unwrap();
    stmt.query_map([aggregate], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Publishes through `inner`, then fails (`fail`) or never returns (`hang`):
/// a relay that dies after the broker took the batch, before marking it sent.
pub(crate) struct DiesAfterPublish<B> {
    pub(crate) inner: B,
    pub(crate) fail: AtomicBool,
    pub(crate) hang: AtomicBool,
    pub(crate) published: AtomicUsize,
}

impl<B> DiesAfterPublish<B> {
    /// Fails after the next publication (`fail`) or hangs (`!fail`).
    pub(crate) fn new(inner: B, fail: bool) -> Self {
        DiesAfterPublish {
            inner,
            fail: AtomicBool::new(fail),
            hang: AtomicBool::new(!fail),
            published: AtomicUsize::new(0),
        }
    }
}

impl<B: Broker> Broker for DiesAfterPublish<B> {
    fn publish<'a>(&'a self, stream: &'a str, events: &'a [Envelope]) -> BrokerFuture<'a, ()> {
        Box::pin(async move {
            self.inner.publish(stream, events).await?;
            self.published.fetch_add(events.len(), Ordering::SeqCst);
            if self.hang.swap(false, Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            if self.fail.swap(false, Ordering::SeqCst) {
                return Err(BrokerError::Unavailable {
                    operation: "publishing".into(),
                    detail: "connection lost after the broker took the batch".into(),
                });
            }
            Ok(())
        })
    }
    fn create_group<'a>(&'a self, s: &'a Subscription) -> BrokerFuture<'a, ()> {
        self.inner.create_group(s)
    }
    fn read<'a>(
        &'a self,
        s: &'a Subscription,
        n: usize,
        b: Duration,
    ) -> BrokerFuture<'a, Vec<Delivery>> {
        self.inner.read(s, n, b)
    }
    fn ack<'a>(&'a self, s: &'a Subscription, ids: &'a [String]) -> BrokerFuture<'a, ()> {
        self.inner.ack(s, ids)
    }
    fn claim_stale<'a>(
        &'a self,
        s: &'a Subscription,
        idle: Duration,
        n: usize,
    ) -> BrokerFuture<'a, Vec<Delivery>> {
        self.inner.claim_stale(s, idle, n)
    }
    fn dead_letter<'a>(
        &'a self,
        s: &'a Subscription,
        d: &'a Delivery,
        r: &'a str,
    ) -> BrokerFuture<'a, ()> {
        self.inner.dead_letter(s, d, r)
    }
}

/// Drops the relay mid-batch: its publication reached the broker, its
/// `relay_once` never returned (the broker hangs after publishing).
pub(crate) fn die_mid_batch<B: Broker>(
    rt: &tokio::runtime::Runtime,
    relay: Relay<DiesAfterPublish<B>>,
    batch: usize,
) {
    rt.block_on(async {
        tokio::select! {
            r = relay.relay_once() => panic!("the hanging publish returned {r:?}"),
            () = async {
                for _ in 0..500 {
                    if relay.broker().published.load(Ordering::SeqCst) == batch { return; }
                    tokio::task::yield_now().await;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                panic!("the batch was not published");
            } => {}
        }
    });
    drop(relay);
}
