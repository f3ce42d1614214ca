//! Crash recovery under SIGKILL, proven by an effects table.
//!
//! A child process (this test binary, re-invoked on `child_process_entry`) runs
//! sagas whose steps record every execution in an `effects` table in the same
//! database as the log, keyed by idempotency key. The parent kills it with
//! SIGKILL at seeded random points: either at a numbered checkpoint inside the
//! steps (before an effect, after an effect but before the orchestrator logged
//! it, inside compensations, during recovery) or after a random delay (anywhere,
//! including in the middle of a log commit). Half the sagas have three steps in
//! sequence; the other half run two of their four steps as a parallel group
//! (compensated concurrently), so kills also land inside a group: one of its
//! steps done, failed or under way while the other runs. Each new child first recovers what
//! the dead one left, then starts a few more sagas. At the end the parent
//! recovers the rest and checks, from the effects table and the log:
//!
//! - every saga is completed or compensated;
//! - no action or compensation ran after its completion was logged (each
//!   execution looks at the log first and records what it saw);
//! - every completed step of a compensated saga was compensated, in effect
//!   exactly once when deduplicated by key, stages in reverse order, and no
//!   compensation ran for a step that did not complete; in a group where one
//!   step failed, the other one completed (it was awaited) and was compensated.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::Duration;

use seawall_saga::{
    ListQuery, Orchestrator, Parallel, PostgresLog, PostgresOptions, Saga, SagaLog, SagaStatus,
    SqliteLog, StartOptions, Step, StepContext, Transition,
};
use serde::{Deserialize, Serialize};
use support::Rng;

const CHILD_VAR: &str = "SEAWALL_SAGA_CRASH_CHILD";
/// The sagas: their names and stages (step indices run together).
const SHAPES: [(&str, &[&[usize]]); 2] = [
    ("crash", &[&[0], &[1], &[2]]),
    ("crash-group", &[&[0], &[1, 2], &[3]]),
];

/// The shape of saga `index` of a run: sequential and grouped alternate.
fn shape_of(index: u64) -> (&'static str, &'static [&'static [usize]]) {
    SHAPES[(index % 2) as usize]
}

fn shape_named(name: &str) -> &'static [&'static [usize]] {
    SHAPES.iter().find(|(n, _)| *n == name).unwrap().1
}

fn steps_of(shape: &[&[usize]]) -> usize {
    shape.iter().map(|stage| stage.len()).sum()
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug)]
struct CrashInput {
    fail_at: Option<usize>,
    flaky_compensation: bool,
}

impl CrashInput {
    /// A deterministic mix of outcomes for a saga of `steps` steps: one in
    /// `steps + 1` succeeds, the others fail at one of the steps; a third have
    /// compensations that fail once before succeeding.
    fn plan(run: u64, index: u64, steps: usize) -> Self {
        let pick = ((run * 7 + index * 3) % (steps as u64 + 1)) as usize;
        CrashInput {
            fail_at: if pick == steps { None } else { Some(pick) },
            flaky_compensation: (run + index).is_multiple_of(3),
        }
    }
}

/// Where the log and the effects table live.
#[derive(Clone, Debug)]
enum Target {
    Sqlite(PathBuf),
    Postgres {
        url: String,
        schema: String,
        lease: Duration,
    },
}

// ---------------------------------------------------------------- checkpoints

static CHECKPOINTS: AtomicU64 = AtomicU64::new(0);

