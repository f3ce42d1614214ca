//! Policies written in code (`seawall::custom`): a policy that wraps, one
//! that answers without running what it wraps, one that runs it twice, a
//! hedge; around the whole call and around each attempt; with the order
//! rules, the deadlines and the events of the built-in policies. The cases
//! of behaviour run sync and async, with and without a listener, on
//! virtual clocks starting at 0 and at 10^6 s.

mod support;

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seawall::custom::{Next, Policy, PolicyFuture, Position};
use seawall::error::TimeoutScope;
use seawall::pipeline::{HandlesSync, ValueType};
use seawall::testing::VirtualClock;
use seawall::*;
use support::{ms, secs, Boom, FAR};

/// What a test policy does with what it wraps.
#[derive(Debug, Clone, Copy)]
enum Act {
    /// Runs it once and adds 100 to a success.
    Wrap,
    /// Answers this value without running it.
    Answer(u32),
    /// Refuses without running it.
    Refuse,
    /// Runs it; after a failure waits `pause` and runs it again, `runs`
    /// times in all.
    Again { runs: u32, pause: Duration },
    /// Runs it, and again once `after` passed while the first run goes
    /// on: the first run to end wins.
    Hedge { after: Duration },
}

/// What a pass of a policy saw in its context.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    attempt: u32,
    remaining: Option<Duration>,
    resource: String,
    partition: Option<String>,
}

