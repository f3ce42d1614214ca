//! The outbox relay, the RabbitMQ broker and the inbox, on a real
//! `rabbitmq-server` (one for the whole test binary) and real SQLite files:
//! the cases of `outbox_redis.rs`, where RabbitMQ's mapping allows them.
#![cfg(feature = "rabbitmq")]

mod choreography;

use std::sync::Arc;
use std::time::Duration;

use choreography::{
    consume, consumer_db, die_mid_batch, drain, effects, enqueue, handle, rt, service_db,
    DiesAfterPublish,
};
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use seawall_saga::broker::rabbitmq::RabbitMq;
use seawall_saga::broker::{dead_letter_stream, Broker, Subscription};
use seawall_saga::outbox::{Outbox, OutboxError, Relay, RelayOptions};
use seawall_test_rabbitmq::{shared, Proxy};
use seawall_test_redis::unique;

fn url() -> String {
    shared().url()
}

fn broker() -> RabbitMq {
    RabbitMq::open(&url()).unwrap()
}

/// A channel of a connection of the test's own, for inspection.
async fn inspector() -> (Connection, Channel) {
    let conn = Connection::connect(&url(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    (conn, channel)
}

/// The messages ready in `queue` (delivered and unacknowledged ones are not
/// counted).
async fn depth(queue: &str) -> u32 {
    let (_conn, channel) = inspector().await;
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions::default().passive(),
            FieldTable::default(),
        )
        .await
        .unwrap()
        .message_count()
}

/// Takes every message of `queue` (headers, body).
async fn take_all(queue: &str) -> Vec<(FieldTable, Vec<u8>)> {
    let (_conn, channel) = inspector().await;
    let mut taken = Vec::new();
    for _ in 0..1000 {
        let Some(m) = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        else {
            return taken;
        };
        let headers = m.delivery.properties.headers().clone().unwrap_or_default();
        taken.push((headers, m.delivery.data));
    }
    panic!("{queue} did not drain");
}

fn header(headers: &FieldTable, name: &str) -> String {
    match headers.inner().get(name) {
        Some(AMQPValue::LongString(s)) => String::from_utf8(s.as_bytes().to_vec()).unwrap(),
        other => panic!("header {name}: {other:?}"),
    }
}

fn text(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.as_bytes()))
}

/// The queue of a group (the broker's naming).
fn group_queue(sub: &Subscription) -> String {
    format!("{}:{}", sub.stream, sub.group)
}

#[test]
fn an_enqueue_rolled_back_publishes_nothing() {
    let (dir, stream) = (tempfile::tempdir().unwrap(), unique("rollback"));
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

    let sub = Subscription::new(&stream, "billing", "billing-1");
    let relay = Relay::open(&path, broker(), RelayOptions::new("orders", &stream)).unwrap();
    let rt = rt();
    rt.block_on(async {
        relay.broker().create_group(&sub).await.unwrap();
        drain(&relay).await;
        let messages = take_all(&group_queue(&sub)).await;
        assert_eq!(messages.len(), 1);
        assert_eq!(header(&messages[0].0, "aggregate"), "o-2");
        assert_eq!(relay.pending().await.unwrap(), 0);
    });
}

#[test]
fn a_stream_without_a_group_refuses_the_events_and_the_outbox_keeps_them() {
    let (dir, stream) = (tempfile::tempdir().unwrap(), unique("nogroup"));
    let (path, mut db) = service_db(dir.path(), "orders");
    enqueue(&mut db, &[("a", "1".into()), ("a", "2".into())]);
    let relay = Relay::open(&path, broker(), RelayOptions::new("orders", &stream)).unwrap();
    let sub = Subscription::new(&stream, "billing", "billing-1");
    let mut inbox = consumer_db(dir.path(), "billing");
    let rt = rt();
    rt.block_on(async {
        let refused = relay.relay_once().await;
        assert!(
            matches!(&refused, Err(OutboxError::Broker(e)) if !e.is_unavailable()),
            "{refused:?}"
        );
        assert_eq!(relay.pending().await.unwrap(), 2);
        // Once a group exists, the same relay delivers them.
        relay.broker().create_group(&sub).await.unwrap();
        drain(&relay).await;
        assert_eq!(consume(&mut inbox, relay.broker(), &sub).await, (2, 0));
    });
    assert_eq!(effects(&inbox, "a"), vec!["1".to_owned(), "2".to_owned()]);
}

