//! The SQLite saga log: one file, WAL, group commit.
//!
//! # Durability
//!
//! The file is put in WAL mode with `PRAGMA synchronous = FULL` by default: the
//! WAL is fsynced at every commit, so a transition the log has acknowledged
//! survives a process crash *and* a power loss or OS crash. With
//! [`Synchronous::Normal`] the WAL is only fsynced at checkpoints: acknowledged
//! transitions survive a process crash (SIGKILL included) but the last ones may
//! be lost on power loss, which can make a completed step run again.
//!
//! All statements run on one background thread that owns the connection. Writes
//! that arrive while a commit is in progress are grouped into the next
//! transaction, which is how many concurrent sagas share one fsync. One refused
//! write (a lease lost, an id taken) does not affect the others: the group is
//! rolled back and run again with each write in a savepoint of its own (writes
//! are not isolated the first time, as a savepoint makes SQLite copy every page
//! a write touches into a statement journal, about 15 % of the throughput).
//!
//! # One process per file
//!
//! A SQLite log is meant to be driven by one orchestrator process. Each
//! [`SqliteLog::open`] gets a fresh owner name, and
//! [`claim_unfinished`](SagaLog::claim_unfinished) takes over every unfinished
//! saga not owned by this instance: after a crash, the restarted process
//! recovers everything at once, without waiting for leases to expire. Writes are
//! still fenced (a saga claimed by another instance refuses this one's writes),
//! so the log stays consistent if two processes do open the same file, but both
//! may then run the same step; use [`PostgresLog`](crate::PostgresLog) for many
//! workers.
//!
//! # Foreign and damaged files
//!
//! A missing file or an empty one (0 bytes) becomes a new log. Any other file
//! must already be a saga log: a file that is not a SQLite database (shorter
//! than one database page, without the SQLite header, or refused by SQLite)
//! fails with [`LogError::NotADatabase`]; a SQLite database that has other
//! tables or another `application_id` fails with [`LogError::Foreign`]. Neither
//! is written to: the file's bytes are checked before SQLite opens it, because
//! SQLite takes a file shorter than one page for an empty database and would
//! write a new one over it. An empty SQLite database (no tables, no
//! `application_id`) is initialised. Damage found later is reported as
//! [`LogError::Corrupt`]. Other SQLite failures are [`LogError::Sqlite`], whose
//! message names the operation, the file and SQLite's message.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Row};
use tokio::sync::oneshot;

use super::{
    generate_owner, ClaimAttempt, ClaimedSaga, Lease, ListQuery, LogFuture, NewSaga, SagaLog,
    SagaRecord, SCHEMA_VERSION,
};
use crate::clock::{from_millis, to_millis};
use crate::error::LogError;
use crate::id::SagaId;
use crate::transition::{Encoded, SagaStatus, Transition, TransitionRecord};

/// `application_id` written into the SQLite header of every saga log ("SWSG").
const APPLICATION_ID: i32 = 0x5357_5347;

/// How hard SQLite works to make a commit durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Synchronous {
    /// `synchronous = FULL`: fsync the WAL at every commit. Survives power loss.
    #[default]
    Full,
    /// `synchronous = NORMAL`: fsync at checkpoints only. Survives a process
    /// crash; the latest commits may be lost on power loss or OS crash.
    Normal,
}

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        }
    }
}

/// Options of a [`SqliteLog`].
///
/// # Default
///
/// `synchronous = FULL`, busy timeout 5 s, at most 256 writes per group commit.
#[derive(Clone, Debug)]
pub struct SqliteOptions {
    synchronous: Synchronous,
    busy_timeout: Duration,
    max_batch: usize,
}

impl SqliteOptions {
    /// The defaults.
    pub fn new() -> Self {
        SqliteOptions {
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(5),
            max_batch: 256,
        }
    }

    /// The `synchronous` mode (see [`Synchronous`]).
    pub fn synchronous(mut self, mode: Synchronous) -> Self {
        self.synchronous = mode;
        self
    }

