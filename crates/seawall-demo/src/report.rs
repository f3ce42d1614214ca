//! What the callers saw, per group and phase, and the final summary: a table
//! for people and one `SUMMARY {json}` line for programs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use seawall::RejectionReason;

use crate::events::short;
use crate::protected::FallbackCause;
use crate::say;
use crate::scenario::{Group, Phase, Scenario};
use crate::service::Hits;
use crate::style::{Colour, Style};

/// How one call ended, as seen by its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The service answered.
    Answered,
    /// The fallback answered.
    Fallback(FallbackCause),
    /// The caller got an error (its kind).
    Error(&'static str),
}

/// Counts and latencies of a set of calls.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tally {
    calls: u64,
    answered: u64,
    fallbacks: u64,
    /// Fallbacks after a refusal by seawall, by reason (as in `RejectionReason::ALL`).
    rejected: [u64; RejectionReason::ALL.len()],
    /// Fallbacks after failed attempts.
    failed: u64,
    errors: BTreeMap<&'static str, u64>,
    latencies: Vec<Duration>,
}

impl Tally {
    fn add(&mut self, outcome: Outcome, latency: Duration) {
        self.calls += 1;
        self.latencies.push(latency);
        match outcome {
            Outcome::Answered => self.answered += 1,
            Outcome::Fallback(cause) => {
                self.fallbacks += 1;
                match cause {
                    FallbackCause::Rejected(reason) => {
                        let i = RejectionReason::ALL.iter().position(|r| *r == reason);
                        self.rejected[i.unwrap_or(0)] += 1;
                    }
                    FallbackCause::Failed => self.failed += 1,
                }
            }
            Outcome::Error(kind) => *self.errors.entry(kind).or_default() += 1,
        }
    }

    fn merge(&mut self, other: &Tally) {
        self.calls += other.calls;
        self.answered += other.answered;
        self.fallbacks += other.fallbacks;
        for (mine, theirs) in self.rejected.iter_mut().zip(other.rejected) {
            *mine += theirs;
        }
        self.failed += other.failed;
        for (kind, n) in &other.errors {
            *self.errors.entry(kind).or_default() += n;
        }
        self.latencies.extend_from_slice(&other.latencies);
    }

    /// Errors surfaced to callers, all kinds together.
    pub(crate) fn errors(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Calls counted.
    pub(crate) fn calls(&self) -> u64 {
        self.calls
    }

    /// Fallback answers after a refusal for `reason`.
    pub(crate) fn refused(&self, reason: RejectionReason) -> u64 {
        RejectionReason::ALL
            .iter()
            .position(|r| *r == reason)
            .map_or(0, |i| self.rejected[i])
    }

    /// What the callers got, by kind of answer.
    pub(crate) fn answers(&self) -> Answers {
        Answers {
            fresh: self.answered,
            fallback: self.fallbacks,
            errors: self.errors(),
        }
    }

    /// The latency below which `pct` % of the calls finished (nearest rank),
    /// `None` without calls.
    pub(crate) fn latency(&self, pct: usize) -> Option<Duration> {
        (self.calls > 0).then(|| self.percentile(pct))
    }

    /// The latency below which `pct` % of the calls finished (nearest rank).
    fn percentile(&self, pct: usize) -> Duration {
        let mut sorted = self.latencies.clone();
        sorted.sort_unstable();
        match sorted.len() {
            0 => Duration::ZERO,
            n => sorted[((n * pct).div_ceil(100)).clamp(1, n) - 1],
        }
    }

    fn max(&self) -> Duration {
        self.latencies.iter().copied().max().unwrap_or_default()
    }
}

/// Every call of the run, by group and phase (the phase a call started in),
/// and the calls that ended since the live view last took them.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    recorded: Mutex<Recorded>,
}

#[derive(Debug, Default)]
struct Recorded {
    by_phase: [[Tally; Phase::ALL.len()]; Group::ALL.len()],
    recent: [Tally; Group::ALL.len()],
}

