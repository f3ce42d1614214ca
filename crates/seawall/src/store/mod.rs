//! Shared state of the stateful policies (circuit breaker, bulkhead,
//! cooldown, rate limiter, and a [shared](crate::RetryBudget::shared) retry
//! budget) behind one trait.
//!
//! [`StateStore`] is shaped as the atomic operations the policies need, never
//! as get/set from the client: [`ResourceState::admit`] admits one attempt
//! through *every* stateful policy of a resource at once (circuit, then
//! bulkhead, then cooldown, then rate limit; when a later check refuses, the
//! permits taken by earlier ones are given back inside the same operation),
//! and [`ResourceState::record`] records its outcome (circuit window, slot
//! release, cooldown from a retry-after hint) at once. A remote store can
//! therefore admit a call in one round trip and record it in one more.
//!
//! [`MemoryStore`] is the default: lock-free atomics per resource, a sharded
//! map per partition. `seawall-redis` provides a store shared across
//! processes.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::breaker::{CircuitBreaker, CircuitControl, CircuitMetrics, CircuitTransition};
use crate::bulkhead::Bulkhead;
use crate::context::PartitionKey;
use crate::cooldown::Cooldown;
use crate::error::{Rejection, StoreError};
use crate::rate_limit::RateLimiter;
use crate::retry::RetryBudget;

#[cfg(any(test, feature = "test-util"))]
pub mod contract;
mod memory;

pub use memory::MemoryStore;
pub(crate) use memory::{MemoryResource, Ticket};

/// A place where the stateful policies keep their state.
///
/// One circuit (bulkhead, rate limit, cooldown) per resource name per store:
/// two pipelines with the same name and the same store share it.
pub trait StateStore: Send + Sync + fmt::Debug + 'static {
    /// Binds the stateful policies of a resource to this store. Called once
    /// by `PipelineBuilder::build`; the returned handle serves every call.
    ///
    /// # Errors
    /// When the store cannot be prepared (a remote store may check its
    /// connection and load its scripts here).
    fn bind(&self, spec: &ResourceSpec) -> Result<Arc<dyn ResourceState>, StoreError>;
}

impl<S: StateStore + ?Sized> StateStore for Arc<S> {
    fn bind(&self, spec: &ResourceSpec) -> Result<Arc<dyn ResourceState>, StoreError> {
        (**self).bind(spec)
    }
}

/// The stateful policies of one resource, as given to [`StateStore::bind`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ResourceSpec {
    /// The resource name (the pipeline's name).
    pub name: String,
    /// The circuit breaker, if any.
    pub circuit: Option<CircuitBreaker>,
    /// The bulkhead, if any.
    pub bulkhead: Option<Bulkhead>,
    /// The cooldown, if any.
    pub cooldown: Option<Cooldown>,
    /// The rate limiter, if any.
    pub rate_limit: Option<RateLimiter>,
    /// The retry budget kept in the store ([`RetryBudget::shared`]), if
    /// any: a bucket per resource (and partition), earned and spent by the
    /// admissions that carry a [`BudgetStep`].
    pub retry_budget: Option<RetryBudget>,
    /// A partition unused for this long may be evicted.
    pub partition_idle: Duration,
}

impl ResourceSpec {
    /// A spec with no policy.
    pub fn new(name: impl Into<String>) -> Self {
        ResourceSpec {
            name: name.into(),
            circuit: None,
            bulkhead: None,
            cooldown: None,
            rate_limit: None,
            retry_budget: None,
            partition_idle: Duration::from_secs(600),
        }
    }

    /// Sets the circuit breaker.
    pub fn with_circuit(mut self, c: CircuitBreaker) -> Self {
        self.circuit = Some(c);
        self
    }
    /// Sets the bulkhead.
    pub fn with_bulkhead(mut self, b: Bulkhead) -> Self {
        self.bulkhead = Some(b);
        self
    }
    /// Sets the cooldown.
    pub fn with_cooldown(mut self, c: Cooldown) -> Self {
        self.cooldown = Some(c);
        self
    }
    /// Sets the rate limiter.
    pub fn with_rate_limit(mut self, r: RateLimiter) -> Self {
        self.rate_limit = Some(r);
        self
    }
    /// Sets the retry budget kept in the store.
    pub fn with_retry_budget(mut self, b: RetryBudget) -> Self {
        self.retry_budget = Some(b);
        self
    }
    /// Sets the idle time after which a partition may be evicted.
    pub fn with_partition_idle(mut self, idle: Duration) -> Self {
        self.partition_idle = idle;
        self
    }

