//! Round trips counted by the server (`INFO commandstats`): one script call
//! to admit an attempt through every stateful policy, one to record a
//! failure; a success is carried by the next admission, blocking or async
//! (see `carried.rs`).

use std::time::Duration;

use seawall::{Bulkhead, CircuitBreaker, Cooldown, Pipeline, RateLimiter, Retry};
use seawall_redis::RedisStore;

use crate::support::{
    both_ways, command_calls, error_count, flush_scripts, function_loads, functions_url,
    reset_stats, rt, script_calls, script_loads, unique, RedisServer, SCRIPTS_ONLY,
};

const CALLS: u32 = 25;

/// A store on `url` failing closed, under a fresh prefix starting with
/// `prefix`.
fn failing_closed(url: &str, prefix: &str) -> RedisStore {
    RedisStore::builder(url)
        .prefix(unique(prefix))
        .fail_closed()
        .build()
        .unwrap()
}

/// The script calls counted once they reach `expected` (the last success
/// is sent on its own once its delay ends), or after 10 s.
fn script_calls_reaching(
    conn: &mut redis::Connection,
    expected: u64,
) -> (u64, std::collections::HashMap<String, u64>) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let stats = command_calls(conn);
        if script_calls(&stats) >= expected || std::time::Instant::now() > deadline {
            return (script_calls(&stats), stats);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn one_round_trip_to_admit_and_one_to_record_a_failure() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique("trips"))
        .success_delay(Duration::from_secs(1))
        .fail_closed()
        .build()
        .unwrap();
    let p = Pipeline::builder("counted")
        .retry(Retry::constant(Duration::from_millis(1)).max_attempts(3))
        .circuit_breaker(
            CircuitBreaker::failure_rate(0.9)
                .count_window(100)
                .minimum_calls(100),
        )
        .timeout(Duration::from_secs(2))
        .bulkhead(Bulkhead::new(10).lease(Duration::from_secs(10)))
        .cooldown(Cooldown::new())
        .rate_limiter(RateLimiter::gcra(100_000, Duration::from_secs(1)))
        .store(store)
        .build()
        .unwrap();
    let mut conn = server.conn();
    reset_stats(&mut conn);

    // Sync: every call fails once, then succeeds: two attempts per call.
    let mut attempts = 0;
    for _ in 0..CALLS {
        let mut first = true;
        p.call(|_| {
            attempts += 1;
            if std::mem::take(&mut first) {
                Err(std::io::Error::other("once"))
            } else {
                Ok(())
            }
        })
        .unwrap();
    }
    assert_eq!(attempts, 2 * CALLS);
    // Each success is carried by the next call's first admission; the
    // last is sent on its own once its delay (1 s) ends.
    let expected = u64::from(attempts + CALLS + 1);
    let (calls, stats) = script_calls_reaching(&mut conn, expected);
    assert_eq!(calls, expected, "sync: {stats:?}");
    assert_eq!(
        script_loads(&stats),
        0,
        "scripts were loaded once, at build time"
    );

    // Async: the same, but for the successes: each is carried by the next
    // call's first admission.
    reset_stats(&mut conn);
    let attempts = std::sync::atomic::AtomicU32::new(0);
    // One long-lived runtime, as in a service (a runtime shut down with a
    // record in flight gives the slot back with one more call).
    let rt = rt();
    rt.block_on(async {
        for _ in 0..CALLS {
            let first = std::sync::atomic::AtomicBool::new(true);
            p.run(|_| async {
                attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if first.swap(false, std::sync::atomic::Ordering::Relaxed) {
                    Err(std::io::Error::other("once"))
                } else {
                    Ok(())
                }
            })
            .await
            .unwrap();
        }
    });
    let attempts = attempts.into_inner();
    assert_eq!(attempts, 2 * CALLS);
    let expected = u64::from(attempts + CALLS + 1);
    let (calls, stats) = script_calls_reaching(&mut conn, expected);
    assert_eq!(calls, expected, "async: {stats:?}");
}

