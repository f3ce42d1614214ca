//! Saga definitions: [`Saga`], [`Step`] and the [`StepContext`] handed to user code.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::clock::{BoxFuture, WallClock};
use crate::error::{DefinitionError, OutputError};
use crate::id::{IdempotencyKey, Phase, SagaId};

/// What a saga input must be: serialisable (it is stored in the log), shareable
/// between the tasks that run its steps.
pub trait SagaInput: Serialize + DeserializeOwned + Send + Sync + 'static {}
impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> SagaInput for T {}

/// What a step output must be: serialisable (it is stored in the log when the
/// step completes and handed back to later steps and to the compensation).
pub trait StepOutput: Serialize + DeserializeOwned + Send + 'static {}
impl<T: Serialize + DeserializeOwned + Send + 'static> StepOutput for T {}

pub(crate) type ActionFn<I> = Arc<
    dyn Fn(StepContext<I>) -> BoxFuture<'static, Result<serde_json::Value, String>> + Send + Sync,
>;
pub(crate) type CompensationFn<I> = Arc<
    dyn Fn(StepContext<I>, serde_json::Value) -> BoxFuture<'static, Result<(), String>>
        + Send
        + Sync,
>;

/// One step of a saga: an async action producing an output of type `O`, and
/// optionally a compensation that undoes it given that output.
///
/// Both receive a [`StepContext`] with the saga input, the outputs of earlier
/// steps and the idempotency key. Errors may be any type that implements
/// [`Display`](fmt::Display); the orchestrator records the message. For retries,
/// timeouts or a circuit breaker around an external call, run a seawall pipeline
/// inside the action: the orchestrator sees only its final result.
///
/// # Examples
///
/// ```
/// use seawall_saga::{Step, StepContext};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Order { sku: String, quantity: u32 }
///
/// let reserve = Step::new("reserve_stock", |ctx: StepContext<Order>| async move {
///     let order = ctx.input();
///     // reserve order.quantity of order.sku, passing ctx.idempotency_key() along
///     Ok::<_, String>(format!("reservation-{}", order.quantity))
/// })
/// .compensate(|ctx, reservation: String| async move {
///     // release `reservation`
///     let _ = (ctx.idempotency_key(), reservation);
///     Ok::<_, String>(())
/// });
/// ```
pub struct Step<I, O> {
    name: String,
    action: ActionFn<I>,
    compensation: Option<CompensationFn<I>>,
    continue_on_error: bool,
    _output: PhantomData<fn() -> O>,
}

impl<I, O> fmt::Debug for Step<I, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Step")
            .field("name", &self.name)
            .field("compensation", &self.compensation.is_some())
            .field("continue_on_error", &self.continue_on_error)
            .finish()
    }
}

impl<I: SagaInput, O: StepOutput> Step<I, O> {
    /// A step named `name` whose action is `action`, without compensation.
    pub fn new<F, Fut, E>(name: impl Into<String>, action: F) -> Self
    where
        F: Fn(StepContext<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let action: ActionFn<I> = Arc::new(move |ctx: StepContext<I>| {
            let fut = action(ctx);
            Box::pin(async move {
                match fut.await {
                    Ok(output) => serde_json::to_value(output)
                        .map_err(|e| format!("step output cannot be serialised: {e}")),
                    Err(e) => Err(e.to_string()),
                }
            })
        });
        Step {
            name: name.into(),
            action,
            compensation: None,
            continue_on_error: false,
            _output: PhantomData,
        }
    }

