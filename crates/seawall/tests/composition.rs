//! Stateful policies on either side of the retry: declared after it they
//! guard each attempt, before it the whole call (one admission, one
//! outcome per call). Every case runs sync and async, with and without a
//! listener, with the virtual clock at 0 and at 10^6 s.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seawall::store::MemoryStore;
use seawall::testing::VirtualClock;
use seawall::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[derive(Debug, Clone, PartialEq)]
struct Boom;
impl std::fmt::Display for Boom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("boom")
    }
}
impl std::error::Error for Boom {}

/// One way of running calls.
#[derive(Debug, Clone, Copy)]
struct Mode {
    sync: bool,
    listen: bool,
    start: Duration,
}

fn modes() -> Vec<Mode> {
    let mut v = Vec::new();
    for sync in [true, false] {
        for listen in [false, true] {
            for start in [Duration::ZERO, secs(1_000_000)] {
                v.push(Mode {
                    sync,
                    listen,
                    start,
                })
            }
        }
    }
    v
}

type Events = Arc<Mutex<Vec<EventKind>>>;

impl Mode {
    /// The builder's own settings: a fresh store, the virtual clock, a
    /// listener if asked.
    fn builder(self, name: &str, store: &MemoryStore) -> (PipelineBuilder, Events) {
        let clock = VirtualClock::starting_at(self.start);
        let events: Events = Arc::default();
        let mut b = Pipeline::builder(name).store(store.clone()).clock(clock);
        if self.listen {
            let e = events.clone();
            b = b.on_event(move |ev: &Event<'_>| e.lock().unwrap().push(ev.kind.clone()));
        }
        (b, events)
    }

    /// Runs one call of `op` (which counts its calls in `ops`).
    fn call<K>(
        self,
        p: &Pipeline<K>,
        ops: &AtomicU32,
        op: impl Fn(u32) -> Result<u32, Boom>,
    ) -> Result<u32, Error<Boom>>
    where
        K: seawall::pipeline::HandlesSync<u32, Boom>,
    {
        let op = |_ctx: Context| op(ops.fetch_add(1, Ordering::SeqCst) + 1);
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

fn fail(_: u32) -> Result<u32, Boom> {
    Err(Boom)
}

fn rejected(r: &Result<u32, Error<Boom>>) -> Option<RejectionReason> {
    match r {
        Err(Error::Rejected(r)) => Some(r.reason),
        _ => None,
    }
}

fn retry3() -> Retry {
    Retry::constant(ms(10)).max_attempts(3)
}

#[test]
fn a_breaker_before_the_retry_counts_one_failure_per_exhausted_call() {
    for mode in modes() {
        let store = MemoryStore::new();
        let (b, events) = mode.builder("outer-breaker", &store);
        let p = b
            .circuit_breaker(CircuitBreaker::consecutive_failures(2))
            .retry(retry3())
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let r = mode.call(&p, &ops, fail);
        assert!(
            matches!(r, Err(Error::RetryExhausted { attempts: 3, .. })),
            "{mode:?} {r:?}"
        );
        assert_eq!(ops.load(Ordering::SeqCst), 3, "{mode:?}");
        let m = p.circuit_metrics().unwrap();
        assert_eq!((m.state, m.failures), (CircuitState::Closed, 1), "{mode:?}");

        let r = mode.call(&p, &ops, fail);
        assert!(matches!(r, Err(Error::RetryExhausted { .. })), "{mode:?}");
        assert_eq!(ops.load(Ordering::SeqCst), 6, "{mode:?}");
        assert_eq!(p.circuit_state().unwrap(), CircuitState::Open, "{mode:?}");

        let r = mode.call(&p, &ops, fail);
        assert_eq!(rejected(&r), Some(RejectionReason::CircuitOpen), "{mode:?}");
        assert_eq!(
            ops.load(Ordering::SeqCst),
            6,
            "{mode:?} the op is not called"
        );
        if mode.listen {
            let e = events.lock().unwrap();
            let opened = e
                .iter()
                .filter(|k| matches!(k, EventKind::CircuitOpened { .. }))
                .count();
            let refused = e
                .iter()
                .filter(|k| matches!(k, EventKind::Rejected { .. }))
                .count();
            assert_eq!((opened, refused), (1, 1), "{mode:?}");
        }
    }
}

#[test]
fn a_breaker_after_the_retry_counts_each_attempt() {
    for mode in modes() {
        let store = MemoryStore::new();
        let (b, _) = mode.builder("inner-breaker", &store);
        let p = b
            .retry(retry3())
            .circuit_breaker(CircuitBreaker::consecutive_failures(2))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let r = mode.call(&p, &ops, fail);
        // Opened by the second attempt: the third is refused.
        assert_eq!(rejected(&r), Some(RejectionReason::CircuitOpen), "{mode:?}");
        assert_eq!(ops.load(Ordering::SeqCst), 2, "{mode:?}");
        assert_eq!(p.circuit_state().unwrap(), CircuitState::Open, "{mode:?}");
    }
}

#[test]
fn a_breaker_before_the_retry_records_a_success_after_retries_as_one_success() {
    for mode in modes() {
        let store = MemoryStore::new();
        let (b, _) = mode.builder("outer-breaker-ok", &store);
        let p = b
            .circuit_breaker(CircuitBreaker::consecutive_failures(1))
            .retry(retry3())
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        // Fails twice, then succeeds: the call is one success.
        let r = mode.call(&p, &ops, |n| if n < 3 { Err(Boom) } else { Ok(n) });
        assert_eq!(r.unwrap(), 3, "{mode:?}");
        let m = p.circuit_metrics().unwrap();
        assert_eq!((m.state, m.failures), (CircuitState::Closed, 0), "{mode:?}");
    }
}

#[test]
fn a_slow_call_before_the_retry_is_measured_over_the_whole_call() {
    for mode in modes() {
        let store = MemoryStore::new();
        let (b, _) = mode.builder("outer-slow", &store);
        // Each attempt fails at once; the two waits of 1 s make the call slow.
        let p = b
            .circuit_breaker(
                CircuitBreaker::failure_rate(1.0)
                    .count_window(10)
                    .minimum_calls(1)
                    .slow_calls(1.0, ms(1500)),
            )
            .retry(Retry::constant(secs(1)).max_attempts(3))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let r = mode.call(&p, &ops, |n| if n < 3 { Err(Boom) } else { Ok(n) });
        assert_eq!(r.unwrap(), 3, "{mode:?}");
        let m = p.circuit_metrics().unwrap();
        assert_eq!((m.calls, m.slow_calls), (1, 1), "{mode:?}");
    }
}

/// What `in_flight()` says during each retry wait (read by the retry's
/// hook, through a second pipeline of the same declaration: it shares the
/// state), and after the call.
fn in_flight_during_the_wait(mode: Mode, name: &str, before: bool) -> (Vec<u32>, u32) {
    let store = MemoryStore::new();
    let declare = |b: PipelineBuilder| {
        if before {
            b.bulkhead(Bulkhead::new(1)).retry(retry3())
        } else {
            b.retry(retry3()).bulkhead(Bulkhead::new(1))
        }
    };
    let probe = declare(mode.builder(name, &store).0).build().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let probe2 = probe.clone();
    let p = declare(mode.builder(name, &store).0)
        .on_retry(move |_: &Boom, _, _| s.lock().unwrap().push(probe2.in_flight().unwrap()))
        .build()
        .unwrap();
    let ops = AtomicU32::new(0);
    let r = mode.call(&p, &ops, fail);
    assert!(matches!(r, Err(Error::RetryExhausted { .. })), "{mode:?}");
    assert_eq!(ops.load(Ordering::SeqCst), 3);
    let seen = seen.lock().unwrap().clone();
    (seen, p.in_flight().unwrap())
}

#[test]
fn a_bulkhead_before_the_retry_holds_its_slot_through_the_waits() {
    for mode in modes() {
        assert_eq!(
            in_flight_during_the_wait(mode, "outer-bulkhead", true),
            (vec![1, 1], 0),
            "{mode:?}"
        );
    }
}

#[test]
fn a_bulkhead_after_the_retry_frees_its_slot_during_the_waits() {
    for mode in modes() {
        assert_eq!(
            in_flight_during_the_wait(mode, "inner-bulkhead", false),
            (vec![0, 0], 0),
            "{mode:?}"
        );
    }
}

#[test]
fn a_full_bulkhead_before_the_retry_refuses_the_second_call() {
    for mode in modes() {
        let store = MemoryStore::new();
        let (b, _) = mode.builder("outer-bulkhead-full", &store);
        let p = b
            .bulkhead(Bulkhead::new(1))
            .retry(retry3())
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let inner = p.clone();
        let r = mode.call(&p, &ops, |_| {
            // A call nested in the first one finds the slot taken.
            let r = inner.call(|_| Ok::<u32, Boom>(0));
            Ok(rejected(&r).map_or(0, |_| 1))
        });
        assert_eq!(r.unwrap(), 1, "{mode:?}");
        assert_eq!(p.in_flight().unwrap(), 0, "{mode:?}");
    }
}

#[test]
fn a_rate_limiter_before_the_retry_takes_one_permit_per_call() {
    for mode in modes() {
        let store = MemoryStore::new();
        let (b, _) = mode.builder("outer-limit", &store);
        let p = b
            .rate_limiter(RateLimiter::fixed_window(2, secs(3600)))
            .retry(retry3())
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        for _ in 0..2 {
            let r = mode.call(&p, &ops, fail);
            assert!(
                matches!(r, Err(Error::RetryExhausted { attempts: 3, .. })),
                "{mode:?}"
            );
        }
        assert_eq!(ops.load(Ordering::SeqCst), 6, "{mode:?}");
        let r = mode.call(&p, &ops, fail);
        assert_eq!(rejected(&r), Some(RejectionReason::RateLimited), "{mode:?}");
        assert_eq!(ops.load(Ordering::SeqCst), 6, "{mode:?}");
    }
}

#[test]
fn a_rate_limiter_after_the_retry_takes_one_permit_per_attempt() {
    for mode in modes() {
        let store = MemoryStore::new();
        let (b, _) = mode.builder("inner-limit", &store);
        let p = b
            .retry(retry3())
            .rate_limiter(RateLimiter::fixed_window(2, secs(3600)))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let r = mode.call(&p, &ops, fail);
        assert_eq!(rejected(&r), Some(RejectionReason::RateLimited), "{mode:?}");
        assert_eq!(ops.load(Ordering::SeqCst), 2, "{mode:?}");
    }
}

#[test]
fn a_cooldown_before_the_retry_is_opened_by_the_final_error_hint() {
    for mode in modes() {
        let store = MemoryStore::new();
        let (b, _) = mode.builder("outer-cooldown", &store);
        let p = b
            .cooldown(Cooldown::new().max_wait(secs(1)))
            .retry(retry3())
            .classify(|_: &Boom| Verdict::retry().with_retry_after(secs(30)))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let r = mode.call(&p, &ops, fail);
        // The hints space the attempts; the call itself was admitted once.
        assert!(
            matches!(r, Err(Error::RetryExhausted { attempts: 3, .. })),
            "{mode:?}"
        );
        let r = mode.call(&p, &ops, fail);
        assert_eq!(
            rejected(&r),
            Some(RejectionReason::CooldownActive),
            "{mode:?}"
        );
        assert_eq!(ops.load(Ordering::SeqCst), 3, "{mode:?}");
    }
}

#[test]
fn a_breaker_outside_and_a_bulkhead_inside() {
    for mode in modes() {
        let store = MemoryStore::new();
        let declare = |b: PipelineBuilder| {
            b.circuit_breaker(CircuitBreaker::consecutive_failures(2))
                .retry(retry3())
                .bulkhead(Bulkhead::new(1))
        };
        let probe = declare(mode.builder("both", &store).0).build().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let p = declare(mode.builder("both", &store).0)
            .on_retry(move |_: &Boom, _, _| s.lock().unwrap().push(probe.in_flight().unwrap()))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let r = mode.call(&p, &ops, fail);
        assert!(matches!(r, Err(Error::RetryExhausted { .. })), "{mode:?}");
        assert_eq!(*seen.lock().unwrap(), [0, 0], "{mode:?}");
        assert_eq!(p.circuit_metrics().unwrap().failures, 1, "{mode:?}");
        let _ = mode.call(&p, &ops, fail);
        let r = mode.call(&p, &ops, fail);
        assert_eq!(rejected(&r), Some(RejectionReason::CircuitOpen), "{mode:?}");
        assert_eq!(ops.load(Ordering::SeqCst), 6, "{mode:?}");
        assert_eq!(p.in_flight().unwrap(), 0, "{mode:?}");
    }
}

#[test]
fn an_inner_refusal_gives_the_outer_permit_back_without_an_outcome() {
    for mode in modes() {
        let store = MemoryStore::new();
        let (b, _) = mode.builder("inner-refusal", &store);
        let p = b
            .circuit_breaker(CircuitBreaker::consecutive_failures(1))
            .bulkhead(Bulkhead::new(1))
            .retry(retry3())
            .rate_limiter(RateLimiter::fixed_window(1, secs(3600)))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let _ = mode.call(&p, &ops, |_| Ok(0));
        // The attempt's limiter refuses: not a failure of the dependency.
        let r = mode.call(&p, &ops, |_| Ok(0));
        assert_eq!(rejected(&r), Some(RejectionReason::RateLimited), "{mode:?}");
        let m = p.circuit_metrics().unwrap();
        assert_eq!((m.state, m.failures), (CircuitState::Closed, 0), "{mode:?}");
        assert_eq!(p.in_flight().unwrap(), 0, "{mode:?}");
    }
}

#[test]
fn the_call_level_state_is_its_own_resource() {
    let store = MemoryStore::new();
    let outer = Pipeline::builder("shared-name")
        .store(store.clone())
        .circuit_breaker(CircuitBreaker::consecutive_failures(1))
        .retry(Retry::constant(ms(1)).max_attempts(2))
        .clock(VirtualClock::new())
        .build()
        .unwrap();
    let inner = Pipeline::builder("shared-name")
        .store(store.clone())
        .retry(Retry::constant(ms(1)).max_attempts(2))
        .circuit_breaker(CircuitBreaker::consecutive_failures(1))
        .clock(VirtualClock::new())
        .build()
        .unwrap();
    outer.isolate().unwrap();
    assert_eq!(inner.circuit_state().unwrap(), CircuitState::Closed);
    assert_eq!(inner.call(|_| Ok::<_, Boom>(1)).unwrap(), 1);
    assert!(outer.call(|_| Ok::<_, Boom>(1)).is_err());
}

#[test]
fn a_rate_limiter_before_the_retry_defers_the_call_when_the_wait_fits() {
    for mode in modes() {
        let store = MemoryStore::new();
        let (b, events) = mode.builder("outer-limit-wait", &store);
        let p = b
            .rate_limiter(RateLimiter::fixed_window(1, secs(1)).max_wait(secs(2)))
            .retry(retry3())
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let r = mode.call(&p, &ops, fail);
        assert!(matches!(r, Err(Error::RetryExhausted { .. })), "{mode:?}");
        // The second call waits for the next window, then makes its three
        // attempts on one permit.
        let r = mode.call(&p, &ops, |n| if n < 6 { Err(Boom) } else { Ok(n) });
        assert_eq!(r.unwrap(), 6, "{mode:?}");
        if mode.listen {
            let e = events.lock().unwrap();
            let deferred = e
                .iter()
                .filter(|k| matches!(k, EventKind::Deferred { .. }))
                .count();
            assert_eq!(deferred, 1, "{mode:?}");
        }
    }
}

#[test]
fn a_call_that_panics_gives_back_its_call_level_slot() {
    for mode in modes().into_iter().filter(|m| m.sync) {
        let store = MemoryStore::new();
        let (b, _) = mode.builder("outer-panic", &store);
        let p = b
            .bulkhead(Bulkhead::new(1))
            .retry(retry3())
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            mode.call(&p, &ops, |n| if n < 2 { Err(Boom) } else { panic!("op") })
        }));
        assert!(caught.is_err());
        assert_eq!(p.in_flight().unwrap(), 0, "{mode:?}");
        assert_eq!(mode.call(&p, &ops, Ok).unwrap(), 3, "{mode:?}");
    }
}

#[test]
fn an_async_call_queues_for_a_call_level_slot() {
    for mode in modes().into_iter().filter(|m| !m.sync) {
        let store = MemoryStore::new();
        let (b, events) = mode.builder("outer-queue", &store);
        let p = b
            .bulkhead(Bulkhead::new(1).queue(1, ms(100)))
            .retry(retry3())
            .build()
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let inner = p.clone();
        let nested = rt.block_on(p.run(|_ctx| {
            let inner = inner.clone();
            async move {
                // The slot is this call's own: the nested call queues for
                // its `max_wait`, then is refused.
                let r: Result<u32, Error<Boom>> = inner.run(|_| async { Ok(0) }).await;
                Ok::<_, Boom>(rejected(&r))
            }
        }));
        assert_eq!(
            nested.unwrap(),
            Some(RejectionReason::BulkheadFull),
            "{mode:?}"
        );
        assert_eq!(p.in_flight().unwrap(), 0, "{mode:?}");
        if mode.listen {
            let e = events.lock().unwrap();
            assert!(
                e.iter().any(|k| matches!(k, EventKind::Deferred { .. })),
                "{mode:?}"
            );
        }
    }
}
