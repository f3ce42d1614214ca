//! Bulkhead: a cap on concurrent attempts per resource (and partition).
//!
//! Declared after the retry, a slot is taken when an attempt starts and
//! given back when it ends (success, error, panic or drop of the future);
//! never held during a retry wait. Declared before the retry, a slot is
//! held for the whole call, retry waits included. Async calls may wait in a
//! bounded queue, oldest first, for at most `max_wait` from when they join
//! it (see [`Bulkhead::queue`]); sync calls are rejected at once. In a
//! shared store each slot is a lease, so a slot held by a process that died
//! comes back when the lease expires.

use std::time::Duration;

use crate::error::ConfigError;

pub(crate) mod machine;
pub(crate) mod queue;
pub(crate) mod rules;

/// Configuration of a bulkhead.
///
/// # Default
/// [`Bulkhead::new`]: no queue (reject at once when full), lease 60 s,
/// enforcing (not in shadow mode).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Bulkhead {
    /// Attempts allowed to run at the same time.
    pub max_concurrent: u32,
    /// Async calls allowed to wait for a slot at the same time (per process),
    /// first in, first out (see [`queue`](Self::queue)).
    pub max_queued: u32,
    /// How long a queued call waits at most, from when it joins the queue
    /// (zero without a queue: a call that finds every slot taken is
    /// refused at once; a queue needs more than zero, see
    /// [`queue`](Bulkhead::queue)).
    pub max_wait: Duration,
    /// Lease of a slot in a shared store.
    pub lease: Duration,
    /// Shadow mode: the bulkhead counts and reports but never refuses (see
    /// [`crate::shadow`]).
    pub shadow: bool,
}

impl Bulkhead {
    /// At most `max_concurrent` attempts in flight.
    ///
    /// # Errors
    /// 0 fails `build()` (`bulkhead.max_concurrent must be >= 1, got 0`):
    /// a bulkhead that admits nothing is a switch, not a limit; to refuse
    /// every call, [`isolate`](crate::Pipeline::isolate) a circuit.
    pub fn new(max_concurrent: u32) -> Self {
        Bulkhead {
            max_concurrent,
            max_queued: 0,
            max_wait: Duration::ZERO,
            lease: Duration::from_secs(60),
            shadow: false,
        }
    }

    /// Lets up to `max_queued` async calls wait at most `max_wait` for a
    /// slot, counted from when a call joins the queue (time it spent
    /// waiting for other policies, a cooldown or a rate limit, does not
    /// count) and never past the call's deadline; a slot given back at the
    /// very instant the wait runs out (its `max_wait` or the deadline) is
    /// still the waiter's. A call whose wait runs out without a slot is
    /// refused (`bulkhead_full`), whichever ran out: a timeout of the whole
    /// call declared before this policy bounds the wait, and the call then
    /// ends with the refusal, not with `Error::Timeout` (the operation did
    /// not run). Sync calls never wait: they are refused at once.
    ///
    /// The queue is kept in this process, first in, first out; each
    /// partition has a queue of its own, as it has slots of its own (and a
    /// bulkhead declared before the retry one apart from one declared after
    /// it), and pipelines that share the slots in this process (one name
    /// and equal settings on one memory store) share the queue. A slot
    /// given back in this process is handed to the oldest waiter at once,
    /// and a call does not take a slot while older calls wait in its
    /// queue: it queues behind them, or is refused (`bulkhead_full`) when
    /// the queue is full or it may not wait. (Such a call is refused
    /// before the other policies of the admission are asked: while calls
    /// wait, a newcomer that the circuit would refuse may be reported as
    /// refused by the bulkhead.) A waiter dropped, or
    /// whose wait or deadline runs out, leaves its place and passes a slot
    /// handed to it on to the next.
    ///
    /// With a store shared by several processes (Redis), slots given back
    /// by other processes (or by another pipeline of this process bound to
    /// the same resource) wake nobody here. As a fallback for them, the
    /// oldest waiter of each queue also asks the store again 1 ms after it
    /// joined, then at intervals doubling up to 20 ms, so a slot freed
    /// elsewhere is seen within 20 ms; only the oldest asks, so the order
    /// holds. (The interval is kept on every store, so that a call
    /// observes the same waits on each; on the memory store it finds
    /// nothing the wake-ups did not.)
    ///
    /// # Errors
    /// A zero `max_wait` with a queue (`max_queued` > 0) fails `build()`:
    /// `bulkhead.max_wait must be > 0 when max_queued is 3`. For no queue,
    /// leave it out (or ask for `queue(0, Duration::ZERO)`): a call that
    /// finds every slot taken is then refused at once. `max_queued` 0 is no
    /// queue whatever `max_wait` says (no call may wait, so the wait bounds
    /// nothing), which lets a wait set for many bulkheads stay when one of
    /// them turns its queue off.
    pub fn queue(mut self, max_queued: u32, max_wait: Duration) -> Self {
        self.max_queued = max_queued;
        self.max_wait = max_wait;
        self
    }

