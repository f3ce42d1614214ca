//! Tools for testing code that uses seawall (feature `test-util`): a
//! virtual clock whose sleeps advance time at once, random sources that
//! repeat, and contexts for unit tests of an operation.
//!
//! - [`VirtualClock`]: time moves only when told to or when something
//!   sleeps on it; [`VirtualClock::starting_at`] puts it far from zero.
//! - [`SequenceRandom`]: returns the values it is given, in order, cycling,
//!   so a jittered delay is known exactly.
//! - [`SeededRandom`]: a repeatable pseudo-random sequence.
//! - [`Context::builder`](crate::Context::builder): the context an operation
//!   receives, built by hand to unit-test the operation without a pipeline.
//! - [`differential`]: the differential corpus of the pipeline, run on any
//!   store (sync and async, with and without listeners, near and far from
//!   the clock's origin must all observe the same).
//!
//! Enable the feature for tests only:
//!
//! ```toml
//! [dev-dependencies]
//! seawall = { version = "0.1", features = ["test-util"] }
//! ```
//!
//! ```
//! use std::time::Duration;
//! use seawall::testing::VirtualClock;
//! use seawall::{Pipeline, Retry};
//!
//! let clock = VirtualClock::new();
//! let pipeline = Pipeline::builder("flaky")
//!     .retry(Retry::constant(Duration::from_secs(60)).max_attempts(3))
//!     .clock(clock.clone())
//!     .build()
//!     .unwrap();
//! let mut calls = 0;
//! let result = pipeline.call(|_ctx| {
//!     calls += 1;
//!     if calls < 3 { Err("not yet") } else { Ok(calls) }
//! });
//! assert_eq!(result.unwrap(), 3);
//! // Two minutes of backoff passed on the virtual clock, none on the wall clock.
//! assert_eq!(clock.now(), Duration::from_secs(120));
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::clock::{duration_nanos, BoxSleep, Clock, Random};

pub mod differential;

pub use crate::clock::SeededRandom;
pub use crate::context::ContextBuilder;

/// A clock that only moves when told to or when something sleeps on it.
///
/// Clones share the same time. A blocking sleep of `d` moves the clock
/// forward by `d` at once. An async sleep registers its deadline, yields
/// once, then moves the clock to the earliest registered deadline, waking
/// the sleepers that are due; so concurrent sleeps and timeouts end in
/// deadline order, minutes of backoff run in microseconds, and a run is
/// deterministic.
#[derive(Debug, Clone, Default)]
pub struct VirtualClock {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    nanos: AtomicU64,
    next_id: AtomicU64,
    sleepers: Mutex<Vec<(u64, u64, Waker)>>,
}

impl VirtualClock {
    /// A virtual clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// A virtual clock at `start`: a clock far from zero, like the system
    /// clock of a process that has been up for a while, shows the mistakes
    /// that take "no time yet" for "the beginning of time". A start beyond
    /// `u64::MAX` nanoseconds (about 584 years) is that maximum.
    ///
    /// ```
    /// use std::time::Duration;
    /// use seawall::testing::VirtualClock;
    ///
    /// let clock = VirtualClock::starting_at(Duration::from_secs(1_000_000));
    /// clock.advance(Duration::from_millis(5));
    /// assert_eq!(clock.now(), Duration::from_millis(1_000_000_005));
    /// ```
    pub fn starting_at(start: Duration) -> Self {
        let clock = Self::default();
        clock
            .inner
            .nanos
            .store(duration_nanos(start), Ordering::SeqCst);
        clock
    }