fn crash_at() -> u64 {
    static AT: OnceLock<u64> = OnceLock::new();
    *AT.get_or_init(|| {
        std::env::var("CRASH_AT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    })
}

/// In the child: at checkpoint number `CRASH_AT`, tell the parent and wait to be killed.
fn checkpoint() {
    let at = crash_at();
    if at == 0 {
        return;
    }
    let n = CHECKPOINTS.fetch_add(1, Ordering::SeqCst) + 1;
    if n == at {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "\nCHECKPOINT {n}");
        let _ = out.flush();
        loop {
            std::thread::sleep(Duration::from_secs(60));
        }
    }
}

// -------------------------------------------------------------------- effects

#[derive(Debug, Clone)]
struct EffectRow {
    id: i64,
    key: String,
    saga_id: String,
    step: usize,
    phase: String,
    failed: bool,
    saw_completed: bool,
}

#[derive(Clone)]
enum Effects {
    Sqlite(Arc<Mutex<rusqlite::Connection>>),
    Postgres(Arc<tokio_postgres::Client>, String),
}

impl Effects {
    async fn connect(target: &Target) -> Self {
        match target {
            Target::Sqlite(path) => {
                let conn = rusqlite::Connection::open(path).unwrap();
                conn.busy_timeout(Duration::from_secs(30)).unwrap();
                Effects::Sqlite(Arc::new(Mutex::new(conn)))
            }
            Target::Postgres { url, schema, .. } => {
                let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                Effects::Postgres(Arc::new(client), schema.clone())
            }
        }
    }

    async fn create_table(&self) {
        match self {
            Effects::Sqlite(conn) => conn
                .lock()
                .unwrap()
                .execute_batch(
                    "CREATE TABLE effects (
                       id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, saga_id TEXT NOT NULL,
                       step INTEGER NOT NULL, phase TEXT NOT NULL, failed INTEGER NOT NULL,
                       saw_completed INTEGER NOT NULL)",
                )
                .unwrap(),
            Effects::Postgres(client, schema) => client
                .batch_execute(&format!(
                    "CREATE TABLE \"{schema}\".effects (
                       id bigserial PRIMARY KEY, key text NOT NULL, saga_id text NOT NULL,
                       step int8 NOT NULL, phase text NOT NULL, failed bool NOT NULL,
                       saw_completed bool NOT NULL)"
                ))
                .await
                .unwrap(),
        }
    }

    async fn record(
        &self,
        ctx_key: &str,
        saga_id: &str,
        step: usize,
        phase: &str,
        failed: bool,
        saw: bool,
    ) {
        match self {
            Effects::Sqlite(conn) => {
                conn.lock()
                    .unwrap()
                    .execute(
                        "INSERT INTO effects (key, saga_id, step, phase, failed, saw_completed)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                        rusqlite::params![ctx_key, saga_id, step as i64, phase, failed, saw],
                    )
                    .unwrap();
            }
            Effects::Postgres(client, schema) => {
                client
                    .execute(
                        &format!(
                            "INSERT INTO \"{schema}\".effects (key, saga_id, step, phase, failed, saw_completed)
                             VALUES ($1, $2, $3, $4, $5, $6)"
                        ),
                        &[&ctx_key, &saga_id, &(step as i64), &phase, &failed, &saw],
                    )
                    .await
                    .unwrap();
            }
        }
    }

    async fn failures_of(&self, key: &str) -> i64 {
        match self {
            Effects::Sqlite(conn) => conn
                .lock()
                .unwrap()
                .query_row(
                    "SELECT count(*) FROM effects WHERE key = ?1 AND failed",
                    [key],
                    |r| r.get(0),
                )
                .unwrap(),
            Effects::Postgres(client, schema) => client
                .query_one(
                    &format!("SELECT count(*) FROM \"{schema}\".effects WHERE key = $1 AND failed"),
                    &[&key],
                )
                .await
                .unwrap()
                .get(0),
        }
    }

    async fn all(&self) -> Vec<EffectRow> {
        match self {
            Effects::Sqlite(conn) => {
                let conn = conn.lock().unwrap();
                let mut stmt = conn
                    .prepare(
                        "SELECT id, key, saga_id, step, phase, failed, saw_completed FROM effects ORDER BY id",
                    )
                    .unwrap();
                stmt.query_map([], |r| {
                    Ok(EffectRow {
                        id: r.get(0)?,
                        key: r.get(1)?,
                        saga_id: r.get(2)?,
                        step: r.get::<_, i64>(3)? as usize,
                        phase: r.get(4)?,
                        failed: r.get(5)?,
                        saw_completed: r.get(6)?,
                    })
                })
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
            }
            Effects::Postgres(client, schema) => client
                .query(
                    &format!(
                        "SELECT id, key, saga_id, step, phase, failed, saw_completed
                         FROM \"{schema}\".effects ORDER BY id"
                    ),
                    &[],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| EffectRow {
                    id: r.get(0),
                    key: r.get(1),
                    saga_id: r.get(2),
                    step: r.get::<_, i64>(3) as usize,
                    phase: r.get(4),
                    failed: r.get(5),
                    saw_completed: r.get(6),
                })
                .collect(),
        }
    }
}

