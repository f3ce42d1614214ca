//! Four processes on one shared GCRA limit, in leased mode (and, for
//! comparison, in exact mode): admissions per second in all, script calls
//! per admission, and the overshoot measured against the stated bound.
//!
//! ```text
//! cargo run --release -p seawall-redis --example leased_bench [-- --limit 150000 --burst 5000 --batch 1000 --seconds 3 --threads 1 --exact --url redis://127.0.0.1:6379]
//! ```
//!
//! Without `--url`, starts its own `redis-server` (from the PATH) on a free
//! loopback port and stops it at the end. Each process calls a trivial
//! operation through a pipeline with only the rate limiter
//! (`RateLimiter::gcra(limit, 1 s).burst(burst)`), as fast as it can, on
//! `--threads` threads (sync `call`), for `--seconds`, all four started
//! together. Each counts its admissions per millisecond of the wall clock
//! (the instant `call` returned); the parent adds them up and reports the
//! densest second (1000 consecutive milliseconds) against:
//! - the exact bound: fewer than `burst + limit` admissions in any second;
//! - the leased bound: fewer than that plus `4 × (batch + low_water +
//!   threads)` (what the four processes can hold at once, and the calls
//!   under way).
//!
//! Before that, the cost of one admission from the batch, on the store's
//! state directly (`ResourceState::admit`, no pipeline), in one thread.
//!
//! Counting by whole milliseconds, a span of 1000 of them stands for the
//! spans of one second that start within its first millisecond.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use seawall::{Pipeline, RateLimiter};
use seawall_redis::{Leasing, RedisStore};
use seawall_test_redis::RedisServer as Server;

#[path = "support/cli.rs"]
mod cli;

struct Args {
    url: Option<String>,
    limit: u32,
    burst: u32,
    batch: u32,
    seconds: u64,
    threads: usize,
    exact: bool,
    child: bool,
    prefix: String,
    start_ms: u64,
}

fn args() -> Args {
    let mut a = Args {
        url: std::env::var("SEAWALL_REDIS_URL").ok(),
        limit: 150_000,
        burst: 5_000,
        batch: 1_000,
        seconds: 3,
        threads: 1,
        exact: false,
        child: false,
        prefix: format!("leased-bench-{}", std::process::id()),
        start_ms: 0,
    };
    let parsed = parse(&mut a);
    cli::or_usage(NAME, USAGE, parsed);
    a
}

const NAME: &str = "leased_bench";
const USAGE: &str = "[--limit N] [--burst N] [--batch N] [--seconds N] [--threads N] [--exact] [--url redis://127.0.0.1:6379]";

