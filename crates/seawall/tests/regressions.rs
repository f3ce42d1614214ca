//! One regression test per defect found by trying seawall as a new user
//! would (the default path: in-memory store, no listener, a clock that has
//! been running a while), each named after the defect it guards. Every test
//! also runs the same calls with a listener registered, since a listener
//! must never change a decision, a timestamp or the stored state.
//!
//! Time runs on the virtual clock, except for the two tests of an async
//! retry that must yield to the runtime, which bound real time.

mod support;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use seawall::pipeline::ErrorType;
use seawall::testing::VirtualClock;
use seawall::*;
use support::*;

/// Runs `check` for each variant and fails once with every variant that
/// failed, so that one failing variant does not hide the others.
fn each_variant<V: std::fmt::Debug + Copy>(
    variants: &[V],
    mut check: impl FnMut(V) -> Result<(), String>,
) {
    let failures: Vec<String> = variants
        .iter()
        .filter_map(|&v| match catch_unwind(AssertUnwindSafe(|| check(v))) {
            Ok(Ok(())) => None,
            Ok(Err(msg)) => Some(format!("{v:?}: {msg}")),
            Err(panic) => Some(format!("{v:?}: panicked: {}", panic_text(&panic))),
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} variants failed:\n  {}",
        failures.len(),
        variants.len(),
        failures.join("\n  ")
    );
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

fn ensure(cond: bool, msg: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(msg())
    }
}

fn rejection_of<T: std::fmt::Debug, E: std::fmt::Debug>(
    r: &Result<T, Error<E>>,
) -> Result<Rejection, String> {
    match r {
        Err(Error::Rejected(r)) => Ok(*r),
        other => Err(format!("expected a rejection, got {other:?}")),
    }
}

// ------------------------------------------------------------------------
// The breaker stops protecting once the process has been up for longer
// than its cooldown (the lean path stamps the trip at the clock's origin).

/// How the clock came to be far from 0.
#[derive(Debug, Clone, Copy)]
enum Uptime {
    /// Advanced by 10^6 s before the pipeline was built.
    FarBeforeBuild,
    /// At 0 when built; one success, then 31 s of uptime before the trip.
    RunningBeforeTrip,
}

fn breaker_keeps_protecting(flavor: Flavor) {
    let variants: Vec<(Uptime, bool)> = [Uptime::FarBeforeBuild, Uptime::RunningBeforeTrip]
        .into_iter()
        .flat_map(|u| [(u, false), (u, true)])
        .collect();
    each_variant(&variants, |(uptime, listener)| {
        let clock = match uptime {
            Uptime::FarBeforeBuild => clock_at(FAR),
            Uptime::RunningBeforeTrip => VirtualClock::new(),
        };
        let p = listen(
            Pipeline::builder(unique("reg-uptime"))
                .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(30)))
                .store(MemoryStore::new())
                .clock(clock.clone()),
            listener,
        )
        .build()
        .unwrap();
        if let Uptime::RunningBeforeTrip = uptime {
            exec(&p, flavor, |_| Ok::<u32, Boom>(1)).unwrap();
            clock.advance(secs(31));
        }
        let tripped = exec(&p, flavor, |_| Err::<u32, _>(Boom(1)));
        ensure(matches!(tripped, Err(Error::Operation(Boom(1)))), || {
            format!("the failing call: {tripped:?}")
        })?;
        ensure(p.circuit_state().unwrap() == CircuitState::Open, || {
            format!("after the trip: {:?}", p.circuit_state())
        })?;
        let mut ran = 0;
        let next = exec(&p, flavor, |_| {
            ran += 1;
            Ok::<u32, Boom>(7)
        });
        let r = rejection_of(&next).map_err(|e| {
            format!(
                "the call right after the trip: {e} (state now {:?})",
                p.circuit_state()
            )
        })?;
        ensure(r.reason == RejectionReason::CircuitOpen && ran == 0, || {
            format!("{r:?}, operation ran {ran} time(s)")
        })?;
        ensure(r.retry_after == Some(secs(30)), || {
            format!(
                "retry_after {:?}, expected the whole cooldown",
                r.retry_after
            )
        })?;
        clock.advance(secs(30));
        let probe = exec(&p, flavor, |_| Ok::<u32, Boom>(8));
        ensure(matches!(probe, Ok(8)), || {
            format!("the probe after the cooldown: {probe:?}")
        })?;
        ensure(p.circuit_state().unwrap() == CircuitState::Closed, || {
            format!("after the probe: {:?}", p.circuit_state())
        })
    });
}

#[test]
fn breaker_stops_protecting_after_its_cooldown_of_uptime_sync() {
    breaker_keeps_protecting(Flavor::Sync);
}

#[test]
fn breaker_stops_protecting_after_its_cooldown_of_uptime_async() {
    breaker_keeps_protecting(Flavor::Async);
}

// ------------------------------------------------------------------------
// Rate limiter `max_wait` under contention: three calls at t = 250 ms on a
// limit of one per 250 ms with `max_wait(250 ms)` were admitted at 250, 500
// and 750 ms (each new wait compared with `max_wait` without the time
// already waited), then the third waited until 500 ms to be refused. A call
// deferred by the limiter reserves its permit: the third sees the first two
// and is refused at once, told to retry after 500 ms.

/// The limiters of the rate-limit regressions, one per 250 ms.
fn one_per_250ms() -> Vec<(&'static str, RateLimiter)> {
    vec![
        ("fixed", RateLimiter::fixed_window(1, ms(250))),
        ("sliding", RateLimiter::sliding_window(1, ms(250))),
        ("gcra", RateLimiter::gcra(1, ms(250))),
    ]
}

/// A virtual clock whose blocking sleeps wait until the test opens a gate
/// (or a second one comes), so that a sync call can be made while another
/// sleeps.
#[derive(Debug, Clone)]
struct GatedClock {
    inner: VirtualClock,
    gate: Arc<(Mutex<(u32, bool)>, std::sync::Condvar)>,
}

impl GatedClock {
    fn new(inner: VirtualClock) -> Self {
        GatedClock {
            inner,
            gate: Arc::new((Mutex::new((0, false)), std::sync::Condvar::new())),
        }
    }

    /// Waits until `n` blocking sleeps are waiting at the gate.
    fn wait_for_sleepers(&self, n: u32) {
        let (lock, cv) = &*self.gate;
        let mut g = lock.lock().unwrap();
        while g.0 < n {
            g = cv.wait(g).unwrap();
        }
    }

    fn open(&self) {
        let (lock, cv) = &*self.gate;
        lock.lock().unwrap().1 = true;
        cv.notify_all();
    }
}

impl clock::Clock for GatedClock {
    fn now(&self) -> Duration {
        self.inner.now()
    }
    fn sleep(&self, duration: Duration) -> clock::BoxSleep {
        clock::Clock::sleep(&self.inner, duration)
    }
    fn sleep_blocking(&self, duration: Duration) {
        let (lock, cv) = &*self.gate;
        let mut g = lock.lock().unwrap();
        g.0 += 1;
        // A second sleeper (a call that should not have waited) opens the
        // gate: the test then fails on what the calls did, never hangs.
        g.1 |= g.0 > 1;
        cv.notify_all();
        while !g.1 {
            g = cv.wait(g).unwrap();
        }
        drop(g);
        clock::Clock::sleep_blocking(&self.inner, duration);
    }
}

/// One call's result (the time its operation ran, from the start) and
/// when it ended, from the start.
type Timed = (Result<Duration, Error<Boom>>, Duration);

/// Three calls at 250 ms on `limiter.max_wait(250 ms)`: sync ones on
/// threads (the third made while the second sleeps) or async ones joined.
/// `call_level`: the limiter is declared before a retry, so that it admits
/// each call once (the call's gate) rather than each attempt.
fn three_calls(
    limiter: &RateLimiter,
    flavor: Flavor,
    offset: Duration,
    listener: bool,
    call_level: bool,
) -> [Timed; 3] {
    let virtual_clock = clock_at(offset + ms(250));
    let gated = GatedClock::new(virtual_clock.clone());
    let start = virtual_clock.now();
    let builder = Pipeline::builder(unique("reg-rl-wait"))
        .rate_limiter(limiter.clone().max_wait(ms(250)))
        .store(MemoryStore::new());
    let builder = if call_level {
        builder.retry(Retry::constant(ms(1)).max_attempts(2))
    } else {
        builder
    };
    let builder = match flavor {
        Flavor::Sync => builder.clock(gated.clone()),
        Flavor::Async => builder.clock(virtual_clock.clone()),
    };
    let p = listen(builder, listener).build().unwrap();
    let c = virtual_clock.clone();
    let since = move || c.now() - start;
    match flavor {
        Flavor::Sync => {
            let one = || {
                let r = p.call(|_| Ok::<_, Boom>(since()));
                (r, since())
            };
            let first = one();
            std::thread::scope(|scope| {
                let second = scope.spawn(one);
                gated.wait_for_sleepers(1);
                let third = one();
                gated.open();
                [first, second.join().unwrap(), third]
            })
        }
        Flavor::Async => {
            let one = || {
                let (p, since) = (&p, since.clone());
                async move {
                    let r = p
                        .run(|_| {
                            let admitted = since();
                            async move { Ok::<_, Boom>(admitted) }
                        })
                        .await;
                    (r, since())
                }
            };
            let (a, b, c) = rt().block_on(async { tokio::join!(one(), one(), one()) });
            [a, b, c]
        }
    }
}

fn rate_limiter_max_wait_under_contention(flavor: Flavor) {
    let limiters = one_per_250ms();
    let variants: Vec<(usize, Duration, bool, bool)> = (0..limiters.len())
        .flat_map(|i| {
            [Duration::ZERO, FAR].into_iter().flat_map(move |o| {
                [false, true]
                    .into_iter()
                    .flat_map(move |l| [(i, o, l, false), (i, o, l, true)])
            })
        })
        .collect();
    each_variant(&variants, |(i, offset, listener, call_level)| {
        let (name, limiter) = &limiters[i];
        let results = three_calls(limiter, flavor, offset, listener, call_level);
        let admitted: Vec<Duration> = results
            .iter()
            .filter_map(|(r, _)| r.as_ref().ok().copied())
            .collect();
        let refused: Vec<(Rejection, Duration)> = results
            .iter()
            .filter_map(|(r, end)| {
                r.as_ref()
                    .err()
                    .and_then(|e| e.rejection().copied())
                    .map(|r| (r, *end))
            })
            .collect();
        ensure(
            admitted == vec![Duration::ZERO, ms(250)]
                && refused.len() == 1
                && refused[0].0.reason == RejectionReason::RateLimited
                && refused[0].0.retry_after == Some(ms(500))
                && refused[0].1 == Duration::ZERO,
            || {
                format!(
                    "{name}: admitted at {admitted:?}, refused (rejection, when) {refused:?}; \
                     expected admissions at 0 and 250ms and the third refused at once \
                     (at 0) with retry_after 500ms"
                )
            },
        )
    });
}

#[test]
fn rate_limiter_max_wait_is_exceeded_under_contention() {
    rate_limiter_max_wait_under_contention(Flavor::Async);
}

#[test]
fn rate_limiter_max_wait_is_exceeded_under_contention_sync() {
    rate_limiter_max_wait_under_contention(Flavor::Sync);
}

/// 64 tasks at once on a limit of 4 per 100 ms with `max_wait(300 ms)`:
/// the permits of the next 300 ms go to 16 of them, each admitted when its
/// permit is due, and the 48 others are refused at once; no call waits
/// longer than `max_wait`, and the admissions replayed through the
/// reference model all conform.
#[test]
fn many_tasks_never_wait_past_max_wait_nor_pass_the_limit() {
    let limiters = [
        RateLimiter::fixed_window(4, ms(100)),
        RateLimiter::gcra(4, ms(100)),
        RateLimiter::sliding_window(4, ms(100)),
    ];
    let variants: Vec<(usize, Duration, bool)> = (0..limiters.len())
        .flat_map(|i| [(i, Duration::ZERO, false), (i, FAR, false), (i, FAR, true)])
        .collect();
    each_variant(&variants, |(i, offset, listener)| {
        let limiter = limiters[i].clone();
        let clock = clock_at(offset);
        let p = listen(
            Pipeline::builder(unique("reg-rl-many"))
                .rate_limiter(limiter.clone().max_wait(ms(300)))
                .store(MemoryStore::new())
                .clock(clock.clone()),
            listener,
        )
        .build()
        .unwrap();
        let results: Vec<Timed> = rt().block_on(async {
            let tasks: Vec<_> = (0..64)
                .map(|_| {
                    let (p, c) = (p.clone(), clock.clone());
                    tokio::spawn(async move {
                        let r = p
                            .run(|_| {
                                let admitted = c.now() - offset;
                                async move { Ok::<_, Boom>(admitted) }
                            })
                            .await;
                        (r, c.now() - offset)
                    })
                })
                .collect();
            let mut results = Vec::new();
            for t in tasks {
                results.push(t.await.unwrap());
            }
            results
        });
        let longest = results.iter().map(|(_, end)| *end).max().unwrap();
        ensure(longest <= ms(300), || {
            format!("{limiter:?}: a call ended {longest:?} after the start")
        })?;
        let mut admitted: Vec<Duration> = results
            .iter()
            .filter_map(|(r, _)| r.as_ref().ok().copied())
            .collect();
        admitted.sort();
        let late_refusals: Vec<Duration> = results
            .iter()
            .filter(|(r, _)| r.is_err())
            .map(|(_, end)| *end)
            .filter(|end| !end.is_zero())
            .collect();
        ensure(admitted.len() == 16 && late_refusals.is_empty(), || {
            format!(
                "{limiter:?}: {} admitted at {admitted:?}, refusals after waiting at \
                 {late_refusals:?}",
                admitted.len()
            )
        })?;
        let mut model = seawall::model::rate::RateLimit::new(&limiter);
        for (n, t) in admitted.iter().enumerate() {
            ensure(model.acquire(offset + *t).is_ok(), || {
                format!("{limiter:?}: admission {n} at {t:?} is over the limit: {admitted:?}")
            })?;
        }
        Ok(())
    });
}

