//! Saga statuses and the transitions recorded in the log.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::orchestrator::StepFailure;

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
    /// A compensation marked [continue-on-error](crate::Step::continue_on_error)
    /// failed all its attempts; compensation goes on without it.
    CompensationAbandoned {
        /// The step whose compensation was given up.
        step: StepRef,
        /// The last error's message.
        error: String,
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
            Transition::CompensationAbandoned { .. } => "compensation_abandoned",
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
            | Transition::CompensationAbandoned { step, .. }
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
            | Transition::CompensationAbandoned { error, .. }
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
            "compensation_abandoned" => Transition::CompensationAbandoned {
                step: step_ref()?,
                error: text(),
            },
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
    /// When it was committed (the orchestrator's clock, to the millisecond).
    pub at: SystemTime,
    /// What happened.
    pub transition: Transition,
}

/// A saga's state, as its transitions make it: the one place that says what
/// each transition does.
///
/// The orchestrator applies every transition it records, before committing it,
/// and rebuilds the state of a claimed saga by applying its logged history in
/// order ([`replay`](Progress::replay)): the two can not disagree. The status
/// written to the log with a commit is the status after its transitions.
/// A transition that does not follow from the state (a step of a later stage
/// started early, a compensation of a step that never completed, anything but
/// a claim after the saga finished) is refused with a description.
///
/// Steps run in stages (a single step or a parallel group). A step failure
/// makes the saga compensate once no step of its stage is still running: the
/// others are awaited, and a completed one is compensated with the rest.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Progress {
    /// The step ranges of the stages, in order.
    stages: Arc<[Range<usize>]>,
    applied: u32,
    status: SagaStatus,
    outputs: Vec<Option<serde_json::Value>>,
    /// Steps whose start is logged and whose end is not.
    running: Vec<bool>,
    compensated: Vec<bool>,
    abandoned: Vec<StepFailure>,
    attempts: Vec<u32>,
    failure: Option<StepFailure>,
    stuck: Option<StepFailure>,
}

impl Progress {
    /// A saga whose stages hold the steps `stages` (consecutive ranges from
    /// step 0), before its first transition.
    pub(crate) fn new(stages: Arc<[Range<usize>]>) -> Self {
        let steps = stages.last().map_or(0, |stage| stage.end);
        Progress {
            stages,
            applied: 0,
            status: SagaStatus::Running,
            outputs: vec![None; steps],
            running: vec![false; steps],
            compensated: vec![false; steps],
            abandoned: Vec::new(),
            attempts: vec![0; steps],
            failure: None,
            stuck: None,
        }
    }

    /// The state after `history`, which must be numbered from 0 without gaps.
    pub(crate) fn replay(
        history: &[TransitionRecord],
        stages: Arc<[Range<usize>]>,
    ) -> Result<Self, String> {
        let mut progress = Progress::new(stages);
        for record in history {
            if record.seq != progress.applied {
                return Err(format!(
                    "transition {} has sequence number {}",
                    progress.applied, record.seq
                ));
            }
            progress
                .apply(&record.transition)
                .map_err(|detail| format!("transition {}: {detail}", record.seq))?;
        }
        Ok(progress)
    }

