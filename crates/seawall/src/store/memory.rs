//! The in-memory store.

use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasher;

use hashbrown::{DefaultHashBuilder, HashTable};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use super::*;
use crate::breaker::machine::{BreakerParams, Circuit};
use crate::breaker::{CircuitControl, CircuitMetrics, CircuitTransition};
use crate::bulkhead::machine::{Slots, StripedSlots};
use crate::clock::duration_nanos;
use crate::cooldown;
use crate::error::{ConfigError, RejectionReason};
use crate::rate_limit::machine::{retain_by, RateCell, RateColumn, RateParams, RateState};
use crate::retry::BudgetRule;
use crate::shadow::{Policy, Shadow, Walk};

/// A key's last use is kept in ticks of 2^20 ns (about 1.05 ms), rounded
/// up: a shift, not a division, on every call.
const USE_TICK_SHIFT: u32 = 20;

/// `now_ns` in use ticks, rounded up.
#[inline(always)]
fn use_tick(now_ns: u64) -> u64 {
    now_ns.div_ceil(1 << USE_TICK_SHIFT)
}
/// Shards of a resource's partition map.
const SHARDS: usize = 32;
/// A shard is not swept before it holds this many keys.
const MIN_SWEEP_LEN: usize = 16;

/// The default, process-local [`StateStore`]: lock-free atomics per
/// resource, a sharded map per partition. Clones share state.
///
/// # Resources
/// [`bind`](StateStore::bind) keys resources by name: binding the same name
/// with an equal [`ResourceSpec`] returns the same resource, so two
/// pipelines of one name share one circuit, bulkhead, cooldown and rate
/// limit. Binding a name again with a *different* spec (a configuration
/// reload, say) creates a new resource, but each unpartitioned policy whose
/// own configuration is unchanged keeps its state: changing the rate limit
/// does not close an open circuit, and neither does switching a policy in
/// or out of [shadow mode](crate::shadow). Partitions of the new resource start
/// fresh. The store keeps every resource it has bound for as long as it
/// lives (resource names are expected to be few and fixed).
///
/// Pipelines built earlier with the name keep the old resource: while one
/// of them lives, the two do not share the policies whose settings differ
/// (they do share a policy that differs in shadow mode only: one pipeline
/// enforces it, the other watches it).
/// That is what a configuration reload wants, and a mistake anywhere else:
/// with the `tracing` feature such a binding logs a warning (target
/// `seawall`, naming the resource and the differing policies), and a
/// pipeline built with
/// [`strict_names`](crate::PipelineBuilder::strict_names) refuses it.
///
/// # Admission
/// [`admit`](ResourceState::admit) checks the circuit, the bulkhead, the
/// cooldown and the rate limit in that order, all or nothing: when a later
/// check refuses, the half-open probe slot and the bulkhead slot taken by
/// earlier ones are given back, and the rate limiter, last, takes a permit
/// only when the call is admitted, or reserves one for a call that may wait
/// for it ([`admit_reserving`](ResourceState::admit_reserving); the call
/// then holds nothing else while it waits).
///
/// # Circuit breaker
/// One lock-free cell per circuit (a packed `AtomicU64`, compare-and-swap
/// for every transition) applying the breaker's rules, which are pure
/// functions of the breaker module:
/// - closed: admits; in consecutive mode, opens after `N` failures in a row
///   (a success resets the run); in window modes, opens when the window
///   holds at least `minimum_calls` calls (capped at the size of a count
///   window) and the failure rate or the slow-call rate reaches its
///   threshold. **The rates are judged only when a failed or slow call is
///   recorded**, never on a fast success.
/// - open: rejects with `retry_after` until the cooldown is over; the first
///   call after it half-opens the circuit and is its first probe.
/// - half-open: admits exactly `half_open_calls` probes, however many calls
///   race, and refuses the others with the cooldown that just ended as the
///   `retry_after` (after an explicit open, `open_for`, the duration it was
///   opened for); a failed or slow probe opens it again (one more trip,
///   cooldown `cooldown_for_trip(trips)`); when every probe succeeded it
///   closes with an empty window and no trips. Half-open has counts of its
///   own (the probes that succeeded), see
///   [`CircuitMetrics`](crate::breaker::CircuitMetrics).
/// - isolated (forced open) rejects every call, disabled (forced closed)
///   admits every call and records nothing; both keep showing the counts
///   they were entered with. A reset or an explicit open (`open_for`)
///   leaves either, and enabling leaves the disabled state.
///
/// Every transition starts a new *generation*; the outcome of a call
/// admitted in an older generation is not recorded (its slots are still
/// given back). Resolutions of the state word: the end of a cooldown is
/// kept in whole milliseconds, rounded up (an end past 2^42 - 1 ms, about
/// 139 years after the clock's origin, keeps the circuit open until the
/// clock's latest instant); generations count modulo 8192;
/// trips saturate at 63; `half_open_calls` is at most 2,097,151
/// ([`CircuitBreaker::MAX_HALF_OPEN_CALLS`](crate::CircuitBreaker::MAX_HALF_OPEN_CALLS),
/// a larger one fails `build()`). A time window counts the last `W` whole
/// seconds, the current one included. A circuit begins with its first
/// admission, record or control: a circuit that never moved reports the
/// time since then as its time in state (no time before it).
///
/// # Cooldown
/// A retry-after hint `h` on [`record`](ResourceState::record) (any outcome)
/// moves the end of the pause to `max(end, now + min(h, max_pause))`: a
/// shorter hint never shrinks it, and a pause that would end past the
/// clock's range lasts to its end. [`Recorded::cooldown`] is the time left
/// after the hint, `None` when no pause is in effect.
///
/// Each policy's rules are pure functions in the policy's own module; the
/// cells of this store apply them atomically, and the store holds, shards
/// and composes the cells.
///
/// # Partitions
/// A partition key holds the cells of the resource's policies and nothing
/// else, in a map of 32 shards behind read-write locks. Inside a shard the
/// cells are kept column by column: a key is a number, entry `n` of the
/// key column, of the column of its last use and of one column per
/// configured policy; a hash index maps a key to its number. Integer keys
/// take 8 bytes each until a shard sees a key of another kind. A key
/// unused for [`ResourceSpec::partition_idle`] is dropped when it holds
/// nothing: no slot in flight, a circuit that is plain closed (not open,
/// half-open, isolated or disabled; a partial window may be lost), no
/// cooldown in effect, and a rate limiter whose state equals fresh state
/// (no permit of the current window or period taken), so that eviction
/// never lets more calls through than the limit. Keys are swept when a
/// shard has doubled in size since its last sweep, and by
/// [`evict_idle`](ResourceState::evict_idle).
///
/// Heap per idle integer key, measured over one million keys: about
/// 36 bytes with a GCRA limiter alone, about 73 with a consecutive-failures
/// breaker, a bulkhead, a cooldown and a GCRA limiter (a window-mode
/// breaker adds its window; string keys add 16 bytes each, plus their own
/// string when shared).
///
/// # Costs
/// Admitting and recording on an unpartitioned resource allocate nothing
/// (a sliding window of more than 4096 allocates each further chunk of its
/// log once, on first use). A closed circuit admits with one atomic load, a
/// consecutive-mode success is one load, a bulkhead slot is one load and
/// one compare-and-swap to take and as much to give back, a cooldown check
/// is one load, a GCRA or fixed-window permit one load and one
/// compare-and-swap, a sliding-window permit two loads, one
/// compare-and-swap and one store. Nothing takes a lock. A partitioned call
/// adds one hash of its key and the shard's read lock (a write lock when
/// the key is new).
///
/// Threads working on one unpartitioned resource at once share no written
/// cache line except the rate limiter's: the bulkhead's slots are split
/// into stripes (one per core, each holding a fixed share of the maximum,
/// a thread starting on its own stripe), and the circuit, cooldown and rate
/// cells sit on cache lines of their own. A partition keeps one counter per
/// policy and the sliding log in a deque behind a small mutex, so that an
/// idle key costs little.
#[derive(Clone, Default)]
pub struct MemoryStore {
    registry: Arc<Mutex<HashMap<String, Arc<MemoryResource>>>>,
}

impl MemoryStore {
    /// A new, empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The process-wide store used by pipelines that name no store.
    pub fn global() -> &'static MemoryStore {
        static GLOBAL: OnceLock<MemoryStore> = OnceLock::new();
        GLOBAL.get_or_init(MemoryStore::new)
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<MemoryResource>>> {
        // Binding never leaves the map half-updated.
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("resources", &self.registry().len())
            .finish()
    }
}

type Registry = HashMap<String, Arc<MemoryResource>>;

