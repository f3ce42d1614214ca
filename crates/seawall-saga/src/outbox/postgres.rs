//! The outbox and the inbox on Postgres, through tokio-postgres's
//! `Transaction`.
//!
//! The same tables as on SQLite (`seawall_outbox`, `seawall_inbox`,
//! `seawall_outbox_schema`), in the connection's current schema
//! (`search_path`). [`migrate`] creates them; [`enqueue`] and [`handle`] take
//! the caller's transaction; [`Relay::postgres`] relays.
//!
//! **Order on Postgres.** Ids come from a sequence, and concurrent
//! transactions may commit in another order than they took their ids, so a
//! relay could see an event of an aggregate before an earlier one that is
//! not committed yet. [`enqueue`] therefore takes a transaction-level
//! advisory lock on the aggregate (`pg_advisory_xact_lock`) before taking its
//! id: transactions enqueueing events of one aggregate are serialised, the
//! later one waits for the earlier one's commit or rollback, and the ids of an
//! aggregate's events follow their commits. Events of different aggregates are
//! not serialised.
//!
//! ```no_run
//! # async fn run(client: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use seawall_saga::outbox::postgres;
//! postgres::migrate(client).await?;
//! let tx = client.transaction().await?;
//! tx.execute("UPDATE orders SET status = 'placed' WHERE id = 'o-1'", &[]).await?;
//! postgres::enqueue(&tx, "o-1", "order_placed", r#"{"total":1200}"#).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```

use std::sync::Arc;

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, GenericClient, Statement, Transaction};

use super::postgres_sql as sql;
use super::{
    accept_version, check_event, check_message, event_id, now_ms, OutboxError, Relay, RelayOptions,
    Store, StoreFuture, COUNT_UNSENT, PURGE_SENT, SELECT_UNSENT,
};
use crate::broker::{Broker, Envelope};

fn pg(operation: &str, error: tokio_postgres::Error) -> OutboxError {
    if error.code() == Some(&SqlState::UNDEFINED_TABLE) {
        return OutboxError::NotMigrated {
            location: sql::LOCATION.to_owned(),
        };
    }
    OutboxError::Postgres {
        operation: operation.to_owned(),
        source: Arc::new(error),
    }
}

/// Creates the outbox and inbox tables if they are not there, or checks their
/// version if they are, in one transaction (concurrent migrations wait for
/// each other).
///
/// # Errors
///
/// [`OutboxError::UnsupportedSchema`] for a newer schema version (nothing is
/// written), [`OutboxError::Postgres`] otherwise.
pub async fn migrate(client: &mut Client) -> Result<(), OutboxError> {
    let err = |e| pg("migrating the outbox schema", e);
    let tx = client.transaction().await.map_err(err)?;
    tx.execute(sql::LOCK_MIGRATION, &[&sql::MIGRATION_LOCK])
        .await
        .map_err(err)?;
    if schema_version(&tx).await?.is_some() {
        return Ok(());
    }
    tx.batch_execute(sql::SCHEMA).await.map_err(err)?;
    tx.execute(sql::SET_VERSION, &[&sql::schema_version()])
        .await
        .map_err(err)?;
    tx.commit().await.map_err(err)
}

/// The schema version of the outbox tables (`None`: not created yet).
///
/// # Errors
///
/// [`OutboxError::UnsupportedSchema`] when it is not one this build supports.
async fn schema_version(client: &impl GenericClient) -> Result<Option<u32>, OutboxError> {
    let err = |e| pg("reading the outbox schema version", e);
    let exists: bool = client
        .query_one(sql::HAS_SCHEMA, &[])
        .await
        .map_err(err)?
        .get(0);
    if !exists {
        return Ok(None);
    }
    let found: Option<i32> = client
        .query_one(sql::VERSION, &[])
        .await
        .map_err(err)?
        .get(0);
    let (version, shown) = sql::version(found);
    accept_version(version, shown).map(Some)
}

/// Records the event `event_type` of `aggregate` with `payload` in the
/// caller's transaction `tx` (see [`Outbox::enqueue`](super::Outbox::enqueue)),
/// after taking the aggregate's advisory lock (see the [module
/// documentation](self)). Returns the event's row id.
///
/// # Errors
///
/// [`OutboxError::Invalid`], [`OutboxError::NotMigrated`],
/// [`OutboxError::Postgres`].
pub async fn enqueue(
    tx: &Transaction<'_>,
    aggregate: &str,
    event_type: &str,
    payload: &str,
) -> Result<i64, OutboxError> {
    check_event(aggregate, event_type)?;
    let err = |e| pg("enqueuing an event", e);
    tx.execute(sql::LOCK_AGGREGATE, &[&aggregate])
        .await
        .map_err(err)?;
    let row = tx
        .query_one(
            sql::ENQUEUE,
            &[&aggregate, &event_type, &payload, &now_ms()],
        )
        .await
        .map_err(err)?;
    Ok(row.get(0))
}

