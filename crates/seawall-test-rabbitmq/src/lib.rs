//! Test support of the seawall workspace: a real `rabbitmq-server` on free
//! loopback ports, in a temporary directory ([`RabbitServer`]), one shared by
//! the tests of a test binary ([`shared`]), and a TCP [`Proxy`] in front of
//! it that a test cuts to make the broker go away and come back.
//!
//! The server is `$RABBITMQ_SERVER`, or Debian's
//! `/usr/lib/rabbitmq/bin/rabbitmq-server`, or `rabbitmq-server` on the
//! `PATH` (`scripts/test.sh` installs Debian's package); its Erlang port
//! mapper is `$EPMD`, or `epmd` on the `PATH`. Everything listens on
//! 127.0.0.1 only: the AMQP port, the Erlang distribution port and a port
//! mapper of the server's own (the machine's usual one on 4369 is neither
//! used nor needed). The node's name, its database, its logs, its
//! configuration, its plugin list (empty) and its Erlang cookie are in the
//! temporary directory.
//!
//! The server and its port mapper run under a small `sh` guard that holds
//! a pipe from the test process: when the test process ends, however it
//! ends, the pipe closes and the guard kills them. Their process ids are
//! also listed in `$SEAWALL_TEST_SERVERS` (a directory, one empty file per
//! process id), which `scripts/test.sh` reads at its end to stop whatever
//! is left.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a server may take to accept AMQP connections.
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// The `rabbitmq-server` script.
fn server_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("RABBITMQ_SERVER") {
        return PathBuf::from(p);
    }
    // Debian's /usr/sbin/rabbitmq-server switches to the `rabbitmq` user
    // when run as root; the script it runs does not.
    let debian = Path::new("/usr/lib/rabbitmq/bin/rabbitmq-server");
    if debian.is_file() {
        return debian.to_owned();
    }
    on_path("rabbitmq-server").unwrap_or_else(|| {
        panic!(
            "rabbitmq-server not found (nor $RABBITMQ_SERVER): these tests run a real \
             RabbitMQ; install it with `apt-get install rabbitmq-server`, as \
             scripts/test.sh does"
        )
    })
}

fn epmd_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("EPMD") {
        return PathBuf::from(p);
    }
    on_path("epmd").unwrap_or_else(|| {
        panic!("epmd not found on the PATH (nor $EPMD): it comes with rabbitmq-server's Erlang")
    })
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

/// Three distinct free loopback ports (held together while chosen).
fn free_ports() -> [u16; 3] {
    let listeners: Vec<TcpListener> = (0..3)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a free loopback port"))
        .collect();
    let port = |i: usize| listeners[i].local_addr().expect("local address").port();
    [port(0), port(1), port(2)]
}

/// The guard: starts the port mapper and the server, prints their process
/// ids, and kills both when its standard input closes, then removes the
/// temporary directory (a server held in a `static` is never dropped).
const GUARD: &str = r#"
"$SEAWALL_EPMD" -port "$ERL_EPMD_PORT" -address 127.0.0.1 </dev/null >"$SEAWALL_DIR/epmd.log" 2>&1 &
epmd=$!
"$SEAWALL_RABBITMQ" </dev/null >"$SEAWALL_DIR/server.log" 2>&1 &
server=$!
echo "$epmd $server"
read -r _ || true
kill -9 "$server" "$epmd" 2>/dev/null
wait
rm -rf "$SEAWALL_DIR"
"#;

/// A running `rabbitmq-server` on 127.0.0.1.
#[derive(Debug)]
pub struct RabbitServer {
    guard: Option<(Child, ChildStdin)>,
    pids: Vec<u32>,
    port: u16,
    dir: tempfile::TempDir,
}

