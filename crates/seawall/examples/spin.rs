#![allow(missing_docs)]
//! Calls a pipeline in a loop (for profilers).
use seawall::*;
use std::hint::black_box;
use std::time::Duration;
fn main() {
    let which = std::env::args().nth(1).unwrap_or_default();
    let n: u64 = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let b = Pipeline::builder(format!("spin-{which}")).store(MemoryStore::new());
    let p = match which.as_str() {
        "rtf" => b
            .retry(Retry::exponential(Duration::from_millis(10)))
            .timeout(Duration::from_secs(1))
            .build(),
        "full" => b
            .retry(Retry::exponential(Duration::from_millis(10)))
            .circuit_breaker(CircuitBreaker::failure_rate(0.5))
            .timeout(Duration::from_secs(1))
            .bulkhead(Bulkhead::new(64))
            .rate_limiter(RateLimiter::gcra(1_000_000_000, Duration::from_secs(1)).burst(1_000_000))
            .build(),
        _ => b.build(),
    }
    .unwrap();
    let mut s = 0u64;
    for i in 0..n {
        s += p.call(|_| Ok::<_, ()>(black_box(i))).unwrap();
    }
    println!("{s}");
}
