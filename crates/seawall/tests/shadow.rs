//! Shadow mode (`seawall::shadow`) through pipelines on the memory store:
//! a stateful policy in shadow mode keeps the state an enforcing one would
//! keep, reports what it would refuse and never refuses, sync and async,
//! with and without a listener, on clocks at 0 and at 10^6 s.
//!
//! The strongest check is `shadow_mode_decides_as_enforcing_mode`: the same
//! random calls through a pipeline whose policies enforce and through one
//! whose policies are in shadow mode; each refusal of the first must be a
//! `ShadowRejected` of the second with the same reason and `retry_after`,
//! and the circuits must stay in the same state.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use seawall::breaker::CircuitState;
use seawall::testing::VirtualClock;
use seawall::{
    Bulkhead, CircuitBreaker, Cooldown, Error, EventKind, Pipeline, RateLimiter, Rejection,
    RejectionReason, Verdict,
};
use support::{exec, ms, recorder, secs, unique, Boom, Flavor, FAR, FLAVORS};

fn clock_at(offset: Duration) -> VirtualClock {
    support::clock_at(offset)
}

/// The `ShadowRejected` events of a log, as rejections.
fn shadow_rejections(log: &support::Log) -> Vec<Rejection> {
    log.lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            EventKind::ShadowRejected {
                reason,
                retry_after,
            } => Some(Rejection::new(*reason, *retry_after)),
            _ => None,
        })
        .collect()
}

fn ok(_: seawall::Context) -> Result<u32, Boom> {
    Ok(1)
}

fn boom(_: seawall::Context) -> Result<u32, Boom> {
    Err(Boom(1))
}

#[test]
fn a_shadow_breaker_opens_reports_and_never_refuses() {
    for flavor in FLAVORS {
        for offset in [Duration::ZERO, FAR] {
            let clock = clock_at(offset);
            let (log, listener) = recorder();
            let p = Pipeline::builder(unique("shadow-breaker"))
                .circuit_breaker(
                    CircuitBreaker::consecutive_failures(2)
                        .cooldown(secs(30))
                        .shadow(true),
                )
                .clock(clock.clone())
                .on_event(listener)
                .build()
                .unwrap();
            assert!(exec(&p, flavor, boom).is_err());
            assert!(exec(&p, flavor, boom).is_err());
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
            clock.advance(secs(10));
            // Would be refused: runs, and its failure is not recorded.
            assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
            assert!(matches!(
                exec(&p, flavor, boom),
                Err(Error::Operation(Boom(1)))
            ));
            let m = p.circuit_metrics().unwrap();
            assert_eq!((m.state, m.trips), (CircuitState::Open, 1), "{flavor:?}");
            assert_eq!(
                shadow_rejections(&log),
                vec![Rejection::new(RejectionReason::CircuitOpen, Some(secs(20))); 2]
            );
            // The cooldown ends as it would: the next call is the probe.
            clock.advance(secs(20));
            assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            let kinds = log.lock().unwrap().clone();
            let transitions: Vec<&EventKind> = kinds
                .iter()
                .filter(|e| {
                    matches!(
                        e,
                        EventKind::CircuitOpened { .. }
                            | EventKind::CircuitHalfOpened
                            | EventKind::CircuitClosed
                    )
                })
                .collect();
            assert_eq!(
                transitions,
                [
                    &EventKind::CircuitOpened { cooldown: secs(30) },
                    &EventKind::CircuitHalfOpened,
                    &EventKind::CircuitClosed
                ]
            );
        }
    }
}

#[test]
fn a_shadow_breaker_half_open_admits_past_its_probes_without_counting_them() {
    let clock = VirtualClock::new();
    let (log, listener) = recorder();
    let p = Pipeline::builder(unique("shadow-probes"))
        .circuit_breaker(
            CircuitBreaker::consecutive_failures(1)
                .cooldown(secs(5))
                .shadow(true),
        )
        .clock(clock.clone())
        .on_event(listener)
        .build()
        .unwrap();
    assert!(p.call(boom).is_err());
    clock.advance(secs(5));
    // The probe succeeds; while it runs, a call past the probe slot runs
    // too and fails, which counts for nothing.
    let nested = p.call(|_| {
        let inner = p.call(boom);
        assert!(matches!(inner, Err(Error::Operation(Boom(1)))));
        Ok::<_, Boom>(7)
    });
    assert_eq!(nested.unwrap(), 7);
    assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
    assert_eq!(
        shadow_rejections(&log),
        [Rejection::new(RejectionReason::CircuitOpen, Some(secs(5)))]
    );
}

