//! What a user of another resilience library expects of each policy, pinned
//! down on seawall's public API: the adaptive concurrency limit (admission,
//! refusal, its queue, its starting limits and its settings), hedging (when
//! hedges start, which answer wins, its budget), the cache in front of
//! coalescing, the retry budget, the order in which policies compose, and
//! the classic retry, circuit breaker, bulkhead, rate limiter, timeout and
//! fallback.
//!
//! Every case runs on the default path: the in-memory store, a virtual clock
//! started far from 0, no listener; sync and async where both exist, and
//! with a listener where the events are part of the behaviour. Where
//! seawall departs on purpose from what such a user may expect (its own
//! refusals are never retried, a retry gives up when its wait would not fit
//! the deadline, a permit or a slot a call cannot have within its deadline
//! is the policy's refusal rather than a timeout, hedging and retry are one
//! per pipeline, the fallback is outermost, a cooldown is never zero, every
//! half-open probe must succeed), the case asserts seawall's documented
//! behaviour.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seawall::hedge::HedgeDelay;
use seawall::store::MemoryStore;
use seawall::testing::VirtualClock;
use seawall::*;
use support::*;

/// The result of one call in these cases.
type Outcome = Result<u32, Error<Boom>>;

/// A builder on a fresh store and a virtual clock already far from 0.
fn builder(name: &str) -> (PipelineBuilder, VirtualClock) {
    let clock = clock_at(FAR);
    let b = Pipeline::builder(unique(name))
        .store(MemoryStore::new())
        .clock(clock.clone());
    (b, clock)
}

/// The same with a listener recording every event.
fn builder_listening(name: &str) -> (PipelineBuilder, VirtualClock, Log) {
    let (b, clock) = builder(name);
    let (log, listener) = recorder();
    (b.on_event(listener), clock, log)
}

/// Sleeps `d` on the clock, then answers `r`.
async fn after<T>(clock: &VirtualClock, d: Duration, r: T) -> T {
    Clock::sleep(clock, d).await;
    r
}

/// One async call of `p` whose attempts never answer: its result and the
/// attempts it started.
fn never_answering(p: &Pipeline) -> (Outcome, u32) {
    let started = AtomicU32::new(0);
    let r = rt().block_on(p.run(|_| {
        started.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<Result<u32, Boom>>()
    }));
    (r, started.load(Ordering::SeqCst))
}

mod adaptive_limit {
    use super::*;

    #[test]
    fn an_adaptive_limit_below_its_limit_admits_the_call() {
        for flavor in FLAVORS {
            let (b, _) = builder("fs-al-below");
            let p = b
                .adaptive_limit(AdaptiveLimit::aimd().limits(2, 2, 2))
                .build()
                .unwrap();
            let r = exec(&p, flavor, |_| Ok::<_, Boom>("test"));
            assert_eq!(r.unwrap(), "test", "{flavor:?}");
            assert_eq!(p.concurrency_limit().unwrap().in_flight, 0);
        }
    }

    #[test]
    fn an_adaptive_limit_at_its_limit_refuses_without_running() {
        for listening in [false, true] {
            let (b, _, log) = builder_listening("fs-al-full");
            let b = if listening {
                b
            } else {
                builder("fs-al-full").0
            };
            let p = b
                .adaptive_limit(AdaptiveLimit::gradient2().limits(2, 2, 2))
                .build()
                .unwrap();
            let ran = AtomicU32::new(0);
            // Two attempts in flight (nested), the third refused.
            let r = p.call(|_| {
                p.call(|_| {
                    let inner = p.call(|_| {
                        ran.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Boom>(1)
                    });
                    Ok::<_, Boom>(inner)
                })
            });
            let inner = r.unwrap();
            assert_eq!(
                reason(&inner),
                Some(RejectionReason::ConcurrencyLimited),
                "{inner:?}"
            );
            assert_eq!(ran.load(Ordering::SeqCst), 0);
            assert_eq!(p.concurrency_limit().unwrap().in_flight, 0);
            if listening {
                assert_eq!(refusals(&log, RejectionReason::ConcurrencyLimited), 1);
            }
        }
    }

    #[test]
    fn an_adaptive_limit_holds_a_slot_while_the_attempt_runs_and_gives_it_back() {
        for flavor in FLAVORS {
            let (b, _) = builder("fs-al-slot");
            let p = b
                .adaptive_limit(AdaptiveLimit::aimd().limits(1, 1, 20))
                .build()
                .unwrap();
            let mut seen = None;
            let r = exec(&p, flavor, |_| {
                seen = Some(p.concurrency_limit().unwrap().in_flight);
                Err::<u32, _>(Boom(1))
            });
            assert!(matches!(r, Err(Error::Operation(Boom(1)))), "{r:?}");
            assert_eq!(seen, Some(1), "{flavor:?}");
            assert_eq!(p.concurrency_limit().unwrap().in_flight, 0);
            // The slot is free again: the next call runs.
            assert_eq!(exec(&p, flavor, |_| Ok::<_, Boom>(2)).unwrap(), 2);
        }
    }

    #[test]
    fn adaptive_limits_start_at_twenty_or_at_the_initial_limit_given() {
        for limit in [
            AdaptiveLimit::aimd(),
            AdaptiveLimit::vegas(),
            AdaptiveLimit::gradient2(),
        ] {
            let (b, _) = builder("fs-al-initial");
            let p = b.adaptive_limit(limit).build().unwrap();
            let snap = p.concurrency_limit().unwrap();
            assert_eq!((snap.limit, snap.in_flight), (20, 0));
        }
        let (b, _) = builder("fs-al-initial");
        let p = b
            .adaptive_limit(AdaptiveLimit::aimd().limits(1, 5, 10))
            .build()
            .unwrap();
        assert_eq!(p.concurrency_limit().unwrap().limit, 5);
    }

    #[test]
    fn adaptive_limit_settings_out_of_range_are_refused_at_build() {
        let bad = [
            (AdaptiveLimit::aimd().limits(2, 1, 2), "initial_limit"),
            (AdaptiveLimit::aimd().limits(0, 0, 2), "min_limit"),
            (AdaptiveLimit::aimd().limits(1, 3, 2), "initial_limit"),
            (AdaptiveLimit::aimd().limits(3, 3, 2), "max_limit"),
            (AdaptiveLimit::aimd().backoff_ratio(0.4), "backoff_ratio"),
            (
                AdaptiveLimit::aimd().backoff_ratio(f64::NAN),
                "backoff_ratio",
            ),
            (AdaptiveLimit::gradient2().smoothing(0.0), "smoothing"),
            (AdaptiveLimit::gradient2().buffer(-0.1), "buffer"),
            (AdaptiveLimit::vegas().min_rtt_jitter(1.5), "min_rtt_jitter"),
            (
                AdaptiveLimit::vegas().min_rtt_jitter(f64::NAN),
                "min_rtt_jitter",
            ),
            (AdaptiveLimit::aimd().queue(2, Duration::ZERO), "max_wait"),
            (
                AdaptiveLimit::aimd().update_interval(Duration::ZERO),
                "update_interval",
            ),
            (AdaptiveLimit::aimd().buffer(0.1), "buffer"),
        ];
        for (limit, field) in bad {
            let e = Pipeline::builder("fs-al-bad")
                .adaptive_limit(limit.clone())
                .build()
                .expect_err(&format!("{limit:?}"));
            assert_eq!((e.policy, e.field), ("adaptive_limit", field), "{limit:?}");
        }
    }

    #[test]
    fn a_queued_attempt_takes_the_slot_given_back() {
        let (b, clock) = builder("fs-al-queue");
        let p = b
            .adaptive_limit(AdaptiveLimit::aimd().limits(2, 2, 2).queue(3, secs(1)))
            .build()
            .unwrap();
        let start = clock.now();
        let (a, b2, c) = rt().block_on(async {
            tokio::join!(
                p.run(|_| after(&clock, ms(100), Ok::<_, Boom>(1))),
                p.run(|_| after(&clock, ms(100), Ok::<_, Boom>(2))),
                p.run(|_| async { Ok::<_, Boom>(3) }),
            )
        });
        assert_eq!((a.unwrap(), b2.unwrap(), c.unwrap()), (1, 2, 3));
        assert_eq!(clock.now() - start, ms(100));
        assert_eq!(p.concurrency_limit().unwrap().in_flight, 0);
    }

    #[test]
    fn a_queued_attempt_is_refused_when_its_max_wait_runs_out() {
        let (b, clock) = builder("fs-al-maxwait");
        let p = b
            .adaptive_limit(AdaptiveLimit::aimd().limits(1, 1, 2).queue(3, ms(20)))
            .build()
            .unwrap();
        let start = clock.now();
        let ran = AtomicU32::new(0);
        let (a, refused) = rt().block_on(async {
            tokio::join!(
                p.run(|_| after(&clock, ms(100), Ok::<_, Boom>(1))),
                p.run(|_| {
                    ran.fetch_add(1, Ordering::SeqCst);
                    async { Ok::<_, Boom>(2) }
                }),
            )
        });
        assert_eq!(a.unwrap(), 1);
        assert_eq!(reason(&refused), Some(RejectionReason::ConcurrencyLimited));
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        assert_eq!(clock.now() - start, ms(100));
    }

    #[test]
    fn a_full_queue_refuses_at_once_and_a_sync_call_never_waits() {
        let (b, clock) = builder("fs-al-queue-full");
        let p = b
            .adaptive_limit(AdaptiveLimit::aimd().limits(1, 1, 2).queue(1, secs(1)))
            .build()
            .unwrap();
        let refused_at = Mutex::new(None);
        let (a, b2, c) = rt().block_on(async {
            tokio::join!(
                p.run(|_| after(&clock, ms(100), Ok::<_, Boom>(1))),
                p.run(|_| async { Ok::<_, Boom>(2) }),
                async {
                    let r = p.run(|_| async { Ok::<_, Boom>(3) }).await;
                    *refused_at.lock().unwrap() = Some(clock.now());
                    r
                },
            )
        });
        assert_eq!((a.unwrap(), b2.unwrap()), (1, 2));
        assert_eq!(reason(&c), Some(RejectionReason::ConcurrencyLimited));
        assert_eq!(refused_at.into_inner().unwrap(), Some(FAR));
        // A blocking call is refused at once instead of queueing.
        let nested = p.call(|_| Ok::<_, Boom>(p.call(|_| Ok::<_, Boom>(4))));
        assert_eq!(
            reason(&nested.unwrap()),
            Some(RejectionReason::ConcurrencyLimited)
        );
    }

    #[test]
    fn aimd_backs_off_on_drops_once_per_update_window() {
        for flavor in FLAVORS {
            let (b, clock, log) = builder_listening("fs-al-aimd");
            let p = b
                .adaptive_limit(
                    AdaptiveLimit::aimd()
                        .limits(1, 10, 20)
                        .update_interval(ms(100)),
                )
                .build()
                .unwrap();
            for _ in 0..3 {
                let _ = exec(&p, flavor, |_| Err::<u32, _>(Boom(1)));
            }
            clock.advance(ms(100));
            let _ = exec(&p, flavor, |_| Err::<u32, _>(Boom(1)));
            let limit = p.concurrency_limit().unwrap().limit;
            assert_eq!(limit, 9, "{flavor:?}");
            let changes: Vec<_> = log
                .lock()
                .unwrap()
                .iter()
                .filter_map(|e| match e {
                    EventKind::LimitChanged { previous, limit } => Some((*previous, *limit)),
                    _ => None,
                })
                .collect();
            assert_eq!(changes, [(10, 9)], "{flavor:?}");
        }
    }
}

mod hedging {
    use super::*;

    /// Runs one hedged call whose attempt `n` answers `plans[n - 1]` after
    /// its delay (never for `None`); returns the result, the attempts
    /// started and the time the call took.
    fn hedged(
        hedging: Hedging,
        plans: &[(Option<u64>, Result<u32, Boom>)],
        listening: bool,
    ) -> (Result<u32, Error<Boom>>, Vec<u32>, Duration, Log) {
        let (b, clock, log) = builder_listening("fs-hedge");
        let b = if listening {
            b
        } else {
            let (b, c) = builder("fs-hedge");
            return run_hedged(b.hedging(hedging), c, plans, log);
        };
        run_hedged(b.hedging(hedging), clock, plans, log)
    }

