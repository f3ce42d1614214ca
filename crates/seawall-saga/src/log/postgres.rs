//! The Postgres saga log: many orchestrator processes on one database.
//!
//! # Leases
//!
//! A worker drives a saga only while it holds the saga's lease: a row-level
//! `lease_owner`, a `lease_token` and a `lease_expires_at` timestamp taken from
//! the **database server's clock**, so workers need not agree on time.
//! [`claim_unfinished`](SagaLog::claim_unfinished) takes running or compensating
//! sagas whose lease is absent or expired with
//! `SELECT ... FOR UPDATE SKIP LOCKED`, so concurrent workers never wait for or
//! claim the same row, and increments the token. Every append and renewal is
//! conditioned on the token (and owner): a worker whose lease expired and was
//! taken over gets [`LogError::LeaseLost`] and writes nothing more. Appends
//! extend the lease; the orchestrator also renews the leases of all the sagas it
//! is driving, in one statement, every third of the lease, so a slow step keeps
//! its saga. A worker that dies stops
//! renewing, and its sagas are claimable once the lease has expired.
//!
//! A worker that shuts down [releases](SagaLog::release) the leases of the
//! sagas it stopped (`lease_owner` and `lease_expires_at` cleared, fenced by
//! the token), so they are claimable at once.
//!
//! # Notifications
//!
//! [`announce`](SagaLog::announce) (called by `Orchestrator::submit`) and
//! [`release`](SagaLog::release) send a `NOTIFY` on the channel
//! `seawall_saga_{schema}` (cut to 63 bytes) with the saga id as payload.
//! [`listen`](SagaLog::listen) opens a connection of its own that `LISTEN`s on
//! it, wakes the worker once when it starts listening (something may have been
//! announced before) and once per notification, and connects again a second
//! after losing its connection. Notifications are only a shortcut: a lost one
//! delays a saga until the worker's next poll.
//!
//! # Group commit
//!
//! Creations and appends are written by a few writer tasks, each taking what
//! is queued when it is free and writing it in one statement (fenced `UPDATE`
//! or `INSERT` of each saga's row plus the `INSERT` of the transitions of the
//! rows written, in one CTE): atomic without an explicit transaction, and one
//! commit for the transitions of many concurrent sagas. A saga whose lease was
//! lost is refused while the others of its batch are written. With Postgres'
//! default `synchronous_commit = on`, an acknowledged write is durable: it is
//! acknowledged after the commit that holds it. See
//! [`PostgresOptions::writers`] and [`PostgresOptions::max_batch`].
//!
//! # Tables
//!
//! In the configured schema (default `seawall_saga`): `saga_log_meta`, `sagas`,
//! `saga_transitions`. They are created on first connect under an advisory lock.
//! A schema that has a `sagas` table but no saga log metadata is refused as
//! [`LogError::Foreign`].

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, oneshot, RwLock};
use tokio_postgres::{AsyncMessage, Client, NoTls, Row, Statement};

use super::{
    generate_owner, ClaimAttempt, ClaimedSaga, Lease, ListQuery, LogFuture, NewSaga, SagaLog,
    SagaRecord, Wakeups, SCHEMA_VERSION,
};
use crate::clock::{from_millis, to_millis};
use crate::error::LogError;
use crate::id::SagaId;
use crate::transition::{Encoded, SagaStatus, Transition, TransitionRecord};

mod group;

use group::{BatchColumns, Pending, Queue, Write, WriteKind};

/// Options of a [`PostgresLog`].
///
/// # Default
///
/// Schema `seawall_saga`, lease 30 s, 8 connections, 2 writers, at most 256
/// writes per group commit, connect timeout 5 s, operation timeout 30 s, a
/// generated worker name.
#[derive(Clone, Debug)]
pub struct PostgresOptions {
    schema: String,
    lease: Duration,
    connections: usize,
    writers: usize,
    max_batch: usize,
    connect_timeout: Duration,
    operation_timeout: Duration,
    worker_name: Option<String>,
}

impl PostgresOptions {
    /// The defaults.
    pub fn new() -> Self {
        PostgresOptions {
            schema: "seawall_saga".into(),
            lease: Duration::from_secs(30),
            connections: 8,
            writers: 2,
            max_batch: 256,
            connect_timeout: Duration::from_secs(5),
            operation_timeout: Duration::from_secs(30),
            worker_name: None,
        }
    }

