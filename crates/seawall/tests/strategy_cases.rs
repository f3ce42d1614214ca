//! Behaviour every strategy promises a demanding user, case by case:
//! hedging (modes, the dynamic generator, the hook, which answer wins and
//! which one a call that failed everywhere returns), chaos (the rate, the
//! rate generator's clamping, the switch, what each injection replaces),
//! the circuit breaker's manual controls and state (isolate, `open_for`,
//! disable/enable, half-open probes, the window's minimum calls), the
//! retry's delays (attempt count, backoff sequences, the cap, jitter
//! bounds, the retry-after hint), timeouts, the fallback and the rate
//! limiter's refusals.
//!
//! Each case runs on the path users run: no listener (and with one where
//! events matter), on a virtual clock started far from 0, sync and async
//! where both exist.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seawall::chaos::{Chaos, ChaosKind, ChaosSwitch};
use seawall::hedge::HedgeDelay;
use seawall::store::MemoryStore;
use seawall::testing::{SequenceRandom, VirtualClock};
use seawall::*;
use support::{clock_at, count, ms, recorder, rt, secs, unique, Boom, Flavor, Log, FAR, FLAVORS};

/// A builder on a fresh store and a virtual clock at [`FAR`], with a
/// listener recording events when `listen`.
fn builder(name: &str, listen: bool) -> (PipelineBuilder, VirtualClock, Log) {
    let clock = clock_at(FAR);
    let mut b = Pipeline::builder(unique(name))
        .store(MemoryStore::new())
        .clock(clock.clone());
    let (log, listener) = recorder();
    if listen {
        b = b.on_event(listener);
    }
    (b, clock, log)
}