    /// Applies one transition, or says why it does not follow (the state is
    /// then unchanged).
    pub(crate) fn apply(&mut self, transition: &Transition) -> Result<(), String> {
        use SagaStatus::{Compensated, Compensating, Completed, Running, Stuck};
        let kind = transition.kind();
        let steps = self.outputs.len();
        if let Some(step) = transition.step() {
            if step.index >= steps {
                return Err(format!(
                    "`{kind}` names step {} but the saga has {steps} steps",
                    step.index
                ));
            }
        }
        let first = self.applied == 0;
        if first != matches!(transition, Transition::SagaStarted) {
            return Err(if first {
                format!("the history starts with `{kind}`, not `saga_started`")
            } else {
                "`saga_started` after the start".to_owned()
            });
        }
        let expect = |allowed: &[SagaStatus]| -> Result<(), String> {
            if allowed.contains(&self.status) {
                Ok(())
            } else {
                Err(format!("`{kind}` while the saga is {}", self.status))
            }
        };
        let current = self.current_stage().map(|stage| self.stages[stage].clone());
        let in_current = |index: usize| -> Result<(), String> {
            match &current {
                Some(stage) if stage.contains(&index) => Ok(()),
                _ => Err(format!(
                    "`{kind}` of step {index}, which is not in the stage that runs"
                )),
            }
        };
        let completed = |index: usize| -> Result<(), String> {
            if self.outputs[index].is_some() {
                Ok(())
            } else {
                Err(format!("`{kind}` of step {index}, which has not completed"))
            }
        };
        let running = |index: usize| -> Result<(), String> {
            if self.running[index] {
                Ok(())
            } else {
                Err(format!("`{kind}` of step {index}, which was not started"))
            }
        };
        let settled = |index: usize| self.compensated[index] || self.is_abandoned(index);
        match transition {
            Transition::SagaStarted => {}
            Transition::StepStarted { step } => {
                expect(&[Running])?;
                in_current(step.index)?;
                if self.outputs[step.index].is_some() {
                    return Err(format!("step {} started after it completed", step.index));
                }
                // After a failure only the steps still running start again
                // (after a crash), to learn how they ended.
                if self.failure.is_some() && !self.running[step.index] {
                    return Err(format!("step {} started after a failure", step.index));
                }
                self.running[step.index] = true;
            }
            Transition::StepCompleted { step, output } => {
                expect(&[Running])?;
                running(step.index)?;
                self.running[step.index] = false;
                self.outputs[step.index] = Some(output.clone());
                self.settle();
            }
            Transition::StepFailed { step, error } => {
                expect(&[Running])?;
                running(step.index)?;
                self.running[step.index] = false;
                self.failure.get_or_insert_with(|| StepFailure {
                    step: step.clone(),
                    error: error.clone(),
                    deadline_exceeded: false,
                });
                self.settle();
            }
            Transition::DeadlineExceeded { step } => {
                // The orchestrator records it before a stage starts. A
                // history written by an earlier release may hold it after a
                // crash during a stage: its running steps then do not start
                // again.
                expect(&[Running])?;
                in_current(step.index)?;
                if self.failure.is_some() || self.outputs[step.index].is_some() {
                    return Err(format!(
                        "deadline before step {}, which is done",
                        step.index
                    ));
                }
                self.running.iter_mut().for_each(|r| *r = false);
                self.failure = Some(StepFailure::deadline(step.clone()));
                self.status = Compensating;
            }
            Transition::CompensationStarted { step, attempt } => {
                expect(&[Compensating])?;
                completed(step.index)?;
                if settled(step.index) {
                    return Err(format!("step {} compensated twice", step.index));
                }
                if *attempt != self.attempts[step.index] + 1 {
                    return Err(format!(
                        "compensation attempt {attempt} of step {} follows attempt {}",
                        step.index, self.attempts[step.index]
                    ));
                }
                self.attempts[step.index] = *attempt;
            }
            Transition::CompensationFailed { step, attempt, .. } => {
                expect(&[Compensating])?;
                completed(step.index)?;
                if *attempt != self.attempts[step.index] || *attempt == 0 || settled(step.index) {
                    return Err(format!(
                        "compensation attempt {attempt} of step {} failed but was not started",
                        step.index
                    ));
                }
            }
            Transition::CompensationCompleted { step }
            | Transition::CompensationAbandoned { step, .. } => {
                expect(&[Compensating])?;
                completed(step.index)?;
                if self.attempts[step.index] == 0 || settled(step.index) {
                    return Err(format!(
                        "compensation of step {} ended but was not running",
                        step.index
                    ));
                }
                match transition {
                    Transition::CompensationAbandoned { error, .. } => {
                        self.abandoned.push(StepFailure {
                            step: step.clone(),
                            error: error.clone(),
                            deadline_exceeded: false,
                        })
                    }
                    _ => self.compensated[step.index] = true,
                }
            }
            Transition::SagaCompleted => {
                expect(&[Running])?;
                if let Some(stage) = current {
                    return Err(format!(
                        "saga completed before step {} completed",
                        stage.start
                    ));
                }
                self.status = Completed;
            }
            Transition::SagaCompensated => {
                expect(&[Compensating])?;
                self.status = Compensated;
            }
            Transition::SagaStuck { step, error } => {
                expect(&[Compensating])?;
                completed(step.index)?;
                self.status = Stuck;
                self.stuck = Some(StepFailure {
                    step: step.clone(),
                    error: error.clone(),
                    deadline_exceeded: false,
                });
            }
            Transition::OperatorResumed => {
                expect(&[Stuck])?;
                self.status = Compensating;
                self.stuck = None;
                self.attempts.iter_mut().for_each(|a| *a = 0);
            }
            Transition::Claimed { .. } | Transition::RecoveryFailed { .. } => {}
        }
        self.applied += 1;
        Ok(())
    }

