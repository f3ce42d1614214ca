//! The orchestrator: starts, drives, recovers and resumes sagas.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use tokio::task::JoinSet;

use crate::clock::{BoxFuture, Clock, SystemClock};
use crate::definition::{Outputs, Saga, SagaDefinition, SagaInput, StepContext};
use crate::error::{DefinitionError, LogError, OutputError, SagaError};
use crate::event::{trace, Listener, Listeners, SagaEvent};
use crate::id::{IdempotencyKey, Phase, SagaId};
use crate::log::{ClaimAttempt, ClaimedSaga, Lease, ListQuery, NewSaga, SagaLog, SagaRecord};
use crate::retry::RetryPolicy;
use crate::transition::{SagaStatus, StepRef, Transition, TransitionRecord};

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

    /// No step starts after this instant; if one would, the saga compensates.
    pub fn deadline(mut self, deadline: SystemTime) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Deadline relative to the start (the orchestrator's clock).
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
    ) -> BoxFuture<'static, Result<SagaOutcome, SagaError>> {
        let definition = self.inner.clone();
        Box::pin(async move { Run::resume(definition, orchestrator, claimed, operator).await })
    }

    fn finished_outcome(
        &self,
        record: &SagaRecord,
        history: &[TransitionRecord],
    ) -> Result<SagaOutcome, SagaError> {
        let progress = Progress::replay(history, self.inner.steps.len()).map_err(|detail| {
            SagaError::History {
                saga_id: record.id.clone(),
                detail,
            }
        })?;
        Ok(progress.outcome(&record.id, &self.inner))
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
    retry: RetryPolicy,
    clock: Arc<dyn Clock>,
    listeners: Listeners,
    concurrency: usize,
    leases: LeaseKeeper,
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
/// [`RetryPolicy::default`] for compensations, the [`SystemClock`], no
/// listener, recovery of up to 32 sagas at a time.
pub struct OrchestratorBuilder {
    log: Arc<dyn SagaLog>,
    sagas: Vec<(String, Arc<dyn Driver>)>,
    retry: RetryPolicy,
    clock: Arc<dyn Clock>,
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

    /// The retry policy of compensations.
    pub fn compensation_retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The clock used for deadlines, timestamps and retry backoff.
    pub fn clock(mut self, clock: impl Clock) -> Self {
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
    /// [`DefinitionError::DuplicateSaga`] when two sagas share a name.
    pub fn build(self) -> Result<Orchestrator, DefinitionError> {
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
                clock: self.clock,
                listeners: Listeners(self.listeners),
                concurrency: self.concurrency,
                leases: LeaseKeeper::default(),
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
            retry: RetryPolicy::default(),
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
        let run = Run::fresh(saga.inner.clone(), self.inner.clone(), new, Arc::new(input));
        run.drive().await
    }

    /// Logs a saga without running it: any worker's [`recover`](Self::recover)
    /// picks it up. Returns its id.
    ///
    /// # Errors
    ///
    /// As [`start_with`](Self::start_with).
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
        let created_at = self.inner.clock.now();
        let deadline = match (options.deadline, options.timeout) {
            (Some(d), Some(t)) => Some(d.min(created_at + t)),
            (Some(d), None) => Some(d),
            (None, Some(t)) => Some(created_at + t),
            (None, None) => None,
        };
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
    /// start-up; with several Postgres workers, call it periodically.
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
                    let handle = tasks
                        .spawn(async move { Inner::drive_claimed(inner, claimed, false).await });
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
                Inner::drive_claimed(self.inner.clone(), claimed, true).await
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
    ) -> Result<SagaOutcome, SagaError> {
        match inner.driver(&claimed.record) {
            Ok(driver) => driver.drive(inner.clone(), claimed, operator).await,
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
        let at = self.clock.now();
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

/// A saga's state, rebuilt from its history.
#[derive(Debug, Clone, PartialEq)]
struct Progress {
    status: SagaStatus,
    outputs: Vec<serde_json::Value>,
    compensated: Vec<bool>,
    attempts: Vec<u32>,
    failure: Option<StepFailure>,
    stuck: Option<StepFailure>,
    next_seq: u32,
}

impl Progress {
    fn new(steps: usize) -> Self {
        Progress {
            status: SagaStatus::Running,
            outputs: Vec::new(),
            compensated: vec![false; steps],
            attempts: vec![0; steps],
            failure: None,
            stuck: None,
            next_seq: 0,
        }
    }

    fn replay(history: &[TransitionRecord], steps: usize) -> Result<Self, String> {
        let mut p = Progress::new(steps);
        for (i, record) in history.iter().enumerate() {
            if record.seq as usize != i {
                return Err(format!("transition {i} has sequence number {}", record.seq));
            }
            if let Some(step) = record.transition.step() {
                if step.index >= steps {
                    return Err(format!(
                        "transition {i} names step {} but the saga has {steps} steps",
                        step.index
                    ));
                }
            }
            match &record.transition {
                Transition::StepStarted { step } if step.index != p.outputs.len() => {
                    return Err(format!(
                        "step {} started before step {} completed",
                        step.index,
                        p.outputs.len()
                    ))
                }
                Transition::StepCompleted { step, output } => {
                    if step.index != p.outputs.len() {
                        return Err(format!("step {} completed out of order", step.index));
                    }
                    p.outputs.push(output.clone());
                }
                Transition::StepFailed { step, error } => {
                    p.status = SagaStatus::Compensating;
                    p.failure = Some(StepFailure {
                        step: step.clone(),
                        error: error.clone(),
                        deadline_exceeded: false,
                    });
                }
                Transition::DeadlineExceeded { step } => {
                    p.status = SagaStatus::Compensating;
                    p.failure = Some(deadline_failure(step.clone()));
                }
                Transition::CompensationStarted { step, attempt }
                | Transition::CompensationFailed { step, attempt, .. } => {
                    if step.index >= p.outputs.len() {
                        return Err(format!(
                            "step {} compensated but never completed",
                            step.index
                        ));
                    }
                    p.attempts[step.index] = p.attempts[step.index].max(*attempt);
                }
                Transition::CompensationCompleted { step } => {
                    p.compensated[step.index] = true;
                }
                Transition::SagaCompleted => p.status = SagaStatus::Completed,
                Transition::SagaCompensated => p.status = SagaStatus::Compensated,
                Transition::SagaStuck { step, error } => {
                    p.status = SagaStatus::Stuck;
                    p.stuck = Some(StepFailure {
                        step: step.clone(),
                        error: error.clone(),
                        deadline_exceeded: false,
                    });
                }
                Transition::OperatorResumed => {
                    if p.status == SagaStatus::Stuck {
                        p.status = SagaStatus::Compensating;
                    }
                    p.stuck = None;
                    p.attempts.iter_mut().for_each(|a| *a = 0);
                }
                _ => {}
            }
        }
        p.next_seq = u32::try_from(history.len()).map_err(|_| "history too long".to_owned())?;
        Ok(p)
    }

    fn outcome<I>(&self, id: &SagaId, definition: &SagaDefinition<I>) -> SagaOutcome {
        SagaOutcome {
            id: id.clone(),
            name: definition.name.to_string(),
            status: self.status,
            failure: self.failure.clone(),
            stuck: self.stuck.clone(),
            outputs: definition
                .step_names
                .iter()
                .cloned()
                .zip(self.outputs.iter().cloned())
                .collect(),
        }
    }
}

fn deadline_failure(step: StepRef) -> StepFailure {
    StepFailure {
        error: format!("saga deadline passed before step `{}` started", step.name),
        step,
        deadline_exceeded: true,
    }
}

/// Aborts a spawned step when the driver is dropped, as a crash would stop it.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
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
    _renewal: Option<LeaseGuard>,
    unsaved: Option<NewSaga>,
    pending: Vec<Transition>,
    progress: Progress,
}

impl<I: SagaInput> Run<I> {
    fn fresh(
        definition: Arc<SagaDefinition<I>>,
        orchestrator: Arc<Inner>,
        new: NewSaga,
        input: Arc<I>,
    ) -> Self {
        let steps = definition.steps.len();
        Run {
            definition,
            orchestrator,
            id: new.id.clone(),
            input,
            deadline: new.deadline,
            lease: None,
            _renewal: None,
            unsaved: Some(new),
            pending: vec![Transition::SagaStarted],
            progress: Progress::new(steps),
        }
    }

    async fn resume(
        definition: Arc<SagaDefinition<I>>,
        orchestrator: Arc<Inner>,
        claimed: ClaimedSaga,
        operator: bool,
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
        let mut progress = match Progress::replay(history, definition.steps.len()) {
            Ok(progress) => progress,
            Err(detail) => {
                let error = SagaError::History {
                    saga_id: record.id.clone(),
                    detail,
                };
                return Err(orchestrator.recovery_failed(&claimed, error).await);
            }
        };
        let mut pending = vec![Transition::Claimed {
            owner: orchestrator.log.owner().to_owned(),
        }];
        if operator && progress.status == SagaStatus::Stuck {
            pending.push(Transition::OperatorResumed);
            progress.status = SagaStatus::Compensating;
            progress.stuck = None;
            progress.attempts.iter_mut().for_each(|a| *a = 0);
        }
        let run = Run {
            id: record.id.clone(),
            deadline: record.deadline,
            _renewal: orchestrator.hold(&claimed.lease),
            definition,
            orchestrator,
            input: Arc::new(input),
            lease: Some(claimed.lease),
            unsaved: None,
            pending,
            progress,
        };
        run.drive().await
    }

    async fn drive(mut self) -> Result<SagaOutcome, SagaError> {
        if self.progress.status == SagaStatus::Running {
            self.forward().await?;
        }
        if self.progress.status == SagaStatus::Compensating {
            self.compensate().await?;
        }
        if !self.pending.is_empty() {
            // Claimed but already finished (cannot normally happen): record the claim.
            let status = self.progress.status;
            self.commit(status).await?;
        }
        Ok(self.progress.outcome(&self.id, &self.definition))
    }

    /// Commits the pending transitions with `status`.
    async fn commit(&mut self, status: SagaStatus) -> Result<(), SagaError> {
        let transitions = std::mem::take(&mut self.pending);
        let log = &self.orchestrator.log;
        let at = self.orchestrator.clock.now();
        let first_seq = self.progress.next_seq;
        if let Some(new) = self.unsaved.take() {
            if status == SagaStatus::Running {
                self.lease = log.create(&new, &transitions, true).await?;
                self._renewal = self.lease.as_ref().and_then(|l| self.orchestrator.hold(l));
            } else {
                // A saga that ends before any step (deadline already passed):
                // create it running, then append the rest.
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
        for (offset, transition) in transitions.iter().enumerate() {
            self.orchestrator.emit(
                &self.id,
                &self.definition.name,
                first_seq + offset as u32,
                at,
                status,
                transition,
            );
        }
        self.progress.next_seq += transitions.len() as u32;
        self.progress.status = status;
        Ok(())
    }

    fn context(&self, index: usize, phase: Phase, attempt: u32) -> StepContext<I> {
        let step_name = self.definition.step_names[index].clone();
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
                names: self.definition.step_names[..index].into(),
                values: self.progress.outputs[..index].into(),
            },
            deadline: self.deadline,
            clock: self.orchestrator.clock.clone(),
        }
    }

    fn step_ref(&self, index: usize) -> StepRef {
        StepRef::new(index, &*self.definition.step_names[index])
    }

    async fn run_isolated<T: Send + 'static>(
        &self,
        work: BoxFuture<'static, Result<T, String>>,
    ) -> Result<T, String> {
        let mut task = AbortOnDrop(tokio::spawn(work));
        match (&mut task.0).await {
            Ok(result) => result,
            Err(join) => Err(format!("step {}", panic_message(join))),
        }
    }

    async fn forward(&mut self) -> Result<(), SagaError> {
        let steps = self.definition.steps.len();
        while self.progress.outputs.len() < steps {
            let index = self.progress.outputs.len();
            if let Some(deadline) = self.deadline {
                if self.orchestrator.clock.now() >= deadline {
                    let step = self.step_ref(index);
                    self.progress.failure = Some(deadline_failure(step.clone()));
                    self.pending.push(Transition::DeadlineExceeded { step });
                    self.progress.status = SagaStatus::Compensating;
                    return Ok(());
                }
            }
            self.pending.push(Transition::StepStarted {
                step: self.step_ref(index),
            });
            self.commit(SagaStatus::Running).await?;
            let action =
                (self.definition.steps[index].action)(self.context(index, Phase::Action, 1));
            match self.run_isolated(action).await {
                Ok(output) => {
                    self.pending.push(Transition::StepCompleted {
                        step: self.step_ref(index),
                        output: output.clone(),
                    });
                    self.progress.outputs.push(output);
                }
                Err(error) => {
                    let step = self.step_ref(index);
                    self.progress.failure = Some(StepFailure {
                        step: step.clone(),
                        error: error.clone(),
                        deadline_exceeded: false,
                    });
                    self.pending.push(Transition::StepFailed { step, error });
                    self.progress.status = SagaStatus::Compensating;
                    return Ok(());
                }
            }
        }
        self.pending.push(Transition::SagaCompleted);
        self.commit(SagaStatus::Completed).await
    }

    async fn compensate(&mut self) -> Result<(), SagaError> {
        let retry = self.orchestrator.retry.clone();
        for index in (0..self.progress.outputs.len()).rev() {
            if self.progress.compensated[index] {
                continue;
            }
            let Some(compensation) = self.definition.steps[index].compensation.clone() else {
                continue;
            };
            loop {
                let attempt = self.progress.attempts[index] + 1;
                self.progress.attempts[index] = attempt;
                self.pending.push(Transition::CompensationStarted {
                    step: self.step_ref(index),
                    attempt,
                });
                self.commit(SagaStatus::Compensating).await?;
                let ctx = self.context(index, Phase::Compensation, attempt);
                let work = compensation(ctx, self.progress.outputs[index].clone());
                match self.run_isolated(work).await {
                    Ok(()) => {
                        self.pending.push(Transition::CompensationCompleted {
                            step: self.step_ref(index),
                        });
                        self.progress.compensated[index] = true;
                        break;
                    }
                    Err(error) => {
                        let step = self.step_ref(index);
                        self.pending.push(Transition::CompensationFailed {
                            step: step.clone(),
                            attempt,
                            error: error.clone(),
                        });
                        if attempt >= retry.attempts() {
                            self.progress.stuck = Some(StepFailure {
                                step: step.clone(),
                                error: error.clone(),
                                deadline_exceeded: false,
                            });
                            self.pending.push(Transition::SagaStuck { step, error });
                            return self.commit(SagaStatus::Stuck).await;
                        }
                        self.commit(SagaStatus::Compensating).await?;
                        self.orchestrator
                            .clock
                            .sleep(retry.delay_after(attempt))
                            .await;
                    }
                }
            }
        }
        self.pending.push(Transition::SagaCompensated);
        self.commit(SagaStatus::Compensated).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history(transitions: Vec<Transition>) -> Vec<TransitionRecord> {
        transitions
            .into_iter()
            .enumerate()
            .map(|(i, transition)| TransitionRecord {
                seq: i as u32,
                at: SystemTime::UNIX_EPOCH,
                transition,
            })
            .collect()
    }

    fn step(i: usize) -> StepRef {
        StepRef::new(i, format!("s{i}"))
    }

    #[test]
    fn replay_of_a_crash_mid_step_reruns_that_step() {
        let h = history(vec![
            Transition::SagaStarted,
            Transition::StepStarted { step: step(0) },
            Transition::StepCompleted {
                step: step(0),
                output: serde_json::json!(1),
            },
            Transition::StepStarted { step: step(1) },
        ]);
        let p = Progress::replay(&h, 3).unwrap();
        assert_eq!(p.status, SagaStatus::Running);
        assert_eq!(p.outputs, vec![serde_json::json!(1)]);
        assert_eq!(p.next_seq, 4);
    }

    #[test]
    fn replay_of_compensation_tracks_attempts_and_done_steps() {
        let h = history(vec![
            Transition::SagaStarted,
            Transition::StepStarted { step: step(0) },
            Transition::StepCompleted {
                step: step(0),
                output: serde_json::json!(null),
            },
            Transition::StepStarted { step: step(1) },
            Transition::StepCompleted {
                step: step(1),
                output: serde_json::json!(null),
            },
            Transition::StepStarted { step: step(2) },
            Transition::StepFailed {
                step: step(2),
                error: "x".into(),
            },
            Transition::CompensationStarted {
                step: step(1),
                attempt: 1,
            },
            Transition::CompensationCompleted { step: step(1) },
            Transition::CompensationStarted {
                step: step(0),
                attempt: 1,
            },
            Transition::CompensationFailed {
                step: step(0),
                attempt: 1,
                error: "y".into(),
            },
        ]);
        let p = Progress::replay(&h, 3).unwrap();
        assert_eq!(p.status, SagaStatus::Compensating);
        assert_eq!(p.compensated, vec![false, true, false]);
        assert_eq!(p.attempts, vec![1, 1, 0]);
        assert_eq!(p.failure.unwrap().step, step(2));
    }

    #[test]
    fn replay_rejects_histories_that_do_not_fit() {
        let gap = vec![TransitionRecord {
            seq: 1,
            at: SystemTime::UNIX_EPOCH,
            transition: Transition::SagaStarted,
        }];
        assert!(Progress::replay(&gap, 1).is_err());
        let too_many_steps = history(vec![
            Transition::SagaStarted,
            Transition::StepStarted { step: step(5) },
        ]);
        assert!(Progress::replay(&too_many_steps, 3).is_err());
        let out_of_order = history(vec![
            Transition::SagaStarted,
            Transition::StepStarted { step: step(1) },
        ]);
        assert!(Progress::replay(&out_of_order, 3).is_err());
    }
}
