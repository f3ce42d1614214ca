use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use crate::error::ConfigError;

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
///
/// # Shared through the store
///
/// A budget is kept in the process by default: a fleet of `N` processes
/// lets a sick dependency see `N` times `max_tokens` more retries. A budget
/// made [`shared`](Self::shared) is kept in the pipeline's
/// [`StateStore`](crate::StateStore) instead, one bucket per resource (the
/// pipeline's name; a partition is a resource of its own, as for every
/// stateful policy), so every process on the same store draws on it: over
/// any run, the retries of all processes together stay within
/// `ratio x calls + max_tokens`.
///
/// The bucket is earned and spent in the admissions the pipeline makes
/// anyway: the first attempt's admission deposits `ratio`, a retry's
/// admission withdraws one token in the same request (one script on
/// Redis) that admits it through the other stateful policies, after the
/// backoff. A retry the store refuses for want of a token ends the call with
/// `retry_budget_exhausted`, as the local budget does. A pipeline with no
/// other stateful policy after its retry pays one store request per attempt
/// (on Redis, one round trip each; no record follows it).
///
/// When the store fails, the pipeline's store decides as for every stateful
/// policy: a fail-open store answers from a budget of this process (full at
/// first, earning and spending while the store is down), a fail-closed one
/// ends the call with [`Error::Store`](crate::Error::Store).
///
/// ```
/// use std::time::Duration;
/// use seawall::{Pipeline, Retry, RetryBudget};
///
/// let pipeline = Pipeline::builder("users-api")
///     .retry(Retry::constant(Duration::from_millis(50)).budget(RetryBudget::new(0.1, 10).shared()))
///     .build()?;
/// # let _ = pipeline;
/// # Ok::<(), seawall::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct RetryBudget {
    ratio: f64,
    max_tokens: u32,
    shared: bool,
    tokens: Arc<AtomicI64>,
}

impl PartialEq for RetryBudget {
    fn eq(&self, other: &Self) -> bool {
        self.ratio == other.ratio
            && self.max_tokens == other.max_tokens
            && self.shared == other.shared
    }
}

/// The budget's rule, on a bucket of thousandths of a token (an integer, so
/// that every store keeps it exactly; the Redis store's admit script
/// restates it, and a model test holds both to the same answers).
///
/// - A missing bucket is full: [`cap`](Self::cap).
/// - A call deposits [`earn`](Self::earn) (`ratio` in thousandths, rounded;
///   at least one, since a budget's ratio is at least
///   [`MIN_RATIO`](RetryBudget::MIN_RATIO)), never above the cap; a bucket
///   at or above the cap is left as it is.
/// - A retry withdraws [`SCALE`](Self::SCALE) (one token) from a bucket
///   holding at least that much, and is refused otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetRule {
    /// Thousandths of a token earned per call.
    pub earn: i64,
    /// Thousandths of a token the bucket holds at most (and at first).
    pub cap: i64,
}

impl BudgetRule {
    /// Thousandths per token.
    pub const SCALE: i64 = 1000;

    /// The bucket after a call's deposit.
    pub fn deposited(self, tokens: i64) -> i64 {
        if tokens >= self.cap {
            tokens
        } else {
            tokens.saturating_add(self.earn).min(self.cap)
        }
    }

    /// The bucket after a retry's withdrawal, or `None` when it holds less
    /// than one token (the retry is refused, the bucket unchanged).
    pub fn withdrawn(self, tokens: i64) -> Option<i64> {
        (tokens >= Self::SCALE).then(|| tokens - Self::SCALE)
    }
}

impl RetryBudget {
    /// The smallest ratio, one thousandth of a token per call.
    ///
    /// The bucket counts whole thousandths of a token, an integer that
    /// every store keeps exactly (the Redis store's admit script as well),
    /// and a call earns its ratio rounded to the thousandth: a ratio below
    /// this would earn nothing at all (below 0.0005) or more than asked,
    /// so `build()` refuses it.
    pub const MIN_RATIO: f64 = 1.0 / BudgetRule::SCALE as f64;

    /// A budget earning `ratio` tokens per call, holding at most `max_tokens`.
    ///
    /// `ratio` is in `[0.001, 1000]` ([`MIN_RATIO`](Self::MIN_RATIO): the
    /// bucket counts thousandths of a token, and a call earns its ratio
    /// rounded to the thousandth); `build()` refuses any other.
    ///
    /// # Default
    /// Kept in the process (see [`shared`](Self::shared)).
    pub fn new(ratio: f64, max_tokens: u32) -> Self {
        RetryBudget {
            ratio,
            max_tokens,
            shared: false,
            tokens: Arc::new(AtomicI64::new(i64::from(max_tokens) * BudgetRule::SCALE)),
        }
    }

    /// The same budget kept in the pipeline's store, shared by every
    /// process (and pipeline of the same name) on it: see
    /// [the type's docs](RetryBudget#shared-through-the-store). Only a
    /// retry's budget can be shared; a hedging budget made shared is a
    /// [`ConfigError`] at `build()`.
    #[must_use]
    pub fn shared(mut self) -> Self {
        self.shared = true;
        self
    }

    /// `true` when the budget is kept in the store ([`shared`](Self::shared)).
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    /// Tokens earned per call.
    pub fn ratio(&self) -> f64 {
        self.ratio
    }

    /// Tokens the bucket holds at most.
    pub fn max_tokens(&self) -> u32 {
        self.max_tokens
    }