impl MemoryStore {
    /// [`StateStore::bind`] with the concrete type, so that pipelines on a
    /// memory store call it without dynamic dispatch.
    ///
    /// Rebinding a name that a live pipeline holds with different settings
    /// is logged as a `tracing` warning (feature `tracing`): the two
    /// pipelines do not share the policies that differ.
    pub(crate) fn bind_memory(&self, spec: &ResourceSpec) -> Arc<MemoryResource> {
        Self::bind_locked(&mut self.registry(), spec)
    }

    /// [`bind_memory`](Self::bind_memory), refusing to rebind a name that a
    /// live pipeline holds with different settings (the builder's
    /// `strict_names`).
    pub(crate) fn bind_memory_strict(
        &self,
        spec: &ResourceSpec,
    ) -> Result<Arc<MemoryResource>, ConfigError> {
        let mut registry = self.registry();
        if let Some(differing) = conflict(&registry, spec) {
            return Err(ConfigError::new(
                "pipeline",
                "name",
                format!(
                    "`{}` is bound on this store by a live pipeline with a different {}: \
                     pipelines of one name share state only with equal settings \
                     (strict_names)",
                    spec.name,
                    differing.join(", ")
                ),
            ));
        }
        Ok(Self::bind_locked(&mut registry, spec))
    }

    fn bind_locked(registry: &mut Registry, spec: &ResourceSpec) -> Arc<MemoryResource> {
        let previous = registry.get(&spec.name);
        if let Some(previous) = previous.filter(|p| p.spec == *spec) {
            return Arc::clone(previous);
        }
        #[cfg(feature = "tracing")]
        if let Some(differing) = conflict(registry, spec) {
            tracing::warn!(
                target: "seawall",
                resource = spec.name.as_str(),
                differing = differing.join(", ").as_str(),
                "resource `{}` bound again with a different {}: pipelines built before \
                 with this name keep their own state for it (a reload is logged too; \
                 the builder's strict_names refuses it)",
                spec.name,
                differing.join(", ")
            );
        }
        let resource = Arc::new(MemoryResource::new(spec, previous.map(|p| &**p)));
        registry.insert(spec.name.clone(), Arc::clone(&resource));
        resource
    }
}

/// The policies whose settings differ between `spec` and the resource of
/// its name that a live pipeline holds, if any (`None` when the name is
/// unbound, bound with equal settings, or held by no pipeline any more).
fn conflict(registry: &Registry, spec: &ResourceSpec) -> Option<Vec<&'static str>> {
    let previous = registry.get(&spec.name)?;
    // The registry holds one reference; pipelines hold the others.
    if Arc::strong_count(previous) == 1 || previous.spec == *spec {
        return None;
    }
    let (old, new) = (unshadowed(&previous.spec), unshadowed(spec));
    let differing: Vec<&'static str> = [
        ("circuit_breaker", old.circuit != new.circuit),
        ("bulkhead", old.bulkhead != new.bulkhead),
        ("cooldown", old.cooldown != new.cooldown),
        ("rate_limiter", old.rate_limit != new.rate_limit),
        ("retry.budget", old.retry_budget != new.retry_budget),
        ("partition_idle", old.partition_idle != new.partition_idle),
    ]
    .into_iter()
    .filter_map(|(name, differs)| differs.then_some(name))
    .collect();
    // Settings that differ in shadow mode only: the two share every cell.
    (!differing.is_empty() || old != new).then(|| {
        if differing.is_empty() {
            vec!["settings"]
        } else {
            differing
        }
    })
}

/// `spec` with every policy out of shadow mode: the configuration its
/// cells' state depends on.
fn unshadowed(spec: &ResourceSpec) -> ResourceSpec {
    let mut spec = spec.clone();
    spec.circuit = spec.circuit.map(|c| c.shadow(false));
    spec.bulkhead = spec.bulkhead.map(|b| b.shadow(false));
    spec.cooldown = spec.cooldown.map(|c| c.shadow(false));
    spec.rate_limit = spec.rate_limit.map(|r| r.shadow(false));
    spec
}

impl StateStore for MemoryStore {
    fn bind(&self, spec: &ResourceSpec) -> Result<Arc<dyn ResourceState>, StoreError> {
        Ok(self.bind_memory(spec))
    }
}

/// The prepared configuration of a resource.
#[derive(Debug)]
struct Params {
    circuit: Option<BreakerParams>,
    bulkhead: Option<u32>,
    max_pause_ns: Option<u64>,
    rate: Option<RateParams>,
    /// The retry budget kept in the store.
    budget: Option<BudgetRule>,
    idle_ns: u64,
    /// The policies in shadow mode.
    shadow: Shadow,
}

impl Params {
    fn new(spec: &ResourceSpec) -> Self {
        Params {
            shadow: Shadow::of(spec),
            circuit: spec.circuit.as_ref().map(BreakerParams::new),
            bulkhead: spec.bulkhead.as_ref().map(|b| b.max_concurrent),
            max_pause_ns: spec.cooldown.as_ref().map(|c| duration_nanos(c.max_pause)),
            rate: spec.rate_limit.as_ref().map(RateParams::new),
            budget: spec.retry_budget.as_ref().map(|b| b.rule()),
            idle_ns: duration_nanos(spec.partition_idle),
        }
    }

    fn is_empty(&self) -> bool {
        self.circuit.is_none()
            && self.bulkhead.is_none()
            && self.max_pause_ns.is_none()
            && self.rate.is_none()
            && self.budget.is_none()
    }
}

/// A cell on cache lines of its own: a cell written by every call (the
/// rate limit) must not share a line with one only read (a closed circuit),
/// or each write would take the reader's copy away on the other cores.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The unpartitioned state: one shared cell per configured policy, so that
/// a rebind with a different spec can keep the cells it did not change.
#[derive(Debug)]
struct Root {
    circuit: Option<Arc<Padded<Circuit>>>,
    in_flight: Option<Arc<StripedSlots>>,
    cooldown_until: Option<Arc<Padded<AtomicU64>>>,
    rate: Option<Arc<Padded<RateState>>>,
    budget: Option<Arc<Padded<AtomicI64>>>,
}

/// The cells one operation works on (root or partition): one per
/// configured policy.
#[derive(Debug, Clone, Copy)]
struct View<'a> {
    circuit: Option<&'a Circuit>,
    in_flight: Option<Slots<'a>>,
    cooldown_until: Option<&'a AtomicU64>,
    rate: Option<RateCell<'a>>,
    /// The retry budget's bucket, in thousandths of a token.
    budget: Option<&'a AtomicI64>,
}

/// The keys of one shard: integers in 8 bytes each until a key of another
/// kind arrives, then every key as it is.
#[derive(Debug)]
enum Keys {
    Ints(Vec<u64>),
    Any(Vec<PartitionKey>),
}

impl Keys {
    fn hash(&self, i: u32, hasher: &DefaultHashBuilder) -> u64 {
        match self {
            Keys::Ints(ints) => hasher.hash_one(ints[i as usize]),
            Keys::Any(keys) => key_hash(hasher, &keys[i as usize]),
        }
    }

    fn push(&mut self, key: &PartitionKey) {
        match (&mut *self, key) {
            (Keys::Ints(ints), PartitionKey::Int(k)) => ints.push(*k),
            (Keys::Ints(ints), key) => {
                let mut keys: Vec<PartitionKey> =
                    ints.iter().map(|&k| PartitionKey::Int(k)).collect();
                keys.push(key.clone());
                *self = Keys::Any(keys);
            }
            (Keys::Any(keys), key) => keys.push(key.clone()),
        }
    }

    fn len(&self) -> usize {
        match self {
            Keys::Ints(ints) => ints.len(),
            Keys::Any(keys) => keys.len(),
        }
    }

    fn retain(&mut self, keep: &[bool]) {
        match self {
            Keys::Ints(ints) => retain_by(ints, keep),
            Keys::Any(keys) => retain_by(keys, keep),
        }
    }

    fn shrink(&mut self) {
        match self {
            Keys::Ints(ints) => shrink(ints),
            Keys::Any(keys) => shrink(keys),
        }
    }

    /// Heap bytes held by the column (not by the keys' own strings).
    #[cfg(test)]
    fn heap_bytes(&self) -> usize {
        match self {
            Keys::Ints(ints) => ints.capacity() * std::mem::size_of::<u64>(),
            Keys::Any(keys) => keys.capacity() * std::mem::size_of::<PartitionKey>(),
        }
    }
}

/// The hash of a partition key in a shard's index: an integer key hashes
/// as the integer alone, a string key as its string (equal keys of
/// different kinds never meet: the index compares the keys).
#[inline(always)]
fn key_hash(hasher: &DefaultHashBuilder, key: &PartitionKey) -> u64 {
    match key {
        PartitionKey::Int(k) => hasher.hash_one(k),
        other => hasher.hash_one(other.as_str().unwrap_or_default()),
    }
}

/// Gives back most of a column's spare capacity after a sweep emptied it.
fn shrink<T>(column: &mut Vec<T>) {
    if column.len() * 4 < column.capacity() {
        column.shrink_to(column.len() * 2);
    }
}

