//! Choreography between services: a transactional outbox, a relay to a
//! [`Broker`], and an idempotent inbox, on the service's own SQLite database.
//!
//! # Outbox
//!
//! A service changes its state and records the event it publishes in **one
//! local transaction** of its own database: [`Outbox::enqueue`] takes the
//! caller's `rusqlite::Transaction`. Either both are committed or neither: an
//! enqueue in a transaction that rolls back publishes nothing, and a committed
//! state change is never left without its event. [`migrate`] creates the
//! tables (`seawall_outbox`, `seawall_inbox` and `seawall_outbox_schema`, the
//! schema version); a database whose outbox schema is newer than this build
//! is refused with [`OutboxError::UnsupportedSchema`].
//!
//! The same API takes other database handles, each behind a feature; one
//! copy of the statements and rules serves them all, only the executor
//! differs:
//!
//! | database | caller's handle | module | relay | feature |
//! | --- | --- | --- | --- | --- |
//! | SQLite | `rusqlite::Transaction` | this one | [`Relay::open`] (a path) | always |
//! | SQLite | `sqlx::Transaction<Sqlite>`, `SqlitePool` | `sqlx_sqlite` | `Relay::sqlx_sqlite` | `sqlx-sqlite` |
//! | Postgres | `tokio_postgres::Transaction`, `Client` | `postgres` | `Relay::postgres` | `postgres` |
//! | Postgres | `sqlx::Transaction<Postgres>`, `PgPool` | `sqlx_postgres` | `Relay::sqlx_postgres` | `sqlx-postgres` |
//!
//! The tables are the same whichever executor wrote them: a service that
//! writes with sqlx can relay with [`Relay::open`], and the other way round.
//!
//! # Relay
//!
//! A [`Relay`] reads the rows not yet sent, in the order they were committed,
//! publishes them to the broker and then marks them sent. It survives a crash
//! anywhere:
//!
//! - dead before publishing: the rows are unsent, the next relay publishes them;
//! - dead (or the broker failed) after publishing, before marking them sent:
//!   the next relay publishes them **again**. Nothing is ever lost; an event
//!   may be published more than once (*at least once*). Each publication of an
//!   event carries the same [`Envelope::event_id`] (`{source}:{row id}`), which
//!   is what the consumer's inbox de-duplicates by. Row ids are never reused
//!   (`AUTOINCREMENT`, a sequence on Postgres), so purging sent rows
//!   ([`Relay::purge_sent`]) never makes a new event look like a handled one;
//!   `source` must be unique per database.
//!
//! **Order.** Rows are published in outbox order (the order of their commits:
//! SQLite serialises writers; on Postgres, `postgres::enqueue` serialises
//! the transactions that enqueue events of one aggregate), one batch at a time, and a batch is published
//! only after the previous one was marked sent. So the first publication of
//! each event of an aggregate comes after the first publication of every
//! earlier event of that aggregate. A re-publication after a failure may put a
//! copy of an event after later ones; the inbox drops the copy, so a consumer
//! applies the events of an aggregate in order as long as one consumer reads
//! them. Messages of a group are shared between its consumers, and a claimed
//! message ([`Broker::claim_stale`]) is handled after later ones: a consumer
//! that needs strict per-aggregate order across several consumers should check
//! a per-aggregate sequence, or use one stream per partition of aggregates.
//!
//! Run one relay per database: two relays would publish the same rows twice
//! (still correct with the inbox, but wasteful).
//!
//! # Inbox
//!
//! A consumer records the message it handles with [`Inbox::handle`] **in the
//! same local transaction as its effect**, then commits, then acknowledges the
//! message to the broker. A redelivered message (a re-publication, or a
//! message whose acknowledgement was lost) finds its id recorded and has no
//! second effect: delivery is at least once, the effect happens once.
//!
//! ```
//! use rusqlite::Connection;
//! use seawall_saga::outbox::{self, Inbox, Outbox};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut db = Connection::open_in_memory()?;
//! outbox::migrate(&db)?;
//! db.execute_batch("CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER)")?;
//!
//! // The producer: the state change and its event, one transaction.
//! let tx = db.transaction()?;
//! tx.execute("INSERT INTO orders VALUES ('o-1', 1200)", [])?;
//! Outbox::enqueue(&tx, "o-1", "order_placed", r#"{"total":1200}"#)?;
//! tx.commit()?;
//!
//! // A consumer: the effect and the inbox record, one transaction.
//! let tx = db.transaction()?;
//! if Inbox::handle(&tx, "billing", "orders:1")? {
//!     // apply the effect with `tx`
//! }
//! tx.commit()?;
//! let tx = db.transaction()?;
//! assert!(!Inbox::handle(&tx, "billing", "orders:1")?); // a duplicate
//! # Ok(()) }
//! ```