    /// Sets the compensation: it gets the context and the step's own output.
    ///
    /// A compensation must be safe to run more than once with the same
    /// idempotency key (it runs at least once; see the crate docs) and should
    /// succeed eventually: it is retried with the orchestrator's
    /// [compensation retry](crate::OrchestratorBuilder::compensation_retry), then the saga becomes
    /// [`Stuck`](crate::SagaStatus::Stuck).
    pub fn compensate<F, Fut, E>(mut self, compensation: F) -> Self
    where
        F: Fn(StepContext<I>, O) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let compensation: CompensationFn<I> =
            Arc::new(move |ctx: StepContext<I>, output: serde_json::Value| {
                let output = serde_json::from_value::<O>(output);
                let fut = output.map(|output| compensation(ctx, output));
                Box::pin(async move {
                    match fut {
                        Ok(fut) => fut.await.map_err(|e| e.to_string()),
                        Err(e) => Err(format!(
                            "logged step output does not deserialise for the compensation: {e}"
                        )),
                    }
                })
            });
        self.compensation = Some(compensation);
        self
    }

    /// Marks the compensation *continue-on-error*: when it has failed all its
    /// attempts, the saga records it as abandoned (a `compensation_abandoned`
    /// transition, listed in [`SagaOutcome::abandoned`](crate::SagaOutcome::abandoned))
    /// and goes on compensating the other steps, instead of stopping
    /// [`Stuck`](crate::SagaStatus::Stuck). For an undo that is a courtesy
    /// (a notification, a cache purge), not a correction.
    ///
    /// # Default
    ///
    /// Off: a compensation that fails all its attempts leaves the saga stuck.
    pub fn continue_on_error(mut self) -> Self {
        self.continue_on_error = true;
        self
    }

    /// The step's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs the action through a seawall `pipeline` (retry, circuit breaker,
    /// timeout, ...): the orchestrator sees one step execution, whose result is
    /// the pipeline's. Every attempt calls the action again with the same
    /// context, so with the same [idempotency key](StepContext::idempotency_key).
    ///
    /// A pipeline timeout drops the attempt's future, and a step that finally
    /// fails is not compensated (only completed steps are): keep each attempt
    /// either done or without effect, or deduplicated by the key.
    ///
    /// The pipeline must accept any error type (no typed classifier); for a
    /// typed one, call `pipeline.run(..)` inside the action instead.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use seawall::{Pipeline, Retry};
    /// use seawall_saga::{Step, StepContext};
    ///
    /// let payments = Pipeline::builder("payments")
    ///     .retry(Retry::exponential(Duration::from_millis(50)).max_attempts(5))
    ///     .build()?;
    /// let charge = Step::new("charge", |ctx: StepContext<u64>| async move {
    ///     // call the payment provider with ctx.idempotency_key()
    ///     Ok::<_, String>(*ctx.input())
    /// })
    /// .through(payments);
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    pub fn through(mut self, pipeline: seawall::Pipeline) -> Self {
        let action = self.action.clone();
        self.action = Arc::new(move |ctx: StepContext<I>| {
            let (action, pipeline) = (action.clone(), pipeline.clone());
            Box::pin(async move {
                pipeline
                    .run(|_attempt| action(ctx.clone()))
                    .await
                    .map_err(|e| e.to_string())
            })
        });
        self
    }
}

pub(crate) struct ErasedStep<I> {
    pub(crate) name: Arc<str>,
    pub(crate) action: ActionFn<I>,
    pub(crate) compensation: Option<CompensationFn<I>>,
    pub(crate) continue_on_error: bool,
}

impl<I, O> From<Step<I, O>> for ErasedStep<I> {
    fn from(step: Step<I, O>) -> Self {
        ErasedStep {
            name: step.name.into(),
            action: step.action,
            compensation: step.compensation,
            continue_on_error: step.continue_on_error,
        }
    }
}

/// How the compensations of a [`Parallel`] group run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum GroupCompensation {
    /// All at once, each with its own retries: the group's steps ran
    /// concurrently, so none can depend on another.
    #[default]
    Concurrent,
    /// One after the other, last declared first, as if the steps had run in
    /// sequence.
    ReverseOrder,
}

/// Steps that run concurrently, as one stage of a saga: added with
/// [`SagaBuilder::parallel`].
///
/// The group starts when the steps before it have completed, and the saga
/// goes on when all of the group's steps have completed. When one fails, the
/// others are *awaited*, not cancelled: an effect that is under way is then
/// finished and known (completed, with its output, or failed) and a completed
/// one is compensated; cancelling it half-way would leave an effect that is
/// neither done nor undone. After a crash, the steps whose end is not logged
/// run again (with the same idempotency key), for the same reason.
/// Compensation then undoes every completed step: the group's own and every
/// earlier stage's, stages in reverse order, the group's compensations
/// [concurrently or in reverse order](GroupCompensation).
///
/// Steps of a group see the outputs of the steps before the group, not of
/// each other.
///
/// # Default
///
/// [`GroupCompensation::Concurrent`].
///
/// # Examples
///
/// ```
/// use seawall_saga::{Parallel, Saga, Step, StepContext};
///
/// let trip = Saga::<String>::builder("trip")
///     .parallel(
///         Parallel::new()
///             .step(Step::new("hotel", |_ctx: StepContext<String>| async {
///                 Ok::<_, String>("room 12".to_owned())
///             }))
///             .step(Step::new("car", |_ctx: StepContext<String>| async {
///                 Ok::<_, String>("red van".to_owned())
///             })),
///     )
///     .step(Step::new("pay", |ctx: StepContext<String>| async move {
///         let room: String = ctx.output("hotel").map_err(|e| e.to_string())?;
///         Ok::<_, String>(format!("paid for {room}"))
///     }))
///     .build()?;
/// assert_eq!(trip.step_names().collect::<Vec<_>>(), ["hotel", "car", "pay"]);
/// # Ok::<_, seawall_saga::DefinitionError>(())
/// ```
pub struct Parallel<I> {
    steps: Vec<ErasedStep<I>>,
    compensation: GroupCompensation,
}