struct TestPolicy {
    name: &'static str,
    position: Position,
    act: Act,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl TestPolicy {
    fn new(name: &'static str, position: Position, act: Act) -> Self {
        TestPolicy {
            name,
            position,
            act,
            seen: Arc::default(),
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Policy<u32, Boom> for TestPolicy {
    fn name(&self) -> &str {
        self.name
    }

    fn position(&self) -> Position {
        self.position
    }

    fn call<'a>(&'a self, ctx: Context, next: Next<'a, u32, Boom>) -> PolicyFuture<'a, u32, Boom> {
        self.seen.lock().unwrap().push(Seen {
            attempt: ctx.attempt(),
            remaining: ctx.remaining(),
            resource: ctx.resource().to_owned(),
            partition: ctx.partition().map(|p| p.to_string()),
        });
        let act = self.act;
        Box::pin(async move {
            match act {
                Act::Wrap => next.run().await.map(|v| v + 100),
                Act::Answer(v) => Ok(v),
                Act::Refuse => Err(Error::Rejected(Rejection::new(
                    RejectionReason::PolicyRefused,
                    Some(ms(5)),
                ))),
                Act::Again { runs, pause } => {
                    let mut result = next.run().await;
                    for _ in 1..runs {
                        if result.is_ok() {
                            break;
                        }
                        next.sleep(pause).await;
                        result = next.run().await;
                    }
                    result
                }
                Act::Hedge { after } => {
                    let first = pin!(next.run());
                    let second = pin!(async {
                        next.sleep(after).await;
                        next.run().await
                    });
                    futures_util::future::select(first, second)
                        .await
                        .factor_first()
                        .0
                }
            }
        })
    }
}

/// How a case calls: sync or async, with a listener or not, on a clock
/// starting at 0 or far from it.
#[derive(Debug, Clone, Copy)]
struct Case {
    sync: bool,
    listen: bool,
    start: Duration,
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for sync in [true, false] {
        for listen in [false, true] {
            for start in [Duration::ZERO, FAR] {
                v.push(Case {
                    sync,
                    listen,
                    start,
                });
            }
        }
    }
    v
}

type Events = Arc<Mutex<Vec<EventKind>>>;

/// The result of a run of the operation, and how long it takes.
type Script = dyn Fn(u32) -> (Result<u32, Boom>, Duration) + Send + Sync;

/// The operation of a case: its runs are counted; `script(run)` gives the
/// result of run `run` (from 1) and how long it takes on the clock.
#[derive(Clone)]
struct Op {
    runs: Arc<AtomicU32>,
    /// Runs dropped before they ended (async).
    dropped: Arc<AtomicU32>,
    seen: Arc<Mutex<Vec<u32>>>,
    script: Arc<Script>,
}

impl Op {
    fn new(script: impl Fn(u32) -> (Result<u32, Boom>, Duration) + Send + Sync + 'static) -> Self {
        Op {
            runs: Arc::default(),
            dropped: Arc::default(),
            seen: Arc::default(),
            script: Arc::new(script),
        }
    }

    /// Fails the first `n` runs, then succeeds with the run's number.
    fn failing(n: u32) -> Self {
        Op::new(move |run| {
            let r = if run <= n { Err(Boom(run)) } else { Ok(run) };
            (r, Duration::ZERO)
        })
    }

    fn runs(&self) -> u32 {
        self.runs.load(Ordering::SeqCst)
    }

    fn attempts_seen(&self) -> Vec<u32> {
        self.seen.lock().unwrap().clone()
    }
}

/// Counts a run dropped before its end.
struct Unfinished(Option<Arc<AtomicU32>>);

impl Unfinished {
    /// The run ended.
    fn ended(&mut self) {
        self.0 = None;
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            d.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Case {
    fn builder(&self, name: &str) -> (PipelineBuilder, VirtualClock, Events) {
        let clock = VirtualClock::starting_at(self.start);
        let events: Events = Arc::default();
        let mut b = Pipeline::builder(name)
            .store(MemoryStore::new())
            .clock(clock.clone());
        if self.listen {
            let e = events.clone();
            b = b.on_event(move |ev: &Event<'_>| e.lock().unwrap().push(ev.kind.clone()));
        }
        (b, clock, events)
    }

    /// One call of `op`; its time passes on `clock` (a blocking sleep in a
    /// sync call, an async sleep in an async one).
    fn call<K>(&self, p: &Pipeline<K>, clock: &VirtualClock, op: &Op) -> Result<u32, Error<Boom>>
    where
        K: HandlesSync<u32, Boom>,
    {
        self.call_in(p, None, clock, op)
    }

    fn call_in<K>(
        &self,
        p: &Pipeline<K>,
        partition: Option<&'static str>,
        clock: &VirtualClock,
        op: &Op,
    ) -> Result<u32, Error<Boom>>
    where
        K: HandlesSync<u32, Boom>,
    {
        let start = |ctx: &Context| {
            op.seen.lock().unwrap().push(ctx.attempt());
            let run = op.runs.fetch_add(1, Ordering::SeqCst) + 1;
            (op.script)(run)
        };
        if self.sync {
            let f = |ctx: Context| {
                let (r, took) = start(&ctx);
                clock.sleep_blocking(took);
                r
            };
            return match partition {
                Some(k) => p.partition(k).call(f),
                None => p.call(f),
            };
        }
        let f = |ctx: Context| {
            let (r, took) = start(&ctx);
            let clock = clock.clone();
            let mut unfinished = Unfinished(Some(op.dropped.clone()));
            async move {
                if !took.is_zero() {
                    Clock::sleep(&clock, took).await;
                }
                unfinished.ended();
                r
            }
        };
        let rt = support::rt();
        match partition {
            Some(k) => rt.block_on(p.partition(k).run(f)),
            None => rt.block_on(p.run(f)),
        }
    }
}

fn short_circuits(events: &Events) -> Vec<(&'static str, Position, u32)> {
    events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            EventKind::ShortCircuited {
                policy,
                position,
                attempt,
            } => Some((*policy, *position, *attempt)),
            _ => None,
        })
        .collect()
}

fn rejections(events: &Events) -> Vec<RejectionReason> {
    events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            EventKind::Rejected { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect()
}

fn call_finished(events: &Events) -> Vec<(u32, CallOutcome)> {
    events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            EventKind::CallFinished {
                attempts, outcome, ..
            } => Some((*attempts, *outcome)),
            _ => None,
        })
        .collect()
}

/// A breaker that counts the calls it judges (and never opens here).
fn window() -> CircuitBreaker {
    CircuitBreaker::failure_rate(1.0).minimum_calls(100)
}

/// A call's value, or its error as text.
fn v(r: Result<u32, Error<Boom>>) -> Result<u32, String> {
    r.map_err(|e| format!("{e:?}"))
}

fn retry(attempts: u32) -> Retry {
    Retry::constant(ms(10)).max_attempts(attempts)
}

#[test]
fn around_each_attempt_a_policy_wraps_every_attempt() {
    for case in cases() {
        let policy = Arc::new(TestPolicy::new("wrap", Position::Attempt, Act::Wrap));
        let (b, clock, events) = case.builder("wrap-attempt");
        let p = b
            .retry(retry(3))
            .timeout(secs(2))
            .policy(Arc::clone(&policy))
            .build()
            .unwrap();
        let op = Op::failing(2);
        // Each attempt's success gets the policy's 100; the third succeeds.
        assert_eq!(v(case.call(&p, &clock, &op)), Ok(103), "{case:?}");
        assert_eq!(op.runs(), 3);
        let seen = policy.seen();
        let attempts: Vec<u32> = seen.iter().map(|s| s.attempt).collect();
        assert_eq!(attempts, [1, 2, 3], "{case:?}");
        // The attempt's own context: its deadline, the resource.
        assert!(seen
            .iter()
            .all(|s| s.remaining == Some(secs(2)) && s.resource == "wrap-attempt"));
        assert_eq!(op.attempts_seen(), [1, 2, 3]);
        assert_eq!(clock.now(), case.start + ms(20));
        assert!(short_circuits(&events).is_empty());
        if case.listen {
            assert_eq!(call_finished(&events), [(3, CallOutcome::Success)]);
        }
    }
}

#[test]
fn around_the_call_a_policy_wraps_the_retry_once() {
    for case in cases() {
        let policy = Arc::new(TestPolicy::new("wrap", Position::Call, Act::Wrap));
        let (b, clock, events) = case.builder("wrap-call");
        let p = b
            .policy(Arc::clone(&policy))
            .retry(retry(3))
            .build()
            .unwrap();
        let op = Op::failing(2);
        assert_eq!(v(case.call_in(&p, Some("tenant-7"), &clock, &op)), Ok(103));
        assert_eq!(op.runs(), 3);
        // One pass around the call: attempt 1, no deadline, the partition.
        assert_eq!(
            policy.seen(),
            [Seen {
                attempt: 1,
                remaining: None,
                resource: "wrap-call".into(),
                partition: Some("tenant-7".into()),
            }]
        );
        assert_eq!(clock.now(), case.start + ms(20));
        if case.listen {
            // The call the caller sees reports every attempt of the pass.
            assert_eq!(call_finished(&events), [(3, CallOutcome::Success)]);
        }
    }
}

#[test]
fn a_short_circuit_around_the_call_runs_nothing_and_is_reported() {
    for case in cases() {
        let (b, clock, events) = case.builder("answer-call");
        let p = b
            .policy(TestPolicy::new("cache", Position::Call, Act::Answer(7)))
            .circuit_breaker(window())
            .retry(retry(3))
            .build()
            .unwrap();
        let op = Op::failing(10);
        assert_eq!(v(case.call(&p, &clock, &op)), Ok(7));
        assert_eq!(op.runs(), 0);
        assert_eq!(p.circuit_metrics().unwrap().calls, 0);
        assert_eq!(clock.now(), case.start);
        if case.listen {
            assert_eq!(short_circuits(&events), [("cache", Position::Call, 1)]);
            assert_eq!(call_finished(&events), [(0, CallOutcome::Success)]);
        } else {
            assert!(events.lock().unwrap().is_empty());
        }

        // A refusal: stamped with the resource, reported, and the
        // fallback (outermost) takes it.
        let (b, clock, events) = case.builder("refuse-call");
        let p = b
            .policy(TestPolicy::new("maintenance", Position::Call, Act::Refuse))
            .retry(retry(3))
            .build()
            .unwrap();
        let e = case.call(&p, &clock, &op).unwrap_err();
        let r = e.rejection().copied().expect("a rejection");
        assert_eq!(
            (r.reason, r.retry_after),
            (RejectionReason::PolicyRefused, Some(ms(5)))
        );
        assert_eq!(
            e.to_string(),
            "refuse-call: call rejected: policy_refused (retry after 5ms)"
        );
        assert_eq!(op.runs(), 0);
        if case.listen {
            assert_eq!(
                short_circuits(&events),
                [("maintenance", Position::Call, 1)]
            );
            assert_eq!(rejections(&events), [RejectionReason::PolicyRefused]);
            assert_eq!(
                call_finished(&events),
                [(0, CallOutcome::Rejected(RejectionReason::PolicyRefused))]
            );
        }
        let (b, clock, _) = case.builder("refuse-fallback");
        let p = b
            .policy(TestPolicy::new("maintenance", Position::Call, Act::Refuse))
            .fallback_sync(|e: Error<Boom>, _ctx| match e {
                Error::Rejected(_) => Ok(42),
                other => Err(other.into_operation_error().unwrap_or(Boom(0))),
            })
            .build()
            .unwrap();
        assert_eq!(v(case.call(&p, &clock, &op)), Ok(42));
        if !case.sync {
            let (b, _, _) = case.builder("refuse-async-fallback");
            let p = b
                .policy(TestPolicy::new("maintenance", Position::Call, Act::Refuse))
                .retry(retry(2))
                .fallback(|e: Error<Boom>, _ctx| async move {
                    match e {
                        Error::Rejected(_) => Ok(43),
                        _ => Err(Boom(0)),
                    }
                })
                .build()
                .unwrap();
            let f = |_ctx: Context| async { Ok::<u32, Boom>(1) };
            assert_eq!(support::rt().block_on(p.run(f)).ok(), Some(43));
        }
    }
}

#[test]
fn a_refusal_around_an_attempt_ends_the_call_and_gives_the_permits_back() {
    for case in cases() {
        let (b, clock, events) = case.builder("refuse-attempt");
        let p = b
            .circuit_breaker(window())
            .retry(retry(3))
            .bulkhead(Bulkhead::new(1))
            .policy(TestPolicy::new("gate", Position::Attempt, Act::Refuse))
            .build()
            .unwrap();
        let op = Op::failing(10);
        for _ in 0..3 {
            let e = case.call(&p, &clock, &op).unwrap_err();
            assert_eq!(
                e.rejection().map(|r| r.reason),
                Some(RejectionReason::PolicyRefused),
                "{case:?}"
            );
        }
        // Not retried, nothing recorded: the circuit (whole call) stays
        // closed with no outcome, the bulkhead (each attempt) has its slot.
        assert_eq!(op.runs(), 0);
        assert_eq!(p.circuit_metrics().unwrap().calls, 0);
        assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
        assert_eq!(p.in_flight().unwrap(), 0);
        assert_eq!(clock.now(), case.start);
        if case.listen {
            assert_eq!(short_circuits(&events).len(), 3);
            assert_eq!(short_circuits(&events)[0], ("gate", Position::Attempt, 1));
            assert_eq!(rejections(&events), [RejectionReason::PolicyRefused; 3]);
        }

        // A value answered for an attempt is its success: recorded once.
        let (b, clock, events) = case.builder("answer-attempt");
        let p = b
            .retry(retry(3))
            .circuit_breaker(window())
            .policy(TestPolicy::new("cache", Position::Attempt, Act::Answer(9)))
            .build()
            .unwrap();
        assert_eq!(v(case.call(&p, &clock, &op)), Ok(9));
        assert_eq!(op.runs(), 0);
        let m = p.circuit_metrics().unwrap();
        assert_eq!((m.calls, m.failures), (1, 0));
        if case.listen {
            assert_eq!(short_circuits(&events), [("cache", Position::Attempt, 1)]);
        }
    }
}

#[test]
fn a_policy_may_run_what_it_wraps_more_than_once() {
    for case in cases() {
        // Around the call: each run is a call through the retry (2
        // attempts), and the policy waits 1 s between them.
        let policy = Arc::new(TestPolicy::new(
            "again",
            Position::Call,
            Act::Again {
                runs: 3,
                pause: secs(1),
            },
        ));
        let (b, clock, events) = case.builder("again-call");
        let p = b
            .policy(Arc::clone(&policy))
            .circuit_breaker(window())
            .retry(retry(2))
            .build()
            .unwrap();
        let op = Op::failing(5);
        assert_eq!(v(case.call(&p, &clock, &op)), Ok(6), "{case:?}");
        assert_eq!(op.runs(), 6);
        // Each pass numbers its attempts from 1.
        assert_eq!(op.attempts_seen(), [1, 2, 1, 2, 1, 2]);
        // Each pass is one call of the circuit (declared before the retry).
        assert_eq!(p.circuit_metrics().unwrap().calls, 3);
        assert_eq!(clock.now(), case.start + ms(10) * 3 + secs(2));
        assert_eq!(policy.seen().len(), 1);
        if case.listen {
            assert_eq!(call_finished(&events), [(6, CallOutcome::Success)]);
        }

        // Around an attempt: both runs belong to the attempt.
        let (b, clock, _) = case.builder("again-attempt");
        let p = b
            .retry(retry(2))
            .policy(TestPolicy::new(
                "again",
                Position::Attempt,
                Act::Again {
                    runs: 2,
                    pause: ms(100),
                },
            ))
            .build()
            .unwrap();
        let op = Op::failing(3);
        assert_eq!(v(case.call(&p, &clock, &op)), Ok(4));
        assert_eq!(op.attempts_seen(), [1, 1, 2, 2]);
        assert_eq!(clock.now(), case.start + ms(100) + ms(10) + ms(100));
    }
}

#[test]
fn a_hedge_races_its_runs_async_and_runs_them_in_turn_sync() {
    for case in cases() {
        let (b, clock, _) = case.builder("hedge");
        let p = b
            .retry(retry(2))
            .policy(TestPolicy::new(
                "hedge",
                Position::Attempt,
                Act::Hedge { after: ms(10) },
            ))
            .build()
            .unwrap();
        // The first run takes 100 ms, the second none.
        let op = Op::new(|run| match run {
            1 => (Ok(1), ms(100)),
            n => (Ok(n), Duration::ZERO),
        });
        let r = v(case.call(&p, &clock, &op));
        if case.sync {
            // The first run ends before the hedge's wait starts: no second
            // run.
            assert_eq!(r, Ok(1));
            assert_eq!(op.runs(), 1);
            assert_eq!(clock.now(), case.start + ms(100));
        } else {
            // The second run, started 10 ms in, wins; the first is dropped.
            assert_eq!(r, Ok(2));
            assert_eq!(op.runs(), 2);
            assert_eq!(op.dropped.load(Ordering::SeqCst), 1);
            assert_eq!(clock.now(), case.start + ms(10));
        }
    }
}

#[test]
fn a_hedge_around_the_call_drops_the_losing_pass_and_its_permit() {
    let case = Case {
        sync: false,
        listen: true,
        start: FAR,
    };
    let (b, clock, _) = case.builder("hedge-call");
    let p = b
        .policy(TestPolicy::new(
            "hedge",
            Position::Call,
            Act::Hedge { after: ms(10) },
        ))
        .bulkhead(Bulkhead::new(2))
        .build()
        .unwrap();
    let op = Op::new(|run| match run {
        1 => (Ok(1), secs(5)),
        n => (Ok(n), ms(1)),
    });
    assert_eq!(v(case.call(&p, &clock, &op)), Ok(2));
    assert_eq!((op.runs(), op.dropped.load(Ordering::SeqCst)), (2, 1));
    // Both passes held a slot; the loser's was given back when dropped.
    assert_eq!(p.in_flight().unwrap(), 0);
    assert_eq!(clock.now(), FAR + ms(11));
}

#[test]
fn a_timeout_around_the_policy_bounds_its_passes_and_one_inside_renews_for_each() {
    for case in cases() {
        // Around it: one deadline of 1 s for the policy and every pass. The
        // third wait is cut at the deadline, and the run asked then is a
        // timeout at once.
        let policy = Arc::new(TestPolicy::new(
            "again",
            Position::Call,
            Act::Again {
                runs: 5,
                pause: ms(400),
            },
        ));
        let (b, clock, _) = case.builder("deadline-around");
        let p = b
            .timeout(secs(1))
            .policy(Arc::clone(&policy))
            .retry(retry(1))
            .build()
            .unwrap();
        let op = Op::failing(10);
        let e = case.call(&p, &clock, &op).unwrap_err();
        match e {
            Error::Timeout(t) => assert_eq!((t.scope, t.after), (TimeoutScope::Overall, secs(1))),
            other => panic!("{case:?}: {other:?}"),
        }
        assert_eq!(op.runs(), 3);
        assert_eq!(clock.now(), case.start + secs(1));
        assert_eq!(policy.seen()[0].remaining, Some(secs(1)));

        // Inside it: each pass has the whole timeout, the policy none.
        let policy = Arc::new(TestPolicy::new(
            "again",
            Position::Call,
            Act::Again {
                runs: 3,
                pause: ms(400),
            },
        ));
        let (b, clock, _) = case.builder("deadline-inside");
        let p = b
            .policy(Arc::clone(&policy))
            .timeout(secs(1))
            .retry(retry(1))
            .build()
            .unwrap();
        let op = Op::failing(10);
        let e = case.call(&p, &clock, &op).unwrap_err();
        assert!(
            matches!(
                e,
                Error::RetryExhausted {
                    attempts: 1,
                    last: Boom(3)
                }
            ),
            "{case:?}: {e:?}"
        );
        assert_eq!(op.runs(), 3);
        assert_eq!(clock.now(), case.start + ms(800));
        assert_eq!(policy.seen()[0].remaining, None);
    }
}

/// A timeout of the whole call that ends during a retry's second attempt,
/// through a policy around the call, reports what the same pipeline
/// without the policy reports: two attempts, and the timeout of the second.
#[test]
fn a_timeout_around_the_policy_counts_the_attempts_it_cut() {
    type Seen = ((TimeoutScope, Duration, u32), Vec<(u32, Duration)>, u32);
    fn run<K: HandlesSync<u32, Boom>>(
        case: Case,
        b: PipelineBuilder<K>,
        clock: &VirtualClock,
        events: &Events,
    ) -> Seen {
        let p = b
            .retry(Retry::constant(ms(100)).max_attempts(10))
            .timeout(ms(600))
            .build()
            .unwrap();
        let op = Op::new(|run| (Err(Boom(run)), ms(700)));
        let timeout = match case.call(&p, clock, &op).unwrap_err() {
            Error::Timeout(t) => (t.scope, t.after, t.attempts),
            other => panic!("{case:?}: {other:?}"),
        };
        let timed_out = events
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                EventKind::TimedOut { attempt, after } => Some((*attempt, *after)),
                _ => None,
            })
            .collect();
        (timeout, timed_out, op.runs())
    }
    // Async: a blocking attempt is not cut (a late failure is its own
    // error), so the deadline cuts no attempt there.
    for case in cases().into_iter().filter(|c| !c.sync) {
        let (b, clock, events) = case.builder("deadline-cut-plain");
        let plain = run(case, b.timeout(secs(1)), &clock, &events);
        let (b, clock, events) = case.builder("deadline-cut-policy");
        let wrap = TestPolicy::new(
            "wrap",
            Position::Call,
            Act::Again {
                runs: 1,
                pause: ms(0),
            },
        );
        let wrapped = run(case, b.timeout(secs(1)).policy(wrap), &clock, &events);
        assert_eq!(wrapped, plain, "{case:?}");
        assert_eq!(plain.0, (TimeoutScope::Overall, secs(1), 2), "{case:?}");
        if case.listen {
            assert_eq!(plain.1, [(1, ms(600)), (2, secs(1))], "{case:?}");
        }
    }
}

#[test]
fn an_attempt_deadline_bounds_the_policy_around_the_attempt() {
    for case in cases() {
        // 500 ms per attempt: a run, 300 ms of wait, a run, a wait cut to
        // 200 ms, then the attempt is out of time; retried three times.
        let (b, clock, _) = case.builder("attempt-deadline");
        let p = b
            .retry(retry(3))
            .timeout(ms(500))
            .policy(TestPolicy::new(
                "again",
                Position::Attempt,
                Act::Again {
                    runs: 5,
                    pause: ms(300),
                },
            ))
            .build()
            .unwrap();
        let op = Op::failing(100);
        match case.call(&p, &clock, &op).unwrap_err() {
            Error::Timeout(t) => {
                assert_eq!(
                    (t.scope, t.after, t.attempts),
                    (TimeoutScope::Attempt, ms(500), 3)
                )
            }
            other => panic!("{case:?}: {other:?}"),
        }
        assert_eq!(op.runs(), 6);
        assert_eq!(op.attempts_seen(), [1, 1, 2, 2, 3, 3]);
        assert_eq!(clock.now(), case.start + ms(500) * 3 + ms(20));
    }
}

type Built = Result<Pipeline<ValueType<u32, Boom>>, ConfigError>;

/// A policy that declares a position, for the order rules.
fn at(name: &'static str, position: Position) -> TestPolicy {
    TestPolicy::new(name, position, Act::Wrap)
}

#[test]
fn a_policy_declared_where_its_position_cannot_be_is_refused_at_build() {
    use Position::{Attempt, Call};
    let b = || Pipeline::builder("order");
    let cases: Vec<(Built, &str, &str, &str)> =
        vec![
        (
            b().retry(retry(2)).policy(at("audit", Call)).build(),
            "audit",
            "position",
            "is `call` (around the whole call) but the policy is declared after `retry`",
        ),
        (
            b().circuit_breaker(CircuitBreaker::consecutive_failures(2))
                .policy(at("audit", Call))
                .retry(retry(2))
                .build(),
            "audit",
            "position",
            "is `call` (around the whole call) but the policy is declared after `circuit_breaker`",
        ),
        (
            b().policy(at("count", Attempt)).retry(retry(2)).build(),
            "count",
            "position",
            "is `attempt` (around each attempt) but the policy is declared before `retry`",
        ),
        (
            b().retry(retry(2))
                .policy(at("count", Attempt))
                .timeout(secs(1))
                .build(),
            "count",
            "position",
            "is `attempt` (around each attempt) but the policy is declared before `timeout`",
        ),
        (
            b().policy(at("count", Attempt))
                .bulkhead(Bulkhead::new(1))
                .build(),
            "count",
            "position",
            "is `attempt` (around each attempt) but the policy is declared before `bulkhead`",
        ),
        (
            b().retry(retry(2))
                .chaos(Chaos::latency(0.5, ms(1)))
                .policy(at("count", Attempt))
                .build(),
            "count",
            "position",
            "is `attempt` (around each attempt) but the policy is declared after `chaos`",
        ),
        (
            b().retry(retry(2))
                .policy(at("count", Attempt))
                .policy(at("audit", Call))
                .build(),
            "audit",
            "position",
            "declared after `retry`",
        ),
        (
            b().policy(at("count", Attempt))
                .policy(at("audit", Call))
                .build(),
            "audit",
            "position",
            "is `call` (around the whole call) but the policy is declared after `count`",
        ),
        (
            b().policy(at("audit", Call))
                .policy(at("audit", Call))
                .build(),
            "audit",
            "name",
            "is declared twice",
        ),
        (
            b().policy(at("retry", Call)).build(),
            "retry",
            "name",
            "`retry` is the name of a built-in policy",
        ),
        (
            b().policy(at("attempt_timeout", Attempt)).build(),
            "attempt_timeout",
            "name",
            "is the name of a built-in policy",
        ),
        (b().policy(at(" ", Call)).build(), "policy", "name", "must not be empty"),
    ];
    for (i, (built, policy, field, rule)) in cases.into_iter().enumerate() {
        let e = built.expect_err(&format!("case {i} builds"));
        assert_eq!((e.policy, e.field), (policy, field), "case {i}: {e}");
        assert!(
            e.rule.contains(rule),
            "case {i}: {e}\nshould contain: {rule}"
        );
    }
    // Every reason is worded: the rule, then what to do.
    let e = b()
        .retry(retry(2))
        .policy(at("audit", Call))
        .build()
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "audit.position is `call` (around the whole call) but the policy is declared after \
         `retry`; it acts once around the whole call: declare it before `retry` (a policy around \
         each attempt declares that position)"
    );

    // The positions that fit: around the call on either side of its
    // timeout, around the attempt after everything but chaos, several of
    // each.
    let fine = b()
        .policy(at("outer", Call))
        .timeout(secs(5))
        .policy(at("inner", Call))
        .circuit_breaker(CircuitBreaker::consecutive_failures(3))
        .retry(retry(3))
        .timeout(secs(1))
        .bulkhead(Bulkhead::new(4))
        .policy(at("a", Attempt))
        .policy(at("b", Attempt))
        .chaos(Chaos::latency(0.0, ms(1)))
        .build();
    assert!(fine.is_ok(), "{:?}", fine.err());
}

#[test]
fn policies_nest_in_declaration_order() {
    for case in cases() {
        // outer(call) + inner(call) + attempt: the successes gain 100 at
        // each level, and the order of the passes is the declaration's.
        let order = Arc::new(Mutex::new(Vec::new()));
        struct Log(&'static str, Position, Arc<Mutex<Vec<&'static str>>>);
        impl Policy<u32, Boom> for Log {
            fn name(&self) -> &str {
                self.0
            }
            fn position(&self) -> Position {
                self.1
            }
            fn call<'a>(
                &'a self,
                _: Context,
                next: Next<'a, u32, Boom>,
            ) -> PolicyFuture<'a, u32, Boom> {
                Box::pin(async move {
                    self.2.lock().unwrap().push(self.0);
                    let r = next.run().await.map(|v| v * 10);
                    self.2.lock().unwrap().push(self.0);
                    r
                })
            }
        }
        let (b, clock, _) = case.builder("nest");
        let p = b
            .policy(Log("outer", Position::Call, order.clone()))
            .policy(Log("inner", Position::Call, order.clone()))
            .retry(retry(2))
            .policy(Log("attempt", Position::Attempt, order.clone()))
            .build()
            .unwrap();
        let op = Op::failing(1);
        assert_eq!(v(case.call(&p, &clock, &op)), Ok(2000));
        assert_eq!(
            *order.lock().unwrap(),
            ["outer", "inner", "attempt", "attempt", "attempt", "attempt", "inner", "outer"]
        );
    }
}