/// The keys of one shard and their cells, column by column: key number `i`
/// owns entry `i` of each column, and a column exists (is non-empty) only
/// for a policy the resource configures. A GCRA-only resource with integer
/// keys thus holds 24 bytes per key (key, last use, TAT) plus the index.
#[derive(Debug)]
struct ShardMap {
    /// Key numbers, by the hash of their key.
    index: HashTable<u32>,
    keys: Keys,
    /// The last admission or record of each key, in use ticks rounded up.
    last_used: Vec<AtomicU64>,
    circuit: Vec<Circuit>,
    in_flight: Vec<AtomicU32>,
    cooldown_until: Vec<AtomicU64>,
    rate: Option<RateColumn>,
    budget: Vec<AtomicI64>,
    /// Keys left after the last sweep.
    swept_len: usize,
}

impl ShardMap {
    fn new(params: &Params) -> Self {
        ShardMap {
            index: HashTable::new(),
            keys: Keys::Ints(Vec::new()),
            last_used: Vec::new(),
            circuit: Vec::new(),
            in_flight: Vec::new(),
            cooldown_until: Vec::new(),
            rate: params.rate.as_ref().map(RateColumn::new),
            budget: Vec::new(),
            swept_len: 0,
        }
    }

    #[inline(always)]
    fn find(&self, hash: u64, key: &PartitionKey) -> Option<u32> {
        // The kind of key is settled once, not at every probe.
        match (&self.keys, key) {
            (Keys::Ints(ints), PartitionKey::Int(k)) => self
                .index
                .find(hash, |&i| ints.get(i as usize) == Some(k))
                .copied(),
            (Keys::Ints(_), _) => None,
            (Keys::Any(keys), key) => self
                .index
                .find(hash, |&i| keys.get(i as usize) == Some(key))
                .copied(),
        }
    }

    /// Appends fresh cells for `key`, used at `now_ns`; returns its number.
    fn insert(
        &mut self,
        params: &Params,
        hasher: &DefaultHashBuilder,
        hash: u64,
        key: &PartitionKey,
        now_ns: u64,
    ) -> u32 {
        let i = self.keys.len() as u32;
        self.keys.push(key);
        self.last_used.push(AtomicU64::new(use_tick(now_ns)));
        if let Some(p) = &params.circuit {
            self.circuit.push(Circuit::new(p));
        }
        if params.bulkhead.is_some() {
            self.in_flight.push(AtomicU32::new(0));
        }
        if params.max_pause_ns.is_some() {
            self.cooldown_until.push(AtomicU64::new(0));
        }
        if let Some(rate) = &mut self.rate {
            rate.push();
        }
        if let Some(b) = &params.budget {
            // A bucket starts full.
            self.budget.push(AtomicI64::new(b.cap));
        }
        let keys = &self.keys;
        self.index.insert_unique(hash, i, |&j| keys.hash(j, hasher));
        i
    }

    #[inline(always)]
    fn view(&self, i: u32) -> View<'_> {
        let i = i as usize;
        View {
            circuit: self.circuit.get(i),
            in_flight: self.in_flight.get(i).map(Slots::One),
            cooldown_until: self.cooldown_until.get(i),
            rate: self.rate.as_ref().and_then(|r| r.get(i)),
            budget: self.budget.get(i),
        }
    }

    #[inline(always)]
    fn touch(&self, i: u32, now_ns: u64) {
        let tick = use_tick(now_ns);
        if let Some(last) = self.last_used.get(i as usize) {
            if last.load(Ordering::Relaxed) < tick {
                last.fetch_max(tick, Ordering::Relaxed);
            }
        }
    }

    /// `true` when key number `i` may be dropped at `now_ns`: unused for
    /// the idle time, and every cell equivalent to fresh state.
    fn is_evictable(&self, params: &Params, i: u32, now_ns: u64) -> bool {
        let last_ns = self.last_used[i as usize]
            .load(Ordering::Relaxed)
            .saturating_mul(1 << USE_TICK_SHIFT);
        let view = self.view(i);
        now_ns.saturating_sub(last_ns) >= params.idle_ns
            && view.in_flight.is_none_or(|slots| slots.in_flight() == 0)
            && view.circuit.is_none_or(Circuit::is_idle)
            && view
                .cooldown_until
                .is_none_or(|c| cooldown::machine::is_idle(c, now_ns))
            && view
                .rate
                .zip(params.rate.as_ref())
                .is_none_or(|(cell, p)| cell.is_idle(p, now_ns))
    }

    /// Drops the evictable keys; returns how many.
    fn sweep(&mut self, params: &Params, hasher: &DefaultHashBuilder, now_ns: u64) -> usize {
        let len = self.keys.len();
        let keep: Vec<bool> = (0..len as u32)
            .map(|i| !self.is_evictable(params, i, now_ns))
            .collect();
        let removed = keep.iter().filter(|k| !**k).count();
        if removed > 0 {
            self.keys.retain(&keep);
            retain_by(&mut self.last_used, &keep);
            retain_by(&mut self.circuit, &keep);
            retain_by(&mut self.in_flight, &keep);
            retain_by(&mut self.cooldown_until, &keep);
            if let Some(rate) = &mut self.rate {
                rate.retain(&keep);
            }
            retain_by(&mut self.budget, &keep);
            self.keys.shrink();
            shrink(&mut self.last_used);
            shrink(&mut self.circuit);
            shrink(&mut self.in_flight);
            shrink(&mut self.cooldown_until);
            shrink(&mut self.budget);
            // Key numbers moved: index them again.
            self.index.clear();
            let kept = self.keys.len() as u32;
            if (kept as usize) * 4 < self.index.capacity() {
                self.index
                    .shrink_to(kept as usize * 2, |&j| self.keys.hash(j, hasher));
            }
            let keys = &self.keys;
            for i in 0..kept {
                self.index
                    .insert_unique(keys.hash(i, hasher), i, |&j| keys.hash(j, hasher));
            }
        }
        self.swept_len = self.keys.len();
        removed
    }

    fn len(&self) -> usize {
        self.keys.len()
    }

    /// Heap bytes held by the shard: the index (a `u32` and one control
    /// byte per bucket) and every column.
    #[cfg(test)]
    fn heap_bytes(&self) -> usize {
        let capacity = self.index.capacity();
        // hashbrown keeps capacity = buckets * 7 / 8 (buckets >= 8).
        let buckets = if capacity == 0 {
            0
        } else {
            (capacity * 8 / 7).next_power_of_two()
        };
        buckets * (std::mem::size_of::<u32>() + 1)
            + self.keys.heap_bytes()
            + self.last_used.capacity() * std::mem::size_of::<AtomicU64>()
            + self.circuit.capacity() * std::mem::size_of::<Circuit>()
            + self.in_flight.capacity() * std::mem::size_of::<AtomicU32>()
            + self.cooldown_until.capacity() * std::mem::size_of::<AtomicU64>()
            + self.rate.as_ref().map_or(0, RateColumn::heap_bytes)
            + self.budget.capacity() * std::mem::size_of::<AtomicI64>()
    }
}

/// One shard of a partition map, on a cache line pair of its own.
#[derive(Debug)]
#[repr(align(128))]
struct Shard {
    map: RwLock<ShardMap>,
}

impl Shard {
    fn read(&self) -> RwLockReadGuard<'_, ShardMap> {
        // A panic while the map is written (an allocation failure) leaves
        // at worst a key whose index entry is missing: it is not found,
        // and admitted on fresh cells, as an evicted key would be.
        self.map.read().unwrap_or_else(|e| e.into_inner())
    }
    fn write(&self) -> RwLockWriteGuard<'_, ShardMap> {
        self.map.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// A shard map held under either lock.
enum MapGuard<'a> {
    Read(RwLockReadGuard<'a, ShardMap>),
    Write(RwLockWriteGuard<'a, ShardMap>),
}

impl MapGuard<'_> {
    #[inline(always)]
    fn map(&self) -> &ShardMap {
        match self {
            MapGuard::Read(map) => map,
            MapGuard::Write(map) => map,
        }
    }
}

struct Partitions {
    /// Keyed per store: the hash of a key is not known outside the process.
    hasher: DefaultHashBuilder,
    shards: Box<[Shard; SHARDS]>,
}

impl Partitions {
    fn new(params: &Params) -> Self {
        Partitions {
            hasher: DefaultHashBuilder::default(),
            shards: Box::new(std::array::from_fn(|_| Shard {
                map: RwLock::new(ShardMap::new(params)),
            })),
        }
    }

    /// The hash of `key` (computed once per lookup) and its shard. The
    /// shard is chosen by middle bits of the hash: the table inside uses
    /// the low bits for the bucket and the top 7 as the tag.
    #[inline]
    fn locate(&self, key: &PartitionKey) -> (u64, &Shard) {
        let hash = key_hash(&self.hasher, key);
        (hash, &self.shards[((hash >> 32) % SHARDS as u64) as usize])
    }
}

