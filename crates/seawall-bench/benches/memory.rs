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
use std::time::{Duration, Instant};

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

/// Calls measured per contender.
const CALLS: u64 = 10_000;

/// Warm-up before counting: at least this long (and [`CALLS`] calls), so
/// that state growing with use (a sliding log over its period, a
/// runtime's internal buffers) has reached its working size.
const WARM_UP: Duration = Duration::from_millis(50);

/// One figure of the report.
struct Figure {
    scenario: String,
    contender: String,
    value: f64,
    unit: &'static str,
}

#[derive(Default)]
struct Report {
    figures: Vec<Figure>,
    /// Contenders that did not do the scenario's work.
    failures: Vec<String>,
}

impl Report {
    /// Adds an allocation figure after checking that every measured call
    /// did what the scenario says: all succeeded, or (open breaker) all
    /// were rejected.
    fn allocs(&mut self, scenario: &str, contender: &str, counted: Counted) {
        let expected = if scenario.contains("open") { 0 } else { CALLS };
        if counted.ok != expected {
            self.failures.push(format!(
                "{scenario}, {contender}: {} of {CALLS} calls returned the operation's value, expected {expected}",
                counted.ok
            ));
        }
        self.add(scenario, contender, counted.per_call, "allocs/call");
    }

    fn add(&mut self, scenario: &str, contender: &str, value: f64, unit: &'static str) {
        println!("{scenario:<55} {contender:<36} {value:>10.4} {unit}");
        self.figures.push(Figure {
            scenario: scenario.into(),
            contender: contender.into(),
            value,
            unit,
        });
    }

