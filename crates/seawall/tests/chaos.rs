//! Chaos injection: faults, latencies and behaviours decided by the engine
//! for each attempt, drawn from the pipeline's random source. Every case
//! runs sync and async, with and without a listener, on the virtual clock.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seawall::chaos::{Chaos, ChaosKind, ChaosSwitch};
use seawall::store::MemoryStore;
use seawall::testing::{SequenceRandom, VirtualClock};
use seawall::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[derive(Debug, Clone, PartialEq)]
struct Boom(&'static str);
impl std::fmt::Display for Boom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}
impl std::error::Error for Boom {}

#[derive(Debug, Clone, Copy)]
struct Mode {
    sync: bool,
    listen: bool,
}

fn modes() -> Vec<Mode> {
    let mut v = Vec::new();
    for sync in [true, false] {
        for listen in [false, true] {
            v.push(Mode { sync, listen });
        }
    }
    v
}

type Events = Arc<Mutex<Vec<EventKind>>>;

impl Mode {
    /// A fresh store, the virtual clock, `random`, a listener if asked.
    fn builder(self, random: SequenceRandom) -> (PipelineBuilder, VirtualClock, Events) {
        let clock = VirtualClock::new();
        let events: Events = Arc::default();
        let mut b = Pipeline::builder("chaos")
            .store(MemoryStore::new())
            .clock(clock.clone())
            .random(random);
        if self.listen {
            let e = events.clone();
            b = b.on_event(move |ev: &Event<'_>| e.lock().unwrap().push(ev.kind.clone()));
        }
        (b, clock, events)
    }

    /// Runs one call of an operation that counts its runs in `ops` and
    /// succeeds with the run's number.
    fn call<K>(self, p: &Pipeline<K>, ops: &AtomicU32) -> Result<u32, Error<Boom>>
    where
        K: seawall::pipeline::HandlesSync<u32, Boom>,
    {
        let op = |_ctx: Context| Ok::<_, Boom>(ops.fetch_add(1, Ordering::SeqCst) + 1);
        if self.sync {
            p.call(op)
        } else {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(p.run(|ctx| std::future::ready(op(ctx))))
        }
    }
}

fn injected(events: &Events) -> Vec<(ChaosKind, u32)> {
    events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            EventKind::ChaosInjected { kind, attempt } => Some((*kind, *attempt)),
            _ => None,
        })
        .collect()
}

fn fault(rate: f64) -> seawall::chaos::ChaosFault<Boom> {
    Chaos::fault(rate, |_ctx| Boom("injected"))
}

fn retry3() -> Retry {
    Retry::constant(ms(10)).max_attempts(3)
}

#[test]
fn rate_zero_never_injects_and_rate_one_always() {
    for mode in modes() {
        // The sequence's values are the highest and lowest draws.
        let (b, clock, events) = mode.builder(SequenceRandom::new([0.0, 0.999]));
        let p = b
            .chaos(Chaos::latency(0.0, ms(100)))
            .chaos_fault(fault(0.0))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        for _ in 0..4 {
            assert!(mode.call(&p, &ops).is_ok(), "{mode:?}");
        }
        assert_eq!((ops.load(Ordering::SeqCst), clock.now()), (4, ms(0)));
        assert!(injected(&events).is_empty());

        let (b, _, events) = mode.builder(SequenceRandom::new([0.0, 0.999]));
        let p = b.chaos_fault(fault(1.0)).build().unwrap();
        let ops = AtomicU32::new(0);
        for _ in 0..4 {
            let r = mode.call(&p, &ops);
            assert!(
                matches!(r, Err(Error::Operation(Boom("injected")))),
                "{mode:?}"
            );
        }
        assert_eq!(ops.load(Ordering::SeqCst), 0, "a fault skips the operation");
        if mode.listen {
            assert_eq!(injected(&events), vec![(ChaosKind::Fault, 1); 4]);
        }
    }
}

