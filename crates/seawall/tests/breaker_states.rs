//! The breaker's other states through pipelines on the memory store, on
//! the virtual clock: opened for an explicit duration (`open_for`), a
//! limit on the time a round of probes may block the next one
//! (`max_half_open`), and the disabled state switched on and off
//! (`disable`, `enable`). Sync and async, clocks at 0 and at 10^6 s,
//! unpartitioned and in a partition.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use seawall::breaker::CircuitState;
use seawall::{CircuitBreaker, ConfigError, Error, EventKind, Pipeline, RejectionReason};
use support::{exec, recorder, secs, unique, Boom, FAR, FLAVORS};

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
        // Nothing recorded (a consecutive-mode circuit shows its failures in
        // a row only while closed).
        assert_eq!((m.state, m.failures), (CircuitState::Disabled, 0));
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
