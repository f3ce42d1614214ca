//! A Redis that restarts empty (no persistence) has forgotten the window
//! counters and the bulkhead leases. Exact mode must not admit a second
//! quota in the same window, nor more calls than the bulkhead holds: after
//! a restart the store refuses (fail-closed) or answers locally
//! (fail-open) until the lost state no longer matters, one window or one
//! lease later.
//!
//! Real servers, killed and restarted on the same port; windows and
//! leases on the store's clock (the caller's virtual clock, so the hold's
//! end is checked exactly) and once on the server's clock. Loops are
//! bounded; no assertion is on elapsed time.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use seawall::testing::VirtualClock;
use seawall::{Bulkhead, Error, Pipeline, RateLimiter, StoreError};
use seawall_redis::{Leasing, RedisStore, RedisStoreBuilder};

use crate::support::{unique, RedisServer};

/// Longest real time a loop waits for the store to answer again after a
/// restart; a bound on the loop, not an assertion on time.
const PATIENCE: Duration = Duration::from_secs(20);

fn store(server: &RedisServer, prefix: &str, open: bool, caller_clock: bool) -> RedisStore {
    store_at(&server.url(), prefix, open, caller_clock)
}

fn store_at(url: &str, prefix: &str, open: bool, caller_clock: bool) -> RedisStore {
    let b = builder_at(url, prefix);
    let b = if caller_clock { b.caller_clock() } else { b };
    build(b, open)
}

/// The settings every store of these tests shares.
fn builder_at(url: &str, prefix: &str) -> RedisStoreBuilder {
    RedisStore::builder(url)
        .prefix(prefix)
        // Generous: a call that times out on a loaded machine may still take
        // a place late, which the exact counts below would not expect.
        .timeout(Duration::from_secs(2))
        .reconnect_interval(Duration::from_millis(100))
        // Every call must reach the server: on the caller's clock the hold
        // starts at the first admission that sees the restart, which a
        // refusal replayed locally until the end of its window would put
        // off to the next window.
        .local_refusals(0)
}

/// `b` failing open or closed, built.
fn build(b: RedisStoreBuilder, open: bool) -> RedisStore {
    if open { b.fail_open() } else { b.fail_closed() }
        .build()
        .unwrap()
}

/// A pipeline with a bulkhead of 5 (slot leases of 10 s) through `store`,
/// on a virtual clock far from 0.
fn pool_pipeline(store: &RedisStore) -> (Pipeline, VirtualClock) {
    let clock = VirtualClock::starting_at(Duration::from_secs(1_000));
    let p = Pipeline::builder("pool")
        .bulkhead(Bulkhead::new(5).lease(Duration::from_secs(10)))
        .clock(clock.clone())
        .store(store.clone())
        .build()
        .unwrap();
    (p, clock)
}

/// A pipeline limiting calls to `limit` per second (fixed window) through
/// `store`, on `clock`.
fn window_pipeline(store: &RedisStore, clock: &VirtualClock, limit: u32) -> Pipeline {
    Pipeline::builder("rate")
        .rate_limiter(RateLimiter::fixed_window(limit, Duration::from_secs(1)))
        .clock(clock.clone())
        .store(store.clone())
        .build()
        .unwrap()
}

/// A fixed window of 200 calls per second through `store`, on a virtual
/// clock far from 0, called sync or async: `first.0` calls of which
/// `first.1` admitted, a restart of `server`, then calls in the same window
/// (each shown to `seen`) until the reachable store answered 300 of them;
/// one window later the quota is back, exactly once, through Redis.
/// Returns what was admitted in the window of the restart after it.
fn quota_through_restart(
    server: &mut RedisServer,
    store: &RedisStore,
    asynchronous: bool,
    first: (u32, u32),
    seen: &dyn Fn(&CallResult),
) -> u32 {
    let clock = VirtualClock::starting_at(Duration::from_secs(1_000));
    let p = window_pipeline(store, &clock, 200);
    let rt = crate::support::rt();
    let sync = || p.call(|_| Ok::<_, std::io::Error>(()));
    let run = || rt.block_on(p.run(|_| async { Ok::<_, std::io::Error>(()) }));
    let call: Call<'_> = if asynchronous { &run } else { &sync };
    assert_eq!(admitted_among(call, store, first.0), first.1);

    server.restart();
    let watched = || {
        let r = call();
        seen(&r);
        r
    };
    let after_restart = admitted_among(&watched, store, 300);

    // One window later the quota is back, exactly once, through Redis.
    clock.advance(Duration::from_secs(1));
    assert_eq!(admitted_among(call, store, 250), 200);
    after_restart
}