#[test]
fn a_shadow_bulkhead_never_refuses_and_holds_at_most_its_limit() {
    const THREADS: usize = 8;
    const CALLS: usize = 300;
    let shadowed = Arc::new(AtomicU32::new(0));
    let seen = Arc::clone(&shadowed);
    let p = Pipeline::builder(unique("shadow-bulkhead"))
        .bulkhead(Bulkhead::new(2).shadow(true))
        .on_event(move |e| {
            if let EventKind::ShadowRejected { reason, .. } = e.kind {
                assert_eq!(reason, RejectionReason::BulkheadFull);
                seen.fetch_add(1, Ordering::Relaxed);
            }
        })
        .build()
        .unwrap();
    let most = AtomicU32::new(0);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                for _ in 0..CALLS {
                    let r = p.call(|_| {
                        let held = p.in_flight().unwrap();
                        most.fetch_max(held, Ordering::Relaxed);
                        std::thread::yield_now();
                        Ok::<_, Boom>(held)
                    });
                    assert!(r.unwrap() <= 2);
                }
            });
        }
    });
    assert!(most.load(Ordering::Relaxed) <= 2);
    // Shadowed calls held no slot and gave none back.
    assert_eq!(p.in_flight().unwrap(), 0);
    // Deterministically: four calls nested in one another, two slots.
    let before = shadowed.load(Ordering::Relaxed);
    let depth = |p: &Pipeline| {
        p.call(|_| p.call(|_| p.call(|_| p.call(|_| Ok::<_, Boom>(p.in_flight().unwrap())))))
    };
    assert_eq!(depth(&p).unwrap(), 2);
    assert_eq!(shadowed.load(Ordering::Relaxed) - before, 2);
    assert_eq!(p.in_flight().unwrap(), 0);
}

#[test]
fn a_shadow_rate_limiter_reports_each_call_over_the_limit_and_never_waits() {
    for flavor in FLAVORS {
        for offset in [Duration::ZERO, FAR] {
            let clock = clock_at(offset);
            let (log, listener) = recorder();
            let p = Pipeline::builder(unique("shadow-rate"))
                .rate_limiter(
                    RateLimiter::fixed_window(3, secs(1))
                        .max_wait(secs(5))
                        .shadow(true),
                )
                .clock(clock.clone())
                .on_event(listener)
                .build()
                .unwrap();
            for _ in 0..10 {
                assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
            }
            assert_eq!(clock.now(), offset, "{flavor:?}: nothing waited");
            let r = shadow_rejections(&log);
            assert_eq!(r.len(), 7, "{flavor:?}");
            assert!(r.iter().all(
                |r| r.reason == RejectionReason::RateLimited && r.retry_after == Some(secs(1))
            ));
            // The limiter's state is that of one that refused them: three
            // permits in the next window.
            clock.advance(secs(1));
            for _ in 0..3 {
                exec(&p, flavor, ok).unwrap();
            }
            assert_eq!(shadow_rejections(&log).len(), 7);
            exec(&p, flavor, ok).unwrap();
            assert_eq!(shadow_rejections(&log).len(), 8);
        }
    }
}

#[test]
fn a_shadow_cooldown_lets_calls_through_and_takes_no_hint_from_them() {
    let classify = |e: &Boom| Verdict::throttled().with_retry_after(secs(u64::from(e.0)));
    for flavor in FLAVORS {
        let clock = VirtualClock::new();
        let (log, listener) = recorder();
        let p = Pipeline::builder(unique("shadow-cooldown"))
            .cooldown(Cooldown::new().max_wait(secs(30)).shadow(true))
            .classify(classify)
            .clock(clock.clone())
            .on_event(listener)
            .build()
            .unwrap();
        assert!(exec(&p, flavor, |_| Err::<u32, _>(Boom(2))).is_err());
        // During the pause: runs at once; its own (longer) hint is not
        // taken, the call would not have run.
        assert!(exec(&p, flavor, |_| Err::<u32, _>(Boom(9))).is_err());
        assert_eq!(clock.now(), Duration::ZERO, "{flavor:?}: nothing waited");
        assert_eq!(
            shadow_rejections(&log),
            [Rejection::new(
                RejectionReason::CooldownActive,
                Some(secs(2))
            )]
        );
        clock.advance(secs(2));
        exec(&p, flavor, ok).unwrap();
        assert_eq!(
            shadow_rejections(&log).len(),
            1,
            "{flavor:?}: the pause ended at 2 s"
        );
        let started = log
            .lock()
            .unwrap()
            .iter()
            .filter(|e| matches!(e, EventKind::CooldownStarted { .. }))
            .count();
        assert_eq!(started, 1);
    }
}

