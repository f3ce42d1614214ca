//! Cooldown: a shared pause per resource, opened by a retry-after hint from
//! the classifier (an HTTP 429 or 503 with `Retry-After`, say).
//!
//! While the pause lasts, a new call waits for its end when that fits both
//! its deadline and [`Cooldown::max_wait`]; a call whose deadline ends before
//! the pause is refused at once with `cooldown_exceeds_deadline`; any other
//! call is refused with `cooldown_active`. The operation is not called in
//! either case. A longer hint extends the pause, a shorter one never shrinks
//! it.

use std::time::Duration;

use crate::error::ConfigError;

pub(crate) mod machine;
pub(crate) mod rules;

/// Configuration of a cooldown.
///
/// # Default
/// [`Cooldown::new`]: hints capped at 5 minutes, calls wait up to 30 s for
/// the pause to end, state dropped 60 s after the pause ends, enforcing
/// (not in shadow mode).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Cooldown {
    /// Longest pause a single hint may open.
    pub max_pause: Duration,
    /// Longest a call waits for the pause to end (zero: never wait).
    pub max_wait: Duration,
    /// How long state is kept after the pause ended.
    pub grace: Duration,
    /// Shadow mode: the pause is kept and reported but never holds a call
    /// back (see [`crate::shadow`]).
    pub shadow: bool,
}

impl Cooldown {
    /// A cooldown with the defaults above.
    pub fn new() -> Self {
        Cooldown {
            max_pause: Duration::from_secs(300),
            max_wait: Duration::from_secs(30),
            grace: Duration::from_secs(60),
            shadow: false,
        }
    }

    /// Caps the pause a single hint may open.
    pub fn max_pause(mut self, max: Duration) -> Self {
        self.max_pause = max;
        self
    }

    /// Longest a call waits for the pause to end (zero: refuse at once).
    ///
    /// The time a call has already waited (for an earlier pause, or a
    /// rate-limit permit) counts: a call whose wait for the pause to end
    /// exceeds what remains of its `max_wait` is refused at once with
    /// `cooldown_active` (with `cooldown_exceeds_deadline` when the pause
    /// outlasts its deadline; a pause that ends at the deadline does not).
    /// A call never waits longer than `max_wait` in all for one admission:
    /// a cooldown declared before the retry admits the call once, one
    /// declared after it admits each attempt, and each attempt may wait up
    /// to `max_wait` again.
    pub fn max_wait(mut self, max: Duration) -> Self {
        self.max_wait = max;
        self
    }

    /// How long state is kept after the pause ended.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Shadow mode: a call during the pause runs at once (no wait, no
    /// refusal), with a [`ShadowRejected`](crate::EventKind::ShadowRejected)
    /// event instead; its retry-after hint does not extend the pause (see
    /// [`crate::shadow`]).
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_pause.is_zero() {
            return Err(ConfigError::new("cooldown", "max_pause", "must be > 0"));
        }
        Ok(())
    }
}

impl Default for Cooldown {
    fn default() -> Self {
        Self::new()
    }
}
