//! `build()` never panics, on any value of any numeric or duration field of
//! any policy: it returns the pipeline or a `ConfigError` naming the policy,
//! the field and the rule. A pipeline that built runs calls without
//! panicking.
//!
//! Two tests: a sweep that puts each extreme value (0, 1, `u32::MAX`, NaN,
//! infinities, `Duration::ZERO`, `Duration::MAX`, nanoseconds near
//! `u64::MAX`, ...) in each field on its own, next to every policy it
//! interacts with; and a property test over random combinations of every
//! policy and field.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use seawall::breaker::BreakerMode;
use seawall::clock::BoxSleep;
use seawall::rate_limit::RateAlgorithm;
use seawall::testing::{SequenceRandom, VirtualClock};
use seawall::{
    Backoff, Bulkhead, CircuitBreaker, Clock, ConfigError, Cooldown, Error, Jitter, MemoryStore,
    Pipeline, RateLimiter, Retry, RetryBudget, Timeout, Verdict,
};

const FAR: Duration = Duration::from_secs(1_000_000);

const U32S: [u32; 9] = [
    0,
    1,
    2,
    3,
    100,
    1_000_000,
    1_000_001,
    u32::MAX - 1,
    u32::MAX,
];

const F64S: [f64; 16] = [
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    0.0,
    -0.0,
    -1.0,
    f64::MIN_POSITIVE,
    1e-300,
    0.5,
    1.0,
    1.0 + f64::EPSILON,
    2.0,
    100.0,
    1000.0,
    1e300,
    f64::MAX,
];

fn durations() -> Vec<Duration> {
    vec![
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_millis(1),
        Duration::from_millis(999),
        Duration::from_secs(1),
        Duration::from_millis(1001),
        Duration::from_secs(3600),
        Duration::from_secs(3601),
        Duration::from_secs(u64::from(u32::MAX)),
        Duration::from_nanos(u64::MAX / 2),
        Duration::from_nanos(u64::MAX - Duration::from_secs(1).as_nanos() as u64),
        Duration::from_nanos(u64::MAX - 1),
        Duration::from_nanos(u64::MAX),
        Duration::from_secs(u64::MAX / 1_000_000_000 + 1),
        Duration::from_secs(u64::MAX),
        Duration::MAX,
    ]
}

/// Every policy of a pipeline, each optional, with every field set.
#[derive(Debug, Clone)]
struct Setup {
    overall_timeout: Option<Timeout>,
    retry: Option<Retry>,
    attempt_timeout: Option<Timeout>,
    circuit: Option<CircuitBreaker>,
    bulkhead: Option<Bulkhead>,
    cooldown: Option<Cooldown>,
    rate_limit: Option<RateLimiter>,
    partition_idle: Option<Duration>,
}

impl Setup {
    fn none() -> Self {
        Setup {
            overall_timeout: None,
            retry: None,
            attempt_timeout: None,
            circuit: None,
            bulkhead: None,
            cooldown: None,
            rate_limit: None,
            partition_idle: None,
        }
    }

    /// Valid settings of every policy, the base each field is varied from.
    fn all() -> Self {
        Setup {
            overall_timeout: Some(Timeout::new(Duration::from_secs(10))),
            retry: Some(Retry::exponential(Duration::from_millis(100)).max_attempts(3)),
            attempt_timeout: Some(Timeout::new(Duration::from_secs(2))),
            circuit: Some(CircuitBreaker::failure_rate(0.5).minimum_calls(2)),
            bulkhead: Some(Bulkhead::new(4)),
            cooldown: Some(Cooldown::new()),
            rate_limit: Some(RateLimiter::gcra(100, Duration::from_secs(1))),
            partition_idle: Some(Duration::from_secs(600)),
        }
    }
}

/// How the pipeline is run once built.
#[derive(Debug, Clone)]
struct Run {
    start: Duration,
    listener: bool,
    partition: bool,
    /// Attempts that fail before one succeeds.
    failures: u32,
    /// A retry-after hint on failures (opens the cooldown).
    hint: Option<Duration>,
    /// Virtual time passed between calls.
    pause: Duration,
    calls: u32,
}

