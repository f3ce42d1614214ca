//! The bulkhead's cells in the memory store: thin atomic wrappers that
//! apply the rule of [`rules`](super::rules).
//!
//! A partition key keeps one counter; the unpartitioned resource splits its
//! slots into stripes ([`StripedSlots`]) so that threads taking and giving
//! back slots at once do not write to the same cache line. A slot is one
//! compare-and-swap to take; a stripe's slot is one locked subtraction to
//! give back, a partition's one compare-and-swap.

use std::sync::atomic::{AtomicU32, Ordering};

use super::rules;

/// Takes a slot of `in_flight` by [`rules::take`]: never lets the count
/// pass `max`, even transiently.
#[inline]
pub(crate) fn acquire_slot(in_flight: &AtomicU32, max: u32) -> bool {
    let mut current = in_flight.load(Ordering::Relaxed);
    loop {
        let Some(next) = rules::take(current, max) else {
            return false;
        };
        match in_flight.compare_exchange_weak(current, next, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(actual) => current = actual,
        }
    }
}

/// Gives a slot of `in_flight` back by [`rules::give_back`].
#[inline]
pub(crate) fn release_slot(in_flight: &AtomicU32) {
    let mut current = in_flight.load(Ordering::Relaxed);
    loop {
        let next = rules::give_back(current);
        if next == current {
            // A permit given back twice: nothing to give.
            return;
        }
        match in_flight.compare_exchange_weak(current, next, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return,
            Err(actual) => current = actual,
        }
    }
}

/// Gives a slot of `in_flight`, which never holds more than `cap`, back by
/// [`rules::give_back`] in one locked subtraction, without reading the
/// count first (a read there would wait for the locked take before it and
/// hold the subtraction up). The holder of a slot finds the count positive,
/// and the subtraction is the rule's answer. A count of zero (a permit
/// given back twice) or above `cap` (wrapped by such a release under way)
/// has nothing to give: what was subtracted is put back. While a count is
/// wrapped it reads as more than `cap`, so no slot is taken on it.
#[inline]
pub(crate) fn release_slot_of(in_flight: &AtomicU32, cap: u32) {
    let before = in_flight.fetch_sub(1, Ordering::Release);
    if rules::give_back(before) == before || before > cap {
        in_flight.fetch_add(1, Ordering::Relaxed);
    }
}

/// The bulkhead slots of a view: one counter (a partition) or stripes
/// (the unpartitioned state).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Slots<'a> {
    One(&'a AtomicU32),
    Striped(&'a StripedSlots),
}

impl Slots<'_> {
    /// Takes a slot: its id for [`release`](Self::release), or `None` when
    /// all `max` are taken.
    #[inline]
    pub(crate) fn acquire(self, max: u32) -> Option<u64> {
        match self {
            Slots::One(in_flight) => acquire_slot(in_flight, max).then_some(0),
            Slots::Striped(slots) => slots.acquire(),
        }
    }

    #[inline]
    pub(crate) fn release(self, slot: u64) {
        match self {
            Slots::One(in_flight) => release_slot(in_flight),
            Slots::Striped(slots) => slots.release(slot),
        }
    }

    /// The slots taken.
    pub(crate) fn in_flight(self) -> u32 {
        match self {
            Slots::One(in_flight) => in_flight.load(Ordering::Acquire),
            Slots::Striped(slots) => slots.in_flight(),
        }
    }
}

/// The most stripes a bulkhead is split into.
const MAX_STRIPES: usize = 16;

/// The bulkhead of the unpartitioned state: its `max` slots split into
/// stripes, each on cache lines of its own, so that threads taking and
/// giving back slots at the same time do not write to the same line. A
/// thread takes from its own stripe first and from the others in turn when
/// it is full; each stripe holds a fixed share of `max`, so the slots taken
/// never number more than `max`, even transiently.
#[derive(Debug)]
pub(crate) struct StripedSlots {
    stripes: Box<[Stripe]>,
}

#[derive(Debug)]
#[repr(align(128))]
struct Stripe {
    in_flight: AtomicU32,
    cap: u32,
}

impl StripedSlots {
    /// A power of two of stripes: at most one per core, each holding at
    /// least one slot.
    pub(crate) fn new(max: u32) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_stripes(max, cores)
    }

    fn with_stripes(max: u32, wanted: usize) -> Self {
        let by_cores = wanted.max(1).next_power_of_two().min(MAX_STRIPES);
        // The largest power of two not above `max` (at least 1).
        let by_slots = 1usize << (u32::BITS - 1 - max.max(1).leading_zeros());
        let n = by_cores.min(by_slots) as u32;
        StripedSlots {
            stripes: (0..n)
                .map(|i| Stripe {
                    in_flight: AtomicU32::new(0),
                    cap: max / n + u32::from(i < max % n),
                })
                .collect(),
        }
    }

    #[inline]
    pub(crate) fn acquire(&self) -> Option<u64> {
        let mask = self.stripes.len() - 1;
        let home = stripe_hint() & mask;
        for k in 0..self.stripes.len() {
            let i = (home + k) & mask;
            let stripe = &self.stripes[i];
            if acquire_slot(&stripe.in_flight, stripe.cap) {
                return Some(i as u64);
            }
        }
        None
    }

    #[inline]
    pub(crate) fn release(&self, slot: u64) {
        if let Some(stripe) = self.stripes.get(slot as usize) {
            release_slot_of(&stripe.in_flight, stripe.cap);
        }
    }

    pub(crate) fn in_flight(&self) -> u32 {
        self.stripes
            .iter()
            // A count wrapped by a permit given back twice is put back
            // at once; until then it holds no slot.
            .map(|s| match s.in_flight.load(Ordering::Acquire) {
                n if n <= s.cap => n,
                _ => 0,
            })
            .sum()
    }
}

