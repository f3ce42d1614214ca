//! The pipeline: policies composed in declaration order, built once, shared
//! by every task and thread.

use std::fmt;
use std::future::Future;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::Duration;

use crate::breaker::{
    CircuitBreaker, CircuitControl, CircuitMetrics, CircuitState, CircuitTransition,
};
use crate::bulkhead::Bulkhead;
use crate::classify::Verdict;
use crate::clock::{Clock, ClockHandle, Random, SystemRandom};
use crate::context::{intern, Context, PartitionKey};
use crate::cooldown::Cooldown;
use crate::error::{ConfigError, Error, StoreError};
use crate::event::{Event, EventKind, Listener, Listeners};
use crate::rate_limit::RateLimiter;
use crate::retry::Retry;
use crate::store::{MemoryResource, MemoryStore, ResourceSpec, ResourceState, StateStore};
use crate::timeout::Timeout;

mod execute;
use execute::Resume;
mod kind;

pub use kind::{
    AnyResult, BoxFallbackFuture, ErrorHandlers, ErrorKind, ErrorType, FallbackHandlers,
    FallbackKind, Handles, HandlesSync, Kind, WithAsyncFallback, WithFallback,
};

/// Builds a [`Pipeline`]. Every method takes and returns the builder by
/// value; builders are `Clone`, so a half-built builder can serve as a
/// template.
///
/// # Default
/// No policy; the process-wide [`MemoryStore::global`] store; the system
/// clock and random source; partitions evicted after 10 minutes idle.
pub struct PipelineBuilder<K: Kind = AnyResult> {
    name: String,
    retry: Option<Retry>,
    overall_timeout: Option<Timeout>,
    attempt_timeout: Option<Timeout>,
    circuit: Option<CircuitBreaker>,
    bulkhead: Option<Bulkhead>,
    cooldown: Option<Cooldown>,
    rate_limit: Option<RateLimiter>,
    store: Option<Arc<dyn StateStore>>,
    memory_store: Option<MemoryStore>,
    clock: ClockHandle,
    random: Option<Arc<dyn Random>>,
    listeners: Vec<Listener>,
    partition_idle: Duration,
    handlers: K::Handlers,
    order_error: Option<ConfigError>,
}

impl<K: Kind> Clone for PipelineBuilder<K> {
    fn clone(&self) -> Self {
        PipelineBuilder {
            name: self.name.clone(),
            retry: self.retry.clone(),
            overall_timeout: self.overall_timeout,
            attempt_timeout: self.attempt_timeout,
            circuit: self.circuit.clone(),
            bulkhead: self.bulkhead.clone(),
            cooldown: self.cooldown.clone(),
            rate_limit: self.rate_limit.clone(),
            store: self.store.clone(),
            memory_store: self.memory_store.clone(),
            clock: self.clock.clone(),
            random: self.random.clone(),
            listeners: self.listeners.clone(),
            partition_idle: self.partition_idle,
            handlers: self.handlers.clone(),
            order_error: self.order_error.clone(),
        }
    }
}

impl<K: Kind> fmt::Debug for PipelineBuilder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PipelineBuilder")
            .field("name", &self.name)
            .field("retry", &self.retry)
            .field("overall_timeout", &self.overall_timeout)
            .field("attempt_timeout", &self.attempt_timeout)
            .field("circuit", &self.circuit)
            .field("bulkhead", &self.bulkhead)
            .field("cooldown", &self.cooldown)
            .field("rate_limit", &self.rate_limit)
            .finish_non_exhaustive()
    }
}

impl PipelineBuilder<AnyResult> {
    fn new(name: String) -> Self {
        PipelineBuilder {
            name,
            retry: None,
            overall_timeout: None,
            attempt_timeout: None,
            circuit: None,
            bulkhead: None,
            cooldown: None,
            rate_limit: None,
            store: None,
            memory_store: None,
            clock: ClockHandle::System,
            random: None,
            listeners: Vec::new(),
            partition_idle: Duration::from_secs(600),
            handlers: (),
            order_error: None,
        }
    }
}

impl<K: Kind> PipelineBuilder<K> {
    fn twice(&mut self, what: &'static str) {
        self.order_error.get_or_insert_with(|| {
            ConfigError::new(
                "pipeline",
                what,
                "is declared twice; declare each policy once",
            )
        });
    }

