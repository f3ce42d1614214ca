//! Chaos injection, as Polly v8's chaos strategies (Simmy): a fault (an
//! error of the operation's type), an outcome (a value of its type), a
//! latency (a delay before the
//! operation), a behaviour (a hook run before the operation), each with an
//! injection rate (or a rate generator) and a switch that can be flipped at
//! run time.
//!
//! ```
//! use std::time::Duration;
//! use seawall::chaos::{Chaos, ChaosSwitch};
//! use seawall::{Pipeline, Retry};
//!
//! let switch = ChaosSwitch::new(true);
//! let pipeline = Pipeline::builder("chaos-doc")
//!     .retry(Retry::constant(Duration::from_millis(1)).max_attempts(3))
//!     .chaos(Chaos::latency(0.1, Duration::from_millis(50)).enabled(switch.clone()))
//!     .chaos_fault(Chaos::fault(0.05, |_ctx| std::io::Error::other("injected")))
//!     .build()?;
//! switch.set(false); // takes effect on the next call
//! # let _ = pipeline;
//! # Ok::<_, seawall::ConfigError>(())
//! ```
//!
//! # Semantics
//! - Chaos is decided by the call engine for **each attempt**, after the
//!   attempt was admitted by the stateful policies that guard it and
//!   before the operation runs, in declaration order. It is declared after
//!   the retry (a pipeline without a retry is one attempt), any number of
//!   times (a latency and a fault, say): chaos declared before the retry is
//!   refused by `build()`.
//! - Each enabled chaos policy draws one number `x` in `[0, 1)` from the
//!   pipeline's random source ([`PipelineBuilder::random`](crate::PipelineBuilder::random),
//!   so a seeded or sequenced source makes injections repeatable) and
//!   injects when `x < rate`: a rate of 0 never injects, 1 always. A
//!   disabled policy draws nothing. A rate generator's value is clamped to
//!   `[0, 1]` (NaN counts as 0).
//! - A latency is slept on the pipeline's clock before the operation, and
//!   is inside the attempt's deadline: in async code a latency longer than
//!   the attempt timeout times the attempt out. In sync code, where the
//!   timeout is cooperative, it is slept whole, as a slow blocking
//!   operation would take its time, and the operation then runs with no
//!   time left: the attempt is late, reported by a `DeadlineExceeded`
//!   event ([`Timeout::new`](crate::Timeout::new)) or a timeout
//!   ([`Timeout::strict`](crate::Timeout::strict)). Latencies of several
//!   policies add up. A latency of zero is no injection (as in Polly, whose
//!   chaos latency skips a latency of zero or less): the policy draws as
//!   usual, then injects nothing, reports nothing (no event, no metric) and
//!   sleeps nothing, sync and async.
//! - A fault ends the attempt with the generated error without running the
//!   operation (after any injected latency): it is classified, retried and
//!   recorded by the circuit breaker as an error of the operation.
//! - An outcome ends the attempt with the generated value, a success,
//!   without running the operation (after any injected latency).
//! - A behaviour runs its hook before the operation, which then runs.
//! - Every injection emits [`EventKind::ChaosInjected`](crate::EventKind::ChaosInjected)
//!   (a latency of zero is none, see above).
//! - A pipeline with chaos takes the engine's general loop; a disabled
//!   policy costs one relaxed atomic load per attempt (a [`ChaosSwitch`]).
//!
//! # Typed faults and outcomes
//! A fault's generator returns the pipeline's error type `E`, so it is
//! declared with [`PipelineBuilder::chaos_fault`](crate::PipelineBuilder::chaos_fault),
//! which fixes `E` like a classifier does; the generator is kept with the
//! pipeline's other typed error handlers. An outcome's generator returns
//! the value type `T`: [`PipelineBuilder::chaos_outcome`](crate::PipelineBuilder::chaos_outcome)
//! fixes `T` too (the pipeline's kind becomes
//! [`ValueType<T, E>`](crate::pipeline::ValueType), or stays the fallback's
//! kind, which knows `T`), so the value always has the type of the calls.
//! An injected outcome ends the attempt as a success without running the
//! operation.
//!
//! # Configuration files and `#[resilient]`
//! Both declare a latency injection, `chaos = { rate = 0.1, latency =
//! "200ms", enabled = true }` in a file, `chaos(rate = 0.1, latency_ms =
//! 200)` in the attribute, after `retry` (a file's default order puts it
//! innermost). A fault's error and a switch flipped at run time come from
//! code: declare them with the builder.
//!
//! # Not supported
//! Chaos around the whole call (declared before the retry): `build()`
//! refuses it, naming the reason.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Random;
use crate::context::Context;
use crate::error::ConfigError;

