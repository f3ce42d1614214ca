use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use crate::error::ConfigError;

const SCALE: i64 = 1000;

/// A retry budget (like gRPC retry throttling or Finagle's budgets): every
/// call earns `ratio` tokens, every retry spends one, and retries stop with
/// `retry_budget_exhausted` while fewer than one token is left. The bucket
/// holds at most `max_tokens` and starts full.
///
/// The same rule limits hedging ([`Hedging::budget`](crate::Hedging::budget)):
/// every hedged attempt spends a token, and no hedge starts while fewer
/// than one is left.
///
/// Clones share one bucket, so a budget given to several pipelines limits
/// them together. A budget of `ratio` 0.2 lets a sick dependency see at most
/// about 20% more requests than there are calls.
#[derive(Debug, Clone)]
pub struct RetryBudget {
    ratio: f64,
    max_tokens: u32,
    tokens: Arc<AtomicI64>,
}

impl PartialEq for RetryBudget {
    fn eq(&self, other: &Self) -> bool {
        self.ratio == other.ratio && self.max_tokens == other.max_tokens
    }
}

impl RetryBudget {
    /// A budget earning `ratio` tokens per call, holding at most `max_tokens`.
    pub fn new(ratio: f64, max_tokens: u32) -> Self {
        RetryBudget {
            ratio,
            max_tokens,
            tokens: Arc::new(AtomicI64::new(i64::from(max_tokens) * SCALE)),
        }
    }

    /// Tokens left (whole and fractional).
    pub fn tokens(&self) -> f64 {
        self.tokens.load(Ordering::Relaxed) as f64 / SCALE as f64
    }

    fn earn_per_call(&self) -> i64 {
        (self.ratio * SCALE as f64).round() as i64
    }

    /// Called once per call.
    pub(crate) fn deposit(&self) {
        let add = self.earn_per_call();
        let max = i64::from(self.max_tokens) * SCALE;
        // Skip the write when the bucket is full: no contention on the
        // success path of a healthy dependency.
        let cur = self.tokens.load(Ordering::Relaxed);
        if cur >= max || add == 0 {
            return;
        }
        let _ = self
            .tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some((t + add).min(max))
            });
    }

    /// Spends one token for a retry; `false` when the budget is exhausted.
    pub(crate) fn withdraw(&self) -> bool {
        self.tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                (t >= SCALE).then_some(t - SCALE)
            })
            .is_ok()
    }

    /// Gives back the token of a hedge that did not start (refused by
    /// the policies after hedging), up to `max_tokens`.
    pub(crate) fn refund(&self) {
        let max = i64::from(self.max_tokens) * SCALE;
        let _ = self
            .tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some((t + SCALE).min(max))
            });
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        self.validate_for("retry")
    }

    /// The budget's rules, its errors naming `policy` (the retry or
    /// hedging).
    pub(crate) fn validate_for(&self, policy: &'static str) -> Result<(), ConfigError> {
        if !(self.ratio > 0.0 && self.ratio <= 1000.0) {
            return Err(ConfigError::new(
                policy,
                "budget.ratio",
                format!("must be in (0, 1000], got {}", self.ratio),
            ));
        }
        if self.max_tokens == 0 {
            return Err(ConfigError::new(
                policy,
                "budget.max_tokens",
                "must be >= 1, got 0",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spends_and_earns() {
        let b = RetryBudget::new(0.5, 2);
        assert!(b.withdraw());
        assert!(b.withdraw());
        assert!(!b.withdraw());
        b.deposit();
        assert!(!b.withdraw());
        b.deposit();
        assert!(b.withdraw());
        for _ in 0..100 {
            b.deposit();
        }
        assert_eq!(b.tokens(), 2.0);
    }
}
