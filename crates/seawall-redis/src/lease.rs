//! Leased mode for a rate limit: a process leases a batch of rate-limit
//! permits from Redis and admits from it locally (see the crate
//! documentation, [Leased mode](crate#leased-mode)); the bulkhead's is in
//! `slots.rs`.
//!
//! The lease is the admission script's weighted admission of a batch (run
//! by `lua/lease.lua`, which adds the instant to give it back with); the
//! give-back is the release script's, as for a reservation. Locally, the
//! batch is one atomic counter, taken from with a compare-and-swap, and
//! the instant it expires: an admission from it costs no lock, no
//! allocation and no round trip.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use seawall::breaker::{CircuitControl, CircuitMetrics, CircuitTransition};
use seawall::rate_limit::RateAlgorithm;
use seawall::store::{
    Admission, AdmitRequest, Permit, Record, Recorded, Reservation, Reserve, ResourceState,
    StoreFuture,
};
use seawall::{PartitionKey, Rejection, StoreError};

use crate::error::RedisStoreError;
use crate::store::{background_runs, background_thread, RedisResource, Shared};

/// How a resource in leased mode leases its rate-limit permits or bulkhead
/// slots (see
/// [`RedisStoreBuilder::leased`](crate::RedisStoreBuilder::leased) and the
/// [crate documentation](crate#leased-mode)).
///
/// ```
/// use std::time::Duration;
/// use seawall_redis::Leasing;
///
/// // 500 permits at a time, spent within 1 s of their lease, the next
/// // batch leased in the background once 200 are left.
/// let leasing = Leasing::batch(500).ttl(Duration::from_secs(1)).low_water(200);
/// assert_eq!(leasing.batch_size(), 500);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Leasing {
    batch: u32,
    ttl: Duration,
    low_water: Option<u32>,
}

impl Leasing {
    /// Leases `permits` rate-limit permits (or bulkhead slots) at a time
    /// (a batch). At least 1, and at most the rate limiter's burst (GCRA),
    /// its limit (fixed window) or the bulkhead's `max_concurrent`. The TTL
    /// defaults to 1 s, the low-water mark to half the batch.
    pub fn batch(permits: u32) -> Leasing {
        Leasing {
            batch: permits,
            ttl: Duration::from_secs(1),
            low_water: None,
        }
    }

    /// How long after its lease was sent a batch may be admitted from;
    /// what is left of it then is given back (see the crate
    /// documentation). For a bulkhead, how long after its last lease or
    /// extension the pool may be admitted from (it is extended every half
    /// TTL): below the bulkhead's lease by at least the attempt timeout.
    /// Must be > 0.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Leasing {
        self.ttl = ttl;
        self
    }

    /// When an admission leaves at most this many permits, the next batch
    /// is leased in the background (one lease at a time), so that
    /// admissions do not wait for it. Below the batch; defaults to half of
    /// it.
    #[must_use]
    pub fn low_water(mut self, permits: u32) -> Leasing {
        self.low_water = Some(permits);
        self
    }

    /// The permits of a batch.
    pub fn batch_size(&self) -> u32 {
        self.batch
    }

    /// The TTL of a batch.
    pub fn lease_ttl(&self) -> Duration {
        self.ttl
    }

    /// The low-water mark.
    pub fn low_water_mark(&self) -> u32 {
        self.low_water.unwrap_or(self.batch / 2)
    }

    /// The most rate-limit permits a process holds at once: a renewal
    /// starts at the low-water mark or below and adds one batch (one lease
    /// at a time).
    pub fn most_held(&self) -> u64 {
        u64::from(self.batch) + u64::from(self.low_water_mark())
    }

    pub(crate) fn validate(&self) -> Result<(), RedisStoreError> {
        let invalid =
            |field: &'static str, rule: String| RedisStoreError::InvalidConfig { field, rule };
        if self.batch == 0 {
            return Err(invalid("leased.batch", "must be >= 1, got 0".into()));
        }
        if self.ttl.is_zero() {
            return Err(invalid("leased.ttl", "must be > 0".into()));
        }
        if self.low_water_mark() >= self.batch {
            return Err(invalid(
                "leased.low_water",
                format!(
                    "must be below the batch ({}), got {}",
                    self.batch,
                    self.low_water_mark()
                ),
            ));
        }
        Ok(())
    }
}