use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, Transaction};

use crate::broker::{Broker, BrokerError, Envelope};

#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(any(feature = "postgres", feature = "sqlx-postgres"))]
mod postgres_sql;
#[cfg(feature = "sqlx-postgres")]
pub mod sqlx_postgres;
#[cfg(feature = "sqlx-sqlite")]
pub mod sqlx_sqlite;

/// The outbox schema version this build reads and writes.
pub const SCHEMA_VERSION: u32 = 1;

/// An error of the outbox, the relay or the inbox.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// The database holds an outbox schema of a newer version of this crate.
    /// Nothing was written.
    #[error("unsupported outbox schema version {found} (this build supports {supported})")]
    UnsupportedSchema {
        /// The version found.
        found: String,
        /// The version this build reads and writes.
        supported: u32,
    },
    /// The outbox tables are missing: run [`migrate`] first.
    #[error("the outbox tables are missing in {location}: run seawall_saga::outbox::migrate")]
    NotMigrated {
        /// The database.
        location: String,
    },
    /// An argument was refused (an empty aggregate, event type or consumer).
    #[error("invalid outbox input: {0}")]
    Invalid(String),
    /// An error reported by SQLite.
    #[error("sqlite error while {operation}: {source}")]
    Sqlite {
        /// What was being done.
        operation: String,
        /// What SQLite reported.
        #[source]
        source: Arc<rusqlite::Error>,
    },
    /// An error reported by Postgres.
    #[cfg(feature = "postgres")]
    #[error("postgres error while {operation}: {source}")]
    Postgres {
        /// What was being done.
        operation: String,
        /// What Postgres reported.
        #[source]
        source: Arc<tokio_postgres::Error>,
    },
    /// An error reported by sqlx (features `sqlx-sqlite`, `sqlx-postgres`).
    #[cfg(any(feature = "sqlx-sqlite", feature = "sqlx-postgres"))]
    #[error("sqlx error while {operation}: {source}")]
    Sqlx {
        /// What was being done.
        operation: String,
        /// What sqlx reported.
        #[source]
        source: Arc<sqlx::Error>,
    },
    /// The broker failed; the events stay in the outbox.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// The relay's database thread ended abnormally.
    #[error("the relay's database task ended abnormally: {0}")]
    Aborted(String),
}