#[test]
fn scripts_flushed_from_the_server_are_reloaded() {
    let server = RedisServer::start();
    for (how, url) in both_ways(&server) {
        let store = failing_closed(&url, "flush");
        let p = Pipeline::builder("flushed")
            .circuit_breaker(CircuitBreaker::consecutive_failures(3))
            .bulkhead(Bulkhead::new(2))
            .store(store)
            .build()
            .unwrap();
        let mut conn = server.conn();
        reset_stats(&mut conn);
        flush_scripts(&mut conn);
        p.call(|_| Ok::<_, std::io::Error>(())).unwrap();
        flush_scripts(&mut conn);
        rt().block_on(p.run(|_| async { Ok::<_, std::io::Error>(()) }))
            .unwrap();
        assert_eq!(p.in_flight().unwrap(), 0, "{how}");
        let stats = command_calls(&mut conn);
        assert!(
            script_loads(&stats) >= 2,
            "{how}: reloaded after each flush: {stats:?}"
        );
        if how == "functions" {
            assert!(function_loads(&stats) >= 2, "{how}: {stats:?}");
        }
    }
}

/// The admission scripts are compiled for each spec: a server that lost its
/// scripts gets those of every spec bound so far with the first `NOSCRIPT`
/// (or missing function), so that the other resources' admissions find
/// theirs (one miss, one restart noted, for the server). As functions, the
/// library holds the admission of every spec.
#[test]
fn a_flushed_server_gets_the_admission_scripts_of_every_spec_at_once() {
    let server = RedisServer::start();
    for (how, url) in both_ways(&server) {
        let store = failing_closed(&url, "specs");
        let pipeline = |name: &str, slots: u32| {
            Pipeline::builder(name)
                .circuit_breaker(CircuitBreaker::consecutive_failures(3))
                .bulkhead(Bulkhead::new(slots))
                .store(store.clone())
                .build()
                .unwrap()
        };
        // Two specs, two sets of admission scripts.
        let (a, b) = (pipeline("spec-a", 2), pipeline("spec-b", 3));
        let mut conn = server.conn();
        flush_scripts(&mut conn);
        reset_stats(&mut conn);
        // `NOSCRIPT` for `EVALSHA`; for `FCALL`, `ERR Function not
        // found`, which the server counts with every other `ERR` (such as
        // a client's `CLIENT SETINFO` on a server before 7.2): a miss is
        // then a load of the library.
        let misses = |conn: &mut redis::Connection| match how {
            "functions" => function_loads(&command_calls(conn)),
            _ => error_count(conn, "NOSCRIPT"),
        };
        a.call(|_| Ok::<_, std::io::Error>(())).unwrap();
        let stats = command_calls(&mut conn);
        assert_eq!(misses(&mut conn), 1, "{how}");
        // The store's eight scripts; by `EVALSHA` two admission scripts
        // for each spec, as functions the library instead (it holds the
        // admission of every spec).
        let (libraries, per_spec) = if how == "functions" { (1, 0) } else { (0, 2) };
        assert_eq!(script_loads(&stats), 8 + per_spec * 2, "{how}");
        assert_eq!(function_loads(&stats), libraries, "{how}");
        b.call(|_| Ok::<_, std::io::Error>(())).unwrap();
        rt().block_on(b.run(|_| async { Ok::<_, std::io::Error>(()) }))
            .unwrap();
        assert_eq!(misses(&mut conn), 1, "{how}: b's scripts were there");
        let again = command_calls(&mut conn);
        assert_eq!(script_loads(&again), script_loads(&stats), "{how}");
        assert_eq!(function_loads(&again), libraries, "{how}");
        assert_eq!(b.in_flight().unwrap(), 0, "{how}");
    }
}

