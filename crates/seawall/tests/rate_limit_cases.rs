//! The rate limiter against what a user of `governor` (GCRA
//! rate limiting) expects, restated on seawall's public API and documented
//! semantics: the burst, one permit per emission interval, a long pause
//! never giving more than the burst, a weight above the burst refused (an
//! error, not a wait), waiting for a permit (`max_wait`, seawall's
//! `until_ready`), keyed limiting (partitions), thread safety, clocks at 0
//! and far from 0, fixed and sliding windows, and bad configuration
//! refused by `build()`.
//!
//! Every behavioural case runs sync (`call`) and async (`run`), with and
//! without an event listener, on a virtual clock starting at 0 and at
//! 10^9 s. The system clock is used only where the real clock matters.

mod support;

use std::future::{Future, Ready};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use seawall::testing::VirtualClock;
use seawall::{
    Context, Error, Event, EventKind, MemoryStore, Pipeline, PipelineBuilder, RateLimiter,
    Rejection, RejectionReason, Retry,
};
use support::{exec, ms, recorder, rt, secs, unique, Boom, Flavor, Log, FLAVORS};

// ---------------------------------------------------------------- helpers

/// Far from 0 is 10^9 s here, not `support::FAR` (10^6 s):
/// `fixed_windows_align_on_multiples_of_an_odd_period` counts on it.
const FAR: Duration = Duration::from_secs(1_000_000_000);
const STARTS: [Duration; 2] = [Duration::ZERO, FAR];

/// One call through `handle` (a partition or a weighted handle, which
/// `support::exec` does not take), sync or async, as `exec` makes it.
macro_rules! exec_on {
    ($handle:expr, $flavor:expr, $op:expr) => {{
        #[allow(unused_mut)]
        let mut op = $op;
        match $flavor {
            Flavor::Sync => $handle.call(op),
            Flavor::Async => rt().block_on($handle.run(|ctx| {
                let r = op(ctx);
                async move { r }
            })),
        }
    }};
}

/// A pipeline on its own store and virtual clock, with its event log when
/// a listener is registered.
struct Rig {
    p: Pipeline,
    clock: VirtualClock,
    start: Duration,
    log: Option<Log>,
}

impl Rig {
    fn new(limiter: RateLimiter, start: Duration, listen: bool) -> Rig {
        Rig::with(|b| b.rate_limiter(limiter), start, listen)
    }

    fn with(
        f: impl FnOnce(PipelineBuilder) -> PipelineBuilder,
        start: Duration,
        listen: bool,
    ) -> Rig {
        let clock = VirtualClock::starting_at(start);
        let mut b = Pipeline::builder(unique("rl"))
            .store(MemoryStore::new())
            .clock(clock.clone());
        let mut log = None;
        if listen {
            let (l, on_event) = recorder();
            b = b.on_event(on_event);
            log = Some(l);
        }
        let p = f(b).build().expect("valid configuration");
        Rig {
            p,
            clock,
            start,
            log,
        }
    }

    /// Time since the start of the clock.
    fn elapsed(&self) -> Duration {
        self.clock.now() - self.start
    }

    fn advance(&self, d: Duration) {
        self.clock.advance(d);
    }

    /// The operation of these tests: the instant (since the start) it ran at.
    fn stamp(&self) -> impl Fn(Context) -> Result<Duration, Boom> + Copy + '_ {
        move |_ctx| Ok(self.clock.now() - self.start)
    }

    /// `stamp` as an async operation.
    fn stamp_async(&self) -> impl Fn(Context) -> Ready<Result<Duration, Boom>> + Copy + '_ {
        move |ctx| std::future::ready(self.stamp()(ctx))
    }

    /// One call: the instant (since the start) the operation ran at, or the
    /// rate limiter's refusal. `key`: a partition; `weight`: through
    /// `weighted`.
    fn go(
        &self,
        flavor: Flavor,
        key: Option<&'static str>,
        weight: Option<u32>,
    ) -> Result<Duration, Rejection> {
        let op = self.stamp();
        let r = match (key, weight) {
            (None, None) => exec(&self.p, flavor, op),
            (None, Some(w)) => exec_on!(self.p.weighted(w).unwrap(), flavor, op),
            (Some(k), None) => exec_on!(self.p.partition(k), flavor, op),
            (Some(k), Some(w)) => exec_on!(self.p.partition(k).weighted(w).unwrap(), flavor, op),
        };
        ran_or_refused(r, "unexpected error")
    }

    fn call(&self, flavor: Flavor) -> Result<Duration, Rejection> {
        self.go(flavor, None, None)
    }

    /// `n` concurrent async calls, polled in turn on one thread.
    fn waiters(&self, n: usize) -> Vec<Result<Duration, Error<Boom>>> {
        let futs: Vec<_> = (0..n).map(|_| self.p.run(self.stamp_async())).collect();
        rt().block_on(join_all(futs))
    }

    /// The recorded events `pred` picks.
    fn events(&self, pred: impl Fn(&EventKind) -> bool) -> Vec<EventKind> {
        self.log
            .as_ref()
            .map(|l| {
                l.lock()
                    .unwrap()
                    .iter()
                    .filter(|e| pred(e))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The recorded refusals by the rate limiter in shadow mode.
    fn limiter_shadow_refusals(&self) -> Vec<EventKind> {
        self.events(|e| {
            matches!(
                e,
                EventKind::ShadowRejected {
                    reason: RejectionReason::RateLimited,
                    ..
                }
            )
        })
    }
}

/// Every combination of flavor, listener and clock start, described.
fn cases() -> Vec<(Flavor, bool, Duration, String)> {
    let mut v = Vec::new();
    for flavor in FLAVORS {
        for listen in [false, true] {
            for start in STARTS {
                let what = format!("{flavor:?} listen={listen} start={start:?}");
                v.push((flavor, listen, start, what));
            }
        }
    }
    v
}

/// Every combination of listener and clock start (for the cases that are
/// async only), described.
fn listen_starts() -> Vec<(bool, Duration, String)> {
    let mut v = Vec::new();
    for listen in [false, true] {
        for start in STARTS {
            v.push((listen, start, format!("listen={listen} start={start:?}")));
        }
    }
    v
}

/// `limit` per `period` under each algorithm: GCRA, fixed and sliding
/// window.
fn each_algorithm(limit: u32, period: Duration) -> [RateLimiter; 3] {
    [
        RateLimiter::gcra(limit, period),
        RateLimiter::fixed_window(limit, period),
        RateLimiter::sliding_window(limit, period),
    ]
}

/// Three attempts, back to back.
fn three_attempts() -> Retry {
    Retry::constant(Duration::ZERO).max_attempts(3)
}

/// An operation that fails twice, then succeeds; `tries` counts its runs.
fn failing_twice(tries: &AtomicU64) -> impl Fn(Context) -> Result<(), Boom> + '_ {
    move |_ctx| {
        if tries.fetch_add(1, Ordering::Relaxed) < 2 {
            Err(Boom(0))
        } else {
            Ok(())
        }
    }
}

/// One call of an operation that succeeds at once.
fn call_ok(p: &Pipeline, flavor: Flavor) -> Result<(), Error<Boom>> {
    exec(p, flavor, |_| Ok(()))
}

/// The instant a call ran at, or its refusal; panics on any other error.
#[track_caller]
fn ran_or_refused(r: Result<Duration, Error<Boom>>, what: &str) -> Result<Duration, Rejection> {
    match r {
        Ok(t) => Ok(t),
        Err(Error::Rejected(rej)) => Err(rej),
        Err(other) => panic!("{what}: {other:?}"),
    }
}

/// Asserts a refusal by the rate limiter with `retry_after`.
#[track_caller]
fn refused(r: Result<Duration, Rejection>, retry_after: Option<Duration>, what: &str) {
    match r {
        Err(rej) => {
            assert_eq!(rej.reason, RejectionReason::RateLimited, "{what}");
            assert_eq!(rej.retry_after, retry_after, "{what}");
        }
        Ok(t) => panic!("{what}: admitted at {t:?}, expected a refusal"),
    }
}

/// Asserts an admission, at `at` since the clock's start.
#[track_caller]
fn admitted(r: Result<Duration, Rejection>, at: Duration, what: &str) {
    match r {
        Ok(t) => assert_eq!(t, at, "{what}: ran at the wrong time"),
        Err(rej) => panic!("{what}: refused {rej:?}, expected an admission at {at:?}"),
    }
}

/// Asserts `n` plain calls in a row admitted, all at `at`.
#[track_caller]
fn admitted_n(r: &Rig, flavor: Flavor, n: u32, at: Duration, what: &str) {
    for _ in 0..n {
        admitted(r.call(flavor), at, what);
    }
}

/// Asserts `n` plain calls in a row admitted, whenever they ran.
#[track_caller]
fn all_ok(r: &Rig, flavor: Flavor, n: u32, what: &str) {
    for _ in 0..n {
        assert!(r.call(flavor).is_ok(), "{what}");
    }
}

/// Asserts a plain call refused while the next permit is `due`, and again
/// one `step` before it; then moves the clock to it.
#[track_caller]
fn count_down(r: &Rig, flavor: Flavor, due: Duration, step: Duration, what: &str) {
    refused(r.call(flavor), Some(due), what);
    r.advance(due - step);
    refused(r.call(flavor), Some(step), what);
    r.advance(step);
}

/// Polls `fut` once and asserts that it waits.
async fn assert_pending<F: Future>(fut: &mut Pin<Box<F>>, what: &str) {
    std::future::poll_fn(|cx| {
        assert!(fut.as_mut().poll(cx).is_pending(), "{what}");
        Poll::Ready(())
    })
    .await
}

/// For the waiter cases: `policy` (declared first, `|b| b` for none), then
/// `limiter` with a `max_wait` of 5 s, its permit taken by an async call
/// admitted at once.
#[track_caller]
fn permit_taken(
    policy: impl FnOnce(PipelineBuilder) -> PipelineBuilder,
    limiter: RateLimiter,
    start: Duration,
    listen: bool,
    what: &str,
) -> Rig {
    let r = Rig::with(
        |b| policy(b).rate_limiter(limiter.max_wait(secs(5))),
        start,
        listen,
    );
    admitted(r.call(Flavor::Async), Duration::ZERO, what);
    r
}

/// One async call, polled once (it waits for its permit: asserted), then
/// `meanwhile`, then awaited.
fn wait_then(r: &Rig, what: &str, meanwhile: impl FnOnce()) -> Result<Duration, Error<Boom>> {
    rt().block_on(async {
        let mut fut = Box::pin(r.p.run(r.stamp_async()));
        assert_pending(&mut fut, what).await;
        meanwhile();
        fut.await
    })
}

/// Polls every future in turn, in index order, until all are ready.
async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(move |cx| {
        let mut pending = false;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *o = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(out.iter_mut().map(|o| o.take().unwrap()).collect())
        }
    })
    .await
}

