//! The outbox and inbox on SQLite alone: schema versions, transactions, bad input.

use rusqlite::Connection;
use seawall_saga::outbox::{self, Inbox, Outbox, OutboxError, Relay, RelayOptions};

mod null_broker {
    use std::time::Duration;

    use seawall_saga::broker::{
        Broker, BrokerError, BrokerFuture, Delivery, Envelope, Subscription,
    };

    /// A broker that is always down.
    pub(crate) struct Down;

    /// A broker that records what is published (the rest is down).
    #[derive(Default)]
    pub(crate) struct Recording(pub(crate) std::sync::Mutex<Vec<Envelope>>);

    impl Broker for Recording {
        fn publish<'a>(&'a self, _: &'a str, events: &'a [Envelope]) -> BrokerFuture<'a, ()> {
            self.0.lock().unwrap().extend_from_slice(events);
            Box::pin(async { Ok(()) })
        }
        fn create_group<'a>(&'a self, _: &'a Subscription) -> BrokerFuture<'a, ()> {
            down()
        }
        fn read<'a>(
            &'a self,
            _: &'a Subscription,
            _: usize,
            _: Duration,
        ) -> BrokerFuture<'a, Vec<Delivery>> {
            down()
        }
        fn ack<'a>(&'a self, _: &'a Subscription, _: &'a [String]) -> BrokerFuture<'a, ()> {
            down()
        }
        fn claim_stale<'a>(
            &'a self,
            _: &'a Subscription,
            _: Duration,
            _: usize,
        ) -> BrokerFuture<'a, Vec<Delivery>> {
            down()
        }
        fn dead_letter<'a>(
            &'a self,
            _: &'a Subscription,
            _: &'a Delivery,
            _: &'a str,
        ) -> BrokerFuture<'a, ()> {
            down()
        }
    }

    fn down<'a, T: Send + 'a>() -> BrokerFuture<'a, T> {
        Box::pin(async {
            Err(BrokerError::Unavailable {
                operation: "test".into(),
                detail: "down".into(),
            })
        })
    }

    impl Broker for Down {
        fn publish<'a>(&'a self, _: &'a str, _: &'a [Envelope]) -> BrokerFuture<'a, ()> {
            down()
        }
        fn create_group<'a>(&'a self, _: &'a Subscription) -> BrokerFuture<'a, ()> {
            down()
        }
        fn read<'a>(
            &'a self,
            _: &'a Subscription,
            _: usize,
            _: Duration,
        ) -> BrokerFuture<'a, Vec<Delivery>> {
            down()
        }
        fn ack<'a>(&'a self, _: &'a Subscription, _: &'a [String]) -> BrokerFuture<'a, ()> {
            down()
        }
        fn claim_stale<'a>(
            &'a self,
            _: &'a Subscription,
            _: Duration,
            _: usize,
        ) -> BrokerFuture<'a, Vec<Delivery>> {
            down()
        }
        fn dead_letter<'a>(
            &'a self,
            _: &'a Subscription,
            _: &'a Delivery,
            _: &'a str,
        ) -> BrokerFuture<'a, ()> {
            down()
        }
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn unsent(conn: &Connection) -> i64 {
    conn.query_row(
        "SELECT count(*) FROM seawall_outbox WHERE sent_at_ms IS NULL",
        [],
        |r| r.get(0),
    )
    .unwrap()
}

#[test]
fn migrate_is_idempotent_and_runs_inside_a_transaction() {
    let mut conn = Connection::open_in_memory().unwrap();
    outbox::migrate(&conn).unwrap();
    outbox::migrate(&conn).unwrap();
    let tx = conn.transaction().unwrap();
    outbox::migrate(&tx).unwrap();
    Outbox::enqueue(&tx, "a", "created", "{}").unwrap();
    tx.commit().unwrap();
    assert_eq!(unsent(&conn), 1);
}

#[test]
fn a_newer_schema_is_refused_and_left_alone() {
    let conn = Connection::open_in_memory().unwrap();
    outbox::migrate(&conn).unwrap();
    conn.execute("UPDATE seawall_outbox_schema SET version = 2", [])
        .unwrap();
    match outbox::migrate(&conn) {
        Err(OutboxError::UnsupportedSchema { found, supported }) => {
            assert_eq!(found, "2");
            assert_eq!(supported, outbox::SCHEMA_VERSION);
        }
        other => panic!("expected UnsupportedSchema, got {other:?}"),
    }
    let version: i64 = conn
        .query_row("SELECT version FROM seawall_outbox_schema", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(version, 2);
}

#[test]
fn a_relay_refuses_a_newer_schema_and_a_database_without_outbox() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("svc.db");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch("CREATE TABLE t (x)").unwrap();
    let opened = Relay::open(&path, null_broker::Down, RelayOptions::new("svc", "events"));
    assert!(
        matches!(opened, Err(OutboxError::NotMigrated { .. })),
        "{opened:?}"
    );
    outbox::migrate(&conn).unwrap();
    conn.execute("UPDATE seawall_outbox_schema SET version = 99", [])
        .unwrap();
    let opened = Relay::open(&path, null_broker::Down, RelayOptions::new("svc", "events"));
    assert!(
        matches!(opened, Err(OutboxError::UnsupportedSchema { .. })),
        "{opened:?}"
    );
    let opened = Relay::open(&path, null_broker::Down, RelayOptions::new("", "events"));
    assert!(matches!(opened, Err(OutboxError::Invalid(_))), "{opened:?}");
}