impl RabbitServer {
    /// Starts a server and waits until it accepts AMQP connections.
    ///
    /// # Panics
    ///
    /// When the server does not start (the end of its log is shown).
    pub fn start() -> RabbitServer {
        let mut last = String::new();
        for _ in 0..3 {
            match Self::try_start() {
                Ok(server) => return server,
                Err(why) => last = why,
            }
        }
        panic!("rabbitmq-server did not start after 3 tries: {last}");
    }

    fn try_start() -> Result<RabbitServer, String> {
        let dir = tempfile::Builder::new()
            .prefix("seawall-rabbitmq.")
            .tempdir()
            .expect("temporary directory");
        let [port, dist_port, epmd_port] = free_ports();
        let path = dir.path();
        let home = path.join("home");
        std::fs::create_dir_all(&home).expect("home directory");
        let cookie = home.join(".erlang.cookie");
        std::fs::write(&cookie, format!("seawall{}{port}", std::process::id())).expect("cookie");
        set_private(&cookie);
        std::fs::write(
            path.join("rabbitmq.conf"),
            "disk_free_limit.absolute = 10MB\nlog.file.level = warning\n",
        )
        .expect("configuration");
        std::fs::write(path.join("enabled_plugins"), "[].\n").expect("plugin list");
        std::fs::write(path.join("rabbitmq-env.conf"), "").expect("env file");
        let node = format!("seawall-{}-{port}@localhost", std::process::id());
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(GUARD)
            .env("SEAWALL_DIR", path)
            .env("SEAWALL_EPMD", epmd_binary())
            .env("SEAWALL_RABBITMQ", server_binary())
            .env("HOME", &home)
            .env("ERL_EPMD_PORT", epmd_port.to_string())
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODENAME", &node)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", port.to_string())
            .env("RABBITMQ_DIST_PORT", dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", path.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", path.join("log"))
            .env("RABBITMQ_CONFIG_FILE", path.join("rabbitmq.conf"))
            .env(
                "RABBITMQ_ADVANCED_CONFIG_FILE",
                path.join("advanced.config"),
            )
            .env("RABBITMQ_CONF_ENV_FILE", path.join("rabbitmq-env.conf"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                path.join("enabled_plugins"),
            )
            .env("RABBITMQ_PLUGINS_EXPAND_DIR", path.join("plugins-expand"))
            // `exec` the VM (no shell in between, whose death would leave it
            // running), without reading its input; distribution on loopback.
            .env("RABBITMQ_ALLOW_INPUT", "1")
            .env(
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                "-noinput -kernel inet_dist_use_interface {127,0,0,1}",
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = command.spawn().expect("spawn sh for rabbitmq-server");
        let stdin = child.stdin.take().expect("guard input");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("guard output"))
            .read_line(&mut line)
            .expect("read the guard's output");
        let pids: Vec<u32> = line
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        for pid in &pids {
            note_running(*pid);
        }
        let mut server = RabbitServer {
            guard: Some((child, stdin)),
            pids,
            port,
            dir,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if amqp_answers(port) {
                return Ok(server);
            }
            if server.exited() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = server.log_tail();
        server.stop();
        Err(format!("not accepting AMQP on port {port}; log:\n{log}"))
    }

    /// Whether the server process has ended.
    fn exited(&self) -> bool {
        self.pids
            .last()
            .is_none_or(|pid| !Path::new(&format!("/proc/{pid}")).exists())
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// The AMQP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `amqp://guest:guest@127.0.0.1:<port>/%2f` (the default user, which
    /// RabbitMQ accepts from loopback only).
    pub fn url(&self) -> String {
        amqp_url(self.port)
    }

    /// Stops the server and its port mapper (SIGKILL: nothing to save).
    pub fn stop(&mut self) {
        if let Some((mut child, stdin)) = self.guard.take() {
            drop(stdin); // the guard kills both
            let _ = child.wait();
            for pid in &self.pids {
                note_stopped(*pid);
            }
        }
    }
}

impl Drop for RabbitServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `amqp://guest:guest@127.0.0.1:<port>/%2f`.
pub fn amqp_url(port: u16) -> String {
    format!("amqp://guest:guest@127.0.0.1:{port}/%2f")
}

/// The server of this test binary, started on first use and stopped when
/// the test process ends.
pub fn shared() -> &'static RabbitServer {
    static SERVER: OnceLock<RabbitServer> = OnceLock::new();
    SERVER.get_or_init(RabbitServer::start)
}

#[cfg(unix)]
fn set_private(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod cookie");
}

#[cfg(not(unix))]
fn set_private(_: &Path) {}

/// `true` when 127.0.0.1:`port` answers the AMQP 0-9-1 protocol header with
/// a method frame (`connection.start`).
fn amqp_answers(port: u16) -> bool {
    let Ok(mut stream) =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
    else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream.write_all(b"AMQP\x00\x00\x09\x01").is_err() {
        return false;
    }
    let mut first = [0u8; 1];
    matches!(stream.read(&mut first), Ok(1) if first[0] == 1)
}

/// The file that lists a running process id, when the test command asked
/// for the list.
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

/// A TCP proxy on 127.0.0.1 in front of a server: [`cut`](Proxy::cut) closes
/// every connection through it and refuses new ones (the broker went away,
/// as seen by its clients), [`restore`](Proxy::restore) listens again on the
/// same port.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    state: Arc<Mutex<ProxyState>>,
    stop: Arc<AtomicBool>,
}