    /// The lease of a slot in a shared store; must exceed the attempt
    /// timeout by more than one second.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Shadow mode: a call that finds every slot taken runs at once,
    /// without a slot and without queueing, with a
    /// [`ShadowRejected`](crate::EventKind::ShadowRejected) event instead
    /// of the refusal. The slots count only the calls an enforcing bulkhead
    /// would have let in (see [`crate::shadow`]).
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    pub(crate) fn validate(&self, attempt_timeout: Option<Duration>) -> Result<(), ConfigError> {
        const P: &str = "bulkhead";
        if self.max_concurrent == 0 {
            return Err(ConfigError::new(P, "max_concurrent", "must be >= 1, got 0"));
        }
        if self.max_queued > 0 && self.max_wait.is_zero() {
            return Err(ConfigError::new(
                P,
                "max_wait",
                format!("must be > 0 when max_queued is {}", self.max_queued),
            ));
        }
        if self.lease.is_zero() {
            return Err(ConfigError::new(P, "lease", "must be > 0"));
        }
        if let Some(t) = attempt_timeout {
            // No lease exceeds a timeout within 1 s of `Duration::MAX`.
            let long_enough = t
                .checked_add(Duration::from_secs(1))
                .is_some_and(|min| self.lease > min);
            if !long_enough {
                return Err(ConfigError::new(
                    P,
                    "lease",
                    format!(
                        "must exceed the attempt timeout ({t:?}) by more than 1s, got {:?}",
                        self.lease
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        assert_eq!(
            Bulkhead::new(0).validate(None).unwrap_err().to_string(),
            "bulkhead.max_concurrent must be >= 1, got 0"
        );
        let e = Bulkhead::new(2)
            .lease(Duration::from_secs(6))
            .validate(Some(Duration::from_secs(5)))
            .unwrap_err();
        assert_eq!(e.field, "lease");
        assert!(Bulkhead::new(2)
            .lease(Duration::from_millis(6001))
            .validate(Some(Duration::from_secs(5)))
            .is_ok());
        assert!(Bulkhead::new(2)
            .queue(3, Duration::ZERO)
            .validate(None)
            .is_err());
        // Regression: a timeout near `Duration::MAX` overflowed `t + 1s`.
        for t in [Duration::MAX, Duration::from_secs(u64::MAX)] {
            let e = Bulkhead::new(2)
                .lease(Duration::MAX)
                .validate(Some(t))
                .unwrap_err();
            assert_eq!((e.policy, e.field), ("bulkhead", "lease"));
            assert!(e.rule.starts_with("must exceed the attempt timeout"), "{e}");
        }
        let t = Duration::MAX - Duration::from_secs(2);
        assert!(Bulkhead::new(2)
            .lease(Duration::MAX)
            .validate(Some(t))
            .is_ok());
    }

    #[test]
    fn the_longest_timeout_fails_validation_without_overflow() {
        let e = Bulkhead::new(2)
            .lease(Duration::MAX)
            .validate(Some(Duration::MAX))
            .unwrap_err();
        assert_eq!(e.field, "lease");
        assert!(Bulkhead::new(2)
            .lease(Duration::MAX)
            .validate(Some(Duration::MAX - Duration::from_secs(2)))
            .is_ok());
    }
}
