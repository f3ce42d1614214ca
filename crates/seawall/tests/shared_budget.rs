//! The retry budget kept in the store (`RetryBudget::shared`) on the memory
//! store: the store against the budget's model (`seawall::model::budget`),
//! the pipeline against the process budget (the same rule, so the same
//! answers call by call), many threads on one bucket within the exact
//! bound, clones and pipelines of one name sharing it, and the settings
//! refused at `build()`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use seawall::event::GiveUpReason;
use seawall::model::budget::{self, strategy};
use seawall::store::StateStore;
use seawall::testing::VirtualClock;
use seawall::*;

const STARTS: [Duration; 2] = [Duration::ZERO, Duration::from_secs(1_000_000)];

#[derive(Debug, Clone, PartialEq)]
struct Boom;
impl std::fmt::Display for Boom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("boom")
    }
}
impl std::error::Error for Boom {}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn memory_store_agrees_with_the_budget_model() {
    for start in STARTS {
        let mut runner = TestRunner::new(Config {
            cases: 256,
            failure_persistence: None,
            ..Config::default()
        });
        runner
            .run(&(strategy::setup(), strategy::ops(80)), |(setup, ops)| {
                let store = MemoryStore::new();
                let state = store.bind(&setup.spec("budget-model")).unwrap();
                let r = budget::check(&setup, &*state, &ops, start);
                prop_assert!(r.is_ok(), "{}", r.unwrap_err());
                Ok(())
            })
            .unwrap();
    }
}

