//! Weighted rate-limit permits through a pipeline on the in-memory store,
//! on the virtual clock: exact admitted counts for every algorithm, the
//! weight that never fits, a weight of 0, and a weighted call that waits.

use std::time::Duration;

use seawall::testing::VirtualClock;
use seawall::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[derive(Debug, Clone, PartialEq)]
struct Fail;

fn pipeline(name: &str, limiter: RateLimiter, clock: &VirtualClock) -> Pipeline {
    Pipeline::builder(name)
        .rate_limiter(limiter)
        .store(MemoryStore::new())
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// The refusal of a call, `None` when it was admitted.
fn refusal(r: Result<(), Error<Fail>>) -> Option<Rejection> {
    match r {
        Ok(()) => None,
        Err(Error::Rejected(r)) => Some(r),
        Err(other) => panic!("expected a rejection, got {other:?}"),
    }
}

fn weighted(p: &Pipeline, n: u32) -> Option<Rejection> {
    refusal(p.weighted(n).unwrap().call(|_| Ok::<_, Fail>(())))
}

#[test]
fn gcra_weight_four_twice_then_refused_with_the_exact_wait() {
    let clock = VirtualClock::new();
    let p = pipeline("w-gcra", RateLimiter::gcra(10, secs(1)), &clock);
    assert!(weighted(&p, 4).is_none());
    assert!(weighted(&p, 4).is_none());
    let r = weighted(&p, 4).expect("the third call is refused");
    assert_eq!(r.reason, RejectionReason::RateLimited);
    // TAT at 800 ms, the last of 4 permits at 1100 ms, tolerance 900 ms.
    assert_eq!(r.retry_after, Some(ms(200)));
    // Two permits are left now; an unweighted call takes one of them.
    assert!(weighted(&p, 2).is_none());
    assert!(refusal(p.call(|_| Ok::<_, Fail>(()))).is_some());
    clock.advance(ms(400));
    assert!(weighted(&p, 4).is_none());
    assert!(weighted(&p, 1).is_some());
}

#[test]
fn windows_count_every_permit_of_a_weighted_call() {
    let clock = VirtualClock::new();
    let p = pipeline("w-fixed", RateLimiter::fixed_window(10, secs(1)), &clock);
    let admitted = (0..5).filter(|_| weighted(&p, 3).is_none()).count();
    assert_eq!(admitted, 3, "3 + 3 + 3 of 10");
    let r = weighted(&p, 2).unwrap();
    assert_eq!(r.retry_after, Some(secs(1)));
    assert!(weighted(&p, 1).is_none(), "the tenth permit");
    clock.advance(secs(1));
    assert!(weighted(&p, 10).is_none());
    assert!(weighted(&p, 1).is_some());

    let clock = VirtualClock::new();
    let p = pipeline(
        "w-sliding",
        RateLimiter::sliding_window(10, secs(1)),
        &clock,
    );
    assert!(weighted(&p, 6).is_none());
    clock.advance(ms(500));
    assert!(weighted(&p, 3).is_none());
    // 9 permits in the window: 2 more must wait for the first 6 to expire.
    let r = weighted(&p, 2).unwrap();
    assert_eq!(r.retry_after, Some(ms(500)));
    assert!(weighted(&p, 1).is_none());
    clock.advance(ms(500));
    assert!(weighted(&p, 6).is_none(), "the first 6 expired");
    assert!(weighted(&p, 1).is_some());
    // Partitioned: each key has its own log of weighted entries.
    let q = Pipeline::builder("w-sliding-keys")
        .rate_limiter(RateLimiter::sliding_window(5, secs(1)))
        .store(MemoryStore::new())
        .clock(clock.clone())
        .build()
        .unwrap();
    let run = |key: &'static str, n: u32| {
        refusal(
            q.partition(key)
                .weighted(n)
                .unwrap()
                .call(|_| Ok::<_, Fail>(())),
        )
    };
    assert!(run("a", 5).is_none());
    assert!(run("a", 1).is_some());
    assert!(run("b", 4).is_none());
    assert!(run("b", 2).is_some());
    assert!(run("b", 1).is_none());
}

#[test]
fn a_weight_beyond_the_burst_or_the_limit_is_refused_at_once() {
    let clock = VirtualClock::new();
    for limiter in [
        RateLimiter::gcra(10, secs(1)).burst(3),
        RateLimiter::fixed_window(3, secs(1)),
        RateLimiter::sliding_window(3, secs(1)),
        // Even when calls may wait: waiting would never help.
        RateLimiter::gcra(10, secs(1)).burst(3).max_wait(secs(60)),
    ] {
        let p = pipeline("w-over", limiter.clone(), &clock);
        let r = weighted(&p, 4).expect("refused");
        assert_eq!(r.reason, RejectionReason::RateLimited, "{limiter:?}");
        assert_eq!(r.retry_after, None, "{limiter:?}");
        assert_eq!(clock.now(), Duration::ZERO, "no wait");
        // Nothing was taken: the full burst is still there.
        assert!(weighted(&p, 3).is_none(), "{limiter:?}");
    }
}

