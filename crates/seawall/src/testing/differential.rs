//! The differential corpus of the pipeline, parametrised by the store: a
//! set of scenarios, each a pipeline and a list of calls of a scripted
//! operation, run several ways that must not change anything a user can
//! observe:
//!
//! - sync `call` and async `run`;
//! - with no listener and with a listener (`.on_event(|_| {})`);
//! - on a virtual clock starting at 0 and on one advanced by 10^6 s before
//!   the pipeline is built;
//! - with the `tracing` feature, also with a `tracing` subscriber that
//!   wants every event of seawall, installed around the run.
//!
//! Each run has a fresh store from the caller's factory (the in-memory
//! store, or a remote store under a fresh prefix), a unique pipeline name
//! and the same seeded random source. All runs of a scenario must agree,
//! call by call, on the result (Ok value, or error kind, reason,
//! retry_after), the number of operation calls, the sleeps the pipeline
//! asked of its clock (durations and start times relative to the clock's
//! start), the time the call took, the results of nested calls and the
//! store state after the call (`circuit_metrics`, `in_flight`, for the
//! call's partition and the root): [`check`]. The runs on two stores must
//! agree mode by mode on the same observables: [`compare`].
//!
//! Async timeouts drop the operation's future at the deadline while sync
//! timeouts are cooperative (the crate docs and [`crate::timeout`] say so):
//! scenarios with a timeout that expires compare sync runs with sync runs
//! and async runs with async runs only ([`Scenario::flavors_agree`]).
//! Scenarios with hedging run async only ([`Scenario::runs_in`]); their
//! attempts run concurrently, each taking the next step of the script in
//! the order the attempts start.
//!
//! A store other than the memory store (which answers in place) holds the
//! virtual clock while one of its requests is in flight, so the sleeps of
//! the other attempts of a hedged call do not run ahead of its answer.
//!
//! Each scenario also states the result a few calls must have, so that a
//! scenario that stops exercising what it is named after fails too.
//!
//! The corpus is stated once, here, so that the in-memory store, the
//! reference model of the stateful policies ([`ModelStore`]) and every
//! other store (seawall-redis runs it on a real server, on the caller's
//! clock) run the very same scenarios:
//!
//! ```
//! use seawall::testing::differential::{self, corpus};
//! use seawall::MemoryStore;
//!
//! let scenario = corpus().into_iter().find(|s| s.name() == "rate_gcra").unwrap();
//! let runs = differential::run_all(&scenario, MemoryStore::new);
//! let problems = differential::check(&scenario, &runs);
//! assert!(problems.is_empty(), "{}", differential::report(&scenario, &problems, &runs));
//! ```

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::breaker::CircuitMetrics;
use crate::breaker::{CircuitControl, CircuitTransition};
use crate::clock::BoxSleep;
use crate::context::PartitionKey;
use crate::error::StoreError;
use crate::pipeline::{ErrorType, Handles, HandlesSync, Kind, WithFallback};
use crate::store::{
    Admission, AdmitRequest, Permit, Record, Recorded, Reservation, Reserve, ResourceSpec,
    ResourceState, StateStore, StoreFuture,
};
use crate::testing::{SeededRandom, VirtualClock};
use crate::{
    Bulkhead, CircuitBreaker, Clock, Context, Cooldown, Error, Hedging, Jitter, Pipeline,
    PipelineBuilder, RateLimiter, Retry, RetryBudget, Timeout, Verdict,
};

// ------------------------------------------------------------ the helpers

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The large offset a clock is advanced by before a pipeline is built.
const FAR: Duration = Duration::from_secs(1_000_000);

/// A pipeline name no other run uses.
fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The operation's error in these scenarios.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Boom(u32);

impl std::fmt::Display for Boom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "boom {}", self.0)
    }
}

impl std::error::Error for Boom {}

/// A current-thread runtime for the async runs: a record is then always
/// awaited before the call returns (a store may send a record without
/// waiting for its answer only on a multi-thread runtime), so the state
/// read after a call is the state the call left.
fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread tokio runtime")
}

/// One sleep a pipeline asked of its clock during a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SleepEntry {
    /// When the sleep started, relative to the clock's start.
    pub at: Duration,
    /// How long it was.
    pub duration: Duration,
}

/// A virtual clock that logs every sleep the pipeline asks of it (retry
/// waits, deferrals, async timeout timers), with its start relative to
/// where the clock started.
#[derive(Debug, Clone)]
struct LoggingClock {
    inner: VirtualClock,
    origin: Duration,
    sleeps: Arc<Mutex<Vec<SleepEntry>>>,
}

impl LoggingClock {
    fn new(inner: VirtualClock) -> Self {
        LoggingClock {
            origin: inner.now(),
            inner,
            sleeps: Arc::default(),
        }
    }

    /// Time since the clock's start.
    fn elapsed(&self) -> Duration {
        self.inner.now() - self.origin
    }

    fn sleeps(&self) -> Vec<SleepEntry> {
        self.sleeps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn log(&self, duration: Duration) {
        let at = self.elapsed();
        self.sleeps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(SleepEntry { at, duration });
    }
}

impl Clock for LoggingClock {
    fn now(&self) -> Duration {
        self.inner.now()
    }
    fn sleep(&self, duration: Duration) -> BoxSleep {
        self.log(duration);
        Clock::sleep(&self.inner, duration)
    }
    fn sleep_blocking(&self, duration: Duration) {
        self.log(duration);
        self.inner.advance(duration)
    }
}

// ------------------------------------------------------------ the scripts

/// What one attempt of the scripted operation does.
#[derive(Debug, Clone)]
enum Step {
    /// Succeeds with this value.
    Ok(u32),
    /// Fails with `Boom(code)`. Without a classifier every error is a
    /// retryable failure; with [`classified`] the code says what it is (see
    /// [`verdict`]).
    Fail(u32),
    /// Runs this long on the virtual clock, then does the inner step.
    Slow(u64, Box<Step>),
    /// While the attempt runs (holding its permits), makes a nested call
    /// through the same pipeline, in the given partition, with this script;
    /// then succeeds with 0.
    Nested(Option<&'static str>, Vec<Step>),
}

use Step::{Fail, Nested, Ok as Okay};

fn slow(ms: u64, then: Step) -> Step {
    Step::Slow(ms, Box::new(then))
}

/// Retryable failure (the default for every error).
const RETRY: u32 = 1;
/// Aborted: not retried, a success for the breaker.
const ABORT: u32 = 2;
/// Throttled with a retry-after hint of 2 s.
const THROTTLED: u32 = 3;
/// A failure that is not retried.
const FAILURE: u32 = 4;
/// Ignored by the breaker, not retried.
const IGNORE: u32 = 5;

fn verdict(e: &Boom) -> Verdict {
    match e.0 {
        ABORT => Verdict::abort(),
        THROTTLED => Verdict::throttled().with_retry_after(secs(2)),
        FAILURE => Verdict::failure(),
        IGNORE => Verdict::ignore(),
        _ => Verdict::retry(),
    }
}

/// One call of a scenario.
#[derive(Debug, Clone)]
struct CallSpec {
    /// The clock is advanced this much before the call.
    before: Duration,
    /// The partition of the call, if any.
    key: Option<&'static str>,
    /// What each attempt does (the last step repeats).
    script: Vec<Step>,
    /// A text the result's `Debug` must contain (empty: no expectation).
    expect: &'static str,
}

fn call(script: Vec<Step>, expect: &'static str) -> CallSpec {
    CallSpec {
        before: Duration::ZERO,
        key: None,
        script,
        expect,
    }
}

fn after(before: Duration, script: Vec<Step>, expect: &'static str) -> CallSpec {
    CallSpec {
        before,
        ..call(script, expect)
    }
}

fn keyed(key: &'static str, before: Duration, script: Vec<Step>, expect: &'static str) -> CallSpec {
    CallSpec {
        before,
        key: Some(key),
        script,
        expect,
    }
}

// ----------------------------------------------------------- the pipelines

/// A built pipeline of one of the kinds the scenarios use.
enum Built {
    /// No classifier: every error is a retryable failure (the default).
    Plain(Pipeline),
    /// The classifier [`verdict`].
    Classified(Pipeline<ErrorType<Boom>>),
    /// A sync fallback answering 99.
    Fallback(Pipeline<WithFallback<u32, Boom>>),
}

macro_rules! with_pipeline {
    ($built:expr, $p:ident => $body:expr) => {
        match $built {
            Built::Plain($p) => $body,
            Built::Classified($p) => $body,
            Built::Fallback($p) => $body,
        }
    };
}

fn plain(b: PipelineBuilder) -> Built {
    Built::Plain(b.build().expect("a valid scenario pipeline"))
}

fn classified(b: PipelineBuilder) -> Built {
    Built::Classified(
        b.classify(verdict)
            .build()
            .expect("a valid scenario pipeline"),
    )
}

fn with_fallback(b: PipelineBuilder) -> Built {
    Built::Fallback(
        b.fallback_sync(|_: Error<Boom>, _| Ok::<u32, Boom>(99))
            .build()
            .expect("a valid scenario pipeline"),
    )
}

/// Whether sync and async runs of a scenario must agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavors {
    Agree,
    /// A timeout expires: sync and async legitimately differ.
    Differ,
    /// Hedging: async runs only (a blocking call on a pipeline with
    /// hedging is refused without running). Concurrent attempts need no
    /// more of the scripts: each attempt takes the next step in the order
    /// the attempts start, and a `Slow` step sleeps on the virtual clock
    /// while the others run.
    AsyncOnly,
}

/// One scenario of the corpus: a pipeline and the calls made through it.
pub struct Scenario {
    name: &'static str,
    flavors: Flavors,
    /// Declares the scenario's policies on a builder that already has its
    /// name, store, clock, random source and listener.
    build: Box<dyn Fn(PipelineBuilder) -> Built>,
    calls: Vec<CallSpec>,
}

impl std::fmt::Debug for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scenario")
            .field("name", &self.name)
            .field("flavors", &self.flavors)
            .field("calls", &self.calls)
            .finish_non_exhaustive()
    }
}

