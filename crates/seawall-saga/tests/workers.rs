//! Serving workers: `Orchestrator::serve` claims submitted and abandoned
//! sagas, wakes on `NOTIFY` or a poll, limits its sagas in flight, and hands
//! its sagas back when it shuts down.
//!
//! In-process tests cover the polling fallback (no notification at all), the
//! notification path (no polling), the concurrency limit, the grace period
//! and the hand-back. The process test runs three workers (this test binary,
//! re-invoked on `worker_process_entry`), submits sagas from the parent,
//! SIGKILLs one worker mid-saga and shuts another down with sagas in flight,
//! then checks from an effects table and the log that every saga ended as
//! planned, that no step ran after its completion was logged, that the dead
//! worker's sagas were taken over after its lease expired, and that the
//! stopped worker's sagas were taken over without waiting for its (long) lease.

mod support;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, SystemTime};

use seawall_saga::{
    ListQuery, NewSaga, Orchestrator, PostgresLog, PostgresOptions, Saga, SagaId, SagaLog,
    SagaStatus, ServeOptions, ServeReport, SqliteLog, StartOptions, Step, StepContext, Transition,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, Notify};

/// Polls `done` every 20 ms, for at most `bound` (a failure bound, not a
/// timing assertion).
async fn wait_until<F, Fut>(bound: Duration, what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let rounds = bound.as_millis() / 20;
    for _ in 0..rounds {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what}: not done within {bound:?}");
}

async fn status_of(log: &dyn SagaLog, id: &str) -> Option<SagaStatus> {
    log.get(&SagaId::new(id)).await.unwrap().map(|r| r.status)
}

/// A saga of one step that counts its executions.
fn counting_saga(runs: Arc<AtomicUsize>) -> Saga<u32> {
    Saga::builder("counting")
        .step(Step::new("count", move |ctx: StepContext<u32>| {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(*ctx.input())
            }
        }))
        .build()
        .unwrap()
}

/// Logs a saga the way another process's `submit` would, but without
/// announcing it: only a poll can find it.
async fn create_unannounced(log: &dyn SagaLog, id: &str) {
    let new = NewSaga {
        id: SagaId::new(id),
        name: "counting".into(),
        input: "7".into(),
        deadline: None,
        created_at: SystemTime::now(),
    };
    log.create(&new, &[Transition::SagaStarted], false)
        .await
        .unwrap();
}

/// A worker on `log` polling every `poll`, stopped by the returned sender.
fn spawn_worker(
    o: &Orchestrator,
    options: ServeOptions,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<ServeReport>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let o = o.clone();
    let task = tokio::spawn(async move {
        o.serve(options, async move {
            let _ = stopped.await;
        })
        .await
        .unwrap()
    });
    (stop, task)
}