    /// The rule of this budget, in thousandths of a token.
    pub fn rule(&self) -> BudgetRule {
        BudgetRule {
            earn: (self.ratio * BudgetRule::SCALE as f64).round() as i64,
            cap: i64::from(self.max_tokens) * BudgetRule::SCALE,
        }
    }

    /// Tokens left in this process's bucket (whole and fractional); a
    /// shared budget's are in the store.
    pub fn tokens(&self) -> f64 {
        self.tokens.load(Ordering::Relaxed) as f64 / BudgetRule::SCALE as f64
    }

    /// Called once per call.
    pub(crate) fn deposit(&self) {
        deposit(self.rule(), &self.tokens);
    }

    /// Spends one token for a retry; `false` when the budget is exhausted.
    pub(crate) fn withdraw(&self) -> bool {
        withdraw(self.rule(), &self.tokens)
    }

    /// Gives back the token of a hedge that did not start (refused by
    /// the policies after hedging), up to `max_tokens`.
    pub(crate) fn refund(&self) {
        refund(self.rule(), &self.tokens);
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
        if self.ratio < Self::MIN_RATIO {
            return Err(ConfigError::new(
                policy,
                "budget.ratio",
                format!(
                    "must be >= {}, got {}: a call earns its ratio in whole thousandths of a token (rounded), so a smaller ratio would earn none or more than asked",
                    Self::MIN_RATIO,
                    self.ratio
                ),
            ));
        }
        if self.max_tokens == 0 {
            return Err(ConfigError::new(
                policy,
                "budget.max_tokens",
                "must be >= 1, got 0",
            ));
        }
        if self.shared && policy != "retry" {
            return Err(ConfigError::new(
                policy,
                "budget.shared",
                "is for a retry's budget only; a hedging budget is kept in the process",
            ));
        }
        Ok(())
    }
}

/// [`BudgetRule::deposited`] on an atomic bucket. The write is skipped when
/// the bucket is full: no contention on the calls of a healthy dependency.
#[inline]
pub(crate) fn deposit(rule: BudgetRule, tokens: &AtomicI64) {
    let cur = tokens.load(Ordering::Relaxed);
    if cur >= rule.cap || rule.earn == 0 {
        return;
    }
    let _ = tokens.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
        Some(rule.deposited(t))
    });
}

/// [`BudgetRule::withdrawn`] on an atomic bucket.
#[inline]
pub(crate) fn withdraw(rule: BudgetRule, tokens: &AtomicI64) -> bool {
    tokens
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| rule.withdrawn(t))
        .is_ok()
}

/// Gives back a token withdrawn for a retry that a later check refused
/// (never above the cap).
#[inline]
pub(crate) fn refund(rule: BudgetRule, tokens: &AtomicI64) {
    let _ = tokens.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
        Some(t.saturating_add(BudgetRule::SCALE).min(rule.cap.max(t)))
    });
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

    #[test]
    fn the_rule_in_thousandths() {
        let rule = RetryBudget::new(0.1, 3).rule();
        assert_eq!(
            rule,
            BudgetRule {
                earn: 100,
                cap: 3000
            }
        );
        assert_eq!(rule.deposited(2950), 3000);
        assert_eq!(rule.deposited(3000), 3000);
        // A bucket above the cap (a rebind with a smaller cap) is left as
        // it is by a deposit.
        assert_eq!(rule.deposited(5000), 5000);
        assert_eq!(rule.withdrawn(1000), Some(0));
        assert_eq!(rule.withdrawn(999), None);
        let tokens = AtomicI64::new(0);
        refund(rule, &tokens);
        assert_eq!(tokens.load(Ordering::Relaxed), 1000);
    }

    /// A ratio below a thousandth of a token per call would earn nothing
    /// (rounded to the thousandth) or more than asked: refused, with the
    /// bound and why; from the bound up, every call earns.
    #[test]
    fn ratios_below_a_thousandth_are_refused() {
        for ratio in [0.0004, 0.0005, 0.000_999_9, 1e-300] {
            for policy in ["retry", "hedging"] {
                let e = RetryBudget::new(ratio, 1).validate_for(policy).unwrap_err();
                assert_eq!(e.field, "budget.ratio");
                assert_eq!(
                    e.to_string(),
                    format!(
                        "{policy}.budget.ratio must be >= 0.001, got {ratio}: a call earns its ratio in whole thousandths of a token (rounded), so a smaller ratio would earn none or more than asked"
                    )
                );
            }
        }
        for ratio in [RetryBudget::MIN_RATIO, 0.001, 0.0014, 0.3333, 1000.0] {
            let b = RetryBudget::new(ratio, 1);
            assert!(b.validate().is_ok(), "{ratio}");
            assert!(b.rule().earn >= 1, "{ratio}");
        }
        // The bucket refills from empty, a thousandth per call.
        let b = RetryBudget::new(0.001, 1);
        assert!(b.withdraw());
        for _ in 0..999 {
            b.deposit();
        }
        assert!(!b.withdraw());
        b.deposit();
        assert!(b.withdraw());
    }

    #[test]
    fn shared_is_for_retries_only() {
        let b = RetryBudget::new(0.1, 10).shared();
        assert!(b.is_shared());
        assert!(b.validate().is_ok());
        let e = b.validate_for("hedging").unwrap_err();
        assert_eq!(e.field, "budget.shared");
        assert_ne!(b, RetryBudget::new(0.1, 10));
    }
}
