//! The timeout, bulkhead, hedging, fallback, cooldown and tower
//! adapter against the behaviours tower, tower-resilience and Polly users
//! expect, checked as seawall documents them (its public API only).
//!
//! Every async case runs on the virtual clock started at 0 and at 10^9 s,
//! with and without an event listener.

mod support;

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use seawall::error::TimeoutScope;
use seawall::pipeline::{Handles, HandlesSync, Kind};
use seawall::store::MemoryStore;
use seawall::testing::VirtualClock;
use seawall::{
    Bulkhead, CallOutcome, Clock, ConfigError, Context, Cooldown, Error, EventKind, HedgeTrigger,
    Hedging, Pipeline, PipelineBuilder, RejectionReason, Retry, RetryBudget, Timeout, TimeoutError,
    Verdict,
};
use support::{count, listen, ms, reason, recorder, refusals, secs, Boom, Log};

// ------------------------------------------------------------------ support

/// The virtual clock far from 0: 10^9 s (farther than `support::FAR`).
const FAR: Duration = Duration::from_secs(1_000_000_000);

#[derive(Debug, Clone, Copy)]
struct Mode {
    start: Duration,
    listen: bool,
}

fn modes() -> Vec<Mode> {
    let mut v = Vec::new();
    for start in [Duration::ZERO, FAR] {
        for listen in [false, true] {
            v.push(Mode { start, listen });
        }
    }
    v
}

/// What a call of these tests answers.
type Answer = Result<u32, Error<Boom>>;

impl Mode {
    /// A builder on a fresh memory store and a virtual clock at the mode's
    /// start, with a recording listener when the mode listens.
    fn builder(self, name: &str) -> (PipelineBuilder, VirtualClock, Log) {
        let clock = VirtualClock::starting_at(self.start);
        let (events, record) = recorder();
        let mut b = Pipeline::builder(name)
            .store(MemoryStore::new())
            .clock(clock.clone());
        if self.listen {
            b = b.on_event(record);
        }
        (b, clock, events)
    }

    /// The pipeline `configure` makes of [`Mode::builder`]'s builder.
    fn build<K: Kind>(
        self,
        name: &str,
        configure: impl FnOnce(PipelineBuilder) -> PipelineBuilder<K>,
    ) -> (Pipeline<K>, VirtualClock, Log) {
        let (b, clock, events) = self.builder(name);
        (configure(b).build().unwrap(), clock, events)
    }

    /// [`run_plans`] with times counted from the mode's start.
    fn run<K>(self, p: &Pipeline<K>, clock: &VirtualClock, plans: &[Plan]) -> (Answer, Arc<Tracker>)
    where
        K: Kind + Handles<u32, Boom>,
    {
        run_plans(p, clock, self.start, plans)
    }

    fn elapsed(self, clock: &VirtualClock) -> Duration {
        clock.now() - self.start
    }
}

/// What `pick` takes from the recorded events, in order.
fn picked<T>(events: &Log, pick: impl Fn(&EventKind) -> Option<T>) -> Vec<T> {
    events.lock().unwrap().iter().filter_map(pick).collect()
}

fn call_outcomes(events: &Log) -> Vec<CallOutcome> {
    picked(events, |e| match e {
        EventKind::CallFinished { outcome, .. } => Some(*outcome),
        _ => None,
    })
}

/// A current-thread runtime without tokio's timer (unlike `support::rt`):
/// every wait here is on the virtual clock.
fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

/// Polls `f` once with the current task's waker.
async fn poll_once<F: Future + ?Sized>(mut f: Pin<&mut F>) -> Poll<F::Output> {
    std::future::poll_fn(move |cx| Poll::Ready(f.as_mut().poll(cx))).await
}

/// `f` boxed and polled once, which must leave it pending (started or
/// queued).
async fn pending<F: Future>(f: F) -> Pin<Box<F>> {
    let mut f = Box::pin(f);
    assert!(poll_once(f.as_mut()).await.is_pending());
    f
}

fn assert_config(r: Result<impl std::fmt::Debug, ConfigError>, policy: &str, field: &str) {
    match r {
        Err(e) => assert_eq!(
            (e.policy, e.field),
            (policy, field),
            "wrong field named: {e}"
        ),
        Ok(p) => panic!("expected {policy}.{field} to fail build(), built {p:?}"),
    }
}

/// The timeout a call ended with; panics, naming `mode`, on anything else.
fn timeout_of<T: std::fmt::Debug>(r: Result<T, Error<Boom>>, mode: Mode) -> TimeoutError {
    match r {
        Err(Error::Timeout(e)) => e,
        other => panic!("{mode:?}: {other:?}"),
    }
}

/// A sync call on `p` answering `outer` that, while it runs, makes a
/// second call answering `inner` and then runs `check`: both results.
fn call_within<K>(p: &Pipeline<K>, (outer, inner): (u32, u32), check: impl Fn()) -> (Answer, Answer)
where
    K: HandlesSync<u32, Boom>,
{
    let mut within = None;
    let r = p.call(|_| {
        within = Some(p.call(|_| Ok::<u32, Boom>(inner)));
        check();
        Ok::<u32, Boom>(outer)
    });
    (r, within.unwrap())
}

/// A sync call on `p` answering `Ok(1)`, and how often its operation ran.
fn call_counted<K>(p: &Pipeline<K>) -> (Answer, u32)
where
    K: HandlesSync<u32, Boom>,
{
    let ran = AtomicU32::new(0);
    let r = p.call(|_| {
        ran.fetch_add(1, Ordering::SeqCst);
        Ok::<u32, Boom>(1)
    });
    (r, ran.load(Ordering::SeqCst))
}

/// What one attempt does on the pipeline's clock.
#[derive(Debug, Clone, Copy)]
enum Plan {
    /// Never answers.
    Never,
    /// Answers `Ok(v)` after the delay.
    Ok(Duration, u32),
    /// Answers `Err(Boom(e))` after the delay.
    Err(Duration, u32),
}

/// What each attempt did: when it started, when it was dropped unanswered,
/// and which attempts answered (times since the mode's start).
#[derive(Debug, Default)]
struct Tracker {
    started: Mutex<Vec<(u32, Duration)>>,
    dropped: Mutex<Vec<(u32, Duration)>>,
    answered: Mutex<Vec<u32>>,
}

impl Tracker {
    fn started(&self) -> Vec<(u32, Duration)> {
        self.started.lock().unwrap().clone()
    }
    fn dropped(&self) -> Vec<(u32, Duration)> {
        let mut d = self.dropped.lock().unwrap().clone();
        d.sort();
        d
    }
    fn answered(&self) -> Vec<u32> {
        self.answered.lock().unwrap().clone()
    }
}

/// Notes the drop of an attempt's future before it answered.
struct DropGuard {
    n: u32,
    tracker: Arc<Tracker>,
    clock: VirtualClock,
    start: Duration,
    answered: bool,
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        if !self.answered {
            self.tracker
                .dropped
                .lock()
                .unwrap()
                .push((self.n, self.clock.now() - self.start));
        }
    }
}

/// The future of attempt `n` following `plan`.
fn play(
    n: u32,
    plan: Plan,
    clock: &VirtualClock,
    start: Duration,
    tracker: &Arc<Tracker>,
) -> impl Future<Output = Result<u32, Boom>> + Send + 'static {
    tracker
        .started
        .lock()
        .unwrap()
        .push((n, clock.now() - start));
    let mut guard = DropGuard {
        n,
        tracker: tracker.clone(),
        clock: clock.clone(),
        start,
        answered: false,
    };
    let clock = clock.clone();
    async move {
        let r = match plan {
            Plan::Never => std::future::pending().await,
            Plan::Ok(d, v) => {
                Clock::sleep(&clock, d).await;
                Ok(v)
            }
            Plan::Err(d, e) => {
                Clock::sleep(&clock, d).await;
                Err(Boom(e))
            }
        };
        guard.answered = true;
        guard.tracker.answered.lock().unwrap().push(n);
        r
    }
}

/// One async call whose attempt `n` follows `plans[n - 1]` (never answers
/// past the list).
async fn call_plans<K>(
    p: &Pipeline<K>,
    clock: &VirtualClock,
    start: Duration,
    tracker: &Arc<Tracker>,
    plans: &[Plan],
) -> Result<u32, Error<Boom>>
where
    K: Kind + Handles<u32, Boom>,
{
    p.run(|ctx: Context| {
        let n = ctx.attempt();
        let plan = plans.get(n as usize - 1).copied().unwrap_or(Plan::Never);
        play(n, plan, clock, start, tracker)
    })
    .await
}

/// An operation holding its attempt for `d` on the clock, then `Ok(v)`.
fn hold(
    clock: &VirtualClock,
    d: Duration,
    v: u32,
) -> impl FnMut(Context) -> Pin<Box<dyn Future<Output = Result<u32, Boom>> + Send>> {
    let clock = clock.clone();
    move |_ctx| {
        let clock = clock.clone();
        Box::pin(async move {
            Clock::sleep(&clock, d).await;
            Ok(v)
        })
    }
}

/// One async call following `plans` (see [`call_plans`]), times counted
/// from `start`: its result and what its attempts did.
fn run_plans<K>(
    p: &Pipeline<K>,
    clock: &VirtualClock,
    start: Duration,
    plans: &[Plan],
) -> (Answer, Arc<Tracker>)
where
    K: Kind + Handles<u32, Boom>,
{
    let t = Arc::new(Tracker::default());
    let r = block_on(call_plans(p, clock, start, &t, plans));
    (r, t)
}

