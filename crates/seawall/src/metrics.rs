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
//! The names and attributes follow OpenTelemetry's conventions, in the
//! manner of Polly's and seatbelt's resilience telemetry: a `resilience.`
//! namespace, dotted lower-case names, durations in seconds, every
//! resilience event counted by one counter whose attributes say which
//! pipeline, which strategy and which event.
//!
//! | name | kind | unit | attributes | what |
//! | --- | --- | --- | --- | --- |
//! | `resilience.seawall.events` | counter | `{event}` | `pipeline.name`, `strategy.name`, `event.name`, `event.severity`, and `event.reason` or `store.degraded` (table below) | resilience events: retries, rejections, circuit transitions, ... |
//! | `resilience.seawall.attempt.duration` | histogram | `s` | `pipeline.name`, `attempt.number`, `attempt.outcome` | time of one attempt (the operation only); `attempt.number` counts from 1; `attempt.outcome` is `success`, `failure` or `timeout` |
//! | `resilience.seawall.call.duration` | histogram | `s` | `pipeline.name`, `call.outcome` | time of a whole call, retries and fallback included; `call.outcome` is `success`, `fallback`, `failure`, `timeout`, `rejected` or `store_failure` |
//! | `resilience.seawall.circuit.state` | gauge | | `pipeline.name` | the circuit's state: `0` closed, `1` open, `2` half-open, `3` isolated |
//! | `resilience.seawall.concurrency.limit` | gauge | `{request}` | `pipeline.name` | the adaptive concurrency limit, set on each change |
//!
//! `pipeline.name` is the pipeline's resource name. Every metric also has
//! `pipeline.partition`, the partition key, when
//! [`MetricsConfig::partition_label`] enables it, and then only for a
//! partitioned call. It is off by default: each key becomes a series of its
//! own, so enable it only for a small, bounded set of keys. Without it the
//! circuit gauge of a partitioned pipeline reads the last transition of any
//! of its partitions.
//!
//! The number of calls is the histogram's count: a counter of calls would
//! say it twice.
//!
//! ## Events
//! `event.severity` is the level of the event's `tracing` event (see
//! [`event`](crate::event#tracing)): `trace`, `debug`, `info` or `warn`.
//! `strategy.name` is the policy's name as the builder and the
//! configuration spell it, or `fallback`, `chaos` and `store`; for a policy
//! written in code ([`crate::custom`]) its own name, and `custom` for its
//! refusals (the `rejected` event of reason `policy_refused`, which does not
//! know which policy refused: its `short_circuited` event does).
//!
//! | `event.name` | `strategy.name` | `event.severity` | more attributes |
//! | --- | --- | --- | --- |
//! | `retry_scheduled` | `retry` | `debug` | |
//! | `retry_gave_up` | `retry` | `debug` | `event.reason`: `deadline`, `budget` |
//! | `timed_out` | `timeout` | `debug` | |
//! | `deadline_exceeded` | `timeout` | `warn` | |
//! | `fallback_executed` | `fallback` | `debug` | |
//! | `chaos_injected` | `chaos` | `debug` | `chaos.kind`: `fault`, `outcome`, `latency`, `behavior` |
//! | `limit_changed` | `adaptive_limit` | `debug` | `event.direction`: `increase`, `decrease` |
//! | `coalesced` | `coalesce` | `trace` | |
//! | `coalesce_takeover` | `coalesce` | `debug` | |
//! | `cache_hit` | `coalesce` | `trace` | |
//! | `cache_miss` | `coalesce` | `trace` | |
//! | `hedge_started` | `hedging` | `debug` | `hedge.trigger`: `delay`, `failure` |
//! | `hedge_budget_exhausted` | `hedging` | `warn` | |
//! | `short_circuited` | the policy written in code | `debug` | `policy.position`: `call`, `attempt` |
//! | `rejected` | the refusing policy: `circuit_breaker`, `bulkhead`, `rate_limiter`, `cooldown`, `retry` (its budget), `adaptive_limit`, `custom` (a policy written in code) | `warn` for `bulkhead_full`, `rate_limited`, `retry_budget_exhausted`, `concurrency_limited`; `debug` for the others | `event.reason`: the [`RejectionReason`] (`circuit_open`, `bulkhead_full`, `rate_limited`, `cooldown_active`, `cooldown_exceeds_deadline`, `retry_budget_exhausted`, `concurrency_limited`, `policy_refused`) |
//! | `deferred` | the policy that made the call wait | `debug` | `event.reason`: as for `rejected` |
//! | `shadow_rejected` | the policy in [shadow mode](crate::shadow) that would have refused the call (it went on) | `debug` | `event.reason`: as for `rejected` |
//! | `circuit_opened` | `circuit_breaker` | `warn` | |
//! | `circuit_half_opened` | `circuit_breaker` | `info` | |
//! | `circuit_probes_expired` | `circuit_breaker` | `warn` | |
//! | `circuit_closed` | `circuit_breaker` | `info` | |
//! | `cooldown_started` | `cooldown` | `warn` | |
//! | `store_unavailable` | `store` | `warn` | `store.degraded`: `true` when the call went on with local state |
//!
//! The end of an attempt and of a call are the two histograms, not events.
//!
//! The circuit gauge is set on each transition, so it appears with the
//! first one; a [reload](crate::config#reloading) that replaces the circuit
//! reports its close (and one that replaces an adaptive limit, the change
//! of the limit). The series of a pipeline a reload removes are no
//! longer updated but stay in the recorder (the facade has no removal; an
//! exporter drops idle series by its own rules, such as
//! `metrics-exporter-prometheus`'s `idle_timeout`). A circuit forced open by
//! [`Pipeline::isolate`](crate::Pipeline::isolate) reads `3` (its event is
//! `circuit_opened`); one forced closed by
//! [`Pipeline::force_close`](crate::Pipeline::force_close) reads `0`, like
//! a closed one (its event is the same as a close).
//!
//! # Exporting
//! Prometheus spells the names with underscores and adds the unit and the
//! counter suffixes: `resilience_seawall_events_total`,
//! `resilience_seawall_attempt_duration_seconds`,
//! `resilience_seawall_call_duration_seconds`,
//! `resilience_seawall_circuit_state`; attribute keys become
//! `pipeline_name`, `event_name`, ... The OpenTelemetry Prometheus exporter
//! does so by itself; with `metrics-exporter-prometheus`, call [`describe`]
//! (it publishes the units) and enable
//! `PrometheusBuilder::set_enable_unit_suffix`, and give the histograms
//! buckets (`set_buckets`) to have `_bucket` series for quantiles. The
//! repository's `dashboards/seawall-grafana.json` is a Grafana dashboard
//! over these names.
//!
//! Call [`describe`] once after installing the recorder to publish units
//! and descriptions.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ::metrics::{Label, Unit};
use seawall_order::PolicyKind;

