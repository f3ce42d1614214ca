//! Leased mode: a batch of rate-limit permits leased from Redis at a time,
//! admitted from locally, renewed in the background, given back when
//! unused. Commands are counted by the server (`INFO commandstats`); the
//! exact answers are checked on the caller's clock. The four-process bound
//! and the dead process are in `cross_process.rs`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use seawall::store::{AdmitRequest, Permit, ResourceSpec, ResourceState};
use seawall::{
    Bulkhead, CircuitBreaker, Pipeline, RateLimiter, RejectionReason, StateStore, StoreError,
};
use seawall_redis::{FailMode, Leasing, RedisStore, RedisStoreBuilder, RedisStoreError};

use crate::support::{busy_for_a_second, command_calls, rt, script_calls, unique, RedisServer};

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

/// Script calls the server ran between two snapshots.
fn scripts(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> u64 {
    script_calls(after) - script_calls(before)
}

fn caller(b: RedisStoreBuilder, prefix: &str) -> RedisStore {
    b.prefix(prefix)
        .caller_clock()
        .fail_closed()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

fn admit(s: &dyn ResourceState, now: Duration, weight: u32) -> Result<(), Option<Duration>> {
    let a = s
        .admit(&AdmitRequest::new(None, now).with_weight(weight))
        .unwrap();
    a.decision.map(|_| ()).map_err(|r| {
        assert_eq!(r.reason, RejectionReason::RateLimited);
        r.retry_after
    })
}

/// A store leasing `leasing` for the resource `api` under `prefix`, quick
/// to time out and to reconnect, answering an outage with `mode`.
fn outage_store(
    server: &RedisServer,
    prefix: &str,
    mode: FailMode,
    leasing: Leasing,
) -> RedisStore {
    RedisStore::builder(server.url())
        .prefix(prefix)
        .timeout(Duration::from_millis(200))
        .reconnect_interval(Duration::from_millis(100))
        .fail_mode(mode)
        .leased("api", leasing)
        .build()
        .unwrap()
}

/// A bulkhead of 10 leased 5 slots at a time through an [`outage_store`],
/// and its first slot, taken from Redis.
fn outage_pool(
    server: &RedisServer,
    prefix: &str,
    mode: FailMode,
) -> (RedisStore, ResourceSpec, Arc<dyn ResourceState>, Permit) {
    let store = outage_store(server, prefix, mode, Leasing::batch(5).low_water(0));
    let spec = ResourceSpec::new("api").with_bulkhead(Bulkhead::new(10).lease(10 * S));
    let state = store.bind(&spec).unwrap();
    let first = state
        .admit(&AdmitRequest::new(None, Duration::ZERO))
        .unwrap();
    assert!(first.decision.is_ok() && first.degraded.is_none());
    let first = first.decision.unwrap();
    (store, spec, state, first)
}

/// Waits (10 s at most) until `store` reaches Redis again.
fn wait_available(store: &RedisStore) {
    for _ in 0..500 {
        if store.ping().is_ok() && store.is_available() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `spec` under `prefix` through an exact fail-closed store: what Redis
/// holds.
fn exact(server: &RedisServer, prefix: &str, spec: &ResourceSpec) -> Arc<dyn ResourceState> {
    RedisStore::builder(server.url())
        .prefix(prefix)
        .fail_closed()
        .build()
        .unwrap()
        .bind(spec)
        .unwrap()
}

/// A fail-closed store's answer once Redis cannot be reached.
fn assert_unreachable<T: std::fmt::Debug>(a: &Result<T, StoreError>) {
    assert!(
        matches!(a, Err(StoreError::Timeout(_) | StoreError::Unavailable(_))),
        "{a:?}"
    );
}

#[test]
fn a_batch_of_zero_or_above_the_limit_is_a_config_error() {
    let e = RedisStore::builder("redis://127.0.0.1:1")
        .leased("api", Leasing::batch(0))
        .build()
        .unwrap_err();
    assert!(
        matches!(
            e,
            RedisStoreError::InvalidConfig {
                field: "leased.batch",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "redis_store.leased.batch must be >= 1, got 0"
    );
    for (leasing, field) in [
        (Leasing::batch(10).ttl(Duration::ZERO), "leased.ttl"),
        (Leasing::batch(10).low_water(10), "leased.low_water"),
    ] {
        let e = RedisStore::builder("redis://127.0.0.1:1")
            .leased("api", leasing)
            .build()
            .unwrap_err();
        assert!(
            matches!(&e, RedisStoreError::InvalidConfig { field: f, .. } if *f == field),
            "{e}"
        );
    }

    let server = RedisServer::start();
    let store = |batch: u32| {
        RedisStore::builder(server.url())
            .prefix(unique("badlease"))
            .leased("api", Leasing::batch(batch))
            .build()
            .unwrap()
    };
    // Above the burst of a GCRA, the limit of a fixed window.
    for (limiter, what) in [
        (RateLimiter::gcra(1000, S).burst(100), "burst (100)"),
        (RateLimiter::fixed_window(100, S), "limit (100)"),
    ] {
        let e = Pipeline::builder("api")
            .rate_limiter(limiter.clone())
            .store(store(101))
            .build()
            .unwrap_err();
        assert_eq!((e.policy, e.field), ("store", "bind"));
        let msg = e.to_string();
        assert!(
            msg.contains(&format!(
                "leased.batch of resource `api` must be <= the rate limiter's {what}, got 101"
            )),
            "{msg}"
        );
        // At the bound, it binds.
        Pipeline::builder("api")
            .rate_limiter(limiter)
            .store(store(100))
            .build()
            .unwrap();
    }
    // Anything but a GCRA or fixed-window limiter alone, whose calls never
    // wait, is refused.
    let refused = [
        Pipeline::builder("api")
            .rate_limiter(RateLimiter::gcra(100, S))
            .circuit_breaker(CircuitBreaker::consecutive_failures(3))
            .store(store(10))
            .build(),
        Pipeline::builder("api")
            .rate_limiter(RateLimiter::gcra(100, S))
            .bulkhead(Bulkhead::new(3))
            .store(store(10))
            .build(),
        Pipeline::builder("api")
            .rate_limiter(RateLimiter::sliding_window(100, S))
            .store(store(10))
            .build(),
        Pipeline::builder("api")
            .rate_limiter(RateLimiter::gcra(100, S).max_wait(S))
            .store(store(10))
            .build(),
        Pipeline::builder("api")
            .bulkhead(Bulkhead::new(30))
            .cooldown(seawall::Cooldown::new())
            .store(store(10))
            .build(),
    ];
    for r in refused {
        let e = r.unwrap_err();
        assert_eq!((e.policy, e.field), ("store", "bind"));
        assert!(
            e.to_string().contains("leased.resource of resource `api`"),
            "{e}"
        );
    }
    // A bulkhead: a batch above its max_concurrent, a TTL not below its
    // lease.
    let e = Pipeline::builder("api")
        .bulkhead(Bulkhead::new(3))
        .store(store(10))
        .build()
        .unwrap_err();
    assert!(
        e.to_string().contains(
            "leased.batch of resource `api` must be <= the bulkhead's max_concurrent (3), got 10"
        ),
        "{e}"
    );
    let e = Pipeline::builder("api")
        .bulkhead(Bulkhead::new(30).lease(S))
        .store(store(10))
        .build()
        .unwrap_err();
    assert!(
        e.to_string().contains("leased.ttl of resource `api`"),
        "{e}"
    );
    Pipeline::builder("api")
        .bulkhead(Bulkhead::new(10))
        .store(store(10))
        .build()
        .unwrap();
    // Another resource of the store is not leased.
    Pipeline::builder("other")
        .rate_limiter(RateLimiter::sliding_window(100, S))
        .store(store(10))
        .build()
        .unwrap();
}

/// On the caller's clock: a GCRA of 100 per second (burst 100), batches of
/// 10. At one instant exactly the burst is admitted, in 10 leases (one
/// script call each) and one refused lease; then calls are refused locally
/// with the refused lease's `retry_after` until it ends.
#[test]
fn leased_admissions_take_the_limit_exactly_in_one_call_per_batch() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    for origin in [Duration::ZERO, Duration::from_secs(1_000_000)] {
        for limiter in [RateLimiter::gcra(100, S), RateLimiter::fixed_window(100, S)] {
            let prefix = unique("lease");
            let spec = ResourceSpec::new("api").with_rate_limit(limiter.clone());
            let b =
                RedisStore::builder(server.url()).leased("api", Leasing::batch(10).low_water(5));
            let state = caller(b, &prefix).bind(&spec).unwrap();
            let before = command_calls(&mut conn);
            let t0 = origin + MS;
            let admitted = (0..150).filter(|_| admit(&*state, t0, 1).is_ok()).count();
            assert_eq!(admitted, 100, "{limiter:?}");
            assert_eq!(
                scripts(&before, &command_calls(&mut conn)),
                11,
                "{limiter:?}: ten batches and one refused lease"
            );
            // The refused lease of 10: GCRA's TAT is at t0 + 1 s, the
            // tenth permit after it is due at t0 + 100 ms; the fixed
            // window's next one starts at origin + 1 s.
            let end = match limiter.algorithm {
                seawall::rate_limit::RateAlgorithm::Gcra => t0 + 100 * MS,
                _ => origin + S,
            };
            let before = command_calls(&mut conn);
            for now in [t0, t0 + (end - t0) / 2, end - Duration::from_nanos(1)] {
                assert_eq!(admit(&*state, now, 1), Err(Some(end - now)), "{limiter:?}");
            }
            assert_eq!(scripts(&before, &command_calls(&mut conn)), 0);
            // At its end, a lease again.
            assert_eq!(admit(&*state, end, 1), Ok(()));
            assert_eq!(scripts(&before, &command_calls(&mut conn)), 1);
        }
    }
}

/// Unused permits are given back: when the resource is dropped, and when
/// the batch expires (at the first admission after its TTL).
#[test]
fn unused_permits_are_given_back() {
    let server = RedisServer::start();
    for limiter in [
        RateLimiter::gcra(100, 10 * S),
        RateLimiter::fixed_window(100, 10 * S),
    ] {
        let spec = ResourceSpec::new("api").with_rate_limit(limiter.clone());
        let t0 = Duration::from_secs(1_000_000);
        // Dropped with 7 of its 10 left: an exact store then has 97.
        let prefix = unique("giveback");
        let leased = |prefix: &str| {
            caller(
                RedisStore::builder(server.url())
                    .leased("api", Leasing::batch(10).low_water(1).ttl(S)),
                prefix,
            )
            .bind(&spec)
            .unwrap()
        };
        let exact = caller(RedisStore::builder(server.url()), &prefix)
            .bind(&spec)
            .unwrap();
        let state = leased(&prefix);
        for _ in 0..3 {
            assert_eq!(admit(&*state, t0, 1), Ok(()));
        }
        drop(state);
        assert_eq!(admit(&*exact, t0, 97), Ok(()), "{limiter:?}");
        assert!(admit(&*exact, t0, 1).is_err(), "{limiter:?}");

        // Expired with 7 left: given back at the next admission, which
        // leases a new batch.
        let prefix = unique("expire");
        let exact = caller(RedisStore::builder(server.url()), &prefix)
            .bind(&spec)
            .unwrap();
        let state = leased(&prefix);
        for _ in 0..3 {
            assert_eq!(admit(&*state, t0, 1), Ok(()));
        }
        // Within the TTL: from the batch.
        assert_eq!(admit(&*state, t0 + S - MS, 1), Ok(()));
        // After it: 6 given back, 10 leased, 1 taken. The fixed window
        // then counts the 4 used and the new 10; GCRA, whose TAT the 6
        // moved back to t0 + 0.4 s, is full again at t0 + 1 s, less the
        // new 10.
        let t1 = t0 + S;
        assert_eq!(admit(&*state, t1, 1), Ok(()));
        let free = match limiter.algorithm {
            seawall::rate_limit::RateAlgorithm::Gcra => 100 - 10,
            _ => 100 - 4 - 10,
        };
        assert_eq!(admit(&*exact, t1, free), Ok(()), "{limiter:?}");
        assert!(admit(&*exact, t1, 1).is_err(), "{limiter:?}");
    }
}

/// Renewal starts at the low-water mark, in the background, before the
/// batch runs out: after the admission that leaves the mark, the server
/// runs the next lease without another admission. Sync (a renewal thread),
/// async on a multi-thread runtime (a spawned task) and on a
/// current-thread one (the renewal thread). Over many admissions, about
/// one script call per batch.
#[test]
fn renewal_runs_in_the_background_before_the_batch_runs_out() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let multi = rt();
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for mode in ["sync", "multi-thread", "current-thread"] {
        let store = RedisStore::builder(server.url())
            .prefix(unique("renew"))
            .leased("api", Leasing::batch(100).low_water(40))
            .build()
            .unwrap();
        let p = Pipeline::builder("api")
            .rate_limiter(RateLimiter::gcra(1_000_000, S))
            .store(store)
            .build()
            .unwrap();
        let call = |n: usize| {
            for _ in 0..n {
                let run = || p.run(|_| async { Ok::<_, std::io::Error>(()) });
                match mode {
                    "sync" => p.call(|_| Ok::<_, std::io::Error>(())).unwrap(),
                    "multi-thread" => multi.block_on(run()).unwrap(),
                    _ => current.block_on(run()).unwrap(),
                }
            }
        };
        let before = command_calls(&mut conn);
        // The first lease, then 59 more from it: 40 left.
        call(60);
        let mut seen = scripts(&before, &command_calls(&mut conn));
        for _ in 0..500 {
            if seen >= 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
            seen = scripts(&before, &command_calls(&mut conn));
        }
        assert_eq!(seen, 2, "{mode}: the renewal ran with 40 permits left");
        // 10,000 more: 100 batches, give or take the one under way.
        let before = command_calls(&mut conn);
        call(10_000);
        let n = scripts(&before, &command_calls(&mut conn));
        assert!((99..=101).contains(&n), "{mode}: {n} script calls");
    }
}

/// Redis stopped (SIGSTOP) while a process holds a batch: the batch is
/// still admitted from; once it is spent, the fail mode answers
/// (fail-closed `Error::Store`, fail-open local permits, degraded).
#[test]
fn a_stopped_redis_follows_the_fail_mode_once_the_batch_is_spent() {
    let server = RedisServer::start();
    for mode in [FailMode::Closed, FailMode::Open] {
        let store = outage_store(
            &server,
            &unique("stopped"),
            mode,
            Leasing::batch(20).low_water(1),
        );
        let spec = ResourceSpec::new("api").with_rate_limit(RateLimiter::gcra(1000, S));
        let state = store.bind(&spec).unwrap();
        let now = Duration::ZERO;
        let a = state.admit(&AdmitRequest::new(None, now)).unwrap();
        assert!(a.decision.is_ok() && a.degraded.is_none());
        server.signal("STOP");
        // 19 left: all admitted from the batch, none degraded.
        for i in 0..19 {
            let a = state.admit(&AdmitRequest::new(None, now)).unwrap();
            assert!(a.decision.is_ok(), "{mode:?} {i}");
            assert!(a.degraded.is_none(), "{mode:?} {i}");
        }
        // Spent: the fail mode answers.
        for _ in 0..3 {
            let a = state.admit(&AdmitRequest::new(None, now));
            match mode {
                FailMode::Closed => assert_unreachable(&a),
                _ => {
                    let a = a.unwrap();
                    assert!(a.decision.unwrap().local);
                    assert!(a.degraded.is_some());
                }
            }
        }
        server.signal("CONT");
        // Back on Redis once it is reconnected to (5 s at most).
        let mut back = false;
        for _ in 0..100 {
            if let Ok(a) = state.admit(&AdmitRequest::new(None, now)) {
                if a.degraded.is_none() && a.decision.as_ref().is_ok_and(|p| !p.local) {
                    back = true;
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(back, "{mode:?}: not back on Redis");
    }
}

/// Redis slow (busy for a second, past the timeout) while a process holds
/// a batch: the batch is admitted from; the renewal sent meanwhile times
/// out, and if the server runs it late its permits are counted and lost
/// (never admitted: under-admission of at most one batch); once the batch
/// is spent, the fail mode answers. Nothing is admitted over the limit.
#[test]
fn a_slow_redis_admits_from_the_batch_and_nothing_over_the_limit() {
    let server = RedisServer::start();
    for mode in [FailMode::Closed, FailMode::Open] {
        let prefix = unique("slowlease");
        let store = outage_store(&server, &prefix, mode, Leasing::batch(10).low_water(5));
        let spec =
            ResourceSpec::new("api").with_rate_limit(RateLimiter::fixed_window(100, 3600 * S));
        let state = store.bind(&spec).unwrap();
        let req = AdmitRequest::new(None, Duration::ZERO);
        assert!(state.admit(&req).unwrap().decision.is_ok());

        let sleeper = busy_for_a_second(&server);
        // 9 left: 4 leave 5 and start the renewal (which times out), 5 more
        // spend the batch; none waits or is degraded.
        for i in 0..9 {
            let a = state.admit(&req).unwrap();
            assert!(a.decision.is_ok() && a.degraded.is_none(), "{mode:?} {i}");
        }
        let a = state.admit(&req);
        match mode {
            FailMode::Closed => assert_unreachable(&a),
            _ => assert!(a.unwrap().degraded.is_some()),
        }
        sleeper.join().unwrap();
        wait_available(&store);
        assert!(store.is_available(), "no recovery");
        // The window holds the first batch, and the late renewal if the
        // server ran it: an exact store finds 90 or 80 places left.
        let exact = exact(&server, &prefix, &spec);
        let left = (0..120)
            .take_while(|_| exact.admit(&req).unwrap().decision.is_ok())
            .count();
        assert!(left == 90 || left == 80, "{mode:?}: {left} left");
    }
}

/// A bulkhead in leased mode with Redis slow (busy for a second, past the
/// timeout) while a process holds a pool of 5 slots, one in use: the 4
/// free ones are admitted from, none degraded; the growth the last of them
/// starts times out, and if the server runs it late its slots are held on
/// Redis by nobody until their lease ends (under-admission of at most one
/// batch, for one lease); once the pool is spent, the fail mode answers.
/// Slots in use through Redis never exceed the capacity: the pool's 5 are
/// held on Redis, plus the late growth's, within the 10.
#[test]
fn a_slow_redis_admits_from_the_pool_and_nothing_over_the_capacity() {
    let server = RedisServer::start();
    for mode in [FailMode::Closed, FailMode::Open] {
        let prefix = unique("slowslots");
        let (store, spec, state, first) = outage_pool(&server, &prefix, mode);
        let req = AdmitRequest::new(None, Duration::ZERO);
        let mut held = vec![first];

        let sleeper = busy_for_a_second(&server);
        // 4 free: all admitted from the pool, none degraded; the last
        // leaves none and starts the growth (which times out).
        for i in 0..4 {
            let a = state.admit(&req).unwrap();
            assert!(a.degraded.is_none(), "{mode:?} {i}");
            held.push(a.decision.unwrap_or_else(|r| panic!("{mode:?} {i}: {r:?}")));
        }
        assert!(
            held.iter().all(|p| !p.local && p.slot.is_none()),
            "from the pool"
        );
        // Spent: the fail mode answers.
        let a = state.admit(&req);
        match mode {
            FailMode::Closed => assert_unreachable(&a),
            _ => {
                let a = a.unwrap();
                let p = a.decision.unwrap();
                assert!(p.local && a.degraded.is_some());
                state.release(None, p);
            }
        }
        sleeper.join().unwrap();
        wait_available(&store);
        assert!(store.is_available(), "no recovery");
        // On Redis: the pool's 5, in use, and the late growth's 5 if the
        // server ran it; nothing else.
        let exact = exact(&server, &prefix, &spec);
        let on_redis = exact.in_flight(None, Duration::ZERO).unwrap();
        eprintln!("slow redis, leased bulkhead, {mode:?}: {on_redis} slots held on Redis after");
        assert!(
            on_redis == 5 || on_redis == 10,
            "{mode:?}: {on_redis} slots held"
        );
        for p in held {
            state.release(None, p);
        }
    }
}

/// A bulkhead in leased mode: two stores (as two processes) on one
/// bulkhead of 10, batches of 4. Together they never hold more than 10
/// slots, in use or in their pools; a store's idle slots beyond one batch
/// are given back by its keeper; a slot of the pool goes back to the pool
/// when its call ends, without a script call.
#[test]
fn leased_bulkhead_slots_never_exceed_the_capacity() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let prefix = unique("slots");
    let spec = ResourceSpec::new("api").with_bulkhead(Bulkhead::new(10).lease(10 * S));
    let leased = || {
        RedisStore::builder(server.url())
            .prefix(&prefix)
            .fail_closed()
            .leased("api", Leasing::batch(4).low_water(1).ttl(S))
            .build()
            .unwrap()
            .bind(&spec)
            .unwrap()
    };
    let (a, b) = (leased(), leased());
    let now = Duration::ZERO;
    let req = AdmitRequest::new(None, now);
    let take = |s: &dyn ResourceState| s.admit(&req).unwrap().decision;
    // A takes all 10, B none.
    let mut held = Vec::new();
    for i in 0..10 {
        held.push(take(&*a).unwrap_or_else(|r| panic!("A {i}: {r:?}")));
    }
    assert_eq!(take(&*a).unwrap_err().reason, RejectionReason::BulkheadFull);
    assert_eq!(take(&*b).unwrap_err().reason, RejectionReason::BulkheadFull);
    assert_eq!(a.in_flight(None, now).unwrap(), 10);
    // A's calls end: their slots go back to A's pool without a script call
    // (the slots taken exactly, if any, to Redis).
    let before = command_calls(&mut conn);
    let pooled = held.iter().filter(|p| p.slot.is_none()).count() as u64;
    for p in held.drain(..) {
        a.release(None, p);
    }
    let calls = scripts(&before, &command_calls(&mut conn));
    assert!(
        calls <= 10 - pooled + 2,
        "{calls} script calls for {pooled} pooled slots"
    );
    // A's keeper gives back what is beyond one batch (within a few ticks).
    let mut in_use = a.in_flight(None, now).unwrap();
    for _ in 0..300 {
        if in_use <= 4 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        in_use = a.in_flight(None, now).unwrap();
    }
    assert!(in_use <= 4, "{in_use} slots still held");
    // B takes what is free; A's pool still serves A; together at most 10.
    let mut b_held = 0;
    while take(&*b).is_ok() {
        b_held += 1;
        assert!(b_held <= 10);
    }
    let mut a_held = 0;
    while take(&*a).is_ok() {
        a_held += 1;
        assert!(a_held <= 10);
    }
    assert_eq!(a_held + b_held, 10, "A {a_held}, B {b_held}");
    assert!(a_held >= 4 - 1, "A's pool kept its batch: {a_held}");
    assert_eq!(a.in_flight(None, now).unwrap(), 10);
}

/// The pool's slot leases are extended while it holds them: a slot held
/// past the bulkhead's lease is still counted on Redis; once the resource
/// is dropped, its idle slots are given back.
#[test]
fn leased_bulkhead_slots_outlive_the_lease_while_held() {
    let server = RedisServer::start();
    let prefix = unique("extend");
    let spec = ResourceSpec::new("api").with_bulkhead(Bulkhead::new(5).lease(S));
    let state = RedisStore::builder(server.url())
        .prefix(&prefix)
        .fail_closed()
        .leased(
            "api",
            Leasing::batch(2)
                .low_water(0)
                .ttl(Duration::from_millis(300)),
        )
        .build()
        .unwrap()
        .bind(&spec)
        .unwrap();
    let exact = exact(&server, &prefix, &spec);
    let now = Duration::ZERO;
    let permit = state
        .admit(&AdmitRequest::new(None, now))
        .unwrap()
        .decision
        .unwrap();
    let start = std::time::Instant::now();
    // Past the lease (1 s) by half of it: both slots of the batch are
    // still held (one in use, one idle in the pool).
    std::thread::sleep(Duration::from_millis(1500));
    assert!(start.elapsed() >= Duration::from_millis(1500));
    assert_eq!(exact.in_flight(None, now).unwrap(), 2);
    state.release(None, permit);
    drop(state);
    assert_eq!(exact.in_flight(None, now).unwrap(), 0, "given back at drop");
}

/// A bulkhead in leased mode with Redis stopped (SIGSTOP): the pool's
/// free slots are admitted from; once none is free, the fail mode answers.
/// Nothing runs over the capacity: the pool's slots are held on Redis.
#[test]
fn a_stopped_redis_leaves_the_pool_then_follows_the_fail_mode() {
    let server = RedisServer::start();
    for mode in [FailMode::Closed, FailMode::Open] {
        let prefix = unique("stoppedslots");
        let (store, spec, state, _first) = outage_pool(&server, &prefix, mode);
        let req = AdmitRequest::new(None, Duration::ZERO);
        server.signal("STOP");
        for i in 0..4 {
            let a = state.admit(&req).unwrap();
            assert!(a.decision.is_ok() && a.degraded.is_none(), "{mode:?} {i}");
        }
        let a = state.admit(&req);
        match mode {
            FailMode::Closed => assert_unreachable(&a),
            _ => {
                let a = a.unwrap();
                assert!(a.decision.unwrap().local && a.degraded.is_some());
            }
        }
        server.signal("CONT");
        wait_available(&store);
        // The pool's 5 slots are held on Redis, whatever ran meanwhile.
        let exact = exact(&server, &prefix, &spec);
        let held = exact.in_flight(None, Duration::ZERO).unwrap();
        assert!((5..=10).contains(&held), "{mode:?}: {held} slots held");
    }
}
