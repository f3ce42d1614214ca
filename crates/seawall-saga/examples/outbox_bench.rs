//! Throughput and latency of the outbox relay to Redis Streams (and to
//! RabbitMQ with the feature `rabbitmq`), from SQLite and from Postgres.
//!
//! ```text
//! cargo run --release -p seawall-saga --features redis-streams --example outbox_bench
//! cargo run --release -p seawall-saga --features rabbitmq,redis-streams --example outbox_bench
//! ```
//!
//! Starts a throw-away `redis-server` on a free loopback port (or uses
//! `REDIS_URL` when set); with the feature `rabbitmq`, a throw-away
//! `rabbitmq-server` on free loopback ports (or `RABBITMQ_URL`, an
//! `amqp://` URL). `BENCH_BROKER` picks the brokers: `redis`, `rabbitmq`
//! or both (`redis,rabbitmq`, the default when the feature is on). SQLite: two files in a temporary directory, both in
//! WAL mode with `synchronous = FULL`. Postgres: `SEAWALL_TEST_POSTGRES_URL`
//! if set, otherwise a throw-away server started with
//! `scripts/lib/postgres.sh` (default `synchronous_commit = on`); the producer
//! and the consumer each have a schema of their own. For each source, prints:
//!
//! 1. the relay's throughput on a backlog: `BENCH_EVENTS` events (default
//!    20000) already in the outbox, published and marked sent;
//! 2. end to end, with the producer, the relay and a consumer running at once:
//!    events per second from the first commit to the last inbox commit, and
//!    p50/p99 latency from the producer's commit to the consumer's inbox
//!    commit. Each event is enqueued in its own transaction, with the state
//!    change it announces (a row of the producer's `bench_state` table
//!    updated); the consumer records a read batch in one transaction.
//!    `BENCH_RATE` (events per second, default 0: as fast as the producer
//!    commits) paces the producer.
//!
//! Every stream has its consumer group before anything is relayed to it (on
//! RabbitMQ a publication that no group receives is refused).
//!
//! `BENCH_SOURCE` picks the sources: `sqlite`, `postgres` or both
//! (`sqlite,postgres`, the default).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::Connection;
#[cfg(feature = "rabbitmq")]
use seawall_saga::broker::rabbitmq::RabbitMq;
use seawall_saga::broker::redis_streams::RedisStreams;
use seawall_saga::broker::{Broker, Delivery, Subscription};
use seawall_saga::outbox::{self, postgres, Inbox, Outbox, Relay, RelayOptions};
use tokio::runtime::Runtime;

/// Aggregates the events are spread over (one `bench_state` row each).
const AGGREGATES: usize = 64;

fn micros_now() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_micros(),
    )
    .expect("time fits")
}

fn env_parse<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// When the `i`-th event is due at `rate` per second (0: at once).
fn due(started: Instant, i: usize, rate: u64) -> Option<Instant> {
    (rate > 0).then(|| started + Duration::from_secs_f64(i as f64 / rate as f64))
}

/// The row id of an event, from its event id `{source}:{row id}`.
fn row_id(delivery: &Delivery) -> i64 {
    let (_, id) = delivery
        .envelope
        .event_id
        .rsplit_once(':')
        .expect("event id");
    id.parse().expect("row id")
}

/// What one end-to-end run measured.
struct EndToEnd {
    events: usize,
    elapsed: Duration,
    produced: Duration,
    /// Commit-to-inbox latencies in microseconds, sorted.
    latencies: Vec<i64>,
}

impl EndToEnd {
    fn new(
        committed: &HashMap<i64, i64>,
        handled: &[(i64, i64)],
        elapsed: Duration,
        produced: Duration,
    ) -> Self {
        let mut latencies: Vec<i64> = handled.iter().map(|(id, at)| at - committed[id]).collect();
        latencies.sort_unstable();
        EndToEnd {
            events: committed.len(),
            elapsed,
            produced,
            latencies,
        }
    }

