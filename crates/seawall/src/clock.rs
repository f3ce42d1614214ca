//! Time and randomness, injected so that every policy can be tested without
//! a real clock.
//!
//! Pipelines use [`SystemClock`] and [`SystemRandom`] unless told otherwise.
//! [`SeededRandom`] gives a repeatable sequence (reproducible simulations,
//! replays, tests). With the feature `test-util`, tests use
//! `seawall::testing::VirtualClock`, whose sleeps advance virtual time at
//! once, and `seawall::testing::SequenceRandom`, which returns the values it
//! is given.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

#[cfg(any(test, feature = "test-util"))]
use crate::testing::VirtualClock;

/// Time held by [`ClockHandle::hold`] until it is dropped.
#[derive(Debug)]
pub(crate) struct TimeHold(
    // Kept for its drop, which lets the clock move on.
    #[cfg(any(test, feature = "test-util"))]
    #[allow(dead_code)]
    crate::testing::Hold,
);

/// A boxed sleep future, returned by custom [`Clock`] implementations.
pub type BoxSleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A source of monotonic time that can also sleep.
///
/// Implement it to plug in your own notion of time; seawall ships
/// [`SystemClock`] (tokio timers, `std::thread::sleep`) and, with the
/// feature `test-util`, `seawall::testing::VirtualClock`.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Monotonic time elapsed since an arbitrary origin fixed for the clock.
    fn now(&self) -> Duration;
    /// A future that completes after `duration`.
    fn sleep(&self, duration: Duration) -> BoxSleep;
    /// Blocks the current thread for `duration` (used by the sync `call` path).
    fn sleep_blocking(&self, duration: Duration);
}

/// The real clock: the CPU's invariant time-stamp counter where it has one
/// (through `quanta`, about 10 ns a reading, less than half of
/// `Instant::now`), the operating system's monotonic clock otherwise; tokio
/// timers for async sleeps and `std::thread::sleep` for blocking ones.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

/// The process's `quanta` clock and its origin (its first raw reading).
#[inline]
fn system() -> &'static (quanta::Clock, u64) {
    static CLOCK: OnceLock<(quanta::Clock, u64)> = OnceLock::new();
    CLOCK.get_or_init(|| {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        (clock, origin)
    })
}

#[inline]
fn system_now_nanos() -> u64 {
    let (clock, origin) = system();
    clock.delta_as_nanos(*origin, clock.raw())
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(system_now_nanos())
    }
    fn sleep(&self, duration: Duration) -> BoxSleep {
        Box::pin(tokio::time::sleep(duration))
    }
    fn sleep_blocking(&self, duration: Duration) {
        std::thread::sleep(duration)
    }
}

/// The clock a pipeline uses, dispatched without a virtual call for the
/// built-in clocks.
#[derive(Clone, Debug, Default)]
pub(crate) enum ClockHandle {
    #[default]
    System,
    #[cfg(any(test, feature = "test-util"))]
    Virtual(VirtualClock),
    Custom(Arc<dyn Clock>),
}

impl ClockHandle {
    pub(crate) fn from_clock<C: Clock>(clock: C) -> Self {
        let any: &dyn std::any::Any = &clock;
        if any.is::<SystemClock>() {
            return ClockHandle::System;
        }
        #[cfg(any(test, feature = "test-util"))]
        if let Some(v) = any.downcast_ref::<VirtualClock>() {
            return ClockHandle::Virtual(v.clone());
        }
        ClockHandle::Custom(Arc::new(clock))
    }

    /// Nanoseconds since the clock's origin.
    #[inline]
    pub(crate) fn now_nanos(&self) -> u64 {
        match self {
            ClockHandle::System => system_now_nanos(),
            #[cfg(any(test, feature = "test-util"))]
            ClockHandle::Virtual(v) => v.now_nanos(),
            ClockHandle::Custom(c) => duration_nanos(c.now()),
        }
    }

    /// A reading of the clock in its own unit: the raw counter of the
    /// system clock (the time-stamp counter, unscaled), nanoseconds for
    /// the others. [`nanos_at`](Self::nanos_at) and
    /// [`nanos_between`](Self::nanos_between) turn readings into
    /// nanoseconds: a reading that only measures a duration, or is
    /// compared with a bound turned into a reading once
    /// ([`first_reading_at`](Self::first_reading_at)), is never scaled.
    #[inline]
    pub(crate) fn ticks(&self) -> u64 {
        match self {
            ClockHandle::System => system().0.raw(),
            #[cfg(any(test, feature = "test-util"))]
            ClockHandle::Virtual(v) => v.now_nanos(),
            ClockHandle::Custom(c) => duration_nanos(c.now()),
        }
    }