/// Starts a call on `holder` whose attempt holds its slot for `held` (then
/// answers 1), then one on `waiter` that must queue behind it (its attempt
/// takes `work`, then answers 2); runs `queued` once both wait, and awaits
/// both (the holder must answer 1). The waiter's result and when it ended,
/// since `start`.
fn queue_behind<K, L>(
    clock: &VirtualClock,
    start: Duration,
    (holder, held): (&Pipeline<K>, Duration),
    (waiter, work): (&Pipeline<L>, Duration),
    queued: impl FnOnce(),
) -> (Answer, Duration)
where
    K: Kind + Handles<u32, Boom>,
    L: Kind + Handles<u32, Boom>,
{
    block_on(async {
        let f1 = pending(holder.run(hold(clock, held, 1))).await;
        let w = pending(async {
            let r = waiter.run(hold(clock, work, 2)).await;
            (r, clock.now() - start)
        })
        .await;
        queued();
        let (w, r1) = tokio::join!(w, f1);
        assert_eq!(r1.unwrap(), 1);
        w
    })
}

// ------------------------------------------------------------------ timeout

#[test]
fn timeout_async_drops_the_future_at_exactly_the_deadline() {
    for mode in modes() {
        let (p, clock, events) = mode.build("case-timeout-drop", |b| b.timeout(ms(100)));
        let t = Arc::new(Tracker::default());
        let (r, dropped_on_return) = block_on(async {
            let r = call_plans(&p, &clock, mode.start, &t, &[Plan::Never]).await;
            (r, t.dropped())
        });
        let e = timeout_of(r, mode);
        assert_eq!(e.scope, TimeoutScope::Overall, "{mode:?}");
        assert_eq!(e.after, ms(100), "{mode:?}");
        assert_eq!(e.attempts, 1, "{mode:?}");
        assert_eq!(mode.elapsed(&clock), ms(100), "{mode:?}");
        // Cancelled (dropped) at the deadline, before the result came back.
        assert_eq!(dropped_on_return, vec![(1, ms(100))], "{mode:?}");
        if mode.listen {
            assert_eq!(
                count(&events, |e| matches!(
                    e,
                    EventKind::TimedOut { attempt: 1, after } if *after == ms(100)
                )),
                1,
                "{mode:?}"
            );
            assert_eq!(call_outcomes(&events), vec![CallOutcome::Timeout]);
        }
    }
}

#[test]
fn timeout_async_answer_at_the_deadline_is_on_time_one_nanosecond_later_is_not() {
    for mode in modes() {
        // A 100 ms timeout, an attempt answering 7 after `answer_after`:
        // the call ends at 100 ms either way.
        let call = |answer_after: Duration| {
            let (p, clock, _) = mode.build("case-timeout-edge", |b| b.timeout(ms(100)));
            let (r, t) = mode.run(&p, &clock, &[Plan::Ok(answer_after, 7)]);
            assert_eq!(mode.elapsed(&clock), ms(100), "{mode:?}");
            (r, t)
        };
        let (r, _) = call(ms(100));
        assert_eq!(
            r.unwrap(),
            7,
            "{mode:?}: an answer at the deadline is on time"
        );

        let (r, t) = call(ms(100) + Duration::from_nanos(1));
        assert!(matches!(r, Err(Error::Timeout(_))), "{mode:?}: {r:?}");
        assert_eq!(t.dropped(), vec![(1, ms(100))], "{mode:?}");
    }
}

#[test]
fn timeout_sync_is_cooperative_lenient_by_default_strict_on_demand() {
    for mode in modes() {
        // Lenient: a late success is kept and reported.
        let (p, clock, events) = mode.build("case-timeout-sync", |b| b.timeout(ms(100)));
        let c = clock.clone();
        let r = p.call(|ctx| {
            assert_eq!(ctx.deadline(), Some(c.now() + ms(100)), "{mode:?}");
            assert_eq!(ctx.remaining(), Some(ms(100)), "{mode:?}");
            assert!(!ctx.is_expired());
            c.advance(ms(150));
            assert!(ctx.is_expired());
            assert_eq!(ctx.remaining(), Some(Duration::ZERO));
            Ok::<_, Boom>(7)
        });
        assert_eq!(r.unwrap(), 7, "{mode:?}");
        if mode.listen {
            assert_eq!(
                count(&events, |e| matches!(
                    e,
                    EventKind::DeadlineExceeded { late_by } if *late_by == ms(50)
                )),
                1,
                "{mode:?}"
            );
        }

        // Strict: the late success becomes a timeout.
        let strict = |name: &str| mode.build(name, |b| b.timeout(Timeout::strict(ms(100))));
        let (p, clock, _) = strict("case-timeout-sync-strict");
        let r = p.call(|_| {
            clock.advance(ms(150));
            Ok::<_, Boom>(7)
        });
        let e = timeout_of(r, mode);
        assert_eq!(
            (e.scope, e.after, e.attempts),
            (TimeoutScope::Overall, ms(100), 1)
        );

        // Strict, at the deadline exactly: on time.
        let (p, clock, _) = strict("case-timeout-sync-strict-edge");
        let r = p.call(|ctx| {
            clock.advance(ms(100));
            assert!(!ctx.is_expired(), "at the deadline is not expired");
            Ok::<_, Boom>(7)
        });
        assert_eq!(r.unwrap(), 7, "{mode:?}");
    }
}

#[test]
fn timeout_per_attempt_after_retry_and_overall_before_it() {
    for mode in modes() {
        // After the retry: each attempt is cut at 100 ms, the call ends
        // with the timeout of the last attempt.
        let (p, clock, events) = mode.build("case-timeout-attempt", |b| {
            b.retry(Retry::constant(ms(10)).max_attempts(3))
                .timeout(ms(100))
        });
        let (r, t) = mode.run(&p, &clock, &[]);
        let e = timeout_of(r, mode);
        assert_eq!(
            (e.scope, e.after, e.attempts),
            (TimeoutScope::Attempt, ms(100), 3)
        );
        assert_eq!(mode.elapsed(&clock), ms(320), "{mode:?}");
        assert_eq!(
            t.started(),
            vec![(1, ms(0)), (2, ms(110)), (3, ms(220))],
            "{mode:?}"
        );
        assert_eq!(
            t.dropped(),
            vec![(1, ms(100)), (2, ms(210)), (3, ms(320))],
            "{mode:?}"
        );
        if mode.listen {
            assert_eq!(
                count(&events, |e| matches!(e, EventKind::TimedOut { .. })),
                3
            );
        }

        // Before the retry: one deadline for the whole call.
        let (p, clock, _) = mode.build("case-timeout-overall", |b| {
            b.timeout(ms(250))
                .retry(Retry::constant(ms(10)).max_attempts(5))
        });
        let fail = Plan::Err(ms(100), 1);
        let (r, t) = mode.run(&p, &clock, &[fail, fail, fail]);
        let e = timeout_of(r, mode);
        assert_eq!(
            (e.scope, e.after, e.attempts),
            (TimeoutScope::Overall, ms(250), 3)
        );
        assert_eq!(mode.elapsed(&clock), ms(250), "{mode:?}");
        assert_eq!(t.dropped(), vec![(3, ms(250))], "{mode:?}");
    }
}

#[test]
fn timeout_zero_fails_build_naming_the_field() {
    let b = || Pipeline::builder("case-t0");
    for built in [
        b().timeout(Duration::ZERO).build(),
        b().timeout(Timeout::strict(Duration::ZERO)).build(),
        b().retry(Retry::constant(ms(1)))
            .timeout(Duration::ZERO)
            .build(),
        b().hedging(Hedging::latency(ms(5)))
            .timeout(Duration::ZERO)
            .build(),
    ] {
        assert_config(built, "timeout", "duration");
    }
}

#[test]
fn timeout_huge_runs_without_overflow_sync_and_async() {
    for huge in [
        Duration::MAX,
        Duration::from_secs(u64::MAX),
        secs(100 * 365 * 86_400),
    ] {
        for mode in modes() {
            let (p, clock, _) = mode.build("case-timeout-huge", |b| b.timeout(huge));
            let r = p.call(|ctx| {
                assert!(ctx.remaining().unwrap() > secs(86_400 * 365), "{mode:?}");
                assert!(!ctx.is_expired());
                Ok::<_, Boom>(1)
            });
            assert_eq!(r.unwrap(), 1, "{mode:?} {huge:?}");
            let (r, _) = mode.run(&p, &clock, &[Plan::Ok(secs(3600), 2)]);
            assert_eq!(r.unwrap(), 2, "{mode:?} {huge:?}");
            assert_eq!(mode.elapsed(&clock), secs(3600));

            // Per attempt, with a retry.
            let (p, clock, _) = mode.build("case-timeout-huge-attempt", |b| {
                b.timeout(huge)
                    .retry(Retry::constant(ms(1)).max_attempts(2))
                    .timeout(huge)
            });
            let (r, _) = mode.run(&p, &clock, &[Plan::Err(ms(5), 1), Plan::Ok(ms(5), 3)]);
            assert_eq!(r.unwrap(), 3, "{mode:?} {huge:?}");
            assert_eq!(mode.elapsed(&clock), ms(11));
        }
    }
}

// ----------------------------------------------------------------- bulkhead

#[test]
fn bulkhead_caps_concurrent_async_attempts_and_refuses_at_once() {
    for mode in modes() {
        let (p, clock, events) = mode.build("case-bulkhead-max", |b| b.bulkhead(Bulkhead::new(2)));
        block_on(async {
            let f1 = pending(p.run(hold(&clock, ms(100), 1))).await;
            let f2 = pending(p.run(hold(&clock, ms(100), 2))).await;
            assert_eq!(p.in_flight().unwrap(), 2, "{mode:?}");
            let r3 = p.run(hold(&clock, ms(100), 3)).await;
            assert_eq!(reason(&r3), Some(RejectionReason::BulkheadFull), "{mode:?}");
            assert_eq!(mode.elapsed(&clock), Duration::ZERO, "refused at once");
            let (r1, r2) = tokio::join!(f1, f2);
            assert_eq!((r1.unwrap(), r2.unwrap()), (1, 2));
        });
        assert_eq!(p.in_flight().unwrap(), 0);
        assert_eq!(mode.elapsed(&clock), ms(100));
        if mode.listen {
            assert_eq!(refusals(&events, RejectionReason::BulkheadFull), 1);
        }
    }
}

