//! Seawall against the crates users would pick instead, scenario by
//! scenario, at 1 and 2 threads on one shared policy.
//!
//! Each criterion group is a scenario; each function in it a contender
//! (`seawall` and the peers); the parameter is the number of threads. With
//! 2 threads each thread makes `iters` calls on the shared state after a
//! barrier, and the time reported is the wall time divided by `iters`: the
//! time per call per thread.
//!
//! Sync contenders are called in a plain loop; async ones inside one
//! `block_on` of a current-thread runtime per thread.
//!
//! `cargo bench -p seawall-bench --bench peers`, or `scripts/bench.sh` for
//! the summary table.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion};
use seawall_bench::{op, pipelines, run_parallel};

mod common;
use common::*;

/// The thread counts every contender runs at.
const THREADS: [usize; 2] = [1, 2];

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("tokio runtime")
}

/// Benchmarks a sync contender: `call` makes one call.
fn sync_case<F>(g: &mut BenchmarkGroup<'_, WallTime>, name: &str, call: F)
where
    F: Fn() -> bool + Clone + Send + Sync,
{
    for threads in THREADS {
        let mut states: Vec<F> = (0..threads).map(|_| call.clone()).collect();
        g.bench_function(BenchmarkId::new(name, threads), |b| {
            b.iter_custom(|iters| {
                run_parallel(&mut states, iters, |call, n| {
                    for _ in 0..n {
                        black_box(call());
                    }
                })
            })
        });
    }
}

/// Benchmarks an async contender: each thread runs its loop inside one
/// `block_on` of its own current-thread runtime.
fn async_case<C: AsyncCase>(g: &mut BenchmarkGroup<'_, WallTime>, name: &str, case: C) {
    for threads in THREADS {
        let mut states: Vec<(tokio::runtime::Runtime, C)> =
            (0..threads).map(|_| (runtime(), case.clone())).collect();
        g.bench_function(BenchmarkId::new(name, threads), |b| {
            b.iter_custom(|iters| {
                run_parallel(&mut states, iters, |(rt, case), n| {
                    rt.block_on(async {
                        for _ in 0..n {
                            black_box(case.call().await);
                        }
                    })
                })
            })
        });
    }
}

/// A seawall pipeline called with `call`.
fn seawall_sync(p: seawall::Pipeline) -> impl Fn() -> bool + Clone + Send + Sync {
    move || matches!(p.call(|_| op(black_box(1))), Ok(1))
}

fn retry(c: &mut Criterion) {
    let mut g = c.benchmark_group("retry, success (sync)");
    sync_case(&mut g, "seawall", seawall_sync(pipelines::retry()));
    sync_case(&mut g, "backon", backon_sync());
    g.finish();

    let rt = runtime();
    let mut g = c.benchmark_group("retry, success (async)");
    async_case(&mut g, "seawall", SeawallAsync(pipelines::retry()));
    async_case(&mut g, "backon", backon_async());
    async_case(&mut g, "tower", tower_retry());
    async_case(&mut g, "tower-resilience", tower_resilience_retry());
    async_case(&mut g, "seatbelt", seatbelt_retry(&rt));
    g.finish();
}

fn breaker(c: &mut Criterion) {
    let rt = runtime();

    let mut g = c.benchmark_group("breaker closed, count window (sync)");
    sync_case(&mut g, "seawall", seawall_sync(pipelines::breaker()));
    let r = recloser();
    sync_case(&mut g, "recloser", move || recloser_call(&r));
    let f = failsafe();
    sync_case(&mut g, "failsafe", move || failsafe_call(&*f));
    g.finish();

    let mut g = c.benchmark_group("breaker closed, count window (async)");
    async_case(&mut g, "seawall", SeawallAsync(pipelines::breaker()));
    async_case(&mut g, "tower-resilience", tower_resilience_breaker());
    async_case(&mut g, "seatbelt", seatbelt_breaker(&rt));
    g.finish();

    let mut g = c.benchmark_group("breaker closed, consecutive failures (sync)");
    sync_case(
        &mut g,
        "seawall",
        seawall_sync(pipelines::consecutive_breaker()),
    );
    let f = failsafe_consecutive();
    sync_case(&mut g, "failsafe", move || failsafe_call(&*f));
    g.finish();

    let mut g = c.benchmark_group("breaker closed, consecutive failures (async)");
    async_case(
        &mut g,
        "seawall",
        SeawallAsync(pipelines::consecutive_breaker()),
    );
    async_case(&mut g, "tower-resilience", tower_resilience_consecutive());
    g.finish();

    let mut g = c.benchmark_group("breaker open, rejecting (sync)");
    sync_case(&mut g, "seawall", seawall_sync(pipelines::open_breaker()));
    let r = recloser_open();
    sync_case(&mut g, "recloser", move || recloser_call(&r));
    let f = failsafe_open();
    sync_case(&mut g, "failsafe", move || failsafe_call(&*f));
    g.finish();

    let mut g = c.benchmark_group("breaker open, rejecting (async)");
    async_case(&mut g, "seawall", SeawallAsync(pipelines::open_breaker()));
    async_case(&mut g, "tower-resilience", tower_resilience_open(&rt));
    async_case(&mut g, "seatbelt", seatbelt_open(&rt));
    g.finish();
}

fn rate_limiter(c: &mut Criterion) {
    let mut g = c.benchmark_group("rate limiter, GCRA (sync)");
    sync_case(&mut g, "seawall", seawall_sync(pipelines::gcra()));
    let l = governor();
    sync_case(&mut g, "governor", move || governor_check(&l));
    g.finish();

    // One key of a keyed limiter: a partition of a seawall pipeline.
    let mut g = c.benchmark_group("rate limiter, GCRA, one key of many (sync)");
    let p = pipelines::gcra();
    for k in 0..1_000u64 {
        let _ = p.partition(k).call(|_| op(1));
    }
    sync_case(&mut g, "seawall", move || {
        matches!(p.partition(7u64).call(|_| op(black_box(1))), Ok(1))
    });
    let l = governor_keyed();
    for k in 0..1_000u64 {
        let _ = l.check_key(&k);
    }
    sync_case(&mut g, "governor", move || {
        l.check_key(&7).is_ok() && op(black_box(1)) == Ok(1)
    });
    g.finish();

    // A weighted call (4 permits) takes the same path as an unweighted
    // one: the weight goes to the same admission.
    let mut g = c.benchmark_group("weighted GCRA admission vs unweighted (sync)");
    sync_case(&mut g, "unweighted", seawall_sync(pipelines::gcra()));
    let p = pipelines::gcra();
    sync_case(&mut g, "weight 4", move || {
        let weighted = p.weighted(4).expect("a weight of 4");
        matches!(weighted.call(|_| op(black_box(1))), Ok(1))
    });
    g.finish();

    let mut g = c.benchmark_group("weighted GCRA admission vs unweighted (async)");
    async_case(&mut g, "unweighted", SeawallAsync(pipelines::gcra()));
    async_case(&mut g, "weight 4", SeawallWeighted(pipelines::gcra(), 4));
    g.finish();

    let mut g = c.benchmark_group("rate limiter, GCRA (async)");
    async_case(&mut g, "seawall", SeawallAsync(pipelines::gcra()));
    async_case(&mut g, "tower-resilience", tower_resilience_token_bucket());
    g.finish();

    let mut g = c.benchmark_group("rate limiter, fixed window (async)");
    async_case(&mut g, "seawall", SeawallAsync(pipelines::fixed_window()));
    async_case(&mut g, "tower-resilience", tower_resilience_fixed_window());
    g.finish();

    let mut g = c.benchmark_group("rate limiter, sliding window (async)");
    async_case(&mut g, "seawall", SeawallAsync(pipelines::sliding_window()));
    async_case(&mut g, "tower-resilience", tower_resilience_sliding_log());
    g.finish();
}

fn bulkhead(c: &mut Criterion) {
    let mut g = c.benchmark_group("bulkhead (sync)");
    sync_case(&mut g, "seawall", seawall_sync(pipelines::bulkhead()));
    let s = semaphore();
    sync_case(&mut g, "tokio Semaphore", move || semaphore_call(&s));
    g.finish();

    let mut g = c.benchmark_group("bulkhead (async)");
    async_case(&mut g, "seawall", SeawallAsync(pipelines::bulkhead()));
    async_case(&mut g, "tokio Semaphore", semaphore_async());
    async_case(&mut g, "tower-resilience", tower_resilience_bulkhead());
    g.finish();
}

/// The success path of an adaptive concurrency limit: admit, sample,
/// release. The peers: tower-resilience's adaptive limiter (AIMD) and a
/// plain tokio `Semaphore` (a fixed limit, nothing measured); as a floor
/// for a limit that measures latency, the semaphore with the two clock
/// readings such a limit needs (`semaphore_timed_call`).
fn adaptive(c: &mut Criterion) {
    for (algorithm, pipeline) in [
        (
            "aimd",
            pipelines::adaptive_aimd as fn() -> seawall::Pipeline,
        ),
        ("gradient2", pipelines::adaptive_gradient2),
    ] {
        let mut g = c.benchmark_group(format!("adaptive limit, {algorithm} (sync)"));
        sync_case(&mut g, "seawall", seawall_sync(pipeline()));
        let s = semaphore();
        sync_case(&mut g, "tokio Semaphore", move || semaphore_call(&s));
        let (s, clock) = (semaphore(), quanta::Clock::new());
        sync_case(&mut g, "tokio Semaphore + 2 clock readings", move || {
            semaphore_timed_call(&s, &clock)
        });
        g.finish();

        let mut g = c.benchmark_group(format!("adaptive limit, {algorithm} (async)"));
        async_case(&mut g, "seawall", SeawallAsync(pipeline()));
        async_case(&mut g, "tokio Semaphore", semaphore_async());
        async_case(
            &mut g,
            "tokio Semaphore + 2 clock readings",
            semaphore_timed_async(),
        );
        async_case(
            &mut g,
            "tower-resilience (aimd)",
            tower_resilience_adaptive(),
        );
        g.finish();
    }
}

fn timeout(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("timeout (async)");
    async_case(&mut g, "seawall", SeawallAsync(pipelines::timeout()));
    async_case(&mut g, "tokio::time::timeout", tokio_timeout());
    async_case(&mut g, "tower", tower_timeout());
    async_case(&mut g, "tower-resilience", tower_resilience_time_limiter());
    async_case(&mut g, "seatbelt", seatbelt_timeout(&rt));
    g.finish();
}

fn full_chain(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("full chain (async)");
    async_case(&mut g, "seawall", SeawallAsync(pipelines::full_chain()));
    async_case(&mut g, "tower-resilience", tower_resilience_full_chain());
    async_case(&mut g, "seatbelt", seatbelt_full_chain(&rt));
    g.finish();

    let mut g = c.benchmark_group("full chain (sync)");
    let p = pipelines::full_chain();
    sync_case(&mut g, "seawall", move || {
        matches!(p.call(|_| op(black_box(1))), Ok(1))
    });
    let chain = AssembledSyncChain::new();
    sync_case(&mut g, "backon+recloser+governor+Semaphore", move || {
        chain.call()
    });
    g.finish();
}

/// The cost of a chaos policy that is switched off, against the same
/// pipeline without chaos (a policy switched off costs one relaxed load at
/// the start of a call, which then takes the same path as without chaos).
fn chaos(c: &mut Criterion) {
    let mut g = c.benchmark_group("chaos disabled vs no chaos (sync)");
    sync_case(&mut g, "no chaos", seawall_sync(pipelines::retry()));
    let disabled = seawall::Pipeline::builder("bench-chaos-disabled")
        .store(seawall::MemoryStore::new())
        .retry(pipelines::retry_policy())
        .chaos(
            seawall::Chaos::latency(0.5, Duration::from_millis(1))
                .enabled(seawall::ChaosSwitch::new(false)),
        )
        .build()
        .expect("valid pipeline");
    sync_case(&mut g, "chaos disabled", seawall_sync(disabled));
    g.finish();
}

/// Shadow mode (`seawall::shadow`) against enforcing, for a breaker and a
/// rate limiter: a call the policy admits takes the same path either way
/// (closed, under the limit); a call it would refuse is admitted in shadow
/// mode (and its operation runs) instead of being refused.
fn shadow(c: &mut Criterion) {
    let mut g = c.benchmark_group("breaker in shadow mode vs enforcing, closed (sync)");
    sync_case(&mut g, "shadow", seawall_sync(pipelines::shadow_breaker()));
    sync_case(&mut g, "enforcing", seawall_sync(pipelines::breaker()));
    g.finish();

    let mut g = c.benchmark_group("breaker in shadow mode vs enforcing, open (sync)");
    sync_case(
        &mut g,
        "shadow (admitted)",
        seawall_sync(pipelines::shadow_open_breaker()),
    );
    let open = pipelines::open_breaker();
    sync_case(&mut g, "enforcing (refused)", move || {
        open.call(|_| op(black_box(1))).is_err()
    });
    g.finish();

    let mut g = c.benchmark_group("GCRA in shadow mode vs enforcing, under the limit (sync)");
    sync_case(&mut g, "shadow", seawall_sync(pipelines::shadow_gcra()));
    sync_case(&mut g, "enforcing", seawall_sync(pipelines::gcra()));
    g.finish();

    let mut g = c.benchmark_group("GCRA in shadow mode vs enforcing, over the limit (sync)");
    sync_case(
        &mut g,
        "shadow (admitted)",
        seawall_sync(pipelines::gcra_over_the_limit(true)),
    );
    let over = pipelines::gcra_over_the_limit(false);
    sync_case(&mut g, "enforcing (refused)", move || {
        over.call(|_| op(black_box(1))).is_err()
    });
    g.finish();
}

/// Coalescing: `n` identical calls made at once (the parameter is the
/// number of calls, not of threads), each running an operation that is
/// pending once; the time is per call. Coalesced, the batch runs the
/// operation once; plain, `n` times (the memory bench reports the
/// operations run per call).
fn coalescing(c: &mut Criterion) {
    use seawall_bench::coalescing::{batch, pipeline};
    use std::sync::atomic::AtomicU64;
    let mut g = c.benchmark_group(
        "coalescing, N concurrent identical calls, N in the threads column (async)",
    );
    let rt = runtime();
    let p = pipeline();
    let runs = AtomicU64::new(0);
    for n in [1usize, 64] {
        for (name, coalesced) in [("seawall", true), ("seawall, not coalesced", false)] {
            g.bench_function(BenchmarkId::new(name, n), |b| {
                b.iter_custom(|iters| {
                    let start = std::time::Instant::now();
                    rt.block_on(async {
                        for _ in 0..iters {
                            black_box(batch(&p, n, coalesced, &runs).await);
                        }
                    });
                    start.elapsed() / n as u32
                })
            });
        }
    }
    g.finish();
}

/// Hedging's success path: the operation answers at once, so no hedge
/// fires (latency mode, one hedge after 100 ms, or tower's percentile).
fn hedging(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("hedging, success, no hedge fired (async)");
    async_case(&mut g, "seawall", SeawallAsync(pipelines::hedging()));
    async_case(&mut g, "tower", tower_hedge());
    async_case(&mut g, "tower-resilience", tower_resilience_hedge());
    async_case(&mut g, "seatbelt", seatbelt_hedging(&rt));
    g.finish();
}

/// A count-window breaker declared before the retry (it guards the whole
/// call) against the same breaker after it (each attempt), on the success
/// path.
fn breaker_order(c: &mut Criterion) {
    let mut g = c.benchmark_group("breaker before the retry vs after it (sync)");
    sync_case(
        &mut g,
        "breaker, retry",
        seawall_sync(pipelines::breaker_before_retry()),
    );
    sync_case(
        &mut g,
        "retry, breaker",
        seawall_sync(pipelines::breaker_after_retry()),
    );
    g.finish();

    let mut g = c.benchmark_group("breaker before the retry vs after it (async)");
    async_case(
        &mut g,
        "breaker, retry",
        SeawallAsync(pipelines::breaker_before_retry()),
    );
    async_case(
        &mut g,
        "retry, breaker",
        SeawallAsync(pipelines::breaker_after_retry()),
    );
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_millis(1500))
        .sample_size(40)
}

criterion_group! {
    name = peers;
    config = config();
    targets = retry, breaker, rate_limiter, bulkhead, adaptive, timeout, full_chain, chaos, shadow, coalescing, hedging, breaker_order
}
criterion_main!(peers);