/// A pipeline on `store` (a fresh memory store unless given) whose
/// attempts all fail: up to 4 retries each, no wait.
fn failing(
    name: &str,
    budget: RetryBudget,
    clock: &VirtualClock,
    events: Option<Arc<Mutex<Vec<EventKind>>>>,
) -> Pipeline {
    let mut b = Pipeline::builder(name)
        .store(MemoryStore::new())
        .clock(clock.clone())
        .retry(
            Retry::constant(Duration::from_millis(5))
                .max_attempts(5)
                .budget(budget),
        );
    if let Some(events) = events {
        b = b.on_event(move |e: &Event<'_>| events.lock().unwrap().push(e.kind.clone()));
    }
    b.build().unwrap()
}

/// What a call came to: its attempts and its error's kind.
fn outcome(attempts: u32, r: Result<(), Error<Boom>>) -> (u32, String) {
    let kind = match r {
        Ok(()) => "ok".to_owned(),
        Err(Error::Rejected(r)) => r.reason.to_string(),
        Err(Error::RetryExhausted { attempts, .. }) => format!("exhausted after {attempts}"),
        Err(e) => format!("{e}"),
    };
    (attempts, kind)
}

/// Runs `calls` calls (sync or async), every `fail_every`-th one failing
/// at every attempt and the others succeeding at once.
fn run_calls(p: &Pipeline, calls: u32, fail_every: u32, sync: bool) -> Vec<(u32, String)> {
    (0..calls)
        .map(|i| {
            let n = AtomicU32::new(0);
            let fails = i % fail_every == 0;
            let op = || {
                n.fetch_add(1, Ordering::Relaxed);
                if fails {
                    Err(Boom)
                } else {
                    Ok(())
                }
            };
            let r = if sync {
                p.call(|_| op())
            } else {
                block_on(p.run(|_| {
                    let r = op();
                    async move { r }
                }))
            };
            outcome(n.load(Ordering::Relaxed), r)
        })
        .collect()
}

#[test]
fn a_shared_budget_answers_every_call_as_the_process_budget_does() {
    for start in STARTS {
        for sync in [true, false] {
            for listen in [false, true] {
                for (ratio, tokens, fail_every) in [(0.1, 3, 2), (0.5, 1, 1), (0.25, 2, 3)] {
                    let clock = VirtualClock::starting_at(start);
                    let events = listen.then(Arc::default);
                    let local = failing("local", RetryBudget::new(ratio, tokens), &clock, None);
                    let shared = failing(
                        "shared",
                        RetryBudget::new(ratio, tokens).shared(),
                        &clock,
                        events.clone(),
                    );
                    let want = run_calls(&local, 60, fail_every, sync);
                    let got = run_calls(&shared, 60, fail_every, sync);
                    assert_eq!(got, want, "start {start:?} sync {sync} listen {listen}");
                    assert!(
                        want.iter().any(|(_, k)| k == "retry_budget_exhausted"),
                        "the budget ran dry"
                    );
                    if let Some(events) = events {
                        let gave_up = events
                            .lock()
                            .unwrap()
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
                        let refused = want
                            .iter()
                            .filter(|(_, k)| k == "retry_budget_exhausted")
                            .count();
                        assert_eq!(gave_up, refused);
                    }
                }
            }
        }
    }
}

#[test]
fn pipelines_of_one_name_on_one_store_share_the_bucket() {
    let store = MemoryStore::new();
    let clock = VirtualClock::new();
    let build = |budget: RetryBudget| {
        Pipeline::builder("users-api")
            .store(store.clone())
            .clock(clock.clone())
            .retry(
                Retry::constant(Duration::ZERO)
                    .max_attempts(3)
                    .budget(budget),
            )
            .build()
            .unwrap()
    };
    // Two budgets built apart: kept in the store, they are one bucket.
    let a = build(RetryBudget::new(0.5, 2).shared());
    let b = build(RetryBudget::new(0.5, 2).shared());
    let fail = |p: &Pipeline| {
        let n = AtomicU32::new(0);
        let _ = p.call(|_| -> Result<(), Boom> {
            n.fetch_add(1, Ordering::Relaxed);
            Err(Boom)
        });
        n.load(Ordering::Relaxed) - 1
    };
    // Two tokens: a's call takes both retries; b's call earns half a token
    // and gets no retry; the next call of a earns the other half.
    assert_eq!(fail(&a), 2);
    assert_eq!(fail(&b), 0);
    assert_eq!(fail(&a), 1);
    // Process budgets built apart are two buckets.
    let c = build(RetryBudget::new(0.5, 2));
    let d = build(RetryBudget::new(0.5, 2));
    assert_eq!((fail(&c), fail(&d)), (2, 2));
}

#[test]
fn many_threads_retry_within_ratio_times_calls_plus_max_tokens() {
    const THREADS: u32 = 8;
    const CALLS: u32 = 300;
    let store = MemoryStore::new();
    let p = Pipeline::builder("threads")
        .store(store)
        .retry(
            Retry::constant(Duration::ZERO)
                .max_attempts(4)
                .budget(RetryBudget::new(0.05, 7).shared()),
        )
        .build()
        .unwrap();
    let attempts = Arc::new(AtomicU32::new(0));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (p, attempts) = (p.clone(), attempts.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                for _ in 0..CALLS {
                    let attempts = &attempts;
                    let op = || {
                        attempts.fetch_add(1, Ordering::Relaxed);
                        Err::<(), _>(Boom)
                    };
                    let _ = if t % 2 == 0 {
                        p.call(|_| op())
                    } else {
                        rt.block_on(p.run(|_| {
                            let r = op();
                            async move { r }
                        }))
                    };
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let calls = THREADS * CALLS;
    let retries = attempts.load(Ordering::Relaxed) - calls;
    // 7000 thousandths to start, 50 per call: 7000 + 2400 x 50 = 127000,
    // 127 withdrawals at most. Every call fails, so the first ones take
    // the 7 tokens the bucket starts with, and the bucket keeps less than
    // a token at the end: at least 127 - 1 - 7 (deposits lost to a full
    // bucket happen only before the first withdrawal drains it).
    assert!(retries <= 127, "{retries} retries");
    assert!(retries >= 119, "{retries} retries");
}

#[test]
fn a_hedging_budget_cannot_be_shared() {
    let e = Pipeline::builder("hedged")
        .hedging(
            Hedging::latency(Duration::from_millis(10)).budget(RetryBudget::new(0.1, 5).shared()),
        )
        .build()
        .unwrap_err();
    assert_eq!((e.policy, e.field), ("hedging", "budget.shared"));
    let e = Pipeline::builder("retried")
        .retry(Retry::constant(Duration::ZERO).budget(RetryBudget::new(0.0, 5).shared()))
        .build()
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "retry.budget.ratio must be in (0, 1000], got 0"
    );
}

/// A ratio that would earn nothing per call (a call earns its ratio in
/// whole thousandths of a token, rounded) is refused at `build()` with the
/// bound and why, kept in the process or in the store, for a retry or a
/// hedging; from the bound up, the bucket refills as the ratio says.
#[test]
fn a_ratio_below_a_thousandth_is_refused() {
    let why = "must be >= 0.001, got 0.0004: a call earns its ratio in whole thousandths of a token (rounded), so a smaller ratio would earn none or more than asked";
    for budget in [
        RetryBudget::new(0.0004, 1),
        RetryBudget::new(0.0004, 1).shared(),
    ] {
        let e = Pipeline::builder("tiny")
            .retry(
                Retry::constant(Duration::ZERO)
                    .max_attempts(2)
                    .budget(budget),
            )
            .build()
            .map(|_| ())
            .unwrap_err();
        assert_eq!(e.to_string(), format!("retry.budget.ratio {why}"));
    }
    let e = Pipeline::builder("tiny")
        .hedging(Hedging::latency(Duration::from_millis(10)).budget(RetryBudget::new(0.0004, 1)))
        .build()
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.to_string(), format!("hedging.budget.ratio {why}"));

    // At the bound: the one token spent comes back after 1000 calls,
    // in the process and in the store alike.
    for budget in [
        RetryBudget::new(0.001, 1),
        RetryBudget::new(0.001, 1).shared(),
    ] {
        let p = Pipeline::builder(format!("thousandth-{}", budget.is_shared()))
            .retry(
                Retry::constant(Duration::ZERO)
                    .max_attempts(2)
                    .budget(budget),
            )
            .build()
            .unwrap();
        let failing = || {
            let n = AtomicU32::new(0);
            let r = p.call(|_| {
                n.fetch_add(1, Ordering::Relaxed);
                Err::<(), _>(Boom)
            });
            outcome(n.load(Ordering::Relaxed), r)
        };
        let retried = (2, "exhausted after 2".to_owned());
        assert_eq!(failing(), retried);
        for _ in 0..998 {
            p.call(|_| Ok::<_, Boom>(())).unwrap();
        }
        // 998 deposits and this call's: 0.999 of a token.
        assert_eq!(failing(), (1, "retry_budget_exhausted".to_owned()));
        // One more: a whole token.
        assert_eq!(failing(), retried);
    }
}

/// A policy written in code around the whole call that makes three passes
/// while they fail.
struct ThreePasses;

impl seawall::custom::Policy<(), Boom> for ThreePasses {
    fn name(&self) -> &str {
        "three-passes"
    }

    fn position(&self) -> seawall::custom::Position {
        seawall::custom::Position::Call
    }

    fn call<'a>(
        &'a self,
        _ctx: Context,
        next: seawall::custom::Next<'a, (), Boom>,
    ) -> seawall::custom::PolicyFuture<'a, (), Boom> {
        Box::pin(async move {
            let mut result = next.run().await;
            for _ in 1..3 {
                if result.is_ok() {
                    break;
                }
                result = next.run().await;
            }
            result
        })
    }
}

