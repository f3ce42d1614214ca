//! `MemoryStore` under contention, and the store contract suite run against it.
//!
//! Time is passed in `now`: every count below is exact, whatever the
//! scheduling.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use seawall::breaker::{CircuitState, CircuitTransition};
use seawall::store::contract::{self, ManualClock};
use seawall::store::{AdmitRequest, Outcome, Permit, Record, ResourceSpec, ResourceState};
use seawall::{
    Bulkhead, CircuitBreaker, Cooldown, MemoryStore, PartitionKey, RateLimiter, RejectionReason,
    StateStore,
};

const THREADS: usize = 8;

fn admit(
    state: &dyn ResourceState,
    key: Option<&PartitionKey>,
    now: Duration,
) -> Result<Permit, RejectionReason> {
    state
        .admit(&AdmitRequest {
            partition: key,
            now,
            weight: 1,
            budget: None,
            shadowed: false,
        })
        .unwrap()
        .decision
        .map_err(|r| r.reason)
}

fn record(
    state: &dyn ResourceState,
    key: Option<&PartitionKey>,
    permit: Permit,
    outcome: Outcome,
    now: Duration,
) -> Option<CircuitTransition> {
    state
        .record(&Record {
            partition: key,
            permit,
            outcome,
            duration: Duration::ZERO,
            retry_after: None,
            now,
        })
        .unwrap()
        .transition
}

#[test]
fn memory_store_honours_the_store_contract() {
    contract::run_all(&MemoryStore::new(), &ManualClock::new());
}

#[test]
fn the_global_store_honours_the_store_contract() {
    contract::run_all(MemoryStore::global(), &ManualClock::new());
}

