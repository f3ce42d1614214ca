//! The orchestrator contract, run against both logs: every test below runs once
//! on a SQLite file and once on a Postgres schema.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seawall::testing::{SequenceRandom, VirtualClock};
use seawall::{Jitter, Retry};
use seawall_saga::{GroupCompensation, Parallel};
use seawall_saga::{
    ListQuery, LogError, NewSaga, Orchestrator, RecoveryFailure, Saga, SagaError, SagaEvent,
    SagaId, SagaLog, SagaOutcome, SagaStatus, StartOptions, Step, StepContext, Transition,
};
use serde::{Deserialize, Serialize};
use support::Backend;

#[derive(Serialize, Deserialize, Clone, Debug)]
struct Order {
    id: u32,
    sku: String,
    cents: u64,
    fail_at: Option<usize>,
}

impl Order {
    fn new(id: u32, fail_at: Option<usize>) -> Self {
        Order {
            id,
            sku: format!("sku-{id}"),
            cents: 100 * u64::from(id),
            fail_at,
        }
    }
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Reservation {
    sku: String,
    hold: String,
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Payment {
    payment_id: String,
    cents: u64,
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Delivery {
    tracking: String,
}

/// What the steps did, in order, and with which keys.
#[derive(Clone, Default)]
struct Journal {
    entries: Arc<Mutex<Vec<String>>>,
    keys: Arc<Mutex<Vec<String>>>,
}

impl Journal {
    fn push(&self, entry: String, key: &seawall_saga::IdempotencyKey) {
        self.entries.lock().unwrap().push(entry);
        self.keys.lock().unwrap().push(key.to_string());
    }
    fn entries(&self) -> Vec<String> {
        self.entries.lock().unwrap().clone()
    }
    fn keys(&self) -> Vec<String> {
        self.keys.lock().unwrap().clone()
    }
}

/// Switches the tests turn on.
#[derive(Clone, Default)]
struct Knobs {
    compensation_fails: Arc<AtomicBool>,
    hang_in_charge: Arc<AtomicBool>,
    charge_reached: Arc<tokio::sync::Notify>,
    panic_in_delivery: Arc<AtomicBool>,
    clock: Option<VirtualClock>,
    advance_in_charge: Option<Duration>,
    remaining_seen: Arc<Mutex<Option<Option<Duration>>>>,
}

fn purchase(journal: &Journal, knobs: &Knobs) -> Saga<Order> {
    let (j1, j2, j3) = (journal.clone(), journal.clone(), journal.clone());
    let (u1, u2, u3) = (journal.clone(), journal.clone(), journal.clone());
    let (k1, k2, k3) = (knobs.clone(), knobs.clone(), knobs.clone());
    let (c1, c2, c3) = (knobs.clone(), knobs.clone(), knobs.clone());
    Saga::builder("purchase")
        .step(
            Step::new("reserve_stock", move |ctx: StepContext<Order>| {
                let journal = j1.clone();
                let knobs = k1.clone();
                async move {
                    *knobs.remaining_seen.lock().unwrap() = Some(ctx.remaining());
                    let order = ctx.input();
                    if order.fail_at == Some(0) {
                        return Err("out of stock".to_owned());
                    }
                    journal.push("do reserve_stock".into(), ctx.idempotency_key());
                    Ok(Reservation {
                        sku: order.sku.clone(),
                        hold: format!("hold-{}", order.id),
                    })
                }
            })
            .compensate(move |ctx, reservation: Reservation| {
                let journal = u1.clone();
                let knobs = c1.clone();
                async move {
                    if knobs.compensation_fails.load(Ordering::SeqCst) {
                        return Err("warehouse unreachable");
                    }
                    assert_eq!(reservation.sku, ctx.input().sku);
                    journal.push(
                        format!("undo reserve_stock {}", reservation.hold),
                        ctx.idempotency_key(),
                    );
                    Ok(())
                }
            }),
        )
        .step(
            Step::new("charge", move |ctx: StepContext<Order>| {
                let journal = j2.clone();
                let knobs = k2.clone();
                async move {
                    let reservation: Reservation =
                        ctx.output("reserve_stock").map_err(|e| e.to_string())?;
                    let order = ctx.input();
                    if reservation.hold != format!("hold-{}", order.id) {
                        return Err(format!("wrong reservation {reservation:?}"));
                    }
                    if order.fail_at == Some(1) {
                        return Err("card declined".to_owned());
                    }
                    journal.push("do charge".into(), ctx.idempotency_key());
                    if knobs.hang_in_charge.load(Ordering::SeqCst) {
                        knobs.charge_reached.notify_one();
                        std::future::pending::<()>().await;
                    }
                    if let (Some(clock), Some(by)) = (&knobs.clock, knobs.advance_in_charge) {
                        clock.advance(by);
                    }
                    Ok(Payment {
                        payment_id: format!("pay-{}", order.id),
                        cents: order.cents,
                    })
                }
            })
            .compensate(move |ctx, payment: Payment| {
                let journal = u2.clone();
                let knobs = c2.clone();
                async move {
                    if knobs.compensation_fails.load(Ordering::SeqCst) {
                        return Err("refund service down");
                    }
                    journal.push(
                        format!("undo charge {} {}", payment.payment_id, payment.cents),
                        ctx.idempotency_key(),
                    );
                    Ok(())
                }
            }),
        )
        .step(
            Step::new("schedule_delivery", move |ctx: StepContext<Order>| {
                let journal = j3.clone();
                let knobs = k3.clone();
                async move {
                    let payment: Payment = ctx.output("charge").map_err(|e| e.to_string())?;
                    assert!(knobs.clock.is_none() || knobs.advance_in_charge.is_none());
                    if knobs.panic_in_delivery.load(Ordering::SeqCst) {
                        panic!("courier api returned nonsense");
                    }
                    if ctx.input().fail_at == Some(2) {
                        return Err("no courier available".to_owned());
                    }
                    journal.push("do schedule_delivery".into(), ctx.idempotency_key());
                    Ok(Delivery {
                        tracking: format!("trk-{}", payment.payment_id),
                    })
                }
            })
            .compensate(move |ctx, delivery: Delivery| {
                let journal = u3.clone();
                let knobs = c3.clone();
                async move {
                    if knobs.compensation_fails.load(Ordering::SeqCst) {
                        return Err("courier api down");
                    }
                    journal.push(
                        format!("undo schedule_delivery {}", delivery.tracking),
                        ctx.idempotency_key(),
                    );
                    Ok(())
                }
            }),
        )
        .build()
        .unwrap()
}

fn orchestrator(log: Arc<dyn SagaLog>, saga: &Saga<Order>) -> Orchestrator {
    Orchestrator::builder(log)
        .saga(saga)
        .compensation_retry(Retry::constant(Duration::ZERO).max_attempts(3))
        .build()
        .unwrap()
}

fn kinds(history: &[seawall_saga::TransitionRecord]) -> Vec<&'static str> {
    history.iter().map(|t| t.transition.kind()).collect()
}

/// Recovers until no saga is running or compensating (leases of another
/// instance may have to expire first on Postgres).
async fn recover_until_idle(o: &Orchestrator) -> (Vec<SagaOutcome>, Vec<RecoveryFailure>) {
    let (mut outcomes, mut failures) = (Vec::new(), Vec::new());
    for _ in 0..400 {
        let report = o.recover().await.unwrap();
        outcomes.extend(report.outcomes);
        failures.extend(report.failures);
        let running = o
            .list(&ListQuery::status(SagaStatus::Running))
            .await
            .unwrap();
        let compensating = o
            .list(&ListQuery::status(SagaStatus::Compensating))
            .await
            .unwrap();
        if running.is_empty() && compensating.is_empty() {
            return (outcomes, failures);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("sagas still unfinished after many recovery passes");
}

async fn completes_with_typed_outputs_events_and_history(backend: Backend) {
    let journal = Journal::default();
    let saga = purchase(&journal, &Knobs::default());
    let events: Arc<Mutex<Vec<SagaEvent>>> = Arc::default();
    let sink = events.clone();
    let o = Orchestrator::builder(backend.open().await)
        .saga(&saga)
        .on_event(move |e| sink.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    let outcome = o
        .start_with(
            &saga,
            Order::new(7, None),
            StartOptions::new().id("order-7"),
        )
        .await
        .unwrap();
    assert_eq!(outcome.status, SagaStatus::Completed);
    assert!(outcome.failure.is_none());
    assert_eq!(
        outcome.output::<Delivery>("schedule_delivery").unwrap(),
        Delivery {
            tracking: "trk-pay-7".into()
        }
    );
    assert_eq!(
        outcome.output::<Payment>("charge").unwrap(),
        Payment {
            payment_id: "pay-7".into(),
            cents: 700
        }
    );
    assert_eq!(
        journal.entries(),
        vec!["do reserve_stock", "do charge", "do schedule_delivery"]
    );
    assert_eq!(
        journal.keys(),
        vec![
            "order-7/0/reserve_stock/action",
            "order-7/1/charge/action",
            "order-7/2/schedule_delivery/action"
        ]
    );

    let id = SagaId::new("order-7");
    let history = o.history(&id).await.unwrap();
    assert_eq!(
        kinds(&history),
        vec![
            "saga_started",
            "step_started",
            "step_completed",
            "step_started",
            "step_completed",
            "step_started",
            "step_completed",
            "saga_completed"
        ]
    );
    assert!(history.windows(2).all(|w| w[0].at <= w[1].at));
    assert!(history.iter().enumerate().all(|(i, t)| t.seq as usize == i));
    match &history[2].transition {
        Transition::StepCompleted { step, output } => {
            assert_eq!(step.name, "reserve_stock");
            assert_eq!(output["hold"], "hold-7");
        }
        other => panic!("unexpected {other:?}"),
    }
    let seen = events.lock().unwrap().clone();
    assert_eq!(seen.len(), history.len());
    for (event, record) in seen.iter().zip(&history) {
        assert_eq!(event.seq, record.seq);
        assert_eq!(event.transition, record.transition);
        assert_eq!(event.saga_id, id);
    }
    assert_eq!(seen.last().unwrap().status, SagaStatus::Completed);

    let completed = o
        .list(&ListQuery::status(SagaStatus::Completed))
        .await
        .unwrap();
    assert_eq!(completed.len(), 1);
    assert_eq!(completed[0].id, id);
    assert_eq!(completed[0].name, "purchase");
    assert!(o
        .list(&ListQuery::status(SagaStatus::Running))
        .await
        .unwrap()
        .is_empty());
    let record = o.get(&id).await.unwrap().unwrap();
    let input: Order = serde_json::from_str(&record.input).unwrap();
    assert_eq!(input.id, 7);
}

/// Fails the step at `position` and checks which compensations ran, in which
/// order, with which outputs and keys.
async fn compensation_case(backend: Backend, position: usize) {
    let journal = Journal::default();
    let saga = purchase(&journal, &Knobs::default());
    let o = orchestrator(backend.open().await, &saga);
    let id = format!("order-fail-{position}");
    let outcome = o
        .start_with(
            &saga,
            Order::new(3, Some(position)),
            StartOptions::new().id(id.as_str()),
        )
        .await
        .unwrap();
    assert_eq!(outcome.status, SagaStatus::Compensated);
    let failure = outcome.failure.clone().unwrap();
    assert_eq!(failure.step.index, position);
    assert!(!failure.deadline_exceeded);
    let expected_error = ["out of stock", "card declined", "no courier available"][position];
    assert_eq!(failure.error, expected_error);

    let done = ["do reserve_stock", "do charge"];
    let undone = ["undo reserve_stock hold-3", "undo charge pay-3 300"];
    let mut expected: Vec<&str> = done[..position].to_vec();
    expected.extend(undone[..position].iter().rev());
    assert_eq!(journal.entries(), expected);
    let compensation_keys: Vec<String> = journal
        .keys()
        .into_iter()
        .filter(|k| k.ends_with("/compensation"))
        .collect();
    let expected_keys: Vec<String> = ["reserve_stock", "charge"][..position]
        .iter()
        .enumerate()
        .rev()
        .map(|(i, name)| format!("{id}/{i}/{name}/compensation"))
        .collect();
    assert_eq!(compensation_keys, expected_keys);

    let history = o.history(&SagaId::new(id.as_str())).await.unwrap();
    let mut expected_kinds = vec!["saga_started"];
    for _ in 0..position {
        expected_kinds.extend(["step_started", "step_completed"]);
    }
    expected_kinds.extend(["step_started", "step_failed"]);
    for _ in 0..position {
        expected_kinds.extend(["compensation_started", "compensation_completed"]);
    }
    expected_kinds.push("saga_compensated");
    assert_eq!(kinds(&history), expected_kinds);
    let compensated_steps: Vec<usize> = history
        .iter()
        .filter_map(|t| match &t.transition {
            Transition::CompensationCompleted { step } => Some(step.index),
            _ => None,
        })
        .collect();
    assert_eq!(compensated_steps, (0..position).rev().collect::<Vec<_>>());
    let listed = o
        .list(&ListQuery::status(SagaStatus::Compensated))
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
}

async fn compensates_when_step_1_of_3_fails(backend: Backend) {
    compensation_case(backend, 0).await;
}

async fn compensates_when_step_2_of_3_fails(backend: Backend) {
    compensation_case(backend, 1).await;
}

async fn compensates_when_step_3_of_3_fails(backend: Backend) {
    compensation_case(backend, 2).await;
}

async fn stuck_compensation_is_listed_and_resumable(backend: Backend) {
    let journal = Journal::default();
    let knobs = Knobs::default();
    let saga = purchase(&journal, &knobs);
    let clock = VirtualClock::new();
    let o = Orchestrator::builder(backend.open().await)
        .saga(&saga)
        .clock(clock.clone())
        .compensation_retry(
            Retry::exponential(Duration::from_secs(1))
                .max_attempts(3)
                .jitter(Jitter::Full),
        )
        .random(SequenceRandom::new([0.5]))
        .build()
        .unwrap();
    knobs.compensation_fails.store(true, Ordering::SeqCst);
    let outcome = o
        .start_with(
            &saga,
            Order::new(5, Some(2)),
            StartOptions::new().id("stuck-5"),
        )
        .await
        .unwrap();
    assert_eq!(outcome.status, SagaStatus::Stuck);
    let stuck = outcome.stuck.clone().unwrap();
    assert_eq!(stuck.step.name, "charge");
    assert_eq!(stuck.error, "refund service down");
    // Backoff between the three attempts went through the injected clock and
    // random source: full jitter at 0.5 halves 1 s and 2 s.
    let history = o.history(&SagaId::new("stuck-5")).await.unwrap();
    let starts: Vec<_> = history
        .iter()
        .filter(|t| t.transition.kind() == "compensation_started")
        .map(|t| t.at)
        .collect();
    let gaps: Vec<_> = starts
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).unwrap())
        .collect();
    assert_eq!(
        gaps,
        vec![Duration::from_millis(500), Duration::from_millis(1000)]
    );
    let id = SagaId::new("stuck-5");
    let listed = o.list(&ListQuery::status(SagaStatus::Stuck)).await.unwrap();
    assert_eq!(listed.iter().map(|r| &r.id).collect::<Vec<_>>(), vec![&id]);
    let history = o.history(&id).await.unwrap();
    let failed_attempts: Vec<u32> = history
        .iter()
        .filter_map(|t| match &t.transition {
            Transition::CompensationFailed { attempt, .. } => Some(*attempt),
            _ => None,
        })
        .collect();
    assert_eq!(failed_attempts, vec![1, 2, 3]);
    assert_eq!(history.last().unwrap().transition.kind(), "saga_stuck");
    // Not picked up by recovery: it needs an operator.
    let report = o.recover().await.unwrap();
    assert!(report.outcomes.is_empty() && report.failures.is_empty());
    assert!(journal.entries().iter().all(|e| !e.starts_with("undo")));

    knobs.compensation_fails.store(false, Ordering::SeqCst);
    let resumed = o.resume(&id).await.unwrap();
    assert_eq!(resumed.status, SagaStatus::Compensated);
    assert!(resumed.stuck.is_none());
    assert_eq!(resumed.failure.unwrap().step.name, "schedule_delivery");
    assert_eq!(
        journal.entries(),
        vec![
            "do reserve_stock",
            "do charge",
            "undo charge pay-5 500",
            "undo reserve_stock hold-5"
        ]
    );
    let history = o.history(&id).await.unwrap();
    assert!(kinds(&history).contains(&"operator_resumed"));
    assert_eq!(
        history.last().unwrap().transition.kind(),
        "saga_compensated"
    );
    // Resuming a finished saga only reports it.
    let again = o.resume(&id).await.unwrap();
    assert_eq!(again.status, SagaStatus::Compensated);
    assert_eq!(journal.entries().len(), 4);
}

async fn deadline_stops_before_the_next_step(backend: Backend) {
    let journal = Journal::default();
    let clock = VirtualClock::new();
    let knobs = Knobs {
        clock: Some(clock.clone()),
        advance_in_charge: Some(Duration::from_secs(11)),
        ..Knobs::default()
    };
    let saga = purchase(&journal, &knobs);
    let o = Orchestrator::builder(backend.open().await)
        .saga(&saga)
        .clock(clock.clone())
        .build()
        .unwrap();
    let outcome = o
        .start_with(
            &saga,
            Order::new(9, None),
            StartOptions::new()
                .id("late-9")
                .timeout(Duration::from_secs(10)),
        )
        .await
        .unwrap();
    assert_eq!(
        *knobs.remaining_seen.lock().unwrap(),
        Some(Some(Duration::from_secs(10)))
    );
    assert_eq!(outcome.status, SagaStatus::Compensated);
    let failure = outcome.failure.unwrap();
    assert!(failure.deadline_exceeded);
    assert_eq!(failure.step.name, "schedule_delivery");
    assert_eq!(
        journal.entries(),
        vec![
            "do reserve_stock",
            "do charge",
            "undo charge pay-9 900",
            "undo reserve_stock hold-9"
        ]
    );
    let history = o.history(&SagaId::new("late-9")).await.unwrap();
    assert!(kinds(&history).contains(&"deadline_exceeded"));
    let record = o.get(&SagaId::new("late-9")).await.unwrap().unwrap();
    assert!(record.deadline.is_some());
}

async fn submitted_sagas_run_on_recover(backend: Backend) {
    let journal = Journal::default();
    let saga = purchase(&journal, &Knobs::default());
    let o = orchestrator(backend.open().await, &saga);
    let mut ids = Vec::new();
    for i in 0..6 {
        let fail = if i % 2 == 0 { None } else { Some(1) };
        ids.push(
            o.submit(&saga, Order::new(i, fail), StartOptions::new())
                .await
                .unwrap(),
        );
    }
    assert_eq!(
        o.list(&ListQuery::status(SagaStatus::Running))
            .await
            .unwrap()
            .len(),
        6
    );
    assert!(journal.entries().is_empty());
    let (outcomes, failures) = recover_until_idle(&o).await;
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(outcomes.len(), 6);
    for outcome in outcomes {
        let i = ids.iter().position(|id| *id == outcome.id).unwrap();
        let expected = if i % 2 == 0 {
            SagaStatus::Completed
        } else {
            SagaStatus::Compensated
        };
        assert_eq!(outcome.status, expected);
    }
}

#[derive(Serialize, Deserialize)]
struct OrderV2 {
    id: String,
    sku: Vec<u8>,
}

async fn undeserialisable_input_is_reported_and_kept(backend: Backend) {
    let journal = Journal::default();
    let saga = purchase(&journal, &Knobs::default());
    let original = orchestrator(backend.open().await, &saga);
    let bad = original
        .submit(
            &saga,
            Order::new(1, None),
            StartOptions::new().id("bad-input"),
        )
        .await
        .unwrap();
    let good = original
        .submit(
            &Saga::<Order>::clone(&saga),
            Order::new(2, None),
            StartOptions::new().id("zz-other"),
        )
        .await
        .unwrap();
    let stored_input = original.get(&bad).await.unwrap().unwrap().input;

    // A build whose `purchase` input type changed incompatibly.
    let changed = Saga::<OrderV2>::builder("purchase")
        .step(Step::new(
            "reserve_stock",
            |_ctx: StepContext<OrderV2>| async { Ok::<_, String>(()) },
        ))
        .build()
        .unwrap();
    let other = Saga::<Order>::builder("refund")
        .step(Step::new("noop", |_ctx: StepContext<Order>| async {
            Ok::<_, String>(())
        }))
        .build()
        .unwrap();
    let o = Orchestrator::builder(backend.open().await)
        .saga(&changed)
        .saga(&other)
        .build()
        .unwrap();
    let report = o.recover().await.unwrap();
    assert!(report.outcomes.is_empty());
    assert_eq!(report.failures.len(), 2);
    for failure in &report.failures {
        match &failure.error {
            SagaError::InputDeserialize { saga_id, name, .. } => {
                assert_eq!(name, "purchase");
                assert_eq!(saga_id, &failure.saga_id);
            }
            other => panic!("unexpected error {other:?}"),
        }
    }
    // Still in the log, untouched apart from the recorded failure.
    let record = o.get(&bad).await.unwrap().unwrap();
    assert_eq!(record.status, SagaStatus::Running);
    assert_eq!(record.input, stored_input);
    let history = o.history(&bad).await.unwrap();
    match &history.last().unwrap().transition {
        Transition::RecoveryFailed { error } => {
            assert!(error.contains("cannot be deserialised"), "{error}")
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(journal.entries().is_empty());

    // The fixed build recovers both.
    let fixed = orchestrator(backend.open().await, &saga);
    let (outcomes, failures) = recover_until_idle(&fixed).await;
    assert!(failures.is_empty(), "{failures:?}");
    let mut ids: Vec<_> = outcomes.iter().map(|o| o.id.clone()).collect();
    ids.sort();
    assert_eq!(ids, vec![bad, good]);
    assert!(outcomes.iter().all(|o| o.status == SagaStatus::Completed));
}

async fn unknown_saga_name_is_reported(backend: Backend) {
    let journal = Journal::default();
    let saga = purchase(&journal, &Knobs::default());
    let original = orchestrator(backend.open().await, &saga);
    let id = original
        .submit(&saga, Order::new(1, None), StartOptions::new())
        .await
        .unwrap();
    let unrelated = Saga::<Order>::builder("refund")
        .step(Step::new("noop", |_ctx: StepContext<Order>| async {
            Ok::<_, String>(())
        }))
        .build()
        .unwrap();
    let o = Orchestrator::builder(backend.open().await)
        .saga(&unrelated)
        .build()
        .unwrap();
    let report = o.recover().await.unwrap();
    assert_eq!(report.failures.len(), 1);
    assert!(matches!(
        &report.failures[0].error,
        SagaError::NotRegistered { name, saga_id: Some(s) } if name == "purchase" && *s == id
    ));
    assert_eq!(
        o.get(&id).await.unwrap().unwrap().status,
        SagaStatus::Running
    );
    // Starting an unregistered saga is refused up front.
    let err = o.start(&saga, Order::new(2, None)).await.unwrap_err();
    assert!(matches!(err, SagaError::NotRegistered { .. }));
}

async fn duplicate_id_is_refused(backend: Backend) {
    let journal = Journal::default();
    let saga = purchase(&journal, &Knobs::default());
    let o = orchestrator(backend.open().await, &saga);
    let first = o
        .start_with(&saga, Order::new(4, None), StartOptions::new().id("once"))
        .await
        .unwrap();
    assert_eq!(first.status, SagaStatus::Completed);
    let err = o
        .start_with(&saga, Order::new(4, None), StartOptions::new().id("once"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, SagaError::Log(LogError::AlreadyExists(id)) if id.as_str() == "once"),
        "{err:?}"
    );
    assert_eq!(journal.entries().len(), 3);
    let err = o
        .start_with(&saga, Order::new(4, None), StartOptions::new().id(""))
        .await
        .unwrap_err();
    assert!(matches!(err, SagaError::InvalidId(_)));
}

async fn panicking_step_is_a_step_failure(backend: Backend) {
    let journal = Journal::default();
    let knobs = Knobs::default();
    knobs.panic_in_delivery.store(true, Ordering::SeqCst);
    let saga = purchase(&journal, &knobs);
    let o = orchestrator(backend.open().await, &saga);
    let outcome = o.start(&saga, Order::new(6, None)).await.unwrap();
    assert_eq!(outcome.status, SagaStatus::Compensated);
    let failure = outcome.failure.unwrap();
    assert!(
        failure.error.contains("courier api returned nonsense"),
        "{}",
        failure.error
    );
    assert_eq!(
        journal.entries(),
        vec![
            "do reserve_stock",
            "do charge",
            "undo charge pay-6 600",
            "undo reserve_stock hold-6"
        ]
    );
}

async fn resume_reports_missing_and_busy(backend: Backend) {
    let journal = Journal::default();
    let saga = purchase(&journal, &Knobs::default());
    let o = orchestrator(backend.open().await, &saga);
    let err = o.resume(&SagaId::new("nope")).await.unwrap_err();
    assert!(matches!(err, SagaError::NotFound(_)));
    assert!(matches!(
        o.history(&SagaId::new("nope")).await.unwrap_err(),
        SagaError::NotFound(_)
    ));
    // A saga this worker holds (claimed, being driven) is busy for itself.
    let log = o.log().clone();
    let new = NewSaga {
        id: SagaId::new("held"),
        name: "purchase".into(),
        input: serde_json::to_string(&Order::new(1, None)).unwrap(),
        deadline: None,
        created_at: std::time::SystemTime::now(),
    };
    log.create(&new, &[Transition::SagaStarted], true)
        .await
        .unwrap();
    assert!(matches!(
        o.resume(&SagaId::new("held")).await.unwrap_err(),
        SagaError::Busy(_)
    ));
}

async fn lost_lease_refuses_writes(backend: Backend) {
    let first = backend.open().await;
    let second = backend.open().await;
    let id = SagaId::new("fenced");
    let new = NewSaga {
        id: id.clone(),
        name: "purchase".into(),
        input: "{}".into(),
        deadline: None,
        created_at: std::time::SystemTime::now(),
    };
    let lease = first
        .create(&new, &[Transition::SagaStarted], true)
        .await
        .unwrap()
        .unwrap();
    // The second worker takes the saga over (at once on SQLite, after the short
    // lease expired on Postgres).
    let mut claimed = Vec::new();
    for _ in 0..400 {
        claimed = second.claim_unfinished(None, 10).await.unwrap();
        if !claimed.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(claimed.len(), 1);
    assert_ne!(claimed[0].lease.token(), lease.token());
    let step = seawall_saga::StepRef::new(0, "reserve_stock");
    let err = first
        .append(
            &lease,
            1,
            &[Transition::StepStarted { step: step.clone() }],
            SagaStatus::Running,
            std::time::SystemTime::now(),
        )
        .await
        .unwrap_err();
    assert!(err.is_lease_lost(), "{err:?}");
    assert!(first.renew(&lease).await.unwrap_err().is_lease_lost());
    // The new owner writes fine; the history has no trace of the refused write.
    second
        .append(
            &claimed[0].lease,
            1,
            &[Transition::StepStarted { step }],
            SagaStatus::Running,
            std::time::SystemTime::now(),
        )
        .await
        .unwrap();
    let history = second.history(&id).await.unwrap();
    assert_eq!(kinds(&history), vec!["saga_started", "step_started"]);
}

async fn recovery_continues_after_a_driver_is_dropped(backend: Backend) {
    let journal = Journal::default();
    let knobs = Knobs::default();
    knobs.hang_in_charge.store(true, Ordering::SeqCst);
    let saga = purchase(&journal, &knobs);
    let o = orchestrator(backend.open().await, &saga);
    let driver = {
        let o = o.clone();
        let saga = saga.clone();
        tokio::spawn(async move {
            o.start_with(
                &saga,
                Order::new(8, None),
                StartOptions::new().id("dropped"),
            )
            .await
        })
    };
    knobs.charge_reached.notified().await;
    driver.abort();
    assert!(driver.await.unwrap_err().is_cancelled());
    knobs.hang_in_charge.store(false, Ordering::SeqCst);

    let restarted = orchestrator(backend.open().await, &saga);
    let (outcomes, failures) = recover_until_idle(&restarted).await;
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(outcomes.len(), 1);
    assert_eq!(outcomes[0].status, SagaStatus::Completed);
    // The logged step did not run again; the started one did, with the same key.
    assert_eq!(
        journal.entries(),
        vec![
            "do reserve_stock",
            "do charge",
            "do charge",
            "do schedule_delivery"
        ]
    );
    let keys = journal.keys();
    assert_eq!(keys[1], keys[2]);
    let history = restarted.history(&SagaId::new("dropped")).await.unwrap();
    assert!(kinds(&history).contains(&"claimed"));
}

/// A worker dies during a step (after its effect) and the saga's deadline
/// passes before another one claims it: the step runs again with the same
/// key, as it would have ended had the worker lived, and is compensated with
/// the step before it; the next step does not start. (A charge taken before
/// the crash is refunded, not left behind.)
async fn deadline_passed_while_crashed_mid_step_compensates(backend: Backend) {
    let journal = Journal::default();
    let knobs = Knobs::default();
    knobs.hang_in_charge.store(true, Ordering::SeqCst);
    let saga = purchase(&journal, &knobs);
    let clock = VirtualClock::new();
    let with_clock = |log| {
        Orchestrator::builder(log)
            .saga(&saga)
            .clock(clock.clone())
            .compensation_retry(Retry::constant(Duration::ZERO).max_attempts(3))
            .build()
            .unwrap()
    };
    let o = with_clock(backend.open().await);
    let driver = {
        let (o, saga) = (o.clone(), saga.clone());
        tokio::spawn(async move {
            o.start_with(
                &saga,
                Order::new(4, None),
                StartOptions::new()
                    .id("late-crash")
                    .timeout(Duration::from_secs(10)),
            )
            .await
        })
    };
    knobs.charge_reached.notified().await;
    driver.abort();
    assert!(driver.await.unwrap_err().is_cancelled());
    knobs.hang_in_charge.store(false, Ordering::SeqCst);
    clock.advance(Duration::from_secs(11));

    let restarted = with_clock(backend.open().await);
    let (outcomes, failures) = recover_until_idle(&restarted).await;
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(outcomes.len(), 1);
    assert_eq!(outcomes[0].status, SagaStatus::Compensated);
    let failure = outcomes[0].failure.clone().unwrap();
    assert!(failure.deadline_exceeded);
    assert_eq!(failure.step.name, "schedule_delivery");
    // The charge (started, not logged as completed) ran again with the same
    // key, and was refunded.
    assert_eq!(
        journal.entries(),
        vec![
            "do reserve_stock",
            "do charge",
            "do charge",
            "undo charge pay-4 400",
            "undo reserve_stock hold-4"
        ]
    );
    let keys = journal.keys();
    assert_eq!(keys[1], keys[2]);
    let history = restarted.history(&SagaId::new("late-crash")).await.unwrap();
    let kinds = kinds(&history);
    let claimed = kinds.iter().position(|k| *k == "claimed").unwrap();
    assert_eq!(
        kinds[claimed..],
        [
            "claimed",
            "step_started",
            "step_completed",
            "deadline_exceeded",
            "compensation_started",
            "compensation_completed",
            "compensation_started",
            "compensation_completed",
            "saga_compensated"
        ]
    );
}

// ------------------------------------------------------------ parallel groups

/// Switches of the trip saga: `flight`, then `hotel` and `car` in parallel,
/// then `pay`.
#[derive(Clone, Default)]
struct Trip {
    journal: Journal,
    /// Steps whose action fails.
    fails: Arc<Mutex<Vec<&'static str>>>,
    /// Steps whose compensation fails.
    undo_fails: Arc<Mutex<Vec<&'static str>>>,
    /// `hotel` and `car` wait for each other: they must run together.
    together: Option<Arc<tokio::sync::Barrier>>,
    /// The compensations of `hotel` and `car` wait for each other.
    undo_together: Option<Arc<tokio::sync::Barrier>>,
    /// `car` finishes only after `hotel` failed.
    car_after_hotel_failed: bool,
    hotel_failed: Arc<tokio::sync::Notify>,
    /// `car` hangs (until the driver is dropped) once it has taken effect.
    hang_car: Arc<AtomicBool>,
    car_reached: Arc<tokio::sync::Notify>,
}

impl Trip {
    fn step(&self, name: &'static str, continue_on_error: bool) -> Step<u32, String> {
        let (trip, undo) = (self.clone(), self.clone());
        let step = Step::new(name, move |ctx: StepContext<u32>| {
            let trip = trip.clone();
            async move {
                if matches!(name, "hotel" | "car") {
                    if let Some(together) = &trip.together {
                        tokio::time::timeout(Duration::from_secs(30), together.wait())
                            .await
                            .map_err(|_| "hotel and car did not run together".to_owned())?;
                    }
                }
                if name == "pay" {
                    let hotel: String = ctx.output("hotel").map_err(|e| e.to_string())?;
                    let car: String = ctx.output("car").map_err(|e| e.to_string())?;
                    assert_eq!((hotel.as_str(), car.as_str()), ("hotel-out", "car-out"));
                }
                if name == "car" && trip.car_after_hotel_failed {
                    trip.hotel_failed.notified().await;
                }
                if trip.fails.lock().unwrap().contains(&name) {
                    if name == "hotel" {
                        trip.hotel_failed.notify_one();
                    }
                    return Err(format!("{name} unavailable"));
                }
                trip.journal
                    .push(format!("do {name}"), ctx.idempotency_key());
                if name == "car" && trip.hang_car.load(Ordering::SeqCst) {
                    trip.car_reached.notify_one();
                    std::future::pending::<()>().await;
                }
                Ok(format!("{name}-out"))
            }
        })
        .compensate(move |ctx: StepContext<u32>, output: String| {
            let trip = undo.clone();
            async move {
                assert_eq!(output, format!("{name}-out"));
                if matches!(name, "hotel" | "car") {
                    if let Some(together) = &trip.undo_together {
                        tokio::time::timeout(Duration::from_secs(30), together.wait())
                            .await
                            .map_err(|_| "undo hotel and car did not run together".to_owned())?;
                    }
                }
                if trip.undo_fails.lock().unwrap().contains(&name) {
                    return Err(format!("cannot undo {name}"));
                }
                trip.journal
                    .push(format!("undo {name}"), ctx.idempotency_key());
                Ok::<_, String>(())
            }
        });
        if continue_on_error {
            step.continue_on_error()
        } else {
            step
        }
    }

    fn saga(&self, compensation: GroupCompensation) -> Saga<u32> {
        Saga::builder("trip")
            .step(self.step("flight", true))
            .parallel(
                Parallel::new()
                    .step(self.step("hotel", false))
                    .step(self.step("car", false))
                    .compensation(compensation),
            )
            .step(self.step("pay", false))
            .build()
            .unwrap()
    }

    fn entries(&self) -> Vec<String> {
        self.journal.entries()
    }
}

fn trip_orchestrator(log: Arc<dyn SagaLog>, saga: &Saga<u32>) -> Orchestrator {
    Orchestrator::builder(log)
        .saga(saga)
        .compensation_retry(Retry::constant(Duration::ZERO).max_attempts(2))
        .build()
        .unwrap()
}

fn position(entries: &[String], entry: &str) -> usize {
    entries
        .iter()
        .position(|e| e == entry)
        .unwrap_or_else(|| panic!("{entry:?} missing from {entries:?}"))
}

async fn parallel_group_runs_together_and_feeds_the_next_step(backend: Backend) {
    let trip = Trip {
        together: Some(Arc::new(tokio::sync::Barrier::new(2))),
        ..Trip::default()
    };
    let saga = trip.saga(GroupCompensation::Concurrent);
    let o = trip_orchestrator(backend.open().await, &saga);
    let outcome = o
        .start_with(&saga, 1, StartOptions::new().id("trip-ok"))
        .await
        .unwrap();
    assert_eq!(outcome.status, SagaStatus::Completed, "{outcome:?}");
    assert_eq!(outcome.output::<String>("car").unwrap(), "car-out");
    let entries = trip.entries();
    assert_eq!(entries.len(), 4);
    assert_eq!(entries[0], "do flight");
    assert_eq!(entries[3], "do pay");
    // Both starts of the group are logged before either ends.
    let history = o.history(&SagaId::new("trip-ok")).await.unwrap();
    let kinds = kinds(&history);
    assert_eq!(&kinds[3..5], &["step_started", "step_started"], "{kinds:?}");
}

async fn a_failure_in_a_group_awaits_the_others_and_compensates_all_completed(backend: Backend) {
    let trip = Trip {
        car_after_hotel_failed: true,
        ..Trip::default()
    };
    trip.fails.lock().unwrap().push("hotel");
    let saga = trip.saga(GroupCompensation::Concurrent);
    let o = trip_orchestrator(backend.open().await, &saga);
    let outcome = o
        .start_with(&saga, 1, StartOptions::new().id("trip-fail"))
        .await
        .unwrap();
    assert_eq!(outcome.status, SagaStatus::Compensated, "{outcome:?}");
    assert_eq!(outcome.failure.unwrap().step.name, "hotel");
    // The car, still under way when the hotel failed, finished and was undone;
    // pay never ran; the flight was undone last.
    assert_eq!(
        trip.entries(),
        vec!["do flight", "do car", "undo car", "undo flight"]
    );
    let history = o.history(&SagaId::new("trip-fail")).await.unwrap();
    let kinds = kinds(&history);
    let failed = kinds.iter().position(|k| *k == "step_failed").unwrap();
    let car_done = history
        .iter()
        .position(|t| matches!(&t.transition, Transition::StepCompleted { step, .. } if step.name == "car"))
        .unwrap();
    assert!(failed < car_done, "{kinds:?}");
}

async fn group_compensations_run_in_reverse_order_or_together(backend: Backend) {
    // Reverse declaration order: car, then hotel, then flight.
    let trip = Trip::default();
    trip.fails.lock().unwrap().push("pay");
    let saga = trip.saga(GroupCompensation::ReverseOrder);
    let o = trip_orchestrator(backend.open().await, &saga);
    let outcome = o
        .start_with(&saga, 1, StartOptions::new().id("trip-rev"))
        .await
        .unwrap();
    assert_eq!(outcome.status, SagaStatus::Compensated);
    assert_eq!(
        trip.entries()[3..],
        ["undo car", "undo hotel", "undo flight"]
    );

    // Concurrently: each compensation of the group waits for the other one.
    let trip = Trip {
        undo_together: Some(Arc::new(tokio::sync::Barrier::new(2))),
        ..Trip::default()
    };
    trip.fails.lock().unwrap().push("pay");
    let saga = trip.saga(GroupCompensation::Concurrent);
    let o = trip_orchestrator(backend.open().await, &saga);
    let outcome = o
        .start_with(&saga, 1, StartOptions::new().id("trip-con"))
        .await
        .unwrap();
    assert_eq!(outcome.status, SagaStatus::Compensated, "{outcome:?}");
    let entries = trip.entries();
    assert_eq!(entries.len(), 6, "{entries:?}");
    assert!(position(&entries, "undo hotel") < position(&entries, "undo flight"));
    assert!(position(&entries, "undo car") < position(&entries, "undo flight"));
}

async fn a_continue_on_error_compensation_is_abandoned_and_compensation_goes_on(backend: Backend) {
    let trip = Trip::default();
    trip.fails.lock().unwrap().push("pay");
    trip.undo_fails.lock().unwrap().push("flight");
    let saga = trip.saga(GroupCompensation::Concurrent);
    let o = trip_orchestrator(backend.open().await, &saga);
    let outcome = o
        .start_with(&saga, 1, StartOptions::new().id("trip-ab"))
        .await
        .unwrap();
    assert_eq!(outcome.status, SagaStatus::Compensated, "{outcome:?}");
    assert_eq!(outcome.abandoned.len(), 1);
    assert_eq!(outcome.abandoned[0].step.name, "flight");
    assert_eq!(outcome.abandoned[0].error, "cannot undo flight");
    let history = o.history(&SagaId::new("trip-ab")).await.unwrap();
    let attempts = history
        .iter()
        .filter(|t| matches!(&t.transition, Transition::CompensationFailed { step, .. } if step.name == "flight"))
        .count();
    assert_eq!(attempts, 2, "every attempt was made");
    assert!(kinds(&history).contains(&"compensation_abandoned"));
    // Read back from the log, the outcome is the same.
    let again = o.resume(&SagaId::new("trip-ab")).await.unwrap();
    assert_eq!(again.abandoned, outcome.abandoned);
}

async fn a_stuck_compensation_in_a_group_awaits_the_others_and_resumes(backend: Backend) {
    let trip = Trip::default();
    trip.fails.lock().unwrap().push("pay");
    trip.undo_fails.lock().unwrap().push("car");
    let saga = trip.saga(GroupCompensation::Concurrent);
    let o = trip_orchestrator(backend.open().await, &saga);
    let id = SagaId::new("trip-stuck");
    let outcome = o
        .start_with(&saga, 1, StartOptions::new().id(id.clone()))
        .await
        .unwrap();
    assert_eq!(outcome.status, SagaStatus::Stuck, "{outcome:?}");
    assert_eq!(outcome.stuck.unwrap().step.name, "car");
    // The hotel's compensation ran alongside; the flight's (an earlier stage)
    // waits for the car's.
    assert_eq!(trip.entries()[3..], ["undo hotel"]);
    trip.undo_fails.lock().unwrap().clear();
    let resumed = o.resume(&id).await.unwrap();
    assert_eq!(resumed.status, SagaStatus::Compensated);
    assert_eq!(
        trip.entries()[3..],
        ["undo hotel", "undo car", "undo flight"]
    );
}

async fn recovery_reruns_only_the_group_steps_whose_end_is_not_logged(backend: Backend) {
    let trip = Trip::default();
    trip.hang_car.store(true, Ordering::SeqCst);
    let saga = trip.saga(GroupCompensation::Concurrent);
    let o = trip_orchestrator(backend.open().await, &saga);
    let driver = {
        let (o, saga) = (o.clone(), saga.clone());
        tokio::spawn(async move {
            o.start_with(&saga, 1, StartOptions::new().id("trip-crash"))
                .await
        })
    };
    trip.car_reached.notified().await;
    // The hotel's completion is committed while the car still runs.
    let id = SagaId::new("trip-crash");
    for _ in 0..400 {
        let history = o.history(&id).await.unwrap();
        if history.iter().any(|t| matches!(&t.transition, Transition::StepCompleted { step, .. } if step.name == "hotel")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    driver.abort();
    assert!(driver.await.unwrap_err().is_cancelled());
    trip.hang_car.store(false, Ordering::SeqCst);

    let restarted = trip_orchestrator(backend.open().await, &saga);
    let (outcomes, failures) = recover_until_idle(&restarted).await;
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(outcomes.len(), 1);
    assert_eq!(outcomes[0].status, SagaStatus::Completed);
    let entries = trip.entries();
    assert_eq!(
        entries.iter().filter(|e| *e == "do hotel").count(),
        1,
        "{entries:?}"
    );
    assert_eq!(
        entries.iter().filter(|e| *e == "do car").count(),
        2,
        "{entries:?}"
    );
    let keys = trip.journal.keys();
    let car_keys: Vec<_> = keys.iter().filter(|k| k.contains("/car/")).collect();
    assert_eq!(car_keys[0], car_keys[1]);
}

/// A worker dies while a parallel group runs (the hotel's completion logged,
/// the car's not, its effect taken) and the saga's deadline passes before
/// another worker claims it: the car runs again with the same key, and the
/// whole group is compensated; `pay` does not start.
async fn deadline_passed_while_crashed_mid_group_compensates_the_group(backend: Backend) {
    let trip = Trip::default();
    trip.hang_car.store(true, Ordering::SeqCst);
    let saga = trip.saga(GroupCompensation::ReverseOrder);
    let clock = VirtualClock::new();
    let with_clock = |log| {
        Orchestrator::builder(log)
            .saga(&saga)
            .clock(clock.clone())
            .compensation_retry(Retry::constant(Duration::ZERO).max_attempts(2))
            .build()
            .unwrap()
    };
    let o = with_clock(backend.open().await);
    let driver = {
        let (o, saga) = (o.clone(), saga.clone());
        tokio::spawn(async move {
            o.start_with(
                &saga,
                1,
                StartOptions::new()
                    .id("trip-late")
                    .timeout(Duration::from_secs(10)),
            )
            .await
        })
    };
    trip.car_reached.notified().await;
    let id = SagaId::new("trip-late");
    for _ in 0..400 {
        let history = o.history(&id).await.unwrap();
        if history.iter().any(|t| matches!(&t.transition, Transition::StepCompleted { step, .. } if step.name == "hotel")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    driver.abort();
    assert!(driver.await.unwrap_err().is_cancelled());
    trip.hang_car.store(false, Ordering::SeqCst);
    clock.advance(Duration::from_secs(11));

    let restarted = with_clock(backend.open().await);
    let (outcomes, failures) = recover_until_idle(&restarted).await;
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(outcomes.len(), 1);
    assert_eq!(outcomes[0].status, SagaStatus::Compensated);
    let failure = outcomes[0].failure.clone().unwrap();
    assert!(failure.deadline_exceeded);
    assert_eq!(failure.step.name, "pay");
    let entries = trip.entries();
    assert_eq!(entries[0], "do flight");
    let mut group = entries[1..4].to_vec();
    group.sort();
    assert_eq!(group, ["do car", "do car", "do hotel"], "{entries:?}");
    assert_eq!(entries[4..], ["undo car", "undo hotel", "undo flight"]);
    let keys = trip.journal.keys();
    let car_keys: Vec<_> = keys.iter().filter(|k| k.contains("/car/action")).collect();
    assert_eq!(car_keys.len(), 2);
    assert_eq!(car_keys[0], car_keys[1]);
}

/// On a clock between two milliseconds, what the listeners, the steps and
/// the caller are told (commit times, creation, deadline) is what the log
/// keeps and reads back.
async fn events_and_records_carry_the_instants_the_log_keeps(backend: Backend) {
    let clock = VirtualClock::starting_at(Duration::new(1_700_000_000, 123_456_789));
    let seen_deadline = Arc::new(Mutex::new(None));
    let (step_clock, seen) = (clock.clone(), seen_deadline.clone());
    let saga = Saga::<u32>::builder("instants")
        .step(Step::new("one", move |ctx: StepContext<u32>| {
            let (clock, seen) = (step_clock.clone(), seen.clone());
            async move {
                *seen.lock().unwrap() = ctx.deadline();
                clock.advance(Duration::from_micros(1_250));
                Ok::<_, String>(1u32)
            }
        }))
        .build()
        .unwrap();
    let events = Arc::new(Mutex::new(Vec::<SagaEvent>::new()));
    let sink = events.clone();
    let o = Orchestrator::builder(backend.open().await)
        .saga(&saga)
        .clock(clock.clone())
        .on_event(move |e| sink.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    let outcome = o
        .start_with(
            &saga,
            1,
            StartOptions::new().timeout(Duration::from_micros(10_400)),
        )
        .await
        .unwrap();
    assert_eq!(outcome.status, SagaStatus::Completed);
    let history = o.history(&outcome.id).await.unwrap();
    let events = events.lock().unwrap().clone();
    assert_eq!(events.len(), history.len());
    for (event, record) in events.iter().zip(&history) {
        assert_eq!((event.seq, event.at), (record.seq, record.at));
    }
    let record = o.get(&outcome.id).await.unwrap().unwrap();
    assert_eq!(record.created_at, history[0].at);
    assert_eq!(*seen_deadline.lock().unwrap(), record.deadline);
    assert!(record.deadline.is_some());
}

/// Each event reports the status its own transition led to, also when it was
/// committed together with the transitions after it: the last step's
/// completion is `running`, only the saga's end is `completed`; a failed
/// step is `compensating` even when the saga ends at once; the last failed
/// compensation attempt is `compensating`, the saga becoming stuck is `stuck`.
async fn every_event_reports_the_status_its_own_transition_led_to(backend: Backend) {
    let undo_fails = Arc::new(AtomicBool::new(false));
    let fails = undo_fails.clone();
    let saga = Saga::<u32>::builder("statuses")
        .step(
            Step::new("first", |ctx: StepContext<u32>| async move {
                if *ctx.input() == 0 {
                    return Err("refused".to_owned());
                }
                Ok(())
            })
            .compensate(move |_ctx, ()| {
                let fails = fails.clone();
                async move {
                    if fails.load(Ordering::SeqCst) {
                        return Err("undo refused");
                    }
                    Ok(())
                }
            }),
        )
        .step(Step::new("second", |ctx: StepContext<u32>| async move {
            if *ctx.input() == 2 {
                return Err("refused".to_owned());
            }
            Ok(())
        }))
        .build()
        .unwrap();
    let events: Arc<Mutex<Vec<SagaEvent>>> = Arc::default();
    let sink = events.clone();
    let o = Orchestrator::builder(backend.open().await)
        .saga(&saga)
        .clock(VirtualClock::new())
        .compensation_retry(Retry::constant(Duration::ZERO).max_attempts(1))
        .on_event(move |e| sink.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    let statuses = |id: &SagaId| -> Vec<(&'static str, SagaStatus)> {
        events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| &e.saga_id == id)
            .map(|e| (e.transition.kind(), e.status))
            .collect()
    };
    use SagaStatus::{Compensated, Compensating, Completed, Running, Stuck};

    let done = o.start(&saga, 1).await.unwrap();
    assert_eq!(done.status, Completed);
    assert_eq!(
        statuses(&done.id),
        [
            ("saga_started", Running),
            ("step_started", Running),
            ("step_completed", Running),
            ("step_started", Running),
            ("step_completed", Running),
            ("saga_completed", Completed),
        ]
    );

    let refused = o.start(&saga, 0).await.unwrap();
    assert_eq!(refused.status, Compensated);
    assert_eq!(
        statuses(&refused.id),
        [
            ("saga_started", Running),
            ("step_started", Running),
            ("step_failed", Compensating),
            ("saga_compensated", Compensated),
        ]
    );

    let undone = o.start(&saga, 2).await.unwrap();
    assert_eq!(undone.status, Compensated);
    assert_eq!(
        statuses(&undone.id)[4..],
        [
            ("step_failed", Compensating),
            ("compensation_started", Compensating),
            ("compensation_completed", Compensating),
            ("saga_compensated", Compensated),
        ]
    );

    undo_fails.store(true, Ordering::SeqCst);
    let stuck = o.start(&saga, 2).await.unwrap();
    assert_eq!(stuck.status, Stuck);
    assert_eq!(
        statuses(&stuck.id)[5..],
        [
            ("compensation_started", Compensating),
            ("compensation_failed", Compensating),
            ("saga_stuck", Stuck),
        ]
    );
}

/// A stage due at the saga's deadline starts (the deadline has not passed);
/// one due a millisecond later does not.
async fn a_stage_at_the_deadline_starts_and_one_after_it_does_not(backend: Backend) {
    let clock = VirtualClock::starting_at(Duration::from_secs(1_000_000));
    let step_clock = clock.clone();
    let saga = Saga::<u32>::builder("boundary")
        .step(Step::new("first", move |ctx: StepContext<u32>| {
            let clock = step_clock.clone();
            async move {
                clock.advance(Duration::from_millis(u64::from(*ctx.input())));
                Ok::<_, String>(())
            }
        }))
        .step(Step::new("second", |_ctx: StepContext<u32>| async {
            Ok::<_, String>(())
        }))
        .build()
        .unwrap();
    let o = Orchestrator::builder(backend.open().await)
        .saga(&saga)
        .clock(clock.clone())
        .build()
        .unwrap();
    let timeout = StartOptions::new().timeout(Duration::from_millis(10));
    let on_time = o.start_with(&saga, 10, timeout.clone()).await.unwrap();
    assert_eq!(on_time.status, SagaStatus::Completed);
    let late = o.start_with(&saga, 11, timeout).await.unwrap();
    assert_eq!(late.status, SagaStatus::Compensated);
    let failure = late.failure.unwrap();
    assert!(failure.deadline_exceeded);
    assert_eq!(failure.step.name, "second");
}

async fn recovery_runs_many_sagas_concurrently(backend: Backend) {
    let journal = Journal::default();
    let saga = purchase(&journal, &Knobs::default());
    let o = Orchestrator::builder(backend.open().await)
        .saga(&saga)
        .recovery_concurrency(4)
        .build()
        .unwrap();
    for i in 0..25 {
        o.submit(&saga, Order::new(i, None), StartOptions::new())
            .await
            .unwrap();
    }
    let (outcomes, failures) = recover_until_idle(&o).await;
    assert!(failures.is_empty());
    assert_eq!(outcomes.len(), 25);
    assert_eq!(journal.entries().len(), 75);
    let all = o.list(&ListQuery::all().limit(1000)).await.unwrap();
    assert_eq!(all.len(), 25);
    // Paging through the list returns every saga once.
    let mut paged = Vec::new();
    let mut query = ListQuery::all().limit(7);
    loop {
        let page = o.list(&query).await.unwrap();
        if page.is_empty() {
            break;
        }
        query = ListQuery::all()
            .limit(7)
            .after(page.last().unwrap().id.clone());
        paged.extend(page);
    }
    assert_eq!(paged, all);
}

/// Writes that arrive together share a commit (both logs group them), yet
/// each keeps its own outcome: a taken id, a lost lease or a refused write
/// fails alone, two writes of one saga both land, and the others of the
/// burst are written.
async fn concurrent_writes_keep_their_own_outcomes(backend: Backend) {
    let log = backend.open().await;
    let now = std::time::SystemTime::now();
    let new = |id: String| NewSaga {
        id: SagaId::new(id),
        name: "purchase".into(),
        input: "{}".into(),
        deadline: None,
        created_at: now,
    };
    // A burst of creations, two of them with the same id.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..17 {
        let (log, new) = (log.clone(), new(format!("burst-{}", i.min(15))));
        tasks.spawn(async move {
            let created = log.create(&new, &[Transition::SagaStarted], true).await;
            (new.id, created)
        });
    }
    let mut leases = std::collections::BTreeMap::new();
    let mut taken = 0;
    while let Some(joined) = tasks.join_next().await {
        match joined.unwrap() {
            (id, Ok(Some(lease))) => assert!(leases.insert(id, lease).is_none()),
            (id, Err(LogError::AlreadyExists(taken_id))) if taken_id == id => taken += 1,
            other => panic!("unexpected creation outcome {other:?}"),
        }
    }
    assert_eq!((leases.len(), taken), (16, 1));
    // A burst of appends: saga 3 with a stale token (fenced), saga 5 at a
    // sequence number already written (refused by the log), saga 7 twice.
    let step = seawall_saga::StepRef::new(0, "reserve_stock");
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (id, lease)) in leases.iter().enumerate() {
        let mut writes = vec![(
            lease.clone(),
            1,
            Transition::StepStarted { step: step.clone() },
        )];
        match i {
            3 => writes[0].0 = seawall_saga::Lease::new(id.clone(), lease.token() + 7),
            5 => writes[0].1 = 0,
            7 => writes.push((
                lease.clone(),
                2,
                Transition::StepCompleted {
                    step: step.clone(),
                    output: serde_json::json!({"hold": "h-7"}),
                },
            )),
            _ => {}
        }
        for (lease, seq, transition) in writes {
            let log = log.clone();
            tasks.spawn(async move {
                let appended = log
                    .append(&lease, seq, &[transition], SagaStatus::Running, now)
                    .await;
                (i, seq, appended)
            });
        }
    }
    while let Some(joined) = tasks.join_next().await {
        let (i, seq, appended) = joined.unwrap();
        match i {
            3 => assert!(
                appended.as_ref().unwrap_err().is_lease_lost(),
                "{appended:?}"
            ),
            5 => {
                let err = appended.unwrap_err();
                assert!(!err.is_lease_lost(), "{err:?}");
            }
            _ => assert!(appended.is_ok(), "saga {i}, seq {seq}: {appended:?}"),
        }
    }
    for (i, id) in leases.keys().enumerate() {
        let history = log.history(id).await.unwrap();
        let expected = match i {
            3 | 5 => vec!["saga_started"],
            7 => vec!["saga_started", "step_started", "step_completed"],
            _ => vec!["saga_started", "step_started"],
        };
        assert_eq!(kinds(&history), expected, "saga {i}");
    }
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

macro_rules! contract {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::sqlite()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let backend = super::Backend::postgres(stringify!($name)).await;
                    super::$name(backend.clone()).await;
                    if let super::Backend::Postgres { schema, .. } = &backend {
                        super::support::reset_schema(schema).await;
                    }
                }
            )*
        }
    };
}

contract!(
    completes_with_typed_outputs_events_and_history,
    compensates_when_step_1_of_3_fails,
    compensates_when_step_2_of_3_fails,
    compensates_when_step_3_of_3_fails,
    stuck_compensation_is_listed_and_resumable,
    deadline_stops_before_the_next_step,
    submitted_sagas_run_on_recover,
    undeserialisable_input_is_reported_and_kept,
    unknown_saga_name_is_reported,
    duplicate_id_is_refused,
    panicking_step_is_a_step_failure,
    resume_reports_missing_and_busy,
    lost_lease_refuses_writes,
    concurrent_writes_keep_their_own_outcomes,
    recovery_continues_after_a_driver_is_dropped,
    deadline_passed_while_crashed_mid_step_compensates,
    recovery_runs_many_sagas_concurrently,
    parallel_group_runs_together_and_feeds_the_next_step,
    a_failure_in_a_group_awaits_the_others_and_compensates_all_completed,
    group_compensations_run_in_reverse_order_or_together,
    a_continue_on_error_compensation_is_abandoned_and_compensation_goes_on,
    a_stuck_compensation_in_a_group_awaits_the_others_and_resumes,
    recovery_reruns_only_the_group_steps_whose_end_is_not_logged,
    deadline_passed_while_crashed_mid_group_compensates_the_group,
    events_and_records_carry_the_instants_the_log_keeps,
    a_stage_at_the_deadline_starts_and_one_after_it_does_not,
    every_event_reports_the_status_its_own_transition_led_to,
);