#[test]
fn passes_of_a_policy_around_the_call_deposit_once_per_call() {
    for sync in [true, false] {
        let build = |name: &str, budget: RetryBudget| {
            Pipeline::builder(name)
                .store(MemoryStore::new())
                .clock(VirtualClock::new())
                .policy(ThreePasses)
                .retry(
                    Retry::constant(Duration::ZERO)
                        .max_attempts(2)
                        .budget(budget),
                )
                .build()
                .unwrap()
        };
        let local = build("local-passes", RetryBudget::new(0.5, 1));
        let shared = build("shared-passes", RetryBudget::new(0.5, 1).shared());
        // Every call fails: three passes of up to two attempts each.
        macro_rules! calls {
            ($p:expr) => {
                (0..12)
                    .map(|_| {
                        let n = AtomicU32::new(0);
                        let op = || {
                            n.fetch_add(1, Ordering::Relaxed);
                            Err::<(), _>(Boom)
                        };
                        let r = if sync {
                            $p.call(|_| op())
                        } else {
                            block_on($p.run(|_| {
                                let r = op();
                                async move { r }
                            }))
                        };
                        outcome(n.load(Ordering::Relaxed), r)
                    })
                    .collect::<Vec<_>>()
            };
        }
        let want = calls!(local);
        let got = calls!(shared);
        assert_eq!(got, want, "sync {sync}");
        // The budget earns half a token per call, not per pass: 1 token to
        // start (the first call's deposit finds it full) plus 11 halves,
        // 6 retries in all (3 per call if every pass deposited).
        let attempts: u32 = got.iter().map(|(n, _)| n).sum();
        assert_eq!(attempts, 12 * 3 + 6, "sync {sync}");
    }
}
