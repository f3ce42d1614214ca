//! The cooldown's cell in the memory store: the end of the pause in one
//! `AtomicU64`, read with one load to admit and written with a
//! compare-and-swap loop around [`rules::extend`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::rules;

/// Admits a call at `now` on the pause ending in `cell`
/// ([`rules::admit`]).
#[inline(always)]
pub(crate) fn admit(cell: &AtomicU64, now: u64) -> Result<(), Duration> {
    rules::admit(cell.load(Ordering::Acquire), now)
}

/// Admits a call if the pause in `cell` admits it whatever the time, the
/// clock `now` being read only when it does not ([`rules::never_paused`]):
/// `true` when admitted.
#[inline(always)]
pub(crate) fn admits(cell: &AtomicU64, now: impl FnOnce() -> u64) -> bool {
    let end = cell.load(Ordering::Acquire);
    rules::never_paused(end) || rules::admit(end, now()).is_ok()
}

/// Applies a retry-after hint of `hint_ns` at `now` ([`rules::extend`]);
/// returns the time left of the pause after it, `None` when none is in
/// effect.
pub(crate) fn extend(
    cell: &AtomicU64,
    hint_ns: u64,
    max_pause_ns: u64,
    now: u64,
) -> Option<Duration> {
    let mut current = cell.load(Ordering::Acquire);
    let end = loop {
        let next = rules::extend(current, hint_ns, max_pause_ns, now);
        if next == current {
            break current;
        }
        match cell.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break next,
            Err(actual) => current = actual,
        }
    };
    rules::remaining(end, now)
}

/// `true` when the pause in `cell` is over at `now`, so that dropping the
/// cell changes no decision.
pub(crate) fn is_idle(cell: &AtomicU64, now: u64) -> bool {
    admit(cell, now).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    proptest::proptest! {
        /// The cell decides exactly as the rules applied in sequence, from
        /// clocks at 0, 10^6 s and near the end of the clock.
        #[test]
        fn the_cell_decides_as_the_rules_in_sequence(
            base in proptest::sample::select(vec![0u64, 1_000_000 * SEC, u64::MAX - 1_000 * SEC]),
            max_pause in 1u64..100 * SEC,
            steps in proptest::collection::vec((0u64..10 * SEC, proptest::option::of(0u64..200 * SEC)), 1..100),
        ) {
            let cell = AtomicU64::new(0);
            let mut end = 0u64;
            let mut now = base;
            for (step, hint) in steps {
                now = now.saturating_add(step);
                proptest::prop_assert_eq!(admit(&cell, now), rules::admit(end, now));
                proptest::prop_assert_eq!(admits(&cell, || now), rules::admit(end, now).is_ok());
                if let Some(h) = hint {
                    end = rules::extend(end, h, max_pause, now);
                    proptest::prop_assert_eq!(extend(&cell, h, max_pause, now), rules::remaining(end, now));
                }
                proptest::prop_assert_eq!(is_idle(&cell, now), rules::admit(end, now).is_ok());
            }
        }
    }

    #[test]
    fn concurrent_hints_keep_the_longest() {
        let cell = AtomicU64::new(0);
        std::thread::scope(|scope| {
            for t in 0..8u64 {
                let cell = &cell;
                scope.spawn(move || {
                    for i in 0..1_000u64 {
                        extend(cell, (t * 1_000 + i) * SEC, u64::MAX, 5 * SEC);
                    }
                });
            }
        });
        assert_eq!(cell.load(Ordering::Relaxed), 5 * SEC + 7_999 * SEC);
    }

    #[test]
    fn the_clock_is_not_read_when_no_pause_was_ever_opened() {
        let cell = AtomicU64::new(0);
        assert!(admits(&cell, || unreachable!("no clock read")));
        extend(&cell, SEC, u64::MAX, 0);
        assert!(!admits(&cell, || SEC - 1));
        assert!(admits(&cell, || SEC));
    }
}
