//! The breaker's other states through pipelines on the memory store, on
//! the virtual clock: opened for an explicit duration (`open_for`), a
//! limit on the time a round of probes may block the next one
//! (`max_half_open`), the disabled and isolated states switched on and off
//! (`disable`, `enable`, `isolate`), the time in state of a circuit that
//! never moved, and the settings `build()` refuses. Sync and async, clocks
//! at 0 and at 10^6 s, unpartitioned and in a partition.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use seawall::breaker::{CircuitMetrics, CircuitState};
use seawall::pipeline::{ControlError, Partition};
use seawall::testing::VirtualClock;
use seawall::{CircuitBreaker, ConfigError, Error, EventKind, Pipeline, RejectionReason};
use support::{exec, recorder, secs, unique, Boom, Flavor, FAR, FLAVORS};

fn ok(_: seawall::Context) -> Result<u32, Boom> {
    Ok(1)
}

fn boom(_: seawall::Context) -> Result<u32, Boom> {
    Err(Boom(1))
}

fn refused_with(r: Result<u32, Error<Boom>>) -> Option<(RejectionReason, Option<Duration>)> {
    match r {
        Err(Error::Rejected(r)) => Some((r.reason, r.retry_after)),
        _ => None,
    }
}

#[test]
fn open_for_refuses_for_that_long_then_probes() {
    for flavor in FLAVORS {
        for offset in [Duration::ZERO, FAR] {
            for partitioned in [false, true] {
                let clock = support::clock_at(offset);
                let (log, listener) = recorder();
                let p = Pipeline::builder(unique("open-for"))
                    .circuit_breaker(
                        CircuitBreaker::consecutive_failures(1)
                            .cooldown(secs(10))
                            .cooldown_growth(2.0, secs(100)),
                    )
                    .clock(clock.clone())
                    .on_event(listener)
                    .build()
                    .unwrap();
                let part = p.partition("tenant");
                let call = |op: fn(seawall::Context) -> Result<u32, Boom>| {
                    if partitioned {
                        match flavor {
                            support::Flavor::Sync => part.call(op),
                            support::Flavor::Async => {
                                support::rt().block_on(part.run(|ctx| std::future::ready(op(ctx))))
                            }
                        }
                    } else {
                        exec(&p, flavor, op)
                    }
                };
                let state = || {
                    if partitioned {
                        part.circuit_metrics().unwrap().state
                    } else {
                        p.circuit_state().unwrap()
                    }
                };
                if partitioned {
                    part.open_for(secs(60)).unwrap();
                } else {
                    p.open_for(secs(60)).unwrap();
                }
                assert_eq!(state(), CircuitState::Open);
                assert_eq!(
                    refused_with(call(ok)),
                    Some((RejectionReason::CircuitOpen, Some(secs(60))))
                );
                clock.advance(secs(59));
                assert_eq!(
                    refused_with(call(ok)),
                    Some((RejectionReason::CircuitOpen, Some(secs(1))))
                );
                clock.advance(secs(1));
                // The probe fails: opened by hand, no trip before, so the
                // first cooldown (not a grown one).
                assert!(matches!(call(boom), Err(Error::Operation(_))));
                assert_eq!(state(), CircuitState::Open);
                assert_eq!(
                    refused_with(call(ok)),
                    Some((RejectionReason::CircuitOpen, Some(secs(10))))
                );
                clock.advance(secs(10));
                assert_eq!(call(ok).unwrap(), 1);
                assert_eq!(state(), CircuitState::Closed);
                let events = log.lock().unwrap().clone();
                assert_eq!(events[0], EventKind::CircuitOpened { cooldown: secs(60) });
                // The other level's circuit never moved.
                let other = if partitioned {
                    p.circuit_state().unwrap()
                } else {
                    p.partition("tenant").circuit_metrics().unwrap().state
                };
                assert_eq!(other, CircuitState::Closed);
            }
        }
    }
}

