//! Several OS processes sharing one rate limit, one bulkhead, one circuit
//! and one retry budget through Redis. The children are this test binary re-invoked with
//! `SEAWALL_REDIS_CHILD=<role>`, running the `cross_process::child` test;
//! each prints its findings on lines starting with `@@ `.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use seawall::{
    Bulkhead, CircuitBreaker, CircuitState, Error, Pipeline, RateLimiter, RejectionReason, Retry,
    RetryBudget,
};
use seawall_redis::{Leasing, RedisStore};

use crate::support::{rt, unique, RedisServer};

const ROLE: &str = "SEAWALL_REDIS_CHILD";
const URL: &str = "SEAWALL_REDIS_URL";
const PREFIX: &str = "SEAWALL_REDIS_PREFIX";
const START: &str = "SEAWALL_REDIS_START_MS";
const INDEX: &str = "SEAWALL_REDIS_INDEX";

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("child without {name}"))
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The entry point of every child process; does nothing in a normal run.
#[test]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let store = RedisStore::builder(env(URL))
        .prefix(env(PREFIX))
        .timeout(Duration::from_secs(2))
        .fail_closed()
        .build()
        .unwrap();
    // The rate limiters are bound (their scripts loaded) before the start,
    // so that the processes race with their admissions only.
    let rate = (role == "rate").then(|| rate_pipelines(&store));
    if let Ok(start) = std::env::var(START) {
        let start: u64 = start.parse().unwrap();
        let now = unix_ms();
        if start > now {
            std::thread::sleep(Duration::from_millis(start - now));
        }
    }
    let index: u32 = std::env::var(INDEX)
        .ok()
        .and_then(|i| i.parse().ok())
        .unwrap_or(0);
    match role.as_str() {
        "rate" => child_rate(rate.expect("bound above"), index),
        "bulkhead" => child_bulkhead(store),
        "observe" => child_observe(store),
        "trip" => child_trip(store),
        "hold" => child_hold(store),
        "budget" => child_budget(store, index, true),
        "budget-local" => child_budget(store, index, false),
        "lease-rate" => child_lease_rate(index),
        "lease-die" => child_lease_die(),
        "slots" => child_slots(index),
        "slots-die" => child_slots_die(),
        other => panic!("unknown child role {other}"),
    }
}

fn spawn(
    role: &str,
    server: &RedisServer,
    prefix: &str,
    index: u32,
    start_ms: Option<u64>,
) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "cross_process::child",
        "--nocapture",
        "--test-threads",
        "1",
        "-q",
    ])
    .env(ROLE, role)
    .env(URL, server.url())
    .env(PREFIX, prefix)
    .env(INDEX, index.to_string())
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    if let Some(ms) = start_ms {
        cmd.env(START, ms.to_string());
    }
    cmd.spawn().expect("spawn a child process")
}

/// Waits for a child (at most 60 s) and returns its `@@ ` lines.
fn finish(mut child: Child) -> Vec<String> {
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| l.strip_prefix("@@ ").map(str::to_owned))
            .collect::<Vec<_>>()
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "child failed: {status}");
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("child did not finish in 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    reader.join().unwrap()
}

/// `key=value` fields of a result line.
fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
        .parse()
        .unwrap()
}

// ------------------------------------------------------------ rate limit

const RATE_LIMIT: u32 = 40;
const RATE_TRIES: u32 = 60;

fn rate_pipelines(store: &RedisStore) -> [Pipeline; 3] {
    let hour = Duration::from_secs(3600);
    let build = |name: &str, limiter: RateLimiter| {
        Pipeline::builder(name)
            .rate_limiter(limiter)
            .store(store.clone())
            .build()
            .unwrap()
    };
    [
        build("fixed", RateLimiter::fixed_window(RATE_LIMIT, hour)),
        build("sliding", RateLimiter::sliding_window(RATE_LIMIT, hour)),
        build("gcra", RateLimiter::gcra(RATE_LIMIT, hour)),
    ]
}

