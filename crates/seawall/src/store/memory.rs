//! The in-memory store.

use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasher;

use hashbrown::{DefaultHashBuilder, HashTable};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use super::*;
use crate::breaker::machine::{BreakerParams, Circuit};
use crate::breaker::{CircuitControl, CircuitMetrics, CircuitTransition};
use crate::clock::duration_nanos;
use crate::error::RejectionReason;
use crate::rate_limit::machine::{RateParams, RateState};

const NANOS_PER_MS: u64 = 1_000_000;
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
/// does not close an open circuit. Partitions of the new resource start
/// fresh. The store keeps every resource it has bound for as long as it
/// lives (resource names are expected to be few and fixed).
///
/// # Admission
/// [`admit`](ResourceState::admit) checks the circuit, the bulkhead, the
/// cooldown and the rate limit in that order, all or nothing: when a later
/// check refuses, the half-open probe slot and the bulkhead slot taken by
/// earlier ones are given back, and the rate limiter, last, takes a permit
/// only when the call is admitted.
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
///   `retry_after`; a failed or slow probe opens it again (one more trip,
///   cooldown `cooldown_for_trip(trips)`); when every probe succeeded it
///   closes with an empty window and no trips. Half-open has counts of its
///   own (the probes that succeeded), see
///   [`CircuitMetrics`](crate::breaker::CircuitMetrics).
/// - isolated (forced open) rejects every call, disabled (forced closed)
///   admits every call and records nothing; only a reset leaves either.
///
/// Every transition starts a new *generation*; the outcome of a call
/// admitted in an older generation is not recorded (its slots are still
/// given back). Resolutions of the state word: the end of a cooldown is
/// kept in whole milliseconds, rounded up (an end past 2^42 - 1 ms, about
/// 139 years after the clock's origin, keeps the circuit open until the
/// clock's latest instant); generations count modulo 8192;
/// trips saturate at 63; `half_open_calls` is capped at 2,097,151. A time
/// window counts the last `W` whole seconds, the current one included. A
/// circuit that never moved reports the time since the clock's origin as
/// its time in state.
///
/// # Cooldown
/// A retry-after hint `h` on [`record`](ResourceState::record) (any outcome)
/// moves the end of the pause to `max(end, now + min(h, max_pause))`: a
/// shorter hint never shrinks it. [`Recorded::cooldown`] is the time left
/// after the hint, `None` when no pause is in effect.
///
/// # Partitions
/// Each partition key gets its own circuit, bulkhead, cooldown and rate
/// limit, in one allocation per key (plus the window of a window-mode
/// breaker), in a map of 32 shards behind read-write locks. A key unused
/// for [`ResourceSpec::partition_idle`] is dropped when it holds nothing:
/// no slot in flight, a circuit that is plain closed (not open, half-open,
/// isolated or disabled; a partial window may be lost), no cooldown in
/// effect, and a rate limiter whose state equals fresh state (no permit of
/// the current window or period taken), so that eviction never lets more
/// calls through than the limit. Keys are swept when a shard has doubled in
/// size since its last sweep, and by [`evict_idle`](ResourceState::evict_idle).
/// An idle key costs about 135 bytes of heap with a consecutive-failures
/// breaker, a bulkhead, a cooldown and a GCRA limiter (integer key).
///
/// # Costs
/// Admitting and recording on an unpartitioned resource allocate nothing
/// (a sliding window of more than 4096 allocates each further chunk of its
/// log once, on first use). A closed circuit admits with one atomic load, a
/// consecutive-mode success is one load, a bulkhead slot is one
/// compare-and-swap to take and one `fetch_sub` to give back, a cooldown
/// check is one load, a GCRA or fixed-window permit one load and one
/// compare-and-swap, a sliding-window permit two loads, one
/// compare-and-swap and one store. Nothing takes a lock.
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

impl MemoryStore {
    /// [`StateStore::bind`] with the concrete type, so that pipelines on a
    /// memory store call it without dynamic dispatch.
    pub(crate) fn bind_memory(&self, spec: &ResourceSpec) -> Arc<MemoryResource> {
        let mut registry = self.registry();
        let previous = registry.get(&spec.name);
        if let Some(previous) = previous.filter(|p| p.spec == *spec) {
            return Arc::clone(previous);
        }
        let resource = Arc::new(MemoryResource::new(spec, previous.map(|p| &**p)));
        registry.insert(spec.name.clone(), Arc::clone(&resource));
        resource
    }
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
    idle_ns: u64,
}

