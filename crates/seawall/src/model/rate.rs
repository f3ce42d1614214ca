//! Reference models of the rate limiters: GCRA, fixed window, exact
//! sliding window.
//!
//! # Rules
//! Each limiter answers one question at `now`: may one more call pass?
//! `Ok` takes a permit; `Err(retry_after)` takes nothing and tells how long
//! until a permit would be free if nothing else happened.
//!
//! - **GCRA** (generic cell rate algorithm), with the emission interval
//!   `T = period / limit` (rounded up to the nanosecond: never faster than
//!   the limit, whatever the rate) and the tolerance
//!   `tau = T * (burst - 1)`, keeps the theoretical arrival time `tat` of
//!   the next call (zero at first). A call at `now` conforms when
//!   `max(tat, now) - now <= tau`, and then moves `tat` to
//!   `max(tat, now) + T`; otherwise it is told to retry after
//!   `max(tat, now) - now - tau`. Up to `burst` calls pass at once, then one
//!   every `T`. A call whose new `tat` would fall past [`END`] is refused
//!   (retry after `T`): at the end of the range the limiter errs on the safe
//!   side rather than let every call through.
//! - **Fixed window**: the window of a call is `floor(now / period)`; at
//!   most `limit` calls pass per window. The state is the last window with
//!   a permit taken and its count; every window from the call's up to that
//!   one counts as full. The next free permit is in the last window if it
//!   is not full, else in the one after; a call in that window passes, any
//!   other is refused and retries when that window starts (a call whose
//!   `now` falls in a window earlier than the last one counted waits for
//!   it: never more than `limit` per window).
//! - **Sliding window**: an exact log of the admission times (reserved
//!   ones included). A call at `now` passes when fewer than `limit`
//!   entries are logged after `now - period`, i.e. an entry at `t` counts
//!   while `now - t < period`; a refused call retries when the entry
//!   `limit` places back stops counting, `that + period - now` (zero at the
//!   last instant of the range, when that is past it). An admission is
//!   logged at `now`, or at the newest logged time if that is later (a
//!   clock read older than the log never counts for less).
//!
//! Instants past [`END`] are [`END`], as everywhere in the models.
//!
//! # Reservations
//! A call that may wait for its permit (`max_wait`) asks with a lead
//! `within` ([`RateLimit::reserve`]): when it is refused and the next free
//! permit is at most `within` away (and not past [`END`]), that permit is
//! taken for its instant, which is returned: GCRA moves `tat` as for an
//! admission, the permit being for `max(tat, now) - tau`; the fixed window
//! counts it in its window, the permit being for the window's start; the
//! sliding window logs it at the instant its entry `limit` places back
//! stops counting (or at the newest logged time if that is later). A call
//! admitted at once gets `now`.
//!
//! A reservation given back ([`RateLimit::give_back`]) returns its permit
//! where the state can tell it apart: GCRA while `tat` is still the one it
//! set (no call came after it; `tat` moves back by `T`); the fixed window
//! while its window is still the last one counted (the count goes down by
//! one; a window left with none is kept as the one before it, full, which
//! counts alike, so that the reservation before it can be given back in
//! its turn); the sliding window takes one entry at its instant out of the
//! log.
//! Otherwise it stays spent: stricter, never looser.
//!
//! # Weights
//! A call of weight `n` takes `n` permits at once, all or none
//! ([`RateLimit::reserve_weighted`]); weight 1 is the rules above. GCRA:
//! the call conforms when `max(tat, now) + (n - 1) * T - now <= tau` and
//! moves `tat` by `n * T` (a refused one retries after
//! `max(tat, now) + (n - 1) * T - now - tau`). Fixed window: the next `n`
//! free permits are in the last window if `count + n <= limit`, else in
//! the one after. Sliding window: `n` entries are logged, and the entry
//! judged is the one `limit - n + 1` places back. A weight that never fits
//! (0, more than `burst` for GCRA, more than `limit` for the windows) is
//! refused with no wait at all (`Err(None)`); a reservation given back
//! returns its `n` permits under the same conditions as above.
//!
//! How long a call may wait (`max_wait`, its deadline) is the pipeline's
//! decision; the model only takes the lead it is given.

use std::collections::VecDeque;
use std::time::Duration;

