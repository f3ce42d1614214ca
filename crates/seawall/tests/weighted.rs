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