#[test]
fn bulkhead_sync_call_is_refused_while_the_slot_is_held() {
    for mode in modes() {
        let (p, _clock, _) = mode.build("case-bulkhead-sync", |b| b.bulkhead(Bulkhead::new(1)));
        let (r, inner) = call_within(&p, (1, 2), || assert_eq!(p.in_flight().unwrap(), 1));
        assert_eq!(r.unwrap(), 1);
        assert_eq!(reason(&inner), Some(RejectionReason::BulkheadFull));
        assert_eq!(p.in_flight().unwrap(), 0);
        assert_eq!(p.call(|_| Ok::<u32, Boom>(3)).unwrap(), 3);
    }
}

#[test]
fn bulkhead_slot_released_on_error_panic_drop_and_timeout() {
    for mode in modes() {
        let (p, clock, _) = mode.build("case-bulkhead-release", |b| b.bulkhead(Bulkhead::new(1)));

        // Error, sync and async.
        let r = p.call(|_| Err::<u32, _>(Boom(1)));
        assert!(matches!(r, Err(Error::Operation(Boom(1)))), "{r:?}");
        assert_eq!(p.in_flight().unwrap(), 0, "{mode:?}: after a sync error");
        let r = block_on(p.run(|_| async { Err::<u32, _>(Boom(2)) }));
        assert!(matches!(r, Err(Error::Operation(Boom(2)))), "{r:?}");
        assert_eq!(p.in_flight().unwrap(), 0, "{mode:?}: after an async error");

        // Panic, sync and async.
        let r = catch_unwind(AssertUnwindSafe(|| {
            p.call(|_| -> Result<u32, Boom> { panic!("intentional panic (sync)") })
        }));
        assert!(r.is_err());
        assert_eq!(p.in_flight().unwrap(), 0, "{mode:?}: after a sync panic");
        let r = catch_unwind(AssertUnwindSafe(|| {
            block_on(p.run(|_| async {
                if true {
                    panic!("intentional panic (async)");
                }
                Ok::<u32, Boom>(0)
            }))
        }));
        assert!(r.is_err());
        assert_eq!(p.in_flight().unwrap(), 0, "{mode:?}: after an async panic");

        // Future dropped mid-flight (cancelled).
        block_on(async {
            let f = pending(p.run(hold(&clock, secs(10), 1))).await;
            assert_eq!(p.in_flight().unwrap(), 1);
            drop(f);
            assert_eq!(p.in_flight().unwrap(), 0, "{mode:?}: after a drop");
            assert_eq!(p.run(hold(&clock, ms(1), 2)).await.unwrap(), 2);
        });
        assert_eq!(p.in_flight().unwrap(), 0);
        assert_eq!(p.call(|_| Ok::<u32, Boom>(3)).unwrap(), 3);

        // Cut by a timeout.
        let (p, clock, _) = mode.build("case-bulkhead-timeout", |b| {
            b.timeout(ms(50)).bulkhead(Bulkhead::new(1))
        });
        let (r, _) = mode.run(&p, &clock, &[Plan::Never]);
        assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
        assert_eq!(p.in_flight().unwrap(), 0, "{mode:?}: after a timeout");
        assert_eq!(p.call(|_| Ok::<u32, Boom>(4)).unwrap(), 4);
    }
}

#[test]
fn bulkhead_after_retry_frees_the_slot_during_the_wait_before_retry_holds_it() {
    for mode in modes() {
        for before in [false, true] {
            let (p, clock, _) = mode.build("case-bulkhead-retry", |b| {
                let retry = Retry::constant(ms(100)).max_attempts(2);
                if before {
                    b.bulkhead(Bulkhead::new(1)).retry(retry)
                } else {
                    b.retry(retry).bulkhead(Bulkhead::new(1))
                }
            });
            let t = Arc::new(Tracker::default());
            block_on(async {
                let plans = [Plan::Err(Duration::ZERO, 1), Plan::Ok(Duration::ZERO, 2)];
                let mut f = Box::pin(call_plans(&p, &clock, mode.start, &t, &plans));
                // Poll until the first attempt failed and the wait began.
                while t.answered().is_empty() {
                    assert!(poll_once(f.as_mut()).await.is_pending());
                }
                let held = p.in_flight().unwrap();
                assert_eq!(held, u32::from(before), "{mode:?} before={before}");
                assert_eq!(f.await.unwrap(), 2);
            });
            assert_eq!(p.in_flight().unwrap(), 0);
            assert_eq!(mode.elapsed(&clock), ms(100));
        }
    }
}

#[test]
fn bulkhead_queue_is_fifo_hands_the_slot_over_and_refuses_when_full() {
    for mode in modes() {
        let (p, clock, events) = mode.build("case-bulkhead-queue", |b| {
            b.bulkhead(Bulkhead::new(1).queue(2, ms(500)))
        });
        let order: Arc<Mutex<Vec<(u32, Duration)>>> = Arc::default();
        let op = |v: u32, d: Duration| {
            let clock = clock.clone();
            let order = order.clone();
            let start = mode.start;
            move |_ctx: Context| {
                let clock = clock.clone();
                let order = order.clone();
                async move {
                    order.lock().unwrap().push((v, clock.now() - start));
                    Clock::sleep(&clock, d).await;
                    Ok::<u32, Boom>(v)
                }
            }
        };
        block_on(async {
            let f1 = pending(p.run(op(1, ms(30)))).await;
            let f2 = pending(p.run(op(2, ms(10)))).await;
            let f3 = pending(p.run(op(3, ms(10)))).await;
            // The queue (2) is full: refused at once.
            let r4 = p.run(op(4, ms(10))).await;
            assert_eq!(reason(&r4), Some(RejectionReason::BulkheadFull), "{mode:?}");
            // Sync calls never wait.
            let r5 = p.call(|_| Ok::<u32, Boom>(5));
            assert_eq!(reason(&r5), Some(RejectionReason::BulkheadFull), "{mode:?}");
            let (r1, r2, r3) = tokio::join!(f1, f2, f3);
            assert_eq!((r1.unwrap(), r2.unwrap(), r3.unwrap()), (1, 2, 3));
        });
        assert_eq!(
            *order.lock().unwrap(),
            vec![(1, ms(0)), (2, ms(30)), (3, ms(40))],
            "{mode:?}: first in, first out, handed over at once"
        );
        assert_eq!(p.in_flight().unwrap(), 0);
        if mode.listen {
            assert_eq!(
                count(&events, |e| matches!(
                    e,
                    EventKind::Deferred {
                        reason: RejectionReason::BulkheadFull,
                        ..
                    }
                )),
                2,
                "{mode:?}: one Deferred per queued call"
            );
        }
    }
}

#[test]
fn bulkhead_queue_wait_runs_out_at_max_wait_and_a_slot_freed_at_that_instant_is_taken() {
    for mode in modes() {
        for (held, expect_ok) in [(ms(200), false), (ms(50), true)] {
            let (p, clock, _) = mode.build("case-bulkhead-wait", |b| {
                b.bulkhead(Bulkhead::new(1).queue(1, ms(50)))
            });
            // The waiter joins the queue at once, before the holder's
            // sleep may move the virtual clock.
            let (r2, at) =
                queue_behind(&clock, mode.start, (&p, held), (&p, Duration::ZERO), || {
                    assert_eq!(mode.elapsed(&clock), Duration::ZERO)
                });
            if expect_ok {
                assert_eq!(
                    r2.unwrap(),
                    2,
                    "{mode:?}: freed at the instant the wait ends"
                );
                assert_eq!(at, ms(50));
            } else {
                assert_eq!(reason(&r2), Some(RejectionReason::BulkheadFull), "{mode:?}");
                assert_eq!(at, ms(50), "{mode:?}: refused when max_wait runs out");
            }
            assert_eq!(p.in_flight().unwrap(), 0);
        }
    }
}

#[test]
fn bulkhead_queue_wait_bounded_by_a_call_timeout_ends_with_the_refusal() {
    for mode in modes() {
        let clock = VirtualClock::starting_at(mode.start);
        let store = MemoryStore::new();
        let bulkhead = Bulkhead::new(1).queue(1, ms(50));
        let builder = || {
            let b = Pipeline::builder("case-bulkhead-deadline")
                .store(store.clone())
                .clock(clock.clone());
            listen(b, mode.listen)
        };
        let holder = builder().bulkhead(bulkhead.clone()).build().unwrap();
        let timed = builder()
            .timeout(ms(30))
            .bulkhead(bulkhead)
            .build()
            .unwrap();
        let (r, at) = queue_behind(
            &clock,
            mode.start,
            (&holder, ms(200)),
            (&timed, Duration::ZERO),
            || {
                // The two pipelines share the slot.
                assert_eq!(timed.in_flight().unwrap(), 1);
                assert_eq!(mode.elapsed(&clock), Duration::ZERO);
            },
        );
        assert_eq!(
            reason(&r),
            Some(RejectionReason::BulkheadFull),
            "{mode:?}: {r:?}"
        );
        assert_eq!(at, ms(30), "{mode:?}: the call's deadline bounds the wait");
    }
}

#[test]
fn bulkhead_bad_configuration_fails_build_naming_the_field() {
    let b = || Pipeline::builder("case-bulkhead-config");
    for (built, field) in [
        (b().bulkhead(Bulkhead::new(0)).build(), "max_concurrent"),
        (
            b().bulkhead(Bulkhead::new(1).queue(3, Duration::ZERO))
                .build(),
            "max_wait",
        ),
        (
            b().bulkhead(Bulkhead::new(1).lease(Duration::ZERO)).build(),
            "lease",
        ),
        // The default lease (60 s) must exceed the attempt timeout by > 1 s.
        (
            b().timeout(secs(59)).bulkhead(Bulkhead::new(1)).build(),
            "lease",
        ),
        (
            b().timeout(Duration::MAX)
                .bulkhead(Bulkhead::new(1).lease(Duration::MAX))
                .build(),
            "lease",
        ),
    ] {
        assert_config(built, "bulkhead", field);
    }
    // What is allowed builds.
    for (i, built) in [
        b().bulkhead(Bulkhead::new(u32::MAX)).build(),
        b().bulkhead(Bulkhead::new(1).queue(0, Duration::ZERO))
            .build(),
        b().bulkhead(Bulkhead::new(1).queue(0, secs(5))).build(),
        b().timeout(ms(58_999)).bulkhead(Bulkhead::new(1)).build(),
    ]
    .into_iter()
    .enumerate()
    {
        assert!(built.is_ok(), "case {i}: {built:?}");
    }
}