impl Stats {
    /// Records one call.
    pub(crate) fn record(&self, group: Group, phase: Phase, outcome: Outcome, latency: Duration) {
        let mut recorded = self.recorded.lock().unwrap_or_else(|e| e.into_inner());
        recorded.by_phase[group.index()][phase.index()].add(outcome, latency);
        recorded.recent[group.index()].add(outcome, latency);
    }

    /// The calls that ended since the last time this was called, per group
    /// (each call is taken once: summed up, they are every call).
    pub(crate) fn take_recent(&self) -> [Tally; Group::ALL.len()] {
        let mut recorded = self.recorded.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut recorded.recent)
    }

    /// Every call of `group` so far, all phases together.
    pub(crate) fn total(&self, group: Group) -> Tally {
        self.snapshot()[group.index()]
            .iter()
            .fold(Tally::default(), |mut all, t| {
                all.merge(t);
                all
            })
    }

    fn snapshot(&self) -> [[Tally; Phase::ALL.len()]; Group::ALL.len()] {
        self.recorded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_phase
            .clone()
    }
}

/// What a group's callers got, counted by kind of answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Answers {
    /// Answers of the service.
    pub(crate) fresh: u64,
    /// Answers of the fallback (the last good answer, possibly stale).
    pub(crate) fallback: u64,
    /// Errors.
    pub(crate) errors: u64,
}

/// The figures of the run, ready to print.
#[derive(Debug)]
pub(crate) struct Summary<'a> {
    scenario: &'a Scenario,
    clients: usize,
    by_phase: [[Tally; Phase::ALL.len()]; Group::ALL.len()],
    total: [Tally; Group::ALL.len()],
    hits: &'a Hits,
    /// Whether a second process called the service too (`--redis`).
    second_process: bool,
}

impl<'a> Summary<'a> {
    /// Collects the figures.
    pub(crate) fn new(
        stats: &Stats,
        hits: &'a Hits,
        scenario: &'a Scenario,
        clients: usize,
    ) -> Self {
        let by_phase = stats.snapshot();
        let total = by_phase.clone().map(|phases| {
            phases.iter().fold(Tally::default(), |mut all, t| {
                all.merge(t);
                all
            })
        });
        Summary {
            scenario,
            clients,
            by_phase,
            total,
            hits,
            second_process: false,
        }
    }

    /// Also reports the requests of the second process of `--redis`.
    pub(crate) fn with_second_process(mut self) -> Self {
        self.second_process = true;
        self
    }

    /// Prints the tables, the conclusion and the `SUMMARY` line.
    pub(crate) fn print(&self, style: Style) {
        let mut text = String::new();
        self.write_totals(&mut text, style);
        self.write_phases(&mut text, style);
        self.write_conclusion(&mut text, style);
        let _ = writeln!(text, "SUMMARY {}", self.json());
        say(&text);
    }

    fn write_totals(&self, text: &mut String, style: Style) {
        let [u, p] = &self.total;
        let head = format!(
            "\n{:<40}{:>14}{:>14}",
            "summary", "unprotected", "protected"
        );
        let _ = writeln!(text, "{}", style.paint(Colour::Bold, &head));
        let mut row = |label: &str, a: String, b: String| {
            let _ = writeln!(text, "{label:<40}{a:>14}{b:>14}");
        };
        row(
            "calls made by callers",
            u.calls.to_string(),
            p.calls.to_string(),
        );
        row(
            "  answered by the service",
            u.answered.to_string(),
            p.answered.to_string(),
        );
        row(
            "  answered by the fallback (cache)",
            u.fallbacks.to_string(),
            p.fallbacks.to_string(),
        );
        for (i, reason) in RejectionReason::ALL.iter().enumerate() {
            if u.rejected[i] + p.rejected[i] > 0 {
                row(
                    &format!("    refused: {reason}"),
                    u.rejected[i].to_string(),
                    p.rejected[i].to_string(),
                );
            }
        }
        if u.failed + p.failed > 0 {
            row(
                "    after failed attempts",
                u.failed.to_string(),
                p.failed.to_string(),
            );
        }
        row(
            "  errors surfaced to callers",
            u.errors().to_string(),
            p.errors().to_string(),
        );
        let kinds: std::collections::BTreeSet<_> = u.errors.keys().chain(p.errors.keys()).collect();
        for kind in kinds {
            let n = |t: &Tally| t.errors.get(kind).copied().unwrap_or(0).to_string();
            row(&format!("    {kind}"), n(u), n(p));
        }
        let (hu, hp) = (
            self.hits.total(Group::Unprotected),
            self.hits.total(Group::Protected),
        );
        row(
            "requests that reached the service",
            hu.to_string(),
            hp.to_string(),
        );
        row(
            "latency seen by callers: p50",
            short(u.percentile(50)),
            short(p.percentile(50)),
        );
        row(
            "                         p99",
            short(u.percentile(99)),
            short(p.percentile(99)),
        );
        row(
            "                         max",
            short(u.max()),
            short(p.max()),
        );
    }

