//! Circuit breaker: stops calling a dependency that keeps failing, and
//! probes it again after a cooldown.
//!
//! Three ways to judge the dependency ([`BreakerMode`]):
//! consecutive failures, the last N calls (count window), or the calls of the
//! last W seconds (time window, per-second buckets). Window modes trip on a
//! failure-rate threshold and, optionally, a slow-call-rate threshold, once
//! `minimum_calls` calls are in the window. The rates are judged when a
//! failed or slow call is recorded.
//!
//! The rules are pure functions in `rules.rs` (state, parameters, input,
//! time in; answer and next state out); the memory store's cell
//! (`machine.rs`) applies them in a compare-and-swap loop over one packed
//! word. An open circuit refuses with the time left of its cooldown as the
//! `retry_after`; the end of a cooldown is kept in whole milliseconds,
//! rounded up, and an end beyond what that holds (about 139 years after the
//! clock's origin) stays open until the latest instant of the clock.
//!
//! ```
//! use std::time::Duration;
//! use seawall::CircuitBreaker;
//!
//! let breaker = CircuitBreaker::failure_rate(0.5)
//!     .minimum_calls(10)
//!     .window(Duration::from_secs(60))
//!     .slow_calls(0.8, Duration::from_secs(2))
//!     .cooldown(Duration::from_secs(30))
//!     .cooldown_growth(2.0, Duration::from_secs(300))
//!     .half_open_calls(2);
//! # let _ = breaker;
//! ```
//!
//! # Other states and modes
//! Besides closed, open and half-open, a circuit can be:
//! - **isolated** ([`Pipeline::isolate`](crate::Pipeline::isolate)): open
//!   until reset, refusing every call without a hint;
//! - **opened for a while** ([`Pipeline::open_for`](crate::Pipeline::open_for)):
//!   open for an explicit duration, then half-open as after any cooldown;
//! - **disabled** ([`Pipeline::disable`](crate::Pipeline::disable)): every
//!   call is admitted and nothing is recorded, until
//!   [`Pipeline::enable`](crate::Pipeline::enable) closes it again.
//!
//! A call that never ends (its future dropped, its operation panicking)
//! records no outcome: a closed circuit's window does not count it, and a
//! half-open probe gives its slot back, so the next call is the probe.
//!
//! A round of probes that takes longer than
//! [`max_half_open`](CircuitBreaker::max_half_open) no longer blocks the
//! next one: the first call that finds every probe slot taken after that
//! starts a new round (a [`CircuitTransition::ProbesExpired`]), and the
//! outcomes of the unfinished probes are ignored when they come. A breaker
//! in [shadow mode](crate::shadow) ([`shadow`](CircuitBreaker::shadow))
//! evolves as an enforcing one would but never refuses a call.

use std::time::Duration;

use crate::error::ConfigError;

pub(crate) mod machine;
pub(crate) mod rules;

/// How the breaker judges the dependency.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum BreakerMode {
    /// Trips after this many failures in a row.
    ConsecutiveFailures(u32),
    /// Judges the last `N` calls.
    CountWindow(u32),
    /// Judges the calls of the last `N` seconds (one bucket per second).
    TimeWindow(u32),
}

