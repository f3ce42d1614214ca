//! What seawall and its peers allocate: heap allocations per call on the
//! success path of every scenario, bytes held per built pipeline (or
//! equivalent stack), and bytes held per idle partition key over one
//! million keys.
//!
//! A counting global allocator delegates to the system allocator and counts
//! per thread: allocations, and live bytes in glibc malloc chunks (`size + 8`
//! rounded up to 16, at least 32), which is what the heap really hands out.
//!
//! Prints one line per figure; with `SEAWALL_BENCH_MEMORY_OUT=path` also
//! writes them as JSON for `scripts/bench.sh`.
//!
//! `cargo bench -p seawall-bench --bench memory`
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;
use std::num::NonZeroU32;

use seawall::MemoryStore;
use seawall_bench::{op, pipelines};

mod common;
use common::*;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    static LIVE_CHUNK_BYTES: Cell<i64> = const { Cell::new(0) };
}

fn chunk(size: usize) -> i64 {
    ((size + 8).div_ceil(16) * 16).max(32) as i64
}

fn count(allocated: Option<usize>, freed: Option<usize>) {
    // `try_with`: the allocator may run while thread-locals are torn down.
    let _ = LIVE_CHUNK_BYTES
        .try_with(|b| b.set(b.get() + allocated.map_or(0, chunk) - freed.map_or(0, chunk)));
}

// SAFETY: every method delegates to the system allocator with the caller's
// arguments unchanged; the counters are plain thread-locals and never
// allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        count(Some(layout.size()), None);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        count(Some(layout.size()), None);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(None, Some(layout.size()));
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        count(Some(new_size), Some(layout.size()));
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

fn live_bytes() -> i64 {
    LIVE_CHUNK_BYTES.with(Cell::get)
}

/// Calls measured per contender, after as many for warming up.
const CALLS: u64 = 10_000;

/// One figure of the report.
struct Figure {
    scenario: String,
    contender: String,
    value: f64,
    unit: &'static str,
}

#[derive(Default)]
struct Report(Vec<Figure>);

impl Report {
    fn add(&mut self, scenario: &str, contender: &str, value: f64, unit: &'static str) {
        println!("{scenario:<55} {contender:<36} {value:>10.1} {unit}");
        self.0.push(Figure {
            scenario: scenario.into(),
            contender: contender.into(),
            value,
            unit,
        });
    }

    fn json(&self) -> String {
        let rows: Vec<String> = self
            .0
            .iter()
            .map(|f| {
                format!(
                    "  {{\"scenario\": {:?}, \"contender\": {:?}, \"value\": {}, \"unit\": {:?}}}",
                    f.scenario, f.contender, f.value, f.unit
                )
            })
            .collect();
        format!("[\n{}\n]\n", rows.join(",\n"))
    }
}

/// Allocations per call of a sync contender.
fn sync_allocs(call: impl Fn()) -> f64 {
    for _ in 0..CALLS {
        call();
    }
    let before = allocations();
    for _ in 0..CALLS {
        call();
    }
    (allocations() - before) as f64 / CALLS as f64
}

/// Allocations per call of an async contender, in one `block_on`.
fn async_allocs<C: AsyncCase>(rt: &tokio::runtime::Runtime, mut case: C) -> f64 {
    rt.block_on(async {
        for _ in 0..CALLS {
            case.call().await;
        }
        let before = allocations();
        for _ in 0..CALLS {
            case.call().await;
        }
        (allocations() - before) as f64 / CALLS as f64
    })
}

fn seawall_call(p: seawall::Pipeline) -> impl Fn() {
    move || {
        black_box(p.call(|_| op(black_box(1))).is_ok());
    }
}