// ---------------------------------------------------------------- the saga

/// True when the log already holds the completion of this action or compensation.
async fn completion_logged(
    log: &Arc<dyn SagaLog>,
    ctx: &StepContext<CrashInput>,
    compensation: bool,
) -> bool {
    let history = log.history(ctx.saga_id()).await.unwrap();
    history.iter().any(|t| match &t.transition {
        Transition::StepCompleted { step, .. } => !compensation && step.index == ctx.step_index(),
        Transition::CompensationCompleted { step } => {
            compensation && step.index == ctx.step_index()
        }
        _ => false,
    })
}

fn crash_saga(
    log: Arc<dyn SagaLog>,
    effects: Effects,
    name: &str,
    shape: &[&[usize]],
) -> Saga<CrashInput> {
    let mut steps = Vec::new();
    for index in 0..steps_of(shape) {
        let (log_a, effects_a) = (log.clone(), effects.clone());
        let (log_c, effects_c) = (log.clone(), effects.clone());
        let step = Step::new(
            format!("step{index}"),
            move |ctx: StepContext<CrashInput>| {
                let (log, effects) = (log_a.clone(), effects_a.clone());
                async move {
                    checkpoint();
                    if ctx.input().fail_at == Some(index) {
                        return Err("planned failure".to_owned());
                    }
                    let saw = completion_logged(&log, &ctx, false).await;
                    effects
                        .record(
                            ctx.idempotency_key().as_str(),
                            ctx.saga_id().as_str(),
                            index,
                            "action",
                            false,
                            saw,
                        )
                        .await;
                    checkpoint();
                    Ok(format!("out-{index}"))
                }
            },
        )
        .compensate(move |ctx: StepContext<CrashInput>, output: String| {
            let (log, effects) = (log_c.clone(), effects_c.clone());
            async move {
                checkpoint();
                if output != format!("out-{index}") {
                    return Err(format!("compensation got the wrong output {output:?}"));
                }
                let key = ctx.idempotency_key().as_str().to_owned();
                let saw = completion_logged(&log, &ctx, true).await;
                if ctx.input().flaky_compensation && effects.failures_of(&key).await == 0 {
                    effects
                        .record(
                            &key,
                            ctx.saga_id().as_str(),
                            index,
                            "compensation",
                            true,
                            saw,
                        )
                        .await;
                    return Err("flaky compensation".to_owned());
                }
                effects
                    .record(
                        &key,
                        ctx.saga_id().as_str(),
                        index,
                        "compensation",
                        false,
                        saw,
                    )
                    .await;
                checkpoint();
                Ok(())
            }
        });
        steps.push(Some(step));
    }
    let mut builder = Saga::builder(name);
    for stage in shape {
        builder = match stage {
            [single] => builder.step(steps[*single].take().unwrap()),
            group => builder.parallel(
                group
                    .iter()
                    .fold(Parallel::new(), |g, &i| g.step(steps[i].take().unwrap())),
            ),
        };
    }
    builder.build().unwrap()
}

async fn open_log(target: &Target, worker: &str) -> Arc<dyn SagaLog> {
    match target {
        Target::Sqlite(path) => Arc::new(SqliteLog::open(path).unwrap()),
        Target::Postgres { url, schema, lease } => Arc::new(
            PostgresLog::connect(
                url,
                PostgresOptions::new()
                    .schema(schema)
                    .lease(*lease)
                    .worker_name(worker),
            )
            .await
            .unwrap(),
        ),
    }
}

fn crash_orchestrator(
    log: Arc<dyn SagaLog>,
    effects: Effects,
) -> (Orchestrator, Vec<Saga<CrashInput>>) {
    let sagas: Vec<_> = SHAPES
        .iter()
        .map(|(name, shape)| crash_saga(log.clone(), effects.clone(), name, shape))
        .collect();
    let o = Orchestrator::builder(log)
        .saga(&sagas[0])
        .saga(&sagas[1])
        // Every attempt is logged before it runs, so a kill during a
        // compensation uses one of its attempts: room for the kills that may
        // land on one saga in a row, and for the flaky compensation's failure.
        .compensation_retry(seawall::Retry::constant(Duration::from_millis(1)).max_attempts(20))
        .recovery_concurrency(8)
        .build()
        .unwrap();
    (o, sagas)
}

