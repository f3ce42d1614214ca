//! Lock-free rate limiter state used by the memory store.
//!
//! - GCRA: one `AtomicU64` holding the theoretical arrival time (TAT) of the
//!   next call, in nanoseconds on the pipeline clock. With the emission
//!   interval `T = period / limit` and the tolerance `tau = T * (burst - 1)`,
//!   a call at `now` conforms when `TAT <= now + tau`; it then moves the TAT
//!   to `max(TAT, now) + T`. A refused call is told to retry after exactly
//!   `TAT - tau - now`. One load and one compare-and-swap per admission.
//! - Fixed window: one `AtomicU64` of `[window index | count]`, the count
//!   using just the bits `limit` needs; the window of a call is
//!   `floor(now / period)`.
//! - Sliding window: an exact sliding log of the admission times still
//!   inside the period (at most `limit` of them) behind a small mutex; a
//!   call is admitted when fewer than `limit` admissions happened in
//!   `(now - period, now]`, i.e. when the oldest of the last `limit`
//!   admissions is at least `period` old. The log grows with use, up to
//!   `limit` entries, rather than being allocated in full up front.
//!
//! Times going backwards never panic: differences saturate, and a call that
//! arrives with an older `now` than the state was written with is counted
//! against the newer state (never admitting more than the limit).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::{RateAlgorithm, RateLimiter};
use crate::clock::duration_nanos;

/// A rate limiter configuration, prepared for the state machine.
#[derive(Debug, Clone)]
pub(crate) struct RateParams {
    algorithm: RateAlgorithm,
    limit: u32,
    period_ns: u64,
    /// GCRA emission interval.
    interval_ns: u64,
    /// GCRA tolerance: `interval * (burst - 1)`.
    tolerance_ns: u64,
    /// Fixed window: bits of the count field.
    count_bits: u32,
}

impl RateParams {
    pub(crate) fn new(spec: &RateLimiter) -> Self {
        let limit = spec.limit.max(1);
        let period_ns = duration_nanos(spec.period).max(1);
        let interval_ns = duration_nanos(spec.emission_interval()).max(1);
        RateParams {
            algorithm: spec.algorithm,
            limit,
            period_ns,
            interval_ns,
            tolerance_ns: interval_ns.saturating_mul(u64::from(spec.burst.max(1) - 1)),
            count_bits: u32::BITS - limit.leading_zeros(),
        }
    }

    fn count_mask(&self) -> u64 {
        (1u64 << self.count_bits) - 1
    }

    fn index_mask(&self) -> u64 {
        u64::MAX >> self.count_bits
    }
}

/// The state of one rate limiter.
#[derive(Debug)]
pub(crate) enum RateState {
    /// No rate limiter configured.
    Off,
    /// GCRA: the theoretical arrival time.
    Gcra(AtomicU64),
    /// Fixed window: `[window index | count]`.
    Fixed(AtomicU64),
    /// Sliding window: the admission times still inside the period.
    Sliding(Box<Mutex<VecDeque<u64>>>),
}

impl RateState {
    /// Fresh state for `params` (`None`: no limiter).
    pub(crate) fn new(params: Option<&RateParams>) -> Self {
        match params.map(|p| p.algorithm) {
            None => RateState::Off,
            Some(RateAlgorithm::FixedWindow) => RateState::Fixed(AtomicU64::new(0)),
            Some(RateAlgorithm::SlidingWindow) => {
                RateState::Sliding(Box::new(Mutex::new(VecDeque::new())))
            }
            Some(_) => RateState::Gcra(AtomicU64::new(0)),
        }
    }

    /// Like [`new`](Self::new), with room for `capacity` sliding-log entries
    /// reserved up front (at most `limit`).
    pub(crate) fn with_capacity(params: Option<&RateParams>, capacity: usize) -> Self {
        let state = Self::new(params);
        if let (RateState::Sliding(log), Some(p)) = (&state, params) {
            lock(log).reserve(capacity.min(p.limit as usize));
        }
        state
    }

    /// Takes one permit at `now_ns`, or tells how long until one is free.
    #[inline]
    pub(crate) fn acquire(&self, params: &RateParams, now_ns: u64) -> Result<(), Duration> {
        match self {
            RateState::Off => Ok(()),
            RateState::Gcra(tat) => gcra(tat, params, now_ns),
            RateState::Fixed(word) => fixed(word, params, now_ns),
            RateState::Sliding(log) => sliding(&mut lock(log), params, now_ns),
        }
    }

