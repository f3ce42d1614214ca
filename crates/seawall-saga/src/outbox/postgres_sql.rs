//! The outbox's statements on Postgres, one copy for both executors:
//! tokio-postgres ([`super::postgres`]) and sqlx ([`super::sqlx_postgres`]).
//! Only how they are sent differs.

/// The tables, in the connection's current schema.
pub(super) const SCHEMA: &str = "
CREATE TABLE seawall_outbox_schema (version INTEGER NOT NULL);
CREATE TABLE seawall_outbox (
    id BIGSERIAL PRIMARY KEY,
    aggregate TEXT NOT NULL,
    event_type TEXT NOT NULL,
    payload TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    sent_at_ms BIGINT
);
CREATE INDEX seawall_outbox_unsent ON seawall_outbox (id) WHERE sent_at_ms IS NULL;
CREATE TABLE seawall_inbox (
    consumer TEXT NOT NULL,
    message_id TEXT NOT NULL,
    handled_at_ms BIGINT NOT NULL,
    PRIMARY KEY (consumer, message_id)
);
";

/// The advisory lock key that serialises concurrent migrations ("SWOB").
pub(super) const MIGRATION_LOCK: i64 = 0x5357_4f42;

/// Takes the migration lock until the transaction ends (`$1`: [`MIGRATION_LOCK`]).
pub(super) const LOCK_MIGRATION: &str = "SELECT pg_advisory_xact_lock($1)";

/// Whether the outbox tables were created.
pub(super) const HAS_SCHEMA: &str = "SELECT to_regclass('seawall_outbox_schema') IS NOT NULL";

/// The schema version (`int4`, `NULL` when the table is empty).
pub(super) const VERSION: &str = "SELECT max(version) FROM seawall_outbox_schema";

/// Records the schema version (`$1`: `int4`).
pub(super) const SET_VERSION: &str = "INSERT INTO seawall_outbox_schema (version) VALUES ($1)";

/// Serialises the transactions that enqueue events of one aggregate (`$1`)
/// until they end, so the ids of an aggregate's events follow their commits.
pub(super) const LOCK_AGGREGATE: &str =
    "SELECT pg_advisory_xact_lock(hashtextextended($1, 1398230850))";

/// One event; returns its id.
pub(super) const ENQUEUE: &str =
    "INSERT INTO seawall_outbox (aggregate, event_type, payload, created_at_ms)
     VALUES ($1, $2, $3, $4) RETURNING id";

/// One handled message (no row for a duplicate).
pub(super) const HANDLE: &str = "INSERT INTO seawall_inbox (consumer, message_id, handled_at_ms)
     VALUES ($1, $2, $3) ON CONFLICT DO NOTHING";

/// Marks the events `$2` (`int8[]`) sent at `$1`.
pub(super) const MARK_SENT: &str = "UPDATE seawall_outbox SET sent_at_ms = $1 WHERE id = ANY($2)";

/// The error code of a missing table: the outbox was not migrated.
#[cfg(feature = "sqlx-postgres")]
pub(super) const UNDEFINED_TABLE: &str = "42P01";

/// Where a missing table was looked for.
pub(super) const LOCATION: &str = "the postgres search path";

/// The version read from the database, as [`super::accept_version`] takes it.
pub(super) fn version(found: Option<i32>) -> (Option<i64>, String) {
    (
        found.map(i64::from),
        found.map_or_else(|| "none".to_owned(), |v| v.to_string()),
    )
}

/// [`super::SCHEMA_VERSION`] as Postgres stores it.
pub(super) fn schema_version() -> i32 {
    i32::try_from(super::SCHEMA_VERSION).unwrap_or(i32::MAX)
}
