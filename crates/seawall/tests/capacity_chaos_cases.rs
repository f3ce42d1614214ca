//! Chaos injection, adaptive concurrency limits, request coalescing, shadow
//! mode, weighted calls and policies written in code, checked through the
//! public API against what their docs state, the way users coming from
//! Polly's chaos strategies (Simmy), Netflix's concurrency-limits, Go's
//! singleflight and Resilience4j's metrics-only mode would check them.
//!
//! Every case of behaviour runs sync (`call`) and async (`run`) where both
//! exist, with and without an event listener, on a virtual clock starting
//! at 0 and at 10^9 s. Time moves only on the virtual clock.
//!
//! Where seawall documents a behaviour unlike its peers', the case checks
//! seawall's and says how the peer differs:
//! - Polly validates a fixed injection rate and clamps a generated one;
//!   seawall refuses a fixed rate outside `0..=1` at `build()` and clamps a
//!   generated one (NaN as 0), as Polly does.
//! - Netflix's AIMD and Vegas update on every sample; seawall gathers the
//!   samples of an `update_interval` and updates once per window. Vegas
//!   keeps a queue of `log10(limit)` to `3 log10(limit)` (Netflix: 3 to 6
//!   times that); Gradient2 adds its headroom only while the latency is
//!   within the buffer.
//! - Go's singleflight re-panics a leader's panic in every waiting caller
//!   and has `Forget`; seawall hands the execution to a follower, which runs
//!   its own operation, and keeps nothing after the end unless a `ttl`
//!   cache is configured.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use seawall::chaos::{Chaos, ChaosKind, ChaosSwitch};
use seawall::custom::{Next, Policy, PolicyFuture, Position};
use seawall::pipeline::{HandlesSync, ValueType};
use seawall::testing::{SeededRandom, SequenceRandom, VirtualClock};
use seawall::{
    AdaptiveLimit, Bulkhead, CircuitBreaker, CircuitState, Clock, Coalesce, ConfigError, Context,
    Error, EventKind, MemoryStore, Pipeline, PipelineBuilder, RateLimiter, Rejection,
    RejectionReason, Retry, Timeout, Verdict,
};

mod support;

use support::{count, ms, reason, recorder, refusal, rt, secs, Boom, Log};

const SEQ: Ordering = Ordering::SeqCst;

/// 10^9 s: a clock far from its origin (further than `support::FAR`).
const FAR: Duration = Duration::from_secs(1_000_000_000);
const STARTS: [Duration; 2] = [Duration::ZERO, FAR];

/// The error injected by chaos faults in these cases.
const INJECTED: Boom = Boom(0);

/// How a case calls: sync or async, with a listener or not, on a clock
/// starting at `start`.
#[derive(Debug, Clone, Copy)]
struct Mode {
    sync: bool,
    listen: bool,
    start: Duration,
}

/// Every mode: sync and async, with and without a listener, from each start.
fn modes() -> Vec<Mode> {
    [true, false].into_iter().flat_map(modes_of).collect()
}

/// The modes that call sync (`true`) or async (`false`).
fn modes_of(sync: bool) -> Vec<Mode> {
    let mut v = Vec::new();
    for listen in [false, true] {
        for start in STARTS {
            v.push(Mode {
                sync,
                listen,
                start,
            });
        }
    }
    v
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap()
}

impl Mode {
    /// A builder with a fresh store, a virtual clock at `start`, a
    /// listener when the mode listens.
    fn builder(self, name: &str) -> (PipelineBuilder, VirtualClock, Log) {
        let clock = VirtualClock::starting_at(self.start);
        let (log, listener) = recorder();
        let mut b = Pipeline::builder(name)
            .store(MemoryStore::new())
            .clock(clock.clone());
        if self.listen {
            b = b.on_event(listener);
        }
        (b, clock, log)
    }

    /// Virtual time passed since the start.
    fn elapsed(self, clock: &VirtualClock) -> Duration {
        clock.now() - self.start
    }

    /// One call of an operation whose result is ready at once.
    fn call<K, T, E>(
        self,
        p: &Pipeline<K>,
        op: impl FnMut(Context) -> Result<T, E>,
    ) -> Result<T, Error<E>>
    where
        K: HandlesSync<T, E>,
    {
        self.many(p, 1, op).pop().unwrap()
    }

    /// `n` calls in a row (one runtime for all of them when async).
    fn many<K, T, E>(
        self,
        p: &Pipeline<K>,
        n: usize,
        mut op: impl FnMut(Context) -> Result<T, E>,
    ) -> Vec<Result<T, Error<E>>>
    where
        K: HandlesSync<T, E>,
    {
        if self.sync {
            (0..n).map(|_| p.call(&mut op)).collect()
        } else {
            rt().block_on(async {
                let mut out = Vec::with_capacity(n);
                for _ in 0..n {
                    out.push(p.run(|ctx| std::future::ready(op(ctx))).await);
                }
                out
            })
        }
    }
}

fn injected(log: &Log) -> Vec<(ChaosKind, u32)> {
    log.lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            EventKind::ChaosInjected { kind, attempt } => Some((*kind, *attempt)),
            _ => None,
        })
        .collect()
}

fn limit_changes(log: &Log) -> Vec<(u32, u32)> {
    log.lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            EventKind::LimitChanged { previous, limit } => Some((*previous, *limit)),
            _ => None,
        })
        .collect()
}

/// Builds with `build` and expects a `ConfigError` naming `policy.field`;
/// a panic is signalled as such, not as a crash of the test.
fn refused<T>(
    what: &str,
    policy: &str,
    field: &str,
    build: impl FnOnce() -> Result<T, ConfigError>,
) {
    match catch_unwind(AssertUnwindSafe(build)) {
        Err(_) => panic!("{what}: build() panicked instead of returning a ConfigError"),
        Ok(Ok(_)) => panic!("{what}: build() accepted it"),
        Ok(Err(e)) => {
            assert_eq!((e.policy, e.field), (policy, field), "{what}: {e}");
            assert!(
                e.to_string().starts_with(&format!("{policy}.{field} ")),
                "{what}: {e}"
            );
        }
    }
}

/// Calls `call(i)` on `n` threads at once, `i` in `0..n`; the results in
/// that order.
fn on_threads<R: Send>(n: usize, call: impl Fn(usize) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let call = &call;
        let handles: Vec<_> = (0..n).map(|i| s.spawn(move || call(i))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Polls the futures together on the current task, in order.
async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (f, out) in futures.iter_mut().zip(outs.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => done = false,
                }
            }
        }
        if done {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    outs.into_iter().map(Option::unwrap).collect()
}

// ===================================================================== chaos

/// Rate 0 never injects, whatever the draw (0.0 included); rate 1 always
/// does (0.9999999 included): faults, outcomes, latencies and behaviours,
/// each signalled by one `ChaosInjected` event.
#[test]
fn chaos_rate_zero_never_injects_and_rate_one_always_does() {
    const N: usize = 40;
    let edges = || SequenceRandom::new([0.0, 0.999_999_9]);
    for mode in modes() {
        // Rate 0, all four kinds at once.
        let hooked = Arc::new(AtomicU32::new(0));
        let h = hooked.clone();
        let (b, clock, log) = mode.builder("chaos-rate-zero");
        let p = b
            .random(edges())
            .chaos(Chaos::latency(0.0, ms(100)))
            .chaos(Chaos::behavior(0.0, move |_| {
                h.fetch_add(1, SEQ);
            }))
            .chaos_fault(Chaos::fault(0.0, |_| INJECTED))
            .chaos_outcome(Chaos::outcome(0.0, |_| 999u32))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let results = mode.many(&p, N, |_| Ok::<u32, Boom>(ops.fetch_add(1, SEQ) + 1));
        for (i, r) in results.iter().enumerate() {
            assert_eq!(r.as_ref().ok(), Some(&(i as u32 + 1)), "{mode:?}");
        }
        assert_eq!(ops.load(SEQ), N as u32, "{mode:?}");
        assert_eq!(hooked.load(SEQ), 0, "{mode:?}");
        assert_eq!(mode.elapsed(&clock), Duration::ZERO, "{mode:?}");
        assert!(injected(&log).is_empty(), "{mode:?}");

        // Rate 1: a fault ends every attempt without running the operation.
        let (b, clock, log) = mode.builder("chaos-rate-one-fault");
        let p = b
            .random(edges())
            .chaos_fault(Chaos::fault(1.0, |_| INJECTED))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let results = mode.many(&p, N, |_| Ok::<u32, Boom>(ops.fetch_add(1, SEQ) + 1));
        assert!(
            results
                .iter()
                .all(|r| matches!(r, Err(Error::Operation(e)) if *e == INJECTED)),
            "{mode:?}: {results:?}"
        );
        assert_eq!(ops.load(SEQ), 0, "{mode:?}");
        assert_eq!(mode.elapsed(&clock), Duration::ZERO);
        let expected = if mode.listen {
            vec![(ChaosKind::Fault, 1); N]
        } else {
            vec![]
        };
        assert_eq!(injected(&log), expected, "{mode:?}");

        // An outcome: the generated value, a success.
        let (b, _, log) = mode.builder("chaos-rate-one-outcome");
        let p: Pipeline<ValueType<u32, Boom>> = b
            .random(edges())
            .chaos_outcome(Chaos::outcome(1.0, |ctx| 900 + ctx.attempt()))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let results = mode.many(&p, N, |_| Ok::<u32, Boom>(ops.fetch_add(1, SEQ) + 1));
        assert!(
            results.iter().all(|r| r.as_ref().ok() == Some(&901)),
            "{mode:?}"
        );
        assert_eq!(ops.load(SEQ), 0, "{mode:?}");
        assert_eq!(injected(&log).len(), if mode.listen { N } else { 0 });

        // A latency: slept whole before every operation.
        let (b, clock, log) = mode.builder("chaos-rate-one-latency");
        let p = b
            .random(edges())
            .chaos(Chaos::latency(1.0, ms(7)))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let results = mode.many(&p, N, |_| Ok::<u32, Boom>(ops.fetch_add(1, SEQ) + 1));
        assert!(results.iter().all(|r| r.is_ok()), "{mode:?}");
        assert_eq!(ops.load(SEQ), N as u32);
        assert_eq!(mode.elapsed(&clock), ms(7) * N as u32, "{mode:?}");
        let expected = if mode.listen {
            vec![(ChaosKind::Latency { delay: ms(7) }, 1); N]
        } else {
            vec![]
        };
        assert_eq!(injected(&log), expected, "{mode:?}");

        // A behaviour: its hook, then the operation.
        let hooked = Arc::new(AtomicU32::new(0));
        let h = hooked.clone();
        let (b, _, log) = mode.builder("chaos-rate-one-behavior");
        let p = b
            .random(edges())
            .chaos(Chaos::behavior(1.0, move |_| {
                h.fetch_add(1, SEQ);
            }))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let results = mode.many(&p, N, |_| {
            assert_eq!(hooked.load(SEQ), ops.load(SEQ) + 1, "the hook ran first");
            Ok::<u32, Boom>(ops.fetch_add(1, SEQ) + 1)
        });
        assert!(results.iter().all(|r| r.is_ok()), "{mode:?}");
        assert_eq!((hooked.load(SEQ), ops.load(SEQ)), (N as u32, N as u32));
        assert_eq!(injected(&log).len(), if mode.listen { N } else { 0 });
    }
}

/// A rate between 0 and 1 injects exactly when the pipeline's draw falls
/// under it (one draw per attempt), so over many seeded draws at that
/// frequency.
#[test]
fn chaos_a_rate_in_between_injects_at_that_frequency() {
    use seawall::Random;
    const N: usize = 2_000;
    for mode in modes() {
        for (seed, rate) in [(1u64, 0.1), (2, 0.25), (3, 0.5), (4, 0.9)] {
            let (b, _, log) = mode.builder("chaos-frequency");
            let p = b
                .random(SeededRandom::new(seed))
                .chaos_fault(Chaos::fault(rate, |_| INJECTED))
                .build()
                .unwrap();
            let results = mode.many(&p, N, |_| Ok::<u32, Boom>(1));
            let got: Vec<bool> = results.iter().map(|r| r.is_err()).collect();
            let replay = SeededRandom::new(seed);
            let expected: Vec<bool> = (0..N).map(|_| replay.next_f64() < rate).collect();
            assert!(
                got == expected,
                "{mode:?} rate {rate}: not the draws under the rate"
            );
            let hits = got.iter().filter(|&&x| x).count() as f64;
            let mean = N as f64 * rate;
            let sd = (N as f64 * rate * (1.0 - rate)).sqrt();
            assert!(
                (hits - mean).abs() <= 5.0 * sd,
                "{mode:?} rate {rate}: {hits} of {N}"
            );
            if mode.listen {
                assert_eq!(injected(&log).len(), hits as usize);
            }
        }
    }
}

/// A generated rate is clamped to `[0, 1]`, NaN counting as 0 (Polly
/// coerces a generated rate the same way), and is asked for each attempt.
#[test]
fn chaos_a_generated_rate_is_clamped_and_asked_for_each_attempt() {
    for mode in modes() {
        for (generated, injects) in [
            (1.5, true),
            (f64::INFINITY, true),
            (1.0, true),
            (-0.5, false),
            (f64::NEG_INFINITY, false),
            (f64::NAN, false),
            (0.0, false),
        ] {
            let (b, _, _) = mode.builder("chaos-generated");
            let p = b
                .random(SequenceRandom::new([0.0, 0.5, 0.999_999]))
                .chaos_fault(Chaos::fault(0.5, |_| INJECTED).rate_generator(move |_| generated))
                .build()
                .unwrap();
            let results = mode.many(&p, 6, |_| Ok::<u32, Boom>(1));
            assert!(
                results.iter().all(|r| r.is_err() == injects),
                "{mode:?} generated {generated}: {results:?}"
            );
        }
        // By attempt: attempts 1 and 2 always, 3 never.
        let (b, clock, _) = mode.builder("chaos-generated-attempt");
        let asked = Arc::new(AtomicU32::new(0));
        let a = asked.clone();
        let p = b
            .random(SequenceRandom::new([0.5]))
            .retry(Retry::constant(ms(3)).max_attempts(5))
            .chaos_fault(Chaos::fault(0.0, |_| INJECTED).rate_generator(move |ctx| {
                a.fetch_add(1, SEQ);
                if ctx.attempt() < 3 {
                    1.0
                } else {
                    0.0
                }
            }))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let r = mode.call(&p, |ctx| {
            ops.fetch_add(1, SEQ);
            Ok::<u32, Boom>(ctx.attempt())
        });
        assert_eq!(r.ok(), Some(3), "{mode:?}");
        assert_eq!((ops.load(SEQ), asked.load(SEQ)), (1, 3), "{mode:?}");
        assert_eq!(mode.elapsed(&clock), ms(6), "{mode:?}");
    }
}

