//! Pipelines on a Redis store: async `run` and sync `call`, shared state
//! between stores, key layout and TTLs, permits given back on cancellation
//! and panic, leaked probes.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use seawall::store::{AdmitRequest, Outcome, Record, ResourceSpec};
use seawall::{
    Bulkhead, CircuitBreaker, CircuitState, Cooldown, Error, Pipeline, RateLimiter,
    RejectionReason, Retry, StateStore, Verdict,
};
use seawall_redis::RedisStore;

use crate::support::{rt, unique, RedisServer};

fn io(msg: &str) -> std::io::Error {
    std::io::Error::other(msg.to_owned())
}

#[test]
fn two_stores_share_one_circuit_async_and_sync() {
    let server = RedisServer::start();
    let prefix = unique("share");
    let store = |p: &str| {
        RedisStore::builder(server.url())
            .prefix(p)
            .fail_closed()
            .build()
            .unwrap()
    };
    let breaker = CircuitBreaker::consecutive_failures(2).cooldown(Duration::from_secs(30));
    // Two stores with their own connections stand for two processes.
    let a = Pipeline::builder("orders")
        .circuit_breaker(breaker.clone())
        .store(store(&prefix))
        .build()
        .unwrap();
    let b = Pipeline::builder("orders")
        .circuit_breaker(breaker)
        .store(store(&prefix))
        .build()
        .unwrap();

    let rt = rt();
    rt.block_on(async {
        for _ in 0..2 {
            let r: Result<(), _> = a.run(|_| async { Err(io("down")) }).await;
            assert!(matches!(r, Err(Error::Operation(_))), "{r:?}");
        }
    });
    assert_eq!(a.circuit_state().unwrap(), CircuitState::Open);
    assert_eq!(b.circuit_state().unwrap(), CircuitState::Open);
    let called = AtomicU32::new(0);
    let r = b.call(|_| {
        called.fetch_add(1, Ordering::Relaxed);
        Ok::<_, std::io::Error>(())
    });
    let rejection = r.unwrap_err();
    assert_eq!(
        rejection.rejection().map(|r| r.reason),
        Some(RejectionReason::CircuitOpen)
    );
    let retry_after = rejection.rejection().and_then(|r| r.retry_after).unwrap();
    // The end of a cooldown is kept in whole milliseconds, rounded up.
    assert!(
        retry_after > Duration::from_secs(29)
            && retry_after <= Duration::from_secs(30) + Duration::from_millis(1),
        "{retry_after:?}"
    );
    assert_eq!(
        called.load(Ordering::Relaxed),
        0,
        "the operation is not called"
    );

    // Another prefix is another world.
    let other = Pipeline::builder("orders")
        .circuit_breaker(CircuitBreaker::consecutive_failures(2))
        .store(store(&unique("other")))
        .build()
        .unwrap();
    assert_eq!(other.circuit_state().unwrap(), CircuitState::Closed);

    b.reset().unwrap();
    assert_eq!(a.circuit_state().unwrap(), CircuitState::Closed);
    assert_eq!(a.call(|_| Ok::<_, std::io::Error>(5)).unwrap(), 5);
    assert_eq!(
        rt.block_on(b.run(|_| async { Ok::<_, std::io::Error>(6) }))
            .unwrap(),
        6
    );
}

#[test]
fn full_chain_runs_sync_and_async_with_partitions() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique("chain"))
        .fail_closed()
        .build()
        .unwrap();
    let p = Pipeline::builder("search")
        .retry(Retry::constant(Duration::from_millis(1)).max_attempts(3))
        .circuit_breaker(
            CircuitBreaker::failure_rate(0.5)
                .count_window(20)
                .minimum_calls(10),
        )
        .timeout(Duration::from_secs(1))
        .bulkhead(Bulkhead::new(4).lease(Duration::from_secs(5)))
        .cooldown(Cooldown::new())
        .rate_limiter(RateLimiter::sliding_window(1000, Duration::from_secs(1)))
        .store(store)
        .build()
        .unwrap();
    let mut tries = 0;
    let n = p
        .call(|_| {
            tries += 1;
            if tries < 3 {
                Err(io("flaky"))
            } else {
                Ok(tries)
            }
        })
        .unwrap();
    assert_eq!(n, 3);
    let m = p.circuit_metrics().unwrap();
    assert_eq!((m.calls, m.failures), (3, 2));
    assert_eq!(p.in_flight().unwrap(), 0);

    let rt = rt();
    let tenant = p.partition("tenant-1");
    let v = rt
        .block_on(tenant.run(|ctx| async move { Ok::<_, std::io::Error>(ctx.attempt()) }))
        .unwrap();
    assert_eq!(v, 1);
    assert_eq!(tenant.in_flight().unwrap(), 0);
    assert_eq!(tenant.circuit_metrics().unwrap().calls, 1);
    assert_eq!(
        p.circuit_metrics().unwrap().calls,
        3,
        "the partition has its own window"
    );
}