    /// Moves time forward by `by`, waking the async sleepers that are due.
    /// Time stops at `u64::MAX` nanoseconds (about 584 years) instead of
    /// wrapping around.
    pub fn advance(&self, by: Duration) {
        let by = duration_nanos(by);
        let previous = self
            .inner
            .nanos
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_add(by))
            })
            .unwrap_or_else(|n| n);
        self.wake_due(previous.saturating_add(by));
    }

    /// The current virtual time.
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.now_nanos())
    }

    /// How many handles share this clock (for tests of reference counts).
    #[cfg(test)]
    pub(crate) fn handles(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// Both handles share one time (one is a clone of the other).
    pub(crate) fn is_same_clock(&self, other: &VirtualClock) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    pub(crate) fn now_nanos(&self) -> u64 {
        self.inner.nanos.load(Ordering::SeqCst)
    }

    fn sleepers(&self) -> std::sync::MutexGuard<'_, Vec<(u64, u64, Waker)>> {
        self.inner
            .sleepers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes the sleepers that are due. They stay registered until they
    /// have run, so that no other sleeper moves time past them before they
    /// had their turn.
    fn wake_due(&self, now: u64) {
        let due: Vec<Waker> = self
            .sleepers()
            .iter()
            .filter(|(until, _, _)| *until <= now)
            .map(|(_, _, w)| w.clone())
            .collect();
        due.into_iter().for_each(Waker::wake);
    }

    /// Holds time where it is until the guard is dropped: no async sleep
    /// moves the clock past now meanwhile (an explicit
    /// [`advance`](Self::advance) still does). A store request in flight
    /// to a real server holds it, so that the other attempts' sleeps do
    /// not run ahead of the answer.
    pub(crate) fn hold(&self) -> Hold {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        self.sleepers()
            .push((self.now_nanos(), id, Waker::noop().clone()));
        Hold {
            clock: self.clone(),
            id,
        }
    }

    pub(crate) fn sleep_future(&self, duration: Duration) -> VirtualSleep {
        VirtualSleep {
            clock: self.clone(),
            until: self.now_nanos().saturating_add(duration_nanos(duration)),
            id: self.inner.next_id.fetch_add(1, Ordering::Relaxed),
            registered: false,
        }
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Duration {
        VirtualClock::now(self)
    }
    fn sleep(&self, duration: Duration) -> BoxSleep {
        Box::pin(self.sleep_future(duration))
    }
    fn sleep_blocking(&self, duration: Duration) {
        self.advance(duration)
    }
}

/// Time held by [`VirtualClock::hold`] until it is dropped.
#[derive(Debug)]
pub(crate) struct Hold {
    clock: VirtualClock,
    id: u64,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let id = self.id;
        self.clock.sleepers().retain(|e| e.1 != id);
    }
}

/// The async sleep of a [`VirtualClock`].
#[derive(Debug)]
pub struct VirtualSleep {
    clock: VirtualClock,
    until: u64,
    id: u64,
    registered: bool,
}