    fn run_hedged(
        b: PipelineBuilder,
        clock: VirtualClock,
        plans: &[(Option<u64>, Result<u32, Boom>)],
        log: Log,
    ) -> (Result<u32, Error<Boom>>, Vec<u32>, Duration, Log) {
        let p = b.build().unwrap();
        let started = Arc::new(Mutex::new(Vec::new()));
        let start = clock.now();
        let r = rt().block_on(p.run(|ctx: Context| {
            let n = ctx.attempt();
            started.lock().unwrap().push(n);
            let (delay, result) = plans[n as usize - 1].clone();
            let clock = clock.clone();
            async move {
                match delay {
                    Some(d) => Clock::sleep(&clock, ms(d)).await,
                    None => std::future::pending::<()>().await,
                }
                result
            }
        }));
        let started = started.lock().unwrap().clone();
        (r, started, clock.now() - start, log)
    }

    fn hedges(log: &Log) -> usize {
        count(log, |e| matches!(e, EventKind::HedgeStarted { .. }))
    }

    #[test]
    fn no_hedge_starts_while_the_first_attempt_answers_within_the_delay() {
        for listening in [false, true] {
            let (r, started, took, log) =
                hedged(Hedging::latency(secs(1)), &[(Some(999), Ok(1))], listening);
            assert_eq!((r.unwrap(), started, took), (1, vec![1], ms(999)));
            assert_eq!(hedges(&log), 0);
        }
    }

    #[test]
    fn every_hedge_starts_after_its_delay_and_the_first_answer_wins() {
        for listening in [false, true] {
            let plans = [(Some(100), Ok(1)), (Some(100), Ok(2)), (Some(100), Ok(3))];
            let (r, started, took, log) = hedged(
                Hedging::latency(ms(20)).max_hedged_attempts(2),
                &plans,
                listening,
            );
            // Hedges at 20 and 40 ms; the first attempt answers first.
            assert_eq!((r.unwrap(), started, took), (1, vec![1, 2, 3], ms(100)));
            if listening {
                assert_eq!(hedges(&log), 2);
            }
        }
    }

    #[test]
    fn a_slow_first_attempt_loses_to_a_fast_hedge() {
        let plans = [(Some(100), Ok(1)), (Some(1), Ok(2)), (Some(1), Ok(3))];
        let (r, started, took, _) = hedged(
            Hedging::latency(ms(10)).max_hedged_attempts(2),
            &plans,
            false,
        );
        assert_eq!((r.unwrap(), started, took), (2, vec![1, 2], ms(11)));
    }

    #[test]
    fn parallel_hedging_starts_every_attempt_at_once() {
        let plans = [(Some(3), Ok(1)), (Some(2), Ok(2)), (Some(1), Ok(3))];
        let (r, started, took, _) =
            hedged(Hedging::parallel().max_hedged_attempts(2), &plans, false);
        assert_eq!((r.unwrap(), started, took), (3, vec![1, 2, 3], ms(1)));
    }

    #[test]
    fn a_generator_that_waits_for_a_failure_starts_no_hedge_on_a_success() {
        let (r, started, _, _) = hedged(
            Hedging::dynamic(|_| HedgeDelay::OnFailure).max_hedged_attempts(2),
            &[(Some(500), Ok(2))],
            false,
        );
        assert_eq!((r.unwrap(), started), (2, vec![1]));
    }

    #[test]
    fn an_attempt_that_answers_first_wins_while_earlier_ones_still_run() {
        let plans = [(None, Ok(0)), (None, Ok(0)), (Some(0), Ok(3))];
        let (r, started, took, _) = hedged(
            Hedging::latency(ms(10)).max_hedged_attempts(4),
            &plans,
            false,
        );
        assert_eq!((r.unwrap(), started, took), (3, vec![1, 2, 3], ms(20)));
    }

    #[test]
    fn failed_hedges_do_not_win_and_a_later_success_does() {
        // Three slow attempts; the fourth fails fast and starts the fifth
        // at once, which fails too; the first then answers.
        let plans = [
            (Some(100), Ok(3)),
            (Some(100), Ok(3)),
            (Some(100), Ok(3)),
            (Some(0), Err(Boom(4))),
            (Some(0), Err(Boom(5))),
        ];
        for listening in [false, true] {
            let (r, started, took, log) = hedged(
                Hedging::latency(ms(10)).max_hedged_attempts(4),
                &plans,
                listening,
            );
            assert_eq!(
                (r.unwrap(), started, took),
                (3, vec![1, 2, 3, 4, 5], ms(100))
            );
            if listening {
                assert_eq!(hedges(&log), 4);
            }
        }
    }

    #[test]
    fn when_every_attempt_fails_the_call_fails_with_the_last_error() {
        let plans = [(Some(50), Err(Boom(1))), (Some(50), Err(Boom(2)))];
        let (r, started, _, _) = hedged(Hedging::latency(ms(10)), &plans, false);
        assert!(
            matches!(
                r,
                Err(Error::RetryExhausted {
                    attempts: 2,
                    last: Boom(2)
                })
            ),
            "{r:?}"
        );
        assert_eq!(started, [1, 2]);
    }

    #[test]
    fn an_empty_hedging_budget_starts_no_hedge_and_the_first_attempt_answers() {
        let (b, clock, log) = builder_listening("fs-hedge-budget");
        let p = b
            .hedging(Hedging::latency(ms(10)).budget(RetryBudget::new(0.5, 1)))
            .build()
            .unwrap();
        let mut attempts = Vec::new();
        for _ in 0..2 {
            let started = Arc::new(AtomicU32::new(0));
            let s = started.clone();
            let r = rt().block_on(p.run(|ctx: Context| {
                s.fetch_add(1, Ordering::SeqCst);
                let clock = clock.clone();
                let n = ctx.attempt();
                async move { after(&clock, ms(100), Ok::<_, Boom>(n)).await }
            }));
            assert_eq!(r.unwrap(), 1);
            attempts.push(started.load(Ordering::SeqCst));
        }
        // The bucket starts full (1 token): the first call hedges; the
        // second has earned half a token only.
        assert_eq!(attempts, [2, 1]);
        assert_eq!(hedges(&log), 1);
        let exhausted = count(&log, |e| {
            matches!(e, EventKind::HedgeBudgetExhausted { .. })
        });
        assert_eq!(exhausted, 1);
    }

    #[test]
    fn a_timeout_before_hedging_bounds_every_attempt() {
        let (b, clock) = builder("fs-hedge-timeout");
        let p = b
            .timeout(ms(100))
            .hedging(Hedging::latency(ms(10)).max_hedged_attempts(2))
            .build()
            .unwrap();
        let start = clock.now();
        let r = rt().block_on(p.run(|_| std::future::pending::<Result<u32, Boom>>()));
        assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
        assert_eq!(clock.now() - start, ms(100));
    }

    #[test]
    fn an_attempt_timeout_after_hedging_times_each_attempt_out() {
        let (b, clock) = builder("fs-hedge-attempt-timeout");
        let p = b
            .hedging(Hedging::latency(ms(10)).max_hedged_attempts(2))
            .timeout(ms(100))
            .build()
            .unwrap();
        let start = clock.now();
        let (r, started) = never_answering(&p);
        assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
        assert_eq!(started, 3);
        // The last attempt started at 20 ms and timed out 100 ms later.
        assert_eq!(clock.now() - start, ms(120));
    }

    #[test]
    fn the_fallback_answers_a_hedged_call_whose_attempts_all_failed() {
        let (b, clock) = builder("fs-hedge-fallback");
        let p = b
            .hedging(Hedging::latency(ms(10)))
            .fallback_sync(|e: Error<Boom>, _| {
                assert!(matches!(e, Error::RetryExhausted { attempts: 2, .. }));
                Ok::<bool, Boom>(true)
            })
            .build()
            .unwrap();
        let r = rt().block_on(p.run(|_| after(&clock, ms(50), Err(Boom(1)))));
        assert!(r.unwrap());
    }

    #[test]
    fn hedging_and_retry_in_one_pipeline_are_refused_at_build() {
        let e = Pipeline::builder("fs-hedge-retry")
            .retry(Retry::constant(ms(1)))
            .hedging(Hedging::latency(ms(10)))
            .build()
            .unwrap_err();
        assert_eq!((e.policy, e.field), ("pipeline", "hedging"), "{e}");
    }
}

mod cache {
    use super::*;

    fn cached(ttl: Duration, listening: bool) -> (Pipeline, VirtualClock, Log) {
        let (b, clock, log) = builder_listening("fs-cache");
        let b = if listening { b } else { builder("fs-cache").0 };
        let b = b.clock(clock.clone());
        let p = b.coalesce(Coalesce::new().ttl(ttl)).build().unwrap();
        (p, clock, log)
    }

    fn hits_and_misses(log: &Log) -> (usize, usize) {
        (
            count(log, |e| matches!(e, EventKind::CacheHit)),
            count(log, |e| matches!(e, EventKind::CacheMiss)),
        )
    }