/// Configuration of a circuit breaker.
///
/// # Default
/// Built by [`CircuitBreaker::failure_rate`]: count window of 100 calls,
/// `minimum_calls` 20, no slow-call threshold (slow-call duration 60 s),
/// cooldown 30 s without growth, 1 half-open probe, no limit on the time
/// in half-open, enforcing (not in shadow mode).
///
/// Built by [`CircuitBreaker::consecutive_failures`]: the same, but with
/// the window settings left out: `failure_rate` 1.0, `minimum_calls` 0, no
/// slow-call threshold (slow-call duration 60 s). Those settings judge a
/// window, so a consecutive-failures breaker with any other value fails
/// `build()` (`circuit_breaker.minimum_calls applies only to a count or
/// time window, not consecutive_failures`) rather than ignoring it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct CircuitBreaker {
    /// How failures are counted.
    pub mode: BreakerMode,
    /// Failure rate at or above which the circuit opens, in (0, 1].
    pub failure_rate: f64,
    /// Slow-call rate at or above which the circuit opens, in (0, 1].
    pub slow_call_rate: Option<f64>,
    /// A call lasting at least this long is slow.
    pub slow_call_duration: Duration,
    /// Calls needed in the window before any judgement (window modes; 0 in
    /// consecutive-failures mode); a count window takes at most its size
    /// (see [`minimum_calls`](CircuitBreaker::minimum_calls())).
    pub minimum_calls: u32,
    /// How long the circuit stays open before admitting probes.
    pub cooldown: Duration,
    /// Factor applied to the cooldown on each trip without a close in between (>= 1).
    pub cooldown_growth: f64,
    /// Upper bound of a growing cooldown.
    pub max_cooldown: Duration,
    /// Probe calls admitted while half-open, 1 to
    /// [`MAX_HALF_OPEN_CALLS`](Self::MAX_HALF_OPEN_CALLS); all must succeed
    /// to close.
    pub half_open_calls: u32,
    /// The longest a round of probes may stay unfinished before a new round
    /// starts (`None`: no limit). See
    /// [`max_half_open`](CircuitBreaker::max_half_open()).
    pub max_half_open: Option<Duration>,
    /// Shadow mode: the circuit is judged and reported but never refuses a
    /// call (see [`crate::shadow`]).
    pub shadow: bool,
}

impl CircuitBreaker {
    /// The most probes a half-open circuit admits (2^21 - 1: the probe
    /// counters of the circuit's state have 21 bits). A larger
    /// [`half_open_calls`](Self::half_open_calls) fails `build()`.
    pub const MAX_HALF_OPEN_CALLS: u32 = rules::MAX_HALF_OPEN_CALLS;

    /// `minimum_calls` of [`failure_rate`](Self::failure_rate).
    const MINIMUM_CALLS: u32 = 20;

    /// Opens after `failures` failures in a row.
    ///
    /// The settings of the window modes (`failure_rate`, `minimum_calls`,
    /// `slow_calls`) do not apply: set on such a breaker, they fail
    /// `build()`.
    pub fn consecutive_failures(failures: u32) -> Self {
        CircuitBreaker {
            mode: BreakerMode::ConsecutiveFailures(failures),
            minimum_calls: 0,
            ..Self::failure_rate(1.0)
        }
    }

    /// Opens when the failure rate in the window reaches `threshold`
    /// (count window of 100 calls unless [`window`](Self::window) or
    /// [`count_window`](Self::count_window) say otherwise).
    ///
    /// The rates are judged when a failed or slow call is recorded, never
    /// on a success that is neither: a success cannot raise a rate, but it
    /// can bring the window up to [`minimum_calls`](Self::minimum_calls),
    /// and a window whose minimum is reached by such a success opens at its
    /// next failed or slow call, not at once (a departure from breakers
    /// that judge every call: with a window of 5, three failures then two
    /// successes leave the circuit closed at 60 %; the next failure opens
    /// it). So an ordinary success never pays for a judgement.
    pub fn failure_rate(threshold: f64) -> Self {
        CircuitBreaker {
            mode: BreakerMode::CountWindow(100),
            failure_rate: threshold,
            slow_call_rate: None,
            slow_call_duration: Duration::from_secs(60),
            minimum_calls: Self::MINIMUM_CALLS,
            cooldown: Duration::from_secs(30),
            cooldown_growth: 1.0,
            max_cooldown: Duration::from_secs(30),
            half_open_calls: 1,
            max_half_open: None,
            shadow: false,
        }
    }

    /// Judges the last `calls` calls.
    pub fn count_window(mut self, calls: u32) -> Self {
        self.set_window_mode(BreakerMode::CountWindow(calls));
        self
    }

    /// Judges the calls of the last `window` (rounded up to whole seconds).
    pub fn window(mut self, window: Duration) -> Self {
        let secs = window
            .as_secs()
            .saturating_add(u64::from(window.subsec_nanos() > 0));
        self.set_window_mode(BreakerMode::TimeWindow(
            u32::try_from(secs).unwrap_or(u32::MAX),
        ));
        self
    }