#[test]
fn a_sequence_injects_on_the_expected_attempts_and_faults_are_retried() {
    for mode in modes() {
        // rate 0.5: draws under it inject (attempts 1 and 2), 0.7 does not.
        let (b, clock, events) = mode.builder(SequenceRandom::new([0.1, 0.4, 0.7]));
        let p = b.retry(retry3()).chaos_fault(fault(0.5)).build().unwrap();
        let ops = AtomicU32::new(0);
        assert_eq!(mode.call(&p, &ops).ok(), Some(1), "{mode:?}");
        assert_eq!(ops.load(Ordering::SeqCst), 1);
        // Two retry waits of 10 ms.
        assert_eq!(clock.now(), ms(20));
        if mode.listen {
            assert_eq!(
                injected(&events),
                vec![(ChaosKind::Fault, 1), (ChaosKind::Fault, 2)]
            );
            let retries = events
                .lock()
                .unwrap()
                .iter()
                .filter(|e| matches!(e, EventKind::RetryScheduled { .. }))
                .count();
            assert_eq!(retries, 2);
        }
    }
}

#[test]
fn an_injected_fault_is_counted_by_the_breaker() {
    for mode in modes() {
        let (b, _, _) = mode.builder(SequenceRandom::new([0.0]));
        let p = b
            .circuit_breaker(CircuitBreaker::consecutive_failures(2))
            .chaos_fault(fault(1.0))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        for _ in 0..2 {
            assert!(matches!(mode.call(&p, &ops), Err(Error::Operation(_))));
        }
        assert_eq!(p.circuit_state().unwrap(), CircuitState::Open, "{mode:?}");
        let r = mode.call(&p, &ops);
        assert!(matches!(r, Err(Error::Rejected(_))), "{mode:?}: {r:?}");
        assert_eq!(ops.load(Ordering::SeqCst), 0);
    }
}

#[test]
fn latency_adds_the_exact_virtual_time() {
    for mode in modes() {
        let (b, clock, events) = mode.builder(SequenceRandom::new([0.2, 0.9]));
        let p = b.chaos(Chaos::latency(0.5, ms(250))).build().unwrap();
        let ops = AtomicU32::new(0);
        assert_eq!(mode.call(&p, &ops).ok(), Some(1));
        assert_eq!(clock.now(), ms(250), "{mode:?}");
        assert_eq!(mode.call(&p, &ops).ok(), Some(2));
        assert_eq!(clock.now(), ms(250), "{mode:?}: 0.9 does not inject");
        if mode.listen {
            assert_eq!(
                injected(&events),
                vec![(ChaosKind::Latency { delay: ms(250) }, 1)]
            );
        }
    }
}

/// A latency of zero is no injection (as in Polly): the policy draws,
/// then injects nothing, reports nothing and sleeps nothing; the next
/// policy draws the next number. Sync and async, with and without a
/// listener, on a clock at 0 and at 10^6 s.
#[test]
fn a_zero_latency_is_no_injection() {
    for mode in modes() {
        for start in [Duration::ZERO, Duration::from_secs(1_000_000)] {
            // The zero latency draws 0.0 and 0.0 (both would inject), the
            // 10 ms one 0.3 (injects) and 0.9 (does not).
            let (b, clock, events) = mode.builder(SequenceRandom::new([0.0, 0.3, 0.0, 0.9]));
            clock.advance(start);
            let p = b
                .chaos(Chaos::latency(1.0, Duration::ZERO))
                .chaos(Chaos::latency(0.5, ms(10)))
                .build()
                .unwrap();
            let ops = AtomicU32::new(0);
            assert_eq!(mode.call(&p, &ops).ok(), Some(1));
            assert_eq!(clock.now(), start + ms(10), "{mode:?}");
            assert_eq!(mode.call(&p, &ops).ok(), Some(2));
            assert_eq!(clock.now(), start + ms(10), "{mode:?}");
            if mode.listen {
                assert_eq!(
                    injected(&events),
                    vec![(ChaosKind::Latency { delay: ms(10) }, 1)],
                    "{mode:?}"
                );
            }
        }
    }
}

#[test]
fn an_injected_latency_longer_than_the_attempt_timeout_times_out_in_async() {
    let mode = Mode {
        sync: false,
        listen: false,
    };
    let (b, clock, _) = mode.builder(SequenceRandom::new([0.0]));
    let p = b
        .retry(Retry::constant(ms(10)).max_attempts(2))
        .timeout(ms(100))
        .chaos(Chaos::latency(1.0, ms(500)))
        .build()
        .unwrap();
    let ops = AtomicU32::new(0);
    let r = mode.call(&p, &ops);
    assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
    assert_eq!(ops.load(Ordering::SeqCst), 0, "the operation never ran");
    // Two attempts of 100 ms and one wait of 10 ms.
    assert_eq!(clock.now(), ms(210));
}

