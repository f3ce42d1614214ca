//! Retry: tries a failed operation again after a backoff delay.
//!
//! ```
//! use std::time::Duration;
//! use seawall::{Jitter, Retry};
//!
//! let retry = Retry::exponential(Duration::from_millis(200))
//!     .multiplier(2.0)
//!     .cap(Duration::from_secs(10))
//!     .jitter(Jitter::Full)
//!     .max_attempts(5);
//! # let _ = retry;
//! ```
//!
//! A retry never runs again after a rejection by one of seawall's own
//! policies, honours the classifier's retry-after hint (waiting at least that
//! long), and gives up with the real last error as soon as the next wait
//! would not end by the call's deadline (a wait that ends at the deadline
//! fits: a result at the deadline is on time).

use std::time::Duration;

use crate::clock::Random;
use crate::error::ConfigError;

mod backoff;
mod budget;

pub use backoff::{Backoff, Jitter};
pub(crate) use backoff::{BackoffKind, BackoffSetting};
pub(crate) use budget::{deposit, refund, withdraw};
pub use budget::{BudgetRule, RetryBudget};

/// Configuration of a retry policy.
///
/// # Default
/// 3 attempts in all, no jitter, no budget.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Retry {
    /// Attempts in all, the first one included (>= 1).
    pub max_attempts: u32,
    /// How the delay grows.
    pub backoff: Backoff,
    /// How the delay is randomised.
    pub jitter: Jitter,
    /// Shared budget limiting retries to a share of calls.
    pub budget: Option<RetryBudget>,
    /// The first setting given to a backoff it does not apply to, and that
    /// backoff's kind: refused by `build()`, never ignored.
    unapplied: Option<(BackoffSetting, BackoffKind)>,
}

impl Retry {
    /// The same delay before every retry.
    pub fn constant(delay: Duration) -> Self {
        Self::with_backoff(Backoff::Constant { delay })
    }

    /// `base`, `2 x base`, `3 x base`, ...
    ///
    /// A base of zero retries at once, as [`constant`](Self::constant)
    /// with zero does (every delay is zero; jitter keeps it zero).
    pub fn linear(base: Duration) -> Self {
        Self::with_backoff(Backoff::Linear {
            base,
            cap: Duration::MAX,
        })
    }

    /// `base`, `base x m`, `base x m^2`, ... (multiplier 2 unless set).
    ///
    /// A base of zero retries at once, as [`constant`](Self::constant)
    /// with zero does (every delay is zero; jitter keeps it zero).
    pub fn exponential(base: Duration) -> Self {
        Self::with_backoff(Backoff::Exponential {
            base,
            multiplier: 2.0,
            cap: Duration::MAX,
        })
    }

    /// AWS "decorrelated jitter": each delay drawn from
    /// `[base, previous x 3]`, capped.
    pub fn decorrelated(base: Duration, cap: Duration) -> Self {
        Self::with_backoff(Backoff::Decorrelated { base, cap })
    }

    /// A retry with this backoff.
    pub fn with_backoff(backoff: Backoff) -> Self {
        Retry {
            max_attempts: 3,
            backoff,
            jitter: Jitter::None,
            budget: None,
            unapplied: None,
        }
    }

    /// Attempts in all, the first one included.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// Growth factor of an exponential backoff. Any other backoff has
    /// none: `build()` refuses it there (`retry.multiplier applies only to
    /// exponential backoff, not linear`).
    pub fn multiplier(mut self, m: f64) -> Self {
        if self.takes(BackoffSetting::Multiplier) {
            if let Backoff::Exponential { multiplier, .. } = &mut self.backoff {
                *multiplier = m;
            }
        }
        self
    }

    /// Upper bound of the delay before jitter: full and equal jitter never
    /// wait longer than the cap, a [`Jitter::Proportional`] of `p` % may
    /// wait up to `p` % beyond it (the jitter spreads the capped delay
    /// both ways, so that clients at the cap do not retry in lockstep).
    /// At least the base delay:
    /// `build()` refuses a cap below it (`retry.cap must be >= base`). A
    /// constant backoff has none: `build()` refuses it there (`retry.cap
    /// does not apply to constant backoff`).
    pub fn cap(mut self, max: Duration) -> Self {
        if self.takes(BackoffSetting::Cap) {
            match &mut self.backoff {
                Backoff::Linear { cap, .. }
                | Backoff::Exponential { cap, .. }
                | Backoff::Decorrelated { cap, .. } => *cap = max,
                Backoff::Constant { .. } => {}
            }
        }
        self
    }

