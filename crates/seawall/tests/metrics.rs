//! Metrics through the `metrics` facade: each event's metric and
//! attributes, exact figures after scripted runs on the virtual clock (read
//! from a local debugging recorder), and the Grafana dashboard's queries
//! against what the crate emits.
#![cfg(feature = "metrics")]

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;
use seawall::event::GiveUpReason;
use seawall::metrics::MetricsConfig;
use seawall::testing::VirtualClock;
use seawall::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A metric's value, in a form easy to compare.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Counter(u64),
    Gauge(f64),
    Histogram(Vec<f64>),
}

/// Reads a debugging recorder. A snapshot drains the counters and
/// histograms it reads, so the reader adds them up across snapshots.
struct Reader {
    snapshotter: Snapshotter,
    totals: RefCell<BTreeMap<String, Value>>,
}

impl Reader {
    fn new(recorder: &DebuggingRecorder) -> Self {
        Reader {
            snapshotter: recorder.snapshotter(),
            totals: RefCell::default(),
        }
    }

    /// Every metric so far as `name{label=value,...}` (labels sorted).
    fn read(&self) -> BTreeMap<String, Value> {
        let mut totals = self.totals.borrow_mut();
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let key = key.key();
            let mut labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            let name = format!("{}{{{}}}", key.name(), labels.join(","));
            let slot = totals.entry(name);
            match value {
                DebugValue::Counter(n) => {
                    let total = slot.or_insert(Value::Counter(0));
                    if let Value::Counter(t) = total {
                        *t += n;
                    }
                }
                DebugValue::Gauge(g) => {
                    *slot.or_insert(Value::Gauge(0.0)) = Value::Gauge(g.into_inner());
                }
                DebugValue::Histogram(h) => {
                    let total = slot.or_insert(Value::Histogram(Vec::new()));
                    if let Value::Histogram(t) = total {
                        t.extend(h.into_iter().map(|v| v.into_inner()));
                    }
                }
            }
        }
        totals.clone()
    }
}

fn expected(entries: &[(&str, Value)]) -> BTreeMap<String, Value> {
    entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

#[derive(Debug)]
struct Down;
impl std::fmt::Display for Down {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("down")
    }
}
impl std::error::Error for Down {}

const EVENTS: &str = "resilience.seawall.events";

/// Delivers one event to a metrics listener and returns what it recorded.
fn record_one(
    config: MetricsConfig,
    partition: Option<&PartitionKey>,
    kind: EventKind,
) -> BTreeMap<String, Value> {
    let recorder = DebuggingRecorder::new();
    let reader = Reader::new(&recorder);
    let listener = config.listener();
    ::metrics::with_local_recorder(&recorder, || {
        listener(&Event {
            resource: "p",
            partition,
            kind,
        })
    });
    reader.read()
}

