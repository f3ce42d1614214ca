//! The circuit breaker against its documentation, with the
//! behaviours users of Resilience4j's `CircuitBreaker` and of the `failsafe`
//! crate check in their own suites: count and time windows, minimum calls,
//! failure-rate and slow-call-rate thresholds (exactly at the threshold),
//! the exact number of half-open probes, the cooldown (and its growth), the
//! transition from open to half-open on the next call, the isolated,
//! disabled and reset states, classification of errors, metrics, events on
//! each transition, and calls that never finish.
//!
//! Every behaviour is checked through the public API only, on the default
//! in-memory store, sync (`call`) and async (`run`), with and without an
//! event listener, on a virtual clock starting at 0 and far from it (up to
//! 4 * 10^9 s, within the ~139 years a cooldown's end can be kept in), and
//! once on the system clock. Where seawall documents a departure from its
//! peers, the test asserts seawall's documented behaviour and says so.

mod support;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::Duration;

use seawall::breaker::{CircuitMetrics, CircuitState};
use seawall::pipeline::{HandlesSync, Kind, Partition};
use seawall::testing::VirtualClock;
use seawall::{
    CircuitBreaker, ConfigError, Context, Error, EventKind, Pipeline, PipelineBuilder,
    RejectionReason, SystemClock, Verdict,
};
use support::{exec, ms, recorder, rt, secs, unique, Boom, Flavor, Log, FLAVORS};

/// Clock readings the pipelines start at: 0, a process up for 11 days, 31
/// years and 126 years (a cooldown's end is kept in whole milliseconds up
/// to about 139 years, see `breaker` module docs).
const OFFSETS: [Duration; 4] = [
    Duration::ZERO,
    Duration::from_secs(1_000_000),
    Duration::from_secs(1_000_000_000),
    Duration::from_secs(4_000_000_000),
];

/// 31 years: further from the origin than `support::FAR` (11 days).
const FAR: Duration = Duration::from_secs(1_000_000_000);

/// The clock's origin and `FAR`, where a test need not try every offset.
const NEAR_FAR: [Duration; 2] = [Duration::ZERO, FAR];

/// Sync calls only (`Pipeline::call`).
const SYNC: [Flavor; 1] = [Flavor::Sync];

/// Without and with an event listener.
const LISTENS: [bool; 2] = [false, true];
/// Without an event listener only.
const UNLISTENED: [bool; 1] = [false];
/// With an event listener (recording, see `pipeline`) only.
const LISTENED: [bool; 1] = [true];

/// An operation of these tests.
type Op = fn(Context) -> Result<u32, Boom>;

fn ok(_: Context) -> Result<u32, Boom> {
    Ok(1)
}

fn boom(_: Context) -> Result<u32, Boom> {
    Err(Boom(1))
}

/// An operation failing with `Boom(n)`.
fn err(n: u32) -> impl FnMut(Context) -> Result<u32, Boom> {
    move |_| Err(Boom(n))
}

/// An operation that lasts `d` on `clock`, then returns `value`.
fn lasting(
    clock: &VirtualClock,
    d: Duration,
    value: u32,
) -> impl FnMut(Context) -> Result<u32, Boom> {
    let clock = clock.clone();
    move |_| {
        clock.advance(d);
        Ok(value)
    }
}

/// How the classified tests judge errors: `Boom(0)` is ignored, `Boom(2)`
/// aborted, `Boom(3)` throttled, any other a failure.
fn classify(e: &Boom) -> Verdict {
    match e.0 {
        0 => Verdict::ignore(),
        2 => Verdict::abort(),
        3 => Verdict::throttled(),
        _ => Verdict::failure(),
    }
}

/// A builder with `breaker` on `clock`, with a listener doing nothing when
/// `listen`.
fn builder(
    name: &str,
    breaker: CircuitBreaker,
    clock: &VirtualClock,
    listen: bool,
) -> PipelineBuilder {
    support::listen(
        Pipeline::builder(unique(name))
            .circuit_breaker(breaker)
            .clock(clock.clone()),
        listen,
    )
}

/// A pipeline with `breaker` on `clock`, its events recorded when `listen`.
fn pipeline(
    name: &str,
    breaker: CircuitBreaker,
    clock: &VirtualClock,
    listen: bool,
) -> (Pipeline, Option<Log>) {
    let builder = builder(name, breaker, clock, false);
    if listen {
        let (log, listener) = recorder();
        (builder.on_event(listener).build().unwrap(), Some(log))
    } else {
        (builder.build().unwrap(), None)
    }
}

/// One combination of a test's parameters: a fresh clock at the reading,
/// the call flavor, whether to listen, and a text naming them in messages.
type Setup = (VirtualClock, Flavor, bool, String);

/// Every combination of a reading in `offsets`, a flavor in `flavors` and
/// a listener choice in `listens`.
fn grid<'a>(
    offsets: &'a [Duration],
    flavors: &'a [Flavor],
    listens: &'a [bool],
) -> impl Iterator<Item = Setup> + 'a {
    offsets.iter().flat_map(move |&offset| {
        flavors.iter().flat_map(move |&flavor| {
            listens.iter().map(move |&listen| {
                let at = format!("at {offset:?}, {flavor:?}, listener {listen}");
                (VirtualClock::starting_at(offset), flavor, listen, at)
            })
        })
    })
}

/// A fresh pipeline with `breaker` (see `pipeline`) for every combination
/// of `grid`: the pipeline, its events when listened to, its clock, the
/// flavor and the text naming the combination.
fn cases<'a>(
    name: &'a str,
    breaker: &'a CircuitBreaker,
    offsets: &'a [Duration],
    flavors: &'a [Flavor],
    listens: &'a [bool],
) -> impl Iterator<Item = (Pipeline, Option<Log>, VirtualClock, Flavor, String)> + 'a {
    grid(offsets, flavors, listens).map(move |(clock, flavor, listen, at)| {
        let (p, log) = pipeline(name, breaker.clone(), &clock, listen);
        (p, log, clock, flavor, at)
    })
}

/// Makes one call in `part`, sync or async (`exec` for a partition).
fn part_exec(part: &Partition<'_>, flavor: Flavor, op: Op) -> Result<u32, Error<Boom>> {
    match flavor {
        Flavor::Sync => part.call(op),
        Flavor::Async => rt().block_on(part.run(|ctx| std::future::ready(op(ctx)))),
    }
}

/// The `retry_after` of a refusal by an open circuit; `None` when the call
/// was not refused by the circuit. (Unlike `support::refusal`, any other
/// reason of refusal is `None`.)
fn open_refusal<T: std::fmt::Debug, E: std::fmt::Debug>(
    r: &Result<T, Error<E>>,
) -> Option<Option<Duration>> {
    match support::refusal(r) {
        Some((RejectionReason::CircuitOpen, after)) => Some(after),
        _ => None,
    }
}

/// The hint of a refusal by an open circuit; panics when the call was not
/// refused by the circuit or got no hint.
fn open_hint(r: &Result<u32, Error<Boom>>, at: &str) -> Duration {
    open_refusal(r)
        .unwrap_or_else(|| panic!("{at}: not refused: {r:?}"))
        .expect("a hint")
}

fn state<K: Kind>(p: &Pipeline<K>) -> CircuitState {
    p.circuit_state().unwrap()
}

fn metrics<K: Kind>(p: &Pipeline<K>) -> CircuitMetrics {
    p.circuit_metrics().unwrap()
}

fn counts(m: &CircuitMetrics) -> (CircuitState, u64, u64, u64) {
    (m.state, m.calls, m.failures, m.slow_calls)
}

/// The circuit transitions a listener saw, in order.
fn transitions(log: &Log) -> Vec<EventKind> {
    log.lock()
        .unwrap()
        .iter()
        .filter(|e| {
            matches!(
                e,
                EventKind::CircuitOpened { .. }
                    | EventKind::CircuitHalfOpened
                    | EventKind::CircuitClosed
                    | EventKind::CircuitProbesExpired
            )
        })
        .cloned()
        .collect()
}

/// The transitions of a trip for `cooldown` and a round of probes that
/// closes the circuit.
fn opened_then_closed(cooldown: Duration) -> [EventKind; 3] {
    [
        EventKind::CircuitOpened { cooldown },
        EventKind::CircuitHalfOpened,
        EventKind::CircuitClosed,
    ]
}

/// Fails calls made by `call` until `state` reads open; at most `max`
/// calls, each of which must run and fail.
fn trip_by(
    mut call: impl FnMut(Op) -> Result<u32, Error<Boom>>,
    state: impl Fn() -> CircuitState,
    max: u32,
) {
    for n in 1..=max {
        let r = call(boom);
        assert!(
            matches!(r, Err(Error::Operation(Boom(1)))),
            "call {n} while closed: {r:?}"
        );
        if state() == CircuitState::Open {
            return;
        }
    }
    panic!("still {:?} after {max} failures", state());
}

/// Fails calls until the circuit opens; at most `max` calls.
fn trip<K: HandlesSync<u32, Boom>>(p: &Pipeline<K>, flavor: Flavor, max: u32) {
    trip_by(|op| exec(p, flavor, op), || state(p), max);
}

// ---------------------------------------------------------------------------
// Open -> half-open -> closed / open cycles, at any clock reading.
// ---------------------------------------------------------------------------

