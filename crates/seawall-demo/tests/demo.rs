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
        "--redis",
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
fn with_redis_the_pipeline_state_lives_in_redis() {
    let Some(redis) = RedisServer::start() else {
        eprintln!("redis-server is not installed: skipped");
        return;
    };
    let url = format!("redis://127.0.0.1:{}/", redis.port);
    let output = demo(&["--duration", "8", "--clients", "8", "--redis", &url]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout(&output).contains("state in Redis"));
    let summary = json_line(&output, "SUMMARY ");
    let protected = &summary["groups"]["protected"];
    let unprotected = &summary["groups"]["unprotected"];
    assert!(
        protected["server_requests"].as_u64() < unprotected["server_requests"].as_u64(),
        "{summary}"
    );
    assert_eq!(protected["phases"]["failing"]["errors"], 0, "{protected}");
}

/// Whether `redis-server` can be started.
#[cfg(feature = "choreography")]
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
