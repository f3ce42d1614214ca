//! The pipeline: policies composed in declaration order, built once, shared
//! by every task and thread.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::breaker::{CircuitControl, CircuitMetrics, CircuitState, CircuitTransition};
use crate::bulkhead::queue::Queues;
use crate::clock::{ClockHandle, Random};
use crate::context::{Context, PartitionKey};
use crate::error::{ConfigError, Error, StoreError};
use crate::event::{EventKind, Listeners};
use crate::retry::Retry;
use crate::store::{MemoryResource, Permit, ResourceSpec, ResourceState};
use crate::timeout::Timeout;

#[cfg(any(feature = "tower", feature = "reqwest-middleware"))]
pub(crate) mod answer;
mod builder;
mod chain;
mod coalesced;
mod drive;
mod engine;
mod kind;
mod nested;
#[cfg(feature = "tracing")]
mod span;

#[cfg(feature = "serde")]
pub(crate) use builder::declare::Declared;
pub use builder::PipelineBuilder;
pub use coalesced::Coalesced;
#[cfg(feature = "reqwest")]
pub(crate) use drive::Judged;
pub(crate) use engine::{CallArgs, Given, Plain};
pub use kind::{
    AnyResult, BoxFallbackFuture, ErrorHandlers, ErrorKind, ErrorType, FallbackHandlers,
    FallbackKind, Handles, HandlesSync, Kind, OutcomeKind, ValueType, WithAsyncFallback,
    WithFallback,
};

/// The suffix of the resource that keeps the state of the stateful
/// policies declared before the retry (they guard the whole call): a
/// pipeline `users-api` keeps them as `users-api#call`, apart from those
/// declared after the retry (`users-api`, guarding each attempt). Its
/// first character is refused in a pipeline's name, so that no pipeline's
/// resource is another's call-level one.
pub(crate) const CALL_SUFFIX: &str = "#call";

/// The stateful policies of one level of a pipeline (each attempt, or the
/// whole call), bound to their store.
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
    /// An outcome may change state: anything but a gate holding only a
    /// retry budget kept in the store (never asked to record).
    pub(crate) records: bool,
    /// The bulkhead's queues of async calls waiting for a slot in this
    /// process (one per partition), when the bulkhead has a queue and
    /// enforces: those of every pipeline bound to `state` ([`Queues::of`]).
    pub(crate) queues: Option<Arc<Queues>>,
}

impl Gate {
    /// Gives `permit` of `partition` back without an outcome, waking the
    /// oldest waiter of the bulkhead's queue.
    pub(crate) fn release(&self, partition: Option<&PartitionKey>, permit: Permit) {
        self.state.release(partition, permit);
        self.freed(partition);
    }

    /// A slot of `partition` was given back in this process (a release, a
    /// record): the oldest waiter of its queue, if any, asks for it now.
    #[inline(always)]
    pub(crate) fn freed(&self, partition: Option<&PartitionKey>) {
        if let Some(queues) = &self.queues {
            queues.release(partition);
        }
    }
}

/// Facts about a pipeline computed once at build time for the hot path.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    /// The start of an attempt must be read from the clock: a timeout, a
    /// rate limit, a slow-call or time-window breaker, a store that is not
    /// in memory, or a registered listener.
    pub(crate) needs_time: bool,
    /// Sync calls read the clock at the end of an attempt with a deadline
    /// to tell a late result (a strict timeout).
    pub(crate) watch_late: bool,
    /// No stateful policy, no timeout, no retry budget, no listener: the
    /// first attempt of an unpartitioned call that no `tracing` subscriber
    /// watches is the operation itself, with a constant context (the engine
    /// admits, times and records nothing for it).
    pub(crate) bare: bool,
    /// Every call takes the engine's general loop from its start: the
    /// pipeline has a call-level gate (admitted before the first attempt),
    /// hedging (its own loop) or policies written in code that wrap the
    /// call or its attempts. One flag for the ordinary path to read.
    pub(crate) general: bool,
    /// The retry budget is kept in the store ([`RetryBudget::shared`]):
    /// every admission by the attempt's gate goes to the store's full
    /// admission, which earns or spends it.
    ///
    /// [`RetryBudget::shared`]: crate::RetryBudget::shared
    pub(crate) budget_in_store: bool,
    /// Nothing but a `tracing` subscriber can take a call off the ordinary
    /// path: not [`general`](Self::general), no registered listener, no
    /// chaos policy. One flag for [`First::start`](engine::First::start)
    /// to read before it asks each of them.
    pub(crate) in_place: bool,
}