    fn print(&self, source: &str, rate: u64) {
        let at = |q: f64| {
            self.latencies[((self.latencies.len() - 1) as f64 * q) as usize] as f64 / 1000.0
        };
        println!(
            "{source:<16} end to end, {} events, producer rate {}: {:.0} events/s (producer {:.0} commits/s), \
             commit-to-inbox latency p50 {:.2} ms, p99 {:.2} ms",
            self.events,
            if rate == 0 { "unbounded".to_owned() } else { format!("{rate}/s") },
            self.events as f64 / self.elapsed.as_secs_f64(),
            self.events as f64 / self.produced.as_secs_f64(),
            at(0.5),
            at(0.99),
        );
    }
}

fn print_backlog(source: &str, events: usize, elapsed: Duration) {
    println!(
        "{source:<16} relay, backlog of {events}: {:.0} events/s ({elapsed:.2?})",
        events as f64 / elapsed.as_secs_f64()
    );
}

async fn drain<B: Broker>(relay: &Relay<B>) {
    while relay.relay_once().await.expect("relay") > 0 {}
}

/// A consumer group on `stream`, created before anything is relayed to it.
fn subscribe<B: Broker>(rt: &Runtime, broker: &B, stream: &str) -> Subscription {
    let sub = Subscription::new(stream, "bench", "bench-1");
    rt.block_on(broker.create_group(&sub)).expect("group");
    sub
}

// SQLite.

fn open_sqlite(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("open sqlite");
    conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
        .expect("wal");
    conn.execute_batch("PRAGMA synchronous = FULL")
        .expect("synchronous");
    conn.busy_timeout(Duration::from_secs(10)).expect("busy");
    outbox::migrate(&conn).expect("migrate");
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS bench_state (aggregate TEXT PRIMARY KEY, version INTEGER NOT NULL)",
    )
    .expect("state table");
    conn
}

/// Enqueues `n` events, one transaction each with its state change, at most
/// `rate` per second (0: as fast as commits go). Returns each event's row id
/// and the time its commit returned, in microseconds since the epoch.
fn produce_sqlite(conn: &mut Connection, n: usize, rate: u64) -> HashMap<i64, i64> {
    let started = Instant::now();
    let mut committed = HashMap::with_capacity(n);
    for i in 0..n {
        if let Some(due) = due(started, i, rate) {
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
        }
        let aggregate = format!("agg-{}", i % AGGREGATES);
        let tx = conn.transaction().expect("begin");
        tx.execute(
            "INSERT INTO bench_state (aggregate, version) VALUES (?1, 1)
             ON CONFLICT (aggregate) DO UPDATE SET version = version + 1",
            [&aggregate],
        )
        .expect("state change");
        let id = Outbox::enqueue(&tx, &aggregate, "bench", "{}").expect("enqueue");
        tx.commit().expect("commit");
        committed.insert(id, micros_now());
    }
    committed
}

/// A broker to bench: its name and how to open one.
struct Target<'a, B> {
    name: &'a str,
    open: &'a dyn Fn() -> B,
}