impl Params {
    fn new(spec: &ResourceSpec) -> Self {
        Params {
            circuit: spec.circuit.as_ref().map(BreakerParams::new),
            bulkhead: spec.bulkhead.as_ref().map(|b| b.max_concurrent),
            max_pause_ns: spec.cooldown.as_ref().map(|c| duration_nanos(c.max_pause)),
            rate: spec.rate_limit.as_ref().map(RateParams::new),
            idle_ns: duration_nanos(spec.partition_idle),
        }
    }

    fn is_empty(&self) -> bool {
        self.circuit.is_none()
            && self.bulkhead.is_none()
            && self.max_pause_ns.is_none()
            && self.rate.is_none()
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
}

/// The state of one partition key: every policy in one allocation.
#[derive(Debug)]
struct Cells {
    circuit: Circuit,
    in_flight: AtomicU32,
    cooldown_until: AtomicU64,
    /// The last admission or record, in milliseconds rounded up.
    last_used_ms: AtomicU64,
    rate: RateState,
}

impl Cells {
    fn new(params: &Params, now_ns: u64) -> Self {
        Cells {
            circuit: params
                .circuit
                .as_ref()
                .map_or_else(Circuit::unused, Circuit::new),
            in_flight: AtomicU32::new(0),
            cooldown_until: AtomicU64::new(0),
            last_used_ms: AtomicU64::new(now_ns.div_ceil(NANOS_PER_MS)),
            rate: RateState::new(params.rate.as_ref()),
        }
    }

    fn touch(&self, now_ns: u64) {
        let ms = now_ns.div_ceil(NANOS_PER_MS);
        if self.last_used_ms.load(Ordering::Relaxed) < ms {
            self.last_used_ms.fetch_max(ms, Ordering::Relaxed);
        }
    }

    fn is_evictable(&self, params: &Params, now_ns: u64) -> bool {
        let last_ns = self
            .last_used_ms
            .load(Ordering::Relaxed)
            .saturating_mul(NANOS_PER_MS);
        now_ns.saturating_sub(last_ns) >= params.idle_ns
            && self.in_flight.load(Ordering::Acquire) == 0
            && self.circuit.is_idle()
            && self.cooldown_until.load(Ordering::Acquire) <= now_ns
            && self.rate.is_idle(params.rate.as_ref(), now_ns)
    }
}

/// The cells one operation works on (root or partition).
#[derive(Debug, Clone, Copy)]
struct View<'a> {
    circuit: Option<&'a Circuit>,
    in_flight: Option<Slots<'a>>,
    cooldown_until: Option<&'a AtomicU64>,
    rate: Option<&'a RateState>,
}

/// One shard of a partition map, on a cache line pair of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    map: RwLock<ShardMap>,
}

#[derive(Debug, Default)]
struct ShardMap {
    cells: HashTable<(PartitionKey, Box<Cells>)>,
    /// Keys left after the last sweep.
    swept_len: usize,
}

impl Shard {
    fn read(&self) -> RwLockReadGuard<'_, ShardMap> {
        // Every write to the map is a single insert or retain: a panic while
        // it is held cannot leave it inconsistent.
        self.map.read().unwrap_or_else(|e| e.into_inner())
    }
    fn write(&self) -> RwLockWriteGuard<'_, ShardMap> {
        self.map.write().unwrap_or_else(|e| e.into_inner())
    }
}

struct Partitions {
    /// Keyed per store: the hash of a key is not known outside the process.
    hasher: DefaultHashBuilder,
    shards: Box<[Shard]>,
}

impl Partitions {
    fn new() -> Self {
        Partitions {
            hasher: DefaultHashBuilder::default(),
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        }
    }

    /// The hash of `key` (computed once per lookup) and its shard. The
    /// shard is chosen by middle bits of the hash: the table inside uses
    /// the low bits for the bucket and the top 7 as the tag.
    #[inline]
    fn locate(&self, key: &PartitionKey) -> (u64, &Shard) {
        let hash = self.hasher.hash_one(key);
        (hash, &self.shards[((hash >> 32) % SHARDS as u64) as usize])
    }