#[test]
fn every_key_has_a_ttl_and_one_hash_tag() {
    let server = RedisServer::start();
    let prefix = unique("ttl");
    let store = RedisStore::builder(server.url())
        .prefix(&prefix)
        .fail_closed()
        .build()
        .unwrap();
    let specs = [
        ResourceSpec::new("a")
            .with_circuit(
                CircuitBreaker::failure_rate(0.5)
                    .count_window(10)
                    .minimum_calls(2),
            )
            .with_bulkhead(Bulkhead::new(3))
            .with_cooldown(Cooldown::new())
            .with_rate_limit(RateLimiter::sliding_window(10, Duration::from_secs(1))),
        ResourceSpec::new("b")
            .with_circuit(
                CircuitBreaker::failure_rate(0.5)
                    .window(Duration::from_secs(5))
                    .minimum_calls(2),
            )
            .with_rate_limit(RateLimiter::fixed_window(10, Duration::from_secs(1))),
        ResourceSpec::new("c")
            .with_circuit(CircuitBreaker::consecutive_failures(1))
            .with_rate_limit(RateLimiter::gcra(10, Duration::from_secs(1))),
    ];
    let key = seawall::PartitionKey::from("t:1");
    for spec in &specs {
        let r = store.bind(spec).unwrap();
        for partition in [None, Some(&key)] {
            for outcome in [Outcome::Failure, Outcome::Success, Outcome::Failure] {
                let now = Duration::ZERO;
                if let Ok(permit) = r
                    .admit(&AdmitRequest {
                        partition,
                        now,
                        weight: 1,
                        budget: None,
                        shadowed: false,
                    })
                    .unwrap()
                    .decision
                {
                    r.record(&Record {
                        partition,
                        permit,
                        outcome,
                        duration: Duration::ZERO,
                        retry_after: Some(Duration::from_millis(1)),
                        now,
                    })
                    .unwrap();
                }
            }
            // An admission that half-opens nothing, and one left in flight.
            let _ = r
                .admit(&AdmitRequest {
                    partition,
                    now: Duration::ZERO,
                    weight: 1,
                    budget: None,
                    shadowed: false,
                })
                .unwrap();
        }
    }
    let mut conn = server.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    assert!(keys.len() >= 12, "{keys:?}");
    for k in &keys {
        let pttl: i64 = redis::cmd("PTTL").arg(k).query(&mut conn).unwrap();
        assert!(pttl > 0, "{k} has no TTL ({pttl})");
        assert!(k.starts_with(&format!("{{{prefix}:")), "{k}");
        let tag = &k[..=k.find('}').unwrap()];
        assert!(
            [
                format!("{{{prefix}:a}}"),
                format!("{{{prefix}:a:s:t%3A1}}"),
                format!("{{{prefix}:b}}"),
                format!("{{{prefix}:b:s:t%3A1}}"),
                format!("{{{prefix}:c}}"),
                format!("{{{prefix}:c:s:t%3A1}}")
            ]
            .contains(&tag.to_owned()),
            "{k}"
        );
    }
}

#[test]
fn cancelled_and_panicked_attempts_give_their_slot_back() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique("cancel"))
        .fail_closed()
        .build()
        .unwrap();
    let p = Pipeline::builder("slow")
        .bulkhead(Bulkhead::new(1).lease(Duration::from_secs(30)))
        .store(store)
        .build()
        .unwrap();

    // Async: the caller drops the future mid-operation; the release runs in
    // the background on the runtime.
    let rt = rt();
    rt.block_on(async {
        let call = p.run(|_| async {
            tokio::time::sleep(Duration::from_secs(10)).await;
            Ok::<_, std::io::Error>(())
        });
        assert!(tokio::time::timeout(Duration::from_millis(100), call)
            .await
            .is_err());
        let deadline = Instant::now() + Duration::from_secs(2);
        while p.in_flight().unwrap() != 0 {
            assert!(Instant::now() < deadline, "slot not given back");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        p.run(|_| async { Ok::<_, std::io::Error>(()) })
            .await
            .unwrap();
    });

    // Sync: the operation panics; the slot is given back during unwinding.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = p.call(|_| -> Result<(), std::io::Error> { panic!("boom") });
    }));
    assert!(panicked.is_err());
    assert_eq!(p.in_flight().unwrap(), 0);
    p.call(|_| Ok::<_, std::io::Error>(())).unwrap();
}

#[test]
fn a_probe_that_never_reports_is_replaced_after_the_probe_lease() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique("probe"))
        .probe_lease(Duration::from_millis(300))
        .fail_closed()
        .build()
        .unwrap();
    let spec = ResourceSpec::new("probed")
        .with_circuit(CircuitBreaker::consecutive_failures(1).cooldown(Duration::from_millis(100)));
    let r = store.bind(&spec).unwrap();
    let admit = || {
        r.admit(&AdmitRequest {
            partition: None,
            now: Duration::ZERO,
            weight: 1,
            budget: None,
            shadowed: false,
        })
        .unwrap()
    };
    let p = admit().decision.unwrap();
    let rec = |permit, outcome| {
        r.record(&Record {
            partition: None,
            permit,
            outcome,
            duration: Duration::ZERO,
            retry_after: None,
            now: Duration::ZERO,
        })
        .unwrap()
    };
    assert!(rec(p, Outcome::Failure).transition.is_some());
    std::thread::sleep(Duration::from_millis(120));
    let lost = admit().decision.unwrap();
    assert!(lost.probe, "half-open probe");
    // Its process dies: no record, no release.
    assert!(admit().decision.is_err(), "the probe slot is taken");
    std::thread::sleep(Duration::from_millis(320));
    let fresh = admit().decision.unwrap();
    assert!(fresh.probe && fresh.generation != lost.generation);
    // The lost probe reporting late changes nothing.
    assert_eq!(rec(lost, Outcome::Failure).transition, None);
    assert_eq!(
        rec(fresh, Outcome::Success).transition,
        Some(seawall::breaker::CircuitTransition::Closed)
    );
}

