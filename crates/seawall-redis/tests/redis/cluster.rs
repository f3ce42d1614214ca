//! The store on a real Redis Cluster (three masters, one replica each, on
//! loopback): the contract suite and the model tests; every script on one
//! slot (the cluster refuses anything else, as the first test shows);
//! `MOVED` and `ASK` followed while a resource's slot migrates; a master
//! restarted empty waited for, on its slots only; a node list that is not
//! one cluster's refused naming the node.
//!
//! The tests that leave the nodes alone share one cluster (each its own key
//! prefix); the restart test starts a cluster of its own, as does
//! `failover.rs`.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use seawall::store::contract::{self, ManualClock};
use seawall::store::{AdmitRequest, Outcome, Record, Reserve, ResourceSpec};
use seawall::{
    Bulkhead, CircuitBreaker, Cooldown, Error, PartitionKey, Pipeline, RateLimiter,
    RejectionReason, StateStore, StoreError,
};
use seawall_redis::{Leasing, RedisStore, RedisStoreError, TimeSource};

use crate::contract::WallClock;
use crate::support::{command_calls, error_count, rt, unique, Events, RedisCluster, RedisServer};

/// The cluster shared by the tests of this file that never stop, restart
/// or reconfigure its nodes (the migration test moves one slot that no
/// other test uses). Held for the whole test binary: its nodes are killed
/// when the test process ends (see `seawall_test_redis::RedisCluster`).
fn shared() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(RedisCluster::start)
}

// ------------------------------------------------------------ contract

#[test]
fn contract_holds_on_a_cluster_on_both_clocks() {
    let cluster = shared();
    // Every node as a seed, replicas too.
    let store = RedisStore::cluster(cluster.urls())
        .prefix(unique("cluster-contract"))
        .timeout(Duration::from_secs(2))
        .fail_closed()
        .build()
        .unwrap();
    contract::run_all(&store, &WallClock);
    let store = RedisStore::cluster(cluster.master_urls())
        .prefix(unique("cluster-contract-caller"))
        .time_source(TimeSource::Caller)
        .timeout(Duration::from_secs(2))
        .fail_closed()
        .build()
        .unwrap();
    contract::run_all(&store, &ManualClock::new());
}

#[test]
fn models_agree_on_a_cluster_from_zero_and_far_from_it() {
    let cluster = shared();
    let store = crate::models::model_store(RedisStore::cluster(cluster.master_urls()));
    crate::models::agrees_on(&store, Duration::ZERO, 48);
    crate::models::agrees_on(&store, Duration::from_secs(1_000_000), 48);
}

// ----------------------------------------------------------- one slot

/// Sum of `code` errors over the masters.
fn errors_on_masters(cluster: &RedisCluster, code: &str) -> u64 {
    cluster
        .masters()
        .into_iter()
        .map(|p| error_count(&mut cluster.conn(p), code))
        .sum()
}

fn script_calls_on_masters(cluster: &RedisCluster) -> u64 {
    cluster
        .masters()
        .into_iter()
        .map(|p| crate::support::script_calls(&command_calls(&mut cluster.conn(p))))
        .sum()
}

