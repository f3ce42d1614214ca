//! Hedging: the modes, the first acceptable answer winning and the losers
//! dropped, the budget, the hook, and the composition with timeouts, the
//! bulkhead, the circuit breaker, chaos and the fallback. Every case runs
//! on the virtual clock started at 0 and at 10^6 s, with and without a
//! listener (hedging is async only; the sync `call` is refused).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seawall::chaos::Chaos;
use seawall::hedge::HedgeDelay;
use seawall::store::MemoryStore;
use seawall::testing::{SequenceRandom, VirtualClock};
use seawall::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[derive(Debug, Clone, PartialEq)]
struct Boom(u32);
impl std::fmt::Display for Boom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "boom {}", self.0)
    }
}
impl std::error::Error for Boom {}

/// Where a test runs: the clock's start and whether someone listens.
#[derive(Debug, Clone, Copy)]
struct Mode {
    start: Duration,
    listen: bool,
}

fn modes() -> Vec<Mode> {
    let mut v = Vec::new();
    for start in [Duration::ZERO, Duration::from_secs(1_000_000)] {
        for listen in [false, true] {
            v.push(Mode { start, listen });
        }
    }
    v
}

type Events = Arc<Mutex<Vec<EventKind>>>;

impl Mode {
    /// A fresh store, a virtual clock at the mode's start, a listener if
    /// asked.
    fn builder(self) -> (PipelineBuilder, VirtualClock, Events) {
        let clock = VirtualClock::starting_at(self.start);
        let events: Events = Arc::default();
        let mut b = Pipeline::builder("hedging")
            .store(MemoryStore::new())
            .clock(clock.clone());
        if self.listen {
            let e = events.clone();
            b = b.on_event(move |ev: &Event<'_>| e.lock().unwrap().push(ev.kind.clone()));
        }
        (b, clock, events)
    }

    /// Time since the clock's start.
    fn elapsed(self, clock: &VirtualClock) -> Duration {
        clock.now() - self.start
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

/// What an attempt does: answer after `after` on the pipeline's clock
/// (never, for `None`) with `result`.
#[derive(Debug, Clone)]
struct Plan {
    after: Option<Duration>,
    result: Result<u32, Boom>,
}

fn ok_after(d: u64, v: u32) -> Plan {
    Plan {
        after: Some(ms(d)),
        result: Ok(v),
    }
}

fn fail_after(d: u64, e: u32) -> Plan {
    Plan {
        after: Some(ms(d)),
        result: Err(Boom(e)),
    }
}

fn never() -> Plan {
    Plan {
        after: None,
        result: Ok(0),
    }
}

/// What each attempt (by its context's number) did: when it started, and
/// whether it answered or was dropped before.
#[derive(Debug, Default)]
struct Probe {
    started: Mutex<Vec<(u32, Duration)>>,
    answered: Mutex<Vec<u32>>,
    dropped: Mutex<Vec<u32>>,
    deadlines: Mutex<Vec<(u32, Option<Duration>)>>,
}

/// Sets its attempt's drop flag unless the attempt answered.
struct DropFlag {
    attempt: u32,
    probe: Arc<Probe>,
    answered: bool,
}

impl Drop for DropFlag {
    fn drop(&mut self) {
        if !self.answered {
            self.probe.dropped.lock().unwrap().push(self.attempt);
        }
    }
}

impl Probe {
    fn started(&self) -> Vec<u32> {
        self.started.lock().unwrap().iter().map(|s| s.0).collect()
    }
    fn started_at(&self) -> Vec<(u32, Duration)> {
        self.started.lock().unwrap().clone()
    }
    fn dropped(&self) -> Vec<u32> {
        let mut d = self.dropped.lock().unwrap().clone();
        d.sort_unstable();
        d
    }
    fn answered(&self) -> Vec<u32> {
        self.answered.lock().unwrap().clone()
    }
}

/// Runs one call whose attempt `n` follows `plans[n - 1]`.
async fn call_with<K>(
    p: &Pipeline<K>,
    clock: &VirtualClock,
    start: Duration,
    probe: &Arc<Probe>,
    plans: &[Plan],
) -> Result<u32, Error<Boom>>
where
    K: seawall::pipeline::Handles<u32, Boom>,
{
    p.run(|ctx: Context| {
        let attempt = ctx.attempt();
        let plan = plans[attempt as usize - 1].clone();
        let clock = clock.clone();
        let probe = probe.clone();
        probe
            .started
            .lock()
            .unwrap()
            .push((attempt, clock.now() - start));
        probe
            .deadlines
            .lock()
            .unwrap()
            .push((attempt, ctx.deadline().map(|d| d - start)));
        async move {
            let mut flag = DropFlag {
                attempt,
                probe: probe.clone(),
                answered: false,
            };
            match plan.after {
                Some(d) => Clock::sleep(&clock, d).await,
                None => std::future::pending::<()>().await,
            }
            flag.answered = true;
            probe.answered.lock().unwrap().push(attempt);
            plan.result
        }
    })
    .await
}

fn hedges(events: &Events) -> Vec<(u32, HedgeTrigger)> {
    events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            EventKind::HedgeStarted { attempt, trigger } => Some((*attempt, *trigger)),
            _ => None,
        })
        .collect()
}

#[test]
fn latency_mode_hedges_a_slow_attempt_and_the_first_answer_wins() {
    for mode in modes() {
        let (b, clock, events) = mode.builder();
        let p = b
            .hedging(Hedging::latency(ms(30)).max_hedged_attempts(2))
            .build()
            .unwrap();
        let probe = Arc::new(Probe::default());
        let plans = [ok_after(100, 1), ok_after(10, 2), ok_after(1, 3)];
        let r = block_on(call_with(&p, &clock, mode.start, &probe, &plans));
        assert_eq!(r.unwrap(), 2, "{mode:?}");
        // The hedge started at 30 ms and answered at 40 ms, before the
        // third attempt was due (60 ms); the first attempt was dropped.
        assert_eq!(probe.started_at(), [(1, ms(0)), (2, ms(30))], "{mode:?}");
        assert_eq!(mode.elapsed(&clock), ms(40));
        assert_eq!(probe.answered(), [2]);
        assert_eq!(probe.dropped(), [1]);
        if mode.listen {
            assert_eq!(hedges(&events), [(2, HedgeTrigger::Delay)]);
            let finished = events.lock().unwrap().iter().find_map(|e| match e {
                EventKind::CallFinished {
                    attempts, outcome, ..
                } => Some((*attempts, *outcome)),
                _ => None,
            });
            assert_eq!(finished, Some((2, CallOutcome::Success)));
        }
    }
}

#[test]
fn a_fast_answer_starts_no_hedge() {
    for mode in modes() {
        let (b, clock, events) = mode.builder();
        let p = b.hedging(Hedging::latency(ms(30))).build().unwrap();
        let probe = Arc::new(Probe::default());
        let r = block_on(call_with(
            &p,
            &clock,
            mode.start,
            &probe,
            &[ok_after(29, 7)],
        ));
        assert_eq!(r.unwrap(), 7);
        assert_eq!(probe.started(), [1]);
        assert_eq!(mode.elapsed(&clock), ms(29));
        assert!(hedges(&events).is_empty());
        assert!(probe.dropped().is_empty());
    }
}

#[test]
fn parallel_mode_starts_every_attempt_at_once_each_with_its_number() {
    for mode in modes() {
        let (b, clock, events) = mode.builder();
        let p = b
            .hedging(Hedging::parallel().max_hedged_attempts(3))
            .build()
            .unwrap();
        let probe = Arc::new(Probe::default());
        let plans = [
            ok_after(50, 1),
            ok_after(40, 2),
            ok_after(5, 3),
            ok_after(30, 4),
        ];
        let r = block_on(call_with(&p, &clock, mode.start, &probe, &plans));
        assert_eq!(r.unwrap(), 3);
        assert_eq!(
            probe.started_at(),
            [(1, ms(0)), (2, ms(0)), (3, ms(0)), (4, ms(0))]
        );
        assert_eq!(mode.elapsed(&clock), ms(5));
        assert_eq!(probe.dropped(), [1, 2, 4]);
        if mode.listen {
            assert_eq!(
                hedges(&events),
                [
                    (2, HedgeTrigger::Delay),
                    (3, HedgeTrigger::Delay),
                    (4, HedgeTrigger::Delay)
                ]
            );
        }
    }
}

#[test]
fn fallback_mode_starts_the_next_attempt_only_on_a_failure() {
    for mode in modes() {
        let (b, clock, events) = mode.builder();
        let p = b
            .hedging(Hedging::fallback().max_hedged_attempts(2))
            .build()
            .unwrap();
        let probe = Arc::new(Probe::default());
        let plans = [fail_after(100, 1), fail_after(10, 2), ok_after(10, 3)];
        let r = block_on(call_with(&p, &clock, mode.start, &probe, &plans));
        assert_eq!(r.unwrap(), 3);
        assert_eq!(probe.started_at(), [(1, ms(0)), (2, ms(100)), (3, ms(110))]);
        assert_eq!(mode.elapsed(&clock), ms(120));
        assert!(probe.dropped().is_empty());
        if mode.listen {
            assert_eq!(
                hedges(&events),
                [(2, HedgeTrigger::Failure), (3, HedgeTrigger::Failure)]
            );
        }

        // An attempt that never answers is never hedged in this mode: the
        // call's timeout ends it.
        let (b, clock, _) = mode.builder();
        let p = b
            .timeout(ms(500))
            .hedging(Hedging::fallback())
            .build()
            .unwrap();
        let probe = Arc::new(Probe::default());
        let r = block_on(call_with(
            &p,
            &clock,
            mode.start,
            &probe,
            &[never(), never()],
        ));
        assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
        assert_eq!(probe.started(), [1]);
        assert_eq!(probe.dropped(), [1]);
        assert_eq!(mode.elapsed(&clock), ms(500));
    }
}

#[test]
fn a_failure_starts_the_next_hedge_at_once_in_latency_mode() {
    for mode in modes() {
        let (b, clock, events) = mode.builder();
        let p = b
            .hedging(Hedging::latency(ms(100)).max_hedged_attempts(2))
            .build()
            .unwrap();
        let probe = Arc::new(Probe::default());
        let plans = [fail_after(5, 1), ok_after(500, 2), ok_after(1, 3)];
        let r = block_on(call_with(&p, &clock, mode.start, &probe, &plans));
        // Attempt 2 started at 5 ms (the failure), attempt 3 at 105 ms
        // (attempt 2 had not answered within the delay) and won.
        assert_eq!(r.unwrap(), 3);
        assert_eq!(probe.started_at(), [(1, ms(0)), (2, ms(5)), (3, ms(105))]);
        assert_eq!(probe.dropped(), [2]);
        if mode.listen {
            assert_eq!(
                hedges(&events),
                [(2, HedgeTrigger::Failure), (3, HedgeTrigger::Delay)]
            );
        }
    }
}

#[test]
fn dynamic_mode_asks_the_generator_for_each_hedge() {
    for mode in modes() {
        let (b, clock, _) = mode.builder();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let a = asked.clone();
        let p = b
            .hedging(
                Hedging::dynamic(move |attempt| {
                    a.lock().unwrap().push(attempt);
                    match attempt {
                        2 => HedgeDelay::After(ms(20)),
                        _ => HedgeDelay::OnFailure,
                    }
                })
                .max_hedged_attempts(2),
            )
            .build()
            .unwrap();
        let probe = Arc::new(Probe::default());
        let plans = [ok_after(100, 1), fail_after(50, 2), ok_after(10, 3)];
        let r = block_on(call_with(&p, &clock, mode.start, &probe, &plans));
        // Attempt 2 after 20 ms; attempt 3 only when attempt 2 failed (at
        // 70 ms), answering at 80 ms, before attempt 1 (100 ms).
        assert_eq!(r.unwrap(), 3);
        assert_eq!(probe.started_at(), [(1, ms(0)), (2, ms(20)), (3, ms(70))]);
        assert_eq!(probe.dropped(), [1]);
        assert_eq!(mode.elapsed(&clock), ms(80));
        // The generator is asked for the attempt that would come next.
        assert_eq!(asked.lock().unwrap().first(), Some(&2));
        assert!(asked.lock().unwrap().contains(&3));
    }
}

#[test]
fn when_every_attempt_fails_the_last_error_is_the_calls() {
    for mode in modes() {
        let (b, clock, _) = mode.builder();
        let p = b
            .hedging(Hedging::latency(ms(10)).max_hedged_attempts(2))
            .build()
            .unwrap();
        let probe = Arc::new(Probe::default());
        let plans = [fail_after(30, 1), fail_after(5, 2), fail_after(40, 3)];
        let r = block_on(call_with(&p, &clock, mode.start, &probe, &plans));
        // Attempt 2 fails at 15 ms and starts attempt 3 at once; attempt 1
        // fails at 30 ms, attempt 3 at 55 ms: the last.
        match r {
            Err(Error::RetryExhausted { attempts, last }) => {
                assert_eq!((attempts, last), (3, Boom(3)), "{mode:?}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(mode.elapsed(&clock), ms(55));
        assert!(probe.dropped().is_empty());
    }
}

#[test]
fn an_error_hedging_does_not_answer_wins_at_once() {
    for mode in modes() {
        // `hedge_if` declines Boom(2): it is the call's answer, the other
        // attempts are dropped.
        let (b, clock, _) = mode.builder();
        let p = b
            .hedging(Hedging::parallel().max_hedged_attempts(2))
            .hedge_if(|e: &Boom| e.0 != 2)
            .build()
            .unwrap();
        let probe = Arc::new(Probe::default());
        let plans = [fail_after(5, 1), fail_after(10, 2), ok_after(30, 3)];
        let r = block_on(call_with(&p, &clock, mode.start, &probe, &plans));
        assert!(matches!(r, Err(Error::Operation(Boom(2)))), "{r:?}");
        assert_eq!(probe.dropped(), [3]);
        assert_eq!(mode.elapsed(&clock), ms(10));

        // The classifier's verdict decides without `hedge_if`.
        let (b, clock, _) = mode.builder();
        let p = b
            .hedging(Hedging::parallel().max_hedged_attempts(1))
            .classify(|e: &Boom| {
                if e.0 == 1 {
                    Verdict::abort()
                } else {
                    Verdict::retry()
                }
            })
            .build()
            .unwrap();
        let probe = Arc::new(Probe::default());
        let plans = [fail_after(5, 1), ok_after(10, 2)];
        let r = block_on(call_with(&p, &clock, mode.start, &probe, &plans));
        assert!(matches!(r, Err(Error::Operation(Boom(1)))), "{r:?}");
        assert_eq!(probe.dropped(), [2]);
    }
}

#[test]
fn each_hedged_attempt_has_its_own_attempt_timeout_inside_the_calls() {
    for mode in modes() {
        let (b, clock, _) = mode.builder();
        let p = b
            .timeout(ms(1000))
            .hedging(Hedging::latency(ms(30)).max_hedged_attempts(2))
            .timeout(ms(50))
            .build()
            .unwrap();
        let probe = Arc::new(Probe::default());
        // Attempt 1 times out at 50 ms (a failure: attempt 3 starts then),
        // attempt 2 (started at 30 ms) at 80 ms, attempt 3 answers.
        let plans = [never(), never(), ok_after(40, 3)];
        let r = block_on(call_with(&p, &clock, mode.start, &probe, &plans));
        assert_eq!(r.unwrap(), 3);
        let deadlines = probe.deadlines.lock().unwrap().clone();
        assert_eq!(
            deadlines,
            [(1, Some(ms(50))), (2, Some(ms(80))), (3, Some(ms(100)))]
        );
        assert_eq!(probe.started_at(), [(1, ms(0)), (2, ms(30)), (3, ms(50))]);
        assert_eq!(mode.elapsed(&clock), ms(90));
        assert_eq!(probe.dropped(), [1, 2]);

        // The call's timeout bounds every attempt.
        let (b, clock, _) = mode.builder();
        let p = b
            .timeout(ms(70))
            .hedging(Hedging::latency(ms(30)).max_hedged_attempts(5))
            .build()
            .unwrap();
        let probe = Arc::new(Probe::default());
        let r = block_on(call_with(&p, &clock, mode.start, &probe, &vec![never(); 6]));
        match r {
            Err(Error::Timeout(t)) => assert_eq!(t.scope, error::TimeoutScope::Overall),
            other => panic!("{other:?}"),
        }
        assert_eq!(probe.started(), [1, 2, 3]);
        assert_eq!(probe.dropped(), [1, 2, 3]);
        assert_eq!(mode.elapsed(&clock), ms(70));
    }
}

#[test]
fn the_budget_limits_hedges_to_a_share_of_calls_across_clones() {
    for mode in modes() {
        let (b, clock, events) = mode.builder();
        // One token to start with, half a token per call.
        let p = b
            .hedging(
                Hedging::latency(ms(10))
                    .max_hedged_attempts(1)
                    .budget(RetryBudget::new(0.5, 1)),
            )
            .build()
            .unwrap();
        let clone = p.clone();
        let run = |p: &Pipeline, probe: &Arc<Probe>| {
            block_on(call_with(
                p,
                &clock,
                mode.start,
                probe,
                &[ok_after(30, 1), ok_after(5, 2)],
            ))
        };
        let probe = Arc::new(Probe::default());
        // The first call hedges (the token is spent).
        assert_eq!(run(&p, &probe).unwrap(), 2);
        // The clone shares the budget: half a token, no hedge.
        let probe = Arc::new(Probe::default());
        assert_eq!(run(&clone, &probe).unwrap(), 1);
        assert_eq!(probe.started(), [1]);
        // One more call earns the other half: it hedges.
        let probe = Arc::new(Probe::default());
        assert_eq!(run(&p, &probe).unwrap(), 2);
        if mode.listen {
            let exhausted: Vec<_> = events
                .lock()
                .unwrap()
                .iter()
                .filter(|e| matches!(e, EventKind::HedgeBudgetExhausted { attempt: 2 }))
                .cloned()
                .collect();
            assert_eq!(exhausted.len(), 1);
            assert_eq!(hedges(&events).len(), 2);
        }
    }
}

#[test]
fn the_hook_sees_each_hedged_attempts_context() {
    for mode in modes() {
        let (b, clock, _) = mode.builder();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let start = mode.start;
        let p = b
            .timeout(ms(100))
            .hedging(
                Hedging::latency(ms(10))
                    .max_hedged_attempts(2)
                    .on_hedging(move |ctx| {
                        s.lock()
                            .unwrap()
                            .push((ctx.attempt(), ctx.deadline().map(|d| d - start)))
                    }),
            )
            .build()
            .unwrap();
        let probe = Arc::new(Probe::default());
        let plans = [ok_after(50, 1), ok_after(50, 2), ok_after(5, 3)];
        assert_eq!(
            block_on(call_with(&p, &clock, mode.start, &probe, &plans)).unwrap(),
            3
        );
        assert_eq!(
            *seen.lock().unwrap(),
            [(2, Some(ms(100))), (3, Some(ms(100)))]
        );
    }
}

#[test]
fn each_hedged_attempt_takes_a_bulkhead_slot_declared_after_hedging() {
    for mode in modes() {
        let (b, clock, events) = mode.builder();
        let p = b
            .hedging(Hedging::parallel().max_hedged_attempts(2))
            .bulkhead(Bulkhead::new(2))
            .build()
            .unwrap();
        let probe = Arc::new(Probe::default());
        let in_flight = Arc::new(Mutex::new(Vec::new()));
        let plans = [ok_after(20, 1), ok_after(10, 2), ok_after(1, 3)];
        let r = block_on(async {
            let watch = {
                let p = p.clone();
                let clock = clock.clone();
                let in_flight = in_flight.clone();
                async move {
                    Clock::sleep(&clock, ms(5)).await;
                    in_flight.lock().unwrap().push(p.in_flight().unwrap());
                }
            };
            let (r, ()) = tokio::join!(call_with(&p, &clock, mode.start, &probe, &plans), watch);
            r
        });
        // Two slots: the third attempt was refused and did not start; the
        // second answered first.
        assert_eq!(r.unwrap(), 2);
        assert_eq!(probe.started(), [1, 2]);
        assert_eq!(*in_flight.lock().unwrap(), [2]);
        // The loser gave its slot back.
        assert_eq!(p.in_flight().unwrap(), 0);
        assert_eq!(probe.dropped(), [1]);
        if mode.listen {
            assert!(events.lock().unwrap().iter().any(|e| matches!(
                e,
                EventKind::Rejected {
                    reason: RejectionReason::BulkheadFull,
                    ..
                }
            )));
        }

        // Declared before hedging, the call holds one slot for all its
        // attempts.
        let (b, clock, _) = mode.builder();
        let p = b
            .bulkhead(Bulkhead::new(1))
            .hedging(Hedging::parallel().max_hedged_attempts(2))
            .build()
            .unwrap();
        let probe = Arc::new(Probe::default());
        let r = block_on(call_with(&p, &clock, mode.start, &probe, &plans));
        assert_eq!(r.unwrap(), 3);
        assert_eq!(probe.started(), [1, 2, 3]);
        assert_eq!(p.in_flight().unwrap(), 0);
    }
}

#[test]
fn the_breaker_after_hedging_records_each_attempt_that_ended() {
    for mode in modes() {
        let (b, clock, _) = mode.builder();
        let p = b
            .hedging(Hedging::latency(ms(10)).max_hedged_attempts(2))
            .circuit_breaker(
                CircuitBreaker::failure_rate(0.9)
                    .count_window(100)
                    .minimum_calls(100),
            )
            .build()
            .unwrap();
        let probe = Arc::new(Probe::default());
        // Two failures (each starting the next attempt) and a success end;
        // nothing is dropped.
        let plans = [fail_after(5, 1), fail_after(3, 2), ok_after(1, 3)];
        assert_eq!(
            block_on(call_with(&p, &clock, mode.start, &probe, &plans)).unwrap(),
            3
        );
        let m = p.circuit_metrics().unwrap();
        assert_eq!((m.calls, m.failures), (3, 2), "{mode:?}");
        // A loser dropped records nothing.
        let plans = [ok_after(100, 1), ok_after(5, 2)];
        assert_eq!(
            block_on(call_with(&p, &clock, mode.start, &probe, &plans)).unwrap(),
            2
        );
        let m = p.circuit_metrics().unwrap();
        assert_eq!((m.calls, m.failures), (4, 2));

        // Declared before hedging: one outcome per call.
        let (b, clock, _) = mode.builder();
        let p = b
            .circuit_breaker(
                CircuitBreaker::failure_rate(0.9)
                    .count_window(100)
                    .minimum_calls(100),
            )
            .hedging(Hedging::latency(ms(10)).max_hedged_attempts(2))
            .build()
            .unwrap();
        let plans = [fail_after(15, 1), fail_after(20, 2), ok_after(1, 3)];
        block_on(call_with(&p, &clock, mode.start, &probe, &plans)).unwrap();
        let plans = [fail_after(1, 1), fail_after(1, 2), fail_after(1, 3)];
        assert!(block_on(call_with(&p, &clock, mode.start, &probe, &plans)).is_err());
        let m = p.circuit_metrics().unwrap();
        assert_eq!((m.calls, m.failures), (2, 1));
    }
}

#[test]
fn an_open_circuit_refuses_hedges_and_the_call_ends_only_when_none_runs() {
    for mode in modes() {
        let (b, clock, _) = mode.builder();
        let p = b
            .hedging(Hedging::fallback().max_hedged_attempts(2))
            .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(ms(1000)))
            .build()
            .unwrap();
        let probe = Arc::new(Probe::default());
        // Attempt 1 fails and opens the circuit: the next attempt is
        // refused with nothing else under way, so the refusal ends the call.
        let plans = [fail_after(5, 1), ok_after(1, 2), ok_after(1, 3)];
        let r = block_on(call_with(&p, &clock, mode.start, &probe, &plans));
        assert!(
            matches!(&r, Err(Error::Rejected(x)) if x.reason == RejectionReason::CircuitOpen),
            "{r:?}"
        );
        assert_eq!(probe.started(), [1]);
    }
}

#[test]
fn chaos_after_hedging_acts_on_each_attempt() {
    for mode in modes() {
        let (b, clock, _) = mode.builder();
        // The first draw injects 100 ms into attempt 1, the second none.
        let p = b
            .random(SequenceRandom::new([0.0, 0.9]))
            .hedging(Hedging::latency(ms(20)))
            .chaos(Chaos::latency(0.5, ms(100)))
            .build()
            .unwrap();
        let probe = Arc::new(Probe::default());
        let plans = [ok_after(1, 1), ok_after(1, 2)];
        assert_eq!(
            block_on(call_with(&p, &clock, mode.start, &probe, &plans)).unwrap(),
            2
        );
        assert_eq!(mode.elapsed(&clock), ms(21));
    }
}

#[test]
fn the_fallback_takes_the_error_of_a_hedged_call() {
    for mode in modes() {
        let (b, clock, _) = mode.builder();
        let p = b
            .hedging(Hedging::parallel().max_hedged_attempts(1))
            .fallback(|e: Error<Boom>, ctx: Context| async move {
                assert_eq!(ctx.attempt(), 2);
                match e {
                    Error::RetryExhausted { attempts, last } => Ok(100 * attempts + last.0),
                    _ => Ok(0),
                }
            })
            .build()
            .unwrap();
        let probe = Arc::new(Probe::default());
        let plans = [fail_after(5, 1), fail_after(10, 2)];
        assert_eq!(
            block_on(call_with(&p, &clock, mode.start, &probe, &plans)).unwrap(),
            202
        );
    }
}

/// A hedged call whose future is dropped (a caller's own timeout) drops
/// every attempt and gives back every slot.
#[test]
fn a_dropped_call_drops_every_attempt_and_gives_back_its_slots() {
    for mode in modes() {
        let (b, clock, _) = mode.builder();
        let p = b
            .hedging(Hedging::latency(ms(10)).max_hedged_attempts(2))
            .bulkhead(Bulkhead::new(8))
            .build()
            .unwrap();
        let probe = Arc::new(Probe::default());
        let plans = [never(), never(), never()];
        let in_flight = block_on(async {
            let watch = async {
                Clock::sleep(&clock, ms(25)).await;
                p.in_flight().unwrap()
            };
            let call = async {
                tokio::select! {
                    _ = call_with(&p, &clock, mode.start, &probe, &plans) => unreachable!(),
                    () = Clock::sleep(&clock, ms(30)) => {}
                }
            };
            tokio::join!(watch, call).0
        });
        assert_eq!(in_flight, 3);
        assert_eq!(probe.started(), [1, 2, 3]);
        assert_eq!(probe.dropped(), [1, 2, 3]);
        assert_eq!(p.in_flight().unwrap(), 0);
    }
}

#[test]
fn a_blocking_call_with_hedging_is_refused_without_running() {
    for mode in modes() {
        let (b, _, _) = mode.builder();
        let p = b.hedging(Hedging::parallel()).build().unwrap();
        let runs = AtomicU32::new(0);
        let r = p.call(|_ctx| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Boom>(1)
        });
        match r {
            Err(Error::Config(e)) => {
                assert_eq!((e.policy, e.field), ("hedging", "call"));
                assert!(e
                    .to_string()
                    .starts_with("hedging.call is async only: hedged attempts run concurrently"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }
}

#[test]
fn bad_settings_are_refused_at_build() {
    let build = |b: PipelineBuilder| b.build().map(|_| ()).unwrap_err().to_string();
    let e = build(Pipeline::builder("h").hedging(Hedging::parallel().max_hedged_attempts(0)));
    assert_eq!(
        e,
        "hedging.max_hedged_attempts must be in 1..=10 (hedged attempts beyond the first), got 0"
    );
    let e = build(Pipeline::builder("h").hedging(Hedging::parallel().max_hedged_attempts(11)));
    assert!(e.ends_with("got 11"), "{e}");
    let e = build(Pipeline::builder("h").hedging(Hedging::latency(Duration::from_secs(200_000))));
    assert_eq!(
        e,
        "hedging.delay must be < 86400s (use mode `fallback` to hedge only on failures), got 200000s"
    );
    for ratio in [0.0, -1.0, 1000.5, f64::NAN] {
        let e = build(
            Pipeline::builder("h").hedging(Hedging::parallel().budget(RetryBudget::new(ratio, 5))),
        );
        assert!(
            e.starts_with("hedging.budget.ratio must be in (0, 1000], got"),
            "{e}"
        );
    }
    let e =
        build(Pipeline::builder("h").hedging(Hedging::parallel().budget(RetryBudget::new(0.1, 0))));
    assert_eq!(e, "hedging.budget.max_tokens must be >= 1, got 0");
    let e = build(
        Pipeline::builder("h")
            .retry(Retry::constant(ms(1)))
            .hedging(Hedging::parallel()),
    );
    assert!(
        e.starts_with(
            "pipeline.hedging is declared with `retry`; hedging makes the further attempts"
        ),
        "{e}"
    );
    let e = build(
        Pipeline::builder("h")
            .chaos(Chaos::latency(0.5, ms(1)))
            .hedging(Hedging::parallel()),
    );
    assert!(
        e.starts_with("pipeline.chaos is declared before `hedging`"),
        "{e}"
    );
}

/// Many calls at once on one pipeline, from several threads, with a
/// bulkhead after hedging that holds them all or only some: every call
/// gets its own answer or a refusal of the full bulkhead, and every slot
/// comes back.
#[test]
fn many_concurrent_hedged_calls_give_back_every_slot() {
    for slots in [600, 16] {
        let clock = VirtualClock::starting_at(Duration::from_secs(1_000_000));
        let p = Pipeline::builder(format!("hedging-many-{slots}"))
            .store(MemoryStore::new())
            .clock(clock.clone())
            .hedging(Hedging::latency(ms(10)).max_hedged_attempts(2))
            .bulkhead(Bulkhead::new(slots))
            .build()
            .unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .build()
            .unwrap();
        let answers = rt.block_on(async {
            let mut tasks = Vec::new();
            for i in 0..200u32 {
                let p = p.clone();
                let clock = clock.clone();
                tasks.push(tokio::spawn(async move {
                    p.run(|ctx: Context| {
                        let clock = clock.clone();
                        // Every third call's first attempt is slow.
                        let d = if ctx.attempt() == 1 && i % 3 == 0 {
                            50
                        } else {
                            1
                        };
                        async move {
                            Clock::sleep(&clock, ms(d)).await;
                            Ok::<_, Boom>(i)
                        }
                    })
                    .await
                }));
            }
            let mut answers = Vec::new();
            for t in tasks {
                answers.push(t.await.unwrap());
            }
            answers
        });
        let mut refused = 0;
        for (i, a) in answers.into_iter().enumerate() {
            match a {
                Ok(v) => assert_eq!(v, i as u32),
                Err(Error::Rejected(r)) if r.reason == RejectionReason::BulkheadFull => {
                    refused += 1
                }
                Err(e) => panic!("{e:?}"),
            }
        }
        if slots == 600 {
            assert_eq!(refused, 0);
        }
        assert_eq!(p.in_flight().unwrap(), 0, "{slots}");
    }
}

/// A store that is not in memory as the engine sees it: the memory store's
/// answers after a round trip of 1 ms on the virtual clock, so hedged
/// attempts take the driver's `Ask` and `Record` steps while other
/// attempts run. (A round trip that is not on the virtual clock would let
/// a spurious poll of another attempt's sleep move the clock past it.)
#[derive(Debug)]
struct Remote(MemoryStore, VirtualClock);

#[derive(Debug)]
struct RemoteState(Arc<dyn store::ResourceState>, VirtualClock);

impl store::StateStore for Remote {
    fn bind(
        &self,
        spec: &store::ResourceSpec,
    ) -> Result<Arc<dyn store::ResourceState>, StoreError> {
        Ok(Arc::new(RemoteState(self.0.bind(spec)?, self.1.clone())))
    }
}

/// `value` after 1 ms on `clock`.
async fn round_trip<T>(clock: VirtualClock, value: T) -> T {
    Clock::sleep(&clock, ms(1)).await;
    value
}

impl store::ResourceState for RemoteState {
    fn admit(&self, request: &store::AdmitRequest<'_>) -> Result<store::Admission, StoreError> {
        self.0.admit(request)
    }
    fn admit_async<'a>(
        &'a self,
        request: store::AdmitRequest<'a>,
    ) -> store::StoreFuture<'a, store::Admission> {
        store::StoreFuture::boxed(round_trip(self.1.clone(), self.0.admit(&request)))
    }
    fn record(&self, record: &store::Record<'_>) -> Result<store::Recorded, StoreError> {
        self.0.record(record)
    }
    fn record_async<'a>(
        &'a self,
        record: store::Record<'a>,
    ) -> store::StoreFuture<'a, store::Recorded> {
        store::StoreFuture::boxed(round_trip(self.1.clone(), self.0.record(&record)))
    }
    fn release(&self, partition: Option<&PartitionKey>, permit: store::Permit) {
        self.0.release(partition, permit)
    }
    fn circuit_metrics(
        &self,
        partition: Option<&PartitionKey>,
        now: Duration,
    ) -> Result<CircuitMetrics, StoreError> {
        self.0.circuit_metrics(partition, now)
    }
    fn control_circuit(
        &self,
        partition: Option<&PartitionKey>,
        control: breaker::CircuitControl,
        now: Duration,
    ) -> Result<Option<breaker::CircuitTransition>, StoreError> {
        self.0.control_circuit(partition, control, now)
    }
    fn in_flight(
        &self,
        partition: Option<&PartitionKey>,
        now: Duration,
    ) -> Result<u32, StoreError> {
        self.0.in_flight(partition, now)
    }
}

/// With a store that answers asynchronously, hedged attempts are admitted
/// and recorded through it while the other attempts run; a success wins
/// as soon as it is seen (the others are dropped before the store records
/// it).
#[test]
fn hedged_attempts_ask_a_remote_store_while_others_run() {
    for mode in modes() {
        let pipeline = |b: PipelineBuilder, clock: &VirtualClock| {
            b.store(Remote(MemoryStore::new(), clock.clone()))
                .timeout(ms(100))
                .hedging(Hedging::latency(ms(10)).max_hedged_attempts(1))
                .circuit_breaker(
                    CircuitBreaker::failure_rate(0.9)
                        .count_window(100)
                        .minimum_calls(100),
                )
                .bulkhead(Bulkhead::new(4))
                .build()
                .unwrap()
        };
        // The hedge answers first: it wins, the first attempt is dropped.
        // Each admission and record takes 1 ms: the first attempt starts at
        // 1 ms, the hedge is started at 11 ms and runs from 12 ms, answers
        // at 17 ms, recorded at 18 ms.
        let (b, clock, _) = mode.builder();
        let p = pipeline(b, &clock);
        let probe = Arc::new(Probe::default());
        let r = block_on(call_with(
            &p,
            &clock,
            mode.start,
            &probe,
            &[never(), ok_after(5, 2)],
        ));
        assert_eq!(r.unwrap(), 2, "{mode:?}");
        assert_eq!(probe.started_at(), [(1, ms(1)), (2, ms(12))]);
        assert_eq!(probe.dropped(), [1]);
        assert_eq!(mode.elapsed(&clock), ms(18));
        let m = p.circuit_metrics().unwrap();
        assert_eq!((m.calls, m.failures), (1, 0));
        assert_eq!(p.in_flight().unwrap(), 0);

        // The hedge fails (recorded through the store while the first
        // attempt runs), the first attempt runs into the call's timeout
        // (100 ms), recorded at 101 ms.
        let (b, clock, _) = mode.builder();
        let p = pipeline(b, &clock);
        let probe = Arc::new(Probe::default());
        let r = block_on(call_with(
            &p,
            &clock,
            mode.start,
            &probe,
            &[never(), fail_after(5, 2)],
        ));
        assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
        assert_eq!(probe.answered(), [2]);
        assert_eq!(probe.dropped(), [1]);
        assert_eq!(mode.elapsed(&clock), ms(101));
        let m = p.circuit_metrics().unwrap();
        assert_eq!((m.calls, m.failures), (2, 2));
        assert_eq!(p.in_flight().unwrap(), 0);
    }
}

/// The adaptive limit after hedging guards each hedged attempt: every
/// attempt under way holds one slot of it, and the losers dropped when an
/// answer wins, like a call dropped with attempts under way, give theirs
/// back.
#[test]
fn each_hedged_attempt_holds_a_slot_of_the_adaptive_limit_and_gives_it_back() {
    for mode in modes() {
        let (b, clock, _events) = mode.builder();
        let p = b
            .hedging(Hedging::latency(ms(10)).max_hedged_attempts(2))
            .adaptive_limit(AdaptiveLimit::aimd().initial_limit(20))
            .build()
            .unwrap();
        let in_flight = |p: &Pipeline<_>| p.concurrency_limit().unwrap().in_flight;
        let probe = Arc::new(Probe::default());
        let plans = [never(), never(), ok_after(5, 3)];
        let r = block_on(call_with(&p, &clock, mode.start, &probe, &plans));
        assert_eq!(r.unwrap(), 3, "{mode:?}");
        assert_eq!(probe.started(), [1, 2, 3], "{mode:?}");
        assert_eq!(probe.dropped(), [1, 2], "{mode:?}");
        assert_eq!(in_flight(&p), 0, "{mode:?}: the losers' slots");

        // A call dropped with three attempts under way.
        let probe = Arc::new(Probe::default());
        let plans = [never(), never(), never()];
        let seen = block_on(async {
            let call = call_with(&p, &clock, mode.start, &probe, &plans);
            let mut call = std::pin::pin!(call);
            let mut seen = 0;
            for _ in 0..1_000 {
                let polled = futures_poll_once(call.as_mut()).await;
                assert!(polled.is_none(), "{mode:?}: never answers");
                seen = seen.max(in_flight(&p));
                if probe.started().len() == 3 {
                    break;
                }
            }
            seen
        });
        assert_eq!(probe.started(), [1, 2, 3], "{mode:?}");
        assert_eq!(seen, 3, "{mode:?}: one slot per attempt under way");
        assert_eq!(in_flight(&p), 0, "{mode:?}: a dropped call's slots");
    }
}

/// Polls `f` once, giving the runtime a turn first.
async fn futures_poll_once<F: std::future::Future>(
    mut f: std::pin::Pin<&mut F>,
) -> Option<F::Output> {
    tokio::task::yield_now().await;
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match f.as_mut().poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

fn rejections(events: &Events) -> usize {
    events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| matches!(e, EventKind::Rejected { .. }))
        .count()
}

/// A call through `p` that holds its attempt's slot for 25 ms (its own
/// hedges are refused while the other call holds the second slot).
async fn occupy_for_25ms<K>(p: &Pipeline<K>, clock: &VirtualClock, start: Duration)
where
    K: seawall::pipeline::Handles<u32, Boom>,
{
    let probe = Arc::new(Probe::default());
    let plans = [ok_after(25, 9), ok_after(25, 9), ok_after(25, 9)];
    let r = call_with(p, clock, start, &probe, &plans).await;
    assert!(matches!(r, Ok(9)), "{r:?}");
}

/// A hedged attempt refused by a policy declared after hedging did not
/// start: it does not count, and the next hedge is tried after the next
/// delay, timed from the refusal, while the first attempt still runs. Here
/// the hedges tried at 10 ms and 20 ms are refused, the one tried at 30 ms
/// starts (as attempt 2) and wins; for every kind of refusal.
#[test]
fn a_refused_hedge_does_not_count_and_the_next_is_tried_after_the_delay() {
    for source in [
        "rate limiter",
        "bulkhead",
        "circuit breaker",
        "adaptive limit",
    ] {
        for mode in modes() {
            let (b, clock, events) = mode.builder();
            let b = b.hedging(Hedging::latency(ms(10)).max_hedged_attempts(2));
            let p = match source {
                // One permit per 25 ms: the first attempt takes it at 0.
                "rate limiter" => b.rate_limiter(RateLimiter::gcra(1, ms(25))),
                "bulkhead" => b.bulkhead(Bulkhead::new(2)),
                "circuit breaker" => b.circuit_breaker(CircuitBreaker::consecutive_failures(5)),
                _ => b.adaptive_limit(AdaptiveLimit::aimd().initial_limit(2).min_limit(2)),
            }
            .build()
            .unwrap();
            let probe = Arc::new(Probe::default());
            let plans = [ok_after(100, 1), ok_after(5, 2), ok_after(5, 3)];
            let r = block_on(async {
                // What refuses the hedges from 5 ms to 25 ms: another call
                // holding the second slot, or the circuit held open.
                let interfere = async {
                    match source {
                        "bulkhead" | "adaptive limit" => {
                            occupy_for_25ms(&p, &clock, mode.start).await
                        }
                        "circuit breaker" => {
                            Clock::sleep(&clock, ms(5)).await;
                            p.isolate().unwrap();
                            Clock::sleep(&clock, ms(20)).await;
                            p.reset().unwrap();
                        }
                        _ => {}
                    }
                };
                // Polled first: it holds the slot (or registers its
                // sleep) before the hedged call's timer moves the clock.
                let ((), r) =
                    tokio::join!(interfere, call_with(&p, &clock, mode.start, &probe, &plans));
                r
            });
            assert_eq!(r.unwrap(), 2, "{source} {mode:?}");
            assert_eq!(
                probe.started_at(),
                [(1, ms(0)), (2, ms(30))],
                "{source} {mode:?}"
            );
            assert_eq!(probe.dropped(), [1], "{source} {mode:?}");
            assert_eq!(mode.elapsed(&clock), ms(35), "{source} {mode:?}");
            if mode.listen {
                assert_eq!(hedges(&events), [(2, HedgeTrigger::Delay)], "{source}");
                // The other call's hedges are refused at 10 and 20 ms too.
                let refused = match source {
                    "bulkhead" | "adaptive limit" => 4,
                    _ => 2,
                };
                assert_eq!(rejections(&events), refused, "{source} {mode:?}");
            }
        }
    }
}

/// When every hedge is refused, each refusal arms the timer again (never
/// a try at once): one try per delay while the first attempt runs, and
/// with a delay of zero (parallel mode) none until an attempt fails.
#[test]
fn when_every_hedge_is_refused_one_is_tried_per_delay_and_never_at_once() {
    for mode in modes() {
        let (b, clock, events) = mode.builder();
        let p = b
            .hedging(Hedging::latency(ms(10)).max_hedged_attempts(2))
            .bulkhead(Bulkhead::new(1))
            .build()
            .unwrap();
        let probe = Arc::new(Probe::default());
        let plans = [ok_after(55, 1), ok_after(1, 2), ok_after(1, 3)];
        let r = block_on(call_with(&p, &clock, mode.start, &probe, &plans));
        assert_eq!(r.unwrap(), 1, "{mode:?}");
        assert_eq!(probe.started(), [1], "{mode:?}");
        assert_eq!(mode.elapsed(&clock), ms(55), "{mode:?}");
        if mode.listen {
            // Tried at 10, 20, 30, 40 and 50 ms.
            assert_eq!(rejections(&events), 5, "{mode:?}");
            assert_eq!(hedges(&events), [], "{mode:?}");
        }
        assert_eq!(p.in_flight().unwrap(), 0, "{mode:?}");

        // Parallel: the hedge refused at 0 is tried again when the first
        // attempt fails (its slot given back), and starts; the third,
        // tried at once then, is refused and not tried again.
        let (b, clock, events) = mode.builder();
        let p = b
            .hedging(Hedging::parallel().max_hedged_attempts(2))
            .bulkhead(Bulkhead::new(1))
            .build()
            .unwrap();
        let probe = Arc::new(Probe::default());
        let plans = [fail_after(50, 1), ok_after(5, 2), ok_after(1, 3)];
        let r = block_on(call_with(&p, &clock, mode.start, &probe, &plans));
        assert_eq!(r.unwrap(), 2, "{mode:?}");
        assert_eq!(probe.started_at(), [(1, ms(0)), (2, ms(50))], "{mode:?}");
        assert_eq!(mode.elapsed(&clock), ms(55), "{mode:?}");
        if mode.listen {
            assert_eq!(rejections(&events), 2, "{mode:?}");
            assert_eq!(hedges(&events), [(2, HedgeTrigger::Failure)], "{mode:?}");
        }
        assert_eq!(p.in_flight().unwrap(), 0, "{mode:?}");
    }
}

/// Dynamic mode: after a refusal the generator is asked again for the same
/// attempt number (the refused one did not start), its delay timed from the
/// refusal; a refused hedge gives its budget token back.
#[test]
fn a_refused_dynamic_hedge_asks_for_the_same_number_and_keeps_its_token() {
    for mode in modes() {
        let (b, clock, events) = mode.builder();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let a = asked.clone();
        let budget = RetryBudget::new(0.1, 1);
        let p = b
            .hedging(
                Hedging::dynamic(move |n| {
                    a.lock().unwrap().push(n);
                    match n {
                        2 => HedgeDelay::After(ms(10)),
                        _ => HedgeDelay::OnFailure,
                    }
                })
                .max_hedged_attempts(2)
                .budget(budget.clone()),
            )
            .rate_limiter(RateLimiter::gcra(1, ms(25)))
            .build()
            .unwrap();
        let probe = Arc::new(Probe::default());
        let plans = [ok_after(100, 1), ok_after(5, 2), ok_after(5, 3)];
        let r = block_on(call_with(&p, &clock, mode.start, &probe, &plans));
        assert_eq!(r.unwrap(), 2, "{mode:?}");
        assert_eq!(probe.started_at(), [(1, ms(0)), (2, ms(30))], "{mode:?}");
        // At the first attempt's start, at each refusal (10 and 20 ms),
        // at the start of attempt 2 (30 ms).
        assert_eq!(*asked.lock().unwrap(), [2, 2, 2, 3], "{mode:?}");
        // The one token was spent by the hedge that started.
        assert_eq!(budget.tokens(), 0.0, "{mode:?}");
        if mode.listen {
            assert_eq!(hedges(&events), [(2, HedgeTrigger::Delay)], "{mode:?}");
            assert_eq!(rejections(&events), 2, "{mode:?}");
        }
    }
}