#[test]
fn a_cooldown_hint_pauses_other_stores_calls() {
    let server = RedisServer::start();
    let prefix = unique("cooldown");
    let build = || {
        Pipeline::builder("rate-limited-api")
            .cooldown(Cooldown::new().max_wait(Duration::ZERO))
            .classify(|_: &std::io::Error| {
                Verdict::failure().with_retry_after(Duration::from_secs(20))
            })
            .store(
                RedisStore::builder(server.url())
                    .prefix(&prefix)
                    .fail_closed()
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap()
    };
    let (a, b) = (build(), build());
    let r = a.call(|_| Err::<(), _>(io("429")));
    assert!(matches!(r, Err(Error::Operation(_))));
    let r = b.call(|_| Ok::<_, std::io::Error>(()));
    let rejection = r.unwrap_err();
    let rejection = rejection.rejection().unwrap();
    assert_eq!(rejection.reason, RejectionReason::CooldownActive);
    assert!(rejection.retry_after.unwrap() > Duration::from_secs(19));
}

/// Regression: a Lua number such as 100000000 may reach Redis 7 as
/// `1e+08`; a slot stored under that name was never given back.
#[test]
fn slot_ids_with_trailing_zeros_are_given_back() {
    let server = RedisServer::start();
    let prefix = unique("zeros");
    let store = RedisStore::builder(server.url())
        .prefix(&prefix)
        .time_source(seawall_redis::TimeSource::Caller)
        // Each success sent at once, so that the server shows its effect.
        .success_delay(Duration::ZERO)
        .fail_closed()
        .build()
        .unwrap();
    let r = store
        .bind(
            &ResourceSpec::new("round")
                .with_bulkhead(Bulkhead::new(1).lease(Duration::from_secs(30))),
        )
        .unwrap();
    // Slots are named after the microsecond they were taken in.
    let now = Duration::from_secs(100);
    let permit = r
        .admit(&AdmitRequest {
            partition: None,
            now,
            weight: 1,
            budget: None,
            shadowed: false,
        })
        .unwrap()
        .decision
        .unwrap();
    assert_eq!(permit.slot, Some(100_000_000));
    r.record(&Record {
        partition: None,
        permit,
        outcome: Outcome::Success,
        duration: Duration::ZERO,
        retry_after: None,
        now,
    })
    .unwrap();
    assert_eq!(r.in_flight(None, now).unwrap(), 0);
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(format!("{{{prefix}:round}}:b"))
        .arg(0)
        .arg(-1)
        .query(&mut server.conn())
        .unwrap();
    assert!(members.is_empty(), "{members:?}");
}

/// A virtual clock whose blocking sleeps wait until the test opens a gate
/// (or a second one comes), so that a sync call can be made while another
/// sleeps.
#[derive(Debug, Clone)]
struct GatedClock {
    inner: seawall::testing::VirtualClock,
    gate: std::sync::Arc<(std::sync::Mutex<(u32, bool)>, std::sync::Condvar)>,
}

impl GatedClock {
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

impl seawall::Clock for GatedClock {
    fn now(&self) -> Duration {
        self.inner.now()
    }
    fn sleep(&self, duration: Duration) -> seawall::clock::BoxSleep {
        seawall::Clock::sleep(&self.inner, duration)
    }
    fn sleep_blocking(&self, duration: Duration) {
        let (lock, cv) = &*self.gate;
        let mut g = lock.lock().unwrap();
        g.0 += 1;
        g.1 |= g.0 > 1;
        cv.notify_all();
        while !g.1 {
            g = cv.wait(g).unwrap();
        }
        drop(g);
        seawall::Clock::sleep_blocking(&self.inner, duration);
    }
}

/// Rate limiter `max_wait` under contention on Redis, as in memory: on a
/// limit of one per 250 ms with `max_wait(250 ms)`, three calls at 250 ms
/// are admitted at 250 and 500 ms (the second waits for the permit it
/// reserved) and the third is refused at once, told to retry after 500 ms.
#[test]
fn a_waiting_call_reserves_its_permit_on_redis() {
    let server = RedisServer::start();
    let ms = Duration::from_millis;
    for limiter in [
        RateLimiter::fixed_window(1, ms(250)),
        RateLimiter::sliding_window(1, ms(250)),
        RateLimiter::gcra(1, ms(250)),
    ] {
        let virtual_clock = seawall::testing::VirtualClock::starting_at(ms(250));
        let clock = GatedClock {
            inner: virtual_clock.clone(),
            gate: Default::default(),
        };
        let store = RedisStore::builder(server.url())
            .prefix(unique("reserve"))
            .caller_clock()
            .fail_closed()
            .build()
            .unwrap();
        let p = Pipeline::builder("limited")
            .rate_limiter(limiter.clone().max_wait(ms(250)))
            .store(store)
            .clock(clock.clone())
            .build()
            .unwrap();
        let one = || {
            let r = p.call(|_| Ok::<_, std::io::Error>(virtual_clock.now()));
            (r, virtual_clock.now())
        };
        let first = one();
        let (second, third) = std::thread::scope(|scope| {
            let second = scope.spawn(one);
            clock.wait_for_sleepers(1);
            let third = one();
            clock.open();
            (second.join().unwrap(), third)
        });
        assert_eq!(first.0.unwrap(), ms(250), "{limiter:?}");
        assert_eq!(second.0.unwrap(), ms(500), "{limiter:?}");
        let refused = third.0.unwrap_err();
        let r = refused.rejection().copied().unwrap();
        assert_eq!(
            (r.reason, r.retry_after, third.1),
            (RejectionReason::RateLimited, Some(ms(500)), ms(250)),
            "{limiter:?}"
        );
    }
}

/// Weighted calls on Redis, on the caller's virtual clock: the exact
/// admitted counts of every algorithm, a weight beyond the limit refused
/// at once, and a weighted call with `max_wait` waiting the exact time.
#[test]
fn weighted_calls_take_their_permits_on_redis() {
    let server = RedisServer::start();
    let ms = Duration::from_millis;
    let pipeline = |limiter: RateLimiter, clock: &seawall::testing::VirtualClock| {
        let store = RedisStore::builder(server.url())
            .prefix(unique("weighted"))
            .caller_clock()
            .fail_closed()
            .build()
            .unwrap();
        Pipeline::builder("weighted")
            .rate_limiter(limiter)
            .store(store)
            .clock(clock.clone())
            .build()
            .unwrap()
    };
    let refusal =
        |p: &Pipeline, n: u32| match p.weighted(n).unwrap().call(|_| Ok::<_, std::io::Error>(())) {
            Ok(()) => None,
            Err(e) => Some(*e.rejection().expect("a rejection")),
        };
    let start = Duration::from_secs(1_000);

    // GCRA 10/s: weight 4 twice, the third waits 200 ms.
    let clock = seawall::testing::VirtualClock::starting_at(start);
    let p = pipeline(RateLimiter::gcra(10, ms(1000)), &clock);
    assert!(refusal(&p, 4).is_none());
    assert!(refusal(&p, 4).is_none());
    let r = refusal(&p, 4).unwrap();
    assert_eq!(
        (r.reason, r.retry_after),
        (RejectionReason::RateLimited, Some(ms(200)))
    );
    assert!(refusal(&p, 2).is_none());
    assert!(refusal(&p, 1).is_some());
    let r = refusal(&p, 11).unwrap();
    assert_eq!(
        (r.reason, r.retry_after),
        (RejectionReason::RateLimited, None)
    );

    // Fixed window of 10: 3 + 3 + 3, then 2 is refused and 1 passes.
    let clock = seawall::testing::VirtualClock::starting_at(start);
    let p = pipeline(RateLimiter::fixed_window(10, ms(1000)), &clock);
    assert_eq!((0..5).filter(|_| refusal(&p, 3).is_none()).count(), 3);
    assert_eq!(refusal(&p, 2).unwrap().retry_after, Some(ms(1000)));
    assert!(refusal(&p, 1).is_none());
    assert_eq!(refusal(&p, 11).unwrap().retry_after, None);

    // Sliding window of 10: 6, then 3 half a period later; 2 more wait
    // for the first 6 to expire.
    let clock = seawall::testing::VirtualClock::starting_at(start);
    let p = pipeline(RateLimiter::sliding_window(10, ms(1000)), &clock);
    assert!(refusal(&p, 6).is_none());
    clock.advance(ms(500));
    assert!(refusal(&p, 3).is_none());
    assert_eq!(refusal(&p, 2).unwrap().retry_after, Some(ms(500)));
    assert!(refusal(&p, 1).is_none());
    clock.advance(ms(500));
    assert!(refusal(&p, 6).is_none());
    assert!(refusal(&p, 1).is_some());

    // A weighted call that may wait: burst 4, then 3 more at 300 ms.
    let clock = seawall::testing::VirtualClock::starting_at(start);
    let p = pipeline(
        RateLimiter::gcra(10, ms(1000)).burst(4).max_wait(ms(2000)),
        &clock,
    );
    assert!(refusal(&p, 4).is_none());
    assert!(refusal(&p, 3).is_none());
    assert_eq!(clock.now(), start + ms(300));
    assert_eq!(refusal(&p, 5).unwrap().retry_after, None);
    assert_eq!(clock.now(), start + ms(300));
}

/// A fixed window whose period is no whole number of microseconds (1/3 s
/// kept as 333,333,334 ns, 1.5 us, 500 ns) has its windows aligned on
/// multiples of the period to the nanosecond on Redis, as in memory: a
/// call waits for the next window's exact start, a refused one is told the
/// exact time to it. The windows were those of the period cut to whole
/// microseconds (333,333 us: a permit 334 ns early near 0, 2 ms early at
/// 10^6 s), and a period under a microsecond refused every call, told to
/// retry after 292 years.
#[test]
fn a_fixed_window_between_microseconds_is_aligned_to_the_nanosecond_on_redis() {
    let server = RedisServer::start();
    let ns = Duration::from_nanos;
    for period in [ns(333_333_334), ns(1_500), ns(500)] {
        for start in [Duration::ZERO, Duration::from_secs(1_000_000)] {
            // The start of the first window at or after `start`.
            let p = period.as_nanos();
            let first = ns(u64::try_from(start.as_nanos().div_ceil(p) * p).unwrap());
            let clock = seawall::testing::VirtualClock::starting_at(first);
            let store = || {
                RedisStore::builder(server.url())
                    .prefix(unique("fine-window"))
                    .caller_clock()
                    .fail_closed()
                    .build()
                    .unwrap()
            };
            let waits = Pipeline::builder("fine-window")
                .rate_limiter(RateLimiter::fixed_window(1, period).max_wait(period * 2))
                .store(store())
                .clock(clock.clone())
                .build()
                .unwrap();
            for k in 0..4u32 {
                let ran = waits
                    .call(|_| Ok::<_, std::io::Error>(clock.now()))
                    .unwrap();
                assert_eq!(ran, first + period * k, "{period:?} from {start:?}");
            }
            let refuses = Pipeline::builder("fine-window-refused")
                .rate_limiter(RateLimiter::fixed_window(1, period))
                .store(store())
                .clock(clock.clone())
                .build()
                .unwrap();
            let now = clock.now();
            assert!(refuses.call(|_| Ok::<_, std::io::Error>(())).is_ok());
            let r = refuses.call(|_| Ok::<_, std::io::Error>(())).unwrap_err();
            assert_eq!(
                r.rejection().and_then(|r| r.retry_after),
                Some(period),
                "{period:?} from {start:?}"
            );
            clock.advance(period - ns(1));
            let r = refuses.call(|_| Ok::<_, std::io::Error>(())).unwrap_err();
            assert_eq!(r.rejection().and_then(|r| r.retry_after), Some(ns(1)));
            clock.advance(ns(1));
            assert_eq!(clock.now(), now + period);
            assert!(refuses.call(|_| Ok::<_, std::io::Error>(())).is_ok());
        }
    }
}

/// Two stores (two processes) sharing one circuit on the caller's virtual
/// clock: an administrative open for a while, then the disabled state
/// switched on by one process and off by the other.
#[test]
fn open_for_disable_and_enable_are_shared_by_every_process() {
    let server = RedisServer::start();
    let prefix = unique("states");
    let clock = seawall::testing::VirtualClock::new();
    clock.advance(Duration::from_secs(1_000_000));
    let pipeline = || {
        let store = RedisStore::builder(server.url())
            .prefix(&prefix)
            .caller_clock()
            .fail_closed()
            .build()
            .unwrap();
        Pipeline::builder("states")
            .circuit_breaker(
                CircuitBreaker::consecutive_failures(1)
                    .cooldown(Duration::from_secs(10))
                    .cooldown_growth(2.0, Duration::from_secs(100)),
            )
            .clock(clock.clone())
            .store(store)
            .build()
            .unwrap()
    };
    let (a, b) = (pipeline(), pipeline());
    let ok = |_| Ok::<_, std::io::Error>(1);
    let refused = |r: Result<u32, Error<std::io::Error>>| match r {
        Err(Error::Rejected(r)) => Some((r.reason, r.retry_after)),
        _ => None,
    };
    a.open_for(Duration::from_secs(60)).unwrap();
    assert_eq!(b.circuit_state().unwrap(), CircuitState::Open);
    assert_eq!(
        refused(b.call(ok)),
        Some((RejectionReason::CircuitOpen, Some(Duration::from_secs(60))))
    );
    clock.advance(Duration::from_secs(60));
    // The probe fails: the first trip's cooldown.
    assert!(b.call(|_| Err::<u32, _>(io("down"))).is_err());
    assert_eq!(
        refused(a.call(ok)),
        Some((RejectionReason::CircuitOpen, Some(Duration::from_secs(10))))
    );
    // Disabled by one process: every process admits and records nothing.
    a.disable().unwrap();
    assert_eq!(b.circuit_state().unwrap(), CircuitState::Disabled);
    for _ in 0..3 {
        assert!(matches!(
            b.call(|_| Err::<u32, _>(io("down"))),
            Err(Error::Operation(_))
        ));
    }
    assert_eq!(a.call(ok).unwrap(), 1);
    b.enable().unwrap();
    b.enable().unwrap();
    let m = a.circuit_metrics().unwrap();
    assert_eq!((m.state, m.trips), (CircuitState::Closed, 0));
    assert!(b.call(|_| Err::<u32, _>(io("down"))).is_err());
    assert_eq!(a.circuit_state().unwrap(), CircuitState::Open);
    a.enable().unwrap();
    assert_eq!(
        b.circuit_state().unwrap(),
        CircuitState::Open,
        "only a disabled circuit"
    );
}

/// `max_half_open` on Redis, on the caller's clock: a probe that never
/// reports blocks the next round until the round is that old, then a new
/// round starts (whatever the store's probe lease).
#[test]
fn a_round_of_probes_gives_way_after_max_half_open_on_redis() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique("max-half-open"))
        .caller_clock()
        .probe_lease(Duration::from_secs(3600))
        .fail_closed()
        .build()
        .unwrap();
    let spec = ResourceSpec::new("probed").with_circuit(
        CircuitBreaker::consecutive_failures(1)
            .cooldown(Duration::from_millis(100))
            .max_half_open(Duration::from_secs(2)),
    );
    let r = store.bind(&spec).unwrap();
    let at = |ms: u64| AdmitRequest::new(None, Duration::from_millis(1_000_000 + ms));
    let p = r.admit(&at(0)).unwrap().decision.unwrap();
    let failed = r
        .record(&Record {
            partition: None,
            permit: p,
            outcome: Outcome::Failure,
            duration: Duration::ZERO,
            retry_after: None,
            now: Duration::from_millis(1_000_000),
        })
        .unwrap();
    assert!(failed.transition.is_some());
    let lost = r.admit(&at(100)).unwrap();
    assert_eq!(
        lost.transition,
        Some(seawall::breaker::CircuitTransition::HalfOpened)
    );
    let lost = lost.decision.unwrap();
    assert!(
        r.admit(&at(2099)).unwrap().decision.is_err(),
        "the round is 1999 ms old"
    );
    let fresh = r.admit(&at(2100)).unwrap();
    assert_eq!(
        fresh.transition,
        Some(seawall::breaker::CircuitTransition::ProbesExpired)
    );
    let fresh = fresh.decision.unwrap();
    assert!(fresh.probe && fresh.generation != lost.generation);
    // The lost probe reports too late to count.
    let late = r
        .record(&Record {
            partition: None,
            permit: lost,
            outcome: Outcome::Failure,
            duration: Duration::ZERO,
            retry_after: None,
            now: Duration::from_millis(1_002_200),
        })
        .unwrap();
    assert_eq!(late.transition, None);
    assert_eq!(
        r.circuit_metrics(None, Duration::from_millis(1_002_200))
            .unwrap()
            .time_in_state,
        Duration::from_millis(100),
        "a new round restarts the time in state"
    );
}