fn allocations_per_call(r: &mut Report, rt: &tokio::runtime::Runtime) {
    const UNIT: &str = "allocs/call";
    let s = "allocations per call: retry, success (sync)";
    r.add(
        s,
        "seawall",
        sync_allocs(seawall_call(pipelines::retry())),
        UNIT,
    );
    r.add(s, "backon", sync_allocs(backon_sync()), UNIT);

    let s = "allocations per call: retry, success (async)";
    r.add(
        s,
        "seawall",
        async_allocs(rt, SeawallAsync(pipelines::retry())),
        UNIT,
    );
    r.add(s, "backon", async_allocs(rt, backon_async()), UNIT);
    r.add(s, "tower", async_allocs(rt, tower_retry()), UNIT);
    r.add(
        s,
        "tower-resilience",
        async_allocs(rt, tower_resilience_retry()),
        UNIT,
    );
    r.add(s, "seatbelt", async_allocs(rt, seatbelt_retry(rt)), UNIT);

    let s = "allocations per call: breaker closed (sync)";
    r.add(
        s,
        "seawall",
        sync_allocs(seawall_call(pipelines::breaker())),
        UNIT,
    );
    let rc = recloser();
    r.add(s, "recloser", sync_allocs(|| recloser_call(&rc)), UNIT);
    let fs = failsafe();
    r.add(s, "failsafe", sync_allocs(|| failsafe_call(&*fs)), UNIT);

    let s = "allocations per call: breaker closed (async)";
    r.add(
        s,
        "seawall",
        async_allocs(rt, SeawallAsync(pipelines::breaker())),
        UNIT,
    );
    r.add(
        s,
        "tower-resilience",
        async_allocs(rt, tower_resilience_breaker()),
        UNIT,
    );
    r.add(s, "seatbelt", async_allocs(rt, seatbelt_breaker(rt)), UNIT);

    let s = "allocations per call: breaker open (sync)";
    r.add(
        s,
        "seawall",
        sync_allocs(seawall_call(pipelines::open_breaker())),
        UNIT,
    );
    let rc = recloser_open();
    r.add(s, "recloser", sync_allocs(|| recloser_call(&rc)), UNIT);
    let fs = failsafe_open();
    r.add(s, "failsafe", sync_allocs(|| failsafe_call(&*fs)), UNIT);

    let s = "allocations per call: breaker open (async)";
    r.add(
        s,
        "seawall",
        async_allocs(rt, SeawallAsync(pipelines::open_breaker())),
        UNIT,
    );
    r.add(
        s,
        "tower-resilience",
        async_allocs(rt, tower_resilience_open(rt)),
        UNIT,
    );
    r.add(s, "seatbelt", async_allocs(rt, seatbelt_open(rt)), UNIT);

    let s = "allocations per call: rate limiter, GCRA (sync)";
    r.add(
        s,
        "seawall",
        sync_allocs(seawall_call(pipelines::gcra())),
        UNIT,
    );
    let gv = governor();
    r.add(s, "governor", sync_allocs(|| governor_check(&gv)), UNIT);

    let s = "allocations per call: rate limiter, sliding window (async)";
    r.add(
        s,
        "seawall",
        async_allocs(rt, SeawallAsync(pipelines::sliding_window())),
        UNIT,
    );
    r.add(
        s,
        "tower-resilience",
        async_allocs(rt, tower_resilience_sliding_log()),
        UNIT,
    );

    let s = "allocations per call: bulkhead (async)";
    r.add(
        s,
        "seawall",
        async_allocs(rt, SeawallAsync(pipelines::bulkhead())),
        UNIT,
    );
    r.add(
        s,
        "tokio Semaphore",
        async_allocs(rt, semaphore_async()),
        UNIT,
    );
    r.add(
        s,
        "tower-resilience",
        async_allocs(rt, tower_resilience_bulkhead()),
        UNIT,
    );

    let s = "allocations per call: timeout (async)";
    r.add(
        s,
        "seawall",
        async_allocs(rt, SeawallAsync(pipelines::timeout())),
        UNIT,
    );
    r.add(
        s,
        "tokio::time::timeout",
        async_allocs(rt, tokio_timeout()),
        UNIT,
    );
    r.add(s, "tower", async_allocs(rt, tower_timeout()), UNIT);
    r.add(
        s,
        "tower-resilience",
        async_allocs(rt, tower_resilience_time_limiter()),
        UNIT,
    );
    r.add(s, "seatbelt", async_allocs(rt, seatbelt_timeout(rt)), UNIT);

    let s = "allocations per call: full chain (async)";
    r.add(
        s,
        "seawall",
        async_allocs(rt, SeawallAsync(pipelines::full_chain())),
        UNIT,
    );
    r.add(
        s,
        "tower-resilience",
        async_allocs(rt, tower_resilience_full_chain()),
        UNIT,
    );
    r.add(
        s,
        "seatbelt",
        async_allocs(rt, seatbelt_full_chain(rt)),
        UNIT,
    );

    let s = "allocations per call: full chain (sync)";
    let p = pipelines::full_chain();
    r.add(
        s,
        "seawall",
        sync_allocs(|| {
            black_box(p.call(|_| op(black_box(1))).is_ok());
        }),
        UNIT,
    );
    let chain = AssembledSyncChain::new();
    r.add(
        s,
        "backon+recloser+governor+Semaphore",
        sync_allocs(|| chain.call()),
        UNIT,
    );
}