/// In shadow mode the limiter never refuses: a weight beyond its burst or
/// limit runs at once, reported as the refusal it would have been (no
/// `retry_after`), and takes nothing.
#[test]
fn a_weight_beyond_the_burst_runs_in_shadow_mode_and_is_reported() {
    let clock = VirtualClock::new();
    for limiter in [
        RateLimiter::gcra(10, secs(1)).burst(3),
        RateLimiter::fixed_window(3, secs(1)),
        RateLimiter::sliding_window(3, secs(1)),
        RateLimiter::gcra(10, secs(1)).burst(3).max_wait(secs(60)),
    ] {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = seen.clone();
        let p = Pipeline::builder("w-over-shadow")
            .rate_limiter(limiter.clone().shadow(true))
            .store(MemoryStore::new())
            .clock(clock.clone())
            .on_event(move |e| {
                if let EventKind::ShadowRejected {
                    reason,
                    retry_after,
                } = e.kind
                {
                    s.lock().unwrap().push((reason, retry_after));
                }
            })
            .build()
            .unwrap();
        assert!(weighted(&p, 4).is_none(), "{limiter:?}");
        assert_eq!(
            *seen.lock().unwrap(),
            vec![(RejectionReason::RateLimited, None)],
            "{limiter:?}"
        );
        assert_eq!(clock.now(), Duration::ZERO, "no wait");
        // Nothing was taken: the full burst is still there.
        assert!(weighted(&p, 3).is_none(), "{limiter:?}");
        assert_eq!(seen.lock().unwrap().len(), 1, "{limiter:?}");
    }
}

#[test]
fn a_weight_of_zero_is_a_configuration_error() {
    let clock = VirtualClock::new();
    let p = pipeline("w-zero", RateLimiter::gcra(10, secs(1)), &clock);
    let e = p.weighted(0).unwrap_err();
    assert_eq!((e.policy, e.field), ("rate_limit", "weight"));
    assert_eq!(e.to_string(), "rate_limit.weight must be >= 1, got 0");
    let e = p.partition("k").weighted(0).unwrap_err();
    assert_eq!(e.field, "weight");
    assert_eq!(p.weighted(3).unwrap().weight(), 3);
}

#[test]
fn a_weighted_call_with_max_wait_waits_the_exact_time() {
    let clock = VirtualClock::new();
    // 10 per second, burst 4, calls may wait up to 2 s.
    let p = pipeline(
        "w-wait",
        RateLimiter::gcra(10, secs(1)).burst(4).max_wait(secs(2)),
        &clock,
    );
    assert!(weighted(&p, 4).is_none());
    assert_eq!(clock.now(), Duration::ZERO);
    // TAT 400 ms; 3 permits: the last at 600 ms, less 300 ms of tolerance.
    assert!(weighted(&p, 3).is_none());
    assert_eq!(clock.now(), ms(300));
    // Async too: TAT 700 ms, 4 permits: 700 + 300 - 300 = 700 ms.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let r = rt.block_on(p.weighted(4).unwrap().run(|_| async { Ok::<_, Fail>(()) }));
    assert!(r.is_ok());
    assert_eq!(clock.now(), ms(700));
}

/// What a call came to: `None` admitted (the operation's value), or the
/// refusal's reason and `retry_after`.
type Outcome = Option<(RejectionReason, Option<Duration>)>;

fn outcome(r: Result<u32, Error<Fail>>) -> Outcome {
    refusal(r.map(|_| ())).map(|r| (r.reason, r.retry_after))
}

/// GCRA of 10 per second (burst 10) with a bulkhead of 1, a breaker and a
/// retry, on the default store: without a listener every call below takes
/// the engine's ordinary path (its weight given to the same admission as
/// an unweighted call), with one the general loop. `name`: its own state
/// in the process-wide store.
fn guarded(name: &str, clock: &VirtualClock, listening: bool) -> Pipeline {
    // The retry outermost: each attempt is admitted by the gate inside it.
    let mut b = Pipeline::builder(name)
        .retry(Retry::constant(Duration::ZERO).max_attempts(2))
        .circuit_breaker(CircuitBreaker::consecutive_failures(3))
        .bulkhead(Bulkhead::new(1))
        .rate_limiter(RateLimiter::gcra(10, secs(1)))
        .clock(clock.clone());
    if listening {
        b = b.on_event(|_| {});
    }
    b.build().unwrap()
}