#[test]
fn open_for_replaces_the_end_of_an_open_circuit_and_keeps_its_trips() {
    let clock = support::clock_at(FAR);
    let p = Pipeline::builder(unique("open-for-again"))
        .circuit_breaker(
            CircuitBreaker::consecutive_failures(1)
                .cooldown(secs(10))
                .cooldown_growth(2.0, secs(100)),
        )
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(p.call(boom).is_err());
    p.open_for(Duration::from_millis(1500)).unwrap();
    let m = p.circuit_metrics().unwrap();
    assert_eq!((m.state, m.trips), (CircuitState::Open, 1));
    clock.advance(Duration::from_millis(1500));
    // A failed probe is the second trip: a doubled cooldown.
    assert!(p.call(boom).is_err());
    assert_eq!(
        refused_with(p.call(ok)),
        Some((RejectionReason::CircuitOpen, Some(secs(20))))
    );
    // Zero: half-open at the next call.
    p.open_for(Duration::ZERO).unwrap();
    assert_eq!(p.call(ok).unwrap(), 1);
    assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
    // The longest: open until the clock's end.
    p.open_for(Duration::MAX).unwrap();
    clock.advance(secs(1_000_000_000));
    assert_eq!(
        refused_with(p.call(ok)).map(|(r, _)| r),
        Some(RejectionReason::CircuitOpen)
    );
}

#[test]
fn disable_admits_everything_records_nothing_and_enable_closes() {
    for flavor in FLAVORS {
        let (log, listener) = recorder();
        let p = Pipeline::builder(unique("disabled"))
            .circuit_breaker(CircuitBreaker::consecutive_failures(2).cooldown(secs(30)))
            .on_event(listener)
            .build()
            .unwrap();
        assert!(exec(&p, flavor, boom).is_err());
        p.disable().unwrap();
        p.disable().unwrap(); // a second time changes nothing
        for _ in 0..5 {
            assert!(matches!(exec(&p, flavor, boom), Err(Error::Operation(_))));
        }
        let m = p.circuit_metrics().unwrap();
        // Nothing recorded: the failure in a row it was disabled with is
        // all it shows.
        assert_eq!((m.state, m.failures), (CircuitState::Disabled, 1));
        assert_eq!(p.circuit_state().unwrap(), CircuitState::Disabled);
        p.enable().unwrap();
        let m = p.circuit_metrics().unwrap();
        assert_eq!((m.state, m.calls, m.trips), (CircuitState::Closed, 0, 0));
        p.enable().unwrap(); // not disabled: nothing changes
                             // Enabled again: it counts from an empty window.
        assert!(exec(&p, flavor, boom).is_err());
        assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
        assert!(exec(&p, flavor, boom).is_err());
        assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
        // Enabling an open circuit does not close it.
        p.enable().unwrap();
        assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
        let closes = log
            .lock()
            .unwrap()
            .iter()
            .filter(|e| **e == EventKind::CircuitClosed)
            .count();
        assert_eq!(closes, 2, "{flavor:?}: disable and enable, each once");
    }
}

#[test]
fn disabling_an_open_circuit_lets_calls_through_at_once() {
    let p = Pipeline::builder(unique("disable-open"))
        .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(600)))
        .build()
        .unwrap();
    assert!(p.call(boom).is_err());
    assert!(refused_with(p.call(ok)).is_some());
    p.disable().unwrap();
    assert_eq!(p.call(ok).unwrap(), 1);
    p.enable().unwrap();
    assert_eq!(p.call(ok).unwrap(), 1);
    assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
}

