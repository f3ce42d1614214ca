//! The adaptive concurrency limit through the pipeline: admission and
//! refusal, sync and async, the queue, partition shares, samples of
//! failures and timeouts, events, the order rule, configuration files.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seawall::testing::VirtualClock;
use seawall::{AdaptiveLimit, Clock, Error, EventKind, Pipeline, RejectionReason, Retry, Timeout};

const MS: Duration = Duration::from_millis(1);

fn events(log: &Arc<Mutex<Vec<EventKind>>>) -> impl Fn(&seawall::Event<'_>) + Send + Sync {
    let log = log.clone();
    move |e| log.lock().unwrap().push(e.kind.clone())
}

/// A limit of `n` that stays `n` (AIMD between `n` and `n`).
fn fixed(n: u32) -> AdaptiveLimit {
    AdaptiveLimit::aimd().limits(n, n, n)
}

fn rejected<E: std::fmt::Debug>(r: Result<(), Error<E>>) -> RejectionReason {
    match r {
        Err(Error::Rejected(r)) => r.reason,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_sync_call_over_the_limit_is_refused_at_once_with_or_without_a_listener() {
    for listening in [false, true] {
        for start in [Duration::ZERO, Duration::from_secs(1_000_000)] {
            let log = Arc::new(Mutex::new(Vec::new()));
            let clock = VirtualClock::starting_at(start);
            let mut b = Pipeline::builder(format!("adaptive-sync-{listening}-{}", start.as_secs()))
                .adaptive_limit(fixed(1))
                .clock(clock.clone());
            if listening {
                b = b.on_event(events(&log));
            }
            let p = b.build().unwrap();
            let inner = p.clone();
            let outcome = p.call(|_| {
                assert_eq!(inner.concurrency_limit().unwrap().in_flight, 1);
                Ok::<_, std::io::Error>(rejected(inner.call(|_| Ok::<_, std::io::Error>(()))))
            });
            assert_eq!(outcome.unwrap(), RejectionReason::ConcurrencyLimited);
            assert_eq!(p.concurrency_limit().unwrap().in_flight, 0);
            let seen = log.lock().unwrap().clone();
            let refusals = seen
                .iter()
                .filter(|k| {
                    matches!(
                        k,
                        EventKind::Rejected {
                            reason: RejectionReason::ConcurrencyLimited,
                            ..
                        }
                    )
                })
                .count();
            assert_eq!(refusals, usize::from(listening), "{seen:?}");
        }
    }
}

/// Vegas and Gradient2 measure their baseline at a pinned concurrency (3
/// by default); a `max_limit` below it still bounds the attempts in
/// flight, sync and async.
#[test]
fn the_baseline_measurement_admits_no_more_than_the_max_limit() {
    for (name, limit) in [
        ("vegas", AdaptiveLimit::vegas()),
        ("gradient2", AdaptiveLimit::gradient2()),
    ] {
        for start in [Duration::ZERO, Duration::from_secs(1_000_000)] {
            let clock = VirtualClock::starting_at(start);
            let p = Pipeline::builder(format!("adaptive-pinned-{name}-{}", start.as_secs()))
                .adaptive_limit(limit.clone().limits(2, 2, 2))
                .clock(clock.clone())
                .build()
                .unwrap();
            let now = p.concurrency_limit().unwrap();
            assert!(now.measuring, "{name}");
            assert_eq!(now.admitted, 2, "{name}");
            // Sync: a third call nested in two others is refused.
            let inner = p.clone();
            let third = p.call(|_| {
                inner.call(|_| {
                    Ok::<_, std::io::Error>(rejected(inner.call(|_| Ok::<_, std::io::Error>(()))))
                })
            });
            assert_eq!(
                third.unwrap(),
                RejectionReason::ConcurrencyLimited,
                "{name}"
            );
            // Async: two calls hold the slots, a third is refused at once.
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let hold = || {
                let clock = clock.clone();
                p.run(move |_| {
                    let clock = clock.clone();
                    async move {
                        clock.sleep(MS * 100).await;
                        Ok::<_, std::io::Error>(())
                    }
                })
            };
            let (a, b, c) = rt.block_on(async {
                tokio::join!(
                    hold(),
                    hold(),
                    p.run(|_| async { Ok::<_, std::io::Error>(()) })
                )
            });
            a.unwrap();
            b.unwrap();
            assert_eq!(rejected(c), RejectionReason::ConcurrencyLimited, "{name}");
            assert_eq!(p.concurrency_limit().unwrap().in_flight, 0);
        }
    }
}

#[test]
fn an_async_call_waits_in_the_queue_for_a_slot() {
    let clock = VirtualClock::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    let p = Pipeline::builder("adaptive-queue")
        .adaptive_limit(fixed(1).queue(1, Duration::from_secs(10)))
        .clock(clock.clone())
        .on_event(events(&log))
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let b_started = Arc::new(Mutex::new(None));
    let (a, b, c) = rt.block_on(async {
        // `a` holds the slot for 1 s; `b` waits for it in the queue of
        // one; `c` finds the queue full.
        let a = p.run(|_| {
            let clock = clock.clone();
            async move {
                clock.sleep(Duration::from_secs(1)).await;
                Ok::<_, std::io::Error>(())
            }
        });
        let b = p.run(|_| {
            *b_started.lock().unwrap() = Some(clock.now());
            async { Ok::<_, std::io::Error>(()) }
        });
        let c = p.run(|_| async { Ok::<_, std::io::Error>(()) });
        tokio::join!(a, b, c)
    });
    a.unwrap();
    b.unwrap();
    assert_eq!(rejected(c), RejectionReason::ConcurrencyLimited);
    let seen = log.lock().unwrap().clone();
    // One wait, reported once when `b` took its place in the queue, for
    // the most it may wait.
    let deferred: Vec<_> = seen
        .iter()
        .filter(|k| matches!(k, EventKind::Deferred { .. }))
        .collect();
    assert_eq!(
        deferred,
        [&EventKind::Deferred {
            reason: RejectionReason::ConcurrencyLimited,
            wait: Duration::from_secs(10),
        }],
        "{seen:?}"
    );
    // `b` was handed the slot the instant `a` gave it back.
    assert_eq!(*b_started.lock().unwrap(), Some(Duration::from_secs(1)));
    assert_eq!(p.concurrency_limit().unwrap().in_flight, 0);
}

#[test]
fn a_partition_keeps_its_share_when_others_took_the_rest() {
    let p = Pipeline::builder("adaptive-shares")
        .adaptive_limit(fixed(10).partition("live", 0.9).partition("batch", 0.1))
        .build()
        .unwrap();
    // Batch fills the whole limit (spare capacity is anyone's), then one
    // more batch call is refused while live still gets its nine.
    fn nest(p: &Pipeline, key: &'static str, depth: u32, at_bottom: &mut dyn FnMut()) {
        if depth == 0 {
            at_bottom();
            return;
        }
        p.partition(key)
            .call(|_| {
                nest(p, key, depth - 1, at_bottom);
                Ok::<_, std::io::Error>(())
            })
            .unwrap();
    }
    let mut checked = false;
    nest(&p, "batch", 10, &mut || {
        assert_eq!(
            rejected(p.partition("batch").call(|_| Ok::<_, std::io::Error>(()))),
            RejectionReason::ConcurrencyLimited
        );
        assert_eq!(
            rejected(p.call(|_| Ok::<_, std::io::Error>(()))),
            RejectionReason::ConcurrencyLimited
        );
        nest(&p, "live", 9, &mut || {
            assert_eq!(p.concurrency_limit().unwrap().in_flight, 19);
            assert_eq!(
                rejected(p.partition("live").call(|_| Ok::<_, std::io::Error>(()))),
                RejectionReason::ConcurrencyLimited
            );
            checked = true;
        });
    });
    assert!(checked);
    assert_eq!(p.concurrency_limit().unwrap().in_flight, 0);
}

#[test]
fn failures_and_timeouts_are_drops_and_each_attempt_is_a_sample() {
    let clock = VirtualClock::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    let p = Pipeline::builder("adaptive-drops")
        .retry(Retry::constant(MS).max_attempts(3))
        .timeout(Timeout::from(5 * MS))
        .adaptive_limit(AdaptiveLimit::aimd().limits(5, 40, 40).update_interval(MS))
        .clock(clock.clone())
        .on_event(events(&log))
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    // Three attempts time out: each ends a window of one drop (1 ms apart).
    let r = rt.block_on(p.run(|_| {
        let clock = clock.clone();
        async move {
            Clock::sleep(&clock, 10 * MS).await;
            Ok::<_, std::io::Error>(())
        }
    }));
    assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
    let now = p.concurrency_limit().unwrap();
    assert_eq!(now.in_flight, 0);
    // 40 x 0.9 = 36, then 32 (after the first window closes).
    assert!(now.limit < 40, "{now:?}");
    let changes: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .filter_map(|k| match k {
            EventKind::LimitChanged { previous, limit } => Some((*previous, *limit)),
            _ => None,
        })
        .collect();
    assert!(!changes.is_empty());
    assert!(changes.iter().all(|(a, b)| b < a), "{changes:?}");
    // A failed sync call is a drop too.
    let before = p.concurrency_limit().unwrap().limit;
    for _ in 0..3 {
        clock.advance(2 * MS);
        let _ = p.call(|_| Err::<(), _>(std::io::Error::other("down")));
    }
    assert!(p.concurrency_limit().unwrap().limit < before);
}

#[test]
fn a_dropped_future_gives_its_slot_back() {
    let clock = VirtualClock::new();
    let p = Pipeline::builder("adaptive-dropped")
        .adaptive_limit(fixed(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let fut = p.run(|_| std::future::pending::<Result<(), std::io::Error>>());
        let mut fut = Box::pin(fut);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        assert_eq!(p.concurrency_limit().unwrap().in_flight, 1);
        drop(fut);
    });
    assert_eq!(p.concurrency_limit().unwrap().in_flight, 0);
    p.call(|_| Ok::<_, std::io::Error>(())).unwrap();
}

#[test]
fn declared_before_the_retry_or_with_bad_settings_it_is_refused_at_build() {
    let e = Pipeline::builder("adaptive-order")
        .adaptive_limit(AdaptiveLimit::vegas())
        .retry(Retry::constant(MS))
        .build()
        .unwrap_err();
    assert_eq!((e.policy, e.field), ("pipeline", "adaptive_limit"));
    assert!(e.rule.starts_with("is declared before `retry`"), "{e}");
    let e = Pipeline::builder("adaptive-bad")
        .adaptive_limit(AdaptiveLimit::gradient2().limits(10, 5, 100))
        .build()
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "adaptive_limit.initial_limit must be within [min_limit, max_limit] = [10, 100], got 5"
    );
}

#[cfg(feature = "serde")]
#[test]
fn configuration_files_declare_it_and_place_its_errors() {
    use seawall::config::{Config, Format};
    let toml = r#"
[pipelines.search]
retry = { delay = "10ms" }

[pipelines.search.adaptive_limit]
algorithm = "aimd"
limits_unused = 1
"#;
    let e = Config::parse(Format::Toml, toml).unwrap_err().to_string();
    assert!(e.contains("unknown field `limits_unused`"), "{e}");

    let toml = r#"
[pipelines.search]
retry = { delay = "10ms" }

[pipelines.search.adaptive_limit]
algorithm = "vegas"
min_limit = 10
max_limit = 5
partitions = { live = 0.9, batch = 0.1 }
"#;
    let e = Config::parse(Format::Toml, toml).unwrap_err().to_string();
    assert!(
        e.starts_with("<string>:8:13: ")
            && e.contains("adaptive_limit.max_limit must be >= min_limit (10), got 5"),
        "{e}"
    );

    let toml = "[pipelines.search.adaptive_limit]\npartitions = { live = 0.9, batch = 0.2 }\n";
    let e = Config::parse(Format::Toml, toml).unwrap_err().to_string();
    assert!(
        e.starts_with("<string>:2:14: ") && e.contains("shares that add up to 1, got 1.1"),
        "{e}"
    );

    let yaml = "pipelines:\n  search:\n    adaptive_limit:\n      algorithm: vegas\n      backoff_ratio: 0.8\n";
    let e = Config::parse(Format::Yaml, yaml).unwrap_err().to_string();
    assert!(
        e.starts_with("<string>:5:22: ")
            && e.contains("backoff_ratio applies only to aimd, not vegas"),
        "{e}"
    );

    let toml = r#"
[pipelines.search.adaptive_limit]
algorithm = "gradient2"
partitions = { live = 0.9, batch = 0.1 }
max_queued = 10
max_wait = "50ms"
"#;
    let config = Config::parse(Format::Toml, toml).unwrap();
    let from_file = config.builder("search").unwrap().build().unwrap();
    let in_code = Pipeline::builder("search")
        .adaptive_limit(
            AdaptiveLimit::gradient2()
                .partition("live", 0.9)
                .partition("batch", 0.1)
                .queue(10, 50 * MS),
        )
        .build()
        .unwrap();
    assert_eq!(format!("{from_file:?}"), format!("{in_code:?}"));
    from_file
        .partition("live")
        .call(|_| Ok::<_, std::io::Error>(()))
        .unwrap();
    assert_eq!(from_file.concurrency_limit().unwrap().limit, 20);
}

/// Rounds of `n` concurrent attempts of 10 ms each; returns how many of
/// each round were refused, round by round.
fn rounds(p: &Pipeline, clock: &VirtualClock, n: usize, count: usize) -> Vec<usize> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    (0..count)
        .map(|_| {
            rt.block_on(async {
                let calls = (0..n).map(|_| {
                    let clock = clock.clone();
                    p.run(move |_| {
                        let clock = clock.clone();
                        async move {
                            clock.sleep(10 * MS).await;
                            Ok::<_, std::io::Error>(())
                        }
                    })
                });
                let mut refused = 0;
                for r in futures_join(calls.collect()).await {
                    if r.is_err() {
                        refused += 1;
                    }
                }
                refused
            })
        })
        .collect()
}

