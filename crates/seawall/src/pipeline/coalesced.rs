//! Coalesced calls: the blocking and the async driver of the coalescing
//! table ([`crate::coalesce`]). Both join the table by its one rule
//! (`Coalescer::join`), take the same [`Steps`] on its answers, run the
//! whole call through the pipeline when they lead, and wait for the leader
//! when they follow; they differ only in how they wait.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

use super::kind::{Handles, HandlesSync};
use super::{Given, Kind, Pipeline};
use crate::coalesce::{cloned, FlightKey, Follower, Join, Landed, Lead};
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
            let Some(coalescer) = pipeline.shared.coalesce.as_ref() else {
                return pipeline.run_in(Given::partitioned_in(partition), op).await;
            };
            let steps = Steps {
                pipeline,
                partition,
                caches: coalescer.caches(),
            };
            let lead = loop {
                let step = match steps.joined(coalescer.join(&key, &pipeline.shared.clock)) {
                    Step::Wait(follower) => steps.landed(follower.wait().await),
                    step => step,
                };
                match step {
                    Step::Done(result) => return result,
                    Step::Lead(lead) => break lead,
                    Step::Wait(_) | Step::Again => continue,
                }
            };
            let seen = AtomicBool::new(false);
            // A dropped future drops `lead`: a follower takes over.
            let result = pipeline
                .run_in(Given::reporting(partition, steps.report(&seen)), op)
                .await;
            steps.finish(lead, &result, &seen);
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
        let Some(coalescer) = pipeline.shared.coalesce.as_ref() else {
            return pipeline.call_in(Given::partitioned_in(partition), op);
        };
        // A blocking call of a hedged pipeline is refused whatever the
        // table holds: it neither takes a cached value or a concurrent
        // call's result nor leads an execution that async callers would
        // follow (they would get its refusal).
        if pipeline.shared.hedging.is_some() {
            return Err(Error::Config(Box::new(super::drive::hedging_is_async())));
        }
        let key = FlightKey::new::<T, E>(partition, self.key.as_ref());
        let steps = Steps {
            pipeline,
            partition,
            caches: coalescer.caches(),
        };
        let lead = loop {
            let step = match steps.joined(coalescer.join(&key, &pipeline.shared.clock)) {
                Step::Wait(follower) => steps.landed(follower.wait_blocking()),
                step => step,
            };
            match step {
                Step::Done(result) => return result,
                Step::Lead(lead) => break lead,
                Step::Wait(_) | Step::Again => continue,
            }
        };
        let seen = AtomicBool::new(false);
        // A panic drops `lead`: a follower takes over.
        let result = pipeline.call_in(Given::reporting(partition, steps.report(&seen)), op);
        steps.finish(lead, &result, &seen);
        result
    }
}

/// What a coalesced call does next.
enum Step<'c, T, E> {
    /// Return this result.
    Done(Result<T, Error<E>>),
    /// Run the call through the pipeline, then [`Steps::finish`] it.
    Lead(Lead<'c>),
    /// Wait for the execution under way.
    Wait(Follower<'c>),
    /// Join again (a value of another type, which the key rules out).
    Again,
}

/// The steps of a coalesced call, the same for both drivers: what each
/// answer of the table means, the events it reports, the end of a lead.
struct Steps<'a, K: Kind> {
    pipeline: &'a Pipeline<K>,
    partition: Option<&'a PartitionKey>,
    caches: bool,
}

impl<'a, K: Kind> Steps<'a, K> {
    fn emit(&self, kind: fn() -> EventKind) {
        self.pipeline.emit(self.partition, kind);
    }

    /// The table's answer to [`Coalescer::join`](crate::coalesce::Coalescer::join).
    fn joined<'c, T, E>(&self, join: Join<'c>) -> Step<'c, T, E>
    where
        T: Clone + 'static,
    {
        match join {
            Join::Cached(v) => match cloned::<T>(&v) {
                Some(v) => {
                    self.emit(|| EventKind::CacheHit);
                    Step::Done(Ok(v))
                }
                None => Step::Again,
            },
            Join::Lead(lead) => {
                if self.caches {
                    self.emit(|| EventKind::CacheMiss);
                }
                Step::Lead(lead)
            }
            Join::Follow(follower) => {
                if self.caches {
                    self.emit(|| EventKind::CacheMiss);
                }
                Step::Wait(follower)
            }
        }
    }

    /// How the followed execution ended for this call.
    fn landed<'c, T, E>(&self, landed: Landed<'c>) -> Step<'c, T, E>
    where
        T: Clone + 'static,
        E: Clone + 'static,
    {
        match landed {
            Landed::Done(v) => match cloned::<Result<T, Error<E>>>(&v) {
                Some(result) => {
                    self.emit(|| EventKind::Coalesced);
                    Step::Done(result)
                }
                None => Step::Again,
            },
            Landed::TakenOver(lead) => {
                self.emit(|| EventKind::CoalesceTakeover);
                Step::Lead(lead)
            }
        }
    }

    /// Where the leader's call reports that its fallback made the result:
    /// asked only when a cache must not keep it.
    fn report<'s>(&self, seen: &'s AtomicBool) -> Option<&'s AtomicBool> {
        (K::HAS_FALLBACK && self.caches).then_some(seen)
    }

    /// Ends the lead with the call's result: kept unless the fallback
    /// made it, given to the followers.
    fn finish<T, E>(&self, lead: Lead<'_>, result: &Result<T, Error<E>>, seen: &AtomicBool)
    where
        T: Clone + Send + Sync + 'static,
        E: Clone + Send + Sync + 'static,
    {
        lead.finish(
            result,
            !seen.load(Ordering::Relaxed),
            &self.pipeline.shared.clock,
        );
    }
}
