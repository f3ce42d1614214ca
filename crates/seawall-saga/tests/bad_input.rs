//! Bad input: files that are not saga logs, damaged logs, unreachable or
//! foreign Postgres. Typed errors, nothing overwritten, no panic.

mod support;

use std::time::Duration;

use seawall_saga::{
    ListQuery, LogError, Orchestrator, PostgresLog, PostgresOptions, SagaId, SqliteLog,
    StartOptions, Step, StepContext,
};

fn assert_untouched(path: &std::path::Path, before: &[u8]) {
    assert_eq!(std::fs::read(path).unwrap(), before, "file was modified");
    for suffix in ["-wal", "-shm", "-journal"] {
        let side = format!("{}{suffix}", path.display());
        assert!(!std::path::Path::new(&side).exists(), "{side} was created");
    }
}

#[test]
fn random_bytes_are_not_a_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("noise.db");
    let mut rng = support::Rng::new(42);
    let bytes: Vec<u8> = (0..8192).map(|_| rng.next_u64() as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    let err = SqliteLog::open(&path).unwrap_err();
    assert!(matches!(err, LogError::NotADatabase { .. }), "{err:?}");
    assert!(err.to_string().contains("is not a sqlite database"));
    assert_untouched(&path, &bytes);
}

#[test]
fn a_text_file_is_not_a_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    let text = b"remember to buy milk\n".repeat(50);
    std::fs::write(&path, &text).unwrap();
    let err = SqliteLog::open(&path).unwrap_err();
    assert!(matches!(err, LogError::NotADatabase { .. }), "{err:?}");
    assert_untouched(&path, &text);
}

#[test]
fn a_foreign_sqlite_database_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);
             INSERT INTO users (name) VALUES ('ada'), ('grace');",
        )
        .unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let err = SqliteLog::open(&path).unwrap_err();
    match &err {
        LogError::Foreign { detail, .. } => assert!(detail.contains("users"), "{detail}"),
        other => panic!("unexpected {other:?}"),
    }
    assert_untouched(&path, &before);

    // Another application's id in the header is refused too, even with no tables.
    let other = dir.path().join("other.db");
    {
        let conn = rusqlite::Connection::open(&other).unwrap();
        conn.execute_batch("PRAGMA application_id = 1234;").unwrap();
    }
    let before = std::fs::read(&other).unwrap();
    assert!(matches!(
        SqliteLog::open(&other).unwrap_err(),
        LogError::Foreign { .. }
    ));
    assert_untouched(&other, &before);
}

/// A file that is neither empty nor a saga log is refused, whatever it holds,
/// and its bytes stay as they were: one byte, a text file, another
/// application's SQLite database with its own tables.
#[test]
fn files_that_are_not_saga_logs_are_refused_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let one_byte = dir.path().join("one-byte.db");
    std::fs::write(&one_byte, b"x").unwrap();
    let text = dir.path().join("readme.txt");
    std::fs::write(&text, b"a short note, not a database\n").unwrap();
    let app = dir.path().join("app.db");
    {
        let conn = rusqlite::Connection::open(&app).unwrap();
        conn.execute_batch(
            "CREATE TABLE invoices (id INTEGER PRIMARY KEY, total INTEGER);
             INSERT INTO invoices (total) VALUES (12), (30);",
        )
        .unwrap();
    }
    for path in [&one_byte, &text] {
        let before = std::fs::read(path).unwrap();
        let err = SqliteLog::open(path).unwrap_err();
        assert!(
            matches!(&err, LogError::NotADatabase { path: p, .. } if p == path),
            "{}: {err:?}",
            path.display()
        );
        assert!(
            err.to_string().contains("is not a sqlite database"),
            "{err}"
        );
        assert_untouched(path, &before);
    }
    let before = std::fs::read(&app).unwrap();
    let err = SqliteLog::open(&app).unwrap_err();
    assert!(
        matches!(&err, LogError::Foreign { detail, .. } if detail.contains("invoices")),
        "{err:?}"
    );
    assert_untouched(&app, &before);
}

