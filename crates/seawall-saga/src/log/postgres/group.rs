//! Group commit of saga creations and appends on Postgres.
//!
//! Every [`create`](crate::SagaLog::create) and
//! [`append`](crate::SagaLog::append) is queued; a few writer tasks, each on a
//! connection of the pool, take whatever is queued when they are free (up to
//! the batch limit) and write it in **one statement**, so one commit (one WAL
//! flush) carries the transitions of many sagas. A write is acknowledged only
//! after the commit that holds it returned: as durable as a statement of its
//! own. A lone write finds a free writer and goes at once.
//!
//! Each write keeps its own fence: a saga's row is updated only where its
//! lease token and owner still match, and its transitions are inserted only
//! for the rows created or updated, so a fenced-out saga gets
//! [`LogError::LeaseLost`] (a taken id [`LogError::AlreadyExists`]) while the
//! others of the batch are written. When the statement fails as a whole (a
//! database error), each write of the batch is tried again alone, so only the
//! one at fault sees the error. A saga appears at most once per batch (a
//! second write of it waits for the next one), and a write whose caller has
//! gone (its future dropped) before a writer took it is not written.

use std::collections::HashSet;
use std::sync::{Arc, Weak};

use tokio::sync::{mpsc, oneshot, Mutex};

use super::{Columns, Inner, PostgresLog};
use crate::error::LogError;
use crate::id::SagaId;

/// One saga's write, waiting for a group commit.
pub(super) struct Write {
    pub(super) saga_id: SagaId,
    pub(super) kind: WriteKind,
    /// When the transitions were recorded (milliseconds since the epoch).
    pub(super) at_ms: i64,
    pub(super) transitions: Columns,
}

/// A creation or an append.
pub(super) enum WriteKind {
    /// A new saga's row (claimed by this worker or not).
    Create {
        name: String,
        input: String,
        deadline_ms: Option<i64>,
        claim: bool,
    },
    /// Transitions of a saga this worker holds, with the status they lead to.
    Append {
        token: i64,
        status: &'static str,
        releases_lease: bool,
    },
}

/// A queued write and where its outcome goes: `true` when written, `false`
/// when refused (the id was taken, or the lease lost).
pub(super) struct Pending {
    pub(super) write: Write,
    pub(super) reply: oneshot::Sender<Result<bool, LogError>>,
}

/// The queue the writers share.
pub(super) type Queue = Arc<Mutex<mpsc::UnboundedReceiver<Pending>>>;

/// Starts `writers` writer tasks on `queue`, writer `i` on pool slot `i`.
pub(super) fn spawn_writers(inner: &Arc<Inner>, queue: &Queue, writers: usize) {
    for slot in 0..writers {
        tokio::spawn(write_loop(Arc::downgrade(inner), slot, Arc::clone(queue)));
    }
}