    /// The time of a reading of [`ticks`](Self::ticks): what
    /// [`now_nanos`](Self::now_nanos) would have given then.
    #[inline]
    pub(crate) fn nanos_at(&self, ticks: u64) -> u64 {
        match self {
            ClockHandle::System => {
                let (clock, origin) = system();
                clock.delta_as_nanos(*origin, ticks)
            }
            _ => ticks,
        }
    }

    /// Nanoseconds from reading `from` to reading `to` (0 when `to` is not
    /// after `from`), scaled once.
    #[inline]
    pub(crate) fn nanos_between(&self, from: u64, to: u64) -> u64 {
        match self {
            ClockHandle::System => system().0.delta_as_nanos(from, to),
            _ => to.saturating_sub(from),
        }
    }

    /// The first reading whose time ([`nanos_at`](Self::nanos_at)) is
    /// `nanos` or later: every reading before it is earlier than `nanos`.
    /// (When no reading within about 2^62 ticks of the origin reaches
    /// `nanos`, 0: no reading is known to be earlier.)
    pub(crate) fn first_reading_at(&self, nanos: u64) -> u64 {
        match self {
            ClockHandle::System => {
                let origin = system().1;
                if nanos == 0 {
                    return 0;
                }
                // `nanos_at(lo) < nanos <= nanos_at(hi)`; the time of a
                // reading grows with it (a product and a shift of the
                // distance to the origin).
                let (mut lo, mut step) = (origin, 1u64);
                let mut hi = loop {
                    let Some(hi) = origin.checked_add(step) else {
                        return 0;
                    };
                    if self.nanos_at(hi) >= nanos {
                        break hi;
                    }
                    if step >= 1 << 62 {
                        return 0;
                    }
                    lo = hi;
                    step *= 2;
                };
                while hi - lo > 1 {
                    let mid = lo + (hi - lo) / 2;
                    if self.nanos_at(mid) >= nanos {
                        hi = mid;
                    } else {
                        lo = mid;
                    }
                }
                hi
            }
            _ => nanos,
        }
    }

    pub(crate) fn sleep(&self, duration: Duration) -> Sleep {
        match self {
            ClockHandle::System => Sleep::Tokio {
                sleep: tokio::time::sleep(duration),
            },
            #[cfg(any(test, feature = "test-util"))]
            ClockHandle::Virtual(v) => Sleep::Virtual {
                sleep: v.sleep_future(duration),
            },
            ClockHandle::Custom(c) => Sleep::Boxed {
                sleep: c.sleep(duration),
            },
        }
    }

    /// Holds a virtual clock where it is until the hold is dropped: no
    /// async sleep moves it past now meanwhile. A waiter woken in a queue
    /// holds it until it has had its turn, so that it runs at the instant
    /// it was woken. Nothing for other clocks.
    pub(crate) fn hold(&self) -> Option<TimeHold> {
        match self {
            #[cfg(any(test, feature = "test-util"))]
            ClockHandle::Virtual(v) => Some(TimeHold(v.hold())),
            _ => None,
        }
    }

    /// A queue holding `self` ([`hold`](Self::hold)) holds `other` too:
    /// both are one virtual clock (or its clones), or neither is virtual
    /// (nothing is held).
    pub(crate) fn holds_as(&self, other: &ClockHandle) -> bool {
        match (self, other) {
            #[cfg(any(test, feature = "test-util"))]
            (ClockHandle::Virtual(a), ClockHandle::Virtual(b)) => a.is_same_clock(b),
            #[cfg(any(test, feature = "test-util"))]
            (ClockHandle::Virtual(_), _) | (_, ClockHandle::Virtual(_)) => false,
            _ => true,
        }
    }

    pub(crate) fn sleep_blocking(&self, duration: Duration) {
        match self {
            ClockHandle::System => std::thread::sleep(duration),
            #[cfg(any(test, feature = "test-util"))]
            ClockHandle::Virtual(v) => v.advance(duration),
            ClockHandle::Custom(c) => c.sleep_blocking(duration),
        }
    }
}

/// Saturating conversion of a duration to nanoseconds.
#[inline]
pub(crate) fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(any(test, feature = "test-util"))]
use crate::testing::VirtualSleep;

/// Stands for the virtual clock's sleep without the feature `test-util`:
/// no value of it exists, so `Sleep::Virtual` is never built.
#[cfg(not(any(test, feature = "test-util")))]
#[derive(Debug)]
pub(crate) enum VirtualSleep {}

#[cfg(not(any(test, feature = "test-util")))]
impl Future for VirtualSleep {
    type Output = ();
    fn poll(self: Pin<&mut Self>, _cx: &mut TaskContext<'_>) -> Poll<()> {
        match *self.get_mut() {}
    }
}

