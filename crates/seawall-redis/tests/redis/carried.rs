//! A silent success (not a probe, not slow, no retry-after hint) costs no
//! script call of its own, async or blocking: it is carried by the next
//! admission of its partition, or sent on its own after the store's
//! `success_delay`. Counted by the server (`INFO commandstats`); the bound
//! on a slot's release checked from another store (connections of its
//! own), with bounded polls and no timing assertion.

use std::future::Future;
use std::task::Poll;
use std::time::{Duration, Instant};

use seawall::store::{AdmitRequest, Outcome, Permit, Record, ResourceSpec};
use seawall::{Bulkhead, CircuitBreaker, Pipeline, StateStore};
use seawall_redis::RedisStore;

use crate::support::{
    command_calls, flush_scripts, reset_stats, rt, script_calls, unique, RedisServer,
};

/// A store failing closed under `prefix`, whose silent successes wait up
/// to `delay` to be carried.
fn store(server: &RedisServer, prefix: &str, delay: Duration) -> RedisStore {
    RedisStore::builder(server.url())
        .prefix(prefix)
        .success_delay(delay)
        .fail_closed()
        .build()
        .unwrap()
}

/// The record of `permit`'s success at time 0, with nothing to report (a
/// silent success).
fn silent_success(permit: Permit) -> Record<'static> {
    Record {
        partition: None,
        permit,
        outcome: Outcome::Success,
        duration: Duration::ZERO,
        retry_after: None,
        now: Duration::ZERO,
    }
}

/// Polls `done` every 10 ms for at most 10 s.
fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    done()
}

fn pipeline(store: RedisStore, name: &str, slots: u32) -> Pipeline {
    Pipeline::builder(name)
        .circuit_breaker(
            CircuitBreaker::failure_rate(0.5)
                .count_window(1000)
                .minimum_calls(1000),
        )
        .bulkhead(Bulkhead::new(slots).lease(Duration::from_secs(60)))
        .store(store)
        .build()
        .unwrap()
}

/// How a test drives its calls.
#[derive(Debug, Clone, Copy)]
enum Path {
    /// `Pipeline::run` on a multi-thread runtime.
    MultiThread,
    /// `Pipeline::run` on a current-thread runtime.
    CurrentThread,
    /// `Pipeline::call`, no runtime.
    Blocking,
}

const PATHS: [Path; 3] = [Path::MultiThread, Path::CurrentThread, Path::Blocking];

/// The runtime of `path` (none for the blocking path).
fn runtime(path: Path) -> Option<tokio::runtime::Runtime> {
    match path {
        Path::MultiThread => Some(rt()),
        Path::CurrentThread => Some(
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
        ),
        Path::Blocking => None,
    }
}

/// `n` successful calls of `p`, async on `rt`, blocking without one.
fn succeed(p: &Pipeline, rt: Option<&tokio::runtime::Runtime>, n: u64) {
    match rt {
        Some(rt) => {
            let p = p.clone();
            rt.block_on(async move {
                for _ in 0..n {
                    p.run(|_| async { Ok::<_, std::io::Error>(()) })
                        .await
                        .unwrap();
                }
            });
        }
        None => {
            for _ in 0..n {
                p.call(|_| Ok::<_, std::io::Error>(())).unwrap();
            }
        }
    }
}

