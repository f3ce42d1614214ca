//! The orchestrator: starts, drives, recovers and resumes sagas.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinSet;

use seawall::{Random, Retry, SystemClock, SystemRandom};

use crate::clock::{log_precision, BoxFuture, WallClock};
use crate::definition::{GroupCompensation, Outputs, Saga, SagaDefinition, SagaInput, StepContext};
use crate::error::{DefinitionError, LogError, OutputError, SagaError};
use crate::event::{trace, Listener, Listeners, SagaEvent};
use crate::id::{IdempotencyKey, Phase, SagaId};
use crate::log::{ClaimAttempt, ClaimedSaga, Lease, ListQuery, NewSaga, SagaLog, SagaRecord};
use crate::transition::{Progress, SagaStatus, StepRef, Transition, TransitionRecord};

mod serve;

pub use serve::{ServeOptions, ServeReport};

/// Options for one saga instance.
///
/// # Default
///
/// A generated id, no deadline.
#[derive(Clone, Debug, Default)]
pub struct StartOptions {
    id: Option<SagaId>,
    deadline: Option<SystemTime>,
    timeout: Option<Duration>,
}

impl StartOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Use this id instead of a generated one (an order number, say). Starting
    /// twice with the same id fails with [`LogError::AlreadyExists`].
    pub fn id(mut self, id: impl Into<SagaId>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// No stage starts after this instant; if one would, the saga
    /// compensates. A step under way is not stopped, nor is one whose worker
    /// died during it: it runs again to learn how it ended (see the
    /// [crate docs](crate#execution)).
    pub fn deadline(mut self, deadline: SystemTime) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Deadline relative to the start (the orchestrator's clock); one past
    /// the clock's range sets none.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

/// Why a saga compensated, or which compensation left it stuck.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepFailure {
    /// The step.
    pub step: StepRef,
    /// The error message (or a description of the missed deadline).
    pub error: String,
    /// True when the saga's deadline passed before this step could start.
    pub deadline_exceeded: bool,
}

impl StepFailure {
    /// The saga's deadline passed before `step` could start.
    pub(crate) fn deadline(step: StepRef) -> Self {
        StepFailure {
            error: format!("saga deadline passed before step `{}` started", step.name),
            step,
            deadline_exceeded: true,
        }
    }
}

/// How a saga ended (or where it stopped, when stuck).
#[derive(Clone, Debug)]
pub struct SagaOutcome {
    /// The saga.
    pub id: SagaId,
    /// The saga's definition name.
    pub name: String,
    /// `Completed`, `Compensated` or `Stuck`.
    pub status: SagaStatus,
    /// The step failure (or missed deadline) that made it compensate.
    pub failure: Option<StepFailure>,
    /// The compensation that failed all its attempts, when `Stuck`.
    pub stuck: Option<StepFailure>,
    /// The [continue-on-error](crate::Step::continue_on_error) compensations
    /// that failed all their attempts and were given up.
    pub abandoned: Vec<StepFailure>,
    outputs: Vec<(Arc<str>, serde_json::Value)>,
}

impl SagaOutcome {
    /// The output of the completed step named `step`.
    ///
    /// # Errors
    ///
    /// [`OutputError::Missing`] when the step did not complete,
    /// [`OutputError::Deserialize`] when its output is not a `T`.
    pub fn output<T: DeserializeOwned>(&self, step: &str) -> Result<T, OutputError> {
        OutputError::read(step, self.output_json(step))
    }

    /// The output of the completed step named `step`, as JSON.
    pub fn output_json(&self, step: &str) -> Option<&serde_json::Value> {
        self.outputs
            .iter()
            .find(|(name, _)| &**name == step)
            .map(|(_, value)| value)
    }
}

/// The result of [`Orchestrator::recover`].
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct RecoveryReport {
    /// Sagas driven to an end (completed, compensated or stuck).
    pub outcomes: Vec<SagaOutcome>,
    /// Sagas that could not be continued; they stay in the log as they were.
    pub failures: Vec<RecoveryFailure>,
}

/// A saga that [`Orchestrator::recover`] could not continue.
#[derive(Debug)]
#[non_exhaustive]
pub struct RecoveryFailure {
    /// The saga.
    pub saga_id: SagaId,
    /// Why.
    pub error: SagaError,
}

/// Drives one claimed saga; implemented by every registered definition.
trait Driver: Send + Sync {
    fn drive(
        &self,
        orchestrator: Arc<Inner>,
        claimed: ClaimedSaga,
        operator: bool,
        halt: Halt,
    ) -> BoxFuture<'static, Result<SagaOutcome, SagaError>>;

    fn finished_outcome(
        &self,
        record: &SagaRecord,
        history: &[TransitionRecord],
    ) -> Result<SagaOutcome, SagaError>;
}

impl<I: SagaInput> Driver for Saga<I> {
    fn drive(
        &self,
        orchestrator: Arc<Inner>,
        claimed: ClaimedSaga,
        operator: bool,
        halt: Halt,
    ) -> BoxFuture<'static, Result<SagaOutcome, SagaError>> {
        let definition = self.inner.clone();
        Box::pin(
            async move { Run::resume(definition, orchestrator, claimed, operator, halt).await },
        )
    }

    fn finished_outcome(
        &self,
        record: &SagaRecord,
        history: &[TransitionRecord],
    ) -> Result<SagaOutcome, SagaError> {
        let progress = Progress::replay(history, self.inner.layout.clone()).map_err(|detail| {
            SagaError::History {
                saga_id: record.id.clone(),
                detail,
            }
        })?;
        Ok(outcome(&progress, &record.id, &self.inner))
    }
}

