use std::time::Duration;

use crate::clock::Random;
use crate::error::ConfigError;

/// How the delay between attempts grows.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Backoff {
    /// The same delay every time.
    Constant {
        /// The delay.
        delay: Duration,
    },
    /// `base x n` for the n-th retry, capped.
    Linear {
        /// The first delay.
        base: Duration,
        /// The largest delay.
        cap: Duration,
    },
    /// `base x multiplier^(n-1)` for the n-th retry, capped.
    Exponential {
        /// The first delay.
        base: Duration,
        /// The growth factor (>= 1).
        multiplier: f64,
        /// The largest delay.
        cap: Duration,
    },
    /// Decorrelated jitter: uniform in `[base, previous x 3]`, capped.
    Decorrelated {
        /// The smallest delay.
        base: Duration,
        /// The largest delay.
        cap: Duration,
    },
}

/// The kinds of [`Backoff`], by the words of the configuration files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BackoffKind {
    Constant,
    Linear,
    Exponential,
    Decorrelated,
}

impl BackoffKind {
    /// Every kind, in the order the configuration files list them.
    pub(crate) const ALL: [BackoffKind; 4] = [
        BackoffKind::Constant,
        BackoffKind::Linear,
        BackoffKind::Exponential,
        BackoffKind::Decorrelated,
    ];

    /// The kind's word (`backoff = "..."` in the configuration files).
    pub(crate) fn word(self) -> &'static str {
        match self {
            BackoffKind::Constant => "constant",
            BackoffKind::Linear => "linear",
            BackoffKind::Exponential => "exponential",
            BackoffKind::Decorrelated => "decorrelated",
        }
    }
}

/// A setting of a retry that applies to some kinds of backoff only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BackoffSetting {
    /// [`Retry::multiplier`](super::Retry::multiplier).
    Multiplier,
    /// [`Retry::cap`](super::Retry::cap).
    Cap,
}

impl BackoffSetting {
    /// The setting's field, as errors and the configuration files name it.
    pub(crate) fn field(self) -> &'static str {
        match self {
            BackoffSetting::Multiplier => "multiplier",
            BackoffSetting::Cap => "cap",
        }
    }

    /// Whether the setting applies to a backoff of `kind`: the one
    /// statement of it, read by the setters of [`Retry`](super::Retry),
    /// its validation and the configuration files. The multiplier is the
    /// growth factor of an exponential backoff; every backoff but the
    /// constant one has a cap.
    pub(crate) fn applies_to(self, kind: BackoffKind) -> bool {
        match self {
            BackoffSetting::Multiplier => kind == BackoffKind::Exponential,
            BackoffSetting::Cap => kind != BackoffKind::Constant,
        }
    }

    /// The refusal of the setting given to a backoff of `kind` it does not
    /// apply to, in the words of [`applies_to`](Self::applies_to).
    pub(crate) fn refusal(self, kind: BackoffKind) -> ConfigError {
        let to: Vec<_> = BackoffKind::ALL
            .into_iter()
            .filter(|&k| self.applies_to(k))
            .collect();
        let rule = match to[..] {
            [only] => format!(
                "applies only to {} backoff, not {}",
                only.word(),
                kind.word()
            ),
            _ => format!("does not apply to {} backoff", kind.word()),
        };
        ConfigError::new("retry", self.field(), rule)
    }
}

/// `d x factor`, saturating at [`Duration::MAX`]: to the nanosecond when
/// `factor` is a whole number (a whole multiplier's powers, the first
/// delay's `m^0` among them), through seconds as `f64` otherwise.
fn mul(d: Duration, factor: f64) -> Duration {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    // Below 2^64, so that `factor as u128` is exact.
    if factor.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&factor) {
        let Some(nanos) = d.as_nanos().checked_mul(factor as u128) else {
            return Duration::MAX;
        };
        return match u64::try_from(nanos / NANOS_PER_SEC) {
            Ok(secs) => Duration::new(secs, (nanos % NANOS_PER_SEC) as u32),
            Err(_) => Duration::MAX,
        };
    }
    let secs = d.as_secs_f64() * factor;
    if !secs.is_finite() || secs >= Duration::MAX.as_secs_f64() {
        Duration::MAX
    } else {
        Duration::from_secs_f64(secs.max(0.0))
    }
}