/// An operation that answers after a second on `clock`: `Ok(1)` when
/// `ok`, else `Boom(1)`.
async fn after_a_second(clock: VirtualClock, ok: bool) -> Result<u32, Boom> {
    Clock::sleep(&clock, secs(1)).await;
    if ok {
        Ok(1)
    } else {
        Err(Boom(1))
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    rt().block_on(f)
}

mod hedging {
    use super::*;

    /// What attempt `n` does: answers `result` after `after` (never, for
    /// `None`).
    #[derive(Clone)]
    struct Plan {
        after: Option<Duration>,
        result: Result<u32, Boom>,
    }

    fn ok(after: u64, v: u32) -> Plan {
        Plan {
            after: Some(ms(after)),
            result: Ok(v),
        }
    }

    fn fail(after: u64, e: u32) -> Plan {
        Plan {
            after: Some(ms(after)),
            result: Err(Boom(e)),
        }
    }

    #[derive(Default)]
    struct Seen {
        /// (attempt, time since the call started) of each attempt started.
        started: Mutex<Vec<(u32, Duration)>>,
        /// The most attempts running at once.
        most: AtomicU32,
        running: AtomicU32,
        /// Attempts dropped before they answered.
        dropped: Mutex<Vec<u32>>,
    }

    struct Running<'a> {
        seen: &'a Seen,
        attempt: u32,
        done: bool,
    }

    impl Drop for Running<'_> {
        fn drop(&mut self) {
            self.seen.running.fetch_sub(1, Ordering::SeqCst);
            if !self.done {
                self.seen.dropped.lock().unwrap().push(self.attempt);
            }
        }
    }

    async fn call<K>(
        p: &Pipeline<K>,
        clock: &VirtualClock,
        seen: &Arc<Seen>,
        plans: &[Plan],
    ) -> Result<u32, Error<Boom>>
    where
        K: seawall::pipeline::Handles<u32, Boom>,
    {
        let start = clock.now();
        p.run(|ctx: Context| {
            let attempt = ctx.attempt();
            let plan = plans[attempt as usize - 1].clone();
            let clock = clock.clone();
            let seen = seen.clone();
            seen.started
                .lock()
                .unwrap()
                .push((attempt, clock.now() - start));
            async move {
                let now = seen.running.fetch_add(1, Ordering::SeqCst) + 1;
                seen.most.fetch_max(now, Ordering::SeqCst);
                let mut running = Running {
                    seen: &seen,
                    attempt,
                    done: false,
                };
                match plan.after {
                    Some(d) => Clock::sleep(&clock, d).await,
                    None => std::future::pending::<()>().await,
                }
                running.done = true;
                plan.result
            }
        })
        .await
    }

    fn started(seen: &Seen) -> Vec<(u32, Duration)> {
        seen.started.lock().unwrap().clone()
    }

    #[test]
    fn the_dynamic_generator_says_when_each_hedge_starts() {
        for listen in [false, true] {
            let (b, clock, events) = builder("hedge-dynamic", listen);
            let asked = Arc::new(Mutex::new(Vec::new()));
            let a = asked.clone();
            let p = b
                .hedging(
                    Hedging::dynamic(move |n| {
                        a.lock().unwrap().push(n);
                        HedgeDelay::After(ms(12_345))
                    })
                    .max_hedged_attempts(1),
                )
                .build()
                .unwrap();
            let seen = Arc::new(Seen::default());
            let plans = [fail(86_400_000, 1), ok(0, 2)];
            let r = block_on(call(&p, &clock, &seen, &plans));
            assert_eq!(r.unwrap(), 2);
            assert_eq!(started(&seen), [(1, ms(0)), (2, ms(12_345))]);
            // Asked for the hedges `max_hedged_attempts` allows, no more.
            assert_eq!(*asked.lock().unwrap(), [2]);
            assert_eq!(*seen.dropped.lock().unwrap(), [1]);
            if listen {
                let hedges = count(&events, |e| matches!(e, EventKind::HedgeStarted { .. }));
                assert_eq!(hedges, 1);
            }
        }
    }

    #[test]
    fn a_dynamic_delay_beyond_the_clocks_range_never_hedges_and_does_not_panic() {
        for listen in [false, true] {
            let (b, clock, _) = builder("hedge-dynamic-max", listen);
            let p = b
                .hedging(Hedging::dynamic(|_| HedgeDelay::After(Duration::MAX)))
                .build()
                .unwrap();
            let seen = Arc::new(Seen::default());
            let r = block_on(call(&p, &clock, &seen, &[ok(5_000, 1), ok(0, 2)]));
            assert_eq!(r.unwrap(), 1);
            assert_eq!(started(&seen), [(1, ms(0))]);
            // A failure still starts the next attempt at once.
            let seen = Arc::new(Seen::default());
            let r = block_on(call(&p, &clock, &seen, &[fail(5_000, 1), ok(1, 2)]));
            assert_eq!(r.unwrap(), 2);
            assert_eq!(started(&seen), [(1, ms(0)), (2, ms(5_000))]);
        }
    }

    #[test]
    fn the_hook_runs_once_per_hedge_in_attempt_order_when_every_attempt_fails() {
        for listen in [false, true] {
            let (b, clock, events) = builder("hedge-hook", listen);
            let hooked = Arc::new(Mutex::new(Vec::new()));
            let h = hooked.clone();
            let p = b
                .hedging(
                    Hedging::latency(secs(1))
                        .max_hedged_attempts(3)
                        .on_hedging(move |ctx| h.lock().unwrap().push(ctx.attempt())),
                )
                .build()
                .unwrap();
            let seen = Arc::new(Seen::default());
            let plans = [fail(0, 1), fail(0, 2), fail(0, 3), fail(0, 4)];
            let r = block_on(call(&p, &clock, &seen, &plans));
            assert!(
                matches!(r, Err(Error::RetryExhausted { attempts: 4, .. })),
                "{r:?}"
            );
            assert_eq!(*hooked.lock().unwrap(), [2, 3, 4]);
            // Each failure started the next attempt at once.
            assert!(started(&seen).iter().all(|s| s.1 == ms(0)));
            if listen {
                let hedges = count(&events, |e| matches!(e, EventKind::HedgeStarted { .. }));
                assert_eq!(hedges, 3);
            }
        }
    }

    #[test]
    fn an_error_that_is_not_hedged_is_returned_at_once_without_a_hedge() {
        for listen in [false, true] {
            let (b, clock, _) = builder("hedge-unhandled", listen);
            let hooked = Arc::new(AtomicU32::new(0));
            let h = hooked.clone();
            let p = b
                .hedging(
                    Hedging::latency(secs(1))
                        .max_hedged_attempts(3)
                        .on_hedging(move |_| {
                            h.fetch_add(1, Ordering::SeqCst);
                        }),
                )
                .hedge_if(|e: &Boom| e.0 == 99)
                .build()
                .unwrap();
            let seen = Arc::new(Seen::default());
            let r = block_on(call(&p, &clock, &seen, &[fail(0, 1), ok(0, 2)]));
            assert!(matches!(r, Err(Error::Operation(Boom(1)))), "{r:?}");
            assert_eq!(hooked.load(Ordering::SeqCst), 0);
            assert_eq!(started(&seen).len(), 1);
        }
    }

    #[test]
    fn an_acceptable_answer_after_hedged_failures_wins() {
        for listen in [false, true] {
            let (b, clock, _) = builder("hedge-last-ok", listen);
            let p = b
                .hedging(Hedging::latency(secs(1)).max_hedged_attempts(3))
                .build()
                .unwrap();
            let seen = Arc::new(Seen::default());
            let plans = [fail(0, 1), fail(0, 2), fail(0, 3), ok(0, 4)];
            let r = block_on(call(&p, &clock, &seen, &plans));
            assert_eq!(r.unwrap(), 4);
        }
    }

    /// Departure: a call whose every attempt failed returns the outcome of
    /// the attempt that ended last (`RetryExhausted`, as a retry does), not
    /// the first attempt's.
    #[test]
    fn a_call_whose_every_attempt_failed_returns_the_last_to_end() {
        for delay in [None, Some(ms(0)), Some(ms(100))] {
            for listen in [false, true] {
                let (b, clock, _) = builder("hedge-all-fail", listen);
                let h = match delay {
                    None => Hedging::fallback(),
                    Some(d) => Hedging::latency(d),
                };
                let p = b.hedging(h.max_hedged_attempts(2)).build().unwrap();
                // The first attempt is the slowest: its error is the call's
                // (in fallback mode, where nothing runs beside it, the
                // last attempt ends last).
                let seen = Arc::new(Seen::default());
                let plans = [fail(200, 1), fail(0, 2), fail(0, 3)];
                let r = block_on(call(&p, &clock, &seen, &plans));
                let slowest = if delay.is_none() { Boom(3) } else { Boom(1) };
                match r {
                    Err(Error::RetryExhausted { attempts, last }) => {
                        assert_eq!((attempts, last), (3, slowest), "{delay:?}")
                    }
                    other => panic!("{delay:?}: {other:?}"),
                }
                // The first attempt fails first: the last hedge's error is.
                let seen = Arc::new(Seen::default());
                let plans = [fail(0, 1), fail(0, 2), fail(10, 3)];
                let r = block_on(call(&p, &clock, &seen, &plans));
                match r {
                    Err(Error::RetryExhausted { attempts, last }) => {
                        assert_eq!((attempts, last), (3, Boom(3)), "{delay:?}")
                    }
                    other => panic!("{delay:?}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn parallel_mode_starts_every_attempt_at_once() {
        for listen in [false, true] {
            let (b, clock, _) = builder("hedge-parallel", listen);
            let p = b
                .hedging(Hedging::parallel().max_hedged_attempts(4))
                .build()
                .unwrap();
            let seen = Arc::new(Seen::default());
            let plans = [ok(500, 1), ok(400, 2), ok(300, 3), ok(200, 4), ok(100, 5)];
            let r = block_on(call(&p, &clock, &seen, &plans));
            assert_eq!(r.unwrap(), 5);
            let s = started(&seen);
            assert_eq!(s.iter().map(|s| s.0).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
            assert!(s.iter().all(|s| s.1 == ms(0)), "{s:?}");
            assert_eq!(seen.most.load(Ordering::SeqCst), 5);
            let mut dropped = seen.dropped.lock().unwrap().clone();
            dropped.sort_unstable();
            assert_eq!(dropped, [1, 2, 3, 4]);
        }
    }

    #[test]
    fn fallback_mode_never_runs_two_attempts_at_once() {
        for listen in [false, true] {
            let (b, clock, _) = builder("hedge-fallback", listen);
            let p = b
                .hedging(Hedging::fallback().max_hedged_attempts(3))
                .build()
                .unwrap();
            let seen = Arc::new(Seen::default());
            let plans = [fail(1_000, 1), fail(1_000, 2), fail(1_000, 3), ok(10, 4)];
            let r = block_on(call(&p, &clock, &seen, &plans));
            assert_eq!(r.unwrap(), 4);
            assert_eq!(seen.most.load(Ordering::SeqCst), 1);
            assert_eq!(
                started(&seen),
                [(1, ms(0)), (2, secs(1)), (3, secs(2)), (4, secs(3))]
            );
        }
    }

    #[test]
    fn the_losers_are_dropped_once_an_answer_wins() {
        for listen in [false, true] {
            let (b, clock, _) = builder("hedge-losers", listen);
            let p = b
                .hedging(Hedging::latency(ms(100)).max_hedged_attempts(2))
                .build()
                .unwrap();
            let seen = Arc::new(Seen::default());
            let plans = [
                Plan {
                    after: None,
                    result: Ok(1),
                },
                ok(3_600_000, 2),
                ok(50, 3),
            ];
            let r = block_on(call(&p, &clock, &seen, &plans));
            assert_eq!(r.unwrap(), 3);
            let mut dropped = seen.dropped.lock().unwrap().clone();
            dropped.sort_unstable();
            assert_eq!(dropped, [1, 2]);
            assert_eq!(seen.running.load(Ordering::SeqCst), 0);
        }
    }

    #[test]
    fn hedged_attempts_are_bounded_by_the_setting() {
        for (attempts, ok_) in [(0, false), (1, true), (10, true), (11, false)] {
            let r = Pipeline::builder("hedge-bounds")
                .hedging(Hedging::parallel().max_hedged_attempts(attempts))
                .build();
            assert_eq!(r.is_ok(), ok_, "{attempts}");
        }
    }
}

mod chaos {
    use super::*;

    /// One call on `p` whose operation counts its runs and answers 200.
    fn call<K>(p: &Pipeline<K>, flavor: Flavor, ops: &AtomicU32) -> Result<u32, Error<Boom>>
    where
        K: seawall::pipeline::HandlesSync<u32, Boom>,
    {
        support::exec(p, flavor, |_| {
            ops.fetch_add(1, Ordering::SeqCst);
            Ok(200)
        })
    }

    fn chaos_builder(listen: bool, draw: f64) -> (PipelineBuilder, VirtualClock, Log) {
        let (b, clock, events) = builder("chaos", listen);
        (b.random(SequenceRandom::new([draw])), clock, events)
    }

    fn injected(events: &Log) -> Vec<ChaosKind> {
        events
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                EventKind::ChaosInjected { kind, .. } => Some(*kind),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_fault_replaces_the_operation_when_the_draw_falls_under_the_rate() {
        for flavor in FLAVORS {
            for listen in [false, true] {
                let (b, _, events) = chaos_builder(listen, 0.5);
                let p = b
                    .chaos_fault(Chaos::fault(0.6, |_| Boom(7)))
                    .build()
                    .unwrap();
                let ops = AtomicU32::new(0);
                let r = call(&p, flavor, &ops);
                assert!(matches!(r, Err(Error::Operation(Boom(7)))), "{r:?}");
                assert_eq!(ops.load(Ordering::SeqCst), 0);
                if listen {
                    assert_eq!(injected(&events), [ChaosKind::Fault]);
                }
            }
        }
    }

    #[test]
    fn nothing_is_injected_when_the_draw_is_not_under_the_rate() {
        for flavor in FLAVORS {
            for listen in [false, true] {
                let (b, clock, events) = chaos_builder(listen, 0.5);
                let p = b
                    .chaos_fault(Chaos::fault(0.3, |_| Boom(7)))
                    .chaos_outcome::<u32, Boom>(Chaos::outcome(0.5, |_| 7))
                    .chaos(Chaos::latency(0.4, ms(500)))
                    .chaos(Chaos::behavior(0.2, |_| panic!("not injected")))
                    .build()
                    .unwrap();
                let ops = AtomicU32::new(0);
                assert_eq!(call(&p, flavor, &ops).unwrap(), 200);
                assert_eq!(ops.load(Ordering::SeqCst), 1);
                assert_eq!(clock.now(), FAR);
                assert!(injected(&events).is_empty());
            }
        }
    }

    #[test]
    fn a_disabled_injection_injects_nothing_and_asks_no_rate() {
        for flavor in FLAVORS {
            for listen in [false, true] {
                let (b, clock, events) = chaos_builder(listen, 0.0);
                let asked = Arc::new(AtomicU32::new(0));
                let a = asked.clone();
                let switch = ChaosSwitch::new(false);
                let p = b
                    .chaos_fault(Chaos::fault(1.0, |_| Boom(7)).enabled(false))
                    .chaos(
                        Chaos::latency(1.0, ms(500))
                            .enabled(switch.clone())
                            .rate_generator(move |_| {
                                a.fetch_add(1, Ordering::SeqCst);
                                1.0
                            }),
                    )
                    .chaos(Chaos::behavior(1.0, |_| panic!("disabled")).enabled_when(|| false))
                    .build()
                    .unwrap();
                let ops = AtomicU32::new(0);
                assert_eq!(call(&p, flavor, &ops).unwrap(), 200);
                assert_eq!((clock.now(), asked.load(Ordering::SeqCst)), (FAR, 0));
                assert!(injected(&events).is_empty());
                // Switched on, the latency is injected on the next call.
                switch.set(true);
                assert_eq!(call(&p, flavor, &ops).unwrap(), 200);
                assert_eq!(
                    (clock.now(), asked.load(Ordering::SeqCst)),
                    (FAR + ms(500), 1)
                );
                if listen {
                    assert_eq!(injected(&events), [ChaosKind::Latency { delay: ms(500) }]);
                }
            }
        }
    }

    #[test]
    fn a_generated_rate_outside_the_unit_interval_is_clamped() {
        let cases = [
            (0.0, false),
            (0.5, false),
            (-1.0, false),
            (f64::NAN, false),
            (1.0, true),
            (1.1, true),
            (f64::INFINITY, true),
        ];
        for (rate, injects) in cases {
            for flavor in FLAVORS {
                let (b, _, _) = chaos_builder(false, 0.5);
                let p = b
                    .chaos_fault(Chaos::fault(0.0, |_| Boom(7)).rate_generator(move |_| rate))
                    .build()
                    .unwrap();
                let ops = AtomicU32::new(0);
                let r = call(&p, flavor, &ops);
                assert_eq!(r.is_err(), injects, "{rate}");
                assert_eq!(ops.load(Ordering::SeqCst), u32::from(!injects));
            }
        }
    }

    #[test]
    fn a_fixed_rate_outside_the_unit_interval_is_refused_at_build() {
        for rate in [-0.1, 1.1, f64::NAN] {
            let e = Pipeline::builder("chaos-rate")
                .chaos(Chaos::latency(rate, ms(1)))
                .build()
                .unwrap_err();
            assert_eq!((e.policy, e.field), ("chaos", "rate"));
        }
    }

    #[test]
    fn an_injected_outcome_is_the_result_and_the_operation_does_not_run() {
        for flavor in FLAVORS {
            for listen in [false, true] {
                let (b, _, events) = chaos_builder(listen, 0.5);
                let p = b
                    .chaos_outcome::<u32, Boom>(Chaos::outcome(0.6, |ctx| 1000 + ctx.attempt()))
                    .build()
                    .unwrap();
                let ops = AtomicU32::new(0);
                assert_eq!(call(&p, flavor, &ops).unwrap(), 1001);
                assert_eq!(ops.load(Ordering::SeqCst), 0);
                if listen {
                    assert_eq!(injected(&events), [ChaosKind::Outcome]);
                }
            }
        }
    }

    #[test]
    fn an_injected_latency_delays_the_operation_by_exactly_the_latency() {
        for flavor in FLAVORS {
            for listen in [false, true] {
                let (b, clock, events) = chaos_builder(listen, 0.5);
                let p = b.chaos(Chaos::latency(0.6, ms(500))).build().unwrap();
                let at = Arc::new(Mutex::new(None));
                let a = at.clone();
                let c = clock.clone();
                let r = support::exec(&p, flavor, move |_| {
                    *a.lock().unwrap() = Some(c.now());
                    Ok::<_, Boom>(1)
                });
                assert_eq!(r.unwrap(), 1);
                assert_eq!(*at.lock().unwrap(), Some(FAR + ms(500)));
                assert_eq!(clock.now(), FAR + ms(500));
                if listen {
                    assert_eq!(injected(&events), [ChaosKind::Latency { delay: ms(500) }]);
                }
            }
        }
    }

    #[test]
    fn a_latency_of_zero_is_no_injection() {
        for flavor in FLAVORS {
            for listen in [false, true] {
                let (b, clock, events) = chaos_builder(listen, 0.0);
                let p = b
                    .chaos(Chaos::latency(1.0, Duration::ZERO))
                    .build()
                    .unwrap();
                let ops = AtomicU32::new(0);
                assert_eq!(call(&p, flavor, &ops).unwrap(), 200);
                assert_eq!(clock.now(), FAR);
                assert!(injected(&events).is_empty());
            }
        }
    }

    #[test]
    fn a_latency_longer_than_the_attempt_timeout_times_the_attempt_out() {
        for listen in [false, true] {
            let (b, clock, _) = chaos_builder(listen, 0.0);
            let p = b
                .timeout(ms(100))
                .chaos(Chaos::latency(1.0, Duration::MAX))
                .build()
                .unwrap();
            let ops = AtomicU32::new(0);
            let r = call(&p, Flavor::Async, &ops);
            assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
            assert_eq!(ops.load(Ordering::SeqCst), 0);
            assert_eq!(clock.now(), FAR + ms(100));
        }
    }

    #[test]
    fn a_behavior_runs_before_the_operation_which_then_runs() {
        for flavor in FLAVORS {
            for listen in [false, true] {
                let (b, _, events) = chaos_builder(listen, 0.5);
                let order = Arc::new(Mutex::new(Vec::new()));
                let o = order.clone();
                let p = b
                    .chaos(Chaos::behavior(0.6, move |_| {
                        o.lock().unwrap().push("behavior")
                    }))
                    .build()
                    .unwrap();
                let o = order.clone();
                let r = support::exec(&p, flavor, move |_| {
                    o.lock().unwrap().push("operation");
                    Ok::<_, Boom>(1)
                });
                assert_eq!(r.unwrap(), 1);
                assert_eq!(*order.lock().unwrap(), ["behavior", "operation"]);
                if listen {
                    assert_eq!(injected(&events), [ChaosKind::Behavior]);
                }
            }
        }
    }

    #[test]
    fn an_injected_fault_is_retried_and_recorded_like_a_real_one() {
        for flavor in FLAVORS {
            let (b, _, _) = chaos_builder(false, 0.0);
            let p = b
                .retry(Retry::constant(ms(10)).max_attempts(3))
                .circuit_breaker(CircuitBreaker::consecutive_failures(3))
                .chaos_fault(Chaos::fault(1.0, |ctx| Boom(ctx.attempt())))
                .build()
                .unwrap();
            let ops = AtomicU32::new(0);
            let r = call(&p, flavor, &ops);
            assert!(
                matches!(
                    r,
                    Err(Error::RetryExhausted {
                        attempts: 3,
                        last: Boom(3)
                    })
                ),
                "{r:?}"
            );
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
        }
    }
}

mod circuit_breaker {
    use super::*;

    fn fail<K>(p: &Pipeline<K>, flavor: Flavor) -> Result<u32, Error<Boom>>
    where
        K: seawall::pipeline::HandlesSync<u32, Boom>,
    {
        support::exec(p, flavor, |_| Err(Boom(1)))
    }

    fn succeed<K>(p: &Pipeline<K>, flavor: Flavor) -> Result<u32, Error<Boom>>
    where
        K: seawall::pipeline::HandlesSync<u32, Boom>,
    {
        support::exec(p, flavor, |_| Ok(1))
    }

    fn refused(r: &Result<u32, Error<Boom>>) -> Option<Option<Duration>> {
        match r {
            Err(Error::Rejected(rej)) if rej.reason == RejectionReason::CircuitOpen => {
                Some(rej.retry_after)
            }
            _ => None,
        }
    }

    #[test]
    fn an_isolated_circuit_refuses_every_call_until_it_is_closed_again() {
        for flavor in FLAVORS {
            for listen in [false, true] {
                let (b, clock, events) = builder("breaker-isolate", listen);
                let p = b
                    .circuit_breaker(CircuitBreaker::consecutive_failures(2).cooldown(secs(5)))
                    .build()
                    .unwrap();
                p.isolate().unwrap();
                assert_eq!(p.circuit_state().unwrap(), CircuitState::Isolated);
                let ran = AtomicU32::new(0);
                let r = support::exec(&p, flavor, |_| {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<u32, Boom>(1)
                });
                assert!(refused(&r).is_some(), "{r:?}");
                assert_eq!(ran.load(Ordering::SeqCst), 0);
                // No cooldown ends an isolation.
                clock.advance(Duration::from_secs(86_400 * 365));
                assert!(refused(&succeed(&p, flavor)).is_some());
                assert_eq!(p.circuit_state().unwrap(), CircuitState::Isolated);
                p.reset().unwrap();
                assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
                assert_eq!(succeed(&p, flavor).unwrap(), 1);
                if listen {
                    assert!(count(&events, |e| matches!(e, EventKind::CircuitOpened { .. })) >= 1);
                    assert!(count(&events, |e| matches!(e, EventKind::CircuitClosed)) >= 1);
                }
            }
        }
    }

    #[test]
    fn a_half_open_circuit_admits_one_probe_and_closes_when_it_succeeds() {
        for listen in [false, true] {
            let (b, clock, events) = builder("breaker-half-open", listen);
            let p = b
                .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(5)))
                .build()
                .unwrap();
            let rt = support::rt();
            let _ = fail(&p, Flavor::Sync);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
            let r = succeed(&p, Flavor::Sync);
            assert_eq!(refused(&r), Some(Some(secs(5))), "{r:?}");
            clock.advance(secs(5));
            // The probe runs while a second call is refused.
            let c = clock.clone();
            let (probe, other) = rt.block_on(async {
                let probe = p.run(|_| {
                    let c = c.clone();
                    async move {
                        Clock::sleep(&c, secs(1)).await;
                        Ok::<u32, Boom>(7)
                    }
                });
                let other = async {
                    tokio::task::yield_now().await;
                    let r = p.run(|_| async { Ok::<u32, Boom>(8) }).await;
                    (r, p.circuit_state().unwrap())
                };
                tokio::join!(probe, other)
            });
            assert_eq!(probe.unwrap(), 7);
            assert!(refused(&other.0).is_some(), "{:?}", other.0);
            assert_eq!(other.1, CircuitState::HalfOpen);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            if listen {
                let e = events.lock().unwrap();
                let states: Vec<_> = e
                    .iter()
                    .filter(|e| {
                        matches!(
                            e,
                            EventKind::CircuitOpened { .. }
                                | EventKind::CircuitHalfOpened
                                | EventKind::CircuitClosed
                        )
                    })
                    .cloned()
                    .collect();
                assert_eq!(
                    states,
                    [
                        EventKind::CircuitOpened { cooldown: secs(5) },
                        EventKind::CircuitHalfOpened,
                        EventKind::CircuitClosed
                    ]
                );
            }
        }
    }

    #[test]
    fn closed_half_open_open_half_open_closed() {
        for flavor in FLAVORS {
            let (b, clock, _) = builder("breaker-flow", false);
            let p = b
                .circuit_breaker(CircuitBreaker::consecutive_failures(2).cooldown(secs(5)))
                .build()
                .unwrap();
            let _ = fail(&p, flavor);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            let _ = fail(&p, flavor);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
            clock.advance(secs(5) - Duration::from_nanos(1));
            assert!(refused(&succeed(&p, flavor)).is_some());
            clock.advance(Duration::from_nanos(1));
            // A failed probe opens it again for the cooldown.
            assert!(matches!(fail(&p, flavor), Err(Error::Operation(_))));
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
            assert_eq!(refused(&succeed(&p, flavor)), Some(Some(secs(5))));
            clock.advance(secs(5));
            assert_eq!(succeed(&p, flavor).unwrap(), 1);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            // Closed afresh: one failure does not open it.
            let _ = fail(&p, flavor);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
        }
    }

    #[test]
    fn an_outcome_that_ends_after_an_isolation_leaves_the_circuit_isolated() {
        for ok in [true, false] {
            let (b, clock, _) = builder("breaker-late", false);
            let p = b
                .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(5)))
                .build()
                .unwrap();
            let c = clock.clone();
            let rt = support::rt();
            rt.block_on(async {
                let slow = p.run(|_| after_a_second(c.clone(), ok));
                let control = async {
                    tokio::task::yield_now().await;
                    p.isolate().unwrap();
                };
                let _ = tokio::join!(slow, control);
            });
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Isolated, "{ok}");
        }
    }

    #[test]
    fn a_late_outcome_does_not_move_an_open_circuit() {
        for ok in [true, false] {
            let (b, clock, _) = builder("breaker-late-open", false);
            let p = b
                .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(5)))
                .build()
                .unwrap();
            let c = clock.clone();
            let rt = support::rt();
            rt.block_on(async {
                let slow = p.run(|_| after_a_second(c.clone(), ok));
                // Fails at 100 ms, while the slow call runs on to 1 s.
                let opener = p.run(|_| {
                    let c = c.clone();
                    async move {
                        Clock::sleep(&c, ms(100)).await;
                        Err::<u32, Boom>(Boom(2))
                    }
                });
                let _ = tokio::join!(slow, opener);
            });
            assert_eq!(clock.now(), FAR + secs(1));
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Open, "{ok}");
            // Open until the trip's cooldown ends (5.1 s), not longer.
            clock.advance(secs(4));
            let r = succeed(&p, Flavor::Sync);
            assert_eq!(refused(&r), Some(Some(ms(100))), "{ok}: {r:?}");
            clock.advance(ms(100));
            assert_eq!(succeed(&p, Flavor::Sync).unwrap(), 1);
        }
    }

    #[test]
    fn open_for_opens_from_any_state_then_half_opens() {
        for flavor in FLAVORS {
            for listen in [false, true] {
                let (b, clock, events) = builder("breaker-open-for", listen);
                let p = b
                    .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(5)))
                    .build()
                    .unwrap();
                for start in ["closed", "isolated", "disabled", "open"] {
                    p.reset().unwrap();
                    match start {
                        "isolated" => p.isolate().unwrap(),
                        "disabled" => p.disable().unwrap(),
                        "open" => {
                            let _ = fail(&p, flavor);
                        }
                        _ => {}
                    }
                    p.open_for(secs(60)).unwrap();
                    assert_eq!(p.circuit_state().unwrap(), CircuitState::Open, "{start}");
                    assert_eq!(
                        refused(&succeed(&p, flavor)),
                        Some(Some(secs(60))),
                        "{start}"
                    );
                    clock.advance(secs(60));
                    assert_eq!(succeed(&p, flavor).unwrap(), 1, "{start}");
                    assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed, "{start}");
                }
                if listen {
                    assert!(
                        count(
                            &events,
                            |e| matches!(e, EventKind::CircuitOpened { cooldown } if *cooldown == secs(60))
                        ) >= 4
                    );
                }
            }
        }
    }

    #[test]
    fn a_disabled_circuit_admits_everything_and_records_nothing() {
        for flavor in FLAVORS {
            let (b, _, _) = builder("breaker-disabled", false);
            let p = b
                .circuit_breaker(CircuitBreaker::consecutive_failures(1))
                .build()
                .unwrap();
            p.disable().unwrap();
            for _ in 0..5 {
                assert!(matches!(fail(&p, flavor), Err(Error::Operation(_))));
            }
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Disabled);
            // Enabling leaves a closed circuit alone and closes a disabled one.
            p.enable().unwrap();
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            p.enable().unwrap();
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            let _ = fail(&p, flavor);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
            p.enable().unwrap();
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
        }
    }

    #[test]
    fn a_failure_rate_at_the_threshold_opens_once_the_minimum_calls_are_in() {
        for flavor in FLAVORS {
            let (b, _, _) = builder("breaker-rate", false);
            let p = b
                .circuit_breaker(
                    CircuitBreaker::failure_rate(0.5)
                        .window(secs(30))
                        .minimum_calls(4),
                )
                .build()
                .unwrap();
            let _ = fail(&p, flavor);
            let _ = fail(&p, flavor);
            let _ = fail(&p, flavor);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            // The rates are judged when a failure is recorded: a success
            // never opens the circuit, the next failure does.
            let _ = succeed(&p, flavor);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            let _ = fail(&p, flavor);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);

            let (b, _, _) = builder("breaker-rate", false);
            let p = b
                .circuit_breaker(
                    CircuitBreaker::failure_rate(0.5)
                        .window(secs(30))
                        .minimum_calls(4),
                )
                .build()
                .unwrap();
            let _ = succeed(&p, flavor);
            let _ = succeed(&p, flavor);
            let _ = fail(&p, flavor);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            // 2 failures in 4 calls: exactly the threshold.
            let _ = fail(&p, flavor);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
        }
    }

    #[test]
    fn failures_older_than_the_window_no_longer_count() {
        for flavor in FLAVORS {
            let (b, clock, _) = builder("breaker-window", false);
            let p = b
                .circuit_breaker(
                    CircuitBreaker::failure_rate(0.5)
                        .window(secs(10))
                        .minimum_calls(4),
                )
                .build()
                .unwrap();
            for _ in 0..3 {
                let _ = fail(&p, flavor);
            }
            clock.advance(secs(11));
            let _ = fail(&p, flavor);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            let m = p.circuit_metrics().unwrap();
            assert_eq!(m.state, CircuitState::Closed);
        }
    }

    #[test]
    fn a_growing_cooldown_follows_each_failed_probe_up_to_its_maximum_and_a_close_resets_it() {
        for flavor in FLAVORS {
            let (b, clock, _) = builder("breaker-growth", false);
            let p = b
                .circuit_breaker(
                    CircuitBreaker::consecutive_failures(1)
                        .cooldown(secs(1))
                        .cooldown_growth(2.0, secs(5)),
                )
                .build()
                .unwrap();
            let _ = fail(&p, flavor);
            let mut seen = Vec::new();
            for _ in 0..5 {
                let r = succeed(&p, flavor);
                let wait = refused(&r).flatten().unwrap();
                seen.push(wait);
                clock.advance(wait);
                let _ = fail(&p, flavor);
            }
            assert_eq!(seen, [secs(1), secs(2), secs(4), secs(5), secs(5)]);
            clock.advance(secs(5));
            assert_eq!(succeed(&p, flavor).unwrap(), 1);
            let _ = fail(&p, flavor);
            assert_eq!(refused(&succeed(&p, flavor)), Some(Some(secs(1))));
        }
    }
}