impl Scenario {
    /// The scenario's name (what it exercises).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// `false` when a timeout expires in the scenario: its sync and async
    /// runs then legitimately differ, and are compared each with runs of
    /// their own flavour only.
    pub fn flavors_agree(&self) -> bool {
        self.flavors != Flavors::Differ
    }

    /// Whether the scenario runs in `mode`: every mode, but the async
    /// ones only for a scenario with hedging.
    pub fn runs_in(&self, mode: Mode) -> bool {
        self.flavors != Flavors::AsyncOnly || mode.flavor == Flavor::Async
    }

    fn named(mut self, name: &'static str) -> Self {
        self.name = name;
        self
    }
}

fn scenario(
    flavors: Flavors,
    build: impl Fn(PipelineBuilder) -> Built + 'static,
    calls: Vec<CallSpec>,
) -> Scenario {
    Scenario {
        name: "",
        flavors,
        build: Box::new(build),
        calls,
    }
}

// ----------------------------------------------------------- the runs

/// How a call is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// `Pipeline::call`.
    Sync,
    /// `Pipeline::run` on a current-thread runtime.
    Async,
}

/// One way of running a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    /// Sync or async calls.
    pub flavor: Flavor,
    /// A listener that does nothing is added.
    pub listener: bool,
    /// The clock is advanced this much before the pipeline is built.
    pub offset: Duration,
    /// A `tracing` subscriber wanting every event of seawall is installed
    /// around the run (feature `tracing` only).
    pub tracing: bool,
}

/// The modes every scenario runs in: sync and async, with and without a
/// listener, on a clock at 0 and at 10^6 s; with the feature `tracing`,
/// also with a subscriber.
pub fn modes() -> Vec<Mode> {
    let mut v = Vec::new();
    for flavor in [Flavor::Sync, Flavor::Async] {
        for listener in [false, true] {
            for offset in [Duration::ZERO, FAR] {
                v.push(Mode {
                    flavor,
                    listener,
                    offset,
                    tracing: false,
                });
            }
        }
        if cfg!(feature = "tracing") {
            for offset in [Duration::ZERO, FAR] {
                v.push(Mode {
                    flavor,
                    listener: false,
                    offset,
                    tracing: true,
                });
            }
        }
    }
    v
}

/// Everything observed about one call.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    /// The result's `Debug`.
    pub result: String,
    /// How many times the operation was called.
    pub operation_calls: u32,
    /// The sleeps the pipeline asked of its clock during the call.
    pub sleeps: Vec<SleepEntry>,
    /// Clock time since the start of the run when the call returned.
    pub ended_at: Duration,
    /// The results of the calls nested in this one.
    pub nested: Vec<String>,
    /// `circuit_metrics` and `in_flight` of the root, then of the call's
    /// partition.
    pub state: Vec<String>,
}

/// One run of a scenario: its mode and what each call did.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// How the scenario was run.
    pub mode: Mode,
    /// What each call did, in order.
    pub calls: Vec<Observed>,
}

struct Env {
    clock: LoggingClock,
    calls: AtomicU32,
    nested: Mutex<Vec<String>>,
}

impl Env {
    fn nested(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.nested.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn step_sync<K: HandlesSync<u32, Boom>>(
    p: &Pipeline<K>,
    step: &Step,
    env: &Env,
) -> Result<u32, Boom> {
    match step {
        Step::Ok(v) => Ok(*v),
        Step::Fail(code) => Err(Boom(*code)),
        Step::Slow(n, then) => {
            env.clock.inner.advance(ms(*n));
            step_sync(p, then, env)
        }
        Step::Nested(key, script) => {
            let r = call_sync(p, *key, script, env);
            env.nested().push(format!("{r:?}"));
            Ok(0)
        }
    }
}

fn call_sync<K: HandlesSync<u32, Boom>>(
    p: &Pipeline<K>,
    key: Option<&'static str>,
    script: &[Step],
    env: &Env,
) -> Result<u32, Error<Boom>> {
    let attempt = Cell::new(0usize);
    let op = |_ctx: Context| {
        let i = attempt.get();
        attempt.set(i + 1);
        env.calls.fetch_add(1, Ordering::SeqCst);
        step_sync(p, &script[i.min(script.len() - 1)], env)
    };
    match key {
        None => p.call(op),
        Some(k) => p.partition(k).call(op),
    }
}

type Local<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

fn step_async<'a, K: Handles<u32, Boom>>(
    p: &'a Pipeline<K>,
    step: &'a Step,
    env: &'a Env,
) -> Local<'a, Result<u32, Boom>> {
    Box::pin(async move {
        match step {
            Step::Ok(v) => Ok(*v),
            Step::Fail(code) => Err(Boom(*code)),
            Step::Slow(n, then) => {
                Clock::sleep(&env.clock.inner, ms(*n)).await;
                step_async(p, then, env).await
            }
            Step::Nested(key, script) => {
                let r = call_async(p, *key, script, env).await;
                env.nested().push(format!("{r:?}"));
                Ok(0)
            }
        }
    })
}

fn call_async<'a, K: Handles<u32, Boom>>(
    p: &'a Pipeline<K>,
    key: Option<&'static str>,
    script: &'a [Step],
    env: &'a Env,
) -> Local<'a, Result<u32, Error<Boom>>> {
    Box::pin(async move {
        let attempt = Cell::new(0usize);
        let op = |_ctx: Context| {
            let i = attempt.get();
            attempt.set(i + 1);
            env.calls.fetch_add(1, Ordering::SeqCst);
            step_async(p, &script[i.min(script.len() - 1)], env)
        };
        match key {
            None => p.run(op).await,
            Some(k) => {
                let part = p.partition(k);
                part.run(op).await
            }
        }
    })
}

