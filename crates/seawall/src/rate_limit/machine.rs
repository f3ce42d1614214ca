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
//! - Sliding window: an exact log of admission times; a call is admitted
//!   when fewer than `limit` admissions happened in `(now - period, now]`,
//!   i.e. when the oldest of the last `limit` admissions is at least
//!   `period` old. The unpartitioned state keeps the log lock-free in a
//!   ring of `limit` slots (see [`Ring`]): one load of the slot of the
//!   admission `limit` places back, one compare-and-swap on the head, one
//!   store. A partition keeps it in a deque behind a small mutex that grows
//!   with use, up to `limit` entries, so that an idle key costs little.
//!
//! Times going backwards never panic: differences saturate, and a call that
//! arrives with an older `now` than the state was written with is counted
//! against the newer state (never admitting more than the limit).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
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
    /// Sliding window, lock-free: the last `limit` admission times.
    SlidingRing(Box<Ring>),
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

    /// Fresh state for the unpartitioned resource: like
    /// [`new`](Self::new), with a sliding window kept lock-free.
    pub(crate) fn shared(params: Option<&RateParams>) -> Self {
        match params {
            Some(p) if p.algorithm == RateAlgorithm::SlidingWindow => {
                RateState::SlidingRing(Box::new(Ring::new(p.limit)))
            }
            _ => Self::new(params),
        }
    }

    /// Takes one permit at `now_ns`, or tells how long until one is free.
    #[inline(always)]
    pub(crate) fn acquire(&self, params: &RateParams, now_ns: u64) -> Result<(), Duration> {
        match self {
            RateState::Gcra(tat) => gcra(tat, params, now_ns),
            other => other.acquire_other(params, now_ns),
        }
    }

    #[inline(never)]
    fn acquire_other(&self, params: &RateParams, now_ns: u64) -> Result<(), Duration> {
        match self {
            RateState::Off => Ok(()),
            RateState::Gcra(tat) => gcra(tat, params, now_ns),
            RateState::Fixed(word) => fixed(word, params, now_ns),
            RateState::Sliding(log) => sliding(&mut lock(log), params, now_ns),
            RateState::SlidingRing(ring) => ring.acquire(params, now_ns),
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
            RateState::SlidingRing(ring) => ring
                .newest()
                .is_none_or(|t| now_ns.saturating_sub(t) >= p.period_ns),
        }
    }
}

/// The lock-free sliding log: the times of the last `limit` admissions.
///
/// Admission number `n` (counted from 0) writes slot `n mod limit`, so the
/// slot it would write holds admission `n - limit`: the oldest of the last
/// `limit`. The call is admitted when that admission is at least `period`
/// old (or there are fewer than `limit` admissions yet); it then claims its
/// number with a compare-and-swap on `head` and writes its time into the
/// slot.
///
/// `head` packs the slot index (low 32 bits), the lap (bits 32..63) and a
/// flag set once the first lap is complete (bit 63). A slot packs the time
/// in microseconds (rounded up: stricter, never looser; low 56 bits) and a
/// tag (high 8 bits) of the lap that wrote it plus one. A claimant that
/// finds a tag other than its own lap's sees an admission that claimed its
/// number but has not written its time yet: an admission happening now,
/// counted as such. Times are kept in order: a slot is never written with
/// a time earlier than its predecessor's.
///
/// The slots are allocated in chunks of 4096, the first up front and the
/// others on first use, so that a large limit costs memory only as far as
/// it is used.
#[derive(Debug)]
pub(crate) struct Ring {
    head: AtomicU64,
    limit: u32,
    chunks: Box<[OnceLock<Box<[AtomicU64]>>]>,
}

const RING_CHUNK: u32 = 4096;
const RING_FULL: u64 = 1 << 63;
const RING_LAP_SHIFT: u32 = 32;
const RING_LAP_MASK: u64 = (1 << 31) - 1;
const RING_INDEX_MASK: u64 = (1 << 32) - 1;
const RING_TIME_MASK: u64 = (1 << 56) - 1;
const RING_TAG_SHIFT: u32 = 56;
const NANOS_PER_MICRO: u64 = 1_000;

impl Ring {
    fn new(limit: u32) -> Self {
        let limit = limit.max(1);
        let ring = Ring {
            head: AtomicU64::new(0),
            limit,
            chunks: (0..limit.div_ceil(RING_CHUNK))
                .map(|_| OnceLock::new())
                .collect(),
        };
        // The first chunk (the whole ring up to 4096 slots) up front.
        ring.slot(0);
        ring
    }