mod retry {
    use super::*;

    /// The waits the retry made, from the events.
    fn waits(events: &Log) -> Vec<Duration> {
        events
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                EventKind::RetryScheduled { delay, .. } => Some(*delay),
                _ => None,
            })
            .collect()
    }

    /// Runs a call that always fails, and returns the attempts it made and
    /// the time it took.
    fn failing<K>(p: &Pipeline<K>, clock: &VirtualClock, flavor: Flavor) -> (u32, Duration)
    where
        K: seawall::pipeline::HandlesSync<u32, Boom>,
    {
        let start = clock.now();
        let runs = AtomicU32::new(0);
        let r = support::exec(p, flavor, |_| {
            Err::<u32, _>(Boom(runs.fetch_add(1, Ordering::SeqCst) + 1))
        });
        let n = runs.load(Ordering::SeqCst);
        match r {
            Err(Error::RetryExhausted { attempts, last }) => {
                assert_eq!((attempts, last), (n, Boom(n)))
            }
            Err(Error::Operation(Boom(1))) => assert_eq!(n, 1),
            other => panic!("{other:?}"),
        }
        (n, clock.now() - start)
    }

    #[test]
    fn max_attempts_counts_the_first_attempt() {
        for flavor in FLAVORS {
            for attempts in [1, 2, 4] {
                let (b, clock, _) = builder("retry-count", false);
                let p = b
                    .retry(Retry::constant(ms(10)).max_attempts(attempts))
                    .build()
                    .unwrap();
                let (n, took) = failing(&p, &clock, flavor);
                assert_eq!((n, took), (attempts, ms(10) * (attempts - 1)));
            }
        }
        let e = Pipeline::builder("retry-zero")
            .retry(Retry::constant(ms(10)).max_attempts(0))
            .build()
            .unwrap_err();
        assert_eq!((e.policy, e.field), ("retry", "max_attempts"));
    }

    #[test]
    fn the_backoffs_wait_their_sequences() {
        let cases = [
            (
                Retry::constant(secs(1)),
                [secs(1), secs(1), secs(1), secs(1)],
            ),
            (Retry::linear(secs(1)), [secs(1), secs(2), secs(3), secs(4)]),
            (
                Retry::exponential(secs(1)),
                [secs(1), secs(2), secs(4), secs(8)],
            ),
            (
                Retry::exponential(secs(1)).cap(secs(3)),
                [secs(1), secs(2), secs(3), secs(3)],
            ),
            (
                Retry::linear(secs(1)).cap(secs(2)),
                [secs(1), secs(2), secs(2), secs(2)],
            ),
        ];
        for (retry, expected) in cases {
            for flavor in FLAVORS {
                let (b, clock, events) = builder("retry-backoff", true);
                let p = b.retry(retry.clone().max_attempts(5)).build().unwrap();
                let (n, took) = failing(&p, &clock, flavor);
                assert_eq!(n, 5);
                assert_eq!(waits(&events), expected, "{retry:?}");
                assert_eq!(took, expected.iter().sum::<Duration>());
                // The same without a listener.
                let (b, clock, _) = builder("retry-backoff", false);
                let p = b.retry(retry.clone().max_attempts(5)).build().unwrap();
                assert_eq!(failing(&p, &clock, flavor).1, took);
            }
        }
    }

    #[test]
    fn a_zero_delay_retries_at_once() {
        for flavor in FLAVORS {
            let (b, clock, _) = builder("retry-zero-delay", false);
            let p = b
                .retry(Retry::constant(Duration::ZERO).max_attempts(4))
                .build()
                .unwrap();
            assert_eq!(failing(&p, &clock, flavor), (4, Duration::ZERO));
        }
    }

    #[test]
    fn a_delay_for_a_huge_attempt_number_saturates_at_the_cap() {
        let r = SequenceRandom::new([0.0, 0.5, 0.999]);
        let jitters = [
            Jitter::None,
            Jitter::Full,
            Jitter::Equal,
            Jitter::Proportional(50.0),
        ];
        for jitter in jitters {
            for attempt in [64, 1_000, u32::MAX] {
                let retry = Retry::exponential(secs(1)).jitter(jitter);
                let d = retry.delay(attempt, secs(1), &r);
                assert!(d >= Duration::ZERO);
                let capped = Retry::exponential(secs(1)).cap(secs(30)).jitter(jitter);
                let (lo, hi) = jitter.bounds(secs(30));
                let d = capped.delay(attempt, secs(30), &r);
                assert!(lo <= d && d <= hi, "{jitter:?} {attempt}: {d:?}");
                let linear = Retry::linear(secs(1)).jitter(jitter);
                let _ = linear.delay(attempt, secs(1), &r);
            }
        }
    }

    #[test]
    fn jittered_delays_stay_within_their_bounds() {
        let base = secs(2);
        for draw in [0.0, 0.25, 0.5, 0.999_999] {
            let r = SequenceRandom::new([draw]);
            let full = Retry::constant(base)
                .jitter(Jitter::Full)
                .delay(1, base, &r);
            assert!(full <= base);
            let equal = Retry::constant(base)
                .jitter(Jitter::Equal)
                .delay(1, base, &r);
            assert!(secs(1) <= equal && equal <= base);
            let prop = Retry::constant(base)
                .jitter(Jitter::Proportional(25.0))
                .delay(1, base, &r);
            assert!(ms(1_500) <= prop && prop <= ms(2_500), "{prop:?}");
            let dec = Retry::decorrelated(secs(1), secs(10)).delay(2, secs(2), &r);
            assert!(secs(1) <= dec && dec <= secs(6), "{dec:?}");
        }
    }

    /// Departure: the cap bounds the backoff before jitter, so a
    /// proportional jitter may wait up to `p` % beyond it.
    #[test]
    fn the_cap_bounds_the_delay_before_the_jitter() {
        let r = SequenceRandom::new([0.999_999]);
        let retry = Retry::exponential(secs(1))
            .cap(secs(2))
            .jitter(Jitter::Proportional(50.0));
        let d = retry.delay(10, secs(2), &r);
        assert!(d > secs(2) && d <= secs(3), "{d:?}");
        let full = Retry::exponential(secs(1))
            .cap(secs(2))
            .jitter(Jitter::Full);
        assert!(full.delay(10, secs(2), &r) <= secs(2));
    }

    #[test]
    fn the_on_retry_hook_sees_each_error_attempt_and_delay() {
        for flavor in FLAVORS {
            let (b, clock, _) = builder("retry-hook", false);
            let seen = Arc::new(Mutex::new(Vec::new()));
            let s = seen.clone();
            let p = b
                .retry(Retry::exponential(ms(100)).max_attempts(4))
                .on_retry(move |e: &Boom, attempt, delay| {
                    s.lock().unwrap().push((e.0, attempt, delay))
                })
                .build()
                .unwrap();
            assert_eq!(failing(&p, &clock, flavor).0, 4);
            assert_eq!(
                *seen.lock().unwrap(),
                [(1, 1, ms(100)), (2, 2, ms(200)), (3, 3, ms(400))]
            );
        }
    }

    #[test]
    fn errors_the_classifier_aborts_are_not_retried() {
        for flavor in FLAVORS {
            let (b, clock, _) = builder("retry-abort", false);
            let p = b
                .retry(Retry::constant(ms(100)).max_attempts(4))
                .abort_if(|e: &Boom| e.0 == 1)
                .build()
                .unwrap();
            assert_eq!(failing(&p, &clock, flavor), (1, Duration::ZERO));
            let (b, clock, _) = builder("retry-only", false);
            let p = b
                .retry(Retry::constant(ms(100)).max_attempts(4))
                .retry_if(|e: &Boom| e.0 != 1)
                .build()
                .unwrap();
            assert_eq!(failing(&p, &clock, flavor), (1, Duration::ZERO));
        }
    }

    /// Departure: a retry-after hint is a floor on the wait, not a
    /// replacement for the backoff: the retry waits the longer of the two.
    #[test]
    fn a_retry_after_hint_makes_the_retry_wait_at_least_that_long() {
        for (hint, backoff, expected) in [(secs(5), secs(1), secs(5)), (ms(100), secs(1), secs(1))]
        {
            for flavor in FLAVORS {
                let (b, clock, _) = builder("retry-after", false);
                let p = b
                    .retry(Retry::constant(backoff).max_attempts(2))
                    .classify(move |_: &Boom| Verdict::retry().with_retry_after(hint))
                    .build()
                    .unwrap();
                assert_eq!(failing(&p, &clock, flavor), (2, expected));
            }
        }
    }

    #[test]
    fn a_wait_that_would_not_end_by_the_deadline_gives_up_with_the_last_error() {
        for flavor in FLAVORS {
            for listen in [false, true] {
                let (b, clock, events) = builder("retry-deadline", listen);
                let p = b
                    .timeout(secs(3))
                    .retry(Retry::constant(secs(2)).max_attempts(5))
                    .build()
                    .unwrap();
                let (n, took) = failing(&p, &clock, flavor);
                assert_eq!((n, took), (2, secs(2)));
                if listen {
                    assert_eq!(
                        count(&events, |e| matches!(
                            e,
                            EventKind::RetryGaveUp {
                                reason: seawall::event::GiveUpReason::Deadline,
                                ..
                            }
                        )),
                        1
                    );
                }
            }
        }
    }

    #[test]
    fn seawalls_own_refusals_are_never_retried() {
        for flavor in FLAVORS {
            let (b, _, _) = builder("retry-refusal", false);
            let p = b
                .retry(Retry::constant(ms(10)).max_attempts(5))
                .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(60)))
                .build()
                .unwrap();
            let runs = AtomicU32::new(0);
            let r = support::exec(&p, flavor, |_| {
                runs.fetch_add(1, Ordering::SeqCst);
                Err::<u32, _>(Boom(1))
            });
            assert!(matches!(r, Err(Error::Rejected(_))), "{r:?}");
            assert_eq!(runs.load(Ordering::SeqCst), 1);
        }
    }
}

