//! The retry policy for compensations.

use std::time::Duration;

/// How often and how patiently a failing compensation is retried before the saga
/// is marked [`Stuck`](crate::SagaStatus::Stuck).
///
/// The delay before attempt `n + 1` is `initial_delay * multiplier^(n - 1)`,
/// capped at `max_delay`. Sleeps go through the orchestrator's
/// [`Clock`](crate::Clock), so tests with a [`VirtualClock`](crate::VirtualClock)
/// do not wait.
///
/// # Default
///
/// Exponential: 5 attempts, first delay 100 ms, multiplier 2, delays capped at
/// 60 s.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use seawall_saga::RetryPolicy;
///
/// let policy = RetryPolicy::exponential(Duration::from_millis(50)).max_attempts(3);
/// assert_eq!(policy.delay_after(1), Duration::from_millis(50));
/// assert_eq!(policy.delay_after(2), Duration::from_millis(100));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    initial_delay: Duration,
    multiplier: u32,
    max_delay: Duration,
}

impl RetryPolicy {
    /// Exponential backoff starting at `initial_delay` (multiplier 2).
    pub fn exponential(initial_delay: Duration) -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial_delay,
            multiplier: 2,
            max_delay: Duration::from_secs(60),
        }
    }

    /// The same delay between every attempt.
    pub fn constant(delay: Duration) -> Self {
        RetryPolicy {
            multiplier: 1,
            ..Self::exponential(delay)
        }
    }

    /// One attempt, no retry.
    pub fn no_retry() -> Self {
        Self::exponential(Duration::ZERO).max_attempts(1)
    }

    /// Total attempts including the first; `0` is treated as `1`.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// Growth factor of the delay; `0` is treated as `1`.
    pub fn multiplier(mut self, multiplier: u32) -> Self {
        self.multiplier = multiplier.max(1);
        self
    }

    /// Upper bound of any single delay.
    pub fn max_delay(mut self, max_delay: Duration) -> Self {
        self.max_delay = max_delay;
        self
    }

    /// The configured number of attempts.
    pub fn attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The delay after failed attempt number `attempt` (1-based).
    pub fn delay_after(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1);
        let factor = self.multiplier.checked_pow(exponent).unwrap_or(u32::MAX);
        self.initial_delay
            .checked_mul(factor)
            .unwrap_or(Duration::MAX)
            .min(self.max_delay)
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::exponential(Duration::from_millis(100))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_delays_grow_and_cap() {
        let p = RetryPolicy::exponential(Duration::from_millis(100))
            .max_delay(Duration::from_millis(350));
        let delays: Vec<_> = (1..=4).map(|a| p.delay_after(a).as_millis()).collect();
        assert_eq!(delays, vec![100, 200, 350, 350]);
        assert_eq!(p.delay_after(200), Duration::from_millis(350));
    }

    #[test]
    fn constant_and_zero_attempts() {
        let p = RetryPolicy::constant(Duration::from_secs(1)).max_attempts(0);
        assert_eq!(p.attempts(), 1);
        assert_eq!(p.delay_after(7), Duration::from_secs(1));
    }
}
