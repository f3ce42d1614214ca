//! Reference model of the cooldown: a shared pause opened by retry-after
//! hints.
//!
//! # Rules
//! - A hint `h` recorded at `now` (with any outcome) moves the end of the
//!   pause to `max(end, now + min(h, max_pause))`: a longer hint extends the
//!   pause, a shorter one never shrinks it. The answer is the time left,
//!   `end - now`, when the pause is in effect after the hint (`None`
//!   otherwise, e.g. for a zero hint and no pause).
//! - While `now < end`, admission is refused with `retry_after = end - now`;
//!   from `end` on, it is not refused by the cooldown.
//!
//! Whether a refused call waits for the end (`max_wait`) or is refused at
//! once because the pause outlasts its deadline is the pipeline's decision,
//! not the store's: it is not part of this model.

use std::time::Duration;

use super::{instant, later};

/// The state of one cooldown.
///
/// ```
/// use std::time::Duration;
/// use seawall::model::cooldown::Cooldown;
///
/// let secs = Duration::from_secs;
/// let mut c = Cooldown::new(secs(30));
/// assert_eq!(c.hint(secs(10), secs(100)), Some(secs(10)));
/// // Capped at `max_pause`, and a shorter hint never shrinks the pause.
/// assert_eq!(c.hint(secs(3600), secs(101)), Some(secs(30)));
/// assert_eq!(c.hint(secs(1), secs(102)), Some(secs(29)));
/// assert_eq!(c.check(secs(130)), Err(secs(1)));
/// assert_eq!(c.check(secs(131)), Ok(()));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cooldown {
    max_pause: Duration,
    end: Duration,
}

impl Cooldown {
    /// A cooldown whose hints are capped at `max_pause`, not in effect.
    pub fn new(max_pause: Duration) -> Self {
        Cooldown {
            max_pause,
            end: Duration::ZERO,
        }
    }

    /// The model of `spec`.
    pub fn from_spec(spec: &crate::Cooldown) -> Self {
        Self::new(spec.max_pause)
    }

    /// The end of the pause (zero when none was ever opened).
    pub fn end(&self) -> Duration {
        self.end
    }

    /// Admission at `now`: `Err(retry_after)` while the pause lasts.
    pub fn check(&self, now: Duration) -> Result<(), Duration> {
        let now = instant(now);
        if now < self.end {
            Err(self.end - now)
        } else {
            Ok(())
        }
    }

    /// Records a retry-after hint at `now`; returns the time left in the
    /// pause, if it is in effect.
    pub fn hint(&mut self, hint: Duration, now: Duration) -> Option<Duration> {
        let now = instant(now);
        self.end = self.end.max(later(now, hint.min(self.max_pause)));
        (now < self.end).then(|| self.end - now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_zero_hint_opens_nothing() {
        let mut c = Cooldown::new(S);
        assert_eq!(c.hint(Duration::ZERO, 5 * S), None);
        assert_eq!(c.check(5 * S), Ok(()));
        assert_eq!(c.hint(S, 5 * S), Some(S));
        assert_eq!(c.hint(Duration::ZERO, 5 * S), Some(S));
    }

    #[test]
    fn a_pause_past_the_end_of_the_range_holds_to_the_end() {
        let end = super::super::END;
        let mut c = Cooldown::new(Duration::MAX);
        assert_eq!(c.hint(Duration::MAX, end - S), Some(S));
        assert_eq!(
            c.check(end - Duration::from_nanos(1)),
            Err(Duration::from_nanos(1))
        );
        assert_eq!(c.check(end), Ok(()));
        assert_eq!(c.check(Duration::MAX), Ok(()));
    }
}
