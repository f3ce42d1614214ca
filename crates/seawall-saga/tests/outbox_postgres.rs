//! The outbox and the inbox on Postgres, relayed to a real `redis-server`.
#![cfg(feature = "redis-streams")]

mod support;

use std::time::Duration;

use redis::Commands;
use seawall_saga::broker::redis_streams::RedisStreams;
use seawall_saga::broker::{Broker, Subscription};
use seawall_saga::outbox::{postgres, OutboxError, Relay, RelayOptions};
use seawall_test_redis::{unique, RedisServer};
use support::{pg_client, reset_schema, schema_name};

/// A client whose `search_path` is `schema` (created if needed).
async fn client_in(schema: &str) -> tokio_postgres::Client {
    let client = pg_client().await;
    client
        .batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS \"{schema}\"; SET search_path TO \"{schema}\""
        ))
        .await
        .expect("schema");
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outbox_relays_committed_events_and_the_inbox_drops_duplicates() {
    let schema = schema_name("outbox_relay");
    reset_schema(&schema).await;
    let server = RedisServer::start();
    let stream = unique("pg-outbox");
    let mut db = client_in(&schema).await;

    // Not migrated yet.
    let tx = db.transaction().await.unwrap();
    let missing = postgres::enqueue(&tx, "a", "t", "{}").await;
    assert!(
        matches!(missing, Err(OutboxError::NotMigrated { .. })),
        "{missing:?}"
    );
    drop(tx);
    postgres::migrate(&mut db).await.unwrap();
    postgres::migrate(&mut db).await.unwrap();

    // Bad input, a rolled-back enqueue, then committed ones.
    let tx = db.transaction().await.unwrap();
    assert!(matches!(
        postgres::enqueue(&tx, "", "t", "{}").await,
        Err(OutboxError::Invalid(_))
    ));
    drop(tx);
    let tx = db.transaction().await.unwrap();
    postgres::enqueue(&tx, "a", "placed", "rolled back")
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    for (aggregate, payload) in [("a", "1"), ("b", "1"), ("a", "2"), ("b", "2"), ("a", "3")] {
        let tx = db.transaction().await.unwrap();
        postgres::enqueue(&tx, aggregate, "placed", payload)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }

    let relay = Relay::postgres(
        client_in(&schema).await,
        RedisStreams::open(&server.url()).unwrap(),
        RelayOptions::new("orders", &stream).batch(2),
    )
    .await
    .unwrap();
    assert_eq!(relay.pending().await.unwrap(), 5);
    let mut relayed = 0;
    for _ in 0..10 {
        match relay.relay_once().await.unwrap() {
            0 => break,
            n => relayed += n,
        }
    }
    assert_eq!(relayed, 5);
    assert_eq!(relay.pending().await.unwrap(), 0);

    // Consume twice over (as after a re-publication): one effect each.
    let consumer = RedisStreams::open(&server.url()).unwrap();
    let sub = Subscription::new(&stream, "billing", "billing-1");
    consumer.create_group(&sub).await.unwrap();
    let batch = consumer.read(&sub, 100, Duration::ZERO).await.unwrap();
    assert_eq!(batch.len(), 5);
    let payloads: Vec<(&str, &str)> = batch
        .iter()
        .map(|d| (d.envelope.aggregate.as_str(), d.envelope.payload.as_str()))
        .collect();
    assert_eq!(
        payloads,
        [("a", "1"), ("b", "1"), ("a", "2"), ("b", "2"), ("a", "3")]
    );
    let mut inbox = client_in(&schema).await;
    inbox
        .batch_execute("CREATE TABLE effects (event_id TEXT NOT NULL)")
        .await
        .unwrap();
    let mut applied = 0;
    for d in batch.iter().chain(batch.iter()) {
        let tx = inbox.transaction().await.unwrap();
        if postgres::handle(&tx, "billing", &d.envelope.event_id)
            .await
            .unwrap()
        {
            tx.execute("INSERT INTO effects VALUES ($1)", &[&d.envelope.event_id])
                .await
                .unwrap();
            applied += 1;
        }
        tx.commit().await.unwrap();
    }
    assert_eq!(applied, 5);
    let effects: i64 = inbox
        .query_one("SELECT count(DISTINCT event_id) FROM effects", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(effects, 5);
    let len: usize = server.conn().xlen(&stream).unwrap();
    assert_eq!(len, 5);

    // A newer schema is refused, by migrate and by a relay.
    db.execute("UPDATE seawall_outbox_schema SET version = 2", &[])
        .await
        .unwrap();
    let newer = postgres::migrate(&mut db).await;
    assert!(
        matches!(&newer, Err(OutboxError::UnsupportedSchema { found, .. }) if found == "2"),
        "{newer:?}"
    );
    let newer = Relay::postgres(
        client_in(&schema).await,
        RedisStreams::open(&server.url()).unwrap(),
        RelayOptions::new("orders", &stream),
    )
    .await;
    assert!(
        matches!(newer, Err(OutboxError::UnsupportedSchema { .. })),
        "{newer:?}"
    );
    reset_schema(&schema).await;
}

/// Transactions enqueueing events of one aggregate are serialised, so the ids
/// of an aggregate's events follow their commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_enqueues_of_one_aggregate_wait_for_each_other() {
    let schema = schema_name("outbox_lock");
    reset_schema(&schema).await;
    let mut first = client_in(&schema).await;
    postgres::migrate(&mut first).await.unwrap();
    let mut second = client_in(&schema).await;
    let observer = client_in(&schema).await;
    let pid: i32 = second
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);

    let t1 = first.transaction().await.unwrap();
    postgres::enqueue(&t1, "a", "t", "first").await.unwrap();
    let waiting = tokio::spawn(async move {
        let t2 = second.transaction().await.unwrap();
        // Another aggregate does not wait.
        postgres::enqueue(&t2, "b", "t", "other").await.unwrap();
        let id = postgres::enqueue(&t2, "a", "t", "second").await.unwrap();
        t2.commit().await.unwrap();
        id
    });
    // The second transaction waits on the aggregate's lock.
    let mut blocked = false;
    for _ in 0..500 {
        let row = observer
            .query_one(
                "SELECT wait_event_type = 'Lock' AND wait_event = 'advisory'
                 FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await
            .unwrap();
        if row.get::<_, Option<bool>>(0) == Some(true) {
            blocked = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(blocked, "the second enqueue of aggregate a did not wait");
    assert!(!waiting.is_finished());
    let t1_id: i64 = t1
        .query_one("SELECT max(id) FROM seawall_outbox", &[])
        .await
        .unwrap()
        .get(0);
    t1.commit().await.unwrap();
    let t2_id = waiting.await.unwrap();
    assert!(t2_id > t1_id, "{t2_id} <= {t1_id}");
    reset_schema(&schema).await;
}