type RateFn = Arc<dyn Fn(&Context) -> f64 + Send + Sync>;
type Hook = Arc<dyn Fn(&Context) + Send + Sync>;
pub(crate) type FaultFn<E> = Arc<dyn Fn(&Context) -> E + Send + Sync>;
pub(crate) type OutcomeFn<T> = Arc<dyn Fn(&Context) -> T + Send + Sync>;

/// The name of the policy in configuration errors and metrics.
pub(crate) const NAME: &str = "chaos";

/// A switch that enables or disables chaos policies at run time; clones
/// share one state. Reading it is one relaxed atomic load.
#[derive(Debug, Clone, Default)]
pub struct ChaosSwitch(Arc<AtomicBool>);

impl ChaosSwitch {
    /// A switch, on or off.
    pub fn new(on: bool) -> Self {
        ChaosSwitch(Arc::new(AtomicBool::new(on)))
    }

    /// Turns the switch on or off; calls that start afterwards see it.
    pub fn set(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed);
    }

    /// Whether the switch is on.
    pub fn is_on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

impl From<Arc<AtomicBool>> for ChaosSwitch {
    fn from(flag: Arc<AtomicBool>) -> Self {
        ChaosSwitch(flag)
    }
}

impl From<bool> for ChaosSwitch {
    fn from(on: bool) -> Self {
        ChaosSwitch::new(on)
    }
}

/// Whether a policy injects at all.
#[derive(Clone)]
enum Enabled {
    Always,
    Switch(ChaosSwitch),
    When(Arc<dyn Fn() -> bool + Send + Sync>),
}

/// How likely an injection is.
#[derive(Clone)]
enum Rate {
    Fixed(f64),
    Generated(RateFn),
}

/// What a chaos policy injects.
#[derive(Clone)]
pub(crate) enum Action {
    Latency(Duration),
    Behavior(Hook),
    /// The fault generator at this index of the pipeline's typed error
    /// handlers.
    Fault(usize),
    /// The outcome generator at this index of the pipeline's typed
    /// handlers.
    Outcome(usize),
}

/// What a chaos injection was, as events report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChaosKind {
    /// An error was injected: the operation did not run.
    Fault,
    /// A value was injected: the operation did not run.
    Outcome,
    /// A delay was injected before the operation.
    Latency {
        /// The delay.
        delay: Duration,
    },
    /// A behaviour hook ran before the operation.
    Behavior,
}

impl ChaosKind {
    /// `fault`, `latency` or `behavior`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ChaosKind::Fault => "fault",
            ChaosKind::Outcome => "outcome",
            ChaosKind::Latency { .. } => "latency",
            ChaosKind::Behavior => "behavior",
        }
    }
}

/// A chaos policy: what it injects, how often, and whether it is enabled.
/// See the [module docs](self).
#[derive(Clone)]
pub struct Chaos {
    pub(crate) action: Action,
    rate: Rate,
    enabled: Enabled,
}

impl fmt::Debug for Chaos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Chaos");
        match &self.action {
            Action::Latency(l) => d.field("latency", l),
            Action::Behavior(_) => d.field("behavior", &true),
            Action::Fault(_) => d.field("fault", &true),
            Action::Outcome(_) => d.field("outcome", &true),
        };
        match &self.rate {
            Rate::Fixed(r) => d.field("rate", r),
            Rate::Generated(_) => d.field("rate", &"generated"),
        };
        d.finish_non_exhaustive()
    }
}

