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
use seawall::pipeline::{Handles, HandlesSync};
use seawall::testing::{SeededRandom, SequenceRandom, VirtualClock};
use seawall::*;

// ------------------------------------------------------------------ helpers

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The clock's starting points: 0, and 10^9 s (a process up for decades).
const ORIGINS: [Duration; 2] = [Duration::ZERO, Duration::from_secs(1_000_000_000)];

/// The largest `f64` below 1: the highest draw a `Random` may return.
const TOP: f64 = 1.0 - f64::EPSILON / 2.0;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Boom(u32);

impl std::fmt::Display for Boom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "boom {}", self.0)
    }
}

impl std::error::Error for Boom {}

type Log = Arc<Mutex<Vec<EventKind>>>;

fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("retry-{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A builder on its own store and a virtual clock at `origin`, recording
/// events when `listen`.
fn builder(name: &str, origin: Duration, listen: bool) -> (PipelineBuilder, VirtualClock, Log) {
    let clock = VirtualClock::starting_at(origin);
    let log: Log = Arc::default();
    let mut b = Pipeline::builder(unique(name))
        .store(MemoryStore::new())
        .clock(clock.clone());
    if listen {
        let l = log.clone();
        b = b.on_event(move |e: &Event<'_>| l.lock().unwrap().push(e.kind.clone()));
    }
    (b, clock, log)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavor {
    Sync,
    Async,
}

const FLAVORS: [Flavor; 2] = [Flavor::Sync, Flavor::Async];

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

/// One call, with an operation whose result is ready at once.
fn exec<K, T, E>(
    p: &Pipeline<K>,
    flavor: Flavor,
    mut op: impl FnMut(Context) -> Result<T, E>,
) -> Result<T, Error<E>>
where
    K: HandlesSync<T, E> + Handles<T, E>,
{
    match flavor {
        Flavor::Sync => p.call(op),
        Flavor::Async => rt().block_on(p.run(|ctx| {
            let r = op(ctx);
            async move { r }
        })),
    }
}

/// What a call that failed `fail` times saw: each attempt's number and the
/// clock when it started, and the result.
struct Seen<T> {
    starts: Vec<(u32, Duration)>,
    result: Result<T, Error<Boom>>,
}

impl<T> Seen<T> {
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
) -> Seen<u32>
where
    K: HandlesSync<u32, Boom> + Handles<u32, Boom>,
{
    let starts = Mutex::new(Vec::new());
    let result = exec(p, flavor, |ctx: Context| {
        let n = ctx.attempt();
        starts.lock().unwrap().push((n, clock.now()));
        if Some(n) == ok_at {
            Ok(n)
        } else {
            Err(Boom(n))
        }
    });
    Seen {
        starts: starts.into_inner().unwrap(),
        result,
    }
}

fn scheduled(log: &Log) -> Vec<Duration> {
    log.lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            EventKind::RetryScheduled { delay, .. } => Some(*delay),
            _ => None,
        })
        .collect()
}

fn gave_up(log: &Log) -> Vec<(u32, GiveUpReason)> {
    log.lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            EventKind::RetryGaveUp { attempts, reason } => Some((*attempts, *reason)),
            _ => None,
        })
        .collect()
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
            let (b, clock, log) = builder("seq", origin, listen);
            let p = b.retry(retry.clone().max_attempts(6)).build().unwrap();
            let seen = call_failing(&p, &clock, flavor, None);
            let ctx = format!("{retry:?} {flavor:?} listen={listen} origin={origin:?}");
            assert_eq!(seen.attempts(), 6, "{ctx}");
            assert_eq!(seen.gaps(), want, "{ctx}");
            assert_eq!(clock.now() - origin, want.iter().sum::<Duration>(), "{ctx}");
            match &seen.result {
                Err(Error::RetryExhausted { attempts: 6, last }) => assert_eq!(*last, Boom(6)),
                other => panic!("{ctx}: {other:?}"),
            }
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
            let (b, clock, _) = builder("zero", origin, listen);
            let p = b.retry(retry.max_attempts(4)).build().unwrap();
            let seen = call_failing(&p, &clock, flavor, None);
            assert_eq!(seen.attempts(), 4);
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
            let (b, clock, log) = builder("count", origin, listen);
            let p = b
                .retry(Retry::constant(ms(10)).max_attempts(n))
                .build()
                .unwrap();
            let seen = call_failing(&p, &clock, flavor, None);
            let numbers: Vec<u32> = seen.starts.iter().map(|s| s.0).collect();
            assert_eq!(numbers, (1..=n).collect::<Vec<_>>());
            assert_eq!(clock.now() - origin, ms(10) * (n - 1));
            match seen.result {
                Err(Error::RetryExhausted { attempts, last }) => {
                    assert_eq!((attempts, last), (n, Boom(n)))
                }
                other => panic!("{flavor:?} n={n}: {other:?}"),
            }
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
        let (b, clock, _) = builder("succeed", origin, listen);
        let p = b
            .retry(Retry::exponential(ms(100)).max_attempts(5))
            .build()
            .unwrap();
        let seen = call_failing(&p, &clock, flavor, Some(3));
        assert_eq!(seen.attempts(), 3);
        assert_eq!(seen.result.unwrap(), 3);
        assert_eq!(clock.now() - origin, ms(300));
    }
}