// ------------------------------------------------------------------ GCRA

/// governor `accepts_first_cell` / burst capacity: `gcra(5, 1 s)` admits 5
/// at once (burst defaults to the limit), then one per 200 ms, and tells
/// exactly when the next is due.
#[test]
fn gcra_admits_its_burst_then_one_per_interval() {
    for (flavor, listen, start, what) in cases() {
        let r = Rig::new(RateLimiter::gcra(5, secs(1)), start, listen);
        admitted_n(&r, flavor, 5, Duration::ZERO, &what);
        count_down(&r, flavor, ms(200), ms(1), &what);
        admitted(r.call(flavor), ms(200), &what);
        refused(r.call(flavor), Some(ms(200)), &what);
        if listen {
            let rejected = r.events(|e| {
                matches!(
                    e,
                    EventKind::Rejected {
                        reason: RejectionReason::RateLimited,
                        ..
                    }
                )
            });
            assert_eq!(rejected.len(), 3, "{what}: {rejected:?}");
            assert_eq!(
                rejected[0],
                EventKind::Rejected {
                    reason: RejectionReason::RateLimited,
                    retry_after: Some(ms(200))
                },
                "{what}"
            );
        }
    }
}

/// governor `rejects_too_many`: 2 per second, calls 1 ms apart.
#[test]
fn gcra_rejects_too_many_calls_one_ms_apart() {
    for (flavor, listen, start, what) in cases() {
        let r = Rig::new(RateLimiter::gcra(2, secs(1)), start, listen);
        admitted(r.call(flavor), ms(0), &what);
        r.advance(ms(1));
        admitted(r.call(flavor), ms(1), &what);
        r.advance(ms(1));
        // TAT = 1000 ms, tolerance 500 ms: due at 500 ms.
        refused(r.call(flavor), Some(ms(498)), &what);
        r.advance(ms(1000));
        admitted(r.call(flavor), ms(1002), &what);
        r.advance(ms(1));
        admitted(r.call(flavor), ms(1003), &what);
        r.advance(ms(1));
        refused(r.call(flavor), Some(ms(498)), &what);
    }
}

/// governor issues #107 / #249: a pause much longer than needed brings the
/// burst back, never one more.
#[test]
fn gcra_never_allows_an_extra_permit_after_a_long_pause() {
    for (flavor, listen, start, what) in cases() {
        let r = Rig::new(RateLimiter::gcra(5, secs(1)), start, listen);
        all_ok(&r, flavor, 5, &what);
        assert!(r.call(flavor).is_err(), "{what}");
        for pause in [secs(2), secs(3600), secs(10_000_000)] {
            r.advance(pause);
            all_ok(&r, flavor, 5, &format!("{what} after {pause:?}"));
            refused(
                r.call(flavor),
                Some(ms(200)),
                &format!("{what} after {pause:?}"),
            );
        }
    }
}

/// governor `correct_wait_time`: a caller that waits the `retry_after` it
/// was told is admitted then.
#[test]
fn gcra_retry_after_is_exactly_when_the_next_permit_is_due() {
    for (flavor, listen, start, what) in cases() {
        let r = Rig::new(RateLimiter::gcra(5, secs(1)), start, listen);
        let mut conforming = 0;
        for _ in 0..20 {
            r.advance(ms(1));
            match r.call(flavor) {
                Ok(_) => conforming += 1,
                Err(rej) => {
                    let wait = rej.retry_after.expect("a GCRA refusal says when");
                    assert!(!wait.is_zero(), "{what}");
                    r.advance(wait);
                    assert!(
                        r.call(flavor).is_ok(),
                        "{what}: not admitted after {wait:?}"
                    );
                    conforming += 1;
                }
            }
        }
        assert_eq!(conforming, 20, "{what}");
    }
}

/// A burst above the limit (governor `allow_burst`) and below it.
#[test]
fn gcra_burst_above_and_below_the_limit() {
    for (flavor, listen, start, what) in cases() {
        // 10 per second, bursts of 20.
        let r = Rig::new(RateLimiter::gcra(10, secs(1)).burst(20), start, listen);
        admitted_n(&r, flavor, 20, Duration::ZERO, &what);
        refused(r.call(flavor), Some(ms(100)), &what);
        r.advance(ms(100));
        admitted(r.call(flavor), ms(100), &what);
        refused(r.call(flavor), Some(ms(100)), &what);

        // 100 per second, bursts of 10.
        let r = Rig::new(RateLimiter::gcra(100, secs(1)).burst(10), start, listen);
        admitted_n(&r, flavor, 10, Duration::ZERO, &what);
        refused(r.call(flavor), Some(ms(10)), &what);
        r.advance(ms(30));
        // Three intervals passed: three permits, no more.
        admitted_n(&r, flavor, 3, ms(30), &what);
        refused(r.call(flavor), Some(ms(10)), &what);
    }
}

/// governor `Quota::with_period(d)` is one cell per `d`, burst 1: in seawall
/// `gcra(1, d)` (or any `limit` per `limit x d` with `burst(1)`).
#[test]
fn gcra_one_per_period_is_quota_with_period() {
    for (flavor, listen, start, what) in cases() {
        for limiter in [
            RateLimiter::gcra(1, ms(250)),
            RateLimiter::gcra(4, secs(1)).burst(1),
        ] {
            assert_eq!(limiter.emission_interval(), ms(250));
            let r = Rig::new(limiter.clone(), start, listen);
            admitted(r.call(flavor), Duration::ZERO, &what);
            count_down(&r, flavor, ms(250), ms(1), &what);
            admitted(r.call(flavor), ms(250), &what);
            refused(r.call(flavor), Some(ms(250)), &what);
        }
    }
}

/// The emission interval is rounded up to the nanosecond: `gcra(3, 1 s)`
/// spaces permits 333,333,334 ns apart, and says so.
#[test]
fn gcra_interval_with_a_fraction_of_a_nanosecond_is_rounded_up() {
    let limiter = RateLimiter::gcra(3, secs(1)).burst(1);
    assert_eq!(
        limiter.emission_interval(),
        Duration::from_nanos(333_333_334)
    );
    for (flavor, listen, start, what) in cases() {
        let r = Rig::new(limiter.clone(), start, listen);
        admitted(r.call(flavor), Duration::ZERO, &what);
        let ns = Duration::from_nanos;
        count_down(&r, flavor, ns(333_333_334), ns(1), &what);
        assert!(r.call(flavor).is_ok(), "{what}");
    }
}

// --------------------------------------------------------------- weights

/// governor `never_allows_more_than_capacity_all` (check_n): `gcra(4, 1 s)`,
/// calls of weight 2.
#[test]
fn weighted_gcra_calls_take_all_their_permits_or_none() {
    for (flavor, listen, start, what) in cases() {
        let r = Rig::new(RateLimiter::gcra(4, secs(1)), start, listen);
        let two = || r.go(flavor, None, Some(2));
        admitted(two(), ms(0), &what);
        admitted(two(), ms(0), &what);
        r.advance(ms(1));
        // TAT 1000 ms; the last of 2 permits is due at 1000 + 250 - 750.
        refused(two(), Some(ms(499)), &what);
        r.advance(ms(1000));
        admitted(two(), ms(1001), &what);
        r.advance(ms(1));
        admitted(two(), ms(1002), &what);
        r.advance(ms(1));
        refused(two(), Some(ms(498)), &what);
        // A weight of 1 through `weighted` is an ordinary call.
        refused(r.go(flavor, None, Some(1)), Some(ms(248)), &what);
        refused(r.call(flavor), Some(ms(248)), &what);
    }
}

/// governor `all_capacity_check_rejects_excess` / `rejects_too_many_all`: a
/// weight above the burst is an error at once, whatever the state, never a
/// wait: seawall refuses it with `rate_limited` and no `retry_after`, even
/// with a `max_wait`, without running the operation.
#[test]
fn a_weight_above_the_burst_is_refused_at_once_without_retry_after() {
    for (flavor, listen, start, what) in cases() {
        for wait in [Duration::ZERO, secs(60)] {
            let what = format!("{what} max_wait={wait:?}");
            let limiter = RateLimiter::gcra(5, secs(1)).max_wait(wait);
            assert!(limiter.grants(5) && !limiter.grants(6) && !limiter.grants(0));
            let r = Rig::new(limiter, start, listen);
            for w in [15, 7, 6, u32::MAX] {
                refused(r.go(flavor, None, Some(w)), None, &what);
                refused(r.go(flavor, Some("k"), Some(w)), None, &what);
            }
            assert_eq!(r.elapsed(), Duration::ZERO, "{what}: waited");
            r.advance(secs(3));
            refused(r.go(flavor, None, Some(15)), None, &what);
            // Nothing was taken by the refusals: the whole burst is there.
            admitted(r.go(flavor, None, Some(5)), secs(3), &what);
            admitted(r.go(flavor, Some("k"), Some(5)), secs(3), &what);
            if listen {
                let none = r.events(|e| {
                    matches!(
                        e,
                        EventKind::Rejected {
                            reason: RejectionReason::RateLimited,
                            retry_after: None
                        }
                    )
                });
                assert_eq!(none.len(), 9, "{what}");
                let deferred = r.events(|e| matches!(e, EventKind::Deferred { .. }));
                assert!(deferred.is_empty(), "{what}: {deferred:?}");
            }
        }
    }
}