    /// A step failed and none of its stage still runs: compensate.
    fn settle(&mut self) {
        if self.failure.is_some() && !self.running.contains(&true) {
            self.status = SagaStatus::Compensating;
        }
    }

    /// How many transitions were applied: the sequence number of the next one.
    pub(crate) fn applied(&self) -> u32 {
        self.applied
    }

    /// Where the saga stands.
    pub(crate) fn status(&self) -> SagaStatus {
        self.status
    }

    /// The first stage with a step not completed, if any.
    pub(crate) fn current_stage(&self) -> Option<usize> {
        self.stages
            .iter()
            .position(|stage| stage.clone().any(|i| self.outputs[i].is_none()))
    }

    /// The output of step `index`, if it completed.
    pub(crate) fn output(&self, index: usize) -> Option<&serde_json::Value> {
        self.outputs[index].as_ref()
    }

    /// Whether step `index` was started and has not ended (as far as the log knows).
    pub(crate) fn is_running(&self, index: usize) -> bool {
        self.running[index]
    }

    /// Whether step `index`'s compensation completed or was abandoned.
    pub(crate) fn is_settled(&self, index: usize) -> bool {
        self.compensated[index] || self.is_abandoned(index)
    }

    fn is_abandoned(&self, index: usize) -> bool {
        self.abandoned.iter().any(|a| a.step.index == index)
    }

    /// The compensation attempts of step `index` since the last operator resume.
    pub(crate) fn attempts(&self, index: usize) -> u32 {
        self.attempts[index]
    }

    /// The step failure (or missed deadline) that made the saga compensate:
    /// the first one, when several steps of a group failed.
    pub(crate) fn failure(&self) -> Option<&StepFailure> {
        self.failure.as_ref()
    }

    /// The compensation that failed all its attempts, while stuck.
    pub(crate) fn stuck(&self) -> Option<&StepFailure> {
        self.stuck.as_ref()
    }

    /// The continue-on-error compensations that failed all their attempts.
    pub(crate) fn abandoned(&self) -> &[StepFailure] {
        &self.abandoned
    }
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
            Transition::CompensationAbandoned {
                step: step.clone(),
                error: "gone".into(),
            },
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

    /// Stages of one step each.
    fn seq(steps: usize) -> Arc<[Range<usize>]> {
        (0..steps).map(|i| i..i + 1).collect()
    }

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

    fn started(i: usize) -> Transition {
        Transition::StepStarted { step: step(i) }
    }

    fn completed(i: usize) -> Transition {
        Transition::StepCompleted {
            step: step(i),
            output: serde_json::json!(i),
        }
    }

    fn compensation(i: usize, attempt: u32) -> Transition {
        Transition::CompensationStarted {
            step: step(i),
            attempt,
        }
    }

    #[test]
    fn replay_of_a_crash_mid_step_reruns_that_step() {
        let h = history(vec![
            Transition::SagaStarted,
            started(0),
            completed(0),
            started(1),
        ]);
        let p = Progress::replay(&h, seq(3)).unwrap();
        assert_eq!(p.status(), SagaStatus::Running);
        assert_eq!(p.output(0), Some(&serde_json::json!(0)));
        assert_eq!(p.output(1), None);
        assert_eq!(p.applied(), 4);
        // The step runs again after the claim: started twice, completed once.
        let mut again = p.clone();
        for t in [
            Transition::Claimed { owner: "w".into() },
            started(1),
            completed(1),
        ] {
            again.apply(&t).unwrap();
        }
        assert!(again.output(1).is_some());
    }

    #[test]
    fn replay_of_compensation_tracks_attempts_and_done_steps() {
        let h = history(vec![
            Transition::SagaStarted,
            started(0),
            completed(0),
            started(1),
            completed(1),
            started(2),
            Transition::StepFailed {
                step: step(2),
                error: "x".into(),
            },
            compensation(1, 1),
            Transition::CompensationCompleted { step: step(1) },
            compensation(0, 1),
            Transition::CompensationFailed {
                step: step(0),
                attempt: 1,
                error: "y".into(),
            },
        ]);
        let p = Progress::replay(&h, seq(3)).unwrap();
        assert_eq!(p.status(), SagaStatus::Compensating);
        assert!(!p.is_settled(0) && p.is_settled(1) && !p.is_settled(2));
        assert_eq!([p.attempts(0), p.attempts(1), p.attempts(2)], [1, 1, 0]);
        assert_eq!(p.failure().unwrap().step, step(2));
    }

