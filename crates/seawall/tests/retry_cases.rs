//! The retry against what its docs promise, for the
//! behaviours users of backon, tower's retry (and its `Budget`) and Polly's
//! retry check in their own suites: the delay sequence of each backoff, the
//! cap, how attempts are counted, jitter bounds, retry-after hints, which
//! errors are retried, the retry budget, a timeout per attempt and for the
//! whole call, cancellation, overflow, and configuration refused at
//! `build()`.
//!
//! Every case drives the public API only, on a virtual clock (started at 0
//! and far from it), sync (`call`) and async (`run`), with and without an
//! event listener where both exist.

mod support;

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::Duration;

use seawall::classify::MAX_RETRY_AFTER;
use seawall::error::TimeoutScope;
use seawall::event::GiveUpReason;
use seawall::pipeline::{Handles, HandlesSync, Kind};
use seawall::testing::{SeededRandom, SequenceRandom, VirtualClock};
use seawall::*;
use support::{clock_at, exec, ms, reason, recorder, rt, secs, unique, Boom, Flavor, Log, FLAVORS};

// ------------------------------------------------------------------ helpers

/// The clock's starting points: 0, and 10^9 s (a process up for decades).
const ORIGINS: [Duration; 2] = [Duration::ZERO, Duration::from_secs(1_000_000_000)];

/// The largest `f64` below 1: the highest draw a `Random` may return.
const TOP: f64 = 1.0 - f64::EPSILON / 2.0;

/// A builder on its own store and a virtual clock at `origin`, recording
/// events when `listen`.
fn builder(name: &str, origin: Duration, listen: bool) -> (PipelineBuilder, VirtualClock, Log) {
    let clock = clock_at(origin);
    let (log, record) = recorder();
    let b = Pipeline::builder(unique(&format!("retry-{name}")))
        .store(MemoryStore::new())
        .clock(clock.clone());
    let b = if listen { b.on_event(record) } else { b };
    (b, clock, log)
}

/// `builder`, configured by `configure` and built.
fn pipeline<K: Kind>(
    name: &str,
    origin: Duration,
    listen: bool,
    configure: impl FnOnce(PipelineBuilder) -> PipelineBuilder<K>,
) -> (Pipeline<K>, VirtualClock, Log) {
    let (b, clock, log) = builder(name, origin, listen);
    (configure(b).build().unwrap(), clock, log)
}

/// A pipeline with `retry` as its only policy.
fn retrying(
    name: &str,
    origin: Duration,
    listen: bool,
    retry: Retry,
) -> (Pipeline, VirtualClock, Log) {
    pipeline(name, origin, listen, |b| b.retry(retry))
}

/// A retry with a 100 ms constant backoff over 3 attempts, then a timeout
/// of 1 s for each attempt.
fn per_attempt_timeout(b: PipelineBuilder) -> PipelineBuilder {
    b.retry(Retry::constant(ms(100)).max_attempts(3))
        .timeout(secs(1))
}

/// A constant backoff of `delay` over at most `attempts`, drawing on `budget`.
fn budgeted(delay: Duration, attempts: u32, budget: RetryBudget) -> Retry {
    Retry::constant(delay).max_attempts(attempts).budget(budget)
}

/// Every combination of flavor, listener and clock origin.
fn matrix() -> Vec<(Flavor, bool, Duration)> {
    let mut v = Vec::new();
    for f in FLAVORS {
        for listen in [false, true] {
            for o in ORIGINS {
                v.push((f, listen, o));
            }
        }
    }
    v
}

/// What a call that failed `fail` times saw: each attempt's number and the
/// clock when it started, and the result.
struct Seen {
    starts: Vec<(u32, Duration)>,
    result: Result<u32, Error<Boom>>,
}

impl Seen {
    fn attempts(&self) -> u32 {
        self.starts.len() as u32
    }
    /// The gaps between the starts of consecutive attempts (the waits).
    fn gaps(&self) -> Vec<Duration> {
        self.starts.windows(2).map(|w| w[1].1 - w[0].1).collect()
    }
}

/// A call whose attempts fail with `Boom(n)` (n the attempt number) until
/// attempt `ok_at` (never when `None`), which returns `Ok(n)`.
fn call_failing<K>(
    p: &Pipeline<K>,
    clock: &VirtualClock,
    flavor: Flavor,
    ok_at: Option<u32>,
) -> Seen
where
    K: HandlesSync<u32, Boom>,
{
    let mut starts = Vec::new();
    let result = exec(p, flavor, |ctx: Context| {
        let n = ctx.attempt();
        starts.push((n, clock.now()));
        if Some(n) == ok_at {
            Ok(n)
        } else {
            Err(Boom(n))
        }
    });
    Seen { starts, result }
}

/// What `look` saw of each attempt's context, in a call whose attempts all
/// fail.
fn each_attempt<K, V>(p: &Pipeline<K>, flavor: Flavor, look: impl Fn(&Context) -> V) -> Vec<V>
where
    K: HandlesSync<(), Boom>,
{
    let mut seen = Vec::new();
    let _ = exec(p, flavor, |ctx: Context| {
        seen.push(look(&ctx));
        Err::<(), _>(Boom(ctx.attempt()))
    });
    seen
}

/// An async call whose attempt `n`, with `(sleep, result) = plan(n)`, sleeps
/// `sleep` on `clock` (when `Some`), then returns `result`.
fn run_sleeping<K>(
    p: &Pipeline<K>,
    clock: &VirtualClock,
    plan: impl Fn(u32) -> (Option<Duration>, Result<u32, Boom>),
) -> Result<u32, Error<Boom>>
where
    K: Handles<u32, Boom>,
{
    rt().block_on(p.run(|ctx| {
        let (sleep, result) = plan(ctx.attempt());
        let c = clock.clone();
        async move {
            if let Some(d) = sleep {
                Clock::sleep(&c, d).await;
            }
            result
        }
    }))
}

/// The call ran `n` attempts and ended with attempt `n`'s error as the
/// operation returned it: it was not retried.
fn assert_not_retried_after(seen: &Seen, n: u32, what: &str) {
    assert_eq!(seen.attempts(), n, "{what}");
    assert!(
        matches!(seen.result, Err(Error::Operation(Boom(m))) if m == n),
        "{what}: {:?}",
        seen.result
    );
}

/// The call gave up after `n` attempts with attempt `n`'s error.
fn assert_exhausted(result: &Result<u32, Error<Boom>>, n: u32, what: &str) {
    assert!(
        matches!(result, Err(Error::RetryExhausted { attempts, last: Boom(m) }) if *attempts == n && *m == n),
        "{what}: {result:?}"
    );
}

/// The call timed out in `scope`, after `after`, at attempt `attempts`.
fn assert_timed_out(
    result: &Result<u32, Error<Boom>>,
    scope: TimeoutScope,
    after: Duration,
    attempts: u32,
) {
    match result {
        Err(Error::Timeout(t)) => {
            assert_eq!((t.scope, t.after, t.attempts), (scope, after, attempts))
        }
        other => panic!("{other:?}"),
    }
}

/// One call whose attempts all fail: it ran `attempts`, and left `tokens`
/// in `budget`.
fn assert_call_leaves<K>(
    p: &Pipeline<K>,
    clock: &VirtualClock,
    flavor: Flavor,
    budget: &RetryBudget,
    attempts: u32,
    tokens: f64,
    what: &str,
) -> Seen
where
    K: HandlesSync<u32, Boom>,
{
    let seen = call_failing(p, clock, flavor, None);
    assert_eq!(seen.attempts(), attempts, "{what}");
    assert_eq!(budget.tokens(), tokens, "{what}");
    seen
}

/// The recorded events `pick` picks, in order.
fn events<V>(log: &Log, pick: impl Fn(&EventKind) -> Option<V>) -> Vec<V> {
    log.lock().unwrap().iter().filter_map(pick).collect()
}