    fn stateful(&mut self, what: &'static str, already: bool) {
        if already {
            self.twice(what);
        }
    }

    /// Adds a retry policy. Timeouts declared after it bound each attempt,
    /// stateful policies declared after it guard each attempt.
    pub fn retry(mut self, retry: Retry) -> Self {
        if self.retry.is_some() {
            self.twice("retry");
        }
        let stateful = [
            (self.circuit.is_some(), "circuit_breaker"),
            (self.bulkhead.is_some(), "bulkhead"),
            (self.cooldown.is_some(), "cooldown"),
            (self.rate_limit.is_some(), "rate_limiter"),
        ];
        if let Some((_, name)) = stateful.iter().find(|(set, _)| *set) {
            self.order_error.get_or_insert_with(|| {
                ConfigError::new(
                    "pipeline",
                    name,
                    "must be declared after retry: stateful policies guard each attempt",
                )
            });
        }
        self.retry = Some(retry);
        self
    }

    /// Adds a timeout: for the whole call when declared before `retry` (or
    /// when there is no retry), for each attempt when declared after it.
    /// Takes a `Duration` (lenient in sync code) or a [`Timeout`].
    pub fn timeout(mut self, timeout: impl Into<Timeout>) -> Self {
        let t = timeout.into();
        let slot = if self.retry.is_some() {
            &mut self.attempt_timeout
        } else {
            &mut self.overall_timeout
        };
        let dup = slot.replace(t).is_some();
        if dup {
            self.twice("timeout");
        }
        self
    }

