//! The stateful policies through a pipeline on the in-memory store:
//! composition, deferral, release of permits, partitions, manual control.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seawall::testing::VirtualClock;
use seawall::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[derive(Debug, Clone, PartialEq)]
struct Fail;

type Log = Arc<Mutex<Vec<EventKind>>>;

fn recorder() -> (Log, impl Fn(&Event<'_>) + Send + Sync + 'static) {
    let log: Log = Arc::default();
    let l = log.clone();
    (log, move |e: &Event<'_>| {
        if !matches!(
            e.kind,
            EventKind::AttemptFinished { .. } | EventKind::CallFinished { .. }
        ) {
            l.lock().unwrap().push(e.kind.clone())
        }
    })
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

fn reason<T: std::fmt::Debug>(r: Result<T, Error<Fail>>) -> RejectionReason {
    match r {
        Err(Error::Rejected(r)) => r.reason,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[test]
fn nested_call_through_a_full_bulkhead_is_refused_and_never_runs() {
    let p = Pipeline::builder("s-nested")
        .bulkhead(Bulkhead::new(1))
        .store(MemoryStore::new())
        .build()
        .unwrap();
    let inner_ran = AtomicU32::new(0);
    let outer = p.call(|_| {
        let inner = p.call(|_| {
            inner_ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Fail>(())
        });
        Ok::<_, Fail>(reason(inner))
    });
    assert_eq!(outer.unwrap(), RejectionReason::BulkheadFull);
    assert_eq!(inner_ran.load(Ordering::SeqCst), 0);
    assert_eq!(p.in_flight().unwrap(), 0);
}

#[test]
fn a_panicking_operation_gives_its_slot_back() {
    let p = Pipeline::builder("s-panic")
        .bulkhead(Bulkhead::new(1))
        .store(MemoryStore::new())
        .build()
        .unwrap();
    let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
        p.call(|_| -> Result<(), Fail> {
            assert_eq!(p.in_flight().unwrap(), 1);
            panic!("boom")
        })
    }));
    assert!(r.is_err());
    assert_eq!(p.in_flight().unwrap(), 0);
    assert!(p.call(|_| Ok::<_, Fail>(())).is_ok());
}

#[test]
fn a_dropped_future_gives_its_slot_back() {
    let p = Pipeline::builder("s-drop")
        .bulkhead(Bulkhead::new(1))
        .store(MemoryStore::new())
        .build()
        .unwrap();
    let rt = rt();
    rt.block_on(async {
        let fut = p.run(|_| async {
            std::future::pending::<()>().await;
            Ok::<_, Fail>(())
        });
        // poll once, so that the attempt holds its slot, then drop it
        let mut fut = Box::pin(fut);
        assert!(futures_poll_once(fut.as_mut()).await.is_none());
        assert_eq!(p.in_flight().unwrap(), 1);
        drop(fut);
        assert_eq!(p.in_flight().unwrap(), 0);
    });
}

async fn futures_poll_once<F: std::future::Future + Unpin>(mut f: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut f).poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

#[test]
fn a_later_refusal_gives_back_the_earlier_permits() {
    let clock = VirtualClock::new();
    let p = Pipeline::builder("s-later")
        .bulkhead(Bulkhead::new(1))
        .rate_limiter(RateLimiter::fixed_window(1, secs(60)))
        .store(MemoryStore::new())
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(p.call(|_| Ok::<_, Fail>(())).is_ok());
    assert_eq!(
        reason(p.call(|_| Ok::<_, Fail>(()))),
        RejectionReason::RateLimited
    );
    assert_eq!(
        p.in_flight().unwrap(),
        0,
        "the bulkhead slot taken before the rate limiter refused is back"
    );
}

