//! Test support of the seawall workspace: a real `redis-server` per test,
//! on a free loopback port, in a temporary directory, killed on drop; and a
//! real Redis Cluster ([`RedisCluster`]: three masters with one replica
//! each, created with `redis-cli --cluster create`).
//!
//! The server binary is `$REDIS_SERVER`, or `redis-server` on the `PATH`;
//! the cluster is created with `$REDIS_CLI`, or `redis-cli` on the `PATH`
//! (`scripts/test.sh` installs Debian's packages). Every server listens on
//! 127.0.0.1 only and saves nothing. A server is killed when its
//! `RedisServer` is dropped; one that outlives its test process (held in a
//! `static`, or a process that was killed) is listed in
//! `$SEAWALL_TEST_SERVERS` (a directory, one empty file per process id),
//! which `scripts/test.sh` reads at its end to stop whatever is left.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod cluster;

pub use cluster::{ClusterNode, RedisCluster};

/// ACL rules that take functions from a user (`FUNCTION`, `FCALL`): a store
/// of that user runs its scripts by `EVALSHA`, as on a server before
/// Redis 7.
pub const WITHOUT_FUNCTIONS: [&str; 3] = ["-function", "-fcall", "-fcall_ro"];

/// The ACL rules of the user `name`, password `pw`, for `ACL SETUSER` or
/// a server's `--user` option: every command on every key and channel,
/// then `rules`.
pub fn acl_user(name: &str, rules: &[&str]) -> Vec<String> {
    [name, "on", ">pw", "~*", "&*", "+@all"]
        .iter()
        .chain(rules)
        .map(|r| r.to_string())
        .collect()
}

/// The `redis-server` binary: `$REDIS_SERVER`, or `redis-server` on the PATH.
fn binary() -> PathBuf {
    program("REDIS_SERVER", "redis-server", "redis-server")
}

/// `$variable`, or `name` on the PATH; panics naming the Debian package.
fn program(variable: &str, name: &str, package: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(variable) {
        return PathBuf::from(p);
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "{name} not found on the PATH (nor in ${variable}): these tests run a real \
             Redis server; install it with `apt-get install {package}`, as \
             scripts/test.sh does"
        )
    })
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free loopback port");
    listener.local_addr().expect("local address").port()
}

/// A running `redis-server` on 127.0.0.1.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    args: Vec<String>,
}

impl RedisServer {
    /// A server with default settings.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// A server with extra `redis-server` arguments (e.g. `--requirepass x`).
    pub fn start_with(args: &[&str]) -> RedisServer {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        for _ in 0..5 {
            let mut server = RedisServer {
                child: None,
                port: free_port(),
                dir: tempfile::tempdir().expect("temporary directory"),
                args: args.clone(),
            };
            if server.spawn() {
                return server;
            }
        }
        panic!("redis-server did not start on a free port after 5 tries");
    }

    /// Starts the process and waits until it answers PING (5 s at most).
    fn spawn(&mut self) -> bool {
        let child = Command::new(binary())
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        note_running(child.id());
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                let _ = status;
                self.child = None;
                return false;
            }
            if self.answers() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }

    fn answers(&self) -> bool {
        answers(self.port)
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server with SIGKILL (no shutdown, no save).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            note_stopped(c.id());
        }
    }

    /// Starts the server again on the same port (empty: nothing is saved).
    pub fn restart(&mut self) {
        self.kill();
        for _ in 0..50 {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server did not restart on port {}", self.port);
    }

    /// The process id (for SIGSTOP / SIGCONT).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server running").id()
    }

    /// Sends a signal with `kill(1)` (e.g. "STOP", "CONT").
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// A plain connection for inspection (as the default user).
    pub fn conn(&self) -> redis::Connection {
        self.conn_as(&self.url())
    }

    /// A plain connection through `url` (another user, a password).
    pub fn conn_as(&self, url: &str) -> redis::Connection {
        let client = redis::Client::open(url).expect("client");
        let c = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .expect("connect to the test server");
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `true` when something on 127.0.0.1:`port` answers `PING` (`+PONG`, or
/// `-NOAUTH` from a server with a password).
fn answers(port: u16) -> bool {
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(
        &([127, 0, 0, 1], port).into(),
        Duration::from_millis(200),
    ) else {
        return false;
    };
    use std::io::{Read, Write};
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 64];
    match stream.read(&mut buf) {
        Ok(n) if n > 0 => buf[0] == b'+' || buf[0] == b'-',
        _ => false,
    }
}

/// The file that lists a running server's process id, when the test
/// command asked for the list.
fn listed(pid: u32) -> Option<PathBuf> {
    std::env::var_os("SEAWALL_TEST_SERVERS").map(|dir| PathBuf::from(dir).join(pid.to_string()))
}

fn note_running(pid: u32) {
    if let Some(file) = listed(pid) {
        let _ = std::fs::write(file, b"");
    }
}

fn note_stopped(pid: u32) {
    if let Some(file) = listed(pid) {
        let _ = std::fs::remove_file(file);
    }
}

/// A name no other test uses (the process id and a counter), for key
/// prefixes and pipeline names.
pub fn unique(name: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}