/// Polls the futures together on the current task.
async fn futures_join<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (f, out) in futures.iter_mut().zip(outs.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *out = Some(v),
                    std::task::Poll::Pending => done = false,
                }
            }
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    outs.into_iter().map(Option::unwrap).collect()
}

#[test]
fn a_light_load_at_the_minimum_does_not_measure_the_baseline_again() {
    for start in [Duration::ZERO, Duration::from_secs(1_000_000)] {
        // Gradient2's defaults: the limit starts at its minimum, 20. Nine
        // attempts at once, as fast as without load, never move it (fewer
        // than half the limit in flight): once the baseline is measured,
        // none is refused until `min_rtt_interval` (60 s) has passed.
        let clock = VirtualClock::starting_at(start);
        let p = Pipeline::builder("adaptive-light-load")
            .adaptive_limit(AdaptiveLimit::gradient2())
            .clock(clock.clone())
            .build()
            .unwrap();
        let first = rounds(&p, &clock, 9, 20);
        // Measured at 3 at once (50 samples), then admitted up to 20.
        assert_eq!(first[0], 6);
        assert_eq!(first[19], 0, "{first:?}");
        let state = p.concurrency_limit().unwrap();
        assert!(!state.measuring, "{state:?}");
        // 20 s of such rounds, 200 update windows at `min_limit`.
        let later = rounds(&p, &clock, 9, 2_000);
        assert!(
            later.iter().all(|&r| r == 0),
            "{} refused",
            later.iter().sum::<usize>()
        );
        let state = p.concurrency_limit().unwrap();
        assert_eq!(
            (state.limit, state.admitted, state.measuring),
            (20, 20, false)
        );
        assert_eq!(state.baseline, Some(10 * MS));
    }
}