/// Runs sagas against a [`SagaLog`]. Cheap to clone; clones share everything.
///
/// See the [crate docs](crate) for the execution model and its guarantees.
#[derive(Clone)]
pub struct Orchestrator {
    inner: Arc<Inner>,
}

struct Inner {
    log: Arc<dyn SagaLog>,
    sagas: HashMap<String, Arc<dyn Driver>>,
    retry: Retry,
    random: Arc<dyn Random>,
    clock: Arc<dyn WallClock>,
    listeners: Listeners,
    concurrency: usize,
    leases: LeaseKeeper,
    /// Counts the sagas submitted through this orchestrator, so that its own
    /// serving workers wake at once (on every log, with or without `NOTIFY`).
    submitted: watch::Sender<u64>,
}

/// The leases this orchestrator holds while it drives sagas. On logs whose
/// leases expire, one background task renews all of them in one call every
/// [`SagaLog::lease_renewal_interval`], so a slow step keeps its saga; a lease
/// stops being renewed as soon as its saga is no longer driven (finished,
/// failed, or its future dropped).
#[derive(Default)]
struct LeaseKeeper {
    active: Mutex<HashMap<SagaId, Lease>>,
    started: AtomicBool,
}

/// Removes its lease from the keeper when the driver ends or is dropped.
struct LeaseGuard {
    inner: Weak<Inner>,
    id: SagaId,
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.upgrade() {
            inner
                .leases
                .active
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&self.id);
        }
    }
}

impl Inner {
    /// Keeps `lease` renewed until the returned guard is dropped.
    fn hold(self: &Arc<Self>, lease: &Lease) -> Option<LeaseGuard> {
        let every = self.log.lease_renewal_interval()?;
        self.leases
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(lease.saga_id().clone(), lease.clone());
        if !self.leases.started.swap(true, Ordering::SeqCst) {
            tokio::spawn(keep_leases(Arc::downgrade(self), every));
        }
        Some(LeaseGuard {
            inner: Arc::downgrade(self),
            id: lease.saga_id().clone(),
        })
    }
}

async fn keep_leases(inner: Weak<Inner>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let leases: Vec<Lease> = inner
            .leases
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        if leases.is_empty() {
            continue;
        }
        match inner.log.renew_many(&leases).await {
            Ok(renewed) if renewed < leases.len() => tracing::warn!(
                target: "seawall_saga", held = leases.len(), renewed,
                "some leases could not be renewed: another worker took their sagas"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(target: "seawall_saga", error = %e, "lease renewal failed"),
        }
    }
}

impl fmt::Debug for Orchestrator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<_> = self.inner.sagas.keys().collect();
        names.sort();
        f.debug_struct("Orchestrator")
            .field("log", &self.inner.log)
            .field("sagas", &names)
            .field("compensation_retry", &self.inner.retry)
            .field("random", &self.inner.random)
            .field("clock", &self.inner.clock)
            .field("listeners", &self.inner.listeners)
            .field("recovery_concurrency", &self.inner.concurrency)
            .finish()
    }
}

/// Builds an [`Orchestrator`].
///
/// # Default
///
/// Compensations retried exponentially from 100 ms, doubling, capped at
/// 60 s, 5 attempts in all, without jitter; the [`SystemClock`] and the
/// [`SystemRandom`] source; no
/// listener, recovery of up to 32 sagas at a time.
pub struct OrchestratorBuilder {
    log: Arc<dyn SagaLog>,
    sagas: Vec<(String, Arc<dyn Driver>)>,
    retry: Retry,
    random: Arc<dyn Random>,
    clock: Arc<dyn WallClock>,
    listeners: Vec<Listener>,
    concurrency: usize,
}

impl fmt::Debug for OrchestratorBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OrchestratorBuilder")
            .field("log", &self.log)
            .field(
                "sagas",
                &self.sagas.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field("compensation_retry", &self.retry)
            .finish()
    }
}

impl OrchestratorBuilder {
    /// Registers a saga definition, so its instances can be started and recovered.
    pub fn saga<I: SagaInput>(mut self, saga: &Saga<I>) -> Self {
        self.sagas
            .push((saga.name().to_owned(), Arc::new(saga.clone())));
        self
    }

    /// How a failing compensation is retried: a seawall [`Retry`] (attempts,
    /// backoff, jitter), each attempt logged; see [`retry`](crate::retry).
    /// Checked by [`build`](Self::build).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use seawall::{Jitter, Retry};
    /// use seawall_saga::{Orchestrator, SqliteLog};
    ///
    /// # let dir = std::env::temp_dir().join(format!("seawall-saga-retry-doc-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// let orchestrator = Orchestrator::builder(SqliteLog::open(dir.join("sagas.db"))?)
    ///     .compensation_retry(
    ///         Retry::exponential(Duration::from_secs(1))
    ///             .cap(Duration::from_secs(60))
    ///             .jitter(Jitter::Equal)
    ///             .max_attempts(8),
    ///     )
    ///     .build()?;
    /// # drop(orchestrator);
    /// # let _ = std::fs::remove_dir_all(&dir);
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    pub fn compensation_retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// The random source of the compensation retry's jitter.
    pub fn random(mut self, random: impl Random) -> Self {
        self.random = Arc::new(random);
        self
    }