async fn recover_until_idle(o: &Orchestrator, pause: Duration) {
    for _ in 0..2000 {
        let report = o.recover().await.unwrap();
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        let running = o
            .list(&ListQuery::status(SagaStatus::Running))
            .await
            .unwrap();
        let compensating = o
            .list(&ListQuery::status(SagaStatus::Compensating))
            .await
            .unwrap();
        if running.is_empty() && compensating.is_empty() {
            return;
        }
        tokio::time::sleep(pause).await;
    }
    panic!("sagas still unfinished after many recovery passes");
}

// ---------------------------------------------------------------- the child

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"))
}

/// Entry point of the child process. Does nothing unless started by a crash
/// test (with `SEAWALL_SAGA_CRASH_CHILD` set).
#[test]
fn child_process_entry() {
    if std::env::var_os(CHILD_VAR).is_none() {
        return;
    }
    let target = match env("CRASH_BACKEND").as_str() {
        "sqlite" => Target::Sqlite(PathBuf::from(env("CRASH_TARGET"))),
        _ => Target::Postgres {
            url: env(support::POSTGRES_URL_VAR),
            schema: env("CRASH_TARGET"),
            lease: Duration::from_millis(env("CRASH_LEASE_MS").parse().unwrap()),
        },
    };
    let run: u64 = env("CRASH_RUN").parse().unwrap();
    let sagas: u64 = env("CRASH_SAGAS").parse().unwrap();
    let all_succeed = std::env::var("CRASH_PLAN").as_deref() == Ok("succeed");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let log = open_log(&target, &format!("child-{run}")).await;
        let effects = Effects::connect(&target).await;
        let (o, definitions) = crash_orchestrator(log, effects);
        let pause = match &target {
            Target::Postgres { lease, .. } => *lease / 4,
            Target::Sqlite(_) => Duration::from_millis(5),
        };
        recover_until_idle(&o, pause).await;
        let mut tasks = Vec::new();
        for index in 0..sagas {
            let input = if all_succeed {
                CrashInput {
                    fail_at: None,
                    flaky_compensation: false,
                }
            } else {
                CrashInput::plan(run, index, steps_of(shape_of(index).1))
            };
            let (o, saga) = (o.clone(), definitions[(index % 2) as usize].clone());
            tasks.push(tokio::spawn(async move {
                o.start_with(
                    &saga,
                    input,
                    StartOptions::new().id(format!("r{run:04}-s{index}")),
                )
                .await
            }));
        }
        for task in tasks {
            let outcome = task.await.unwrap().unwrap();
            assert!(outcome.status.is_finished(), "{outcome:?}");
        }
    });
    println!("CHILD-DONE");
}

// ---------------------------------------------------------------- the parent

struct Child {
    process: std::process::Child,
    lines: mpsc::Receiver<String>,
    stderr: PathBuf,
}

fn spawn_child(
    target: &Target,
    run: u64,
    sagas: u64,
    crash_at: u64,
    dir: &Path,
    extra: &[(&str, &str)],
) -> Child {
    let exe = std::env::current_exe().unwrap();
    let stderr = dir.join(format!("child-{run}.stderr"));
    let mut command = Command::new(exe);
    command
        .args([
            "--exact",
            "child_process_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_VAR, "1")
        .env("CRASH_RUN", run.to_string())
        .env("CRASH_SAGAS", sagas.to_string())
        .env("CRASH_AT", crash_at.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr).unwrap());
    match target {
        Target::Sqlite(path) => {
            command
                .env("CRASH_BACKEND", "sqlite")
                .env("CRASH_TARGET", path);
        }
        Target::Postgres { url, schema, lease } => {
            command
                .env("CRASH_BACKEND", "postgres")
                .env("CRASH_TARGET", schema)
                .env(support::POSTGRES_URL_VAR, url)
                .env("CRASH_LEASE_MS", lease.as_millis().to_string());
        }
    }
    for (k, v) in extra {
        command.env(k, v);
    }
    let mut process = command.spawn().unwrap();
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
    Child {
        process,
        lines,
        stderr,
    }
}

impl Child {
    /// Waits for a checkpoint line (then kills) or the end of the run.
    fn kill_at_checkpoint(&mut self) -> bool {
        loop {
            match self.lines.recv_timeout(Duration::from_secs(120)) {
                Ok(line) if line.contains("CHECKPOINT") => {
                    self.process.kill().unwrap();
                    return true;
                }
                Ok(_) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => return false,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = self.process.kill();
                    panic!("crash child hung; stderr in {}", self.stderr.display());
                }
            }
        }
    }

    fn finish(mut self, killed: bool) {
        let status = self.process.wait().unwrap();
        if !killed {
            assert!(
                status.success(),
                "crash child failed ({status}):\n{}",
                std::fs::read_to_string(&self.stderr).unwrap_or_default()
            );
        }
    }
}

