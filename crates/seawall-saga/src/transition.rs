//! Saga statuses and the transitions recorded in the log.

use std::fmt;
use std::str::FromStr;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

/// Where a saga stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SagaStatus {
    /// Steps are running forward (or waiting for a worker to run them).
    Running,
    /// A step failed (or the deadline passed); completed steps are being undone.
    Compensating,
    /// Every step completed.
    Completed,
    /// A step failed and every completed step was compensated.
    Compensated,
    /// A compensation failed all its retries. The saga waits for an operator:
    /// fix the cause, then call [`Orchestrator::resume`](crate::Orchestrator::resume).
    Stuck,
}

impl SagaStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [SagaStatus; 5] = [
        SagaStatus::Running,
        SagaStatus::Compensating,
        SagaStatus::Completed,
        SagaStatus::Compensated,
        SagaStatus::Stuck,
    ];

    /// The lowercase name stored in the log.
    pub fn as_str(self) -> &'static str {
        match self {
            SagaStatus::Running => "running",
            SagaStatus::Compensating => "compensating",
            SagaStatus::Completed => "completed",
            SagaStatus::Compensated => "compensated",
            SagaStatus::Stuck => "stuck",
        }
    }

    /// `Completed` or `Compensated`: nothing more will ever happen.
    pub fn is_finished(self) -> bool {
        matches!(self, SagaStatus::Completed | SagaStatus::Compensated)
    }

    /// `Running` or `Compensating`: [`Orchestrator::recover`](crate::Orchestrator::recover)
    /// picks it up.
    pub fn is_in_progress(self) -> bool {
        matches!(self, SagaStatus::Running | SagaStatus::Compensating)
    }

    /// No worker drives a saga in this status (finished or stuck): its lease is released.
    pub fn releases_lease(self) -> bool {
        !self.is_in_progress()
    }
}

impl fmt::Display for SagaStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The string was not a saga status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown saga status {0:?}")]
pub struct UnknownStatus(pub String);

impl FromStr for SagaStatus {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SagaStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| UnknownStatus(s.to_owned()))
    }
}

/// A step, by position and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StepRef {
    /// 0-based position in the saga.
    pub index: usize,
    /// The step's name.
    pub name: String,
}

impl StepRef {
    /// A reference to step `index` named `name`.
    pub fn new(index: usize, name: impl Into<String>) -> Self {
        StepRef {
            index,
            name: name.into(),
        }
    }
}

impl fmt::Display for StepRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (#{})", self.name, self.index)
    }
}

/// One state change of a saga, as committed to the log.
///
/// The orchestrator commits each transition before the effect that follows it
/// starts: `StepStarted` before the step's action runs, `StepCompleted` (with the
/// output) before the next step starts, `CompensationStarted` before a
/// compensation runs, and so on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Transition {
    /// The saga was created with its input.
    SagaStarted,
    /// A step's action is about to run.
    StepStarted {
        /// The step.
        step: StepRef,
    },
    /// A step's action returned its output.
    StepCompleted {
        /// The step.
        step: StepRef,
        /// The output as JSON.
        output: serde_json::Value,
    },
    /// A step's action failed; compensation follows.
    StepFailed {
        /// The step.
        step: StepRef,
        /// The error's message.
        error: String,
    },
    /// The saga's deadline passed before `step` could start; compensation follows.
    DeadlineExceeded {
        /// The step that was not started.
        step: StepRef,
    },
    /// A compensation is about to run.
    CompensationStarted {
        /// The step being compensated.
        step: StepRef,
        /// 1-based attempt number.
        attempt: u32,
    },
    /// A compensation attempt failed.
    CompensationFailed {
        /// The step being compensated.
        step: StepRef,
        /// 1-based attempt number.
        attempt: u32,
        /// The error's message.
        error: String,
    },
    /// A compensation succeeded.
    CompensationCompleted {
        /// The step that was compensated.
        step: StepRef,
    },
    /// Every step completed.
    SagaCompleted,
    /// Every completed step was compensated.
    SagaCompensated,
    /// A compensation failed all its attempts; the saga waits for an operator.
    SagaStuck {
        /// The step whose compensation failed.
        step: StepRef,
        /// The last error's message.
        error: String,
    },
    /// A worker claimed an unfinished saga to continue it (recovery or resume).
    Claimed {
        /// The worker's name.
        owner: String,
    },
    /// An operator resumed a stuck saga; compensation attempts start over.
    OperatorResumed,
    /// A worker could not continue the saga (for example its input no longer
    /// deserialises). The saga is left as it was for an operator to look at.
    RecoveryFailed {
        /// The error's message.
        error: String,
    },
}