    /// The clock used for deadlines, timestamps and retry backoff: a
    /// [`seawall::Clock`] that tells wall-clock time ([`WallClock`]), such as
    /// `seawall::testing::VirtualClock` in tests.
    pub fn clock(mut self, clock: impl WallClock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Adds a listener called with every committed transition.
    pub fn on_event(mut self, listener: impl Fn(&SagaEvent) + Send + Sync + 'static) -> Self {
        self.listeners.push(Arc::new(listener));
        self
    }

    /// How many sagas [`Orchestrator::recover`] drives at the same time (at least 1).
    pub fn recovery_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// Builds the orchestrator.
    ///
    /// # Errors
    ///
    /// [`DefinitionError::DuplicateSaga`] when two sagas share a name,
    /// [`DefinitionError::CompensationRetry`] for an invalid compensation retry.
    pub fn build(self) -> Result<Orchestrator, DefinitionError> {
        crate::retry::validate(&self.retry).map_err(DefinitionError::CompensationRetry)?;
        let mut sagas = HashMap::new();
        for (name, driver) in self.sagas {
            if sagas.insert(name.clone(), driver).is_some() {
                return Err(DefinitionError::DuplicateSaga(name));
            }
        }
        Ok(Orchestrator {
            inner: Arc::new(Inner {
                log: self.log,
                sagas,
                retry: self.retry,
                random: self.random,
                clock: self.clock,
                listeners: Listeners(self.listeners),
                concurrency: self.concurrency,
                leases: LeaseKeeper::default(),
                submitted: watch::Sender::new(0),
            }),
        })
    }
}

impl Orchestrator {
    /// Starts building an orchestrator over `log`.
    pub fn builder(log: impl SagaLog) -> OrchestratorBuilder {
        OrchestratorBuilder {
            log: Arc::new(log),
            sagas: Vec::new(),
            retry: crate::retry::default_compensation_retry(),
            random: Arc::new(SystemRandom),
            clock: Arc::new(SystemClock),
            listeners: Vec::new(),
            concurrency: 32,
        }
    }

    /// The log this orchestrator writes to.
    pub fn log(&self) -> &Arc<dyn SagaLog> {
        &self.inner.log
    }

    /// Starts a saga with a generated id and drives it to its end.
    ///
    /// # Errors
    ///
    /// See [`start_with`](Self::start_with).
    pub async fn start<I: SagaInput>(
        &self,
        saga: &Saga<I>,
        input: I,
    ) -> Result<SagaOutcome, SagaError> {
        self.start_with(saga, input, StartOptions::new()).await
    }

    /// Starts a saga and drives it to its end: `Completed`, `Compensated` or
    /// `Stuck` are all `Ok` outcomes.
    ///
    /// If the returned future is dropped half-way, the saga stays in the log as
    /// last committed and [`recover`](Self::recover) continues it.
    ///
    /// # Errors
    ///
    /// [`SagaError::NotRegistered`] if the saga was not registered,
    /// [`SagaError::InputSerialize`], [`SagaError::Log`] (including
    /// [`LogError::AlreadyExists`] for a reused id, and
    /// [`LogError::LeaseLost`] if another worker took the saga over).
    pub async fn start_with<I: SagaInput>(
        &self,
        saga: &Saga<I>,
        input: I,
        options: StartOptions,
    ) -> Result<SagaOutcome, SagaError> {
        let new = self.new_saga(saga, &input, options)?;
        let run = Run::fresh(saga.inner.clone(), self.inner.clone(), new, Arc::new(input))?;
        run.drive().await
    }

    /// Logs a saga without running it, for a worker to run: it is announced to
    /// the [serving](Self::serve) workers (Postgres: `NOTIFY`; this
    /// orchestrator's own workers on any log), and any worker's
    /// [`serve`](Self::serve) or [`recover`](Self::recover) picks it up.
    /// Returns its id once it is durably logged.
    ///
    /// # Errors
    ///
    /// As [`start_with`](Self::start_with). A failed announcement is not an
    /// error (the saga is logged; polling workers find it): it is traced.
    pub async fn submit<I: SagaInput>(
        &self,
        saga: &Saga<I>,
        input: I,
        options: StartOptions,
    ) -> Result<SagaId, SagaError> {
        let new = self.new_saga(saga, &input, options)?;
        let at = new.created_at;
        self.inner
            .log
            .create(&new, &[Transition::SagaStarted], false)
            .await?;
        self.inner.emit(
            &new.id,
            saga.name(),
            0,
            at,
            SagaStatus::Running,
            &Transition::SagaStarted,
        );
        self.inner.submitted.send_modify(|n| *n = n.wrapping_add(1));
        if let Err(e) = self.inner.log.announce(&new.id).await {
            tracing::warn!(
                target: "seawall_saga", saga_id = %new.id, error = %e,
                "could not announce a submitted saga; polling workers will find it"
            );
        }
        Ok(new.id)
    }

