//! The bulkhead's rule, as pure functions of the count of slots taken: no
//! atomics, no clock, no I/O. The memory store's cells
//! ([`machine`](super::machine)) apply them in compare-and-swap loops.
//!
//! A slot is taken only while fewer than `max` are ([`take`]); giving one
//! back never goes below zero ([`give_back`]), so a permit given back twice
//! cannot wrap the count around and let `u32::MAX` more calls in.

/// Takes a slot: `Some(in_flight + 1)` when fewer than `max` are taken,
/// `None` (bulkhead full) otherwise.
#[inline(always)]
pub(crate) fn take(in_flight: u32, max: u32) -> Option<u32> {
    (in_flight < max).then(|| in_flight + 1)
}

/// Gives a slot back: `in_flight - 1`, never below zero.
#[inline(always)]
pub(crate) fn give_back(in_flight: u32) -> u32 {
    in_flight.saturating_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_exactly_max_slots() {
        for max in [1, 2, 10, u32::MAX] {
            let mut n = 0;
            let mut taken = 0u64;
            while let Some(next) = take(n, max) {
                n = next;
                taken += 1;
                if taken == 1_000 {
                    break;
                }
            }
            assert_eq!(taken, u64::from(max.min(1_000)), "max {max}");
        }
        assert_eq!(take(0, 0), None);
        assert_eq!(take(u32::MAX, u32::MAX), None);
        assert_eq!(take(u32::MAX - 1, u32::MAX), Some(u32::MAX));
    }

    #[test]
    fn giving_back_never_wraps() {
        assert_eq!(give_back(3), 2);
        assert_eq!(give_back(1), 0);
        assert_eq!(give_back(0), 0);
    }
}