    /// `true` when `setting` applies to the backoff
    /// ([`BackoffSetting::applies_to`]); otherwise the first such setting
    /// is kept for `validate()` to refuse.
    fn takes(&mut self, setting: BackoffSetting) -> bool {
        let kind = self.backoff.kind();
        let applies = setting.applies_to(kind);
        if !applies && self.unapplied.is_none() {
            self.unapplied = Some((setting, kind));
        }
        applies
    }

    /// How the delay is randomised.
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Limits retries to a share of calls.
    pub fn budget(mut self, budget: RetryBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// The delay before attempt `attempt + 1`, after attempt `attempt`
    /// (1-based) failed; `previous` is the delay used before `attempt`
    /// (decorrelated backoff needs it).
    pub fn delay(&self, attempt: u32, previous: Duration, random: &dyn Random) -> Duration {
        let raw = self.backoff.delay(attempt, previous, random);
        self.jitter.apply(raw, random)
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if let Some((setting, kind)) = self.unapplied {
            return Err(setting.refusal(kind));
        }
        if self.max_attempts == 0 {
            return Err(ConfigError::new(
                "retry",
                "max_attempts",
                "must be >= 1, got 0",
            ));
        }
        self.backoff.validate()?;
        self.jitter.validate()?;
        if let Some(b) = &self.budget {
            b.validate()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_messages() {
        let e = Retry::constant(Duration::from_millis(1))
            .max_attempts(0)
            .validate()
            .unwrap_err();
        assert_eq!(e.to_string(), "retry.max_attempts must be >= 1, got 0");
        let e = Retry::exponential(Duration::from_secs(2))
            .cap(Duration::from_secs(1))
            .validate()
            .unwrap_err();
        assert_eq!(e.to_string(), "retry.cap must be >= base (2s), got 1s");
        let e = Retry::constant(Duration::from_millis(1))
            .jitter(Jitter::Proportional(120.0))
            .validate()
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "retry.jitter percentage must be in 0..=100, got 120"
        );
        let e = Retry::exponential(Duration::from_millis(1))
            .multiplier(0.5)
            .validate()
            .unwrap_err();
        assert_eq!(e.field, "multiplier");
    }

    /// A setting given to a backoff it does not apply to is refused by
    /// name, in the words of the configuration files, never ignored.
    #[test]
    fn settings_of_another_backoff_are_refused() {
        let d = Duration::from_secs(10);
        let refused = |r: Retry| r.validate().map_err(|e| e.to_string());
        assert_eq!(
            refused(Retry::constant(d).cap(Duration::from_secs(1))),
            Err("retry.cap does not apply to constant backoff".into())
        );
        for (r, kind) in [
            (Retry::constant(d), "constant"),
            (Retry::linear(d), "linear"),
            (Retry::decorrelated(d, d), "decorrelated"),
        ] {
            assert_eq!(
                refused(r.multiplier(3.0)),
                Err(format!(
                    "retry.multiplier applies only to exponential backoff, not {kind}"
                ))
            );
        }
        // The first one given is named.
        assert_eq!(
            refused(Retry::constant(d).multiplier(3.0).cap(d)).unwrap_err(),
            "retry.multiplier applies only to exponential backoff, not constant"
        );
        assert_eq!(
            refused(Retry::exponential(d).multiplier(3.0).cap(d)),
            Ok(())
        );
        assert_eq!(refused(Retry::linear(d).cap(d)), Ok(()));
        assert_eq!(refused(Retry::decorrelated(d, d).cap(d)), Ok(()));
    }

    /// The statement of which setting applies to which backoff is where
    /// the setters keep the setting: a setting that applies changes the
    /// backoff, one that does not leaves it as it was.
    #[test]
    fn the_statement_matches_where_settings_are_kept() {
        let d = Duration::from_millis(5);
        let all = [
            Retry::constant(d),
            Retry::linear(d),
            Retry::exponential(d),
            Retry::decorrelated(d, Duration::from_secs(1)),
        ];
        for r in all {
            let kind = r.backoff.kind();
            for setting in [BackoffSetting::Multiplier, BackoffSetting::Cap] {
                let set = match setting {
                    BackoffSetting::Multiplier => r.clone().multiplier(7.0),
                    BackoffSetting::Cap => r.clone().cap(Duration::from_secs(7)),
                };
                assert_eq!(
                    set.backoff != r.backoff,
                    setting.applies_to(kind),
                    "{setting:?} on {kind:?}"
                );
                assert_eq!(set.validate().is_ok(), setting.applies_to(kind));
            }
        }
    }
}