impl Run {
    fn plain() -> Self {
        Run {
            start: Duration::ZERO,
            listener: false,
            partition: false,
            failures: 1,
            hint: None,
            pause: Duration::from_secs(1),
            calls: 2,
        }
    }
}

const STOPPED: &str = "stopped by the watchdog";

/// The virtual clock, with a switch that makes every later sleep panic, so
/// that a call stuck in a loop of waits can be ended.
#[derive(Debug, Clone)]
struct Watched {
    clock: VirtualClock,
    stop: Arc<AtomicBool>,
}

impl Clock for Watched {
    fn now(&self) -> Duration {
        self.clock.now()
    }
    fn sleep(&self, duration: Duration) -> BoxSleep {
        if self.stop.load(Ordering::Relaxed) {
            return Box::pin(async { panic!("{STOPPED}") });
        }
        Clock::sleep(&self.clock, duration)
    }
    fn sleep_blocking(&self, duration: Duration) {
        if self.stop.load(Ordering::Relaxed) {
            panic!("{STOPPED}");
        }
        self.clock.advance(duration)
    }
}

/// Builds the pipeline of `setup` and, when it builds, runs `run.calls`
/// sync calls (and as many async ones when `run_async`). Panics propagate
/// to the caller: that is the failure these tests look for.
fn exercise(setup: &Setup, run: &Run, run_async: bool, clock: &Watched) -> Result<(), ConfigError> {
    let hint = run.hint;
    let mut b = Pipeline::builder("never-panics")
        .store(MemoryStore::new())
        .clock(clock.clone())
        .random(SequenceRandom::new([0.0, 0.5, 0.999_999]));
    if let Some(t) = setup.overall_timeout {
        b = b.timeout(t);
    }
    if let Some(r) = &setup.retry {
        b = b.retry(r.clone());
    }
    if let Some(t) = setup.attempt_timeout {
        b = b.timeout(t);
    }
    if let Some(c) = &setup.circuit {
        b = b.circuit_breaker(c.clone());
    }
    if let Some(x) = &setup.bulkhead {
        b = b.bulkhead(x.clone());
    }
    if let Some(c) = &setup.cooldown {
        b = b.cooldown(c.clone());
    }
    if let Some(r) = &setup.rate_limit {
        b = b.rate_limiter(r.clone());
    }
    if let Some(idle) = setup.partition_idle {
        b = b.partition_idle(idle);
    }
    if run.listener {
        b = b.on_event(|e| {
            let _ = format!("{e:?}");
        });
    }
    let p = b
        .classify(move |_: &&str| match hint {
            Some(h) => Verdict::throttled().with_retry_after(h),
            None => Verdict::retry(),
        })
        .build()?;
    let failures = run.failures;
    let check = |r: Result<u32, Error<&str>>| {
        // Any outcome but a panic is fine; the error must display.
        if let Err(e) = r {
            let _ = e.to_string();
        }
    };
    for _ in 0..run.calls {
        let mut n = 0;
        let op = |_ctx| {
            n += 1;
            if n <= failures {
                Err("down")
            } else {
                Ok(n)
            }
        };
        if run.partition {
            check(p.partition("tenant").call(op));
        } else {
            check(p.call(op));
        }
        clock.clock.advance(run.pause);
    }
    if run_async {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        for _ in 0..run.calls {
            let n = std::sync::atomic::AtomicU32::new(0);
            let op = |_ctx| {
                let k = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                async move {
                    if k <= failures {
                        Err("down")
                    } else {
                        Ok(k)
                    }
                }
            };
            if run.partition {
                check(rt.block_on(p.partition("tenant").run(op)));
            } else {
                check(rt.block_on(p.run(op)));
            }
            clock.clock.advance(run.pause);
        }
    }
    let _ = p.circuit_metrics();
    let _ = p.in_flight();
    Ok(())
}

/// The field a value was put in, for the messages.
type Case = (String, Setup);