/// The cluster refuses a script whose keys are in two slots (`CROSSSLOT`)
/// and one that touches a key it did not declare in another slot; then
/// every script of the store (every operation, sync and async, on the
/// unpartitioned state and on partitions whose names hold `{`, `}` and
/// `:`) runs on the cluster without one such error.
#[test]
fn no_script_touches_two_slots() {
    let cluster = shared();
    let (a, b) = ("{cluster-a}:k", "{cluster-b}:k");
    assert_ne!(cluster.keyslot(a), cluster.keyslot(b));
    let mut on_a = cluster.conn(cluster.master_of(a));
    let crossslot = redis::cmd("EVAL")
        .arg("redis.call('SET', KEYS[1], 1) redis.call('SET', KEYS[2], 1)")
        .arg(2)
        .arg(a)
        .arg(b)
        .query::<()>(&mut on_a)
        .unwrap_err();
    assert_eq!(crossslot.code(), Some("CROSSSLOT"), "{crossslot}");
    let undeclared = redis::cmd("EVAL")
        .arg("redis.call('SET', KEYS[1], 1) redis.call('SET', ARGV[1], 1)")
        .arg(1)
        .arg(a)
        .arg(b)
        .query::<()>(&mut on_a)
        .unwrap_err();
    assert!(
        undeclared.to_string().contains("slot") || undeclared.to_string().contains("non local"),
        "{undeclared}"
    );

    let crossslot_before = errors_on_masters(cluster, "CROSSSLOT");
    let scripts_before = script_calls_on_masters(cluster);
    let store = RedisStore::cluster(cluster.master_urls())
        .prefix(unique("one-slot"))
        .caller_clock()
        .fail_closed()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let spec = ResourceSpec::new("odd{name}:x")
        .with_circuit(
            CircuitBreaker::failure_rate(0.5)
                .minimum_calls(100)
                .slow_calls(0.5, Duration::from_millis(10)),
        )
        .with_bulkhead(Bulkhead::new(4))
        .with_cooldown(Cooldown::new())
        .with_rate_limit(
            RateLimiter::gcra(1000, Duration::from_secs(1)).max_wait(Duration::from_millis(100)),
        );
    let state = store.bind(&spec).unwrap();
    let rt = rt();
    let now = Duration::from_secs(1_000_000);
    let mut calls = 0u64;
    for partition in [
        None,
        Some(PartitionKey::from(7u64)),
        Some(PartitionKey::from("tenant}{:7")),
    ] {
        let p = partition.as_ref();
        let request = AdmitRequest {
            partition: p,
            now,
            weight: 1,
            budget: None,
            shadowed: false,
        };
        let record = |permit, outcome, duration| Record {
            partition: p,
            permit,
            outcome,
            duration,
            retry_after: None,
            now,
        };
        let permit = state.admit(&request).unwrap().decision.unwrap();
        state
            .record(&record(permit, Outcome::Failure, Duration::ZERO))
            .unwrap();
        let permit = rt
            .block_on(async { state.admit_async(request).await })
            .unwrap()
            .decision
            .unwrap();
        // Slow: the full record script, on the async path.
        rt.block_on(async {
            state
                .record_async(record(permit, Outcome::Success, Duration::from_millis(20)))
                .await
        })
        .unwrap();
        let permit = rt
            .block_on(async { state.admit_async(request).await })
            .unwrap()
            .decision
            .unwrap();
        // Silent: carried by the next admission, in the same slot.
        rt.block_on(async {
            state
                .record_async(record(permit, Outcome::Success, Duration::ZERO))
                .await
        })
        .unwrap();
        let permit = rt
            .block_on(async { state.admit_async(request).await })
            .unwrap()
            .decision
            .unwrap();
        state.release(p, permit);
        let (admission, reservation) = state
            .admit_reserving(
                &request,
                Reserve {
                    within: Duration::from_millis(100),
                    held: None,
                },
            )
            .unwrap();
        if let Ok(permit) = admission.decision {
            state.release(p, permit);
        }
        if let Some(r) = reservation {
            state.give_back_reservation(p, r);
        }
        state.circuit_metrics(p, now).unwrap();
        for control in [
            seawall::breaker::CircuitControl::Isolate,
            seawall::breaker::CircuitControl::ForceClose,
            seawall::breaker::CircuitControl::Reset,
        ] {
            state.control_circuit(p, control, now).unwrap();
        }
        state.in_flight(p, now).unwrap();
        calls += 13;
    }
    // Releases run in the background: wait for them.
    let deadline = Instant::now() + Duration::from_secs(5);
    while script_calls_on_masters(cluster) < scripts_before + calls && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        script_calls_on_masters(cluster) >= scripts_before + calls,
        "the scripts ran on the masters"
    );
    assert_eq!(errors_on_masters(cluster, "CROSSSLOT"), crossslot_before);
}

// -------------------------------------------------------------- leased

