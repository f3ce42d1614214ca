//! Where the latency of an admission goes, on one async connection, in one
//! run: a PING, an `EVALSHA` of a trivial script with the keys and
//! arguments of an admission, and the admission scripts themselves with the
//! arguments the `redis_bench` chain sends (circuit breaker over a count
//! window, bulkhead, GCRA rate limiter, cooldown), by `EVALSHA` and as
//! functions (`FCALL`, Redis 7 and later), the spec as 26 arguments or by
//! its id (sent in full once, as the store sends it).
//!
//! ```text
//! cargo run --release -p seawall-redis --example script_breakdown [-- --calls 20000 --only TEXT --url redis://127.0.0.1:6379]
//! ```
//!
//! Without `--url`, starts its own `redis-server` (from the PATH) on a free
//! loopback port. Each row: p50 and mean round trip, and the server's time
//! per call (`INFO commandstats`). The admission rows send the scripts of
//! the crate as they are built (`src/scripts.rs`): generic (the spec as
//! 26 arguments, as every admission sent it before the admission scripts
//! were compiled for their spec) and compiled for the spec (`SpecScripts`:
//! the spec as constants, `ARGV` the time and the operation's arguments).
//! The server's time is `usec_per_call` of `EVALSHA` or `FCALL` (of `PING`
//! for the first row). `--only TEXT` runs only the rows whose name contains
//! `TEXT` (for a profiler attached to the server: `--only "by its id"`).

use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use seawall_test_redis::RedisServer as Server;

#[path = "support/cli.rs"]
mod cli;

/// The scripts' text as the crate sends it (the error codes the store
/// reads are not used here).
#[path = "../src/script_text.rs"]
#[allow(dead_code)]
mod script_text;
use script_text::{compiled, library, script};

const PRELUDE: &str = include_str!("../src/lua/prelude.lua");
const SUCCESS: &str = include_str!("../src/lua/success.lua");
const CARRY: &str = include_str!("../src/lua/carry.lua");
const ADMIT: &str = include_str!("../src/lua/admit.lua");