    fn json(&self) -> String {
        let rows: Vec<String> = self
            .figures
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

/// What the measured calls of a contender did.
struct Counted {
    /// Heap allocations per call.
    per_call: f64,
    /// Calls that returned the operation's own value.
    ok: u64,
}

/// Allocations per call of a sync contender.
fn sync_allocs(call: impl Fn() -> bool) -> Counted {
    let start = Instant::now();
    while start.elapsed() < WARM_UP {
        for _ in 0..CALLS {
            black_box(call());
        }
    }
    let before = allocations();
    let ok = (0..CALLS).filter(|_| call()).count() as u64;
    Counted {
        per_call: (allocations() - before) as f64 / CALLS as f64,
        ok,
    }
}

/// Allocations per call of an async contender, in one `block_on`.
fn async_allocs<C: AsyncCase>(rt: &tokio::runtime::Runtime, mut case: C) -> Counted {
    rt.block_on(async {
        let start = Instant::now();
        while start.elapsed() < WARM_UP {
            for _ in 0..CALLS {
                black_box(case.call().await);
            }
        }
        let before = allocations();
        let mut ok = 0;
        for _ in 0..CALLS {
            ok += u64::from(case.call().await);
        }
        Counted {
            per_call: (allocations() - before) as f64 / CALLS as f64,
            ok,
        }
    })
}

fn seawall_call(p: seawall::Pipeline) -> impl Fn() -> bool {
    move || matches!(p.call(|_| op(black_box(1))), Ok(1))
}

fn allocations_per_call(r: &mut Report, rt: &tokio::runtime::Runtime) {
    let s = "allocations per call: retry, success (sync)";
    r.allocs(s, "seawall", sync_allocs(seawall_call(pipelines::retry())));
    r.allocs(s, "backon", sync_allocs(backon_sync()));

    let s = "allocations per call: retry, success (async)";
    r.allocs(
        s,
        "seawall",
        async_allocs(rt, SeawallAsync(pipelines::retry())),
    );
    r.allocs(s, "backon", async_allocs(rt, backon_async()));
    r.allocs(s, "tower", async_allocs(rt, tower_retry()));
    r.allocs(
        s,
        "tower-resilience",
        async_allocs(rt, tower_resilience_retry()),
    );
    r.allocs(s, "seatbelt", async_allocs(rt, seatbelt_retry(rt)));

    let s = "allocations per call: breaker closed (sync)";
    r.allocs(
        s,
        "seawall",
        sync_allocs(seawall_call(pipelines::breaker())),
    );
    let rc = recloser();
    r.allocs(s, "recloser", sync_allocs(|| recloser_call(&rc)));
    let fs = failsafe();
    r.allocs(s, "failsafe", sync_allocs(|| failsafe_call(&*fs)));

    let s = "allocations per call: breaker closed (async)";
    r.allocs(
        s,
        "seawall",
        async_allocs(rt, SeawallAsync(pipelines::breaker())),
    );
    r.allocs(
        s,
        "tower-resilience",
        async_allocs(rt, tower_resilience_breaker()),
    );
    r.allocs(s, "seatbelt", async_allocs(rt, seatbelt_breaker(rt)));

    let s = "allocations per call: breaker open (sync)";
    r.allocs(
        s,
        "seawall",
        sync_allocs(seawall_call(pipelines::open_breaker())),
    );
    let rc = recloser_open();
    r.allocs(s, "recloser", sync_allocs(|| recloser_call(&rc)));
    let fs = failsafe_open();
    r.allocs(s, "failsafe", sync_allocs(|| failsafe_call(&*fs)));

    let s = "allocations per call: breaker open (async)";
    r.allocs(
        s,
        "seawall",
        async_allocs(rt, SeawallAsync(pipelines::open_breaker())),
    );
    r.allocs(
        s,
        "tower-resilience",
        async_allocs(rt, tower_resilience_open(rt)),
    );
    r.allocs(s, "seatbelt", async_allocs(rt, seatbelt_open(rt)));

    let s = "allocations per call: rate limiter, GCRA (sync)";
    r.allocs(s, "seawall", sync_allocs(seawall_call(pipelines::gcra())));
    let gv = governor();
    r.allocs(s, "governor", sync_allocs(|| governor_check(&gv)));

    let s = "allocations per call: rate limiter, sliding window (async)";
    r.allocs(
        s,
        "seawall",
        async_allocs(rt, SeawallAsync(pipelines::sliding_window())),
    );
    r.allocs(
        s,
        "tower-resilience",
        async_allocs(rt, tower_resilience_sliding_log()),
    );

    let s = "allocations per call: bulkhead (async)";
    r.allocs(
        s,
        "seawall",
        async_allocs(rt, SeawallAsync(pipelines::bulkhead())),
    );
    r.allocs(s, "tokio Semaphore", async_allocs(rt, semaphore_async()));
    r.allocs(
        s,
        "tower-resilience",
        async_allocs(rt, tower_resilience_bulkhead()),
    );

    let s = "allocations per call: timeout (async)";
    r.allocs(
        s,
        "seawall",
        async_allocs(rt, SeawallAsync(pipelines::timeout())),
    );
    r.allocs(s, "tokio::time::timeout", async_allocs(rt, tokio_timeout()));
    r.allocs(s, "tower", async_allocs(rt, tower_timeout()));
    r.allocs(
        s,
        "tower-resilience",
        async_allocs(rt, tower_resilience_time_limiter()),
    );
    r.allocs(s, "seatbelt", async_allocs(rt, seatbelt_timeout(rt)));

    let s = "allocations per call: full chain (async)";
    r.allocs(
        s,
        "seawall",
        async_allocs(rt, SeawallAsync(pipelines::full_chain())),
    );
    r.allocs(
        s,
        "tower-resilience",
        async_allocs(rt, tower_resilience_full_chain()),
    );
    r.allocs(s, "seatbelt", async_allocs(rt, seatbelt_full_chain(rt)));

    let s = "allocations per call: full chain (sync)";
    let p = pipelines::full_chain();
    r.allocs(
        s,
        "seawall",
        sync_allocs(|| matches!(p.call(|_| op(black_box(1))), Ok(1))),
    );
    let chain = AssembledSyncChain::new();
    r.allocs(
        s,
        "backon+recloser+governor+Semaphore",
        sync_allocs(|| chain.call()),
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

/// Coalescing: operations run and allocations per call for 1 and for 64
/// identical calls made at once (`seawall_bench::coalescing::batch`), with
/// and without coalescing. Allocations include the batch's own: a box per
/// call and a vector per batch, for both contenders.
fn coalescing(r: &mut Report, rt: &tokio::runtime::Runtime) {
    use seawall_bench::coalescing::{batch, pipeline};
    use std::sync::atomic::{AtomicU64, Ordering};
    const BATCHES: u64 = 200;
    let p = pipeline();
    for n in [1usize, 64] {
        for (contender, coalesced) in [("seawall", true), ("seawall, not coalesced", false)] {
            let runs = AtomicU64::new(0);
            // Warm up: the table's capacity.
            rt.block_on(batch(&p, n, coalesced, &runs));
            runs.store(0, Ordering::Relaxed);
            let before = allocations();
            let ok: usize = rt.block_on(async {
                let mut ok = 0;
                for _ in 0..BATCHES {
                    ok += batch(&p, n, coalesced, &runs).await;
                }
                ok
            });
            let allocs = allocations() - before;
            let calls = BATCHES * n as u64;
            if ok as u64 != calls {
                r.failures.push(format!(
                    "coalescing, {n} calls, {contender}: {ok} of {calls} calls returned the value"
                ));
            }
            r.add(
                &format!("coalescing: operations run per call, {n} concurrent identical call(s)"),
                contender,
                runs.load(Ordering::Relaxed) as f64 / calls as f64,
                "runs/call",
            );
            r.add(
                &format!("coalescing: allocations per call, {n} concurrent identical call(s) (the batch itself: 1 per call, 1 per batch)"),
                contender,
                allocs as f64 / calls as f64,
                "allocs/call",
            );
        }
    }
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
    coalescing(&mut report, &rt);
    if let Ok(path) = std::env::var("SEAWALL_BENCH_MEMORY_OUT") {
        std::fs::write(&path, report.json()).expect("write the memory report");
        println!("wrote {path}");
    }
    if !report.failures.is_empty() {
        for f in &report.failures {
            eprintln!("contender check failed: {f}");
        }
        std::process::exit(1);
    }
}