    fn new_saga<I: SagaInput>(
        &self,
        saga: &Saga<I>,
        input: &I,
        options: StartOptions,
    ) -> Result<NewSaga, SagaError> {
        if !self.inner.sagas.contains_key(saga.name()) {
            return Err(SagaError::NotRegistered {
                name: saga.name().to_owned(),
                saga_id: None,
            });
        }
        let id = options.id.unwrap_or_else(SagaId::generate);
        if id.as_str().is_empty() {
            return Err(SagaError::InvalidId(id.as_str().to_owned()));
        }
        let input = serde_json::to_string(input).map_err(|source| SagaError::InputSerialize {
            name: saga.name().to_owned(),
            source,
        })?;
        let created_at = self.inner.now();
        // A timeout past the clock's range sets no deadline.
        let timed_out_at = options.timeout.and_then(|t| created_at.checked_add(t));
        let deadline = match (options.deadline, timed_out_at) {
            (Some(d), Some(t)) => Some(d.min(t)),
            (d, t) => d.or(t),
        }
        .map(log_precision);
        Ok(NewSaga {
            id,
            name: saga.name().to_owned(),
            input,
            deadline,
            created_at,
        })
    }

    /// Continues every running or compensating saga that no live worker holds:
    /// forward from the first step whose completion is not logged, or
    /// compensating from the last completed step not yet compensated. Call it at
    /// start-up, or let [`serve`](Self::serve) do it (it also polls).
    ///
    /// Sagas that cannot be continued (unknown name, input that no longer
    /// deserialises, history that does not fit the definition) are reported in
    /// [`RecoveryReport::failures`], get a `recovery_failed` transition, and stay
    /// in the log for an operator; they are not retried by this instance until
    /// their lease expires (Postgres) or the log is reopened (SQLite).
    ///
    /// # Errors
    ///
    /// Only when claiming fails ([`SagaError::Log`]); errors of single sagas are
    /// in the report.
    pub async fn recover(&self) -> Result<RecoveryReport, SagaError> {
        let mut report = RecoveryReport::default();
        let mut tasks = JoinSet::new();
        let mut ids = HashMap::new();
        let mut cursor: Option<SagaId> = None;
        let mut exhausted = false;
        let concurrency = self.inner.concurrency;
        loop {
            if !exhausted && tasks.len() <= concurrency / 2 {
                let want = concurrency - tasks.len();
                let batch = match self.inner.log.claim_unfinished(cursor.as_ref(), want).await {
                    Ok(batch) => batch,
                    Err(e) => {
                        while let Some(joined) = tasks.join_next_with_id().await {
                            Self::record(&mut report, &mut ids, joined);
                        }
                        return Err(e.into());
                    }
                };
                exhausted = batch.len() < want;
                if let Some(last) = batch.last() {
                    cursor = Some(last.record.id.clone());
                }
                for claimed in batch {
                    let id = claimed.record.id.clone();
                    let inner = self.inner.clone();
                    let handle = tasks.spawn(async move {
                        Inner::drive_claimed(inner, claimed, false, Halt::never()).await
                    });
                    ids.insert(handle.id(), id);
                }
            }
            match tasks.join_next_with_id().await {
                Some(joined) => Self::record(&mut report, &mut ids, joined),
                None if exhausted => break,
                None => {}
            }
        }
        Ok(report)
    }

    fn record(
        report: &mut RecoveryReport,
        ids: &mut HashMap<tokio::task::Id, SagaId>,
        joined: Result<(tokio::task::Id, Result<SagaOutcome, SagaError>), tokio::task::JoinError>,
    ) {
        match joined {
            Ok((task, Ok(outcome))) => {
                ids.remove(&task);
                report.outcomes.push(outcome);
            }
            Ok((task, Err(error))) => {
                let saga_id = ids.remove(&task).unwrap_or_else(|| SagaId::new("?"));
                report.failures.push(RecoveryFailure { saga_id, error });
            }
            Err(join) => {
                let saga_id = ids.remove(&join.id()).unwrap_or_else(|| SagaId::new("?"));
                report.failures.push(RecoveryFailure {
                    error: SagaError::Aborted {
                        saga_id: saga_id.clone(),
                        detail: join.to_string(),
                    },
                    saga_id,
                });
            }
        }
    }

    /// Operator call: continues one saga. A `Stuck` saga gets its compensation
    /// attempts back and compensates again; a running or compensating saga whose
    /// worker is gone is continued; a finished saga's outcome is returned as is.
    ///
    /// # Errors
    ///
    /// [`SagaError::NotFound`], [`SagaError::Busy`] when a live worker holds it,
    /// [`SagaError::NotRegistered`], and the errors of driving it.
    pub async fn resume(&self, id: &SagaId) -> Result<SagaOutcome, SagaError> {
        match self.inner.log.claim(id).await? {
            ClaimAttempt::Claimed(claimed) => {
                Inner::drive_claimed(self.inner.clone(), claimed, true, Halt::never()).await
            }
            ClaimAttempt::Finished(record) => {
                let driver = self.inner.driver(&record)?;
                let history = self.inner.log.history(id).await?;
                driver.finished_outcome(&record, &history)
            }
            ClaimAttempt::Held(_) => Err(SagaError::Busy(id.clone())),
            ClaimAttempt::NotFound => Err(SagaError::NotFound(id.clone())),
        }
    }

    /// Sagas matching `query` (for example `ListQuery::status(SagaStatus::Stuck)`).
    ///
    /// # Errors
    ///
    /// [`SagaError::Log`].
    pub async fn list(&self, query: &ListQuery) -> Result<Vec<SagaRecord>, SagaError> {
        Ok(self.inner.log.list(query).await?)
    }

    /// One saga's row, if it exists.
    ///
    /// # Errors
    ///
    /// [`SagaError::Log`].
    pub async fn get(&self, id: &SagaId) -> Result<Option<SagaRecord>, SagaError> {
        Ok(self.inner.log.get(id).await?)
    }