/// The spec of the `redis_bench` chain, as `SpecArgs` encodes it
/// (`ARGV[2..=27]`), with a bulkhead of `max` slots.
fn spec_args(max: &str) -> Vec<String> {
    [
        "1",
        "2",
        "100",
        "0.5",
        "0",
        "60000000",
        "20",
        "30000000",
        "1",
        "30000000",
        "1",
        "60000000",
        "600000000",
        "1",
        max,
        "10000000",
        "1",
        "300000000",
        "60000000",
        "1",
        "1",
        "10000000",
        "1000000",
        "999999:900",
        "0:100",
        "0",
    ]
    .map(String::from)
    .to_vec()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

async fn info_usec(c: &mut MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(c)
        .await
        .unwrap();
    info.lines()
        .filter(|l| {
            ["cmdstat_evalsha:", "cmdstat_fcall:", "cmdstat_ping:"]
                .iter()
                .any(|c| l.starts_with(c))
        })
        .filter_map(|l| {
            l.split(',')
                .find_map(|kv| kv.strip_prefix("usec_per_call="))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .next()
        .unwrap_or(0.0)
}

async fn reset(c: &mut MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(c)
        .await
        .unwrap();
}

/// Deletes `keys`: the next row starts from fresh state.
async fn clear(c: &mut MultiplexedConnection, keys: &[String]) {
    let _: () = redis::cmd("DEL").arg(keys).query_async(c).await.unwrap();
}

async fn load(c: &mut MultiplexedConnection, text: &str) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(text)
        .query_async(c)
        .await
        .unwrap()
}

/// Which rows run, and how many calls each.
struct Rows {
    calls: usize,
    /// Only the rows whose name contains it (`--only`).
    only: Option<String>,
}

/// Times `rows.calls` calls of `cmd(i)`, one after another; prints a row
/// (unless `--only` leaves it out).
async fn row(
    c: &mut MultiplexedConnection,
    name: &str,
    rows: &Rows,
    mut cmd: impl FnMut(Option<&redis::Value>) -> redis::Cmd,
) {
    if rows
        .only
        .as_ref()
        .is_some_and(|o| !name.contains(o.as_str()))
    {
        return;
    }
    let n = rows.calls;
    let mut last: Option<redis::Value> = None;
    for _ in 0..1000.min(n) {
        last = Some(cmd(last.as_ref()).query_async(c).await.unwrap());
    }
    reset(c).await;
    let mut lat = Vec::with_capacity(n);
    let start = Instant::now();
    for _ in 0..n {
        let command = cmd(last.as_ref());
        let t = Instant::now();
        last = Some(command.query_async(c).await.unwrap());
        lat.push(t.elapsed());
    }
    let total = start.elapsed();
    let server = info_usec(c).await;
    lat.sort();
    println!(
        "{name:<52} {:>9.1} {:>9.1} {:>10.1}",
        percentile(&lat, 0.5).as_secs_f64() * 1e6,
        total.as_secs_f64() * 1e6 / n as f64,
        server
    );
}

/// The slot (`reply[5]`) of an admission's answer, as the success it
/// carries next names it.
fn slot_of(v: Option<&redis::Value>) -> String {
    match v {
        Some(redis::Value::Array(a)) => match a.get(4) {
            Some(redis::Value::Int(s)) => s.to_string(),
            _ => "-1".into(),
        },
        _ => "-1".into(),
    }
}

const NAME: &str = "script_breakdown";
const USAGE: &str = "[--calls N] [--only TEXT] [--url redis://127.0.0.1:6379]";

fn parse(url: &mut Option<String>, rows: &mut Rows) -> Result<(), cli::Error> {
    use cli::*;
    let mut p = Parser::from_env();
    while let Some(arg) = p.next()? {
        match arg {
            Long("url") => *url = Some(p.value()?.string()?),
            Long("calls") => rows.calls = p.value()?.parse()?,
            Long("only") => rows.only = Some(p.value()?.string()?),
            Short('h') | Long("help") => help(NAME, USAGE),
            _ => return Err(arg.unexpected()),
        }
    }
    if rows.calls == 0 {
        return Err("--calls must be > 0".into());
    }
    Ok(())
}

fn main() {
    let mut url = std::env::var("SEAWALL_REDIS_URL").ok();
    let mut rows = Rows {
        calls: 20_000,
        only: None,
    };
    let parsed = parse(&mut url, &mut rows);
    cli::or_usage(NAME, USAGE, parsed);
    let server = url.is_none().then(Server::start);
    let url = url.unwrap_or_else(|| server.as_ref().unwrap().url());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(rt.spawn(run(url, rows))).unwrap();
    drop(server);
}

async fn run(url: String, rows: Rows) {
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let tag = format!("{{bd-{}:bench-dependency}}", std::process::id());
    let keys: Vec<String> = ["s", "cw", "tw", "tz", "b", "rg", "rb"]
        .iter()
        .map(|s| format!("{tag}:{s}"))
        .collect();

    let trivial = load(&mut c, "return 1").await;
    let table = load(&mut c, "return {0,-1,0,0,-1,0,0,0,-1,0,0,-1,0}").await;
    let admit = load(&mut c, &script(true, &[PRELUDE], &[ADMIT])).await;
    let carrying = load(&mut c, &script(true, &[PRELUDE, SUCCESS], &[CARRY, ADMIT])).await;
    let compiled = compiled(PRELUDE, &spec_args("64"));
    let compiled_carrying = load(
        &mut c,
        &script(true, &[&compiled, SUCCESS], &[CARRY, ADMIT]),
    )
    .await;
    let function = "seawall_breakdown_carrying";
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(library(
            function,
            &[PRELUDE, SUCCESS],
            &[(function, true, &[CARRY, ADMIT])],
        ))
        .query_async(&mut c)
        .await
        .unwrap();
    let eval = |sha: &str, keys: &[String], args: &[String]| {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(sha).arg(keys.len()).arg(keys).arg(args);
        cmd
    };
    // The library's admission carrying a success, on the admission's keys.
    let fcall = |args: &[String]| {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(function).arg(keys.len()).arg(&keys).arg(args);
        cmd
    };
    // ARGV: the server's clock, the spec, no retry budget.
    let argv = |max: &str| {
        let mut a = vec![String::new()];
        a.extend(spec_args(max));
        a.push(String::new());
        a
    };
    let wide = argv("1000000000");
    let bench = argv("64");
    // One record carried (how many, then the seven arguments of `success`),
    // then the admission's own arguments (no retry budget).
    let carried = |slot: String| {
        ["1", "", &slot, "0", "2", "100", "600000000", "60000000", ""].map(String::from)
    };
    // The time and the spec, for the rows that carry a record.
    let mut head = bench.clone();
    head.pop();

    println!(
        "{} calls per row, one async connection, redis at {url}",
        rows.calls
    );
    println!(
        "{:<52} {:>9} {:>9} {:>10}",
        "", "p50 us", "mean us", "server us"
    );
    row(&mut c, "PING", &rows, |_| redis::cmd("PING")).await;
    row(&mut c, "EVALSHA 'return 1', no keys", &rows, |_| {
        eval(&trivial, &[], &[])
    })
    .await;
    row(
        &mut c,
        "EVALSHA 'return 1', 7 keys + 29 args",
        &rows,
        |_| eval(&trivial, &keys, &bench),
    )
    .await;
    row(
        &mut c,
        "EVALSHA 13-number table, 7 keys + 29 args",
        &rows,
        |_| eval(&table, &keys, &bench),
    )
    .await;
    row(
        &mut c,
        "admission (admit.lua), bulkhead never full",
        &rows,
        |_| eval(&admit, &keys, &wide),
    )
    .await;
    clear(&mut c, &keys).await;
    row(
        &mut c,
        "admission carrying a success (redis_bench)",
        &rows,
        |last| {
            let mut a = head.clone();
            a.extend(carried(slot_of(last)));
            eval(&carrying, &keys, &a)
        },
    )
    .await;
    clear(&mut c, &keys).await;
    row(
        &mut c,
        "the same, the spec compiled in (SpecScripts)",
        &rows,
        |last| {
            let mut a = vec![String::new()];
            a.extend(carried(slot_of(last)));
            eval(&compiled_carrying, &keys, &a)
        },
    )
    .await;
    clear(&mut c, &keys).await;
    row(
        &mut c,
        "the same as a function (FCALL, the spec as arguments)",
        &rows,
        |last| {
            let mut a = head.clone();
            a.extend(carried(slot_of(last)));
            fcall(&a)
        },
    )
    .await;
    clear(&mut c, &keys).await;
    // The spec in full with its id on the first call (`=id`, then the 26
    // values), by its id after (`#id`), as the store sends it.
    let sent = std::sync::atomic::AtomicBool::new(false);
    row(
        &mut c,
        "the same, the spec by its id (as the store sends it)",
        &rows,
        |last| {
            let mut a = vec![String::new()];
            if sent.swap(true, std::sync::atomic::Ordering::Relaxed) {
                a.push("#breakdown".into());
            } else {
                a.push("=breakdown".into());
                a.extend(spec_args("64"));
            }
            a.extend(carried(slot_of(last)));
            fcall(&a)
        },
    )
    .await;
}
