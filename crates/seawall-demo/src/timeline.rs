//! The run second by second and the circuit's changes, as the live view
//! saw them: what the live page (`--web`) draws.
//!
//! The live view's printing task writes here once a second (the same
//! figures as its status lines) and at each change of the circuit; the page
//! reads it through [`Timeline::json`]. Each call ended is counted in
//! exactly one second, and each request in exactly one second, so the
//! seconds add up to the summary's totals.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use crate::events::Circuit;
use crate::report::Answers;
use crate::scenario::{Group, Phase};

/// What one group saw in one second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct GroupSecond {
    /// Requests of the group that reached the service.
    pub(crate) reached: u64,
    /// The answers of the calls that ended in that second.
    pub(crate) answers: Answers,
    /// The median latency of those calls (`None`: no call ended).
    pub(crate) p50: Option<Duration>,
    /// Their 99th percentile latency.
    pub(crate) p99: Option<Duration>,
}

/// One second of the run (the last one may be shorter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Second {
    /// When it ended, since the start of the run.
    pub(crate) at: Duration,
    /// The phase most of it belongs to.
    pub(crate) phase: Phase,
    /// The circuit's state at its end.
    pub(crate) circuit: Circuit,
    /// Per group, as in [`Group::ALL`].
    pub(crate) groups: [GroupSecond; Group::ALL.len()],
}

#[derive(Debug, Default)]
struct Recorded {
    seconds: Vec<Second>,
    /// Changes of the circuit: when (ms since the start) and to what.
    circuit: Vec<(u64, Circuit)>,
    /// Cooldowns started: when (ms since the start) and for how long (ms).
    cooldowns: Vec<(u64, u64)>,
    /// The end of the run (ms since the start), once it is over.
    end_ms: Option<u64>,
}

/// The run so far, shared by the live view (writing) and the page (reading).
#[derive(Debug, Default)]
pub(crate) struct Timeline {
    recorded: Mutex<Recorded>,
}

impl Timeline {
    fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.recorded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends a second.
    pub(crate) fn push(&self, second: Second) {
        self.lock().seconds.push(second);
    }

    /// Records that the circuit became `state` at `at` since the start.
    pub(crate) fn circuit(&self, at: Duration, state: Circuit) {
        self.lock().circuit.push((millis(at), state));
    }

    /// Records a cooldown of `length` started at `at` since the start.
    pub(crate) fn cooldown(&self, at: Duration, length: Duration) {
        self.lock().cooldowns.push((millis(at), millis(length)));
    }

    /// Marks the run over at `end` since the start.
    pub(crate) fn finish(&self, end: Duration) {
        self.lock().end_ms = Some(millis(end));
    }

    /// The JSON members (no braces) `"run"`, `"seconds"` and `"circuit"`;
    /// `now` (since the start) ends the last stretch of the circuit while
    /// the run goes on.
    pub(crate) fn json(&self, now: Duration, total: Duration) -> String {
        let recorded = self.lock();
        let end_ms = recorded.end_ms.unwrap_or_else(|| millis(now));
        let mut json = format!(
            "\"run\":{{\"state\":\"{}\",\"elapsed_ms\":{end_ms},\"duration_ms\":{}}},\"seconds\":[",
            if recorded.end_ms.is_some() {
                "done"
            } else {
                "running"
            },
            millis(total)
        );
        for (i, second) in recorded.seconds.iter().enumerate() {
            if i > 0 {
                json.push(',');
            }
            let _ = write!(
                json,
                "{{\"at_ms\":{},\"phase\":\"{}\",\"circuit\":\"{}\"",
                millis(second.at),
                second.phase.name(),
                second.circuit.name()
            );
            for group in Group::ALL {
                let g = &second.groups[group.index()];
                let _ = write!(
                    json,
                    ",\"{}\":{{\"reached\":{},\"fresh\":{},\"fallback\":{},\"errors\":{},\"p50\":{},\"p99\":{}}}",
                    group.name(),
                    g.reached,
                    g.answers.fresh,
                    g.answers.fallback,
                    g.answers.errors,
                    latency_json(g.p50),
                    latency_json(g.p99)
                );
            }
            json.push('}');
        }
        let transitions: Vec<String> = recorded
            .circuit
            .iter()
            .map(|(at, state)| format!("{{\"at_ms\":{at},\"state\":\"{}\"}}", state.name()))
            .collect();
        let cooldowns: Vec<String> = recorded
            .cooldowns
            .iter()
            .map(|(at, ms)| format!("{{\"at_ms\":{at},\"ms\":{ms}}}"))
            .collect();
        let ms = ms_by_state(&recorded.circuit, end_ms);
        let opened = recorded
            .circuit
            .iter()
            .filter(|(_, s)| *s == Circuit::Open)
            .count();
        let _ = write!(
            json,
            "],\"circuit\":{{\"transitions\":[{}],\"cooldowns\":[{}],\"opened\":{opened},\
             \"ms\":{{\"closed\":{},\"open\":{},\"half_open\":{}}}}}",
            transitions.join(","),
            cooldowns.join(","),
            ms[Circuit::Closed.index()],
            ms[Circuit::Open.index()],
            ms[Circuit::HalfOpen.index()],
        );
        json
    }
}