impl OutboxError {
    fn sqlite(operation: impl Into<String>, error: rusqlite::Error) -> Self {
        OutboxError::Sqlite {
            operation: operation.into(),
            source: Arc::new(error),
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The outbox schema in a SQLite database (rusqlite and sqlx alike).
const SQLITE_SCHEMA: &str = "
CREATE TABLE seawall_outbox_schema (version INTEGER NOT NULL);
CREATE TABLE seawall_outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    aggregate TEXT NOT NULL,
    event_type TEXT NOT NULL,
    payload TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    sent_at_ms INTEGER
);
CREATE INDEX seawall_outbox_unsent ON seawall_outbox (id) WHERE sent_at_ms IS NULL;
CREATE TABLE seawall_inbox (
    consumer TEXT NOT NULL,
    message_id TEXT NOT NULL,
    handled_at_ms INTEGER NOT NULL,
    PRIMARY KEY (consumer, message_id)
) WITHOUT ROWID;
";

/// Creates the outbox and inbox tables in `conn`'s database if they are not
/// there, or checks their version if they are. Runs in a savepoint, so it can
/// be called inside the caller's own migration transaction.
///
/// # Errors
///
/// [`OutboxError::UnsupportedSchema`] for a newer (or unreadable) schema
/// version, [`OutboxError::Sqlite`] otherwise.
pub fn migrate(conn: &Connection) -> Result<(), OutboxError> {
    let err = |e| OutboxError::sqlite("migrating the outbox schema", e);
    conn.execute_batch("SAVEPOINT seawall_outbox_migrate")
        .map_err(err)?;
    let outcome = (|| {
        match schema_version(conn)? {
            None => conn.execute_batch(SQLITE_SCHEMA).map_err(err)?,
            Some(_) => return Ok(()),
        }
        conn.execute(SQLITE_SET_VERSION, [SCHEMA_VERSION])
            .map_err(err)?;
        Ok(())
    })();
    let end = match outcome {
        Ok(()) => "RELEASE seawall_outbox_migrate",
        Err(_) => "ROLLBACK TO seawall_outbox_migrate; RELEASE seawall_outbox_migrate",
    };
    conn.execute_batch(end).map_err(err)?;
    outcome
}

/// The schema version of the outbox tables (`None`: not created yet).
///
/// # Errors
///
/// [`OutboxError::UnsupportedSchema`] when it is not one this build supports.
fn schema_version(conn: &Connection) -> Result<Option<u32>, OutboxError> {
    let err = |e| OutboxError::sqlite("reading the outbox schema version", e);
    let exists: bool = conn
        .query_row(SQLITE_HAS_SCHEMA, [], |r| r.get(0))
        .map_err(err)?;
    if !exists {
        return Ok(None);
    }
    let (version, shown) = conn
        .query_row(SQLITE_VERSION, [], |r| Ok((r.get(0)?, r.get(1)?)))
        .map_err(err)?;
    accept_version(version, shown).map(Some)
}

/// SQLite: whether the outbox tables were created.
const SQLITE_HAS_SCHEMA: &str = "SELECT EXISTS (SELECT 1 FROM sqlite_master
     WHERE type = 'table' AND name = 'seawall_outbox_schema')";
/// SQLite: the schema version, as an integer when it is one, and as text
/// for the error that refuses it.
const SQLITE_VERSION: &str = "SELECT CASE WHEN typeof(v) = 'integer' THEN v END,
     CASE WHEN v IS NULL THEN 'none' ELSE CAST(v AS TEXT) END
     FROM (SELECT max(version) AS v FROM seawall_outbox_schema)";
/// SQLite: records the schema version.
const SQLITE_SET_VERSION: &str = "INSERT INTO seawall_outbox_schema (version) VALUES (?1)";
/// SQLite: one event (its id is the row id).
const SQLITE_ENQUEUE: &str =
    "INSERT INTO seawall_outbox (aggregate, event_type, payload, created_at_ms)
     VALUES (?1, ?2, ?3, ?4)";
/// SQLite: one handled message (no row for a duplicate).
const SQLITE_HANDLE: &str = "INSERT INTO seawall_inbox (consumer, message_id, handled_at_ms)
     VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING";

/// Accepts the schema version read from a database: `version` when it is
/// an integer, `shown` as the error reports it. Every backend decides here.
fn accept_version(version: Option<i64>, shown: String) -> Result<u32, OutboxError> {
    match version {
        Some(v) if v == i64::from(SCHEMA_VERSION) => Ok(SCHEMA_VERSION),
        _ => Err(OutboxError::UnsupportedSchema {
            found: shown,
            supported: SCHEMA_VERSION,
        }),
    }
}

/// Maps a failure of a statement on the outbox tables: a missing table means
/// [`migrate`] has not run.
fn table_error(operation: &str, error: rusqlite::Error) -> OutboxError {
    if missing_table(&error.to_string()) {
        return OutboxError::NotMigrated {
            location: "this database".to_owned(),
        };
    }
    OutboxError::sqlite(operation, error)
}

/// Whether SQLite's message says a table is missing (the outbox was not
/// migrated), for rusqlite's errors and sqlx's alike.
fn missing_table(message: &str) -> bool {
    message.contains("no such table")
}

/// Refuses an empty aggregate or event type.
fn check_event(aggregate: &str, event_type: &str) -> Result<(), OutboxError> {
    if aggregate.is_empty() || event_type.is_empty() {
        return Err(OutboxError::Invalid(format!(
            "aggregate and event type must not be empty (aggregate {aggregate:?}, \
             event type {event_type:?})"
        )));
    }
    Ok(())
}

/// Refuses an empty consumer or message id.
fn check_message(consumer: &str, message_id: &str) -> Result<(), OutboxError> {
    if consumer.is_empty() || message_id.is_empty() {
        return Err(OutboxError::Invalid(format!(
            "consumer and message id must not be empty (consumer {consumer:?}, \
             message id {message_id:?})"
        )));
    }
    Ok(())
}

/// The event id of outbox row `id` of the service `source`.
fn event_id(source: &str, id: i64) -> String {
    format!("{source}:{id}")
}

/// The unsent rows a sqlx query of [`SELECT_UNSENT`]'s columns read, as
/// envelopes: one statement of the columns' order for both sqlx executors.
#[cfg(any(feature = "sqlx-sqlite", feature = "sqlx-postgres"))]
fn sqlx_envelopes<R>(source: &str, rows: &[R]) -> Result<Vec<(i64, Envelope)>, sqlx::Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    rows.iter()
        .map(|r| {
            let id: i64 = r.try_get(0)?;
            Ok((
                id,
                Envelope {
                    event_id: event_id(source, id),
                    aggregate: r.try_get(1)?,
                    event_type: r.try_get(2)?,
                    payload: r.try_get(3)?,
                    created_at_ms: r.try_get(4)?,
                },
            ))
        })
        .collect()
}

