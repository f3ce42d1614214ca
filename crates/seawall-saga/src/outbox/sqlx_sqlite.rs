//! The outbox, the inbox and the relay on a SQLite database reached through
//! sqlx (feature `sqlx-sqlite`): the caller's `sqlx::Transaction` or
//! `SqlitePool` where the rusqlite API takes a `rusqlite::Transaction` or a
//! path.
//!
//! The same tables, statements and rules as [`Outbox::enqueue`],
//! [`Inbox::handle`], [`migrate`](super::migrate) and [`Relay::open`]; only
//! the executor differs, so a database written through one is read through
//! the other (a service may write with sqlx and relay with
//! [`Relay::open`]). sqlx 0.9 and rusqlite 0.37 link one SQLite library.
//!
//! ```
//! use seawall_saga::outbox::sqlx_sqlite;
//! use sqlx::sqlite::SqlitePoolOptions;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
//! sqlx_sqlite::migrate(&pool).await?;
//! sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER)")
//!     .execute(&pool)
//!     .await?;
//!
//! // The producer: the state change and its event, one transaction.
//! let mut tx = pool.begin().await?;
//! sqlx::query("INSERT INTO orders VALUES ('o-1', 1200)").execute(&mut *tx).await?;
//! sqlx_sqlite::enqueue(&mut tx, "o-1", "order_placed", r#"{"total":1200}"#).await?;
//! tx.commit().await?;
//!
//! // A consumer: the effect and the inbox record, one transaction.
//! let mut tx = pool.begin().await?;
//! assert!(sqlx_sqlite::handle(&mut tx, "billing", "orders:1").await?);
//! tx.commit().await?;
//! let mut tx = pool.begin().await?;
//! assert!(!sqlx_sqlite::handle(&mut tx, "billing", "orders:1").await?); // a duplicate
//! # Ok(()) }
//! ```
//!
//! [`Outbox::enqueue`]: super::Outbox::enqueue
//! [`Inbox::handle`]: super::Inbox::handle

use std::sync::Arc;

use sqlx::{Acquire, Sqlite, SqliteConnection, SqlitePool, Transaction};

use super::{
    accept_version, check_event, check_message, missing_table, now_ms, OutboxError, Relay,
    RelayOptions, Store, StoreFuture, COUNT_UNSENT, MARK_SENT, PURGE_SENT, SELECT_UNSENT,
    SQLITE_ENQUEUE, SQLITE_HANDLE, SQLITE_HAS_SCHEMA, SQLITE_SCHEMA, SQLITE_SET_VERSION,
    SQLITE_VERSION,
};
use crate::broker::{Broker, Envelope};

/// Where a missing table was looked for.
const LOCATION: &str = "this database";

/// sqlx's error while `operation` ran; a missing table means [`migrate`]
/// has not run.
fn sqlx_error(operation: &str, error: sqlx::Error) -> OutboxError {
    if error
        .as_database_error()
        .is_some_and(|e| missing_table(e.message()))
    {
        return OutboxError::NotMigrated {
            location: LOCATION.to_owned(),
        };
    }
    OutboxError::Sqlx {
        operation: operation.to_owned(),
        source: Arc::new(error),
    }
}

/// Creates the outbox and inbox tables if they are not there, or checks
/// their version if they are, in a transaction of its own on `db` (a pool,
/// a connection), or in a savepoint when `db` is the caller's transaction.
///
/// # Errors
///
/// [`OutboxError::UnsupportedSchema`] for a newer (or unreadable) schema
/// version, nothing written; [`OutboxError::Sqlx`] otherwise.
pub async fn migrate<'c>(db: impl Acquire<'c, Database = Sqlite>) -> Result<(), OutboxError> {
    let err = |e| sqlx_error("migrating the outbox schema", e);
    let mut tx = db.begin().await.map_err(err)?;
    if schema_version(&mut tx).await?.is_some() {
        return Ok(());
    }
    sqlx::raw_sql(SQLITE_SCHEMA)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
    sqlx::query(SQLITE_SET_VERSION)
        .bind(i64::from(super::SCHEMA_VERSION))
        .execute(&mut *tx)
        .await
        .map_err(err)?;
    tx.commit().await.map_err(err)
}

/// The schema version of the outbox tables (`None`: not created yet).
///
/// # Errors
///
/// [`OutboxError::UnsupportedSchema`] when it is not one this build supports.
async fn schema_version(conn: &mut SqliteConnection) -> Result<Option<u32>, OutboxError> {
    let err = |e| sqlx_error("reading the outbox schema version", e);
    let exists: bool = sqlx::query_scalar(SQLITE_HAS_SCHEMA)
        .fetch_one(&mut *conn)
        .await
        .map_err(err)?;
    if !exists {
        return Ok(None);
    }
    let (version, shown): (Option<i64>, String) = sqlx::query_as(SQLITE_VERSION)
        .fetch_one(&mut *conn)
        .await
        .map_err(err)?;
    accept_version(version, shown).map(Some)
}