impl fmt::Debug for Partitions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Partitions")
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

/// One bound resource of a [`MemoryStore`].
#[derive(Debug)]
pub(crate) struct MemoryResource {
    spec: ResourceSpec,
    params: Params,
    root: Root,
    partitions: OnceLock<Partitions>,
}

impl MemoryResource {
    fn new(spec: &ResourceSpec, previous: Option<&MemoryResource>) -> Self {
        let params = Params::new(spec);
        // A cell is kept from the previous binding when its own policy is
        // configured the same way in both, shadow mode aside: a reload that
        // only switches a policy in or out of shadow mode keeps its state
        // (an enforcing policy starts from the state its shadow kept).
        let (new, old) = (unshadowed(spec), previous.map(|p| unshadowed(&p.spec)));
        let keep = |same: fn(&ResourceSpec, &ResourceSpec) -> bool| {
            previous
                .filter(|_| old.as_ref().is_some_and(|old| same(old, &new)))
                .map(|p| &p.root)
        };
        let root = Root {
            circuit: params.circuit.as_ref().map(|p| {
                keep(|a, b| a.circuit == b.circuit)
                    .and_then(|r| r.circuit.clone())
                    .unwrap_or_else(|| Arc::new(Padded(Circuit::new(p))))
            }),
            in_flight: params.bulkhead.map(|max| {
                keep(|a, b| a.bulkhead == b.bulkhead)
                    .and_then(|r| r.in_flight.clone())
                    .unwrap_or_else(|| Arc::new(StripedSlots::new(max)))
            }),
            cooldown_until: params.max_pause_ns.map(|_| {
                keep(|a, b| a.cooldown == b.cooldown)
                    .and_then(|r| r.cooldown_until.clone())
                    .unwrap_or_default()
            }),
            rate: params.rate.as_ref().map(|p| {
                keep(|a, b| a.rate_limit == b.rate_limit)
                    .and_then(|r| r.rate.clone())
                    .unwrap_or_else(|| Arc::new(Padded(RateState::new(p))))
            }),
            budget: params.budget.map(|b| {
                keep(|a, b| a.retry_budget == b.retry_budget)
                    .and_then(|r| r.budget.clone())
                    .unwrap_or_else(|| Arc::new(Padded(AtomicI64::new(b.cap))))
            }),
        };
        MemoryResource {
            spec: spec.clone(),
            params,
            root,
            partitions: OnceLock::new(),
        }
    }

    #[inline(always)]
    fn root_view(&self) -> View<'_> {
        View {
            circuit: self.root.circuit.as_deref().map(|c| &c.0),
            in_flight: self.root.in_flight.as_deref().map(Slots::Striped),
            cooldown_until: self.root.cooldown_until.as_deref().map(|c| &c.0),
            rate: self.root.rate.as_deref().map(|r| r.0.cell()),
            budget: self.root.budget.as_deref().map(|b| &b.0),
        }
    }

    /// Runs `f` on the cells of `key`, creating them if needed; counts as a
    /// use of the key at `now_ns`.
    #[inline]
    fn use_partition<R>(
        &self,
        key: &PartitionKey,
        now_ns: u64,
        f: impl FnOnce(View<'_>) -> R,
    ) -> R {
        let partitions = self
            .partitions
            .get_or_init(|| Partitions::new(&self.params));
        let (hash, shard) = partitions.locate(key);
        let read = shard.read();
        // One call of `f` whichever lock found the key, so that it is
        // inlined here.
        let (guard, i) = match read.find(hash, key) {
            Some(i) => (MapGuard::Read(read), i),
            None => {
                drop(read);
                self.insert_partition(partitions, shard, hash, key, now_ns)
            }
        };
        let map = guard.map();
        map.touch(i, now_ns);
        f(map.view(i))
    }

    /// The slow half of [`use_partition`](Self::use_partition): a key not
    /// found under the read lock, found or inserted under the write lock.
    #[inline(never)]
    fn insert_partition<'a>(
        &self,
        partitions: &Partitions,
        shard: &'a Shard,
        hash: u64,
        key: &PartitionKey,
        now_ns: u64,
    ) -> (MapGuard<'a>, u32) {
        let mut map = shard.write();
        let i = match map.find(hash, key) {
            Some(i) => i,
            None => {
                let threshold = (2 * map.swept_len).max(MIN_SWEEP_LEN);
                if map.len() >= threshold {
                    map.sweep(&self.params, &partitions.hasher, now_ns);
                }
                map.insert(&self.params, &partitions.hasher, hash, key, now_ns)
            }
        };
        (MapGuard::Write(map), i)
    }

    /// Runs `f` on the cells of `key` if it has any.
    fn read_partition<R>(&self, key: &PartitionKey, f: impl FnOnce(View<'_>) -> R) -> Option<R> {
        let (hash, shard) = self.partitions.get()?.locate(key);
        let map = shard.read();
        map.find(hash, key).map(|i| f(map.view(i)))
    }

    /// The admission on `view` at `now_ns` of a call of weight `n`. With a
    /// lead `within_ns`, a rate-limit refusal reserves the next `n` permits
    /// when they are at most that far (their instant written into
    /// `reserved`); a `held` reservation (its instant) stands for the
    /// rate-limit permits, and is given back when an earlier policy refuses.
    /// A weight the rate limiter can never grant is refused first, with no
    /// `retry_after`. A refusal by a policy in shadow mode admits the call
    /// instead, as [`Walk`] says; a call `shadowed` already meets no policy
    /// in shadow mode.
    fn admit_in(
        &self,
        view: View<'_>,
        now_ns: u64,
        (within_ns, held, n): (u64, Option<u64>, u32),
        (step, shadowed): (Option<BudgetStep>, bool),
        reserved: &mut Option<u64>,
    ) -> Admission {
        let params = &self.params;
        let budget = view.budget.zip(params.budget);
        // A call's deposit is made whatever the answer.
        if let (Some((bucket, rule)), Some(BudgetStep::Deposit)) = (budget, step) {
            crate::retry::deposit(rule, bucket);
        }
        // A token withdrawn for a retry, given back if a later check
        // refuses.
        let mut spent = None;
        let mut permit = Permit::default();
        let mut transition = None;
        let mut walk = Walk::new(params.shadow, shadowed);
        let refuse = |rejection: Rejection, transition, spent: Option<(&AtomicI64, BudgetRule)>| {
            if let (Some(at), Some(rate), Some(p)) = (held, view.rate, &params.rate) {
                rate.give_back(p, at, n);
            }
            if let Some((bucket, rule)) = spent {
                crate::retry::refund(rule, bucket);
            }
            Admission {
                decision: Err(rejection),
                transition,
                degraded: None,
                shadow: None,
            }
        };
        // A refusal by `policy`: the admission's answer (what was taken is
        // given back), or, in shadow mode, the call goes on without what
        // the policies in shadow mode took.
        macro_rules! refused {
            ($policy:expr, $reason:expr, $retry_after:expr) => {
                match walk.refused($policy, Rejection::new($reason, $retry_after)) {
                    Err(rejection) => {
                        give_back(view, permit);
                        return refuse(rejection, transition, spent);
                    }
                    Ok(()) => drop_shadowed(view, &mut permit, &walk),
                }
            };
        }
        if let (Some(_), Some(p), true) = (view.rate, &params.rate, walk.takes_part(Policy::Rate)) {
            if !crate::rate_limit::rules::weight_fits(p, n) {
                refused!(Policy::Rate, RejectionReason::RateLimited, None);
            }
        }
        if let (Some(circuit), Some(p), true) = (
            view.circuit,
            &params.circuit,
            walk.takes_part(Policy::Circuit),
        ) {
            let answer = circuit.admit(p, now_ns);
            transition = answer.transition;
            match answer.decision {
                Ok((generation, probe)) => {
                    permit.generation = generation;
                    permit.probe = probe;
                }
                Err(retry_after) => {
                    refused!(Policy::Circuit, RejectionReason::CircuitOpen, retry_after)
                }
            }
        }
        if let (Some(slots), Some(max), true) = (
            view.in_flight,
            params.bulkhead,
            walk.takes_part(Policy::Bulkhead),
        ) {
            match slots.acquire(max) {
                Some(slot) => permit.slot = Some(slot),
                None => refused!(Policy::Bulkhead, RejectionReason::BulkheadFull, None),
            }
        }
        if let (Some(until), true) = (view.cooldown_until, walk.takes_part(Policy::Cooldown)) {
            if let Err(left) = cooldown::machine::admit(until, now_ns) {
                refused!(
                    Policy::Cooldown,
                    RejectionReason::CooldownActive,
                    Some(left)
                );
            }
        }
        if let (Some((bucket, rule)), Some(BudgetStep::Withdraw)) = (budget, step) {
            if crate::retry::withdraw(rule, bucket) {
                spent = Some((bucket, rule));
            } else {
                give_back(view, permit);
                let rejection = Rejection::new(RejectionReason::RetryBudgetExhausted, None);
                return refuse(rejection, transition, None);
            }
        }
        if let (Some(rate), Some(p), None, true) =
            (view.rate, &params.rate, held, walk.takes_part(Policy::Rate))
        {
            // A limiter in shadow mode never makes a call wait.
            let shadow = params.shadow.has(Policy::Rate);
            let within_ns = if shadow { 0 } else { within_ns };
            match rate.reserve(p, now_ns, within_ns, n) {
                Ok(at) if at > now_ns && shadow => {
                    rate.give_back(p, at, n);
                    let wait = Duration::from_nanos(at - now_ns);
                    refused!(Policy::Rate, RejectionReason::RateLimited, Some(wait));
                }
                Ok(at) if at > now_ns => {
                    // Reserved: the call waits for it, holding nothing else.
                    give_back(view, permit);
                    *reserved = Some(at);
                    let wait = Duration::from_nanos(at - now_ns);
                    let rejection = Rejection::new(RejectionReason::RateLimited, Some(wait));
                    return refuse(rejection, transition, spent);
                }
                Ok(_) => {}
                Err(retry_after) => {
                    refused!(
                        Policy::Rate,
                        RejectionReason::RateLimited,
                        Some(retry_after)
                    );
                }
            }
        }
        permit.shadowed = walk.shadowed();
        Admission {
            decision: Ok(permit),
            transition,
            degraded: None,
            shadow: walk.refusal(),
        }
    }

    #[inline]
    fn record_in(&self, view: View<'_>, record: &Record<'_>) -> Recorded {
        let now_ns = duration_nanos(record.now);
        let mut recorded = Recorded::default();
        // The cooldown and the circuit first, the slot last: a call that
        // takes the freed slot sees both. A shadowed call is recorded by
        // the enforcing policies only.
        let shadow = self.params.shadow;
        if let (Some(hint), Some(until), Some(max_pause)) = (
            record.retry_after,
            view.cooldown_until,
            self.params.max_pause_ns,
        ) {
            if shadow.records(Policy::Cooldown, &record.permit) {
                recorded.cooldown =
                    cooldown::machine::extend(until, duration_nanos(hint), max_pause, now_ns);
            }
        }
        if let (Some(circuit), Some(p), true) = (
            view.circuit,
            &self.params.circuit,
            shadow.records(Policy::Circuit, &record.permit),
        ) {
            recorded.transition = circuit.record(
                p,
                record.permit.generation,
                record.permit.probe,
                record.outcome,
                record.duration,
                now_ns,
            );
        }
        if let (Some(slot), Some(slots)) = (record.permit.slot, view.in_flight) {
            slots.release(slot);
        }
        recorded
    }
}