    /// Adds a circuit breaker (guards each attempt).
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        let dup = self.circuit.replace(breaker).is_some();
        self.stateful("circuit_breaker", dup);
        self
    }

    /// Adds a bulkhead (guards each attempt).
    pub fn bulkhead(mut self, bulkhead: Bulkhead) -> Self {
        let dup = self.bulkhead.replace(bulkhead).is_some();
        self.stateful("bulkhead", dup);
        self
    }

    /// Adds a cooldown opened by retry-after hints (guards each attempt).
    pub fn cooldown(mut self, cooldown: Cooldown) -> Self {
        let dup = self.cooldown.replace(cooldown).is_some();
        self.stateful("cooldown", dup);
        self
    }

    /// Adds a rate limiter (guards each attempt).
    pub fn rate_limiter(mut self, limiter: RateLimiter) -> Self {
        let dup = self.rate_limit.replace(limiter).is_some();
        self.stateful("rate_limiter", dup);
        self
    }

    /// Where the stateful policies keep their state (default:
    /// [`MemoryStore::global`]).
    pub fn store(mut self, store: impl StateStore) -> Self {
        let any: &dyn std::any::Any = &store;
        self.memory_store = any.downcast_ref::<MemoryStore>().cloned();
        self.store = Some(Arc::new(store));
        self
    }

    /// The clock (default: [`SystemClock`](crate::SystemClock)).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = ClockHandle::from_clock(clock);
        self
    }

    /// The random source for jitter (default: [`SystemRandom`]).
    pub fn random(mut self, random: impl Random) -> Self {
        self.random = Some(Arc::new(random));
        self
    }

    /// Adds an event listener. With none, events cost nothing.
    pub fn on_event(mut self, listener: impl Fn(&Event<'_>) + Send + Sync + 'static) -> Self {
        self.listeners.push(Arc::new(listener));
        self
    }

    /// How long a partition may stay unused before its state is evicted.
    pub fn partition_idle(mut self, idle: Duration) -> Self {
        self.partition_idle = idle;
        self
    }

    /// Classifies the operation's errors (default: every error is a
    /// retryable failure). Fixes the error type of the pipeline.
    pub fn classify<E, F>(self, classify: F) -> PipelineBuilder<K::Out>
    where
        K: ErrorKind<E>,
        F: Fn(&E) -> Verdict + Send + Sync + 'static,
    {
        self.map_errors(move |mut h| {
            h.classify = Some(Arc::new(classify));
            h
        })
    }

    /// Retries only errors matching `predicate` (others are failures that
    /// are not retried). `abort_if` wins over it.
    pub fn retry_if<E, F>(self, predicate: F) -> PipelineBuilder<K::Out>
    where
        K: ErrorKind<E>,
        F: Fn(&E) -> bool + Send + Sync + 'static,
    {
        self.map_errors(move |mut h| {
            h.retry_if = Some(Arc::new(predicate));
            h
        })
    }

    /// Stops at once on errors matching `predicate` (not retried, not a
    /// failure of the dependency). Wins over `retry_if` and the classifier.
    pub fn abort_if<E, F>(self, predicate: F) -> PipelineBuilder<K::Out>
    where
        K: ErrorKind<E>,
        F: Fn(&E) -> bool + Send + Sync + 'static,
    {
        self.map_errors(move |mut h| {
            h.abort_if = Some(Arc::new(predicate));
            h
        })
    }

    /// Calls `hook(error, attempt, delay)` before each retry wait.
    pub fn on_retry<E, F>(self, hook: F) -> PipelineBuilder<K::Out>
    where
        K: ErrorKind<E>,
        F: Fn(&E, u32, Duration) + Send + Sync + 'static,
    {
        self.map_errors(move |mut h| {
            h.on_retry = Some(Arc::new(hook));
            h
        })
    }

    /// An async fallback, always outermost: it receives the final error and
    /// the context, and its result becomes the call's result.
    pub fn fallback<T, E, F, Fut>(self, fallback: F) -> PipelineBuilder<WithAsyncFallback<T, E>>
    where
        K: FallbackKind<T, E>,
        T: 'static,
        E: 'static,
        F: Fn(Error<E>, Context) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let errors = K::into_errors(self.handlers.clone());
        self.with_handlers(FallbackHandlers {
            errors,
            fallback: crate::fallback::async_fallback(fallback),
            when: None,
        })
    }

    /// A synchronous fallback (usable by `run` and `call`), always outermost.
    pub fn fallback_sync<T, E, F>(self, fallback: F) -> PipelineBuilder<WithFallback<T, E>>
    where
        K: FallbackKind<T, E>,
        T: 'static,
        E: 'static,
        F: Fn(Error<E>, Context) -> Result<T, E> + Send + Sync + 'static,
    {
        let errors = K::into_errors(self.handlers.clone());
        self.with_handlers(FallbackHandlers {
            errors,
            fallback: crate::fallback::sync_fallback(fallback),
            when: None,
        })
    }

    fn map_errors<E>(
        self,
        f: impl FnOnce(ErrorHandlers<E>) -> ErrorHandlers<E>,
    ) -> PipelineBuilder<K::Out>
    where
        K: ErrorKind<E>,
    {
        let h = K::map_errors(self.handlers.clone(), f);
        self.with_handlers(h)
    }

    fn with_handlers<K2: Kind>(self, handlers: K2::Handlers) -> PipelineBuilder<K2> {
        PipelineBuilder {
            name: self.name,
            retry: self.retry,
            overall_timeout: self.overall_timeout,
            attempt_timeout: self.attempt_timeout,
            circuit: self.circuit,
            bulkhead: self.bulkhead,
            cooldown: self.cooldown,
            rate_limit: self.rate_limit,
            store: self.store,
            memory_store: self.memory_store,
            clock: self.clock,
            random: self.random,
            listeners: self.listeners,
            partition_idle: self.partition_idle,
            handlers,
            order_error: self.order_error,
        }
    }

    /// Validates the configuration and builds the pipeline.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the policy, the field and the rule, e.g.
    /// `retry.max_attempts must be >= 1, got 0`; or, when the store cannot
    /// prepare the resource, a `store` error.
    pub fn build(self) -> Result<Pipeline<K>, ConfigError> {
        if let Some(e) = self.order_error {
            return Err(e);
        }
        if self.name.trim().is_empty() {
            return Err(ConfigError::new("pipeline", "name", "must not be empty"));
        }
        if let Some(r) = &self.retry {
            r.validate()?;
        }
        for t in [self.overall_timeout, self.attempt_timeout]
            .into_iter()
            .flatten()
        {
            t.validate()?;
        }
        if let Some(c) = &self.circuit {
            c.validate()?;
        }
        let attempt_timeout = self.attempt_timeout.or(self.overall_timeout);
        if let Some(b) = &self.bulkhead {
            b.validate(attempt_timeout.map(|t| t.duration))?;
        }
        if let Some(c) = &self.cooldown {
            c.validate()?;
        }
        if let Some(r) = &self.rate_limit {
            r.validate()?;
        }
        if self.partition_idle.is_zero() {
            return Err(ConfigError::new(
                "pipeline",
                "partition_idle",
                "must be > 0",
            ));
        }
        let spec = ResourceSpec {
            name: self.name.clone(),
            circuit: self.circuit,
            bulkhead: self.bulkhead,
            cooldown: self.cooldown,
            rate_limit: self.rate_limit,
            partition_idle: self.partition_idle,
        };
        let gate = if spec.is_empty() {
            None
        } else {
            let memory = match (&self.store, &self.memory_store) {
                (None, _) => Some(MemoryStore::global().bind_memory(&spec)),
                (Some(_), Some(m)) => Some(m.bind_memory(&spec)),
                (Some(_), None) => None,
            };
            let state: Arc<dyn ResourceState> = match (&memory, self.store) {
                (Some(m), _) => Arc::clone(m) as Arc<dyn ResourceState>,
                (None, Some(store)) => store.bind(&spec).map_err(|e| {
                    ConfigError::new(
                        "store",
                        "bind",
                        format!("could not prepare the resource: {e}"),
                    )
                })?,
                (None, None) => unreachable!("no store means the global memory store"),
            };
            Some(Gate {
                state,
                memory,
                record_needs_time: spec.circuit.as_ref().is_some_and(|c| {
                    c.slow_call_rate.is_some()
                        || matches!(c.mode, crate::breaker::BreakerMode::TimeWindow(_))
                }),
                success_recorded: spec.circuit.is_some() || spec.bulkhead.is_some(),
                spec,
                waiters: AtomicU32::new(0),
            })
        };
        let random: Arc<dyn Random> = self.random.unwrap_or_else(|| Arc::new(SystemRandom));
        let listeners = Listeners::new(self.listeners);
        let any_timeout = self.overall_timeout.is_some() || self.attempt_timeout.is_some();
        let plan = Plan {
            // A memory gate reads the clock itself, only when a policy
            // needs the time (a rate limit, a cooldown in effect, a circuit
            // that is not closed, a partition).
            needs_time: gate.as_ref().is_some_and(|g| {
                g.memory.is_none() || g.spec.rate_limit.is_some() || g.record_needs_time
            }) || any_timeout
                || listeners.registered(),
            watch_late: listeners.registered()
                || self.overall_timeout.is_some_and(|t| t.strict)
                || self.attempt_timeout.is_some_and(|t| t.strict),
            lean_async: gate.as_ref().is_none_or(|g| g.memory.is_some()) && !listeners.registered(),
            lean_sync: false,
            bare_first: false,
            first_timeout: match (self.overall_timeout, self.attempt_timeout) {
                (Some(o), Some(a)) => Some(o.nanos().min(a.nanos())),
                (o, a) => o.or(a).map(|t| t.nanos()),
            },
        };
        let plan = Plan {
            lean_sync: plan.lean_async && !plan.watch_late,
            bare_first: plan.lean_async
                && gate.is_none()
                && !any_timeout
                && self.retry.as_ref().is_none_or(|r| r.budget.is_none()),
            ..plan
        };
        Ok(Pipeline {
            shared: Arc::new(Shared {
                name: intern(&self.name),
                retry: self.retry,
                overall_timeout: self.overall_timeout,
                attempt_timeout: self.attempt_timeout,
                gate,
                clock: self.clock,
                random,
                listeners,
                handlers: self.handlers,
                plan,
            }),
        })
    }
}