impl Chaos {
    fn new(rate: f64, action: Action) -> Self {
        Chaos {
            action,
            rate: Rate::Fixed(rate),
            enabled: Enabled::Always,
        }
    }

    /// Injects `delay` before the operation in a share `rate` (0..=1) of
    /// attempts. A `delay` of zero never injects: no event, no metric (see
    /// the [module docs](self)).
    pub fn latency(rate: f64, delay: Duration) -> Self {
        Chaos::new(rate, Action::Latency(delay))
    }

    /// Runs `hook` before the operation in a share `rate` (0..=1) of
    /// attempts.
    pub fn behavior<F>(rate: f64, hook: F) -> Self
    where
        F: Fn(&Context) + Send + Sync + 'static,
    {
        Chaos::new(rate, Action::Behavior(Arc::new(hook)))
    }

    /// Ends a share `rate` (0..=1) of attempts with the error `fault`
    /// makes, without running the operation. Declare it with
    /// [`PipelineBuilder::chaos_fault`](crate::PipelineBuilder::chaos_fault).
    pub fn fault<E, F>(rate: f64, fault: F) -> ChaosFault<E>
    where
        F: Fn(&Context) -> E + Send + Sync + 'static,
    {
        ChaosFault {
            chaos: Chaos::new(rate, Action::Fault(0)),
            fault: Arc::new(fault),
        }
    }

    /// Ends a share `rate` (0..=1) of attempts with the value `outcome`
    /// makes, as a success, without running the operation. Declare it with
    /// [`PipelineBuilder::chaos_outcome`](crate::PipelineBuilder::chaos_outcome).
    pub fn outcome<T, F>(rate: f64, outcome: F) -> ChaosOutcome<T>
    where
        F: Fn(&Context) -> T + Send + Sync + 'static,
    {
        ChaosOutcome {
            chaos: Chaos::new(rate, Action::Outcome(0)),
            outcome: Arc::new(outcome),
        }
    }

    /// Injects only while `switch` is on (a [`ChaosSwitch`], an
    /// `Arc<AtomicBool>` or a `bool`); flipping it takes effect on the
    /// next attempt.
    pub fn enabled(mut self, switch: impl Into<ChaosSwitch>) -> Self {
        self.enabled = Enabled::Switch(switch.into());
        self
    }

    /// Injects only while `when()` returns `true` (asked once per attempt).
    pub fn enabled_when<F>(mut self, when: F) -> Self
    where
        F: Fn() -> bool + Send + Sync + 'static,
    {
        self.enabled = Enabled::When(Arc::new(when));
        self
    }

    /// The injection rate of each attempt is `generator(ctx)` (clamped to
    /// `0..=1`), instead of the fixed rate.
    pub fn rate_generator<F>(mut self, generator: F) -> Self
    where
        F: Fn(&Context) -> f64 + Send + Sync + 'static,
    {
        self.rate = Rate::Generated(Arc::new(generator));
        self
    }

    /// The rule on the settings: a fixed rate in `0..=1`.
    ///
    /// # Errors
    /// A [`ConfigError`] naming `chaos.rate`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.rate {
            Rate::Fixed(r) if !(0.0..=1.0).contains(&r) => Err(ConfigError::new(
                NAME,
                "rate",
                format!("must be a number in 0..=1, got {r}"),
            )),
            _ => Ok(()),
        }
    }

    /// Whether the policy injects into the attempt `ctx`: enabled (one
    /// relaxed load for a switch), then one draw from `random` against the
    /// rate, and something to inject: a latency of zero is none (the one
    /// statement of it; the draw is made all the same, so that a zero
    /// latency leaves the other policies' draws where they were).
    #[inline]
    pub(crate) fn injects(&self, ctx: &Context, random: &dyn Random) -> bool {
        let on = match &self.enabled {
            Enabled::Always => true,
            Enabled::Switch(s) => s.is_on(),
            Enabled::When(f) => f(),
        };
        if !on {
            return false;
        }
        let rate = match &self.rate {
            Rate::Fixed(r) => *r,
            Rate::Generated(g) => g(ctx),
        };
        drawn(rate, random.next_f64()) && !self.injects_nothing()
    }

    /// `true` when an injection of the policy would change nothing: a
    /// latency of zero.
    fn injects_nothing(&self) -> bool {
        matches!(self.action, Action::Latency(delay) if delay.is_zero())
    }

    /// Whether the policy may inject into a call that starts now: `false`
    /// only when its switch is off (one relaxed load). A closure switch is
    /// asked once per attempt, by [`injects`](Self::injects), so it counts
    /// as on here.
    #[inline(always)]
    pub(crate) fn may_inject(&self) -> bool {
        match &self.enabled {
            Enabled::Switch(s) => s.is_on(),
            Enabled::Always | Enabled::When(_) => true,
        }
    }

    /// What an injection of this policy is, for its event.
    pub(crate) fn kind(&self) -> ChaosKind {
        match self.action {
            Action::Latency(delay) => ChaosKind::Latency { delay },
            Action::Behavior(_) => ChaosKind::Behavior,
            Action::Fault(_) => ChaosKind::Fault,
            Action::Outcome(_) => ChaosKind::Outcome,
        }
    }
}