pub(crate) struct Shared<K: Kind> {
    pub(crate) plan: Plan,
    pub(crate) name: &'static str,
    pub(crate) retry: Option<Retry>,
    /// Hedging, which makes the attempts instead of a retry (async only).
    pub(crate) hedging: Option<crate::hedge::Hedging>,
    pub(crate) overall_timeout: Option<Timeout>,
    pub(crate) attempt_timeout: Option<Timeout>,
    /// The stateful policies declared after the retry (or without one):
    /// they guard each attempt.
    pub(crate) gate: Option<Gate>,
    /// The stateful policies declared before the retry: admitted once at
    /// the start of the call, given its outcome once at its end.
    pub(crate) call_gate: Option<Gate>,
    pub(crate) clock: ClockHandle,
    pub(crate) random: Arc<dyn Random>,
    pub(crate) listeners: Listeners,
    pub(crate) handlers: K::Handlers,
    /// The error type this pipeline's rejections were noted with.
    pub(crate) noted: nested::Noted,
    /// The chaos policies, in declaration order (each attempt).
    pub(crate) chaos: Box<[crate::chaos::Chaos]>,
    /// The adaptive concurrency limit of each attempt, in this process.
    pub(crate) adaptive: Option<crate::adaptive::machine::Limiter>,
    /// Request coalescing and its cache, when declared.
    pub(crate) coalesce: Option<crate::coalesce::Coalescer>,
    /// The policies written in code (see `chain`).
    pub(crate) custom: chain::Customs,
}

impl<K: Kind> Shared<K> {
    /// A chaos policy may inject into a call that starts now (none is
    /// configured, or every one is switched off: `false`, one relaxed load
    /// each). Such a call takes the general loop, which asks each policy
    /// again for each attempt.
    #[inline(always)]
    pub(crate) fn chaos_may_inject(&self) -> bool {
        self.chaos.iter().any(crate::chaos::Chaos::may_inject)
    }
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
            .field("hedging", &s.hedging)
            .field("overall_timeout", &s.overall_timeout)
            .field("attempt_timeout", &s.attempt_timeout)
            .field("stateful", &s.gate.as_ref().map(|g| &g.spec))
            .field("call_stateful", &s.call_gate.as_ref().map(|g| &g.spec))
            .field("adaptive", &s.adaptive)
            .finish()
    }
}

impl Pipeline {
    /// Starts building a pipeline for the resource `name`. The name keys the
    /// shared state: pipelines with the same name and store share one
    /// circuit, bulkhead, rate limit and cooldown. The stateful policies
    /// declared before `retry` (guarding the whole call) keep their state
    /// as the resource `{name}#call`: pipelines share it when they declare
    /// the same policies on the same side of the retry. `build()` refuses
    /// an empty name and a name containing `#`.
    ///
    /// ```
    /// use seawall::Pipeline;
    ///
    /// let e = Pipeline::builder("orders#call").build().unwrap_err();
    /// assert_eq!((e.policy, e.field), ("pipeline", "name"));
    /// ```
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
    /// Notes that this pipeline ended a call with a rejection in `Error<E>`
    /// (see `nested`).
    pub(crate) fn note_rejection<T, E>(&self)
    where
        K: Handles<T, E>,
    {
        K::note_rejection(&self.shared.noted);
    }

    /// The resource name.
    pub fn name(&self) -> &str {
        self.shared.name
    }

