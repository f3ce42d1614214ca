//! Coalesced calls: the blocking and the async driver of the coalescing
//! table ([`crate::coalesce`]). Both join the table by its one rule
//! ([`Coalescer::join`]), run the whole call through the pipeline when
//! they lead, and wait for the leader when they follow; they differ only
//! in how they wait.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

use super::kind::{Handles, HandlesSync};
use super::{Kind, Pipeline};
use crate::coalesce::{cloned, FlightKey, Join, Landed};
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
    ) -> impl Future<Output = Result<T, Error<E>>> + use<'p, K, T, E, Op, Fut>
    where
        K: Handles<T, E>,
        T: Clone + Send + Sync + 'static,
        E: Clone + Send + Sync + 'static,
        Op: FnMut(Context) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        // The future owns its key (a reference count at most), so that it
        // may outlive this value.
        let key = FlightKey::new::<T, E>(self.partition.as_ref(), self.key.as_ref());
        let pipeline = self.pipeline;
        async move {
            let partition = key.partition();
            let emit = |kind: fn() -> EventKind| pipeline.emit(partition, kind);
            let Some(coalescer) = pipeline.shared.coalesce.as_ref() else {
                return pipeline.run_in(partition, 1, None, op).await;
            };
            let clock = &pipeline.shared.clock;
            let lead = loop {
                let follower = match coalescer.join(&key, clock) {
                    Join::Cached(v) => match cloned::<T>(&v) {
                        Some(v) => {
                            emit(|| EventKind::CacheHit);
                            return Ok(v);
                        }
                        None => continue,
                    },
                    Join::Lead(lead) => {
                        if coalescer.caches() {
                            emit(|| EventKind::CacheMiss);
                        }
                        break lead;
                    }
                    Join::Follow(follower) => follower,
                };
                if coalescer.caches() {
                    emit(|| EventKind::CacheMiss);
                }
                match follower.wait().await {
                    Landed::Done(v) => {
                        if let Some(result) = cloned::<Result<T, Error<E>>>(&v) {
                            emit(|| EventKind::Coalesced);
                            return result;
                        }
                    }
                    Landed::TakenOver(lead) => {
                        emit(|| EventKind::CoalesceTakeover);
                        break lead;
                    }
                }
            };
            let seen = AtomicBool::new(false);
            let report = (K::HAS_FALLBACK && coalescer.caches()).then_some(&seen);
            // A dropped future drops `lead`: a follower takes over.
            let result = pipeline.run_in(partition, 1, report, op).await;
            lead.finish(&result, !seen.load(Ordering::Relaxed), clock);
            result
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
        let emit = |kind: fn() -> EventKind| pipeline.emit(partition, kind);
        let Some(coalescer) = pipeline.shared.coalesce.as_ref() else {
            return pipeline.call_in(partition, 1, None, op);
        };
        let key = FlightKey::new::<T, E>(partition, self.key.as_ref());
        let clock = &pipeline.shared.clock;
        let lead = loop {
            let follower = match coalescer.join(&key, clock) {
                Join::Cached(v) => match cloned::<T>(&v) {
                    Some(v) => {
                        emit(|| EventKind::CacheHit);
                        return Ok(v);
                    }
                    None => continue,
                },
                Join::Lead(lead) => {
                    if coalescer.caches() {
                        emit(|| EventKind::CacheMiss);
                    }
                    break lead;
                }
                Join::Follow(follower) => follower,
            };
            if coalescer.caches() {
                emit(|| EventKind::CacheMiss);
            }
            match follower.wait_blocking() {
                Landed::Done(v) => {
                    if let Some(result) = cloned::<Result<T, Error<E>>>(&v) {
                        emit(|| EventKind::Coalesced);
                        return result;
                    }
                }
                Landed::TakenOver(lead) => {
                    emit(|| EventKind::CoalesceTakeover);
                    break lead;
                }
            }
        };
        let seen = AtomicBool::new(false);
        let report = (K::HAS_FALLBACK && coalescer.caches()).then_some(&seen);
        // A panic drops `lead`: a follower takes over.
        let result = pipeline.call_in(partition, 1, report, op);
        lead.finish(&result, !seen.load(Ordering::Relaxed), clock);
        result
    }
}
