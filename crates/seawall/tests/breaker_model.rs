//! The circuit breaker of `MemoryStore` against the reference model
//! (`seawall::model::breaker`).
//!
//! A random sequence of operations (admit, record success / failure /
//! ignored with a duration, release, advance the clock, manual control) is
//! applied to the model and to the store; they must agree on every decision
//! (admitted, probe, generation, rejected with which `retry_after`), every
//! transition, and the full metrics after every step. Clocks start at 0,
//! anywhere in the first 10 s, at 10^6 s, just before the latest end of a
//! cooldown kept in milliseconds (2^42 ms) and just before `u64::MAX` ns.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use seawall::breaker::{CircuitState, CircuitTransition};
use seawall::model::breaker::{check, strategy, Op, OPEN_FOREVER_MS};
use seawall::store::{AdmitRequest, Outcome, Record, ResourceSpec, ResourceState};
use seawall::{CircuitBreaker, MemoryStore, PartitionKey, StateStore};

fn bound(breaker: &CircuitBreaker) -> Arc<dyn ResourceState> {
    MemoryStore::new()
        .bind(&ResourceSpec::new("model").with_circuit(breaker.clone()))
        .unwrap()
}

fn agree(breaker: CircuitBreaker, partitioned: bool, start: Duration, ops: &[Op]) {
    let state = bound(&breaker);
    let key = PartitionKey::from("tenant");
    let key = partitioned.then_some(&key);
    if let Err(e) = check(&*state, key, breaker, start, ops) {
        panic!("{e}");
    }
}