    /// `true` when no stateful policy is configured.
    pub fn is_empty(&self) -> bool {
        self.circuit.is_none()
            && self.bulkhead.is_none()
            && self.cooldown.is_none()
            && self.rate_limit.is_none()
            && self.retry_budget.is_none()
    }

    /// `true` when the only stateful part is the retry budget: an
    /// admission spends or earns, and an outcome has nothing to record.
    pub fn budget_only(&self) -> bool {
        self.retry_budget.is_some()
            && self.circuit.is_none()
            && self.bulkhead.is_none()
            && self.cooldown.is_none()
            && self.rate_limit.is_none()
    }
}

/// What an admission does to the resource's retry budget
/// ([`ResourceSpec::retry_budget`]); nothing without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BudgetStep {
    /// The first attempt of a call: deposits the budget's ratio, whatever
    /// the admission's answer.
    Deposit,
    /// A retry: withdraws one token if every other policy admits it, and is
    /// refused with
    /// [`RejectionReason::RetryBudgetExhausted`](crate::RejectionReason::RetryBudgetExhausted)
    /// (no `retry_after`) when less than one is left. The budget is asked
    /// after the cooldown and before the rate limiter; a refusal by an
    /// earlier policy withdraws nothing, and a token withdrawn is given back
    /// when the rate limiter refuses.
    Withdraw,
}

/// A request to admit one attempt.
#[derive(Debug, Clone, Copy)]
pub struct AdmitRequest<'a> {
    /// The partition of the call, if any.
    pub partition: Option<&'a PartitionKey>,
    /// The pipeline's clock. Stores with a clock of their own (a server's)
    /// use theirs instead.
    pub now: Duration,
    /// The rate-limit permits the attempt takes at once: 1 for an ordinary
    /// call (see [`AdmitRequest::new`]), `n` for a call priced in `n` cost
    /// units or a batch of `n` rows. The rate limiter grants all `n` or
    /// none; a weight it can never grant (0, or more than the burst of a
    /// GCRA, the limit of a window) is refused at once with
    /// [`RejectionReason::RateLimited`](crate::RejectionReason::RateLimited)
    /// and no `retry_after` (by a limiter in [shadow mode](crate::shadow),
    /// a shadow refusal: the call is admitted). The other policies count
    /// the attempt once.
    pub weight: u32,
    /// What the admission does to the retry budget kept in the store, if
    /// any (see [`BudgetStep`]).
    pub budget: Option<BudgetStep>,
    /// The call is shadowed already: a policy in shadow mode it met before
    /// this admission (a policy declared before the retry, the adaptive
    /// limit, an earlier attempt) would have refused it, so it would not
    /// have reached this resource (see
    /// [`shadow`](crate::shadow#across-the-levels-of-a-pipeline)). The
    /// policies in shadow mode are not asked and take nothing; the
    /// enforcing ones are asked as usual; an admitted permit is
    /// [`shadowed`](Permit::shadowed), and the admission reports no shadow
    /// refusal of its own ([`Admission::shadow`] is `None`). No effect on
    /// a resource without a policy in shadow mode.
    pub shadowed: bool,
}

impl<'a> AdmitRequest<'a> {
    /// A request for one attempt of weight 1 at `now`.
    pub fn new(partition: Option<&'a PartitionKey>, now: Duration) -> Self {
        AdmitRequest {
            partition,
            now,
            weight: 1,
            budget: None,
            shadowed: false,
        }
    }

    /// The same request taking `weight` rate-limit permits.
    #[must_use]
    pub fn with_weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// The same request earning or spending the retry budget.
    #[must_use]
    pub fn with_budget(mut self, step: BudgetStep) -> Self {
        self.budget = Some(step);
        self
    }

    /// The same request for a call [shadowed](Self::shadowed) already.
    #[must_use]
    pub fn shadowed(mut self, shadowed: bool) -> Self {
        self.shadowed = shadowed;
        self
    }
}

/// A rate-limit permit taken for a later instant by a call that waits for
/// it (see [`ResourceState::admit_reserving`]).
///
/// The call holds it while it waits, presents it when it is due
/// ([`Reserve::held`]) and gives it back with
/// [`ResourceState::give_back_reservation`] if it never comes to use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Reservation {
    /// The instant of the permit, on the store's clock (the caller's
    /// [`AdmitRequest::now`] unless the store keeps a clock of its own):
    /// how the store finds it again.
    pub at: Duration,
    /// The permits reserved: the [`AdmitRequest::weight`] of the call.
    pub weight: u32,
}

/// What a call that may wait for a rate-limit permit brings to
/// [`ResourceState::admit_reserving`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reserve {
    /// The longest wait for which a rate limiter that refuses reserves its
    /// next permit (zero: never; a plain [`ResourceState::admit`]).
    pub within: Duration,
    /// The reservation the call holds, now due: the rate limiter is not
    /// asked again. When a policy checked before it (circuit, bulkhead,
    /// cooldown) refuses, the reservation is given back in the same
    /// operation.
    pub held: Option<Reservation>,
}