/// Every field of every policy set to every extreme value, one at a time,
/// on a pipeline with every policy (and on one with only that policy).
fn single_field_cases() -> Vec<Case> {
    let mut cases: Vec<Case> = Vec::new();
    let ds = durations();
    let mut push = |name: String, f: &dyn Fn(&mut Setup)| {
        for mut base in [Setup::all(), Setup::none()] {
            f(&mut base);
            cases.push((name.clone(), base));
        }
    };
    for &d in &ds {
        push(format!("timeout {d:?}"), &|s| {
            s.overall_timeout = Some(Timeout::new(d))
        });
        push(format!("strict timeout {d:?}"), &|s| {
            s.overall_timeout = Some(Timeout::strict(d))
        });
        push(format!("attempt_timeout {d:?}"), &|s| {
            s.retry
                .get_or_insert_with(|| Retry::constant(Duration::ZERO));
            s.attempt_timeout = Some(Timeout::strict(d))
        });
        for backoff in [
            Backoff::Constant { delay: d },
            Backoff::Linear {
                base: d,
                cap: Duration::MAX,
            },
            Backoff::Linear {
                base: Duration::from_millis(1),
                cap: d,
            },
            Backoff::Exponential {
                base: d,
                multiplier: 2.0,
                cap: Duration::MAX,
            },
            Backoff::Exponential {
                base: Duration::ZERO,
                multiplier: 1.0,
                cap: d,
            },
            Backoff::Decorrelated {
                base: d,
                cap: Duration::MAX,
            },
            Backoff::Decorrelated {
                base: Duration::ZERO,
                cap: d,
            },
        ] {
            push(format!("retry backoff {backoff:?}"), &|s| {
                s.retry = Some(Retry::with_backoff(backoff).jitter(Jitter::Proportional(100.0)))
            });
        }
        push(format!("circuit window {d:?}"), &|s| {
            s.circuit = Some(CircuitBreaker::failure_rate(0.5).window(d))
        });
        push(format!("circuit slow_call_duration {d:?}"), &|s| {
            s.circuit = Some(
                CircuitBreaker::failure_rate(0.5)
                    .minimum_calls(1)
                    .slow_calls(0.5, d),
            )
        });
        push(format!("circuit cooldown {d:?}"), &|s| {
            s.circuit = Some(CircuitBreaker::consecutive_failures(1).cooldown(d))
        });
        push(format!("circuit max_cooldown {d:?}"), &|s| {
            s.circuit = Some(
                CircuitBreaker::consecutive_failures(1)
                    .cooldown(Duration::from_secs(1))
                    .cooldown_growth(2.0, d),
            )
        });
        push(format!("circuit cooldown and max_cooldown {d:?}"), &|s| {
            s.circuit = Some(
                CircuitBreaker::consecutive_failures(1)
                    .cooldown(d)
                    .cooldown_growth(1e300, d),
            )
        });
        push(format!("bulkhead max_wait {d:?}"), &|s| {
            s.bulkhead = Some(Bulkhead::new(1).queue(1, d))
        });
        push(format!("bulkhead lease {d:?}"), &|s| {
            s.bulkhead = Some(Bulkhead::new(1).lease(d))
        });
        push(
            format!("bulkhead lease {d:?} with attempt timeout {d:?}"),
            &|s| {
                s.overall_timeout = Some(Timeout::new(d));
                s.bulkhead = Some(Bulkhead::new(1).lease(d))
            },
        );
        push(format!("bulkhead with timeout {d:?}"), &|s| {
            s.overall_timeout = Some(Timeout::new(d));
            s.bulkhead = Some(Bulkhead::new(1))
        });
        push(format!("bulkhead lease MAX with timeout {d:?}"), &|s| {
            s.overall_timeout = Some(Timeout::new(d));
            s.bulkhead = Some(Bulkhead::new(1).lease(Duration::MAX))
        });
        push(format!("cooldown max_pause {d:?}"), &|s| {
            s.cooldown = Some(Cooldown::new().max_pause(d))
        });
        push(format!("cooldown max_wait {d:?}"), &|s| {
            s.cooldown = Some(Cooldown::new().max_wait(d))
        });
        push(format!("cooldown grace {d:?}"), &|s| {
            s.cooldown = Some(Cooldown::new().grace(d))
        });
        for algorithm in [
            RateAlgorithm::Gcra,
            RateAlgorithm::FixedWindow,
            RateAlgorithm::SlidingWindow,
        ] {
            push(format!("rate_limiter {algorithm:?} period {d:?}"), &|s| {
                s.rate_limit = Some(rate(algorithm, 3, d))
            });
            push(format!("rate_limiter {algorithm:?} max_wait {d:?}"), &|s| {
                s.rate_limit = Some(rate(algorithm, 1, Duration::from_secs(1)).max_wait(d))
            });
        }
        push(format!("partition_idle {d:?}"), &|s| {
            s.partition_idle = Some(d)
        });
    }
    for &n in &U32S {
        push(format!("retry max_attempts {n}"), &|s| {
            // Attempts fail once at most, so a huge count ends.
            s.retry = Some(Retry::constant(Duration::ZERO).max_attempts(n))
        });
        push(format!("retry budget max_tokens {n}"), &|s| {
            s.retry = Some(Retry::constant(Duration::ZERO).budget(RetryBudget::new(0.5, n)))
        });
        for mode in [
            BreakerMode::ConsecutiveFailures(n),
            BreakerMode::CountWindow(n),
            BreakerMode::TimeWindow(n),
        ] {
            push(format!("circuit mode {mode:?}"), &|s| {
                let mut c = CircuitBreaker::failure_rate(0.5).minimum_calls(1);
                c.mode = mode;
                s.circuit = Some(c)
            });
        }
        push(format!("circuit minimum_calls {n}"), &|s| {
            s.circuit = Some(CircuitBreaker::failure_rate(0.5).minimum_calls(n))
        });
        push(format!("circuit half_open_calls {n}"), &|s| {
            s.circuit = Some(CircuitBreaker::consecutive_failures(1).half_open_calls(n))
        });
        push(format!("bulkhead max_concurrent {n}"), &|s| {
            s.bulkhead = Some(Bulkhead::new(n))
        });
        push(format!("bulkhead max_queued {n}"), &|s| {
            s.bulkhead = Some(Bulkhead::new(1).queue(n, Duration::from_secs(1)))
        });
        for algorithm in [
            RateAlgorithm::Gcra,
            RateAlgorithm::FixedWindow,
            RateAlgorithm::SlidingWindow,
        ] {
            push(format!("rate_limiter {algorithm:?} limit {n}"), &|s| {
                s.rate_limit = Some(rate(algorithm, n, Duration::from_secs(1)))
            });
            push(
                format!("rate_limiter {algorithm:?} limit {n} period MAX"),
                &|s| s.rate_limit = Some(rate(algorithm, n, Duration::MAX)),
            );
        }
        push(format!("rate_limiter burst {n}"), &|s| {
            s.rate_limit = Some(RateLimiter::gcra(10, Duration::from_secs(1)).burst(n))
        });
    }
    for &x in &F64S {
        push(format!("retry multiplier {x}"), &|s| {
            s.retry = Some(
                Retry::exponential(Duration::from_millis(1))
                    .multiplier(x)
                    .max_attempts(3),
            )
        });
        push(format!("retry jitter {x}%"), &|s| {
            s.retry = Some(Retry::constant(Duration::from_secs(1)).jitter(Jitter::Proportional(x)))
        });
        push(format!("retry budget ratio {x}"), &|s| {
            s.retry = Some(Retry::constant(Duration::ZERO).budget(RetryBudget::new(x, 10)))
        });
        push(format!("circuit failure_rate {x}"), &|s| {
            s.circuit = Some(CircuitBreaker::failure_rate(x).minimum_calls(1))
        });
        push(format!("circuit slow_call_rate {x}"), &|s| {
            s.circuit = Some(
                CircuitBreaker::failure_rate(0.5)
                    .minimum_calls(1)
                    .slow_calls(x, Duration::from_nanos(1)),
            )
        });
        push(format!("circuit cooldown_growth {x}"), &|s| {
            s.circuit = Some(
                CircuitBreaker::consecutive_failures(1)
                    .cooldown(Duration::from_secs(1))
                    .cooldown_growth(x, Duration::MAX),
            )
        });
    }
    cases
}