#[test]
fn many_tasks_share_a_pipeline_with_policies() {
    let calls = Arc::new(AtomicU32::new(0));
    struct Count(Arc<AtomicU32>);
    impl<T: Send + 'static, E: Send + 'static> Policy<T, E> for Count {
        fn name(&self) -> &str {
            "count"
        }
        fn position(&self) -> Position {
            Position::Call
        }
        fn call<'a>(&'a self, _: Context, next: Next<'a, T, E>) -> PolicyFuture<'a, T, E> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Box::pin(async move { next.run().await })
        }
    }
    let p = Pipeline::builder("many")
        .store(MemoryStore::new())
        .policy(Count(calls.clone()))
        .retry(Retry::constant(Duration::ZERO).max_attempts(2))
        .bulkhead(Bulkhead::new(1000))
        .policy(TestPolicy::new("wrap", Position::Attempt, Act::Wrap))
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_time()
        .build()
        .unwrap();
    let tasks: Vec<_> = (0..200u32)
        .map(|i| {
            let p = p.clone();
            // The future of a call through policies is `Send`.
            rt.spawn(async move {
                p.run(|ctx| async move {
                    tokio::task::yield_now().await;
                    if ctx.attempt() == 1 && i % 2 == 0 {
                        Err(Boom(i))
                    } else {
                        Ok(i)
                    }
                })
                .await
            })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(v(rt.block_on(t).unwrap()), Ok(i as u32 + 100));
    }
    let threads: Vec<_> = (0..8u32)
        .map(|i| {
            let p = p.clone();
            std::thread::spawn(move || {
                (0..25u32)
                    .map(|j| v(p.call(|_| Ok::<_, Boom>(i * 25 + j))))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for (i, t) in threads.into_iter().enumerate() {
        let got = t.join().unwrap();
        let want: Vec<_> = (0..25u32).map(|j| Ok(i as u32 * 25 + j + 100)).collect();
        assert_eq!(got, want);
    }
    assert_eq!(calls.load(Ordering::Relaxed), 400);
    assert_eq!(p.in_flight().unwrap(), 0);
}

#[test]
fn the_handles_of_a_policy_are_send() {
    fn send<T: Send>(_: &T) {}
    fn sync<T: Sync>() {}
    sync::<Next<'static, u32, Boom>>();
    struct Probe;
    impl Policy<u32, Boom> for Probe {
        fn name(&self) -> &str {
            "probe"
        }
        fn position(&self) -> Position {
            Position::Attempt
        }
        fn call<'a>(
            &'a self,
            _: Context,
            next: Next<'a, u32, Boom>,
        ) -> PolicyFuture<'a, u32, Boom> {
            Box::pin(async move {
                let run = next.run();
                send(&run);
                let sleep = next.sleep(ms(1));
                send(&sleep);
                sleep.await;
                run.await
            })
        }
    }
    let p = Pipeline::builder("probe").policy(Probe).build().unwrap();
    let future = p.run(|_| async { Ok::<_, Boom>(3) });
    send(&future);
    assert_eq!(v(support::rt().block_on(future)), Ok(3));
}

/// A future that is ready once its flag is set by another thread: what a
/// policy awaiting something of its own sees in a blocking call.
fn flag_future(flag: Arc<Mutex<(bool, Option<std::task::Waker>)>>) -> impl Future<Output = ()> {
    std::future::poll_fn(move |cx| {
        let mut f = flag.lock().unwrap();
        if f.0 {
            std::task::Poll::Ready(())
        } else {
            f.1 = Some(cx.waker().clone());
            std::task::Poll::Pending
        }
    })
}

#[test]
fn a_blocking_call_waits_for_what_a_policy_awaits() {
    struct Gate(Arc<Mutex<(bool, Option<std::task::Waker>)>>);
    impl Policy<u32, Boom> for Gate {
        fn name(&self) -> &str {
            "gate"
        }
        fn position(&self) -> Position {
            Position::Call
        }
        fn call<'a>(
            &'a self,
            _: Context,
            next: Next<'a, u32, Boom>,
        ) -> PolicyFuture<'a, u32, Boom> {
            let open = flag_future(self.0.clone());
            Box::pin(async move {
                open.await;
                next.run().await
            })
        }
    }
    let flag = Arc::new(Mutex::new((false, None)));
    let p = Pipeline::builder("gate")
        .policy(Gate(flag.clone()))
        .build()
        .unwrap();
    let opener = std::thread::spawn(move || {
        // Opens once the call waits (its waker is registered).
        loop {
            let mut f = flag.lock().unwrap();
            if let Some(w) = f.1.take() {
                f.0 = true;
                w.wake();
                return;
            }
            drop(f);
            std::thread::yield_now();
        }
    });
    assert_eq!(v(p.call(|_| Ok::<_, Boom>(5))), Ok(5));
    opener.join().unwrap();
}