fn child_rate(pipelines: [Pipeline; 3], index: u32) {
    let mut admitted = [0u32; 3];
    let count = |r: Result<(), Error<std::io::Error>>| match r {
        Ok(()) => 1,
        Err(e) => {
            assert_eq!(
                e.rejection().map(|r| r.reason),
                Some(RejectionReason::RateLimited),
                "{e}"
            );
            0
        }
    };
    if index.is_multiple_of(2) {
        for _ in 0..RATE_TRIES {
            for (i, p) in pipelines.iter().enumerate() {
                admitted[i] += count(p.call(|_| Ok(())));
            }
        }
    } else {
        rt().block_on(async {
            for _ in 0..RATE_TRIES {
                for (i, p) in pipelines.iter().enumerate() {
                    admitted[i] += count(p.run(|_| async { Ok(()) }).await);
                }
            }
        });
    }
    println!(
        "@@ fixed={} sliding={} gcra={}",
        admitted[0], admitted[1], admitted[2]
    );
}

#[test]
fn four_processes_admit_exactly_the_rate_limit() {
    let server = RedisServer::start();
    let prefix = unique("xrate");
    let start = unix_ms() + 1000;
    let children: Vec<Child> = (0..4)
        .map(|i| spawn("rate", &server, &prefix, i, Some(start)))
        .collect();
    let lines: Vec<String> = children.into_iter().flat_map(finish).collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    for algorithm in ["fixed", "sliding", "gcra"] {
        let total: u64 = lines.iter().map(|l| field(l, algorithm)).sum();
        assert_eq!(total, u64::from(RATE_LIMIT), "{algorithm}: {lines:?}");
        // Contention: more than one process got permits.
        let winners = lines.iter().filter(|l| field(l, algorithm) > 0).count();
        assert!(winners >= 2, "{algorithm}: {lines:?}");
    }
}

// ---------------------------------------------------------- retry budget

const BUDGET_CALLS: u32 = 200;
const BUDGET_RATIO: f64 = 0.01;
const BUDGET_TOKENS: u32 = 20;

/// `BUDGET_CALLS` calls to a dependency that always fails, up to 4 retries
/// each, under a budget kept in Redis (`shared`) or in this process; sync
/// in even children, async in odd ones.
fn child_budget(store: RedisStore, index: u32, shared: bool) {
    let budget = RetryBudget::new(BUDGET_RATIO, BUDGET_TOKENS);
    let p = Pipeline::builder("sick-dependency")
        .retry(
            Retry::constant(Duration::ZERO)
                .max_attempts(5)
                .budget(if shared { budget.shared() } else { budget }),
        )
        .store(store)
        .build()
        .unwrap();
    let attempts = std::sync::atomic::AtomicU32::new(0);
    let op = || {
        attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Err::<(), _>(std::io::Error::other("down"))
    };
    let mut refused = 0;
    let mut tally = |e: Error<std::io::Error>| match e {
        Error::Rejected(r) => {
            assert_eq!(r.reason, RejectionReason::RetryBudgetExhausted);
            refused += 1;
        }
        Error::RetryExhausted { .. } => {}
        other => panic!("{other:?}"),
    };
    if index.is_multiple_of(2) {
        for _ in 0..BUDGET_CALLS {
            tally(p.call(|_| op()).unwrap_err());
        }
    } else {
        rt().block_on(async {
            for _ in 0..BUDGET_CALLS {
                let result = p.run(|_| {
                    let r = op();
                    async move { r }
                });
                tally(result.await.unwrap_err());
            }
        });
    }
    let attempts = attempts.load(std::sync::atomic::Ordering::Relaxed);
    println!("@@ retries={} refused={refused}", attempts - BUDGET_CALLS);
}

#[test]
fn four_processes_retry_within_one_shared_budget() {
    let server = RedisServer::start();
    let prefix = unique("xbudget");
    let start = unix_ms() + 1000;
    let children: Vec<Child> = (0..4)
        .map(|i| spawn("budget", &server, &prefix, i, Some(start)))
        .chain((0..4).map(|i| spawn("budget-local", &server, &prefix, i, Some(start))))
        .collect();
    let lines: Vec<Vec<String>> = children.into_iter().map(finish).collect();
    let total = |lines: &[Vec<String>]| -> u64 {
        lines.iter().flatten().map(|l| field(l, "retries")).sum()
    };
    let (shared, local) = lines.split_at(4);
    let calls = 4 * u64::from(BUDGET_CALLS);
    // In thousandths: 20 tokens to start, 10 per call, 1000 per retry.
    // The bound, ratio x calls + max_tokens: 0.01 x 800 + 20 = 28 retries.
    let bound = (u64::from(BUDGET_TOKENS) * 1000 + calls * 10) / 1000;
    assert_eq!(bound, 28);
    let shared_retries = total(shared);
    assert!(
        shared_retries <= bound,
        "{shared_retries} retries: {shared:?}"
    );
    // Every call fails, so the bucket is drained: the only deposits lost
    // are those made while it was full, before the first retry (at most
    // one per process), and less than a token is left at the end.
    assert!(
        shared_retries >= bound - 1,
        "{shared_retries} retries: {shared:?}"
    );
    // Each process on a budget of its own: 20 tokens, 200 deposits of 10
    // (the first lost to the full bucket): 21 retries each, 84 in all,
    // against a bound of 4 x (0.01 x 200 + 20) = 88.
    assert_eq!(total(local), 84, "{local:?}");
}

