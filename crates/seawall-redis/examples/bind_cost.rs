//! What binding pipelines to a `RedisStore` costs, each pipeline of a
//! spec of its own (circuit breaker, bulkhead and GCRA rate limiter of
//! distinct sizes), in one run: as functions (Redis 7 and later) and by
//! `EVALSHA` (a user without functions, as on an earlier server).
//!
//! ```text
//! cargo run --release -p seawall-redis --example bind_cost [-- --pipelines 200 --url redis://127.0.0.1:6379]
//! ```
//!
//! Without `--url`, starts its own `redis-server` (from the PATH) on a free
//! loopback port. With `--url`, the server's scripts and functions are
//! flushed first (`SCRIPT FLUSH`, `FUNCTION FLUSH`): use a server of your
//! own. Each row: time per bind (`Pipeline::builder(..).build()`), the
//! server's time in `SCRIPT LOAD` and `FUNCTION LOAD` (`INFO
//! commandstats`), and the server's script cache and Lua memory
//! afterwards (`INFO memory`). Every pipeline then makes one call.

use std::time::{Duration, Instant};

use seawall::{Bulkhead, CircuitBreaker, Pipeline, RateLimiter};
use seawall_redis::RedisStore;
use seawall_test_redis::RedisServer as Server;

#[path = "support/cli.rs"]
mod cli;

const NAME: &str = "bind_cost";
const USAGE: &str = "[--pipelines N] [--url redis://127.0.0.1:6379]";

fn parse(url: &mut Option<String>, n: &mut u32) -> Result<(), cli::Error> {
    use cli::*;
    let mut p = Parser::from_env();
    while let Some(arg) = p.next()? {
        match arg {
            Long("url") => *url = Some(p.value()?.string()?),
            Long("pipelines") => *n = p.value()?.parse()?,
            Short('h') | Long("help") => help(NAME, USAGE),
            _ => return Err(arg.unexpected()),
        }
    }
    if *n == 0 {
        return Err("--pipelines must be > 0".into());
    }
    Ok(())
}

/// A field of an `INFO` section (`name:value` lines), or 0.
fn field(info: &str, line: &str, key: &str) -> u64 {
    info.lines()
        .find_map(|l| l.strip_prefix(line))
        .and_then(|rest| {
            if key.is_empty() {
                return rest.trim().parse().ok();
            }
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(key))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn query(c: &mut redis::Connection, args: &[&str]) -> redis::Value {
    redis::cmd(args[0]).arg(&args[1..]).query(c).unwrap()
}

fn info(c: &mut redis::Connection, section: &str) -> String {
    redis::cmd("INFO").arg(section).query(c).unwrap()
}

/// Binds `n` pipelines of distinct specs to a store on `url`; prints a row.
fn row(how: &str, url: &str, admin: &mut redis::Connection, n: u32) {
    query(admin, &["SCRIPT", "FLUSH"]);
    query(admin, &["FUNCTION", "FLUSH"]);
    query(admin, &["CONFIG", "RESETSTAT"]);
    let store = RedisStore::builder(url)
        .prefix(format!("bind-cost-{}-{how}", std::process::id()))
        .build()
        .unwrap();
    let start = Instant::now();
    let pipelines: Vec<Pipeline> = (0..n)
        .map(|i| {
            Pipeline::builder(format!("resource-{i}"))
                .circuit_breaker(CircuitBreaker::consecutive_failures(3))
                .bulkhead(Bulkhead::new(10 + i))
                .rate_limiter(RateLimiter::gcra(1_000 + i, Duration::from_secs(1)))
                .store(store.clone())
                .build()
                .unwrap()
        })
        .collect();
    let per_bind = start.elapsed() / n;
    let stats = info(admin, "commandstats");
    let memory = info(admin, "memory");
    let server_ms = |cmd: &str| field(&stats, cmd, "usec=") as f64 / 1000.0;
    println!(
        "{how:<10} {:>10.3} {:>14.1} {:>16.1} {:>13} {:>11}",
        per_bind.as_secs_f64() * 1000.0,
        server_ms("cmdstat_script|load:"),
        server_ms("cmdstat_function|load:"),
        field(&memory, "used_memory_scripts:", "") / 1024,
        field(&memory, "used_memory_lua:", "") / 1024,
    );
    for p in &pipelines {
        p.call(|_| Ok::<_, std::io::Error>(())).unwrap();
    }
}

fn main() {
    let mut url = std::env::var("SEAWALL_REDIS_URL").ok();
    let mut n = 200;
    let parsed = parse(&mut url, &mut n);
    cli::or_usage(NAME, USAGE, parsed);
    let server = url.is_none().then(Server::start);
    let url = url.unwrap_or_else(|| server.as_ref().unwrap().url());
    let mut admin = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    // A user that may run scripts but not functions: the store runs its
    // scripts by `EVALSHA`, as on a server before Redis 7.
    let user = format!("bind-cost-{}", std::process::id());
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(seawall_test_redis::acl_user(
            &user,
            &seawall_test_redis::WITHOUT_FUNCTIONS,
        ))
        .query(&mut admin)
        .unwrap();
    let address = url.split("://").nth(1).unwrap_or(&url);
    let address = address.rsplit('@').next().unwrap_or(address);
    let scripts_only = format!("redis://{user}:pw@{address}");
    println!("seawall-redis bind cost: {n} pipelines, each of its own spec, redis at {url}");
    println!(
        "{:<10} {:>10} {:>14} {:>16} {:>13} {:>11}",
        "way", "ms/bind", "SCRIPT LOAD ms", "FUNCTION LOAD ms", "scripts KiB", "Lua KiB"
    );
    row("functions", &url, &mut admin, n);
    row("evalsha", &scripts_only, &mut admin, n);
    query(&mut admin, &["ACL", "DELUSER", &user]);
    drop(server);
}
