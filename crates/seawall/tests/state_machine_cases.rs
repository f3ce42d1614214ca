//! State-machine cases of the stateful policies, call by call, on the
//! default path users run: the memory store, no listener (a listener
//! variant where the events are the point), the virtual clock started far
//! from 0, sync and async where both exist.
//!
//! - circuit breaker: when a window opens (failure rate, slow-call rate,
//!   minimum calls, count and time windows), the cooldown and its growth,
//!   the exact number of half-open probes, ignored errors, what a probe's
//!   outcome does, the isolated, disabled and shadow states, an explicit
//!   open for a duration, a limit on a round of probes, resets and the
//!   counts shown in each state;
//! - bulkhead: the exact number of calls in flight, a bounded wait for a
//!   slot, no wait at all;
//! - rate limiter: permits per period, the wait for a permit within
//!   `max_wait`, reservations, weighted calls;
//! - retry: the number of attempts, the delays of each backoff, what is
//!   not retried;
//! - timeout: a late attempt is cut at its deadline, a timely one is not.
//!
//! Where seawall departs on purpose from what other libraries do, the test
//! asserts seawall's documented behaviour and says so.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seawall::breaker::{CircuitMetrics, CircuitState};
use seawall::testing::VirtualClock;
use seawall::{
    Bulkhead, CircuitBreaker, Context, Error, EventKind, Jitter, Pipeline, RateLimiter,
    RejectionReason, Retry, Verdict,
};
use support::{
    clock_at, exec, ms, recorder, refusal, rt, secs, unique, Boom, Flavor, FAR, FLAVORS,
};

fn ok(_: Context) -> Result<u32, Boom> {
    Ok(1)
}

fn boom(_: Context) -> Result<u32, Boom> {
    Err(Boom(1))
}

/// An error the classifier of [`ignoring`] ignores.
fn ignored(_: Context) -> Result<u32, Boom> {
    Err(Boom(0))
}

/// `Boom(0)` is ignored, every other error is a failure.
fn ignoring(e: &Boom) -> Verdict {
    if e.0 == 0 {
        Verdict::ignore()
    } else {
        Verdict::failure()
    }
}

/// `n` calls of `p` on `flavor`, each answered by the operation.
fn admits<K: seawall::pipeline::HandlesSync<u32, Boom>>(p: &Pipeline<K>, flavor: Flavor, n: u32) {
    for _ in 0..n {
        assert_eq!(exec(p, flavor, ok).unwrap(), 1, "{flavor:?}");
    }
}

fn counts(m: &CircuitMetrics) -> (CircuitState, u64, u64, u64) {
    (m.state, m.calls, m.failures, m.slow_calls)
}

/// Opens the circuit of `p` with failures (its breaker opens on `n`).
fn trip(p: &Pipeline<impl seawall::pipeline::HandlesSync<u32, Boom>>, n: u32) {
    for _ in 0..n {
        let _ = p.call(boom);
    }
    assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
}

mod circuit_breaker {
    use super::*;

    /// A count window of 5, judged from 5 calls at a 50 % failure rate,
    /// 4 probes, a 5 s cooldown.
    fn window_of_five() -> CircuitBreaker {
        CircuitBreaker::failure_rate(0.5)
            .count_window(5)
            .minimum_calls(5)
            .half_open_calls(4)
            .cooldown(secs(5))
    }

    #[test]
    fn a_window_opens_on_the_failure_that_brings_the_rate_to_the_threshold() {
        for flavor in FLAVORS {
            let p = Pipeline::builder(unique("rate"))
                .circuit_breaker(window_of_five())
                .clock(clock_at(FAR))
                .build()
                .unwrap();
            for (i, op) in [ok, ok, boom, boom].into_iter().enumerate() {
                let _ = exec(&p, flavor, op);
                let m = p.circuit_metrics().unwrap();
                assert_eq!(m.state, CircuitState::Closed, "{flavor:?} call {i}");
                assert_eq!(m.calls, i as u64 + 1);
            }
            let _ = exec(&p, flavor, boom);
            let m = p.circuit_metrics().unwrap();
            assert_eq!(counts(&m), (CircuitState::Open, 5, 3, 0), "{flavor:?}");
            assert!((m.failure_rate - 0.6).abs() < 1e-9);
            assert_eq!(m.trips, 1);
            let refused = exec(&p, flavor, ok);
            assert_eq!(
                refusal(&refused),
                Some((RejectionReason::CircuitOpen, Some(secs(5))))
            );
            // A refused call is not counted in the window.
            assert_eq!(counts(&p.circuit_metrics().unwrap()).1, 5);
        }
    }

    /// Departure: the rates are judged when a failed or slow call is
    /// recorded, so a window whose minimum is reached by a success stays
    /// closed until its next failure (documented on
    /// `CircuitBreaker::failure_rate`).
    #[test]
    fn a_success_that_completes_the_minimum_does_not_open_the_window() {
        for flavor in FLAVORS {
            let p = Pipeline::builder(unique("success-completes"))
                .circuit_breaker(window_of_five())
                .clock(clock_at(FAR))
                .build()
                .unwrap();
            for op in [boom, boom, boom, ok, ok] {
                let _ = exec(&p, flavor, op);
            }
            let m = p.circuit_metrics().unwrap();
            assert_eq!(counts(&m), (CircuitState::Closed, 5, 3, 0), "{flavor:?}");
            // The next failure is judged: 3 of the last 5 failed.
            let _ = exec(&p, flavor, boom);
            let m = p.circuit_metrics().unwrap();
            assert_eq!(counts(&m), (CircuitState::Open, 5, 3, 0), "{flavor:?}");
        }
    }

    #[test]
    fn below_the_minimum_calls_no_rate_opens_the_window() {
        for flavor in FLAVORS {
            let p = Pipeline::builder(unique("minimum"))
                .circuit_breaker(window_of_five())
                .clock(clock_at(FAR))
                .build()
                .unwrap();
            for _ in 0..4 {
                let _ = exec(&p, flavor, boom);
            }
            let m = p.circuit_metrics().unwrap();
            assert_eq!(counts(&m), (CircuitState::Closed, 4, 4, 0), "{flavor:?}");
            assert_eq!(m.failure_rate, 1.0);
            let _ = exec(&p, flavor, boom);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
        }
    }

    #[test]
    fn slow_calls_open_the_window_at_the_slow_call_rate_whatever_the_failures() {
        for flavor in FLAVORS {
            let clock = clock_at(FAR);
            let p = Pipeline::builder(unique("slow"))
                .circuit_breaker(window_of_five().slow_calls(0.5, secs(4)))
                .clock(clock.clone())
                .build()
                .unwrap();
            let taking = |d: Duration, fail: bool| {
                let clock = clock.clone();
                move |_: Context| {
                    clock.advance(d);
                    if fail {
                        Err(Boom(1))
                    } else {
                        Ok(1)
                    }
                }
            };
            let _ = exec(&p, flavor, taking(secs(5), true));
            let _ = exec(&p, flavor, taking(secs(5), false));
            let _ = exec(&p, flavor, taking(ms(100), true));
            let _ = exec(&p, flavor, taking(ms(100), false));
            let m = p.circuit_metrics().unwrap();
            assert_eq!(counts(&m), (CircuitState::Closed, 4, 2, 2), "{flavor:?}");
            // A call of exactly the slow-call duration is slow.
            let _ = exec(&p, flavor, taking(secs(4), false));
            let m = p.circuit_metrics().unwrap();
            assert_eq!(counts(&m), (CircuitState::Open, 5, 2, 3), "{flavor:?}");
            assert!((m.slow_call_rate - 0.6).abs() < 1e-9);
            assert!((m.failure_rate - 0.4).abs() < 1e-9);
        }
    }