/// A call cancelled while it waits for its reserved permit gives it back:
/// the next caller gets that permit instead of being refused.
#[test]
fn a_cancelled_wait_gives_its_reserved_permit_back() {
    let limiters = one_per_250ms();
    let variants: Vec<(usize, Duration, bool)> = (0..limiters.len())
        .flat_map(|i| [(i, Duration::ZERO, false), (i, FAR, false), (i, FAR, true)])
        .collect();
    each_variant(&variants, |(i, offset, listener)| {
        let (name, limiter) = &limiters[i];
        let clock = clock_at(offset + ms(250));
        let start = clock.now();
        let p = listen(
            Pipeline::builder(unique("reg-rl-cancel"))
                .rate_limiter(limiter.clone().max_wait(ms(250)))
                .store(MemoryStore::new())
                .clock(clock.clone()),
            listener,
        )
        .build()
        .unwrap();
        let one = || {
            let (p, c) = (&p, clock.clone());
            async move {
                p.run(|_| {
                    let admitted = c.now() - start;
                    async move { Ok::<_, Boom>(admitted) }
                })
                .await
            }
        };
        let (first, third) = rt().block_on(async {
            let first = one().await;
            // The second reserves the permit at 500 ms, then is dropped.
            let second = one();
            tokio::select! {
                biased;
                r = second => panic!("the second call ended at once: {r:?}"),
                () = std::future::ready(()) => {}
            }
            (first, one().await)
        });
        ensure(
            matches!(first, Ok(d) if d.is_zero()) && matches!(third, Ok(d) if d == ms(250)),
            || {
                format!(
                    "{name}: first {first:?}, third {third:?}; expected admissions at 0 and 250ms"
                )
            },
        )
    });
}

/// Two calls waiting for their reserved permits, dropped newest first:
/// each is the newest reservation when it goes, so both permits come back
/// and the next caller waits only for the first. The fixed window kept the
/// older one spent: its window was no longer the last one counted once the
/// newer window had been emptied, and the next caller waited a window more
/// than with GCRA.
#[test]
fn waiters_dropped_newest_first_give_every_permit_back() {
    let limiters = one_per_250ms();
    let variants: Vec<(usize, Duration, bool, Flavor)> = (0..limiters.len())
        .flat_map(|i| {
            [Duration::ZERO, FAR].into_iter().flat_map(move |offset| {
                [false, true]
                    .into_iter()
                    .flat_map(move |listener| FLAVORS.map(|flavor| (i, offset, listener, flavor)))
            })
        })
        .collect();
    each_variant(&variants, |(i, offset, listener, flavor)| {
        use std::future::Future;
        use std::task::{Context as TaskContext, Waker};
        let (name, limiter) = &limiters[i];
        let clock = clock_at(offset + ms(250));
        let start = clock.now();
        let p = listen(
            Pipeline::builder(unique("reg-rl-cancel-two"))
                .rate_limiter(limiter.clone().max_wait(ms(500)))
                .store(MemoryStore::new())
                .clock(clock.clone()),
            listener,
        )
        .build()
        .unwrap();
        exec(&p, flavor, |_| Ok::<_, Boom>(())).map_err(|e| format!("{name}: {e:?}"))?;
        let mut cx = TaskContext::from_waker(Waker::noop());
        // They reserve the permits at 250 and 500 ms.
        let mut older = Box::pin(p.run(|_| async { Ok::<_, Boom>(()) }));
        let mut newer = Box::pin(p.run(|_| async { Ok::<_, Boom>(()) }));
        ensure(
            older.as_mut().poll(&mut cx).is_pending() && newer.as_mut().poll(&mut cx).is_pending(),
            || format!("{name}: a waiter ended at once"),
        )?;
        drop(newer);
        drop(older);
        let next = exec(&p, flavor, |_| Ok::<_, Boom>(clock.now() - start));
        ensure(matches!(next, Ok(d) if d == ms(250)), || {
            format!("{name}: the next call: {next:?}; expected an admission at 250ms")
        })
    });
}

/// A call waiting for its reserved permit holds no bulkhead slot ("a slot
/// is held only while an attempt runs"): while it waits the bulkhead is
/// empty; it holds the slot when it runs.
#[test]
fn a_call_waiting_for_its_permit_holds_no_bulkhead_slot() {
    let variants = [(Duration::ZERO, false), (FAR, false), (FAR, true)];
    each_variant(&variants, |(offset, listener)| {
        let clock = clock_at(offset + ms(250));
        let p = listen(
            Pipeline::builder(unique("reg-rl-slot"))
                .bulkhead(Bulkhead::new(1))
                .rate_limiter(RateLimiter::fixed_window(1, ms(250)).max_wait(ms(250)))
                .store(MemoryStore::new())
                .clock(clock.clone()),
            listener,
        )
        .build()
        .unwrap();
        let (first, (second, running), waiting) = rt().block_on(async {
            let first = p.run(|_| async { Ok::<_, Boom>(()) }).await;
            let second = async {
                let running = std::cell::Cell::new(None);
                let r = p
                    .run(|_| {
                        running.set(Some(p.in_flight().unwrap()));
                        async { Ok::<_, Boom>(()) }
                    })
                    .await;
                (r, running.get())
            };
            let check = async {
                clock::Clock::sleep(&clock, ms(50)).await;
                p.in_flight().unwrap()
            };
            let (second, waiting) = tokio::join!(second, check);
            (first, second, waiting)
        });
        ensure(
            first.is_ok() && second.is_ok() && waiting == 0 && running == Some(1),
            || {
                format!(
                    "first {first:?}, second {second:?}; slots in flight while the second \
                     waited {waiting}, while it ran {running:?}"
                )
            },
        )?;
        ensure(p.in_flight().unwrap() == 0, || "a slot left".to_string())
    });
}

/// A call whose wait for its permit would pass its deadline is refused at
/// once and reserves nothing: a call without a deadline gets that permit.
#[test]
fn a_call_refused_for_its_deadline_reserves_nothing() {
    let limiters = one_per_250ms();
    let variants: Vec<(usize, Flavor, bool)> = (0..limiters.len())
        .flat_map(|i| {
            FLAVORS
                .into_iter()
                .flat_map(move |f| [(i, f, false), (i, f, true)])
        })
        .collect();
    each_variant(&variants, |(i, flavor, listener)| {
        let (name, limiter) = &limiters[i];
        let clock = clock_at(FAR + ms(250));
        let start = clock.now();
        let store = MemoryStore::new();
        let name_ = unique("reg-rl-deadline");
        let build = |timeout: Option<Duration>| {
            let b = Pipeline::builder(name_.clone())
                .rate_limiter(limiter.clone().max_wait(ms(250)))
                .store(store.clone())
                .clock(clock.clone());
            let b = match timeout {
                Some(t) => b.timeout(t),
                None => b,
            };
            listen(b, listener).build().unwrap()
        };
        let (long, short) = (build(None), build(Some(ms(100))));
        let c = clock.clone();
        let op = move |_: Context| Ok::<_, Boom>(c.now() - start);
        let first = exec(&long, flavor, op.clone());
        let refused = exec(&short, flavor, op.clone());
        let refused_at = clock.now() - start;
        let third = exec(&long, flavor, op);
        let r = rejection_of(&refused)?;
        ensure(
            matches!(first, Ok(d) if d.is_zero())
                && r.reason == RejectionReason::RateLimited
                && r.retry_after == Some(ms(250))
                && refused_at.is_zero()
                && matches!(third, Ok(d) if d == ms(250)),
            || {
                format!(
                    "{name}: first {first:?}, the call with a deadline {r:?} at {refused_at:?}, \
                     third {third:?}"
                )
            },
        )
    });
}

/// A wait that ends exactly at the call's deadline fits it: what follows
/// it is on time (`timeout::late_by`), so a retry wait, a rate-limit wait
/// and a cooldown wait of exactly the time left are taken, and the call
/// succeeds at the deadline. (A retry gave up, and a rate limiter and a
/// cooldown refused, one nanosecond early.)
#[test]
fn a_wait_that_ends_at_the_deadline_fits() {
    let limiters = one_per_250ms();
    let mut variants = Vec::new();
    for offset in [Duration::ZERO, FAR] {
        for flavor in FLAVORS {
            for listener in [false, true] {
                variants.push((offset, flavor, listener));
            }
        }
    }
    each_variant(&variants, |(offset, flavor, listener)| {
        // A retry: three failures a second apart, the fourth attempt at
        // the overall deadline of 3 s.
        let clock = clock_at(offset);
        let p = listen(
            Pipeline::builder(unique("reg-wait-deadline-retry"))
                .timeout(secs(3))
                .retry(Retry::constant(secs(1)).max_attempts(6))
                .clock(clock.clone()),
            listener,
        )
        .build()
        .unwrap();
        let c = clock.clone();
        let r = exec(&p, flavor, move |ctx| {
            if ctx.attempt() <= 3 {
                Err(Boom(ctx.attempt()))
            } else {
                Ok((ctx.attempt(), c.now() - offset))
            }
        });
        ensure(matches!(r, Ok((4, t)) if t == secs(3)), || {
            format!("retry: {r:?}")
        })?;

        // A rate limiter: the second permit is due at the deadline.
        for (name, limiter) in &limiters {
            let clock = clock_at(offset);
            let p = listen(
                Pipeline::builder(unique("reg-wait-deadline-rl"))
                    .timeout(ms(250))
                    .rate_limiter(limiter.clone().max_wait(ms(250)))
                    .clock(clock.clone()),
                listener,
            )
            .build()
            .unwrap();
            let c = clock.clone();
            let op = move |_: Context| Ok::<_, Boom>(c.now() - offset);
            let first = exec(&p, flavor, op.clone());
            let second = exec(&p, flavor, op);
            ensure(
                matches!(first, Ok(t) if t.is_zero()) && matches!(second, Ok(t) if t == ms(250)),
                || format!("{name}: first {first:?}, second {second:?}"),
            )?;
        }

        // A cooldown of 200 ms, and a call with 200 ms left.
        let clock = clock_at(offset);
        let p = listen(
            Pipeline::builder(unique("reg-wait-deadline-cd"))
                .timeout(ms(200))
                .cooldown(Cooldown::new().max_wait(ms(250)))
                .classify(|_: &Boom| Verdict::throttled().with_retry_after(ms(200)))
                .clock(clock.clone()),
            listener,
        )
        .build()
        .unwrap();
        let first = exec(&p, flavor, |_| Err::<Duration, _>(Boom(1)));
        let c = clock.clone();
        let second = exec(&p, flavor, move |_| Ok::<_, Boom>(c.now() - offset));
        ensure(
            matches!(first, Err(Error::Operation(Boom(1))))
                && matches!(second, Ok(t) if t == ms(200)),
            || format!("cooldown: first {first:?}, second {second:?}"),
        )
    });
}

