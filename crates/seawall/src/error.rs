//! Errors returned by pipelines, stores and builders.

use std::fmt;
use std::time::Duration;

/// The error of a call made through a [`Pipeline`](crate::Pipeline).
///
/// The operation's own error type `E` stays typed: match on
/// [`Error::Operation`] or [`Error::RetryExhausted`] to get it back.
/// It is `Clone` when `E` is (coalesced calls share one error by cloning it).
#[derive(Debug, Clone)]
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
    /// The pipeline cannot run this call as configured, e.g. a blocking
    /// [`call`](crate::Pipeline::call) on a pipeline with hedging (async
    /// only): the operation did not run. (Boxed: a rare error that keeps
    /// every `Result` of a call small.)
    Config(Box<ConfigError>),
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
            Error::Config(c) => Error::Config(c),
        }
    }
}

/// The message says what happened and includes the operation's error
/// (`gave up after 3 attempts: connection refused`), so that it reads whole
/// whatever `E` is (a `String`, an `anyhow::Error`). Its
/// [`source`](std::error::Error::source) is therefore the operation's
/// error's own source, not the operation's error again: a report that walks
/// the chain prints each message once. The typed error itself is
/// [`operation_error`](Error::operation_error).
impl<E: fmt::Display> fmt::Display for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Operation(e) => write!(f, "operation failed: {e}"),
            Error::RetryExhausted { attempts, last } => {
                write!(f, "gave up after {}: {last}", Attempts(*attempts))
            }
            Error::Timeout(t) => t.fmt(f),
            Error::Rejected(r) => r.fmt(f),
            Error::Store(s) => s.fmt(f),
            Error::Fallback(e) => write!(f, "fallback failed: {e}"),
            Error::Config(c) => c.fmt(f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for Error<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // Each of these messages includes its inner error's: the chain goes
        // on from there.
        match self {
            Error::Operation(e) | Error::Fallback(e) | Error::RetryExhausted { last: e, .. } => {
                e.source()
            }
            Error::Timeout(t) => t.source(),
            Error::Rejected(r) => r.source(),
            Error::Store(s) => s.source(),
            Error::Config(_) => None,
        }
    }
}

/// "1 attempt", "3 attempts".
struct Attempts(u32);

impl fmt::Display for Attempts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            1 => f.write_str("1 attempt"),
            n => write!(f, "{n} attempts"),
        }
    }
}

/// A duration written for people: at most three significant digits and
/// one unit (`2.96s`, `250ms`, `1.5µs`, `0s`).
pub(crate) struct Human(pub(crate) Duration);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = self.0.as_nanos();
        let (unit, scale) = match nanos {
            0 => return f.write_str("0s"),
            n if n >= 1_000_000_000 => ("s", 1e9),
            n if n >= 1_000_000 => ("ms", 1e6),
            n if n >= 1_000 => ("µs", 1e3),
            _ => ("ns", 1.0),
        };
        let value = nanos as f64 / scale;
        let decimals = if value >= 100.0 {
            0
        } else if value >= 10.0 {
            1
        } else {
            2
        };
        let text = format!("{value:.decimals$}");
        let text = if text.contains('.') {
            text.trim_end_matches('0').trim_end_matches('.')
        } else {
            &text
        };
        write!(f, "{text}{unit}")
    }
}

/// Writes `resource: ` when the resource is known.
fn resource_prefix(f: &mut fmt::Formatter<'_>, resource: &str) -> fmt::Result {
    if resource.is_empty() {
        Ok(())
    } else {
        write!(f, "{resource}: ")
    }
}

/// Which deadline a [`TimeoutError`] refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TimeoutScope {
    /// The per-attempt timeout (declared after the retry policy).
    Attempt,
    /// The overall deadline of the call (declared before the retry
    /// policy).
    Overall,
}

/// An attempt or a whole call ran past its deadline.
///
/// Its message names the resource: `users-api: attempt timed out after 5s
/// (1 attempt)`. Two timeouts are equal when scope, duration and attempts
/// are; `Debug` shows those.
#[derive(Clone, Copy)]
pub struct TimeoutError {
    /// Which deadline expired.
    pub scope: TimeoutScope,
    /// The configured duration that expired.
    pub after: Duration,
    /// How many attempts ran, including the one that timed out.
    pub attempts: u32,
    /// The pipeline's resource name ("" when not known).
    pub(crate) resource: &'static str,
}

impl TimeoutError {
    /// A timeout of `scope` after `after`, on attempt `attempts`.
    pub fn new(scope: TimeoutScope, after: Duration, attempts: u32) -> Self {
        TimeoutError {
            scope,
            after,
            attempts,
            resource: "",
        }
    }

    /// The same timeout, of the resource `resource`.
    pub(crate) fn for_resource(mut self, resource: &'static str) -> Self {
        self.resource = resource;
        self
    }

    /// The resource name of the pipeline that timed out ("" when not
    /// known).
    pub fn resource(&self) -> &str {
        self.resource
    }
}