/// What one call came to.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Admitted,
    Rejected,
    /// `Error::Store` while the store is reachable: refused after a restart.
    Held,
    /// `Error::Store` while Redis is down.
    Down,
}

fn answer<T: std::fmt::Debug>(r: &Result<T, Error<std::io::Error>>) -> Answer {
    match r {
        Ok(_) => Answer::Admitted,
        Err(e) if e.is_rejected() => Answer::Rejected,
        // Told by the error itself, not by the store's state read after it
        // (the link may be back by then): a hold names the restart; any
        // other store error is the outage.
        Err(Error::Store(StoreError::Unavailable(m))) if m.contains("restart") => Answer::Held,
        Err(Error::Store(_)) => Answer::Down,
        Err(e) => panic!("unexpected {e:?}"),
    }
}

/// What one call through the pipeline gave.
type CallResult = Result<(), Error<std::io::Error>>;

/// One call through the pipeline, on the blocking or the async path.
type Call<'a> = &'a dyn Fn() -> CallResult;

/// Calls until `answered` calls were answered by a reachable store (bounded
/// by [`PATIENCE`]); returns how many were admitted, counting those
/// admitted locally while Redis was down (fail-open).
fn admitted_among(call: Call<'_>, store: &RedisStore, answered: u32) -> u32 {
    let start = Instant::now();
    let (mut seen, mut admitted) = (0, 0);
    while seen < answered {
        assert!(
            start.elapsed() < PATIENCE,
            "the store never answered again after the restart"
        );
        let r = call();
        let reachable = store.is_available();
        let a = answer(&r);
        match a {
            Answer::Admitted => admitted += 1,
            Answer::Down => std::thread::sleep(Duration::from_millis(20)),
            Answer::Rejected | Answer::Held => {}
        }
        // A call that failed on the outage is not an answer of the server,
        // even when the link came back before `is_available` was read.
        if reachable && a != Answer::Down {
            seen += 1;
        }
    }
    admitted
}

/// A full window's quota, a restart, then calls in the same window (on the
/// store's clock) until the reachable store answered 300 of them; then the
/// next window. Returns what was admitted after the restart.
fn second_quota(open: bool, asynchronous: bool) -> u32 {
    let server = RedisServer::start();
    let url = server.url();
    second_quota_on(server, &url, open, asynchronous)
}

fn second_quota_on(mut server: RedisServer, url: &str, open: bool, asynchronous: bool) -> u32 {
    let store = store_at(url, &unique("restart-rate"), open, true);
    // The window's quota, then a refusal.
    quota_through_restart(&mut server, &store, asynchronous, (201, 200), &|_| {})
}

#[test]
fn a_restarted_empty_redis_does_not_admit_a_second_quota_in_the_window() {
    // Fail-closed, same window on the store's clock: nothing more is
    // admitted, however often the reachable store is asked.
    assert_eq!(second_quota(false, false), 0, "over-admission");
}

#[test]
fn a_restarted_empty_redis_does_not_admit_a_second_quota_async() {
    assert_eq!(second_quota(false, true), 0, "over-admission");
}

#[test]
fn a_restart_is_seen_through_noscript_by_a_user_without_info() {
    // The user may run scripts but not INFO: the server's identity is
    // unknown, and a server that lost the scripts is taken as restarted.
    let server = RedisServer::start_with(&[
        "--user", "noinfo", "on", ">pw", "~*", "&*", "+@all", "-info",
    ]);
    let url = format!("redis://noinfo:pw@127.0.0.1:{}", server.port());
    assert_eq!(
        second_quota_on(server, &url, false, false),
        0,
        "over-admission"
    );
}

#[test]
fn a_restarted_empty_redis_under_fail_open_admits_at_most_one_local_quota() {
    // Fail-open: while Redis is down and while the restart is waited for,
    // calls are admitted on the process's own state, at most one quota of
    // it per window.
    let admitted = second_quota(true, false);
    assert!(admitted <= 200, "{admitted} admitted locally in one window");
}

