//! Shared test support: a real Postgres server, fresh SQLite files and schemas,
//! a seeded random source.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use seawall_saga::{PostgresLog, PostgresOptions, SagaLog, SqliteLog};

/// The environment variable naming a running test server.
pub(crate) const POSTGRES_URL_VAR: &str = "SEAWALL_TEST_POSTGRES_URL";

pub(crate) fn script_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/lib/postgres.sh")
}

/// The server this test binary uses: `SEAWALL_TEST_POSTGRES_URL` when set,
/// otherwise one started with `scripts/lib/postgres.sh` (`pg_start`) and stopped
/// (`pg_stop`) when this process exits: the wrapper shell waits on a pipe whose
/// other end closes with the test process, even if it is killed.
pub(crate) fn postgres_url() -> String {
    static SERVER: OnceLock<Result<(String, Mutex<Child>), String>> = OnceLock::new();
    if let Ok(url) = std::env::var(POSTGRES_URL_VAR) {
        return url;
    }
    let server = SERVER.get_or_init(|| {
        let script = script_path();
        let mut child = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "source '{}' && pg_start && echo \"$SEAWALL_TEST_POSTGRES_URL\" && read -r _; pg_stop",
                script.display()
            ))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot run bash: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| format!("reading pg_start output: {e}"))?;
        let url = line.trim().to_owned();
        if !url.starts_with("postgres://") {
            return Err(format!("pg_start failed (output {url:?})"));
        }
        Ok((url, Mutex::new(child)))
    });
    match server {
        Ok((url, _)) => url.clone(),
        Err(e) => panic!("no postgres for the tests: {e}"),
    }
}

/// A schema name unique to this test and process.
pub(crate) fn schema_name(test: &str) -> String {
    let clean: String = test
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    let clean = &clean[..clean.len().min(40)];
    format!("t_{clean}_{}", std::process::id())
}

/// A client for direct queries, with its connection driven on the runtime.
pub(crate) async fn pg_client() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls)
        .await
        .expect("connect to the test postgres");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// Drops `schema` if it exists (for a clean start on a shared server).
pub(crate) async fn reset_schema(schema: &str) {
    pg_client()
        .await
        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .await
        .expect("drop schema");
}

pub(crate) async fn pg_log(schema: &str, lease: Duration, worker: &str) -> PostgresLog {
    PostgresLog::connect(
        &postgres_url(),
        PostgresOptions::new()
            .schema(schema)
            .lease(lease)
            .worker_name(worker),
    )
    .await
    .expect("connect postgres log")
}

/// Where a contract test keeps its log.
#[derive(Clone, Debug)]
pub(crate) enum Backend {
    Sqlite {
        path: PathBuf,
        _dir: Arc<tempfile::TempDir>,
    },
    Postgres {
        schema: String,
        lease: Duration,
    },
}

impl Backend {
    pub(crate) fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        Backend::Sqlite {
            path: dir.path().join("sagas.db"),
            _dir: Arc::new(dir),
        }
    }

    /// A fresh schema; leases are short so a second log instance can take over
    /// sagas of the first without a long wait.
    pub(crate) async fn postgres(test: &str) -> Self {
        let schema = schema_name(test);
        reset_schema(&schema).await;
        Backend::Postgres {
            schema,
            lease: Duration::from_millis(400),
        }
    }

    pub(crate) fn is_postgres(&self) -> bool {
        matches!(self, Backend::Postgres { .. })
    }

    /// A new log instance (a new worker) on the same storage.
    pub(crate) async fn open(&self) -> Arc<dyn SagaLog> {
        match self {
            Backend::Sqlite { path, .. } => {
                Arc::new(SqliteLog::open(path).expect("open sqlite log"))
            }
            Backend::Postgres { schema, lease } => {
                let worker = format!("worker-{}", seawall_saga::SagaId::generate());
                Arc::new(pg_log(schema, *lease, &worker).await)
            }
        }
    }
}

/// SplitMix64: small, seeded, reproducible.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}