/// `d x p / 100` for `p` in `0..=100`, rounded down to the nanosecond and
/// never above the exact product: `p` is taken to 2^-53 (rounded down), and
/// the product is made in integers, so that a delay of any size keeps
/// every nanosecond (through `f64` a delay past 2^53 ns, about 104 days,
/// would not).
fn percent_of(d: Duration, p: f64) -> Duration {
    const SCALE: f64 = 9_007_199_254_740_992.0; // 2^53
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    // Below 100 x 2^53 < 2^60: every product below fits in a u128.
    let k = (p.clamp(0.0, 100.0) * SCALE) as u128;
    let den = 100 * (SCALE as u128);
    let whole = u128::from(d.as_secs()) * k;
    let nanos = ((whole % den) * NANOS_PER_SEC + u128::from(d.subsec_nanos()) * k) / den;
    // `whole / den` <= the seconds of `d`; `nanos` < 2 x 10^9.
    let secs = u64::try_from(whole / den).unwrap_or(u64::MAX);
    Duration::from_secs(secs).saturating_add(Duration::from_nanos(nanos as u64))
}

impl Backoff {
    /// The delay after the `attempt`-th attempt failed (1-based), given the
    /// previous delay (decorrelated only).
    pub fn delay(&self, attempt: u32, previous: Duration, random: &dyn Random) -> Duration {
        let n = attempt.max(1);
        match *self {
            Backoff::Constant { delay } => delay,
            Backoff::Linear { base, cap } => base.saturating_mul(n).min(cap),
            Backoff::Exponential {
                base,
                multiplier,
                cap,
            } => {
                let exp = i32::try_from(n - 1).unwrap_or(i32::MAX);
                mul(base, multiplier.powi(exp)).min(cap)
            }
            Backoff::Decorrelated { base, cap } => {
                let prev = if previous.is_zero() { base } else { previous };
                let hi = prev.saturating_mul(3).max(base);
                let span = hi - base;
                (base + mul(span, random.next_f64())).min(cap)
            }
        }
    }

    /// The kind of this backoff.
    pub(crate) fn kind(&self) -> BackoffKind {
        match self {
            Backoff::Constant { .. } => BackoffKind::Constant,
            Backoff::Linear { .. } => BackoffKind::Linear,
            Backoff::Exponential { .. } => BackoffKind::Exponential,
            Backoff::Decorrelated { .. } => BackoffKind::Decorrelated,
        }
    }

    /// The bounds `[lo, hi]` any delay of this backoff falls in, before jitter.
    pub fn bounds(&self) -> (Duration, Duration) {
        match *self {
            Backoff::Constant { delay } => (delay, delay),
            Backoff::Linear { base, cap }
            | Backoff::Exponential { base, cap, .. }
            | Backoff::Decorrelated { base, cap } => (base.min(cap), cap),
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        match *self {
            Backoff::Constant { .. } => Ok(()),
            Backoff::Linear { base, cap }
            | Backoff::Exponential { base, cap, .. }
            | Backoff::Decorrelated { base, cap } => {
                if let Backoff::Exponential { multiplier, .. } = *self {
                    if !(multiplier >= 1.0 && multiplier.is_finite()) {
                        return Err(ConfigError::new(
                            "retry",
                            "multiplier",
                            format!("must be a finite number >= 1, got {multiplier}"),
                        ));
                    }
                }
                if cap < base {
                    return Err(ConfigError::new(
                        "retry",
                        "cap",
                        format!("must be >= base ({base:?}), got {cap:?}"),
                    ));
                }
                Ok(())
            }
        }
    }
}

/// How a delay is randomised so that many clients do not retry in lockstep.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Jitter {
    /// The delay as computed.
    None,
    /// Uniform in `[0, delay]`.
    Full,
    /// Uniform in `[delay / 2, delay]`.
    Equal,
    /// Uniform in `[delay x (1 - p/100), delay x (1 + p/100)]`, `p` in `0..=100`.
    Proportional(f64),
}