#[test]
fn circuit_opens_rejects_probes_and_closes_with_events() {
    let clock = VirtualClock::new();
    let (log, l) = recorder();
    let p = Pipeline::builder("s-circuit")
        .circuit_breaker(
            CircuitBreaker::consecutive_failures(3)
                .cooldown(secs(30))
                .half_open_calls(1),
        )
        .store(MemoryStore::new())
        .clock(clock.clone())
        .on_event(l)
        .build()
        .unwrap();
    for _ in 0..3 {
        assert!(matches!(
            p.call(|_| Err::<(), _>(Fail)),
            Err(Error::Operation(Fail))
        ));
    }
    assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
    let mut ran = false;
    let r = p.call(|_| {
        ran = true;
        Ok::<_, Fail>(())
    });
    assert!(!ran);
    match r {
        Err(Error::Rejected(r)) => {
            assert_eq!(r.reason, RejectionReason::CircuitOpen);
            assert_eq!(r.retry_after, Some(secs(30)));
        }
        other => panic!("{other:?}"),
    }
    clock.advance(secs(30));
    assert!(p.call(|_| Ok::<_, Fail>(())).is_ok());
    assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
    let log = log.lock().unwrap();
    assert_eq!(
        *log,
        vec![
            EventKind::CircuitOpened { cooldown: secs(30) },
            EventKind::Rejected {
                reason: RejectionReason::CircuitOpen,
                retry_after: Some(secs(30))
            },
            EventKind::CircuitHalfOpened,
            EventKind::CircuitClosed,
        ]
    );
}

#[test]
fn retry_outside_the_breaker_stops_when_the_circuit_opens() {
    let clock = VirtualClock::new();
    let p = Pipeline::builder("s-retry-breaker")
        .retry(Retry::constant(ms(10)).max_attempts(10))
        .circuit_breaker(CircuitBreaker::consecutive_failures(2))
        .store(MemoryStore::new())
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut calls = 0;
    let r = p.call(|_| {
        calls += 1;
        Err::<(), _>(Fail)
    });
    assert_eq!(
        calls, 2,
        "the third attempt was refused by the open circuit"
    );
    assert_eq!(reason(r), RejectionReason::CircuitOpen);
}

#[test]
fn two_pipelines_with_one_name_and_store_share_one_circuit() {
    let store = MemoryStore::new();
    let build = || {
        Pipeline::builder("s-shared")
            .circuit_breaker(CircuitBreaker::consecutive_failures(1))
            .store(store.clone())
            .build()
            .unwrap()
    };
    let (a, b) = (build(), build());
    let _ = a.call(|_| Err::<(), _>(Fail));
    assert_eq!(
        reason(b.call(|_| Ok::<_, Fail>(()))),
        RejectionReason::CircuitOpen
    );
    // another store: another circuit
    let c = Pipeline::builder("s-shared")
        .circuit_breaker(CircuitBreaker::consecutive_failures(1))
        .store(MemoryStore::new())
        .build()
        .unwrap();
    assert!(c.call(|_| Ok::<_, Fail>(())).is_ok());
}