/// N calls through a bulkhead and a count-window breaker cost N
/// admissions and at most 5 % more script calls, async on either runtime
/// and blocking: each success is carried by the next call's admission (the
/// last one, sent on its own after the delay, is counted too). The breaker
/// counted every success once.
#[test]
fn a_successful_attempt_costs_one_script_call() {
    const N: u64 = 200;
    let server = RedisServer::start();
    let mut conn = server.conn();
    for path in PATHS {
        let store = store(&server, &unique("carried"), Duration::from_millis(300));
        let p = pipeline(store.clone(), "counted", 1);
        // Connect (and identify the server) first.
        store.ping().unwrap();
        rt().block_on(store.ping_async()).unwrap();
        reset_stats(&mut conn);
        // Kept until the end: a runtime shut down gives the slots of the
        // successes waiting back without them.
        let rt = runtime(path);
        // One slot: each call is admitted only if the success before it
        // reached Redis first.
        succeed(&p, rt.as_ref(), N);
        // The last success is sent on its own once its delay ends.
        let mut stats = command_calls(&mut conn);
        assert!(
            eventually(|| {
                stats = command_calls(&mut conn);
                script_calls(&stats) > N
            }),
            "{path:?}: {stats:?}"
        );
        let calls = script_calls(&stats);
        assert!(
            calls * 100 <= N * 105,
            "{path:?}: {calls} script calls for {N} attempts: {stats:?}"
        );
        // The breaker saw every success, once.
        let metrics = p.circuit_metrics().unwrap();
        assert_eq!(metrics.calls, N, "{path:?}: {metrics:?}");
        assert_eq!(p.in_flight().unwrap(), 0, "{path:?}");
    }
}

/// A success that no admission carries is sent on its own after the
/// store's delay: another store, with connections of its own, sees the
/// slot free without any further admission by the first, and its own
/// admission right after is let through the one-slot bulkhead.
#[test]
fn a_slot_freed_by_a_waiting_success_is_seen_free_within_the_delay() {
    let server = RedisServer::start();
    let prefix = unique("carried-bound");
    let store = |delay| store(&server, &prefix, delay);
    // The default delay (1 ms), then a longer one.
    for (i, delay) in [Duration::from_millis(1), Duration::from_millis(200)]
        .into_iter()
        .enumerate()
    {
        for path in PATHS {
            let name = format!("bound-{i}-{path:?}");
            let a = pipeline(store(delay), &name, 1);
            let b = pipeline(store(delay), &name, 1);
            let rt = runtime(path);
            succeed(&a, rt.as_ref(), 1);
            assert!(
                eventually(|| b.in_flight().unwrap() == 0),
                "{path:?}: the slot is freed without another admission"
            );
            b.call(|_| Ok::<_, std::io::Error>(())).unwrap();
            // The runtime outlives the calls above (a runtime shut down
            // gives the slot back too, on the blocking path).
            drop(rt);
        }
    }
}

/// A blocking caller's store dropped with a success waiting, no runtime
/// anywhere: the store's timer thread still sends it after its delay, and
/// another store sees the slot free; the breaker counted it.
#[test]
fn a_blocking_success_waiting_outlives_its_store() {
    let server = RedisServer::start();
    let prefix = unique("carried-blocking-drop");
    let build = || store(&server, &prefix, Duration::from_secs(1));
    let observer = pipeline(build(), "dropped", 1);
    {
        let a = pipeline(build(), "dropped", 1);
        a.call(|_| Ok::<_, std::io::Error>(())).unwrap();
        // Refused: the success waits, its slot still taken on the server.
        assert!(observer.call(|_| Ok::<_, std::io::Error>(())).is_err());
    }
    assert!(eventually(|| observer.in_flight().unwrap() == 0));
    assert_eq!(observer.circuit_metrics().unwrap().calls, 1);
    observer.call(|_| Ok::<_, std::io::Error>(())).unwrap();
}

/// A store dropped with a success waiting, and its runtime shut down right
/// after: the slot is given back all the same.
#[test]
fn a_waiting_success_survives_the_store_and_its_runtime() {
    let server = RedisServer::start();
    let prefix = unique("carried-drop");
    let build = || store(&server, &prefix, Duration::from_secs(1));
    let observer = pipeline(build(), "dropped", 1);
    {
        let a = pipeline(build(), "dropped", 1);
        let rt = rt();
        rt.block_on(a.run(|_| async { Ok::<_, std::io::Error>(()) }))
            .unwrap();
        drop(a);
        // Shut down with the success still waiting (its delay is 1 s).
        drop(rt);
    }
    assert!(eventually(|| observer.in_flight().unwrap() == 0));
}