mod timeout {
    use super::*;

    #[test]
    fn an_attempt_past_its_timeout_is_dropped_at_the_deadline() {
        for listen in [false, true] {
            let (b, clock, events) = builder("timeout-async", listen);
            let p = b.timeout(secs(1)).build().unwrap();
            let c = clock.clone();
            let r = block_on(p.run(|_| {
                let c = c.clone();
                async move {
                    Clock::sleep(&c, secs(2)).await;
                    Ok::<u32, Boom>(1)
                }
            }));
            assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
            assert_eq!(clock.now(), FAR + secs(1));
            if listen {
                assert_eq!(
                    count(&events, |e| matches!(e, EventKind::TimedOut { .. })),
                    1
                );
            }
        }
    }

    #[test]
    fn an_answer_at_the_deadline_is_on_time() {
        for strict in [false, true] {
            let t = if strict {
                Timeout::strict(secs(1))
            } else {
                Timeout::new(secs(1))
            };
            let (b, clock, _) = builder("timeout-edge", false);
            let p = b.timeout(t).build().unwrap();
            let c = clock.clone();
            let r = block_on(p.run(|_| {
                let c = c.clone();
                async move {
                    Clock::sleep(&c, secs(1)).await;
                    Ok::<u32, Boom>(1)
                }
            }));
            assert_eq!(r.unwrap(), 1);
            let c = clock.clone();
            let r = p.call(|_| {
                c.advance(secs(1));
                Ok::<u32, Boom>(2)
            });
            assert_eq!(r.unwrap(), 2);
            let c = clock.clone();
            let r = p.call(|_| {
                c.advance(secs(1) + Duration::from_nanos(1));
                Ok::<u32, Boom>(3)
            });
            assert_eq!(r.is_ok(), !strict, "{r:?}");
        }
    }