/// The lean path of a pipeline on a memory store.
impl MemoryResource {
    /// Admits one attempt (on the unpartitioned state or a partition's) when
    /// nothing out of the ordinary happens: a closed (or disabled) circuit, a free slot, no
    /// cooldown in effect, a rate-limit permit.
    ///
    /// `Ok`: what the attempt holds, as a [`Ticket`]. `Err(Some(r))`: the
    /// circuit is open and its cooldown not over; the answer `admit` would
    /// give, with nothing to report. `Err(None)`: anything else; nothing
    /// was taken and the caller asks `admit`. `now` is called only when a
    /// policy needs the time. The attempt takes `weight` rate-limit
    /// permits (see [`rules`](crate::rate_limit::rules)); a weight the
    /// rate limiter can never grant is for `admit`, which says why.
    #[inline(always)]
    pub(crate) fn try_admit(
        &self,
        partition: Option<&PartitionKey>,
        weight: u32,
        now: &mut impl FnMut() -> u64,
    ) -> Result<Ticket, Option<Rejection>> {
        match partition {
            None => self.try_admit_in(self.root_view(), weight, now),
            // A partition counts the admission as a use of its key.
            Some(key) => self.try_admit_partition(key, weight, now()),
        }
    }

    /// [`try_admit`](Self::try_admit) on a partition, out of line so that
    /// the unpartitioned path stays small.
    #[inline(never)]
    fn try_admit_partition(
        &self,
        key: &PartitionKey,
        weight: u32,
        now_ns: u64,
    ) -> Result<Ticket, Option<Rejection>> {
        self.use_partition(key, now_ns, |view| {
            self.try_admit_in(view, weight, &mut || now_ns)
        })
    }

    #[inline(always)]
    fn try_admit_in(
        &self,
        view: View<'_>,
        weight: u32,
        now: &mut impl FnMut() -> u64,
    ) -> Result<Ticket, Option<Rejection>> {
        let params = &self.params;
        if weight != 1 {
            if let (Some(_), Some(p)) = (view.rate, &params.rate) {
                if !crate::rate_limit::rules::weight_fits(p, weight) {
                    // Refused at once, with its reason: `admit` says it.
                    return Err(None);
                }
            }
        }
        let mut generation = 0;
        if let Some(circuit) = view.circuit {
            match circuit.quick_admit(now) {
                Ok(g) => generation = g,
                // A circuit in shadow mode admits the call: `admit` says how.
                Err(_) if params.shadow.has(Policy::Circuit) => return Err(None),
                Err(open) => {
                    return Err(
                        open.map(|left| Rejection::new(RejectionReason::CircuitOpen, Some(left)))
                    )
                }
            }
        }
        let mut slot = None;
        if let (Some(slots), Some(max)) = (view.in_flight, params.bulkhead) {
            slot = slots.acquire(max);
            if slot.is_none() {
                return Err(None);
            }
        }
        let taken = Ticket::new(generation, slot);
        if let Some(until) = view.cooldown_until {
            if !cooldown::machine::admits(until, &mut *now) {
                give_back(view, taken.permit());
                return Err(None);
            }
        }
        if let (Some(rate), Some(p)) = (view.rate, &params.rate) {
            if rate.acquire(p, now(), weight).is_err() {
                give_back(view, taken.permit());
                return Err(None);
            }
        }
        Ok(taken)
    }

    /// Records the success of an attempt admitted by
    /// [`try_admit`](Self::try_admit): what `record` does for a success
    /// without a retry-after hint (such an attempt is never a probe).
    /// Returns the circuit transition it caused (a slow call may open the
    /// circuit).
    #[inline(always)]
    pub(crate) fn record_success(
        &self,
        partition: Option<&PartitionKey>,
        ticket: Ticket,
        duration_ns: u64,
        now_ns: u64,
    ) -> Option<CircuitTransition> {
        match partition {
            None => self.record_success_in(self.root_view(), ticket, duration_ns, now_ns),
            // Without a circuit or a bulkhead a success changes nothing: the
            // key is not looked up again (its admission was its last use).
            Some(_) if self.params.circuit.is_none() && self.params.bulkhead.is_none() => None,
            Some(key) => self.record_success_partition(key, ticket, duration_ns, now_ns),
        }
    }

    /// [`record_success`](Self::record_success) on a partition, out of line
    /// so that the unpartitioned path stays small.
    #[inline(never)]
    fn record_success_partition(
        &self,
        key: &PartitionKey,
        ticket: Ticket,
        duration_ns: u64,
        now_ns: u64,
    ) -> Option<CircuitTransition> {
        self.use_partition(key, now_ns, |view| {
            self.record_success_in(view, ticket, duration_ns, now_ns)
        })
    }

    #[inline(always)]
    fn record_success_in(
        &self,
        view: View<'_>,
        ticket: Ticket,
        duration_ns: u64,
        now_ns: u64,
    ) -> Option<CircuitTransition> {
        let mut transition = None;
        if let (Some(circuit), Some(p)) = (view.circuit, &self.params.circuit) {
            transition = circuit.record_success(p, ticket.generation(), duration_ns, now_ns);
        }
        if let (Some(slot), Some(slots)) = (ticket.slot(), view.in_flight) {
            slots.release(slot);
        }
        transition
    }
}

/// What an attempt admitted by [`MemoryResource::try_admit`] holds: the
/// circuit generation it was admitted in and its bulkhead slot, packed in
/// one word so that the ordinary path keeps it in a register. Such an
/// attempt is never a probe and never local: [`permit`](Self::permit) is
/// the [`Permit`] the store's full admission would have given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket(std::num::NonZeroU64);

impl Ticket {
    /// Bits 0..13: the generation; bit 13: a slot is held; bits 14..63:
    /// the slot; bit 63: set, so that the word is never zero.
    const GENERATION_BITS: u32 = 13;
    const HAS_SLOT: u64 = 1 << Self::GENERATION_BITS;
    const SLOT_SHIFT: u32 = Self::GENERATION_BITS + 1;
    const SLOT_MASK: u64 = (1 << (63 - Self::SLOT_SHIFT)) - 1;
    const SET: u64 = 1 << 63;