/// Leased mode on a cluster: the lease, give-back, extension and release
/// scripts all run on the master of the resource's slot. A leased GCRA of
/// 100 per second (batches of 10) admits exactly its burst at one instant
/// on the caller's clock, on the blocking and the async path; a leased
/// bulkhead of 4 (batches of 2, TTL 300 ms) never holds more than 4 slots,
/// and its keeper's extensions keep them held past the bulkhead's lease
/// (1 s) on the server's clock; given back when the resource is dropped.
#[test]
fn leased_mode_runs_on_the_master_of_the_resource_s_slot() {
    let cluster = shared();
    let prefix = unique("cluster-leased");
    let builder = || {
        RedisStore::cluster(cluster.master_urls())
            .prefix(&prefix)
            .timeout(Duration::from_secs(2))
            .fail_closed()
    };
    let rt = rt();
    let t0 = Duration::from_secs(1_000_000);
    for (name, asynchronous) in [("sync-api", false), ("async-api", true)] {
        let spec =
            ResourceSpec::new(name).with_rate_limit(RateLimiter::gcra(100, Duration::from_secs(1)));
        let state = builder()
            .caller_clock()
            .leased(name, Leasing::batch(10).low_water(5))
            .build()
            .unwrap()
            .bind(&spec)
            .unwrap();
        let request = AdmitRequest::new(None, t0);
        let admitted = (0..150)
            .filter(|_| {
                let a = if asynchronous {
                    rt.block_on(async { state.admit_async(request).await })
                } else {
                    state.admit(&request)
                };
                a.unwrap().decision.is_ok()
            })
            .count();
        assert_eq!(admitted, 100, "{name}");
    }

    let spec =
        ResourceSpec::new("pool").with_bulkhead(Bulkhead::new(4).lease(Duration::from_secs(1)));
    let leasing = Leasing::batch(2)
        .low_water(0)
        .ttl(Duration::from_millis(300));
    let state = builder()
        .leased("pool", leasing)
        .build()
        .unwrap()
        .bind(&spec)
        .unwrap();
    let exact = builder().build().unwrap().bind(&spec).unwrap();
    let now = Duration::ZERO;
    let request = AdmitRequest::new(None, now);
    let mut held = Vec::new();
    for i in 0..4 {
        let a = if i % 2 == 0 {
            state.admit(&request)
        } else {
            rt.block_on(async { state.admit_async(request).await })
        };
        held.push(a.unwrap().decision.unwrap_or_else(|r| panic!("{i}: {r:?}")));
    }
    let refused = state.admit(&request).unwrap().decision.unwrap_err();
    assert_eq!(refused.reason, RejectionReason::BulkheadFull);
    let start = Instant::now();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(start.elapsed() >= Duration::from_millis(1500));
    assert_eq!(
        exact.in_flight(None, now).unwrap(),
        4,
        "held past the lease"
    );
    assert!(exact.admit(&request).unwrap().decision.is_err());
    for p in held {
        state.release(None, p);
    }
    drop(state);
    let mut left = exact.in_flight(None, now).unwrap();
    for _ in 0..100 {
        if left == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        left = exact.in_flight(None, now).unwrap();
    }
    assert_eq!(left, 0, "given back at drop");
}

// -------------------------------------------------------- MOVED / ASK

/// A name of a resource under `prefix` whose slot holds no key yet.
fn lonely_name(cluster: &RedisCluster, prefix: &str) -> (String, u16) {
    for i in 0.. {
        let name = format!("migrating-{i}");
        let slot = cluster.keyslot(&format!("{{{prefix}:{name}}}:s"));
        let owner = cluster.master_of_slot(slot);
        let keys: u64 = redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(slot)
            .query(&mut cluster.conn(owner))
            .unwrap();
        if keys == 0 {
            return (name, slot);
        }
    }
    unreachable!()
}

fn node_id(cluster: &RedisCluster, port: u16) -> String {
    redis::cmd("CLUSTER")
        .arg("MYID")
        .query(&mut cluster.conn(port))
        .unwrap()
}

