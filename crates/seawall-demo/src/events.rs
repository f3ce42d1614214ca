//! The live view: the state of the run rather than a scroll of events.
//!
//! Once a second, one line per group of clients: the requests that reached
//! the service in that second, and the answers the callers got (fresh from
//! the service, from the fallback, errors), with the protected pipeline's
//! circuit state. Between them, the moments that matter, as they happen:
//! the circuit opening, half-opening and closing, a cooldown started by a
//! `Retry-After`, a store outage; and a banner when the service changes
//! phase. Everything else (each retry, each refusal) is counted in the
//! status lines and the summary, not printed.
//!
//! Events are handed over a channel to the printing task, so the pipeline
//! never waits for the terminal.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use seawall::{Event, EventKind};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use crate::report::{Answers, Stats};
use crate::scenario::{Group, Phase, Scenario};
use crate::service::Hits;
use crate::style::{Colour, Style};

/// How often the status lines are printed.
const TICK: Duration = Duration::from_secs(1);

enum Message {
    Event { at: Instant, kind: EventKind },
    Finish,
}

/// The printing side of the live view.
#[derive(Debug)]
pub(crate) struct EventLog {
    sender: mpsc::UnboundedSender<Message>,
    printer: JoinHandle<()>,
}

impl EventLog {
    /// Starts the printing task, which reads the callers' answers from
    /// `stats` and the service's requests from `hits`.
    pub(crate) fn start(
        scenario: Scenario,
        style: Style,
        stats: Arc<Stats>,
        hits: Arc<Hits>,
    ) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        let printer = tokio::spawn(print_lines(receiver, scenario, style, stats, hits));
        EventLog { sender, printer }
    }

    /// A listener to register with `PipelineBuilder::on_event`.
    pub(crate) fn listener(&self) -> impl Fn(&Event<'_>) + Send + Sync + 'static {
        let sender = self.sender.clone();
        move |event: &Event<'_>| {
            if is_transition(&event.kind) {
                let _ = sender.send(Message::Event {
                    at: Instant::now(),
                    kind: event.kind.clone(),
                });
            }
        }
    }

    /// Prints what is pending and stops the printing task.
    pub(crate) async fn finish(self) {
        let _ = self.sender.send(Message::Finish);
        let _ = self.printer.await;
    }
}

/// The events printed as they happen: changes of state.
fn is_transition(kind: &EventKind) -> bool {
    matches!(
        kind,
        EventKind::CircuitOpened { .. }
            | EventKind::CircuitHalfOpened
            | EventKind::CircuitClosed
            | EventKind::CooldownStarted { .. }
            | EventKind::StoreUnavailable { .. }
    )
}

/// The protected pipeline's circuit, as its events tell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Circuit {
    Closed,
    Open,
    HalfOpen,
}

impl Circuit {
    fn after(self, kind: &EventKind) -> Circuit {
        match kind {
            EventKind::CircuitOpened { .. } => Circuit::Open,
            EventKind::CircuitHalfOpened => Circuit::HalfOpen,
            EventKind::CircuitClosed => Circuit::Closed,
            _ => self,
        }
    }

    fn show(self) -> (Colour, &'static str) {
        match self {
            Circuit::Closed => (Colour::Green, "circuit closed"),
            Circuit::Open => (Colour::Red, "circuit OPEN"),
            Circuit::HalfOpen => (Colour::Yellow, "circuit half-open"),
        }
    }
}

/// What the status lines of one group counted at the last tick.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    answers: Answers,
    requests: u64,
}

/// The printing task: a transition line for each change of state, the
/// status lines once a second, a banner for each phase of the service.
async fn print_lines(
    mut receiver: mpsc::UnboundedReceiver<Message>,
    scenario: Scenario,
    style: Style,
    stats: Arc<Stats>,
    hits: Arc<Hits>,
) {
    let mut printer = Printer {
        scenario,
        style,
        shown: None,
        circuit: Circuit::Closed,
        seen: [Seen::default(); Group::ALL.len()],
    };
    printer.announce(scenario.phase_at(Instant::now()));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + TICK, TICK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            message = receiver.recv() => match message {
                Some(Message::Event { at, kind }) => printer.transition(at, &kind),
                Some(Message::Finish) | None => break,
            },
            _ = tick.tick() => printer.status(Instant::now(), &stats, &hits),
        }
    }
    while let Ok(Message::Event { at, kind }) = receiver.try_recv() {
        printer.transition(at, &kind);
    }
    printer.status(Instant::now(), &stats, &hits);
}

/// The line of a change of state.
fn describe(kind: &EventKind) -> (Colour, String) {
    match kind {
        EventKind::CircuitOpened { cooldown } => (
            Colour::Red,
            format!(
                "circuit OPEN: calls are refused for {}, the fallback answers",
                short(*cooldown)
            ),
        ),
        EventKind::CircuitHalfOpened => (
            Colour::Yellow,
            "circuit half-open: one probe goes through to the service".into(),
        ),
        EventKind::CircuitClosed => (
            Colour::Green,
            "circuit closed: calls reach the service again".into(),
        ),
        EventKind::CooldownStarted { duration } => (
            Colour::Blue,
            format!(
                "cooldown: every protected caller pauses {} (Retry-After)",
                short(*duration)
            ),
        ),
        other => (Colour::Red, other.to_string()),
    }
}

/// Writes status lines, transitions and phase banners to stdout.
struct Printer {
    scenario: Scenario,
    style: Style,
    /// The last phase announced.
    shown: Option<Phase>,
    circuit: Circuit,
    seen: [Seen; Group::ALL.len()],
}

