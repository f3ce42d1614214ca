//! The rate limiter's rules, as pure functions: state, parameters and the
//! time in, the decision and the next state out. No atomics, no clock, no
//! I/O; the memory store's cells ([`machine`](super::machine)) apply them
//! in compare-and-swap loops, and the reference models test against them.
//!
//! Times are nanoseconds on the pipeline clock. Every rule is total over
//! `u64`: differences saturate, nothing overflows or panics, and a call
//! whose `now` is older than the state's is counted against the newer
//! state (never admitting more than the limit).
//!
//! - GCRA ([`gcra`]): the state is the theoretical arrival time (TAT) of
//!   the next call. With the emission interval `T = period / limit`
//!   (rounded up to the nanosecond, so never faster than the limit:
//!   [`RateLimiter::emission_interval`]) and the
//!   tolerance `tau = T * (burst - 1)`, a call at `now` conforms when
//!   `TAT <= now + tau`; it then moves the TAT to `max(TAT, now) + T`. A
//!   refused call is told to retry after exactly `TAT - tau - now`.
//! - Fixed window ([`fixed_window`]): the state is the index of the last
//!   window with a permit taken and its count ([`Window`]); the window of a
//!   call is `floor(now / period)`. A call is admitted while its window
//!   holds fewer than `limit` admissions; a refused one retries at the
//!   start of the next window. The index is kept whole, so a stored window
//!   is before, at or after the caller's as the numbers say, after any
//!   idle time; the memory store packs the state into one word when the
//!   largest index and the count fit together ([`RateParams::packs`]).
//! - Sliding window ([`sliding_window`]): an exact log of admission times.
//!   A call is admitted when fewer than `limit` admissions happened in
//!   `(now - period, now]`, i.e. when the admission `limit` places back is
//!   at least `period` old; a refused one retries when it is.
//!
//! # Reservations
//! A call that may wait for its permit (`max_wait`) asks with a lead
//! `within`: when the next free permit is at most `within` away, the rule
//! takes it now for that later instant (a *reservation*) and tells the
//! instant, so that every later caller sees the permit as taken and queues
//! behind it, or is refused at once when its own wait would be too long.
//! The call runs at the reserved instant without asking the limiter again.
//! With `within = 0` nothing is ever reserved: the plain rules above.
//!
//! # Weights
//! A call may take `n` permits at once (an API priced in cost units, a
//! batch of `n` rows). The weighted rule *is* the rule: an unweighted call
//! is a call of weight 1, and every rule below takes its `n`.
//!
//! - GCRA: the call conforms when its last permit does,
//!   `TAT + (n - 1) * T <= now + tau`; the TAT then moves by `n * T`.
//! - Fixed window: admitted while `count + n <= limit` in its window.
//! - Sliding window: the log holds `n` entries for the call (a plain log
//!   of permits, so that expiry stays one entry at a time); admitted when
//!   the entry `limit - n + 1` places back is at least `period` old, i.e.
//!   when at most `limit - n` permits were taken in `(now - period, now]`.
//!
//! A weight the limiter can never grant ([`weight_fits`]: more than the
//! burst for GCRA, more than the limit for the windows) is refused at once
//! by the callers, without a `retry_after`: waiting would not help.
//!
//! - GCRA reserves naturally: the TAT moves by one interval, the permit's
//!   instant is `max(TAT, now) - tau`.
//! - Fixed window: the state word then holds the *last* window with a
//!   permit taken and its count; every window from the caller's up to it
//!   counts as full (a reservation is only ever made in the window after
//!   a full one). The permit's instant is the start of its window.
//! - Sliding window: the log holds the reserved instant, `oldest + period`
//!   (never earlier than the newest entry).
//!
//! A reservation given back (its call was cancelled, or a policy checked
//! before the rate limit refused it when it was due) returns its permit
//! exactly where the state can tell it apart: GCRA and the fixed window
//! keep one number for the whole queue, so only the newest reservation can
//! be taken out of it (the TAT still the one it set, the window still the
//! last one counted; a window emptied so is kept as the one before it,
//! full, so that the reservation before it is the newest in its turn); an
//! older one stays spent, which is stricter, never
//! looser, and lasts only until the queue behind it has passed (at most
//! `max_wait`). The sliding log takes out exactly the entry reserved; a
//! later caller is still placed after the newest entry, so a hole between
//! two reservations is not filled (stricter, never looser).

