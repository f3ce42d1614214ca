//! The public types and futures are `Send` (and `Sync` where shared).

use seawall_saga::{
    IdempotencyKey, LogError, Orchestrator, PostgresLog, RecoveryReport, Saga, SagaError,
    SagaEvent, SagaId, SagaOutcome, ServeOptions, ServeReport, SqliteLog, StartOptions,
    StepContext, TransitionRecord, Wakeups,
};

fn send_sync<T: Send + Sync>() {}
fn send<T: Send>(_: &T) {}

#[test]
fn public_types_are_send_and_sync() {
    send_sync::<Orchestrator>();
    send_sync::<SqliteLog>();
    send_sync::<PostgresLog>();
    send_sync::<Saga<u32>>();
    send_sync::<StepContext<u32>>();
    send_sync::<SagaOutcome>();
    send_sync::<RecoveryReport>();
    send_sync::<SagaEvent>();
    send_sync::<TransitionRecord>();
    send_sync::<SagaId>();
    send_sync::<IdempotencyKey>();
    send_sync::<StartOptions>();
    send_sync::<LogError>();
    send_sync::<SagaError>();
    send_sync::<ServeOptions>();
    send_sync::<ServeReport>();
    send_sync::<Wakeups>();
}

#[test]
fn orchestrator_futures_are_send() {
    let dir = tempfile::tempdir().unwrap();
    let saga = Saga::<u32>::builder("s")
        .step(seawall_saga::Step::new(
            "a",
            |_ctx: StepContext<u32>| async { Ok::<_, String>(()) },
        ))
        .build()
        .unwrap();
    let o = Orchestrator::builder(SqliteLog::open(dir.path().join("s.db")).unwrap())
        .saga(&saga)
        .build()
        .unwrap();
    let id = SagaId::new("x");
    send(&o.start(&saga, 1));
    send(&o.start_with(&saga, 1, StartOptions::new()));
    send(&o.submit(&saga, 1, StartOptions::new()));
    send(&o.recover());
    send(&o.resume(&id));
    send(&o.history(&id));
    send(&o.serve(ServeOptions::new(), async {}));
}
