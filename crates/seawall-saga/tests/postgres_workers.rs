//! Several workers on one Postgres database: leases, SKIP LOCKED, fencing,
//! heartbeats.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use seawall_saga::{
    ClaimAttempt, ClaimedSaga, Lease, ListQuery, LogError, NewSaga, Orchestrator, PostgresLog,
    SagaId, SagaLog, SagaRecord, SagaStatus, StartOptions, Step, StepContext, Transition,
    TransitionRecord,
};

/// Per-saga concurrency probe shared by the steps of every worker.
#[derive(Clone, Default)]
struct Probe {
    active: Arc<Mutex<HashMap<String, usize>>>,
    overlaps: Arc<AtomicUsize>,
    executions: Arc<Mutex<HashMap<String, usize>>>,
}

impl Probe {
    async fn step(&self, ctx: &StepContext<u32>, hold: Duration) {
        let saga = ctx.saga_id().to_string();
        {
            let mut active = self.active.lock().unwrap();
            let n = active.entry(saga.clone()).or_default();
            *n += 1;
            if *n > 1 {
                self.overlaps.fetch_add(1, Ordering::SeqCst);
            }
        }
        *self
            .executions
            .lock()
            .unwrap()
            .entry(ctx.idempotency_key().to_string())
            .or_default() += 1;
        tokio::time::sleep(hold).await;
        *self.active.lock().unwrap().get_mut(&saga).unwrap() -= 1;
    }
}

fn probed_saga(probe: &Probe, hold: Duration) -> seawall_saga::Saga<u32> {
    let mut builder = seawall_saga::Saga::builder("probed");
    for name in ["a", "b", "c"] {
        let probe = probe.clone();
        builder = builder.step(Step::new(name, move |ctx: StepContext<u32>| {
            let probe = probe.clone();
            async move {
                probe.step(&ctx, hold).await;
                Ok::<_, String>(*ctx.input())
            }
        }));
    }
    builder.build().unwrap()
}

async fn in_progress(log: &dyn SagaLog) -> usize {
    let running = log
        .list(&ListQuery::status(SagaStatus::Running))
        .await
        .unwrap();
    let compensating = log
        .list(&ListQuery::status(SagaStatus::Compensating))
        .await
        .unwrap();
    running.len() + compensating.len()
}