/// The outbox: events written in the caller's transaction.
#[derive(Debug)]
#[non_exhaustive]
pub struct Outbox;

impl Outbox {
    /// Records the event `event_type` of `aggregate` with `payload` (opaque
    /// text, typically JSON) in the caller's transaction `tx`. It is published
    /// by the [`Relay`] once `tx` commits; if `tx` rolls back, it never is.
    /// Returns the event's row id.
    ///
    /// # Errors
    ///
    /// [`OutboxError::Invalid`] for an empty aggregate or event type,
    /// [`OutboxError::NotMigrated`], [`OutboxError::Sqlite`].
    pub fn enqueue(
        tx: &Transaction<'_>,
        aggregate: &str,
        event_type: &str,
        payload: &str,
    ) -> Result<i64, OutboxError> {
        check_event(aggregate, event_type)?;
        tx.prepare_cached(SQLITE_ENQUEUE)
            .and_then(|mut s| s.execute(params![aggregate, event_type, payload, now_ms()]))
            .map_err(|e| table_error("enqueuing an event", e))?;
        Ok(tx.last_insert_rowid())
    }
}

/// The inbox: which messages a consumer has handled.
#[derive(Debug)]
#[non_exhaustive]
pub struct Inbox;

impl Inbox {
    /// Records that `consumer` handles `message_id` (an [`Envelope::event_id`])
    /// in the caller's transaction `tx`, which also applies the effect.
    /// Returns `true` the first time, `false` when it was already handled (a
    /// duplicate: apply nothing, commit or roll back, and acknowledge it).
    ///
    /// # Errors
    ///
    /// [`OutboxError::Invalid`] for an empty consumer or message id,
    /// [`OutboxError::NotMigrated`], [`OutboxError::Sqlite`].
    pub fn handle(
        tx: &Transaction<'_>,
        consumer: &str,
        message_id: &str,
    ) -> Result<bool, OutboxError> {
        check_message(consumer, message_id)?;
        let inserted = tx
            .prepare_cached(SQLITE_HANDLE)
            .and_then(|mut s| s.execute(params![consumer, message_id, now_ms()]))
            .map_err(|e| table_error("recording a message in the inbox", e))?;
        Ok(inserted == 1)
    }
}