/// `circuit_metrics` and `in_flight` of the root, then of the call's
/// partition. A circuit's time in state counts from its last transition,
/// or from its first use (none before it), never from the clock's origin,
/// so it is the same on every clock.
fn state_of<K: Kind>(p: &Pipeline<K>, key: Option<&'static str>) -> Vec<String> {
    let circuit = |m: Result<CircuitMetrics, _>| m.ok();
    let mut v = vec![
        format!("root circuit {:?}", circuit(p.circuit_metrics())),
        format!("root in_flight {:?}", p.in_flight().ok()),
    ];
    if let Some(k) = key {
        let part = p.partition(k);
        v.push(format!("{k} circuit {:?}", circuit(part.circuit_metrics())));
        v.push(format!("{k} in_flight {:?}", part.in_flight().ok()));
    }
    v
}

/// Runs `scenario` once in `mode` on `store` (fresh: nothing of another
/// run in it).
pub fn run<S: StateStore>(scenario: &Scenario, mode: Mode, store: S) -> Run {
    #[cfg(feature = "tracing")]
    if mode.tracing {
        return tracing::subscriber::with_default(traced::Everything, || {
            run_here(scenario, mode, store)
        });
    }
    run_here(scenario, mode, store)
}

/// Runs `scenario` in every mode of [`modes`] it runs in
/// ([`Scenario::runs_in`]), each run on a fresh store from `store`.
pub fn run_all<S: StateStore>(scenario: &Scenario, mut store: impl FnMut() -> S) -> Vec<Run> {
    modes()
        .into_iter()
        .filter(|&mode| scenario.runs_in(mode))
        .map(|mode| run(scenario, mode, store()))
        .collect()
}

/// A subscriber that wants every event of seawall and drops it.
#[cfg(feature = "tracing")]
mod traced {
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    pub(super) struct Everything;

    impl Subscriber for Everything {
        fn enabled(&self, metadata: &Metadata<'_>) -> bool {
            metadata.target() == "seawall"
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, _: &Event<'_>) {}
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }
}

fn run_here<S: StateStore>(s: &Scenario, mode: Mode, store: S) -> Run {
    let clock = LoggingClock::new(VirtualClock::starting_at(mode.offset));
    let builder = Pipeline::builder(unique(s.name));
    // The memory store answers in place; any other store's requests hold
    // the virtual clock while they are in flight.
    let builder = match (&store as &dyn std::any::Any).downcast_ref::<crate::MemoryStore>() {
        Some(memory) => builder.store(memory.clone()),
        None => builder.store(Holding {
            store,
            clock: clock.inner.clone(),
        }),
    };
    let mut builder = builder.clock(clock.clone()).random(SeededRandom::new(42));
    if mode.listener {
        builder = builder.on_event(|_| {});
    }
    let built = (s.build)(builder);
    let env = Env {
        clock: clock.clone(),
        calls: AtomicU32::new(0),
        nested: Mutex::new(Vec::new()),
    };
    let runtime = rt();
    let mut observed = Vec::new();
    for c in &s.calls {
        clock.inner.advance(c.before);
        let calls_before = env.calls.load(Ordering::SeqCst);
        let sleeps_before = clock.sleeps().len();
        env.nested().clear();
        let result = with_pipeline!(&built, p => match mode.flavor {
            Flavor::Sync => call_sync(p, c.key, &c.script, &env),
            Flavor::Async => runtime.block_on(call_async(p, c.key, &c.script, &env)),
        });
        observed.push(Observed {
            result: format!("{result:?}"),
            operation_calls: env.calls.load(Ordering::SeqCst) - calls_before,
            sleeps: clock.sleeps()[sleeps_before..].to_vec(),
            ended_at: clock.elapsed(),
            nested: env.nested().clone(),
            state: with_pipeline!(&built, p => state_of(p, c.key)),
        });
    }
    Run {
        mode,
        calls: observed,
    }
}

/// A store whose requests hold the virtual clock while they are in
/// flight ([`VirtualClock::hold`]): the concurrent attempts of a hedged
/// call sleep on the virtual clock while one of them waits for a real
/// server, and a sleep polled then would move the clock to its end, ahead
/// of the answer (on the memory store, which answers in place, time never
/// moves during a request).
#[derive(Debug)]
struct Holding<S> {
    store: S,
    clock: VirtualClock,
}

impl<S: StateStore> StateStore for Holding<S> {
    fn bind(&self, spec: &ResourceSpec) -> Result<Arc<dyn ResourceState>, StoreError> {
        Ok(Arc::new(HoldingResource {
            inner: self.store.bind(spec)?,
            clock: self.clock.clone(),
        }))
    }
}

#[derive(Debug)]
struct HoldingResource {
    inner: Arc<dyn ResourceState>,
    clock: VirtualClock,
}

impl HoldingResource {
    /// `future`, holding the clock until it is answered.
    fn holding<'a, T: Send + 'a>(&self, future: StoreFuture<'a, T>) -> StoreFuture<'a, T> {
        let hold = self.clock.hold();
        StoreFuture::boxed(async move {
            let answer = future.await;
            drop(hold);
            answer
        })
    }
}

impl ResourceState for HoldingResource {
    fn admit(&self, request: &AdmitRequest<'_>) -> Result<Admission, StoreError> {
        self.inner.admit(request)
    }
    fn admit_async<'a>(&'a self, request: AdmitRequest<'a>) -> StoreFuture<'a, Admission> {
        self.holding(self.inner.admit_async(request))
    }
    fn admit_reserving(
        &self,
        request: &AdmitRequest<'_>,
        reserve: Reserve,
    ) -> Result<(Admission, Option<Reservation>), StoreError> {
        self.inner.admit_reserving(request, reserve)
    }
    fn admit_reserving_async<'a>(
        &'a self,
        request: AdmitRequest<'a>,
        reserve: Reserve,
    ) -> StoreFuture<'a, (Admission, Option<Reservation>)> {
        self.holding(self.inner.admit_reserving_async(request, reserve))
    }
    fn give_back_reservation(&self, partition: Option<&PartitionKey>, reservation: Reservation) {
        self.inner.give_back_reservation(partition, reservation)
    }
    fn record(&self, record: &Record<'_>) -> Result<Recorded, StoreError> {
        self.inner.record(record)
    }
    fn record_async<'a>(&'a self, record: Record<'a>) -> StoreFuture<'a, Recorded> {
        self.holding(self.inner.record_async(record))
    }
    fn release(&self, partition: Option<&PartitionKey>, permit: Permit) {
        self.inner.release(partition, permit)
    }
    fn circuit_metrics(
        &self,
        partition: Option<&PartitionKey>,
        now: Duration,
    ) -> Result<CircuitMetrics, StoreError> {
        self.inner.circuit_metrics(partition, now)
    }
    fn control_circuit(
        &self,
        partition: Option<&PartitionKey>,
        control: CircuitControl,
        now: Duration,
    ) -> Result<Option<CircuitTransition>, StoreError> {
        self.inner.control_circuit(partition, control, now)
    }
    fn in_flight(
        &self,
        partition: Option<&PartitionKey>,
        now: Duration,
    ) -> Result<u32, StoreError> {
        self.inner.in_flight(partition, now)
    }
    fn evict_idle(&self, now: Duration) -> usize {
        self.inner.evict_idle(now)
    }
    fn partitions(&self) -> usize {
        self.inner.partitions()
    }
}

/// A store that answers from the reference model of the stateful policies
/// ([`crate::model::Resource`], its circuit the breaker's model
/// [`crate::model::breaker::Model`]), process-local as the memory store
/// (a bulkhead slot is held until it is given back): the corpus run on it
/// checks that the memory store (and through it every store compared with
/// the memory store) answers each call of a scenario as the model does.
///
/// The model makes no rate-limit reservation (a call told to wait asks
/// again when its wait is over, which no scenario of the corpus tells
/// apart: none has two calls competing for one permit) and has no manual
/// control of the circuit (an error; no scenario uses it).
#[derive(Debug, Clone, Copy, Default)]
pub struct ModelStore;