/// Takes a batch from the queue, writes it, answers each write; ends when
/// every handle of the log is gone.
async fn write_loop(inner: Weak<Inner>, slot: usize, queue: Queue) {
    let mut carried: Vec<Pending> = Vec::new();
    loop {
        let mut taken = std::mem::take(&mut carried);
        let max_batch = match inner.upgrade() {
            Some(inner) => inner.options.max_batch,
            None => return,
        };
        // With writes carried over, the queue is only looked at if no other
        // writer is waiting on it: they are written now, not after the next
        // arrival.
        let receiver = if taken.is_empty() {
            let mut receiver = queue.lock().await;
            match receiver.recv().await {
                Some(pending) => taken.push(pending),
                None => return,
            }
            Some(receiver)
        } else {
            queue.try_lock().ok()
        };
        if let Some(mut receiver) = receiver {
            while taken.len() < max_batch {
                match receiver.try_recv() {
                    Ok(pending) => taken.push(pending),
                    Err(_) => break,
                }
            }
        }
        let mut batch = Vec::with_capacity(taken.len());
        let mut sagas = HashSet::with_capacity(taken.len());
        for pending in taken {
            if pending.reply.is_closed() {
                continue;
            }
            if sagas.insert(pending.write.saga_id.clone()) {
                batch.push(pending);
            } else {
                carried.push(pending);
            }
        }
        if batch.is_empty() {
            continue;
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let log = PostgresLog { inner };
        log.write_batch(slot, batch).await;
    }
}

/// The arrays of one group-commit statement.
#[derive(Default)]
pub(super) struct BatchColumns {
    pub(super) create_id: Vec<String>,
    pub(super) create_name: Vec<String>,
    pub(super) create_input: Vec<String>,
    pub(super) create_deadline: Vec<Option<i64>>,
    pub(super) create_at: Vec<i64>,
    pub(super) create_claim: Vec<bool>,
    pub(super) append_id: Vec<String>,
    pub(super) append_token: Vec<i64>,
    pub(super) append_status: Vec<&'static str>,
    pub(super) append_at: Vec<i64>,
    pub(super) append_releases: Vec<bool>,
    pub(super) t_saga: Vec<String>,
    pub(super) t_at: Vec<i64>,
    pub(super) t_seq: Vec<i32>,
    pub(super) t_kind: Vec<&'static str>,
    pub(super) t_step: Vec<Option<i32>>,
    pub(super) t_step_name: Vec<Option<String>>,
    pub(super) t_attempt: Vec<Option<i32>>,
    pub(super) t_data: Vec<Option<String>>,
}

impl BatchColumns {
    /// The columns of `writes`.
    pub(super) fn of<'a>(writes: impl IntoIterator<Item = &'a Write>) -> Self {
        let mut c = BatchColumns::default();
        for w in writes {
            let id = w.saga_id.as_str();
            match &w.kind {
                WriteKind::Create {
                    name,
                    input,
                    deadline_ms,
                    claim,
                } => {
                    c.create_id.push(id.to_owned());
                    c.create_name.push(name.clone());
                    c.create_input.push(input.clone());
                    c.create_deadline.push(*deadline_ms);
                    c.create_at.push(w.at_ms);
                    c.create_claim.push(*claim);
                }
                WriteKind::Append {
                    token,
                    status,
                    releases_lease,
                } => {
                    c.append_id.push(id.to_owned());
                    c.append_token.push(*token);
                    c.append_status.push(status);
                    c.append_at.push(w.at_ms);
                    c.append_releases.push(*releases_lease);
                }
            }
            let t = &w.transitions;
            c.t_saga.extend(t.seq.iter().map(|_| id.to_owned()));
            c.t_at.extend(t.seq.iter().map(|_| w.at_ms));
            c.t_seq.extend_from_slice(&t.seq);
            c.t_kind.extend_from_slice(&t.kind);
            c.t_step.extend_from_slice(&t.step);
            c.t_step_name.extend_from_slice(&t.step_name);
            c.t_attempt.extend_from_slice(&t.attempt);
            c.t_data.extend_from_slice(&t.data);
        }
        c
    }
}

/// The group-commit statement in schema `s` (quoted): creates, appends and
/// the transitions of those that were written, in one statement; returns
/// the ids written. Parameters: `$1` owner, `$2` lease in milliseconds, then
/// the arrays of [`BatchColumns`] in order.
pub(super) fn statement(s: &str) -> String {
    format!(
        "WITH created AS (
           INSERT INTO {s}.sagas
             (id, name, status, input, deadline_ms, created_ms, updated_ms,
              lease_owner, lease_token, lease_expires_at)
           SELECT c.id, c.name, 'running', c.input, c.deadline_ms, c.at_ms, c.at_ms,
             CASE WHEN c.claim THEN $1::text END,
             CASE WHEN c.claim THEN 1 ELSE 0 END,
             CASE WHEN c.claim
                  THEN clock_timestamp() + $2::int8 * interval '1 millisecond' END
           FROM unnest($3::text[], $4::text[], $5::text[], $6::int8[], $7::int8[], $8::bool[])
             AS c(id, name, input, deadline_ms, at_ms, claim)
           ON CONFLICT (id) DO NOTHING
           RETURNING id),
         appended AS (
           UPDATE {s}.sagas AS g SET status = a.status, updated_ms = a.at_ms,
             lease_owner = CASE WHEN a.releases THEN NULL ELSE g.lease_owner END,
             lease_expires_at = CASE WHEN a.releases THEN NULL
               ELSE clock_timestamp() + $2::int8 * interval '1 millisecond' END
           FROM unnest($9::text[], $10::int8[], $11::text[], $12::int8[], $13::bool[])
             AS a(id, token, status, at_ms, releases)
           WHERE g.id = a.id AND g.lease_token = a.token AND g.lease_owner = $1::text
           RETURNING g.id),
         written AS (
           SELECT id FROM created UNION ALL SELECT id FROM appended),
         inserted AS (
           INSERT INTO {s}.saga_transitions
             (saga_id, seq, at_ms, kind, step, step_name, attempt, data)
           SELECT t.saga_id, t.seq, t.at_ms, t.kind, t.step, t.step_name, t.attempt, t.data
           FROM unnest($14::text[], $15::int8[], $16::int4[], $17::text[], $18::int4[],
                       $19::text[], $20::int4[], $21::text[])
             AS t(saga_id, at_ms, seq, kind, step, step_name, attempt, data)
           WHERE t.saga_id IN (SELECT id FROM written))
         SELECT id FROM written"
    )
}