/// The switch turns a policy off and on at run time; a disabled policy
/// draws nothing, so the policies after it draw as if it were absent; a
/// flip takes effect on the next attempt, also in the middle of a call.
#[test]
fn chaos_the_switch_turns_injection_off_and_on_at_run_time() {
    for mode in modes() {
        let switch = ChaosSwitch::new(false);
        let (b, clock, log) = mode.builder("chaos-switch");
        let p = b
            .random(SequenceRandom::new([0.1, 0.9]))
            .chaos_fault(Chaos::fault(1.0, |_| INJECTED).enabled(switch.clone()))
            .chaos(Chaos::latency(0.5, ms(10)))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let step = |expect_fault: bool, elapsed: Duration| {
            let r = mode.call(&p, |_| Ok::<u32, Boom>(ops.fetch_add(1, SEQ) + 1));
            assert_eq!(r.is_err(), expect_fault, "{mode:?}: {r:?}");
            assert_eq!(mode.elapsed(&clock), elapsed, "{mode:?}");
        };
        // Off: the fault draws nothing; the latency draws 0.1, then 0.9.
        step(false, ms(10));
        step(false, ms(10));
        switch.set(true);
        assert!(switch.is_on());
        // On: the fault draws 0.1 then 0.9 (both under 1) and ends the
        // attempts before the latency is asked.
        step(true, ms(10));
        step(true, ms(10));
        switch.set(false);
        step(false, ms(20));
        step(false, ms(20));
        assert_eq!(ops.load(SEQ), 4);
        if mode.listen {
            assert_eq!(
                injected(&log),
                vec![
                    (ChaosKind::Latency { delay: ms(10) }, 1),
                    (ChaosKind::Fault, 1),
                    (ChaosKind::Fault, 1),
                    (ChaosKind::Latency { delay: ms(10) }, 1),
                ],
                "{mode:?}"
            );
        }

        // Switched on by the first attempt: the next attempts see it.
        let switch = ChaosSwitch::new(false);
        let s = switch.clone();
        let (b, clock, _) = mode.builder("chaos-switch-mid-call");
        let p = b
            .random(SequenceRandom::new([0.0]))
            .retry(Retry::constant(ms(1)).max_attempts(3))
            .chaos_fault(Chaos::fault(1.0, |_| INJECTED).enabled(switch.clone()))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let r = mode.call(&p, |_| {
            ops.fetch_add(1, SEQ);
            s.set(true);
            Err::<u32, _>(Boom(1))
        });
        match r {
            Err(Error::RetryExhausted { attempts, last }) => {
                assert_eq!((attempts, last), (3, INJECTED), "{mode:?}")
            }
            other => panic!("{mode:?}: {other:?}"),
        }
        assert_eq!(ops.load(SEQ), 1, "{mode:?}: attempts 2 and 3 were injected");
        assert_eq!(mode.elapsed(&clock), ms(2));

        // Switched off by the first attempt (an `Arc<AtomicBool>`).
        let flag = Arc::new(AtomicBool::new(true));
        let f = flag.clone();
        let (b, clock, _) = mode.builder("chaos-flag-mid-call");
        let p = b
            .random(SequenceRandom::new([0.0]))
            .retry(Retry::constant(ms(1)).max_attempts(3))
            .chaos(Chaos::latency(1.0, ms(10)).enabled(flag.clone()))
            .build()
            .unwrap();
        let r = mode.call(&p, |ctx| {
            if ctx.attempt() == 1 {
                f.store(false, SEQ);
                Err(Boom(1))
            } else {
                Ok(ctx.attempt())
            }
        });
        assert_eq!(r.ok(), Some(2), "{mode:?}");
        assert_eq!(mode.elapsed(&clock), ms(11), "{mode:?}");

        // A closure as the switch, asked once per attempt.
        let on = Arc::new(AtomicBool::new(false));
        let asked = Arc::new(AtomicU32::new(0));
        let (w, a) = (on.clone(), asked.clone());
        let (b, _, _) = mode.builder("chaos-when");
        let p = b
            .random(SequenceRandom::new([0.0]))
            .retry(Retry::constant(ms(1)).max_attempts(2))
            .chaos_fault(Chaos::fault(1.0, |_| INJECTED).enabled_when(move || {
                a.fetch_add(1, SEQ);
                w.load(SEQ)
            }))
            .build()
            .unwrap();
        assert_eq!(mode.call(&p, |_| Ok::<u32, Boom>(5)).ok(), Some(5));
        assert_eq!(asked.load(SEQ), 1, "{mode:?}");
        on.store(true, SEQ);
        assert!(mode.call(&p, |_| Ok::<u32, Boom>(5)).is_err());
        assert_eq!(
            asked.load(SEQ),
            3,
            "{mode:?}: once for each of two attempts"
        );
    }
}

/// An injected latency is exactly the configured one on the virtual clock,
/// latencies add up, and the latency is inside the attempt's deadline: a
/// result at the deadline is on time; past it, async attempts time out and
/// sync ones are late (an event, or a timeout when strict).
#[test]
fn chaos_latency_is_exact_and_counts_toward_timeouts() {
    for mode in modes() {
        let (b, clock, log) = mode.builder("chaos-latency");
        let p = b
            .random(SequenceRandom::new([0.0]))
            .chaos(Chaos::latency(1.0, ms(250)))
            .chaos(Chaos::latency(1.0, ms(40)))
            .build()
            .unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let r = mode.call(&p, |_| {
            seen.lock().unwrap().push(clock.now());
            Ok::<u32, Boom>(1)
        });
        assert_eq!(r.ok(), Some(1));
        assert_eq!(
            *seen.lock().unwrap(),
            vec![mode.start + ms(290)],
            "{mode:?}"
        );
        assert_eq!(mode.elapsed(&clock), ms(290));
        assert_eq!(injected(&log).len(), if mode.listen { 2 } else { 0 });

        // A latency that ends at the deadline: on time, under either
        // timeout.
        for timeout in [Timeout::new(ms(100)), Timeout::strict(ms(100))] {
            let (b, clock, log) = mode.builder("chaos-latency-at-deadline");
            let p = b
                .random(SequenceRandom::new([0.0]))
                .timeout(timeout)
                .chaos(Chaos::latency(1.0, ms(100)))
                .build()
                .unwrap();
            let r = mode.call(&p, |_| Ok::<u32, Boom>(1));
            assert_eq!(r.as_ref().ok(), Some(&1), "{mode:?} {timeout:?}: {r:?}");
            assert_eq!(mode.elapsed(&clock), ms(100), "{mode:?}");
            assert_eq!(
                count(&log, |e| matches!(
                    e,
                    EventKind::DeadlineExceeded { .. } | EventKind::TimedOut { .. }
                )),
                0,
                "{mode:?} {timeout:?}"
            );
        }

        // Past the deadline.
        for strict in [false, true] {
            let timeout = if strict {
                Timeout::strict(ms(100))
            } else {
                Timeout::new(ms(100))
            };
            let (b, clock, log) = mode.builder("chaos-latency-late");
            let p = b
                .random(SequenceRandom::new([0.0]))
                .timeout(timeout)
                .chaos(Chaos::latency(1.0, ms(150)))
                .build()
                .unwrap();
            let ops = AtomicU32::new(0);
            let r = mode.call(&p, |_| Ok::<u32, Boom>(ops.fetch_add(1, SEQ) + 1));
            if mode.sync && !strict {
                // Slept whole; the late success is kept and signalled.
                assert_eq!(r.ok(), Some(1), "{mode:?}");
                assert_eq!(mode.elapsed(&clock), ms(150));
                if mode.listen {
                    assert_eq!(
                        count(&log, |e| *e
                            == EventKind::DeadlineExceeded { late_by: ms(50) }),
                        1,
                        "{mode:?}: {:?}",
                        log.lock().unwrap()
                    );
                }
            } else {
                match &r {
                    Err(Error::Timeout(t)) => assert_eq!(t.after, ms(100), "{mode:?}"),
                    other => panic!("{mode:?} strict {strict}: {other:?}"),
                }
                if mode.sync {
                    assert_eq!(mode.elapsed(&clock), ms(150));
                    assert_eq!(ops.load(SEQ), 1, "slept whole, then ran late");
                } else {
                    assert_eq!(mode.elapsed(&clock), ms(100), "{mode:?}");
                    assert_eq!(ops.load(SEQ), 0, "the attempt was dropped");
                }
            }
        }

        // Timed-out attempts are failures for the circuit breaker.
        let (b, clock, _) = mode.builder("chaos-latency-breaker");
        let p = b
            .random(SequenceRandom::new([0.0]))
            .retry(Retry::constant(ms(5)).max_attempts(2))
            .circuit_breaker(CircuitBreaker::consecutive_failures(2))
            .timeout(Timeout::strict(ms(50)))
            .chaos(Chaos::latency(1.0, ms(80)))
            .build()
            .unwrap();
        let r = mode.call(&p, |_| Ok::<u32, Boom>(1));
        assert!(matches!(r, Err(Error::Timeout(_))), "{mode:?}: {r:?}");
        assert_eq!(p.circuit_state().unwrap(), CircuitState::Open, "{mode:?}");
        let per_attempt = if mode.sync { ms(80) } else { ms(50) };
        assert_eq!(mode.elapsed(&clock), per_attempt * 2 + ms(5), "{mode:?}");
    }
}

/// An injected fault is an error of the operation: classified by the
/// classifier, retried, counted by the circuit breaker (one failure per
/// call before the retry, one per attempt after it), handed to the
/// fallback, and a drop for the adaptive limit.
#[test]
fn chaos_an_injected_fault_is_classified_like_a_real_one() {
    for mode in modes() {
        // Retried as any error.
        let (b, clock, log) = mode.builder("chaos-fault-retried");
        let p = b
            .random(SequenceRandom::new([0.0]))
            .retry(Retry::constant(ms(10)).max_attempts(3))
            .chaos_fault(Chaos::fault(1.0, |_| INJECTED))
            .build()
            .unwrap();
        let r = mode.call(&p, |_| Ok::<u32, Boom>(1));
        match r {
            Err(Error::RetryExhausted { attempts, last }) => {
                assert_eq!((attempts, last), (3, INJECTED))
            }
            other => panic!("{mode:?}: {other:?}"),
        }
        assert_eq!(mode.elapsed(&clock), ms(20));
        if mode.listen {
            assert_eq!(
                injected(&log),
                vec![
                    (ChaosKind::Fault, 1),
                    (ChaosKind::Fault, 2),
                    (ChaosKind::Fault, 3)
                ]
            );
            assert_eq!(
                count(&log, |e| matches!(e, EventKind::RetryScheduled { .. })),
                2
            );
        }

        // Judged by the classifier: an abort is not retried.
        let (b, clock, _) = mode.builder("chaos-fault-abort");
        let p = b
            .random(SequenceRandom::new([0.0]))
            .retry(Retry::constant(ms(10)).max_attempts(3))
            .classify(|e: &Boom| {
                if *e == INJECTED {
                    Verdict::abort()
                } else {
                    Verdict::retry()
                }
            })
            .chaos_fault(Chaos::fault(1.0, |_| INJECTED))
            .build()
            .unwrap();
        let r = mode.call(&p, |_| Ok::<u32, Boom>(1));
        assert!(
            matches!(&r, Err(Error::Operation(e)) if *e == INJECTED),
            "{mode:?}: {r:?}"
        );
        assert_eq!(mode.elapsed(&clock), Duration::ZERO);

        // Ignored: never counted by the breaker.
        let (b, _, _) = mode.builder("chaos-fault-ignored");
        let p = b
            .random(SequenceRandom::new([0.0]))
            .circuit_breaker(CircuitBreaker::consecutive_failures(1))
            .classify(|_: &Boom| Verdict::ignore())
            .chaos_fault(Chaos::fault(1.0, |_| INJECTED))
            .build()
            .unwrap();
        for _ in 0..3 {
            assert!(mode.call(&p, |_| Ok::<u32, Boom>(1)).is_err());
        }
        assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed, "{mode:?}");

        // Each attempt is a failure for a breaker after the retry.
        let (b, _, _) = mode.builder("chaos-fault-attempt-breaker");
        let p = b
            .random(SequenceRandom::new([0.0]))
            .retry(Retry::constant(ms(1)).max_attempts(3))
            .circuit_breaker(CircuitBreaker::consecutive_failures(2))
            .chaos_fault(Chaos::fault(1.0, |_| INJECTED))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let r = mode.call(&p, |_| Ok::<u32, Boom>(ops.fetch_add(1, SEQ)));
        assert_eq!(
            reason(&r),
            Some(RejectionReason::CircuitOpen),
            "{mode:?}: {r:?}"
        );
        assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
        assert_eq!(ops.load(SEQ), 0);

        // One failure per call for a breaker before the retry.
        let (b, _, _) = mode.builder("chaos-fault-call-breaker");
        let p = b
            .random(SequenceRandom::new([0.0]))
            .circuit_breaker(CircuitBreaker::consecutive_failures(2))
            .retry(Retry::constant(ms(1)).max_attempts(3))
            .chaos_fault(Chaos::fault(1.0, |_| INJECTED))
            .build()
            .unwrap();
        assert!(matches!(
            mode.call(&p, |_| Ok::<u32, Boom>(1)),
            Err(Error::RetryExhausted { attempts: 3, .. })
        ));
        assert_eq!(p.circuit_metrics().unwrap().failures, 1, "{mode:?}");
        assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
        assert!(mode.call(&p, |_| Ok::<u32, Boom>(1)).is_err());
        assert_eq!(p.circuit_state().unwrap(), CircuitState::Open, "{mode:?}");
        let r = mode.call(&p, |_| Ok::<u32, Boom>(1));
        assert_eq!(reason(&r), Some(RejectionReason::CircuitOpen));

        // The fallback gets it.
        let (b, _, _) = mode.builder("chaos-fault-fallback");
        let p = b
            .random(SequenceRandom::new([0.0]))
            .chaos_fault(Chaos::fault(1.0, |_| INJECTED))
            .fallback_sync(|e: Error<Boom>, _| {
                Ok(if e.operation_error() == Some(&INJECTED) {
                    77
                } else {
                    0
                })
            })
            .build()
            .unwrap();
        assert_eq!(
            mode.call(&p, |_| Ok::<u32, Boom>(1)).ok(),
            Some(77),
            "{mode:?}"
        );

        // A drop for the adaptive limit (AIMD halves per window).
        let (b, clock, _) = mode.builder("chaos-fault-adaptive");
        let p = b
            .random(SequenceRandom::new([0.0]))
            .adaptive_limit(
                AdaptiveLimit::aimd()
                    .limits(1, 8, 8)
                    .backoff_ratio(0.5)
                    .update_interval(ms(1)),
            )
            .chaos_fault(Chaos::fault(1.0, |_| INJECTED))
            .build()
            .unwrap();
        for _ in 0..2 {
            clock.advance(ms(2));
            assert!(mode.call(&p, |_| Ok::<u32, Boom>(1)).is_err());
        }
        assert_eq!(p.concurrency_limit().unwrap().limit, 4, "{mode:?}");
    }
}

/// A fixed rate outside `0..=1` (NaN and infinities included) fails
/// `build()` with `chaos.rate`, for every kind; chaos before the retry with
/// `pipeline.chaos`.
#[test]
fn chaos_bad_settings_fail_at_build_naming_the_field() {
    for bad in [
        -0.1,
        1.000_001,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -1.0,
    ] {
        refused("latency", "chaos", "rate", || {
            Pipeline::builder("chaos-bad")
                .chaos(Chaos::latency(bad, ms(1)))
                .build()
        });
        refused("behavior", "chaos", "rate", || {
            Pipeline::builder("chaos-bad")
                .chaos(Chaos::behavior(bad, |_| {}))
                .build()
        });
        refused("fault", "chaos", "rate", || {
            Pipeline::builder("chaos-bad")
                .chaos_fault(Chaos::fault(bad, |_| INJECTED))
                .build()
        });
        refused("outcome", "chaos", "rate", || {
            Pipeline::builder("chaos-bad")
                .chaos_outcome::<u32, Boom>(Chaos::outcome(bad, |_| 1u32))
                .build()
        });
        refused("fault with a switch", "chaos", "rate", || {
            Pipeline::builder("chaos-bad")
                .chaos_fault(Chaos::fault(bad, |_| INJECTED).enabled(false))
                .build()
        });
    }
    refused("chaos before retry", "pipeline", "chaos", || {
        Pipeline::builder("chaos-order")
            .chaos(Chaos::latency(0.5, ms(1)))
            .retry(Retry::constant(ms(1)))
            .build()
    });
    // The edges are accepted.
    for ok in [0.0, 1.0] {
        Pipeline::builder("chaos-ok")
            .chaos(Chaos::latency(ok, ms(1)))
            .build()
            .unwrap();
    }
}

// ================================================================== adaptive

/// A limit that stays `n`.
fn fixed(n: u32) -> AdaptiveLimit {
    AdaptiveLimit::aimd().limits(n, n, n)
}

/// AIMD adds one per update window while at least half the limit is in
/// use, and no more than `max_limit`; a sync call alone in flight grows a
/// limit of 1 to 2 and 3, then no further (1 is under half of 3).
#[test]
fn adaptive_aimd_grows_under_success_within_its_bounds() {
    for mode in modes() {
        let (b, clock, log) = mode.builder("aimd-grows");
        let p = b
            .adaptive_limit(
                AdaptiveLimit::aimd()
                    .limits(1, 1, 10)
                    .update_interval(ms(1)),
            )
            .build()
            .unwrap();
        let c = clock.clone();
        let results = mode.many(&p, 40, move |_| {
            c.advance(ms(2));
            Ok::<u32, Boom>(1)
        });
        assert!(results.iter().all(|r| r.is_ok()), "{mode:?}");
        let now = p.concurrency_limit().unwrap();
        assert_eq!(
            (now.limit, now.admitted, now.in_flight),
            (3, 3, 0),
            "{mode:?}"
        );
        if mode.listen {
            assert_eq!(limit_changes(&log), vec![(1, 2), (2, 3)], "{mode:?}");
        } else {
            assert!(log.lock().unwrap().is_empty());
        }
    }

    // Async rounds of 8 concurrent attempts of 2 ms: every round uses the
    // whole limit, which grows by one per window up to its maximum.
    for mode in modes_of(false) {
        let (b, clock, log) = mode.builder("aimd-grows-async");
        let p = b
            .adaptive_limit(AdaptiveLimit::aimd().limits(2, 2, 6).update_interval(ms(1)))
            .build()
            .unwrap();
        let rt = rt();
        let mut limits = Vec::new();
        for _ in 0..12 {
            let before = p.concurrency_limit().unwrap().admitted;
            let (admitted, peak) = round(&rt, &p, &clock, 8, ms(2));
            assert_eq!(admitted, before.min(8) as usize, "{mode:?}");
            assert!(peak <= before, "{peak} in flight over a limit of {before}");
            limits.push(p.concurrency_limit().unwrap().limit);
        }
        assert!(limits.windows(2).all(|w| w[0] <= w[1]), "{limits:?}");
        assert!(limits.iter().all(|&l| l <= 6), "{limits:?}");
        assert_eq!(*limits.last().unwrap(), 6, "{limits:?}");
        if mode.listen {
            assert_eq!(
                limit_changes(&log),
                vec![(2, 3), (3, 4), (4, 5), (5, 6)],
                "{mode:?}"
            );
        }
    }
}

