//! The pipeline builder: policies declared in order, validated at `build()`.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::kind::{
    AnyResult, ErrorHandlers, ErrorKind, FallbackHandlers, FallbackKind, Kind, OutcomeKind,
    WithAsyncFallback, WithFallback,
};
use super::{Gate, Pipeline, Plan, Shared, CALL_SUFFIX};
use crate::adaptive::machine::{Learned, Limiter};
use crate::adaptive::AdaptiveLimit;
use crate::breaker::CircuitBreaker;
use crate::bulkhead::queue::Queues;
use crate::bulkhead::Bulkhead;
use crate::chaos::{Chaos, ChaosFault, ChaosOutcome};
use crate::classify::Verdict;
use crate::clock::{Clock, ClockHandle, Random, SystemRandom};
use crate::coalesce::{Coalesce, Coalescer};
use crate::context::{intern, Context};
use crate::cooldown::Cooldown;
use crate::error::{ConfigError, Error};
use crate::event::{Event, Listener, Listeners};
use crate::hedge::Hedging;
use crate::rate_limit::RateLimiter;
use crate::retry::{Retry, RetryBudget};
use crate::store::{MemoryStore, ResourceSpec, ResourceState, StateStore};
use crate::timeout::Timeout;
use declare::{Declared, Guards};

#[path = "declare.rs"]
pub(crate) mod declare;

/// Builds a [`Pipeline`]. Every method takes and returns the builder by
/// value; builders are `Clone`, so a half-built builder can serve as a
/// template.
///
/// # Order
/// Policies nest in declaration order, outermost first; `build()` checks
/// the order. [`coalesce`](Self::coalesce) is declared first, if at all: it
/// shares one execution of the whole call. A timeout declared before [`retry`](Self::retry) (or without
/// one) bounds the whole call, one declared after it each attempt. The
/// stateful policies ([`circuit_breaker`](Self::circuit_breaker),
/// [`bulkhead`](Self::bulkhead), [`cooldown`](Self::cooldown),
/// [`rate_limiter`](Self::rate_limiter)) are declared once each, on
/// either side of the retry:
///
/// - **after the retry** (or in a pipeline without one) they guard each
///   attempt: every attempt is admitted and its outcome recorded, a
///   bulkhead slot is held only while an attempt runs, each attempt takes
///   a rate-limit permit;
/// - **before the retry** they guard the whole call: the call is admitted
///   once before its first attempt and its final outcome recorded once
///   (before the fallback): a success, the verdict of the final error, a
///   timeout as a failure. A call whose attempt failed and whose next
///   attempt is refused (by a policy after the retry, the retry budget, a
///   refused hedge) records that failure, and returns the refusal; a call
///   refused before any attempt failed, or failed by the store, gives its
///   admission back without an outcome. One exhausted retry is one
///   failure in the circuit's window, a slow call is measured over the
///   whole call, a
///   bulkhead slot is held for the whole call, **retry waits included**, a
///   rate limiter takes one permit per call, a cooldown is opened by the
///   final error's retry-after hint.
///
/// Both may be combined, e.g. a breaker outside the retry and a bulkhead
/// inside it. On each side the policies are admitted together in the order
/// circuit breaker, bulkhead, cooldown, rate limiter. The policies declared
/// before the retry keep their state in the store as the resource
/// `{name}#call` (which is why a name may not contain `#`), apart from
/// those declared after it (`{name}`): two pipelines (or processes) share a
/// state when they declare the same policies on the same side.
///
/// ```
/// use std::time::Duration;
/// use seawall::{CircuitBreaker, CircuitState, Pipeline, Retry};
///
/// let pipeline = Pipeline::builder("orders-doc")
///     .circuit_breaker(CircuitBreaker::consecutive_failures(2))
///     .retry(Retry::constant(Duration::from_millis(1)).max_attempts(3))
///     .build()?;
/// let mut tries = 0;
/// let r = pipeline.call(|_ctx| {
///     tries += 1;
///     Err::<(), _>(std::io::Error::other("down"))
/// });
/// assert!(r.is_err());
/// // Three attempts, one failure in the circuit's window.
/// assert_eq!(tries, 3);
/// assert_eq!(pipeline.circuit_metrics()?.failures, 1);
/// assert_eq!(pipeline.circuit_state()?, CircuitState::Closed);
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// ```
///
/// # Default
/// No policy; the process-wide [`MemoryStore::global`] store; the system
/// clock and random source; partitions evicted after 10 minutes idle.
pub struct PipelineBuilder<K: Kind = AnyResult> {
    name: String,
    /// The policies in declaration order, outermost first.
    declared: Vec<Declared>,
    store: Option<Arc<dyn StateStore>>,
    memory_store: Option<MemoryStore>,
    clock: ClockHandle,
    random: Option<Arc<dyn Random>>,
    listeners: Vec<Listener>,
    partition_idle: Duration,
    strict_names: bool,
    handlers: K::Handlers,
    /// A configuration error found before `build()` (a configuration file
    /// naming what only a registry can declare), which `build()` returns.
    refused: Option<ConfigError>,
    /// What the adaptive limit of the pipeline this one replaces found (a
    /// registry's reload), to go on from.
    learned: Option<Learned>,
}