    /// Switches to the window mode `mode`; from consecutive-failures mode,
    /// `minimum_calls` (which that mode leaves at 0) takes its default.
    fn set_window_mode(&mut self, mode: BreakerMode) {
        if matches!(self.mode, BreakerMode::ConsecutiveFailures(_)) && self.minimum_calls == 0 {
            self.minimum_calls = Self::MINIMUM_CALLS;
        }
        self.mode = mode;
    }

    /// Also opens when the share of calls lasting at least `duration`
    /// reaches `threshold` (window modes only).
    pub fn slow_calls(mut self, threshold: f64, duration: Duration) -> Self {
        self.slow_call_rate = Some(threshold);
        self.slow_call_duration = duration;
        self
    }

    /// Calls needed in the window before the rates are judged.
    ///
    /// A count window never holds more calls than its size, so a larger
    /// minimum is taken as the size: the window is judged once it is full.
    ///
    /// ```
    /// use seawall::testing::VirtualClock;
    /// use seawall::{CircuitBreaker, CircuitState, Pipeline};
    ///
    /// let p = Pipeline::builder("minimum-above-the-window")
    ///     .circuit_breaker(CircuitBreaker::failure_rate(0.5).count_window(5).minimum_calls(10))
    ///     .clock(VirtualClock::new())
    ///     .build()?;
    /// for _ in 0..5 {
    ///     let _ = p.call(|_| Err::<(), _>("down"));
    /// }
    /// assert_eq!(p.circuit_state()?, CircuitState::Open); // 5 calls: the window is full
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// 0 in a window mode fails `build()`: `circuit_breaker.minimum_calls
    /// must be >= 1, got 0`.
    pub fn minimum_calls(mut self, calls: u32) -> Self {
        self.minimum_calls = calls;
        self
    }

    /// How long the circuit stays open before admitting probes.
    ///
    /// # Errors
    /// A zero cooldown fails `build()`:
    /// `circuit_breaker.cooldown must be > 0`. A circuit that half-opens at
    /// the instant it opens would let the next call through at once, which
    /// is no breaker. To probe as soon as possible, give the smallest
    /// cooldown that means something to the dependency (a millisecond is
    /// the finest: a cooldown's end is kept in whole milliseconds, rounded
    /// up).
    pub fn cooldown(mut self, cooldown: Duration) -> Self {
        self.cooldown = cooldown;
        if self.cooldown_growth <= 1.0 {
            self.max_cooldown = cooldown;
        }
        self
    }

    /// Multiplies the cooldown by `factor` on each trip that follows a failed
    /// probe, up to `max`. A close resets it.
    pub fn cooldown_growth(mut self, factor: f64, max: Duration) -> Self {
        self.cooldown_growth = factor;
        self.max_cooldown = max;
        self
    }

    /// Probe calls admitted while half-open.
    ///
    /// Every probe must succeed: the last of `calls` successes closes the
    /// circuit, and one failed or slow probe opens it again at once (one
    /// more trip), without waiting for the others. The window's thresholds
    /// do not apply to the probes (a departure from breakers that judge the
    /// round of probes by the failure rate: 3 successes and 1 failure out
    /// of 4 probes close those at a 50 % threshold, and open this one). An
    /// ignored error gives its probe slot back and counts for nothing.
    ///
    /// A call refused while every probe slot is taken carries the length
    /// of the cooldown that just ended as its `retry_after` (after
    /// [`Pipeline::open_for`](crate::Pipeline::open_for), the duration it
    /// was opened for): a hint, not a promise. The probes' verdict is
    /// usually in by then, and if a probe fails the circuit opens again
    /// for a cooldown.
    ///
    /// # Errors
    /// 0, or more than [`MAX_HALF_OPEN_CALLS`](Self::MAX_HALF_OPEN_CALLS),
    /// fails `build()`: `circuit_breaker.half_open_calls must be <= 2097151,
    /// got 3000000`.
    pub fn half_open_calls(mut self, calls: u32) -> Self {
        self.half_open_calls = calls;
        self
    }

