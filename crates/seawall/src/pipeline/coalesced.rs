//! Coalesced calls: the blocking and the async driver of the coalescing
//! table ([`crate::coalesce`]). Both join the table by its one rule
//! ([`Coalescer::join`]), run the whole call through the pipeline when
//! they lead, and wait for the leader when they follow; they differ only
//! in how they wait.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

use super::kind::{Handles, HandlesSync};
use super::{Kind, Pipeline};
use crate::coalesce::{cloned, Coalescer, FlightKey, Join, Landed};
use crate::context::{Context, PartitionKey};
use crate::error::Error;
use crate::event::EventKind;

/// Calls that share one execution with the concurrent calls of the same
/// key; see [`Pipeline::coalesce_key`] and [`crate::coalesce`].
#[derive(Debug)]
pub struct Coalesced<'p, K: Kind = super::AnyResult> {
    pipeline: &'p Pipeline<K>,
    partition: Option<PartitionKey>,
    key: Option<PartitionKey>,
}

impl<'p, K: Kind> Coalesced<'p, K> {
    pub(super) fn new(
        pipeline: &'p Pipeline<K>,
        partition: Option<PartitionKey>,
        key: Option<PartitionKey>,
    ) -> Self {
        Coalesced {
            pipeline,
            partition,
            key,
        }
    }

    /// The key given per call, if any.
    pub fn key(&self) -> Option<&PartitionKey> {
        self.key.as_ref()
    }

    /// The partition the calls run in, if any.
    pub fn partition(&self) -> Option<&PartitionKey> {
        self.partition.as_ref()
    }

    fn emit(&self, kind: impl FnOnce() -> EventKind) {
        self.pipeline.emit(self.partition.as_ref(), kind);
    }

    /// What a call that is not answered by the cache reports, once.
    fn missed(&self, coalescer: &Coalescer) {
        if coalescer.caches() {
            self.emit(|| EventKind::CacheMiss);
        }
    }

    /// Runs an async operation, or shares the execution under way with the
    /// same key, or takes a fresh cached success. See [`Pipeline::run`]
    /// and [`crate::coalesce`].
    ///
    /// # Errors
    /// As for [`Pipeline::run`]; a follower gets a clone of the leader's
    /// error.
    pub fn run<T, E, Op, Fut>(
        &self,
        op: Op,
    ) -> impl Future<Output = Result<T, Error<E>>> + use<'_, 'p, K, T, E, Op, Fut>
    where
        K: Handles<T, E>,
        T: Clone + Send + Sync + 'static,
        E: Clone + Send + Sync + 'static,
        Op: FnMut(Context) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        async move {
            let pipeline = self.pipeline;
            let partition = self.partition.as_ref();
            let Some(coalescer) = pipeline.shared.coalesce.as_ref() else {
                return pipeline.run_in(partition, 1, None, op).await;
            };
            let key = FlightKey::new::<T, E>(partition, self.key.as_ref());
            let clock = &pipeline.shared.clock;
            let mut first = true;
            loop {
                match coalescer.join(&key, clock) {
                    Join::Cached(v) => {
                        if let Some(v) = cloned::<T>(&v) {
                            self.emit(|| EventKind::CacheHit);
                            return Ok(v);
                        }
                    }
                    Join::Lead(lead) => {
                        if first {
                            self.missed(coalescer);
                        } else {
                            self.emit(|| EventKind::CoalesceTakeover);
                        }
                        let seen = AtomicBool::new(false);
                        let report = (K::HAS_FALLBACK && coalescer.caches()).then_some(&seen);
                        let result = pipeline.run_in(partition, 1, report, op).await;
                        lead.finish(&result, !seen.load(Ordering::Relaxed), clock);
                        return result;
                    }
                    Join::Follow(flight) => {
                        if first {
                            self.missed(coalescer);
                        }
                        if let Landed::Done(v) = flight.wait().await {
                            if let Some(result) = cloned::<Result<T, Error<E>>>(&v) {
                                self.emit(|| EventKind::Coalesced);
                                return result;
                            }
                        }
                    }
                }
                first = false;
            }
        }
    }

    /// Runs a blocking operation, or waits for the execution under way
    /// with the same key (blocking the thread), or takes a fresh cached
    /// success. See [`Pipeline::call`] and [`crate::coalesce`].
    ///
    /// # Errors
    /// As for [`Pipeline::call`]; a follower gets a clone of the leader's
    /// error.
    pub fn call<T, E, Op>(&self, op: Op) -> Result<T, Error<E>>
    where
        K: HandlesSync<T, E>,
        T: Clone + Send + Sync + 'static,
        E: Clone + Send + Sync + 'static,
        Op: FnMut(Context) -> Result<T, E>,
    {
        let pipeline = self.pipeline;
        let partition = self.partition.as_ref();
        let Some(coalescer) = pipeline.shared.coalesce.as_ref() else {
            return pipeline.call_in(partition, 1, None, op);
        };
        let key = FlightKey::new::<T, E>(partition, self.key.as_ref());
        let clock = &pipeline.shared.clock;
        let mut first = true;
        loop {
            match coalescer.join(&key, clock) {
                Join::Cached(v) => {
                    if let Some(v) = cloned::<T>(&v) {
                        self.emit(|| EventKind::CacheHit);
                        return Ok(v);
                    }
                }
                Join::Lead(lead) => {
                    if first {
                        self.missed(coalescer);
                    } else {
                        self.emit(|| EventKind::CoalesceTakeover);
                    }
                    let seen = AtomicBool::new(false);
                    let report = (K::HAS_FALLBACK && coalescer.caches()).then_some(&seen);
                    // A panic drops `lead`, which wakes the followers.
                    let result = pipeline.call_in(partition, 1, report, op);
                    lead.finish(&result, !seen.load(Ordering::Relaxed), clock);
                    return result;
                }
                Join::Follow(flight) => {
                    if first {
                        self.missed(coalescer);
                    }
                    if let Landed::Done(v) = flight.wait_blocking() {
                        if let Some(result) = cloned::<Result<T, Error<E>>>(&v) {
                            self.emit(|| EventKind::Coalesced);
                            return result;
                        }
                    }
                }
            }
            first = false;
        }
    }
}