    /// One saga's transitions, in order, with their timestamps.
    ///
    /// # Errors
    ///
    /// [`SagaError::NotFound`], [`SagaError::Log`].
    pub async fn history(&self, id: &SagaId) -> Result<Vec<TransitionRecord>, SagaError> {
        let history = self.inner.log.history(id).await?;
        if history.is_empty() && self.inner.log.get(id).await?.is_none() {
            return Err(SagaError::NotFound(id.clone()));
        }
        Ok(history)
    }
}

impl Inner {
    /// The current wall-clock time, as the log keeps it.
    fn now(&self) -> SystemTime {
        log_precision(self.clock.wall_time())
    }

    fn driver(&self, record: &SagaRecord) -> Result<Arc<dyn Driver>, SagaError> {
        self.sagas
            .get(&record.name)
            .cloned()
            .ok_or_else(|| SagaError::NotRegistered {
                name: record.name.clone(),
                saga_id: Some(record.id.clone()),
            })
    }

    async fn drive_claimed(
        inner: Arc<Inner>,
        claimed: ClaimedSaga,
        operator: bool,
        halt: Halt,
    ) -> Result<SagaOutcome, SagaError> {
        match inner.driver(&claimed.record) {
            Ok(driver) => driver.drive(inner.clone(), claimed, operator, halt).await,
            Err(error) => Err(inner.recovery_failed(&claimed, error).await),
        }
    }

    /// Records that `claimed` could not be continued; keeps the saga as it is.
    async fn recovery_failed(&self, claimed: &ClaimedSaga, error: SagaError) -> SagaError {
        let message = error_chain(&error);
        let transition = Transition::RecoveryFailed { error: message };
        let Ok(history) = &claimed.history else {
            // The history cannot be read, so the next sequence number is unknown:
            // report only, write nothing.
            return error;
        };
        let seq = history.last().map(|t| t.seq + 1).unwrap_or(0);
        let at = self.now();
        let status = claimed.record.status;
        match self
            .log
            .append(
                &claimed.lease,
                seq,
                std::slice::from_ref(&transition),
                status,
                at,
            )
            .await
        {
            Ok(()) => self.emit(
                &claimed.record.id,
                &claimed.record.name,
                seq,
                at,
                status,
                &transition,
            ),
            Err(log_error) => tracing::warn!(
                target: "seawall_saga", saga_id = %claimed.record.id, error = %log_error,
                "could not record a recovery failure"
            ),
        }
        error
    }

    fn emit(
        &self,
        id: &SagaId,
        name: &str,
        seq: u32,
        at: SystemTime,
        status: SagaStatus,
        transition: &Transition,
    ) {
        trace(id, name, seq, status, transition);
        if !self.listeners.0.is_empty() {
            let event = SagaEvent {
                saga_id: id.clone(),
                saga_name: name.into(),
                seq,
                at,
                status,
                transition: transition.clone(),
            };
            for listener in &self.listeners.0 {
                listener(&event);
            }
        }
    }
}

/// An error message with its sources, `a: b: c`.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    message
}

/// The outcome of a saga in the state `progress`.
fn outcome<I>(progress: &Progress, id: &SagaId, definition: &SagaDefinition<I>) -> SagaOutcome {
    SagaOutcome {
        id: id.clone(),
        name: definition.name.to_string(),
        status: progress.status(),
        failure: progress.failure().cloned(),
        stuck: progress.stuck().cloned(),
        abandoned: progress.abandoned().to_vec(),
        outputs: definition
            .step_names
            .iter()
            .enumerate()
            .filter_map(|(index, name)| Some((name.clone(), progress.output(index)?.clone())))
            .collect(),
    }
}

fn panic_message(error: tokio::task::JoinError) -> String {
    if error.is_panic() {
        let payload = error.into_panic();
        let text = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "non-string panic payload".into());
        format!("panicked: {text}")
    } else {
        "cancelled".into()
    }
}

/// One saga being driven by this worker.
struct Run<I> {
    definition: Arc<SagaDefinition<I>>,
    orchestrator: Arc<Inner>,
    id: SagaId,
    input: Arc<I>,
    deadline: Option<SystemTime>,
    lease: Option<Lease>,
    halt: Halt,
    _renewal: Option<LeaseGuard>,
    unsaved: Option<NewSaga>,
    /// The transitions recorded and not yet committed, each with the
    /// status it leads to (what its event reports).
    pending: Vec<(Transition, SagaStatus)>,
    progress: Progress,
}

impl<I: SagaInput> Run<I> {
    /// A new saga, its start recorded but not yet committed.
    fn fresh(
        definition: Arc<SagaDefinition<I>>,
        orchestrator: Arc<Inner>,
        new: NewSaga,
        input: Arc<I>,
    ) -> Result<Self, SagaError> {
        let layout = definition.layout.clone();
        let mut run = Run {
            definition,
            orchestrator,
            id: new.id.clone(),
            input,
            deadline: new.deadline,
            lease: None,
            halt: Halt::never(),
            _renewal: None,
            unsaved: Some(new),
            pending: Vec::new(),
            progress: Progress::new(layout),
        };
        run.record(Transition::SagaStarted)?;
        Ok(run)
    }

