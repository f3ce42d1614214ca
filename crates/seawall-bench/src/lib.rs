//! Shared pieces of seawall's peer benchmarks (`cargo bench -p seawall-bench`,
//! or `scripts/bench.sh` for the whole suite and its summary table).
//!
//! This library holds what the benchmark binaries share and what needs
//! nothing but seawall: the operation every scenario protects, the seawall
//! pipelines of each scenario (one policy alone is a pipeline with only that
//! policy), and the timing of a loop run by several threads at once. The
//! peer crates are dev-dependencies of the benchmarks only, so that
//! `cargo test --workspace` never builds them.

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use seawall::pipeline::WithFallback;
use seawall::{
    Bulkhead, CircuitBreaker, Cooldown, Hedging, Jitter, MemoryStore, Pipeline, RateLimiter, Retry,
};

/// The error of the protected operation (never returned on the success path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Oops;

impl std::fmt::Display for Oops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("oops")
    }
}

impl std::error::Error for Oops {}

/// The protected operation: returns its input, opaque to the optimiser.
#[inline]
pub fn op(x: u64) -> Result<u64, Oops> {
    Ok(black_box(x))
}

/// The protected operation on the failure path.
#[inline]
pub fn failing_op(_x: u64) -> Result<u64, Oops> {
    Err(black_box(Oops))
}

/// Requests per second no limiter of the suite ever reaches, so that every
/// rate-limit scenario measures the admission path.
pub const UNREACHABLE_RATE: u32 = 1_000_000_000;

/// The seawall pipelines of the scenarios, each on a store of its own.
pub mod pipelines {
    use super::*;

    fn builder(name: &str) -> seawall::PipelineBuilder {
        Pipeline::builder(name).store(MemoryStore::new())
    }

    /// The retry policy of the retry scenarios: exponential backoff from
    /// 10 ms, 3 attempts, full jitter.
    pub fn retry_policy() -> Retry {
        Retry::exponential(Duration::from_millis(10))
            .max_attempts(3)
            .jitter(Jitter::Full)
    }

    /// The circuit breaker of the breaker scenarios: failure rate 50 % over
    /// a count window of the last 100 calls, cooldown 60 s (the window and
    /// threshold of the peers it is compared with).
    pub fn count_window_breaker() -> CircuitBreaker {
        CircuitBreaker::failure_rate(0.5)
            .count_window(100)
            .minimum_calls(100)
            .cooldown(Duration::from_secs(60))
    }

    /// Retry alone.
    pub fn retry() -> Pipeline {
        builder("bench-retry")
            .retry(retry_policy())
            .build()
            .expect("valid pipeline")
    }

    /// A count-window circuit breaker alone, closed.
    pub fn breaker() -> Pipeline {
        builder("bench-breaker")
            .circuit_breaker(count_window_breaker())
            .build()
            .expect("valid pipeline")
    }

    /// A consecutive-failures circuit breaker (5 in a row) alone, closed.
    pub fn consecutive_breaker() -> Pipeline {
        builder("bench-breaker-consecutive")
            .circuit_breaker(
                CircuitBreaker::consecutive_failures(5).cooldown(Duration::from_secs(60)),
            )
            .build()
            .expect("valid pipeline")
    }

    /// A count-window circuit breaker alone, tripped open by 100 failures
    /// (cooldown one hour: it stays open for the whole run).
    pub fn open_breaker() -> Pipeline {
        let p = builder("bench-breaker-open")
            .circuit_breaker(count_window_breaker().cooldown(Duration::from_secs(3600)))
            .build()
            .expect("valid pipeline");
        for _ in 0..100 {
            let _ = p.call(|_| failing_op(1));
        }
        assert!(
            matches!(
                p.call(|_| op(1)),
                Err(seawall::Error::Rejected(r))
                    if r.reason == seawall::RejectionReason::CircuitOpen
            ),
            "the breaker must be open"
        );
        p
    }

    /// A GCRA rate limiter alone (10^9 per second, bursts of 10^6).
    pub fn gcra() -> Pipeline {
        builder("bench-gcra")
            .rate_limiter(
                RateLimiter::gcra(UNREACHABLE_RATE, Duration::from_secs(1)).burst(1_000_000),
            )
            .build()
            .expect("valid pipeline")
    }

    /// A fixed-window rate limiter alone (`u32::MAX` per second).
    pub fn fixed_window() -> Pipeline {
        builder("bench-fixed-window")
            .rate_limiter(RateLimiter::fixed_window(u32::MAX, Duration::from_secs(1)))
            .build()
            .expect("valid pipeline")
    }

    /// The limit and period of the sliding-window scenarios: 10^6 calls per
    /// 10 ms (an exact log of up to 10^6 entries), more than two threads
    /// can make.
    pub const SLIDING: (u32, Duration) = (1_000_000, Duration::from_millis(10));