#[test]
fn a_pipeline_without_policies_of_code_is_untyped_and_unchanged() {
    // No policy written in code: any result type, as before.
    let p = Pipeline::builder("plain").build().unwrap();
    assert_eq!(p.call(|_| Ok::<_, Boom>("text")).ok(), Some("text"));
    assert_eq!(p.call(|_| Ok::<_, std::io::Error>(1u8)).unwrap(), 1);
}

/// Runs what it wraps once and gives its result as it is.
struct Through(&'static str, Position);

impl Policy<u32, Boom> for Through {
    fn name(&self) -> &str {
        self.0
    }
    fn position(&self) -> Position {
        self.1
    }
    fn call<'a>(&'a self, _: Context, next: Next<'a, u32, Boom>) -> PolicyFuture<'a, u32, Boom> {
        Box::pin(async move { next.run().await })
    }
}

/// What a sequence of calls observed: per call its result, the runs of the
/// operation, the end time, the circuit and the slots held after it, and
/// the events of the pipeline.
fn observe<K>(case: Case, p: &Pipeline<K>, clock: &VirtualClock, events: &Events) -> Vec<String>
where
    K: HandlesSync<u32, Boom>,
{
    // Most runs fail, some take 80 ms: whole calls fail, a circuit opens
    // and recovers after a pause, waits run out.
    let op = Op::new(|run| {
        let took = if run % 5 == 4 { ms(80) } else { Duration::ZERO };
        let r = if run % 7 == 0 || run % 11 == 0 {
            Ok(run)
        } else {
            Err(Boom(run))
        };
        (r, took)
    });
    let mut seen = Vec::new();
    for i in 0..12u64 {
        // A pause now and then lets a circuit's cooldown end.
        clock.advance(if i % 4 == 3 { secs(40) } else { ms(7) });
        let before = op.runs();
        let r = v(case.call(p, clock, &op));
        let circuit = p
            .circuit_metrics()
            .map(|m| (m.state, m.calls, m.failures))
            .ok();
        seen.push(format!(
            "{r:?} runs={} at={:?} circuit={circuit:?} in_flight={:?}",
            op.runs() - before,
            clock.now() - case.start,
            p.in_flight().ok(),
        ));
    }
    seen.push(format!("{:?}", events.lock().unwrap()));
    seen
}

/// The pipelines of the comparison, each declared on a builder of any kind.
fn breaker_around_retry<K: seawall::pipeline::Kind>(b: PipelineBuilder<K>) -> PipelineBuilder<K> {
    b.circuit_breaker(CircuitBreaker::consecutive_failures(2).cooldown(secs(30)))
        .retry(retry(3))
        .timeout(ms(50))
        .bulkhead(Bulkhead::new(2))
}

fn limited_with_deadline<K: seawall::pipeline::Kind>(b: PipelineBuilder<K>) -> PipelineBuilder<K> {
    b.timeout(secs(1))
        .retry(Retry::exponential(ms(100)).max_attempts(4))
        .rate_limiter(RateLimiter::gcra(3, secs(1)).max_wait(ms(600)))
        .circuit_breaker(window())
}

fn hinted_cooldown<K>(b: PipelineBuilder<K>) -> PipelineBuilder<K::Out>
where
    K: seawall::pipeline::ErrorKind<Boom>,
{
    b.retry(retry(3))
        .cooldown(Cooldown::new())
        .classify(|e: &Boom| match e.0 % 4 {
            1 => Verdict::retry().with_retry_after(ms(200)),
            _ => Verdict::retry(),
        })
}

/// Policies that only run what they wrap change nothing: not a result, a
/// run of the operation, an instant, a state or an event (they take the
/// engine's general loop where the pipeline alone takes its ordinary
/// path: the two agree).
#[test]
fn policies_that_only_run_what_they_wrap_change_nothing() {
    macro_rules! compare {
        ($shape:ident) => {
            for case in cases() {
                let (b, clock, events) = case.builder(stringify!($shape));
                let alone = $shape(b).build().unwrap();
                let expected = observe(case, &alone, &clock, &events);
                let (b, clock, events) = case.builder(stringify!($shape));
                let wrapped = $shape(b.policy(Through("around_call", Position::Call)))
                    .policy(Through("around_attempt", Position::Attempt))
                    .build()
                    .unwrap();
                let got = observe(case, &wrapped, &clock, &events);
                for (i, (e, g)) in expected.iter().zip(&got).enumerate() {
                    assert_eq!(e, g, "{}: {case:?}, call {i}", stringify!($shape));
                }
                assert_eq!(expected.len(), got.len());
            }
        };
    }
    compare!(breaker_around_retry);
    compare!(limited_with_deadline);
    compare!(hinted_cooldown);
}

#[cfg(feature = "serde")]
mod config {
    use super::*;
    use seawall::config::{Config, Format, LoadError, Registry};
    use seawall::pipeline::WithFallback;

    const FILE: &str = r#"
[pipelines.quotes]
policies = ["audit", "timeout", "retry", "count"]
timeout = "1s"
retry = { max_attempts = 3, delay = "10ms" }
"#;

    #[test]
    fn a_policy_registered_in_code_is_declared_where_the_file_lists_it() {
        for case in cases() {
            let audit = Arc::new(TestPolicy::new("audit", Position::Call, Act::Wrap));
            let count = Arc::new(TestPolicy::new("count", Position::Attempt, Act::Wrap));
            let clock = VirtualClock::starting_at(case.start);
            let registry = Registry::builder()
                .store(MemoryStore::new())
                .clock(clock.clone())
                .policy(Arc::clone(&audit))
                .policy(Arc::clone(&count))
                .load_str(Format::Toml, FILE)
                .unwrap();
            // Typed by its policies, refused untyped.
            assert!(registry.get("quotes").is_none());
            let quotes = registry.typed::<ValueType<u32, Boom>>("quotes").unwrap();
            let op = Op::failing(1);
            assert_eq!(v(case.call(&quotes, &clock, &op)), Ok(202));
            assert_eq!(audit.seen().len(), 1);
            // Inside the timeout of the whole call, declared after `audit`.
            assert_eq!(audit.seen()[0].remaining, None);
            let counted: Vec<_> = count
                .seen()
                .iter()
                .map(|s| (s.attempt, s.remaining))
                .collect();
            assert_eq!(counted, [(1, Some(secs(1))), (2, Some(secs(1) - ms(10)))]);
        }
    }

    #[test]
    fn with_a_fallback_the_policies_keep_its_kind() {
        let registry = Registry::builder()
            .store(MemoryStore::new())
            .policy(TestPolicy::new("maintenance", Position::Call, Act::Refuse))
            .fallback_sync("cached", |_e: Error<Boom>, _ctx| Ok(1_u32))
            .load_str(
                Format::Yaml,
                "pipelines:\n  quotes:\n    policies: [maintenance, retry]\n    retry: { delay: 1ms }\n    fallback: cached\n",
            )
            .unwrap();
        let quotes = registry.typed::<WithFallback<u32, Boom>>("quotes").unwrap();
        assert_eq!(v(quotes.call(|_| Ok::<_, Boom>(5))), Ok(1));
    }

    fn invalid(registry: seawall::config::RegistryBuilder, text: &str) -> String {
        match registry.load_str(Format::Toml, text) {
            Err(e @ LoadError::Invalid { .. }) => e.to_string(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_misplaced_or_unknown_policy_is_a_load_error_at_its_line() {
        let registry = || {
            Registry::builder()
                .store(MemoryStore::new())
                .policy(at("audit", Position::Call))
                .policy(at("count", Position::Attempt))
        };
        let e = invalid(
            registry(),
            "[pipelines.a]\nretry = { delay = \"1ms\" }\npolicies = [\"retry\", \"audit\"]\n",
        );
        assert_eq!(
            e,
            "<string>:3:12: pipeline `a`: audit.position is `call` (around the whole call) but \
             the policy is declared after `retry`; it acts once around the whole call: declare it \
             before `retry` (a policy around each attempt declares that position)"
        );
        let e = invalid(
            registry(),
            "[pipelines.a]\nretry = { delay = \"1ms\" }\npolicies = [\"audit\", \"retry\", \"audti\"]\n",
        );
        assert!(
            e.starts_with("<string>:3:12: pipeline `a`: pipeline.policies lists `audti`, which is neither a policy of the file nor a policy registered in code (registered policies: `audit`, `count`)"),
            "{e}"
        );
        let e = invalid(
            registry(),
            "[pipelines.a]\nretry = { delay = \"1ms\" }\npolicies = [\"audit\", \"retry\", \"audit\"]\n",
        );
        assert!(e.ends_with("pipeline.policies lists `audit` twice"), "{e}");
        // Handlers of other types, named together.
        let e = invalid(
            registry().fallback_sync("text", |_e: Error<Boom>, _ctx| Ok(String::new())),
            "[pipelines.a]\npolicies = [\"audit\"]\nfallback = \"text\"\n",
        );
        assert!(
            e.contains("`audit` handles `core::result::Result<u32, custom_policy::support::Boom>`, but fallback `text` handles `core::result::Result<alloc::string::String, custom_policy::support::Boom>`"),
            "{e}"
        );
        // A refused load leaves the registry as it was: nothing was built.
    }

    #[test]
    fn a_file_naming_a_policy_parses_and_only_a_registry_builds_it() {
        let config = Config::parse(Format::Toml, FILE).unwrap();
        let e = config.builder("quotes").unwrap().build().unwrap_err();
        assert_eq!((e.policy, e.field), ("pipeline", "policies"));
        assert!(
            e.rule.starts_with("lists `audit`, which is not a policy of the file (expected one of `coalesce`, `timeout`, `retry`")
                && e.rule.ends_with("a policy written in code is declared by a `Registry` that registers it (`RegistryBuilder::policy`)"),
            "{e}"
        );
        // Not a name: refused by the parser, with the names it knows.
        let e = Config::parse(Format::Toml, "[pipelines.a]\npolicies = [\"Audit-1\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown variant `Audit-1`"), "{e}");
        let e = Config::parse(Format::Toml, "[pipelines.a]\npolicies = [\"fallback\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown variant `fallback`"), "{e}");
    }
}

/// Around the whole call, each pass of a policy is a hedged call: the
/// policy's second pass starts hedged attempts of its own.
#[test]
fn a_policy_around_the_call_wraps_hedging_and_each_pass_hedges() {
    for case in cases().into_iter().filter(|c| !c.sync) {
        let policy = Arc::new(TestPolicy::new(
            "again",
            Position::Call,
            Act::Again {
                runs: 2,
                pause: ms(10),
            },
        ));
        let (b, clock, events) = case.builder("again-hedged");
        let p = b
            .policy(Arc::clone(&policy))
            .hedging(Hedging::fallback().max_hedged_attempts(1))
            .build()
            .unwrap();
        // Pass 1: attempt 1 fails, its hedge fails; pass 2: the third run
        // succeeds at once.
        let op = Op::failing(2);
        assert_eq!(v(case.call(&p, &clock, &op)), Ok(3));
        assert_eq!(op.runs(), 3);
        assert_eq!(op.attempts_seen(), [1, 2, 1]);
        assert_eq!(policy.seen().len(), 1);
        assert_eq!(clock.now(), case.start + ms(10));
        if case.listen {
            let hedges = events
                .lock()
                .unwrap()
                .iter()
                .filter(|e| matches!(e, EventKind::HedgeStarted { .. }))
                .count();
            assert_eq!(hedges, 1);
            assert_eq!(call_finished(&events).len(), 1);
        }
        // Both passes failing: the policy's result is the last pass's.
        let op = Op::failing(10);
        assert!(case.call(&p, &clock, &op).is_err());
        assert_eq!(op.runs(), 4);
    }
}

#[test]
fn a_policy_around_each_attempt_is_refused_with_hedging_and_accepted_around_the_call() {
    let e = Pipeline::builder("h")
        .hedging(Hedging::latency(ms(50)))
        .policy(at("audit", Position::Attempt))
        .build()
        .unwrap_err();
    assert_eq!((e.policy, e.field), ("audit", "position"));
    assert!(e.rule.contains("`hedging`"), "{e}");
    let e = Pipeline::builder("h")
        .policy(at("audit", Position::Attempt))
        .hedging(Hedging::latency(ms(50)))
        .build()
        .unwrap_err();
    assert_eq!((e.policy, e.field), ("audit", "position"));
    assert!(e.rule.contains("declared before `hedging`"), "{e}");
    let e = Pipeline::builder("h")
        .hedging(Hedging::latency(ms(50)))
        .policy(at("audit", Position::Call))
        .build()
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "audit.position is `call` (around the whole call) but the policy is declared after \
         `hedging`; it acts once around the whole call: declare it before `hedging` (a policy \
         around each attempt declares that position)"
    );
    // Around the call, under coalescing, a timeout and hedging: accepted.
    Pipeline::builder("h")
        .coalesce(Coalesce::new())
        .timeout(secs(1))
        .policy(at("audit", Position::Call))
        .hedging(Hedging::latency(ms(50)))
        .build()
        .unwrap();
    // Around each attempt, inside the adaptive limit: accepted; outside
    // it: refused.
    Pipeline::builder("a")
        .retry(retry(2))
        .adaptive_limit(AdaptiveLimit::aimd())
        .policy(at("audit", Position::Attempt))
        .build()
        .unwrap();
    let e = Pipeline::builder("a")
        .retry(retry(2))
        .policy(at("audit", Position::Attempt))
        .adaptive_limit(AdaptiveLimit::aimd())
        .build()
        .unwrap_err();
    assert_eq!((e.policy, e.field), ("audit", "position"));
    assert!(e.rule.contains("declared before `adaptive_limit`"), "{e}");
}

/// Coalesced calls share one execution of the whole call, the policy
/// around the call included: it makes one pass for all of them.
#[test]
fn coalesced_calls_share_one_pass_of_a_policy_around_the_call() {
    let policy = Arc::new(TestPolicy::new("wrap", Position::Call, Act::Wrap));
    let clock = VirtualClock::starting_at(FAR);
    let p = Pipeline::builder("shared")
        .clock(clock.clone())
        .coalesce(Coalesce::new())
        .policy(Arc::clone(&policy))
        .retry(retry(2))
        .build()
        .unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let results = support::rt().block_on(async {
        let calls = (0..8).map(|_| {
            let (runs, clock) = (runs.clone(), clock.clone());
            p.coalesce_key("k").run(move |_ctx| {
                let (runs, clock) = (runs.clone(), clock.clone());
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Clock::sleep(&clock, ms(5)).await;
                    Ok::<u32, Boom>(1)
                }
            })
        });
        futures_util::future::join_all(calls).await
    });
    assert!(results.iter().all(|r| matches!(r, Ok(101))), "{results:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(policy.seen().len(), 1);
}