impl<T: 'static, E: 'static> PipelineBuilder<WithAsyncFallback<T, E>> {
    /// Runs the fallback only for errors matching `predicate`; every other
    /// error propagates unchanged.
    pub fn fallback_when<P>(mut self, predicate: P) -> Self
    where
        P: Fn(&Error<E>) -> bool + Send + Sync + 'static,
    {
        self.handlers.when = Some(crate::fallback::filter(predicate));
        self
    }
}

impl<T: 'static, E: 'static> PipelineBuilder<WithFallback<T, E>> {
    /// Runs the fallback only for errors matching `predicate`; every other
    /// error propagates unchanged.
    pub fn fallback_when<P>(mut self, predicate: P) -> Self
    where
        P: Fn(&Error<E>) -> bool + Send + Sync + 'static,
    {
        self.handlers.when = Some(crate::fallback::filter(predicate));
        self
    }
}

/// The stateful policies of a pipeline, bound to their store.
pub(crate) struct Gate {
    pub(crate) state: Arc<dyn ResourceState>,
    /// The same state when it lives in a [`MemoryStore`], called without
    /// dynamic dispatch on the hot path.
    pub(crate) memory: Option<Arc<MemoryResource>>,
    pub(crate) spec: ResourceSpec,
    pub(crate) record_needs_time: bool,
    /// A success changes state (a circuit breaker or a bulkhead slot);
    /// with only a rate limit and a cooldown there is nothing to record.
    pub(crate) success_recorded: bool,
    /// Async calls currently queued for a bulkhead slot in this process.
    pub(crate) waiters: AtomicU32,
}