impl fmt::Debug for TimeoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimeoutError")
            .field("scope", &self.scope)
            .field("after", &self.after)
            .field("attempts", &self.attempts)
            .finish()
    }
}

impl PartialEq for TimeoutError {
    fn eq(&self, other: &Self) -> bool {
        (self.scope, self.after, self.attempts) == (other.scope, other.after, other.attempts)
    }
}

impl Eq for TimeoutError {}

impl fmt::Display for TimeoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        resource_prefix(f, self.resource)?;
        let what = match self.scope {
            TimeoutScope::Attempt => "attempt",
            TimeoutScope::Overall => "call",
        };
        write!(
            f,
            "{what} timed out after {} ({})",
            Human(self.after),
            Attempts(self.attempts)
        )
    }
}

impl std::error::Error for TimeoutError {}

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
    /// The adaptive concurrency limit is reached (and its queue is full or
    /// the wait ran out).
    ConcurrencyLimited,
    /// A policy written in code ([`crate::custom`]) refused the call.
    PolicyRefused,
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
            RejectionReason::ConcurrencyLimited => "concurrency_limited",
            RejectionReason::PolicyRefused => "policy_refused",
        }
    }

    /// All reasons, in a stable order.
    pub const ALL: [RejectionReason; 8] = [
        RejectionReason::CircuitOpen,
        RejectionReason::BulkheadFull,
        RejectionReason::RateLimited,
        RejectionReason::CooldownActive,
        RejectionReason::CooldownExceedsDeadline,
        RejectionReason::RetryBudgetExhausted,
        RejectionReason::ConcurrencyLimited,
        RejectionReason::PolicyRefused,
    ];
}

impl fmt::Display for RejectionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refusal by one of seawall's own policies. Never retried by seawall,
/// also when it reaches an outer pipeline as the error of an operation that
/// called this one (see [`Pipeline`](crate::Pipeline)).
///
/// Its message names the resource: `users-api: call rejected: circuit_open
/// (retry after 2.96s)`. Two rejections are equal when reason and
/// `retry_after` are; `Debug` shows those.
#[derive(Clone, Copy)]
pub struct Rejection {
    /// Which policy refused, and why.
    pub reason: RejectionReason,
    /// When known, how long until a call could be admitted.
    pub retry_after: Option<Duration>,
    /// The pipeline's resource name ("" when not known).
    pub(crate) resource: &'static str,
}

impl Rejection {
    /// A rejection with a reason and an optional retry-after.
    pub fn new(reason: RejectionReason, retry_after: Option<Duration>) -> Self {
        Rejection {
            reason,
            retry_after,
            resource: "",
        }
    }

    /// The same rejection, by the resource `resource`.
    pub(crate) fn for_resource(mut self, resource: &'static str) -> Self {
        self.resource = resource;
        self
    }

    /// The resource name of the pipeline that refused ("" when not known).
    pub fn resource(&self) -> &str {
        self.resource
    }
}

impl fmt::Debug for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rejection")
            .field("reason", &self.reason)
            .field("retry_after", &self.retry_after)
            .finish()
    }
}

impl PartialEq for Rejection {
    fn eq(&self, other: &Self) -> bool {
        (self.reason, self.retry_after) == (other.reason, other.retry_after)
    }
}

impl Eq for Rejection {}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        resource_prefix(f, self.resource)?;
        write!(f, "call rejected: {}", self.reason)?;
        if let Some(d) = self.retry_after {
            write!(f, " (retry after {})", Human(d))?;
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
    #[error("state store timed out after {}", Human(*.0))]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_written_for_people() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(7), "7ns"),
            (Duration::from_micros(1500), "1.5ms"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_secs(5), "5s"),
            (Duration::from_nanos(2_962_081_417), "2.96s"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_secs(3600), "3600s"),
            (Duration::MAX, "18446744073709551616s"),
        ];
        for (d, text) in cases {
            assert_eq!(Human(d).to_string(), text, "{d:?}");
        }
    }

    #[test]
    fn messages_name_the_resource_and_count_attempts() {
        let t = TimeoutError::new(TimeoutScope::Attempt, Duration::from_secs(5), 1)
            .for_resource("users-api");
        assert_eq!(
            t.to_string(),
            "users-api: attempt timed out after 5s (1 attempt)"
        );
        let r = Rejection::new(
            RejectionReason::CircuitOpen,
            Some(Duration::from_nanos(2_962_081_417)),
        )
        .for_resource("users-api");
        assert_eq!(
            r.to_string(),
            "users-api: call rejected: circuit_open (retry after 2.96s)"
        );
        assert_eq!(
            r,
            Rejection::new(RejectionReason::CircuitOpen, r.retry_after)
        );
        let e: Error<std::io::Error> = Error::RetryExhausted {
            attempts: 1,
            last: std::io::Error::other("boom"),
        };
        assert_eq!(e.to_string(), "gave up after 1 attempt: boom");
        assert!(std::error::Error::source(&e).is_none());
    }
}