    /// The status follows from the transitions alone: every one of them,
    /// applied in order, leads to the status the orchestrator commits.
    #[test]
    fn the_status_follows_from_the_transitions() {
        let mut p = Progress::new(seq(2));
        let steps = [
            (Transition::SagaStarted, SagaStatus::Running),
            (started(0), SagaStatus::Running),
            (completed(0), SagaStatus::Running),
            (started(1), SagaStatus::Running),
            (
                Transition::StepFailed {
                    step: step(1),
                    error: "no".into(),
                },
                SagaStatus::Compensating,
            ),
            (compensation(0, 1), SagaStatus::Compensating),
            (
                Transition::CompensationFailed {
                    step: step(0),
                    attempt: 1,
                    error: "down".into(),
                },
                SagaStatus::Compensating,
            ),
            (
                Transition::SagaStuck {
                    step: step(0),
                    error: "down".into(),
                },
                SagaStatus::Stuck,
            ),
            (Transition::OperatorResumed, SagaStatus::Compensating),
            (compensation(0, 1), SagaStatus::Compensating),
            (
                Transition::CompensationCompleted { step: step(0) },
                SagaStatus::Compensating,
            ),
            (Transition::SagaCompensated, SagaStatus::Compensated),
            (
                Transition::Claimed { owner: "w".into() },
                SagaStatus::Compensated,
            ),
        ];
        for (i, (t, status)) in steps.iter().enumerate() {
            p.apply(t).unwrap_or_else(|e| panic!("transition {i}: {e}"));
            assert_eq!(p.status(), *status, "after transition {i} ({})", t.kind());
        }
        assert!(p.stuck().is_none());
        assert_eq!(p.applied(), steps.len() as u32);
    }

    #[test]
    fn replay_rejects_histories_that_do_not_fit() {
        let gap = vec![TransitionRecord {
            seq: 1,
            at: SystemTime::UNIX_EPOCH,
            transition: Transition::SagaStarted,
        }];
        assert!(Progress::replay(&gap, seq(1)).is_err());
        let refused = |transitions: Vec<Transition>, steps: usize| {
            let error = Progress::replay(&history(transitions.clone()), seq(steps))
                .expect_err(&format!("accepted {transitions:?}"));
            assert!(!error.is_empty());
        };
        // A step the definition does not have; steps out of order.
        refused(vec![Transition::SagaStarted, started(5)], 3);
        refused(vec![Transition::SagaStarted, started(1)], 3);
        // No start, or two.
        refused(vec![started(0)], 3);
        refused(vec![Transition::SagaStarted, Transition::SagaStarted], 3);
        // Completed without being started.
        refused(vec![Transition::SagaStarted, completed(0)], 3);
        // The saga completed with steps missing.
        refused(
            vec![
                Transition::SagaStarted,
                started(0),
                completed(0),
                Transition::SagaCompleted,
            ],
            3,
        );
        // A step started after the saga began compensating.
        refused(
            vec![
                Transition::SagaStarted,
                started(0),
                Transition::StepFailed {
                    step: step(0),
                    error: "x".into(),
                },
                started(0),
            ],
            3,
        );
        // A compensation while running, of a step that never completed, twice.
        refused(
            vec![
                Transition::SagaStarted,
                started(0),
                completed(0),
                compensation(0, 1),
            ],
            3,
        );
        let failed_at_1 = vec![
            Transition::SagaStarted,
            started(0),
            completed(0),
            started(1),
            Transition::StepFailed {
                step: step(1),
                error: "x".into(),
            },
        ];
        refused([failed_at_1.clone(), vec![compensation(1, 1)]].concat(), 3);
        refused(
            [
                failed_at_1.clone(),
                vec![
                    compensation(0, 1),
                    Transition::CompensationCompleted { step: step(0) },
                    compensation(0, 2),
                ],
            ]
            .concat(),
            3,
        );
        // An attempt number that skips one; an operator resume of a saga
        // that is not stuck; anything but a claim after the end.
        refused([failed_at_1.clone(), vec![compensation(0, 2)]].concat(), 3);
        refused(
            [failed_at_1.clone(), vec![Transition::OperatorResumed]].concat(),
            3,
        );
        refused(
            [
                failed_at_1,
                vec![Transition::SagaCompensated, compensation(0, 1)],
            ]
            .concat(),
            3,
        );
    }

