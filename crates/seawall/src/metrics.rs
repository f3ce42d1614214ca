//! Metrics (feature `metrics`): counters, a gauge and histograms through the
//! [`metrics`](https://docs.rs/metrics) facade, so any exporter (Prometheus,
//! StatsD, OpenTelemetry, ...) can publish them.
//!
//! Metrics are an event listener: add it with
//! [`PipelineBuilder::with_metrics`], or pass [`listener()`] to
//! [`on_event`](PipelineBuilder::on_event). They are recorded by the
//! recorder installed when the event happens.
//!
//! ```
//! use std::time::Duration;
//! use seawall::{Pipeline, Retry};
//!
//! let pipeline = Pipeline::builder("users-api")
//!     .retry(Retry::constant(Duration::from_millis(1)).max_attempts(2))
//!     .with_metrics()
//!     .build()?;
//! pipeline.call(|_ctx| Ok::<_, std::io::Error>(()))?;
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```
//!
//! # Metrics
//! Every metric has the label `resource`, the pipeline's name, and, when
//! enabled by [`MetricsConfig::partition_label`], the label `partition`
//! (the partition key; off by default: one series per key can be many).
//!
//! | name | kind | labels | what |
//! | --- | --- | --- | --- |
//! | `seawall_calls_total` | counter | `outcome` | calls ended, by outcome: `success`, `fallback`, `failure`, `timeout`, `rejected`, `store_failure` |
//! | `seawall_call_duration_seconds` | histogram | `outcome` | time of a whole call, retries and fallback included |
//! | `seawall_attempt_duration_seconds` | histogram | `outcome` | time of an attempt (the operation only), by outcome: `success`, `failure`, `timeout` |
//! | `seawall_retries_total` | counter | | retries scheduled |
//! | `seawall_retry_give_ups_total` | counter | `reason` | retries stopped before attempts ran out: `deadline`, `budget` |
//! | `seawall_rejections_total` | counter | `reason` | calls refused by a policy, by [`RejectionReason`](crate::RejectionReason): `circuit_open`, `bulkhead_full`, `rate_limited`, `cooldown_active`, `cooldown_exceeds_deadline`, `retry_budget_exhausted` |
//! | `seawall_deferrals_total` | counter | `reason` | calls made to wait for a bulkhead slot, a cooldown or a rate-limit permit |
//! | `seawall_timeouts_total` | counter | | attempts or calls that ran out of time |
//! | `seawall_deadline_exceeded_total` | counter | | sync calls whose success came after the deadline and was kept |
//! | `seawall_fallbacks_total` | counter | | calls whose result came from the fallback |
//! | `seawall_cooldowns_total` | counter | | cooldowns opened or extended by a retry-after hint |
//! | `seawall_circuit_transitions_total` | counter | `state` | circuit transitions, by the state entered: `open`, `half_open`, `closed`, `isolated` |
//! | `seawall_circuit_state` | gauge | | the circuit's state: `0` closed, `1` open, `2` half-open, `3` isolated |
//! | `seawall_store_errors_total` | counter | `degraded` | state store failures; `degraded="true"` when the call went on with local state |
//!
//! Durations are in seconds. The circuit gauge is set on each transition,
//! so it appears with the first one. A circuit forced open by
//! [`Pipeline::isolate`](crate::Pipeline::isolate) reads `3`; one forced
//! closed by [`Pipeline::force_close`](crate::Pipeline::force_close) reads
//! `0`, like a closed one (its event is the same as a close).
//!
//! Call [`describe`] once after installing the recorder to publish units
//! and descriptions.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ::metrics::{Label, Unit};

use crate::context::intern;
use crate::event::{Event, EventKind, GiveUpReason};
use crate::pipeline::{Kind, PipelineBuilder};

const CALLS: &str = "seawall_calls_total";
const CALL_DURATION: &str = "seawall_call_duration_seconds";
const ATTEMPT_DURATION: &str = "seawall_attempt_duration_seconds";
const RETRIES: &str = "seawall_retries_total";
const GIVE_UPS: &str = "seawall_retry_give_ups_total";
const REJECTIONS: &str = "seawall_rejections_total";
const DEFERRALS: &str = "seawall_deferrals_total";
const TIMEOUTS: &str = "seawall_timeouts_total";
const DEADLINE_EXCEEDED: &str = "seawall_deadline_exceeded_total";
const FALLBACKS: &str = "seawall_fallbacks_total";
const COOLDOWNS: &str = "seawall_cooldowns_total";
const TRANSITIONS: &str = "seawall_circuit_transitions_total";
const CIRCUIT_STATE: &str = "seawall_circuit_state";
const STORE_ERRORS: &str = "seawall_store_errors_total";

/// The options of the metrics listener.
///
/// # Default
/// No `partition` label.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsConfig {
    partition: bool,
}

impl MetricsConfig {
    /// The default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the label `partition` (the partition key) to every metric of a
    /// partitioned call. Each key becomes a series of its own: enable it
    /// only for a small, bounded set of keys.
    pub fn partition_label(mut self, enabled: bool) -> Self {
        self.partition = enabled;
        self
    }

    /// The listener recording the metrics, for
    /// [`PipelineBuilder::on_event`].
    pub fn listener(self) -> impl Fn(&Event<'_>) + Send + Sync + 'static {
        let sink = Arc::new(Sink {
            config: self,
            resource: OnceLock::new(),
        });
        move |event: &Event<'_>| sink.record(event)
    }
}

/// The listener recording the metrics with the default options; see
/// [`MetricsConfig::listener`].
pub fn listener() -> impl Fn(&Event<'_>) + Send + Sync + 'static {
    MetricsConfig::new().listener()
}

impl<K: Kind> PipelineBuilder<K> {
    /// Records the pipeline's [metrics](crate::metrics) (feature `metrics`).
    pub fn with_metrics(self) -> Self {
        self.on_event(listener())
    }

    /// Records the pipeline's [metrics](crate::metrics) with options
    /// (feature `metrics`).
    pub fn with_metrics_config(self, config: MetricsConfig) -> Self {
        self.on_event(config.listener())
    }
}

/// Publishes the unit and description of every metric to the installed
/// recorder.
pub fn describe() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(CALLS, Unit::Count, "Calls ended, by outcome");
    describe_histogram!(
        CALL_DURATION,
        Unit::Seconds,
        "Time of a whole call, retries and fallback included"
    );
    describe_histogram!(
        ATTEMPT_DURATION,
        Unit::Seconds,
        "Time of one attempt of the operation, by outcome"
    );
    describe_counter!(RETRIES, Unit::Count, "Retries scheduled");
    describe_counter!(
        GIVE_UPS,
        Unit::Count,
        "Retries stopped before the attempts ran out, by reason"
    );
    describe_counter!(
        REJECTIONS,
        Unit::Count,
        "Calls refused by a policy, by reason"
    );
    describe_counter!(
        DEFERRALS,
        Unit::Count,
        "Calls made to wait by a policy, by reason"
    );
    describe_counter!(
        TIMEOUTS,
        Unit::Count,
        "Attempts or calls that ran out of time"
    );
    describe_counter!(
        DEADLINE_EXCEEDED,
        Unit::Count,
        "Synchronous successes kept although they came after the deadline"
    );
    describe_counter!(
        FALLBACKS,
        Unit::Count,
        "Calls whose result came from the fallback"
    );
    describe_counter!(
        COOLDOWNS,
        Unit::Count,
        "Cooldowns opened or extended by a retry-after hint"
    );
    describe_counter!(
        TRANSITIONS,
        Unit::Count,
        "Circuit transitions, by the state entered"
    );
    describe_gauge!(
        CIRCUIT_STATE,
        "Circuit state: 0 closed, 1 open, 2 half-open, 3 isolated"
    );
    describe_counter!(
        STORE_ERRORS,
        Unit::Count,
        "State store failures; degraded when the call went on with local state"
    );
}

struct Sink {
    config: MetricsConfig,
    /// The first resource seen: most listeners serve one pipeline, whose
    /// name then costs no lookup.
    resource: OnceLock<&'static str>,
}

impl Sink {
    fn resource(&self, name: &str) -> &'static str {
        let first = *self.resource.get_or_init(|| intern(name));
        if first == name {
            first
        } else {
            intern(name)
        }
    }

    fn labels(&self, event: &Event<'_>, extra: Option<(&'static str, &'static str)>) -> Vec<Label> {
        let mut labels = Vec::with_capacity(3);
        labels.push(Label::from_static_parts(
            "resource",
            self.resource(event.resource),
        ));
        if let Some((k, v)) = extra {
            labels.push(Label::from_static_parts(k, v));
        }
        if self.config.partition {
            if let Some(p) = event.partition {
                labels.push(Label::new("partition", p.to_string()));
            }
        }
        labels
    }

    fn count(
        &self,
        event: &Event<'_>,
        name: &'static str,
        extra: Option<(&'static str, &'static str)>,
    ) {
        ::metrics::counter!(name, self.labels(event, extra)).increment(1);
    }

    fn seconds(&self, event: &Event<'_>, name: &'static str, outcome: &'static str, d: Duration) {
        ::metrics::histogram!(name, self.labels(event, Some(("outcome", outcome))))
            .record(d.as_secs_f64());
    }

    fn circuit(&self, event: &Event<'_>, state: &'static str, value: f64) {
        self.count(event, TRANSITIONS, Some(("state", state)));
        ::metrics::gauge!(CIRCUIT_STATE, self.labels(event, None)).set(value);
    }

    fn record(&self, event: &Event<'_>) {
        match &event.kind {
            EventKind::CallFinished {
                duration, outcome, ..
            } => {
                let outcome = outcome.as_str();
                self.count(event, CALLS, Some(("outcome", outcome)));
                self.seconds(event, CALL_DURATION, outcome, *duration);
            }
            EventKind::AttemptFinished {
                duration, outcome, ..
            } => self.seconds(event, ATTEMPT_DURATION, outcome.as_str(), *duration),
            EventKind::RetryScheduled { .. } => self.count(event, RETRIES, None),
            EventKind::RetryGaveUp { reason, .. } => {
                let reason = match reason {
                    GiveUpReason::Deadline => "deadline",
                    GiveUpReason::Budget => "budget",
                };
                self.count(event, GIVE_UPS, Some(("reason", reason)));
            }
            EventKind::Rejected { reason, .. } => {
                self.count(event, REJECTIONS, Some(("reason", reason.as_str())))
            }
            EventKind::Deferred { reason, .. } => {
                self.count(event, DEFERRALS, Some(("reason", reason.as_str())))
            }
            EventKind::TimedOut { .. } => self.count(event, TIMEOUTS, None),
            EventKind::DeadlineExceeded { .. } => self.count(event, DEADLINE_EXCEEDED, None),
            EventKind::FallbackExecuted => self.count(event, FALLBACKS, None),
            EventKind::CooldownStarted { .. } => self.count(event, COOLDOWNS, None),
            // `isolate` opens the circuit for good: an unbounded cooldown.
            EventKind::CircuitOpened { cooldown } if *cooldown == Duration::MAX => {
                self.circuit(event, "isolated", 3.0)
            }
            EventKind::CircuitOpened { .. } => self.circuit(event, "open", 1.0),
            EventKind::CircuitHalfOpened => self.circuit(event, "half_open", 2.0),
            EventKind::CircuitClosed => self.circuit(event, "closed", 0.0),
            EventKind::StoreUnavailable { degraded, .. } => self.count(
                event,
                STORE_ERRORS,
                Some(("degraded", if *degraded { "true" } else { "false" })),
            ),
        }
    }
}