    /// How long a statement waits for a lock held by another connection (at
    /// most SQLite's limit, `i32::MAX` milliseconds, about 24.8 days: a
    /// longer one is taken as that).
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout.min(Duration::from_millis(i32::MAX as u64));
        self
    }

    /// The most writes grouped into one transaction (at least 1).
    pub fn max_batch(mut self, max: usize) -> Self {
        self.max_batch = max.max(1);
        self
    }
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self::new()
    }
}

/// A saga log in one SQLite file. Cheap to clone; clones share the connection.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> Result<(), seawall_saga::LogError> {
/// use seawall_saga::SqliteLog;
/// let log = SqliteLog::open("sagas.db")?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqliteLog {
    inner: Arc<Inner>,
}

struct Inner {
    sender: mpsc::Sender<Box<dyn Job>>,
    path: PathBuf,
    owner: String,
    synchronous: Synchronous,
}

impl fmt::Debug for SqliteLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteLog")
            .field("path", &self.inner.path)
            .field("owner", &self.inner.owner)
            .field("synchronous", &self.inner.synchronous)
            .finish()
    }
}

impl SqliteLog {
    /// Opens (or creates) the log at `path` with default options.
    ///
    /// # Errors
    ///
    /// [`LogError::NotADatabase`], [`LogError::Foreign`],
    /// [`LogError::UnsupportedSchema`], [`LogError::Corrupt`] or
    /// [`LogError::Sqlite`]; the file is left untouched in the first three cases.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, LogError> {
        Self::open_with(path, SqliteOptions::new())
    }

    /// Opens (or creates) the log at `path`.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open).
    pub fn open_with(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self, LogError> {
        let path = path.as_ref().to_path_buf();
        let opening = || format!("opening {}", path.display());
        refuse_non_database(&path)?;
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| LogError::sqlite(opening(), e))?;
        conn.busy_timeout(options.busy_timeout)
            .map_err(|e| LogError::sqlite(opening(), e))?;
        prepare_schema(&conn, &path)?;
        let setting_up = || format!("setting up journaling of {}", path.display());
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(|e| LogError::sqlite(setting_up(), e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(LogError::Config {
                detail: format!("{} cannot use WAL journaling (got {mode})", path.display()),
            });
        }
        conn.execute_batch(&format!(
            "PRAGMA synchronous = {};",
            options.synchronous.pragma()
        ))
        .map_err(|e| LogError::sqlite(setting_up(), e))?;
        let (sender, receiver) = mpsc::channel::<Box<dyn Job>>();
        let max_batch = options.max_batch;
        let file = path.clone();
        std::thread::Builder::new()
            .name("seawall-saga-sqlite".into())
            .spawn(move || writer_loop(conn, receiver, max_batch, &file))
            .map_err(|e| {
                LogError::io(
                    format!("starting the writer thread of {}", path.display()),
                    e,
                )
            })?;
        Ok(SqliteLog {
            inner: Arc::new(Inner {
                sender,
                path,
                owner: generate_owner("sqlite"),
                synchronous: options.synchronous,
            }),
        })
    }

    /// The file this log writes.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The `synchronous` mode in force.
    pub fn synchronous(&self) -> Synchronous {
        self.inner.synchronous
    }

    /// Runs `work` on the writer thread, in the next group commit. A SQLite
    /// error is reported as met while `operation` (completed with this log's
    /// file). `work` may run twice: when another write of its group commit
    /// fails, the group is rolled back and run again, each write isolated in
    /// a savepoint (see `writer_loop`).
    fn submit<T, F>(&self, operation: Operation, work: F) -> LogFuture<'static, T>
    where
        T: Send + 'static,
        F: FnMut(&Connection) -> Result<T, JobError> + Send + 'static,
    {
        let (reply, receive) = oneshot::channel();
        let sent = self.inner.sender.send(Box::new(Task {
            operation,
            work,
            result: None,
            reply: Some(reply),
        }));
        Box::pin(async move {
            if sent.is_err() {
                return Err(LogError::Closed);
            }
            receive.await.unwrap_or(Err(LogError::Closed))
        })
    }
}