/// Options of a [`Relay`].
///
/// # Default
///
/// Batches of 256 events, polled every 100 ms, retried every second after a
/// broker failure.
#[derive(Clone, Debug)]
pub struct RelayOptions {
    source: String,
    stream: String,
    batch: usize,
    poll_interval: Duration,
    retry_interval: Duration,
}

impl RelayOptions {
    /// A relay of the outbox of the service `source` (its name, which makes
    /// event ids unique across services: `{source}:{row id}`) to `stream`.
    pub fn new(source: impl Into<String>, stream: impl Into<String>) -> Self {
        RelayOptions {
            source: source.into(),
            stream: stream.into(),
            batch: 256,
            poll_interval: Duration::from_millis(100),
            retry_interval: Duration::from_secs(1),
        }
    }

    /// The most events published at once (at least 1).
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// How long [`Relay::run`] waits when the outbox is empty.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// How long [`Relay::run`] waits after a failure before trying again.
    pub fn retry_interval(mut self, interval: Duration) -> Self {
        self.retry_interval = interval;
        self
    }
}

/// What [`Relay::run`] did before it was shut down.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayReport {
    /// Events published and marked sent.
    pub published: u64,
    /// Rounds that failed (broker or database); their events were kept.
    pub failures: u64,
}

/// Where a relay reads the outbox: a SQLite file or a Postgres database.
trait Store: Send + Sync {
    /// Up to `batch` unsent rows, oldest first, as envelopes of `source`.
    fn unsent<'a>(&'a self, source: &'a str, batch: usize)
        -> StoreFuture<'a, Vec<(i64, Envelope)>>;
    /// Marks rows sent.
    fn mark_sent(&self, ids: Vec<i64>) -> StoreFuture<'_, ()>;
    /// How many rows are unsent.
    fn pending(&self) -> StoreFuture<'_, u64>;
    /// Deletes the rows sent before `before_ms`.
    fn purge_sent(&self, before_ms: i64) -> StoreFuture<'_, u64>;
}

type StoreFuture<'a, T> = crate::clock::BoxFuture<'a, Result<T, OutboxError>>;

const SELECT_UNSENT: &str = "SELECT id, aggregate, event_type, payload, created_at_ms
     FROM seawall_outbox WHERE sent_at_ms IS NULL ORDER BY id LIMIT $1";
const MARK_SENT: &str = "UPDATE seawall_outbox SET sent_at_ms = $1 WHERE id = $2";
const COUNT_UNSENT: &str = "SELECT count(*) FROM seawall_outbox WHERE sent_at_ms IS NULL";
const PURGE_SENT: &str =
    "DELETE FROM seawall_outbox WHERE sent_at_ms IS NOT NULL AND sent_at_ms <= $1";

/// The outbox of a SQLite file, on a connection of the relay's own.
struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
}

impl SqliteStore {
    /// Runs `f` on the connection on a blocking thread.
    fn with_conn<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, OutboxError> + Send + 'static,
    ) -> StoreFuture<'_, T> {
        let conn = Arc::clone(&self.conn);
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
                f(&mut conn)
            })
            .await
            .map_err(|e| OutboxError::Aborted(e.to_string()))?
        })
    }
}

