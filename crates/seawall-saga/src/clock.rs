//! Time, injected: seawall's clocks, read as wall-clock time.
//!
//! The orchestrator sleeps between compensation attempts through a
//! [`seawall::Clock`], and it reads wall-clock time for deadlines and the
//! timestamps of transitions. seawall's `Clock` alone cannot give the second:
//! its `now()` is *monotonic* time since an origin fixed by each process (the
//! process start, for [`seawall::SystemClock`]), right for measuring a delay
//! within one process and meaningless in another one. A saga's deadline and
//! timestamps are stored in the log and read back by other processes and after
//! restarts, so they must be wall-clock instants ([`SystemTime`]), and a
//! monotonic clock does not become one by adding a start time (it does not
//! count a suspended machine's sleep and ignores clock corrections).
//!
//! So the orchestrator's clock is a [`WallClock`]: a `seawall::Clock` (whose
//! sleeps it uses as they are) that also tells wall-clock time. It is
//! implemented for [`seawall::SystemClock`] (the default: [`SystemTime::now`])
//! and, with the feature `test-util`, for `seawall::testing::VirtualClock`,
//! whose reading is taken as time since the Unix epoch: its sleeps return at
//! once after moving time forward, so minutes of compensation backoff take
//! microseconds. Postgres leases are the exception: they use the database
//! server's clock, because every worker must agree on them.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A boxed, `Send` future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A [`seawall::Clock`] that also tells wall-clock time: the orchestrator's
/// clock (see the [module docs](self) for why seawall's clock needs this).
///
/// # Examples
///
/// A test clock, starting at a realistic instant:
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use seawall::testing::VirtualClock;
/// use seawall_saga::WallClock;
///
/// let clock = VirtualClock::starting_at(Duration::from_secs(1_700_000_000));
/// clock.advance(Duration::from_secs(5));
/// assert_eq!(clock.wall_time(), UNIX_EPOCH + Duration::from_secs(1_700_000_005));
/// ```
pub trait WallClock: seawall::Clock {
    /// The current wall-clock time.
    fn wall_time(&self) -> SystemTime;
}

/// [`SystemTime::now`].
impl WallClock for seawall::SystemClock {
    fn wall_time(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// The virtual time, taken as time since the Unix epoch
/// (`VirtualClock::new()` starts on 1 January 1970).
#[cfg(feature = "test-util")]
impl WallClock for seawall::testing::VirtualClock {
    fn wall_time(&self) -> SystemTime {
        UNIX_EPOCH + self.now()
    }
}

/// Milliseconds since the Unix epoch (negative before it), saturating.
pub(crate) fn to_millis(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

/// `time` as the log keeps it: to the millisecond (see [`to_millis`]). The
/// orchestrator takes every instant it logs (transition timestamps, a saga's
/// creation and deadline) at this precision before it uses it, so what its
/// listeners, its outcomes and the steps' contexts see is what the log reads
/// back, in this process or another.
pub(crate) fn log_precision(time: SystemTime) -> SystemTime {
    from_millis(to_millis(time))
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
    use seawall::testing::VirtualClock;

    #[tokio::test]
    async fn a_virtual_clock_is_wall_time_since_the_epoch_and_moves_on_sleep() {
        let clock = VirtualClock::starting_at(Duration::from_secs(1_000));
        let other = clock.clone();
        seawall::Clock::sleep(&clock, Duration::from_secs(90)).await;
        other.advance(Duration::from_secs(10));
        assert_eq!(clock.wall_time(), UNIX_EPOCH + Duration::from_secs(1_100));
    }

    #[test]
    fn the_system_clock_tells_the_system_time() {
        let before = SystemTime::now();
        let read = seawall::SystemClock.wall_time();
        assert!(read >= before && read <= SystemTime::now());
    }

    #[test]
    fn millis_round_trip() {
        let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(from_millis(to_millis(t)), t);
        assert_eq!(to_millis(from_millis(-5)), -5);
    }
}
