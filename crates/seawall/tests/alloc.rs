//! The success path allocates nothing, sync and async, with every policy.
//!
//! The counting allocator is the only unsafe code of the workspace: it
//! delegates to the system allocator.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use seawall::*;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: delegates every call to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

#[derive(Debug)]
struct Oops;

fn pipelines() -> Vec<(
    &'static str,
    Pipeline<seawall::pipeline::WithFallback<u64, Oops>>,
)> {
    let base = |name: &str| Pipeline::builder(name).store(MemoryStore::new());
    vec![
        (
            "empty",
            base("alloc-empty")
                .fallback_sync(|_, _| Ok(0))
                .build()
                .unwrap(),
        ),
        (
            "retry+timeout+fallback",
            base("alloc-rtf")
                .retry(
                    Retry::exponential(Duration::from_millis(10))
                        .max_attempts(3)
                        .jitter(Jitter::Full),
                )
                .timeout(Duration::from_secs(1))
                .fallback_sync(|_, _| Ok(0))
                .build()
                .unwrap(),
        ),
        (
            "full chain",
            base("alloc-full")
                .retry(Retry::exponential(Duration::from_millis(10)).max_attempts(3))
                .circuit_breaker(CircuitBreaker::failure_rate(0.5))
                .timeout(Duration::from_secs(1))
                .bulkhead(Bulkhead::new(100))
                .rate_limiter(
                    RateLimiter::gcra(100_000_000, Duration::from_secs(1)).burst(1_000_000),
                )
                .cooldown(Cooldown::new())
                .fallback_sync(|_, _| Ok(0))
                .build()
                .unwrap(),
        ),
        (
            "full chain, consecutive breaker, time window limiter",
            base("alloc-full-2")
                .retry(Retry::constant(Duration::from_millis(10)))
                .circuit_breaker(CircuitBreaker::consecutive_failures(5))
                .bulkhead(Bulkhead::new(100))
                .rate_limiter(RateLimiter::fixed_window(u32::MAX, Duration::from_secs(1)))
                .fallback_sync(|_, _| Ok(0))
                .build()
                .unwrap(),
        ),
        (
            "adaptive limit (gradient2) + retry",
            base("alloc-adaptive")
                .retry(Retry::constant(Duration::from_millis(10)))
                .adaptive_limit(AdaptiveLimit::gradient2())
                .fallback_sync(|_, _| Ok(0))
                .build()
                .unwrap(),
        ),
        (
            "adaptive limit (aimd, partitions) + bulkhead",
            base("alloc-adaptive-aimd")
                .adaptive_limit(
                    AdaptiveLimit::aimd()
                        .partition("live", 0.9)
                        .partition("batch", 0.1),
                )
                .bulkhead(Bulkhead::new(100))
                .fallback_sync(|_, _| Ok(0))
                .build()
                .unwrap(),
        ),
    ]
}

#[test]
fn success_path_allocates_nothing() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    for (name, p) in pipelines() {
        // warm up: lazily initialised statics, thread-local random state
        assert_eq!(p.call(|_| Ok(1)).unwrap(), 1);
        let before = allocations();
        for i in 0..1_000u64 {
            assert_eq!(p.call(|_| Ok(i)).unwrap(), i);
        }
        assert_eq!(allocations() - before, 0, "sync {name}");

        let p2 = p.clone();
        let async_allocs = rt.block_on(async move {
            assert_eq!(p2.run(|_| async { Ok(1) }).await.unwrap(), 1);
            let before = allocations();
            for i in 0..1_000u64 {
                assert_eq!(p2.run(|_| async move { Ok(i) }).await.unwrap(), i);
            }
            allocations() - before
        });
        assert_eq!(async_allocs, 0, "async {name}");

        // a partition key that is an integer or a static str costs nothing
        // once the partition exists
        let part = p.partition(7u64);
        part.call(|_| Ok(1)).unwrap();
        let before = allocations();
        for i in 0..100u64 {
            part.call(|_| Ok(i)).unwrap();
        }
        assert_eq!(allocations() - before, 0, "partitioned {name}");

        // a partition that names a share of the adaptive limit
        let live = p.partition("live");
        live.call(|_| Ok(1)).unwrap();
        let before = allocations();
        for i in 0..100u64 {
            live.call(|_| Ok(i)).unwrap();
        }
        assert_eq!(allocations() - before, 0, "share {name}");
    }
}

#[derive(Debug, Clone)]
struct Shared;