/// Every event kind, with the metric the module docs give it.
fn every_event() -> Vec<(EventKind, &'static str, Value)> {
    use Value::*;
    let rejected = |reason| EventKind::Rejected {
        reason,
        retry_after: None,
    };
    let deferred = |reason| EventKind::Deferred {
        reason,
        wait: ms(5),
    };
    let event =
        |rest: &str| -> &'static str { Box::leak(format!("{EVENTS}{{{rest}}}").into_boxed_str()) };
    vec![
        (
            EventKind::RetryScheduled {
                attempt: 1,
                delay: ms(10),
            },
            event("event.name=retry_scheduled,event.severity=debug,pipeline.name=p,strategy.name=retry"),
            Counter(1),
        ),
        (
            EventKind::RetryGaveUp {
                attempts: 2,
                reason: GiveUpReason::Deadline,
            },
            event("event.name=retry_gave_up,event.reason=deadline,event.severity=debug,pipeline.name=p,strategy.name=retry"),
            Counter(1),
        ),
        (
            EventKind::RetryGaveUp {
                attempts: 2,
                reason: GiveUpReason::Budget,
            },
            event("event.name=retry_gave_up,event.reason=budget,event.severity=debug,pipeline.name=p,strategy.name=retry"),
            Counter(1),
        ),
        (
            EventKind::TimedOut {
                attempt: 1,
                after: secs(1),
            },
            event("event.name=timed_out,event.severity=debug,pipeline.name=p,strategy.name=timeout"),
            Counter(1),
        ),
        (
            EventKind::DeadlineExceeded { late_by: ms(3) },
            event("event.name=deadline_exceeded,event.severity=warn,pipeline.name=p,strategy.name=timeout"),
            Counter(1),
        ),
        (
            EventKind::FallbackExecuted,
            event("event.name=fallback_executed,event.severity=debug,pipeline.name=p,strategy.name=fallback"),
            Counter(1),
        ),
        (
            EventKind::ChaosInjected {
                kind: seawall::chaos::ChaosKind::Latency { delay: ms(5) },
                attempt: 1,
            },
            event("chaos.kind=latency,event.name=chaos_injected,event.severity=debug,pipeline.name=p,strategy.name=chaos"),
            Counter(1),
        ),
        (
            EventKind::Coalesced,
            event("event.name=coalesced,event.severity=trace,pipeline.name=p,strategy.name=coalesce"),
            Counter(1),
        ),
        (
            EventKind::CoalesceTakeover,
            event("event.name=coalesce_takeover,event.severity=debug,pipeline.name=p,strategy.name=coalesce"),
            Counter(1),
        ),
        (
            EventKind::CacheHit,
            event("event.name=cache_hit,event.severity=trace,pipeline.name=p,strategy.name=coalesce"),
            Counter(1),
        ),
        (
            EventKind::CacheMiss,
            event("event.name=cache_miss,event.severity=trace,pipeline.name=p,strategy.name=coalesce"),
            Counter(1),
        ),
        (
            EventKind::HedgeStarted {
                attempt: 2,
                trigger: HedgeTrigger::Delay,
            },
            event("event.name=hedge_started,event.severity=debug,hedge.trigger=delay,pipeline.name=p,strategy.name=hedging"),
            Counter(1),
        ),
        (
            EventKind::HedgeStarted {
                attempt: 3,
                trigger: HedgeTrigger::Failure,
            },
            event("event.name=hedge_started,event.severity=debug,hedge.trigger=failure,pipeline.name=p,strategy.name=hedging"),
            Counter(1),
        ),
        (
            EventKind::HedgeBudgetExhausted { attempt: 2 },
            event("event.name=hedge_budget_exhausted,event.severity=warn,pipeline.name=p,strategy.name=hedging"),
            Counter(1),
        ),
        (
            rejected(RejectionReason::CircuitOpen),
            event("event.name=rejected,event.reason=circuit_open,event.severity=debug,pipeline.name=p,strategy.name=circuit_breaker"),
            Counter(1),
        ),
        (
            rejected(RejectionReason::BulkheadFull),
            event("event.name=rejected,event.reason=bulkhead_full,event.severity=warn,pipeline.name=p,strategy.name=bulkhead"),
            Counter(1),
        ),
        (
            rejected(RejectionReason::RateLimited),
            event("event.name=rejected,event.reason=rate_limited,event.severity=warn,pipeline.name=p,strategy.name=rate_limiter"),
            Counter(1),
        ),
        (
            rejected(RejectionReason::CooldownActive),
            event("event.name=rejected,event.reason=cooldown_active,event.severity=debug,pipeline.name=p,strategy.name=cooldown"),
            Counter(1),
        ),
        (
            rejected(RejectionReason::CooldownExceedsDeadline),
            event("event.name=rejected,event.reason=cooldown_exceeds_deadline,event.severity=debug,pipeline.name=p,strategy.name=cooldown"),
            Counter(1),
        ),
        (
            rejected(RejectionReason::RetryBudgetExhausted),
            event("event.name=rejected,event.reason=retry_budget_exhausted,event.severity=warn,pipeline.name=p,strategy.name=retry"),
            Counter(1),
        ),
        (
            deferred(RejectionReason::BulkheadFull),
            event("event.name=deferred,event.reason=bulkhead_full,event.severity=debug,pipeline.name=p,strategy.name=bulkhead"),
            Counter(1),
        ),
        (
            deferred(RejectionReason::RateLimited),
            event("event.name=deferred,event.reason=rate_limited,event.severity=debug,pipeline.name=p,strategy.name=rate_limiter"),
            Counter(1),
        ),
        (
            deferred(RejectionReason::CooldownActive),
            event("event.name=deferred,event.reason=cooldown_active,event.severity=debug,pipeline.name=p,strategy.name=cooldown"),
            Counter(1),
        ),
        (
            EventKind::ShadowRejected {
                reason: RejectionReason::CircuitOpen,
                retry_after: Some(secs(3)),
            },
            event("event.name=shadow_rejected,event.reason=circuit_open,event.severity=debug,pipeline.name=p,strategy.name=circuit_breaker"),
            Counter(1),
        ),
        (
            EventKind::ShadowRejected {
                reason: RejectionReason::BulkheadFull,
                retry_after: None,
            },
            event("event.name=shadow_rejected,event.reason=bulkhead_full,event.severity=debug,pipeline.name=p,strategy.name=bulkhead"),
            Counter(1),
        ),
        (
            EventKind::ShadowRejected {
                reason: RejectionReason::CooldownActive,
                retry_after: Some(secs(1)),
            },
            event("event.name=shadow_rejected,event.reason=cooldown_active,event.severity=debug,pipeline.name=p,strategy.name=cooldown"),
            Counter(1),
        ),
        (
            EventKind::ShadowRejected {
                reason: RejectionReason::RateLimited,
                retry_after: Some(ms(10)),
            },
            event("event.name=shadow_rejected,event.reason=rate_limited,event.severity=debug,pipeline.name=p,strategy.name=rate_limiter"),
            Counter(1),
        ),
        (
            EventKind::CircuitProbesExpired,
            event("event.name=circuit_probes_expired,event.severity=warn,pipeline.name=p,strategy.name=circuit_breaker"),
            Counter(1),
        ),
        (
            EventKind::CircuitOpened { cooldown: secs(30) },
            event("event.name=circuit_opened,event.severity=warn,pipeline.name=p,strategy.name=circuit_breaker"),
            Counter(1),
        ),
        (
            EventKind::CircuitHalfOpened,
            event("event.name=circuit_half_opened,event.severity=info,pipeline.name=p,strategy.name=circuit_breaker"),
            Counter(1),
        ),
        (
            EventKind::CircuitClosed,
            event("event.name=circuit_closed,event.severity=info,pipeline.name=p,strategy.name=circuit_breaker"),
            Counter(1),
        ),
        (
            EventKind::CooldownStarted { duration: secs(5) },
            event("event.name=cooldown_started,event.severity=warn,pipeline.name=p,strategy.name=cooldown"),
            Counter(1),
        ),
        (
            EventKind::StoreUnavailable {
                error: "down".into(),
                degraded: true,
            },
            event("event.name=store_unavailable,event.severity=warn,pipeline.name=p,store.degraded=true,strategy.name=store"),
            Counter(1),
        ),
        (
            EventKind::StoreUnavailable {
                error: "down".into(),
                degraded: false,
            },
            event("event.name=store_unavailable,event.severity=warn,pipeline.name=p,store.degraded=false,strategy.name=store"),
            Counter(1),
        ),
        (
            EventKind::ShortCircuited {
                policy: "maintenance",
                position: seawall::custom::Position::Call,
                attempt: 1,
            },
            event("event.name=short_circuited,event.severity=debug,pipeline.name=p,policy.position=call,strategy.name=maintenance"),
            Counter(1),
        ),
        (
            rejected(RejectionReason::PolicyRefused),
            event("event.name=rejected,event.reason=policy_refused,event.severity=debug,pipeline.name=p,strategy.name=custom"),
            Counter(1),
        ),
        (
            EventKind::AttemptFinished {
                attempt: 3,
                duration: ms(250),
                outcome: AttemptOutcome::Timeout,
            },
            "resilience.seawall.attempt.duration{attempt.number=3,attempt.outcome=timeout,pipeline.name=p}",
            Histogram(vec![0.25]),
        ),
        (
            EventKind::CallFinished {
                attempts: 1,
                duration: ms(1500),
                outcome: CallOutcome::Rejected(RejectionReason::RateLimited),
            },
            "resilience.seawall.call.duration{call.outcome=rejected,pipeline.name=p}",
            Histogram(vec![1.5]),
        ),
        (
            EventKind::CallFinished {
                attempts: 2,
                duration: ms(500),
                outcome: CallOutcome::Fallback,
            },
            "resilience.seawall.call.duration{call.outcome=fallback,pipeline.name=p}",
            Histogram(vec![0.5]),
        ),
    ]
}