    #[inline]
    fn slot(&self, index: u32) -> &AtomicU64 {
        let chunk = (index / RING_CHUNK) as usize;
        let slots = self.chunks[chunk].get_or_init(|| {
            let len = (self.limit - chunk as u32 * RING_CHUNK).min(RING_CHUNK);
            (0..len).map(|_| AtomicU64::new(0)).collect()
        });
        &slots[(index % RING_CHUNK) as usize]
    }

    /// The time written for lap `lap` in `bits`, if they were.
    #[inline]
    fn written(bits: u64, lap: u64) -> Option<u64> {
        let tag = bits >> RING_TAG_SHIFT;
        (tag == (lap.wrapping_add(1) & 0xff))
            .then_some((bits & RING_TIME_MASK).saturating_mul(NANOS_PER_MICRO))
    }

    #[inline]
    fn acquire(&self, p: &RateParams, now: u64) -> Result<(), Duration> {
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let index = (head & RING_INDEX_MASK) as u32;
            let lap = (head >> RING_LAP_SHIFT) & RING_LAP_MASK;
            let slot = self.slot(index);
            if head & RING_FULL != 0 {
                // The admission `limit` places back, written in the previous lap.
                let previous_lap = lap.wrapping_sub(1) & RING_LAP_MASK;
                let oldest = Self::written(slot.load(Ordering::Acquire), previous_lap)
                    // Claimed but not written yet: it is happening now.
                    .unwrap_or(now);
                let age = now.saturating_sub(oldest);
                if age < p.period_ns {
                    return Err(Duration::from_nanos(p.period_ns - age));
                }
            }
            let next = if index + 1 >= self.limit {
                RING_FULL | (((lap + 1) & RING_LAP_MASK) << RING_LAP_SHIFT)
            } else {
                (head & !RING_INDEX_MASK) | u64::from(index + 1)
            };
            match self
                .head
                .compare_exchange_weak(head, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    let mut at = now.div_ceil(NANOS_PER_MICRO).min(RING_TIME_MASK);
                    if let Some(before) = self.before(index, lap, head & RING_FULL != 0) {
                        at = at.max(before / NANOS_PER_MICRO);
                    }
                    let tag = (lap + 1) & 0xff;
                    slot.store((tag << RING_TAG_SHIFT) | at, Ordering::Release);
                    return Ok(());
                }
                Err(actual) => head = actual,
            }
        }
    }

    /// The time of the admission just before the one at `index` of `lap`,
    /// if it is written.
    #[inline]
    fn before(&self, index: u32, lap: u64, full: bool) -> Option<u64> {
        let (index, lap) = match index.checked_sub(1) {
            Some(i) => (i, lap),
            None if full || lap > 0 => (self.limit - 1, lap.wrapping_sub(1) & RING_LAP_MASK),
            None => return None,
        };
        Self::written(self.slot(index).load(Ordering::Acquire), lap)
    }

    /// The time of the newest admission, if any is written.
    fn newest(&self) -> Option<u64> {
        let head = self.head.load(Ordering::Acquire);
        let index = (head & RING_INDEX_MASK) as u32;
        let lap = (head >> RING_LAP_SHIFT) & RING_LAP_MASK;
        let any = head & RING_FULL != 0 || index > 0;
        if !any {
            return None;
        }
        // While the newest is being written, the time is about now: the
        // caller sees a recent admission either way.
        Some(
            self.before(index, lap, head & RING_FULL != 0)
                .unwrap_or(u64::MAX),
        )
    }
}

fn lock(log: &Mutex<VecDeque<u64>>) -> std::sync::MutexGuard<'_, VecDeque<u64>> {
    // The log is consistent after every push and pop: a panic elsewhere
    // while it was held leaves nothing half-written.
    log.lock().unwrap_or_else(|e| e.into_inner())
}

