//! Typed events emitted by pipelines, delivered to any number of listeners.
//!
//! With no listener registered (and the `tracing` feature off) an event is
//! never even constructed.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::context::PartitionKey;
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
    /// Attempt `attempt` failed and the next one starts after `delay`.
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
    /// A call waits for a bulkhead slot, a cooldown or a rate-limit permit.
    Deferred {
        /// Which policy made it wait.
        reason: RejectionReason,
        /// How long it waits (at most).
        wait: Duration,
    },
    /// The circuit opened.
    CircuitOpened {
        /// How long it stays open before admitting probes.
        cooldown: Duration,
    },
    /// The circuit admits probe calls.
    CircuitHalfOpened,
    /// The circuit closed.
    CircuitClosed,
    /// A retry-after hint opened (or extended) the shared cooldown.
    CooldownStarted {
        /// How long new calls are paused.
        duration: Duration,
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
            EventKind::CircuitClosed => f.write_str("circuit closed"),
            EventKind::CooldownStarted { duration } => {
                write!(f, "cooldown started for {duration:?}")
            }
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

    /// `true` when a `tracing` subscriber wants seawall's events now (a
    /// cached check of the call site's interest; always `false` without
    /// the `tracing` feature).
    #[inline(always)]
    pub(crate) fn tracing() -> bool {
        #[cfg(feature = "tracing")]
        {
            tracing::enabled!(target: "seawall", tracing::Level::INFO)
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
        tracing::event!(
            target: "seawall",
            tracing::Level::INFO,
            resource = event.resource,
            partition = event.partition.map(tracing::field::display),
            "{}",
            event.kind
        );
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