#[test]
fn a_restarted_empty_redis_holds_for_exactly_one_window_on_the_store_clock() {
    let mut server = RedisServer::start();
    let store = store(&server, &unique("restart-hold"), false, true);
    let clock = VirtualClock::starting_at(Duration::from_secs(1_000));
    let p = window_pipeline(&store, &clock, 10);
    let call = || p.call(|_| Ok::<_, std::io::Error>(()));
    assert_eq!(admitted_among(&call, &store, 1), 1);
    server.restart();
    // The first answer after the restart starts the hold.
    assert_eq!(admitted_among(&call, &store, 1), 0);
    clock.advance(Duration::from_secs(1) - Duration::from_micros(1));
    assert_eq!(admitted_among(&call, &store, 5), 0, "held to the end");
    clock.advance(Duration::from_micros(1));
    assert_eq!(
        admitted_among(&call, &store, 1),
        1,
        "and not a microsecond more"
    );
}

/// `n` calls that hold their bulkhead slot until told to finish.
struct Holders {
    go: Vec<mpsc::Sender<()>>,
    threads: Vec<std::thread::JoinHandle<Result<(), Error<std::io::Error>>>>,
}

impl Holders {
    fn start(p: &Pipeline, running: &Arc<AtomicU32>, peak: &Arc<AtomicU32>, n: u32) -> Holders {
        let (mut go, mut threads) = (Vec::new(), Vec::new());
        let (admitted_tx, admitted_rx) = mpsc::channel();
        for _ in 0..n {
            let (tx, rx) = mpsc::channel::<()>();
            let (p, running, peak, admitted) = (
                p.clone(),
                running.clone(),
                peak.clone(),
                admitted_tx.clone(),
            );
            threads.push(std::thread::spawn(move || {
                p.call(|_| {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    admitted.send(()).unwrap();
                    let _ = rx.recv();
                    running.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, std::io::Error>(())
                })
            }));
            go.push(tx);
        }
        for _ in 0..n {
            admitted_rx
                .recv_timeout(PATIENCE)
                .expect("every holder admitted");
        }
        Holders { go, threads }
    }

    fn finish(self) {
        drop(self.go);
        for t in self.threads {
            t.join().unwrap().unwrap();
        }
    }
}

/// One call that counts itself among the running ones.
fn counted(p: &Pipeline, running: &AtomicU32, peak: &AtomicU32) -> CallResult {
    p.call(|_| {
        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
        peak.fetch_max(now, Ordering::SeqCst);
        running.fetch_sub(1, Ordering::SeqCst);
        Ok::<_, std::io::Error>(())
    })
}