impl Printer {
    /// The line of a change of state, stamped with its time and phase.
    fn transition(&mut self, at: Instant, kind: &EventKind) {
        self.circuit = self.circuit.after(kind);
        self.announce(self.scenario.phase_at(at));
        let (colour, text) = describe(kind);
        let stamp = self.stamp(at);
        self.write(&format!(
            "{} {}",
            self.style.paint(Colour::Dim, &stamp),
            self.style.paint(colour, &format!(">> {text}"))
        ));
    }

    /// One line per group: what happened since the last status, under the
    /// phase most of that second belongs to. Nothing when nothing happened
    /// (the last lines, once the callers stopped).
    fn status(&mut self, now: Instant, stats: &Stats, hits: &Hits) {
        let middle = now.checked_sub(TICK / 2).unwrap_or(now);
        let counted = Group::ALL.map(|group| Seen {
            answers: stats.answers(group),
            requests: hits.total(group),
        });
        let quiet = Group::ALL.iter().all(|g| {
            let (now, last) = (counted[g.index()], self.seen[g.index()]);
            now.answers == last.answers && now.requests == last.requests
        });
        if quiet {
            return;
        }
        self.announce(self.scenario.phase_at(middle));
        for group in Group::ALL {
            let seen = counted[group.index()];
            let last = std::mem::replace(&mut self.seen[group.index()], seen);
            let a = seen.answers.since(last.answers);
            let requests = seen.requests.saturating_sub(last.requests);
            let stamp = format!(
                "{:>6.1}s  {:<16}",
                self.scenario.elapsed(now).as_secs_f64(),
                self.scenario.phase_at(middle).label()
            );
            let stamp = match group {
                Group::Unprotected => stamp,
                Group::Protected => " ".repeat(stamp.len()),
            };
            let mut line = format!(
                "{} {:<12} {:>5} to the service | answers: {:>5} fresh {} {}",
                self.style.paint(Colour::Dim, &stamp),
                group.name(),
                requests,
                a.fresh,
                self.style.paint(
                    if a.fallback > 0 {
                        Colour::Cyan
                    } else {
                        Colour::Dim
                    },
                    &format!("{:>5} fallback", a.fallback)
                ),
                self.style.paint(
                    if a.errors > 0 {
                        Colour::Red
                    } else {
                        Colour::Dim
                    },
                    &format!("{:>5} errors", a.errors)
                ),
            );
            if group == Group::Protected {
                let (colour, text) = self.circuit.show();
                line += &format!(" | {}", self.style.paint(colour, text));
            }
            self.write(&line);
        }
    }

    fn stamp(&self, at: Instant) -> String {
        format!(
            "{:>6.1}s  {:<16}",
            self.scenario.elapsed(at).as_secs_f64(),
            self.scenario.phase_at(at).label()
        )
    }

    /// Prints the banner of every phase up to `phase` not yet announced.
    fn announce(&mut self, phase: Phase) {
        let first = self.shown.map_or(0, |p| p.index() + 1);
        for next in Phase::ALL.into_iter().take(phase.index() + 1).skip(first) {
            self.shown = Some(next);
            let banner = self.banner(next);
            self.write(&self.style.paint(Colour::Bold, &banner));
        }
    }

    fn banner(&self, phase: Phase) -> String {
        let s = &self.scenario;
        let what = match phase {
            Phase::Healthy => "the service answers at once".to_owned(),
            Phase::Failing => "the service answers 503 at once".to_owned(),
            Phase::Slow => format!(
                "the service answers after {} (client timeout {})",
                short(s.slow_answer),
                short(s.client_timeout)
            ),
            Phase::Throttling => format!(
                "the service answers 429, Retry-After: {}",
                s.retry_after_secs
            ),
            Phase::Recovered => "the service answers at once again".to_owned(),
        };
        let at = s.elapsed(s.starts(phase)).as_secs_f64();
        format!(
            "--- {at:>5.2}s  phase {}/5, {}: {what} ---",
            phase.index() + 1,
            phase.label()
        )
    }

    fn write(&self, line: &str) {
        // A closed stdout (`| head`) is not worth a panic.
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// A duration in a few characters: `0.4ms`, `87ms`, `1.2s`.
pub(crate) fn short(d: Duration) -> String {
    if d < Duration::from_millis(10) {
        format!("{:.1}ms", d.as_secs_f64() * 1000.0)
    } else if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use seawall::RejectionReason;

    #[test]
    fn only_changes_of_state_are_printed_as_they_happen() {
        assert!(is_transition(&EventKind::CircuitClosed));
        assert!(is_transition(&EventKind::CooldownStarted {
            duration: Duration::from_secs(1)
        }));
        assert!(!is_transition(&EventKind::FallbackExecuted));
        assert!(!is_transition(&EventKind::Rejected {
            reason: RejectionReason::CircuitOpen,
            retry_after: None,
        }));
    }

    #[test]
    fn the_circuit_state_follows_its_events() {
        let open = Circuit::Closed.after(&EventKind::CircuitOpened {
            cooldown: Duration::from_secs(1),
        });
        assert_eq!(open, Circuit::Open);
        assert_eq!(open.after(&EventKind::FallbackExecuted), Circuit::Open);
        assert_eq!(open.after(&EventKind::CircuitHalfOpened), Circuit::HalfOpen);
        assert_eq!(
            Circuit::HalfOpen.after(&EventKind::CircuitClosed),
            Circuit::Closed
        );
    }

    #[test]
    fn short_durations() {
        assert_eq!(short(Duration::from_micros(420)), "0.4ms");
        assert_eq!(short(Duration::from_millis(87)), "87ms");
        assert_eq!(short(Duration::from_millis(1300)), "1.3s");
    }
}