/// An attempt that panics on a current-thread runtime, which is shut down
/// right after: its slot is given back (on the blocking path, the task
/// that was to give it back never ran) and another store sees it free,
/// long before its 60 s lease ends.
#[test]
fn a_panicked_attempt_frees_its_slot_when_its_runtime_shuts_down() {
    let server = RedisServer::start();
    let prefix = unique("carried-panic");
    let build = || {
        RedisStore::builder(server.url())
            .prefix(&prefix)
            .fail_closed()
            .build()
            .unwrap()
    };
    let observer = pipeline(build(), "panicked", 1);
    let a = pipeline(build(), "panicked", 1);
    let rt = rt();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(
            a.run(|_| async { panic!("the operation panics") as Result<(), std::io::Error> }),
        )
    }));
    assert!(panicked.is_err());
    drop(rt);
    assert!(eventually(|| observer.in_flight().unwrap() == 0));
    assert!(observer.call(|_| Ok::<_, std::io::Error>(())).is_ok());
}

/// The scripts flushed from the server between a success and the admission
/// that carries it: the admission meets `NOSCRIPT` (or its function is
/// missing), the scripts are loaded again and the admission sent once more with what it carries.
/// The success is counted once and its slot is free.
#[test]
fn a_carried_success_survives_a_script_reload() {
    let server = RedisServer::start();
    let store = store(&server, &unique("carried-noscript"), Duration::from_secs(1));
    let p = pipeline(store, "reloaded", 1);
    let mut conn = server.conn();
    let rt = rt();
    let pc = p.clone();
    rt.block_on(async move {
        pc.run(|_| async { Ok::<_, std::io::Error>(()) })
            .await
            .unwrap();
    });
    flush_scripts(&mut conn);
    let pc = p.clone();
    // One slot: admitted only once the first success was applied.
    rt.block_on(async move {
        pc.run(|_| async { Ok::<_, std::io::Error>(()) })
            .await
            .unwrap();
    });
    assert_eq!(p.circuit_metrics().unwrap().calls, 2);
    assert_eq!(p.in_flight().unwrap(), 0);
}

/// An admission carrying a success, cancelled after it was sent (or
/// before): whether or not the server ran it, the success's slot is free
/// afterwards (given back by the release script when the admission's
/// answer never came).
#[test]
fn a_cancelled_admission_carrying_a_success_frees_its_slot() {
    let server = RedisServer::start();
    let prefix = unique("carried-cancel");
    let store = store(&server, &prefix, Duration::from_secs(1));
    let spec = ResourceSpec::new("cancelled")
        .with_bulkhead(Bulkhead::new(2).lease(Duration::from_secs(60)));
    let state = store.bind(&spec).unwrap();
    let rt = rt();
    let request = AdmitRequest {
        partition: None,
        now: Duration::ZERO,
        weight: 1,
        budget: None,
        shadowed: false,
    };
    let mut conn = server.conn();
    let key = format!("{{{prefix}:cancelled}}:b");
    for polls in [0, 1] {
        // The futures are made inside the runtime (made outside one, they
        // answer on the blocking path).
        let permit = rt
            .block_on(async { state.admit_async(request).await })
            .unwrap()
            .decision
            .unwrap();
        let slot = permit.slot.expect("a bulkhead slot");
        rt.block_on(async { state.record_async(silent_success(permit)).await })
            .unwrap();
        let held: Option<f64> = redis::cmd("ZSCORE")
            .arg(&key)
            .arg(slot)
            .query(&mut conn)
            .unwrap();
        assert!(held.is_some(), "the success waits to be carried");
        // This store knows the attempt ended: it does not count the slot.
        assert_eq!(state.in_flight(None, Duration::ZERO).unwrap(), 0);
        rt.block_on(async {
            let mut admit = state.admit_async(request);
            for _ in 0..polls {
                std::future::poll_fn(|cx| {
                    let _ = std::pin::Pin::new(&mut admit).poll(cx);
                    Poll::Ready(())
                })
                .await;
            }
            drop(admit);
        });
        assert!(
            eventually(|| {
                redis::cmd("ZSCORE")
                    .arg(&key)
                    .arg(slot)
                    .query::<Option<f64>>(&mut conn)
                    .unwrap()
                    .is_none()
            }),
            "the slot of the carried success is free ({polls} polls)"
        );
        let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
    }
}