use super::{instant, later, END};
use crate::rate_limit::{RateAlgorithm, RateLimiter};

/// The state of one rate limiter, of any algorithm.
///
/// ```
/// use std::time::Duration;
/// use seawall::model::rate::RateLimit;
/// use seawall::RateLimiter;
///
/// let ms = Duration::from_millis;
/// let mut r = RateLimit::new(&RateLimiter::fixed_window(2, ms(100)));
/// assert!(r.acquire(ms(10)).is_ok());
/// assert!(r.acquire(ms(20)).is_ok());
/// assert_eq!(r.acquire(ms(30)), Err(ms(70)));
/// assert!(r.acquire(ms(100)).is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RateLimit {
    /// GCRA.
    Gcra(Gcra),
    /// Fixed window.
    FixedWindow(FixedWindow),
    /// Exact sliding window.
    SlidingWindow(SlidingWindow),
}

impl RateLimit {
    /// The model of `spec`, with fresh state.
    ///
    /// # Panics
    /// For an algorithm this model does not know.
    pub fn new(spec: &RateLimiter) -> Self {
        match spec.algorithm {
            RateAlgorithm::Gcra => RateLimit::Gcra(Gcra::new(spec)),
            RateAlgorithm::FixedWindow => RateLimit::FixedWindow(FixedWindow::new(spec)),
            RateAlgorithm::SlidingWindow => RateLimit::SlidingWindow(SlidingWindow::new(spec)),
            #[allow(unreachable_patterns)]
            other => panic!("no model of the rate algorithm {other:?}"),
        }
    }

    /// Takes a permit at `now`, or tells how long until one is free.
    pub fn acquire(&mut self, now: Duration) -> Result<(), Duration> {
        self.reserve(now, Duration::ZERO).map(|_| ())
    }

    /// Takes a permit at `now`, or reserves the next one when it is at most
    /// `within` away: the instant of the permit (`now`: admitted at once),
    /// or how long until one is free.
    ///
    /// ```
    /// use std::time::Duration;
    /// use seawall::model::rate::RateLimit;
    /// use seawall::RateLimiter;
    ///
    /// let ms = Duration::from_millis;
    /// let mut r = RateLimit::new(&RateLimiter::fixed_window(1, ms(250)));
    /// assert_eq!(r.reserve(ms(250), ms(250)), Ok(ms(250)));
    /// assert_eq!(r.reserve(ms(250), ms(250)), Ok(ms(500)));
    /// assert_eq!(r.reserve(ms(250), ms(250)), Err(ms(500)));
    /// r.give_back(ms(500));
    /// assert_eq!(r.reserve(ms(300), ms(250)), Ok(ms(500)));
    /// ```
    pub fn reserve(&mut self, now: Duration, within: Duration) -> Result<Duration, Duration> {
        // Weight 1 always fits (burst and limit are at least 1).
        self.reserve_weighted(now, within, 1)
            .map_err(|wait| wait.unwrap_or(END))
    }

    /// [`reserve`](Self::reserve) for a call of weight `n`: takes (or
    /// reserves) `n` permits at once, all or none. `Err(Some(wait))`: how
    /// long until they are free; `Err(None)`: the weight never fits (see
    /// the [module docs](self)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use seawall::model::rate::RateLimit;
    /// use seawall::RateLimiter;
    ///
    /// let ms = Duration::from_millis;
    /// let mut r = RateLimit::new(&RateLimiter::gcra(10, ms(1000)));
    /// assert_eq!(r.reserve_weighted(ms(0), ms(0), 4), Ok(ms(0)));
    /// assert_eq!(r.reserve_weighted(ms(0), ms(0), 4), Ok(ms(0)));
    /// assert_eq!(r.reserve_weighted(ms(0), ms(0), 4), Err(Some(ms(200))));
    /// assert_eq!(r.reserve_weighted(ms(0), ms(0), 11), Err(None));
    /// ```
    pub fn reserve_weighted(
        &mut self,
        now: Duration,
        within: Duration,
        n: u32,
    ) -> Result<Duration, Option<Duration>> {
        match self {
            RateLimit::Gcra(g) => g.reserve(now, within, n),
            RateLimit::FixedWindow(f) => f.reserve(now, within, n),
            RateLimit::SlidingWindow(s) => s.reserve(now, within, n),
        }
    }