#[test]
fn a_hanging_probe_gives_way_after_max_half_open() {
    for flavor in FLAVORS {
        for offset in [Duration::ZERO, FAR] {
            let clock = support::clock_at(offset);
            let (log, listener) = recorder();
            let p = Pipeline::builder(unique("max-half-open"))
                .circuit_breaker(
                    CircuitBreaker::consecutive_failures(1)
                        .cooldown(secs(10))
                        .half_open_calls(2)
                        .max_half_open(secs(3)),
                )
                .clock(clock.clone())
                .on_event(listener)
                .build()
                .unwrap();
            assert!(exec(&p, flavor, boom).is_err());
            clock.advance(secs(10));
            let runs = AtomicU32::new(0);
            // Two probes that never end in this test: held by nested calls.
            let outer = p.call(|_| {
                p.call(|_| {
                    // Both probe slots are taken; the round is 0 s old.
                    assert_eq!(
                        refused_with(exec(&p, flavor, ok)),
                        Some((RejectionReason::CircuitOpen, Some(secs(10))))
                    );
                    clock.advance(Duration::from_millis(2999));
                    assert!(refused_with(exec(&p, flavor, ok)).is_some());
                    clock.advance(Duration::from_millis(1));
                    // The round is 3 s old: a new round, whose two probes
                    // succeed and close the circuit.
                    for _ in 0..2 {
                        assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
                        runs.fetch_add(1, Ordering::Relaxed);
                    }
                    assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
                    // The old probes' failures come too late to count.
                    Err::<u32, _>(Boom(2))
                })
            });
            assert!(outer.is_err());
            assert_eq!(runs.load(Ordering::Relaxed), 2);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            let expired: Vec<EventKind> = log
                .lock()
                .unwrap()
                .iter()
                .filter(|e| matches!(e, EventKind::CircuitProbesExpired))
                .cloned()
                .collect();
            assert_eq!(expired, [EventKind::CircuitProbesExpired], "{flavor:?}");
        }
    }
}

#[test]
fn without_max_half_open_a_hanging_probe_blocks() {
    let clock = support::clock_at(FAR);
    let p = Pipeline::builder(unique("no-max-half-open"))
        .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(10)))
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(p.call(boom).is_err());
    clock.advance(secs(10));
    let r = p.call(|_| {
        clock.advance(secs(100_000));
        Ok::<_, Boom>(refused_with(p.call(ok)))
    });
    assert_eq!(
        r.unwrap(),
        Some((RejectionReason::CircuitOpen, Some(secs(10))))
    );
}

#[test]
fn bad_input_is_refused_at_build_naming_policy_field_and_rule() {
    let e: ConfigError = Pipeline::builder("bad-half-open")
        .circuit_breaker(CircuitBreaker::consecutive_failures(1).max_half_open(Duration::ZERO))
        .build()
        .unwrap_err();
    assert_eq!(
        (e.policy, e.field, e.rule.as_str()),
        ("circuit_breaker", "max_half_open", "must be > 0")
    );
    assert_eq!(e.to_string(), "circuit_breaker.max_half_open must be > 0");
}

#[test]
fn controls_without_a_breaker_say_so() {
    let p = Pipeline::builder(unique("no-breaker")).build().unwrap();
    for r in [p.open_for(secs(1)), p.disable(), p.enable()] {
        assert_eq!(
            r.unwrap_err().to_string(),
            format!("pipeline `{}` has no circuit breaker", p.name())
        );
    }
}

/// One circuit of a pipeline, the unpartitioned one or a partition's, and
/// the way its calls are made.
struct Level<'p> {
    p: &'p Pipeline,
    partitioned: bool,
    flavor: Flavor,
}

impl Level<'_> {
    fn call(&self, op: fn(seawall::Context) -> Result<u32, Boom>) -> Result<u32, Error<Boom>> {
        if !self.partitioned {
            return exec(self.p, self.flavor, op);
        }
        let part = self.p.partition("tenant");
        match self.flavor {
            Flavor::Sync => part.call(op),
            Flavor::Async => support::rt().block_on(part.run(|ctx| std::future::ready(op(ctx)))),
        }
    }

    fn metrics(&self) -> CircuitMetrics {
        if self.partitioned {
            self.p.partition("tenant").circuit_metrics().unwrap()
        } else {
            self.p.circuit_metrics().unwrap()
        }
    }

    fn control(
        &self,
        whole: fn(&Pipeline) -> Result<(), ControlError>,
        part: fn(&Partition<'_>) -> Result<(), ControlError>,
    ) {
        if self.partitioned {
            part(&self.p.partition("tenant")).unwrap();
        } else {
            whole(self.p).unwrap();
        }
    }
}

