//! Throughput and recovery figures for the saga logs.
//!
//! ```text
//! cargo run --release -p seawall-saga --example saga_bench
//! ```
//!
//! Prints three-step sagas per second on SQLite (one worker, `synchronous =
//! FULL`) and on Postgres (one and four workers), the latency of a saga whose
//! three steps each wait 10 ms, run in sequence and as one parallel group, and
//! the time to recover 10,000 unfinished sagas. Postgres: `SEAWALL_TEST_POSTGRES_URL` if set,
//! otherwise a throw-away server started with `scripts/lib/postgres.sh`.
//! Environment knobs: `BENCH_SAGAS` (default 3000), `BENCH_CONCURRENCY`
//! (default 64), `BENCH_RECOVERY` (default 10000), `BENCH_ONLY` (a comma
//! separated choice of `sqlite`, `latency`, `postgres` and `recovery`; default
//! all), `BENCH_PG_WRITERS` (the Postgres log's writers, default its default).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use seawall_saga::{
    ListQuery, Orchestrator, Parallel, PostgresLog, PostgresOptions, Saga, SagaLog, SagaStatus,
    SqliteLog, SqliteOptions, StartOptions, Step, StepContext, Synchronous,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Clone)]
struct Order {
    id: u64,
    cents: u64,
}

#[derive(Serialize, Deserialize)]
struct Receipt {
    reference: String,
}

/// Three steps that do no I/O of their own: the figures measure the
/// orchestrator and its log. With `hang_at_second`, the second step never
/// returns (to leave sagas unfinished for the recovery figure).
fn purchase(second_step_entered: Option<Arc<AtomicUsize>>) -> Saga<Order> {
    let mut builder = Saga::builder("purchase");
    for (index, name) in ["reserve_stock", "charge", "schedule_delivery"]
        .into_iter()
        .enumerate()
    {
        let entered = second_step_entered.clone();
        builder = builder.step(
            Step::new(name, move |ctx: StepContext<Order>| {
                let entered = entered.clone();
                async move {
                    if index == 1 {
                        if let Some(entered) = entered {
                            entered.fetch_add(1, Ordering::SeqCst);
                            std::future::pending::<()>().await;
                        }
                    }
                    Ok::<_, String>(Receipt {
                        reference: format!("{}-{}", ctx.input().id, ctx.idempotency_key()),
                    })
                }
            })
            .compensate(|_ctx, _receipt: Receipt| async { Ok::<_, String>(()) }),
        );
    }
    builder.build().expect("valid saga")
}

/// Three steps that each wait `step` (an I/O of that latency), in sequence
/// or as one parallel group.
fn waiting(step: Duration, parallel: bool) -> Saga<Order> {
    let steps = ["reserve_stock", "charge", "schedule_delivery"].map(|name| {
        Step::new(name, move |ctx: StepContext<Order>| async move {
            tokio::time::sleep(step).await;
            Ok::<_, String>(Receipt {
                reference: format!("{}-{}", ctx.input().id, ctx.idempotency_key()),
            })
        })
        .compensate(|_ctx, _receipt: Receipt| async { Ok::<_, String>(()) })
    });
    let name = if parallel {
        "waiting_parallel"
    } else {
        "waiting_sequence"
    };
    let mut builder = Saga::builder(name);
    if parallel {
        let mut group = Parallel::new();
        for step in steps {
            group = group.step(step);
        }
        builder = builder.parallel(group);
    } else {
        for step in steps {
            builder = builder.step(step);
        }
    }
    builder.build().expect("valid saga")
}

/// The median and 99th percentile of `runs` sagas run one at a time.
async fn latency(o: &Orchestrator, saga: &Saga<Order>, runs: usize) -> (Duration, Duration) {
    let mut times = Vec::with_capacity(runs);
    for i in 0..runs {
        let started = Instant::now();
        let outcome = o
            .start(
                saga,
                Order {
                    id: i as u64,
                    cents: 100,
                },
            )
            .await
            .expect("saga runs");
        assert_eq!(outcome.status, SagaStatus::Completed);
        times.push(started.elapsed());
    }
    times.sort_unstable();
    let at = |pct: usize| times[((times.len() * pct).div_ceil(100)).clamp(1, times.len()) - 1];
    (at(50), at(99))
}