/// Two pipelines of one name on one store share the bulkhead's slots, and
/// so its queue: a slot given back through one goes at once to the oldest
/// waiter, whichever pipeline it queued through, and a call through one
/// does not pass a call queued through the other (nor find room in a
/// queue the other filled).
#[test]
fn two_pipelines_with_one_name_and_store_share_one_bulkhead_queue() {
    for start in [Duration::ZERO, secs(1_000_000)] {
        for listening in [false, true] {
            for max_queued in [1, 5] {
                let clock = VirtualClock::starting_at(start);
                let store = MemoryStore::new();
                let (log, listener) = recorder();
                let listener = Arc::new(listener);
                let build = || {
                    let mut b = Pipeline::builder("s-shared-queue")
                        .bulkhead(Bulkhead::new(1).queue(max_queued, secs(10)))
                        .store(store.clone())
                        .clock(clock.clone());
                    if listening {
                        let l = Arc::clone(&listener);
                        b = b.on_event(move |e: &Event<'_>| l(e));
                    }
                    b.build().unwrap()
                };
                let (a, b) = (build(), build());
                let started: Arc<Mutex<Vec<(&str, Duration)>>> = Arc::default();
                let call = |p: &Pipeline, name: &'static str, at: u64, hold: u64| {
                    let (p, clock, started) = (p.clone(), clock.clone(), started.clone());
                    async move {
                        seawall::Clock::sleep(&clock, ms(at)).await;
                        p.run(move |_| {
                            let (clock, started) = (clock.clone(), started.clone());
                            async move {
                                started.lock().unwrap().push((name, clock.now() - start));
                                seawall::Clock::sleep(&clock, ms(hold)).await;
                                Ok::<_, Fail>(name)
                            }
                        })
                        .await
                    }
                };
                let (holder, b_waiter, a_waiter) = rt().block_on(async {
                    tokio::join!(
                        call(&a, "holder", 0, 100),
                        call(&b, "b-waiter", 1, 10),
                        call(&a, "a-waiter", 2, 10),
                    )
                });
                let case =
                    format!("start {start:?}, listening {listening}, max_queued {max_queued}");
                assert_eq!(holder.unwrap(), "holder", "{case}");
                assert_eq!(b_waiter.unwrap(), "b-waiter", "{case}");
                let mut want = vec![("holder", ms(0)), ("b-waiter", ms(100))];
                if max_queued == 1 {
                    assert_eq!(reason(a_waiter), RejectionReason::BulkheadFull, "{case}");
                } else {
                    assert_eq!(a_waiter.unwrap(), "a-waiter", "{case}");
                    want.push(("a-waiter", ms(110)));
                }
                assert_eq!(*started.lock().unwrap(), want, "{case}");
                assert_eq!((a.in_flight().unwrap(), b.in_flight().unwrap()), (0, 0));
                assert_eq!(log.lock().unwrap().is_empty(), !listening, "{case}");
            }
        }
    }
}

#[test]
fn manual_control_isolates_forces_closed_and_resets() {
    let p = Pipeline::builder("s-manual")
        .circuit_breaker(CircuitBreaker::consecutive_failures(1))
        .store(MemoryStore::new())
        .build()
        .unwrap();
    p.isolate().unwrap();
    assert_eq!(p.circuit_state().unwrap(), CircuitState::Isolated);
    assert_eq!(
        reason(p.call(|_| Ok::<_, Fail>(()))),
        RejectionReason::CircuitOpen
    );
    p.force_close().unwrap();
    assert_eq!(p.circuit_state().unwrap(), CircuitState::Disabled);
    for _ in 0..5 {
        let _ = p.call(|_| Err::<(), _>(Fail));
    }
    assert_eq!(p.circuit_state().unwrap(), CircuitState::Disabled);
    p.reset().unwrap();
    assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
    let no_breaker = Pipeline::builder("s-manual-none").build().unwrap();
    assert!(matches!(
        no_breaker.isolate(),
        Err(seawall::pipeline::ControlError::NoCircuitBreaker(_))
    ));
}