/// Facts about a pipeline computed once at build time for the hot path.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    /// The start of an attempt must be read from the clock.
    pub(crate) needs_time: bool,
    /// Sync calls must read the clock at the end of an attempt to detect a
    /// late result (a strict timeout, or someone listening for events).
    pub(crate) watch_late: bool,
    /// The gate, if any, is a memory resource and no one listens: an
    /// unpartitioned async call takes the lean path (admit, run, record a
    /// success, inline) until anything out of the ordinary happens.
    pub(crate) lean_async: bool,
    /// The same for sync calls, which also need no strict timeout watching
    /// the end of an attempt.
    pub(crate) lean_sync: bool,
    /// The deadline of a first attempt, from its start (the nearer of the
    /// overall and per-attempt timeouts), in nanoseconds.
    pub(crate) first_timeout: Option<u64>,
    /// No gate, no timeout, no retry budget, nobody listening: no policy
    /// or a retry alone, whose first attempt runs as is.
    pub(crate) bare_first: bool,
}

pub(crate) struct Shared<K: Kind> {
    pub(crate) plan: Plan,
    pub(crate) name: &'static str,
    pub(crate) retry: Option<Retry>,
    pub(crate) overall_timeout: Option<Timeout>,
    pub(crate) attempt_timeout: Option<Timeout>,
    pub(crate) gate: Option<Gate>,
    pub(crate) clock: ClockHandle,
    pub(crate) random: Arc<dyn Random>,
    pub(crate) listeners: Listeners,
    pub(crate) handlers: K::Handlers,
}

/// A built pipeline: cheap to clone (one reference count), `Send + Sync`,
/// shared by every task and thread.
///
/// ```
/// use std::time::Duration;
/// use seawall::{Pipeline, Retry};
///
/// let pipeline = Pipeline::builder("inventory")
///     .retry(Retry::constant(Duration::from_millis(1)).max_attempts(3))
///     .build()?;
/// let mut tries = 0;
/// let n = pipeline.call(|_ctx| {
///     tries += 1;
///     if tries < 2 { Err(std::io::Error::other("flaky")) } else { Ok(7) }
/// })?;
/// assert_eq!((n, tries), (7, 2));
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// ```
pub struct Pipeline<K: Kind = AnyResult> {
    pub(crate) shared: Arc<Shared<K>>,
}

impl<K: Kind> Clone for Pipeline<K> {
    fn clone(&self) -> Self {
        Pipeline {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<K: Kind> fmt::Debug for Pipeline<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.shared;
        f.debug_struct("Pipeline")
            .field("name", &s.name)
            .field("retry", &s.retry)
            .field("overall_timeout", &s.overall_timeout)
            .field("attempt_timeout", &s.attempt_timeout)
            .field("stateful", &s.gate.as_ref().map(|g| &g.spec))
            .finish()
    }
}

impl Pipeline {
    /// Starts building a pipeline for the resource `name`. The name keys the
    /// shared state: pipelines with the same name and store share one
    /// circuit, bulkhead, rate limit and cooldown.
    pub fn builder(name: impl Into<String>) -> PipelineBuilder<AnyResult> {
        PipelineBuilder::new(name.into())
    }
}

/// Why a manual circuit operation failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// The pipeline has no circuit breaker.
    #[error("pipeline `{0}` has no circuit breaker")]
    NoCircuitBreaker(&'static str),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl<K: Kind> Pipeline<K> {
    /// The resource name.
    pub fn name(&self) -> &str {
        self.shared.name
    }

    /// Runs calls under a partition key: the partition gets its own circuit,
    /// bulkhead, rate limit and cooldown.
    pub fn partition(&self, key: impl Into<PartitionKey>) -> Partition<'_, K> {
        Partition {
            pipeline: self,
            key: key.into(),
        }
    }