/// Shadow mode on Redis: two processes share policies in shadow mode; the
/// calls over the limits run, the limits keep the state an enforcing one
/// would (never more than the limit in flight), and each process reports
/// what it would have refused.
#[test]
fn policies_in_shadow_mode_report_across_processes_and_never_refuse() {
    let server = RedisServer::start();
    let prefix = unique("shadow");
    let pipeline = |events: &crate::support::Events| {
        let store = RedisStore::builder(server.url())
            .prefix(&prefix)
            .fail_closed()
            .build()
            .unwrap();
        Pipeline::builder("shadowed")
            .bulkhead(Bulkhead::new(1).shadow(true))
            .rate_limiter(RateLimiter::fixed_window(2, Duration::from_secs(3600)).shadow(true))
            .on_event(events.listener())
            .store(store)
            .build()
            .unwrap()
    };
    let (ea, eb) = (
        crate::support::Events::default(),
        crate::support::Events::default(),
    );
    let (a, b) = (pipeline(&ea), pipeline(&eb));
    // b's call runs while a's holds the one slot: over the bulkhead.
    let inner = a
        .call(|_| {
            assert_eq!(b.in_flight().unwrap(), 1);
            b.call(|_| Ok::<_, std::io::Error>(b.in_flight().unwrap()))
        })
        .unwrap();
    assert_eq!(inner, 1, "the shadowed call holds no slot");
    assert_eq!(a.in_flight().unwrap(), 0);
    // One permit went to a's call (b's, over the bulkhead, never reached
    // the limiter, as a refusal would not have): a takes the second, b's
    // next call is over the limit.
    rt().block_on(async {
        for p in [&a, &b] {
            let r = p.run(|_| async { Ok::<_, std::io::Error>(7) }).await;
            assert_eq!(r.unwrap(), 7);
            // The success's slot is freed on the server before the next
            // process calls: the success, carried by no admission, is
            // sent on its own after the store's delay.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while a.in_flight().unwrap() + b.in_flight().unwrap() > 0 {
                assert!(std::time::Instant::now() < deadline, "the slot is freed");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });
    let shadow = |events: &crate::support::Events| -> Vec<RejectionReason> {
        events
            .take()
            .into_iter()
            .filter_map(|e| match e {
                seawall::EventKind::ShadowRejected { reason, .. } => Some(reason),
                _ => None,
            })
            .collect()
    };
    assert_eq!(shadow(&ea), []);
    assert_eq!(
        shadow(&eb),
        [RejectionReason::BulkheadFull, RejectionReason::RateLimited]
    );
}

/// An isolated circuit stays so until reset and a disabled one until
/// enabled, however long no call comes, as in memory: the state hash has
/// no TTL while the circuit is in that state, and its usual one again
/// once it leaves it. For a resource and a partition alike.
#[test]
fn isolated_and_disabled_circuits_outlive_partition_idle() {
    let server = RedisServer::start();
    let prefix = unique("forced");
    let store = RedisStore::builder(server.url())
        .prefix(&prefix)
        .fail_closed()
        .build()
        .unwrap();
    let pipeline = |name: &str| {
        Pipeline::builder(name)
            .circuit_breaker(CircuitBreaker::consecutive_failures(1))
            .partition_idle(Duration::from_secs(1))
            .store(store.clone())
            .build()
            .unwrap()
    };
    let (iso, dis) = (pipeline("iso"), pipeline("dis"));
    iso.isolate().unwrap();
    iso.partition("tenant").isolate().unwrap();
    dis.disable().unwrap();
    dis.partition("tenant").disable().unwrap();
    // One admission each, as calls would keep the state alive.
    assert!(iso.call(|_| Ok::<_, std::io::Error>(())).is_err());
    assert!(dis
        .partition("tenant")
        .call(|_| Ok::<_, std::io::Error>(()))
        .is_ok());

    // Twice the idle time, on the server's clock.
    std::thread::sleep(Duration::from_millis(2200));

    let isolated = |r: Result<(), Error<std::io::Error>>| matches!(r, Err(Error::Rejected(ref r)) if r.reason == RejectionReason::CircuitOpen);
    assert_eq!(iso.circuit_state().unwrap(), CircuitState::Isolated);
    assert!(isolated(iso.call(|_| Ok(()))));
    let part = iso.partition("tenant");
    assert_eq!(
        part.circuit_metrics().unwrap().state,
        CircuitState::Isolated
    );
    assert!(isolated(part.call(|_| Ok(()))));
    assert_eq!(dis.circuit_state().unwrap(), CircuitState::Disabled);
    assert_eq!(
        dis.partition("tenant").circuit_metrics().unwrap().state,
        CircuitState::Disabled
    );
    // Disabled: a failure is neither recorded nor trips the circuit.
    for _ in 0..2 {
        assert!(matches!(
            dis.call(|_| Err::<(), _>(io("down"))),
            Err(Error::Operation(_))
        ));
        assert!(matches!(
            dis.partition("tenant").call(|_| Err::<(), _>(io("down"))),
            Err(Error::Operation(_))
        ));
    }
    assert_eq!(dis.circuit_state().unwrap(), CircuitState::Disabled);
    assert_eq!(
        dis.partition("tenant").circuit_metrics().unwrap().state,
        CircuitState::Disabled
    );

    // Leaving the forced state brings the usual TTL back.
    iso.reset().unwrap();
    iso.partition("tenant").reset().unwrap();
    dis.enable().unwrap();
    dis.partition("tenant").enable().unwrap();
    let mut conn = server.conn();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{prefix}:*"))
        .query(&mut conn)
        .unwrap();
    assert!(keys.len() >= 4, "{keys:?}");
    for k in &keys {
        let pttl: i64 = redis::cmd("PTTL").arg(k).query(&mut conn).unwrap();
        assert!(pttl > 0, "{k} has no TTL ({pttl})");
    }
    assert_eq!(iso.circuit_state().unwrap(), CircuitState::Closed);
    assert!(iso.call(|_| Ok::<_, std::io::Error>(())).is_ok());
}

type IoPipeline = Pipeline<seawall::pipeline::ErrorType<std::io::Error>>;
type IoBuilder = seawall::PipelineBuilder<seawall::pipeline::ErrorType<std::io::Error>>;

/// A call through `p` (`sync` or async) with the outcome `ok`.
fn shadow_call(p: &IoPipeline, sync: bool, ok: bool) -> Result<u32, Error<std::io::Error>> {
    let op = move || if ok { Ok(1) } else { Err(io("down")) };
    if sync {
        p.call(|_| op())
    } else {
        rt().block_on(p.run(|_| async move { op() }))
    }
}

/// Shadow mode across the levels of a pipeline, on Redis as in memory
/// (`seawall::shadow`): a pipeline in shadow mode keeps the circuit and
/// the permits of the same pipeline enforcing, sync and async, with and
/// without a listener.
#[test]
fn shadow_mode_across_levels_keeps_the_state_of_enforcing_mode() {
    let server = RedisServer::start();
    let hour = Duration::from_secs(3600);
    for sync in [true, false] {
        for listen in [false, true] {
            // The pipeline `shape(shadow)` on a store under `prefix`.
            let build = |prefix: &str, shape: &dyn Fn(IoBuilder) -> IoBuilder| {
                let store = RedisStore::builder(server.url())
                    .prefix(prefix)
                    .fail_closed()
                    .build()
                    .unwrap();
                let mut b = Pipeline::builder("levels")
                    .store(store)
                    .classify(|_: &std::io::Error| Verdict::retry());
                if listen {
                    b = b.on_event(|_| {});
                }
                shape(b).build().unwrap()
            };
            let what = format!("sync {sync}, listening {listen}");

            // An attempt refused after the retry, after the first one
            // failed: the circuit before it records that failure, enforcing
            // or in shadow mode (where the call goes on).
            let shape = |s: bool| {
                move |b: IoBuilder| {
                    b.circuit_breaker(CircuitBreaker::consecutive_failures(1).shadow(s))
                        .retry(Retry::constant(Duration::from_millis(1)).max_attempts(2))
                        .rate_limiter(RateLimiter::sliding_window(1, hour).shadow(s))
                }
            };
            let e = build(&unique("levels"), &shape(false));
            let s = build(&unique("levels"), &shape(true));
            assert!(matches!(
                shadow_call(&e, sync, false),
                Err(Error::Rejected(_))
            ));
            assert!(shadow_call(&s, sync, false).is_err());
            assert_eq!(e.circuit_state().unwrap(), CircuitState::Open, "{what}");
            assert_eq!(s.circuit_state().unwrap(), CircuitState::Open, "{what}");

            // A call refused before the retry takes no permit after it.
            let shape = |s: bool| {
                move |b: IoBuilder| {
                    b.circuit_breaker(
                        CircuitBreaker::consecutive_failures(1)
                            .cooldown(hour)
                            .shadow(s),
                    )
                    .retry(Retry::constant(Duration::from_millis(1)).max_attempts(1))
                    .rate_limiter(RateLimiter::sliding_window(2, hour).shadow(s))
                }
            };
            let (pe, ps) = (unique("levels"), unique("levels"));
            let (e, s) = (build(&pe, &shape(false)), build(&ps, &shape(true)));
            for p in [&e, &s] {
                assert!(shadow_call(p, sync, false).is_err());
            }
            assert!(matches!(
                shadow_call(&e, sync, true),
                Err(Error::Rejected(_))
            ));
            assert_eq!(shadow_call(&s, sync, true).unwrap(), 1);
            e.reset().unwrap();
            s.reset().unwrap();
            assert_eq!(shadow_call(&e, sync, true).unwrap(), 1, "{what}");
            // The shadow pipeline's limiter, read through the same
            // pipeline enforcing on the same state: permit 2 is free.
            let twin = build(&ps, &shape(false));
            assert_eq!(shadow_call(&twin, sync, true).unwrap(), 1, "{what}");

            // An attempt over a shadow adaptive limit meets no shadow
            // policy of the store.
            let shape = |s: bool| {
                move |b: IoBuilder| {
                    b.adaptive_limit(seawall::AdaptiveLimit::aimd().limits(1, 1, 1).shadow(s))
                        .circuit_breaker(CircuitBreaker::consecutive_failures(1).shadow(s))
                }
            };
            let e = build(&unique("levels"), &shape(false));
            let s = build(&unique("levels"), &shape(true));
            for (p, enforcing) in [(&e, true), (&s, false)] {
                let (entered, wait_entered) = std::sync::mpsc::channel::<()>();
                let (release, wait_release) = std::sync::mpsc::channel::<()>();
                std::thread::scope(|scope| {
                    let holder = scope.spawn(move || {
                        p.call(|_| {
                            entered.send(()).unwrap();
                            wait_release.recv().unwrap();
                            Ok::<_, std::io::Error>(0)
                        })
                    });
                    wait_entered.recv().unwrap();
                    let r = shadow_call(p, sync, false);
                    if enforcing {
                        assert!(
                            matches!(&r, Err(Error::Rejected(r))
                                if r.reason == RejectionReason::ConcurrencyLimited),
                            "{what}: {r:?}"
                        );
                    } else {
                        assert!(matches!(r, Err(Error::Operation(_))), "{what}: {r:?}");
                    }
                    release.send(()).unwrap();
                    assert_eq!(holder.join().unwrap().unwrap(), 0);
                });
                assert_eq!(p.circuit_state().unwrap(), CircuitState::Closed, "{what}");
            }
        }
    }
}

/// A bulkhead queue on Redis: a slot given back in this process is handed
/// to the oldest local waiter (the waiters start in the order they queued);
/// a slot given back by another process wakes nobody here, and the oldest
/// waiter sees it at its fallback interval (at most 20 ms), not at the end
/// of its `max_wait`.
#[test]
fn a_bulkhead_queue_on_redis_is_served_in_order_and_sees_other_processes() {
    let server = RedisServer::start();
    let prefix = unique("queue");
    let store = || {
        RedisStore::builder(server.url())
            .prefix(&prefix)
            .fail_closed()
            .build()
            .unwrap()
    };
    let bulkhead = Bulkhead::new(1).queue(8, Duration::from_secs(10));
    let a = Pipeline::builder("queued")
        .bulkhead(bulkhead.clone())
        .store(store())
        .build()
        .unwrap();
    let b = Pipeline::builder("queued")
        .bulkhead(bulkhead)
        .store(store())
        .build()
        .unwrap();
    let rt = rt();
    let log: std::sync::Arc<std::sync::Mutex<Vec<&'static str>>> = Default::default();
    let hold = |p: &Pipeline, ms: u64, name: &'static str| {
        let (p, log) = (p.clone(), log.clone());
        async move {
            p.run(|_| {
                log.lock().unwrap().push(name);
                async move {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    Ok::<_, std::io::Error>(())
                }
            })
            .await
        }
    };
    // In this process: the holder, then three waiters queued in turn; each
    // runs after the one queued before it.
    rt.block_on(async {
        let mut tasks = vec![tokio::spawn(hold(&a, 300, "holder"))];
        for name in ["first", "second", "third"] {
            tokio::time::sleep(Duration::from_millis(50)).await;
            tasks.push(tokio::spawn(hold(&a, 5, name)));
        }
        for t in tasks {
            t.await.unwrap().unwrap();
        }
    });
    assert_eq!(*log.lock().unwrap(), ["holder", "first", "second", "third"]);

    // Another process holds the slot: this one's waiter asks again at its
    // fallback interval and runs soon after the slot is given back there.
    let (released, started) = rt.block_on(async {
        let remote = async {
            hold(&b, 300, "remote").await.unwrap();
            Instant::now()
        };
        let local = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            a.run(|_| async { Ok::<_, std::io::Error>(Instant::now()) })
                .await
                .unwrap()
        };
        tokio::join!(remote, local)
    });
    let late = started.saturating_duration_since(released);
    assert!(
        late < Duration::from_secs(1),
        "the waiter saw the remote release {late:?} after it"
    );
    assert_eq!(a.in_flight().unwrap(), 0);
}
