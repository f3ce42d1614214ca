//! With the `tracing` feature, events reach a subscriber that wants them,
//! whether it was installed before or after the pipeline was built, and
//! calls keep their results with or without one.
#![cfg(feature = "tracing")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seawall::testing::VirtualClock;
use seawall::{Bulkhead, CircuitBreaker, Pipeline, RateLimiter, Retry};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// Records the messages of the events of target `seawall`.
#[derive(Clone, Default)]
struct Collector {
    messages: Arc<Mutex<Vec<String>>>,
    spans: Arc<AtomicUsize>,
}

struct Message<'a>(&'a mut String);

impl Visit for Message<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            *self.0 = format!("{value:?}");
        }
    }
}

impl Subscriber for Collector {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target() == "seawall"
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(self.spans.fetch_add(1, Ordering::Relaxed) as u64 + 1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut text = String::new();
        event.record(&mut Message(&mut text));
        self.messages.lock().unwrap().push(text);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

fn pipeline(clock: &VirtualClock) -> Pipeline {
    Pipeline::builder("traced")
        .clock(clock.clone())
        .retry(Retry::constant(Duration::from_millis(5)).max_attempts(3))
        .circuit_breaker(CircuitBreaker::consecutive_failures(10))
        .bulkhead(Bulkhead::new(4))
        .build()
        .unwrap()
}

/// Fails on the first attempt, succeeds on the second.
fn flaky(ctx: seawall::Context) -> Result<u32, &'static str> {
    if ctx.attempt() == 1 {
        Err("first attempt fails")
    } else {
        Ok(ctx.attempt())
    }
}

#[test]
fn a_subscriber_installed_after_the_build_gets_the_events() {
    let clock = VirtualClock::new();
    let p = pipeline(&clock);
    // Nobody listens: no event, the same result.
    assert_eq!(p.call(flaky).unwrap(), 2);

    let collector = Collector::default();
    tracing::subscriber::with_default(collector.clone(), || {
        assert_eq!(p.call(flaky).unwrap(), 2);
        assert_eq!(p.call(|_| Ok::<_, &str>(7)).unwrap(), 7);
    });
    let messages = collector.messages.lock().unwrap().clone();
    let count = |needle: &str| messages.iter().filter(|m| m.contains(needle)).count();
    assert_eq!(count("retrying in"), 1, "{messages:#?}");
    // One `CallFinished` per call made under the subscriber, one
    // `AttemptFinished` per attempt (2 + 1).
    assert_eq!(count("call ended: success"), 2, "{messages:#?}");
    assert_eq!(
        count("attempt 1 ended") + count("attempt 2 ended"),
        3,
        "{messages:#?}"
    );

    // Gone again: calls still work, nothing more is recorded.
    let before = collector.messages.lock().unwrap().len();
    assert_eq!(p.call(flaky).unwrap(), 2);
    assert_eq!(collector.messages.lock().unwrap().len(), before);
}

#[test]
fn a_subscriber_that_wants_other_targets_gets_nothing() {
    #[derive(Clone, Default)]
    struct Elsewhere(Collector);
    impl Subscriber for Elsewhere {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            false
        }
        fn new_span(&self, a: &Attributes<'_>) -> Id {
            self.0.new_span(a)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, e: &Event<'_>) {
            self.0.event(e)
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }
    let clock = VirtualClock::new();
    let p = pipeline(&clock);
    let elsewhere = Elsewhere::default();
    tracing::subscriber::with_default(elsewhere.clone(), || {
        assert_eq!(p.call(flaky).unwrap(), 2);
    });
    assert!(elsewhere.0.messages.lock().unwrap().is_empty());
}

// ------------------------------------------------------------------ levels

/// Records the level and message of every event of target `seawall` at or
/// above `max` (as a `seawall=<max>` filter would), and the spans.
#[derive(Clone)]
struct Leveled {
    max: tracing::Level,
    events: Arc<Mutex<Vec<(tracing::Level, String)>>>,
}

impl Leveled {
    fn new(max: tracing::Level) -> Self {
        Leveled {
            max,
            events: Arc::default(),
        }
    }

