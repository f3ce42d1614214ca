//! Reference model of the bulkhead: a cap on the attempts holding a slot.
//!
//! # Rules
//! - An attempt is admitted when fewer than `max_concurrent` slots are held
//!   at `now`; it then holds one more slot until it gives it back.
//! - With a lease (shared stores), a slot taken at `t` is held while
//!   `now < t + lease`: a slot never given back (its process died) is free
//!   again once its lease has run out. Giving back a slot whose lease ran
//!   out changes nothing.
//! - Without a lease (the in-memory store, where slots die with their
//!   process), a slot is held until it is given back.
//! - Giving back a slot twice, or a slot never taken, changes nothing.
//!
//! The queue of waiting async calls is the pipeline's, not the store's: it
//! is not part of this model.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{instant, later};

/// The state of one bulkhead.
///
/// ```
/// use std::time::Duration;
/// use seawall::model::bulkhead::Bulkhead;
///
/// let secs = Duration::from_secs;
/// let mut b = Bulkhead::leased(1, secs(60));
/// let slot = b.acquire(secs(0)).unwrap();
/// assert_eq!(b.acquire(secs(59)), None);
/// // Never given back: free again when its lease runs out.
/// assert!(b.acquire(secs(60)).is_some());
/// b.release(slot);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bulkhead {
    max_concurrent: u32,
    lease: Option<Duration>,
    /// The slots taken and not given back: id, and the instant the lease
    /// runs out (`None`: no lease).
    taken: BTreeMap<u64, Option<Duration>>,
    next_id: u64,
}

impl Bulkhead {
    /// A bulkhead of `max_concurrent` slots without leases.
    pub fn new(max_concurrent: u32) -> Self {
        Bulkhead {
            max_concurrent,
            lease: None,
            taken: BTreeMap::new(),
            next_id: 0,
        }
    }

    /// A bulkhead of `max_concurrent` slots, each leased for `lease`.
    pub fn leased(max_concurrent: u32, lease: Duration) -> Self {
        Bulkhead {
            lease: Some(lease),
            ..Self::new(max_concurrent)
        }
    }

    /// The model of `spec`: with its lease when `leases` is `true` (a
    /// shared store), without otherwise (the in-memory store).
    pub fn from_spec(spec: &crate::Bulkhead, leases: bool) -> Self {
        if leases {
            Self::leased(spec.max_concurrent, spec.lease)
        } else {
            Self::new(spec.max_concurrent)
        }
    }

    /// Slots held at `now`.
    pub fn in_flight(&self, now: Duration) -> u32 {
        let now = instant(now);
        let held = self
            .taken
            .values()
            .filter(|until| until.is_none_or(|until| now < until))
            .count();
        u32::try_from(held).unwrap_or(u32::MAX)
    }

    /// Takes a slot at `now`: its id, or `None` when `max_concurrent` are
    /// held.
    pub fn acquire(&mut self, now: Duration) -> Option<u64> {
        if self.in_flight(now) >= self.max_concurrent {
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        let until = self.lease.map(|lease| later(instant(now), lease));
        self.taken.insert(id, until);
        Some(id)
    }

    /// Gives back slot `id`.
    pub fn release(&mut self, id: u64) {
        self.taken.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn admits_up_to_max_and_again_after_a_release() {
        let mut b = Bulkhead::new(2);
        let one = b.acquire(S).unwrap();
        let two = b.acquire(S).unwrap();
        assert_ne!(one, two);
        assert_eq!(b.acquire(S), None);
        assert_eq!(b.in_flight(S), 2);
        b.release(one);
        b.release(one);
        assert_eq!(b.in_flight(S), 1);
        assert!(b.acquire(S).is_some());
        // Without a lease a slot is held for ever.
        assert_eq!(b.in_flight(super::super::END), 2);
    }

    #[test]
    fn a_lease_runs_out_exactly_at_its_end() {
        let mut b = Bulkhead::leased(1, 10 * S);
        let slot = b.acquire(5 * S).unwrap();
        assert_eq!(b.in_flight(15 * S - Duration::from_nanos(1)), 1);
        assert_eq!(b.acquire(15 * S - Duration::from_nanos(1)), None);
        assert_eq!(b.in_flight(15 * S), 0);
        let next = b.acquire(15 * S).unwrap();
        // Giving back the expired slot leaves the new one held.
        b.release(slot);
        assert_eq!(b.in_flight(15 * S), 1);
        b.release(next);
        assert_eq!(b.in_flight(15 * S), 0);
    }

    #[test]
    fn a_lease_past_the_end_of_the_range_lasts_to_the_end() {
        let end = super::super::END;
        let mut b = Bulkhead::leased(1, Duration::MAX);
        b.acquire(end - S).unwrap();
        assert_eq!(b.in_flight(end - Duration::from_nanos(1)), 1);
        assert_eq!(b.in_flight(end), 0);
        assert_eq!(b.in_flight(Duration::MAX), 0);
    }
}