/// Records the event `event_type` of `aggregate` with `payload` in the
/// caller's transaction `tx` (see [`Outbox::enqueue`](super::Outbox::enqueue)).
/// Returns the event's row id.
///
/// # Errors
///
/// [`OutboxError::Invalid`] for an empty aggregate or event type,
/// [`OutboxError::NotMigrated`], [`OutboxError::Sqlx`].
pub async fn enqueue(
    tx: &mut Transaction<'_, Sqlite>,
    aggregate: &str,
    event_type: &str,
    payload: &str,
) -> Result<i64, OutboxError> {
    check_event(aggregate, event_type)?;
    let done = sqlx::query(SQLITE_ENQUEUE)
        .bind(aggregate)
        .bind(event_type)
        .bind(payload)
        .bind(now_ms())
        .execute(&mut **tx)
        .await
        .map_err(|e| sqlx_error("enqueuing an event", e))?;
    Ok(done.last_insert_rowid())
}

/// Records that `consumer` handles `message_id` in the caller's transaction
/// `tx` (see [`Inbox::handle`](super::Inbox::handle)): `true` the first
/// time, `false` for a duplicate.
///
/// # Errors
///
/// [`OutboxError::Invalid`] for an empty consumer or message id,
/// [`OutboxError::NotMigrated`], [`OutboxError::Sqlx`].
pub async fn handle(
    tx: &mut Transaction<'_, Sqlite>,
    consumer: &str,
    message_id: &str,
) -> Result<bool, OutboxError> {
    check_message(consumer, message_id)?;
    let done = sqlx::query(SQLITE_HANDLE)
        .bind(consumer)
        .bind(message_id)
        .bind(now_ms())
        .execute(&mut **tx)
        .await
        .map_err(|e| sqlx_error("recording a message in the inbox", e))?;
    Ok(done.rows_affected() == 1)
}

/// The outbox of a SQLite database, on a sqlx pool.
struct SqlxSqliteStore {
    pool: SqlitePool,
}

impl Store for SqlxSqliteStore {
    fn unsent<'a>(
        &'a self,
        source: &'a str,
        batch: usize,
    ) -> StoreFuture<'a, Vec<(i64, Envelope)>> {
        Box::pin(async move {
            let err = |e| sqlx_error("reading the outbox", e);
            let rows = sqlx::query(SELECT_UNSENT)
                .bind(i64::try_from(batch).unwrap_or(i64::MAX))
                .fetch_all(&self.pool)
                .await
                .map_err(err)?;
            super::sqlx_envelopes(source, &rows).map_err(err)
        })
    }

    fn mark_sent(&self, ids: Vec<i64>) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let err = |e| sqlx_error("marking events sent", e);
            let mut tx = self.pool.begin().await.map_err(err)?;
            let now = now_ms();
            for id in ids {
                sqlx::query(MARK_SENT)
                    .bind(now)
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .map_err(err)?;
            }
            tx.commit().await.map_err(err)
        })
    }

    fn pending(&self) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            let n: i64 = sqlx::query_scalar(COUNT_UNSENT)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| sqlx_error("counting unsent events", e))?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn purge_sent(&self, before_ms: i64) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            sqlx::query(PURGE_SENT)
                .bind(before_ms)
                .execute(&self.pool)
                .await
                .map(|done| done.rows_affected())
                .map_err(|e| sqlx_error("purging sent events", e))
        })
    }
}

impl<B: Broker> Relay<B> {
    /// A relay of the outbox in the SQLite database of `pool` (give it a
    /// busy timeout, so that the relay waits for the service's writes
    /// instead of failing a round; the database should be in WAL mode).
    ///
    /// # Errors
    ///
    /// [`OutboxError::Invalid`] for an empty source or stream,
    /// [`OutboxError::NotMigrated`] when the outbox tables are missing,
    /// [`OutboxError::UnsupportedSchema`], [`OutboxError::Sqlx`].
    pub async fn sqlx_sqlite(
        pool: SqlitePool,
        broker: B,
        options: RelayOptions,
    ) -> Result<Self, OutboxError> {
        options.check()?;
        let location = pool.connect_options().get_filename().display().to_string();
        let mut conn = pool
            .acquire()
            .await
            .map_err(|e| sqlx_error("opening the relay's connection", e))?;
        if schema_version(&mut conn).await?.is_none() {
            return Err(OutboxError::NotMigrated { location });
        }
        drop(conn);
        Ok(Relay {
            store: Box::new(SqlxSqliteStore { pool }),
            location,
            broker,
            options,
        })
    }
}