    /// The schema holding the tables: lowercase letters, digits and `_`, starting
    /// with a letter or `_`, at most 63 characters.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// How long a claim lasts without renewal (at least 10 ms). A dead worker's
    /// sagas are taken over after this long.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_millis(10));
        self
    }

    /// How many connections this log keeps (at least 1), opened as needed.
    /// The [writers](Self::writers) use the first ones; reads, claims and
    /// lease renewals are spread over all of them.
    pub fn connections(mut self, connections: usize) -> Self {
        self.connections = connections.max(1);
        self
    }

    /// How many writer tasks group creations and appends into commits (at
    /// least 1; at most the number of [connections](Self::connections)). A
    /// writer writes, in one statement and one commit, every write queued
    /// when it is free: more writers send smaller batches sooner, fewer
    /// writers larger batches (fewer commits for the server to flush).
    pub fn writers(mut self, writers: usize) -> Self {
        self.writers = writers.max(1);
        self
    }

    /// The most writes (one saga's creation or append each) grouped into one
    /// commit (at least 1).
    pub fn max_batch(mut self, max: usize) -> Self {
        self.max_batch = max.max(1);
        self
    }

    /// How long connecting may take.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long any single log operation may take.
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// The name written as lease owner (default: generated, unique per log).
    pub fn worker_name(mut self, name: impl Into<String>) -> Self {
        self.worker_name = Some(name.into());
        self
    }
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self::new()
    }
}

/// A saga log in a Postgres schema. Cheap to clone; clones share connections.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), seawall_saga::LogError> {
/// use std::time::Duration;
/// use seawall_saga::{PostgresLog, PostgresOptions};
///
/// let log = PostgresLog::connect(
///     "postgres://app@127.0.0.1:5432/app",
///     PostgresOptions::new().lease(Duration::from_secs(10)),
/// )
/// .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresLog {
    inner: Arc<Inner>,
}

struct Inner {
    config: tokio_postgres::Config,
    target: String,
    options: PostgresOptions,
    owner: String,
    slots: Vec<RwLock<Option<Arc<Conn>>>>,
    next: AtomicUsize,
    /// The `LISTEN`/`NOTIFY` channel of this schema.
    channel: String,
    /// Creations and appends waiting for a writer.
    writes: mpsc::UnboundedSender<Pending>,
}

impl fmt::Debug for PostgresLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLog")
            .field("target", &self.inner.target)
            .field("schema", &self.inner.options.schema)
            .field("owner", &self.inner.owner)
            .field("lease", &self.inner.options.lease)
            .finish()
    }
}

struct Conn {
    client: Client,
    write: Statement,
    renew: Statement,
    renew_many: Statement,
    claim_batch: Statement,
    claim_one: Statement,
    history: Statement,
    get: Statement,
    list: Statement,
    release: Statement,
    announce: Statement,
}

const RECORD_COLUMNS: &str = "id, name, status, input, deadline_ms, created_ms, updated_ms";

fn valid_schema(schema: &str) -> bool {
    let mut chars = schema.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && schema.len() <= 63
}