// ------------------------------------------------------------------ hedging

fn hedges(events: &Log) -> Vec<(u32, HedgeTrigger)> {
    picked(events, |e| match e {
        EventKind::HedgeStarted { attempt, trigger } => Some((*attempt, *trigger)),
        _ => None,
    })
}

#[test]
fn hedging_starts_a_hedge_after_the_delay_and_the_first_answer_wins() {
    for mode in modes() {
        let latency = |name: &str| mode.build(name, |b| b.hedging(Hedging::latency(ms(50))));

        // The hedge answers first; the original is cancelled.
        let (p, clock, events) = latency("case-hedge-delay");
        let (r, t) = mode.run(&p, &clock, &[Plan::Never, Plan::Ok(ms(10), 2)]);
        assert_eq!(r.unwrap(), 2, "{mode:?}");
        assert_eq!(mode.elapsed(&clock), ms(60), "{mode:?}");
        assert_eq!(t.started(), vec![(1, ms(0)), (2, ms(50))], "{mode:?}");
        assert_eq!(t.dropped(), vec![(1, ms(60))], "{mode:?}");
        if mode.listen {
            assert_eq!(hedges(&events), vec![(2, HedgeTrigger::Delay)]);
        }

        // The original answers after the hedge started: it wins, the hedge
        // is cancelled.
        let (p, clock, _) = latency("case-hedge-orig");
        let (r, t) = mode.run(&p, &clock, &[Plan::Ok(ms(70), 1), Plan::Ok(ms(100), 2)]);
        assert_eq!(r.unwrap(), 1, "{mode:?}");
        assert_eq!(mode.elapsed(&clock), ms(70));
        assert_eq!(t.dropped(), vec![(2, ms(70))], "{mode:?}");

        // The original answers before the delay: no hedge at all.
        let (p, clock, events) = latency("case-hedge-none");
        let (r, t) = mode.run(&p, &clock, &[Plan::Ok(ms(30), 1)]);
        assert_eq!(r.unwrap(), 1);
        assert_eq!(mode.elapsed(&clock), ms(30));
        assert_eq!(t.started(), vec![(1, ms(0))], "{mode:?}");
        assert!(hedges(&events).is_empty());
    }
}

#[test]
fn hedging_starts_at_most_max_hedged_attempts() {
    for mode in modes() {
        let (p, clock, events) = mode.build("case-hedge-max", |b| {
            b.timeout(secs(1))
                .hedging(Hedging::latency(ms(50)).max_hedged_attempts(3))
        });
        let (r, t) = mode.run(&p, &clock, &[]);
        let e = timeout_of(r, mode);
        assert_eq!(e.scope, TimeoutScope::Overall, "{mode:?}");
        assert_eq!(e.after, secs(1));
        assert_eq!(mode.elapsed(&clock), secs(1));
        assert_eq!(
            t.started(),
            vec![(1, ms(0)), (2, ms(50)), (3, ms(100)), (4, ms(150))],
            "{mode:?}"
        );
        assert_eq!(
            t.dropped().len(),
            4,
            "every attempt cancelled at the deadline"
        );
        if mode.listen {
            assert_eq!(hedges(&events).len(), 3);
        }
    }
}

#[test]
fn hedging_a_failure_starts_the_next_attempt_at_once() {
    for mode in modes() {
        // Latency mode: a failure does not wait for the delay.
        let (p, clock, events) =
            mode.build("case-hedge-fail", |b| b.hedging(Hedging::latency(ms(50))));
        let (r, t) = mode.run(&p, &clock, &[Plan::Err(ms(10), 1), Plan::Ok(ms(10), 2)]);
        assert_eq!(r.unwrap(), 2, "{mode:?}");
        assert_eq!(t.started(), vec![(1, ms(0)), (2, ms(10))], "{mode:?}");
        assert_eq!(mode.elapsed(&clock), ms(20));
        if mode.listen {
            assert_eq!(hedges(&events), vec![(2, HedgeTrigger::Failure)]);
        }

        // Fallback mode: only a failure starts the next attempt.
        let (p, clock, _) = mode.build("case-hedge-fallback", |b| b.hedging(Hedging::fallback()));
        let (r, t) = mode.run(&p, &clock, &[Plan::Ok(ms(500), 1)]);
        assert_eq!(r.unwrap(), 1);
        assert_eq!(t.started(), vec![(1, ms(0))], "{mode:?}");

        // An attempt timeout is a failure too.
        let (p, clock, _) = mode.build("case-hedge-attempt-timeout", |b| {
            b.hedging(Hedging::latency(secs(1))).timeout(ms(100))
        });
        let (r, t) = mode.run(&p, &clock, &[Plan::Never, Plan::Ok(ms(10), 2)]);
        assert_eq!(r.unwrap(), 2, "{mode:?}");
        assert_eq!(t.started(), vec![(1, ms(0)), (2, ms(100))], "{mode:?}");
        assert_eq!(mode.elapsed(&clock), ms(110));
    }
}

#[test]
fn hedging_parallel_all_fail_gives_the_error_of_the_attempt_that_ended_last() {
    for mode in modes() {
        let (p, clock, _) = mode.build("case-hedge-parallel", |b| {
            b.hedging(Hedging::parallel().max_hedged_attempts(2))
        });
        let (r, t) = mode.run(
            &p,
            &clock,
            &[
                Plan::Err(ms(30), 1),
                Plan::Err(ms(10), 2),
                Plan::Err(ms(20), 3),
            ],
        );
        match r {
            Err(Error::RetryExhausted { attempts, last }) => {
                assert_eq!((attempts, last), (3, Boom(1)), "{mode:?}")
            }
            other => panic!("{mode:?}: {other:?}"),
        }
        assert_eq!(
            t.started(),
            vec![(1, ms(0)), (2, ms(0)), (3, ms(0))],
            "{mode:?}"
        );
        assert_eq!(mode.elapsed(&clock), ms(30));
    }
}

#[test]
fn hedging_an_error_not_to_be_hedged_wins_at_once() {
    for mode in modes() {
        let (p, clock, _) = mode.build("case-hedge-if", |b| {
            b.hedging(Hedging::latency(ms(5)))
                .hedge_if(|e: &Boom| e.0 != 9)
        });
        let (r, t) = mode.run(&p, &clock, &[Plan::Err(ms(10), 9), Plan::Never]);
        assert!(
            matches!(r, Err(Error::Operation(Boom(9)))),
            "{mode:?}: {r:?}"
        );
        assert_eq!(mode.elapsed(&clock), ms(10));
        assert_eq!(t.dropped(), vec![(2, ms(10))], "{mode:?}");
    }
}

#[test]
fn hedging_hook_sees_each_hedge_and_a_bulkhead_slot_is_given_back_by_losers() {
    for mode in modes() {
        let hooked: Arc<Mutex<Vec<u32>>> = Arc::default();
        let h = hooked.clone();
        let (p, clock, _) = mode.build("case-hedge-bulkhead", |b| {
            b.hedging(
                Hedging::latency(ms(20))
                    .max_hedged_attempts(2)
                    .on_hedging(move |ctx| h.lock().unwrap().push(ctx.attempt())),
            )
            .bulkhead(Bulkhead::new(3))
        });
        let (r, t) = mode.run(&p, &clock, &[Plan::Never, Plan::Never, Plan::Ok(ms(5), 3)]);
        assert_eq!(r.unwrap(), 3);
        assert_eq!(*hooked.lock().unwrap(), vec![2, 3]);
        assert_eq!(
            p.in_flight().unwrap(),
            0,
            "{mode:?}: losers give their slots back"
        );
        assert_eq!(t.dropped(), vec![(1, ms(45)), (2, ms(45))]);
    }
}

#[test]
fn hedging_a_hedge_refused_by_a_full_bulkhead_does_not_start() {
    for mode in modes() {
        let (p, clock, events) = mode.build("case-hedge-refused", |b| {
            b.hedging(Hedging::latency(ms(10)))
                .bulkhead(Bulkhead::new(1))
        });
        let (r, t) = mode.run(&p, &clock, &[Plan::Ok(ms(45), 1)]);
        assert_eq!(r.unwrap(), 1, "{mode:?}");
        assert_eq!(t.started(), vec![(1, ms(0))], "{mode:?}");
        assert_eq!(mode.elapsed(&clock), ms(45));
        if mode.listen {
            assert!(hedges(&events).is_empty());
            // Tried once per delay: at 10, 20, 30 and 40 ms.
            assert_eq!(
                refusals(&events, RejectionReason::BulkheadFull),
                4,
                "{mode:?}"
            );
        }
    }
}

#[test]
fn hedging_sync_call_is_a_config_error_without_running_the_operation() {
    for mode in modes() {
        let (p, _clock, _) = mode.build("case-hedge-sync", |b| b.hedging(Hedging::parallel()));
        let (r, ran) = call_counted(&p);
        assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
        assert_eq!(ran, 0);
    }
}