fn bench_sqlite<B: Broker + Send + 'static>(
    rt: Runtime,
    target: &Target<'_, B>,
    dir: &Path,
    events: usize,
    rate: u64,
) {
    let label = format!("sqlite/{}", target.name);
    let dir = dir.join(label.replace('/', "-"));
    std::fs::create_dir_all(&dir).expect("bench directory");
    // 1. A backlog.
    let producer_path = dir.join("producer.db");
    let mut producer = open_sqlite(&producer_path);
    produce_sqlite(&mut producer, events, 0);
    let relay = Relay::open(
        &producer_path,
        (target.open)(),
        RelayOptions::new("bench", "sqlite-backlog"),
    )
    .expect("relay");
    subscribe(&rt, relay.broker(), "sqlite-backlog");
    let started = Instant::now();
    rt.block_on(drain(&relay));
    print_backlog(&label, events, started.elapsed());

    // 2. End to end.
    let relay = Arc::new(
        Relay::open(
            &producer_path,
            (target.open)(),
            RelayOptions::new("bench", "sqlite-live").poll_interval(Duration::from_millis(1)),
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
    let mut inbox = open_sqlite(&dir.join("consumer.db"));
    let broker = (target.open)();
    let sub = subscribe(&rt, &broker, "sqlite-live");
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
                    sent.push(row_id(d));
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
    let committed = produce_sqlite(&mut producer, events, rate);
    let produced = started.elapsed();
    let handled = consuming.join().expect("consumer");
    EndToEnd::new(&committed, &handled, started.elapsed(), produced).print(&label, rate);
}

// Postgres.

fn postgres_url() -> (String, Option<Child>) {
    if let Ok(url) = std::env::var("SEAWALL_TEST_POSTGRES_URL") {
        return (url, None);
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/lib/postgres.sh");
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source '{script}' && pg_start && echo \"$SEAWALL_TEST_POSTGRES_URL\" && read -r _; pg_stop"
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("bash");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("pg_start output");
    (line.trim().to_owned(), Some(child))
}

/// A client whose `search_path` is `schema`, created afresh, with the outbox
/// tables and the state table.
async fn pg_client(url: &str, schema: &str, fresh: bool) -> tokio_postgres::Client {
    let (mut client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to postgres");
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("postgres connection: {e}");
        }
    });
    if fresh {
        client
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE; CREATE SCHEMA \"{schema}\""
            ))
            .await
            .expect("schema");
    }
    client
        .batch_execute(&format!("SET search_path TO \"{schema}\""))
        .await
        .expect("search path");
    if fresh {
        postgres::migrate(&mut client).await.expect("migrate");
        client
            .batch_execute(
                "CREATE TABLE bench_state (aggregate text PRIMARY KEY, version bigint NOT NULL)",
            )
            .await
            .expect("state table");
    }
    client
}

/// As [`produce_sqlite`], on Postgres.
async fn produce_postgres(
    client: &mut tokio_postgres::Client,
    n: usize,
    rate: u64,
) -> HashMap<i64, i64> {
    let update = client
        .prepare(
            "INSERT INTO bench_state (aggregate, version) VALUES ($1, 1)
             ON CONFLICT (aggregate) DO UPDATE SET version = bench_state.version + 1",
        )
        .await
        .expect("prepare");
    let started = Instant::now();
    let mut committed = HashMap::with_capacity(n);
    for i in 0..n {
        if let Some(due) = due(started, i, rate) {
            tokio::time::sleep_until(due.into()).await;
        }
        let aggregate = format!("agg-{}", i % AGGREGATES);
        let tx = client.transaction().await.expect("begin");
        tx.execute(&update, &[&aggregate])
            .await
            .expect("state change");
        let id = postgres::enqueue(&tx, &aggregate, "bench", "{}")
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
        committed.insert(id, micros_now());
    }
    committed
}