impl StateStore for ModelStore {
    fn bind(&self, spec: &ResourceSpec) -> Result<Arc<dyn ResourceState>, StoreError> {
        Ok(Arc::new(ModelResource(Mutex::new(
            crate::model::Resource::new(spec),
        ))))
    }
}

#[derive(Debug)]
struct ModelResource(Mutex<crate::model::Resource<crate::model::breaker::Model>>);

impl ModelResource {
    fn model(
        &self,
    ) -> std::sync::MutexGuard<'_, crate::model::Resource<crate::model::breaker::Model>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ResourceState for ModelResource {
    fn admit(&self, request: &AdmitRequest<'_>) -> Result<Admission, StoreError> {
        Ok(self.model().admit(request))
    }
    fn record(&self, record: &Record<'_>) -> Result<Recorded, StoreError> {
        Ok(self.model().record(record))
    }
    fn release(&self, partition: Option<&PartitionKey>, permit: Permit) {
        self.model().release(partition, permit)
    }
    fn circuit_metrics(
        &self,
        partition: Option<&PartitionKey>,
        now: Duration,
    ) -> Result<CircuitMetrics, StoreError> {
        Ok(self
            .model()
            .circuit_metrics(partition, now)
            .unwrap_or_else(CircuitMetrics::closed_empty))
    }
    fn control_circuit(
        &self,
        _partition: Option<&PartitionKey>,
        _control: CircuitControl,
        _now: Duration,
    ) -> Result<Option<CircuitTransition>, StoreError> {
        Err(StoreError::Refused(
            "the reference model has no manual control of the circuit".into(),
        ))
    }
    fn in_flight(
        &self,
        partition: Option<&PartitionKey>,
        now: Duration,
    ) -> Result<u32, StoreError> {
        Ok(self.model().in_flight(partition, now))
    }
}

/// The differences between two runs, call by call and field by field, in
/// words (at most a few).
fn differences(a: &[Observed], b: &[Observed]) -> Vec<String> {
    let mut out = Vec::new();
    if a.len() != b.len() {
        out.push(format!("{} calls vs {}", a.len(), b.len()));
    }
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let fields = [
            (
                "result",
                format!("{:?}", x.result),
                format!("{:?}", y.result),
            ),
            (
                "operation calls",
                x.operation_calls.to_string(),
                y.operation_calls.to_string(),
            ),
            (
                "sleeps",
                format!("{:?}", x.sleeps),
                format!("{:?}", y.sleeps),
            ),
            (
                "end time",
                format!("{:?}", x.ended_at),
                format!("{:?}", y.ended_at),
            ),
            (
                "nested results",
                format!("{:?}", x.nested),
                format!("{:?}", y.nested),
            ),
            (
                "store state",
                format!("{:?}", x.state),
                format!("{:?}", y.state),
            ),
        ];
        for (what, l, r) in fields {
            if l != r {
                out.push(format!("call {i}: {what}: {l} vs {r}"));
            }
        }
    }
    out.truncate(4);
    out
}

/// The problems of the runs of one scenario on one store, in words: a run
/// that differs from the reference run (the first run, or the first run of
/// its flavour when sync and async legitimately differ), or a call whose
/// result is not the one the scenario states. Empty when all is well.
pub fn check(scenario: &Scenario, runs: &[Run]) -> Vec<String> {
    let mut problems = Vec::new();
    for run in runs {
        let Some(reference) = runs
            .iter()
            .find(|r| scenario.flavors_agree() || r.mode.flavor == run.mode.flavor)
        else {
            continue;
        };
        let d = differences(&reference.calls, &run.calls);
        if !d.is_empty() {
            problems.push(format!(
                "{:?} differs from {:?}:\n    {}",
                run.mode,
                reference.mode,
                d.join("\n    ")
            ));
        }
    }
    for run in runs {
        for (i, (c, o)) in scenario.calls.iter().zip(&run.calls).enumerate() {
            if !o.result.contains(c.expect) {
                problems.push(format!(
                    "{:?}: call {i} returned {}, expected it to contain {:?}",
                    run.mode, o.result, c.expect
                ));
            }
        }
    }
    problems
}

/// The differences, in words, between the runs of one scenario on two
/// stores, mode by mode: `runs` must have observed exactly what
/// `reference` did. A mode that only one side ran is a difference too.
pub fn compare(reference: &[Run], runs: &[Run]) -> Vec<String> {
    let mut problems = Vec::new();
    for run in runs {
        match reference.iter().find(|r| r.mode == run.mode) {
            None => problems.push(format!("{:?}: no reference run", run.mode)),
            Some(r) => {
                let d = differences(&r.calls, &run.calls);
                if !d.is_empty() {
                    problems.push(format!(
                        "{:?} differs from the reference:\n    {}",
                        run.mode,
                        d.join("\n    ")
                    ));
                }
            }
        }
    }
    for r in reference {
        if !runs.iter().any(|run| run.mode == r.mode) {
            problems.push(format!("{:?}: not run", r.mode));
        }
    }
    problems
}

/// A failure message: the scenario, its problems and its first run, call
/// by call.
pub fn report(scenario: &Scenario, problems: &[String], runs: &[Run]) -> String {
    let reference = runs.first().map_or_else(String::new, |r| {
        format!(
            "reference run ({:?}):\n  {}",
            r.mode,
            r.calls
                .iter()
                .enumerate()
                .map(|(i, o)| format!("{i}: {o:?}"))
                .collect::<Vec<_>>()
                .join("\n  ")
        )
    });
    format!(
        "scenario {}: {} problem(s):\n  {}\n{reference}",
        scenario.name,
        problems.len(),
        problems.join("\n  "),
    )
}

macro_rules! corpus {
    ($($name:ident => $scenario:expr;)*) => {
        vec![$(($scenario).named(stringify!($name)),)*]
    };
}

// ------------------------------------------------------------ the corpus