/// A pipeline on `server` (store timeout 5 s) and a runtime, for calls
/// dropped while their admission is in flight.
fn dropped_in_flight_setup(
    server: &RedisServer,
    prefix: &str,
    build: impl FnOnce(seawall::PipelineBuilder) -> seawall::PipelineBuilder,
) -> (Pipeline, tokio::runtime::Runtime) {
    let store = RedisStore::builder(server.url())
        .prefix(prefix)
        .timeout(Duration::from_secs(5))
        .fail_closed()
        .build()
        .unwrap();
    let p = build(Pipeline::builder("dropped").store(store))
        .build()
        .unwrap();
    (p, rt())
}

/// Runs a call of `p` that is dropped after 50 ms while Redis holds its
/// admission (`CLIENT PAUSE` of 300 ms), then waits until Redis has run
/// `scripts` script calls more than before the call (at most 5 s).
fn drop_while_in_flight(
    p: &Pipeline,
    rt: &tokio::runtime::Runtime,
    conn: &mut redis::Connection,
    scripts: u64,
) {
    let before = script_calls(&command_calls(conn));
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(300)
        .arg("WRITE")
        .query(conn)
        .unwrap();
    let dropped = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_millis(50),
            p.run(|_| async { Ok::<_, std::io::Error>(()) }),
        )
        .await
    });
    assert!(dropped.is_err(), "the call ended: {dropped:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while script_calls(&command_calls(conn)) < before + scripts && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A call dropped while its admission is on its way to Redis (a timeout
/// or a `select!` around `Pipeline::run`) gives back the bulkhead slot the
/// admission took: the slot is not left to its lease (60 s here).
#[test]
fn a_slot_taken_by_an_admission_dropped_in_flight_is_given_back() {
    let server = RedisServer::start();
    let prefix = unique("slot-dropped");
    let (p, rt) = dropped_in_flight_setup(&server, &prefix, |b| {
        b.bulkhead(Bulkhead::new(1).lease(Duration::from_secs(60)))
    });
    let call = || rt.block_on(p.run(|_| async { Ok::<_, std::io::Error>(()) }));
    // The connection is made, the slot given back.
    assert!(call().is_ok());
    let mut conn = server.conn();
    let key = format!("{{{prefix}:dropped}}:b");
    let taken =
        |conn: &mut redis::Connection| redis::cmd("ZCARD").arg(&key).query::<u64>(conn).unwrap();
    assert!(
        eventually(|| taken(&mut conn) == 0),
        "the first slot is back"
    );
    // The admission, then the release.
    drop_while_in_flight(&p, &rt, &mut conn, 2);
    assert!(
        eventually(|| taken(&mut conn) == 0),
        "the slot of the dropped call is back"
    );
    assert!(call().is_ok());
}

/// A call dropped while its admission is on its way to Redis gives back
/// the rate-limit permit the admission reserved for it: the next call
/// reserves that same permit (and waits for it), as after a call dropped
/// while it waits.
#[test]
fn a_permit_reserved_by_an_admission_dropped_in_flight_is_given_back() {
    let server = RedisServer::start();
    let prefix = unique("permit-dropped");
    // One permit a minute; calls may wait a minute.
    let minute = Duration::from_secs(60);
    let (p, rt) = dropped_in_flight_setup(&server, &prefix, |b| {
        b.rate_limiter(seawall::RateLimiter::gcra(1, minute).max_wait(minute))
    });
    assert!(rt
        .block_on(p.run(|_| async { Ok::<_, std::io::Error>(()) }))
        .is_ok());
    let mut conn = server.conn();
    // The admission reserves the permit in a minute; then the give-back.
    drop_while_in_flight(&p, &rt, &mut conn, 2);
    // Given back, that permit is reserved again and the call waits for it;
    // kept, the next is two minutes away and the call is refused at once.
    let waited = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_millis(500),
            p.run(|_| async { Ok::<_, std::io::Error>(()) }),
        )
        .await
    });
    assert!(waited.is_err(), "the call did not wait: {waited:?}");
}