    fn keyed(
        p: &Pipeline,
        flavor: Flavor,
        key: &'static str,
        value: &'static str,
        ran: &AtomicU32,
    ) -> Result<&'static str, Error<Boom>> {
        match flavor {
            Flavor::Sync => p.coalesce_key(key).call(|_| {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok(value)
            }),
            Flavor::Async => rt().block_on(p.coalesce_key(key).run(|_| {
                ran.fetch_add(1, Ordering::SeqCst);
                async move { Ok(value) }
            })),
        }
    }

    #[test]
    fn a_cached_success_answers_the_next_call_with_its_key_without_running() {
        for flavor in FLAVORS {
            for listening in [false, true] {
                let (p, _, log) = cached(secs(60), listening);
                let ran = AtomicU32::new(0);
                assert_eq!(keyed(&p, flavor, "foo", "bar", &ran).unwrap(), "bar");
                assert_eq!(keyed(&p, flavor, "foo", "missing", &ran).unwrap(), "bar");
                assert_eq!(ran.load(Ordering::SeqCst), 1, "{flavor:?}");
                if listening {
                    assert_eq!(hits_and_misses(&log), (1, 1));
                }
                // Another key runs.
                assert_eq!(keyed(&p, flavor, "foo2", "other", &ran).unwrap(), "other");
            }
        }
    }

    #[test]
    fn a_call_without_a_key_never_uses_the_cache() {
        for flavor in FLAVORS {
            let (p, _, log) = cached(secs(60), true);
            for value in ["bar", "missing"] {
                let r = exec(&p, flavor, |_| Ok::<_, Boom>(value));
                assert_eq!(r.unwrap(), value);
            }
            assert_eq!(hits_and_misses(&log), (0, 0));
        }
    }

    #[test]
    fn an_error_is_never_cached() {
        for flavor in FLAVORS {
            let (p, _, log) = cached(secs(60), true);
            let r: Result<&str, _> = match flavor {
                Flavor::Sync => p.coalesce_key("foo").call(|_| Err(Boom(1))),
                Flavor::Async => {
                    rt().block_on(p.coalesce_key("foo").run(|_| async { Err(Boom(1)) }))
                }
            };
            assert!(matches!(r, Err(Error::Operation(Boom(1)))), "{r:?}");
            let ran = AtomicU32::new(0);
            assert_eq!(keyed(&p, flavor, "foo", "bar", &ran).unwrap(), "bar");
            assert_eq!(ran.load(Ordering::SeqCst), 1);
            assert_eq!(hits_and_misses(&log), (0, 2));
        }
    }

    #[test]
    fn a_cached_success_expires_after_its_ttl() {
        for flavor in FLAVORS {
            let (p, clock, _) = cached(secs(5), false);
            let ran = AtomicU32::new(0);
            keyed(&p, flavor, "foo", "bar", &ran).unwrap();
            clock.advance(secs(5) - Duration::from_nanos(1));
            assert_eq!(keyed(&p, flavor, "foo", "new", &ran).unwrap(), "bar");
            clock.advance(Duration::from_nanos(1));
            assert_eq!(keyed(&p, flavor, "foo", "new", &ran).unwrap(), "new");
            assert_eq!(ran.load(Ordering::SeqCst), 2, "{flavor:?}");
        }
    }

    #[test]
    fn the_cache_keeps_the_success_that_followed_retries() {
        for flavor in FLAVORS {
            let (b, _, log) = builder_listening("fs-cache-retry");
            let p = b
                .coalesce(Coalesce::new().ttl(secs(60)))
                .retry(Retry::constant(ms(10)).max_attempts(3))
                .build()
                .unwrap();
            let ran = AtomicU32::new(0);
            let op = |_: Context| {
                let n = ran.fetch_add(1, Ordering::SeqCst) + 1;
                if n <= 2 {
                    Err(Boom(n))
                } else {
                    Ok("bar")
                }
            };
            let first = match flavor {
                Flavor::Sync => p.coalesce_key("foo").call(op),
                Flavor::Async => rt().block_on(p.coalesce_key("foo").run(|c| {
                    let r = op(c);
                    async move { r }
                })),
            };
            assert_eq!(first.unwrap(), "bar");
            let again = p
                .coalesce_key("foo")
                .call(|_| Ok::<_, Boom>("missing"))
                .unwrap();
            assert_eq!((again, ran.load(Ordering::SeqCst)), ("bar", 3));
            let retries = count(&log, |e| matches!(e, EventKind::RetryScheduled { .. }));
            assert_eq!((retries, hits_and_misses(&log)), (2, (1, 1)));
        }
    }

    #[test]
    fn a_fallback_value_is_never_cached() {
        let (b, _) = builder("fs-cache-fallback");
        let p = b
            .coalesce(Coalesce::new().ttl(secs(60)))
            .fallback_sync(|_e: Error<Boom>, _| Ok::<_, Boom>("fallback"))
            .build()
            .unwrap();
        let r = p.coalesce_key("foo").call(|_| Err(Boom(1)));
        assert_eq!(r.unwrap(), "fallback");
        let r = p.coalesce_key("foo").call(|_| Ok("real"));
        assert_eq!(r.unwrap(), "real");
    }

    #[test]
    fn the_least_recently_used_entry_is_evicted_at_max_entries() {
        let (b, _) = builder("fs-cache-lru");
        let p = b
            .coalesce(Coalesce::new().ttl(secs(60)).max_entries(2))
            .build()
            .unwrap();
        let ran = AtomicU32::new(0);
        keyed(&p, Flavor::Sync, "a", "a1", &ran).unwrap();
        keyed(&p, Flavor::Sync, "b", "b1", &ran).unwrap();
        // Touch a, then c evicts b.
        assert_eq!(keyed(&p, Flavor::Sync, "a", "a2", &ran).unwrap(), "a1");
        keyed(&p, Flavor::Sync, "c", "c1", &ran).unwrap();
        assert_eq!(keyed(&p, Flavor::Sync, "a", "a3", &ran).unwrap(), "a1");
        assert_eq!(keyed(&p, Flavor::Sync, "b", "b2", &ran).unwrap(), "b2");
    }

    #[test]
    fn cache_settings_out_of_range_are_refused_at_build() {
        for (c, field) in [
            (Coalesce::new().ttl(Duration::ZERO), "ttl"),
            (Coalesce::new().ttl(secs(1)).max_entries(0), "max_entries"),
            (Coalesce::new().max_entries(5), "max_entries"),
        ] {
            let e = Pipeline::builder("fs-cache-bad")
                .coalesce(c)
                .build()
                .unwrap_err();
            assert_eq!(e.field, field, "{e}");
        }
    }
}

mod retry_budget {
    use super::*;

    #[test]
    fn a_retry_runs_while_the_budget_has_a_token() {
        for flavor in FLAVORS {
            for budget in [RetryBudget::new(0.5, 1), RetryBudget::new(0.5, 1).shared()] {
                let (b, _) = builder("fs-budget-ok");
                let p = b
                    .retry(Retry::constant(ms(10)).max_attempts(3).budget(budget))
                    .build()
                    .unwrap();
                let mut n = 0;
                let r = exec(&p, flavor, |_| {
                    n += 1;
                    if n == 1 {
                        Err(Boom(1))
                    } else {
                        Ok(true)
                    }
                });
                assert!(r.unwrap(), "{flavor:?}");
                assert_eq!(n, 2);
            }
        }
    }

    #[test]
    fn a_retry_finding_the_budget_empty_ends_the_call() {
        for flavor in FLAVORS {
            for shared in [false, true] {
                let (b, _, log) = builder_listening("fs-budget-empty");
                let budget = RetryBudget::new(0.1, 1);
                let budget = if shared { budget.shared() } else { budget };
                let p = b
                    .retry(Retry::constant(ms(10)).max_attempts(3).budget(budget))
                    .build()
                    .unwrap();
                let mut n = 0;
                let r = exec(&p, flavor, |_| {
                    n += 1;
                    Err::<u32, _>(Boom(n))
                });
                // The bucket holds one token: one retry, then the budget
                // refuses the second.
                assert_eq!(n, 2, "{flavor:?} shared {shared}");
                assert_eq!(
                    reason(&r),
                    Some(RejectionReason::RetryBudgetExhausted),
                    "{r:?}"
                );
                assert_eq!(refusals(&log, RejectionReason::RetryBudgetExhausted), 1);
            }
        }
    }

    #[test]
    fn budget_settings_out_of_range_are_refused_at_build() {
        for budget in [
            RetryBudget::new(-0.1, 10),
            RetryBudget::new(f64::NAN, 10),
            RetryBudget::new(0.0001, 10),
        ] {
            let r = Pipeline::builder("fs-budget-bad")
                .retry(Retry::constant(ms(1)).budget(budget.clone()))
                .build();
            assert!(r.is_err(), "{budget:?}");
        }
    }
}

mod composition {
    use super::*;

    #[test]
    fn a_breaker_after_the_retry_records_each_attempt() {
        for flavor in FLAVORS {
            let (b, _) = builder("fs-comp-retry-cb");
            let p = b
                .retry(Retry::constant(ms(1)).max_attempts(10))
                .circuit_breaker(
                    CircuitBreaker::failure_rate(0.9)
                        .count_window(10)
                        .minimum_calls(10)
                        .cooldown(secs(600)),
                )
                .build()
                .unwrap();
            let mut n = 0;
            let r = exec(&p, flavor, |_| {
                n += 1;
                if n <= 2 {
                    Err(Boom(n))
                } else {
                    Ok(true)
                }
            });
            assert!(r.unwrap());
            let m = p.circuit_metrics().unwrap();
            assert_eq!((m.calls, m.failures, m.state), (3, 2, CircuitState::Closed));
        }
    }

    #[test]
    fn an_open_circuit_after_the_retry_refuses_without_retrying() {
        for flavor in FLAVORS {
            let (b, _) = builder("fs-comp-retry-open");
            let p = b
                .retry(Retry::constant(ms(1)).max_attempts(3))
                .circuit_breaker(CircuitBreaker::consecutive_failures(1))
                .build()
                .unwrap();
            p.isolate().unwrap();
            let mut n = 0;
            let r = exec(&p, flavor, |_| {
                n += 1;
                Ok::<_, Boom>(())
            });
            assert_eq!(reason(&r), Some(RejectionReason::CircuitOpen));
            assert_eq!(n, 0);
        }
    }

    #[test]
    fn a_rate_limit_after_the_retry_ends_the_call_when_it_refuses_a_retry() {
        for flavor in FLAVORS {
            let (b, _, log) = builder_listening("fs-comp-retry-rl");
            let p = b
                .retry(Retry::constant(ms(1)).max_attempts(7))
                .rate_limiter(RateLimiter::gcra(3, secs(1)).burst(3))
                .build()
                .unwrap();
            let mut n = 0;
            let r = exec(&p, flavor, |_| {
                n += 1;
                Err::<u32, _>(Boom(n))
            });
            assert_eq!(n, 3, "{flavor:?}");
            assert_eq!(reason(&r), Some(RejectionReason::RateLimited), "{r:?}");
            let retries = count(&log, |e| matches!(e, EventKind::RetryScheduled { .. }));
            assert_eq!(retries, 3);
        }
    }

    #[test]
    fn a_full_bulkhead_after_the_retry_refuses_without_retrying() {
        let (b, _) = builder("fs-comp-retry-bh");
        let p = b
            .retry(Retry::constant(ms(1)).max_attempts(7))
            .bulkhead(Bulkhead::new(1))
            .build()
            .unwrap();
        let mut inner_ran = 0;
        let r = p.call(|_| {
            Ok::<_, Boom>(p.call(|_| {
                inner_ran += 1;
                Err::<u32, _>(Boom(1))
            }))
        });
        let inner = r.unwrap();
        assert_eq!(reason(&inner), Some(RejectionReason::BulkheadFull));
        assert_eq!(inner_ran, 0);
    }

    #[test]
    fn a_fallback_gets_the_exhausted_retry_and_its_last_error() {
        for flavor in FLAVORS {
            let (b, _, log) = builder_listening("fs-comp-fb-retry");
            let seen = Arc::new(Mutex::new(None));
            let s = seen.clone();
            let p = b
                .retry(Retry::constant(ms(1)).max_attempts(3))
                .fallback_sync(move |e: Error<Boom>, _| {
                    *s.lock().unwrap() = Some(e);
                    Ok::<_, Boom>(true)
                })
                .build()
                .unwrap();
            let mut n = 0;
            let r = exec(&p, flavor, |_| {
                n += 1;
                Err(Boom(n))
            });
            assert!(r.unwrap());
            assert!(matches!(
                seen.lock().unwrap().take(),
                Some(Error::RetryExhausted {
                    attempts: 3,
                    last: Boom(3)
                })
            ));
            assert_eq!(count(&log, |e| matches!(e, EventKind::FallbackExecuted)), 1);
        }
    }

    #[test]
    fn a_filtered_fallback_leaves_other_errors_alone() {
        let (b, _) = builder("fs-comp-fb-filter");
        let p = b
            .retry(Retry::constant(ms(1)).max_attempts(3))
            .abort_if(|e: &Boom| e.0 == 9)
            .fallback_sync(|_e: Error<Boom>, _| Ok::<_, Boom>(true))
            .fallback_when(|e| matches!(e, Error::RetryExhausted { .. }))
            .build()
            .unwrap();
        assert!(p.call(|_| Err(Boom(1))).unwrap());
        let r = p.call(|_| Err(Boom(9)));
        assert!(matches!(r, Err(Error::Operation(Boom(9)))), "{r:?}");
    }

    #[test]
    fn a_fallback_answers_for_an_open_circuit_without_running_the_operation() {
        for flavor in FLAVORS {
            let (b, _) = builder("fs-comp-fb-open");
            let p = b
                .circuit_breaker(CircuitBreaker::consecutive_failures(1).half_open_calls(3))
                .fallback_sync(|e: Error<Boom>, _| {
                    assert_eq!(
                        e.rejection().map(|r| r.reason),
                        Some(RejectionReason::CircuitOpen)
                    );
                    Ok::<_, Boom>(false)
                })
                .build()
                .unwrap();
            p.isolate().unwrap();
            let mut n = 0;
            let r = exec(&p, flavor, |_| {
                n += 1;
                Ok(true)
            });
            assert!(!r.unwrap());
            assert_eq!(n, 0);
        }
    }

    #[test]
    fn a_fallback_answers_a_timed_out_call() {
        let (b, clock) = builder("fs-comp-fb-timeout");
        let p = b
            .timeout(ms(10))
            .fallback_sync(|e: Error<Boom>, _| {
                assert!(e.is_timeout(), "{e:?}");
                Ok::<_, Boom>(true)
            })
            .build()
            .unwrap();
        let r = rt().block_on(p.run(|_| after(&clock, ms(100), Ok(false))));
        assert!(r.unwrap());
    }

