//! Cost of the full seawall chain with its state in Redis, on loopback.
//!
//! ```text
//! cargo run --release -p seawall-redis --example redis_bench [-- --calls 20000 --url redis://127.0.0.1:6379]
//! ```
//!
//! Without `--url`, starts its own `redis-server` (from the PATH) on a free
//! loopback port and stops it at the end. Measures, in one run:
//! - one PING round trip (async connection and blocking connection), on
//!   its own and in turn with the chain's calls (a PING, a call, a PING,
//!   ...: the ratio of the added p50 to the PING's, both measured at the
//!   same moments);
//! - the chain retry + circuit breaker + timeout + bulkhead + rate limiter
//!   (high limit) + cooldown + fallback, its state in Redis: calls/s and
//!   p50/p99 latency added to a trivial operation (calls one after the
//!   other), in one process (async `run` as a task on a multi-thread
//!   runtime, async `run` on a current-thread runtime, sync `call`) and in
//!   four processes (async `run`, one shared state); and the throughput of
//!   one process whose 32 tasks call at once (async `run`, one connection);
//! - round trips per call (script calls per call: every call here is one
//!   successful attempt), from the server's `INFO commandstats`, and the
//!   server's mean time per script call; the async run also with
//!   `success_delay(0)` (every success sent on its own, not carried by
//!   the next admission); the CPU time per call of the server (`INFO cpu`)
//!   and of this process (`/proc/self/stat`), which a loaded machine
//!   disturbs less than wall-clock figures;
//! - the refusal of a call by a shared circuit that another process opened
//!   (open for an hour): time per refusal and round trips per call, with
//!   the refusal replayed locally (the default) and with
//!   `local_refusals(0)` (every refusal asked of Redis), sync and async.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use seawall::{Bulkhead, CircuitBreaker, Cooldown, Pipeline, RateLimiter, Retry};
use seawall_redis::RedisStore;
use seawall_test_redis::RedisServer as Server;

#[path = "support/cli.rs"]
mod cli;

/// Tasks of the concurrent single-process row (half the bulkhead).
const TASKS: usize = 32;

struct Args {
    url: Option<String>,
    calls: usize,
    child: bool,
    prefix: String,
    start_ms: u64,
}

const NAME: &str = "redis_bench";
const USAGE: &str = "[--calls N] [--url redis://127.0.0.1:6379]";

fn args() -> Args {
    let mut a = Args {
        url: std::env::var("SEAWALL_REDIS_URL").ok(),
        calls: 20_000,
        child: false,
        prefix: format!("bench-{}", std::process::id()),
        start_ms: 0,
    };
    let parsed = parse(&mut a);
    cli::or_usage(NAME, USAGE, parsed);
    a
}

fn parse(a: &mut Args) -> Result<(), cli::Error> {
    use cli::*;
    let mut p = Parser::from_env();
    while let Some(arg) = p.next()? {
        match arg {
            Long("url") => a.url = Some(p.value()?.string()?),
            Long("calls") => a.calls = p.value()?.parse()?,
            Long("child") => a.child = true,
            Long("prefix") => a.prefix = p.value()?.string()?,
            Long("start-ms") => a.start_ms = p.value()?.parse()?,
            Short('h') | Long("help") => help(NAME, USAGE),
            _ => return Err(arg.unexpected()),
        }
    }
    if a.calls == 0 {
        return Err("--calls must be > 0".into());
    }
    Ok(())
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn chain(store: RedisStore) -> Pipeline<seawall::pipeline::WithFallback<u64, std::io::Error>> {
    Pipeline::builder("bench-dependency")
        .retry(Retry::constant(Duration::from_millis(1)).max_attempts(3))
        .circuit_breaker(
            CircuitBreaker::failure_rate(0.5)
                .count_window(100)
                .minimum_calls(20),
        )
        .timeout(Duration::from_secs(1))
        .bulkhead(Bulkhead::new(64).lease(Duration::from_secs(10)))
        .rate_limiter(RateLimiter::gcra(10_000_000, Duration::from_secs(1)))
        .cooldown(Cooldown::new())
        .fallback_sync(|_err, _ctx| Ok::<u64, std::io::Error>(0))
        .store(store)
        .build()
        .expect("pipeline")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn us(d: Duration) -> String {
    format!("{:.1} us", d.as_secs_f64() * 1e6)
}

/// Times `n` sequential calls of `f`; returns the sorted latencies and the
/// total time.
async fn time_async<F, Fut>(n: usize, mut f: F) -> (Vec<Duration>, Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut lat = Vec::with_capacity(n);
    let start = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        f().await;
        lat.push(t.elapsed());
    }
    let total = start.elapsed();
    lat.sort();
    (lat, total)
}

/// Runs `time_async` as a task on `rt` (where a service's handlers run:
/// on a worker thread, beside the connection's driver).
fn time_on<F, Fut>(rt: &tokio::runtime::Runtime, n: usize, f: F) -> (Vec<Duration>, Duration)
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    rt.block_on(rt.spawn(time_async(n, f))).unwrap()
}

