//! Refusals answered locally: a circuit open until T, a cooldown until T, a
//! rate limit (whose calls never wait) exhausted until T refuse in this
//! process until T without a command to Redis, and through Redis again
//! from T. Commands are counted by the server (`INFO commandstats`); at
//! every instant checked, a store that replays nothing (`local_refusals(0)`)
//! on the same state is asked too, and gives the same answer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use seawall::event::EventKind;
use seawall::store::{AdmitRequest, Outcome, Record, Reserve, ResourceSpec, ResourceState};
use seawall::testing::VirtualClock;
use seawall::{
    CircuitBreaker, Cooldown, Error, PartitionKey, Pipeline, RateLimiter, RejectionReason,
    StateStore,
};
use seawall_redis::{RedisStore, RedisStoreBuilder};

use crate::support::{command_calls, rt, unique, Events, RedisCluster, RedisServer};

const S: Duration = Duration::from_secs(1);
const NS: Duration = Duration::from_nanos(1);

/// Round trips the server served between two `INFO commandstats`
/// snapshots: script calls (every operation of the store is one; the
/// commands a script runs are counted apart) and `PING`s.
fn sent(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> u64 {
    ["fcall", "evalsha", "eval", "ping"]
        .iter()
        .map(|c| after.get(*c).copied().unwrap_or(0) - before.get(*c).copied().unwrap_or(0))
        .sum()
}

/// A store on `builder`'s server with the caller's clock, failing closed.
fn caller(builder: RedisStoreBuilder, prefix: &str) -> RedisStore {
    builder
        .prefix(prefix)
        .caller_clock()
        .fail_closed()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// Moves `clock` forward to `to`.
fn set(clock: &VirtualClock, to: Duration) {
    clock.advance(to - clock.now());
}

fn io(msg: &str) -> std::io::Error {
    std::io::Error::other(msg)
}

type Answer = Option<(RejectionReason, Option<Duration>)>;

fn answer<T: std::fmt::Debug>(r: Result<T, Error<std::io::Error>>) -> Answer {
    match r {
        Err(Error::Rejected(r)) => Some((r.reason, r.retry_after)),
        Ok(_) => None,
        Err(e) => panic!("unexpected {e:?}"),
    }
}

/// A circuit open until T, on the virtual clock from 0 and from 10^6 s,
/// with a listener and without, sync and async: until T every call is
/// refused with the reason and `retry_after` Redis gives, without a
/// command; at T a probe is admitted through Redis.
#[test]
fn an_open_circuit_refuses_without_a_round_trip_until_it_may_probe() {
    let server = RedisServer::start();
    let rt = rt();
    let mut conn = server.conn();
    for origin in [Duration::ZERO, Duration::from_secs(1_000_000)] {
        for listen in [false, true] {
            let prefix = unique("open-circuit");
            let clock = VirtualClock::new();
            clock.advance(origin);
            let events = Events::default();
            let pipeline = |store: RedisStore| {
                let mut b = Pipeline::builder("payments")
                    .circuit_breaker(
                        CircuitBreaker::consecutive_failures(1).cooldown(Duration::from_secs(10)),
                    )
                    .clock(clock.clone());
                if listen {
                    b = b.on_event(events.listener());
                }
                b.store(store).build().unwrap()
            };
            let p = pipeline(caller(RedisStore::builder(server.url()), &prefix));
            let oracle = pipeline(caller(
                RedisStore::builder(server.url()).local_refusals(0),
                &prefix,
            ));
            let called = AtomicU32::new(0);
            let ok = |_| {
                called.fetch_add(1, Ordering::Relaxed);
                Ok::<_, std::io::Error>(1)
            };
            assert!(p.call(|_| Err::<u32, _>(io("down"))).is_err());
            let open = Some((RejectionReason::CircuitOpen, Some(10 * S)));
            // The first refusal is Redis's.
            let before = command_calls(&mut conn);
            assert_eq!(answer(p.call(ok)), open);
            assert_eq!(sent(&before, &command_calls(&mut conn)), 1);
            events.take();

            // The circuit's waits are whole microseconds, counted from the
            // clock's whole microsecond (as the script counts them).
            let us = Duration::from_micros(1);
            for (at, left) in [(S, 9 * S), (4 * S + NS, 6 * S), (10 * S - NS, us)] {
                set(&clock, origin + at);
                let before = command_calls(&mut conn);
                let expected = Some((RejectionReason::CircuitOpen, Some(left)));
                for _ in 0..3 {
                    assert_eq!(answer(p.call(ok)), expected, "sync at {at:?}");
                    assert_eq!(
                        answer(rt.block_on(p.run(|_| async { Ok::<_, std::io::Error>(1) }))),
                        expected,
                        "async at {at:?}"
                    );
                }
                assert_eq!(
                    sent(&before, &command_calls(&mut conn)),
                    0,
                    "refused locally at {at:?}"
                );
                // Redis gives the same answer.
                assert_eq!(answer(oracle.call(ok)), expected, "redis at {at:?}");
            }
            assert_eq!(called.load(Ordering::Relaxed), 0);
            if listen {
                let rejected = events
                    .take()
                    .into_iter()
                    .filter(|e| matches!(e, EventKind::Rejected { .. }))
                    .count();
                assert_eq!(rejected, 3 * (6 + 1), "every refusal is reported");
            }

            // At T: through Redis, a probe admitted; it fails, and the
            // circuit opens again, until T + 10 s.
            set(&clock, origin + 10 * S);
            let before = command_calls(&mut conn);
            assert!(matches!(
                p.call(|_| Err::<u32, _>(io("still down"))),
                Err(Error::Operation(_))
            ));
            assert!(sent(&before, &command_calls(&mut conn)) >= 2);
            let before = command_calls(&mut conn);
            assert_eq!(answer(p.call(ok)), open, "Redis's refusal again");
            assert_eq!(sent(&before, &command_calls(&mut conn)), 1);
            let before = command_calls(&mut conn);
            assert_eq!(answer(p.call(ok)), open);
            assert_eq!(sent(&before, &command_calls(&mut conn)), 0);
        }
    }
}

/// A rate limit exhausted until T (GCRA, fixed and sliding window; no
/// `max_wait`): refused locally until T with Redis's `retry_after`, then
/// admitted through Redis. Another weight, and another partition, are
/// asked of Redis.
#[test]
fn an_exhausted_rate_limit_refuses_without_a_round_trip_until_its_next_permit() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let limiters = [
        RateLimiter::gcra(2, S),
        RateLimiter::fixed_window(2, S),
        RateLimiter::sliding_window(2, S),
    ];
    for origin in [Duration::ZERO, Duration::from_secs(1_000_000)] {
        for limiter in &limiters {
            let prefix = unique("exhausted");
            let spec = ResourceSpec::new("search").with_rate_limit(limiter.clone());
            let state = caller(RedisStore::builder(server.url()), &prefix)
                .bind(&spec)
                .unwrap();
            let oracle = caller(RedisStore::builder(server.url()).local_refusals(0), &prefix)
                .bind(&spec)
                .unwrap();
            let admit = |s: &dyn ResourceState, now: Duration, weight: u32| {
                let a = s
                    .admit(&AdmitRequest::new(None, now).with_weight(weight))
                    .unwrap();
                a.decision
                    .map(|_| ())
                    .map_err(|r| (r.reason, r.retry_after))
            };
            // GCRA's two permits are a burst of 2 spaced 0.5 s apart: the
            // second is taken at 0.1 s, the third is due at 1.0 s; the
            // windows' third is due at 1 s too.
            let t0 = origin + Duration::from_millis(1);
            assert!(admit(&*state, t0, 1).is_ok());
            assert!(admit(&*state, t0 + Duration::from_millis(99), 1).is_ok());
            let refused_at = origin + Duration::from_millis(200);
            let first = admit(&*state, refused_at, 1).unwrap_err();
            assert_eq!(first.0, RejectionReason::RateLimited);
            let end = refused_at + first.1.unwrap();
            for now in [
                refused_at + NS,
                refused_at + (end - refused_at) / 2,
                end - NS,
            ] {
                let before = command_calls(&mut conn);
                let local = admit(&*state, now, 1);
                assert_eq!(
                    sent(&before, &command_calls(&mut conn)),
                    0,
                    "{limiter:?} at {now:?}"
                );
                // GCRA and the fixed window count waits from the
                // nanosecond, the sliding log from the whole microsecond.
                let (reason, wait) = local.unwrap_err();
                assert_eq!(reason, RejectionReason::RateLimited);
                let wait = wait.unwrap();
                assert!(wait >= end - now && wait < end - now + Duration::from_micros(1));
                assert_eq!(local, admit(&*oracle, now, 1), "Redis agrees");
            }
            // Another weight, another partition: Redis is asked.
            let before = command_calls(&mut conn);
            assert!(admit(&*state, end - NS, 2).is_err());
            let p = PartitionKey::from(7u64);
            let other = state.admit(&AdmitRequest::new(Some(&p), end - NS)).unwrap();
            assert!(
                other.decision.is_ok(),
                "another partition has its own limit"
            );
            assert_eq!(sent(&before, &command_calls(&mut conn)), 2);
            // At T, admitted through Redis.
            let before = command_calls(&mut conn);
            assert!(admit(&*state, end, 1).is_ok(), "{limiter:?}");
            assert_eq!(sent(&before, &command_calls(&mut conn)), 1);
        }
    }
}

/// A rate limiter whose calls may wait reserves permits, and a reservation
/// given back makes a permit free earlier: its refusals are never replayed.
#[test]
fn a_limiter_whose_calls_may_wait_is_always_asked() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let spec =
        ResourceSpec::new("reserving").with_rate_limit(RateLimiter::gcra(1, 10 * S).max_wait(S));
    let state = caller(RedisStore::builder(server.url()), &unique("reserving"))
        .bind(&spec)
        .unwrap();
    let now = Duration::from_secs(1_000_000);
    let request = AdmitRequest::new(None, now);
    assert!(state.admit(&request).unwrap().decision.is_ok());
    let reserve = Reserve {
        within: S,
        held: None,
    };
    for _ in 0..3 {
        let before = command_calls(&mut conn);
        let (a, reserved) = state.admit_reserving(&request, reserve).unwrap();
        assert_eq!(a.decision.unwrap_err().reason, RejectionReason::RateLimited);
        assert!(reserved.is_none(), "10 s away, beyond the lead");
        assert_eq!(sent(&before, &command_calls(&mut conn)), 1);
    }
}