    fn at(&self, needle: &str) -> Vec<tracing::Level> {
        let events = self.events.lock().unwrap();
        events
            .iter()
            .filter(|(_, m)| m.contains(needle))
            .map(|(l, _)| *l)
            .collect()
    }
}

impl Subscriber for Leveled {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target() == "seawall" && *metadata.level() <= self.max
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut text = String::new();
        event.record(&mut Message(&mut text));
        let level = *event.metadata().level();
        self.events.lock().unwrap().push((level, text));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

fn breaker(clock: &VirtualClock) -> Pipeline {
    Pipeline::builder("leveled")
        .clock(clock.clone())
        .store(seawall::MemoryStore::new())
        .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(Duration::from_secs(1)))
        .build()
        .unwrap()
}

#[test]
fn a_successful_call_logs_only_at_trace_and_a_retry_at_debug() {
    use tracing::Level;
    let clock = VirtualClock::new();
    let p = pipeline(&clock);
    let all = Leveled::new(Level::TRACE);
    tracing::subscriber::with_default(all.clone(), || {
        assert_eq!(p.call(|_| Ok::<_, &str>(7)).unwrap(), 7);
        assert_eq!(p.call(flaky).unwrap(), 2);
    });
    assert_eq!(all.at("call ended: success"), [Level::TRACE; 2]);
    assert_eq!(all.at("attempt 1 ended"), [Level::TRACE; 2]);
    assert_eq!(all.at("retrying in"), [Level::DEBUG]);
    let events = all.events.lock().unwrap();
    assert!(
        events.iter().all(|(l, _)| *l >= Level::DEBUG),
        "{events:#?}"
    );
}

#[test]
fn circuit_openings_are_warnings_and_recoveries_info() {
    use tracing::Level;
    let clock = VirtualClock::new();
    let p = breaker(&clock);
    let all = Leveled::new(Level::TRACE);
    tracing::subscriber::with_default(all.clone(), || {
        let _ = p.call(|_| Err::<(), _>("down"));
        let _ = p.call(|_| Ok::<_, &str>(()));
        clock.advance(Duration::from_secs(2));
        p.call(|_| Ok::<_, &str>(())).unwrap();
    });
    assert_eq!(all.at("circuit opened"), [Level::WARN]);
    assert_eq!(all.at("rejected: circuit"), [Level::DEBUG]);
    assert_eq!(all.at("circuit half-open"), [Level::INFO]);
    assert_eq!(all.at("circuit closed"), [Level::INFO]);
}

#[test]
fn a_warn_filter_shows_circuit_openings_and_overload_and_nothing_else() {
    use tracing::Level;
    let clock = VirtualClock::new();
    let p = breaker(&clock);
    let warn = Leveled::new(Level::WARN);
    tracing::subscriber::with_default(warn.clone(), || {
        p.call(|_| Ok::<_, &str>(())).unwrap();
        let _ = p.call(|_| Err::<(), _>("down"));
        let _ = p.call(|_| Ok::<_, &str>(()));
    });
    let messages: Vec<String> = warn
        .events
        .lock()
        .unwrap()
        .iter()
        .map(|(_, m)| m.clone())
        .collect();
    assert_eq!(messages.len(), 1, "{messages:#?}");
    assert!(messages[0].contains("circuit opened"), "{messages:#?}");

    // A full bulkhead is overload: a warning.
    let full = Pipeline::builder("leveled-bulkhead")
        .clock(clock.clone())
        .store(seawall::MemoryStore::new())
        .bulkhead(Bulkhead::new(1))
        .build()
        .unwrap();
    let warn = Leveled::new(Level::WARN);
    tracing::subscriber::with_default(warn.clone(), || {
        full.call(|_| {
            let inner = full.call(|_| Ok::<_, &str>(()));
            assert!(inner.is_err());
            Ok::<_, &str>(())
        })
        .unwrap();
    });
    assert_eq!(warn.at("rejected: bulkhead"), [Level::WARN]);
}

#[test]
fn shadow_refusals_are_debug_and_expired_probes_a_warning() {
    use tracing::Level;
    let clock = VirtualClock::new();
    let shadow = Pipeline::builder("leveled-shadow")
        .clock(clock.clone())
        .store(seawall::MemoryStore::new())
        .rate_limiter(RateLimiter::fixed_window(1, Duration::from_secs(60)).shadow(true))
        .build()
        .unwrap();
    let all = Leveled::new(Level::TRACE);
    tracing::subscriber::with_default(all.clone(), || {
        shadow.call(|_| Ok::<_, &str>(())).unwrap();
        shadow.call(|_| Ok::<_, &str>(())).unwrap();
    });
    assert_eq!(
        all.at("shadow mode: would have rejected: rate_limited (retry after 60s)"),
        [Level::DEBUG]
    );
    assert!(all.at("rejected: rate").iter().all(|l| *l == Level::DEBUG));

    let probes = Pipeline::builder("leveled-probes")
        .clock(clock.clone())
        .store(seawall::MemoryStore::new())
        .circuit_breaker(
            CircuitBreaker::consecutive_failures(1)
                .cooldown(Duration::from_secs(1))
                .max_half_open(Duration::from_secs(1)),
        )
        .build()
        .unwrap();
    let warn = Leveled::new(Level::WARN);
    tracing::subscriber::with_default(warn.clone(), || {
        let _ = probes.call(|_| Err::<(), _>("down"));
        clock.advance(Duration::from_secs(1));
        probes
            .call(|_| {
                clock.advance(Duration::from_secs(1));
                probes.call(|_| Ok::<_, &str>(()))
            })
            .unwrap();
    });
    assert_eq!(
        warn.at("unfinished probes expired, a new round of probes"),
        [Level::WARN]
    );
}

// ------------------------------------------------------------------- spans

/// Records the spans with their fields, and every event with the fields of
/// the span it was emitted in (on this thread).
#[derive(Clone, Default)]
struct Spanned {
    /// Accept spans of target `seawall` (else only events).
    seawall_spans: bool,
    spans: Arc<Mutex<Vec<(String, Fields)>>>,
    stack: Arc<Mutex<Vec<u64>>>,
    events: Arc<Mutex<Vec<InSpan>>>,
}

/// An event's message and the fields of the span it was emitted in.
type InSpan = (String, Option<Fields>);

type Fields = std::collections::BTreeMap<String, String>;

struct FieldsOf<'a>(&'a mut Fields);