#[test]
fn each_event_feeds_its_documented_metric_and_attributes() {
    for (kind, key, value) in every_event() {
        let mut want = expected(&[(key, value)]);
        // A circuit transition also sets the state gauge.
        let state = match &kind {
            EventKind::CircuitOpened { .. } => Some(1.0),
            EventKind::CircuitHalfOpened => Some(2.0),
            EventKind::CircuitClosed => Some(0.0),
            _ => None,
        };
        if let Some(s) = state {
            want.insert(
                "resilience.seawall.circuit.state{pipeline.name=p}".into(),
                Value::Gauge(s),
            );
        }
        assert_eq!(
            record_one(MetricsConfig::new(), None, kind.clone()),
            want,
            "{kind:?}"
        );
    }
}

#[test]
fn an_isolated_circuit_reads_three() {
    let got = record_one(
        MetricsConfig::new(),
        None,
        EventKind::CircuitOpened {
            cooldown: Duration::MAX,
        },
    );
    assert_eq!(
        got,
        expected(&[
            (
                "resilience.seawall.circuit.state{pipeline.name=p}",
                Value::Gauge(3.0)
            ),
            (
                "resilience.seawall.events{event.name=circuit_opened,event.severity=warn,pipeline.name=p,strategy.name=circuit_breaker}",
                Value::Counter(1)
            ),
        ])
    );
}