use crate::context::intern;
use crate::error::RejectionReason;
use crate::event::{Event, EventKind, GiveUpReason, Severity};
use crate::pipeline::{Kind, PipelineBuilder};

/// The counter of resilience events.
pub const EVENTS: &str = "resilience.seawall.events";
/// The histogram of attempt durations, in seconds.
pub const ATTEMPT_DURATION: &str = "resilience.seawall.attempt.duration";
/// The histogram of call durations, in seconds.
pub const CALL_DURATION: &str = "resilience.seawall.call.duration";
/// The gauge of the circuit's state.
pub const CIRCUIT_STATE: &str = "resilience.seawall.circuit.state";
/// The gauge of the adaptive concurrency limit.
pub const CONCURRENCY_LIMIT: &str = "resilience.seawall.concurrency.limit";

/// The options of the metrics listener.
///
/// # Default
/// No `pipeline.partition` attribute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsConfig {
    partition: bool,
}

impl MetricsConfig {
    /// The default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the attribute `pipeline.partition` (the partition key) to
    /// every metric of a partitioned call. Each key becomes a series of its
    /// own: enable it only for a small, bounded set of keys.
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
    describe_counter!(
        EVENTS,
        Unit::Count,
        "Resilience events, by pipeline, strategy and event"
    );
    describe_histogram!(
        ATTEMPT_DURATION,
        Unit::Seconds,
        "Time of one attempt of the operation, by attempt number and outcome"
    );
    describe_histogram!(
        CALL_DURATION,
        Unit::Seconds,
        "Time of a whole call, retries and fallback included, by outcome"
    );
    describe_gauge!(
        CIRCUIT_STATE,
        "Circuit state: 0 closed, 1 open, 2 half-open, 3 isolated"
    );
    describe_gauge!(
        CONCURRENCY_LIMIT,
        "Adaptive concurrency limit: attempts admitted at once"
    );
}