/// Checks that the resource of `shared` can be leased with `leasing`, and
/// wraps its exact state.
pub(crate) fn bind(
    shared: Arc<Shared>,
    exact: RedisResource,
    leasing: &Leasing,
) -> Result<Arc<dyn ResourceState>, StoreError> {
    let spec = shared.spec();
    let refuse = |field: &str, rule: String| {
        StoreError::Refused(format!("leased.{field} of resource `{}` {rule}", spec.name))
    };
    let others = spec.circuit.is_some() || spec.cooldown.is_some() || spec.retry_budget.is_some();
    let limiter =
        match (&spec.rate_limit, &spec.bulkhead) {
            (Some(r), None) if !others => r,
            (None, Some(b)) if !others => {
                if leasing.batch > b.max_concurrent {
                    return Err(refuse(
                        "batch",
                        format!(
                            "must be <= the bulkhead's max_concurrent ({}), got {}",
                            b.max_concurrent, leasing.batch
                        ),
                    ));
                }
                if b.shadow {
                    return Err(refuse(
                        "resource",
                        "must have a bulkhead that is not in shadow mode".into(),
                    ));
                }
                if leasing.ttl >= b.lease {
                    return Err(refuse(
                        "ttl",
                        format!(
                            "must be below the bulkhead's lease ({:?}) by at least the attempt \
                         timeout, got {:?}",
                            b.lease, leasing.ttl
                        ),
                    ));
                }
                return Ok(crate::slots::bind(shared, exact, leasing));
            }
            _ => return Err(refuse(
                "resource",
                "must have a rate limiter or a bulkhead, alone: no circuit breaker, cooldown or \
                 shared retry budget (those are asked on every call, one round trip each: \
                 leasing would save nothing), and not both"
                    .into(),
            )),
        };
    let most = match limiter.algorithm {
        RateAlgorithm::Gcra => limiter.burst,
        RateAlgorithm::FixedWindow => limiter.limit,
        _ => {
            return Err(refuse(
                "resource",
                "must have a GCRA or fixed-window rate limiter, got a sliding window".into(),
            ))
        }
    };
    if !limiter.max_wait.is_zero() || limiter.shadow {
        return Err(refuse(
            "resource",
            "must have a rate limiter whose calls never wait (max_wait zero) and that is not in \
             shadow mode"
                .into(),
        ));
    }
    if leasing.batch > most {
        let what = match limiter.algorithm {
            RateAlgorithm::Gcra => "burst",
            _ => "limit",
        };
        return Err(refuse(
            "batch",
            format!(
                "must be <= the rate limiter's {what} ({most}), got {}",
                leasing.batch
            ),
        ));
    }
    let lease = Arc::new(Lease {
        shared,
        batch: leasing.batch,
        low: u64::from(leasing.low_water_mark()),
        ttl: leasing.ttl,
        avail: AtomicU64::new(0),
        expires: AtomicU64::new(0),
        give_at: AtomicU64::new(NONE),
        refused_until: AtomicU64::new(0),
        under_way: UnderWay::new(),
        renewer: OnceLock::new(),
        pending: AtomicBool::new(false),
        pending_now: AtomicU64::new(0),
        closed: AtomicBool::new(false),
    });
    Ok(Arc::new(LeasedResource { exact, lease }))
}

/// No instant (to give a batch back with).
const NONE: u64 = u64::MAX;

pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// One lease under way at a time (of a batch of permits, or of slots), and
/// the callers that wait for it to land: blocking ones on a condition
/// variable, async ones on a `Notify`, each at most the store's longest
/// operation.
pub(crate) struct UnderWay {
    busy: AtomicBool,
    landed: Mutex<()>,
    landed_cv: Condvar,
    notify: tokio::sync::Notify,
}

impl UnderWay {
    pub(crate) fn new() -> Self {
        UnderWay {
            busy: AtomicBool::new(false),
            landed: Mutex::new(()),
            landed_cv: Condvar::new(),
            notify: tokio::sync::Notify::new(),
        }
    }

    /// `true` when this caller may lease (no lease under way).
    pub(crate) fn claim(&self) -> bool {
        !self.busy.load(Ordering::Relaxed) && !self.busy.swap(true, Ordering::AcqRel)
    }

    /// The end of a lease: waiters go on.
    pub(crate) fn finish(&self) {
        {
            let _g = self.landed.lock().unwrap_or_else(PoisonError::into_inner);
            self.busy.store(false, Ordering::Release);
        }
        self.landed_cv.notify_all();
        self.notify.notify_waiters();
    }