impl Future for VirtualSleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let clock = self.clock.clone();
        if clock.now_nanos() >= self.until {
            self.deregister();
            return Poll::Ready(());
        }
        let (until, id) = (self.until, self.id);
        if !self.registered {
            self.registered = true;
            clock.sleepers().push((until, id, cx.waker().clone()));
            // Yield once so that every sleeper of this round registers
            // before time moves.
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let earliest = {
            let mut s = clock.sleepers();
            if let Some(entry) = s.iter_mut().find(|e| e.1 == id) {
                entry.2 = cx.waker().clone();
            } else {
                s.push((until, id, cx.waker().clone()));
            }
            s.iter().map(|e| e.0).min().unwrap_or(until)
        };
        let now = clock
            .inner
            .nanos
            .fetch_max(earliest, Ordering::SeqCst)
            .max(earliest);
        if now >= until {
            self.deregister();
            clock.wake_due(now);
            Poll::Ready(())
        } else {
            clock.wake_due(now);
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

impl VirtualSleep {
    fn deregister(&mut self) {
        if self.registered {
            self.registered = false;
            let id = self.id;
            self.clock.sleepers().retain(|e| e.1 != id);
        }
    }
}

impl Drop for VirtualSleep {
    fn drop(&mut self) {
        self.deregister();
    }
}

/// A random source that returns the values it is given, in order, starting
/// over after the last: with `SequenceRandom::new([0.5])`, full jitter gives
/// exactly half of every delay.
///
/// Every value must be in `[0, 1)`, the range of [`Random::next_f64`]:
/// [`SequenceRandom::new`] panics on a value outside it (NaN included) or
/// on an empty sequence, naming the value and its position;
/// [`SequenceRandom::try_new`] returns the same refusal as a
/// [`SequenceError`]. Clones share one position in the sequence.
///
/// [`next_f64`](Random::next_f64) returns the values exactly;
/// [`next_u64`](Random::next_u64) returns each value scaled to 64 bits
/// (`value x 2^64`, rounded down).
///
/// ```
/// use std::time::Duration;
/// use seawall::testing::{SequenceRandom, VirtualClock};
/// use seawall::{Jitter, Pipeline, Retry};
///
/// let clock = VirtualClock::new();
/// let pipeline = Pipeline::builder("jittered")
///     .retry(Retry::constant(Duration::from_secs(1)).max_attempts(3).jitter(Jitter::Full))
///     .random(SequenceRandom::new([0.5, 0.25]))
///     .clock(clock.clone())
///     .build()?;
/// let _ = pipeline.call(|_ctx| Err::<(), _>("down"));
/// // Waited 1 s x 0.5, then 1 s x 0.25.
/// assert_eq!(clock.now(), Duration::from_millis(750));
/// # Ok::<_, seawall::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct SequenceRandom {
    values: Arc<[f64]>,
    next: Arc<AtomicUsize>,
}

/// Why a [`SequenceRandom`] was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SequenceError {
    /// The sequence has no value.
    #[error("a random sequence needs at least one value")]
    Empty,
    /// A value is outside `[0, 1)` or is NaN.
    #[error("random value {value} at position {index} is outside [0, 1)")]
    OutOfRange {
        /// Its position in the sequence, from 0.
        index: usize,
        /// The value.
        value: f64,
    },
}

impl SequenceRandom {
    /// A source returning `values` in order, cycling.
    ///
    /// # Panics
    /// When `values` is empty or a value is outside `[0, 1)` (NaN
    /// included); the message names the value and its position. Use
    /// [`try_new`](Self::try_new) to get the refusal as an error.
    #[track_caller]
    pub fn new(values: impl IntoIterator<Item = f64>) -> Self {
        match Self::try_new(values) {
            Ok(random) => random,
            Err(e) => panic!("SequenceRandom::new: {e}"),
        }
    }

