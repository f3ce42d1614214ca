//! What a pipeline costs on the success path, sync and async.
//!
//! `cargo bench -p seawall --bench overhead`
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use seawall::pipeline::WithFallback;
use seawall::*;

#[derive(Debug)]
struct Oops;

fn op(x: u64) -> Result<u64, Oops> {
    Ok(black_box(x))
}

fn stateless() -> Vec<(&'static str, Pipeline<WithFallback<u64, Oops>>)> {
    vec![
        (
            "empty pipeline",
            Pipeline::builder("bench-empty")
                .fallback_sync(|_, _| Ok(0))
                .build()
                .unwrap(),
        ),
        (
            "retry+timeout+fallback",
            Pipeline::builder("bench-rtf")
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
            Pipeline::builder("bench-full")
                .store(MemoryStore::new())
                .retry(
                    Retry::exponential(Duration::from_millis(10))
                        .max_attempts(3)
                        .jitter(Jitter::Full),
                )
                .circuit_breaker(CircuitBreaker::failure_rate(0.5))
                .timeout(Duration::from_secs(1))
                .bulkhead(Bulkhead::new(64))
                .rate_limiter(
                    RateLimiter::gcra(1_000_000_000, Duration::from_secs(1)).burst(1_000_000),
                )
                .fallback_sync(|_, _| Ok(0))
                .build()
                .unwrap(),
        ),
    ]
}

fn sync_path(c: &mut Criterion) {
    let mut g = c.benchmark_group("sync");
    g.bench_function("bare call", |b| b.iter(|| op(black_box(1))));
    for (name, p) in stateless() {
        g.bench_function(name, |b| b.iter(|| p.call(|_| op(black_box(1)))));
    }
    g.finish();
}

fn async_path(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("async");
    g.bench_function("bare call", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(async { op(black_box(1)) }.await.ok());
                }
                start.elapsed()
            })
        })
    });
    for (name, p) in stateless() {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        black_box(p.run(|_| async { op(black_box(1)) }).await.ok());
                    }
                    start.elapsed()
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, sync_path, async_path);
criterion_main!(benches);