    /// A sliding-window (exact log) rate limiter alone.
    pub fn sliding_window() -> Pipeline {
        builder("bench-sliding-window")
            .rate_limiter(RateLimiter::sliding_window(SLIDING.0, SLIDING.1))
            .build()
            .expect("valid pipeline")
    }

    /// A bulkhead alone (64 slots, no queue).
    pub fn bulkhead() -> Pipeline {
        builder("bench-bulkhead")
            .bulkhead(Bulkhead::new(64))
            .build()
            .expect("valid pipeline")
    }

    /// A timeout alone (1 s).
    pub fn timeout() -> Pipeline {
        builder("bench-timeout")
            .timeout(Duration::from_secs(1))
            .build()
            .expect("valid pipeline")
    }

    /// Hedging in latency mode, one hedge after 100 ms (the peers'
    /// settings): the operation answers at once, so no hedge fires.
    pub fn hedging() -> Pipeline {
        builder("bench-hedging")
            .hedging(Hedging::latency(Duration::from_millis(100)).max_hedged_attempts(1))
            .build()
            .expect("valid pipeline")
    }

    /// The count-window breaker declared before the retry: it guards the
    /// whole call (one admission, one outcome per call).
    pub fn breaker_before_retry() -> Pipeline {
        builder("bench-breaker-before-retry")
            .circuit_breaker(count_window_breaker())
            .retry(retry_policy())
            .build()
            .expect("valid pipeline")
    }

    /// The count-window breaker declared after the retry: it guards each
    /// attempt.
    pub fn breaker_after_retry() -> Pipeline {
        builder("bench-breaker-after-retry")
            .retry(retry_policy())
            .circuit_breaker(count_window_breaker())
            .build()
            .expect("valid pipeline")
    }

    /// The full chain: retry, count-window circuit breaker, per-attempt
    /// timeout, bulkhead, GCRA rate limiter and a fallback, under `name`
    /// in `store`.
    pub fn full_chain_in(name: &str, store: MemoryStore) -> Pipeline<WithFallback<u64, Oops>> {
        Pipeline::builder(name)
            .store(store)
            .retry(retry_policy())
            .circuit_breaker(CircuitBreaker::failure_rate(0.5))
            .timeout(Duration::from_secs(1))
            .bulkhead(Bulkhead::new(64))
            .rate_limiter(
                RateLimiter::gcra(UNREACHABLE_RATE, Duration::from_secs(1)).burst(1_000_000),
            )
            .fallback_sync(|_, _| Ok(0))
            .build()
            .expect("valid pipeline")
    }

    /// The full chain on a store of its own.
    pub fn full_chain() -> Pipeline<WithFallback<u64, Oops>> {
        full_chain_in("bench-full-chain", MemoryStore::new())
    }

    /// The stateful policies of a partitioned resource as documented by
    /// `MemoryStore`: consecutive-failures breaker, bulkhead, cooldown and
    /// GCRA limiter.
    pub fn partitioned(name: &str) -> Pipeline {
        builder(name)
            .circuit_breaker(CircuitBreaker::consecutive_failures(5))
            .bulkhead(Bulkhead::new(10))
            .cooldown(Cooldown::new())
            .rate_limiter(RateLimiter::gcra(100, Duration::from_secs(1)))
            .build()
            .expect("valid pipeline")
    }

    /// A GCRA limiter alone, for partitioned use.
    pub fn partitioned_gcra(name: &str) -> Pipeline {
        builder(name)
            .rate_limiter(RateLimiter::gcra(100, Duration::from_secs(1)))
            .build()
            .expect("valid pipeline")
    }
}

/// Runs `run(state, iters)` on one thread per state, all released at once
/// by a barrier, and returns the wall time from the first start to the last
/// end: with `iters` calls per thread, that is `iters` times the time per
/// call per thread (equal to the single-thread time when threads do not
/// slow each other down).
///
/// With one state the loop runs on the calling thread.
pub fn run_parallel<S, F>(states: &mut [S], iters: u64, run: F) -> Duration
where
    S: Send,
    F: Fn(&mut S, u64) + Sync,
{
    if let [state] = states {
        let start = Instant::now();
        run(state, iters);
        return start.elapsed();
    }
    let barrier = Barrier::new(states.len());
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|scope| {
        let handles: Vec<_> = states
            .iter_mut()
            .map(|state| {
                let (barrier, run) = (&barrier, &run);
                scope.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    run(state, iters);
                    (start, Instant::now())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("benchmark thread panicked"))
            .collect()
    });
    let first = spans
        .iter()
        .map(|s| s.0)
        .min()
        .expect("at least one thread");
    let last = spans
        .iter()
        .map(|s| s.1)
        .max()
        .expect("at least one thread");
    last - first
}