/// One round of `n` concurrent async calls of `latency` on the virtual
/// clock: how many were admitted, and the most that ran at once.
fn round(
    rt: &tokio::runtime::Runtime,
    p: &Pipeline,
    clock: &VirtualClock,
    n: usize,
    latency: Duration,
) -> (usize, u32) {
    let running = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let results = rt.block_on(join_all(
        (0..n)
            .map(|_| {
                let (clock, running, peak) = (clock.clone(), running.clone(), peak.clone());
                p.run(move |_| {
                    let (clock, running, peak) = (clock.clone(), running.clone(), peak.clone());
                    async move {
                        let now = running.fetch_add(1, SEQ) + 1;
                        peak.fetch_max(now, SEQ);
                        Clock::sleep(&clock, latency).await;
                        running.fetch_sub(1, SEQ);
                        Ok::<_, Boom>(())
                    }
                })
            })
            .collect(),
    ));
    let mut admitted = 0;
    for r in &results {
        match r {
            Ok(()) => admitted += 1,
            Err(Error::Rejected(r)) => assert_eq!(r.reason, RejectionReason::ConcurrencyLimited),
            Err(other) => panic!("{other:?}"),
        }
    }
    (admitted, peak.load(SEQ))
}

/// `times` rounds of `n` concurrent attempts of `latency` each.
fn run_rounds(
    rt: &tokio::runtime::Runtime,
    p: &Pipeline,
    clock: &VirtualClock,
    times: usize,
    n: usize,
    latency: Duration,
) {
    for _ in 0..times {
        round(rt, p, clock, n, latency);
    }
}

/// AIMD multiplies the limit by `backoff_ratio` (rounded down) for a
/// window with a drop (an error judged a failure, a timeout) or a latency
/// over `rtt_timeout`, and never goes below `min_limit`. An injected
/// latency counts: it runs after the limit admitted the attempt.
#[test]
fn adaptive_aimd_shrinks_on_drops_and_slow_calls_within_its_bounds() {
    for mode in modes() {
        // Failures.
        let (b, clock, log) = mode.builder("aimd-drops");
        let p = b
            .adaptive_limit(
                AdaptiveLimit::aimd()
                    .limits(2, 10, 10)
                    .backoff_ratio(0.5)
                    .update_interval(ms(1)),
            )
            .build()
            .unwrap();
        let c = clock.clone();
        let results = mode.many(&p, 12, move |_| {
            c.advance(ms(2));
            Err::<u32, _>(Boom(1))
        });
        assert!(results
            .iter()
            .all(|r| matches!(r, Err(Error::Operation(_)))));
        let now = p.concurrency_limit().unwrap();
        assert_eq!((now.limit, now.in_flight), (2, 0), "{mode:?}");
        if mode.listen {
            assert_eq!(limit_changes(&log), vec![(10, 5), (5, 2)], "{mode:?}");
        }

        // Slow successes, made slow by an injected latency.
        let (b, _, log) = mode.builder("aimd-slow");
        let p = b
            .random(SequenceRandom::new([0.0]))
            .adaptive_limit(
                AdaptiveLimit::aimd()
                    .limits(3, 9, 9)
                    .backoff_ratio(0.9)
                    .rtt_timeout(ms(5))
                    .update_interval(ms(1)),
            )
            .chaos(Chaos::latency(1.0, ms(20)))
            .build()
            .unwrap();
        let results = mode.many(&p, 30, |_| Ok::<u32, Boom>(1));
        assert!(results.iter().all(|r| r.is_ok()));
        assert_eq!(p.concurrency_limit().unwrap().limit, 3, "{mode:?}");
        if mode.listen {
            let changes = limit_changes(&log);
            assert_eq!(changes.first(), Some(&(9, 8)), "{changes:?}");
            assert!(changes.iter().all(|(a, b)| b < a && *b >= 3), "{changes:?}");
        }
    }

    // Timeouts of async attempts are drops.
    for start in STARTS {
        let clock = VirtualClock::starting_at(start);
        let p = Pipeline::builder("aimd-timeouts")
            .retry(Retry::constant(ms(1)).max_attempts(4))
            .timeout(ms(5))
            .adaptive_limit(
                AdaptiveLimit::aimd()
                    .limits(4, 16, 16)
                    .backoff_ratio(0.5)
                    .update_interval(ms(1)),
            )
            .clock(clock.clone())
            .build()
            .unwrap();
        let c = clock.clone();
        let r = rt().block_on(p.run(move |_| {
            let c = c.clone();
            async move {
                Clock::sleep(&c, ms(10)).await;
                Ok::<u32, Boom>(1)
            }
        }));
        assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
        // Four drops, a window closed by every second one: 16, 8, 4.
        assert_eq!(p.concurrency_limit().unwrap().limit, 4);
        assert_eq!(clock.now() - start, ms(23));
    }
}

/// An error judged `Ignore` and a call refused by a later policy give the
/// slot back without a sample; an error judged `Abort` is a latency sample
/// (the dependency answered), not a drop.
#[test]
fn adaptive_ignored_and_refused_calls_give_no_sample() {
    for mode in modes() {
        let (b, clock, _) = mode.builder("adaptive-ignored");
        let p = b
            .adaptive_limit(
                AdaptiveLimit::aimd()
                    .limits(1, 6, 6)
                    .backoff_ratio(0.5)
                    .update_interval(ms(1)),
            )
            .classify(|e: &Boom| match e.0 {
                1 => Verdict::ignore(),
                _ => Verdict::abort(),
            })
            .build()
            .unwrap();
        let c = clock.clone();
        let results = mode.many(&p, 10, move |_| {
            c.advance(ms(2));
            Err::<u32, _>(Boom(1))
        });
        assert!(results.iter().all(|r| r.is_err()));
        assert_eq!(p.concurrency_limit().unwrap().limit, 6, "{mode:?}: ignored");
        let c = clock.clone();
        let _ = mode.many(&p, 10, move |_| {
            c.advance(ms(2));
            Err::<u32, _>(Boom(2))
        });
        assert_eq!(p.concurrency_limit().unwrap().limit, 6, "{mode:?}: aborts");

        // Refused by the rate limiter after the limit admitted it.
        let (b, clock, _) = mode.builder("adaptive-refused-later");
        let p = b
            .adaptive_limit(
                AdaptiveLimit::aimd()
                    .limits(1, 6, 6)
                    .backoff_ratio(0.5)
                    .update_interval(ms(1)),
            )
            .rate_limiter(RateLimiter::fixed_window(1, secs(3600)))
            .build()
            .unwrap();
        let c = clock.clone();
        let results = mode.many(&p, 10, move |_| {
            c.advance(ms(2));
            Ok::<u32, Boom>(1)
        });
        assert!(results[0].is_ok());
        assert!(results[1..]
            .iter()
            .all(|r| reason(r) == Some(RejectionReason::RateLimited)));
        for _ in 0..5 {
            clock.advance(ms(2));
            assert!(mode.call(&p, |_| Ok::<u32, Boom>(1)).is_err());
        }
        let now = p.concurrency_limit().unwrap();
        assert_eq!((now.limit, now.in_flight), (6, 0), "{mode:?}");
    }
}

/// Vegas and Gradient2 first measure their baseline at the pinned
/// concurrency, then grow while the latency stays at the baseline (up to
/// `max_limit`) and shrink when it rises (down to `min_limit`); no round
/// ever has more in flight than the limit it started with.
#[test]
fn adaptive_vegas_and_gradient2_grow_without_queueing_and_shrink_with_latency() {
    for (name, limit) in [
        ("vegas", AdaptiveLimit::vegas().limits(1, 4, 40)),
        ("gradient2", AdaptiveLimit::gradient2().limits(2, 4, 40)),
    ] {
        for mode in modes_of(false) {
            let (b, clock, log) = mode.builder(name);
            let p = b
                .random(SeededRandom::new(5))
                .adaptive_limit(
                    limit
                        .clone()
                        .update_interval(ms(1))
                        .min_rtt(secs(600), 4, 2),
                )
                .build()
                .unwrap();
            let rt = rt();
            // The baseline: two rounds at the pinned concurrency of 2.
            for _ in 0..2 {
                let now = p.concurrency_limit().unwrap();
                assert!(now.measuring && now.admitted == 2, "{name}: {now:?}");
                assert_eq!(round(&rt, &p, &clock, 40, ms(10)), (2, 2), "{name}");
            }
            let now = p.concurrency_limit().unwrap();
            assert!(!now.measuring, "{name}: {now:?}");
            assert_eq!(now.baseline, Some(ms(10)), "{name}");
            assert_eq!(now.limit, 4, "{name}");

            // No queueing: the limit grows, never past 40.
            let mut limits = vec![now.limit];
            for _ in 0..80 {
                let before = p.concurrency_limit().unwrap().admitted;
                let (admitted, peak) = round(&rt, &p, &clock, 40, ms(10));
                assert_eq!(admitted as u32, before.min(40), "{name}");
                assert!(peak <= before, "{name}: {peak} over {before}");
                limits.push(p.concurrency_limit().unwrap().limit);
            }
            assert!(
                limits.windows(2).all(|w| w[0] <= w[1]),
                "{name}: {limits:?}"
            );
            assert_eq!(*limits.last().unwrap(), 40, "{name}: {limits:?}");

            // The latency rises to 2.5 x the baseline: the limit shrinks.
            let mut limits = vec![40];
            for _ in 0..10 {
                let before = p.concurrency_limit().unwrap().admitted;
                let (_, peak) = round(&rt, &p, &clock, 40, ms(25));
                assert!(peak <= before, "{name}: {peak} over {before}");
                limits.push(p.concurrency_limit().unwrap().limit);
            }
            assert!(
                limits.windows(2).all(|w| w[0] >= w[1]),
                "{name}: {limits:?}"
            );
            assert!(*limits.last().unwrap() < 40, "{name}: {limits:?}");
            assert!(limits.iter().all(|&l| l >= 1), "{name}: {limits:?}");
            if mode.listen {
                let changes = limit_changes(&log);
                assert!(!changes.is_empty());
                assert!(
                    changes.iter().all(|&(a, b)| a != b && a <= 40 && b <= 40),
                    "{name}: {changes:?}"
                );
                // Each event starts where the previous one ended.
                assert!(
                    changes.windows(2).all(|w| w[0].1 == w[1].0),
                    "{name}: {changes:?}"
                );
            }
        }
    }

    // Gradient2 at its minimum stays there under a latency it cannot
    // serve faster.
    let clock = VirtualClock::starting_at(FAR);
    let p = Pipeline::builder("gradient2-floor")
        .random(SeededRandom::new(9))
        .adaptive_limit(
            AdaptiveLimit::gradient2()
                .limits(3, 12, 12)
                .update_interval(ms(1))
                .min_rtt(secs(600), 4, 3),
        )
        .clock(clock.clone())
        .build()
        .unwrap();
    let rt = rt();
    run_rounds(&rt, &p, &clock, 2, 12, ms(10));
    for _ in 0..4 {
        round(&rt, &p, &clock, 12, ms(40));
        let now = p.concurrency_limit().unwrap();
        assert!(now.limit >= 3 && now.limit <= 12, "{now:?}");
    }
}

/// Many threads and many tasks at once: never more attempts in flight than
/// the limit, a fixed one or a growing one.
#[test]
fn adaptive_never_admits_more_in_flight_than_the_limit() {
    const THREADS: usize = 8;
    const CALLS: usize = 300;
    for listen in [false, true] {
        // Sync, a fixed limit of 3.
        let (log, listener) = recorder();
        let mut b = Pipeline::builder("adaptive-threads").adaptive_limit(fixed(3));
        if listen {
            b = b.on_event(listener);
        }
        let p = b.build().unwrap();
        let running = AtomicU32::new(0);
        let peak = AtomicU32::new(0);
        let admitted = AtomicU32::new(0);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    for _ in 0..CALLS {
                        let r = p.call(|_| {
                            let now = running.fetch_add(1, SEQ) + 1;
                            peak.fetch_max(now, SEQ);
                            for _ in 0..20 {
                                std::thread::yield_now();
                            }
                            running.fetch_sub(1, SEQ);
                            Ok::<_, Boom>(())
                        });
                        match r {
                            Ok(()) => {
                                admitted.fetch_add(1, SEQ);
                            }
                            Err(e) => assert_eq!(
                                e.rejection().map(|r| r.reason),
                                Some(RejectionReason::ConcurrencyLimited)
                            ),
                        }
                    }
                });
            }
        });
        assert!(peak.load(SEQ) <= 3, "{} in flight", peak.load(SEQ));
        assert!(admitted.load(SEQ) > 0);
        assert_eq!(p.concurrency_limit().unwrap().in_flight, 0);
        if listen {
            assert_eq!(
                count(&log, |e| matches!(
                    e,
                    EventKind::Rejected {
                        reason: RejectionReason::ConcurrencyLimited,
                        ..
                    }
                )),
                THREADS * CALLS - admitted.load(SEQ) as usize
            );
        }

        // Async, tasks on two worker threads, a fixed limit of 4.
        let p = Pipeline::builder("adaptive-tasks")
            .adaptive_limit(fixed(4))
            .build()
            .unwrap();
        let running = Arc::new(AtomicU32::new(0));
        let peak = Arc::new(AtomicU32::new(0));
        multi_thread().block_on(async {
            let tasks: Vec<_> = (0..64)
                .map(|_| {
                    let (p, running, peak) = (p.clone(), running.clone(), peak.clone());
                    tokio::spawn(async move {
                        for _ in 0..40 {
                            let (running, peak) = (running.clone(), peak.clone());
                            let _ = p
                                .run(move |_| {
                                    let (running, peak) = (running.clone(), peak.clone());
                                    async move {
                                        let now = running.fetch_add(1, SEQ) + 1;
                                        peak.fetch_max(now, SEQ);
                                        for _ in 0..5 {
                                            tokio::task::yield_now().await;
                                        }
                                        running.fetch_sub(1, SEQ);
                                        Ok::<_, Boom>(())
                                    }
                                })
                                .await;
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        });
        assert!(peak.load(SEQ) <= 4, "{} in flight", peak.load(SEQ));
        assert_eq!(p.concurrency_limit().unwrap().in_flight, 0);
    }

    // A limit that only grows (successes only, on the system clock): an
    // attempt never runs with more in flight than the limit admits now.
    let p = Pipeline::builder("adaptive-growing")
        .adaptive_limit(
            AdaptiveLimit::aimd()
                .limits(1, 1, 6)
                .update_interval(Duration::from_micros(20)),
        )
        .build()
        .unwrap();
    let running = AtomicU32::new(0);
    let over = AtomicU32::new(0);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                for _ in 0..CALLS {
                    let _ = p.call(|_| {
                        let now = running.fetch_add(1, SEQ) + 1;
                        if now > p.concurrency_limit().unwrap().admitted {
                            over.fetch_add(1, SEQ);
                        }
                        std::thread::yield_now();
                        running.fetch_sub(1, SEQ);
                        Ok::<_, Boom>(())
                    });
                }
            });
        }
    });
    assert_eq!(over.load(SEQ), 0);
    let now = p.concurrency_limit().unwrap();
    assert!(now.limit >= 1 && now.limit <= 6, "{now:?}");
    assert_eq!(now.in_flight, 0);
}