impl<K: Kind> Clone for PipelineBuilder<K> {
    fn clone(&self) -> Self {
        PipelineBuilder {
            name: self.name.clone(),
            declared: self.declared.clone(),
            store: self.store.clone(),
            memory_store: self.memory_store.clone(),
            clock: self.clock.clone(),
            random: self.random.clone(),
            listeners: self.listeners.clone(),
            partition_idle: self.partition_idle,
            strict_names: self.strict_names,
            handlers: self.handlers.clone(),
            refused: self.refused.clone(),
            learned: self.learned,
        }
    }
}

impl<K: Kind> fmt::Debug for PipelineBuilder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PipelineBuilder")
            .field("name", &self.name)
            .field("policies", &self.declared)
            .finish_non_exhaustive()
    }
}

impl PipelineBuilder<AnyResult> {
    pub(super) fn new(name: String) -> Self {
        PipelineBuilder {
            name,
            declared: Vec::new(),
            store: None,
            memory_store: None,
            clock: ClockHandle::System,
            random: None,
            listeners: Vec::new(),
            partition_idle: Duration::from_secs(600),
            strict_names: false,
            handlers: (),
            refused: None,
            learned: None,
        }
    }
}

impl<K: Kind> PipelineBuilder<K> {
    /// Appends a policy to the declared list; `build()` checks the order.
    pub(crate) fn declare(mut self, policy: Declared) -> Self {
        self.declared.push(policy);
        self
    }

    /// Makes `build()` fail with `error` (the first one given).
    #[cfg(feature = "serde")]
    pub(crate) fn refuse(mut self, error: ConfigError) -> Self {
        self.refused.get_or_insert(error);
        self
    }

    /// Lets the adaptive limit go on from what the one of a replaced
    /// pipeline found, when their rules' settings are the same.
    #[cfg(feature = "serde")]
    pub(crate) fn resume_limit(mut self, learned: Option<Learned>) -> Self {
        self.learned = learned;
        self
    }

    /// The declared policies, in order (for tests of the registration).
    #[cfg(all(test, feature = "serde"))]
    pub(crate) fn declared_kinds(&self) -> Vec<seawall_order::PolicyKind> {
        self.declared.iter().map(Declared::kind).collect()
    }

    /// Adds request coalescing: concurrent calls made with the same key
    /// ([`Pipeline::coalesce_key`], [`Partition::coalesced`](super::Partition::coalesced))
    /// share one execution of the whole call, and with a `ttl` a cache of
    /// successes answers them (see [`crate::coalesce`]). Declare it first:
    /// `build()` refuses it after another policy.
    ///
    /// ```
    /// use std::time::Duration;
    /// use seawall::{Coalesce, Pipeline};
    ///
    /// let e = Pipeline::builder("prices")
    ///     .coalesce(Coalesce::new().ttl(Duration::ZERO))
    ///     .build()
    ///     .unwrap_err();
    /// assert!(e.to_string().starts_with("coalesce.ttl must be > 0"));
    /// ```
    pub fn coalesce(self, coalesce: Coalesce) -> Self {
        self.declare(Declared::Coalesce(coalesce))
    }