    async fn resume(
        definition: Arc<SagaDefinition<I>>,
        orchestrator: Arc<Inner>,
        claimed: ClaimedSaga,
        operator: bool,
        halt: Halt,
    ) -> Result<SagaOutcome, SagaError> {
        let record = &claimed.record;
        let input: I = match serde_json::from_str(&record.input) {
            Ok(input) => input,
            Err(source) => {
                let error = SagaError::InputDeserialize {
                    saga_id: record.id.clone(),
                    name: record.name.clone(),
                    source,
                };
                return Err(orchestrator.recovery_failed(&claimed, error).await);
            }
        };
        let history = match &claimed.history {
            Ok(history) => history,
            Err(e) => {
                let error = SagaError::Log(e.clone());
                return Err(orchestrator.recovery_failed(&claimed, error).await);
            }
        };
        let progress = match Progress::replay(history, definition.layout.clone()) {
            Ok(progress) => progress,
            Err(detail) => {
                let error = SagaError::History {
                    saga_id: record.id.clone(),
                    detail,
                };
                return Err(orchestrator.recovery_failed(&claimed, error).await);
            }
        };
        let mut run = Run {
            id: record.id.clone(),
            deadline: record.deadline,
            _renewal: orchestrator.hold(&claimed.lease),
            definition,
            orchestrator: orchestrator.clone(),
            input: Arc::new(input),
            lease: Some(claimed.lease.clone()),
            halt,
            unsaved: None,
            pending: Vec::new(),
            progress,
        };
        run.record(Transition::Claimed {
            owner: orchestrator.log.owner().to_owned(),
        })?;
        if operator && run.progress.status() == SagaStatus::Stuck {
            run.record(Transition::OperatorResumed)?;
        }
        run.drive().await
    }

    async fn drive(mut self) -> Result<SagaOutcome, SagaError> {
        if self.progress.status() == SagaStatus::Running {
            self.forward().await?;
        }
        if self.progress.status() == SagaStatus::Compensating {
            self.compensate().await?;
        }
        if !self.pending.is_empty() {
            // Claimed but already finished (cannot normally happen): record the claim.
            self.commit().await?;
        }
        Ok(outcome(&self.progress, &self.id, &self.definition))
    }

    /// Applies `transition` to the saga's state and queues it for the next
    /// commit. A transition the state refuses is a defect of the orchestrator:
    /// it is reported, never written.
    fn record(&mut self, transition: Transition) -> Result<(), SagaError> {
        self.progress
            .apply(&transition)
            .map_err(|detail| SagaError::History {
                saga_id: self.id.clone(),
                detail,
            })?;
        self.pending.push((transition, self.progress.status()));
        Ok(())
    }