    /// Forces the circuit open: every call is rejected until
    /// [`reset`](Self::reset).
    ///
    /// # Errors
    /// When there is no circuit breaker or the store fails.
    pub fn isolate(&self) -> Result<(), ControlError> {
        self.control(None, CircuitControl::Isolate)
    }

    /// Forces the circuit closed: every call is admitted and nothing is
    /// recorded until [`reset`](Self::reset).
    ///
    /// # Errors
    /// When there is no circuit breaker or the store fails.
    pub fn force_close(&self) -> Result<(), ControlError> {
        self.control(None, CircuitControl::ForceClose)
    }

    /// Closes the circuit with an empty window and no trip history.
    ///
    /// # Errors
    /// When there is no circuit breaker or the store fails.
    pub fn reset(&self) -> Result<(), ControlError> {
        self.control(None, CircuitControl::Reset)
    }

    /// The circuit's state.
    ///
    /// # Errors
    /// When there is no circuit breaker or the store fails.
    pub fn circuit_state(&self) -> Result<CircuitState, ControlError> {
        self.metrics(None).map(|m| m.state)
    }

    /// The circuit's state and window.
    ///
    /// # Errors
    /// When there is no circuit breaker or the store fails.
    pub fn circuit_metrics(&self) -> Result<CircuitMetrics, ControlError> {
        self.metrics(None)
    }

    /// Attempts currently holding a bulkhead slot (0 without a bulkhead).
    ///
    /// # Errors
    /// When the store fails.
    pub fn in_flight(&self) -> Result<u32, StoreError> {
        match &self.shared.gate {
            Some(g) => g.state.in_flight(None, self.now()),
            None => Ok(0),
        }
    }

    /// Drops the state of partitions idle for longer than allowed; returns
    /// how many were dropped.
    pub fn evict_idle_partitions(&self) -> usize {
        self.shared
            .gate
            .as_ref()
            .map_or(0, |g| g.state.evict_idle(self.now()))
    }

    /// Partitions whose state is held in memory.
    pub fn partitions(&self) -> usize {
        self.shared
            .gate
            .as_ref()
            .map_or(0, |g| g.state.partitions())
    }

    fn now(&self) -> Duration {
        Duration::from_nanos(self.shared.clock.now_nanos())
    }

    fn circuit_gate(&self) -> Result<&Gate, ControlError> {
        match &self.shared.gate {
            Some(g) if g.spec.circuit.is_some() => Ok(g),
            _ => Err(ControlError::NoCircuitBreaker(self.shared.name)),
        }
    }

    fn control(
        &self,
        partition: Option<&PartitionKey>,
        c: CircuitControl,
    ) -> Result<(), ControlError> {
        let gate = self.circuit_gate()?;
        let t = gate.state.control_circuit(partition, c, self.now())?;
        if let Some(t) = t {
            self.emit_transition(partition, t);
        }
        Ok(())
    }

    fn metrics(&self, partition: Option<&PartitionKey>) -> Result<CircuitMetrics, ControlError> {
        let gate = self.circuit_gate()?;
        Ok(gate.state.circuit_metrics(partition, self.now())?)
    }

    pub(crate) fn emit(&self, partition: Option<&PartitionKey>, kind: impl FnOnce() -> EventKind) {
        self.shared
            .listeners
            .emit(self.shared.name, partition, kind)
    }

    pub(crate) fn emit_transition(&self, partition: Option<&PartitionKey>, t: CircuitTransition) {
        self.emit(partition, || match t {
            CircuitTransition::Opened { cooldown } => EventKind::CircuitOpened { cooldown },
            CircuitTransition::HalfOpened => EventKind::CircuitHalfOpened,
            CircuitTransition::Closed => EventKind::CircuitClosed,
        })
    }