/// A breaker declared before the retry records the failure of a call whose
/// attempts failed and whose next attempt seawall refused (the retry
/// budget, a rate limiter after the retry): it stayed closed, blind, while
/// every call reached the dependency once and failed. A call refused
/// before any attempt ran still records nothing.
#[test]
fn a_call_refused_after_a_failed_attempt_is_a_failure_of_the_call() {
    let mut variants = Vec::new();
    for offset in [Duration::ZERO, FAR] {
        for flavor in FLAVORS {
            for listener in [false, true] {
                for case in 0..2 {
                    variants.push((offset, flavor, listener, case));
                }
            }
        }
    }
    each_variant(&variants, |(offset, flavor, listener, case)| {
        let clock = clock_at(offset);
        let b = Pipeline::builder(unique("reg-refused-after-failure"))
            .circuit_breaker(CircuitBreaker::consecutive_failures(3).cooldown(secs(30)));
        let b = match case {
            // The budget runs dry at once: every call's retry is refused.
            0 => b.retry(
                Retry::constant(ms(1))
                    .max_attempts(3)
                    .budget(RetryBudget::new(0.01, 1)),
            ),
            // Seven permits, one an attempt: calls 1 and 2 take three
            // each (exhausted), call 3 the last, its retry refused.
            _ => b
                .retry(Retry::constant(ms(1)).max_attempts(3))
                .rate_limiter(RateLimiter::fixed_window(7, secs(3600))),
        };
        let p = listen(b.store(MemoryStore::new()).clock(clock.clone()), listener)
            .build()
            .unwrap();
        let mut ran = 0;
        let mut results = Vec::new();
        for _ in 0..4 {
            results.push(exec(&p, flavor, |_| {
                ran += 1;
                Err::<u32, _>(Boom(1))
            }));
        }
        let state = p.circuit_state().unwrap();
        let last = rejection_of(&results[3]);
        ensure(
            state == CircuitState::Open
                && matches!(last, Ok(r) if r.reason == RejectionReason::CircuitOpen),
            || format!("state {state:?} after {ran} attempts; results {results:?}"),
        )?;
        // Refused before any attempt: nothing recorded.
        let p = listen(
            Pipeline::builder(unique("reg-refused-before-attempt"))
                .circuit_breaker(CircuitBreaker::consecutive_failures(1))
                .retry(Retry::constant(ms(1)).max_attempts(2))
                .rate_limiter(RateLimiter::fixed_window(1, secs(3600)))
                .store(MemoryStore::new())
                .clock(clock.clone()),
            listener,
        )
        .build()
        .unwrap();
        let first = exec(&p, flavor, |_| Ok::<u32, Boom>(1));
        let refused = exec(&p, flavor, |_| Ok::<u32, Boom>(2));
        let m = p.circuit_metrics().unwrap();
        ensure(
            matches!(first, Ok(1))
                && matches!(rejection_of(&refused), Ok(r) if r.reason == RejectionReason::RateLimited)
                && m.state == CircuitState::Closed
                && m.failures == 0,
            || format!("{first:?}, {refused:?}, {m:?}"),
        )
    });
}

// The cooldown branch has the same shape: a call deferred by a cooldown
// that a hint extends while it waits must not wait past `max_wait` in all.
#[test]
fn cooldown_max_wait_is_exceeded_under_contention() {
    let variants = [(Duration::ZERO, false), (FAR, false), (FAR, true)];
    each_variant(&variants, |(offset, listener)| {
        let clock = clock_at(offset);
        let p = listen(
            Pipeline::builder(unique("reg-cd-wait"))
                .cooldown(Cooldown::new().max_wait(ms(250)))
                .classify(|_: &Boom| Verdict::throttled().with_retry_after(ms(200)))
                .store(MemoryStore::new())
                .clock(clock.clone()),
            listener,
        )
        .build()
        .unwrap();
        let ran = Arc::new(Mutex::new(Vec::new()));
        let one = |task: u32, fail: bool| {
            let (p, c, ran) = (&p, clock.clone(), ran.clone());
            async move {
                let r = p
                    .run(|_| {
                        ran.lock().unwrap().push((task, c.now() - offset));
                        async move {
                            if fail {
                                Err(Boom(task))
                            } else {
                                Ok(task)
                            }
                        }
                    })
                    .await;
                (r, c.now() - offset)
            }
        };
        // A opens a 200 ms pause; B and C wait for it; B runs at 200 ms and
        // opens another 200 ms pause; C has waited 200 ms of its 250.
        let (a, b, c) =
            rt().block_on(async { tokio::join!(one(1, true), one(2, true), one(3, false)) });
        let ran = ran.lock().unwrap().clone();
        ensure(
            matches!(a.0, Err(Error::Operation(Boom(1))))
                && matches!(b.0, Err(Error::Operation(Boom(2)))),
            || format!("A {a:?}, B {b:?}"),
        )?;
        let r = rejection_of(&c.0).map_err(|e| {
            format!(
                "C: {e}, ended {:?} after the start; operations ran at {ran:?}",
                c.1
            )
        })?;
        // C is refused at once when it sees the second pause, which outlasts
        // what remains of its max_wait.
        ensure(
            r.reason == RejectionReason::CooldownActive
                && r.retry_after == Some(ms(200))
                && c.1 == ms(200)
                && ran.len() == 2,
            || format!("C: {r:?} at {:?}; operations ran at {ran:?}", c.1),
        )
    });
}

// ------------------------------------------------------------------------
// The end of a breaker's cooldown is kept in 42 bits of milliseconds and
// saturated to a moment already past: saturation must land on the safe
// side, without overflow or panic near `u64::MAX` nanoseconds.

const TOP: Duration = Duration::from_nanos(u64::MAX);
const TOP_OF_42_BITS_MS: Duration = Duration::from_millis(1 << 42);

#[test]
fn cooldown_end_saturates_to_a_moment_already_past_near_the_top_of_the_clock() {
    // (where the clock is when the circuit trips, how long after the trip
    // the circuit must still be open)
    let cases: Vec<(Duration, Duration)> = vec![
        (TOP_OF_42_BITS_MS - secs(10), secs(20)),
        (TOP_OF_42_BITS_MS + secs(1), secs(29)),
        (secs(5_000_000_000), secs(29)),
        (TOP - secs(60), secs(29)),
        (TOP - secs(1), ms(900)),
    ];
    let variants: Vec<(Flavor, usize, bool)> = FLAVORS
        .into_iter()
        .flat_map(|f| (0..cases.len()).flat_map(move |i| [(f, i, true), (f, i, false)]))
        .collect();
    each_variant(&variants, |(flavor, i, listener)| {
        let (at, still_open) = cases[i];
        let clock = clock_at(at);
        let p = listen(
            Pipeline::builder(unique("reg-top"))
                .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(30)))
                .store(MemoryStore::new())
                .clock(clock.clone()),
            listener,
        )
        .build()
        .unwrap();
        let _ = exec(&p, flavor, |_| Err::<u32, _>(Boom(1)));
        let first = exec(&p, flavor, |_| Ok::<u32, Boom>(1));
        let r = rejection_of(&first).map_err(|e| format!("right after the trip at {at:?}: {e}"))?;
        ensure(r.reason == RejectionReason::CircuitOpen, || {
            format!("{r:?}")
        })?;
        clock.advance(still_open);
        let later = exec(&p, flavor, |_| Ok::<u32, Boom>(2));
        rejection_of(&later)
            .map(|_| ())
            .map_err(|e| format!("{still_open:?} after the trip at {at:?}: {e}"))
    });
}

// A cooldown opened by a hint and a timeout near the top of the clock
// neither overflow nor panic.
#[test]
fn cooldown_and_timeout_near_the_top_of_the_clock_do_not_panic() {
    let variants: Vec<(Flavor, bool)> = FLAVORS
        .into_iter()
        .flat_map(|f| [(f, false), (f, true)])
        .collect();
    each_variant(&variants, |(flavor, listener)| {
        let clock = clock_at(TOP - secs(1));
        let p = listen(
            Pipeline::builder(unique("reg-top-cd"))
                .timeout(secs(5))
                .cooldown(Cooldown::new())
                .classify(|_: &Boom| Verdict::throttled().with_retry_after(secs(60)))
                .store(MemoryStore::new())
                .clock(clock.clone()),
            listener,
        )
        .build()
        .unwrap();
        let ok = exec(&p, flavor, |_| Ok::<u32, Boom>(1));
        ensure(matches!(ok, Ok(1)), || format!("a success: {ok:?}"))?;
        let _ = exec(&p, flavor, |_| Err::<u32, _>(Boom(1)));
        // The pause lasts to the end of the clock's range, where the
        // call's deadline saturates too: the call waits for it (a wait that
        // ends at the deadline fits) and runs at the last instant, on time.
        let c = clock.clone();
        let next = exec(&p, flavor, |_| Ok::<_, Boom>(c.now()));
        ensure(matches!(next, Ok(t) if t == TOP), || format!("{next:?}"))
    });
}

// ------------------------------------------------------------------------
// The sync engine reads the clock twice for one fact: the event said
// Success while the decision said Timeout.

#[test]
fn sync_engine_reads_the_clock_twice_for_one_fact() {
    each_variant(&[Duration::ZERO, FAR], |offset| {
        let clock = TickingClock::default();
        clock.inner.advance(offset);
        let (log, l) = recorder();
        let p = Pipeline::builder(unique("reg-two-reads"))
            .timeout(Timeout::strict(ms(100)))
            .clock(clock.clone())
            .on_event(l)
            .build()
            .unwrap();
        let (inner, armed) = (clock.inner.clone(), clock.armed.clone());
        let result = p.call(|ctx| {
            // The operation ends 1 ns before its deadline; from here on
            // every reading of the clock is 1 ns later than the one before.
            let deadline = ctx.deadline().expect("a deadline");
            inner.advance(deadline - inner.now() - Duration::from_nanos(1));
            armed.store(true, Ordering::SeqCst);
            Ok::<u32, Boom>(1)
        });
        clock.armed.store(false, Ordering::SeqCst);
        let outcomes: Vec<AttemptOutcome> = log
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                EventKind::AttemptFinished { outcome, .. } => Some(*outcome),
                _ => None,
            })
            .collect();
        let expected = match &result {
            Ok(_) => AttemptOutcome::Success,
            Err(Error::Timeout(_)) => AttemptOutcome::Timeout,
            other => return Err(format!("unexpected result {other:?}")),
        };
        ensure(outcomes == vec![expected], || {
            format!("the call returned {result:?} but the attempt was reported as {outcomes:?}")
        })
    });
}

// ------------------------------------------------------------------------
// A rejection from a nested pipeline was retried by the outer one.

#[test]
fn nested_pipeline_rejection_is_retried_by_the_outer_pipeline() {
    let variants: Vec<(Flavor, bool)> = FLAVORS
        .into_iter()
        .flat_map(|f| [(f, false), (f, true)])
        .collect();
    each_variant(&variants, |(flavor, listener)| {
        let clock = clock_at(FAR);
        let store = MemoryStore::new();
        let inner = listen(
            Pipeline::builder(unique("reg-nested-inner"))
                .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(60)))
                .store(store.clone())
                .clock(clock.clone()),
            listener,
        )
        .build()
        .unwrap();
        let outer = listen(
            Pipeline::builder(unique("reg-nested-outer"))
                .retry(Retry::constant(ms(10)).max_attempts(3))
                .store(store)
                .clock(clock.clone()),
            listener,
        )
        .build()
        .unwrap();
        inner.isolate().unwrap();
        let start = clock.now();
        let calls = AtomicU32::new(0);
        let result: Result<u32, Error<Error<Boom>>> = match flavor {
            Flavor::Sync => outer.call(|_| {
                calls.fetch_add(1, Ordering::SeqCst);
                inner.call(|_| Ok::<u32, Boom>(1))
            }),
            Flavor::Async => rt().block_on(outer.run(|_| {
                calls.fetch_add(1, Ordering::SeqCst);
                let inner = &inner;
                async move { inner.run(|_| async { Ok::<u32, Boom>(1) }).await }
            })),
        };
        let calls = calls.load(Ordering::SeqCst);
        let carried = match &result {
            Err(Error::Rejected(r)) => Some(r.reason),
            Err(Error::Operation(e)) => e.rejection().map(|r| r.reason),
            _ => None,
        };
        ensure(
            calls == 1 && carried == Some(RejectionReason::CircuitOpen) && clock.now() == start,
            || {
                format!(
                    "the operation ran {calls} time(s), {:?} of retry waits, result {result:?}; \
                     expected one run and the inner rejection",
                    clock.now() - start
                )
            },
        )
    });
}

// ------------------------------------------------------------------------
// A call refused while the circuit is half-open carried no retry_after.

#[test]
fn half_open_refusal_carries_no_retry_after() {
    let variants: Vec<(Flavor, bool)> = FLAVORS
        .into_iter()
        .flat_map(|f| [(f, false), (f, true)])
        .collect();
    each_variant(&variants, |(flavor, listener)| {
        let clock = clock_at(FAR);
        let p = listen(
            Pipeline::builder(unique("reg-half-open-hint"))
                .circuit_breaker(
                    CircuitBreaker::consecutive_failures(1)
                        .cooldown(secs(30))
                        .half_open_calls(1),
                )
                .store(MemoryStore::new())
                .clock(clock.clone()),
            listener,
        )
        .build()
        .unwrap();
        let _ = exec(&p, flavor, |_| Err::<u32, _>(Boom(1)));
        clock.advance(secs(30));
        // While the only probe runs, another call is refused.
        let refused: Result<Result<u32, Error<Boom>>, Error<Boom>> = match flavor {
            Flavor::Sync => p.call(|_| Ok(p.call(|_| Ok::<u32, Boom>(2)))),
            Flavor::Async => rt()
                .block_on(p.run(|_| async { Ok(p.run(|_| async { Ok::<u32, Boom>(2) }).await) })),
        };
        let refused = refused.map_err(|e| format!("the probe: {e:?}"))?;
        let r = rejection_of(&refused)?;
        ensure(
            r.reason == RejectionReason::CircuitOpen && r.retry_after.is_some(),
            || {
                format!(
                    "refused while half-open with {r:?}; expected CircuitOpen with a retry_after"
                )
            },
        )
    });
}

// ------------------------------------------------------------------------
// `circuit_metrics()` in half-open showed the frozen window that opened
// the circuit and never counted probes.

