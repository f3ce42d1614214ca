//! Saga cases on the embedded path: a `SqliteLog` in a real file of a temp
//! dir. What users of Temporal/Cadence sagas, MassTransit or NServiceBus saga
//! state machines and other Rust saga crates check first: which steps are
//! undone and in which order, what happens when an undo keeps failing, what a
//! crash before, after or during a step or a compensation leaves behind and
//! how a reopened log continues it, concurrent sagas, deadlines and step
//! timeouts, cancellation, events, listing, and bad input.
//!
//! A crash is a runtime of its own dropped while a step or a compensation
//! hangs (its tasks are dropped, as a killed process's would stop), then the
//! same file opened again by a new `SqliteLog`.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use seawall::testing::VirtualClock;
use seawall::{Pipeline, Retry};
use seawall_saga::{
    DefinitionError, GroupCompensation, ListQuery, LogError, Orchestrator, OrchestratorBuilder,
    OutputError, Parallel, Phase, Saga, SagaError, SagaEvent, SagaId, SagaInput, SagaLog,
    SagaOutcome, SagaRecord, SagaStatus, ServeOptions, SqliteLog, SqliteOptions, StartOptions,
    Step, StepContext, StepOutput, Transition, TransitionRecord,
};
use serde::{Deserialize, Serialize};
use support::Backend;
use tokio::sync::Notify;

// ------------------------------------------------------------------ the shop

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct Order {
    id: u32,
    cents: u64,
}

fn order(id: u32) -> Order {
    Order {
        id,
        cents: 100 * u64::from(id),
    }
}

/// What the shop records when it undoes the charge of `order(id)`, e.g.
/// `undo charge Payment { payment: "pay-3-hold-3", cents: 300 }`.
fn undo_charge(id: u32) -> String {
    format!(
        r#"undo charge Payment {{ payment: "pay-{id}-hold-{id}", cents: {} }}"#,
        order(id).cents
    )
}

/// What the shop records when it undoes the reservation of `order(id)`, e.g.
/// `undo reserve Hold { hold: "hold-3" }`.
fn undo_reserve(id: u32) -> String {
    format!(r#"undo reserve Hold {{ hold: "hold-{id}" }}"#)
}

/// The shop's effects when all three steps ran once.
const RAN_ONCE: [&str; 3] = ["do reserve", "do charge", "do ship"];

/// The shop's effects when `charge` ran again after its effect was not logged.
const CHARGED_TWICE: [&str; 4] = ["do reserve", "do charge", "do charge", "do ship"];

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct Hold {
    hold: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct Payment {
    payment: String,
    cents: u64,
}

/// Where a step or a compensation hangs (once) until its runtime is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hang {
    /// Before the action takes its effect.
    Before(&'static str),
    /// After the action took its effect, before it returns.
    After(&'static str),
    /// After the compensation took its effect, before it returns.
    UndoAfter(&'static str),
}

/// One execution of an action or a compensation that took effect.
#[derive(Clone, Debug, PartialEq)]
struct Effect {
    what: String,
    key: String,
}

/// The shop's switches and what its steps did.
#[derive(Clone, Default)]
struct Shop {
    effects: Arc<Mutex<Vec<Effect>>>,
    /// Every compensation attempt: (step, `ctx.attempt()`), failed or not.
    undo_attempts: Arc<Mutex<Vec<(String, u32)>>>,
    /// Every action execution: (step, `ctx.attempt()`).
    action_attempts: Arc<Mutex<Vec<(String, u32)>>>,
    /// Actions that fail.
    fail: Arc<Mutex<Vec<&'static str>>>,
    /// Compensations that fail, with how many more times (`u32::MAX`: always).
    undo_fail: Arc<Mutex<HashMap<&'static str, u32>>>,
    /// Compensations that panic, once each.
    undo_panic: Arc<Mutex<Vec<&'static str>>>,
    hang: Arc<Mutex<Option<Hang>>>,
    reached: Arc<tokio::sync::Notify>,
    /// When set, `charge` takes a write lock on this file after its effect
    /// and keeps it in `lock`.
    lock_file_in_charge: Arc<Mutex<Option<PathBuf>>>,
    lock: Arc<Mutex<Option<rusqlite::Connection>>>,
}

impl Shop {
    /// Makes the action `step` fail.
    fn failing(self, step: &'static str) -> Self {
        self.fail.lock().unwrap().push(step);
        self
    }

    /// Makes the compensation of `step` fail `times` more times (`u32::MAX`: always).
    fn undo_failing(self, step: &'static str, times: u32) -> Self {
        self.undo_fail.lock().unwrap().insert(step, times);
        self
    }

    /// Plans the (single) hang.
    fn hanging(self, at: Hang) -> Self {
        *self.hang.lock().unwrap() = Some(at);
        self
    }

    /// The attempt numbers of the compensations tried, of `step` only when
    /// named, in the order tried.
    fn undo_attempt_numbers(&self, step: Option<&str>) -> Vec<u32> {
        self.undo_attempts
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, _)| step.is_none_or(|s| n == s))
            .map(|(_, a)| *a)
            .collect()
    }

    fn record(&self, what: String, key: &seawall_saga::IdempotencyKey) {
        self.effects.lock().unwrap().push(Effect {
            what,
            key: key.to_string(),
        });
    }

    fn effects(&self) -> Vec<String> {
        self.effects
            .lock()
            .unwrap()
            .iter()
            .map(|e| e.what.clone())
            .collect()
    }

    fn keys_of(&self, what: &str) -> Vec<String> {
        self.effects
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.what == what)
            .map(|e| e.key.clone())
            .collect()
    }

    fn count(&self, what: &str) -> usize {
        self.keys_of(what).len()
    }

    /// True once for `at` when it is the planned hang (which is then cleared).
    fn hangs(&self, at: Hang) -> bool {
        let mut hang = self.hang.lock().unwrap();
        if *hang == Some(at) {
            *hang = None;
            true
        } else {
            false
        }
    }

    async fn hang_here(&self) {
        self.reached.notify_one();
        std::future::pending::<()>().await;
    }

    fn undo_fails(&self, name: &str) -> bool {
        let mut fails = self.undo_fail.lock().unwrap();
        match fails.get_mut(name) {
            Some(0) | None => false,
            Some(left) => {
                if *left != u32::MAX {
                    *left -= 1;
                }
                true
            }
        }
    }

    fn undo_panics(&self, name: &str) -> bool {
        let mut panics = self.undo_panic.lock().unwrap();
        match panics.iter().position(|n| *n == name) {
            Some(at) => {
                panics.remove(at);
                true
            }
            None => false,
        }
    }

    fn take_lock_in_charge(&self) {
        let Some(path) = self.lock_file_in_charge.lock().unwrap().take() else {
            return;
        };
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.busy_timeout(Duration::from_secs(5)).unwrap();
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        *self.lock.lock().unwrap() = Some(conn);
    }

    /// A step of the shop: `make` computes its output from the context.
    fn step<O>(
        &self,
        name: &'static str,
        make: fn(&StepContext<Order>) -> Result<O, String>,
    ) -> Step<Order, O>
    where
        O: StepOutput + Clone + std::fmt::Debug + Send + Sync,
    {
        let (shop, undo) = (self.clone(), self.clone());
        Step::new(name, move |ctx: StepContext<Order>| {
            let shop = shop.clone();
            async move {
                note_attempt(&shop.action_attempts, name, &ctx);
                if shop.hangs(Hang::Before(name)) {
                    shop.hang_here().await;
                }
                if shop.fail.lock().unwrap().contains(&name) {
                    return Err(format!("{name} refused"));
                }
                let output = make(&ctx)?;
                shop.record(format!("do {name}"), ctx.idempotency_key());
                if name == "charge" {
                    shop.take_lock_in_charge();
                }
                if shop.hangs(Hang::After(name)) {
                    shop.hang_here().await;
                }
                Ok(output)
            }
        })
        .compensate(move |ctx: StepContext<Order>, output: O| {
            let shop = undo.clone();
            async move {
                note_attempt(&shop.undo_attempts, name, &ctx);
                if shop.undo_panics(name) {
                    panic!("undo of {name} exploded");
                }
                if shop.undo_fails(name) {
                    return Err(format!("cannot undo {name}"));
                }
                shop.record(format!("undo {name} {output:?}"), ctx.idempotency_key());
                if shop.hangs(Hang::UndoAfter(name)) {
                    shop.hang_here().await;
                }
                Ok::<_, String>(())
            }
        })
    }

    /// reserve, then charge (reads reserve's output), then ship (reads charge's).
    fn saga(&self) -> Saga<Order> {
        Saga::builder("shop")
            .step(self.step("reserve", |ctx| {
                Ok(Hold {
                    hold: format!("hold-{}", ctx.input().id),
                })
            }))
            .step(self.step("charge", |ctx| {
                let hold: Hold = ctx.output("reserve").map_err(|e| e.to_string())?;
                Ok(Payment {
                    payment: format!("pay-{}-{}", ctx.input().id, hold.hold),
                    cents: ctx.input().cents,
                })
            }))
            .step(self.step("ship", |ctx| {
                let payment: Payment = ctx.output("charge").map_err(|e| e.to_string())?;
                Ok(format!("parcel for {}", payment.payment))
            }))
            .build()
            .unwrap()
    }
}

/// Notes that `name` runs, with the attempt number it is given.
fn note_attempt(attempts: &Mutex<Vec<(String, u32)>>, name: &str, ctx: &StepContext<Order>) {
    attempts
        .lock()
        .unwrap()
        .push((name.to_owned(), ctx.attempt()));
}

/// A log file of its own (`sagas.db` in a temp dir, from the shared
/// support): the backend keeps the dir alive, the path is what the tests open.
fn temp_log() -> (Backend, PathBuf) {
    let backend = Backend::sqlite();
    let Backend::Sqlite { path, .. } = &backend else {
        unreachable!("Backend::sqlite is a SQLite file")
    };
    let path = path.clone();
    (backend, path)
}

/// A log file of its own, `shop` and the shop's saga.
fn shop_case(shop: Shop) -> (Backend, PathBuf, Shop, Saga<Order>) {
    let (dir, path) = temp_log();
    let saga = shop.saga();
    (dir, path, shop, saga)
}

/// An orchestrator builder over a new `SqliteLog` on the file at `path`,
/// with `saga` registered.
fn builder_on<I: SagaInput>(path: &Path, saga: &Saga<I>) -> OrchestratorBuilder {
    Orchestrator::builder(SqliteLog::open(path).unwrap()).saga(saga)
}

/// The same, with all the defaults.
fn orchestrator_on<I: SagaInput>(path: &Path, saga: &Saga<I>) -> Orchestrator {
    builder_on(path, saga).build().unwrap()
}

/// An orchestrator over the file at `path`, compensations retried at once up
/// to `attempts` times.
fn shop_orchestrator(path: &Path, saga: &Saga<Order>, attempts: u32) -> Orchestrator {
    builder_on(path, saga)
        .compensation_retry(Retry::constant(Duration::ZERO).max_attempts(attempts))
        .build()
        .unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Starts saga `id` in a runtime of its own with `orchestrator`, waits until
/// `until` (given the orchestrator) returns, then drops the runtime: the
/// process "dies" there.
fn crash_when<I: SagaInput, F: Future<Output = ()>>(
    orchestrator: Orchestrator,
    saga: &Saga<I>,
    id: &str,
    input: I,
    until: impl FnOnce(Orchestrator) -> F,
) {
    let rt = runtime();
    rt.block_on(async {
        let (o, saga) = (orchestrator.clone(), saga.clone());
        let options = StartOptions::new().id(id);
        let _driver = tokio::spawn(async move { o.start_with(&saga, input, options).await });
        until(orchestrator).await;
    });
    drop(rt);
}

/// Waits (10 s at most) until a planned hang notifies `reached`.
async fn hang_reached(reached: &Notify) {
    tokio::time::timeout(Duration::from_secs(10), reached.notified())
        .await
        .expect("the planned hang was reached");
}

/// Starts saga `id` with `orchestrator` and crashes once the shop's planned
/// hang is reached.
fn crash_at_hang(shop: &Shop, orchestrator: Orchestrator, saga: &Saga<Order>, id: &str, o: Order) {
    crash_when(orchestrator, saga, id, o, |_| hang_reached(&shop.reached));
}

/// The same with the shop's usual orchestrator on the file at `path`.
fn crash_shop(shop: &Shop, path: &Path, saga: &Saga<Order>, id: &str, o: Order) {
    crash_at_hang(shop, shop_orchestrator(path, saga, 3), saga, id, o);
}

/// A point that hangs the first time it is passed (until its runtime is
/// dropped), after notifying `reached`.
#[derive(Clone)]
struct HangOnce {
    armed: Arc<Mutex<bool>>,
    reached: Arc<Notify>,
}

impl HangOnce {
    fn new() -> Self {
        HangOnce {
            armed: Arc::new(Mutex::new(true)),
            reached: Arc::default(),
        }
    }

    async fn pass(&self) {
        if std::mem::replace(&mut *self.armed.lock().unwrap(), false) {
            self.reached.notify_one();
            std::future::pending::<()>().await;
        }
    }
}

/// Polls `check` every few milliseconds until it is `Ok`; after 10 s, fails
/// with its last complaint.
async fn eventually<F: Future<Output = Result<(), String>>>(check: impl Fn() -> F) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match check().await {
            Ok(()) => return,
            Err(why) => assert!(Instant::now() < deadline, "{why}"),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Recovers with `o`, checks that no saga failed and that exactly one was
/// continued, to `status`; that one's outcome.
async fn recover_one(o: &Orchestrator, status: SagaStatus) -> SagaOutcome {
    let report = o.recover().await.unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(report.outcomes.len(), 1);
    assert_eq!(report.outcomes[0].status, status);
    report.outcomes.into_iter().next().unwrap()
}

/// Adds to `step` a compensation that records the step's name in `undone`.
fn undo_recorded<O: StepOutput>(
    step: Step<u32, O>,
    undone: &Arc<Mutex<Vec<String>>>,
) -> Step<u32, O> {
    let undone = undone.clone();
    step.compensate(move |ctx: StepContext<u32>, _: O| {
        let undone = undone.clone();
        async move {
            undone.lock().unwrap().push(ctx.step_name().to_owned());
            Ok::<_, String>(())
        }
    })
}

/// What a call given an out-of-range option may do: succeed (`check` looks
/// at the result) or refuse with a typed error, but not panic (the outer
/// `Err`, for `call`).
fn not_a_panic<T, E: std::fmt::Display, P: std::fmt::Display>(
    call: &str,
    result: Result<Result<T, E>, P>,
    check: impl FnOnce(T),
) {
    match result {
        Ok(Ok(value)) => check(value),
        Ok(Err(e)) => eprintln!("refused with a typed error: {e}"),
        Err(panic) => panic!("{call} panicked: {panic}"),
    }
}

fn kinds(history: &[TransitionRecord]) -> Vec<&'static str> {
    history.iter().map(|t| t.transition.kind()).collect()
}

/// The sagas `o` lists with `status` (the default page).
async fn listed(o: &Orchestrator, status: SagaStatus) -> Vec<SagaRecord> {
    o.list(&ListQuery::status(status)).await.unwrap()
}

/// The events of saga `id` among `events`, in the order they came.
fn events_of<'a>(events: &'a [SagaEvent], id: &SagaId) -> Vec<&'a SagaEvent> {
    events.iter().filter(|e| e.saga_id == *id).collect()
}