/// Bad settings fail `build()` with a `ConfigError` naming
/// `adaptive_limit.<field>`, never a panic.
#[test]
fn adaptive_bad_settings_fail_at_build_naming_the_field() {
    use AdaptiveLimit as A;
    let nan = f64::NAN;
    let cases: Vec<(A, &str)> = vec![
        (A::aimd().limits(0, 1, 10), "min_limit"),
        (A::vegas().min_limit(0), "min_limit"),
        (A::aimd().limits(5, 5, 4), "max_limit"),
        (A::gradient2().limits(5, 50, 40), "initial_limit"),
        (A::gradient2().limits(5, 4, 40), "initial_limit"),
        (A::aimd().initial_limit(300), "initial_limit"),
        (A::aimd().update_interval(Duration::ZERO), "update_interval"),
        (A::aimd().backoff_ratio(0.4), "backoff_ratio"),
        (A::aimd().backoff_ratio(1.0), "backoff_ratio"),
        (A::aimd().backoff_ratio(nan), "backoff_ratio"),
        (A::aimd().rtt_timeout(Duration::ZERO), "rtt_timeout"),
        (A::vegas().smoothing(0.0), "smoothing"),
        (A::gradient2().smoothing(1.5), "smoothing"),
        (A::gradient2().smoothing(nan), "smoothing"),
        (A::gradient2().buffer(-0.1), "buffer"),
        (A::gradient2().buffer(nan), "buffer"),
        (A::gradient2().buffer(f64::INFINITY), "buffer"),
        (
            A::vegas().min_rtt(Duration::ZERO, 10, 3),
            "min_rtt_interval",
        ),
        (A::vegas().min_rtt(secs(1), 0, 3), "min_rtt_samples"),
        (
            A::gradient2().min_rtt(secs(1), 10, 0),
            "min_rtt_concurrency",
        ),
        (A::vegas().min_rtt_jitter(-0.1), "min_rtt_jitter"),
        (A::vegas().min_rtt_jitter(1.5), "min_rtt_jitter"),
        (A::vegas().min_rtt_jitter(nan), "min_rtt_jitter"),
        (A::aimd().queue(3, Duration::ZERO), "max_wait"),
        (A::aimd().partition("a", 0.5), "partitions"),
        (
            A::aimd().partition("a", 0.0).partition("b", 1.0),
            "partitions",
        ),
        (A::aimd().partition("", 1.0), "partitions"),
        (A::aimd().partition("a", nan), "partitions"),
        (
            A::aimd().partition("a", 0.5).partition("a", 0.5),
            "partitions",
        ),
        (A::vegas().backoff_ratio(0.9), "backoff_ratio"),
        (A::gradient2().rtt_timeout(secs(1)), "rtt_timeout"),
        (A::aimd().smoothing(0.5), "smoothing"),
        (A::aimd().queue_size(4), "queue_size"),
        (A::vegas().queue_size(4), "queue_size"),
        (A::aimd().buffer(0.1), "buffer"),
        (A::aimd().min_rtt(secs(1), 10, 3), "min_rtt_interval"),
        (A::aimd().min_rtt_jitter(0.1), "min_rtt_jitter"),
    ];
    for (limit, field) in cases {
        let what = format!("{limit:?}");
        refused(&what, "adaptive_limit", field, || {
            Pipeline::builder("adaptive-bad")
                .adaptive_limit(limit)
                .build()
        });
    }
    refused("before the retry", "pipeline", "adaptive_limit", || {
        Pipeline::builder("adaptive-order")
            .adaptive_limit(AdaptiveLimit::aimd())
            .retry(Retry::constant(ms(1)))
            .build()
    });
    // The edges are accepted.
    for ok in [
        A::aimd().limits(1, 1, 1).backoff_ratio(0.5),
        A::vegas().smoothing(1.0).min_rtt_jitter(0.0),
        A::gradient2().buffer(0.0).min_rtt_jitter(1.0),
        A::aimd().queue(0, Duration::ZERO),
    ] {
        Pipeline::builder("adaptive-ok")
            .adaptive_limit(ok)
            .build()
            .unwrap();
    }
}

// ================================================================= coalesce

/// Waits a bounded number of turns until `p` has `n` coalesced callers
/// waiting; a broken pipeline makes the counts wrong, never a hang.
fn until_waiting<K: seawall::pipeline::Kind>(p: &Pipeline<K>, n: usize) {
    for _ in 0..5_000_000u32 {
        if p.coalesced_waiters() >= n {
            return;
        }
        std::thread::yield_now();
    }
}

async fn until_waiting_async<K: seawall::pipeline::Kind>(p: &Pipeline<K>, n: usize) {
    for _ in 0..5_000_000u32 {
        if p.coalesced_waiters() >= n {
            return;
        }
        tokio::task::yield_now().await;
    }
}

/// [`until_waiting`] for several leaders at once: returns once `n`
/// callers wait or another leader saw them (`joined`).
fn until_joined<K: seawall::pipeline::Kind>(p: &Pipeline<K>, n: usize, joined: &AtomicBool) {
    for _ in 0..5_000_000u32 {
        if joined.load(SEQ) {
            return;
        }
        if p.coalesced_waiters() >= n {
            joined.store(true, SEQ);
            return;
        }
        std::thread::yield_now();
    }
}

async fn until_joined_async<K: seawall::pipeline::Kind>(
    p: &Pipeline<K>,
    n: usize,
    joined: &AtomicBool,
) {
    for _ in 0..5_000_000u32 {
        if joined.load(SEQ) {
            return;
        }
        if p.coalesced_waiters() >= n {
            joined.store(true, SEQ);
            return;
        }
        tokio::task::yield_now().await;
    }
}

fn coalescing(mode: Mode, coalesce: Coalesce) -> (Pipeline, VirtualClock, Log) {
    let (b, clock, log) = mode.builder("coalesce");
    (b.coalesce(coalesce).build().unwrap(), clock, log)
}

/// Concurrent calls with one key run the operation once and all get its
/// result (followers a clone); with another key they do not meet.
#[test]
fn coalesce_concurrent_calls_with_one_key_share_one_execution() {
    const CALLERS: usize = 12;
    for mode in modes() {
        for cache in [false, true] {
            let settings = if cache {
                Coalesce::new().ttl(secs(30))
            } else {
                Coalesce::new()
            };
            let (p, _, log) = coalescing(mode, settings);
            let runs = Arc::new(AtomicU32::new(0));
            // Two keys, each with CALLERS callers: each leader holds its
            // execution open until every follower of both keys has joined
            // (seen once by either leader).
            let followers = 2 * (CALLERS - 1);
            let joined = Arc::new(AtomicBool::new(false));
            let results: Vec<(u64, Result<String, Error<Boom>>)> = if mode.sync {
                on_threads(2 * CALLERS, |i| {
                    let key = (i % 2) as u64;
                    let r = p.coalesce_key(key).call(|_| {
                        runs.fetch_add(1, SEQ);
                        until_joined(&p, followers, &joined);
                        Ok::<_, Boom>(format!("value-{key}"))
                    });
                    (key, r)
                })
            } else {
                multi_thread().block_on(async {
                    let tasks: Vec<_> = (0..2 * CALLERS)
                        .map(|i| {
                            let (p, runs, joined) = (p.clone(), runs.clone(), joined.clone());
                            let key = (i % 2) as u64;
                            tokio::spawn(async move {
                                let inner = p.clone();
                                let r = p
                                    .coalesce_key(key)
                                    .run(move |_| {
                                        let (p, runs, joined) =
                                            (inner.clone(), runs.clone(), joined.clone());
                                        async move {
                                            runs.fetch_add(1, SEQ);
                                            until_joined_async(&p, followers, &joined).await;
                                            Ok::<_, Boom>(format!("value-{key}"))
                                        }
                                    })
                                    .await;
                                (key, r)
                            })
                        })
                        .collect();
                    let mut out = Vec::new();
                    for t in tasks {
                        out.push(t.await.unwrap());
                    }
                    out
                })
            };
            assert_eq!(runs.load(SEQ), 2, "{mode:?} cache {cache}: one run per key");
            for (key, r) in &results {
                assert_eq!(r.as_deref().ok(), Some(format!("value-{key}").as_str()));
            }
            assert_eq!(p.coalesced_waiters(), 0);
            if mode.listen {
                assert_eq!(count(&log, |e| *e == EventKind::Coalesced), followers);
                let misses = count(&log, |e| *e == EventKind::CacheMiss);
                assert_eq!(misses, if cache { 2 * CALLERS } else { 0 }, "{mode:?}");
            } else {
                assert!(log.lock().unwrap().is_empty());
            }
            // Plain calls never share, keyed calls of another result type
            // do not meet the cached `String`.
            let plain = mode.call(&p, |_| Ok::<String, Boom>("plain".into()));
            assert_eq!(plain.ok().as_deref(), Some("plain"));
            let other = p.coalesce_key(0u64).call(|_| Ok::<u32, Boom>(3));
            assert_eq!(other.ok(), Some(3));
        }
    }
}

/// The leader's error is every follower's (a clone, same variant), and is
/// never cached; so is its timeout.
#[test]
fn coalesce_a_leader_error_or_timeout_is_shared_and_not_cached() {
    const CALLERS: usize = 6;
    for mode in modes_of(true) {
        let (b, _, log) = mode.builder("coalesce-error");
        let p = b
            .coalesce(Coalesce::new().ttl(secs(60)))
            .retry(Retry::constant(ms(10)).max_attempts(2))
            .timeout(Timeout::strict(ms(500)))
            .build()
            .unwrap();
        let runs = AtomicU32::new(0);
        let results = on_threads(CALLERS, |_| {
            p.coalesce_key("k").call(|_| {
                let n = runs.fetch_add(1, SEQ) + 1;
                until_waiting(&p, CALLERS - 1);
                Err::<u32, _>(Boom(n))
            })
        });
        assert_eq!(runs.load(SEQ), 2, "one execution, two attempts");
        for r in &results {
            match r {
                Err(Error::RetryExhausted { attempts, last }) => {
                    assert_eq!((*attempts, last), (2, &Boom(2)))
                }
                other => panic!("{other:?}"),
            }
        }
        // Not cached: the next call runs.
        assert_eq!(
            p.coalesce_key("k").call(|_| Ok::<u32, Boom>(7)).ok(),
            Some(7)
        );
        if mode.listen {
            assert_eq!(count(&log, |e| *e == EventKind::Coalesced), CALLERS - 1);
        }

        // A timeout of the leader's call is every follower's.
        let (b, clock, _) = mode.builder("coalesce-timeout");
        let p = b
            .coalesce(Coalesce::new().ttl(secs(60)))
            .timeout(Timeout::strict(ms(500)))
            .build()
            .unwrap();
        let runs = AtomicU32::new(0);
        let results = on_threads(CALLERS, |_| {
            p.coalesce_key("slow").call(|_| {
                runs.fetch_add(1, SEQ);
                until_waiting(&p, CALLERS - 1);
                clock.advance(ms(600));
                Ok::<u32, Boom>(1)
            })
        });
        assert_eq!(runs.load(SEQ), 1);
        for r in &results {
            match r {
                Err(Error::Timeout(t)) => assert_eq!(t.after, ms(500)),
                other => panic!("{other:?}"),
            }
        }
        let r = p.coalesce_key("slow").call(|_| Ok::<u32, Boom>(2));
        assert_eq!(r.ok(), Some(2), "a timeout is not cached");
    }
}

