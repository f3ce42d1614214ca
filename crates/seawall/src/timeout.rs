//! Timeout: per attempt (declared after the retry) or for the whole call
//! (declared before it).
//!
//! In async code the timeout is real: the operation's future is dropped at
//! the deadline. In sync code it is cooperative: the deadline is in the
//! [`Context`](crate::Context) for the operation to honour; a success that
//! arrives late is kept and reported by a `DeadlineExceeded` event (the
//! default, [`Timeout::new`]) or turned into [`Error::Timeout`](crate::Error::Timeout)
//! ([`Timeout::strict`]).
//!
//! A result is late when it arrives after the deadline: one that arrives
//! at the deadline is on time, in async and sync code alike.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::clock::{duration_nanos, ClockHandle, Sleep};
use crate::error::ConfigError;

/// Configuration of a timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Timeout {
    /// The time allowed.
    pub duration: Duration,
    /// Sync calls only: a late success becomes an error instead of an event.
    pub strict: bool,
}

impl Timeout {
    /// A timeout; late sync successes are kept and reported by an event.
    pub fn new(duration: Duration) -> Self {
        Timeout {
            duration,
            strict: false,
        }
    }

    /// A timeout under which a late sync success becomes `Error::Timeout`.
    pub fn strict(duration: Duration) -> Self {
        Timeout {
            duration,
            strict: true,
        }
    }

    pub(crate) fn nanos(&self) -> u64 {
        duration_nanos(self.duration)
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.duration.is_zero() {
            return Err(ConfigError::new("timeout", "duration", "must be > 0"));
        }
        Ok(())
    }
}

impl From<Duration> for Timeout {
    fn from(d: Duration) -> Self {
        Timeout::new(d)
    }
}

/// How late a result that arrived at `end` is for `deadline` (nanoseconds
/// of the pipeline's clock): `None` when it is on time, at the deadline
/// included.
#[inline]
pub(crate) fn late_by(end: u64, deadline: u64) -> Option<u64> {
    end.checked_sub(deadline).filter(|&late| late > 0)
}

/// Whether a wait of `wait` nanoseconds from `now` fits before `deadline`:
/// one that ends at the deadline does (what follows it is on time, by
/// [`late_by`]).
#[inline]
pub(crate) fn wait_fits(now: u64, wait: u64, deadline: u64) -> bool {
    late_by(now.saturating_add(wait), deadline).is_none()
}

pin_project_lite::pin_project! {
    /// Runs a future until a deadline. The timer is armed only if the future
    /// does not finish on its first poll, so a fast success costs no timer
    /// (one clock reading: a result is late by the clock, whether or not
    /// the future yielded before it).
    pub(crate) struct WithDeadline<'c, F> {
        #[pin]
        future: F,
        #[pin]
        sleep: Option<Sleep>,
        clock: &'c ClockHandle,
        deadline: Option<u64>,
    }
}

impl<'c, F> WithDeadline<'c, F> {
    pub(crate) fn new(future: F, clock: &'c ClockHandle, deadline: Option<u64>) -> Self {
        WithDeadline {
            future,
            sleep: None,
            clock,
            deadline,
        }
    }
}

impl<F: Future> Future for WithDeadline<'_, F> {
    /// `None` when the deadline passed first.
    type Output = Option<F::Output>;

    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Poll::Ready(v) = this.future.poll(cx) {
            // The result counts only if it is not late: the operation may
            // have run past the deadline inside a poll (blocking work, a
            // virtual clock moved), on its first poll as on a later one.
            if let Some(d) = *this.deadline {
                if late_by(this.clock.now_nanos(), d).is_some() {
                    return Poll::Ready(None);
                }
            }
            return Poll::Ready(Some(v));
        }
        let Some(deadline) = *this.deadline else {
            return Poll::Pending;
        };
        if this.sleep.is_none() {
            let now = this.clock.now_nanos();
            if now >= deadline {
                return Poll::Ready(None);
            }
            this.sleep
                .set(Some(this.clock.sleep(Duration::from_nanos(deadline - now))));
        }
        match this.sleep.as_pin_mut() {
            Some(s) => s.poll(cx).map(|()| None),
            None => Poll::Pending,
        }
    }
}