#[derive(Debug, Default)]
struct Stats {
    kills: u64,
    runs: u64,
    sagas: usize,
    completed: usize,
    compensated: usize,
    repeated_actions: usize,
    repeated_compensations: usize,
    grouped: usize,
    recovered_inside_group: usize,
}

/// Runs children, killing them at seeded random points, until `kills` kills.
fn kill_children(target: &Target, seed: u64, kills: u64, dir: &Path) -> Stats {
    let mut rng = Rng::new(seed);
    let mut stats = Stats::default();
    while stats.kills < kills {
        assert!(stats.runs < kills * 4, "too few kills landed: {stats:?}");
        let run = stats.runs;
        stats.runs += 1;
        let by_time = rng.below(3) == 0;
        let crash_at = if by_time { 0 } else { 1 + rng.below(44) };
        let delay = Duration::from_millis(5 + rng.below(120));
        let mut child = spawn_child(target, run, 4, crash_at, dir, &[]);
        let killed = if by_time {
            std::thread::sleep(delay);
            match child.process.try_wait().unwrap() {
                None => {
                    child.process.kill().unwrap();
                    true
                }
                Some(_) => false,
            }
        } else {
            child.kill_at_checkpoint()
        };
        child.finish(killed);
        if killed {
            stats.kills += 1;
        }
    }
    stats
}