/// The burst, not the limit, bounds a GCRA weight; the limit bounds a
/// window's.
#[test]
fn the_largest_weight_is_the_burst_for_gcra_and_the_limit_for_windows() {
    for (flavor, listen, start, what) in cases() {
        let r = Rig::new(RateLimiter::gcra(10, secs(1)).burst(3), start, listen);
        refused(r.go(flavor, None, Some(4)), None, &what);
        admitted(r.go(flavor, None, Some(3)), Duration::ZERO, &what);
        refused(r.go(flavor, None, Some(1)), Some(ms(100)), &what);

        for limiter in [
            RateLimiter::fixed_window(5, secs(1)),
            RateLimiter::sliding_window(5, secs(1)),
        ] {
            assert!(limiter.grants(5) && !limiter.grants(6) && !limiter.grants(0));
            let r = Rig::new(limiter.clone(), start, listen);
            let weighing = |w| r.go(flavor, None, Some(w));
            refused(weighing(6), None, &what);
            admitted(weighing(3), Duration::ZERO, &what);
            refused(weighing(3), Some(secs(1)), &what);
            admitted(weighing(2), Duration::ZERO, &what);
            refused(weighing(1), Some(secs(1)), &what);
        }
    }
}

/// A weight of 0 is a `ConfigError` naming the field (documented as
/// `rate_limit.weight must be >= 1, got 0`).
#[test]
fn a_weight_of_zero_is_a_config_error() {
    let r = Rig::new(RateLimiter::gcra(5, secs(1)), FAR, false);
    let e = r.p.weighted(0).unwrap_err();
    assert_eq!((e.policy, e.field), ("rate_limit", "weight"));
    assert_eq!(e.to_string(), "rate_limit.weight must be >= 1, got 0");
    let e = r.p.partition("k").weighted(0).unwrap_err();
    assert_eq!(e.field, "weight");
    assert_eq!(r.p.weighted(3).unwrap().weight(), 3);
}

// ---------------------------------------------------------------- windows

/// A fixed window is aligned on multiples of the period, also when the
/// clock starts in the middle of one; up to 2 x limit pass around an edge.
#[test]
fn fixed_window_counts_per_aligned_window() {
    for (flavor, listen, start, _) in cases() {
        let start = start + ms(300);
        let what = format!("{flavor:?} listen={listen} start={start:?}");
        for wait in [Duration::ZERO, Duration::from_nanos(1)] {
            let rig = || {
                Rig::new(
                    RateLimiter::fixed_window(3, secs(1)).max_wait(wait),
                    start,
                    listen,
                )
            };
            let r = rig();
            admitted_n(&r, flavor, 3, Duration::ZERO, &what);
            count_down(&r, flavor, ms(700), ms(1), &what);
            admitted_n(&r, flavor, 3, ms(700), &what);
            // The last millisecond of a window and the first of the next.
            count_down(&r, flavor, secs(1), ms(1), &what);
            let edge = rig();
            edge.advance(ms(699));
            all_ok(&edge, flavor, 3, &what);
            edge.advance(ms(1));
            all_ok(&edge, flavor, 3, &what);
            refused(edge.call(flavor), Some(secs(1)), &what);
        }
    }
}

/// A sliding window admits at most `limit` in any span of `period`, and
/// says when the oldest admission stops counting; with and without a
/// `max_wait` (the ring and the log).
#[test]
fn sliding_window_counts_any_span_of_the_period() {
    for (flavor, listen, start, what) in cases() {
        for wait in [Duration::ZERO, Duration::from_nanos(1)] {
            let r = Rig::new(
                RateLimiter::sliding_window(3, secs(1)).max_wait(wait),
                start,
                listen,
            );
            admitted(r.call(flavor), ms(0), &what);
            r.advance(ms(300));
            admitted(r.call(flavor), ms(300), &what);
            r.advance(ms(300));
            admitted(r.call(flavor), ms(600), &what);
            r.advance(ms(100));
            count_down(&r, flavor, ms(300), ms(1), &what);
            admitted(r.call(flavor), ms(1000), &what);
            refused(r.call(flavor), Some(ms(300)), &what);
            r.advance(ms(300));
            admitted(r.call(flavor), ms(1300), &what);
            // A long pause: the whole limit again, never more.
            r.advance(secs(100));
            all_ok(&r, flavor, 3, &what);
            refused(r.call(flavor), Some(secs(1)), &what);
        }
    }
}

// ------------------------------------------------------- waiting (max_wait)

/// governor `until_ready`: a call may wait for its permit when `max_wait`
/// allows; a wait equal to `max_wait` is allowed. The wait is reported as
/// `Deferred` and is not a refusal.
#[test]
fn a_call_waits_for_its_permit_within_max_wait() {
    for (flavor, listen, start, what) in cases() {
        for (limiter, wait) in [
            (RateLimiter::gcra(1, secs(1)).max_wait(secs(2)), secs(1)),
            (RateLimiter::gcra(1, secs(1)).max_wait(secs(1)), secs(1)),
            (RateLimiter::gcra(5, secs(1)).max_wait(secs(1)), ms(200)),
            (
                RateLimiter::fixed_window(1, secs(1)).max_wait(secs(1)),
                secs(1),
            ),
            (
                RateLimiter::sliding_window(1, secs(1)).max_wait(secs(1)),
                secs(1),
            ),
        ] {
            let what = format!("{what} {limiter:?}");
            let r = Rig::new(limiter.clone(), start, listen);
            admitted_n(&r, flavor, limiter.limit, Duration::ZERO, &what);
            admitted(r.call(flavor), wait, &what);
            assert_eq!(r.elapsed(), wait, "{what}");
            if listen {
                let d = r.events(|e| matches!(e, EventKind::Deferred { .. }));
                assert_eq!(
                    d,
                    vec![EventKind::Deferred {
                        reason: RejectionReason::RateLimited,
                        wait
                    }],
                    "{what}"
                );
                let rejected = r.events(|e| matches!(e, EventKind::Rejected { .. }));
                assert!(rejected.is_empty(), "{what}: {rejected:?}");
            }
        }
    }
}

/// A wait longer than `max_wait` is refused at once with the time until the
/// permit; the clock does not move and the operation does not run.
#[test]
fn a_wait_longer_than_max_wait_is_refused_at_once() {
    for (flavor, listen, start, what) in cases() {
        for limiter in each_algorithm(1, secs(1)).map(|l| l.max_wait(ms(500))) {
            let r = Rig::new(limiter.clone(), start, listen);
            admitted(r.call(flavor), Duration::ZERO, &what);
            refused(
                r.call(flavor),
                Some(secs(1)),
                &format!("{what} {limiter:?}"),
            );
            assert_eq!(r.elapsed(), Duration::ZERO, "{what} {limiter:?}");
        }
    }
}

/// The longest `max_wait` there is: accepted, and a call waits as asked.
#[test]
fn max_wait_of_duration_max_waits_as_asked() {
    for (flavor, listen, start, what) in cases() {
        for limiter in each_algorithm(1, secs(1)) {
            let r = Rig::new(limiter.clone().max_wait(Duration::MAX), start, listen);
            admitted(r.call(flavor), Duration::ZERO, &what);
            admitted(r.call(flavor), secs(1), &format!("{what} {limiter:?}"));
            admitted(r.call(flavor), secs(2), &format!("{what} {limiter:?}"));
        }
    }
}

/// A weighted call with a `max_wait` waits for all its permits.
#[test]
fn a_weighted_call_waits_for_all_its_permits() {
    for (flavor, listen, start, what) in cases() {
        let r = Rig::new(
            RateLimiter::gcra(10, secs(1)).max_wait(ms(900)),
            start,
            listen,
        );
        admitted(r.go(flavor, None, Some(10)), Duration::ZERO, &what);
        admitted(r.go(flavor, None, Some(4)), ms(400), &what);
        // Too long a wait: refused at once, told when all 10 are due.
        refused(r.go(flavor, None, Some(10)), Some(ms(1000)), &what);
        assert_eq!(r.elapsed(), ms(400), "{what}");
        // Partitioned as well.
        admitted(r.go(flavor, Some("k"), Some(10)), ms(400), &what);
        admitted(r.go(flavor, Some("k"), Some(3)), ms(700), &what);
    }
}

/// The example of `RateLimiter::max_wait`'s docs: with
/// `fixed_window(1, 250 ms).max_wait(250 ms)`, three calls at 250 ms are
/// admitted at 250 and 500 ms and the third is refused at once, told to
/// retry after 500 ms. The same holds for GCRA and the sliding window.
#[test]
fn concurrent_waiters_queue_behind_the_reserved_permit() {
    for (listen, start, what) in listen_starts() {
        for limiter in each_algorithm(1, ms(250)) {
            let what = format!("{what} {limiter:?}");
            let r = Rig::new(limiter.max_wait(ms(250)), start, listen);
            r.advance(ms(250));
            let results: Vec<_> = r
                .waiters(3)
                .into_iter()
                .map(|r| ran_or_refused(r, &what))
                .collect();
            let mut ran: Vec<Duration> = results
                .iter()
                .filter_map(|r| r.as_ref().ok().copied())
                .collect();
            ran.sort();
            assert_eq!(ran, vec![ms(250), ms(500)], "{what}: {results:?}");
            let refusals: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
            assert_eq!(refusals.len(), 1, "{what}");
            assert_eq!(refusals[0].reason, RejectionReason::RateLimited, "{what}");
            assert_eq!(refusals[0].retry_after, Some(ms(500)), "{what}");
        }
    }
}