    /// `true` when a call of weight `n` can ever pass: `1 <= n <= burst`
    /// for GCRA, `1 <= n <= limit` for the windows.
    pub fn fits(&self, n: u32) -> bool {
        match self {
            RateLimit::Gcra(g) => {
                n >= 1 && g.interval.as_nanos() * u128::from(n - 1) <= g.tolerance.as_nanos()
            }
            RateLimit::FixedWindow(FixedWindow { limit, .. })
            | RateLimit::SlidingWindow(SlidingWindow { limit, .. }) => n >= 1 && n <= *limit,
        }
    }

    /// Gives back the permit reserved for instant `at`, where the state can
    /// tell it apart (see the [module docs](self)).
    pub fn give_back(&mut self, at: Duration) {
        self.give_back_weighted(at, 1);
    }

    /// Gives back the `n` permits reserved for instant `at` by a call of
    /// weight `n`, where the state can tell them apart.
    pub fn give_back_weighted(&mut self, at: Duration, n: u32) {
        match self {
            RateLimit::Gcra(g) => g.give_back(at, n),
            RateLimit::FixedWindow(f) => f.give_back(at, n),
            RateLimit::SlidingWindow(s) => s.give_back(at, n),
        }
    }
}

/// GCRA: the theoretical arrival time of the next call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gcra {
    interval: Duration,
    tolerance: Duration,
    tat: Duration,
}

impl Gcra {
    /// Fresh state for `spec` (its algorithm is not checked).
    pub fn new(spec: &RateLimiter) -> Self {
        let nanos = spec
            .period
            .as_nanos()
            .div_ceil(u128::from(spec.limit.max(1)));
        let interval = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        let tolerance = interval.as_nanos() * u128::from(spec.burst.saturating_sub(1));
        Gcra {
            interval,
            tolerance: Duration::from_nanos(u64::try_from(tolerance).unwrap_or(u64::MAX)),
            tat: Duration::ZERO,
        }
    }

    /// The theoretical arrival time of the next call.
    pub fn tat(&self) -> Duration {
        self.tat
    }

    /// Takes `n` permits at `now`, or reserves them when they are at most
    /// `within` away (see [`RateLimit::reserve_weighted`]).
    pub fn reserve(
        &mut self,
        now: Duration,
        within: Duration,
        n: u32,
    ) -> Result<Duration, Option<Duration>> {
        let now = instant(now);
        let extra = self.interval.as_nanos() * u128::from(n.max(1) - 1);
        if n == 0 || extra > self.tolerance.as_nanos() {
            return Err(None);
        }
        let extra = Duration::from_nanos(extra as u64);
        let start = self.tat.max(now);
        let wait = (start + extra - now).saturating_sub(self.tolerance);
        if wait > within {
            return Err(Some(wait));
        }
        match (start + extra)
            .checked_add(self.interval)
            .filter(|&t| t <= END)
        {
            Some(tat) => {
                self.tat = tat;
                Ok(now + wait)
            }
            None => Err(Some(self.interval)),
        }
    }

    /// Gives back the `n` permits reserved for `at` while no call came
    /// after them.
    pub fn give_back(&mut self, at: Duration, n: u32) {
        if at + self.tolerance + self.interval == self.tat {
            self.tat = self.tat.saturating_sub(self.interval * n);
        }
    }
}

/// Fixed window: the last window counted and its count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixedWindow {
    limit: u32,
    period: Duration,
    window: u128,
    count: u32,
}

impl FixedWindow {
    /// Fresh state for `spec` (its algorithm is not checked).
    pub fn new(spec: &RateLimiter) -> Self {
        FixedWindow {
            limit: spec.limit,
            period: spec.period,
            window: 0,
            count: 0,
        }
    }