    /// Commits the pending transitions, with the status they lead to.
    async fn commit(&mut self) -> Result<(), SagaError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let (transitions, statuses): (Vec<Transition>, Vec<SagaStatus>) =
            std::mem::take(&mut self.pending).into_iter().unzip();
        let status = self.progress.status();
        let log = &self.orchestrator.log;
        let at = self.orchestrator.now();
        let first_seq = self.progress.applied() - transitions.len() as u32;
        // The instant the log keeps for each transition, which its event
        // tells: a new saga's are written at its creation.
        let mut created = 0;
        let mut created_at = at;
        if let Some(new) = self.unsaved.take() {
            created_at = new.created_at;
            if status == SagaStatus::Running {
                created = transitions.len();
                self.lease = log.create(&new, &transitions, true).await?;
                self._renewal = self.lease.as_ref().and_then(|l| self.orchestrator.hold(l));
            } else {
                // A saga that ends before any step (deadline already passed):
                // create it running, then append the rest.
                created = 1;
                self.lease = log.create(&new, &transitions[..1], true).await?;
                let lease = self.lease.as_ref().ok_or(LogError::Closed)?;
                log.append(lease, first_seq + 1, &transitions[1..], status, at)
                    .await?;
            }
        } else {
            let lease = self.lease.as_ref().ok_or(LogError::Closed)?;
            log.append(lease, first_seq, &transitions, status, at)
                .await?;
        }
        // Each event tells the status its own transition led to, not the
        // status at the end of the commit.
        for (offset, (transition, status)) in transitions.iter().zip(statuses).enumerate() {
            self.orchestrator.emit(
                &self.id,
                &self.definition.name,
                first_seq + offset as u32,
                if offset < created { created_at } else { at },
                status,
                transition,
            );
        }
        Ok(())
    }

    fn context(&self, index: usize, phase: Phase, attempt: u32) -> StepContext<I> {
        let step_name = self.definition.step_names[index].clone();
        // The outputs of the stages before this step's (all completed).
        let before = self
            .definition
            .stages
            .iter()
            .find(|stage| stage.steps.contains(&index))
            .map_or(index, |stage| stage.steps.start);
        StepContext {
            key: IdempotencyKey::new(&self.id, index, &step_name, phase),
            saga_id: self.id.clone(),
            saga_name: self.definition.name.clone(),
            step_index: index,
            step_name,
            phase,
            attempt,
            input: self.input.clone(),
            outputs: Outputs {
                names: self.definition.step_names[..before].into(),
                values: (0..before)
                    .map(|i| self.progress.output(i).cloned().unwrap_or_default())
                    .collect(),
            },
            deadline: self.deadline,
            clock: self.orchestrator.clock.clone(),
        }
    }

    /// Stops here when the worker's shutdown asked its sagas to stop.
    async fn check_halt(&mut self) -> Result<(), SagaError> {
        if self.halt.is_set() {
            return self.halted().await;
        }
        Ok(())
    }

    /// Commits what was recorded (so the next worker does not run it again)
    /// and stops with [`SagaError::Halted`].
    async fn halted<T>(&mut self) -> Result<T, SagaError> {
        self.commit().await?;
        Err(SagaError::Halted(self.id.clone()))
    }

    /// The next task of `tasks` to end, or [`halted`](Self::halted) when the
    /// worker's shutdown asks this saga to stop.
    async fn next_end(&mut self, tasks: &mut Tasks) -> Result<Option<(usize, Done)>, SagaError> {
        match tasks.next(&self.halt).await {
            Ok(next) => Ok(next),
            Err(Halted) => self.halted().await,
        }
    }

    fn step_ref(&self, index: usize) -> StepRef {
        StepRef::new(index, &*self.definition.step_names[index])
    }

    /// Runs the stages from the first one not completed, until every step
    /// completed or a stage failed (the saga is then compensating, uncommitted).
    ///
    /// A stage's steps start together (their starts in one commit) and run as
    /// tasks; each end is recorded as it comes, and committed at once while
    /// other steps of the stage still run (the last one goes with the next
    /// commit). A failure does not cancel the others: they are awaited.
    async fn forward(&mut self) -> Result<(), SagaError> {
        while let Some(stage) = self.progress.current_stage() {
            self.check_halt().await?;
            let steps = self.definition.stages[stage].steps.clone();
            let failed = self.progress.failure().is_some();
            let first_open = steps.clone().find(|&i| self.progress.output(i).is_none());
            // The deadline is checked before a stage starts. A stage that had
            // started when its worker died (a step's start logged, its end
            // not) is under way: its steps run again, to learn how they ended,
            // as they would have ended had the worker lived.
            let under_way = steps.clone().any(|i| self.progress.is_running(i));
            if let (false, false, Some(deadline), Some(first)) =
                (failed, under_way, self.deadline, first_open)
            {
                // A stage that starts at the deadline is on time (as a
                // result at a seawall deadline is); one after it is not.
                if self.orchestrator.clock.wall_time() > deadline {
                    let step = self.step_ref(first);
                    return self.record(Transition::DeadlineExceeded { step });
                }
            }
            // After a failure (logged before a crash), only the steps still
            // running start again, to learn how they ended.
            let run: Vec<usize> = steps
                .filter(|&i| {
                    self.progress.output(i).is_none() && (!failed || self.progress.is_running(i))
                })
                .collect();
            for &index in &run {
                self.record(Transition::StepStarted {
                    step: self.step_ref(index),
                })?;
            }
            self.commit().await?;
            let mut tasks = Tasks::default();
            for &index in &run {
                let action =
                    (self.definition.steps[index].action)(self.context(index, Phase::Action, 1));
                tasks.spawn(index, Work::Action(action));
            }
            while let Some((index, done)) = self.next_end(&mut tasks).await? {
                let step = self.step_ref(index);
                match done {
                    Done::Action(Ok(output)) => {
                        self.record(Transition::StepCompleted { step, output })?
                    }
                    Done::Action(Err(error)) => {
                        self.record(Transition::StepFailed { step, error })?
                    }
                    Done::Compensation(_) | Done::Backoff => {}
                }
                if !tasks.is_empty() {
                    self.commit().await?;
                }
            }
            if self.progress.status() != SagaStatus::Running {
                return Ok(());
            }
        }
        self.record(Transition::SagaCompleted)?;
        self.commit().await
    }

    /// Compensates the completed steps, stages in reverse order, a group's
    /// steps concurrently or last first, until all are compensated (or
    /// abandoned) or one failed all its attempts (stuck).
    async fn compensate(&mut self) -> Result<(), SagaError> {
        let definition = self.definition.clone();
        for stage in definition.stages.iter().rev() {
            let open: Vec<usize> = stage
                .steps
                .clone()
                .rev()
                .filter(|&i| {
                    self.progress.output(i).is_some()
                        && !self.progress.is_settled(i)
                        && definition.steps[i].compensation.is_some()
                })
                .collect();
            match stage.compensation {
                GroupCompensation::Concurrent => self.compensate_steps(&open).await?,
                GroupCompensation::ReverseOrder => {
                    for &index in &open {
                        self.compensate_steps(&[index]).await?;
                        if self.progress.status() == SagaStatus::Stuck {
                            break;
                        }
                    }
                }
            }
            if self.progress.status() == SagaStatus::Stuck {
                return Ok(());
            }
        }
        self.record(Transition::SagaCompensated)?;
        self.commit().await
    }

    /// Compensates `steps` concurrently, each retried under the compensation
    /// retry, every attempt's start committed before it runs. When one that
    /// is not continue-on-error fails all its attempts, the attempts under
    /// way are awaited, no new one starts, and the saga is stuck (committed).
    async fn compensate_steps(&mut self, steps: &[usize]) -> Result<(), SagaError> {
        if steps.is_empty() {
            return Ok(());
        }
        self.check_halt().await?;
        let orchestrator = self.orchestrator.clone();
        let retry = &orchestrator.retry;
        let mut delays: HashMap<usize, Duration> = HashMap::new();
        let mut stuck: Option<(StepRef, String)> = None;
        let mut tasks = Tasks::default();
        self.start_compensations(steps, &mut tasks).await?;
        while let Some((index, done)) = self.next_end(&mut tasks).await? {
            let step = self.step_ref(index);
            match done {
                Done::Compensation(Ok(())) => {
                    self.record(Transition::CompensationCompleted { step })?;
                }
                Done::Compensation(Err(error)) => {
                    let attempt = self.progress.attempts(index);
                    self.record(Transition::CompensationFailed {
                        step: step.clone(),
                        attempt,
                        error: error.clone(),
                    })?;
                    if attempt >= retry.max_attempts {
                        if self.definition.steps[index].continue_on_error {
                            self.record(Transition::CompensationAbandoned { step, error })?;
                        } else {
                            stuck.get_or_insert((step, error));
                        }
                    } else if stuck.is_none() {
                        self.commit().await?;
                        let previous = delays.get(&index).copied().unwrap_or_default();
                        let delay = retry.delay(attempt, previous, &*orchestrator.random);
                        delays.insert(index, delay);
                        tasks.spawn(index, Work::Backoff(orchestrator.clock.sleep(delay)));
                    }
                }
                Done::Backoff if stuck.is_none() => {
                    self.start_compensations(&[index], &mut tasks).await?;
                }
                Done::Backoff | Done::Action(_) => {}
            }
        }
        if let Some((step, error)) = stuck {
            self.record(Transition::SagaStuck { step, error })?;
            self.commit().await?;
        }
        Ok(())
    }

    /// Records and commits the next attempt of each of `steps`' compensations,
    /// then runs them.
    async fn start_compensations(
        &mut self,
        steps: &[usize],
        tasks: &mut Tasks,
    ) -> Result<(), SagaError> {
        for &index in steps {
            self.record(Transition::CompensationStarted {
                step: self.step_ref(index),
                attempt: self.progress.attempts(index) + 1,
            })?;
        }
        self.commit().await?;
        for &index in steps {
            let Some(compensation) = self.definition.steps[index].compensation.clone() else {
                continue;
            };
            let attempt = self.progress.attempts(index);
            let ctx = self.context(index, Phase::Compensation, attempt);
            let output = self.progress.output(index).cloned().unwrap_or_default();
            tasks.spawn(index, Work::Compensation(compensation(ctx, output)));
        }
        Ok(())
    }
}

