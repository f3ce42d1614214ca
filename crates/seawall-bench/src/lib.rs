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

    /// The retry with a budget kept in the process (0.1 per call, 10
    /// tokens).
    pub fn retry_budget() -> Pipeline {
        builder("bench-retry-budget")
            .retry(retry_policy().budget(seawall::RetryBudget::new(0.1, 10)))
            .build()
            .expect("valid pipeline")
    }

    /// The same budget kept in the store (`RetryBudget::shared`, the memory
    /// store): every call is admitted by the store, which earns the budget.
    pub fn retry_budget_shared() -> Pipeline {
        builder("bench-retry-budget-shared")
            .retry(retry_policy().budget(seawall::RetryBudget::new(0.1, 10).shared()))
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

    /// [`breaker`] in shadow mode (`seawall::shadow`), closed: the path of
    /// a call it admits is that of an enforcing breaker.
    pub fn shadow_breaker() -> Pipeline {
        builder("bench-breaker-shadow")
            .circuit_breaker(count_window_breaker().shadow(true))
            .build()
            .expect("valid pipeline")
    }

    /// [`open_breaker`] in shadow mode: tripped open by 100 failures, it
    /// would refuse every call, and admits it (no listener: the would-be
    /// refusal is reported to nobody).
    pub fn shadow_open_breaker() -> Pipeline {
        let p = builder("bench-breaker-shadow-open")
            .circuit_breaker(
                count_window_breaker()
                    .cooldown(Duration::from_secs(3600))
                    .shadow(true),
            )
            .build()
            .expect("valid pipeline");
        for _ in 0..100 {
            let _ = p.call(|_| failing_op(1));
        }
        assert_eq!(
            p.circuit_state().expect("a breaker"),
            seawall::CircuitState::Open,
            "the breaker must be open"
        );
        assert!(p.call(|_| op(1)).is_ok(), "and admit in shadow mode");
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

    /// [`gcra`] in shadow mode (`seawall::shadow`): never over its limit in
    /// a run, so the path of an enforcing limiter.
    pub fn shadow_gcra() -> Pipeline {
        builder("bench-gcra-shadow")
            .rate_limiter(
                RateLimiter::gcra(UNREACHABLE_RATE, Duration::from_secs(1))
                    .burst(1_000_000)
                    .shadow(true),
            )
            .build()
            .expect("valid pipeline")
    }

    /// A GCRA rate limiter of one call per hour whose permit is spent: every
    /// call is over the limit, refused (enforcing) or admitted (`shadow`).
    pub fn gcra_over_the_limit(shadow: bool) -> Pipeline {
        let p = builder(if shadow {
            "bench-gcra-over-shadow"
        } else {
            "bench-gcra-over"
        })
        .rate_limiter(RateLimiter::gcra(1, Duration::from_secs(3600)).shadow(shadow))
        .build()
        .expect("valid pipeline");
        assert!(p.call(|_| op(1)).is_ok(), "the one permit");
        assert_eq!(p.call(|_| op(1)).is_ok(), shadow, "over the limit");
        p
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

    /// An adaptive concurrency limit alone: Gradient2 with its defaults
    /// (the limit starts at 20; the success path admits, samples and
    /// releases).
    pub fn adaptive_gradient2() -> Pipeline {
        builder("bench-adaptive-gradient2")
            .adaptive_limit(seawall::AdaptiveLimit::gradient2())
            .build()
            .expect("valid pipeline")
    }

    /// An adaptive concurrency limit alone: AIMD with its defaults.
    pub fn adaptive_aimd() -> Pipeline {
        builder("bench-adaptive-aimd")
            .adaptive_limit(seawall::AdaptiveLimit::aimd())
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

/// `n` concurrent identical calls, the coalescing scenario: every call
/// runs an operation that is pending once (as a call to a dependency is)
/// before it returns, so that the calls started in one poll of the batch
/// find the first one under way.
pub mod coalescing {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::task::{Context, Poll};

    use seawall::{Coalesce, MemoryStore, Pipeline};

    use super::{op, Oops};

    /// A pipeline that coalesces calls with the same key.
    pub fn pipeline() -> Pipeline {
        Pipeline::builder("bench-coalesce")
            .store(MemoryStore::new())
            .coalesce(Coalesce::new())
            .build()
            .expect("valid pipeline")
    }

    /// Pending once, then ready: the operation's wait for its dependency.
    struct PendingOnce(bool);

    impl Future for PendingOnce {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            if self.0 {
                return Poll::Ready(());
            }
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    type Call<'a> = Pin<Box<dyn Future<Output = bool> + 'a>>;

    /// Polls every call of a batch until all are done; counts the calls
    /// that got the operation's value.
    struct All<'a> {
        calls: Vec<Option<Call<'a>>>,
        ok: usize,
    }

    impl Future for All<'_> {
        type Output = usize;
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            let this = &mut *self;
            let mut pending = false;
            for slot in this.calls.iter_mut() {
                if let Some(call) = slot {
                    match call.as_mut().poll(cx) {
                        Poll::Ready(ok) => {
                            this.ok += usize::from(ok);
                            *slot = None;
                        }
                        Poll::Pending => pending = true,
                    }
                }
            }
            if pending {
                Poll::Pending
            } else {
                Poll::Ready(this.ok)
            }
        }
    }

    /// Makes `n` identical calls at once through `p`, coalesced (with the
    /// key 1) or plain, counting the operations run in `runs`; returns the
    /// calls that got the operation's value.
    pub async fn batch(p: &Pipeline, n: usize, coalesced: bool, runs: &AtomicU64) -> usize {
        let operation = move |_ctx: seawall::Context| async move {
            runs.fetch_add(1, Ordering::Relaxed);
            PendingOnce(false).await;
            op(1)
        };
        let calls: Vec<Option<Call<'_>>> = (0..n)
            .map(|_| {
                let call: Call<'_> = if coalesced {
                    Box::pin(
                        async move { matches!(p.coalesce_key(1u64).run(operation).await, Ok(1)) },
                    )
                } else {
                    Box::pin(async move {
                        matches!(p.run(operation).await, Ok::<_, seawall::Error<Oops>>(1))
                    })
                };
                Some(call)
            })
            .collect();
        All { calls, ok: 0 }.await
    }
}
