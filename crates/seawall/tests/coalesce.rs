//! Request coalescing and its cache: concurrent calls with the same key
//! share one execution of the whole call, sync and async (and both at
//! once), with and without a listener; a dropped leader is replaced by one
//! of its followers; the cache keeps successes for its ttl on the virtual
//! clock (at 0 and at 10^6 s) and evicts the least recently used entry.

mod support;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use seawall::store::MemoryStore;
use seawall::testing::VirtualClock;
use seawall::*;
use support::{clock_at, ms, recorder, secs, unique, Boom, Log, FAR};

/// Waits (a bounded number of turns) until `p` has `n` coalesced calls
/// waiting: the leader's operation holds the execution open until every
/// follower has joined it, so that the test does not depend on timing. A
/// broken implementation makes the count of runs wrong, never a hang.
fn until_waiting<K: pipeline::Kind>(p: &Pipeline<K>, n: usize) {
    for _ in 0..20_000_000u32 {
        if p.coalesced_waiters() >= n {
            return;
        }
        std::thread::yield_now();
    }
}

async fn until_waiting_async<K: pipeline::Kind>(p: &Pipeline<K>, n: usize) {
    for _ in 0..20_000_000u32 {
        if p.coalesced_waiters() >= n {
            return;
        }
        tokio::task::yield_now().await;
    }
}

/// A pipeline with `coalesce`, a fresh store, `clock`, a listener if asked.
fn pipeline(coalesce: Coalesce, clock: &VirtualClock, listen: bool) -> (Pipeline, Log) {
    let (log, listener) = recorder();
    let mut b = Pipeline::builder(unique("coalesce"))
        .coalesce(coalesce)
        .store(MemoryStore::new())
        .clock(clock.clone());
    if listen {
        b = b.on_event(listener);
    }
    (b.build().unwrap(), log)
}

fn count(log: &Log, kind: &EventKind) -> usize {
    log.lock().unwrap().iter().filter(|e| *e == kind).count()
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap()
}

const CALLS: usize = 64;