#[test]
fn an_enforcing_policy_still_refuses_a_call_a_shadow_policy_admitted() {
    let (log, listener) = recorder();
    let p = Pipeline::builder(unique("shadow-and-enforcing"))
        .circuit_breaker(
            CircuitBreaker::consecutive_failures(1)
                .cooldown(secs(60))
                .shadow(true),
        )
        .rate_limiter(RateLimiter::fixed_window(1, secs(60)))
        .on_event(listener)
        .build()
        .unwrap();
    assert!(p.call(boom).is_err());
    assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
    // The permit went to the first call: the enforcing limiter refuses, and
    // the shadow circuit's would-be refusal is not reported for it.
    let refused = p.call(ok).unwrap_err();
    assert!(matches!(refused, Error::Rejected(r) if r.reason == RejectionReason::RateLimited));
    assert!(shadow_rejections(&log).is_empty());
}

#[test]
fn without_a_listener_a_shadow_policy_decides_the_same() {
    // The ordinary path (no listener, memory store) takes the engine's
    // general admission for a refusal in shadow mode.
    for flavor in FLAVORS {
        let clock = VirtualClock::new();
        let p = Pipeline::builder(unique("shadow-quiet"))
            .circuit_breaker(
                CircuitBreaker::consecutive_failures(1)
                    .cooldown(secs(5))
                    .shadow(true),
            )
            .bulkhead(Bulkhead::new(1).shadow(true))
            .rate_limiter(RateLimiter::gcra(1, secs(1)).shadow(true))
            .clock(clock.clone())
            .build()
            .unwrap();
        assert!(exec(&p, flavor, boom).is_err());
        for _ in 0..5 {
            assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
        }
        assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
        assert_eq!(p.in_flight().unwrap(), 0);
        clock.advance(secs(5));
        exec(&p, flavor, ok).unwrap();
        assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
    }
}

#[test]
fn switching_shadow_mode_off_keeps_the_state_the_shadow_kept() {
    let store = seawall::MemoryStore::new();
    let clock = VirtualClock::new();
    let build = |shadow: bool| {
        Pipeline::builder("rollout")
            .circuit_breaker(
                CircuitBreaker::consecutive_failures(1)
                    .cooldown(secs(60))
                    .shadow(shadow),
            )
            .rate_limiter(RateLimiter::fixed_window(2, secs(60)).shadow(shadow))
            .store(store.clone())
            .clock(clock.clone())
            .strict_names()
            .build()
            .unwrap()
    };
    let watching = build(true);
    assert!(watching.call(boom).is_err());
    assert_eq!(watching.call(ok).unwrap(), 1);
    // The same limits, enforced (a reload): the open circuit and the spent
    // permits are those the shadow kept; a live pipeline of the name that
    // differs in shadow mode only shares them (`strict_names` allows it).
    let enforcing = build(false);
    let refused = enforcing.call(ok).unwrap_err();
    assert!(matches!(refused, Error::Rejected(r) if r.reason == RejectionReason::CircuitOpen));
    clock.advance(secs(60));
    assert_eq!(enforcing.circuit_state().unwrap(), CircuitState::Open);
    // The probe is admitted by the circuit; the fixed window of 60 s
    // started at 0 is over, so a permit is free.
    assert_eq!(enforcing.call(ok).unwrap(), 1);
    assert_eq!(watching.circuit_state().unwrap(), CircuitState::Closed);
    drop(watching);
}

// ------------------------------------------------ shadow against enforcing

/// One call of a run: the clock moves, then the operation ends as told.
#[derive(Debug, Clone, Copy)]
struct Step {
    advance: Duration,
    /// 0: success, 1: failure, 2: throttled (a retry-after hint of
    /// `hint` ms).
    outcome: u8,
    hint: u64,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = (
        prop_oneof![
            3 => Just(Duration::ZERO),
            3 => (1u64..400).prop_map(ms),
            1 => (1u64..4).prop_map(secs),
        ],
        0u8..3,
        1u64..3_000,
    )
        .prop_map(|(advance, outcome, hint)| Step {
            advance,
            outcome,
            hint,
        });
    prop::collection::vec(step, 1..60)
}

/// Specs of one to four policies; the limiters and the cooldown refuse at
/// once (an enforcing `max_wait` would make calls wait instead).
fn policies() -> impl Strategy<
    Value = (
        Option<CircuitBreaker>,
        Option<Cooldown>,
        Option<RateLimiter>,
    ),
> {
    let limiter = (0u8..3, 1u32..4, 100u64..2_000).prop_map(|(alg, limit, per)| match alg {
        0 => RateLimiter::gcra(limit, ms(per)),
        1 => RateLimiter::fixed_window(limit, ms(per)),
        _ => RateLimiter::sliding_window(limit, ms(per)),
    });
    (
        proptest::option::weighted(0.7, seawall::model::breaker::strategy::any_breaker()),
        proptest::option::weighted(0.5, Just(Cooldown::new().max_wait(Duration::ZERO))),
        proptest::option::weighted(0.6, limiter),
    )
}