#[test]
fn circuit_metrics_in_half_open_show_the_window_that_opened_it() {
    let variants: Vec<(Flavor, bool)> = FLAVORS
        .into_iter()
        .flat_map(|f| [(f, false), (f, true)])
        .collect();
    each_variant(&variants, |(flavor, listener)| {
        let clock = clock_at(FAR);
        let p = listen(
            Pipeline::builder(unique("reg-half-open-metrics"))
                .circuit_breaker(
                    CircuitBreaker::failure_rate(0.5)
                        .count_window(4)
                        .minimum_calls(4)
                        .cooldown(secs(30))
                        .half_open_calls(2),
                )
                .store(MemoryStore::new())
                .clock(clock.clone()),
            listener,
        )
        .build()
        .unwrap();
        for _ in 0..4 {
            let _ = exec(&p, flavor, |_| Err::<u32, _>(Boom(1)));
        }
        let m = p.circuit_metrics().unwrap();
        ensure(
            m.state == CircuitState::Open && m.calls == 4 && m.failures == 4,
            || format!("after four failures: {m:?}"),
        )?;
        clock.advance(secs(30));
        let mut during = None;
        let probe = exec(&p, flavor, |_| {
            during = Some(p.circuit_metrics().unwrap());
            Ok::<u32, Boom>(1)
        });
        ensure(matches!(probe, Ok(1)), || format!("first probe: {probe:?}"))?;
        let during = during.unwrap();
        ensure(
            during.state == CircuitState::HalfOpen && during.calls == 0 && during.failures == 0,
            || format!("on entering half-open: {during:?}; expected 0 calls and 0 failures"),
        )?;
        let m = p.circuit_metrics().unwrap();
        ensure(
            m.state == CircuitState::HalfOpen && m.calls == 1 && m.failures == 0,
            || format!("after one successful probe: {m:?}; expected 1 call, 0 failures"),
        )?;
        let probe = exec(&p, flavor, |_| Ok::<u32, Boom>(2));
        ensure(matches!(probe, Ok(2)), || {
            format!("second probe: {probe:?}")
        })?;
        let m = p.circuit_metrics().unwrap();
        ensure(
            m.state == CircuitState::Closed && m.calls == 0 && m.failures == 0,
            || format!("after closing: {m:?}; expected a fresh window"),
        )
    });
}

// ------------------------------------------------------------------------
// Error messages did not name the resource, and `Display` of
// `Error::Operation` embedded the inner error that `source()` also
// returned, so reports printed it twice.

/// The error and its sources, as `anyhow` prints them with `{:#}`.
fn report(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[test]
fn error_messages_do_not_name_the_resource() {
    let variants: Vec<(Flavor, bool)> = FLAVORS
        .into_iter()
        .flat_map(|f| [(f, false), (f, true)])
        .collect();
    each_variant(&variants, |(flavor, listener)| {
        let clock = clock_at(FAR);
        let p = listen(
            Pipeline::builder("users-api")
                .timeout(Timeout::strict(secs(5)))
                .store(MemoryStore::new())
                .clock(clock.clone()),
            listener,
        )
        .build()
        .unwrap();
        let err = match flavor {
            Flavor::Sync => p
                .call(|_| {
                    clock.advance(secs(6));
                    Ok::<u32, Boom>(1)
                })
                .unwrap_err(),
            Flavor::Async => rt()
                .block_on(p.run(|_| async {
                    std::future::pending::<()>().await;
                    Ok::<u32, Boom>(1)
                }))
                .unwrap_err(),
        };
        ensure(err.is_timeout(), || format!("{err:?}"))?;
        let text = err.to_string();
        ensure(text.starts_with("users-api: "), || {
            format!("the timeout reads {text:?}; expected it to start with \"users-api: \"")
        })
    });
}

#[test]
fn rejection_messages_do_not_name_the_resource() {
    each_variant(&FLAVORS, |flavor| {
        let p = Pipeline::builder("users-api")
            .circuit_breaker(CircuitBreaker::consecutive_failures(1))
            .store(MemoryStore::new())
            .clock(clock_at(FAR))
            .build()
            .unwrap();
        p.isolate().unwrap();
        let err = exec(&p, flavor, |_| Ok::<u32, Boom>(1)).unwrap_err();
        ensure(err.is_rejected(), || format!("{err:?}"))?;
        let text = err.to_string();
        ensure(text.starts_with("users-api: "), || {
            format!("the rejection reads {text:?}; expected it to start with \"users-api: \"")
        })
    });
}

#[test]
fn error_display_and_source_print_the_inner_error_twice() {
    let cases = ["operation", "retry_exhausted"];
    let variants: Vec<(Flavor, &str)> = FLAVORS
        .into_iter()
        .flat_map(|f| cases.into_iter().map(move |c| (f, c)))
        .collect();
    each_variant(&variants, |(flavor, case)| {
        let builder = Pipeline::builder("users-api")
            .store(MemoryStore::new())
            .clock(clock_at(FAR));
        let builder = match case {
            "operation" => builder,
            _ => builder.retry(Retry::constant(ms(1)).max_attempts(2)),
        };
        let p = builder.build().unwrap();
        let err = exec(&p, flavor, |_| Err::<u32, _>(Boom(7))).unwrap_err();
        let full = report(&err);
        let times = full.matches("boom 7").count();
        ensure(times == 1, || {
            format!("{err:?} reports as {full:?}: the inner error appears {times} times")
        })
    });
}

// ------------------------------------------------------------------------
// `FallbackExecuted` was emitted after the sync handler ran.

#[test]
fn fallback_executed_is_emitted_after_the_sync_handler() {
    #[derive(Debug, Clone, Copy)]
    enum Case {
        SyncHandlerCall,
        SyncHandlerRun,
        AsyncHandlerRun,
    }
    let variants = [
        Case::SyncHandlerCall,
        Case::SyncHandlerRun,
        Case::AsyncHandlerRun,
    ];
    each_variant(&variants, |case| {
        let order: Arc<Mutex<Vec<&'static str>>> = Arc::default();
        let o = order.clone();
        let builder = Pipeline::builder(unique("reg-fallback-order"))
            .store(MemoryStore::new())
            .clock(clock_at(FAR))
            .on_event(move |e| {
                if e.kind == EventKind::FallbackExecuted {
                    o.lock().unwrap().push("event");
                }
            });
        let o = order.clone();
        let result = match case {
            Case::SyncHandlerCall | Case::SyncHandlerRun => {
                let p = builder
                    .fallback_sync(move |_: Error<Boom>, _| {
                        o.lock().unwrap().push("handler");
                        Ok::<u32, Boom>(0)
                    })
                    .build()
                    .unwrap();
                match case {
                    Case::SyncHandlerCall => p.call(|_| Err(Boom(1))),
                    _ => rt().block_on(p.run(|_| async { Err(Boom(1)) })),
                }
            }
            Case::AsyncHandlerRun => {
                let p = builder
                    .fallback(move |_: Error<Boom>, _| {
                        let o = o.clone();
                        async move {
                            o.lock().unwrap().push("handler");
                            Ok::<u32, Boom>(0)
                        }
                    })
                    .build()
                    .unwrap();
                rt().block_on(p.run(|_| async { Err(Boom(1)) }))
            }
        };
        let order = order.lock().unwrap().clone();
        ensure(
            matches!(result, Ok(0)) && order == ["event", "handler"],
            || format!("result {result:?}, order {order:?}; expected the event before the handler"),
        )
    });
}

// ------------------------------------------------------------------------
// An invalid configuration panicked in `build()` instead of failing it.

#[test]
fn invalid_config_panics_in_build_with_a_huge_timeout_and_a_bulkhead() {
    #[derive(Debug, Clone, Copy)]
    enum Case {
        Overall,
        PerAttempt,
    }
    each_variant(&[Case::Overall, Case::PerAttempt], |case| {
        let built = catch_unwind(|| {
            let b = Pipeline::builder(unique("reg-huge-timeout")).store(MemoryStore::new());
            let b = match case {
                Case::Overall => b.timeout(Duration::MAX),
                Case::PerAttempt => b.retry(Retry::constant(ms(1))).timeout(Duration::MAX),
            };
            b.bulkhead(Bulkhead::new(2)).build().map(|_| ())
        });
        match built {
            Ok(Err(e)) => ensure(!e.field.is_empty() && !e.rule.is_empty(), || {
                format!("{e:?}")
            }),
            Ok(Ok(())) => {
                Err("built a pipeline whose bulkhead lease cannot exceed its timeout".into())
            }
            Err(p) => Err(format!("build() panicked: {}", panic_text(&p))),
        }
    });
}

/// Every numeric and duration field of every policy, at its extremes:
/// `build()` returns a pipeline or a `ConfigError`, never panics.
#[test]
fn invalid_config_panics_in_build_on_extreme_values() {
    let durations = [
        Duration::ZERO,
        Duration::from_nanos(1),
        ms(1),
        Duration::from_nanos(u64::MAX),
        Duration::MAX,
    ];
    let counts = [0u32, 1, 2, u32::MAX];
    let rates = [0.0, 0.5, 1.0, 1.5, -1.0, f64::NAN, f64::INFINITY, f64::MAX];
    type Make = Box<dyn Fn(PipelineBuilder) -> PipelineBuilder>;
    let mut cases: Vec<(String, Make)> = Vec::new();
    for d in durations {
        cases.push((
            format!("retry constant {d:?}"),
            Box::new(move |b| b.retry(Retry::constant(d))),
        ));
        cases.push((
            format!("retry linear {d:?}"),
            Box::new(move |b| b.retry(Retry::linear(d).cap(d))),
        ));
        cases.push((
            format!("retry exponential {d:?}"),
            Box::new(move |b| b.retry(Retry::exponential(d))),
        ));
        cases.push((
            format!("retry exponential cap {d:?}"),
            Box::new(move |b| b.retry(Retry::exponential(ms(1)).cap(d))),
        ));
        cases.push((
            format!("retry decorrelated {d:?}"),
            Box::new(move |b| b.retry(Retry::decorrelated(d, d))),
        ));
        cases.push((format!("timeout {d:?}"), Box::new(move |b| b.timeout(d))));
        cases.push((
            format!("attempt timeout {d:?}"),
            Box::new(move |b| b.retry(Retry::constant(ms(1))).timeout(d)),
        ));
        cases.push((
            format!("breaker cooldown {d:?}"),
            Box::new(move |b| {
                b.circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(d))
            }),
        ));
        cases.push((
            format!("breaker growth max {d:?}"),
            Box::new(move |b| {
                b.circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown_growth(2.0, d))
            }),
        ));
        cases.push((
            format!("breaker window {d:?}"),
            Box::new(move |b| b.circuit_breaker(CircuitBreaker::failure_rate(0.5).window(d))),
        ));
        cases.push((
            format!("breaker slow {d:?}"),
            Box::new(move |b| {
                b.circuit_breaker(CircuitBreaker::failure_rate(0.5).slow_calls(0.5, d))
            }),
        ));
        cases.push((
            format!("bulkhead lease {d:?}"),
            Box::new(move |b| b.bulkhead(Bulkhead::new(1).lease(d))),
        ));
        cases.push((
            format!("bulkhead queue wait {d:?}"),
            Box::new(move |b| b.bulkhead(Bulkhead::new(1).queue(1, d))),
        ));
        cases.push((
            format!("bulkhead lease {d:?} with timeout {d:?}"),
            Box::new(move |b| b.timeout(d).bulkhead(Bulkhead::new(1).lease(d))),
        ));
        cases.push((
            format!("cooldown max_pause {d:?}"),
            Box::new(move |b| b.cooldown(Cooldown::new().max_pause(d))),
        ));
        cases.push((
            format!("cooldown max_wait {d:?}"),
            Box::new(move |b| b.cooldown(Cooldown::new().max_wait(d))),
        ));
        cases.push((
            format!("cooldown grace {d:?}"),
            Box::new(move |b| b.cooldown(Cooldown::new().grace(d))),
        ));
        for make in [
            RateLimiter::gcra,
            RateLimiter::fixed_window,
            RateLimiter::sliding_window,
        ] {
            cases.push((
                format!("rate period {d:?} ({:?})", make(1, d).algorithm),
                Box::new(move |b| b.rate_limiter(make(1, d))),
            ));
            cases.push((
                format!("rate max_wait {d:?} ({:?})", make(1, ms(1)).algorithm),
                Box::new(move |b| b.rate_limiter(make(1, secs(1)).max_wait(d))),
            ));
        }
        cases.push((
            format!("partition_idle {d:?}"),
            Box::new(move |b| b.partition_idle(d)),
        ));
    }
    for n in counts {
        cases.push((
            format!("retry max_attempts {n}"),
            Box::new(move |b| b.retry(Retry::constant(ms(1)).max_attempts(n))),
        ));
        cases.push((
            format!("budget tokens {n}"),
            Box::new(move |b| b.retry(Retry::constant(ms(1)).budget(RetryBudget::new(0.1, n)))),
        ));
        cases.push((
            format!("breaker consecutive {n}"),
            Box::new(move |b| b.circuit_breaker(CircuitBreaker::consecutive_failures(n))),
        ));
        cases.push((
            format!("breaker count_window {n}"),
            Box::new(move |b| b.circuit_breaker(CircuitBreaker::failure_rate(0.5).count_window(n))),
        ));
        cases.push((
            format!("breaker minimum_calls {n}"),
            Box::new(move |b| {
                b.circuit_breaker(CircuitBreaker::failure_rate(0.5).minimum_calls(n))
            }),
        ));
        cases.push((
            format!("breaker half_open_calls {n}"),
            Box::new(move |b| {
                b.circuit_breaker(CircuitBreaker::consecutive_failures(1).half_open_calls(n))
            }),
        ));
        cases.push((
            format!("bulkhead max_concurrent {n}"),
            Box::new(move |b| b.bulkhead(Bulkhead::new(n))),
        ));
        cases.push((
            format!("bulkhead max_queued {n}"),
            Box::new(move |b| b.bulkhead(Bulkhead::new(1).queue(n, ms(1)))),
        ));
        for make in [
            RateLimiter::gcra,
            RateLimiter::fixed_window,
            RateLimiter::sliding_window,
        ] {
            cases.push((
                format!("rate limit {n} ({:?})", make(1, ms(1)).algorithm),
                Box::new(move |b| b.rate_limiter(make(n, secs(1)))),
            ));
            cases.push((
                format!("rate limit {n} per MAX ({:?})", make(1, ms(1)).algorithm),
                Box::new(move |b| b.rate_limiter(make(n, Duration::MAX))),
            ));
        }
        cases.push((
            format!("gcra burst {n}"),
            Box::new(move |b| b.rate_limiter(RateLimiter::gcra(10, secs(1)).burst(n))),
        ));
    }
    for r in rates {
        cases.push((
            format!("retry multiplier {r}"),
            Box::new(move |b| b.retry(Retry::exponential(ms(1)).multiplier(r))),
        ));
        cases.push((
            format!("retry jitter {r}%"),
            Box::new(move |b| b.retry(Retry::constant(ms(1)).jitter(Jitter::Proportional(r)))),
        ));
        cases.push((
            format!("budget ratio {r}"),
            Box::new(move |b| b.retry(Retry::constant(ms(1)).budget(RetryBudget::new(r, 10)))),
        ));
        cases.push((
            format!("breaker failure_rate {r}"),
            Box::new(move |b| b.circuit_breaker(CircuitBreaker::failure_rate(r))),
        ));
        cases.push((
            format!("breaker slow rate {r}"),
            Box::new(move |b| {
                b.circuit_breaker(CircuitBreaker::failure_rate(0.5).slow_calls(r, secs(1)))
            }),
        ));
        cases.push((
            format!("breaker growth {r}"),
            Box::new(move |b| {
                b.circuit_breaker(
                    CircuitBreaker::consecutive_failures(1).cooldown_growth(r, secs(60)),
                )
            }),
        ));
    }
    let panicked: Vec<String> = cases
        .iter()
        .filter_map(|(name, make)| {
            let built = catch_unwind(AssertUnwindSafe(|| {
                make(Pipeline::builder(unique("reg-extreme")).store(MemoryStore::new()))
                    .build()
                    .map(|_| ())
            }));
            built.err().map(|p| format!("{name}: {}", panic_text(&p)))
        })
        .collect();
    assert!(
        panicked.is_empty(),
        "build() panicked on {} of {} configurations:\n  {}",
        panicked.len(),
        cases.len(),
        panicked.join("\n  ")
    );
}