async fn work_until_idle(o: Orchestrator) -> usize {
    let mut driven = 0;
    loop {
        let report = o.recover().await.unwrap();
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        driven += report.outcomes.len();
        if in_progress(o.log().as_ref()).await == 0 {
            return driven;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_race_for_the_same_sagas() {
    let schema = support::schema_name("race");
    support::reset_schema(&schema).await;
    let probe = Probe::default();
    let saga = probed_saga(&probe, Duration::from_millis(3));
    let lease = Duration::from_secs(10);
    let worker = |name: &'static str| {
        let (schema, saga) = (schema.clone(), saga.clone());
        async move {
            let log = support::pg_log(&schema, lease, name).await;
            Orchestrator::builder(log)
                .saga(&saga)
                .recovery_concurrency(6)
                .build()
                .unwrap()
        }
    };
    let first = worker("worker-a").await;
    let second = worker("worker-b").await;
    let total = 60;
    for i in 0..total {
        first
            .submit(&saga, i, StartOptions::new().id(format!("race-{i:03}")))
            .await
            .unwrap();
    }
    let (a, b) = tokio::join!(
        work_until_idle(first.clone()),
        work_until_idle(second.clone())
    );
    assert_eq!(
        a + b,
        total as usize,
        "each saga driven to its end exactly once"
    );
    assert_eq!(
        probe.overlaps.load(Ordering::SeqCst),
        0,
        "a saga ran in two workers at once"
    );
    let executions = probe.executions.lock().unwrap().clone();
    assert_eq!(executions.len(), 3 * total as usize);
    assert!(executions.values().all(|&n| n == 1), "{executions:?}");

    let mut by_worker: HashMap<String, usize> = HashMap::new();
    let done = first
        .list(&ListQuery::status(SagaStatus::Completed).limit(1000))
        .await
        .unwrap();
    assert_eq!(done.len(), total as usize);
    for record in &done {
        let history = first.history(&record.id).await.unwrap();
        let owners: Vec<&str> = history
            .iter()
            .filter_map(|t| match &t.transition {
                Transition::Claimed { owner } => Some(owner.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(owners.len(), 1, "{history:?}");
        *by_worker.entry(owners[0].to_owned()).or_default() += 1;
    }
    eprintln!("sagas per worker: {by_worker:?}");
    support::reset_schema(&schema).await;
}

/// A log whose lease renewals do nothing: a worker that stalls (long GC pause,
/// network partition) while its step runs.
#[derive(Debug)]
struct Stalled(PostgresLog);

impl SagaLog for Stalled {
    fn create<'a>(
        &'a self,
        saga: &'a NewSaga,
        transitions: &'a [Transition],
        claim: bool,
    ) -> seawall_saga::log::LogFuture<'a, Option<Lease>> {
        self.0.create(saga, transitions, claim)
    }
    fn append<'a>(
        &'a self,
        lease: &'a Lease,
        first_seq: u32,
        transitions: &'a [Transition],
        status: SagaStatus,
        at: SystemTime,
    ) -> seawall_saga::log::LogFuture<'a, ()> {
        self.0.append(lease, first_seq, transitions, status, at)
    }
    fn renew<'a>(&'a self, _lease: &'a Lease) -> seawall_saga::log::LogFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }
    fn claim_unfinished<'a>(
        &'a self,
        after: Option<&'a SagaId>,
        limit: usize,
    ) -> seawall_saga::log::LogFuture<'a, Vec<ClaimedSaga>> {
        self.0.claim_unfinished(after, limit)
    }
    fn claim<'a>(&'a self, id: &'a SagaId) -> seawall_saga::log::LogFuture<'a, ClaimAttempt> {
        self.0.claim(id)
    }
    fn get<'a>(&'a self, id: &'a SagaId) -> seawall_saga::log::LogFuture<'a, Option<SagaRecord>> {
        self.0.get(id)
    }
    fn list<'a>(
        &'a self,
        query: &'a ListQuery,
    ) -> seawall_saga::log::LogFuture<'a, Vec<SagaRecord>> {
        self.0.list(query)
    }
    fn history<'a>(
        &'a self,
        id: &'a SagaId,
    ) -> seawall_saga::log::LogFuture<'a, Vec<TransitionRecord>> {
        self.0.history(id)
    }
    fn lease_renewal_interval(&self) -> Option<Duration> {
        self.0.lease_renewal_interval()
    }
    fn owner(&self) -> &str {
        self.0.owner()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_lost_its_lease_writes_nothing_more() {
    let schema = support::schema_name("fencing");
    support::reset_schema(&schema).await;
    let release = Arc::new(tokio::sync::Notify::new());
    let reached = Arc::new(tokio::sync::Notify::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let saga = {
        let (release, reached, runs) = (release.clone(), reached.clone(), runs.clone());
        seawall_saga::Saga::<u32>::builder("fenced")
            .step(Step::new("slow", move |_ctx: StepContext<u32>| {
                let (release, reached, runs) = (release.clone(), reached.clone(), runs.clone());
                async move {
                    if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                        reached.notify_one();
                        release.notified().await;
                    }
                    Ok::<_, String>(1)
                }
            }))
            .step(Step::new("next", |_ctx: StepContext<u32>| async {
                Ok::<_, String>(2)
            }))
            .build()
            .unwrap()
    };
    // Short lease on the stalled worker (database clock).
    let stalled_log =
        Stalled(support::pg_log(&schema, Duration::from_millis(300), "stalled").await);
    let stalled = Orchestrator::builder(stalled_log)
        .saga(&saga)
        .build()
        .unwrap();
    let healthy =
        Orchestrator::builder(support::pg_log(&schema, Duration::from_secs(10), "healthy").await)
            .saga(&saga)
            .build()
            .unwrap();

    let first_run = {
        let (stalled, saga) = (stalled.clone(), saga.clone());
        tokio::spawn(async move {
            stalled
                .start_with(&saga, 1, StartOptions::new().id("contested"))
                .await
        })
    };
    reached.notified().await;
    // The healthy worker takes the saga over once the stalled lease expired.
    let outcome = loop {
        let report = healthy.recover().await.unwrap();
        if let Some(outcome) = report.outcomes.into_iter().next() {
            break outcome;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(outcome.status, SagaStatus::Completed);
    let before = healthy.history(&SagaId::new("contested")).await.unwrap();

    // The stalled worker wakes up and tries to log its step's completion.
    release.notify_one();
    let err = first_run.await.unwrap().unwrap_err();
    assert!(err.is_lease_lost(), "{err:?}");
    assert!(matches!(
        err,
        seawall_saga::SagaError::Log(LogError::LeaseLost { .. })
    ));
    let after = healthy.history(&SagaId::new("contested")).await.unwrap();
    assert_eq!(before, after, "the fenced worker wrote nothing");
    assert_eq!(
        healthy
            .get(&SagaId::new("contested"))
            .await
            .unwrap()
            .unwrap()
            .status,
        SagaStatus::Completed
    );
    support::reset_schema(&schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_a_slow_step_with_its_worker() {
    let schema = support::schema_name("heartbeat");
    support::reset_schema(&schema).await;
    let probe = Probe::default();
    // Each step takes several leases' worth of time.
    let saga = probed_saga(&probe, Duration::from_millis(1500));
    let lease = Duration::from_millis(500);
    let owner = Orchestrator::builder(support::pg_log(&schema, lease, "owner").await)
        .saga(&saga)
        .build()
        .unwrap();
    let rival = Orchestrator::builder(support::pg_log(&schema, lease, "rival").await)
        .saga(&saga)
        .build()
        .unwrap();
    let running = {
        let (owner, saga) = (owner.clone(), saga.clone());
        tokio::spawn(async move {
            owner
                .start_with(&saga, 5, StartOptions::new().id("slow"))
                .await
        })
    };
    let mut attempts = 0;
    while !running.is_finished() {
        let report = rival.recover().await.unwrap();
        assert!(report.outcomes.is_empty() && report.failures.is_empty());
        attempts += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(attempts > 10);
    let outcome = running.await.unwrap().unwrap();
    assert_eq!(outcome.status, SagaStatus::Completed);
    assert_eq!(probe.overlaps.load(Ordering::SeqCst), 0);
    let history = owner.history(&SagaId::new("slow")).await.unwrap();
    assert!(history
        .iter()
        .all(|t| !matches!(t.transition, Transition::Claimed { .. })));
    support::reset_schema(&schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_connections_create_the_schema_once() {
    let schema = support::schema_name("migrate");
    support::reset_schema(&schema).await;
    let logs = futures_join(&schema).await;
    assert_eq!(logs, 4);
    support::reset_schema(&schema).await;
}

async fn futures_join(schema: &str) -> usize {
    let mut tasks = Vec::new();
    for i in 0..4 {
        let schema = schema.to_owned();
        tasks.push(tokio::spawn(async move {
            support::pg_log(&schema, Duration::from_secs(5), &format!("m{i}")).await
        }));
    }
    let mut n = 0;
    for task in tasks {
        task.await.unwrap();
        n += 1;
    }
    n
}