/// Starts moving `slot` from `from` to `to` and moves every key it holds
/// (as `redis-cli --cluster reshard` does).
fn start_migration(cluster: &RedisCluster, slot: u16, from: u16, to: u16) {
    let (from_id, to_id) = (node_id(cluster, from), node_id(cluster, to));
    let mut src = cluster.conn(from);
    let mut dst = cluster.conn(to);
    redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("IMPORTING")
        .arg(&from_id)
        .query::<()>(&mut dst)
        .unwrap();
    redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("MIGRATING")
        .arg(&to_id)
        .query::<()>(&mut src)
        .unwrap();
    loop {
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(100)
            .query(&mut src)
            .unwrap();
        if keys.is_empty() {
            break;
        }
        redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(to)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .query::<()>(&mut src)
            .unwrap();
    }
}

/// Gives `slot` to `to` on every master.
fn finish_migration(cluster: &RedisCluster, slot: u16, to: u16) {
    let to_id = node_id(cluster, to);
    for port in cluster.masters() {
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("NODE")
            .arg(&to_id)
            .query::<()>(&mut cluster.conn(port))
            .unwrap();
    }
}

/// A rate limit of 10 while its slot moves to another master. While the
/// slot migrates, the client follows `ASK` to the importing master, which
/// answers `TRYAGAIN` (it serves a command on several keys only once all
/// of them are there, and a resource never has all six): those calls
/// follow the fail mode with a typed error, Redis is not marked down, and
/// a resource on another slot goes through meanwhile. Once the slot has
/// moved, `MOVED` is followed, sync and async, and the state moved with
/// the keys: exactly 10 are admitted in all. A fail-open store on the same
/// resource answers locally meanwhile (degraded), Redis not marked down,
/// and is answered by Redis again after the move; a leased store (batches
/// of 2) spends its batch in hand while the slot migrates, then follows
/// its fail mode, then leases on the new master.
#[test]
fn moved_and_ask_are_followed_while_a_slot_migrates() {
    const LIMIT: u32 = 10;
    let cluster = shared();
    let prefix = unique("moving");
    let (name, slot) = lonely_name(cluster, &prefix);
    let from = cluster.master_of_slot(slot);
    let to = *cluster.masters().iter().find(|&&p| p != from).unwrap();
    let store = RedisStore::cluster(cluster.master_urls())
        .prefix(&prefix)
        .timeout(Duration::from_secs(2))
        .fail_closed()
        .build()
        .unwrap();
    let pipeline = |name: &str| {
        Pipeline::builder(name)
            .rate_limiter(RateLimiter::fixed_window(LIMIT, Duration::from_secs(3600)))
            .store(store.clone())
            .build()
            .unwrap()
    };
    let p = pipeline(&name);
    let elsewhere = pipeline("elsewhere");
    let events = Events::default();
    let open_store = RedisStore::cluster(cluster.master_urls())
        .prefix(&prefix)
        .timeout(Duration::from_secs(2))
        .fail_open()
        .build()
        .unwrap();
    let open = Pipeline::builder(&name)
        .rate_limiter(RateLimiter::fixed_window(LIMIT, Duration::from_secs(3600)))
        .on_event(events.listener())
        .store(open_store.clone())
        .build()
        .unwrap();
    let leased = Pipeline::builder(&name)
        .rate_limiter(RateLimiter::fixed_window(LIMIT, Duration::from_secs(3600)))
        .store(
            RedisStore::cluster(cluster.master_urls())
                .prefix(&prefix)
                .timeout(Duration::from_secs(2))
                .fail_closed()
                .leased(name.as_str(), Leasing::batch(2).low_water(0))
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let one = |p: &Pipeline| p.call(|_| Ok::<_, std::io::Error>(()));
    // A batch of 2 leased, one of them spent.
    one(&leased).unwrap();
    assert_ne!(cluster.keyslot(&format!("{{{prefix}:elsewhere}}:s")), slot);
    let rt = rt();
    let both = |p: &Pipeline| {
        [
            p.call(|_| Ok::<_, std::io::Error>(())),
            rt.block_on(p.run(|_| async { Ok::<_, std::io::Error>(()) })),
        ]
    };
    let mut admitted = 0;
    let mut call = |n: usize| {
        for _ in 0..n {
            for r in both(&p) {
                match r {
                    Ok(()) => admitted += 1,
                    Err(Error::Rejected(r)) => assert_eq!(r.reason, RejectionReason::RateLimited),
                    Err(e) => panic!("not a rejection: {e}"),
                }
            }
        }
    };
    call(2);
    let asks = error_count(&mut cluster.conn(from), "ASK");
    let askings = |c: &RedisCluster| {
        command_calls(&mut c.conn(to))
            .get("asking")
            .copied()
            .unwrap_or(0)
    };
    let askings_before = askings(cluster);
    start_migration(cluster, slot, from, to);
    for r in both(&p) {
        match r {
            Err(Error::Store(StoreError::Unavailable(m))) => {
                assert!(m.contains("migrating") && m.contains("TryAgain"), "{m}")
            }
            other => panic!("while the slot migrates: {other:?}"),
        }
    }
    assert!(store.is_available(), "a migrating slot is not an outage");
    for r in both(&elsewhere) {
        r.unwrap();
    }
    // The batch in hand, then the fail mode.
    one(&leased).unwrap();
    match one(&leased) {
        Err(Error::Store(StoreError::Unavailable(m))) => assert!(m.contains("migrating"), "{m}"),
        other => panic!("leased, the batch spent, while the slot migrates: {other:?}"),
    }
    for r in both(&open) {
        r.unwrap();
    }
    assert_eq!(Events::degraded(&events.take()), 2, "answered locally");
    assert!(
        open_store.is_available(),
        "a migrating slot is not an outage"
    );
    assert!(
        error_count(&mut cluster.conn(from), "ASK") >= asks + 2,
        "both paths were sent to the importing master"
    );
    assert!(askings(cluster) >= askings_before + 2, "and followed there");
    let moved = error_count(&mut cluster.conn(from), "MOVED");
    finish_migration(cluster, slot, to);
    call(4);
    assert!(error_count(&mut cluster.conn(from), "MOVED") > moved);
    assert_eq!(cluster.master_of_slot(slot), to);
    assert_eq!(
        admitted + 2,
        LIMIT,
        "the leased batch and the exact admissions"
    );
    // The limit is spent: refused by Redis, on the new master.
    for r in both(&open).into_iter().chain([one(&leased)]) {
        assert_eq!(
            r.unwrap_err().rejection().unwrap().reason,
            RejectionReason::RateLimited
        );
    }
    assert_eq!(Events::degraded(&events.take()), 0, "answered by Redis");
}

// ------------------------------------------------------------ restart

/// A master restarted empty (faster than the cluster's node timeout: no
/// failover) lost the windows of its slots: admissions to a resource on it
/// wait until the restarted master is one window old (fail-closed:
/// `Error::Store` naming the restart; fail-open: answered locally,
/// degraded, never through Redis before then), then admit one quota again;
/// a resource on another master is not held.
#[test]
fn a_master_restarted_empty_is_waited_for_on_its_slots_only() {
    const LIMIT: u32 = 3;
    // Longer than the store takes to be back (the restarted node rejoins
    // the cluster first).
    const WINDOW: Duration = Duration::from_secs(6);
    let mut cluster = RedisCluster::start();
    let prefix = unique("emptied");
    let store = RedisStore::cluster(cluster.master_urls())
        .prefix(&prefix)
        .timeout(Duration::from_millis(500))
        .reconnect_interval(Duration::from_millis(100))
        .fail_closed()
        .build()
        .unwrap();
    let pipeline = |name: &str| {
        Pipeline::builder(name)
            .rate_limiter(RateLimiter::sliding_window(LIMIT, WINDOW))
            .store(store.clone())
            .build()
            .unwrap()
    };
    let slot_of = |name: &str| cluster.keyslot(&format!("{{{prefix}:{name}}}:s"));
    let held = pipeline("held");
    let master = cluster.master_of_slot(slot_of("held"));
    let other_name = (0..)
        .map(|i| format!("other-{i}"))
        .find(|n| cluster.master_of_slot(slot_of(n)) != master)
        .unwrap();
    let other = pipeline(&other_name);
    // A fail-open store (every call reaches Redis: no refusal replayed) on
    // another resource of the same master.
    let open_name = (0..)
        .map(|i| format!("open-{i}"))
        .find(|n| cluster.master_of_slot(slot_of(n)) == master)
        .unwrap();
    let events = Events::default();
    let open = Pipeline::builder(&open_name)
        .rate_limiter(RateLimiter::sliding_window(LIMIT, WINDOW))
        .on_event(events.listener())
        .store(
            RedisStore::cluster(cluster.master_urls())
                .prefix(&prefix)
                .timeout(Duration::from_millis(500))
                .reconnect_interval(Duration::from_millis(100))
                .local_refusals(0)
                .fail_open()
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let open_slot = slot_of(&open_name);
    let ok = |p: &Pipeline| p.call(|_| Ok::<_, std::io::Error>(()));
    // The fail-open store's first admission: its quota is free again a
    // window later at the earliest (then only if the master kept its data:
    // a failover under load instead of the restart).
    let first_open = Instant::now();
    for _ in 0..LIMIT {
        ok(&held).unwrap();
        ok(&open).unwrap();
    }
    assert!(ok(&held).unwrap_err().rejection().is_some());
    assert!(ok(&open).unwrap_err().rejection().is_some());
    assert_eq!(Events::degraded(&events.take()), 0);
    // The fail-open store's admissions after the restart: locally, and
    // through Redis.
    let (mut open_local, mut open_shared) = (0, 0);

    let restarting = Instant::now();
    cluster.restart(master);
    let restarted = Instant::now();
    // Until the store is through the outage: then `held` is held, `other`
    // is not.
    let mut outage = 0;
    let (mut holds, mut admitted, mut replayed) = (0, 0, 0);
    loop {
        assert!(
            restarted.elapsed() < Duration::from_secs(20),
            "never recovered"
        );
        match ok(&other) {
            Err(Error::Store(StoreError::Unavailable(m))) if !m.contains("restarted") => {
                outage += 1;
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            Err(Error::Store(StoreError::Timeout(_))) => {
                outage += 1;
                continue;
            }
            Ok(()) | Err(Error::Rejected(_)) => {}
            Err(e) => panic!("the other master's resource: {e}"),
        }
        let r = ok(&open);
        let degraded = Events::degraded(&events.take()) > 0;
        match r {
            Ok(()) if degraded => open_local += 1,
            Ok(()) => {
                // Through Redis only once the restarted master is a window
                // old (it started after `restarting`; never early), or the
                // first quota's window has passed.
                assert!(
                    first_open.elapsed() >= WINDOW,
                    "fail-open admitted through Redis in the window of the restart, {:?} after \
                     it ({open_local} local, {holds} held, {replayed} replayed, {outage} \
                     outage answers; master of the slot now {}, was {master})",
                    restarting.elapsed(),
                    cluster.master_of_slot(open_slot),
                );
                open_shared += 1;
            }
            Err(Error::Rejected(_)) => {}
            Err(e) => panic!("fail-open: {e}"),
        }
        match ok(&held) {
            Err(Error::Store(StoreError::Unavailable(m))) if m.contains("restarted") => {
                holds += 1;
            }
            Err(Error::Store(_)) => {}
            Ok(()) => {
                admitted += 1;
                break;
            }
            // The refusal Redis gave before the restart, replayed until
            // its end while this store has not noticed the restart (no
            // call went to that master since).
            Err(Error::Rejected(r)) if r.reason == RejectionReason::RateLimited => replayed += 1,
            Err(e) => panic!("{e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Waited for: held by the restart, or refused by the refusal replayed
    // until the end of the window it was given in (then the restarted
    // master is as old as the window when the store reaches it).
    assert!(
        holds + replayed > 0,
        "the restart was waited for ({outage} outage answers)"
    );
    while admitted < LIMIT + 2 {
        match ok(&held) {
            Ok(()) => admitted += 1,
            Err(e) if e.rejection().is_some() => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(admitted, LIMIT, "one quota in the new window");
    // Fail-open: answered locally while held (its store dates the restart
    // on its own, up to a second apart), then through Redis, one quota in
    // the new window.
    loop {
        assert!(
            restarted.elapsed() < Duration::from_secs(30),
            "the fail-open store never answered through Redis again"
        );
        let r = ok(&open);
        let degraded = Events::degraded(&events.take()) > 0;
        match r {
            Ok(()) | Err(Error::Rejected(_)) if degraded => {
                open_local += u32::from(r.is_ok());
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(()) => {
                assert!(first_open.elapsed() >= WINDOW, "through Redis while held");
                open_shared += 1;
                assert!(open_shared <= LIMIT, "more than one quota");
            }
            Err(e) if e.rejection().is_some() => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(open_local > 0, "the fail-open store never answered locally");
    assert_eq!(open_shared, LIMIT, "one quota in the new window, fail-open");
}

// ---------------------------------------------------------- bad input

fn spec() -> ResourceSpec {
    ResourceSpec::new("guarded").with_bulkhead(Bulkhead::new(1))
}

#[test]
fn a_bad_node_list_is_refused_at_build_naming_the_node() {
    let err = |urls: Vec<&str>| RedisStore::cluster(urls).build().unwrap_err();
    match err(vec![
        "redis://:same-pw@127.0.0.1:7000",
        "redis://:other-pw@127.0.0.1:7001",
    ]) {
        RedisStoreError::InvalidUrl { url, reason } => {
            assert_eq!(url, "redis://:***@127.0.0.1:7001");
            assert!(reason.contains("password differs"), "{reason}");
            assert!(!reason.contains("same-pw") && !reason.contains("other-pw"));
        }
        other => panic!("{other:?}"),
    }
    match err(vec![
        "redis://127.0.0.1:7000",
        "redis://ada:pw@127.0.0.1:7001",
    ]) {
        RedisStoreError::InvalidUrl { url, reason } => {
            assert_eq!(url, "redis://ada:***@127.0.0.1:7001");
            assert!(reason.contains("user differs"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    match err(vec!["redis://127.0.0.1:7000", "redis://127.0.0.1:7001/2"]) {
        RedisStoreError::InvalidUrl { url, reason } => {
            assert_eq!(url, "redis://127.0.0.1:7001/2");
            assert!(reason.contains("database 0 only"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    match err(vec!["redis://127.0.0.1:7000", "redis+unix:///tmp/r.sock"]) {
        RedisStoreError::InvalidUrl { url, reason } => {
            assert_eq!(url, "redis+unix:///tmp/r.sock");
            assert!(reason.contains("unix socket"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    match err(vec!["redis://127.0.0.1:7000", "http://127.0.0.1:7001"]) {
        RedisStoreError::InvalidUrl { url, .. } => assert_eq!(url, "http://127.0.0.1:7001"),
        other => panic!("{other:?}"),
    }
    match err(vec![]) {
        RedisStoreError::InvalidConfig { field, .. } => assert_eq!(field, "cluster"),
        other => panic!("{other:?}"),
    }
}

/// A cluster-enabled server of its own, with `slots` assigned to it (a
/// one-node cluster: in state `ok` only with every slot).
fn lone_cluster_node(slots: Option<(u16, u16)>) -> RedisServer {
    let server = RedisServer::start_with(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
    ]);
    if let Some((a, b)) = slots {
        let mut c = server.conn();
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("ADDSLOTS");
        for s in a..=b {
            cmd.arg(s);
        }
        cmd.query::<()>(&mut c).unwrap();
    }
    server
}

/// What binding a store on `urls` answers (the pipeline's build fails with
/// it too, naming the store).
fn bind(urls: Vec<String>, open: bool) -> Result<(), StoreError> {
    let b = RedisStore::cluster(urls)
        .prefix(unique("bad-list"))
        .timeout(Duration::from_secs(1));
    let store = if open { b.fail_open() } else { b.fail_closed() }
        .build()
        .unwrap();
    store.bind(&spec()).map(drop)
}

#[test]
fn a_node_list_that_is_not_one_cluster_s_is_refused_at_bind_naming_the_node() {
    let cluster = shared();
    let single = RedisServer::start();
    let slotless = lone_cluster_node(None);
    let foreign = lone_cluster_node(Some((0, 16383)));
    let first = cluster.master_urls()[0].clone();
    for open in [true, false] {
        match bind(vec![first.clone(), single.url()], open) {
            Err(StoreError::Refused(m)) => {
                assert!(
                    m.contains(&single.url()) && m.contains("not a cluster node"),
                    "{m}"
                )
            }
            other => panic!("{other:?}"),
        }
        match bind(vec![slotless.url(), first.clone()], open) {
            Err(StoreError::Refused(m)) => {
                assert!(
                    m.contains(&slotless.url()) && m.contains("serves no slots"),
                    "{m}"
                )
            }
            other => panic!("{other:?}"),
        }
        match bind(vec![first.clone(), foreign.url()], open) {
            Err(StoreError::Refused(m)) => {
                assert!(
                    m.contains(&foreign.url()) && m.contains("not a node of the cluster"),
                    "{m}"
                )
            }
            other => panic!("{other:?}"),
        }
        // A replica is a node of the cluster like any other.
        let replica = cluster.replica_of(cluster.masters()[0]);
        bind(vec![format!("redis://127.0.0.1:{replica}")], open).unwrap();
    }
    // The pipeline's build reports it, naming the node.
    let e = Pipeline::builder("guarded")
        .bulkhead(Bulkhead::new(1))
        .store(
            RedisStore::cluster([first, single.url()])
                .prefix(unique("bad-list"))
                .build()
                .unwrap(),
        )
        .build()
        .unwrap_err();
    assert!(e.to_string().contains(&single.url()), "{e}");
}

/// A cluster that cannot serve every slot when the store starts is an
/// outage naming the node (as an unreachable server is): the pipeline
/// builds, calls follow the fail mode with that error.
#[test]
fn a_cluster_in_fail_state_at_start_is_an_outage_naming_the_node() {
    let node = lone_cluster_node(Some((0, 99)));
    let info: String = redis::cmd("CLUSTER")
        .arg("INFO")
        .query(&mut node.conn())
        .unwrap();
    assert!(info.contains("cluster_state:fail"), "{info}");
    for open in [false, true] {
        let b = RedisStore::cluster([node.url()])
            .prefix(unique("failing"))
            .timeout(Duration::from_millis(300))
            .reconnect_interval(Duration::from_millis(100));
        let store = if open { b.fail_open() } else { b.fail_closed() }
            .build()
            .unwrap();
        let events = crate::support::Events::default();
        let p = Pipeline::builder("guarded")
            .bulkhead(Bulkhead::new(1))
            .on_event(events.listener())
            .store(store.clone())
            .build()
            .unwrap();
        let r = p.call(|_| Ok::<_, std::io::Error>(()));
        let named = |m: &str| m.contains(&node.url()) && m.contains("cluster_state:fail");
        if open {
            r.unwrap();
            let seen = events.take();
            assert_eq!(crate::support::Events::degraded(&seen), 1, "{seen:?}");
            assert!(named(&format!("{seen:?}")), "{seen:?}");
        } else {
            match r {
                Err(Error::Store(StoreError::Unavailable(m))) => assert!(named(&m), "{m}"),
                other => panic!("{other:?}"),
            }
        }
        match store.ping() {
            Err(StoreError::Unavailable(m)) => assert!(named(&m), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