use std::time::Duration;

use super::{RateAlgorithm, RateLimiter};
use crate::clock::duration_nanos;

/// A rate limiter configuration, prepared for the rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RateParams {
    pub(crate) algorithm: RateAlgorithm,
    pub(crate) limit: u32,
    pub(crate) period_ns: u64,
    /// GCRA emission interval.
    pub(crate) interval_ns: u64,
    /// GCRA tolerance: `interval * (burst - 1)`.
    pub(crate) tolerance_ns: u64,
    /// Fixed window: bits of the count field of the packed word.
    pub(crate) count_bits: u32,
    /// Fixed window: the largest window index and the largest count fit
    /// one word together (see [`RateParams::packs`]).
    packs: bool,
    /// Calls may wait for a permit (`max_wait > 0`): the state must be
    /// able to give back a reservation.
    pub(crate) reserves: bool,
}

impl RateParams {
    pub(crate) fn new(spec: &RateLimiter) -> Self {
        let limit = spec.limit.max(1);
        let period_ns = duration_nanos(spec.period).max(1);
        let interval_ns = duration_nanos(spec.emission_interval()).max(1);
        let count_bits = u32::BITS - limit.leading_zeros();
        // The index of the last window of the clock, and its bits.
        let index_bits = u64::BITS - (u64::MAX / period_ns).leading_zeros();
        RateParams {
            algorithm: spec.algorithm,
            limit,
            period_ns,
            interval_ns,
            tolerance_ns: interval_ns.saturating_mul(u64::from(spec.burst.max(1) - 1)),
            count_bits,
            packs: index_bits + count_bits <= u64::BITS,
            reserves: !spec.max_wait.is_zero(),
        }
    }

    /// Fixed window: `true` when every state fits one word exactly,
    /// `[window index | count]` with the count in [`count_bits`](Self::count_bits):
    /// the index of the last window of the clock (`u64::MAX / period`) and
    /// the limit fit 64 bits together. Otherwise (more than about one
    /// permit per 4 ns, say `fixed_window(u32::MAX, 1 s)`) the state is
    /// kept whole, two numbers.
    pub(crate) fn packs(&self) -> bool {
        self.packs
    }

    /// A fixed-window state as one word (when it [`packs`](Self::packs)).
    #[inline]
    pub(crate) fn pack(&self, w: Window) -> u64 {
        debug_assert!(self.packs);
        (w.index << self.count_bits) | w.count
    }

    /// The fixed-window state of a word [`pack`](Self::pack) made.
    #[inline]
    pub(crate) fn unpack(&self, word: u64) -> Window {
        Window {
            index: word >> self.count_bits,
            count: word & ((1u64 << self.count_bits) - 1),
        }
    }
}

/// The fixed window's state: the last window with a permit taken, by its
/// whole index `floor(t / period)`, and its count (at most `limit`).
/// Fresh state is the default (window 0, no permit taken).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) index: u64,
    pub(crate) count: u64,
}

/// `true` when a call of weight `n` can ever be granted: `1 <= n <= burst`
/// for GCRA, `1 <= n <= limit` for the windows. A call whose weight does
/// not fit is refused at once, whatever the state.
#[inline]
pub(crate) fn weight_fits(p: &RateParams, n: u32) -> bool {
    n >= 1
        && match p.algorithm {
            RateAlgorithm::FixedWindow | RateAlgorithm::SlidingWindow => n <= p.limit,
            // `tau = T * (burst - 1)`: the last of `n` permits must fit in it.
            _ => u64::from(n - 1).saturating_mul(p.interval_ns) <= p.tolerance_ns,
        }
}

/// GCRA: admits a call of weight `n` at `now` on the theoretical arrival
/// time `tat`: [`gcra_reserve`] with no lead.
///
/// `Ok(next_tat)` when the call conforms, `Err(retry_after)` when it does
/// not (the state is then unchanged). Fresh state is `tat = 0`. A call
/// whose TAT would pass the end of the clock's range (`u64::MAX`) is
/// refused, with the emission interval as its wait: the limit holds to the
/// end (stricter, never looser). A weight that does not fit
/// ([`weight_fits`]) never conforms.
#[inline(always)]
pub(crate) fn gcra(tat: u64, p: &RateParams, now: u64, n: u32) -> Result<u64, Duration> {
    gcra_reserve(tat, p, now, 0, n).map(|grant| grant.next)
}