/// The kinds from the last `claimed` transition on.
fn kinds_after_claim(history: &[TransitionRecord]) -> Vec<&'static str> {
    let all = kinds(history);
    let claimed = all
        .iter()
        .rposition(|k| *k == "claimed")
        .unwrap_or_else(|| panic!("no claim in {all:?}"));
    all[claimed..].to_vec()
}

fn events_sink() -> (
    Arc<Mutex<Vec<SagaEvent>>>,
    impl Fn(&SagaEvent) + Send + Sync,
) {
    let events: Arc<Mutex<Vec<SagaEvent>>> = Arc::default();
    let sink = events.clone();
    (events, move |e: &SagaEvent| {
        sink.lock().unwrap().push(e.clone())
    })
}

// --------------------------------------------------------------- definitions

/// Bad definitions are refused when built, each with its own error: an empty
/// saga, no name, an empty step name, a repeated step name (also across a
/// parallel group), an empty group, a saga registered twice, a compensation
/// retry with no attempt.
#[test]
fn bad_definitions_are_refused_when_built() {
    let noop = |name: &str| {
        Step::new(name.to_owned(), |_ctx: StepContext<u32>| async {
            Ok::<_, String>(())
        })
    };
    let duplicate = |step: &str| DefinitionError::DuplicateStep {
        saga: "s".into(),
        step: step.into(),
    };
    let s = || Saga::<u32>::builder("s");
    let refused = [
        (
            Saga::<u32>::builder("empty"),
            DefinitionError::NoSteps("empty".into()),
        ),
        (
            Saga::<u32>::builder("").step(noop("a")),
            DefinitionError::EmptySagaName,
        ),
        (
            s().step(noop("")),
            DefinitionError::EmptyStepName("s".into()),
        ),
        (
            s().step(noop("a")).step(noop("b")).step(noop("a")),
            duplicate("a"),
        ),
        (
            s().step(noop("a"))
                .parallel(Parallel::new().step(noop("b")).step(noop("a"))),
            duplicate("a"),
        ),
        (
            s().parallel(Parallel::new().step(noop("x")).step(noop("x"))),
            duplicate("x"),
        ),
        (
            s().step(noop("a")).parallel(Parallel::new()),
            DefinitionError::EmptyGroup("s".into()),
        ),
    ];
    for (case, (builder, expected)) in refused.into_iter().enumerate() {
        assert_eq!(builder.build().unwrap_err(), expected, "case {case}");
    }
    let ok = Saga::<u32>::builder("s")
        .step(noop("a"))
        .parallel(Parallel::new().step(noop("b")).step(noop("c")))
        .step(noop("d"))
        .build()
        .unwrap();
    assert_eq!(ok.name(), "s");
    assert_eq!(ok.step_names().collect::<Vec<_>>(), ["a", "b", "c", "d"]);

    let (_dir, path) = temp_log();
    let log = SqliteLog::open(&path).unwrap();
    let twice = Orchestrator::builder(log.clone())
        .saga(&ok)
        .saga(&ok.clone())
        .build()
        .unwrap_err();
    assert_eq!(twice, DefinitionError::DuplicateSaga("s".into()));
    let no_attempt = Orchestrator::builder(log)
        .compensation_retry(Retry::constant(Duration::from_millis(1)).max_attempts(0))
        .build()
        .unwrap_err();
    assert!(
        matches!(&no_attempt, DefinitionError::CompensationRetry(e) if e.field == "max_attempts"),
        "{no_attempt:?}"
    );
}

// -------------------------------------------------------------- compensation

/// Only completed steps are undone, last first, each with its own output and
/// key; the failed step is not undone; a step without compensation is
/// skipped. The outcome, the history and the listing agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_steps_are_undone_in_reverse_and_the_failed_one_is_not() {
    let (_dir, path, shop, saga) = shop_case(Shop::default().failing("ship"));
    let o = shop_orchestrator(&path, &saga, 3);
    let outcome = o
        .start_with(&saga, order(3), StartOptions::new().id("o-3"))
        .await
        .unwrap();
    assert_eq!(outcome.status, SagaStatus::Compensated);
    assert_eq!(outcome.name, "shop");
    assert!(outcome.stuck.is_none() && outcome.abandoned.is_empty());
    let failure = outcome.failure.clone().unwrap();
    assert_eq!(
        (failure.step.index, failure.step.name.as_str()),
        (2, "ship")
    );
    assert_eq!(failure.error, "ship refused");
    assert!(!failure.deadline_exceeded);
    assert_eq!(
        shop.effects(),
        [
            "do reserve".to_owned(),
            "do charge".to_owned(),
            undo_charge(3),
            undo_reserve(3),
        ]
    );
    let keys: Vec<String> = shop
        .effects
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.key.clone())
        .collect();
    assert_eq!(
        keys,
        [
            "o-3/0/reserve/action",
            "o-3/1/charge/action",
            "o-3/1/charge/compensation",
            "o-3/0/reserve/compensation",
        ]
    );
    // The completed steps' outputs stay readable; the failed step has none.
    assert_eq!(
        outcome.output::<Hold>("reserve").unwrap(),
        Hold {
            hold: "hold-3".into()
        }
    );
    assert!(matches!(
        outcome.output::<String>("ship"),
        Err(OutputError::Missing(step)) if step == "ship"
    ));
    let history = o.history(&SagaId::new("o-3")).await.unwrap();
    assert_eq!(
        kinds(&history),
        [
            "saga_started",
            "step_started",
            "step_completed",
            "step_started",
            "step_completed",
            "step_started",
            "step_failed",
            "compensation_started",
            "compensation_completed",
            "compensation_started",
            "compensation_completed",
            "saga_compensated",
        ]
    );
    assert!(history.iter().enumerate().all(|(i, t)| t.seq as usize == i));
    assert!(history.windows(2).all(|w| w[0].at <= w[1].at));
    let record = o.get(&SagaId::new("o-3")).await.unwrap().unwrap();
    assert_eq!(record.created_at, history[0].at);
    assert_eq!(record.updated_at, history.last().unwrap().at);
    let undone: Vec<usize> = history
        .iter()
        .filter_map(|t| match &t.transition {
            Transition::CompensationCompleted { step } => Some(step.index),
            _ => None,
        })
        .collect();
    assert_eq!(undone, [1, 0]);
    let listed = listed(&o, SagaStatus::Compensated).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, SagaId::new("o-3"));
    assert_eq!(listed[0].status, SagaStatus::Compensated);

    // The first step failing undoes nothing at all.
    drop(o);
    let shop = Shop::default().failing("reserve");
    let saga = shop.saga();
    let o = shop_orchestrator(&path, &saga, 3);
    let outcome = o.start(&saga, order(4)).await.unwrap();
    assert_eq!(outcome.status, SagaStatus::Compensated);
    assert_eq!(outcome.failure.unwrap().step.name, "reserve");
    assert!(shop.effects().is_empty());
    assert!(shop.undo_attempts.lock().unwrap().is_empty());
}

