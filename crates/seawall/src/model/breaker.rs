//! The circuit breaker's reference model, and a driver that checks a store
//! against it.
//!
//! [`Model`] states the breaker's rules plainly (a queue of outcomes for a
//! count window, a list of calls for a time window, no packing, no
//! atomics), for every mode: consecutive failures, count window, time
//! window, failure rate, slow-call rate, minimum calls, growing cooldown,
//! half-open probe count, the longest round of probes (`max_half_open`)
//! and manual control (isolate, disable and enable, reset, open for a
//! while). [`check`] applies a sequence
//! of [`Op`]s to a bound [`ResourceState`] and to the model and reports the
//! first disagreement on a decision, a transition or the metrics.
//!
//! ```
//! use std::time::Duration;
//! use seawall::model::breaker::{check, Op};
//! use seawall::store::{Outcome, ResourceSpec};
//! use seawall::{CircuitBreaker, MemoryStore, StateStore};
//!
//! let breaker = CircuitBreaker::consecutive_failures(1).cooldown(Duration::from_secs(30));
//! let state = MemoryStore::new()
//!     .bind(&ResourceSpec::new("r").with_circuit(breaker.clone()))
//!     .unwrap();
//! let ops = [
//!     Op::Admit,
//!     Op::record(0, Outcome::Failure),
//!     Op::Admit,
//!     Op::Advance(Duration::from_secs(30)),
//!     Op::Admit,
//! ];
//! check(&*state, None, breaker, Duration::from_secs(1_000_000), &ops).unwrap();
//! ```

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::Duration;

use crate::breaker::{
    BreakerMode, CircuitBreaker, CircuitControl, CircuitMetrics, CircuitState, CircuitTransition,
};
use crate::context::PartitionKey;
use crate::error::RejectionReason;
use crate::store::{AdmitRequest, Outcome, Permit, Record, ResourceState};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;

/// Generations are compared modulo 2^13 (a store may keep more bits).
pub const GENERATION_MASK: u64 = (1 << 13) - 1;
/// Trips saturate here.
pub const MAX_TRIPS: u32 = 63;
/// The first end of a cooldown, in milliseconds, that is kept as "open
/// until the maximum instant" (`u64::MAX` nanoseconds): a store may keep the
/// end in 42 bits of milliseconds, and saturation must never shorten a
/// cooldown.
pub const OPEN_FOREVER_MS: u64 = (1 << 42) - 1;

/// An admission: `Ok((generation, probe))` or the rejection's
/// `retry_after`.
pub type Decision = Result<(u64, bool), Option<Duration>>;