/// A leader that panics, or whose future is dropped (cancelled), does not
/// strand its followers: one of them runs its own operation and the others
/// get its result. (Go's singleflight re-panics in every waiting caller
/// instead; seawall documents the takeover.)
#[test]
fn coalesce_a_panicking_or_cancelled_leader_is_replaced_by_a_follower() {
    const FOLLOWERS: usize = 4;
    for mode in modes_of(true) {
        // Sync, a panic.
        let (p, _, log) = coalescing(mode, Coalesce::new());
        let runs = AtomicU32::new(0);
        std::thread::scope(|s| {
            let leader = s.spawn(|| {
                catch_unwind(AssertUnwindSafe(|| {
                    p.coalesce_key(9u64).call(|_| -> Result<u32, Boom> {
                        runs.fetch_add(1, SEQ);
                        until_waiting(&p, FOLLOWERS);
                        panic!("the leader's operation panics")
                    })
                }))
            });
            for _ in 0..5_000_000u32 {
                if runs.load(SEQ) == 1 {
                    break;
                }
                std::thread::yield_now();
            }
            let followers: Vec<_> = (0..FOLLOWERS)
                .map(|_| {
                    s.spawn(|| {
                        p.coalesce_key(9u64)
                            .call(|_| Ok::<_, Boom>(runs.fetch_add(1, SEQ) + 1))
                    })
                })
                .collect();
            assert!(leader.join().unwrap().is_err(), "the leader panicked");
            for f in followers {
                assert_eq!(f.join().unwrap().ok(), Some(2));
            }
        });
        assert_eq!(runs.load(SEQ), 2);
        assert_eq!(p.coalesced_waiters(), 0);
        if mode.listen {
            assert_eq!(count(&log, |e| *e == EventKind::CoalesceTakeover), 1);
            assert_eq!(count(&log, |e| *e == EventKind::Coalesced), FOLLOWERS - 1);
        }

        // Async: a leader task that panics, and one that is aborted.
        for abort in [false, true] {
            let (p, _, log) = coalescing(mode, Coalesce::new());
            let runs = Arc::new(AtomicU32::new(0));
            let results = rt().block_on(async {
                let leader = {
                    let (p, runs) = (p.clone(), runs.clone());
                    tokio::spawn(async move {
                        let inner = p.clone();
                        p.coalesce_key(3u64)
                            .run(move |_| {
                                let (p, runs) = (inner.clone(), runs.clone());
                                async move {
                                    runs.fetch_add(1, SEQ);
                                    until_waiting_async(&p, FOLLOWERS).await;
                                    if abort {
                                        std::future::pending::<()>().await;
                                    }
                                    panic!("the leader's operation panics");
                                    #[allow(unreachable_code)]
                                    Ok::<u32, Boom>(0)
                                }
                            })
                            .await
                    })
                };
                for _ in 0..1_000_000u32 {
                    if runs.load(SEQ) == 1 {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                let followers: Vec<_> = (0..FOLLOWERS)
                    .map(|_| {
                        let (p, runs) = (p.clone(), runs.clone());
                        tokio::spawn(async move {
                            p.coalesce_key(3u64)
                                .run(|_| {
                                    let n = runs.fetch_add(1, SEQ) + 1;
                                    async move { Ok::<_, Boom>(n) }
                                })
                                .await
                        })
                    })
                    .collect();
                until_waiting_async(&p, FOLLOWERS).await;
                if abort {
                    leader.abort();
                    assert!(leader.await.unwrap_err().is_cancelled());
                } else {
                    assert!(leader.await.unwrap_err().is_panic());
                }
                let mut out = Vec::new();
                for f in followers {
                    out.push(f.await.unwrap());
                }
                out
            });
            assert_eq!(runs.load(SEQ), 2, "abort {abort}");
            assert!(
                results.iter().all(|r| r.as_ref().ok() == Some(&2)),
                "abort {abort}: {results:?}"
            );
            assert_eq!(p.coalesced_waiters(), 0);
            if mode.listen {
                assert_eq!(count(&log, |e| *e == EventKind::CoalesceTakeover), 1);
                assert_eq!(count(&log, |e| *e == EventKind::Coalesced), FOLLOWERS - 1);
            }
        }
    }
}

/// The cache keeps a success from the leader's end until `ttl` later on
/// the pipeline's clock (stale at the ttl), keeps no error, and holds at
/// most `max_entries` keys, evicting the least recently used; without a
/// ttl nothing is kept after the end (no `Forget` needed).
#[test]
fn coalesce_the_cache_keeps_successes_for_the_ttl_within_max_entries() {
    for mode in modes() {
        let (p, clock, log) = coalescing(mode, Coalesce::new().ttl(secs(10)));
        let runs = AtomicU32::new(0);
        let get = |key: &str, took: Duration| {
            let op = |_: Context| {
                clock.advance(took);
                Ok::<_, Boom>(runs.fetch_add(1, SEQ) + 1)
            };
            let c = p.coalesce_key(key.to_owned());
            if mode.sync {
                c.call(op)
            } else {
                rt().block_on(c.run(|ctx| std::future::ready(op(ctx))))
            }
        };
        // The leader ends 5 s after it started: fresh until 15 s.
        assert_eq!(get("price", secs(5)).ok(), Some(1));
        clock.advance(ms(9_999));
        assert_eq!(
            get("price", Duration::ZERO).ok(),
            Some(1),
            "{mode:?}: fresh"
        );
        clock.advance(ms(1));
        assert_eq!(
            get("price", Duration::ZERO).ok(),
            Some(2),
            "{mode:?}: stale at the ttl"
        );
        assert_eq!(get("price", Duration::ZERO).ok(), Some(2));
        if mode.listen {
            assert_eq!(count(&log, |e| *e == EventKind::CacheHit), 2, "{mode:?}");
            assert_eq!(count(&log, |e| *e == EventKind::CacheMiss), 2, "{mode:?}");
        }

        // An error is not kept.
        let errs = AtomicU32::new(0);
        let fail = |_: Context| Err::<u32, _>(Boom(errs.fetch_add(1, SEQ) + 1));
        let c = p.coalesce_key("err");
        for n in 1..=2 {
            let r = if mode.sync {
                c.call(fail)
            } else {
                rt().block_on(c.run(|ctx| std::future::ready(fail(ctx))))
            };
            assert_eq!(r.err().and_then(Error::into_operation_error), Some(Boom(n)));
        }

        // At most two keys, the least recently used evicted.
        let (p, clock, _) = coalescing(mode, Coalesce::new().ttl(secs(60)).max_entries(2));
        let runs = AtomicU32::new(0);
        let get = |k: u64| {
            let op = |_: Context| {
                runs.fetch_add(1, SEQ);
                Ok::<_, Boom>(k)
            };
            let c = p.coalesce_key(k);
            if mode.sync {
                c.call(op)
            } else {
                rt().block_on(c.run(|ctx| std::future::ready(op(ctx))))
            }
            .unwrap()
        };
        get(1);
        get(2);
        get(1); // 1 is now the most recently used
        assert_eq!(runs.load(SEQ), 2);
        get(3); // evicts 2
        assert_eq!(runs.load(SEQ), 3);
        get(1);
        get(3);
        assert_eq!(runs.load(SEQ), 3, "{mode:?}");
        get(2); // runs again, evicts 1
        assert_eq!(runs.load(SEQ), 4);
        get(1);
        assert_eq!(runs.load(SEQ), 5, "{mode:?}");
        clock.advance(secs(60));
        get(1);
        assert_eq!(runs.load(SEQ), 6, "{mode:?}: stale after 60 s");

        // Without a ttl, a call after the end runs again.
        let (p, _, _) = coalescing(mode, Coalesce::new());
        let runs = AtomicU32::new(0);
        for n in 1..=3 {
            let r = mode.call(&p, |_| Ok::<u32, Boom>(0));
            assert_eq!(r.ok(), Some(0));
            let r = p
                .coalesce_key(1u64)
                .call(|_| Ok::<u32, Boom>(runs.fetch_add(1, SEQ) + 1));
            assert_eq!(r.ok(), Some(n));
        }
    }
}

/// Bad settings fail `build()` naming `coalesce.<field>`; coalescing
/// declared after another policy names `pipeline.coalesce`.
#[test]
fn coalesce_bad_settings_fail_at_build_naming_the_field() {
    refused("zero ttl", "coalesce", "ttl", || {
        Pipeline::builder("c")
            .coalesce(Coalesce::new().ttl(Duration::ZERO))
            .build()
    });
    refused("no entries", "coalesce", "max_entries", || {
        Pipeline::builder("c")
            .coalesce(Coalesce::new().ttl(secs(1)).max_entries(0))
            .build()
    });
    refused("entries without ttl", "coalesce", "max_entries", || {
        Pipeline::builder("c")
            .coalesce(Coalesce::new().max_entries(10))
            .build()
    });
    refused("after retry", "pipeline", "coalesce", || {
        Pipeline::builder("c")
            .retry(Retry::constant(ms(1)))
            .coalesce(Coalesce::new())
            .build()
    });
    refused("after a timeout", "pipeline", "coalesce", || {
        Pipeline::builder("c")
            .timeout(ms(10))
            .coalesce(Coalesce::new())
            .build()
    });
}

// =================================================================== shadow

/// What a pipeline signalled: each refusal (`Rejected`) or would-be refusal
/// (`ShadowRejected`), in order.
fn refusals(log: &Log, shadow: bool) -> Vec<(RejectionReason, Option<Duration>)> {
    log.lock()
        .unwrap()
        .iter()
        .filter_map(|e| match (e, shadow) {
            (
                EventKind::ShadowRejected {
                    reason,
                    retry_after,
                },
                true,
            )
            | (
                EventKind::Rejected {
                    reason,
                    retry_after,
                },
                false,
            ) => Some((*reason, *retry_after)),
            _ => None,
        })
        .collect()
}

/// A policy in shadow mode never refuses: every call runs, and it reports
/// exactly the refusals (reason and `retry_after`) the same policy
/// enforcing makes on the same calls; without a listener it decides the
/// same.
#[test]
fn shadow_never_refuses_and_reports_what_it_would_have_refused() {
    type Make = fn(bool) -> PipelineBuilder;
    let scenarios: Vec<(&str, Make)> = vec![
        ("rate_limiter", |shadow| {
            Pipeline::builder("shadow-rate")
                .rate_limiter(RateLimiter::fixed_window(3, secs(60)).shadow(shadow))
        }),
        ("breaker", |shadow| {
            Pipeline::builder("shadow-breaker").circuit_breaker(
                CircuitBreaker::consecutive_failures(2)
                    .cooldown(secs(5))
                    .shadow(shadow),
            )
        }),
    ];
    for (name, make) in scenarios {
        for mode in modes() {
            let run = |shadow: bool| {
                let clock = VirtualClock::starting_at(mode.start);
                let (log, listener) = recorder();
                let mut b = make(shadow).store(MemoryStore::new()).clock(clock.clone());
                if mode.listen {
                    b = b.on_event(listener);
                }
                let p = b.build().unwrap();
                let mut outcomes = Vec::new();
                let mut ran = 0;
                for i in 0..10u32 {
                    let r = mode.call(&p, |_| {
                        ran += 1;
                        if i < 3 {
                            Err(Boom(i))
                        } else {
                            Ok(i)
                        }
                    });
                    outcomes.push(refusal(&r));
                    clock.advance(ms(300));
                }
                (
                    outcomes,
                    ran,
                    refusals(&log, shadow),
                    clock.now() - mode.start,
                )
            };
            let (enforced, ran_enforcing, told_enforcing, took_enforcing) = run(false);
            let (shadowed, ran_shadow, told_shadow, took_shadow) = run(true);
            assert!(
                shadowed.iter().all(Option::is_none),
                "{name} {mode:?}: {shadowed:?}"
            );
            assert_eq!(ran_shadow, 10, "{name} {mode:?}");
            let would: Vec<_> = enforced.iter().flatten().copied().collect();
            assert!(!would.is_empty(), "{name}: the scenario refuses some calls");
            assert!(ran_enforcing < 10);
            if mode.listen {
                assert_eq!(told_enforcing, would, "{name} {mode:?}");
                assert_eq!(told_shadow, would, "{name} {mode:?}");
            } else {
                assert!(told_shadow.is_empty());
            }
            assert_eq!(took_shadow, ms(3000), "{name} {mode:?}");
            assert_eq!(took_enforcing, took_shadow);
        }
    }

    // A shadow limiter with `max_wait` never makes a call wait: it reports
    // the wait it would have imposed, and takes no permit for the call.
    for mode in modes() {
        let (b, clock, log) = mode.builder("shadow-rate-wait");
        let p = b
            .rate_limiter(RateLimiter::gcra(2, secs(1)).max_wait(secs(1)).shadow(true))
            .build()
            .unwrap();
        let results = mode.many(&p, 5, |_| Ok::<u32, Boom>(1));
        assert!(results.iter().all(|r| r.is_ok()), "{mode:?}");
        assert_eq!(mode.elapsed(&clock), Duration::ZERO, "{mode:?}: no wait");
        if mode.listen {
            assert_eq!(
                refusals(&log, true),
                vec![(RejectionReason::RateLimited, Some(ms(500))); 3],
                "{mode:?}"
            );
            assert_eq!(count(&log, |e| matches!(e, EventKind::Deferred { .. })), 0);
        }
    }
}

/// A bulkhead and an adaptive limit in shadow mode: a call over the limit
/// runs without a slot (nested sync calls; concurrent async ones), signalled
/// with the reason the enforcing policy would have refused it with.
#[test]
fn shadow_bulkhead_and_adaptive_limit_run_over_the_limit_without_a_slot() {
    for mode in modes() {
        for adaptive in [false, true] {
            let (b, _, log) = mode.builder("shadow-slots");
            let (b, reason) = if adaptive {
                (
                    b.adaptive_limit(fixed(1).shadow(true)),
                    RejectionReason::ConcurrencyLimited,
                )
            } else {
                (
                    b.bulkhead(Bulkhead::new(1).shadow(true)),
                    RejectionReason::BulkheadFull,
                )
            };
            let p = b.build().unwrap();
            let held = |p: &Pipeline| -> u32 {
                match p.concurrency_limit() {
                    Some(l) => l.in_flight,
                    None => p.in_flight().unwrap(),
                }
            };
            let depth = if mode.sync {
                let inner = p.clone();
                let r = p.call(|_| {
                    inner.call(|_| {
                        assert!(held(&inner) <= 1);
                        inner.call(|_| Ok::<u32, Boom>(held(&inner)))
                    })
                });
                r.unwrap()
            } else {
                let results = rt().block_on(join_all(
                    (0..3)
                        .map(|_| {
                            let inner = p.clone();
                            p.run(move |_| {
                                let inner = inner.clone();
                                async move {
                                    tokio::task::yield_now().await;
                                    Ok::<u32, Boom>(held(&inner))
                                }
                            })
                        })
                        .collect(),
                ));
                assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
                results.into_iter().map(Result::unwrap).max().unwrap()
            };
            assert!(
                depth <= 1,
                "{mode:?} adaptive {adaptive}: {depth} slots held"
            );
            assert_eq!(held(&p), 0);
            if mode.listen {
                assert_eq!(
                    refusals(&log, true),
                    vec![(reason, None); 2],
                    "{mode:?} adaptive {adaptive}"
                );
            }
        }
    }
}

// ================================================================= weighted

/// A weighted call takes its weight in rate-limit permits at each
/// admission (each attempt after the retry, once per call before it), all
/// or none; the other policies count the attempt once; a weight the
/// limiter can never grant is refused at once without `retry_after`, or,
/// in shadow mode, signalled and run; a weight of 0 is a configuration
/// error.
#[test]
fn weighted_calls_take_their_weight_at_each_admission() {
    for mode in modes() {
        let weighted = |p: &Pipeline, w: u32, fail: bool| -> Result<u32, Error<Boom>> {
            let c = p.weighted(w).unwrap();
            let op = |ctx: Context| {
                if fail {
                    Err(Boom(1))
                } else {
                    Ok(ctx.attempt())
                }
            };
            if mode.sync {
                c.call(op)
            } else {
                rt().block_on(c.run(|ctx| std::future::ready(op(ctx))))
            }
        };

        // After the retry: three attempts of three permits.
        let (b, clock, _) = mode.builder("weighted-attempts");
        let p = b
            .retry(Retry::constant(ms(1)).max_attempts(3))
            .rate_limiter(RateLimiter::fixed_window(10, secs(1)))
            .build()
            .unwrap();
        assert!(matches!(
            weighted(&p, 3, true),
            Err(Error::RetryExhausted { attempts: 3, .. })
        ));
        assert_eq!(mode.elapsed(&clock), ms(2));
        let r = weighted(&p, 2, false);
        let (why, retry_after) = refusal(&r).expect("9 of 10 permits are taken");
        assert_eq!(why, RejectionReason::RateLimited);
        assert_eq!(retry_after, Some(ms(998)), "{mode:?}");
        assert_eq!(weighted(&p, 1, false).ok(), Some(1), "the tenth permit");

        // Before the retry: one admission per call.
        let (b, _, _) = mode.builder("weighted-call");
        let p = b
            .rate_limiter(RateLimiter::fixed_window(10, secs(1)))
            .retry(Retry::constant(ms(1)).max_attempts(3))
            .build()
            .unwrap();
        assert!(weighted(&p, 3, true).is_err());
        assert_eq!(weighted(&p, 7, false).ok(), Some(1), "{mode:?}");
        assert!(refusal(&weighted(&p, 1, false)).is_some());

        // GCRA: all or none, the exact wait.
        let (b, clock, _) = mode.builder("weighted-gcra");
        let p = b
            .rate_limiter(RateLimiter::gcra(10, secs(1)))
            .build()
            .unwrap();
        assert!(weighted(&p, 4, false).is_ok());
        assert!(weighted(&p, 4, false).is_ok());
        let r = weighted(&p, 4, false);
        assert_eq!(
            refusal(&r),
            Some((RejectionReason::RateLimited, Some(ms(200)))),
            "{mode:?}"
        );
        assert!(
            weighted(&p, 2, false).is_ok(),
            "nothing was taken by the refusal"
        );
        clock.advance(ms(400));
        assert!(weighted(&p, 4, false).is_ok());

        // The breaker and the adaptive limit count the attempt once.
        let (b, _, _) = mode.builder("weighted-others");
        let p = b
            .adaptive_limit(fixed(1))
            .circuit_breaker(CircuitBreaker::consecutive_failures(3))
            .rate_limiter(RateLimiter::gcra(1000, secs(1)))
            .build()
            .unwrap();
        let inner = p.clone();
        let c = p.weighted(5).unwrap();
        let op = move |_: Context| Ok::<u32, Boom>(inner.concurrency_limit().unwrap().in_flight);
        let r = if mode.sync {
            c.call(op)
        } else {
            rt().block_on(c.run(|ctx| std::future::ready(op(ctx))))
        };
        assert_eq!(r.ok(), Some(1), "{mode:?}");
        for _ in 0..2 {
            assert!(weighted(&p, 5, true).is_err());
        }
        assert_eq!(p.circuit_metrics().unwrap().failures, 2, "{mode:?}");
        assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);

        // A weight the limiter can never grant.
        let (b, clock, _) = mode.builder("weighted-never");
        let p = b
            .rate_limiter(RateLimiter::gcra(10, secs(1)).burst(3).max_wait(secs(60)))
            .build()
            .unwrap();
        let r = weighted(&p, 4, false);
        assert_eq!(refusal(&r), Some((RejectionReason::RateLimited, None)));
        assert_eq!(mode.elapsed(&clock), Duration::ZERO, "no wait");
        assert!(weighted(&p, 3, false).is_ok());

        // In shadow mode: run and signalled.
        let (b, _, log) = mode.builder("weighted-shadow");
        let p = b
            .rate_limiter(RateLimiter::fixed_window(10, secs(1)).shadow(true))
            .build()
            .unwrap();
        assert!(weighted(&p, 11, false).is_ok());
        assert!(weighted(&p, 6, false).is_ok());
        assert!(weighted(&p, 6, false).is_ok(), "over the limit, run");
        assert!(
            weighted(&p, 4, false).is_ok(),
            "the shadowed call took nothing"
        );
        if mode.listen {
            assert_eq!(
                refusals(&log, true),
                vec![
                    (RejectionReason::RateLimited, None),
                    (RejectionReason::RateLimited, Some(secs(1))),
                ],
                "{mode:?}"
            );
        }

        // Weight 0.
        let e = p.weighted(0).unwrap_err();
        assert_eq!((e.policy, e.field), ("rate_limit", "weight"));
        assert_eq!(e.to_string(), "rate_limit.weight must be >= 1, got 0");
        assert_eq!(p.partition("k").weighted(0).unwrap_err().field, "weight");
    }
}

// =================================================================== custom

/// A policy written in code: counts its passes; runs what it wraps up to
/// `runs` times while it fails; or answers `Err(Boom(99))` without running
/// it.
struct Custom {
    name: &'static str,
    position: Position,
    runs: u32,
    short: bool,
    passes: AtomicU32,
}

impl Custom {
    fn new(name: &'static str, position: Position, runs: u32) -> Arc<Self> {
        Arc::new(Custom {
            name,
            position,
            runs,
            short: false,
            passes: AtomicU32::new(0),
        })
    }

    fn short(name: &'static str, position: Position) -> Arc<Self> {
        Arc::new(Custom {
            name,
            position,
            runs: 1,
            short: true,
            passes: AtomicU32::new(0),
        })
    }

    fn passes(&self) -> u32 {
        self.passes.load(SEQ)
    }
}

impl Policy<u32, Boom> for Custom {
    fn name(&self) -> &str {
        self.name
    }

    fn position(&self) -> Position {
        self.position
    }

    fn call<'a>(&'a self, _ctx: Context, next: Next<'a, u32, Boom>) -> PolicyFuture<'a, u32, Boom> {
        self.passes.fetch_add(1, SEQ);
        Box::pin(async move {
            if self.short {
                return Err(Error::Operation(Boom(99)));
            }
            let mut result = next.run().await;
            for _ in 1..self.runs {
                if result.is_ok() {
                    break;
                }
                next.sleep(ms(100)).await;
                result = next.run().await;
            }
            result
        })
    }
}

/// A policy written in code composed with the retry in both orders:
/// around the call (declared before the retry) it wraps the whole retried
/// call once; around each attempt (declared after it) it wraps every
/// attempt, its result judged as the attempt's (an operation error it
/// returns is retried); chaos acts on each of its inner runs.
#[test]
fn custom_policy_composes_with_retry_in_both_orders() {
    for mode in modes() {
        // Around the call: one pass of three attempts; its own second run
        // retries the whole call again.
        let policy = Custom::new("around_call", Position::Call, 2);
        let (b, clock, _) = mode.builder("custom-call");
        let p = b
            .policy(policy.clone())
            .retry(Retry::constant(ms(10)).max_attempts(3))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let r = mode.call(&p, |_| {
            ops.fetch_add(1, SEQ);
            Err::<u32, _>(Boom(1))
        });
        assert!(
            matches!(r, Err(Error::RetryExhausted { attempts: 3, .. })),
            "{mode:?}: {r:?}"
        );
        assert_eq!((policy.passes(), ops.load(SEQ)), (1, 6), "{mode:?}");
        assert_eq!(mode.elapsed(&clock), ms(10 * 2 * 2 + 100), "{mode:?}");

        // Around each attempt: one pass per attempt.
        let policy = Custom::new("around_attempt", Position::Attempt, 1);
        let (b, _, _) = mode.builder("custom-attempt");
        let p = b
            .retry(Retry::constant(ms(10)).max_attempts(3))
            .policy(policy.clone())
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let r = mode.call(&p, |ctx| {
            ops.fetch_add(1, SEQ);
            if ctx.attempt() < 3 {
                Err(Boom(1))
            } else {
                Ok(ctx.attempt())
            }
        });
        assert_eq!(r.ok(), Some(3), "{mode:?}");
        assert_eq!((policy.passes(), ops.load(SEQ)), (3, 3), "{mode:?}");

        // An operation error it returns without running anything is
        // retried and recorded as the attempt's.
        let policy = Custom::short("answers", Position::Attempt);
        let (b, _, log) = mode.builder("custom-short");
        let p = b
            .retry(Retry::constant(ms(1)).max_attempts(3))
            .circuit_breaker(CircuitBreaker::consecutive_failures(5))
            .policy(policy.clone())
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let r = mode.call(&p, |_| Ok::<u32, Boom>(ops.fetch_add(1, SEQ)));
        match r {
            Err(Error::RetryExhausted { attempts, last }) => {
                assert_eq!((attempts, last), (3, Boom(99)))
            }
            other => panic!("{mode:?}: {other:?}"),
        }
        assert_eq!((policy.passes(), ops.load(SEQ)), (3, 0));
        assert_eq!(p.circuit_metrics().unwrap().failures, 3, "{mode:?}");
        if mode.listen {
            assert_eq!(
                count(&log, |e| matches!(e, EventKind::ShortCircuited { .. })),
                3
            );
        }

        // Chaos after it acts on each of its inner runs.
        let policy = Custom::new("twice", Position::Attempt, 2);
        let (b, _, log) = mode.builder("custom-chaos");
        let p = b
            .random(SequenceRandom::new([0.0]))
            .retry(Retry::constant(ms(1)).max_attempts(2))
            .policy(policy.clone())
            .chaos_fault(Chaos::fault(1.0, |_| INJECTED))
            .build()
            .unwrap();
        let r = mode.call(&p, |_| Ok::<u32, Boom>(1));
        assert!(
            matches!(&r, Err(Error::RetryExhausted { attempts: 2, last }) if *last == INJECTED),
            "{mode:?}: {r:?}"
        );
        assert_eq!(policy.passes(), 2);
        if mode.listen {
            assert_eq!(injected(&log).len(), 4, "{mode:?}: two runs per attempt");
        }
    }
}

/// A policy declared where its position cannot be fails `build()` with
/// `<name>.position`.
#[test]
fn custom_policy_misplaced_fails_at_build_naming_the_field() {
    refused("call after retry", "late_call", "position", || {
        Pipeline::builder("custom-bad")
            .retry(Retry::constant(ms(1)))
            .policy(Custom::new("late_call", Position::Call, 1))
            .build()
    });
    refused("attempt before retry", "early_attempt", "position", || {
        Pipeline::builder("custom-bad")
            .policy(Custom::new("early_attempt", Position::Attempt, 1))
            .retry(Retry::constant(ms(1)))
            .build()
    });
    refused("attempt after chaos", "after_chaos", "position", || {
        Pipeline::builder("custom-bad")
            .retry(Retry::constant(ms(1)))
            .chaos(Chaos::latency(0.5, ms(1)))
            .policy(Custom::new("after_chaos", Position::Attempt, 1))
            .build()
    });
}

// ============================================================ more chaos

/// An injected latency counts toward a timeout of the whole call: the
/// attempts' latencies and the retry waits add up to its deadline, which
/// ends an async call at exactly that instant; a behaviour's hook sees the
/// time left.
#[test]
fn chaos_latency_counts_toward_a_timeout_of_the_whole_call() {
    for mode in modes() {
        let (b, clock, log) = mode.builder("chaos-overall");
        let left = Arc::new(Mutex::new(Vec::new()));
        let l = left.clone();
        let p = b
            .random(SequenceRandom::new([0.0]))
            .timeout(ms(250))
            .retry(Retry::constant(ms(10)).max_attempts(10))
            .chaos(Chaos::behavior(1.0, move |ctx| {
                l.lock().unwrap().push((ctx.attempt(), ctx.remaining()));
            }))
            .chaos(Chaos::latency(1.0, ms(100)))
            .chaos_fault(Chaos::fault(1.0, |_| INJECTED))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let r = mode.call(&p, |_| Ok::<u32, Boom>(ops.fetch_add(1, SEQ)));
        assert!(r.is_err(), "{mode:?}: {r:?}");
        assert_eq!(ops.load(SEQ), 0);
        assert_eq!(
            *left.lock().unwrap(),
            vec![(1, Some(ms(250))), (2, Some(ms(140))), (3, Some(ms(30)))],
            "{mode:?}"
        );
        if mode.sync {
            // Cooperative: the third latency is slept whole.
            assert_eq!(mode.elapsed(&clock), ms(320), "{mode:?}");
        } else {
            match &r {
                Err(Error::Timeout(t)) => assert_eq!(t.after, ms(250)),
                other => panic!("{mode:?}: {other:?}"),
            }
            assert_eq!(mode.elapsed(&clock), ms(250), "{mode:?}");
        }
        if mode.listen {
            assert_eq!(
                count(&log, |e| matches!(
                    e,
                    EventKind::ChaosInjected {
                        kind: ChaosKind::Latency { .. },
                        ..
                    }
                )),
                3
            );
        }
    }
}

/// Chaos declared after hedging acts on each hedged attempt (async only;
/// a blocking call of a hedged pipeline is refused).
#[test]
fn chaos_acts_on_each_hedged_attempt() {
    for mode in modes_of(false) {
        let (b, clock, log) = mode.builder("chaos-hedged");
        let p = b
            .random(SequenceRandom::new([0.0]))
            .hedging(seawall::Hedging::latency(ms(50)).max_hedged_attempts(1))
            .timeout(ms(300))
            .chaos(Chaos::latency(1.0, ms(100)))
            .build()
            .unwrap();
        // When the operation is called, and the time its context says
        // is left (what a client's own timeout is fed from).
        let started = Arc::new(Mutex::new(Vec::new()));
        let s = started.clone();
        let c = clock.clone();
        let r = rt().block_on(p.run(move |ctx| {
            s.lock()
                .unwrap()
                .push((ctx.attempt(), c.now() - mode.start, ctx.remaining()));
            std::future::ready(Ok::<u32, Boom>(ctx.attempt()))
        }));
        assert_eq!(r.ok(), Some(1), "{mode:?}");
        assert_eq!(mode.elapsed(&clock), ms(100));
        // Unhedged, the operation is called once its latency was
        // slept (checked in `chaos_latency_is_exact_...`); a hedged
        // attempt must be the same.
        let started = started.lock().unwrap().clone();
        assert_eq!(
            started.first(),
            Some(&(1, ms(100), Some(ms(200)))),
            "{mode:?}: the operation was called before its injected latency: {started:?}"
        );
        if mode.listen {
            assert_eq!(
                injected(&log),
                vec![
                    (ChaosKind::Latency { delay: ms(100) }, 1),
                    (ChaosKind::Latency { delay: ms(100) }, 2)
                ]
            );
        }
        let r = p.call(|_| Ok::<u32, Boom>(1));
        assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
    }
}

/// A fault judged throttled with a retry-after hint is retried after the
/// hint, like a real 429.
#[test]
fn chaos_a_throttled_fault_is_retried_after_its_hint() {
    for mode in modes() {
        let (b, clock, _) = mode.builder("chaos-throttled");
        let p = b
            .random(SequenceRandom::new([0.0, 0.9]))
            .retry(Retry::constant(ms(10)).max_attempts(3))
            .classify(|e: &Boom| {
                if *e == INJECTED {
                    Verdict::throttled().with_retry_after(secs(2))
                } else {
                    Verdict::retry()
                }
            })
            .chaos_fault(Chaos::fault(0.5, |_| INJECTED))
            .build()
            .unwrap();
        let r = mode.call(&p, |ctx| Ok::<u32, Boom>(ctx.attempt()));
        assert_eq!(r.ok(), Some(2), "{mode:?}");
        assert_eq!(mode.elapsed(&clock), secs(2), "{mode:?}");
    }
}

// ========================================================= more adaptive

/// Vegas adds `3 log10(limit)` per window while no call queues at the
/// dependency (TCP Vegas's beta; Netflix's Vegas grows by its own
/// `6 log10` steps), up to `max_limit`; a lower latency becomes the
/// baseline at once without moving the limit.
#[test]
fn adaptive_vegas_steps_and_a_lower_latency_lowers_its_baseline() {
    for mode in modes_of(false) {
        let (b, clock, log) = mode.builder("vegas-steps");
        let p = b
            .random(SeededRandom::new(3))
            .adaptive_limit(
                AdaptiveLimit::vegas()
                    .limits(1, 4, 40)
                    .update_interval(ms(1))
                    .min_rtt(secs(600), 4, 2),
            )
            .build()
            .unwrap();
        let rt = rt();
        run_rounds(&rt, &p, &clock, 2, 40, ms(10));
        assert_eq!(p.concurrency_limit().unwrap().baseline, Some(ms(10)));
        run_rounds(&rt, &p, &clock, 16, 40, ms(10));
        assert_eq!(p.concurrency_limit().unwrap().limit, 40);
        if mode.listen {
            let expected: Vec<(u32, u32)> = (0..12).map(|i| (4 + 3 * i, 7 + 3 * i)).collect();
            assert_eq!(limit_changes(&log), expected, "{mode:?}");
        }
        run_rounds(&rt, &p, &clock, 3, 40, ms(5));
        let now = p.concurrency_limit().unwrap();
        assert_eq!((now.baseline, now.limit), (Some(ms(5)), 40), "{mode:?}");
    }
}

/// The baseline is measured again `min_rtt_interval` after the last
/// measurement (no jitter here), and at once after five update windows in
/// a row at `min_limit`, as Envoy does.
#[test]
fn adaptive_the_baseline_is_measured_again_on_time() {
    for start in STARTS {
        // After the interval.
        let clock = VirtualClock::starting_at(start);
        let p = Pipeline::builder("gradient2-interval")
            .random(SeededRandom::new(4))
            .adaptive_limit(
                AdaptiveLimit::gradient2()
                    .limits(2, 4, 40)
                    .update_interval(ms(1))
                    .min_rtt(secs(1), 4, 2)
                    .min_rtt_jitter(0.0),
            )
            .clock(clock.clone())
            .build()
            .unwrap();
        let rt = rt();
        run_rounds(&rt, &p, &clock, 2, 8, ms(10));
        assert!(!p.concurrency_limit().unwrap().measuring);
        let measured_at = clock.now();
        let mut again = None;
        for _ in 0..150 {
            round(&rt, &p, &clock, 8, ms(10));
            if p.concurrency_limit().unwrap().measuring {
                again = Some(clock.now());
                break;
            }
        }
        assert_eq!(
            again,
            Some(measured_at + secs(1)),
            "measured again after 1 s"
        );

        // After five windows at the minimum.
        let clock = VirtualClock::starting_at(start);
        let p = Pipeline::builder("gradient2-at-min")
            .random(SeededRandom::new(4))
            .adaptive_limit(
                AdaptiveLimit::gradient2()
                    .limits(2, 4, 40)
                    .update_interval(ms(1))
                    .min_rtt(secs(600), 4, 2),
            )
            .clock(clock.clone())
            .build()
            .unwrap();
        run_rounds(&rt, &p, &clock, 2, 8, ms(10));
        let mut rounds = 0;
        while !p.concurrency_limit().unwrap().measuring && rounds < 30 {
            round(&rt, &p, &clock, 8, ms(100));
            let now = p.concurrency_limit().unwrap();
            assert!(now.limit >= 2, "{now:?}");
            rounds += 1;
        }
        assert!(rounds < 30, "never measured again at the minimum");
        run_rounds(&rt, &p, &clock, 2, 8, ms(100));
        let now = p.concurrency_limit().unwrap();
        assert_eq!(
            (now.measuring, now.baseline),
            (false, Some(ms(100))),
            "{now:?}"
        );
    }
}

/// AIMD grows while at least half the limit is in use, exactly half
/// included, and not below half.
#[test]
fn adaptive_aimd_grows_at_exactly_half_the_limit_in_use() {
    for mode in modes() {
        let (b, clock, log) = mode.builder("aimd-half");
        let p = b
            .adaptive_limit(
                AdaptiveLimit::aimd()
                    .limits(1, 4, 10)
                    .update_interval(ms(1)),
            )
            .build()
            .unwrap();
        for _ in 0..6 {
            if mode.sync {
                let inner = p.clone();
                let c = clock.clone();
                p.call(|_| {
                    inner.call(|_| {
                        c.advance(ms(2));
                        Ok::<u32, Boom>(1)
                    })
                })
                .unwrap();
            } else {
                let rt = rt();
                let (admitted, _) = round(&rt, &p, &clock, 2, ms(2));
                assert_eq!(admitted, 2);
            }
        }
        assert_eq!(p.concurrency_limit().unwrap().limit, 5, "{mode:?}");
        if mode.listen {
            assert_eq!(limit_changes(&log), vec![(4, 5)], "{mode:?}");
        }
    }
}

/// An async call over the limit waits in the queue, first in first out,
/// for at most `max_wait` (a slot given back at that very instant is still
/// its own); a sync call never waits; a timeout of the whole call bounds
/// the wait and the call ends with the refusal.
#[test]
fn adaptive_the_queue_waits_in_order_for_at_most_max_wait() {
    for mode in modes_of(false) {
        let (b, clock, log) = mode.builder("adaptive-queue");
        let p = b
            .adaptive_limit(fixed(1).queue(2, secs(1)))
            .build()
            .unwrap();
        let started = Arc::new(Mutex::new(Vec::new()));
        let call = |name: &'static str, hold: Duration| {
            let (clock, started) = (clock.clone(), started.clone());
            p.run(move |_| {
                let (clock, started) = (clock.clone(), started.clone());
                async move {
                    started
                        .lock()
                        .unwrap()
                        .push((name, clock.now() - mode.start));
                    Clock::sleep(&clock, hold).await;
                    Ok::<_, Boom>(name)
                }
            })
        };
        let results = rt().block_on(join_all(vec![
            Box::pin(call("a", ms(500))) as std::pin::Pin<Box<dyn Future<Output = _>>>,
            Box::pin(call("b", ms(500))),
            Box::pin(call("c", ms(10))),
            Box::pin(call("d", ms(10))),
        ]));
        assert_eq!(results[0].as_ref().ok(), Some(&"a"));
        assert_eq!(results[1].as_ref().ok(), Some(&"b"));
        assert_eq!(
            results[2].as_ref().ok(),
            Some(&"c"),
            "{mode:?}: {results:?}"
        );
        assert_eq!(
            reason(&results[3]),
            Some(RejectionReason::ConcurrencyLimited),
            "the queue of two is full"
        );
        assert_eq!(
            *started.lock().unwrap(),
            vec![("a", ms(0)), ("b", ms(500)), ("c", ms(1000))],
            "{mode:?}"
        );
        if mode.listen {
            assert_eq!(count(&log, |e| matches!(e, EventKind::Deferred { .. })), 2);
        }

        // A sync call never waits.
        let inner = p.clone();
        let r = p.call(|_| Ok::<_, Boom>(reason(&inner.call(|_| Ok::<u32, Boom>(1)))));
        assert_eq!(r.unwrap(), Some(RejectionReason::ConcurrencyLimited));

        // A timeout of the whole call bounds the wait: the slot is
        // held by a blocking call on another thread meanwhile.
        let (b, clock, _) = mode.builder("adaptive-queue-deadline");
        let p = b
            .timeout(ms(300))
            .adaptive_limit(fixed(1).queue(1, secs(10)))
            .build()
            .unwrap();
        let (holding, release) = (AtomicBool::new(false), AtomicBool::new(false));
        std::thread::scope(|s| {
            s.spawn(|| {
                p.call(|_| {
                    holding.store(true, SEQ);
                    for _ in 0..50_000_000u32 {
                        if release.load(SEQ) {
                            break;
                        }
                        std::thread::yield_now();
                    }
                    Ok::<_, Boom>(())
                })
            });
            for _ in 0..50_000_000u32 {
                if holding.load(SEQ) {
                    break;
                }
                std::thread::yield_now();
            }
            let ran = AtomicU32::new(0);
            let r = rt().block_on(p.run(|_| {
                ran.fetch_add(1, SEQ);
                async { Ok::<_, Boom>(()) }
            }));
            let at = mode.elapsed(&clock);
            release.store(true, SEQ);
            assert_eq!(
                reason(&r),
                Some(RejectionReason::ConcurrencyLimited),
                "{mode:?}: {r:?}"
            );
            assert_eq!((at, ran.load(SEQ)), (ms(300), 0), "{mode:?}");
        });
    }
}

