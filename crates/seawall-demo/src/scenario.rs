//! The script of the live run: which phase the flaky service is in at any
//! moment, and the timings every part of the demo agrees on.

use std::fmt;
use std::time::{Duration, Instant};

/// What the flaky service does, in the order it does it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Answers at once with 200.
    Healthy,
    /// Answers at once with 503.
    Failing,
    /// Answers 200, but only after the client timeout has passed.
    Slow,
    /// Answers 429 with a `Retry-After` header.
    Throttling,
    /// Answers at once with 200 again.
    Recovered,
}

impl Phase {
    /// Every phase, in order.
    pub(crate) const ALL: [Phase; 5] = [
        Phase::Healthy,
        Phase::Failing,
        Phase::Slow,
        Phase::Throttling,
        Phase::Recovered,
    ];

    /// The position of the phase in [`Phase::ALL`].
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// A short, stable name (used as a key in the machine-readable summary).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Phase::Healthy => "healthy",
            Phase::Failing => "failing",
            Phase::Slow => "slow",
            Phase::Throttling => "throttling",
            Phase::Recovered => "recovered",
        }
    }

    /// What a person reads.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Phase::Healthy => "healthy",
            Phase::Failing => "failing (503)",
            Phase::Slow => "slow",
            Phase::Throttling => "throttling (429)",
            Phase::Recovered => "healthy again",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// The two groups of clients that call the flaky service side by side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Group {
    /// A plain HTTP client with a timeout, nothing else.
    Unprotected,
    /// The same client, called through a seawall pipeline.
    Protected,
}

impl Group {
    /// Both groups, in the order they are reported.
    pub(crate) const ALL: [Group; 2] = [Group::Unprotected, Group::Protected];

    /// The position of the group in [`Group::ALL`].
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The name, also sent to the service in the `x-group` header.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Group::Unprotected => "unprotected",
            Group::Protected => "protected",
        }
    }

    /// The group named `name`, if any.
    pub(crate) fn from_name(name: &[u8]) -> Option<Group> {
        Group::ALL.into_iter().find(|g| g.name().as_bytes() == name)
    }
}

/// The timeline of a run and the timings derived from its length.
///
/// The five phases share the run equally, so `--duration 12` gives phases of
/// 2.4 s and the default 60 s gives phases of 12 s; the pauses that must fit
/// inside a phase (the circuit's cooldown, the service's `Retry-After`) scale
/// with them. The circuit's cooldown is the shorter of the two, so that
/// while the service throttles, the circuit lets calls through again before
/// the service's own pause is over and the cooldown policy is seen at work.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scenario {
    start: Instant,
    phase_len: Duration,
    /// The timeout of one HTTP request, for both groups of clients.
    pub(crate) client_timeout: Duration,
    /// The time budget of one protected call, all attempts included.
    pub(crate) call_budget: Duration,
    /// How long the slow service takes to answer.
    pub(crate) slow_answer: Duration,
    /// The mean pause of each client between two calls.
    pub(crate) think_time: Duration,
    /// How long an open circuit stays open before it lets a probe through.
    pub(crate) circuit_cooldown: Duration,
    /// The `Retry-After` the throttling service sends, in whole seconds.
    pub(crate) retry_after_secs: u64,
}

impl Scenario {
    /// A run of `total` length starting now.
    pub(crate) fn new(total: Duration) -> Self {
        Self::starting_at(total, Instant::now())
    }

    /// A run of `total` length that started (or starts) at `start`: the
    /// second process of `--redis` follows the first one's run this way.
    pub(crate) fn starting_at(total: Duration, start: Instant) -> Self {
        let phase_len = total / Phase::ALL.len() as u32;
        let client_timeout = Duration::from_millis(500);
        Scenario {
            start,
            phase_len,
            client_timeout,
            call_budget: client_timeout * 2,
            slow_answer: client_timeout * 2,
            think_time: Duration::from_millis(50),
            circuit_cooldown: (phase_len / 8)
                .clamp(Duration::from_millis(500), Duration::from_millis(1500)),
            retry_after_secs: (phase_len.as_secs_f64() / 4.0).round().clamp(1.0, 5.0) as u64,
        }
    }

    /// When the run ends: no call starts after this instant.
    pub(crate) fn end(&self) -> Instant {
        self.start + self.phase_len * Phase::ALL.len() as u32
    }

    /// Time since the run started.
    pub(crate) fn elapsed(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.start)
    }

    /// The phase at instant `at` (the last phase once the run is over).
    pub(crate) fn phase_at(&self, at: Instant) -> Phase {
        let n = (self.elapsed(at).as_secs_f64() / self.phase_len.as_secs_f64()) as usize;
        Phase::ALL[n.min(Phase::ALL.len() - 1)]
    }

    /// When `phase` starts.
    pub(crate) fn starts(&self, phase: Phase) -> Instant {
        self.start + self.phase_len * phase.index() as u32
    }

    /// When `phase` ends.
    pub(crate) fn ends(&self, phase: Phase) -> Instant {
        self.starts(phase) + self.phase_len
    }

    /// The length of the run.
    pub(crate) fn total(&self) -> Duration {
        self.phase_len * Phase::ALL.len() as u32
    }

    /// The offsets of `phase` from the start of the run, in seconds.
    pub(crate) fn span_secs(&self, phase: Phase) -> (f64, f64) {
        let from = self.phase_len.as_secs_f64() * phase.index() as f64;
        (from, from + self.phase_len.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_follow_each_other_and_the_last_one_lasts() {
        let s = Scenario::new(Duration::from_secs(10));
        let at = |secs: f64| s.phase_at(s.start + Duration::from_secs_f64(secs));
        assert_eq!(at(0.0), Phase::Healthy);
        assert_eq!(at(2.1), Phase::Failing);
        assert_eq!(at(5.9), Phase::Slow);
        assert_eq!(at(7.0), Phase::Throttling);
        assert_eq!(at(9.9), Phase::Recovered);
        assert_eq!(at(99.0), Phase::Recovered);
        assert_eq!(s.starts(Phase::Slow), s.start + Duration::from_secs(4));
        assert_eq!(s.ends(Phase::Failing), s.starts(Phase::Slow));
        assert_eq!(s.ends(Phase::Recovered), s.end());
        assert_eq!(s.total(), Duration::from_secs(10));
    }

    #[test]
    fn a_run_started_earlier_is_followed_where_it_is() {
        let first = Scenario::new(Duration::from_secs(10));
        let later = first.start + Duration::from_millis(3500);
        let second = Scenario::starting_at(Duration::from_secs(10), first.start);
        assert_eq!(second.phase_at(later), Phase::Failing);
        assert_eq!(second.elapsed(later), Duration::from_millis(3500));
        assert_eq!(second.circuit_cooldown, first.circuit_cooldown);
    }

    #[test]
    fn pauses_scale_with_the_run() {
        let short = Scenario::new(Duration::from_secs(12));
        assert_eq!(short.retry_after_secs, 1);
        assert_eq!(short.circuit_cooldown, Duration::from_millis(500));
        let long = Scenario::new(Duration::from_secs(60));
        assert_eq!(long.retry_after_secs, 3);
        assert_eq!(long.circuit_cooldown, Duration::from_millis(1500));
    }
}