/// A success with nothing to change on the server (no bulkhead slot to
/// free, no circuit to count it) is not sent at all, on either path: one
/// script call per attempt, its admission.
#[test]
fn a_success_with_nothing_to_change_is_not_sent() {
    const N: u64 = 20;
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique("carried-void"))
        .fail_closed()
        .build()
        .unwrap();
    let p = Pipeline::builder("rate-only")
        .rate_limiter(seawall::RateLimiter::gcra(
            1_000_000,
            Duration::from_secs(1),
        ))
        .store(store)
        .build()
        .unwrap();
    let mut conn = server.conn();
    reset_stats(&mut conn);
    for _ in 0..N {
        p.call(|_| Ok::<_, std::io::Error>(())).unwrap();
    }
    let pc = p.clone();
    rt().block_on(async move {
        for _ in 0..N {
            pc.run(|_| async { Ok::<_, std::io::Error>(()) })
                .await
                .unwrap();
        }
    });
    // Whatever was sent has been answered by now: the blocking calls above
    // waited for their own, and a record sent on its own would follow
    // within its delay; the admissions are all there is.
    std::thread::sleep(Duration::from_millis(50));
    let stats = command_calls(&mut conn);
    assert_eq!(script_calls(&stats), 2 * N, "{stats:?}");
}

/// Two pipelines of one name and spec on one store share one state: a
/// success waiting from one is carried by the other's next admission, on
/// every path, so a one-slot bulkhead lets the second call through at
/// once, with one script call per attempt; the slots in flight read
/// through either count neither.
#[test]
fn a_success_is_carried_by_another_pipeline_of_the_same_state() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    for path in PATHS {
        let store = store(&server, &unique("carried-shared"), Duration::from_secs(1));
        let a = pipeline(store.clone(), "shared", 1);
        let b = pipeline(store.clone(), "shared", 1);
        store.ping().unwrap();
        let rt = runtime(path);
        if let Some(rt) = &rt {
            rt.block_on(store.ping_async()).unwrap();
        }
        reset_stats(&mut conn);
        succeed(&a, rt.as_ref(), 1);
        assert_eq!(b.in_flight().unwrap(), 0, "{path:?}");
        succeed(&b, rt.as_ref(), 1);
        succeed(&a, rt.as_ref(), 1);
        // Three admissions and the slots in flight.
        let stats = command_calls(&mut conn);
        assert_eq!(script_calls(&stats), 4, "{path:?}: {stats:?}");
        assert_eq!(a.circuit_metrics().unwrap().calls, 3, "{path:?}");
    }
}

/// A success the store's timer thread is sending when the next admission
/// comes (calls about one delay apart, so that the two meet at every
/// point of the send): the admission never overtakes it, on either path
/// where the thread sends, so a one-slot bulkhead admits every call.
#[test]
fn an_admission_never_overtakes_a_success_the_timer_thread_sends() {
    const N: u64 = 400;
    let server = RedisServer::start();
    for path in [Path::CurrentThread, Path::Blocking] {
        let store = store(&server, &unique("carried-race"), Duration::from_millis(1));
        let p = pipeline(store, "race", 1);
        let rt = runtime(path);
        for i in 0..N {
            succeed(&p, rt.as_ref(), 1);
            // 0.6 to 1.4 ms: around the delay.
            std::thread::sleep(Duration::from_micros(600 + (i * 37) % 800));
        }
        assert_eq!(p.circuit_metrics().unwrap().calls, N, "{path:?}");
        assert_eq!(p.in_flight().unwrap(), 0, "{path:?}");
    }
}