/// [`counted`] calls, each shown to `seen`, until `store` answered 50 of
/// them; fail-closed, every one is refused.
fn counted_until_answered(
    p: &Pipeline,
    running: &AtomicU32,
    peak: &AtomicU32,
    store: &RedisStore,
    open: bool,
    mut seen: impl FnMut(&CallResult),
) {
    let start = Instant::now();
    let mut answered = 0;
    while answered < 50 {
        assert!(start.elapsed() < PATIENCE, "the store never answered again");
        let r = counted(p, running, peak);
        seen(&r);
        if store.is_available() {
            answered += 1;
        } else {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !open {
            assert!(r.is_err());
        }
    }
}

#[test]
fn a_restarted_empty_redis_never_puts_the_bulkhead_over_capacity() {
    for open in [false, true] {
        let mut server = RedisServer::start();
        let store = store(&server, &unique("restart-bulkhead"), open, true);
        let (p, clock) = pool_pipeline(&store);
        let running = Arc::new(AtomicU32::new(0));
        let peak = Arc::new(AtomicU32::new(0));
        let holders = Holders::start(&p, &running, &peak, 5);
        assert!(counted(&p, &running, &peak).unwrap_err().is_rejected());

        server.restart();
        // Calls while the five still run: the store answers again, and no
        // sixth call runs (fail-open: the local bulkhead is full too, as it
        // admitted nothing; the Redis one was refused).
        counted_until_answered(&p, &running, &peak, &store, open, |_| {});
        assert!(
            peak.load(Ordering::SeqCst) <= if open { 10 } else { 5 },
            "over capacity"
        );
        if !open {
            assert_eq!(peak.load(Ordering::SeqCst), 5, "over capacity");
        }
        holders.finish();

        // One lease later, the bulkhead admits again.
        clock.advance(Duration::from_secs(10));
        for _ in 0..5 {
            counted(&p, &running, &peak).unwrap();
        }
    }
}

/// Microseconds since the Unix epoch on this host, whose clock the local
/// server reads for `TIME`.
fn host_micros() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

#[test]
fn on_the_server_clock_the_window_of_the_restart_admits_no_second_quota() {
    const PERIOD_US: u128 = 2_000_000;
    let mut server = RedisServer::start();
    let prefix = unique("restart-server-clock");
    let store = store(&server, &prefix, false, false);
    let p = Pipeline::builder("rate")
        .rate_limiter(RateLimiter::fixed_window(
            200,
            Duration::from_micros(2_000_000),
        ))
        .store(store.clone())
        .build()
        .unwrap();
    // A few attempts, in case a loaded machine takes the whole window to
    // restart the server.
    for _ in 0..3 {
        // Admissions pass (an earlier attempt's restart is no longer
        // waited for).
        let waiting = Instant::now();
        while p.call(|_| Ok::<_, std::io::Error>(())).is_err() {
            assert!(waiting.elapsed() < PATIENCE, "admissions never resumed");
            std::thread::sleep(Duration::from_millis(20));
        }
        // Start early in the next window of the server's (the host's) clock.
        let into = host_micros() % PERIOD_US;
        std::thread::sleep(Duration::from_micros(
            u64::try_from(PERIOD_US - into).unwrap() + 20_000,
        ));
        let window = host_micros() / PERIOD_US;
        let mut in_window = 0;
        while in_window < 200 {
            let before = host_micros();
            p.call(|_| Ok::<_, std::io::Error>(()))
                .expect("the quota of a fresh window");
            assert_eq!(before / PERIOD_US, window, "the quota took a whole window");
            in_window += 1;
        }
        server.restart();
        // Until the window ends (a bounded loop): every admission is counted
        // in it.
        let mut answered = 0;
        while host_micros() / PERIOD_US == window {
            match answer(&p.call(|_| Ok::<_, std::io::Error>(()))) {
                Answer::Admitted => {
                    in_window += 1;
                    answered += 1;
                }
                Answer::Rejected | Answer::Held => answered += 1,
                Answer::Down => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        assert!(in_window <= 200, "{in_window} admitted in one window");
        if answered > 0 {
            return;
        }
    }
    panic!("the restarted server never answered within the window of the restart");
}

/// Two stores on one server (each with its own connections, as two
/// processes have): each sees the restart on its own, and neither admits
/// into the window of the restart.
#[test]
fn two_stores_each_see_the_restart() {
    let mut server = RedisServer::start();
    let prefix = unique("restart-two");
    let clock = VirtualClock::starting_at(Duration::from_secs(1_000));
    let pipeline = |store: &RedisStore| window_pipeline(store, &clock, 200);
    let (a, b) = (
        store(&server, &prefix, false, true),
        store(&server, &prefix, false, true),
    );
    let (pa, pb) = (pipeline(&a), pipeline(&b));
    let call_a = || pa.call(|_| Ok::<_, std::io::Error>(()));
    let call_b = || pb.call(|_| Ok::<_, std::io::Error>(()));
    assert_eq!(admitted_among(&call_a, &a, 100), 100);
    assert_eq!(admitted_among(&call_b, &b, 101), 100);

    server.restart();
    // A reaches the restarted server first (and reloads the scripts);
    // B still sees the restart on its own new connections.
    assert_eq!(admitted_among(&call_a, &a, 50), 0, "over-admission by a");
    assert_eq!(admitted_among(&call_b, &b, 50), 0, "over-admission by b");

    clock.advance(Duration::from_secs(1));
    let (na, nb) = (
        admitted_among(&call_a, &a, 150),
        admitted_among(&call_b, &b, 150),
    );
    assert_eq!(na + nb, 200, "one quota in the next window, shared");
}

// ------------------------------------------------------------ leased mode

/// A store whose resources `rate` and `pool` are leased.
fn leased_store(server: &RedisServer, prefix: &str, open: bool) -> RedisStore {
    let b = builder_at(&server.url(), prefix)
        .caller_clock()
        .leased("rate", Leasing::batch(BATCH).low_water(LOW))
        // The keeper extends the pool every 100 ms (real time): it finds
        // the pool's slots gone soon after the restart.
        .leased(
            "pool",
            Leasing::batch(2)
                .low_water(0)
                .ttl(Duration::from_millis(200)),
        );
    build(b, open)
}

const BATCH: u32 = 20;
const LOW: u32 = 10;

/// Leased fixed window of 200 per second, batches of 20 renewed at 10: 150
/// admitted, a restart, then calls in the same window (on the store's
/// clock) until the reachable store answered 300; then the next window.
/// Returns what was admitted after the restart, and how many calls were
/// held by it.
fn leased_quota_after_restart(open: bool, asynchronous: bool) -> (u32, u32) {
    let mut server = RedisServer::start();
    let store = leased_store(&server, &unique("restart-leased"), open);
    let held = AtomicU32::new(0);
    let counting = |r: &CallResult| {
        if answer(r) == Answer::Held {
            held.fetch_add(1, Ordering::Relaxed);
        }
    };
    // One window later the batch in hand has expired and been given back.
    let after_restart =
        quota_through_restart(&mut server, &store, asynchronous, (150, 150), &counting);
    let held = held.load(Ordering::Relaxed);
    eprintln!(
        "leased rate limit, fail-open {open}, async {asynchronous}: {after_restart} admitted \
         in the window of the restart after it, {held} calls held"
    );
    (after_restart, held)
}

#[test]
fn a_restarted_empty_redis_lets_a_leased_rate_limit_spend_its_batch_and_no_second_quota() {
    // Fail-closed: the batch in hand at the restart (at most a batch plus
    // the low-water mark) is spent; the next lease waits for the window of
    // the restart to end, as an exact admission does.
    for asynchronous in [false, true] {
        let (after, held) = leased_quota_after_restart(false, asynchronous);
        assert!(
            after <= BATCH + LOW,
            "async {asynchronous}: {after} admitted after the restart"
        );
        assert!(held > 0, "async {asynchronous}: the restart was never seen");
    }
}

#[test]
fn a_restarted_empty_redis_under_fail_open_admits_the_leased_batch_and_one_local_quota() {
    let (after, _) = leased_quota_after_restart(true, false);
    assert!(
        after <= BATCH + LOW + 200,
        "{after} admitted after the restart"
    );
}

#[test]
fn a_restarted_empty_redis_never_puts_a_leased_bulkhead_over_capacity() {
    for open in [false, true] {
        let mut server = RedisServer::start();
        let store = leased_store(&server, &unique("restart-leased-pool"), open);
        let (p, clock) = pool_pipeline(&store);
        let running = Arc::new(AtomicU32::new(0));
        let peak = Arc::new(AtomicU32::new(0));
        // One at a time: each admitted from the pool, or by a lease.
        let holders: Vec<Holders> = (0..5)
            .map(|_| Holders::start(&p, &running, &peak, 1))
            .collect();
        assert!(counted(&p, &running, &peak).unwrap_err().is_rejected());

        server.restart();
        // Calls while the five still run, their slots gone from Redis.
        let mut held = 0;
        counted_until_answered(&p, &running, &peak, &store, open, |r| {
            if answer(r) == Answer::Held {
                held += 1;
            }
        });
        let most = peak.load(Ordering::SeqCst);
        eprintln!(
            "leased bulkhead of 5, fail-open {open}: at most {most} running through the \
             restart, {held} calls held"
        );
        if open {
            assert!(most <= 10, "over capacity: {most}");
        } else {
            assert_eq!(most, 5, "over capacity");
            assert!(held > 0, "the restart was never seen");
        }
        for h in holders {
            h.finish();
        }

        // One lease later, the bulkhead admits exactly its capacity again.
        clock.advance(Duration::from_secs(10));
        let holders: Vec<Holders> = (0..5)
            .map(|_| Holders::start(&p, &running, &peak, 1))
            .collect();
        assert!(counted(&p, &running, &peak).unwrap_err().is_rejected());
        for h in holders {
            h.finish();
        }
    }
}
