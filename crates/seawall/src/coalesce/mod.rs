//! Request coalescing (singleflight) and a small cache of successes.
//!
//! Concurrent calls with the same key share one execution: the first call
//! (the *leader*) runs the whole call through the pipeline, the others
//! (*followers*) wait for it and each gets a clone of its result, success
//! or error. An optional cache keeps successes for a `ttl` on the
//! pipeline's clock, bounded to `max_entries` (the least recently used is
//! evicted), and answers calls with the same key while they are fresh.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use seawall::{Coalesce, Pipeline, Retry};
//!
//! let users = Pipeline::builder("users-coalesced")
//!     .coalesce(Coalesce::new().ttl(Duration::from_secs(30)).max_entries(1_000))
//!     .retry(Retry::constant(Duration::from_millis(10)).max_attempts(3))
//!     .build()?;
//! let mut runs = 0;
//! let name = users.coalesce_key(42u64).call(|_ctx| {
//!     runs += 1;
//!     Ok::<_, Arc<std::io::Error>>(String::from("ada"))
//! })?;
//! // Within the ttl the same key is answered from the cache.
//! let again = users.coalesce_key(42u64).call(|_ctx| {
//!     runs += 1;
//!     Ok::<_, Arc<std::io::Error>>(String::from("grace"))
//! })?;
//! assert_eq!((name.as_str(), again.as_str(), runs), ("ada", "ada", 1));
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```
//!
//! # Which calls share
//! Only calls that name their key share: [`Pipeline::coalesce_key`]
//! (a key given per call), [`Partition::coalesced`] (the partition's key),
//! [`Partition::coalesce_key`] (both), [`Pipeline::coalesced`] (no key:
//! every such call of the pipeline). A plain `run` or `call` never shares,
//! since the pipeline cannot know that two operations are the same. Two
//! calls share when their keys are equal and their result types
//! (`Result<T, E>`) are the same type; calls of another type never meet.
//! On a pipeline without `coalesce`, keyed calls run as plain calls, so a
//! configuration file can switch coalescing on and off without a change of
//! code.
//!
//! # Where it stands
//! Outermost: it is declared first (`build()` refuses it anywhere else)
//! and wraps the whole call, retries, timeouts, the stateful policies and
//! the fallback included, so that one execution of the whole resilient
//! call is shared. A follower takes no bulkhead slot, no rate-limit permit
//! and no retry-budget credit, and is not recorded by the circuit breaker:
//! only the leader's call goes through the pipeline.
//!
//! # Results are cloned
//! Every caller gets the same `Result<T, Error<E>>`: the leader its own,
//! each follower a clone (one clone per follower, and one held for them),
//! so shared calls need `T: Clone` and `E: Clone` (and `Send + Sync +
//! 'static`, as they cross threads). An error type that is not `Clone`
//! (such as `std::io::Error`) is shared by wrapping it in an `Arc`
//! (`.map_err(Arc::new)` in the operation). Cloning keeps
//! [`Error`] as it is: followers match the same variants as
//! the leader, with the same typed error inside.
//!
//! # A leader that goes away
//! Every caller brings its own operation. When the leader's future is
//! dropped (a timeout around it, a cancelled task) or its operation panics
//! before the call ends, its followers are woken and the first of them to
//! come back becomes the new leader, running its own operation; the others
//! follow it ([`EventKind::CoalesceTakeover`](crate::EventKind::CoalesceTakeover)).
//! No waiter is stranded, and no execution is detached from its caller.
//!
//! # Sync and async
//! `call` and `run` share one table and one rule: a blocking follower
//! waits on a condition variable, an async follower on a notification,
//! for the same leader, which may be either. (A blocking follower blocks
//! its thread: do not `call` a coalesced pipeline from inside an async
//! task whose leader needs that thread.)
//!
//! # The cache
//! Keeps successes only (an error is shared with the callers waiting for
//! it, never kept), and not a value made by the fallback (a degraded
//! answer is not served to later callers). An entry is fresh from the
//! leader's end until `ttl` later on the pipeline's clock; a stale entry is
//! dropped when it is looked up. At `max_entries` the least recently used
//! entry is evicted for a new one. The cache and the table belong to the
//! pipeline (its clones share them) and to this process: they are not kept
//! in the [`StateStore`](crate::StateStore).
//!
//! # Events
//! [`Coalesced`](crate::EventKind::Coalesced) for a follower answered by a
//! leader, [`CacheHit`](crate::EventKind::CacheHit) and
//! [`CacheMiss`](crate::EventKind::CacheMiss) for each keyed call of a
//! pipeline with a cache, [`CoalesceTakeover`](crate::EventKind::CoalesceTakeover)
//! when a follower takes a dropped leader's place.
//!
//! [`Pipeline::coalesce_key`]: crate::Pipeline::coalesce_key
//! [`Pipeline::coalesced`]: crate::Pipeline::coalesced
//! [`Partition::coalesced`]: crate::pipeline::Partition::coalesced
//! [`Partition::coalesce_key`]: crate::pipeline::Partition::coalesce_key