    #[test]
    fn a_time_window_forgets_the_calls_older_than_its_length() {
        for flavor in FLAVORS {
            let clock = clock_at(FAR);
            let p = Pipeline::builder(unique("time-window"))
                .circuit_breaker(
                    CircuitBreaker::failure_rate(0.5)
                        .window(secs(5))
                        .minimum_calls(5),
                )
                .clock(clock.clone())
                .build()
                .unwrap();
            for op in [ok, ok, ok, boom, boom] {
                let _ = exec(&p, flavor, op);
                clock.advance(secs(1));
            }
            // The first success is 5 s old: out of the window.
            let m = p.circuit_metrics().unwrap();
            assert_eq!(counts(&m), (CircuitState::Closed, 4, 2, 0), "{flavor:?}");
            let _ = exec(&p, flavor, boom);
            let m = p.circuit_metrics().unwrap();
            assert_eq!(counts(&m), (CircuitState::Open, 5, 3, 0), "{flavor:?}");
        }
    }

    #[test]
    fn an_open_circuit_refuses_until_its_cooldown_ends_then_probes() {
        for flavor in FLAVORS {
            let clock = clock_at(FAR);
            let p = Pipeline::builder(unique("cooldown"))
                .circuit_breaker(window_of_five())
                .clock(clock.clone())
                .build()
                .unwrap();
            trip(&p, 5);
            clock.advance(secs(3));
            assert_eq!(
                refusal(&exec(&p, flavor, ok)),
                Some((RejectionReason::CircuitOpen, Some(secs(2))))
            );
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
            clock.advance(secs(2));
            assert_eq!(exec(&p, flavor, ok).unwrap(), 1, "{flavor:?}");
            let m = p.circuit_metrics().unwrap();
            // Half-open counts only its probes.
            assert_eq!(counts(&m), (CircuitState::HalfOpen, 1, 0, 0), "{flavor:?}");
            assert_eq!(m.time_in_state, Duration::ZERO);
        }
    }

    #[test]
    fn a_growing_cooldown_lengthens_after_each_failed_probe() {
        for flavor in FLAVORS {
            let clock = clock_at(FAR);
            let p = Pipeline::builder(unique("growing"))
                .circuit_breaker(
                    CircuitBreaker::consecutive_failures(1)
                        .cooldown(secs(5))
                        .cooldown_growth(1.5, secs(60)),
                )
                .clock(clock.clone())
                .build()
                .unwrap();
            let _ = exec(&p, flavor, boom);
            assert_eq!(
                refusal(&exec(&p, flavor, ok)),
                Some((RejectionReason::CircuitOpen, Some(secs(5))))
            );
            clock.advance(secs(5));
            let _ = exec(&p, flavor, boom); // the probe fails
            assert_eq!(
                refusal(&exec(&p, flavor, ok)),
                Some((RejectionReason::CircuitOpen, Some(ms(7500))))
            );
            clock.advance(ms(7499));
            assert!(refusal(&exec(&p, flavor, ok)).is_some());
            clock.advance(ms(1));
            let _ = exec(&p, flavor, boom);
            assert_eq!(
                refusal(&exec(&p, flavor, ok)),
                Some((RejectionReason::CircuitOpen, Some(ms(11250))))
            );
            assert_eq!(p.circuit_metrics().unwrap().trips, 3);
            // A success closes and forgets the growth.
            clock.advance(ms(11250));
            assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            let _ = exec(&p, flavor, boom);
            assert_eq!(
                refusal(&exec(&p, flavor, ok)),
                Some((RejectionReason::CircuitOpen, Some(secs(5))))
            );
        }
    }

    #[test]
    fn an_isolated_circuit_refuses_past_any_cooldown_until_reset() {
        for flavor in FLAVORS {
            let clock = clock_at(FAR);
            let p = Pipeline::builder(unique("isolated"))
                .circuit_breaker(window_of_five())
                .clock(clock.clone())
                .build()
                .unwrap();
            p.isolate().unwrap();
            assert_eq!(
                refusal(&exec(&p, flavor, ok)),
                Some((RejectionReason::CircuitOpen, None))
            );
            clock.advance(secs(6));
            assert_eq!(
                refusal(&exec(&p, flavor, ok)),
                Some((RejectionReason::CircuitOpen, None))
            );
            let m = p.circuit_metrics().unwrap();
            assert_eq!(counts(&m), (CircuitState::Isolated, 0, 0, 0));
            p.reset().unwrap();
            assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
            assert_eq!(
                counts(&p.circuit_metrics().unwrap()),
                (CircuitState::Closed, 1, 0, 0)
            );
        }
    }

    #[test]
    fn open_for_refuses_for_that_long_whatever_the_cooldown() {
        for flavor in FLAVORS {
            let clock = clock_at(FAR);
            let p = Pipeline::builder(unique("open-for"))
                .circuit_breaker(window_of_five())
                .clock(clock.clone())
                .build()
                .unwrap();
            p.open_for(secs(7200)).unwrap();
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
            assert_eq!(
                refusal(&exec(&p, flavor, ok)),
                Some((RejectionReason::CircuitOpen, Some(secs(7200))))
            );
            clock.advance(secs(3600));
            assert_eq!(
                refusal(&exec(&p, flavor, ok)),
                Some((RejectionReason::CircuitOpen, Some(secs(3600))))
            );
            assert_eq!(
                counts(&p.circuit_metrics().unwrap()),
                (CircuitState::Open, 0, 0, 0)
            );
            clock.advance(secs(3600));
            assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
            assert_eq!(
                counts(&p.circuit_metrics().unwrap()),
                (CircuitState::HalfOpen, 1, 0, 0)
            );
            // A shorter open replaces a longer one.
            p.open_for(secs(30)).unwrap();
            p.open_for(secs(10)).unwrap();
            assert_eq!(
                refusal(&exec(&p, flavor, ok)),
                Some((RejectionReason::CircuitOpen, Some(secs(10))))
            );
        }
    }

    #[test]
    fn a_half_open_circuit_admits_exactly_the_configured_probes() {
        let clock = clock_at(FAR);
        let p = Pipeline::builder(unique("probes"))
            .circuit_breaker(window_of_five())
            .classify(ignoring)
            .clock(clock.clone())
            .build()
            .unwrap();
        p.open_for(secs(5)).unwrap();
        clock.advance(secs(5));
        rt().block_on(async {
            let mut gates = Vec::new();
            let mut probes = Vec::new();
            for _ in 0..4 {
                let (tx, rx) = tokio::sync::oneshot::channel::<Result<u32, Boom>>();
                gates.push(tx);
                let p = p.clone();
                probes.push(tokio::spawn(async move {
                    {
                        let mut rx = Some(rx);
                        p.run(move |_| {
                            let rx = rx.take().expect("one attempt");
                            async move { rx.await.unwrap() }
                        })
                        .await
                    }
                }));
            }
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            assert_eq!(p.circuit_state().unwrap(), CircuitState::HalfOpen);
            // Every probe slot is taken: refused, the cooldown as a hint.
            let r = p.run(|_| async { Ok::<u32, Boom>(1) }).await;
            assert_eq!(
                refusal(&r),
                Some((RejectionReason::CircuitOpen, Some(secs(5))))
            );
            // An ignored error gives its slot back: one more probe.
            gates.remove(0).send(Err(Boom(0))).unwrap();
            assert!(matches!(
                probes.remove(0).await.unwrap(),
                Err(Error::Operation(Boom(0)))
            ));
            assert_eq!(p.circuit_state().unwrap(), CircuitState::HalfOpen);
            assert_eq!(p.circuit_metrics().unwrap().calls, 0);
            assert_eq!(p.run(|_| async { Ok::<u32, Boom>(1) }).await.unwrap(), 1);
            let r = p.run(|_| async { Ok::<u32, Boom>(1) }).await;
            assert!(refusal(&r).is_some());
            // The other three succeed: four successes close.
            for gate in gates {
                gate.send(Ok(1)).unwrap();
            }
            for probe in probes {
                assert_eq!(probe.await.unwrap().unwrap(), 1);
            }
        });
        let m = p.circuit_metrics().unwrap();
        assert_eq!(counts(&m), (CircuitState::Closed, 0, 0, 0));
        assert_eq!(m.trips, 0);
    }

