//! The tools users test their own code with (feature `test-util`): the
//! fixed-sequence random source drives jitter exactly, a clock can start far
//! from zero, and a context can be built by hand. Each scenario runs sync and
//! async, with and without a listener, on clocks at 0 and at 10^6 s.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use seawall::testing::{SequenceError, SequenceRandom, VirtualClock};
use seawall::{Backoff, Context, Jitter, Pipeline, Random, Retry};

const FAR: Duration = Duration::from_secs(1_000_000);

fn secs_f(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// Runs a call that fails every attempt through a pipeline with `retry` and
/// `random`, the four ways, and returns for each way the delays the retry
/// hook saw and the virtual time that passed.
fn waits(retry: &Retry, values: &[f64]) -> Vec<(Vec<Duration>, Duration)> {
    let mut out = Vec::new();
    for start in [Duration::ZERO, FAR] {
        for listener in [false, true] {
            for sync in [true, false] {
                let clock = VirtualClock::starting_at(start);
                let seen: Arc<Mutex<Vec<Duration>>> = Arc::default();
                let s = seen.clone();
                let mut b = Pipeline::builder("testing-jitter")
                    .retry(retry.clone())
                    .random(SequenceRandom::new(values.iter().copied()))
                    .clock(clock.clone());
                if listener {
                    b = b.on_event(|_| {});
                }
                let p = b
                    .on_retry(move |_: &&str, _, d| s.lock().unwrap().push(d))
                    .build()
                    .unwrap();
                let result = if sync {
                    p.call(|_| Err::<(), _>("down"))
                } else {
                    rt().block_on(p.run(|_| async { Err::<(), _>("down") }))
                };
                assert!(result.is_err());
                let delays = seen.lock().unwrap().clone();
                out.push((delays, clock.now() - start));
            }
        }
    }
    out
}

fn assert_waits(retry: Retry, values: &[f64], expected: &[Duration]) {
    let total: Duration = expected.iter().sum();
    for (i, (delays, passed)) in waits(&retry, values).into_iter().enumerate() {
        assert_eq!(delays, expected, "way {i}: delays of {retry:?}");
        assert_eq!(passed, total, "way {i}: time passed with {retry:?}");
    }
}

#[test]
fn full_jitter_with_one_half_waits_half_the_delay() {
    assert_waits(
        Retry::constant(Duration::from_secs(1))
            .max_attempts(3)
            .jitter(Jitter::Full),
        &[0.5],
        &[secs_f(0.5), secs_f(0.5)],
    );
}

#[test]
fn full_jitter_follows_the_sequence_and_cycles() {
    // Exponential 1 s, 2 s, 4 s, 8 s, with the values 0.5, 0.25, 0.75, 0.5.
    assert_waits(
        Retry::exponential(Duration::from_secs(1))
            .max_attempts(5)
            .jitter(Jitter::Full),
        &[0.5, 0.25, 0.75],
        &[secs_f(0.5), secs_f(0.5), secs_f(3.0), secs_f(4.0)],
    );
}

#[test]
fn equal_and_proportional_jitter_use_the_value_exactly() {
    // Equal: half of 2 s, plus 1 s x 0.5.
    assert_waits(
        Retry::constant(Duration::from_secs(2))
            .max_attempts(2)
            .jitter(Jitter::Equal),
        &[0.5],
        &[secs_f(1.5)],
    );
    // +-25 %: 0 gives 0.75 x, 0.75 gives 1.125 x, 0.5 gives the delay.
    assert_waits(
        Retry::constant(Duration::from_secs(8))
            .max_attempts(4)
            .jitter(Jitter::Proportional(25.0)),
        &[0.0, 0.75, 0.5],
        &[secs_f(6.0), secs_f(9.0), secs_f(8.0)],
    );
}

#[test]
fn zero_jitter_value_waits_nothing() {
    assert_waits(
        Retry::constant(Duration::from_secs(5))
            .max_attempts(3)
            .jitter(Jitter::Full),
        &[0.0],
        &[Duration::ZERO, Duration::ZERO],
    );
}

#[test]
fn decorrelated_backoff_draws_from_the_sequence() {
    let retry = Retry::decorrelated(Duration::from_secs(1), Duration::from_secs(100));
    let r = SequenceRandom::new([0.5, 0.5]);
    // First: uniform in [1 s, 3 s] at 0.5.
    let first = retry.delay(1, Duration::ZERO, &r);
    assert_eq!(first, secs_f(2.0));
    // Then in [1 s, 3 x 2 s] at 0.5.
    assert_eq!(retry.delay(2, first, &r), secs_f(3.5));
    assert!(matches!(retry.backoff, Backoff::Decorrelated { .. }));
}

#[test]
fn a_sequence_is_refused_with_a_reason() {
    assert_eq!(
        SequenceRandom::try_new([0.1, 0.2, -1.0]).unwrap_err(),
        SequenceError::OutOfRange {
            index: 2,
            value: -1.0
        }
    );
    assert!(matches!(
        SequenceRandom::try_new([f64::NAN]),
        Err(SequenceError::OutOfRange { index: 0, .. })
    ));
    assert_eq!(
        SequenceRandom::try_new(std::iter::empty()).unwrap_err(),
        SequenceError::Empty
    );
    let panic = std::panic::catch_unwind(|| SequenceRandom::new([1.0])).unwrap_err();
    let msg = panic.downcast_ref::<String>().unwrap();
    assert_eq!(
        msg,
        "SequenceRandom::new: random value 1 at position 0 is outside [0, 1)"
    );
}

#[test]
fn a_sequence_is_shared_by_clones_across_threads() {
    let r = SequenceRandom::new([0.0, 0.25, 0.5, 0.75]);
    let seen: Vec<f64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let r = r.clone();
                s.spawn(move || (0..1000).map(|_| r.next_f64()).collect::<Vec<_>>())
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    // 8000 draws from one shared cycle of 4: each value exactly 2000 times.
    for v in [0.0, 0.25, 0.5, 0.75] {
        assert_eq!(seen.iter().filter(|x| **x == v).count(), 2000, "{v}");
    }
}

#[test]
fn a_far_clock_drives_deadlines_of_a_pipeline() {
    let clock = VirtualClock::starting_at(FAR);
    assert_eq!(clock.now(), FAR);
    let p = Pipeline::builder("testing-far")
        .timeout(Duration::from_secs(2))
        .clock(clock.clone())
        .build()
        .unwrap();
    let remaining = p
        .call(|ctx| {
            assert_eq!(ctx.deadline(), Some(FAR + Duration::from_secs(2)));
            Ok::<_, &str>(ctx.remaining())
        })
        .unwrap();
    assert_eq!(remaining, Some(Duration::from_secs(2)));
}

/// An operation a user would unit-test with a hand-built context.
fn lookup(ctx: &Context) -> Result<String, String> {
    if ctx.remaining() == Some(Duration::ZERO) {
        return Err(format!("{}: out of time", ctx.resource()));
    }
    let tenant = ctx.partition().map(|p| p.to_string()).unwrap_or_default();
    Ok(format!("{tenant}#{}", ctx.attempt()))
}

#[test]
fn an_operation_is_unit_tested_with_a_built_context() {
    for start in [Duration::ZERO, FAR] {
        let clock = VirtualClock::starting_at(start);
        let ctx = Context::builder("users-api")
            .attempt(2)
            .deadline_in(Duration::from_secs(1))
            .partition("t1")
            .clock(clock.clone())
            .build();
        assert_eq!(lookup(&ctx).unwrap(), "t1#2");
        assert_eq!(ctx.deadline(), Some(start + Duration::from_secs(1)));
        clock.advance(Duration::from_secs(1));
        assert_eq!(lookup(&ctx).unwrap_err(), "users-api: out of time");
        // The same operation through a pipeline sees the same kind of context.
        let p = Pipeline::builder("users-api")
            .timeout(Duration::from_secs(1))
            .clock(clock.clone())
            .build()
            .unwrap();
        assert_eq!(p.partition("t1").call(|ctx| lookup(&ctx)).unwrap(), "t1#1");
    }
}
