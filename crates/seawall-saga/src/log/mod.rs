//! The durable saga log: the [`SagaLog`] trait and its SQLite and Postgres
//! implementations.
//!
//! A log stores one row per saga (name, status, input, deadline, lease) and the
//! ordered list of its [`Transition`]s. Every write that changes a saga is
//! *fenced* by a [`Lease`]: the write succeeds only while the lease's token is
//! still the saga's current token. Claiming a saga (to recover or resume it)
//! gives it a new token, so a worker that lost its saga cannot write to it any
//! more; its next write fails with [`LogError::LeaseLost`].

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::clock::BoxFuture;
use crate::error::LogError;
use crate::id::SagaId;
use crate::transition::{SagaStatus, Transition, TransitionRecord};

#[cfg(feature = "postgres")]
pub mod postgres;
pub mod sqlite;

/// The future returned by every [`SagaLog`] method.
pub type LogFuture<'a, T> = BoxFuture<'a, Result<T, LogError>>;

/// The version of the tables this build reads and writes.
pub(crate) const SCHEMA_VERSION: u32 = 1;

/// A saga to insert.
#[derive(Clone, Debug)]
pub struct NewSaga {
    /// Its id.
    pub id: SagaId,
    /// The name of its definition.
    pub name: String,
    /// The input, serialised as JSON.
    pub input: String,
    /// When it must have finished its forward steps, if ever.
    pub deadline: Option<SystemTime>,
    /// Creation time (the orchestrator's clock).
    pub created_at: SystemTime,
}

/// The right to write a saga's transitions, given by a claim.
///
/// `token` is the saga's fencing token at claim time; a later claim by anyone
/// increments it, which invalidates this lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    saga_id: SagaId,
    token: i64,
}

impl Lease {
    /// A lease on `saga_id` with fencing token `token` (for log implementations).
    pub fn new(saga_id: SagaId, token: i64) -> Self {
        Lease { saga_id, token }
    }

    /// The saga.
    pub fn saga_id(&self) -> &SagaId {
        &self.saga_id
    }

    /// The fencing token.
    pub fn token(&self) -> i64 {
        self.token
    }
}

/// A saga's row in the log.
#[derive(Clone, Debug, PartialEq)]
pub struct SagaRecord {
    /// Its id.
    pub id: SagaId,
    /// The name of its definition.
    pub name: String,
    /// Where it stands.
    pub status: SagaStatus,
    /// The input as stored (JSON text).
    pub input: String,
    /// Its deadline, if any.
    pub deadline: Option<SystemTime>,
    /// Creation time.
    pub created_at: SystemTime,
    /// Time of the last transition.
    pub updated_at: SystemTime,
}

/// A saga claimed by this worker, with everything needed to continue it.
#[derive(Clone, Debug)]
pub struct ClaimedSaga {
    /// The saga's row.
    pub record: SagaRecord,
    /// The lease that fences this worker's writes.
    pub lease: Lease,
    /// Its history so far, in order, or why it could not be read (a damaged
    /// transition). A damaged history fails only this saga's recovery.
    pub history: Result<Vec<TransitionRecord>, LogError>,
}

/// The result of trying to claim one saga by id.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum ClaimAttempt {
    /// Claimed: this worker now drives it.
    Claimed(ClaimedSaga),
    /// The saga is completed or compensated; nothing to do.
    Finished(SagaRecord),
    /// Another worker holds a live lease on it.
    Held(SagaRecord),
    /// No such saga.
    NotFound,
}

/// Which sagas [`SagaLog::list`] returns.
///
/// # Default
///
/// Every status, from the start, at most 100 sagas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListQuery {
    status: Option<SagaStatus>,
    after: Option<SagaId>,
    limit: usize,
}

impl ListQuery {
    /// All sagas (up to the limit).
    pub fn all() -> Self {
        ListQuery {
            status: None,
            after: None,
            limit: 100,
        }
    }

    /// Sagas with this status.
    pub fn status(status: SagaStatus) -> Self {
        ListQuery {
            status: Some(status),
            ..Self::all()
        }
    }