    #[test]
    fn ignored_errors_in_half_open_count_for_nothing() {
        for flavor in FLAVORS {
            let clock = clock_at(FAR);
            let p = Pipeline::builder(unique("ignored-probes"))
                .circuit_breaker(window_of_five())
                .classify(ignoring)
                .clock(clock.clone())
                .build()
                .unwrap();
            p.open_for(secs(5)).unwrap();
            clock.advance(secs(5));
            for _ in 0..4 {
                assert!(matches!(
                    exec(&p, flavor, ignored),
                    Err(Error::Operation(Boom(0)))
                ));
                assert_eq!(
                    counts(&p.circuit_metrics().unwrap()),
                    (CircuitState::HalfOpen, 0, 0, 0),
                    "{flavor:?}"
                );
            }
            for i in 1..4 {
                let _ = exec(&p, flavor, ok);
                assert_eq!(
                    counts(&p.circuit_metrics().unwrap()),
                    (CircuitState::HalfOpen, i, 0, 0)
                );
            }
            let _ = exec(&p, flavor, ok);
            assert_eq!(
                counts(&p.circuit_metrics().unwrap()),
                (CircuitState::Closed, 0, 0, 0),
                "{flavor:?}"
            );
            // The closed circuit starts a fresh window.
            let _ = exec(&p, flavor, ok);
            assert_eq!(
                counts(&p.circuit_metrics().unwrap()),
                (CircuitState::Closed, 1, 0, 0)
            );
        }
    }