    #[test]
    fn the_context_carries_the_deadline_for_the_operation() {
        for flavor in FLAVORS {
            let (b, _, _) = builder("timeout-ctx", false);
            let p = b.timeout(secs(5)).build().unwrap();
            let r = support::exec(&p, flavor, |ctx| Ok::<_, Boom>(ctx.remaining()));
            assert_eq!(r.unwrap(), Some(secs(5)));
        }
    }

    #[test]
    fn a_timeout_beyond_the_clocks_range_never_fires() {
        for flavor in FLAVORS {
            let (b, _, _) = builder("timeout-max", false);
            let p = b
                .timeout(Duration::MAX)
                .retry(Retry::constant(ms(1)).max_attempts(2))
                .timeout(Duration::MAX)
                .build()
                .unwrap();
            let runs = AtomicU32::new(0);
            let r = support::exec(&p, flavor, |_| {
                if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                    Err(Boom(1))
                } else {
                    Ok(1)
                }
            });
            assert_eq!(r.unwrap(), 1);
        }
    }

    #[test]
    fn a_zero_timeout_is_refused_at_build() {
        let e = Pipeline::builder("timeout-zero")
            .timeout(Duration::ZERO)
            .build()
            .unwrap_err();
        assert_eq!((e.policy, e.field), ("timeout", "duration"));
    }
}

mod fallback {
    use super::*;

    #[test]
    fn the_fallback_answers_a_failed_call_with_its_error_and_context() {
        for flavor in FLAVORS {
            let (b, _, _) = builder("fallback", false);
            let seen = Arc::new(Mutex::new(None));
            let s = seen.clone();
            let p = b
                .retry(Retry::constant(ms(1)).max_attempts(2))
                .fallback_sync(move |e: Error<Boom>, ctx: Context| {
                    *s.lock().unwrap() = Some((format!("{e:?}"), ctx.attempt()));
                    Ok::<u32, Boom>(42)
                })
                .build()
                .unwrap();
            let r = support::exec(&p, flavor, |_| Err::<u32, _>(Boom(3)));
            assert_eq!(r.unwrap(), 42);
            let (e, _) = seen.lock().unwrap().clone().unwrap();
            assert!(e.contains("RetryExhausted"), "{e}");
            // A success never reaches it.
            *seen.lock().unwrap() = None;
            assert_eq!(
                support::exec(&p, flavor, |_| Ok::<u32, Boom>(1)).unwrap(),
                1
            );
            assert!(seen.lock().unwrap().is_none());
        }
    }

    #[test]
    fn an_error_the_fallback_does_not_handle_is_returned_as_it_is() {
        for flavor in FLAVORS {
            let (b, _, _) = builder("fallback-when", false);
            let p = b
                .fallback_sync(|_e: Error<Boom>, _ctx| Ok::<u32, Boom>(42))
                .fallback_when(|e: &Error<Boom>| matches!(e, Error::Operation(Boom(1))))
                .build()
                .unwrap();
            assert_eq!(
                support::exec(&p, flavor, |_| Err::<u32, _>(Boom(1))).unwrap(),
                42
            );
            let r = support::exec(&p, flavor, |_| Err::<u32, _>(Boom(2)));
            assert!(matches!(r, Err(Error::Operation(Boom(2)))), "{r:?}");
        }
    }