impl Visit for FieldsOf<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.to_string());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}"));
    }
}

impl Subscriber for Spanned {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        if metadata.is_span() {
            self.seawall_spans && metadata.target() == "seawall"
        } else {
            metadata.target() != "seawall"
        }
    }
    fn new_span(&self, attributes: &Attributes<'_>) -> Id {
        let mut fields = Fields::new();
        attributes.record(&mut FieldsOf(&mut fields));
        let mut spans = self.spans.lock().unwrap();
        spans.push((attributes.metadata().name().to_owned(), fields));
        Id::from_u64(spans.len() as u64)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields::new();
        event.record(&mut FieldsOf(&mut fields));
        let message = fields.remove("message").unwrap_or_default();
        let current = self.stack.lock().unwrap().last().copied();
        let span = current.map(|id| self.spans.lock().unwrap()[id as usize - 1].1.clone());
        self.events.lock().unwrap().push((message, span));
    }
    fn enter(&self, id: &Id) {
        self.stack.lock().unwrap().push(id.into_u64());
    }
    fn exit(&self, id: &Id) {
        let popped = self.stack.lock().unwrap().pop();
        assert_eq!(popped, Some(id.into_u64()));
    }
}

impl Spanned {
    /// The span fields of the events `message`, in order.
    fn spans_of(&self, message: &str) -> Vec<Option<Fields>> {
        let events = self.events.lock().unwrap();
        events
            .iter()
            .filter(|(m, _)| m == message)
            .map(|(_, s)| s.clone())
            .collect()
    }
}

fn fields(pipeline: &str, partition: Option<&str>, attempt: u32) -> Option<Fields> {
    let mut f = Fields::new();
    f.insert("pipeline".into(), pipeline.into());
    if let Some(p) = partition {
        f.insert("partition".into(), p.into());
    }
    f.insert("attempt".into(), attempt.to_string());
    Some(f)
}

fn spanned_pipeline(clock: &VirtualClock) -> Pipeline {
    Pipeline::builder("spanned")
        .clock(clock.clone())
        .store(seawall::MemoryStore::new())
        .retry(Retry::constant(Duration::from_millis(5)).max_attempts(3))
        .circuit_breaker(CircuitBreaker::consecutive_failures(10))
        .build()
        .unwrap()
}

#[test]
fn a_sync_operation_logs_inside_the_span_of_its_attempt() {
    let clock = VirtualClock::new();
    let p = spanned_pipeline(&clock);
    let sub = Spanned {
        seawall_spans: true,
        ..Spanned::default()
    };
    tracing::subscriber::with_default(sub.clone(), || {
        let op = |ctx: seawall::Context| {
            tracing::info!("working");
            flaky(ctx)
        };
        assert_eq!(p.call(op).unwrap(), 2);
        assert_eq!(p.partition("tenant-7").call(op).unwrap(), 2);
    });
    assert_eq!(
        sub.spans_of("working"),
        [
            fields("spanned", None, 1),
            fields("spanned", None, 2),
            fields("spanned", Some("tenant-7"), 1),
            fields("spanned", Some("tenant-7"), 2),
        ]
    );
    let spans = sub.spans.lock().unwrap();
    assert!(
        spans.iter().all(|(name, _)| name == "seawall.call"),
        "{spans:?}"
    );
    assert!(sub.stack.lock().unwrap().is_empty());
}