/// Whether `BENCH_ONLY` (default: every part) selects `part`.
fn selected(part: &str) -> bool {
    std::env::var("BENCH_ONLY").map_or(true, |only| only.split(',').any(|p| p.trim() == part))
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `total` sagas spread over `orchestrators`, `concurrency` in flight in all.
async fn throughput(
    orchestrators: &[Orchestrator],
    saga: &Saga<Order>,
    total: usize,
    concurrency: usize,
) -> f64 {
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for lane in 0..concurrency {
        let o = orchestrators[lane % orchestrators.len()].clone();
        let (saga, next) = (saga.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return;
                }
                let outcome = o
                    .start(
                        &saga,
                        Order {
                            id: i as u64,
                            cents: 100,
                        },
                    )
                    .await
                    .expect("saga runs");
                assert_eq!(outcome.status, SagaStatus::Completed);
            }
        }));
    }
    for task in tasks {
        task.await.expect("bench task");
    }
    total as f64 / started.elapsed().as_secs_f64()
}

/// Leaves `count` sagas unfinished (step 2 started, not completed), as a
/// crash would, then times a fresh orchestrator's `recover()`.
async fn recovery<F, Fut>(open: F, count: usize) -> Duration
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Arc<dyn SagaLog>>,
{
    {
        let entered = Arc::new(AtomicUsize::new(0));
        let hanging = purchase(Some(entered.clone()));
        let o = Orchestrator::builder(open().await)
            .saga(&hanging)
            .build()
            .unwrap();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..count {
            let (o, saga) = (o.clone(), hanging.clone());
            tasks.spawn(async move {
                let _ = o
                    .start_with(
                        &saga,
                        Order {
                            id: i as u64,
                            cents: 1,
                        },
                        StartOptions::new(),
                    )
                    .await;
            });
        }
        while entered.load(Ordering::SeqCst) < count {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
    let saga = purchase(None);
    let log = open().await;
    let o = Orchestrator::builder(log)
        .saga(&saga)
        .recovery_concurrency(64)
        .build()
        .unwrap();
    let started = Instant::now();
    let mut recovered = 0;
    loop {
        let report = o.recover().await.expect("recover");
        assert!(report.failures.is_empty());
        recovered += report.outcomes.len();
        if recovered >= count {
            break;
        }
        // Postgres: the previous worker's leases have to expire first.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    let left = o
        .list(&ListQuery::status(SagaStatus::Running))
        .await
        .unwrap();
    assert!(left.is_empty());
    elapsed
}

fn postgres_url() -> (String, Option<std::process::Child>) {
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
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("pg_start output");
    (line.trim().to_owned(), Some(child))
}

async fn pg_log(url: &str, schema: &str, worker: &str, lease: Duration) -> PostgresLog {
    let mut options = PostgresOptions::new()
        .schema(schema)
        .worker_name(worker)
        .lease(lease);
    if let Ok(writers) = std::env::var("BENCH_PG_WRITERS") {
        options = options.writers(writers.parse().expect("BENCH_PG_WRITERS: a number"));
    }
    PostgresLog::connect(url, options)
        .await
        .expect("postgres log")
}

async fn drop_schema(url: &str, schema: &str) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .await
        .unwrap();
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let total = env_usize("BENCH_SAGAS", 3000);
    let concurrency = env_usize("BENCH_CONCURRENCY", 64);
    let recovery_count = env_usize("BENCH_RECOVERY", 10_000);
    let saga = purchase(None);
    let dir = tempfile::tempdir().expect("temp dir");
    println!(
        "three-step sagas, {total} per run, {concurrency} in flight, {} cpus",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );

    let sqlite_modes = if selected("sqlite") {
        &[(Synchronous::Full, "FULL"), (Synchronous::Normal, "NORMAL")][..]
    } else {
        &[]
    };
    for &(mode, label) in sqlite_modes {
        let path = dir.path().join(format!("bench-{label}.db"));
        let log = SqliteLog::open_with(&path, SqliteOptions::new().synchronous(mode)).unwrap();
        let o = Orchestrator::builder(log).saga(&saga).build().unwrap();
        let rate = throughput(std::slice::from_ref(&o), &saga, total, concurrency).await;
        println!("sqlite   synchronous={label:<6} 1 worker : {rate:>8.0} sagas/s");
        if mode == Synchronous::Full {
            let rate = throughput(std::slice::from_ref(&o), &saga, total / 10, 1).await;
            println!(
                "sqlite   synchronous=FULL   1 worker, one saga at a time: {rate:>8.0} sagas/s"
            );
        }
    }

    if selected("latency") {
        let step = Duration::from_millis(10);
        let (sequence, parallel) = (waiting(step, false), waiting(step, true));
        let path = dir.path().join("latency.db");
        let log = SqliteLog::open(&path).unwrap();
        let o = Orchestrator::builder(log)
            .saga(&sequence)
            .saga(&parallel)
            .build()
            .unwrap();
        let runs = env_usize("BENCH_LATENCY_RUNS", 100);
        for (saga, label) in [
            (&sequence, "in sequence  "),
            (&parallel, "one parallel group"),
        ] {
            let (p50, p99) = latency(&o, saga, runs).await;
            println!(
                "sqlite   3 steps of 10 ms, {label}: p50 {:.1} ms, p99 {:.1} ms ({runs} sagas, one at a time)",
                p50.as_secs_f64() * 1e3,
                p99.as_secs_f64() * 1e3
            );
        }
    }

    let (url, server) = if selected("postgres") || selected("recovery") {
        postgres_url()
    } else {
        (String::new(), None)
    };
    let postgres_workers = if selected("postgres") {
        &[1usize, 4][..]
    } else {
        &[]
    };
    for &workers in postgres_workers {
        let schema = format!("bench_{workers}w_{}", std::process::id());
        drop_schema(&url, &schema).await;
        let mut orchestrators = Vec::new();
        for w in 0..workers {
            let log = pg_log(
                &url,
                &schema,
                &format!("bench-{w}"),
                Duration::from_secs(30),
            )
            .await;
            orchestrators.push(Orchestrator::builder(log).saga(&saga).build().unwrap());
        }
        let rate = throughput(&orchestrators, &saga, total, concurrency).await;
        println!("postgres {workers} worker(s)           : {rate:>8.0} sagas/s");
        drop_schema(&url, &schema).await;
    }

    if !selected("recovery") {
        drop(server);
        return;
    }
    let path = dir.path().join("recovery.db");
    let elapsed = recovery(
        || {
            let path = path.clone();
            async move { Arc::new(SqliteLog::open(&path).unwrap()) as Arc<dyn SagaLog> }
        },
        recovery_count,
    )
    .await;
    println!(
        "sqlite   recovery of {recovery_count} unfinished sagas: {:.2} s ({:.0} sagas/s)",
        elapsed.as_secs_f64(),
        recovery_count as f64 / elapsed.as_secs_f64()
    );

    let schema = format!("bench_recovery_{}", std::process::id());
    drop_schema(&url, &schema).await;
    let lease = Duration::from_millis(500);
    let counter = Arc::new(AtomicUsize::new(0));
    let elapsed = recovery(
        || {
            let (url, schema, counter) = (url.clone(), schema.clone(), counter.clone());
            async move {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                Arc::new(pg_log(&url, &schema, &format!("recovery-{n}"), lease).await)
                    as Arc<dyn SagaLog>
            }
        },
        recovery_count,
    )
    .await;
    println!(
        "postgres recovery of {recovery_count} unfinished sagas: {:.2} s (includes waiting up to {} ms for the dead worker's leases)",
        elapsed.as_secs_f64(),
        lease.as_millis()
    );
    drop_schema(&url, &schema).await;
    drop(server);
}