/// Without any notification, a worker's poll finds a saga logged after it
/// went idle. With no poll, the saga would never run (the test would fail at
/// its bound).
async fn polling_finds_unannounced_sagas(log: Arc<dyn SagaLog>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let saga = counting_saga(runs.clone());
    let o = Orchestrator::builder(log.clone())
        .saga(&saga)
        .build()
        .unwrap();
    let (stop, worker) = spawn_worker(
        &o,
        ServeOptions::new().poll_interval(Duration::from_millis(50)),
    );
    for id in ["polled-1", "polled-2"] {
        // The second one is logged while the worker is idle after the first.
        create_unannounced(log.as_ref(), id).await;
        wait_until(Duration::from_secs(20), id, || async {
            status_of(log.as_ref(), id).await == Some(SagaStatus::Completed)
        })
        .await;
    }
    stop.send(()).unwrap();
    let report = worker.await.unwrap();
    assert_eq!(report.completed, 2, "{report:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_worker_polls_for_work() {
    let dir = tempfile::tempdir().unwrap();
    let log: Arc<dyn SagaLog> = Arc::new(SqliteLog::open(dir.path().join("sagas.db")).unwrap());
    polling_finds_unannounced_sagas(log).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_worker_polls_when_nothing_is_announced() {
    let schema = support::schema_name("serve_poll");
    support::reset_schema(&schema).await;
    let log: Arc<dyn SagaLog> =
        Arc::new(support::pg_log(&schema, Duration::from_secs(30), "poller").await);
    polling_finds_unannounced_sagas(log).await;
    support::reset_schema(&schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_worker_wakes_on_notify_without_polling() {
    let schema = support::schema_name("serve_notify");
    support::reset_schema(&schema).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let saga = counting_saga(runs.clone());
    let lease = Duration::from_secs(30);
    let worker_log = support::pg_log(&schema, lease, "listener").await;
    let worker = Orchestrator::builder(worker_log.clone())
        .saga(&saga)
        .build()
        .unwrap();
    // Another process submits: only NOTIFY can tell the worker (it never polls).
    let submitter = Orchestrator::builder(support::pg_log(&schema, lease, "submitter").await)
        .saga(&saga)
        .build()
        .unwrap();
    let (stop, task) = spawn_worker(
        &worker,
        ServeOptions::new().poll_interval(Duration::from_secs(3600)),
    );
    for i in 0..3 {
        let id = submitter
            .submit(&saga, i, StartOptions::new().id(format!("notified-{i}")))
            .await
            .unwrap();
        wait_until(Duration::from_secs(20), id.as_str(), || async {
            status_of(&worker_log, id.as_str()).await == Some(SagaStatus::Completed)
        })
        .await;
    }
    stop.send(()).unwrap();
    assert_eq!(task.await.unwrap().completed, 3);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    support::reset_schema(&schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_drives_at_most_max_in_flight_sagas() {
    let dir = tempfile::tempdir().unwrap();
    let active = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let saga = {
        let (active, peak) = (active.clone(), peak.clone());
        Saga::<u32>::builder("limited")
            .step(Step::new("hold", move |_ctx: StepContext<u32>| {
                let (active, peak) = (active.clone(), peak.clone());
                async move {
                    let now = active.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    active.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, String>(())
                }
            }))
            .build()
            .unwrap()
    };
    let o = Orchestrator::builder(SqliteLog::open(dir.path().join("sagas.db")).unwrap())
        .saga(&saga)
        .build()
        .unwrap();
    for i in 0..10 {
        o.submit(&saga, i, StartOptions::new()).await.unwrap();
    }
    let (stop, task) = spawn_worker(
        &o,
        ServeOptions::new()
            .max_in_flight(3)
            .poll_interval(Duration::from_secs(3600)),
    );
    wait_until(Duration::from_secs(20), "all sagas", || async {
        o.list(&ListQuery::status(SagaStatus::Completed))
            .await
            .unwrap()
            .len()
            == 10
    })
    .await;
    stop.send(()).unwrap();
    assert_eq!(task.await.unwrap().completed, 10);
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= 3, "{peak} sagas in flight");
    assert!(peak >= 2, "sagas did not run concurrently ({peak})");
}

/// A saga whose only step waits for `gate` on its first execution.
fn gated_saga(gate: Arc<Notify>, started: Arc<Notify>, runs: Arc<AtomicUsize>) -> Saga<u32> {
    Saga::builder("gated")
        .step(Step::new("wait", move |_ctx: StepContext<u32>| {
            let (gate, started, runs) = (gate.clone(), started.clone(), runs.clone());
            async move {
                if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                    started.notify_one();
                    gate.notified().await;
                }
                Ok::<_, String>(())
            }
        }))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_sagas_finish_within_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let (gate, started) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let saga = gated_saga(gate.clone(), started.clone(), runs.clone());
    let o = Orchestrator::builder(SqliteLog::open(dir.path().join("sagas.db")).unwrap())
        .saga(&saga)
        .build()
        .unwrap();
    let (stop, task) = spawn_worker(&o, ServeOptions::new().grace(Duration::from_secs(60)));
    let id = o
        .submit(&saga, 1, StartOptions::new().id("graceful"))
        .await
        .unwrap();
    started.notified().await;
    stop.send(()).unwrap();
    // Shut down, the worker still lets the running step end.
    gate.notify_one();
    let report = task.await.unwrap();
    assert_eq!(report.completed, 1, "{report:?}");
    assert_eq!(report.handed_back, 0, "{report:?}");
    assert_eq!(
        o.get(&id).await.unwrap().unwrap().status,
        SagaStatus::Completed
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_hands_running_sagas_back_at_once() {
    let schema = support::schema_name("serve_handback");
    support::reset_schema(&schema).await;
    let (gate, started) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let saga = gated_saga(gate, started.clone(), runs.clone());
    // A lease far longer than the test: only a hand-back lets `other` in.
    let lease = Duration::from_secs(600);
    let leaving = Orchestrator::builder(support::pg_log(&schema, lease, "leaving").await)
        .saga(&saga)
        .build()
        .unwrap();
    let other = Orchestrator::builder(support::pg_log(&schema, lease, "other").await)
        .saga(&saga)
        .build()
        .unwrap();
    let (stop, task) = spawn_worker(&leaving, ServeOptions::new().grace(Duration::ZERO));
    let id = leaving
        .submit(&saga, 1, StartOptions::new().id("handed-back"))
        .await
        .unwrap();
    started.notified().await;
    // While `leaving` holds it, nobody else gets it.
    let before = other.recover().await.unwrap();
    assert!(before.outcomes.is_empty() && before.failures.is_empty());
    stop.send(()).unwrap();
    let report = task.await.unwrap();
    assert_eq!(report.handed_back, 1, "{report:?}");
    assert_eq!(report.completed, 0, "{report:?}");

    let after = other.recover().await.unwrap();
    assert!(after.failures.is_empty(), "{:?}", after.failures);
    assert_eq!(after.outcomes.len(), 1, "the saga was not handed back");
    assert_eq!(after.outcomes[0].status, SagaStatus::Completed);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the stopped step ran again");
    let owners: Vec<String> = other
        .history(&id)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|t| match t.transition {
            Transition::Claimed { owner } => Some(owner),
            _ => None,
        })
        .collect();
    assert_eq!(owners, ["leaving", "other"]);
    support::reset_schema(&schema).await;
}

// ------------------------------------------------------ worker processes

const ROLE_VAR: &str = "SEAWALL_SAGA_WORKER_ROLE";
const STEPS: usize = 3;
/// How long each step holds its saga in flight, on the worker that stays
/// (the others hold long, so they are surely mid-saga when killed or stopped).
const HOLD: Duration = Duration::from_millis(300);
const LONG_HOLD: Duration = Duration::from_secs(5);

#[derive(Serialize, Deserialize, Clone, Copy, Debug)]
struct Job {
    fail_at: Option<usize>,
}

#[derive(Clone)]
struct Effects(Arc<tokio_postgres::Client>, String);

impl Effects {
    async fn connect(schema: &str) -> Self {
        let client = support::pg_client().await;
        Effects(Arc::new(client), schema.to_owned())
    }

    async fn record(&self, key: &str, saga: &str, step: usize, phase: &str, saw: bool) {
        self.0
            .execute(
                &format!(
                    "INSERT INTO \"{}\".effects (key, saga_id, step, phase, saw_completed)
                     VALUES ($1, $2, $3, $4, $5)",
                    self.1
                ),
                &[&key, &saga, &(step as i64), &phase, &saw],
            )
            .await
            .unwrap();
    }
}

/// True when the log already holds the completion of this action or compensation.
async fn completion_logged(log: &dyn SagaLog, ctx: &StepContext<Job>, compensation: bool) -> bool {
    let history = log.history(ctx.saga_id()).await.unwrap();
    history.iter().any(|t| match &t.transition {
        Transition::StepCompleted { step, .. } => !compensation && step.index == ctx.step_index(),
        Transition::CompensationCompleted { step } => {
            compensation && step.index == ctx.step_index()
        }
        _ => false,
    })
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "\n{line}");
    let _ = out.flush();
}

/// Three steps; each records its effect, then holds for `hold`; the planned
/// step fails after its hold.
fn job_saga(log: Arc<dyn SagaLog>, effects: Effects, hold: Duration) -> Saga<Job> {
    let mut builder = Saga::builder("job");
    for index in 0..STEPS {
        let (log_a, effects_a) = (log.clone(), effects.clone());
        let (log_c, effects_c) = (log.clone(), effects.clone());
        builder = builder.step(
            Step::new(format!("step{index}"), move |ctx: StepContext<Job>| {
                let (log, effects) = (log_a.clone(), effects_a.clone());
                async move {
                    say(&format!("STARTED {} {index}", ctx.saga_id()));
                    if ctx.input().fail_at != Some(index) {
                        let saw = completion_logged(log.as_ref(), &ctx, false).await;
                        let key = ctx.idempotency_key().as_str();
                        effects
                            .record(key, ctx.saga_id().as_str(), index, "action", saw)
                            .await;
                    }
                    tokio::time::sleep(hold).await;
                    if ctx.input().fail_at == Some(index) {
                        return Err("planned failure".to_owned());
                    }
                    Ok(index)
                }
            })
            .compensate(move |ctx: StepContext<Job>, _output: usize| {
                let (log, effects) = (log_c.clone(), effects_c.clone());
                async move {
                    let saw = completion_logged(log.as_ref(), &ctx, true).await;
                    let key = ctx.idempotency_key().as_str();
                    effects
                        .record(key, ctx.saga_id().as_str(), index, "compensation", saw)
                        .await;
                    Ok::<_, String>(())
                }
            }),
        );
    }
    builder.build().unwrap()
}

async fn job_log(schema: &str, lease: Duration, name: &str) -> Arc<dyn SagaLog> {
    Arc::new(
        PostgresLog::connect(
            &support::postgres_url(),
            PostgresOptions::new()
                .schema(schema)
                .lease(lease)
                .worker_name(name),
        )
        .await
        .unwrap(),
    )
}

async fn job_orchestrator(
    log: Arc<dyn SagaLog>,
    schema: &str,
    hold: Duration,
) -> (Orchestrator, Saga<Job>) {
    let saga = job_saga(log.clone(), Effects::connect(schema).await, hold);
    let o = Orchestrator::builder(log).saga(&saga).build().unwrap();
    (o, saga)
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"))
}

/// Entry point of a worker process. Does nothing unless started by
/// `three_worker_processes_share_sagas_through_kill_and_shutdown`. Serves
/// until a line (or end of input) arrives on stdin, then prints its report.
#[test]
fn worker_process_entry() {
    if std::env::var_os(ROLE_VAR).is_none() {
        return;
    }
    let schema = env("WORKER_SCHEMA");
    let name = env("WORKER_NAME");
    let lease = Duration::from_millis(env("WORKER_LEASE_MS").parse().unwrap());
    let grace = Duration::from_millis(env("WORKER_GRACE_MS").parse().unwrap());
    let hold = Duration::from_millis(env("WORKER_HOLD_MS").parse().unwrap());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let log = job_log(&schema, lease, &name).await;
        let (o, _) = job_orchestrator(log, &schema, hold).await;
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
            let _ = stop.send(());
        });
        say("READY");
        let report = o
            .serve(
                ServeOptions::new()
                    .max_in_flight(3)
                    .poll_interval(Duration::from_millis(200))
                    .grace(grace),
                async move {
                    let _ = stopped.await;
                },
            )
            .await
            .unwrap();
        say(&format!(
            "REPORT {} {} {} {}",
            report.completed, report.compensated, report.failed, report.handed_back
        ));
    });
}