fn pipeline(
    name: &str,
    (circuit, cooldown, rate): &(
        Option<CircuitBreaker>,
        Option<Cooldown>,
        Option<RateLimiter>,
    ),
    shadow: bool,
    clock: &VirtualClock,
    log: impl Fn(&seawall::Event<'_>) + Send + Sync + 'static,
) -> Pipeline<seawall::pipeline::ErrorType<Boom>> {
    let mut b = Pipeline::builder(name.to_owned())
        .classify(|e: &Boom| match e.0 {
            0 => Verdict::retry(),
            ms => Verdict::throttled().with_retry_after(Duration::from_millis(u64::from(ms))),
        })
        .clock(clock.clone())
        .on_event(log);
    if let Some(c) = circuit {
        b = b.circuit_breaker(c.clone().shadow(shadow));
    }
    b = b.bulkhead(Bulkhead::new(1).shadow(shadow));
    if let Some(c) = cooldown {
        b = b.cooldown(c.clone().shadow(shadow));
    }
    if let Some(r) = rate {
        b = b.rate_limiter(r.clone().shadow(shadow));
    }
    b.build().unwrap()
}

fn compare(
    policies: &(
        Option<CircuitBreaker>,
        Option<Cooldown>,
        Option<RateLimiter>,
    ),
    steps: &[Step],
    flavor: Flavor,
    offset: Duration,
) -> Result<(), TestCaseError> {
    let clock = clock_at(offset);
    let enforcing = pipeline(&unique("enforcing"), policies, false, &clock, |_| {});
    let (log, listener) = recorder();
    let shadow = pipeline(&unique("shadow"), policies, true, &clock, listener);
    for (i, step) in steps.iter().enumerate() {
        clock.advance(step.advance);
        let outcome = move |_: seawall::Context| -> Result<u32, Boom> {
            match step.outcome {
                0 => Ok(1),
                1 => Err(Boom(0)),
                _ => Err(Boom(step.hint as u32)),
            }
        };
        let expected = exec(&enforcing, flavor, outcome);
        let before = shadow_rejections(&log).len();
        let got = exec(&shadow, flavor, outcome);
        let reported = shadow_rejections(&log)[before..].to_vec();
        match expected {
            Err(Error::Rejected(r)) => {
                prop_assert_eq!(reported, vec![r], "call {}", i);
                prop_assert!(
                    !matches!(got, Err(Error::Rejected(_))),
                    "call {}: {:?}",
                    i,
                    got
                );
            }
            other => {
                prop_assert!(reported.is_empty(), "call {}: {:?}", i, reported);
                prop_assert_eq!(format!("{other:?}"), format!("{got:?}"), "call {}", i);
            }
        }
        if policies.0.is_some() {
            prop_assert_eq!(
                enforcing.circuit_metrics().unwrap(),
                shadow.circuit_metrics().unwrap(),
                "call {}",
                i
            );
        }
        prop_assert_eq!(shadow.in_flight().unwrap(), 0);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 128,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    /// A pipeline whose policies are in shadow mode reports exactly the
    /// refusals of the same pipeline enforcing, call by call, and keeps the
    /// same circuit.
    #[test]
    fn shadow_mode_decides_as_enforcing_mode(
        policies in policies(),
        steps in steps(),
        flavor in prop_oneof![Just(Flavor::Sync), Just(Flavor::Async)],
        far in any::<bool>(),
    ) {
        compare(&policies, &steps, flavor, if far { FAR } else { Duration::ZERO })?;
    }
}

/// A fixed adaptive limit of 2 in shadow mode (AIMD pinned at 2: the
/// limit cannot move, so what the test reads is the shadow rule alone).
fn shadow_limit() -> seawall::AdaptiveLimit {
    seawall::AdaptiveLimit::aimd().limits(2, 2, 2).shadow(true)
}

/// Four attempts nested in one another, async: the innermost reads the
/// attempts in flight.
async fn nested_async(p: &Pipeline, depth: u32) -> Result<u32, Error<Boom>> {
    if depth == 0 {
        return Ok(p.concurrency_limit().unwrap().in_flight);
    }
    p.run(|_| Box::pin(async move { nested_async(p, depth - 1).await.map_err(|_| Boom(0)) }))
        .await
}

fn nested_sync(p: &Pipeline, depth: u32) -> Result<u32, Error<Boom>> {
    if depth == 0 {
        return Ok(p.concurrency_limit().unwrap().in_flight);
    }
    p.call(|_| nested_sync(p, depth - 1).map_err(|_| Boom(0)))
}

#[test]
fn a_shadow_adaptive_limit_never_refuses_nor_queues_and_lends_no_slot() {
    for flavor in FLAVORS {
        for offset in [Duration::ZERO, FAR] {
            for listen in [false, true] {
                let clock = clock_at(offset);
                let (log, listener) = recorder();
                let mut b = Pipeline::builder(unique("shadow-adaptive"))
                    // A queue that an enforcing limit would make the
                    // attempts over it wait in.
                    .adaptive_limit(shadow_limit().queue(8, secs(1)))
                    .clock(clock.clone());
                if listen {
                    b = b.on_event(listener);
                }
                let p = b.build().unwrap();
                // Four attempts in flight at once: the two over the limit
                // run at once and hold no slot.
                let innermost = match flavor {
                    Flavor::Sync => nested_sync(&p, 4),
                    Flavor::Async => support::rt().block_on(nested_async(&p, 4)),
                };
                assert_eq!(innermost.unwrap(), 2, "{flavor:?}");
                assert_eq!(clock.now(), offset, "nothing waited");
                assert_eq!(p.concurrency_limit().unwrap().in_flight, 0);
                if listen {
                    let r = shadow_rejections(&log);
                    assert_eq!(r.len(), 2, "{r:?}");
                    assert!(r
                        .iter()
                        .all(|r| r.reason == RejectionReason::ConcurrencyLimited));
                }
                // Enforcing, the same nesting is refused at the third.
                let p = Pipeline::builder(unique("enforcing-adaptive"))
                    .adaptive_limit(shadow_limit().shadow(false))
                    .clock(clock.clone())
                    .build()
                    .unwrap();
                let e = match flavor {
                    Flavor::Sync => nested_sync(&p, 4),
                    Flavor::Async => support::rt().block_on(nested_async(&p, 4)),
                };
                assert!(e.is_err(), "{e:?}");
            }
        }
    }
}

#[test]
fn a_shadow_adaptive_limit_holds_at_most_its_limit_across_threads() {
    const THREADS: usize = 8;
    const CALLS: usize = 300;
    let p = Pipeline::builder(unique("shadow-adaptive-threads"))
        .adaptive_limit(shadow_limit())
        .build()
        .unwrap();
    let most = AtomicU32::new(0);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                for _ in 0..CALLS {
                    let r = p.call(|_| {
                        let held = p.concurrency_limit().unwrap().in_flight;
                        most.fetch_max(held, Ordering::Relaxed);
                        std::thread::yield_now();
                        Ok::<_, Boom>(held)
                    });
                    assert!(r.unwrap() <= 2);
                }
            });
        }
    });
    assert!(most.load(Ordering::Relaxed) <= 2);
    assert_eq!(p.concurrency_limit().unwrap().in_flight, 0);
}