    #[test]
    fn a_probe_judged_healthy_closes_and_one_not_counted_gives_its_slot_back() {
        let verdicts = [
            (Verdict::abort(), CircuitState::Closed),
            (Verdict::ignore(), CircuitState::HalfOpen),
            (Verdict::throttled(), CircuitState::HalfOpen),
            (
                Verdict::throttled().with_retry_after(secs(1)),
                CircuitState::HalfOpen,
            ),
        ];
        for flavor in FLAVORS {
            for (verdict, after) in verdicts {
                let clock = clock_at(FAR);
                let p = Pipeline::builder(unique("probe-verdicts"))
                    .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(5)))
                    .classify(move |_: &Boom| verdict)
                    .clock(clock.clone())
                    .build()
                    .unwrap();
                p.open_for(secs(5)).unwrap();
                clock.advance(secs(5));
                assert!(matches!(
                    exec(&p, flavor, boom),
                    Err(Error::Operation(Boom(1)))
                ));
                assert_eq!(p.circuit_state().unwrap(), after, "{flavor:?} {verdict:?}");
                // The single probe slot is free again (or the circuit closed).
                assert_eq!(exec(&p, flavor, ok).unwrap(), 1, "{flavor:?} {verdict:?}");
                assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            }
        }
    }

    /// Departure: every probe must succeed. A failed probe opens the circuit
    /// again at once, where a rate over the round of probes would have
    /// closed it (documented on `CircuitBreaker::half_open_calls`).
    #[test]
    fn one_failed_probe_opens_the_circuit_again_at_once() {
        for flavor in FLAVORS {
            let clock = clock_at(FAR);
            let p = Pipeline::builder(unique("failed-probe"))
                .circuit_breaker(window_of_five())
                .classify(ignoring)
                .clock(clock.clone())
                .build()
                .unwrap();
            trip(&p, 5);
            clock.advance(secs(5));
            for _ in 0..3 {
                let _ = exec(&p, flavor, ok);
            }
            let _ = exec(&p, flavor, ignored);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::HalfOpen);
            let _ = exec(&p, flavor, boom);
            let m = p.circuit_metrics().unwrap();
            // The probes' counts end with the trip.
            assert_eq!(counts(&m), (CircuitState::Open, 0, 0, 0), "{flavor:?}");
            assert_eq!(m.trips, 2);
        }
    }

    #[test]
    fn a_slow_probe_opens_the_circuit_again() {
        for flavor in FLAVORS {
            let clock = clock_at(FAR);
            let p = Pipeline::builder(unique("slow-probe"))
                .circuit_breaker(window_of_five().slow_calls(0.5, secs(4)))
                .clock(clock.clone())
                .build()
                .unwrap();
            p.open_for(secs(5)).unwrap();
            clock.advance(secs(5));
            let c = clock.clone();
            let r = exec(&p, flavor, move |_| {
                c.advance(secs(5));
                Ok::<u32, Boom>(1)
            });
            assert_eq!(r.unwrap(), 1, "a slow success is still the caller's");
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Open, "{flavor:?}");
        }
    }

    #[test]
    fn a_reset_closes_with_an_empty_window() {
        for flavor in FLAVORS {
            let p = Pipeline::builder(unique("reset"))
                .circuit_breaker(window_of_five())
                .clock(clock_at(FAR))
                .build()
                .unwrap();
            let _ = exec(&p, flavor, ok);
            let _ = exec(&p, flavor, boom);
            assert_eq!(
                counts(&p.circuit_metrics().unwrap()),
                (CircuitState::Closed, 2, 1, 0)
            );
            p.reset().unwrap();
            assert_eq!(
                counts(&p.circuit_metrics().unwrap()),
                (CircuitState::Closed, 0, 0, 0)
            );
            trip(&p, 5);
            p.reset().unwrap();
            let m = p.circuit_metrics().unwrap();
            assert_eq!(counts(&m), (CircuitState::Closed, 0, 0, 0));
            assert_eq!(m.trips, 0);
        }
    }

    #[test]
    fn a_disabled_circuit_admits_everything_and_records_nothing() {
        for flavor in FLAVORS {
            let clock = clock_at(FAR);
            let p = Pipeline::builder(unique("disabled"))
                .circuit_breaker(window_of_five())
                .clock(clock.clone())
                .build()
                .unwrap();
            let _ = exec(&p, flavor, ok);
            p.disable().unwrap();
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Disabled);
            for _ in 0..20 {
                assert!(matches!(
                    exec(&p, flavor, boom),
                    Err(Error::Operation(Boom(1)))
                ));
            }
            clock.advance(secs(60));
            assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
            // The window it had is still shown, nothing was added.
            assert_eq!(
                counts(&p.circuit_metrics().unwrap()),
                (CircuitState::Disabled, 1, 0, 0)
            );
            // Enabling closes afresh; enabling again changes nothing.
            p.enable().unwrap();
            p.enable().unwrap();
            assert_eq!(
                counts(&p.circuit_metrics().unwrap()),
                (CircuitState::Closed, 0, 0, 0)
            );
            trip(&p, 5);
            // Disabling an open circuit admits at once.
            p.disable().unwrap();
            assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
            // Enable leaves a circuit that is not disabled alone.
            p.enable().unwrap();
            p.isolate().unwrap();
            p.enable().unwrap();
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Isolated);
        }
    }

    #[test]
    fn repeating_a_control_reports_one_transition() {
        let (log, listener) = recorder();
        let clock = clock_at(FAR);
        let p = Pipeline::builder(unique("one-transition"))
            .circuit_breaker(window_of_five())
            .clock(clock.clone())
            .on_event(listener)
            .build()
            .unwrap();
        let transitions = || {
            log.lock()
                .unwrap()
                .iter()
                .filter(|k| {
                    matches!(
                        k,
                        EventKind::CircuitOpened { .. }
                            | EventKind::CircuitHalfOpened
                            | EventKind::CircuitClosed
                    )
                })
                .count()
        };
        p.isolate().unwrap();
        p.isolate().unwrap();
        assert_eq!(transitions(), 1);
        p.disable().unwrap();
        p.disable().unwrap();
        assert_eq!(transitions(), 2);
        p.enable().unwrap();
        p.enable().unwrap();
        assert_eq!(transitions(), 3);
        // A reset of a closed circuit reports nothing.
        p.reset().unwrap();
        assert_eq!(transitions(), 3);
    }

    /// Shadow mode keeps the state an enforcing circuit would keep and
    /// reports its refusals, but never refuses.
    #[test]
    fn a_circuit_in_shadow_mode_opens_and_reports_but_admits_every_call() {
        for flavor in FLAVORS {
            for listening in [false, true] {
                let clock = clock_at(FAR);
                let (log, listener) = recorder();
                let mut b = Pipeline::builder(unique("shadow"))
                    .circuit_breaker(window_of_five().shadow(true))
                    .clock(clock.clone());
                if listening {
                    b = b.on_event(listener);
                }
                let p = b.build().unwrap();
                for _ in 0..5 {
                    let _ = exec(&p, flavor, boom);
                }
                let m = p.circuit_metrics().unwrap();
                assert_eq!(counts(&m), (CircuitState::Open, 5, 5, 0));
                let calls = AtomicU32::new(0);
                for _ in 0..5 {
                    let r = exec(&p, flavor, |_| {
                        calls.fetch_add(1, Ordering::Relaxed);
                        Err::<u32, _>(Boom(1))
                    });
                    assert!(matches!(r, Err(Error::Operation(Boom(1)))));
                }
                assert_eq!(calls.load(Ordering::Relaxed), 5);
                // The would-be refused calls are not recorded.
                let m = p.circuit_metrics().unwrap();
                assert_eq!(counts(&m), (CircuitState::Open, 5, 5, 0));
                assert_eq!(m.trips, 1);
                if listening {
                    let log = log.lock().unwrap();
                    let opened = log
                        .iter()
                        .filter(|k| matches!(k, EventKind::CircuitOpened { .. }))
                        .count();
                    let shadowed = log
                        .iter()
                        .filter(|k| matches!(k, EventKind::ShadowRejected { .. }))
                        .count();
                    let rejected = log
                        .iter()
                        .filter(|k| matches!(k, EventKind::Rejected { .. }))
                        .count();
                    assert_eq!((opened, shadowed, rejected), (1, 5, 0), "{flavor:?}");
                }
                // After the cooldown it probes as an enforcing one would.
                clock.advance(secs(5));
                admits(&p, flavor, 4);
                assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            }
        }
    }

    /// Departure: a round of probes older than `max_half_open` gives way to
    /// a new round when a call finds every slot taken; the circuit does not
    /// open by itself (documented on `CircuitBreaker::max_half_open`).
    #[test]
    fn a_round_of_probes_older_than_its_limit_gives_way_to_a_new_round() {
        for listening in [false, true] {
            let clock = clock_at(FAR);
            let (log, listener) = recorder();
            let mut b = Pipeline::builder(unique("max-half-open"))
                .circuit_breaker(
                    CircuitBreaker::consecutive_failures(1)
                        .cooldown(secs(5))
                        .max_half_open(secs(1)),
                )
                .clock(clock.clone());
            if listening {
                b = b.on_event(listener);
            }
            let p = b.build().unwrap();
            p.open_for(secs(5)).unwrap();
            clock.advance(secs(5));
            rt().block_on(async {
                let (tx, rx) = tokio::sync::oneshot::channel::<Result<u32, Boom>>();
                let hanging = {
                    let p = p.clone();
                    tokio::spawn(async move {
                        {
                            let mut rx = Some(rx);
                            p.run(move |_| {
                                let rx = rx.take().expect("one attempt");
                                async move { rx.await.unwrap() }
                            })
                            .await
                        }
                    })
                };
                for _ in 0..10 {
                    tokio::task::yield_now().await;
                }
                assert_eq!(p.circuit_state().unwrap(), CircuitState::HalfOpen);
                clock.advance(ms(999));
                let r = p.run(|_| async { Ok::<u32, Boom>(1) }).await;
                assert!(refusal(&r).is_some(), "the round is not over");
                // Time alone does not move the circuit.
                clock.advance(secs(10));
                assert_eq!(p.circuit_state().unwrap(), CircuitState::HalfOpen);
                // The next call starts a new round and is its probe.
                let r = p.run(|_| async { Ok::<u32, Boom>(1) }).await;
                assert_eq!(r.unwrap(), 1);
                assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
                // The old probe's failure is ignored.
                tx.send(Err(Boom(1))).unwrap();
                assert!(hanging.await.unwrap().is_err());
                assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            });
            if listening {
                let log = log.lock().unwrap();
                assert_eq!(
                    log.iter()
                        .filter(|k| matches!(k, EventKind::CircuitProbesExpired))
                        .count(),
                    1
                );
            }
        }
    }

    #[test]
    fn settings_out_of_range_fail_build() {
        let refused = |b: CircuitBreaker| {
            Pipeline::builder(unique("invalid"))
                .circuit_breaker(b)
                .build()
                .err()
                .map(|e| e.field)
        };
        assert_eq!(
            refused(CircuitBreaker::failure_rate(0.0)),
            Some("failure_rate")
        );
        assert_eq!(
            refused(CircuitBreaker::failure_rate(1.01)),
            Some("failure_rate")
        );
        assert_eq!(
            refused(CircuitBreaker::failure_rate(0.5).slow_calls(0.0, secs(1))),
            Some("slow_call_rate")
        );
        assert_eq!(
            refused(CircuitBreaker::failure_rate(0.5).slow_calls(0.5, Duration::ZERO)),
            Some("slow_call_duration")
        );
        assert_eq!(
            refused(CircuitBreaker::failure_rate(0.5).cooldown(Duration::ZERO)),
            Some("cooldown")
        );
        assert_eq!(
            refused(CircuitBreaker::failure_rate(0.5).count_window(0)),
            Some("count_window")
        );
        assert_eq!(
            refused(CircuitBreaker::failure_rate(0.5).half_open_calls(0)),
            Some("half_open_calls")
        );
        assert_eq!(
            refused(CircuitBreaker::failure_rate(0.5).max_half_open(Duration::ZERO)),
            Some("max_half_open")
        );
        assert_eq!(
            refused(CircuitBreaker::failure_rate(0.5).cooldown_growth(0.5, secs(60))),
            Some("cooldown_growth")
        );
    }
}

mod rate_limiter {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::Poll;

    use super::*;

