//! Metrics through the `metrics` facade: exact figures after scripted runs
//! on the virtual clock, read from a local debugging recorder.
#![cfg(feature = "metrics")]

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
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
    assert_eq!(
        reader.read(),
        expected(&[
            (
                "seawall_attempt_duration_seconds{outcome=failure,resource=metrics-script}",
                Histogram(vec![0.125, 0.125, 0.125])
            ),
            (
                "seawall_attempt_duration_seconds{outcome=success,resource=metrics-script}",
                Histogram(vec![0.125])
            ),
            (
                "seawall_call_duration_seconds{outcome=fallback,resource=metrics-script}",
                Histogram(vec![1.25])
            ),
            (
                "seawall_call_duration_seconds{outcome=rejected,resource=metrics-script}",
                Histogram(vec![0.0])
            ),
            (
                "seawall_call_duration_seconds{outcome=success,resource=metrics-script}",
                Histogram(vec![1.25])
            ),
            (
                "seawall_calls_total{outcome=fallback,resource=metrics-script}",
                Counter(1)
            ),
            (
                "seawall_calls_total{outcome=rejected,resource=metrics-script}",
                Counter(1)
            ),
            (
                "seawall_calls_total{outcome=success,resource=metrics-script}",
                Counter(1)
            ),
            ("seawall_circuit_state{resource=metrics-script}", Gauge(1.0)),
            (
                "seawall_circuit_transitions_total{resource=metrics-script,state=open}",
                Counter(1)
            ),
            (
                "seawall_fallbacks_total{resource=metrics-script}",
                Counter(1)
            ),
            (
                "seawall_rejections_total{reason=circuit_open,resource=metrics-script}",
                Counter(1)
            ),
            ("seawall_retries_total{resource=metrics-script}", Counter(2)),
        ])
    );
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
            .get("seawall_circuit_state{resource=metrics-circuit}")
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
    });
    let all = reader.read();
    for (state, n) in [
        ("open", 1),
        ("half_open", 1),
        ("closed", 2),
        ("isolated", 1),
    ] {
        assert_eq!(
            all.get(&format!(
                "seawall_circuit_transitions_total{{resource=metrics-circuit,state={state}}}"
            )),
            Some(&Value::Counter(n)),
            "{state}"
        );
    }
}

#[test]
fn partition_label_only_when_asked_for() {
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
        .filter(|(k, _)| k.starts_with("seawall_calls_total"))
        .collect();
    assert_eq!(
        calls,
        expected(&[
            (
                "seawall_calls_total{outcome=success,partition=42,resource=metrics-partitioned}",
                Value::Counter(1)
            ),
            (
                "seawall_calls_total{outcome=success,partition=tenant-7,resource=metrics-partitioned}",
                Value::Counter(1)
            ),
            (
                "seawall_calls_total{outcome=success,resource=metrics-plain}",
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
    assert_eq!(
        get("seawall_timeouts_total{resource=metrics-timeouts}"),
        Some(Value::Counter(1))
    );
    assert_eq!(
        get("seawall_calls_total{outcome=timeout,resource=metrics-timeouts}"),
        Some(Value::Counter(1))
    );
    assert_eq!(
        get("seawall_rejections_total{reason=rate_limited,resource=metrics-timeouts}"),
        Some(Value::Counter(1))
    );
    assert_eq!(
        get("seawall_attempt_duration_seconds{outcome=timeout,resource=metrics-timeouts}"),
        Some(Value::Histogram(vec![3.0]))
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
        .with_metrics()
        .build()
        .unwrap();
    ::metrics::with_local_recorder(&recorder, || {
        seawall::metrics::describe();
        p.call(|_| Ok::<_, Down>(())).unwrap();
    });
    let units: BTreeMap<String, Option<::metrics::Unit>> = reader
        .snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, unit, _, _)| (k.key().name().to_owned(), unit))
        .collect();
    assert_eq!(units["seawall_calls_total"], Some(::metrics::Unit::Count));
    assert_eq!(
        units["seawall_call_duration_seconds"],
        Some(::metrics::Unit::Seconds)
    );
}