#[test]
fn hedging_bad_configuration_fails_build_naming_the_field() {
    let b = || Pipeline::builder("case-hedge-config");
    for n in [0, 11, u32::MAX] {
        assert_config(
            b().hedging(Hedging::latency(ms(5)).max_hedged_attempts(n))
                .build(),
            "hedging",
            "max_hedged_attempts",
        );
    }
    for delay in [secs(86_400), Duration::MAX] {
        assert_config(
            b().hedging(Hedging::latency(delay)).build(),
            "hedging",
            "delay",
        );
    }
    let e = b()
        .hedging(Hedging::fallback().budget(RetryBudget::new(-0.5, 10)))
        .build()
        .unwrap_err();
    assert_eq!(e.policy, "hedging", "{e}");
    assert!(e.to_string().contains("ratio"), "{e}");
    assert_config(
        b().hedging(Hedging::parallel())
            .retry(Retry::constant(ms(1)))
            .build(),
        "pipeline",
        "retry",
    );
    assert_config(
        b().retry(Retry::constant(ms(1)))
            .hedging(Hedging::parallel())
            .build(),
        "pipeline",
        "hedging",
    );
    assert!(b()
        .hedging(Hedging::latency(secs(86_399)).max_hedged_attempts(10))
        .build()
        .is_ok());
}

// ----------------------------------------------------------------- fallback

#[test]
fn fallback_receives_the_final_error_and_its_result_is_the_calls() {
    for mode in modes() {
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let s = seen.clone();
        let (p, clock, events) = mode.build("case-fallback", |b| {
            b.retry(Retry::constant(ms(10)).max_attempts(3))
                .fallback_sync(move |e: Error<Boom>, _ctx| {
                    s.lock().unwrap().push(format!("{e:?}"));
                    Ok::<u32, Boom>(42)
                })
        });
        // Sync.
        assert_eq!(p.call(|_| Err(Boom(1))).unwrap(), 42, "{mode:?}");
        // Async.
        let fail = Plan::Err(ms(1), 2);
        let (r, _) = mode.run(&p, &clock, &[fail, fail, fail]);
        assert_eq!(r.unwrap(), 42);
        // Not called on success.
        assert_eq!(p.call(|_| Ok(7)).unwrap(), 7);
        let exhausted = |last: Boom| format!("{:?}", Error::RetryExhausted { attempts: 3, last });
        assert_eq!(
            *seen.lock().unwrap(),
            vec![exhausted(Boom(1)), exhausted(Boom(2))]
        );
        if mode.listen {
            assert_eq!(
                count(&events, |e| matches!(e, EventKind::FallbackExecuted)),
                2
            );
            assert_eq!(
                call_outcomes(&events),
                vec![
                    CallOutcome::Fallback,
                    CallOutcome::Fallback,
                    CallOutcome::Success
                ]
            );
        }
    }
}

#[test]
fn fallback_is_outermost_and_handles_timeouts_and_rejections() {
    for mode in modes() {
        // Declared first, it still catches the timeout declared after it.
        let (p, clock, _) = mode.build("case-fallback-timeout", |b| {
            b.fallback(|e: Error<Boom>, _ctx| async move {
                assert!(e.is_timeout(), "{e:?}");
                Ok::<u32, Boom>(99)
            })
            .timeout(ms(50))
        });
        let (r, t) = mode.run(&p, &clock, &[Plan::Never]);
        assert_eq!(r.unwrap(), 99, "{mode:?}");
        assert_eq!(mode.elapsed(&clock), ms(50));
        assert_eq!(t.dropped(), vec![(1, ms(50))]);

        // A rejection by a full bulkhead.
        let (p, _clock, _) = mode.build("case-fallback-rejected", |b| {
            b.bulkhead(Bulkhead::new(1))
                .fallback_sync(|e: Error<Boom>, _ctx| match e {
                    Error::Rejected(r) if r.reason == RejectionReason::BulkheadFull => Ok(0u32),
                    other => panic!("{other:?}"),
                })
        });
        let (outer, inner) = call_within(&p, (1, 2), || {});
        assert_eq!(outer.unwrap(), 1);
        assert_eq!(inner.unwrap(), 0, "{mode:?}");
    }
}

#[test]
fn fallback_when_filters_and_its_own_error_is_error_fallback() {
    for mode in modes() {
        let (p, clock, events) = mode.build("case-fallback-when", |b| {
            b.timeout(ms(50))
                .fallback_sync(|e: Error<Boom>, _ctx| -> Result<u32, Boom> {
                    match e {
                        Error::Timeout(_) => Err(Boom(99)),
                        other => panic!("filtered out: {other:?}"),
                    }
                })
                .fallback_when(|e| e.is_timeout())
        });
        // Filtered out: the error propagates unchanged.
        let r = p.call(|_| Err::<u32, _>(Boom(1)));
        assert!(
            matches!(r, Err(Error::Operation(Boom(1)))),
            "{mode:?}: {r:?}"
        );
        let (r, _) = mode.run(&p, &clock, &[Plan::Err(ms(1), 2)]);
        assert!(
            matches!(r, Err(Error::Operation(Boom(2)))),
            "{mode:?}: {r:?}"
        );
        // Applied: its own error is `Error::Fallback`.
        let (r, _) = mode.run(&p, &clock, &[Plan::Never]);
        match &r {
            Err(Error::Fallback(Boom(99))) => {}
            other => panic!("{mode:?}: {other:?}"),
        }
        assert_eq!(r.unwrap_err().operation_error(), Some(&Boom(99)));
        if mode.listen {
            assert_eq!(
                count(&events, |e| matches!(e, EventKind::FallbackExecuted)),
                1
            );
            assert_eq!(call_outcomes(&events), vec![CallOutcome::Failure; 3]);
        }
    }
}

// ----------------------------------------------------------------- cooldown

#[test]
fn cooldown_opened_by_a_hint_refuses_defers_or_exceeds_the_deadline() {
    for mode in modes() {
        let throttled = |_: &Boom| Verdict::throttled().with_retry_after(secs(2));

        // max_wait 0: refused at once while the pause lasts.
        let (p, clock, _) = mode.build("case-cooldown-refuse", |b| {
            b.cooldown(Cooldown::new().max_wait(Duration::ZERO))
                .classify(throttled)
        });
        assert!(matches!(
            p.call(|_| Err::<u32, _>(Boom(1))),
            Err(Error::Operation(_))
        ));
        let (r, ran) = call_counted(&p);
        assert_eq!(
            reason(&r),
            Some(RejectionReason::CooldownActive),
            "{mode:?}"
        );
        assert_eq!(ran, 0);
        clock.advance(secs(2));
        assert_eq!(p.call(|_| Ok::<u32, Boom>(2)).unwrap(), 2, "{mode:?}");

        // Default max_wait (30 s): the call waits for the pause to end,
        // sync and async.
        for sync in [true, false] {
            let (p, clock, _) = mode.build("case-cooldown-wait", |b| {
                b.cooldown(Cooldown::new()).classify(throttled)
            });
            assert!(p.call(|_| Err::<u32, _>(Boom(1))).is_err());
            let r = if sync {
                p.call(|_| Ok::<u32, Boom>(3))
            } else {
                block_on(p.run(|_| async { Ok::<u32, Boom>(3) }))
            };
            assert_eq!(r.unwrap(), 3, "{mode:?} sync={sync}");
            assert_eq!(mode.elapsed(&clock), secs(2), "{mode:?} sync={sync}");
        }

        // A deadline before the end of the pause: refused at once; one at
        // the end of the pause: waits and runs.
        for (deadline, refused) in [(secs(1), true), (secs(2), false)] {
            let (p, clock, _) = mode.build("case-cooldown-deadline", |b| {
                b.timeout(deadline)
                    .cooldown(Cooldown::new())
                    .classify(throttled)
            });
            assert!(p.call(|_| Err::<u32, _>(Boom(1))).is_err());
            let r = p.call(|_| Ok::<u32, Boom>(4));
            if refused {
                assert_eq!(
                    reason(&r),
                    Some(RejectionReason::CooldownExceedsDeadline),
                    "{mode:?}"
                );
                assert_eq!(mode.elapsed(&clock), Duration::ZERO);
            } else {
                assert_eq!(
                    r.unwrap(),
                    4,
                    "{mode:?}: a pause ending at the deadline fits"
                );
                assert_eq!(mode.elapsed(&clock), secs(2));
            }
        }
    }
}

#[test]
fn cooldown_bad_configuration_fails_build_naming_the_field() {
    assert_config(
        Pipeline::builder("case-cooldown-config")
            .cooldown(Cooldown::new().max_pause(Duration::ZERO))
            .build(),
        "cooldown",
        "max_pause",
    );
}

// -------------------------------------------------------------------- tower

#[cfg(feature = "tower")]
mod tower_adapter {
    use super::*;
    use seawall::tower::{PipelineLayer, ServiceError};
    use std::task::Context as TaskContext;
    use tower::{Layer, Service, ServiceExt};