/// Runs `test` on a fresh pipeline with `breaker` for every flavour, clock
/// origin (0 and 10^6 s) and level (unpartitioned, partition).
fn every_way(name: &str, breaker: CircuitBreaker, test: impl Fn(&Level<'_>, &VirtualClock)) {
    for flavor in FLAVORS {
        for offset in [Duration::ZERO, FAR] {
            for partitioned in [false, true] {
                let clock = support::clock_at(offset);
                let p = Pipeline::builder(unique(name))
                    .circuit_breaker(breaker.clone())
                    .clock(clock.clone())
                    .build()
                    .unwrap();
                let level = Level {
                    p: &p,
                    partitioned,
                    flavor,
                };
                test(&level, &clock);
            }
        }
    }
}

#[test]
fn after_open_for_a_full_half_open_circuit_hints_the_duration_it_was_opened_for() {
    let breaker = CircuitBreaker::consecutive_failures(5)
        .cooldown(secs(30))
        .cooldown_growth(2.0, secs(300));
    every_way("open-for-hint", breaker, |level, clock| {
        let refused_while_probing = || {
            let mut refused = None;
            let probe = |_: seawall::Context| {
                refused = refused_with(level.call(ok));
                Ok::<u32, Boom>(1)
            };
            let r = if level.partitioned {
                level.p.partition("tenant").call(probe)
            } else {
                level.p.call(probe)
            };
            assert_eq!(r.unwrap(), 1);
            refused
        };
        level.control(|p| p.open_for(secs(60)), |p| p.open_for(secs(60)));
        clock.advance(secs(60));
        // The probe is running: the call that finds its slot taken is
        // told the 60 s that just ended, not the configured 30 s.
        assert_eq!(
            refused_while_probing(),
            Some((RejectionReason::CircuitOpen, Some(secs(60)))),
            "{:?}, partitioned {}",
            level.flavor,
            level.partitioned
        );
        assert_eq!(level.metrics().state, CircuitState::Closed);
        // Opened for a while, then a failed probe: a trip, whose cooldown
        // (30 s) is the hint of the next round.
        level.control(|p| p.open_for(secs(45)), |p| p.open_for(secs(45)));
        clock.advance(secs(45));
        assert!(matches!(level.call(boom), Err(Error::Operation(_))));
        clock.advance(secs(30));
        assert_eq!(
            refused_while_probing(),
            Some((RejectionReason::CircuitOpen, Some(secs(30))))
        );
    });
}

#[test]
fn isolating_or_disabling_keeps_the_failures_in_a_row_on_show() {
    let breaker = CircuitBreaker::consecutive_failures(5).cooldown(secs(30));
    every_way("keeps-in-a-row", breaker, |level, _| {
        let shown = |level: &Level<'_>| {
            let m = level.metrics();
            (m.state, m.calls, m.failures)
        };
        assert!(level.call(boom).is_err());
        assert!(level.call(boom).is_err());
        assert_eq!(shown(level), (CircuitState::Closed, 2, 2));
        level.control(|p| p.disable(), |p| p.disable());
        assert_eq!(shown(level), (CircuitState::Disabled, 2, 2));
        // Nothing is recorded while disabled.
        assert!(level.call(boom).is_err());
        assert_eq!(shown(level), (CircuitState::Disabled, 2, 2));
        level.control(|p| p.isolate(), |p| p.isolate());
        assert_eq!(shown(level), (CircuitState::Isolated, 2, 2));
        level.control(|p| p.disable(), |p| p.disable());
        assert_eq!(shown(level), (CircuitState::Disabled, 2, 2));
        // Enabled again: a fresh window.
        level.control(|p| p.enable(), |p| p.enable());
        assert_eq!(shown(level), (CircuitState::Closed, 0, 0));
        assert!(level.call(boom).is_err());
        level.control(|p| p.isolate(), |p| p.isolate());
        assert_eq!(shown(level), (CircuitState::Isolated, 1, 1));
        // An open circuit shows no failures in a row, nor does isolating it.
        level.control(|p| p.reset(), |p| p.reset());
        level.control(|p| p.open_for(secs(5)), |p| p.open_for(secs(5)));
        level.control(|p| p.isolate(), |p| p.isolate());
        assert_eq!(shown(level), (CircuitState::Isolated, 0, 0));
    });
    // As in a count window, which keeps its window.
    let window = CircuitBreaker::failure_rate(0.9)
        .count_window(10)
        .minimum_calls(10);
    every_way("keeps-window", window, |level, _| {
        assert!(level.call(boom).is_err());
        assert!(level.call(boom).is_err());
        level.control(|p| p.disable(), |p| p.disable());
        let m = level.metrics();
        assert_eq!(
            (m.state, m.calls, m.failures),
            (CircuitState::Disabled, 2, 2)
        );
    });
}

