//! Typed events emitted by pipelines, delivered to any number of listeners.
//!
//! With no listener registered (and the `tracing` feature off) an event is
//! never even constructed.
//!
//! # `tracing`
//! With the `tracing` feature every event is also a `tracing` event of
//! target `seawall` (fields `resource` and `partition`, the event's text as
//! the message), at a level that says how much it matters:
//!
//! | level | events |
//! | --- | --- |
//! | `WARN` | the circuit opened; a round of half-open probes expired unfinished (calls hang); a cooldown started (the dependency asked for a pause); a rejection by a full bulkhead, a rate limiter, the adaptive concurrency limit or an empty retry budget (overload, reported by nothing else); a hedge not started for an empty hedging budget; a late synchronous success (`DeadlineExceeded`); the state store unavailable |
//! | `INFO` | the circuit half-opened or closed |
//! | `DEBUG` | a change of the adaptive concurrency limit, a coalesced call taking over from a leader that went away, a chaos injection, a hedged attempt started, a refusal by a policy in shadow mode (the call went on), a retry scheduled or given up, an attempt timed out, a call deferred (waiting for a slot, a permit or the end of a cooldown), the fallback executed, a rejection by an open circuit or an active cooldown (whose start was reported at `WARN`) or by a policy written in code, a policy written in code that answered without running what it wraps, a call that ended in anything but success |
//! | `TRACE` | the per-call summaries: every attempt finished, a call that ended in success; a coalesced call answered by another's execution, a cache hit or miss |
//!
//! So `seawall=warn` shows what needs attention (circuit openings, overload,
//! store outages), `seawall=info` adds the recoveries, and a successful call
//! logs nothing above `TRACE`. While a subscriber wants any level of target
//! `seawall`, calls take the path that observes them (their durations are
//! measured for the summaries); the decisions stay the same.
//!
//! The operation itself runs inside a span `seawall.call` (level `INFO`,
//! target `seawall`, fields `pipeline`, `partition` and `attempt`), one per
//! attempt, so that the operation's own events carry them; see
//! [`Pipeline::run`](crate::Pipeline::run). A filter such as `seawall=warn`
//! leaves the span out; with no subscriber interested in it, a call pays
//! one check of a cached interest.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::chaos::ChaosKind;
use crate::context::PartitionKey;
use crate::custom::Position;
use crate::error::RejectionReason;

/// Something that happened inside a pipeline.
#[derive(Debug, Clone)]
pub struct Event<'a> {
    /// The pipeline's resource name.
    pub resource: &'a str,
    /// The partition of the call, if any.
    pub partition: Option<&'a PartitionKey>,
    /// What happened.
    pub kind: EventKind,
}