/// 64 tasks on 8 threads take and give back slots of one bulkhead of 5;
/// their own count of holders never passes 5, and neither does the store's.
#[test]
fn bulkhead_never_lets_more_than_its_capacity_in() {
    const CAPACITY: u32 = 5;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(THREADS)
        .build()
        .unwrap();
    for partition in [None, Some(PartitionKey::from("tenant"))] {
        let state = MemoryStore::new()
            .bind(
                &ResourceSpec::new("hammered-bulkhead")
                    .with_circuit(CircuitBreaker::consecutive_failures(1_000_000))
                    .with_bulkhead(Bulkhead::new(CAPACITY))
                    .with_cooldown(Cooldown::new()),
            )
            .unwrap();
        let holders = Arc::new(AtomicU32::new(0));
        let most = Arc::new(AtomicU32::new(0));
        let admitted = Arc::new(AtomicU32::new(0));
        runtime.block_on(async {
            let tasks: Vec<_> = (0..64)
                .map(|task| {
                    let (state, holders, most, admitted) = (
                        Arc::clone(&state),
                        Arc::clone(&holders),
                        Arc::clone(&most),
                        Arc::clone(&admitted),
                    );
                    let key = partition.clone();
                    tokio::spawn(async move {
                        for i in 0..200 {
                            let Ok(permit) = admit(&*state, key.as_ref(), Duration::ZERO) else {
                                tokio::task::yield_now().await;
                                continue;
                            };
                            admitted.fetch_add(1, Ordering::Relaxed);
                            let now_holding = holders.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now_holding, Ordering::SeqCst);
                            let seen = state.in_flight(key.as_ref(), Duration::ZERO).unwrap();
                            assert!(seen <= CAPACITY, "store reports {seen} in flight");
                            tokio::task::yield_now().await;
                            holders.fetch_sub(1, Ordering::SeqCst);
                            if (task + i) % 7 == 0 {
                                state.release(key.as_ref(), permit);
                            } else {
                                record(
                                    &*state,
                                    key.as_ref(),
                                    permit,
                                    Outcome::Success,
                                    Duration::ZERO,
                                );
                            }
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        });
        assert!(most.load(Ordering::SeqCst) <= CAPACITY);
        assert_eq!(
            most.load(Ordering::SeqCst),
            CAPACITY,
            "64 tasks holding slots across a yield fill the bulkhead"
        );
        assert!(admitted.load(Ordering::Relaxed) > 0);
        assert_eq!(
            state.in_flight(partition.as_ref(), Duration::ZERO).unwrap(),
            0
        );
    }
}

/// 8 threads hammer one limiter at a fixed instant: exactly the limit (the
/// burst, for GCRA) is admitted, in this window and in the next.
#[test]
fn rate_limiters_admit_exactly_the_limit_under_contention() {
    const LIMIT: u32 = 100;
    let period = Duration::from_secs(1);
    let limiters = [
        RateLimiter::fixed_window(LIMIT, period),
        RateLimiter::sliding_window(LIMIT, period),
        RateLimiter::gcra(LIMIT, period),
    ];
    for limiter in limiters {
        for partition in [None, Some(PartitionKey::from(3u64))] {
            let state = MemoryStore::new()
                .bind(&ResourceSpec::new("hammered-rate").with_rate_limit(limiter.clone()))
                .unwrap();
            // Inside a window, away from its edges; then the next window.
            for now in [Duration::from_millis(10_250), Duration::from_millis(11_250)] {
                let barrier = Barrier::new(THREADS);
                let admitted = AtomicU32::new(0);
                std::thread::scope(|s| {
                    for _ in 0..THREADS {
                        s.spawn(|| {
                            barrier.wait();
                            for _ in 0..500 {
                                match admit(&*state, partition.as_ref(), now) {
                                    Ok(_) => {
                                        admitted.fetch_add(1, Ordering::Relaxed);
                                    }
                                    Err(reason) => assert_eq!(reason, RejectionReason::RateLimited),
                                }
                            }
                        });
                    }
                });
                assert_eq!(
                    admitted.load(Ordering::Relaxed),
                    LIMIT,
                    "{:?} at {now:?} (partition {partition:?})",
                    limiter.algorithm
                );
            }
        }
    }
}

/// 8 threads admit on many partition keys at once while keys are created,
/// swept and evicted around them: each key admits exactly its limit, on
/// clocks at 0, at 10^6 s and near the end of the clock.
#[test]
fn partitioned_limits_hold_while_keys_come_and_go() {
    const LIMIT: u32 = 5;
    const KEYS: u64 = 300;
    let period = Duration::from_secs(10);
    let limiters = [
        RateLimiter::fixed_window(LIMIT, period),
        RateLimiter::sliding_window(LIMIT, period),
        RateLimiter::gcra(LIMIT, period),
    ];
    let bases = [
        Duration::ZERO,
        Duration::from_secs(1_000_000),
        Duration::from_nanos(u64::MAX) - Duration::from_secs(60),
    ];
    for limiter in limiters {
        for base in bases {
            let state = MemoryStore::new()
                .bind(
                    &ResourceSpec::new("keyed-rate")
                        .with_rate_limit(limiter.clone())
                        .with_bulkhead(Bulkhead::new(1_000))
                        .with_partition_idle(Duration::ZERO),
                )
                .unwrap();
            let now = base + Duration::from_millis(2_500);
            let admitted: Vec<AtomicU32> = (0..KEYS).map(|_| AtomicU32::new(0)).collect();
            let barrier = Barrier::new(THREADS + 1);
            std::thread::scope(|s| {
                for t in 0..THREADS as u64 {
                    let (state, admitted, barrier) = (&state, &admitted, &barrier);
                    s.spawn(move || {
                        barrier.wait();
                        for round in 0..2 * LIMIT as u64 {
                            for k in 0..KEYS {
                                // Each thread walks the keys in its own order.
                                let k = (k * 7 + t * 13 + round) % KEYS;
                                let key = PartitionKey::from(k);
                                if let Ok(p) = admit(&**state, Some(&key), now) {
                                    admitted[k as usize].fetch_add(1, Ordering::Relaxed);
                                    record(&**state, Some(&key), p, Outcome::Success, now);
                                }
                            }
                        }
                    });
                }
                // Evictions race the admissions; keys holding permits stay.
                barrier.wait();
                for _ in 0..200 {
                    state.evict_idle(now);
                }
            });
            for (k, n) in admitted.iter().enumerate() {
                assert_eq!(
                    n.load(Ordering::Relaxed),
                    LIMIT,
                    "{:?} at {base:?}, key {k}",
                    limiter.algorithm
                );
            }
            assert_eq!(state.partitions(), KEYS as usize);
            // Once a period has passed, every key is fresh again and goes.
            assert_eq!(state.evict_idle(now + period), KEYS as usize);
        }
    }
}

/// Many threads race a circuit that has just become eligible for
/// half-open: exactly `half_open_calls` probes get in, exactly one
/// half-open and one close are reported, over many rounds.
#[test]
fn half_open_admits_exactly_the_probe_count_under_races() {
    let store = MemoryStore::new();
    for round in 0..150u32 {
        let probes = round % 4 + 1;
        let state = store
            .bind(
                &ResourceSpec::new(format!("racing-probes-{round}")).with_circuit(
                    CircuitBreaker::consecutive_failures(1)
                        .cooldown(Duration::from_millis(10))
                        .half_open_calls(probes),
                ),
            )
            .unwrap();
        let key = (round % 2 == 0).then(|| PartitionKey::from(u64::from(round)));
        let key = key.as_ref();
        let t0 = Duration::from_secs(u64::from(round));
        let permit = admit(&*state, key, t0).unwrap();
        assert!(matches!(
            record(&*state, key, permit, Outcome::Failure, t0),
            Some(CircuitTransition::Opened { .. })
        ));
        let later = t0 + Duration::from_millis(10);
        let barrier = Barrier::new(THREADS);
        let half_opened = AtomicU32::new(0);
        let closed = AtomicU32::new(0);
        let admitted: Vec<Vec<Permit>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        let mut mine = Vec::new();
                        for _ in 0..4 {
                            let admission = state
                                .admit(&AdmitRequest {
                                    partition: key,
                                    now: later,
                                    weight: 1,
                                    budget: None,
                                    shadowed: false,
                                })
                                .unwrap();
                            if admission.transition == Some(CircuitTransition::HalfOpened) {
                                half_opened.fetch_add(1, Ordering::Relaxed);
                            }
                            match admission.decision {
                                Ok(p) => {
                                    assert!(p.probe);
                                    mine.push(p);
                                }
                                Err(r) => assert_eq!(r.reason, RejectionReason::CircuitOpen),
                            }
                        }
                        barrier.wait();
                        // Every probe succeeds, concurrently.
                        for p in &mine {
                            if record(&*state, key, *p, Outcome::Success, later)
                                == Some(CircuitTransition::Closed)
                            {
                                closed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        mine
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let total: usize = admitted.iter().map(Vec::len).sum();
        assert_eq!(total, probes as usize, "round {round}");
        assert_eq!(half_opened.load(Ordering::Relaxed), 1, "round {round}");
        assert_eq!(closed.load(Ordering::Relaxed), 1, "round {round}");
        assert_eq!(
            state.circuit_metrics(key, later).unwrap().state,
            CircuitState::Closed
        );
    }
}

/// Failures racing in a consecutive-mode circuit open it exactly once, and
/// slow successes racing in a count window are all counted.
#[test]
fn racing_outcomes_are_all_counted() {
    let store = MemoryStore::new();
    for round in 0..50u32 {
        let state = store
            .bind(
                &ResourceSpec::new(format!("racing-failures-{round}")).with_circuit(
                    CircuitBreaker::consecutive_failures(40).cooldown(Duration::from_secs(1)),
                ),
            )
            .unwrap();
        let opened = AtomicU32::new(0);
        let barrier = Barrier::new(THREADS);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    let permits: Vec<Permit> = (0..5)
                        .map(|_| admit(&*state, None, Duration::ZERO).unwrap())
                        .collect();
                    barrier.wait();
                    for p in permits {
                        if record(&*state, None, p, Outcome::Failure, Duration::ZERO).is_some() {
                            opened.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        // 40 failures in a row, from 8 threads: open, exactly once.
        assert_eq!(opened.load(Ordering::Relaxed), 1, "round {round}");
        assert_eq!(
            state.circuit_metrics(None, Duration::ZERO).unwrap().state,
            CircuitState::Open
        );
    }

    let state = store
        .bind(
            &ResourceSpec::new("racing-window").with_circuit(
                CircuitBreaker::failure_rate(1.0)
                    .count_window(1000)
                    .minimum_calls(1000)
                    .slow_calls(1.0, Duration::from_millis(1)),
            ),
        )
        .unwrap();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let state = &state;
            s.spawn(move || {
                for i in 0..100 {
                    let p = admit(&**state, None, Duration::ZERO).unwrap();
                    let outcome = if (t + i) % 4 == 0 {
                        Outcome::Failure
                    } else {
                        Outcome::Success
                    };
                    state
                        .record(&Record {
                            partition: None,
                            permit: p,
                            outcome,
                            duration: Duration::from_millis((i % 2) as u64),
                            retry_after: None,
                            now: Duration::ZERO,
                        })
                        .unwrap();
                }
            });
        }
    });
    let m = state.circuit_metrics(None, Duration::ZERO).unwrap();
    assert_eq!((m.calls, m.failures, m.slow_calls), (800, 200, 400));
    assert_eq!(m.state, CircuitState::Closed, "below minimum_calls");
}

/// A reservation a policy before the rate limit refuses when it is due (a
/// cooldown opened meanwhile) is given back in the same operation, and so
/// is one its call gives back, on a partition as on the resource: the
/// permits are free again for the next caller.
#[test]
fn a_reservation_refused_when_due_or_given_back_frees_its_permit() {
    use seawall::store::{Reservation, Reserve};
    let ms = Duration::from_millis;
    let key = PartitionKey::from("tenant");
    for partition in [None, Some(&key)] {
        let spec = ResourceSpec::new(format!("reserve-{}", partition.is_some()))
            .with_cooldown(Cooldown::new())
            .with_rate_limit(RateLimiter::fixed_window(1, ms(250)).max_wait(ms(250)));
        let state = MemoryStore::new().bind(&spec).unwrap();
        let ask = |now, within, held| {
            state
                .admit_reserving(
                    &AdmitRequest {
                        partition,
                        now,
                        weight: 1,
                        budget: None,
                        shadowed: false,
                    },
                    Reserve { within, held },
                )
                .unwrap()
        };
        let (first, none) = ask(ms(250), ms(250), None);
        let permit = first.decision.unwrap();
        assert_eq!(none, None);
        let (second, reserved) = ask(ms(250), ms(250), None);
        let r = second.decision.unwrap_err();
        assert_eq!(
            (r.reason, r.retry_after),
            (RejectionReason::RateLimited, Some(ms(250)))
        );
        assert_eq!(
            reserved,
            Some(Reservation {
                at: ms(500),
                weight: 1
            })
        );
        // The window it waits for is taken: a third is refused at once.
        let (third, none) = ask(ms(250), ms(250), None);
        assert_eq!(third.decision.unwrap_err().retry_after, Some(ms(500)));
        assert_eq!(none, None);
        // A hint opens a cooldown until 650 ms: due at 500 ms, the
        // reservation is refused and given back.
        state
            .record(&Record {
                partition,
                permit,
                outcome: Outcome::Success,
                duration: Duration::ZERO,
                retry_after: Some(ms(400)),
                now: ms(250),
            })
            .unwrap();
        let (due, none) = ask(ms(500), ms(250), reserved);
        assert_eq!(
            due.decision.unwrap_err().reason,
            RejectionReason::CooldownActive
        );
        assert_eq!(none, None);
        // The window from 500 ms is free again.
        assert!(admit(&*state, partition, ms(650)).is_ok());
        // A reservation given back by its call frees its window too.
        let (_, reserved) = ask(ms(650), ms(250), None);
        assert_eq!(
            reserved,
            Some(Reservation {
                at: ms(750),
                weight: 1
            })
        );
        state.give_back_reservation(partition, reserved.unwrap());
        assert!(admit(&*state, partition, ms(750)).is_ok());
        // A due reservation presented alone is admitted without a new
        // permit.
        let (_, reserved) = ask(ms(750), ms(250), None);
        let (due, _) = ask(ms(1000), ms(250), reserved);
        assert!(due.decision.is_ok());
        assert_eq!(
            admit(&*state, partition, ms(1000)),
            Err(RejectionReason::RateLimited)
        );
    }
}