// -------------------------------------------------------------- bulkhead

const BULKHEAD: u32 = 3;

fn child_bulkhead(store: RedisStore) {
    let p = Pipeline::builder("pool")
        .bulkhead(Bulkhead::new(BULKHEAD).lease(Duration::from_secs(10)))
        .store(store)
        .build()
        .unwrap();
    // The operation counts itself in and out in Redis: the largest count
    // seen is the most attempts ever inside the bulkhead at once.
    let client = redis::Client::open(env(URL)).unwrap();
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap();
    let counter = format!("{}:inside", env(PREFIX));
    let (mut admitted, mut rejected, mut max) = (0u64, 0u64, 0i64);
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        let r = p.call(|_| {
            let inside: i64 = redis::cmd("INCR").arg(&counter).query(&mut conn).unwrap();
            max = max.max(inside);
            std::thread::sleep(Duration::from_millis(10));
            let _: i64 = redis::cmd("DECR").arg(&counter).query(&mut conn).unwrap();
            Ok::<_, std::io::Error>(())
        });
        match r {
            Ok(()) => admitted += 1,
            Err(e) => {
                assert_eq!(
                    e.rejection().map(|r| r.reason),
                    Some(RejectionReason::BulkheadFull),
                    "{e}"
                );
                rejected += 1;
            }
        }
    }
    println!("@@ admitted={admitted} rejected={rejected} max={max}");
}

#[test]
fn four_processes_never_exceed_the_bulkhead() {
    let server = RedisServer::start();
    let prefix = unique("xbulkhead");
    let start = unix_ms() + 1000;
    let children: Vec<Child> = (0..4)
        .map(|i| spawn("bulkhead", &server, &prefix, i, Some(start)))
        .collect();
    let lines: Vec<String> = children.into_iter().flat_map(finish).collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    let max = lines.iter().map(|l| field(l, "max")).max().unwrap();
    let admitted: u64 = lines.iter().map(|l| field(l, "admitted")).sum();
    let rejected: u64 = lines.iter().map(|l| field(l, "rejected")).sum();
    assert!(
        max <= u64::from(BULKHEAD),
        "{max} attempts at once: {lines:?}"
    );
    assert!(max >= 2, "no contention: {lines:?}");
    assert!(admitted > 20 && rejected > 0, "{lines:?}");
    // Everything given back.
    let store = RedisStore::builder(server.url())
        .prefix(&prefix)
        .build()
        .unwrap();
    let p = Pipeline::builder("pool")
        .bulkhead(Bulkhead::new(BULKHEAD).lease(Duration::from_secs(10)))
        .store(store)
        .build()
        .unwrap();
    assert_eq!(p.in_flight().unwrap(), 0);
}

// --------------------------------------------------------------- circuit

fn circuit_pipeline(store: RedisStore) -> Pipeline {
    Pipeline::builder("flaky")
        .circuit_breaker(CircuitBreaker::consecutive_failures(3).cooldown(Duration::from_secs(60)))
        .store(store)
        .build()
        .unwrap()
}