#[test]
fn a_circuit_that_never_moved_counts_its_time_in_state_from_its_first_use() {
    let breaker = CircuitBreaker::consecutive_failures(3).cooldown(secs(30));
    every_way("first-state", breaker, |level, clock| {
        // Not used yet: in its first state for no time at all, on a clock
        // at 0 as on one at 10^6 s.
        assert_eq!(level.metrics().time_in_state, Duration::ZERO);
        clock.advance(secs(7));
        assert_eq!(level.metrics().time_in_state, Duration::ZERO);
        assert_eq!(level.call(ok).unwrap(), 1);
        assert_eq!(level.metrics().time_in_state, Duration::ZERO);
        clock.advance(secs(5));
        assert!(level.call(boom).is_err());
        let m = level.metrics();
        assert_eq!((m.state, m.time_in_state), (CircuitState::Closed, secs(5)));
        // A transition restarts it.
        assert!(level.call(boom).is_err());
        assert!(level.call(boom).is_err());
        clock.advance(secs(2));
        let m = level.metrics();
        assert_eq!((m.state, m.time_in_state), (CircuitState::Open, secs(2)));
    });
    // A manual control is a first use too.
    every_way(
        "first-state-control",
        CircuitBreaker::consecutive_failures(3),
        |level, clock| {
            clock.advance(secs(3));
            level.control(|p| p.enable(), |p| p.enable());
            clock.advance(secs(4));
            let m = level.metrics();
            assert_eq!((m.state, m.time_in_state), (CircuitState::Closed, secs(4)));
        },
    );
}

#[test]
fn a_consecutive_failures_breaker_refuses_window_settings_at_build() {
    let refused = |breaker: CircuitBreaker| -> ConfigError {
        Pipeline::builder(unique("consecutive-window"))
            .circuit_breaker(breaker)
            .build()
            .map(drop)
            .unwrap_err()
    };
    let rule = "applies only to a count or time window, not consecutive_failures";
    let e = refused(CircuitBreaker::consecutive_failures(3).minimum_calls(50));
    assert_eq!(
        (e.policy, e.field, e.rule.as_str()),
        ("circuit_breaker", "minimum_calls", rule)
    );
    assert_eq!(
        e.to_string(),
        "circuit_breaker.minimum_calls applies only to a count or time window, not consecutive_failures"
    );
    let mut b = CircuitBreaker::consecutive_failures(3);
    b.failure_rate = 0.3;
    assert_eq!(refused(b).field, "failure_rate");
    let mut b = CircuitBreaker::consecutive_failures(3);
    b.slow_call_duration = secs(1);
    assert_eq!(refused(b).field, "slow_call_duration");
    let e = refused(CircuitBreaker::consecutive_failures(3).slow_calls(0.5, secs(1)));
    assert_eq!((e.field, e.rule.as_str()), ("slow_call_rate", rule));
    // Not in the window modes, nor on a consecutive breaker turned into one.
    for ok in [
        CircuitBreaker::consecutive_failures(3),
        CircuitBreaker::failure_rate(0.3).minimum_calls(50),
        CircuitBreaker::consecutive_failures(3).count_window(10),
        CircuitBreaker::consecutive_failures(3).window(secs(10)),
    ] {
        Pipeline::builder(unique("window-settings"))
            .circuit_breaker(ok.clone())
            .build()
            .unwrap_or_else(|e| panic!("{ok:?}: {e}"));
    }
}