/// A cooldown (a retry-after hint recorded) until T: refused locally until
/// T, through Redis from T. Its end only moves later, whoever records.
#[test]
fn a_cooldown_refuses_without_a_round_trip_until_it_ends() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    for origin in [Duration::ZERO, Duration::from_secs(1_000_000)] {
        let spec = ResourceSpec::new("quota-api").with_cooldown(Cooldown::new());
        let state = caller(RedisStore::builder(server.url()), &unique("cooldown"))
            .bind(&spec)
            .unwrap();
        let request = |now| AdmitRequest::new(None, now);
        let permit = state.admit(&request(origin)).unwrap().decision.unwrap();
        state
            .record(&Record {
                partition: None,
                permit,
                outcome: Outcome::Failure,
                duration: Duration::from_millis(1),
                retry_after: Some(5 * S),
                now: origin,
            })
            .unwrap();
        let refusal = |now| {
            state
                .admit(&request(now))
                .unwrap()
                .decision
                .map(|_| ())
                .map_err(|r| (r.reason, r.retry_after))
        };
        let before = command_calls(&mut conn);
        assert_eq!(
            refusal(origin + S),
            Err((RejectionReason::CooldownActive, Some(4 * S)))
        );
        assert_eq!(sent(&before, &command_calls(&mut conn)), 1);
        let before = command_calls(&mut conn);
        assert_eq!(
            refusal(origin + 5 * S - NS),
            Err((
                RejectionReason::CooldownActive,
                Some(Duration::from_micros(1))
            ))
        );
        assert_eq!(sent(&before, &command_calls(&mut conn)), 0);
        let before = command_calls(&mut conn);
        assert!(refusal(origin + 5 * S).is_ok());
        assert_eq!(sent(&before, &command_calls(&mut conn)), 1);
    }
}