/// The three ways to judge the dependency (consecutive: 4 in a row;
/// windows: 50 % of at least 4 calls), with a 5 s cooldown doubling up to
/// 40 s and 2 probes.
fn three_modes() -> [(&'static str, CircuitBreaker); 3] {
    let tune = |b: CircuitBreaker| {
        b.cooldown(secs(5))
            .cooldown_growth(2.0, secs(40))
            .half_open_calls(2)
    };
    [
        ("consecutive", tune(CircuitBreaker::consecutive_failures(4))),
        (
            "count",
            tune(
                CircuitBreaker::failure_rate(0.5)
                    .count_window(8)
                    .minimum_calls(4),
            ),
        ),
        (
            "time",
            tune(
                CircuitBreaker::failure_rate(0.5)
                    .window(secs(10))
                    .minimum_calls(4),
            ),
        ),
    ]
}

/// The cycle every peer checks (failsafe's `state_machine` test,
/// Resilience4j's `shouldTransitionToHalfOpenAfterWaitDuration`), several
/// times over, with hours of uptime between cycles: the breaker must keep
/// protecting however long the process has been up.
#[test]
fn open_half_open_closed_cycles_at_any_clock_reading() {
    for (mode, breaker) in three_modes() {
        for (p, log, clock, flavor, at) in cases("cycles", &breaker, &OFFSETS, &FLAVORS, &LISTENS) {
            let at = format!("{mode} {at}");
            // Some healthy traffic first.
            for _ in 0..3 {
                assert_eq!(exec(&p, flavor, ok).unwrap(), 1, "{at}");
            }
            for cycle in 0..3 {
                let at = format!("{at}, cycle {cycle}");
                clock.advance(secs(3600));
                trip(&p, flavor, 8);
                // Refused at once, with the whole cooldown to go.
                assert_eq!(
                    open_refusal(&exec(&p, flavor, ok)),
                    Some(Some(secs(5))),
                    "{at}: right after the trip"
                );
                clock.advance(ms(4999));
                assert_eq!(
                    open_refusal(&exec(&p, flavor, ok)),
                    Some(Some(ms(1))),
                    "{at}: 1 ms before the end of the cooldown"
                );
                clock.advance(ms(1));
                // No automatic transition: it reads open until a call.
                assert_eq!(state(&p), CircuitState::Open, "{at}");
                // The first probe fails: open again, for twice as long.
                assert!(
                    matches!(exec(&p, flavor, boom), Err(Error::Operation(_))),
                    "{at}: the probe runs"
                );
                let m = metrics(&p);
                assert_eq!((m.state, m.trips), (CircuitState::Open, 2), "{at}");
                assert_eq!(
                    open_refusal(&exec(&p, flavor, ok)),
                    Some(Some(secs(10))),
                    "{at}: after a failed probe"
                );
                clock.advance(ms(9999));
                assert!(
                    open_refusal(&exec(&p, flavor, ok)).is_some(),
                    "{at}: before the grown cooldown ends"
                );
                clock.advance(ms(1));
                // Two probes, both succeed: closed, trips forgotten.
                assert_eq!(exec(&p, flavor, ok).unwrap(), 1, "{at}: probe 1");
                assert_eq!(state(&p), CircuitState::HalfOpen, "{at}");
                assert_eq!(exec(&p, flavor, ok).unwrap(), 1, "{at}: probe 2");
                let m = metrics(&p);
                assert_eq!(
                    (m.state, m.calls, m.failures, m.trips),
                    (CircuitState::Closed, 0, 0, 0),
                    "{at}: closed afresh"
                );
                // Closed again and protecting: healthy calls pass.
                assert_eq!(exec(&p, flavor, ok).unwrap(), 1, "{at}");
            }
            if let Some(log) = log {
                let one_cycle = [
                    EventKind::CircuitOpened { cooldown: secs(5) },
                    EventKind::CircuitHalfOpened,
                    EventKind::CircuitOpened { cooldown: secs(10) },
                    EventKind::CircuitHalfOpened,
                    EventKind::CircuitClosed,
                ];
                let expected: Vec<EventKind> =
                    (0..3).flat_map(|_| one_cycle.iter().cloned()).collect();
                assert_eq!(transitions(&log), expected, "{at}");
                // 4 refusals per cycle, each reported.
                assert_eq!(
                    support::refusals(&log, RejectionReason::CircuitOpen),
                    12,
                    "{at}"
                );
            }
        }
    }
}

/// The same cycles in a partition: its circuit is its own, and protects as
/// the pipeline's does, far from the clock's origin.
#[test]
fn a_partition_cycles_far_from_the_clock_origin() {
    let breaker = CircuitBreaker::consecutive_failures(2).cooldown(secs(30));
    for (p, _, clock, flavor, at) in
        cases("partition-cycles", &breaker, &[FAR], &FLAVORS, &UNLISTENED)
    {
        let part = p.partition("tenant-a");
        let call = |op: Op| part_exec(&part, flavor, op);
        for cycle in 0..3 {
            clock.advance(secs(86_400));
            assert!(call(boom).is_err());
            assert!(call(boom).is_err());
            assert_eq!(
                open_refusal(&call(ok)),
                Some(Some(secs(30))),
                "{at} cycle {cycle}"
            );
            // The pipeline's own circuit never moved.
            assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
            assert_eq!(state(&p), CircuitState::Closed);
            clock.advance(secs(30));
            assert_eq!(call(ok).unwrap(), 1, "{at} cycle {cycle}: the probe");
            assert_eq!(part.circuit_metrics().unwrap().state, CircuitState::Closed);
        }
    }
}

/// failsafe's `state_machine` test: consecutive failures, a success ends
/// the run, an exponential cooldown (5 s, then 10 s), a failed probe opens
/// again, a successful one closes.
#[test]
fn consecutive_failures_as_failsafe_checks_them() {
    let breaker = CircuitBreaker::consecutive_failures(3)
        .cooldown(secs(5))
        .cooldown_growth(2.0, secs(300));
    for (p, _, clock, flavor, at) in cases("failsafe", &breaker, &OFFSETS, &FLAVORS, &UNLISTENED) {
        for _ in 0..10 {
            assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
        }
        // Two failures, a success ends the run, two more: still closed.
        for op in [boom, boom, ok, boom, boom] {
            let _ = exec(&p, flavor, op);
            assert_eq!(state(&p), CircuitState::Closed, "{at}");
        }
        assert_eq!(metrics(&p).failures, 2);
        let _ = exec(&p, flavor, boom);
        assert_eq!(state(&p), CircuitState::Open);
        for _ in 0..10 {
            assert!(open_refusal(&exec(&p, flavor, ok)).is_some());
        }
        clock.advance(secs(2));
        assert_eq!(open_refusal(&exec(&p, flavor, ok)), Some(Some(secs(3))));
        clock.advance(secs(4));
        let _ = exec(&p, flavor, boom); // the probe fails
        assert_eq!(open_refusal(&exec(&p, flavor, ok)), Some(Some(secs(10))));
        clock.advance(secs(5));
        assert!(open_refusal(&exec(&p, flavor, ok)).is_some());
        clock.advance(secs(6));
        assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
        assert_eq!(state(&p), CircuitState::Closed, "{at}");
        for _ in 0..10 {
            assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
        }
    }
}

// ---------------------------------------------------------------------------
// Thresholds and windows.
// ---------------------------------------------------------------------------

/// `(threshold, calls)` pairs where `threshold * calls` is a whole number
/// of failures: the failure that brings the rate exactly to the threshold
/// must open ("at or above", `CircuitBreaker::failure_rate` field doc).
const EXACT: [(f64, u32); 14] = [
    (0.5, 4),
    (0.5, 10),
    (0.3, 10),
    (0.7, 10),
    (0.6, 5),
    (0.2, 5),
    (0.1, 10),
    (0.9, 10),
    (0.25, 4),
    (0.75, 4),
    (1.0, 3),
    (0.45, 20),
    (0.35, 20),
    (0.55, 20),
];

/// The failures that bring `size` calls exactly to `threshold`.
fn failures_at(threshold: f64, size: u32) -> u32 {
    (threshold * f64::from(size)).round() as u32
}

/// Makes `size - failures` successful calls, then `failures` failing ones,
/// running `between` after each but the last: the circuit must stay closed
/// until the last failure, which reaches the threshold and must open it.
/// Returns the metrics then.
fn fail_up_to_the_threshold(
    p: &Pipeline,
    flavor: Flavor,
    (size, failures): (u32, u32),
    between: impl Fn(),
    at: &str,
) -> CircuitMetrics {
    for _ in 0..size - failures {
        assert_eq!(exec(p, flavor, ok).unwrap(), 1);
        between();
    }
    for i in 1..failures {
        let _ = exec(p, flavor, boom);
        between();
        assert_eq!(state(p), CircuitState::Closed, "{at}: failure {i}");
    }
    let _ = exec(p, flavor, boom);
    let m = metrics(p);
    assert_eq!(
        counts(&m),
        (CircuitState::Open, u64::from(size), u64::from(failures), 0),
        "{at}: the failure that reaches the threshold opens"
    );
    m
}

#[test]
fn a_count_window_opens_exactly_at_the_failure_rate_threshold() {
    for (threshold, size) in EXACT {
        let failures = failures_at(threshold, size);
        let breaker = CircuitBreaker::failure_rate(threshold)
            .count_window(size)
            .minimum_calls(size);
        for (p, _, _, flavor, at) in
            cases("exact-count", &breaker, &NEAR_FAR, &FLAVORS, &UNLISTENED)
        {
            let at = format!("{threshold} of {size}, {at}");
            let m = fail_up_to_the_threshold(&p, flavor, (size, failures), || {}, &at);
            assert_eq!(m.failure_rate, f64::from(failures) / f64::from(size));
        }
    }
}

#[test]
fn a_time_window_opens_exactly_at_the_failure_rate_threshold() {
    for (threshold, size) in EXACT {
        let failures = failures_at(threshold, size);
        let breaker = CircuitBreaker::failure_rate(threshold)
            .window(secs(60))
            .minimum_calls(size);
        for (p, _, clock, flavor, at) in cases("exact-time", &breaker, &OFFSETS, &SYNC, &UNLISTENED)
        {
            let at = format!("{threshold} of {size}, {at}");
            // Spread over the window: one call a second.
            let one_second = || clock.advance(secs(1));
            fail_up_to_the_threshold(&p, flavor, (size, failures), one_second, &at);
        }
    }
}

/// Just below the threshold with a full window: closed (Resilience4j's
/// `shouldNotOpen...` cases); the ring then slides.
#[test]
fn below_the_threshold_a_full_window_stays_closed_and_slides() {
    let breaker = CircuitBreaker::failure_rate(0.5)
        .count_window(10)
        .minimum_calls(10);
    for (p, _, _, flavor, at) in cases("below", &breaker, &[FAR], &FLAVORS, &UNLISTENED) {
        for _ in 0..6 {
            assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
        }
        for _ in 0..4 {
            let _ = exec(&p, flavor, boom);
        }
        let m = metrics(&p);
        assert_eq!(counts(&m), (CircuitState::Closed, 10, 4, 0), "{at}");
        assert!((m.failure_rate - 0.4).abs() < 1e-12);
        // The 11th call pushes the oldest success out: 5 of 10 failed.
        let _ = exec(&p, flavor, boom);
        assert_eq!(counts(&metrics(&p)), (CircuitState::Open, 10, 5, 0), "{at}");
    }
}

/// Resilience4j: no judgement before `minimumNumberOfCalls`. Its metrics
/// then report a failure rate of -1; seawall's report the rate of the
/// calls counted so far (`CircuitMetrics::failure_rate`: "failures /
/// calls, 0 when empty").
#[test]
fn nothing_is_judged_below_the_minimum_calls_and_the_rate_shows_what_is_counted() {
    for (mode, breaker) in [
        (
            "count",
            CircuitBreaker::failure_rate(0.5)
                .count_window(20)
                .minimum_calls(5),
        ),
        (
            "time",
            CircuitBreaker::failure_rate(0.5)
                .window(secs(30))
                .minimum_calls(5),
        ),
    ] {
        for (p, _, _, flavor, at) in cases("minimum", &breaker, &[FAR], &FLAVORS, &UNLISTENED) {
            let at = format!("{mode} {at}");
            let m = metrics(&p);
            assert_eq!(counts(&m), (CircuitState::Closed, 0, 0, 0));
            assert_eq!((m.failure_rate, m.slow_call_rate), (0.0, 0.0), "{at}");
            for i in 1..=4u64 {
                let _ = exec(&p, flavor, boom);
                let m = metrics(&p);
                assert_eq!(counts(&m), (CircuitState::Closed, i, i, 0), "{at}");
                assert_eq!(m.failure_rate, 1.0);
            }
            let _ = exec(&p, flavor, boom);
            assert_eq!(state(&p), CircuitState::Open, "{at}");
        }
    }
}

/// Documented: a count window never holds more than its size, so a larger
/// minimum is taken as the size (Resilience4j does the same).
#[test]
fn a_minimum_above_the_count_window_is_the_window_size() {
    let breaker = CircuitBreaker::failure_rate(0.5)
        .count_window(5)
        .minimum_calls(10);
    for (p, _, _, flavor, at) in cases("minimum-above", &breaker, &[FAR], &FLAVORS, &UNLISTENED) {
        for _ in 0..4 {
            let _ = exec(&p, flavor, boom);
            assert_eq!(state(&p), CircuitState::Closed);
        }
        let _ = exec(&p, flavor, boom);
        assert_eq!(state(&p), CircuitState::Open, "{at}");
    }
}

/// Documented departure from Resilience4j (whose test opens on the 5th
/// call, a success): the rates are judged on a failed or slow call only.
#[test]
fn a_success_that_fills_the_window_does_not_judge_it() {
    let breaker = CircuitBreaker::failure_rate(0.5)
        .count_window(5)
        .minimum_calls(5);
    for (p, _, _, flavor, at) in cases("success-fills", &breaker, &[FAR], &FLAVORS, &UNLISTENED) {
        for op in [boom, boom, boom, ok, ok] {
            let _ = exec(&p, flavor, op);
        }
        assert_eq!(
            counts(&metrics(&p)),
            (CircuitState::Closed, 5, 3, 0),
            "{at}"
        );
        let _ = exec(&p, flavor, boom);
        assert_eq!(state(&p), CircuitState::Open, "{at}");
    }
}

/// A time window forgets calls older than its length, at any reading.
#[test]
fn a_time_window_forgets_old_calls_at_any_clock_reading() {
    let breaker = CircuitBreaker::failure_rate(0.5)
        .window(secs(5))
        .minimum_calls(4);
    for (p, _, clock, flavor, at) in
        cases("time-forgets", &breaker, &OFFSETS, &FLAVORS, &UNLISTENED)
    {
        for _ in 0..3 {
            let _ = exec(&p, flavor, boom);
        }
        clock.advance(secs(5));
        assert_eq!(
            counts(&metrics(&p)),
            (CircuitState::Closed, 0, 0, 0),
            "{at}"
        );
        // A fourth failure alone is below the minimum.
        let _ = exec(&p, flavor, boom);
        assert_eq!(state(&p), CircuitState::Closed, "{at}");
        for _ in 0..3 {
            let _ = exec(&p, flavor, boom);
        }
        assert_eq!(state(&p), CircuitState::Open, "{at}");
    }
}

/// Resilience4j's `shouldOpenAfterSlowCallRateThresholdExceeded`: a call
/// lasting at least the slow-call duration is slow, and the slow-call rate
/// opens the window whatever the failures; exactly at the threshold too.
#[test]
fn the_slow_call_rate_opens_at_its_threshold_and_a_call_of_exactly_the_duration_is_slow() {
    let breaker = CircuitBreaker::failure_rate(1.0)
        .count_window(4)
        .minimum_calls(4)
        .slow_calls(0.5, secs(2));
    for (p, _, clock, flavor, at) in cases("slow", &breaker, &OFFSETS, &FLAVORS, &LISTENS) {
        let _ = exec(&p, flavor, lasting(&clock, ms(1999), 1));
        let _ = exec(&p, flavor, lasting(&clock, ms(10), 1));
        let _ = exec(&p, flavor, lasting(&clock, secs(3), 1));
        assert_eq!(
            counts(&metrics(&p)),
            (CircuitState::Closed, 3, 0, 1),
            "{at}"
        );
        // Exactly 2 s: slow; 2 of 4 = the threshold.
        let _ = exec(&p, flavor, lasting(&clock, secs(2), 1));
        let m = metrics(&p);
        assert_eq!(counts(&m), (CircuitState::Open, 4, 0, 2), "{at}");
        assert_eq!(m.slow_call_rate, 0.5);
    }
}

/// A slow probe (even a successful one) opens the circuit again
/// (`half_open_calls`: "one failed or slow probe opens it again").
#[test]
fn a_slow_probe_opens_the_circuit_again() {
    let breaker = CircuitBreaker::failure_rate(0.5)
        .count_window(2)
        .minimum_calls(2)
        .slow_calls(1.0, secs(1))
        .cooldown(secs(10));
    for (p, _, clock, flavor, at) in cases("slow-probe", &breaker, &OFFSETS, &FLAVORS, &UNLISTENED)
    {
        trip(&p, flavor, 2);
        clock.advance(secs(10));
        let r = exec(&p, flavor, lasting(&clock, secs(1), 7));
        assert_eq!(r.unwrap(), 7);
        let m = metrics(&p);
        assert_eq!((m.state, m.trips), (CircuitState::Open, 2), "{at}");
    }
}

// ---------------------------------------------------------------------------
// Half-open.
// ---------------------------------------------------------------------------

/// Trips a circuit of three probes with a 7 s cooldown, lets the cooldown
/// pass and runs `probes` on it, which checks that exactly three probes
/// are admitted; then the circuit must have closed in that one round.
fn three_probes_close(name: &str, probes: impl Fn(&Pipeline, &str)) {
    let breaker = CircuitBreaker::consecutive_failures(1)
        .cooldown(secs(7))
        .half_open_calls(3);
    for (p, log, clock, _, at) in cases(name, &breaker, &OFFSETS, &SYNC, &LISTENS) {
        let _ = p.call(boom);
        clock.advance(secs(7));
        probes(&p, &at);
        assert_eq!(state(&p), CircuitState::Closed, "{at}");
        if let Some(log) = log {
            assert_eq!(transitions(&log), opened_then_closed(secs(7)));
        }
    }
}

/// Resilience4j's `shouldOnlyPermitFourCallsInHalfOpenState`, sync: three
/// probes held by nested calls, the fourth refused with the cooldown that
/// just ended as its hint; the last success closes.
#[test]
fn half_open_admits_exactly_the_probe_count_sync() {
    three_probes_close("probes-sync", |p, _| {
        let mut refused = Vec::new();
        let r = p.call(|_| {
            let inner = p.call(|_| {
                let inner = p.call(|_| {
                    // Every slot taken: refused, twice.
                    refused.push(open_refusal(&p.call(ok)));
                    refused.push(open_refusal(&p.call(ok)));
                    assert_eq!(state(p), CircuitState::HalfOpen);
                    Ok::<u32, Boom>(1)
                });
                assert_eq!(inner.unwrap(), 1);
                // One success of three: still half-open.
                assert_eq!(state(p), CircuitState::HalfOpen);
                Ok::<u32, Boom>(2)
            });
            assert_eq!(inner.unwrap(), 2);
            assert_eq!(state(p), CircuitState::HalfOpen);
            Ok::<u32, Boom>(3)
        });
        assert_eq!(r.unwrap(), 3);
        assert_eq!(refused, [Some(Some(secs(7))), Some(Some(secs(7)))]);
    });
}

/// The same with async calls whose probes are pending together.
#[test]
fn half_open_admits_exactly_the_probe_count_async() {
    three_probes_close("probes-async", |p, at| {
        rt().block_on(async {
            let gate = Arc::new(tokio::sync::Semaphore::new(0));
            let mut probes = Vec::new();
            for _ in 0..3 {
                let (p, gate) = (p.clone(), gate.clone());
                probes.push(tokio::spawn(async move {
                    p.run(|_| {
                        let gate = gate.clone();
                        async move {
                            let _permit = gate.acquire().await.unwrap();
                            Ok::<u32, Boom>(1)
                        }
                    })
                    .await
                }));
            }
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            assert_eq!(state(p), CircuitState::HalfOpen);
            for _ in 0..2 {
                let r = p.run(|_| async { Ok::<u32, Boom>(1) }).await;
                assert_eq!(open_refusal(&r), Some(Some(secs(7))), "{at}");
            }
            gate.add_permits(3);
            for probe in probes {
                assert_eq!(probe.await.unwrap().unwrap(), 1);
            }
        });
    });
}

/// Documented departure from Resilience4j (which judges the round of
/// probes by the failure rate): one failed probe opens the circuit at
/// once, and the other probes' outcomes that come later count for nothing.
#[test]
fn one_failed_probe_opens_at_once_and_later_outcomes_are_ignored() {
    let breaker = CircuitBreaker::failure_rate(0.5)
        .count_window(4)
        .minimum_calls(4)
        .cooldown(secs(5))
        .half_open_calls(4);
    for (p, _, clock, _, at) in cases("probe-fails", &breaker, &OFFSETS, &SYNC, &UNLISTENED) {
        trip(&p, Flavor::Sync, 4);
        clock.advance(secs(5));
        let r = p.call(|_| {
            // Three successes and one failure out of four: 25 % failed,
            // which closes Resilience4j's breaker at 50 %; this one opens.
            for _ in 0..2 {
                assert_eq!(p.call(ok).unwrap(), 1);
            }
            assert!(p.call(boom).is_err());
            assert_eq!(state(&p), CircuitState::Open);
            Ok::<u32, Boom>(1)
        });
        assert_eq!(r.unwrap(), 1);
        let m = metrics(&p);
        assert_eq!((m.state, m.trips), (CircuitState::Open, 2), "{at}");
    }
}

/// Classification (Resilience4j's ignored and recorded exceptions): an
/// ignored error counts for nothing, an aborted one is a success, a
/// throttled one is not recorded; in half-open an ignored error gives its
/// probe slot back.
#[test]
fn classified_errors_count_as_documented() {
    for (clock, flavor, listen, at) in grid(&NEAR_FAR, &FLAVORS, &LISTENS) {
        let breaker = CircuitBreaker::failure_rate(0.5)
            .count_window(10)
            .minimum_calls(4)
            .cooldown(secs(5));
        let p = builder("classified", breaker, &clock, listen)
            .classify(classify)
            .build()
            .unwrap();
        let _ = exec(&p, flavor, err(0));
        let _ = exec(&p, flavor, err(3));
        assert_eq!(
            counts(&metrics(&p)),
            (CircuitState::Closed, 0, 0, 0),
            "{at}"
        );
        let _ = exec(&p, flavor, err(2));
        assert_eq!(
            counts(&metrics(&p)),
            (CircuitState::Closed, 1, 0, 0),
            "{at}"
        );
        for _ in 0..4 {
            let _ = exec(&p, flavor, err(0));
        }
        for _ in 0..3 {
            let _ = exec(&p, flavor, err(1));
        }
        // 3 failures of 4 calls counted.
        assert_eq!(counts(&metrics(&p)), (CircuitState::Open, 4, 3, 0), "{at}");
        clock.advance(secs(5));
        // Ignored probes give their slot back; throttled ones too.
        for n in [0, 3, 0] {
            let _ = exec(&p, flavor, err(n));
            assert_eq!(state(&p), CircuitState::HalfOpen, "{at}");
        }
        // An aborted probe is a success: closes.
        let _ = exec(&p, flavor, err(2));
        assert_eq!(state(&p), CircuitState::Closed, "{at}");
    }
}

/// A call that never ends records nothing: a dropped half-open probe gives
/// its slot back (the next call is the probe), a dropped call in a closed
/// circuit is not counted, a panicking probe gives its slot back too.
#[test]
fn calls_that_never_end_record_nothing() {
    fn poll_once<F: std::future::Future>(f: F) -> Poll<F::Output> {
        let mut f = std::pin::pin!(f);
        f.as_mut().poll(&mut TaskContext::from_waker(Waker::noop()))
    }
    let breaker = CircuitBreaker::failure_rate(0.5)
        .count_window(4)
        .minimum_calls(2)
        .cooldown(secs(5));
    for (p, _, clock, _, at) in cases("never-ends", &breaker, &OFFSETS, &SYNC, &LISTENS) {
        // Closed: a dropped call is not counted.
        let _rt = rt();
        let _guard = _rt.enter();
        assert!(poll_once(p.run(|_| std::future::pending::<Result<u32, Boom>>())).is_pending());
        assert_eq!(metrics(&p).calls, 0, "{at}");
        let _ = p.call(boom);
        let _ = p.call(boom);
        assert_eq!(state(&p), CircuitState::Open, "{at}");
        clock.advance(secs(5));
        // The probe is admitted and dropped: half-open, slot given back.
        assert!(poll_once(p.run(|_| std::future::pending::<Result<u32, Boom>>())).is_pending());
        assert_eq!(state(&p), CircuitState::HalfOpen, "{at}");
        // A probe that panics gives its slot back too.
        let panicked = catch_unwind(AssertUnwindSafe(|| {
            p.call(|_| -> Result<u32, Boom> { panic!("probe panics") })
        }));
        assert!(panicked.is_err());
        assert_eq!(state(&p), CircuitState::HalfOpen, "{at}");
        // So this call is the probe, and closes.
        assert_eq!(p.call(ok).unwrap(), 1, "{at}");
        assert_eq!(state(&p), CircuitState::Closed, "{at}");
    }
}

/// Resilience4j's `maxWaitDurationInHalfOpenState` (without the trip):
/// a probe that hangs no longer blocks once the round is that old, at a
/// clock reading far from 0.
#[test]
fn a_hanging_probe_gives_way_after_max_half_open_far_from_zero() {
    let breaker = CircuitBreaker::consecutive_failures(1)
        .cooldown(secs(5))
        .max_half_open(secs(2));
    for (p, log, clock, _, at) in cases("max-half-open", &breaker, &OFFSETS, &SYNC, &LISTENED) {
        let _ = p.call(boom);
        clock.advance(secs(5));
        let r = p.call(|_| {
            clock.advance(ms(1999));
            assert!(open_refusal(&p.call(ok)).is_some());
            clock.advance(ms(1));
            assert_eq!(p.call(ok).unwrap(), 1);
            assert_eq!(state(&p), CircuitState::Closed);
            Err::<u32, Boom>(Boom(9))
        });
        assert!(r.is_err());
        assert_eq!(state(&p), CircuitState::Closed, "{at}");
        assert_eq!(
            support::count(&log.unwrap(), |e| matches!(
                e,
                EventKind::CircuitProbesExpired
            )),
            1
        );
    }
}

// ---------------------------------------------------------------------------
// Manual states, reset, metrics, events.
// ---------------------------------------------------------------------------

/// Resilience4j's forced-open, disabled and reset transitions.
#[test]
fn isolate_disable_enable_reset_and_open_for() {
    let breaker = CircuitBreaker::consecutive_failures(2)
        .cooldown(secs(10))
        .cooldown_growth(3.0, secs(100));
    for (p, log, clock, flavor, at) in cases("manual", &breaker, &OFFSETS, &FLAVORS, &LISTENED) {
        let log = log.unwrap();
        // Isolated: refused without a hint, past any cooldown.
        p.isolate().unwrap();
        assert_eq!(state(&p), CircuitState::Isolated);
        for _ in 0..3 {
            assert_eq!(open_refusal(&exec(&p, flavor, ok)), Some(None), "{at}");
            clock.advance(secs(1_000));
        }
        p.reset().unwrap();
        let m = metrics(&p);
        assert_eq!((m.state, m.calls, m.trips), (CircuitState::Closed, 0, 0));
        assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
        // Trip, fail a probe (trips 2, cooldown 30 s), reset: closed,
        // no trip history, so the next trip has the base cooldown.
        trip(&p, flavor, 2);
        clock.advance(secs(10));
        let _ = exec(&p, flavor, boom);
        assert_eq!(
            open_refusal(&exec(&p, flavor, ok)),
            Some(Some(secs(30))),
            "{at}"
        );
        p.reset().unwrap();
        assert_eq!(exec(&p, flavor, ok).unwrap(), 1, "{at}: reset admits");
        trip(&p, flavor, 2);
        assert_eq!(
            open_refusal(&exec(&p, flavor, ok)),
            Some(Some(secs(10))),
            "{at}"
        );
        // Disabled: admits everything, records nothing.
        p.disable().unwrap();
        for _ in 0..5 {
            assert!(matches!(exec(&p, flavor, boom), Err(Error::Operation(_))));
        }
        assert_eq!(state(&p), CircuitState::Disabled, "{at}");
        p.enable().unwrap();
        assert_eq!(state(&p), CircuitState::Closed, "{at}");
        let _ = exec(&p, flavor, boom);
        assert_eq!(state(&p), CircuitState::Closed, "{at}: one failure of two");
        // Open for a while, from closed.
        p.open_for(secs(3)).unwrap();
        assert_eq!(
            open_refusal(&exec(&p, flavor, ok)),
            Some(Some(secs(3))),
            "{at}"
        );
        clock.advance(secs(3));
        assert_eq!(exec(&p, flavor, ok).unwrap(), 1, "{at}: the probe");
        assert_eq!(state(&p), CircuitState::Closed, "{at}");
        assert_eq!(
            transitions(&log),
            [
                EventKind::CircuitOpened {
                    cooldown: Duration::MAX
                },
                EventKind::CircuitClosed, // reset
                EventKind::CircuitOpened { cooldown: secs(10) },
                EventKind::CircuitHalfOpened,
                EventKind::CircuitOpened { cooldown: secs(30) },
                EventKind::CircuitClosed, // reset
                EventKind::CircuitOpened { cooldown: secs(10) },
                EventKind::CircuitClosed, // disable
                EventKind::CircuitClosed, // enable
                EventKind::CircuitOpened { cooldown: secs(3) },
                EventKind::CircuitHalfOpened,
                EventKind::CircuitClosed,
            ],
            "{at}"
        );
    }
}

/// Resilience4j's metrics through the states: closed counts the window,
/// open the window that opened it, half-open the probes, closing starts
/// afresh; a refused call is not counted; time in state restarts.
#[test]
fn metrics_follow_the_states() {
    let breaker = CircuitBreaker::failure_rate(0.5)
        .count_window(4)
        .minimum_calls(4)
        .cooldown(secs(5))
        .half_open_calls(2);
    for (p, _, clock, flavor, at) in cases("metrics", &breaker, &OFFSETS, &FLAVORS, &UNLISTENED) {
        assert_eq!(metrics(&p), CircuitMetrics::closed_empty());
        for op in [ok, boom, ok, boom] {
            let _ = exec(&p, flavor, op);
        }
        let m = metrics(&p);
        assert_eq!(counts(&m), (CircuitState::Open, 4, 2, 0), "{at}");
        assert_eq!((m.failure_rate, m.trips), (0.5, 1));
        clock.advance(secs(2));
        assert!(open_refusal(&exec(&p, flavor, ok)).is_some());
        let m = metrics(&p);
        assert_eq!(counts(&m), (CircuitState::Open, 4, 2, 0), "{at}");
        assert_eq!(m.time_in_state, secs(2), "{at}");
        clock.advance(secs(3));
        assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
        let m = metrics(&p);
        assert_eq!(counts(&m), (CircuitState::HalfOpen, 1, 0, 0), "{at}");
        assert_eq!(m.time_in_state, Duration::ZERO);
        clock.advance(secs(1));
        assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
        let m = metrics(&p);
        assert_eq!(counts(&m), (CircuitState::Closed, 0, 0, 0), "{at}");
        assert_eq!((m.trips, m.time_in_state), (0, Duration::ZERO));
    }
}

// ---------------------------------------------------------------------------
// The system clock.
// ---------------------------------------------------------------------------

/// On the default clock: open and refusing at once after the trip, with a
/// hint of at most the cooldown (no sleep).
#[test]
fn on_the_system_clock_an_open_circuit_refuses() {
    for flavor in FLAVORS {
        for listen in LISTENS {
            for explicit in [false, true] {
                let mut b = support::listen(
                    Pipeline::builder(unique("system-clock")).circuit_breaker(
                        CircuitBreaker::consecutive_failures(1).cooldown(secs(60)),
                    ),
                    listen,
                );
                if explicit {
                    b = b.clock(SystemClock);
                }
                let p = b.build().unwrap();
                assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
                assert!(exec(&p, flavor, boom).is_err());
                assert_eq!(state(&p), CircuitState::Open);
                for _ in 0..3 {
                    let hint = open_hint(&exec(&p, flavor, ok), &format!("{flavor:?} {listen}"));
                    // The end of a cooldown is kept in whole milliseconds,
                    // rounded up (module docs): the hint may exceed the
                    // cooldown by less than a millisecond.
                    assert!(hint > secs(50) && hint < secs(60) + ms(1), "{hint:?}");
                }
                assert_eq!(metrics(&p).trips, 1);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Configuration.
// ---------------------------------------------------------------------------

fn refused_at_build(b: CircuitBreaker) -> Result<ConfigError, String> {
    let shown = format!("{b:?}");
    match catch_unwind(AssertUnwindSafe(|| {
        Pipeline::builder(unique("bad-config"))
            .circuit_breaker(b)
            .build()
            .map(drop)
    })) {
        Ok(Err(e)) => Ok(e),
        Ok(Ok(())) => Err(format!("{shown}: built")),
        Err(_) => Err(format!("{shown}: build panicked")),
    }
}

/// Resilience4j's `CircuitBreakerConfigTest`: bad values fail at build,
/// naming the field; never a panic.
#[test]
fn bad_configuration_fails_at_build_naming_the_field() {
    let window = || CircuitBreaker::failure_rate(0.5);
    let mut with_slow_duration = CircuitBreaker::failure_rate(0.5);
    with_slow_duration.slow_call_rate = Some(0.5);
    with_slow_duration.slow_call_duration = Duration::ZERO;
    let mut negative_max = CircuitBreaker::failure_rate(0.5).cooldown(secs(10));
    negative_max.max_cooldown = secs(1);
    let cases: Vec<(CircuitBreaker, &str)> = vec![
        (CircuitBreaker::failure_rate(0.0), "failure_rate"),
        (CircuitBreaker::failure_rate(-0.5), "failure_rate"),
        (CircuitBreaker::failure_rate(1.0000001), "failure_rate"),
        (CircuitBreaker::failure_rate(50.0), "failure_rate"),
        (CircuitBreaker::failure_rate(f64::NAN), "failure_rate"),
        (CircuitBreaker::failure_rate(f64::INFINITY), "failure_rate"),
        (CircuitBreaker::failure_rate(-0.0), "failure_rate"),
        (window().slow_calls(0.0, secs(1)), "slow_call_rate"),
        (window().slow_calls(1.5, secs(1)), "slow_call_rate"),
        (window().slow_calls(f64::NAN, secs(1)), "slow_call_rate"),
        (window().slow_calls(-1.0, secs(1)), "slow_call_rate"),
        (
            window().slow_calls(0.5, Duration::ZERO),
            "slow_call_duration",
        ),
        (with_slow_duration, "slow_call_duration"),
        (window().count_window(0), "count_window"),
        (window().count_window(1_000_001), "count_window"),
        (window().count_window(u32::MAX), "count_window"),
        (window().window(Duration::ZERO), "window"),
        (window().window(secs(3601)), "window"),
        (window().window(ms(3_600_001)), "window"),
        (window().window(Duration::MAX), "window"),
        (window().minimum_calls(0), "minimum_calls"),
        (window().window(secs(10)).minimum_calls(0), "minimum_calls"),
        (window().count_window(10).minimum_calls(0), "minimum_calls"),
        (
            CircuitBreaker::consecutive_failures(0),
            "consecutive_failures",
        ),
        (
            CircuitBreaker::consecutive_failures(3).minimum_calls(5),
            "minimum_calls",
        ),
        (
            CircuitBreaker::consecutive_failures(3).slow_calls(0.5, secs(1)),
            "slow_call_rate",
        ),
        (window().cooldown(Duration::ZERO), "cooldown"),
        (
            CircuitBreaker::consecutive_failures(1).cooldown(Duration::ZERO),
            "cooldown",
        ),
        (window().cooldown_growth(0.5, secs(60)), "cooldown_growth"),
        (
            window().cooldown_growth(f64::NAN, secs(60)),
            "cooldown_growth",
        ),
        (
            window().cooldown_growth(f64::INFINITY, secs(60)),
            "cooldown_growth",
        ),
        (window().cooldown_growth(-2.0, secs(60)), "cooldown_growth"),
        (
            window().cooldown(secs(60)).cooldown_growth(2.0, secs(10)),
            "max_cooldown",
        ),
        (negative_max, "max_cooldown"),
        (window().half_open_calls(0), "half_open_calls"),
        (
            window().half_open_calls(CircuitBreaker::MAX_HALF_OPEN_CALLS + 1),
            "half_open_calls",
        ),
        (window().half_open_calls(u32::MAX), "half_open_calls"),
        (window().max_half_open(Duration::ZERO), "max_half_open"),
    ];
    let mut wrong = Vec::new();
    for (b, field) in cases {
        match refused_at_build(b) {
            Ok(e) if e.policy == "circuit_breaker" && e.field == field => {
                // The message names the policy and the field.
                let text = e.to_string();
                if !text.starts_with(&format!("circuit_breaker.{field} ")) {
                    wrong.push(format!("{field}: message `{text}`"));
                }
            }
            Ok(e) => wrong.push(format!(
                "expected circuit_breaker.{field}, got {}.{}: {}",
                e.policy, e.field, e.rule
            )),
            Err(e) => wrong.push(format!("expected circuit_breaker.{field}: {e}")),
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Values at the edge of what is allowed build, and run without panicking.
#[test]
fn edge_values_build_and_run() {
    let good = [
        CircuitBreaker::failure_rate(1.0),
        CircuitBreaker::failure_rate(f64::MIN_POSITIVE),
        CircuitBreaker::failure_rate(0.5)
            .count_window(1)
            .minimum_calls(1),
        CircuitBreaker::failure_rate(0.5).count_window(1_000_000),
        CircuitBreaker::failure_rate(0.5).window(secs(3600)),
        CircuitBreaker::failure_rate(0.5).window(Duration::from_nanos(1)),
        CircuitBreaker::failure_rate(0.5).minimum_calls(u32::MAX),
        CircuitBreaker::failure_rate(0.5).slow_calls(1.0, Duration::MAX),
        CircuitBreaker::failure_rate(0.5).slow_calls(1.0, Duration::from_nanos(1)),
        CircuitBreaker::consecutive_failures(u32::MAX),
        CircuitBreaker::consecutive_failures(1).cooldown(Duration::MAX),
        CircuitBreaker::consecutive_failures(1).cooldown(Duration::from_nanos(1)),
        CircuitBreaker::consecutive_failures(1).cooldown_growth(f64::MAX, Duration::MAX),
        CircuitBreaker::consecutive_failures(1).max_half_open(Duration::MAX),
        CircuitBreaker::consecutive_failures(1)
            .half_open_calls(CircuitBreaker::MAX_HALF_OPEN_CALLS),
        CircuitBreaker::consecutive_failures(1).count_window(3),
    ];
    for b in good {
        for (clock, _, _, at) in grid(&NEAR_FAR, &SYNC, &UNLISTENED) {
            let shown = format!("{b:?}");
            let run = catch_unwind(AssertUnwindSafe(|| {
                let p = builder("edge", b.clone(), &clock, false)
                    .build()
                    .unwrap_or_else(|e| panic!("{shown}: {e}"));
                for _ in 0..3 {
                    let _ = p.call(boom);
                    let _ = p.call(ok);
                    clock.advance(secs(3600));
                }
                let _ = metrics(&p);
            }));
            assert!(run.is_ok(), "{shown} {at} panicked");
        }
    }
}

/// A cooldown of `Duration::MAX` keeps the circuit open until the clock's
/// end (module docs: "an end beyond what that holds ... stays open until
/// the latest instant of the clock").
#[test]
fn an_endless_cooldown_stays_open() {
    let breaker = CircuitBreaker::consecutive_failures(1).cooldown(Duration::MAX);
    for (p, _, clock, _, at) in cases("endless", &breaker, &NEAR_FAR, &SYNC, &UNLISTENED) {
        let _ = p.call(boom);
        clock.advance(secs(1_000_000_000));
        assert!(open_refusal(&p.call(ok)).is_some(), "{at}");
    }
}

// ---------------------------------------------------------------------------
// More cycles: sub-millisecond readings, growth, fresh windows.
// ---------------------------------------------------------------------------

/// Clock readings that are not whole milliseconds: the end of a cooldown is
/// rounded up to a whole millisecond, never before the cooldown is over.
#[test]
fn cycles_at_readings_between_milliseconds() {
    let offsets: Vec<Duration> = OFFSETS
        .iter()
        .flat_map(|&base| [1u64, 123_456, 999_999].map(|frac| base + Duration::from_nanos(frac)))
        .collect();
    let breaker = CircuitBreaker::consecutive_failures(1).cooldown(secs(5));
    for (p, _, clock, flavor, at) in cases("sub-ms", &breaker, &offsets, &FLAVORS, &UNLISTENED) {
        for cycle in 0..3 {
            clock.advance(secs(7200) + Duration::from_nanos(777));
            let _ = exec(&p, flavor, boom);
            let hint = open_hint(&exec(&p, flavor, ok), &format!("{at} cycle {cycle}"));
            assert!(hint >= secs(5) && hint < secs(5) + ms(1), "{at}: {hint:?}");
            clock.advance(secs(5) - ms(1));
            assert!(open_refusal(&exec(&p, flavor, ok)).is_some(), "{at}");
            clock.advance(ms(2));
            assert_eq!(exec(&p, flavor, ok).unwrap(), 1, "{at} cycle {cycle}");
            assert_eq!(state(&p), CircuitState::Closed, "{at}");
        }
    }
}

/// The cooldown grows on each failed probe up to its cap, trips saturate
/// at 63 (documented), and a close forgets them.
#[test]
fn the_cooldown_grows_to_its_cap_and_trips_saturate() {
    let breaker = CircuitBreaker::consecutive_failures(1)
        .cooldown(secs(5))
        .cooldown_growth(2.0, secs(40));
    for (p, _, clock, flavor, at) in cases("growth", &breaker, &OFFSETS, &SYNC, &UNLISTENED) {
        let _ = exec(&p, flavor, boom);
        let mut expected = secs(5);
        for trip in 1..=70u32 {
            assert_eq!(
                open_refusal(&exec(&p, flavor, ok)),
                Some(Some(expected)),
                "{at} trip {trip}"
            );
            assert_eq!(metrics(&p).trips, trip.min(63));
            clock.advance(expected);
            let _ = exec(&p, flavor, boom); // the probe fails
            expected = (expected * 2).min(secs(40));
        }
        clock.advance(secs(40));
        assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
        assert_eq!(metrics(&p).trips, 0);
        let _ = exec(&p, flavor, boom);
        assert_eq!(open_refusal(&exec(&p, flavor, ok)), Some(Some(secs(5))));
    }
}

/// A full half-open circuit hints the cooldown that just ended, the grown
/// one after failed probes (`half_open_calls` docs).
#[test]
fn a_full_half_open_circuit_hints_the_grown_cooldown() {
    let breaker = CircuitBreaker::consecutive_failures(1)
        .cooldown(secs(4))
        .cooldown_growth(3.0, secs(100));
    for (p, _, clock, _, at) in cases("full-half-open", &breaker, &OFFSETS, &SYNC, &UNLISTENED) {
        let _ = p.call(boom);
        clock.advance(secs(4));
        let _ = p.call(boom);
        clock.advance(secs(12));
        let r = p.call(|_| Ok::<_, Boom>(open_refusal(&p.call(ok))));
        assert_eq!(r.unwrap(), Some(Some(secs(12))), "{at}");
        assert_eq!(state(&p), CircuitState::Closed);
    }
}

/// Closing starts a fresh window: the minimum must be reached again
/// before any judgement (Resilience4j resets its metrics on the
/// transition to closed too).
#[test]
fn closing_starts_a_fresh_window() {
    for (mode, breaker) in [
        (
            "count",
            CircuitBreaker::failure_rate(0.5)
                .count_window(10)
                .minimum_calls(4)
                .cooldown(secs(5)),
        ),
        (
            "time",
            CircuitBreaker::failure_rate(0.5)
                .window(secs(60))
                .minimum_calls(4)
                .cooldown(secs(5)),
        ),
    ] {
        for (p, _, clock, flavor, at) in
            cases("fresh-window", &breaker, &OFFSETS, &FLAVORS, &UNLISTENED)
        {
            let at = format!("{mode} {at}");
            for _ in 0..4 {
                let _ = exec(&p, flavor, boom);
            }
            assert_eq!(state(&p), CircuitState::Open, "{at}");
            clock.advance(secs(5));
            assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
            assert_eq!(state(&p), CircuitState::Closed, "{at}");
            for i in 1..=3u64 {
                let _ = exec(&p, flavor, boom);
                assert_eq!(
                    counts(&metrics(&p)),
                    (CircuitState::Closed, i, i, 0),
                    "{at}"
                );
            }
            let _ = exec(&p, flavor, boom);
            assert_eq!(state(&p), CircuitState::Open, "{at}");
        }
    }
}

/// Consecutive mode: an ignored error neither counts nor ends the run, an
/// aborted one (a success of the dependency) ends it.
#[test]
fn consecutive_mode_with_classified_errors() {
    for (clock, flavor, _, at) in grid(&NEAR_FAR, &FLAVORS, &UNLISTENED) {
        let breaker = CircuitBreaker::consecutive_failures(3).cooldown(secs(5));
        let p = builder("consecutive-classified", breaker, &clock, false)
            .classify(classify)
            .build()
            .unwrap();
        for n in [1, 1, 2, 1, 1, 0, 0] {
            let _ = exec(&p, flavor, err(n));
        }
        let m = metrics(&p);
        assert_eq!((m.state, m.failures), (CircuitState::Closed, 2), "{at}");
        let _ = exec(&p, flavor, err(1));
        assert_eq!(state(&p), CircuitState::Open, "{at}");
    }
}

// ---------------------------------------------------------------------------
// With a retry, a timeout; partitions left idle.
// ---------------------------------------------------------------------------

/// Makes a call whose every attempt returns `result`; returns the call's
/// result and how many attempts ran.
fn attempts(
    p: &Pipeline,
    flavor: Flavor,
    result: Result<u32, Boom>,
) -> (Result<u32, Error<Boom>>, u32) {
    let mut tries = 0;
    let r = exec(p, flavor, |_| {
        tries += 1;
        result.clone()
    });
    (r, tries)
}

/// Declared before the retry, the breaker records one outcome per call
/// (an exhausted retry is one failure); after it, every attempt, and a
/// circuit that opens mid-retry stops the retry (seawall never retries its
/// own rejections).
#[test]
fn a_breaker_around_or_inside_the_retry() {
    let breaker = || CircuitBreaker::consecutive_failures(2).cooldown(secs(60));
    for (clock, flavor, _, at) in grid(&NEAR_FAR, &FLAVORS, &UNLISTENED) {
        let outside = builder("breaker-outside", breaker(), &clock, false)
            .retry(seawall::Retry::constant(ms(10)).max_attempts(3))
            .build()
            .unwrap();
        let (r, tries) = attempts(&outside, flavor, Err(Boom(1)));
        assert!(
            matches!(r, Err(Error::RetryExhausted { attempts: 3, .. })),
            "{at}: {r:?}"
        );
        assert_eq!(tries, 3);
        let m = metrics(&outside);
        assert_eq!((m.state, m.failures), (CircuitState::Closed, 1), "{at}");
        let _ = exec(&outside, flavor, boom);
        assert_eq!(state(&outside), CircuitState::Open, "{at}");
        let (r, tries) = attempts(&outside, flavor, Ok(1));
        assert_eq!((open_refusal(&r).is_some(), tries), (true, 0), "{at}");

        // The retry declared first, so the breaker inside it.
        let inside = Pipeline::builder(unique("breaker-inside"))
            .retry(seawall::Retry::constant(ms(10)).max_attempts(5))
            .circuit_breaker(breaker())
            .clock(clock.clone())
            .build()
            .unwrap();
        let (r, tries) = attempts(&inside, flavor, Err(Boom(1)));
        assert!(r.is_err());
        assert_eq!(tries, 2, "{at}: the third attempt is refused");
        assert_eq!(state(&inside), CircuitState::Open, "{at}");
    }
}

/// A timed-out attempt is a failure (`store::Outcome::Failure`: "It failed
/// (including timeouts)"), as Resilience4j records a TimeoutException.
#[test]
fn a_timed_out_attempt_counts_as_a_failure() {
    for (clock, _, listen, at) in grid(&NEAR_FAR, &SYNC, &LISTENS) {
        let breaker = CircuitBreaker::consecutive_failures(2).cooldown(secs(60));
        let p = builder("timed-out", breaker, &clock, listen)
            .timeout(secs(1))
            .build()
            .unwrap();
        for i in 0..2 {
            let r = rt().block_on(p.run(|_| {
                let clock = clock.clone();
                async move {
                    seawall::Clock::sleep(&clock, secs(2)).await;
                    Ok::<u32, Boom>(1)
                }
            }));
            assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
            let expected = if i == 0 {
                CircuitState::Closed
            } else {
                CircuitState::Open
            };
            assert_eq!(state(&p), expected, "{at}");
        }
    }
}

/// An open partition is not dropped as idle: it keeps refusing after the
/// idle time (memory store docs: a key is dropped only when its circuit is
/// plain closed).
#[test]
fn an_open_partition_survives_idle_eviction() {
    for (clock, _, _, at) in grid(&OFFSETS, &SYNC, &UNLISTENED) {
        let breaker = CircuitBreaker::consecutive_failures(1).cooldown(secs(7200));
        let p = builder("idle-open", breaker, &clock, false)
            .partition_idle(secs(60))
            .build()
            .unwrap();
        let part = p.partition(7u64);
        let _ = part.call(boom);
        let _ = p.partition(8u64).call(ok);
        clock.advance(secs(3600));
        assert_eq!(p.evict_idle_partitions(), 1, "{at}: only the closed one");
        let part = p.partition(7u64);
        assert_eq!(open_refusal(&part.call(ok)), Some(Some(secs(3600))), "{at}");
    }
}

// ---------------------------------------------------------------------------
// Defaults, generations, shadow mode, the end of the clock.
// ---------------------------------------------------------------------------

/// The documented defaults (`CircuitBreaker` "Default" section), and how
/// they behave: `failure_rate(0.5)` judges from 20 calls, opens for 30 s.
#[test]
fn the_documented_defaults() {
    let b = CircuitBreaker::failure_rate(0.5);
    assert_eq!(b.mode, seawall::breaker::BreakerMode::CountWindow(100));
    assert_eq!(
        (b.minimum_calls, b.slow_call_rate, b.slow_call_duration),
        (20, None, secs(60))
    );
    assert_eq!(
        (b.cooldown, b.cooldown_growth, b.half_open_calls),
        (secs(30), 1.0, 1)
    );
    assert_eq!((b.max_half_open, b.shadow), (None, false));
    let c = CircuitBreaker::consecutive_failures(3);
    assert_eq!(
        c.mode,
        seawall::breaker::BreakerMode::ConsecutiveFailures(3)
    );
    assert_eq!((c.failure_rate, c.minimum_calls), (1.0, 0));
    assert_eq!(c.clone().window(secs(10)).minimum_calls, 20);
    assert_eq!(
        CircuitBreaker::failure_rate(0.5).window(ms(1500)).mode,
        seawall::breaker::BreakerMode::TimeWindow(2),
        "rounded up to whole seconds"
    );
    assert_eq!(
        b.clone()
            .cooldown(secs(10))
            .cooldown_growth(2.0, secs(35))
            .cooldown_for_trip(3),
        secs(35)
    );
    for (p, _, clock, flavor, at) in cases("defaults", &b, &NEAR_FAR, &FLAVORS, &UNLISTENED) {
        for i in 1..20 {
            let _ = exec(&p, flavor, boom);
            assert_eq!(state(&p), CircuitState::Closed, "failure {i}");
        }
        let _ = exec(&p, flavor, boom);
        assert_eq!(state(&p), CircuitState::Open);
        assert_eq!(open_refusal(&exec(&p, flavor, ok)), Some(Some(secs(30))));
        clock.advance(secs(30));
        assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
        assert_eq!(state(&p), CircuitState::Closed, "{at}");
    }
}

/// `CircuitState::Open`: after the cooldown, until a call comes, the
/// circuit still reads open, its time in state counted from the trip
/// (Resilience4j without `automaticTransitionFromOpenToHalfOpenEnabled`).
#[test]
fn an_open_circuit_past_its_cooldown_reads_open_until_a_call() {
    let breaker = CircuitBreaker::consecutive_failures(1).cooldown(secs(5));
    for (p, log, clock, _, at) in cases("reads-open", &breaker, &OFFSETS, &SYNC, &LISTENED) {
        let log = log.unwrap();
        let _ = p.call(boom);
        clock.advance(secs(7));
        let m = metrics(&p);
        assert_eq!(
            (m.state, m.time_in_state),
            (CircuitState::Open, secs(7)),
            "{at}"
        );
        assert_eq!(transitions(&log).len(), 1, "no half-open yet");
        assert_eq!(p.call(ok).unwrap(), 1);
        assert_eq!(transitions(&log), opened_then_closed(secs(5)));
    }
}

/// After a failed probe, an open circuit shows no counts (`CircuitMetrics`
/// docs: "nothing after a failed probe: the probes' counts end with the
/// trip").
#[test]
fn after_a_failed_probe_the_open_circuit_shows_no_counts() {
    let breaker = CircuitBreaker::failure_rate(0.5)
        .count_window(4)
        .minimum_calls(4)
        .cooldown(secs(5));
    for (p, _, clock, flavor, at) in cases(
        "failed-probe-counts",
        &breaker,
        &OFFSETS,
        &FLAVORS,
        &UNLISTENED,
    ) {
        for _ in 0..4 {
            let _ = exec(&p, flavor, boom);
        }
        clock.advance(secs(5));
        let _ = exec(&p, flavor, boom);
        let m = metrics(&p);
        assert_eq!(counts(&m), (CircuitState::Open, 0, 0, 0), "{at}");
        assert_eq!(m.trips, 2);
    }
}

/// A call admitted before transitions (an older generation) is not
/// recorded when it ends: the failure of a call admitted while closed,
/// ending after the circuit opened and closed again, counts for nothing.
#[test]
fn an_outcome_from_an_older_generation_is_not_recorded() {
    let breaker = CircuitBreaker::consecutive_failures(2).cooldown(secs(5));
    for (p, _, clock, flavor, at) in cases("generations", &breaker, &OFFSETS, &FLAVORS, &UNLISTENED)
    {
        let inner = |p: &Pipeline| {
            let _ = p.call(boom);
            let _ = p.call(boom);
            assert_eq!(state(p), CircuitState::Open);
            clock.advance(secs(5));
            assert_eq!(p.call(ok).unwrap(), 1);
            assert_eq!(state(p), CircuitState::Closed);
        };
        let r = match flavor {
            Flavor::Sync => p.call(|_| {
                inner(&p);
                Err::<u32, Boom>(Boom(1))
            }),
            Flavor::Async => rt().block_on(p.run(|_| {
                inner(&p);
                async { Err::<u32, Boom>(Boom(1)) }
            })),
        };
        assert!(r.is_err());
        let m = metrics(&p);
        assert_eq!((m.state, m.failures), (CircuitState::Closed, 0), "{at}");
        // One failure now is the first of a run.
        let _ = exec(&p, flavor, boom);
        assert_eq!(state(&p), CircuitState::Closed, "{at}");
    }
}

/// Shadow mode (Resilience4j's `METRICS_ONLY`): the circuit opens,
/// half-opens and closes as an enforcing one would, never refuses, and the
/// calls it would have refused are not recorded.
#[test]
fn a_circuit_in_shadow_mode_evolves_but_never_refuses() {
    let breaker = CircuitBreaker::consecutive_failures(2)
        .cooldown(secs(5))
        .shadow(true);
    for (p, log, clock, flavor, at) in cases("shadow", &breaker, &OFFSETS, &FLAVORS, &LISTENED) {
        let _ = exec(&p, flavor, boom);
        let _ = exec(&p, flavor, boom);
        assert_eq!(state(&p), CircuitState::Open);
        // Would be refused: runs, and its failure is not recorded.
        for _ in 0..3 {
            assert!(matches!(exec(&p, flavor, boom), Err(Error::Operation(_))));
        }
        assert_eq!(metrics(&p).trips, 1);
        assert_eq!(
            support::count(&log.unwrap(), |e| matches!(
                e,
                EventKind::ShadowRejected {
                    reason: RejectionReason::CircuitOpen,
                    ..
                }
            )),
            3
        );
        clock.advance(secs(5));
        assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
        assert_eq!(state(&p), CircuitState::Closed, "{at}");
    }
}

/// Beyond what a cooldown's end can be kept in (about 139 years after the
/// clock's origin), a trip stays open until the clock's latest instant
/// (module docs): refused, never admitted early.
#[test]
fn a_trip_past_139_years_stays_open() {
    let starts = [5_000_000_000u64, 10_000_000_000, 18_000_000_000].map(secs);
    let breaker = CircuitBreaker::consecutive_failures(1).cooldown(secs(5));
    for (p, _, clock, flavor, at) in
        cases("past-139-years", &breaker, &starts, &FLAVORS, &UNLISTENED)
    {
        let _ = exec(&p, flavor, boom);
        assert_eq!(state(&p), CircuitState::Open);
        for _ in 0..3 {
            clock.advance(secs(100_000));
            assert!(open_refusal(&exec(&p, flavor, ok)).is_some(), "{at}");
        }
    }
}

/// `isolate` lasts until another control: `open_for` ends it with an end,
/// `disable` with admissions; a reset of a closed circuit reports nothing.
#[test]
fn isolation_ends_by_another_control_and_reset_of_closed_is_silent() {
    let breaker = CircuitBreaker::consecutive_failures(1).cooldown(secs(5));
    for (p, log, clock, flavor, at) in
        cases("isolate-then", &breaker, &OFFSETS, &FLAVORS, &LISTENED)
    {
        let log = log.unwrap();
        p.reset().unwrap();
        assert!(transitions(&log).is_empty(), "reset of a closed circuit");
        p.isolate().unwrap();
        p.isolate().unwrap(); // twice: one event
        p.open_for(secs(2)).unwrap();
        assert_eq!(open_refusal(&exec(&p, flavor, ok)), Some(Some(secs(2))));
        clock.advance(secs(2));
        assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
        assert_eq!(state(&p), CircuitState::Closed);
        p.isolate().unwrap();
        p.force_close().unwrap();
        assert_eq!(state(&p), CircuitState::Disabled);
        assert!(matches!(exec(&p, flavor, boom), Err(Error::Operation(_))));
        assert_eq!(state(&p), CircuitState::Disabled, "{at}");
        assert_eq!(
            transitions(&log),
            [
                EventKind::CircuitOpened {
                    cooldown: Duration::MAX
                },
                EventKind::CircuitOpened { cooldown: secs(2) },
                EventKind::CircuitHalfOpened,
                EventKind::CircuitClosed,
                EventKind::CircuitOpened {
                    cooldown: Duration::MAX
                },
                EventKind::CircuitClosed,
            ]
        );
    }
}

/// However many threads race on a half-open circuit, exactly
/// `half_open_calls` probes run (memory store docs).
#[test]
fn racing_threads_get_exactly_the_probe_count() {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    let breaker = CircuitBreaker::consecutive_failures(1)
        .cooldown(secs(5))
        .half_open_calls(3);
    for (p, _, clock, _, at) in cases("probe-race", &breaker, &NEAR_FAR, &SYNC, &UNLISTENED) {
        let _ = p.call(boom);
        clock.advance(secs(5));
        let admitted = AtomicU32::new(0);
        let refused = AtomicU32::new(0);
        let release = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let r = p.call(|_| {
                        admitted.fetch_add(1, Ordering::SeqCst);
                        while !release.load(Ordering::SeqCst) {
                            std::thread::yield_now();
                        }
                        Ok::<u32, Boom>(1)
                    });
                    if r.is_err() {
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
            while admitted.load(Ordering::SeqCst) + refused.load(Ordering::SeqCst) < 8
                && refused.load(Ordering::SeqCst) < 5
            {
                std::thread::yield_now();
            }
            // Give stragglers a moment to be (wrongly) admitted.
            std::thread::sleep(ms(50));
            release.store(true, Ordering::SeqCst);
        });
        assert_eq!(admitted.load(Ordering::SeqCst), 3, "{at}");
        assert_eq!(state(&p), CircuitState::Closed);
    }
}

// ---------------------------------------------------------------------------
// More paths: partitions in every mode, the system clock in every mode, a
// probe refused by a later policy.
// ---------------------------------------------------------------------------

#[test]
fn partitions_cycle_in_every_mode_at_any_clock_reading() {
    for (mode, breaker) in three_modes() {
        for (p, _, clock, flavor, at) in
            cases("partition-modes", &breaker, &OFFSETS, &FLAVORS, &LISTENS)
        {
            let at = format!("{mode} {at}");
            let part = p.partition("tenant");
            let call = |op: Op| part_exec(&part, flavor, op);
            let pstate = || part.circuit_metrics().unwrap().state;
            for cycle in 0..2 {
                clock.advance(secs(3600));
                trip_by(call, pstate, 8);
                assert_eq!(
                    open_refusal(&call(ok)),
                    Some(Some(secs(5))),
                    "{at} cycle {cycle}"
                );
                clock.advance(ms(4999));
                assert!(open_refusal(&call(ok)).is_some(), "{at}");
                clock.advance(ms(1));
                assert!(call(boom).is_err());
                assert_eq!(open_refusal(&call(ok)), Some(Some(secs(10))), "{at}");
                clock.advance(secs(10));
                assert_eq!(call(ok).unwrap(), 1);
                assert_eq!(call(ok).unwrap(), 1);
                assert_eq!(pstate(), CircuitState::Closed, "{at}");
            }
            assert_eq!(state(&p), CircuitState::Closed, "{at}: pipeline's own");
        }
    }
}

#[test]
fn on_the_system_clock_every_mode_refuses_once_open() {
    let breakers = [
        CircuitBreaker::consecutive_failures(2).cooldown(secs(60)),
        CircuitBreaker::failure_rate(0.5)
            .count_window(4)
            .minimum_calls(2)
            .cooldown(secs(60)),
        CircuitBreaker::failure_rate(0.5)
            .window(secs(30))
            .minimum_calls(2)
            .cooldown(secs(60)),
        CircuitBreaker::failure_rate(0.5)
            .window(secs(30))
            .minimum_calls(2)
            .slow_calls(0.5, secs(10))
            .cooldown(secs(60)),
    ];
    for b in breakers {
        for flavor in FLAVORS {
            for listen in LISTENS {
                for partitioned in [false, true] {
                    let at = format!(
                        "{:?} {flavor:?} listener {listen} partition {partitioned}",
                        b.mode
                    );
                    let p = support::listen(
                        Pipeline::builder(unique("system-modes")).circuit_breaker(b.clone()),
                        listen,
                    )
                    .build()
                    .unwrap();
                    let part = p.partition(1u64);
                    let call = |op: Op| {
                        if partitioned {
                            part_exec(&part, flavor, op)
                        } else {
                            exec(&p, flavor, op)
                        }
                    };
                    let st = || {
                        if partitioned {
                            part.circuit_metrics().unwrap().state
                        } else {
                            state(&p)
                        }
                    };
                    assert_eq!(call(ok).unwrap(), 1);
                    trip_by(call, st, 4);
                    for _ in 0..3 {
                        let mut ran = false;
                        let r = if partitioned {
                            call(ok)
                        } else {
                            exec(&p, flavor, |_| {
                                ran = true;
                                Ok::<u32, Boom>(1)
                            })
                        };
                        let hint = open_hint(&r, &at);
                        assert!(!ran, "{at}");
                        assert!(hint > secs(50) && hint < secs(60) + ms(1), "{at}: {hint:?}");
                    }
                }
            }
        }
    }
}

/// Admission is all or nothing (memory store docs): a probe the circuit
/// admits but a full bulkhead refuses gives its probe slot back.
#[test]
fn a_probe_refused_by_a_full_bulkhead_gives_its_slot_back() {
    for (clock, _, listen, at) in grid(&OFFSETS, &SYNC, &LISTENS) {
        let breaker = CircuitBreaker::consecutive_failures(1).cooldown(secs(5));
        let p = builder("probe-bulkhead", breaker, &clock, listen)
            .bulkhead(seawall::Bulkhead::new(1))
            .build()
            .unwrap();
        let r = p.call(|_| {
            // Holding the only bulkhead slot: open the circuit, let its
            // cooldown pass, and try a call.
            p.open_for(secs(5)).unwrap();
            clock.advance(secs(5));
            let inner = p.call(ok);
            assert_eq!(
                support::reason(&inner),
                Some(RejectionReason::BulkheadFull),
                "{inner:?}"
            );
            Ok::<u32, Boom>(1)
        });
        assert_eq!(r.unwrap(), 1);
        // The probe slot was given back: this call is the probe.
        assert_eq!(p.call(ok).unwrap(), 1, "{at}");
        assert_eq!(state(&p), CircuitState::Closed);
    }
}

// ---------------------------------------------------------------------------
// A breaker around the retry: one admission and one outcome per call.
// ---------------------------------------------------------------------------

/// Declared before the retry, a probe is a whole call: a call whose first
/// attempt fails and whose second succeeds is a successful probe; a slow
/// call is measured over the whole call, retry waits included.
#[test]
fn a_breaker_around_the_retry_probes_with_whole_calls_and_measures_them() {
    let retry = || seawall::Retry::constant(ms(600)).max_attempts(3);
    // Returns 5 once `fails` attempts have failed.
    let failing_first = |fails: u32| {
        let mut tries = 0;
        move |_: Context| {
            tries += 1;
            if tries <= fails {
                Err(Boom(1))
            } else {
                Ok::<u32, Boom>(5)
            }
        }
    };
    for (clock, flavor, listen, at) in grid(&OFFSETS, &FLAVORS, &LISTENS) {
        let breaker = CircuitBreaker::consecutive_failures(1).cooldown(secs(5));
        let p = builder("around-retry", breaker, &clock, listen)
            .retry(retry())
            .build()
            .unwrap();
        let r = exec(&p, flavor, boom);
        assert!(
            matches!(r, Err(Error::RetryExhausted { attempts: 3, .. })),
            "{at}: {r:?}"
        );
        assert_eq!(state(&p), CircuitState::Open, "{at}");
        assert!(open_refusal(&exec(&p, flavor, ok)).is_some());
        clock.advance(secs(5));
        let r = exec(&p, flavor, failing_first(1));
        assert_eq!(r.unwrap(), 5, "{at}");
        assert_eq!(
            state(&p),
            CircuitState::Closed,
            "{at}: the probe call succeeded"
        );

        let breaker = CircuitBreaker::failure_rate(1.0)
            .count_window(1)
            .minimum_calls(1)
            .slow_calls(1.0, secs(1))
            .cooldown(secs(5));
        let slow = builder("around-retry-slow", breaker, &clock, false)
            .retry(retry())
            .build()
            .unwrap();
        let r = exec(&slow, flavor, failing_first(2));
        assert_eq!(r.unwrap(), 5);
        let m = metrics(&slow);
        assert_eq!(
            (m.state, m.slow_calls),
            (CircuitState::Open, 1),
            "{at}: 1.2 s call"
        );
    }
}

/// Resilience4j users put a fallback on `CallNotPermittedException`: the
/// fallback, outermost, receives the refusal of an open circuit.
#[test]
fn the_fallback_receives_the_refusal_of_an_open_circuit() {
    for (clock, flavor, listen, at) in grid(&NEAR_FAR, &FLAVORS, &LISTENS) {
        let breaker = CircuitBreaker::consecutive_failures(1).cooldown(secs(5));
        let p = builder("fallback-open", breaker, &clock, listen)
            .fallback_sync(|e: Error<Boom>, _| match e {
                Error::Rejected(r) if r.reason == RejectionReason::CircuitOpen => Ok(99u32),
                Error::Operation(b) => Err(b),
                other => panic!("{other:?}"),
            })
            .build()
            .unwrap();
        assert!(matches!(
            exec(&p, flavor, boom),
            Err(Error::Fallback(Boom(1)))
        ));
        let mut ran = false;
        let r = exec(&p, flavor, |_| {
            ran = true;
            Ok::<u32, Boom>(1)
        });
        assert_eq!((r.unwrap(), ran), (99, false), "{at}");
    }
}

// ---------------------------------------------------------------------------
// Events in detail, panics while closed, the finest cooldown.
// ---------------------------------------------------------------------------

/// Each refusal is reported with the `retry_after` the caller got, and a
/// partition's transitions name the partition.
#[test]
fn events_carry_the_refusal_hint_and_the_partition() {
    use std::sync::Mutex;
    for (clock, flavor, _, at) in grid(&NEAR_FAR, &FLAVORS, &UNLISTENED) {
        // (partition, event)
        type Seen = Vec<(Option<String>, EventKind)>;
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let s = seen.clone();
        let breaker = CircuitBreaker::consecutive_failures(1).cooldown(secs(5));
        let p = builder("event-detail", breaker, &clock, false)
            .on_event(move |e| {
                s.lock()
                    .unwrap()
                    .push((e.partition.map(|k| format!("{k:?}")), e.kind.clone()))
            })
            .build()
            .unwrap();
        let _ = exec(&p, flavor, boom);
        clock.advance(secs(2));
        let r = exec(&p, flavor, ok);
        assert_eq!(open_refusal(&r), Some(Some(secs(3))));
        let part = p.partition("t1");
        let _ = part.call(boom);
        let events = seen.lock().unwrap().clone();
        assert_eq!(
            events
                .iter()
                .filter(|(_, k)| matches!(k, EventKind::Rejected { .. }))
                .map(|(_, k)| k.clone())
                .collect::<Vec<_>>(),
            [EventKind::Rejected {
                reason: RejectionReason::CircuitOpen,
                retry_after: Some(secs(3))
            }],
            "{at}"
        );
        let opened: Vec<_> = events
            .iter()
            .filter(|(_, k)| matches!(k, EventKind::CircuitOpened { .. }))
            .collect();
        assert_eq!(opened.len(), 2);
        assert!(opened[0].0.is_none());
        assert!(
            opened[1].0.as_deref().is_some_and(|k| k.contains("t1")),
            "{opened:?}"
        );
    }
}

/// A panicking call in a closed circuit records nothing: not counted in a
/// window, not a failure in a row, nor the end of a run.
#[test]
fn a_panicking_call_in_a_closed_circuit_records_nothing() {
    for (clock, _, listen, at) in grid(&NEAR_FAR, &SYNC, &LISTENS) {
        let (w, _) = pipeline(
            "panic-window",
            CircuitBreaker::failure_rate(0.5)
                .count_window(4)
                .minimum_calls(1),
            &clock,
            listen,
        );
        let (c, _) = pipeline(
            "panic-consecutive",
            CircuitBreaker::consecutive_failures(2),
            &clock,
            listen,
        );
        for p in [&w, &c] {
            if std::ptr::eq(p, &c) {
                let _ = p.call(boom);
            }
            let panicked = catch_unwind(AssertUnwindSafe(|| {
                p.call(|_| -> Result<u32, Boom> { panic!("boom") })
            }));
            assert!(panicked.is_err());
        }
        assert_eq!(metrics(&w).calls, 0, "{at}");
        let m = metrics(&c);
        assert_eq!((m.state, m.failures), (CircuitState::Closed, 1), "{at}");
        let _ = c.call(boom);
        assert_eq!(state(&c), CircuitState::Open, "the run went on");
    }
}

/// The finest cooldown is a millisecond: a shorter one opens until the
/// next whole millisecond (`cooldown` docs).
#[test]
fn a_cooldown_under_a_millisecond_lasts_to_the_next_whole_millisecond() {
    let breaker = CircuitBreaker::consecutive_failures(1).cooldown(Duration::from_nanos(1));
    for (p, _, clock, flavor, at) in cases("finest", &breaker, &OFFSETS, &FLAVORS, &UNLISTENED) {
        let _ = exec(&p, flavor, boom);
        assert_eq!(
            open_refusal(&exec(&p, flavor, ok)),
            Some(Some(ms(1))),
            "{at}"
        );
        clock.advance(ms(1));
        assert_eq!(exec(&p, flavor, ok).unwrap(), 1);
        assert_eq!(state(&p), CircuitState::Closed);
    }
}