    /// Only ids greater than `id` (for paging: pass the last id of the previous page).
    pub fn after(mut self, id: SagaId) -> Self {
        self.after = Some(id);
        self
    }

    /// At most `limit` sagas.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// The status filter.
    pub fn status_filter(&self) -> Option<SagaStatus> {
        self.status
    }

    /// The paging cursor.
    pub fn after_id(&self) -> Option<&SagaId> {
        self.after.as_ref()
    }

    /// The maximum number of sagas.
    pub fn max(&self) -> usize {
        self.limit
    }
}

impl Default for ListQuery {
    fn default() -> Self {
        Self::all()
    }
}

/// Durable storage of sagas and their transitions.
///
/// Implementations must make each call atomic (all transitions of an `append` or
/// none), durable when the future resolves `Ok`, and fenced: `append` and `renew`
/// succeed only while the lease's token is current.
pub trait SagaLog: Send + Sync + fmt::Debug + 'static {
    /// Inserts a saga with its first transitions (sequence numbers from 0).
    ///
    /// With `claim`, the caller gets a lease and drives the saga; without, the
    /// saga waits for [`claim_unfinished`](Self::claim_unfinished).
    ///
    /// # Errors
    ///
    /// [`LogError::AlreadyExists`] when the id is taken.
    fn create<'a>(
        &'a self,
        saga: &'a NewSaga,
        transitions: &'a [Transition],
        claim: bool,
    ) -> LogFuture<'a, Option<Lease>>;

    /// Appends transitions numbered from `first_seq` and sets the saga's status.
    /// A status that [releases the lease](SagaStatus::releases_lease) clears it.
    ///
    /// # Errors
    ///
    /// [`LogError::LeaseLost`] when the lease is no longer current; nothing is written.
    fn append<'a>(
        &'a self,
        lease: &'a Lease,
        first_seq: u32,
        transitions: &'a [Transition],
        status: SagaStatus,
        at: SystemTime,
    ) -> LogFuture<'a, ()>;

    /// Extends the lease (for logs whose leases expire).
    ///
    /// # Errors
    ///
    /// [`LogError::LeaseLost`] when the lease is no longer current.
    fn renew<'a>(&'a self, lease: &'a Lease) -> LogFuture<'a, ()>;

    /// Extends many leases at once; returns how many were still current.
    /// The default calls [`renew`](Self::renew) for each.
    fn renew_many<'a>(&'a self, leases: &'a [Lease]) -> LogFuture<'a, usize> {
        Box::pin(async move {
            let mut renewed = 0;
            for lease in leases {
                match self.renew(lease).await {
                    Ok(()) => renewed += 1,
                    Err(e) if e.is_lease_lost() => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(renewed)
        })
    }

    /// Claims up to `limit` running or compensating sagas that no live worker
    /// holds, with ids greater than `after`, in id order.
    fn claim_unfinished<'a>(
        &'a self,
        after: Option<&'a SagaId>,
        limit: usize,
    ) -> LogFuture<'a, Vec<ClaimedSaga>>;

    /// Claims one saga that is running, compensating or stuck and not held.
    fn claim<'a>(&'a self, id: &'a SagaId) -> LogFuture<'a, ClaimAttempt>;

    /// One saga's row.
    fn get<'a>(&'a self, id: &'a SagaId) -> LogFuture<'a, Option<SagaRecord>>;

    /// Sagas matching `query`, in id order.
    fn list<'a>(&'a self, query: &'a ListQuery) -> LogFuture<'a, Vec<SagaRecord>>;

    /// One saga's transitions in order (empty when the saga does not exist).
    fn history<'a>(&'a self, id: &'a SagaId) -> LogFuture<'a, Vec<TransitionRecord>>;

    /// How often the leases of sagas being driven must be renewed, or `None`
    /// when leases do not expire.
    fn lease_renewal_interval(&self) -> Option<Duration> {
        None
    }

    /// The name this log instance writes as lease owner.
    fn owner(&self) -> &str;

    /// Gives a lease back: the saga stays as last committed and is claimable
    /// at once by any worker, without waiting for the lease to expire. Does
    /// nothing when the lease is no longer current. The default does nothing
    /// (the saga is then claimable once its lease expires).
    fn release<'a>(&'a self, lease: &'a Lease) -> LogFuture<'a, ()> {
        let _ = lease;
        Box::pin(async { Ok(()) })
    }

    /// Tells serving workers that saga `id` was submitted (Postgres: a
    /// `NOTIFY`). Best effort: a lost announcement is made up for by the
    /// workers' polling. The default does nothing.
    fn announce<'a>(&'a self, id: &'a SagaId) -> LogFuture<'a, ()> {
        let _ = id;
        Box::pin(async { Ok(()) })
    }

    /// Starts listening for [announcements](Self::announce) of other
    /// processes, or `None` when this log has none (the worker then polls
    /// only). Listening stops when the returned [`Wakeups`] is dropped.
    fn listen(&self) -> LogFuture<'_, Option<Wakeups>> {
        Box::pin(async { Ok(None) })
    }
}