fn child_observe(store: RedisStore) {
    let p = circuit_pipeline(store);
    let mut successes = 0;
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        match p.call(|_| Ok::<_, std::io::Error>(())) {
            Ok(()) => successes += 1,
            Err(e) => {
                let reason = e.rejection().map(|r| r.reason);
                assert_eq!(reason, Some(RejectionReason::CircuitOpen), "{e}");
                println!("@@ rejected=1 successes={successes}");
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("@@ rejected=0 successes={successes}");
}

fn child_trip(store: RedisStore) {
    let p = circuit_pipeline(store);
    for attempt in 1..=10u32 {
        match p.call(|_| Err::<(), _>(std::io::Error::other("down"))) {
            Err(Error::Operation(_)) => {}
            Err(e)
                if e.rejection()
                    .is_some_and(|r| r.reason == RejectionReason::CircuitOpen) =>
            {
                println!("@@ rejected_at={attempt}");
                return;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    println!("@@ rejected_at=0");
}

#[test]
fn one_process_failures_open_the_circuit_for_all() {
    let server = RedisServer::start();
    let prefix = unique("xcircuit");
    let observers: Vec<Child> = (0..3)
        .map(|i| spawn("observe", &server, &prefix, i, None))
        .collect();
    // Let the observers succeed a few times first.
    std::thread::sleep(Duration::from_millis(700));
    let tripper = spawn("trip", &server, &prefix, 3, None);
    let trip = finish(tripper);
    assert_eq!(trip.len(), 1);
    // Three failures in a row open it; an observer's success landing in
    // between restarts the run, so the tripper may need a few more.
    let rejected_at = field(&trip[0], "rejected_at");
    assert!(
        (4..=10).contains(&rejected_at),
        "the tripper never saw the circuit open: {trip:?}"
    );
    for child in observers {
        let lines = finish(child);
        assert_eq!(lines.len(), 1);
        assert_eq!(
            field(&lines[0], "rejected"),
            1,
            "observer saw the open circuit: {lines:?}"
        );
        assert!(field(&lines[0], "successes") > 0, "{lines:?}");
    }
    let p = circuit_pipeline(
        RedisStore::builder(server.url())
            .prefix(&prefix)
            .build()
            .unwrap(),
    );
    assert_eq!(p.circuit_state().unwrap(), CircuitState::Open);
}

// ------------------------------------------------------- killed holder

const LEASE: Duration = Duration::from_secs(2);

fn lease_pipeline(store: RedisStore) -> Pipeline {
    Pipeline::builder("leased")
        .bulkhead(Bulkhead::new(1).lease(LEASE))
        .store(store)
        .build()
        .unwrap()
}

fn child_hold(store: RedisStore) {
    let p = lease_pipeline(store);
    let _ = p.call(|_| {
        println!("@@ holding");
        use std::io::Write;
        std::io::stdout().flush().unwrap();
        std::thread::sleep(Duration::from_secs(30));
        Ok::<_, std::io::Error>(())
    });
}

#[test]
fn a_killed_holder_s_slot_returns_after_the_lease_and_not_before() {
    let server = RedisServer::start();
    let prefix = unique("xlease");
    let mut holder = spawn("hold", &server, &prefix, 0, None);
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    let held = loop {
        let line = lines.next().expect("child output").unwrap();
        if line == "@@ holding" {
            break Instant::now();
        }
    };
    // SIGKILL: no release, no record, nothing in the child runs again.
    holder.kill().unwrap();
    holder.wait().unwrap();

    let p = lease_pipeline(
        RedisStore::builder(server.url())
            .prefix(&prefix)
            .fail_closed()
            .build()
            .unwrap(),
    );
    let full = |p: &Pipeline| {
        p.call(|_| Ok::<_, std::io::Error>(()))
            .err()
            .is_some_and(|e| {
                e.rejection()
                    .is_some_and(|r| r.reason == RejectionReason::BulkheadFull)
            })
    };
    assert!(full(&p), "the dead child's slot is still leased");
    assert_eq!(p.in_flight().unwrap(), 1);
    std::thread::sleep(Duration::from_millis(1200).saturating_sub(held.elapsed()));
    assert!(
        full(&p),
        "not before the lease ends (1.2 s after the slot was taken)"
    );
    let back = loop {
        if !full(&p) {
            break held.elapsed();
        }
        assert!(
            held.elapsed() < LEASE + Duration::from_secs(2),
            "slot never came back"
        );
        std::thread::sleep(Duration::from_millis(25));
    };
    assert!(
        back >= LEASE - Duration::from_millis(150) && back <= LEASE + Duration::from_millis(700),
        "slot came back {back:?} after it was taken (lease {LEASE:?})"
    );
    assert_eq!(p.in_flight().unwrap(), 0);
}

// ------------------------------------------------------------ leased mode

/// GCRA: 2000 per second, bursts of 100; batches of 50, renewed at 25.
const LEASE_RATE: u32 = 2000;
const LEASE_BURST: u32 = 100;
const LEASE_BATCH: u32 = 50;
const LEASE_LOW: u32 = 25;
/// How long each child calls, as fast as it can.
const LEASE_RUN: Duration = Duration::from_millis(1500);

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

fn leased_store(batch: u32, low: u32) -> RedisStore {
    RedisStore::builder(env(URL))
        .prefix(env(PREFIX))
        .timeout(Duration::from_secs(2))
        .fail_closed()
        .leased("leased", Leasing::batch(batch).low_water(low))
        .build()
        .unwrap()
}

/// Leases a batch with one call, waits until 300 ms after the start, then
/// calls for `LEASE_RUN` as fast as it can (sync in even children, async
/// in odd ones) and prints the instant (unix microseconds) each admitted
/// call ran at.
fn child_lease_rate(index: u32) {
    let p = Pipeline::builder("leased")
        .rate_limiter(RateLimiter::gcra(LEASE_RATE, Duration::from_secs(1)).burst(LEASE_BURST))
        .store(leased_store(LEASE_BATCH, LEASE_LOW))
        .build()
        .unwrap();
    let times = std::sync::Mutex::new(Vec::<u64>::new());
    let mut refused = 0u64;
    let mut tally = |r: Result<(), Error<std::io::Error>>| match r {
        Ok(()) => {}
        Err(e) => {
            assert_eq!(
                e.rejection().map(|r| r.reason),
                Some(RejectionReason::RateLimited),
                "{e}"
            );
            refused += 1;
        }
    };
    let op = || {
        times.lock().unwrap().push(unix_us());
        Ok::<_, std::io::Error>(())
    };
    // One call leases a batch (49 left, above the low-water mark); then
    // every process waits while the limiter refills its burst, and all
    // call at once: the densest second then holds the burst, a second's
    // permits and the batches held, near the bound.
    tally(p.call(|_| op()));
    let start: u64 = env(START).parse().unwrap();
    let go = start + 300;
    let now = unix_ms();
    if go > now {
        std::thread::sleep(Duration::from_millis(go - now));
    }
    let end = Instant::now() + LEASE_RUN;
    if index.is_multiple_of(2) {
        for _ in 0..50_000_000u64 {
            if Instant::now() >= end {
                break;
            }
            tally(p.call(|_| op()));
        }
    } else {
        rt().block_on(async {
            for _ in 0..50_000_000u64 {
                if Instant::now() >= end {
                    break;
                }
                tally(p.run(|_| async { op() }).await);
            }
        });
    }
    let times = times.into_inner().unwrap();
    let list: Vec<String> = times.iter().map(u64::to_string).collect();
    println!(
        "@@ admitted={} refused={refused} times={}",
        times.len(),
        list.join(",")
    );
}

/// The most instants of `sorted` in any span `[t, t + width)`.
fn densest(sorted: &[u64], width: u64) -> usize {
    let mut best = 0;
    let mut i = 0;
    for j in 0..sorted.len() {
        while sorted[j] >= sorted[i] + width {
            i += 1;
        }
        best = best.max(j + 1 - i);
    }
    best
}

/// Four processes, two sync and two async, on one GCRA limit in leased
/// mode: in any span of one second, fewer admissions than the exact
/// bound (burst + one second's permits) plus what the four can hold at
/// once (a batch and the low-water mark each, and the call under way).
#[test]
fn four_leasing_processes_stay_within_the_stated_overshoot() {
    let server = RedisServer::start();
    let prefix = unique("xlease");
    let start = unix_ms() + 1000;
    let children: Vec<Child> = (0..4)
        .map(|i| spawn("lease-rate", &server, &prefix, i, Some(start)))
        .collect();
    let lines: Vec<String> = children.into_iter().flat_map(finish).collect();
    assert_eq!(lines.len(), 4);
    let mut times: Vec<u64> = Vec::new();
    for l in &lines {
        let list = l.split("times=").nth(1).unwrap_or("");
        times.extend(
            list.split(',')
                .filter(|t| !t.is_empty())
                .map(|t| t.parse::<u64>().unwrap()),
        );
        assert_eq!(
            field(l, "admitted") as usize,
            list.split(',').filter(|t| !t.is_empty()).count()
        );
    }
    times.sort_unstable();
    let exact = u64::from(LEASE_BURST) + u64::from(LEASE_RATE);
    let held = 4 * (u64::from(LEASE_BATCH) + u64::from(LEASE_LOW) + 1);
    let most = densest(&times, 1_000_000) as u64;
    eprintln!(
        "leased: {} admitted in {:?}, at most {most} in one second: exact bound {exact}, \
         overshoot {} of at most {held}",
        times.len(),
        LEASE_RUN,
        most.saturating_sub(exact - 1)
    );
    assert!(most < exact + held, "{most} in one second");
    // The limit was reached: the processes asked for more than it gives.
    let refused: u64 = lines.iter().map(|l| field(l, "refused")).sum();
    assert!(
        refused > 0 && most >= u64::from(LEASE_RATE),
        "{most}, {refused} refused"
    );
}

/// Leases a batch of 60 of a GCRA of 100 per 5 s, says so, and waits to be
/// killed.
fn child_lease_die() {
    let p = Pipeline::builder("leased")
        .rate_limiter(RateLimiter::gcra(100, Duration::from_secs(5)))
        .store(leased_store(60, 1))
        .build()
        .unwrap();
    p.call(|_| Ok::<_, std::io::Error>(())).unwrap();
    println!("@@ leased");
    std::thread::sleep(Duration::from_secs(60));
}

/// A process killed while it holds a batch never gives it back: its
/// permits come back as the limiter refills (60 permits of a GCRA with an
/// interval of 50 ms: within 3 s of the lease), as used ones do.
#[test]
fn a_killed_process_s_batch_comes_back_as_the_limit_refills() {
    let server = RedisServer::start();
    let prefix = unique("xleasedie");
    let mut child = spawn("lease-die", &server, &prefix, 0, None);
    let stdout = child.stdout.take().unwrap();
    let leased = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .take(100)
        .any(|l| l.starts_with("@@ leased"));
    assert!(leased, "the child leased no batch");
    child.kill().unwrap();
    child.wait().unwrap();
    let store = RedisStore::builder(server.url())
        .prefix(&prefix)
        .fail_closed()
        .build()
        .unwrap();
    let spec = seawall::store::ResourceSpec::new("leased")
        .with_rate_limit(RateLimiter::gcra(100, Duration::from_secs(5)));
    let state = seawall::StateStore::bind(&store, &spec).unwrap();
    let admit = |w: u32| {
        state
            .admit(&seawall::store::AdmitRequest::new(None, Duration::ZERO).with_weight(w))
            .unwrap()
            .decision
    };
    // The full burst is not there: the dead batch holds 60 of it, and
    // comes back within 60 intervals (3 s).
    let wait = admit(100).unwrap_err().retry_after.unwrap();
    assert!(wait <= Duration::from_secs(3), "{wait:?}");
    std::thread::sleep(wait);
    assert!(admit(100).is_ok(), "the full burst is back");
}

// ------------------------------------------------- leased bulkhead slots

const SLOTS: u32 = 6;

fn slots_pipeline(batch: u32) -> Pipeline {
    Pipeline::builder("leased-slots")
        .bulkhead(Bulkhead::new(SLOTS).lease(Duration::from_secs(2)))
        .store(
            RedisStore::builder(env(URL))
                .prefix(env(PREFIX))
                .timeout(Duration::from_secs(2))
                .fail_closed()
                .leased(
                    "leased-slots",
                    Leasing::batch(batch)
                        .low_water(0)
                        .ttl(Duration::from_millis(500)),
                )
                .build()
                .unwrap(),
        )
        .build()
        .unwrap()
}

/// Two callers (threads in even children, tasks in odd ones) call for
/// `LEASE_RUN`, each call holding its slot 2 ms; prints each admitted
/// call's span (unix microseconds) and the refusals.
fn child_slots(index: u32) {
    let p = slots_pipeline(2);
    let spans = std::sync::Mutex::new(Vec::<(u64, u64)>::new());
    let refused = std::sync::atomic::AtomicU64::new(0);
    let tally = |r: Result<(), Error<std::io::Error>>| {
        if let Err(e) = r {
            assert_eq!(
                e.rejection().map(|r| r.reason),
                Some(RejectionReason::BulkheadFull),
                "{e}"
            );
            refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    };
    let end = Instant::now() + LEASE_RUN;
    if index.is_multiple_of(2) {
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..100_000 {
                        if Instant::now() >= end {
                            break;
                        }
                        tally(p.call(|_| {
                            let start = unix_us();
                            std::thread::sleep(Duration::from_millis(2));
                            spans.lock().unwrap().push((start, unix_us()));
                            Ok(())
                        }));
                    }
                });
            }
        });
    } else {
        rt().block_on(async {
            let caller = || async {
                for _ in 0..100_000 {
                    if Instant::now() >= end {
                        break;
                    }
                    tally(
                        p.run(|_| async {
                            let start = unix_us();
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            spans.lock().unwrap().push((start, unix_us()));
                            Ok(())
                        })
                        .await,
                    );
                }
            };
            tokio::join!(caller(), caller());
        });
    }
    let spans = spans.into_inner().unwrap();
    let list: Vec<String> = spans.iter().map(|(a, b)| format!("{a}-{b}")).collect();
    println!(
        "@@ admitted={} refused={} spans={}",
        spans.len(),
        refused.into_inner(),
        list.join(",")
    );
}

/// Four processes of two callers each (eight callers) on a bulkhead of 6
/// in leased mode (batches of 2, TTL 500 ms, so that the pools' leases are
/// extended during the run): at no instant do more than 6 calls run.
#[test]
fn four_processes_on_a_leased_bulkhead_never_exceed_its_capacity() {
    let server = RedisServer::start();
    let prefix = unique("xslots");
    let start = unix_ms() + 1000;
    let children: Vec<Child> = (0..4)
        .map(|i| spawn("slots", &server, &prefix, i, Some(start)))
        .collect();
    let lines: Vec<String> = children.into_iter().flat_map(finish).collect();
    assert_eq!(lines.len(), 4);
    // +1 at each start, -1 at each end (ends first at equal instants).
    let mut edges: Vec<(u64, i64)> = Vec::new();
    for l in &lines {
        for span in l.split("spans=").nth(1).unwrap_or("").split(',') {
            if let Some((a, b)) = span.split_once('-') {
                edges.push((a.parse().unwrap(), 1));
                edges.push((b.parse().unwrap(), -1));
            }
        }
    }
    edges.sort_unstable();
    let (mut running, mut most) = (0i64, 0i64);
    for (_, d) in &edges {
        running += d;
        most = most.max(running);
    }
    let admitted: u64 = lines.iter().map(|l| field(l, "admitted")).sum();
    let refused: u64 = lines.iter().map(|l| field(l, "refused")).sum();
    eprintln!("leased slots: {admitted} calls, {refused} refused, at most {most} at once");
    assert!(most <= i64::from(SLOTS), "{most} calls at once");
    assert!(
        admitted > 0 && refused > 0,
        "{admitted} admitted, {refused} refused"
    );
}

/// Holds a call in a pool of 3 slots and waits to be killed.
fn child_slots_die() {
    let p = slots_pipeline(3);
    let _ = p.call(|_| {
        println!("@@ holding");
        std::thread::sleep(Duration::from_secs(60));
        Ok::<_, std::io::Error>(())
    });
}

/// A process killed while it holds a pool of slots: its slots (the one in
/// use and the idle ones) come back when their leases end, at most the
/// bulkhead's lease (2 s) after its keeper last extended them.
#[test]
fn a_killed_process_s_leased_slots_come_back_with_their_lease() {
    let server = RedisServer::start();
    let prefix = unique("xslotsdie");
    let mut child = spawn("slots-die", &server, &prefix, 0, None);
    let holding = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .take(100)
        .any(|l| l.starts_with("@@ holding"));
    assert!(holding, "the child holds no slot");
    let state = seawall::StateStore::bind(
        &RedisStore::builder(server.url())
            .prefix(&prefix)
            .fail_closed()
            .build()
            .unwrap(),
        &seawall::store::ResourceSpec::new("leased-slots")
            .with_bulkhead(Bulkhead::new(SLOTS).lease(Duration::from_secs(2))),
    )
    .unwrap();
    assert_eq!(state.in_flight(None, Duration::ZERO).unwrap(), 3);
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = Instant::now();
    let back = loop {
        if state.in_flight(None, Duration::ZERO).unwrap() == 0 {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "slots never came back"
        );
        std::thread::sleep(Duration::from_millis(25));
    };
    assert!(back <= Duration::from_millis(2500), "{back:?}");
}