/// A permit granted by a rule: the next state, and the instant the permit
/// is for (`now` when the call is admitted at once, later when reserved).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant<S> {
    pub(crate) next: S,
    pub(crate) at: u64,
}

/// GCRA with reservations and weights (see the [module docs](self)): a
/// call of weight `n` (with [`weight_fits`]) that does not conform takes
/// its permits anyway when its wait, `max(tat, now) + (n - 1) * T - tau -
/// now`, is at most `within`; the TAT moves by `n * T` as for an admission
/// and the permits are for `now + wait`.
#[inline(always)]
pub(crate) fn gcra_reserve(
    tat: u64,
    p: &RateParams,
    now: u64,
    within: u64,
    n: u32,
) -> Result<Grant<u64>, Duration> {
    let start = tat.max(now);
    // The interval of the call's permits after the first (0 unweighted).
    let extra = u64::from(n.saturating_sub(1)).saturating_mul(p.interval_ns);
    let wait = (start - now)
        .saturating_add(extra)
        .saturating_sub(p.tolerance_ns);
    if wait > within {
        return Err(Duration::from_nanos(wait));
    }
    match start
        .checked_add(extra)
        .and_then(|last| last.checked_add(p.interval_ns))
    {
        Some(next) => Ok(Grant {
            next,
            at: now + wait,
        }),
        None => Err(Duration::from_nanos(p.interval_ns)),
    }
}

/// GCRA: the state once the reservation of `n` permits for instant `at` is
/// given back, when it can be: no call came after it (the TAT is still the
/// one it set, `at + tau + T`, every admission moving the TAT forward), so
/// the TAT moves back by `n` intervals. `None` otherwise: the calls queued
/// behind it keep their instants, and the intervals stay spent (see the
/// [module docs](self)).
pub(crate) fn gcra_give_back(tat: u64, p: &RateParams, at: u64, n: u32) -> Option<u64> {
    let set = at.checked_add(p.tolerance_ns)?.checked_add(p.interval_ns)?;
    let taken = u64::from(n).checked_mul(p.interval_ns)?;
    (set == tat).then(|| tat.checked_sub(taken)).flatten()
}

/// `true` when GCRA state `tat` decides every future call as fresh state
/// would, from `now` on (so that dropping it lets no extra call through).
#[inline]
pub(crate) fn gcra_is_idle(tat: u64, now: u64) -> bool {
    tat <= now
}

/// The last fixed window with a permit taken, seen from `now`, and its
/// count. Every window from `now`'s up to it counts as full: a stored
/// window at or after `now`'s (a reservation, or a caller whose `now` is
/// older than the state's) is counted as it is, an earlier one is over.
#[inline]
fn fixed_window_of(state: Window, p: &RateParams, now: u64) -> Window {
    let index = now / p.period_ns;
    if state.index >= index {
        state
    } else {
        Window { index, count: 0 }
    }
}

/// Fixed window: admits a call of weight `n` at `now` on `state`:
/// [`fixed_window_reserve`] with no lead.
///
/// `Ok(next_state)` when the call's window has room for its `n` permits,
/// `Err(retry_after)` (the time until the window of the next free permits
/// starts) when it has not.
#[inline]
pub(crate) fn fixed_window(
    state: Window,
    p: &RateParams,
    now: u64,
    n: u32,
) -> Result<Window, Duration> {
    fixed_window_reserve(state, p, now, 0, n).map(|grant| grant.next)
}

/// Fixed window with reservations and weights (see the
/// [module docs](self)): the next `n` free permits (`n` with
/// [`weight_fits`]) are in the last window counted if it has room for
/// them, else in the one after; a call in that window is admitted, any
/// other reserves them when the window starts at most `within` from `now`.
#[inline]
pub(crate) fn fixed_window_reserve(
    state: Window,
    p: &RateParams,
    now: u64,
    within: u64,
    n: u32,
) -> Result<Grant<Window>, Duration> {
    let index = now / p.period_ns;
    let Window { index: last, count } = fixed_window_of(state, p, now);
    let n = u64::from(n);
    let (window, count) = if count + n <= u64::from(p.limit) {
        (last, count)
    } else if let Some(after) = last.checked_add(1) {
        (after, 0)
    } else {
        return Err(Duration::from_nanos(u64::MAX - now));
    };
    let next = Window {
        index: window,
        count: count + n,
    };
    if window == index {
        return Ok(Grant { next, at: now });
    }
    // A window whose start is past the end of the clock is never reserved.
    match window.checked_mul(p.period_ns) {
        Some(start) if start > now && start - now <= within => Ok(Grant { next, at: start }),
        start => Err(Duration::from_nanos(
            start.unwrap_or(u64::MAX).saturating_sub(now),
        )),
    }
}