fn parse(a: &mut Args) -> Result<(), cli::Error> {
    use cli::*;
    let mut p = Parser::from_env();
    while let Some(arg) = p.next()? {
        match arg {
            Long("url") => a.url = Some(p.value()?.string()?),
            Long("limit") => a.limit = p.value()?.parse()?,
            Long("burst") => a.burst = p.value()?.parse()?,
            Long("batch") => a.batch = p.value()?.parse()?,
            Long("seconds") => a.seconds = p.value()?.parse()?,
            Long("threads") => a.threads = p.value()?.parse()?,
            Long("exact") => a.exact = true,
            Long("child") => a.child = true,
            Long("prefix") => a.prefix = p.value()?.string()?,
            Long("start-ms") => a.start_ms = p.value()?.parse()?,
            Short('h') | Long("help") => help(NAME, USAGE),
            _ => return Err(arg.unexpected()),
        }
    }
    let counts = [
        ("limit", u64::from(a.limit)),
        ("burst", u64::from(a.burst)),
        ("batch", u64::from(a.batch)),
        ("seconds", a.seconds),
        ("threads", a.threads as u64),
    ];
    match counts.iter().find(|(_, n)| *n == 0) {
        Some((name, _)) => Err(format!("--{name} must be > 0").into()),
        None => Ok(()),
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn script_calls(url: &str) -> u64 {
    let client = redis::Client::open(url).unwrap();
    let mut c = client.get_connection().unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut c)
        .unwrap();
    info.lines()
        .filter(|l| {
            ["cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"]
                .iter()
                .any(|c| l.starts_with(c))
        })
        .filter_map(|l| {
            l.split(',')
                .find_map(|kv| kv.split_once("calls=").map(|(_, n)| n.parse::<u64>().ok()))
        })
        .flatten()
        .sum()
}

fn low_water(batch: u32) -> u32 {
    batch / 2
}

/// The pipeline every process calls through: the shared GCRA limit, in
/// leased mode unless `--exact`. A setting the store or the limiter
/// refuses is a usage error.
fn pipeline(a: &Args, url: &str) -> Result<Pipeline, cli::Error> {
    let mut b = RedisStore::builder(url)
        .prefix(&a.prefix)
        .timeout(Duration::from_secs(1))
        .fail_closed();
    if !a.exact {
        b = b.leased(
            "shared-limit",
            Leasing::batch(a.batch).low_water(low_water(a.batch)),
        );
    }
    let store = b.build().map_err(|e| e.to_string())?;
    let p = Pipeline::builder("shared-limit")
        .rate_limiter(RateLimiter::gcra(a.limit, Duration::from_secs(1)).burst(a.burst))
        .store(store)
        .build()
        .map_err(|e| e.to_string())?;
    Ok(p)
}

/// Calls from `start_ms` for `seconds`; prints the admissions per
/// millisecond from `start_ms` and the refusals.
fn child(a: &Args, url: &str) {
    let p = pipeline(a, url).unwrap_or_else(|e| cli::or_usage(NAME, USAGE, Err(e)));
    let now = unix_ms();
    if a.start_ms > now {
        std::thread::sleep(Duration::from_millis(a.start_ms - now));
    }
    let span = a.seconds * 1000;
    let results: Vec<(Vec<u32>, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..a.threads)
            .map(|_| {
                let p = &p;
                s.spawn(move || {
                    let mut per_ms = vec![0u32; span as usize];
                    let mut refused = 0u64;
                    let origin = UNIX_EPOCH + Duration::from_millis(a.start_ms);
                    loop {
                        let r = p.call(|_| Ok::<_, std::io::Error>(std::hint::black_box(1)));
                        let at = SystemTime::now()
                            .duration_since(origin)
                            .unwrap_or_default()
                            .as_millis() as u64;
                        if at >= span {
                            break;
                        }
                        match r {
                            Ok(_) => per_ms[at as usize] += 1,
                            Err(_) => refused += 1,
                        }
                    }
                    (per_ms, refused)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut per_ms = vec![0u64; span as usize];
    let mut refused = 0;
    for (counts, r) in results {
        for (total, c) in per_ms.iter_mut().zip(counts) {
            *total += u64::from(c);
        }
        refused += r;
    }
    let list: Vec<String> = per_ms.iter().map(u64::to_string).collect();
    println!("REFUSED {refused}");
    println!("PER_MS {}", list.join(","));
}

/// The cost of one admission from the batch, on the store's state
/// directly (no pipeline), in one thread.
fn local_cost(url: &str, prefix: &str) {
    use seawall::store::{AdmitRequest, ResourceSpec};
    use seawall::StateStore;
    let store = RedisStore::builder(url)
        .prefix(format!("{prefix}-local"))
        .leased("local-cost", Leasing::batch(1_000_000))
        .build()
        .unwrap();
    let spec = ResourceSpec::new("local-cost")
        .with_rate_limit(RateLimiter::gcra(100_000_000, Duration::from_secs(1)).burst(10_000_000));
    let state = store.bind(&spec).unwrap();
    let request = AdmitRequest::new(None, Duration::ZERO);
    assert!(state.admit(&request).unwrap().decision.is_ok());
    let n = 2_000_000u32;
    let start = Instant::now();
    let mut admitted = 0u32;
    for _ in 0..n {
        admitted += u32::from(state.admit(&request).unwrap().decision.is_ok());
    }
    let took = start.elapsed();
    println!(
        "one admission from the batch (ResourceState::admit, one thread): {:.0} ns ({admitted} of {n} admitted)",
        took.as_nanos() as f64 / f64::from(n)
    );
}

fn main() {
    let a = args();
    let own = if a.url.is_none() {
        Some(Server::start())
    } else {
        None
    };
    let url = a.url.clone().unwrap_or_else(|| own.as_ref().unwrap().url());
    if a.child {
        child(&a, &url);
        return;
    }
    // A setting the store or the limiter refuses stops here, not in the
    // four processes, once the server this run started is stopped.
    if let Err(e) = pipeline(&a, &url) {
        drop(own);
        cli::or_usage(NAME, USAGE, Err(e))
    }
    if !a.exact {
        local_cost(&url, &a.prefix);
    }
    let exe = std::env::current_exe().unwrap();
    let start_ms = unix_ms() + 1500;
    let before = script_calls(&url);
    let children: Vec<Child> = (0..4)
        .map(|_| {
            let mut cmd = Command::new(&exe);
            cmd.args(["--child", "--url", &url, "--prefix", &a.prefix])
                .args(["--limit", &a.limit.to_string()])
                .args(["--burst", &a.burst.to_string()])
                .args(["--batch", &a.batch.to_string()])
                .args(["--seconds", &a.seconds.to_string()])
                .args(["--threads", &a.threads.to_string()])
                .args(["--start-ms", &start_ms.to_string()])
                .stdout(Stdio::piped());
            if a.exact {
                cmd.arg("--exact");
            }
            cmd.spawn().unwrap()
        })
        .collect();
    let span = (a.seconds * 1000) as usize;
    let mut per_ms = vec![0u64; span];
    let mut refused = 0u64;
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        for line in text.lines() {
            if let Some(n) = line.strip_prefix("REFUSED ") {
                refused += n.parse::<u64>().unwrap();
            } else if let Some(list) = line.strip_prefix("PER_MS ") {
                for (total, c) in per_ms.iter_mut().zip(list.split(',')) {
                    *total += c.parse::<u64>().unwrap();
                }
            }
        }
    }
    let calls = script_calls(&url) - before;
    let admitted: u64 = per_ms.iter().sum();
    let densest = per_ms
        .windows(1000.min(span))
        .map(|w| w.iter().sum::<u64>())
        .max()
        .unwrap_or(0);
    let exact_bound = u64::from(a.burst) + u64::from(a.limit);
    let held = 4 * (u64::from(a.batch) + u64::from(low_water(a.batch)) + a.threads as u64);
    let mode = if a.exact {
        "exact".to_owned()
    } else {
        format!(
            "leased (batch {}, low water {})",
            a.batch,
            low_water(a.batch)
        )
    };
    println!(
        "four processes x {} thread(s), one GCRA limit of {}/s (burst {}), {mode}, {} s:",
        a.threads, a.limit, a.burst, a.seconds
    );
    println!(
        "  admitted {admitted} ({:.0}/s in all), refused {refused}, {calls} script calls ({:.4} per admission)",
        admitted as f64 / a.seconds as f64,
        calls as f64 / admitted.max(1) as f64,
    );
    let overshoot = densest.saturating_sub(exact_bound - 1);
    if a.exact {
        println!(
            "  densest second: {densest} admissions; exact bound: fewer than {exact_bound}; over it: {overshoot}"
        );
    } else {
        println!(
            "  densest second: {densest} admissions; exact bound: fewer than {exact_bound}; \
             over it: {overshoot}, stated bound for the overshoot: {held} (4 x (batch + low water + threads))"
        );
    }
}