/// Two stores (two processes) on one Redis, on the server's clock: B
/// learns of the trip A made at its next admission; from then on B
/// refuses without a command.
#[test]
fn another_process_learns_of_a_trip_within_one_admission() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let prefix = unique("two-processes");
    let pipeline = || {
        let store = RedisStore::builder(server.url())
            .prefix(&prefix)
            .fail_closed()
            .build()
            .unwrap();
        Pipeline::builder("orders")
            .circuit_breaker(CircuitBreaker::consecutive_failures(2).cooldown(30 * S))
            .store(store)
            .build()
            .unwrap()
    };
    let (a, b) = (pipeline(), pipeline());
    let rt = rt();
    // B admits while the circuit is closed (no entry).
    assert_eq!(b.call(|_| Ok::<_, std::io::Error>(1)).unwrap(), 1);
    rt.block_on(async {
        for _ in 0..2 {
            let r: Result<(), _> = a.run(|_| async { Err(io("down")) }).await;
            assert!(matches!(r, Err(Error::Operation(_))));
        }
    });
    // B's very next admission is refused: through Redis.
    let before = command_calls(&mut conn);
    let first = answer(b.call(|_| Ok::<_, std::io::Error>(1))).unwrap();
    assert_eq!(first.0, RejectionReason::CircuitOpen);
    assert!(first.1.unwrap() <= 30 * S + Duration::from_millis(1));
    assert_eq!(sent(&before, &command_calls(&mut conn)), 1);
    // Then without a command, sync and async, counting down.
    let before = command_calls(&mut conn);
    for _ in 0..5 {
        let again = answer(b.call(|_| Ok::<_, std::io::Error>(1))).unwrap();
        assert_eq!(again.0, RejectionReason::CircuitOpen);
        assert!(again.1.unwrap() <= first.1.unwrap());
        let again = answer(rt.block_on(b.run(|_| async { Ok::<_, std::io::Error>(1) }))).unwrap();
        assert_eq!(again.0, RejectionReason::CircuitOpen);
    }
    assert_eq!(sent(&before, &command_calls(&mut conn)), 0);
}