struct WorkerProcess {
    process: std::process::Child,
    lines: mpsc::Receiver<String>,
    stderr: std::path::PathBuf,
}

impl WorkerProcess {
    fn spawn(
        schema: &str,
        name: &str,
        lease: Duration,
        grace: Duration,
        hold: Duration,
        dir: &std::path::Path,
    ) -> Self {
        let stderr = dir.join(format!("{name}.stderr"));
        let mut process = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "worker_process_entry",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE_VAR, "serve")
            .env(support::POSTGRES_URL_VAR, support::postgres_url())
            .env("WORKER_SCHEMA", schema)
            .env("WORKER_NAME", name)
            .env("WORKER_LEASE_MS", lease.as_millis().to_string())
            .env("WORKER_GRACE_MS", grace.as_millis().to_string())
            .env("WORKER_HOLD_MS", hold.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let stdout = process.stdout.take().unwrap();
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let mut worker = WorkerProcess {
            process,
            lines,
            stderr,
        };
        worker.expect("READY");
        worker
    }

    /// Waits (at most a minute) for a line starting with `prefix`.
    fn expect(&mut self, prefix: &str) -> String {
        loop {
            match self.lines.recv_timeout(Duration::from_secs(60)) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(_) => {}
                Err(e) => {
                    let _ = self.process.kill();
                    panic!(
                        "worker never printed {prefix} ({e}); stderr:\n{}",
                        std::fs::read_to_string(&self.stderr).unwrap_or_default()
                    );
                }
            }
        }
    }

    /// Asks for a graceful shutdown and returns the report's numbers.
    fn shut_down(mut self) -> Vec<u64> {
        let mut stdin = self.process.stdin.take().unwrap();
        writeln!(stdin, "stop").unwrap();
        let report = self.expect("REPORT");
        let status = self.process.wait().unwrap();
        assert!(
            status.success(),
            "worker failed: {}",
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        );
        report
            .split_whitespace()
            .skip(1)
            .map(|n| n.parse().unwrap())
            .collect()
    }
}