impl<I> fmt::Debug for Parallel<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Parallel")
            .field(
                "steps",
                &self.steps.iter().map(|s| &*s.name).collect::<Vec<_>>(),
            )
            .field("compensation", &self.compensation)
            .finish()
    }
}

impl<I: SagaInput> Default for Parallel<I> {
    fn default() -> Self {
        Self::new()
    }
}

impl<I: SagaInput> Parallel<I> {
    /// An empty group.
    pub fn new() -> Self {
        Parallel {
            steps: Vec::new(),
            compensation: GroupCompensation::default(),
        }
    }

    /// Adds a step to the group.
    pub fn step<O: StepOutput>(mut self, step: Step<I, O>) -> Self {
        self.steps.push(step.into());
        self
    }

    /// How the group's compensations run.
    pub fn compensation(mut self, compensation: GroupCompensation) -> Self {
        self.compensation = compensation;
        self
    }
}

/// One stage of a saga: a single step or a parallel group, as a range of
/// step indices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Stage {
    pub(crate) steps: std::ops::Range<usize>,
    pub(crate) compensation: GroupCompensation,
}

/// A saga definition: a name and ordered steps over an input of type `I`.
///
/// Cheap to clone. Register it with
/// [`OrchestratorBuilder::saga`](crate::OrchestratorBuilder::saga) so the
/// orchestrator can recover its instances after a restart.
pub struct Saga<I> {
    pub(crate) inner: Arc<SagaDefinition<I>>,
}

pub(crate) struct SagaDefinition<I> {
    pub(crate) name: Arc<str>,
    pub(crate) steps: Vec<ErasedStep<I>>,
    pub(crate) step_names: Arc<[Arc<str>]>,
    pub(crate) stages: Arc<[Stage]>,
    /// The stages' step ranges, as the saga state reads them.
    pub(crate) layout: Arc<[std::ops::Range<usize>]>,
}

impl<I> Clone for Saga<I> {
    fn clone(&self) -> Self {
        Saga {
            inner: self.inner.clone(),
        }
    }
}

impl<I> fmt::Debug for Saga<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Saga")
            .field("name", &self.inner.name)
            .field("steps", &self.inner.step_names)
            .finish()
    }
}

impl<I: SagaInput> Saga<I> {
    /// Starts a definition named `name`.
    pub fn builder(name: impl Into<String>) -> SagaBuilder<I> {
        SagaBuilder {
            name: name.into(),
            steps: Vec::new(),
            stages: Vec::new(),
        }
    }

    /// The saga's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The step names, in order.
    pub fn step_names(&self) -> impl Iterator<Item = &str> {
        self.inner.step_names.iter().map(|n| &**n)
    }
}

/// Builds a [`Saga`].
pub struct SagaBuilder<I> {
    name: String,
    steps: Vec<ErasedStep<I>>,
    stages: Vec<Stage>,
}

