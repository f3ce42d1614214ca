//! Error types.
//!
//! [`SagaError`] is what the orchestrator returns; [`LogError`] is what a
//! [`SagaLog`](crate::SagaLog) returns; [`DefinitionError`] comes from building a
//! saga or an orchestrator; [`OutputError`] from reading an earlier step's output
//! inside a step.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::id::SagaId;

/// An error from a saga log backend.
///
/// Backend errors are kept behind an [`Arc`] so the error is [`Clone`]: one failed
/// group commit is reported to every saga whose transition was in it.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// The file exists, is not empty and is not a SQLite database (too short
    /// for one, a wrong header, encrypted, or some other kind of file).
    /// Nothing was written to it.
    #[error("{path} is not a sqlite database: {detail}")]
    NotADatabase {
        /// The file that was opened.
        path: PathBuf,
        /// What gave it away.
        detail: String,
        /// What SQLite reported, when SQLite found it (`None` when the file
        /// was refused before SQLite read it).
        #[source]
        source: Option<Arc<rusqlite::Error>>,
    },
    /// The database is a valid database that belongs to something else (its tables
    /// or application id are not those of a saga log). Nothing was written to it.
    #[error("{location} is not a saga log: {detail}")]
    Foreign {
        /// The file path or Postgres schema.
        location: String,
        /// What made it foreign.
        detail: String,
    },
    /// The log's storage is damaged or holds data this crate cannot decode.
    #[error("corrupt saga log: {detail}")]
    Corrupt {
        /// What was found.
        detail: String,
    },
    /// The log was written by a newer version of this crate.
    #[error("unsupported saga log schema version {found} (this build supports {supported})")]
    UnsupportedSchema {
        /// The version found in the log.
        found: String,
        /// The version this build reads and writes.
        supported: u32,
    },
    /// The Postgres server could not be reached or refused the connection.
    #[cfg(feature = "postgres")]
    #[error("cannot connect to postgres at {target}")]
    Connect {
        /// Host, port and database (never the password).
        target: String,
        /// The underlying error, when there is one (none for a connect timeout).
        #[source]
        source: Option<Arc<tokio_postgres::Error>>,
    },
    /// A connection string or option was invalid.
    #[error("invalid saga log configuration: {detail}")]
    Config {
        /// Which setting and why.
        detail: String,
    },
    /// A log operation did not finish within its timeout.
    #[error("saga log operation timed out after {0:?}")]
    Timeout(Duration),
    /// The caller's lease on the saga is gone: another worker claimed it. The write
    /// was refused and nothing was changed.
    #[error("lease lost on saga {saga_id}: another worker has claimed it")]
    LeaseLost {
        /// The saga.
        saga_id: SagaId,
    },
    /// A saga with this id already exists.
    #[error("saga {0} already exists")]
    AlreadyExists(SagaId),
    /// An error reported by SQLite: which operation failed, and SQLite's
    /// message (the error itself is the [`source`](std::error::Error::source)).
    #[error("sqlite error while {operation}: {source}")]
    Sqlite {
        /// What the log was doing (`opening /data/sagas.db`, `appending to
        /// saga order-7 in /data/sagas.db`, ...).
        operation: String,
        /// What SQLite reported.
        #[source]
        source: Arc<rusqlite::Error>,
    },
    /// An error reported by Postgres or the connection to it.
    #[cfg(feature = "postgres")]
    #[error("postgres error: {0}")]
    Postgres(#[source] Arc<tokio_postgres::Error>),
    /// An I/O error: which operation failed, and the system's message.
    #[error("i/o error while {operation}: {source}")]
    Io {
        /// What the log was doing.
        operation: String,
        /// The system's error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The log's background writer has stopped (it panicked or was shut down).
    #[error("saga log writer has stopped")]
    Closed,
}

impl LogError {
    /// True when the write was refused because another worker holds the saga.
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, LogError::LeaseLost { .. })
    }

    /// True when the backend could not be reached (connect failure or timeout).
    pub fn is_unavailable(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            LogError::Connect { .. } => true,
            LogError::Timeout(_) => true,
            _ => false,
        }
    }
}

impl LogError {
    /// The error SQLite reported while `operation` ran: damage is
    /// [`Corrupt`](LogError::Corrupt), anything else [`Sqlite`](LogError::Sqlite).
    pub(crate) fn sqlite(operation: impl Into<String>, error: rusqlite::Error) -> Self {
        if let rusqlite::Error::SqliteFailure(failure, _) = &error {
            if matches!(
                failure.code,
                rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase
            ) {
                return LogError::Corrupt {
                    detail: format!("{}: {error}", operation.into()),
                };
            }
        }
        LogError::Sqlite {
            operation: operation.into(),
            source: Arc::new(error),
        }
    }