use std::any::{Any, TypeId};
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use hashbrown::HashMap;
use tokio::sync::Notify;

use crate::clock::{duration_nanos, ClockHandle};
use crate::context::PartitionKey;
use crate::error::{ConfigError, Error};

mod cache;

use cache::Cache;

/// The name of the policy in configuration errors, events and metrics.
pub(crate) const NAME: &str = "coalesce";

/// The cache's bound when a `ttl` is given without `max_entries`.
pub const DEFAULT_MAX_ENTRIES: u32 = 1024;

/// The settings of request coalescing: see the [module docs](self).
///
/// # Default
/// Sharing only, no cache. [`ttl`](Self::ttl) adds the cache, bounded to
/// [`DEFAULT_MAX_ENTRIES`] unless [`max_entries`](Self::max_entries) says
/// otherwise.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Coalesce {
    ttl: Option<Duration>,
    max_entries: Option<u32>,
}

impl Coalesce {
    /// Concurrent calls with the same key share one execution; nothing is
    /// kept after it.
    pub fn new() -> Self {
        Coalesce::default()
    }

    /// Keeps each success for `ttl` on the pipeline's clock; calls with
    /// the same key are answered from it meanwhile.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Bounds the cache to `max_entries` keys; the least recently used is
    /// evicted for a new one. Needs a [`ttl`](Self::ttl).
    pub fn max_entries(mut self, max_entries: u32) -> Self {
        self.max_entries = Some(max_entries);
        self
    }

    /// The cache's `ttl`, if there is a cache.
    pub fn cache_ttl(&self) -> Option<Duration> {
        self.ttl
    }

    /// The cache's bound, if there is a cache.
    pub fn cache_entries(&self) -> Option<u32> {
        self.ttl
            .map(|_| self.max_entries.unwrap_or(DEFAULT_MAX_ENTRIES))
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// A zero `ttl` (`coalesce.ttl must be > 0`), a cache of no entries
    /// (`coalesce.max_entries must be >= 1, got 0`), `max_entries` without
    /// a `ttl`.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.ttl.is_some_and(|t| t.is_zero()) {
            return Err(ConfigError::new(
                NAME,
                "ttl",
                "must be > 0 (a cache keeps each success this long; leave `ttl` out for no cache)",
            ));
        }
        match (self.max_entries, self.ttl) {
            (Some(0), _) => Err(ConfigError::new(
                NAME,
                "max_entries",
                "must be >= 1, got 0 (leave `ttl` and `max_entries` out for no cache)",
            )),
            (Some(_), None) => Err(ConfigError::new(
                NAME,
                "max_entries",
                "bounds the cache, which needs a `ttl`: give `ttl` too",
            )),
            _ => Ok(()),
        }
    }
}

/// What calls share by: their key (a partition's, a per-call one, both or
/// none) and the type of their result.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct FlightKey {
    ty: TypeId,
    partition: Option<PartitionKey>,
    key: Option<PartitionKey>,
}

impl FlightKey {
    /// The key of calls returning `Result<T, Error<E>>`.
    pub(crate) fn new<T: 'static, E: 'static>(
        partition: Option<&PartitionKey>,
        key: Option<&PartitionKey>,
    ) -> Self {
        FlightKey {
            ty: TypeId::of::<Result<T, Error<E>>>(),
            partition: partition.cloned(),
            key: key.cloned(),
        }
    }