// ------------------------------------------------- across the levels

/// Runs `during` while a call through `p` (made with `flavor` on another
/// thread) is in its operation, then lets that call end with `Ok(0)`; its
/// result comes back with `during`'s. A call `p` refuses at once (an
/// enforcing refusal) holds nothing: `during` runs after it.
fn while_held<R>(
    p: &Pipeline<seawall::pipeline::ErrorType<Boom>>,
    flavor: Flavor,
    during: impl FnOnce() -> R,
) -> (Result<u32, Error<Boom>>, R) {
    let (entered, wait_entered) = std::sync::mpsc::channel::<()>();
    let (release, wait_release) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let entered_op = entered.clone();
        let holder = s.spawn(move || {
            let r = exec(p, flavor, |_| {
                entered_op.send(()).unwrap();
                wait_release.recv().unwrap();
                Ok(0)
            });
            let _ = entered.send(());
            r
        });
        wait_entered.recv().unwrap();
        let r = during();
        let _ = release.send(());
        (holder.join().unwrap(), r)
    })
}

/// A pipeline `name` on a memory store, `shaped` by the test, its stateful
/// policies enforcing or in shadow mode (`shadow`), with a listener
/// recording its events when `listen`.
fn levels(
    name: &str,
    clock: &VirtualClock,
    listen: bool,
    shaped: impl FnOnce(
        seawall::PipelineBuilder<seawall::pipeline::ErrorType<Boom>>,
    ) -> seawall::PipelineBuilder<seawall::pipeline::ErrorType<Boom>>,
) -> (Pipeline<seawall::pipeline::ErrorType<Boom>>, support::Log) {
    let (log, listener) = recorder();
    let mut b = Pipeline::builder(unique(name))
        .store(seawall::MemoryStore::new())
        .clock(clock.clone())
        .classify(|_: &Boom| Verdict::retry());
    if listen {
        b = b.on_event(listener);
    }
    (shaped(b).build().unwrap(), log)
}

/// What a circuit counted: its state, its calls and failures.
fn counts(p: &Pipeline<seawall::pipeline::ErrorType<Boom>>) -> (CircuitState, u64, u64) {
    let m = p.circuit_metrics().unwrap();
    (m.state, m.calls, m.failures)
}

/// Every combination the pipeline tests run on: sync and async, with and
/// without a listener, on clocks at 0 and at 10^6 s.
fn each_run(mut test: impl FnMut(Flavor, bool, &VirtualClock)) {
    for flavor in FLAVORS {
        for listen in [false, true] {
            for offset in [Duration::ZERO, FAR] {
                test(flavor, listen, &clock_at(offset));
            }
        }
    }
}