#[test]
fn only_the_first_attempt_is_first() {
    for flavor in FLAVORS {
        let (b, clock, _) = builder("first", ORIGINS[1], false);
        let p = b
            .retry(Retry::constant(ms(1)).max_attempts(3))
            .build()
            .unwrap();
        let firsts = Mutex::new(Vec::new());
        let _ = exec(&p, flavor, |ctx: Context| {
            firsts.lock().unwrap().push(ctx.is_first_attempt());
            Err::<(), _>(Boom(0))
        });
        assert_eq!(*firsts.lock().unwrap(), [true, false, false]);
        let _ = clock;
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
        let (b, clock, log) = builder("exact-jitter", origin, listen);
        let p = b
            .retry(
                Retry::exponential(secs(1))
                    .max_attempts(4)
                    .jitter(Jitter::Full),
            )
            .random(SequenceRandom::new([0.5, 0.25]))
            .build()
            .unwrap();
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
                let (b, clock, log) = builder("jitter-pipe", origin, true);
                let hooked = Arc::new(Mutex::new(Vec::new()));
                let h = hooked.clone();
                let p = b
                    .retry(
                        Retry::exponential(ms(100))
                            .cap(secs(1))
                            .max_attempts(8)
                            .jitter(jitter),
                    )
                    .random(SeededRandom::new(seed))
                    .on_retry(move |_e: &Boom, attempt, delay| {
                        h.lock().unwrap().push((attempt, delay))
                    })
                    .build()
                    .unwrap();
                let seen = call_failing(&p, &clock, flavor, None);
                let gaps = seen.gaps();
                assert_eq!(gaps, scheduled(&log));
                let hooked: Vec<Duration> = hooked.lock().unwrap().iter().map(|h| h.1).collect();
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
            let (b, clock, log) = builder("decorrelated", origin, listen);
            let p = b
                .retry(Retry::decorrelated(base, cap).max_attempts(12))
                .random(SeededRandom::new(seed))
                .build()
                .unwrap();
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
                let (b, clock, log) = builder("hint", origin, listen);
                let p = b
                    .retry(retry.clone().max_attempts(2))
                    .classify(move |_: &Boom| verdict.with_retry_after(hint))
                    .build()
                    .unwrap();
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
            let (b, clock, _) = builder("hint-jitter", ORIGINS[1], false);
            let p = b
                .retry(
                    Retry::constant(secs(2))
                        .jitter(Jitter::Full)
                        .max_attempts(3),
                )
                .random(SeededRandom::new(seed))
                .classify(|_: &Boom| Verdict::retry().with_retry_after(secs(1)))
                .build()
                .unwrap();
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
            let (b, clock, _) = builder("hint-no", origin, listen);
            let p = b
                .retry(Retry::constant(ms(10)).max_attempts(3))
                .classify(move |_: &Boom| verdict.with_retry_after(secs(5)))
                .build()
                .unwrap();
            let seen = call_failing(&p, &clock, flavor, None);
            assert_eq!(seen.attempts(), 1, "{verdict:?}");
            assert!(
                matches!(seen.result, Err(Error::Operation(Boom(1)))),
                "{verdict:?}"
            );
            assert_eq!(clock.now(), origin);
        }
    }
}