    /// A blocking caller waits for the lease under way, at most `longest`.
    pub(crate) fn wait_sync(&self, longest: Duration) {
        let g = self.landed.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = self
            .landed_cv
            .wait_timeout_while(g, longest, |()| self.busy.load(Ordering::Acquire));
    }

    /// An async caller waits for the lease under way, at most `longest`.
    pub(crate) async fn wait_async(&self, longest: Duration) {
        let notified = self.notify.notified();
        let mut notified = std::pin::pin!(notified);
        notified.as_mut().enable();
        if self.busy.load(Ordering::Acquire) {
            let _ = tokio::time::timeout(longest, notified).await;
        }
    }
}

/// The local batch of one leased resource.
struct Lease {
    shared: Arc<Shared>,
    batch: u32,
    low: u64,
    ttl: Duration,
    /// Permits left in the batch.
    avail: AtomicU64,
    /// When the batch expires, on the store's clock (nanoseconds).
    expires: AtomicU64,
    /// The instant the last batch is given back with (nanoseconds on the
    /// script's clock; [`NONE`]: none).
    give_at: AtomicU64,
    /// Until when Redis refused the last lease (store's clock,
    /// nanoseconds).
    refused_until: AtomicU64,
    /// The lease under way (one at a time), and its waiters.
    under_way: UnderWay,
    /// The thread that renews batches for blocking callers.
    renewer: OnceLock<Option<std::thread::Thread>>,
    /// A renewal asked of the renewer, and the caller's `now` for it.
    pending: AtomicBool,
    pending_now: AtomicU64,
    /// The resource was dropped: the renewer ends.
    closed: AtomicBool,
}

/// What became of a lease.
enum Landed {
    Granted,
    Refused(Rejection),
}

impl Lease {
    fn clock(&self, now: Duration) -> u64 {
        nanos(self.shared.store_clock(now))
    }