    /// A ticket of `generation` (already reduced to its 13 bits) holding
    /// `slot` (a memory slot id: a stripe index).
    #[inline(always)]
    fn new(generation: u64, slot: Option<u64>) -> Self {
        debug_assert!(generation < Self::HAS_SLOT);
        let slot = match slot {
            Some(s) => {
                debug_assert!(s <= Self::SLOT_MASK);
                Self::HAS_SLOT | ((s & Self::SLOT_MASK) << Self::SLOT_SHIFT)
            }
            None => 0,
        };
        Ticket(
            std::num::NonZeroU64::new(Self::SET | generation | slot)
                .expect("the set bit makes the word non-zero"),
        )
    }

    /// The circuit generation the attempt was admitted in.
    #[inline(always)]
    fn generation(self) -> u64 {
        self.0.get() & (Self::HAS_SLOT - 1)
    }

    /// The bulkhead slot the attempt holds.
    #[inline(always)]
    fn slot(self) -> Option<u64> {
        let bits = self.0.get();
        (bits & Self::HAS_SLOT != 0).then_some((bits >> Self::SLOT_SHIFT) & Self::SLOT_MASK)
    }

    /// The permit this ticket stands for.
    #[inline(always)]
    pub(crate) fn permit(self) -> Permit {
        Permit {
            probe: false,
            generation: self.generation(),
            slot: self.slot(),
            local: false,
            shadowed: false,
        }
    }
}

/// Gives back what the policies in shadow mode took for a call that is
/// shadowed now (see [`Walk::takes_part`]): a probe slot, a bulkhead slot.
#[cold]
fn drop_shadowed(view: View<'_>, permit: &mut Permit, walk: &Walk) {
    if !walk.takes_part(Policy::Bulkhead) {
        if let (Some(slot), Some(slots)) = (permit.slot.take(), view.in_flight) {
            slots.release(slot);
        }
    }
    if !walk.takes_part(Policy::Circuit) && permit.probe {
        permit.probe = false;
        if let Some(circuit) = view.circuit {
            circuit.release_probe(permit.generation);
        }
    }
}

/// Gives back what an admission took (probe slot, bulkhead slot).
#[inline]
fn give_back(view: View<'_>, permit: Permit) {
    if let (Some(slot), Some(slots)) = (permit.slot, view.in_flight) {
        slots.release(slot);
    }
    if permit.probe {
        if let Some(circuit) = view.circuit {
            circuit.release_probe(permit.generation);
        }
    }
}

impl ResourceState for MemoryResource {
    #[inline]
    fn admit(&self, request: &AdmitRequest<'_>) -> Result<Admission, StoreError> {
        let now_ns = duration_nanos(request.now);
        let none = &mut None;
        let lead = (0, None, request.weight);
        let step = (request.budget, request.shadowed);
        Ok(match request.partition {
            None => self.admit_in(self.root_view(), now_ns, lead, step, none),
            Some(_) if self.params.is_empty() => Admission::admitted(Permit::default()),
            Some(key) => self.use_partition(key, now_ns, |view| {
                self.admit_in(view, now_ns, lead, step, none)
            }),
        })
    }

    fn admit_reserving(
        &self,
        request: &AdmitRequest<'_>,
        reserve: Reserve,
    ) -> Result<(Admission, Option<Reservation>), StoreError> {
        let now_ns = duration_nanos(request.now);
        let lead = (
            duration_nanos(reserve.within),
            reserve.held.map(|r| duration_nanos(r.at)),
            // A held reservation is given back as it was taken.
            reserve.held.map_or(request.weight, |r| r.weight),
        );
        let mut reserved = None;
        let admission = match request.partition {
            None => self.admit_in(
                self.root_view(),
                now_ns,
                lead,
                (request.budget, request.shadowed),
                &mut reserved,
            ),
            Some(_) if self.params.is_empty() => Admission::admitted(Permit::default()),
            Some(key) => self.use_partition(key, now_ns, |view| {
                self.admit_in(
                    view,
                    now_ns,
                    lead,
                    (request.budget, request.shadowed),
                    &mut reserved,
                )
            }),
        };
        let reservation = reserved.map(|at| Reservation {
            at: Duration::from_nanos(at),
            weight: request.weight,
        });
        Ok((admission, reservation))
    }