    /// `true` when a call may make more than one attempt: a
    /// [`retry`](PipelineBuilder::retry) allowing more than one, or
    /// [`hedging`](PipelineBuilder::hedging) (its hedged attempts). What
    /// cannot be sent twice (a request moved into its attempt, a streaming
    /// body) fits only a pipeline for which this is `false`: the tower, reqwest
    /// and reqwest-middleware adapters refuse the others before anything is
    /// sent.
    ///
    /// A [policy written in code](crate::custom) may run what it wraps
    /// more than once as well; this tells nothing of it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use seawall::{Bulkhead, Hedging, Pipeline, Retry};
    ///
    /// let once = Pipeline::builder("a").bulkhead(Bulkhead::new(8)).build()?;
    /// let retried = Pipeline::builder("b").retry(Retry::constant(Duration::ZERO).max_attempts(2)).build()?;
    /// let hedged = Pipeline::builder("c").hedging(Hedging::latency(Duration::from_millis(50))).build()?;
    /// assert!(!once.may_attempt_more_than_once());
    /// assert!(retried.may_attempt_more_than_once());
    /// assert!(hedged.may_attempt_more_than_once());
    /// # Ok::<_, seawall::ConfigError>(())
    /// ```
    pub fn may_attempt_more_than_once(&self) -> bool {
        let s = &self.shared;
        s.retry.as_ref().is_some_and(|r| r.max_attempts > 1)
            || s.hedging
                .as_ref()
                .is_some_and(|h| h.max_hedged_attempts > 0)
    }

    /// `true` when a call may run its operation more than once: it
    /// [may make more than one attempt](Self::may_attempt_more_than_once),
    /// or it has a [policy written in code](crate::custom), which may run
    /// what it wraps again.
    #[cfg_attr(not(feature = "reqwest"), allow(dead_code))]
    pub(crate) fn may_run_operation_more_than_once(&self) -> bool {
        self.may_attempt_more_than_once() || !self.shared.custom.is_empty()
    }

    /// `true` when the attempts of a call may run at the same time: with
    /// [`hedging`](PipelineBuilder::hedging), or a [policy written in
    /// code](crate::custom) (which may wait for several runs at once).
    #[cfg_attr(not(feature = "reqwest-middleware"), allow(dead_code))]
    pub(crate) fn may_overlap_attempts(&self) -> bool {
        self.shared.hedging.is_some() || !self.shared.custom.is_empty()
    }