/// What a job does, for its error messages: spelled out (with the file) only
/// when one is reported.
enum Operation {
    /// An operation on no saga in particular.
    Log(&'static str),
    /// An operation on one saga: `"{0} saga {1}"`.
    Saga(&'static str, SagaId),
}

impl Operation {
    fn describe(&self, path: &Path) -> String {
        match self {
            Operation::Log(what) => format!("{what} in {}", path.display()),
            Operation::Saga(what, id) => format!("{what} saga {id} in {}", path.display()),
        }
    }
}

/// The smallest SQLite database that is not empty: one page of the smallest size.
const MIN_DATABASE_LEN: u64 = 512;

/// The first 16 bytes of every SQLite database file.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// Refuses, without writing to it, a file that is neither absent, nor empty,
/// nor a SQLite database: SQLite itself would take a file shorter than one page
/// for an empty database and overwrite it.
fn refuse_non_database(path: &Path) -> Result<(), LogError> {
    let inspecting = || format!("inspecting {}", path.display());
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(LogError::io(inspecting(), e)),
    };
    let len = file
        .metadata()
        .map_err(|e| LogError::io(inspecting(), e))?
        .len();
    if len == 0 {
        return Ok(());
    }
    let refuse = |detail: String| LogError::NotADatabase {
        path: path.to_path_buf(),
        detail,
        source: None,
    };
    if len < MIN_DATABASE_LEN {
        return Err(refuse(format!(
            "it has {len} byte(s), fewer than the {MIN_DATABASE_LEN} of the smallest database"
        )));
    }
    let mut header = [0u8; 16];
    file.read_exact(&mut header)
        .map_err(|e| LogError::io(inspecting(), e))?;
    if &header != SQLITE_HEADER {
        return Err(refuse("it does not start with the sqlite header".into()));
    }
    Ok(())
}

/// Validates an existing file or initialises an empty one. Writes nothing to a
/// file that is not (or not yet) recognised as a saga log, except to initialise
/// an empty database.
fn prepare_schema(conn: &Connection, path: &Path) -> Result<(), LogError> {
    let reading = || format!("reading the header of {}", path.display());
    let not_a_database = |error: rusqlite::Error| match &error {
        rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::NotADatabase => {
            LogError::NotADatabase {
                path: path.to_path_buf(),
                detail: error.to_string(),
                source: Some(Arc::new(error)),
            }
        }
        _ => LogError::sqlite(reading(), error),
    };
    let app_id: i32 = conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(not_a_database)?;
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .and_then(|mut s| {
            s.query_map([], |r| r.get::<_, String>(0))?
                .collect::<rusqlite::Result<_>>()
        })
        .map_err(not_a_database)?;
    let location = path.display().to_string();
    if app_id == APPLICATION_ID {
        let version: Option<String> = conn
            .query_row(
                "SELECT value FROM seawall_saga_meta WHERE key = 'schema_version'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| LogError::Corrupt {
                detail: format!("{location}: saga log metadata unreadable: {e}"),
            })?;
        return match version {
            Some(v) if v == SCHEMA_VERSION.to_string() => Ok(()),
            Some(found) => Err(LogError::UnsupportedSchema {
                found,
                supported: SCHEMA_VERSION,
            }),
            None => Err(LogError::Corrupt {
                detail: format!("{location}: saga log metadata has no schema version"),
            }),
        };
    }
    if app_id != 0 {
        return Err(LogError::Foreign {
            location,
            detail: format!("sqlite application_id is {app_id:#x}"),
        });
    }
    if !tables.is_empty() {
        return Err(LogError::Foreign {
            location,
            detail: format!("it already has tables: {}", tables.join(", ")),
        });
    }
    conn.execute_batch(&format!(
        "BEGIN IMMEDIATE;
         PRAGMA application_id = {APPLICATION_ID};
         CREATE TABLE seawall_saga_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
         INSERT INTO seawall_saga_meta (key, value) VALUES ('schema_version', '{SCHEMA_VERSION}');
         CREATE TABLE seawall_sagas (
             id TEXT PRIMARY KEY,
             name TEXT NOT NULL,
             status TEXT NOT NULL,
             input TEXT NOT NULL,
             deadline_ms INTEGER,
             created_ms INTEGER NOT NULL,
             updated_ms INTEGER NOT NULL,
             lease_owner TEXT,
             lease_token INTEGER NOT NULL DEFAULT 0
         );
         CREATE INDEX seawall_sagas_by_status ON seawall_sagas (status, id);
         CREATE TABLE seawall_saga_transitions (
             saga_id TEXT NOT NULL,
             seq INTEGER NOT NULL,
             at_ms INTEGER NOT NULL,
             kind TEXT NOT NULL,
             step INTEGER,
             step_name TEXT,
             attempt INTEGER,
             data TEXT,
             PRIMARY KEY (saga_id, seq)
         ) WITHOUT ROWID;
         COMMIT;"
    ))
    .map_err(|e| LogError::sqlite(format!("creating the saga log tables in {location}"), e))?;
    Ok(())
}