#[test]
fn the_partition_attribute_is_on_every_metric_when_enabled() {
    let key = PartitionKey::from("tenant-7");
    for (kind, _, _) in every_event() {
        let with = record_one(
            MetricsConfig::new().partition_label(true),
            Some(&key),
            kind.clone(),
        );
        let without = record_one(MetricsConfig::new(), Some(&key), kind.clone());
        assert!(!with.is_empty(), "{kind:?}");
        for k in with.keys() {
            assert!(k.contains("pipeline.partition=tenant-7"), "{k}");
        }
        for k in without.keys() {
            assert!(!k.contains("pipeline.partition"), "{k}");
        }
    }
}

#[test]
fn a_scripted_run_gives_exact_figures() {
    let recorder = DebuggingRecorder::new();
    let reader = Reader::new(&recorder);
    let clock = VirtualClock::new();
    let pipeline = Pipeline::builder("metrics-script")
        .retry(Retry::constant(secs(1)).max_attempts(2))
        .circuit_breaker(CircuitBreaker::consecutive_failures(2).cooldown(secs(30)))
        .store(MemoryStore::new())
        .clock(clock.clone())
        .with_metrics()
        .fallback_sync(|_e: Error<Down>, _ctx| Ok::<u32, Down>(0))
        .fallback_when(|e| !e.is_rejected())
        .build()
        .unwrap();

    // Each attempt takes 125 ms; `script` says which attempts fail.
    let run = |script: &'static [bool]| {
        let mut attempt = 0;
        pipeline.call(|_ctx| {
            clock.advance(ms(125));
            let fail = script[attempt];
            attempt += 1;
            if fail {
                Err(Down)
            } else {
                Ok(1)
            }
        })
    };
    ::metrics::with_local_recorder(&recorder, || {
        // 1: fails, then succeeds after one retry.
        assert_eq!(run(&[true, false]).unwrap(), 1);
        // 2: fails twice: the circuit opens, the fallback answers.
        assert_eq!(run(&[true, true]).unwrap(), 0);
        // 3: the open circuit rejects; no fallback for rejections.
        assert!(run(&[]).unwrap_err().is_rejected());
    });

    use Value::*;
    let p = "pipeline.name=metrics-script";
    let want: BTreeMap<String, Value> = [
        (
            format!("resilience.seawall.attempt.duration{{attempt.number=1,attempt.outcome=failure,{p}}}"),
            Histogram(vec![0.125, 0.125]),
        ),
        (
            format!("resilience.seawall.attempt.duration{{attempt.number=2,attempt.outcome=failure,{p}}}"),
            Histogram(vec![0.125]),
        ),
        (
            format!("resilience.seawall.attempt.duration{{attempt.number=2,attempt.outcome=success,{p}}}"),
            Histogram(vec![0.125]),
        ),
        (
            format!("resilience.seawall.call.duration{{call.outcome=fallback,{p}}}"),
            Histogram(vec![1.25]),
        ),
        (
            format!("resilience.seawall.call.duration{{call.outcome=rejected,{p}}}"),
            Histogram(vec![0.0]),
        ),
        (
            format!("resilience.seawall.call.duration{{call.outcome=success,{p}}}"),
            Histogram(vec![1.25]),
        ),
        (format!("resilience.seawall.circuit.state{{{p}}}"), Gauge(1.0)),
        (
            format!("{EVENTS}{{event.name=circuit_opened,event.severity=warn,{p},strategy.name=circuit_breaker}}"),
            Counter(1),
        ),
        (
            format!("{EVENTS}{{event.name=fallback_executed,event.severity=debug,{p},strategy.name=fallback}}"),
            Counter(1),
        ),
        (
            format!("{EVENTS}{{event.name=rejected,event.reason=circuit_open,event.severity=debug,{p},strategy.name=circuit_breaker}}"),
            Counter(1),
        ),
        (
            format!("{EVENTS}{{event.name=retry_scheduled,event.severity=debug,{p},strategy.name=retry}}"),
            Counter(2),
        ),
    ]
    .into_iter()
    .collect();
    assert_eq!(reader.read(), want);
}