/// A step declared without a compensation is skipped when undoing; the
/// others are still undone in reverse order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_without_compensation_is_skipped_when_undoing() {
    let (_dir, path) = temp_log();
    let undone = Arc::new(Mutex::new(Vec::<&str>::new()));
    let step = |name: &'static str, fails: bool, undo: bool| {
        let undone = undone.clone();
        let step = Step::new(name, move |_ctx: StepContext<u32>| async move {
            if fails {
                return Err(format!("{name} failed"));
            }
            Ok(name.to_owned())
        });
        if undo {
            step.compensate(move |_ctx, out: String| {
                let undone = undone.clone();
                async move {
                    assert_eq!(out, name);
                    undone.lock().unwrap().push(name);
                    Ok::<_, String>(())
                }
            })
        } else {
            step
        }
    };
    let saga = Saga::<u32>::builder("notify")
        .step(step("a", false, true))
        .step(step("email", false, false))
        .step(step("c", false, true))
        .step(step("d", true, true))
        .build()
        .unwrap();
    let o = orchestrator_on(&path, &saga);
    let outcome = o.start(&saga, 1).await.unwrap();
    assert_eq!(outcome.status, SagaStatus::Compensated);
    assert_eq!(*undone.lock().unwrap(), ["c", "a"]);
    let history = o.history(&outcome.id).await.unwrap();
    let email: Vec<&str> = history
        .iter()
        .filter(|t| t.transition.step().is_some_and(|s| s.name == "email"))
        .map(|t| t.transition.kind())
        .collect();
    assert_eq!(email, ["step_started", "step_completed"]);
}

/// A compensation that panics is a failed attempt: it is retried, and the
/// panic's message is the logged error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_compensation_is_a_failed_attempt_and_is_retried() {
    let (_dir, path) = temp_log();
    let shop = Shop::default().failing("ship");
    shop.undo_panic.lock().unwrap().push("charge");
    let saga = shop.saga();
    let o = shop_orchestrator(&path, &saga, 3);
    let outcome = o.start(&saga, order(5)).await.unwrap();
    assert_eq!(outcome.status, SagaStatus::Compensated);
    assert_eq!(shop.count(&undo_charge(5)), 1);
    let history = o.history(&outcome.id).await.unwrap();
    let failed: Vec<(u32, String)> = history
        .iter()
        .filter_map(|t| match &t.transition {
            Transition::CompensationFailed { attempt, error, .. } => {
                Some((*attempt, error.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].0, 1);
    assert!(
        failed[0].1.contains("undo of charge exploded"),
        "{failed:?}"
    );
    assert_eq!(
        *shop.undo_attempts.lock().unwrap(),
        [
            ("charge".to_owned(), 1),
            ("charge".to_owned(), 2),
            ("reserve".to_owned(), 1)
        ]
    );
}

/// Without a configured compensation retry: 5 attempts, exponential from
/// 100 ms doubling, no jitter (the documented default), on the injected
/// clock; then the saga is stuck, not dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_compensation_retry_is_five_attempts_doubling_from_100ms() {
    let (_dir, path, shop, saga) = shop_case(
        Shop::default()
            .failing("ship")
            .undo_failing("charge", u32::MAX),
    );
    let clock = VirtualClock::starting_at(Duration::from_secs(1_700_000_000));
    let o = builder_on(&path, &saga)
        .clock(clock.clone())
        .build()
        .unwrap();
    let outcome = o.start(&saga, order(6)).await.unwrap();
    assert_eq!(outcome.status, SagaStatus::Stuck);
    let stuck = outcome.stuck.clone().unwrap();
    assert_eq!(stuck.step.name, "charge");
    assert_eq!(stuck.error, "cannot undo charge");
    assert_eq!(outcome.failure.unwrap().step.name, "ship");
    let history = o.history(&outcome.id).await.unwrap();
    let starts: Vec<SystemTime> = history
        .iter()
        .filter(|t| t.transition.kind() == "compensation_started")
        .map(|t| t.at)
        .collect();
    let gaps: Vec<Duration> = starts
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).unwrap())
        .collect();
    assert_eq!(
        gaps,
        [100, 200, 400, 800].map(Duration::from_millis),
        "{history:#?}"
    );
    assert_eq!(shop.undo_attempt_numbers(None), [1, 2, 3, 4, 5]);
    // The reservation was not undone: the stuck compensation stops the rest.
    assert_eq!(shop.count(&undo_reserve(6)), 0);
    assert_eq!(history.last().unwrap().transition.kind(), "saga_stuck");
    assert!(!SagaStatus::Stuck.is_finished() && !SagaStatus::Stuck.is_in_progress());
}

/// A continue-on-error compensation that fails all its attempts is
/// abandoned, and the earlier steps are still undone: the saga ends
/// compensated, the abandoned undo listed in the outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_compensation_lets_the_others_run() {
    let (_dir, path) = temp_log();
    let undone = Arc::new(Mutex::new(Vec::<String>::new()));
    let mail_undone = undone.clone();
    let saga = Saga::<u32>::builder("signup")
        .step(undo_recorded(
            Step::new("account", |_ctx: StepContext<u32>| async {
                Ok::<_, String>(1u8)
            }),
            &undone,
        ))
        .step(
            Step::new("welcome_mail", |_ctx: StepContext<u32>| async {
                Ok::<_, String>(2u8)
            })
            .compensate(move |ctx, _: u8| {
                let undone = mail_undone.clone();
                async move {
                    undone
                        .lock()
                        .unwrap()
                        .push(format!("mail attempt {}", ctx.attempt()));
                    Err::<(), _>("mail server gone")
                }
            })
            .continue_on_error(),
        )
        .step(Step::new("billing", |_ctx: StepContext<u32>| async {
            Err::<(), _>("billing down")
        }))
        .build()
        .unwrap();
    let o = builder_on(&path, &saga)
        .compensation_retry(Retry::constant(Duration::ZERO).max_attempts(2))
        .build()
        .unwrap();
    let outcome = o.start(&saga, 1).await.unwrap();
    assert_eq!(outcome.status, SagaStatus::Compensated, "{outcome:?}");
    assert_eq!(outcome.abandoned.len(), 1);
    assert_eq!(outcome.abandoned[0].step.name, "welcome_mail");
    assert_eq!(outcome.abandoned[0].error, "mail server gone");
    assert_eq!(
        *undone.lock().unwrap(),
        ["mail attempt 1", "mail attempt 2", "account"]
    );
    let history = o.history(&outcome.id).await.unwrap();
    assert!(kinds(&history).contains(&"compensation_abandoned"));
}

// ---------------------------------------------------------------- stuck sagas

/// A compensation that keeps failing leaves the saga stuck, and a restarted
/// process does not touch it on recovery: it is listed as stuck until an
/// operator resumes it. A resume while the cause is not fixed gets a new
/// cycle of attempts (numbered from 1 again) and is stuck again; once fixed,
/// the saga compensates, without undoing again what was undone.
#[test]
fn a_stuck_saga_waits_for_an_operator_across_a_restart() {
    let (_dir, path, shop, saga) = shop_case(
        Shop::default()
            .failing("ship")
            .undo_failing("reserve", u32::MAX),
    );
    let id = SagaId::new("stuck-1");
    runtime().block_on(async {
        let o = shop_orchestrator(&path, &saga, 2);
        let outcome = o
            .start_with(&saga, order(1), StartOptions::new().id(id.clone()))
            .await
            .unwrap();
        assert_eq!(outcome.status, SagaStatus::Stuck);
        assert_eq!(outcome.stuck.unwrap().step.name, "reserve");
    });
    assert_eq!(shop.count(&undo_charge(1)), 1);
    runtime().block_on(async {
        let o = shop_orchestrator(&path, &saga, 2);
        let report = o.recover().await.unwrap();
        assert!(report.outcomes.is_empty() && report.failures.is_empty());
        let stuck = listed(&o, SagaStatus::Stuck).await;
        assert_eq!(stuck.iter().map(|r| &r.id).collect::<Vec<_>>(), [&id]);
        assert_eq!(o.get(&id).await.unwrap().unwrap().status, SagaStatus::Stuck);

        // Still broken: a new cycle of attempts, stuck again.
        let again = o.resume(&id).await.unwrap();
        assert_eq!(again.status, SagaStatus::Stuck);
        let history = o.history(&id).await.unwrap();
        let after = kinds_after_claim(&history);
        assert_eq!(
            after,
            [
                "claimed",
                "operator_resumed",
                "compensation_started",
                "compensation_failed",
                "compensation_started",
                "compensation_failed",
                "saga_stuck"
            ]
        );
        assert_eq!(shop.undo_attempt_numbers(Some("reserve")), [1, 2, 1, 2]);

        shop.undo_fail.lock().unwrap().clear();
        let fixed = o.resume(&id).await.unwrap();
        assert_eq!(fixed.status, SagaStatus::Compensated);
        assert!(fixed.stuck.is_none());
        assert_eq!(fixed.failure.unwrap().step.name, "ship");
        // Resuming a finished saga only reports it.
        let done = o.resume(&id).await.unwrap();
        assert_eq!(done.status, SagaStatus::Compensated);
    });
    assert_eq!(
        shop.effects(),
        [
            "do reserve".to_owned(),
            "do charge".to_owned(),
            undo_charge(1),
            undo_reserve(1),
        ]
    );
}

/// Every compensation attempt is logged before it runs, so the attempt
/// count survives a restart: a process dies while it waits to retry, the
/// next one goes on from the attempt after the logged ones, and stops at the
/// same total.
#[test]
fn the_compensation_attempt_count_survives_a_restart() {
    let (_dir, path, shop, saga) = shop_case(
        Shop::default()
            .failing("ship")
            .undo_failing("charge", u32::MAX),
    );
    let id = SagaId::new("retry-1");
    // A long backoff: the process sits in it after attempt 1 failed.
    let slow_retry = builder_on(&path, &saga)
        .compensation_retry(Retry::constant(Duration::from_secs(60)).max_attempts(3))
        .build()
        .unwrap();
    let watched = &id;
    crash_when(slow_retry, &saga, id.as_str(), order(2), |o| async move {
        let o = &o;
        eventually(|| async move {
            let history = o.history(watched).await.unwrap_or_default();
            let failed = kinds(&history).contains(&"compensation_failed");
            failed
                .then_some(())
                .ok_or_else(|| "attempt 1 never failed".to_owned())
        })
        .await;
    });
    runtime().block_on(async {
        let o = shop_orchestrator(&path, &saga, 3);
        recover_one(&o, SagaStatus::Stuck).await;
        let history = o.history(&id).await.unwrap();
        let failed: Vec<u32> = history
            .iter()
            .filter_map(|t| match &t.transition {
                Transition::CompensationFailed { attempt, .. } => Some(*attempt),
                _ => None,
            })
            .collect();
        assert_eq!(failed, [1, 2, 3]);
    });
    assert_eq!(shop.undo_attempt_numbers(None), [1, 2, 3]);
}