#[test]
fn an_attempt_refused_in_shadow_leaves_the_shadow_policies_before_the_retry_what_enforcing_records()
{
    each_run(|flavor, listen, clock| {
        let mk = |s: bool| {
            levels("levels-attempt", clock, listen, |b| {
                b.circuit_breaker(CircuitBreaker::consecutive_failures(1).shadow(s))
                    .retry(seawall::Retry::constant(ms(10)).max_attempts(2))
                    .rate_limiter(RateLimiter::fixed_window(1, secs(3600)).shadow(s))
            })
        };
        let ((e, _), (s, log)) = (mk(false), mk(true));
        // The second attempt is refused by the limiter: the enforcing call
        // ends with the failure of its first attempt, which the circuit
        // before the retry records (it opens); in shadow mode the call goes
        // on, and the circuit records that same failure, not the call's own
        // outcome.
        let refused = Rejection::new(RejectionReason::RateLimited, Some(secs(3600)));
        match exec(&e, flavor, boom) {
            Err(Error::Rejected(r)) => assert_eq!(r.reason, RejectionReason::RateLimited),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            exec(&s, flavor, boom),
            Err(Error::RetryExhausted { attempts: 2, .. })
        ));
        assert_eq!(e.circuit_state().unwrap(), CircuitState::Open);
        assert_eq!(
            s.circuit_state().unwrap(),
            CircuitState::Open,
            "{flavor:?} {listen}"
        );
        assert_eq!(counts(&e), counts(&s));
        if listen {
            let r = shadow_rejections(&log);
            assert_eq!(r.len(), 1, "{r:?}");
            assert_eq!(r[0].reason, refused.reason);
        }
    });
}

#[test]
fn a_call_shadowed_before_the_retry_takes_no_permit_after_it() {
    each_run(|flavor, listen, clock| {
        let mk = |s: bool| {
            levels("levels-call", clock, listen, |b| {
                b.circuit_breaker(
                    CircuitBreaker::consecutive_failures(1)
                        .cooldown(secs(3600))
                        .shadow(s),
                )
                .retry(seawall::Retry::constant(ms(10)).max_attempts(1))
                .rate_limiter(RateLimiter::fixed_window(2, secs(3600)).shadow(s))
            })
        };
        let ((e, _), (s, log)) = (mk(false), mk(true));
        for p in [&e, &s] {
            // Opens the circuit, takes permit 1.
            assert!(matches!(
                exec(p, flavor, boom),
                Err(Error::Operation(_) | Error::RetryExhausted { .. })
            ));
        }
        assert!(matches!(
            exec(&e, flavor, ok),
            Err(Error::Rejected(r)) if r.reason == RejectionReason::CircuitOpen
        ));
        // Refused by the circuit in shadow mode: it runs, and takes no
        // permit of the limiter it would not have reached.
        assert_eq!(exec(&s, flavor, ok).unwrap(), 1);
        e.reset().unwrap();
        s.reset().unwrap();
        assert_eq!(exec(&e, flavor, ok).unwrap(), 1);
        let before = shadow_rejections(&log).len();
        assert_eq!(exec(&s, flavor, ok).unwrap(), 1);
        assert_eq!(
            shadow_rejections(&log)[before..],
            [],
            "{flavor:?} listening {listen}: permit 2 was free"
        );
        // Both limiters are spent now.
        assert!(matches!(
            exec(&e, flavor, ok),
            Err(Error::Rejected(r)) if r.reason == RejectionReason::RateLimited
        ));
        if listen {
            let before = shadow_rejections(&log).len();
            assert_eq!(exec(&s, flavor, ok).unwrap(), 1);
            let r = shadow_rejections(&log)[before..].to_vec();
            assert_eq!(r.len(), 1, "{r:?}");
            assert_eq!(r[0].reason, RejectionReason::RateLimited);
        }
    });
}