#[test]
fn a_behaviour_runs_before_the_operation() {
    for mode in modes() {
        let (b, _, events) = mode.builder(SequenceRandom::new([0.0]));
        let hooked = Arc::new(AtomicU32::new(0));
        let h = hooked.clone();
        let p = b
            .chaos(Chaos::behavior(1.0, move |ctx| {
                assert_eq!(ctx.attempt(), 1);
                h.fetch_add(1, Ordering::SeqCst);
            }))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        assert_eq!(mode.call(&p, &ops).ok(), Some(1));
        assert_eq!(hooked.load(Ordering::SeqCst), 1, "{mode:?}");
        if mode.listen {
            assert_eq!(injected(&events), vec![(ChaosKind::Behavior, 1)]);
        }
    }
}

#[test]
fn the_switch_flipped_at_run_time_takes_effect_on_the_next_call() {
    for mode in modes() {
        let switch = ChaosSwitch::new(false);
        let flag = Arc::new(AtomicBool::new(true));
        let (b, clock, _) = mode.builder(SequenceRandom::new([0.0]));
        let p = b
            .chaos_fault(fault(1.0).enabled(switch.clone()))
            .chaos(Chaos::latency(1.0, ms(5)).enabled(flag.clone()))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        assert_eq!(mode.call(&p, &ops).ok(), Some(1), "{mode:?}");
        assert_eq!(clock.now(), ms(5));
        switch.set(true);
        flag.store(false, Ordering::Relaxed);
        assert!(matches!(mode.call(&p, &ops), Err(Error::Operation(_))));
        assert_eq!(clock.now(), ms(5));
        switch.set(false);
        assert_eq!(mode.call(&p, &ops).ok(), Some(2));

        // A closure as the switch, asked for each attempt.
        let on = Arc::new(AtomicBool::new(false));
        let when = on.clone();
        let (b, _, _) = mode.builder(SequenceRandom::new([0.0]));
        let p = b
            .chaos_fault(fault(1.0).enabled_when(move || when.load(Ordering::Relaxed)))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        assert_eq!(mode.call(&p, &ops).ok(), Some(1), "{mode:?}");
        on.store(true, Ordering::Relaxed);
        assert!(matches!(mode.call(&p, &ops), Err(Error::Operation(_))));
        assert_eq!(ops.load(Ordering::SeqCst), 1);
    }
}

#[test]
fn a_rate_generator_decides_each_attempt() {
    for mode in modes() {
        let (b, _, _) = mode.builder(SequenceRandom::new([0.5]));
        let p = b
            .retry(retry3())
            .chaos_fault(fault(0.0).rate_generator(|ctx| if ctx.attempt() < 3 { 1.0 } else { 0.0 }))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        assert_eq!(mode.call(&p, &ops).ok(), Some(1), "{mode:?}");
    }
}

#[test]
fn invalid_rates_and_chaos_before_the_retry_are_refused() {
    for bad in [-0.5, 1.01, f64::NAN] {
        let e = Pipeline::builder("chaos-bad")
            .chaos(Chaos::latency(bad, ms(1)))
            .build()
            .unwrap_err();
        assert_eq!((e.policy, e.field), ("chaos", "rate"), "{e}");
    }
    let e = Pipeline::builder("chaos-bad")
        .chaos(Chaos::latency(0.5, ms(1)))
        .retry(retry3())
        .build()
        .unwrap_err();
    assert_eq!((e.policy, e.field), ("pipeline", "chaos"), "{e}");
    assert!(e.to_string().contains("is declared before `retry`"), "{e}");
}