// --------------------------------------------------------------------- crashes

/// Crash before the step took its effect: on reopening, the logged step does
/// not run again, the started one runs (once in effect), with the same key.
#[test]
fn a_crash_before_a_step_took_effect_runs_it_on_recovery() {
    let (_dir, path, shop, saga) = shop_case(Shop::default().hanging(Hang::Before("charge")));
    crash_shop(&shop, &path, &saga, "c-1", order(7));
    assert_eq!(shop.effects(), ["do reserve"]);
    runtime().block_on(async {
        let o = shop_orchestrator(&path, &saga, 3);
        let record = o.get(&SagaId::new("c-1")).await.unwrap().unwrap();
        assert_eq!(record.status, SagaStatus::Running);
        let running = listed(&o, SagaStatus::Running).await;
        assert_eq!(running.len(), 1);
        let outcome = recover_one(&o, SagaStatus::Completed).await;
        assert_eq!(
            outcome.output::<String>("ship").unwrap(),
            "parcel for pay-7-hold-7"
        );
        let history = o.history(&SagaId::new("c-1")).await.unwrap();
        assert_eq!(
            kinds_after_claim(&history),
            [
                "claimed",
                "step_started",
                "step_completed",
                "step_started",
                "step_completed",
                "saga_completed"
            ]
        );
    });
    assert_eq!(shop.effects(), RAN_ONCE);
}

/// Crash after the step took its effect but before its completion was
/// logged: the step runs again on recovery, with the same idempotency key
/// (attempt 1: it is an action); the step before it does not; its output is
/// read back from the log for the next steps.
#[test]
fn a_crash_after_an_unlogged_effect_runs_the_step_again_with_the_same_key() {
    let (_dir, path, shop, saga) = shop_case(Shop::default().hanging(Hang::After("charge")));
    crash_shop(&shop, &path, &saga, "c-2", order(8));
    runtime().block_on(async {
        let o = shop_orchestrator(&path, &saga, 3);
        // The operator call continues it as well as recovery would.
        let outcome = o.resume(&SagaId::new("c-2")).await.unwrap();
        assert_eq!(outcome.status, SagaStatus::Completed);
        assert_eq!(
            outcome.output::<Payment>("charge").unwrap(),
            Payment {
                payment: "pay-8-hold-8".into(),
                cents: 800
            }
        );
    });
    assert_eq!(shop.effects(), CHARGED_TWICE);
    assert_eq!(
        shop.keys_of("do charge"),
        ["c-2/1/charge/action", "c-2/1/charge/action"]
    );
    assert!(shop
        .action_attempts
        .lock()
        .unwrap()
        .iter()
        .all(|(_, attempt)| *attempt == 1));
}

/// Crash during compensation: the undo whose completion is logged does not
/// run again, the one under way runs again with the same key and the next
/// attempt number, and the saga ends compensated.
#[test]
fn a_crash_during_compensation_reruns_only_the_unlogged_undo() {
    let (_dir, path, shop, saga) = shop_case(
        Shop::default()
            .failing("ship")
            .hanging(Hang::UndoAfter("reserve")),
    );
    crash_shop(&shop, &path, &saga, "c-3", order(9));
    runtime().block_on(async {
        let o = shop_orchestrator(&path, &saga, 3);
        assert_eq!(
            o.get(&SagaId::new("c-3")).await.unwrap().unwrap().status,
            SagaStatus::Compensating
        );
        let compensating = listed(&o, SagaStatus::Compensating).await;
        assert_eq!(compensating.len(), 1);
        let outcome = recover_one(&o, SagaStatus::Compensated).await;
        assert_eq!(outcome.failure.unwrap().step.name, "ship");
        let history = o.history(&SagaId::new("c-3")).await.unwrap();
        assert_eq!(
            kinds_after_claim(&history),
            [
                "claimed",
                "compensation_started",
                "compensation_completed",
                "saga_compensated"
            ]
        );
        let restarted_attempt = history.iter().rev().find_map(|t| match &t.transition {
            Transition::CompensationStarted { step, attempt } if step.name == "reserve" => {
                Some(*attempt)
            }
            _ => None,
        });
        assert_eq!(restarted_attempt, Some(2));
    });
    assert_eq!(
        shop.effects(),
        [
            "do reserve".to_owned(),
            "do charge".to_owned(),
            undo_charge(9),
            undo_reserve(9),
            undo_reserve(9),
        ]
    );
    assert_eq!(
        shop.keys_of(&undo_reserve(9)),
        ["c-3/0/reserve/compensation", "c-3/0/reserve/compensation"]
    );
    assert_eq!(
        *shop.undo_attempts.lock().unwrap(),
        [
            ("charge".to_owned(), 1),
            ("reserve".to_owned(), 1),
            ("reserve".to_owned(), 2)
        ]
    );
}

/// A step's output is read back from the log after a crash. A value read
/// back must be the value the step returned: here a plain `f64` ratio,
/// `1.0 / 11.0`. The step after it (run again after the crash) and the
/// operator's view of the finished saga both see it.
#[test]
fn a_float_output_reads_back_from_the_log_as_it_was_returned() {
    let (_dir, path) = temp_log();
    let ratio = 1.0f64 / 11.0;
    let seen = Arc::new(Mutex::new(Vec::<f64>::new()));
    let hang = HangOnce::new();
    let saga = {
        let (seen, hang) = (seen.clone(), hang.clone());
        Saga::<u32>::builder("fx")
            .step(Step::new(
                "rate",
                move |_ctx: StepContext<u32>| async move { Ok::<_, String>(ratio) },
            ))
            .step(Step::new("convert", move |ctx: StepContext<u32>| {
                let (seen, hang) = (seen.clone(), hang.clone());
                async move {
                    let rate: f64 = ctx.output("rate").map_err(|e| e.to_string())?;
                    seen.lock().unwrap().push(rate);
                    hang.pass().await;
                    Ok::<_, String>(f64::from(*ctx.input()) * rate)
                }
            }))
            .build()
            .unwrap()
    };
    crash_when(orchestrator_on(&path, &saga), &saga, "fx-1", 11, |_| {
        hang_reached(&hang.reached)
    });
    let outcome = runtime().block_on(async {
        let o = orchestrator_on(&path, &saga);
        let report = o.recover().await.unwrap();
        assert_eq!(report.outcomes.len(), 1);
        o.resume(&SagaId::new("fx-1")).await.unwrap()
    });
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[1].to_bits(),
        ratio.to_bits(),
        "before the crash `convert` saw {:?}, after it {:?}; the step returned {ratio:?}",
        seen[0],
        seen[1]
    );
    assert_eq!(
        outcome.output::<f64>("rate").unwrap().to_bits(),
        ratio.to_bits()
    );
}

/// The same, without a crash: what a listener is told a step returned and
/// what the log reads back are the same transition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_and_its_logged_transition_agree_for_a_float_output() {
    let (_dir, path) = temp_log();
    let saga = Saga::<u32>::builder("fx")
        .step(Step::new("rate", |ctx: StepContext<u32>| async move {
            Ok::<_, String>(1.0f64 / f64::from(*ctx.input()))
        }))
        .build()
        .unwrap();
    let (events, sink) = events_sink();
    let o = builder_on(&path, &saga).on_event(sink).build().unwrap();
    let outcome = o.start(&saga, 11).await.unwrap();
    assert_eq!(outcome.status, SagaStatus::Completed);
    let history = o.history(&outcome.id).await.unwrap();
    let events = events.lock().unwrap().clone();
    assert_eq!(events.len(), history.len());
    for (event, record) in events.iter().zip(&history) {
        assert_eq!(event.seq, record.seq);
        assert_eq!(event.transition, record.transition, "seq {}", record.seq);
    }
    let again = o.resume(&outcome.id).await.unwrap();
    assert_eq!(
        again.output::<f64>("rate").unwrap().to_bits(),
        outcome.output::<f64>("rate").unwrap().to_bits()
    );
}

/// A parallel group interrupted by a crash, one step done and logged, the
/// other under way: the logged one does not run again, and the group's
/// steps never see each other's outputs, before or after the crash.
#[test]
fn a_group_interrupted_by_a_crash_reruns_only_its_unlogged_step() {
    let (_dir, path) = temp_log();
    let runs = Arc::new(Mutex::new(Vec::<String>::new()));
    let hang = HangOnce::new();
    let step = |name: &'static str| {
        let (runs, hang) = (runs.clone(), hang.clone());
        Step::new(name, move |ctx: StepContext<u32>| {
            let (runs, hang) = (runs.clone(), hang.clone());
            async move {
                let sibling = if name == "hotel" { "car" } else { "hotel" };
                if matches!(name, "hotel" | "car") {
                    assert!(ctx.output_json(sibling).is_none());
                    assert!(matches!(
                        ctx.output::<String>(sibling),
                        Err(OutputError::Missing(_))
                    ));
                    assert_eq!(ctx.output::<String>("flight").unwrap(), "flight-out");
                }
                runs.lock()
                    .unwrap()
                    .push(format!("{name} {}", ctx.idempotency_key()));
                if name == "car" {
                    hang.pass().await;
                }
                if name == "pay" {
                    let both = (
                        ctx.output::<String>("hotel").map_err(|e| e.to_string())?,
                        ctx.output::<String>("car").map_err(|e| e.to_string())?,
                    );
                    assert_eq!(both, ("hotel-out".to_owned(), "car-out".to_owned()));
                }
                Ok::<_, String>(format!("{name}-out"))
            }
        })
    };
    let saga = Saga::<u32>::builder("trip")
        .step(step("flight"))
        .parallel(
            Parallel::new()
                .step(step("hotel"))
                .step(step("car"))
                .compensation(GroupCompensation::ReverseOrder),
        )
        .step(step("pay"))
        .build()
        .unwrap();
    let id = SagaId::new("trip-1");
    let watched = &id;
    // The crash comes once `car` hangs and `hotel`'s completion is logged.
    let until = |o: Orchestrator| async move {
        hang_reached(&hang.reached).await;
        let o = &o;
        eventually(|| async move {
            let history = o.history(watched).await.unwrap();
            let logged = history.iter().any(|t| {
                matches!(&t.transition, Transition::StepCompleted { step, .. } if step.name == "hotel")
            });
            logged
                .then_some(())
                .ok_or_else(|| "hotel's completion never logged".to_owned())
        })
        .await;
    };
    crash_when(orchestrator_on(&path, &saga), &saga, "trip-1", 1, until);
    runtime().block_on(async {
        let o = orchestrator_on(&path, &saga);
        let report = o.recover().await.unwrap();
        let history = o.history(&id).await.unwrap();
        assert!(
            report.failures.is_empty(),
            "{:?} {:?}",
            report.failures,
            kinds(&history)
        );
        assert_eq!(report.outcomes.len(), 1, "{:?}", kinds(&history));
        assert_eq!(
            report.outcomes[0].status,
            SagaStatus::Completed,
            "{:?} {:?}",
            report.outcomes[0],
            kinds(&history)
        );
    });
    let runs = runs.lock().unwrap().clone();
    let count = |prefix: &str| runs.iter().filter(|r| r.starts_with(prefix)).count();
    assert_eq!(
        (
            count("flight "),
            count("hotel "),
            count("car "),
            count("pay ")
        ),
        (1, 1, 2, 1),
        "{runs:?}"
    );
}