    #[test]
    fn a_failing_fallback_returns_its_own_error() {
        for flavor in FLAVORS {
            let (b, _, _) = builder("fallback-fails", false);
            let p = b
                .fallback_sync(|_e: Error<Boom>, _ctx| Err::<u32, Boom>(Boom(9)))
                .build()
                .unwrap();
            let r = support::exec(&p, flavor, |_| Err::<u32, _>(Boom(1)));
            assert!(matches!(r, Err(Error::Fallback(Boom(9)))), "{r:?}");
        }
    }
}

mod rate_limiter {
    use super::*;

    #[test]
    fn calls_within_the_limit_pass_and_the_next_is_refused_with_a_retry_after() {
        for flavor in FLAVORS {
            for listen in [false, true] {
                let (b, clock, events) = builder("rate", listen);
                let p = b
                    .rate_limiter(RateLimiter::fixed_window(2, secs(10)))
                    .build()
                    .unwrap();
                clock.advance(secs(3));
                for _ in 0..2 {
                    assert!(support::exec(&p, flavor, |_| Ok::<u32, Boom>(1)).is_ok());
                }
                let r = support::exec(&p, flavor, |_| Ok::<u32, Boom>(1));
                match r {
                    Err(Error::Rejected(rej)) => {
                        assert_eq!(rej.reason, RejectionReason::RateLimited);
                        let wait = rej.retry_after.unwrap();
                        assert!(wait > Duration::ZERO && wait <= secs(10), "{wait:?}");
                        clock.advance(wait);
                        assert!(support::exec(&p, flavor, |_| Ok::<u32, Boom>(1)).is_ok());
                    }
                    other => panic!("{other:?}"),
                }
                if listen {
                    assert_eq!(
                        count(&events, |e| matches!(e, EventKind::Rejected { .. })),
                        1
                    );
                }
            }
        }
    }
}

mod circuit_breaker_state {
    use super::*;

    #[test]
    fn pipelines_of_one_name_on_one_store_share_one_circuit_and_its_controls() {
        for flavor in FLAVORS {
            let store = MemoryStore::new();
            let clock = VirtualClock::starting_at(FAR);
            let name = support::unique("breaker-shared");
            let build = || {
                Pipeline::builder(name.clone())
                    .store(store.clone())
                    .clock(clock.clone())
                    .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(5)))
                    .build()
                    .unwrap()
            };
            let (a, b) = (build(), build());
            let _ = support::exec(&a, flavor, |_| Err::<u32, _>(Boom(1)));
            assert_eq!(b.circuit_state().unwrap(), CircuitState::Open);
            let r = support::exec(&b, flavor, |_| Ok::<u32, Boom>(1));
            assert!(matches!(r, Err(Error::Rejected(_))), "{r:?}");
            a.reset().unwrap();
            a.isolate().unwrap();
            assert_eq!(b.circuit_state().unwrap(), CircuitState::Isolated);
            b.reset().unwrap();
            assert_eq!(
                support::exec(&a, flavor, |_| Ok::<u32, Boom>(1)).unwrap(),
                1
            );
        }
    }

    #[test]
    fn the_controls_act_on_a_circuit_declared_before_the_retry() {
        for flavor in FLAVORS {
            let (b, clock, _) = builder("breaker-call-gate", false);
            let p = b
                .circuit_breaker(CircuitBreaker::consecutive_failures(2).cooldown(secs(5)))
                .retry(Retry::constant(ms(1)).max_attempts(3))
                .build()
                .unwrap();
            // One exhausted retry is one failure.
            let r = support::exec(&p, flavor, |_| Err::<u32, _>(Boom(1)));
            assert!(matches!(r, Err(Error::RetryExhausted { attempts: 3, .. })));
            let m = p.circuit_metrics().unwrap();
            assert_eq!((m.state, m.failures), (CircuitState::Closed, 1));
            p.isolate().unwrap();
            let r = support::exec(&p, flavor, |_| Ok::<u32, Boom>(1));
            assert!(matches!(r, Err(Error::Rejected(_))), "{r:?}");
            p.open_for(secs(3)).unwrap();
            clock.advance(secs(3));
            assert_eq!(
                support::exec(&p, flavor, |_| Ok::<u32, Boom>(1)).unwrap(),
                1
            );
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
        }
    }

    #[test]
    fn a_partitions_circuit_is_its_own_and_has_its_own_controls() {
        for flavor in FLAVORS {
            let (b, _, _) = builder("breaker-partition", false);
            let p = b
                .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(5)))
                .build()
                .unwrap();
            let a = p.partition("tenant-a");
            let _ = a.call(|_| Err::<u32, _>(Boom(1)));
            assert!(matches!(
                a.call(|_| Ok::<u32, Boom>(1)),
                Err(Error::Rejected(_))
            ));
            // The pipeline's own circuit (unpartitioned calls) is another.
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            assert_eq!(
                support::exec(&p, flavor, |_| Ok::<u32, Boom>(1)).unwrap(),
                1
            );
            p.isolate().unwrap();
            assert_eq!(
                p.partition("tenant-b")
                    .call(|_| Ok::<u32, Boom>(2))
                    .unwrap(),
                2
            );
            p.partition("tenant-b").isolate().unwrap();
            assert!(matches!(
                p.partition("tenant-b").call(|_| Ok::<u32, Boom>(2)),
                Err(Error::Rejected(_))
            ));
            a.reset().unwrap();
            assert_eq!(a.call(|_| Ok::<u32, Boom>(3)).unwrap(), 3);
        }
    }

    #[test]
    fn a_retry_refused_by_the_circuit_it_opened_returns_the_refusal() {
        for flavor in FLAVORS {
            for listen in [false, true] {
                let (b, _, events) = builder("breaker-retry-refused", listen);
                let p = b
                    .retry(Retry::constant(ms(10)).max_attempts(3))
                    .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(5)))
                    .build()
                    .unwrap();
                let runs = AtomicU32::new(0);
                let r = support::exec(&p, flavor, |_| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Err::<u32, _>(Boom(1))
                });
                match r {
                    Err(Error::Rejected(rej)) => {
                        assert_eq!(rej.reason, RejectionReason::CircuitOpen);
                        assert_eq!(rej.retry_after, Some(secs(5) - ms(10)));
                    }
                    other => panic!("{other:?}"),
                }
                assert_eq!(runs.load(Ordering::SeqCst), 1);
                if listen {
                    assert_eq!(
                        count(&events, |e| matches!(e, EventKind::Rejected { .. })),
                        1
                    );
                }
            }
        }
    }

    #[test]
    fn a_shadow_circuit_opens_and_reports_but_admits_every_call() {
        for flavor in FLAVORS {
            for listen in [false, true] {
                let (b, _, events) = builder("breaker-shadow", listen);
                let p = b
                    .circuit_breaker(CircuitBreaker::consecutive_failures(1).shadow(true))
                    .build()
                    .unwrap();
                let _ = support::exec(&p, flavor, |_| Err::<u32, _>(Boom(1)));
                assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
                assert_eq!(
                    support::exec(&p, flavor, |_| Ok::<u32, Boom>(1)).unwrap(),
                    1
                );
                // Its state is what an enforcing circuit's would be: the
                // call it would have refused is not recorded.
                assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
                if listen {
                    let shadowed = count(&events, |e| {
                        matches!(
                            e,
                            EventKind::ShadowRejected {
                                reason: RejectionReason::CircuitOpen,
                                ..
                            }
                        )
                    });
                    assert_eq!(shadowed, 1);
                }
            }
        }
    }

    #[test]
    fn a_cooldown_or_open_for_past_the_clocks_range_stays_open_without_overflow() {
        for flavor in FLAVORS {
            let (b, clock, _) = builder("breaker-max", false);
            let p = b
                .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(Duration::MAX))
                .build()
                .unwrap();
            let _ = support::exec(&p, flavor, |_| Err::<u32, _>(Boom(1)));
            clock.advance(Duration::from_secs(86_400 * 365 * 100));
            let r = support::exec(&p, flavor, |_| Ok::<u32, Boom>(1));
            assert!(
                matches!(r, Err(Error::Rejected(ref rej)) if rej.retry_after.is_some()),
                "{r:?}"
            );
            p.reset().unwrap();
            p.open_for(Duration::MAX).unwrap();
            let r = support::exec(&p, flavor, |_| Ok::<u32, Boom>(1));
            assert!(
                matches!(r, Err(Error::Rejected(ref rej)) if rej.retry_after.is_some()),
                "{r:?}"
            );
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
        }
    }

    #[test]
    fn a_hedge_refused_by_a_half_open_circuit_leaves_the_probe_to_decide() {
        for listen in [false, true] {
            let (b, clock, _) = builder("breaker-hedge-probe", listen);
            let p = b
                .hedging(Hedging::latency(ms(10)).max_hedged_attempts(2))
                .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(5)))
                .build()
                .unwrap();
            p.open_for(Duration::ZERO).unwrap();
            let c = clock.clone();
            let r = block_on(p.run(|ctx| {
                let c = c.clone();
                async move {
                    Clock::sleep(&c, ms(100)).await;
                    Ok::<u32, Boom>(ctx.attempt())
                }
            }));
            assert_eq!(r.unwrap(), 1);
            assert_eq!(clock.now(), FAR + ms(100));
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
        }
    }
}

mod retry_long_runs {
    use super::*;

    #[test]
    fn thousands_of_attempts_keep_their_numbers_and_capped_delays() {
        for flavor in FLAVORS {
            let retries = [
                Retry::exponential(ms(1)).cap(secs(10)).jitter(Jitter::Full),
                Retry::decorrelated(ms(1), secs(10)),
                Retry::linear(ms(1)).cap(secs(10)),
            ];
            for retry in retries {
                let (b, clock, _) = builder("retry-long", false);
                let p = b.retry(retry.max_attempts(u32::MAX)).build().unwrap();
                let n = AtomicU32::new(0);
                let r = support::exec(&p, flavor, |ctx| {
                    let k = n.fetch_add(1, Ordering::SeqCst) + 1;
                    assert_eq!(k, ctx.attempt());
                    if k < 2_000 {
                        Err(Boom(k))
                    } else {
                        Ok(k)
                    }
                });
                assert_eq!(r.unwrap(), 2_000);
                assert!(clock.now() - FAR <= secs(10) * 1_999);
            }
        }
    }
}