/// Finishes what the last child left and checks every saga against the effects.
async fn verify(target: &Target, stats: &mut Stats) {
    let log = open_log(target, "verifier").await;
    let effects = Effects::connect(target).await;
    let (o, _) = crash_orchestrator(log.clone(), effects.clone());
    let pause = match target {
        Target::Postgres { lease, .. } => *lease / 4,
        Target::Sqlite(_) => Duration::from_millis(5),
    };
    recover_until_idle(&o, pause).await;

    let rows = effects.all().await;
    let stale: Vec<_> = rows.iter().filter(|r| r.saw_completed).collect();
    assert!(
        stale.is_empty(),
        "effects ran after their completion was logged: {stale:?}"
    );
    let mut by_saga: HashMap<&str, Vec<&EffectRow>> = HashMap::new();
    for row in &rows {
        by_saga.entry(row.saga_id.as_str()).or_default().push(row);
    }

    let sagas = o.list(&ListQuery::all().limit(100_000)).await.unwrap();
    stats.sagas = sagas.len();
    for saga in &sagas {
        let input: CrashInput = serde_json::from_str(&saga.input).unwrap();
        let history = log.history(&saga.id).await.unwrap();
        let context = || format!("saga {} ({input:?}), history {history:#?}", saga.id);
        let shape = shape_named(&saga.name);
        let steps = steps_of(shape);
        let stage_of = |k: usize| shape.iter().position(|stage| stage.contains(&k)).unwrap();
        let mut completions = vec![0usize; steps];
        let mut compensations = vec![0usize; steps];
        for t in &history {
            match &t.transition {
                Transition::StepCompleted { step, .. } => completions[step.index] += 1,
                Transition::CompensationCompleted { step } => compensations[step.index] += 1,
                _ => {}
            }
        }
        let effects = by_saga.remove(saga.id.as_str()).unwrap_or_default();
        let actions = |k: usize| {
            effects
                .iter()
                .filter(|r| r.phase == "action" && r.step == k)
                .collect::<Vec<_>>()
        };
        let undo = |k: usize| {
            effects
                .iter()
                .filter(|r| r.phase == "compensation" && r.step == k)
                .collect::<Vec<_>>()
        };
        for row in &effects {
            let phase = if row.phase == "action" {
                "action"
            } else {
                "compensation"
            };
            assert_eq!(
                row.key,
                format!("{}/{}/step{}/{phase}", saga.id, row.step, row.step),
                "{}",
                context()
            );
        }
        // The steps that completed: those of the stages before the failing
        // step's, and the others of its own stage (awaited, not cancelled).
        let done: Vec<bool> = (0..steps)
            .map(|k| match input.fail_at {
                None => true,
                Some(f) => stage_of(k) < stage_of(f) || (stage_of(k) == stage_of(f) && k != f),
            })
            .collect();
        let expected = if input.fail_at.is_some() {
            SagaStatus::Compensated
        } else {
            SagaStatus::Completed
        };
        assert_eq!(saga.status, expected, "{}", context());
        for k in 0..steps {
            let ran = actions(k);
            let undone = undo(k);
            if done[k] {
                assert_eq!(
                    completions[k],
                    1,
                    "step {k} completion logged once: {}",
                    context()
                );
                assert!(!ran.is_empty(), "step {k} never took effect: {}", context());
                stats.repeated_actions += ran.len() - 1;
            } else {
                assert_eq!(completions[k], 0, "{}", context());
                assert!(
                    ran.is_empty(),
                    "step {k} ran although it should not: {}",
                    context()
                );
            }
            if input.fail_at.is_some() && done[k] {
                let succeeded: Vec<_> = undone.iter().filter(|r| !r.failed).collect();
                assert!(
                    !succeeded.is_empty(),
                    "step {k} not compensated: {}",
                    context()
                );
                stats.repeated_compensations += succeeded.len() - 1;
                assert_eq!(compensations[k], 1, "{}", context());
                // The compensation came after every execution of its action.
                let last_action = ran.iter().map(|r| r.id).max().unwrap();
                assert!(undone.iter().all(|r| r.id > last_action), "{}", context());
            } else {
                assert!(
                    undone.is_empty(),
                    "step {k} compensated although it should not: {}",
                    context()
                );
                assert_eq!(compensations[k], 0, "{}", context());
            }
        }
        // Stages in reverse order: every execution of a compensation of a
        // later stage precedes every execution of one of an earlier stage.
        if input.fail_at.is_some() {
            for later in (0..steps).filter(|&k| done[k]) {
                for earlier in (0..steps).filter(|&k| done[k] && stage_of(k) < stage_of(later)) {
                    let later_max = undo(later).iter().map(|r| r.id).max().unwrap();
                    let earlier_min = undo(earlier).iter().map(|r| r.id).min().unwrap();
                    assert!(
                        later_max < earlier_min,
                        "compensations out of order: {}",
                        context()
                    );
                }
            }
        }
        if shape.iter().any(|stage| stage.len() > 1) {
            stats.grouped += 1;
            // Was the saga recovered with a step of its group under way?
            let mut under_way = vec![false; steps];
            let mut inside = false;
            for t in &history {
                match &t.transition {
                    Transition::StepStarted { step } => under_way[step.index] = true,
                    Transition::StepCompleted { step, .. }
                    | Transition::StepFailed { step, .. } => under_way[step.index] = false,
                    Transition::Claimed { .. } => {
                        inside |= (0..steps).any(|k| under_way[k] && shape[stage_of(k)].len() > 1)
                    }
                    _ => {}
                }
            }
            stats.recovered_inside_group += usize::from(inside);
        }
        match saga.status {
            SagaStatus::Completed => stats.completed += 1,
            _ => stats.compensated += 1,
        }
    }
    assert!(
        by_saga.is_empty(),
        "effects of sagas missing from the log: {:?}",
        by_saga.keys()
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn sqlite_sagas_survive_sigkill_at_random_points() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.db");
    let target = Target::Sqlite(path.clone());
    let rt = runtime();
    rt.block_on(async {
        drop(SqliteLog::open(&path).unwrap());
        Effects::connect(&target).await.create_table().await;
    });
    let mut stats = kill_children(&target, 0x5EA_3A11, 60, dir.path());
    rt.block_on(verify(&target, &mut stats));
    eprintln!("sqlite crash suite: {stats:?}");
    assert!(stats.kills >= 60);
    assert!(stats.grouped > 0, "{stats:?}");
    assert!(stats.recovered_inside_group > 0, "{stats:?}");
    assert!(stats.sagas >= 60, "{stats:?}");
    assert!(stats.completed > 0 && stats.compensated > 0, "{stats:?}");
}

async fn postgres_target(test: &str, lease: Duration) -> Target {
    let schema = support::schema_name(test);
    support::reset_schema(&schema).await;
    let target = Target::Postgres {
        url: support::postgres_url(),
        schema,
        lease,
    };
    drop(open_log(&target, "setup").await);
    Effects::connect(&target).await.create_table().await;
    target
}

#[test]
fn postgres_sagas_survive_sigkill_at_random_points() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    // Short leases (real database clock) so each restart takes over quickly.
    let target = rt.block_on(postgres_target("crash_pg", Duration::from_millis(300)));
    let mut stats = kill_children(&target, 0xC0FFEE, 50, dir.path());
    rt.block_on(verify(&target, &mut stats));
    eprintln!("postgres crash suite: {stats:?}");
    assert!(stats.kills >= 50);
    assert!(stats.grouped > 0, "{stats:?}");
    assert!(stats.recovered_inside_group > 0, "{stats:?}");
    assert!(stats.sagas >= 50, "{stats:?}");
    assert!(stats.completed > 0 && stats.compensated > 0, "{stats:?}");
    if let Target::Postgres { schema, .. } = &target {
        rt.block_on(support::reset_schema(schema));
    }
}