// ------------------------------------------------------------------------
// An async retry with a zero delay never yielded to the runtime.

/// Attempts after which the operation of the two tests below succeeds, so
/// that a run of the defect ends (in about a second) instead of spinning.
const GUARD: u64 = 2_000_000;

fn zero_delay_pipeline() -> Pipeline {
    Pipeline::builder(unique("reg-zero-delay"))
        .retry(Retry::constant(Duration::ZERO).max_attempts(u32::MAX))
        .store(MemoryStore::new())
        .build()
        .unwrap()
}

async fn fail_until_guard(p: &Pipeline, calls: &AtomicU64) -> Result<u64, Error<Boom>> {
    p.run(|_| {
        let n = calls.fetch_add(1, Ordering::Relaxed) + 1;
        async move {
            if n >= GUARD {
                Ok(n)
            } else {
                Err(Boom(0))
            }
        }
    })
    .await
}

#[test]
fn async_retry_with_zero_delay_never_yields_to_a_surrounding_timeout() {
    let p = zero_delay_pipeline();
    let calls = AtomicU64::new(0);
    let started = Instant::now();
    let result =
        rt().block_on(async { tokio::time::timeout(ms(50), fail_until_guard(&p, &calls)).await });
    let took = started.elapsed();
    let calls = calls.load(Ordering::Relaxed);
    assert!(
        result.is_err() && took < ms(500),
        "a 50 ms timeout around a zero-delay retry returned {result:?} after {took:?} and {calls} \
         attempts; expected it to fire in time"
    );
}

#[test]
fn async_retry_with_zero_delay_and_u32_max_attempts_cannot_be_cancelled() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let p = zero_delay_pipeline();
    let calls = Arc::new(AtomicU64::new(0));
    let (outcome, took) = runtime.block_on({
        let calls = calls.clone();
        async move {
            let task = tokio::spawn(async move { fail_until_guard(&p, &calls).await });
            // Let it start spinning, then cancel it.
            tokio::time::sleep(ms(20)).await;
            let asked = Instant::now();
            task.abort();
            let outcome = tokio::time::timeout(secs(5), task).await;
            (outcome, asked.elapsed())
        }
    });
    let calls = calls.load(Ordering::Relaxed);
    let cancelled = matches!(&outcome, Ok(Err(e)) if e.is_cancelled());
    assert!(
        cancelled && took < ms(500),
        "the task ended with {outcome:?} {took:?} after it was aborted, after {calls} attempts; \
         expected it to be cancelled at its next attempt"
    );
}

/// The config loader, on every numeric and duration value of the complete
/// example file replaced by extremes: it loads or returns a `LoadError`,
/// never panics.
#[cfg(feature = "serde")]
#[test]
fn invalid_config_panics_in_the_config_loader_on_extreme_values() {
    use seawall::config::{Format, Registry};
    let text = include_str!("fixtures/seawall.toml");
    // Where each value after an `=` starts and ends, and whether it is a
    // duration string or a bare number.
    let mut slots = Vec::new();
    for (eq, _) in text.match_indices('=') {
        let start = eq + 1 + text[eq + 1..].len() - text[eq + 1..].trim_start().len();
        let rest = &text[start..];
        if let Some(inner) = rest.strip_prefix('"') {
            let end = inner.find('"').unwrap();
            let value = &inner[..end];
            let digits = value.trim_end_matches(|c: char| c.is_ascii_alphabetic());
            if !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()) && digits != value {
                slots.push((start, start + end + 2, true));
            }
        } else if rest.starts_with(|c: char| c.is_ascii_digit() || c == '-') {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || "+-.".contains(c)))
                .unwrap_or(rest.len());
            slots.push((start, start + end, false));
        }
    }
    assert!(
        slots.len() > 30,
        "found only {} values to mutate",
        slots.len()
    );
    let durations = [
        "\"0s\"",
        "\"1ns\"",
        "\"18446744073709551615s\"",
        "\"584942417355years\"",
        "\"1000000000000000h\"",
    ];
    let numbers = [
        "0",
        "-1",
        "0.5",
        "4294967295",
        "4294967296",
        "18446744073709551615",
        "1e308",
        "nan",
        "inf",
    ];
    let mut panicked = Vec::new();
    let mut tried = 0;
    for &(start, end, is_duration) in &slots {
        let values: &[&str] = if is_duration { &durations } else { &numbers };
        for value in values {
            tried += 1;
            let mutated = format!("{}{}{}", &text[..start], value, &text[end..]);
            let loaded = catch_unwind(AssertUnwindSafe(|| {
                Registry::builder()
                    .store(MemoryStore::new())
                    .load_str(Format::Toml, &mutated)
                    .map(|_| ())
            }));
            if let Err(p) = loaded {
                let line = text[..start].lines().count();
                let original = &text[start..end];
                panicked.push(format!(
                    "line {line}: {original} -> {value}: {}",
                    panic_text(&p)
                ));
            }
        }
    }
    assert!(
        panicked.is_empty(),
        "the loader panicked on {} of {tried} files:\n  {}",
        panicked.len(),
        panicked.join("\n  ")
    );
}

// An unpartitioned sliding window whose calls never wait kept its log in
// whole microseconds, rounded up, while a partitioned one or one whose calls
// may wait kept nanoseconds: a call exactly one period after a call logged
// at 1 ns was refused, told to retry after 999 ns. Every sliding log keeps
// its times to the nanosecond now.

/// Where a sliding window keeps its log: unpartitioned (the lock-free
/// ring), unpartitioned with calls that may wait (a locked log), or under a
/// partition key.
#[derive(Debug, Clone, Copy, PartialEq)]
enum SlidingLog {
    Ring,
    Waiting,
    Partitioned,
}

/// The end of the clock's range less 10 s, to the nanosecond.
const NEAR_THE_END: Duration = Duration::from_nanos(u64::MAX - 10_000_000_000);

#[test]
fn a_sliding_window_decides_on_nanoseconds_wherever_it_keeps_its_log() {
    let mut variants = Vec::new();
    for log in [
        SlidingLog::Ring,
        SlidingLog::Waiting,
        SlidingLog::Partitioned,
    ] {
        for flavor in FLAVORS {
            for listener in [false, true] {
                for offset in [Duration::ZERO, FAR, NEAR_THE_END] {
                    variants.push((log, flavor, listener, offset));
                }
            }
        }
    }
    each_variant(&variants, |(log, flavor, listener, offset)| {
        let clock = clock_at(offset + Duration::from_nanos(1));
        let limiter = RateLimiter::sliding_window(1, ms(100));
        let limiter = if log == SlidingLog::Waiting {
            limiter.max_wait(ms(100))
        } else {
            limiter
        };
        let p = listen(
            Pipeline::builder(unique("reg-sliding-ns"))
                .store(MemoryStore::new())
                .clock(clock.clone())
                .rate_limiter(limiter),
            listener,
        )
        .build()
        .unwrap();
        let call = || {
            let op = |_: Context| Ok::<_, Boom>(());
            match (log, flavor) {
                (SlidingLog::Partitioned, Flavor::Sync) => p.partition(7u64).call(op),
                (SlidingLog::Partitioned, Flavor::Async) => {
                    rt().block_on(p.partition(7u64).run(|ctx| std::future::ready(op(ctx))))
                }
                _ => exec(&p, flavor, op),
            }
        };
        // Logged at 1 ns, then exactly one period later: admitted.
        ensure(call().is_ok(), || "the first call".into())?;
        clock.advance(ms(100));
        let second = call();
        ensure(second.is_ok(), || format!("one period later: {second:?}"))?;
        // 1 ns short of the next period: refused, told to retry after
        // 1 ns (a call that may wait waits exactly that long).
        clock.advance(ms(100) - Duration::from_nanos(1));
        let before = clock.now();
        let third = call();
        if log == SlidingLog::Waiting {
            ensure(third.is_ok(), || format!("the waiting call: {third:?}"))?;
            ensure(clock.now() - before == Duration::from_nanos(1), || {
                format!("waited {:?}", clock.now() - before)
            })?;
        } else {
            let r = rejection_of(&third)?;
            ensure(r.retry_after == Some(Duration::from_nanos(1)), || {
                format!("retry after {:?}", r.retry_after)
            })?;
        }
        Ok(())
    });
}

// Weighted calls on an unpartitioned sliding window whose calls never wait
// took their permits one at a time after one check: under contention a
// call could be refused after taking some of them, and those stayed spent.
// A weighted call now claims all its permits at once or none, as GCRA and
// the fixed window always did.

#[test]
fn weighted_calls_under_contention_take_all_their_permits_or_none() {
    let limiters = [
        RateLimiter::sliding_window(10, secs(3_600)),
        RateLimiter::fixed_window(10, secs(3_600)),
        RateLimiter::gcra(10, secs(3_600)),
    ];
    let mut variants = Vec::new();
    for which in 0..limiters.len() {
        for flavor in FLAVORS {
            for listener in [false, true] {
                for offset in [Duration::ZERO, FAR] {
                    variants.push((which, flavor, listener, offset));
                }
            }
        }
    }
    each_variant(&variants, |(which, flavor, listener, offset)| {
        for round in 0..50 {
            let clock = clock_at(offset);
            let p = listen(
                Pipeline::builder(unique("reg-weighted-contention"))
                    .store(MemoryStore::new())
                    .clock(clock.clone())
                    .rate_limiter(limiters[which].clone()),
                listener,
            )
            .build()
            .unwrap();
            let granted = AtomicU32::new(0);
            let start = std::sync::Barrier::new(4);
            std::thread::scope(|scope| {
                for _ in 0..4 {
                    scope.spawn(|| {
                        let rt = rt();
                        start.wait();
                        for _ in 0..3 {
                            let w = p.weighted(3).unwrap();
                            let r = match flavor {
                                Flavor::Sync => w.call(|_| Ok::<_, Boom>(())),
                                Flavor::Async => {
                                    rt.block_on(w.run(|_| async { Ok::<_, Boom>(()) }))
                                }
                            };
                            if r.is_ok() {
                                granted.fetch_add(3, Ordering::Relaxed);
                            }
                        }
                    });
                }
            });
            let left = (0..11)
                .filter(|_| exec(&p, flavor, |_| Ok::<_, Boom>(())).is_ok())
                .count() as u32;
            let granted = granted.into_inner();
            ensure(granted + left == 10, || {
                format!("round {round}: {granted} permits granted, {left} left")
            })?;
        }
        Ok(())
    });
}