#[cfg(feature = "serde")]
mod chaos_from_files {
    use super::*;
    use seawall::config::{Format, Registry};

    /// The pipeline `p` of a TOML text, on a virtual clock at [`FAR`].
    fn pipeline(text: &str) -> (Result<Pipeline, String>, VirtualClock) {
        let clock = VirtualClock::starting_at(FAR);
        let r = Registry::builder()
            .store(MemoryStore::new())
            .clock(clock.clone())
            .load_str(Format::Toml, text)
            .map(|r| r.pipeline("p").unwrap())
            .map_err(|e| e.to_string());
        (r, clock)
    }

    #[test]
    fn a_latency_declared_in_a_file_delays_each_attempt() {
        for flavor in FLAVORS {
            let (p, clock) = pipeline(
                "[pipelines.p]\nretry = { delay = \"1s\", max_attempts = 2 }\nchaos = { rate = 1.0, latency = \"200ms\" }\n",
            );
            let p = p.unwrap();
            let r = support::exec(&p, flavor, |ctx| {
                if ctx.attempt() == 1 {
                    Err(Boom(1))
                } else {
                    Ok(2)
                }
            });
            assert_eq!(r.unwrap(), 2);
            assert_eq!(clock.now(), FAR + ms(1_400));
        }
    }

    #[test]
    fn a_latency_switched_off_or_of_zero_in_a_file_injects_nothing() {
        for text in [
            "[pipelines.p]\nchaos = { rate = 1.0, latency = \"200ms\", enabled = false }\n",
            "[pipelines.p]\nchaos = { rate = 1.0, latency = \"0ms\" }\n",
            "[pipelines.p]\nchaos = { rate = 0.0, latency = \"200ms\" }\n",
        ] {
            for flavor in FLAVORS {
                let (p, clock) = pipeline(text);
                let p = p.unwrap();
                assert_eq!(
                    support::exec(&p, flavor, |_| Ok::<u32, Boom>(1)).unwrap(),
                    1
                );
                assert_eq!(clock.now(), FAR, "{text}");
            }
        }
    }

    #[test]
    fn a_rate_outside_the_unit_interval_in_a_file_is_refused() {
        for rate in ["1.5", "-0.1"] {
            let (p, _) = pipeline(&format!(
                "[pipelines.p]\nchaos = {{ rate = {rate}, latency = \"200ms\" }}\n"
            ));
            let e = p.map(|_| ()).unwrap_err();
            assert!(e.contains("chaos.rate"), "{e}");
        }
    }
}

mod chaos_composition {
    use super::*;

    fn injected(events: &Log) -> Vec<ChaosKind> {
        events
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                EventKind::ChaosInjected { kind, .. } => Some(*kind),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn injections_apply_in_declaration_order_and_latencies_add_up() {
        for flavor in FLAVORS {
            for listen in [false, true] {
                // Latencies first: both slept, then the fault.
                let (b, clock, events) = builder("chaos-order", listen);
                let p = b
                    .random(SequenceRandom::new([0.0]))
                    .chaos(Chaos::latency(1.0, ms(100)))
                    .chaos(Chaos::latency(1.0, ms(200)))
                    .chaos_fault(Chaos::fault(1.0, |_| Boom(5)))
                    .build()
                    .unwrap();
                let r = support::exec(&p, flavor, |_| Ok::<u32, Boom>(1));
                assert!(matches!(r, Err(Error::Operation(Boom(5)))), "{r:?}");
                assert_eq!(clock.now(), FAR + ms(300));
                if listen {
                    assert_eq!(
                        injected(&events),
                        [
                            ChaosKind::Latency { delay: ms(100) },
                            ChaosKind::Latency { delay: ms(200) },
                            ChaosKind::Fault
                        ]
                    );
                }
                // A fault declared first ends the attempt before the
                // latencies declared after it.
                let (b, clock, events) = builder("chaos-order", listen);
                let p = b
                    .random(SequenceRandom::new([0.0]))
                    .chaos_fault(Chaos::fault(1.0, |_| Boom(5)))
                    .chaos(Chaos::latency(1.0, ms(100)))
                    .build()
                    .unwrap();
                let r = support::exec(&p, flavor, |_| Ok::<u32, Boom>(1));
                assert!(matches!(r, Err(Error::Operation(Boom(5)))), "{r:?}");
                assert_eq!(clock.now(), FAR);
                if listen {
                    assert_eq!(injected(&events), [ChaosKind::Fault]);
                }
                // An outcome ends the attempt: the behaviour after it
                // does not run.
                let (b, clock, _) = builder("chaos-order", listen);
                let p = b
                    .random(SequenceRandom::new([0.0]))
                    .chaos(Chaos::latency(1.0, ms(100)))
                    .chaos_outcome::<u32, Boom>(Chaos::outcome(1.0, |_| 9))
                    .chaos(Chaos::behavior(1.0, |_| panic!("after the outcome")))
                    .build()
                    .unwrap();
                assert_eq!(
                    support::exec(&p, flavor, |_| Ok::<u32, Boom>(1)).unwrap(),
                    9
                );
                assert_eq!(clock.now(), FAR + ms(100));
            }
        }
    }

    #[test]
    fn a_switch_turned_on_during_a_call_takes_effect_on_its_next_attempt() {
        for flavor in FLAVORS {
            for listen in [false, true] {
                let (b, _, events) = builder("chaos-switch", listen);
                let switch = ChaosSwitch::new(false);
                let p = b
                    .retry(Retry::constant(ms(10)).max_attempts(3))
                    .chaos_fault(
                        Chaos::fault(1.0, |ctx| Boom(100 + ctx.attempt())).enabled(switch.clone()),
                    )
                    .build()
                    .unwrap();
                let r = support::exec(&p, flavor, |ctx| {
                    switch.set(true);
                    Err::<u32, _>(Boom(ctx.attempt()))
                });
                assert!(
                    matches!(
                        r,
                        Err(Error::RetryExhausted {
                            attempts: 3,
                            last: Boom(103)
                        })
                    ),
                    "{r:?}"
                );
                if listen {
                    assert_eq!(injected(&events), [ChaosKind::Fault, ChaosKind::Fault]);
                }
            }
        }
    }

    #[test]
    fn the_rate_generator_and_the_enabled_check_are_asked_for_each_attempt() {
        for flavor in FLAVORS {
            let (b, _, _) = builder("chaos-per-attempt", false);
            let asked = Arc::new(AtomicU32::new(0));
            let a = asked.clone();
            let rates = Arc::new(Mutex::new(Vec::new()));
            let rr = rates.clone();
            let p = b
                .retry(Retry::constant(ms(1)).max_attempts(3))
                .chaos(Chaos::latency(1.0, ms(5)).enabled_when(move || {
                    a.fetch_add(1, Ordering::SeqCst);
                    false
                }))
                .chaos_fault(Chaos::fault(0.5, |ctx| Boom(ctx.attempt())).rate_generator(
                    move |ctx| {
                        rr.lock().unwrap().push(ctx.attempt());
                        0.5
                    },
                ))
                // The disabled latency draws nothing: the fault draws 0.4,
                // 0.4 and 0.6.
                .random(SequenceRandom::new([0.4, 0.4, 0.6]))
                .build()
                .unwrap();
            let r = support::exec(&p, flavor, |ctx| Ok::<u32, Boom>(100 + ctx.attempt()));
            assert_eq!(r.unwrap(), 103);
            assert_eq!(asked.load(Ordering::SeqCst), 3);
            assert_eq!(*rates.lock().unwrap(), [1, 2, 3]);
        }
    }

    #[test]
    fn chaos_after_hedging_acts_on_each_hedged_attempt() {
        for listen in [false, true] {
            let (b, clock, events) = builder("chaos-hedge", listen);
            let p = b
                .hedging(Hedging::latency(ms(10)).max_hedged_attempts(2))
                .chaos(Chaos::latency(1.0, ms(100)).rate_generator(|ctx| {
                    if ctx.attempt() == 1 {
                        1.0
                    } else {
                        0.0
                    }
                }))
                .build()
                .unwrap();
            let r = block_on(p.run(|ctx| async move { Ok::<u32, Boom>(ctx.attempt()) }));
            assert_eq!(r.unwrap(), 2);
            assert_eq!(clock.now(), FAR + ms(10));
            if listen {
                assert_eq!(injected(&events), [ChaosKind::Latency { delay: ms(100) }]);
            }
        }
    }
}

mod hedging_deadlines {
    use super::*;

    #[test]
    fn each_hedged_attempt_gets_its_own_deadline_within_the_calls() {
        for listen in [false, true] {
            let (b, _, _) = builder("hedge-deadlines", listen);
            let p = b
                .timeout(ms(250))
                .hedging(Hedging::latency(ms(100)).max_hedged_attempts(2))
                .timeout(ms(200))
                .build()
                .unwrap();
            let seen = Arc::new(Mutex::new(Vec::new()));
            let s = seen.clone();
            let r = block_on(p.run(|ctx| {
                s.lock().unwrap().push((ctx.attempt(), ctx.remaining()));
                std::future::pending::<Result<u32, Boom>>()
            }));
            match r {
                Err(Error::Timeout(t)) => {
                    assert_eq!(t.scope, seawall::error::TimeoutScope::Overall)
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(
                *seen.lock().unwrap(),
                [(1, Some(ms(200))), (2, Some(ms(150))), (3, Some(ms(50)))]
            );
        }
    }

    #[test]
    fn when_every_hedged_attempt_times_out_the_call_times_out() {
        for listen in [false, true] {
            let (b, clock, _) = builder("hedge-all-timeout", listen);
            let p = b
                .hedging(Hedging::latency(ms(100)).max_hedged_attempts(2))
                .timeout(ms(150))
                .build()
                .unwrap();
            let r = block_on(p.run(|_| std::future::pending::<Result<u32, Boom>>()));
            match r {
                Err(Error::Timeout(t)) => {
                    assert_eq!(
                        (t.scope, t.attempts),
                        (seawall::error::TimeoutScope::Attempt, 3)
                    )
                }
                other => panic!("{other:?}"),
            }
            // Attempt 1 timed out at 150 ms and started attempt 3 at once;
            // attempt 2 (from 100 ms) and 3 time out at 250 and 300 ms.
            assert_eq!(clock.now(), FAR + ms(300));
        }
    }
}

mod giving_back {
    use super::*;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    #[test]
    fn a_call_dropped_during_its_retry_wait_gives_back_its_slot_and_probe() {
        for listen in [false, true] {
            let (b, clock, _) = builder("dropped-wait", listen);
            let p = b
                .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(5)))
                .bulkhead(Bulkhead::new(1))
                .retry(Retry::constant(secs(10)).max_attempts(3))
                .build()
                .unwrap();
            p.open_for(Duration::ZERO).unwrap();
            let runs = AtomicU32::new(0);
            let c = clock.clone();
            block_on(async {
                tokio::select! {
                    r = p.run(|_| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        async { Err::<u32, _>(Boom(1)) }
                    }) => panic!("the call ended: {r:?}"),
                    _ = Clock::sleep(&c, secs(5)) => {}
                }
            });
            assert_eq!(runs.load(Ordering::SeqCst), 1);
            assert_eq!(p.in_flight().unwrap(), 0);
            // The probe's slot is free: the next call is the probe.
            assert_eq!(p.circuit_state().unwrap(), CircuitState::HalfOpen);
            assert_eq!(
                block_on(p.run(|_| async { Ok::<u32, Boom>(1) })).unwrap(),
                1
            );
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
        }
    }