    fn limited(limiter: RateLimiter, clock: &VirtualClock) -> Pipeline {
        Pipeline::builder(unique("limited"))
            .rate_limiter(limiter)
            .clock(clock.clone())
            .build()
            .unwrap()
    }

    #[test]
    fn a_fixed_window_admits_its_limit_per_period_and_tells_the_wait() {
        for flavor in FLAVORS {
            let clock = clock_at(FAR);
            let p = limited(RateLimiter::fixed_window(3, secs(1)), &clock);
            admits(&p, flavor, 3);
            assert_eq!(
                refusal(&exec(&p, flavor, ok)),
                Some((RejectionReason::RateLimited, Some(secs(1))))
            );
            clock.advance(ms(999));
            assert_eq!(
                refusal(&exec(&p, flavor, ok)),
                Some((RejectionReason::RateLimited, Some(ms(1))))
            );
            clock.advance(ms(1));
            admits(&p, flavor, 3);
            assert!(refusal(&exec(&p, flavor, ok)).is_some());
            // Idle periods do not add up: still 3 per window.
            clock.advance(secs(10));
            admits(&p, flavor, 3);
            assert!(refusal(&exec(&p, flavor, ok)).is_some(), "{flavor:?}");
        }
    }

    #[test]
    fn gcra_admits_its_burst_then_one_permit_per_interval() {
        for flavor in FLAVORS {
            let clock = clock_at(FAR);
            let p = limited(RateLimiter::gcra(10, secs(1)), &clock);
            admits(&p, flavor, 10);
            assert_eq!(
                refusal(&exec(&p, flavor, ok)),
                Some((RejectionReason::RateLimited, Some(ms(100))))
            );
            clock.advance(ms(100));
            assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
            assert!(refusal(&exec(&p, flavor, ok)).is_some());
            // A long idle time gives back the burst, never more.
            clock.advance(secs(3600));
            admits(&p, flavor, 10);
            assert!(refusal(&exec(&p, flavor, ok)).is_some(), "{flavor:?}");
        }
    }

    #[test]
    fn a_call_waits_for_the_next_permit_when_max_wait_allows() {
        for flavor in FLAVORS {
            let clock = clock_at(FAR);
            let start = clock.now();
            let p = limited(
                RateLimiter::fixed_window(1, secs(1)).max_wait(secs(1)),
                &clock,
            );
            let ran_at = |clock: &VirtualClock| {
                let clock = clock.clone();
                move |_: Context| Ok::<Duration, Boom>(clock.now())
            };
            let at = |r: Result<Duration, Error<Boom>>| r.unwrap() - start;
            let run = |clock: &VirtualClock| match flavor {
                Flavor::Sync => p.call(ran_at(clock)),
                Flavor::Async => {
                    let op = ran_at(clock);
                    rt().block_on(p.run(move |ctx| std::future::ready(op(ctx))))
                }
            };
            assert_eq!(at(run(&clock)), Duration::ZERO);
            assert_eq!(at(run(&clock)), secs(1), "{flavor:?}");
            assert_eq!(at(run(&clock)), secs(2), "{flavor:?}");
        }
    }

    #[test]
    fn a_call_whose_wait_exceeds_max_wait_is_refused_at_once() {
        for flavor in FLAVORS {
            let clock = clock_at(FAR);
            let p = limited(
                RateLimiter::fixed_window(1, secs(1)).max_wait(ms(500)),
                &clock,
            );
            let start = clock.now();
            assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
            assert_eq!(
                refusal(&exec(&p, flavor, ok)),
                Some((RejectionReason::RateLimited, Some(secs(1))))
            );
            assert_eq!(clock.now(), start, "a refused call does not wait");
            clock.advance(ms(500));
            // Now the wait fits: the call waits 500 ms.
            assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
            assert_eq!(clock.now() - start, secs(1), "{flavor:?}");
        }
    }

