//! What `MemoryStore` allocates: nothing on the admit/record path of an
//! unpartitioned resource (transitions included), nothing on a partition
//! after its first use, and under 200 bytes per idle partition key.
//!
//! The counting allocator delegates to the system allocator; it counts per
//! thread, so tests running in parallel do not disturb each other.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use seawall::breaker::CircuitControl;
use seawall::store::{AdmitRequest, Outcome, Record, ResourceSpec, ResourceState};
use seawall::{
    Bulkhead, CircuitBreaker, Cooldown, MemoryStore, PartitionKey, RateLimiter, StateStore,
};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    /// Bytes requested minus bytes freed.
    static LIVE_BYTES: Cell<i64> = const { Cell::new(0) };
    /// The same, counted in glibc malloc chunks (`size + 8` rounded up to
    /// 16, at least 32): what the heap really gives.
    static LIVE_CHUNK_BYTES: Cell<i64> = const { Cell::new(0) };
}

fn chunk(size: usize) -> i64 {
    ((size + 8).div_ceil(16) * 16).max(32) as i64
}

fn count(allocated: usize, freed: usize) {
    // `try_with`: the allocator may run while thread-locals are torn down.
    let _ = LIVE_BYTES.try_with(|b| b.set(b.get() + allocated as i64 - freed as i64));
    let _ = LIVE_CHUNK_BYTES.try_with(|b| {
        let plus = if allocated > 0 { chunk(allocated) } else { 0 };
        let minus = if freed > 0 { chunk(freed) } else { 0 };
        b.set(b.get() + plus - minus)
    });
}

// SAFETY: every method delegates to the system allocator with the caller's
// arguments unchanged; the counters are plain thread-locals.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        count(layout.size(), 0);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(0, layout.size());
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        count(new_size, layout.size());
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

fn specs() -> Vec<ResourceSpec> {
    let breakers = [
        CircuitBreaker::consecutive_failures(3).cooldown(Duration::from_millis(50)),
        CircuitBreaker::failure_rate(0.5)
            .count_window(20)
            .minimum_calls(5)
            .slow_calls(0.5, Duration::from_millis(5))
            .cooldown(Duration::from_millis(50)),
        CircuitBreaker::failure_rate(0.5)
            .window(Duration::from_secs(5))
            .minimum_calls(5)
            .slow_calls(0.5, Duration::from_millis(5))
            .cooldown(Duration::from_millis(50))
            .cooldown_growth(2.0, Duration::from_secs(1))
            .half_open_calls(2),
    ];
    let limiters = [
        RateLimiter::gcra(1000, Duration::from_secs(1)),
        RateLimiter::fixed_window(1000, Duration::from_secs(1)),
        RateLimiter::sliding_window(1000, Duration::from_secs(1)),
    ];
    let mut specs = Vec::new();
    for (i, breaker) in breakers.iter().enumerate() {
        for (j, limiter) in limiters.iter().enumerate() {
            specs.push(
                ResourceSpec::new(format!("alloc-{i}-{j}"))
                    .with_circuit(breaker.clone())
                    .with_bulkhead(Bulkhead::new(4))
                    .with_cooldown(Cooldown::new().max_pause(Duration::from_millis(20)))
                    .with_rate_limit(limiter.clone()),
            );
        }
    }
    specs
}

/// Runs `rounds` admit/record rounds through every outcome, slow calls,
/// retry-after hints, releases, metrics and controls, so that the circuit
/// opens, half-opens and closes many times.
/// Returns how many transitions the store reported (every kind counts).
fn exercise(
    state: &dyn ResourceState,
    key: Option<&PartitionKey>,
    start: Duration,
    rounds: u64,
) -> u32 {
    let mut transitions = 0;
    for i in 0..rounds {
        let now = start + Duration::from_millis(3 * i);
        let admission = state
            .admit(&AdmitRequest {
                partition: key,
                now,
                weight: 1,
                budget: None,
                shadowed: false,
            })
            .unwrap();
        transitions += u32::from(admission.transition.is_some());
        if let Ok(permit) = admission.decision {
            if i % 13 == 0 {
                state.release(key, permit);
                continue;
            }
            let outcome = match i % 10 {
                0..=3 => Outcome::Failure,
                4 => Outcome::Ignored,
                _ => Outcome::Success,
            };
            let recorded = state
                .record(&Record {
                    partition: key,
                    permit,
                    outcome,
                    duration: Duration::from_millis(i % 8),
                    retry_after: (i % 97 == 0).then_some(Duration::from_millis(5)),
                    now,
                })
                .unwrap();
            transitions += u32::from(recorded.transition.is_some());
        }
        if i % 50 == 0 {
            state.circuit_metrics(key, now).unwrap();
            state.in_flight(key, now).unwrap();
        }
        if i % 500 == 499 {
            state
                .control_circuit(key, CircuitControl::Isolate, now)
                .unwrap();
            state
                .control_circuit(key, CircuitControl::ForceClose, now)
                .unwrap();
            state
                .control_circuit(key, CircuitControl::Reset, now)
                .unwrap();
        }
    }
    transitions
}

