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
//!
//! Leased mode through the same failover is tested in one process, with
//! three stores of their own connections (`leased_mode_…`): the batch in
//! hand is spent, then the fail mode answers, then each store leases on
//! the promoted replica.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use seawall::store::{AdmitRequest, Permit, ResourceSpec, StateStore};
use seawall::{Bulkhead, Error, Pipeline, RateLimiter, RejectionReason, StoreError};
use seawall_redis::{Leasing, RedisStore};

use crate::support::{rt, unique, Events, RedisCluster};

/// The failover tests run one at a time: each fails a master of a cluster
/// of its own over, under load of its own, and two at once on a shared
/// two-core machine slow each other's stores past their timeouts.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner)
}

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

/// Kills `master` and waits (30 s at most each) for `replica` to be
/// promoted and for every slot to be served again: when each happened
/// (`unix_us`): the kill, the promotion, the cluster ready.
fn fail_over(cluster: &mut RedisCluster, master: u16, replica: u16) -> (u64, u64, u64) {
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
    (killed, promoted, unix_us())
}

/// The span of `v` (microseconds), in milliseconds.
fn range(v: &[u64]) -> String {
    format!(
        "{:.0}..{:.0} ms",
        ms(*v.iter().min().unwrap()),
        ms(*v.iter().max().unwrap())
    )
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

#[test]
fn a_killed_master_s_slots_follow_the_fail_mode_then_resume_on_the_promoted_replica() {
    let _one = one_at_a_time();
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
    let (killed, promoted, ready) = fail_over(&mut cluster, master, replica);
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

// ------------------------------------------------------------ leased mode

/// What one call of the leased failover test answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leased {
    /// Admitted on a permit or slot leased from Redis.
    Shared,
    /// Admitted on process-local state (fail-open).
    Local,
    /// Refused on process-local state (fail-open).
    LocalRefused,
    /// Refused by the rate limit or the bulkhead (through Redis, or its
    /// refusal replayed).
    Refused,
    /// `Error::Store` with an outage (fail-closed).
    Store,
    /// `Error::Store` naming a restart: the failover taken for one.
    Held,
}

/// One call of the leased failover test: resource (0: rate limit, 1:
/// bulkhead), start and end (unix µs), answer.
#[derive(Debug, Clone)]
struct LeasedCall {
    resource: usize,
    at: u64,
    end: u64,
    kind: Leased,
    /// The store's error, for `Store`.
    error: Option<StoreError>,
}

fn leased_kind(
    a: Result<seawall::store::Admission, StoreError>,
) -> (Leased, Option<Permit>, Option<StoreError>) {
    let error = a.as_ref().err().cloned();
    let (kind, permit) = match a {
        Ok(a) => match a.decision {
            Ok(p) if p.local => (Leased::Local, Some(p)),
            Err(_) if a.degraded.is_some() => (Leased::LocalRefused, None),
            Ok(p) => {
                assert!(a.degraded.is_none(), "admitted through Redis, degraded");
                (Leased::Shared, Some(p))
            }
            Err(_) => (Leased::Refused, None),
        },
        Err(StoreError::Unavailable(m)) if m.contains("restart") => (Leased::Held, None),
        Err(StoreError::Unavailable(_) | StoreError::Timeout(_)) => (Leased::Store, None),
        Err(e) => panic!("unexpected {e}"),
    };
    (kind, permit, error)
}

/// Leased mode through a failover, three stores (each with connections of
/// its own, as three processes have: two fail closed, on the blocking and
/// the async path, one fails open) on a leased fixed window of 100 per
/// second (batches of 10, renewed at 5; one thread per store) and a leased
/// bulkhead of 4 (batches of 2, TTL 500 ms; two threads per store, six in
/// all, each call holding its slot 5 ms), both on the slot of the master
/// killed. The
/// batch in hand is spent; then the fail mode answers; the replica is
/// promoted and every store leases on it again, without a restart and
/// without a hold (no call is held as after a restart). Counted per
/// one-second window of the server's clock: admissions through Redis stay
/// within the stated overshoot bound (`limit + N × (b + l)`) outside the
/// failover, and within it plus what the old master had not replicated
/// during it; slots in use through Redis never exceed the capacity. The
/// phases and counts are printed
/// (`cargo test -p seawall-redis --test redis failover::leased -- --nocapture`).
#[test]
fn leased_mode_spends_the_batch_follows_the_fail_mode_then_leases_on_the_promoted_replica() {
    let _one = one_at_a_time();
    const LIMIT: u64 = 100;
    const BATCH: u32 = 10;
    const LOW: u32 = 5;
    const CAPACITY: u32 = 4;
    const STORES: u64 = 3;
    /// A limit no store reaches: each holds a batch at the kill.
    const STEADY: u32 = 100_000;
    let mut cluster = RedisCluster::start_with(&["--cluster-node-timeout", NODE_TIMEOUT_MS]);
    let prefix = unique("leased-failover");
    let slot_of = |name: &str| cluster.keyslot(&format!("{{{prefix}:{name}}}:s"));
    let master = cluster.master_of_slot(slot_of("rate"));
    let on_master = |stem: &str| {
        (0..)
            .map(|i| format!("{stem}-{i}"))
            .find(|n| cluster.master_of_slot(slot_of(n)) == master)
            .unwrap()
    };
    let (pool, steady) = (on_master("pool"), on_master("steady"));
    let replica = cluster.replica_of(master);
    let urls = cluster.master_urls();
    let specs = [
        ResourceSpec::new("rate").with_rate_limit(RateLimiter::fixed_window(
            LIMIT as u32,
            Duration::from_secs(1),
        )),
        ResourceSpec::new(&pool)
            .with_bulkhead(Bulkhead::new(CAPACITY).lease(Duration::from_secs(10))),
        ResourceSpec::new(&steady)
            .with_rate_limit(RateLimiter::fixed_window(STEADY, Duration::from_secs(1))),
    ];
    let stop = Arc::new(AtomicBool::new(false));
    // Calls running on slots leased from Redis, and on local ones.
    let running = Arc::new([AtomicU32::new(0), AtomicU32::new(0)]);
    let peak = Arc::new([AtomicU32::new(0), AtomicU32::new(0)]);
    let mut threads = Vec::new();
    for (open, asynchronous) in [(false, false), (false, true), (true, false)] {
        let b = RedisStore::cluster(urls.clone())
            .prefix(&prefix)
            .timeout(TIMEOUT)
            .reconnect_interval(Duration::from_millis(100))
            .leased("rate", Leasing::batch(BATCH).low_water(LOW))
            .leased(steady.as_str(), Leasing::batch(BATCH).low_water(LOW))
            .leased(
                pool.as_str(),
                Leasing::batch(2)
                    .low_water(0)
                    .ttl(Duration::from_millis(500)),
            );
        let store = if open { b.fail_open() } else { b.fail_closed() }
            .build()
            .unwrap();
        let states = specs.each_ref().map(|spec| store.bind(spec).unwrap());
        // One thread on both rate limits, two on the bulkhead.
        for resources in [vec![0, 2], vec![1], vec![1]] {
            let states: Vec<_> = resources.iter().map(|&r| Arc::clone(&states[r])).collect();
            let (stop, running, peak) = (stop.clone(), running.clone(), peak.clone());
            threads.push(std::thread::spawn(move || {
                let rt = rt();
                let mut calls = Vec::new();
                // Bounded: the test stops the thread long before.
                for _ in 0..20_000 {
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    for (&resource, state) in resources.iter().zip(&states) {
                        let at = unix_us();
                        let request = AdmitRequest::new(None, Duration::from_micros(at));
                        let a = if asynchronous {
                            rt.block_on(async { state.admit_async(request).await })
                        } else {
                            state.admit(&request)
                        };
                        let (kind, permit, error) = leased_kind(a);
                        if resource == 1 {
                            if let Some(permit) = permit {
                                let i = usize::from(kind == Leased::Local);
                                let now = running[i].fetch_add(1, Ordering::SeqCst) + 1;
                                peak[i].fetch_max(now, Ordering::SeqCst);
                                std::thread::sleep(Duration::from_millis(5));
                                running[i].fetch_sub(1, Ordering::SeqCst);
                                state.release(None, permit);
                            }
                        }
                        calls.push(LeasedCall {
                            resource,
                            at,
                            end: unix_us(),
                            kind,
                            error,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                (open, calls)
            }));
        }
    }

    std::thread::sleep(Duration::from_millis(1500));
    let (killed, promoted, ready) = fail_over(&mut cluster, master, replica);
    std::thread::sleep(Duration::from_millis(2000));
    stop.store(true, Ordering::Release);
    let logs: Vec<(bool, Vec<LeasedCall>)> =
        threads.into_iter().map(|t| t.join().unwrap()).collect();

    let (mut detection, mut resumption) = (Vec::new(), Vec::new());
    let mut spent = Vec::new();
    for (i, (open, calls)) in logs.iter().enumerate() {
        assert!(!calls.is_empty(), "thread {i} made no call");
        for c in calls {
            match (open, c.kind) {
                (_, Leased::Held) => panic!("thread {i}: the failover was taken for a restart"),
                (true, Leased::Store) => panic!("thread {i} (fail-open) answered Error::Store"),
                (false, Leased::Local | Leased::LocalRefused) => {
                    panic!("thread {i} (fail-closed) answered locally")
                }
                _ => {}
            }
        }
        let first = calls
            .iter()
            .find(|c| {
                // The steady rate limit (the other may be refused then).
                c.resource != 0
                    && c.at >= killed
                    && matches!(c.kind, Leased::Local | Leased::LocalRefused | Leased::Store)
            })
            .unwrap_or_else(|| panic!("thread {i} never followed its fail mode"));
        detection.push(first.at - killed);
        // Answered by Redis again: admitted, or refused (a bulkhead whose
        // slots the other stores' pools hold).
        let back = calls
            .iter()
            .find(|c| {
                c.at > first.at
                    && c.at >= promoted
                    && matches!(c.kind, Leased::Shared | Leased::Refused)
            })
            .unwrap_or_else(|| panic!("thread {i} never answered through Redis again"));
        resumption.push(back.at - killed);
        // Once every node reports the cluster ok (until then a node that
        // still reports `cluster_state:fail` to a new connection is an
        // outage again), and the store has had its reconnect interval
        // (100 ms) twice to learn the new owner of the slot (a call that
        // still finds the old map marks the store down until the next
        // reconnect), nothing falls back.
        let settled = back.at.max(ready + 200_000);
        if let Some(c) = calls
            .iter()
            .find(|c| c.at > settled && !matches!(c.kind, Leased::Shared | Leased::Refused))
        {
            panic!(
                "thread {i} fell back again {} ms after the kill, {} ms after the cluster was \
                 ready: {:?} {:?}",
                ms(c.at - killed),
                ms(c.at - ready),
                c.kind,
                c.error
            );
        }
    }
    let all_back = killed + resumption.iter().max().unwrap();
    // While the slot has no master, a store admits from what it held at the
    // kill and nothing more: the rate limit's batch in hand (at most a
    // batch plus the low-water mark), the pool's slots until TTL after
    // their last extension (sent before the kill).
    for (i, (_, calls)) in logs.iter().enumerate() {
        let shared_between = |resource: usize, from: u64| {
            calls
                .iter()
                .filter(|c| {
                    c.resource == resource
                        && c.kind == Leased::Shared
                        && c.at >= from
                        && c.at < promoted
                })
                .count() as u64
        };
        let from_batch = shared_between(2, killed);
        assert!(
            from_batch <= u64::from(BATCH + LOW),
            "thread {i}: {from_batch} admitted from the batch without a master"
        );
        if calls[0].resource == 0 {
            spent.push(from_batch);
        }
        let late = shared_between(1, killed + 550_000);
        assert_eq!(late, 0, "thread {i}: pool admitted from after its TTL");
    }

    // Leasing again after the failover: every store's rate limit, and the
    // bulkhead's pools.
    let shared_after = |calls: &[LeasedCall], resource: usize| {
        calls
            .iter()
            .any(|c| c.resource == resource && c.at >= all_back && c.kind == Leased::Shared)
    };
    for (i, (_, calls)) in logs.iter().enumerate() {
        if calls[0].resource == 0 {
            assert!(shared_after(calls, 0), "thread {i} leased no permit after");
            assert!(shared_after(calls, 2), "thread {i} leased no permit after");
        }
    }
    assert!(
        logs.iter().any(|(_, c)| shared_after(c, 1)),
        "no slot leased after"
    );

    // Rate-limit admissions per window of the server's clock (a call in
    // `w` when it started and ended in it; straddlers counted in neither).
    let window = |us: u64| us / 1_000_000;
    let rate = || {
        logs.iter()
            .flat_map(|(_, c)| c.iter())
            .filter(|c| c.resource == 0)
    };
    let first = rate().map(|c| window(c.at)).min().unwrap();
    let last = rate().map(|c| window(c.end)).max().unwrap();
    let bound = LIMIT + STORES * u64::from(BATCH + LOW);
    let (mut over_outside, mut over_during, mut most_local) = (0, 0, 0);
    for w in first + 1..last {
        let count = |kind: Leased| {
            rate()
                .filter(|c| c.kind == kind && window(c.at) == w && window(c.end) == w)
                .count() as u64
        };
        let (shared, local) = (count(Leased::Shared), count(Leased::Local));
        let during = w >= window(killed) && w <= window(all_back);
        if during {
            assert!(
                shared <= bound + LIMIT,
                "window {w}: {shared} through Redis"
            );
            // One fail-open process: one local quota per (local) window.
            assert!(local <= LIMIT, "window {w}: {local} local");
            over_during = over_during.max(shared.saturating_sub(LIMIT));
            most_local = most_local.max(local);
        } else {
            assert_eq!(local, 0, "window {w}");
            assert!(shared <= bound, "window {w}: {shared} admitted");
            over_outside = over_outside.max(shared.saturating_sub(LIMIT));
        }
    }
    let peaks = [0, 1].map(|i| peak[i].load(Ordering::SeqCst));
    assert!(
        peaks[0] <= CAPACITY,
        "{} slots in use through Redis",
        peaks[0]
    );
    assert!(peaks[1] <= CAPACITY, "{} local slots in use", peaks[1]);

    eprintln!(
        "leased failover (node timeout {NODE_TIMEOUT_MS} ms, store timeout {TIMEOUT:?}, limit \
         {LIMIT}/s in batches of {BATCH} renewed at {LOW}, bulkhead of {CAPACITY} in batches \
         of 2):\n  \
         detection (kill to first fail-mode answer, per store and resource, the batch in hand spent): {}\n  \
         promotion (kill to replica answering ROLE master): {:.0} ms\n  \
         cluster ok (kill to every node cluster_state:ok): {:.0} ms\n  \
         resumption (kill to first answer through Redis after the promotion): {}\n  \
         rate limit, admitted from the batch in hand after the kill (a limit not \
         reached), per store: {spent:?} (bound {}); most over the limit in one window: {over_outside} outside the failover \
         (bound {}), {over_during} during it; most local admissions in one window: \
         {most_local}\n  \
         bulkhead, most slots in use at once: {} through Redis, {} local\n  \
         calls: {:?}",
        range(&detection),
        ms(promoted - killed),
        ms(ready - killed),
        range(&resumption),
        BATCH + LOW,
        bound - LIMIT,
        peaks[0],
        peaks[1],
        logs.iter().map(|(_, c)| c.len()).collect::<Vec<_>>(),
    );
}
