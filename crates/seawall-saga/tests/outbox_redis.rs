//! The outbox relay, the Redis Streams broker and the inbox, on a real
//! `redis-server` and real SQLite files.
#![cfg(feature = "redis-streams")]

mod choreography;

use std::sync::Arc;
use std::time::Duration;

use choreography::{
    consume, consumer_db, die_mid_batch, drain, effects, enqueue, handle, rt, service_db,
    DiesAfterPublish,
};
use redis::Commands;
use seawall_saga::broker::redis_streams::RedisStreams;
use seawall_saga::broker::{dead_letter_stream, Broker, Subscription};
use seawall_saga::outbox::{Outbox, OutboxError, Relay, RelayOptions};
use seawall_test_redis::{unique, RedisServer};

fn stream_len(server: &RedisServer, stream: &str) -> usize {
    server.conn().xlen(stream).unwrap()
}

fn setup(name: &str) -> (RedisServer, tempfile::TempDir, String) {
    (
        RedisServer::start(),
        tempfile::tempdir().unwrap(),
        unique(name),
    )
}

#[test]
fn an_enqueue_rolled_back_publishes_nothing() {
    let (server, dir, stream) = setup("rollback");
    let (path, mut db) = service_db(dir.path(), "orders");
    db.execute_batch("CREATE TABLE orders (id TEXT PRIMARY KEY)")
        .unwrap();
    let tx = db.transaction().unwrap();
    tx.execute("INSERT INTO orders VALUES ('o-1')", []).unwrap();
    Outbox::enqueue(&tx, "o-1", "placed", "{}").unwrap();
    tx.rollback().unwrap();
    let tx = db.transaction().unwrap();
    tx.execute("INSERT INTO orders VALUES ('o-2')", []).unwrap();
    Outbox::enqueue(&tx, "o-2", "placed", "{}").unwrap();
    tx.commit().unwrap();

    let broker = RedisStreams::open(&server.url()).unwrap();
    let relay = Relay::open(&path, broker, RelayOptions::new("orders", &stream)).unwrap();
    let rt = rt();
    rt.block_on(drain(&relay));
    assert_eq!(stream_len(&server, &stream), 1);
    let entries: redis::streams::StreamRangeReply = server.conn().xrange_all(&stream).unwrap();
    let aggregate: String = entries.ids[0].get("aggregate").unwrap();
    assert_eq!(aggregate, "o-2");
    assert_eq!(rt.block_on(relay.pending()).unwrap(), 0);
}

#[test]
fn events_of_an_aggregate_arrive_in_order() {
    let (server, dir, stream) = setup("order");
    let (path, mut db) = service_db(dir.path(), "orders");
    let aggregates = ["a", "b", "c"];
    let events: Vec<(&str, String)> = (0..60)
        .map(|i| (aggregates[(i * 7) % 3], i.to_string()))
        .collect();
    enqueue(&mut db, &events);

    let broker = RedisStreams::open(&server.url()).unwrap();
    let relay = Relay::open(&path, broker, RelayOptions::new("orders", &stream).batch(7)).unwrap();
    let consumer = RedisStreams::open(&server.url()).unwrap();
    let sub = Subscription::new(&stream, "billing", "billing-1");
    let mut inbox = consumer_db(dir.path(), "billing");
    let rt = rt();
    rt.block_on(async {
        consumer.create_group(&sub).await.unwrap();
        drain(&relay).await;
        assert_eq!(consume(&mut inbox, &consumer, &sub).await, (60, 0));
    });
    for aggregate in aggregates {
        let expected: Vec<String> = events
            .iter()
            .filter(|(a, _)| *a == aggregate)
            .map(|(_, p)| p.clone())
            .collect();
        assert!(!expected.is_empty());
        assert_eq!(
            effects(&inbox, aggregate),
            expected,
            "aggregate {aggregate}"
        );
    }
}

