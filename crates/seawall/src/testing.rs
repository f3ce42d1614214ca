//! Test helpers: a virtual clock whose sleeps advance time at once.
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::clock::{duration_nanos, BoxSleep, Clock};

pub use crate::clock::SeededRandom;

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

    /// Moves time forward by `by`, waking the async sleepers that are due.
    pub fn advance(&self, by: Duration) {
        let now = self
            .inner
            .nanos
            .fetch_add(duration_nanos(by), Ordering::SeqCst)
            + duration_nanos(by);
        self.wake_due(now);
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