#[test]
fn cooldown_defers_refuses_or_exceeds_the_deadline() {
    let clock = VirtualClock::new();
    let (log, l) = recorder();
    let l = Arc::new(l);
    let build = |store: &MemoryStore, max_wait: Duration, timeout: Option<Duration>| {
        let l = l.clone();
        let b = Pipeline::builder("s-cooldown")
            .store(store.clone())
            .clock(clock.clone())
            .on_event(move |e| l(e));
        let b = match timeout {
            Some(t) => b.timeout(t),
            None => b,
        };
        b.cooldown(Cooldown::new().max_wait(max_wait))
            .classify(|_: &Fail| Verdict::retry().with_retry_after(secs(60)))
            .build()
            .unwrap()
    };
    let shared = MemoryStore::new();
    // a 429 with Retry-After: 60 opens the pause for every pipeline of the resource
    let p = build(&shared, secs(30), None);
    assert!(p.call(|_| Err::<(), _>(Fail)).is_err());
    // the pause outlasts what the call may wait: refused at once, not called
    let mut ran = false;
    let r = p.call(|_| {
        ran = true;
        Ok::<_, Fail>(())
    });
    assert!(!ran);
    assert_eq!(reason(r), RejectionReason::CooldownActive);
    // a deadline that ends before the pause: refused at once
    let p10 = build(&shared, secs(30), Some(secs(10)));
    assert_eq!(
        reason(p10.call(|_| Ok::<_, Fail>(()))),
        RejectionReason::CooldownExceedsDeadline
    );
    assert_eq!(clock.now(), Duration::ZERO);
    // room to wait: deferred until the pause ends, then run
    let p120 = build(&MemoryStore::new(), secs(120), Some(secs(120)));
    assert!(p120.call(|_| Err::<(), _>(Fail)).is_err());
    assert!(p120.call(|_| Ok::<_, Fail>(())).is_ok());
    assert_eq!(clock.now(), secs(60));
    let log = log.lock().unwrap();
    let relevant: Vec<_> = log
        .iter()
        .filter(|e| {
            matches!(
                e,
                EventKind::CooldownStarted { .. } | EventKind::Deferred { .. }
            )
        })
        .cloned()
        .collect();
    assert_eq!(
        relevant,
        vec![
            EventKind::CooldownStarted { duration: secs(60) },
            EventKind::CooldownStarted { duration: secs(60) },
            EventKind::Deferred {
                reason: RejectionReason::CooldownActive,
                wait: secs(60)
            },
        ]
    );
}