/// Fixed window: the state once the reservation of `n` permits for
/// instant `at` (the start of its window) is given back, when it can be:
/// its window is still the last one counted. `None` otherwise (see the
/// [module docs](self)). A window left with no permit is stored as the
/// window before it, full: the same state for every call, since every
/// window up to the last one counted counts as full.
pub(crate) fn fixed_window_give_back(
    state: Window,
    p: &RateParams,
    at: u64,
    n: u32,
) -> Option<Window> {
    let n = u64::from(n);
    if state.index != at / p.period_ns || state.count < n || n == 0 {
        return None;
    }
    Some(match (state.count - n, state.index.checked_sub(1)) {
        (0, Some(before)) => Window {
            index: before,
            count: u64::from(p.limit),
        },
        (count, _) => Window { count, ..state },
    })
}

/// `true` when fixed-window state `state` decides every future call as
/// fresh state would, from `now` on: no permit taken in `now`'s window or
/// after.
pub(crate) fn fixed_window_is_idle(state: Window, p: &RateParams, now: u64) -> bool {
    fixed_window_of(state, p, now)
        == Window {
            index: now / p.period_ns,
            count: 0,
        }
}

/// Sliding window: how many entries back from the newest the entry judged
/// for a call of weight `n` (with [`weight_fits`]) is: `limit - n + 1`
/// (`limit` unweighted). That entry is the `oldest` of [`sliding_window`].
#[inline]
pub(crate) fn sliding_window_depth(p: &RateParams, n: u32) -> usize {
    (p.limit - n.clamp(1, p.limit) + 1) as usize
}

/// Sliding window: admits a call at `now` given `oldest`, the time of the
/// permit [`sliding_window_depth`] places back (`None`: fewer permits so
/// far).
///
/// `Ok(())` when that admission is at least `period` old;
/// `Err(retry_after)`, the time until it is, otherwise. An admitted call
/// is logged at [`sliding_window_entry`].
#[inline]
pub(crate) fn sliding_window(
    oldest: Option<u64>,
    p: &RateParams,
    now: u64,
) -> Result<(), Duration> {
    match oldest {
        Some(t) if !sliding_window_expired(t, p, now) => Err(Duration::from_nanos(
            t.saturating_add(p.period_ns).saturating_sub(now),
        )),
        _ => Ok(()),
    }
}

/// Sliding window with reservations (see the [module docs](self)): the
/// instant of the permit a call at `now` gets, given `oldest` as for
/// [`sliding_window`] and `newest`, the newest entry of the log. `now`
/// when admitted at once; when refused, the time `oldest` stops counting
/// (never earlier than `newest`), if it is at most `within` from `now`.
/// The permit is logged at the instant returned.
#[inline]
pub(crate) fn sliding_window_reserve(
    oldest: Option<u64>,
    newest: Option<u64>,
    p: &RateParams,
    now: u64,
    within: u64,
) -> Result<u64, Duration> {
    match sliding_window(oldest, p, now) {
        Ok(()) => Ok(sliding_window_entry(newest, now)),
        Err(retry_after) => {
            // An instant past the end of the clock is never reserved.
            let free = oldest.and_then(|t| t.checked_add(p.period_ns));
            match free.map(|t| sliding_window_entry(newest, t)) {
                Some(at) if at - now <= within => Ok(at),
                _ => Err(retry_after),
            }
        }
    }
}

/// The time an admission at `now` is logged at, `newest` being the newest
/// entry of the log: entries never move earlier than their predecessor
/// (when callers' clocks disagree slightly the log is stricter, never
/// looser).
#[inline]
pub(crate) fn sliding_window_entry(newest: Option<u64>, now: u64) -> u64 {
    newest.map_or(now, |last| last.max(now))
}