/// Times `n` calls of `p.run` made by `tasks` tasks at once on `rt` (a
/// service's handlers, each awaiting its own calls): the sorted latencies
/// of every call and the total time.
fn time_concurrent(
    rt: &tokio::runtime::Runtime,
    p: &Pipeline<seawall::pipeline::WithFallback<u64, std::io::Error>>,
    n: usize,
    tasks: usize,
) -> (Vec<Duration>, Duration) {
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let p = p.clone();
            let calls = n / tasks + usize::from(i < n % tasks);
            rt.spawn(async move {
                let mut lat = Vec::with_capacity(calls);
                for _ in 0..calls {
                    let t = Instant::now();
                    p.run(|_| op()).await.unwrap();
                    lat.push(t.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut lat: Vec<Duration> = rt.block_on(async {
        let mut all = Vec::with_capacity(n);
        for h in handles {
            all.extend(h.await.unwrap());
        }
        all
    });
    let total = start.elapsed();
    lat.sort();
    (lat, total)
}

fn time_sync(n: usize, mut f: impl FnMut()) -> (Vec<Duration>, Duration) {
    let mut lat = Vec::with_capacity(n);
    let start = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        f();
        lat.push(t.elapsed());
    }
    let total = start.elapsed();
    lat.sort();
    (lat, total)
}

/// Script calls so far; first waits a little for the successes still
/// waiting to be carried (sent on their own after 1 ms).
fn script_calls(url: &str) -> u64 {
    std::thread::sleep(Duration::from_millis(20));
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

/// Mean server time per script call (`FCALL`, `EVALSHA`), in
/// microseconds.
fn script_usec(url: &str) -> f64 {
    let client = redis::Client::open(url).unwrap();
    let mut c = client.get_connection().unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut c)
        .unwrap();
    let field = |l: &str, name: &str| -> f64 {
        l.split(',')
            .find_map(|kv| kv.split_once(name).map(|(_, v)| v.parse().unwrap_or(0.0)))
            .unwrap_or(0.0)
    };
    let (usec, calls) = info
        .lines()
        .filter(|l| l.starts_with("cmdstat_fcall:") || l.starts_with("cmdstat_evalsha:"))
        .fold((0.0, 0.0), |(u, n), l| {
            (u + field(l, "usec="), n + field(l, "calls="))
        });
    if calls > 0.0 {
        usec / calls
    } else {
        0.0
    }
}

/// CPU time used so far by the server (`INFO cpu`: user + system).
fn server_cpu(url: &str) -> Duration {
    let client = redis::Client::open(url).unwrap();
    let mut c = client.get_connection().unwrap();
    let info: String = redis::cmd("INFO").arg("cpu").query(&mut c).unwrap();
    let secs: f64 = info
        .lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_user:")
                .or_else(|| l.strip_prefix("used_cpu_sys:"))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum();
    Duration::from_secs_f64(secs)
}

/// CPU time used so far by this process (user + system, from
/// `/proc/self/stat`, in clock ticks of 10 ms); zero where it cannot be
/// read.
fn own_cpu() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // The fields after the command name (which is in parentheses).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime: fields 14 and 15 of the line, 12 and 13 here.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

fn reset_stats(url: &str) {
    let client = redis::Client::open(url).unwrap();
    let mut c = client.get_connection().unwrap();
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut c).unwrap();
}

/// A multi-thread runtime with one worker, as `#[tokio::main]` gives
/// (with as many workers as cores).
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// The operation: trivial, so that its latency is the chain's overhead.
async fn op() -> Result<u64, std::io::Error> {
    Ok(std::hint::black_box(1))
}

fn child(a: &Args, url: &str) {
    let store = RedisStore::builder(url)
        .prefix(&a.prefix)
        .fail_closed()
        .build()
        .unwrap();
    let p = chain(store);
    let rt = runtime();
    let (calls, start_ms) = (a.calls, a.start_ms);
    let task = rt.spawn(async move {
        for _ in 0..500 {
            p.run(|_| op()).await.unwrap();
        }
        let now = unix_ms();
        if start_ms > now {
            tokio::time::sleep(Duration::from_millis(start_ms - now)).await;
        }
        time_async(calls, || async {
            p.run(|_| op()).await.unwrap();
        })
        .await
    });
    let (lat, total) = rt.block_on(task).unwrap();
    let nanos: Vec<String> = lat.iter().map(|d| d.as_nanos().to_string()).collect();
    println!("TOTAL_NS {}", total.as_nanos());
    println!("LAT_NS {}", nanos.join(","));
}

/// A pipeline whose circuit stays open for an hour once tripped.
fn breaker_chain(store: RedisStore) -> Pipeline {
    Pipeline::builder("bench-open-circuit")
        .circuit_breaker(
            CircuitBreaker::consecutive_failures(1).cooldown(Duration::from_secs(3600)),
        )
        .store(store)
        .build()
        .expect("pipeline")
}

/// Refusals by a shared circuit another process opened: per refusal, with
/// the refusal replayed locally and without.
fn open_circuit_refusals(url: &str, prefix: &str, n: usize, rt: &tokio::runtime::Runtime) {
    let prefix = format!("{prefix}-open");
    let store = |replay: usize| {
        RedisStore::builder(url)
            .prefix(&prefix)
            .fail_closed()
            .local_refusals(replay)
            .build()
            .unwrap()
    };
    // Another process trips the circuit.
    let opener = breaker_chain(store(0));
    let _ = opener.call(|_| Err::<u64, _>(std::io::Error::other("down")));
    println!(
        "{:<34} {:>12} {:>12} {:>12} {:>17}",
        "open shared circuit refusal", "mean", "p50", "p99", "round trips/call"
    );
    for (name, replay) in [("replayed locally", 4096), ("local_refusals(0)", 0)] {
        let p = breaker_chain(store(replay));
        let refuse = |r: Result<u64, seawall::Error<std::io::Error>>| {
            assert!(matches!(r, Err(seawall::Error::Rejected(_))));
        };
        refuse(p.call(|_| Ok(1)));
        reset_stats(url);
        let (sync_lat, sync_total) = time_sync(n, || refuse(p.call(|_| Ok(1))));
        let sync_trips = script_calls(url) as f64 / n as f64;
        reset_stats(url);
        let (async_lat, async_total) = {
            let p = p.clone();
            time_on(rt, n, move || {
                let p = p.clone();
                async move {
                    let r = p.run(|_| async { Ok::<u64, std::io::Error>(1) }).await;
                    assert!(matches!(r, Err(seawall::Error::Rejected(_))));
                }
            })
        };
        let async_trips = script_calls(url) as f64 / n as f64;
        for (path, lat, total, trips) in [
            ("sync call", &sync_lat, sync_total, sync_trips),
            ("async run", &async_lat, async_total, async_trips),
        ] {
            println!(
                "{:<34} {:>12} {:>12} {:>12} {:>17.2}",
                format!("{name}, {path}"),
                format!("{:.0} ns", total.as_nanos() as f64 / n as f64),
                format!("{} ns", percentile(lat, 0.5).as_nanos()),
                format!("{} ns", percentile(lat, 0.99).as_nanos()),
                trips
            );
        }
    }
}

fn main() {
    let a = args();
    let server = if a.url.is_none() && !a.child {
        Some(Server::start())
    } else {
        None
    };
    let url = a
        .url
        .clone()
        .unwrap_or_else(|| server.as_ref().unwrap().url());
    if a.child {
        child(&a, &url);
        return;
    }
    let n = a.calls;
    let store = RedisStore::builder(url.as_str())
        .prefix(&a.prefix)
        .fail_closed()
        .build()
        .unwrap();
    let p = chain(store.clone());
    let rt = runtime();
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    // Warm up every path.
    {
        let (p, store) = (p.clone(), store.clone());
        time_on(&rt, 1000, move || {
            let (p, store) = (p.clone(), store.clone());
            async move {
                store.ping_async().await.unwrap();
                p.run(|_| op()).await.unwrap();
            }
        });
    }
    current.block_on(async {
        for _ in 0..1000 {
            p.run(|_| op()).await.unwrap();
        }
    });
    for _ in 0..1000 {
        store.ping().unwrap();
        p.call(|_| Ok::<u64, std::io::Error>(1)).unwrap();
    }

    let (ping_async, _) = {
        let store = store.clone();
        time_on(&rt, n, move || {
            let store = store.clone();
            async move {
                store.ping_async().await.unwrap();
            }
        })
    };
    let (ping_sync, _) = time_sync(n, || {
        store.ping().unwrap();
    });
    let (bare, _) = time_on(&rt, n, || async {
        op().await.unwrap();
    });

    reset_stats(&url);
    let cpu_before = (server_cpu(&url), own_cpu());
    let (run_lat, run_total) = {
        let p = p.clone();
        time_on(&rt, n, move || {
            let p = p.clone();
            async move {
                p.run(|_| op()).await.unwrap();
            }
        })
    };
    let run_trips = script_calls(&url) as f64 / n as f64;
    let run_cpu = (
        server_cpu(&url).saturating_sub(cpu_before.0),
        own_cpu().saturating_sub(cpu_before.1),
    );
    let run_usec = script_usec(&url);

    // Every success sent on its own (its answer not awaited), not carried.
    let alone = chain(
        RedisStore::builder(url.as_str())
            .prefix(&a.prefix)
            .fail_closed()
            .success_delay(Duration::ZERO)
            .build()
            .unwrap(),
    );
    {
        let alone = alone.clone();
        time_on(&rt, 1000, move || {
            let alone = alone.clone();
            async move {
                alone.run(|_| op()).await.unwrap();
            }
        });
    }
    reset_stats(&url);
    let cpu_before = (server_cpu(&url), own_cpu());
    let (alone_lat, alone_total) = {
        let alone = alone.clone();
        time_on(&rt, n, move || {
            let alone = alone.clone();
            async move {
                alone.run(|_| op()).await.unwrap();
            }
        })
    };
    let alone_trips = script_calls(&url) as f64 / n as f64;
    let alone_cpu = (
        server_cpu(&url).saturating_sub(cpu_before.0),
        own_cpu().saturating_sub(cpu_before.1),
    );

    // One process, calls at once: the throughput of a service whose
    // handlers share the store's connection.
    reset_stats(&url);
    let (conc_lat, conc_total) = time_concurrent(&rt, &p, n, TASKS);
    let conc_trips = script_calls(&url) as f64 / n as f64;

    // A current-thread runtime awaits every record (two round trips).
    reset_stats(&url);
    let (current_lat, current_total) = current.block_on(time_async(n, || async {
        p.run(|_| op()).await.unwrap();
    }));
    let current_trips = script_calls(&url) as f64 / n as f64;

    // A PING and a call in turn, n times each: both see the same machine
    // at the same moments, so that the ratio of their p50s does not move
    // with what else the machine did between two rows.
    let (turn_ping, turn_run) = {
        let (p, store) = (p.clone(), store.clone());
        let run = async move {
            let (mut ping, mut run) = (Vec::with_capacity(n), Vec::with_capacity(n));
            for _ in 0..n {
                let t = Instant::now();
                store.ping_async().await.unwrap();
                ping.push(t.elapsed());
                let t = Instant::now();
                p.run(|_| op()).await.unwrap();
                run.push(t.elapsed());
            }
            (ping, run)
        };
        rt.block_on(rt.spawn(run)).unwrap()
    };
    let (turn_ping_sync, turn_call) = {
        let (mut ping, mut call) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            let t = Instant::now();
            store.ping().unwrap();
            ping.push(t.elapsed());
            let t = Instant::now();
            p.call(|_| Ok::<u64, std::io::Error>(std::hint::black_box(1)))
                .unwrap();
            call.push(t.elapsed());
        }
        (ping, call)
    };

    reset_stats(&url);
    let (call_lat, call_total) = time_sync(n, || {
        p.call(|_| Ok::<u64, std::io::Error>(std::hint::black_box(1)))
            .unwrap();
    });
    let call_trips = script_calls(&url) as f64 / n as f64;

    // Four processes, the same resource (one shared state), started together.
    let exe = std::env::current_exe().unwrap();
    let start_ms = unix_ms() + 1500;
    reset_stats(&url);
    let children: Vec<Child> = (0..4)
        .map(|_| {
            Command::new(&exe)
                .args(["--child", "--url", &url, "--prefix", &a.prefix])
                .args([
                    "--calls",
                    &n.to_string(),
                    "--start-ms",
                    &start_ms.to_string(),
                ])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut multi_lat = Vec::new();
    let mut multi_secs: f64 = 0.0;
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        for line in text.lines() {
            if let Some(ns) = line.strip_prefix("TOTAL_NS ") {
                multi_secs = multi_secs.max(ns.parse::<f64>().unwrap() / 1e9);
            } else if let Some(list) = line.strip_prefix("LAT_NS ") {
                multi_lat.extend(
                    list.split(',')
                        .map(|v| Duration::from_nanos(v.parse().unwrap())),
                );
            }
        }
    }
    multi_lat.sort();
    // Each child also warmed up with 500 calls.
    let multi_trips = script_calls(&url) as f64 / (4 * (n + 500)) as f64;

    let ping_p50 = percentile(&ping_async, 0.5);
    let ping_sync_p50 = percentile(&ping_sync, 0.5);
    let added = |lat: &[Duration], p: f64| percentile(lat, p).saturating_sub(percentile(&bare, p));

    println!("seawall-redis bench: {n} calls per measurement, redis at {url}");
    println!(
        "chain: retry + circuit breaker + timeout + bulkhead + rate limiter + cooldown + fallback"
    );
    println!();
    println!(
        "PING round trip p50: async {} | blocking {}",
        us(ping_p50),
        us(ping_sync_p50)
    );
    println!("bare operation p50: {}", us(percentile(&bare, 0.5)));
    println!("server time per script call: {run_usec:.1} us (INFO commandstats)");
    println!();
    println!(
        "{:<34} {:>10} {:>12} {:>12} {:>17}",
        "", "calls/s", "added p50", "added p99", "round trips/call"
    );
    let row = |name: &str, lat: &[Duration], calls: f64, secs: f64, trips: f64| {
        println!(
            "{name:<34} {:>10.0} {:>12} {:>12} {:>17.2}",
            calls / secs,
            us(added(lat, 0.5)),
            us(added(lat, 0.99)),
            trips
        );
    };
    row(
        "1 process, async run",
        &run_lat,
        n as f64,
        run_total.as_secs_f64(),
        run_trips,
    );
    row(
        "1 process, async run, success_delay(0)",
        &alone_lat,
        n as f64,
        alone_total.as_secs_f64(),
        alone_trips,
    );
    row(
        &format!("1 process, async run, {TASKS} tasks"),
        &conc_lat,
        n as f64,
        conc_total.as_secs_f64(),
        conc_trips,
    );
    row(
        "1 process, async run, current-thread",
        &current_lat,
        n as f64,
        current_total.as_secs_f64(),
        current_trips,
    );
    row(
        "1 process, sync call",
        &call_lat,
        n as f64,
        call_total.as_secs_f64(),
        call_trips,
    );
    row(
        "4 processes, async run",
        &multi_lat,
        (4 * n) as f64,
        multi_secs,
        multi_trips,
    );
    println!();
    open_circuit_refusals(&url, &a.prefix, n, &rt);
    println!();
    let ratio =
        |lat: &[Duration], ping: Duration| added(lat, 0.5).as_secs_f64() / ping.as_secs_f64();
    println!(
        "added p50 / PING p50 (target <= 1.5x): async run {:.2}x, success_delay(0) {:.2}x, current-thread {:.2}x, sync call {:.2}x (vs blocking PING)",
        ratio(&run_lat, ping_p50),
        ratio(&alone_lat, ping_p50),
        ratio(&current_lat, ping_p50),
        ratio(&call_lat, ping_sync_p50)
    );
    let p50 = |mut lat: Vec<Duration>| {
        lat.sort();
        percentile(&lat, 0.5)
    };
    let (turn_ping, turn_ping_sync) = (p50(turn_ping), p50(turn_ping_sync));
    let (turn_run, turn_call) = (p50(turn_run), p50(turn_call));
    let bare_p50 = percentile(&bare, 0.5);
    let turn = |call: Duration, ping: Duration| {
        call.saturating_sub(bare_p50).as_secs_f64() / ping.as_secs_f64()
    };
    println!(
        "the same, a PING and a call in turn: async run {:.2}x ({} against a PING of {}), sync call {:.2}x ({} against {})",
        turn(turn_run, turn_ping),
        us(turn_run.saturating_sub(bare_p50)),
        us(turn_ping),
        turn(turn_call, turn_ping_sync),
        us(turn_call.saturating_sub(bare_p50)),
        us(turn_ping_sync),
    );
    println!(
        "script calls per successful attempt (target <= 1.05): async run {run_trips:.3}, sync call {call_trips:.3}, success_delay(0) {alone_trips:.3}, current-thread {current_trips:.3}, 4 processes {multi_trips:.3}"
    );
    println!(
        "async single-process throughput: {:.0} calls/s one after another, {:.0} calls/s from {TASKS} tasks at once",
        n as f64 / run_total.as_secs_f64(),
        n as f64 / conc_total.as_secs_f64()
    );
    let per_call = |d: Duration| us(d / u32::try_from(n).unwrap_or(u32::MAX));
    println!(
        "CPU per call (server | this process, which includes the bench's own timing): async run {} | {}, success_delay(0) {} | {}",
        per_call(run_cpu.0),
        per_call(run_cpu.1),
        per_call(alone_cpu.0),
        per_call(alone_cpu.1)
    );
    drop(server);
}