/// What a job's work fails with: a SQLite error (told apart from the rest so
/// that it is reported with the job's operation) or any other log error.
enum JobError {
    Sqlite(rusqlite::Error),
    Log(LogError),
}

impl From<rusqlite::Error> for JobError {
    fn from(error: rusqlite::Error) -> Self {
        JobError::Sqlite(error)
    }
}

impl From<LogError> for JobError {
    fn from(error: LogError) -> Self {
        JobError::Log(error)
    }
}

impl JobError {
    fn during(self, operation: impl FnOnce() -> String) -> LogError {
        match self {
            JobError::Sqlite(error) => LogError::sqlite(operation(), error),
            JobError::Log(error) => error,
        }
    }
}

trait Job: Send {
    /// Runs the job's work. `isolated`: inside a savepoint of its own, rolled
    /// back if the work fails. Returns whether the work succeeded.
    fn run(&mut self, conn: &Connection, path: &Path, isolated: bool) -> bool;
    fn finish(self: Box<Self>, commit: Result<(), LogError>);
}

struct Task<T, F> {
    operation: Operation,
    work: F,
    result: Option<Result<T, LogError>>,
    reply: Option<oneshot::Sender<Result<T, LogError>>>,
}

impl<T, F> Job for Task<T, F>
where
    T: Send,
    F: FnMut(&Connection) -> Result<T, JobError> + Send,
{
    fn run(&mut self, conn: &Connection, path: &Path, isolated: bool) -> bool {
        if isolated {
            if let Err(e) = run_cached(conn, "SAVEPOINT job") {
                self.result = Some(Err(LogError::sqlite(self.operation.describe(path), e)));
                return false;
            }
        }
        let result = (self.work)(conn).map_err(|e| e.during(|| self.operation.describe(path)));
        let ok = result.is_ok();
        let end = match (isolated, ok) {
            (false, _) => Ok(()),
            (true, true) => run_cached(conn, "RELEASE job"),
            (true, false) => {
                run_cached(conn, "ROLLBACK TO job").and_then(|()| run_cached(conn, "RELEASE job"))
            }
        };
        self.result = Some(match end {
            Ok(()) => result,
            Err(e) => Err(LogError::sqlite(self.operation.describe(path), e)),
        });
        ok
    }

    fn finish(mut self: Box<Self>, commit: Result<(), LogError>) {
        let outcome = match (self.result.take(), commit) {
            (Some(Err(e)), _) => Err(e),
            (_, Err(e)) => Err(e),
            (Some(Ok(v)), Ok(())) => Ok(v),
            (None, Ok(())) => Err(LogError::Closed),
        };
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(outcome);
        }
    }
}

/// Runs a statement without parameters or rows from the connection's cache
/// of prepared statements (a group commit's `BEGIN` and `COMMIT`, and the
/// savepoint around each of its writes, are not parsed again every time).
fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