    /// The partition of the calls.
    pub(crate) fn partition(&self) -> Option<&PartitionKey> {
        self.partition.as_ref()
    }
}

/// A value shared between calls: a `Result<T, Error<E>>` for followers, a
/// `T` in the cache, of the type the key names.
type SharedValue = Arc<dyn Any + Send + Sync>;

/// The coalescing state of a pipeline: the executions under way by key,
/// and the cache.
pub(crate) struct Coalescer {
    flights: Mutex<HashMap<FlightKey, Arc<Flight>>>,
    cache: Option<Kept>,
    /// Followers waiting now, read without taking a lock.
    waiting: AtomicUsize,
}

struct Kept {
    ttl: u64,
    entries: Mutex<Cache<FlightKey, SharedValue>>,
}

impl std::fmt::Debug for Coalescer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coalescer")
            .field("cache", &self.cache.as_ref().map(|c| c.ttl))
            .finish_non_exhaustive()
    }
}

/// A lock that a panic elsewhere does not poison: every critical section
/// here leaves the state whole.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How a call joins the coalescing table.
pub(crate) enum Join<'c> {
    /// A fresh cached success: the call's value (a `T`).
    Cached(SharedValue),
    /// No execution under way: this call runs it, and ends it with
    /// [`Lead::finish`].
    Lead(Lead<'c>),
    /// An execution is under way: wait for it.
    Follow(Follower<'c>),
}

impl Coalescer {
    pub(crate) fn new(settings: &Coalesce) -> Self {
        Coalescer {
            flights: Mutex::new(HashMap::new()),
            cache: settings.ttl.map(|ttl| Kept {
                ttl: duration_nanos(ttl),
                entries: Mutex::new(Cache::new(
                    settings.max_entries.unwrap_or(DEFAULT_MAX_ENTRIES) as usize,
                )),
            }),
            waiting: AtomicUsize::new(0),
        }
    }

    /// The pipeline keeps successes.
    pub(crate) fn caches(&self) -> bool {
        self.cache.is_some()
    }

    /// The fresh cached value of `key` at `now`.
    fn cached(&self, key: &FlightKey, now: u64) -> Option<SharedValue> {
        let kept = self.cache.as_ref()?;
        lock(&kept.entries).get(key, now).cloned()
    }

    /// The one rule of coalescing, for blocking and async calls alike: a
    /// fresh cached success answers the call; else an execution under way
    /// with the same key is followed; else this call leads a new one.
    ///
    /// A leader keeps its success before it leaves the table
    /// ([`Lead::finish`]), and the cache is asked again under the table's
    /// lock, so a call arriving as a leader ends finds either the
    /// execution or its kept value, never neither.
    pub(crate) fn join<'c>(&'c self, key: &'c FlightKey, clock: &ClockHandle) -> Join<'c> {
        let now = self.cache.as_ref().map(|_| clock.now_nanos());
        if let Some(v) = now.and_then(|now| self.cached(key, now)) {
            return Join::Cached(v);
        }
        let mut flights = lock(&self.flights);
        if let Some(f) = flights.get(key) {
            self.waiting.fetch_add(1, Ordering::Relaxed);
            return Join::Follow(Follower {
                coalescer: self,
                key,
                flight: Arc::clone(f),
            });
        }
        if let Some(v) = now.and_then(|now| self.cached(key, now)) {
            return Join::Cached(v);
        }
        let flight = Arc::new(Flight::new());
        flights.insert(key.clone(), Arc::clone(&flight));
        Join::Lead(Lead {
            coalescer: self,
            key,
            flight,
            ended: false,
        })
    }

    /// Calls waiting for the execution of another call with the same key.
    pub(crate) fn waiters(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Executions under way or waiting for a new leader (for tests).
    #[cfg(test)]
    fn in_flight(&self) -> usize {
        lock(&self.flights).len()
    }
}

/// The leadership of one execution: ended by [`finish`](Self::finish);
/// dropped before that (a dropped future, a panic), it hands the execution
/// to the first of its followers to wake ([`Landed::TakenOver`]).
pub(crate) struct Lead<'c> {
    coalescer: &'c Coalescer,
    key: &'c FlightKey,
    flight: Arc<Flight>,
    ended: bool,
}

impl Lead<'_> {
    /// Ends the execution with `result`: a success is kept in the cache
    /// (unless `keep` says it must not be: the fallback's), then the
    /// execution leaves the table and its followers, if any, get a clone
    /// of the result.
    pub(crate) fn finish<T, E>(
        mut self,
        result: &Result<T, Error<E>>,
        keep: bool,
        clock: &ClockHandle,
    ) where
        T: Clone + Send + Sync + 'static,
        E: Clone + Send + Sync + 'static,
    {
        self.ended = true;
        if let (Ok(v), Some(kept), true) = (result, &self.coalescer.cache, keep) {
            let expires = clock.now_nanos().saturating_add(kept.ttl);
            let value: SharedValue = Arc::new(v.clone());
            lock(&kept.entries).insert(self.key.clone(), value, expires);
        }
        let mut flights = lock(&self.coalescer.flights);
        if flights
            .get(self.key)
            .is_some_and(|f| Arc::ptr_eq(f, &self.flight))
        {
            flights.remove(self.key);
        }
        drop(flights);
        // Out of the table, no call can join it any more: the count of its
        // holders is final, and without followers nothing is cloned.
        if Arc::strong_count(&self.flight) > 1 {
            let shared: SharedValue = Arc::new(result.clone());
            self.flight.land(Slot::Done(shared));
        }
    }
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let mut flights = lock(&self.coalescer.flights);
        let listed = flights
            .get(self.key)
            .is_some_and(|f| Arc::ptr_eq(f, &self.flight));
        // The table's reference and this one: nobody else waits, and the
        // execution leaves the table. Otherwise it stays, without a
        // leader, for the first follower (or newcomer) to take over.
        if listed && Arc::strong_count(&self.flight) <= 2 {
            flights.remove(self.key);
        }
        drop(flights);
        self.flight.land(Slot::Leaderless);
    }
}