#[test]
fn a_relay_that_dies_after_publishing_republishes_and_the_inbox_drops_the_copies() {
    let (server, dir, stream) = setup("republish");
    let (path, mut db) = service_db(dir.path(), "orders");
    let events: Vec<(&str, String)> = (0..10).map(|i| ("a", i.to_string())).collect();
    enqueue(&mut db, &events);
    let consumer = RedisStreams::open(&server.url()).unwrap();
    let sub = Subscription::new(&stream, "billing", "billing-1");
    let mut inbox = consumer_db(dir.path(), "billing");
    let rt = rt();
    rt.block_on(consumer.create_group(&sub)).unwrap();

    // 1. The publish fails after XADD: the batch stays unsent.
    let broker = DiesAfterPublish::new(RedisStreams::open(&server.url()).unwrap(), true);
    let relay = Relay::open(&path, broker, RelayOptions::new("orders", &stream).batch(4)).unwrap();
    let failed = rt.block_on(relay.relay_once());
    assert!(matches!(failed, Err(OutboxError::Broker(_))), "{failed:?}");
    assert_eq!(stream_len(&server, &stream), 4);
    assert_eq!(rt.block_on(relay.pending()).unwrap(), 10);
    drop(relay);

    // 2. A new relay is dropped mid-batch, after XADD, before marking sent.
    let broker = DiesAfterPublish::new(RedisStreams::open(&server.url()).unwrap(), false);
    let relay = Relay::open(&path, broker, RelayOptions::new("orders", &stream).batch(4)).unwrap();
    die_mid_batch(&rt, relay, 4);
    assert_eq!(stream_len(&server, &stream), 8);

    // 3. A third relay publishes everything; the consumer applies each event once.
    let relay = Relay::open(
        &path,
        RedisStreams::open(&server.url()).unwrap(),
        RelayOptions::new("orders", &stream).batch(4),
    )
    .unwrap();
    rt.block_on(drain(&relay));
    assert_eq!(stream_len(&server, &stream), 18);
    let (applied, duplicates) = rt.block_on(consume(&mut inbox, &consumer, &sub));
    assert_eq!((applied, duplicates), (10, 8));
    let expected: Vec<String> = (0..10).map(|i| i.to_string()).collect();
    assert_eq!(effects(&inbox, "a"), expected);
}