/// Asks the sagas a serving worker drives to stop, when its shutdown grace
/// period is over. Sagas driven by [`Orchestrator::start`],
/// [`Orchestrator::recover`] or [`Orchestrator::resume`] never halt.
#[derive(Clone, Debug)]
pub(crate) struct Halt(Option<watch::Receiver<bool>>);

impl Halt {
    pub(crate) fn never() -> Self {
        Halt(None)
    }

    pub(crate) fn on(receiver: watch::Receiver<bool>) -> Self {
        Halt(Some(receiver))
    }

    fn is_set(&self) -> bool {
        self.0.as_ref().is_some_and(|r| *r.borrow())
    }

    /// Resolves once the halt is set (never, if it never is).
    async fn wait(&self) {
        if let Some(receiver) = &self.0 {
            let mut receiver = receiver.clone();
            if receiver.wait_for(|&halted| halted).await.is_ok() {
                return;
            }
        }
        std::future::pending().await
    }
}

/// The worker's shutdown stopped the tasks of a saga.
struct Halted;

/// What a task of a saga's driver does: a step's action, a compensation
/// attempt, or the wait before the next attempt.
enum Work {
    Action(BoxFuture<'static, Result<serde_json::Value, String>>),
    Compensation(BoxFuture<'static, Result<(), String>>),
    Backoff(seawall::clock::BoxSleep),
}

/// How a task ended; a panic is the step's (or compensation's) error.
enum Done {
    Action(Result<serde_json::Value, String>),
    Compensation(Result<(), String>),
    Backoff,
}

/// The tasks of one saga's driver, each for one step. Dropping it (the
/// driver's future was dropped) aborts them, as a crash would stop them.
#[derive(Default)]
struct Tasks {
    set: JoinSet<Done>,
    steps: HashMap<tokio::task::Id, (usize, OnPanic)>,
}

/// What a task that panicked ended with, given the panic's message.
type OnPanic = fn(String) -> Done;

impl Tasks {
    fn spawn(&mut self, index: usize, work: Work) {
        let (handle, on_panic): (_, OnPanic) = match work {
            Work::Action(f) => (
                self.set.spawn(async move { Done::Action(f.await) }),
                |error| Done::Action(Err(error)),
            ),
            Work::Compensation(f) => (
                self.set.spawn(async move { Done::Compensation(f.await) }),
                |error| Done::Compensation(Err(error)),
            ),
            Work::Backoff(sleep) => (
                self.set.spawn(async move {
                    sleep.await;
                    Done::Backoff
                }),
                |_| Done::Backoff,
            ),
        };
        self.steps.insert(handle.id(), (index, on_panic));
    }

    fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// The next task to end, with its step; when `halt` is set first, the
    /// tasks are aborted and awaited (nothing of this saga runs any more),
    /// and how they ended is not recorded (as after a crash).
    async fn next(&mut self, halt: &Halt) -> Result<Option<(usize, Done)>, Halted> {
        tokio::select! {
            biased;
            () = halt.wait() => {
                self.set.abort_all();
                while self.set.join_next().await.is_some() {}
                Err(Halted)
            }
            next = self.join_next() => Ok(next),
        }
    }

    async fn join_next(&mut self) -> Option<(usize, Done)> {
        match self.set.join_next_with_id().await? {
            Ok((id, done)) => {
                let (index, _) = self.steps.remove(&id)?;
                Some((index, done))
            }
            Err(join) => {
                let (index, on_panic) = self.steps.remove(&join.id())?;
                Some((index, on_panic(format!("step {}", panic_message(join)))))
            }
        }
    }
}