/// The `strategy.name` of a refusal by a policy written in code.
const CUSTOM: &str = "custom";

/// The `strategy.name` of the policy that refuses or defers a call for
/// `reason`.
fn refusing_strategy(reason: RejectionReason) -> &'static str {
    match reason {
        RejectionReason::CircuitOpen => PolicyKind::CircuitBreaker.name(),
        RejectionReason::BulkheadFull => PolicyKind::Bulkhead.name(),
        RejectionReason::RateLimited => PolicyKind::RateLimiter.name(),
        RejectionReason::CooldownActive | RejectionReason::CooldownExceedsDeadline => {
            PolicyKind::Cooldown.name()
        }
        RejectionReason::RetryBudgetExhausted => PolicyKind::Retry.name(),
        RejectionReason::ConcurrencyLimited => PolicyKind::AdaptiveLimit.name(),
        // Its name is in the policy's `short_circuited` event.
        RejectionReason::PolicyRefused => CUSTOM,
    }
}

/// The `event.severity` of an event: its `tracing` level.
fn severity(kind: &EventKind) -> &'static str {
    match kind.severity() {
        Severity::Trace => "trace",
        Severity::Debug => "debug",
        Severity::Info => "info",
        Severity::Warn => "warn",
    }
}

/// The circuit gauge's value for a state.
mod circuit {
    pub(super) const CLOSED: f64 = 0.0;
    pub(super) const OPEN: f64 = 1.0;
    pub(super) const HALF_OPEN: f64 = 2.0;
    pub(super) const ISOLATED: f64 = 3.0;
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

    /// `pipeline.name`, the given attributes, then `pipeline.partition`
    /// when enabled.
    fn labels(&self, event: &Event<'_>, extra: impl IntoIterator<Item = Label>) -> Vec<Label> {
        let mut labels = Vec::with_capacity(6);
        labels.push(Label::from_static_parts(
            "pipeline.name",
            self.resource(event.resource),
        ));
        labels.extend(extra);
        if self.config.partition {
            if let Some(p) = event.partition {
                labels.push(Label::new("pipeline.partition", p.to_string()));
            }
        }
        labels
    }

