//! Pipeline behaviour: retry, timeout, fallback, classification, events,
//! configuration errors. Every timing runs on the virtual clock.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seawall::breaker::{CircuitControl, CircuitMetrics, CircuitTransition};
use seawall::error::TimeoutScope;
use seawall::event::GiveUpReason;
use seawall::store::{
    Admission, AdmitRequest, Permit, Record, Recorded, ResourceSpec, ResourceState, StateStore,
};
use seawall::testing::{SeededRandom, VirtualClock};
use seawall::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[derive(Debug, Clone, PartialEq)]
struct Boom(u32);
impl std::fmt::Display for Boom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "boom {}", self.0)
    }
}
impl std::error::Error for Boom {}

type Log = Arc<Mutex<Vec<EventKind>>>;

/// Records every event but the per-attempt and per-call summaries.
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

// ------------------------------------------------------------------ retry

#[test]
fn retry_exhaustion_returns_attempts_and_the_last_error() {
    let clock = VirtualClock::new();
    let p = Pipeline::builder("t-exhaust")
        .retry(Retry::exponential(ms(100)).max_attempts(4))
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut n = 0;
    let err = p
        .call(|ctx| {
            n += 1;
            assert_eq!(ctx.attempt(), n);
            Err::<(), _>(Boom(n))
        })
        .unwrap_err();
    match err {
        Error::RetryExhausted { attempts, last } => {
            assert_eq!(attempts, 4);
            assert_eq!(last, Boom(4));
        }
        other => panic!("unexpected {other:?}"),
    }
    // 100 + 200 + 400 ms of backoff, on the virtual clock
    assert_eq!(clock.now(), ms(700));
}

#[test]
fn each_backoff_shape_waits_what_it_says() {
    let cases: Vec<(Retry, Duration)> = vec![
        (Retry::constant(ms(50)).max_attempts(4), ms(150)),
        (Retry::linear(ms(10)).max_attempts(4), ms(10 + 20 + 30)),
        (
            Retry::linear(ms(10)).cap(ms(15)).max_attempts(4),
            ms(10 + 15 + 15),
        ),
        (
            Retry::exponential(ms(10)).multiplier(3.0).max_attempts(4),
            ms(10 + 30 + 90),
        ),
        (
            Retry::exponential(ms(10)).cap(ms(25)).max_attempts(5),
            ms(10 + 20 + 25 + 25),
        ),
    ];
    for (retry, expected) in cases {
        let clock = VirtualClock::new();
        let p = Pipeline::builder("t-shapes")
            .retry(retry.clone())
            .clock(clock.clone())
            .build()
            .unwrap();
        let _ = p.call(|_| Err::<(), _>(Boom(0)));
        assert_eq!(clock.now(), expected, "{retry:?}");
    }
}

#[test]
fn decorrelated_and_jittered_delays_stay_in_bounds_and_repeat_with_a_seed() {
    let run = |seed| {
        let clock = VirtualClock::new();
        let (log, l) = recorder();
        let p = Pipeline::builder("t-decor")
            .retry(
                Retry::decorrelated(ms(10), ms(500))
                    .max_attempts(8)
                    .jitter(Jitter::Equal),
            )
            .clock(clock.clone())
            .random(SeededRandom::new(seed))
            .on_event(l)
            .build()
            .unwrap();
        let _ = p.call(|_| Err::<(), _>(Boom(0)));
        let delays: Vec<Duration> = log
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                EventKind::RetryScheduled { delay, .. } => Some(*delay),
                _ => None,
            })
            .collect();
        (delays, clock.now())
    };
    let (a, ta) = run(42);
    let (b, tb) = run(42);
    assert_eq!(a, b);
    assert_eq!(ta, tb);
    assert_eq!(a.len(), 7);
    for d in &a {
        assert!(*d >= ms(5) && *d <= ms(500), "{d:?}");
    }
    assert_ne!(run(43).0, a);
}

