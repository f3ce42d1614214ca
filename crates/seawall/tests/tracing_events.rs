//! With the `tracing` feature, events reach a subscriber that wants them,
//! whether it was installed before or after the pipeline was built, and
//! calls keep their results with or without one.
#![cfg(feature = "tracing")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seawall::testing::VirtualClock;
use seawall::{Bulkhead, CircuitBreaker, Pipeline, Retry};
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