/// Milliseconds spent in each state (as [`Circuit::index`]) from 0 to
/// `end_ms`, the circuit closed at 0. The page computes the same from the
/// same integers, to draw the band.
fn ms_by_state(transitions: &[(u64, Circuit)], end_ms: u64) -> [u64; 3] {
    let mut ms = [0; 3];
    let mut from = (0, Circuit::Closed);
    for &(at, state) in transitions {
        ms[from.1.index()] += at.saturating_sub(from.0);
        from = (at, state);
    }
    ms[from.1.index()] += end_ms.saturating_sub(from.0);
    ms
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A latency in ms with one decimal, as in the summary, or `null`.
fn latency_json(latency: Option<Duration>) -> String {
    latency.map_or_else(
        || "null".to_owned(),
        |d| format!("{:.1}", d.as_secs_f64() * 1000.0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_in_each_state_adds_up_to_the_run() {
        let t = [
            (1000, Circuit::Open),
            (1500, Circuit::HalfOpen),
            (1600, Circuit::Open),
            (2600, Circuit::HalfOpen),
            (2700, Circuit::Closed),
        ];
        assert_eq!(ms_by_state(&t, 5000), [1000 + 2300, 500 + 1000, 100 + 100]);
        assert_eq!(ms_by_state(&[], 700), [700, 0, 0]);
        // A change seen a moment out of order counts no negative stretch.
        let late = [(1000, Circuit::Open), (990, Circuit::HalfOpen)];
        assert_eq!(ms_by_state(&late, 1000), [1000, 0, 10]);
    }

    #[test]
    fn the_json_holds_every_second_and_change() {
        let timeline = Timeline::default();
        let mut groups = [GroupSecond::default(); 2];
        groups[1] = GroupSecond {
            reached: 3,
            answers: Answers {
                fresh: 2,
                fallback: 5,
                errors: 0,
            },
            p50: Some(Duration::from_micros(1250)),
            p99: Some(Duration::from_millis(40)),
        };
        timeline.push(Second {
            at: Duration::from_secs(1),
            phase: Phase::Failing,
            circuit: Circuit::Open,
            groups,
        });
        timeline.circuit(Duration::from_millis(400), Circuit::Open);
        timeline.cooldown(Duration::from_millis(900), Duration::from_secs(2));
        let running = timeline.json(Duration::from_millis(1100), Duration::from_secs(10));
        assert!(running.starts_with(
            "\"run\":{\"state\":\"running\",\"elapsed_ms\":1100,\"duration_ms\":10000}"
        ));
        assert!(running.contains(
            "\"protected\":{\"reached\":3,\"fresh\":2,\"fallback\":5,\"errors\":0,\"p50\":1.2,\"p99\":40.0}"
        ), "{running}");
        assert!(running.contains("\"p50\":null"), "{running}");
        assert!(
            running.contains("\"opened\":1,\"ms\":{\"closed\":400,\"open\":700,\"half_open\":0}"),
            "{running}"
        );
        assert!(
            running.contains("\"cooldowns\":[{\"at_ms\":900,\"ms\":2000}]"),
            "{running}"
        );
        timeline.finish(Duration::from_millis(1500));
        let done = timeline.json(Duration::from_secs(99), Duration::from_secs(10));
        assert!(
            done.contains("\"state\":\"done\",\"elapsed_ms\":1500"),
            "{done}"
        );
        assert!(done.contains("\"open\":1100"), "{done}");
    }
}