impl<I> fmt::Debug for SagaBuilder<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SagaBuilder")
            .field("name", &self.name)
            .field(
                "steps",
                &self.steps.iter().map(|s| &*s.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl<I: SagaInput> SagaBuilder<I> {
    /// Appends a step.
    pub fn step<O: StepOutput>(mut self, step: Step<I, O>) -> Self {
        let start = self.steps.len();
        self.steps.push(step.into());
        self.stages.push(Stage {
            steps: start..start + 1,
            compensation: GroupCompensation::default(),
        });
        self
    }

    /// Appends a group of steps that run concurrently (see [`Parallel`]).
    pub fn parallel(mut self, group: Parallel<I>) -> Self {
        let start = self.steps.len();
        self.steps.extend(group.steps);
        self.stages.push(Stage {
            steps: start..self.steps.len(),
            compensation: group.compensation,
        });
        self
    }

    /// Validates and builds the definition.
    ///
    /// # Errors
    ///
    /// An empty saga name, no steps, an empty parallel group, an empty or
    /// repeated step name.
    pub fn build(self) -> Result<Saga<I>, DefinitionError> {
        if self.name.is_empty() {
            return Err(DefinitionError::EmptySagaName);
        }
        if self.steps.is_empty() {
            return Err(DefinitionError::NoSteps(self.name));
        }
        if self.stages.iter().any(|stage| stage.steps.is_empty()) {
            return Err(DefinitionError::EmptyGroup(self.name));
        }
        for (i, step) in self.steps.iter().enumerate() {
            if step.name.is_empty() {
                return Err(DefinitionError::EmptyStepName(self.name));
            }
            if self.steps[..i].iter().any(|s| s.name == step.name) {
                return Err(DefinitionError::DuplicateStep {
                    saga: self.name,
                    step: step.name.to_string(),
                });
            }
        }
        let step_names = self.steps.iter().map(|s| s.name.clone()).collect();
        Ok(Saga {
            inner: Arc::new(SagaDefinition {
                name: self.name.into(),
                steps: self.steps,
                step_names,
                layout: self
                    .stages
                    .iter()
                    .map(|stage| stage.steps.clone())
                    .collect(),
                stages: self.stages.into(),
            }),
        })
    }
}

/// Outputs of the steps that completed before the current one.
#[derive(Clone, Debug)]
pub(crate) struct Outputs {
    pub(crate) names: Arc<[Arc<str>]>,
    pub(crate) values: Arc<[serde_json::Value]>,
}

/// What a step's action or compensation gets besides its own output.
pub struct StepContext<I> {
    pub(crate) saga_id: SagaId,
    pub(crate) saga_name: Arc<str>,
    pub(crate) step_index: usize,
    pub(crate) step_name: Arc<str>,
    pub(crate) phase: Phase,
    pub(crate) key: IdempotencyKey,
    pub(crate) attempt: u32,
    pub(crate) input: Arc<I>,
    pub(crate) outputs: Outputs,
    pub(crate) deadline: Option<SystemTime>,
    pub(crate) clock: Arc<dyn WallClock>,
}

impl<I> Clone for StepContext<I> {
    fn clone(&self) -> Self {
        StepContext {
            saga_id: self.saga_id.clone(),
            saga_name: self.saga_name.clone(),
            step_index: self.step_index,
            step_name: self.step_name.clone(),
            phase: self.phase,
            key: self.key.clone(),
            attempt: self.attempt,
            input: self.input.clone(),
            outputs: self.outputs.clone(),
            deadline: self.deadline,
            clock: self.clock.clone(),
        }
    }
}

impl<I> fmt::Debug for StepContext<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepContext")
            .field("saga_id", &self.saga_id)
            .field("saga_name", &self.saga_name)
            .field("step", &self.step_name)
            .field("phase", &self.phase)
            .field("key", &self.key)
            .field("attempt", &self.attempt)
            .finish()
    }
}

impl<I> StepContext<I> {
    /// The saga input.
    pub fn input(&self) -> &I {
        &self.input
    }

    /// The saga input, shared (to move into a spawned task).
    pub fn input_arc(&self) -> Arc<I> {
        self.input.clone()
    }

    /// The output of the earlier step named `step`, deserialised.
    ///
    /// # Errors
    ///
    /// [`OutputError::Missing`] when no earlier step of that name has completed,
    /// [`OutputError::Deserialize`] when the output is not a `T`.
    pub fn output<T: DeserializeOwned>(&self, step: &str) -> Result<T, OutputError> {
        OutputError::read(step, self.output_json(step))
    }

    /// The output of the earlier step named `step`, as JSON.
    pub fn output_json(&self, step: &str) -> Option<&serde_json::Value> {
        self.outputs
            .names
            .iter()
            .zip(self.outputs.values.iter())
            .find(|(name, _)| &***name == step)
            .map(|(_, value)| value)
    }

    /// The key naming this effect (saga id + step + phase), the same on every
    /// execution of it, in any process. Hand it to the external system.
    pub fn idempotency_key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// The saga's id.
    pub fn saga_id(&self) -> &SagaId {
        &self.saga_id
    }

    /// The saga's name.
    pub fn saga_name(&self) -> &str {
        &self.saga_name
    }

    /// This step's name.
    pub fn step_name(&self) -> &str {
        &self.step_name
    }

    /// This step's 0-based position.
    pub fn step_index(&self) -> usize {
        self.step_index
    }

    /// Action or compensation.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// 1-based attempt of this compensation within the current retry cycle
    /// (always 1 for actions).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The saga's deadline, if it has one.
    pub fn deadline(&self) -> Option<SystemTime> {
        self.deadline
    }

    /// Time left until the deadline (zero when passed), or `None` without one.
    /// Feed it to client timeouts or a pipeline so a step does not outlive its saga.
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline.map(|deadline| {
            deadline
                .duration_since(self.clock.wall_time())
                .unwrap_or(Duration::ZERO)
        })
    }
}
