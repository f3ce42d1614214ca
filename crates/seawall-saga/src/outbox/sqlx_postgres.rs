//! The outbox, the inbox and the relay on Postgres through sqlx (feature
//! `sqlx-postgres`): the caller's `sqlx::Transaction` or `PgPool` where
//! [`postgres`](super::postgres) takes tokio-postgres's `Transaction` or
//! `Client`.
//!
//! The same tables, statements and rules as the tokio-postgres API (one
//! copy of the SQL serves both), including the per-aggregate advisory lock
//! that makes the ids of an aggregate's events follow their commits (see
//! [`postgres`](super::postgres)); tables in the connection's
//! `search_path`.
//!
//! ```no_run
//! use seawall_saga::outbox::sqlx_postgres;
//!
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! sqlx_postgres::migrate(&pool).await?;
//! let mut tx = pool.begin().await?;
//! sqlx::query("UPDATE orders SET status = 'placed' WHERE id = 'o-1'")
//!     .execute(&mut *tx)
//!     .await?;
//! sqlx_postgres::enqueue(&mut tx, "o-1", "order_placed", r#"{"total":1200}"#).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```

use std::sync::Arc;

use sqlx::{Acquire, PgConnection, PgPool, Postgres, Transaction};

use super::postgres_sql as sql;
use super::{
    accept_version, check_event, check_message, now_ms, OutboxError, Relay, RelayOptions, Store,
    StoreFuture, COUNT_UNSENT, PURGE_SENT, SELECT_UNSENT,
};
use crate::broker::{Broker, Envelope};

/// sqlx's error while `operation` ran; a missing table means [`migrate`]
/// has not run.
fn sqlx_error(operation: &str, error: sqlx::Error) -> OutboxError {
    if error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == sql::UNDEFINED_TABLE)
    {
        return OutboxError::NotMigrated {
            location: sql::LOCATION.to_owned(),
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
/// Concurrent migrations wait for each other.
///
/// # Errors
///
/// [`OutboxError::UnsupportedSchema`] for a newer schema version (nothing is
/// written), [`OutboxError::Sqlx`] otherwise.
pub async fn migrate<'c>(db: impl Acquire<'c, Database = Postgres>) -> Result<(), OutboxError> {
    let err = |e| sqlx_error("migrating the outbox schema", e);
    let mut tx = db.begin().await.map_err(err)?;
    sqlx::query(sql::LOCK_MIGRATION)
        .bind(sql::MIGRATION_LOCK)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
    if schema_version(&mut tx).await?.is_some() {
        return Ok(());
    }
    sqlx::raw_sql(sql::SCHEMA)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
    sqlx::query(sql::SET_VERSION)
        .bind(sql::schema_version())
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
async fn schema_version(conn: &mut PgConnection) -> Result<Option<u32>, OutboxError> {
    let err = |e| sqlx_error("reading the outbox schema version", e);
    let exists: bool = sqlx::query_scalar(sql::HAS_SCHEMA)
        .fetch_one(&mut *conn)
        .await
        .map_err(err)?;
    if !exists {
        return Ok(None);
    }
    let found: Option<i32> = sqlx::query_scalar(sql::VERSION)
        .fetch_one(&mut *conn)
        .await
        .map_err(err)?;
    let (version, shown) = sql::version(found);
    accept_version(version, shown).map(Some)
}

/// Records the event `event_type` of `aggregate` with `payload` in the
/// caller's transaction `tx`, after taking the aggregate's advisory lock
/// (see [`postgres::enqueue`](super::postgres::enqueue)). Returns the
/// event's row id.
///
/// # Errors
///
/// [`OutboxError::Invalid`], [`OutboxError::NotMigrated`],
/// [`OutboxError::Sqlx`].
pub async fn enqueue(
    tx: &mut Transaction<'_, Postgres>,
    aggregate: &str,
    event_type: &str,
    payload: &str,
) -> Result<i64, OutboxError> {
    check_event(aggregate, event_type)?;
    let err = |e| sqlx_error("enqueuing an event", e);
    sqlx::query(sql::LOCK_AGGREGATE)
        .bind(aggregate)
        .execute(&mut **tx)
        .await
        .map_err(err)?;
    sqlx::query_scalar(sql::ENQUEUE)
        .bind(aggregate)
        .bind(event_type)
        .bind(payload)
        .bind(now_ms())
        .fetch_one(&mut **tx)
        .await
        .map_err(err)
}

/// Records that `consumer` handles `message_id` in the caller's transaction
/// `tx` (see [`Inbox::handle`](super::Inbox::handle)): `true` the first
/// time, `false` for a duplicate.
///
/// # Errors
///
/// [`OutboxError::Invalid`], [`OutboxError::NotMigrated`],
/// [`OutboxError::Sqlx`].
pub async fn handle(
    tx: &mut Transaction<'_, Postgres>,
    consumer: &str,
    message_id: &str,
) -> Result<bool, OutboxError> {
    check_message(consumer, message_id)?;
    let done = sqlx::query(sql::HANDLE)
        .bind(consumer)
        .bind(message_id)
        .bind(now_ms())
        .execute(&mut **tx)
        .await
        .map_err(|e| sqlx_error("recording a message in the inbox", e))?;
    Ok(done.rows_affected() == 1)
}

/// The outbox of a Postgres database, on a sqlx pool.
struct SqlxPostgresStore {
    pool: PgPool,
}

impl Store for SqlxPostgresStore {
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
            sqlx::query(sql::MARK_SENT)
                .bind(now_ms())
                .bind(ids)
                .execute(&self.pool)
                .await
                .map(drop)
                .map_err(|e| sqlx_error("marking events sent", e))
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
    /// A relay of the outbox in the Postgres database of `pool` (tables in
    /// the `search_path` of its connections). Unlike
    /// [`Relay::postgres`](super::Relay), a lost connection is made again
    /// by the pool.
    ///
    /// # Errors
    ///
    /// [`OutboxError::Invalid`] for an empty source or stream,
    /// [`OutboxError::NotMigrated`], [`OutboxError::UnsupportedSchema`],
    /// [`OutboxError::Sqlx`].
    pub async fn sqlx_postgres(
        pool: PgPool,
        broker: B,
        options: RelayOptions,
    ) -> Result<Self, OutboxError> {
        options.check()?;
        let mut conn = pool
            .acquire()
            .await
            .map_err(|e| sqlx_error("opening the relay's connection", e))?;
        if schema_version(&mut conn).await?.is_none() {
            return Err(OutboxError::NotMigrated {
                location: sql::LOCATION.to_owned(),
            });
        }
        drop(conn);
        Ok(Relay {
            store: Box::new(SqlxPostgresStore { pool }),
            location: "postgres".to_owned(),
            broker,
            options,
        })
    }
}
