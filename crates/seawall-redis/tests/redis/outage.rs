//! Redis killed, restarted and paused under both fail modes, on the async
//! and the sync path: calls follow the mode, never hang past the timeout,
//! and recover after the restart.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use seawall::{Bulkhead, CircuitBreaker, CircuitState, Error, Pipeline, RateLimiter, StoreError};
use seawall_redis::RedisStore;

use crate::support::{busy_for_a_second, rt, unique, Events, RedisServer};

const TIMEOUT: Duration = Duration::from_millis(200);
/// The longest any call may take while Redis misbehaves: connect timeout +
/// timeout, plus scheduling slack.
const BOUND: Duration = Duration::from_millis(900);

fn store(server: &RedisServer, prefix: &str, open: bool) -> RedisStore {
    let b = RedisStore::builder(server.url())
        .prefix(prefix)
        .timeout(TIMEOUT)
        .reconnect_interval(Duration::from_millis(100));
    if open { b.fail_open() } else { b.fail_closed() }
        .build()
        .unwrap()
}

fn pipeline(store: RedisStore, events: &Events) -> Pipeline {
    Pipeline::builder("dependency")
        .circuit_breaker(CircuitBreaker::consecutive_failures(50).cooldown(Duration::from_secs(30)))
        // The lease (the longest window or lease here) is how long admissions
        // wait after a restart: kept short.
        .bulkhead(Bulkhead::new(8).lease(Duration::from_secs(1)))
        .rate_limiter(RateLimiter::gcra(10_000, Duration::from_secs(1)))
        .on_event(events.listener())
        .store(store)
        .build()
        .unwrap()
}

/// One sync and one async call; returns their results and how long the
/// slower took.
fn both(
    p: &Pipeline,
    rt: &tokio::runtime::Runtime,
    called: &AtomicU32,
) -> (Vec<Result<u32, Error<std::io::Error>>>, Duration) {
    let start = Instant::now();
    let sync = p.call(|_| Ok::<_, std::io::Error>(called.fetch_add(1, Ordering::SeqCst)));
    let sync_took = start.elapsed();
    let start = Instant::now();
    let run = rt.block_on(
        p.run(|_| async { Ok::<_, std::io::Error>(called.fetch_add(1, Ordering::SeqCst)) }),
    );
    (vec![sync, run], sync_took.max(start.elapsed()))
}