#[test]
fn success_after_failures_and_context_attempts() {
    let p = Pipeline::builder("t-ok")
        .retry(Retry::constant(Duration::ZERO).max_attempts(5))
        .build()
        .unwrap();
    let seen = Mutex::new(vec![]);
    let v = p
        .call(|ctx| {
            seen.lock().unwrap().push(ctx.attempt());
            if ctx.attempt() < 3 {
                Err(Boom(ctx.attempt()))
            } else {
                Ok("done")
            }
        })
        .unwrap();
    assert_eq!(v, "done");
    assert_eq!(*seen.lock().unwrap(), vec![1, 2, 3]);
}

#[test]
fn classification_decides_retry() {
    let p = Pipeline::builder("t-classify")
        .retry(Retry::constant(Duration::ZERO).max_attempts(5))
        .classify(|e: &Boom| match e.0 {
            1 => Verdict::abort(),
            2 => Verdict::failure(),
            3 => Verdict::ignore(),
            _ => Verdict::retry(),
        })
        .build()
        .unwrap();
    for code in 1..=3 {
        let mut n = 0;
        let e = p
            .call(|_| {
                n += 1;
                Err::<(), _>(Boom(code))
            })
            .unwrap_err();
        assert_eq!(n, 1, "code {code} must not be retried");
        assert!(matches!(e, Error::Operation(Boom(c)) if c == code));
    }
    let mut n = 0;
    let e = p
        .call(|_| {
            n += 1;
            Err::<(), _>(Boom(9))
        })
        .unwrap_err();
    assert_eq!(n, 5);
    assert!(matches!(e, Error::RetryExhausted { attempts: 5, .. }));
}

#[test]
fn abort_predicate_wins_over_retry_predicate() {
    let p = Pipeline::builder("t-preds")
        .retry(Retry::constant(Duration::ZERO).max_attempts(3))
        .retry_if(|e: &Boom| e.0 >= 10)
        .abort_if(|e: &Boom| e.0 == 11)
        .build()
        .unwrap();
    let count = |code: u32| {
        let mut n = 0;
        let _ = p.call(|_| {
            n += 1;
            Err::<(), _>(Boom(code))
        });
        n
    };
    assert_eq!(count(10), 3); // retried
    assert_eq!(count(11), 1); // both match: abort wins
    assert_eq!(count(5), 1); // retry_if says no
}

#[test]
fn retry_after_hint_lengthens_the_wait_and_hook_sees_it() {
    let clock = VirtualClock::new();
    let hooked = Arc::new(Mutex::new(vec![]));
    let h = hooked.clone();
    let p = Pipeline::builder("t-hint")
        .retry(Retry::constant(ms(10)).max_attempts(2))
        .classify(|e: &Boom| Verdict::retry().with_retry_after(Duration::from_secs(e.0.into())))
        .on_retry(move |e: &Boom, attempt, delay| h.lock().unwrap().push((e.0, attempt, delay)))
        .clock(clock.clone())
        .build()
        .unwrap();
    let _ = p.call(|_| Err::<(), _>(Boom(3)));
    assert_eq!(clock.now(), secs(3));
    assert_eq!(*hooked.lock().unwrap(), vec![(3, 1, secs(3))]);
}

#[test]
fn retry_gives_up_early_when_the_next_wait_does_not_fit_the_deadline() {
    let clock = VirtualClock::new();
    let (log, l) = recorder();
    let p = Pipeline::builder("t-deadline")
        .timeout(secs(1)) // before retry: the whole call
        .retry(Retry::constant(ms(400)).max_attempts(10))
        .clock(clock.clone())
        .on_event(l)
        .build()
        .unwrap();
    let mut n = 0;
    let err = p
        .call(|_| {
            n += 1;
            Err::<(), _>(Boom(n))
        })
        .unwrap_err();
    // attempts at 0, 400, 800 ms; the next would start at 1200 > 1000
    assert_eq!(n, 3);
    assert!(
        matches!(
            err,
            Error::RetryExhausted {
                attempts: 3,
                last: Boom(3)
            }
        ),
        "{err:?}"
    );
    assert_eq!(clock.now(), ms(800), "no useless final wait");
    assert!(log.lock().unwrap().contains(&EventKind::RetryGaveUp {
        attempts: 3,
        reason: GiveUpReason::Deadline
    }));
}