/// Records that `consumer` handles `message_id` in the caller's transaction
/// `tx` (see [`Inbox::handle`](super::Inbox::handle)): `true` the first time,
/// `false` for a duplicate.
///
/// # Errors
///
/// [`OutboxError::Invalid`], [`OutboxError::NotMigrated`],
/// [`OutboxError::Postgres`].
pub async fn handle(
    tx: &Transaction<'_>,
    consumer: &str,
    message_id: &str,
) -> Result<bool, OutboxError> {
    check_message(consumer, message_id)?;
    let inserted = tx
        .execute(sql::HANDLE, &[&consumer, &message_id, &now_ms()])
        .await
        .map_err(|e| pg("recording a message in the inbox", e))?;
    Ok(inserted == 1)
}

/// The outbox of a Postgres database, on the relay's client, with the
/// statements of a relay round prepared once (one round trip each).
struct PostgresStore {
    client: Client,
    unsent: Statement,
    mark_sent: Statement,
}

impl Store for PostgresStore {
    fn unsent<'a>(
        &'a self,
        source: &'a str,
        batch: usize,
    ) -> StoreFuture<'a, Vec<(i64, Envelope)>> {
        Box::pin(async move {
            let limit = i64::try_from(batch).unwrap_or(i64::MAX);
            let rows = self
                .client
                .query(&self.unsent, &[&limit])
                .await
                .map_err(|e| pg("reading the outbox", e))?;
            Ok(rows
                .iter()
                .map(|r| {
                    let id: i64 = r.get(0);
                    (
                        id,
                        Envelope {
                            event_id: event_id(source, id),
                            aggregate: r.get(1),
                            event_type: r.get(2),
                            payload: r.get(3),
                            created_at_ms: r.get(4),
                        },
                    )
                })
                .collect())
        })
    }

    fn mark_sent(&self, ids: Vec<i64>) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            self.client
                .execute(&self.mark_sent, &[&now_ms(), &ids])
                .await
                .map(drop)
                .map_err(|e| pg("marking events sent", e))
        })
    }

    fn pending(&self) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            let n: i64 = self
                .client
                .query_one(COUNT_UNSENT, &[])
                .await
                .map_err(|e| pg("counting unsent events", e))?
                .get(0);
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn purge_sent(&self, before_ms: i64) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            self.client
                .execute(PURGE_SENT, &[&before_ms])
                .await
                .map_err(|e| pg("purging sent events", e))
        })
    }
}

impl<B: Broker> Relay<B> {
    /// A relay of the outbox in the Postgres database of `client` (a
    /// connection of the relay's own, whose connection future the caller
    /// drives; tables in its `search_path`). A client whose connection is
    /// lost is not made again: its rounds fail (the events stay in the
    /// outbox) until the relay is replaced by one on a new client.
    ///
    /// The relay sets `synchronous_commit = off` for this client's session:
    /// its only writes mark events sent and purge sent ones, and a mark lost
    /// to a server crash only makes the event published again (which the
    /// consumers' inbox absorbs), so a relay round does not wait for a WAL
    /// flush. Events themselves are committed by the producers' own
    /// transactions, with their own settings.
    ///
    /// # Errors
    ///
    /// [`OutboxError::Invalid`] for an empty source or stream,
    /// [`OutboxError::NotMigrated`], [`OutboxError::UnsupportedSchema`],
    /// [`OutboxError::Postgres`].
    pub async fn postgres(
        client: Client,
        broker: B,
        options: RelayOptions,
    ) -> Result<Self, OutboxError> {
        options.check()?;
        if schema_version(&client).await?.is_none() {
            return Err(OutboxError::NotMigrated {
                location: sql::LOCATION.to_owned(),
            });
        }
        client
            .batch_execute("SET synchronous_commit = off")
            .await
            .map_err(|e| pg("setting up the relay's session", e))?;
        let prepare = |e| pg("preparing the relay's statements", e);
        let unsent = client.prepare(SELECT_UNSENT).await.map_err(prepare)?;
        let mark_sent = client.prepare(sql::MARK_SENT).await.map_err(prepare)?;
        Ok(Relay {
            store: Box::new(PostgresStore {
                client,
                unsent,
                mark_sent,
            }),
            location: "postgres".to_owned(),
            broker,
            options,
        })
    }
}