/// A hint whose wait would not end by the call's deadline ends the call at
/// once with the real last error; one that ends exactly at it fits.
#[test]
fn a_hint_past_the_deadline_gives_up_with_the_last_error() {
    for (flavor, listen, origin) in matrix() {
        let (b, clock, log) = builder("hint-deadline", origin, listen);
        let p = b
            .timeout(secs(10))
            .retry(Retry::constant(ms(1)).max_attempts(3))
            .classify(|_: &Boom| Verdict::retry().with_retry_after(secs(11)))
            .build()
            .unwrap();
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(seen.attempts(), 1);
        assert!(
            matches!(
                seen.result,
                Err(Error::RetryExhausted {
                    attempts: 1,
                    last: Boom(1)
                })
            ),
            "{:?}",
            seen.result
        );
        assert_eq!(clock.now(), origin, "gave up without waiting");
        if listen {
            assert_eq!(gave_up(&log), [(1, GiveUpReason::Deadline)]);
        }
        // Exactly at the deadline: fits.
        let (b, clock, _) = builder("hint-deadline-fit", origin, listen);
        let p = b
            .timeout(secs(10))
            .retry(Retry::constant(ms(1)).max_attempts(3))
            .classify(|_: &Boom| Verdict::retry().with_retry_after(secs(10)))
            .build()
            .unwrap();
        let seen = call_failing(&p, &clock, flavor, None);
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
        // Default: every error is a retryable failure.
        let (b, clock, _) = builder("cls-default", origin, listen);
        let p = b
            .retry(Retry::constant(ms(1)).max_attempts(3))
            .build()
            .unwrap();
        assert_eq!(call_failing(&p, &clock, flavor, None).attempts(), 3);
        // The classifier's verdicts.
        for (verdict, retried) in [
            (Verdict::retry(), true),
            (Verdict::throttled(), true),
            (Verdict::failure(), false),
            (Verdict::abort(), false),
            (Verdict::ignore(), false),
        ] {
            let (b, clock, _) = builder("cls", origin, listen);
            let p = b
                .retry(Retry::constant(ms(1)).max_attempts(3))
                .classify(move |_: &Boom| verdict)
                .build()
                .unwrap();
            let seen = call_failing(&p, &clock, flavor, None);
            if retried {
                assert_eq!(seen.attempts(), 3, "{verdict:?}");
                assert!(matches!(
                    seen.result,
                    Err(Error::RetryExhausted { attempts: 3, .. })
                ));
            } else {
                assert_eq!(seen.attempts(), 1, "{verdict:?}");
                assert!(
                    matches!(seen.result, Err(Error::Operation(Boom(1)))),
                    "{verdict:?}"
                );
            }
        }
        // A classifier by error: attempt 2's error is not retryable.
        let (b, clock, _) = builder("cls-by-error", origin, listen);
        let p = b
            .retry(Retry::constant(ms(1)).max_attempts(5))
            .classify(|e: &Boom| {
                if e.0 == 2 {
                    Verdict::failure()
                } else {
                    Verdict::retry()
                }
            })
            .build()
            .unwrap();
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(seen.attempts(), 2);
        assert!(matches!(seen.result, Err(Error::Operation(Boom(2)))));
        // retry_if narrows; abort_if wins over it.
        let (b, clock, _) = builder("cls-if", origin, listen);
        let p = b
            .retry(Retry::constant(ms(1)).max_attempts(5))
            .retry_if(|e: &Boom| e.0 < 3)
            .build()
            .unwrap();
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(seen.attempts(), 3);
        assert!(matches!(seen.result, Err(Error::Operation(Boom(3)))));
        let (b, clock, _) = builder("cls-abort", origin, listen);
        let p = b
            .retry(Retry::constant(ms(1)).max_attempts(5))
            .retry_if(|_: &Boom| true)
            .abort_if(|e: &Boom| e.0 == 2)
            .build()
            .unwrap();
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(seen.attempts(), 2);
        assert!(matches!(seen.result, Err(Error::Operation(Boom(2)))));
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
        let (b, clock, log) = builder("budget", origin, listen);
        let p = b
            .retry(
                Retry::constant(ms(10))
                    .max_attempts(5)
                    .budget(budget.clone()),
            )
            .build()
            .unwrap();
        let ctx = format!("{flavor:?} listen={listen} {origin:?}");
        // Call 1: full bucket (deposit capped), 2 retries, then refused.
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(seen.attempts(), 3, "{ctx}");
        assert_eq!(
            seen.result
                .as_ref()
                .err()
                .and_then(|e| e.rejection())
                .map(|r| r.reason),
            Some(RejectionReason::RetryBudgetExhausted),
            "{ctx}: {:?}",
            seen.result
        );
        assert_eq!(budget.tokens(), 0.0, "{ctx}");
        // The refused retry did not wait its backoff (a process budget
        // refuses before it).
        assert_eq!(clock.now() - origin, ms(20), "{ctx}");
        if listen {
            assert_eq!(gave_up(&log), [(3, GiveUpReason::Budget)], "{ctx}");
        }
        // Call 2: deposits 0.5, no retry.
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(seen.attempts(), 1, "{ctx}");
        assert_eq!(budget.tokens(), 0.5, "{ctx}");
        // Call 3: deposits 0.5 -> 1.0, one retry.
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(seen.attempts(), 2, "{ctx}");
        assert_eq!(budget.tokens(), 0.0, "{ctx}");
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
        let (b, clock, _) = builder("budget-time", ORIGINS[1], false);
        let p = b
            .retry(
                Retry::constant(ms(10))
                    .max_attempts(3)
                    .budget(budget.clone()),
            )
            .build()
            .unwrap();
        assert_eq!(call_failing(&p, &clock, flavor, None).attempts(), 2);
        assert_eq!(budget.tokens(), 0.0);
        clock.advance(secs(3600));
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(seen.attempts(), 1);
        assert!(matches!(
            seen.result,
            Err(Error::Rejected(ref r)) if r.reason == RejectionReason::RetryBudgetExhausted
        ));
        assert!((budget.tokens() - 0.1).abs() < 1e-9);
    }
}