impl Transition {
    /// The snake_case name stored in the log (`"step_started"`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Transition::SagaStarted => "saga_started",
            Transition::StepStarted { .. } => "step_started",
            Transition::StepCompleted { .. } => "step_completed",
            Transition::StepFailed { .. } => "step_failed",
            Transition::DeadlineExceeded { .. } => "deadline_exceeded",
            Transition::CompensationStarted { .. } => "compensation_started",
            Transition::CompensationFailed { .. } => "compensation_failed",
            Transition::CompensationCompleted { .. } => "compensation_completed",
            Transition::SagaCompleted => "saga_completed",
            Transition::SagaCompensated => "saga_compensated",
            Transition::SagaStuck { .. } => "saga_stuck",
            Transition::Claimed { .. } => "claimed",
            Transition::OperatorResumed => "operator_resumed",
            Transition::RecoveryFailed { .. } => "recovery_failed",
        }
    }

    /// The step this transition concerns, if any.
    pub fn step(&self) -> Option<&StepRef> {
        match self {
            Transition::StepStarted { step }
            | Transition::StepCompleted { step, .. }
            | Transition::StepFailed { step, .. }
            | Transition::DeadlineExceeded { step }
            | Transition::CompensationStarted { step, .. }
            | Transition::CompensationFailed { step, .. }
            | Transition::CompensationCompleted { step }
            | Transition::SagaStuck { step, .. } => Some(step),
            _ => None,
        }
    }

    /// Flattens the transition into the columns the built-in logs store.
    pub(crate) fn encode(&self) -> Encoded {
        let step = self.step();
        let (attempt, data) = match self {
            Transition::StepCompleted { output, .. } => (None, Some(output.to_string())),
            Transition::StepFailed { error, .. }
            | Transition::SagaStuck { error, .. }
            | Transition::RecoveryFailed { error } => (None, Some(error.clone())),
            Transition::CompensationStarted { attempt, .. } => (Some(*attempt), None),
            Transition::CompensationFailed { attempt, error, .. } => {
                (Some(*attempt), Some(error.clone()))
            }
            Transition::Claimed { owner } => (None, Some(owner.clone())),
            _ => (None, None),
        };
        Encoded {
            kind: self.kind(),
            step: step.map(|s| s.index as i64),
            step_name: step.map(|s| s.name.clone()),
            attempt: attempt.map(i64::from),
            data,
        }
    }

    /// The inverse of [`encode`](Self::encode); describes what is wrong on failure.
    pub(crate) fn decode(
        kind: &str,
        step: Option<i64>,
        step_name: Option<String>,
        attempt: Option<i64>,
        data: Option<String>,
    ) -> Result<Self, String> {
        let step_ref = || -> Result<StepRef, String> {
            let index = step.ok_or_else(|| format!("`{kind}` transition without a step"))?;
            let index = usize::try_from(index).map_err(|_| format!("negative step {index}"))?;
            Ok(StepRef::new(index, step_name.clone().unwrap_or_default()))
        };
        let attempt = || -> Result<u32, String> {
            let value = attempt.ok_or_else(|| format!("`{kind}` transition without attempt"))?;
            u32::try_from(value).map_err(|_| format!("invalid attempt {value}"))
        };
        let text = || data.clone().unwrap_or_default();
        Ok(match kind {
            "saga_started" => Transition::SagaStarted,
            "step_started" => Transition::StepStarted { step: step_ref()? },
            "step_completed" => {
                let raw = data
                    .as_deref()
                    .ok_or("`step_completed` transition without output")?;
                let output = serde_json::from_str(raw)
                    .map_err(|e| format!("step output is not valid json: {e}"))?;
                Transition::StepCompleted {
                    step: step_ref()?,
                    output,
                }
            }
            "step_failed" => Transition::StepFailed {
                step: step_ref()?,
                error: text(),
            },
            "deadline_exceeded" => Transition::DeadlineExceeded { step: step_ref()? },
            "compensation_started" => Transition::CompensationStarted {
                step: step_ref()?,
                attempt: attempt()?,
            },
            "compensation_failed" => Transition::CompensationFailed {
                step: step_ref()?,
                attempt: attempt()?,
                error: text(),
            },
            "compensation_completed" => Transition::CompensationCompleted { step: step_ref()? },
            "saga_completed" => Transition::SagaCompleted,
            "saga_compensated" => Transition::SagaCompensated,
            "saga_stuck" => Transition::SagaStuck {
                step: step_ref()?,
                error: text(),
            },
            "claimed" => Transition::Claimed { owner: text() },
            "operator_resumed" => Transition::OperatorResumed,
            "recovery_failed" => Transition::RecoveryFailed { error: text() },
            other => return Err(format!("unknown transition kind {other:?}")),
        })
    }
}