#[test]
fn circuit_state_gauge_follows_every_state() {
    let recorder = DebuggingRecorder::new();
    let reader = Reader::new(&recorder);
    let clock = VirtualClock::new();
    let p = Pipeline::builder("metrics-circuit")
        .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(10)))
        .store(MemoryStore::new())
        .clock(clock.clone())
        .with_metrics()
        .build()
        .unwrap();
    let gauge = || {
        reader
            .read()
            .get("resilience.seawall.circuit.state{pipeline.name=metrics-circuit}")
            .cloned()
    };
    ::metrics::with_local_recorder(&recorder, || {
        let _ = p.call(|_| Err::<(), _>(Down));
        assert_eq!(gauge(), Some(Value::Gauge(1.0)));
        clock.advance(secs(10));
        // The probe half-opens the circuit, then closes it.
        let mut state_during_probe = None;
        p.call(|_| {
            state_during_probe = gauge();
            Ok::<_, Down>(())
        })
        .unwrap();
        assert_eq!(state_during_probe, Some(Value::Gauge(2.0)));
        assert_eq!(gauge(), Some(Value::Gauge(0.0)));
        p.isolate().unwrap();
        assert_eq!(gauge(), Some(Value::Gauge(3.0)));
        p.reset().unwrap();
        assert_eq!(gauge(), Some(Value::Gauge(0.0)));
        // The longest open is an open, not an isolation.
        p.open_for(Duration::MAX).unwrap();
        assert_eq!(gauge(), Some(Value::Gauge(1.0)));
        p.reset().unwrap();
    });
    let all = reader.read();
    for (event, severity, n) in [
        ("circuit_opened", "warn", 3),
        ("circuit_half_opened", "info", 1),
        ("circuit_closed", "info", 3),
    ] {
        assert_eq!(
            all.get(&format!(
                "{EVENTS}{{event.name={event},event.severity={severity},pipeline.name=metrics-circuit,strategy.name=circuit_breaker}}"
            )),
            Some(&Value::Counter(n)),
            "{event}"
        );
    }
}