/// The kinds of [`Event`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum EventKind {
    /// Attempt `attempt` failed and the next one starts after `delay`,
    /// once admitted: a retry budget shared through the store
    /// ([`RetryBudget::shared`](crate::RetryBudget::shared)) is asked after
    /// the wait, and may still refuse it (then `RetryGaveUp` follows).
    RetryScheduled {
        /// The attempt that failed (1-based).
        attempt: u32,
        /// The wait before the next attempt.
        delay: Duration,
    },
    /// The retry policy stopped before its attempts ran out.
    RetryGaveUp {
        /// Attempts that ran.
        attempts: u32,
        /// Why it stopped.
        reason: GiveUpReason,
    },
    /// An attempt (or the call) ran out of time.
    TimedOut {
        /// The attempt that timed out.
        attempt: u32,
        /// The timeout that expired.
        after: Duration,
    },
    /// A synchronous call finished after its deadline; its result was kept
    /// (lenient timeout mode).
    DeadlineExceeded {
        /// How long after the deadline the call finished.
        late_by: Duration,
    },
    /// The fallback produced the call's result.
    FallbackExecuted,
    /// A policy refused a call.
    Rejected {
        /// Why.
        reason: RejectionReason,
        /// When known, how long until a call could be admitted.
        retry_after: Option<Duration>,
    },
    /// A call waits for a bulkhead slot, a cooldown or a rate-limit permit:
    /// once per wait. A call queued for a slot (bulkhead, adaptive limit)
    /// reports once, when it takes its place in the queue, however many
    /// times it looks for a free slot while it waits.
    Deferred {
        /// Which policy made it wait.
        reason: RejectionReason,
        /// How long it waits (at most): the cooldown or the time to the
        /// permit; for a queued call, what is left of the queue's
        /// `max_wait` (short of the call's deadline).
        wait: Duration,
    },
    /// The circuit opened.
    CircuitOpened {
        /// How long it stays open before admitting probes.
        cooldown: Duration,
    },
    /// The circuit admits probe calls.
    CircuitHalfOpened,
    /// A round of probes outlasted the breaker's
    /// [`max_half_open`](crate::CircuitBreaker::max_half_open) unfinished:
    /// a new round starts, and the unfinished probes no longer count.
    CircuitProbesExpired,
    /// A policy in [shadow mode](crate::shadow) would have refused (or made
    /// wait) this call; the call went on.
    ShadowRejected {
        /// The refusal it would have been: the policy's reason.
        reason: RejectionReason,
        /// The `retry_after` the refusal would have carried.
        retry_after: Option<Duration>,
    },
    /// The circuit closed.
    CircuitClosed,
    /// A retry-after hint opened (or extended) the shared cooldown.
    CooldownStarted {
        /// How long new calls are paused.
        duration: Duration,
    },
    /// A chaos policy injected into an attempt (see [`crate::chaos`]).
    ChaosInjected {
        /// What was injected.
        kind: ChaosKind,
        /// The attempt (1-based).
        attempt: u32,
    },
    /// The adaptive concurrency limit changed (see [`crate::adaptive`]).
    LimitChanged {
        /// The limit before.
        previous: u32,
        /// The limit now.
        limit: u32,
    },
    /// A coalesced call got the result of the concurrent call with the
    /// same key that ran it (see [`crate::coalesce`]): it ran nothing itself.
    Coalesced,
    /// The call with the same key that a coalesced call waited for went
    /// away before its end (a dropped future, a panic): this call runs it
    /// instead.
    CoalesceTakeover,
    /// A coalesced call was answered by a fresh cached success.
    CacheHit,
    /// A coalesced call found no fresh cached success for its key.
    CacheMiss,
    /// Hedging started a further attempt of the call, once the policies
    /// after hedging admitted it (see [`crate::hedge`]; a refused hedge is
    /// a `Rejected` event, not this one).
    HedgeStarted {
        /// The attempt started (2 for the first hedge; attempts are
        /// numbered in the order they start).
        attempt: u32,
        /// What started it.
        trigger: HedgeTrigger,
    },
    /// Hedging would have started a further attempt, but its budget was
    /// empty: the call goes on with the attempts it has.
    HedgeBudgetExhausted {
        /// The attempt that was not started.
        attempt: u32,
    },
    /// A policy written in code ([`crate::custom`]) answered without running
    /// what it wraps (a short-circuit).
    ShortCircuited {
        /// The policy's name.
        policy: &'static str,
        /// Where it stands: around the whole call or around each attempt.
        position: Position,
        /// The attempt of its context (1 around the whole call).
        attempt: u32,
    },
    /// An attempt ended (emitted only when someone listens).
    AttemptFinished {
        /// The attempt (1-based).
        attempt: u32,
        /// How long the operation ran.
        duration: Duration,
        /// How it ended.
        outcome: AttemptOutcome,
    },
    /// A call ended, fallback included (emitted only when someone listens).
    CallFinished {
        /// Attempts that ran.
        attempts: u32,
        /// How long the whole call took.
        duration: Duration,
        /// How it ended.
        outcome: CallOutcome,
    },
    /// The state store failed; `degraded` says the pipeline went on with
    /// process-local state (fail-open) rather than refusing the call.
    StoreUnavailable {
        /// The store's error, as text.
        error: String,
        /// `true` when the call was admitted on local state.
        degraded: bool,
    },
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AttemptOutcome {
    /// The operation succeeded.
    Success,
    /// The operation returned an error.
    Failure,
    /// The attempt ran out of time.
    Timeout,
}