fn rate(algorithm: RateAlgorithm, limit: u32, period: Duration) -> RateLimiter {
    match algorithm {
        RateAlgorithm::Gcra => RateLimiter::gcra(limit, period),
        RateAlgorithm::FixedWindow => RateLimiter::fixed_window(limit, period),
        _ => RateLimiter::sliding_window(limit, period),
    }
}

/// The message of a panic, caught.
fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[test]
fn timeout_of_duration_max_with_a_bulkhead_is_a_config_error() {
    // It overflowed `timeout + 1s` in the lease check.
    for t in [Duration::MAX, Duration::from_secs(u64::MAX)] {
        for declared_after_retry in [false, true] {
            let mut b = Pipeline::builder("max-timeout-bulkhead");
            if declared_after_retry {
                b = b.retry(Retry::constant(Duration::ZERO));
            }
            let e = b
                .timeout(t)
                .bulkhead(Bulkhead::new(1).lease(Duration::MAX))
                .store(MemoryStore::new())
                .build()
                .unwrap_err();
            assert_eq!((e.policy, e.field), ("bulkhead", "lease"), "{e}");
            assert!(e.rule.starts_with("must exceed the attempt timeout"), "{e}");
        }
    }
    // Just below the limit, the longest lease is long enough.
    let p = Pipeline::builder("max-timeout-bulkhead")
        .timeout(Duration::MAX - Duration::from_secs(2))
        .bulkhead(Bulkhead::new(1).lease(Duration::MAX))
        .store(MemoryStore::new())
        .build()
        .unwrap();
    assert_eq!(p.call(|_| Ok::<_, &str>(1)).unwrap(), 1);
}

