//! Calls one contender of the peer suite in a loop, for profilers.
//!
//! ```text
//! cargo bench -p seawall-bench --bench profile --no-run
//! valgrind --tool=callgrind target/release/deps/profile-<hash> breaker 100000
//! ```
//!
//! Instructions per call: run with `n` and `2n` calls and divide the
//! difference of the totals by `n` (setup cost cancels out). Without a known
//! contender name (as under `cargo bench`) it lists them and exits.

// `common` is shared with the other benches; not every item is used here.
#![allow(dead_code)]

use std::hint::black_box;

use seawall_bench::{op, pipelines};

mod common;
use common::*;

fn sync_loop(n: u64, call: impl Fn() -> bool) {
    for _ in 0..n {
        black_box(call());
    }
}

fn async_loop<C: AsyncCase>(rt: &tokio::runtime::Runtime, n: u64, mut case: C) {
    rt.block_on(async {
        for _ in 0..n {
            black_box(case.call().await);
        }
    });
}

fn seawall_call(p: seawall::Pipeline) -> impl Fn() -> bool {
    move || matches!(p.call(|_| op(black_box(1))), Ok(1))
}

const CONTENDERS: &[&str] = &[
    "retry",
    "retry-budget",
    "retry-budget-shared",
    "breaker",
    "consecutive",
    "open",
    "gcra",
    "gcra-weighted",
    "keyed",
    "fixed",
    "sliding",
    "bulkhead",
    "adaptive-aimd",
    "adaptive-gradient2",
    "full",
    "shadow-breaker",
    "shadow-open",
    "shadow-gcra",
    "gcra-over",
    "shadow-gcra-over",
    "async-retry",
    "async-breaker",
    "async-open",
    "async-gcra",
    "async-gcra-weighted",
    "async-bulkhead",
    "async-adaptive-aimd",
    "async-adaptive-gradient2",
    "async-timeout",
    "async-full",
    "backon",
    "recloser",
    "recloser-open",
    "failsafe-consecutive",
    "governor",
    "governor-keyed",
    "semaphore",
    "async-semaphore",
    "tower-resilience-adaptive",
    "tokio-timeout",
    "seatbelt-full",
    "coalesce-1",
    "coalesce-64",
    "plain-1",
    "plain-64",
    "async-hedging",
    "tower-hedge",
    "tower-resilience-hedge",
    "seatbelt-hedging",
    "breaker-retry",
    "retry-breaker",
];