/// An error judged `Throttled` is a drop; an async call dropped by its
/// caller gives its slot back without a sample.
#[test]
fn adaptive_throttled_errors_are_drops_and_dropped_calls_no_sample() {
    for mode in modes() {
        let (b, clock, _) = mode.builder("adaptive-throttled");
        let p = b
            .adaptive_limit(
                AdaptiveLimit::aimd()
                    .limits(1, 8, 8)
                    .backoff_ratio(0.5)
                    .update_interval(ms(1)),
            )
            .classify(|_: &Boom| Verdict::throttled())
            .build()
            .unwrap();
        let c = clock.clone();
        let _ = mode.many(&p, 2, move |_| {
            c.advance(ms(2));
            Err::<u32, _>(Boom(1))
        });
        assert_eq!(p.concurrency_limit().unwrap().limit, 4, "{mode:?}");
    }
    for start in STARTS {
        let clock = VirtualClock::starting_at(start);
        let p = Pipeline::builder("adaptive-dropped")
            .adaptive_limit(
                AdaptiveLimit::aimd()
                    .limits(1, 8, 8)
                    .backoff_ratio(0.5)
                    .update_interval(ms(1)),
            )
            .clock(clock.clone())
            .build()
            .unwrap();
        for _ in 0..4 {
            let mut fut = Box::pin(p.run(|_| std::future::pending::<Result<(), Boom>>()));
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            assert!(fut.as_mut().poll(&mut cx).is_pending());
            assert_eq!(p.concurrency_limit().unwrap().in_flight, 1);
            clock.advance(ms(2));
            drop(fut);
        }
        let now = p.concurrency_limit().unwrap();
        assert_eq!((now.limit, now.in_flight), (8, 0));
    }
}