impl PostgresLog {
    /// Connects to `url` (a `postgres://` URL or key=value string), creates the
    /// tables if needed and checks they belong to a saga log.
    ///
    /// # Errors
    ///
    /// [`LogError::Config`] for a bad URL or schema name, [`LogError::Connect`]
    /// when the server cannot be reached within the connect timeout,
    /// [`LogError::Foreign`] or [`LogError::UnsupportedSchema`] when the schema
    /// holds something else.
    pub async fn connect(url: &str, options: PostgresOptions) -> Result<Self, LogError> {
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| LogError::Config {
            detail: format!("invalid postgres url: {e}"),
        })?;
        if !valid_schema(&options.schema) {
            return Err(LogError::Config {
                detail: format!(
                    "schema {:?} must be lowercase letters, digits and `_`",
                    options.schema
                ),
            });
        }
        config.connect_timeout(options.connect_timeout);
        let target = describe_target(&config);
        let owner = options
            .worker_name
            .clone()
            .unwrap_or_else(|| generate_owner("pg"));
        let channel = notify_channel(&options.schema);
        let slots = (0..options.connections)
            .map(|_| RwLock::new(None))
            .collect();
        let writers = options.writers.min(options.connections);
        let (writes, queue) = mpsc::unbounded_channel();
        let queue: Queue = Arc::new(tokio::sync::Mutex::new(queue));
        let log = PostgresLog {
            inner: Arc::new(Inner {
                config,
                target,
                options,
                owner,
                slots,
                next: AtomicUsize::new(0),
                channel,
                writes,
            }),
        };
        let first = log.migrate_and_open().await?;
        *log.inner.slots[0].write().await = Some(first);
        group::spawn_writers(&log.inner, &queue, writers);
        Ok(log)
    }

    /// The schema holding the tables.
    pub fn schema(&self) -> &str {
        &self.inner.options.schema
    }

    /// The lease duration.
    pub fn lease(&self) -> Duration {
        self.inner.options.lease
    }

    async fn raw_connect(&self) -> Result<Client, LogError> {
        let timeout = self.inner.options.connect_timeout;
        let connect_error = |source| LogError::Connect {
            target: self.inner.target.clone(),
            source,
        };
        let (client, connection) =
            match tokio::time::timeout(timeout, self.inner.config.connect(NoTls)).await {
                Err(_) => return Err(connect_error(None)),
                Ok(Err(e)) => return Err(connect_error(Some(Arc::new(e)))),
                Ok(Ok(pair)) => pair,
            };
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(error = %e, "saga log postgres connection closed");
            }
        });
        Ok(client)
    }

    async fn migrate_and_open(&self) -> Result<Arc<Conn>, LogError> {
        let schema = &self.inner.options.schema;
        let client = self.raw_connect().await?;
        let location = format!("{}, schema {schema}", self.inner.target);
        let row = client
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL",
                &[
                    &format!("\"{schema}\".saga_log_meta"),
                    &format!("\"{schema}\".sagas"),
                ],
            )
            .await?;
        let (has_meta, has_sagas): (bool, bool) = (row.try_get(0)?, row.try_get(1)?);
        if has_sagas && !has_meta {
            return Err(LogError::Foreign {
                location,
                detail: "it has a `sagas` table that is not a saga log".into(),
            });
        }
        let migration = format!(
            "BEGIN;
             SELECT pg_advisory_xact_lock(730718600, hashtext('{schema}'));
             CREATE SCHEMA IF NOT EXISTS \"{schema}\";
             CREATE TABLE IF NOT EXISTS \"{schema}\".saga_log_meta (key text PRIMARY KEY, value text NOT NULL);
             INSERT INTO \"{schema}\".saga_log_meta (key, value) VALUES ('schema_version', '{SCHEMA_VERSION}')
                 ON CONFLICT (key) DO NOTHING;
             CREATE TABLE IF NOT EXISTS \"{schema}\".sagas (
                 id text COLLATE \"C\" PRIMARY KEY,
                 name text NOT NULL,
                 status text NOT NULL,
                 input text NOT NULL,
                 deadline_ms bigint,
                 created_ms bigint NOT NULL,
                 updated_ms bigint NOT NULL,
                 lease_owner text,
                 lease_token bigint NOT NULL DEFAULT 0,
                 lease_expires_at timestamptz
             );
             CREATE INDEX IF NOT EXISTS sagas_in_progress ON \"{schema}\".sagas (id)
                 WHERE status IN ('running', 'compensating');
             CREATE INDEX IF NOT EXISTS sagas_by_status ON \"{schema}\".sagas (status, id);
             CREATE TABLE IF NOT EXISTS \"{schema}\".saga_transitions (
                 saga_id text COLLATE \"C\" NOT NULL,
                 seq int4 NOT NULL,
                 at_ms bigint NOT NULL,
                 kind text NOT NULL,
                 step int4,
                 step_name text,
                 attempt int4,
                 data text,
                 PRIMARY KEY (saga_id, seq)
             );
             COMMIT;"
        );
        if let Err(e) = client.batch_execute(&migration).await {
            let _ = client.batch_execute("ROLLBACK").await;
            return Err(e.into());
        }
        let version: String = client
            .query_one(
                &format!(
                    "SELECT value FROM \"{schema}\".saga_log_meta WHERE key = 'schema_version'"
                ),
                &[],
            )
            .await?
            .try_get(0)?;
        if version != SCHEMA_VERSION.to_string() {
            return Err(LogError::UnsupportedSchema {
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        self.prepare(client).await.map_err(|e| match e {
            LogError::Postgres(source) => LogError::Foreign {
                location,
                detail: format!("its tables do not have the saga log columns: {source}"),
            },
            other => other,
        })
    }

    async fn prepare(&self, client: Client) -> Result<Arc<Conn>, LogError> {
        let s = format!("\"{}\"", self.inner.options.schema);
        let write = client.prepare(&group::statement(&s)).await?;
        let renew = client
            .prepare(&format!(
                "UPDATE {s}.sagas SET lease_expires_at = clock_timestamp() + $3::int8 * interval '1 millisecond'
                 WHERE id = $1 AND lease_token = $2 AND lease_owner = $4"
            ))
            .await?;
        let renew_many = client
            .prepare(&format!(
                "UPDATE {s}.sagas AS g
                 SET lease_expires_at = clock_timestamp() + $3::int8 * interval '1 millisecond'
                 FROM unnest($1::text[], $2::int8[]) AS l(id, token)
                 WHERE g.id = l.id AND g.lease_token = l.token AND g.lease_owner = $4"
            ))
            .await?;
        let claim_batch = client
            .prepare(&format!(
                "UPDATE {s}.sagas AS g SET lease_owner = $1, lease_token = g.lease_token + 1,
                   lease_expires_at = clock_timestamp() + $2::int8 * interval '1 millisecond'
                 FROM (SELECT id FROM {s}.sagas
                       WHERE status IN ('running', 'compensating') AND id > $3
                         AND (lease_expires_at IS NULL OR lease_expires_at < clock_timestamp())
                       ORDER BY id LIMIT $4
                       FOR UPDATE SKIP LOCKED) AS c
                 WHERE g.id = c.id
                 RETURNING g.lease_token, g.id, g.name, g.status, g.input, g.deadline_ms,
                           g.created_ms, g.updated_ms"
            ))
            .await?;
        let claim_one = client
            .prepare(&format!(
                "UPDATE {s}.sagas SET lease_owner = $1, lease_token = lease_token + 1,
                   lease_expires_at = clock_timestamp() + $2::int8 * interval '1 millisecond'
                 WHERE id = $3 AND status IN ('running', 'compensating', 'stuck')
                   AND (lease_expires_at IS NULL OR lease_expires_at < clock_timestamp())
                 RETURNING lease_token, {RECORD_COLUMNS}"
            ))
            .await?;
        let history = client
            .prepare(&format!(
                "SELECT saga_id, seq, at_ms, kind, step, step_name, attempt, data
                 FROM {s}.saga_transitions WHERE saga_id = ANY($1) ORDER BY saga_id, seq"
            ))
            .await?;
        let get = client
            .prepare(&format!(
                "SELECT {RECORD_COLUMNS} FROM {s}.sagas WHERE id = $1"
            ))
            .await?;
        let list = client
            .prepare(&format!(
                "SELECT {RECORD_COLUMNS} FROM {s}.sagas
                 WHERE ($1::text IS NULL OR status = $1) AND id > $2 ORDER BY id LIMIT $3"
            ))
            .await?;
        let release = client
            .prepare(&format!(
                "WITH r AS (
                   UPDATE {s}.sagas SET lease_owner = NULL, lease_expires_at = NULL
                   WHERE id = $1 AND lease_token = $2 AND lease_owner = $3
                   RETURNING id)
                 SELECT pg_notify($4, r.id) FROM r"
            ))
            .await?;
        let announce = client.prepare("SELECT pg_notify($1, $2)").await?;
        Ok(Arc::new(Conn {
            client,
            write,
            renew,
            renew_many,
            claim_batch,
            claim_one,
            history,
            get,
            list,
            release,
            announce,
        }))
    }

    /// The next connection of the pool, round robin.
    async fn conn(&self) -> Result<Arc<Conn>, LogError> {
        let index = self.inner.next.fetch_add(1, Ordering::Relaxed);
        self.conn_at(index).await
    }

    /// The connection of pool slot `index` (modulo the pool's size), opened
    /// again if it was lost.
    async fn conn_at(&self, index: usize) -> Result<Arc<Conn>, LogError> {
        let slots = &self.inner.slots;
        let slot = &slots[index % slots.len()];
        if let Some(conn) = slot.read().await.as_ref() {
            if !conn.client.is_closed() {
                return Ok(conn.clone());
            }
        }
        let mut guard = slot.write().await;
        if let Some(conn) = guard.as_ref() {
            if !conn.client.is_closed() {
                return Ok(conn.clone());
            }
        }
        let client = self.raw_connect().await?;
        let conn = self.prepare(client).await?;
        *guard = Some(conn.clone());
        Ok(conn)
    }

    /// Runs `op` on a connection within the operation timeout.
    async fn with_conn<T, F, Fut>(&self, op: F) -> Result<T, LogError>
    where
        F: FnOnce(Arc<Conn>) -> Fut,
        Fut: Future<Output = Result<T, LogError>>,
    {
        let timeout = self.inner.options.operation_timeout;
        let work = async {
            let conn = self.conn().await?;
            op(conn).await
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(LogError::Timeout(timeout)),
        }
    }

    fn lease_millis(&self) -> i64 {
        i64::try_from(self.inner.options.lease.as_millis()).unwrap_or(i64::MAX)
    }

    /// Queues `write` for the next group commit and waits for its outcome
    /// (`true`: written; `false`: id taken or lease lost), within the
    /// operation timeout.
    async fn queue_write(&self, write: Write) -> Result<bool, LogError> {
        let (reply, outcome) = oneshot::channel();
        self.inner
            .writes
            .send(Pending { write, reply })
            .map_err(|_| LogError::Closed)?;
        let timeout = self.inner.options.operation_timeout;
        match tokio::time::timeout(timeout, outcome).await {
            Ok(Ok(result)) => result,
            // The writers stopped (their runtime shut down).
            Ok(Err(_)) => Err(LogError::Closed),
            Err(_) => Err(LogError::Timeout(timeout)),
        }
    }

    /// Writes `batch` on the connection of pool slot `slot` and answers each
    /// write. When the statement fails as a whole with an error of the
    /// server (it was rolled back), each write is tried again alone, so that
    /// only the one at fault gets the error.
    async fn write_batch(&self, slot: usize, batch: Vec<Pending>) {
        let (writes, replies): (Vec<Write>, Vec<_>) =
            batch.into_iter().map(|p| (p.write, p.reply)).unzip();
        match self.write_all(slot, &writes).await {
            Ok(written) => {
                for (write, reply) in writes.iter().zip(replies) {
                    let _ = reply.send(Ok(written.contains(write.saga_id.as_str())));
                }
            }
            Err(LogError::Postgres(e)) if writes.len() > 1 && e.as_db_error().is_some() => {
                for (write, reply) in writes.iter().zip(replies) {
                    let outcome = self
                        .write_all(slot, std::slice::from_ref(write))
                        .await
                        .map(|written| written.contains(write.saga_id.as_str()));
                    let _ = reply.send(outcome);
                }
            }
            Err(e) => {
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }

    /// Writes `writes` in one statement; returns the ids of the sagas written.
    async fn write_all(&self, slot: usize, writes: &[Write]) -> Result<HashSet<String>, LogError> {
        let timeout = self.inner.options.operation_timeout;
        let work = async {
            let conn = self.conn_at(slot).await?;
            let c = BatchColumns::of(writes);
            let rows = conn
                .client
                .query(
                    &conn.write,
                    &[
                        &self.inner.owner,
                        &self.lease_millis(),
                        &c.create_id,
                        &c.create_name,
                        &c.create_input,
                        &c.create_deadline,
                        &c.create_at,
                        &c.create_claim,
                        &c.append_id,
                        &c.append_token,
                        &c.append_status,
                        &c.append_at,
                        &c.append_releases,
                        &c.t_saga,
                        &c.t_at,
                        &c.t_seq,
                        &c.t_kind,
                        &c.t_step,
                        &c.t_step_name,
                        &c.t_attempt,
                        &c.t_data,
                    ],
                )
                .await?;
            rows.iter()
                .map(|row| row.try_get::<_, String>(0).map_err(LogError::from))
                .collect()
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(LogError::Timeout(timeout)),
        }
    }

    /// One listening session: connects, `LISTEN`s, wakes the worker once
    /// (work may have been announced before), then once per notification,
    /// until the worker stops listening (`Ok`) or the connection fails.
    async fn listen_session(&self, sender: &mpsc::Sender<()>) -> Result<(), LogError> {
        let timeout = self.inner.options.connect_timeout;
        let connect_error = |source| LogError::Connect {
            target: self.inner.target.clone(),
            source,
        };
        let (client, mut connection) =
            match tokio::time::timeout(timeout, self.inner.config.connect(NoTls)).await {
                Err(_) => return Err(connect_error(None)),
                Ok(Err(e)) => return Err(connect_error(Some(Arc::new(e)))),
                Ok(Ok(pair)) => pair,
            };
        let statement = format!("LISTEN \"{}\"", self.inner.channel);
        let listen = client.batch_execute(&statement);
        tokio::pin!(listen);
        let mut listening = false;
        loop {
            tokio::select! {
                message = std::future::poll_fn(|cx| connection.poll_message(cx)) => match message {
                    Some(Ok(AsyncMessage::Notification(_))) => {
                        let _ = sender.try_send(());
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(e.into()),
                    None => return Err(LogError::Closed),
                },
                done = &mut listen, if !listening => {
                    done?;
                    listening = true;
                    let _ = sender.try_send(());
                }
                () = sender.closed() => return Ok(()),
            }
        }
    }

    /// Histories of `ids`, grouped by saga; a saga with an undecodable
    /// transition gets an error instead of its history.
    async fn histories(
        conn: &Conn,
        ids: &[String],
    ) -> Result<HashMap<String, Result<Vec<TransitionRecord>, LogError>>, LogError> {
        let rows = conn.client.query(&conn.history, &[&ids]).await?;
        let mut by_id: HashMap<String, Result<Vec<TransitionRecord>, LogError>> =
            HashMap::with_capacity(ids.len());
        for row in &rows {
            let saga_id: String = row.try_get(0)?;
            let decoded = read_transition(&saga_id, row);
            match (
                by_id.entry(saga_id).or_insert_with(|| Ok(Vec::new())),
                decoded,
            ) {
                (Ok(history), Ok(record)) => history.push(record),
                (slot @ Ok(_), Err(e)) => *slot = Err(e),
                (Err(_), _) => {}
            }
        }
        Ok(by_id)
    }

    async fn history_of(conn: &Conn, id: &SagaId) -> Result<Vec<TransitionRecord>, LogError> {
        Self::histories(conn, &[id.as_str().to_owned()])
            .await?
            .remove(id.as_str())
            .unwrap_or(Ok(Vec::new()))
    }
}

/// One saga's transitions as columns, for the group commit's arrays.
struct Columns {
    seq: Vec<i32>,
    kind: Vec<&'static str>,
    step: Vec<Option<i32>>,
    step_name: Vec<Option<String>>,
    attempt: Vec<Option<i32>>,
    data: Vec<Option<String>>,
}

impl Columns {
    fn new(first_seq: u32, transitions: &[Transition]) -> Result<Self, LogError> {
        let encoded: Vec<Encoded> = transitions.iter().map(Transition::encode).collect();
        let too_large = |what: &str| LogError::Corrupt {
            detail: format!("{what} does not fit a postgres int4"),
        };
        let mut columns = Columns {
            seq: Vec::with_capacity(encoded.len()),
            kind: Vec::with_capacity(encoded.len()),
            step: Vec::with_capacity(encoded.len()),
            step_name: Vec::with_capacity(encoded.len()),
            attempt: Vec::with_capacity(encoded.len()),
            data: Vec::with_capacity(encoded.len()),
        };
        for (offset, e) in encoded.into_iter().enumerate() {
            let seq = i64::from(first_seq) + offset as i64;
            columns
                .seq
                .push(i32::try_from(seq).map_err(|_| too_large("sequence number"))?);
            columns.kind.push(e.kind);
            columns.step.push(
                e.step
                    .map(i32::try_from)
                    .transpose()
                    .map_err(|_| too_large("step index"))?,
            );
            columns.step_name.push(e.step_name);
            columns.attempt.push(
                e.attempt
                    .map(i32::try_from)
                    .transpose()
                    .map_err(|_| too_large("attempt"))?,
            );
            columns.data.push(e.data);
        }
        Ok(columns)
    }
}

/// The `LISTEN`/`NOTIFY` channel of a schema (at most 63 bytes, Postgres'
/// identifier length; two long schemas that share a prefix share a channel,
/// which only wakes their workers for nothing).
fn notify_channel(schema: &str) -> String {
    let mut channel = format!("seawall_saga_{schema}");
    channel.truncate(63);
    channel
}

/// How long a listener waits before connecting again after losing its connection.
const RELISTEN_DELAY: Duration = Duration::from_secs(1);

fn describe_target(config: &tokio_postgres::Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".into());
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config.get_dbname().unwrap_or("(default database)");
    format!("{host}:{port}/{db}")
}

fn corrupt(what: impl fmt::Display) -> LogError {
    LogError::Corrupt {
        detail: what.to_string(),
    }
}

fn read_record_at(row: &Row, base: usize) -> Result<SagaRecord, LogError> {
    let id = SagaId::new(row.try_get::<_, String>(base)?);
    let status: String = row.try_get(base + 2)?;
    let status = status
        .parse::<SagaStatus>()
        .map_err(|e| corrupt(format!("saga {id}: {e}")))?;
    let deadline: Option<i64> = row.try_get(base + 4)?;
    Ok(SagaRecord {
        name: row.try_get(base + 1)?,
        status,
        input: row.try_get(base + 3)?,
        deadline: deadline.map(from_millis),
        created_at: from_millis(row.try_get(base + 5)?),
        updated_at: from_millis(row.try_get(base + 6)?),
        id,
    })
}

fn read_transition(saga_id: &str, row: &Row) -> Result<TransitionRecord, LogError> {
    let seq: i32 = row.try_get(1)?;
    let at: i64 = row.try_get(2)?;
    let kind: String = row.try_get(3)?;
    let step: Option<i32> = row.try_get(4)?;
    let step_name: Option<String> = row.try_get(5)?;
    let attempt: Option<i32> = row.try_get(6)?;
    let data: Option<String> = row.try_get(7)?;
    let transition = Transition::decode(
        &kind,
        step.map(i64::from),
        step_name,
        attempt.map(i64::from),
        data,
    )
    .map_err(|detail| corrupt(format!("saga {saga_id}, transition {seq}: {detail}")))?;
    let seq = u32::try_from(seq)
        .map_err(|_| corrupt(format!("saga {saga_id}: invalid sequence number {seq}")))?;
    Ok(TransitionRecord {
        seq,
        at: from_millis(at),
        transition,
    })
}

impl SagaLog for PostgresLog {
    fn create<'a>(
        &'a self,
        saga: &'a NewSaga,
        transitions: &'a [Transition],
        claim: bool,
    ) -> LogFuture<'a, Option<Lease>> {
        Box::pin(async move {
            let write = Write {
                saga_id: saga.id.clone(),
                kind: WriteKind::Create {
                    name: saga.name.clone(),
                    input: saga.input.clone(),
                    deadline_ms: saga.deadline.map(to_millis),
                    claim,
                },
                at_ms: to_millis(saga.created_at),
                transitions: Columns::new(0, transitions)?,
            };
            if !self.queue_write(write).await? {
                return Err(LogError::AlreadyExists(saga.id.clone()));
            }
            Ok(claim.then(|| Lease::new(saga.id.clone(), 1)))
        })
    }

    fn append<'a>(
        &'a self,
        lease: &'a Lease,
        first_seq: u32,
        transitions: &'a [Transition],
        status: SagaStatus,
        at: SystemTime,
    ) -> LogFuture<'a, ()> {
        Box::pin(async move {
            let write = Write {
                saga_id: lease.saga_id().clone(),
                kind: WriteKind::Append {
                    token: lease.token(),
                    status: status.as_str(),
                    releases_lease: status.releases_lease(),
                },
                at_ms: to_millis(at),
                transitions: Columns::new(first_seq, transitions)?,
            };
            if !self.queue_write(write).await? {
                return Err(LogError::LeaseLost {
                    saga_id: lease.saga_id().clone(),
                });
            }
            Ok(())
        })
    }

    fn renew<'a>(&'a self, lease: &'a Lease) -> LogFuture<'a, ()> {
        Box::pin(self.with_conn(move |conn| async move {
            let updated = conn
                .client
                .execute(
                    &conn.renew,
                    &[
                        &lease.saga_id().as_str(),
                        &lease.token(),
                        &self.lease_millis(),
                        &self.inner.owner,
                    ],
                )
                .await?;
            if updated == 0 {
                return Err(LogError::LeaseLost {
                    saga_id: lease.saga_id().clone(),
                });
            }
            Ok(())
        }))
    }

    fn renew_many<'a>(&'a self, leases: &'a [Lease]) -> LogFuture<'a, usize> {
        Box::pin(self.with_conn(move |conn| async move {
            let ids: Vec<&str> = leases.iter().map(|l| l.saga_id().as_str()).collect();
            let tokens: Vec<i64> = leases.iter().map(Lease::token).collect();
            let renewed = conn
                .client
                .execute(
                    &conn.renew_many,
                    &[&ids, &tokens, &self.lease_millis(), &self.inner.owner],
                )
                .await?;
            Ok(usize::try_from(renewed).unwrap_or(usize::MAX))
        }))
    }

    fn claim_unfinished<'a>(
        &'a self,
        after: Option<&'a SagaId>,
        limit: usize,
    ) -> LogFuture<'a, Vec<ClaimedSaga>> {
        Box::pin(self.with_conn(move |conn| async move {
            let after = after.map(SagaId::as_str).unwrap_or("");
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = conn
                .client
                .query(
                    &conn.claim_batch,
                    &[&self.inner.owner, &self.lease_millis(), &after, &limit],
                )
                .await?;
            let mut claimed = Vec::with_capacity(rows.len());
            for row in &rows {
                let token: i64 = row.try_get(0)?;
                let record = read_record_at(row, 1)?;
                claimed.push(ClaimedSaga {
                    lease: Lease::new(record.id.clone(), token),
                    record,
                    history: Ok(Vec::new()),
                });
            }
            claimed.sort_by(|a, b| a.record.id.cmp(&b.record.id));
            if claimed.is_empty() {
                return Ok(claimed);
            }
            let ids: Vec<String> = claimed
                .iter()
                .map(|c| c.record.id.as_str().to_owned())
                .collect();
            let mut by_id = Self::histories(&conn, &ids).await?;
            for saga in &mut claimed {
                saga.history = by_id
                    .remove(saga.record.id.as_str())
                    .unwrap_or(Ok(Vec::new()));
            }
            Ok(claimed)
        }))
    }

    fn claim<'a>(&'a self, id: &'a SagaId) -> LogFuture<'a, ClaimAttempt> {
        Box::pin(self.with_conn(move |conn| async move {
            let row = conn
                .client
                .query_opt(
                    &conn.claim_one,
                    &[&self.inner.owner, &self.lease_millis(), &id.as_str()],
                )
                .await?;
            if let Some(row) = row {
                let token: i64 = row.try_get(0)?;
                let record = read_record_at(&row, 1)?;
                let history = match Self::history_of(&conn, id).await {
                    Err(LogError::Corrupt { detail }) => Err(LogError::Corrupt { detail }),
                    other => Ok(other?),
                };
                return Ok(ClaimAttempt::Claimed(ClaimedSaga {
                    lease: Lease::new(id.clone(), token),
                    record,
                    history,
                }));
            }
            let row = conn.client.query_opt(&conn.get, &[&id.as_str()]).await?;
            Ok(match row {
                None => ClaimAttempt::NotFound,
                Some(row) => {
                    let record = read_record_at(&row, 0)?;
                    if record.status.is_finished() {
                        ClaimAttempt::Finished(record)
                    } else {
                        ClaimAttempt::Held(record)
                    }
                }
            })
        }))
    }

    fn get<'a>(&'a self, id: &'a SagaId) -> LogFuture<'a, Option<SagaRecord>> {
        Box::pin(self.with_conn(move |conn| async move {
            let row = conn.client.query_opt(&conn.get, &[&id.as_str()]).await?;
            row.map(|r| read_record_at(&r, 0)).transpose()
        }))
    }

    fn list<'a>(&'a self, query: &'a ListQuery) -> LogFuture<'a, Vec<SagaRecord>> {
        Box::pin(self.with_conn(move |conn| async move {
            let status = query.status_filter().map(SagaStatus::as_str);
            let after = query.after_id().map(SagaId::as_str).unwrap_or("");
            let limit = i64::try_from(query.max()).unwrap_or(i64::MAX);
            let rows = conn
                .client
                .query(&conn.list, &[&status, &after, &limit])
                .await?;
            rows.iter().map(|r| read_record_at(r, 0)).collect()
        }))
    }

    fn history<'a>(&'a self, id: &'a SagaId) -> LogFuture<'a, Vec<TransitionRecord>> {
        Box::pin(self.with_conn(move |conn| async move { Self::history_of(&conn, id).await }))
    }

    fn lease_renewal_interval(&self) -> Option<Duration> {
        Some(self.inner.options.lease / 3)
    }

    fn owner(&self) -> &str {
        &self.inner.owner
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> LogFuture<'a, ()> {
        Box::pin(self.with_conn(move |conn| async move {
            conn.client
                .query(
                    &conn.release,
                    &[
                        &lease.saga_id().as_str(),
                        &lease.token(),
                        &self.inner.owner,
                        &self.inner.channel,
                    ],
                )
                .await?;
            Ok(())
        }))
    }

    fn announce<'a>(&'a self, id: &'a SagaId) -> LogFuture<'a, ()> {
        Box::pin(self.with_conn(move |conn| async move {
            conn.client
                .query(&conn.announce, &[&self.inner.channel, &id.as_str()])
                .await?;
            Ok(())
        }))
    }

    /// A dedicated connection `LISTEN`s on the schema's channel; when it is
    /// lost it is opened again after a second (the worker's polling covers
    /// what was announced meanwhile).
    fn listen(&self) -> LogFuture<'_, Option<Wakeups>> {
        Box::pin(async move {
            let (sender, receiver) = mpsc::channel(1);
            let log = self.clone();
            tokio::spawn(async move {
                loop {
                    match log.listen_session(&sender).await {
                        Ok(()) => return,
                        Err(e) => tracing::warn!(
                            target: "seawall_saga", error = %e,
                            "saga log listener lost its connection; polling until it is back"
                        ),
                    }
                    tokio::select! {
                        () = tokio::time::sleep(RELISTEN_DELAY) => {}
                        () = sender.closed() => return,
                    }
                }
            });
            Ok(Some(Wakeups::new(receiver)))
        })
    }
}