/// What an admitted attempt holds; hand it back with [`ResourceState::record`]
/// or [`ResourceState::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Permit {
    /// The attempt holds one of the half-open probe slots.
    pub probe: bool,
    /// The circuit generation at admission; outcomes of an older generation
    /// are not recorded.
    pub generation: u64,
    /// The bulkhead slot (a lease id in shared stores), if a bulkhead is configured.
    pub slot: Option<u64>,
    /// Admitted on process-local state because the store failed (fail-open).
    pub local: bool,
    /// Admitted only because a policy in shadow mode did not refuse it (see
    /// [`crate::shadow`]): the policies in shadow mode record nothing of it
    /// and hold nothing for it.
    pub shadowed: bool,
}

/// The answer of [`ResourceState::admit`].
#[derive(Debug, Clone)]
pub struct Admission {
    /// The permit, or why the attempt was refused.
    pub decision: Result<Permit, Rejection>,
    /// A circuit transition that happened while admitting (open to half-open).
    pub transition: Option<CircuitTransition>,
    /// The store failed and the answer comes from local state (fail-open).
    pub degraded: Option<StoreError>,
    /// With an admitted (shadowed) permit: the refusal a policy in shadow
    /// mode would have given (see [`crate::shadow`]).
    pub shadow: Option<Rejection>,
}

impl Admission {
    /// An admission with a permit.
    pub fn admitted(permit: Permit) -> Self {
        Admission {
            decision: Ok(permit),
            transition: None,
            degraded: None,
            shadow: None,
        }
    }
    /// A refusal.
    pub fn rejected(rejection: Rejection) -> Self {
        Admission {
            decision: Err(rejection),
            transition: None,
            degraded: None,
            shadow: None,
        }
    }
}

/// How an admitted attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// It succeeded (or failed in a way that does not count against the dependency).
    Success,
    /// It failed (including timeouts).
    Failure,
    /// Not recorded by the circuit; the permit is given back.
    Ignored,
}

/// The outcome of one attempt, handed back with its permit.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// The partition of the call, if any.
    pub partition: Option<&'a PartitionKey>,
    /// The permit the attempt was admitted with.
    pub permit: Permit,
    /// How it ended.
    pub outcome: Outcome,
    /// How long it ran (slow-call detection).
    pub duration: Duration,
    /// A retry-after hint from the classifier: opens or extends the cooldown.
    pub retry_after: Option<Duration>,
    /// The pipeline's clock.
    pub now: Duration,
}

/// The answer of [`ResourceState::record`].
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    /// A circuit transition caused by this outcome.
    pub transition: Option<CircuitTransition>,
    /// The cooldown opened or extended by the hint, and its length from now.
    pub cooldown: Option<Duration>,
    /// The store failed and the outcome went to local state (fail-open).
    pub degraded: Option<StoreError>,
}