// ------------------------------------------------- log errors and bad files

/// The log becomes unwritable in the middle of a saga (another connection
/// holds the write lock past the busy timeout): the saga's call fails with a
/// typed log error, no event is emitted for what was not committed, and the
/// saga stays in the file as last committed. A process that reopens the file
/// finishes it; the step whose completion was not committed runs again with
/// the same key, the one before it does not.
#[test]
fn a_log_that_cannot_be_written_fails_the_call_and_loses_no_step() {
    let (_dir, path) = temp_log();
    let shop = Shop::default();
    *shop.lock_file_in_charge.lock().unwrap() = Some(path.clone());
    let saga = shop.saga();
    let id = SagaId::new("busy-1");
    let (events, sink) = events_sink();
    runtime().block_on(async {
        let log = SqliteLog::open_with(
            &path,
            SqliteOptions::new().busy_timeout(Duration::from_millis(100)),
        )
        .unwrap();
        let o = Orchestrator::builder(log)
            .saga(&saga)
            .on_event(sink)
            .build()
            .unwrap();
        let err = o
            .start_with(&saga, order(2), StartOptions::new().id(id.clone()))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, SagaError::Log(LogError::Sqlite { .. })),
            "{err:?}"
        );
        assert!(err.to_string().contains("locked"), "{err}");
        let seen: Vec<_> = events
            .lock()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e.transition.kind(),
                    e.transition.step().map(|s| s.name.clone()),
                )
            })
            .collect();
        assert_eq!(
            seen.last().unwrap(),
            &("step_started", Some("charge".to_owned())),
            "{seen:?}"
        );
        // The database comes back.
        drop(shop.lock.lock().unwrap().take());
        let history = o.history(&id).await.unwrap();
        assert_eq!(
            kinds(&history),
            [
                "saga_started",
                "step_started",
                "step_completed",
                "step_started"
            ]
        );
        assert_eq!(
            o.get(&id).await.unwrap().unwrap().status,
            SagaStatus::Running
        );
    });
    runtime().block_on(async {
        let o = shop_orchestrator(&path, &saga, 3);
        recover_one(&o, SagaStatus::Completed).await;
    });
    assert_eq!(shop.effects(), CHARGED_TWICE);
    let keys = shop.keys_of("do charge");
    assert_eq!(keys[0], keys[1]);
}

/// After a log error the saga "stays in the log as last committed" and is
/// continued as after a dropped `start` future (`SagaError::Log`): on
/// SQLite, the orchestrator whose call failed keeps its lease (`resume`
/// answers `Busy`), and a process that reopens the log continues it, once
/// the database is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_log_error_a_reopened_log_continues_the_saga() {
    let (_dir, path) = temp_log();
    let shop = Shop::default();
    *shop.lock_file_in_charge.lock().unwrap() = Some(path.clone());
    let saga = shop.saga();
    let id = SagaId::new("busy-2");
    let log = SqliteLog::open_with(
        &path,
        SqliteOptions::new().busy_timeout(Duration::from_millis(100)),
    )
    .unwrap();
    let o = Orchestrator::builder(log).saga(&saga).build().unwrap();
    let err = o
        .start_with(&saga, order(3), StartOptions::new().id(id.clone()))
        .await
        .unwrap_err();
    assert!(matches!(&err, SagaError::Log(_)), "{err:?}");
    drop(shop.lock.lock().unwrap().take());
    let status = o.get(&id).await.unwrap().map(|r| r.status);
    if status.is_some() {
        let held = o.resume(&id).await;
        assert!(matches!(&held, Err(SagaError::Busy(_))), "{held:?}");
    }
    drop(o);
    let reopened = shop_orchestrator(&path, &saga, 3);
    let report = reopened.recover().await.unwrap();
    match status {
        // Logged before the error: continued to its end.
        Some(_) => {
            assert_eq!(report.outcomes.len(), 1, "{report:?}");
            assert_eq!(report.outcomes[0].status, SagaStatus::Completed);
        }
        // Not logged at all: nothing to continue, and no step ran.
        None => {
            assert!(report.outcomes.is_empty(), "{report:?}");
            assert!(shop.effects().is_empty(), "{:?}", shop.effects());
        }
    }
}

/// A saga whose logged history is damaged fails only its own recovery, with
/// a typed error; the other sagas are recovered, and the damaged one stays in
/// the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_history_fails_only_its_own_saga() {
    let (_dir, path, shop, saga) = shop_case(Shop::default());
    {
        let o = shop_orchestrator(&path, &saga, 3);
        o.submit(&saga, order(1), StartOptions::new().id("odd"))
            .await
            .unwrap();
        o.submit(&saga, order(2), StartOptions::new().id("plain"))
            .await
            .unwrap();
    }
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.busy_timeout(Duration::from_secs(5)).unwrap();
        let changed = conn
            .execute(
                "UPDATE seawall_saga_transitions SET kind = 'vanished' WHERE saga_id = 'odd'",
                [],
            )
            .unwrap();
        assert_eq!(changed, 1);
    }
    let o = shop_orchestrator(&path, &saga, 3);
    let err = o.history(&SagaId::new("odd")).await.unwrap_err();
    assert!(
        matches!(&err, SagaError::Log(LogError::Corrupt { detail }) if detail.contains("vanished")),
        "{err:?}"
    );
    let report = o.recover().await.unwrap();
    assert_eq!(report.outcomes.len(), 1);
    assert_eq!(report.outcomes[0].id, SagaId::new("plain"));
    assert_eq!(report.outcomes[0].status, SagaStatus::Completed);
    assert_eq!(report.failures.len(), 1);
    assert_eq!(report.failures[0].saga_id, SagaId::new("odd"));
    assert!(
        matches!(
            &report.failures[0].error,
            SagaError::Log(LogError::Corrupt { .. })
        ),
        "{:?}",
        report.failures[0].error
    );
    assert!(o.get(&SagaId::new("odd")).await.unwrap().is_some());
    assert_eq!(shop.count("do reserve"), 1);
}

/// A definition that no longer fits a logged saga (a step removed) is
/// refused as a history mismatch; the saga stays, with a `recovery_failed`
/// transition, and the right build recovers it.
#[test]
fn a_definition_that_no_longer_fits_fails_recovery_and_the_saga_stays() {
    let (_dir, path, shop, saga) = shop_case(Shop::default().hanging(Hang::Before("ship")));
    crash_shop(&shop, &path, &saga, "v-1", order(4));
    runtime().block_on(async {
        let shorter = Saga::<Order>::builder("shop")
            .step(shop.step("reserve", |_ctx| Ok(0u8)))
            .build()
            .unwrap();
        let o = orchestrator_on(&path, &shorter);
        let report = o.recover().await.unwrap();
        assert!(report.outcomes.is_empty());
        assert_eq!(report.failures.len(), 1);
        assert!(
            matches!(&report.failures[0].error, SagaError::History { saga_id, .. } if saga_id.as_str() == "v-1"),
            "{:?}",
            report.failures[0].error
        );
        let id = SagaId::new("v-1");
        assert_eq!(o.get(&id).await.unwrap().unwrap().status, SagaStatus::Running);
        let history = o.history(&id).await.unwrap();
        assert_eq!(history.last().unwrap().transition.kind(), "recovery_failed");
    });
    runtime().block_on(async {
        let o = shop_orchestrator(&path, &saga, 3);
        let report = o.recover().await.unwrap();
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        assert_eq!(report.outcomes[0].status, SagaStatus::Completed);
    });
    assert_eq!(shop.effects(), RAN_ONCE);
}

/// Paths that cannot be a log: a directory, a file that starts like a
/// SQLite database but is garbage. Typed errors, no panic, and the file is
/// left as it was (no side files).
#[test]
fn paths_that_cannot_be_a_log_are_refused_with_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let err = SqliteLog::open(dir.path()).unwrap_err();
    assert!(
        matches!(
            err,
            LogError::Io { .. } | LogError::Sqlite { .. } | LogError::NotADatabase { .. }
        ),
        "{err:?}"
    );

    let path = dir.path().join("fake.db");
    let mut bytes = b"SQLite format 3\0".to_vec();
    // A fixed LCG rather than support's `Rng`: these are the garbage bytes
    // this case was written with.
    let mut x: u32 = 12345;
    while bytes.len() < 8192 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        bytes.push((x >> 16) as u8);
    }
    std::fs::write(&path, &bytes).unwrap();
    let err = SqliteLog::open(&path).unwrap_err();
    assert!(
        matches!(
            err,
            LogError::NotADatabase { .. } | LogError::Corrupt { .. } | LogError::Foreign { .. }
        ),
        "{err:?}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    for suffix in ["-wal", "-shm", "-journal"] {
        assert!(!Path::new(&format!("{}{suffix}", path.display())).exists());
    }

    // The header of a real database followed by zeros.
    let zeros = dir.path().join("zeros.db");
    let mut bytes = b"SQLite format 3\0".to_vec();
    bytes.extend_from_slice(&[0x10, 0x00, 1, 1, 0, 64, 32, 32]);
    bytes.resize(4096 * 2, 0);
    std::fs::write(&zeros, &bytes).unwrap();
    match SqliteLog::open(&zeros) {
        Err(
            LogError::NotADatabase { .. } | LogError::Corrupt { .. } | LogError::Foreign { .. },
        ) => assert_eq!(std::fs::read(&zeros).unwrap(), bytes),
        other => panic!("a database header over zeros opened as {other:?}"),
    }
}

/// A saga log cut short (its last pages lost): opening it or reading it gives
/// `Corrupt`, never a panic and never a silently shorter list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_log_reports_corruption() {
    let (_dir, path) = temp_log();
    let saga = Saga::<String>::builder("pad")
        .step(Step::new("one", |ctx: StepContext<String>| async move {
            Ok::<_, String>(ctx.input().len())
        }))
        .build()
        .unwrap();
    {
        let o = orchestrator_on(&path, &saga);
        for i in 0..200 {
            o.start_with(
                &saga,
                "x".repeat(300),
                StartOptions::new().id(format!("p{i:04}")),
            )
            .await
            .unwrap();
        }
    }
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.busy_timeout(Duration::from_secs(5)).unwrap();
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        conn.execute_batch("PRAGMA journal_mode = DELETE;").unwrap();
    }
    let len = std::fs::metadata(&path).unwrap().len();
    assert!(len > 40_000, "{len}");
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(len / 2).unwrap();
    drop(file);
    let err = match SqliteLog::open(&path) {
        Err(e) => e,
        Ok(log) => match log.list(&ListQuery::all().limit(1000)).await {
            Err(e) => e,
            Ok(list) => panic!("a log cut in half listed {} sagas of 200", list.len()),
        },
    };
    assert!(matches!(err, LogError::Corrupt { .. }), "{err:?}");
}