impl Store for SqliteStore {
    fn unsent<'a>(
        &'a self,
        source: &'a str,
        batch: usize,
    ) -> StoreFuture<'a, Vec<(i64, Envelope)>> {
        let source = source.to_owned();
        self.with_conn(move |conn| {
            let mut stmt = conn
                .prepare_cached(SELECT_UNSENT)
                .map_err(|e| table_error("reading the outbox", e))?;
            let rows = stmt
                .query_map([i64::try_from(batch).unwrap_or(i64::MAX)], |r| {
                    let id: i64 = r.get(0)?;
                    Ok((
                        id,
                        Envelope {
                            event_id: event_id(&source, id),
                            aggregate: r.get(1)?,
                            event_type: r.get(2)?,
                            payload: r.get(3)?,
                            created_at_ms: r.get(4)?,
                        },
                    ))
                })
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(|e| OutboxError::sqlite("reading the outbox", e))?;
            Ok(rows)
        })
    }

    fn mark_sent(&self, ids: Vec<i64>) -> StoreFuture<'_, ()> {
        self.with_conn(move |conn| {
            let err = |e| OutboxError::sqlite("marking events sent", e);
            let tx = conn.transaction().map_err(err)?;
            {
                let mut mark = tx.prepare_cached(MARK_SENT).map_err(err)?;
                let now = now_ms();
                for id in ids {
                    mark.execute(params![now, id]).map_err(err)?;
                }
            }
            tx.commit().map_err(err)
        })
    }

    fn pending(&self) -> StoreFuture<'_, u64> {
        self.with_conn(|conn| {
            conn.query_row(COUNT_UNSENT, [], |r| r.get::<_, i64>(0))
                .map(|n| u64::try_from(n).unwrap_or(0))
                .map_err(|e| table_error("counting unsent events", e))
        })
    }

    fn purge_sent(&self, before_ms: i64) -> StoreFuture<'_, u64> {
        self.with_conn(move |conn| {
            conn.execute(PURGE_SENT, [before_ms])
                .map(|n| n as u64)
                .map_err(|e| table_error("purging sent events", e))
        })
    }
}

/// The relay's busy handler: while the service holds the write lock, try
/// again every millisecond, for 5 s at most. SQLite's own busy timeout backs
/// off to 100 ms sleeps, which a service committing in a tight loop turns
/// into seconds of relay latency.
fn retry_busy(attempt: i32) -> bool {
    std::thread::sleep(Duration::from_millis(1));
    attempt < 5000
}

/// Publishes the outbox of one database to a [`Broker`] (see the [module
/// documentation](self) for the guarantees).
pub struct Relay<B> {
    store: Box<dyn Store>,
    location: String,
    broker: B,
    options: RelayOptions,
}

impl<B> std::fmt::Debug for Relay<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("location", &self.location)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl RelayOptions {
    fn check(&self) -> Result<(), OutboxError> {
        if self.source.is_empty() || self.stream.is_empty() {
            return Err(OutboxError::Invalid(
                "the relay's source and stream must not be empty".to_owned(),
            ));
        }
        Ok(())
    }
}