impl AttemptOutcome {
    /// A short, stable, snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Success => "success",
            AttemptOutcome::Failure => "failure",
            AttemptOutcome::Timeout => "timeout",
        }
    }
}

/// How a call ended, as its caller sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CallOutcome {
    /// The operation succeeded.
    Success,
    /// The fallback produced the result.
    Fallback,
    /// The operation's error reached the caller.
    Failure,
    /// The call timed out.
    Timeout,
    /// A policy refused the call.
    Rejected(RejectionReason),
    /// The state store failed (fail-closed).
    StoreFailure,
}

impl CallOutcome {
    /// A short, stable, snake_case name (`rejected` for every rejection).
    pub fn as_str(self) -> &'static str {
        match self {
            CallOutcome::Success => "success",
            CallOutcome::Fallback => "fallback",
            CallOutcome::Failure => "failure",
            CallOutcome::Timeout => "timeout",
            CallOutcome::Rejected(_) => "rejected",
            CallOutcome::StoreFailure => "store_failure",
        }
    }
}

/// Why a retry policy stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GiveUpReason {
    /// The next wait would not fit the remaining deadline.
    Deadline,
    /// The retry budget is empty.
    Budget,
}

impl EventKind {
    /// The event of a circuit transition.
    pub(crate) fn of_transition(t: crate::breaker::CircuitTransition) -> EventKind {
        use crate::breaker::CircuitTransition;
        match t {
            CircuitTransition::Opened { cooldown } => EventKind::CircuitOpened { cooldown },
            CircuitTransition::HalfOpened => EventKind::CircuitHalfOpened,
            CircuitTransition::ProbesExpired => EventKind::CircuitProbesExpired,
            CircuitTransition::Closed => EventKind::CircuitClosed,
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventKind::RetryScheduled { attempt, delay } => {
                write!(f, "attempt {attempt} failed, retrying in {delay:?}")
            }
            EventKind::RetryGaveUp { attempts, reason } => write!(
                f,
                "retry gave up after {attempts} attempt(s): {}",
                match reason {
                    GiveUpReason::Deadline => "next wait exceeds the deadline",
                    GiveUpReason::Budget => "retry budget exhausted",
                }
            ),
            EventKind::TimedOut { attempt, after } => {
                write!(f, "attempt {attempt} timed out after {after:?}")
            }
            EventKind::DeadlineExceeded { late_by } => {
                write!(f, "call finished {late_by:?} after its deadline")
            }
            EventKind::FallbackExecuted => f.write_str("fallback executed"),
            EventKind::Rejected {
                reason,
                retry_after,
            } => {
                write!(f, "rejected: {reason}")?;
                if let Some(d) = retry_after {
                    write!(f, " (retry after {d:?})")?;
                }
                Ok(())
            }
            EventKind::Deferred { reason, wait } => {
                write!(f, "deferred by {reason} for up to {wait:?}")
            }
            EventKind::CircuitOpened { cooldown } => {
                write!(f, "circuit opened for {cooldown:?}")
            }
            EventKind::CircuitHalfOpened => f.write_str("circuit half-open"),
            EventKind::CircuitProbesExpired => {
                f.write_str("circuit half-open: unfinished probes expired, a new round of probes")
            }
            EventKind::ShadowRejected {
                reason,
                retry_after,
            } => {
                write!(f, "shadow mode: would have rejected: {reason}")?;
                if let Some(d) = retry_after {
                    write!(f, " (retry after {d:?})")?;
                }
                Ok(())
            }
            EventKind::CircuitClosed => f.write_str("circuit closed"),
            EventKind::CooldownStarted { duration } => {
                write!(f, "cooldown started for {duration:?}")
            }
            EventKind::ChaosInjected { kind, attempt } => {
                write!(f, "chaos injected {} into attempt {attempt}", kind.as_str())?;
                if let ChaosKind::Latency { delay } = kind {
                    write!(f, " ({delay:?})")?;
                }
                Ok(())
            }
            EventKind::LimitChanged { previous, limit } => {
                write!(f, "concurrency limit changed from {previous} to {limit}")
            }
            EventKind::Coalesced => {
                f.write_str("shared the result of a concurrent call with the same key")
            }
            EventKind::CoalesceTakeover => f.write_str(
                "the concurrent call with the same key went away before its end; running it here",
            ),
            EventKind::CacheHit => f.write_str("answered from the cache"),
            EventKind::CacheMiss => f.write_str("not in the cache"),
            EventKind::HedgeStarted { attempt, trigger } => {
                write!(f, "hedged attempt {attempt} started ({})", trigger.as_str())
            }
            EventKind::HedgeBudgetExhausted { attempt } => {
                write!(
                    f,
                    "hedged attempt {attempt} not started: hedging budget exhausted"
                )
            }
            EventKind::ShortCircuited {
                policy,
                position,
                attempt,
            } => match position {
                Position::Call => {
                    write!(f, "policy `{policy}` answered without running the call")
                }
                Position::Attempt => write!(
                    f,
                    "policy `{policy}` answered without running attempt {attempt}"
                ),
            },
            EventKind::AttemptFinished {
                attempt,
                duration,
                outcome,
            } => write!(
                f,
                "attempt {attempt} ended: {} in {duration:?}",
                outcome.as_str()
            ),
            EventKind::CallFinished {
                attempts,
                duration,
                outcome,
            } => {
                write!(f, "call ended: {}", outcome.as_str())?;
                if let CallOutcome::Rejected(r) = outcome {
                    write!(f, " ({r})")?;
                }
                write!(f, " after {attempts} attempt(s) in {duration:?}")
            }
            EventKind::StoreUnavailable { error, degraded } => {
                write!(f, "state store unavailable ({error})")?;
                if *degraded {
                    f.write_str(", using local state")?;
                }
                Ok(())
            }
        }
    }
}