#[test]
fn an_async_operation_and_its_future_log_inside_the_span_of_their_attempt() {
    let clock = VirtualClock::new();
    let p = spanned_pipeline(&clock);
    let sub = Spanned {
        seawall_spans: true,
        ..Spanned::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    tracing::subscriber::with_default(sub.clone(), || {
        rt.block_on(async {
            let op = |ctx: seawall::Context| {
                tracing::info!("creating");
                async move {
                    tokio::task::yield_now().await;
                    tracing::info!("working");
                    flaky(ctx)
                }
            };
            assert_eq!(p.run(op).await.unwrap(), 2);
            assert_eq!(p.partition(42u64).run(op).await.unwrap(), 2);
        })
    });
    let expected = [
        fields("spanned", None, 1),
        fields("spanned", None, 2),
        fields("spanned", Some("42"), 1),
        fields("spanned", Some("42"), 2),
    ];
    assert_eq!(sub.spans_of("creating"), expected);
    assert_eq!(sub.spans_of("working"), expected);
    assert!(sub.stack.lock().unwrap().is_empty());
}

#[test]
fn without_interest_in_the_span_the_operation_runs_outside_any_span() {
    let clock = VirtualClock::new();
    let p = spanned_pipeline(&clock);
    let sub = Spanned::default();
    tracing::subscriber::with_default(sub.clone(), || {
        let op = |ctx: seawall::Context| {
            tracing::info!("working");
            flaky(ctx)
        };
        assert_eq!(p.call(op).unwrap(), 2);
    });
    assert_eq!(sub.spans_of("working"), [None, None]);
    assert!(sub.spans.lock().unwrap().is_empty());
}

// ------------------------------------------------------------ rebinding

#[test]
fn a_live_name_bound_again_with_other_settings_is_a_warning() {
    use tracing::Level;
    let store = seawall::MemoryStore::new();
    let build = |failures: u32| {
        Pipeline::builder("rebound")
            .store(store.clone())
            .circuit_breaker(CircuitBreaker::consecutive_failures(failures))
            .build()
            .unwrap()
    };
    let warn = Leveled::new(Level::WARN);
    tracing::subscriber::with_default(warn.clone(), || {
        let first = build(1);
        let _same = build(1);
        let _other = build(2);
        drop(first);
    });
    let messages = warn.events.lock().unwrap().clone();
    assert_eq!(messages.len(), 1, "{messages:#?}");
    assert_eq!(messages[0].0, Level::WARN);
    assert!(
        messages[0]
            .1
            .starts_with("resource `rebound` bound again with a different circuit_breaker"),
        "{messages:#?}"
    );

    // Once nobody holds the old settings, binding the name again is quiet.
    let quiet = Leveled::new(Level::WARN);
    tracing::subscriber::with_default(quiet.clone(), || {
        drop(build(3));
        let _ = build(4);
    });
    assert!(quiet.events.lock().unwrap().is_empty());
}

/// A hedge started is a DEBUG event, a hedge the empty budget did not
/// start a WARN.
#[test]
fn hedges_are_debug_events_and_an_empty_budget_a_warning() {
    use seawall::{Hedging, RetryBudget};
    use tracing::Level;
    let clock = VirtualClock::starting_at(Duration::from_secs(1_000_000));
    let p = Pipeline::builder("traced-hedging")
        .clock(clock.clone())
        .hedging(Hedging::parallel().budget(RetryBudget::new(0.5, 1)))
        .build()
        .unwrap();
    let all = Leveled::new(Level::TRACE);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let run = || {
        rt.block_on(p.run(|ctx| {
            std::future::ready(match ctx.attempt() {
                2 => Ok(2),
                _ => Err("first attempt fails"),
            })
        }))
    };
    tracing::subscriber::with_default(all.clone(), || {
        // The first call spends the budget's only token; the second finds
        // half a token and starts no hedge.
        assert_eq!(run().unwrap(), 2);
        assert!(run().is_err());
    });
    // The first attempt failed at once: the hedge started on its failure.
    assert_eq!(all.at("hedged attempt 2 started (failure)"), [Level::DEBUG]);
    assert_eq!(
        all.at("hedged attempt 2 not started: hedging budget exhausted"),
        [Level::WARN]
    );
}