    /// The longest a round of probes blocks the next one (Resilience4j's
    /// `maxWaitDurationInHalfOpenState`, without the trip).
    ///
    /// A round starts when the circuit half-opens. Once it is `max` old, a
    /// call that finds every probe slot taken does not wait for the
    /// unfinished probes: it starts a new round and is its first probe (a
    /// [`CircuitTransition::ProbesExpired`], a new generation: the
    /// outcomes of the old round's probes are ignored when they come, and
    /// the time in state restarts). A probe that hangs therefore cannot
    /// keep the circuit half-open for ever. The end of a round is kept in
    /// whole milliseconds, rounded up, as the end of a cooldown is.
    ///
    /// The Redis store applies it to processes that died mid-probe too; it
    /// uses its own `probe_lease` for breakers without it.
    ///
    /// # Errors
    /// A zero `max` fails `build()`: `circuit_breaker.max_half_open must be > 0`.
    pub fn max_half_open(mut self, max: Duration) -> Self {
        self.max_half_open = Some(max);
        self
    }

    /// Shadow mode: the circuit opens, half-opens, closes and reports as an
    /// enforcing one would, but every call it would refuse is admitted,
    /// with a [`ShadowRejected`](crate::EventKind::ShadowRejected) event
    /// instead of the refusal. The outcome of such a call is not recorded
    /// (an enforcing circuit would not have let it run). See
    /// [`crate::shadow`].
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// The cooldown after `trips` consecutive trips (1 for the first).
    pub fn cooldown_for_trip(&self, trips: u32) -> Duration {
        if self.cooldown_growth <= 1.0 || trips <= 1 {
            return self.cooldown;
        }
        let factor = self
            .cooldown_growth
            .powi(i32::try_from(trips - 1).unwrap_or(i32::MAX));
        let secs = self.cooldown.as_secs_f64() * factor;
        if !secs.is_finite() || secs >= self.max_cooldown.as_secs_f64() {
            self.max_cooldown
        } else {
            Duration::from_secs_f64(secs)
        }
    }

    /// The settings that judge a window, which a consecutive-failures
    /// breaker refuses.
    pub(crate) const WINDOW_SETTINGS: [&'static str; 4] = [
        "failure_rate",
        "minimum_calls",
        "slow_call_rate",
        "slow_call_duration",
    ];