/// A call waiting for another's execution.
pub(crate) struct Follower<'c> {
    coalescer: &'c Coalescer,
    key: &'c FlightKey,
    flight: Arc<Flight>,
}

impl Drop for Follower<'_> {
    fn drop(&mut self) {
        self.coalescer.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How a followed execution ended for a follower.
pub(crate) enum Landed<'c> {
    /// With this result (a `Result<T, Error<E>>`).
    Done(SharedValue),
    /// Its leader went away before the end, and this call takes its place:
    /// run the call, then [`Lead::finish`] it for the other followers.
    TakenOver(Lead<'c>),
}

impl<'c> Follower<'c> {
    /// The end of the execution as `slot` says, or `None` while it runs. A
    /// leaderless execution is claimed here, under the slot's lock: by
    /// exactly one follower.
    fn landed(&self, slot: &mut Slot) -> Option<Result<SharedValue, ()>> {
        match slot {
            Slot::Running => None,
            Slot::Done(v) => Some(Ok(Arc::clone(v))),
            Slot::Leaderless => {
                *slot = Slot::Running;
                Some(Err(()))
            }
        }
    }

    fn into_landed(self, landed: Result<SharedValue, ()>) -> Landed<'c> {
        match landed {
            Ok(v) => Landed::Done(v),
            Err(()) => Landed::TakenOver(Lead {
                coalescer: self.coalescer,
                key: self.key,
                flight: Arc::clone(&self.flight),
                ended: false,
            }),
        }
    }

    /// Blocks until the execution ends or falls to this call.
    pub(crate) fn wait_blocking(self) -> Landed<'c> {
        let mut slot = lock(&self.flight.slot);
        loop {
            if let Some(landed) = self.landed(&mut slot) {
                drop(slot);
                return self.into_landed(landed);
            }
            slot = self
                .flight
                .ready
                .wait(slot)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Waits until the execution ends or falls to this call.
    pub(crate) async fn wait(self) -> Landed<'c> {
        let landed = loop {
            {
                // Registered before the slot is read, so that an end
                // between the two still wakes this follower.
                let mut notified = pin!(self.flight.notify.notified());
                notified.as_mut().enable();
                if let Some(landed) = self.landed(&mut lock(&self.flight.slot)) {
                    break landed;
                }
                notified.await;
            }
            // Woken: most often by the end, read before registering again.
            if let Some(landed) = self.landed(&mut lock(&self.flight.slot)) {
                break landed;
            }
        };
        self.into_landed(landed)
    }
}

