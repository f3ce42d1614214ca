//! The live log: every event of the protected pipeline, one short line each,
//! with the time since the start and the service's phase.
//!
//! Events are handed over a channel to a printing task, so the pipeline never
//! waits for the terminal. Within each 100 ms tick, identical lines are
//! printed once with a count (`x12`), and varying figures such as retry
//! delays are shown as a range (`12ms..87ms`): every event is counted, and
//! the flood stays readable.

use std::io::Write;
use std::time::{Duration, Instant};

use seawall::{AttemptOutcome, CallOutcome, Event, EventKind};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use crate::scenario::{Phase, Scenario};
use crate::style::{Colour, Style};

/// How often aggregated lines are printed.
const TICK: Duration = Duration::from_millis(100);

enum Message {
    Event { at: Instant, kind: EventKind },
    Finish,
}

/// The printing side of the live log.
#[derive(Debug)]
pub(crate) struct EventLog {
    sender: mpsc::UnboundedSender<Message>,
    printer: JoinHandle<()>,
}

impl EventLog {
    /// Starts the printing task.
    pub(crate) fn start(scenario: Scenario, style: Style) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        let printer = tokio::spawn(print_lines(receiver, scenario, style));
        EventLog { sender, printer }
    }

    /// A listener to register with `PipelineBuilder::on_event`.
    pub(crate) fn listener(&self) -> impl Fn(&Event<'_>) + Send + Sync + 'static {
        let sender = self.sender.clone();
        move |event: &Event<'_>| {
            let _ = sender.send(Message::Event {
                at: Instant::now(),
                kind: event.kind.clone(),
            });
        }
    }

    /// Prints what is pending and stops the printing task.
    pub(crate) async fn finish(self) {
        let _ = self.sender.send(Message::Finish);
        let _ = self.printer.await;
    }
}

/// One printed line, possibly standing for many identical events.
struct Line {
    at: Instant,
    colour: Colour,
    text: String,
    /// A figure that varies from event to event: its label and range.
    figure: Option<(&'static str, Duration, Duration)>,
    count: u32,
}

/// The printing task: folds the events of each tick, and announces each
/// phase of the service before the first line that happened in it.
async fn print_lines(
    mut receiver: mpsc::UnboundedReceiver<Message>,
    scenario: Scenario,
    style: Style,
) {
    let mut printer = Printer {
        scenario,
        style,
        shown: None,
    };
    let mut pending: Vec<Line> = Vec::new();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            message = receiver.recv() => match message {
                Some(Message::Event { at, kind }) => add(&mut pending, at, &kind),
                Some(Message::Finish) | None => break,
            },
            _ = tick.tick() => {
                printer.flush(&mut pending);
                printer.announce(scenario.phase_at(Instant::now()));
            }
        }
    }
    while let Ok(Message::Event { at, kind }) = receiver.try_recv() {
        add(&mut pending, at, &kind);
    }
    printer.flush(&mut pending);
}

fn add(pending: &mut Vec<Line>, at: Instant, kind: &EventKind) {
    // Calls and attempts that went well are the summary's business; a line
    // for each would drown the events that tell the story.
    if matches!(
        kind,
        EventKind::AttemptFinished {
            outcome: AttemptOutcome::Success,
            ..
        } | EventKind::CallFinished {
            outcome: CallOutcome::Success,
            ..
        }
    ) {
        return;
    }
    let (colour, text, figure) = describe(kind);
    if let Some(line) = pending.iter_mut().find(|l| l.text == text) {
        line.count += 1;
        if let (Some((_, lo, hi)), Some((_, d))) = (&mut line.figure, figure) {
            *lo = (*lo).min(d);
            *hi = (*hi).max(d);
        }
        return;
    }
    pending.push(Line {
        at,
        colour,
        text,
        figure: figure.map(|(label, d)| (label, d, d)),
        count: 1,
    });
}