/// A pipeline built while its server is down has loaded nothing, and by
/// `EVALSHA` its spec's admission scripts are compiled only when a call
/// needs them: once the server answers, the first call loads what the way
/// the scripts run needs (the store's scripts, the spec's two admission
/// scripts by `EVALSHA`, the library where functions are allowed), and
/// every call is admitted, sync and async.
#[test]
fn a_pipeline_built_while_its_server_is_down_loads_its_scripts_at_its_first_call() {
    // The user without functions is part of the server's configuration,
    // so that it is there from the restart on (ACL users made at run time
    // live in memory only).
    let user = seawall_test_redis::acl_user(SCRIPTS_ONLY, &seawall_test_redis::WITHOUT_FUNCTIONS);
    let args: Vec<&str> = std::iter::once("--user")
        .chain(user.iter().map(String::as_str))
        .collect();
    let mut server = RedisServer::start_with(&args);
    for (how, url) in both_ways(&server) {
        server.kill();
        let p = Pipeline::builder("built-while-down")
            .circuit_breaker(CircuitBreaker::consecutive_failures(3))
            .bulkhead(Bulkhead::new(2))
            .store(failing_closed(&url, "down-at-build"))
            .build()
            .unwrap();
        server.restart();
        let mut conn = server.conn();
        reset_stats(&mut conn);
        let rt = rt();
        // The first calls may meet the reconnection; within a few seconds
        // every call is admitted.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while p.call(|_| Ok::<_, std::io::Error>(())).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "{how}: never admitted"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        for _ in 0..3 {
            p.call(|_| Ok::<_, std::io::Error>(())).unwrap();
            rt.block_on(p.run(|_| async { Ok::<_, std::io::Error>(()) }))
                .unwrap();
        }
        assert_eq!(p.in_flight().unwrap(), 0, "{how}");
        let stats = command_calls(&mut conn);
        let calls = |c: &str| stats.get(c).copied().unwrap_or(0);
        if how == "functions" {
            assert!(script_loads(&stats) >= 8, "{how}: {stats:?}");
            assert!(function_loads(&stats) >= 1, "{how}: {stats:?}");
            assert!(calls("fcall") >= 6, "{how}: {stats:?}");
        } else {
            // The store's eight scripts and the spec's two.
            assert!(script_loads(&stats) >= 8 + 2, "{how}: {stats:?}");
            assert!(calls("evalsha") >= 7, "{how}: {stats:?}");
            assert_eq!(calls("fcall"), 0, "{how}: {stats:?}");
        }
    }
}

/// On a server that has functions (Redis 7 and later) every script runs as
/// a function: its definitions ran once, when its library was loaded. A
/// user that may not load or call functions has the same answers by
/// `EVALSHA`, sync and async.
#[test]
fn scripts_run_as_functions_where_the_server_lets_them() {
    let server = RedisServer::start();
    for (how, url) in both_ways(&server) {
        let store = failing_closed(&url, "functions");
        let p = Pipeline::builder("either-way")
            .circuit_breaker(CircuitBreaker::failure_rate(0.9).count_window(10))
            .bulkhead(Bulkhead::new(1))
            .rate_limiter(RateLimiter::gcra(3, Duration::from_secs(3600)))
            .store(store.clone())
            .build()
            .unwrap();
        let mut conn = server.conn();
        reset_stats(&mut conn);
        let rt = rt();
        p.call(|_| Ok::<_, std::io::Error>(())).unwrap();
        rt.block_on(p.run(|_| async { Ok::<_, std::io::Error>(()) }))
            .unwrap();
        p.call(|_| Err::<(), _>(std::io::Error::other("down")))
            .unwrap_err();
        // The burst of 3 is spent: refused by the rate limiter, by either
        // way of running the scripts.
        assert!(
            p.call(|_| Ok::<_, std::io::Error>(()))
                .unwrap_err()
                .is_rejected(),
            "{how}"
        );
        let metrics = p.circuit_metrics().unwrap();
        assert_eq!((metrics.calls, metrics.failures), (3, 1), "{how}");
        assert_eq!(p.in_flight().unwrap(), 0, "{how}");
        let stats = command_calls(&mut conn);
        let (fcall, evalsha) = (
            stats.get("fcall").copied().unwrap_or(0),
            stats.get("evalsha").copied().unwrap_or(0),
        );
        if how == "functions" {
            assert!(fcall >= 4 && evalsha == 0, "{how}: {stats:?}");
        } else {
            assert!(evalsha >= 4 && fcall == 0, "{how}: {stats:?}");
        }
        // Another pipeline on the store: the library is there (one for
        // every spec's admission); by `EVALSHA` its spec's scripts are
        // compiled and loaded, as functions nothing is.
        reset_stats(&mut conn);
        let other = Pipeline::builder("another-spec")
            .bulkhead(Bulkhead::new(3))
            .store(store)
            .build()
            .unwrap();
        other.call(|_| Ok::<_, std::io::Error>(())).unwrap();
        let stats = command_calls(&mut conn);
        assert_eq!(function_loads(&stats), 0, "{how}: {stats:?}");
        let per_spec = if how == "functions" { 0 } else { 2 };
        assert_eq!(script_loads(&stats), 8 + per_spec, "{how}: {stats:?}");
    }
}