/// The writer thread: takes the writes waiting (up to `max_batch`) and runs
/// them in one transaction, so that they share one commit (one fsync).
///
/// The writes of a group run one after the other, none isolated: a write
/// that fails is rare (a lease lost, a saga that already exists), and a
/// savepoint around every write would make SQLite copy each page a write
/// touches into a statement journal. When one fails, the whole transaction
/// is rolled back and the group runs again with each write in a savepoint
/// of its own, so that the failed one is undone and the others commit.
fn writer_loop(
    conn: Connection,
    receiver: mpsc::Receiver<Box<dyn Job>>,
    max_batch: usize,
    path: &Path,
) {
    while let Ok(first) = receiver.recv() {
        let mut batch = vec![first];
        while batch.len() < max_batch {
            match receiver.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let mut commit = begin(&conn, path);
        if commit.is_ok() && !batch.iter_mut().all(|job| job.run(&conn, path, false)) {
            let _ = run_cached(&conn, "ROLLBACK");
            commit = begin(&conn, path);
            if commit.is_ok() {
                for job in batch.iter_mut() {
                    job.run(&conn, path, true);
                }
            }
        }
        if commit.is_ok() {
            commit = run_cached(&conn, "COMMIT")
                .map_err(|e| LogError::sqlite(format!("committing to {}", path.display()), e));
            if commit.is_err() {
                let _ = conn.execute_batch("ROLLBACK");
            }
        }
        for job in batch {
            job.finish(commit.clone());
        }
    }
}

fn begin(conn: &Connection, path: &Path) -> Result<(), LogError> {
    run_cached(conn, "BEGIN IMMEDIATE")
        .map_err(|e| LogError::sqlite(format!("starting a transaction in {}", path.display()), e))
}

const RECORD_COLUMNS: &str = "id, name, status, input, deadline_ms, created_ms, updated_ms";

fn read_record(row: &Row<'_>) -> rusqlite::Result<Result<SagaRecord, LogError>> {
    read_record_at(row, 0)
}

/// Reads the [`RECORD_COLUMNS`] starting at column `base`.
fn read_record_at(row: &Row<'_>, base: usize) -> rusqlite::Result<Result<SagaRecord, LogError>> {
    let id = SagaId::new(row.get::<_, String>(base)?);
    let status: String = row.get(base + 2)?;
    let deadline: Option<i64> = row.get(base + 4)?;
    let status = match status.parse::<SagaStatus>() {
        Ok(s) => s,
        Err(e) => {
            return Ok(Err(LogError::Corrupt {
                detail: format!("saga {id}: {e}"),
            }))
        }
    };
    Ok(Ok(SagaRecord {
        id,
        name: row.get(base + 1)?,
        status,
        input: row.get(base + 3)?,
        deadline: deadline.map(from_millis),
        created_at: from_millis(row.get(base + 5)?),
        updated_at: from_millis(row.get(base + 6)?),
    }))
}

fn insert_transitions(
    conn: &Connection,
    id: &SagaId,
    first_seq: u32,
    at_ms: i64,
    encoded: &[Encoded],
) -> Result<(), JobError> {
    let mut insert = conn.prepare_cached(
        "INSERT INTO seawall_saga_transitions (saga_id, seq, at_ms, kind, step, step_name, attempt, data)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    for (offset, e) in encoded.iter().enumerate() {
        insert.execute(params![
            id.as_str(),
            i64::from(first_seq) + offset as i64,
            at_ms,
            e.kind,
            e.step,
            e.step_name,
            e.attempt,
            e.data
        ])?;
    }
    Ok(())
}

fn read_history(conn: &Connection, id: &SagaId) -> Result<Vec<TransitionRecord>, JobError> {
    let mut select = conn.prepare_cached(
        "SELECT seq, at_ms, kind, step, step_name, attempt, data
         FROM seawall_saga_transitions WHERE saga_id = ?1 ORDER BY seq",
    )?;
    let rows = select.query_map([id.as_str()], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, Option<i64>>(3)?,
            r.get::<_, Option<String>>(4)?,
            r.get::<_, Option<i64>>(5)?,
            r.get::<_, Option<String>>(6)?,
        ))
    })?;
    let mut history = Vec::new();
    for row in rows {
        let (seq, at, kind, step, step_name, attempt, data) = row?;
        let transition =
            Transition::decode(&kind, step, step_name, attempt, data).map_err(|detail| {
                LogError::Corrupt {
                    detail: format!("saga {id}, transition {seq}: {detail}"),
                }
            })?;
        history.push(TransitionRecord {
            seq: u32::try_from(seq).map_err(|_| LogError::Corrupt {
                detail: format!("saga {id}: invalid sequence number {seq}"),
            })?,
            at: from_millis(at),
            transition,
        });
    }
    Ok(history)
}