fn bench_postgres<B: Broker + Send + 'static>(
    rt: Runtime,
    target: &Target<'_, B>,
    pg_url: &str,
    events: usize,
    rate: u64,
) {
    let label = format!("postgres/{}", target.name);
    let producer_schema = format!("outbox_bench_producer_{}", std::process::id());
    let consumer_schema = format!("outbox_bench_consumer_{}", std::process::id());

    // 1. A backlog.
    let mut producer = rt.block_on(pg_client(pg_url, &producer_schema, true));
    rt.block_on(produce_postgres(&mut producer, events, 0));
    let relay = rt.block_on(async {
        Relay::postgres(
            pg_client(pg_url, &producer_schema, false).await,
            (target.open)(),
            RelayOptions::new("bench", "postgres-backlog"),
        )
        .await
        .expect("relay")
    });
    subscribe(&rt, relay.broker(), "postgres-backlog");
    let started = Instant::now();
    rt.block_on(drain(&relay));
    print_backlog(&label, events, started.elapsed());

    // 2. End to end.
    let relay = rt.block_on(async {
        Relay::postgres(
            pg_client(pg_url, &producer_schema, false).await,
            (target.open)(),
            RelayOptions::new("bench", "postgres-live").poll_interval(Duration::from_millis(1)),
        )
        .await
        .expect("relay")
    });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let relaying = rt.spawn(async move {
        relay
            .run(async move {
                let _ = stopped.await;
            })
            .await
    });
    let mut inbox = rt.block_on(pg_client(pg_url, &consumer_schema, true));
    let broker = (target.open)();
    let sub = subscribe(&rt, &broker, "postgres-live");
    let consuming = rt.spawn(async move {
        // (row id, inbox commit time)
        let mut handled: Vec<(i64, i64)> = Vec::with_capacity(events);
        while handled.len() < events {
            let batch = broker
                .read(&sub, 256, Duration::from_millis(100))
                .await
                .expect("read");
            if batch.is_empty() {
                continue;
            }
            let tx = inbox.transaction().await.expect("begin");
            let mut sent = Vec::new();
            for d in &batch {
                if postgres::handle(&tx, "bench", &d.envelope.event_id)
                    .await
                    .expect("inbox")
                {
                    sent.push(row_id(d));
                }
            }
            tx.commit().await.expect("commit");
            let now = micros_now();
            handled.extend(sent.into_iter().map(|id| (id, now)));
            let ids: Vec<String> = batch.into_iter().map(|d| d.id).collect();
            broker.ack(&sub, &ids).await.expect("ack");
        }
        stop.send(()).expect("stop");
        relaying.await.expect("relay task");
        handled
    });
    let started = Instant::now();
    let committed = rt.block_on(produce_postgres(&mut producer, events, rate));
    let produced = started.elapsed();
    let handled = rt.block_on(consuming).expect("consumer");
    EndToEnd::new(&committed, &handled, started.elapsed(), produced).print(&label, rate);
    rt.block_on(producer.batch_execute(&format!(
        "DROP SCHEMA \"{producer_schema}\" CASCADE; DROP SCHEMA \"{consumer_schema}\" CASCADE"
    )))
    .expect("drop schemas");
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

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Runs the benches of the sources asked for on one broker.
fn bench<B: Broker + Send + 'static>(target: &Target<'_, B>, dir: &Path, events: usize, rate: u64) {
    let sources = std::env::var("BENCH_SOURCE").unwrap_or_else(|_| "sqlite,postgres".into());
    let wants = |source: &str| sources.split(',').any(|s| s.trim() == source);
    if wants("sqlite") {
        bench_sqlite(runtime(), target, dir, events, rate);
    }
    if wants("postgres") {
        let (pg_url, pg_server) = postgres_url();
        bench_postgres(runtime(), target, &pg_url, events, rate);
        drop(pg_server);
    }
}

fn main() {
    let events: usize = env_parse("BENCH_EVENTS", 20_000);
    let rate: u64 = env_parse("BENCH_RATE", 0);
    let default_brokers = if cfg!(feature = "rabbitmq") {
        "redis,rabbitmq"
    } else {
        "redis"
    };
    let brokers = std::env::var("BENCH_BROKER").unwrap_or_else(|_| default_brokers.into());
    let wants = |broker: &str| brokers.split(',').any(|b| b.trim() == broker);
    let dir = tempfile::tempdir().expect("temporary directory");
    if wants("redis") {
        let (redis_url, mut server) = redis(dir.path());
        let open = || RedisStreams::open(&redis_url).expect("broker");
        let target = Target {
            name: "redis",
            open: &open,
        };
        bench(&target, dir.path(), events, rate);
        if let Some(child) = server.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    #[cfg(feature = "rabbitmq")]
    if wants("rabbitmq") {
        let server = std::env::var("RABBITMQ_URL")
            .is_err()
            .then(seawall_test_rabbitmq::RabbitServer::start);
        let url = std::env::var("RABBITMQ_URL")
            .unwrap_or_else(|_| server.as_ref().expect("server").url());
        let open = || RabbitMq::open(&url).expect("broker");
        let target = Target {
            name: "rabbitmq",
            open: &open,
        };
        bench(&target, dir.path(), events, rate);
        drop(server);
    }
}