#[test]
fn events_of_an_aggregate_arrive_in_order() {
    let (dir, stream) = (tempfile::tempdir().unwrap(), unique("order"));
    let (path, mut db) = service_db(dir.path(), "orders");
    let aggregates = ["a", "b", "c"];
    let events: Vec<(&str, String)> = (0..60)
        .map(|i| (aggregates[(i * 7) % 3], i.to_string()))
        .collect();
    enqueue(&mut db, &events);

    let relay = Relay::open(
        &path,
        broker(),
        RelayOptions::new("orders", &stream).batch(7),
    )
    .unwrap();
    let consumer = broker();
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
    let (dir, stream) = (tempfile::tempdir().unwrap(), unique("republish"));
    let (path, mut db) = service_db(dir.path(), "orders");
    let events: Vec<(&str, String)> = (0..10).map(|i| ("a", i.to_string())).collect();
    enqueue(&mut db, &events);
    let consumer = broker();
    let sub = Subscription::new(&stream, "billing", "billing-1");
    let queue = group_queue(&sub);
    let mut inbox = consumer_db(dir.path(), "billing");
    let rt = rt();
    rt.block_on(consumer.create_group(&sub)).unwrap();

    // 1. The publish fails after the broker confirmed: the batch stays unsent.
    let relay = Relay::open(
        &path,
        DiesAfterPublish::new(broker(), true),
        RelayOptions::new("orders", &stream).batch(4),
    )
    .unwrap();
    let failed = rt.block_on(relay.relay_once());
    assert!(matches!(failed, Err(OutboxError::Broker(_))), "{failed:?}");
    assert_eq!(rt.block_on(depth(&queue)), 4);
    assert_eq!(rt.block_on(relay.pending()).unwrap(), 10);
    drop(relay);

    // 2. A new relay is dropped mid-batch, after publishing, before marking sent.
    let relay = Relay::open(
        &path,
        DiesAfterPublish::new(broker(), false),
        RelayOptions::new("orders", &stream).batch(4),
    )
    .unwrap();
    die_mid_batch(&rt, relay, 4);
    assert_eq!(rt.block_on(depth(&queue)), 8);

    // 3. A third relay publishes everything; the consumer applies each event once.
    let relay = Relay::open(
        &path,
        broker(),
        RelayOptions::new("orders", &stream).batch(4),
    )
    .unwrap();
    rt.block_on(drain(&relay));
    assert_eq!(rt.block_on(depth(&queue)), 18);
    let (applied, duplicates) = rt.block_on(consume(&mut inbox, &consumer, &sub));
    assert_eq!((applied, duplicates), (10, 8));
    let expected: Vec<String> = (0..10).map(|i| i.to_string()).collect();
    assert_eq!(effects(&inbox, "a"), expected);
}

#[test]
fn the_messages_of_a_dead_consumer_come_back_to_its_group() {
    let (dir, stream) = (tempfile::tempdir().unwrap(), unique("dead"));
    let (path, mut db) = service_db(dir.path(), "orders");
    enqueue(&mut db, &[("a", "1".into()), ("a", "2".into())]);
    let relay = Relay::open(&path, broker(), RelayOptions::new("orders", &stream)).unwrap();
    let dead = broker();
    let dead_sub = Subscription::new(&stream, "billing", "billing-dead");
    let alive = broker();
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
        // Nothing to claim: the broker gives them back to the queue...
        let claimed = alive
            .claim_stale(&alive_sub, Duration::ZERO, 10)
            .await
            .unwrap();
        assert!(claimed.is_empty());
        // ...where the other consumer reads them, in their order.
        let mut back = Vec::new();
        for _ in 0..100 {
            back.extend(
                alive
                    .read(&alive_sub, 10, Duration::from_millis(50))
                    .await
                    .unwrap(),
            );
            if back.len() >= 2 {
                break;
            }
        }
        let ids = |ds: &[seawall_saga::broker::Delivery]| -> Vec<String> {
            ds.iter().map(|d| d.envelope.event_id.clone()).collect()
        };
        assert_eq!(ids(&back), ids(&taken), "the dead consumer's messages");
        assert_ne!(back[0].id, taken[0].id, "a new delivery");
        for d in &back {
            assert!(handle(&mut inbox, &alive, &alive_sub, d).await);
        }
        drop(alive);
        // Nothing is left, acknowledged or not (an unacknowledged message
        // would be back in the queue now that its consumer is gone).
        for _ in 0..100 {
            if depth(&group_queue(&alive_sub)).await == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(depth(&group_queue(&alive_sub)).await, 0);
    });
    assert_eq!(effects(&inbox, "a"), vec!["1".to_owned(), "2".to_owned()]);
}

