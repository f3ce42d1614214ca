//! Helpers shared by the regression tests: durations, an error type, event
//! recorders, runtimes and clocks far from 0 (the differential corpus has
//! its own, in `seawall::testing::differential`).
#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seawall::clock::BoxSleep;
use seawall::pipeline::{HandlesSync, Kind};
use seawall::testing::VirtualClock;
use seawall::{
    Clock, Context, Error, Event, EventKind, Pipeline, PipelineBuilder, RejectionReason,
};

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The large offset a clock is advanced by before a pipeline is built.
pub const FAR: Duration = Duration::from_secs(1_000_000);

/// A virtual clock already at `offset`.
pub fn clock_at(offset: Duration) -> VirtualClock {
    let clock = VirtualClock::new();
    clock.advance(offset);
    clock
}

/// A pipeline name no other test uses.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The operation's error in these tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boom(pub u32);

impl std::fmt::Display for Boom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "boom {}", self.0)
    }
}

impl std::error::Error for Boom {}

pub type Log = Arc<Mutex<Vec<EventKind>>>;

/// A listener recording every event.
pub fn recorder() -> (Log, impl Fn(&Event<'_>) + Send + Sync + 'static) {
    let log: Log = Arc::default();
    let l = log.clone();
    (log, move |e: &Event<'_>| {
        l.lock().unwrap().push(e.kind.clone())
    })
}

/// How many recorded events `pred` picks.
pub fn count(log: &Log, pred: impl Fn(&EventKind) -> bool) -> usize {
    log.lock().unwrap().iter().filter(|e| pred(e)).count()
}

/// How many recorded refusals were for `reason`.
pub fn refusals(log: &Log, reason: RejectionReason) -> usize {
    count(
        log,
        |e| matches!(e, EventKind::Rejected { reason: r, .. } if *r == reason),
    )
}

/// The reason and `retry_after` of a refusal; `None` for any other result.
pub fn refusal<T, E>(r: &Result<T, Error<E>>) -> Option<(RejectionReason, Option<Duration>)> {
    match r {
        Err(Error::Rejected(rej)) => Some((rej.reason, rej.retry_after)),
        _ => None,
    }
}

/// The reason of a refusal; `None` for any other result.
pub fn reason<T, E>(r: &Result<T, Error<E>>) -> Option<RejectionReason> {
    refusal(r).map(|(reason, _)| reason)
}

/// Adds a listener that does nothing when `on`.
pub fn listen<K: Kind>(builder: PipelineBuilder<K>, on: bool) -> PipelineBuilder<K> {
    if on {
        builder.on_event(|_| {})
    } else {
        builder
    }
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// How a call is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// `Pipeline::call`.
    Sync,
    /// `Pipeline::run` on a current-thread runtime.
    Async,
}

pub const FLAVORS: [Flavor; 2] = [Flavor::Sync, Flavor::Async];

/// Makes one call with an operation whose result is ready at once, sync or
/// async.
pub fn exec<K, T, E>(
    p: &Pipeline<K>,
    flavor: Flavor,
    mut op: impl FnMut(Context) -> Result<T, E>,
) -> Result<T, Error<E>>
where
    K: HandlesSync<T, E>,
{
    match flavor {
        Flavor::Sync => p.call(op),
        Flavor::Async => rt().block_on(p.run(|ctx| {
            let r = op(ctx);
            async move { r }
        })),
    }
}

/// A virtual clock that, once armed, moves 1 ns forward on every reading:
/// as a real clock does between two readings.
#[derive(Debug, Clone, Default)]
pub struct TickingClock {
    pub inner: VirtualClock,
    pub armed: Arc<AtomicBool>,
}

impl Clock for TickingClock {
    fn now(&self) -> Duration {
        if self.armed.load(Ordering::SeqCst) {
            self.inner.advance(Duration::from_nanos(1));
        }
        self.inner.now()
    }
    fn sleep(&self, duration: Duration) -> BoxSleep {
        Clock::sleep(&self.inner, duration)
    }
    fn sleep_blocking(&self, duration: Duration) {
        self.inner.advance(duration)
    }
}