#[test]
fn an_attempt_over_a_shadow_adaptive_limit_is_not_judged_by_the_shadow_policies_after_it() {
    each_run(|flavor, listen, clock| {
        let mk = |s: bool| {
            levels("levels-adaptive", clock, listen, |b| {
                b.adaptive_limit(seawall::AdaptiveLimit::aimd().limits(1, 1, 1).shadow(s))
                    .circuit_breaker(CircuitBreaker::consecutive_failures(1).shadow(s))
            })
        };
        let ((e, _), (s, log)) = (mk(false), mk(true));
        let (held, during) =
            while_held(&e, flavor, || exec(&e, flavor, |_| Err::<u32, _>(Boom(2))));
        assert_eq!(held.unwrap(), 0);
        assert!(
            matches!(during, Err(Error::Rejected(r)) if r.reason == RejectionReason::ConcurrencyLimited),
            "{during:?}"
        );
        let (held, during) =
            while_held(&s, flavor, || exec(&s, flavor, |_| Err::<u32, _>(Boom(2))));
        assert_eq!(held.unwrap(), 0);
        assert!(
            matches!(during, Err(Error::Operation(Boom(2)))),
            "{during:?}"
        );
        assert_eq!(e.circuit_state().unwrap(), CircuitState::Closed);
        assert_eq!(
            s.circuit_state().unwrap(),
            CircuitState::Closed,
            "{flavor:?} {listen}"
        );
        assert_eq!(counts(&e), counts(&s));
        assert_eq!(s.concurrency_limit().unwrap().in_flight, 0);
        if listen {
            let r = shadow_rejections(&log);
            assert_eq!(r.len(), 1, "{r:?}");
            assert_eq!(r[0].reason, RejectionReason::ConcurrencyLimited);
        }
    });
}

// ------------------------------- shadow against enforcing, across levels

/// Which side of the retry a stateful policy stands on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// Declared before the retry: it admits the call once.
    Call,
    /// Declared after the retry: it admits each attempt.
    Attempt,
}

fn side() -> impl Strategy<Value = Side> {
    prop_oneof![Just(Side::Call), Just(Side::Attempt)]
}

/// A pipeline with policies on both sides of a retry, and an adaptive
/// limit of 1 on the attempts.
#[derive(Debug, Clone)]
struct Layered {
    circuit: Option<(CircuitBreaker, Side)>,
    bulkhead: Option<Side>,
    cooldown: Option<Side>,
    rate: Option<(RateLimiter, Side)>,
    attempts: u32,
    adaptive: bool,
}

fn layered() -> impl Strategy<Value = Layered> {
    let limiter = (0u8..3, 1u32..4, 100u64..2_000).prop_map(|(alg, limit, per)| match alg {
        0 => RateLimiter::gcra(limit, ms(per)),
        1 => RateLimiter::fixed_window(limit, ms(per)),
        _ => RateLimiter::sliding_window(limit, ms(per)),
    });
    (
        proptest::option::weighted(
            0.7,
            (seawall::model::breaker::strategy::any_breaker(), side()),
        ),
        proptest::option::weighted(0.5, side()),
        proptest::option::weighted(0.5, side()),
        proptest::option::weighted(0.6, (limiter, side())),
        1u32..4,
        any::<bool>(),
    )
        .prop_map(
            |(circuit, bulkhead, cooldown, rate, attempts, adaptive)| Layered {
                circuit,
                bulkhead,
                cooldown,
                rate,
                attempts,
                adaptive,
            },
        )
}

/// One call of a layered run: the clock moves, then each attempt ends as
/// told (0: success; 1: a retried failure; 2: a failure not retried with
/// a retry-after hint of `hint` ms), while another call holds the
/// adaptive limit's slot when `held`.
#[derive(Debug, Clone, Copy)]
struct LayeredStep {
    advance: Duration,
    outcomes: [u8; 3],
    hint: u64,
    held: bool,
}

fn layered_steps() -> impl Strategy<Value = Vec<LayeredStep>> {
    let step = (
        prop_oneof![
            3 => Just(Duration::ZERO),
            3 => (1u64..400).prop_map(ms),
            1 => (1u64..4).prop_map(secs),
        ],
        prop::array::uniform3(prop_oneof![2 => Just(0u8), 3 => Just(1u8), 1 => Just(2u8)]),
        1u64..3_000,
        prop::bool::weighted(0.3),
    )
        .prop_map(|(advance, outcomes, hint, held)| LayeredStep {
            advance,
            outcomes,
            hint,
            held,
        });
    prop::collection::vec(step, 1..50)
}