/// The rule of an injection: the draw `x` in `[0, 1)` falls under the rate
/// (clamped to `[0, 1]`, NaN as 0).
fn drawn(rate: f64, x: f64) -> bool {
    let rate = if rate.is_nan() {
        0.0
    } else {
        rate.clamp(0.0, 1.0)
    };
    x < rate
}

/// A fault injection for errors of type `E`: see [`Chaos::fault`].
pub struct ChaosFault<E> {
    pub(crate) chaos: Chaos,
    pub(crate) fault: FaultFn<E>,
}

/// An outcome injection for values of type `T`: see [`Chaos::outcome`].
pub struct ChaosOutcome<T> {
    pub(crate) chaos: Chaos,
    pub(crate) outcome: OutcomeFn<T>,
}

/// The settings shared by the typed injections, delegated to [`Chaos`].
macro_rules! typed_injection {
    ($name:ident<$p:ident>, $field:ident) => {
        impl<$p> Clone for $name<$p> {
            fn clone(&self) -> Self {
                $name {
                    chaos: self.chaos.clone(),
                    $field: Arc::clone(&self.$field),
                }
            }
        }

        impl<$p> fmt::Debug for $name<$p> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.chaos.fmt(f)
            }
        }

        impl<$p> $name<$p> {
            /// See [`Chaos::enabled`].
            pub fn enabled(self, switch: impl Into<ChaosSwitch>) -> Self {
                $name {
                    chaos: self.chaos.enabled(switch),
                    ..self
                }
            }

            /// See [`Chaos::enabled_when`].
            pub fn enabled_when<F>(self, when: F) -> Self
            where
                F: Fn() -> bool + Send + Sync + 'static,
            {
                $name {
                    chaos: self.chaos.enabled_when(when),
                    ..self
                }
            }

            /// See [`Chaos::rate_generator`].
            pub fn rate_generator<F>(self, generator: F) -> Self
            where
                F: Fn(&Context) -> f64 + Send + Sync + 'static,
            {
                $name {
                    chaos: self.chaos.rate_generator(generator),
                    ..self
                }
            }
        }
    };
}

typed_injection!(ChaosFault<E>, fault);
typed_injection!(ChaosOutcome<T>, outcome);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_draw_falls_under_the_rate() {
        assert!(!drawn(0.0, 0.0));
        assert!(drawn(1.0, 0.999_999));
        assert!(drawn(0.5, 0.25));
        assert!(!drawn(0.5, 0.5));
        assert!(!drawn(f64::NAN, 0.0));
        assert!(drawn(7.0, 0.9));
        assert!(!drawn(-1.0, 0.0));
    }

    #[test]
    fn a_rate_outside_the_unit_interval_is_refused() {
        for bad in [-0.1, 1.5, f64::NAN] {
            let e = Chaos::latency(bad, Duration::ZERO).validate().unwrap_err();
            assert_eq!((e.policy, e.field), ("chaos", "rate"));
        }
        assert!(Chaos::latency(1.0, Duration::ZERO).validate().is_ok());
    }
}
