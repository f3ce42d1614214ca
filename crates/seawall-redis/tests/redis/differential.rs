//! The differential corpus of the core crate (`seawall::testing::differential`)
//! on a real Redis server, on the caller's clock: every scenario, in every
//! mode (sync and async, with and without a listener, on clocks at 0 and at
//! 10^6 s), each run on a fresh `RedisStore` under a prefix of its own on
//! one server, must agree with itself across modes as on the in-memory
//! store, state the results the scenario states, and observe exactly what
//! the same mode observed on a `MemoryStore`: results, operation calls,
//! sleeps, end times, nested results and store state.
//!
//! No observable is excused: on the caller's clock every scenario of the
//! corpus observes on Redis exactly what it observes in memory, the
//! hedging scenarios included (async only: the attempts of a hedged call
//! take their bulkhead slots, circuit permits and rate-limit permits on
//! the server concurrently; the runner holds the virtual clock while a
//! request is in flight, so no attempt's sleep runs ahead of an answer). The state
//! read after a call sees every record of it: a silent success, or a slot
//! given back, waiting to be carried is not counted in flight, one the
//! store's timer has taken is waited for, and the circuit's metrics send
//! every record waiting first. The whole corpus runs on one server, in
//! about a second: with the scripts run as functions, and again by
//! `EVALSHA` (a user without functions, as on a server before Redis 7).

use std::time::Duration;

use seawall::testing::differential::{self, corpus, Scenario};
use seawall::MemoryStore;
use seawall_redis::RedisStore;

use crate::support::{both_ways, unique, RedisServer};

/// A store on the caller's clock (the pipeline's virtual clock decides
/// every window, lease and open period, so durations compare exactly),
/// failing closed (an outage is an error, never a local answer that would
/// hide a difference), under a fresh prefix.
fn store(url: &str) -> RedisStore {
    RedisStore::builder(url)
        .prefix(unique("differential"))
        .caller_clock()
        .fail_closed()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// The problems of `scenario` on Redis: across its own modes, against
/// the scenario's stated results, and against the in-memory runs.
fn problems(url: &str, scenario: &Scenario) -> Option<String> {
    let memory = differential::run_all(scenario, MemoryStore::new);
    let redis = differential::run_all(scenario, || store(url));
    let mut problems = differential::check(scenario, &redis);
    problems.extend(
        differential::compare(&memory, &redis)
            .into_iter()
            .map(|p| format!("against the memory store: {p}")),
    );
    (!problems.is_empty()).then(|| differential::report(scenario, &problems, &redis))
}

#[test]
fn corpus_on_redis_agrees_with_the_memory_store() {
    let server = RedisServer::start();
    for (how, url) in both_ways(&server) {
        let failures: Vec<String> = corpus().iter().filter_map(|s| problems(&url, s)).collect();
        assert!(
            failures.is_empty(),
            "{} scenario(s) failed on Redis ({how}):\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}

/// GCRA with emission intervals of no whole number of microseconds (3 and
/// 7 per second), on clocks at 0, at 10^6 s and where the server's clock
/// is (1.7 * 10^15 us since 1970): every decision and every wait is the
/// in-memory store's, to the nanosecond, over a hundred calls, each made
/// when the previous refusal said (or at once). The scripts once kept these
/// times in fractional microseconds in doubles: a call at the edge of the
/// tolerance was refused and told to wait 0 or 1 us, and a wait of 1/3 s
/// was rounded up to the microsecond.
#[test]
fn gcra_of_a_fractional_interval_decides_as_the_memory_store() {
    use seawall::store::{AdmitRequest, ResourceSpec};
    use seawall::{RateLimiter, StateStore};

    let server = RedisServer::start();
    let redis = store(&server.url());
    let memory = MemoryStore::new();
    let second = Duration::from_secs(1);
    let limiters = [
        RateLimiter::gcra(3, second),
        RateLimiter::gcra(3, second).burst(1),
        RateLimiter::gcra(7, second).burst(2),
    ];
    let starts = [
        Duration::ZERO,
        Duration::from_secs(1_000_000),
        Duration::from_secs(1_700_000_000),
    ];
    for limiter in &limiters {
        for &start in &starts {
            let spec = ResourceSpec::new(unique("gcra")).with_rate_limit(limiter.clone());
            let on_memory = memory.bind(&spec).unwrap();
            let on_redis = redis.bind(&spec).unwrap();
            let mut now = start;
            let mut refusals = 0;
            for i in 0..100 {
                let request = AdmitRequest {
                    partition: None,
                    now,
                    weight: 1,
                    budget: None,
                    shadowed: false,
                };
                let expected = on_memory.admit(&request).unwrap().decision;
                let got = on_redis.admit(&request).unwrap().decision;
                // The decision, and a refusal's reason and wait, exactly.
                let decided = |d: &Result<_, seawall::Rejection>| {
                    d.as_ref().map(|_| ()).map_err(|r| format!("{r:?}"))
                };
                assert_eq!(
                    decided(&got),
                    decided(&expected),
                    "{limiter:?} from {start:?}, call {i} at {now:?}"
                );
                if let Err(rejection) = expected {
                    refusals += 1;
                    now += rejection.retry_after.expect("a GCRA refusal says when");
                }
            }
            assert!(refusals > 10, "{limiter:?}: the limit was reached");
        }
    }
}

/// A GCRA state written by an earlier version of the scripts (the TAT in
/// fractional microseconds) is read rounded up to the nanosecond, so a
/// rolling upgrade keeps the limit.
#[test]
fn gcra_reads_the_state_of_earlier_scripts() {
    use seawall::store::{AdmitRequest, ResourceSpec};
    use seawall::{RateLimiter, StateStore};

    let server = RedisServer::start();
    let redis = store(&server.url());
    let spec = ResourceSpec::new("earlier")
        .with_rate_limit(RateLimiter::gcra(3, Duration::from_secs(1)).burst(1));
    let state = redis.bind(&spec).unwrap();
    let key = format!("{{{}:earlier}}:rg", redis.prefix());
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("1000.2504")
        .query(&mut server.conn())
        .unwrap();
    let admit = |now: Duration| {
        state
            .admit(&AdmitRequest {
                partition: None,
                now,
                weight: 1,
                budget: None,
                shadowed: false,
            })
            .unwrap()
            .decision
    };
    let refused = admit(Duration::from_micros(1000)).expect_err("before the stored TAT");
    assert_eq!(refused.retry_after, Some(Duration::from_nanos(251)));
    admit(Duration::from_nanos(1_000_251)).expect("at the stored TAT");
    let stored: String = redis::cmd("GET")
        .arg(&key)
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(
        stored, "334333:585",
        "the TAT moved one interval (1/3 s rounded up to the ns)"
    );
}