#[test]
fn a_consumer_cut_off_reads_its_unacknowledged_messages_again() {
    let (dir, stream) = (tempfile::tempdir().unwrap(), unique("cutoff"));
    let (path, mut db) = service_db(dir.path(), "orders");
    enqueue(&mut db, &[("a", "1".into()), ("a", "2".into())]);
    let relay = Relay::open(&path, broker(), RelayOptions::new("orders", &stream)).unwrap();
    let proxy = Proxy::start(shared().port());
    let consumer = RabbitMq::open(&proxy.url())
        .unwrap()
        .timeout(Duration::from_millis(500));
    let sub = Subscription::new(&stream, "billing", "billing-1");
    let mut inbox = consumer_db(dir.path(), "billing");
    let rt = rt();
    rt.block_on(async {
        consumer.create_group(&sub).await.unwrap();
        drain(&relay).await;
        let first = consumer.read(&sub, 10, Duration::ZERO).await.unwrap();
        assert_eq!(first.len(), 2);
        // Handled, then the connection is lost before the acknowledgement.
        for d in &first {
            let tx = inbox.transaction().unwrap();
            assert!(
                seawall_saga::outbox::Inbox::handle(&tx, "billing", &d.envelope.event_id).unwrap()
            );
            tx.execute(
                "INSERT INTO effects (event_id, aggregate, payload) VALUES (?1, ?2, ?3)",
                [
                    &d.envelope.event_id,
                    &d.envelope.aggregate,
                    &d.envelope.payload,
                ],
            )
            .unwrap();
            tx.commit().unwrap();
        }
        proxy.cut();
        let ids: Vec<String> = first.iter().map(|d| d.id.clone()).collect();
        // Unavailable, or written to a connection already closed (the client
        // may not have seen it close yet): it never reaches the broker.
        let lost = consumer.ack(&sub, &ids).await;
        assert!(
            lost.as_ref().is_ok() || lost.as_ref().is_err_and(|e| e.is_unavailable()),
            "{lost:?}"
        );
        proxy.restore();
        // The messages are back; their old ids acknowledge nothing.
        let mut again = Vec::new();
        let mut failures = 0;
        for _ in 0..100 {
            match consumer.read(&sub, 10, Duration::from_millis(50)).await {
                Ok(batch) => again.extend(batch),
                Err(e) if e.is_unavailable() => failures += 1,
                Err(e) => panic!("{e}"),
            }
            if again.len() >= 2 {
                break;
            }
        }
        assert!(
            failures <= 1,
            "{failures} failed reads after the broker was back"
        );
        assert_eq!(again.len(), 2);
        consumer.ack(&sub, &ids).await.unwrap();
        for d in &again {
            assert!(!handle(&mut inbox, &consumer, &sub, d).await, "a duplicate");
        }
        assert!(consumer
            .read(&sub, 10, Duration::ZERO)
            .await
            .unwrap()
            .is_empty());
    });
    drop(consumer);
    assert_eq!(effects(&inbox, "a"), vec!["1".to_owned(), "2".to_owned()]);
    for _ in 0..100 {
        if rt.block_on(depth(&group_queue(&sub))) == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("a message was left unacknowledged");
}

#[test]
fn a_broker_down_at_start_and_mid_run_delays_the_events_and_loses_none() {
    let (dir, stream) = (tempfile::tempdir().unwrap(), unique("outage"));
    let (path, mut db) = service_db(dir.path(), "orders");
    let proxy = Proxy::start(shared().port());
    let sub = Subscription::new(&stream, "billing", "billing-1");
    let rt = rt();
    rt.block_on(broker().create_group(&sub)).unwrap();
    let relay = Relay::open(
        &path,
        RabbitMq::open(&proxy.url())
            .unwrap()
            .timeout(Duration::from_millis(500)),
        RelayOptions::new("orders", &stream),
    )
    .unwrap();

    // Down at start.
    proxy.cut();
    enqueue(&mut db, &[("a", "1".into())]);
    let down = rt.block_on(relay.relay_once());
    assert!(
        matches!(&down, Err(OutboxError::Broker(e)) if e.is_unavailable()),
        "{down:?}"
    );
    assert_eq!(rt.block_on(relay.pending()).unwrap(), 1);
    proxy.restore();
    rt.block_on(drain(&relay));
    assert_eq!(rt.block_on(depth(&group_queue(&sub))), 1);

    // Goes away while `run` relays, comes back.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = {
        let relay = Arc::new(
            Relay::open(
                &path,
                RabbitMq::open(&proxy.url())
                    .unwrap()
                    .timeout(Duration::from_millis(500)),
                RelayOptions::new("orders", &stream)
                    .poll_interval(Duration::from_millis(5))
                    .retry_interval(Duration::from_millis(20)),
            )
            .unwrap(),
        );
        rt.spawn(async move {
            relay
                .run(async move {
                    let _ = stopped.await;
                })
                .await
        })
    };
    let wait_empty = |relay: &Relay<RabbitMq>| {
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
    proxy.cut();
    enqueue(&mut db, &[("a", "3".into()), ("a", "4".into())]);
    // The relay fails while the broker is away: the events stay.
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(rt.block_on(relay.pending()).unwrap(), 2);
    }
    proxy.restore();
    wait_empty(&relay);
    stop.send(()).unwrap();
    let report = rt.block_on(running).unwrap();
    assert!(report.failures >= 1, "{report:?}");
    assert!(report.published >= 3, "{report:?}");
    // The broker kept what it had confirmed: every event, each once.
    let payloads: Vec<String> = rt
        .block_on(take_all(&group_queue(&sub)))
        .into_iter()
        .map(|(_, body)| String::from_utf8(body).unwrap())
        .collect();
    assert_eq!(payloads, ["1", "2", "3", "4"]);
}