#[test]
fn retry_budget_stops_retries_when_empty() {
    let budget = RetryBudget::new(0.1, 2);
    let p = Pipeline::builder("t-budget")
        .retry(
            Retry::constant(Duration::ZERO)
                .max_attempts(10)
                .budget(budget.clone()),
        )
        .build()
        .unwrap();
    let mut n = 0;
    let err = p
        .call(|_| {
            n += 1;
            Err::<(), _>(Boom(n))
        })
        .unwrap_err();
    assert_eq!(n, 3, "two tokens: two retries");
    assert_eq!(
        err.rejection().map(|r| r.reason),
        Some(RejectionReason::RetryBudgetExhausted)
    );
}

/// A store whose every admission is refused: stands for an open circuit.
#[derive(Debug)]
struct Refusing(RejectionReason);

impl StateStore for Refusing {
    fn bind(&self, _: &ResourceSpec) -> Result<Arc<dyn ResourceState>, StoreError> {
        Ok(Arc::new(RefusingState(self.0)))
    }
}
#[derive(Debug)]
struct RefusingState(RejectionReason);
impl ResourceState for RefusingState {
    fn admit(&self, _: &AdmitRequest<'_>) -> Result<Admission, StoreError> {
        Ok(Admission::rejected(Rejection::new(self.0, Some(secs(5)))))
    }
    fn record(&self, _: &Record<'_>) -> Result<Recorded, StoreError> {
        Ok(Recorded::default())
    }
    fn release(&self, _: Option<&PartitionKey>, _: Permit) {}
    fn circuit_metrics(
        &self,
        _: Option<&PartitionKey>,
        _: Duration,
    ) -> Result<CircuitMetrics, StoreError> {
        Ok(CircuitMetrics::closed_empty())
    }
    fn control_circuit(
        &self,
        _: Option<&PartitionKey>,
        _: CircuitControl,
        _: Duration,
    ) -> Result<Option<CircuitTransition>, StoreError> {
        Ok(None)
    }
    fn in_flight(&self, _: Option<&PartitionKey>, _: Duration) -> Result<u32, StoreError> {
        Ok(0)
    }
}

#[test]
fn a_seawall_rejection_is_never_retried() {
    let clock = VirtualClock::new();
    let (log, l) = recorder();
    let p = Pipeline::builder("t-reject")
        .retry(Retry::constant(ms(10)).max_attempts(5))
        .circuit_breaker(CircuitBreaker::consecutive_failures(3))
        .store(Refusing(RejectionReason::CircuitOpen))
        .clock(clock.clone())
        .on_event(l)
        .build()
        .unwrap();
    let mut ran = false;
    let err = p
        .call(|_| {
            ran = true;
            Ok::<_, Boom>(())
        })
        .unwrap_err();
    assert!(!ran, "the operation must not run");
    let r = err.rejection().copied().unwrap();
    assert_eq!(r.reason, RejectionReason::CircuitOpen);
    assert_eq!(r.retry_after, Some(secs(5)));
    assert_eq!(clock.now(), Duration::ZERO, "no retry wait happened");
    assert!(log
        .lock()
        .unwrap()
        .iter()
        .all(|e| !matches!(e, EventKind::RetryScheduled { .. })));
}

#[derive(Debug)]
struct Failing;
impl StateStore for Failing {
    fn bind(&self, _: &ResourceSpec) -> Result<Arc<dyn ResourceState>, StoreError> {
        Ok(Arc::new(FailingState))
    }
}
#[derive(Debug)]
struct FailingState;
impl ResourceState for FailingState {
    fn admit(&self, _: &AdmitRequest<'_>) -> Result<Admission, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    fn record(&self, _: &Record<'_>) -> Result<Recorded, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    fn release(&self, _: Option<&PartitionKey>, _: Permit) {}
    fn circuit_metrics(
        &self,
        _: Option<&PartitionKey>,
        _: Duration,
    ) -> Result<CircuitMetrics, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    fn control_circuit(
        &self,
        _: Option<&PartitionKey>,
        _: CircuitControl,
        _: Duration,
    ) -> Result<Option<CircuitTransition>, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    fn in_flight(&self, _: Option<&PartitionKey>, _: Duration) -> Result<u32, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
}