/// The state of one resource's stateful policies in a store.
///
/// Implementations must make each method atomic: two concurrent admissions
/// must never both take the last slot, the last permit, or more probes than
/// `half_open_calls`. Policies in shadow mode follow the rule of
/// [`crate::shadow`].
pub trait ResourceState: Send + Sync + fmt::Debug {
    /// Admits one attempt through circuit, bulkhead, cooldown, retry budget
    /// and rate limit, in that order, all or nothing (a deposit to the
    /// budget is made whatever the answer).
    ///
    /// # Errors
    /// When the store fails and is configured to fail closed.
    fn admit(&self, request: &AdmitRequest<'_>) -> Result<Admission, StoreError>;

    /// [`admit`](Self::admit) for async callers. The default answers at once
    /// with the sync version; remote stores return a real future.
    fn admit_async<'a>(&'a self, request: AdmitRequest<'a>) -> StoreFuture<'a, Admission> {
        StoreFuture::ready(self.admit(&request))
    }

    /// [`admit`](Self::admit) for a call that may wait for a rate-limit
    /// permit: when the rate limiter refuses and its next free permit is at
    /// most [`Reserve::within`] away, that permit is taken for its later
    /// instant and returned with the refusal (`rate_limited`, `retry_after`
    /// the wait), so that every later caller queues behind it, or is
    /// refused at once when its own wait would be too long. A call that
    /// presents a due reservation ([`Reserve::held`]) is admitted without
    /// asking the rate limiter.
    ///
    /// The default makes no reservation: it answers as `admit` (a store
    /// that does not reserve; the call then asks again when its wait is
    /// over, and may be refused then).
    ///
    /// # Errors
    /// When the store fails and is configured to fail closed.
    fn admit_reserving(
        &self,
        request: &AdmitRequest<'_>,
        reserve: Reserve,
    ) -> Result<(Admission, Option<Reservation>), StoreError> {
        let _ = reserve;
        self.admit(request).map(|a| (a, None))
    }

    /// [`admit_reserving`](Self::admit_reserving) for async callers. The
    /// default answers at once with the sync version.
    fn admit_reserving_async<'a>(
        &'a self,
        request: AdmitRequest<'a>,
        reserve: Reserve,
    ) -> StoreFuture<'a, (Admission, Option<Reservation>)> {
        StoreFuture::ready(self.admit_reserving(&request, reserve))
    }

    /// Gives back a reservation its call will not use (the call was
    /// cancelled while it waited). Must not block. The default does
    /// nothing (a store that never reserves).
    fn give_back_reservation(&self, partition: Option<&PartitionKey>, reservation: Reservation) {
        let _ = (partition, reservation);
    }

    /// Records the outcome of an admitted attempt and gives back its permit.
    ///
    /// # Errors
    /// When the store fails and is configured to fail closed.
    fn record(&self, record: &Record<'_>) -> Result<Recorded, StoreError>;

    /// [`record`](Self::record) for async callers.
    fn record_async<'a>(&'a self, record: Record<'a>) -> StoreFuture<'a, Recorded> {
        StoreFuture::ready(self.record(&record))
    }

    /// Gives back a permit without an outcome (the attempt was cancelled or
    /// panicked). Must not block: remote stores release in the background.
    fn release(&self, partition: Option<&PartitionKey>, permit: Permit);

    /// The circuit's state and window.
    ///
    /// # Errors
    /// When the store fails.
    fn circuit_metrics(
        &self,
        partition: Option<&PartitionKey>,
        now: Duration,
    ) -> Result<CircuitMetrics, StoreError>;

    /// Forces the circuit open or closed, or resets it.
    ///
    /// # Errors
    /// When the store fails.
    fn control_circuit(
        &self,
        partition: Option<&PartitionKey>,
        control: CircuitControl,
        now: Duration,
    ) -> Result<Option<CircuitTransition>, StoreError>;

    /// Attempts currently holding a bulkhead slot.
    ///
    /// # Errors
    /// When the store fails.
    fn in_flight(&self, partition: Option<&PartitionKey>, now: Duration)
        -> Result<u32, StoreError>;

    /// Drops partitions idle for longer than the spec allows; returns how
    /// many were dropped. Stores whose keys expire by themselves return 0.
    fn evict_idle(&self, now: Duration) -> usize {
        let _ = now;
        0
    }

    /// Partitions currently held in memory (0 for stores that keep none).
    fn partitions(&self) -> usize {
        0
    }
}

/// The future returned by the async methods of [`ResourceState`]: ready at
/// once (no allocation) for in-memory stores, boxed for remote ones.
pub struct StoreFuture<'a, T> {
    inner: StoreFutureInner<'a, T>,
}

type BoxStoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

enum StoreFutureInner<'a, T> {
    Ready(Option<Result<T, StoreError>>),
    Boxed(BoxStoreFuture<'a, T>),
}

impl<'a, T> StoreFuture<'a, T> {
    /// A future that is already complete.
    pub fn ready(result: Result<T, StoreError>) -> Self {
        StoreFuture {
            inner: StoreFutureInner::Ready(Some(result)),
        }
    }

    /// Wraps a future.
    pub fn boxed<F>(future: F) -> Self
    where
        F: Future<Output = Result<T, StoreError>> + Send + 'a,
    {
        StoreFuture {
            inner: StoreFutureInner::Boxed(Box::pin(future)),
        }
    }
}

// The ready value is never pinned in place, and the boxed future is pinned
// on the heap, so moving a `StoreFuture` is always fine.
impl<T> Unpin for StoreFuture<'_, T> {}

impl<T> Future for StoreFuture<'_, T> {
    type Output = Result<T, StoreError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.inner {
            StoreFutureInner::Ready(r) => Poll::Ready(r.take().unwrap_or_else(|| {
                Err(StoreError::Protocol(
                    "store future polled after completion".into(),
                ))
            })),
            StoreFutureInner::Boxed(f) => f.as_mut().poll(cx),
        }
    }
}

impl<T> fmt::Debug for StoreFuture<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.inner {
            StoreFutureInner::Ready(_) => f.write_str("StoreFuture::Ready"),
            StoreFutureInner::Boxed(_) => f.write_str("StoreFuture::Boxed"),
        }
    }
}