/// governor `multiple`: twenty waiters on `gcra(10, 1 s)` are all admitted,
/// ten at once and then one per 100 ms, in order.
#[test]
fn twenty_waiters_are_admitted_one_interval_apart() {
    for (listen, start, what) in listen_starts() {
        let r = Rig::new(
            RateLimiter::gcra(10, secs(1)).max_wait(secs(10)),
            start,
            listen,
        );
        let mut ran: Vec<Duration> = r
            .waiters(20)
            .into_iter()
            .map(|r| r.unwrap_or_else(|e| panic!("{what}: {e:?}")))
            .collect();
        ran.sort();
        let want: Vec<Duration> = (0..20u64).map(|i| ms(i.saturating_sub(9) * 100)).collect();
        assert_eq!(ran, want, "{what}");
        if listen {
            let d = r.events(|e| matches!(e, EventKind::Deferred { .. }));
            assert_eq!(d.len(), 10, "{what}: {d:?}");
        }
    }
}

/// A waiter whose future is dropped gives its (newest) reservation back:
/// the next caller waits as if it had never been.
#[test]
fn a_cancelled_waiter_gives_its_permit_back() {
    for (listen, start, what) in listen_starts() {
        for limiter in each_algorithm(1, secs(1)) {
            let what = format!("{what} {limiter:?}");
            let r = permit_taken(|b| b, limiter, start, listen, &what);
            rt().block_on(async {
                let mut fut = Box::pin(r.p.run(r.stamp_async()));
                // Polled once: it reserves its permit and waits.
                assert_pending(&mut fut, &what).await;
                drop(fut);
            });
            assert_eq!(r.elapsed(), Duration::ZERO, "{what}");
            admitted(r.call(Flavor::Async), secs(1), &what);
            admitted(r.call(Flavor::Sync), secs(2), &what);
        }
    }
}

/// The call's deadline bounds the wait for a permit: a permit due after it
/// is refused at once; one due at the deadline is on time.
#[test]
fn the_deadline_bounds_the_wait_for_a_permit() {
    for (flavor, listen, start, what) in cases() {
        let limiter = RateLimiter::gcra(1, secs(1)).max_wait(secs(5));
        let r = Rig::with(
            |b| b.timeout(ms(500)).rate_limiter(limiter.clone()),
            start,
            listen,
        );
        admitted(r.call(flavor), Duration::ZERO, &what);
        refused(r.call(flavor), Some(secs(1)), &what);
        assert_eq!(r.elapsed(), Duration::ZERO, "{what}");

        let r = Rig::with(
            |b| b.timeout(secs(1)).rate_limiter(limiter.clone()),
            start,
            listen,
        );
        admitted(r.call(flavor), Duration::ZERO, &what);
        admitted(
            r.call(flavor),
            secs(1),
            &format!("{what} (due at the deadline)"),
        );
    }
}

// ------------------------------------------------------------- partitions

/// governor keyed limiters: each key has its own limit; the unpartitioned
/// state is another one.
#[test]
fn each_partition_has_its_own_limit() {
    for (flavor, listen, start, what) in cases() {
        for limiter in each_algorithm(2, secs(1)) {
            let r = Rig::new(limiter.clone(), start, listen);
            for key in ["a", "b"] {
                admitted(r.go(flavor, Some(key), None), Duration::ZERO, &what);
                admitted(r.go(flavor, Some(key), None), Duration::ZERO, &what);
                let rej = r.go(flavor, Some(key), None).unwrap_err();
                assert_eq!(rej.reason, RejectionReason::RateLimited, "{what}");
                assert!(rej.retry_after.is_some(), "{what}");
            }
            admitted_n(&r, flavor, 2, Duration::ZERO, &what);
            assert!(r.call(flavor).is_err(), "{what}");
            r.advance(secs(1));
            for key in ["a", "b"] {
                admitted(r.go(flavor, Some(key), None), secs(1), &what);
            }
        }
    }
}

/// governor `retain_recent`: evicting idle keys never lets more calls
/// through than the limit; a key whose permits no longer count is dropped.
#[test]
fn evicting_idle_partitions_never_lets_more_through() {
    for (flavor, listen, start, what) in cases() {
        for limiter in [
            RateLimiter::gcra(1, secs(10)),
            RateLimiter::sliding_window(1, secs(10)),
        ] {
            let what = format!("{what} {limiter:?}");
            let r = Rig::with(
                |b| b.rate_limiter(limiter.clone()).partition_idle(secs(1)),
                start,
                listen,
            );
            let a = || r.go(flavor, Some("a"), None);
            admitted(a(), Duration::ZERO, &what);
            r.advance(secs(2));
            assert_eq!(r.p.evict_idle_partitions(), 0, "{what}");
            assert_eq!(r.p.partitions(), 1, "{what}");
            refused(a(), Some(secs(8)), &what);
            r.advance(secs(10));
            assert_eq!(r.p.evict_idle_partitions(), 1, "{what}");
            assert_eq!(r.p.partitions(), 0, "{what}");
            admitted(a(), secs(12), &what);
            refused(a(), Some(secs(10)), &what);
        }
    }
}

// ------------------------------------------------------------ threads