#[test]
fn half_open_calls_above_what_the_state_holds_are_refused_at_build() {
    let build = |calls: u32| {
        Pipeline::builder(unique("half-open-calls"))
            .circuit_breaker(CircuitBreaker::consecutive_failures(1).half_open_calls(calls))
            .build()
            .map(drop)
    };
    let e = build(3_000_000).unwrap_err();
    assert_eq!((e.policy, e.field), ("circuit_breaker", "half_open_calls"));
    assert_eq!(
        e.to_string(),
        "circuit_breaker.half_open_calls must be <= 2097151, got 3000000"
    );
    assert!(build(2_097_152).is_err());
    assert!(build(u32::MAX).is_err());
    build(2_097_151).unwrap();
}

#[test]
fn the_most_half_open_calls_all_must_succeed_to_close() {
    let clock = support::clock_at(FAR);
    let calls = 2_097_151u32;
    let p = Pipeline::builder(unique("half-open-most"))
        .circuit_breaker(
            CircuitBreaker::consecutive_failures(1)
                .cooldown(secs(1))
                .half_open_calls(calls),
        )
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(p.call(boom).is_err());
    clock.advance(secs(1));
    for _ in 1..calls {
        assert_eq!(p.call(ok).unwrap(), 1);
    }
    assert_eq!(p.circuit_state().unwrap(), CircuitState::HalfOpen);
    assert_eq!(p.call(ok).unwrap(), 1);
    assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
}

/// A time window counts the last `W` seconds on any clock reading: from the
/// second 2^31 on (68 years), an empty second is not taken for a later
/// one that swallows the call.
#[test]
fn a_time_window_counts_its_calls_at_any_clock_reading() {
    for start in [
        0,
        1_000_000,
        1 << 31,
        2_200_000_000,
        3_000_000_000,
        4_000_000_000,
        5_000_000_000,
    ] {
        let clock = VirtualClock::starting_at(Duration::from_secs(start));
        let p = Pipeline::builder(unique("time-window-far"))
            .circuit_breaker(
                CircuitBreaker::failure_rate(0.5)
                    .window(secs(10))
                    .minimum_calls(2),
            )
            .clock(clock.clone())
            .build()
            .unwrap();
        assert!(p.call(boom).is_err());
        clock.advance(secs(1));
        assert!(p.call(boom).is_err());
        let m = p.circuit_metrics().unwrap();
        assert_eq!(
            (m.state, m.calls, m.failures),
            (CircuitState::Open, 2, 2),
            "from {start} s"
        );
    }
}