/// Every scenario of the corpus: each policy alone and with others,
/// failures, timeouts, deferrals, half-open probes, partitions, fallbacks.
pub fn corpus() -> Vec<Scenario> {
    corpus! {
        retry_exponential_full_jitter => scenario(
            Flavors::Agree,
            |b| plain(b.retry(
                Retry::exponential(ms(100)).cap(secs(1)).jitter(Jitter::Full).max_attempts(4),
            )),
            vec![
                call(vec![Fail(RETRY), Fail(RETRY), Okay(5)], "Ok(5)"),
                call(vec![Fail(RETRY)], "RetryExhausted { attempts: 4"),
                call(vec![Okay(6)], "Ok(6)"),
            ],
        );

        retry_decorrelated_equal_jitter => scenario(
            Flavors::Agree,
            |b| plain(b.retry(
                Retry::decorrelated(ms(50), secs(2)).jitter(Jitter::Equal).max_attempts(5),
            )),
            vec![
                call(vec![Fail(RETRY)], "RetryExhausted { attempts: 5"),
                call(vec![Fail(RETRY), Okay(1)], "Ok(1)"),
            ],
        );

        retry_linear_proportional_jitter => scenario(
            Flavors::Agree,
            |b| plain(b.retry(
                Retry::linear(ms(100)).cap(ms(250)).jitter(Jitter::Proportional(20.0)).max_attempts(4),
            )),
            vec![call(vec![Fail(RETRY), Fail(RETRY), Fail(RETRY), Okay(2)], "Ok(2)")],
        );

        retry_classified_errors => scenario(
            Flavors::Agree,
            |b| classified(b.retry(Retry::constant(ms(10)).max_attempts(3))),
            vec![
                call(vec![Fail(ABORT)], "Operation(Boom(2))"),
                call(vec![Fail(FAILURE)], "Operation(Boom(4))"),
                call(vec![Fail(IGNORE)], "Operation(Boom(5))"),
                // Throttled: retried after the 2 s hint, not the 10 ms backoff.
                call(vec![Fail(THROTTLED), Okay(1)], "Ok(1)"),
                call(vec![Fail(RETRY), Fail(ABORT)], "Operation(Boom(2))"),
            ],
        );

        retry_budget => scenario(
            Flavors::Agree,
            |b| plain(b.retry(
                Retry::constant(ms(10)).max_attempts(3).budget(RetryBudget::new(0.1, 1)),
            )),
            vec![
                call(vec![Fail(RETRY)], ""),
                call(vec![Fail(RETRY)], ""),
                call(vec![Fail(RETRY)], "RetryBudgetExhausted"),
            ],
        );

        retry_deadline_gives_up => scenario(
            Flavors::Agree,
            |b| plain(b.timeout(secs(1)).retry(Retry::constant(ms(400)).max_attempts(5))),
            vec![call(vec![Fail(RETRY)], "RetryExhausted { attempts: 3")],
        );

        breaker_consecutive => scenario(
            Flavors::Agree,
            |b| plain(b.circuit_breaker(CircuitBreaker::consecutive_failures(2).cooldown(secs(30)))),
            vec![
                call(vec![Okay(1)], "Ok(1)"),
                call(vec![Fail(RETRY)], "Operation"),
                call(vec![Fail(RETRY)], "Operation"),
                call(vec![Okay(2)], "CircuitOpen"),
                after(secs(10), vec![Okay(3)], "CircuitOpen"),
                after(secs(20), vec![Okay(4)], "Ok(4)"),
                call(vec![Fail(RETRY)], "Operation"),
                call(vec![Okay(5)], "Ok(5)"),
            ],
        );

        breaker_half_open_reopens_with_growth => scenario(
            Flavors::Agree,
            |b| plain(b.circuit_breaker(
                CircuitBreaker::consecutive_failures(1)
                    .cooldown(secs(10))
                    .cooldown_growth(2.0, secs(60))
                    .half_open_calls(2),
            )),
            vec![
                call(vec![Fail(RETRY)], "Operation"),
                after(secs(10), vec![Fail(RETRY)], "Operation"),
                after(secs(10), vec![Okay(1)], "CircuitOpen"),
                after(secs(10), vec![Okay(2)], "Ok(2)"),
                call(vec![Okay(3)], "Ok(3)"),
                call(vec![Okay(4)], "Ok(4)"),
            ],
        );

        breaker_half_open_refuses_beyond_its_probes => scenario(
            Flavors::Agree,
            |b| plain(b.circuit_breaker(
                CircuitBreaker::consecutive_failures(1).cooldown(secs(5)).half_open_calls(1),
            )),
            vec![
                call(vec![Fail(RETRY)], "Operation"),
                after(secs(5), vec![Nested(None, vec![Okay(1)])], "Ok(0)"),
                call(vec![Okay(2)], "Ok(2)"),
            ],
        );

        breaker_count_window => scenario(
            Flavors::Agree,
            |b| plain(b.circuit_breaker(
                CircuitBreaker::failure_rate(0.5).count_window(4).minimum_calls(4).cooldown(secs(5)),
            )),
            vec![
                call(vec![Okay(1)], "Ok(1)"),
                call(vec![Fail(RETRY)], "Operation"),
                call(vec![Okay(2)], "Ok(2)"),
                call(vec![Fail(RETRY)], "Operation"),
                call(vec![Okay(3)], "CircuitOpen"),
                after(secs(5), vec![Okay(4)], "Ok(4)"),
                call(vec![Fail(RETRY)], "Operation"),
            ],
        );

        breaker_time_window_slow_calls => scenario(
            Flavors::Agree,
            |b| plain(b.circuit_breaker(
                CircuitBreaker::failure_rate(0.5)
                    .window(secs(10))
                    .minimum_calls(2)
                    .slow_calls(0.5, ms(500))
                    .cooldown(secs(5)),
            )),
            vec![
                call(vec![slow(100, Okay(1))], "Ok(1)"),
                call(vec![slow(600, Okay(2))], "Ok(2)"),
                call(vec![Okay(3)], "CircuitOpen"),
                after(secs(5), vec![Okay(4)], "Ok(4)"),
                after(secs(11), vec![Fail(RETRY)], "Operation"),
                call(vec![Okay(5)], "Ok(5)"),
                call(vec![Fail(RETRY)], "Operation"),
                call(vec![Okay(6)], ""),
            ],
        );

        breaker_classified_outcomes => scenario(
            Flavors::Agree,
            |b| classified(b.circuit_breaker(CircuitBreaker::consecutive_failures(2).cooldown(secs(5)))),
            vec![
                call(vec![Fail(RETRY)], "Operation"),
                // Neither an abort, an ignored error nor throttling is a failure.
                call(vec![Fail(ABORT)], "Operation"),
                call(vec![Fail(RETRY)], "Operation"),
                call(vec![Fail(IGNORE)], "Operation"),
                call(vec![Fail(THROTTLED)], "Operation"),
                call(vec![Fail(FAILURE)], "Operation"),
                call(vec![Okay(1)], "CircuitOpen"),
            ],
        );

        breaker_inside_retry => scenario(
            Flavors::Agree,
            |b| plain(b
                .retry(Retry::constant(ms(100)).max_attempts(5))
                .circuit_breaker(CircuitBreaker::consecutive_failures(2).cooldown(secs(1)))),
            vec![
                call(vec![Fail(RETRY)], "CircuitOpen"),
                after(secs(1), vec![Okay(1)], "Ok(1)"),
                call(vec![Fail(RETRY), Okay(2)], "Ok(2)"),
            ],
        );

        // Declared before the retry, the breaker guards the whole call: one
        // exhausted retry is one failure in its window.
        breaker_outside_retry => scenario(
            Flavors::Agree,
            |b| plain(b
                .circuit_breaker(CircuitBreaker::consecutive_failures(2).cooldown(secs(1)))
                .retry(Retry::constant(ms(100)).max_attempts(3))),
            vec![
                call(vec![Fail(RETRY)], "RetryExhausted { attempts: 3"),
                call(vec![Fail(RETRY)], "RetryExhausted { attempts: 3"),
                call(vec![Okay(1)], "CircuitOpen"),
                after(secs(1), vec![Fail(RETRY), Okay(2)], "Ok(2)"),
                call(vec![Okay(3)], "Ok(3)"),
            ],
        );

        // Declared before the retry, the bulkhead's slot is held for the
        // whole call: a call nested in the second attempt is refused.
        bulkhead_outside_retry => scenario(
            Flavors::Agree,
            |b| plain(b.bulkhead(Bulkhead::new(1)).retry(Retry::constant(ms(5)).max_attempts(2))),
            vec![
                call(vec![Fail(RETRY), Nested(None, vec![Okay(1)])], "Ok(0)"),
                call(vec![Okay(2)], "Ok(2)"),
            ],
        );

        rate_limit_outside_retry => scenario(
            Flavors::Agree,
            |b| plain(b
                .rate_limiter(RateLimiter::fixed_window(2, secs(10)))
                .retry(Retry::constant(ms(100)).max_attempts(3))),
            vec![
                call(vec![Fail(RETRY)], "RetryExhausted { attempts: 3"),
                call(vec![Fail(RETRY), Okay(1)], "Ok(1)"),
                call(vec![Okay(2)], "RateLimited"),
            ],
        );

        // The final error's hint opens the cooldown of the whole call.
        cooldown_outside_retry => scenario(
            Flavors::Agree,
            |b| classified(b
                .cooldown(Cooldown::new().max_wait(Duration::ZERO))
                .retry(Retry::constant(ms(100)).max_attempts(3))),
            vec![
                call(vec![Fail(THROTTLED)], "RetryExhausted { attempts: 3"),
                after(ms(500), vec![Okay(1)], "CooldownActive"),
                after(ms(1500), vec![Okay(2)], "Ok(2)"),
            ],
        );

        // A breaker around the call and a bulkhead around each attempt: a
        // call refused by the bulkhead is no outcome for the breaker.
        breaker_outside_bulkhead_inside => scenario(
            Flavors::Agree,
            |b| plain(b
                .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(5)))
                .retry(Retry::constant(ms(10)).max_attempts(2))
                .bulkhead(Bulkhead::new(1))),
            vec![
                call(vec![Fail(RETRY), Nested(None, vec![Okay(1)])], "Ok(0)"),
                call(vec![Fail(RETRY)], "RetryExhausted { attempts: 2"),
                call(vec![Okay(2)], "CircuitOpen"),
            ],
        );

        timeout_per_attempt => scenario(
            Flavors::Differ,
            |b| plain(b.retry(Retry::constant(ms(100)).max_attempts(3)).timeout(secs(1))),
            vec![
                call(vec![slow(2000, Okay(1)), Okay(2)], "Ok("),
                call(vec![slow(500, Okay(3))], "Ok(3)"),
                call(vec![slow(1500, Fail(RETRY))], ""),
            ],
        );

        timeout_overall => scenario(
            Flavors::Differ,
            |b| plain(b.timeout(secs(1)).retry(Retry::constant(ms(300)).max_attempts(5))),
            vec![
                call(vec![slow(400, Fail(RETRY))], ""),
                call(vec![slow(100, Okay(1))], "Ok(1)"),
            ],
        );

        timeout_strict => scenario(
            Flavors::Differ,
            |b| plain(b.retry(Retry::constant(ms(10)).max_attempts(2)).timeout(Timeout::strict(ms(100)))),
            vec![
                call(vec![slow(150, Okay(1))], "Timeout"),
                call(vec![slow(150, Okay(1)), Okay(2)], "Ok(2)"),
                call(vec![slow(50, Okay(3))], "Ok(3)"),
            ],
        );

        timeout_with_breaker_records_the_timeout => scenario(
            Flavors::Differ,
            |b| plain(b
                .timeout(Timeout::strict(ms(100)))
                .circuit_breaker(CircuitBreaker::consecutive_failures(2).cooldown(secs(5)))),
            vec![
                call(vec![slow(150, Okay(1))], "Timeout"),
                call(vec![slow(150, Okay(1))], "Timeout"),
                call(vec![Okay(2)], "CircuitOpen"),
            ],
        );

        // Each attempt times out; the call that runs out of attempts is one
        // failure of the breaker declared before the retry.
        timeout_with_breaker_outside_retry => scenario(
            Flavors::Differ,
            |b| plain(b
                .circuit_breaker(CircuitBreaker::consecutive_failures(2).cooldown(secs(5)))
                .retry(Retry::constant(ms(10)).max_attempts(2))
                .timeout(Timeout::strict(ms(100)))),
            vec![
                call(vec![slow(150, Okay(1))], "Timeout"),
                call(vec![slow(150, Okay(1)), Okay(2)], "Ok(2)"),
                call(vec![slow(150, Okay(1))], "Timeout"),
                call(vec![slow(150, Okay(1))], "Timeout"),
                call(vec![Okay(3)], "CircuitOpen"),
            ],
        );

        bulkhead_full => scenario(
            Flavors::Agree,
            |b| plain(b.bulkhead(Bulkhead::new(1))),
            vec![
                call(vec![Nested(None, vec![Okay(1)])], "Ok(0)"),
                call(vec![Okay(2)], "Ok(2)"),
                call(vec![Fail(RETRY)], "Operation"),
            ],
        );

        bulkhead_two_slots_nested_twice => scenario(
            Flavors::Agree,
            |b| plain(b.retry(Retry::constant(ms(5)).max_attempts(2)).bulkhead(Bulkhead::new(2))),
            vec![
                call(vec![Nested(None, vec![Nested(None, vec![Okay(1)])])], "Ok(0)"),
                call(vec![Fail(RETRY), Nested(None, vec![Okay(2)])], "Ok(0)"),
            ],
        );

        // Async calls may queue for a slot; sync calls are refused at once (the
        // `Bulkhead` and `Pipeline::call` docs say so).
        bulkhead_queue => scenario(
            Flavors::Differ,
            |b| plain(b.bulkhead(Bulkhead::new(1).queue(1, ms(100)))),
            vec![
                call(vec![Nested(None, vec![Okay(1)])], "Ok(0)"),
                call(vec![Okay(2)], "Ok(2)"),
            ],
        );

        // The adaptive limit is kept in the process whatever the store: a
        // nested call over a limit of one is refused (at once in sync code,
        // after the queue's wait in async code), each attempt takes and
        // gives back its slot, a failure is a drop.
        adaptive_limit_full => scenario(
            Flavors::Agree,
            |b| plain(b.adaptive_limit(crate::AdaptiveLimit::aimd().limits(1, 1, 1))),
            vec![
                call(vec![Nested(None, vec![Okay(1)])], "Ok(0)"),
                call(vec![Okay(2)], "Ok(2)"),
                call(vec![Fail(RETRY)], "Operation"),
            ],
        );

        adaptive_limit_each_attempt => scenario(
            Flavors::Agree,
            |b| {
                plain(
                    b.retry(Retry::constant(ms(5)).max_attempts(3)).adaptive_limit(
                        crate::AdaptiveLimit::gradient2()
                            .limits(1, 1, 2)
                            .update_interval(ms(1))
                            .min_rtt(secs(1), 1, 1),
                    ),
                )
            },
            vec![
                call(vec![Fail(RETRY), Fail(RETRY), Okay(1)], "Ok(1)"),
                call(vec![Nested(None, vec![Okay(2)])], "Ok(0)"),
                call(vec![Okay(3)], "Ok(3)"),
            ],
        );

        adaptive_limit_queue => scenario(
            Flavors::Differ,
            |b| plain(b.adaptive_limit(crate::AdaptiveLimit::aimd().limits(1, 1, 1).queue(1, ms(100)))),
            vec![
                call(vec![Nested(None, vec![Okay(1)])], "Ok(0)"),
                call(vec![Okay(2)], "Ok(2)"),
            ],
        );

        rate_gcra => scenario(
            Flavors::Agree,
            |b| plain(b.rate_limiter(RateLimiter::gcra(2, secs(1)))),
            vec![
                call(vec![Okay(1)], "Ok(1)"),
                call(vec![Okay(2)], "Ok(2)"),
                call(vec![Okay(3)], "RateLimited"),
                after(ms(500), vec![Okay(4)], "Ok(4)"),
                call(vec![Okay(5)], "RateLimited"),
            ],
        );

        rate_gcra_waits => scenario(
            Flavors::Agree,
            |b| plain(b.rate_limiter(RateLimiter::gcra(2, secs(1)).max_wait(secs(1)))),
            vec![
                call(vec![Okay(1)], "Ok(1)"),
                call(vec![Okay(2)], "Ok(2)"),
                call(vec![Okay(3)], "Ok(3)"),
                call(vec![Okay(4)], "Ok(4)"),
            ],
        );

        // 1/3 s is no whole number of microseconds: every wait and every
        // admission after it is exact to the nanosecond.
        rate_gcra_fractional_interval_waits => scenario(
            Flavors::Agree,
            |b| plain(b.rate_limiter(RateLimiter::gcra(3, secs(1)).burst(2).max_wait(ms(400)))),
            vec![
                call(vec![Okay(1)], "Ok(1)"),
                call(vec![Okay(2)], "Ok(2)"),
                call(vec![Okay(3)], "Ok(3)"),
                call(vec![Okay(4)], "Ok(4)"),
                after(ms(1), vec![Okay(5)], "Ok(5)"),
                call(vec![Nested(None, vec![Okay(6)])], "Ok(0)"),
            ],
        );

        rate_fixed_window => scenario(
            Flavors::Agree,
            |b| plain(b.rate_limiter(RateLimiter::fixed_window(2, secs(1)))),
            vec![
                after(ms(300), vec![Okay(1)], "Ok(1)"),
                call(vec![Okay(2)], "Ok(2)"),
                call(vec![Okay(3)], "RateLimited"),
                after(ms(700), vec![Okay(4)], "Ok(4)"),
            ],
        );

        rate_fixed_window_waits => scenario(
            Flavors::Agree,
            |b| plain(b.rate_limiter(RateLimiter::fixed_window(1, ms(250)).max_wait(ms(250)))),
            vec![
                call(vec![Okay(1)], "Ok(1)"),
                call(vec![Okay(2)], "Ok(2)"),
                call(vec![Okay(3)], "Ok(3)"),
            ],
        );

        rate_sliding_window => scenario(
            Flavors::Agree,
            |b| plain(b.rate_limiter(RateLimiter::sliding_window(2, secs(1)))),
            vec![
                call(vec![Okay(1)], "Ok(1)"),
                after(ms(300), vec![Okay(2)], "Ok(2)"),
                after(ms(300), vec![Okay(3)], "RateLimited"),
                after(ms(400), vec![Okay(4)], "Ok(4)"),
            ],
        );

        rate_sliding_window_waits_within_a_deadline => scenario(
            Flavors::Agree,
            |b| plain(b
                .timeout(ms(500))
                .rate_limiter(RateLimiter::sliding_window(1, secs(1)).max_wait(secs(2)))),
            vec![
                call(vec![Okay(1)], "Ok(1)"),
                after(ms(600), vec![Okay(2)], "Ok(2)"),
                call(vec![Okay(3)], "RateLimited"),
            ],
        );

        rate_limit_inside_retry => scenario(
            Flavors::Agree,
            |b| plain(b
                .retry(Retry::constant(ms(100)).max_attempts(3))
                .rate_limiter(RateLimiter::gcra(1, ms(250)).max_wait(ms(200)))),
            vec![call(vec![Fail(RETRY), Fail(RETRY), Okay(1)], "Ok(1)")],
        );

        cooldown_from_a_hint_defers => scenario(
            Flavors::Agree,
            |b| classified(b.cooldown(Cooldown::new().max_wait(secs(5)))),
            vec![
                call(vec![Fail(THROTTLED)], "Operation(Boom(3))"),
                call(vec![Okay(1)], "Ok(1)"),
                after(secs(1), vec![Okay(2)], "Ok(2)"),
            ],
        );

        cooldown_from_a_hint_refuses => scenario(
            Flavors::Agree,
            |b| classified(b.cooldown(Cooldown::new().max_wait(Duration::ZERO))),
            vec![
                call(vec![Fail(THROTTLED)], "Operation(Boom(3))"),
                after(ms(500), vec![Okay(1)], "CooldownActive"),
                after(ms(1500), vec![Okay(2)], "Ok(2)"),
            ],
        );

        cooldown_exceeds_the_deadline => scenario(
            Flavors::Agree,
            |b| classified(b.timeout(secs(1)).cooldown(Cooldown::new())),
            vec![
                call(vec![Fail(THROTTLED)], "Operation(Boom(3))"),
                call(vec![Okay(1)], "CooldownExceedsDeadline"),
                after(ms(1500), vec![Okay(2)], "Ok(2)"),
            ],
        );

        cooldown_with_retry => scenario(
            Flavors::Agree,
            |b| classified(b
                .retry(Retry::constant(ms(100)).max_attempts(3))
                .cooldown(Cooldown::new().max_wait(secs(5)))),
            vec![
                call(vec![Fail(THROTTLED), Okay(1)], "Ok(1)"),
                call(vec![Fail(THROTTLED), Fail(THROTTLED), Fail(THROTTLED)], "RetryExhausted { attempts: 3"),
                call(vec![Okay(2)], "Ok(2)"),
            ],
        );

        fallback_after_retries => scenario(
            Flavors::Agree,
            |b| with_fallback(b.retry(Retry::constant(ms(10)).max_attempts(2))),
            vec![
                call(vec![Fail(RETRY)], "Ok(99)"),
                call(vec![Fail(RETRY), Okay(1)], "Ok(1)"),
            ],
        );

        fallback_on_an_open_circuit => scenario(
            Flavors::Agree,
            |b| with_fallback(b
                .retry(Retry::constant(ms(10)).max_attempts(2))
                .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(5)))),
            vec![
                call(vec![Fail(RETRY)], "Ok(99)"),
                call(vec![Okay(1)], "Ok(99)"),
                after(secs(5), vec![Okay(2)], "Ok(2)"),
            ],
        );

        all_stateful_policies_in_admission_order => scenario(
            Flavors::Agree,
            |b| plain(b
                .circuit_breaker(CircuitBreaker::consecutive_failures(3).cooldown(secs(5)))
                .bulkhead(Bulkhead::new(2))
                .cooldown(Cooldown::new())
                .rate_limiter(RateLimiter::gcra(3, secs(1)))),
            vec![
                call(vec![Okay(1)], "Ok(1)"),
                call(vec![Nested(None, vec![Okay(2)])], "Ok(0)"),
                // The rate limit refuses after the bulkhead admitted: the slot
                // must come back.
                call(vec![Okay(3)], "RateLimited"),
                call(vec![Okay(4)], "RateLimited"),
                // The whole burst back: 3 per second is an interval of
                // 333,333,334 ns (rounded up), 1 s and 2 ns for three.
                after(secs(2), vec![Fail(RETRY)], "Operation"),
                call(vec![Fail(RETRY)], "Operation"),
                call(vec![Fail(RETRY)], "Operation"),
                after(secs(1), vec![Okay(5)], "CircuitOpen"),
            ],
        );

        partitions_breaker_and_rate => scenario(
            Flavors::Agree,
            |b| plain(b
                .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(10)))
                .rate_limiter(RateLimiter::gcra(2, secs(1)))),
            vec![
                keyed("a", Duration::ZERO, vec![Fail(RETRY)], "Operation"),
                keyed("a", Duration::ZERO, vec![Okay(1)], "CircuitOpen"),
                keyed("b", Duration::ZERO, vec![Okay(2)], "Ok(2)"),
                keyed("b", Duration::ZERO, vec![Okay(3)], "Ok(3)"),
                keyed("b", Duration::ZERO, vec![Okay(4)], "RateLimited"),
                call(vec![Okay(5)], "Ok(5)"),
                keyed("a", secs(10), vec![Okay(6)], "Ok(6)"),
            ],
        );

        partitions_bulkhead => scenario(
            Flavors::Agree,
            |b| plain(b.bulkhead(Bulkhead::new(1))),
            vec![
                keyed("a", Duration::ZERO, vec![Nested(Some("a"), vec![Okay(1)])], "Ok(0)"),
                keyed("a", Duration::ZERO, vec![Nested(Some("b"), vec![Okay(2)])], "Ok(0)"),
                keyed("b", Duration::ZERO, vec![Nested(None, vec![Okay(3)])], "Ok(0)"),
            ],
        );

        // Shadow mode: the breaker opens as an enforcing one would, but no
        // call is refused; a call it would have refused records nothing,
        // so it stays open until its probe closes it.
        breaker_in_shadow_mode => scenario(
            Flavors::Agree,
            |b| plain(b.circuit_breaker(
                CircuitBreaker::consecutive_failures(2).cooldown(secs(30)).shadow(true),
            )),
            vec![
                call(vec![Fail(RETRY)], "Operation"),
                call(vec![Fail(RETRY)], "Operation"),
                call(vec![Okay(1)], "Ok(1)"),
                call(vec![Fail(RETRY)], "Operation"),
                after(secs(30), vec![Okay(2)], "Ok(2)"),
                call(vec![Fail(RETRY)], "Operation"),
            ],
        );

        // A full bulkhead in shadow mode lets the nested call run at once,
        // without a slot and without queueing (async calls would queue).
        bulkhead_in_shadow_mode => scenario(
            Flavors::Agree,
            |b| plain(b.bulkhead(Bulkhead::new(1).queue(1, ms(100)).shadow(true))),
            vec![
                call(vec![Nested(None, vec![Nested(None, vec![Okay(1)])])], "Ok(0)"),
                call(vec![Okay(2)], "Ok(2)"),
            ],
        );

        // A rate limiter in shadow mode never makes a call wait, even with
        // a max_wait.
        rate_in_shadow_mode_never_waits => scenario(
            Flavors::Agree,
            |b| plain(b.rate_limiter(RateLimiter::gcra(1, secs(1)).max_wait(secs(1)).shadow(true))),
            vec![
                call(vec![Okay(1)], "Ok(1)"),
                call(vec![Okay(2)], "Ok(2)"),
                after(ms(500), vec![Okay(3)], "Ok(3)"),
                after(ms(500), vec![Okay(4)], "Ok(4)"),
            ],
        );

        cooldown_in_shadow_mode => scenario(
            Flavors::Agree,
            |b| classified(b.cooldown(Cooldown::new().max_wait(secs(5)).shadow(true))),
            vec![
                call(vec![Fail(THROTTLED)], "Operation(Boom(3))"),
                call(vec![Okay(1)], "Ok(1)"),
                call(vec![Fail(THROTTLED)], "Operation(Boom(3))"),
                after(secs(2), vec![Okay(2)], "Ok(2)"),
            ],
        );

        // A circuit in shadow mode admits the call it would refuse; the
        // enforcing bulkhead still holds a slot for it, so the nested call
        // is refused.
        shadow_breaker_with_an_enforcing_bulkhead => scenario(
            Flavors::Agree,
            |b| plain(b
                .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(5)).shadow(true))
                .bulkhead(Bulkhead::new(1))),
            vec![
                call(vec![Fail(RETRY)], "Operation"),
                call(vec![Nested(None, vec![Okay(1)])], "Ok(0)"),
                call(vec![Okay(2)], "Ok(2)"),
            ],
        );

        // Declared before the retry, a rate limiter in shadow mode takes one
        // permit per call and refuses none.
        rate_in_shadow_mode_outside_retry => scenario(
            Flavors::Agree,
            |b| plain(b
                .rate_limiter(RateLimiter::fixed_window(1, secs(10)).shadow(true))
                .retry(Retry::constant(ms(100)).max_attempts(2))),
            vec![
                call(vec![Fail(RETRY), Okay(1)], "Ok(1)"),
                call(vec![Okay(2)], "Ok(2)"),
            ],
        );

        // The probe hangs past max_half_open: the nested call starts a new
        // round of probes and closes the circuit; the late probe's outcome
        // is of an older generation and counts for nothing.
        breaker_round_of_probes_expires => scenario(
            Flavors::Agree,
            |b| plain(b.circuit_breaker(
                CircuitBreaker::consecutive_failures(1).cooldown(secs(5)).max_half_open(secs(1)),
            )),
            vec![
                call(vec![Fail(RETRY)], "Operation"),
                after(secs(5), vec![slow(2000, Nested(None, vec![Okay(1)]))], "Ok(0)"),
                call(vec![Okay(2)], "Ok(2)"),
            ],
        );

        // Before max_half_open, the hanging probe still blocks.
        breaker_round_of_probes_blocks_until_it_expires => scenario(
            Flavors::Agree,
            |b| plain(b.circuit_breaker(
                CircuitBreaker::consecutive_failures(1).cooldown(secs(5)).max_half_open(secs(3)),
            )),
            vec![
                call(vec![Fail(RETRY)], "Operation"),
                after(secs(5), vec![slow(2000, Nested(None, vec![Okay(1)]))], "Ok(0)"),
                call(vec![Okay(2)], "Ok(2)"),
            ],
        );

        // Hedging with a bulkhead after it: each attempt under way holds a
        // slot, a loser gives its slot back without an outcome, a hedge
        // refused for want of a slot does not start and is tried again
        // after the delay while the first attempt runs.
        hedging_latency_bulkhead_after => scenario(
            Flavors::AsyncOnly,
            |b| plain(b.hedging(Hedging::latency(ms(10)).max_hedged_attempts(2))
                .bulkhead(Bulkhead::new(2))),
            vec![
                // The hedge started at 10 ms wins at 15 ms.
                call(vec![slow(50, Okay(1)), slow(5, Okay(2)), Okay(3)], "Ok(2)"),
                // Two slots: the third attempt, tried at 20, 30, ... 90 ms,
                // is refused each time; the first answers at 95 ms.
                call(vec![slow(95, Okay(1)), slow(200, Okay(2)), Okay(3)], "Ok(1)"),
                // Each failure starts the next attempt at once.
                call(
                    vec![slow(5, Fail(RETRY)), slow(5, Fail(RETRY)), slow(5, Fail(RETRY))],
                    "RetryExhausted { attempts: 3",
                ),
                // The first fails at 15 ms and gives its slot to the third
                // attempt, started then.
                call(vec![slow(15, Fail(RETRY)), slow(30, Okay(5)), slow(1, Okay(6))], "Ok(6)"),
            ],
        );

        // Hedging with a circuit breaker after it: every attempt that ended
        // is recorded (a loser dropped records nothing), a hedge refused by
        // the open circuit with nothing under way ends the call, and one
        // refused by a half-open circuit busy with its probe is tried again.
        hedging_latency_breaker_after => scenario(
            Flavors::AsyncOnly,
            |b| plain(b.hedging(Hedging::latency(ms(10)).max_hedged_attempts(2))
                .circuit_breaker(CircuitBreaker::consecutive_failures(2).cooldown(secs(1)))),
            vec![
                // Attempt 2 (10 ms) fails at 13 ms and starts attempt 3,
                // which wins; the first is dropped.
                call(vec![slow(15, Fail(RETRY)), slow(3, Fail(RETRY)), Okay(7)], "Ok(7)"),
                // Two failures open the circuit: the third attempt is
                // refused with none under way.
                call(vec![slow(5, Fail(RETRY)), slow(5, Fail(RETRY)), Okay(8)], "CircuitOpen"),
                call(vec![Okay(9)], "CircuitOpen"),
                // Half-open: the first attempt is the probe; the hedges
                // tried at 10 and 20 ms are refused; the probe closes it.
                after(secs(1), vec![slow(25, Okay(1)), Okay(2)], "Ok(1)"),
                call(vec![slow(12, Okay(3)), Okay(4)], "Ok(4)"),
            ],
        );

        // Hedging with a rate limiter after it: each attempt takes a
        // permit; a refused hedge is tried again after the delay and
        // starts once a permit is free.
        hedging_latency_rate_after => scenario(
            Flavors::AsyncOnly,
            |b| plain(b.hedging(Hedging::latency(ms(10)).max_hedged_attempts(2))
                .rate_limiter(RateLimiter::gcra(1, ms(25)))),
            vec![
                // Refused at 10 and 20 ms, started at 30 ms, wins at 35 ms.
                call(vec![slow(100, Okay(1)), slow(5, Okay(2)), Okay(3)], "Ok(2)"),
                after(ms(100), vec![slow(5, Okay(4))], "Ok(4)"),
            ],
        );

        partitions_cooldown => scenario(
            Flavors::Agree,
            |b| classified(b.cooldown(Cooldown::new().max_wait(Duration::ZERO))),
            vec![
                keyed("a", Duration::ZERO, vec![Fail(THROTTLED)], "Operation"),
                keyed("a", Duration::ZERO, vec![Okay(1)], "CooldownActive"),
                keyed("b", Duration::ZERO, vec![Okay(2)], "Ok(2)"),
                keyed("a", secs(2), vec![Okay(3)], "Ok(3)"),
            ],
        );
    }
}