#[test]
fn a_malformed_message_is_parked_in_the_dead_letter_queue_and_the_consumer_goes_on() {
    let (dir, stream) = (tempfile::tempdir().unwrap(), unique("malformed"));
    let (path, mut db) = service_db(dir.path(), "orders");
    let consumer = broker();
    let sub = Subscription::new(&stream, "billing", "billing-1");
    let mut inbox = consumer_db(dir.path(), "billing");
    let rt = rt();
    rt.block_on(async {
        consumer.create_group(&sub).await.unwrap();
        let (_conn, channel) = inspector().await;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let mut no_id = FieldTable::default();
        no_id.insert("aggregate".into(), text("a"));
        let mut late = FieldTable::default();
        for (k, v) in [("event_id", "x:1"), ("aggregate", "a"), ("type", "t")] {
            late.insert(k.into(), text(v));
        }
        late.insert("created_ms".into(), text("soon"));
        for (headers, body) in [(no_id, &b"no id"[..]), (late, &b"p"[..])] {
            channel
                .basic_publish(
                    stream.as_str().into(),
                    "".into(),
                    BasicPublishOptions::default(),
                    body,
                    BasicProperties::default().with_headers(headers),
                )
                .await
                .unwrap();
        }
        assert!(channel.wait_for_confirms().await.unwrap().is_empty());
    });
    enqueue(&mut db, &[("a", "good".into())]);
    let relay = Relay::open(&path, broker(), RelayOptions::new("orders", &stream)).unwrap();
    rt.block_on(drain(&relay));
    assert_eq!(rt.block_on(consume(&mut inbox, &consumer, &sub)), (1, 0));
    assert_eq!(effects(&inbox, "a"), vec!["good".to_owned()]);

    let dead = rt.block_on(take_all(&dead_letter_stream(&stream)));
    assert_eq!(dead.len(), 2);
    let reasons: Vec<String> = dead.iter().map(|(h, _)| header(h, "reason")).collect();
    assert!(reasons[0].contains("event_id"), "{reasons:?}");
    assert!(reasons[1].contains("created_ms"), "{reasons:?}");
    assert_eq!(dead[0].1, b"no id");
    assert_eq!(header(&dead[0].0, "field.aggregate"), "a");
    assert_eq!(header(&dead[0].0, "group"), "billing");

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
    let dead = rt.block_on(take_all(&dead_letter_stream(&stream)));
    assert_eq!(dead.len(), 1);
    assert_eq!(header(&dead[0].0, "reason"), "payload refused");
    assert_eq!(dead[0].1, b"refused");
    drop(consumer);
    // Nothing is left in the group's queue (parked means acknowledged).
    for _ in 0..100 {
        if rt.block_on(depth(&group_queue(&sub))) == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("a parked message was left unacknowledged");
}