    /// Records an event: the one place that says which metric each event
    /// kind feeds, with which attributes (the tables of the module docs).
    fn record(&self, event: &Event<'_>) {
        let kind = &event.kind;
        let (strategy, name, detail) = match kind {
            EventKind::AttemptFinished {
                attempt,
                duration,
                outcome,
            } => {
                let labels = [
                    Label::new("attempt.number", attempt.to_string()),
                    Label::from_static_parts("attempt.outcome", outcome.as_str()),
                ];
                ::metrics::histogram!(ATTEMPT_DURATION, self.labels(event, labels))
                    .record(duration.as_secs_f64());
                return;
            }
            EventKind::CallFinished {
                duration, outcome, ..
            } => {
                let labels = [Label::from_static_parts("call.outcome", outcome.as_str())];
                ::metrics::histogram!(CALL_DURATION, self.labels(event, labels))
                    .record(duration.as_secs_f64());
                return;
            }
            EventKind::RetryScheduled { .. } => (PolicyKind::Retry.name(), "retry_scheduled", None),
            EventKind::RetryGaveUp { reason, .. } => (
                PolicyKind::Retry.name(),
                "retry_gave_up",
                Some((
                    "event.reason",
                    match reason {
                        GiveUpReason::Deadline => "deadline",
                        GiveUpReason::Budget => "budget",
                    },
                )),
            ),
            EventKind::TimedOut { .. } => (PolicyKind::Timeout.name(), "timed_out", None),
            EventKind::DeadlineExceeded { .. } => {
                (PolicyKind::Timeout.name(), "deadline_exceeded", None)
            }
            EventKind::FallbackExecuted => ("fallback", "fallback_executed", None),
            EventKind::ChaosInjected { kind, .. } => (
                crate::chaos::NAME,
                "chaos_injected",
                Some(("chaos.kind", kind.as_str())),
            ),
            EventKind::LimitChanged { previous, limit } => {
                ::metrics::gauge!(CONCURRENCY_LIMIT, self.labels(event, [])).set(f64::from(*limit));
                (
                    PolicyKind::AdaptiveLimit.name(),
                    "limit_changed",
                    Some((
                        "event.direction",
                        if limit > previous {
                            "increase"
                        } else {
                            "decrease"
                        },
                    )),
                )
            }
            EventKind::Coalesced => (crate::coalesce::NAME, "coalesced", None),
            EventKind::CoalesceTakeover => (crate::coalesce::NAME, "coalesce_takeover", None),
            EventKind::CacheHit => (crate::coalesce::NAME, "cache_hit", None),
            EventKind::CacheMiss => (crate::coalesce::NAME, "cache_miss", None),
            EventKind::HedgeStarted { trigger, .. } => (
                PolicyKind::Hedging.name(),
                "hedge_started",
                Some(("hedge.trigger", trigger.as_str())),
            ),
            EventKind::HedgeBudgetExhausted { .. } => {
                (PolicyKind::Hedging.name(), "hedge_budget_exhausted", None)
            }
            EventKind::ShortCircuited {
                policy, position, ..
            } => (
                *policy,
                "short_circuited",
                Some(("policy.position", position.as_str())),
            ),
            EventKind::Rejected { reason, .. } => (
                refusing_strategy(*reason),
                "rejected",
                Some(("event.reason", reason.as_str())),
            ),
            EventKind::Deferred { reason, .. } => (
                refusing_strategy(*reason),
                "deferred",
                Some(("event.reason", reason.as_str())),
            ),
            EventKind::ShadowRejected { reason, .. } => (
                refusing_strategy(*reason),
                "shadow_rejected",
                Some(("event.reason", reason.as_str())),
            ),
            EventKind::CircuitOpened { cooldown } => {
                // `isolate` opens the circuit for good: an unbounded cooldown.
                let state = if *cooldown == Duration::MAX {
                    circuit::ISOLATED
                } else {
                    circuit::OPEN
                };
                self.circuit(event, state);
                (PolicyKind::CircuitBreaker.name(), "circuit_opened", None)
            }
            EventKind::CircuitHalfOpened => {
                self.circuit(event, circuit::HALF_OPEN);
                (
                    PolicyKind::CircuitBreaker.name(),
                    "circuit_half_opened",
                    None,
                )
            }
            EventKind::CircuitProbesExpired => (
                PolicyKind::CircuitBreaker.name(),
                "circuit_probes_expired",
                None,
            ),
            EventKind::CircuitClosed => {
                self.circuit(event, circuit::CLOSED);
                (PolicyKind::CircuitBreaker.name(), "circuit_closed", None)
            }
            EventKind::CooldownStarted { .. } => {
                (PolicyKind::Cooldown.name(), "cooldown_started", None)
            }
            EventKind::StoreUnavailable { degraded, .. } => (
                "store",
                "store_unavailable",
                Some(("store.degraded", if *degraded { "true" } else { "false" })),
            ),
        };
        let labels = [
            Label::from_static_parts("strategy.name", strategy),
            Label::from_static_parts("event.name", name),
            Label::from_static_parts("event.severity", severity(kind)),
        ]
        .into_iter()
        .chain(detail.map(|(k, v)| Label::from_static_parts(k, v)));
        ::metrics::counter!(EVENTS, self.labels(event, labels)).increment(1);
    }

    fn circuit(&self, event: &Event<'_>, state: f64) {
        ::metrics::gauge!(CIRCUIT_STATE, self.labels(event, [])).set(state);
    }
}
