//! Durable sagas for seawall: ordered steps with compensations, whose state lives
//! in a log so that a restarted process finishes what a dead one started.
//!
//! A purchase reserves stock, charges a payment and schedules delivery. If
//! delivery fails, the payment is refunded and the stock released, in reverse
//! order, even if the process dies half-way. That is a [`Saga`]: a name and
//! ordered [`Step`]s, each an async action and a compensation. The
//! [`Orchestrator`] runs it against a [`SagaLog`]: [`SqliteLog`] (one file,
//! embedded, the default choice) or [`PostgresLog`] (feature `postgres`: many orchestrator processes
//! on one database, with leases), and [`Orchestrator::serve`] turns a process
//! into a worker that runs submitted sagas ([Workers](#workers)).
//!
//! # Example
//!
//! ```
//! use seawall_saga::{Orchestrator, Saga, SagaStatus, SqliteLog, Step, StepContext};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Purchase { sku: String, quantity: u32, cents: u64 }
//!
//! #[derive(Serialize, Deserialize)]
//! struct Charge { payment_id: String, cents: u64 }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let purchase = Saga::<Purchase>::builder("purchase")
//!     .step(
//!         Step::new("reserve_stock", |ctx: StepContext<Purchase>| async move {
//!             // the key is the same on every execution of this effect: pass it on
//!             let key = ctx.idempotency_key().to_string();
//!             Ok::<_, String>(format!("reservation for {}", ctx.input().sku))
//!         })
//!         .compensate(|_ctx, reservation: String| async move {
//!             // release the reservation
//!             Ok::<_, String>(())
//!         }),
//!     )
//!     .step(
//!         Step::new("charge", |ctx: StepContext<Purchase>| async move {
//!             let reservation: String = ctx.output("reserve_stock").map_err(|e| e.to_string())?;
//!             Ok::<_, String>(Charge { payment_id: "pay_1".into(), cents: ctx.input().cents })
//!         })
//!         .compensate(|_ctx, charge: Charge| async move {
//!             // refund charge.cents on charge.payment_id
//!             Ok::<_, String>(())
//!         }),
//!     )
//!     .step(Step::new("schedule_delivery", |_ctx: StepContext<Purchase>| async move {
//!         Err::<(), _>("no courier available")
//!     }))
//!     .build()?;
//!
//! # let path = std::env::temp_dir().join(format!("seawall-saga-doc-{}.db", std::process::id()));
//! let log = SqliteLog::open(&path)?;
//! let orchestrator = Orchestrator::builder(log).saga(&purchase).build()?;
//!
//! // On start-up: finish whatever a previous process left unfinished.
//! orchestrator.recover().await?;
//!
//! let order = Purchase { sku: "tea".into(), quantity: 2, cents: 1200 };
//! let outcome = orchestrator.start(&purchase, order).await?;
//! assert_eq!(outcome.status, SagaStatus::Compensated); // refunded, then released
//! assert_eq!(outcome.failure.unwrap().step.name, "schedule_delivery");
//! # drop(orchestrator);
//! # for suffix in ["", "-wal", "-shm"] {
//! #     let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
//! # }
//! # Ok(())
//! # }
//! # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(run()).unwrap();
//! ```
//!
//! # Features
//!
//! - `test-util`: `seawall::testing::VirtualClock` can be the orchestrator's
//!   clock (see [Testing](#testing)).
//! - `postgres` (off by default): the saga log on Postgres, `PostgresLog`,
//!   and the outbox on Postgres through tokio-postgres, `outbox::postgres`.
//! - `sqlx-sqlite`, `sqlx-postgres` (off by default): the outbox, the inbox
//!   and the relay on the caller's sqlx transaction or pool,
//!   `outbox::sqlx_sqlite` and `outbox::sqlx_postgres` (see [`outbox`]).
//!   They need sqlx 0.9, whose minimum Rust is 1.94.
//! - `redis-streams` (off by default): the choreography broker on Redis
//!   Streams, `broker::redis_streams::RedisStreams` (see [`outbox`]).
//! - `rabbitmq` (off by default): the choreography broker on RabbitMQ,
//!   `broker::rabbitmq::RabbitMq` (AMQP 0-9-1 through lapin, on tokio; plain
//!   `amqp://`, no TLS).
//!
//! # With sqlx
//!
//! A service on sqlx's SQLite driver can use this crate: cargo lets one
//! crate only link the SQLite library, and sqlx 0.9 accepts the
//! `libsqlite3-sys` of rusqlite 0.37, which [`SqliteLog`] and the SQLite
//! outbox use, so both share one SQLite. (sqlx 0.8 pins an older
//! `libsqlite3-sys` and cannot be in the same build.) A step that changes
//! the service's own database writes the change and its outbox event in one
//! sqlx transaction with `outbox::sqlx_sqlite::enqueue` (or
//! `outbox::sqlx_postgres::enqueue`); the saga log itself keeps its own file
//! (or schema) and connections.
//!
//! [`Step::through`] runs a step's action through a `seawall::Pipeline`
//! (retry, circuit breaker, timeout, ...).
//!
//! # Execution
//!
//! Steps run in order; a [`Parallel`] group ([`SagaBuilder::parallel`]) runs
//! its steps concurrently and the saga goes on when all of them completed.
//! When a step's action fails (after whatever retries the step does itself,
//! for example through a seawall pipeline), the other steps of its group are
//! awaited, not cancelled (an effect under way is then known, and compensated
//! if it completed), and the compensations of the completed steps run in
//! reverse order: stages last first, a group's own compensations concurrently
//! or last declared first ([`GroupCompensation`]). Each is retried under the
//! orchestrator's [compensation retry](OrchestratorBuilder::compensation_retry),
//! a `seawall::Retry` (see [`retry`] for why its attempts are logged rather
//! than run through a pipeline). A saga ends in one of three states:
//!
//! - [`SagaStatus::Completed`]: every step completed;
//! - [`SagaStatus::Compensated`]: a step failed (or the deadline passed) and
//!   every completed step was compensated, or abandoned when its compensation
//!   is [continue-on-error](Step::continue_on_error) and failed all its
//!   attempts ([`SagaOutcome::abandoned`]);
//! - [`SagaStatus::Stuck`]: a compensation failed all its attempts. The saga is
//!   never dropped: it is listed by `ListQuery::status(SagaStatus::Stuck)`, and
//!   [`Orchestrator::resume`] retries it once the cause is fixed. The other
//!   compensations of its group that were under way are awaited; no further
//!   one starts.
//!
//! A per-saga deadline ([`StartOptions::deadline`] or [`StartOptions::timeout`])
//! is checked before each stage starts: once it has passed, no further step
//! starts and the saga compensates. A step that is already running is not
//! cancelled (cancelling a half-done effect would leave it neither done nor
//! compensated); it can bound itself with [`StepContext::remaining`]. The same
//! holds across a crash: a step whose start is logged and whose end is not
//! runs again on recovery (with the same idempotency key), even once the
//! deadline has passed, so that an effect it took is known and compensated;
//! the deadline then stops the stages after it.
//!
//! # Durability: at-least-once with a stable key
//!
//! Every transition (saga started, step started, step completed with its
//! output, step failed, compensation started, failed, completed or abandoned,
//! saga finished)
//! is committed to the log *before* the next effect starts, and events are
//! emitted only after the commit. After a crash, [`Orchestrator::recover`] reads
//! the log and continues each unfinished saga forward or compensating. This
//! gives the following contract:
//!
//! - **a step whose completion is logged never runs again**, in any process;
//!   its output is read back from the log instead;
//! - **a step that was started but whose completion is not logged runs again**
//!   after a crash: the process may have died before, during or after the
//!   effect. The same holds for compensations. Each execution of the same
//!   action (or compensation) gets the same [`IdempotencyKey`]
//!   (`{saga_id}/{step_index}/{step_name}/{phase}`), stable across restarts, so
//!   the external system can recognise a repeat and apply the effect once.
//!
//! In short: effects run *at least once*; with the key, they take effect
//! *exactly once* when the called system deduplicates by it. A step's action
//! whose completion was logged, and a compensation whose completion was logged,
//! are never executed again.
//!
//! Dropping the future returned by [`Orchestrator::start`] is treated like a
//! crash: the running step is aborted and the saga stays in the log as last
//! committed. It is continued by the next [`Orchestrator::recover`] once its
//! lease has expired (Postgres) or by a process that reopens the log (SQLite).
//! A saga whose driving stopped on a log error ([`SagaError::Log`]) is
//! continued the same way.
//!
//! # Logs
//!
//! - [`SqliteLog`]: one file in WAL mode with `synchronous = FULL` (each commit
//!   fsyncs the WAL, so acknowledged transitions survive power loss; see
//!   [`Synchronous`]). Concurrent sagas share commits (group commit). Meant for
//!   one orchestrator process per file.
//! - [`PostgresLog`] (feature `postgres`): many orchestrator processes share one database. A worker
//!   claims a saga with a lease (`FOR UPDATE SKIP LOCKED`); a dead worker's
//!   sagas are taken over once the lease expires; every write is fenced by the
//!   lease token, so a worker that lost its lease cannot write further
//!   transitions. Concurrent sagas share commits here too: a few writer tasks
//!   each write what is queued in one statement, every saga's write still
//!   fenced on its own.
//!
//! Both implement the small [`SagaLog`] trait; the orchestrator holds it as a
//! trait object, nothing is generic over the backend.
//!
//! # Workers
//!
//! [`Orchestrator::start`] runs a saga in the caller's task.
//! [`Orchestrator::submit`] only logs it, for a worker to run: a process that
//! calls [`Orchestrator::serve`] runs as a worker until it is shut down. A
//! worker
//!
//! - claims submitted sagas, sagas whose worker died (once their lease has
//!   expired) and sagas handed back by a worker that shut down, so no process
//!   needs to call [`Orchestrator::recover`] itself;
//! - wakes when a saga is submitted: on Postgres, [`Orchestrator::submit`]
//!   sends a `NOTIFY` and every worker `LISTEN`s on a connection of its own;
//!   it also polls every [`ServeOptions::poll_interval`], which finds what a
//!   lost notification announced and the sagas of dead workers;
//! - drives at most [`ServeOptions::max_in_flight`] sagas at once;
//! - shuts down gracefully when the future it was given resolves: it claims
//!   nothing more, lets its sagas run for the [grace
//!   period](ServeOptions::grace), then stops the ones still running (as a
//!   crash would: a running step is aborted and runs again elsewhere, with the
//!   same idempotency key) and releases their leases, so another worker takes
//!   them over at once instead of after the lease expires.
//!
//! Every worker must register every saga definition it may find in the log: a
//! saga of an unknown name is reported as a failure (a `recovery_failed`
//! transition) and left for its lease to expire.
//!
//! On a [`SqliteLog`], `serve` works too, in the one process that owns the
//! file: it is woken by the submissions of its own orchestrator (the same
//! `Orchestrator` or a clone) and otherwise polls; there are no other workers
//! to notify or hand sagas to.
//!
//! ```no_run
//! use std::time::Duration;
//! use seawall_saga::{
//!     Orchestrator, PostgresLog, PostgresOptions, Saga, ServeOptions, StartOptions, Step,
//!     StepContext,
//! };
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let welcome = Saga::<String>::builder("welcome")
//!     .step(Step::new("send_mail", |ctx: StepContext<String>| async move {
//!         // send a mail to ctx.input(), deduplicated by ctx.idempotency_key()
//!         Ok::<_, String>(())
//!     }))
//!     .build()?;
//!
//! let log = PostgresLog::connect(
//!     "postgres://app@127.0.0.1:5432/app",
//!     PostgresOptions::new().lease(Duration::from_secs(10)),
//! )
//! .await?;
//! let orchestrator = Orchestrator::builder(log).saga(&welcome).build()?;
//!
//! // Anywhere (a request handler, another process): hand a saga to the workers.
//! let id = orchestrator
//!     .submit(&welcome, "ada@example.com".to_owned(), StartOptions::new())
//!     .await?;
//!
//! // In each worker process: serve until Ctrl-C (or SIGTERM, ...).
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! # drop(stop);
//! let report = orchestrator
//!     .serve(
//!         ServeOptions::new()
//!             .max_in_flight(16)
//!             .poll_interval(Duration::from_secs(2))
//!             .grace(Duration::from_secs(20)),
//!         async move {
//!             // e.g. tokio::signal::ctrl_c().await
//!             let _ = stopped.await;
//!         },
//!     )
//!     .await?;
//! println!("{} completed, {} handed back", report.completed, report.handed_back);
//! # Ok(())
//! # }
//! ```
//!
//! # Choreography: outbox, relay, broker, inbox
//!
//! Between services that do not share an orchestrator, [`outbox`] carries
//! events reliably: a service writes its state change and the event in one
//! local transaction ([`outbox::Outbox::enqueue`] on SQLite,
//! `outbox::postgres::enqueue` on Postgres, `outbox::sqlx_sqlite::enqueue`
//! and `outbox::sqlx_postgres::enqueue` on a sqlx transaction), an [`outbox::Relay`] publishes
//! the committed events to a [`broker::Broker`] (Redis Streams with the
//! feature `redis-streams`, RabbitMQ with the feature `rabbitmq`) in order per aggregate and at least once, and each
//! consumer records the message in the same local transaction as its effect
//! ([`outbox::Inbox::handle`]), so a redelivered message has no second effect.
//! Consumer groups share a stream's messages; the messages of a consumer that
//! died are claimed by another ([`broker::Broker::claim_stale`]; RabbitMQ
//! gives them back to the group by itself); a malformed
//! message is parked in a dead-letter stream ([`broker::dead_letter_stream`]).
//!
//! # Inspection and events
//!
//! [`Orchestrator::list`] lists sagas by status, [`Orchestrator::history`]
//! returns one saga's ordered transitions with timestamps.
//! [`OrchestratorBuilder::on_event`] registers a listener called with a
//! [`SagaEvent`] for every committed transition, and every transition is also
//! logged with `tracing` (target `seawall_saga`).
//!
//! # Errors and bad input
//!
//! Errors are `#[non_exhaustive]` enums: [`SagaError`], [`LogError`],
//! [`DefinitionError`], [`OutputError`]. A file that is not a SQLite database
//! ([`LogError::NotADatabase`]) or is someone else's database
//! ([`LogError::Foreign`]) is refused without being written; an unreachable
//! Postgres gives [`LogError::Connect`]; a logged input that no longer
//! deserialises is reported by [`Orchestrator::recover`] as
//! [`SagaError::InputDeserialize`] and the saga is left in the log (with a
//! `recovery_failed` transition), never deleted.
//!
//! # Testing
//!
//! With the feature `test-util`, inject a `seawall::testing::VirtualClock`
//! with [`OrchestratorBuilder::clock`]: deadlines, timestamps and compensation
//! backoff then follow virtual time (read as time since the Unix epoch), and
//! sleeps return at once. The orchestrator's clock is seawall's, plus a reading
//! of wall-clock time ([`WallClock`]); [`clock`] says why seawall's monotonic
//! clock alone cannot date a log that other processes read. Postgres leases use
//! the database clock; tests shorten the lease instead.
#![forbid(unsafe_code)]

pub mod broker;
pub mod clock;
pub mod definition;
pub mod error;
pub mod event;
pub mod id;
pub mod log;
pub mod orchestrator;
pub mod outbox;
pub mod retry;
pub mod transition;

pub use clock::WallClock;
pub use definition::{
    GroupCompensation, Parallel, Saga, SagaBuilder, SagaInput, Step, StepContext, StepOutput,
};
pub use error::{DefinitionError, LogError, OutputError, SagaError};
pub use event::SagaEvent;
pub use id::{IdempotencyKey, Phase, SagaId};
#[cfg(feature = "postgres")]
pub use log::postgres::{PostgresLog, PostgresOptions};
pub use log::sqlite::{SqliteLog, SqliteOptions, Synchronous};
pub use log::{ClaimAttempt, ClaimedSaga, Lease, ListQuery, NewSaga, SagaLog, SagaRecord, Wakeups};
pub use orchestrator::{
    Orchestrator, OrchestratorBuilder, RecoveryFailure, RecoveryReport, SagaOutcome, ServeOptions,
    ServeReport, StartOptions, StepFailure,
};
pub use transition::{SagaStatus, StepRef, Transition, TransitionRecord};