#[derive(Debug)]
struct ProxyState {
    listener: Option<TcpListener>,
    /// Both ends of every connection made through the proxy.
    streams: Vec<TcpStream>,
    upstream: u16,
}

impl Proxy {
    /// A proxy to 127.0.0.1:`upstream`, listening on a free port.
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("proxy address").port();
        let state = Arc::new(Mutex::new(ProxyState {
            listener: Some(listener),
            streams: Vec::new(),
            upstream,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        {
            let state = Arc::clone(&state);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || accept_loop(&state, &stop));
        }
        Proxy { port, state, stop }
    }

    /// The proxy's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The AMQP URL through the proxy.
    pub fn url(&self) -> String {
        amqp_url(self.port)
    }

    /// Closes every connection through the proxy and stops listening.
    pub fn cut(&self) {
        let mut state = lock(&self.state);
        state.listener = None;
        for s in state.streams.drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Listens again on the same port.
    ///
    /// # Panics
    ///
    /// When the port cannot be bound again within 5 s.
    pub fn restore(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match TcpListener::bind(("127.0.0.1", self.port)) {
                Ok(listener) => {
                    listener.set_nonblocking(true).expect("nonblocking");
                    lock(&self.state).listener = Some(listener);
                    return;
                }
                Err(e) if Instant::now() > deadline => {
                    panic!("the proxy could not listen on {} again: {e}", self.port)
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.cut();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn accept_loop(state: &Mutex<ProxyState>, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        let accepted = {
            let state = lock(state);
            state
                .listener
                .as_ref()
                .and_then(|l| l.accept().ok())
                .map(|(client, _)| (client, state.upstream))
        };
        let Some((client, upstream)) = accepted else {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        };
        let _ = client.set_nonblocking(false);
        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (Ok(c2), Ok(s2), Ok(c3), Ok(s3)) = (
            client.try_clone(),
            server.try_clone(),
            client.try_clone(),
            server.try_clone(),
        ) else {
            continue;
        };
        {
            let mut state = lock(state);
            if state.listener.is_none() {
                // Cut while connecting.
                let _ = client.shutdown(Shutdown::Both);
                let _ = server.shutdown(Shutdown::Both);
                continue;
            }
            state.streams.push(c3);
            state.streams.push(s3);
        }
        std::thread::spawn(move || pipe(client, server));
        std::thread::spawn(move || pipe(s2, c2));
    }
}

/// Copies `from` to `to` until either closes, then closes both.
fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