    /// `true` when the state is equivalent to fresh state at `now_ns`, so
    /// that dropping it changes no future decision.
    pub(crate) fn is_idle(&self, params: Option<&RateParams>, now_ns: u64) -> bool {
        let Some(p) = params else { return true };
        match self {
            RateState::Off => true,
            RateState::Gcra(tat) => tat.load(Ordering::Acquire) <= now_ns,
            RateState::Fixed(word) => {
                let bits = word.load(Ordering::Acquire);
                let (tag, index) = (bits >> p.count_bits, now_ns / p.period_ns);
                let current = tag == index & p.index_mask() || is_ahead(tag, index, p);
                bits & p.count_mask() == 0 || !current
            }
            RateState::Sliding(log) => lock(log)
                .back()
                .is_none_or(|&t| now_ns.saturating_sub(t) >= p.period_ns),
        }
    }
}

fn lock(log: &Mutex<VecDeque<u64>>) -> std::sync::MutexGuard<'_, VecDeque<u64>> {
    // The log is consistent after every push and pop: a panic elsewhere
    // while it was held leaves nothing half-written.
    log.lock().unwrap_or_else(|e| e.into_inner())
}

#[inline]
fn gcra(tat: &AtomicU64, p: &RateParams, now: u64) -> Result<(), Duration> {
    let mut current = tat.load(Ordering::Acquire);
    loop {
        let start = current.max(now);
        let ahead = start - now;
        if ahead > p.tolerance_ns {
            return Err(Duration::from_nanos(ahead - p.tolerance_ns));
        }
        let next = start.saturating_add(p.interval_ns);
        match tat.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Ok(()),
            Err(actual) => current = actual,
        }
    }
}

/// `true` when the stored window tag is ahead of window `index` (the caller's
/// `now` is older than the state's).
fn is_ahead(tag: u64, index: u64, p: &RateParams) -> bool {
    let mask = p.index_mask();
    let diff = tag.wrapping_sub(index & mask) & mask;
    diff != 0 && diff <= mask / 2
}

fn fixed(word: &AtomicU64, p: &RateParams, now: u64) -> Result<(), Duration> {
    let index = now / p.period_ns;
    let mask = p.index_mask();
    let mut current = word.load(Ordering::Acquire);
    loop {
        let (tag, count) = (current >> p.count_bits, current & p.count_mask());
        let (window, count) = if tag == index & mask {
            (index, count)
        } else if is_ahead(tag, index, p) {
            (
                index.saturating_add(tag.wrapping_sub(index & mask) & mask),
                count,
            )
        } else {
            (index, 0)
        };
        if count >= u64::from(p.limit) {
            let next_window = window.saturating_add(1).saturating_mul(p.period_ns);
            return Err(Duration::from_nanos(next_window.saturating_sub(now)));
        }
        let next = ((window & mask) << p.count_bits) | (count + 1);
        match word.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Ok(()),
            Err(actual) => current = actual,
        }
    }
}

