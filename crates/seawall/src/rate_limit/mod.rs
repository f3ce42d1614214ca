//! Rate limiter: fixed window, sliding window and GCRA.
//!
//! Never admits more than the limit, across threads and, with a shared
//! store, across processes. A rejection carries `retry_after`, the time
//! until a permit is available; a call may instead wait for the permit when
//! [`RateLimiter::max_wait`] allows and the wait fits its deadline. A call
//! that waits reserves its permit, so that concurrent callers queue behind
//! it (see [`RateLimiter::max_wait`]).
//!
//! ```
//! use std::time::Duration;
//! use seawall::RateLimiter;
//!
//! // 100 calls per second, bursts of up to 10.
//! let gcra = RateLimiter::gcra(100, Duration::from_secs(1)).burst(10);
//! // At most 1000 calls in any 60-second span.
//! let sliding = RateLimiter::sliding_window(1000, Duration::from_secs(60));
//! # let _ = (gcra, sliding);
//! ```

use std::time::Duration;

use crate::error::ConfigError;

pub(crate) mod machine;
pub(crate) mod rules;

/// The counting algorithm of a rate limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RateAlgorithm {
    /// `limit` calls per window aligned on multiples of `period`; up to
    /// 2 x limit may pass around a window edge.
    FixedWindow,
    /// At most `limit` calls in any span of `period` (an exact sliding log).
    SlidingWindow,
    /// Generic cell rate algorithm: one call every `period / limit`, with
    /// bursts of up to `burst` calls. The interval is kept to the
    /// nanosecond, rounded up (see
    /// [`RateLimiter::emission_interval`]): never faster than the limit.
    Gcra,
}

impl RateAlgorithm {
    /// Every algorithm, in the order the configuration files list them.
    pub(crate) const ALL: [RateAlgorithm; 3] = [
        RateAlgorithm::Gcra,
        RateAlgorithm::FixedWindow,
        RateAlgorithm::SlidingWindow,
    ];

    /// The algorithm's word (`algorithm = "..."` in the configuration
    /// files).
    pub(crate) fn word(self) -> &'static str {
        match self {
            RateAlgorithm::Gcra => "gcra",
            RateAlgorithm::FixedWindow => "fixed_window",
            RateAlgorithm::SlidingWindow => "sliding_window",
        }
    }

    /// Whether [`RateLimiter::burst`] applies to the algorithm: GCRA only
    /// (a window admits `limit` per period, and no burst of its own). The
    /// one statement of it, read by the setter, the validation and the
    /// configuration files.
    pub(crate) fn takes_burst(self) -> bool {
        self == RateAlgorithm::Gcra
    }
}

/// Configuration of a rate limiter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct RateLimiter {
    /// The algorithm.
    pub algorithm: RateAlgorithm,
    /// Calls allowed per period.
    pub limit: u32,
    /// The period.
    pub period: Duration,
    /// GCRA burst size (defaults to `limit`).
    pub burst: u32,
    /// Longest a call waits for a permit in all (zero: reject at once). See
    /// [`RateLimiter::max_wait`](RateLimiter::max_wait()).
    pub max_wait: Duration,
    /// Shadow mode: the limiter counts and reports but never refuses (see
    /// [`crate::shadow`]).
    pub shadow: bool,
    /// A burst was given to an algorithm it does not apply to: refused by
    /// `build()`, never ignored.
    burst_unapplied: bool,
}

impl RateLimiter {
    /// The longest span a limiter keeps, 2^63 - 1 ns (about 292 years):
    /// its `period` and, for a GCRA burst above the limit, the span its
    /// permits may be taken ahead of time (`burst` x
    /// [`emission_interval`](Self::emission_interval)). Limits are kept in
    /// nanoseconds of the pipeline's clock, whose range is twice that, so
    /// a permit's instant fits the clock for the first 292 years of its
    /// readings. A longer one fails `build()`: `rate_limiter.period must
    /// be <= 292 years (9223372036.854775807s), got ...`.
    pub const MAX_PERIOD: Duration = Duration::from_nanos(i64::MAX as u64);

    /// GCRA: `limit` calls per `period`, bursts of up to `limit`.
    pub fn gcra(limit: u32, period: Duration) -> Self {
        RateLimiter {
            algorithm: RateAlgorithm::Gcra,
            limit,
            period,
            burst: limit,
            max_wait: Duration::ZERO,
            shadow: false,
            burst_unapplied: false,
        }
    }

