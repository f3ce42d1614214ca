//! Hedging (async only), as Polly v8's hedging strategy: further attempts of
//! a call are started while earlier ones still run, and the first
//! acceptable answer wins; the other attempts' futures are dropped.
//!
//! ```
//! use std::time::Duration;
//! use seawall::{Hedging, Pipeline, RetryBudget};
//!
//! // A second attempt when the first has not answered within 50 ms, a
//! // third 50 ms later; hedges at most 10% of the calls.
//! let pipeline = Pipeline::builder("search-doc")
//!     .timeout(Duration::from_secs(2))
//!     .hedging(
//!         Hedging::latency(Duration::from_millis(50))
//!             .max_hedged_attempts(2)
//!             .budget(RetryBudget::new(0.1, 10)),
//!     )
//!     .timeout(Duration::from_millis(500)) // each hedged attempt
//!     .build()?;
//! # let _ = pipeline;
//! # Ok::<_, seawall::ConfigError>(())
//! ```
//!
//! # Modes
//! - **latency** ([`Hedging::latency`]): the next attempt starts when the
//!   previous one has not answered within the delay;
//! - **parallel** ([`Hedging::parallel`], a latency of zero): every attempt
//!   starts at once;
//! - **fallback** ([`Hedging::fallback`]): the next attempt starts only
//!   when the previous one failed (a retry without a wait);
//! - **dynamic** ([`Hedging::dynamic`]): the delay before each hedged
//!   attempt comes from a generator given that attempt's number (2 for the
//!   first hedge); [`HedgeDelay::OnFailure`] waits for a failure.
//!
//! In every mode a failed attempt starts the next one at once (when one
//! is left), as in Polly.
//!
//! # Semantics
//! - The first attempt is the call's own; `max_hedged_attempts` more may
//!   follow (at least 1, at most 10, as Polly's `MaxHedgedAttempts`). Each
//!   attempt runs with its own [`Context`]: its attempt number (1 for the
//!   first, 2 for the first hedge, ...) and its deadline.
//! - **Which outcomes failed**: an error the pipeline's classifier judges
//!   a retryable failure (every error without a classifier), narrowed by
//!   [`PipelineBuilder::hedge_if`](crate::PipelineBuilder::hedge_if) and
//!   `abort_if`, and an attempt that timed out. A failed attempt does not
//!   end the call while another runs or may still start. Any other outcome
//!   is acceptable and wins at once: a success, or an error that is not to
//!   be hedged (returned as [`Error::Operation`](crate::Error::Operation)).
//!   When every attempt failed, the call fails with the outcome of the
//!   attempt that ended last, whichever attempt that is (a slow first
//!   attempt that fails after its hedges gives its error; the first
//!   attempt's outcome is not preferred, as a retry returns its last):
//!   [`Error::RetryExhausted`](crate::Error::RetryExhausted) with the
//!   number of attempts, or the timeout.
//! - **Losers** are dropped as soon as an answer wins (their futures are
//!   dropped, as a timeout drops them), and give back what they hold
//!   without an outcome.
//! - **Budget** ([`Hedging::budget`], the [`RetryBudget`] rule): every call
//!   earns `ratio` tokens, every hedge tried spends one (given back if it
//!   is refused, see below); with fewer than one token left no hedge is
//!   tried (a `HedgeBudgetExhausted` event) and the call goes on with the
//!   attempts it has. Clones of a pipeline, and pipelines given clones of
//!   one budget, share it.
//! - **Hook** ([`Hedging::on_hedging`]): called with each hedged attempt's
//!   context just before it starts (once the policies after hedging
//!   admitted it); every hedge started is also a
//!   [`EventKind::HedgeStarted`](crate::EventKind::HedgeStarted) event.
//! - **Refused hedges**: a hedge refused by the policies declared after
//!   hedging (a full bulkhead, an open circuit, no rate-limit permit, the
//!   adaptive limit reached, after any wait they allow) while other
//!   attempts are under way did not start. It is reported (a `Rejected`
//!   event), runs no hook, gives its budget token back and takes no
//!   attempt number and no place under `max_hedged_attempts`: attempts are
//!   numbered in the order they start, and `max_hedged_attempts` bounds
//!   the hedges started. The next hedge is tried after the next delay,
//!   timed from the refusal: the delay of the mode (latency), or the
//!   generator's for the same attempt number again (dynamic). A delay of
//!   zero (parallel mode, or `HedgeDelay::After(0)`) is not tried again at
//!   once, which would meet the same refusal: the next hedge then waits for
//!   an attempt to fail. So a call whose hedges are all refused tries one
//!   per delay while its attempts run, never in a loop; a call whose first
//!   attempt runs on makes further tries until its deadline (declare a
//!   timeout before hedging to bound it). Polly counts a refused hedged
//!   attempt as a failed one (which starts the next at once); seawall does
//!   not hedge its own refusals, as it does not retry them.
//!
//! # Where hedging stands
//! Hedging makes the attempts of a call, as the retry does, and takes the
//! retry's place in the pipeline: a pipeline declares one or the other
//! (both is a `ConfigError`; hedging's fallback mode is a retry without a
//! wait). What is declared before it covers the whole call, what is
//! declared after it each hedged attempt, as in Polly's standard hedging
//! pipeline (total timeout, hedging, then rate limiter, circuit breaker and
//! attempt timeout for each attempt):
//! - a **timeout** before it bounds the whole call, every attempt included;
//!   one after it bounds each attempt from its own start;
//! - a **bulkhead** after it gives each hedged attempt a slot of its own
//!   (held while the attempt runs, given back when it loses); before it,
//!   the call holds one slot for all its attempts;
//! - a **circuit breaker** after it records the outcome of every attempt
//!   that ended (a loser dropped records nothing) and admits each hedged
//!   attempt; before it, records the call's outcome once;
//! - a **rate limiter** after it takes a permit per attempt;
//! - **chaos** after it acts on each hedged attempt;
//! - an attempt refused by the policies after it (a full bulkhead, an open
//!   circuit, no permit) does not start: the call goes on with the
//!   attempts under way (the next hedge tried after the next delay, see
//!   *Refused hedges* above), and a refusal ends the call only when none
//!   is under way (seawall's own refusals are never hedged, as they are
//!   never retried).
//!
//! # Async only
//! The attempts run concurrently and the losers are dropped, which a
//! blocking call on one thread cannot do: [`Pipeline::call`](crate::Pipeline::call)
//! on a pipeline with hedging returns [`Error::Config`](crate::Error::Config)
//! at once, without running the operation (a coalesced one too: it takes
//! neither a cached value nor a concurrent call's result), and
//! `#[resilient(hedging(..))]`
//! on a sync fn is a compile error.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::context::Context;
use crate::error::ConfigError;
use crate::retry::RetryBudget;