#[test]
fn partition_attribute_only_when_asked_for() {
    let recorder = DebuggingRecorder::new();
    let reader = Reader::new(&recorder);
    let build = |name: &str, config: MetricsConfig| {
        Pipeline::builder(name)
            .bulkhead(Bulkhead::new(1))
            .store(MemoryStore::new())
            .clock(VirtualClock::new())
            .with_metrics_config(config)
            .build()
            .unwrap()
    };
    let plain = build("metrics-plain", MetricsConfig::new());
    let labelled = build(
        "metrics-partitioned",
        MetricsConfig::new().partition_label(true),
    );
    ::metrics::with_local_recorder(&recorder, || {
        for p in [&plain, &labelled] {
            p.partition("tenant-7").call(|_| Ok::<_, Down>(())).unwrap();
            p.partition(42u64).call(|_| Ok::<_, Down>(())).unwrap();
        }
    });
    let calls: BTreeMap<String, Value> = reader
        .read()
        .into_iter()
        .filter(|(k, _)| k.starts_with("resilience.seawall.call.duration"))
        .map(|(k, v)| match v {
            Value::Histogram(h) => (k, Value::Counter(h.len() as u64)),
            v => (k, v),
        })
        .collect();
    assert_eq!(
        calls,
        expected(&[
            (
                "resilience.seawall.call.duration{call.outcome=success,pipeline.name=metrics-partitioned,pipeline.partition=42}",
                Value::Counter(1)
            ),
            (
                "resilience.seawall.call.duration{call.outcome=success,pipeline.name=metrics-partitioned,pipeline.partition=tenant-7}",
                Value::Counter(1)
            ),
            (
                "resilience.seawall.call.duration{call.outcome=success,pipeline.name=metrics-plain}",
                Value::Counter(2)
            ),
        ])
    );
}

#[test]
fn timeouts_rejections_and_give_ups_are_counted() {
    let recorder = DebuggingRecorder::new();
    let reader = Reader::new(&recorder);
    let clock = VirtualClock::new();
    let p = Pipeline::builder("metrics-timeouts")
        .timeout(Timeout::strict(secs(2)))
        .retry(Retry::constant(secs(1)).max_attempts(3))
        .rate_limiter(RateLimiter::fixed_window(1, secs(60)))
        .store(MemoryStore::new())
        .clock(clock.clone())
        .listener_for_test()
        .build()
        .unwrap();
    ::metrics::with_local_recorder(&recorder, || {
        // 1 s late: the strict overall timeout turns it into an error.
        let e = p
            .call(|_| {
                clock.advance(secs(3));
                Ok::<_, Down>(())
            })
            .unwrap_err();
        assert!(e.is_timeout());
        // The window's only permit is gone.
        let e = p.call(|_| Ok::<_, Down>(())).unwrap_err();
        assert!(e.is_rejected());
    });
    let all = reader.read();
    let get = |k: &str| all.get(k).cloned();
    let p = "pipeline.name=metrics-timeouts";
    assert_eq!(
        get(&format!(
            "{EVENTS}{{event.name=timed_out,event.severity=debug,{p},strategy.name=timeout}}"
        )),
        Some(Value::Counter(1))
    );
    assert_eq!(
        get(&format!(
            "resilience.seawall.call.duration{{call.outcome=timeout,{p}}}"
        )),
        Some(Value::Histogram(vec![3.0]))
    );
    assert_eq!(
        get(&format!(
            "{EVENTS}{{event.name=rejected,event.reason=rate_limited,event.severity=warn,{p},strategy.name=rate_limiter}}"
        )),
        Some(Value::Counter(1))
    );
    assert_eq!(
        get(&format!(
            "resilience.seawall.attempt.duration{{attempt.number=1,attempt.outcome=timeout,{p}}}"
        )),
        Some(Value::Histogram(vec![3.0]))
    );
}