    /// At most `limit` calls per fixed window of `period`.
    pub fn fixed_window(limit: u32, period: Duration) -> Self {
        RateLimiter {
            algorithm: RateAlgorithm::FixedWindow,
            ..Self::gcra(limit, period)
        }
    }

    /// At most `limit` calls in any span of `period`.
    pub fn sliding_window(limit: u32, period: Duration) -> Self {
        RateLimiter {
            algorithm: RateAlgorithm::SlidingWindow,
            ..Self::gcra(limit, period)
        }
    }

    /// GCRA burst size. The windows have none: `build()` refuses it there
    /// (`rate_limiter.burst applies only to gcra, not fixed_window`).
    pub fn burst(mut self, burst: u32) -> Self {
        if self.algorithm.takes_burst() {
            self.burst = burst;
        } else {
            self.burst_unapplied = true;
        }
        self
    }

    /// Lets a call wait up to `max_wait` for a permit (if it fits its
    /// deadline).
    ///
    /// A call the limiter refuses waits when the next free permit is at
    /// most `max_wait` away, less the time the call has already waited
    /// (for a cooldown, say, or an earlier permit), and ends by its
    /// deadline (a permit due at the deadline is on time); otherwise it is
    /// refused at once with `rate_limited` and `retry_after`, the time until
    /// that permit. A call never waits longer than `max_wait` in all for one
    /// admission: a limiter declared before the retry admits the call once,
    /// one declared after it admits each attempt, and each attempt may wait
    /// up to `max_wait` again.
    ///
    /// A call that waits **reserves** its permit for the instant it waits
    /// for (the permit counts from then, as if it were admitted then), and
    /// runs at that instant without asking the limiter again (the circuit,
    /// the bulkhead and the cooldown are asked again; a call refused by one
    /// of them gives the permit back). Concurrent callers therefore queue
    /// behind it: with `fixed_window(1, 250 ms).max_wait(250 ms)`, three
    /// calls at 250 ms are admitted at 250 and 500 ms and the third is
    /// refused at once, told to retry after 500 ms. No bulkhead slot is
    /// held while waiting.
    ///
    /// A call cancelled while it waits (its future dropped) gives its
    /// permit back. GCRA and the fixed window keep the whole queue in one
    /// number, so they take back only the newest reservation (no call came
    /// after it, or those that did gave theirs back: waiters dropped newest
    /// first all give theirs back); an older one stays spent, stricter
    /// than needed, until the queue behind it has passed (at most
    /// `max_wait`). A sliding window takes the reserved entry out of its
    /// log; a hole between two reservations is not filled.
    ///
    /// The Redis store (`seawall-redis`) reserves as the in-memory one does,
    /// across processes. A store that does not reserve (the default of
    /// [`ResourceState::admit_reserving`](crate::store::ResourceState::admit_reserving))
    /// lets the call wait for the time it was told, then ask again, and be
    /// refused then (still never after more than `max_wait` in all).
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// Shadow mode: a call over the limit runs at once, taking no permit
    /// and never waiting, with a
    /// [`ShadowRejected`](crate::EventKind::ShadowRejected) event instead
    /// of the refusal (see [`crate::shadow`]).
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// The time between two calls at the steady rate (GCRA emission
    /// interval): `period / limit`, rounded **up** to the nanosecond.
    ///
    /// GCRA keeps its times to the nanosecond, so a rate whose interval is
    /// no whole number of nanoseconds runs at the next slower one: never
    /// more than `limit` calls per `period` (after the burst), and fewer
    /// by less than one nanosecond per call, which shows only when the
    /// interval is a few nanoseconds (`gcra(400_000, 1 ms)`, 2.5 ns, runs
    /// at 3 ns: 333,333 calls per millisecond). A rate finer than one
    /// nanosecond per call is refused by `build()`.
    pub fn emission_interval(&self) -> Duration {
        const NANOS_PER_SEC: u128 = 1_000_000_000;
        let nanos = self
            .period
            .as_nanos()
            .div_ceil(u128::from(self.limit.max(1)));
        // At most the period: it fits a `Duration`.
        Duration::new(
            (nanos / NANOS_PER_SEC) as u64,
            (nanos % NANOS_PER_SEC) as u32,
        )
    }