    /// Adds a retry policy. Timeouts declared after it bound each attempt,
    /// stateful policies declared after it guard each attempt; those
    /// declared before it bound and guard the whole call (see
    /// [Order](Self#order)).
    pub fn retry(self, retry: Retry) -> Self {
        self.declare(Declared::Retry(retry))
    }

    /// Adds hedging (async only; see [`crate::hedge`]): further attempts
    /// of the call start while earlier ones run, and the first acceptable
    /// answer wins. It takes the place of [`retry`](Self::retry) (a
    /// pipeline declares one of the two): a timeout declared after it
    /// bounds each hedged attempt, stateful policies declared after it
    /// guard each hedged attempt (a bulkhead slot and a circuit record per
    /// attempt), those declared before it the whole call. A blocking
    /// [`Pipeline::call`] on a pipeline with hedging returns
    /// [`Error::Config`] without running the operation.
    ///
    /// ```
    /// use std::time::Duration;
    /// use seawall::{Bulkhead, CircuitBreaker, Hedging, Pipeline};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pipeline = Pipeline::builder("quotes-doc")
    ///     .timeout(Duration::from_secs(1)) // the whole call
    ///     .hedging(Hedging::latency(Duration::from_millis(20)).max_hedged_attempts(2))
    ///     .circuit_breaker(CircuitBreaker::consecutive_failures(5)) // each attempt
    ///     .bulkhead(Bulkhead::new(8)) // a slot per attempt
    ///     .build()?;
    /// let quote = pipeline.run(|ctx| async move { Ok::<_, std::io::Error>(ctx.attempt()) }).await?;
    /// assert_eq!(quote, 1);
    /// let e = pipeline.call(|_ctx| Ok::<_, std::io::Error>(0)).unwrap_err();
    /// assert!(matches!(e, seawall::Error::Config(_)));
    /// # Ok(()) }
    /// ```
    pub fn hedging(self, hedging: Hedging) -> Self {
        self.declare(Declared::Hedging(hedging))
    }

    /// Adds a timeout: for the whole call when declared before `retry` (or
    /// when there is no retry), for each attempt when declared after it.
    /// Takes a `Duration` (lenient in sync code) or a [`Timeout`].
    ///
    /// The deadline runs from the start of the call or the attempt, so it
    /// covers the waits of its admission (for a rate-limit permit, the end
    /// of a cooldown, a queue slot) wherever it is declared among the
    /// policies of its side of the retry: the policies of one side admit
    /// together, and a wait that would not end by the deadline is refused
    /// at once.
    pub fn timeout(self, timeout: impl Into<Timeout>) -> Self {
        self.declare(Declared::Timeout(timeout.into()))
    }

    /// Adds a circuit breaker: of each attempt after `retry`, of the whole call
    /// before it (one exhausted retry is one failure; see [Order](Self#order)).
    pub fn circuit_breaker(self, breaker: CircuitBreaker) -> Self {
        self.declare(Declared::CircuitBreaker(breaker))
    }

    /// Adds a bulkhead: a slot per attempt after `retry`, per call before it
    /// (held through the retry waits; see [Order](Self#order)).
    pub fn bulkhead(self, bulkhead: Bulkhead) -> Self {
        self.declare(Declared::Bulkhead(bulkhead))
    }

    /// Adds a cooldown opened by retry-after hints: of each attempt after
    /// `retry`, of the whole call before it (opened by the final error's hint;
    /// see [Order](Self#order)).
    pub fn cooldown(self, cooldown: Cooldown) -> Self {
        self.declare(Declared::Cooldown(cooldown))
    }

    /// Adds a rate limiter: a permit per attempt after `retry`, per call before
    /// it (see [Order](Self#order)).
    pub fn rate_limiter(self, limiter: RateLimiter) -> Self {
        self.declare(Declared::RateLimiter(limiter))
    }