#[test]
fn postgres_killed_worker_is_taken_over_after_its_lease_expires() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let lease = Duration::from_secs(3);
    let target = rt.block_on(postgres_target("takeover", lease));
    let Target::Postgres { schema, .. } = &target else {
        unreachable!()
    };

    // The child completes step0 and is killed when step1 starts (checkpoint 3:
    // step0 start, step0 end, step1 start), holding the saga's lease.
    let mut child = spawn_child(&target, 0, 1, 3, dir.path(), &[("CRASH_PLAN", "succeed")]);
    assert!(
        child.kill_at_checkpoint(),
        "child finished without reaching step 1"
    );
    child.finish(true);

    rt.block_on(async {
        let client = support::pg_client().await;
        let row = client
            .query_one(
                &format!(
                    "SELECT (extract(epoch FROM lease_expires_at) * 1000)::int8, lease_owner
                     FROM \"{schema}\".sagas WHERE id = 'r0000-s0'"
                ),
                &[],
            )
            .await
            .unwrap();
        let expires_ms: i64 = row.get(0);
        let owner: String = row.get(1);
        assert_eq!(owner, "child-0");
        let db_now = || async {
            client
                .query_one(
                    "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8",
                    &[],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
        };

        let log = open_log(&target, "taker").await;
        let effects = Effects::connect(&target).await;
        let (o, _) = crash_orchestrator(log.clone(), effects.clone());
        let mut refused_before_expiry = 0;
        let outcome = loop {
            let report = o.recover().await.unwrap();
            let after = db_now().await;
            if let Some(outcome) = report.outcomes.into_iter().next() {
                // Taken over, and not before the dead worker's lease expired.
                assert!(
                    after >= expires_ms,
                    "claimed at or before {after} < expiry {expires_ms}"
                );
                break outcome;
            }
            if after < expires_ms {
                refused_before_expiry += 1;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            refused_before_expiry >= 1,
            "no attempt was made while the lease was live"
        );
        assert_eq!(outcome.status, SagaStatus::Completed);
        let history = log.history(&outcome.id).await.unwrap();
        let owners: Vec<_> = history
            .iter()
            .filter_map(|t| match &t.transition {
                Transition::Claimed { owner } => Some(owner.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(owners, vec!["taker"]);
        let rows = effects.all().await;
        let mut per_step: BTreeMap<usize, usize> = BTreeMap::new();
        for row in &rows {
            *per_step.entry(row.step).or_default() += 1;
        }
        // step0 was logged done before the kill and did not run again; step1
        // had started (not taken effect) and ran once in the new worker.
        assert_eq!(per_step, BTreeMap::from([(0, 1), (1, 1), (2, 1)]));
        assert!(rows.iter().all(|r| !r.saw_completed));
        support::reset_schema(schema).await;
    });
}
