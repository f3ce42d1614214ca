//! Leased mode for a bulkhead: a process holds a pool of bulkhead slots
//! leased from Redis (each an admission by the admission script's rule,
//! `lua/lease.lua`) and admits from it locally; a call's slot goes back to
//! the pool when it ends. The pool's slot leases are extended in the
//! background (`lua/extend.lua`); idle slots beyond one batch are given
//! back (the release script's). See the crate documentation,
//! [Leased mode](crate#leased-mode).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use seawall::breaker::{CircuitControl, CircuitMetrics, CircuitTransition};
use seawall::store::{
    Admission, AdmitRequest, Permit, Record, Recorded, Reservation, Reserve, ResourceState,
    StoreFuture,
};
use seawall::{PartitionKey, StoreError};

use crate::lease::{nanos, Leasing, UnderWay};
use crate::store::{RedisResource, Shared};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The pool of one leased bulkhead.
struct Pool {
    shared: Arc<Shared>,
    batch: u32,
    low: i64,
    ttl: Duration,
    /// The slot ids held.
    ids: Mutex<Vec<u64>>,
    /// Slots held and not in use (negative: slots in use whose lease was
    /// lost, paid back as their calls end).
    free: AtomicI64,
    /// Until when the pool's leases are known to hold, less the
    /// bulkhead's lease, plus the TTL (store's clock, nanoseconds): no
    /// local admission after it.
    valid_until: AtomicU64,
    /// The lease of more slots under way (one at a time), and its waiters.
    under_way: UnderWay,
    /// The caller's clock last seen (for the background work on the
    /// caller's clock).
    last_now: AtomicU64,
    /// The thread that extends the leases, grows and trims the pool.
    keeper: OnceLock<Option<std::thread::Thread>>,
    /// Growth asked of the keeper.
    grow_pending: AtomicBool,
    closed: AtomicBool,
}

/// What became of a lease of slots.
enum Leased {
    /// Slots taken, added to the pool.
    Granted,
    /// The bulkhead (or the restart hold) refused: the admission to answer.
    Refused(Admission),
}

impl Pool {
    fn clock(&self, now: Duration) -> u64 {
        nanos(self.shared.store_clock(now))
    }

