//! Steps that run through a seawall pipeline.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seawall::{Pipeline, Retry};
use seawall_saga::{Orchestrator, Saga, SagaStatus, SqliteLog, StartOptions, Step, StepContext};

fn flaky_charge(
    pipeline: Pipeline,
    failures_before_success: u32,
    calls: Arc<AtomicU32>,
    keys: Arc<Mutex<Vec<String>>>,
) -> Step<u64, u64> {
    Step::new("charge", move |ctx: StepContext<u64>| {
        let (calls, keys) = (calls.clone(), keys.clone());
        async move {
            keys.lock().unwrap().push(ctx.idempotency_key().to_string());
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            if n <= failures_before_success {
                Err(format!("provider timeout #{n}"))
            } else {
                Ok(*ctx.input() * 2)
            }
        }
    })
    .through(pipeline)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_retried_by_its_pipeline_completes_once_in_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = Pipeline::builder("payments")
        .retry(Retry::constant(Duration::from_millis(1)).max_attempts(5))
        .build()
        .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let keys = Arc::new(Mutex::new(Vec::new()));
    let saga = Saga::<u64>::builder("checkout")
        .step(flaky_charge(pipeline, 2, calls.clone(), keys.clone()))
        .build()
        .unwrap();
    let o = Orchestrator::builder(SqliteLog::open(dir.path().join("s.db")).unwrap())
        .saga(&saga)
        .build()
        .unwrap();
    let outcome = o
        .start_with(&saga, 21, StartOptions::new().id("c1"))
        .await
        .unwrap();
    assert_eq!(outcome.status, SagaStatus::Completed);
    assert_eq!(outcome.output::<u64>("charge").unwrap(), 42);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // Every attempt carried the same idempotency key.
    let keys = keys.lock().unwrap().clone();
    assert_eq!(keys, vec!["c1/0/charge/action"; 3]);
    let history = o.history(&"c1".into()).await.unwrap();
    let kinds: Vec<_> = history.iter().map(|t| t.transition.kind()).collect();
    assert_eq!(
        kinds,
        vec![
            "saga_started",
            "step_started",
            "step_completed",
            "saga_completed"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_whose_pipeline_gives_up_fails_the_saga() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = Pipeline::builder("payments-down")
        .retry(Retry::constant(Duration::from_millis(1)).max_attempts(3))
        .build()
        .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let undone = Arc::new(AtomicU32::new(0));
    let undo = undone.clone();
    let saga = Saga::<u64>::builder("checkout")
        .step(
            Step::new("reserve", |_ctx: StepContext<u64>| async {
                Ok::<_, String>(1)
            })
            .compensate(move |_ctx, _: u32| {
                let undo = undo.clone();
                async move {
                    undo.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>(())
                }
            }),
        )
        .step(flaky_charge(
            pipeline,
            u32::MAX,
            calls.clone(),
            Arc::default(),
        ))
        .build()
        .unwrap();
    let o = Orchestrator::builder(SqliteLog::open(dir.path().join("s.db")).unwrap())
        .saga(&saga)
        .build()
        .unwrap();
    let outcome = o.start(&saga, 1).await.unwrap();
    assert_eq!(outcome.status, SagaStatus::Compensated);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(undone.load(Ordering::SeqCst), 1);
    let failure = outcome.failure.unwrap();
    assert_eq!(failure.step.name, "charge");
    assert!(
        failure.error.contains("provider timeout #3"),
        "{}",
        failure.error
    );
}