/// A transition's columns in the built-in logs.
#[derive(Debug, Clone)]
pub(crate) struct Encoded {
    pub(crate) kind: &'static str,
    pub(crate) step: Option<i64>,
    pub(crate) step_name: Option<String>,
    pub(crate) attempt: Option<i64>,
    pub(crate) data: Option<String>,
}

/// A transition as read back from the log.
#[derive(Clone, Debug, PartialEq)]
pub struct TransitionRecord {
    /// Position in the saga's history, from 0, without gaps.
    pub seq: u32,
    /// When it was committed (the orchestrator's clock).
    pub at: SystemTime,
    /// What happened.
    pub transition: Transition,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_transition_round_trips_through_columns() {
        let step = StepRef::new(2, "ship");
        let all = vec![
            Transition::SagaStarted,
            Transition::StepStarted { step: step.clone() },
            Transition::StepCompleted {
                step: step.clone(),
                output: serde_json::json!({"tracking": "x1", "n": [1, 2]}),
            },
            Transition::StepFailed {
                step: step.clone(),
                error: "boom".into(),
            },
            Transition::DeadlineExceeded { step: step.clone() },
            Transition::CompensationStarted {
                step: step.clone(),
                attempt: 3,
            },
            Transition::CompensationFailed {
                step: step.clone(),
                attempt: 3,
                error: "nope".into(),
            },
            Transition::CompensationCompleted { step: step.clone() },
            Transition::SagaCompleted,
            Transition::SagaCompensated,
            Transition::SagaStuck {
                step,
                error: "still no".into(),
            },
            Transition::Claimed {
                owner: "worker-1".into(),
            },
            Transition::OperatorResumed,
            Transition::RecoveryFailed {
                error: "bad input".into(),
            },
        ];
        for t in all {
            let e = t.encode();
            let back = Transition::decode(e.kind, e.step, e.step_name, e.attempt, e.data).unwrap();
            assert_eq!(back, t);
        }
    }

    #[test]
    fn decode_rejects_garbage_without_panicking() {
        assert!(Transition::decode("nonsense", None, None, None, None).is_err());
        assert!(Transition::decode("step_started", None, None, None, None).is_err());
        assert!(Transition::decode("step_started", Some(-1), None, None, None).is_err());
        assert!(
            Transition::decode("step_completed", Some(0), None, None, Some("{".into())).is_err()
        );
        assert!(Transition::decode("compensation_started", Some(0), None, Some(-3), None).is_err());
    }

    #[test]
    fn status_parses_back() {
        for s in SagaStatus::ALL {
            assert_eq!(s.as_str().parse::<SagaStatus>().unwrap(), s);
        }
        assert!("done".parse::<SagaStatus>().is_err());
    }
}