// ------------------------------------------------------------------------
// A queued call polled for a slot (1 ms doubling to 20 ms) instead of being
// handed it when it freed: it started up to 20 ms late, a later waiter could
// run before an earlier one, and a newcomer arriving as the slot freed took
// it ahead of a waiter queued long before. The bulkhead's queue and the
// adaptive limit's share the rule: a freed slot goes to the oldest waiter,
// at the same instant.

/// Which queue a test waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queued {
    Bulkhead,
    Adaptive,
}

/// A case of the queue tests: the queue, the clock's start, a listener.
type QueueCase = (Queued, Duration, bool);

fn queue_cases() -> Vec<QueueCase> {
    let mut cases = Vec::new();
    for which in [Queued::Bulkhead, Queued::Adaptive] {
        for offset in [Duration::ZERO, FAR] {
            for listener in [false, true] {
                cases.push((which, offset, listener));
            }
        }
    }
    cases
}

/// A pipeline of `slots` slots with a queue of `max_queued` calls waiting
/// `max_wait` at most, in `which`; with `pause`, a cooldown that a failure
/// opens for that long. Its events, when the case listens.
fn queued_pipeline(
    (which, _, listener): QueueCase,
    clock: &VirtualClock,
    slots: u32,
    max_queued: u32,
    max_wait: Duration,
    pause: Option<Duration>,
) -> (Pipeline<ErrorType<Boom>>, Log) {
    let mut b = Pipeline::builder(unique("reg-queue"));
    if pause.is_some() {
        b = b.cooldown(Cooldown::new());
    }
    b = match which {
        Queued::Bulkhead => b.bulkhead(Bulkhead::new(slots).queue(max_queued, max_wait)),
        Queued::Adaptive => b.adaptive_limit(
            AdaptiveLimit::aimd()
                .limits(slots, slots, slots)
                .queue(max_queued, max_wait),
        ),
    };
    let (log, l) = recorder();
    if listener {
        b = b.on_event(l);
    }
    let p = b
        .store(MemoryStore::new())
        .clock(clock.clone())
        .classify(move |_: &Boom| match pause {
            Some(pause) => Verdict::throttled().with_retry_after(pause),
            None => Verdict::failure(),
        })
        .build()
        .unwrap();
    (p, log)
}

/// What became of one call of a [`queue_plan`]: when its operation started
/// and when its result came, in milliseconds from the plan's start.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ran {
    name: &'static str,
    started: Option<u64>,
    ended: u64,
    refused: Option<RejectionReason>,
}