/// `n` calls in batches of `size` identical calls made at once
/// (`seawall_bench::coalescing::batch`), coalesced or plain.
fn coalescing_loop(rt: &tokio::runtime::Runtime, n: u64, size: usize, coalesced: bool) {
    use std::sync::atomic::AtomicU64;
    let p = seawall_bench::coalescing::pipeline();
    let runs = AtomicU64::new(0);
    rt.block_on(async {
        for _ in 0..n / size as u64 {
            black_box(seawall_bench::coalescing::batch(&p, size, coalesced, &runs).await);
        }
    });
}

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let which = args.next().unwrap_or_default();
    let n: u64 = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("tokio runtime");
    match which.as_str() {
        "retry" => sync_loop(n, seawall_call(pipelines::retry())),
        "retry-budget" => sync_loop(n, seawall_call(pipelines::retry_budget())),
        "retry-budget-shared" => sync_loop(n, seawall_call(pipelines::retry_budget_shared())),
        "breaker" => sync_loop(n, seawall_call(pipelines::breaker())),
        "consecutive" => sync_loop(n, seawall_call(pipelines::consecutive_breaker())),
        "open" => sync_loop(n, seawall_call(pipelines::open_breaker())),
        "gcra" => sync_loop(n, seawall_call(pipelines::gcra())),
        "gcra-weighted" => {
            // Each call takes 4 permits of the same limiter as `gcra`.
            let p = pipelines::gcra();
            sync_loop(n, || {
                let weighted = p.weighted(4).expect("a weight of 4");
                matches!(weighted.call(|_| op(black_box(1))), Ok(1))
            })
        }
        "keyed" => {
            // One key of many (the peer table's keyed row).
            let p = pipelines::gcra();
            for k in 0..1_000u64 {
                let _ = p.partition(k).call(|_| op(1));
            }
            sync_loop(n, || {
                matches!(p.partition(7u64).call(|_| op(black_box(1))), Ok(1))
            })
        }
        "fixed" => sync_loop(n, seawall_call(pipelines::fixed_window())),
        "sliding" => sync_loop(n, seawall_call(pipelines::sliding_window())),
        "bulkhead" => sync_loop(n, seawall_call(pipelines::bulkhead())),
        "adaptive-aimd" => sync_loop(n, seawall_call(pipelines::adaptive_aimd())),
        "adaptive-gradient2" => sync_loop(n, seawall_call(pipelines::adaptive_gradient2())),
        "full" => {
            let p = pipelines::full_chain();
            sync_loop(n, || matches!(p.call(|_| op(black_box(1))), Ok(1)))
        }
        "shadow-breaker" => sync_loop(n, seawall_call(pipelines::shadow_breaker())),
        "shadow-open" => sync_loop(n, seawall_call(pipelines::shadow_open_breaker())),
        "shadow-gcra" => sync_loop(n, seawall_call(pipelines::shadow_gcra())),
        "gcra-over" => sync_loop(n, seawall_call(pipelines::gcra_over_the_limit(false))),
        "shadow-gcra-over" => sync_loop(n, seawall_call(pipelines::gcra_over_the_limit(true))),
        "async-retry" => async_loop(&rt, n, SeawallAsync(pipelines::retry())),
        "async-breaker" => async_loop(&rt, n, SeawallAsync(pipelines::breaker())),
        "async-open" => async_loop(&rt, n, SeawallAsync(pipelines::open_breaker())),
        "async-gcra" => async_loop(&rt, n, SeawallAsync(pipelines::gcra())),
        "async-gcra-weighted" => async_loop(&rt, n, SeawallWeighted(pipelines::gcra(), 4)),
        "async-bulkhead" => async_loop(&rt, n, SeawallAsync(pipelines::bulkhead())),
        "async-adaptive-aimd" => async_loop(&rt, n, SeawallAsync(pipelines::adaptive_aimd())),
        "async-adaptive-gradient2" => {
            async_loop(&rt, n, SeawallAsync(pipelines::adaptive_gradient2()))
        }
        "async-timeout" => async_loop(&rt, n, SeawallAsync(pipelines::timeout())),
        "async-full" => async_loop(&rt, n, SeawallAsync(pipelines::full_chain())),
        "backon" => sync_loop(n, backon_sync()),
        "recloser" => {
            let r = recloser();
            sync_loop(n, || recloser_call(&r))
        }
        "recloser-open" => {
            let r = recloser_open();
            sync_loop(n, || recloser_call(&r))
        }
        "failsafe-consecutive" => {
            let f = failsafe_consecutive();
            sync_loop(n, || failsafe_call(&*f))
        }
        "governor" => {
            let l = governor();
            sync_loop(n, || governor_check(&l))
        }
        "governor-keyed" => {
            let l = governor_keyed();
            for k in 0..1_000u64 {
                let _ = l.check_key(&k);
            }
            sync_loop(n, || l.check_key(&7).is_ok() && op(black_box(1)) == Ok(1))
        }
        "semaphore" => {
            let s = semaphore();
            sync_loop(n, || semaphore_call(&s))
        }
        "async-semaphore" => async_loop(&rt, n, semaphore_async()),
        "tower-resilience-adaptive" => async_loop(&rt, n, tower_resilience_adaptive()),
        "tokio-timeout" => async_loop(&rt, n, tokio_timeout()),
        "seatbelt-full" => async_loop(&rt, n, seatbelt_full_chain(&rt)),
        "coalesce-1" => coalescing_loop(&rt, n, 1, true),
        "coalesce-64" => coalescing_loop(&rt, n, 64, true),
        "plain-1" => coalescing_loop(&rt, n, 1, false),
        "plain-64" => coalescing_loop(&rt, n, 64, false),
        "async-hedging" => async_loop(&rt, n, SeawallAsync(pipelines::hedging())),
        "tower-hedge" => async_loop(&rt, n, tower_hedge()),
        "tower-resilience-hedge" => async_loop(&rt, n, tower_resilience_hedge()),
        "seatbelt-hedging" => async_loop(&rt, n, seatbelt_hedging(&rt)),
        "breaker-retry" => sync_loop(n, seawall_call(pipelines::breaker_before_retry())),
        "retry-breaker" => sync_loop(n, seawall_call(pipelines::breaker_after_retry())),
        _ => println!("usage: profile <contender> [calls]; contenders: {CONTENDERS:?}"),
    }
}
