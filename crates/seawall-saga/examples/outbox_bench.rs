//! Throughput and latency of the outbox relay from SQLite to Redis Streams.
//!
//! ```text
//! cargo run --release -p seawall-saga --features redis-streams --example outbox_bench
//! ```
//!
//! Starts a throw-away `redis-server` on a free loopback port (or uses
//! `REDIS_URL` when set) and two SQLite files in a temporary directory, both
//! in WAL mode with `synchronous = FULL`. Prints:
//!
//! 1. the relay's throughput on a backlog: `BENCH_EVENTS` events (default
//!    20000) already in the outbox, published and marked sent;
//! 2. end to end, with the producer, the relay and a consumer running at once:
//!    events per second from the first commit to the last inbox commit, and
//!    p50/p99 latency from the producer's commit to the consumer's inbox
//!    commit (each event is enqueued in its own transaction; the consumer
//!    records a read batch in one transaction). `BENCH_RATE` (events per
//!    second, default 0: as fast as the producer commits) paces the producer.

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::Connection;
use seawall_saga::broker::redis_streams::RedisStreams;
use seawall_saga::broker::{Broker, Subscription};
use seawall_saga::outbox::{self, Inbox, Outbox, Relay, RelayOptions};

fn micros_now() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_micros(),
    )
    .expect("time fits")
}

fn open_db(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("open sqlite");
    conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
        .expect("wal");
    conn.execute_batch("PRAGMA synchronous = FULL")
        .expect("synchronous");
    conn.busy_timeout(Duration::from_secs(10)).expect("busy");
    outbox::migrate(&conn).expect("migrate");
    conn
}

/// Enqueues `n` events, one transaction each, at most `rate` per second (0:
/// as fast as commits go). Returns each event's row id and the time its
/// commit returned, in microseconds since the epoch.
fn produce(conn: &mut Connection, n: usize, rate: u64) -> HashMap<i64, i64> {
    let started = Instant::now();
    let mut committed = HashMap::with_capacity(n);
    for i in 0..n {
        if rate > 0 {
            let due = started + Duration::from_secs_f64(i as f64 / rate as f64);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
        }
        let tx = conn.transaction().expect("begin");
        let id = Outbox::enqueue(&tx, &format!("agg-{}", i % 64), "bench", "{}").expect("enqueue");
        tx.commit().expect("commit");
        committed.insert(id, micros_now());
    }
    committed
}

/// A `redis-server` on a free loopback port, or `REDIS_URL`.
fn redis(dir: &Path) -> (String, Option<Child>) {
    if let Ok(url) = std::env::var("REDIS_URL") {
        return (url, None);
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let mut child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn redis-server (or set REDIS_URL)");
    for _ in 0..250 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return (format!("redis://127.0.0.1:{port}"), Some(child));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("redis-server did not start");
}

async fn drain(relay: &Relay<RedisStreams>) {
    while relay.relay_once().await.expect("relay") > 0 {}
}

fn main() {
    let events: usize = std::env::var("BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let rate: u64 = std::env::var("BENCH_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let dir = tempfile::tempdir().expect("temporary directory");
    let (url, mut server) = redis(dir.path());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");

    // 1. A backlog.
    let producer_path = dir.path().join("producer.db");
    let mut producer = open_db(&producer_path);
    produce(&mut producer, events, 0);
    let relay = Relay::open(
        &producer_path,
        RedisStreams::open(&url).expect("broker"),
        RelayOptions::new("bench", "bench-backlog"),
    )
    .expect("relay");
    let started = Instant::now();
    rt.block_on(drain(&relay));
    let elapsed = started.elapsed();
    println!(
        "relay, backlog of {events}: {:.0} events/s ({elapsed:.2?})",
        events as f64 / elapsed.as_secs_f64()
    );

    // 2. End to end.
    let relay = Arc::new(
        Relay::open(
            &producer_path,
            RedisStreams::open(&url).expect("broker"),
            RelayOptions::new("bench", "bench-live").poll_interval(Duration::from_millis(1)),
        )
        .expect("relay"),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let relaying = {
        let relay = Arc::clone(&relay);
        rt.spawn(async move {
            relay
                .run(async move {
                    let _ = stopped.await;
                })
                .await
        })
    };
    let consumer_path = dir.path().join("consumer.db");
    let mut inbox = open_db(&consumer_path);
    let broker = RedisStreams::open(&url).expect("broker");
    let sub = Subscription::new("bench-live", "bench", "bench-1");
    rt.block_on(broker.create_group(&sub)).expect("group");
    let consuming = std::thread::spawn(move || {
        // (row id, inbox commit time)
        let mut handled: Vec<(i64, i64)> = Vec::with_capacity(events);
        while handled.len() < events {
            let batch = rt
                .block_on(broker.read(&sub, 256, Duration::from_millis(100)))
                .expect("read");
            if batch.is_empty() {
                continue;
            }
            let tx = inbox.transaction().expect("begin");
            let mut sent = Vec::new();
            for d in &batch {
                if Inbox::handle(&tx, "bench", &d.envelope.event_id).expect("inbox") {
                    let (_, id) = d.envelope.event_id.rsplit_once(':').expect("event id");
                    sent.push(id.parse::<i64>().expect("row id"));
                }
            }
            tx.commit().expect("commit");
            let now = micros_now();
            handled.extend(sent.into_iter().map(|id| (id, now)));
            let ids: Vec<String> = batch.into_iter().map(|d| d.id).collect();
            rt.block_on(broker.ack(&sub, &ids)).expect("ack");
        }
        stop.send(()).expect("stop");
        rt.block_on(relaying).expect("relay task");
        handled
    });
    let started = Instant::now();
    let committed = produce(&mut producer, events, rate);
    let produced = started.elapsed();
    let handled = consuming.join().expect("consumer");
    let mut latencies: Vec<i64> = handled.iter().map(|(id, at)| at - committed[id]).collect();
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
    println!(
        "end to end, {events} events, producer rate {}: {:.0} events/s (producer {:.0} commits/s), \
         commit-to-inbox latency p50 {:.2} ms, p99 {:.2} ms",
        if rate == 0 { "unbounded".to_owned() } else { format!("{rate}/s") },
        events as f64 / elapsed.as_secs_f64(),
        events as f64 / produced.as_secs_f64(),
        at(0.5),
        at(0.99),
    );
    if let Some(child) = server.as_mut() {
        let _ = child.kill();
        let _ = child.wait();
    }
}