/// An empty file is a new log: it is initialised.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_file_becomes_a_saga_log() {
    use seawall_saga::SagaLog;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.db");
    std::fs::write(&path, b"").unwrap();
    let log = SqliteLog::open(&path).unwrap();
    assert!(log.list(&ListQuery::all()).await.unwrap().is_empty());
}

/// A SQLite failure says which operation failed and why, and keeps the
/// underlying error as its source.
#[test]
fn a_sqlite_error_names_the_operation_and_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-dir").join("sagas.db");
    let err = SqliteLog::open(&path).unwrap_err();
    assert!(matches!(err, LogError::Sqlite { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.starts_with("sqlite error while opening "),
        "{message}"
    );
    assert!(message.contains("no-such-dir"), "{message}");
    assert!(
        message.contains("unable to open database file"),
        "{message}"
    );
    let source = std::error::Error::source(&err).expect("a source");
    assert!(
        source.to_string().contains("unable to open database file"),
        "{source}"
    );
}

/// A compensation retry is checked by the rules of a seawall retry, and a
/// retry budget, which compensations cannot use, is refused.
#[test]
fn an_invalid_compensation_retry_is_a_definition_error() {
    use seawall::{Retry, RetryBudget};
    use seawall_saga::DefinitionError;
    let dir = tempfile::tempdir().unwrap();
    let log = SqliteLog::open(dir.path().join("sagas.db")).unwrap();
    let build = |retry: Retry| {
        Orchestrator::builder(log.clone())
            .compensation_retry(retry)
            .build()
            .unwrap_err()
    };
    let err = build(Retry::exponential(Duration::from_secs(2)).cap(Duration::from_secs(1)));
    assert!(
        matches!(&err, DefinitionError::CompensationRetry(e) if e.field == "cap"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "invalid compensation retry: retry.cap must be >= base (2s), got 1s"
    );
    let err = build(Retry::constant(Duration::from_secs(1)).budget(RetryBudget::new(0.2, 10)));
    assert!(
        matches!(&err, DefinitionError::CompensationRetry(e) if e.field == "budget"),
        "{err:?}"
    );
}

fn saga() -> seawall_saga::Saga<u32> {
    seawall_saga::Saga::builder("count")
        .step(Step::new("one", |ctx: StepContext<u32>| async move {
            Ok::<_, String>(*ctx.input() + 1)
        }))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_log_reports_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sagas.db");
    {
        let saga = saga();
        let o = Orchestrator::builder(SqliteLog::open(&path).unwrap())
            .saga(&saga)
            .build()
            .unwrap();
        for i in 0..300 {
            o.start_with(&saga, i, StartOptions::new().id(format!("s{i:04}")))
                .await
                .unwrap();
        }
    }
    // Move everything into the main file, then overwrite every page but the first.
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        conn.execute_batch("PRAGMA journal_mode = DELETE;").unwrap();
    }
    let mut bytes = std::fs::read(&path).unwrap();
    let page = u16::from_be_bytes([bytes[16], bytes[17]]) as usize;
    assert!(bytes.len() > 3 * page);
    for b in &mut bytes[page..] {
        *b = 0xA5;
    }
    std::fs::write(&path, &bytes).unwrap();

    let opened = SqliteLog::open(&path);
    let err = match opened {
        Err(e) => e,
        Ok(log) => {
            use seawall_saga::SagaLog;
            log.list(&ListQuery::all()).await.unwrap_err()
        }
    };
    assert!(matches!(err, LogError::Corrupt { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_from_a_newer_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sagas.db");
    drop(SqliteLog::open(&path).unwrap());
    // Wait for the writer thread to let go of the file by taking a write lock.
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.busy_timeout(Duration::from_secs(5)).unwrap();
        conn.execute(
            "UPDATE seawall_saga_meta SET value = '99' WHERE key = 'schema_version'",
            [],
        )
        .unwrap();
    }
    let err = SqliteLog::open(&path).unwrap_err();
    assert!(
        matches!(&err, LogError::UnsupportedSchema { found, supported: 1 } if found == "99"),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saga_log_reopens_with_its_sagas() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sagas.db");
    let saga = saga();
    {
        let o = Orchestrator::builder(SqliteLog::open(&path).unwrap())
            .saga(&saga)
            .build()
            .unwrap();
        o.start_with(&saga, 1, StartOptions::new().id("kept"))
            .await
            .unwrap();
    }
    let o = Orchestrator::builder(SqliteLog::open(&path).unwrap())
        .saga(&saga)
        .build()
        .unwrap();
    let outcome = o.resume(&SagaId::new("kept")).await.unwrap();
    assert_eq!(outcome.output::<u32>("one").unwrap(), 2);
}

#[tokio::test]
async fn unreachable_postgres_is_a_connect_error() {
    // A port that nothing listens on: bind, note it, close.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let err = PostgresLog::connect(
        &format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        PostgresOptions::new().connect_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    match &err {
        LogError::Connect { target, .. } => {
            assert_eq!(target, &format!("127.0.0.1:{port}/postgres"))
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(err
        .to_string()
        .starts_with("cannot connect to postgres at 127.0.0.1:"));
}

#[tokio::test]
async fn bad_postgres_settings_are_config_errors() {
    let err = PostgresLog::connect("postgres://[::1", PostgresOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(err, LogError::Config { .. }), "{err:?}");
    let err = PostgresLog::connect(
        "postgres://postgres@127.0.0.1:1/postgres",
        PostgresOptions::new().schema("Robert'); DROP TABLE students;--"),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, LogError::Config { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_postgres_schema_is_refused() {
    let schema = support::schema_name("foreign");
    support::reset_schema(&schema).await;
    let client = support::pg_client().await;
    client
        .batch_execute(&format!(
            "CREATE SCHEMA \"{schema}\";
             CREATE TABLE \"{schema}\".sagas (id int PRIMARY KEY, story text);
             INSERT INTO \"{schema}\".sagas VALUES (1, 'the odyssey');"
        ))
        .await
        .unwrap();
    let err = PostgresLog::connect(
        &support::postgres_url(),
        PostgresOptions::new().schema(&schema),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, LogError::Foreign { .. }), "{err:?}");
    let story: String = client
        .query_one(&format!("SELECT story FROM \"{schema}\".sagas"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(story, "the odyssey");
    let tables: i64 = client
        .query_one(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1",
            &[&schema],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 1, "nothing was created next to the foreign table");
    support::reset_schema(&schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_rows_in_postgres_are_reported() {
    let schema = support::schema_name("corrupt_rows");
    support::reset_schema(&schema).await;
    let log = support::pg_log(&schema, Duration::from_secs(5), "w").await;
    let saga = saga();
    let o = Orchestrator::builder(log).saga(&saga).build().unwrap();
    o.submit(&saga, 1, StartOptions::new().id("odd"))
        .await
        .unwrap();
    let client = support::pg_client().await;
    client
        .batch_execute(&format!(
            "UPDATE \"{schema}\".saga_transitions SET kind = 'teleported' WHERE saga_id = 'odd'"
        ))
        .await
        .unwrap();
    let err = o.history(&SagaId::new("odd")).await.unwrap_err();
    assert!(
        matches!(&err, seawall_saga::SagaError::Log(LogError::Corrupt { detail }) if detail.contains("teleported")),
        "{err:?}"
    );
    // Recovery reports the damaged saga and goes on with the others.
    o.submit(&saga, 2, StartOptions::new().id("plain"))
        .await
        .unwrap();
    let report = o.recover().await.unwrap();
    assert_eq!(report.outcomes.len(), 1);
    assert_eq!(report.outcomes[0].id, SagaId::new("plain"));
    assert_eq!(report.failures.len(), 1);
    assert_eq!(report.failures[0].saga_id, SagaId::new("odd"));
    assert!(
        matches!(
            &report.failures[0].error,
            seawall_saga::SagaError::Log(LogError::Corrupt { .. })
        ),
        "{:?}",
        report.failures[0].error
    );
    // Still there for an operator.
    assert!(o.get(&SagaId::new("odd")).await.unwrap().is_some());
    support::reset_schema(&schema).await;
}
