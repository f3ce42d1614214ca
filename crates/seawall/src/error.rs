//! Errors returned by pipelines, stores and builders.

use std::fmt;
use std::time::Duration;

/// The error of a call made through a [`Pipeline`](crate::Pipeline).
///
/// The operation's own error type `E` stays typed: match on
/// [`Error::Operation`] or [`Error::RetryExhausted`] to get it back.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error<E> {
    /// The operation failed and was not retried (no retry policy, or the
    /// classifier said the error is not retryable).
    Operation(E),
    /// Every allowed attempt failed, or the next wait would not fit the
    /// deadline; `last` is the error of the last attempt.
    RetryExhausted {
        /// How many attempts ran.
        attempts: u32,
        /// The error returned by the last attempt.
        last: E,
    },
    /// An attempt or the whole call ran past its deadline.
    Timeout(TimeoutError),
    /// A policy refused the call before the operation ran.
    Rejected(Rejection),
    /// The state store failed and the store is configured to fail closed.
    Store(StoreError),
    /// The fallback ran and returned an error of its own.
    Fallback(E),
}

impl<E> Error<E> {
    /// The operation's error, if this error carries one.
    pub fn operation_error(&self) -> Option<&E> {
        match self {
            Error::Operation(e) | Error::Fallback(e) | Error::RetryExhausted { last: e, .. } => {
                Some(e)
            }
            _ => None,
        }
    }

    /// Consumes the error and returns the operation's error, if any.
    pub fn into_operation_error(self) -> Option<E> {
        match self {
            Error::Operation(e) | Error::Fallback(e) | Error::RetryExhausted { last: e, .. } => {
                Some(e)
            }
            _ => None,
        }
    }

    /// The rejection, when a policy refused the call.
    pub fn rejection(&self) -> Option<&Rejection> {
        match self {
            Error::Rejected(r) => Some(r),
            _ => None,
        }
    }

    /// `true` when a policy refused the call (the operation did not run for it).
    pub fn is_rejected(&self) -> bool {
        matches!(self, Error::Rejected(_))
    }

    /// `true` when the call or an attempt timed out.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout(_))
    }

    /// Maps the operation's error type.
    pub fn map<F, O: FnOnce(E) -> F>(self, op: O) -> Error<F> {
        match self {
            Error::Operation(e) => Error::Operation(op(e)),
            Error::RetryExhausted { attempts, last } => Error::RetryExhausted {
                attempts,
                last: op(last),
            },
            Error::Timeout(t) => Error::Timeout(t),
            Error::Rejected(r) => Error::Rejected(r),
            Error::Store(s) => Error::Store(s),
            Error::Fallback(e) => Error::Fallback(op(e)),
        }
    }
}

impl<E: fmt::Display> fmt::Display for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Operation(e) => write!(f, "operation failed: {e}"),
            Error::RetryExhausted { attempts, last } => {
                write!(f, "gave up after {attempts} attempts: {last}")
            }
            Error::Timeout(t) => t.fmt(f),
            Error::Rejected(r) => r.fmt(f),
            Error::Store(s) => s.fmt(f),
            Error::Fallback(e) => write!(f, "fallback failed: {e}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for Error<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Operation(e) | Error::Fallback(e) | Error::RetryExhausted { last: e, .. } => {
                Some(e)
            }
            Error::Timeout(t) => Some(t),
            Error::Rejected(r) => Some(r),
            Error::Store(s) => Some(s),
        }
    }
}

/// Which deadline a [`TimeoutError`] refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TimeoutScope {
    /// The per-attempt timeout (declared after the retry policy).
    Attempt,
    /// The overall deadline of the call (declared before the retry policy,
    /// or given per call).
    Overall,
}

/// An attempt or a whole call ran past its deadline.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} timed out after {:?} ({} attempt(s))", match .scope { TimeoutScope::Attempt => "attempt", TimeoutScope::Overall => "call" }, .after, .attempts)]
pub struct TimeoutError {
    /// Which deadline expired.
    pub scope: TimeoutScope,
    /// The configured duration that expired.
    pub after: Duration,
    /// How many attempts ran, including the one that timed out.
    pub attempts: u32,
}

/// Why a policy refused a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectionReason {
    /// The circuit breaker is open (or half-open with every probe taken).
    CircuitOpen,
    /// The bulkhead has no free slot and its queue is full or the wait ran out.
    BulkheadFull,
    /// The rate limiter has no permit now.
    RateLimited,
    /// A cooldown opened by a retry-after hint is in effect.
    CooldownActive,
    /// A cooldown is in effect and ends after the call's deadline.
    CooldownExceedsDeadline,
    /// The retry budget has no tokens left for another retry.
    RetryBudgetExhausted,
}

impl RejectionReason {
    /// A short, stable, snake_case name (for logs and metric labels).
    pub fn as_str(self) -> &'static str {
        match self {
            RejectionReason::CircuitOpen => "circuit_open",
            RejectionReason::BulkheadFull => "bulkhead_full",
            RejectionReason::RateLimited => "rate_limited",
            RejectionReason::CooldownActive => "cooldown_active",
            RejectionReason::CooldownExceedsDeadline => "cooldown_exceeds_deadline",
            RejectionReason::RetryBudgetExhausted => "retry_budget_exhausted",
        }
    }

    /// All reasons, in a stable order.
    pub const ALL: [RejectionReason; 6] = [
        RejectionReason::CircuitOpen,
        RejectionReason::BulkheadFull,
        RejectionReason::RateLimited,
        RejectionReason::CooldownActive,
        RejectionReason::CooldownExceedsDeadline,
        RejectionReason::RetryBudgetExhausted,
    ];
}

impl fmt::Display for RejectionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refusal by one of seawall's own policies. Never retried by seawall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejection {
    /// Which policy refused, and why.
    pub reason: RejectionReason,
    /// When known, how long until a call could be admitted.
    pub retry_after: Option<Duration>,
}

impl Rejection {
    /// A rejection with a reason and an optional retry-after.
    pub fn new(reason: RejectionReason, retry_after: Option<Duration>) -> Self {
        Rejection {
            reason,
            retry_after,
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "call rejected: {}", self.reason)?;
        if let Some(d) = self.retry_after {
            write!(f, " (retry after {d:?})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Rejection {}

/// A failure of a [`StateStore`](crate::store::StateStore).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store could not be reached (connection refused, reset, closed).
    #[error("state store unavailable: {0}")]
    Unavailable(String),
    /// The store did not answer within its configured timeout.
    #[error("state store timed out after {0:?}")]
    Timeout(Duration),
    /// The store refused the request (authentication, permissions, scripting disabled).
    #[error("state store refused the request: {0}")]
    Refused(String),
    /// The store answered something seawall cannot interpret.
    #[error("state store answered unexpectedly: {0}")]
    Protocol(String),
}

/// An invalid configuration, reported by `build()`.
///
/// The message names the policy, the field and the rule, e.g.
/// `retry.max_attempts must be >= 1, got 0`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{policy}.{field} {rule}")]
pub struct ConfigError {
    /// The policy (or `pipeline`) the field belongs to.
    pub policy: &'static str,
    /// The offending field.
    pub field: &'static str,
    /// The rule it breaks, with the value given.
    pub rule: String,
}

impl ConfigError {
    /// A new configuration error.
    pub fn new(policy: &'static str, field: &'static str, rule: impl Into<String>) -> Self {
        ConfigError {
            policy,
            field,
            rule: rule.into(),
        }
    }
}