/// The reference model of one circuit.
#[derive(Debug, Clone)]
pub struct Model {
    spec: CircuitBreaker,
    state: CircuitState,
    trips: u32,
    generation: u64,
    open_until_ns: u64,
    probes_admitted: u32,
    probes_succeeded: u32,
    in_a_row: u64,
    /// Count window: the last N outcomes `(failure, slow)`.
    last_calls: VecDeque<(bool, bool)>,
    /// Time window: `(second, failure, slow)` of every recorded call.
    timed_calls: Vec<(u64, bool, bool)>,
    /// The time of the last transition, or of the first use (`None`
    /// before it).
    since: Option<u64>,
    /// Open by an explicit `open_for(d)`, or half-open after it: `d`.
    opened_for: Option<Duration>,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Model {
    /// A closed circuit that never moved, not begun: its first admission,
    /// record or control begins it, and its time in state counts from
    /// then (zero before).
    pub fn new(spec: CircuitBreaker) -> Self {
        Model {
            spec,
            state: CircuitState::Closed,
            trips: 0,
            generation: 0,
            open_until_ns: 0,
            probes_admitted: 0,
            probes_succeeded: 0,
            in_a_row: 0,
            last_calls: VecDeque::new(),
            timed_calls: Vec::new(),
            since: None,
            opened_for: None,
        }
    }

    /// The first use of the circuit, at `now`, begins it.
    fn begin(&mut self, now: u64) {
        self.since.get_or_insert(now);
    }

    /// The configuration.
    pub fn spec(&self) -> &CircuitBreaker {
        &self.spec
    }

    /// The state.
    pub fn state(&self) -> CircuitState {
        self.state
    }

    fn half_open_calls(&self) -> u32 {
        self.spec.half_open_calls.clamp(1, (1 << 21) - 1)
    }

    fn is_slow(&self, duration: Duration) -> bool {
        self.spec.slow_call_rate.is_some() && duration >= self.spec.slow_call_duration
    }

    /// A transition to `state` (not after an explicit open).
    fn transition(&mut self, state: CircuitState, now: u64) {
        self.state = state;
        self.generation = (self.generation + 1) & GENERATION_MASK;
        self.since = Some(now);
        self.opened_for = None;
    }

    /// A new round of probes (after the same open period), its first
    /// probe admitted.
    fn first_probe(&mut self, now: u64) {
        let opened_for = self.opened_for;
        self.clear();
        self.transition(CircuitState::HalfOpen, now);
        self.opened_for = opened_for;
        self.probes_admitted = 1;
    }

    /// The end of a cooldown or a round of `d` starting at `now`: whole
    /// milliseconds rounded up; an end too late to keep is the maximum
    /// instant.
    fn end_of(now: u64, d: Duration) -> u64 {
        let end_ms = now.saturating_add(nanos(d)).div_ceil(MS);
        if end_ms >= OPEN_FOREVER_MS {
            u64::MAX
        } else {
            end_ms * MS
        }
    }

    fn clear(&mut self) {
        self.in_a_row = 0;
        self.last_calls.clear();
        self.timed_calls.clear();
        self.probes_admitted = 0;
        self.probes_succeeded = 0;
    }

    /// Admits a call at `now`, and the transition it caused.
    ///
    /// Closed and disabled admit; isolated refuses without a hint; open
    /// refuses until the end of the cooldown with the time left, then
    /// half-opens and admits the first probe; half-open admits up to
    /// `half_open_calls` probes, then refuses with the length of the
    /// cooldown that just ended as the hint (after an explicit open, the
    /// duration it was opened for), unless the breaker limits the
    /// time in half-open and the round of probes (started when the circuit
    /// half-opened, or by the last new round) is that old (its end in whole
    /// milliseconds, rounded up): then a new round starts, whose first
    /// probe the call is, and the probes of the old one no longer count.
    pub fn admit(&mut self, now: Duration) -> (Decision, Option<CircuitTransition>) {
        let now = nanos(now);
        self.begin(now);
        match self.state {
            CircuitState::Closed | CircuitState::Disabled => (Ok((self.generation, false)), None),
            CircuitState::Isolated => (Err(None), None),
            CircuitState::Open if now < self.open_until_ns => (
                Err(Some(Duration::from_nanos(self.open_until_ns - now))),
                None,
            ),
            CircuitState::Open => {
                // Entering half-open starts the probes' own counts.
                self.first_probe(now);
                (
                    Ok((self.generation, true)),
                    Some(CircuitTransition::HalfOpened),
                )
            }
            CircuitState::HalfOpen if self.probes_admitted < self.half_open_calls() => {
                self.probes_admitted += 1;
                (Ok((self.generation, true)), None)
            }
            CircuitState::HalfOpen
                if self
                    .spec
                    .max_half_open
                    .is_some_and(|max| now >= Self::end_of(self.since.unwrap_or(now), max)) =>
            {
                self.first_probe(now);
                (
                    Ok((self.generation, true)),
                    Some(CircuitTransition::ProbesExpired),
                )
            }
            CircuitState::HalfOpen => (
                Err(Some(
                    self.opened_for
                        .unwrap_or_else(|| self.spec.cooldown_for_trip(self.trips)),
                )),
                None,
            ),
        }
    }

    /// Gives back a permit without an outcome: a probe of the current
    /// half-open generation frees its slot.
    pub fn release(&mut self, generation: u64, probe: bool) {
        if probe
            && generation & GENERATION_MASK == self.generation
            && self.state == CircuitState::HalfOpen
            && self.probes_admitted > 0
        {
            self.probes_admitted -= 1;
        }
    }

    fn trip(&mut self, trips: u32, now: u64) -> Option<CircuitTransition> {
        self.trips = trips.min(MAX_TRIPS);
        let cooldown = self.spec.cooldown_for_trip(self.trips);
        self.open_until_ns = Self::end_of(now, cooldown);
        self.transition(CircuitState::Open, now);
        Some(CircuitTransition::Opened { cooldown })
    }

    fn window(&self, now: u64) -> (u64, u64, u64) {
        let count = |calls: &mut dyn Iterator<Item = (bool, bool)>| {
            calls.fold((0, 0, 0), |(c, f, s), (fail, slow)| {
                (c + 1, f + u64::from(fail), s + u64::from(slow))
            })
        };
        if self.state == CircuitState::HalfOpen {
            return (u64::from(self.probes_succeeded), 0, 0);
        }
        match self.spec.mode {
            BreakerMode::CountWindow(_) => count(&mut self.last_calls.iter().copied()),
            BreakerMode::TimeWindow(w) => {
                let second = now / SEC;
                count(
                    &mut self
                        .timed_calls
                        .iter()
                        .filter(|(s, _, _)| second.wrapping_sub(*s) < u64::from(w))
                        .map(|&(_, f, s)| (f, s)),
                )
            }
            // Isolating or disabling keeps the failures in a row on show.
            _ if matches!(
                self.state,
                CircuitState::Closed | CircuitState::Isolated | CircuitState::Disabled
            ) =>
            {
                (self.in_a_row, self.in_a_row, 0)
            }
            _ => (0, 0, 0),
        }
    }

    /// Records the outcome of a call admitted in `generation` (as a probe
    /// when `probe`) that lasted `duration`; the transition it caused.
    pub fn record(
        &mut self,
        generation: u64,
        probe: bool,
        outcome: Outcome,
        duration: Duration,
        now: Duration,
    ) -> Option<CircuitTransition> {
        let now = nanos(now);
        self.begin(now);
        if generation & GENERATION_MASK != self.generation {
            return None;
        }
        let failure = match outcome {
            Outcome::Ignored => {
                self.release(generation, probe);
                return None;
            }
            Outcome::Failure => true,
            _ => false,
        };
        let slow = self.is_slow(duration);
        match self.state {
            CircuitState::Closed => match self.spec.mode {
                BreakerMode::ConsecutiveFailures(n) => {
                    if !failure {
                        self.in_a_row = 0;
                        return None;
                    }
                    self.in_a_row += 1;
                    if self.in_a_row >= u64::from(n) {
                        return self.trip(1, now);
                    }
                    None
                }
                mode => {
                    let minimum = match mode {
                        BreakerMode::CountWindow(n) => {
                            self.last_calls.push_back((failure, slow));
                            if self.last_calls.len() > n as usize {
                                self.last_calls.pop_front();
                            }
                            self.spec.minimum_calls.min(n)
                        }
                        _ => {
                            self.timed_calls.push((now / SEC, failure, slow));
                            self.spec.minimum_calls
                        }
                    };
                    // The rates are judged when a failed or slow call comes.
                    if !(failure || slow) {
                        return None;
                    }
                    let (calls, failures, slow_calls) = self.window(now);
                    let trips = calls > 0
                        && calls >= u64::from(minimum)
                        && (failures as f64 / calls as f64 >= self.spec.failure_rate
                            || self
                                .spec
                                .slow_call_rate
                                .is_some_and(|r| slow_calls as f64 / calls as f64 >= r));
                    if trips {
                        self.trip(1, now)
                    } else {
                        None
                    }
                }
            },
            CircuitState::HalfOpen => {
                if failure || slow {
                    // The probes' counts end with the trip.
                    let trips = self.trips + 1;
                    self.clear();
                    return self.trip(trips, now);
                }
                self.probes_succeeded += 1;
                if self.probes_succeeded >= self.half_open_calls() {
                    self.trips = 0;
                    self.clear();
                    self.transition(CircuitState::Closed, now);
                    return Some(CircuitTransition::Closed);
                }
                None
            }
            _ => None,
        }
    }

    /// Manual control at `now`; the transition when the state changed.
    ///
    /// Isolating an isolated circuit, disabling (`ForceClose`) a disabled
    /// one and enabling one that is not disabled change nothing; isolating
    /// and disabling keep the counts on show (consecutive mode: the
    /// failures in a row of a closed circuit). Opening for `d` opens until
    /// `now + d` from any state, keeping the trips; enabling a disabled
    /// circuit and resetting close it afresh.
    pub fn control(&mut self, control: CircuitControl, now: Duration) -> Option<CircuitTransition> {
        let now = nanos(now);
        self.begin(now);
        let keeps_in_a_row = matches!(
            self.state,
            CircuitState::Closed | CircuitState::Isolated | CircuitState::Disabled
        );
        match control {
            CircuitControl::OpenFor(d) => {
                self.open_until_ns = Self::end_of(now, d);
                self.transition(CircuitState::Open, now);
                // Kept as a store keeps it, in nanoseconds of the clock: a
                // longer duration is the longest one (`u64::MAX` ns).
                self.opened_for = Some(Duration::from_nanos(nanos(d)));
                Some(CircuitTransition::Opened { cooldown: d })
            }
            CircuitControl::Enable if self.state != CircuitState::Disabled => None,
            CircuitControl::Isolate if self.state == CircuitState::Isolated => None,
            CircuitControl::Isolate => {
                if !keeps_in_a_row {
                    self.in_a_row = 0;
                }
                self.transition(CircuitState::Isolated, now);
                Some(CircuitTransition::Opened {
                    cooldown: Duration::MAX,
                })
            }
            CircuitControl::ForceClose if self.state == CircuitState::Disabled => None,
            CircuitControl::ForceClose => {
                if !keeps_in_a_row {
                    self.in_a_row = 0;
                }
                self.transition(CircuitState::Disabled, now);
                Some(CircuitTransition::Closed)
            }
            _ => {
                let was = self.state;
                self.trips = 0;
                self.clear();
                self.transition(CircuitState::Closed, now);
                (was != CircuitState::Closed).then_some(CircuitTransition::Closed)
            }
        }
    }

    /// The metrics at `now`: the window's counts (half-open: the probes'
    /// own counts), the time since the last transition (or since the first
    /// use; zero before it), the trips.
    pub fn metrics(&self, now: Duration) -> CircuitMetrics {
        let now = nanos(now);
        let (calls, failures, slow_calls) = self.window(now);
        CircuitMetrics::from_counts(
            self.state,
            calls,
            failures,
            slow_calls,
            Duration::from_nanos(now.saturating_sub(self.since.unwrap_or(now))),
            self.trips,
        )
    }
}

/// One step of a [`check`].
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Op {
    /// Admit a call; a permit is kept.
    Admit,
    /// Record the kept permit `pick % permits`.
    Record {
        /// Which permit.
        pick: usize,
        /// The outcome.
        outcome: Outcome,
        /// The duration: 0 instant, 1 just under the slow-call duration, 2
        /// exactly it, 3 twice it.
        speed: u8,
        /// Also pass a retry-after hint of 1 ms (a resource without a
        /// cooldown ignores it; a store may take another path for it).
        hint: bool,
    },
    /// Release the kept permit `pick % permits` without an outcome.
    Release {
        /// Which permit.
        pick: usize,
    },
    /// Let time pass.
    Advance(Duration),
    /// Manual control.
    Control(CircuitControl),
}

impl Op {
    /// An instant record without a hint.
    pub fn record(pick: usize, outcome: Outcome) -> Op {
        Op::Record {
            pick,
            outcome,
            speed: 0,
            hint: false,
        }
    }
}

/// Applies `ops` to `state` (bound with `breaker` and nothing else, at
/// `partition`) and to a fresh [`Model`], the clock starting at `start`,
/// and compares every decision (admitted, probe, generation modulo 2^13,
/// rejected with which `retry_after`), every transition and, after every
/// step, the full metrics.
///
/// # Errors
/// The first disagreement, with the step and the log of the steps so far.
pub fn check(
    state: &dyn ResourceState,
    partition: Option<&PartitionKey>,
    breaker: CircuitBreaker,
    start: Duration,
    ops: &[Op],
) -> Result<(), String> {
    let mut model = Model::new(breaker);
    let mut now = start;
    let mut permits: Vec<Permit> = Vec::new();
    let slow = model.spec.slow_call_duration;
    let mut log = String::new();
    macro_rules! expect_eq {
        ($got:expr, $want:expr, $step:expr, $what:expr) => {{
            let (got, want) = ($got, $want);
            if got != want {
                return Err(format!(
                    "step {}: {}: store {:?}, model {:?}\n{}",
                    $step, $what, got, want, log
                ));
            }
        }};
    }

    for (step, &op) in ops.iter().enumerate() {
        let _ = writeln!(log, "  {step}: {op:?} at {now:?} ({:?})", model.state);
        match op {
            Op::Admit => {
                let real = state
                    .admit(&AdmitRequest {
                        partition,
                        now,
                        weight: 1,
                        budget: None,
                        shadowed: false,
                    })
                    .map_err(|e| format!("step {step}: admit failed: {e}"))?;
                let (expected, transition) = model.admit(now);
                let got = match real.decision {
                    Ok(p) => {
                        permits.push(p);
                        Ok((p.generation & GENERATION_MASK, p.probe))
                    }
                    Err(r) if r.reason == RejectionReason::CircuitOpen => Err(r.retry_after),
                    Err(r) => return Err(format!("step {step}: refused for {}", r.reason)),
                };
                expect_eq!(got, expected, step, "admission");
                expect_eq!(real.transition, transition, step, "admission transition");
            }
            Op::Record {
                pick,
                outcome,
                speed,
                hint,
            } => {
                if permits.is_empty() {
                    continue;
                }
                let permit = permits.swap_remove(pick % permits.len());
                let duration = match speed {
                    0 => Duration::ZERO,
                    1 => slow.saturating_sub(Duration::from_nanos(1)),
                    2 => slow,
                    _ => slow.saturating_mul(2),
                };
                let real = state
                    .record(&Record {
                        partition,
                        permit,
                        outcome,
                        duration,
                        retry_after: hint.then_some(Duration::from_millis(1)),
                        now,
                    })
                    .map_err(|e| format!("step {step}: record failed: {e}"))?;
                let expected =
                    model.record(permit.generation, permit.probe, outcome, duration, now);
                expect_eq!(real.transition, expected, step, "record transition");
            }
            Op::Release { pick } => {
                if permits.is_empty() {
                    continue;
                }
                let permit = permits.swap_remove(pick % permits.len());
                state.release(partition, permit);
                model.release(permit.generation, permit.probe);
            }
            Op::Advance(by) => now = now.saturating_add(by).min(Duration::from_nanos(u64::MAX)),
            Op::Control(control) => {
                let real = state
                    .control_circuit(partition, control, now)
                    .map_err(|e| format!("step {step}: control failed: {e}"))?;
                expect_eq!(real, model.control(control, now), step, "control");
            }
        }
        let real = state
            .circuit_metrics(partition, now)
            .map_err(|e| format!("step {step}: metrics failed: {e}"))?;
        expect_eq!(real, model.metrics(now), step, "metrics");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_stays_open_until_the_maximum_instant() {
        let mut m = Model::new(CircuitBreaker::consecutive_failures(1));
        let late = Duration::from_nanos(u64::MAX - 5 * SEC);
        let (Ok((g, _)), _) = m.admit(late) else {
            panic!("closed")
        };
        assert!(m
            .record(g, false, Outcome::Failure, Duration::ZERO, late)
            .is_some());
        let (d, t) = m.admit(late + Duration::from_secs(4));
        assert_eq!((d, t), (Err(Some(Duration::from_secs(1))), None));
    }
}

/// Proptest strategies for [`check`]: breakers of every mode and random
/// sequences of operations.
pub mod strategy {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::Op;
    use crate::breaker::{CircuitBreaker, CircuitControl};
    use crate::store::Outcome;

    /// Operations; with `whole_ms`, every advance is a whole number of
    /// milliseconds (for stores that keep time in microseconds).
    pub fn op(whole_ms: bool) -> impl Strategy<Value = Op> {
        let outcome = prop_oneof![
            3 => Just(Outcome::Success),
            3 => Just(Outcome::Failure),
            1 => Just(Outcome::Ignored),
        ];
        let fine = if whole_ms {
            (0u64..3).prop_map(Duration::from_millis).boxed()
        } else {
            (0u64..3_000_000).prop_map(Duration::from_nanos).boxed()
        };
        let advance = prop_oneof![
            (0u64..20).prop_map(Duration::from_millis),
            fine,
            (20u64..400).prop_map(Duration::from_millis),
            (1u64..5).prop_map(Duration::from_secs),
        ];
        let control = prop_oneof![
            Just(CircuitControl::Isolate),
            Just(CircuitControl::ForceClose),
            Just(CircuitControl::Reset),
            Just(CircuitControl::Enable),
            (0u64..400).prop_map(|ms| CircuitControl::OpenFor(Duration::from_millis(ms))),
            Just(CircuitControl::OpenFor(Duration::MAX)),
        ];
        prop_oneof![
            6 => Just(Op::Admit),
            6 => (any::<usize>(), outcome, 0u8..4, any::<bool>()).prop_map(
                |(pick, outcome, speed, hint)| Op::Record { pick, outcome, speed, hint }
            ),
            1 => any::<usize>().prop_map(|pick| Op::Release { pick }),
            3 => advance.prop_map(Op::Advance),
            1 => control.prop_map(Op::Control),
        ]
    }

    /// Up to `max` operations.
    pub fn ops(whole_ms: bool, max: usize) -> impl Strategy<Value = Vec<Op>> {
        prop::collection::vec(op(whole_ms), 1..max)
    }

    fn cooldowns() -> impl Strategy<Value = (Duration, Option<(f64, Duration)>)> {
        (
            prop_oneof![Just(10u64), Just(100), Just(1000), 1u64..500],
            prop_oneof![
                Just(None),
                (prop_oneof![Just(1.5f64), Just(2.0), Just(3.0)], 1u64..6)
                    .prop_map(|(f, m)| Some((f, m)))
            ],
        )
            .prop_map(|(ms, growth)| {
                let cooldown = Duration::from_millis(ms);
                (cooldown, growth.map(|(f, m)| (f, cooldown * m as u32)))
            })
    }

    fn finish(
        breaker: CircuitBreaker,
        (cooldown, growth): (Duration, Option<(f64, Duration)>),
        (half_open, max_half_open): (u32, Option<Duration>),
    ) -> CircuitBreaker {
        let mut b = breaker.cooldown(cooldown).half_open_calls(half_open);
        if let Some(max) = max_half_open {
            b = b.max_half_open(max);
        }
        match growth {
            Some((factor, max)) => b.cooldown_growth(factor, max),
            None => b,
        }
    }

    /// 1 to 3 probes; a third of the time a round of probes lasts at most
    /// 1 to 500 ms (whole milliseconds).
    fn half_open() -> impl Strategy<Value = (u32, Option<Duration>)> {
        (
            1u32..4,
            proptest::option::weighted(0.35, (1u64..500).prop_map(Duration::from_millis)),
        )
    }

    fn slow_rate() -> impl Strategy<Value = Option<f64>> {
        prop_oneof![
            Just(None),
            Just(Some(0.3)),
            Just(Some(0.5)),
            Just(Some(1.0))
        ]
    }

    fn rate() -> impl Strategy<Value = f64> {
        prop_oneof![Just(0.2), Just(0.5), Just(0.6), Just(1.0)]
    }

    /// Consecutive-failure breakers (1 to 4 failures), with or without a
    /// growing cooldown, 1 to 3 probes, sometimes a limit on a round of
    /// probes.
    pub fn consecutive() -> impl Strategy<Value = CircuitBreaker> {
        (1u32..5, cooldowns(), half_open())
            .prop_map(|(n, c, h)| finish(CircuitBreaker::consecutive_failures(n), c, h))
    }

    /// Count-window breakers: failure rate, optional slow-call rate,
    /// minimum calls (some above the window size).
    pub fn count_window() -> impl Strategy<Value = CircuitBreaker> {
        (
            1u32..7,
            1u32..9,
            rate(),
            slow_rate(),
            cooldowns(),
            half_open(),
        )
            .prop_map(|(n, min, rate, slow, c, h)| {
                let mut b = CircuitBreaker::failure_rate(rate)
                    .count_window(n)
                    .minimum_calls(min);
                if let Some(s) = slow {
                    b = b.slow_calls(s, Duration::from_millis(50));
                }
                finish(b, c, h)
            })
    }

    /// Time-window breakers of 1 to 3 seconds.
    pub fn time_window() -> impl Strategy<Value = CircuitBreaker> {
        (
            1u64..4,
            1u32..6,
            rate(),
            slow_rate(),
            cooldowns(),
            half_open(),
        )
            .prop_map(|(w, min, rate, slow, c, h)| {
                let mut b = CircuitBreaker::failure_rate(rate)
                    .window(Duration::from_secs(w))
                    .minimum_calls(min);
                if let Some(s) = slow {
                    b = b.slow_calls(s, Duration::from_millis(50));
                }
                finish(b, c, h)
            })
    }

    /// A breaker of any mode.
    pub fn any_breaker() -> impl Strategy<Value = CircuitBreaker> {
        prop_oneof![consecutive(), count_window(), time_window()]
    }
}
