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
//! never waits for the terminal. The same task writes each second and each
//! change of the circuit to the [`Timeline`] the live page draws.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use seawall::{Event, EventKind, RejectionReason};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use crate::report::Stats;
use crate::say;
use crate::scenario::{Group, Phase, Scenario};
use crate::service::Hits;
use crate::style::{Colour, Style};
use crate::timeline::{GroupSecond, Second, Timeline};

/// How often the status lines are printed.
const TICK: Duration = Duration::from_secs(1);

enum Message {
    Event { at: Instant, kind: EventKind },
    Finish,
}

/// What the live view shows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct View {
    /// The groups of clients of this process.
    pub(crate) groups: &'static [Group],
    /// The circuit lives in a store shared with a process that opens it:
    /// a refusal by an open circuit this process never saw open tells it
    /// the circuit is open (the second process of `--redis`).
    pub(crate) shared_circuit: bool,
}

impl View {
    /// Both groups of the live run, state of this process's own.
    pub(crate) const BOTH_GROUPS: View = View {
        groups: &Group::ALL,
        shared_circuit: false,
    };
}

/// The printing side of the live view.
#[derive(Debug)]
pub(crate) struct EventLog {
    sender: mpsc::UnboundedSender<Message>,
    printer: JoinHandle<()>,
    view: View,
}

impl EventLog {
    /// Starts the printing task, which reads the callers' answers from
    /// `stats` and the service's requests from `hits`, prints them and
    /// writes them to `timeline`.
    pub(crate) fn start(
        scenario: Scenario,
        style: Style,
        stats: Arc<Stats>,
        hits: Arc<Hits>,
        timeline: Arc<Timeline>,
        view: View,
    ) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        let printer = Printer {
            scenario,
            style,
            view,
            shown: None,
            circuit: Circuit::Closed,
            requests_seen: [0; Group::ALL.len()],
            timeline,
        };
        let printer = tokio::spawn(print_lines(receiver, printer, stats, hits));
        EventLog {
            sender,
            printer,
            view,
        }
    }

    /// A listener to register with `PipelineBuilder::on_event`.
    pub(crate) fn listener(&self) -> impl Fn(&Event<'_>) + Send + Sync + 'static {
        let sender = self.sender.clone();
        let shared_circuit = self.view.shared_circuit;
        // The circuit as the events sent so far tell it: a refusal is sent
        // only when it changes that (once, not for every refused call).
        let believed = Mutex::new(Circuit::Closed);
        move |event: &Event<'_>| {
            let send = if is_transition(&event.kind) {
                true
            } else if shared_circuit && is_circuit_refusal(&event.kind) {
                let mut believed = believed.lock().unwrap_or_else(|e| e.into_inner());
                let next = believed.after(&event.kind, true);
                std::mem::replace(&mut *believed, next) != next
            } else {
                false
            };
            if shared_circuit && is_transition(&event.kind) {
                let mut believed = believed.lock().unwrap_or_else(|e| e.into_inner());
                *believed = believed.after(&event.kind, true);
            }
            if send {
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

/// A refusal by an open circuit.
fn is_circuit_refusal(kind: &EventKind) -> bool {
    matches!(
        kind,
        EventKind::Rejected {
            reason: RejectionReason::CircuitOpen,
            ..
        }
    )
}

/// The protected pipeline's circuit, as its events tell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Circuit {
    /// Calls go through.
    Closed,
    /// Calls are refused.
    Open,
    /// A probe goes through.
    HalfOpen,
}

impl Circuit {
    /// The state after `kind`; with `shared`, a refusal by an open circuit
    /// while closed means another process opened it.
    fn after(self, kind: &EventKind, shared: bool) -> Circuit {
        match kind {
            EventKind::CircuitOpened { .. } => Circuit::Open,
            EventKind::CircuitHalfOpened => Circuit::HalfOpen,
            EventKind::CircuitClosed => Circuit::Closed,
            kind if shared && self == Circuit::Closed && is_circuit_refusal(kind) => Circuit::Open,
            _ => self,
        }
    }

    /// A stable name, for the page.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Circuit::Closed => "closed",
            Circuit::Open => "open",
            Circuit::HalfOpen => "half_open",
        }
    }

    /// The position of the state in `[closed, open, half_open]`.
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    fn show(self) -> (Colour, &'static str) {
        match self {
            Circuit::Closed => (Colour::Green, "circuit closed"),
            Circuit::Open => (Colour::Red, "circuit OPEN"),
            Circuit::HalfOpen => (Colour::Yellow, "circuit half-open"),
        }
    }
}