    /// Adds an adaptive concurrency limit (AIMD, Vegas or Gradient2; see
    /// [`crate::adaptive`]): a cap on the attempts in flight in this
    /// process that follows the latency and the errors it measures.
    /// Declared after [`retry`](Self::retry), or in a pipeline without one:
    /// `build()` refuses it before the retry.
    pub fn adaptive_limit(self, limit: AdaptiveLimit) -> Self {
        self.declare(Declared::AdaptiveLimit(limit))
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

    /// Refuses to build when a live pipeline of the same name on the same
    /// [`MemoryStore`] has different stateful settings (circuit breaker,
    /// bulkhead, cooldown, rate limiter or `partition_idle`): such
    /// pipelines would not share state, whatever their common name says.
    /// Without it the build succeeds, and with the `tracing` feature logs a
    /// warning. A pipeline of equal settings shares the state; once every
    /// pipeline of the old settings is dropped the name is free again.
    /// Shared stores such as Redis key state by name alone and are not
    /// checked.
    ///
    /// ```
    /// use seawall::{CircuitBreaker, MemoryStore, Pipeline};
    ///
    /// let store = MemoryStore::new();
    /// let _a = Pipeline::builder("payments")
    ///     .store(store.clone())
    ///     .circuit_breaker(CircuitBreaker::consecutive_failures(5))
    ///     .build()?;
    /// let e = Pipeline::builder("payments")
    ///     .store(store.clone())
    ///     .circuit_breaker(CircuitBreaker::consecutive_failures(10))
    ///     .strict_names()
    ///     .build()
    ///     .unwrap_err();
    /// assert!(e.to_string().contains("`payments` is bound on this store by a live pipeline with a different circuit_breaker"));
    /// # Ok::<_, seawall::ConfigError>(())
    /// ```
    ///
    /// # Default
    /// Off: a name bound again with other settings gets a resource of its
    /// own (what a configuration reload needs).
    pub fn strict_names(mut self) -> Self {
        self.strict_names = true;
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

    /// Hedges only errors matching `predicate`: with
    /// [`hedging`](Self::hedging), an error the classifier judges a
    /// retryable failure starts the next hedged attempt only when it
    /// matches; any other error is an acceptable answer and ends the call.
    /// `abort_if` wins over it. (The retry is narrowed by
    /// [`retry_if`](Self::retry_if).)
    pub fn hedge_if<E, F>(self, predicate: F) -> PipelineBuilder<K::Out>
    where
        K: ErrorKind<E>,
        F: Fn(&E) -> bool + Send + Sync + 'static,
    {
        self.map_errors(move |mut h| {
            h.hedge_if = Some(Arc::new(predicate));
            h
        })
    }

    /// Calls `hook(error, attempt, delay)` before each retry wait that
    /// follows an error of the operation. A retry after an attempt that
    /// timed out (which has no `E`) is not reported here: the
    /// [`RetryScheduled`](crate::EventKind::RetryScheduled) event reports
    /// every retry. With a budget shared through the store the retry is
    /// admitted after the wait, and may still be refused then.
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

    /// Adds a chaos policy (a latency or a behaviour: see [`crate::chaos`]),
    /// applied to each attempt before the operation. Declare it after
    /// [`retry`](Self::retry): `build()` refuses chaos declared before it.
    pub fn chaos(self, chaos: Chaos) -> Self {
        self.declare(Declared::Chaos(chaos))
    }

    /// Adds a chaos fault policy ([`Chaos::fault`]): a share of attempts
    /// ends with the generated error of type `E` without running the
    /// operation. Fixes the error type of the pipeline, like
    /// [`classify`](Self::classify). Declared like [`chaos`](Self::chaos).
    pub fn chaos_fault<E>(self, fault: ChaosFault<E>) -> PipelineBuilder<K::Out>
    where
        K: ErrorKind<E>,
        E: 'static,
    {
        let mut slot = 0;
        let ChaosFault { mut chaos, fault } = fault;
        let this = self.map_errors(|mut h| {
            slot = h.faults.len();
            h.faults.push(fault);
            h
        });
        chaos.action = crate::chaos::Action::Fault(slot);
        this.declare(Declared::Chaos(chaos))
    }

    /// Adds a chaos outcome policy ([`Chaos::outcome`]): a share of
    /// attempts ends with the generated value of type `T`, as a success,
    /// without running the operation. Fixes the value type of the pipeline
    /// ([`ValueType`](super::ValueType), or the fallback's); `E` is the
    /// error type fixed before, or inferred from the calls. Declared like
    /// [`chaos`](Self::chaos).
    pub fn chaos_outcome<T, E>(self, outcome: ChaosOutcome<T>) -> PipelineBuilder<K::Out>
    where
        K: OutcomeKind<T, E>,
        T: 'static,
        E: 'static,
    {
        let mut slot = 0;
        let ChaosOutcome { mut chaos, outcome } = outcome;
        let h = K::map_outcomes(self.handlers.clone(), |mut h| {
            slot = h.outcomes.len();
            h.outcomes.push(Arc::new(outcome));
            h
        });
        chaos.action = crate::chaos::Action::Outcome(slot);
        self.with_handlers(h).declare(Declared::Chaos(chaos))
    }

    /// Adds a policy written in code ([`crate::custom`]) at the place it
    /// stands in the chain: declare it where its
    /// [`position`](crate::custom::Policy::position) says (around the whole
    /// call: before `retry` and before the other policies of the call but a
    /// timeout; around each attempt: after `retry`, the timeouts and the
    /// stateful policies of the attempt, before chaos). `build()` checks the
    /// order, and refuses a policy declared where its position cannot be, or
    /// two policies of one name.
    ///
    /// Fixes the value and error types of the pipeline, as
    /// [`chaos_outcome`](Self::chaos_outcome) does
    /// ([`ValueType`](super::ValueType), or the fallback's kind): the
    /// policy answers for `Result<T, E>`; both are inferred from the calls
    /// when nothing fixed them before.
    ///
    /// ```
    /// use seawall::custom::{Next, Policy, PolicyFuture, Position};
    /// use seawall::{Context, Pipeline, Retry};
    ///
    /// /// Claims a position it cannot have here.
    /// struct Audit;
    /// impl<T: Send + 'static, E: Send + 'static> Policy<T, E> for Audit {
    ///     fn name(&self) -> &str { "audit" }
    ///     fn position(&self) -> Position { Position::Call }
    ///     fn call<'a>(&'a self, _: Context, next: Next<'a, T, E>) -> PolicyFuture<'a, T, E> {
    ///         Box::pin(async move { next.run().await })
    ///     }
    /// }
    ///
    /// let e = Pipeline::builder("ledger")
    ///     .retry(Retry::constant(std::time::Duration::ZERO))
    ///     .policy::<u32, std::io::Error, _>(Audit)
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!((e.policy, e.field), ("audit", "position"));
    /// assert!(e.rule.contains("declared after `retry`"), "{e}");
    /// ```
    pub fn policy<T, E, P>(self, policy: P) -> PipelineBuilder<K::Out>
    where
        K: OutcomeKind<T, E>,
        T: Send + 'static,
        E: Send + 'static,
        P: crate::custom::Policy<T, E> + 'static,
    {
        let name = intern(policy.name());
        let position = policy.position();
        let policy: super::kind::CustomPolicy<T, E> = Arc::new(policy);
        self.bind_policy(name, position, policy)
    }

    /// Adds a policy written in code, kept as the pipeline keeps it; a
    /// declaration of it by name (from a configuration file) takes it, else
    /// it is declared here.
    pub(crate) fn bind_policy<T, E>(
        self,
        name: &'static str,
        position: crate::custom::Position,
        policy: super::kind::CustomPolicy<T, E>,
    ) -> PipelineBuilder<K::Out>
    where
        K: OutcomeKind<T, E>,
        T: 'static,
        E: 'static,
    {
        let mut slot = 0;
        let h = K::map_outcomes(self.handlers.clone(), |mut h| {
            slot = h.policies.len();
            h.policies.push(Arc::new(policy));
            h
        });
        let mut this = self.with_handlers(h);
        let named = this
            .declared
            .iter_mut()
            .filter_map(Declared::as_custom_mut)
            .find(|c| c.name == name && c.slot.is_none());
        match named {
            Some(c) => {
                c.slot = Some(slot);
                this
            }
            None => this.declare(Declared::custom(name, position, Some(slot))),
        }
    }

    /// The builder, of the kind that knows `T` and `E` (to bind policies
    /// written in code into it).
    #[cfg(feature = "serde")]
    pub(crate) fn value_type<T, E>(self) -> PipelineBuilder<K::Out>
    where
        K: OutcomeKind<T, E>,
    {
        let h = K::map_outcomes(self.handlers.clone(), |h| h);
        self.with_handlers(h)
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
            declared: self.declared,
            store: self.store,
            memory_store: self.memory_store,
            clock: self.clock,
            random: self.random,
            listeners: self.listeners,
            partition_idle: self.partition_idle,
            strict_names: self.strict_names,
            handlers,
            refused: self.refused,
            learned: self.learned,
        }
    }

    /// Validates the configuration and builds the pipeline.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the policy, the field and the rule, e.g.
    /// `retry.max_attempts must be >= 1, got 0`; or, when the store cannot
    /// prepare the resource, a `store` error.
    pub fn build(self) -> Result<Pipeline<K>, ConfigError> {
        if let Some(e) = self.refused {
            return Err(e);
        }
        let kinds = declare::check_order(&self.declared)?;
        if self.name.trim().is_empty() {
            return Err(ConfigError::new("pipeline", "name", "must not be empty"));
        }
        let separator = &CALL_SUFFIX[..1];
        if self.name.contains(separator) {
            return Err(ConfigError::new(
                "pipeline",
                "name",
                format!(
                    "must not contain `{separator}` (it names the state of the policies \
                     before the retry), got `{}`",
                    self.name
                ),
            ));
        }
        declare::validate(&self.declared, &kinds)?;
        if self.partition_idle.is_zero() {
            return Err(ConfigError::new(
                "pipeline",
                "partition_idle",
                "must be > 0",
            ));
        }
        let sorted = declare::sort(self.declared, &kinds);
        Assembly {
            name: self.name,
            retry: sorted.retry,
            hedging: sorted.hedging,
            overall_timeout: sorted.overall_timeout,
            attempt_timeout: sorted.attempt_timeout,
            call: sorted.call,
            attempt: sorted.attempt,
            store: self.store,
            memory_store: self.memory_store,
            clock: self.clock,
            random: self.random,
            listeners: self.listeners,
            partition_idle: self.partition_idle,
            strict_names: self.strict_names,
            handlers: self.handlers,
            chaos: sorted.chaos.into_boxed_slice(),
            adaptive: sorted.adaptive,
            learned: self.learned,
            coalesce: sorted.coalesce,
            custom: super::chain::Customs::new(
                sorted.custom_call,
                sorted.custom_outside_timeout,
                sorted.custom_attempt,
            ),
        }
        .assemble()
    }
}

/// A checked and validated declaration, sorted by role, and the builder's
/// settings: what a pipeline is assembled from.
struct Assembly<K: Kind> {
    name: String,
    retry: Option<Retry>,
    hedging: Option<Hedging>,
    overall_timeout: Option<Timeout>,
    attempt_timeout: Option<Timeout>,
    call: Guards,
    attempt: Guards,
    store: Option<Arc<dyn StateStore>>,
    memory_store: Option<MemoryStore>,
    clock: ClockHandle,
    random: Option<Arc<dyn Random>>,
    listeners: Vec<Listener>,
    partition_idle: Duration,
    strict_names: bool,
    handlers: K::Handlers,
    chaos: Box<[Chaos]>,
    adaptive: Option<AdaptiveLimit>,
    learned: Option<Learned>,
    coalesce: Option<Coalesce>,
    custom: super::chain::Customs,
}

impl<K: Kind> Assembly<K> {
    fn assemble(mut self) -> Result<Pipeline<K>, ConfigError> {
        let attempt = std::mem::take(&mut self.attempt);
        let call = std::mem::take(&mut self.call);
        // A retry budget kept in the store lives in the attempt's gate,
        // which admits every attempt: a gate of its own when no other
        // stateful policy guards the attempts.
        let stored_budget = self
            .retry
            .as_ref()
            .and_then(|r| r.budget.clone())
            .filter(RetryBudget::is_shared);
        let budget_in_store = stored_budget.is_some();
        let gate = self.gate(self.name.clone(), attempt, stored_budget)?;
        let call_gate = self.gate(format!("{}{CALL_SUFFIX}", self.name), call, None)?;
        let random: Arc<dyn Random> = self.random.unwrap_or_else(|| Arc::new(SystemRandom));
        let adaptive = self
            .adaptive
            .as_ref()
            .map(|a| Limiter::resuming(a, &self.clock, self.learned.as_ref()));
        let listeners = Listeners::new(self.listeners);
        let any_timeout = self.overall_timeout.is_some() || self.attempt_timeout.is_some();
        let general = call_gate.is_some()
            || self.hedging.is_some()
            || !self.custom.is_empty()
            || budget_in_store;
        let plan =
            Plan {
                // A memory gate reads the clock itself, only when a policy
                // needs the time (a cooldown in effect, a circuit that is not
                // closed); these need it for every attempt. (The adaptive
                // limit reads the clock itself, unscaled, at admission and
                // at the end.)
                needs_time: [&gate, &call_gate].into_iter().flatten().any(|g| {
                    g.memory.is_none() || g.spec.rate_limit.is_some() || g.record_needs_time
                }) || any_timeout
                    || listeners.registered(),
                watch_late: self.overall_timeout.is_some_and(|t| t.strict)
                    || self.attempt_timeout.is_some_and(|t| t.strict),
                // (Chaos switched off leaves a pipeline bare: the drivers
                // ask `chaos_may_inject` at the start of each call.)
                bare: gate.is_none()
                    && !listeners.registered()
                    && call_gate.is_none()
                    && self.adaptive.is_none()
                    && !any_timeout
                    && self.hedging.is_none()
                    && self.retry.as_ref().is_none_or(|r| r.budget.is_none())
                    && self.custom.is_empty(),
                general,
                budget_in_store,
                in_place: !general && !listeners.registered() && self.chaos.is_empty(),
            };
        Ok(Pipeline {
            shared: Arc::new(Shared {
                name: intern(&self.name),
                retry: self.retry,
                hedging: self.hedging,
                overall_timeout: self.overall_timeout,
                attempt_timeout: self.attempt_timeout,
                gate,
                call_gate,
                clock: self.clock,
                random,
                listeners,
                handlers: self.handlers,
                plan,
                noted: Default::default(),
                chaos: self.chaos,
                adaptive,
                coalesce: self.coalesce.as_ref().map(Coalescer::new),
                custom: self.custom,
            }),
        })
    }
}

impl<K: Kind> Assembly<K> {
    /// The stateful policies of one level bound to the store as the
    /// resource `name`, or `None` when the level has none.
    fn gate(
        &self,
        name: String,
        guards: Guards,
        retry_budget: Option<RetryBudget>,
    ) -> Result<Option<Gate>, ConfigError> {
        let spec = ResourceSpec {
            name,
            circuit: guards.circuit,
            bulkhead: guards.bulkhead,
            cooldown: guards.cooldown,
            rate_limit: guards.rate_limit,
            retry_budget,
            partition_idle: self.partition_idle,
        };
        if spec.is_empty() {
            return Ok(None);
        }
        let memory_store = match (&self.store, &self.memory_store) {
            (None, _) => Some(MemoryStore::global()),
            (Some(_), m) => m.as_ref(),
        };
        let memory = match memory_store {
            Some(m) if self.strict_names => Some(m.bind_memory_strict(&spec)?),
            Some(m) => Some(m.bind_memory(&spec)),
            None => None,
        };
        let state: Arc<dyn ResourceState> = match (&memory, &self.store) {
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
        let queues = spec
            .bulkhead
            .as_ref()
            .filter(|b| b.max_queued > 0 && !b.shadow)
            .map(|_| Queues::of(&state, &self.clock));
        Ok(Some(Gate {
            state,
            memory,
            record_needs_time: spec.circuit.as_ref().is_some_and(|c| {
                c.slow_call_rate.is_some()
                    || matches!(c.mode, crate::breaker::BreakerMode::TimeWindow(_))
            }),
            success_recorded: spec.circuit.is_some() || spec.bulkhead.is_some(),
            records: !spec.budget_only(),
            queues,
            spec,
        }))
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