/// The layered pipeline, its policies enforcing or in shadow mode. The
/// retry waits for nothing (a retried failure has no hint), so that both
/// pipelines see every attempt at the same instant.
fn layered_pipeline(
    l: &Layered,
    shadow: bool,
    clock: &VirtualClock,
    log: Option<impl Fn(&seawall::Event<'_>) + Send + Sync + 'static>,
) -> Pipeline<seawall::pipeline::ErrorType<Boom>> {
    type B = seawall::PipelineBuilder<seawall::pipeline::ErrorType<Boom>>;
    let mut b = Pipeline::builder(unique(if shadow { "layered-shadow" } else { "layered" }))
        .store(seawall::MemoryStore::new())
        .classify(|e: &Boom| match e.0 {
            0 => Verdict::retry(),
            ms => Verdict::failure().with_retry_after(Duration::from_millis(u64::from(ms))),
        })
        .clock(clock.clone());
    if let Some(log) = log {
        b = b.on_event(log);
    }
    let side = |mut b: B, at: Side| {
        if let Some((c, _)) = l.circuit.as_ref().filter(|(_, s)| *s == at) {
            b = b.circuit_breaker(c.clone().shadow(shadow));
        }
        if l.bulkhead == Some(at) {
            b = b.bulkhead(Bulkhead::new(1).shadow(shadow));
        }
        if l.cooldown == Some(at) {
            b = b.cooldown(Cooldown::new().max_wait(Duration::ZERO).shadow(shadow));
        }
        if let Some((r, _)) = l.rate.as_ref().filter(|(_, s)| *s == at) {
            b = b.rate_limiter(r.clone().shadow(shadow));
        }
        b
    };
    b = side(b, Side::Call);
    b = b.retry(seawall::Retry::constant(Duration::ZERO).max_attempts(l.attempts));
    if l.adaptive {
        b = b.adaptive_limit(
            seawall::AdaptiveLimit::aimd()
                .limits(1, 1, 1)
                .shadow(shadow),
        );
    }
    side(b, Side::Attempt).build().unwrap()
}

/// The step's call through `p` (with another call holding the adaptive
/// limit's slot when `held`): the results of the holder, if any, and of
/// the call.
fn layered_call(
    p: &Pipeline<seawall::pipeline::ErrorType<Boom>>,
    step: LayeredStep,
    flavor: Flavor,
) -> Vec<Result<u32, Error<Boom>>> {
    let op = move |ctx: seawall::Context| -> Result<u32, Boom> {
        let i = (ctx.attempt() as usize - 1).min(2);
        match step.outcomes[i] {
            0 => Ok(1),
            1 => Err(Boom(0)),
            _ => Err(Boom(step.hint as u32)),
        }
    };
    if step.held {
        let (held, r) = while_held(p, flavor, || exec(p, flavor, op));
        vec![held, r]
    } else {
        vec![exec(p, flavor, op)]
    }
}

fn compare_layered(
    l: &Layered,
    steps: &[LayeredStep],
    flavor: Flavor,
    offset: Duration,
) -> Result<(), TestCaseError> {
    let clock = clock_at(offset);
    let enforcing = layered_pipeline(l, false, &clock, None::<fn(&seawall::Event<'_>)>);
    let (log, listener) = recorder();
    let shadow = layered_pipeline(l, true, &clock, Some(listener));
    // The same without a listener: the engine's ordinary path.
    let quiet = layered_pipeline(l, true, &clock, None::<fn(&seawall::Event<'_>)>);
    for (i, &step) in steps.iter().enumerate() {
        clock.advance(step.advance);
        let expected = layered_call(&enforcing, step, flavor);
        let before = shadow_rejections(&log).len();
        let got = layered_call(&shadow, step, flavor);
        let reported = shadow_rejections(&log)[before..].to_vec();
        let unheard = layered_call(&quiet, step, flavor);
        let refusals: Vec<Rejection> = expected
            .iter()
            .filter_map(|r| match r {
                Err(Error::Rejected(r)) => Some(*r),
                _ => None,
            })
            .collect();
        prop_assert_eq!(reported, refusals, "call {}: {:?}", i, expected);
        for (e, (g, u)) in expected.iter().zip(got.iter().zip(&unheard)) {
            prop_assert_eq!(format!("{g:?}"), format!("{u:?}"), "call {}", i);
            match e {
                Err(Error::Rejected(_)) => {
                    prop_assert!(!matches!(g, Err(Error::Rejected(_))), "call {}: {:?}", i, g);
                }
                other => prop_assert_eq!(format!("{other:?}"), format!("{g:?}"), "call {}", i),
            }
        }
        if l.circuit.is_some() {
            let m = enforcing.circuit_metrics().unwrap();
            prop_assert_eq!(&m, &shadow.circuit_metrics().unwrap(), "call {}", i);
            prop_assert_eq!(&m, &quiet.circuit_metrics().unwrap(), "call {}", i);
        }
        for p in [&shadow, &quiet] {
            prop_assert_eq!(p.in_flight().unwrap(), 0);
            if l.adaptive {
                prop_assert_eq!(p.concurrency_limit().unwrap().in_flight, 0);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 128,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    /// Policies on both sides of a retry, and an adaptive limit: a
    /// pipeline whose policies are in shadow mode (with a listener, and
    /// without one) reports exactly the refusals of the same pipeline
    /// enforcing, call by call, decides the rest the same and keeps the
    /// same circuit.
    #[test]
    fn shadow_mode_decides_as_enforcing_mode_across_levels(
        l in layered(),
        steps in layered_steps(),
        flavor in prop_oneof![Just(Flavor::Sync), Just(Flavor::Async)],
        far in any::<bool>(),
    ) {
        compare_layered(&l, &steps, flavor, if far { FAR } else { Duration::ZERO })?;
    }
}