/// `true` when the admission logged at `at` no longer counts at `now`.
#[inline]
pub(crate) fn sliding_window_expired(at: u64, p: &RateParams, now: u64) -> bool {
    now.saturating_sub(at) >= p.period_ns
}

/// `true` when a sliding log whose newest entry is `newest` decides every
/// future call as an empty log would, from `now` on.
pub(crate) fn sliding_window_is_idle(newest: Option<u64>, p: &RateParams, now: u64) -> bool {
    newest.is_none_or(|t| sliding_window_expired(t, p, now))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const SEC: u64 = 1_000 * MS;

    fn params(spec: RateLimiter) -> RateParams {
        RateParams::new(&spec)
    }

    /// Applies `rule` `tries` times at `now`, threading the state; returns
    /// how many were admitted.
    fn run<S: Copy>(state: &mut S, tries: u32, rule: impl Fn(S) -> Result<S, Duration>) -> u32 {
        let mut admitted = 0;
        for _ in 0..tries {
            if let Ok(next) = rule(*state) {
                *state = next;
                admitted += 1;
            }
        }
        admitted
    }

    #[test]
    fn gcra_admits_exactly_the_burst_then_one_per_interval() {
        // 10 per second (T = 100 ms), burst 3.
        let p = params(RateLimiter::gcra(10, Duration::from_secs(1)).burst(3));
        for base in [0, 1_000_000 * SEC, u64::MAX / 2] {
            let mut tat = 0;
            assert_eq!(run(&mut tat, 10, |s| gcra(s, &p, base, 1)), 3, "at {base}");
            assert_eq!(gcra(tat, &p, base, 1), Err(Duration::from_millis(100)));
            assert_eq!(
                gcra(tat, &p, base + 99 * MS, 1),
                Err(Duration::from_millis(1))
            );
            assert_eq!(
                gcra(tat, &p, base + 100 * MS - 1, 1),
                Err(Duration::from_nanos(1))
            );
            assert_eq!(run(&mut tat, 10, |s| gcra(s, &p, base + 100 * MS, 1)), 1);
            assert!(!gcra_is_idle(tat, base + 100 * MS));
            assert!(gcra_is_idle(tat, base + 400 * MS));
            // After a long pause the burst is back, never more.
            assert_eq!(run(&mut tat, 10, |s| gcra(s, &p, base + 10 * SEC, 1)), 3);
        }
    }

    #[test]
    fn weighted_calls_take_all_their_permits_or_none() {
        // 10 per second, burst 10: weight 4 twice, the third waits 200 ms.
        let p = params(RateLimiter::gcra(10, Duration::from_secs(1)));
        let mut tat = 0;
        assert_eq!(
            run(&mut tat, 2, |s| gcra_reserve(s, &p, 0, 0, 4)
                .map(|g| g.next)),
            2
        );
        assert_eq!(
            gcra_reserve(tat, &p, 0, 0, 4),
            Err(Duration::from_millis(200))
        );
        assert_eq!(
            gcra_reserve(tat, &p, 0, 0, 2).map(|g| g.next),
            Ok(1_000 * MS)
        );
        assert!(weight_fits(&p, 10) && !weight_fits(&p, 11) && !weight_fits(&p, 0));
        // Reserved 200 ms ahead, then given back while newest.
        let grant = gcra_reserve(tat, &p, 0, 200 * MS, 4).unwrap();
        assert_eq!(grant.at, 200 * MS);
        assert_eq!(gcra_give_back(grant.next, &p, grant.at, 4), Some(tat));
        let p1 = params(RateLimiter::gcra(10, Duration::from_secs(1)).burst(3));
        assert!(weight_fits(&p1, 3) && !weight_fits(&p1, 4));
        // A weight that does not fit never conforms, even on fresh state.
        for now in [0, 1_000_000 * SEC, u64::MAX] {
            assert!(gcra(0, &p1, now, 3).is_ok() || now == u64::MAX);
            assert!(gcra(0, &p1, now, 4).is_err(), "at {now}");
            assert!(gcra(0, &p1, now, u32::MAX).is_err(), "at {now}");
        }

        // Fixed window of 10: 4 + 4, then 4 waits for the next window; 2 fits.
        let p = params(RateLimiter::fixed_window(10, Duration::from_secs(1)));
        let mut word = Window::default();
        let p = &p;
        let rule = |n| move |s| fixed_window_reserve(s, p, 100 * MS, 0, n).map(|g| g.next);
        assert_eq!(run(&mut word, 3, rule(4)), 2);
        assert_eq!(
            fixed_window_reserve(word, p, 100 * MS, 0, 4),
            Err(Duration::from_millis(900))
        );
        assert_eq!(run(&mut word, 3, rule(2)), 1);
        assert!(weight_fits(p, 10) && !weight_fits(p, 11));
        let grant = fixed_window_reserve(word, p, 100 * MS, SEC, 3).unwrap();
        assert_eq!(grant.at, SEC);
        assert_eq!(
            fixed_window_give_back(grant.next, p, SEC, 3),
            Some(Window {
                index: 0,
                count: 10
            })
        );

        // Sliding window of 10: the entry 10 - 4 + 1 = 7 back is judged.
        let p = params(RateLimiter::sliding_window(10, Duration::from_secs(1)));
        assert_eq!(sliding_window_depth(&p, 4), 7);
        assert_eq!(sliding_window_depth(&p, 1), 10);
        assert_eq!(sliding_window_depth(&p, 10), 1);
    }

    #[test]
    fn gcra_limit_one_burst_one_is_strictly_spaced() {
        let p = params(RateLimiter::gcra(1, Duration::from_secs(1)).burst(1));
        let mut tat = 0;
        assert_eq!(run(&mut tat, 5, |s| gcra(s, &p, 0, 1)), 1);
        assert_eq!(gcra(tat, &p, SEC - 1, 1), Err(Duration::from_nanos(1)));
        assert_eq!(run(&mut tat, 5, |s| gcra(s, &p, SEC, 1)), 1);
    }

    #[test]
    fn gcra_never_overflows_near_the_end_of_the_clock() {
        let p = params(RateLimiter::gcra(2, Duration::from_secs(1)));
        let mut tat = 0;
        let end = u64::MAX - 2 * SEC;
        assert_eq!(run(&mut tat, 5, |s| gcra(s, &p, end, 1)), 2);
        assert!(gcra(tat, &p, end, 1).is_err());
        // No TAT fits past the end of the clock: refused, never wrapped
        // around or saturated into a free-for-all.
        for now in [u64::MAX - 400 * MS, u64::MAX - 1, u64::MAX] {
            assert_eq!(gcra(0, &p, now, 1), Err(Duration::from_millis(500)));
            assert!(gcra(u64::MAX, &p, now, 1).is_err());
        }
        // A caller far behind the state is refused, with a finite wait.
        assert!(gcra(u64::MAX, &p, 0, 1).is_err());
    }

    #[test]
    fn fixed_window_counts_exactly_and_resets_at_the_edge() {
        let p = params(RateLimiter::fixed_window(3, Duration::from_millis(100)));
        for base in [0, 1_000_000 * SEC] {
            let mut word = Window::default();
            assert_eq!(run(&mut word, 5, |s| fixed_window(s, &p, base, 1)), 3);
            assert_eq!(
                fixed_window(word, &p, base + 99 * MS, 1),
                Err(Duration::from_millis(1))
            );
            assert_eq!(
                fixed_window(word, &p, base + 100 * MS - 1, 1),
                Err(Duration::from_nanos(1))
            );
            assert!(!fixed_window_is_idle(word, &p, base + 50 * MS));
            assert!(fixed_window_is_idle(word, &p, base + 100 * MS));
            assert_eq!(
                run(&mut word, 5, |s| fixed_window(s, &p, base + 100 * MS, 1)),
                3
            );
            assert_eq!(
                run(&mut word, 5, |s| fixed_window(s, &p, base + 199 * MS, 1)),
                0
            );
        }
    }

    #[test]
    fn fixed_window_at_its_limits() {
        for limit in [1, 2, 7, 8, u32::MAX] {
            let p = params(RateLimiter::fixed_window(limit, Duration::from_secs(1)));
            let mut word = Window::default();
            let tries = limit.min(1_000) + 3;
            let expect = limit.min(tries);
            assert_eq!(
                run(&mut word, tries, |s| fixed_window(s, &p, 5 * SEC, 1)),
                expect
            );
        }
        // The last windows of the clock.
        let p = params(RateLimiter::fixed_window(2, Duration::from_secs(1)));
        let mut word = Window::default();
        assert_eq!(run(&mut word, 3, |s| fixed_window(s, &p, u64::MAX, 1)), 2);
        assert!(fixed_window(word, &p, u64::MAX, 1).is_err());
    }

    /// GCRA keeps its interval to the nanosecond, rounded up: a rate whose
    /// interval is a fraction of a nanosecond more than a whole number of
    /// them never admits more than the limit in a period (after the
    /// burst).
    #[test]
    fn gcra_never_admits_more_than_the_limit_when_the_interval_has_a_fraction() {
        // 400,000 per millisecond: 2.5 ns, kept as 3 ns.
        let p = params(RateLimiter::gcra(400_000, Duration::from_millis(1)).burst(1000));
        assert_eq!(p.interval_ns, 3);
        for (limit, burst) in [
            (400_000, 1_000),
            (3, 1),
            (7, 2),
            (999_999, 100),
            (1_000_000, 1),
        ] {
            let p = params(RateLimiter::gcra(limit, Duration::from_millis(1)).burst(burst));
            for base in [0, 1_000_000 * SEC] {
                let (mut tat, mut granted) = (0, 0u64);
                // One period, both ends included, in steps of 1 us; calls
                // of a tenth of the burst.
                let weight = (burst / 10).max(1);
                for us in 0..=1_000 {
                    let now = base + us * 1_000;
                    while let Ok(next) = gcra(tat, &p, now, weight) {
                        tat = next;
                        granted += u64::from(weight);
                    }
                }
                let most = u64::from(limit) + u64::from(burst);
                assert!(
                    granted <= most,
                    "{limit}/ms burst {burst}: {granted} > {most}"
                );
                // Slower than asked by less than one nanosecond per call,
                // when the burst lasts a step.
                if u64::from(burst) * p.interval_ns >= 1_000 {
                    let least = 1_000_000 / p.interval_ns - u64::from(weight);
                    assert!(granted >= least, "{limit}/ms: {granted} < {least}");
                }
            }
        }
    }

    /// The window index is kept whole: a stored window is never taken for
    /// a later one (nor for the caller's), however long the limiter was
    /// idle, whatever the limit and the period.
    #[test]
    fn fixed_window_is_fresh_after_any_idle_time() {
        for (limit, period) in [
            (u32::MAX, MS),
            (u32::MAX, SEC),
            (1 << 31, MS),
            (3, 100 * MS),
            (1, 1),
            (1 << 20, 1),
        ] {
            let p = params(RateLimiter::fixed_window(
                limit,
                Duration::from_nanos(period),
            ));
            for base in [0, 1_000_000 * SEC] {
                // The whole window taken at `base`.
                let full = fixed_window(Window::default(), &p, base, limit).unwrap();
                assert!(fixed_window(full, &p, base, 1).is_err());
                for bits in 0..64 {
                    for windows in [(1u64 << bits) - 1, 1 << bits, (1 << bits) + 1] {
                        let Some(now) = windows
                            .checked_mul(period)
                            .and_then(|idle| idle.checked_add(base - base % period))
                            .filter(|&now| now / period > base / period)
                        else {
                            continue;
                        };
                        let at = format!("{limit} per {period} ns, {windows} windows after {base}");
                        assert!(fixed_window_is_idle(full, &p, now), "{at}");
                        assert_eq!(
                            fixed_window(full, &p, now, limit).map(|w| w.count),
                            Ok(u64::from(limit)),
                            "{at}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn fixed_window_counts_late_callers_against_the_newer_window() {
        let p = params(RateLimiter::fixed_window(2, Duration::from_millis(100)));
        let mut word = Window::default();
        assert_eq!(run(&mut word, 2, |s| fixed_window(s, &p, 150 * MS, 1)), 2);
        // A caller whose clock read is older must not reset the window.
        assert_eq!(
            fixed_window(word, &p, 50 * MS, 1),
            Err(Duration::from_millis(150))
        );
        assert!(!fixed_window_is_idle(word, &p, 50 * MS));
    }

    #[test]
    fn reservations_queue_behind_each_other_within_the_lead() {
        // One per 250 ms, callers at 250 ms with a lead of 250 ms: the
        // issue's three calls.
        let (now, lead) = (250 * MS, 250 * MS);
        let p = params(RateLimiter::gcra(1, Duration::from_millis(250)).max_wait(Duration::MAX));
        assert!(p.reserves);
        let first = gcra_reserve(0, &p, now, lead, 1).unwrap();
        assert_eq!(first.at, now);
        let second = gcra_reserve(first.next, &p, now, lead, 1).unwrap();
        assert_eq!(second.at, 500 * MS);
        assert_eq!(
            gcra_reserve(second.next, &p, now, lead, 1),
            Err(Duration::from_millis(500))
        );
        // Given back while it is the newest, and only then.
        assert_eq!(
            gcra_give_back(second.next, &p, 500 * MS, 1),
            Some(first.next)
        );
        assert_eq!(gcra_give_back(second.next, &p, now, 1), None);

        let p = params(RateLimiter::fixed_window(1, Duration::from_millis(250)));
        let first = fixed_window_reserve(Window::default(), &p, now, lead, 1).unwrap();
        assert_eq!(first.at, now);
        let second = fixed_window_reserve(first.next, &p, now, lead, 1).unwrap();
        assert_eq!(second.at, 500 * MS);
        assert_eq!(
            fixed_window_reserve(second.next, &p, now, lead, 1),
            Err(Duration::from_millis(500))
        );
        // Windows up to the reserved one count as full; its own is not once
        // given back.
        assert!(!fixed_window_is_idle(second.next, &p, now));
        let back = fixed_window_give_back(second.next, &p, 500 * MS, 1).unwrap();
        assert_eq!(fixed_window_give_back(second.next, &p, now, 1), None);
        assert!(!fixed_window_is_idle(back, &p, now));
        assert_eq!(
            fixed_window_reserve(back, &p, now, lead, 1).map(|g| g.at),
            Ok(500 * MS)
        );
        assert!(fixed_window_is_idle(back, &p, 500 * MS));

        let p = params(RateLimiter::sliding_window(1, Duration::from_millis(250)));
        assert_eq!(sliding_window_reserve(None, None, &p, now, lead), Ok(now));
        let second = sliding_window_reserve(Some(now), Some(now), &p, now, lead);
        assert_eq!(second, Ok(500 * MS));
        assert_eq!(
            sliding_window_reserve(Some(500 * MS), Some(500 * MS), &p, now, lead),
            Err(Duration::from_millis(500))
        );
        // No lead, no reservation: the plain rules.
        assert_eq!(
            sliding_window_reserve(Some(now), Some(now), &p, now, 0),
            Err(Duration::from_millis(250))
        );
        // Never past the end of the clock.
        assert!(
            sliding_window_reserve(Some(u64::MAX - 1), None, &p, u64::MAX - 2, u64::MAX).is_err()
        );
        let p = params(RateLimiter::fixed_window(1, Duration::from_secs(1)));
        let full = fixed_window(Window::default(), &p, u64::MAX - 1, 1).unwrap();
        assert!(fixed_window_reserve(full, &p, u64::MAX - 1, u64::MAX, 1).is_err());
    }

    #[test]
    fn sliding_window_admits_when_the_admission_limit_back_is_a_period_old() {
        let p = params(RateLimiter::sliding_window(3, Duration::from_millis(100)));
        for base in [0, 1_000_000 * SEC] {
            assert_eq!(sliding_window(None, &p, base), Ok(()));
            assert_eq!(
                sliding_window(Some(base), &p, base + 50 * MS),
                Err(Duration::from_millis(50))
            );
            assert_eq!(
                sliding_window(Some(base), &p, base + 100 * MS - 1),
                Err(Duration::from_nanos(1))
            );
            assert_eq!(sliding_window(Some(base), &p, base + 100 * MS), Ok(()));
            assert!(!sliding_window_is_idle(Some(base), &p, base + 99 * MS));
            assert!(sliding_window_is_idle(Some(base), &p, base + 100 * MS));
            assert!(sliding_window_is_idle(None, &p, base));
        }
        // An entry newer than the caller's clock: wait until it is a period
        // old, however far.
        assert_eq!(
            sliding_window(Some(200 * MS), &p, 50 * MS),
            Err(Duration::from_millis(250))
        );
        assert_eq!(sliding_window_entry(Some(200), 50), 200);
        assert_eq!(sliding_window_entry(None, 50), 50);
        // No overflow at the end of the clock.
        assert!(sliding_window(Some(u64::MAX), &p, u64::MAX).is_err());
        assert!(sliding_window(Some(u64::MAX - 1), &p, 0).is_err());
    }
}
