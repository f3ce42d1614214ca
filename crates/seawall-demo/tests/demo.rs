//! Runs the demo binary as a user would and checks what it prints.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

const DEMO: &str = env!("CARGO_BIN_EXE_seawall-demo");

fn demo(args: &[&str]) -> Output {
    Command::new(DEMO)
        .args(args)
        .env_remove("NO_COLOR")
        .output()
        .expect("the demo binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The JSON after `prefix` on the line that starts with it.
fn json_line(output: &Output, prefix: &str) -> Value {
    let text = stdout(output);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no `{prefix}` line in:\n{text}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("`{prefix}` is not JSON ({e}): {line}"))
}

fn temp_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()))
}

/// Asserts a bad-input exit: code 2 and exactly one line on stderr, no panic.
fn assert_bad_input(output: &Output) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "stderr: {stderr}");
    assert_eq!(
        stderr.lines().count(),
        1,
        "one line expected, got: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn the_protected_group_spares_the_service_and_its_callers() {
    let output = demo(&["--duration", "12"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = stdout(&output);
    assert!(
        !text.contains('\x1b'),
        "no colours when stdout is not a terminal"
    );
    for expected in [
        ">> circuit OPEN",
        ">> circuit closed",
        "| circuit OPEN",
        "fallback",
        "summary",
        "per phase",
    ] {
        assert!(
            text.contains(expected),
            "`{expected}` missing from:\n{text}"
        );
    }
    // A view of the state, not a scroll: two status lines a second, the
    // changes of state, five banners, the introduction and the summary.
    let lines = text.lines().count();
    assert!(lines < 12 * 2 + 60 + 40, "{lines} lines:\n{text}");

    let summary = json_line(&output, "SUMMARY ");
    let unprotected = &summary["groups"]["unprotected"];
    let protected = &summary["groups"]["protected"];
    let reached = |g: &Value| g["server_requests"].as_u64().expect("server_requests");
    assert!(
        reached(protected) < reached(unprotected),
        "protected {} vs unprotected {} requests",
        reached(protected),
        reached(unprotected)
    );
    assert!(protected["calls"].as_u64() > Some(100), "{protected}");
    // The closing sentence counts the fallback answers as such.
    let fallbacks = protected["fallbacks"].as_u64().expect("fallbacks");
    assert!(fallbacks > 0, "{protected}");
    assert!(
        text.contains(&format!("{fallbacks} fallback answers")),
        "the conclusion hides the {fallbacks} fallback answers:\n{text}"
    );

    let failing = &protected["phases"]["failing"];
    assert_eq!(
        failing["errors"], 0,
        "protected callers saw errors while the service failed: {failing}"
    );
    assert!(failing["fallbacks"].as_u64() > Some(0), "{failing}");
    assert!(
        unprotected["phases"]["failing"]["errors"].as_u64() > Some(0),
        "{unprotected}"
    );
}

#[test]
fn herd_peaks_shrink_with_jitter_and_the_chart_is_drawn() {
    let out = temp_path("herd.svg");
    let output = demo(&[
        "herd",
        "--clients",
        "1000",
        "--seed",
        "42",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let herd = json_line(&output, "HERD ");
    let peak = |key: &str| {
        herd["peaks"][key]
            .as_u64()
            .unwrap_or_else(|| panic!("no peak `{key}`: {herd}"))
    };
    assert_eq!(
        peak("none"),
        1000,
        "without jitter every client retries at once"
    );
    // +/-20 % spreads the first retry over 400 ms, 4 buckets of 100 ms:
    // about 250 each, a few standard deviations (~14) either way.
    let proportional = peak("proportional_20");
    assert!(
        (200..=330).contains(&proportional),
        "+/-20 % peak {proportional}"
    );
    let full = peak("full");
    assert!(
        full < proportional,
        "full jitter peak {full} vs +/-20 % {proportional}"
    );

    let svg = std::fs::read_to_string(&out).expect("the chart is written");
    let _ = std::fs::remove_file(&out);
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
    assert_balanced(&svg);
    assert_eq!(svg.matches(r#"class="series""#).count(), 3);
}

/// Every element opened is closed, in order (a minimal XML well-formedness check).
fn assert_balanced(svg: &str) {
    let mut open: Vec<&str> = Vec::new();
    let mut rest = svg;
    while let Some(start) = rest.find('<') {
        let end = rest[start..].find('>').expect("an unterminated tag") + start;
        let tag = &rest[start + 1..end];
        rest = &rest[end + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(
                open.pop(),
                Some(name.trim()),
                "</{name}> closes the wrong element"
            );
        } else if !tag.ends_with('/') && !tag.starts_with('?') && !tag.starts_with('!') {
            open.push(tag.split_whitespace().next().expect("a tag name"));
        }
    }
    assert!(open.is_empty(), "unclosed elements: {open:?}");
}

#[test]
fn an_unknown_option_is_one_line_and_exit_code_2() {
    let output = demo(&["--no-such-option"]);
    assert_bad_input(&output);
    assert!(String::from_utf8_lossy(&output.stderr).contains("--no-such-option"));
    assert_bad_input(&demo(&["herd", "--clients", "many"]));
}

#[cfg(feature = "web")]
#[test]
fn a_busy_port_for_the_page_is_one_line_and_exit_code_2() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port().to_string();
    let output = demo(&["--web", "--port", &port, "--duration", "5"]);
    assert_bad_input(&output);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--port 0"),
        "the error says how to get a free port"
    );
}

#[test]
fn an_unwritable_chart_is_one_line_and_exit_code_2() {
    // A path under a regular file cannot be created.
    let file = temp_path("not-a-directory");
    std::fs::write(&file, b"").unwrap();
    let out = file.join("herd.svg");
    let output = demo(&["herd", "--clients", "10", "--out", out.to_str().unwrap()]);
    let _ = std::fs::remove_file(&file);
    assert_bad_input(&output);
}

#[test]
fn an_unreachable_redis_is_one_line_and_exit_code_2() {
    // Port 1 on the loopback: nothing listens there.
    assert_bad_input(&demo(&[
        "--duration",
        "5",
        "--redis-url",
        "redis://127.0.0.1:1/",
    ]));
}

#[cfg(feature = "saga")]
#[test]
fn a_saga_batch_killed_halfway_is_recovered_without_repeating_effects() {
    let db = temp_path("saga.db");
    let output = demo(&["saga", "--orders", "6", "--db", db.to_str().unwrap()]);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = stdout(&output);
    assert!(text.contains("the first run died"), "{text}");

    let saga = json_line(&output, "SAGA ");
    assert_eq!(saga["completed"], 4, "{saga}");
    assert_eq!(saga["compensated"], 2, "{saga}");
    assert_eq!(
        saga["consistent"], 6,
        "status and effects agree for every order: {saga}"
    );
    assert!(saga["recovered"].as_u64() >= Some(1), "{saga}");
    assert!(
        saga["repeats"].as_u64() >= Some(1),
        "a repeat was recognised by its key: {saga}"
    );
    assert_eq!(
        saga["effects"]["charged"], 6,
        "nobody was charged twice: {saga}"
    );
    assert_eq!(saga["effects"]["refunded"], 2, "{saga}");
}

/// A `redis-server` on a free loopback port, stopped on drop.
#[cfg(feature = "redis")]
struct RedisServer {
    child: std::process::Child,
    port: u16,
}

#[cfg(feature = "redis")]
impl RedisServer {
    /// `None` when `redis-server` is not installed.
    fn start() -> Option<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let server = RedisServer { child, port };
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(server);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("redis-server did not start on port {port}");
    }
}

#[cfg(feature = "redis")]
impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(feature = "redis")]
#[test]
fn with_a_redis_url_the_pipeline_state_lives_in_that_redis() {
    let Some(redis) = RedisServer::start() else {
        eprintln!("redis-server is not installed: skipped");
        return;
    };
    let url = format!("redis://127.0.0.1:{}/", redis.port);
    let (pid, output) = demo_with_pid(&["--duration", "5", "--clients", "8", "--redis-url", &url]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = stdout(&output);
    assert!(text.contains("first  | 8 protected clients"), "{text}");
    assert!(text.contains(&format!("state in Redis at {url}")), "{text}");
    let summary = json_line(&output, "first  | SUMMARY ");
    let protected = &summary["groups"]["protected"];
    let unprotected = &summary["groups"]["unprotected"];
    assert!(
        protected["server_requests"].as_u64() < unprotected["server_requests"].as_u64(),
        "{summary}"
    );
    assert_eq!(protected["phases"]["failing"]["errors"], 0, "{protected}");
    // The circuit's state and the last good answer were kept there.
    let keys = redis_keys(redis.port);
    let answer = format!("seawall-demo-{pid}:demo:last-good-answer");
    assert!(keys.contains(&answer), "{keys:?}");
    // The circuit's keys, hash-tagged by prefix and pipeline name.
    assert!(
        keys.iter()
            .any(|k| k.starts_with(&format!("{{seawall-demo-{pid}:flaky-service}}"))),
        "no state of the pipeline: {keys:?}"
    );
    assert!(
        text.contains(&format!("(prefix seawall-demo-{pid})")),
        "the second process shares the prefix:\n{text}"
    );
}

/// Runs the demo to its end; its process id and output.
#[cfg(feature = "redis")]
fn demo_with_pid(args: &[&str]) -> (u32, Output) {
    let child = Command::new(DEMO)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the demo binary runs");
    let pid = child.id();
    (pid, child.wait_with_output().expect("the demo ends"))
}

/// Every key of the Redis on `port` (`KEYS *` over RESP).
#[cfg(feature = "redis")]
fn redis_keys(port: u16) -> Vec<String> {
    use std::io::{BufRead, BufReader, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("redis answers");
    stream.write_all(b"KEYS *\r\n").unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let count: usize = line.trim_end()[1..].parse().expect("an array reply");
    (0..count)
        .map(|_| {
            let (mut size, mut key) = (String::new(), String::new());
            reader.read_line(&mut size).unwrap();
            reader.read_line(&mut key).unwrap();
            key.trim_end().to_owned()
        })
        .collect()
}

#[cfg(feature = "redis")]
#[test]
fn a_second_process_is_refused_by_the_circuit_the_first_opened() {
    if !redis_installed() {
        eprintln!("redis-server is not installed: skipped");
        return;
    }
    let (pid, output) = demo_with_pid(&["--redis", "--duration", "10", "--clients", "8"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = stdout(&output);
    for line in text.lines() {
        assert!(
            line.starts_with("first  | ") || line.starts_with("second | "),
            "a line of neither process: {line}"
        );
    }
    assert!(
        text.contains("first  | >> the circuit is open: second process started"),
        "{text}"
    );
    // The second process learnt the circuit was open from a refusal, not
    // from failures of its own (or, when it started late enough to draw the
    // first probe, from that probe).
    let first_change = text
        .lines()
        .find(|l| l.starts_with("second | ") && l.contains(">> circuit"))
        .unwrap_or_else(|| panic!("the second process saw no circuit:\n{text}"));
    assert!(
        first_change.contains("circuit OPEN in the shared store")
            || first_change.contains("circuit half-open"),
        "{first_change}"
    );
    assert!(
        text.contains("second | the fallback's last good answer, from Redis: EUR/USD"),
        "{text}"
    );

    let second = json_line(&output, "second | SECOND ");
    assert_eq!(second["phase"], "failing", "{second}");
    let n = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"));
    assert!(n(&second["calls"]) > 0, "{second}");
    assert!(
        n(&second["rejections"]["circuit_open"]) > 0,
        "refused by the open circuit: {second}"
    );
    assert_eq!(
        second["errors"], 0,
        "the fallback answered every call: {second}"
    );
    assert_eq!(second["answered"], 0, "the service was failing: {second}");
    // Requests only as the probe of the half-open circuit (when the second
    // process drew it): none while the circuit was open. A probe goes after
    // each cooldown (500 ms in a 10 s run) over a phase of 2 s.
    let probes = n(&second["probes"]);
    assert!(
        n(&second["server_requests"]) <= probes && probes <= 6,
        "{second}"
    );
    // And so says the service, which counts the second process apart.
    let first = json_line(&output, "first  | SUMMARY ");
    let seen = n(&first["second_process"]["server_requests"]);
    assert!(seen <= probes, "the service saw {seen} requests: {first}");
    assert_eq!(
        first["groups"]["protected"]["phases"]["failing"]["errors"],
        0
    );
    // The demo's own redis-server is gone, its directory too.
    let dir = std::env::temp_dir().join(format!("seawall-demo-redis-{pid}"));
    assert!(!dir.exists(), "{} is left", dir.display());
}

/// Whether `redis-server` can be started.
#[cfg(any(feature = "redis", feature = "choreography"))]
fn redis_installed() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[cfg(feature = "choreography")]
#[test]
fn choreography_settles_every_order_once() {
    if !redis_installed() {
        eprintln!("redis-server is not installed: skipped");
        return;
    }
    // The demo bounds its own wait for the orders to settle (30 s).
    let output = demo(&["choreography", "--orders", "12"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = stdout(&output);
    for line in ["stock    order   3 released", "payment  order   3 refunded"] {
        assert!(text.contains(line), "no `{line}` in:\n{text}");
    }
    let summary = json_line(&output, "CHOREOGRAPHY ");
    assert_eq!(summary["orders"], 12, "{summary}");
    assert_eq!(summary["done"], 10, "{summary}");
    assert_eq!(
        summary["undone"], 2,
        "orders 3 and 8 are cancelled: {summary}"
    );
    assert_eq!(summary["pending"], 0, "{summary}");
    assert_eq!(summary["duplicates"], 0, "{summary}");
    assert_eq!(summary["wrong"], 0, "{summary}");
}

#[cfg(feature = "choreography")]
#[test]
fn choreography_without_redis_server_is_a_one_line_error() {
    let output = Command::new(DEMO)
        .args(["choreography", "--orders", "2"])
        .env("PATH", "")
        .output()
        .expect("the demo binary runs");
    assert_bad_input(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("redis-server"), "{stderr}");
}

#[cfg(feature = "choreography")]
#[test]
fn choreography_refuses_a_bad_order_count() {
    assert_bad_input(&demo(&["choreography", "--orders", "0"]));
}

/// A demo that goes on after its run (`--web` serves its page until
/// Ctrl-C): its stdout line by line; killed on drop.
#[cfg(feature = "web")]
struct Serving {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    seen: String,
}

#[cfg(feature = "web")]
impl Serving {
    fn start(args: &[&str]) -> Self {
        use std::io::BufRead;
        let mut child = Command::new(DEMO)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("the demo binary runs");
        let stdout = child.stdout.take().expect("piped");
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Serving {
            child,
            lines,
            seen: String::new(),
        }
    }

    /// The next line that contains `needle`. The demo bounds its own run;
    /// the minute only keeps a hung demo from hanging the test.
    fn wait_for(&mut self, needle: &str) -> String {
        loop {
            match self.lines.recv_timeout(std::time::Duration::from_secs(60)) {
                Ok(line) => {
                    self.seen.push_str(&line);
                    self.seen.push('\n');
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(e) => panic!("no line with `{needle}` ({e}) in:\n{}", self.seen),
            }
        }
    }
}

#[cfg(feature = "web")]
impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The headless Chromium to load the page with: `SEAWALL_TEST_CHROMIUM`
/// (set by scripts/test.sh, which installs it), else `chromium` on the PATH.
#[cfg(feature = "web")]
fn chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SEAWALL_TEST_CHROMIUM") {
        return Some(path.into());
    }
    Command::new("chromium")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
        .then(|| PathBuf::from("chromium"))
}

/// The DOM of `url` once its scripts had 10 s of virtual time (fetches
/// pause that clock, so the page has drawn what it fetched).
#[cfg(feature = "web")]
fn dump_dom(chromium: &std::path::Path, url: &str, profile: &str) -> String {
    let profile = temp_path(profile);
    let output = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=10000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--dump-dom", url])
        .output()
        .expect("chromium runs");
    let _ = std::fs::remove_dir_all(&profile);
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("the DOM is UTF-8")
}

/// An element of a serialised DOM: its attributes and the text up to its
/// first child.
#[cfg(feature = "web")]
#[derive(Debug)]
struct Element {
    attributes: std::collections::HashMap<String, String>,
    text: String,
}

#[cfg(feature = "web")]
impl Element {
    fn attribute(&self, name: &str) -> &str {
        self.attributes
            .get(name)
            .unwrap_or_else(|| panic!("no `{name}` in {self:?}"))
    }

    /// A `data-*` attribute as a number.
    fn number(&self, name: &str) -> f64 {
        let raw = self.attribute(name);
        raw.parse()
            .unwrap_or_else(|_| panic!("`{name}` = `{raw}` is not a number"))
    }

    fn count(&self, name: &str) -> u64 {
        let raw = self.attribute(name);
        raw.parse()
            .unwrap_or_else(|_| panic!("`{name}` = `{raw}` is not a count"))
    }
}

/// The element with `id` in `dom` (as Chromium serialises it: attributes in
/// double quotes, `"` written `&quot;`).
#[cfg(feature = "web")]
fn element(dom: &str, id: &str) -> Element {
    let marker = format!(" id=\"{id}\"");
    let at = dom
        .find(&marker)
        .unwrap_or_else(|| panic!("no element `{id}` in the page:\n{dom}"));
    let start = dom[..at].rfind('<').expect("a tag");
    let end = at + dom[at..].find('>').expect("a closed tag");
    let mut attributes = std::collections::HashMap::new();
    let mut rest = dom[start + 1..end].trim_end_matches('/');
    rest = rest.trim_start_matches(|c: char| !c.is_whitespace());
    while let Some(eq) = rest.find('=') {
        let name = rest[..eq].trim().to_owned();
        let value_start = eq + rest[eq..].find('"').expect("a quoted value") + 1;
        let value_end = value_start + rest[value_start..].find('"').expect("a closing quote");
        attributes.insert(name, rest[value_start..value_end].replace("&quot;", "\""));
        rest = &rest[value_end + 1..];
    }
    let after = &dom[end + 1..];
    let text = after[..after.find('<').unwrap_or(after.len())].to_owned();
    Element { attributes, text }
}

/// The body of `GET path` on the page's server.
#[cfg(feature = "web")]
fn http_get(base: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let host = base.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = std::net::TcpStream::connect(host).expect("the page's server answers");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("a response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

#[cfg(feature = "web")]
#[test]
fn the_live_page_draws_what_the_summary_says() {
    let Some(chromium) = chromium() else {
        eprintln!("chromium is not installed: skipped");
        return;
    };
    let mut demo = Serving::start(&["--web", "--port", "0", "--duration", "8", "--clients", "8"]);
    let url = demo
        .wait_for("live page: http://127.0.0.1:")
        .rsplit(' ')
        .next()
        .expect("a URL")
        .to_owned();
    let groups = ["unprotected", "protected"];

    // While the run goes on, the page draws the seconds so far.
    demo.wait_for("phase 3/5");
    let dom = dump_dom(&chromium, &url, "chromium-running");
    let state = element(&dom, "run-state");
    assert!(
        ["running", "done"].contains(&state.attribute("data-value")),
        "{state:?}"
    );
    let drawn = state.count("data-seconds");
    assert!(drawn >= 2, "{drawn} seconds drawn at phase 3: {state:?}");
    assert_eq!(element(&dom, "chart-requests").count("data-points"), drawn);
    let calls_then: Vec<u64> = groups
        .iter()
        .map(|g| element(&dom, &format!("{g}-calls")).count("data-value"))
        .collect();

    // Once it is over, the page shows the summary, to the last call.
    let summary_line = demo.wait_for("SUMMARY ");
    let summary: Value = serde_json::from_str(
        summary_line
            .strip_prefix("SUMMARY ")
            .expect("a SUMMARY line"),
    )
    .expect("SUMMARY is JSON");
    demo.wait_for("the live page stays up");
    let json: Value = serde_json::from_str(&http_get(&url, "/summary.json")).expect("JSON");
    assert_eq!(
        json["summary"], summary,
        "/summary.json holds the SUMMARY line"
    );
    assert_eq!(json["run"]["state"], "done");
    let dom = dump_dom(&chromium, &url, "chromium-done");
    let state = element(&dom, "run-state");
    assert_eq!(state.attribute("data-value"), "done", "{state:?}");
    let seconds = json["seconds"].as_array().expect("seconds");
    assert_eq!(state.count("data-seconds"), seconds.len() as u64);
    assert!(seconds.len() as u64 >= drawn);

    let count = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"));
    for (g, then) in groups.iter().zip(calls_then) {
        let figures = &summary["groups"][g];
        for (id, expected) in [
            ("calls", &figures["calls"]),
            ("answered", &figures["answered"]),
            ("fallbacks", &figures["fallbacks"]),
            ("circuit_open", &figures["rejections"]["circuit_open"]),
            ("errors", &figures["errors"]),
            ("server_requests", &figures["server_requests"]),
        ] {
            let cell = element(&dom, &format!("{g}-{id}"));
            assert_eq!(cell.count("data-value"), count(expected), "{g}-{id}");
            assert_eq!(cell.text, cell.attribute("data-value"), "{g}-{id}");
        }
        assert!(then <= count(&figures["calls"]), "{g}: {then} calls midway");
        for q in ["p50", "p99"] {
            let shown = element(&dom, &format!("{g}-{q}")).number("data-value");
            let expected = figures["latency_ms"][q].as_f64().expect("a latency");
            assert!(
                (shown - expected).abs() < 1e-9,
                "{g} {q}: {shown} vs {expected}"
            );
        }
        // The seconds drawn add up to the summary's totals.
        let requests = element(&dom, "chart-requests");
        assert_eq!(
            requests.count(&format!("data-sum-{g}")),
            count(&figures["server_requests"]),
            "requests drawn for {g}"
        );
        let answers = element(&dom, &format!("chart-answers-{g}"));
        assert_eq!(answers.count("data-sum-fresh"), count(&figures["answered"]));
        assert_eq!(
            answers.count("data-sum-fallback"),
            count(&figures["fallbacks"])
        );
        assert_eq!(answers.count("data-sum-errors"), count(&figures["errors"]));
        let sick: u64 = ["failing", "slow", "throttling"]
            .iter()
            .map(|p| count(&figures["phases"][p]["server_requests"]))
            .sum();
        assert_eq!(
            element(&dom, &format!("sick-{g}")).count("data-value"),
            sick
        );
    }
    // The protected callers spared the service, and saw no error.
    let reached = |g: &str| count(&summary["groups"][g]["server_requests"]);
    assert!(reached("protected") < reached("unprotected"), "{summary}");
    assert_eq!(summary["groups"]["protected"]["errors"], 0, "{summary}");

    // The circuit band: as many stretches as changes plus one, the time in
    // each state computed by the page as by the demo.
    let band = element(&dom, "circuit-band");
    let circuit = &json["circuit"];
    assert!(count(&circuit["opened"]) >= 1, "{circuit}");
    assert_eq!(band.count("data-opened"), count(&circuit["opened"]));
    assert_eq!(
        band.count("data-segments"),
        circuit["transitions"]
            .as_array()
            .expect("transitions")
            .len() as u64
            + 1
    );
    for state in ["closed", "open", "half_open"] {
        assert_eq!(
            band.count(&format!("data-ms-{}", state.replace('_', "-"))),
            count(&circuit["ms"][state]),
            "{state}"
        );
    }
    let total: u64 = ["closed", "open", "half_open"]
        .iter()
        .map(|s| count(&circuit["ms"][s]))
        .sum();
    assert!(total >= count(&json["run"]["elapsed_ms"]), "{circuit}");

    // Latency: a point per second with calls, per group and quantile.
    let latency = element(&dom, "chart-latency");
    let points: u64 = seconds
        .iter()
        .flat_map(|s| groups.iter().map(move |g| &s[g]))
        .map(|g| u64::from(!g["p50"].is_null()) + u64::from(!g["p99"].is_null()))
        .sum();
    assert_eq!(latency.count("data-points"), points);
    assert_eq!(latency.count("data-lines"), 4);

    // The herd next to it: the peaks of the `herd` subcommand, its chart.
    for (key, peak) in json["herd"]["peaks"].as_object().expect("peaks") {
        assert_eq!(
            element(&dom, &format!("herd-peak-{key}")).count("data-value"),
            count(peak),
            "{key}"
        );
    }
    assert_eq!(json["herd"]["peaks"]["none"], 1000);
    let herd = &dom[dom.find("id=\"herd-chart\"").expect("the herd chart")..];
    assert!(
        herd.starts_with("id=\"herd-chart\"><svg"),
        "{}",
        &herd[..200]
    );
    assert_eq!(
        herd[..herd.find("</svg>").expect("a whole chart")]
            .matches("class=\"series\"")
            .count(),
        3
    );
}
