//! The adaptive limit against a simulated dependency, on the virtual clock:
//! a server whose latency is `BASE` while at most `capacity` calls are in
//! flight and grows in proportion beyond (a queue: `BASE x in_flight /
//! capacity`), driven by more clients than it can serve. Each algorithm must
//! find the capacity, follow it when it halves and when it comes back.
//!
//! Run with `--nocapture` to see the figures (the README quotes them).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use seawall::testing::{SeededRandom, VirtualClock};
use seawall::{AdaptiveLimit, Clock, Error, Pipeline, RejectionReason};

const BASE: Duration = Duration::from_millis(50);
/// The server's capacity in the first and last phase; half of it between.
const CAPACITY: u32 = 60;
/// More clients than the server can serve at once.
const CLIENTS: u32 = 80;
/// How long each phase lasts, in virtual time (the first is longer: the
/// limit starts at 20 and first measures its baseline).
const PHASE: Duration = Duration::from_secs(6);
const FIRST_PHASE: Duration = Duration::from_secs(9);
/// How long a refused client waits before it tries again.
const BACKOFF: Duration = Duration::from_millis(25);

#[derive(Debug)]
struct Server {
    clock: VirtualClock,
    capacity: AtomicU32,
    /// Its latency without load, in nanoseconds.
    base: AtomicU64,
    in_flight: AtomicU32,
}

#[derive(Debug)]
struct Overloaded;

