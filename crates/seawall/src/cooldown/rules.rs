//! The cooldown's rules, as pure functions of the end of the pause: no
//! atomics, no clock, no I/O. The memory store's cells
//! ([`machine`](super::machine)) apply them; times are nanoseconds on the
//! pipeline clock, and `0` is fresh state (no pause ever opened).
//!
//! - [`extend`]: a retry-after hint `h` at `now` moves the end of the pause
//!   to `max(end, now + min(h, max_pause))`: a shorter hint never shrinks
//!   it. The sum saturates at `u64::MAX`, the safe side: a pause that would
//!   end past the clock's range lasts to its end.
//! - [`admit`]: a call is refused while `now < end`, with
//!   `retry_after = end - now`.

use std::time::Duration;

/// The end of the pause after a retry-after hint of `hint_ns` at `now`, the
/// pause being capped at `max_pause_ns` per hint.
#[inline]
pub(crate) fn extend(end: u64, hint_ns: u64, max_pause_ns: u64, now: u64) -> u64 {
    end.max(now.saturating_add(hint_ns.min(max_pause_ns)))
}

/// Admits a call at `now` while the pause ends at `end`: `Ok(())` once it
/// is over, `Err(retry_after)`, the time left, while it lasts.
#[inline(always)]
pub(crate) fn admit(end: u64, now: u64) -> Result<(), Duration> {
    if now < end {
        Err(Duration::from_nanos(end - now))
    } else {
        Ok(())
    }
}

/// `true` when the pause ending at `end` admits every call from any `now`
/// on, so that the clock need not be read to admit.
#[inline(always)]
pub(crate) fn never_paused(end: u64) -> bool {
    end == 0
}

/// The time left of a pause ending at `end`, `None` when no pause is in
/// effect at `now`.
#[inline]
pub(crate) fn remaining(end: u64, now: u64) -> Option<Duration> {
    admit(end, now).err()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn a_hint_extends_and_never_shrinks_the_pause() {
        for base in [0, 1_000_000 * SEC] {
            let max = 300 * SEC;
            let end = extend(0, 10 * SEC, max, base);
            assert_eq!(end, base + 10 * SEC);
            assert_eq!(extend(end, 2 * SEC, max, base + SEC), end, "shorter hint");
            assert_eq!(extend(end, 20 * SEC, max, base + SEC), base + 21 * SEC);
            assert_eq!(extend(0, 3_600 * SEC, max, base), base + max, "capped");
            // A zero hint opens no pause.
            let later = base + 20 * SEC;
            assert_eq!(admit(extend(end, 0, max, later), later), Ok(()));
        }
    }

    #[test]
    fn admission_is_refused_exactly_until_the_end() {
        for base in [0, 1_000_000 * SEC] {
            let end = base + 10 * SEC;
            assert_eq!(admit(end, base), Err(Duration::from_secs(10)));
            assert_eq!(admit(end, end - 1), Err(Duration::from_nanos(1)));
            assert_eq!(admit(end, end), Ok(()));
            assert_eq!(remaining(end, end - 1), Some(Duration::from_nanos(1)));
            assert_eq!(remaining(end, end), None);
        }
        assert!(never_paused(0));
        assert_eq!(admit(0, 0), Ok(()), "fresh state admits at the origin");
        assert!(!never_paused(1));
    }

    #[test]
    fn a_pause_past_the_end_of_the_clock_lasts_to_its_end() {
        let end = extend(0, u64::MAX, u64::MAX, u64::MAX - SEC);
        assert_eq!(end, u64::MAX);
        assert_eq!(admit(end, u64::MAX - 1), Err(Duration::from_nanos(1)));
        assert_eq!(extend(end, SEC, u64::MAX, u64::MAX), u64::MAX);
        assert_eq!(extend(0, 0, u64::MAX, u64::MAX), u64::MAX);
        assert_eq!(admit(u64::MAX, u64::MAX), Ok(()));
    }
}