fn scheduled(log: &Log) -> Vec<Duration> {
    events(log, |e| match e {
        EventKind::RetryScheduled { delay, .. } => Some(*delay),
        _ => None,
    })
}

fn gave_up(log: &Log) -> Vec<(u32, GiveUpReason)> {
    events(log, |e| match e {
        EventKind::RetryGaveUp { attempts, reason } => Some((*attempts, *reason)),
        _ => None,
    })
}

type Hooked = Arc<Mutex<Vec<(u32, u32, Duration)>>>;

/// An `on_retry` hook recording, for each retry, the error's number, the
/// failed attempt's number and the wait.
fn hook() -> (
    Hooked,
    impl Fn(&Boom, u32, Duration) + Send + Sync + 'static,
) {
    let hooked = Hooked::default();
    let h = hooked.clone();
    (hooked, move |e: &Boom, attempt, delay| {
        h.lock().unwrap().push((e.0, attempt, delay))
    })
}

fn nanos(d: Duration) -> u128 {
    d.as_nanos()
}

// ------------------------------------------------- backoff delay sequences

/// backon's constant / Polly's constant, linear and exponential: the exact
/// delays, on every path, near and far from the clock's origin.
#[test]
fn backoff_sequences_are_exact_on_every_path() {
    let cases: Vec<(Retry, Vec<Duration>)> = vec![
        (Retry::constant(ms(250)), vec![ms(250); 5]),
        (
            Retry::linear(ms(100)),
            vec![ms(100), ms(200), ms(300), ms(400), ms(500)],
        ),
        (
            Retry::linear(ms(100)).cap(ms(250)),
            vec![ms(100), ms(200), ms(250), ms(250), ms(250)],
        ),
        (
            Retry::exponential(ms(100)),
            vec![ms(100), ms(200), ms(400), ms(800), ms(1600)],
        ),
        (
            Retry::exponential(ms(100)).multiplier(3.0),
            vec![ms(100), ms(300), ms(900), ms(2700), ms(8100)],
        ),
        (
            Retry::exponential(ms(100)).multiplier(3.0).cap(secs(2)),
            vec![ms(100), ms(300), ms(900), secs(2), secs(2)],
        ),
        (Retry::exponential(secs(1)).cap(secs(1)), vec![secs(1); 5]),
        (Retry::exponential(ms(10)).multiplier(1.0), vec![ms(10); 5]),
    ];
    for (retry, want) in cases {
        for (flavor, listen, origin) in matrix() {
            let (p, clock, log) = retrying("seq", origin, listen, retry.clone().max_attempts(6));
            let seen = call_failing(&p, &clock, flavor, None);
            let ctx = format!("{retry:?} {flavor:?} listen={listen} origin={origin:?}");
            assert_eq!(seen.attempts(), 6, "{ctx}");
            assert_eq!(seen.gaps(), want, "{ctx}");
            assert_eq!(clock.now() - origin, want.iter().sum::<Duration>(), "{ctx}");
            assert_exhausted(&seen.result, 6, &ctx);
            if listen {
                assert_eq!(scheduled(&log), want, "{ctx}");
            }
            // `Retry::delay` states the same sequence (attempt is 1-based).
            let r = SeededRandom::new(7);
            let mut prev = Duration::ZERO;
            for (i, w) in want.iter().enumerate() {
                let d = retry.delay(i as u32 + 1, prev, &r);
                assert_eq!(d, *w, "{ctx}: Retry::delay({})", i + 1);
                prev = d;
            }
        }
    }
}

/// A fractional multiplier (Polly's exponential factor, backon's factor).
#[test]
fn fractional_multiplier_sequence() {
    let r = SeededRandom::new(1);
    let retry = Retry::exponential(ms(1000)).multiplier(1.5).cap(ms(4000));
    let got: Vec<_> = (1..=6)
        .map(|n| retry.delay(n, Duration::ZERO, &r))
        .collect();
    assert_eq!(
        got,
        [ms(1000), ms(1500), ms(2250), ms(3375), ms(4000), ms(4000)]
    );
}

#[test]
fn a_zero_base_retries_at_once() {
    for (flavor, listen, origin) in matrix() {
        for retry in [
            Retry::constant(Duration::ZERO),
            Retry::linear(Duration::ZERO),
            Retry::exponential(Duration::ZERO).jitter(Jitter::Proportional(50.0)),
        ] {
            let (p, clock, _) = retrying("zero", origin, listen, retry.max_attempts(4));
            assert_eq!(call_failing(&p, &clock, flavor, None).attempts(), 4);
            assert_eq!(clock.now(), origin);
        }
    }
}

// ------------------------------------------------------------ max attempts

/// `max_attempts` counts the first call (backon's `max_times` and Polly's
/// `MaxRetryAttempts` count retries only: documented difference).
#[test]
fn max_attempts_counts_the_first_call() {
    for (flavor, listen, origin) in matrix() {
        for n in [1u32, 2, 3, 7] {
            let retry = Retry::constant(ms(10)).max_attempts(n);
            let (p, clock, log) = retrying("count", origin, listen, retry);
            let seen = call_failing(&p, &clock, flavor, None);
            let numbers: Vec<u32> = seen.starts.iter().map(|s| s.0).collect();
            assert_eq!(numbers, (1..=n).collect::<Vec<_>>());
            assert_eq!(clock.now() - origin, ms(10) * (n - 1));
            assert_exhausted(&seen.result, n, &format!("{flavor:?} n={n}"));
            if listen {
                assert_eq!(scheduled(&log).len() as u32, n - 1);
                // Running out of attempts is not "giving up early".
                assert!(gave_up(&log).is_empty());
            }
        }
    }
}

#[test]
fn a_success_ends_the_retries() {
    for (flavor, listen, origin) in matrix() {
        let retry = Retry::exponential(ms(100)).max_attempts(5);
        let (p, clock, _) = retrying("succeed", origin, listen, retry);
        let seen = call_failing(&p, &clock, flavor, Some(3));
        assert_eq!(seen.attempts(), 3);
        assert_eq!(seen.result.unwrap(), 3);
        assert_eq!(clock.now() - origin, ms(300));
    }
}

#[test]
fn only_the_first_attempt_is_first() {
    for flavor in FLAVORS {
        let retry = Retry::constant(ms(1)).max_attempts(3);
        let (p, _, _) = retrying("first", ORIGINS[1], false, retry);
        let firsts = each_attempt(&p, flavor, |ctx| ctx.is_first_attempt());
        assert_eq!(firsts, [true, false, false]);
    }
}

// ------------------------------------------------------------------ jitter

/// `[lo, hi]` of `Jitter` on `delay`, as the docs state it, in nanoseconds
/// (exact arithmetic; `p` a whole percentage).
fn documented(jitter: Jitter, delay: Duration) -> (u128, u128) {
    let d = nanos(delay);
    match jitter {
        Jitter::None => (d, d),
        Jitter::Full => (0, d),
        Jitter::Equal => (d / 2, d),
        Jitter::Proportional(p) => {
            let p = p as u128;
            (d * (100 - p) / 100, (d * (100 + p)).div_ceil(100))
        }
        _ => unreachable!(),
    }
}

const JITTERS: [Jitter; 6] = [
    Jitter::None,
    Jitter::Full,
    Jitter::Equal,
    Jitter::Proportional(10.0),
    Jitter::Proportional(50.0),
    Jitter::Proportional(100.0),
];

