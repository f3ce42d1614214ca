//! Reference models of the rate limiters: GCRA, fixed window, exact
//! sliding window.
//!
//! # Rules
//! Each limiter answers one question at `now`: may one more call pass?
//! `Ok` takes a permit; `Err(retry_after)` takes nothing and tells how long
//! until a permit would be free if nothing else happened.
//!
//! - **GCRA** (generic cell rate algorithm), with the emission interval
//!   `T = period / limit` (truncated to the nanosecond) and the tolerance
//!   `tau = T * (burst - 1)`, keeps the theoretical arrival time `tat` of
//!   the next call (zero at first). A call at `now` conforms when
//!   `max(tat, now) - now <= tau`, and then moves `tat` to
//!   `max(tat, now) + T`; otherwise it is told to retry after
//!   `max(tat, now) - now - tau`. Up to `burst` calls pass at once, then one
//!   every `T`. A call whose new `tat` would fall past [`END`] is refused
//!   (retry after `T`): at the end of the range the limiter errs on the safe
//!   side rather than let every call through.
//! - **Fixed window**: the window of a call is `floor(now / period)`; at
//!   most `limit` calls pass per window; a refused call retries at the start
//!   of the next window, `(window + 1) * period - now`. A call whose `now`
//!   falls in a window earlier than the last one counted is counted against
//!   the last one (never more than `limit` per window).
//! - **Sliding window**: an exact log of the admission times. A call at
//!   `now` passes when fewer than `limit` admissions happened in
//!   `(now - period, now]`, i.e. an admission at `t` counts while
//!   `now - t < period`; a refused call retries when the oldest one counted
//!   stops counting, `oldest + period - now` (zero at the last instant of
//!   the range, when that is past it). An admission is logged at `now`, or
//!   at the newest logged time if that is later (a clock read older than
//!   the log never counts for less).
//!
//! Instants past [`END`] are [`END`], as everywhere in the models.
//!
//! The wait for a permit (`max_wait`) is the pipeline's decision, not the
//! store's: it is not part of this model.

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
        match self {
            RateLimit::Gcra(g) => g.acquire(now),
            RateLimit::FixedWindow(f) => f.acquire(now),
            RateLimit::SlidingWindow(s) => s.acquire(now),
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
        let interval = spec.emission_interval();
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

    /// Takes a permit at `now`, or tells how long until one is free.
    pub fn acquire(&mut self, now: Duration) -> Result<(), Duration> {
        let now = instant(now);
        let start = self.tat.max(now);
        let ahead = start - now;
        if ahead > self.tolerance {
            return Err(ahead - self.tolerance);
        }
        match start.checked_add(self.interval).filter(|&t| t <= END) {
            Some(tat) => {
                self.tat = tat;
                Ok(())
            }
            None => Err(self.interval),
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

    /// Takes a permit at `now`, or tells how long until one is free.
    pub fn acquire(&mut self, now: Duration) -> Result<(), Duration> {
        let now = instant(now);
        let window = now.as_nanos() / self.period.as_nanos();
        if window > self.window {
            self.window = window;
            self.count = 0;
        }
        if self.count >= self.limit {
            let next = (self.window + 1) * self.period.as_nanos();
            let next = next.min(END.as_nanos());
            let left = u64::try_from(next - now.as_nanos()).unwrap_or(u64::MAX);
            return Err(Duration::from_nanos(left));
        }
        self.count += 1;
        Ok(())
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

    /// Takes a permit at `now`, or tells how long until one is free.
    pub fn acquire(&mut self, now: Duration) -> Result<(), Duration> {
        let now = instant(now);
        // An admission at `t` counts while `now - t < period`.
        while self
            .log
            .front()
            .is_some_and(|&t| now.saturating_sub(t) >= self.period)
        {
            self.log.pop_front();
        }
        if self.log.len() < self.limit as usize {
            let at = self.log.back().map_or(now, |&newest| newest.max(now));
            self.log.push_back(at);
            return Ok(());
        }
        let oldest = self.log.front().copied().unwrap_or(now);
        Err(later(oldest, self.period).saturating_sub(now))
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