/// Input that cannot be serialised is refused before anything is logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_that_cannot_be_serialised_is_refused_before_logging() {
    let (_dir, path) = temp_log();
    type Weird = BTreeMap<(u8, u8), u8>;
    let saga = Saga::<Weird>::builder("weird")
        .step(Step::new("one", |_ctx: StepContext<Weird>| async {
            Ok::<_, String>(())
        }))
        .build()
        .unwrap();
    let o = orchestrator_on(&path, &saga);
    let err = o
        .start(&saga, BTreeMap::from([((1, 2), 3)]))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, SagaError::InputSerialize { name, .. } if name == "weird"),
        "{err:?}"
    );
    let err = o
        .submit(&saga, BTreeMap::from([((1, 2), 3)]), StartOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(err, SagaError::InputSerialize { .. }), "{err:?}");
    assert!(o.list(&ListQuery::all()).await.unwrap().is_empty());
}

// ---------------------------------------------------- deadlines and timeouts

/// A step bounded by a seawall pipeline timeout fails when it runs too long;
/// the earlier steps are undone and the timed-out step is not (only
/// completed steps are).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_timeout_fails_the_step_and_undoes_the_others() {
    let (_dir, path) = temp_log();
    let undone = Arc::new(Mutex::new(Vec::<String>::new()));
    let pipeline = Pipeline::builder("courier")
        .timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let saga = Saga::<u32>::builder("deliver")
        .step(undo_recorded(
            Step::new("pack", |_ctx: StepContext<u32>| async {
                Ok::<_, String>(())
            }),
            &undone,
        ))
        .step(
            undo_recorded(
                Step::new("courier", |_ctx: StepContext<u32>| async {
                    tokio::time::sleep(Duration::from_secs(20)).await;
                    Ok::<_, String>(())
                }),
                &undone,
            )
            .through(pipeline),
        )
        .build()
        .unwrap();
    let o = orchestrator_on(&path, &saga);
    let began = Instant::now();
    let outcome = o.start(&saga, 1).await.unwrap();
    assert!(began.elapsed() < Duration::from_secs(10));
    assert_eq!(outcome.status, SagaStatus::Compensated);
    let failure = outcome.failure.unwrap();
    assert_eq!(failure.step.name, "courier");
    assert!(!failure.deadline_exceeded);
    assert!(
        failure.error.to_lowercase().contains("time"),
        "{}",
        failure.error
    );
    assert_eq!(*undone.lock().unwrap(), ["pack"]);
}

/// With both a deadline and a timeout the earlier one holds; the steps see
/// it; the next stage does not start once it has passed (virtual clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_earlier_of_deadline_and_timeout_stops_the_next_stage() {
    let (_dir, path) = temp_log();
    let clock = VirtualClock::starting_at(Duration::from_secs(1_800_000_000));
    let seen = Arc::new(Mutex::new(
        Vec::<(Option<SystemTime>, Option<Duration>)>::new(),
    ));
    let ran = Arc::new(AtomicUsize::new(0));
    let (step_clock, s1, r2) = (clock.clone(), seen.clone(), ran.clone());
    let saga = Saga::<u32>::builder("slow")
        .step(
            Step::new("first", move |ctx: StepContext<u32>| {
                let (clock, seen) = (step_clock.clone(), s1.clone());
                async move {
                    seen.lock().unwrap().push((ctx.deadline(), ctx.remaining()));
                    clock.advance(Duration::from_secs(6));
                    Ok::<_, String>(())
                }
            })
            .compensate(|_ctx, ()| async { Ok::<_, String>(()) }),
        )
        .step(Step::new("second", move |_ctx: StepContext<u32>| {
            let ran = r2.clone();
            async move {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(())
            }
        }))
        .build()
        .unwrap();
    let o = builder_on(&path, &saga)
        .clock(clock.clone())
        .build()
        .unwrap();
    let now = UNIX_EPOCH + clock.now();
    let outcome = o
        .start_with(
            &saga,
            1,
            StartOptions::new()
                .timeout(Duration::from_secs(60))
                .deadline(now + Duration::from_secs(5)),
        )
        .await
        .unwrap();
    assert_eq!(outcome.status, SagaStatus::Compensated);
    let failure = outcome.failure.unwrap();
    assert!(failure.deadline_exceeded);
    assert_eq!(failure.step.name, "second");
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    assert_eq!(
        *seen.lock().unwrap(),
        [(
            Some(now + Duration::from_secs(5)),
            Some(Duration::from_secs(5))
        )]
    );
    let record = o.get(&outcome.id).await.unwrap().unwrap();
    assert_eq!(record.deadline, Some(now + Duration::from_secs(5)));
}

/// A saga whose deadline has already passed when it starts (or when a worker
/// picks it up) runs no step and ends compensated, the missed deadline
/// named on its first step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saga_already_past_its_deadline_runs_no_step() {
    let (_dir, path, shop, saga) = shop_case(Shop::default());
    let (events, sink) = events_sink();
    let o = builder_on(&path, &saga).on_event(sink).build().unwrap();
    let past = SystemTime::now() - Duration::from_secs(60);
    let outcome = o
        .start_with(
            &saga,
            order(1),
            StartOptions::new().id("late").deadline(past),
        )
        .await
        .unwrap();
    assert_eq!(outcome.status, SagaStatus::Compensated);
    let failure = outcome.failure.clone().unwrap();
    assert!(failure.deadline_exceeded);
    assert_eq!(
        (failure.step.index, failure.step.name.as_str()),
        (0, "reserve")
    );
    let history = o.history(&SagaId::new("late")).await.unwrap();
    assert_eq!(
        kinds(&history),
        ["saga_started", "deadline_exceeded", "saga_compensated"]
    );
    let seen: Vec<(&str, SagaStatus)> = events
        .lock()
        .unwrap()
        .iter()
        .map(|e| (e.transition.kind(), e.status))
        .collect();
    assert_eq!(
        seen,
        [
            ("saga_started", SagaStatus::Running),
            ("deadline_exceeded", SagaStatus::Compensating),
            ("saga_compensated", SagaStatus::Compensated)
        ]
    );

    let id = o
        .submit(&saga, order(2), StartOptions::new().deadline(past))
        .await
        .unwrap();
    let report = o.recover().await.unwrap();
    assert_eq!(report.outcomes.len(), 1);
    assert_eq!(report.outcomes[0].id, id);
    assert_eq!(report.outcomes[0].status, SagaStatus::Compensated);
    assert!(shop.effects().is_empty());
}

// ------------------------------------------------------------- cancellation

/// There is no cancel call: dropping the future of `start` (a caller's
/// timeout) is a crash. The saga is neither compensated nor finished; it
/// stays running in the log, and a process that reopens the file continues
/// it forward.
#[test]
fn dropping_the_start_future_leaves_the_saga_to_a_reopened_log() {
    let (_dir, path, shop, saga) = shop_case(Shop::default().hanging(Hang::After("charge")));
    let id = SagaId::new("cancel-1");
    runtime().block_on(async {
        let o = shop_orchestrator(&path, &saga, 3);
        let gave_up = tokio::time::timeout(
            Duration::from_millis(300),
            o.start_with(&saga, order(5), StartOptions::new().id(id.clone())),
        )
        .await;
        assert!(gave_up.is_err(), "the call should still be hanging");
        assert_eq!(
            o.get(&id).await.unwrap().unwrap().status,
            SagaStatus::Running
        );
        // Not this log instance's to recover (SQLite: one process per file).
        let report = o.recover().await.unwrap();
        assert!(report.outcomes.is_empty() && report.failures.is_empty());
        assert!(matches!(
            o.resume(&id).await.unwrap_err(),
            SagaError::Busy(_)
        ));
    });
    runtime().block_on(async {
        let o = shop_orchestrator(&path, &saga, 3);
        let report = o.recover().await.unwrap();
        assert_eq!(report.outcomes.len(), 1);
        assert_eq!(report.outcomes[0].status, SagaStatus::Completed);
    });
    assert_eq!(shop.effects(), CHARGED_TWICE);
}

// --------------------------------------------------------------- concurrency

/// Many sagas at once on one file: each ends as its input says, each history
/// is its own and numbered without gaps, each saga's events come in order,
/// and the listing by status and by page adds up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sagas_keep_their_own_histories_and_events() {
    let (_dir, path) = temp_log();
    let saga = Saga::<u32>::builder("batch")
        .step(
            Step::new("a", |ctx: StepContext<u32>| async move {
                tokio::task::yield_now().await;
                Ok::<_, String>(*ctx.input())
            })
            .compensate(|ctx, out: u32| async move {
                assert_eq!(out, *ctx.input());
                Ok::<_, String>(())
            }),
        )
        .step(Step::new("b", |ctx: StepContext<u32>| async move {
            let a: u32 = ctx.output("a").map_err(|e| e.to_string())?;
            if a.is_multiple_of(3) {
                return Err(format!("{a} is a multiple of three"));
            }
            Ok::<_, String>(a * 2)
        }))
        .build()
        .unwrap();
    let (events, sink) = events_sink();
    let o = builder_on(&path, &saga).on_event(sink).build().unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..48u32 {
        let (o, saga) = (o.clone(), saga.clone());
        tasks.spawn(async move {
            let outcome = o
                .start_with(&saga, i, StartOptions::new().id(format!("b{i:03}")))
                .await
                .unwrap();
            (i, outcome)
        });
    }
    while let Some(joined) = tasks.join_next().await {
        let (i, outcome) = joined.unwrap();
        let expected = if i.is_multiple_of(3) {
            SagaStatus::Compensated
        } else {
            SagaStatus::Completed
        };
        assert_eq!(outcome.status, expected, "saga {i}");
        if expected == SagaStatus::Completed {
            assert_eq!(outcome.output::<u32>("b").unwrap(), i * 2);
        }
    }
    let events = events.lock().unwrap().clone();
    for i in 0..48u32 {
        let id = SagaId::new(format!("b{i:03}"));
        let history = o.history(&id).await.unwrap();
        assert!(history.iter().enumerate().all(|(n, t)| t.seq as usize == n));
        let mine = events_of(&events, &id);
        assert_eq!(mine.len(), history.len(), "saga {i}");
        for (event, record) in mine.iter().zip(&history) {
            assert_eq!(
                (event.seq, &event.transition),
                (record.seq, &record.transition)
            );
        }
        let record = o.get(&id).await.unwrap().unwrap();
        assert_eq!(serde_json::from_str::<u32>(&record.input).unwrap(), i);
        assert!(record.created_at <= record.updated_at);
    }
    let completed = o
        .list(&ListQuery::status(SagaStatus::Completed).limit(1000))
        .await
        .unwrap();
    let compensated = o
        .list(&ListQuery::status(SagaStatus::Compensated).limit(1000))
        .await
        .unwrap();
    assert_eq!((completed.len(), compensated.len()), (32, 16));
    let mut paged = Vec::new();
    let mut query = ListQuery::all().limit(10);
    for _ in 0..20 {
        let page = o.list(&query).await.unwrap();
        let Some(last) = page.last() else { break };
        query = ListQuery::all().limit(10).after(last.id.clone());
        paged.extend(page);
    }
    let ids: Vec<String> = paged.iter().map(|r| r.id.to_string()).collect();
    let expected: Vec<String> = (0..48).map(|i| format!("b{i:03}")).collect();
    assert_eq!(ids, expected);
}

