//! The retry budget kept in Redis (`RetryBudget::shared`): the admit
//! script's restatement of the budget's rule against the model
//! (`seawall::model::budget`, which the memory store also passes), on the
//! caller's clock from 0 and from 10^6 s; the round trips it costs; and the
//! store's fail mode when Redis is down. The four-process bound is in
//! `cross_process.rs`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use proptest::test_runner::{Config, TestCaseError, TestRunner};
use seawall::event::GiveUpReason;
use seawall::model::budget::{self, strategy};
use seawall::store::{AdmitRequest, BudgetStep, StateStore};
use seawall::{
    Bulkhead, Error, EventKind, MemoryStore, Pipeline, RejectionReason, Retry, RetryBudget,
    StoreError,
};
use seawall_redis::RedisStore;

use crate::models::model_store;
use crate::support::{command_calls, reset_stats, rt, script_calls, unique, Events, RedisServer};

fn agrees_from(start: Duration) {
    let server = RedisServer::start();
    let store = model_store(RedisStore::builder(server.url()));
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 96,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&(strategy::setup(), strategy::ops(60)), |(setup, ops)| {
        let name = format!("budget-{}", RUNS.fetch_add(1, Ordering::Relaxed));
        let spec = setup.spec(&name);
        // The same run on the memory store (the rule in Rust) and on Redis
        // (the rule in Lua): both as the model says, hence as each other.
        let memory = MemoryStore::new().bind(&spec).unwrap();
        let redis = store.bind(&spec).unwrap();
        let in_memory =
            budget::check(&setup, &*memory, &ops, start).map_err(TestCaseError::fail)?;
        let in_redis = budget::check(&setup, &*redis, &ops, start)
            .map_err(|e| TestCaseError::fail(format!("redis: {e}")))?;
        if in_memory != in_redis {
            return Err(TestCaseError::fail(format!(
                "withdrawals: memory {in_memory}, redis {in_redis}"
            )));
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn the_admit_script_agrees_with_the_budget_model_from_zero() {
    agrees_from(Duration::ZERO);
}

#[test]
fn the_admit_script_agrees_with_the_budget_model_from_a_million_seconds() {
    agrees_from(Duration::from_secs(1_000_000));
}

#[test]
fn the_bucket_is_one_per_resource_across_stores() {
    let server = RedisServer::start();
    let prefix = unique("budget-one");
    let stores: Vec<RedisStore> = (0..2)
        .map(|_| {
            RedisStore::builder(server.url())
                .prefix(prefix.clone())
                .fail_closed()
                .build()
                .unwrap()
        })
        .collect();
    let spec = budget::Setup {
        budget: RetryBudget::new(0.5, 1).shared(),
        slots: None,
        permits: None,
    }
    .spec("one");
    let a = stores[0].bind(&spec).unwrap();
    let b = stores[1].bind(&spec).unwrap();
    let withdraw = AdmitRequest::new(None, Duration::ZERO).with_budget(BudgetStep::Withdraw);
    let deposit = AdmitRequest::new(None, Duration::ZERO).with_budget(BudgetStep::Deposit);
    let reason = |r: &dyn seawall::store::ResourceState, req: &AdmitRequest<'_>| {
        r.admit(req).unwrap().decision.err().map(|r| r.reason)
    };
    assert_eq!(reason(&*a, &withdraw), None);
    // The other store's binding sees the bucket a emptied.
    assert_eq!(
        reason(&*b, &withdraw),
        Some(RejectionReason::RetryBudgetExhausted)
    );
    assert_eq!(reason(&*a, &deposit), None);
    assert_eq!(reason(&*b, &deposit), None);
    assert_eq!(reason(&*b, &withdraw), None);
    // The bucket is a key of the resource's hash tag.
    let mut conn = server.conn();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{prefix}:one}}:*"))
        .query(&mut conn)
        .unwrap();
    assert_eq!(keys, [format!("{{{prefix}:one}}:rb")]);
}