/// backon's and Polly's jitter tests draw many times and check the range:
/// every draw of every jitter lies in the documented range, and the draws
/// spread over it.
#[test]
fn jittered_delays_stay_in_the_documented_range_over_many_draws() {
    let delays = [
        Duration::from_nanos(1),
        Duration::from_nanos(7),
        ms(1),
        ms(333),
        secs(1) + Duration::from_nanos(1),
        secs(3600),
        secs(86_400 * 30) + Duration::from_nanos(999_999_999),
    ];
    for jitter in JITTERS {
        for delay in delays {
            let (lo, hi) = documented(jitter, delay);
            let r = SeededRandom::new(0x5eed ^ nanos(delay) as u64);
            let (mut min, mut max, mut sum) = (u128::MAX, 0u128, 0u128);
            const N: u128 = 10_000;
            for _ in 0..N {
                let d = nanos(jitter.apply(delay, &r));
                assert!(
                    lo <= d && d <= hi,
                    "{jitter:?} on {delay:?}: {d} ns not in [{lo}, {hi}]"
                );
                min = min.min(d);
                max = max.max(d);
                sum += d;
            }
            // The stated bounds of `Jitter::bounds` agree with the docs.
            let (blo, bhi) = jitter.bounds(delay);
            assert!(
                nanos(blo).abs_diff(lo) <= 1 && nanos(bhi).abs_diff(hi) <= 1,
                "{jitter:?} on {delay:?}: bounds {blo:?}..{bhi:?}"
            );
            // Spread: uniform draws reach near both ends, mean near the middle.
            let width = hi - lo;
            if width >= 1000 {
                assert!(min - lo <= width / 50, "{jitter:?} {delay:?}: min {min}");
                assert!(hi - max <= width / 50, "{jitter:?} {delay:?}: max {max}");
                let mean = sum / N;
                let mid = lo + width / 2;
                assert!(
                    mean.abs_diff(mid) <= width / 20,
                    "{jitter:?} {delay:?}: mean {mean}"
                );
            }
        }
    }
}