/// The same id started twice at once: one call runs the saga, the other is
/// refused with `AlreadyExists` before any of its steps runs. A submitted id
/// is taken too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_id_started_twice_at_once_runs_its_steps_once() {
    let (_dir, path, shop, saga) = shop_case(Shop::default());
    let o = shop_orchestrator(&path, &saga, 3);
    let first = o.start_with(&saga, order(1), StartOptions::new().id("twin"));
    let second = o.start_with(&saga, order(1), StartOptions::new().id("twin"));
    let (first, second) = tokio::join!(first, second);
    let (ok, refused) = match (first, second) {
        (Ok(ok), Err(e)) | (Err(e), Ok(ok)) => (ok, e),
        other => panic!("expected one start to win: {other:?}"),
    };
    assert_eq!(ok.status, SagaStatus::Completed);
    assert!(
        matches!(&refused, SagaError::Log(LogError::AlreadyExists(id)) if id.as_str() == "twin"),
        "{refused:?}"
    );
    assert_eq!(shop.effects(), RAN_ONCE);

    let id = o
        .submit(&saga, order(2), StartOptions::new().id("queued"))
        .await
        .unwrap();
    let err = o
        .start_with(&saga, order(2), StartOptions::new().id("queued"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, SagaError::Log(LogError::AlreadyExists(_))),
        "{err:?}"
    );
    assert_eq!(shop.effects().len(), 3);
    // The submitted saga has no worker: resume runs it.
    let outcome = o.resume(&id).await.unwrap();
    assert_eq!(outcome.status, SagaStatus::Completed);
    assert_eq!(shop.effects().len(), 6);
}

/// A worker on the SQLite file runs submitted sagas and reports them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serving_worker_runs_submitted_sagas() {
    let (_dir, path, _shop, saga) = shop_case(Shop::default().failing("ship"));
    let o = shop_orchestrator(&path, &saga, 3);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = {
        let o = o.clone();
        tokio::spawn(async move {
            o.serve(
                ServeOptions::new()
                    .poll_interval(Duration::from_millis(20))
                    .grace(Duration::from_secs(5)),
                async move {
                    let _ = stopped.await;
                },
            )
            .await
        })
    };
    for i in 0..4 {
        o.submit(&saga, order(i), StartOptions::new())
            .await
            .unwrap();
    }
    let o = &o;
    eventually(|| async move {
        let done = listed(o, SagaStatus::Compensated).await.len();
        (done == 4)
            .then_some(())
            .ok_or_else(|| format!("served {done} of 4"))
    })
    .await;
    stop.send(()).unwrap();
    let report = worker.await.unwrap().unwrap();
    assert_eq!(report.compensated, 4, "{report:?}");
    assert_eq!(report.failed + report.stuck + report.handed_back, 0);
}

// ------------------------------------------------ events and inspection

/// Every event is emitted once its transition is committed: when the
/// listener is called, the log already holds that transition. Across a
/// crash, the events of both processes together are the saga's history.
#[test]
fn events_follow_commits_and_add_up_to_the_history_across_a_crash() {
    let (_dir, path, shop, saga) = shop_case(
        Shop::default()
            .failing("ship")
            .hanging(Hang::UndoAfter("charge")),
    );
    let checked = Arc::new(AtomicUsize::new(0));
    let problems = Arc::new(Mutex::new(Vec::<String>::new()));
    let (events, _) = events_sink();
    let with_listener = |log: SqliteLog| {
        let (reader, events, checked, problems) = (
            log.clone(),
            events.clone(),
            checked.clone(),
            problems.clone(),
        );
        Orchestrator::builder(log)
            .saga(&saga)
            .compensation_retry(Retry::constant(Duration::ZERO).max_attempts(3))
            .on_event(move |e: &SagaEvent| {
                events.lock().unwrap().push(e.clone());
                let (reader, id) = (reader.clone(), e.saga_id.clone());
                let history = std::thread::scope(|s| {
                    s.spawn(|| {
                        tokio::runtime::Builder::new_current_thread()
                            .build()
                            .unwrap()
                            .block_on(reader.history(&id))
                    })
                    .join()
                    .unwrap()
                });
                checked.fetch_add(1, Ordering::SeqCst);
                match history {
                    Ok(h)
                        if h.iter()
                            .any(|t| t.seq == e.seq && t.transition == e.transition) => {}
                    other => problems.lock().unwrap().push(format!(
                        "event {} {} not in the log: {other:?}",
                        e.seq,
                        e.transition.kind()
                    )),
                }
            })
            .build()
            .unwrap()
    };
    let listening = with_listener(SqliteLog::open(&path).unwrap());
    crash_at_hang(&shop, listening, &saga, "ev-1", order(6));
    runtime().block_on(async {
        let o = with_listener(SqliteLog::open(&path).unwrap());
        let report = o.recover().await.unwrap();
        assert_eq!(report.outcomes[0].status, SagaStatus::Compensated);
        let history = o.history(&SagaId::new("ev-1")).await.unwrap();
        let events = events.lock().unwrap().clone();
        let seqs: Vec<u32> = events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (0..history.len() as u32).collect::<Vec<_>>());
        for (event, record) in events.iter().zip(&history) {
            assert_eq!(event.transition, record.transition);
            assert_eq!(event.saga_name.as_ref(), "shop");
        }
        assert_eq!(events.last().unwrap().status, SagaStatus::Compensated);
    });
    assert!(
        problems.lock().unwrap().is_empty(),
        "{:?}",
        problems.lock().unwrap()
    );
    assert!(checked.load(Ordering::SeqCst) > 10);
}

/// Inspection of what is not there: `get` says none, `history` and `resume`
/// say not found; an empty id is refused; the listing by status and limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspecting_missing_sagas_and_listing_by_status() {
    let (_dir, path, _shop, saga) = shop_case(Shop::default());
    let o = shop_orchestrator(&path, &saga, 3);
    let missing = SagaId::new("nope");
    assert!(o.get(&missing).await.unwrap().is_none());
    assert!(matches!(
        o.history(&missing).await.unwrap_err(),
        SagaError::NotFound(id) if id == missing
    ));
    assert!(matches!(
        o.resume(&missing).await.unwrap_err(),
        SagaError::NotFound(_)
    ));
    let err = o
        .start_with(&saga, order(1), StartOptions::new().id(""))
        .await
        .unwrap_err();
    assert!(matches!(err, SagaError::InvalidId(_)), "{err:?}");
    let other = Saga::<Order>::builder("other")
        .step(Step::new("x", |_ctx: StepContext<Order>| async {
            Ok::<_, String>(())
        }))
        .build()
        .unwrap();
    let err = o.start(&other, order(1)).await.unwrap_err();
    assert!(
        matches!(err, SagaError::NotRegistered { ref name, saga_id: None } if name == "other"),
        "{err:?}"
    );

    for i in 0..3 {
        o.start_with(&saga, order(i), StartOptions::new().id(format!("k{i}")))
            .await
            .unwrap();
    }
    o.submit(&saga, order(9), StartOptions::new().id("k9"))
        .await
        .unwrap();
    let running = listed(&o, SagaStatus::Running).await;
    assert_eq!(
        running.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["k9"]
    );
    assert_eq!(running[0].name, "shop");
    assert_eq!(running[0].deadline, None);
    assert_eq!(
        serde_json::from_str::<Order>(&running[0].input).unwrap(),
        order(9)
    );
    assert_eq!(o.list(&ListQuery::all().limit(2)).await.unwrap().len(), 2);
    assert!(listed(&o, SagaStatus::Stuck).await.is_empty());
    let history = o.history(&SagaId::new("k9")).await.unwrap();
    assert_eq!(kinds(&history), ["saga_started"]);
    // The idempotency key names saga, step index, step name and phase.
    let key = seawall_saga::IdempotencyKey::new(&SagaId::new("k1"), 2, "ship", Phase::Compensation);
    assert_eq!(key.as_str(), "k1/2/ship/compensation");
}

// ------------------------------------------------------ out-of-range options

/// "No timeout, really": a timeout of `Duration::MAX` is an option like any
/// other. Starting with it gives an outcome (a deadline far in the future,
/// or none) or a typed error, not a panic in the caller's task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_timeout_is_not_a_panic() {
    let (_dir, path, _shop, saga) = shop_case(Shop::default());
    let o = shop_orchestrator(&path, &saga, 3);
    let started = {
        let (o, saga) = (o.clone(), saga.clone());
        tokio::spawn(async move {
            o.start_with(
                &saga,
                order(1),
                StartOptions::new().id("forever").timeout(Duration::MAX),
            )
            .await
        })
        .await
    };
    not_a_panic("start_with", started, |outcome| {
        assert_eq!(outcome.status, SagaStatus::Completed)
    });
}

/// A busy timeout of a month is an option of the log; opening with it gives
/// a log or a typed error (`LogError::Config` exists for invalid options),
/// not a panic.
#[test]
fn a_long_busy_timeout_is_not_a_panic() {
    let (_dir, path) = temp_log();
    let opened = std::panic::catch_unwind(|| {
        SqliteLog::open_with(
            &path,
            SqliteOptions::new().busy_timeout(Duration::from_secs(30 * 24 * 3600)),
        )
        .map(drop)
    });
    let opened = opened.map_err(|_| "on a 30-day busy timeout");
    not_a_panic("SqliteLog::open_with", opened, |()| {});
}

/// A worker asked never to poll (it is woken by this orchestrator's own
/// submissions on SQLite) serves, rather than panicking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_never_polls_is_not_a_panic() {
    let (_dir, path, _shop, saga) = shop_case(Shop::default());
    let o = shop_orchestrator(&path, &saga, 3);
    let served = {
        let o = o.clone();
        tokio::spawn(async move {
            o.serve(
                ServeOptions::new().poll_interval(Duration::MAX),
                tokio::time::sleep(Duration::from_millis(100)),
            )
            .await
        })
        .await
    };
    not_a_panic("serve", served, |report| assert_eq!(report.failed, 0));
}

// -------------------------------------------------------- serving workers

/// A worker shut down while a saga runs stops it as a crash would and hands
/// it back: its lease released, so this same process continues it at once
/// (the interrupted step again, with the same key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_shut_down_mid_saga_hands_it_back() {
    let (_dir, path, shop, saga) = shop_case(Shop::default().hanging(Hang::After("charge")));
    let o = shop_orchestrator(&path, &saga, 3);
    let id = o
        .submit(&saga, order(4), StartOptions::new().id("served"))
        .await
        .unwrap();
    let reached = shop.reached.clone();
    let report = o
        .serve(
            ServeOptions::new()
                .poll_interval(Duration::from_millis(20))
                .grace(Duration::from_millis(50)),
            async move {
                let _ = tokio::time::timeout(Duration::from_secs(10), reached.notified()).await;
            },
        )
        .await
        .unwrap();
    assert_eq!(report.handed_back, 1, "{report:?}");
    assert_eq!(
        o.get(&id).await.unwrap().unwrap().status,
        SagaStatus::Running
    );
    let recovered = o.recover().await.unwrap();
    assert_eq!(recovered.outcomes.len(), 1, "{:?}", recovered.failures);
    assert_eq!(recovered.outcomes[0].status, SagaStatus::Completed);
    assert_eq!(shop.effects(), CHARGED_TWICE);
    let keys = shop.keys_of("do charge");
    assert_eq!(keys[0], keys[1]);
}