    /// Takes a free slot of the pool: the free slots left, or `None`.
    #[inline]
    fn take(&self, clock: u64) -> Option<i64> {
        if clock >= self.valid_until.load(Ordering::Acquire) {
            return None;
        }
        let mut cur = self.free.load(Ordering::Acquire);
        loop {
            if cur < 1 {
                return None;
            }
            match self
                .free
                .compare_exchange_weak(cur, cur - 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(cur - 1),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Adds the slots of a lease sent at `sent`, `taken` of them for the
    /// caller.
    fn land(
        &self,
        reply: &[i64],
        sent: u64,
        now: Duration,
        taken: i64,
    ) -> Result<Leased, StoreError> {
        let admission = self.shared.lease_admission(reply, now)?;
        if admission.decision.is_err() {
            return Ok(Leased::Refused(admission));
        }
        let ids: Vec<u64> = reply
            .get(16..)
            .unwrap_or(&[])
            .iter()
            .filter_map(|&id| u64::try_from(id).ok())
            .collect();
        let n = i64::try_from(ids.len()).unwrap_or(0);
        {
            let mut pool = lock(&self.ids);
            pool.extend(ids);
            // The new leases hold from `sent`; the older ones as long as
            // their last extension says: the earlier end decides.
            let until = sent.saturating_add(nanos(self.ttl));
            if pool.len() == usize::try_from(n).unwrap_or(0) {
                self.valid_until.store(until, Ordering::Release);
            } else {
                self.valid_until.fetch_min(until, Ordering::AcqRel);
            }
        }
        self.free.fetch_add(n - taken, Ordering::AcqRel);
        Ok(Leased::Granted)
    }

    /// `true` when the pool holds slots whose leases are no longer known
    /// to hold (an extension failed): they are not admitted from, and no
    /// more are leased, until the keeper extends them.
    fn stale(&self, clock: u64) -> bool {
        clock >= self.valid_until.load(Ordering::Acquire) && !lock(&self.ids).is_empty()
    }

    /// Grows the pool by a batch, in the background (the keeper thread).
    fn grow_in_background(self: &Arc<Self>) {
        match self.keeper(true) {
            Some(thread) => thread.unpark(),
            None => self.under_way.finish(),
        }
    }

    /// The keeper thread, started at the first need; `grow` asks it for a
    /// growth.
    fn keeper(self: &Arc<Self>, grow: bool) -> Option<&std::thread::Thread> {
        if grow {
            self.grow_pending.store(true, Ordering::Release);
        }
        self.keeper
            .get_or_init(|| {
                let weak: Weak<Pool> = Arc::downgrade(self);
                let tick = self.ttl / 2;
                std::thread::Builder::new()
                    .name("seawall-redis-slots".into())
                    .spawn(move || keeper(&weak, tick))
                    .ok()
                    .map(|h| h.thread().clone())
            })
            .as_ref()
    }

    fn grow_sync(&self) {
        let now = Duration::from_nanos(self.last_now.load(Ordering::Acquire));
        let sent = self.clock(now);
        if let Ok(reply) = self.shared.slot_lease_sync(now, self.batch) {
            let _ = self.land(&reply, sent, now, 0);
        }
        self.under_way.finish();
    }

    /// Extends every slot lease of the pool; a slot whose lease had ended
    /// leaves the pool (and its count, paid back by the call using it if
    /// none is free). Then gives back idle slots beyond one batch.
    fn maintain(&self) {
        let now = Duration::from_nanos(self.last_now.load(Ordering::Acquire));
        let ids: Vec<u64> = lock(&self.ids).clone();
        if ids.is_empty() {
            return;
        }
        let sent = self.clock(now);
        if let Ok(held) = self.shared.extend_slots(now, &ids) {
            let lost: Vec<u64> = ids
                .iter()
                .zip(held.iter().chain(std::iter::repeat(&0)))
                .filter(|(_, &h)| h != 1)
                .map(|(id, _)| *id)
                .collect();
            let mut pool = lock(&self.ids);
            pool.retain(|id| !lost.contains(id));
            self.free
                .fetch_sub(i64::try_from(lost.len()).unwrap_or(0), Ordering::AcqRel);
            // Extended: valid from `sent` (slots added since hold longer).
            self.valid_until
                .store(sent.saturating_add(nanos(self.ttl)), Ordering::Release);
        }
        self.trim(i64::from(self.batch));
    }

    /// Gives back idle slots beyond `keep`.
    fn trim(&self, keep: i64) {
        loop {
            let cur = self.free.load(Ordering::Acquire);
            if cur <= keep {
                return;
            }
            if self
                .free
                .compare_exchange(cur, cur - 1, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            let id = lock(&self.ids).pop();
            if let Some(id) = id {
                self.shared.give_back_slot(id);
            }
        }
    }
}

/// The keeper of a pool: extends its leases every `tick` (half the TTL),
/// grows it when asked; ends with the resource.
fn keeper(pool: &Weak<Pool>, tick: Duration) {
    loop {
        std::thread::park_timeout(tick);
        let Some(pool) = pool.upgrade() else { return };
        if pool.closed.load(Ordering::Acquire) {
            return;
        }
        if pool.grow_pending.swap(false, Ordering::AcqRel) {
            pool.grow_sync();
        }
        if pool.shared.is_available() {
            pool.maintain();
        }
    }
}

/// A bulkhead admitted in leased mode.
pub(crate) struct SlotLeasedResource {
    exact: RedisResource,
    pool: Arc<Pool>,
}

pub(crate) fn bind(
    shared: Arc<Shared>,
    exact: RedisResource,
    leasing: &Leasing,
) -> Arc<dyn ResourceState> {
    Arc::new(SlotLeasedResource {
        exact,
        pool: Arc::new(Pool {
            shared,
            batch: leasing.batch_size(),
            low: i64::from(leasing.low_water_mark()),
            ttl: leasing.lease_ttl(),
            ids: Mutex::new(Vec::new()),
            free: AtomicI64::new(0),
            valid_until: AtomicU64::new(0),
            under_way: UnderWay::new(),
            last_now: AtomicU64::new(0),
            keeper: OnceLock::new(),
            grow_pending: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }),
    })
}

impl fmt::Debug for SlotLeasedResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotLeasedResource")
            .field("exact", &self.exact)
            .field("batch", &self.pool.batch)
            .field("free", &self.pool.free.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Drop for SlotLeasedResource {
    /// Gives back the idle slots, and ends the keeper.
    fn drop(&mut self) {
        let p = &self.pool;
        p.closed.store(true, Ordering::Release);
        if let Some(Some(thread)) = p.keeper.get() {
            thread.unpark();
        }
        p.trim(0);
    }
}

/// A permit of a slot of the pool: no slot id of its own (the call's slot
/// goes back to the pool).
fn pooled() -> Admission {
    Admission::admitted(Permit::default())
}

impl SlotLeasedResource {
    #[inline]
    fn leases(request: &AdmitRequest<'_>) -> bool {
        request.partition.is_none() && request.budget.is_none()
    }

    #[inline]
    fn take(&self, request: &AdmitRequest<'_>) -> bool {
        let p = &self.pool;
        p.last_now.store(nanos(request.now), Ordering::Relaxed);
        match p.take(p.clock(request.now)) {
            Some(left) => {
                if left <= p.low && p.under_way.claim() {
                    p.grow_in_background();
                }
                true
            }
            None => false,
        }
    }

    /// The pool has no free slot: this call leases a batch when no lease
    /// is under way (and takes one of it); else it waits for the lease
    /// under way and takes from the pool; else it is admitted exactly.
    fn admit_slow(&self, request: &AdmitRequest<'_>) -> Result<Admission, StoreError> {
        let p = &self.pool;
        for _ in 0..2 {
            if self.take(request) {
                return Ok(pooled());
            }
            if p.stale(p.clock(request.now)) {
                return self.stale_pool(request);
            }
            if p.under_way.claim() {
                let sent = p.clock(request.now);
                let out = match p.shared.slot_lease_sync(request.now, p.batch) {
                    Err(e) => p.shared.degraded(request, e),
                    Ok(reply) => match p.land(&reply, sent, request.now, 1) {
                        Ok(Leased::Granted) => Ok(pooled()),
                        Ok(Leased::Refused(a)) => Ok(a),
                        Err(e) => Err(e),
                    },
                };
                p.under_way.finish();
                // The keeper extends the pool from now on.
                p.keeper(false);
                return out;
            }
            p.under_way.wait_sync(p.shared.longest_wait());
        }
        self.exact.admit(request)
    }

    async fn admit_slow_async(&self, request: AdmitRequest<'_>) -> Result<Admission, StoreError> {
        let p = &self.pool;
        for _ in 0..2 {
            if self.take(&request) {
                return Ok(pooled());
            }
            if p.stale(p.clock(request.now)) {
                p.keeper(false).map(std::thread::Thread::unpark);
                return self.exact.admit_async(request).await;
            }
            if p.under_way.claim() {
                let sent = p.clock(request.now);
                let out = match p.shared.slot_lease_async(request.now, p.batch).await {
                    Err(e) => p.shared.degraded(&request, e),
                    Ok(reply) => match p.land(&reply, sent, request.now, 1) {
                        Ok(Leased::Granted) => Ok(pooled()),
                        Ok(Leased::Refused(a)) => Ok(a),
                        Err(e) => Err(e),
                    },
                };
                p.under_way.finish();
                p.keeper(false);
                return out;
            }
            p.under_way.wait_async(p.shared.longest_wait()).await;
        }
        self.exact.admit_async(request).await
    }

    /// The pool is stale: the keeper is woken to extend it, and the call is
    /// admitted exactly meanwhile (its own slot, with its own lease).
    fn stale_pool(&self, request: &AdmitRequest<'_>) -> Result<Admission, StoreError> {
        self.pool.keeper(false).map(std::thread::Thread::unpark);
        self.exact.admit(request)
    }

    /// A permit of the pool: its slot goes back to the pool.
    fn is_pooled(permit: &Permit) -> bool {
        !permit.local && permit.slot.is_none()
    }
}

impl ResourceState for SlotLeasedResource {
    fn admit(&self, request: &AdmitRequest<'_>) -> Result<Admission, StoreError> {
        if !Self::leases(request) {
            return self.exact.admit(request);
        }
        if self.take(request) {
            return Ok(pooled());
        }
        self.admit_slow(request)
    }

    fn admit_async<'a>(&'a self, request: AdmitRequest<'a>) -> StoreFuture<'a, Admission> {
        if !Self::leases(&request) {
            return self.exact.admit_async(request);
        }
        if self.take(&request) {
            return StoreFuture::ready(Ok(pooled()));
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return StoreFuture::ready(self.admit_slow(&request));
        }
        StoreFuture::boxed(self.admit_slow_async(request))
    }

    fn admit_reserving(
        &self,
        request: &AdmitRequest<'_>,
        reserve: Reserve,
    ) -> Result<(Admission, Option<Reservation>), StoreError> {
        self.exact.admit_reserving(request, reserve)
    }

    fn admit_reserving_async<'a>(
        &'a self,
        request: AdmitRequest<'a>,
        reserve: Reserve,
    ) -> StoreFuture<'a, (Admission, Option<Reservation>)> {
        self.exact.admit_reserving_async(request, reserve)
    }

    fn give_back_reservation(&self, partition: Option<&PartitionKey>, reservation: Reservation) {
        self.exact.give_back_reservation(partition, reservation);
    }

    /// A slot of the pool goes back to it, without a round trip; any other
    /// permit is recorded as in exact mode.
    fn record(&self, record: &Record<'_>) -> Result<Recorded, StoreError> {
        if record.partition.is_none() && Self::is_pooled(&record.permit) {
            self.pool.free.fetch_add(1, Ordering::AcqRel);
            return Ok(Recorded::default());
        }
        self.exact.record(record)
    }

    fn record_async<'a>(&'a self, record: Record<'a>) -> StoreFuture<'a, Recorded> {
        if record.partition.is_none() && Self::is_pooled(&record.permit) {
            self.pool.free.fetch_add(1, Ordering::AcqRel);
            return StoreFuture::ready(Ok(Recorded::default()));
        }
        self.exact.record_async(record)
    }

    fn release(&self, partition: Option<&PartitionKey>, permit: Permit) {
        if partition.is_none() && Self::is_pooled(&permit) {
            self.pool.free.fetch_add(1, Ordering::AcqRel);
            return;
        }
        self.exact.release(partition, permit);
    }

    fn circuit_metrics(
        &self,
        partition: Option<&PartitionKey>,
        now: Duration,
    ) -> Result<CircuitMetrics, StoreError> {
        self.exact.circuit_metrics(partition, now)
    }

    fn control_circuit(
        &self,
        partition: Option<&PartitionKey>,
        control: CircuitControl,
        now: Duration,
    ) -> Result<Option<CircuitTransition>, StoreError> {
        self.exact.control_circuit(partition, control, now)
    }

    /// Slots in use on Redis, every process's pool counted whole (in use
    /// or not).
    fn in_flight(
        &self,
        partition: Option<&PartitionKey>,
        now: Duration,
    ) -> Result<u32, StoreError> {
        self.exact.in_flight(partition, now)
    }
}