#[test]
fn a_failing_store_refuses_with_a_typed_error_and_an_event() {
    let (log, l) = recorder();
    let p = Pipeline::builder("t-store")
        .retry(Retry::constant(ms(1)).max_attempts(3))
        .circuit_breaker(CircuitBreaker::consecutive_failures(2))
        .bulkhead(Bulkhead::new(1))
        .store(Failing)
        .on_event(l)
        .build()
        .unwrap();
    let mut ran = false;
    let err = p.call(|_| {
        ran = true;
        Ok::<_, Boom>(())
    });
    assert!(!ran);
    assert!(matches!(err, Err(Error::Store(StoreError::Unavailable(_)))));
    assert!(matches!(
        log.lock().unwrap()[0],
        EventKind::StoreUnavailable {
            degraded: false,
            ..
        }
    ));
    assert!(matches!(
        p.isolate(),
        Err(seawall::pipeline::ControlError::Store(_))
    ));
}

// ---------------------------------------------------------------- timeout

#[test]
fn async_timeout_drops_the_future_at_the_deadline() {
    let clock = VirtualClock::new();
    let dropped = Arc::new(AtomicBool::new(false));
    struct SetOnDrop(Arc<AtomicBool>);
    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let p = Pipeline::builder("t-async-timeout")
        .timeout(ms(250))
        .clock(clock.clone())
        .build()
        .unwrap();
    let d = dropped.clone();
    let err = rt()
        .block_on(p.run(move |_| {
            let guard = SetOnDrop(d.clone());
            async move {
                let _g = guard;
                std::future::pending::<()>().await;
                Ok::<_, Boom>(())
            }
        }))
        .unwrap_err();
    assert!(
        dropped.load(Ordering::SeqCst),
        "the operation's future was dropped"
    );
    match err {
        Error::Timeout(t) => {
            assert_eq!(t.scope, TimeoutScope::Overall);
            assert_eq!(t.after, ms(250));
            assert_eq!(t.attempts, 1);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(clock.now(), ms(250));
}

#[test]
fn per_attempt_timeout_is_retried_and_overall_timeout_is_not() {
    let clock = VirtualClock::new();
    let attempts = Arc::new(AtomicU32::new(0));
    let p = Pipeline::builder("t-attempt-timeout")
        .timeout(secs(10))
        .retry(Retry::constant(ms(100)).max_attempts(3))
        .timeout(secs(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    let a = attempts.clone();
    let c = clock.clone();
    let err = rt()
        .block_on(p.run(move |ctx| {
            a.fetch_add(1, Ordering::SeqCst);
            let c = c.clone();
            async move {
                assert_eq!(ctx.remaining(), Some(secs(1)));
                // a slow dependency: 5 s per answer
                seawall::Clock::sleep(&c, secs(5)).await;
                Ok::<_, Boom>(())
            }
        }))
        .unwrap_err();
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    assert!(
        matches!(
            err,
            Error::Timeout(TimeoutError {
                scope: TimeoutScope::Attempt,
                attempts: 3,
                ..
            })
        ),
        "{err:?}"
    );
}

#[test]
fn fast_async_success_needs_no_timer() {
    // No tokio time driver at all: a ready operation never touches a timer.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let p = Pipeline::builder("t-fast")
        .timeout(secs(1))
        .build()
        .unwrap();
    let v = rt.block_on(p.run(|_| async { Ok::<_, Boom>(5) })).unwrap();
    assert_eq!(v, 5);
}

#[test]
fn sync_late_success_is_kept_with_an_event_by_default() {
    let clock = VirtualClock::new();
    let (log, l) = recorder();
    let p = Pipeline::builder("t-sync-lenient")
        .timeout(ms(100))
        .clock(clock.clone())
        .on_event(l)
        .build()
        .unwrap();
    let v = p
        .call(|ctx| {
            assert_eq!(ctx.remaining(), Some(ms(100)));
            clock.advance(ms(150));
            assert!(ctx.is_expired());
            Ok::<_, Boom>(1)
        })
        .unwrap();
    assert_eq!(v, 1);
    assert_eq!(
        *log.lock().unwrap(),
        vec![EventKind::DeadlineExceeded { late_by: ms(50) }]
    );
}

#[test]
fn sync_late_success_is_a_timeout_in_strict_mode() {
    let clock = VirtualClock::new();
    let p = Pipeline::builder("t-sync-strict")
        .timeout(Timeout::strict(ms(100)))
        .clock(clock.clone())
        .build()
        .unwrap();
    let err = p
        .call(|_| {
            clock.advance(ms(101));
            Ok::<_, Boom>(1)
        })
        .unwrap_err();
    assert!(err.is_timeout());
}

// --------------------------------------------------------------- fallback

#[test]
fn async_fallback_gets_the_error_and_context() {
    let p = Pipeline::builder("t-fallback")
        .retry(Retry::constant(Duration::ZERO).max_attempts(2))
        .fallback(|err: Error<Boom>, ctx| async move {
            assert!(matches!(err, Error::RetryExhausted { attempts: 2, .. }));
            assert_eq!(ctx.attempt(), 2);
            Ok::<_, Boom>("cached".to_string())
        })
        .build()
        .unwrap();
    let v = rt().block_on(p.run(|_| async { Err(Boom(1)) })).unwrap();
    assert_eq!(v, "cached");
}

#[test]
fn fallback_filter_lets_other_errors_through_unchanged() {
    let (log, l) = recorder();
    let p = Pipeline::builder("t-fallback-filter")
        .classify(|e: &Boom| {
            if e.0 == 4 {
                Verdict::abort()
            } else {
                Verdict::retry()
            }
        })
        .fallback_sync(|_err, _ctx| Ok::<_, Boom>(0u32))
        .fallback_when(|e| !matches!(e, Error::Operation(Boom(4))))
        .on_event(l)
        .build()
        .unwrap();
    assert_eq!(p.call(|_| Err(Boom(1))).unwrap(), 0);
    assert!(matches!(
        p.call(|_| Err(Boom(4))),
        Err(Error::Operation(Boom(4)))
    ));
    assert_eq!(*log.lock().unwrap(), vec![EventKind::FallbackExecuted]);
    // the sync fallback also serves async runs
    assert_eq!(rt().block_on(p.run(|_| async { Err(Boom(2)) })).unwrap(), 0);
}

#[test]
fn a_failing_fallback_reports_its_own_error() {
    let p = Pipeline::builder("t-fallback-fails")
        .fallback_sync(|_err, _ctx| Err::<u8, _>(Boom(99)))
        .build()
        .unwrap();
    assert!(matches!(
        p.call(|_| Err(Boom(1))),
        Err(Error::Fallback(Boom(99)))
    ));
}

#[test]
fn fallback_is_outermost_even_when_declared_first() {
    let clock = VirtualClock::new();
    let p = Pipeline::builder("t-fallback-first")
        .fallback_sync(|e: Error<Boom>, _| Ok::<_, Boom>(e.to_string()))
        .retry(Retry::constant(ms(5)).max_attempts(3))
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut n = 0;
    let v = p
        .call(|_| {
            n += 1;
            Err(Boom(n))
        })
        .unwrap();
    assert_eq!(n, 3, "retry ran inside the fallback");
    assert_eq!(v, "gave up after 3 attempts: boom 3");
}

// ------------------------------------------------- virtual time, config

#[test]
fn minutes_of_backoff_run_in_microseconds() {
    let clock = VirtualClock::new();
    let p = Pipeline::builder("t-minutes")
        .retry(Retry::exponential(secs(1)).max_attempts(12).cap(secs(60)))
        .clock(clock.clone())
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let _ = p.call(|_| Err::<(), _>(Boom(0)));
    assert_eq!(clock.now(), secs(1 + 2 + 4 + 8 + 16 + 32 + 60 * 5));
    // not a timing assertion on seawall: a sanity check that no real sleep ran
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn invalid_configuration_fails_at_build_naming_field_and_rule() {
    let err = |b: PipelineBuilder| b.build().unwrap_err().to_string();
    assert_eq!(
        err(Pipeline::builder("x").retry(Retry::constant(ms(1)).max_attempts(0))),
        "retry.max_attempts must be >= 1, got 0"
    );
    assert_eq!(
        err(Pipeline::builder("x").retry(Retry::constant(ms(1)).jitter(Jitter::Proportional(-1.0)))),
        "retry.jitter percentage must be in 0..=100, got -1"
    );
    assert_eq!(
        err(Pipeline::builder("x").retry(Retry::exponential(secs(2)).cap(secs(1)))),
        "retry.cap must be >= base (2s), got 1s"
    );
    assert_eq!(
        err(Pipeline::builder("x")
            .circuit_breaker(CircuitBreaker::consecutive_failures(2))
            .retry(Retry::constant(ms(1)))
            .circuit_breaker(CircuitBreaker::consecutive_failures(2))),
        "pipeline.circuit_breaker is declared twice; declare each policy once"
    );
    assert_eq!(
        err(Pipeline::builder("x")
            .retry(Retry::constant(ms(1)))
            .retry(Retry::constant(ms(1)))),
        "pipeline.retry is declared twice; declare each policy once"
    );
    assert_eq!(
        err(Pipeline::builder("x").timeout(Duration::ZERO)),
        "timeout.duration must be > 0"
    );
    assert_eq!(
        err(Pipeline::builder(" ")),
        "pipeline.name must not be empty"
    );
    // `x#call` is where `x` keeps the policies before its retry: a
    // pipeline of that name would share (and change) that state.
    assert_eq!(
        err(Pipeline::builder("x#call").circuit_breaker(CircuitBreaker::consecutive_failures(2))),
        "pipeline.name must not contain `#` (it names the state of the policies before the \
         retry), got `x#call`"
    );
    assert_eq!(
        err(Pipeline::builder("x").bulkhead(Bulkhead::new(0))),
        "bulkhead.max_concurrent must be >= 1, got 0"
    );
    assert_eq!(
        err(Pipeline::builder("x")
            .timeout(secs(5))
            .bulkhead(Bulkhead::new(1).lease(secs(6)))),
        "bulkhead.lease must exceed the attempt timeout (5s) by more than 1s, got 6s"
    );
    assert_eq!(
        err(Pipeline::builder("x").rate_limiter(RateLimiter::gcra(0, secs(1)))),
        "rate_limiter.limit must be >= 1, got 0"
    );
    assert_eq!(
        err(Pipeline::builder("x").circuit_breaker(CircuitBreaker::failure_rate(0.0))),
        "circuit_breaker.failure_rate must be in (0, 1], got 0"
    );
}

#[test]
fn order_errors_name_the_first_misplaced_policy_and_the_rule() {
    let err = |b: PipelineBuilder| b.build().unwrap_err().to_string();
    let r = || Retry::constant(ms(1));
    assert_eq!(
        err(Pipeline::builder("x").timeout(secs(1)).timeout(secs(2))),
        "pipeline.timeout is declared twice for the whole call; declare at most one timeout \
         before `retry` (whole call) and one after it (each attempt)"
    );
    assert_eq!(
        err(Pipeline::builder("x")
            .retry(r())
            .timeout(secs(1))
            .bulkhead(Bulkhead::new(1))
            .timeout(secs(2))),
        "pipeline.timeout is declared twice for each attempt; declare at most one timeout \
         before `retry` (whole call) and one after it (each attempt)"
    );
    // A stateful policy stands once, on either side of the retry.
    assert_eq!(
        err(Pipeline::builder("x")
            .rate_limiter(RateLimiter::gcra(10, secs(1)))
            .retry(r())
            .rate_limiter(RateLimiter::gcra(10, secs(1)))),
        "pipeline.rate_limiter is declared twice; declare each policy once"
    );
    assert_eq!(
        err(Pipeline::builder("x")
            .retry(r())
            .cooldown(Cooldown::new())
            .cooldown(Cooldown::new())),
        "pipeline.cooldown is declared twice; declare each policy once"
    );
    // An order error is reported before the values are checked.
    assert_eq!(
        err(Pipeline::builder("x")
            .bulkhead(Bulkhead::new(0))
            .retry(r().max_attempts(0))
            .bulkhead(Bulkhead::new(0))),
        "pipeline.bulkhead is declared twice; declare each policy once"
    );
    // One timeout on each side of the retry, stateful policies after it.
    assert!(Pipeline::builder("t-order-ok")
        .timeout(secs(10))
        .retry(r())
        .timeout(secs(1))
        .circuit_breaker(CircuitBreaker::consecutive_failures(2))
        .bulkhead(Bulkhead::new(1))
        .cooldown(Cooldown::new())
        .rate_limiter(RateLimiter::gcra(10, secs(1)))
        .build()
        .is_ok());
}

#[test]
fn builders_are_templates() {
    let base = Pipeline::builder("t-template").retry(Retry::constant(ms(1)).max_attempts(2));
    let a = base.clone().timeout(secs(1)).build().unwrap();
    let b = base.build().unwrap();
    assert_eq!(a.name(), b.name());
}

#[test]
fn public_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>(_: &T) {}
    send_sync::<Pipeline>();
    send_sync::<PipelineBuilder>();
    send_sync::<Pipeline<seawall::pipeline::WithAsyncFallback<String, Boom>>>();
    send_sync::<Error<Boom>>();
    send_sync::<Context>();
    send_sync::<MemoryStore>();
    let p = Pipeline::builder("t-send").build().unwrap();
    let fut = p.run(|_| async { Ok::<_, Boom>(1) });
    send(&fut);
    let part = p.partition("k");
    let fut = part.run(|_| async { Ok::<_, Boom>(1) });
    send(&fut);
}

#[test]
fn no_policy_pipeline_passes_results_through() {
    let p = Pipeline::builder("t-empty").build().unwrap();
    assert_eq!(p.call(|_| Ok::<_, Boom>(3)).unwrap(), 3);
    assert!(matches!(
        p.call(|_| Err::<(), _>(Boom(3))),
        Err(Error::Operation(Boom(3)))
    ));
    let err: Box<dyn std::error::Error> = Box::new(p.call(|_| Err::<(), _>(Boom(3))).unwrap_err());
    // The message includes the operation's error; the chain does not repeat it.
    assert_eq!(err.to_string(), "operation failed: boom 3");
    assert!(err.source().is_none());
}

#[test]
fn a_failing_operation_runs_once_without_a_retry_policy_partitioned_or_not() {
    let p = Pipeline::builder("t-once").build().unwrap();
    let part = p.partition(7u64);
    let calls = std::sync::atomic::AtomicU32::new(0);
    let failing = |ctx: Context| {
        calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Err::<(), _>(Boom(ctx.attempt()))
    };
    assert!(matches!(part.call(failing), Err(Error::Operation(Boom(1)))));
    assert!(matches!(p.call(failing), Err(Error::Operation(Boom(1)))));
    let calls = &calls;
    let result = rt().block_on(part.run(|ctx| async move {
        calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Err::<(), _>(Boom(ctx.attempt()))
    }));
    assert!(matches!(result, Err(Error::Operation(Boom(1)))));
    assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 3);
}

#[test]
fn attempt_and_call_summaries_carry_outcome_and_virtual_duration() {
    let clock = VirtualClock::new();
    let log: Log = Arc::default();
    let l = log.clone();
    let c = clock.clone();
    let p = Pipeline::builder("t-summaries")
        .retry(Retry::constant(ms(100)).max_attempts(3))
        .fallback_sync(|_e: Error<Boom>, _| Ok::<_, Boom>(0))
        .clock(clock.clone())
        .on_event(move |e| l.lock().unwrap().push(e.kind.clone()))
        .build()
        .unwrap();
    let mut n = 0;
    p.call(|_| {
        n += 1;
        c.advance(ms(10));
        if n < 2 {
            Err(Boom(n))
        } else {
            Ok(n)
        }
    })
    .unwrap();
    let log = log.lock().unwrap();
    assert_eq!(
        log.iter()
            .filter(|e| matches!(
                e,
                EventKind::AttemptFinished { .. } | EventKind::CallFinished { .. }
            ))
            .cloned()
            .collect::<Vec<_>>(),
        vec![
            EventKind::AttemptFinished {
                attempt: 1,
                duration: ms(10),
                outcome: AttemptOutcome::Failure
            },
            EventKind::AttemptFinished {
                attempt: 2,
                duration: ms(10),
                outcome: AttemptOutcome::Success
            },
            EventKind::CallFinished {
                attempts: 2,
                duration: ms(120),
                outcome: CallOutcome::Success
            },
        ]
    );
}

// ------------------------------------------------------------ strict names

fn named(store: &MemoryStore, failures: u32) -> PipelineBuilder {
    Pipeline::builder("strict-names")
        .store(store.clone())
        .circuit_breaker(CircuitBreaker::consecutive_failures(failures))
}

#[test]
fn strict_names_refuse_a_live_name_with_other_stateful_settings() {
    let store = MemoryStore::new();
    let first = named(&store, 1).build().unwrap();

    let e = named(&store, 2).strict_names().build().unwrap_err();
    assert_eq!((e.policy, e.field), ("pipeline", "name"));
    assert_eq!(
        e.to_string(),
        "pipeline.name `strict-names` is bound on this store by a live pipeline with a \
         different circuit_breaker: pipelines of one name share state only with equal \
         settings (strict_names)"
    );
    let e = named(&store, 1)
        .bulkhead(Bulkhead::new(3))
        .rate_limiter(RateLimiter::gcra(10, secs(1)))
        .strict_names()
        .build()
        .unwrap_err();
    assert!(
        e.rule.contains("with a different bulkhead, rate_limiter:"),
        "{e}"
    );

    // Equal settings share the circuit.
    let second = named(&store, 1).strict_names().build().unwrap();
    let _ = first.call(|_| Err::<(), _>("down"));
    assert_eq!(second.circuit_state().unwrap(), CircuitState::Open);

    // Without strict_names the build succeeds, and the circuits are apart.
    let apart = named(&store, 2).build().unwrap();
    assert_eq!(apart.circuit_state().unwrap(), CircuitState::Closed);

    // Once no pipeline holds the old settings, the name is free.
    drop((first, second, apart));
    named(&store, 3).strict_names().build().unwrap();
}

#[test]
fn strict_names_check_the_global_store_too() {
    let name = "strict-names-global";
    let _first = Pipeline::builder(name)
        .bulkhead(Bulkhead::new(1))
        .build()
        .unwrap();
    let e = Pipeline::builder(name)
        .bulkhead(Bulkhead::new(2))
        .strict_names()
        .build()
        .unwrap_err();
    assert!(e.rule.contains("different bulkhead"), "{e}");
}

/// A result that arrives at the deadline is on time, one that arrives a
/// nanosecond after it late: the same in async code (the future is dropped)
/// and in sync code with a strict timeout, on clocks from 0 and far from it.
#[test]
fn a_result_at_the_deadline_is_on_time_sync_and_async() {
    for start in [Duration::ZERO, secs(1_000_000)] {
        for (took, on_time) in [(ms(100), true), (ms(100) + Duration::from_nanos(1), false)] {
            let clock = VirtualClock::starting_at(start);
            let p = Pipeline::builder("deadline-edge")
                .timeout(Timeout::strict(ms(100)))
                .clock(clock.clone())
                .build()
                .unwrap();
            let sync = p.call(|_| {
                clock.advance(took);
                Ok::<_, std::io::Error>(1)
            });
            assert_eq!(sync.is_ok(), on_time, "sync, {took:?} from {start:?}");
            let c = clock.clone();
            let run = rt().block_on(p.run(move |_| {
                let c = c.clone();
                async move {
                    seawall::Clock::sleep(&c, took).await;
                    Ok::<_, std::io::Error>(1)
                }
            }));
            assert_eq!(
                run.is_ok(),
                on_time,
                "async, {took:?} from {start:?}: {run:?}"
            );
        }
    }
}