    #[test]
    fn a_breaker_before_the_retry_records_one_outcome_per_call() {
        for flavor in FLAVORS {
            let (b, _) = builder("fs-comp-cb-retry");
            let p = b
                .circuit_breaker(
                    CircuitBreaker::failure_rate(0.5)
                        .count_window(10)
                        .minimum_calls(3),
                )
                .retry(Retry::constant(ms(1)).max_attempts(3))
                .build()
                .unwrap();
            let r = exec(&p, flavor, |_| Err::<u32, _>(Boom(1)));
            assert!(matches!(r, Err(Error::RetryExhausted { attempts: 3, .. })));
            let m = p.circuit_metrics().unwrap();
            assert_eq!((m.calls, m.failures, m.state), (1, 1, CircuitState::Closed));
        }
    }

    #[test]
    fn a_timed_out_attempt_is_a_failure_of_the_circuit() {
        let (b, clock) = builder("fs-comp-cb-timeout");
        let p = b
            .circuit_breaker(CircuitBreaker::consecutive_failures(1))
            .timeout(ms(50))
            .build()
            .unwrap();
        let r = rt().block_on(p.run(|_| after(&clock, ms(100), Ok::<_, Boom>(()))));
        assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
        assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
    }

    #[test]
    fn attempts_that_time_out_are_retried_until_one_answers_in_time() {
        let (b, clock, log) = builder_listening("fs-comp-retry-timeout");
        let hooked = Arc::new(AtomicU32::new(0));
        let h = hooked.clone();
        let p = b
            .retry(Retry::constant(ms(1)).max_attempts(3))
            .timeout(ms(50))
            .on_retry(move |_e: &Boom, _, _| {
                h.fetch_add(1, Ordering::SeqCst);
            })
            .build()
            .unwrap();
        let start = clock.now();
        let r = rt().block_on(p.run(|ctx: Context| {
            let clock = clock.clone();
            async move {
                if ctx.attempt() <= 2 {
                    after(&clock, ms(100), Ok::<_, Boom>("late")).await
                } else {
                    Ok("success")
                }
            }
        }));
        assert_eq!(r.unwrap(), "success");
        assert_eq!(clock.now() - start, ms(102));
        let timeouts = count(&log, |e| matches!(e, EventKind::TimedOut { .. }));
        let retries = count(&log, |e| matches!(e, EventKind::RetryScheduled { .. }));
        assert_eq!((timeouts, retries), (2, 2));
        // The hook reports retries after an error of the operation only.
        assert_eq!(hooked.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_timeout_before_the_retry_ends_the_call_at_its_deadline() {
        let (b, clock) = builder("fs-comp-timeout-retry");
        let p = b
            .timeout(ms(100))
            .retry(Retry::constant(ms(10)).max_attempts(100))
            .build()
            .unwrap();
        let start = clock.now();
        let r = rt().block_on(p.run(|_| after(&clock, ms(30), Err::<u32, _>(Boom(1)))));
        assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
        assert_eq!(clock.now() - start, ms(100));
    }

    #[test]
    fn a_retry_whose_next_wait_outlasts_the_deadline_gives_up_with_the_last_error() {
        for flavor in FLAVORS {
            let (b, clock) = builder("fs-comp-timeout-pending");
            let p = b
                .timeout(ms(100))
                .retry(Retry::constant(secs(1)).max_attempts(3))
                .build()
                .unwrap();
            let start = clock.now();
            let r = exec(&p, flavor, |_| Err::<u32, _>(Boom(1)));
            assert!(
                matches!(
                    r,
                    Err(Error::RetryExhausted {
                        attempts: 1,
                        last: Boom(1)
                    })
                ),
                "{flavor:?}: {r:?}"
            );
            assert_eq!(clock.now(), start);
        }
    }

    #[test]
    fn an_outer_timeout_and_an_attempt_timeout_each_bound_their_span() {
        let (b, clock) = builder("fs-comp-nested-timeouts");
        let p = b
            .timeout(ms(120))
            .retry(Retry::constant(ms(1)).max_attempts(5))
            .timeout(ms(50))
            .build()
            .unwrap();
        let start = clock.now();
        let (r, started) = never_answering(&p);
        assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
        // Attempts at 0, 51 and 102 ms; the third is cut at 120 ms.
        assert_eq!(started, 3);
        assert_eq!(clock.now() - start, ms(120));
    }
}

mod breaker {
    use super::*;

    fn fail<K>(p: &Pipeline<K>, flavor: Flavor) -> Result<u32, Error<Boom>>
    where
        K: seawall::pipeline::HandlesSync<u32, Boom>,
    {
        exec(p, flavor, |_| Err(Boom(1)))
    }

    fn succeed<K>(p: &Pipeline<K>, flavor: Flavor) -> Result<u32, Error<Boom>>
    where
        K: seawall::pipeline::HandlesSync<u32, Boom>,
    {
        exec(p, flavor, |_| Ok(1))
    }

    #[test]
    fn consecutive_failures_open_the_circuit_at_the_threshold() {
        for flavor in FLAVORS {
            let (b, _, log) = builder_listening("fs-cb-consecutive");
            let p = b
                .circuit_breaker(CircuitBreaker::consecutive_failures(3))
                .build()
                .unwrap();
            for _ in 0..2 {
                let _ = fail(&p, flavor);
                assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            }
            // A success resets the run.
            succeed(&p, flavor).unwrap();
            for _ in 0..2 {
                let _ = fail(&p, flavor);
            }
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            let _ = fail(&p, flavor);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
            assert_eq!(
                count(&log, |e| matches!(e, EventKind::CircuitOpened { .. })),
                1
            );
        }
    }

    #[test]
    fn a_failure_rate_opens_the_circuit_once_minimum_calls_are_in() {
        for flavor in FLAVORS {
            let (b, _) = builder("fs-cb-ratio");
            let p = b
                .circuit_breaker(
                    CircuitBreaker::failure_rate(0.6)
                        .count_window(3)
                        .minimum_calls(3),
                )
                .build()
                .unwrap();
            let _ = fail(&p, flavor);
            succeed(&p, flavor).unwrap();
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            let _ = fail(&p, flavor);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
        }
    }

    #[test]
    fn an_open_circuit_refuses_with_the_time_left_of_its_cooldown() {
        for flavor in FLAVORS {
            let (b, clock) = builder("fs-cb-open");
            let p = b
                .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(10)))
                .build()
                .unwrap();
            let _ = fail(&p, flavor);
            clock.advance(secs(4));
            let mut ran = 0;
            let r = exec(&p, flavor, |_| {
                ran += 1;
                Ok::<_, Boom>(1)
            });
            let rej = r.unwrap_err().rejection().cloned().unwrap();
            assert_eq!(
                (rej.reason, rej.retry_after, ran),
                (RejectionReason::CircuitOpen, Some(secs(6)), 0)
            );
        }
    }

    #[test]
    fn a_half_open_circuit_closes_after_the_configured_successes() {
        for flavor in FLAVORS {
            let (b, clock, log) = builder_listening("fs-cb-half-close");
            let p = b
                .circuit_breaker(
                    CircuitBreaker::consecutive_failures(2)
                        .cooldown(secs(10))
                        .half_open_calls(3),
                )
                .build()
                .unwrap();
            let _ = fail(&p, flavor);
            let _ = fail(&p, flavor);
            clock.advance(secs(10));
            for _ in 0..2 {
                succeed(&p, flavor).unwrap();
                assert_eq!(p.circuit_state().unwrap(), CircuitState::HalfOpen);
            }
            succeed(&p, flavor).unwrap();
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            let kinds: Vec<&str> = log
                .lock()
                .unwrap()
                .iter()
                .filter_map(|e| match e {
                    EventKind::CircuitOpened { .. } => Some("opened"),
                    EventKind::CircuitHalfOpened => Some("half-opened"),
                    EventKind::CircuitClosed => Some("closed"),
                    _ => None,
                })
                .collect();
            assert_eq!(kinds, ["opened", "half-opened", "closed"], "{flavor:?}");
        }
    }

    #[test]
    fn a_failed_probe_opens_the_circuit_again_whatever_the_closed_threshold() {
        for flavor in FLAVORS {
            let (b, clock) = builder("fs-cb-half-fail");
            let p = b
                .circuit_breaker(
                    CircuitBreaker::consecutive_failures(2)
                        .cooldown(secs(10))
                        .half_open_calls(3),
                )
                .build()
                .unwrap();
            let _ = fail(&p, flavor);
            let _ = fail(&p, flavor);
            clock.advance(secs(10));
            succeed(&p, flavor).unwrap();
            succeed(&p, flavor).unwrap();
            let _ = fail(&p, flavor);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
        }
    }

    #[test]
    fn a_half_open_circuit_refuses_calls_beyond_its_probes() {
        let (b, clock) = builder("fs-cb-half-excess");
        let p = b
            .circuit_breaker(
                CircuitBreaker::consecutive_failures(1)
                    .cooldown(secs(10))
                    .half_open_calls(2),
            )
            .build()
            .unwrap();
        let _ = p.call(|_| Err::<u32, _>(Boom(1)));
        clock.advance(secs(10));
        let r = p.call(|_| {
            p.call(|_| {
                let third = p.call(|_| Ok::<u32, Boom>(3));
                Ok::<_, Boom>(third)
            })
        });
        let third = r.unwrap();
        let rej = third.unwrap_err().rejection().cloned().unwrap();
        assert_eq!(rej.reason, RejectionReason::CircuitOpen);
        assert_eq!(rej.retry_after, Some(secs(10)));
    }

    #[test]
    fn failures_older_than_the_time_window_no_longer_count() {
        for flavor in FLAVORS {
            let (b, clock) = builder("fs-cb-time");
            let p = b
                .circuit_breaker(
                    CircuitBreaker::failure_rate(0.5)
                        .window(secs(10))
                        .minimum_calls(3),
                )
                .build()
                .unwrap();
            let _ = fail(&p, flavor);
            let _ = fail(&p, flavor);
            clock.advance(secs(11));
            let _ = fail(&p, flavor);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            let m = p.circuit_metrics().unwrap();
            assert_eq!((m.calls, m.failures), (1, 1), "{flavor:?}");
            let _ = fail(&p, flavor);
            let _ = fail(&p, flavor);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
        }
    }

    #[test]
    fn the_cooldown_grows_after_each_failed_probe_up_to_its_max() {
        let (b, clock) = builder("fs-cb-growth");
        let p = b
            .circuit_breaker(
                CircuitBreaker::consecutive_failures(1)
                    .cooldown(secs(1))
                    .cooldown_growth(2.0, secs(3)),
            )
            .build()
            .unwrap();
        let retry_after = |p: &Pipeline| {
            p.call(|_| Ok::<u32, Boom>(1))
                .unwrap_err()
                .rejection()
                .and_then(|r| r.retry_after)
        };
        let _ = p.call(|_| Err::<u32, _>(Boom(1)));
        assert_eq!(retry_after(&p), Some(secs(1)));
        let mut waits = Vec::new();
        for _ in 0..3 {
            clock.advance(secs(4));
            let _ = p.call(|_| Err::<u32, _>(Boom(1))); // a failed probe
            waits.push(retry_after(&p));
        }
        assert_eq!(waits, [Some(secs(2)), Some(secs(3)), Some(secs(3))]);
        // A close resets it.
        clock.advance(secs(3));
        p.call(|_| Ok::<u32, Boom>(1)).unwrap();
        let _ = p.call(|_| Err::<u32, _>(Boom(1)));
        assert_eq!(retry_after(&p), Some(secs(1)));
    }

    #[test]
    fn ignored_errors_are_neither_failures_nor_successes() {
        let (b, _) = builder("fs-cb-ignore");
        let p = b
            .circuit_breaker(CircuitBreaker::consecutive_failures(2))
            .classify(|e: &Boom| {
                if e.0 == 0 {
                    Verdict::ignore()
                } else {
                    Verdict::failure()
                }
            })
            .build()
            .unwrap();
        let _ = p.call(|_| Err::<u32, _>(Boom(1)));
        let _ = p.call(|_| Err::<u32, _>(Boom(0)));
        let _ = p.call(|_| Err::<u32, _>(Boom(1)));
        assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
    }