    /// Takes `n` permits at `now`, or reserves them when they are at most
    /// `within` away (see [`RateLimit::reserve_weighted`]).
    pub fn reserve(
        &mut self,
        now: Duration,
        within: Duration,
        n: u32,
    ) -> Result<Duration, Option<Duration>> {
        if n == 0 || n > self.limit {
            return Err(None);
        }
        let now = instant(now);
        let period = self.period.as_nanos();
        let current = now.as_nanos() / period;
        let (mut window, mut count) = (self.window, self.count);
        if current > window {
            (window, count) = (current, 0);
        }
        if u64::from(count) + u64::from(n) > u64::from(self.limit) {
            (window, count) = (window + 1, 0);
        }
        let start = window * period;
        let at = if window == current {
            now
        } else if start <= END.as_nanos() && start - now.as_nanos() <= within.as_nanos() {
            Duration::from_nanos(start as u64)
        } else {
            let left = start.min(END.as_nanos()) - now.as_nanos();
            return Err(Some(Duration::from_nanos(left as u64)));
        };
        (self.window, self.count) = (window, count + n);
        Ok(at)
    }

    /// Gives back the `n` permits reserved for `at` (the start of their
    /// window) while their window is the last one counted. A window left
    /// with none is kept as the window before it, full (the same state for
    /// every call), so that the reservation before it can be given back in
    /// its turn.
    pub fn give_back(&mut self, at: Duration, n: u32) {
        if at.as_nanos() / self.period.as_nanos() == self.window && self.count >= n && n > 0 {
            self.count -= n;
            if self.count == 0 && self.window > 0 {
                (self.window, self.count) = (self.window - 1, self.limit);
            }
        }
    }
}

/// Exact sliding window: the times of the admissions still counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlidingWindow {
    limit: u32,
    period: Duration,
    log: VecDeque<Duration>,
}

impl SlidingWindow {
    /// Fresh state for `spec` (its algorithm is not checked).
    pub fn new(spec: &RateLimiter) -> Self {
        SlidingWindow {
            limit: spec.limit,
            period: spec.period,
            log: VecDeque::new(),
        }
    }

    /// Takes `n` permits at `now`, or reserves them when they are at most
    /// `within` away (see [`RateLimit::reserve_weighted`]).
    pub fn reserve(
        &mut self,
        now: Duration,
        within: Duration,
        n: u32,
    ) -> Result<Duration, Option<Duration>> {
        if n == 0 || n > self.limit {
            return Err(None);
        }
        let now = instant(now);
        // An entry at `t` counts while `now - t < period`.
        while self
            .log
            .front()
            .is_some_and(|&t| now.saturating_sub(t) >= self.period)
        {
            self.log.pop_front();
        }
        let newest = self.log.back().copied();
        // At most `limit - n` entries may count for `n` more to pass.
        let depth = (self.limit - n + 1) as usize;
        let at = if self.log.len() < depth {
            newest.map_or(now, |last| last.max(now))
        } else {
            let oldest = self.log[self.log.len() - depth];
            match oldest.checked_add(self.period).filter(|&t| t <= END) {
                Some(free) if free.max(newest.unwrap_or(free)) - now <= within => {
                    free.max(newest.unwrap_or(free))
                }
                _ => return Err(Some(later(oldest, self.period).saturating_sub(now))),
            }
        };
        self.log.extend(std::iter::repeat_n(at, n as usize));
        Ok(at)
    }