/// The calls of [`the_ordinary_path_takes_every_permit_of_a_weighted_call`]
/// as `(weight, failures before success, advance the clock first)`, and
/// what each must come to.
fn ordinary_script() -> Vec<(u32, u32, Duration, Outcome)> {
    let rate_limited = |after| Some((RejectionReason::RateLimited, after));
    vec![
        // 4 permits, then 3 twice: the first attempt fails, the retry takes
        // 3 more. All 10 are spent: the TAT is 1 s, the tolerance 900 ms.
        (4, 0, Duration::ZERO, None),
        (3, 1, Duration::ZERO, None),
        (1, 0, Duration::ZERO, rate_limited(Some(ms(100)))),
        // More than the burst: refused at once, nothing taken.
        (11, 0, Duration::ZERO, rate_limited(None)),
        // 300 ms later, 3 permits are free: all 3 at once, then none.
        (3, 0, ms(300), None),
        (1, 0, Duration::ZERO, rate_limited(Some(ms(100)))),
        (2, 0, ms(100), rate_limited(Some(ms(100)))),
        (1, 0, Duration::ZERO, None),
    ]
}

#[test]
fn the_ordinary_path_takes_every_permit_of_a_weighted_call() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    for start in [Duration::ZERO, secs(1_000_000)] {
        for listening in [false, true] {
            for sync in [true, false] {
                let clock = VirtualClock::starting_at(start);
                let name = format!("w-ordinary-{start:?}-{listening}-{sync}");
                let p = guarded(&name, &clock, listening);
                let runs = std::sync::atomic::AtomicU32::new(0);
                for (i, (weight, failures, advance, want)) in
                    ordinary_script().into_iter().enumerate()
                {
                    clock.advance(advance);
                    let left = std::sync::atomic::AtomicU32::new(failures);
                    let attempt = || {
                        runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let failing = left
                            .fetch_update(
                                std::sync::atomic::Ordering::Relaxed,
                                std::sync::atomic::Ordering::Relaxed,
                                |n| n.checked_sub(1),
                            )
                            .is_ok();
                        if failing {
                            Err(Fail)
                        } else {
                            Ok(weight)
                        }
                    };
                    let w = p.weighted(weight).unwrap();
                    let got = if sync {
                        w.call(|_| attempt())
                    } else {
                        rt.block_on(w.run(|_| std::future::ready(attempt())))
                    };
                    let context =
                        format!("call {i} from {start:?}, listening {listening}, sync {sync}");
                    assert_eq!(outcome(got), want, "{context}");
                }
                // One attempt for each of the 4 admitted calls, one more for
                // the retried one; a refused call runs nothing.
                assert_eq!(runs.into_inner(), 5, "from {start:?}");
                // Nothing waited on the virtual clock.
                assert_eq!(clock.now(), start + ms(400));
            }
        }
    }
}

/// GCRA at a rate whose interval is a fraction of a nanosecond more than a
/// whole number of them (400,000 per millisecond: 2.5 ns) never admits
/// more than the limit and the burst in a period: the interval is rounded
/// up (3 ns), not truncated (2 ns, which admitted 500,500 permits).
#[test]
fn gcra_never_admits_more_than_the_limit_at_a_few_nanoseconds_per_permit() {
    for start in [Duration::ZERO, secs(1_000_000)] {
        let clock = VirtualClock::starting_at(start);
        let p = pipeline(
            "fractional-interval",
            RateLimiter::gcra(400_000, ms(1)).burst(1000),
            &clock,
        );
        let mut granted = 0u64;
        // One millisecond in steps of a microsecond, both ends included.
        for _ in 0..=1000 {
            while weighted(&p, 100).is_none() {
                granted += 100;
            }
            clock.advance(Duration::from_micros(1));
        }
        assert!(
            granted <= 400_000 + 1000,
            "{granted} permits in 1 ms from {start:?}"
        );
        // 3 ns per permit after the burst: 1000 + 333,333, in calls of 100.
        assert!(
            granted >= 334_000,
            "{granted} permits in 1 ms from {start:?}"
        );
    }
}

/// A fixed window with a limit of 2^31 or more is fresh after any idle
/// time: the stored window is never read as a later one (idle 3,000,000 s
/// at 1 ms windows was refused for 1,294,967 s).
#[test]
fn a_fixed_window_with_a_huge_limit_is_fresh_after_any_idle_time() {
    for start in [Duration::ZERO, secs(1_000_000)] {
        for limit in [u32::MAX, 1 << 31] {
            let mut idles = vec![secs(3_000_000)];
            idles.extend((0..45).flat_map(|k| {
                let windows = 1u64 << k;
                [windows - 1, windows, windows + 1].map(|w| ms(w.max(1)))
            }));
            for idle in idles {
                let clock = VirtualClock::starting_at(start);
                let p = pipeline(
                    "huge-window",
                    RateLimiter::fixed_window(limit, ms(1)),
                    &clock,
                );
                assert_eq!(weighted(&p, limit), None);
                assert!(weighted(&p, 1).is_some(), "the window is full");
                clock.advance(idle);
                assert_eq!(
                    weighted(&p, limit),
                    None,
                    "limit {limit}, idle {idle:?} from {start:?}"
                );
            }
        }
    }
}