#[test]
fn breaker_window_of_duration_max_is_a_config_error() {
    // It overflowed rounding the window up to whole seconds.
    let e = Pipeline::builder("max-window")
        .circuit_breaker(CircuitBreaker::failure_rate(0.5).window(Duration::MAX))
        .store(MemoryStore::new())
        .build()
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "circuit_breaker.window must be <= 3600 s, got {} s",
            u32::MAX
        )
    );
}

/// What became of one case.
enum Outcome {
    Built,
    Refused(ConfigError),
    Panicked(String),
    /// A call did not return; `at_end` when the clock had reached its last
    /// instant (`u64::MAX` ns) with a fixed or sliding window limiter.
    Hung {
        at_end: bool,
    },
}

/// Runs `exercise` on a thread of its own, so that a panic is caught and a
/// call that does not return is reported (and stopped) instead of stopping
/// the suite.
fn watched(setup: &Setup, run: &Run, run_async: bool) -> Outcome {
    let (tx, rx) = std::sync::mpsc::channel();
    let clock = Watched {
        clock: VirtualClock::starting_at(run.start),
        stop: Arc::default(),
    };
    let (s, r, c) = (setup.clone(), run.clone(), clock.clone());
    let worker = std::thread::spawn(move || {
        let outcome = std::panic::catch_unwind(|| exercise(&s, &r, run_async, &c));
        let _ = tx.send(match outcome {
            Ok(Ok(())) => Outcome::Built,
            Ok(Err(e)) => Outcome::Refused(e),
            Err(p) => Outcome::Panicked(panic_message(p)),
        });
    });
    match rx.recv_timeout(Duration::from_secs(3)) {
        Ok(outcome) => {
            let _ = worker.join();
            outcome
        }
        Err(_) => {
            let at_end = clock.clock.now() == Duration::from_nanos(u64::MAX)
                && setup
                    .rate_limit
                    .as_ref()
                    .is_some_and(|r| r.algorithm != RateAlgorithm::Gcra);
            clock.stop.store(true, Ordering::Relaxed);
            let _ = worker.join();
            Outcome::Hung { at_end }
        }
    }
}