    #[test]
    fn waiting_calls_reserve_their_permits_so_later_ones_are_refused_at_once() {
        let clock = clock_at(FAR);
        let p = limited(
            RateLimiter::fixed_window(1, ms(250)).max_wait(ms(250)),
            &clock,
        );
        let start = clock.now();
        let results = rt().block_on(async {
            let tasks: Vec<_> = (0..3)
                .map(|_| {
                    let p = p.clone();
                    let clock = clock.clone();
                    tokio::spawn(async move {
                        p.run(move |_| std::future::ready(Ok::<Duration, Boom>(clock.now())))
                            .await
                    })
                })
                .collect();
            let mut results = Vec::new();
            for t in tasks {
                results.push(t.await.unwrap());
            }
            results
        });
        assert_eq!(*results[0].as_ref().unwrap() - start, Duration::ZERO);
        assert_eq!(*results[1].as_ref().unwrap() - start, ms(250));
        match &results[2] {
            Err(Error::Rejected(r)) => {
                assert_eq!(r.reason, RejectionReason::RateLimited);
                assert_eq!(r.retry_after, Some(ms(500)));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_waiting_call_dropped_gives_its_permit_back() {
        let clock = clock_at(FAR);
        let p = limited(
            RateLimiter::fixed_window(1, secs(1)).max_wait(secs(1)),
            &clock,
        );
        let start = clock.now();
        assert_eq!(p.call(ok).unwrap(), 1);
        rt().block_on(async {
            let mut waiting: Pin<Box<dyn Future<Output = _>>> =
                Box::pin(p.run(|_| std::future::ready(Ok::<u32, Boom>(2))));
            let first = std::future::poll_fn(|cx| Poll::Ready(waiting.as_mut().poll(cx))).await;
            assert!(first.is_pending(), "the call waits for the next window");
            drop(waiting);
        });
        assert_eq!(clock.now(), start);
        // The permit of the next window is free again: a call waits for it
        // (1 s), not for the one after (2 s).
        assert_eq!(p.call(ok).unwrap(), 1);
        assert_eq!(clock.now() - start, secs(1));
    }

    /// One call of `p` on `flavor` taking `n` permits.
    fn weighted_call(p: &Pipeline, flavor: Flavor, n: u32) -> Result<u32, Error<Boom>> {
        let w = p.weighted(n).unwrap();
        match flavor {
            Flavor::Sync => w.call(ok),
            Flavor::Async => rt().block_on(w.run(|ctx| std::future::ready(ok(ctx)))),
        }
    }

    /// Departure: a weight that can never fit (more than the limit or the
    /// burst) is refused at once without a `retry_after`, not reserved
    /// over several periods (documented on `RateLimiter::grants`).
    #[test]
    fn weighted_calls_take_all_their_permits_or_none() {
        for flavor in FLAVORS {
            let clock = clock_at(FAR);
            let p = limited(RateLimiter::fixed_window(10, secs(1)), &clock);
            let weighted = |n: u32| weighted_call(&p, flavor, n);
            assert_eq!(weighted(4).unwrap(), 1);
            assert_eq!(weighted(4).unwrap(), 1);
            assert_eq!(
                refusal(&weighted(4)),
                Some((RejectionReason::RateLimited, Some(secs(1))))
            );
            assert_eq!(weighted(2).unwrap(), 1);
            assert!(refusal(&weighted(1)).is_some());
            assert_eq!(
                refusal(&weighted(11)),
                Some((RejectionReason::RateLimited, None))
            );
            clock.advance(secs(1));
            assert_eq!(weighted(10).unwrap(), 1);
            assert!(p.weighted(0).is_err());
        }
    }

    #[test]
    fn a_weighted_gcra_call_moves_the_rate_by_its_weight() {
        for flavor in FLAVORS {
            let clock = clock_at(FAR);
            let p = limited(RateLimiter::gcra(10, secs(1)), &clock);
            let weighted = |n: u32| weighted_call(&p, flavor, n);
            assert_eq!(weighted(10).unwrap(), 1);
            assert_eq!(
                refusal(&weighted(1)),
                Some((RejectionReason::RateLimited, Some(ms(100))))
            );
            assert_eq!(
                refusal(&weighted(3)),
                Some((RejectionReason::RateLimited, Some(ms(300))))
            );
            clock.advance(ms(300));
            assert_eq!(weighted(3).unwrap(), 1);
            assert!(refusal(&weighted(1)).is_some(), "{flavor:?}");
            assert_eq!(
                refusal(&weighted(11)),
                Some((RejectionReason::RateLimited, None))
            );
        }
    }

    #[test]
    fn a_weighted_call_waits_for_all_its_permits_within_max_wait() {
        let clock = clock_at(FAR);
        let p = limited(RateLimiter::gcra(10, secs(1)).max_wait(ms(500)), &clock);
        let start = clock.now();
        assert_eq!(p.weighted(10).unwrap().call(ok).unwrap(), 1);
        // 5 permits are 500 ms away: the wait fits exactly.
        assert_eq!(p.weighted(5).unwrap().call(ok).unwrap(), 1);
        assert_eq!(clock.now() - start, ms(500));
        // 6 more are 600 ms away: refused at once.
        let r = p.weighted(6).unwrap().call(ok);
        assert_eq!(
            refusal(&r),
            Some((RejectionReason::RateLimited, Some(ms(600))))
        );
        assert_eq!(clock.now() - start, ms(500));
    }

    #[test]
    fn a_dropped_weighted_waiter_gives_back_all_its_permits() {
        let limiters = [
            RateLimiter::gcra(10, secs(1)).max_wait(secs(1)),
            RateLimiter::fixed_window(10, secs(1)).max_wait(secs(1)),
            RateLimiter::sliding_window(10, secs(1)).max_wait(secs(1)),
        ];
        for limiter in limiters {
            let clock = clock_at(FAR);
            let p = limited(limiter.clone(), &clock);
            let start = clock.now();
            assert_eq!(p.weighted(10).unwrap().call(ok).unwrap(), 1);
            rt().block_on(async {
                let weighted = p.weighted(6).unwrap();
                let mut waiting: Pin<Box<dyn Future<Output = _>>> =
                    Box::pin(weighted.run(|_| std::future::ready(Ok::<u32, Boom>(2))));
                let first = std::future::poll_fn(|cx| Poll::Ready(waiting.as_mut().poll(cx))).await;
                assert!(first.is_pending(), "{limiter:?}");
            });
            assert_eq!(clock.now(), start);
            // All 10 permits of the next period are free again.
            assert_eq!(p.weighted(10).unwrap().call(ok).unwrap(), 1);
            assert_eq!(clock.now() - start, secs(1), "{limiter:?}");
        }
    }

    #[test]
    fn a_weighted_sliding_window_judges_the_entry_its_weight_reaches_back_to() {
        let clock = clock_at(FAR);
        let p = limited(
            RateLimiter::sliding_window(10, secs(1)).max_wait(secs(1)),
            &clock,
        );
        let start = clock.now();
        assert_eq!(p.weighted(4).unwrap().call(ok).unwrap(), 1);
        clock.advance(ms(500));
        assert_eq!(p.weighted(4).unwrap().call(ok).unwrap(), 1);
        // 4 more: they fit once the first 4 leave the window, at 1 s.
        assert_eq!(p.weighted(4).unwrap().call(ok).unwrap(), 1);
        assert_eq!(clock.now() - start, secs(1));
        // 6 more: once the 4 taken at 500 ms leave, at 1.5 s.
        assert_eq!(p.weighted(6).unwrap().call(ok).unwrap(), 1);
        assert_eq!(clock.now() - start, ms(1500));
    }

    #[test]
    fn a_limiter_in_shadow_mode_reports_and_admits_without_spending() {
        for flavor in FLAVORS {
            let clock = clock_at(FAR);
            let (log, listener) = recorder();
            let p = Pipeline::builder(unique("shadow-limiter"))
                .rate_limiter(RateLimiter::fixed_window(2, secs(1)).shadow(true))
                .clock(clock.clone())
                .on_event(listener)
                .build()
                .unwrap();
            admits(&p, flavor, 5);
            let shadowed = log
                .lock()
                .unwrap()
                .iter()
                .filter(|k| matches!(k, EventKind::ShadowRejected { .. }))
                .count();
            assert_eq!(shadowed, 3, "{flavor:?}");
        }
    }

    #[test]
    fn a_call_refused_by_the_circuit_spends_no_permit() {
        for flavor in FLAVORS {
            let clock = clock_at(FAR);
            let p = Pipeline::builder(unique("circuit-then-limit"))
                .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(5)))
                .rate_limiter(RateLimiter::fixed_window(2, secs(100)))
                .clock(clock.clone())
                .build()
                .unwrap();
            let _ = exec(&p, flavor, boom);
            for _ in 0..5 {
                assert_eq!(
                    refusal(&exec(&p, flavor, ok)).map(|r| r.0),
                    Some(RejectionReason::CircuitOpen)
                );
            }
            clock.advance(secs(5));
            assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
            assert_eq!(
                refusal(&exec(&p, flavor, ok)),
                Some((RejectionReason::RateLimited, Some(secs(95))))
            );
        }
    }

    #[test]
    fn settings_out_of_range_fail_build() {
        let refused = |l: RateLimiter| {
            Pipeline::builder(unique("invalid-limiter"))
                .rate_limiter(l)
                .build()
                .err()
                .map(|e| e.field)
        };
        assert_eq!(refused(RateLimiter::gcra(0, secs(1))), Some("limit"));
        assert_eq!(
            refused(RateLimiter::fixed_window(1, Duration::ZERO)),
            Some("period")
        );
        assert_eq!(
            refused(RateLimiter::fixed_window(1, secs(1)).burst(3)),
            Some("burst")
        );
    }
}

mod bulkhead {
    use super::*;

    /// The sender that ends a held call, and the call's task.
    type Held = (
        tokio::sync::oneshot::Sender<Result<u32, Boom>>,
        tokio::task::JoinHandle<Result<u32, Error<Boom>>>,
    );