    /// Gives back the `n` permits reserved for `at`: `n` entries at `at`
    /// leave the log.
    pub fn give_back(&mut self, at: Duration, n: u32) {
        for _ in 0..n {
            match self.log.iter().rposition(|&t| t == at) {
                Some(i) => drop(self.log.remove(i)),
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn gcra_bursts_then_spaces_calls() {
        let mut g = RateLimit::new(&RateLimiter::gcra(10, 1000 * MS).burst(3));
        for _ in 0..3 {
            assert!(g.acquire(Duration::ZERO).is_ok());
        }
        assert_eq!(g.acquire(Duration::ZERO), Err(100 * MS));
        assert_eq!(g.acquire(99 * MS), Err(MS));
        assert!(g.acquire(100 * MS).is_ok());
        assert_eq!(g.acquire(150 * MS), Err(50 * MS));
    }

    #[test]
    fn fixed_window_counts_late_calls_against_the_newer_window() {
        let mut f = RateLimit::new(&RateLimiter::fixed_window(1, 100 * MS));
        assert!(f.acquire(150 * MS).is_ok());
        assert_eq!(f.acquire(50 * MS), Err(150 * MS));
        assert!(f.acquire(200 * MS).is_ok());
    }

    #[test]
    fn sliding_window_frees_a_permit_exactly_one_period_later() {
        let mut s = RateLimit::new(&RateLimiter::sliding_window(2, 100 * MS));
        assert!(s.acquire(Duration::ZERO).is_ok());
        assert!(s.acquire(10 * MS).is_ok());
        assert_eq!(s.acquire(50 * MS), Err(50 * MS));
        assert_eq!(
            s.acquire(100 * MS - Duration::from_nanos(1)),
            Err(Duration::from_nanos(1))
        );
        assert!(s.acquire(100 * MS).is_ok());
        assert_eq!(s.acquire(100 * MS), Err(10 * MS));
    }

    #[test]
    fn reservations_queue_and_only_the_newest_comes_back_where_one_number_keeps_the_queue() {
        // GCRA, one per 100 ms: the burst at 0, then reservations.
        let mut g = RateLimit::new(&RateLimiter::gcra(1, 100 * MS));
        assert_eq!(g.reserve(Duration::ZERO, 150 * MS), Ok(Duration::ZERO));
        assert_eq!(g.reserve(Duration::ZERO, 150 * MS), Ok(100 * MS));
        assert_eq!(g.reserve(Duration::ZERO, 150 * MS), Err(200 * MS));
        assert_eq!(g.reserve(10 * MS, 200 * MS), Ok(200 * MS));
        // The one for 100 ms has a call behind it: it stays spent.
        g.give_back(100 * MS);
        assert_eq!(g.reserve(20 * MS, 300 * MS), Ok(300 * MS));
        // The newest comes back, then the one before it.
        g.give_back(300 * MS);
        g.give_back(200 * MS);
        assert_eq!(g.reserve(30 * MS, 300 * MS), Ok(200 * MS));
        // Fixed window, two per 100 ms.
        let mut f = RateLimit::new(&RateLimiter::fixed_window(2, 100 * MS));
        for _ in 0..2 {
            assert_eq!(f.reserve(50 * MS, 100 * MS), Ok(50 * MS));
        }
        for _ in 0..2 {
            assert_eq!(f.reserve(50 * MS, 100 * MS), Ok(100 * MS));
        }
        assert_eq!(f.reserve(50 * MS, 100 * MS), Err(150 * MS));
        // A call whose window is before the last one counted waits for it.
        assert_eq!(f.acquire(60 * MS), Err(140 * MS));
        f.give_back(100 * MS);
        assert_eq!(f.reserve(70 * MS, 100 * MS), Ok(100 * MS));
        // Sliding window, one per 100 ms: entries come out exactly.
        let mut s = RateLimit::new(&RateLimiter::sliding_window(1, 100 * MS));
        assert_eq!(s.reserve(10 * MS, 200 * MS), Ok(10 * MS));
        assert_eq!(s.reserve(10 * MS, 200 * MS), Ok(110 * MS));
        assert_eq!(s.reserve(10 * MS, 200 * MS), Ok(210 * MS));
        assert_eq!(s.reserve(10 * MS, 200 * MS), Err(300 * MS));
        s.give_back(110 * MS);
        assert_eq!(s.reserve(20 * MS, 300 * MS), Ok(310 * MS));
    }

    #[test]
    fn the_end_of_the_range_saturates() {
        let near = END - 5 * MS;
        let mut g = RateLimit::new(&RateLimiter::gcra(1, 1000 * MS));
        // The next arrival time would be past the end of the range: refused
        // on the safe side, until the end.
        assert_eq!(g.acquire(near), Err(1000 * MS));
        assert_eq!(g.acquire(END), Err(1000 * MS));
        let mut g = RateLimit::new(&RateLimiter::gcra(1, 1000 * MS));
        assert!(g.acquire(END - 1000 * MS).is_ok());
        assert_eq!(g.acquire(END - 1000 * MS), Err(1000 * MS));
        let mut f = RateLimit::new(&RateLimiter::fixed_window(1, 1000 * MS));
        assert!(f.acquire(near).is_ok());
        assert_eq!(f.acquire(near), Err(5 * MS));
        let mut s = RateLimit::new(&RateLimiter::sliding_window(1, 1000 * MS));
        assert!(s.acquire(near).is_ok());
        assert_eq!(s.acquire(near), Err(5 * MS));
        // At the last instant the admission still counts (it is less than
        // a period old), and the time it stops counting is past the range.
        assert_eq!(s.acquire(Duration::MAX), Err(Duration::ZERO));
    }
}