/// Calls until one sync and one async call go through Redis again without
/// any store event (10 s at most).
fn await_recovery(p: &Pipeline, rt: &tokio::runtime::Runtime, events: &Events) -> Duration {
    let start = Instant::now();
    let called = AtomicU32::new(0);
    loop {
        events.take();
        let (results, took) = both(p, rt, &called);
        assert!(took < BOUND, "a call took {took:?}");
        if results.iter().all(Result::is_ok) && Events::unavailable(&events.take()) == 0 {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no recovery after a restart"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn killed_and_restarted_redis_under_fail_open() {
    let mut server = RedisServer::start();
    let prefix = unique("outage-open");
    let events = Events::default();
    let store = store(&server, &prefix, true);
    let p = pipeline(store.clone(), &events);
    let rt = rt();
    let called = AtomicU32::new(0);

    let (results, _) = both(&p, &rt, &called);
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(Events::unavailable(&events.take()), 0);

    server.kill();
    let started = Instant::now();
    for _ in 0..25 {
        let (results, took) = both(&p, &rt, &called);
        assert!(took < BOUND, "a call took {took:?}");
        for r in results {
            r.expect("fail-open: the call goes on with local state");
        }
    }
    let events_down = events.take();
    assert_eq!(
        Events::degraded(&events_down),
        50,
        "every call admitted locally says so"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(!store.is_available());
    assert_eq!(called.load(Ordering::SeqCst), 52);

    server.restart();
    let took = await_recovery(&p, &rt, &events);
    assert!(took < Duration::from_secs(5), "recovered after {took:?}");
    assert!(store.is_available());
    // Back on shared state: an isolation through another store reaches it.
    let other = pipeline(self::store(&server, &prefix, true), &Events::default());
    other.isolate().unwrap();
    assert_eq!(p.circuit_state().unwrap(), CircuitState::Isolated);
    assert!(p
        .call(|_| Ok::<_, std::io::Error>(()))
        .unwrap_err()
        .is_rejected());
}

#[test]
fn killed_and_restarted_redis_under_fail_closed() {
    let mut server = RedisServer::start();
    let prefix = unique("outage-closed");
    let events = Events::default();
    let p = pipeline(store(&server, &prefix, false), &events);
    let rt = rt();
    let called = AtomicU32::new(0);
    let (results, _) = both(&p, &rt, &called);
    assert!(results.iter().all(Result::is_ok));

    server.kill();
    for _ in 0..25 {
        let (results, took) = both(&p, &rt, &called);
        assert!(took < BOUND, "a call took {took:?}");
        for r in results {
            match r {
                Err(Error::Store(StoreError::Unavailable(_) | StoreError::Timeout(_))) => {}
                other => panic!("fail-closed: expected Error::Store, got {other:?}"),
            }
        }
    }
    assert_eq!(
        called.load(Ordering::SeqCst),
        2,
        "the operation is never called while the store fails"
    );
    let events_down = events.take();
    assert_eq!(Events::unavailable(&events_down), 50);
    assert_eq!(Events::degraded(&events_down), 0);

    server.restart();
    let took = await_recovery(&p, &rt, &events);
    assert!(took < Duration::from_secs(5), "recovered after {took:?}");
}

/// Under fail-closed with Redis gone, a weight the rate limit can never
/// grant is refused as on a reachable Redis (`rate_limited`, no
/// `retry_after`), on both paths, and not as a store failure; a weight
/// that fits answers `Error::Store`.
#[test]
fn a_weight_over_the_burst_is_refused_as_such_while_redis_is_gone() {
    let mut server = RedisServer::start();
    let store = store(&server, &unique("outage-weight"), false);
    let p = Pipeline::builder("weighted")
        .rate_limiter(RateLimiter::gcra(10, Duration::from_secs(1)))
        .store(store)
        .build()
        .unwrap();
    let rt = rt();
    let called = AtomicU32::new(0);
    let call = |weight: u32| {
        let w = p.weighted(weight).unwrap();
        let sync = w.call(|_| Ok::<_, std::io::Error>(called.fetch_add(1, Ordering::SeqCst)));
        let run = rt.block_on(
            w.run(|_| async { Ok::<_, std::io::Error>(called.fetch_add(1, Ordering::SeqCst)) }),
        );
        [sync, run]
    };
    let never = |r: &Result<u32, Error<std::io::Error>>| {
        matches!(r, Err(Error::Rejected(r))
            if r.reason == seawall::RejectionReason::RateLimited && r.retry_after.is_none())
    };
    assert!(call(11).iter().all(never));
    assert!(call(2).iter().all(Result::is_ok));

    server.kill();
    for _ in 0..3 {
        for r in call(11) {
            assert!(never(&r), "fail-closed, weight over the burst: {r:?}");
        }
        for r in call(2) {
            assert!(
                matches!(r, Err(Error::Store(_))),
                "fail-closed, weight 2: {r:?}"
            );
        }
    }
    assert_eq!(called.load(Ordering::SeqCst), 2);
}

#[test]
fn a_paused_redis_costs_the_timeout_once_then_is_skipped() {
    let server = RedisServer::start();
    let prefix = unique("paused");
    let events = Events::default();
    let open = pipeline(store(&server, &prefix, true), &events);
    let closed_events = Events::default();
    let closed = pipeline(store(&server, &prefix, false), &closed_events);
    let rt = rt();
    let called = AtomicU32::new(0);
    both(&open, &rt, &called);
    both(&closed, &rt, &called);
    events.take();
    closed_events.take();

    // SIGSTOP: connections stay open, nothing answers.
    server.signal("STOP");
    let start = Instant::now();
    let (results, took) = both(&open, &rt, &called);
    assert!(took < BOUND, "a call took {took:?}");
    assert!(results.iter().all(Result::is_ok));
    let (results, took) = both(&closed, &rt, &called);
    assert!(took < BOUND, "a call took {took:?}");
    assert!(
        results.iter().all(|r| matches!(r, Err(Error::Store(_)))),
        "{results:?}"
    );
    // Later calls skip Redis while it is being reconnected to.
    let quick = Instant::now();
    for _ in 0..20 {
        let (results, _) = both(&open, &rt, &called);
        assert!(results.iter().all(Result::is_ok));
        let (results, _) = both(&closed, &rt, &called);
        assert!(results.iter().all(Result::is_err));
    }
    assert!(
        quick.elapsed() < Duration::from_millis(500),
        "skipping took {:?}",
        quick.elapsed()
    );
    assert!(start.elapsed() < Duration::from_secs(3));
    assert_eq!(Events::degraded(&events.take()), 42);

    server.signal("CONT");
    let took = await_recovery(&open, &rt, &events);
    assert!(took < Duration::from_secs(5), "recovered after {took:?}");
    await_recovery(&closed, &rt, &closed_events);
}

#[test]
fn an_unreachable_server_at_build_time_does_not_stop_the_build() {
    // Nothing listens on this port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let rt = rt();
    for open in [true, false] {
        let events = Events::default();
        let store = RedisStore::builder(url.as_str())
            .timeout(TIMEOUT)
            .prefix(unique("unreachable"))
            .fail_mode(if open {
                seawall_redis::FailMode::Open
            } else {
                seawall_redis::FailMode::Closed
            })
            .build()
            .unwrap();
        let p = pipeline(store, &events);
        let called = AtomicU32::new(0);
        let (results, took) = both(&p, &rt, &called);
        assert!(took < BOUND);
        if open {
            assert!(results.iter().all(Result::is_ok));
            assert_eq!(Events::degraded(&events.take()), 2);
        } else {
            assert!(results.iter().all(|r| matches!(r, Err(Error::Store(_)))));
            assert_eq!(called.load(Ordering::SeqCst), 0);
        }
    }
}

/// Slow: the server answers, but later than the timeout (a busy script
/// holds it for a second). The caller is answered within the timeout (fail-closed:
/// refused; fail-open: admitted locally); the admission the server runs
/// late is never handed out, so nothing is admitted twice: its slot and
/// its place in the window are lost until its lease and window end.
#[test]
fn a_slow_redis_costs_the_timeout_and_admits_nothing_over_the_limits() {
    let server = RedisServer::start();
    for open in [false, true] {
        let prefix = unique("slow");
        let events = Events::default();
        let store = store(&server, &prefix, open);
        let p = Pipeline::builder("dependency")
            .bulkhead(Bulkhead::new(2).lease(Duration::from_secs(30)))
            .rate_limiter(RateLimiter::fixed_window(5, Duration::from_secs(3600)))
            .on_event(events.listener())
            .store(store.clone())
            .build()
            .unwrap();
        let rt = rt();
        let called = AtomicU32::new(0);
        let (results, _) = both(&p, &rt, &called);
        assert!(results.iter().all(Result::is_ok));

        let sleeper = busy_for_a_second(&server);
        let start = Instant::now();
        let r = p.call(|_| Ok::<_, std::io::Error>(called.fetch_add(1, Ordering::SeqCst)));
        let took = start.elapsed();
        assert!(took < BOUND, "a call took {took:?}");
        if open {
            r.expect("fail-open: admitted locally");
            assert_eq!(Events::degraded(&events.take()), 1);
        } else {
            assert!(
                matches!(r, Err(Error::Store(StoreError::Timeout(_)))),
                "{r:?}"
            );
        }
        sleeper.join().unwrap();
        let waiting = Instant::now();
        while !(store.ping().is_ok() && store.is_available()) {
            assert!(waiting.elapsed() < Duration::from_secs(10), "no recovery");
            std::thread::sleep(Duration::from_millis(20));
        }

        // Through Redis again: the window holds 5 and 2 were taken before
        // the sleep. Each admission the server ran late (the slow call's,
        // unless it never reached the server before its timeout; and any
        // call that times out again on a loaded machine) holds its slot
        // until its lease and its place in the window: whatever the
        // timing, those late ones and the calls admitted now add up to at
        // most the 3 places left, and to exactly 3 when every call now was
        // answered.
        let (mut admitted, mut unanswered) = (0u32, 0u32);
        events.take();
        loop {
            let r = p.call(|_| Ok::<_, std::io::Error>(0));
            let local = Events::degraded(&events.take()) > 0;
            match r {
                Ok(_) if !local => admitted += 1,
                Err(e) if e.is_rejected() => break,
                _ => unanswered += 1,
            }
            assert!(admitted <= 3, "over the window's limit");
            assert!(unanswered < 50, "Redis never answered again");
        }
        let late = p.in_flight().unwrap();
        assert!(
            admitted + late <= 3,
            "over the window's limit: {admitted} admitted now, {late} late"
        );
        if unanswered == 0 {
            assert_eq!(admitted + late, 3, "every place of the window is used once");
        }
    }
}

/// While Redis is skipped, async calls are answered by the skip itself:
/// each names the outage once, as blocking calls do, and none counts as a
/// new failure (the error of one does not become the cause of the next, so
/// the message does not grow with every call).
#[test]
fn calls_skipped_during_an_outage_name_it_once_on_both_paths() {
    let mut server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique("skipped"))
        .timeout(TIMEOUT)
        // Longer than the test: no reconnection attempt ends the skip.
        .reconnect_interval(Duration::from_secs(60))
        .fail_closed()
        .build()
        .unwrap();
    let p = Pipeline::builder("dependency")
        .rate_limiter(RateLimiter::gcra(10_000, Duration::from_secs(1)))
        .store(store)
        .build()
        .unwrap();
    let rt = rt();
    p.call(|_| Ok::<_, std::io::Error>(())).unwrap();
    server.kill();
    let message = |r: Result<(), Error<std::io::Error>>| match r {
        Err(Error::Store(e)) => e.to_string(),
        other => panic!("while Redis is down: {other:?}"),
    };
    // The call that meets the outage, then calls that skip Redis.
    let first = message(p.call(|_| Ok::<_, std::io::Error>(())));
    let skipped: Vec<String> = (0..20)
        .flat_map(|_| {
            [
                message(p.call(|_| Ok::<_, std::io::Error>(()))),
                message(rt.block_on(p.run(|_| async { Ok::<_, std::io::Error>(()) }))),
            ]
        })
        .collect();
    let longest = skipped.iter().map(String::len).max().unwrap();
    assert!(
        longest <= first.len() + 200,
        "the message grew from {} to {longest} bytes: {}",
        first.len(),
        skipped.last().unwrap()
    );
    assert!(
        skipped.iter().all(|m| m.matches("is down").count() == 1),
        "{skipped:?}"
    );
}
