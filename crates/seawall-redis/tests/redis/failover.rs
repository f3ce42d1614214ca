//! A cluster master killed while four OS processes run a pipeline on a
//! resource of its slots: two fail open, two fail closed (one of each on
//! the sync path, one on the async path). Every call answers within the
//! store's timeouts and follows its mode while the slot has no master; the
//! replica is promoted, and every process admits through Redis again, on
//! the new master, without a restart. The promoted replica continues the
//! old master's data: it is not waited for as a restart (the resource's
//! bulkhead lease, 60 s, would hold it far past the end of the test).
//!
//! The children are this test binary re-invoked with
//! `SEAWALL_FAILOVER_CHILD=<index>`, running `failover::child`; each prints
//! one line per call (`@@ <unix µs> <kind> <latency µs>`). The test prints
//! how long each phase lasted and how many admissions went over the limit
//! (`cargo test -p seawall-redis --test redis failover -- --nocapture`).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use seawall::{Bulkhead, Error, Pipeline, RateLimiter, RejectionReason, StoreError};
use seawall_redis::RedisStore;

use crate::support::{rt, unique, Events, RedisCluster};

const CHILD: &str = "SEAWALL_FAILOVER_CHILD";
const URLS: &str = "SEAWALL_FAILOVER_URLS";
const PREFIX: &str = "SEAWALL_FAILOVER_PREFIX";
const STOP: &str = "SEAWALL_FAILOVER_STOP";

/// Admissions per one-second window.
const LIMIT: u32 = 50;
const TIMEOUT: Duration = Duration::from_millis(250);
/// The longest an async call may take: connect timeout + timeout, plus
/// scheduling slack (four child processes and a six-node cluster share two
/// cores; a call that waited for the node timeout, 2 s, or hung would
/// still fail).
const BOUND: Duration = Duration::from_millis(1600);
/// The longest a blocking call may take: twice connect timeout + timeout
/// (the cluster client tries a command once more), plus the same slack.
const SYNC_BOUND: Duration = Duration::from_millis(1950);
/// The cluster's node timeout: how long a silent master takes to be
/// failed.
const NODE_TIMEOUT_MS: &str = "2000";

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("child without {name}"))
}

/// Child `i`: fails open for 0 and 1, closed for 2 and 3; calls through
/// the sync path for even `i`, the async path for odd.
fn fails_open(i: u32) -> bool {
    i < 2
}

/// What one call answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Admitted through Redis.
    Shared,
    /// Admitted on process-local state (fail-open), reported degraded.
    Local,
    /// Refused by the rate limit.
    Limited,
    /// `Error::Store` with an outage (fail-closed).
    Store,
}

impl Kind {
    fn code(self) -> &'static str {
        match self {
            Kind::Shared => "S",
            Kind::Local => "L",
            Kind::Limited => "R",
            Kind::Store => "E",
        }
    }

    fn parse(s: &str) -> Kind {
        match s {
            "S" => Kind::Shared,
            "L" => Kind::Local,
            "R" => Kind::Limited,
            "E" => Kind::Store,
            other => panic!("unknown kind {other}"),
        }
    }
}

/// The entry point of every child process; does nothing in a normal run.
#[test]
fn child() {
    let Ok(index) = std::env::var(CHILD) else {
        return;
    };
    let index: u32 = index.parse().unwrap();
    let urls: Vec<String> = env(URLS).split(' ').map(str::to_owned).collect();
    let b = RedisStore::cluster(urls)
        .prefix(env(PREFIX))
        .timeout(TIMEOUT)
        .reconnect_interval(Duration::from_millis(100));
    let store = if fails_open(index) {
        b.fail_open()
    } else {
        b.fail_closed()
    }
    .build()
    .unwrap();
    let events = Events::default();
    let p = Pipeline::builder("failover")
        .rate_limiter(RateLimiter::fixed_window(LIMIT, Duration::from_secs(1)))
        // A lease far longer than the cluster has been up: a failover taken
        // for a restart would hold admissions for most of it.
        .bulkhead(Bulkhead::new(64).lease(Duration::from_secs(60)))
        .on_event(events.listener())
        .store(store)
        .build()
        .unwrap();
    let stop = PathBuf::from(env(STOP));
    let rt = rt();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !stop.exists() && Instant::now() < deadline {
        let start = Instant::now();
        let at = unix_us();
        let r = if index.is_multiple_of(2) {
            p.call(|_| Ok::<_, std::io::Error>(()))
        } else {
            rt.block_on(p.run(|_| async { Ok::<_, std::io::Error>(()) }))
        };
        let took = start.elapsed();
        let degraded = Events::degraded(&events.take()) > 0;
        let kind = match r {
            Ok(()) if degraded => Kind::Local,
            Ok(()) => Kind::Shared,
            Err(Error::Rejected(r)) if r.reason == RejectionReason::RateLimited => Kind::Limited,
            Err(Error::Store(StoreError::Unavailable(_) | StoreError::Timeout(_))) => Kind::Store,
            Err(e) => panic!("child {index}: unexpected {e}"),
        };
        println!("@@ {at} {} {}", kind.code(), took.as_micros());
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn spawn(index: u32, urls: &[String], prefix: &str, stop: &std::path::Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "failover::child",
            "--nocapture",
            "--test-threads",
            "1",
            "-q",
        ])
        .env(CHILD, index.to_string())
        .env(URLS, urls.join(" "))
        .env(PREFIX, prefix)
        .env(STOP, stop)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn a child process")
}