/// The stripe a thread tries first: threads are numbered in the order they
/// first ask, so that threads working at the same time start on different
/// stripes.
#[inline]
fn stripe_hint() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static HINT: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    HINT.try_with(|hint| {
        let mut h = hint.get();
        if h == usize::MAX {
            h = NEXT.fetch_add(1, Ordering::Relaxed) & (usize::MAX >> 1);
            hint.set(h);
        }
        h
    })
    .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;

    proptest! {
        /// On one thread, striped slots and a single counter decide exactly
        /// as the rule applied in sequence to one count of `max`: a slot is
        /// refused only when `max` are taken, whatever the number of stripes
        /// and the order slots are given back in.
        #[test]
        fn striped_slots_count_like_one_counter(
            max in 1u32..40,
            wanted in 1usize..20,
            ops in proptest::collection::vec(any::<(bool, prop::sample::Index)>(), 1..200),
        ) {
            let slots = StripedSlots::with_stripes(max, wanted);
            prop_assert!(slots.stripes.len().is_power_of_two());
            prop_assert!(slots.stripes.iter().all(|s| s.cap >= 1));
            prop_assert_eq!(slots.stripes.iter().map(|s| s.cap).sum::<u32>(), max);
            let one = AtomicU32::new(0);
            let mut model = 0u32;
            let mut held = Vec::new();
            for (take, which) in ops {
                if take || held.is_empty() {
                    let expected = rules::take(model, max);
                    prop_assert_eq!(acquire_slot(&one, max), expected.is_some());
                    match slots.acquire() {
                        Some(slot) => held.push(slot),
                        None => prop_assert!(expected.is_none()),
                    }
                    model = expected.unwrap_or(model);
                } else {
                    slots.release(held.swap_remove(which.index(held.len())));
                    release_slot(&one);
                    model = rules::give_back(model);
                }
                prop_assert_eq!(slots.in_flight(), model);
                prop_assert_eq!(one.load(Ordering::Relaxed), model);
                prop_assert_eq!(held.len() as u32, model);
            }
        }
    }

    #[test]
    fn striped_slots_never_pass_max_across_threads() {
        use std::sync::atomic::AtomicU32;
        for (max, stripes) in [(1, 8), (3, 8), (5, 4), (64, 16)] {
            let slots = StripedSlots::with_stripes(max, stripes);
            let holders = AtomicU32::new(0);
            let peak = AtomicU32::new(0);
            let taken = AtomicU32::new(0);
            std::thread::scope(|scope| {
                for _ in 0..8 {
                    scope.spawn(|| {
                        for _ in 0..5_000 {
                            if let Some(slot) = slots.acquire() {
                                let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                                peak.fetch_max(now, Ordering::SeqCst);
                                taken.fetch_add(1, Ordering::Relaxed);
                                std::hint::spin_loop();
                                holders.fetch_sub(1, Ordering::SeqCst);
                                slots.release(slot);
                            }
                        }
                    });
                }
            });
            assert!(
                peak.load(Ordering::SeqCst) <= max,
                "max {max}: peak {peak:?}"
            );
            assert!(taken.load(Ordering::Relaxed) > 0);
            assert_eq!(slots.in_flight(), 0);
        }
    }

    #[test]
    fn permits_given_back_twice_at_once_leave_a_stripe_empty() {
        for (max, stripes) in [(1, 1), (4, 2), (64, 16)] {
            let slots = StripedSlots::with_stripes(max, stripes);
            let n = slots.stripes.len() as u64;
            std::thread::scope(|scope| {
                for t in 0..8u64 {
                    let slots = &slots;
                    scope.spawn(move || {
                        for i in 0..5_000u64 {
                            // Nothing is taken: every release is a permit
                            // given back twice.
                            slots.release((t + i) % n);
                            assert!(slots.in_flight() <= max);
                        }
                    });
                }
            });
            assert_eq!(slots.in_flight(), 0, "max {max}");
            for s in slots.stripes.iter() {
                assert_eq!(s.in_flight.load(Ordering::Relaxed), 0, "max {max}");
            }
            let taken: Vec<u64> = std::iter::from_fn(|| slots.acquire()).take(1_000).collect();
            assert_eq!(taken.len() as u32, max, "exactly max slots after");
        }
    }

    #[test]
    fn a_single_counter_gives_back_only_what_was_taken() {
        let n = AtomicU32::new(0);
        assert!(acquire_slot(&n, 2));
        assert!(acquire_slot(&n, 2));
        assert!(!acquire_slot(&n, 2));
        release_slot(&n);
        release_slot(&n);
        release_slot(&n);
        assert_eq!(n.load(Ordering::Relaxed), 0, "never wraps");
        assert!(acquire_slot(&n, 1));
        assert!(!acquire_slot(&n, 1));
    }
}