/// A count window that holds no failure and no slow call is all
/// successes: a success written over one changes nothing, so the ring
/// (`BITFIELD`) is written only while a failure is in the window, on the
/// blocking path (a success recorded on its own) and on the async one (a
/// success carried by the next admission). The window's counts are those
/// of the in-memory store all along.
#[test]
fn a_window_of_successes_is_not_written_for_each_success() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let rt = rt();
    for carried in [false, true] {
        let label = if carried { "async" } else { "sync" };
        let store = RedisStore::builder(server.url())
            .prefix(unique("clean"))
            .build()
            .unwrap();
        let p = Pipeline::builder("clean-window")
            .circuit_breaker(
                CircuitBreaker::failure_rate(0.9)
                    .count_window(4)
                    .minimum_calls(100),
            )
            .store(store)
            .build()
            .unwrap();
        let call = |fail: bool| {
            let result = if carried {
                rt.block_on(p.run(|_| async move {
                    if fail {
                        Err(std::io::Error::other("down"))
                    } else {
                        Ok(())
                    }
                }))
            } else {
                p.call(|_| {
                    if fail {
                        Err(std::io::Error::other("down"))
                    } else {
                        Ok(())
                    }
                })
            };
            assert_eq!(result.is_err(), fail, "{label}");
        };
        // The circuit's counts as Redis has them, every success applied.
        let counts = || {
            let m = p.circuit_metrics().unwrap();
            (m.calls, m.failures)
        };
        let bitfields = |conn: &mut redis::Connection| {
            command_calls(conn).get("bitfield").copied().unwrap_or(0)
        };
        reset_stats(&mut conn);
        for _ in 0..10 {
            call(false);
        }
        assert_eq!(counts(), (4, 0), "{label}");
        assert_eq!(bitfields(&mut conn), 0, "{label}: only successes");
        // A failure, then four successes: the last one pushes it out of the
        // window; each of the four is written over the ring, the next ones
        // are not.
        call(true);
        assert_eq!(counts(), (4, 1), "{label}");
        for i in 1..=4 {
            call(false);
            let failures = if i < 4 { 1 } else { 0 };
            assert_eq!(counts(), (4, failures), "{label}: success {i}");
        }
        assert_eq!(bitfields(&mut conn), 5, "{label}");
        for _ in 0..6 {
            call(false);
        }
        assert_eq!(counts(), (4, 0), "{label}");
        assert_eq!(
            bitfields(&mut conn),
            5,
            "{label}: the window is clean again"
        );
        // A failure again: the ring starts from zeros where it was left.
        call(true);
        call(false);
        assert_eq!(counts(), (4, 1), "{label}");
    }
}