    /// Runs calls under a partition key: the partition gets its own circuit,
    /// bulkhead, rate limit and cooldown.
    pub fn partition(&self, key: impl Into<PartitionKey>) -> Partition<'_, K> {
        Partition {
            pipeline: self,
            key: key.into(),
        }
    }

    /// Runs calls that each take `weight` permits of the rate limiter at
    /// once (an API priced in cost units, a batch of `weight` rows):
    /// `pipeline.weighted(4)?.run(..)`. Every attempt is admitted for all
    /// its permits or none; a call with a `max_wait` waits for all of
    /// them. A weight the rate limiter can never grant (more than the
    /// burst of a GCRA, the limit of a window:
    /// [`RateLimiter::grants`](crate::RateLimiter::grants)) is refused at
    /// once with
    /// [`RejectionReason::RateLimited`](crate::RejectionReason::RateLimited)
    /// and no `retry_after`, on every store, also one that cannot be
    /// reached; a limiter in [shadow mode](crate::shadow) reports that
    /// refusal instead (`ShadowRejected`, no `retry_after`) and the call
    /// runs. The other policies count each attempt once.
    /// A weighted call takes the same path through the engine as any
    /// other: its weight goes to the same admission.
    ///
    /// # Errors
    /// A weight of 0: `rate_limit.weight must be >= 1, got 0`.
    pub fn weighted(&self, weight: u32) -> Result<Weighted<'_, K>, ConfigError> {
        Weighted::new(self, None, weight)
    }

    /// Calls that share one execution with the concurrent calls of the
    /// same `key` (and result type), and, with a cache, are answered by a
    /// fresh success of that key: `pipeline.coalesce_key(user_id).run(..)`.
    /// See [`crate::coalesce`]. On a pipeline without
    /// [`coalesce`](PipelineBuilder::coalesce) they run as plain calls.
    ///
    /// ```
    /// use seawall::{Coalesce, Pipeline};
    ///
    /// let pipeline = Pipeline::builder("profiles").coalesce(Coalesce::new()).build()?;
    /// let profile = pipeline
    ///     .coalesce_key("user-7")
    ///     .call(|_ctx| Ok::<_, std::sync::Arc<std::io::Error>>(String::from("ada")))?;
    /// assert_eq!(profile, "ada");
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    pub fn coalesce_key(&self, key: impl Into<PartitionKey>) -> Coalesced<'_, K> {
        Coalesced::new(self, None, Some(key.into()))
    }

    /// Calls that share one execution with every concurrent call of this
    /// pipeline made the same way (and of the same result type): for a
    /// pipeline that stands for one resource (the configuration, a token).
    /// See [`coalesce_key`](Self::coalesce_key).
    pub fn coalesced(&self) -> Coalesced<'_, K> {
        Coalesced::new(self, None, None)
    }

    /// Coalesced calls currently waiting for the execution of another call
    /// with the same key (0 without [`coalesce`](PipelineBuilder::coalesce)).
    pub fn coalesced_waiters(&self) -> usize {
        self.shared
            .coalesce
            .as_ref()
            .map_or(0, crate::coalesce::Coalescer::waiters)
    }

    /// Forces the circuit open: every call is rejected, without a
    /// `retry_after`, until [`reset`](Self::reset) (or another control:
    /// [`open_for`](Self::open_for), [`disable`](Self::disable)); no
    /// cooldown ends it.
    ///
    /// Like every control and reading of a `Pipeline` ([`circuit_state`](Self::circuit_state)
    /// included), it acts on the circuit of the calls made without a
    /// partition: a partition's circuit is its own, controlled through
    /// [`Partition::isolate`] and its siblings. Pipelines of the same name
    /// on the same store share the circuit, and so its controls.
    ///
    /// # Errors
    /// When there is no circuit breaker or the store fails.
    pub fn isolate(&self) -> Result<(), ControlError> {
        self.control(None, CircuitControl::Isolate)
    }

    /// Forces the circuit closed: the same as [`disable`](Self::disable).
    ///
    /// # Errors
    /// When there is no circuit breaker or the store fails.
    pub fn force_close(&self) -> Result<(), ControlError> {
        self.control(None, CircuitControl::ForceClose)
    }

    /// Disables the circuit (Resilience4j's `DISABLED`): every call is
    /// admitted and nothing is recorded, until [`enable`](Self::enable) or
    /// [`reset`](Self::reset). The window and trips it had are still shown
    /// by [`circuit_metrics`](Self::circuit_metrics). Reported as
    /// [`EventKind::CircuitClosed`]; disabling a disabled circuit changes
    /// nothing. With a shared store, every process sharing the circuit sees
    /// it disabled.
    ///
    /// ```
    /// use seawall::{CircuitBreaker, CircuitState, Pipeline};
    ///
    /// let p = Pipeline::builder("switched")
    ///     .circuit_breaker(CircuitBreaker::consecutive_failures(1))
    ///     .build()?;
    /// p.disable()?;
    /// let _ = p.call(|_| Err::<(), _>("down"));
    /// assert_eq!(p.circuit_state()?, CircuitState::Disabled); // nothing recorded
    /// p.enable()?;
    /// assert_eq!(p.circuit_state()?, CircuitState::Closed);
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// When there is no circuit breaker or the store fails.
    pub fn disable(&self) -> Result<(), ControlError> {
        self.control(None, CircuitControl::ForceClose)
    }

    /// Enables a [disabled](Self::disable) circuit: it closes with an empty
    /// window and no trip history (reported as
    /// [`EventKind::CircuitClosed`]). A circuit that is not disabled is
    /// left as it is, so a switch can call it at any time.
    ///
    /// # Errors
    /// When there is no circuit breaker or the store fails.
    pub fn enable(&self) -> Result<(), ControlError> {
        self.control(None, CircuitControl::Enable)
    }

    /// Opens the circuit for `duration` from now, whatever its state (an
    /// administrative open, for maintenance of the dependency, say): calls
    /// are refused with the time left as their `retry_after`, and then the
    /// circuit half-opens and probes as after any cooldown. The trips so
    /// far are kept, so a failed probe afterwards opens it for the
    /// cooldown that follows them. Reported as
    /// [`EventKind::CircuitOpened`] with `duration` as the cooldown. The
    /// end is kept in whole milliseconds, rounded up; a zero duration
    /// half-opens the circuit at the next call. A duration past the clock's
    /// range (over `u64::MAX` nanoseconds) opens until its last instant and
    /// is reported as `Duration::from_nanos(u64::MAX)`: an open, not an
    /// isolation (whose cooldown reads `Duration::MAX`). See
    /// [`isolate`](Self::isolate) for an open without an end.
    ///
    /// ```
    /// use std::time::Duration;
    /// use seawall::testing::VirtualClock;
    /// use seawall::{CircuitBreaker, CircuitState, Error, Pipeline};
    ///
    /// let clock = VirtualClock::new();
    /// let p = Pipeline::builder("maintenance")
    ///     .circuit_breaker(CircuitBreaker::consecutive_failures(5))
    ///     .clock(clock.clone())
    ///     .build()?;
    /// p.open_for(Duration::from_secs(60))?;
    /// let refused = p.call(|_| Ok::<_, std::io::Error>(())).unwrap_err();
    /// assert!(matches!(refused, Error::Rejected(r) if r.retry_after == Some(Duration::from_secs(60))));
    /// clock.advance(Duration::from_secs(60));
    /// p.call(|_| Ok::<_, std::io::Error>(()))?; // the probe
    /// assert_eq!(p.circuit_state()?, CircuitState::Closed);
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// When there is no circuit breaker or the store fails.
    pub fn open_for(&self, duration: Duration) -> Result<(), ControlError> {
        self.control(None, CircuitControl::OpenFor(duration))
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

    /// Calls (bulkhead declared before `retry`) or attempts (after it)
    /// currently holding a bulkhead slot (0 without a bulkhead).
    ///
    /// # Errors
    /// When the store fails.
    pub fn in_flight(&self) -> Result<u32, StoreError> {
        match self.bulkhead_gate() {
            Some(g) => g.state.in_flight(None, self.now()),
            None => Ok(0),
        }
    }

    /// The adaptive concurrency limit as it stands (`None` without one).
    ///
    /// ```
    /// use seawall::{AdaptiveLimit, Pipeline};
    ///
    /// let pipeline = Pipeline::builder("limit-doc")
    ///     .adaptive_limit(AdaptiveLimit::aimd().limits(5, 10, 50))
    ///     .build()?;
    /// let now = pipeline.concurrency_limit().expect("declared");
    /// assert_eq!((now.limit, now.admitted, now.in_flight), (10, 10, 0));
    /// # Ok::<_, seawall::ConfigError>(())
    /// ```
    pub fn concurrency_limit(&self) -> Option<crate::adaptive::LimitSnapshot> {
        self.shared.adaptive.as_ref().map(|l| l.snapshot())
    }

    /// What the adaptive limit found so far (`None` without one), for the
    /// pipeline that replaces this one on a reload.
    #[cfg(feature = "serde")]
    pub(crate) fn learned_limit(&self) -> Option<crate::adaptive::machine::Learned> {
        self.shared.adaptive.as_ref().map(|l| l.learned())
    }

    /// The gates of the pipeline: the attempt's, then the call's.
    fn gates(&self) -> impl Iterator<Item = &Gate> {
        self.shared.gate.iter().chain(self.shared.call_gate.iter())
    }

    /// The gate that holds the bulkhead, else the attempt's.
    fn bulkhead_gate(&self) -> Option<&Gate> {
        self.gates()
            .find(|g| g.spec.bulkhead.is_some())
            .or(self.shared.gate.as_ref())
    }

    /// Drops the state of partitions idle for longer than allowed; returns
    /// how many were dropped.
    pub fn evict_idle_partitions(&self) -> usize {
        let now = self.now();
        self.gates().map(|g| g.state.evict_idle(now)).sum()
    }

    /// Partitions whose state is held in memory (counted once per level:
    /// a partition of a pipeline with policies on both sides of the retry
    /// counts twice).
    pub fn partitions(&self) -> usize {
        self.gates().map(|g| g.state.partitions()).sum()
    }

    fn now(&self) -> Duration {
        Duration::from_nanos(self.shared.clock.now_nanos())
    }

    fn circuit_gate(&self) -> Result<&Gate, ControlError> {
        self.gates()
            .find(|g| g.spec.circuit.is_some())
            .ok_or(ControlError::NoCircuitBreaker(self.shared.name))
    }

    fn control(
        &self,
        partition: Option<&PartitionKey>,
        c: CircuitControl,
    ) -> Result<(), ControlError> {
        let gate = self.circuit_gate()?;
        // No clock reading lies past `u64::MAX` ns: a longer open ends
        // there, and is told from `isolate` (`Duration::MAX`).
        let c = match c {
            CircuitControl::OpenFor(d) => {
                CircuitControl::OpenFor(d.min(Duration::from_nanos(u64::MAX)))
            }
            c => c,
        };
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
        self.emit(partition, || EventKind::of_transition(t))
    }

    /// Runs an async operation through the pipeline.
    ///
    /// The closure is called once per attempt with the attempt's
    /// [`Context`] and returns the attempt's future; with a timeout, the
    /// future is dropped at the deadline.
    ///
    /// With the `tracing` feature, each attempt of the operation (the call
    /// of the closure and its future) runs inside a span `seawall.call`
    /// (level `INFO`, target `seawall`, fields `pipeline`, `partition`,
    /// `attempt`) when a subscriber wants that span as the call starts; the
    /// operation's own events nest in it.
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
        self.run_in(Plain, op)
    }

    /// [`run`](Self::run) in `partition`: the operation as given, or in the
    /// spans of its attempts when a subscriber wants them.
    #[cfg(not(feature = "tracing"))]
    #[inline(always)]
    fn run_in<'a, T, E, Op, Fut, A>(
        &'a self,
        args: A,
        op: Op,
    ) -> impl Future<Output = Result<T, Error<E>>> + use<'a, K, T, E, Op, Fut, A>
    where
        K: Handles<T, E>,
        Op: FnMut(Context) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        A: CallArgs<'a>,
    {
        self.drive_async(args, op)
    }

    #[cfg(feature = "tracing")]
    #[inline(always)]
    fn run_in<'a, T, E, Op, Fut, A>(
        &'a self,
        args: A,
        op: Op,
    ) -> impl Future<Output = Result<T, Error<E>>> + use<'a, K, T, E, Op, Fut, A>
    where
        K: Handles<T, E>,
        Op: FnMut(Context) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        A: CallArgs<'a>,
    {
        if span::wanted() {
            let op = span::async_op(self.shared.name, args.partition(), op);
            span::Either::Traced {
                future: self.drive_async(args, op),
            }
        } else {
            span::Either::Plain {
                future: self.drive_async(args, op),
            }
        }
    }

    /// [`call`](Self::call) in `partition`; see [`run_in`](Self::run_in).
    #[inline(always)]
    fn call_in<'a, T, E, Op>(&'a self, args: impl CallArgs<'a>, op: Op) -> Result<T, Error<E>>
    where
        K: HandlesSync<T, E>,
        Op: FnMut(Context) -> Result<T, E>,
    {
        #[cfg(feature = "tracing")]
        if span::wanted() {
            return self.call_traced(args, op);
        }
        self.drive_sync(args, op)
    }

    /// [`call_in`](Self::call_in) with the spans: out of the way of the
    /// call nobody traces.
    #[cfg(feature = "tracing")]
    #[cold]
    #[inline(never)]
    fn call_traced<'a, T, E, Op>(&'a self, args: impl CallArgs<'a>, op: Op) -> Result<T, Error<E>>
    where
        K: HandlesSync<T, E>,
        Op: FnMut(Context) -> Result<T, E>,
    {
        let op = span::sync_op(self.shared.name, args.partition(), op);
        self.drive_sync(args, op)
    }

    /// Runs a blocking operation through the pipeline on the calling thread.
    ///
    /// Timeouts are cooperative here: the deadline is in the [`Context`];
    /// a late success is kept and reported by a `DeadlineExceeded` event, or
    /// becomes [`Error::Timeout`] under [`Timeout::strict`]. A full bulkhead
    /// rejects at once.
    ///
    /// With the `tracing` feature, each attempt runs inside a span
    /// `seawall.call`, as for [`run`](Self::run).
    ///
    /// # Errors
    /// As for [`run`](Self::run).
    #[inline]
    pub fn call<T, E, Op>(&self, op: Op) -> Result<T, Error<E>>
    where
        K: HandlesSync<T, E>,
        Op: FnMut(Context) -> Result<T, E>,
    {
        self.call_in(Plain, op)
    }

    /// The context of attempt `attempt` with `deadline`, for the fallback.
    pub(crate) fn context(
        &self,
        partition: Option<&PartitionKey>,
        attempt: u32,
        deadline: Option<u64>,
    ) -> Context {
        Context::new(
            self.shared.name,
            attempt,
            deadline,
            &self.shared.clock,
            partition,
        )
    }
}

