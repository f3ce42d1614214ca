//! Time, injected.
//!
//! The orchestrator reads the wall clock for deadlines and transition timestamps
//! and sleeps between compensation retries through a [`Clock`]. Tests use a
//! [`VirtualClock`], which advances when slept on, so minutes of backoff take
//! microseconds. Postgres leases are the exception: they use the database
//! server's clock, because every worker must agree on them.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A boxed, `Send` future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A source of wall-clock time and of sleeps.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current wall-clock time.
    fn now(&self) -> SystemTime;
    /// A future that completes after `duration`.
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()>;
}

/// The real clock: [`SystemTime::now`] and [`tokio::time::sleep`].
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// A clock for tests: time stands still until [`advance`](VirtualClock::advance)
/// is called or something sleeps, and a sleep returns at once after moving the
/// time forward by its duration. Clones share the same time.
#[derive(Clone, Debug)]
pub struct VirtualClock {
    state: Arc<Mutex<VirtualState>>,
}

#[derive(Debug)]
struct VirtualState {
    now: SystemTime,
    sleeps: Vec<Duration>,
}

impl VirtualClock {
    /// A virtual clock starting at `start`.
    pub fn starting_at(start: SystemTime) -> Self {
        VirtualClock {
            state: Arc::new(Mutex::new(VirtualState {
                now: start,
                sleeps: Vec::new(),
            })),
        }
    }

    /// A virtual clock starting at the real current time.
    pub fn new() -> Self {
        Self::starting_at(SystemTime::now())
    }

    /// Moves the time forward.
    pub fn advance(&self, by: Duration) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.now += by;
    }

    /// Every sleep requested so far, in order.
    pub fn sleeps(&self) -> Vec<Duration> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.sleeps.clone()
    }
}

impl Default for VirtualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> SystemTime {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .now
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.now += duration;
            state.sleeps.push(duration);
        }
        Box::pin(std::future::ready(()))
    }
}

/// Milliseconds since the Unix epoch (negative before it), saturating.
pub(crate) fn to_millis(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

/// The inverse of [`to_millis`].
pub(crate) fn from_millis(millis: i64) -> SystemTime {
    if millis >= 0 {
        UNIX_EPOCH + Duration::from_millis(millis as u64)
    } else {
        UNIX_EPOCH - Duration::from_millis(millis.unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn virtual_clock_advances_on_sleep_and_is_shared_by_clones() {
        let clock = VirtualClock::starting_at(UNIX_EPOCH);
        let other = clock.clone();
        clock.sleep(Duration::from_secs(90)).await;
        other.advance(Duration::from_secs(10));
        assert_eq!(clock.now(), UNIX_EPOCH + Duration::from_secs(100));
        assert_eq!(other.sleeps(), vec![Duration::from_secs(90)]);
    }

    #[test]
    fn millis_round_trip() {
        let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(from_millis(to_millis(t)), t);
        assert_eq!(to_millis(from_millis(-5)), -5);
    }
}