    #[test]
    fn breaker_settings_out_of_range_are_refused_at_build() {
        for (cb, field) in [
            (CircuitBreaker::consecutive_failures(0), "failures"),
            (CircuitBreaker::failure_rate(0.0), "failure_rate"),
            (
                CircuitBreaker::consecutive_failures(1).cooldown(Duration::ZERO),
                "cooldown",
            ),
            (CircuitBreaker::failure_rate(1.5), "failure_rate"),
            (CircuitBreaker::failure_rate(f64::NAN), "failure_rate"),
            (
                CircuitBreaker::consecutive_failures(1).half_open_calls(0),
                "half_open_calls",
            ),
            (CircuitBreaker::failure_rate(0.5).count_window(0), "window"),
            (
                CircuitBreaker::consecutive_failures(1).cooldown_growth(0.5, secs(10)),
                "cooldown_growth",
            ),
        ] {
            let r = Pipeline::builder("fs-cb-bad")
                .circuit_breaker(cb.clone())
                .build();
            let e = r.expect_err(&format!("{cb:?}"));
            assert!(e.field.starts_with(field) || e.field.contains(field), "{e}");
        }
    }
}

mod classic {
    use super::*;

    #[test]
    fn a_failed_attempt_is_retried_until_it_succeeds() {
        for flavor in FLAVORS {
            let (b, clock) = builder("fs-retry-ok");
            let p = b
                .retry(Retry::exponential(ms(10)).max_attempts(3))
                .build()
                .unwrap();
            let mut n = 0;
            let r = exec(&p, flavor, |ctx| {
                n += 1;
                assert_eq!(ctx.attempt(), n);
                if n < 3 {
                    Err(Boom(n))
                } else {
                    Ok(n)
                }
            });
            assert_eq!(r.unwrap(), 3);
            // 10 ms, then 20 ms.
            assert_eq!(clock.now() - FAR, ms(30), "{flavor:?}");
        }
    }

    #[test]
    fn a_success_is_not_retried() {
        for flavor in FLAVORS {
            let (b, _) = builder("fs-retry-success");
            let p = b.retry(Retry::constant(ms(10))).build().unwrap();
            let mut n = 0;
            let r = exec(&p, flavor, |_| {
                n += 1;
                Ok::<_, Boom>(n)
            });
            assert_eq!((r.unwrap(), n), (1, 1));
        }
    }

    #[test]
    fn an_exhausted_retry_returns_the_last_error() {
        for flavor in FLAVORS {
            let (b, _, log) = builder_listening("fs-retry-exhausted");
            let p = b
                .retry(Retry::constant(ms(10)).max_attempts(3))
                .build()
                .unwrap();
            let mut n = 0;
            let r = exec(&p, flavor, |_| {
                n += 1;
                Err::<u32, _>(Boom(n))
            });
            assert!(matches!(
                r,
                Err(Error::RetryExhausted {
                    attempts: 3,
                    last: Boom(3)
                })
            ));
            assert_eq!(
                count(&log, |e| matches!(e, EventKind::RetryScheduled { .. })),
                2
            );
        }
    }

    #[test]
    fn an_error_that_is_not_retryable_ends_the_call_at_once() {
        for flavor in FLAVORS {
            let (b, _) = builder("fs-retry-abort");
            let p = b
                .retry(Retry::constant(ms(10)).max_attempts(3))
                .retry_if(|e: &Boom| e.0 != 7)
                .build()
                .unwrap();
            let mut n = 0;
            let r = exec(&p, flavor, |_| {
                n += 1;
                Err::<u32, _>(Boom(7))
            });
            assert!(matches!(r, Err(Error::Operation(Boom(7)))));
            assert_eq!(n, 1);
        }
    }

    #[test]
    fn a_retry_after_hint_replaces_the_backoff() {
        for flavor in FLAVORS {
            let (b, clock) = builder("fs-retry-hint");
            let p = b
                .retry(Retry::constant(ms(10)).max_attempts(2))
                .classify(|_: &Boom| Verdict::retry().with_retry_after(secs(2)))
                .build()
                .unwrap();
            let mut n = 0;
            let _ = exec(&p, flavor, |_| {
                n += 1;
                Err::<u32, _>(Boom(n))
            });
            assert_eq!(clock.now() - FAR, secs(2), "{flavor:?}");
        }
    }

    #[test]
    fn zero_attempts_are_refused_at_build() {
        let e = Pipeline::builder("fs-retry-zero")
            .retry(Retry::constant(ms(1)).max_attempts(0))
            .build()
            .unwrap_err();
        assert_eq!((e.policy, e.field), ("retry", "max_attempts"));
    }

    #[test]
    fn a_full_bulkhead_refuses_and_a_free_one_admits() {
        for flavor in FLAVORS {
            let (b, _) = builder("fs-bh");
            let p = b.bulkhead(Bulkhead::new(2)).build().unwrap();
            let r = p.call(|_| {
                p.call(|_| {
                    let third = exec(&p, flavor, |_| Ok::<u32, Boom>(3));
                    Ok::<_, Boom>(third)
                })
            });
            let third = r.unwrap();
            assert_eq!(reason(&third), Some(RejectionReason::BulkheadFull));
            assert_eq!(p.in_flight().unwrap(), 0);
            assert_eq!(exec(&p, flavor, |_| Ok::<u32, Boom>(4)).unwrap(), 4);
        }
    }

    #[test]
    fn a_queued_call_takes_the_slot_when_it_is_given_back() {
        let (b, clock) = builder("fs-bh-queue");
        let p = b
            .bulkhead(Bulkhead::new(1).queue(1, secs(1)))
            .build()
            .unwrap();
        let start = clock.now();
        let (a, b2) = rt().block_on(async {
            tokio::join!(
                p.run(|_| after(&clock, ms(100), Ok::<_, Boom>(1))),
                p.run(|_| async { Ok::<_, Boom>(2) }),
            )
        });
        assert_eq!((a.unwrap(), b2.unwrap()), (1, 2));
        assert_eq!(clock.now() - start, ms(100));
    }

    #[test]
    fn a_queued_call_is_refused_when_its_max_wait_runs_out() {
        let (b, clock) = builder("fs-bh-maxwait");
        let p = b
            .bulkhead(Bulkhead::new(1).queue(1, ms(20)))
            .build()
            .unwrap();
        let at = Mutex::new(None);
        let (a, b2) = rt().block_on(async {
            tokio::join!(p.run(|_| after(&clock, ms(100), Ok::<_, Boom>(1))), async {
                let r = p.run(|_| async { Ok::<_, Boom>(2) }).await;
                *at.lock().unwrap() = Some(clock.now() - FAR);
                r
            },)
        });
        assert_eq!(a.unwrap(), 1);
        assert_eq!(reason(&b2), Some(RejectionReason::BulkheadFull));
        assert_eq!(at.into_inner().unwrap(), Some(ms(20)));
    }

    #[test]
    fn a_bulkhead_of_zero_is_refused_at_build() {
        let e = Pipeline::builder("fs-bh-zero")
            .bulkhead(Bulkhead::new(0))
            .build()
            .unwrap_err();
        assert_eq!(e.policy, "bulkhead");
    }

    #[test]
    fn a_smooth_limiter_spaces_permits_and_says_when_the_next_one_is_due() {
        for flavor in FLAVORS {
            let (b, _) = builder("fs-rl-smooth");
            let p = b
                .rate_limiter(RateLimiter::gcra(10, secs(1)).burst(1))
                .build()
                .unwrap();
            assert!(exec(&p, flavor, |_| Ok::<_, Boom>(1)).is_ok());
            let r = exec(&p, flavor, |_| Ok::<_, Boom>(2));
            let rej = r.unwrap_err().rejection().cloned().unwrap();
            assert_eq!(
                (rej.reason, rej.retry_after),
                (RejectionReason::RateLimited, Some(ms(100)))
            );
        }
    }

    #[test]
    fn a_bursty_limiter_admits_its_burst_then_refuses_until_the_window_turns() {
        for flavor in FLAVORS {
            let (b, clock) = builder("fs-rl-bursty");
            let p = b
                .rate_limiter(RateLimiter::fixed_window(3, secs(1)))
                .build()
                .unwrap();
            for i in 0..3 {
                assert!(exec(&p, flavor, |_| Ok::<_, Boom>(i)).is_ok());
            }
            let r = exec(&p, flavor, |_| Ok::<_, Boom>(9));
            let rej = r.unwrap_err().rejection().cloned().unwrap();
            assert_eq!(rej.retry_after, Some(secs(1)), "{flavor:?}");
            clock.advance(secs(1));
            for i in 0..3 {
                assert!(exec(&p, flavor, |_| Ok::<_, Boom>(i)).is_ok());
            }
        }
    }

    #[test]
    fn a_limited_call_waits_for_its_permit_when_max_wait_allows() {
        for flavor in FLAVORS {
            let (b, clock) = builder("fs-rl-wait");
            let p = b
                .rate_limiter(RateLimiter::gcra(1, secs(1)).max_wait(secs(2)))
                .build()
                .unwrap();
            exec(&p, flavor, |_| Ok::<_, Boom>(1)).unwrap();
            exec(&p, flavor, |_| Ok::<_, Boom>(2)).unwrap();
            assert_eq!(clock.now() - FAR, secs(1), "{flavor:?}");
        }
    }

    #[test]
    fn a_limited_call_is_refused_at_once_when_its_wait_exceeds_max_wait() {
        for flavor in FLAVORS {
            let (b, clock) = builder("fs-rl-nowait");
            let p = b
                .rate_limiter(RateLimiter::gcra(1, secs(1)).max_wait(ms(500)))
                .build()
                .unwrap();
            exec(&p, flavor, |_| Ok::<_, Boom>(1)).unwrap();
            let r = exec(&p, flavor, |_| Ok::<_, Boom>(2));
            assert_eq!(reason(&r), Some(RejectionReason::RateLimited));
            assert_eq!(clock.now(), FAR, "{flavor:?}");
        }
    }

    #[test]
    fn rate_limiter_settings_out_of_range_are_refused_at_build() {
        for rl in [
            RateLimiter::gcra(0, secs(1)),
            RateLimiter::gcra(1, Duration::ZERO),
            RateLimiter::fixed_window(0, secs(1)),
            RateLimiter::sliding_window(1, Duration::ZERO),
            RateLimiter::gcra(1, secs(1)).burst(0),
        ] {
            let r = Pipeline::builder("fs-rl-bad")
                .rate_limiter(rl.clone())
                .build();
            assert!(r.is_err(), "{rl:?}");
        }
    }

    #[test]
    fn an_answer_in_time_is_not_a_timeout() {
        for flavor in FLAVORS {
            let (b, _) = builder("fs-to-ok");
            let p = b.timeout(secs(1)).build().unwrap();
            assert_eq!(exec(&p, flavor, |_| Ok::<_, Boom>(1)).unwrap(), 1);
        }
    }

    #[test]
    fn a_blocked_attempt_times_out_at_its_deadline() {
        let (b, clock, log) = builder_listening("fs-to-blocked");
        let p = b.timeout(ms(50)).build().unwrap();
        let r = rt().block_on(p.run(|_| after(&clock, secs(10), Ok::<_, Boom>(1))));
        assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
        assert_eq!(clock.now() - FAR, ms(50));
        assert_eq!(count(&log, |e| matches!(e, EventKind::TimedOut { .. })), 1);
    }

    #[test]
    fn a_strict_sync_timeout_turns_a_late_answer_into_a_timeout() {
        let (b, clock) = builder("fs-to-strict");
        let p = b.timeout(Timeout::strict(ms(50))).build().unwrap();
        let r = p.call(|_| {
            clock.advance(ms(60));
            Ok::<_, Boom>(1)
        });
        assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
        // Lenient (default): the late success stands.
        let (b, clock) = builder("fs-to-lenient");
        let p = b.timeout(ms(50)).build().unwrap();
        let r = p.call(|_| {
            clock.advance(ms(60));
            Ok::<_, Boom>(1)
        });
        assert_eq!(r.unwrap(), 1);
    }