/// Clones of a budget share its bucket, across pipelines.
#[test]
fn clones_of_a_budget_share_one_bucket() {
    for flavor in FLAVORS {
        let budget = RetryBudget::new(0.001, 3);
        let (b1, c1, _) = builder("budget-a", ORIGINS[0], false);
        let (b2, c2, _) = builder("budget-b", ORIGINS[1], true);
        let p1 = b1
            .retry(
                Retry::constant(ms(1))
                    .max_attempts(3)
                    .budget(budget.clone()),
            )
            .build()
            .unwrap();
        let p2 = b2
            .retry(
                Retry::constant(ms(1))
                    .max_attempts(3)
                    .budget(budget.clone()),
            )
            .build()
            .unwrap();
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
        let (b, clock, _) = builder("budget-large", ORIGINS[1], false);
        let p = b
            .retry(
                Retry::constant(ms(1))
                    .max_attempts(10)
                    .budget(budget.clone()),
            )
            .build()
            .unwrap();
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
        let (b, clock, log) = builder("attempt-timeout", origin, listen);
        let p = b
            .retry(Retry::constant(ms(100)).max_attempts(3))
            .timeout(secs(1))
            .build()
            .unwrap();
        let runs = AtomicU32::new(0);
        let c = clock.clone();
        let r: Result<u32, Error<Boom>> = rt().block_on(p.run(|_ctx| {
            runs.fetch_add(1, Ordering::SeqCst);
            let c = c.clone();
            async move {
                Clock::sleep(&c, secs(10)).await;
                Ok(0)
            }
        }));
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        match r {
            Err(Error::Timeout(t)) => {
                assert_eq!(
                    (t.scope, t.after, t.attempts),
                    (TimeoutScope::Attempt, secs(1), 3)
                )
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(clock.now() - origin, secs(3) + ms(200));
        if listen {
            assert_eq!(scheduled(&log), [ms(100), ms(100)]);
        }
        // A slow first attempt, then a quick one: the call succeeds.
        let (b, clock, _) = builder("attempt-timeout-ok", origin, listen);
        let p = b
            .retry(Retry::constant(ms(100)).max_attempts(3))
            .timeout(secs(1))
            .build()
            .unwrap();
        let c = clock.clone();
        let r: Result<u32, Error<Boom>> = rt().block_on(p.run(|ctx| {
            let c = c.clone();
            async move {
                if ctx.attempt() == 1 {
                    Clock::sleep(&c, secs(10)).await;
                }
                Ok(ctx.attempt())
            }
        }));
        assert_eq!(r.unwrap(), 2);
        assert_eq!(clock.now() - origin, secs(1) + ms(100));
    }
}

/// Sync: each attempt gets a fresh deadline of its own in its context.
#[test]
fn a_timeout_per_attempt_gives_each_attempt_its_own_deadline_sync() {
    for origin in ORIGINS {
        let (b, clock, _) = builder("attempt-deadline", origin, false);
        let p = b
            .retry(Retry::constant(ms(500)).max_attempts(3))
            .timeout(secs(2))
            .build()
            .unwrap();
        let remaining = Mutex::new(Vec::new());
        let _ = p.call(|ctx| {
            remaining.lock().unwrap().push(ctx.remaining());
            Err::<(), _>(Boom(ctx.attempt()))
        });
        assert_eq!(*remaining.lock().unwrap(), [Some(secs(2)); 3]);
        assert_eq!(clock.now() - origin, secs(1));
    }
}

/// A timeout declared before the retry bounds the whole call: the retry
/// gives up with the last error when the next wait would end after the
/// deadline; a wait ending at the deadline fits.
#[test]
fn a_timeout_for_the_whole_call_bounds_the_retries() {
    for (flavor, listen, origin) in matrix() {
        let (b, clock, log) = builder("overall", origin, listen);
        let p = b
            .timeout(secs(5))
            .retry(Retry::constant(secs(2)).max_attempts(10))
            .build()
            .unwrap();
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(seen.attempts(), 3, "{flavor:?} {origin:?}");
        assert!(matches!(
            seen.result,
            Err(Error::RetryExhausted {
                attempts: 3,
                last: Boom(3)
            })
        ));
        assert_eq!(clock.now() - origin, secs(4));
        if listen {
            assert_eq!(gave_up(&log), [(3, GiveUpReason::Deadline)]);
        }
        let (b, clock, _) = builder("overall-fit", origin, listen);
        let p = b
            .timeout(secs(4))
            .retry(Retry::constant(secs(2)).max_attempts(10))
            .build()
            .unwrap();
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(
            seen.attempts(),
            3,
            "{flavor:?} {origin:?}: {:?}",
            seen.result
        );
        assert_eq!(clock.now() - origin, secs(4));
        // Each attempt sees the time left of the whole call.
        let (b, _, _) = builder("overall-remaining", origin, listen);
        let p = b
            .timeout(secs(5))
            .retry(Retry::constant(secs(2)).max_attempts(10))
            .build()
            .unwrap();
        let remaining = Mutex::new(Vec::new());
        let _ = exec(&p, flavor, |ctx: Context| {
            remaining.lock().unwrap().push(ctx.remaining());
            Err::<(), _>(Boom(0))
        });
        assert_eq!(
            *remaining.lock().unwrap(),
            [Some(secs(5)), Some(secs(3)), Some(secs(1))]
        );
    }
}

// ------------------------------------------------------------ cancellation

fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    let mut cx = TaskContext::from_waker(Waker::noop());
    f.poll(&mut cx)
}

/// Dropping the call's future during a backoff wait stops the retries.
#[test]
fn dropping_the_future_during_the_backoff_stops_retrying() {
    for listen in [false, true] {
        for origin in ORIGINS {
            let (b, clock, _) = builder("cancel", origin, listen);
            let p = b
                .retry(Retry::constant(secs(10)).max_attempts(5))
                .build()
                .unwrap();
            let runs = Arc::new(AtomicU32::new(0));
            {
                let r = runs.clone();
                let mut fut = pin!(p.run(move |_ctx| {
                    r.fetch_add(1, Ordering::SeqCst);
                    async { Err::<(), _>(Boom(0)) }
                }));
                assert!(poll_once(fut.as_mut()).is_pending());
                assert_eq!(runs.load(Ordering::SeqCst), 1);
            }
            clock.advance(secs(3600));
            assert_eq!(runs.load(Ordering::SeqCst), 1, "listen={listen}");
        }
    }
}

/// With the system clock: a caller's own timeout drops the call while it
/// waits, and nothing runs afterwards.
#[test]
fn a_callers_timeout_cancels_the_retry_on_the_system_clock() {
    let p = Pipeline::builder(unique("cancel-system"))
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
        let (b, clock, _) = builder("cancel-attempt", ORIGINS[1], listen);
        let p = b
            .retry(Retry::constant(secs(1)).max_attempts(5))
            .build()
            .unwrap();
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
            let (b, clock, log) = builder("overflow", origin, true);
            let p = b
                .retry(
                    Retry::exponential(secs(1))
                        .multiplier(10.0)
                        .max_attempts(200)
                        .jitter(jitter),
                )
                .random(SeededRandom::new(3))
                .build()
                .unwrap();
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
        let (b, clock, _) = builder("capped-huge", ORIGINS[1], false);
        let p = b
            .retry(
                Retry::exponential(secs(1))
                    .cap(secs(60))
                    .max_attempts(100_000),
            )
            .build()
            .unwrap();
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
    let cases: Vec<(&str, Retry, &str)> = vec![
        (
            "0 attempts",
            Retry::constant(d).max_attempts(0),
            "max_attempts",
        ),
        (
            "factor < 1",
            Retry::exponential(d).multiplier(0.5),
            "multiplier",
        ),
        (
            "factor 0",
            Retry::exponential(d).multiplier(0.0),
            "multiplier",
        ),
        (
            "factor < 0",
            Retry::exponential(d).multiplier(-2.0),
            "multiplier",
        ),
        (
            "factor NaN",
            Retry::exponential(d).multiplier(f64::NAN),
            "multiplier",
        ),
        (
            "factor inf",
            Retry::exponential(d).multiplier(f64::INFINITY),
            "multiplier",
        ),
        (
            "factor < 1 (by the enum)",
            Retry::with_backoff(Backoff::Exponential {
                base: d,
                multiplier: 0.9,
                cap: secs(1),
            }),
            "multiplier",
        ),
        (
            "exp cap < base",
            Retry::exponential(secs(2)).cap(secs(1)),
            "cap",
        ),
        (
            "linear cap < base",
            Retry::linear(secs(2)).cap(secs(1)),
            "cap",
        ),
        (
            "decorrelated cap < base",
            Retry::decorrelated(secs(2), secs(1)),
            "cap",
        ),
        (
            "linear cap < base (by the enum)",
            Retry::with_backoff(Backoff::Linear {
                base: secs(2),
                cap: secs(1),
            }),
            "cap",
        ),
        ("cap on constant", Retry::constant(d).cap(secs(1)), "cap"),
        (
            "multiplier on linear",
            Retry::linear(d).multiplier(2.0),
            "multiplier",
        ),
        (
            "multiplier on constant",
            Retry::constant(d).multiplier(2.0),
            "multiplier",
        ),
        (
            "multiplier on decorrelated",
            Retry::decorrelated(d, secs(1)).multiplier(2.0),
            "multiplier",
        ),
        (
            "jitter > 100 %",
            Retry::constant(d).jitter(Jitter::Proportional(100.5)),
            "jitter",
        ),
        (
            "jitter < 0 %",
            Retry::constant(d).jitter(Jitter::Proportional(-1.0)),
            "jitter",
        ),
        (
            "jitter NaN",
            Retry::constant(d).jitter(Jitter::Proportional(f64::NAN)),
            "jitter",
        ),
        (
            "jitter inf",
            Retry::constant(d).jitter(Jitter::Proportional(f64::INFINITY)),
            "jitter",
        ),
        (
            "ratio 0",
            Retry::constant(d).budget(RetryBudget::new(0.0, 10)),
            "budget.ratio",
        ),
        (
            "ratio < 0",
            Retry::constant(d).budget(RetryBudget::new(-0.1, 10)),
            "budget.ratio",
        ),
        (
            "ratio NaN",
            Retry::constant(d).budget(RetryBudget::new(f64::NAN, 10)),
            "budget.ratio",
        ),
        (
            "ratio inf",
            Retry::constant(d).budget(RetryBudget::new(f64::INFINITY, 10)),
            "budget.ratio",
        ),
        (
            "ratio > 1000",
            Retry::constant(d).budget(RetryBudget::new(1000.5, 10)),
            "budget.ratio",
        ),
        (
            "ratio < 0.001",
            Retry::constant(d).budget(RetryBudget::new(0.0004, 10)),
            "budget.ratio",
        ),
        (
            "0 tokens",
            Retry::constant(d).budget(RetryBudget::new(0.1, 0)),
            "budget.max_tokens",
        ),
    ];
    for (what, retry, field) in cases {
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
        let (b, clock, _) = builder("default", ORIGINS[1], false);
        let p = b.retry(Retry::exponential(ms(100))).build().unwrap();
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(seen.attempts(), 3);
        assert_eq!(seen.gaps(), [ms(100), ms(200)]);
    }
}

#[test]
fn may_attempt_more_than_once_follows_max_attempts() {
    for (n, more) in [(1, false), (2, true), (u32::MAX, true)] {
        let (b, _, _) = builder("more", ORIGINS[0], false);
        let p = b
            .retry(Retry::constant(ms(1)).max_attempts(n))
            .build()
            .unwrap();
        assert_eq!(p.may_attempt_more_than_once(), more, "{n}");
    }
}

/// A budget shared through the (memory) store: deposit at the call's
/// first admission, withdrawal at each retry's admission, after the
/// backoff; refusal ends the call with `retry_budget_exhausted`.
#[test]
fn a_shared_budget_follows_the_same_rule_after_the_backoff() {
    for (flavor, listen, origin) in matrix() {
        let (b, clock, log) = builder("shared-budget", origin, listen);
        let p = b
            .retry(
                Retry::constant(ms(10))
                    .max_attempts(5)
                    .budget(RetryBudget::new(0.5, 2).shared()),
            )
            .build()
            .unwrap();
        let ctx = format!("{flavor:?} listen={listen} {origin:?}");
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(seen.attempts(), 3, "{ctx}");
        assert_eq!(
            seen.result
                .as_ref()
                .err()
                .and_then(|e| e.rejection())
                .map(|r| r.reason),
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
        assert_eq!(
            call_failing(&p, &clock, flavor, None).attempts(),
            1,
            "{ctx}"
        );
        assert_eq!(
            call_failing(&p, &clock, flavor, None).attempts(),
            2,
            "{ctx}"
        );
        // Successes refill it up to the cap: 2 tokens, 2 retries.
        for _ in 0..10 {
            assert_eq!(call_failing(&p, &clock, flavor, Some(1)).attempts(), 1);
        }
        assert_eq!(
            call_failing(&p, &clock, flavor, None).attempts(),
            3,
            "{ctx}"
        );
    }
}

/// Partitioned calls take the same retry (and the process budget, which
/// belongs to the retry, not to a partition).
#[test]
fn partitioned_calls_retry_the_same() {
    for flavor in FLAVORS {
        for listen in [false, true] {
            let budget = RetryBudget::new(0.5, 2);
            let (b, clock, _) = builder("partition", ORIGINS[1], listen);
            let p = b
                .retry(
                    Retry::exponential(ms(100))
                        .max_attempts(4)
                        .budget(budget.clone()),
                )
                .build()
                .unwrap();
            let starts = Mutex::new(Vec::new());
            let op = |ctx: Context| {
                starts.lock().unwrap().push(clock.now());
                Err::<(), _>(Boom(ctx.attempt()))
            };
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
            assert_eq!(
                r.err().and_then(|e| e.rejection().map(|r| r.reason)),
                Some(RejectionReason::RetryBudgetExhausted)
            );
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
        let (b, clock, log) = builder("cooldown-hint", origin, listen);
        let p = b
            .retry(Retry::constant(ms(100)).max_attempts(3))
            .cooldown(Cooldown::new())
            .classify(|_: &Boom| Verdict::throttled().with_retry_after(secs(5)))
            .build()
            .unwrap();
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
        let (b, clock, _) = builder("budget-cb", origin, listen);
        let p = b
            .circuit_breaker(CircuitBreaker::consecutive_failures(100))
            .retry(
                Retry::constant(ms(10))
                    .max_attempts(5)
                    .budget(budget.clone()),
            )
            .build()
            .unwrap();
        assert_eq!(call_failing(&p, &clock, flavor, None).attempts(), 3);
        assert_eq!(budget.tokens(), 0.0);
        assert_eq!(call_failing(&p, &clock, flavor, None).attempts(), 1);
        assert_eq!(budget.tokens(), 0.5);
        assert_eq!(call_failing(&p, &clock, flavor, None).attempts(), 2);
        assert_eq!(budget.tokens(), 0.0);
    }
}

/// With a fallback, a call still deposits once.
#[test]
fn a_budget_with_a_fallback_deposits_once_per_call() {
    for (flavor, listen, origin) in matrix() {
        let budget = RetryBudget::new(0.25, 1);
        let (b, clock, _) = builder("budget-fb", origin, listen);
        let p = b
            .retry(
                Retry::constant(ms(10))
                    .max_attempts(3)
                    .budget(budget.clone()),
            )
            .fallback_sync(|_e: Error<Boom>, _ctx: Context| Ok::<u32, Boom>(99))
            .build()
            .unwrap();
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(seen.attempts(), 2);
        assert_eq!(seen.result.unwrap(), 99);
        assert_eq!(budget.tokens(), 0.0);
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(seen.attempts(), 1);
        assert_eq!(budget.tokens(), 0.25);
    }
}

/// The `on_retry` hook, without a listener: the error, the failed
/// attempt's number and the wait, for each retry.
#[test]
fn the_on_retry_hook_reports_each_retry_without_a_listener() {
    for flavor in FLAVORS {
        for origin in ORIGINS {
            let (b, clock, _) = builder("hook", origin, false);
            let hooked = Arc::new(Mutex::new(Vec::new()));
            let h = hooked.clone();
            let p = b
                .retry(Retry::linear(ms(100)).max_attempts(4))
                .on_retry(move |e: &Boom, attempt, delay| {
                    h.lock().unwrap().push((e.0, attempt, delay))
                })
                .build()
                .unwrap();
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
        let (b, clock, _) = builder("deadline-jitter", origin, listen);
        let p = b
            .timeout(secs(3))
            .retry(
                Retry::constant(secs(4))
                    .max_attempts(5)
                    .jitter(Jitter::Full),
            )
            .random(SequenceRandom::new([0.5]))
            .build()
            .unwrap();
        let seen = call_failing(&p, &clock, flavor, None);
        // 4 s x 0.5 = 2 s fits in 3 s; a second 2 s wait would not.
        assert_eq!(seen.attempts(), 2);
        assert_eq!(seen.gaps(), [secs(2)]);
        assert!(matches!(
            seen.result,
            Err(Error::RetryExhausted {
                attempts: 2,
                last: Boom(2)
            })
        ));
    }
}

/// Async: a result at an attempt's deadline is on time (an error there is
/// the operation's, retried as such); the overall deadline expiring during
/// an attempt ends the call with an overall timeout.
#[test]
fn results_at_the_attempt_deadline_are_on_time_async() {
    for origin in ORIGINS {
        for listen in [false, true] {
            let (b, clock, _) = builder("at-deadline", origin, listen);
            let p = b
                .retry(Retry::constant(ms(100)).max_attempts(3))
                .timeout(secs(1))
                .build()
                .unwrap();
            let c = clock.clone();
            let r: Result<u32, Error<Boom>> = rt().block_on(p.run(|ctx| {
                let c = c.clone();
                async move {
                    Clock::sleep(&c, secs(1)).await;
                    if ctx.attempt() < 2 {
                        Err(Boom(ctx.attempt()))
                    } else {
                        Ok(ctx.attempt())
                    }
                }
            }));
            assert_eq!(r.unwrap(), 2, "{origin:?} listen={listen}");
            assert_eq!(clock.now() - origin, secs(2) + ms(100));

            let (b, clock, _) = builder("overall-during", origin, listen);
            let p = b
                .timeout(secs(3))
                .retry(Retry::constant(ms(500)).max_attempts(10))
                .timeout(secs(2))
                .build()
                .unwrap();
            let c = clock.clone();
            let r: Result<u32, Error<Boom>> = rt().block_on(p.run(|_ctx| {
                let c = c.clone();
                async move {
                    Clock::sleep(&c, secs(10)).await;
                    Ok(0)
                }
            }));
            // Attempt 1 times out at 2 s, waits 0.5 s, attempt 2 is cut
            // by the whole call's deadline at 3 s.
            match r {
                Err(Error::Timeout(t)) => {
                    assert_eq!(
                        (t.scope, t.after, t.attempts),
                        (TimeoutScope::Overall, secs(3), 2)
                    )
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(clock.now() - origin, secs(3));
        }
    }
}

/// Dropping the future at a zero-delay retry (the point where the task
/// yields) stops the retries too.
#[test]
fn dropping_the_future_at_a_zero_delay_retry_stops_retrying() {
    for listen in [false, true] {
        let (b, _, _) = builder("cancel-zero", ORIGINS[1], listen);
        let p = b
            .retry(Retry::constant(Duration::ZERO).max_attempts(5))
            .build()
            .unwrap();
        let runs = Arc::new(AtomicU32::new(0));
        {
            let r = runs.clone();
            let mut fut = pin!(p.run(move |_ctx| {
                r.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), _>(Boom(0)) }
            }));
            assert!(poll_once(fut.as_mut()).is_pending());
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "listen={listen}");
    }
}

/// Timed-out attempts count among the attempts; the retry event numbers
/// the attempt that failed.
#[test]
fn timed_out_attempts_count_and_events_number_the_failed_attempt() {
    for origin in ORIGINS {
        let (b, clock, log) = builder("timeout-count", origin, true);
        let p = b
            .retry(Retry::constant(ms(100)).max_attempts(3))
            .timeout(secs(1))
            .build()
            .unwrap();
        let c = clock.clone();
        let r: Result<u32, Error<Boom>> = rt().block_on(p.run(|ctx| {
            let c = c.clone();
            async move {
                if ctx.attempt() == 1 {
                    Clock::sleep(&c, secs(10)).await;
                }
                Err(Boom(ctx.attempt()))
            }
        }));
        assert!(
            matches!(
                r,
                Err(Error::RetryExhausted {
                    attempts: 3,
                    last: Boom(3)
                })
            ),
            "{r:?}"
        );
        let attempts: Vec<u32> = log
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                EventKind::RetryScheduled { attempt, .. } => Some(*attempt),
                _ => None,
            })
            .collect();
        assert_eq!(attempts, [1, 2]);
    }
}

/// Seeded full jitter draws a fresh value for each retry of a call.
#[test]
fn each_retry_draws_its_own_jitter() {
    for flavor in FLAVORS {
        let (b, clock, _) = builder("fresh-draws", ORIGINS[1], false);
        let p = b
            .retry(
                Retry::constant(secs(10))
                    .max_attempts(8)
                    .jitter(Jitter::Full),
            )
            .random(SeededRandom::new(42))
            .build()
            .unwrap();
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
        let (b, clock, _) = builder("own-rejection", origin, listen);
        let p = b
            .retry(Retry::constant(ms(10)).max_attempts(5))
            .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(60)))
            .build()
            .unwrap();
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(seen.attempts(), 1, "{flavor:?} {listen} {origin:?}");
        assert_eq!(
            seen.result
                .as_ref()
                .err()
                .and_then(|e| e.rejection())
                .map(|r| r.reason),
            Some(RejectionReason::CircuitOpen),
            "{:?}",
            seen.result
        );
        // A call on the open circuit is refused without running, and not retried.
        let seen = call_failing(&p, &clock, flavor, None);
        assert_eq!(seen.attempts(), 0);
    }
}