    /// The refusal of a window setting (`field`) given to a
    /// consecutive-failures breaker.
    pub(crate) fn window_only(field: &'static str) -> ConfigError {
        ConfigError::new(
            "circuit_breaker",
            field,
            "applies only to a count or time window, not consecutive_failures",
        )
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        const P: &str = "circuit_breaker";
        let rate_ok = |r: f64| r > 0.0 && r <= 1.0;
        match self.mode {
            BreakerMode::ConsecutiveFailures(0) => {
                return Err(ConfigError::new(
                    P,
                    "consecutive_failures",
                    "must be >= 1, got 0",
                ))
            }
            BreakerMode::CountWindow(0) => {
                return Err(ConfigError::new(
                    P,
                    "count_window",
                    "must be >= 1 call, got 0",
                ))
            }
            BreakerMode::TimeWindow(0) => {
                return Err(ConfigError::new(P, "window", "must be >= 1 s, got 0"))
            }
            BreakerMode::TimeWindow(s) if s > 3600 => {
                return Err(ConfigError::new(
                    P,
                    "window",
                    format!("must be <= 3600 s, got {s} s"),
                ))
            }
            BreakerMode::CountWindow(n) if n > 1_000_000 => {
                return Err(ConfigError::new(
                    P,
                    "count_window",
                    format!("must be <= 1000000 calls, got {n}"),
                ))
            }
            _ => {}
        }
        if matches!(self.mode, BreakerMode::ConsecutiveFailures(_)) {
            // The settings that judge a window: left as
            // `consecutive_failures` sets them, or refused.
            let consecutive = Self::consecutive_failures(1);
            let set = [
                self.failure_rate != consecutive.failure_rate,
                self.minimum_calls != consecutive.minimum_calls,
                self.slow_call_rate.is_some(),
                self.slow_call_duration != consecutive.slow_call_duration,
            ];
            if let Some((field, _)) = Self::WINDOW_SETTINGS
                .into_iter()
                .zip(set)
                .find(|(_, set)| *set)
            {
                return Err(Self::window_only(field));
            }
        }
        if !rate_ok(self.failure_rate) {
            return Err(ConfigError::new(
                P,
                "failure_rate",
                format!("must be in (0, 1], got {}", self.failure_rate),
            ));
        }
        if let Some(r) = self.slow_call_rate {
            if !rate_ok(r) {
                return Err(ConfigError::new(
                    P,
                    "slow_call_rate",
                    format!("must be in (0, 1], got {r}"),
                ));
            }
            if self.slow_call_duration.is_zero() {
                return Err(ConfigError::new(P, "slow_call_duration", "must be > 0"));
            }
        }
        if self.minimum_calls == 0 && !matches!(self.mode, BreakerMode::ConsecutiveFailures(_)) {
            return Err(ConfigError::new(P, "minimum_calls", "must be >= 1, got 0"));
        }
        if self.cooldown.is_zero() {
            return Err(ConfigError::new(P, "cooldown", "must be > 0"));
        }
        if !(self.cooldown_growth >= 1.0 && self.cooldown_growth.is_finite()) {
            return Err(ConfigError::new(
                P,
                "cooldown_growth",
                format!("must be a finite factor >= 1, got {}", self.cooldown_growth),
            ));
        }
        if self.max_cooldown < self.cooldown {
            return Err(ConfigError::new(
                P,
                "max_cooldown",
                format!(
                    "must be >= cooldown ({:?}), got {:?}",
                    self.cooldown, self.max_cooldown
                ),
            ));
        }
        if self.half_open_calls == 0 {
            return Err(ConfigError::new(
                P,
                "half_open_calls",
                "must be >= 1, got 0",
            ));
        }
        if self.half_open_calls > Self::MAX_HALF_OPEN_CALLS {
            return Err(ConfigError::new(
                P,
                "half_open_calls",
                format!(
                    "must be <= {}, got {}",
                    Self::MAX_HALF_OPEN_CALLS,
                    self.half_open_calls
                ),
            ));
        }
        if self.max_half_open.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::new(P, "max_half_open", "must be > 0"));
        }
        Ok(())
    }
}

/// The state of a circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CircuitState {
    /// Calls flow; outcomes are recorded.
    Closed,
    /// Calls are rejected until the cooldown ends. The first call after
    /// that half-opens the circuit: until it comes, the circuit still
    /// reads `Open` ([`Pipeline::circuit_state`](crate::Pipeline::circuit_state),
    /// [`CircuitMetrics`], its `time_in_state` counted from the trip).
    Open,
    /// A limited number of probe calls are admitted.
    HalfOpen,
    /// Forced open by [`Pipeline::isolate`](crate::Pipeline::isolate): every call is rejected.
    Isolated,
    /// Disabled by [`Pipeline::disable`](crate::Pipeline::disable) (or
    /// [`force_close`](crate::Pipeline::force_close)): every call is
    /// admitted, nothing is recorded, until
    /// [`enable`](crate::Pipeline::enable) or [`reset`](crate::Pipeline::reset).
    Disabled,
}

impl CircuitState {
    /// A short, stable, snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half_open",
            CircuitState::Isolated => "isolated",
            CircuitState::Disabled => "disabled",
        }
    }
}

/// A transition of a circuit, reported by the store so that the pipeline can
/// emit events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CircuitTransition {
    /// Closed or half-open to open.
    Opened {
        /// How long it stays open.
        cooldown: Duration,
    },
    /// Open to half-open.
    HalfOpened,
    /// Half-open to half-open: a round of probes older than
    /// [`CircuitBreaker::max_half_open`], some of them unfinished, gave way
    /// to a new round.
    ProbesExpired,
    /// Half-open (or forced) to closed.
    Closed,
}

