//! How an operation's error is judged: retried or not, counted against the
//! dependency or not, and whether it carries a retry-after hint.

use std::time::Duration;

/// The longest wait a server's hint can ask for: one hour. Longer waits (up
/// to `Retry-After: 99999999999999999999`, a date in year 9999, a gRPC
/// pushback of `i64::MAX` milliseconds, or a hint your own classifier gives
/// [`Verdict::with_retry_after`]) are cut to it. The pipeline's
/// [`Cooldown`](crate::Cooldown) caps the pause further (5 minutes by
/// default), and a retry gives up when the wait does not fit the call's
/// deadline.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60 * 60);

/// What to do with an error returned by the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum VerdictKind {
    /// A failure of the dependency that may succeed if tried again
    /// (the default for every error).
    Retry,
    /// A failure of the dependency that must not be retried; it still counts
    /// against the circuit breaker.
    Failure,
    /// Stop at once: the dependency answered, the request itself is wrong
    /// (a 400, a 404). Not retried, and counted as a successful call by the
    /// circuit breaker since the dependency is healthy.
    Abort,
    /// Neither a failure nor a success: not retried and not recorded by the
    /// circuit breaker at all.
    Ignore,
    /// The dependency is healthy but asks its callers to slow down (an HTTP
    /// 429): retried, after the retry-after hint if there is one, which also
    /// opens the [`Cooldown`](crate::Cooldown); not recorded by the circuit
    /// breaker, since throttling is not a failure of the dependency.
    Throttled,
}

/// The judgement of one error: a [`VerdictKind`] plus an optional
/// retry-after hint (e.g. from an HTTP `Retry-After` header).
///
/// A hint makes the retry wait at least that long, and opens the pipeline's
/// [`Cooldown`](crate::Cooldown) when one is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Verdict {
    kind: VerdictKind,
    retry_after: Option<Duration>,
}

impl Verdict {
    /// A retryable failure.
    pub const fn retry() -> Self {
        Verdict::of(VerdictKind::Retry)
    }
    /// A failure that is recorded but not retried.
    pub const fn failure() -> Self {
        Verdict::of(VerdictKind::Failure)
    }
    /// Not retried and not a failure of the dependency.
    pub const fn abort() -> Self {
        Verdict::of(VerdictKind::Abort)
    }
    /// Not retried and not recorded at all.
    pub const fn ignore() -> Self {
        Verdict::of(VerdictKind::Ignore)
    }
    /// Throttled: retried, not a failure of the dependency.
    pub const fn throttled() -> Self {
        Verdict::of(VerdictKind::Throttled)
    }
    /// A verdict of the given kind.
    pub const fn of(kind: VerdictKind) -> Self {
        Verdict {
            kind,
            retry_after: None,
        }
    }
    /// Adds a retry-after hint, at most [`MAX_RETRY_AFTER`]: a longer one
    /// is cut to it.
    pub const fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(if after.as_nanos() > MAX_RETRY_AFTER.as_nanos() {
            MAX_RETRY_AFTER
        } else {
            after
        });
        self
    }
    /// The kind of verdict.
    pub const fn kind(&self) -> VerdictKind {
        self.kind
    }
    /// The retry-after hint, if any.
    pub const fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
    /// `true` when the error may be retried.
    pub const fn is_retryable(&self) -> bool {
        matches!(self.kind, VerdictKind::Retry | VerdictKind::Throttled)
    }
    /// `true` when the error counts against the dependency (circuit breaker).
    pub const fn is_failure(&self) -> bool {
        matches!(self.kind, VerdictKind::Retry | VerdictKind::Failure)
    }
}

impl Default for Verdict {
    fn default() -> Self {
        Verdict::retry()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_answer_the_two_questions() {
        assert!(Verdict::retry().is_retryable() && Verdict::retry().is_failure());
        assert!(!Verdict::failure().is_retryable() && Verdict::failure().is_failure());
        assert!(!Verdict::abort().is_retryable() && !Verdict::abort().is_failure());
        assert!(!Verdict::ignore().is_retryable() && !Verdict::ignore().is_failure());
        assert!(Verdict::throttled().is_retryable() && !Verdict::throttled().is_failure());
        let v = Verdict::retry().with_retry_after(Duration::from_secs(3));
        assert_eq!(v.retry_after(), Some(Duration::from_secs(3)));
        assert_eq!(Verdict::default(), Verdict::retry());
    }
}