#[test]
fn enqueue_and_handle_refuse_bad_input_and_a_missing_schema() {
    let mut conn = Connection::open_in_memory().unwrap();
    let tx = conn.transaction().unwrap();
    assert!(matches!(
        Outbox::enqueue(&tx, "a", "t", "{}"),
        Err(OutboxError::NotMigrated { .. })
    ));
    assert!(matches!(
        Inbox::handle(&tx, "c", "m"),
        Err(OutboxError::NotMigrated { .. })
    ));
    drop(tx);
    outbox::migrate(&conn).unwrap();
    let tx = conn.transaction().unwrap();
    assert!(matches!(
        Outbox::enqueue(&tx, "", "t", "{}"),
        Err(OutboxError::Invalid(_))
    ));
    assert!(matches!(
        Outbox::enqueue(&tx, "a", "", "{}"),
        Err(OutboxError::Invalid(_))
    ));
    assert!(matches!(
        Inbox::handle(&tx, "", "m"),
        Err(OutboxError::Invalid(_))
    ));
    assert!(matches!(
        Inbox::handle(&tx, "c", ""),
        Err(OutboxError::Invalid(_))
    ));
}

#[test]
fn the_inbox_handles_a_message_once_per_consumer_and_forgets_a_rolled_back_one() {
    let mut conn = Connection::open_in_memory().unwrap();
    outbox::migrate(&conn).unwrap();
    let tx = conn.transaction().unwrap();
    assert!(Inbox::handle(&tx, "billing", "orders:1").unwrap());
    drop(tx); // rolled back: not handled
    let tx = conn.transaction().unwrap();
    assert!(Inbox::handle(&tx, "billing", "orders:1").unwrap());
    assert!(Inbox::handle(&tx, "shipping", "orders:1").unwrap());
    tx.commit().unwrap();
    let tx = conn.transaction().unwrap();
    assert!(!Inbox::handle(&tx, "billing", "orders:1").unwrap());
    assert!(!Inbox::handle(&tx, "shipping", "orders:1").unwrap());
    assert!(Inbox::handle(&tx, "billing", "orders:2").unwrap());
}

#[test]
fn a_broker_that_is_down_keeps_the_events_in_the_outbox() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("svc.db");
    let mut conn = Connection::open(&path).unwrap();
    outbox::migrate(&conn).unwrap();
    let tx = conn.transaction().unwrap();
    Outbox::enqueue(&tx, "a", "created", "{}").unwrap();
    tx.commit().unwrap();
    let relay = Relay::open(&path, null_broker::Down, RelayOptions::new("svc", "events")).unwrap();
    let rt = rt();
    for _ in 0..3 {
        let result = rt.block_on(relay.relay_once());
        assert!(
            matches!(&result, Err(OutboxError::Broker(e)) if e.is_unavailable()),
            "{result:?}"
        );
    }
    assert_eq!(rt.block_on(relay.pending()).unwrap(), 1);
    assert_eq!(unsent(&conn), 1);
}

#[test]
fn the_relay_publishes_committed_events_in_order_with_stable_ids_and_purges_sent_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("svc.db");
    let mut conn = Connection::open(&path).unwrap();
    outbox::migrate(&conn).unwrap();
    let mut ids = Vec::new();
    for i in 0..5 {
        let tx = conn.transaction().unwrap();
        ids.push(Outbox::enqueue(&tx, ["a", "b"][i % 2], "changed", &i.to_string()).unwrap());
        tx.commit().unwrap();
    }
    let relay = Relay::open(
        &path,
        null_broker::Recording::default(),
        RelayOptions::new("svc", "events").batch(2),
    )
    .unwrap();
    let rt = rt();
    let batches: Vec<usize> = (0..4)
        .map(|_| rt.block_on(relay.relay_once()).unwrap())
        .collect();
    assert_eq!(batches, [2, 2, 1, 0]);
    let published = relay.broker().0.lock().unwrap().clone();
    let seen: Vec<(String, String, String)> = published
        .iter()
        .map(|e| (e.event_id.clone(), e.aggregate.clone(), e.payload.clone()))
        .collect();
    let expected: Vec<(String, String, String)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            (
                format!("svc:{id}"),
                ["a", "b"][i % 2].to_owned(),
                i.to_string(),
            )
        })
        .collect();
    assert_eq!(seen, expected);
    assert_eq!(unsent(&conn), 0);
    // Sent rows are kept until purged; an age of zero purges every sent
    // row at once, those marked in this very millisecond included.
    let purged = rt
        .block_on(relay.purge_sent(std::time::Duration::ZERO))
        .unwrap();
    assert_eq!(purged, 5);
    let left: i64 = conn
        .query_row("SELECT count(*) FROM seawall_outbox", [], |r| r.get(0))
        .unwrap();
    assert_eq!(left, 0);
    // Ids are never reused: a new event is not mistaken for a handled one.
    let tx = conn.transaction().unwrap();
    let next = Outbox::enqueue(&tx, "a", "changed", "5").unwrap();
    tx.commit().unwrap();
    assert!(next > *ids.last().unwrap(), "{next} reused an id");
}
