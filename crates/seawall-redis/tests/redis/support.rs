//! Test support: a real `redis-server` per test (`seawall-test-redis`), and
//! what these tests count on it.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use seawall::event::{Event, EventKind};

pub(crate) use seawall_test_redis::{unique, RedisCluster, RedisServer};

/// `INFO commandstats` as `command -> calls`.
pub(crate) fn command_calls(c: &mut redis::Connection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(c)
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            let calls = stats.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// The count of error replies starting with `code` (`INFO errorstats`,
/// e.g. `MOVED`, `ASK`, `CROSSSLOT`).
pub(crate) fn error_count(c: &mut redis::Connection, code: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("errorstats")
        .query(c)
        .expect("INFO errorstats");
    info.lines()
        .find_map(|l| {
            l.trim_end()
                .strip_prefix(&format!("errorstat_{code}:count="))
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The URL of the user `name` (password `pw`) made on `server` with the
/// ACL `rules` on every key and channel, after `+@all`.
pub(crate) fn user_url(server: &RedisServer, name: &str, rules: &[&str]) -> String {
    let mut admin = server.conn();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(seawall_test_redis::acl_user(name, rules))
        .query(&mut admin)
        .expect("ACL SETUSER");
    format!("redis://{name}:pw@127.0.0.1:{}", server.port())
}

/// The name of the user of [`scripts_only_url`].
pub(crate) const SCRIPTS_ONLY: &str = "scriptsonly";

/// The URL of a user of `server` that may run scripts but not functions
/// (no `FUNCTION`, `FCALL`), as on a server before Redis 7: the store
/// runs its scripts by `EVALSHA`.
pub(crate) fn scripts_only_url(server: &RedisServer) -> String {
    user_url(server, SCRIPTS_ONLY, &seawall_test_redis::WITHOUT_FUNCTIONS)
}

/// `CONFIG RESETSTAT`: the command counts start again from 0.
pub(crate) fn reset_stats(conn: &mut redis::Connection) {
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(conn).unwrap();
}

/// How the store runs its scripts on `server`, and the URL it connects
/// with: as functions (the server's own user; by `EVALSHA` too on a server
/// before Redis 7, which has none), or by `EVALSHA` (a user without
/// functions, see [`scripts_only_url`]).
pub(crate) fn both_ways(server: &RedisServer) -> [(&'static str, String); 2] {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut server.conn())
        .expect("INFO server");
    let major = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .and_then(|v| v.split('.').next()?.trim().parse::<u32>().ok())
        .unwrap_or(0);
    let first = if major >= 7 { "functions" } else { "evalsha" };
    [(first, server.url()), ("evalsha", scripts_only_url(server))]
}

/// The URL of `server` as functions, or `None` on a server before Redis 7
/// (which has none): the test that asked is then skipped, and says so.
pub(crate) fn functions_url(server: &RedisServer) -> Option<String> {
    let [(how, url), _] = both_ways(server);
    if how != "functions" {
        eprintln!("skipped: the server has no functions");
    }
    (how == "functions").then_some(url)
}

/// Takes the store's scripts and functions off the server (`SCRIPT FLUSH`,
/// `FUNCTION FLUSH`), as a restart without its data would.
pub(crate) fn flush_scripts(c: &mut redis::Connection) {
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(c).unwrap();
    let _: () = redis::cmd("FUNCTION").arg("FLUSH").query(c).unwrap();
}

/// `FUNCTION LOAD` calls in a commandstats snapshot.
pub(crate) fn function_loads(stats: &HashMap<String, u64>) -> u64 {
    stats.get("function|load").copied().unwrap_or(0)
}

/// Script calls (FCALL + EVALSHA + EVAL) in a commandstats snapshot.
pub(crate) fn script_calls(stats: &HashMap<String, u64>) -> u64 {
    ["fcall", "evalsha", "eval"]
        .iter()
        .map(|c| stats.get(*c).copied().unwrap_or(0))
        .sum()
}

/// `SCRIPT LOAD` calls in a commandstats snapshot (`script|load` since
/// Redis 7, `script` before).
pub(crate) fn script_loads(stats: &HashMap<String, u64>) -> u64 {
    stats
        .get("script|load")
        .or_else(|| stats.get("script"))
        .copied()
        .unwrap_or(0)
}

/// Events recorded by a listener.
#[derive(Clone, Default)]
pub(crate) struct Events(Arc<Mutex<Vec<EventKind>>>);

impl Events {
    pub(crate) fn listener(&self) -> impl Fn(&Event<'_>) + Send + Sync + 'static {
        let log = Arc::clone(&self.0);
        move |e: &Event<'_>| log.lock().unwrap().push(e.kind.clone())
    }

    pub(crate) fn take(&self) -> Vec<EventKind> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }

    pub(crate) fn degraded(events: &[EventKind]) -> usize {
        events
            .iter()
            .filter(|e| matches!(e, EventKind::StoreUnavailable { degraded: true, .. }))
            .count()
    }

    pub(crate) fn unavailable(events: &[EventKind]) -> usize {
        events
            .iter()
            .filter(|e| matches!(e, EventKind::StoreUnavailable { .. }))
            .count()
    }
}

pub(crate) fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Lua that returns after a second of the server's time, keeping every
/// other client waiting (below `lua-time-limit`, nobody is told BUSY;
/// `DEBUG SLEEP` would need `enable-debug-command`).
const BUSY_SECOND: &str = "local t = redis.call('TIME') \
    local start = t[1] * 1000000 + t[2] \
    repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - start >= 1000000";

/// Makes `server` busy for a second: returns once a PING stalls (the busy
/// script runs), with the thread that sent it, to join.
pub(crate) fn busy_for_a_second(server: &RedisServer) -> std::thread::JoinHandle<()> {
    let mut probe = server.conn();
    probe
        .set_read_timeout(Some(std::time::Duration::from_millis(50)))
        .unwrap();
    let mut sleeping = server.conn();
    let sleeper = std::thread::spawn(move || {
        let _: () = redis::cmd("EVAL")
            .arg(BUSY_SECOND)
            .arg(0)
            .query(&mut sleeping)
            .unwrap();
    });
    let waiting = std::time::Instant::now();
    while redis::cmd("PING").query::<()>(&mut probe).is_ok() {
        assert!(
            waiting.elapsed() < std::time::Duration::from_secs(5),
            "the busy script never began"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    sleeper
}