    /// The I/O error met while `operation` ran.
    pub(crate) fn io(operation: impl Into<String>, error: std::io::Error) -> Self {
        LogError::Io {
            operation: operation.into(),
            source: Arc::new(error),
        }
    }
}

#[cfg(feature = "postgres")]
impl From<tokio_postgres::Error> for LogError {
    fn from(error: tokio_postgres::Error) -> Self {
        LogError::Postgres(Arc::new(error))
    }
}

/// An error from the orchestrator.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SagaError {
    /// The saga log failed. The saga stays in the log as last committed and is
    /// continued as after a dropped [`start`](crate::Orchestrator::start)
    /// future: by the next [`recover`](crate::Orchestrator::recover) once its
    /// lease has expired (Postgres), or by a process that reopens the log
    /// (SQLite; this process's log keeps its lease).
    #[error(transparent)]
    Log(#[from] LogError),
    /// No saga with this name was registered with the orchestrator.
    #[error("saga `{name}` is not registered with this orchestrator")]
    NotRegistered {
        /// The saga name.
        name: String,
        /// The saga id, when the error concerns a logged saga.
        saga_id: Option<SagaId>,
    },
    /// The saga input could not be serialised when starting the saga.
    #[error("input of saga `{name}` cannot be serialised")]
    InputSerialize {
        /// The saga name.
        name: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// A logged saga's input no longer deserialises into the registered input type
    /// (for example after an incompatible change of the type). The saga stays in
    /// the log untouched apart from a `recovery_failed` transition.
    #[error("input of saga {saga_id} (`{name}`) cannot be deserialised")]
    InputDeserialize {
        /// The saga.
        saga_id: SagaId,
        /// The saga name.
        name: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// A logged saga's history does not fit its registered definition (for example
    /// the definition now has fewer steps).
    #[error("history of saga {saga_id} does not match its definition: {detail}")]
    History {
        /// The saga.
        saga_id: SagaId,
        /// What did not match.
        detail: String,
    },
    /// No saga with this id is in the log.
    #[error("saga {0} not found")]
    NotFound(SagaId),
    /// The saga is being driven by another worker whose lease has not expired.
    #[error("saga {0} is held by another worker")]
    Busy(SagaId),
    /// The saga id is not valid (it must be non-empty).
    #[error("invalid saga id: {0:?}")]
    InvalidId(String),
    /// The worker driving the saga shut down before it ended (its grace
    /// period was over): the saga stays in the log as last committed, and the
    /// worker handed its lease back for another worker to continue it.
    #[error("saga {0} was stopped by its worker's shutdown")]
    Halted(SagaId),
    /// A task driving a saga panicked or was cancelled.
    #[error("the task driving saga {saga_id} ended abnormally: {detail}")]
    Aborted {
        /// The saga.
        saga_id: SagaId,
        /// What happened.
        detail: String,
    },
}

impl SagaError {
    /// True when the error means another worker now owns the saga.
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, SagaError::Log(e) if e.is_lease_lost())
    }
}

/// An invalid saga or orchestrator definition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DefinitionError {
    /// A saga must have a non-empty name.
    #[error("saga name must not be empty")]
    EmptySagaName,
    /// A saga must have at least one step.
    #[error("saga `{0}` has no steps")]
    NoSteps(String),
    /// A parallel group must have at least one step.
    #[error("saga `{0}` has an empty parallel group")]
    EmptyGroup(String),
    /// Step names must be non-empty.
    #[error("saga `{0}` has a step with an empty name")]
    EmptyStepName(String),
    /// Step names must be unique within a saga.
    #[error("saga `{saga}` has two steps named `{step}`")]
    DuplicateStep {
        /// The saga.
        saga: String,
        /// The repeated step name.
        step: String,
    },
    /// Two sagas with the same name were registered.
    #[error("saga `{0}` is registered twice")]
    DuplicateSaga(String),
    /// The compensation retry is invalid (the rules of a seawall pipeline's
    /// retry) or has a budget, which compensations do not support.
    #[error("invalid compensation retry: {0}")]
    CompensationRetry(seawall::ConfigError),
}

/// An error reading an earlier step's output from a [`StepContext`](crate::StepContext).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutputError {
    /// No earlier step with this name has completed.
    #[error("no completed step named `{0}` before this one")]
    Missing(String),
    /// The output exists but does not deserialise into the requested type.
    #[error("output of step `{step}` cannot be deserialised")]
    Deserialize {
        /// The step.
        step: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
}

impl OutputError {
    /// Reads the output `value` of the step named `step` (if it completed)
    /// as a `T`.
    pub(crate) fn read<T: serde::de::DeserializeOwned>(
        step: &str,
        value: Option<&serde_json::Value>,
    ) -> Result<T, OutputError> {
        let value = value.ok_or_else(|| OutputError::Missing(step.to_owned()))?;
        T::deserialize(value).map_err(|source| OutputError::Deserialize {
            step: step.to_owned(),
            source,
        })
    }
}