/// Runs calls `(name, arrives, holds)` concurrently on one thread: each
/// arrives `arrives` ms after the start and holds its slot `holds` ms. The
/// calls in the order their operations started, then those refused.
fn queue_plan(
    p: &Pipeline<ErrorType<Boom>>,
    clock: &VirtualClock,
    plan: &[(&'static str, u64, u64)],
) -> Vec<Ran> {
    let base = clock.now();
    let since = |c: &VirtualClock| (c.now() - base).as_millis() as u64;
    let order: Arc<Mutex<Vec<(&'static str, u64)>>> = Arc::default();
    let calls = plan.iter().map(|&(name, arrives, holds)| {
        let (p, clock, order) = (p.clone(), clock.clone(), order.clone());
        async move {
            Clock::sleep(&clock, ms(arrives)).await;
            let r = p
                .run(|_| {
                    let (clock, order) = (clock.clone(), order.clone());
                    async move {
                        order.lock().unwrap().push((name, since(&clock)));
                        Clock::sleep(&clock, ms(holds)).await;
                        Ok::<_, Boom>(())
                    }
                })
                .await;
            (
                name,
                r.err().map(|e| match e {
                    Error::Rejected(r) => r.reason,
                    other => panic!("{name}: {other:?}"),
                }),
                since(&clock),
            )
        }
    });
    let results = rt().block_on(futures_join_all(calls));
    let order = order.lock().unwrap().clone();
    let mut ran: Vec<Ran> = order
        .iter()
        .map(|&(name, started)| {
            let (_, refused, ended) = results.iter().find(|r| r.0 == name).unwrap();
            Ran {
                name,
                started: Some(started),
                ended: *ended,
                refused: *refused,
            }
        })
        .collect();
    for (name, refused, ended) in results {
        if !order.iter().any(|o| o.0 == name) {
            ran.push(Ran {
                name,
                started: None,
                ended,
                refused,
            });
        }
    }
    ran
}

/// Awaits every future, polled in the order given (no dependency on the
/// `futures` crate).
async fn futures_join_all<F: std::future::Future>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.map(|f| Some(Box::pin(f))).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for (f, out) in futures.iter_mut().zip(outputs.iter_mut()) {
            if let Some(fut) = f {
                if let std::task::Poll::Ready(v) = fut.as_mut().poll(cx) {
                    *out = Some(v);
                    *f = None;
                }
            }
        }
        if futures.iter().all(Option::is_none) {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    outputs.into_iter().map(Option::unwrap).collect()
}

fn started(ran: &[Ran]) -> Vec<(&'static str, Option<u64>)> {
    ran.iter().map(|r| (r.name, r.started)).collect()
}

#[test]
fn a_queued_call_starts_the_instant_the_slot_frees() {
    each_variant(&queue_cases(), |case| {
        let clock = clock_at(case.1);
        let (p, _) = queued_pipeline(case, &clock, 1, 1, secs(10), None);
        let ran = queue_plan(&p, &clock, &[("holder", 0, 1_000), ("waiter", 0, 0)]);
        ensure(
            started(&ran) == [("holder", Some(0)), ("waiter", Some(1_000))],
            || format!("{ran:?}"),
        )
    });
}

#[test]
fn queued_calls_start_oldest_first_whenever_the_slot_frees() {
    each_variant(&queue_cases(), |case| {
        for release in 4..=45 {
            let clock = clock_at(case.1);
            let (p, _) = queued_pipeline(case, &clock, 1, 2, secs(10), None);
            let ran = queue_plan(
                &p,
                &clock,
                &[("holder", 0, release), ("first", 0, 1), ("second", 3, 1)],
            );
            let expected = [
                ("holder", Some(0)),
                ("first", Some(release)),
                ("second", Some(release + 1)),
            ];
            ensure(started(&ran) == expected, || {
                format!("release at {release}: {ran:?}")
            })?;
        }
        Ok(())
    });
}

#[test]
fn a_newcomer_arriving_as_the_slot_frees_queues_behind_the_waiter() {
    each_variant(&queue_cases(), |case| {
        let clock = clock_at(case.1);
        let (p, _) = queued_pipeline(case, &clock, 1, 2, secs(10), None);
        let ran = queue_plan(
            &p,
            &clock,
            &[("holder", 0, 100), ("waiter", 1, 10), ("newcomer", 100, 10)],
        );
        let expected = [
            ("holder", Some(0)),
            ("waiter", Some(100)),
            ("newcomer", Some(110)),
        ];
        ensure(started(&ran) == expected, || format!("{ran:?}"))?;
        // With a queue of one, the newcomer finds it full and is refused.
        let clock = clock_at(case.1);
        let (p, _) = queued_pipeline(case, &clock, 1, 1, secs(10), None);
        let ran = queue_plan(
            &p,
            &clock,
            &[("holder", 0, 100), ("waiter", 1, 10), ("newcomer", 100, 10)],
        );
        let refused = match case.0 {
            Queued::Bulkhead => RejectionReason::BulkheadFull,
            Queued::Adaptive => RejectionReason::ConcurrencyLimited,
        };
        ensure(
            started(&ran)
                == [
                    ("holder", Some(0)),
                    ("waiter", Some(100)),
                    ("newcomer", None),
                ]
                && ran[2].refused == Some(refused)
                && ran[2].ended == 100,
            || format!("queue of one: {ran:?}"),
        )
    });
}

/// A blocking call never waits: while an async call waits for the slot
/// that just freed, the blocking call made at that instant is refused
/// instead of taking it.
#[test]
fn a_blocking_call_does_not_take_the_slot_handed_to_a_waiter() {
    each_variant(&queue_cases(), |case| {
        let clock = clock_at(case.1);
        let (p, _) = queued_pipeline(case, &clock, 1, 1, secs(10), None);
        let sync_result = Arc::new(Mutex::new(None));
        let (p2, c2, out) = (p.clone(), clock.clone(), sync_result.clone());
        let waiter_started = Arc::new(Mutex::new(None));
        let (p3, c3, w) = (p.clone(), clock.clone(), waiter_started.clone());
        let base = clock.now();
        rt().block_on(async move {
            let holder = async move {
                let _ = p2
                    .run(|_| {
                        let c2 = c2.clone();
                        async move {
                            Clock::sleep(&c2, ms(50)).await;
                            Ok::<_, Boom>(())
                        }
                    })
                    .await;
                // The slot was just given back and the waiter woken, not
                // yet run: a blocking call now finds the waiter ahead.
                *out.lock().unwrap() = Some(p2.call(|_| Ok::<_, Boom>(())));
            };
            let waiter = async move {
                Clock::sleep(&c3, ms(1)).await;
                p3.run(|_| {
                    *w.lock().unwrap() = Some(c3.now() - base);
                    async { Ok::<_, Boom>(()) }
                })
                .await
            };
            let (_, r) = tokio::join!(holder, waiter);
            r.unwrap();
        });
        let sync = sync_result.lock().unwrap().take().unwrap();
        let expected = match case.0 {
            Queued::Bulkhead => RejectionReason::BulkheadFull,
            Queued::Adaptive => RejectionReason::ConcurrencyLimited,
        };
        ensure(
            matches!(&sync, Err(Error::Rejected(r)) if r.reason == expected)
                && *waiter_started.lock().unwrap() == Some(ms(50)),
            || {
                format!(
                    "blocking call {sync:?}, waiter started at {:?}",
                    waiter_started.lock().unwrap()
                )
            },
        )
    });
}

#[test]
fn a_dropped_waiter_passes_its_turn_to_the_next() {
    each_variant(&queue_cases(), |case| {
        for drop_at in [99, 100, 101] {
            let clock = clock_at(case.1);
            let (p, _) = queued_pipeline(case, &clock, 1, 2, secs(10), None);
            let base = clock.now();
            let second_started = Arc::new(Mutex::new(None));
            let (p1, c1) = (p.clone(), clock.clone());
            let (p2, c2) = (p.clone(), clock.clone());
            let (p3, c3, s) = (p.clone(), clock.clone(), second_started.clone());
            let (holder, first, second) = rt().block_on(async move {
                let holder = p1.run(|_| {
                    let c1 = c1.clone();
                    async move {
                        Clock::sleep(&c1, ms(100)).await;
                        Ok::<_, Boom>(())
                    }
                });
                let first = async move {
                    let run = p2.run(|_| async { Ok::<_, Boom>("first ran") });
                    tokio::select! {
                        biased;
                        r = run => Some(r),
                        () = Clock::sleep(&c2, ms(drop_at)) => None,
                    }
                };
                let second = async move {
                    Clock::sleep(&c3, ms(1)).await;
                    p3.run(|_| {
                        *s.lock().unwrap() = Some(c3.now() - base);
                        async { Ok::<_, Boom>(()) }
                    })
                    .await
                };
                tokio::join!(holder, first, second)
            });
            holder.unwrap();
            second.map_err(|e| format!("dropped at {drop_at}: second: {e:?}"))?;
            let second_at = second_started.lock().unwrap().unwrap();
            // The first waiter ran when the slot freed at 100 ms, unless it
            // was dropped first; the second starts then or at once after.
            let expected = match &first {
                Some(Ok(_)) => ms(100),
                None => ms(100),
                Some(Err(e)) => return Err(format!("first: {e:?}")),
            };
            ensure(second_at == expected, || {
                format!("dropped at {drop_at}: first {first:?}, second started at {second_at:?}")
            })?;
            // Nothing is left behind: a blocking call is admitted at once.
            ensure(p.call(|_| Ok::<_, Boom>(())).is_ok(), || {
                format!("dropped at {drop_at}: a place was left in the queue")
            })?;
        }
        Ok(())
    });
}

#[test]
fn many_queued_calls_start_in_the_order_they_arrived() {
    each_variant(&queue_cases(), |case| {
        let clock = clock_at(case.1);
        let (p, _) = queued_pipeline(case, &clock, 1, 40, secs(100), None);
        let names: Vec<&'static str> = (0..40)
            .map(|i| &*Box::leak(format!("w{i:02}").into_boxed_str()))
            .collect();
        let mut plan = vec![("holder", 0, 100)];
        plan.extend(names.iter().enumerate().map(|(i, n)| (*n, i as u64 + 1, 5)));
        let ran = queue_plan(&p, &clock, &plan);
        let mut expected = vec![("holder", Some(0))];
        expected.extend(
            names
                .iter()
                .enumerate()
                .map(|(i, n)| (*n, Some(100 + 5 * i as u64))),
        );
        ensure(started(&ran) == expected, || format!("{ran:?}"))
    });
}

// ------------------------------------------------------------------------
// The bulkhead queue's `max_wait` counted the time a call spent waiting
// for other policies (a cooldown): the call was refused 20 ms after it
// joined the queue instead of 100 ms.

#[test]
fn the_queue_wait_counts_from_joining_the_queue() {
    each_variant(&queue_cases(), |case| {
        let clock = clock_at(case.1);
        let (p, log) = queued_pipeline(case, &clock, 1, 4, ms(100), Some(ms(80)));
        // An 80 ms pause.
        let r = rt().block_on(p.run(|_| async { Err::<(), _>(Boom(1)) }));
        ensure(r.is_err(), || format!("{r:?}"))?;
        // Two calls wait it out; at 80 ms one takes the slot for 150 ms,
        // the other queues and may wait there 100 ms: until 180 ms.
        let ran = queue_plan(&p, &clock, &[("first", 0, 150), ("second", 0, 0)]);
        let refused = match case.0 {
            Queued::Bulkhead => RejectionReason::BulkheadFull,
            Queued::Adaptive => RejectionReason::ConcurrencyLimited,
        };
        ensure(
            started(&ran) == [("first", Some(80)), ("second", None)]
                && ran[1].refused == Some(refused)
                && ran[1].ended == 180,
            || format!("{ran:?}"),
        )?;
        if case.2 {
            let deferred: Vec<_> = log
                .lock()
                .unwrap()
                .iter()
                .filter(|k| matches!(k, EventKind::Deferred { reason, .. } if *reason == refused))
                .cloned()
                .collect();
            ensure(
                deferred
                    == [EventKind::Deferred {
                        reason: refused,
                        wait: ms(100),
                    }],
                || format!("{deferred:?}"),
            )?;
        }
        Ok(())
    });
}

/// Many tasks on several threads queue, run, give slots back and drop
/// their calls at once: the slots are never exceeded, no wake-up is lost
/// (no call waits its `max_wait` out: none is refused), and no place is
/// left behind (a blocking call is admitted at once after).
#[test]
fn many_tasks_queue_without_losing_a_wake_up_or_a_place() {
    #[derive(Debug, Clone, Copy)]
    enum Shape {
        Bulkhead,
        Partitioned,
        Adaptive,
    }
    let variants: Vec<(Shape, bool)> = [Shape::Bulkhead, Shape::Partitioned, Shape::Adaptive]
        .into_iter()
        .flat_map(|s| [(s, false), (s, true)])
        .collect();
    struct Out<'a>(&'a AtomicU32);
    impl Drop for Out<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
    each_variant(&variants, |(shape, listener)| {
        const SLOTS: u32 = 3;
        const TASKS: u32 = 48;
        let b = Pipeline::builder(unique("reg-queue-many"));
        let b = match shape {
            Shape::Bulkhead | Shape::Partitioned => {
                b.bulkhead(Bulkhead::new(SLOTS).queue(TASKS, secs(30)))
            }
            Shape::Adaptive => b.adaptive_limit(
                AdaptiveLimit::aimd()
                    .limits(SLOTS, SLOTS, SLOTS)
                    .queue(TASKS, secs(30)),
            ),
        };
        let p = listen(b.store(MemoryStore::new()), listener)
            .build()
            .unwrap();
        let keys = ["a", "b", "c"];
        let busy: Arc<Vec<AtomicU32>> =
            Arc::new((0..keys.len()).map(|_| AtomicU32::new(0)).collect());
        let peak = Arc::new(AtomicU32::new(0));
        let refused = Arc::new(AtomicU32::new(0));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_time()
            .build()
            .unwrap();
        let started = Instant::now();
        rt.block_on(async {
            let tasks: Vec<_> = (0..TASKS)
                .map(|t| {
                    let (p, busy, peak, refused) =
                        (p.clone(), busy.clone(), peak.clone(), refused.clone());
                    tokio::spawn(async move {
                        for i in 0..15u32 {
                            let k = ((t + i) % 3) as usize;
                            let counter = match shape {
                                Shape::Partitioned => k,
                                _ => 0,
                            };
                            let op = |_ctx: Context| {
                                let (busy, peak) = (busy.clone(), peak.clone());
                                async move {
                                    let now = busy[counter].fetch_add(1, Ordering::SeqCst) + 1;
                                    peak.fetch_max(now, Ordering::SeqCst);
                                    // Counted out even when the call is dropped.
                                    let _out = Out(&busy[counter]);
                                    tokio::task::yield_now().await;
                                    if (t * 7 + i) % 5 == 0 {
                                        tokio::time::sleep(Duration::from_micros(200)).await;
                                    }
                                    Ok::<_, Boom>(())
                                }
                            };
                            let call = async {
                                match shape {
                                    Shape::Partitioned => p.partition(keys[k]).run(op).await,
                                    _ => p.run(op).await,
                                }
                            };
                            let r = if (t + 3 * i) % 4 == 0 {
                                // Dropped while it runs or waits, at times.
                                match tokio::time::timeout(Duration::from_micros(150), call).await {
                                    Ok(r) => r,
                                    Err(_) => continue,
                                }
                            } else {
                                call.await
                            };
                            if r.is_err() {
                                refused.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        });
        let elapsed = started.elapsed();
        ensure(peak.load(Ordering::SeqCst) <= SLOTS, || {
            format!("{} slots taken at once", peak.load(Ordering::SeqCst))
        })?;
        ensure(refused.load(Ordering::SeqCst) == 0, || {
            format!(
                "{} calls refused after {elapsed:?}: a wake-up was lost",
                refused.load(Ordering::SeqCst)
            )
        })?;
        for key in keys {
            let sync = match shape {
                Shape::Partitioned => p.partition(key).call(|_| Ok::<_, Boom>(())),
                _ => p.call(|_| Ok::<_, Boom>(())),
            };
            ensure(sync.is_ok(), || {
                format!("{key}: a place was left behind: {sync:?}")
            })?;
        }
        Ok(())
    });
}

/// A pipeline with a retry budget kept in the store takes the full
/// admission for every attempt: the adaptive limit was never asked there,
/// so it limited nothing (every call ran, none refused, the limit's count
/// of calls in flight stayed 0).
#[test]
fn a_retry_budget_in_the_store_keeps_the_adaptive_limit() {
    for offset in [Duration::ZERO, FAR] {
        for listener in [false, true] {
            let clock = clock_at(offset);
            let p = listen(
                Pipeline::builder(unique("reg-budget-adaptive"))
                    .retry(
                        Retry::constant(ms(1))
                            .max_attempts(2)
                            .budget(RetryBudget::new(0.1, 10).shared()),
                    )
                    .adaptive_limit(AdaptiveLimit::aimd().limits(1, 1, 1))
                    .store(MemoryStore::new())
                    .clock(clock.clone()),
                listener,
            )
            .build()
            .unwrap();
            let c = clock.clone();
            let (first, second, in_flight) = rt().block_on(async {
                let held = p.run(|_| {
                    let c = c.clone();
                    async move {
                        Clock::sleep(&c, ms(10)).await;
                        Ok::<u32, Boom>(1)
                    }
                });
                let other = async {
                    Clock::sleep(&c, ms(1)).await;
                    let in_flight = p.concurrency_limit().unwrap().in_flight;
                    (p.run(|_| async { Ok::<u32, Boom>(2) }).await, in_flight)
                };
                let (first, (second, in_flight)) = tokio::join!(held, other);
                (first, second, in_flight)
            });
            assert!(matches!(first, Ok(1)), "{offset:?} {listener}: {first:?}");
            assert_eq!(in_flight, 1, "{offset:?} {listener}");
            assert!(
                matches!(&second, Err(Error::Rejected(r)) if r.reason == RejectionReason::ConcurrencyLimited),
                "{offset:?} {listener}: {second:?}"
            );
            assert_eq!(p.concurrency_limit().unwrap().in_flight, 0);
        }
    }
}

/// The same, sync: a blocking call holding the adaptive limit's one slot
/// refuses a second one made meanwhile.
#[test]
fn a_retry_budget_in_the_store_keeps_the_adaptive_limit_sync() {
    for offset in [Duration::ZERO, FAR] {
        for listener in [false, true] {
            let p = listen(
                Pipeline::builder(unique("reg-budget-adaptive-sync"))
                    .retry(
                        Retry::constant(ms(1))
                            .max_attempts(2)
                            .budget(RetryBudget::new(0.1, 10).shared()),
                    )
                    .adaptive_limit(AdaptiveLimit::aimd().limits(1, 1, 1))
                    .store(MemoryStore::new())
                    .clock(clock_at(offset)),
                listener,
            )
            .build()
            .unwrap();
            let (entered, go) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
            let (entered_tx, entered_rx) = entered;
            let (go_tx, go_rx) = go;
            let holder = {
                let p = p.clone();
                std::thread::spawn(move || {
                    p.call(|_| {
                        entered_tx.send(()).unwrap();
                        go_rx.recv().unwrap();
                        Ok::<u32, Boom>(1)
                    })
                })
            };
            entered_rx.recv().unwrap();
            let in_flight = p.concurrency_limit().unwrap().in_flight;
            let second = p.call(|_| Ok::<u32, Boom>(2));
            go_tx.send(()).unwrap();
            let first = holder.join().unwrap();
            assert!(matches!(first, Ok(1)), "{offset:?} {listener}: {first:?}");
            assert_eq!(in_flight, 1, "{offset:?} {listener}");
            assert!(
                matches!(&second, Err(Error::Rejected(r)) if r.reason == RejectionReason::ConcurrencyLimited),
                "{offset:?} {listener}: {second:?}"
            );
            assert_eq!(p.concurrency_limit().unwrap().in_flight, 0);
        }
    }
}

// ------------------------------------------------------------------------
// An async operation that ran past its timeout inside its first poll (it
// blocked, or the clock moved while it ran) had its late result kept as a
// success; the same result after a yield was a timeout.

/// "A result is late when it arrives after the deadline ... in async and
/// sync code alike": a future that answers on its first poll 2 s after a
/// 1 s timeout began is a timeout, of the call and of an attempt alike;
/// one that answers at the deadline is on time.
#[test]
fn an_async_result_past_the_deadline_on_its_first_poll_is_late() {
    for offset in [Duration::ZERO, FAR] {
        for listener in [false, true] {
            for per_attempt in [false, true] {
                for (took, late) in [(secs(2), true), (secs(1), false)] {
                    let clock = clock_at(offset);
                    let b = Pipeline::builder(unique("reg-late-first-poll")).clock(clock.clone());
                    let b = if per_attempt {
                        b.retry(Retry::constant(ms(1)).max_attempts(1))
                            .timeout(secs(1))
                    } else {
                        b.timeout(secs(1))
                    };
                    let p = listen(b, listener).build().unwrap();
                    let c = clock.clone();
                    let r = rt().block_on(p.run(move |_| {
                        c.advance(took);
                        async { Ok::<u32, Boom>(7) }
                    }));
                    let what = format!("{offset:?} {listener} {per_attempt} {took:?}: {r:?}");
                    if late {
                        assert!(matches!(&r, Err(Error::Timeout(_))), "{what}");
                    } else {
                        assert!(matches!(&r, Ok(7)), "{what}");
                    }
                }
            }
        }
    }
}

// ------------------------------------------------------------------------
// A call refused at the admission of an attempt reported that attempt
// among those that ran (`CallFinished { attempts: 1 }` for a call whose
// operation never ran).

/// The `attempts` of the `CallFinished` event of a call ended by a
/// refusal at an attempt's admission: the attempts that ran before it.
#[test]
fn a_refused_attempt_is_not_counted_as_run() {
    let finished = |log: &Log| -> Vec<u32> {
        log.lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                EventKind::CallFinished { attempts, .. } => Some(*attempts),
                _ => None,
            })
            .collect()
    };
    for offset in [Duration::ZERO, FAR] {
        for flavor in FLAVORS {
            // Refused before any attempt ran: the window's one permit is taken.
            let clock = clock_at(offset);
            let (log, listener) = recorder();
            let p = Pipeline::builder(unique("reg-refused-count"))
                .store(MemoryStore::new())
                .clock(clock.clone())
                .retry(Retry::constant(ms(1)).max_attempts(3))
                .rate_limiter(RateLimiter::fixed_window(1, secs(3600)))
                .on_event(listener)
                .build()
                .unwrap();
            assert!(exec(&p, flavor, |_| Ok::<u32, Boom>(1)).is_ok());
            let mut ran = 0;
            let r = exec(&p, flavor, |_| {
                ran += 1;
                Ok::<u32, Boom>(2)
            });
            assert!(r.is_err() && ran == 0, "{offset:?} {flavor:?}: {r:?}");
            assert_eq!(finished(&log), vec![1, 0], "{offset:?} {flavor:?}");

            // Refused after one attempt ran and failed: one attempt.
            let clock = clock_at(offset);
            let (log, listener) = recorder();
            let p = Pipeline::builder(unique("reg-refused-count-2"))
                .store(MemoryStore::new())
                .clock(clock.clone())
                .retry(Retry::constant(ms(1)).max_attempts(3))
                .rate_limiter(RateLimiter::fixed_window(1, secs(3600)))
                .on_event(listener)
                .build()
                .unwrap();
            let r = exec(&p, flavor, |_| Err::<u32, Boom>(Boom(1)));
            assert!(r.is_err(), "{offset:?} {flavor:?}: {r:?}");
            assert_eq!(finished(&log), vec![1], "{offset:?} {flavor:?}");
        }
        // Hedging: the first attempt refused.
        let clock = clock_at(offset);
        let (log, listener) = recorder();
        let p = Pipeline::builder(unique("reg-refused-count-hedged"))
            .store(MemoryStore::new())
            .clock(clock.clone())
            .hedging(Hedging::latency(ms(10)).max_hedged_attempts(2))
            .rate_limiter(RateLimiter::fixed_window(1, secs(3600)))
            .on_event(listener)
            .build()
            .unwrap();
        assert!(exec(&p, Flavor::Async, |_| Ok::<u32, Boom>(1)).is_ok());
        let r = exec(&p, Flavor::Async, |_| Ok::<u32, Boom>(2));
        assert!(r.is_err(), "{offset:?}: {r:?}");
        assert_eq!(finished(&log), vec![1, 0], "{offset:?} hedged");

        // Refused by the policies guarding the whole call, retried or hedged.
        for hedged in [false, true] {
            let clock = clock_at(offset);
            let (log, listener) = recorder();
            let b = Pipeline::builder(unique("reg-refused-count-call"))
                .store(MemoryStore::new())
                .clock(clock.clone())
                .circuit_breaker(CircuitBreaker::consecutive_failures(1));
            let b = if hedged {
                b.hedging(Hedging::latency(ms(10)).max_hedged_attempts(2))
            } else {
                b.retry(Retry::constant(ms(1)).max_attempts(3))
            };
            let p = b.on_event(listener).build().unwrap();
            p.isolate().unwrap();
            let flavors: &[Flavor] = if hedged { &[Flavor::Async] } else { &FLAVORS };
            for &flavor in flavors {
                let r = exec(&p, flavor, |_| Ok::<u32, Boom>(1));
                assert!(r.is_err(), "{offset:?} {flavor:?} {hedged}: {r:?}");
            }
            assert!(
                finished(&log).iter().all(|&n| n == 0) && !finished(&log).is_empty(),
                "{offset:?} {hedged}: {:?}",
                finished(&log)
            );
        }
    }
}

// ------------------------------------------------------------------------
// A timeout of the whole call declared before a policy written in code
// around the call did not bound the policy: a policy still busy after its
// pass (on anything but its inner runs) kept the call running forever.

/// Runs what it wraps, then waits for something that never comes.
struct HangsAfterItsPass;

impl seawall::custom::Policy<u32, Boom> for HangsAfterItsPass {
    fn name(&self) -> &str {
        "hangs_after_its_pass"
    }
    fn position(&self) -> seawall::custom::Position {
        seawall::custom::Position::Call
    }
    fn call<'a>(
        &'a self,
        _ctx: Context,
        next: seawall::custom::Next<'a, u32, Boom>,
    ) -> seawall::custom::PolicyFuture<'a, u32, Boom> {
        Box::pin(async move {
            let r = next.run().await;
            std::future::pending::<()>().await;
            r
        })
    }
}

/// "A timeout declared before the policy bounds the policy and every pass
/// it makes through the rest of the call with one deadline": the call ends
/// with the timeout at the deadline, reported as such.
#[test]
fn a_timeout_before_a_call_policy_bounds_a_policy_that_hangs() {
    use std::future::Future;
    use std::task::{Context as TaskContext, Poll, Waker};
    for offset in [Duration::ZERO, FAR] {
        for listener in [false, true] {
            let clock = clock_at(offset);
            let (log, record) = recorder();
            let b = Pipeline::builder(unique("reg-call-policy-hangs"))
                .clock(clock.clone())
                .timeout(secs(1))
                .policy(HangsAfterItsPass);
            let b = if listener { b.on_event(record) } else { b };
            let p = b.build().unwrap();
            let mut call = Box::pin(p.run(|_| async { Ok::<u32, Boom>(1) }));
            let mut cx = TaskContext::from_waker(Waker::noop());
            // The virtual clock moves to the deadline once the timer is
            // polled again; a call the deadline does not bound stays pending.
            let ended = (0..10).find_map(|_| match call.as_mut().poll(&mut cx) {
                Poll::Ready(r) => Some(r),
                Poll::Pending => None,
            });
            let what = format!("{offset:?} {listener}: {ended:?}");
            match &ended {
                Some(Err(Error::Timeout(t))) => {
                    assert_eq!(t.after, secs(1), "{what}");
                    assert_eq!(t.attempts, 1, "{what}");
                }
                _ => panic!("{what}"),
            }
            assert_eq!(clock.now(), offset + secs(1), "{what}");
            if listener {
                let events = log.lock().unwrap().clone();
                assert!(
                    events.contains(&EventKind::TimedOut {
                        attempt: 1,
                        after: secs(1)
                    }),
                    "{what}: {events:?}"
                );
            }
        }
    }
}

// ------------------------------------------------------------------------
// `Context::is_expired` said `true` at the deadline itself, where a result
// is on time: an operation that checked it gave up on an answer the
// timeout would have kept.

/// An operation at its deadline finds its context not yet expired, and its
/// answer is kept (a strict timeout in sync code, the async timeout); one
/// nanosecond later the context is expired and the answer is late.
#[test]
fn a_context_at_its_deadline_is_not_expired() {
    for offset in [Duration::ZERO, FAR] {
        for listener in [false, true] {
            for (took, late) in [(ms(100), false), (ms(100) + Duration::from_nanos(1), true)] {
                let what = format!("{offset:?} {listener} {took:?}");
                let clock = clock_at(offset);
                let b = Pipeline::builder(unique("reg-expired-at-deadline"))
                    .clock(clock.clone())
                    .timeout(Timeout::strict(ms(100)));
                let p = listen(b, listener).build().unwrap();
                let c = clock.clone();
                let r = p.call(|ctx| {
                    c.advance(took);
                    Ok::<bool, Boom>(ctx.is_expired())
                });
                if late {
                    assert!(matches!(&r, Err(Error::Timeout(_))), "sync {what}: {r:?}");
                } else {
                    assert!(matches!(&r, Ok(false)), "sync {what}: {r:?}");
                }
                let c = clock.clone();
                let r = rt().block_on(p.run(move |ctx| {
                    c.advance(took);
                    let expired = ctx.is_expired();
                    async move { Ok::<bool, Boom>(expired) }
                }));
                if late {
                    assert!(matches!(&r, Err(Error::Timeout(_))), "async {what}: {r:?}");
                } else {
                    assert!(matches!(&r, Ok(false)), "async {what}: {r:?}");
                }
            }
        }
    }
}

/// A retry-after hint longer than an hour from a classifier of the user's
/// own is cut to [`MAX_RETRY_AFTER`](seawall::classify::MAX_RETRY_AFTER),
/// as the hints seawall parses are: the retry waits an hour, not the two
/// the hint asked for.
#[test]
fn a_classifier_hint_longer_than_an_hour_is_cut_to_an_hour() {
    let hour = Duration::from_secs(3600);
    for offset in [Duration::ZERO, FAR] {
        for flavor in FLAVORS {
            let (log, listener) = recorder();
            for listener in [None, Some(listener)] {
                let what = format!("{offset:?} {flavor:?} {}", listener.is_some());
                let clock = clock_at(offset);
                let mut b = Pipeline::builder(unique("reg-hint-cut"))
                    .clock(clock.clone())
                    .retry(Retry::constant(ms(5)).max_attempts(2))
                    .classify(|_: &Boom| Verdict::retry().with_retry_after(2 * 3600 * secs(1)));
                if let Some(l) = listener {
                    b = b.on_event(l);
                }
                let p = b.build().unwrap();
                let r = exec(&p, flavor, |_| Err::<(), _>(Boom(1)));
                assert!(
                    matches!(r, Err(Error::RetryExhausted { attempts: 2, .. })),
                    "{what}: {r:?}"
                );
                assert_eq!(clock.now() - offset, hour, "{what}");
            }
            assert!(log.lock().unwrap().contains(&EventKind::RetryScheduled {
                attempt: 1,
                delay: hour
            }));
        }
    }
    assert_eq!(
        Verdict::throttled()
            .with_retry_after(Duration::MAX)
            .retry_after(),
        Some(hour)
    );
}

/// A growing backoff (linear, exponential, decorrelated) with a zero base
/// retries at once, as a constant backoff of zero does: every delay is
/// zero, with or without jitter, on a clock far from its origin. It is a
/// valid setting (tests and in-process retries use it), so `build()` takes
/// it.
#[test]
fn a_growing_backoff_with_a_zero_base_retries_at_once() {
    let growing = [
        ("linear", Retry::linear(Duration::ZERO)),
        ("exponential", Retry::exponential(Duration::ZERO)),
        ("decorrelated", Retry::decorrelated(Duration::ZERO, secs(1))),
    ];
    for (kind, retry) in growing {
        for jitter in [Jitter::None, Jitter::Full, Jitter::Equal] {
            let clock = VirtualClock::new();
            clock.advance(Duration::from_secs(86_400 * 40));
            let start = clock.now();
            let p = Pipeline::builder(unique("reg-zero-base"))
                .clock(clock.clone())
                .retry(retry.clone().max_attempts(4).jitter(jitter))
                .build()
                .unwrap_or_else(|e| panic!("{kind} {jitter:?}: {e}"));
            let calls = AtomicU32::new(0);
            let r = p.call(|_| {
                calls.fetch_add(1, Ordering::Relaxed);
                Err::<(), _>(Boom(1))
            });
            assert!(
                matches!(r, Err(Error::RetryExhausted { attempts: 4, .. })),
                "{kind} {jitter:?}: {r:?}"
            );
            assert_eq!(calls.load(Ordering::Relaxed), 4, "{kind} {jitter:?}");
            assert_eq!(clock.now(), start, "{kind} {jitter:?}: a retry waited");
        }
    }
}

// An async call queued for a slot of the adaptive limit under a timeout of
// the whole call was refused (`concurrency_limited`) when the slot was
// given back at the very instant its deadline ran out, where the
// bulkhead's queue let it run: the queue's last look, taken when `max_wait`
// runs out, was not taken at the deadline. What happens at the deadline is
// on time.
#[test]
fn adaptive_queue_refused_a_slot_given_back_at_the_waiters_deadline() {
    let mut variants = Vec::new();
    for offset in [Duration::ZERO, FAR] {
        for listener in [false, true] {
            for adaptive in [true, false] {
                variants.push((offset, listener, adaptive));
            }
        }
    }
    each_variant(&variants, |(offset, listener, adaptive)| {
        let clock = clock_at(offset);
        let b = Pipeline::builder(unique("reg-queue-deadline"))
            .store(store::MemoryStore::new())
            .clock(clock.clone())
            .timeout(ms(100));
        let b = if adaptive {
            b.adaptive_limit(AdaptiveLimit::aimd().limits(1, 1, 2).queue(1, secs(10)))
        } else {
            b.bulkhead(Bulkhead::new(1).queue(1, secs(10)))
        };
        let p = listen(b, listener).build().unwrap();
        let (holder, waiter) = rt().block_on(async {
            tokio::join!(
                p.run(|_| {
                    let clock = clock.clone();
                    async move {
                        Clock::sleep(&clock, ms(100)).await;
                        Ok::<_, Boom>(1)
                    }
                }),
                p.run(|_| async { Ok::<_, Boom>(2) }),
            )
        });
        ensure(
            matches!((&holder, &waiter), (Ok(1), Ok(2))) && clock.now() - offset == ms(100),
            || format!("{holder:?}, {waiter:?} at {:?}", clock.now() - offset),
        )
    });
}

// A blocking call of a hedged pipeline with a cache was answered from the
// cache (or would follow a concurrent async call, or lead an execution
// whose `Error::Config` async followers then got), where the docs say a
// blocking call of a hedged pipeline returns `Error::Config` without
// running anything.
#[test]
fn blocking_call_of_a_hedged_pipeline_was_answered_from_the_cache() {
    let variants: Vec<(Duration, bool)> = [Duration::ZERO, FAR]
        .into_iter()
        .flat_map(|o| [(o, false), (o, true)])
        .collect();
    each_variant(&variants, |(offset, listener)| {
        let clock = clock_at(offset);
        let b = Pipeline::builder(unique("reg-hedged-cache"))
            .store(store::MemoryStore::new())
            .clock(clock.clone())
            .coalesce(Coalesce::new().ttl(secs(60)))
            .hedging(Hedging::latency(ms(10)));
        let p = listen(b, listener).build().unwrap();
        let led = rt().block_on(p.coalesce_key("k").run(|_| async { Ok::<u32, Boom>(1) }));
        let mut ran = 0;
        let blocking = p.coalesce_key("k").call(|_| {
            ran += 1;
            Ok::<u32, Boom>(2)
        });
        ensure(
            matches!(led, Ok(1)) && matches!(blocking, Err(Error::Config(_))) && ran == 0,
            || format!("{led:?}, {blocking:?}, ran {ran}"),
        )
    });
}