/// The printing task: a transition line for each change of state, the
/// status lines once a second, a banner for each phase of the service.
async fn print_lines(
    mut receiver: mpsc::UnboundedReceiver<Message>,
    mut printer: Printer,
    stats: Arc<Stats>,
    hits: Arc<Hits>,
) {
    // Banners from the phase the view starts in (the second process of
    // `--redis` starts halfway).
    let phase = printer.scenario.phase_at(Instant::now());
    printer.shown = phase.index().checked_sub(1).map(|i| Phase::ALL[i]);
    printer.announce(phase);
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
        EventKind::Rejected { .. } => (
            Colour::Red,
            "circuit OPEN in the shared store: refused before this process sent a single \
             request, another process opened it; the fallback answers"
                .into(),
        ),
        other => (Colour::Red, other.to_string()),
    }
}

/// Writes status lines, transitions and phase banners to stdout, and the
/// seconds and the circuit's changes to the timeline.
struct Printer {
    scenario: Scenario,
    style: Style,
    view: View,
    /// The last phase announced.
    shown: Option<Phase>,
    circuit: Circuit,
    /// Requests per group counted at the last status.
    requests_seen: [u64; Group::ALL.len()],
    timeline: Arc<Timeline>,
}

impl Printer {
    /// The line of a change of state, stamped with its time and phase.
    fn transition(&mut self, at: Instant, kind: &EventKind) {
        let before = self.circuit;
        self.circuit = self.circuit.after(kind, self.view.shared_circuit);
        let since_start = self.scenario.elapsed(at);
        if self.circuit != before {
            self.timeline.circuit(since_start, self.circuit);
        }
        if let EventKind::CooldownStarted { duration } = kind {
            self.timeline.cooldown(since_start, *duration);
        }
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
        let phase = self.scenario.phase_at(middle);
        let recent = stats.take_recent();
        let requests = Group::ALL.map(|g| hits.total(g));
        let groups = Group::ALL.map(|g| {
            let (tally, i) = (&recent[g.index()], g.index());
            GroupSecond {
                reached: requests[i].saturating_sub(self.requests_seen[i]),
                answers: tally.answers(),
                p50: tally.latency(50),
                p99: tally.latency(99),
            }
        });
        self.requests_seen = requests;
        if groups.iter().all(|g| *g == GroupSecond::default()) {
            return;
        }
        self.timeline.push(Second {
            at: self.scenario.elapsed(now),
            phase,
            circuit: self.circuit,
            groups,
        });
        self.announce(phase);
        for (i, group) in self.view.groups.iter().enumerate() {
            let second = &groups[group.index()];
            let a = second.answers;
            let stamp = format!(
                "{:>6.1}s  {:<16}",
                self.scenario.elapsed(now).as_secs_f64(),
                phase.label()
            );
            let stamp = if i == 0 {
                stamp
            } else {
                " ".repeat(stamp.len())
            };
            let mut line = format!(
                "{} {:<12} {:>5} to the service | answers: {:>5} fresh {} {}",
                self.style.paint(Colour::Dim, &stamp),
                group.name(),
                second.reached,
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
            if *group == Group::Protected {
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
        say(&format!("{line}\n"));
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
        for shared in [false, true] {
            let open = Circuit::Closed.after(
                &EventKind::CircuitOpened {
                    cooldown: Duration::from_secs(1),
                },
                shared,
            );
            assert_eq!(open, Circuit::Open);
            assert_eq!(
                open.after(&EventKind::FallbackExecuted, shared),
                Circuit::Open
            );
            assert_eq!(
                open.after(&EventKind::CircuitHalfOpened, shared),
                Circuit::HalfOpen
            );
            assert_eq!(
                Circuit::HalfOpen.after(&EventKind::CircuitClosed, shared),
                Circuit::Closed
            );
        }
    }

    #[test]
    fn a_refusal_reveals_a_shared_circuit_opened_elsewhere() {
        let refused = EventKind::Rejected {
            reason: RejectionReason::CircuitOpen,
            retry_after: None,
        };
        // In one process the refusal may overtake the event of the call
        // that opened the circuit: it tells nothing.
        assert_eq!(Circuit::Closed.after(&refused, false), Circuit::Closed);
        assert_eq!(Circuit::Closed.after(&refused, true), Circuit::Open);
        // Half-open with the probe taken refuses too: still half-open.
        assert_eq!(Circuit::HalfOpen.after(&refused, true), Circuit::HalfOpen);
        let full = EventKind::Rejected {
            reason: RejectionReason::BulkheadFull,
            retry_after: None,
        };
        assert_eq!(Circuit::Closed.after(&full, true), Circuit::Closed);
    }

    #[test]
    fn short_durations() {
        assert_eq!(short(Duration::from_micros(420)), "0.4ms");
        assert_eq!(short(Duration::from_millis(87)), "87ms");
        assert_eq!(short(Duration::from_millis(1300)), "1.3s");
    }
}