    fn hash(&self, key: &PartitionKey) -> u64 {
        self.hasher.hash_one(key)
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
        // configured the same way in both.
        let keep = |same: bool| previous.filter(|_| same).map(|p| &p.root);
        let root = Root {
            circuit: params.circuit.as_ref().map(|p| {
                keep(previous.is_some_and(|prev| prev.spec.circuit == spec.circuit))
                    .and_then(|r| r.circuit.clone())
                    .unwrap_or_else(|| Arc::new(Padded(Circuit::new(p))))
            }),
            in_flight: params.bulkhead.map(|max| {
                keep(previous.is_some_and(|prev| prev.spec.bulkhead == spec.bulkhead))
                    .and_then(|r| r.in_flight.clone())
                    .unwrap_or_else(|| Arc::new(StripedSlots::new(max)))
            }),
            cooldown_until: params.max_pause_ns.map(|_| {
                keep(previous.is_some_and(|prev| prev.spec.cooldown == spec.cooldown))
                    .and_then(|r| r.cooldown_until.clone())
                    .unwrap_or_default()
            }),
            rate: params.rate.as_ref().map(|p| {
                keep(previous.is_some_and(|prev| prev.spec.rate_limit == spec.rate_limit))
                    .and_then(|r| r.rate.clone())
                    .unwrap_or_else(|| Arc::new(Padded(RateState::shared(Some(p)))))
            }),
        };
        MemoryResource {
            spec: spec.clone(),
            params,
            root,
            partitions: OnceLock::new(),
        }
    }