#[test]
fn admit_and_record_on_the_root_allocate_nothing() {
    let store = MemoryStore::new();
    for spec in specs() {
        let state = store.bind(&spec).unwrap();
        let before = allocations();
        let transitions = exercise(&*state, None, Duration::from_secs(1), 5_000);
        assert_eq!(allocations() - before, 0, "{}", spec.name);
        assert!(
            transitions > 100,
            "{}: the circuit moved {transitions} times",
            spec.name
        );
    }
}

#[test]
fn a_partition_allocates_only_on_first_use() {
    let store = MemoryStore::new();
    for spec in specs() {
        let state = store.bind(&spec).unwrap();
        let keys = [
            PartitionKey::from(42u64),
            PartitionKey::from("static-tenant"),
            PartitionKey::from(String::from("shared-tenant")),
        ];
        // A sliding log grows with use up to its working size (here about
        // 330 entries: one admission every 3 ms, a period of 1 s); the other
        // states are complete from the first use.
        let sliding = spec.rate_limit.as_ref().map(|r| r.algorithm)
            == Some(seawall::rate_limit::RateAlgorithm::SlidingWindow);
        let warm_up = if sliding { 2_000 } else { 1 };
        for key in &keys {
            // First use: the key's cells (and the shard table) are allocated.
            exercise(&*state, Some(key), Duration::ZERO, warm_up);
            let before = allocations();
            exercise(&*state, Some(key), Duration::from_secs(10), 2_000);
            assert_eq!(allocations() - before, 0, "{} {key:?}", spec.name);
        }
    }
}

/// Measures the heap held per idle partition key, for a consecutive-failures
/// breaker, a bulkhead, a cooldown and a GCRA limiter: 10,000 integer keys
/// (which own no heap memory themselves), each admitted and recorded once.
/// The figure includes the cells, the map's slots at the load it happens to
/// have, and the one-off shard array, and is checked both in bytes requested
/// and in glibc malloc chunks.
#[test]
fn an_idle_partition_key_costs_under_200_bytes() {
    const KEYS: u64 = 10_000;
    let store = MemoryStore::new();
    let state = store
        .bind(
            &ResourceSpec::new("bytes-per-key")
                .with_circuit(CircuitBreaker::consecutive_failures(5))
                .with_bulkhead(Bulkhead::new(10))
                .with_cooldown(Cooldown::new())
                .with_rate_limit(RateLimiter::gcra(100, Duration::from_secs(1))),
        )
        .unwrap();
    let live = || (LIVE_BYTES.with(Cell::get), LIVE_CHUNK_BYTES.with(Cell::get));
    let (bytes_before, chunks_before) = live();
    for k in 0..KEYS {
        let key = PartitionKey::from(k);
        exercise(&*state, Some(&key), Duration::ZERO, 1);
    }
    let (bytes_after, chunks_after) = live();
    assert_eq!(state.partitions(), KEYS as usize);
    let per_key = (bytes_after - bytes_before) as f64 / KEYS as f64;
    let per_key_chunks = (chunks_after - chunks_before) as f64 / KEYS as f64;
    println!("idle key: {per_key:.1} bytes requested, {per_key_chunks:.1} bytes in malloc chunks");
    assert!(per_key > 64.0, "the cells alone take 64 bytes: {per_key}");
    assert!(
        per_key_chunks < 200.0,
        "{per_key_chunks} bytes per idle key"
    );

    // Evicting them gives the memory back (the table keeps its capacity).
    assert_eq!(state.evict_idle(Duration::from_secs(3600)), KEYS as usize);
    assert_eq!(state.partitions(), 0);
}