fn sweep(runs: &[Run]) {
    let cases = single_field_cases();
    assert!(cases.len() > 500, "{} cases", cases.len());
    let mut failures = Vec::new();
    let (mut built, mut refused) = (0, 0);
    for (name, setup) in &cases {
        for (i, run) in runs.iter().enumerate() {
            match watched(setup, run, i % 2 == 1) {
                Outcome::Built => built += 1,
                Outcome::Refused(e) => {
                    refused += 1;
                    // A refusal names a policy, a field and a rule.
                    assert!(!e.policy.is_empty() && !e.field.is_empty() && !e.rule.is_empty());
                    assert_eq!(
                        e.to_string(),
                        format!("{}.{} {}", e.policy, e.field, e.rule)
                    );
                }
                Outcome::Panicked(m) => failures.push(format!("{name} (run {i}): panicked: {m}")),
                Outcome::Hung { .. } => failures.push(format!("{name} (run {i}): did not return")),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} runs failed:\n{}",
        failures.len(),
        cases.len() * runs.len(),
        failures.join("\n")
    );
    // Both outcomes are exercised.
    assert!(
        built > 100 && refused > 100,
        "built {built}, refused {refused}"
    );
}

#[test]
fn every_extreme_value_of_every_field_builds_or_is_refused() {
    sweep(&[
        Run::plain(),
        Run {
            start: FAR,
            listener: true,
            partition: true,
            failures: 2,
            hint: Some(Duration::from_secs(3600)),
            pause: Duration::from_secs(3600),
            calls: 3,
        },
        Run {
            start: FAR,
            listener: false,
            partition: false,
            failures: 1,
            hint: Some(Duration::from_millis(1)),
            pause: Duration::ZERO,
            calls: 3,
        },
    ]);
}

#[test]
fn every_extreme_value_runs_at_the_end_of_the_clock() {
    sweep(&[Run {
        start: FAR,
        listener: true,
        partition: true,
        failures: 2,
        hint: Some(Duration::MAX),
        pause: Duration::MAX,
        calls: 3,
    }]);
}

// ------------------------------------------------------------------ property

fn any_u32() -> impl Strategy<Value = u32> {
    prop_oneof![
        3 => prop::sample::select(U32S.to_vec()),
        1 => any::<u32>(),
        2 => 0..8u32,
    ]
}

fn any_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        3 => prop::sample::select(F64S.to_vec()),
        1 => any::<f64>(),
        2 => 0.0..=1.0f64,
        1 => 1.0..10.0f64,
    ]
}

fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        3 => prop::sample::select(durations()),
        1 => any::<u64>().prop_map(Duration::from_nanos),
        1 => (any::<u64>(), 0..1_000_000_000u32).prop_map(|(s, n)| Duration::new(s, n)),
        1 => (u64::MAX - 1_000_000..=u64::MAX).prop_map(Duration::from_nanos),
        3 => (0..5_000u64).prop_map(Duration::from_millis),
    ]
}

fn timeout() -> impl Strategy<Value = Timeout> {
    (any_duration(), any::<bool>()).prop_map(|(d, strict)| {
        if strict {
            Timeout::strict(d)
        } else {
            Timeout::new(d)
        }
    })
}

fn retry() -> impl Strategy<Value = Retry> {
    let backoff = prop_oneof![
        any_duration().prop_map(|delay| Backoff::Constant { delay }),
        (any_duration(), any_duration()).prop_map(|(base, cap)| Backoff::Linear { base, cap }),
        (any_duration(), any_f64(), any_duration()).prop_map(|(base, multiplier, cap)| {
            Backoff::Exponential {
                base,
                multiplier,
                cap,
            }
        }),
        (any_duration(), any_duration())
            .prop_map(|(base, cap)| Backoff::Decorrelated { base, cap }),
    ];
    let jitter = prop_oneof![
        Just(Jitter::None),
        Just(Jitter::Full),
        Just(Jitter::Equal),
        any_f64().prop_map(Jitter::Proportional),
    ];
    (
        backoff,
        jitter,
        any_u32(),
        prop::option::of((any_f64(), any_u32())),
    )
        .prop_map(|(backoff, jitter, attempts, budget)| {
            let r = Retry::with_backoff(backoff)
                .jitter(jitter)
                .max_attempts(attempts);
            match budget {
                Some((ratio, tokens)) => r.budget(RetryBudget::new(ratio, tokens)),
                None => r,
            }
        })
}

fn breaker() -> impl Strategy<Value = CircuitBreaker> {
    let mode = prop_oneof![
        any_u32().prop_map(BreakerMode::ConsecutiveFailures),
        any_u32().prop_map(BreakerMode::CountWindow),
        any_u32().prop_map(BreakerMode::TimeWindow),
    ];
    (
        mode,
        any_f64(),
        prop::option::of((any_f64(), any_duration())),
        any_u32(),
        (any_duration(), any_f64(), any_duration()),
        any_u32(),
        prop::option::of(any_duration()),
    )
        .prop_map(
            |(mode, rate, slow, minimum, (cooldown, growth, max), half_open, window)| {
                let mut c = CircuitBreaker::failure_rate(rate)
                    .minimum_calls(minimum)
                    .cooldown(cooldown)
                    .cooldown_growth(growth, max)
                    .half_open_calls(half_open);
                if let Some((r, d)) = slow {
                    c = c.slow_calls(r, d);
                }
                c.mode = mode;
                match window {
                    Some(w) => c.window(w),
                    None => c,
                }
            },
        )
}