/// Live bytes per value built by `build`, over `n` of them kept alive.
fn bytes_per<T>(n: usize, mut build: impl FnMut(usize) -> T) -> f64 {
    // Warm up: lazily initialised statics (the global store, interned
    // names, runtime handles).
    drop(build(usize::MAX));
    let before = live_bytes();
    let kept: Vec<T> = (0..n).map(&mut build).collect();
    let after = live_bytes();
    let per = (after - before) as f64 / n as f64;
    // The Vec holding them is not part of a value.
    let vec_bytes = chunk(std::mem::size_of::<T>() * n) as f64 / n as f64;
    drop(kept);
    per - vec_bytes
}

fn bytes_per_pipeline(r: &mut Report, rt: &tokio::runtime::Runtime) {
    const UNIT: &str = "B";
    const N: usize = 1_000;
    let s = "memory: bytes per full-chain pipeline";
    let store = MemoryStore::new();
    r.add(
        s,
        "seawall",
        bytes_per(N, |i| {
            pipelines::full_chain_in(&format!("bytes-per-pipeline-{i}"), store.clone())
        }),
        UNIT,
    );
    r.add(
        s,
        "tower-resilience",
        bytes_per(N, |_| tower_resilience_full_chain()),
        UNIT,
    );
    r.add(
        s,
        "seatbelt",
        bytes_per(N, |_| seatbelt_full_chain(rt)),
        UNIT,
    );
}

/// Live bytes per idle partition key: `use_key(i)` makes one call for key
/// `i`; over `keys` keys.
fn bytes_per_key(keys: u64, mut use_key: impl FnMut(u64)) -> f64 {
    use_key(u64::MAX);
    let before = live_bytes();
    for k in 0..keys {
        use_key(k);
    }
    (live_bytes() - before) as f64 / keys as f64
}

fn bytes_per_partition_key(r: &mut Report) {
    const UNIT: &str = "B";
    const KEYS: u64 = 1_000_000;

    let s = "memory: bytes per idle partition key, GCRA only (1M keys)";
    let p = pipelines::partitioned_gcra("bytes-per-key-gcra");
    r.add(
        s,
        "seawall",
        bytes_per_key(KEYS, |k| {
            black_box(p.partition(k).call(|_| op(black_box(1))).is_ok());
        }),
        UNIT,
    );
    assert!(p.partitions() as u64 > KEYS / 2, "keys are kept");
    drop(p);
    let quota = governor::Quota::per_second(NonZeroU32::new(100).expect("> 0"));
    let keyed = governor::RateLimiter::hashmap(quota);
    r.add(
        s,
        "governor (keyed, HashMap)",
        bytes_per_key(KEYS, |k| {
            black_box(keyed.check_key(&k).is_ok());
        }),
        UNIT,
    );
    drop(keyed);

    let s = "memory: bytes per idle partition key, breaker+bulkhead+cooldown+GCRA (1M keys)";
    let p = pipelines::partitioned("bytes-per-key-all");
    r.add(
        s,
        "seawall",
        bytes_per_key(KEYS, |k| {
            black_box(p.partition(k).call(|_| op(black_box(1))).is_ok());
        }),
        UNIT,
    );
    assert!(p.partitions() as u64 > KEYS / 2, "keys are kept");
    // Idle keys go, and give their memory back.
    let before = live_bytes();
    drop(p);
    let freed = before - live_bytes();
    println!("(dropping the partitioned pipeline freed {freed} B)");
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is accepted and
    // ignored (this binary always reports every figure).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("tokio runtime");
    let mut report = Report::default();
    allocations_per_call(&mut report, &rt);
    bytes_per_pipeline(&mut report, &rt);
    bytes_per_partition_key(&mut report);
    if let Ok(path) = std::env::var("SEAWALL_BENCH_MEMORY_OUT") {
        std::fs::write(&path, report.json()).expect("write the memory report");
        println!("wrote {path}");
    }
}