/// A pipeline whose calls take several rate-limit permits each; see
/// [`Pipeline::weighted`] and [`Partition::weighted`].
#[derive(Debug)]
pub struct Weighted<'p, K: Kind = AnyResult> {
    pipeline: &'p Pipeline<K>,
    key: Option<PartitionKey>,
    weight: u32,
}

impl<'p, K: Kind> Weighted<'p, K> {
    fn new(
        pipeline: &'p Pipeline<K>,
        key: Option<PartitionKey>,
        weight: u32,
    ) -> Result<Self, ConfigError> {
        if weight == 0 {
            return Err(ConfigError::new(
                "rate_limit",
                "weight",
                format!("must be >= 1, got {weight}"),
            ));
        }
        Ok(Weighted {
            pipeline,
            key,
            weight,
        })
    }

    /// The rate-limit permits each attempt takes.
    pub fn weight(&self) -> u32 {
        self.weight
    }

    /// The partition key, if the calls run in a partition.
    pub fn key(&self) -> Option<&PartitionKey> {
        self.key.as_ref()
    }

    /// Runs an async operation taking [`weight`](Self::weight) permits.
    /// See [`Pipeline::run`].
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
        self.pipeline.run_in(
            Given {
                partition: self.key.as_ref(),
                weight: self.weight,
                fallback_seen: None,
            },
            op,
        )
    }

    /// Runs a blocking operation taking [`weight`](Self::weight) permits.
    /// See [`Pipeline::call`].
    ///
    /// # Errors
    /// As for [`Pipeline::call`].
    pub fn call<T, E, Op>(&self, op: Op) -> Result<T, Error<E>>
    where
        K: HandlesSync<T, E>,
        Op: FnMut(Context) -> Result<T, E>,
    {
        self.pipeline.call_in(
            Given {
                partition: self.key.as_ref(),
                weight: self.weight,
                fallback_seen: None,
            },
            op,
        )
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

    /// Calls in this partition taking `weight` rate-limit permits each; see
    /// [`Pipeline::weighted`].
    ///
    /// # Errors
    /// A weight of 0: `rate_limit.weight must be >= 1, got 0`.
    pub fn weighted(self, weight: u32) -> Result<Weighted<'p, K>, ConfigError> {
        Weighted::new(self.pipeline, Some(self.key), weight)
    }

    /// Calls in this partition that share one execution per partition
    /// (see [`crate::coalesce`]): concurrent calls of the same partition
    /// and result type run the operation once.
    pub fn coalesced(self) -> Coalesced<'p, K> {
        Coalesced::new(self.pipeline, Some(self.key), None)
    }

    /// Calls in this partition that share one execution per partition and
    /// `key` (see [`crate::coalesce`]).
    pub fn coalesce_key(self, key: impl Into<PartitionKey>) -> Coalesced<'p, K> {
        Coalesced::new(self.pipeline, Some(self.key), Some(key.into()))
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
        self.pipeline.run_in(Given::partitioned(&self.key), op)
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
        self.pipeline.call_in(Given::partitioned(&self.key), op)
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

    /// Disables this partition's circuit; see [`Pipeline::disable`].
    ///
    /// # Errors
    /// When there is no circuit breaker or the store fails.
    pub fn disable(&self) -> Result<(), ControlError> {
        self.pipeline
            .control(Some(&self.key), CircuitControl::ForceClose)
    }

    /// Enables this partition's circuit if it is disabled; see
    /// [`Pipeline::enable`].
    ///
    /// # Errors
    /// When there is no circuit breaker or the store fails.
    pub fn enable(&self) -> Result<(), ControlError> {
        self.pipeline
            .control(Some(&self.key), CircuitControl::Enable)
    }

    /// Opens this partition's circuit for `duration`; see
    /// [`Pipeline::open_for`].
    ///
    /// # Errors
    /// When there is no circuit breaker or the store fails.
    pub fn open_for(&self, duration: Duration) -> Result<(), ControlError> {
        self.pipeline
            .control(Some(&self.key), CircuitControl::OpenFor(duration))
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
        match self.pipeline.bulkhead_gate() {
            Some(g) => g.state.in_flight(Some(&self.key), self.pipeline.now()),
            None => Ok(0),
        }
    }
}