impl Server {
    async fn handle(&self) -> Result<(), Overloaded> {
        let n = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        let capacity = self.capacity.load(Ordering::SeqCst);
        let base = Duration::from_nanos(self.base.load(Ordering::SeqCst));
        let latency = if n <= capacity {
            base
        } else {
            base * n / capacity
        };
        Clock::sleep(&self.clock, latency).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

/// The limit over the second half of each phase: mean, lowest, highest.
#[derive(Debug, Clone, Copy)]
struct Phase {
    capacity: u32,
    mean: f64,
    low: u32,
    high: u32,
}

impl Phase {
    fn error(&self) -> f64 {
        (self.mean - f64::from(self.capacity)).abs() / f64::from(self.capacity)
    }
}

/// Drives `limit` through the three phases (capacity, half, capacity) on a
/// virtual clock starting at `start`.
fn simulate(name: &str, limit: AdaptiveLimit, start: Duration) -> Vec<Phase> {
    let phases = [
        (CAPACITY, BASE, FIRST_PHASE),
        (CAPACITY / 2, BASE, PHASE),
        (CAPACITY, BASE, PHASE),
    ];
    run(name, limit, start, CLIENTS, &phases)
}

/// Drives `limit` with `clients` through `phases` (the server's capacity,
/// its latency without load, and how long it lasts) on a virtual clock
/// starting at `start`; the limit is read over the last `PHASE / 2` of
/// each phase (all of a shorter one).
fn run(
    name: &str,
    limit: AdaptiveLimit,
    start: Duration,
    clients: u32,
    phases: &[(u32, Duration, Duration)],
) -> Vec<Phase> {
    let clock = VirtualClock::starting_at(start);
    let server = Arc::new(Server {
        clock: clock.clone(),
        capacity: AtomicU32::new(phases[0].0),
        base: AtomicU64::new(phases[0].1.as_nanos() as u64),
        in_flight: AtomicU32::new(0),
    });
    let pipeline = Pipeline::builder(format!("sim-{name}-{}", start.as_secs()))
        .adaptive_limit(limit)
        .clock(clock.clone())
        // The limits that probe their baseline draw when to: a seeded
        // sequence makes every run of the simulation the same.
        .random(SeededRandom::new(7))
        .build()
        .expect("valid");
    let end = start
        + phases
            .iter()
            .map(|&(_, _, length)| length)
            .sum::<Duration>();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let phases = phases.to_vec();
    runtime.block_on(async {
        let local = tokio::task::LocalSet::new();
        for _ in 0..clients {
            let (pipeline, server, clock) = (pipeline.clone(), server.clone(), clock.clone());
            local.spawn_local(async move {
                while clock.now() < end {
                    match pipeline.run(|_ctx| server.handle()).await {
                        Ok(()) => {}
                        Err(Error::Rejected(r)) => {
                            assert_eq!(r.reason, RejectionReason::ConcurrencyLimited);
                            Clock::sleep(&clock, BACKOFF).await;
                        }
                        Err(e) => panic!("{e:?}"),
                    }
                }
            });
        }
        // The observer: changes the capacity and reads the limit every
        // 20 ms over the second half of each phase.
        let observer = {
            let (pipeline, server, clock) = (pipeline.clone(), server.clone(), clock.clone());
            local.spawn_local(async move {
                let mut seen_phases = Vec::new();
                for (capacity, base, length) in phases {
                    server.capacity.store(capacity, Ordering::SeqCst);
                    server.base.store(base.as_nanos() as u64, Ordering::SeqCst);
                    let phase_end = clock.now() + length;
                    Clock::sleep(&clock, length.saturating_sub(PHASE / 2)).await;
                    let mut seen = Vec::new();
                    while clock.now() < phase_end {
                        let now = pipeline.concurrency_limit().expect("declared");
                        seen.push(now.limit);
                        Clock::sleep(&clock, Duration::from_millis(20)).await;
                    }
                    let mean = seen.iter().map(|&l| f64::from(l)).sum::<f64>() / seen.len() as f64;
                    seen_phases.push(Phase {
                        capacity,
                        mean,
                        low: *seen.iter().min().expect("samples"),
                        high: *seen.iter().max().expect("samples"),
                    });
                }
                seen_phases
            })
        };
        local.run_until(observer).await.expect("observer")
    })
}

fn report(name: &str, phases: &[Phase]) {
    for p in phases {
        eprintln!(
            "{name:>9}: capacity {:>3}: limit mean {:>6.1} (low {:>3}, high {:>3}), off by {:>5.1} %",
            p.capacity,
            p.mean,
            p.low,
            p.high,
            100.0 * p.error()
        );
    }
}

/// Every limit is updated once per round trip of the dependency, and
/// measures its baseline every 3 s (so each phase sees a measurement).
///
/// Gradient2, with its default buffer and headroom, settles where the
/// latency leaves the buffer: about `(1 + buffer) x capacity` calls, plus
/// one.
fn gradient2() -> AdaptiveLimit {
    AdaptiveLimit::gradient2()
        .update_interval(BASE)
        .min_rtt(Duration::from_secs(3), 50, 3)
}

/// Vegas keeps a queue of `log10(limit)` to `3 log10(limit)` calls (1 to 3
/// below a limit of 100): it settles that far above the capacity.
fn vegas() -> AdaptiveLimit {
    AdaptiveLimit::vegas()
        .update_interval(BASE)
        .min_rtt(Duration::from_secs(3), 50, 3)
}

/// AIMD is told what is too slow: 10 % above the dependency's latency.
fn aimd() -> AdaptiveLimit {
    AdaptiveLimit::aimd()
        .update_interval(BASE)
        .rtt_timeout(BASE + BASE / 10)
}

#[test]
fn gradient2_finds_the_capacity_and_follows_it() {
    for start in [Duration::ZERO, Duration::from_secs(1_000_000)] {
        let phases = simulate("gradient2", gradient2(), start);
        report("gradient2", &phases);
        for p in &phases {
            assert!(p.error() <= 0.2, "{p:?}");
        }
    }
}

#[test]
fn vegas_finds_the_capacity_and_follows_it() {
    for start in [Duration::ZERO, Duration::from_secs(1_000_000)] {
        let phases = simulate("vegas", vegas(), start);
        report("vegas", &phases);
        for p in &phases {
            // Its equilibrium: the capacity plus a queue of 1 to 3, with
            // the overshoot of each measurement of the baseline.
            assert!(p.error() <= 0.2, "{p:?}");
            let (low, high) = (p.capacity + 1, p.capacity + 3);
            assert!(
                p.mean >= f64::from(low) - 1.0 && p.mean <= f64::from(high) + 2.0,
                "{p:?}: Vegas settles between {low} and {high}"
            );
        }
    }
}

#[test]
fn aimd_finds_the_capacity_and_follows_it() {
    for start in [Duration::ZERO, Duration::from_secs(1_000_000)] {
        let phases = simulate("aimd", aimd(), start);
        report("aimd", &phases);
        for p in &phases {
            assert!(p.error() <= 0.2, "{p:?}");
        }
    }
}

/// The capacities of the sweep, from small to large.
const CAPACITIES: [u32; 4] = [20, 30, 60, 150];

/// Drives `limit` against a server of each capacity of [`CAPACITIES`] (one
/// phase, long enough for Gradient2's headroom to climb from 20 to it),
/// clocks from 0 and 10^6 s; prints the settled limits.
fn sweep(name: &str, limit: fn() -> AdaptiveLimit) -> Vec<Phase> {
    let mut settled = Vec::new();
    for start in [Duration::ZERO, Duration::from_secs(1_000_000)] {
        for capacity in CAPACITIES {
            let clients = capacity + (capacity / 4).max(12);
            let length = Duration::from_secs(6) + Duration::from_millis(u64::from(capacity) * 60);
            let phases = run(name, limit(), start, clients, &[(capacity, BASE, length)]);
            report(name, &phases);
            settled.extend(phases);
        }
    }
    settled
}

#[test]
fn gradient2_with_its_defaults_settles_within_20_percent_from_20_to_150() {
    for p in sweep("gradient2", gradient2) {
        assert!(p.error() <= 0.2, "{p:?}");
    }
}

#[test]
fn vegas_with_its_defaults_settles_within_20_percent_from_20_to_150() {
    for p in sweep("vegas", vegas) {
        assert!(p.error() <= 0.2, "{p:?}");
    }
}

/// The dependency answers in half its usual latency while the first
/// baseline is measured (a warm cache, an idle replica), then in its usual
/// latency for good: against that baseline every latency looks queued, and
/// the limit falls to `min_limit` and stays there. After
/// `MIN_LIMIT_WINDOWS` (5) update windows at the minimum the baseline is
/// measured again, and the limit climbs back to the capacity long before
/// `min_rtt_interval` (60 s by default) would have measured it. Returns
/// the three phases: the fast one, the fall, the recovery.
fn remeasured_at_the_minimum(name: &str, limit: AdaptiveLimit, fall: Duration) -> Vec<Phase> {
    let phases = [
        (CAPACITY, BASE / 2, Duration::from_secs(1)),
        (CAPACITY, BASE, fall),
        (CAPACITY, BASE, Duration::from_secs(10)),
    ];
    let mut all = Vec::new();
    for start in [Duration::ZERO, Duration::from_secs(1_000_000)] {
        let phases = run(name, limit.clone(), start, CLIENTS, &phases);
        report(name, &phases);
        all.extend(phases);
    }
    all
}

#[test]
fn gradient2_held_at_its_minimum_measures_its_baseline_again() {
    // Its defaults: limits 20 to 200, baseline every 60 s.
    let limit = AdaptiveLimit::gradient2();
    for p in remeasured_at_the_minimum("gradient2", limit, Duration::from_millis(2_500)).chunks(3) {
        // Fallen to the minimum (the measurement under way keeps it).
        assert_eq!(p[1].low, 20, "{p:?}");
        // Back within 20 % of the capacity, 13.5 s after the first
        // measurement.
        assert!(p[2].error() <= 0.2, "{p:?}");
    }
}

#[test]
fn vegas_held_at_its_minimum_measures_its_baseline_again() {
    // Its defaults, with a minimum of 10 (Vegas, at a queue of 3 calls
    // per `log10(limit)`, holds 6 calls against a baseline of half the
    // latency, above its default minimum of 1).
    let limit = AdaptiveLimit::vegas().min_limit(10);
    for p in remeasured_at_the_minimum("vegas", limit, Duration::from_secs(5)).chunks(3) {
        assert_eq!(p[1].low, 10, "{p:?}");
        assert!(p[2].error() <= 0.2, "{p:?}");
    }
}