impl<B: Broker> Relay<B> {
    /// A relay of the outbox in the SQLite database at `path`, on a
    /// connection of its own (the database should be in WAL mode so that the
    /// relay does not hold up the service's writes).
    ///
    /// # Errors
    ///
    /// [`OutboxError::Invalid`] for an empty source or stream,
    /// [`OutboxError::NotMigrated`] when the outbox tables are missing,
    /// [`OutboxError::UnsupportedSchema`], [`OutboxError::Sqlite`].
    pub fn open(
        path: impl AsRef<Path>,
        broker: B,
        options: RelayOptions,
    ) -> Result<Self, OutboxError> {
        options.check()?;
        let path = path.as_ref();
        let opening = || format!("opening {}", path.display());
        let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE)
            .map_err(|e| OutboxError::sqlite(opening(), e))?;
        conn.busy_handler(Some(retry_busy))
            .map_err(|e| OutboxError::sqlite(opening(), e))?;
        if schema_version(&conn)?.is_none() {
            return Err(OutboxError::NotMigrated {
                location: path.display().to_string(),
            });
        }
        Ok(Relay {
            store: Box::new(SqliteStore {
                conn: Arc::new(Mutex::new(conn)),
            }),
            location: path.display().to_string(),
            broker,
            options,
        })
    }

    /// The broker the relay publishes to.
    pub fn broker(&self) -> &B {
        &self.broker
    }

    /// Publishes one batch of unsent events, oldest first, and marks them
    /// sent. Returns how many were published (0: the outbox is empty).
    ///
    /// # Errors
    ///
    /// [`OutboxError::Broker`] when publishing failed: the batch stays unsent
    /// (some of it may have been published: it is published again next time).
    /// A database error (`OutboxError::Sqlite`, `Postgres` or `Sqlx`) when
    /// reading or marking failed.
    pub async fn relay_once(&self) -> Result<usize, OutboxError> {
        let rows = self
            .store
            .unsent(&self.options.source, self.options.batch)
            .await?;
        if rows.is_empty() {
            return Ok(0);
        }
        let (ids, envelopes): (Vec<i64>, Vec<Envelope>) = rows.into_iter().unzip();
        self.broker
            .publish(&self.options.stream, &envelopes)
            .await?;
        let count = ids.len();
        self.store.mark_sent(ids).await?;
        Ok(count)
    }

    /// The number of events not yet marked sent.
    ///
    /// # Errors
    ///
    /// A database error (`OutboxError::Sqlite`, `Postgres` or `Sqlx`).
    pub async fn pending(&self) -> Result<u64, OutboxError> {
        self.store.pending().await
    }

    /// Deletes the events marked sent `age` or more ago (they are kept
    /// until then, for inspection; `Duration::ZERO` deletes every event
    /// marked sent, including one marked in the same millisecond). Returns
    /// how many were deleted.
    ///
    /// # Errors
    ///
    /// A database error (`OutboxError::Sqlite`, `Postgres` or `Sqlx`).
    pub async fn purge_sent(&self, age: Duration) -> Result<u64, OutboxError> {
        let age = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
        self.store.purge_sent(now_ms().saturating_sub(age)).await
    }

    /// Relays until `shutdown` resolves: a batch at a time, waiting the poll
    /// interval when the outbox is empty and the retry interval after a
    /// failure (the events stay in the outbox: a broker that is down, at
    /// start or later, only delays them).
    pub async fn run(&self, shutdown: impl Future<Output = ()>) -> RelayReport {
        let mut report = RelayReport::default();
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let wait = match self.relay_once().await {
                Ok(0) => self.options.poll_interval,
                Ok(n) => {
                    report.published += n as u64;
                    Duration::ZERO
                }
                Err(error) => {
                    report.failures += 1;
                    tracing::warn!(
                        target: "seawall_saga",
                        location = %self.location,
                        %error,
                        "outbox relay failed; the events stay in the outbox"
                    );
                    self.options.retry_interval
                }
            };
            tokio::select! {
                biased;
                () = &mut shutdown => return report,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `purge_sent(age)` deletes the events sent `age` or more ago: with an
    /// age of zero, one sent in the very millisecond of the purge too (the
    /// statement every store runs, at its bound).
    #[test]
    fn an_event_sent_at_the_purge_bound_is_purged_and_a_later_one_kept() {
        let conn = Connection::open_in_memory().unwrap();
        migrate(&conn).unwrap();
        for sent in [1_000_i64, 1_001] {
            conn.execute(
                "INSERT INTO seawall_outbox \
                 (aggregate, event_type, payload, created_at_ms, sent_at_ms) \
                 VALUES ('a', 'e', '{}', 0, ?1)",
                [sent],
            )
            .unwrap();
        }
        assert_eq!(conn.execute(PURGE_SENT, [1_000_i64]).unwrap(), 1);
        let left: i64 = conn
            .query_row("SELECT sent_at_ms FROM seawall_outbox", [], |r| r.get(0))
            .unwrap();
        assert_eq!(left, 1_001);
    }
}