#[test]
fn sixty_four_concurrent_blocking_calls_run_the_operation_once() {
    for (start, listen, cache) in combos() {
        let clock = clock_at(start);
        let (p, log) = pipeline(cached(cache), &clock, listen);
        let runs = Arc::new(AtomicU32::new(0));
        let results: Vec<Result<String, Error<Boom>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..CALLS)
                .map(|_| {
                    let (p, runs) = (&p, &runs);
                    s.spawn(move || {
                        p.coalesce_key("user-7").call(|_ctx| {
                            runs.fetch_add(1, Ordering::SeqCst);
                            until_waiting(p, CALLS - 1);
                            Ok::<_, Boom>(String::from("ada"))
                        })
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{start:?} {listen} {cache}");
        assert!(results.iter().all(|r| r.as_deref().ok() == Some("ada")));
        assert_eq!(p.coalesced_waiters(), 0);
        let coalesced = count(&log, &EventKind::Coalesced);
        let missed = count(&log, &EventKind::CacheMiss);
        match listen {
            true => assert_eq!(
                (coalesced, missed),
                (CALLS - 1, if cache { CALLS } else { 0 })
            ),
            false => assert_eq!((coalesced, missed), (0, 0)),
        }
    }
}

#[test]
fn sixty_four_concurrent_async_calls_run_the_operation_once() {
    for (start, listen, cache) in combos() {
        for threaded in [false, true] {
            let clock = clock_at(start);
            let (p, log) = pipeline(cached(cache), &clock, listen);
            let runs = Arc::new(AtomicU32::new(0));
            let rt = if threaded {
                multi_thread()
            } else {
                support::rt()
            };
            let results = rt.block_on(async {
                let tasks: Vec<_> = (0..CALLS)
                    .map(|_| {
                        let (p, runs) = (p.clone(), runs.clone());
                        tokio::spawn(async move {
                            let inner = p.clone();
                            p.coalesce_key(7u64)
                                .run(|_ctx| {
                                    let (p, runs) = (inner.clone(), runs.clone());
                                    async move {
                                        runs.fetch_add(1, Ordering::SeqCst);
                                        until_waiting_async(&p, CALLS - 1).await;
                                        Ok::<_, Boom>(vec![1u8, 2, 3])
                                    }
                                })
                                .await
                        })
                    })
                    .collect();
                let mut out = Vec::new();
                for t in tasks {
                    out.push(t.await.unwrap());
                }
                out
            });
            assert_eq!(runs.load(Ordering::SeqCst), 1, "{start:?} {listen} {cache}");
            assert!(results
                .iter()
                .all(|r| r.as_deref().ok() == Some(&[1u8, 2, 3][..])));
            if listen {
                assert_eq!(count(&log, &EventKind::Coalesced), CALLS - 1);
            }
        }
    }
}

/// Blocking and async calls share one table: an async leader is followed
/// by blocking callers and the other way round.
#[test]
fn blocking_and_async_calls_share_one_execution() {
    for async_leader in [false, true] {
        let clock = VirtualClock::new();
        let (p, log) = pipeline(Coalesce::new(), &clock, true);
        let runs = Arc::new(AtomicU32::new(0));
        let op = |p: Pipeline, runs: Arc<AtomicU32>| {
            move |_ctx: Context| {
                runs.fetch_add(1, Ordering::SeqCst);
                until_waiting(&p, 4);
                Ok::<_, Boom>(42u64)
            }
        };
        std::thread::scope(|s| {
            let leader = if async_leader {
                let (p, runs) = (p.clone(), runs.clone());
                s.spawn(move || {
                    support::rt().block_on(async {
                        let inner = p.clone();
                        p.coalesce_key(1u64)
                            .run(|_ctx| {
                                let (p, runs) = (inner.clone(), runs.clone());
                                async move {
                                    runs.fetch_add(1, Ordering::SeqCst);
                                    // The followers are other threads.
                                    until_waiting(&p, 4);
                                    Ok::<_, Boom>(42u64)
                                }
                            })
                            .await
                    })
                })
            } else {
                let op = op(p.clone(), runs.clone());
                let p = &p;
                s.spawn(move || p.coalesce_key(1u64).call(op))
            };
            for _ in 0..10_000_000u32 {
                if runs.load(Ordering::SeqCst) == 1 {
                    break;
                }
                std::thread::yield_now();
            }
            let mut followers = Vec::new();
            for i in 0..4 {
                let (p, runs) = (&p, &runs);
                followers.push(s.spawn(move || {
                    let op = |_ctx: Context| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Boom>(0u64)
                    };
                    if i % 2 == 0 {
                        p.coalesce_key(1u64).call(op)
                    } else {
                        support::rt().block_on(p.coalesce_key(1u64).run(|ctx| {
                            let r = op(ctx);
                            async move { r }
                        }))
                    }
                }));
            }
            assert_eq!(leader.join().unwrap().ok(), Some(42));
            for f in followers {
                assert_eq!(f.join().unwrap().ok(), Some(42));
            }
        });
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(count(&log, &EventKind::Coalesced), 4);
    }
}

#[test]
fn different_keys_do_not_coalesce() {
    const KEYS: u64 = 8;
    const EACH: usize = 4;
    let clock = VirtualClock::new();
    let (p, _) = pipeline(Coalesce::new(), &clock, false);
    let runs = Arc::new(AtomicU32::new(0));
    // Once every follower has joined, the first leader to see it lets the
    // others go too (the count falls as executions end).
    let joined = AtomicBool::new(false);
    let results: Vec<(u64, Result<u64, Error<Boom>>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..KEYS)
            .flat_map(|k| (0..EACH).map(move |_| k))
            .map(|k| {
                let (p, runs, joined) = (&p, &runs, &joined);
                s.spawn(move || {
                    let r = p.coalesce_key(k).call(|_ctx| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        for _ in 0..20_000_000u32 {
                            if joined.load(Ordering::SeqCst)
                                || p.coalesced_waiters() >= KEYS as usize * (EACH - 1)
                            {
                                joined.store(true, Ordering::SeqCst);
                                break;
                            }
                            std::thread::yield_now();
                        }
                        Ok::<_, Boom>(k * 10)
                    });
                    (k, r)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(runs.load(Ordering::SeqCst), KEYS as u32);
    for (k, r) in results {
        assert_eq!(r.ok(), Some(k * 10));
    }
}

#[test]
fn calls_of_other_result_types_or_partitions_do_not_meet() {
    let clock = VirtualClock::new();
    let (p, _) = pipeline(Coalesce::new().ttl(secs(60)), &clock, false);
    let runs = AtomicU32::new(0);
    let op32 = |_ctx: Context| {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<u32, Boom>(1)
    };
    let op64 = |_ctx: Context| {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<u64, Boom>(2)
    };
    assert_eq!(p.coalesce_key(1u64).call(op32).ok(), Some(1));
    assert_eq!(p.coalesce_key(1u64).call(op64).ok(), Some(2));
    assert_eq!(p.partition(1u64).coalesced().call(op32).ok(), Some(1));
    assert_eq!(
        p.partition(1u64).coalesce_key(1u64).call(op32).ok(),
        Some(1)
    );
    assert_eq!(p.coalesced().call(op32).ok(), Some(1));
    assert_eq!(runs.load(Ordering::SeqCst), 5);
    // Each of them is now cached under its own key.
    assert_eq!(p.coalesce_key(1u64).call(op32).ok(), Some(1));
    assert_eq!(p.partition(1u64).coalesced().call(op32).ok(), Some(1));
    assert_eq!(p.coalesced().call(op32).ok(), Some(1));
    assert_eq!(runs.load(Ordering::SeqCst), 5);
}

#[test]
fn an_error_is_shared_with_every_follower_and_never_cached() {
    for listen in [false, true] {
        let clock = clock_at(FAR);
        let (log, listener) = recorder();
        let mut b = Pipeline::builder(unique("coalesce-error"))
            .coalesce(Coalesce::new().ttl(secs(60)))
            .retry(Retry::constant(ms(10)).max_attempts(3))
            .store(MemoryStore::new())
            .clock(clock.clone());
        if listen {
            b = b.on_event(listener);
        }
        let p = b.build().unwrap();
        let runs = AtomicU32::new(0);
        let results: Vec<Result<u32, Error<Boom>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let (p, runs) = (&p, &runs);
                    s.spawn(move || {
                        p.coalesce_key("k").call(|_ctx| {
                            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                            until_waiting(p, 7);
                            Err::<u32, _>(Boom(n))
                        })
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        // One execution of the whole call: its three attempts.
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        for r in &results {
            match r {
                Err(Error::RetryExhausted { attempts, last }) => {
                    assert_eq!((*attempts, last), (3, &Boom(3)))
                }
                other => panic!("{other:?}"),
            }
        }
        // Not cached: the next call runs again.
        assert_eq!(
            p.coalesce_key("k").call(|_| Ok::<u32, Boom>(5)).ok(),
            Some(5)
        );
        assert_eq!(
            p.coalesce_key("k").call(|_| Ok::<u32, Boom>(6)).ok(),
            Some(5)
        );
        if listen {
            assert_eq!(count(&log, &EventKind::Coalesced), 7);
            assert_eq!(count(&log, &EventKind::CacheHit), 1);
            assert_eq!(count(&log, &EventKind::CacheMiss), 9);
        }
    }
}

/// An async leader dropped while its followers wait: one of them runs its
/// own operation and the others get its result.
#[test]
fn a_dropped_async_leader_does_not_strand_its_followers() {
    for listen in [false, true] {
        let clock = VirtualClock::new();
        let (p, log) = pipeline(Coalesce::new(), &clock, listen);
        let runs = Arc::new(AtomicU32::new(0));
        let results = support::rt().block_on(async {
            let r = runs.clone();
            let mut leader = Box::pin(p.coalesce_key(3u64).run(move |_ctx| {
                r.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<Result<u32, Boom>>()
            }));
            tokio::select! {
                biased;
                _ = &mut leader => panic!("the leader never ends"),
                _ = std::future::ready(()) => {}
            }
            assert_eq!(runs.load(Ordering::SeqCst), 1);
            let followers: Vec<_> = (0..8)
                .map(|_| {
                    let (p, runs) = (p.clone(), runs.clone());
                    tokio::spawn(async move {
                        p.coalesce_key(3u64)
                            .run(|_ctx| {
                                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                                async move { Ok::<_, Boom>(n) }
                            })
                            .await
                    })
                })
                .collect();
            until_waiting_async(&p, 8).await;
            drop(leader);
            let mut out = Vec::new();
            for f in followers {
                out.push(f.await.unwrap());
            }
            out
        });
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert!(
            results.iter().all(|r| r.as_ref().ok() == Some(&2)),
            "{results:?}"
        );
        assert_eq!(p.coalesced_waiters(), 0);
        if listen {
            assert_eq!(count(&log, &EventKind::CoalesceTakeover), 1);
            assert_eq!(count(&log, &EventKind::Coalesced), 7);
        }
    }
}

/// A blocking leader whose operation panics: its followers are woken and
/// one of them takes over.
#[test]
fn a_panicking_blocking_leader_does_not_strand_its_followers() {
    for listen in [false, true] {
        let clock = VirtualClock::new();
        let (p, log) = pipeline(Coalesce::new(), &clock, listen);
        let runs = AtomicU32::new(0);
        std::thread::scope(|s| {
            let leader = s.spawn(|| {
                catch_unwind(AssertUnwindSafe(|| {
                    p.coalesce_key(9u64).call(|_ctx| -> Result<u32, Boom> {
                        runs.fetch_add(1, Ordering::SeqCst);
                        until_waiting(&p, 4);
                        panic!("the leader's operation panics")
                    })
                }))
            });
            for _ in 0..10_000_000u32 {
                if runs.load(Ordering::SeqCst) == 1 {
                    break;
                }
                std::thread::yield_now();
            }
            let followers: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        p.coalesce_key(9u64)
                            .call(|_ctx| Ok::<_, Boom>(runs.fetch_add(1, Ordering::SeqCst) + 1))
                    })
                })
                .collect();
            assert!(leader.join().unwrap().is_err(), "the leader panicked");
            for f in followers {
                assert_eq!(f.join().unwrap().ok(), Some(2));
            }
        });
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        if listen {
            assert_eq!(count(&log, &EventKind::CoalesceTakeover), 1);
            assert_eq!(count(&log, &EventKind::Coalesced), 3);
        }
    }
}

#[test]
fn a_cached_success_answers_until_its_ttl_on_the_pipeline_clock() {
    for (start, listen) in [
        (Duration::ZERO, false),
        (Duration::ZERO, true),
        (FAR, false),
        (FAR, true),
    ] {
        for sync in [true, false] {
            let clock = clock_at(start);
            let (p, log) = pipeline(Coalesce::new().ttl(secs(10)), &clock, listen);
            let runs = AtomicU32::new(0);
            let get = || {
                let op = |_ctx: Context| Ok::<_, Boom>(runs.fetch_add(1, Ordering::SeqCst) + 1);
                if sync {
                    p.coalesce_key("price").call(op)
                } else {
                    let c = p.coalesce_key("price");
                    support::rt().block_on(c.run(|ctx| {
                        let r = op(ctx);
                        async move { r }
                    }))
                }
            };
            assert_eq!(get().ok(), Some(1));
            clock.advance(ms(9_999));
            assert_eq!(get().ok(), Some(1), "fresh until the ttl");
            clock.advance(ms(1));
            assert_eq!(get().ok(), Some(2), "stale at the ttl");
            assert_eq!(get().ok(), Some(2));
            assert_eq!(runs.load(Ordering::SeqCst), 2);
            if listen {
                assert_eq!(count(&log, &EventKind::CacheHit), 2);
                assert_eq!(count(&log, &EventKind::CacheMiss), 2);
            } else {
                assert!(log.lock().unwrap().is_empty());
            }
        }
    }
}

#[test]
fn the_least_recently_used_entry_is_evicted() {
    for start in [Duration::ZERO, FAR] {
        let clock = clock_at(start);
        let (p, _) = pipeline(Coalesce::new().ttl(secs(60)).max_entries(2), &clock, false);
        let runs = AtomicU32::new(0);
        let get = |k: u64| {
            p.coalesce_key(k).call(|_ctx| {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Boom>(k)
            })
        };
        get(1).unwrap();
        get(2).unwrap();
        get(1).unwrap(); // 1 is now the most recently used
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        get(3).unwrap(); // evicts 2
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        get(1).unwrap();
        get(3).unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        get(2).unwrap(); // gone: runs again, evicts 1
        assert_eq!(runs.load(Ordering::SeqCst), 4);
        get(1).unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 5);
    }
}

#[test]
fn a_fallback_value_is_shared_but_not_cached() {
    let clock = VirtualClock::new();
    let p = Pipeline::builder(unique("coalesce-fallback"))
        .coalesce(Coalesce::new().ttl(secs(60)))
        .store(MemoryStore::new())
        .clock(clock.clone())
        .fallback_sync(|_err, _ctx| Ok::<_, Boom>(String::from("stale")))
        .build()
        .unwrap();
    let runs = AtomicU32::new(0);
    let fail = |_ctx: Context| {
        runs.fetch_add(1, Ordering::SeqCst);
        Err::<String, _>(Boom(1))
    };
    let ok = |_ctx: Context| {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Boom>(String::from("fresh"))
    };
    assert_eq!(p.coalesce_key(1u64).call(fail).unwrap(), "stale");
    assert_eq!(p.coalesce_key(1u64).call(ok).unwrap(), "fresh");
    assert_eq!(p.coalesce_key(1u64).call(fail).unwrap(), "fresh");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // The same through `run`.
    let rt = support::rt();
    let async_fail = |ctx| {
        let r = fail(ctx);
        async move { r }
    };
    assert_eq!(
        rt.block_on(p.coalesce_key(2u64).run(async_fail)).unwrap(),
        "stale"
    );
    assert_eq!(
        rt.block_on(p.coalesce_key(2u64).run(async_fail)).unwrap(),
        "stale"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}

/// Followers take no bulkhead slot and no rate-limit permit: only the
/// leader's call goes through the pipeline.
#[test]
fn followers_take_no_slot_and_no_permit() {
    let clock = clock_at(FAR);
    let p = Pipeline::builder(unique("coalesce-guarded"))
        .coalesce(Coalesce::new())
        .bulkhead(Bulkhead::new(1))
        .rate_limiter(RateLimiter::gcra(1, secs(60)))
        .store(MemoryStore::new())
        .clock(clock.clone())
        .build()
        .unwrap();
    let runs = AtomicU32::new(0);
    let results: Vec<Result<u32, Error<Boom>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16)
            .map(|_| {
                let (p, runs) = (&p, &runs);
                s.spawn(move || {
                    p.coalesce_key(1u64).call(|_ctx| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        until_waiting(p, 15);
                        Ok::<_, Boom>(7)
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(
        results.iter().all(|r| r.as_ref().ok() == Some(&7)),
        "{results:?}"
    );
    // The one permit of the minute is spent: a plain call is refused.
    let r = p.call(|_ctx| Ok::<_, Boom>(0));
    assert_eq!(
        r.unwrap_err().rejection().map(|r| r.reason),
        Some(RejectionReason::RateLimited)
    );
}

#[test]
fn plain_calls_never_share_and_keyed_calls_without_coalesce_run_plainly() {
    let clock = VirtualClock::new();
    let (p, _) = pipeline(Coalesce::new().ttl(secs(60)), &clock, false);
    let runs = AtomicU32::new(0);
    let op = |_ctx: Context| Ok::<_, Boom>(runs.fetch_add(1, Ordering::SeqCst));
    p.call(op).unwrap();
    p.call(op).unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let plain = Pipeline::builder(unique("no-coalesce"))
        .clock(clock.clone())
        .build()
        .unwrap();
    plain.coalesce_key(1u64).call(op).unwrap();
    plain.coalesce_key(1u64).call(op).unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    assert_eq!(plain.coalesced_waiters(), 0);
}

#[test]
fn bad_settings_are_refused_at_build() {
    let build = |c: Coalesce| Pipeline::builder("coalesce-bad").coalesce(c).build();
    let e = build(Coalesce::new().ttl(Duration::ZERO)).unwrap_err();
    assert_eq!((e.policy, e.field), ("coalesce", "ttl"));
    assert!(e.to_string().starts_with("coalesce.ttl must be > 0"), "{e}");
    let e = build(Coalesce::new().ttl(secs(1)).max_entries(0)).unwrap_err();
    assert_eq!((e.policy, e.field), ("coalesce", "max_entries"));
    assert!(
        e.to_string()
            .starts_with("coalesce.max_entries must be >= 1, got 0"),
        "{e}"
    );
    let e = build(Coalesce::new().max_entries(10)).unwrap_err();
    assert_eq!(e.field, "max_entries");
    let e = Pipeline::builder("coalesce-late")
        .retry(Retry::constant(ms(1)))
        .coalesce(Coalesce::new())
        .build()
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("pipeline.coalesce is declared after another policy"),
        "{e}"
    );
}

#[cfg(feature = "serde")]
#[test]
fn files_declare_coalescing_and_locate_bad_values() {
    use seawall::config::{Config, Format};
    let config = Config::parse(
        Format::Toml,
        "[pipelines.prices]\ncoalesce = { ttl = \"30s\", max_entries = 100 }\nretry = { delay = \"10ms\" }\n",
    )
    .unwrap();
    let from_file = config.builder("prices").unwrap().build().unwrap();
    let built = Pipeline::builder("prices")
        .coalesce(Coalesce::new().ttl(secs(30)).max_entries(100))
        .retry(Retry::exponential(ms(10)))
        .build()
        .unwrap();
    assert_eq!(format!("{from_file:?}"), format!("{built:?}"));
    let runs = AtomicU32::new(0);
    let op = |_ctx: Context| Ok::<_, Boom>(runs.fetch_add(1, Ordering::SeqCst));
    from_file.coalesce_key(1u64).call(op).unwrap();
    from_file.coalesce_key(1u64).call(op).unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the file's cache answers");

    let cases = [
        (
            Format::Toml,
            "[pipelines.a]\ncoalesce = { ttl = \"0s\" }\n",
            "<string>:2:20: pipeline `a`: coalesce.ttl must be > 0",
        ),
        (
            Format::Toml,
            "[pipelines.a.coalesce]\nttl = \"1s\"\nmax_entries = 0\n",
            "<string>:3:15: pipeline `a`: coalesce.max_entries must be >= 1, got 0",
        ),
        (
            Format::Yaml,
            "pipelines:\n  a:\n    coalesce:\n      ttl: 1s\n      max_entries: 0\n",
            "<string>:5:20: pipeline `a`: coalesce.max_entries must be >= 1, got 0",
        ),
    ];
    for (format, text, expected) in cases {
        let e = Config::parse(format, text).expect_err("refused");
        assert!(e.to_string().starts_with(expected), "{e}");
    }
    let e = Config::parse(
        Format::Toml,
        "[pipelines.a]\npolicies = [\"retry\", \"coalesce\"]\nretry = { delay = \"1s\" }\ncoalesce = {}\n",
    )
    .expect_err("coalesce after the retry is refused");
    assert!(e.to_string().contains("coalesce"), "{e}");
}

fn combos() -> Vec<(Duration, bool, bool)> {
    let mut v = Vec::new();
    for start in [Duration::ZERO, FAR] {
        for listen in [false, true] {
            for cache in [false, true] {
                v.push((start, listen, cache));
            }
        }
    }
    v
}

fn cached(cache: bool) -> Coalesce {
    if cache {
        Coalesce::new().ttl(secs(30)).max_entries(16)
    } else {
        Coalesce::new()
    }
}