/// The name of the policy in configuration errors and metrics.
pub(crate) const NAME: &str = "hedging";

/// The most hedged attempts a call may make beyond its first.
pub const MAX_HEDGED_ATTEMPTS: u32 = 10;

type DelayFn = Arc<dyn Fn(u32) -> HedgeDelay + Send + Sync>;
type Hook = Arc<dyn Fn(&Context) + Send + Sync>;

/// What a dynamic hedging generator says of the next attempt
/// ([`Hedging::dynamic`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HedgeDelay {
    /// Start it this long after the previous attempt started (zero: now),
    /// or earlier if an attempt fails.
    After(Duration),
    /// Start it only when an attempt fails.
    OnFailure,
}

/// How the hedged attempts are started.
#[derive(Clone)]
#[non_exhaustive]
pub enum HedgingMode {
    /// The next attempt starts when the previous one has not answered
    /// within this delay (zero: all at once, [`Hedging::parallel`]).
    Latency(Duration),
    /// The next attempt starts only when the previous one failed.
    Fallback,
    /// The delay before each hedged attempt comes from a generator given
    /// that attempt's number (2 for the first hedge).
    Dynamic(DelayFn),
}

impl fmt::Debug for HedgingMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HedgingMode::Latency(d) if d.is_zero() => f.write_str("Parallel"),
            HedgingMode::Latency(d) => f.debug_tuple("Latency").field(d).finish(),
            HedgingMode::Fallback => f.write_str("Fallback"),
            HedgingMode::Dynamic(_) => f.write_str("Dynamic(..)"),
        }
    }
}