/// Wake-ups of a serving worker: each one means that work may be waiting.
/// Wake-ups that arrive while the worker is busy are merged into one.
#[derive(Debug)]
pub struct Wakeups {
    receiver: tokio::sync::mpsc::Receiver<()>,
}

impl Wakeups {
    /// Wake-ups sent on `receiver`'s channel (for log implementations). The
    /// sender learns that the worker stopped listening from
    /// `Sender::closed`.
    pub fn new(receiver: tokio::sync::mpsc::Receiver<()>) -> Self {
        Wakeups { receiver }
    }

    /// The next wake-up; `None` once the sender is gone (listening failed for
    /// good: the worker goes on polling).
    pub async fn next(&mut self) -> Option<()> {
        self.receiver.recv().await
    }
}

impl<L: SagaLog + ?Sized> SagaLog for Arc<L> {
    fn create<'a>(
        &'a self,
        saga: &'a NewSaga,
        transitions: &'a [Transition],
        claim: bool,
    ) -> LogFuture<'a, Option<Lease>> {
        (**self).create(saga, transitions, claim)
    }

    fn append<'a>(
        &'a self,
        lease: &'a Lease,
        first_seq: u32,
        transitions: &'a [Transition],
        status: SagaStatus,
        at: SystemTime,
    ) -> LogFuture<'a, ()> {
        (**self).append(lease, first_seq, transitions, status, at)
    }

    fn renew<'a>(&'a self, lease: &'a Lease) -> LogFuture<'a, ()> {
        (**self).renew(lease)
    }

    fn renew_many<'a>(&'a self, leases: &'a [Lease]) -> LogFuture<'a, usize> {
        (**self).renew_many(leases)
    }

    fn claim_unfinished<'a>(
        &'a self,
        after: Option<&'a SagaId>,
        limit: usize,
    ) -> LogFuture<'a, Vec<ClaimedSaga>> {
        (**self).claim_unfinished(after, limit)
    }

    fn claim<'a>(&'a self, id: &'a SagaId) -> LogFuture<'a, ClaimAttempt> {
        (**self).claim(id)
    }

    fn get<'a>(&'a self, id: &'a SagaId) -> LogFuture<'a, Option<SagaRecord>> {
        (**self).get(id)
    }

    fn list<'a>(&'a self, query: &'a ListQuery) -> LogFuture<'a, Vec<SagaRecord>> {
        (**self).list(query)
    }

    fn history<'a>(&'a self, id: &'a SagaId) -> LogFuture<'a, Vec<TransitionRecord>> {
        (**self).history(id)
    }

    fn lease_renewal_interval(&self) -> Option<Duration> {
        (**self).lease_renewal_interval()
    }

    fn owner(&self) -> &str {
        (**self).owner()
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> LogFuture<'a, ()> {
        (**self).release(lease)
    }

    fn announce<'a>(&'a self, id: &'a SagaId) -> LogFuture<'a, ()> {
        (**self).announce(id)
    }

    fn listen(&self) -> LogFuture<'_, Option<Wakeups>> {
        (**self).listen()
    }
}

/// A random-enough worker name: host-independent, unique per log instance.
pub(crate) fn generate_owner(prefix: &str) -> String {
    format!("{prefix}-{}", SagaId::generate())
}