fn bulkhead() -> impl Strategy<Value = Bulkhead> {
    (any_u32(), any_u32(), any_duration(), any_duration())
        .prop_map(|(n, q, wait, lease)| Bulkhead::new(n).queue(q, wait).lease(lease))
}

fn cooldown() -> impl Strategy<Value = Cooldown> {
    (any_duration(), any_duration(), any_duration())
        .prop_map(|(p, w, g)| Cooldown::new().max_pause(p).max_wait(w).grace(g))
}

fn rate_limiter() -> impl Strategy<Value = RateLimiter> {
    (
        prop::sample::select(vec![
            RateAlgorithm::Gcra,
            RateAlgorithm::FixedWindow,
            RateAlgorithm::SlidingWindow,
        ]),
        any_u32(),
        any_duration(),
        any_u32(),
        any_duration(),
    )
        .prop_map(|(a, limit, period, burst, wait)| {
            let mut r = rate(a, limit, period).max_wait(wait);
            if a == RateAlgorithm::Gcra {
                r = r.burst(burst);
            }
            r
        })
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        prop::option::of(timeout()),
        prop::option::of(retry()),
        prop::option::of(timeout()),
        prop::option::of(breaker()),
        prop::option::of(bulkhead()),
        prop::option::of(cooldown()),
        prop::option::of(rate_limiter()),
        prop::option::of(any_duration()),
    )
        .prop_map(
            |(
                overall_timeout,
                retry,
                attempt_timeout,
                circuit,
                bulkhead,
                cooldown,
                rate_limit,
                idle,
            )| {
                Setup {
                    attempt_timeout: attempt_timeout.filter(|_| retry.is_some()),
                    overall_timeout,
                    retry,
                    circuit,
                    bulkhead,
                    cooldown,
                    rate_limit,
                    partition_idle: idle,
                }
            },
        )
}

fn run() -> impl Strategy<Value = Run> {
    (
        prop_oneof![Just(Duration::ZERO), Just(FAR)],
        any::<bool>(),
        any::<bool>(),
        0..3u32,
        prop::option::of(any_duration()),
        any_duration(),
        1..4u32,
    )
        .prop_map(
            |(start, listener, partition, failures, hint, pause, calls)| Run {
                start,
                listener,
                partition,
                failures,
                hint,
                pause,
                calls,
            },
        )
}

#[test]
fn any_configuration_builds_or_is_refused_and_runs() {
    // The strategy's value tree is deep: generate and shrink on a thread
    // with room for it.
    std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(|| {
            let config = ProptestConfig {
                cases: 2000,
                source_file: Some(file!()),
                failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
                    "proptest-regressions",
                ))),
                ..ProptestConfig::default()
            };
            let mut runner = proptest::test_runner::TestRunner::new(config);
            let result = runner.run(
                &(setup(), run(), any::<bool>()),
                |(setup, run, run_async)| {
                    match watched(&setup, &run, run_async) {
                        Outcome::Built => {}
                        Outcome::Refused(e) => {
                            prop_assert!(
                                !e.policy.is_empty() && !e.field.is_empty() && !e.rule.is_empty()
                            );
                            prop_assert_eq!(
                                e.to_string(),
                                format!("{}.{} {}", e.policy, e.field, e.rule)
                            );
                        }
                        Outcome::Panicked(m) => prop_assert!(false, "panicked: {}", m),
                        Outcome::Hung { at_end } => {
                            prop_assert!(
                                false,
                                "a call did not return (at the end of the clock: {})",
                                at_end
                            )
                        }
                    }
                    Ok(())
                },
            );
            if let Err(e) = result {
                panic!("{e}\n{runner}");
            }
        })
        .unwrap()
        .join()
        .unwrap();
}