/// A coalesced call allocates its execution (one `Arc`): a leader alone
/// one allocation, a leader with followers one more (the result they
/// share, cloned for each), a follower none, a cache hit none, a success
/// kept in the cache one (the kept value).
#[test]
fn coalesced_calls_allocate_their_execution_only() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let p = Pipeline::builder("alloc-coalesce")
        .coalesce(Coalesce::new())
        .store(MemoryStore::new())
        .build()
        .unwrap();
    // warm up: the table's capacity
    p.coalesce_key(1u64)
        .call(|_| Ok::<_, Shared>(1u64))
        .unwrap();
    let before = allocations();
    for i in 0..1_000u64 {
        assert_eq!(
            p.coalesce_key(i % 8).call(|_| Ok::<_, Shared>(i)).unwrap(),
            i
        );
    }
    assert_eq!(allocations() - before, 1_000, "sync leader alone");
    let p2 = p.clone();
    let async_allocs = rt.block_on(async move {
        p2.coalesce_key(1u64)
            .run(|_| async { Ok::<_, Shared>(1u64) })
            .await
            .unwrap();
        let before = allocations();
        for i in 0..1_000u64 {
            let v = p2
                .coalesce_key(i % 8)
                .run(|_| async move { Ok::<_, Shared>(i) })
                .await
                .unwrap();
            assert_eq!(v, i);
        }
        allocations() - before
    });
    assert_eq!(async_allocs, 1_000, "async leader alone");

    // A leader with followers: each thread counts its own allocations.
    const FOLLOWERS: usize = 8;
    let started = std::sync::atomic::AtomicBool::new(false);
    let counts: Vec<u64> = std::thread::scope(|s| {
        let leader = s.spawn(|| {
            let before = allocations();
            let v = p.coalesce_key(99u64).call(|_| {
                started.store(true, std::sync::atomic::Ordering::SeqCst);
                for _ in 0..20_000_000u32 {
                    if p.coalesced_waiters() >= FOLLOWERS {
                        break;
                    }
                    std::thread::yield_now();
                }
                Ok::<_, Shared>(5u64)
            });
            assert_eq!(v.unwrap(), 5);
            allocations() - before
        });
        while !started.load(std::sync::atomic::Ordering::SeqCst) && !leader.is_finished() {
            std::thread::yield_now();
        }
        let followers: Vec<_> = (0..FOLLOWERS)
            .map(|_| {
                s.spawn(|| {
                    let before = allocations();
                    let v = p.coalesce_key(99u64).call(|_| Ok::<_, Shared>(6u64));
                    assert_eq!(v.unwrap(), 5);
                    allocations() - before
                })
            })
            .collect();
        let mut counts = vec![leader.join().unwrap()];
        counts.extend(followers.into_iter().map(|f| f.join().unwrap()));
        counts
    });
    assert_eq!(counts[0], 2, "a leader with followers");
    assert!(counts[1..].iter().all(|c| *c == 0), "followers: {counts:?}");

    let cached = Pipeline::builder("alloc-coalesce-cached")
        .coalesce(Coalesce::new().ttl(Duration::from_secs(3600)))
        .store(MemoryStore::new())
        .build()
        .unwrap();
    cached
        .coalesce_key(1u64)
        .call(|_| Ok::<_, Shared>(1u64))
        .unwrap();
    let before = allocations();
    for _ in 0..1_000u64 {
        assert_eq!(
            cached
                .coalesce_key(1u64)
                .call(|_| Ok::<_, Shared>(2u64))
                .unwrap(),
            1
        );
    }
    assert_eq!(allocations() - before, 0, "cache hits");
    let before = allocations();
    cached
        .coalesce_key(2u64)
        .call(|_| Ok::<_, Shared>(2u64))
        .unwrap();
    assert_eq!(
        allocations() - before,
        2,
        "a miss: the execution and the kept value"
    );
}

/// A pipeline with hedging whose first attempt answers before the hedging
/// delay (no hedge fires) allocates nothing either: the first attempt
/// lives in the call's future, the hedge timer is the runtime's, and the
/// lanes of hedged attempts are boxed only when one starts. Answered at
/// once and after a yield (the hedge timer is then armed and dropped).
#[test]
fn hedging_success_path_without_a_hedge_allocates_nothing() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let base = |name: &str| Pipeline::builder(name).store(MemoryStore::new());
    let pipelines = [
        (
            "hedging",
            base("alloc-hedging")
                .hedging(Hedging::latency(Duration::from_secs(1)).max_hedged_attempts(2))
                .build()
                .unwrap(),
        ),
        (
            "hedging fallback mode with a budget",
            base("alloc-hedging-fallback")
                .hedging(Hedging::fallback().budget(RetryBudget::new(0.1, 10)))
                .build()
                .unwrap(),
        ),
        (
            "timeout, hedging, breaker, bulkhead, attempt timeout",
            base("alloc-hedging-full")
                .timeout(Duration::from_secs(2))
                .hedging(Hedging::latency(Duration::from_secs(1)))
                .circuit_breaker(CircuitBreaker::failure_rate(0.5))
                .bulkhead(Bulkhead::new(100))
                .timeout(Duration::from_secs(1))
                .build()
                .unwrap(),
        ),
    ];
    for (name, p) in pipelines {
        let allocs = rt.block_on(async move {
            assert_eq!(p.run(|_| async { Ok::<_, Oops>(1) }).await.unwrap(), 1);
            p.run(|_| async {
                tokio::task::yield_now().await;
                Ok::<_, Oops>(1)
            })
            .await
            .unwrap();
            let before = allocations();
            for i in 0..1_000u64 {
                assert_eq!(p.run(|_| async move { Ok::<_, Oops>(i) }).await.unwrap(), i);
            }
            let at_once = allocations() - before;
            let before = allocations();
            for i in 0..1_000u64 {
                let r = p
                    .run(|_| async move {
                        tokio::task::yield_now().await;
                        Ok::<_, Oops>(i)
                    })
                    .await;
                assert_eq!(r.unwrap(), i);
            }
            (at_once, allocations() - before)
        });
        assert_eq!(allocs, (0, 0), "{name}");
    }
}