/// The colour, the fixed text and the varying figure of an event.
fn describe(kind: &EventKind) -> (Colour, String, Option<(&'static str, Duration)>) {
    match kind {
        EventKind::RetryScheduled { attempt, delay } => (
            Colour::Yellow,
            format!("attempt {attempt} failed, retrying"),
            Some(("in", *delay)),
        ),
        EventKind::TimedOut { attempt, after } => (
            Colour::Yellow,
            format!("attempt {attempt} timed out after {}", short(*after)),
            None,
        ),
        EventKind::RetryGaveUp { .. } => (Colour::Yellow, kind.to_string(), None),
        EventKind::FallbackExecuted => (
            Colour::Cyan,
            "fallback served the last good answer".into(),
            None,
        ),
        EventKind::Rejected {
            reason,
            retry_after,
        } => (
            Colour::Magenta,
            format!("rejected: {reason}"),
            retry_after.map(|d| ("retry after", d)),
        ),
        EventKind::Deferred { reason, wait } => (
            Colour::Blue,
            format!("deferred by {reason}"),
            Some(("for up to", *wait)),
        ),
        EventKind::CircuitOpened { cooldown } => (
            Colour::Red,
            format!("circuit OPEN: calls refused for {}", short(*cooldown)),
            None,
        ),
        EventKind::CircuitHalfOpened => (
            Colour::Yellow,
            "circuit half-open: one probe goes through".into(),
            None,
        ),
        EventKind::CircuitClosed => (Colour::Green, "circuit closed".into(), None),
        EventKind::CooldownStarted { duration } => (
            Colour::Blue,
            format!(
                "cooldown: every caller pauses {} (Retry-After)",
                short(*duration)
            ),
            None,
        ),
        EventKind::AttemptFinished {
            attempt,
            duration,
            outcome,
        } => (
            match outcome {
                AttemptOutcome::Success => Colour::Green,
                _ => Colour::Yellow,
            },
            format!("attempt {attempt} ended: {}", outcome.as_str()),
            Some(("in", *duration)),
        ),
        EventKind::CallFinished {
            attempts,
            duration,
            outcome,
        } => {
            let what = match outcome {
                CallOutcome::Rejected(reason) => format!("rejected ({reason})"),
                other => other.as_str().to_owned(),
            };
            let colour = match outcome {
                CallOutcome::Success => Colour::Green,
                CallOutcome::Fallback => Colour::Cyan,
                _ => Colour::Red,
            };
            (
                colour,
                format!("call ended: {what} after {attempts} attempt(s)"),
                Some(("in", *duration)),
            )
        }
        EventKind::StoreUnavailable { .. } => (Colour::Red, kind.to_string(), None),
        other => (Colour::Dim, other.to_string(), None),
    }
}

/// Writes lines and phase banners to stdout.
struct Printer {
    scenario: Scenario,
    style: Style,
    /// The last phase announced.
    shown: Option<Phase>,
}

impl Printer {
    fn flush(&mut self, pending: &mut Vec<Line>) {
        for line in pending.drain(..) {
            self.announce(self.scenario.phase_at(line.at));
            let mut text = line.text;
            if let Some((label, lo, hi)) = line.figure {
                let (lo, hi) = (short(lo), short(hi));
                if lo == hi {
                    text += &format!(" {label} {lo}");
                } else {
                    text += &format!(" {label} {lo}..{hi}");
                }
            }
            if line.count > 1 {
                text += &format!(" x{}", line.count);
            }
            let stamp = format!(
                "{:>7.2}s  {:<16}",
                self.scenario.elapsed(line.at).as_secs_f64(),
                self.scenario.phase_at(line.at).label()
            );
            self.write(&format!(
                "{} {}",
                self.style.paint(Colour::Dim, &stamp),
                self.style.paint(line.colour, &text)
            ));
        }
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
    fn identical_events_fold_into_one_line_with_a_range() {
        let mut pending = Vec::new();
        let now = Instant::now();
        for ms in [40, 12, 87] {
            let kind = EventKind::RetryScheduled {
                attempt: 1,
                delay: Duration::from_millis(ms),
            };
            add(&mut pending, now, &kind);
        }
        let rejected = EventKind::Rejected {
            reason: RejectionReason::CircuitOpen,
            retry_after: None,
        };
        add(&mut pending, now, &rejected);
        assert_eq!(pending.len(), 2);
        let retry = &pending[0];
        assert_eq!(retry.count, 3);
        assert_eq!(
            retry.figure,
            Some(("in", Duration::from_millis(12), Duration::from_millis(87)))
        );
    }

    #[test]
    fn short_durations() {
        assert_eq!(short(Duration::from_micros(420)), "0.4ms");
        assert_eq!(short(Duration::from_millis(87)), "87ms");
        assert_eq!(short(Duration::from_millis(1300)), "1.3s");
    }
}