/// A limit in shadow mode adapts as the same limit enforcing does: the
/// attempts over it run without a slot and give no sample.
#[test]
fn adaptive_a_shadow_limit_adapts_as_an_enforcing_one() {
    for mode in modes() {
        let mut limits = Vec::new();
        for shadow in [false, true] {
            let (b, clock, log) = mode.builder("adaptive-shadow-adapts");
            let p = b
                .adaptive_limit(
                    AdaptiveLimit::aimd()
                        .limits(1, 1, 10)
                        .update_interval(ms(1))
                        .shadow(shadow),
                )
                .build()
                .unwrap();
            let mut inner_refused = 0;
            for _ in 0..12 {
                let inner = p.clone();
                let c = clock.clone();
                let r = mode.call(&p, |_| {
                    let r = inner.call(|_| {
                        c.advance(ms(1));
                        Ok::<u32, Boom>(1)
                    });
                    c.advance(ms(1));
                    Ok::<bool, Boom>(r.is_err())
                });
                if r.unwrap() {
                    inner_refused += 1;
                }
            }
            if shadow {
                assert_eq!(inner_refused, 0, "{mode:?}");
                if mode.listen {
                    assert!(
                        count(&log, |e| matches!(e, EventKind::ShadowRejected { .. })) > 0,
                        "{mode:?}"
                    );
                }
            }
            limits.push(p.concurrency_limit().unwrap().limit);
        }
        assert_eq!(limits[0], limits[1], "{mode:?}: enforcing vs shadow");
    }
}

// ========================================================= more coalesce

/// Partition keys and per-call keys make separate executions; followers
/// take no bulkhead slot and no rate-limit permit; a fallback's value is
/// shared but never cached; a blocking coalesced call of a hedged pipeline
/// is refused.
#[test]
fn coalesce_partitions_followers_and_fallbacks() {
    const CALLERS: usize = 4;
    for mode in modes_of(true) {
        let (b, _, _) = mode.builder("coalesce-guarded");
        let p = b
            .coalesce(Coalesce::new())
            .bulkhead(Bulkhead::new(2))
            .rate_limiter(RateLimiter::fixed_window(3, secs(3600)))
            .build()
            .unwrap();
        let runs = AtomicU32::new(0);
        let joined = AtomicBool::new(false);
        // Three groups at once: partition a, partition b, partition a
        // with a key; CALLERS callers each.
        let results = on_threads(3 * CALLERS, |i| {
            let op = |_: Context| {
                runs.fetch_add(1, SEQ);
                until_joined(&p, 3 * (CALLERS - 1), &joined);
                Ok::<u32, Boom>(i as u32 % 3)
            };
            match i % 3 {
                0 => p.partition("a").coalesced().call(op),
                1 => p.partition("b").coalesced().call(op),
                _ => p.partition("a").coalesce_key(7u64).call(op),
            }
        });
        assert_eq!(runs.load(SEQ), 3, "{mode:?}");
        for (i, r) in results.iter().enumerate() {
            assert_eq!(r.as_ref().ok(), Some(&(i as u32 % 3)), "{mode:?}: {r:?}");
        }
        // Each leader took one permit per partition: a's two leaders
        // took two of a's three.
        assert!(p.partition("a").call(|_| Ok::<u32, Boom>(1)).is_ok());
        let r = p.partition("a").call(|_| Ok::<u32, Boom>(1));
        assert_eq!(reason(&r), Some(RejectionReason::RateLimited));

        // A fallback's value goes to every caller, and is not kept.
        let (b, _, _) = mode.builder("coalesce-fallback");
        let p = b
            .coalesce(Coalesce::new().ttl(secs(60)))
            .fallback_sync(|_: Error<Boom>, _| Ok(0u32))
            .build()
            .unwrap();
        let runs = AtomicU32::new(0);
        let results = on_threads(CALLERS, |_| {
            p.coalesce_key("k").call(|_| {
                runs.fetch_add(1, SEQ);
                until_waiting(&p, CALLERS - 1);
                Err::<u32, _>(Boom(1))
            })
        });
        assert_eq!(runs.load(SEQ), 1);
        assert!(results.iter().all(|r| r.as_ref().ok() == Some(&0)));
        let r = p.coalesce_key("k").call(|_| Ok::<u32, Boom>(5));
        assert_eq!(r.ok(), Some(5), "a fallback's value is not cached");
        let r = p.coalesce_key("k").call(|_| Ok::<u32, Boom>(6));
        assert_eq!(r.ok(), Some(5), "a success is");
    }
    let p = Pipeline::builder("coalesce-hedged")
        .coalesce(Coalesce::new())
        .hedging(seawall::Hedging::latency(ms(10)))
        .build()
        .unwrap();
    let r = p.coalesce_key(1u64).call(|_| Ok::<u32, Boom>(1));
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
}

// =========================================================== more custom

/// A policy around the attempt that refuses: the call ends at once, not
/// retried, not recorded by the circuit breaker, the attempt's bulkhead
/// slot given back.
struct Refuser(AtomicU32);

impl Policy<u32, Boom> for Refuser {
    fn name(&self) -> &str {
        "refuser"
    }
    fn position(&self) -> Position {
        Position::Attempt
    }
    fn call<'a>(
        &'a self,
        _ctx: Context,
        _next: Next<'a, u32, Boom>,
    ) -> PolicyFuture<'a, u32, Boom> {
        self.0.fetch_add(1, SEQ);
        Box::pin(async move {
            Err(Error::Rejected(Rejection::new(
                RejectionReason::PolicyRefused,
                None,
            )))
        })
    }
}

/// A policy around the call that sleeps past the deadline of a timeout
/// declared before it, then runs what it wraps.
struct Sleeper(Duration);

impl Policy<u32, Boom> for Sleeper {
    fn name(&self) -> &str {
        "sleeper"
    }
    fn position(&self) -> Position {
        Position::Call
    }
    fn call<'a>(&'a self, _ctx: Context, next: Next<'a, u32, Boom>) -> PolicyFuture<'a, u32, Boom> {
        let d = self.0;
        Box::pin(async move {
            next.sleep(d).await;
            next.run().await
        })
    }
}

#[test]
fn custom_policy_refusals_and_deadlines() {
    for mode in modes() {
        let refuser = Arc::new(Refuser(AtomicU32::new(0)));
        let (b, _, log) = mode.builder("custom-refuser");
        let p = b
            .retry(Retry::constant(ms(1)).max_attempts(3))
            .circuit_breaker(CircuitBreaker::consecutive_failures(1))
            .bulkhead(Bulkhead::new(1))
            .policy(refuser.clone())
            .build()
            .unwrap();
        let r = mode.call(&p, |_| Ok::<u32, Boom>(1));
        assert_eq!(reason(&r), Some(RejectionReason::PolicyRefused), "{mode:?}");
        assert_eq!(refuser.0.load(SEQ), 1, "not retried");
        assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed);
        assert_eq!(p.circuit_metrics().unwrap().calls, 0, "not recorded");
        assert_eq!(p.in_flight().unwrap(), 0, "slot given back");
        if mode.listen {
            assert_eq!(
                count(&log, |e| matches!(
                    e,
                    EventKind::Rejected {
                        reason: RejectionReason::PolicyRefused,
                        ..
                    }
                )),
                1
            );
        }

        // Sleeping never passes the deadline; a run past it is a timeout
        // at once, and nothing runs.
        let (b, clock, _) = mode.builder("custom-sleeper");
        let p = b
            .timeout(ms(100))
            .policy(Sleeper(ms(200)))
            .retry(Retry::constant(ms(1)).max_attempts(3))
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let r = mode.call(&p, |_| Ok::<u32, Boom>(ops.fetch_add(1, SEQ)));
        assert!(matches!(r, Err(Error::Timeout(_))), "{mode:?}: {r:?}");
        assert_eq!(ops.load(SEQ), 0, "{mode:?}");
        assert_eq!(mode.elapsed(&clock), ms(100), "{mode:?}");
    }
}

// ====================================================== order of things

/// Chaos is decided after the attempt was admitted: a refused attempt
/// draws nothing and is not injected; the policies are asked in
/// declaration order, and a fault ends the attempt before the ones after
/// it are asked.
#[test]
fn chaos_is_decided_after_admission_in_declaration_order() {
    for mode in modes() {
        let hooked = Arc::new(AtomicU32::new(0));
        let h = hooked.clone();
        let (b, _, log) = mode.builder("chaos-after-admission");
        let p = b
            .random(SequenceRandom::new([0.0]))
            .rate_limiter(RateLimiter::fixed_window(1, secs(3600)))
            .chaos_fault(Chaos::fault(1.0, |_| INJECTED))
            .chaos(Chaos::behavior(1.0, move |_| {
                h.fetch_add(1, SEQ);
            }))
            .build()
            .unwrap();
        let r = mode.call(&p, |_| Ok::<u32, Boom>(1));
        assert!(
            matches!(&r, Err(Error::Operation(e)) if *e == INJECTED),
            "{mode:?}: {r:?}"
        );
        let r = mode.call(&p, |_| Ok::<u32, Boom>(1));
        assert_eq!(
            reason(&r),
            Some(RejectionReason::RateLimited),
            "{mode:?}: {r:?}"
        );
        assert_eq!(hooked.load(SEQ), 0, "the fault came first");
        if mode.listen {
            assert_eq!(injected(&log), vec![(ChaosKind::Fault, 1)], "{mode:?}");
        }

        // A refused attempt draws nothing: the next admitted one draws
        // the next number.
        let (b, _, _) = mode.builder("chaos-no-draw-when-refused");
        let p = b
            .random(SequenceRandom::new([0.1, 0.9]))
            .bulkhead(Bulkhead::new(1))
            .chaos_fault(Chaos::fault(0.5, |_| INJECTED))
            .build()
            .unwrap();
        if mode.sync {
            let inner = p.clone();
            // The outer attempt draws 0.1 (a fault: the operation never
            // runs, so nest through a second pipeline call first).
            let r = p.call(|_| Ok::<u32, Boom>(1));
            assert!(r.is_err());
            // Draws 0.9: runs; the nested call is refused by the bulkhead
            // and draws nothing.
            let r = p.call(|_| {
                let nested = inner.call(|_| Ok::<u32, Boom>(2));
                assert_eq!(reason(&nested), Some(RejectionReason::BulkheadFull));
                Ok::<u32, Boom>(1)
            });
            assert_eq!(r.ok(), Some(1));
            // The next draw is 0.1 again: a fault.
            assert!(p.call(|_| Ok::<u32, Boom>(1)).is_err());
        }
    }
}

/// Coalesced calls share the leader's execution, chaos included: one
/// draw, one injection, its fault given to every follower.
#[test]
fn chaos_in_a_coalesced_call_is_the_leaders() {
    const CALLERS: usize = 5;
    for mode in modes_of(true) {
        let (b, _, log) = mode.builder("chaos-coalesced");
        // The leader's behaviour hook waits for the followers (the
        // pipeline is handed to it once built, and taken back at the
        // end).
        let cell: Arc<Mutex<Option<Pipeline<seawall::pipeline::ErrorType<Boom>>>>> = Arc::default();
        let c = cell.clone();
        let p = b
            .coalesce(Coalesce::new())
            .random(SequenceRandom::new([0.0]))
            .chaos(Chaos::behavior(1.0, move |_| {
                let p = c.lock().unwrap().clone();
                if let Some(p) = p {
                    until_waiting(&p, CALLERS - 1);
                }
            }))
            .chaos_fault(Chaos::fault(1.0, |_| INJECTED))
            .build()
            .unwrap();
        *cell.lock().unwrap() = Some(p.clone());
        let ops = AtomicU32::new(0);
        let results = on_threads(CALLERS, |_| {
            p.coalesce_key(1u64)
                .call(|_| Ok::<u32, Boom>(ops.fetch_add(1, SEQ)))
        });
        cell.lock().unwrap().take();
        assert!(
            results
                .iter()
                .all(|r| matches!(r, Err(Error::Operation(e)) if *e == INJECTED)),
            "{results:?}"
        );
        assert_eq!(ops.load(SEQ), 0);
        if mode.listen {
            assert_eq!(
                injected(&log),
                vec![(ChaosKind::Behavior, 1), (ChaosKind::Fault, 1)]
            );
            assert_eq!(count(&log, |e| *e == EventKind::Coalesced), CALLERS - 1);
        }
    }
}

// ============================================================ more shadow

/// A circuit in shadow mode moved by hand (isolated, opened for a while)
/// refuses nothing: calls run and are signalled; a cooldown in shadow mode
/// neither waits nor refuses.
#[test]
fn shadow_controls_and_cooldowns_never_refuse() {
    for mode in modes() {
        let (b, clock, log) = mode.builder("shadow-isolated");
        let p = b
            .circuit_breaker(CircuitBreaker::consecutive_failures(3).shadow(true))
            .build()
            .unwrap();
        p.isolate().unwrap();
        let results = mode.many(&p, 3, |_| Ok::<u32, Boom>(1));
        assert!(results.iter().all(|r| r.is_ok()), "{mode:?}: {results:?}");
        p.reset().unwrap();
        p.open_for(secs(10)).unwrap();
        let results = mode.many(&p, 2, |_| Ok::<u32, Boom>(1));
        assert!(results.iter().all(|r| r.is_ok()), "{mode:?}: {results:?}");
        assert_eq!(mode.elapsed(&clock), Duration::ZERO);
        if mode.listen {
            let told = refusals(&log, true);
            assert_eq!(told.len(), 5, "{mode:?}: {told:?}");
            assert!(told[..3]
                .iter()
                .all(|r| *r == (RejectionReason::CircuitOpen, None)));
            assert!(told[3..]
                .iter()
                .all(|r| r.0 == RejectionReason::CircuitOpen && r.1 == Some(secs(10))));
        }

        let (b, clock, log) = mode.builder("shadow-cooldown");
        let p = b
            .cooldown(seawall::Cooldown::new().max_wait(secs(5)).shadow(true))
            .classify(|_: &Boom| Verdict::throttled().with_retry_after(secs(2)))
            .build()
            .unwrap();
        assert!(mode.call(&p, |_| Err::<u32, _>(Boom(1))).is_err());
        let ops = AtomicU32::new(0);
        let results = mode.many(&p, 3, |_| Ok::<u32, Boom>(ops.fetch_add(1, SEQ)));
        assert!(results.iter().all(|r| r.is_ok()), "{mode:?}: {results:?}");
        assert_eq!(ops.load(SEQ), 3);
        assert_eq!(mode.elapsed(&clock), Duration::ZERO, "{mode:?}: no wait");
        if mode.listen {
            assert_eq!(refusals(&log, true).len(), 3, "{mode:?}");
        }
    }
}