    /// Takes `w` permits from the batch: the permits left, or `None` when
    /// it holds fewer or has expired (what is left of an expired batch is
    /// given back).
    #[inline]
    fn take(&self, w: u64, clock: u64) -> Option<u64> {
        if clock >= self.expires.load(Ordering::Acquire) {
            self.expire();
            return None;
        }
        let mut cur = self.avail.load(Ordering::Acquire);
        loop {
            if cur < w {
                return None;
            }
            match self.avail.compare_exchange_weak(
                cur,
                cur - w,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(cur - w),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Gives back what is left of an expired batch.
    #[cold]
    fn expire(&self) {
        let left = self.avail.swap(0, Ordering::AcqRel);
        self.give_back(left);
    }

    /// Gives back `left` unused permits, at most one batch, with the
    /// instant of the last lease.
    fn give_back(&self, left: u64) {
        let at = self.give_at.load(Ordering::Acquire);
        if left == 0 || at == NONE {
            return;
        }
        let permits = u32::try_from(left.min(u64::from(self.batch))).unwrap_or(self.batch);
        self.shared
            .give_back_lease(Duration::from_nanos(at), permits);
    }

    /// The refusal to answer locally while Redis's refusal of the last
    /// lease holds: the rate limiter's, with the rest of its wait.
    fn refused(&self, clock: u64) -> Option<Admission> {
        let until = self.refused_until.load(Ordering::Acquire);
        (clock < until).then(|| {
            Admission::rejected(Rejection::new(
                seawall::RejectionReason::RateLimited,
                Some(Duration::from_nanos(until - clock)),
            ))
        })
    }

    /// Learns Redis's answer to a lease sent at `sent` (store's clock).
    fn land(&self, reply: &[i64], sent: u64, now: Duration) -> Result<Landed, StoreError> {
        let admission = self.shared.lease_admission(reply, now)?;
        match admission.decision {
            Ok(_) => {
                let at = match reply.get(13..16) {
                    Some(&[1, us, ns]) if us >= 0 => u64::try_from(us)
                        .ok()
                        .and_then(|us| us.checked_mul(1000))
                        .and_then(|n| n.checked_add(u64::try_from(ns).unwrap_or(0)))
                        .unwrap_or(NONE),
                    _ => NONE,
                };
                self.give_at.store(at, Ordering::Release);
                self.expires
                    .store(sent.saturating_add(nanos(self.ttl)), Ordering::Release);
                Ok(Landed::Granted)
            }
            Err(rejection) => {
                if let Some(wait) = rejection.retry_after {
                    self.refused_until
                        .store(sent.saturating_add(nanos(wait)), Ordering::Release);
                }
                Ok(Landed::Refused(rejection))
            }
        }
    }

    /// A lease in the background, on the blocking path; the batch is added
    /// when granted.
    fn renew_sync(&self, now: Duration) {
        let sent = self.clock(now);
        if let Ok(reply) = self.shared.lease_sync(now, self.batch) {
            if let Ok(Landed::Granted) = self.land(&reply, sent, now) {
                self.avail
                    .fetch_add(u64::from(self.batch), Ordering::AcqRel);
            }
        }
        self.under_way.finish();
    }

    /// [`renew_sync`](Self::renew_sync) on the async path.
    async fn renew_async(&self, now: Duration) {
        let sent = self.clock(now);
        if let Ok(reply) = self.shared.lease_async(now, self.batch).await {
            if let Ok(Landed::Granted) = self.land(&reply, sent, now) {
                self.avail
                    .fetch_add(u64::from(self.batch), Ordering::AcqRel);
            }
        }
        self.under_way.finish();
    }

    /// After an admission left `left` permits: at the low-water mark, the
    /// next batch is leased in the background (a spawned task inside a
    /// multi-thread tokio runtime, the resource's renewal thread
    /// otherwise).
    /// No lease is started while Redis's refusal of the last one holds.
    #[inline]
    fn after_take(self: &Arc<Self>, left: u64, now: Duration) {
        if left > self.low
            || self.clock(now) < self.refused_until.load(Ordering::Acquire)
            || !self.under_way.claim()
        {
            return;
        }
        self.renew_in_background(now);
    }

    /// On a multi-thread tokio runtime, a spawned task; otherwise (no
    /// runtime, or a current-thread one, which a blocking caller may be
    /// keeping from running the task) the renewal thread.
    #[cold]
    fn renew_in_background(self: &Arc<Self>, now: Duration) {
        if background_runs() {
            let lease = Arc::clone(self);
            tokio::spawn(async move { lease.renew_async(now).await });
            return;
        }
        let renewer = self
            .renewer
            .get_or_init(|| background_thread("seawall-redis-lease", self, renewer));
        match renewer {
            Some(thread) => {
                self.pending_now.store(nanos(now), Ordering::Release);
                self.pending.store(true, Ordering::Release);
                thread.unpark();
            }
            // No thread: the next call that finds the batch empty leases.
            None => self.under_way.finish(),
        }
    }
}

/// The renewal thread of a leased resource: renews when asked, ends with
/// the resource.
fn renewer(lease: &Weak<Lease>) {
    loop {
        std::thread::park();
        let Some(lease) = lease.upgrade() else { return };
        if lease.closed.load(Ordering::Acquire) {
            return;
        }
        if lease.pending.swap(false, Ordering::AcqRel) {
            let now = Duration::from_nanos(lease.pending_now.load(Ordering::Acquire));
            lease.renew_sync(now);
        }
    }
}

/// A resource admitted in leased mode; everything but the rate limit's
/// admissions goes to its exact state.
pub(crate) struct LeasedResource {
    exact: RedisResource,
    lease: Arc<Lease>,
}

impl fmt::Debug for LeasedResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedResource")
            .field("exact", &self.exact)
            .field("batch", &self.lease.batch)
            .field("held", &self.lease.avail.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Drop for LeasedResource {
    /// Gives back what is left of the batch, and ends the renewal thread.
    fn drop(&mut self) {
        let l = &self.lease;
        l.closed.store(true, Ordering::Release);
        if let Some(Some(thread)) = l.renewer.get() {
            thread.unpark();
        }
        let left = l.avail.swap(0, Ordering::AcqRel);
        l.give_back(left);
    }
}

fn admitted() -> Admission {
    Admission::admitted(Permit::default())
}

impl LeasedResource {
    /// Calls admitted from the batch: those of the unpartitioned state
    /// that move no retry budget and weigh at most a batch. Others are
    /// admitted exactly.
    #[inline]
    fn leases(&self, request: &AdmitRequest<'_>) -> bool {
        request.partition.is_none()
            && request.budget.is_none()
            && request.weight >= 1
            && request.weight <= self.lease.batch
    }

    /// The batch is empty (or expired): Redis's refusal of the last lease
    /// while it holds; else a lease by this call (it waits for it, as an
    /// exact admission waits for its round trip); else, with a lease under
    /// way, a wait for it; else an exact admission.
    fn admit_slow(&self, request: &AdmitRequest<'_>) -> Result<Admission, StoreError> {
        let l = &self.lease;
        let w = u64::from(request.weight);
        for _ in 0..2 {
            let clock = l.clock(request.now);
            if let Some(left) = l.take(w, clock) {
                l.after_take(left, request.now);
                return Ok(admitted());
            }
            if let Some(refused) = l.refused(clock) {
                return Ok(refused);
            }
            if l.under_way.claim() {
                let result = l.shared.lease_sync(request.now, l.batch);
                let out = self.landed_here(result, clock, request);
                l.under_way.finish();
                return out;
            }
            l.under_way.wait_sync(l.shared.longest_wait());
        }
        self.exact.admit(request)
    }

    /// The answer to a call that leased a batch for itself.
    fn landed_here(
        &self,
        result: Result<Vec<i64>, StoreError>,
        sent: u64,
        request: &AdmitRequest<'_>,
    ) -> Result<Admission, StoreError> {
        let l = &self.lease;
        match result {
            Err(e) => l.shared.degraded(request, e),
            Ok(reply) => match l.land(&reply, sent, request.now)? {
                Landed::Granted => {
                    l.avail.fetch_add(
                        u64::from(l.batch) - u64::from(request.weight),
                        Ordering::AcqRel,
                    );
                    Ok(admitted())
                }
                Landed::Refused(rejection) => Ok(Admission::rejected(rejection)),
            },
        }
    }

    async fn admit_slow_async(&self, request: AdmitRequest<'_>) -> Result<Admission, StoreError> {
        let l = &self.lease;
        let w = u64::from(request.weight);
        for _ in 0..2 {
            let clock = l.clock(request.now);
            if let Some(left) = l.take(w, clock) {
                l.after_take(left, request.now);
                return Ok(admitted());
            }
            if let Some(refused) = l.refused(clock) {
                return Ok(refused);
            }
            if l.under_way.claim() {
                let result = l.shared.lease_async(request.now, l.batch).await;
                let out = self.landed_here(result, clock, &request);
                l.under_way.finish();
                return out;
            }
            l.under_way.wait_async(l.shared.longest_wait()).await;
        }
        self.exact.admit_async(request).await
    }
}

impl ResourceState for LeasedResource {
    /// From the local batch when it holds the call's permits (no round
    /// trip); see [`LeasedResource::admit_slow`] otherwise.
    fn admit(&self, request: &AdmitRequest<'_>) -> Result<Admission, StoreError> {
        if !self.leases(request) {
            return self.exact.admit(request);
        }
        let l = &self.lease;
        if let Some(left) = l.take(u64::from(request.weight), l.clock(request.now)) {
            l.after_take(left, request.now);
            return Ok(admitted());
        }
        self.admit_slow(request)
    }

    fn admit_async<'a>(&'a self, request: AdmitRequest<'a>) -> StoreFuture<'a, Admission> {
        if !self.leases(&request) {
            return self.exact.admit_async(request);
        }
        let l = &self.lease;
        if let Some(left) = l.take(u64::from(request.weight), l.clock(request.now)) {
            l.after_take(left, request.now);
            return StoreFuture::ready(Ok(admitted()));
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

    /// A rate limiter alone records nothing: no round trip, but for a
    /// permit answered locally while Redis failed (fail-open).
    fn record(&self, record: &Record<'_>) -> Result<Recorded, StoreError> {
        if record.permit.local {
            return self.exact.record(record);
        }
        Ok(Recorded::default())
    }

    fn record_async<'a>(&'a self, record: Record<'a>) -> StoreFuture<'a, Recorded> {
        StoreFuture::ready(self.record(&record))
    }

    fn release(&self, partition: Option<&PartitionKey>, permit: Permit) {
        if permit.local {
            self.exact.release(partition, permit);
        }
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

    fn in_flight(
        &self,
        partition: Option<&PartitionKey>,
        now: Duration,
    ) -> Result<u32, StoreError> {
        self.exact.in_flight(partition, now)
    }
}