/// The owners of a saga's claims, in order, with when each claim was logged,
/// and when the saga's last transition before each claim was logged.
fn claims(history: &[seawall_saga::TransitionRecord]) -> Vec<(String, SystemTime, SystemTime)> {
    let mut claims = Vec::new();
    for (i, t) in history.iter().enumerate() {
        if let Transition::Claimed { owner } = &t.transition {
            let previous = history[..i].last().map_or(t.at, |p| p.at);
            claims.push((owner.clone(), t.at, previous));
        }
    }
    claims
}

#[test]
fn three_worker_processes_share_sagas_through_kill_and_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let schema = support::schema_name("serve_processes");
    let total = 12usize;
    // The worker that dies has a short lease; the one that shuts down has a
    // lease far longer than the test, so only its hand-back lets others in.
    let short = Duration::from_millis(1000);
    let long = Duration::from_secs(600);
    let (parent, saga) = runtime.block_on(async {
        support::reset_schema(&schema).await;
        let log = job_log(&schema, long, "parent").await;
        support::pg_client()
            .await
            .batch_execute(&format!(
                "CREATE TABLE \"{schema}\".effects (
                   id bigserial PRIMARY KEY, key text NOT NULL, saga_id text NOT NULL,
                   step int8 NOT NULL, phase text NOT NULL, saw_completed bool NOT NULL)"
            ))
            .await
            .unwrap();
        job_orchestrator(log, &schema, HOLD).await
    });
    let spawn = |name, lease, grace, hold| {
        WorkerProcess::spawn(&schema, name, lease, grace, hold, dir.path())
    };
    let mut doomed = spawn("doomed", short, Duration::ZERO, LONG_HOLD);
    let mut leaving = spawn("leaving", long, Duration::ZERO, LONG_HOLD);
    let staying = spawn("staying", long, Duration::from_secs(30), HOLD);
    let plans: Vec<Job> = (0..total)
        .map(|i| Job {
            fail_at: (i % 3 == 2).then_some(i % STEPS),
        })
        .collect();
    runtime.block_on(async {
        for (i, job) in plans.iter().enumerate() {
            parent
                .submit(&saga, *job, StartOptions::new().id(format!("job-{i:02}")))
                .await
                .unwrap();
        }
    });
    // Killed in the middle of a step, its lease still live.
    doomed.expect("STARTED");
    doomed.process.kill().unwrap();
    doomed.process.wait().unwrap();
    // Shut down with a step under way and no grace period.
    leaving.expect("STARTED");
    let leaving_report = leaving.shut_down();
    assert!(
        leaving_report[3] >= 1,
        "nothing was handed back: {leaving_report:?}"
    );

    runtime.block_on(async {
        let log = parent.log().clone();
        wait_until(Duration::from_secs(45), "every saga ended", || async {
            let running = log.list(&ListQuery::status(SagaStatus::Running)).await;
            let compensating = log.list(&ListQuery::status(SagaStatus::Compensating)).await;
            running.unwrap().is_empty() && compensating.unwrap().is_empty()
        })
        .await;
    });
    let staying_report = staying.shut_down();
    assert_eq!(staying_report[2], 0, "{staying_report:?}");

    runtime.block_on(async {
        let log = parent.log().clone();
        let client = support::pg_client().await;
        let rows = client
            .query(
                &format!(
                    "SELECT key, saga_id, step, phase, saw_completed FROM \"{schema}\".effects"
                ),
                &[],
            )
            .await
            .unwrap();
        let stale: Vec<String> = rows
            .iter()
            .filter(|r| r.get::<_, bool>(4))
            .map(|r| r.get(0))
            .collect();
        assert!(stale.is_empty(), "ran after their completion was logged: {stale:?}");
        let effects: HashSet<(String, i64, String)> = rows
            .iter()
            .map(|r| (r.get(1), r.get(2), r.get(3)))
            .collect();

        let mut taken_from: HashMap<String, usize> = HashMap::new();
        for (i, job) in plans.iter().enumerate() {
            let id = SagaId::new(format!("job-{i:02}"));
            let record = log.get(&id).await.unwrap().unwrap();
            let history = log.history(&id).await.unwrap();
            let expected = match job.fail_at {
                None => SagaStatus::Completed,
                Some(_) => SagaStatus::Compensated,
            };
            assert_eq!(record.status, expected, "{id}: {history:#?}");
            for step in 0..STEPS {
                let done = job.fail_at.is_none_or(|f| step < f);
                let completions = history
                    .iter()
                    .filter(|t| matches!(&t.transition, Transition::StepCompleted { step: s, .. } if s.index == step))
                    .count();
                let compensations = history
                    .iter()
                    .filter(|t| matches!(&t.transition, Transition::CompensationCompleted { step: s } if s.index == step))
                    .count();
                assert_eq!(completions, usize::from(done), "{id} step {step}: {history:#?}");
                let compensated = done && job.fail_at.is_some();
                assert_eq!(compensations, usize::from(compensated), "{id} step {step}");
                let effect = |phase: &str| {
                    effects.contains(&(id.as_str().to_owned(), step as i64, phase.to_owned()))
                };
                assert_eq!(effect("action"), done, "{id} step {step}");
                assert_eq!(effect("compensation"), compensated, "{id} step {step}");
            }
            let claims = claims(&history);
            for pair in claims.windows(2) {
                let ((from, _, _), (to, at, previous)) = (&pair[0], &pair[1]);
                assert_ne!(from, to, "{id}: {claims:?}");
                *taken_from.entry(from.clone()).or_default() += 1;
                let waited = at.duration_since(*previous).unwrap_or_default();
                match from.as_str() {
                    // Taken over only once the dead worker's lease expired.
                    "doomed" => assert!(
                        waited + Duration::from_millis(5) >= short,
                        "{id} taken from the dead worker after {waited:?}: {history:#?}"
                    ),
                    // Handed back: taken long before its lease would expire.
                    "leaving" => assert!(waited < long, "{id}: {waited:?}"),
                    other => panic!("{id} taken from a live worker {other}: {history:#?}"),
                }
            }
        }
        eprintln!(
            "taken over from: {taken_from:?}; leaving {leaving_report:?}, staying {staying_report:?}"
        );
        assert!(taken_from.get("doomed").is_some_and(|&n| n >= 1), "{taken_from:?}");
        assert!(taken_from.get("leaving").is_some_and(|&n| n >= 1), "{taken_from:?}");
        support::reset_schema(&schema).await;
    });
}