#[test]
fn rate_limited_call_waits_for_its_permit_when_it_fits() {
    let clock = VirtualClock::new();
    let p = Pipeline::builder("s-rate-wait")
        .rate_limiter(RateLimiter::gcra(1, secs(1)).burst(1).max_wait(secs(2)))
        .store(MemoryStore::new())
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(p.call(|_| Ok::<_, Fail>(())).is_ok());
    assert!(p.call(|_| Ok::<_, Fail>(())).is_ok());
    assert_eq!(
        clock.now(),
        secs(1),
        "the second call waited one emission interval"
    );
    let strict = Pipeline::builder("s-rate-nowait")
        .rate_limiter(RateLimiter::gcra(1, secs(1)).burst(1))
        .store(MemoryStore::new())
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(strict.call(|_| Ok::<_, Fail>(())).is_ok());
    match strict.call(|_| Ok::<_, Fail>(())) {
        Err(Error::Rejected(r)) => {
            assert_eq!(r.reason, RejectionReason::RateLimited);
            assert_eq!(r.retry_after, Some(secs(1)));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn async_bulkhead_queue_admits_a_waiter_and_refuses_beyond_the_queue() {
    let clock = VirtualClock::new();
    let (log, listener) = recorder();
    let p = Pipeline::builder("s-queue")
        .bulkhead(Bulkhead::new(1).queue(1, ms(500)))
        .store(MemoryStore::new())
        .clock(clock.clone())
        .on_event(listener)
        .build()
        .unwrap();
    let rt = rt();
    let (a, b, c) = rt.block_on(async {
        let c1 = clock.clone();
        let holder = p.run(move |_| {
            let c1 = c1.clone();
            async move {
                seawall::Clock::sleep(&c1, ms(100)).await;
                Ok::<_, Fail>("holder")
            }
        });
        let waiter = p.run(|_| async { Ok::<_, Fail>("waiter") });
        let third = p.run(|_| async { Ok::<_, Fail>("third") });
        tokio::join!(holder, waiter, third)
    });
    assert_eq!(a.unwrap(), "holder");
    assert_eq!(b.unwrap(), "waiter");
    assert_eq!(reason(c), RejectionReason::BulkheadFull);
    assert_eq!(p.in_flight().unwrap(), 0);
    // The waiter looked for a slot several times in 100 ms and reported
    // one wait, of the queue's `max_wait`, when it took its place.
    let deferred: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|k| matches!(k, EventKind::Deferred { .. }))
        .cloned()
        .collect();
    assert_eq!(
        deferred,
        [EventKind::Deferred {
            reason: RejectionReason::BulkheadFull,
            wait: ms(500),
        }]
    );
}

/// Each partition has a bulkhead of its own, and so a queue of its own: a
/// call waiting in one partition's queue takes no place in another's.
#[test]
fn each_partition_queues_for_its_own_bulkhead() {
    for start in [Duration::ZERO, secs(1_000_000)] {
        let clock = VirtualClock::starting_at(start);
        let p = Pipeline::builder("s-partition-queue")
            .bulkhead(Bulkhead::new(1).queue(1, ms(500)))
            .store(MemoryStore::new())
            .clock(clock.clone())
            .build()
            .unwrap();
        let hold = |key: &'static str, hold: u64| {
            let (p, clock) = (p.clone(), clock.clone());
            async move {
                p.partition(key)
                    .run(move |_| {
                        let clock = clock.clone();
                        async move {
                            seawall::Clock::sleep(&clock, ms(hold)).await;
                            Ok::<_, Fail>(key)
                        }
                    })
                    .await
            }
        };
        let (a, b, b_waiter, a_waiter, b_third) = rt().block_on(async {
            tokio::join!(
                hold("a", 100),
                hold("b", 200),
                hold("b", 0),
                hold("a", 0),
                hold("b", 0),
            )
        });
        assert_eq!((a.unwrap(), b.unwrap()), ("a", "b"));
        assert_eq!(b_waiter.unwrap(), "b");
        // Partition `a`'s queue was empty: its call waits for `a`'s slot.
        assert_eq!(a_waiter.unwrap(), "a", "{start:?}");
        assert_eq!(reason(b_third), RejectionReason::BulkheadFull);
        for key in ["a", "b"] {
            assert_eq!(p.partition(key).in_flight().unwrap(), 0);
        }
    }
}

#[test]
fn partitions_have_their_own_state() {
    let p = Pipeline::builder("s-partitions")
        .circuit_breaker(CircuitBreaker::consecutive_failures(1))
        .store(MemoryStore::new())
        .build()
        .unwrap();
    let _ = p.partition("tenant-a").call(|_| Err::<(), _>(Fail));
    assert_eq!(
        reason(p.partition("tenant-a").call(|_| Ok::<_, Fail>(()))),
        RejectionReason::CircuitOpen
    );
    assert!(p.partition("tenant-b").call(|_| Ok::<_, Fail>(())).is_ok());
    assert!(p.call(|_| Ok::<_, Fail>(())).is_ok());
    let seen = p
        .partition(String::from("tenant-c"))
        .call(|ctx| Ok::<_, Fail>(ctx.partition().map(|k| k.to_string())))
        .unwrap();
    assert_eq!(seen.as_deref(), Some("tenant-c"));
    assert_eq!(
        p.partition("tenant-a").circuit_metrics().unwrap().state,
        CircuitState::Open
    );
    assert!(p.partitions() >= 3);
}

#[test]
fn throttling_is_retried_but_never_trips_the_circuit() {
    let clock = VirtualClock::new();
    let p = Pipeline::builder("s-throttled")
        .retry(Retry::constant(ms(1)).max_attempts(3))
        .circuit_breaker(CircuitBreaker::consecutive_failures(2))
        .store(MemoryStore::new())
        .clock(clock.clone())
        .classify(|_: &Fail| Verdict::throttled().with_retry_after(secs(2)))
        .build()
        .unwrap();
    let mut calls = 0;
    let r = p.call(|_| {
        calls += 1;
        Err::<(), _>(Fail)
    });
    assert_eq!(calls, 3, "throttling is retried");
    assert!(matches!(r, Err(Error::RetryExhausted { attempts: 3, .. })));
    assert_eq!(clock.now(), secs(4), "each retry waited for the hint");
    assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
    assert_eq!(p.circuit_metrics().unwrap().failures, 0);
}

#[test]
fn queued_call_keeps_its_place_when_polled_before_the_holder() {
    let clock = VirtualClock::new();
    let p = Pipeline::builder("s-queue-order")
        .bulkhead(Bulkhead::new(1).queue(1, ms(500)))
        .store(MemoryStore::new())
        .clock(clock.clone())
        .build()
        .unwrap();
    let rt = rt();
    let (waiter, holder, third) = rt.block_on(async {
        let c1 = clock.clone();
        let holder = p.run(move |_| {
            let c1 = c1.clone();
            async move {
                seawall::Clock::sleep(&c1, ms(100)).await;
                Ok::<_, Fail>("holder")
            }
        });
        let waiter = async {
            seawall::Clock::sleep(&clock, ms(1)).await;
            p.run(|_| async { Ok::<_, Fail>("waiter") }).await
        };
        let third = async {
            seawall::Clock::sleep(&clock, ms(2)).await;
            p.run(|_| async { Ok::<_, Fail>("third") }).await
        };
        tokio::join!(waiter, holder, third)
    });
    assert_eq!(holder.unwrap(), "holder");
    assert_eq!(
        waiter.unwrap(),
        "waiter",
        "the first to queue keeps its place"
    );
    assert_eq!(reason(third), RejectionReason::BulkheadFull);
}

/// A slot given back at the very instant a waiter's `max_wait` runs out is
/// the waiter's: it waits at most `max_wait`, and that instant is within
/// it; a microsecond later it is not. Whatever is polled first at that
/// instant (a third future, sleeping or not, changes the order).
#[test]
fn a_slot_given_back_as_the_wait_runs_out_is_taken() {
    for start in [Duration::ZERO, secs(1_000_000)] {
        for listening in [false, true] {
            for other in [None, Some(None), Some(Some(ms(5))), Some(Some(ms(10)))] {
                for late in [false, true] {
                    let clock = VirtualClock::starting_at(start);
                    let mut b = Pipeline::builder("s-queue-tie")
                        .bulkhead(Bulkhead::new(1).queue(1, ms(10)))
                        .clock(clock.clone());
                    if listening {
                        b = b.on_event(|_: &Event<'_>| {});
                    }
                    let p = b.build().unwrap();
                    let hold = ms(10) + Duration::from_micros(u64::from(late));
                    let (held, waited, ()) = rt().block_on(async {
                        let c1 = clock.clone();
                        let holder = p.run(move |_| {
                            let c1 = c1.clone();
                            async move {
                                seawall::Clock::sleep(&c1, hold).await;
                                Ok::<_, Fail>("holder")
                            }
                        });
                        let waiter = p.run(|_| async { Ok::<_, Fail>("waiter") });
                        let c2 = clock.clone();
                        match other {
                            None => {
                                let (h, w) = tokio::join!(holder, waiter);
                                (h, w, ())
                            }
                            Some(sleep) => {
                                let third = async move {
                                    if let Some(d) = sleep {
                                        seawall::Clock::sleep(&c2, d).await;
                                    }
                                };
                                tokio::join!(holder, waiter, third)
                            }
                        }
                    });
                    let case =
                        format!("{start:?} listening {listening} other {other:?} late {late}");
                    assert_eq!(held.ok(), Some("holder"), "{case}");
                    if late {
                        assert_eq!(reason(waited), RejectionReason::BulkheadFull, "{case}");
                    } else {
                        assert_eq!(waited.ok(), Some("waiter"), "{case}");
                    }
                    assert_eq!(clock.now(), start + hold, "{case}");
                    assert_eq!(p.in_flight().unwrap(), 0, "{case}");
                }
            }
        }
    }
}
