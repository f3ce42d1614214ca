//! The store as three processes (stock, payment, shipping) with three SQLite
//! databases, talking only through Redis Streams, while services are
//! SIGKILLed at seeded random moments and restarted: at the end every order
//! is fully done or fully undone in every database, and no effect happened
//! twice.
#![cfg(feature = "redis-streams")]

#[path = "../examples/store/service.rs"]
mod service;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use seawall_saga::broker::redis_streams::RedisStreams;
use seawall_test_redis::RedisServer;
use service::{Role, Summary};

/// Set in a child process: the service it runs.
const ROLE_VAR: &str = "SEAWALL_STORE_ROLE";
const ORDERS: u64 = 40;
const MAX_KILLS: u32 = 12;

/// Entry point of a service process. Does nothing unless started by the
/// chaos test (with `SEAWALL_STORE_ROLE` set).
#[test]
fn service_process_entry() {
    let Some(role) = std::env::var_os(ROLE_VAR) else {
        return;
    };
    let role = Role::parse(role.to_str().unwrap()).expect("a known service");
    let db = std::env::var_os("SEAWALL_STORE_DB").expect("SEAWALL_STORE_DB");
    let url = std::env::var("SEAWALL_STORE_REDIS").expect("SEAWALL_STORE_REDIS");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime
        .block_on(service::run(
            role,
            Path::new(&db),
            &url,
            std::future::pending(),
            |_| {},
        ))
        .expect("the service runs until killed");
}

/// A small deterministic generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The three running services; killed when dropped.
struct Services {
    children: Vec<Child>,
    dir: tempfile::TempDir,
    url: String,
}

impl Services {
    fn spawn(&self, role: Role) -> Child {
        let stderr = self.dir.path().join(format!("{}.stderr", role.name()));
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "service_process_entry",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE_VAR, role.name())
            .env("SEAWALL_STORE_DB", service::db_path(self.dir.path(), role))
            .env("SEAWALL_STORE_REDIS", &self.url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(stderr)
                    .unwrap(),
            )
            .spawn()
            .expect("spawn a service process")
    }

    /// SIGKILLs service `index` and starts it again.
    fn kill_and_restart(&mut self, index: usize) {
        let child = &mut self.children[index];
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
        self.children[index] = self.spawn(Role::ALL[index]);
    }

    /// Fails the test if a service exited on its own (an error).
    fn check_alive(&mut self) {
        for (index, child) in self.children.iter_mut().enumerate() {
            if let Some(status) = child.try_wait().unwrap() {
                let role = Role::ALL[index].name();
                let stderr =
                    std::fs::read_to_string(self.dir.path().join(format!("{role}.stderr")))
                        .unwrap_or_default();
                panic!("{role} exited with {status}: {stderr}");
            }
        }
    }
}

impl Drop for Services {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn every_order_is_done_or_undone_once_despite_sigkills() {
    let seed: u64 = std::env::var("STORE_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5EA_3A11);
    println!("seed {seed} (set STORE_CHAOS_SEED to replay)");
    let mut rng = Rng(seed);
    let redis = RedisServer::start();
    let mut services = Services {
        children: Vec::new(),
        dir: tempfile::tempdir().unwrap(),
        url: redis.url(),
    };
    for role in Role::ALL {
        let child = services.spawn(role);
        services.children.push(child);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let broker = RedisStreams::open(&redis.url()).unwrap();

    // Orders flow in one at a time while services are killed at random
    // moments (about one order in four), each restarted at once.
    let mut kills = Vec::new();
    let mut order = 0;
    while order < ORDERS || (kills.len() as u32) < MAX_KILLS {
        if order < ORDERS {
            runtime
                .block_on(service::place_order(&broker, order))
                .unwrap();
            order += 1;
        }
        std::thread::sleep(Duration::from_millis(10 + rng.below(40)));
        if (kills.len() as u32) < MAX_KILLS && rng.below(4) == 0 {
            let index = rng.below(3) as usize;
            services.kill_and_restart(index);
            kills.push(Role::ALL[index].name());
        }
    }
    println!("killed and restarted: {kills:?}");

    // Bounded wait until every order settled (a liveness bound, not a
    // timing assertion: the checks below are on the databases' content).
    let deadline = Instant::now() + Duration::from_secs(40);
    let summary: Summary = loop {
        services.check_alive();
        let summary = service::summary(services.dir.path(), ORDERS).unwrap();
        if summary.pending == 0 || Instant::now() > deadline {
            break summary;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    println!("{}", summary.json(ORDERS));
    assert_eq!(
        summary.duplicates, 0,
        "an effect happened twice: {summary:?}"
    );
    assert_eq!(
        summary.wrong, 0,
        "an order settled the wrong way: {summary:?}"
    );
    assert_eq!(
        summary.pending, 0,
        "orders neither done nor undone: {summary:?}"
    );
    let cancelled = (0..ORDERS).filter(|&o| !service::ships(o)).count() as u64;
    assert_eq!(summary.undone, cancelled, "{summary:?}");
    assert_eq!(summary.done, ORDERS - cancelled, "{summary:?}");
}