fn sliding(log: &mut VecDeque<u64>, p: &RateParams, now: u64) -> Result<(), Duration> {
    while log
        .front()
        .is_some_and(|&t| now.saturating_sub(t) >= p.period_ns)
    {
        log.pop_front();
    }
    if log.len() < p.limit as usize {
        // Keep the log sorted even if callers' clocks disagree slightly: an
        // entry never moves earlier than the newest one (stricter, never
        // looser).
        let at = log.back().map_or(now, |&last| last.max(now));
        log.push_back(at);
        Ok(())
    } else {
        let oldest = log.front().copied().unwrap_or(now);
        Err(Duration::from_nanos(
            oldest.saturating_add(p.period_ns).saturating_sub(now),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn setup(spec: RateLimiter) -> (RateParams, RateState) {
        let p = RateParams::new(&spec);
        let s = RateState::new(Some(&p));
        (p, s)
    }

    fn admitted(p: &RateParams, s: &RateState, now: u64, tries: u32) -> u32 {
        (0..tries).filter(|_| s.acquire(p, now).is_ok()).count() as u32
    }

    #[test]
    fn gcra_admits_the_burst_then_one_per_interval() {
        // 10 per second (T = 100 ms), burst 3.
        let (p, s) = setup(RateLimiter::gcra(10, Duration::from_secs(1)).burst(3));
        assert_eq!(admitted(&p, &s, 0, 10), 3);
        assert_eq!(s.acquire(&p, 0), Err(Duration::from_millis(100)));
        assert_eq!(s.acquire(&p, 99 * MS), Err(Duration::from_millis(1)));
        assert_eq!(admitted(&p, &s, 100 * MS, 10), 1);
        assert_eq!(s.acquire(&p, 150 * MS), Err(Duration::from_millis(50)));
        // After a long pause the full burst is back, never more.
        assert_eq!(admitted(&p, &s, 10_000 * MS, 10), 3);
        assert!(!s.is_idle(Some(&p), 10_000 * MS));
        assert!(s.is_idle(Some(&p), 10_300 * MS));
    }

    #[test]
    fn gcra_burst_of_one_is_strictly_spaced() {
        let (p, s) = setup(RateLimiter::gcra(4, Duration::from_secs(1)).burst(1));
        assert_eq!(admitted(&p, &s, 0, 5), 1);
        assert_eq!(s.acquire(&p, 249 * MS), Err(Duration::from_millis(1)));
        assert_eq!(admitted(&p, &s, 250 * MS, 5), 1);
    }

    #[test]
    fn fixed_window_counts_exactly_at_the_edges() {
        let (p, s) = setup(RateLimiter::fixed_window(3, Duration::from_millis(100)));
        assert_eq!(admitted(&p, &s, 0, 5), 3);
        assert_eq!(s.acquire(&p, 99 * MS), Err(Duration::from_millis(1)));
        assert_eq!(s.acquire(&p, 100 * MS - 1), Err(Duration::from_nanos(1)));
        // The next window starts exactly at 100 ms.
        assert_eq!(admitted(&p, &s, 100 * MS, 5), 3);
        assert_eq!(admitted(&p, &s, 199 * MS, 5), 0);
        assert!(!s.is_idle(Some(&p), 150 * MS));
        assert!(s.is_idle(Some(&p), 200 * MS));
    }

    #[test]
    fn fixed_window_with_limit_one_and_the_largest_limit() {
        let (p, s) = setup(RateLimiter::fixed_window(1, Duration::from_secs(1)));
        assert_eq!(admitted(&p, &s, 5 * 1_000 * MS, 3), 1);
        let (p, s) = setup(RateLimiter::fixed_window(u32::MAX, Duration::from_secs(1)));
        assert_eq!(admitted(&p, &s, 0, 1000), 1000);
    }

    #[test]
    fn fixed_window_counts_late_callers_against_the_newer_window() {
        let (p, s) = setup(RateLimiter::fixed_window(2, Duration::from_millis(100)));
        assert_eq!(admitted(&p, &s, 150 * MS, 2), 2);
        // A caller whose clock read is older must not reset the window.
        assert_eq!(s.acquire(&p, 50 * MS), Err(Duration::from_millis(150)));
    }

    #[test]
    fn sliding_window_is_an_exact_log() {
        let (p, s) = setup(RateLimiter::sliding_window(3, Duration::from_millis(100)));
        assert!(s.acquire(&p, 0).is_ok());
        assert!(s.acquire(&p, 10 * MS).is_ok());
        assert!(s.acquire(&p, 20 * MS).is_ok());
        assert_eq!(s.acquire(&p, 50 * MS), Err(Duration::from_millis(50)));
        assert_eq!(s.acquire(&p, 100 * MS - 1), Err(Duration::from_nanos(1)));
        // At 100 ms the first admission is exactly `period` old.
        assert!(s.acquire(&p, 100 * MS).is_ok());
        assert_eq!(s.acquire(&p, 100 * MS), Err(Duration::from_millis(10)));
        assert!(s.acquire(&p, 110 * MS).is_ok());
        assert!(!s.is_idle(Some(&p), 150 * MS));
        assert!(s.is_idle(Some(&p), 210 * MS));
    }

    #[test]
    fn sliding_window_never_moves_entries_earlier() {
        let (p, s) = setup(RateLimiter::sliding_window(2, Duration::from_millis(100)));
        assert!(s.acquire(&p, 50 * MS).is_ok());
        assert!(s.acquire(&p, 10 * MS).is_ok(), "an older clock read");
        // Both count until 150 ms.
        assert_eq!(s.acquire(&p, 120 * MS), Err(Duration::from_millis(30)));
    }

    #[test]
    fn limits_hold_under_contention() {
        for spec in [
            RateLimiter::gcra(50, Duration::from_secs(1)),
            RateLimiter::fixed_window(50, Duration::from_secs(1)),
            RateLimiter::sliding_window(50, Duration::from_secs(1)),
        ] {
            let (p, s) = setup(spec);
            let total = std::sync::atomic::AtomicU32::new(0);
            std::thread::scope(|scope| {
                for _ in 0..4 {
                    scope.spawn(|| {
                        total.fetch_add(admitted(&p, &s, 7 * MS, 40), Ordering::Relaxed);
                    });
                }
            });
            assert_eq!(total.load(Ordering::Relaxed), 50);
        }
    }
}