enum Slot {
    /// A leader runs the call.
    Running,
    /// The call's result.
    Done(SharedValue),
    /// The leader went away: the first follower to wake takes over.
    Leaderless,
}

/// One execution under way, waited for by blocking and async followers.
pub(crate) struct Flight {
    slot: Mutex<Slot>,
    /// Wakes blocking followers.
    ready: Condvar,
    /// Wakes async followers.
    notify: Notify,
}

impl Flight {
    fn new() -> Self {
        Flight {
            slot: Mutex::new(Slot::Running),
            ready: Condvar::new(),
            notify: Notify::new(),
        }
    }

    fn land(&self, slot: Slot) {
        *lock(&self.slot) = slot;
        self.ready.notify_all();
        self.notify.notify_waiters();
    }
}

/// The value a shared `Arc` holds, cloned: `None` only if the type the key
/// names were not the one stored, which the key's type id rules out.
pub(crate) fn cloned<V: Clone + 'static>(shared: &SharedValue) -> Option<V> {
    shared.downcast_ref::<V>().cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: u64) -> FlightKey {
        FlightKey::new::<u32, ()>(None, Some(&PartitionKey::Int(k)))
    }

    #[test]
    fn settings_are_checked() {
        assert!(Coalesce::new().validate().is_ok());
        let e = Coalesce::new().ttl(Duration::ZERO).validate().unwrap_err();
        assert_eq!((e.policy, e.field), ("coalesce", "ttl"));
        assert!(e.to_string().starts_with("coalesce.ttl must be > 0"), "{e}");
        let e = Coalesce::new()
            .ttl(Duration::from_secs(1))
            .max_entries(0)
            .validate()
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("coalesce.max_entries must be >= 1, got 0"),
            "{e}"
        );
        let e = Coalesce::new().max_entries(5).validate().unwrap_err();
        assert_eq!(e.field, "max_entries");
        assert_eq!(
            Coalesce::new().ttl(Duration::from_secs(1)).cache_entries(),
            Some(DEFAULT_MAX_ENTRIES)
        );
        assert_eq!(Coalesce::new().cache_entries(), None);
    }

    #[test]
    fn a_key_names_the_result_type() {
        let k = PartitionKey::Int(1);
        assert_ne!(
            FlightKey::new::<u32, ()>(None, Some(&k)),
            FlightKey::new::<u64, ()>(None, Some(&k))
        );
        assert_ne!(
            FlightKey::new::<u32, ()>(Some(&k), None),
            FlightKey::new::<u32, ()>(None, Some(&k))
        );
    }

    #[test]
    fn a_leader_leaves_the_table_and_a_dropped_one_is_replaced() {
        let c = Coalescer::new(&Coalesce::new());
        let clock = ClockHandle::System;
        let k = key(1);
        let Join::Lead(lead) = c.join(&k, &clock) else {
            panic!("the first call leads")
        };
        let Join::Follow(follower) = c.join(&k, &clock) else {
            panic!("the second call follows")
        };
        assert_eq!((c.in_flight(), c.waiters()), (1, 1));
        drop(lead);
        // Kept for its follower, which takes over.
        assert_eq!(c.in_flight(), 1);
        let Landed::TakenOver(lead) = follower.wait_blocking() else {
            panic!("the follower of a dropped leader leads")
        };
        assert_eq!(c.waiters(), 0);
        let Join::Follow(late) = c.join(&k, &clock) else {
            panic!("a newcomer follows the new leader")
        };
        lead.finish::<u32, ()>(&Ok(7), true, &clock);
        assert_eq!(c.in_flight(), 0);
        let Landed::Done(v) = late.wait_blocking() else {
            panic!("the newcomer gets the result")
        };
        assert_eq!(
            cloned::<Result<u32, Error<()>>>(&v).map(|r| r.ok()),
            Some(Some(7))
        );
        // A leader nobody follows leaves the table when it is dropped.
        let Join::Lead(lead) = c.join(&k, &clock) else {
            panic!("leads")
        };
        drop(lead);
        assert_eq!(c.in_flight(), 0);
    }
}