    fn write_phases(&self, text: &mut String, style: Style) {
        let head = format!(
            "\n{:<30}{:<13}{:>7}{:>9}{:>10}{:>8}{:>9}{:>8}{:>8}",
            "per phase", "group", "calls", "service", "fallback", "errors", "reached", "p50", "p99"
        );
        let _ = writeln!(text, "{}", style.paint(Colour::Bold, &head));
        for phase in Phase::ALL {
            let (from, to) = self.scenario.span_secs(phase);
            for group in Group::ALL {
                let t = &self.by_phase[group.index()][phase.index()];
                let label = match group {
                    Group::Unprotected => {
                        format!("{:<17}{:>11}", phase.label(), format!("{from:.1}-{to:.1}s"))
                    }
                    Group::Protected => String::new(),
                };
                let _ = writeln!(
                    text,
                    "{label:<30}{:<13}{:>7}{:>9}{:>10}{:>8}{:>9}{:>8}{:>8}",
                    group.name(),
                    t.calls,
                    t.answered,
                    t.fallbacks,
                    t.errors(),
                    self.hits.get(group, phase),
                    short(t.percentile(50)),
                    short(t.percentile(99)),
                );
            }
        }
    }

    fn write_conclusion(&self, text: &mut String, style: Style) {
        let [u, p] = &self.total;
        let sick = [Phase::Failing, Phase::Slow, Phase::Throttling];
        let sick_hits = |g: Group| {
            sick.iter()
                .map(|phase| self.hits.get(g, *phase))
                .sum::<u64>()
        };
        let (su, sp) = (sick_hits(Group::Unprotected), sick_hits(Group::Protected));
        let (hu, hp) = (
            self.hits.total(Group::Unprotected),
            self.hits.total(Group::Protected),
        );
        let conclusion = format!(
            "\nwhile the service was sick (failing, slow, throttling), the protected group sent it {sp} \
             requests, the unprotected one {su}{}; {hp} vs {hu} over the whole run.\n\
             protected callers got {} fresh answers, {} fallback answers (the last good quote, \
             possibly stale) and {} errors;\n\
             unprotected callers got {} fresh answers and {} errors.\n\
             answers came in {} at p50, {} at p99 with seawall (vs {}, {} without).\n",
            ratio(su, sp),
            p.answered,
            p.fallbacks,
            p.errors(),
            u.answered,
            u.errors(),
            short(p.percentile(50)),
            short(p.percentile(99)),
            short(u.percentile(50)),
            short(u.percentile(99)),
        );
        let _ = writeln!(text, "{}", style.paint(Colour::Bold, &conclusion));
        if self.second_process {
            let sent = self.hits.second_process_total();
            let line = format!(
                "the second process, started when the circuit opened, sent the service {sent} \
                 request{} (its own lines, `second | `, say which were probes).",
                if sent == 1 { "" } else { "s" }
            );
            let _ = writeln!(text, "{}", style.paint(Colour::Bold, &line));
        }
    }