/// Manual control of a circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CircuitControl {
    /// Force open: reject every call until reset.
    Isolate,
    /// Disable: admit every call and record nothing until enabled or reset
    /// ([`CircuitState::Disabled`]). Disabling a disabled circuit changes
    /// nothing.
    ForceClose,
    /// Back to closed with an empty window and no trip history.
    Reset,
    /// Open for this long (measured from now, the end kept in whole
    /// milliseconds rounded up), then half-open as after a cooldown. The
    /// trips so far are kept: a failed probe afterwards trips with the
    /// cooldown that follows them. From any state, an open one included
    /// (its end is replaced).
    OpenFor(Duration),
    /// A disabled circuit closes, with an empty window and no trip history;
    /// any other state is left as it is.
    Enable,
}

/// A snapshot of a circuit's state and counts.
///
/// What the counts cover depends on the state, as in Resilience4j:
/// - closed: the window (consecutive mode: the failures in a row);
/// - open: the window that opened the circuit (window modes; nothing in
///   consecutive mode, and nothing after a failed probe: the probes' counts
///   end with the trip);
/// - half-open: the probes' own counts, started when the circuit
///   half-opened (a failed or slow probe opens the circuit again at once,
///   so the probes counted are those that succeeded);
/// - closing starts a fresh window.
///
/// Isolated and disabled circuits keep showing the window they had
/// (consecutive mode: the failures in a row of the closed circuit).
///
/// A time window ages in every state: a call leaves it once it is older
/// than the window, so the window of an open, isolated or disabled circuit
/// empties as time passes (a count window keeps its calls until new ones
/// push them out).
///
/// ```
/// use std::time::Duration;
/// use seawall::testing::VirtualClock;
/// use seawall::{CircuitBreaker, CircuitState, Pipeline};
///
/// let clock = VirtualClock::new();
/// let p = Pipeline::builder("aging-window")
///     .circuit_breaker(
///         CircuitBreaker::failure_rate(0.5)
///             .minimum_calls(2)
///             .window(Duration::from_secs(10))
///             .cooldown(Duration::from_secs(60)),
///     )
///     .clock(clock.clone())
///     .build()?;
/// for _ in 0..2 {
///     let _ = p.call(|_| Err::<(), _>("down"));
/// }
/// let m = p.circuit_metrics()?;
/// assert_eq!((m.state, m.calls, m.failures), (CircuitState::Open, 2, 2));
/// clock.advance(Duration::from_secs(10));
/// let m = p.circuit_metrics()?;
/// assert_eq!((m.state, m.calls), (CircuitState::Open, 0)); // aged out, still open
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct CircuitMetrics {
    /// The state.
    pub state: CircuitState,
    /// Calls counted (see the type's documentation for which; consecutive
    /// mode: failures in a row).
    pub calls: u64,
    /// Failed calls counted (consecutive mode: failures in a row).
    pub failures: u64,
    /// Slow calls counted.
    pub slow_calls: u64,
    /// `failures / calls`, 0 when empty.
    pub failure_rate: f64,
    /// `slow_calls / calls`, 0 when empty.
    pub slow_call_rate: f64,
    /// Time since the last transition; for a circuit that never moved,
    /// since it began: its first admission, record or control (zero
    /// before it), not the clock's origin.
    pub time_in_state: Duration,
    /// Trips since the circuit last closed (drives cooldown growth).
    pub trips: u32,
}

impl CircuitMetrics {
    /// Metrics of a circuit in `state` whose current counts are `calls`,
    /// `failures` and `slow_calls` (at most `calls` each), in that state
    /// for `time_in_state` after `trips` trips; the rates follow from the
    /// counts (0 with no call).
    pub fn from_counts(
        state: CircuitState,
        calls: u64,
        failures: u64,
        slow_calls: u64,
        time_in_state: Duration,
        trips: u32,
    ) -> Self {
        let (failures, slow_calls) = (failures.min(calls), slow_calls.min(calls));
        let rate = |n: u64| {
            if calls == 0 {
                0.0
            } else {
                n as f64 / calls as f64
            }
        };
        CircuitMetrics {
            state,
            calls,
            failures,
            slow_calls,
            failure_rate: rate(failures),
            slow_call_rate: rate(slow_calls),
            time_in_state,
            trips,
        }
    }