/// How much an event matters: its `tracing` level (see the [module
/// docs](self)); the metrics report it as `event.severity`.
#[cfg(any(feature = "tracing", feature = "metrics"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Severity {
    Trace,
    Debug,
    Info,
    Warn,
}

#[cfg(any(feature = "tracing", feature = "metrics"))]
impl EventKind {
    /// The level of the event's `tracing` event: the table of the module
    /// docs, stated once.
    pub(crate) fn severity(&self) -> Severity {
        match self {
            EventKind::AttemptFinished { .. }
            | EventKind::Coalesced
            | EventKind::CacheHit
            | EventKind::CacheMiss => Severity::Trace,
            EventKind::CallFinished {
                outcome: CallOutcome::Success,
                ..
            } => Severity::Trace,
            EventKind::CallFinished { .. }
            | EventKind::RetryScheduled { .. }
            | EventKind::RetryGaveUp { .. }
            | EventKind::TimedOut { .. }
            | EventKind::Deferred { .. }
            | EventKind::FallbackExecuted
            | EventKind::ChaosInjected { .. }
            | EventKind::LimitChanged { .. }
            | EventKind::ShadowRejected { .. }
            | EventKind::CoalesceTakeover
            | EventKind::HedgeStarted { .. }
            | EventKind::ShortCircuited { .. } => Severity::Debug,
            EventKind::Rejected { reason, .. } => match reason {
                RejectionReason::BulkheadFull
                | RejectionReason::ConcurrencyLimited
                | RejectionReason::RateLimited
                | RejectionReason::RetryBudgetExhausted => Severity::Warn,
                // An open circuit or an active cooldown refuses every call
                // until it ends; its start is the warning.
                RejectionReason::CircuitOpen
                | RejectionReason::CooldownActive
                | RejectionReason::CooldownExceedsDeadline => Severity::Debug,
                // The policy's own decision, reported as it wants.
                RejectionReason::PolicyRefused => Severity::Debug,
            },
            EventKind::CircuitHalfOpened | EventKind::CircuitClosed => Severity::Info,
            EventKind::CircuitOpened { .. }
            | EventKind::CircuitProbesExpired
            | EventKind::CooldownStarted { .. }
            | EventKind::DeadlineExceeded { .. }
            | EventKind::HedgeBudgetExhausted { .. }
            | EventKind::StoreUnavailable { .. } => Severity::Warn,
        }
    }
}