/// An admission carrying a success takes over the success's slot (its
/// lease renewed, the same id), both ways (functions and `EVALSHA`) and on
/// both paths (blocking and async): the bulkhead then holds one lease, not
/// a freed one and a new one. A slot whose lease was dropped
/// meanwhile is not taken over (the admission takes a new one); of several
/// successes carried at once, every slot but the one taken over is freed;
/// an admission refused after the bulkhead (here by the rate limiter)
/// frees the slot it would have taken over.
#[test]
fn an_admission_takes_over_the_slot_of_the_success_it_carries() {
    use seawall::RateLimiter;
    let server = RedisServer::start();
    let mut conn = server.conn();
    let rt = rt();
    let ways = crate::support::both_ways(&server);
    for ((way, url), path) in ways
        .iter()
        .flat_map(|w| [(w.clone(), "blocking"), (w.clone(), "async")])
    {
        let how = format!("{way}, {path}");
        let asynchronous = path == "async";
        let prefix = unique(&format!("carried-takeover-{way}-{path}"));
        let store = RedisStore::builder(url)
            .prefix(&prefix)
            .success_delay(Duration::from_secs(1))
            .fail_closed()
            .build()
            .unwrap();
        // Five admissions in a burst, then refusals.
        let spec = ResourceSpec::new("takeover")
            .with_bulkhead(Bulkhead::new(2).lease(Duration::from_secs(60)))
            .with_rate_limit(RateLimiter::gcra(5, Duration::from_secs(3600)));
        let state = store.bind(&spec).unwrap();
        let key = format!("{{{prefix}:takeover}}:b");
        let request = AdmitRequest::new(None, Duration::ZERO);
        // On the async path the futures are made inside the runtime (made
        // outside one, they answer on the blocking path).
        let admit = || {
            match asynchronous {
                true => rt.block_on(async { state.admit_async(request).await }),
                false => state.admit(&request),
            }
            .unwrap()
            .decision
        };
        let succeed = |permit| {
            match asynchronous {
                true => rt.block_on(async { state.record_async(silent_success(permit)).await }),
                false => state.record(&silent_success(permit)),
            }
            .unwrap();
        };
        let leases = |conn: &mut redis::Connection| -> Vec<(u64, f64)> {
            redis::cmd("ZRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query(conn)
                .unwrap()
        };

        let first = admit().expect("admitted");
        let x = first.slot.expect("a slot");
        let lease_before = leases(&mut conn)[0].1;
        succeed(first);
        let second = admit().expect("admitted");
        assert_eq!(
            second.slot,
            Some(x),
            "{how}: the carried slot is taken over"
        );
        let held = leases(&mut conn);
        assert_eq!(held.len(), 1, "{how}: one lease ({held:?})");
        assert!(held[0].1 > lease_before, "{how}: its lease renewed");

        // Its lease dropped (as a dead process's is): a new slot.
        let _: () = redis::cmd("ZREM")
            .arg(&key)
            .arg(x)
            .query(&mut conn)
            .unwrap();
        succeed(second);
        let third = admit().expect("admitted");
        let y = third.slot.expect("a slot");
        assert_ne!(y, x, "{how}: a slot gone is not taken over");
        assert_eq!(leases(&mut conn).len(), 1, "{how}");

        // Two successes carried at once: one slot taken over, one freed.
        let fourth = admit().expect("admitted");
        assert_eq!(leases(&mut conn).len(), 2, "{how}");
        succeed(third);
        succeed(fourth);
        let fifth = admit().expect("admitted");
        let held = leases(&mut conn);
        assert_eq!(held.len(), 1, "{how}: one lease ({held:?})");
        assert_eq!(Some(held[0].0), fifth.slot, "{how}");

        // The rate limiter's five permits are spent: the next admission is
        // refused after the bulkhead, and frees the carried slot.
        succeed(fifth);
        let refused = admit().expect_err("refused by the rate limiter");
        assert_eq!(
            refused.reason,
            seawall::RejectionReason::RateLimited,
            "{how}"
        );
        assert!(
            leases(&mut conn).is_empty(),
            "{how}: the carried slot is freed"
        );
    }
}