/// A file declares a latency injection (rate, latency, enabled); listed
/// before the retry it is refused, naming the reason.
#[cfg(feature = "serde")]
#[test]
fn a_configuration_file_declares_a_latency_injection() {
    use seawall::config::{Config, Format};
    let text = r#"
        [pipelines.a]
        retry = { backoff = "constant", delay = "10ms", max_attempts = 2 }
        chaos = { rate = 1.0, latency = "40ms" }

        [pipelines.off]
        chaos = { rate = 1.0, latency = "40ms", enabled = false }
    "#;
    let config = Config::parse(Format::Toml, text).unwrap();
    for (name, elapsed) in [("a", ms(40)), ("off", ms(0))] {
        let clock = VirtualClock::new();
        let p = config
            .builder(name)
            .unwrap()
            .store(MemoryStore::new())
            .clock(clock.clone())
            .random(SequenceRandom::new([0.0]))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let mode = Mode {
            sync: true,
            listen: false,
        };
        assert_eq!(mode.call(&p, &ops).ok(), Some(1));
        assert_eq!(clock.now(), elapsed, "{name}");
    }
    let before = r#"
        [pipelines.before]
        policies = ["chaos", "retry"]
        retry = { delay = "10ms" }
        chaos = { rate = 0.5, latency = "40ms" }
    "#;
    let e = Config::parse(Format::Toml, before).unwrap_err().to_string();
    assert!(e.contains("chaos is declared before `retry`"), "{e}");
    let bad_rate = "[pipelines.r]\nchaos = { rate = 2.0, latency = \"1ms\" }\n";
    let e = Config::parse(Format::Toml, bad_rate)
        .unwrap_err()
        .to_string();
    assert!(e.contains("chaos.rate must be a number in 0..=1"), "{e}");
}

/// Policies act in declaration order: latencies add up, a fault after them
/// ends the attempt once they were slept; in sync code a strict timeout
/// turns an attempt made late by a latency into a timeout.
#[test]
fn latencies_add_up_before_a_fault_and_a_strict_sync_timeout_sees_them() {
    for mode in modes() {
        let (b, clock, events) = mode.builder(SequenceRandom::new([0.0]));
        let p = b
            .chaos(Chaos::latency(1.0, ms(30)))
            .chaos(Chaos::latency(1.0, ms(12)))
            .chaos_fault(fault(1.0))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        assert!(matches!(mode.call(&p, &ops), Err(Error::Operation(_))));
        assert_eq!((clock.now(), ops.load(Ordering::SeqCst)), (ms(42), 0));
        if mode.listen {
            assert_eq!(injected(&events).len(), 3, "{mode:?}");
        }
    }
    let mode = Mode {
        sync: true,
        listen: false,
    };
    let (b, _, _) = mode.builder(SequenceRandom::new([0.0]));
    let p = b
        .timeout(Timeout::strict(ms(100)))
        .chaos(Chaos::latency(1.0, ms(500)))
        .build()
        .unwrap();
    let ops = AtomicU32::new(0);
    let r = mode.call(&p, &ops);
    assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
}

/// An outcome ends the attempt with the generated value without running
/// the operation; it fixes the pipeline's value type, alone, after a
/// classifier or with a fallback.
#[test]
fn an_outcome_skips_the_operation() {
    for mode in modes() {
        let (b, _, events) = mode.builder(SequenceRandom::new([0.3, 0.8]));
        let p: Pipeline<seawall::pipeline::ValueType<u32, Boom>> = b
            .chaos_outcome(Chaos::outcome(0.5, |ctx| 100 + ctx.attempt()))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        assert_eq!(mode.call(&p, &ops).ok(), Some(101), "{mode:?}");
        assert_eq!(ops.load(Ordering::SeqCst), 0, "the operation did not run");
        assert_eq!(mode.call(&p, &ops).ok(), Some(1), "0.8 does not inject");
        if mode.listen {
            assert_eq!(injected(&events), vec![(ChaosKind::Outcome, 1)]);
        }

        // After a classifier, and with a fallback (which keeps it).
        let (b, _, _) = mode.builder(SequenceRandom::new([0.0]));
        let p = b
            .classify(|_: &Boom| Verdict::abort())
            .chaos_outcome(Chaos::outcome(1.0, |_| 7u32))
            .fallback_sync(|_, _| Ok(0))
            .build()
            .unwrap();
        assert_eq!(mode.call(&p, &ops).ok(), Some(7), "{mode:?}");
        assert_eq!(ops.load(Ordering::SeqCst), 1);
    }
}