    /// A call that holds its slot until its sender says how it ends.
    fn held(p: &Pipeline) -> Held {
        let (tx, rx) = tokio::sync::oneshot::channel::<Result<u32, Boom>>();
        let p = p.clone();
        let task = tokio::spawn(async move {
            let mut rx = Some(rx);
            p.run(move |_| {
                let rx = rx.take().expect("one attempt");
                async move { rx.await.unwrap() }
            })
            .await
        });
        (tx, task)
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[test]
    fn a_bulkhead_admits_exactly_its_limit_and_refuses_the_next_at_once() {
        let clock = clock_at(FAR);
        let p = Pipeline::builder(unique("bulkhead"))
            .bulkhead(Bulkhead::new(2))
            .clock(clock.clone())
            .build()
            .unwrap();
        rt().block_on(async {
            let (a, ta) = held(&p);
            let (b, tb) = held(&p);
            settle().await;
            assert_eq!(p.in_flight().unwrap(), 2);
            let r = p.run(|_| async { Ok::<u32, Boom>(1) }).await;
            assert_eq!(refusal(&r), Some((RejectionReason::BulkheadFull, None)));
            assert_eq!(
                refusal(&p.call(ok)),
                Some((RejectionReason::BulkheadFull, None))
            );
            // A failure gives its slot back as a success does.
            a.send(Err(Boom(1))).unwrap();
            assert!(ta.await.unwrap().is_err());
            assert_eq!(p.in_flight().unwrap(), 1);
            assert_eq!(p.call(ok).unwrap(), 1);
            b.send(Ok(2)).unwrap();
            assert_eq!(tb.await.unwrap().unwrap(), 2);
        });
        assert_eq!(p.in_flight().unwrap(), 0);
    }

    /// Runs calls `(arrives, holds)` concurrently on the virtual clock:
    /// each arrives `arrives` ms after the start and, once admitted, holds
    /// its slot `holds` ms. For each: when its operation started, or why it
    /// was refused and when, in ms from the start.
    fn plan(
        p: &Pipeline,
        clock: &VirtualClock,
        calls: &[(u64, u64)],
    ) -> Vec<Result<u64, (RejectionReason, u64)>> {
        let base = clock.now();
        let since = move |c: &VirtualClock| (c.now() - base).as_millis() as u64;
        rt().block_on(async {
            let tasks: Vec<_> = calls
                .iter()
                .map(|&(arrives, holds)| {
                    let (p, clock) = (p.clone(), clock.clone());
                    tokio::spawn(async move {
                        seawall::Clock::sleep(&clock, ms(arrives)).await;
                        let started = Arc::new(Mutex::new(None));
                        let s = started.clone();
                        let c = clock.clone();
                        let r = p
                            .run(move |_| {
                                let (clock, s) = (c.clone(), s.clone());
                                async move {
                                    *s.lock().unwrap() = Some(since(&clock));
                                    seawall::Clock::sleep(&clock, ms(holds)).await;
                                    Ok::<u32, Boom>(1)
                                }
                            })
                            .await;
                        match r {
                            Ok(_) => Ok(started.lock().unwrap().unwrap()),
                            Err(Error::Rejected(r)) => Err((r.reason, since(&clock))),
                            Err(other) => panic!("{other:?}"),
                        }
                    })
                })
                .collect();
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap());
            }
            out
        })
    }

    #[test]
    fn a_queued_call_takes_the_slot_given_back_within_its_max_wait() {
        let clock = clock_at(FAR);
        let p = Pipeline::builder(unique("queued"))
            .bulkhead(Bulkhead::new(1).queue(1, secs(1)))
            .clock(clock.clone())
            .build()
            .unwrap();
        let ran = plan(&p, &clock, &[(0, 500), (10, 0), (20, 0)]);
        // The second waits for the slot; the third finds the queue full.
        assert_eq!(
            ran,
            [Ok(0), Ok(500), Err((RejectionReason::BulkheadFull, 20))]
        );
        // Sync calls never wait.
        let clock = clock_at(FAR);
        let p = Pipeline::builder(unique("queued-sync"))
            .bulkhead(Bulkhead::new(1).queue(1, secs(1)))
            .clock(clock.clone())
            .build()
            .unwrap();
        rt().block_on(async {
            let (a, ta) = held(&p);
            settle().await;
            assert_eq!(
                refusal(&p.call(ok)),
                Some((RejectionReason::BulkheadFull, None))
            );
            a.send(Ok(1)).unwrap();
            assert_eq!(ta.await.unwrap().unwrap(), 1);
        });
    }

    #[test]
    fn a_queued_call_is_refused_when_its_max_wait_runs_out() {
        let clock = clock_at(FAR);
        let p = Pipeline::builder(unique("queue-timeout"))
            .bulkhead(Bulkhead::new(1).queue(4, secs(1)))
            .clock(clock.clone())
            .build()
            .unwrap();
        let ran = plan(&p, &clock, &[(0, 2000), (100, 0), (1100, 0)]);
        assert_eq!(
            ran,
            [Ok(0), Err((RejectionReason::BulkheadFull, 1100)), Ok(2000)]
        );
        assert_eq!(p.in_flight().unwrap(), 0);
        // A slot given back at the very end of the wait is still the waiter's.
        let ran = plan(&p, &clock, &[(0, 1000), (0, 0)]);
        assert_eq!(ran, [Ok(0), Ok(1000)]);
    }

    #[test]
    fn a_bulkhead_in_shadow_mode_never_queues_nor_refuses() {
        let clock = clock_at(FAR);
        let (log, listener) = recorder();
        let p = Pipeline::builder(unique("shadow-bulkhead"))
            .bulkhead(Bulkhead::new(1).queue(1, secs(1)).shadow(true))
            .clock(clock.clone())
            .on_event(listener)
            .build()
            .unwrap();
        let ran = plan(&p, &clock, &[(0, 500), (10, 0), (20, 0)]);
        assert_eq!(ran, [Ok(0), Ok(10), Ok(20)]);
        let log = log.lock().unwrap();
        let shadowed = log
            .iter()
            .filter(|k| matches!(k, EventKind::ShadowRejected { .. }))
            .count();
        assert_eq!(shadowed, 2);
        assert!(!log.iter().any(|k| matches!(k, EventKind::Deferred { .. })));
        drop(log);
        assert_eq!(p.in_flight().unwrap(), 0);
    }

    #[test]
    fn settings_out_of_range_fail_build() {
        let e = Pipeline::builder(unique("no-slot"))
            .bulkhead(Bulkhead::new(0))
            .build()
            .unwrap_err();
        assert_eq!(e.field, "max_concurrent");
        let e = Pipeline::builder(unique("no-wait"))
            .bulkhead(Bulkhead::new(1).queue(3, Duration::ZERO))
            .build()
            .unwrap_err();
        assert_eq!(e.field, "max_wait");
    }
}

mod retry {
    use super::*;

    /// Fails `failures` times, then succeeds; logs the clock at each attempt.
    fn flaky(
        clock: &VirtualClock,
        failures: u32,
        log: &Arc<Mutex<Vec<Duration>>>,
    ) -> impl FnMut(Context) -> Result<u32, Boom> {
        let (clock, log) = (clock.clone(), log.clone());
        let mut n = 0;
        move |_| {
            log.lock().unwrap().push(clock.now());
            n += 1;
            if n <= failures {
                Err(Boom(n))
            } else {
                Ok(n)
            }
        }
    }

    fn gaps(log: &Arc<Mutex<Vec<Duration>>>) -> Vec<Duration> {
        let log = log.lock().unwrap();
        log.windows(2).map(|w| w[1] - w[0]).collect()
    }