fn read_one(conn: &Connection, id: &SagaId) -> Result<Option<SagaRecord>, JobError> {
    let mut select = conn.prepare_cached(&format!(
        "SELECT {RECORD_COLUMNS} FROM seawall_sagas WHERE id = ?1"
    ))?;
    Ok(select
        .query_row([id.as_str()], read_record)
        .optional()?
        .transpose()?)
}

/// Claims `id` for `owner` when the condition holds; returns the claimed saga.
fn claim_row(
    conn: &Connection,
    owner: &str,
    id: &SagaId,
    include_stuck: bool,
) -> Result<Option<ClaimedSaga>, JobError> {
    let statuses = if include_stuck {
        "('running', 'compensating', 'stuck')"
    } else {
        "('running', 'compensating')"
    };
    let mut update = conn.prepare_cached(&format!(
        "UPDATE seawall_sagas SET lease_owner = ?1, lease_token = lease_token + 1
         WHERE id = ?2 AND status IN {statuses} AND (lease_owner IS NULL OR lease_owner <> ?1)
         RETURNING lease_token, {RECORD_COLUMNS}"
    ))?;
    let claimed = update
        .query_row(params![owner, id.as_str()], |r| {
            let token: i64 = r.get(0)?;
            let record = read_record_at(r, 1)?;
            Ok((token, record))
        })
        .optional()?;
    let Some((token, record)) = claimed else {
        return Ok(None);
    };
    let record = record?;
    // A damaged history fails this saga's recovery only, not the claim.
    let history = match read_history(conn, id) {
        Ok(history) => Ok(history),
        Err(e) => match e.during(|| format!("reading the history of saga {id}")) {
            corrupt @ LogError::Corrupt { .. } => Err(corrupt),
            other => return Err(other.into()),
        },
    };
    Ok(Some(ClaimedSaga {
        lease: Lease::new(record.id.clone(), token),
        record,
        history,
    }))
}