/// governor `actual_threadsafety`: twenty threads take the twenty permits
/// of the burst, no more; unpartitioned and keyed.
#[test]
fn the_burst_holds_across_threads() {
    for (listen, start, what) in listen_starts() {
        for key in [None, Some("k")] {
            let what = format!("{what} key={key:?}");
            let r = Rig::new(RateLimiter::gcra(20, secs(1)), start, listen);
            let ok = AtomicU64::new(0);
            std::thread::scope(|s| {
                for _ in 0..25 {
                    s.spawn(|| {
                        if r.go(Flavor::Sync, key, None).is_ok() {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
            });
            assert_eq!(ok.load(Ordering::Relaxed), 20, "{what}");
            r.advance(ms(2));
            refused(r.go(Flavor::Sync, key, None), Some(ms(48)), &what);
            r.advance(ms(998));
            assert!(r.go(Flavor::Sync, key, None).is_ok(), "{what}");
        }
    }
}

// ---------------------------------------------------- placement, shadow

/// Declared before the retry the limiter takes one permit per call;
/// after it, one per attempt.
#[test]
fn a_limiter_before_the_retry_takes_one_permit_per_call() {
    for (flavor, listen, start, what) in cases() {
        let run_failing_twice = |r: &Rig| {
            let tries = AtomicU64::new(0);
            let res = exec(&r.p, flavor, failing_twice(&tries));
            (res, tries.load(Ordering::Relaxed))
        };
        let before = Rig::with(
            |b| {
                b.rate_limiter(RateLimiter::gcra(2, secs(1)))
                    .retry(three_attempts())
            },
            start,
            listen,
        );
        let (res, tries) = run_failing_twice(&before);
        assert!(res.is_ok() && tries == 3, "{what}: {res:?} {tries}");
        assert!(before.call(flavor).is_ok(), "{what}");
        refused(before.call(flavor), Some(ms(500)), &what);

        let after = Rig::with(
            |b| {
                b.retry(three_attempts())
                    .rate_limiter(RateLimiter::gcra(3, secs(1)))
            },
            start,
            listen,
        );
        let (res, tries) = run_failing_twice(&after);
        assert!(res.is_ok() && tries == 3, "{what}: {res:?} {tries}");
        refused(
            after.call(flavor),
            Some(ms(333) + Duration::from_nanos(333_334)),
            &what,
        );
    }
}

/// Shadow mode: calls over the limit run, take no permit, never wait, and
/// are reported as `ShadowRejected`; a weight that can never fit is
/// reported without `retry_after` and runs.
#[test]
fn a_limiter_in_shadow_mode_reports_and_never_refuses() {
    for flavor in FLAVORS {
        for start in STARTS {
            let what = format!("{flavor:?} start={start:?}");
            let r = Rig::new(
                RateLimiter::gcra(1, secs(1)).max_wait(secs(5)).shadow(true),
                start,
                true,
            );
            admitted_n(&r, flavor, 3, Duration::ZERO, &what);
            admitted(r.go(flavor, None, Some(2)), Duration::ZERO, &what);
            let shadow = r.events(|e| matches!(e, EventKind::ShadowRejected { .. }));
            assert_eq!(
                shadow,
                vec![
                    EventKind::ShadowRejected {
                        reason: RejectionReason::RateLimited,
                        retry_after: Some(secs(1))
                    };
                    2
                ]
                .into_iter()
                .chain([EventKind::ShadowRejected {
                    reason: RejectionReason::RateLimited,
                    retry_after: None
                }])
                .collect::<Vec<_>>(),
                "{what}"
            );
            r.advance(secs(1));
            admitted(r.call(flavor), secs(1), &what);
            assert_eq!(
                r.events(|e| matches!(e, EventKind::ShadowRejected { .. }))
                    .len(),
                3,
                "{what}: the call after the period took a permit of its own"
            );
        }
    }
}

// ------------------------------------------------------------ system clock

/// On the real clock (which starts near 0 in a fresh process) the first
/// call is admitted and the refusal says when the next permit is due, at
/// most a period away.
#[test]
fn on_the_system_clock_the_first_call_is_admitted_and_retry_after_is_bounded() {
    for flavor in FLAVORS {
        for limiter in each_algorithm(1, secs(3600)) {
            let what = format!("{flavor:?} {limiter:?}");
            let p = Pipeline::builder(unique("rl-sys"))
                .store(MemoryStore::new())
                .rate_limiter(limiter.clone())
                .build()
                .unwrap();
            assert!(call_ok(&p, flavor).is_ok(), "{what}");
            let e = call_ok(&p, flavor).unwrap_err();
            let rej = e.rejection().copied().expect("a rejection");
            assert_eq!(rej.reason, RejectionReason::RateLimited, "{what}");
            assert_eq!(rej.resource(), p.name(), "{what}");
            let wait = rej.retry_after.expect("retry_after");
            assert!(wait <= secs(3600) && !wait.is_zero(), "{what}: {wait:?}");
            if limiter.algorithm != seawall::rate_limit::RateAlgorithm::FixedWindow {
                assert!(wait > secs(3590), "{what}: {wait:?}");
            }
        }
    }
}

// ----------------------------------------------------- bad configuration

/// Bad settings fail `build()` with a `ConfigError` naming the policy and
/// the field; `build()` never panics, whatever the numbers.
#[test]
fn bad_configuration_fails_at_build_naming_the_field() {
    let s = secs(1);
    let mut cases: Vec<(RateLimiter, &str)> = Vec::new();
    for (limit, period, field) in [
        (0, s, "limit"),
        (1, Duration::ZERO, "period"),
        (1, Duration::MAX, "period"),
    ] {
        for limiter in each_algorithm(limit, period) {
            cases.push((limiter, field));
        }
    }
    cases.extend([
        (
            RateLimiter::gcra(1, RateLimiter::MAX_PERIOD + Duration::from_nanos(1)),
            "period",
        ),
        (RateLimiter::gcra(5, s).burst(0), "burst"),
        (RateLimiter::fixed_window(5, s).burst(5), "burst"),
        (RateLimiter::sliding_window(5, s).burst(10), "burst"),
        (
            RateLimiter::gcra(1, secs(100 * 365 * 24 * 3600)).burst(3),
            "burst",
        ),
        (RateLimiter::gcra(1_000_001, ms(1)), "limit"),
        (
            RateLimiter::gcra(u32::MAX, Duration::from_nanos(1)),
            "limit",
        ),
        (RateLimiter::sliding_window(1_000_001, s), "limit"),
        (RateLimiter::gcra(0, Duration::ZERO).burst(0), "limit"),
    ]);
    for (limiter, field) in cases {
        let built = std::panic::catch_unwind(|| {
            Pipeline::builder(unique("rl-bad"))
                .store(MemoryStore::new())
                .rate_limiter(limiter.clone())
                .build()
        });
        let e = match built {
            Ok(Err(e)) => e,
            Ok(Ok(_)) => panic!("{limiter:?}: built"),
            Err(_) => panic!("{limiter:?}: build() panicked"),
        };
        assert_eq!(
            (e.policy, e.field),
            ("rate_limiter", field),
            "{limiter:?}: {e}"
        );
        assert!(
            e.to_string().starts_with(&format!("rate_limiter.{field} ")),
            "{limiter:?}: {e}"
        );
    }
    // Extreme but valid settings build, and their first call is admitted.
    for limiter in [
        RateLimiter::gcra(u32::MAX, secs(10)),
        RateLimiter::gcra(1, secs(1)).burst(u32::MAX),
        RateLimiter::gcra(1, RateLimiter::MAX_PERIOD),
        RateLimiter::fixed_window(u32::MAX, Duration::from_nanos(1)),
        RateLimiter::fixed_window(1, RateLimiter::MAX_PERIOD),
        RateLimiter::sliding_window(1_000_000, s),
        RateLimiter::gcra(1, s).max_wait(Duration::MAX),
    ] {
        for start in STARTS {
            let built = std::panic::catch_unwind(|| {
                let r = Rig::new(limiter.clone(), start, false);
                r.call(Flavor::Sync)
            });
            match built {
                Ok(r) => assert!(r.is_ok(), "{limiter:?} at {start:?}: {r:?}"),
                Err(_) => panic!("{limiter:?} at {start:?}: panicked"),
            }
        }
    }
}

// ------------------------------------------------ waits with other policies

/// A timeout declared after the limiter (no retry: it bounds the whole
/// call) bounds the wait for a permit all the same.
#[test]
fn a_timeout_declared_after_the_limiter_also_bounds_the_wait() {
    for (flavor, listen, start, what) in cases() {
        let limiter = RateLimiter::gcra(1, secs(1)).max_wait(secs(5));
        let r = Rig::with(
            |b| b.rate_limiter(limiter.clone()).timeout(ms(500)),
            start,
            listen,
        );
        admitted(r.call(flavor), Duration::ZERO, &what);
        refused(r.call(flavor), Some(secs(1)), &what);
        assert_eq!(r.elapsed(), Duration::ZERO, "{what}");
    }
}

/// After the retry each attempt is admitted, and may wait up to `max_wait`
/// again; before it the call is admitted (and waits) once.
#[test]
fn each_attempt_after_the_retry_may_wait_max_wait_again() {
    for (flavor, listen, start, what) in cases() {
        let limiter = RateLimiter::gcra(1, secs(1)).max_wait(secs(1));
        let r = Rig::with(
            |b| b.retry(three_attempts()).rate_limiter(limiter.clone()),
            start,
            listen,
        );
        let times = Mutex::new(Vec::new());
        let op = |_ctx: Context| {
            let mut t = times.lock().unwrap();
            t.push(r.elapsed());
            if t.len() < 3 {
                Err(Boom(0))
            } else {
                Ok(())
            }
        };
        let res = exec(&r.p, flavor, op);
        assert!(res.is_ok(), "{what}: {res:?}");
        assert_eq!(
            *times.lock().unwrap(),
            vec![ms(0), secs(1), secs(2)],
            "{what}"
        );

        let r = Rig::with(
            |b| b.rate_limiter(limiter.clone()).retry(three_attempts()),
            start,
            listen,
        );
        admitted(r.call(flavor), Duration::ZERO, &what);
        admitted(r.call(flavor), secs(1), &what);
    }
}

/// The time a call waited for a cooldown counts against the limiter's
/// `max_wait` ("less the time the call has already waited (for a cooldown,
/// say, ...)").
#[test]
fn time_waited_for_a_cooldown_counts_against_max_wait() {
    for (flavor, listen, start, what) in cases() {
        for (max_wait, expect) in [(ms(700), Err(ms(500))), (secs(1), Ok(secs(1)))] {
            let what = format!("{what} max_wait={max_wait:?}");
            let clock = VirtualClock::starting_at(start);
            let b = Pipeline::builder(unique("rl-cd"))
                .store(MemoryStore::new())
                .clock(clock.clone())
                .cooldown(seawall::Cooldown::new())
                .rate_limiter(RateLimiter::gcra(1, secs(1)).max_wait(max_wait));
            let p = support::listen(b, listen)
                .classify(|_: &Boom| seawall::Verdict::throttled().with_retry_after(ms(500)))
                .build()
                .unwrap();
            let run = |fail: bool| {
                exec(&p, flavor, |_ctx| {
                    if fail {
                        Err(Boom(0))
                    } else {
                        Ok(clock.now() - start)
                    }
                })
            };
            // Takes the permit and opens a cooldown of 500 ms.
            assert!(
                matches!(run(true), Err(Error::Operation(Boom(_)))),
                "{what}"
            );
            let got = match run(false) {
                Ok(t) => Ok(t),
                Err(Error::Rejected(rej)) => {
                    assert_eq!(rej.reason, RejectionReason::RateLimited, "{what}");
                    Err(rej.retry_after.unwrap())
                }
                Err(e) => panic!("{what}: {e:?}"),
            };
            assert_eq!(got, expect, "{what}");
        }
    }
}

/// A call waiting for its reserved permit that another policy refuses when
/// the permit is due (here an isolated circuit) gives the permit back.
#[test]
fn a_waiting_call_refused_by_the_circuit_gives_its_permit_back() {
    for (listen, start, what) in listen_starts() {
        let r = permit_taken(
            |b| b.circuit_breaker(seawall::CircuitBreaker::consecutive_failures(5)),
            RateLimiter::gcra(1, secs(1)),
            start,
            listen,
            &what,
        );
        let res = wait_then(&r, &what, || r.p.isolate().unwrap());
        match res {
            Err(Error::Rejected(rej)) => {
                assert_eq!(rej.reason, RejectionReason::CircuitOpen, "{what}")
            }
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(r.elapsed(), secs(1), "{what}");
        r.p.force_close().unwrap();
        // The permit of 1 s was given back: the next call runs now.
        admitted(r.call(Flavor::Sync), secs(1), &what);
    }
}

// ------------------------------------------------------- sharing, events

/// Clones of a pipeline, and pipelines of the same name and settings on
/// the same store, share one limit.
#[test]
fn clones_and_pipelines_of_one_name_share_the_limit() {
    for (flavor, listen, start, what) in cases() {
        let r = Rig::new(RateLimiter::gcra(2, secs(1)), start, listen);
        let clone = r.p.clone();
        assert!(r.call(flavor).is_ok(), "{what}");
        assert!(call_ok(&clone, Flavor::Sync).is_ok(), "{what}");
        refused(r.call(flavor), Some(ms(500)), &what);

        let store = MemoryStore::new();
        let clock = VirtualClock::starting_at(start);
        let name = unique("rl-shared");
        let make = || {
            Pipeline::builder(name.clone())
                .store(store.clone())
                .clock(clock.clone())
                .rate_limiter(RateLimiter::sliding_window(2, secs(1)))
                .build()
                .unwrap()
        };
        let (a, b) = (make(), make());
        assert!(call_ok(&a, Flavor::Sync).is_ok(), "{what}");
        assert!(call_ok(&b, Flavor::Sync).is_ok(), "{what}");
        let e = call_ok(&a, Flavor::Sync).unwrap_err();
        assert_eq!(
            e.rejection().map(|r| r.reason),
            Some(RejectionReason::RateLimited)
        );
    }
}

/// Events of a partitioned call name its partition and the pipeline.
#[test]
fn events_of_a_partitioned_call_name_the_partition() {
    for flavor in FLAVORS {
        // (pipeline, partition, event)
        type Seen = Vec<(String, Option<String>, EventKind)>;
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let s = Arc::clone(&seen);
        let clock = VirtualClock::starting_at(FAR);
        let name = unique("rl-ev");
        let p = Pipeline::builder(name.clone())
            .store(MemoryStore::new())
            .clock(clock.clone())
            .rate_limiter(RateLimiter::gcra(1, secs(1)).max_wait(ms(500)))
            .on_event(move |e: &Event<'_>| {
                s.lock().unwrap().push((
                    e.resource.to_string(),
                    e.partition.map(|k| k.to_string()),
                    e.kind.clone(),
                ))
            })
            .build()
            .unwrap();
        let go = |key: &'static str| exec_on!(p.partition(key), flavor, |_| Ok::<_, Boom>(()));
        assert!(go("tenant-a").is_ok());
        assert!(go("tenant-a").is_err());
        let rejected: Vec<_> = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, _, k)| matches!(k, EventKind::Rejected { .. }))
            .cloned()
            .collect();
        assert_eq!(
            rejected,
            vec![(
                name.clone(),
                Some("tenant-a".to_string()),
                EventKind::Rejected {
                    reason: RejectionReason::RateLimited,
                    retry_after: Some(secs(1))
                }
            )],
            "{flavor:?}"
        );
    }
}

// ------------------------------------------------- more weights and clocks

/// Weights with reservations: a sliding window reserves all `n` entries at
/// the instant they are free; a GCRA burst above the limit may be waited
/// for whole.
#[test]
fn weighted_reservations_on_a_sliding_window_and_a_large_burst() {
    for (flavor, listen, start, what) in cases() {
        let r = Rig::new(
            RateLimiter::sliding_window(3, secs(1)).max_wait(secs(1)),
            start,
            listen,
        );
        admitted_n(&r, flavor, 3, Duration::ZERO, &what);
        r.advance(ms(500));
        admitted(r.go(flavor, None, Some(2)), secs(1), &what);
        admitted(r.go(flavor, None, Some(1)), secs(1), &what);
        admitted(r.go(flavor, None, Some(1)), secs(2), &what);

        let r = Rig::new(
            RateLimiter::gcra(10, secs(1)).burst(20).max_wait(secs(2)),
            start,
            listen,
        );
        admitted(r.go(flavor, None, Some(20)), Duration::ZERO, &what);
        admitted(r.go(flavor, None, Some(20)), secs(2), &what);
        admitted(r.go(flavor, None, Some(1)), ms(2100), &what);
    }
}

/// Declared before the retry, a weighted call takes its `n` permits once.
#[test]
fn a_weighted_call_before_the_retry_takes_its_permits_once() {
    for (flavor, listen, start, what) in cases() {
        let r = Rig::with(
            |b| {
                b.rate_limiter(RateLimiter::gcra(4, secs(1)))
                    .retry(three_attempts())
            },
            start,
            listen,
        );
        let tries = AtomicU64::new(0);
        let res = exec_on!(r.p.weighted(2).unwrap(), flavor, failing_twice(&tries));
        assert!(res.is_ok(), "{what}: {res:?}");
        assert_eq!(tries.load(Ordering::Relaxed), 3, "{what}");
        admitted(r.go(flavor, None, Some(2)), Duration::ZERO, &what);
        refused(r.go(flavor, None, Some(1)), Some(ms(250)), &what);
    }
}

/// Far from 0: a clock 200 years on (within the 292 years the docs state)
/// admits, refuses and waits as at 0.
#[test]
fn a_clock_two_hundred_years_on_behaves_as_at_zero() {
    let start = secs(200 * 365 * 24 * 3600);
    for flavor in FLAVORS {
        for listen in [false, true] {
            for limiter in each_algorithm(2, secs(1)) {
                let what = format!("{flavor:?} listen={listen} {limiter:?}");
                let r = Rig::new(limiter.clone(), start, listen);
                let first = r.call(flavor);
                assert!(first.is_ok(), "{what}: {first:?}");
                assert!(r.call(flavor).is_ok(), "{what}");
                let rej = r.call(flavor).unwrap_err();
                let wait = rej.retry_after.unwrap();
                assert!(wait <= secs(1) && !wait.is_zero(), "{what}: {wait:?}");
                let r = Rig::new(limiter.max_wait(secs(1)), start, listen);
                all_ok(&r, flavor, 2, &what);
                let waited = r.call(flavor);
                assert!(waited.is_ok(), "{what}: {waited:?}");
                assert!(r.elapsed() <= secs(1) && !r.elapsed().is_zero(), "{what}");
            }
        }
    }
}

// ------------------------------------------------------------ give-backs

/// Waiters dropped newest first all give their permits back (every
/// algorithm); dropped oldest first, GCRA and the fixed window keep the
/// older one spent (stricter, as documented) and the sliding window takes
/// both out of its log.
#[test]
fn dropped_waiters_give_back_as_documented() {
    for (listen, start, what) in listen_starts() {
        for newest_first in [true, false] {
            for limiter in each_algorithm(1, secs(1)) {
                let what = format!("{what} {limiter:?} newest_first={newest_first}");
                let exact = limiter.algorithm == seawall::rate_limit::RateAlgorithm::SlidingWindow;
                let r = permit_taken(|b| b, limiter, start, listen, &what);
                rt().block_on(async {
                    let mut b = Box::pin(r.p.run(r.stamp_async()));
                    let mut c = Box::pin(r.p.run(r.stamp_async()));
                    assert_pending(&mut b, &what).await;
                    assert_pending(&mut c, &what).await;
                    if newest_first {
                        drop(c);
                        drop(b);
                    } else {
                        drop(b);
                        drop(c);
                    }
                });
                assert_eq!(r.elapsed(), Duration::ZERO, "{what}");
                let due = if newest_first || exact {
                    secs(1)
                } else {
                    secs(2)
                };
                admitted(r.call(Flavor::Async), due, &what);
            }
        }
    }
}

// ---------------------------------------------------------- large limits

/// Limits whose fixed-window state does not fit one word, and the largest
/// sliding window, through the pipeline: a whole limit in one weighted
/// call, then a refusal until the window turns (or a wait for it).
#[test]
fn the_largest_limits_take_a_whole_limit_in_one_call() {
    for (flavor, listen, start, _) in cases() {
        let start = start + ms(300);
        let what = format!("{flavor:?} listen={listen} start={start:?}");
        for (limiter, weight, retry) in [
            (
                RateLimiter::fixed_window(u32::MAX, secs(1)),
                u32::MAX,
                ms(700),
            ),
            (
                RateLimiter::fixed_window(1 << 20, secs(1)),
                1 << 20,
                ms(700),
            ),
            (
                RateLimiter::sliding_window(1_000_000, secs(1)),
                1_000_000,
                secs(1),
            ),
        ] {
            let what = format!("{what} {limiter:?}");
            let r = Rig::new(limiter.clone(), start, listen);
            admitted(r.go(flavor, None, Some(weight)), Duration::ZERO, &what);
            refused(r.call(flavor), Some(retry), &what);
            let r = Rig::new(limiter.clone().max_wait(secs(1)), start, listen);
            admitted(r.go(flavor, None, Some(weight)), Duration::ZERO, &what);
            admitted(r.call(flavor), retry, &what);
        }
    }
}

/// A weighted call on a pipeline without a rate limiter just runs.
#[test]
fn a_weighted_call_without_a_rate_limiter_runs() {
    for (flavor, listen, start, _) in cases() {
        let r = Rig::with(|b| b, start, listen);
        admitted(r.go(flavor, None, Some(1000)), Duration::ZERO, "no limiter");
        admitted(
            r.go(flavor, Some("k"), Some(u32::MAX)),
            Duration::ZERO,
            "no limiter",
        );
    }
}

/// Each waiter reports how long it waits (`Deferred`): 100 ms to 1 s for
/// the ten waiters queued behind a burst of ten.
#[test]
fn each_waiter_reports_its_own_wait() {
    for start in STARTS {
        let r = Rig::new(
            RateLimiter::gcra(10, secs(1)).max_wait(secs(10)),
            start,
            true,
        );
        let results = r.waiters(20);
        assert!(results.iter().all(Result::is_ok));
        let mut waits: Vec<Duration> = r
            .events(|e| matches!(e, EventKind::Deferred { .. }))
            .into_iter()
            .map(|e| match e {
                EventKind::Deferred { wait, .. } => wait,
                _ => unreachable!(),
            })
            .collect();
        waits.sort();
        let want: Vec<Duration> = (1..=10).map(|i| ms(i * 100)).collect();
        assert_eq!(waits, want, "start={start:?}");
    }
}

/// A permit due exactly at the deadline is on time, for every algorithm;
/// one due a nanosecond after it is refused at once.
#[test]
fn a_permit_due_at_the_deadline_is_on_time_for_every_algorithm() {
    for (flavor, listen, start, what) in cases() {
        for limiter in each_algorithm(1, secs(1)) {
            let what = format!("{what} {limiter:?}");
            let l = limiter.clone().max_wait(secs(5));
            let r = Rig::with(
                |b| b.timeout(secs(1)).rate_limiter(l.clone()),
                start,
                listen,
            );
            admitted(r.call(flavor), Duration::ZERO, &what);
            admitted(r.call(flavor), secs(1), &what);
            let short = secs(1) - Duration::from_nanos(1);
            let r = Rig::with(|b| b.timeout(short).rate_limiter(l.clone()), start, listen);
            admitted(r.call(flavor), Duration::ZERO, &what);
            refused(r.call(flavor), Some(secs(1)), &what);
        }
    }
}

/// Automatic sweeps of idle keys (when a shard has doubled) never drop a
/// key whose permits still count.
#[test]
fn sweeping_many_idle_keys_keeps_a_key_whose_permits_still_count() {
    for flavor in [Flavor::Sync] {
        for start in STARTS {
            for limiter in each_algorithm(1, secs(100)) {
                let what = format!("{flavor:?} start={start:?} {limiter:?}");
                let r = Rig::with(
                    |b| b.rate_limiter(limiter.clone()).partition_idle(ms(1)),
                    start,
                    false,
                );
                admitted(r.go(flavor, Some("victim"), None), Duration::ZERO, &what);
                r.advance(secs(1));
                for i in 0..5_000u64 {
                    assert!(
                        r.p.partition(i).call(|_| Ok::<_, Boom>(())).is_ok(),
                        "{what}"
                    );
                }
                let rej = r.go(flavor, Some("victim"), None).unwrap_err();
                assert_eq!(rej.reason, RejectionReason::RateLimited, "{what}");
                assert_eq!(rej.retry_after, Some(secs(99)), "{what}");
            }
        }
    }
}

// ------------------------------------------------- shadow combinations

/// A circuit in shadow mode that would refuse does not excuse an enforcing
/// limiter: the limiter is still asked and still takes its permit.
#[test]
fn an_enforcing_limiter_behind_a_shadow_circuit_still_limits() {
    for (flavor, listen, start, what) in cases() {
        let r = Rig::with(
            |b| {
                b.circuit_breaker(seawall::CircuitBreaker::consecutive_failures(5).shadow(true))
                    .rate_limiter(RateLimiter::gcra(2, secs(1)))
            },
            start,
            listen,
        );
        r.p.isolate().unwrap();
        admitted_n(&r, flavor, 2, Duration::ZERO, &what);
        refused(r.call(flavor), Some(ms(500)), &what);
    }
}

/// An enforcing circuit that refuses leaves the limiter's permits alone;
/// a limiter in shadow mode behind a shadowed call is not asked.
#[test]
fn refusals_by_other_policies_take_no_permit() {
    for (flavor, listen, start, what) in cases() {
        let r = Rig::with(
            |b| {
                b.circuit_breaker(seawall::CircuitBreaker::consecutive_failures(5))
                    .rate_limiter(RateLimiter::gcra(1, secs(1)))
            },
            start,
            listen,
        );
        r.p.isolate().unwrap();
        for _ in 0..3 {
            let rej = r.call(flavor).unwrap_err();
            assert_eq!(rej.reason, RejectionReason::CircuitOpen, "{what}");
        }
        r.p.force_close().unwrap();
        admitted(r.call(flavor), Duration::ZERO, &what);
        refused(r.call(flavor), Some(secs(1)), &what);

        if listen {
            let r = Rig::with(
                |b| {
                    b.circuit_breaker(seawall::CircuitBreaker::consecutive_failures(5).shadow(true))
                        .rate_limiter(RateLimiter::gcra(1, secs(1)).shadow(true))
                },
                start,
                listen,
            );
            r.p.isolate().unwrap();
            admitted_n(&r, flavor, 3, Duration::ZERO, &what);
            let limiter = r.limiter_shadow_refusals();
            assert!(limiter.is_empty(), "{what}: {limiter:?}");
            r.p.force_close().unwrap();
            admitted(r.call(flavor), Duration::ZERO, &what);
            let limiter = r.limiter_shadow_refusals();
            assert!(
                limiter.is_empty(),
                "{what}: the shadowed calls took permits: {limiter:?}"
            );
        }
    }
}

/// A call waiting for its permit holds no bulkhead slot.
#[test]
fn a_call_waiting_for_a_permit_holds_no_bulkhead_slot() {
    for (listen, start, what) in listen_starts() {
        let r = permit_taken(
            |b| b.bulkhead(seawall::Bulkhead::new(1)),
            RateLimiter::gcra(1, secs(1)),
            start,
            listen,
            &what,
        );
        let res = wait_then(&r, &what, || {
            assert_eq!(r.p.in_flight().unwrap(), 0, "{what}")
        });
        assert_eq!(res.unwrap(), secs(1), "{what}");
    }
}

/// Coalesced followers take no permit: only the leader's call does.
#[test]
fn coalesced_followers_take_no_permit() {
    for (listen, start, what) in listen_starts() {
        let r = Rig::with(
            |b| {
                b.coalesce(seawall::Coalesce::new())
                    .rate_limiter(RateLimiter::gcra(2, secs(1)))
            },
            start,
            listen,
        );
        let clock = r.clock.clone();
        let op = |_ctx: Context| {
            let c = clock.clone();
            async move {
                seawall::Clock::sleep(&c, ms(10)).await;
                Ok::<Duration, Boom>(c.now() - start)
            }
        };
        let results = rt().block_on(join_all(
            (0..5).map(|_| r.p.coalesce_key("same").run(op)).collect(),
        ));
        for res in &results {
            assert_eq!(res.as_ref().ok(), Some(&ms(10)), "{what}: {results:?}");
        }
        admitted(r.call(Flavor::Sync), ms(10), &what);
        assert!(r.call(Flavor::Sync).is_err(), "{what}");
    }
}

/// Switching shadow mode off by building the pipeline again on the same
/// store (a reload) keeps the limiter's state: "the same limit enforces";
/// while both live they share it, one enforcing, one watching. Partitions
/// of a rebound resource start fresh (documented).
#[test]
fn switching_shadow_off_keeps_the_limiters_state() {
    for (flavor, listen, start, what) in cases() {
        let mut limiters = each_algorithm(2, secs(1)).to_vec();
        limiters.push(RateLimiter::sliding_window(2, secs(1)).max_wait(ms(1)));
        for limiter in limiters {
            let what = format!("{what} {limiter:?}");
            let store = MemoryStore::new();
            let clock = VirtualClock::starting_at(start);
            let name = unique("rl-reload");
            // One log for both pipelines (so not `support::recorder`).
            let shadowed: Log = Arc::default();
            let make = |shadow: bool| {
                let mut b = Pipeline::builder(name.clone())
                    .store(store.clone())
                    .clock(clock.clone())
                    .rate_limiter(limiter.clone().shadow(shadow));
                if listen || shadow {
                    let l = Arc::clone(&shadowed);
                    b = b.on_event(move |e: &Event<'_>| l.lock().unwrap().push(e.kind.clone()));
                }
                b.build().unwrap()
            };
            let any_shadow_refusal = || {
                shadowed
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|e| matches!(e, EventKind::ShadowRejected { .. }))
            };
            let watching = make(true);
            assert!(call_ok(&watching, flavor).is_ok(), "{what}");
            assert!(call_ok(&watching, flavor).is_ok(), "{what}");
            assert!(!any_shadow_refusal(), "{what}");
            let enforcing = make(false);
            let e = call_ok(&enforcing, flavor).unwrap_err();
            assert_eq!(
                e.rejection().map(|r| r.reason),
                Some(RejectionReason::RateLimited),
                "{what}"
            );
            assert!(call_ok(&watching, flavor).is_ok(), "{what}");
            assert!(any_shadow_refusal(), "{what}");
            drop(watching);
            let e = call_ok(&enforcing, flavor).unwrap_err();
            assert!(e.is_rejected(), "{what}");
        }
    }
}

/// Fixed windows are aligned on multiples of the period from the clock's
/// origin, also for a period that does not divide the clock's reading.
#[test]
fn fixed_windows_align_on_multiples_of_an_odd_period() {
    for (flavor, listen, start, what) in cases() {
        let r = Rig::new(RateLimiter::fixed_window(1, secs(7)), start, listen);
        admitted(r.call(flavor), Duration::ZERO, &what);
        // 10^9 s = 142,857,142 x 7 s + 6 s: the window ends 1 s later.
        let left = secs(7) - Duration::from_secs(start.as_secs() % 7);
        refused(r.call(flavor), Some(left), &what);
        r.advance(left);
        admitted(r.call(flavor), left, &what);
    }
}

// ----------------------------------------- differential against a model

/// A plain statement of the three documented rules, one state per key.
#[derive(Debug, Default, Clone)]
struct Model {
    tat: u64,
    window: (u64, u64),
    log: Vec<u64>,
}

impl Model {
    /// `Ok(())` or the refusal's `retry_after` (`None`: never fits).
    fn admit(&mut self, l: &RateLimiter, now: u64, n: u32) -> Result<(), Option<Duration>> {
        use seawall::rate_limit::RateAlgorithm as A;
        let period = l.period.as_nanos() as u64;
        let n64 = u64::from(n);
        match l.algorithm {
            A::Gcra => {
                let t = l.emission_interval().as_nanos() as u64;
                let tau = t * u64::from(l.burst - 1);
                if (n64 - 1) * t > tau {
                    return Err(None);
                }
                let start = self.tat.max(now);
                let wait = (start - now + (n64 - 1) * t).saturating_sub(tau);
                if wait > 0 {
                    return Err(Some(Duration::from_nanos(wait)));
                }
                self.tat = start + n64 * t;
                Ok(())
            }
            A::FixedWindow => {
                if n > l.limit {
                    return Err(None);
                }
                let index = now / period;
                if self.window.0 != index {
                    self.window = (index, 0);
                }
                if self.window.1 + n64 > u64::from(l.limit) {
                    return Err(Some(Duration::from_nanos((index + 1) * period - now)));
                }
                self.window.1 += n64;
                Ok(())
            }
            _ => {
                if n > l.limit {
                    return Err(None);
                }
                self.log.retain(|&t| now - t < period);
                let room = u64::from(l.limit) - self.log.len() as u64;
                if n64 > room {
                    // The entry `limit - n + 1` places back from the newest.
                    let depth = (l.limit - n + 1) as usize;
                    let judged = self.log[self.log.len() - depth];
                    return Err(Some(Duration::from_nanos(judged + period - now)));
                }
                self.log.extend(std::iter::repeat_n(now, n as usize));
                Ok(())
            }
        }
    }
}

/// The keys of the model tests: unpartitioned, "a" and "b".
const KEYS: [Option<&str>; 3] = [None, Some("a"), Some("b")];

/// A xorshift64 generator: `next(bound)` is below `bound`.
fn xorshift(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |bound| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % bound
    }
}

/// One random call of the model tests, for `check` to make.
struct Step<'a> {
    r: &'a Rig,
    flavor: Flavor,
    limiter: &'a RateLimiter,
    what: &'a str,
    step: u32,
    /// The model of the call's key.
    model: &'a mut Model,
    key: Option<&'static str>,
    weight: Option<u32>,
}