    /// `true` when a call of `weight` permits can ever be admitted: from 1
    /// to the burst for GCRA, to the limit for the windows. A weighted call
    /// over it is refused at once (`rate_limited`, no `retry_after`),
    /// whatever the limiter's state, or in [shadow mode](crate::shadow)
    /// reported so and run; a store answers it without its state (see
    /// [`Pipeline::weighted`](crate::Pipeline::weighted)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use seawall::RateLimiter;
    ///
    /// let limiter = RateLimiter::gcra(100, Duration::from_secs(1)).burst(10);
    /// assert!(limiter.grants(10));
    /// assert!(!limiter.grants(11));
    /// assert!(!limiter.grants(0));
    /// ```
    pub fn grants(&self, weight: u32) -> bool {
        rules::weight_fits(&rules::RateParams::new(self), weight)
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        const P: &str = "rate_limiter";
        // A setting the algorithm does not take is a mistake, never ignored.
        if self.burst_unapplied {
            let to: Vec<_> = RateAlgorithm::ALL
                .into_iter()
                .filter(|a| a.takes_burst())
                .map(RateAlgorithm::word)
                .collect();
            return Err(ConfigError::new(
                P,
                "burst",
                format!(
                    "applies only to {}, not {}",
                    to.join(" and "),
                    self.algorithm.word()
                ),
            ));
        }
        if self.limit == 0 {
            return Err(ConfigError::new(P, "limit", "must be >= 1, got 0"));
        }
        if self.period.is_zero() {
            return Err(ConfigError::new(P, "period", "must be > 0"));
        }
        let longest = || format!("must be <= 292 years ({:?})", Self::MAX_PERIOD);
        if self.period > Self::MAX_PERIOD {
            return Err(ConfigError::new(
                P,
                "period",
                format!("{}, got {:?}", longest(), self.period),
            ));
        }
        if self.algorithm == RateAlgorithm::Gcra {
            if self.burst == 0 {
                return Err(ConfigError::new(P, "burst", "must be >= 1, got 0"));
            }
            let ahead = self.emission_interval().checked_mul(self.burst);
            if self.burst > self.limit && ahead.is_none_or(|d| d > Self::MAX_PERIOD) {
                return Err(ConfigError::new(
                    P,
                    "burst",
                    format!(
                        "x the emission interval ({:?}) {}, got {}",
                        self.emission_interval(),
                        longest(),
                        self.burst
                    ),
                ));
            }
            if self.period.as_nanos() < u128::from(self.limit) {
                return Err(ConfigError::new(
                    P,
                    "limit",
                    format!(
                        "{} per {:?} is finer than 1 ns per call",
                        self.limit, self.period
                    ),
                ));
            }
        }
        if self.algorithm == RateAlgorithm::SlidingWindow && self.limit > 1_000_000 {
            return Err(ConfigError::new(
                P,
                "limit",
                format!(
                    "must be <= 1000000 for a sliding window, got {}",
                    self.limit
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        assert_eq!(
            RateLimiter::gcra(0, Duration::from_secs(1))
                .validate()
                .unwrap_err()
                .to_string(),
            "rate_limiter.limit must be >= 1, got 0"
        );
        assert_eq!(
            RateLimiter::fixed_window(5, Duration::ZERO)
                .validate()
                .unwrap_err()
                .field,
            "period"
        );
        assert_eq!(
            RateLimiter::gcra(5, Duration::from_secs(1))
                .burst(0)
                .validate()
                .unwrap_err()
                .field,
            "burst"
        );
        assert!(RateLimiter::sliding_window(5, Duration::from_secs(1))
            .validate()
            .is_ok());
    }

    /// A burst given to a window is refused by name, in the words of the
    /// configuration files, never ignored.
    #[test]
    fn a_burst_of_a_window_is_refused() {
        let s = Duration::from_secs(1);
        assert_eq!(
            RateLimiter::fixed_window(5, s)
                .burst(50)
                .validate()
                .map_err(|e| e.to_string()),
            Err("rate_limiter.burst applies only to gcra, not fixed_window".into())
        );
        assert_eq!(
            RateLimiter::sliding_window(5, s)
                .burst(5)
                .validate()
                .map_err(|e| e.to_string()),
            Err("rate_limiter.burst applies only to gcra, not sliding_window".into())
        );
        assert!(RateLimiter::gcra(5, s).burst(50).validate().is_ok());
        for algorithm in RateAlgorithm::ALL {
            assert_eq!(algorithm.takes_burst(), algorithm == RateAlgorithm::Gcra);
        }
    }

    /// The emission interval is rounded up to the nanosecond: never a rate
    /// faster than the limit; finer than a nanosecond is refused.
    #[test]
    fn the_emission_interval_is_rounded_up() {
        let ms = Duration::from_millis(1);
        let interval = |limit, period| RateLimiter::gcra(limit, period).emission_interval();
        assert_eq!(interval(400_000, ms), Duration::from_nanos(3));
        assert_eq!(interval(500_000, ms), Duration::from_nanos(2));
        assert_eq!(
            interval(3, Duration::from_secs(1)),
            Duration::from_nanos(333_333_334)
        );
        assert_eq!(interval(1_000_000, ms), Duration::from_nanos(1));
        assert_eq!(interval(1, Duration::MAX), Duration::MAX);
        assert_eq!(
            interval(2, Duration::MAX),
            Duration::new(u64::MAX / 2 + 1, 0)
        );
        assert!(RateLimiter::gcra(1_000_000, ms).validate().is_ok());
        let e = RateLimiter::gcra(1_000_001, ms).validate().unwrap_err();
        assert_eq!(
            e.to_string(),
            "rate_limiter.limit 1000001 per 1ms is finer than 1 ns per call"
        );
    }

    /// A period longer than the clock's range can hold was accepted and
    /// kept as the longest one: a GCRA limiter of `Duration::MAX` refused
    /// every call, its first included, on a clock that had run for a
    /// while, with a `retry_after` of 584 years. It is refused at
    /// `build()`; at the longest period every algorithm admits its limit
    /// on a clock far from zero.
    #[test]
    fn a_period_beyond_the_clock_is_refused_and_the_longest_admits_its_limit() {
        use crate::testing::VirtualClock;
        use crate::{MemoryStore, Pipeline};

        let years = |n: u64| Duration::from_secs(n * 365 * 24 * 3600);
        for period in [
            Duration::MAX,
            Duration::from_secs(u64::MAX),
            Duration::from_nanos(u64::MAX),
            RateLimiter::MAX_PERIOD + Duration::from_nanos(1),
            years(300),
        ] {
            for limiter in [
                RateLimiter::gcra(1, period),
                RateLimiter::fixed_window(1, period),
                RateLimiter::sliding_window(1, period),
            ] {
                let e = Pipeline::builder("long-period")
                    .store(MemoryStore::new())
                    .rate_limiter(limiter.clone())
                    .build()
                    .unwrap_err();
                assert_eq!(
                    (e.policy, e.field),
                    ("rate_limiter", "period"),
                    "{limiter:?}"
                );
                assert_eq!(
                    e.to_string(),
                    format!(
                        "rate_limiter.period must be <= 292 years (9223372036.854775807s), got {period:?}"
                    )
                );
            }
        }
        // A burst above the limit may not take permits further ahead.
        let e = RateLimiter::gcra(1, years(100))
            .burst(3)
            .validate()
            .unwrap_err();
        assert_eq!((e.policy, e.field), ("rate_limiter", "burst"));
        assert!(RateLimiter::gcra(1, years(100)).burst(2).validate().is_ok());

        for limiter in [
            RateLimiter::gcra(2, RateLimiter::MAX_PERIOD),
            RateLimiter::gcra(3, RateLimiter::MAX_PERIOD),
            RateLimiter::gcra(1, years(146)).burst(2),
            RateLimiter::fixed_window(2, RateLimiter::MAX_PERIOD),
            RateLimiter::sliding_window(2, RateLimiter::MAX_PERIOD),
        ] {
            let limit = limiter.limit.max(limiter.burst);
            for start in [Duration::ZERO, Duration::from_secs(1_000_000), years(200)] {
                let clock = VirtualClock::starting_at(start);
                let p = Pipeline::builder("long-period")
                    .store(MemoryStore::new())
                    .clock(clock.clone())
                    .rate_limiter(limiter.clone())
                    .build()
                    .unwrap();
                for n in 0..limit {
                    assert_eq!(
                        p.call(|_| Ok::<_, ()>(n)).ok(),
                        Some(n),
                        "{limiter:?} at {start:?}: call {n}"
                    );
                }
                let refused = p.call(|_| Ok::<_, ()>(0)).unwrap_err();
                assert!(refused.is_rejected(), "{limiter:?} at {start:?}");
            }
        }
    }
}