/// What started a hedged attempt ([`EventKind::HedgeStarted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HedgeTrigger {
    /// The previous attempt had not answered within the hedging delay (or
    /// the mode starts every attempt at once).
    Delay,
    /// An attempt failed.
    Failure,
}

impl HedgeTrigger {
    /// `"delay"` or `"failure"`.
    pub fn as_str(self) -> &'static str {
        match self {
            HedgeTrigger::Delay => "delay",
            HedgeTrigger::Failure => "failure",
        }
    }
}

/// A listener of events. Register with
/// [`PipelineBuilder::on_event`](crate::PipelineBuilder::on_event).
pub type Listener = Arc<dyn Fn(&Event<'_>) + Send + Sync>;

/// The listeners of a pipeline.
#[derive(Clone, Default)]
pub(crate) struct Listeners {
    list: Arc<[Listener]>,
}

impl Listeners {
    pub(crate) fn new(list: Vec<Listener>) -> Self {
        Listeners { list: list.into() }
    }

    /// `true` when an event would be observed by anyone.
    #[inline]
    pub(crate) fn enabled(&self) -> bool {
        !self.list.is_empty() || Self::tracing()
    }

    /// `true` when listeners are registered (known when the pipeline is
    /// built, unlike a `tracing` subscriber).
    #[inline]
    pub(crate) fn registered(&self) -> bool {
        !self.list.is_empty()
    }

    /// `true` when a `tracing` subscriber wants seawall's events now, at
    /// any of their levels (a cached check of the call site's interest at
    /// the least verbose level used, `WARN`; always `false` without the
    /// `tracing` feature).
    #[inline(always)]
    pub(crate) fn tracing() -> bool {
        #[cfg(feature = "tracing")]
        {
            tracing::enabled!(target: "seawall", tracing::Level::WARN)
        }
        #[cfg(not(feature = "tracing"))]
        {
            false
        }
    }

    /// Builds and delivers an event, unless nobody listens.
    #[inline]
    pub(crate) fn emit(
        &self,
        resource: &str,
        partition: Option<&PartitionKey>,
        kind: impl FnOnce() -> EventKind,
    ) {
        if !self.enabled() {
            return;
        }
        self.deliver(&Event {
            resource,
            partition,
            kind: kind(),
        });
    }

    #[cold]
    fn deliver(&self, event: &Event<'_>) {
        #[cfg(feature = "tracing")]
        {
            // One call site per level: each checks its own interest.
            macro_rules! at {
                ($level:expr) => {
                    tracing::event!(
                        target: "seawall",
                        $level,
                        resource = event.resource,
                        partition = event.partition.map(tracing::field::display),
                        "{}",
                        event.kind
                    )
                };
            }
            match event.kind.severity() {
                Severity::Trace => at!(tracing::Level::TRACE),
                Severity::Debug => at!(tracing::Level::DEBUG),
                Severity::Info => at!(tracing::Level::INFO),
                Severity::Warn => at!(tracing::Level::WARN),
            }
        }
        for l in self.list.iter() {
            l(event);
        }
    }
}

impl fmt::Debug for Listeners {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Listeners({})", self.list.len())
    }
}