    fn give_back_reservation(&self, partition: Option<&PartitionKey>, reservation: Reservation) {
        let Some(p) = &self.params.rate else { return };
        let at = duration_nanos(reservation.at);
        let undo = |view: View<'_>| {
            if let Some(rate) = view.rate {
                rate.give_back(p, at, reservation.weight);
            }
        };
        match partition {
            None => undo(self.root_view()),
            Some(key) => {
                self.read_partition(key, undo);
            }
        }
    }

    #[inline]
    fn record(&self, record: &Record<'_>) -> Result<Recorded, StoreError> {
        Ok(match record.partition {
            None => self.record_in(self.root_view(), record),
            Some(_) if self.params.is_empty() => Recorded::default(),
            Some(key) => self.use_partition(key, duration_nanos(record.now), |view| {
                self.record_in(view, record)
            }),
        })
    }

    fn release(&self, partition: Option<&PartitionKey>, permit: Permit) {
        match partition {
            None => give_back(self.root_view(), permit),
            Some(key) => {
                self.read_partition(key, |view| give_back(view, permit));
            }
        }
    }

    fn circuit_metrics(
        &self,
        partition: Option<&PartitionKey>,
        now: Duration,
    ) -> Result<CircuitMetrics, StoreError> {
        let Some(params) = &self.params.circuit else {
            return Ok(CircuitMetrics::closed_empty());
        };
        let now_ns = duration_nanos(now);
        Ok(match (partition, &self.root.circuit) {
            (None, Some(circuit)) => circuit.metrics(params, now_ns),
            (None, None) => CircuitMetrics::closed_empty(),
            // A key not in memory has a fresh circuit, not begun.
            (Some(key), _) => self
                .read_partition(key, |view| view.circuit.map(|c| c.metrics(params, now_ns)))
                .flatten()
                .unwrap_or_else(CircuitMetrics::closed_empty),
        })
    }

    fn control_circuit(
        &self,
        partition: Option<&PartitionKey>,
        control: CircuitControl,
        now: Duration,
    ) -> Result<Option<CircuitTransition>, StoreError> {
        if self.params.circuit.is_none() {
            return Ok(None);
        }
        let now_ns = duration_nanos(now);
        Ok(match (partition, &self.root.circuit) {
            (None, Some(circuit)) => circuit.control(control, now_ns),
            (None, None) => None,
            (Some(key), _) => self.use_partition(key, now_ns, |view| {
                view.circuit.and_then(|c| c.control(control, now_ns))
            }),
        })
    }

    fn in_flight(
        &self,
        partition: Option<&PartitionKey>,
        _now: Duration,
    ) -> Result<u32, StoreError> {
        let count = |view: View<'_>| view.in_flight.map_or(0, Slots::in_flight);
        Ok(match partition {
            None => count(self.root_view()),
            Some(key) => self.read_partition(key, count).unwrap_or(0),
        })
    }

    fn evict_idle(&self, now: Duration) -> usize {
        let Some(partitions) = self.partitions.get() else {
            return 0;
        };
        let now_ns = duration_nanos(now);
        partitions
            .shards
            .iter()
            .map(|shard| {
                shard
                    .write()
                    .sweep(&self.params, &partitions.hasher, now_ns)
            })
            .sum()
    }

    fn partitions(&self) -> usize {
        self.partitions
            .get()
            .map_or(0, |p| p.shards.iter().map(|s| s.read().len()).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::breaker::CircuitState;
    use crate::{Bulkhead, CircuitBreaker, Cooldown, RateLimiter};

    const MS: Duration = Duration::from_millis(1);

    fn admit(r: &dyn ResourceState, key: Option<&PartitionKey>, now: Duration) -> Admission {
        r.admit(&AdmitRequest {
            partition: key,
            now,
            weight: 1,
            budget: None,
            shadowed: false,
        })
        .unwrap()
    }

    fn record(
        r: &dyn ResourceState,
        key: Option<&PartitionKey>,
        permit: Permit,
        outcome: Outcome,
        retry_after: Option<Duration>,
        now: Duration,
    ) -> Recorded {
        r.record(&Record {
            partition: key,
            permit,
            outcome,
            duration: Duration::ZERO,
            retry_after,
            now,
        })
        .unwrap()
    }

    fn full_spec(name: &str) -> ResourceSpec {
        ResourceSpec::new(name)
            .with_circuit(CircuitBreaker::consecutive_failures(5))
            .with_bulkhead(Bulkhead::new(10))
            .with_cooldown(Cooldown::new())
            .with_rate_limit(RateLimiter::gcra(1000, Duration::from_secs(1)))
            .with_partition_idle(Duration::from_secs(60))
    }

    proptest::proptest! {
        /// Every partition key decides exactly as an unpartitioned resource
        /// of its own fed the same calls: the columns hold the same cells,
        /// whatever the mix of integer and string keys in a shard. Without a
        /// breaker (whose partial failure run may be dropped with an idle
        /// key) keys are also evicted between calls, which must change no
        /// decision. Times to the nanosecond from 0, 10^6 s or near the end
        /// of the clock.
        #[test]
        fn a_partition_decides_as_a_resource_of_its_own(
            which in 0usize..3,
            with_circuit in proptest::prelude::any::<bool>(),
            base in proptest::sample::select(vec![
                Duration::ZERO,
                Duration::from_secs(1_000_000),
                Duration::from_nanos(u64::MAX) - Duration::from_secs(100),
            ]),
            ops in proptest::collection::vec(
                (0usize..4, 0u64..1_500_000, 0u8..5, proptest::option::of(0u64..40)),
                1..150,
            ),
        ) {
            let limiter = [
                RateLimiter::gcra(2, Duration::from_millis(10)),
                RateLimiter::fixed_window(2, Duration::from_millis(10)),
                RateLimiter::sliding_window(2, Duration::from_millis(10)),
            ][which].clone();
            let spec = |name: &str| {
                let spec = ResourceSpec::new(name)
                    .with_bulkhead(Bulkhead::new(2))
                    .with_cooldown(Cooldown::new().max_pause(Duration::from_millis(30)))
                    .with_rate_limit(limiter.clone())
                    .with_partition_idle(Duration::ZERO);
                if with_circuit {
                    spec.with_circuit(
                        CircuitBreaker::consecutive_failures(2).cooldown(Duration::from_millis(20)),
                    )
                } else {
                    spec
                }
            };
            let keyed = MemoryStore::new().bind(&spec("keyed")).unwrap();
            let keys = [
                PartitionKey::from(1u64),
                PartitionKey::from("a"),
                PartitionKey::from(2u64),
                PartitionKey::from(String::from("b")),
            ];
            let singles: Vec<_> = keys
                .iter()
                .map(|_| MemoryStore::new().bind(&spec("single")).unwrap())
                .collect();
            let mut held: Vec<Vec<(Permit, Permit)>> = vec![Vec::new(); keys.len()];
            let mut now = base;
            for (k, step_ns, op, hint_ms) in ops {
                now += Duration::from_nanos(step_ns);
                let (key, single) = (&keys[k], &*singles[k]);
                match op {
                    0 | 1 => {
                        let a = admit(&*keyed, Some(key), now);
                        let b = admit(single, None, now);
                        proptest::prop_assert_eq!(a.decision.map(|_| ()), b.decision.map(|_| ()));
                        proptest::prop_assert_eq!(a.transition, b.transition);
                        if let (Ok(pa), Ok(pb)) = (a.decision, b.decision) {
                            held[k].push((pa, pb));
                        }
                    }
                    2 | 3 => {
                        if let Some((pa, pb)) = held[k].pop() {
                            let outcome = [Outcome::Failure, Outcome::Success][step_ns as usize % 2];
                            let hint = hint_ms.map(Duration::from_millis);
                            let a = record(&*keyed, Some(key), pa, outcome, hint, now);
                            let b = record(single, None, pb, outcome, hint, now);
                            proptest::prop_assert_eq!(a.transition, b.transition);
                            proptest::prop_assert_eq!(a.cooldown, b.cooldown);
                        }
                    }
                    _ => {
                        if !with_circuit {
                            keyed.evict_idle(now);
                        }
                    }
                }
                proptest::prop_assert_eq!(
                    keyed.in_flight(Some(key), now).unwrap(),
                    single.in_flight(None, now).unwrap()
                );
            }
        }
    }

    #[test]
    fn same_spec_shares_and_changed_spec_keeps_unchanged_cells() {
        let store = MemoryStore::new();
        let spec = ResourceSpec::new("svc")
            .with_circuit(CircuitBreaker::consecutive_failures(1))
            .with_bulkhead(Bulkhead::new(1));
        let a = store.bind(&spec).unwrap();
        let b = store.bind(&spec).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let p = admit(&*a, None, MS).decision.unwrap();
        assert!(record(&*a, None, p, Outcome::Failure, None, MS)
            .transition
            .is_some());
        let held = admit(&*a, None, MS * 2);
        assert!(held.decision.is_err(), "open");

        // Reload with another bulkhead size: the open circuit is kept.
        let reloaded = store
            .bind(&spec.clone().with_bulkhead(Bulkhead::new(2)))
            .unwrap();
        assert!(!Arc::ptr_eq(&a, &reloaded));
        assert_eq!(
            reloaded.circuit_metrics(None, MS).unwrap().state,
            CircuitState::Open
        );
        // ...while another circuit configuration starts closed.
        let other = store
            .bind(&spec.with_circuit(CircuitBreaker::consecutive_failures(2)))
            .unwrap();
        assert_eq!(
            other.circuit_metrics(None, MS).unwrap().state,
            CircuitState::Closed
        );
        assert!(format!("{store:?}").contains("resources: 1"));
    }

    #[test]
    fn idle_partitions_are_evicted_only_when_they_hold_nothing() {
        let store = MemoryStore::new();
        let r = store.bind(&full_spec("evict")).unwrap();
        let keys: Vec<PartitionKey> = (0u64..4).map(PartitionKey::from).collect();
        // 0: idle and empty; 1: a slot in flight; 2: a cooldown; 3: open.
        for k in &keys {
            let p = admit(&*r, Some(k), Duration::ZERO).decision.unwrap();
            match k {
                PartitionKey::Int(0) => {
                    record(&*r, Some(k), p, Outcome::Success, None, Duration::ZERO);
                }
                PartitionKey::Int(1) => {}
                PartitionKey::Int(2) => {
                    let hint = Some(Duration::from_secs(200));
                    record(&*r, Some(k), p, Outcome::Success, hint, Duration::ZERO);
                }
                _ => {
                    r.control_circuit(Some(k), CircuitControl::Isolate, Duration::ZERO)
                        .unwrap();
                    record(&*r, Some(k), p, Outcome::Success, None, Duration::ZERO);
                }
            }
        }
        assert_eq!(r.partitions(), 4);
        assert_eq!(r.evict_idle(Duration::from_secs(59)), 0, "not idle yet");
        assert_eq!(r.evict_idle(Duration::from_secs(60)), 1);
        assert_eq!(r.partitions(), 3);
        assert_eq!(r.in_flight(Some(&keys[1]), Duration::ZERO).unwrap(), 1);
        // Once the cooldown is over it goes too; the others hold on.
        assert_eq!(r.evict_idle(Duration::from_secs(200)), 1);
        assert_eq!(r.partitions(), 2);
    }

    #[test]
    fn rate_state_in_use_is_never_evicted() {
        let store = MemoryStore::new();
        let spec = ResourceSpec::new("rate-evict")
            .with_rate_limit(RateLimiter::fixed_window(1, Duration::from_secs(10)))
            .with_partition_idle(Duration::from_secs(1));
        let r = store.bind(&spec).unwrap();
        let k = PartitionKey::from("tenant");
        assert!(admit(&*r, Some(&k), Duration::ZERO).decision.is_ok());
        assert_eq!(r.evict_idle(Duration::from_secs(5)), 0);
        assert!(admit(&*r, Some(&k), Duration::from_secs(5))
            .decision
            .is_err());
        assert_eq!(r.evict_idle(Duration::from_secs(10)), 1);
    }

    #[test]
    fn shards_are_swept_as_they_grow() {
        let store = MemoryStore::new();
        let r = store
            .bind(&full_spec("sweep").with_partition_idle(Duration::from_secs(1)))
            .unwrap();
        for i in 0u64..2000 {
            let k = PartitionKey::from(i);
            let now = Duration::from_secs(i);
            let p = admit(&*r, Some(&k), now).decision.unwrap();
            record(&*r, Some(&k), p, Outcome::Success, None, now);
        }
        // Every key but the newest ones is idle; sweeping keeps the map small.
        assert!(
            r.partitions() < 2 * SHARDS * MIN_SWEEP_LEN,
            "{}",
            r.partitions()
        );
    }

    #[test]
    fn release_of_a_missing_partition_is_harmless() {
        let store = MemoryStore::new();
        let r = store.bind(&full_spec("missing")).unwrap();
        let k = PartitionKey::from(9u64);
        r.release(
            Some(&k),
            Permit {
                slot: Some(0),
                ..Permit::default()
            },
        );
        assert_eq!(r.partitions(), 0);
        assert_eq!(r.in_flight(Some(&k), Duration::ZERO).unwrap(), 0);
        assert_eq!(
            r.circuit_metrics(Some(&k), Duration::ZERO).unwrap(),
            CircuitMetrics::closed_empty()
        );
        assert_eq!(
            r.circuit_metrics(Some(&k), MS).unwrap().time_in_state,
            Duration::ZERO,
            "a fresh circuit has not begun"
        );
    }

    #[test]
    fn times_going_backwards_or_at_the_extremes_never_panic() {
        let breakers = [
            CircuitBreaker::consecutive_failures(2).cooldown(Duration::from_millis(3)),
            CircuitBreaker::failure_rate(0.5)
                .count_window(4)
                .minimum_calls(2)
                .slow_calls(0.5, Duration::from_millis(1))
                .cooldown(Duration::from_millis(3)),
            CircuitBreaker::failure_rate(0.5)
                .window(Duration::from_secs(2))
                .minimum_calls(2)
                .cooldown(Duration::from_secs(3600))
                .cooldown_growth(10.0, Duration::MAX),
        ];
        let limiters = [
            RateLimiter::gcra(5, Duration::from_millis(10)),
            RateLimiter::fixed_window(5, Duration::from_millis(10)),
            RateLimiter::sliding_window(5, Duration::from_millis(10)),
        ];
        let times = [
            Duration::from_secs(100),
            Duration::ZERO,
            Duration::from_nanos(u64::MAX),
            Duration::MAX,
            Duration::from_millis(1),
            Duration::from_secs(50),
            Duration::from_nanos(u64::MAX - 1),
            Duration::from_secs(99),
        ];
        let store = MemoryStore::new();
        for (i, breaker) in breakers.iter().enumerate() {
            for (j, limiter) in limiters.iter().enumerate() {
                let r = store
                    .bind(
                        &ResourceSpec::new(format!("extremes-{i}-{j}"))
                            .with_circuit(breaker.clone())
                            .with_bulkhead(Bulkhead::new(3))
                            .with_cooldown(Cooldown::new().max_pause(Duration::MAX))
                            .with_rate_limit(limiter.clone())
                            .with_partition_idle(Duration::ZERO),
                    )
                    .unwrap();
                let key = PartitionKey::from("k");
                for round in 0..4 {
                    for (n, now) in times.iter().enumerate() {
                        for part in [None, Some(&key)] {
                            if let Ok(p) = admit(&*r, part, *now).decision {
                                let outcome = [Outcome::Failure, Outcome::Success][(n + round) % 2];
                                let hint = (n % 3 == 0).then_some(Duration::MAX);
                                r.record(&Record {
                                    partition: part,
                                    permit: p,
                                    outcome,
                                    duration: Duration::MAX,
                                    retry_after: hint,
                                    now: *now,
                                })
                                .unwrap();
                            }
                            r.circuit_metrics(part, *now).unwrap();
                            r.in_flight(part, *now).unwrap();
                        }
                        r.evict_idle(*now);
                    }
                }
                assert_eq!(r.in_flight(None, Duration::ZERO).unwrap(), 0);
            }
        }
    }

    #[test]
    fn double_release_does_not_wrap_the_bulkhead() {
        let store = MemoryStore::new();
        let r = store.bind(&full_spec("double")).unwrap();
        let p = admit(&*r, None, Duration::ZERO).decision.unwrap();
        r.release(None, p);
        r.release(None, p);
        assert_eq!(r.in_flight(None, Duration::ZERO).unwrap(), 0);
        assert!(admit(&*r, None, Duration::ZERO).decision.is_ok());
    }

    /// Heap bytes per idle partition key of a resource of `spec`, over
    /// `keys` keys made by `key`, computed from the capacities of each
    /// shard's index and columns (the crate forbids unsafe code, so a
    /// counting global allocator is not available to its unit tests; the
    /// `memory` bench of `seawall-bench` counts with one).
    fn bytes_per_idle_key(
        spec: &ResourceSpec,
        keys: u64,
        key: impl Fn(u64) -> PartitionKey,
    ) -> f64 {
        let store = MemoryStore::new();
        let r = store.bind_memory(spec);
        for i in 0..keys {
            let k = key(i);
            let p = admit(&*r, Some(&k), Duration::ZERO).decision.unwrap();
            record(&*r, Some(&k), p, Outcome::Success, None, Duration::ZERO);
        }
        assert_eq!(r.partitions() as u64, keys);
        let partitions = r.partitions.get().unwrap();
        let bytes: usize = partitions
            .shards
            .iter()
            .map(|s| s.read().heap_bytes())
            .sum::<usize>()
            + std::mem::size_of_val(&*partitions.shards);
        bytes as f64 / keys as f64
    }

    fn gcra_only(name: &str) -> ResourceSpec {
        ResourceSpec::new(name)
            .with_rate_limit(RateLimiter::gcra(1000, Duration::from_secs(1)))
            .with_partition_idle(Duration::from_secs(60))
    }

    /// A partition holds the cells of its policies only: GCRA alone costs at
    /// most 48 bytes per idle integer key over one million keys (the
    /// index, the key, its last use and its TAT).
    #[test]
    fn bytes_per_idle_key_stay_under_budget() {
        let gcra = bytes_per_idle_key(&gcra_only("bytes-gcra"), 1_000_000, PartitionKey::from);
        println!("GCRA only, integer keys: {gcra:.1} B per idle key (1M keys)");
        assert!(gcra <= 48.0, "{gcra:.1} bytes per key");
        let names: Vec<&'static str> = (0..100_000u64)
            .map(|i| &*format!("key-{i}").leak())
            .collect();
        let named = bytes_per_idle_key(&gcra_only("bytes-named"), 100_000, |i| {
            PartitionKey::from(names[i as usize])
        });
        println!("GCRA only, static string keys: {named:.1} B per idle key (100k keys)");
        let full = bytes_per_idle_key(&full_spec("bytes-full"), 1_000_000, PartitionKey::from);
        println!(
            "breaker + bulkhead + cooldown + GCRA, integer keys: {full:.1} B per idle key (1M keys)"
        );
        // The consecutive-failures circuit (32 B: its word, the time of its
        // last transition, the duration of its last explicit open, where
        // its window would be), the slot count (4 B), the pause (8 B) on
        // top of the GCRA-only budget, plus 16 B: each shard's table grows
        // by doubling, and how keys fall into shards depends on the
        // hasher's seed of the run, so each measurement moves on its own
        // by several bytes per key (compared with the budget, not with the
        // GCRA-only measurement of the same run).
        assert!(full <= 48.0 + 48.0 + 16.0, "{full:.1} bytes per key");
    }

    #[test]
    fn a_partition_holds_only_the_columns_of_its_policies() {
        let store = MemoryStore::new();
        let r = store.bind_memory(&gcra_only("columns"));
        let k = PartitionKey::from(1u64);
        assert!(admit(&*r, Some(&k), Duration::ZERO).decision.is_ok());
        let partitions = r.partitions.get().unwrap();
        let (_, shard) = partitions.locate(&k);
        let map = shard.read();
        assert_eq!(map.len(), 1);
        assert!(map.circuit.is_empty() && map.in_flight.is_empty());
        assert!(map.cooldown_until.is_empty());
        assert!(matches!(map.keys, Keys::Ints(_)));
        assert!(map.rate.as_ref().and_then(|c| c.get(0)).is_some());
    }

    #[test]
    fn integer_and_string_keys_live_side_by_side() {
        let store = MemoryStore::new();
        let spec = ResourceSpec::new("mixed")
            .with_rate_limit(RateLimiter::fixed_window(1, Duration::from_secs(10)))
            .with_partition_idle(Duration::from_secs(1));
        let r = store.bind_memory(&spec);
        // Enough keys for every shard to hold integers first, then strings.
        let ints: Vec<PartitionKey> = (0u64..200).map(PartitionKey::from).collect();
        let strs: Vec<PartitionKey> = (0u64..200)
            .map(|i| PartitionKey::from(format!("{i}")))
            .collect();
        for k in ints.iter().chain(&strs) {
            assert!(
                admit(&*r, Some(k), Duration::ZERO).decision.is_ok(),
                "{k:?}"
            );
        }
        for k in ints.iter().chain(&strs) {
            assert!(
                admit(&*r, Some(k), Duration::ZERO).decision.is_err(),
                "{k:?} once"
            );
        }
        assert_eq!(r.partitions(), 400);
        // Half of them are used again later; the others go.
        for k in ints.iter().chain(&strs).step_by(2) {
            assert!(admit(&*r, Some(k), Duration::from_secs(10))
                .decision
                .is_ok());
        }
        assert_eq!(r.evict_idle(Duration::from_secs(10)), 200);
        assert_eq!(r.partitions(), 200);
        for (n, k) in ints.iter().chain(&strs).enumerate() {
            // A kept key still holds its permit; an evicted one starts fresh.
            let admitted = admit(&*r, Some(k), Duration::from_secs(10))
                .decision
                .is_ok();
            assert_eq!(admitted, n % 2 == 1, "{k:?}");
        }
    }
}