/// Manual controls: one made through the store is seen at its next
/// admission; one made by another process is seen when the refusal the
/// store replays ends (the documented exception), or at once with
/// `local_refusals(0)`.
#[test]
fn controls_are_seen_at_once_here_and_at_the_end_of_the_refusal_elsewhere() {
    let server = RedisServer::start();
    let prefix = unique("controls");
    let clock = VirtualClock::new();
    clock.advance(Duration::from_secs(1_000_000));
    let pipeline = |builder: RedisStoreBuilder| {
        Pipeline::builder("states")
            .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(10 * S))
            .clock(clock.clone())
            .store(caller(builder, &prefix))
            .build()
            .unwrap()
    };
    let a = pipeline(RedisStore::builder(server.url()));
    let b = pipeline(RedisStore::builder(server.url()));
    let off = pipeline(RedisStore::builder(server.url()).local_refusals(0));
    let ok = |_| Ok::<_, std::io::Error>(1);
    let open = |left| Some((RejectionReason::CircuitOpen, Some(left)));

    assert!(a.call(|_| Err::<u32, _>(io("down"))).is_err());
    for p in [&a, &b, &off] {
        assert_eq!(answer(p.call(ok)), open(10 * S));
    }
    // Reset by A: A and the store without replay admit at once; B keeps
    // refusing until the end of the open period it was given.
    a.reset().unwrap();
    assert_eq!(answer(a.call(ok)), None);
    assert_eq!(answer(off.call(ok)), None);
    clock.advance(4 * S);
    assert_eq!(answer(b.call(ok)), open(6 * S));
    clock.advance(6 * S);
    assert_eq!(answer(b.call(ok)), None, "seen at the end");

    // Disabled by B while A replays a refusal: A sees it at the end; B's
    // own control is seen by B at once.
    assert!(a.call(|_| Err::<u32, _>(io("down"))).is_err());
    assert_eq!(answer(a.call(ok)), open(10 * S));
    assert_eq!(answer(b.call(ok)), open(10 * S));
    b.disable().unwrap();
    assert_eq!(answer(b.call(ok)), None);
    assert_eq!(answer(a.call(ok)), open(10 * S));
    b.enable().unwrap();
    // open_for by B, shorter than the open period A replays.
    a.open_for(10 * S).unwrap();
    assert_eq!(answer(a.call(ok)), open(10 * S));
    b.open_for(S).unwrap();
    clock.advance(S);
    assert_eq!(answer(off.call(ok)), None, "a probe, on Redis");
    assert_eq!(answer(a.call(ok)), open(9 * S), "A still replays");
}

/// On a Redis Cluster: an open circuit refuses without a command to any
/// master, for the unpartitioned state and a partition.
#[test]
fn an_open_circuit_refuses_without_a_command_on_a_cluster() {
    let cluster = RedisCluster::start();
    let masters = cluster.masters();
    let count = |cluster: &RedisCluster| -> u64 {
        masters
            .iter()
            .map(|&p| {
                let stats = command_calls(&mut cluster.conn(p));
                sent(&HashMap::new(), &stats)
            })
            .sum()
    };
    let store = caller(
        RedisStore::cluster(cluster.master_urls()),
        &unique("cluster"),
    );
    let spec = ResourceSpec::new("cluster-circuit")
        .with_circuit(CircuitBreaker::consecutive_failures(1).cooldown(10 * S));
    let state = store.bind(&spec).unwrap();
    let now = Duration::from_secs(1_000_000);
    let key = PartitionKey::from("tenant-1");
    for partition in [None, Some(&key)] {
        let request = |now| AdmitRequest::new(partition, now);
        let permit = state.admit(&request(now)).unwrap().decision.unwrap();
        state
            .record(&Record {
                partition,
                permit,
                outcome: Outcome::Failure,
                duration: Duration::from_millis(1),
                retry_after: None,
                now,
            })
            .unwrap();
        let refused = |at| {
            let r = state.admit(&request(at)).unwrap().decision.unwrap_err();
            (r.reason, r.retry_after)
        };
        assert_eq!(
            refused(now + S),
            (RejectionReason::CircuitOpen, Some(9 * S))
        );
        let before = count(&cluster);
        for i in 1..=5u32 {
            assert_eq!(
                refused(now + S + i * S),
                (RejectionReason::CircuitOpen, Some(9 * S - i * S))
            );
        }
        assert_eq!(count(&cluster) - before, 0);
        assert!(state
            .admit(&request(now + 10 * S))
            .unwrap()
            .decision
            .is_ok());
    }
}