/// The extreme draws (0 and the largest value below 1) land on or inside
/// the documented ends, for small and very large delays alike.
#[test]
fn extreme_draws_stay_in_the_documented_range() {
    let delays = [
        ms(1),
        secs(1) + Duration::from_nanos(1),
        secs(86_400 * 365) + Duration::from_nanos(123_456_789),
        secs(1_000_000_000) + Duration::from_nanos(1),
        secs(1_000_000_000) + Duration::from_nanos(999_999_999),
        secs(1 << 40) + Duration::from_nanos(777_777_777),
    ];
    let mut bad = Vec::new();
    for jitter in JITTERS {
        for delay in delays {
            let (lo, hi) = documented(jitter, delay);
            for draw in [0.0, 0.5, TOP] {
                let r = SequenceRandom::new([draw]);
                let d = nanos(jitter.apply(delay, &r));
                if !(lo <= d && d <= hi) {
                    bad.push(format!(
                        "{jitter:?} on {delay:?} with draw {draw}: {d} ns not in [{lo}, {hi}] (under by {}, over by {})",
                        lo.saturating_sub(d),
                        d.saturating_sub(hi)
                    ));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} draws out of range:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

/// `Retry::cap`: "full and equal jitter never wait longer than the cap, a
/// Jitter::Proportional of p % may wait up to p % beyond it".
#[test]
fn jittered_delays_respect_the_cap_as_documented() {
    let caps = [
        secs(30),
        secs(86_400 * 365) + Duration::from_nanos(1),
        secs(1_000_000_000) + Duration::from_nanos(1),
        secs(1_000_000_000) + Duration::from_nanos(999_999_999),
    ];
    let mut bad = Vec::new();
    for cap in caps {
        for jitter in [Jitter::Full, Jitter::Equal, Jitter::Proportional(20.0)] {
            let retry = Retry::exponential(secs(1)).cap(cap).jitter(jitter);
            let limit = match jitter {
                Jitter::Proportional(p) => (nanos(cap) * (100 + p as u128)).div_ceil(100),
                _ => nanos(cap),
            };
            for draw in [0.0, 0.5, 0.9, TOP] {
                let r = SequenceRandom::new([draw]);
                for attempt in [1, 10, 40, 64, 1000, u32::MAX] {
                    let d = retry.delay(attempt, cap, &r);
                    if nanos(d) > limit {
                        bad.push(format!(
                            "{jitter:?} cap {cap:?} draw {draw} attempt {attempt}: {d:?} over the limit by {} ns",
                            nanos(d) - limit
                        ));
                    }
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} delays over the limit:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

/// The README's example: a clock far from 0, full jitter with a draw of
/// 0.5 waits half the delay.
#[test]
fn sequence_random_makes_jitter_exact() {
    for (flavor, listen, origin) in matrix() {
        let (p, clock, log) = pipeline("exact-jitter", origin, listen, |b| {
            b.retry(
                Retry::exponential(secs(1))
                    .max_attempts(4)
                    .jitter(Jitter::Full),
            )
            .random(SequenceRandom::new([0.5, 0.25]))
        });
        let seen = call_failing(&p, &clock, flavor, None);
        // 1 s x 0.5, 2 s x 0.25, 4 s x 0.5.
        let want = vec![ms(500), ms(500), secs(2)];
        assert_eq!(seen.gaps(), want);
        if listen {
            assert_eq!(scheduled(&log), want);
        }
    }
}

/// Through the pipeline, with seeded randomness: each wait lies in the
/// jitter's range around the backoff's delay, and the event, the hook and
/// the clock agree on it.
#[test]
fn jittered_waits_in_a_pipeline_lie_in_range_and_agree_with_events() {
    for (flavor, _, origin) in matrix() {
        for jitter in JITTERS {
            for seed in 0..20u64 {
                let (hooked, on_retry) = hook();
                let (p, clock, log) = pipeline("jitter-pipe", origin, true, |b| {
                    b.retry(
                        Retry::exponential(ms(100))
                            .cap(secs(1))
                            .max_attempts(8)
                            .jitter(jitter),
                    )
                    .random(SeededRandom::new(seed))
                    .on_retry(on_retry)
                });
                let seen = call_failing(&p, &clock, flavor, None);
                let gaps = seen.gaps();
                assert_eq!(gaps, scheduled(&log));
                let hooked: Vec<Duration> = hooked.lock().unwrap().iter().map(|h| h.2).collect();
                assert_eq!(gaps, hooked);
                for (i, g) in gaps.iter().enumerate() {
                    let raw = Retry::exponential(ms(100)).cap(secs(1)).delay(
                        i as u32 + 1,
                        Duration::ZERO,
                        &SeededRandom::new(0),
                    );
                    let (lo, hi) = documented(jitter, raw);
                    assert!(
                        lo <= nanos(*g) && nanos(*g) <= hi,
                        "{jitter:?} seed {seed} retry {}: {g:?} not in [{lo}, {hi}]",
                        i + 1
                    );
                }
            }
        }
    }
}

/// AWS decorrelated jitter: each delay in `[base, previous x 3]`, capped
/// (the first from `[base, 3 x base]`).
#[test]
fn decorrelated_delays_stay_between_base_and_three_times_the_previous() {
    let (base, cap) = (ms(100), secs(5));
    for (flavor, listen, origin) in matrix() {
        for seed in 0..30u64 {
            let (p, clock, log) = pipeline("decorrelated", origin, listen, |b| {
                b.retry(Retry::decorrelated(base, cap).max_attempts(12))
                    .random(SeededRandom::new(seed))
            });
            let seen = call_failing(&p, &clock, flavor, None);
            let gaps = seen.gaps();
            assert_eq!(gaps.len(), 11);
            let mut prev = base;
            for g in &gaps {
                let hi = (prev * 3).min(cap);
                assert!(
                    base <= *g && *g <= hi,
                    "seed {seed}: {g:?} not in [{base:?}, {hi:?}]"
                );
                prev = *g;
            }
            if listen {
                assert_eq!(scheduled(&log), gaps);
            }
        }
    }
}

// ---------------------------------------------------------- retry-after hint

/// "honours the classifier's retry-after hint (waiting at least that
/// long)": a floor on the backoff (Polly's retry-after replaces the delay:
/// documented difference), beyond the cap too, cut to `MAX_RETRY_AFTER`.
#[test]
fn a_retry_after_hint_is_a_floor_on_the_wait() {
    let cases = [
        // (backoff, hint, expected wait)
        (Retry::constant(secs(1)), secs(5), secs(5)),
        (Retry::constant(secs(1)), ms(100), secs(1)),
        (Retry::exponential(secs(1)).cap(secs(2)), secs(30), secs(30)),
        (Retry::constant(secs(1)), secs(7200), MAX_RETRY_AFTER),
        (Retry::constant(Duration::ZERO), ms(1), ms(1)),
    ];
    for (retry, hint, want) in cases {
        for (flavor, listen, origin) in matrix() {
            for verdict in [Verdict::retry(), Verdict::throttled()] {
                let (p, clock, log) = pipeline("hint", origin, listen, |b| {
                    b.retry(retry.clone().max_attempts(2))
                        .classify(move |_: &Boom| verdict.with_retry_after(hint))
                });
                let seen = call_failing(&p, &clock, flavor, None);
                let ctx = format!("{retry:?} hint {hint:?} {verdict:?} {flavor:?} {origin:?}");
                assert_eq!(seen.attempts(), 2, "{ctx}");
                assert_eq!(seen.gaps(), [want], "{ctx}");
                if listen {
                    assert_eq!(scheduled(&log), [want], "{ctx}");
                }
            }
        }
    }
}

/// A jittered backoff below the hint still waits at least the hint.
#[test]
fn a_retry_after_hint_is_a_floor_under_jitter() {
    for flavor in FLAVORS {
        for seed in 0..20 {
            let (p, clock, _) = pipeline("hint-jitter", ORIGINS[1], false, |b| {
                b.retry(
                    Retry::constant(secs(2))
                        .jitter(Jitter::Full)
                        .max_attempts(3),
                )
                .random(SeededRandom::new(seed))
                .classify(|_: &Boom| Verdict::retry().with_retry_after(secs(1)))
            });
            let seen = call_failing(&p, &clock, flavor, None);
            for g in seen.gaps() {
                assert!(secs(1) <= g && g <= secs(2), "{g:?}");
            }
        }
    }
}

/// A hint on an error that is not retried does not make it retried.
#[test]
fn a_hint_on_an_error_that_is_not_retried_is_not_waited() {
    for (flavor, listen, origin) in matrix() {
        for verdict in [Verdict::failure(), Verdict::abort(), Verdict::ignore()] {
            let (p, clock, _) = pipeline("hint-no", origin, listen, |b| {
                b.retry(Retry::constant(ms(10)).max_attempts(3))
                    .classify(move |_: &Boom| verdict.with_retry_after(secs(5)))
            });
            let seen = call_failing(&p, &clock, flavor, None);
            assert_not_retried_after(&seen, 1, &format!("{verdict:?}"));
            assert_eq!(clock.now(), origin);
        }
    }
}

/// A hint whose wait would not end by the call's deadline ends the call at
/// once with the real last error; one that ends exactly at it fits.
#[test]
fn a_hint_past_the_deadline_gives_up_with_the_last_error() {
    for (flavor, listen, origin) in matrix() {
        // A call with a 10 s deadline whose errors all hint `hint`.
        let hinted = |name: &str, hint: Duration| {
            let (p, clock, log) = pipeline(name, origin, listen, |b| {
                b.timeout(secs(10))
                    .retry(Retry::constant(ms(1)).max_attempts(3))
                    .classify(move |_: &Boom| Verdict::retry().with_retry_after(hint))
            });
            (call_failing(&p, &clock, flavor, None), clock, log)
        };
        let (seen, clock, log) = hinted("hint-deadline", secs(11));
        assert_eq!(seen.attempts(), 1);
        assert_exhausted(&seen.result, 1, "");
        assert_eq!(clock.now(), origin, "gave up without waiting");
        if listen {
            assert_eq!(gave_up(&log), [(1, GiveUpReason::Deadline)]);
        }
        // Exactly at the deadline: fits.
        let (seen, _, _) = hinted("hint-deadline-fit", secs(10));
        assert_eq!(
            seen.attempts(),
            2,
            "{flavor:?} {origin:?}: {:?}",
            seen.result
        );
        assert_eq!(seen.gaps(), [secs(10)]);
    }
}

// ---------------------------------------------------------- classification

#[test]
fn which_errors_are_retried() {
    for (flavor, listen, origin) in matrix() {
        let attempts = |n| Retry::constant(ms(1)).max_attempts(n);
        // Default: every error is a retryable failure.
        let (p, clock, _) = retrying("cls-default", origin, listen, attempts(3));
        assert_eq!(call_failing(&p, &clock, flavor, None).attempts(), 3);
        // The classifier's verdicts.
        for (verdict, retried) in [
            (Verdict::retry(), true),
            (Verdict::throttled(), true),
            (Verdict::failure(), false),
            (Verdict::abort(), false),
            (Verdict::ignore(), false),
        ] {
            let (p, clock, _) = pipeline("cls", origin, listen, |b| {
                b.retry(attempts(3)).classify(move |_: &Boom| verdict)
            });
            let seen = call_failing(&p, &clock, flavor, None);
            if retried {
                assert_eq!(seen.attempts(), 3, "{verdict:?}");
                assert!(matches!(
                    seen.result,
                    Err(Error::RetryExhausted { attempts: 3, .. })
                ));
            } else {
                assert_not_retried_after(&seen, 1, &format!("{verdict:?}"));
            }
        }
        // A classifier by error: attempt 2's error is not retryable.
        let (p, clock, _) = pipeline("cls-by-error", origin, listen, |b| {
            b.retry(attempts(5)).classify(|e: &Boom| {
                if e.0 == 2 {
                    Verdict::failure()
                } else {
                    Verdict::retry()
                }
            })
        });
        let seen = call_failing(&p, &clock, flavor, None);
        assert_not_retried_after(&seen, 2, "by error");
        // retry_if narrows; abort_if wins over it.
        let (p, clock, _) = pipeline("cls-if", origin, listen, |b| {
            b.retry(attempts(5)).retry_if(|e: &Boom| e.0 < 3)
        });
        let seen = call_failing(&p, &clock, flavor, None);
        assert_not_retried_after(&seen, 3, "retry_if");
        let (p, clock, _) = pipeline("cls-abort", origin, listen, |b| {
            b.retry(attempts(5))
                .retry_if(|_: &Boom| true)
                .abort_if(|e: &Boom| e.0 == 2)
        });
        let seen = call_failing(&p, &clock, flavor, None);
        assert_not_retried_after(&seen, 2, "abort_if");
    }
}

// ------------------------------------------------------------ retry budget

/// The tokens left: a call deposits `ratio` (never above the cap), a retry
/// withdraws one, a retry finding less than one is refused with
/// `retry_budget_exhausted`; the bucket starts full.
#[test]
fn the_budget_deposits_per_call_and_withdraws_per_retry() {
    for (flavor, listen, origin) in matrix() {
        let budget = RetryBudget::new(0.5, 2);
        assert_eq!(budget.tokens(), 2.0, "starts full");
        let retry = budgeted(ms(10), 5, budget.clone());
        let (p, clock, log) = retrying("budget", origin, listen, retry);
        let ctx = format!("{flavor:?} listen={listen} {origin:?}");
        // Call 1: full bucket (deposit capped), 2 retries, then refused.
        let seen = assert_call_leaves(&p, &clock, flavor, &budget, 3, 0.0, &ctx);
        assert_eq!(
            reason(&seen.result),
            Some(RejectionReason::RetryBudgetExhausted),
            "{ctx}: {:?}",
            seen.result
        );
        // The refused retry did not wait its backoff (a process budget
        // refuses before it).
        assert_eq!(clock.now() - origin, ms(20), "{ctx}");
        if listen {
            assert_eq!(gave_up(&log), [(3, GiveUpReason::Budget)], "{ctx}");
        }
        // Call 2: deposits 0.5, no retry.
        assert_call_leaves(&p, &clock, flavor, &budget, 1, 0.5, &ctx);
        // Call 3: deposits 0.5 -> 1.0, one retry.
        assert_call_leaves(&p, &clock, flavor, &budget, 2, 0.0, &ctx);
        // Successful calls refill it, up to the cap.
        for i in 1..=10 {
            let seen = call_failing(&p, &clock, flavor, Some(1));
            assert_eq!(seen.result.unwrap(), 1);
            assert_eq!(
                budget.tokens(),
                (0.5 * i as f64).min(2.0),
                "{ctx} success {i}"
            );
        }
    }
}

/// tower's `TpsBudget` refills with time (a TTL window and a minimum of
/// retries per second); seawall's budget earns only from calls: time alone
/// refills nothing (documented difference).
#[test]
fn the_budget_does_not_refill_with_time_alone() {
    for flavor in FLAVORS {
        let budget = RetryBudget::new(0.1, 1);
        let retry = budgeted(ms(10), 3, budget.clone());
        let (p, clock, _) = retrying("budget-time", ORIGINS[1], false, retry);
        assert_call_leaves(&p, &clock, flavor, &budget, 2, 0.0, "");
        clock.advance(secs(3600));
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(seen.attempts(), 1);
        assert_eq!(
            reason(&seen.result),
            Some(RejectionReason::RetryBudgetExhausted)
        );
        assert!((budget.tokens() - 0.1).abs() < 1e-9);
    }
}

/// Clones of a budget share its bucket, across pipelines.
#[test]
fn clones_of_a_budget_share_one_bucket() {
    for flavor in FLAVORS {
        let budget = RetryBudget::new(0.001, 3);
        let retry = budgeted(ms(1), 3, budget.clone());
        let (p1, c1, _) = retrying("budget-a", ORIGINS[0], false, retry.clone());
        let (p2, c2, _) = retrying("budget-b", ORIGINS[1], true, retry);
        assert_eq!(call_failing(&p1, &c1, flavor, None).attempts(), 3);
        assert_eq!(call_failing(&p2, &c2, flavor, None).attempts(), 2);
        assert_eq!(call_failing(&p1, &c1, flavor, None).attempts(), 1);
        assert!(budget.tokens() < 1.0);
    }
}

/// The rule in thousandths: a ratio is earned rounded to the thousandth.
#[test]
fn the_budget_rule_matches_its_docs() {
    let rule = RetryBudget::new(0.1, 10).rule();
    assert_eq!((rule.earn, rule.cap), (100, 10_000));
    assert_eq!(rule.deposited(9_950), 10_000);
    assert_eq!(rule.withdrawn(999), None);
    assert_eq!(rule.withdrawn(1_000), Some(0));
    let r = RetryBudget::new(0.0014, 1).rule();
    assert_eq!(r.earn, 1);
    let r = RetryBudget::new(1000.0, 1).rule();
    assert_eq!(r.earn, 1_000_000);
}

/// A huge budget ratio refills the bucket in one call.
#[test]
fn a_large_ratio_refills_in_one_call() {
    for flavor in FLAVORS {
        let budget = RetryBudget::new(5.0, 4);
        let retry = budgeted(ms(1), 10, budget);
        let (p, clock, _) = retrying("budget-large", ORIGINS[1], false, retry);
        // 4 tokens: 4 retries, then refused.
        assert_eq!(call_failing(&p, &clock, flavor, None).attempts(), 5);
        // The next call deposits 5 (capped at 4): 4 retries again.
        assert_eq!(call_failing(&p, &clock, flavor, None).attempts(), 5);
    }
}

// ------------------------------------------------------------------ timeouts

/// A timeout declared after the retry bounds each attempt (async: the
/// attempt's future is dropped at the deadline), and a timed-out attempt
/// is retried.
#[test]
fn a_timeout_per_attempt_is_retried_async() {
    for (_, listen, origin) in matrix() {
        let (p, clock, log) = pipeline("attempt-timeout", origin, listen, per_attempt_timeout);
        let runs = AtomicU32::new(0);
        let r = run_sleeping(&p, &clock, |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            (Some(secs(10)), Ok(0))
        });
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert_timed_out(&r, TimeoutScope::Attempt, secs(1), 3);
        assert_eq!(clock.now() - origin, secs(3) + ms(200));
        if listen {
            assert_eq!(scheduled(&log), [ms(100), ms(100)]);
        }
        // A slow first attempt, then a quick one: the call succeeds.
        let (p, clock, _) = pipeline("attempt-timeout-ok", origin, listen, per_attempt_timeout);
        let r = run_sleeping(&p, &clock, |n| ((n == 1).then_some(secs(10)), Ok(n)));
        assert_eq!(r.unwrap(), 2);
        assert_eq!(clock.now() - origin, secs(1) + ms(100));
    }
}

/// Sync: each attempt gets a fresh deadline of its own in its context.
#[test]
fn a_timeout_per_attempt_gives_each_attempt_its_own_deadline_sync() {
    for origin in ORIGINS {
        let (p, clock, _) = pipeline("attempt-deadline", origin, false, |b| {
            b.retry(Retry::constant(ms(500)).max_attempts(3))
                .timeout(secs(2))
        });
        let remaining = each_attempt(&p, Flavor::Sync, |ctx| ctx.remaining());
        assert_eq!(remaining, [Some(secs(2)); 3]);
        assert_eq!(clock.now() - origin, secs(1));
    }
}

/// A timeout declared before the retry bounds the whole call: the retry
/// gives up with the last error when the next wait would end after the
/// deadline; a wait ending at the deadline fits.
#[test]
fn a_timeout_for_the_whole_call_bounds_the_retries() {
    for (flavor, listen, origin) in matrix() {
        // A call bounded by `timeout`, retried every 2 s.
        let overall = |name: &str, timeout: Duration| {
            pipeline(name, origin, listen, |b| {
                b.timeout(timeout)
                    .retry(Retry::constant(secs(2)).max_attempts(10))
            })
        };
        let (p, clock, log) = overall("overall", secs(5));
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(seen.attempts(), 3, "{flavor:?} {origin:?}");
        assert_exhausted(&seen.result, 3, "");
        assert_eq!(clock.now() - origin, secs(4));
        if listen {
            assert_eq!(gave_up(&log), [(3, GiveUpReason::Deadline)]);
        }
        let (p, clock, _) = overall("overall-fit", secs(4));
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(
            seen.attempts(),
            3,
            "{flavor:?} {origin:?}: {:?}",
            seen.result
        );
        assert_eq!(clock.now() - origin, secs(4));
        // Each attempt sees the time left of the whole call.
        let (p, _, _) = overall("overall-remaining", secs(5));
        assert_eq!(
            each_attempt(&p, flavor, |ctx| ctx.remaining()),
            [Some(secs(5)), Some(secs(3)), Some(secs(1))]
        );
    }
}

// ------------------------------------------------------------ cancellation

fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    let mut cx = TaskContext::from_waker(Waker::noop());
    f.poll(&mut cx)
}

/// Polls once (pending) an async call whose attempts fail at once, then
/// drops it: the attempts run by then, and their counter.
fn poll_once_then_drop<K: Handles<(), Boom>>(p: &Pipeline<K>) -> (u32, Arc<AtomicU32>) {
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let mut fut = pin!(p.run(move |_ctx| {
        r.fetch_add(1, Ordering::SeqCst);
        async { Err::<(), _>(Boom(0)) }
    }));
    assert!(poll_once(fut.as_mut()).is_pending());
    let before_drop = runs.load(Ordering::SeqCst);
    (before_drop, runs)
}

/// Dropping the call's future during a backoff wait stops the retries.
#[test]
fn dropping_the_future_during_the_backoff_stops_retrying() {
    for listen in [false, true] {
        for origin in ORIGINS {
            let retry = Retry::constant(secs(10)).max_attempts(5);
            let (p, clock, _) = retrying("cancel", origin, listen, retry);
            let (before_drop, runs) = poll_once_then_drop(&p);
            assert_eq!(before_drop, 1);
            clock.advance(secs(3600));
            assert_eq!(runs.load(Ordering::SeqCst), 1, "listen={listen}");
        }
    }
}

/// With the system clock: a caller's own timeout drops the call while it
/// waits, and nothing runs afterwards.
#[test]
fn a_callers_timeout_cancels_the_retry_on_the_system_clock() {
    let p = Pipeline::builder(unique("retry-cancel-system"))
        .store(MemoryStore::new())
        .retry(Retry::constant(secs(10)).max_attempts(5))
        .build()
        .unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let out = rt().block_on(async {
        let out = tokio::time::timeout(
            ms(50),
            p.run(move |_ctx| {
                r.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), _>(Boom(0)) }
            }),
        )
        .await;
        tokio::time::sleep(ms(100)).await;
        out
    });
    assert!(out.is_err(), "the caller's timeout fired");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Dropping the call while an attempt runs drops the attempt's future.
#[test]
fn dropping_the_future_during_an_attempt_drops_the_attempt() {
    struct Flag(Arc<AtomicU32>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    for listen in [false, true] {
        let retry = Retry::constant(secs(1)).max_attempts(5);
        let (p, clock, _) = retrying("cancel-attempt", ORIGINS[1], listen, retry);
        let dropped = Arc::new(AtomicU32::new(0));
        let runs = Arc::new(AtomicU32::new(0));
        {
            let (d, r) = (dropped.clone(), runs.clone());
            let mut fut = pin!(p.run(move |_ctx| {
                r.fetch_add(1, Ordering::SeqCst);
                let flag = Flag(d.clone());
                async move {
                    std::future::pending::<()>().await;
                    drop(flag);
                    Err::<(), Boom>(Boom(0))
                }
            }));
            assert!(poll_once(fut.as_mut()).is_pending());
        }
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
        clock.advance(secs(60));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}

// ----------------------------------------------------------------- overflow

/// An uncapped exponential backoff over hundreds of attempts: the delays
/// saturate, nothing panics or wraps, far from the clock's origin too.
#[test]
fn many_attempts_of_an_uncapped_exponential_never_overflow() {
    for (flavor, listen, origin) in matrix() {
        for jitter in [Jitter::None, Jitter::Full, Jitter::Proportional(50.0)] {
            let (p, clock, log) = pipeline("overflow", origin, true, |b| {
                b.retry(
                    Retry::exponential(secs(1))
                        .multiplier(10.0)
                        .max_attempts(200)
                        .jitter(jitter),
                )
                .random(SeededRandom::new(3))
            });
            let seen = catch_unwind(AssertUnwindSafe(|| call_failing(&p, &clock, flavor, None)))
                .unwrap_or_else(|_| {
                    panic!("{jitter:?} {flavor:?} {origin:?} listen={listen}: panicked")
                });
            assert_eq!(seen.attempts(), 200);
            assert!(matches!(
                seen.result,
                Err(Error::RetryExhausted { attempts: 200, .. })
            ));
            let delays = scheduled(&log);
            assert_eq!(delays.len(), 199);
            if jitter == Jitter::None {
                assert!(delays.windows(2).all(|w| w[0] <= w[1]), "monotone");
                assert_eq!(*delays.last().unwrap(), Duration::MAX);
            }
            assert!(clock.now() >= origin);
        }
    }
}

/// A capped exponential backoff over a hundred thousand attempts: every
/// delay stays at the cap.
#[test]
fn a_huge_number_of_attempts_stays_capped() {
    for flavor in FLAVORS {
        let retry = Retry::exponential(secs(1))
            .cap(secs(60))
            .max_attempts(100_000);
        let (p, clock, _) = retrying("capped-huge", ORIGINS[1], false, retry);
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(seen.attempts(), 100_000);
        // 1 + 2 + 4 + 8 + 16 + 32, then 60 s for each of the other waits.
        let want = secs(63) + secs(60) * (99_999 - 6);
        assert_eq!(clock.now() - ORIGINS[1], want);
        assert!(seen.gaps().iter().all(|g| *g <= secs(60)));
    }
}

/// `Retry::delay` for any attempt number, any backoff and jitter: no panic,
/// and the delay before jitter never exceeds the cap.
#[test]
fn delays_for_extreme_inputs_never_panic() {
    let bases = [
        Duration::ZERO,
        Duration::from_nanos(1),
        secs(1),
        secs(1 << 40) + Duration::from_nanos(1),
        Duration::MAX / 2,
        Duration::MAX,
    ];
    let multipliers = [1.0, 1.5, 2.0, 1000.0, f64::MAX];
    let attempts = [
        1,
        2,
        63,
        64,
        65,
        1_000,
        i32::MAX as u32,
        u32::MAX - 1,
        u32::MAX,
    ];
    let previous = [Duration::ZERO, secs(1), Duration::MAX];
    for base in bases {
        let mut retries = vec![
            Retry::constant(base),
            Retry::linear(base),
            Retry::linear(base).cap(Duration::MAX),
            Retry::decorrelated(base, Duration::MAX),
        ];
        for m in multipliers {
            retries.push(Retry::exponential(base).multiplier(m));
            retries.push(
                Retry::exponential(base)
                    .multiplier(m)
                    .cap(base.saturating_mul(2)),
            );
        }
        for retry in retries {
            for jitter in JITTERS {
                let retry = retry.clone().jitter(jitter);
                for draw in [0.0, 0.5, TOP] {
                    let r = SequenceRandom::new([draw]);
                    for a in attempts {
                        for prev in previous {
                            let d = catch_unwind(AssertUnwindSafe(|| retry.delay(a, prev, &r)));
                            assert!(
                                d.is_ok(),
                                "{retry:?} attempt {a} previous {prev:?} draw {draw}: panicked"
                            );
                            let (lo, hi) = retry.backoff.bounds();
                            let raw = retry.backoff.delay(a, prev, &r);
                            assert!(lo <= raw && raw <= hi, "{retry:?} attempt {a}: {raw:?}");
                        }
                    }
                }
            }
        }
    }
}

// --------------------------------------------------- configuration refused

#[test]
fn bad_configuration_fails_at_build_naming_the_field() {
    let d = ms(100);
    // (the field named, [(what, a retry refused for it)])
    let cases: Vec<(&str, Vec<(&str, Retry)>)> = vec![
        (
            "max_attempts",
            vec![("0 attempts", Retry::constant(d).max_attempts(0))],
        ),
        (
            "multiplier",
            vec![
                ("factor < 1", Retry::exponential(d).multiplier(0.5)),
                ("factor 0", Retry::exponential(d).multiplier(0.0)),
                ("factor < 0", Retry::exponential(d).multiplier(-2.0)),
                ("factor NaN", Retry::exponential(d).multiplier(f64::NAN)),
                (
                    "factor inf",
                    Retry::exponential(d).multiplier(f64::INFINITY),
                ),
                (
                    "factor < 1 (by the enum)",
                    Retry::with_backoff(Backoff::Exponential {
                        base: d,
                        multiplier: 0.9,
                        cap: secs(1),
                    }),
                ),
                ("multiplier on linear", Retry::linear(d).multiplier(2.0)),
                ("multiplier on constant", Retry::constant(d).multiplier(2.0)),
                (
                    "multiplier on decorrelated",
                    Retry::decorrelated(d, secs(1)).multiplier(2.0),
                ),
            ],
        ),
        (
            "cap",
            vec![
                ("exp cap < base", Retry::exponential(secs(2)).cap(secs(1))),
                ("linear cap < base", Retry::linear(secs(2)).cap(secs(1))),
                (
                    "decorrelated cap < base",
                    Retry::decorrelated(secs(2), secs(1)),
                ),
                (
                    "linear cap < base (by the enum)",
                    Retry::with_backoff(Backoff::Linear {
                        base: secs(2),
                        cap: secs(1),
                    }),
                ),
                ("cap on constant", Retry::constant(d).cap(secs(1))),
            ],
        ),
        (
            "jitter",
            vec![
                ("jitter > 100 %", Jitter::Proportional(100.5)),
                ("jitter < 0 %", Jitter::Proportional(-1.0)),
                ("jitter NaN", Jitter::Proportional(f64::NAN)),
                ("jitter inf", Jitter::Proportional(f64::INFINITY)),
            ]
            .into_iter()
            .map(|(what, j)| (what, Retry::constant(d).jitter(j)))
            .collect(),
        ),
        (
            "budget.ratio",
            vec![
                ("ratio 0", 0.0),
                ("ratio < 0", -0.1),
                ("ratio NaN", f64::NAN),
                ("ratio inf", f64::INFINITY),
                ("ratio > 1000", 1000.5),
                ("ratio < 0.001", 0.0004),
            ]
            .into_iter()
            .map(|(what, ratio)| (what, Retry::constant(d).budget(RetryBudget::new(ratio, 10))))
            .collect(),
        ),
        (
            "budget.max_tokens",
            vec![(
                "0 tokens",
                Retry::constant(d).budget(RetryBudget::new(0.1, 0)),
            )],
        ),
    ];
    for (field, retries) in cases {
        for (what, retry) in retries {
            for listen in [false, true] {
                let built = catch_unwind(AssertUnwindSafe(|| {
                    let (b, _, _) = builder("bad", ORIGINS[0], listen);
                    b.retry(retry.clone()).build()
                }));
                let built = built.unwrap_or_else(|_| panic!("{what}: build() panicked"));
                let e = built
                    .err()
                    .unwrap_or_else(|| panic!("{what}: build() accepted it"));
                assert_eq!((e.policy, e.field), ("retry", field), "{what}: {e}");
                assert!(
                    e.to_string().starts_with(&format!("retry.{field}")),
                    "{what}: {e}"
                );
            }
        }
    }
}

#[test]
fn edge_configurations_are_accepted() {
    let d = ms(100);
    let ok = [
        Retry::constant(Duration::ZERO).max_attempts(1),
        Retry::constant(d).max_attempts(u32::MAX),
        Retry::exponential(d).multiplier(1.0),
        Retry::exponential(d).multiplier(f64::MAX),
        Retry::exponential(d).cap(d),
        Retry::linear(d).cap(d),
        Retry::decorrelated(d, d),
        Retry::constant(d).jitter(Jitter::Proportional(0.0)),
        Retry::constant(d).jitter(Jitter::Proportional(100.0)),
        Retry::constant(d).budget(RetryBudget::new(0.001, 1)),
        Retry::constant(d).budget(RetryBudget::new(1000.0, u32::MAX)),
    ];
    for retry in ok {
        let (b, _, _) = builder("ok", ORIGINS[0], false);
        assert!(b.retry(retry.clone()).build().is_ok(), "{retry:?}");
    }
}

/// The documented default: 3 attempts in all, no jitter, no budget.
#[test]
fn the_documented_default() {
    let r = Retry::exponential(ms(1));
    assert_eq!(r.max_attempts, 3);
    assert_eq!(r.jitter, Jitter::None);
    assert!(r.budget.is_none());
    for flavor in FLAVORS {
        let retry = Retry::exponential(ms(100));
        let (p, clock, _) = retrying("default", ORIGINS[1], false, retry);
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(seen.attempts(), 3);
        assert_eq!(seen.gaps(), [ms(100), ms(200)]);
    }
}

#[test]
fn may_attempt_more_than_once_follows_max_attempts() {
    for (n, more) in [(1, false), (2, true), (u32::MAX, true)] {
        let retry = Retry::constant(ms(1)).max_attempts(n);
        let (p, _, _) = retrying("more", ORIGINS[0], false, retry);
        assert_eq!(p.may_attempt_more_than_once(), more, "{n}");
    }
}

/// A budget shared through the (memory) store: deposit at the call's
/// first admission, withdrawal at each retry's admission, after the
/// backoff; refusal ends the call with `retry_budget_exhausted`.
#[test]
fn a_shared_budget_follows_the_same_rule_after_the_backoff() {
    for (flavor, listen, origin) in matrix() {
        let retry = budgeted(ms(10), 5, RetryBudget::new(0.5, 2).shared());
        let (p, clock, log) = retrying("shared-budget", origin, listen, retry);
        let ctx = format!("{flavor:?} listen={listen} {origin:?}");
        let attempts = || call_failing(&p, &clock, flavor, None).attempts();
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(seen.attempts(), 3, "{ctx}");
        assert_eq!(
            reason(&seen.result),
            Some(RejectionReason::RetryBudgetExhausted),
            "{ctx}: {:?}",
            seen.result
        );
        // Refused with the retry's admission, after its backoff.
        assert_eq!(clock.now() - origin, ms(30), "{ctx}");
        if listen {
            assert_eq!(gave_up(&log).len(), 1, "{ctx}");
        }
        // Call 2 deposits 0.5: no retry; call 3 deposits 0.5 more: one.
        assert_eq!(attempts(), 1, "{ctx}");
        assert_eq!(attempts(), 2, "{ctx}");
        // Successes refill it up to the cap: 2 tokens, 2 retries.
        for _ in 0..10 {
            assert_eq!(call_failing(&p, &clock, flavor, Some(1)).attempts(), 1);
        }
        assert_eq!(attempts(), 3, "{ctx}");
    }
}

/// Partitioned calls take the same retry (and the process budget, which
/// belongs to the retry, not to a partition).
#[test]
fn partitioned_calls_retry_the_same() {
    for flavor in FLAVORS {
        for listen in [false, true] {
            let budget = RetryBudget::new(0.5, 2);
            let (p, clock, _) = pipeline("partition", ORIGINS[1], listen, |b| {
                b.retry(
                    Retry::exponential(ms(100))
                        .max_attempts(4)
                        .budget(budget.clone()),
                )
            });
            let starts = Mutex::new(Vec::new());
            let op = |ctx: Context| {
                starts.lock().unwrap().push(clock.now());
                Err::<(), _>(Boom(ctx.attempt()))
            };
            // `exec` takes a pipeline, not a partition of one.
            let r = match flavor {
                Flavor::Sync => p.partition("tenant-a").call(op),
                Flavor::Async => rt().block_on(p.partition("tenant-a").run(|ctx| {
                    let r = op(ctx);
                    async move { r }
                })),
            };
            let starts = starts.into_inner().unwrap();
            assert_eq!(starts.len(), 3, "{flavor:?} listen={listen}");
            assert_eq!(starts[1] - starts[0], ms(100));
            assert_eq!(starts[2] - starts[1], ms(200));
            assert_eq!(reason(&r), Some(RejectionReason::RetryBudgetExhausted));
            assert_eq!(budget.tokens(), 0.0);
        }
    }
}

/// A throttled error's hint opens the cooldown declared after the retry
/// and the retry waits that long: the next attempt is admitted as the
/// pause ends, with no further wait.
#[test]
fn a_throttled_hint_with_a_cooldown_retries_as_the_pause_ends() {
    for (flavor, listen, origin) in matrix() {
        let (p, clock, log) = pipeline("cooldown-hint", origin, listen, |b| {
            b.retry(Retry::constant(ms(100)).max_attempts(3))
                .cooldown(Cooldown::new())
                .classify(|_: &Boom| Verdict::throttled().with_retry_after(secs(5)))
        });
        let seen = call_failing(&p, &clock, flavor, Some(2));
        assert_eq!(
            seen.attempts(),
            2,
            "{flavor:?} {listen} {origin:?}: {:?}",
            seen.result
        );
        assert_eq!(seen.gaps(), [secs(5)], "{flavor:?} {listen} {origin:?}");
        assert_eq!(seen.result.unwrap(), 2);
        if listen {
            assert_eq!(scheduled(&log), [secs(5)]);
        }
    }
}

/// A breaker declared before the retry (one admission per call) with a
/// budget: still one deposit per call and one withdrawal per retry.
#[test]
fn a_budget_behind_a_call_level_breaker_counts_the_same() {
    for (flavor, listen, origin) in matrix() {
        let budget = RetryBudget::new(0.5, 2);
        let (p, clock, _) = pipeline("budget-cb", origin, listen, |b| {
            b.circuit_breaker(CircuitBreaker::consecutive_failures(100))
                .retry(budgeted(ms(10), 5, budget.clone()))
        });
        // (attempts of the call, tokens left after it)
        for (attempts, tokens) in [(3, 0.0), (1, 0.5), (2, 0.0)] {
            assert_call_leaves(&p, &clock, flavor, &budget, attempts, tokens, "");
        }
    }
}

/// With a fallback, a call still deposits once.
#[test]
fn a_budget_with_a_fallback_deposits_once_per_call() {
    for (flavor, listen, origin) in matrix() {
        let budget = RetryBudget::new(0.25, 1);
        let (p, clock, _) = pipeline("budget-fb", origin, listen, |b| {
            b.retry(budgeted(ms(10), 3, budget.clone()))
                .fallback_sync(|_e: Error<Boom>, _ctx: Context| Ok::<u32, Boom>(99))
        });
        let seen = assert_call_leaves(&p, &clock, flavor, &budget, 2, 0.0, "");
        assert_eq!(seen.result.unwrap(), 99);
        assert_call_leaves(&p, &clock, flavor, &budget, 1, 0.25, "");
    }
}

/// The `on_retry` hook, without a listener: the error, the failed
/// attempt's number and the wait, for each retry.
#[test]
fn the_on_retry_hook_reports_each_retry_without_a_listener() {
    for flavor in FLAVORS {
        for origin in ORIGINS {
            let (hooked, on_retry) = hook();
            let (p, clock, _) = pipeline("hook", origin, false, |b| {
                b.retry(Retry::linear(ms(100)).max_attempts(4))
                    .on_retry(on_retry)
            });
            let seen = call_failing(&p, &clock, flavor, None);
            assert_eq!(seen.attempts(), 4);
            assert_eq!(
                *hooked.lock().unwrap(),
                [(1, 1, ms(100)), (2, 2, ms(200)), (3, 3, ms(300))]
            );
        }
    }
}

/// The deadline check uses the jittered wait.
#[test]
fn the_deadline_check_uses_the_jittered_wait() {
    for (flavor, listen, origin) in matrix() {
        let (p, clock, _) = pipeline("deadline-jitter", origin, listen, |b| {
            b.timeout(secs(3))
                .retry(
                    Retry::constant(secs(4))
                        .max_attempts(5)
                        .jitter(Jitter::Full),
                )
                .random(SequenceRandom::new([0.5]))
        });
        let seen = call_failing(&p, &clock, flavor, None);
        // 4 s x 0.5 = 2 s fits in 3 s; a second 2 s wait would not.
        assert_eq!(seen.attempts(), 2);
        assert_eq!(seen.gaps(), [secs(2)]);
        assert_exhausted(&seen.result, 2, "");
    }
}

/// Async: a result at an attempt's deadline is on time (an error there is
/// the operation's, retried as such); the overall deadline expiring during
/// an attempt ends the call with an overall timeout.
#[test]
fn results_at_the_attempt_deadline_are_on_time_async() {
    for origin in ORIGINS {
        for listen in [false, true] {
            let (p, clock, _) = pipeline("at-deadline", origin, listen, per_attempt_timeout);
            let r = run_sleeping(&p, &clock, |n| {
                (Some(secs(1)), if n < 2 { Err(Boom(n)) } else { Ok(n) })
            });
            assert_eq!(r.unwrap(), 2, "{origin:?} listen={listen}");
            assert_eq!(clock.now() - origin, secs(2) + ms(100));

            let (p, clock, _) = pipeline("overall-during", origin, listen, |b| {
                b.timeout(secs(3))
                    .retry(Retry::constant(ms(500)).max_attempts(10))
                    .timeout(secs(2))
            });
            let r = run_sleeping(&p, &clock, |_| (Some(secs(10)), Ok(0)));
            // Attempt 1 times out at 2 s, waits 0.5 s, attempt 2 is cut
            // by the whole call's deadline at 3 s.
            assert_timed_out(&r, TimeoutScope::Overall, secs(3), 2);
            assert_eq!(clock.now() - origin, secs(3));
        }
    }
}

/// Dropping the future at a zero-delay retry (the point where the task
/// yields) stops the retries too.
#[test]
fn dropping_the_future_at_a_zero_delay_retry_stops_retrying() {
    for listen in [false, true] {
        let retry = Retry::constant(Duration::ZERO).max_attempts(5);
        let (p, _, _) = retrying("cancel-zero", ORIGINS[1], listen, retry);
        let (_, runs) = poll_once_then_drop(&p);
        assert_eq!(runs.load(Ordering::SeqCst), 1, "listen={listen}");
    }
}

/// Timed-out attempts count among the attempts; the retry event numbers
/// the attempt that failed.
#[test]
fn timed_out_attempts_count_and_events_number_the_failed_attempt() {
    for origin in ORIGINS {
        let (p, clock, log) = pipeline("timeout-count", origin, true, per_attempt_timeout);
        let r = run_sleeping(&p, &clock, |n| ((n == 1).then_some(secs(10)), Err(Boom(n))));
        assert_exhausted(&r, 3, "");
        let attempts = events(&log, |e| match e {
            EventKind::RetryScheduled { attempt, .. } => Some(*attempt),
            _ => None,
        });
        assert_eq!(attempts, [1, 2]);
    }
}

/// Seeded full jitter draws a fresh value for each retry of a call.
#[test]
fn each_retry_draws_its_own_jitter() {
    for flavor in FLAVORS {
        let (p, clock, _) = pipeline("fresh-draws", ORIGINS[1], false, |b| {
            b.retry(
                Retry::constant(secs(10))
                    .max_attempts(8)
                    .jitter(Jitter::Full),
            )
            .random(SeededRandom::new(42))
        });
        let gaps = call_failing(&p, &clock, flavor, None).gaps();
        let mut distinct = gaps.clone();
        distinct.sort();
        distinct.dedup();
        assert!(distinct.len() >= 6, "{gaps:?}");
    }
}

/// "A retry never runs again after a rejection by one of seawall's own
/// policies": the circuit opened by attempt 1 refuses the retry, and the
/// call ends with that refusal.
#[test]
fn seawalls_own_rejections_are_not_retried() {
    for (flavor, listen, origin) in matrix() {
        let (p, clock, _) = pipeline("own-rejection", origin, listen, |b| {
            b.retry(Retry::constant(ms(10)).max_attempts(5))
                .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(60)))
        });
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(seen.attempts(), 1, "{flavor:?} {listen} {origin:?}");
        assert_eq!(
            reason(&seen.result),
            Some(RejectionReason::CircuitOpen),
            "{:?}",
            seen.result
        );
        // A call on the open circuit is refused without running, and not retried.
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(seen.attempts(), 0);
    }
}