#[test]
fn a_message_of_a_dead_consumer_is_claimed_by_another() {
    let (server, dir, stream) = setup("claim");
    let (path, mut db) = service_db(dir.path(), "orders");
    enqueue(&mut db, &[("a", "1".into()), ("a", "2".into())]);
    let relay = Relay::open(
        &path,
        RedisStreams::open(&server.url()).unwrap(),
        RelayOptions::new("orders", &stream),
    )
    .unwrap();
    let dead = RedisStreams::open(&server.url()).unwrap();
    let dead_sub = Subscription::new(&stream, "billing", "billing-dead");
    let alive = RedisStreams::open(&server.url()).unwrap();
    let alive_sub = Subscription::new(&stream, "billing", "billing-alive");
    let mut inbox = consumer_db(dir.path(), "billing");
    let rt = rt();
    rt.block_on(async {
        dead.create_group(&dead_sub).await.unwrap();
        drain(&relay).await;
        // The first consumer reads both messages and dies without acknowledging.
        let taken = dead.read(&dead_sub, 10, Duration::ZERO).await.unwrap();
        assert_eq!(taken.len(), 2);
        drop(dead);
        // Nothing new for the other consumer...
        assert!(alive
            .read(&alive_sub, 10, Duration::ZERO)
            .await
            .unwrap()
            .is_empty());
        // ...until it claims the dead one's messages once they are idle.
        let mut claimed = Vec::new();
        for _ in 0..200 {
            claimed = alive
                .claim_stale(&alive_sub, Duration::from_millis(20), 10)
                .await
                .unwrap();
            if !claimed.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(claimed.len(), 2, "the stale messages were not claimed");
        assert_eq!(claimed[0].id, taken[0].id);
        for d in &claimed {
            assert!(handle(&mut inbox, &alive, &alive_sub, d).await);
        }
    });
    let pending: redis::streams::StreamPendingReply =
        server.conn().xpending(&stream, "billing").unwrap();
    assert_eq!(pending.count(), 0);
    assert_eq!(effects(&inbox, "a"), vec!["1".to_owned(), "2".to_owned()]);
}

#[test]
fn a_broker_down_at_start_and_mid_run_delays_the_events_and_loses_none() {
    let (mut server, dir, stream) = setup("outage");
    let (path, mut db) = service_db(dir.path(), "orders");
    let broker = RedisStreams::open(&server.url())
        .unwrap()
        .timeout(Duration::from_millis(500));
    let relay = Relay::open(&path, broker, RelayOptions::new("orders", &stream)).unwrap();
    let rt = rt();

    // Down at start.
    server.kill();
    enqueue(&mut db, &[("a", "1".into())]);
    let down = rt.block_on(relay.relay_once());
    assert!(
        matches!(&down, Err(OutboxError::Broker(e)) if e.is_unavailable()),
        "{down:?}"
    );
    assert_eq!(rt.block_on(relay.pending()).unwrap(), 1);
    server.restart();
    rt.block_on(drain(&relay));
    assert_eq!(stream_len(&server, &stream), 1);

    // Goes away while `run` relays, comes back.
    let relay = Arc::new(
        Relay::open(
            &path,
            RedisStreams::open(&server.url())
                .unwrap()
                .timeout(Duration::from_millis(500)),
            RelayOptions::new("orders", &stream)
                .poll_interval(Duration::from_millis(5))
                .retry_interval(Duration::from_millis(20)),
        )
        .unwrap(),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = {
        let relay = Arc::clone(&relay);
        rt.spawn(async move {
            relay
                .run(async move {
                    let _ = stopped.await;
                })
                .await
        })
    };
    let wait_empty = |relay: &Relay<RedisStreams>| {
        for _ in 0..1000 {
            if rt.block_on(relay.pending()).unwrap() == 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("the relay did not empty the outbox");
    };
    enqueue(&mut db, &[("a", "2".into())]);
    wait_empty(&relay);
    server.kill();
    enqueue(&mut db, &[("a", "3".into()), ("a", "4".into())]);
    // The relay fails while the server is down: the events stay.
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(rt.block_on(relay.pending()).unwrap(), 2);
    }
    server.restart(); // empty: the server saves nothing
    wait_empty(&relay);
    stop.send(()).unwrap();
    let report = rt.block_on(running).unwrap();
    assert!(report.failures >= 1, "{report:?}");
    assert!(report.published >= 3, "{report:?}");
    let entries: redis::streams::StreamRangeReply = server.conn().xrange_all(&stream).unwrap();
    let payloads: Vec<String> = entries
        .ids
        .iter()
        .map(|e| e.get("payload").unwrap())
        .collect();
    assert_eq!(payloads, vec!["3".to_owned(), "4".to_owned()]);
}

#[test]
fn a_malformed_message_is_parked_in_the_dead_letter_stream_and_the_consumer_goes_on() {
    let (server, dir, stream) = setup("malformed");
    let (path, mut db) = service_db(dir.path(), "orders");
    let consumer = RedisStreams::open(&server.url()).unwrap();
    let sub = Subscription::new(&stream, "billing", "billing-1");
    let mut inbox = consumer_db(dir.path(), "billing");
    let rt = rt();
    rt.block_on(consumer.create_group(&sub)).unwrap();
    let mut c = server.conn();
    let _: String = c
        .xadd(&stream, "*", &[("aggregate", "a"), ("payload", "no id")])
        .unwrap();
    let _: String = c
        .xadd(
            &stream,
            "*",
            &[
                ("event_id", "x:1"),
                ("aggregate", "a"),
                ("type", "t"),
                ("payload", "p"),
                ("created_ms", "soon"),
            ],
        )
        .unwrap();
    enqueue(&mut db, &[("a", "good".into())]);
    let relay = Relay::open(
        &path,
        RedisStreams::open(&server.url()).unwrap(),
        RelayOptions::new("orders", &stream),
    )
    .unwrap();
    rt.block_on(drain(&relay));
    assert_eq!(rt.block_on(consume(&mut inbox, &consumer, &sub)), (1, 0));
    assert_eq!(effects(&inbox, "a"), vec!["good".to_owned()]);

    let dead: redis::streams::StreamRangeReply = c.xrange_all(dead_letter_stream(&stream)).unwrap();
    let reasons: Vec<String> = dead.ids.iter().map(|e| e.get("reason").unwrap()).collect();
    assert_eq!(reasons.len(), 2);
    assert!(reasons[0].contains("event_id"), "{reasons:?}");
    assert!(reasons[1].contains("created_ms"), "{reasons:?}");
    let kept: String = dead.ids[0].get("field.payload").unwrap();
    assert_eq!(kept, "no id");
    let pending: redis::streams::StreamPendingReply = c.xpending(&stream, "billing").unwrap();
    assert_eq!(pending.count(), 0);

    // A consumer parks a well-formed message it refuses.
    enqueue(&mut db, &[("a", "refused".into())]);
    rt.block_on(async {
        drain(&relay).await;
        let batch = consumer.read(&sub, 10, Duration::ZERO).await.unwrap();
        assert_eq!(batch.len(), 1);
        consumer
            .dead_letter(&sub, &batch[0], "payload refused")
            .await
            .unwrap();
    });
    let dead: redis::streams::StreamRangeReply = c.xrange_all(dead_letter_stream(&stream)).unwrap();
    assert_eq!(dead.ids.len(), 3);
    let reason: String = dead.ids[2].get("reason").unwrap();
    assert_eq!(reason, "payload refused");
    let pending: redis::streams::StreamPendingReply = c.xpending(&stream, "billing").unwrap();
    assert_eq!(pending.count(), 0);
}