    /// Readiness of the backend, shared by its clones.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Readiness {
        Ready,
        Pending,
        Broken,
    }

    /// A backend whose call `n` (1-based, counted over its clones) follows
    /// `plans[n - 1]` on the virtual clock.
    #[derive(Clone)]
    struct Backend {
        clock: VirtualClock,
        start: Duration,
        plans: Arc<Vec<Plan>>,
        calls: Arc<AtomicU32>,
        tracker: Arc<Tracker>,
        readiness: Arc<Mutex<Readiness>>,
    }

    impl Backend {
        fn new(clock: &VirtualClock, start: Duration, plans: &[Plan]) -> Self {
            Backend {
                clock: clock.clone(),
                start,
                plans: Arc::new(plans.to_vec()),
                calls: Arc::default(),
                tracker: Arc::default(),
                readiness: Arc::new(Mutex::new(Readiness::Ready)),
            }
        }
    }

    impl Service<u32> for Backend {
        type Response = u32;
        type Error = Boom;
        type Future = Pin<Box<dyn Future<Output = Result<u32, Boom>> + Send>>;

        fn poll_ready(&mut self, _: &mut TaskContext<'_>) -> Poll<Result<(), Boom>> {
            match *self.readiness.lock().unwrap() {
                Readiness::Ready => Poll::Ready(Ok(())),
                Readiness::Pending => Poll::Pending,
                Readiness::Broken => Poll::Ready(Err(Boom(0))),
            }
        }

        fn call(&mut self, _request: u32) -> Self::Future {
            let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            let plan = self
                .plans
                .get(n as usize - 1)
                .copied()
                .unwrap_or(Plan::Never);
            Box::pin(play(n, plan, &self.clock, self.start, &self.tracker))
        }
    }

    fn noop_poll_ready<S: Service<u32>>(s: &mut S) -> Poll<Result<(), S::Error>> {
        let mut cx = TaskContext::from_waker(std::task::Waker::noop());
        s.poll_ready(&mut cx)
    }

    /// One request (1) through a service of `layer` over `backend`.
    fn oneshot<L>(
        layer: &L,
        backend: &Backend,
    ) -> Result<<L::Service as Service<u32>>::Response, <L::Service as Service<u32>>::Error>
    where
        L: Layer<Backend>,
        L::Service: Service<u32>,
    {
        block_on(layer.layer(backend.clone()).oneshot(1))
    }

    #[test]
    fn poll_ready_is_the_inner_services() {
        for mode in modes() {
            let (b, clock, _) = mode.builder("case-tower-ready");
            let layer = PipelineLayer::new(b.timeout(secs(1))).unwrap();
            let backend = Backend::new(&clock, mode.start, &[]);
            let readiness = backend.readiness.clone();
            let mut svc = layer.layer(backend.clone());
            assert!(matches!(noop_poll_ready(&mut svc), Poll::Ready(Ok(()))));
            *readiness.lock().unwrap() = Readiness::Pending;
            assert!(noop_poll_ready(&mut svc).is_pending(), "{mode:?}");
            *readiness.lock().unwrap() = Readiness::Broken;
            match noop_poll_ready(&mut svc) {
                Poll::Ready(Err(ServiceError::NotReady(Boom(0)))) => {}
                other => panic!("{mode:?}: {other:?}"),
            }
            // With a fallback, the error is the inner service's own.
            let mut with_fallback = layer
                .clone()
                .fallback(|_e: ServiceError<Boom>| 0u32)
                .layer(backend.clone());
            match noop_poll_ready(&mut with_fallback) {
                Poll::Ready(Err(Boom(0))) => {}
                other => panic!("{mode:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn bulkhead_refuses_at_call_time_clones_share_it_and_a_dropped_future_frees_it() {
        for mode in modes() {
            let (b, clock, _) = mode.builder("case-tower-bulkhead");
            let layer = PipelineLayer::single_attempt(b.bulkhead(Bulkhead::new(1))).unwrap();
            let backend = Backend::new(&clock, mode.start, &[Plan::Never, Plan::Ok(ms(5), 3)]);
            let tracker = backend.tracker.clone();
            let mut s1 = layer.layer(backend.clone());
            let mut s2 = s1.clone();
            let mut s3 = layer.layer(backend.clone());
            block_on(async {
                s1.ready().await.unwrap();
                let f1 = pending(s1.call(1)).await;
                assert_eq!(layer.pipeline().in_flight().unwrap(), 1, "{mode:?}");
                // Documented: the bulkhead never holds poll_ready back.
                assert!(matches!(noop_poll_ready(&mut s2), Poll::Ready(Ok(()))));
                let e = s2.call(2).await.unwrap_err();
                assert!(e.is_rejected(), "{mode:?}: {e:?}");
                assert_eq!(e.rejection().unwrap().reason, RejectionReason::BulkheadFull);
                // Another service of the same layer shares the slot too.
                s3.ready().await.unwrap();
                let e = s3.call(2).await.unwrap_err();
                assert!(e.is_rejected(), "{mode:?}: {e:?}");
                // Dropping the response future cancels the call and frees the slot.
                drop(f1);
                assert_eq!(layer.pipeline().in_flight().unwrap(), 0, "{mode:?}");
                assert_eq!(s2.ready().await.unwrap().call(3).await.unwrap(), 3);
            });
            assert_eq!(tracker.dropped(), vec![(1, ms(0))], "{mode:?}");
            assert_eq!(backend.calls.load(Ordering::SeqCst), 2);
        }
    }

    #[test]
    fn errors_are_mapped_as_documented() {
        for mode in modes() {
            // No retry: the inner error in Error::Operation.
            let (b, clock, _) = mode.builder("case-tower-errors");
            let layer = PipelineLayer::new(b).unwrap();
            let backend = Backend::new(&clock, mode.start, &[Plan::Err(ms(1), 5)]);
            let e = oneshot(&layer, &backend).unwrap_err();
            assert!(
                matches!(e, ServiceError::Pipeline(Error::Operation(Boom(5)))),
                "{mode:?}: {e:?}"
            );
            assert_eq!(e.inner_error(), Some(&Boom(5)));

            // A retry: RetryExhausted with the last error.
            let retry = |b: PipelineBuilder| b.retry(Retry::constant(ms(10)).max_attempts(3));
            let (b, clock, _) = mode.builder("case-tower-retry");
            let layer = PipelineLayer::new(retry(b)).unwrap();
            let fails = [
                Plan::Err(ms(1), 1),
                Plan::Err(ms(1), 2),
                Plan::Err(ms(1), 3),
            ];
            let backend = Backend::new(&clock, mode.start, &fails);
            let e = oneshot(&layer, &backend).unwrap_err();
            match &e {
                ServiceError::Pipeline(Error::RetryExhausted { attempts: 3, last }) => {
                    assert_eq!(last, &Boom(3))
                }
                other => panic!("{mode:?}: {other:?}"),
            }
            assert_eq!(backend.calls.load(Ordering::SeqCst), 3);
            assert_eq!(mode.elapsed(&clock), ms(23));

            // An error classified `abort` is not retried.
            let (b, clock, _) = mode.builder("case-tower-abort");
            let layer = PipelineLayer::new(retry(b))
                .unwrap()
                .classify_error(|_: &Boom| Verdict::abort());
            let backend = Backend::new(&clock, mode.start, &fails);
            let e = oneshot(&layer, &backend).unwrap_err();
            assert!(
                matches!(e, ServiceError::Pipeline(Error::Operation(Boom(1)))),
                "{mode:?}: {e:?}"
            );
            assert_eq!(backend.calls.load(Ordering::SeqCst), 1);
        }
    }

    #[test]
    fn timeout_cancels_the_inner_future_at_the_deadline() {
        for mode in modes() {
            let (b, clock, events) = mode.builder("case-tower-timeout");
            let layer = PipelineLayer::new(b.timeout(ms(100))).unwrap();
            let backend = Backend::new(&clock, mode.start, &[Plan::Never]);
            let e = oneshot(&layer, &backend).unwrap_err();
            assert!(e.is_timeout(), "{mode:?}: {e:?}");
            assert!(e.inner_error().is_none());
            assert_eq!(mode.elapsed(&clock), ms(100));
            assert_eq!(backend.tracker.dropped(), vec![(1, ms(100))], "{mode:?}");
            if mode.listen {
                assert_eq!(call_outcomes(&events), vec![CallOutcome::Timeout]);
            }

            // With a fallback closure: the failed call gets its response.
            let (b, clock, _) = mode.builder("case-tower-timeout-fallback");
            let layer = PipelineLayer::new(b.timeout(ms(100)))
                .unwrap()
                .fallback(|e: ServiceError<Boom>| if e.is_timeout() { 504 } else { 500 });
            let backend = Backend::new(&clock, mode.start, &[Plan::Never]);
            let answer: Result<u32, Boom> = oneshot(&layer, &backend);
            assert_eq!(answer.unwrap(), 504, "{mode:?}");
        }
    }

    #[test]
    fn hedging_through_the_layer_first_answer_wins() {
        for mode in modes() {
            let (b, clock, _) = mode.builder("case-tower-hedge");
            let layer = PipelineLayer::new(b.hedging(Hedging::latency(ms(50)))).unwrap();
            let backend = Backend::new(&clock, mode.start, &[Plan::Never, Plan::Ok(ms(10), 2)]);
            let answer = oneshot(&layer, &backend).unwrap();
            assert_eq!(answer, 2, "{mode:?}");
            assert_eq!(mode.elapsed(&clock), ms(60));
            assert_eq!(
                backend.tracker.started(),
                vec![(1, ms(0)), (2, ms(50))],
                "{mode:?}"
            );
            assert_eq!(backend.tracker.dropped(), vec![(1, ms(60))], "{mode:?}");
        }
    }

    #[test]
    fn single_attempt_and_bad_configuration_fail_at_construction() {
        let b = || Pipeline::builder("case-tower-config");
        assert_config(
            PipelineLayer::single_attempt(b().retry(Retry::constant(ms(1)).max_attempts(2))),
            "pipeline",
            "retry",
        );
        assert_config(
            PipelineLayer::single_attempt(b().hedging(Hedging::parallel())),
            "pipeline",
            "hedging",
        );
        assert!(
            PipelineLayer::single_attempt(b().retry(Retry::constant(ms(1)).max_attempts(1)))
                .is_ok()
        );
        assert_config(
            PipelineLayer::new(b().timeout(Duration::ZERO)),
            "timeout",
            "duration",
        );
        assert_config(
            PipelineLayer::new(b().bulkhead(Bulkhead::new(0))),
            "bulkhead",
            "max_concurrent",
        );
    }
}

// ---------------------------------------------------------- never a panic

#[test]
fn bad_configuration_never_panics() {
    let builders: Vec<Box<dyn Fn() -> Result<Pipeline, ConfigError>>> = vec![
        Box::new(|| Pipeline::builder("").build()),
        Box::new(|| Pipeline::builder("a#b").build()),
        Box::new(|| Pipeline::builder("x").timeout(Duration::ZERO).build()),
        Box::new(|| Pipeline::builder("x").bulkhead(Bulkhead::new(0)).build()),
        Box::new(|| {
            Pipeline::builder("x")
                .timeout(Duration::MAX)
                .bulkhead(Bulkhead::new(1))
                .build()
        }),
        Box::new(|| {
            Pipeline::builder("x")
                .hedging(Hedging::latency(Duration::MAX).max_hedged_attempts(u32::MAX))
                .build()
        }),
        Box::new(|| {
            Pipeline::builder("x")
                .cooldown(Cooldown::new().max_pause(Duration::ZERO))
                .build()
        }),
        Box::new(|| {
            Pipeline::builder("x")
                .bulkhead(Bulkhead::new(1).queue(u32::MAX, Duration::ZERO))
                .build()
        }),
    ];
    for (i, build) in builders.iter().enumerate() {
        let r = catch_unwind(AssertUnwindSafe(build));
        match r {
            Ok(Err(_)) => {}
            Ok(Ok(_)) => panic!("case {i}: built"),
            Err(_) => panic!("case {i}: build() panicked"),
        }
    }
}

// ------------------------------------------------------- further probing

#[test]
fn timeout_sync_strict_per_attempt_is_retried_lenient_is_kept() {
    for mode in modes() {
        for strict in [false, true] {
            let t = if strict {
                Timeout::strict(ms(100))
            } else {
                Timeout::new(ms(100))
            };
            let (p, clock, _) = mode.build("case-timeout-sync-retry", |b| {
                b.retry(Retry::constant(ms(10)).max_attempts(2)).timeout(t)
            });
            let r = p.call(|ctx| {
                if ctx.attempt() == 1 {
                    clock.advance(ms(150));
                }
                Ok::<u32, Boom>(ctx.attempt())
            });
            let expected = if strict { 2 } else { 1 };
            assert_eq!(r.unwrap(), expected, "{mode:?} strict={strict}");
        }
    }
}

#[test]
fn timeout_error_and_rejection_messages_name_the_resource() {
    let clock = VirtualClock::starting_at(FAR);
    let p = Pipeline::builder("case-messages")
        .store(MemoryStore::new())
        .clock(clock.clone())
        .timeout(ms(100))
        .bulkhead(Bulkhead::new(1))
        .build()
        .unwrap();
    let (r, _) = run_plans(&p, &clock, FAR, &[Plan::Never]);
    assert_eq!(
        r.unwrap_err().to_string(),
        "case-messages: call timed out after 100ms (1 attempt)"
    );
    let (outer, inner) = call_within(&p, (0, 1), || {});
    outer.unwrap();
    assert_eq!(
        inner.unwrap_err().to_string(),
        "case-messages: call rejected: bulkhead_full"
    );
}

#[test]
fn bulkhead_partitions_have_their_own_slots() {
    for mode in modes() {
        let (p, clock, _) =
            mode.build("case-bulkhead-partitions", |b| b.bulkhead(Bulkhead::new(1)));
        block_on(async {
            let a = p.partition("a");
            let f = pending(a.run(hold(&clock, ms(100), 1))).await;
            assert_eq!(p.partition("a").in_flight().unwrap(), 1);
            assert_eq!(p.partition("b").in_flight().unwrap(), 0);
            assert_eq!(p.partition("b").call(|_| Ok::<u32, Boom>(2)).unwrap(), 2);
            let r = p.partition("a").call(|_| Ok::<u32, Boom>(3));
            assert_eq!(reason(&r), Some(RejectionReason::BulkheadFull), "{mode:?}");
            // The unpartitioned slots are apart too.
            assert_eq!(p.call(|_| Ok::<u32, Boom>(4)).unwrap(), 4);
            assert_eq!(f.await.unwrap(), 1);
        });
    }
}

#[test]
fn bulkhead_shadow_mode_counts_and_reports_but_never_refuses() {
    for mode in modes() {
        let (p, _clock, events) = mode.build("case-bulkhead-shadow", |b| {
            b.bulkhead(Bulkhead::new(1).shadow(true))
        });
        let (outer, inner) = call_within(&p, (1, 2), || {
            assert_eq!(p.in_flight().unwrap(), 1, "the shadowed call holds no slot")
        });
        outer.unwrap();
        assert_eq!(inner.unwrap(), 2, "{mode:?}");
        assert_eq!(p.in_flight().unwrap(), 0);
        if mode.listen {
            assert_eq!(
                count(&events, |e| matches!(
                    e,
                    EventKind::ShadowRejected {
                        reason: RejectionReason::BulkheadFull,
                        ..
                    }
                )),
                1
            );
            assert_eq!(
                count(&events, |e| matches!(e, EventKind::Rejected { .. })),
                0
            );
        }
    }
}

#[test]
fn bulkhead_dropped_waiter_leaves_the_queue_and_the_next_gets_the_slot() {
    for mode in modes() {
        let (p, clock, events) = mode.build("case-bulkhead-drop-waiter", |b| {
            b.bulkhead(Bulkhead::new(1).queue(2, ms(500)))
        });
        let (r3, at) = block_on(async {
            let f1 = pending(p.run(hold(&clock, ms(30), 1))).await;
            let f2 = pending(p.run(hold(&clock, ms(5), 2))).await;
            let f3 = pending(async {
                let r = p.run(hold(&clock, Duration::ZERO, 3)).await;
                (r, mode.elapsed(&clock))
            })
            .await;
            drop(f2);
            let (r1, w) = tokio::join!(f1, f3);
            assert_eq!(r1.unwrap(), 1);
            w
        });
        assert_eq!(r3.unwrap(), 3, "{mode:?}");
        assert_eq!(at, ms(30), "{mode:?}: handed the slot when it was freed");
        assert_eq!(p.in_flight().unwrap(), 0);
        if mode.listen {
            let waits = picked(&events, |e| match e {
                EventKind::Deferred { wait, .. } => Some(*wait),
                _ => None,
            });
            assert_eq!(waits, vec![ms(500), ms(500)], "{mode:?}");
        }
    }
}

#[test]
fn bulkhead_queue_deferred_wait_is_short_of_the_deadline_and_huge_waits_do_not_overflow() {
    for mode in modes() {
        // The Deferred event says the most it may wait: max_wait short of
        // the call's deadline.
        let (p, clock, events) = mode.build("case-bulkhead-deferred", |b| {
            b.timeout(ms(30))
                .bulkhead(Bulkhead::new(1).queue(1, ms(50)))
        });
        let r = block_on(async {
            let f1 = pending(p.run(hold(&clock, ms(20), 1))).await;
            let f2 = pending(p.run(hold(&clock, Duration::ZERO, 2))).await;
            let (r2, r1) = tokio::join!(f2, f1);
            assert_eq!(r1.unwrap(), 1);
            r2
        });
        assert_eq!(r.unwrap(), 2, "{mode:?}");
        if mode.listen {
            assert!(
                count(
                    &events,
                    |e| matches!(e, EventKind::Deferred { wait, .. } if *wait == ms(30))
                ) == 1,
                "{mode:?}: {:?}",
                events.lock().unwrap()
            );
        }

        // A max_wait of Duration::MAX.
        let (p, clock, _) = mode.build("case-bulkhead-huge-wait", |b| {
            b.bulkhead(Bulkhead::new(1).queue(1, Duration::MAX))
        });
        let (r, at) = queue_behind(
            &clock,
            mode.start,
            (&p, ms(100)),
            (&p, Duration::ZERO),
            || {},
        );
        assert_eq!(r.unwrap(), 2, "{mode:?}");
        assert_eq!(at, ms(100));
    }
}

#[test]
fn hedging_bulkhead_before_it_holds_one_slot_for_all_attempts() {
    for mode in modes() {
        let (p, clock, _) = mode.build("case-hedge-bulkhead-before", |b| {
            b.bulkhead(Bulkhead::new(1))
                .hedging(Hedging::latency(ms(10)).max_hedged_attempts(2))
        });
        let t = Arc::new(Tracker::default());
        let seen: Arc<Mutex<Vec<u32>>> = Arc::default();
        let s = seen.clone();
        let pp = p.clone();
        let r = block_on(p.run(|ctx: Context| {
            s.lock().unwrap().push(pp.in_flight().unwrap());
            let n = ctx.attempt();
            let plan = if n == 3 {
                Plan::Ok(ms(5), 3)
            } else {
                Plan::Never
            };
            play(n, plan, &clock, mode.start, &t)
        }));
        assert_eq!(r.unwrap(), 3, "{mode:?}");
        assert_eq!(*seen.lock().unwrap(), vec![1, 1, 1], "{mode:?}");
        assert_eq!(t.started(), vec![(1, ms(0)), (2, ms(10)), (3, ms(20))]);
        assert_eq!(p.in_flight().unwrap(), 0);
    }
}

#[test]
fn hedging_each_attempt_has_its_own_deadline_and_the_last_to_end_decides() {
    for mode in modes() {
        // Overall 120 ms before hedging, 100 ms per attempt after it.
        let (p, clock, _) = mode.build("case-hedge-deadlines", |b| {
            b.timeout(ms(120))
                .hedging(Hedging::latency(ms(50)))
                .timeout(ms(100))
        });
        // (attempt, its deadline from the start)
        type Seen = Vec<(u32, Option<Duration>)>;
        let deadlines: Arc<Mutex<Seen>> = Arc::default();
        let d = deadlines.clone();
        let t = Arc::new(Tracker::default());
        let start = mode.start;
        let r = block_on(p.run(|ctx: Context| {
            d.lock()
                .unwrap()
                .push((ctx.attempt(), ctx.deadline().map(|x| x - start)));
            play(ctx.attempt(), Plan::Never, &clock, start, &t)
        }));
        assert_eq!(
            *deadlines.lock().unwrap(),
            vec![(1, Some(ms(100))), (2, Some(ms(120)))],
            "{mode:?}"
        );
        assert_eq!(timeout_of(r, mode).scope, TimeoutScope::Overall, "{mode:?}");
        assert_eq!(mode.elapsed(&clock), ms(120));

        // Every attempt failed: the one that ended last decides; here a
        // timed-out hedge after a failed original.
        let (p, clock, _) = mode.build("case-hedge-last-timeout", |b| {
            b.hedging(Hedging::latency(ms(50))).timeout(ms(100))
        });
        let (r, _) = mode.run(&p, &clock, &[Plan::Err(ms(90), 1), Plan::Never]);
        let e = timeout_of(r, mode);
        assert_eq!(
            (e.scope, e.after),
            (TimeoutScope::Attempt, ms(100)),
            "{mode:?}"
        );
        assert_eq!(mode.elapsed(&clock), ms(150));
    }
}

#[test]
fn hedging_dynamic_delay_of_duration_max_hedges_only_on_failure() {
    for mode in modes() {
        let (p, clock, events) = mode.build("case-hedge-dynamic-max", |b| {
            b.hedging(Hedging::dynamic(|_| {
                seawall::hedge::HedgeDelay::After(Duration::MAX)
            }))
        });
        let (r, t) = mode.run(&p, &clock, &[Plan::Ok(secs(3600), 1)]);
        assert_eq!(r.unwrap(), 1, "{mode:?}");
        assert_eq!(t.started(), vec![(1, ms(0))]);
        let (r, t) = run_plans(
            &p,
            &clock,
            clock.now(),
            &[Plan::Err(ms(10), 1), Plan::Ok(ms(10), 2)],
        );
        assert_eq!(r.unwrap(), 2, "{mode:?}");
        assert_eq!(t.started(), vec![(1, ms(0)), (2, ms(10))], "{mode:?}");
        if mode.listen {
            assert_eq!(hedges(&events), vec![(2, HedgeTrigger::Failure)]);
        }
    }
}

#[test]
fn hedging_budget_stops_hedges_and_the_call_goes_on() {
    for mode in modes() {
        let (p, clock, events) = mode.build("case-hedge-budget", |b| {
            b.hedging(Hedging::latency(ms(10)).budget(RetryBudget::new(0.001, 1)))
        });
        let plans = [Plan::Ok(ms(50), 1), Plan::Ok(ms(10), 2)];
        let (r, _) = run_plans(&p, &clock, clock.now(), &plans);
        assert_eq!(r.unwrap(), 2, "{mode:?}: the full bucket pays one hedge");
        let (r, t) = run_plans(&p, &clock, clock.now(), &plans);
        assert_eq!(r.unwrap(), 1, "{mode:?}: no token, no hedge");
        assert_eq!(t.started(), vec![(1, ms(0))], "{mode:?}");
        if mode.listen {
            assert_eq!(
                count(&events, |e| matches!(
                    e,
                    EventKind::HedgeBudgetExhausted { attempt: 2 }
                )),
                1,
                "{mode:?}"
            );
        }
    }
}

#[test]
fn timeout_async_result_that_ran_past_the_deadline_inside_a_poll_is_late() {
    for mode in modes() {
        for inside in [false, true] {
            let (p, clock, _) = mode.build("case-timeout-blocking", |b| b.timeout(ms(100)));
            let r = block_on(p.run(|_| {
                let c = clock.clone();
                if !inside {
                    c.advance(ms(150));
                }
                async move {
                    if inside {
                        c.advance(ms(150));
                    }
                    Ok::<u32, Boom>(1)
                }
            }));
            assert!(
                matches!(r, Err(Error::Timeout(_))),
                "{mode:?} inside={inside}: a late async result is a timeout, got {r:?}"
            );
        }
    }
}

#[test]
fn timeout_per_attempt_covers_the_wait_in_the_bulkhead_queue() {
    for mode in modes() {
        let (p, clock, _) = mode.build("case-timeout-queue", |b| {
            b.retry(Retry::constant(ms(1)).max_attempts(1))
                .bulkhead(Bulkhead::new(1).queue(1, ms(500)))
                .timeout(ms(100))
        });
        let (r, at) = queue_behind(&clock, mode.start, (&p, ms(60)), (&p, ms(50)), || {});
        assert_eq!(timeout_of(r, mode).scope, TimeoutScope::Attempt, "{mode:?}");
        assert_eq!(
            at,
            ms(100),
            "{mode:?}: the deadline counts from the attempt's start"
        );
        assert_eq!(p.in_flight().unwrap(), 0);
    }
}

#[test]
fn hedging_a_panicking_attempt_gives_its_slots_back() {
    for mode in modes() {
        let (p, clock, _) = mode.build("case-hedge-panic", |b| {
            b.hedging(Hedging::latency(ms(10)))
                .bulkhead(Bulkhead::new(2))
        });
        let r = catch_unwind(AssertUnwindSafe(|| {
            block_on(p.run(|ctx: Context| {
                let c = clock.clone();
                async move {
                    if ctx.attempt() == 2 {
                        panic!("intentional panic in a hedge");
                    }
                    Clock::sleep(&c, ms(100)).await;
                    Ok::<u32, Boom>(1)
                }
            }))
        }));
        assert!(r.is_err());
        assert_eq!(p.in_flight().unwrap(), 0, "{mode:?}");
    }
}

#[cfg(all(feature = "tower", feature = "http"))]
mod tower_http {
    use super::*;
    use seawall::tower::PipelineLayer;
    use tower::{Layer, Service, ServiceExt};

    type Req = http::Request<String>;
    type Resp = http::Response<String>;

    #[derive(Clone)]
    struct Slow {
        clock: VirtualClock,
        delay: Duration,
    }

    impl Service<Req> for Slow {
        type Response = Resp;
        type Error = std::convert::Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Resp, Self::Error>> + Send>>;
        fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: Req) -> Self::Future {
            let (clock, delay) = (self.clock.clone(), self.delay);
            Box::pin(async move {
                Clock::sleep(&clock, delay).await;
                Ok(http::Response::new(String::from("ok")))
            })
        }
    }

    fn tenant(t: &str) -> Req {
        http::Request::builder()
            .header("x-tenant", t)
            .body(String::new())
            .unwrap()
    }

    #[test]
    fn load_shedding_per_tenant_answers_503_and_timeouts_504() {
        for mode in modes() {
            let (b, clock, _) = mode.builder("case-tower-shed");
            let layer = PipelineLayer::single_attempt(b.bulkhead(Bulkhead::new(1)))
                .unwrap()
                .partition_by(|r: &Req| {
                    r.headers()
                        .get("x-tenant")?
                        .to_str()
                        .ok()
                        .map(str::to_owned)
                })
                .error_responses();
            let svc = layer.layer(Slow {
                clock: clock.clone(),
                delay: ms(100),
            });
            block_on(async {
                let held = pending(svc.clone().oneshot(tenant("acme"))).await;
                let shed = svc.clone().oneshot(tenant("acme")).await.unwrap();
                assert_eq!(shed.status(), 503, "{mode:?}");
                assert_eq!(shed.headers()["retry-after"], "1");
                let mut other = Box::pin(svc.clone().oneshot(tenant("globex")));
                assert!(poll_once(other.as_mut()).await.is_pending(), "{mode:?}");
                let (a, b) = tokio::join!(held, other);
                assert_eq!(a.unwrap().status(), 200);
                assert_eq!(b.unwrap().status(), 200);
            });

            let (b, clock, _) = mode.builder("case-tower-504");
            let layer = PipelineLayer::single_attempt(b.timeout(ms(50)))
                .unwrap()
                .error_responses();
            let mut svc = layer.layer(Slow {
                clock: clock.clone(),
                delay: ms(100),
            });
            let answer = block_on(async {
                svc.ready().await.unwrap();
                svc.call(tenant("acme")).await
            })
            .unwrap();
            assert_eq!(answer.status(), 504, "{mode:?}");
            assert_eq!(mode.elapsed(&clock), ms(50));
        }
    }
}

#[test]
fn timeout_per_attempt_covers_the_wait_for_a_cooldown_or_a_rate_limit_permit() {
    for mode in modes() {
        for sync in [true, false] {
            for policy in ["cooldown", "rate_limiter"] {
                let (b, clock, _) = mode.builder("case-timeout-admission-wait");
                let b = b.retry(Retry::constant(ms(1)).max_attempts(1));
                let (p, timeout) = if policy == "cooldown" {
                    // A pause of 500 ms, opened by the first call.
                    let p = b
                        .cooldown(Cooldown::new())
                        .timeout(Timeout::strict(secs(1)))
                        .classify(|_: &Boom| Verdict::throttled().with_retry_after(ms(500)))
                        .build()
                        .unwrap();
                    assert!(p.call(|_| Err::<u32, _>(Boom(1))).is_err());
                    (p, secs(1))
                } else {
                    // The next permit in 1 s.
                    let p = b
                        .rate_limiter(
                            seawall::RateLimiter::fixed_window(1, secs(1)).max_wait(secs(5)),
                        )
                        .timeout(Timeout::strict(ms(1500)))
                        .classify(|_: &Boom| Verdict::retry())
                        .build()
                        .unwrap();
                    assert_eq!(p.call(|_| Ok::<u32, Boom>(1)).unwrap(), 1);
                    (p, ms(1500))
                };
                let t0 = clock.now();
                let seen = Arc::new(Mutex::new(None));
                let s = seen.clone();
                let c = clock.clone();
                let r = if sync {
                    p.call(|ctx| {
                        *s.lock().unwrap() = ctx.deadline();
                        c.advance(ms(800));
                        Ok::<u32, Boom>(2)
                    })
                } else {
                    block_on(p.run(|ctx: Context| {
                        *s.lock().unwrap() = ctx.deadline();
                        hold(&c, ms(800), 2)(ctx)
                    }))
                };
                let label = format!("{mode:?} sync={sync} {policy}");
                // The attempt's deadline runs from its start, before the
                // admission's wait (builder.rs, `timeout`).
                assert_eq!(*seen.lock().unwrap(), Some(t0 + timeout), "{label}");
                assert!(matches!(r, Err(Error::Timeout(_))), "{label}: {r:?}");
            }
        }
    }
}