    #[test]
    fn a_fallback_is_not_run_for_a_success() {
        for flavor in FLAVORS {
            let (b, _) = builder("fs-fb-success");
            let ran = Arc::new(AtomicU32::new(0));
            let r2 = ran.clone();
            let p = b
                .fallback_sync(move |_e: Error<Boom>, _| {
                    r2.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Boom>(0)
                })
                .build()
                .unwrap();
            assert_eq!(exec(&p, flavor, |_| Ok::<_, Boom>(1)).unwrap(), 1);
            assert_eq!(ran.load(Ordering::SeqCst), 0);
        }
    }

    #[test]
    fn a_fallback_error_is_the_calls_error() {
        for flavor in FLAVORS {
            let (b, _) = builder("fs-fb-error");
            let p = b
                .fallback_sync(|_e: Error<Boom>, _| Err::<u32, _>(Boom(99)))
                .build()
                .unwrap();
            let r = exec(&p, flavor, |_| Err(Boom(1)));
            assert!(matches!(r, Err(Error::Fallback(Boom(99)))), "{r:?}");
        }
    }

    #[test]
    fn an_async_fallback_receives_the_error_and_the_context() {
        let (b, _) = builder("fs-fb-async");
        let p = b
            .fallback(|e: Error<Boom>, ctx: Context| async move {
                Ok::<_, Boom>((e.operation_error().map(|b| b.0), ctx.attempt()))
            })
            .build()
            .unwrap();
        let r = rt().block_on(p.run(|_| async { Err(Boom(5)) }));
        assert_eq!(r.unwrap().0, Some(5));
    }
}

mod events {
    use super::*;

    /// How many of each circuit event and retry were reported, and how the
    /// call finished.
    fn tally(log: &Log) -> ([usize; 4], Vec<CallOutcome>) {
        let log = log.lock().unwrap();
        let mut n = [0; 4];
        let mut outcomes = Vec::new();
        for e in log.iter() {
            match e {
                EventKind::RetryScheduled { .. } => n[0] += 1,
                EventKind::CircuitOpened { .. } => n[1] += 1,
                EventKind::CircuitHalfOpened => n[2] += 1,
                EventKind::CircuitClosed => n[3] += 1,
                EventKind::CallFinished { outcome, .. } => outcomes.push(*outcome),
                _ => {}
            }
        }
        (n, outcomes)
    }

    /// A retry around a breaker that opens on every failure and half-opens
    /// by the next attempt: each failed attempt opens it, each retry probes.
    fn retry_over_a_tripping_breaker(b: PipelineBuilder) -> PipelineBuilder {
        b.retry(Retry::constant(ms(1)).max_attempts(10))
            .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(ms(1)))
    }

    #[test]
    fn every_transition_of_a_probing_breaker_under_a_retry_is_reported() {
        for flavor in FLAVORS {
            let (b, _, log) = builder_listening("fs-ev-success");
            let p = retry_over_a_tripping_breaker(b).build().unwrap();
            let mut n = 0;
            let r = exec(&p, flavor, |_| {
                n += 1;
                if n <= 4 {
                    Err(Boom(n))
                } else {
                    Ok(true)
                }
            });
            assert!(r.unwrap());
            assert_eq!(
                tally(&log),
                ([4, 4, 4, 1], vec![CallOutcome::Success]),
                "{flavor:?}"
            );
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
        }
    }

    #[test]
    fn an_error_that_is_not_retried_ends_the_probing_with_the_circuit_open() {
        for flavor in FLAVORS {
            let (b, _, log) = builder_listening("fs-ev-unhandled");
            let p = retry_over_a_tripping_breaker(b)
                .retry_if(|e: &Boom| e.0 != 3)
                .build()
                .unwrap();
            let mut n = 0;
            let r = exec(&p, flavor, |_| {
                n += 1;
                Err::<u32, _>(Boom(n))
            });
            assert!(matches!(r, Err(Error::Operation(Boom(3)))), "{r:?}");
            assert_eq!(
                tally(&log),
                ([2, 3, 2, 0], vec![CallOutcome::Failure]),
                "{flavor:?}"
            );
        }
    }

    #[test]
    fn an_exhausted_retry_over_a_probing_breaker_reports_each_trip() {
        for flavor in FLAVORS {
            let (b, _, log) = builder_listening("fs-ev-exhausted");
            let p = b
                .retry(Retry::constant(ms(1)).max_attempts(4))
                .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(ms(1)))
                .build()
                .unwrap();
            let r = exec(&p, flavor, |_| Err::<u32, _>(Boom(1)));
            assert!(matches!(r, Err(Error::RetryExhausted { attempts: 4, .. })));
            assert_eq!(
                tally(&log),
                ([3, 4, 3, 0], vec![CallOutcome::Failure]),
                "{flavor:?}"
            );
        }
    }

    #[test]
    fn each_refusal_of_a_rate_limiter_is_reported_and_finishes_its_call() {
        for flavor in FLAVORS {
            let (b, clock, log) = builder_listening("fs-ev-rl");
            let p = b
                .rate_limiter(RateLimiter::gcra(10, secs(1)).burst(1))
                .build()
                .unwrap();
            let mut results = Vec::new();
            for i in 0..5 {
                if i == 2 {
                    clock.advance(ms(110));
                }
                results.push(exec(&p, flavor, |_| Ok::<_, Boom>(i)).is_ok());
            }
            assert_eq!(results, [true, false, true, false, false]);
            let refused = refusals(&log, RejectionReason::RateLimited);
            let (_, outcomes) = tally(&log);
            assert_eq!((refused, outcomes.len()), (3, 5), "{flavor:?}");
            assert_eq!(
                outcomes
                    .iter()
                    .filter(|o| matches!(o, CallOutcome::Success))
                    .count(),
                2
            );
        }
    }

    #[test]
    fn each_refusal_of_a_full_bulkhead_is_reported() {
        let (b, _, log) = builder_listening("fs-ev-bh");
        let p = b.bulkhead(Bulkhead::new(1)).build().unwrap();
        let r = p.call(|_| {
            let a = p.call(|_| Ok::<u32, Boom>(1));
            let b = p.call(|_| Ok::<u32, Boom>(2));
            Ok::<_, Boom>((a, b))
        });
        let (a, b2) = r.unwrap();
        assert_eq!(reason(&a), Some(RejectionReason::BulkheadFull));
        assert_eq!(reason(&b2), Some(RejectionReason::BulkheadFull));
        let refused = refusals(&log, RejectionReason::BulkheadFull);
        assert_eq!(refused, 2);
        assert_eq!(tally(&log).1.len(), 3);
    }

    #[test]
    fn a_failing_fallback_is_reported_as_run_and_the_call_as_failed() {
        for flavor in FLAVORS {
            let (b, _, log) = builder_listening("fs-ev-fb-fail");
            let p = b
                .retry(Retry::constant(ms(1)).max_attempts(3))
                .retry_if(|e: &Boom| e.0 == 0)
                .circuit_breaker(CircuitBreaker::consecutive_failures(5))
                .fallback_sync(|_e: Error<Boom>, _| Err::<bool, _>(Boom(99)))
                .build()
                .unwrap();
            let r = exec(&p, flavor, |_| Err(Boom(1)));
            assert!(matches!(r, Err(Error::Fallback(Boom(99)))), "{r:?}");
            let fallbacks = count(&log, |e| matches!(e, EventKind::FallbackExecuted));
            let (n, outcomes) = tally(&log);
            assert_eq!((fallbacks, n[0]), (1, 0));
            assert_eq!(outcomes.len(), 1, "{flavor:?}: {outcomes:?}");
            let m = p.circuit_metrics().unwrap();
            assert_eq!((m.calls, m.failures), (1, 1));
        }
    }
}