/// A time window holds only the calls of its last `W` seconds after an
/// idle gap of any length: after 68 years (2^31 s) and more, a call is not
/// counted into a second left from before the gap (and lost), nor after
/// 136 years (2^32 s) are that second's calls counted again.
#[test]
fn a_time_window_forgets_its_calls_after_a_gap_of_any_length() {
    for gap in [
        1u64 << 31,
        3_000_000_000,
        (1 << 32) - 3,
        (1 << 32) + 7,
        5_000_000_000,
    ] {
        for start in [0, 1_000_000] {
            let clock = VirtualClock::starting_at(Duration::from_secs(start));
            let p = Pipeline::builder(unique("time-window-gap"))
                .circuit_breaker(
                    CircuitBreaker::failure_rate(0.5)
                        .window(secs(10))
                        .minimum_calls(4),
                )
                .clock(clock.clone())
                .build()
                .unwrap();
            // A call in every second of the window.
            for _ in 0..10 {
                assert_eq!(p.call(ok).unwrap(), 1);
                clock.advance(secs(1));
            }
            clock.advance(secs(gap));
            for _ in 0..3 {
                assert!(p.call(boom).is_err());
            }
            let m = p.circuit_metrics().unwrap();
            assert_eq!(
                (m.state, m.calls, m.failures),
                (CircuitState::Closed, 3, 3),
                "gap {gap} s from {start} s"
            );
            assert!(p.call(boom).is_err());
            assert_eq!(
                p.circuit_state().unwrap(),
                CircuitState::Open,
                "gap {gap} s from {start} s"
            );
        }
    }
}

#[test]
fn an_open_circuit_reads_open_after_its_cooldown_until_a_call_half_opens_it() {
    for flavor in FLAVORS {
        for offset in [Duration::ZERO, FAR] {
            let clock = support::clock_at(offset);
            let p = Pipeline::builder(unique("open-read"))
                .circuit_breaker(
                    CircuitBreaker::consecutive_failures(1)
                        .cooldown(secs(10))
                        .half_open_calls(2),
                )
                .clock(clock.clone())
                .build()
                .unwrap();
            assert!(matches!(exec(&p, flavor, boom), Err(Error::Operation(_))));
            clock.advance(secs(25));
            let m = p.circuit_metrics().unwrap();
            assert_eq!(m.state, CircuitState::Open);
            assert_eq!(m.time_in_state, secs(25));
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
            assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
            let m = p.circuit_metrics().unwrap();
            assert_eq!(m.state, CircuitState::HalfOpen);
            assert_eq!(m.time_in_state, Duration::ZERO);
        }
    }
}

#[test]
fn a_call_that_never_ends_records_nothing_and_gives_a_probe_slot_back() {
    use std::future::Future;
    use std::task::{Context as TaskContext, Poll, Waker};

    // Starts a call whose operation never answers, polls it once, drops it.
    fn abandon(p: &Pipeline, flavor: Flavor) {
        match flavor {
            Flavor::Async => {
                let fut = p.run(|_| std::future::pending::<Result<u32, Boom>>());
                let mut fut = std::pin::pin!(fut);
                let mut cx = TaskContext::from_waker(Waker::noop());
                assert!(matches!(fut.as_mut().poll(&mut cx), Poll::Pending));
            }
            Flavor::Sync => {
                let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let _ = p.call(|_| -> Result<u32, Boom> { panic!("the operation panics") });
                }));
                assert!(caught.is_err());
            }
        }
    }

    for flavor in FLAVORS {
        for offset in [Duration::ZERO, FAR] {
            let clock = support::clock_at(offset);
            let p = Pipeline::builder(unique("never-ends"))
                .circuit_breaker(
                    CircuitBreaker::failure_rate(0.5)
                        .count_window(4)
                        .minimum_calls(2)
                        .cooldown(secs(5))
                        .half_open_calls(1),
                )
                .clock(clock.clone())
                .build()
                .unwrap();
            for _ in 0..5 {
                abandon(&p, flavor);
            }
            let m = p.circuit_metrics().unwrap();
            assert_eq!((m.state, m.calls), (CircuitState::Closed, 0));
            // Trip it, then abandon the probe: the next call is the probe.
            for _ in 0..2 {
                assert!(matches!(exec(&p, flavor, boom), Err(Error::Operation(_))));
            }
            clock.advance(secs(5));
            abandon(&p, flavor);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::HalfOpen);
            assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
        }
    }
}