/// Clock origins: 0, the first 10 s, 10^6 s, the neighbourhood of the
/// latest cooldown end kept in milliseconds, the top of the range.
fn start_time() -> impl Strategy<Value = Duration> {
    let forever_ns = OPEN_FOREVER_MS * 1_000_000;
    prop_oneof![
        Just(0u64),
        0u64..10_000_000_000,
        Just(1_000_000_000_000_000),
        (forever_ns - 20_000_000_000)..forever_ns,
        (u64::MAX - 3_600_000_000_000)..u64::MAX,
    ]
    .prop_map(Duration::from_nanos)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 300,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn consecutive_mode_agrees_with_the_model(
        breaker in strategy::consecutive(),
        partitioned in any::<bool>(),
        start in start_time(),
        ops in strategy::ops(false, 250),
    ) {
        agree(breaker, partitioned, start, &ops);
    }

    #[test]
    fn count_window_agrees_with_the_model(
        breaker in strategy::count_window(),
        partitioned in any::<bool>(),
        start in start_time(),
        ops in strategy::ops(false, 250),
    ) {
        agree(breaker, partitioned, start, &ops);
    }

    #[test]
    fn time_window_agrees_with_the_model(
        breaker in strategy::time_window(),
        partitioned in any::<bool>(),
        start in start_time(),
        ops in strategy::ops(false, 250),
    ) {
        agree(breaker, partitioned, start, &ops);
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
    let mut ops = vec![Op::Admit, Op::record(0, Outcome::Failure)];
    for _ in 0..5000 {
        ops.push(Op::Advance(Duration::from_millis(5)));
        ops.push(Op::Admit);
        ops.push(Op::record(0, Outcome::Failure));
    }
    agree(breaker, false, Duration::ZERO, &ops);
}

struct Subject {
    state: Arc<dyn ResourceState>,
}

impl Subject {
    fn new(breaker: CircuitBreaker) -> Self {
        Subject {
            state: bound(&breaker),
        }
    }

    fn admit(&self, now: Duration) -> Result<seawall::store::Permit, Option<Duration>> {
        self.state
            .admit(&AdmitRequest {
                partition: None,
                now,
                weight: 1,
                budget: None,
                shadowed: false,
            })
            .unwrap()
            .decision
            .map_err(|r| r.retry_after)
    }

    fn record(&self, now: Duration, outcome: Outcome) -> Option<CircuitTransition> {
        let permit = self.admit(now).expect("admitted");
        self.state
            .record(&Record {
                partition: None,
                permit,
                outcome,
                duration: Duration::ZERO,
                retry_after: None,
                now,
            })
            .unwrap()
            .transition
    }
}

/// The end of a cooldown was kept in 42 bits of milliseconds and saturated
/// to an instant already past: a trip late in the clock's range admitted at
/// once, one near the limit got a shortened cooldown.
#[test]
fn cooldown_end_saturates_on_the_safe_side() {
    const S: u64 = 1_000_000_000;
    let cooldown = Duration::from_secs(30);
    let forever_ns = OPEN_FOREVER_MS * 1_000_000;
    for trip_at in [
        u64::MAX - 1,
        u64::MAX - 1_000,
        u64::MAX - 30 * S,
        u64::MAX - 30 * S - 1,
        u64::MAX - 31 * S,
        forever_ns - 10 * S,
        forever_ns,
        forever_ns + 1,
        1 << 63,
    ] {
        let s = Subject::new(CircuitBreaker::consecutive_failures(1).cooldown(cooldown));
        let at = Duration::from_nanos(trip_at);
        assert!(
            s.record(at, Outcome::Failure).is_some(),
            "trip at {trip_at}"
        );
        for after in [0, 1, S, 29 * S, 30 * S - 1] {
            let now = trip_at.saturating_add(after).min(u64::MAX - 1);
            match s.admit(Duration::from_nanos(now)) {
                Err(Some(left)) => {
                    // Open at least until the end of the cooldown, or the
                    // latest instant when that end is past it.
                    let end = (u128::from(trip_at) + cooldown.as_nanos()).min(u128::from(u64::MAX));
                    assert!(
                        !left.is_zero() && u128::from(now) + left.as_nanos() >= end,
                        "trip at {trip_at}, {after} ns later: {left:?} left is short"
                    );
                }
                other => panic!("trip at {trip_at}, {after} ns later: {other:?}, expected open"),
            }
        }
    }
}

/// A call refused while the circuit is half-open (every probe slot taken)
/// carried no `retry_after`; it carries the length of the cooldown that
/// just ended.
#[test]
fn a_half_open_refusal_carries_a_retry_after() {
    let s = Subject::new(
        CircuitBreaker::consecutive_failures(1)
            .cooldown(Duration::from_secs(10))
            .cooldown_growth(2.0, Duration::from_secs(60))
            .half_open_calls(2),
    );
    let t0 = Duration::from_secs(1_000_000);
    s.record(t0, Outcome::Failure);
    let probe = s.admit(t0 + Duration::from_secs(10)).expect("first probe");
    assert!(probe.probe);
    s.admit(t0 + Duration::from_secs(10)).expect("second probe");
    assert_eq!(
        s.admit(t0 + Duration::from_secs(11)).unwrap_err(),
        Some(Duration::from_secs(10))
    );
}

/// `circuit_metrics()` in half-open showed the frozen window that opened
/// the circuit and never counted the probes. Half-open has its own counts;
/// closing starts a fresh window.
#[test]
fn half_open_metrics_count_the_probes() {
    let s = Subject::new(
        CircuitBreaker::failure_rate(0.5)
            .count_window(4)
            .minimum_calls(2)
            .cooldown(Duration::from_secs(1))
            .half_open_calls(3),
    );
    let t0 = Duration::from_secs(1_000_000);
    s.record(t0, Outcome::Success);
    assert!(s.record(t0, Outcome::Failure).is_some(), "1 of 2 failed");
    let m = s.state.circuit_metrics(None, t0).unwrap();
    assert_eq!((m.state, m.calls, m.failures), (CircuitState::Open, 2, 1));
    let t1 = t0 + Duration::from_secs(1);
    let metrics = |now| s.state.circuit_metrics(None, now).unwrap();
    // The first probe half-opens the circuit (reported by the admission).
    assert_eq!(s.record(t1, Outcome::Success), None);
    let m = metrics(t1);
    assert_eq!(
        (m.state, m.calls, m.failures, m.failure_rate),
        (CircuitState::HalfOpen, 1, 0, 0.0)
    );
    s.record(t1, Outcome::Success);
    assert_eq!(metrics(t1).calls, 2);
    assert_eq!(
        s.record(t1, Outcome::Success),
        Some(CircuitTransition::Closed)
    );
    let m = metrics(t1);
    assert_eq!((m.state, m.calls, m.failures), (CircuitState::Closed, 0, 0));
}

/// The path users run: a pipeline on the memory store, sync and async, on
/// virtual clocks starting at 0, at 10^6 s and an hour before the end of
/// the clock's range. An open circuit refuses with the time left; a
/// half-open circuit whose probe slot is taken refuses with the cooldown as
/// the hint; a successful probe closes.
fn pipeline_sees_the_breaker_rules(listener: bool) {
    use seawall::testing::VirtualClock;
    use seawall::{Pipeline, RejectionReason};

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for start in [0, 1_000_000, u64::MAX / 1_000_000_000 - 3600] {
        for run_async in [false, true] {
            let clock = VirtualClock::new();
            clock.advance(Duration::from_secs(start));
            // A name of its own: the default store is shared by name.
            let mut b = Pipeline::builder(format!("rules-{listener}-{start}-{run_async}"))
                .circuit_breaker(
                    CircuitBreaker::consecutive_failures(1).cooldown(Duration::from_secs(30)),
                )
                .clock(clock.clone());
            if listener {
                b = b.on_event(|_| {});
            }
            let p = b.build().unwrap();
            let call = |ok: bool| -> Result<u32, seawall::Error<&'static str>> {
                let result = move || if ok { Ok(1) } else { Err("boom") };
                if run_async {
                    rt.block_on(p.run(|_| async move { result() }))
                } else {
                    p.call(|_| result())
                }
            };
            let what = format!("start {start} s, listener {listener}, async {run_async}");
            assert_eq!(call(true).ok(), Some(1), "{what}");
            clock.advance(Duration::from_secs(31));
            assert!(call(false).is_err(), "{what}");
            clock.advance(Duration::from_secs(29));
            // Near the end of the range the cooldown's end is past what a
            // store keeps: open until the latest instant.
            let forever = start >= OPEN_FOREVER_MS / 1000 - 60;
            let left = if forever {
                Duration::from_nanos(u64::MAX) - clock.now()
            } else {
                Duration::from_secs(1)
            };
            let e = call(true).expect_err(&what);
            let r = e
                .rejection()
                .copied()
                .unwrap_or_else(|| panic!("{what}: {e}"));
            assert_eq!(
                (r.reason, r.retry_after),
                (RejectionReason::CircuitOpen, Some(left)),
                "{what}"
            );
            clock.advance(Duration::from_secs(1));
            if forever {
                assert!(call(true).is_err(), "{what}: still open");
                continue;
            }
            // The probe holds the only slot: a call made meanwhile is refused.
            let inside = std::cell::Cell::new(None);
            let probe = p.call(|_| {
                inside.set(Some(p.call(|_| Ok::<u32, &str>(2)).unwrap_err()));
                Ok::<u32, &str>(3)
            });
            assert_eq!(probe.ok(), Some(3), "{what}");
            let r = inside.take().and_then(|e| e.rejection().copied());
            assert_eq!(
                r.map(|r| r.retry_after),
                Some(Some(Duration::from_secs(30))),
                "{what}: a refusal while half-open hints the cooldown"
            );
            assert_eq!(
                p.circuit_metrics().unwrap().state,
                CircuitState::Closed,
                "{what}"
            );
        }
    }
}

#[test]
fn a_pipeline_with_a_listener_sees_the_breaker_rules() {
    pipeline_sees_the_breaker_rules(true);
}

/// Without a listener the lean first-attempt path stamps the record of a
/// failure with the clock's origin instead of the attempt's time, so the
/// cooldown of a trip was over at once; a regression test of that defect.
#[test]
fn a_pipeline_without_a_listener_sees_the_breaker_rules() {
    pipeline_sees_the_breaker_rules(false);
}