mod more {
    use super::*;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    #[test]
    fn a_panicking_attempt_gives_its_adaptive_slot_back() {
        let (b, _) = builder("fs-al-panic");
        let p = b
            .adaptive_limit(AdaptiveLimit::aimd().limits(1, 1, 2))
            .build()
            .unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            p.call(|_| -> Result<u32, Boom> { panic!("boom") })
        }));
        assert!(r.is_err());
        assert_eq!(p.concurrency_limit().unwrap().in_flight, 0);
        assert_eq!(p.call(|_| Ok::<_, Boom>(1)).unwrap(), 1);
    }

    #[test]
    fn a_dropped_waiter_leaves_the_adaptive_queue_to_the_next() {
        let (b, clock) = builder("fs-al-drop");
        let p = b
            .adaptive_limit(AdaptiveLimit::aimd().limits(1, 1, 2).queue(2, secs(1)))
            .build()
            .unwrap();
        let (a, dropped, c) = rt().block_on(async {
            tokio::join!(
                p.run(|_| after(&clock, ms(100), Ok::<_, Boom>(1))),
                // Waits in the queue and gives up at 10 ms.
                async {
                    let call = p.run(|_| async { Ok::<_, Boom>(2) });
                    tokio::select! {
                        r = call => Some(r),
                        _ = Clock::sleep(&clock, ms(10)) => None,
                    }
                },
                p.run(|_| async { Ok::<_, Boom>(3) }),
            )
        });
        assert_eq!(a.unwrap(), 1);
        assert!(dropped.is_none());
        assert_eq!(c.unwrap(), 3);
        assert_eq!(clock.now() - FAR, ms(100));
        assert_eq!(p.concurrency_limit().unwrap().in_flight, 0);
    }

    #[test]
    fn a_retry_wait_holds_no_adaptive_slot() {
        for flavor in FLAVORS {
            let (b, _) = builder("fs-al-retry");
            let held = Arc::new(Mutex::new(Vec::new()));
            let p = b
                .retry(Retry::constant(ms(10)).max_attempts(3))
                .adaptive_limit(AdaptiveLimit::aimd().limits(1, 1, 2))
                .build()
                .unwrap();
            let h = held.clone();
            let p2 = p.clone();
            let hook = move || {
                h.lock()
                    .unwrap()
                    .push(p2.concurrency_limit().unwrap().in_flight)
            };
            let mut n = 0;
            let r = exec(&p, flavor, |_| {
                n += 1;
                hook();
                if n < 3 {
                    Err(Boom(n))
                } else {
                    Ok(n)
                }
            });
            assert_eq!(r.unwrap(), 3, "{flavor:?}");
            assert_eq!(*held.lock().unwrap(), [1, 1, 1]);
            assert_eq!(p.concurrency_limit().unwrap().in_flight, 0);
        }
    }

    #[test]
    fn aimd_grows_its_limit_after_a_window_of_successes_using_half_of_it() {
        for flavor in FLAVORS {
            let (b, clock) = builder("fs-al-grow");
            let p = b
                .adaptive_limit(
                    AdaptiveLimit::aimd()
                        .limits(1, 2, 10)
                        .update_interval(ms(100)),
                )
                .build()
                .unwrap();
            let _ = exec(&p, flavor, |_| Ok::<_, Boom>(1));
            clock.advance(ms(100));
            let _ = exec(&p, flavor, |_| Ok::<_, Boom>(1));
            assert_eq!(p.concurrency_limit().unwrap().limit, 3, "{flavor:?}");
        }
    }

    #[test]
    fn ignored_errors_leave_an_adaptive_limit_alone_and_timeouts_lower_it() {
        let (b, clock) = builder("fs-al-verdicts");
        let p = b
            .adaptive_limit(
                AdaptiveLimit::aimd()
                    .limits(1, 10, 20)
                    .update_interval(ms(100)),
            )
            .timeout(ms(50))
            .classify(|e: &Boom| {
                if e.0 == 0 {
                    Verdict::ignore()
                } else {
                    Verdict::retry()
                }
            })
            .build()
            .unwrap();
        for _ in 0..3 {
            let _ = rt().block_on(p.run(|_| async { Err::<u32, _>(Boom(0)) }));
            clock.advance(ms(100));
        }
        assert_eq!(p.concurrency_limit().unwrap().limit, 10);
        let r = rt().block_on(p.run(|_| after(&clock, secs(1), Ok::<u32, Boom>(1))));
        assert!(matches!(r, Err(Error::Timeout(_))));
        // The next sample closes the window that holds the drop.
        clock.advance(ms(100));
        let _ = rt().block_on(p.run(|_| async { Ok::<u32, Boom>(1) }));
        assert_eq!(p.concurrency_limit().unwrap().limit, 9);
    }

    #[test]
    fn a_count_window_judges_only_its_last_calls() {
        for flavor in FLAVORS {
            let (b, _) = builder("fs-cb-count-metrics");
            let p = b
                .circuit_breaker(
                    CircuitBreaker::failure_rate(0.9)
                        .count_window(5)
                        .minimum_calls(5),
                )
                .build()
                .unwrap();
            for i in 0..7u32 {
                let _ = exec(
                    &p,
                    flavor,
                    |_| if i % 2 == 0 { Ok(i) } else { Err(Boom(i)) },
                );
            }
            // The last five: F S F S ... from calls 2..=6: S F S F S.
            let m = p.circuit_metrics().unwrap();
            assert_eq!((m.calls, m.failures), (5, 2), "{flavor:?}");
            assert!((m.failure_rate - 0.4).abs() < 1e-9, "{m:?}");
        }
    }

    #[test]
    fn calls_lasting_the_slow_duration_are_slow_and_open_the_circuit() {
        let (b, clock) = builder("fs-cb-slow");
        let p = b
            .circuit_breaker(
                CircuitBreaker::failure_rate(0.5)
                    .count_window(2)
                    .minimum_calls(2)
                    .slow_calls(1.0, secs(1)),
            )
            .build()
            .unwrap();
        let slow = |d: Duration| {
            rt().block_on(p.run(|_| after(&clock, d, Ok::<u32, Boom>(1))))
                .unwrap()
        };
        slow(ms(999));
        slow(secs(1));
        assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
        assert_eq!(p.circuit_metrics().unwrap().slow_calls, 1);
        slow(secs(1));
        assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
    }

    #[test]
    fn manual_controls_open_close_and_reset_the_circuit() {
        for flavor in FLAVORS {
            let (b, clock) = builder("fs-cb-manual");
            let p = b
                .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(30)))
                .build()
                .unwrap();
            p.isolate().unwrap();
            let r = exec(&p, flavor, |_| Ok::<u32, Boom>(1));
            assert_eq!(r.unwrap_err().rejection().unwrap().retry_after, None);
            p.reset().unwrap();
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            p.open_for(secs(5)).unwrap();
            let r = exec(&p, flavor, |_| Ok::<u32, Boom>(1));
            assert_eq!(
                r.unwrap_err().rejection().unwrap().retry_after,
                Some(secs(5))
            );
            clock.advance(secs(5));
            assert_eq!(exec(&p, flavor, |_| Ok::<u32, Boom>(2)).unwrap(), 2);
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
            p.force_close().unwrap();
            for _ in 0..3 {
                let _ = exec(&p, flavor, |_| Err::<u32, _>(Boom(1)));
            }
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Disabled);
            p.enable().unwrap();
            assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
        }
    }

    #[test]
    fn concurrent_calls_with_one_key_share_one_execution_and_its_error() {
        let (b, clock, log) = builder_listening("fs-coalesce-share");
        let p = b.coalesce(Coalesce::new()).build().unwrap();
        let ran = AtomicU32::new(0);
        let call = || {
            p.coalesce_key("k").run(|_| {
                ran.fetch_add(1, Ordering::SeqCst);
                after(&clock, ms(50), Err::<u32, _>(Boom(7)))
            })
        };
        let (a, b2, c) = rt().block_on(async { tokio::join!(call(), call(), call()) });
        for r in [a, b2, c] {
            assert!(matches!(r, Err(Error::Operation(Boom(7)))), "{r:?}");
        }
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert_eq!(count(&log, |e| matches!(e, EventKind::Coalesced)), 2);
    }

    #[test]
    fn a_cached_value_is_fresh_for_its_ttl_after_a_slow_leader_ends() {
        let (b, clock) = builder("fs-cache-slow-leader");
        let p = b.coalesce(Coalesce::new().ttl(secs(5))).build().unwrap();
        let r = rt().block_on(
            p.coalesce_key("k")
                .run(|_| after(&clock, secs(3), Ok::<_, Boom>("first"))),
        );
        assert_eq!(r.unwrap(), "first");
        clock.advance(secs(4));
        let r = p.coalesce_key("k").call(|_| Ok::<_, Boom>("second"));
        assert_eq!(r.unwrap(), "first");
    }

    #[test]
    fn a_hedge_refused_by_a_rate_limit_after_hedging_does_not_start() {
        let (b, clock) = builder("fs-hedge-rl");
        let p = b
            .hedging(Hedging::latency(ms(10)).max_hedged_attempts(2))
            .rate_limiter(RateLimiter::fixed_window(2, secs(60)))
            .build()
            .unwrap();
        let started = AtomicU32::new(0);
        let r = rt().block_on(p.run(|ctx: Context| {
            started.fetch_add(1, Ordering::SeqCst);
            let n = ctx.attempt();
            after(&clock, ms(100), Ok::<_, Boom>(n))
        }));
        assert_eq!(r.unwrap(), 1);
        assert_eq!(started.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn an_error_not_to_be_hedged_wins_at_once() {
        let (b, clock) = builder("fs-hedge-if");
        let p = b
            .hedging(Hedging::latency(ms(10)).max_hedged_attempts(2))
            .hedge_if(|e: &Boom| e.0 != 9)
            .build()
            .unwrap();
        let r = rt().block_on(p.run(|ctx: Context| {
            let clock = clock.clone();
            async move {
                if ctx.attempt() == 1 {
                    std::future::pending::<()>().await;
                }
                after(&clock, ms(1), Err::<u32, _>(Boom(9))).await
            }
        }));
        assert!(matches!(r, Err(Error::Operation(Boom(9)))), "{r:?}");
        assert_eq!(clock.now() - FAR, ms(11));
    }

    #[test]
    fn the_context_deadline_spans_every_retry_under_an_outer_timeout() {
        for flavor in FLAVORS {
            let (b, clock) = builder("fs-ctx-deadline");
            let p = b
                .timeout(secs(1))
                .retry(Retry::constant(ms(100)).max_attempts(3))
                .build()
                .unwrap();
            let mut remaining = Vec::new();
            let _ = exec(&p, flavor, |ctx| {
                remaining.push(ctx.remaining());
                Err::<u32, _>(Boom(1))
            });
            assert_eq!(
                remaining,
                [Some(secs(1)), Some(ms(900)), Some(ms(800))],
                "{flavor:?}"
            );
            assert_eq!(clock.now() - FAR, ms(200));
        }
    }

    #[test]
    fn a_weighted_call_takes_all_its_permits_or_none() {
        for flavor in FLAVORS {
            let (b, _) = builder("fs-rl-weighted");
            let p = b
                .rate_limiter(RateLimiter::fixed_window(5, secs(1)))
                .build()
                .unwrap();
            let w = p.weighted(3).unwrap();
            let ok = match flavor {
                Flavor::Sync => w.call(|_| Ok::<_, Boom>(1)),
                Flavor::Async => rt().block_on(w.run(|_| async { Ok::<_, Boom>(1) })),
            };
            assert!(ok.is_ok());
            let refused = match flavor {
                Flavor::Sync => w.call(|_| Ok::<_, Boom>(2)),
                Flavor::Async => rt().block_on(w.run(|_| async { Ok::<_, Boom>(2) })),
            };
            assert_eq!(reason(&refused), Some(RejectionReason::RateLimited));
            for i in 0..2 {
                assert!(exec(&p, flavor, |_| Ok::<_, Boom>(i)).is_ok());
            }
            assert!(exec(&p, flavor, |_| Ok::<_, Boom>(9)).is_err());
        }
    }
}

mod keys {
    use super::*;

    #[test]
    fn the_pipeline_wide_key_caches_for_every_coalesced_call() {
        for flavor in FLAVORS {
            let (b, _, log) = builder_listening("fs-cache-global");
            let p = b.coalesce(Coalesce::new().ttl(secs(60))).build().unwrap();
            let first = match flavor {
                Flavor::Sync => p.coalesced().call(|_| Ok::<_, Boom>("bar")),
                Flavor::Async => {
                    rt().block_on(p.coalesced().run(|_| async { Ok::<_, Boom>("bar") }))
                }
            };
            let second = p.coalesced().call(|_| Ok::<_, Boom>("missing"));
            assert_eq!((first.unwrap(), second.unwrap()), ("bar", "bar"));
            assert_eq!(count(&log, |e| matches!(e, EventKind::CacheHit)), 1);
        }
    }

    #[test]
    fn cached_values_are_kept_apart_by_partition_key_and_type() {
        let (b, _) = builder("fs-cache-apart");
        let p = b.coalesce(Coalesce::new().ttl(secs(60))).build().unwrap();
        let a = p
            .partition("a")
            .coalesce_key("k")
            .call(|_| Ok::<_, Boom>("a"))
            .unwrap();
        let b2 = p
            .partition("b")
            .coalesce_key("k")
            .call(|_| Ok::<_, Boom>("b"))
            .unwrap();
        let plain = p.coalesce_key("k").call(|_| Ok::<_, Boom>("none")).unwrap();
        let part = p
            .partition("a")
            .coalesced()
            .call(|_| Ok::<_, Boom>("pa"))
            .unwrap();
        let typed = p.coalesce_key("k").call(|_| Ok::<_, Boom>(7u32)).unwrap();
        assert_eq!((a, b2, plain, part, typed), ("a", "b", "none", "pa", 7));
        let again = p
            .partition("a")
            .coalesce_key("k")
            .call(|_| Ok::<_, Boom>("x"))
            .unwrap();
        assert_eq!(again, "a");
    }

    #[test]
    fn a_hedge_with_the_shortest_delay_runs_and_the_first_answer_wins() {
        let (b, clock) = builder("fs-hedge-1ns");
        let p = b
            .hedging(
                Hedging::latency(Duration::from_nanos(1))
                    .max_hedged_attempts(2)
                    .budget(RetryBudget::new(0.1, 10)),
            )
            .build()
            .unwrap();
        let started = AtomicU32::new(0);
        let r = rt().block_on(p.run(|ctx: Context| {
            started.fetch_add(1, Ordering::SeqCst);
            let n = ctx.attempt();
            after(&clock, ms(100), Ok::<_, Boom>(n))
        }));
        assert_eq!(r.unwrap(), 1);
        assert_eq!(started.load(Ordering::SeqCst), 3);
        assert_eq!(clock.now() - FAR, ms(100));
    }
}

mod timeouts {
    use super::*;
    use seawall::error::TimeoutScope;

    fn timeout_of(r: &Result<u32, Error<Boom>>) -> Option<(TimeoutScope, Duration, u32)> {
        match r {
            Err(Error::Timeout(t)) => Some((t.scope, t.after, t.attempts)),
            _ => None,
        }
    }

    #[test]
    fn attempts_that_all_time_out_end_with_the_last_attempts_timeout() {
        let (b, clock) = builder("fs-to-retry-blocked");
        let p = b
            .retry(Retry::constant(ms(1)).max_attempts(3))
            .timeout(ms(50))
            .build()
            .unwrap();
        let r = rt().block_on(p.run(|_| std::future::pending::<Result<u32, Boom>>()));
        assert_eq!(
            timeout_of(&r),
            Some((TimeoutScope::Attempt, ms(50), 3)),
            "{r:?}"
        );
        assert_eq!(clock.now() - FAR, ms(152));
    }

    #[test]
    fn an_overall_timeout_reports_the_attempts_that_ran() {
        let (b, clock) = builder("fs-to-overall-blocked");
        let p = b
            .timeout(ms(100))
            .retry(Retry::constant(ms(10)).max_attempts(5))
            .build()
            .unwrap();
        let mut n = 0;
        let r = rt().block_on(p.run(|_| {
            n += 1;
            let clock = clock.clone();
            let first = n == 1;
            async move {
                if first {
                    after(&clock, ms(30), Err(Boom(1))).await
                } else {
                    std::future::pending().await
                }
            }
        }));
        assert_eq!(
            timeout_of(&r),
            Some((TimeoutScope::Overall, ms(100), 2)),
            "{r:?}"
        );
        assert_eq!(clock.now() - FAR, ms(100));
    }

    #[test]
    fn a_strict_attempt_timeout_in_a_blocking_call_is_retried() {
        let (b, clock) = builder("fs-to-strict-retry");
        let p = b
            .retry(Retry::constant(ms(1)).max_attempts(3))
            .timeout(Timeout::strict(ms(50)))
            .build()
            .unwrap();
        let r = p.call(|ctx| {
            if ctx.attempt() < 3 {
                clock.advance(ms(60));
            }
            Ok::<u32, Boom>(ctx.attempt())
        });
        assert_eq!(r.unwrap(), 3);
        let r = p.call(|_| {
            clock.advance(ms(60));
            Ok::<u32, Boom>(0)
        });
        assert_eq!(
            timeout_of(&r),
            Some((TimeoutScope::Attempt, ms(50), 3)),
            "{r:?}"
        );
    }

    #[test]
    fn a_result_at_the_deadline_is_on_time_and_one_after_it_late() {
        for (took, late) in [(ms(50), false), (ms(50) + Duration::from_nanos(1), true)] {
            let (b, clock) = builder("fs-to-edge");
            let p = b.timeout(Timeout::strict(ms(50))).build().unwrap();
            let r = p.call(|_| {
                clock.advance(took);
                Ok::<u32, Boom>(1)
            });
            assert_eq!(r.is_err(), late, "{took:?}: {r:?}");
            let (b, clock) = builder("fs-to-edge-async");
            let p = b.timeout(ms(50)).build().unwrap();
            let r = rt().block_on(p.run(|_| after(&clock, took, Ok::<u32, Boom>(1))));
            assert_eq!(r.is_err(), late, "async {took:?}: {r:?}");
        }
    }
}

mod waits_and_timeouts {
    use super::*;

    #[test]
    fn a_permit_wait_that_would_outlast_the_deadline_is_refused_at_once() {
        for flavor in FLAVORS {
            let (b, clock) = builder("fs-rl-deadline");
            let p = b
                .timeout(ms(100))
                .rate_limiter(RateLimiter::gcra(1, secs(1)).burst(1).max_wait(secs(10)))
                .build()
                .unwrap();
            exec(&p, flavor, |_| Ok::<_, Boom>(1)).unwrap();
            let r = exec(&p, flavor, |_| Ok::<_, Boom>(2));
            let rej = r.unwrap_err().rejection().cloned().unwrap();
            assert_eq!(
                (rej.reason, rej.retry_after),
                (RejectionReason::RateLimited, Some(secs(1)))
            );
            assert_eq!(clock.now(), FAR, "{flavor:?}");
        }
    }

    /// A call holding the only slot for `hold` and a call queued behind
    /// it, both under a timeout of the whole call of `timeout`.
    fn queued_behind(
        adaptive: bool,
        timeout: Duration,
        hold: Duration,
        listening: bool,
    ) -> (Outcome, Outcome, Duration) {
        let (b, clock, _) = builder_listening("fs-queue-deadline");
        let b = if listening {
            b
        } else {
            builder("fs-queue-deadline").0.clock(clock.clone())
        };
        let b = b.timeout(timeout);
        let p = if adaptive {
            b.adaptive_limit(AdaptiveLimit::aimd().limits(1, 1, 2).queue(1, secs(10)))
        } else {
            b.bulkhead(Bulkhead::new(1).queue(1, secs(10)))
        }
        .build()
        .unwrap();
        let at = Mutex::new(Duration::ZERO);
        let (a, b2) = rt().block_on(async {
            tokio::join!(p.run(|_| after(&clock, hold, Ok::<_, Boom>(1))), async {
                let r = p.run(|_| async { Ok::<_, Boom>(2) }).await;
                *at.lock().unwrap() = clock.now() - FAR;
                r
            },)
        });
        let at = *at.lock().unwrap();
        (a, b2, at)
    }

    #[test]
    fn a_slot_given_back_at_a_queued_calls_deadline_is_still_its_own() {
        for adaptive in [false, true] {
            for listening in [false, true] {
                for t in [99, 100, 101] {
                    // The holder answers at the deadline (on time).
                    let (a, b2, at) = queued_behind(adaptive, ms(t), ms(t), listening);
                    assert_eq!((a.unwrap(), at), (1, ms(t)));
                    assert_eq!(b2.unwrap(), 2, "adaptive {adaptive}, {t} ms");
                    // The holder times out at the deadline.
                    let (a, b2, _) = queued_behind(adaptive, ms(t), secs(1), listening);
                    assert!(matches!(a, Err(Error::Timeout(_))), "{a:?}");
                    assert_eq!(b2.unwrap(), 2, "adaptive {adaptive}, {t} ms");
                }
            }
        }
    }
}

mod deadlines_and_windows {
    use super::*;

    #[test]
    fn a_call_whose_deadline_runs_out_in_a_queue_is_refused_as_by_a_full_bulkhead() {
        for listening in [false, true] {
            let clock = clock_at(FAR);
            let store = MemoryStore::new();
            let name = unique("fs-shared-bh");
            let holder = Pipeline::builder(name.clone())
                .store(store.clone())
                .clock(clock.clone())
                .bulkhead(Bulkhead::new(1).queue(1, secs(10)))
                .build()
                .unwrap();
            let (log, l) = recorder();
            let b = Pipeline::builder(name)
                .store(store)
                .clock(clock.clone())
                .timeout(ms(100))
                .bulkhead(Bulkhead::new(1).queue(1, secs(10)));
            let b = if listening { b.on_event(l) } else { b };
            let waiter = b.build().unwrap();
            let at = Mutex::new(Duration::ZERO);
            let ran = AtomicU32::new(0);
            let (a, b2) = rt().block_on(async {
                tokio::join!(
                    holder.run(|_| after(&clock, secs(1), Ok::<_, Boom>(1))),
                    async {
                        let r = waiter
                            .run(|_| {
                                ran.fetch_add(1, Ordering::SeqCst);
                                async { Ok::<_, Boom>(2) }
                            })
                            .await;
                        *at.lock().unwrap() = clock.now() - FAR;
                        r
                    }
                )
            });
            assert_eq!(a.unwrap(), 1);
            assert_eq!(reason(&b2), Some(RejectionReason::BulkheadFull), "{b2:?}");
            assert_eq!(
                (*at.lock().unwrap(), ran.load(Ordering::SeqCst)),
                (ms(100), 0)
            );
            if listening {
                let deferred = count(&log, |e| matches!(e, EventKind::Deferred { .. }));
                assert_eq!(deferred, 1);
            }
        }
    }

    #[test]
    fn a_time_window_forgets_old_calls_then_trips_probes_and_closes() {
        for flavor in FLAVORS {
            let (b, clock) = builder("fs-cb-time-seq");
            let p = b
                .circuit_breaker(
                    CircuitBreaker::failure_rate(0.5)
                        .window(secs(2))
                        .minimum_calls(3)
                        .cooldown(ms(1)),
                )
                .build()
                .unwrap();
            let f = |p: &Pipeline| {
                let _ = exec(p, flavor, |_| Err::<u32, _>(Boom(1)));
                p.circuit_state().unwrap()
            };
            let s = |p: &Pipeline| {
                let _ = exec(p, flavor, |_| Ok::<u32, Boom>(1));
                p.circuit_state().unwrap()
            };
            use CircuitState::{Closed, Open};
            let mut states = vec![f(&p), s(&p)];
            // Both roll out of the window.
            clock.advance(ms(2100));
            states.extend([f(&p), s(&p)]);
            clock.advance(ms(500));
            // 1 failure in 3, then 2 in 4: the rate reaches 0.5.
            states.extend([s(&p), f(&p), f(&p)]);
            clock.advance(ms(1));
            // A failed probe opens it again; a successful one closes it.
            states.push(f(&p));
            clock.advance(ms(1));
            states.push(s(&p));
            assert_eq!(
                states,
                [Closed, Closed, Closed, Closed, Closed, Open, Open, Open, Closed],
                "{flavor:?}"
            );
        }
    }
}

mod cooldown_deadline {
    use super::*;

    #[test]
    fn a_pause_that_ends_at_the_deadline_is_waited_and_a_longer_one_refused_at_once() {
        for flavor in FLAVORS {
            for (pause, runs) in [(99u64, true), (100, true), (101, false)] {
                let (b, clock) = builder("fs-cd-deadline");
                let p = b
                    .timeout(ms(100))
                    .cooldown(Cooldown::new().max_wait(secs(1)))
                    .classify(move |_: &Boom| Verdict::throttled().with_retry_after(ms(pause)))
                    .build()
                    .unwrap();
                let _ = exec(&p, flavor, |_| Err::<u32, _>(Boom(1)));
                let t0 = clock.now();
                let r = exec(&p, flavor, |_| Ok::<u32, Boom>(2));
                if runs {
                    assert_eq!((r.unwrap(), clock.now() - t0), (2, ms(pause)));
                } else {
                    assert_eq!(reason(&r), Some(RejectionReason::CooldownExceedsDeadline));
                    assert_eq!(clock.now(), t0, "{flavor:?}");
                }
            }
        }
    }
}

mod budget_timing_and_sharing {
    use super::*;

    #[test]
    fn a_process_budget_refuses_before_the_backoff_and_a_shared_one_after_it() {
        for flavor in FLAVORS {
            for (shared, waited) in [(false, ms(10)), (true, ms(20))] {
                let (b, clock) = builder("fs-budget-timing");
                let budget = RetryBudget::new(0.1, 1);
                let budget = if shared { budget.shared() } else { budget };
                let p = b
                    .retry(Retry::constant(ms(10)).max_attempts(3).budget(budget))
                    .build()
                    .unwrap();
                let r = exec(&p, flavor, |_| Err::<u32, _>(Boom(1)));
                assert_eq!(reason(&r), Some(RejectionReason::RetryBudgetExhausted));
                assert_eq!(clock.now() - FAR, waited, "{flavor:?} shared {shared}");
            }
        }
    }

    #[test]
    fn concurrent_hedged_calls_with_one_key_share_one_hedged_execution() {
        let (b, clock, log) = builder_listening("fs-coalesce-hedge");
        let p = b
            .coalesce(Coalesce::new().ttl(secs(1)))
            .hedging(Hedging::latency(ms(10)))
            .build()
            .unwrap();
        let started = AtomicU32::new(0);
        let call = || {
            p.coalesce_key("k").run(|ctx: Context| {
                started.fetch_add(1, Ordering::SeqCst);
                let d = if ctx.attempt() == 1 { ms(100) } else { ms(5) };
                after(&clock, d, Ok::<_, Boom>(ctx.attempt()))
            })
        };
        let (a, b2) = rt().block_on(async { tokio::join!(call(), call()) });
        assert_eq!((a.unwrap(), b2.unwrap()), (2, 2));
        assert_eq!(started.load(Ordering::SeqCst), 2);
        assert_eq!(clock.now() - FAR, ms(15));
        // A blocking call of a hedged pipeline is refused, cache or not.
        let blocking = p.coalesce_key("k").call(|_| Ok::<u32, Boom>(9));
        assert!(matches!(blocking, Err(Error::Config(_))), "{blocking:?}");
        let cached = rt().block_on(p.coalesce_key("k").run(|_| async { Ok::<u32, Boom>(9) }));
        assert_eq!(cached.unwrap(), 2);
        assert_eq!(count(&log, |e| matches!(e, EventKind::Coalesced)), 1);
    }
}