impl Jitter {
    /// Applies the jitter to `delay`: a delay within
    /// [`bounds`](Self::bounds), whatever its size.
    pub fn apply(&self, delay: Duration, random: &dyn Random) -> Duration {
        let (lo, hi) = self.bounds(delay);
        let jittered = match *self {
            Jitter::None => return delay,
            Jitter::Full => mul(delay, random.next_f64()),
            Jitter::Equal => lo + mul(delay - lo, random.next_f64()),
            Jitter::Proportional(p) => {
                let f = p / 100.0;
                mul(delay, 1.0 - f + 2.0 * f * random.next_f64())
            }
        };
        // The draw is scaled through `f64`, which past 2^53 ns (about 104
        // days) may round a delay out of its range by a few nanoseconds.
        jittered.clamp(lo, hi)
    }

    /// The bounds `[lo, hi]` of a jittered `delay`, to the nanosecond (a
    /// proportional jitter's rounded towards `delay`, so that they never lie
    /// outside `[delay x (1 - p/100), delay x (1 + p/100)]`; `hi` saturates
    /// at [`Duration::MAX`]).
    pub fn bounds(&self, delay: Duration) -> (Duration, Duration) {
        match *self {
            Jitter::None => (delay, delay),
            Jitter::Full => (Duration::ZERO, delay),
            Jitter::Equal => (delay / 2, delay),
            Jitter::Proportional(p) => {
                let off = percent_of(delay, p);
                (delay - off, delay.saturating_add(off))
            }
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if let Jitter::Proportional(p) = *self {
            if !(0.0..=100.0).contains(&p) {
                return Err(ConfigError::new(
                    "retry",
                    "jitter",
                    format!("percentage must be in 0..=100, got {p}"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SeededRandom;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn sequences() {
        let r = SeededRandom::new(1);
        let e = Backoff::Exponential {
            base: ms(100),
            multiplier: 2.0,
            cap: ms(1000),
        };
        let got: Vec<_> = (1..=6).map(|n| e.delay(n, Duration::ZERO, &r)).collect();
        assert_eq!(
            got,
            [ms(100), ms(200), ms(400), ms(800), ms(1000), ms(1000)]
        );
        let l = Backoff::Linear {
            base: ms(100),
            cap: ms(250),
        };
        let got: Vec<_> = (1..=3).map(|n| l.delay(n, Duration::ZERO, &r)).collect();
        assert_eq!(got, [ms(100), ms(200), ms(250)]);
        let c = Backoff::Constant { delay: ms(7) };
        assert_eq!(c.delay(9, Duration::ZERO, &r), ms(7));
    }

    /// The first delay is the base and a whole multiplier's delays are
    /// its exact multiples, whatever the size of the base: durations past
    /// 2^53 nanoseconds (about 104 days) are not rounded through `f64`.
    #[test]
    fn exponential_delays_are_exact_multiples_of_the_base() {
        let r = SeededRandom::new(1);
        let big = Duration::from_millis(u64::MAX - 1);
        let odd = Duration::from_secs(86_400 * 365 * 100) + Duration::from_nanos(1);
        for (base, multiplier, want) in [
            (big, 10.0, [big, big * 10, big * 100]),
            (odd, 1.0, [odd, odd, odd]),
            (odd, 3.0, [odd, odd * 3, odd * 9]),
            (
                Duration::from_nanos(7),
                2.0,
                [7, 14, 28].map(Duration::from_nanos),
            ),
        ] {
            let e = Backoff::Exponential {
                base,
                multiplier,
                cap: Duration::MAX,
            };
            let got: Vec<_> = (1..=3).map(|n| e.delay(n, Duration::ZERO, &r)).collect();
            assert_eq!(got, want, "{base:?} x {multiplier}");
        }
        // Past `Duration::MAX`, the largest delay.
        let e = Backoff::Exponential {
            base: big,
            multiplier: 2.0,
            cap: Duration::MAX,
        };
        assert_eq!(e.delay(200, Duration::ZERO, &r), Duration::MAX);
        // A multiplier with a fraction is still applied.
        let e = Backoff::Exponential {
            base: ms(500),
            multiplier: 1.5,
            cap: Duration::MAX,
        };
        let got: Vec<_> = (1..=3).map(|n| e.delay(n, Duration::ZERO, &r)).collect();
        assert_eq!(got, [ms(500), ms(750), ms(1125)]);
    }

    #[test]
    fn huge_exponents_saturate_at_the_cap() {
        let r = SeededRandom::new(1);
        let e = Backoff::Exponential {
            base: ms(1),
            multiplier: 10.0,
            cap: Duration::from_secs(60),
        };
        assert_eq!(
            e.delay(u32::MAX, Duration::ZERO, &r),
            Duration::from_secs(60)
        );
    }

    proptest! {
        #[test]
        fn backoff_within_bounds(
            base in 0u64..10_000, extra in 0u64..100_000, mult in 1.0f64..10.0,
            attempt in 1u32..200, prev in 0u64..200_000, seed: u64, kind in 0u8..4,
        ) {
            let r = SeededRandom::new(seed);
            let (base, cap) = (ms(base), ms(base + extra));
            let b = match kind {
                0 => Backoff::Constant { delay: base },
                1 => Backoff::Linear { base, cap },
                2 => Backoff::Exponential { base, multiplier: mult, cap },
                _ => Backoff::Decorrelated { base, cap },
            };
            let (lo, hi) = b.bounds();
            let d = b.delay(attempt, ms(prev), &r);
            prop_assert!(d >= lo && d <= hi, "{b:?} attempt {attempt}: {d:?} not in [{lo:?}, {hi:?}]");
            if let Backoff::Exponential { .. } | Backoff::Linear { .. } = b {
                // monotone non-decreasing
                prop_assert!(b.delay(attempt + 1, Duration::ZERO, &r) >= d);
            }
        }

        /// Every jittered delay lies in its bounds, to the nanosecond,
        /// whatever the delay's size (past 2^53 ns too, where `f64` no
        /// longer holds every nanosecond).
        #[test]
        fn jitter_within_range(
            secs in prop_oneof![0u64..1_000, 0u64..(1 << 40), Just(u64::MAX)],
            nanos in 0u32..1_000_000_000,
            p in 0.0f64..=100.0,
            seed: u64,
            kind in 0u8..4,
        ) {
            let r = SeededRandom::new(seed);
            let j = match kind { 0 => Jitter::None, 1 => Jitter::Full, 2 => Jitter::Equal, _ => Jitter::Proportional(p) };
            let d = Duration::new(secs, nanos);
            let (lo, hi) = j.bounds(d);
            for _ in 0..8 {
                let x = j.apply(d, &r);
                prop_assert!(x >= lo && x <= hi, "{j:?} on {d:?}: {x:?} not in [{lo:?}, {hi:?}]");
            }
        }

        /// A whole percentage's bounds are the exact products, rounded
        /// towards the delay.
        #[test]
        fn proportional_bounds_are_exact(secs in 0u64..(1 << 60), nanos in 0u32..1_000_000_000, p in 0u32..=100) {
            let d = Duration::new(secs, nanos);
            let (lo, hi) = Jitter::Proportional(f64::from(p)).bounds(d);
            let n = d.as_nanos();
            prop_assert_eq!(lo.as_nanos(), (n * u128::from(100 - p)).div_ceil(100));
            prop_assert_eq!(hi.as_nanos(), n * u128::from(100 + p) / 100);
        }
    }

    /// The largest draw and the smallest keep a proportional jitter in its
    /// documented range on a delay of decades.
    #[test]
    fn extreme_draws_of_a_long_delay_stay_in_range() {
        let d = Duration::new(1_000_000_000, 999_999_999);
        let n = d.as_nanos();
        let j = Jitter::Proportional(10.0);
        for draw in [0.0, 0.5, 1.0 - f64::EPSILON / 2.0] {
            let x = j
                .apply(d, &crate::testing::SequenceRandom::new([draw]))
                .as_nanos();
            assert!(
                (n * 9).div_ceil(10) <= x && x <= n * 11 / 10,
                "draw {draw}: {x}"
            );
        }
    }
}
