//! The circuit breaker of `MemoryStore` against a plain reference model.
//!
//! A random sequence of operations (admit, record success / failure /
//! ignored with a duration, release, advance the clock, manual control) is
//! applied to the model and to the store; they must agree on every decision
//! (admitted, probe, generation, rejected with which `retry_after`), every
//! transition, and the full metrics after every step.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use seawall::breaker::{
    BreakerMode, CircuitControl, CircuitMetrics, CircuitState, CircuitTransition,
};
use seawall::store::{AdmitRequest, Outcome, Permit, Record, ResourceSpec, ResourceState};
use seawall::{CircuitBreaker, MemoryStore, PartitionKey, RejectionReason, StateStore};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
const GENERATION_MASK: u64 = (1 << 13) - 1;
const MAX_TRIPS: u32 = 63;

/// The reference model: the rules of the breaker, written plainly.
#[derive(Debug)]
struct Model {
    spec: CircuitBreaker,
    slow_ns: Option<u64>,
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
    since: u64,
}

type Decision = Result<(u64, bool), Option<Duration>>;

impl Model {
    fn new(spec: CircuitBreaker) -> Self {
        Model {
            slow_ns: spec
                .slow_call_rate
                .map(|_| spec.slow_call_duration.as_nanos() as u64),
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
            since: 0,
        }
    }

    fn transition(&mut self, state: CircuitState, now: u64) {
        self.state = state;
        self.generation = (self.generation + 1) & GENERATION_MASK;
        self.since = now;
    }

    fn clear(&mut self) {
        self.in_a_row = 0;
        self.last_calls.clear();
        self.timed_calls.clear();
    }

    fn admit(&mut self, now: u64) -> (Decision, Option<CircuitTransition>) {
        match self.state {
            CircuitState::Closed | CircuitState::Disabled => (Ok((self.generation, false)), None),
            CircuitState::Isolated => (Err(None), None),
            CircuitState::Open if now < self.open_until_ns => (
                Err(Some(Duration::from_nanos(self.open_until_ns - now))),
                None,
            ),
            CircuitState::Open => {
                self.transition(CircuitState::HalfOpen, now);
                self.probes_admitted = 1;
                self.probes_succeeded = 0;
                (
                    Ok((self.generation, true)),
                    Some(CircuitTransition::HalfOpened),
                )
            }
            CircuitState::HalfOpen if self.probes_admitted < self.spec.half_open_calls => {
                self.probes_admitted += 1;
                (Ok((self.generation, true)), None)
            }
            _ => (Err(None), None),
        }
    }

    fn release(&mut self, generation: u64, probe: bool) {
        if probe
            && generation == self.generation
            && self.state == CircuitState::HalfOpen
            && self.probes_admitted > 0
        {
            self.probes_admitted -= 1;
        }
    }

    fn trip(&mut self, trips: u32, now: u64) -> Option<CircuitTransition> {
        self.trips = trips.min(MAX_TRIPS);
        let cooldown = self.spec.cooldown_for_trip(self.trips);
        // The end of the cooldown, in whole milliseconds rounded up.
        let end = now + cooldown.as_nanos() as u64;
        self.open_until_ns = end.div_ceil(MS) * MS;
        self.transition(CircuitState::Open, now);
        Some(CircuitTransition::Opened { cooldown })
    }

    fn window(&self, now: u64) -> (u64, u64, u64) {
        let count = |calls: &mut dyn Iterator<Item = (bool, bool)>| {
            calls.fold((0, 0, 0), |(c, f, s), (fail, slow)| {
                (c + 1, f + u64::from(fail), s + u64::from(slow))
            })
        };
        match self.spec.mode {
            BreakerMode::CountWindow(_) => count(&mut self.last_calls.iter().copied()),
            BreakerMode::TimeWindow(w) => {
                let second = now / SEC;
                count(
                    &mut self
                        .timed_calls
                        .iter()
                        .filter(|(s, _, _)| second - s < u64::from(w))
                        .map(|&(_, f, s)| (f, s)),
                )
            }
            _ if self.state == CircuitState::Closed => (self.in_a_row, self.in_a_row, 0),
            _ => (0, 0, 0),
        }
    }

