//! Events: one per committed transition, to any listener.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use crate::id::SagaId;
use crate::transition::{SagaStatus, Transition};

/// A transition that was just committed to the log.
///
/// Listeners are called after the commit, on the task that drives the saga, so
/// they should be quick (send to a channel for anything slow). The same
/// information goes to `tracing` (target `seawall_saga`): `debug` for progress,
/// `info` for finished sagas, `warn` for failures and stuck sagas.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SagaEvent {
    /// The saga.
    pub saga_id: SagaId,
    /// The saga's definition name.
    pub saga_name: Arc<str>,
    /// Position of the transition in the saga's history.
    pub seq: u32,
    /// When it was committed (the orchestrator's clock, to the millisecond:
    /// the [`TransitionRecord::at`](crate::TransitionRecord::at) the log keeps).
    pub at: SystemTime,
    /// The saga's status after the transition.
    pub status: SagaStatus,
    /// What happened.
    pub transition: Transition,
}

pub(crate) type Listener = Arc<dyn Fn(&SagaEvent) + Send + Sync>;

pub(crate) struct Listeners(pub(crate) Vec<Listener>);

impl fmt::Debug for Listeners {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} listener(s)", self.0.len())
    }
}

/// Logs one transition to `tracing`.
pub(crate) fn trace(id: &SagaId, name: &str, seq: u32, status: SagaStatus, t: &Transition) {
    let kind = t.kind();
    let step = t.step().map(|s| s.name.as_str()).unwrap_or("");
    match t {
        Transition::SagaStuck { error, .. } => tracing::warn!(
            target: "seawall_saga", saga_id = %id, saga = name, seq, step, error = error.as_str(),
            "saga stuck: compensation failed all its attempts"
        ),
        Transition::StepFailed { error, .. }
        | Transition::CompensationFailed { error, .. }
        | Transition::CompensationAbandoned { error, .. }
        | Transition::RecoveryFailed { error } => tracing::warn!(
            target: "seawall_saga", saga_id = %id, saga = name, seq, step, transition = kind,
            error = error.as_str(), "saga transition"
        ),
        Transition::SagaCompleted | Transition::SagaCompensated => tracing::info!(
            target: "seawall_saga", saga_id = %id, saga = name, seq, status = %status,
            "saga finished"
        ),
        _ => tracing::debug!(
            target: "seawall_saga", saga_id = %id, saga = name, seq, step, transition = kind,
            status = %status, "saga transition"
        ),
    }
}