/// As functions, an admission sends its spec in full once, then by its id
/// (one argument instead of 26): the library keeps the specs it was sent.
/// A library that no longer holds a spec (loaded again, as after a restart
/// from disk, which keeps the library but not what its functions held)
/// answers so, and the call goes again with its spec in full, sync and
/// async, its answer unchanged: the bulkhead's slot is taken once.
#[test]
fn a_library_that_lost_the_specs_is_sent_them_again() {
    let server = RedisServer::start();
    let Some(url) = functions_url(&server) else {
        return;
    };
    let p = Pipeline::builder("spec-by-id")
        .circuit_breaker(CircuitBreaker::consecutive_failures(3))
        .bulkhead(Bulkhead::new(1))
        .rate_limiter(RateLimiter::gcra(1_000, Duration::from_secs(1)))
        .store(failing_closed(&url, "spec-by-id"))
        .build()
        .unwrap();
    let mut conn = server.conn();
    let rt = rt();
    let missing = |conn: &mut redis::Connection| error_count(conn, "SEAWALLSPEC");
    for reload in [false, true] {
        if reload {
            // The library loaded again from its dump: the same functions,
            // none of the specs they held.
            let dump: Vec<u8> = redis::cmd("FUNCTION").arg("DUMP").query(&mut conn).unwrap();
            let _: () = redis::cmd("FUNCTION")
                .arg("RESTORE")
                .arg(dump)
                .arg("REPLACE")
                .query(&mut conn)
                .unwrap();
        }
        let before = missing(&mut conn);
        reset_stats(&mut conn);
        p.call(|_| Ok::<_, std::io::Error>(())).unwrap();
        rt.block_on(p.run(|_| async { Ok::<_, std::io::Error>(()) }))
            .unwrap();
        // The bulkhead of one slot: the slot was taken once by each call
        // and given back (a second admission of the same call would leave
        // it taken).
        assert_eq!(p.in_flight().unwrap(), 0, "reload {reload}");
        let stats = command_calls(&mut conn);
        let fcalls = stats.get("fcall").copied().unwrap_or(0);
        if reload {
            assert_eq!(missing(&mut conn), before + 1, "reload {reload}: {stats:?}");
            assert!(fcalls >= 3, "reload {reload}: {stats:?}");
        } else {
            assert_eq!(missing(&mut conn), before, "sent in full first: {stats:?}");
        }
    }
    // Another caller of the same spec holds it too: nothing missing.
    let before = missing(&mut conn);
    for _ in 0..3 {
        p.call(|_| Ok::<_, std::io::Error>(())).unwrap();
    }
    assert_eq!(missing(&mut conn), before);
}

/// The library holds a bounded number of specs (1,024): past that it
/// forgets them and holds them again as they come. Every call of 1,100
/// pipelines of distinct specs is admitted, by id or sent again in full.
#[test]
fn a_library_holds_a_bounded_number_of_specs() {
    let server = RedisServer::start();
    let Some(url) = functions_url(&server) else {
        return;
    };
    let store = failing_closed(&url, "many-specs");
    let pipelines: Vec<Pipeline> = (0..1_100)
        .map(|i| {
            Pipeline::builder(format!("spec-{i}"))
                .bulkhead(Bulkhead::new(1 + i))
                .store(store.clone())
                .build()
                .unwrap()
        })
        .collect();
    let mut conn = server.conn();
    for round in 0..2 {
        for p in &pipelines {
            p.call(|_| Ok::<_, std::io::Error>(())).unwrap();
        }
        assert_eq!(pipelines[0].in_flight().unwrap(), 0, "round {round}");
    }
    // The first specs were forgotten when the library held 1,024: their
    // second calls were sent again in full.
    assert!(error_count(&mut conn, "SEAWALLSPEC") >= 1);
}