// ----------------------------------------------------------------- the outbox

mod flaky_broker {
    use std::sync::Mutex;
    use std::time::Duration;

    use seawall_saga::broker::{
        Broker, BrokerError, BrokerFuture, Delivery, Envelope, Subscription,
    };

    /// Keeps what is published; the first `lose_acks` publications are
    /// appended but answered with a failure (the acknowledgement was lost).
    #[derive(Default)]
    pub(crate) struct Flaky {
        pub(crate) published: Mutex<Vec<Envelope>>,
        pub(crate) lose_acks: Mutex<u32>,
    }

    fn unused<'a, T: Send + 'a>() -> BrokerFuture<'a, T> {
        Box::pin(async {
            Err(BrokerError::Refused {
                operation: "unused".into(),
                detail: "not part of this test".into(),
            })
        })
    }

    impl Broker for Flaky {
        fn publish<'a>(&'a self, _: &'a str, events: &'a [Envelope]) -> BrokerFuture<'a, ()> {
            self.published.lock().unwrap().extend_from_slice(events);
            let mut lose = self.lose_acks.lock().unwrap();
            let failed = *lose > 0;
            if failed {
                *lose -= 1;
            }
            Box::pin(async move {
                if failed {
                    Err(BrokerError::Unavailable {
                        operation: "publishing".into(),
                        detail: "connection reset".into(),
                    })
                } else {
                    Ok(())
                }
            })
        }
        fn create_group<'a>(&'a self, _: &'a Subscription) -> BrokerFuture<'a, ()> {
            unused()
        }
        fn read<'a>(
            &'a self,
            _: &'a Subscription,
            _: usize,
            _: Duration,
        ) -> BrokerFuture<'a, Vec<Delivery>> {
            unused()
        }
        fn ack<'a>(&'a self, _: &'a Subscription, _: &'a [String]) -> BrokerFuture<'a, ()> {
            unused()
        }
        fn claim_stale<'a>(
            &'a self,
            _: &'a Subscription,
            _: Duration,
            _: usize,
        ) -> BrokerFuture<'a, Vec<Delivery>> {
            unused()
        }
        fn dead_letter<'a>(
            &'a self,
            _: &'a Subscription,
            _: &'a Delivery,
            _: &'a str,
        ) -> BrokerFuture<'a, ()> {
            unused()
        }
    }
}

/// Events written in a committed transaction are relayed in order, at least
/// once, each publication with the same event id; a rolled back one never
/// is (its row id was never committed, so the next event may take it); a
/// consumer's inbox applies each event once; ids are not reused after a
/// purge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_events_are_relayed_at_least_once_and_applied_once() {
    use seawall_saga::outbox::{self, Inbox, Outbox, Relay, RelayOptions};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("service.db");
    let mut db = rusqlite::Connection::open(&path).unwrap();
    db.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE orders (id TEXT PRIMARY KEY);")
        .unwrap();
    outbox::migrate(&db).unwrap();
    outbox::migrate(&db).unwrap();
    for i in 0..5 {
        let tx = db.transaction().unwrap();
        tx.execute("INSERT INTO orders VALUES (?1)", [format!("o-{i}")])
            .unwrap();
        Outbox::enqueue(&tx, &format!("o-{i}"), "placed", &format!("{{\"n\":{i}}}")).unwrap();
        if i == 2 {
            tx.rollback().unwrap();
        } else {
            tx.commit().unwrap();
        }
    }
    let broker = Arc::new(flaky_broker::Flaky::default());
    *broker.lose_acks.lock().unwrap() = 1;
    let relay = Relay::open(
        &path,
        broker.clone(),
        RelayOptions::new("shop", "orders").batch(2),
    )
    .unwrap();
    assert_eq!(relay.pending().await.unwrap(), 4);
    assert!(relay.relay_once().await.is_err());
    assert_eq!(relay.pending().await.unwrap(), 4);
    let mut rounds = 0;
    while relay.relay_once().await.unwrap() > 0 {
        rounds += 1;
        assert!(rounds < 10);
    }
    assert_eq!(relay.pending().await.unwrap(), 0);
    let published = broker.published.lock().unwrap().clone();
    let ids: Vec<&str> = published.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(
        ids,
        ["shop:1", "shop:2", "shop:1", "shop:2", "shop:3", "shop:4"]
    );
    let aggregates: Vec<&str> = published.iter().map(|e| e.aggregate.as_str()).collect();
    assert_eq!(aggregates, ["o-0", "o-1", "o-0", "o-1", "o-3", "o-4"]);
    assert!(!aggregates.contains(&"o-2"));

    let mut applied = Vec::new();
    for envelope in &published {
        let tx = db.transaction().unwrap();
        if Inbox::handle(&tx, "billing", &envelope.event_id).unwrap() {
            applied.push(envelope.aggregate.clone());
        }
        tx.commit().unwrap();
    }
    assert_eq!(applied, ["o-0", "o-1", "o-3", "o-4"]);

    assert_eq!(relay.purge_sent(Duration::ZERO).await.unwrap(), 4);
    let tx = db.transaction().unwrap();
    let next = Outbox::enqueue(&tx, "o-5", "placed", "{}").unwrap();
    tx.commit().unwrap();
    assert_eq!(next, 5, "row ids are not reused after a purge");
}

/// What a step's action and its compensation are told: saga, step, phase,
/// attempt, key, input and the earlier outputs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_step_context_names_the_effect() {
    let (_dir, path) = temp_log();
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let (s1, s2, s3) = (seen.clone(), seen.clone(), seen.clone());
    let describe = |ctx: &StepContext<String>| {
        format!(
            "{} {} {}#{} {} attempt {} key {} input {}",
            ctx.saga_id(),
            ctx.saga_name(),
            ctx.step_name(),
            ctx.step_index(),
            ctx.phase(),
            ctx.attempt(),
            ctx.idempotency_key(),
            ctx.input_arc()
        )
    };
    let saga = Saga::<String>::builder("ctx")
        .step(
            Step::new("first", move |ctx: StepContext<String>| {
                let seen = s1.clone();
                async move {
                    assert!(ctx.output_json("first").is_none());
                    assert!(ctx.deadline().is_none() && ctx.remaining().is_none());
                    seen.lock().unwrap().push(describe(&ctx));
                    Ok::<_, String>(41u32)
                }
            })
            .compensate(move |ctx, out: u32| {
                let seen = s2.clone();
                async move {
                    assert_eq!(out, 41);
                    seen.lock().unwrap().push(describe(&ctx));
                    Ok::<_, String>(())
                }
            }),
        )
        .step(Step::new("second", move |ctx: StepContext<String>| {
            let seen = s3.clone();
            async move {
                let first: u32 = ctx.output("first").map_err(|e| e.to_string())?;
                assert!(matches!(
                    ctx.output::<String>("first"),
                    Err(OutputError::Deserialize { .. })
                ));
                seen.lock()
                    .unwrap()
                    .push(format!("{} saw {first}", describe(&ctx)));
                Err::<(), _>("stop".to_owned())
            }
        }))
        .build()
        .unwrap();
    let o = orchestrator_on(&path, &saga);
    let outcome = o
        .start_with(&saga, "in".to_owned(), StartOptions::new().id("cx"))
        .await
        .unwrap();
    assert_eq!(outcome.status, SagaStatus::Compensated);
    assert_eq!(
        *seen.lock().unwrap(),
        [
            "cx ctx first#0 action attempt 1 key cx/0/first/action input in",
            "cx ctx second#1 action attempt 1 key cx/1/second/action input in saw 41",
            "cx ctx first#0 compensation attempt 1 key cx/0/first/compensation input in",
        ]
    );
}

/// A wall clock that moves on by one millisecond at every reading: time
/// passes between any two things the orchestrator does.
#[derive(Debug, Clone, Default)]
struct TickingClock {
    millis: Arc<std::sync::atomic::AtomicU64>,
}

impl TickingClock {
    fn starting_at(millis: u64) -> Self {
        TickingClock {
            millis: Arc::new(std::sync::atomic::AtomicU64::new(millis)),
        }
    }
}

impl seawall::Clock for TickingClock {
    fn now(&self) -> Duration {
        Duration::from_millis(self.millis.fetch_add(1, Ordering::SeqCst))
    }
    fn sleep(&self, duration: Duration) -> seawall::clock::BoxSleep {
        self.millis.fetch_add(
            u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
        Box::pin(async {})
    }
    fn sleep_blocking(&self, duration: Duration) {
        self.millis.fetch_add(
            u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }
}

impl seawall_saga::WallClock for TickingClock {
    fn wall_time(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.millis.fetch_add(1, Ordering::SeqCst))
    }
}

/// `SagaEvent::at` is "when it was committed (... the `TransitionRecord::at`
/// the log keeps)". On a clock that moves between the saga's creation and
/// its first commit, every event still carries the instant its transition
/// has in the log: for a saga started and driven at once, for one whose
/// deadline had passed, and for a submitted one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_carries_the_instant_its_transition_has_in_the_log() {
    let (_dir, path, _shop, saga) = shop_case(Shop::default().failing("ship"));
    let (events, sink) = events_sink();
    let clock = TickingClock::starting_at(1_800_000_000_000);
    let o = builder_on(&path, &saga)
        .clock(clock.clone())
        .compensation_retry(Retry::constant(Duration::ZERO).max_attempts(2))
        .on_event(sink)
        .build()
        .unwrap();
    o.start_with(&saga, order(1), StartOptions::new().id("t-run"))
        .await
        .unwrap();
    o.start_with(
        &saga,
        order(2),
        StartOptions::new()
            .id("t-late")
            .deadline(UNIX_EPOCH + Duration::from_millis(1_000)),
    )
    .await
    .unwrap();
    o.submit(&saga, order(3), StartOptions::new().id("t-sub"))
        .await
        .unwrap();
    o.recover().await.unwrap();
    let events = events.lock().unwrap().clone();
    let mut mismatches = Vec::new();
    for id in ["t-run", "t-late", "t-sub"] {
        let id = SagaId::new(id);
        let history = o.history(&id).await.unwrap();
        let mine = events_of(&events, &id);
        assert_eq!(mine.len(), history.len(), "{id}");
        for (event, record) in mine.iter().zip(&history) {
            assert_eq!(event.seq, record.seq);
            if event.at != record.at {
                mismatches.push(format!(
                    "{id} seq {} {}: event at {:?}, log at {:?}",
                    record.seq,
                    record.transition.kind(),
                    event.at.duration_since(UNIX_EPOCH).unwrap(),
                    record.at.duration_since(UNIX_EPOCH).unwrap()
                ));
            }
        }
    }
    assert!(mismatches.is_empty(), "{mismatches:#?}");
}
