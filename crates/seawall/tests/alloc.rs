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
    }
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