    fn record(
        &mut self,
        generation: u64,
        probe: bool,
        outcome: Outcome,
        duration: Duration,
        now: u64,
    ) -> Option<CircuitTransition> {
        if generation != self.generation {
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
        let slow = self
            .slow_ns
            .is_some_and(|s| duration.as_nanos() as u64 >= s);
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
                    if !(failure || slow) {
                        return None;
                    }
                    let (calls, failures, slow_calls) = self.window(now);
                    let trips = calls >= u64::from(minimum)
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
                    return self.trip(self.trips + 1, now);
                }
                self.probes_succeeded += 1;
                if self.probes_succeeded >= self.spec.half_open_calls {
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

    fn control(&mut self, control: CircuitControl, now: u64) -> Option<CircuitTransition> {
        match control {
            CircuitControl::Isolate if self.state == CircuitState::Isolated => None,
            CircuitControl::Isolate => {
                self.transition(CircuitState::Isolated, now);
                Some(CircuitTransition::Opened {
                    cooldown: Duration::MAX,
                })
            }
            CircuitControl::ForceClose if self.state == CircuitState::Disabled => None,
            CircuitControl::ForceClose => {
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

    fn metrics(&self, now: u64) -> CircuitMetrics {
        let (calls, failures, slow_calls) = self.window(now);
        let rate = |n: u64| {
            if calls == 0 {
                0.0
            } else {
                n as f64 / calls as f64
            }
        };
        let mut m = CircuitMetrics::closed_empty();
        m.state = self.state;
        m.calls = calls;
        m.failures = failures;
        m.slow_calls = slow_calls;
        m.failure_rate = rate(failures);
        m.slow_call_rate = rate(slow_calls);
        m.time_in_state = Duration::from_nanos(now - self.since);
        m.trips = self.trips;
        m
    }
}

#[derive(Debug, Clone)]
enum Op {
    Admit,
    /// Record the outstanding permit `pick % len`; `speed` picks the
    /// duration (0: instant, 1: just under slow, 2: exactly slow, 3: twice).
    Record {
        pick: usize,
        outcome: Outcome,
        speed: u8,
    },
    Release {
        pick: usize,
    },
    Advance(Duration),
    Control(CircuitControl),
}

fn op() -> impl Strategy<Value = Op> {
    let outcome = prop_oneof![
        3 => Just(Outcome::Success),
        3 => Just(Outcome::Failure),
        1 => Just(Outcome::Ignored),
    ];
    let advance = prop_oneof![
        (0u64..20).prop_map(Duration::from_millis),
        (0u64..3_000_000).prop_map(Duration::from_nanos),
        (20u64..400).prop_map(Duration::from_millis),
        (1u64..5).prop_map(Duration::from_secs),
    ];
    let control = prop_oneof![
        Just(CircuitControl::Isolate),
        Just(CircuitControl::ForceClose),
        Just(CircuitControl::Reset),
    ];
    prop_oneof![
        6 => Just(Op::Admit),
        6 => (any::<usize>(), outcome, 0u8..4).prop_map(|(pick, outcome, speed)| Op::Record {
            pick,
            outcome,
            speed
        }),
        1 => any::<usize>().prop_map(|pick| Op::Release { pick }),
        3 => advance.prop_map(Op::Advance),
        1 => control.prop_map(Op::Control),
    ]
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
    half_open: u32,
) -> CircuitBreaker {
    let b = breaker.cooldown(cooldown).half_open_calls(half_open);
    match growth {
        Some((factor, max)) => b.cooldown_growth(factor, max),
        None => b,
    }
}

fn consecutive_breakers() -> impl Strategy<Value = CircuitBreaker> {
    (1u32..5, cooldowns(), 1u32..4)
        .prop_map(|(n, c, h)| finish(CircuitBreaker::consecutive_failures(n), c, h))
}

fn slow_config() -> impl Strategy<Value = Option<f64>> {
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

fn count_breakers() -> impl Strategy<Value = CircuitBreaker> {
    (
        1u32..7,
        1u32..9,
        rate(),
        slow_config(),
        cooldowns(),
        1u32..4,
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

fn time_breakers() -> impl Strategy<Value = CircuitBreaker> {
    (
        1u64..4,
        1u32..6,
        rate(),
        slow_config(),
        cooldowns(),
        1u32..4,
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

/// Drives the store and the model with `ops`, comparing every answer.
fn agree(breaker: CircuitBreaker, partitioned: bool, start: Duration, ops: Vec<Op>) {
    let store = MemoryStore::new();
    let state: Arc<dyn ResourceState> = store
        .bind(&ResourceSpec::new("model").with_circuit(breaker.clone()))
        .unwrap();
    let key = PartitionKey::from("tenant");
    let key = partitioned.then_some(&key);
    let mut model = Model::new(breaker);
    let mut now = start.as_nanos() as u64;
    let mut permits: Vec<Permit> = Vec::new();
    let slow = model.spec.slow_call_duration;

    for (step, op) in ops.into_iter().enumerate() {
        let at = Duration::from_nanos(now);
        match op {
            Op::Admit => {
                let real = state
                    .admit(&AdmitRequest {
                        partition: key,
                        now: at,
                    })
                    .unwrap();
                let (expected, transition) = model.admit(now);
                let got = match real.decision {
                    Ok(p) => {
                        permits.push(p);
                        Ok((p.generation, p.probe))
                    }
                    Err(r) => {
                        assert_eq!(r.reason, RejectionReason::CircuitOpen, "step {step}");
                        Err(r.retry_after)
                    }
                };
                assert_eq!(got, expected, "step {step}: admission");
                assert_eq!(
                    real.transition, transition,
                    "step {step}: admission transition"
                );
            }
            Op::Record {
                pick,
                outcome,
                speed,
            } => {
                if permits.is_empty() {
                    continue;
                }
                let permit = permits.swap_remove(pick % permits.len());
                let duration = match speed {
                    0 => Duration::ZERO,
                    1 => slow - Duration::from_nanos(1),
                    2 => slow,
                    _ => slow * 2,
                };
                let real = state
                    .record(&Record {
                        partition: key,
                        permit,
                        outcome,
                        duration,
                        retry_after: None,
                        now: at,
                    })
                    .unwrap();
                let expected =
                    model.record(permit.generation, permit.probe, outcome, duration, now);
                assert_eq!(real.transition, expected, "step {step}: record {outcome:?}");
            }
            Op::Release { pick } => {
                if permits.is_empty() {
                    continue;
                }
                let permit = permits.swap_remove(pick % permits.len());
                state.release(key, permit);
                model.release(permit.generation, permit.probe);
            }
            Op::Advance(by) => now += by.as_nanos() as u64,
            Op::Control(control) => {
                let real = state.control_circuit(key, control, at).unwrap();
                assert_eq!(
                    real,
                    model.control(control, now),
                    "step {step}: {control:?}"
                );
            }
        }
        let at = Duration::from_nanos(now);
        assert_eq!(
            state.circuit_metrics(key, at).unwrap(),
            model.metrics(now),
            "step {step}: metrics after {:?}",
            model.state
        );
    }
}

fn start_time() -> impl Strategy<Value = Duration> {
    prop_oneof![Just(0u64), 0u64..10_000_000_000].prop_map(Duration::from_nanos)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 300,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn consecutive_mode_agrees_with_the_model(
        breaker in consecutive_breakers(),
        partitioned in any::<bool>(),
        start in start_time(),
        ops in prop::collection::vec(op(), 1..250),
    ) {
        agree(breaker, partitioned, start, ops);
    }

    #[test]
    fn count_window_agrees_with_the_model(
        breaker in count_breakers(),
        partitioned in any::<bool>(),
        start in start_time(),
        ops in prop::collection::vec(op(), 1..250),
    ) {
        agree(breaker, partitioned, start, ops);
    }

    #[test]
    fn time_window_agrees_with_the_model(
        breaker in time_breakers(),
        partitioned in any::<bool>(),
        start in start_time(),
        ops in prop::collection::vec(op(), 1..250),
    ) {
        agree(breaker, partitioned, start, ops);
    }
}

/// Trips saturate at 63 and keep the cooldown at its cap; generations wrap
/// without confusing permits of the current generation.
#[test]
fn long_runs_saturate_trips_and_wrap_generations() {
    let breaker = CircuitBreaker::consecutive_failures(1)
        .cooldown(Duration::from_millis(1))
        .cooldown_growth(2.0, Duration::from_millis(5));
    // 5000 failed probes: 10,000 transitions, past the 8192 generations.
    let mut ops = vec![
        Op::Admit,
        Op::Record {
            pick: 0,
            outcome: Outcome::Failure,
            speed: 0,
        },
    ];
    for _ in 0..5000 {
        ops.push(Op::Advance(Duration::from_millis(5)));
        ops.push(Op::Admit);
        ops.push(Op::Record {
            pick: 0,
            outcome: Outcome::Failure,
            speed: 0,
        });
    }
    agree(breaker, false, Duration::ZERO, ops);
}