    #[test]
    fn a_panicking_callback_gives_back_what_the_attempt_holds() {
        for flavor in FLAVORS {
            let b = || {
                builder("panicking", false)
                    .0
                    .retry(Retry::constant(ms(1)).max_attempts(2))
                    .bulkhead(Bulkhead::new(1))
                    .circuit_breaker(CircuitBreaker::consecutive_failures(5))
            };
            fn check<K>(p: Pipeline<K>, flavor: Flavor)
            where
                K: seawall::pipeline::HandlesSync<u32, Boom>,
            {
                let r = catch_unwind(AssertUnwindSafe(|| {
                    support::exec(&p, flavor, |_| Err::<u32, _>(Boom(1)))
                }));
                assert!(r.is_err());
                assert_eq!(p.in_flight().unwrap(), 0);
                assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            }
            check(
                b().chaos(Chaos::behavior(1.0, |_| panic!("behaviour")))
                    .build()
                    .unwrap(),
                flavor,
            );
            check(
                b().chaos_fault(Chaos::fault(1.0, |_| -> Boom { panic!("fault") }))
                    .build()
                    .unwrap(),
                flavor,
            );
            check(
                b().on_retry(|_: &Boom, _, _| panic!("hook"))
                    .build()
                    .unwrap(),
                flavor,
            );
            check(
                b().classify(|_: &Boom| -> Verdict { panic!("classifier") })
                    .build()
                    .unwrap(),
                flavor,
            );
        }
        let (b, clock, _) = builder("panicking-hedge", false);
        let p = b
            .hedging(Hedging::latency(ms(10)).on_hedging(|_| panic!("hedging hook")))
            .bulkhead(Bulkhead::new(2))
            .build()
            .unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            block_on(p.run(|_| {
                let c = clock.clone();
                async move {
                    Clock::sleep(&c, secs(1)).await;
                    Ok::<u32, Boom>(1)
                }
            }))
        }));
        assert!(r.is_err());
        assert_eq!(p.in_flight().unwrap(), 0);
    }
}

mod composition {
    use super::*;

    #[test]
    fn a_pipeline_without_policies_runs_the_operation_once() {
        for flavor in FLAVORS {
            let p = Pipeline::builder("empty").build().unwrap();
            let runs = AtomicU32::new(0);
            let r = support::exec(&p, flavor, |_| {
                runs.fetch_add(1, Ordering::SeqCst);
                Err::<u32, _>(Boom(1))
            });
            assert!(matches!(r, Err(Error::Operation(Boom(1)))), "{r:?}");
            assert_eq!(runs.load(Ordering::SeqCst), 1);
            let r = support::exec(&p, flavor, |ctx| {
                Ok::<_, Boom>((ctx.attempt(), ctx.remaining()))
            });
            assert_eq!(r.unwrap(), (1, None));
        }
    }

    #[test]
    fn a_policy_declared_twice_on_one_side_is_refused() {
        let e = Pipeline::builder("twice")
            .retry(Retry::constant(secs(1)))
            .retry(Retry::constant(secs(1)))
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("declared twice"), "{e}");
        let e = Pipeline::builder("both")
            .retry(Retry::constant(secs(1)))
            .hedging(Hedging::parallel())
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("hedging"), "{e}");
    }
}

mod circuit_breaker_verdicts {
    use super::*;

    /// A probe's verdict decides the half-open circuit: a failure opens
    /// it again, an abort (the dependency answered) closes it like a
    /// success, an ignored or throttled error gives the probe's slot back
    /// to the next call.
    #[test]
    fn a_probes_verdict_decides_the_half_open_circuit() {
        let cases = [
            (Verdict::failure(), CircuitState::Open),
            (Verdict::retry(), CircuitState::Open),
            (Verdict::abort(), CircuitState::Closed),
            (Verdict::ignore(), CircuitState::HalfOpen),
            (Verdict::throttled(), CircuitState::HalfOpen),
            (
                Verdict::throttled().with_retry_after(secs(2)),
                CircuitState::HalfOpen,
            ),
        ];
        for (verdict, after) in cases {
            for flavor in FLAVORS {
                for listen in [false, true] {
                    let (b, _, _) = builder("breaker-verdicts", listen);
                    let p = b
                        .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(5)))
                        .classify(move |_: &Boom| verdict)
                        .build()
                        .unwrap();
                    p.open_for(Duration::ZERO).unwrap();
                    let r = support::exec(&p, flavor, |_| Err::<u32, _>(Boom(1)));
                    assert!(matches!(r, Err(Error::Operation(Boom(1)))), "{r:?}");
                    assert_eq!(p.circuit_state().unwrap(), after, "{verdict:?}");
                    let r = support::exec(&p, flavor, |_| Ok::<u32, Boom>(1));
                    if after == CircuitState::Open {
                        assert!(matches!(r, Err(Error::Rejected(_))), "{r:?}");
                    } else {
                        assert_eq!(r.unwrap(), 1);
                        assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
                    }
                }
            }
        }
    }
}

mod rate_limiter_waits {
    use super::*;

    #[test]
    fn each_algorithm_refuses_with_the_exact_wait_for_its_next_permit() {
        // Two permits per 10 s, calls at 3 s and 4 s past a window start.
        let cases = [
            (RateLimiter::fixed_window(2, secs(10)), secs(6)),
            (RateLimiter::sliding_window(2, secs(10)), secs(9)),
            (RateLimiter::gcra(2, secs(10)), secs(4)),
        ];
        for (limiter, wait) in cases {
            for flavor in FLAVORS {
                let (b, clock, _) = builder("rate-exact", false);
                let p = b.rate_limiter(limiter.clone()).build().unwrap();
                clock.advance(secs(3));
                assert!(support::exec(&p, flavor, |_| Ok::<u32, Boom>(1)).is_ok());
                clock.advance(secs(1));
                assert!(support::exec(&p, flavor, |_| Ok::<u32, Boom>(1)).is_ok());
                let r = support::exec(&p, flavor, |_| Ok::<u32, Boom>(1));
                match r {
                    Err(Error::Rejected(rej)) => {
                        assert_eq!(rej.reason, RejectionReason::RateLimited);
                        assert_eq!(rej.retry_after, Some(wait), "{limiter:?}");
                    }
                    other => panic!("{other:?}"),
                }
                // A weight the limit can never hold is refused without a wait.
                let w = p.weighted(3).unwrap();
                let r = match flavor {
                    Flavor::Sync => w.call(|_| Ok::<u32, Boom>(1)),
                    Flavor::Async => block_on(w.run(|_| async { Ok::<u32, Boom>(1) })),
                };
                assert!(
                    matches!(r, Err(Error::Rejected(ref rej)) if rej.retry_after.is_none()),
                    "{r:?}"
                );
                clock.advance(wait);
                assert!(support::exec(&p, flavor, |_| Ok::<u32, Boom>(1)).is_ok());
            }
        }
        assert!(Pipeline::builder("rate-weight")
            .rate_limiter(RateLimiter::gcra(2, secs(1)))
            .build()
            .unwrap()
            .weighted(0)
            .is_err());
    }
}

mod chaos_sync_timeouts {
    use super::*;

    /// In sync code the timeout is cooperative: an injected latency is
    /// slept whole, as a slow blocking operation would take its time, and
    /// the attempt is late: reported (lenient) or a timeout (strict).
    #[test]
    fn a_sync_latency_past_the_attempt_timeout_makes_the_attempt_late() {
        for strict in [false, true] {
            for listen in [false, true] {
                let (b, clock, events) = builder("chaos-sync-late", listen);
                let t = if strict {
                    Timeout::strict(ms(100))
                } else {
                    Timeout::new(ms(100))
                };
                let p = b
                    .retry(Retry::constant(ms(10)).max_attempts(2))
                    .timeout(t)
                    .chaos(Chaos::latency(1.0, secs(1)))
                    .build()
                    .unwrap();
                let runs = AtomicU32::new(0);
                let r = p.call(|ctx| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Boom>(ctx.remaining())
                });
                if strict {
                    match r {
                        Err(Error::Timeout(t)) => assert_eq!(t.attempts, 2),
                        other => panic!("{other:?}"),
                    }
                    assert_eq!(runs.load(Ordering::SeqCst), 2);
                    assert_eq!(clock.now(), FAR + ms(2_010));
                } else {
                    // The operation ran with no time left.
                    assert_eq!(r.unwrap(), Some(Duration::ZERO));
                    assert_eq!(clock.now(), FAR + secs(1));
                    if listen {
                        assert_eq!(
                            count(&events, |e| matches!(
                                e,
                                EventKind::DeadlineExceeded { late_by } if *late_by == ms(900)
                            )),
                            1
                        );
                    }
                }
            }
        }
    }
}