impl SagaLog for SqliteLog {
    fn create<'a>(
        &'a self,
        saga: &'a NewSaga,
        transitions: &'a [Transition],
        claim: bool,
    ) -> LogFuture<'a, Option<Lease>> {
        let saga = saga.clone();
        let encoded: Vec<Encoded> = transitions.iter().map(Transition::encode).collect();
        let owner = claim.then(|| self.inner.owner.clone());
        self.submit(Operation::Saga("creating", saga.id.clone()), move |conn| {
            let created_ms = to_millis(saga.created_at);
            let token: i64 = if owner.is_some() { 1 } else { 0 };
            let inserted = conn
                .prepare_cached(
                    "INSERT INTO seawall_sagas
                       (id, name, status, input, deadline_ms, created_ms, updated_ms, lease_owner, lease_token)
                     VALUES (?1, ?2, 'running', ?3, ?4, ?5, ?5, ?6, ?7)
                     ON CONFLICT (id) DO NOTHING",
                )?
                .execute(params![
                    saga.id.as_str(),
                    saga.name,
                    saga.input,
                    saga.deadline.map(to_millis),
                    created_ms,
                    owner,
                    token
                ])?;
            if inserted == 0 {
                return Err(LogError::AlreadyExists(saga.id.clone()).into());
            }
            insert_transitions(conn, &saga.id, 0, created_ms, &encoded)?;
            Ok(owner.as_ref().map(|_| Lease::new(saga.id.clone(), token)))
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
        let lease = lease.clone();
        let encoded: Vec<Encoded> = transitions.iter().map(Transition::encode).collect();
        let owner = self.inner.owner.clone();
        self.submit(
            Operation::Saga("appending to", lease.saga_id().clone()),
            move |conn| {
                let at_ms = to_millis(at);
                let updated = conn
                    .prepare_cached(
                        "UPDATE seawall_sagas SET status = ?1, updated_ms = ?2,
                        lease_owner = CASE WHEN ?3 THEN NULL ELSE lease_owner END
                     WHERE id = ?4 AND lease_token = ?5 AND lease_owner = ?6",
                    )?
                    .execute(params![
                        status.as_str(),
                        at_ms,
                        status.releases_lease(),
                        lease.saga_id().as_str(),
                        lease.token(),
                        owner
                    ])?;
                if updated == 0 {
                    return Err(LogError::LeaseLost {
                        saga_id: lease.saga_id().clone(),
                    }
                    .into());
                }
                insert_transitions(conn, lease.saga_id(), first_seq, at_ms, &encoded)
            },
        )
    }

    fn renew<'a>(&'a self, lease: &'a Lease) -> LogFuture<'a, ()> {
        let lease = lease.clone();
        let owner = self.inner.owner.clone();
        self.submit(Operation::Saga("renewing the lease on", lease.saga_id().clone()), move |conn| {
            let held: Option<i64> = conn
                .prepare_cached(
                    "SELECT 1 FROM seawall_sagas WHERE id = ?1 AND lease_token = ?2 AND lease_owner = ?3",
                )?
                .query_row(
                    params![lease.saga_id().as_str(), lease.token(), owner],
                    |r| r.get(0),
                )
                .optional()?;
            match held {
                Some(_) => Ok(()),
                None => Err(LogError::LeaseLost {
                    saga_id: lease.saga_id().clone(),
                }
                .into()),
            }
        })
    }

    fn claim_unfinished<'a>(
        &'a self,
        after: Option<&'a SagaId>,
        limit: usize,
    ) -> LogFuture<'a, Vec<ClaimedSaga>> {
        let after = after.map(|id| id.as_str().to_owned()).unwrap_or_default();
        let owner = self.inner.owner.clone();
        self.submit(Operation::Log("claiming unfinished sagas"), move |conn| {
            let ids: Vec<String> = conn
                .prepare_cached(
                    "SELECT id FROM seawall_sagas
                     WHERE status IN ('running', 'compensating') AND id > ?1
                       AND (lease_owner IS NULL OR lease_owner <> ?2)
                     ORDER BY id LIMIT ?3",
                )?
                .query_map(
                    params![after, owner, i64::try_from(limit).unwrap_or(i64::MAX)],
                    |r| r.get(0),
                )?
                .collect::<rusqlite::Result<_>>()?;
            let mut claimed = Vec::with_capacity(ids.len());
            for id in ids {
                if let Some(saga) = claim_row(conn, &owner, &SagaId::new(id), false)? {
                    claimed.push(saga);
                }
            }
            Ok(claimed)
        })
    }

    fn claim<'a>(&'a self, id: &'a SagaId) -> LogFuture<'a, ClaimAttempt> {
        let id = id.clone();
        let owner = self.inner.owner.clone();
        self.submit(Operation::Saga("claiming", id.clone()), move |conn| {
            if let Some(saga) = claim_row(conn, &owner, &id, true)? {
                return Ok(ClaimAttempt::Claimed(saga));
            }
            Ok(match read_one(conn, &id)? {
                None => ClaimAttempt::NotFound,
                Some(record) if record.status.is_finished() => ClaimAttempt::Finished(record),
                Some(record) => ClaimAttempt::Held(record),
            })
        })
    }

    fn get<'a>(&'a self, id: &'a SagaId) -> LogFuture<'a, Option<SagaRecord>> {
        let id = id.clone();
        self.submit(Operation::Saga("reading", id.clone()), move |conn| {
            read_one(conn, &id)
        })
    }

    fn list<'a>(&'a self, query: &'a ListQuery) -> LogFuture<'a, Vec<SagaRecord>> {
        let status = query.status_filter().map(SagaStatus::as_str);
        let after = query
            .after_id()
            .map(|id| id.as_str().to_owned())
            .unwrap_or_default();
        let limit = i64::try_from(query.max()).unwrap_or(i64::MAX);
        self.submit(Operation::Log("listing sagas"), move |conn| {
            let mut select = conn.prepare_cached(&format!(
                "SELECT {RECORD_COLUMNS} FROM seawall_sagas
                 WHERE (?1 IS NULL OR status = ?1) AND id > ?2 ORDER BY id LIMIT ?3"
            ))?;
            let rows = select.query_map(params![status, after, limit], read_record)?;
            let mut records = Vec::new();
            for row in rows {
                records.push(row??);
            }
            Ok(records)
        })
    }

    fn history<'a>(&'a self, id: &'a SagaId) -> LogFuture<'a, Vec<TransitionRecord>> {
        let id = id.clone();
        self.submit(
            Operation::Saga("reading the history of", id.clone()),
            move |conn| read_history(conn, &id),
        )
    }

    fn owner(&self) -> &str {
        &self.inner.owner
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> LogFuture<'a, ()> {
        let lease = lease.clone();
        let owner = self.inner.owner.clone();
        self.submit(
            Operation::Saga("releasing the lease on", lease.saga_id().clone()),
            move |conn| {
                conn.prepare_cached(
                    "UPDATE seawall_sagas SET lease_owner = NULL
                     WHERE id = ?1 AND lease_token = ?2 AND lease_owner = ?3",
                )?
                .execute(params![
                    lease.saga_id().as_str(),
                    lease.token(),
                    owner
                ])?;
                Ok(())
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// One group commit in which the middle write fails: the group runs
    /// again with each write isolated, the failed write is undone, the
    /// others commit, each caller gets its own outcome.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_write_is_undone_and_the_rest_of_its_group_commits() {
        let dir = tempfile::tempdir().unwrap();
        let log = SqliteLog::open(dir.path().join("log.db")).unwrap();
        // Hold the writer thread until every write below is queued, so that
        // they form one group.
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let wait = std::sync::Mutex::new(wait);
        let mut waited = false;
        let gate = log.submit(Operation::Log("waiting"), move |_| {
            if !std::mem::replace(&mut waited, true) {
                let _ = wait.lock().unwrap().recv();
            }
            Ok(())
        });
        let runs = Arc::new(AtomicUsize::new(0));
        let write = |name: &'static str, fail: bool| {
            let runs = runs.clone();
            log.submit(Operation::Log("writing"), move |conn| {
                runs.fetch_add(1, Ordering::SeqCst);
                conn.execute(
                    "INSERT INTO seawall_sagas (id, name, status, input, created_ms, updated_ms)
                     VALUES (?1, 'test', 'running', '{}', 0, 0)",
                    params![name],
                )?;
                if fail {
                    return Err(LogError::Closed.into());
                }
                Ok(name)
            })
        };
        let first = write("first", false);
        let failing = write("failing", true);
        let last = write("last", false);
        go.send(()).unwrap();
        gate.await.unwrap();
        assert_eq!(first.await.unwrap(), "first");
        assert!(matches!(failing.await, Err(LogError::Closed)));
        assert_eq!(last.await.unwrap(), "last");
        // Run once as a group (up to the failure), once isolated.
        assert_eq!(runs.load(Ordering::SeqCst), 5);
        let ids: Vec<String> = log
            .submit(Operation::Log("listing"), |conn| {
                let mut select = conn.prepare("SELECT id FROM seawall_sagas ORDER BY id")?;
                let ids = select
                    .query_map([], |r| r.get(0))?
                    .collect::<rusqlite::Result<Vec<String>>>()?;
                Ok(ids)
            })
            .await
            .unwrap();
        assert_eq!(ids, ["first", "last"]);
    }

    /// A SQLite error names the operation and the file, and is built only
    /// when it is reported.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sqlite_error_names_the_operation_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.db");
        let log = SqliteLog::open(&path).unwrap();
        let err = log
            .submit(
                Operation::Saga("reading", SagaId::new("s-1")),
                |conn| -> Result<(), JobError> {
                    conn.execute("SELECT * FROM no_such_table", [])?;
                    Ok(())
                },
            )
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("reading saga s-1 in"), "{err}");
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("no_such_table"), "{err}");
    }
}