/// Configuration of hedging; see the [module docs](self).
///
/// # Default
/// One hedged attempt (`max_hedged_attempts(1)`), no budget, no hook; the
/// mode is the constructor's.
#[derive(Clone)]
#[non_exhaustive]
pub struct Hedging {
    /// Hedged attempts beyond the first (1 to [`MAX_HEDGED_ATTEMPTS`]).
    pub max_hedged_attempts: u32,
    /// How the hedged attempts are started.
    pub mode: HedgingMode,
    /// Limits hedged attempts to a share of calls.
    pub budget: Option<RetryBudget>,
    on_hedging: Option<Hook>,
}

impl fmt::Debug for Hedging {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hedging")
            .field("max_hedged_attempts", &self.max_hedged_attempts)
            .field("mode", &self.mode)
            .field("budget", &self.budget)
            .field("on_hedging", &self.on_hedging.is_some())
            .finish()
    }
}

impl PartialEq for Hedging {
    /// Equal settings: the same mode (a dynamic generator only equals
    /// itself), attempts and budget settings; hooks are not compared.
    fn eq(&self, other: &Self) -> bool {
        let mode = match (&self.mode, &other.mode) {
            (HedgingMode::Latency(a), HedgingMode::Latency(b)) => a == b,
            (HedgingMode::Fallback, HedgingMode::Fallback) => true,
            (HedgingMode::Dynamic(a), HedgingMode::Dynamic(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        mode && self.max_hedged_attempts == other.max_hedged_attempts && self.budget == other.budget
    }
}

impl Hedging {
    fn with_mode(mode: HedgingMode) -> Self {
        Hedging {
            max_hedged_attempts: 1,
            mode,
            budget: None,
            on_hedging: None,
        }
    }

    /// Latency mode: the next attempt starts when the previous one has not
    /// answered within `delay` (a delay of zero is [`parallel`](Self::parallel)).
    ///
    /// # Errors
    /// A delay of a day or more fails `build()` (`hedging.delay must be <
    /// 86400s`): it would never hedge in practice; [`fallback`](Self::fallback)
    /// says "only on failures". A [`dynamic`](Self::dynamic) generator may
    /// answer any delay, `Duration::MAX` included (that hedge then starts
    /// only on a failure).
    pub fn latency(delay: Duration) -> Self {
        Self::with_mode(HedgingMode::Latency(delay))
    }

    /// Parallel mode: every attempt starts at once.
    pub fn parallel() -> Self {
        Self::latency(Duration::ZERO)
    }

    /// Fallback mode: the next attempt starts only when the previous one
    /// failed.
    pub fn fallback() -> Self {
        Self::with_mode(HedgingMode::Fallback)
    }

    /// Dynamic mode: `delay(attempt)` says when the hedged attempt numbered
    /// `attempt` (2 for the first hedge) starts, after the previous one
    /// started or on a failure.
    ///
    /// ```
    /// use std::time::Duration;
    /// use seawall::hedge::{HedgeDelay, Hedging};
    ///
    /// // The first hedge after 100 ms, the next ones only on a failure.
    /// let hedging = Hedging::dynamic(|attempt| match attempt {
    ///     2 => HedgeDelay::After(Duration::from_millis(100)),
    ///     _ => HedgeDelay::OnFailure,
    /// })
    /// .max_hedged_attempts(3);
    /// # let _ = hedging;
    /// ```
    pub fn dynamic<F>(delay: F) -> Self
    where
        F: Fn(u32) -> HedgeDelay + Send + Sync + 'static,
    {
        Self::with_mode(HedgingMode::Dynamic(Arc::new(delay)))
    }

    /// Hedged attempts beyond the first (1 to [`MAX_HEDGED_ATTEMPTS`]).
    pub fn max_hedged_attempts(mut self, attempts: u32) -> Self {
        self.max_hedged_attempts = attempts;
        self
    }

    /// Limits hedged attempts to a share of calls: every call earns the
    /// budget's `ratio` of a token, every hedged attempt spends one.
    pub fn budget(mut self, budget: RetryBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Calls `hook` with each hedged attempt's context just before the
    /// attempt starts.
    pub fn on_hedging<F>(mut self, hook: F) -> Self
    where
        F: Fn(&Context) + Send + Sync + 'static,
    {
        self.on_hedging = Some(Arc::new(hook));
        self
    }

    /// When the attempt numbered `attempt` (2 for the first hedge) is
    /// tried, counted from the start of the previous attempt (or from the
    /// refusal of a hedge that was to have this number): after a delay, or
    /// only on a failure.
    pub fn delay_before(&self, attempt: u32) -> HedgeDelay {
        match &self.mode {
            HedgingMode::Latency(d) => HedgeDelay::After(*d),
            HedgingMode::Fallback => HedgeDelay::OnFailure,
            HedgingMode::Dynamic(f) => f(attempt),
        }
    }

    /// The hook of a hedged attempt.
    pub(crate) fn hedging_hook(&self, ctx: &Context) {
        if let Some(hook) = &self.on_hedging {
            hook(ctx)
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=MAX_HEDGED_ATTEMPTS).contains(&self.max_hedged_attempts) {
            return Err(ConfigError::new(
                NAME,
                "max_hedged_attempts",
                format!(
                    "must be in 1..={MAX_HEDGED_ATTEMPTS} (hedged attempts beyond the first), got {}",
                    self.max_hedged_attempts
                ),
            ));
        }
        if let HedgingMode::Latency(d) = self.mode {
            if d >= MAX_DELAY {
                return Err(ConfigError::new(
                    NAME,
                    "delay",
                    format!(
                        "must be < {} (use mode `fallback` to hedge only on failures), got {}",
                        crate::error::Human(MAX_DELAY),
                        crate::error::Human(d)
                    ),
                ));
            }
        }
        if let Some(b) = &self.budget {
            b.validate_for(NAME)?;
        }
        Ok(())
    }
}

/// The longest latency delay: a day. A longer one never fires in practice;
/// the fallback mode says "only on failures".
const MAX_DELAY: Duration = Duration::from_secs(86_400);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_messages() {
        let e = Hedging::parallel()
            .max_hedged_attempts(0)
            .validate()
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "hedging.max_hedged_attempts must be in 1..=10 (hedged attempts beyond the first), got 0"
        );
        let e = Hedging::latency(Duration::from_secs(86_400 * 2))
            .validate()
            .unwrap_err();
        assert_eq!(e.field, "delay");
        let e = Hedging::fallback()
            .budget(RetryBudget::new(-0.1, 5))
            .validate()
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "hedging.budget.ratio must be in (0, 1000], got -0.1"
        );
        assert!(Hedging::latency(Duration::from_millis(5))
            .max_hedged_attempts(10)
            .validate()
            .is_ok());
    }

    #[test]
    fn delays_of_each_mode() {
        let d = Duration::from_millis(7);
        assert_eq!(Hedging::latency(d).delay_before(3), HedgeDelay::After(d));
        assert_eq!(
            Hedging::parallel().delay_before(2),
            HedgeDelay::After(Duration::ZERO)
        );
        assert_eq!(Hedging::fallback().delay_before(2), HedgeDelay::OnFailure);
        let dynamic = Hedging::dynamic(|n| HedgeDelay::After(Duration::from_millis(u64::from(n))));
        assert_eq!(
            dynamic.delay_before(4),
            HedgeDelay::After(Duration::from_millis(4))
        );
    }
}