    #[test]
    fn retry_gives_up_after_max_attempts_with_the_last_error() {
        for flavor in FLAVORS {
            let clock = clock_at(FAR);
            let log = Arc::default();
            let p = Pipeline::builder(unique("attempts"))
                .retry(Retry::constant(ms(500)).max_attempts(3))
                .clock(clock.clone())
                .build()
                .unwrap();
            match exec(&p, flavor, flaky(&clock, 10, &log)) {
                Err(Error::RetryExhausted { attempts, last }) => {
                    assert_eq!((attempts, last), (3, Boom(3)), "{flavor:?}")
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(gaps(&log), [ms(500), ms(500)]);
        }
    }

    #[test]
    fn retry_returns_the_first_success() {
        for flavor in FLAVORS {
            let clock = clock_at(FAR);
            let log = Arc::default();
            let p = Pipeline::builder(unique("second"))
                .retry(Retry::constant(ms(500)).max_attempts(3))
                .clock(clock.clone())
                .build()
                .unwrap();
            assert_eq!(exec(&p, flavor, flaky(&clock, 1, &log)).unwrap(), 2);
            assert_eq!(log.lock().unwrap().len(), 2);
        }
    }

    #[test]
    fn max_attempts_of_one_makes_one_attempt() {
        for flavor in FLAVORS {
            let clock = clock_at(FAR);
            let log = Arc::default();
            let p = Pipeline::builder(unique("one"))
                .retry(Retry::constant(ms(500)).max_attempts(1))
                .clock(clock.clone())
                .build()
                .unwrap();
            let r = exec(&p, flavor, flaky(&clock, 10, &log));
            assert!(
                matches!(
                    r,
                    Err(Error::RetryExhausted { attempts: 1, .. }) | Err(Error::Operation(_))
                ),
                "{r:?}"
            );
            assert_eq!(log.lock().unwrap().len(), 1);
        }
        let e = Pipeline::builder(unique("zero"))
            .retry(Retry::constant(ms(500)).max_attempts(0))
            .build()
            .unwrap_err();
        assert_eq!(e.field, "max_attempts");
    }

    #[test]
    fn exponential_backoff_multiplies_each_delay_up_to_its_cap() {
        for flavor in FLAVORS {
            let clock = clock_at(FAR);
            let log = Arc::default();
            let p = Pipeline::builder(unique("exponential"))
                .retry(
                    Retry::exponential(ms(500))
                        .multiplier(1.5)
                        .cap(secs(1))
                        .max_attempts(5),
                )
                .clock(clock.clone())
                .build()
                .unwrap();
            let _ = exec(&p, flavor, flaky(&clock, 10, &log));
            assert_eq!(
                gaps(&log),
                [ms(500), ms(750), secs(1), secs(1)],
                "{flavor:?}"
            );
        }
    }

    #[test]
    fn linear_backoff_adds_the_base_each_time() {
        let clock = clock_at(FAR);
        let log = Arc::default();
        let p = Pipeline::builder(unique("linear"))
            .retry(Retry::linear(ms(100)).max_attempts(4))
            .clock(clock.clone())
            .build()
            .unwrap();
        let _ = p.call(flaky(&clock, 10, &log));
        assert_eq!(gaps(&log), [ms(100), ms(200), ms(300)]);
    }

    #[test]
    fn proportional_jitter_keeps_each_delay_within_its_band() {
        for draw in [0.0, 0.5, 0.999_999] {
            let clock = clock_at(FAR);
            let log = Arc::default();
            let p = Pipeline::builder(unique("jitter"))
                .retry(
                    Retry::constant(ms(1000))
                        .jitter(Jitter::Proportional(50.0))
                        .max_attempts(3),
                )
                .clock(clock.clone())
                .random(seawall::testing::SequenceRandom::new([draw]))
                .build()
                .unwrap();
            let _ = p.call(flaky(&clock, 10, &log));
            for gap in gaps(&log) {
                assert!(gap >= ms(500) && gap <= ms(1500), "{draw}: {gap:?}");
            }
        }
    }

    #[test]
    fn aborted_and_ignored_errors_are_not_retried() {
        for flavor in FLAVORS {
            for verdict in [Verdict::abort(), Verdict::ignore(), Verdict::failure()] {
                let clock = clock_at(FAR);
                let log = Arc::default();
                let p = Pipeline::builder(unique("not-retried"))
                    .retry(Retry::constant(ms(500)).max_attempts(3))
                    .classify(move |_: &Boom| verdict)
                    .clock(clock.clone())
                    .build()
                    .unwrap();
                let r = exec(&p, flavor, flaky(&clock, 10, &log));
                assert!(
                    matches!(r, Err(Error::Operation(Boom(1)))),
                    "{verdict:?}: {r:?}"
                );
                assert_eq!(log.lock().unwrap().len(), 1);
            }
        }
    }

    #[test]
    fn a_retry_after_hint_longer_than_the_backoff_is_waited() {
        let clock = clock_at(FAR);
        let log = Arc::default();
        let p = Pipeline::builder(unique("hint"))
            .retry(Retry::constant(ms(100)).max_attempts(2))
            .classify(|_: &Boom| Verdict::retry().with_retry_after(secs(3)))
            .clock(clock.clone())
            .build()
            .unwrap();
        let _ = p.call(flaky(&clock, 10, &log));
        assert_eq!(gaps(&log), [secs(3)]);
    }
}

mod timeout {
    use super::*;

    #[test]
    fn an_attempt_past_its_timeout_is_cut_at_the_deadline() {
        let clock = clock_at(FAR);
        let p = Pipeline::builder(unique("timeout"))
            .timeout(secs(1))
            .clock(clock.clone())
            .build()
            .unwrap();
        let start = clock.now();
        let r = rt().block_on(p.run(|_| {
            let clock = clock.clone();
            async move {
                seawall::Clock::sleep(&clock, secs(2)).await;
                Ok::<u32, Boom>(1)
            }
        }));
        assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
        assert_eq!(clock.now() - start, secs(1));
        let r = rt().block_on(p.run(|_| {
            let clock = clock.clone();
            async move {
                seawall::Clock::sleep(&clock, ms(999)).await;
                Ok::<u32, Boom>(1)
            }
        }));
        assert_eq!(r.unwrap(), 1);
    }

    #[test]
    fn a_late_sync_success_is_kept_and_reported_or_refused_when_strict() {
        for strict in [false, true] {
            let clock = clock_at(FAR);
            let (log, listener) = recorder();
            let timeout = if strict {
                seawall::Timeout::strict(secs(1))
            } else {
                seawall::Timeout::new(secs(1))
            };
            let p = Pipeline::builder(unique("sync-timeout"))
                .timeout(timeout)
                .clock(clock.clone())
                .on_event(listener)
                .build()
                .unwrap();
            let c = clock.clone();
            // At the deadline: on time.
            let r = p.call(move |_| {
                c.advance(secs(1));
                Ok::<u32, Boom>(1)
            });
            assert_eq!(r.unwrap(), 1, "strict {strict}");
            let c = clock.clone();
            let r = p.call(move |_| {
                c.advance(ms(1500));
                Ok::<u32, Boom>(1)
            });
            if strict {
                assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
            } else {
                assert_eq!(r.unwrap(), 1);
                assert!(log
                    .lock()
                    .unwrap()
                    .contains(&EventKind::DeadlineExceeded { late_by: ms(500) }));
            }
        }
    }

    #[test]
    fn each_attempt_has_its_own_timeout_after_the_retry() {
        let clock = clock_at(FAR);
        let attempts = Arc::new(AtomicU32::new(0));
        let p = Pipeline::builder(unique("attempt-timeout"))
            .retry(Retry::constant(ms(100)).max_attempts(3))
            .timeout(secs(1))
            .clock(clock.clone())
            .build()
            .unwrap();
        let (a, c) = (attempts.clone(), clock.clone());
        let r = rt().block_on(p.run(move |_| {
            let clock = c.clone();
            let n = a.fetch_add(1, Ordering::Relaxed);
            async move {
                if n < 2 {
                    seawall::Clock::sleep(&clock, secs(5)).await;
                }
                Ok::<u32, Boom>(n)
            }
        }));
        assert_eq!(r.unwrap(), 2);
        assert_eq!(attempts.load(Ordering::Relaxed), 3);
        // Two attempts cut at 1 s each, two waits of 100 ms.
        assert_eq!(clock.now() - FAR, ms(2200));
    }
}