/// A latency of zero is no injection: it feeds no `chaos_injected`
/// metric, sync or async; a latency of 5 ms beside it does, once a call.
#[test]
fn a_zero_latency_feeds_no_chaos_metric() {
    let recorder = DebuggingRecorder::new();
    let reader = Reader::new(&recorder);
    let p = Pipeline::builder("metrics-zero-latency")
        .chaos(seawall::chaos::Chaos::latency(1.0, Duration::ZERO))
        .chaos(seawall::chaos::Chaos::latency(1.0, ms(5)))
        .store(MemoryStore::new())
        .clock(VirtualClock::new())
        .listener_for_test()
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    ::metrics::with_local_recorder(&recorder, || {
        p.call(|_| Ok::<_, Down>(())).unwrap();
        rt.block_on(p.run(|_| async { Ok::<_, Down>(()) })).unwrap();
    });
    let injected: Vec<_> = reader
        .read()
        .into_iter()
        .filter(|(k, _)| k.contains("chaos_injected"))
        .collect();
    assert_eq!(
        injected,
        vec![(
            format!("{EVENTS}{{chaos.kind=latency,event.name=chaos_injected,event.severity=debug,pipeline.name=metrics-zero-latency,strategy.name=chaos}}"),
            Value::Counter(2)
        )]
    );
}

/// `on_event(listener())` is the same as `with_metrics()`.
trait ListenerForTest {
    fn listener_for_test(self) -> Self;
}

impl ListenerForTest for PipelineBuilder {
    fn listener_for_test(self) -> Self {
        self.on_event(seawall::metrics::listener())
    }
}

#[test]
fn describe_publishes_units() {
    let recorder = DebuggingRecorder::new();
    let reader = Reader::new(&recorder);
    let p = Pipeline::builder("metrics-describe")
        .retry(Retry::constant(ms(1)).max_attempts(2))
        .circuit_breaker(CircuitBreaker::consecutive_failures(1))
        .with_metrics()
        .build()
        .unwrap();
    ::metrics::with_local_recorder(&recorder, || {
        seawall::metrics::describe();
        let _ = p.call(|_| Err::<(), _>(Down));
    });
    let units: BTreeMap<String, Option<::metrics::Unit>> = reader
        .snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, unit, _, _)| (k.key().name().to_owned(), unit))
        .collect();
    use ::metrics::Unit;
    assert_eq!(
        units,
        [
            (seawall::metrics::EVENTS, Some(Unit::Count)),
            (seawall::metrics::ATTEMPT_DURATION, Some(Unit::Seconds)),
            (seawall::metrics::CALL_DURATION, Some(Unit::Seconds)),
            (seawall::metrics::CIRCUIT_STATE, None),
        ]
        .into_iter()
        .map(|(k, u)| (k.to_owned(), u))
        .collect()
    );
}

/// What the crate emits, as Prometheus spells it: for each series name
/// (`_total`, `_seconds`, `_bucket`, ... included), each attribute and the
/// values seen.
type Exported = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn exported() -> Exported {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let key = PartitionKey::from("k");
    let listener = MetricsConfig::new().partition_label(true).listener();
    ::metrics::with_local_recorder(&recorder, || {
        seawall::metrics::describe();
        for (kind, _, _) in every_event() {
            listener(&Event {
                resource: "p",
                partition: Some(&key),
                kind,
            });
        }
    });
    let prometheus = |s: &str| s.replace('.', "_");
    let mut out = Exported::new();
    for (key, unit, _, _) in snapshotter.snapshot().into_vec() {
        let (kind, key) = key.into_parts();
        let base = prometheus(key.name());
        let base = match unit {
            Some(::metrics::Unit::Seconds) => format!("{base}_seconds"),
            _ => base,
        };
        let names = match kind {
            MetricKind::Counter => vec![format!("{base}_total")],
            MetricKind::Gauge => vec![base],
            MetricKind::Histogram => ["bucket", "count", "sum"]
                .iter()
                .map(|s| format!("{base}_{s}"))
                .collect(),
        };
        for name in names {
            let labels = out.entry(name.clone()).or_default();
            for l in key.labels() {
                labels
                    .entry(prometheus(l.key()))
                    .or_default()
                    .insert(l.value().to_owned());
            }
            if name.ends_with("_bucket") {
                labels.entry("le".into()).or_default();
            }
        }
    }
    out
}