    /// A history that records the deadline while step 1 ran (after a crash
    /// during it; the orchestrator runs such a step again before it checks
    /// the deadline) is still read:
    /// step 1 does not start again, the saga compensates.
    #[test]
    fn a_deadline_after_a_crash_mid_step_compensates() {
        let mut p = Progress::replay(
            &history(vec![
                Transition::SagaStarted,
                started(0),
                completed(0),
                started(1),
            ]),
            seq(3),
        )
        .unwrap();
        p.apply(&Transition::Claimed { owner: "w".into() }).unwrap();
        p.apply(&Transition::DeadlineExceeded { step: step(1) })
            .unwrap();
        assert_eq!(p.status(), SagaStatus::Compensating);
        assert!(p.failure().unwrap().deadline_exceeded);
        assert!(p.apply(&completed(1)).is_err());
    }

    #[test]
    fn a_refused_transition_leaves_the_state_as_it_was() {
        let mut p = Progress::replay(
            &history(vec![Transition::SagaStarted, started(0), completed(0)]),
            seq(2),
        )
        .unwrap();
        let before = p.clone();
        assert!(p.apply(&Transition::SagaCompleted).is_err());
        assert!(p.apply(&completed(0)).is_err());
        assert_eq!(p, before);
    }

    /// Step 0, then steps 1 and 2 in parallel, then step 3.
    fn grouped() -> Arc<[Range<usize>]> {
        vec![0..1, 1..3, 3..4].into()
    }

    fn failed(i: usize) -> Transition {
        Transition::StepFailed {
            step: step(i),
            error: "no".into(),
        }
    }

    /// A group's steps run together; the saga compensates once none of them
    /// runs any more, and compensates the ones that completed.
    #[test]
    fn a_failure_in_a_group_waits_for_the_others() {
        let mut p = Progress::new(grouped());
        for t in [
            Transition::SagaStarted,
            started(0),
            completed(0),
            started(1),
            started(2),
        ] {
            p.apply(&t).unwrap();
        }
        // A step of the next stage cannot start before the group is done.
        assert!(p.clone().apply(&started(3)).is_err());
        p.apply(&failed(1)).unwrap();
        assert_eq!(p.status(), SagaStatus::Running, "step 2 still runs");
        assert!(p.clone().apply(&compensation(0, 1)).is_err());
        // The failure recorded before a crash: step 2 runs again, nothing new starts.
        let mut after_crash = p.clone();
        after_crash.apply(&started(2)).unwrap();
        assert!(after_crash.apply(&started(1)).is_err());
        p.apply(&completed(2)).unwrap();
        assert_eq!(p.status(), SagaStatus::Compensating);
        assert_eq!(p.failure().unwrap().step, step(1));
        // Step 2 completed: it is compensated, concurrently with nothing else
        // of its stage; step 1 failed: it is not.
        p.apply(&compensation(2, 1)).unwrap();
        assert!(p.clone().apply(&compensation(1, 1)).is_err());
        p.apply(&Transition::CompensationCompleted { step: step(2) })
            .unwrap();
        p.apply(&compensation(0, 1)).unwrap();
        p.apply(&Transition::CompensationFailed {
            step: step(0),
            attempt: 1,
            error: "down".into(),
        })
        .unwrap();
        p.apply(&Transition::CompensationAbandoned {
            step: step(0),
            error: "down".into(),
        })
        .unwrap();
        assert!(p.is_settled(0) && p.is_settled(2));
        assert_eq!(p.abandoned().len(), 1);
        assert!(p.clone().apply(&compensation(0, 2)).is_err());
        p.apply(&Transition::SagaCompensated).unwrap();
        assert_eq!(p.status(), SagaStatus::Compensated);
    }

    #[test]
    fn a_group_completes_when_all_its_steps_did() {
        let mut p = Progress::new(grouped());
        for t in [
            Transition::SagaStarted,
            started(0),
            completed(0),
            started(2),
            started(1),
            completed(2),
        ] {
            p.apply(&t).unwrap();
        }
        assert_eq!(p.current_stage(), Some(1));
        assert!(p.clone().apply(&Transition::SagaCompleted).is_err());
        p.apply(&completed(1)).unwrap();
        assert_eq!(p.current_stage(), Some(2));
        p.apply(&started(3)).unwrap();
        p.apply(&completed(3)).unwrap();
        p.apply(&Transition::SagaCompleted).unwrap();
        assert_eq!(p.status(), SagaStatus::Completed);
    }
}