/// One call of a child: when it started (unix µs), what it answered, how
/// long it took.
#[derive(Debug, Clone, Copy)]
struct Call {
    at: u64,
    kind: Kind,
    took: Duration,
}

impl Call {
    /// When it ended (unix µs).
    fn end(&self) -> u64 {
        self.at + self.took.as_micros() as u64
    }
}

fn read_calls(child: &mut Child) -> std::thread::JoinHandle<Vec<Call>> {
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| {
                let rest = l.strip_prefix("@@ ")?.to_owned();
                let f: Vec<&str> = rest.split_whitespace().collect();
                Some(Call {
                    at: f[0].parse().ok()?,
                    kind: Kind::parse(f[1]),
                    took: Duration::from_micros(f[2].parse().ok()?),
                })
            })
            .collect()
    })
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

#[test]
fn a_killed_master_s_slots_follow_the_fail_mode_then_resume_on_the_promoted_replica() {
    let mut cluster = RedisCluster::start_with(&["--cluster-node-timeout", NODE_TIMEOUT_MS]);
    let prefix = unique("failover");
    let slot = cluster.keyslot(&format!("{{{prefix}:failover}}:s"));
    let master = cluster.master_of_slot(slot);
    let replica = cluster.replica_of(master);
    let urls = cluster.master_urls();
    let dir = tempfile::tempdir().unwrap();
    let stop = dir.path().join("stop");
    let mut children: Vec<Child> = (0..4).map(|i| spawn(i, &urls, &prefix, &stop)).collect();
    let readers: Vec<_> = children.iter_mut().map(read_calls).collect();

    // Steady state first, then the master dies.
    std::thread::sleep(Duration::from_millis(2500));
    let killed = unix_us();
    cluster.kill(master);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cluster.is_master(replica) {
        assert!(Instant::now() < deadline, "the replica was never promoted");
        std::thread::sleep(Duration::from_millis(10));
    }
    let promoted = unix_us();
    assert!(
        cluster.wait_until_ready(Duration::from_secs(30)),
        "the cluster never served every slot again"
    );
    let ready = unix_us();
    // Time for every process to come back, then some admissions after.
    std::thread::sleep(Duration::from_millis(3000));
    std::fs::write(&stop, b"").unwrap();
    let calls: Vec<Vec<Call>> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    for (i, mut c) in children.into_iter().enumerate() {
        assert!(
            c.wait().unwrap().success(),
            "child {i} failed (its message is above)"
        );
    }
    assert_eq!(cluster.master_of_slot(slot), replica);

    // Per process: detection (first answer not through Redis after the
    // kill) and resumption (first admission through Redis after the
    // promotion).
    let mut detection = Vec::new();
    let mut resumption = Vec::new();
    for (i, calls) in calls.iter().enumerate() {
        let i = i as u32;
        assert!(!calls.is_empty(), "child {i} made no call");
        let slowest = calls.iter().map(|c| c.took).max().unwrap();
        let bound = if i.is_multiple_of(2) {
            SYNC_BOUND
        } else {
            BOUND
        };
        assert!(slowest < bound, "child {i}: a call took {slowest:?}");
        for c in calls {
            match (fails_open(i), c.kind) {
                (true, Kind::Store) => panic!("child {i} (fail-open) answered Error::Store"),
                (false, Kind::Local) => panic!("child {i} (fail-closed) admitted locally"),
                _ => {}
            }
        }
        let first_degraded = calls
            .iter()
            .find(|c| c.at >= killed && matches!(c.kind, Kind::Local | Kind::Store))
            .unwrap_or_else(|| panic!("child {i} never saw the master die"));
        detection.push(first_degraded.at.saturating_sub(killed));
        let back = calls
            .iter()
            .find(|c| c.at > first_degraded.at && c.at >= promoted && c.kind == Kind::Shared)
            .unwrap_or_else(|| panic!("child {i} never admitted through Redis again"));
        resumption.push(back.at - killed);
        // Nothing answered locally or refused by the store once it was back.
        assert!(
            calls
                .iter()
                .filter(|c| c.at > back.at)
                .all(|c| matches!(c.kind, Kind::Shared | Kind::Limited)),
            "child {i} fell back again after it resumed"
        );
    }
    let all_back = *resumption.iter().max().unwrap() + killed;

    // Admissions per one-second window of the server's clock (the fixed
    // window's). A call is counted in a window when it started and ended in
    // it (its script ran then); one that straddles two windows counts in
    // neither, so the checks below hold for what is known, and over-limit
    // counts are reported as a range.
    let window = |at: u64| at / 1_000_000;
    let (first, last) = (
        calls.iter().flatten().map(|c| window(c.at)).min().unwrap(),
        calls
            .iter()
            .flatten()
            .map(|c| window(c.end()))
            .max()
            .unwrap(),
    );
    let (mut over_shared, mut over_local) = ((0u64, 0u64), (0u64, 0u64));
    let mut full_windows_after = 0;
    let limit = u64::from(LIMIT);
    for w in first..=last {
        // (surely in `w`, possibly in `w`)
        let count = |kind: Kind| {
            let of_kind = || calls.iter().flatten().filter(move |c| c.kind == kind);
            (
                of_kind()
                    .filter(|c| window(c.at) == w && window(c.end()) == w)
                    .count() as u64,
                of_kind()
                    .filter(|c| window(c.at) == w || window(c.end()) == w)
                    .count() as u64,
            )
        };
        let (shared, shared_max) = count(Kind::Shared);
        let (local, local_max) = count(Kind::Local);
        let during = w >= window(killed) && w <= window(all_back);
        if !during {
            // Outside the failover, one quota per window, through Redis.
            assert_eq!(local_max, 0, "window {w}");
            assert!(shared <= limit, "window {w}: {shared} admitted");
            if w > window(all_back) && w < last && shared_max >= limit {
                full_windows_after += 1;
            }
        } else {
            // What the old master admitted and had not replicated is lost.
            assert!(shared <= 2 * limit, "window {w}: {shared}");
            // At most one local quota per fail-open process and (local)
            // window: two processes, windows that may straddle this one.
            assert!(local <= 4 * limit, "window {w}: {local} local");
            let over = |s: u64, l: u64| {
                let shared_over = s.saturating_sub(limit);
                (shared_over, (s + l).saturating_sub(limit) - shared_over)
            };
            let (lo, hi) = (over(shared, local), over(shared_max, local_max));
            over_shared = (over_shared.0 + lo.0, over_shared.1 + hi.0);
            over_local = (over_local.0 + lo.1, over_local.1 + hi.1);
        }
    }
    assert!(full_windows_after > 0, "the limit is reached again after");

    let range = |v: &[u64]| {
        format!(
            "{:.0}..{:.0} ms",
            ms(*v.iter().min().unwrap()),
            ms(*v.iter().max().unwrap())
        )
    };
    eprintln!(
        "failover (node timeout {NODE_TIMEOUT_MS} ms, store timeout {TIMEOUT:?}, reconnect \
         every 100 ms, limit {LIMIT}/s):\n  \
         detection (kill to first local or refused answer, per process): {}\n  \
         promotion (kill to replica answering ROLE master): {:.0} ms\n  \
         cluster ok (kill to every node cluster_state:ok): {:.0} ms\n  \
         resumption (kill to first admission through Redis, per process): {}\n  \
         admissions over the limit in the windows of the failover: {}..{} local (fail-open, \
         by design), {}..{} through Redis (writes the old master had not replicated)\n  \
         calls: {:?}",
        range(&detection),
        ms(promoted - killed),
        ms(ready - killed),
        range(&resumption),
        over_local.0,
        over_local.1,
        over_shared.0,
        over_shared.1,
        calls.iter().map(Vec::len).collect::<Vec<_>>(),
    );
}