    #[inline]
    fn root_view(&self) -> View<'_> {
        View {
            circuit: self.root.circuit.as_deref().map(|c| &c.0),
            in_flight: self.root.in_flight.as_deref().map(Slots::Striped),
            cooldown_until: self.root.cooldown_until.as_deref().map(|c| &c.0),
            rate: self.root.rate.as_deref().map(|r| &r.0),
        }
    }

    fn cells_view<'a>(&self, cells: &'a Cells) -> View<'a> {
        View {
            circuit: self.params.circuit.as_ref().map(|_| &cells.circuit),
            in_flight: self.params.bulkhead.map(|_| Slots::One(&cells.in_flight)),
            cooldown_until: self.params.max_pause_ns.map(|_| &cells.cooldown_until),
            rate: self.params.rate.as_ref().map(|_| &cells.rate),
        }
    }

    /// Runs `f` on the cells of `key`, creating them if needed; counts as a
    /// use of the key at `now_ns`.
    fn use_partition<R>(&self, key: &PartitionKey, now_ns: u64, f: impl FnOnce(&Cells) -> R) -> R {
        let partitions = self.partitions.get_or_init(Partitions::new);
        let (hash, shard) = partitions.locate(key);
        let same = |(k, _): &(PartitionKey, Box<Cells>)| k == key;
        {
            let map = shard.read();
            if let Some((_, cells)) = map.cells.find(hash, same) {
                cells.touch(now_ns);
                return f(cells);
            }
        }
        let mut map = shard.write();
        if map.cells.find(hash, same).is_none() {
            let threshold = (2 * map.swept_len).max(MIN_SWEEP_LEN);
            if map.cells.len() >= threshold {
                self.sweep(&mut map, now_ns);
            }
        }
        let (_, cells) = map
            .cells
            .entry(hash, same, |(k, _)| partitions.hash(k))
            .or_insert_with(|| (key.clone(), Box::new(Cells::new(&self.params, now_ns))))
            .into_mut();
        cells.touch(now_ns);
        f(cells)
    }

    /// Runs `f` on the cells of `key` if it has any.
    fn read_partition<R>(&self, key: &PartitionKey, f: impl FnOnce(&Cells) -> R) -> Option<R> {
        let (hash, shard) = self.partitions.get()?.locate(key);
        let map = shard.read();
        map.cells
            .find(hash, |(k, _)| k == key)
            .map(|(_, cells)| f(cells))
    }

    /// Drops the evictable keys of one shard; returns how many.
    fn sweep(&self, map: &mut ShardMap, now_ns: u64) -> usize {
        let before = map.cells.len();
        map.cells
            .retain(|(_, cells)| !cells.is_evictable(&self.params, now_ns));
        map.swept_len = map.cells.len();
        before - map.cells.len()
    }

    #[inline]
    fn admit_in(&self, view: View<'_>, now_ns: u64) -> Admission {
        let params = &self.params;
        let mut permit = Permit::default();
        let mut transition = None;
        let refuse = |reason, retry_after, transition| Admission {
            decision: Err(Rejection::new(reason, retry_after)),
            transition,
            degraded: None,
        };
        if let (Some(circuit), Some(p)) = (view.circuit, &params.circuit) {
            let answer = circuit.admit(p, now_ns);
            transition = answer.transition;
            match answer.decision {
                Ok((generation, probe)) => {
                    permit.generation = generation;
                    permit.probe = probe;
                }
                Err(retry_after) => {
                    return refuse(RejectionReason::CircuitOpen, retry_after, transition)
                }
            }
        }
        if let (Some(slots), Some(max)) = (view.in_flight, params.bulkhead) {
            let Some(slot) = slots.acquire(max) else {
                give_back(view, permit);
                return refuse(RejectionReason::BulkheadFull, None, transition);
            };
            permit.slot = Some(slot);
        }
        if let Some(until) = view.cooldown_until {
            let until = until.load(Ordering::Acquire);
            if now_ns < until {
                give_back(view, permit);
                let left = Duration::from_nanos(until - now_ns);
                return refuse(RejectionReason::CooldownActive, Some(left), transition);
            }
        }
        if let (Some(rate), Some(p)) = (view.rate, &params.rate) {
            if let Err(retry_after) = rate.acquire(p, now_ns) {
                give_back(view, permit);
                return refuse(RejectionReason::RateLimited, Some(retry_after), transition);
            }
        }
        Admission {
            decision: Ok(permit),
            transition,
            degraded: None,
        }
    }

    #[inline]
    fn record_in(&self, view: View<'_>, record: &Record<'_>) -> Recorded {
        let now_ns = duration_nanos(record.now);
        let mut recorded = Recorded::default();
        // The cooldown and the circuit first, the slot last: a call that
        // takes the freed slot sees both.
        if let (Some(hint), Some(until), Some(max_pause)) = (
            record.retry_after,
            view.cooldown_until,
            self.params.max_pause_ns,
        ) {
            let wanted = now_ns.saturating_add(duration_nanos(hint).min(max_pause));
            let end = until.fetch_max(wanted, Ordering::AcqRel).max(wanted);
            if end > now_ns {
                recorded.cooldown = Some(Duration::from_nanos(end - now_ns));
            }
        }
        if let (Some(circuit), Some(p)) = (view.circuit, &self.params.circuit) {
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
    /// `Ok`: the permit is in `out` (written in place: the caller's guard
    /// holds it from the start, nothing is copied). `Err(Some(r))`: the
    /// circuit is open and its cooldown not over; the answer `admit` would
    /// give, with nothing to report. `Err(None)`: anything else; nothing
    /// was taken and the caller asks `admit`. `out` is `None` after an
    /// `Err`. `now` is called only when a policy needs the time.
    #[inline]
    pub(crate) fn try_admit(
        &self,
        partition: Option<&PartitionKey>,
        now: &mut impl FnMut() -> u64,
        out: &mut Option<Permit>,
    ) -> Result<(), Option<Rejection>> {
        match partition {
            None => self.try_admit_in(self.root_view(), now, out),
            Some(key) => {
                // A partition counts the admission as a use of its key.
                let now_ns = now();
                self.use_partition(key, now_ns, |cells| {
                    self.try_admit_in(self.cells_view(cells), &mut || now_ns, out)
                })
            }
        }
    }

    #[inline(always)]
    fn try_admit_in(
        &self,
        view: View<'_>,
        now: &mut impl FnMut() -> u64,
        out: &mut Option<Permit>,
    ) -> Result<(), Option<Rejection>> {
        let params = &self.params;
        let mut generation = 0;
        if let Some(circuit) = view.circuit {
            match circuit.quick_admit(now) {
                Ok(g) => generation = g,
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
        let taken = Permit {
            generation,
            slot,
            ..Permit::default()
        };
        if let Some(until) = view.cooldown_until {
            let until = until.load(Ordering::Acquire);
            if until != 0 && now() < until {
                give_back(view, taken);
                return Err(None);
            }
        }
        if let (Some(rate), Some(p)) = (view.rate, &params.rate) {
            if rate.acquire(p, now()).is_err() {
                give_back(view, taken);
                return Err(None);
            }
        }
        *out = Some(taken);
        Ok(())
    }

    /// Records a success of a permit from [`try_admit`](Self::try_admit):
    /// what `record` does for a success without a retry-after hint. Returns
    /// the circuit transition it caused (a slow call may open the circuit).
    #[inline(always)]
    pub(crate) fn record_success(
        &self,
        partition: Option<&PartitionKey>,
        permit: Permit,
        duration: Duration,
        now_ns: u64,
    ) -> Option<CircuitTransition> {
        match partition {
            None => self.record_success_in(self.root_view(), permit, duration, now_ns),
            Some(key) => self.use_partition(key, now_ns, |cells| {
                self.record_success_in(self.cells_view(cells), permit, duration, now_ns)
            }),
        }
    }

    #[inline(always)]
    fn record_success_in(
        &self,
        view: View<'_>,
        permit: Permit,
        duration: Duration,
        now_ns: u64,
    ) -> Option<CircuitTransition> {
        let mut transition = None;
        if let (Some(circuit), Some(p)) = (view.circuit, &self.params.circuit) {
            transition = if permit.probe {
                circuit.record(
                    p,
                    permit.generation,
                    true,
                    Outcome::Success,
                    duration,
                    now_ns,
                )
            } else {
                circuit.record_success(p, permit.generation, duration, now_ns)
            };
        }
        if let (Some(slot), Some(slots)) = (permit.slot, view.in_flight) {
            slots.release(slot);
        }
        transition
    }
}

/// Takes a bulkhead slot: never lets the count pass `max`, even transiently.
#[inline]
fn acquire_slot(in_flight: &AtomicU32, max: u32) -> bool {
    let mut current = in_flight.load(Ordering::Relaxed);
    loop {
        if current >= max {
            return false;
        }
        match in_flight.compare_exchange_weak(
            current,
            current + 1,
            Ordering::Acquire,
            Ordering::Relaxed,
        ) {
            Ok(_) => return true,
            Err(actual) => current = actual,
        }
    }
}

#[inline]
fn release_slot(in_flight: &AtomicU32) {
    if in_flight.fetch_sub(1, Ordering::Release) == 0 {
        // A permit given back twice: undo rather than wrap around.
        in_flight.fetch_add(1, Ordering::Relaxed);
    }
}

/// The bulkhead slots of a view: one counter (a partition) or stripes
/// (the unpartitioned state).
#[derive(Debug, Clone, Copy)]
enum Slots<'a> {
    One(&'a AtomicU32),
    Striped(&'a StripedSlots),
}

impl Slots<'_> {
    /// Takes a slot: its id for [`release`](Self::release), or `None` when
    /// all `max` are taken.
    #[inline]
    fn acquire(self, max: u32) -> Option<u64> {
        match self {
            Slots::One(in_flight) => acquire_slot(in_flight, max).then_some(0),
            Slots::Striped(slots) => slots.acquire(),
        }
    }

    #[inline]
    fn release(self, slot: u64) {
        match self {
            Slots::One(in_flight) => release_slot(in_flight),
            Slots::Striped(slots) => slots.release(slot),
        }
    }
}

/// The most stripes a bulkhead is split into.
const MAX_STRIPES: usize = 16;

/// The bulkhead of the unpartitioned state: its `max` slots split into
/// stripes, each on cache lines of its own, so that threads taking and
/// giving back slots at the same time do not write to the same line. A
/// thread takes from its own stripe first and from the others in turn when
/// it is full; each stripe holds a fixed share of `max`, so the slots taken
/// never number more than `max`, even transiently.
#[derive(Debug)]
struct StripedSlots {
    stripes: Box<[Stripe]>,
}

#[derive(Debug)]
#[repr(align(128))]
struct Stripe {
    in_flight: AtomicU32,
    cap: u32,
}

impl StripedSlots {
    /// A power of two of stripes: at most one per core, each holding at
    /// least one slot.
    fn new(max: u32) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_stripes(max, cores)
    }

    fn with_stripes(max: u32, wanted: usize) -> Self {
        let by_cores = wanted.max(1).next_power_of_two().min(MAX_STRIPES);
        // The largest power of two not above `max` (at least 1).
        let by_slots = 1usize << (u32::BITS - 1 - max.max(1).leading_zeros());
        let n = by_cores.min(by_slots) as u32;
        StripedSlots {
            stripes: (0..n)
                .map(|i| Stripe {
                    in_flight: AtomicU32::new(0),
                    cap: max / n + u32::from(i < max % n),
                })
                .collect(),
        }
    }

    #[inline]
    fn acquire(&self) -> Option<u64> {
        let mask = self.stripes.len() - 1;
        let home = stripe_hint() & mask;
        for k in 0..self.stripes.len() {
            let i = (home + k) & mask;
            let stripe = &self.stripes[i];
            if acquire_slot(&stripe.in_flight, stripe.cap) {
                return Some(i as u64);
            }
        }
        None
    }

    #[inline]
    fn release(&self, slot: u64) {
        if let Some(stripe) = self.stripes.get(slot as usize) {
            release_slot(&stripe.in_flight);
        }
    }

    fn in_flight(&self) -> u32 {
        self.stripes
            .iter()
            .map(|s| s.in_flight.load(Ordering::Acquire))
            .sum()
    }
}

/// The stripe a thread tries first: threads are numbered in the order they
/// first ask, so that threads working at the same time start on different
/// stripes.
#[inline]
fn stripe_hint() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static HINT: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    HINT.try_with(|hint| {
        let mut h = hint.get();
        if h == usize::MAX {
            h = NEXT.fetch_add(1, Ordering::Relaxed) & (usize::MAX >> 1);
            hint.set(h);
        }
        h
    })
    .unwrap_or(0)
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
        Ok(match request.partition {
            None => self.admit_in(self.root_view(), now_ns),
            Some(_) if self.params.is_empty() => Admission::admitted(Permit::default()),
            Some(key) => self.use_partition(key, now_ns, |cells| {
                self.admit_in(self.cells_view(cells), now_ns)
            }),
        })
    }

    #[inline]
    fn record(&self, record: &Record<'_>) -> Result<Recorded, StoreError> {
        Ok(match record.partition {
            None => self.record_in(self.root_view(), record),
            Some(_) if self.params.is_empty() => Recorded::default(),
            Some(key) => self.use_partition(key, duration_nanos(record.now), |cells| {
                self.record_in(self.cells_view(cells), record)
            }),
        })
    }

    fn release(&self, partition: Option<&PartitionKey>, permit: Permit) {
        match partition {
            None => give_back(self.root_view(), permit),
            Some(key) => {
                self.read_partition(key, |cells| give_back(self.cells_view(cells), permit));
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
            // A key not in memory has a fresh circuit, closed since time 0
            // like every circuit that never moved.
            (Some(key), _) => self
                .read_partition(key, |cells| cells.circuit.metrics(params, now_ns))
                .unwrap_or_else(|| CircuitMetrics {
                    time_in_state: now,
                    ..CircuitMetrics::closed_empty()
                }),
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
            (Some(key), _) => {
                self.use_partition(key, now_ns, |cells| cells.circuit.control(control, now_ns))
            }
        })
    }

    fn in_flight(
        &self,
        partition: Option<&PartitionKey>,
        _now: Duration,
    ) -> Result<u32, StoreError> {
        let load = |in_flight: &AtomicU32| in_flight.load(Ordering::Acquire);
        Ok(match partition {
            None => self
                .root
                .in_flight
                .as_deref()
                .map_or(0, StripedSlots::in_flight),
            Some(key) => self
                .read_partition(key, |cells| load(&cells.in_flight))
                .unwrap_or(0),
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
            .map(|shard| self.sweep(&mut shard.write(), now_ns))
            .sum()
    }

    fn partitions(&self) -> usize {
        self.partitions
            .get()
            .map_or(0, |p| p.shards.iter().map(|s| s.read().cells.len()).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;

    proptest! {
        /// On one thread, striped slots behave exactly like one counter of
        /// `max`: a slot is refused only when `max` are taken, whatever the
        /// number of stripes and the order slots are given back in.
        #[test]
        fn striped_slots_count_like_one_counter(
            max in 1u32..40,
            wanted in 1usize..20,
            ops in proptest::collection::vec(any::<(bool, prop::sample::Index)>(), 1..200),
        ) {
            let slots = StripedSlots::with_stripes(max, wanted);
            prop_assert!(slots.stripes.len().is_power_of_two());
            prop_assert!(slots.stripes.iter().all(|s| s.cap >= 1));
            prop_assert_eq!(slots.stripes.iter().map(|s| s.cap).sum::<u32>(), max);
            let mut held = Vec::new();
            for (take, which) in ops {
                if take || held.is_empty() {
                    match slots.acquire() {
                        Some(slot) => held.push(slot),
                        None => prop_assert_eq!(held.len() as u32, max),
                    }
                    prop_assert!(held.len() as u32 <= max);
                } else {
                    slots.release(held.swap_remove(which.index(held.len())));
                }
                prop_assert_eq!(slots.in_flight(), held.len() as u32);
            }
        }
    }

    #[test]
    fn striped_slots_never_pass_max_across_threads() {
        use std::sync::atomic::AtomicU32;
        for (max, stripes) in [(1, 8), (3, 8), (5, 4), (64, 16)] {
            let slots = StripedSlots::with_stripes(max, stripes);
            let holders = AtomicU32::new(0);
            let peak = AtomicU32::new(0);
            let taken = AtomicU32::new(0);
            std::thread::scope(|scope| {
                for _ in 0..8 {
                    scope.spawn(|| {
                        for _ in 0..5_000 {
                            if let Some(slot) = slots.acquire() {
                                let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                                peak.fetch_max(now, Ordering::SeqCst);
                                taken.fetch_add(1, Ordering::Relaxed);
                                std::hint::spin_loop();
                                holders.fetch_sub(1, Ordering::SeqCst);
                                slots.release(slot);
                            }
                        }
                    });
                }
            });
            assert!(
                peak.load(Ordering::SeqCst) <= max,
                "max {max}: peak {peak:?}"
            );
            assert!(taken.load(Ordering::Relaxed) > 0);
            assert_eq!(slots.in_flight(), 0);
        }
    }
    use crate::breaker::CircuitState;
    use crate::{Bulkhead, CircuitBreaker, Cooldown, RateLimiter};

    const MS: Duration = Duration::from_millis(1);

    fn admit(r: &dyn ResourceState, key: Option<&PartitionKey>, now: Duration) -> Admission {
        r.admit(&AdmitRequest {
            partition: key,
            now,
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
            MS,
            "a fresh circuit has been closed since time 0"
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

    /// The memory held per idle partition key, computed from the sizes of
    /// the map slot and the cells allocation (the crate forbids unsafe code,
    /// so a counting global allocator is not available to tests).
    ///
    /// - map slot: `(PartitionKey, Box<Cells>)` plus hashbrown's one control
    ///   byte, divided by the table's load (between 7/16 and 7/8 once it
    ///   has grown; measured below on 10,000 keys);
    /// - the `Cells` allocation, rounded up to glibc's malloc chunk
    ///   (`size + 8` rounded up to 16).
    ///
    /// Integer and `&'static str` keys own no heap memory; a `Shared` key
    /// shares the caller's `Arc<str>`.
    #[test]
    fn bytes_per_idle_key_stay_under_budget() {
        let store = MemoryStore::new();
        let r = store.bind(&full_spec("bytes")).unwrap();
        let keys = 10_000u64;
        for i in 0..keys {
            let k = PartitionKey::from(i);
            let p = admit(&*r, Some(&k), Duration::ZERO).decision.unwrap();
            record(&*r, Some(&k), p, Outcome::Success, None, Duration::ZERO);
        }
        let resource = store.registry().get("bytes").cloned().unwrap();
        let partitions = resource.partitions.get().unwrap();
        let slot = std::mem::size_of::<(PartitionKey, Box<Cells>)>() + 1;
        let table_bytes: usize = partitions
            .shards
            .iter()
            .map(|s| {
                let capacity = s.read().cells.capacity();
                // hashbrown keeps capacity = buckets * 7 / 8 (buckets >= 8).
                (capacity * 8 / 7).next_power_of_two() * slot
            })
            .sum();
        let cells = std::mem::size_of::<Cells>();
        let chunk = (cells + 8).div_ceil(16) * 16;
        let per_key = (table_bytes + chunk * keys as usize) as f64 / keys as f64;
        assert_eq!(cells, 64, "cells layout changed");
        assert!(per_key < 200.0, "{per_key:.0} bytes per key");
        println!("cells {cells} B (chunk {chunk} B), slot {slot} B, {per_key:.0} B per idle key");
    }
}