    /// Runs an async operation through the pipeline.
    ///
    /// The closure is called once per attempt with the attempt's
    /// [`Context`] and returns the attempt's future; with a timeout, the
    /// future is dropped at the deadline.
    ///
    /// # Errors
    /// The operation's error (typed, in [`Error::Operation`] or
    /// [`Error::RetryExhausted`]), a timeout, a rejection by a policy, or a
    /// store failure; after the fallback, if one is configured and applies.
    pub fn run<T, E, Op, Fut>(
        &self,
        op: Op,
    ) -> impl Future<Output = Result<T, Error<E>>> + use<'_, K, T, E, Op, Fut>
    where
        K: Handles<T, E>,
        Op: FnMut(Context) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.run_keyed(None, op)
    }

    /// Runs a blocking operation through the pipeline on the calling thread.
    ///
    /// Timeouts are cooperative here: the deadline is in the [`Context`];
    /// a late success is kept and reported by a `DeadlineExceeded` event, or
    /// becomes [`Error::Timeout`] under [`Timeout::strict`]. A full bulkhead
    /// rejects at once.
    ///
    /// # Errors
    /// As for [`run`](Self::run).
    #[inline]
    pub fn call<T, E, Op>(&self, mut op: Op) -> Result<T, Error<E>>
    where
        K: HandlesSync<T, E>,
        Op: FnMut(Context) -> Result<T, E>,
    {
        let plan = &self.shared.plan;
        if !plan.lean_sync || Listeners::tracing() {
            return self.call_in(None, op, Resume::Start);
        }
        if plan.bare_first {
            // No policy, or a retry alone: the first attempt runs as is.
            return match op(Context::bare(self.shared.name)) {
                Ok(v) => Ok(v),
                Err(e) => self.call_resumed(None, op, Resume::first_failed(Err(e))),
            };
        }
        self.call_lean(None, op)
    }
}

/// A pipeline bound to a partition key; see [`Pipeline::partition`].
#[derive(Debug)]
pub struct Partition<'p, K: Kind = AnyResult> {
    pipeline: &'p Pipeline<K>,
    key: PartitionKey,
}

impl<'p, K: Kind> Partition<'p, K> {
    /// The partition key.
    pub fn key(&self) -> &PartitionKey {
        &self.key
    }

    /// Runs an async operation in this partition. See [`Pipeline::run`].
    ///
    /// # Errors
    /// As for [`Pipeline::run`].
    pub fn run<T, E, Op, Fut>(
        &self,
        op: Op,
    ) -> impl Future<Output = Result<T, Error<E>>> + use<'_, 'p, K, T, E, Op, Fut>
    where
        K: Handles<T, E>,
        Op: FnMut(Context) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.pipeline.run_keyed(Some(&self.key), op)
    }

    /// Runs a blocking operation in this partition. See [`Pipeline::call`].
    ///
    /// # Errors
    /// As for [`Pipeline::call`].
    pub fn call<T, E, Op>(&self, op: Op) -> Result<T, Error<E>>
    where
        K: HandlesSync<T, E>,
        Op: FnMut(Context) -> Result<T, E>,
    {
        let pipeline = self.pipeline;
        if pipeline.shared.plan.lean_sync && !Listeners::tracing() {
            return pipeline.call_lean(Some(&self.key), op);
        }
        pipeline.call_in(Some(&self.key), op, Resume::Start)
    }

    /// Forces this partition's circuit open.
    ///
    /// # Errors
    /// When there is no circuit breaker or the store fails.
    pub fn isolate(&self) -> Result<(), ControlError> {
        self.pipeline
            .control(Some(&self.key), CircuitControl::Isolate)
    }

    /// Forces this partition's circuit closed.
    ///
    /// # Errors
    /// When there is no circuit breaker or the store fails.
    pub fn force_close(&self) -> Result<(), ControlError> {
        self.pipeline
            .control(Some(&self.key), CircuitControl::ForceClose)
    }

    /// Resets this partition's circuit.
    ///
    /// # Errors
    /// When there is no circuit breaker or the store fails.
    pub fn reset(&self) -> Result<(), ControlError> {
        self.pipeline
            .control(Some(&self.key), CircuitControl::Reset)
    }

    /// This partition's circuit state and window.
    ///
    /// # Errors
    /// When there is no circuit breaker or the store fails.
    pub fn circuit_metrics(&self) -> Result<CircuitMetrics, ControlError> {
        self.pipeline.metrics(Some(&self.key))
    }

    /// Attempts of this partition currently holding a bulkhead slot.
    ///
    /// # Errors
    /// When the store fails.
    pub fn in_flight(&self) -> Result<u32, StoreError> {
        match &self.pipeline.shared.gate {
            Some(g) => g.state.in_flight(Some(&self.key), self.pipeline.now()),
            None => Ok(0),
        }
    }
}