#[inline(always)]
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

    /// Both sliding-window states: the partition deque and the lock-free ring.
    fn sliding_states(limit: u32, period: Duration) -> [(RateParams, RateState); 2] {
        let p = RateParams::new(&RateLimiter::sliding_window(limit, period));
        let deque = RateState::new(Some(&p));
        let ring = RateState::shared(Some(&p));
        assert!(matches!(ring, RateState::SlidingRing(_)));
        [(p.clone(), deque), (p, ring)]
    }

    #[test]
    fn sliding_window_is_an_exact_log() {
        for (p, s) in sliding_states(3, Duration::from_millis(100)) {
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
    }

    #[test]
    fn sliding_window_never_moves_entries_earlier() {
        for (p, s) in sliding_states(2, Duration::from_millis(100)) {
            assert!(s.acquire(&p, 50 * MS).is_ok());
            assert!(s.acquire(&p, 10 * MS).is_ok(), "an older clock read");
            // Both count until 150 ms.
            assert_eq!(s.acquire(&p, 120 * MS), Err(Duration::from_millis(30)));
            assert_eq!(s.acquire(&p, 149 * MS), Err(Duration::from_millis(1)));
            assert!(s.acquire(&p, 150 * MS).is_ok());
            assert!(s.acquire(&p, 150 * MS).is_ok());
            assert_eq!(s.acquire(&p, 150 * MS), Err(Duration::from_millis(100)));
        }
    }

    #[test]
    fn sliding_ring_rounds_times_up_to_the_microsecond() {
        let [_, (p, s)] = sliding_states(1, Duration::from_millis(1));
        assert!(s.acquire(&p, 1_500).is_ok());
        // Kept as 2 us: free again at 1.002 ms, never before 1.0015 ms.
        assert_eq!(s.acquire(&p, MS + 1_500), Err(Duration::from_nanos(500)));
        assert!(s.acquire(&p, MS + 2_000).is_ok());
    }

    #[test]
    fn sliding_ring_wraps_around_many_laps() {
        let [_, (p, s)] = sliding_states(3, Duration::from_millis(10));
        for lap in 0..1_000u64 {
            let t = lap * 10 * MS;
            assert_eq!(admitted(&p, &s, t, 5), 3, "lap {lap}");
            assert!(s.acquire(&p, t + 10 * MS - 1).is_err());
        }
    }

    proptest::proptest! {
        /// The lock-free ring decides exactly as the deque, call after call,
        /// for times in whole microseconds (the ring's resolution), clocks
        /// that may go back a little, and any limit.
        #[test]
        fn sliding_ring_decides_as_the_deque(
            limit in 1u32..12,
            period_us in 1u64..2_000,
            steps in proptest::collection::vec((0u64..400, proptest::prelude::any::<bool>()), 1..300),
        ) {
            let [(p, deque), (_, ring)] = sliding_states(limit, Duration::from_micros(period_us));
            let mut now = 10_000u64;
            for (step, back) in steps {
                now += step;
                let at = if back { now.saturating_sub(step / 2) } else { now } * 1_000;
                proptest::prop_assert_eq!(deque.acquire(&p, at), ring.acquire(&p, at), "at {}", at);
                proptest::prop_assert_eq!(deque.is_idle(Some(&p), at), ring.is_idle(Some(&p), at));
            }
        }
    }

    #[test]
    fn limits_hold_under_contention() {
        for spec in [
            RateLimiter::gcra(50, Duration::from_secs(1)),
            RateLimiter::fixed_window(50, Duration::from_secs(1)),
            RateLimiter::sliding_window(50, Duration::from_secs(1)),
        ] {
            let p = RateParams::new(&spec);
            for s in [RateState::new(Some(&p)), RateState::shared(Some(&p))] {
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

    /// Many threads on a small ring over real time: no span of `period`
    /// ever holds more than `limit` admissions.
    #[test]
    fn sliding_ring_holds_its_limit_across_threads() {
        let period = 200_000u64; // 200 us
        let p = RateParams::new(&RateLimiter::sliding_window(
            4,
            Duration::from_nanos(period),
        ));
        let s = RateState::shared(Some(&p));
        let start = std::time::Instant::now();
        let times = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    for _ in 0..20_000 {
                        // The clock is read before admission: the ring may
                        // record a later time (never an earlier one).
                        let now = start.elapsed().as_nanos() as u64;
                        if s.acquire(&p, now).is_ok() {
                            mine.push(now);
                        }
                    }
                    times.lock().unwrap().extend(mine);
                });
            }
        });
        let mut times = times.into_inner().unwrap();
        assert!(times.len() >= 4);
        times.sort_unstable();
        // The ring decides on the times it recorded, which are at least
        // the clock reads, rounded up to the microsecond, and kept in order
        // unless a predecessor is still being written: allow 10 % for that.
        for w in times.windows(5) {
            assert!(
                w[4] + period / 10 >= w[0] + period,
                "5 admissions within {} ns: {w:?}",
                w[4] - w[0]
            );
        }
    }
}