/// For every case and limiter, 300 random calls, each key with its own
/// model: the clock moves on by up to 40 ms, then a key and a weight are
/// drawn (`None`: unweighted; up to one more than the largest that fits),
/// and `check` makes the call. One generator, from `seed`, runs through
/// them all.
fn against_the_model(limiters: &[RateLimiter], seed: u64, mut check: impl FnMut(Step<'_>)) {
    let mut next = xorshift(seed);
    for (flavor, listen, start, what) in cases() {
        for limiter in limiters {
            let what = format!("{what} {limiter:?}");
            let r = Rig::new(limiter.clone(), start, listen);
            let mut models: [Model; 3] = Default::default();
            let largest = u64::from(limiter.limit.max(limiter.burst)) + 1;
            for step in 0..300 {
                r.advance(Duration::from_micros(next(40_000)));
                let k = next(3) as usize;
                let weight = if next(3) == 0 {
                    None
                } else {
                    Some(1 + next(largest) as u32)
                };
                check(Step {
                    r: &r,
                    flavor,
                    limiter,
                    what: &what,
                    step,
                    model: &mut models[k],
                    key: KEYS[k],
                    weight,
                });
            }
        }
    }
}

/// A call's admission time, or the `retry_after` of its refusal, which
/// must be the rate limiter's.
#[track_caller]
fn retry_after_of(
    r: Result<Duration, Rejection>,
    what: &str,
) -> Result<Duration, Option<Duration>> {
    match r {
        Ok(at) => Ok(at),
        Err(rej) => {
            assert_eq!(rej.reason, RejectionReason::RateLimited, "{what}");
            Err(rej.retry_after)
        }
    }
}

/// Random sequences of waits, weights (some too large) and keys: every
/// decision and every `retry_after` of the pipeline is the model's, sync
/// and async, with and without a listener, at 0 and far from 0.
#[test]
fn decisions_match_a_plain_model_of_the_documented_rules() {
    let limiters = [
        RateLimiter::gcra(3, ms(90)),
        RateLimiter::gcra(5, ms(100)).burst(2),
        RateLimiter::gcra(2, ms(100)).burst(6),
        RateLimiter::gcra(7, ms(100)).burst(1),
        RateLimiter::fixed_window(4, ms(100)),
        RateLimiter::fixed_window(1, ms(30)),
        RateLimiter::sliding_window(4, ms(100)),
        RateLimiter::sliding_window(1, ms(30)),
        RateLimiter::sliding_window(6, ms(70)),
        // A ring of more than one chunk of slots, weights across laps.
        RateLimiter::sliding_window(5_000, ms(100)),
        RateLimiter::gcra(5_000, ms(100)),
        RateLimiter::fixed_window(5_000, ms(100)),
    ];
    against_the_model(&limiters, 0x9e37_79b9_7f4a_7c15, |s| {
        let now = s.r.clock.now().as_nanos() as u64;
        let want = s.model.admit(s.limiter, now, s.weight.unwrap_or(1));
        let got = retry_after_of(s.r.go(s.flavor, s.key, s.weight), s.what).map(|_| ());
        assert_eq!(
            got,
            want,
            "{}: step {}, key {:?}, weight {:?}, at {:?}",
            s.what,
            s.step,
            s.key,
            s.weight,
            s.r.elapsed()
        );
    });
}

/// The same with `max_wait`: a call whose permit is at most `max_wait` away
/// waits for it and runs then (one caller at a time: no queue), any other
/// is refused at once with the model's `retry_after`.
#[test]
fn waits_match_a_plain_model_of_the_documented_rules() {
    let max_wait = ms(40);
    let limiters = [
        RateLimiter::gcra(3, ms(90)),
        RateLimiter::gcra(5, ms(100)).burst(2),
        RateLimiter::gcra(2, ms(100)).burst(6),
        RateLimiter::fixed_window(4, ms(100)),
        RateLimiter::fixed_window(1, ms(30)),
        RateLimiter::sliding_window(4, ms(100)),
        RateLimiter::sliding_window(6, ms(70)),
    ]
    .map(|l| l.max_wait(max_wait));
    against_the_model(&limiters, 0x2545_f491_4f6c_dd1d, |s| {
        let n = s.weight.unwrap_or(1);
        let now = s.r.clock.now().as_nanos() as u64;
        let before = s.r.elapsed();
        let want = match s.model.admit(s.limiter, now, n) {
            Ok(()) => Ok(before),
            Err(Some(w)) if w <= max_wait => {
                let at = now + w.as_nanos() as u64;
                assert_eq!(s.model.admit(s.limiter, at, n), Ok(()), "model");
                Ok(before + w)
            }
            Err(e) => Err(e),
        };
        let got = retry_after_of(s.r.go(s.flavor, s.key, s.weight), s.what);
        assert_eq!(
            got, want,
            "{}: step {}, key {:?}, weight {:?}, at {before:?}",
            s.what, s.step, s.key, s.weight
        );
        if want.is_err() {
            assert_eq!(s.r.elapsed(), before, "{}: step {}", s.what, s.step);
        }
    });
}

/// Keys are partitions by value: a `String` and a `&'static str` of the
/// same text are one partition; integer keys keep their state when string
/// keys arrive in their shards, and an integer is never the same key as
/// its decimal text.
#[test]
fn partition_keys_are_compared_by_value_whatever_their_kind() {
    for (flavor, listen, start, what) in cases() {
        let r = Rig::new(RateLimiter::gcra(1, secs(10)), start, listen);
        let go = |key: seawall::PartitionKey| {
            exec_on!(r.p.partition(key), flavor, |_| Ok::<_, Boom>(()))
        };
        for i in 0..200u64 {
            assert!(go(i.into()).is_ok(), "{what}: int {i}");
        }
        assert!(go("tenant".into()).is_ok(), "{what}");
        assert!(
            go(String::from("tenant").into()).is_err(),
            "{what}: String key"
        );
        assert!(
            go(Arc::<str>::from("tenant").into()).is_err(),
            "{what}: Arc key"
        );
        for i in 0..200u64 {
            assert!(go(format!("s{i}").into()).is_ok(), "{what}: string {i}");
        }
        for i in 0..200u64 {
            let e = go(i.into()).unwrap_err();
            assert_eq!(
                e.rejection().and_then(|r| r.retry_after),
                Some(secs(10)),
                "{what}: int {i} lost its state"
            );
            assert!(go(i.to_string().into()).is_ok(), "{what}: text of {i}");
        }
        assert_eq!(r.p.partitions(), 200 + 1 + 200 + 200, "{what}");
    }
}

/// Timeouts around a limiter after the retry: an attempt's timeout bounds
/// its wait for a permit; the whole call's timeout ends the retries whose
/// permit would come after it, with the limiter's refusal.
#[test]
fn timeouts_bound_the_permit_waits_of_attempts() {
    for (flavor, listen, start, what) in cases() {
        let limiter = RateLimiter::gcra(1, secs(1)).max_wait(secs(5));
        let times = Mutex::new(Vec::new());
        let run = |r: &Rig| {
            times.lock().unwrap().clear();
            exec(&r.p, flavor, |_ctx| {
                times.lock().unwrap().push(r.elapsed());
                Err::<(), _>(Boom(0))
            })
        };
        let refused_after_1s = |res: &Result<(), Error<Boom>>| matches!(res, Err(Error::Rejected(rej)) if rej.reason == RejectionReason::RateLimited && rej.retry_after == Some(secs(1)));
        // Each attempt may wait 500 ms: the second is refused at once.
        let r = Rig::with(
            |b| {
                b.retry(three_attempts())
                    .timeout(ms(500))
                    .rate_limiter(limiter.clone())
            },
            start,
            listen,
        );
        let res = run(&r);
        assert!(refused_after_1s(&res), "{what}: {res:?}");
        assert_eq!(*times.lock().unwrap(), vec![ms(0)], "{what}");
        assert_eq!(r.elapsed(), Duration::ZERO, "{what}");

        // The whole call has 1.5 s: the second attempt waits until 1 s, the
        // third would run at 2 s and is refused at once.
        let r = Rig::with(
            |b| {
                b.timeout(ms(1500))
                    .retry(three_attempts())
                    .rate_limiter(limiter.clone())
            },
            start,
            listen,
        );
        let res = run(&r);
        assert!(refused_after_1s(&res), "{what}: {res:?}");
        assert_eq!(*times.lock().unwrap(), vec![ms(0), secs(1)], "{what}");
        assert_eq!(r.elapsed(), secs(1), "{what}");
    }
}

/// governor `multiple` across threads: thirty callers on a multi-threaded
/// runtime (and thirty blocking threads) waiting on `gcra(10, 1 s)` with
/// `max_wait(5 s)` are all admitted, none before its turn: the k-th
/// admission (0-based) runs no earlier than (k - 9) x 100 ms.
#[test]
fn waiters_on_many_threads_are_all_admitted_in_turn() {
    for (listen, start, what) in listen_starts() {
        for blocking in [false, true] {
            let what = format!("{what} blocking={blocking}");
            let r = Rig::new(
                RateLimiter::gcra(10, secs(1)).max_wait(secs(5)),
                start,
                listen,
            );
            let times: Vec<Result<Duration, String>> = if blocking {
                std::thread::scope(|s| {
                    let handles: Vec<_> = (0..30)
                        .map(|_| s.spawn(|| r.call(Flavor::Sync).map_err(|e| format!("{e:?}"))))
                        .collect();
                    handles.into_iter().map(|h| h.join().unwrap()).collect()
                })
            } else {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_time()
                    .build()
                    .unwrap();
                runtime.block_on(async {
                    let mut set = tokio::task::JoinSet::new();
                    for _ in 0..30 {
                        let p = r.p.clone();
                        let clock = r.clock.clone();
                        set.spawn(async move {
                            p.run(|_ctx| {
                                let t = clock.now() - start;
                                async move { Ok::<Duration, Boom>(t) }
                            })
                            .await
                            .map_err(|e| format!("{e:?}"))
                        });
                    }
                    let mut out = Vec::new();
                    while let Some(x) = set.join_next().await {
                        out.push(x.unwrap());
                    }
                    out
                })
            };
            let mut ran: Vec<Duration> = times
                .into_iter()
                .map(|t| t.unwrap_or_else(|e| panic!("{what}: refused {e}")))
                .collect();
            ran.sort();
            for (k, t) in ran.iter().enumerate() {
                let earliest = ms((k as u64).saturating_sub(9) * 100);
                assert!(
                    *t >= earliest,
                    "{what}: admission {k} at {t:?} < {earliest:?}"
                );
            }
        }
    }
}