pin_project_lite::pin_project! {
    /// The sleep future of a pipeline's clock.
    #[project = SleepProj]
    pub(crate) enum Sleep {
        Tokio { #[pin] sleep: tokio::time::Sleep },
        Virtual { #[pin] sleep: VirtualSleep },
        Boxed { sleep: BoxSleep },
    }
}

impl fmt::Debug for Sleep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Sleep::Tokio { .. } => "Sleep::Tokio",
            Sleep::Virtual { .. } => "Sleep::Virtual",
            Sleep::Boxed { .. } => "Sleep::Boxed",
        })
    }
}

impl Future for Sleep {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<()> {
        match self.project() {
            SleepProj::Tokio { sleep } => sleep.poll(cx),
            SleepProj::Virtual { sleep } => sleep.poll(cx),
            SleepProj::Boxed { sleep } => sleep.as_mut().poll(cx),
        }
    }
}

/// A source of random numbers for jitter.
pub trait Random: Send + Sync + fmt::Debug + 'static {
    /// A uniformly distributed 64-bit value.
    fn next_u64(&self) -> u64;

    /// A uniformly distributed value in `[0, 1)`.
    fn next_f64(&self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The default random source: a fast per-thread generator seeded from the
/// operating system's hasher keys. Not for cryptography.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemRandom;

impl Random for SystemRandom {
    fn next_u64(&self) -> u64 {
        use std::cell::Cell;
        thread_local! {
            static STATE: Cell<u64> = Cell::new({
                use std::hash::{BuildHasher, Hasher};
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_usize(&h as *const _ as usize);
                h.finish() | 1
            });
        }
        STATE.with(|s| {
            let (next, out) = splitmix64(s.get());
            s.set(next);
            out
        })
    }
}

/// A deterministic random source: the same seed gives the same sequence.
/// Clones share one sequence.
#[derive(Debug, Clone)]
pub struct SeededRandom {
    state: Arc<AtomicU64>,
}

impl SeededRandom {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        SeededRandom {
            state: Arc::new(AtomicU64::new(seed)),
        }
    }
}

impl Random for SeededRandom {
    fn next_u64(&self) -> u64 {
        let s = self.state.fetch_add(GOLDEN, Ordering::Relaxed);
        mix(s.wrapping_add(GOLDEN))
    }
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn splitmix64(state: u64) -> (u64, u64) {
    let next = state.wrapping_add(GOLDEN);
    (next, mix(next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_random_is_repeatable() {
        let a = SeededRandom::new(7);
        let b = SeededRandom::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let c = SeededRandom::new(8);
        assert_ne!(SeededRandom::new(7).next_u64(), c.next_u64());
    }

    #[test]
    fn next_f64_is_in_unit_interval() {
        let r = SeededRandom::new(1);
        for _ in 0..10_000 {
            let x = r.next_f64();
            assert!((0.0..1.0).contains(&x));
        }
    }

    /// A bound turned into a reading of the system clock: every reading
    /// before it is earlier than the bound, it is not; readings are scaled
    /// as `now_nanos` scales them.
    #[test]
    fn the_first_reading_at_a_time_is_exact() {
        let clock = ClockHandle::System;
        let now = clock.ticks();
        assert!(clock.nanos_at(now) <= clock.now_nanos());
        assert_eq!(clock.first_reading_at(0), 0);
        for nanos in [1, 7, 1_000, 123_456_789, 3_600_000_000_000, 1 << 50] {
            let t = clock.first_reading_at(nanos);
            assert!(clock.nanos_at(t) >= nanos, "{nanos}");
            assert!(clock.nanos_at(t - 1) < nanos, "{nanos}");
        }
        assert_eq!(clock.nanos_between(now, now + 1_000_000), {
            let (c, _) = system();
            c.delta_as_nanos(now, now + 1_000_000)
        });
        assert_eq!(clock.nanos_between(now, now), 0);
        let virtual_clock = ClockHandle::from_clock(VirtualClock::new());
        assert_eq!(virtual_clock.first_reading_at(42), 42);
        assert_eq!(virtual_clock.nanos_between(5, 42), 37);
        assert_eq!(virtual_clock.nanos_at(42), 42);
    }

    #[test]
    fn from_clock_recognises_builtin_clocks() {
        assert!(matches!(
            ClockHandle::from_clock(SystemClock),
            ClockHandle::System
        ));
        assert!(matches!(
            ClockHandle::from_clock(VirtualClock::new()),
            ClockHandle::Virtual(_)
        ));
    }
}