    /// A source returning `values` in order, cycling.
    ///
    /// # Errors
    /// [`SequenceError::Empty`] for an empty sequence,
    /// [`SequenceError::OutOfRange`] for the first value outside `[0, 1)`
    /// (NaN included).
    ///
    /// ```
    /// use seawall::testing::{SequenceError, SequenceRandom};
    ///
    /// assert!(SequenceRandom::try_new([0.0, 0.999]).is_ok());
    /// assert_eq!(
    ///     SequenceRandom::try_new([0.5, 1.0]).unwrap_err(),
    ///     SequenceError::OutOfRange { index: 1, value: 1.0 },
    /// );
    /// assert_eq!(SequenceRandom::try_new([]).unwrap_err(), SequenceError::Empty);
    /// ```
    pub fn try_new(values: impl IntoIterator<Item = f64>) -> Result<Self, SequenceError> {
        let values: Arc<[f64]> = values.into_iter().collect();
        if values.is_empty() {
            return Err(SequenceError::Empty);
        }
        if let Some((index, &value)) = values
            .iter()
            .enumerate()
            .find(|(_, v)| !(0.0..1.0).contains(*v))
        {
            return Err(SequenceError::OutOfRange { index, value });
        }
        Ok(SequenceRandom {
            values,
            next: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The values, in order.
    pub fn values(&self) -> &[f64] {
        &self.values
    }

    fn take(&self) -> f64 {
        let len = self.values.len();
        let i = self
            .next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |i| {
                Some((i + 1) % len)
            })
            .unwrap_or_else(|i| i);
        self.values[i]
    }
}

impl Random for SequenceRandom {
    fn next_u64(&self) -> u64 {
        // Exact for every value in [0, 1): at most 2^64 - 2^11 after
        // scaling, and the cast rounds down.
        (self.take() * 18_446_744_073_709_551_616.0) as u64
    }

    fn next_f64(&self) -> f64 {
        self.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_cycles_and_clones_share_it() {
        let r = SequenceRandom::new([0.0, 0.5, 0.75]);
        let copy = r.clone();
        assert_eq!(r.next_f64(), 0.0);
        assert_eq!(copy.next_f64(), 0.5);
        assert_eq!(r.next_f64(), 0.75);
        assert_eq!(r.next_f64(), 0.0);
        assert_eq!(r.values(), [0.0, 0.5, 0.75]);
    }

    #[test]
    fn next_u64_scales_the_value() {
        let r = SequenceRandom::new([0.5, 0.0, 1.0 - f64::EPSILON / 2.0]);
        assert_eq!(r.next_u64(), 1 << 63);
        assert_eq!(r.next_u64(), 0);
        let top = r.next_u64();
        assert!(top > u64::MAX - (1 << 11), "{top}");
        // The default mapping of `next_u64` to `[0, 1)` gives the value back.
        let r = SequenceRandom::new([0.25]);
        let u = r.next_u64();
        assert_eq!((u >> 11) as f64 * (1.0 / (1u64 << 53) as f64), 0.25);
    }

    #[test]
    fn sequence_refuses_values_outside_the_unit_interval() {
        for bad in [1.0, -0.0001, f64::NAN, f64::INFINITY, -f64::INFINITY, 2.5] {
            let e = SequenceRandom::try_new([0.5, bad]).unwrap_err();
            assert!(
                matches!(e, SequenceError::OutOfRange { index: 1, value } if value.to_bits() == bad.to_bits()),
                "{bad}: {e:?}"
            );
        }
        assert_eq!(
            SequenceRandom::try_new(Vec::new()).unwrap_err(),
            SequenceError::Empty
        );
        assert_eq!(
            SequenceError::OutOfRange {
                index: 2,
                value: 1.5
            }
            .to_string(),
            "random value 1.5 at position 2 is outside [0, 1)"
        );
        // -0.0 is zero.
        assert!(SequenceRandom::try_new([-0.0]).is_ok());
    }

    #[test]
    #[should_panic(
        expected = "SequenceRandom::new: random value NaN at position 0 is outside [0, 1)"
    )]
    fn sequence_new_panics_with_the_reason() {
        let _ = SequenceRandom::new([f64::NAN]);
    }

    #[test]
    #[should_panic(expected = "SequenceRandom::new: a random sequence needs at least one value")]
    fn sequence_new_panics_on_an_empty_list() {
        let _ = SequenceRandom::new([]);
    }

    #[test]
    fn a_clock_can_start_far_from_zero_and_saturates() {
        let far = Duration::from_secs(1_000_000);
        let clock = VirtualClock::starting_at(far);
        assert_eq!(clock.now(), far);
        clock.advance(Duration::from_nanos(1));
        assert_eq!(clock.now(), far + Duration::from_nanos(1));
        let end = VirtualClock::starting_at(Duration::MAX);
        assert_eq!(end.now(), Duration::from_nanos(u64::MAX));
        end.advance(Duration::from_secs(1));
        assert_eq!(end.now(), Duration::from_nanos(u64::MAX));
        let near = VirtualClock::starting_at(Duration::from_nanos(u64::MAX - 10));
        near.advance(Duration::MAX);
        assert_eq!(near.now(), Duration::from_nanos(u64::MAX));
    }
}