/// A pipeline whose attempts all fail (3 attempts, no wait), with a
/// shared budget of `tokens` earning `ratio`, and a bulkhead if asked.
fn failing(
    store: RedisStore,
    ratio: f64,
    tokens: u32,
    bulkhead: bool,
    events: &Events,
) -> Pipeline {
    let mut b = Pipeline::builder("budgeted")
        .retry(
            Retry::constant(Duration::ZERO)
                .max_attempts(3)
                .budget(RetryBudget::new(ratio, tokens).shared()),
        )
        .on_event(events.listener());
    if bulkhead {
        b = b.bulkhead(Bulkhead::new(10).lease(Duration::from_secs(10)));
    }
    b.store(store).build().unwrap()
}

/// Attempts of one failing call, sync or async.
fn attempts(
    p: &Pipeline,
    rt: &tokio::runtime::Runtime,
    sync: bool,
) -> (u32, Error<std::io::Error>) {
    let n = AtomicU32::new(0);
    let op = || {
        n.fetch_add(1, Ordering::SeqCst);
        Err::<(), _>(std::io::Error::other("down"))
    };
    let e = if sync {
        p.call(|_| op()).unwrap_err()
    } else {
        rt.block_on(p.run(|_| {
            let r = op();
            async move { r }
        }))
        .unwrap_err()
    };
    (n.load(Ordering::SeqCst), e)
}

#[test]
fn the_budget_rides_on_the_admission_no_extra_round_trip() {
    let server = RedisServer::start();
    let store = || {
        RedisStore::builder(server.url())
            .prefix(unique("budget-trips"))
            .fail_closed()
            .build()
            .unwrap()
    };
    let rt = rt();
    let mut conn = server.conn();
    for bulkhead in [false, true] {
        for sync in [true, false] {
            let events = Events::default();
            // Plenty of tokens: every call makes its three attempts.
            let p = failing(store(), 1.0, 1000, bulkhead, &events);
            reset_stats(&mut conn);
            let (n, _) = attempts(&p, &rt, sync);
            assert_eq!(n, 3);
            let scripts = script_calls(&command_calls(&mut conn));
            // Only a budget: one admission per attempt, no record. With a
            // bulkhead: its admission and record per attempt, as without a
            // budget.
            let expected = if bulkhead { 6 } else { 3 };
            assert_eq!(scripts, expected, "bulkhead {bulkhead} sync {sync}");
        }
    }
}

#[test]
fn a_store_down_follows_the_fail_mode() {
    let mut server = RedisServer::start();
    let url = server.url();
    let rt = rt();
    let build = |open: bool, events: &Events| {
        let b = RedisStore::builder(url.clone())
            .prefix(unique("budget-down"))
            .timeout(Duration::from_millis(200))
            .reconnect_interval(Duration::from_millis(100));
        let store = if open { b.fail_open() } else { b.fail_closed() }
            .build()
            .unwrap();
        failing(store, 0.5, 1, false, events)
    };
    server.kill();
    for sync in [true, false] {
        // Fail-open: a budget of this process, full at first (one token,
        // half a token per call): the first call retries once and is
        // refused its second retry; the next call earns half a token and
        // is refused its first; the third earns the other half.
        let events = Events::default();
        let open = build(true, &events);
        let calls: Vec<(u32, bool)> = (0..3)
            .map(|_| {
                let (n, e) = attempts(&open, &rt, sync);
                let refused = matches!(
                    &e,
                    Error::Rejected(r) if r.reason == RejectionReason::RetryBudgetExhausted
                );
                (n, refused)
            })
            .collect();
        assert_eq!(calls, [(2, true), (1, true), (2, true)], "sync {sync}");
        let events = events.take();
        assert_eq!(
            Events::degraded(&events),
            8,
            "every admission answered locally"
        );
        let gave_up = events
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    EventKind::RetryGaveUp {
                        reason: GiveUpReason::Budget,
                        ..
                    }
                )
            })
            .count();
        assert_eq!(gave_up, 3);
        // Fail-closed: the first admission fails, the operation never runs.
        let closed = build(false, &Events::default());
        let (n, e) = attempts(&closed, &rt, sync);
        assert_eq!(n, 0);
        assert!(
            matches!(
                e,
                Error::Store(StoreError::Unavailable(_) | StoreError::Timeout(_))
            ),
            "{e:?}"
        );
    }
}