/// Every `expr` of a Grafana dashboard.
fn exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Checks a PromQL query against what the crate emits: every metric it
/// names, the labels of its matchers (and the values they compare with
/// `=`) and of its `by (...)` clauses.
fn check_query(expr: &str, exported: &Exported) -> Result<(), String> {
    let mut used = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("resilience_seawall_") {
        let tail = &rest[at..];
        let end = tail.find(|c| !is_ident(c)).unwrap_or(tail.len());
        let name = &tail[..end];
        let labels = exported
            .get(name)
            .ok_or_else(|| format!("`{name}` is not a metric the crate emits"))?;
        used.push(name);
        let after = &tail[end..];
        if let Some(matchers) = after.strip_prefix('{') {
            let matchers = &matchers[..matchers.find('}').ok_or("unclosed `{`")?];
            for m in matchers.split(',') {
                let m = m.trim();
                let op = m
                    .find(|c| !is_ident(c))
                    .ok_or(format!("bad matcher `{m}`"))?;
                let (label, cmp) = (&m[..op], &m[op..]);
                let values = labels
                    .get(label)
                    .ok_or_else(|| format!("`{name}` has no label `{label}`"))?;
                if let Some(v) = cmp.strip_prefix("=\"") {
                    let v = v.trim_end_matches('"');
                    if !v.contains('$') && !values.contains(v) {
                        return Err(format!("`{name}` never has {label}=\"{v}\""));
                    }
                }
            }
        }
        rest = &tail[end..];
    }
    if used.is_empty() {
        return Err("names no metric of the crate".into());
    }
    let mut rest = expr;
    while let Some(at) = rest.find("by (") {
        let list = &rest[at + 4..];
        let list = &list[..list.find(')').ok_or("unclosed `by (`")?];
        for label in list.split(',').map(str::trim) {
            if !used.iter().any(|n| exported[*n].contains_key(label)) {
                return Err(format!("no metric of the query has the label `{label}`"));
            }
        }
        rest = &rest[at + 4..];
    }
    Ok(())
}

#[test]
fn the_dashboard_queries_only_what_the_crate_emits() {
    let text = include_str!("../../../dashboards/seawall-grafana.json");
    let dashboard: serde_json::Value = serde_json::from_str(text).expect("valid JSON");
    assert!(dashboard["title"].is_string());
    assert!(dashboard["panels"]
        .as_array()
        .is_some_and(|p| !p.is_empty()));
    let mut queries = Vec::new();
    exprs(&dashboard, &mut queries);
    assert!(queries.len() >= 6, "{queries:?}");
    let exported = exported();
    for q in &queries {
        if let Err(e) = check_query(q, &exported) {
            panic!("dashboard query `{q}`: {e}");
        }
    }
}

#[test]
fn the_dashboard_check_can_fail() {
    let exported = exported();
    let p = "pipeline_name=~\"$pipeline\"";
    for (query, why) in [
        ("sum(rate(seawall_calls_total[5m]))", "names no metric"),
        (
            "rate(resilience_seawall_calls_total[5m])",
            "not a metric the crate emits",
        ),
        (
            "rate(resilience_seawall_call_duration_seconds_count{outcome=\"success\"}[5m])",
            "has no label `outcome`",
        ),
        (
            "rate(resilience_seawall_events_total{event_name=\"retried\"}[5m])",
            "never has event_name=\"retried\"",
        ),
        (
            "sum by (reason) (rate(resilience_seawall_events_total[5m]))",
            "has the label `reason`",
        ),
    ] {
        let e = check_query(query, &exported).unwrap_err();
        assert!(e.contains(why), "{query}: {e}");
    }
    check_query(
        &format!("sum by (le) (rate(resilience_seawall_attempt_duration_seconds_bucket{{{p}, attempt_number=\"3\"}}[5m]))"),
        &exported,
    )
    .unwrap();
}