    /// The machine-readable summary, one line of JSON.
    pub(crate) fn json(&self) -> String {
        let mut groups = Vec::new();
        for group in Group::ALL {
            let total = &self.total[group.index()];
            let mut phases = Vec::new();
            for phase in Phase::ALL {
                let tally = &self.by_phase[group.index()][phase.index()];
                let figures = tally_json(tally, self.hits.get(group, phase));
                phases.push(format!("\"{}\":{{{figures}}}", phase.name()));
            }
            let figures = tally_json(total, self.hits.total(group));
            groups.push(format!(
                "\"{}\":{{{figures},\"phases\":{{{}}}}}",
                group.name(),
                phases.join(",")
            ));
        }
        let phases: Vec<String> = Phase::ALL
            .iter()
            .map(|p| {
                let (from, to) = self.scenario.span_secs(*p);
                format!(
                    "{{\"name\":\"{}\",\"from_s\":{from:.3},\"to_s\":{to:.3}}}",
                    p.name()
                )
            })
            .collect();
        let second = if self.second_process {
            let by_phase: Vec<String> = Phase::ALL
                .iter()
                .map(|p| format!("\"{}\":{}", p.name(), self.hits.second_process(*p)))
                .collect();
            format!(
                ",\"second_process\":{{\"server_requests\":{},\"phases\":{{{}}}}}",
                self.hits.second_process_total(),
                by_phase.join(",")
            )
        } else {
            String::new()
        };
        format!(
            "{{\"clients_per_group\":{},\"phases\":[{}],\"groups\":{{{}}}{second}}}",
            self.clients,
            phases.join(","),
            groups.join(",")
        )
    }
}

/// ` (12x fewer)` when `few` is well below `many`.
fn ratio(many: u64, few: u64) -> String {
    if few > 0 && few * 2 <= many {
        format!(" ({}x fewer)", many / few)
    } else {
        String::new()
    }
}

/// The figures of `t` as JSON members (no braces); `server_requests`:
/// the requests that reached the service.
pub(crate) fn tally_json(t: &Tally, server_requests: u64) -> String {
    let rejections: Vec<String> = RejectionReason::ALL
        .iter()
        .zip(t.rejected)
        .map(|(reason, n)| format!("\"{reason}\":{n}"))
        .collect();
    let errors: Vec<String> = t
        .errors
        .iter()
        .map(|(kind, n)| format!("\"{kind}\":{n}"))
        .collect();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    format!(
        "\"calls\":{},\"answered\":{},\"fallbacks\":{},\"rejections\":{{{}}},\"fallbacks_after_failure\":{},\
         \"errors\":{},\"errors_by_kind\":{{{}}},\"server_requests\":{server_requests},\
         \"latency_ms\":{{\"p50\":{:.1},\"p99\":{:.1},\"max\":{:.1}}}",
        t.calls,
        t.answered,
        t.fallbacks,
        rejections.join(","),
        t.failed,
        t.errors(),
        errors.join(","),
        ms(t.percentile(50)),
        ms(t.percentile(99)),
        ms(t.max()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let mut t = Tally::default();
        for ms in 1..=100 {
            t.add(Outcome::Answered, Duration::from_millis(ms));
        }
        assert_eq!(t.percentile(50), Duration::from_millis(50));
        assert_eq!(t.percentile(99), Duration::from_millis(99));
        assert_eq!(t.max(), Duration::from_millis(100));
        assert_eq!(Tally::default().percentile(50), Duration::ZERO);
    }

    #[test]
    fn outcomes_are_sorted_into_their_columns() {
        let mut t = Tally::default();
        t.add(
            Outcome::Fallback(FallbackCause::Rejected(RejectionReason::CircuitOpen)),
            Duration::ZERO,
        );
        t.add(Outcome::Fallback(FallbackCause::Failed), Duration::ZERO);
        t.add(Outcome::Error("timeout"), Duration::ZERO);
        let mut all = Tally::default();
        all.merge(&t);
        all.merge(&t);
        assert_eq!(
            (all.calls, all.fallbacks, all.failed, all.errors()),
            (6, 4, 2, 2)
        );
        assert_eq!(all.rejected[0], 2);
        let json = tally_json(&all, 7);
        assert!(json.contains("\"circuit_open\":2"), "{json}");
        assert!(json.contains("\"server_requests\":7"), "{json}");
    }
}