    /// Metrics of a closed, empty circuit.
    pub fn closed_empty() -> Self {
        CircuitMetrics {
            state: CircuitState::Closed,
            calls: 0,
            failures: 0,
            slow_calls: 0,
            failure_rate: 0.0,
            slow_call_rate: 0.0,
            time_in_state: Duration::ZERO,
            trips: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_field_and_rule() {
        let e = CircuitBreaker::failure_rate(1.5).validate().unwrap_err();
        assert_eq!(
            e.to_string(),
            "circuit_breaker.failure_rate must be in (0, 1], got 1.5"
        );
        let e = CircuitBreaker::failure_rate(0.5)
            .half_open_calls(0)
            .validate()
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "circuit_breaker.half_open_calls must be >= 1, got 0"
        );
        let e = CircuitBreaker::failure_rate(0.5)
            .window(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert_eq!(e.field, "window");
        let e = CircuitBreaker::consecutive_failures(0)
            .validate()
            .unwrap_err();
        assert_eq!(e.field, "consecutive_failures");
        let e = CircuitBreaker::consecutive_failures(3)
            .slow_calls(0.5, Duration::from_secs(1))
            .validate()
            .unwrap_err();
        assert_eq!(e.field, "slow_call_rate");
        assert!(CircuitBreaker::failure_rate(0.0).validate().is_err());
        assert!(CircuitBreaker::failure_rate(f64::NAN).validate().is_err());
        assert!(CircuitBreaker::failure_rate(0.5)
            .minimum_calls(0)
            .validate()
            .is_err());
        assert!(CircuitBreaker::failure_rate(0.5).validate().is_ok());
    }

    #[test]
    fn window_settings_on_consecutive_failures_are_refused() {
        let rule = "applies only to a count or time window, not consecutive_failures";
        let refused = |b: CircuitBreaker| {
            let e = b.validate().unwrap_err();
            assert_eq!(e.rule, rule, "{b:?}");
            e.field
        };
        let consecutive = CircuitBreaker::consecutive_failures(3);
        assert_eq!(
            refused(consecutive.clone().minimum_calls(50)),
            "minimum_calls"
        );
        let mut b = consecutive.clone();
        b.failure_rate = 0.3;
        assert_eq!(refused(b), "failure_rate");
        assert_eq!(
            refused(consecutive.clone().slow_calls(0.5, Duration::from_secs(1))),
            "slow_call_rate"
        );
        let mut b = consecutive.clone();
        b.slow_call_duration = Duration::from_secs(1);
        assert_eq!(refused(b), "slow_call_duration");
        assert!(consecutive.validate().is_ok());
        // Turned into a window mode, it takes the window defaults.
        let window = consecutive.count_window(10);
        assert_eq!(window.minimum_calls, 20);
        assert!(window.validate().is_ok());
        assert!(CircuitBreaker::failure_rate(0.3)
            .minimum_calls(50)
            .window(Duration::from_secs(10))
            .validate()
            .is_ok());
    }

    #[test]
    fn half_open_calls_fit_the_probe_counters() {
        let b = |n| CircuitBreaker::consecutive_failures(1).half_open_calls(n);
        assert!(b(CircuitBreaker::MAX_HALF_OPEN_CALLS).validate().is_ok());
        assert_eq!(CircuitBreaker::MAX_HALF_OPEN_CALLS, 2_097_151);
        let e = b(3_000_000).validate().unwrap_err();
        assert_eq!(
            e.to_string(),
            "circuit_breaker.half_open_calls must be <= 2097151, got 3000000"
        );
        assert!(b(CircuitBreaker::MAX_HALF_OPEN_CALLS + 1)
            .validate()
            .is_err());
    }

    #[test]
    fn cooldown_grows_up_to_its_cap() {
        let b = CircuitBreaker::consecutive_failures(1)
            .cooldown(Duration::from_secs(10))
            .cooldown_growth(2.0, Duration::from_secs(35));
        assert_eq!(b.cooldown_for_trip(1), Duration::from_secs(10));
        assert_eq!(b.cooldown_for_trip(2), Duration::from_secs(20));
        assert_eq!(b.cooldown_for_trip(3), Duration::from_secs(35));
        assert_eq!(b.cooldown_for_trip(1000), Duration::from_secs(35));
    }
}