/// With partitions, a partition below `ceil(limit x share)` is admitted
/// even at the limit; calls of no share use only what the limit leaves.
#[test]
fn adaptive_partition_shares_round_up() {
    for mode in modes() {
        let (b, _, _) = mode.builder("adaptive-shares");
        let p = b
            .adaptive_limit(fixed(5).partition("live", 0.7).partition("batch", 0.3))
            .build()
            .unwrap();
        // Batch takes the whole limit of 5; live still gets ceil(3.5) = 4.
        fn nest(p: &Pipeline, key: Option<&'static str>, depth: u32, bottom: &mut dyn FnMut()) {
            if depth == 0 {
                bottom();
                return;
            }
            let op = |_: Context| {
                nest(p, key, depth - 1, bottom);
                Ok::<_, Boom>(())
            };
            match key {
                Some(k) => p.partition(k).call(op).unwrap(),
                None => p.call(op).unwrap(),
            }
        }
        let mut checked = false;
        nest(&p, Some("batch"), 5, &mut || {
            let refused = |key: Option<&'static str>| {
                let r = match key {
                    Some(k) => p.partition(k).call(|_| Ok::<u32, Boom>(1)),
                    None => p.call(|_| Ok::<u32, Boom>(1)),
                };
                reason(&r)
            };
            assert_eq!(
                refused(Some("batch")),
                Some(RejectionReason::ConcurrencyLimited)
            );
            assert_eq!(refused(None), Some(RejectionReason::ConcurrencyLimited));
            nest(&p, Some("live"), 4, &mut || {
                assert_eq!(p.concurrency_limit().unwrap().in_flight, 9);
                assert_eq!(
                    refused(Some("live")),
                    Some(RejectionReason::ConcurrencyLimited)
                );
                checked = true;
            });
        });
        assert!(checked, "{mode:?}");
        assert_eq!(p.concurrency_limit().unwrap().in_flight, 0);
    }
}

// ======================================================= adaptive defaults

/// The documented defaults: limits, the first baseline measurement at 3
/// calls, an update window of 100 ms and AIMD's latency timeout of 5 s.
#[test]
fn adaptive_defaults_are_the_documented_ones() {
    let (a, v, g) = (
        AdaptiveLimit::aimd(),
        AdaptiveLimit::vegas(),
        AdaptiveLimit::gradient2(),
    );
    assert_eq!((a.min_limit, a.initial_limit, a.max_limit), (20, 20, 200));
    assert_eq!((v.min_limit, v.initial_limit, v.max_limit), (1, 20, 1000));
    assert_eq!((g.min_limit, g.initial_limit, g.max_limit), (20, 20, 200));
    for l in [&a, &v, &g] {
        assert_eq!(l.update_interval, ms(100));
        assert_eq!((l.max_queued, l.shadow), (0, false));
        assert!(l.partitions.is_empty());
    }
    for (limit, measuring, admitted) in [(a, false, 20), (v, true, 3), (g, true, 3)] {
        let p = Pipeline::builder("adaptive-defaults")
            .adaptive_limit(limit)
            .build()
            .unwrap();
        let now = p.concurrency_limit().unwrap();
        assert_eq!(
            (
                now.limit,
                now.admitted,
                now.measuring,
                now.in_flight,
                now.baseline
            ),
            (20, admitted, measuring, 0, None)
        );
    }
    assert!(Pipeline::builder("no-limit")
        .build()
        .unwrap()
        .concurrency_limit()
        .is_none());

    for mode in modes() {
        // A window of 100 ms: calls of 60 ms close one every other call.
        let (b, clock, _) = mode.builder("aimd-default-window");
        let p = b
            .adaptive_limit(AdaptiveLimit::aimd().limits(1, 1, 10))
            .build()
            .unwrap();
        let c = clock.clone();
        let mut limits = Vec::new();
        for _ in 0..6 {
            let c = c.clone();
            mode.call(&p, move |_| {
                c.advance(ms(60));
                Ok::<u32, Boom>(1)
            })
            .unwrap();
            limits.push(p.concurrency_limit().unwrap().limit);
        }
        // Opened at 60 ms, closed at 180 ms; opened at 240, closed at 360.
        assert_eq!(limits, vec![1, 1, 2, 2, 2, 3], "{mode:?}");

        // A latency of exactly 5 s is not too slow; one over it is.
        let (b, _, _) = mode.builder("aimd-default-rtt-timeout");
        let p = b
            .random(SequenceRandom::new([0.0]))
            .adaptive_limit(
                AdaptiveLimit::aimd()
                    .limits(1, 10, 10)
                    .update_interval(ms(1)),
            )
            .chaos(Chaos::latency(1.0, secs(5)))
            .build()
            .unwrap();
        let _ = mode.many(&p, 4, |_| Ok::<u32, Boom>(1));
        assert_eq!(
            p.concurrency_limit().unwrap().limit,
            10,
            "{mode:?}: 5 s is on time"
        );
        let (b, _, _) = mode.builder("aimd-default-rtt-timeout-over");
        let p = b
            .random(SequenceRandom::new([0.0]))
            .adaptive_limit(
                AdaptiveLimit::aimd()
                    .limits(1, 10, 10)
                    .update_interval(ms(1)),
            )
            .chaos(Chaos::latency(1.0, secs(5) + Duration::from_nanos(1)))
            .build()
            .unwrap();
        let _ = mode.many(&p, 2, |_| Ok::<u32, Boom>(1));
        assert_eq!(
            p.concurrency_limit().unwrap().limit,
            9,
            "{mode:?}: over 5 s"
        );
    }
}

/// Gradient2 adds its headroom while the latency stays within the buffer
/// (10 % over the baseline by default) and shrinks once it leaves it.
#[test]
fn adaptive_gradient2_grows_within_its_buffer_and_shrinks_past_it() {
    for start in STARTS {
        let clock = VirtualClock::starting_at(start);
        let p = Pipeline::builder("gradient2-buffer")
            .random(SeededRandom::new(8))
            .adaptive_limit(
                AdaptiveLimit::gradient2()
                    .limits(2, 10, 40)
                    .update_interval(ms(1))
                    .min_rtt(secs(600), 4, 2),
            )
            .clock(clock.clone())
            .build()
            .unwrap();
        let rt = rt();
        run_rounds(&rt, &p, &clock, 2, 40, ms(10));
        assert_eq!(p.concurrency_limit().unwrap().baseline, Some(ms(10)));
        run_rounds(&rt, &p, &clock, 10, 40, Duration::from_micros(10_500));
        let grown = p.concurrency_limit().unwrap().limit;
        assert!(grown > 10, "within the buffer it grows: {grown}");
        run_rounds(&rt, &p, &clock, 10, 40, ms(12));
        let shrunk = p.concurrency_limit().unwrap().limit;
        assert!(
            shrunk < grown,
            "past the buffer it shrinks: {grown} -> {shrunk}"
        );
    }
}

/// Vegas's step is `log10(limit)` rounded down (at least 1): from a limit
/// of 100 it grows by 6 per window.
#[test]
fn adaptive_vegas_steps_by_log10_of_the_limit() {
    let clock = VirtualClock::starting_at(FAR);
    let (log, listener) = recorder();
    let p = Pipeline::builder("vegas-log10")
        .random(SeededRandom::new(2))
        .adaptive_limit(
            AdaptiveLimit::vegas()
                .limits(1, 100, 130)
                .update_interval(ms(1))
                .min_rtt(secs(600), 4, 2),
        )
        .clock(clock.clone())
        .on_event(listener)
        .build()
        .unwrap();
    let rt = rt();
    run_rounds(&rt, &p, &clock, 2, 2, ms(10));
    run_rounds(&rt, &p, &clock, 8, 130, ms(10));
    assert_eq!(
        limit_changes(&log),
        vec![(100, 106), (106, 112), (112, 118), (118, 124), (124, 130)]
    );
}

// ================================================ adaptive with the others

/// The adaptive limit admits each attempt before the store's policies: a
/// refusal by the circuit gives the slot back, and so does a call waiting
/// for a cooldown or a rate-limit permit; each hedged attempt takes a slot
/// of its own, and a hedge over the limit is refused while the call goes
/// on.
#[test]
fn adaptive_slots_around_the_other_policies() {
    for mode in modes() {
        // An open circuit.
        let (b, _, _) = mode.builder("adaptive-circuit");
        let p = b
            .adaptive_limit(fixed(1))
            .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(60)))
            .build()
            .unwrap();
        assert!(mode.call(&p, |_| Err::<u32, _>(Boom(1))).is_err());
        for _ in 0..3 {
            let r = mode.call(&p, |_| Ok::<u32, Boom>(1));
            assert_eq!(reason(&r), Some(RejectionReason::CircuitOpen));
        }
        assert_eq!(p.concurrency_limit().unwrap().in_flight, 0, "{mode:?}");
    }
    for mode in modes_of(false) {
        // Waiting for a cooldown and for a permit: no slot held.
        for limiter in [false, true] {
            let (b, clock, _) = mode.builder("adaptive-waits");
            let b = b.adaptive_limit(fixed(1));
            let b = if limiter {
                b.rate_limiter(RateLimiter::fixed_window(1, secs(1)).max_wait(secs(2)))
            } else {
                b.cooldown(seawall::Cooldown::new().max_wait(secs(5)))
            };
            let p = b
                .classify(|_: &Boom| Verdict::throttled().with_retry_after(secs(1)))
                .build()
                .unwrap();
            let rt = rt();
            // Opens the pause, or takes the window's permit.
            let r = rt.block_on(p.run(|_| async {
                if limiter {
                    Ok::<u32, Boom>(0)
                } else {
                    Err(Boom(1))
                }
            }));
            assert_eq!(r.is_ok(), limiter);
            let seen = Arc::new(Mutex::new(None));
            let s = seen.clone();
            let p2 = p.clone();
            let results = rt.block_on(join_all(vec![
                Box::pin(async { p.run(|_| async { Ok::<u32, Boom>(1) }).await })
                    as std::pin::Pin<Box<dyn Future<Output = _>>>,
                Box::pin(async move {
                    // The first call waits now.
                    tokio::task::yield_now().await;
                    *s.lock().unwrap() = Some(p2.concurrency_limit().unwrap().in_flight);
                    Ok(0u32)
                }),
            ]));
            assert_eq!(results[0].as_ref().ok(), Some(&1), "{mode:?} {limiter}");
            assert_eq!(mode.elapsed(&clock), secs(1), "{mode:?} {limiter}");
            assert_eq!(
                *seen.lock().unwrap(),
                Some(0),
                "{mode:?} limiter {limiter}: a waiting call holds no slot"
            );
        }

        // Hedged attempts: a slot each; a hedge over the limit is
        // refused and the call goes on.
        let (b, clock, log) = mode.builder("adaptive-hedged");
        let p = b
            .hedging(seawall::Hedging::latency(ms(10)).max_hedged_attempts(2))
            .adaptive_limit(fixed(2))
            .build()
            .unwrap();
        let peak = Arc::new(AtomicU32::new(0));
        let pk = peak.clone();
        let inner = p.clone();
        let c = clock.clone();
        let r = rt().block_on(p.run(move |ctx| {
            pk.fetch_max(inner.concurrency_limit().unwrap().in_flight, SEQ);
            let c = c.clone();
            async move {
                Clock::sleep(&c, ms(100)).await;
                Ok::<u32, Boom>(ctx.attempt())
            }
        }));
        assert_eq!(r.ok(), Some(1), "{mode:?}");
        assert_eq!(peak.load(SEQ), 2, "{mode:?}");
        assert_eq!(p.concurrency_limit().unwrap().in_flight, 0);
        if mode.listen {
            assert!(
                count(&log, |e| matches!(
                    e,
                    EventKind::Rejected {
                        reason: RejectionReason::ConcurrencyLimited,
                        ..
                    }
                )) >= 1,
                "{mode:?}: {:?}",
                log.lock().unwrap()
            );
            assert_eq!(
                count(&log, |e| matches!(e, EventKind::HedgeStarted { .. })),
                1
            );
        }
    }
}

/// A strict sync timeout turns a late success into a timeout, which is a
/// drop for the limit; a late success under `Timeout::new` is kept and is
/// a sample of its latency.
#[test]
fn adaptive_sync_timeouts_are_drops() {
    for mode in modes_of(true) {
        for strict in [false, true] {
            let (b, clock, _) = mode.builder("adaptive-sync-timeout");
            let timeout = if strict {
                Timeout::strict(ms(5))
            } else {
                Timeout::new(ms(5))
            };
            let p = b
                .timeout(timeout)
                .adaptive_limit(
                    AdaptiveLimit::aimd()
                        .limits(1, 8, 8)
                        .backoff_ratio(0.5)
                        .update_interval(ms(1)),
                )
                .build()
                .unwrap();
            for _ in 0..2 {
                let c = clock.clone();
                let r = p.call(move |_| {
                    c.advance(ms(10));
                    Ok::<u32, Boom>(1)
                });
                assert_eq!(r.is_ok(), !strict);
            }
            let expected = if strict { 4 } else { 8 };
            assert_eq!(
                p.concurrency_limit().unwrap().limit,
                expected,
                "strict {strict} {mode:?}"
            );
        }
    }
}

/// A policy around each attempt runs inside the attempt's admission: its
/// inner runs share the attempt's adaptive slot (none is refused by a
/// limit of 1); a policy around the call makes each pass a call of its
/// own, which takes the weighted call's permits again.
#[test]
fn custom_policy_inside_the_attempts_admission_and_weighted_passes() {
    for mode in modes() {
        let policy = Custom::new("again", Position::Attempt, 3);
        let (b, _, _) = mode.builder("custom-adaptive");
        let p = b
            .adaptive_limit(fixed(1))
            .policy(policy.clone())
            .build()
            .unwrap();
        let ops = AtomicU32::new(0);
        let r = mode.call(&p, |_| {
            if ops.fetch_add(1, SEQ) < 2 {
                Err(Boom(1))
            } else {
                Ok(7)
            }
        });
        assert_eq!(r.ok(), Some(7), "{mode:?}");
        assert_eq!((policy.passes(), ops.load(SEQ)), (1, 3));
        assert_eq!(p.concurrency_limit().unwrap().in_flight, 0);

        let policy = Custom::new("passes", Position::Call, 2);
        let (b, _, _) = mode.builder("custom-weighted");
        let p = b
            .policy(policy.clone())
            .retry(Retry::constant(ms(1)).max_attempts(1))
            .rate_limiter(RateLimiter::fixed_window(10, secs(3600)))
            .build()
            .unwrap();
        let c = p.weighted(3).unwrap();
        let fail = |_: Context| Err::<u32, _>(Boom(1));
        let r = if mode.sync {
            c.call(fail)
        } else {
            rt().block_on(c.run(|ctx| std::future::ready(fail(ctx))))
        };
        assert!(r.is_err());
        assert_eq!(policy.passes(), 1);
        // Two passes of three permits: four are left.
        let c = p.weighted(4).unwrap();
        let ok = |_: Context| Ok::<u32, Boom>(1);
        let r = if mode.sync {
            c.call(ok)
        } else {
            rt().block_on(c.run(|ctx| std::future::ready(ok(ctx))))
        };
        assert_eq!(r.ok(), Some(1), "{mode:?}");
        let r = mode.call(&p, |_| Ok::<u32, Boom>(1));
        assert_eq!(reason(&r), Some(RejectionReason::RateLimited), "{mode:?}");
    }
}

/// A bulkhead or an adaptive limit with a queue, in shadow mode, never
/// makes a call wait: every call starts at once.
#[test]
fn shadow_queues_never_make_a_call_wait() {
    for mode in modes_of(false) {
        for adaptive in [false, true] {
            let (b, clock, log) = mode.builder("shadow-queue");
            let b = if adaptive {
                b.adaptive_limit(fixed(1).queue(5, secs(10)).shadow(true))
            } else {
                b.bulkhead(Bulkhead::new(1).queue(5, secs(10)).shadow(true))
            };
            let p = b.build().unwrap();
            let started = Arc::new(Mutex::new(Vec::new()));
            let results = rt().block_on(join_all(
                (0..3)
                    .map(|_| {
                        let (clock, started) = (clock.clone(), started.clone());
                        p.run(move |_| {
                            let (clock, started) = (clock.clone(), started.clone());
                            async move {
                                started.lock().unwrap().push(clock.now() - mode.start);
                                Clock::sleep(&clock, ms(100)).await;
                                Ok::<_, Boom>(())
                            }
                        })
                    })
                    .collect(),
            ));
            assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
            assert_eq!(
                *started.lock().unwrap(),
                vec![Duration::ZERO; 3],
                "{mode:?}"
            );
            assert_eq!(mode.elapsed(&clock), ms(100));
            if mode.listen {
                assert_eq!(refusals(&log, true).len(), 2, "adaptive {adaptive}");
                assert_eq!(count(&log, |e| matches!(e, EventKind::Deferred { .. })), 0);
            }
        }
    }
}
