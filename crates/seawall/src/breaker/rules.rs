//! The circuit breaker's rules, as pure functions.
//!
//! Each rule takes the plain state of a circuit ([`State`]), its
//! parameters, the input and the time, and returns its answer and the next
//! state (`None`: unchanged). No atomics, no I/O: the memory store's
//! [`Circuit`](super::machine::Circuit) applies them in a compare-and-swap
//! loop, and the reference model
//! (`seawall::model::breaker`, feature `test-util`) states the same rules
//! plainly for every store to be checked against.
//!
//! A window (count ring or time buckets) is kept beside the state: the
//! record rule says when a call goes into it ([`Record::Window`]) and
//! [`window_trips`] judges its counts.

use std::time::Duration;

use super::{BreakerMode, CircuitBreaker, CircuitControl, CircuitState, CircuitTransition};
use crate::clock::duration_nanos;
use crate::store::Outcome;

const NANOS_PER_MS: u64 = 1_000_000;

/// Generations are counted modulo 2^13; a permit carries the masked value.
pub(crate) const GENERATION_MASK: u64 = (1 << 13) - 1;
/// Trips saturate here (cooldown growth stops growing past it).
pub(crate) const MAX_TRIPS: u32 = (1 << 6) - 1;
/// `half_open_calls` is clamped to this (the probe counters have 21 bits).
pub(crate) const MAX_HALF_OPEN_CALLS: u32 = (1 << 21) - 1;
/// The end of a cooldown is kept in whole milliseconds below this value;
/// this value itself means "open until the maximum instant" (`u64::MAX`
/// nanoseconds), so that an end too late to be represented never lands
/// earlier than asked.
pub(crate) const OPEN_FOREVER_MS: u64 = (1 << 42) - 1;

/// The kind of state a circuit is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Closed = 0,
    Open = 1,
    HalfOpen = 2,
    Isolated = 3,
    Disabled = 4,
}

/// The kinds whose admission is `Ok` and changes nothing (a bit per
/// [`Kind`]): the single-load check of a closed circuit tests this set.
pub(crate) const PASS_KINDS: u64 = (1 << Kind::Closed as u64) | (1 << Kind::Disabled as u64);

impl Kind {
    /// `true` for the kinds in [`PASS_KINDS`].
    #[inline]
    pub(crate) fn passes(self) -> bool {
        (PASS_KINDS >> self as u64) & 1 == 1
    }

    pub(crate) fn state(self) -> CircuitState {
        match self {
            Kind::Closed => CircuitState::Closed,
            Kind::Open => CircuitState::Open,
            Kind::HalfOpen => CircuitState::HalfOpen,
            Kind::Isolated => CircuitState::Isolated,
            Kind::Disabled => CircuitState::Disabled,
        }
    }
}

/// The state of a circuit, without its window.
///
/// `payload` means, by kind: closed, failures in a row (consecutive mode);
/// open, the end of the cooldown in whole milliseconds rounded up
/// ([`OPEN_FOREVER_MS`]: the maximum instant); half-open, the probes
/// admitted (bits 0..21) and succeeded (bits 21..42); isolated and
/// disabled, the failures in a row they were entered with (consecutive
/// mode: shown, not counted on); otherwise 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct State {
    pub(crate) kind: Kind,
    /// Trips since the circuit last closed, at most [`MAX_TRIPS`].
    pub(crate) trips: u32,
    /// +1 on every transition, modulo 2^13.
    pub(crate) generation: u64,
    pub(crate) payload: u64,
    /// Open by [`CircuitControl::OpenFor`], or half-open after it: the
    /// open period was not a cooldown of the trips, so its length (which
    /// the store keeps beside the state) is the hint of a full half-open
    /// circuit. Cleared by every other transition.
    pub(crate) opened_for: bool,
}

const PROBE_BITS: u32 = 21;
const PROBE_MASK: u64 = (1 << PROBE_BITS) - 1;

impl State {
    /// A closed circuit that never moved.
    pub(crate) const CLOSED: State = State {
        kind: Kind::Closed,
        trips: 0,
        generation: 0,
        payload: 0,
        opened_for: false,
    };

    /// The state after a transition to `kind`: the next generation (not
    /// [`opened_for`](Self::opened_for)).
    fn next(self, kind: Kind, trips: u32, payload: u64) -> State {
        State {
            kind,
            trips: trips.min(MAX_TRIPS),
            generation: (self.generation + 1) & GENERATION_MASK,
            payload,
            opened_for: false,
        }
    }

    /// A new round of probes (the next generation), its first probe
    /// admitted, after the same open period as `self`.
    fn first_probe(self) -> State {
        State {
            opened_for: self.opened_for,
            ..self.next(Kind::HalfOpen, self.trips, probes_payload(1, 0))
        }
    }

    /// The failures in a row a closed circuit has counted (consecutive
    /// mode), which isolating or disabling it keeps on show; 0 for other
    /// states.
    fn in_a_row(self) -> u64 {
        match self.kind {
            Kind::Closed | Kind::Isolated | Kind::Disabled => self.payload,
            _ => 0,
        }
    }

    /// Half-open: `(admitted, succeeded)` probes.
    pub(crate) fn probes(self) -> (u32, u32) {
        (
            (self.payload & PROBE_MASK) as u32,
            ((self.payload >> PROBE_BITS) & PROBE_MASK) as u32,
        )
    }

    /// Open: the end of the cooldown, in nanoseconds.
    pub(crate) fn open_until_ns(self) -> u64 {
        ms_instant(self.payload)
    }

    /// `true` when moving from `self` to `next` is a transition (the time
    /// in state restarts).
    pub(crate) fn moved_to(self, next: State) -> bool {
        self.generation != next.generation
    }

    /// `true` when `next` starts new counts: entering half-open (the probes'
    /// own counts) or closed (a fresh window).
    pub(crate) fn starts_counts(self, next: State) -> bool {
        self.moved_to(next) && matches!(next.kind, Kind::Closed | Kind::HalfOpen)
    }
}

/// An instant kept in whole milliseconds (by [`open_until_ms`]), in
/// nanoseconds: [`OPEN_FOREVER_MS`] is the maximum instant.
pub(crate) fn ms_instant(ms: u64) -> u64 {
    if ms >= OPEN_FOREVER_MS {
        u64::MAX
    } else {
        ms * NANOS_PER_MS
    }
}

fn probes_payload(admitted: u32, succeeded: u32) -> u64 {
    (u64::from(admitted) & PROBE_MASK) | ((u64::from(succeeded) & PROBE_MASK) << PROBE_BITS)
}

/// The end of a cooldown of `cooldown` starting at `now_ns`, in whole
/// milliseconds rounded up (a circuit never half-opens before its cooldown
/// is over); [`OPEN_FOREVER_MS`] when that end cannot be represented.
pub(crate) fn open_until_ms(now_ns: u64, cooldown: Duration) -> u64 {
    let end = now_ns.saturating_add(duration_nanos(cooldown));
    end.div_ceil(NANOS_PER_MS).min(OPEN_FOREVER_MS)
}

/// A circuit breaker configuration, prepared for the rules.
#[derive(Debug, Clone)]
pub(crate) struct BreakerParams {
    pub(crate) spec: CircuitBreaker,
    pub(crate) half_open_calls: u32,
    pub(crate) slow_call_ns: Option<u64>,
    /// Calls needed before the rates are judged (a count window never holds
    /// more than its size).
    pub(crate) minimum_calls: u64,
    /// The longest a round of probes blocks the next one.
    pub(crate) max_half_open: Option<Duration>,
}

impl BreakerParams {
    pub(crate) fn new(spec: &CircuitBreaker) -> Self {
        let minimum_calls = match spec.mode {
            BreakerMode::CountWindow(n) => spec.minimum_calls.min(n),
            _ => spec.minimum_calls,
        };
        BreakerParams {
            spec: spec.clone(),
            half_open_calls: spec.half_open_calls.clamp(1, MAX_HALF_OPEN_CALLS),
            slow_call_ns: spec
                .slow_call_rate
                .map(|_| duration_nanos(spec.slow_call_duration)),
            minimum_calls: u64::from(minimum_calls),
            max_half_open: spec.max_half_open,
        }
    }

    /// The end of a round of probes starting at `now_ns`, in whole
    /// milliseconds rounded up ([`OPEN_FOREVER_MS`]: never), when the
    /// breaker limits the time in half-open.
    pub(crate) fn round_end_ms(&self, now_ns: u64) -> Option<u64> {
        self.max_half_open.map(|max| open_until_ms(now_ns, max))
    }

    /// A call lasting `duration` is slow.
    #[inline]
    pub(crate) fn is_slow(&self, duration: Duration) -> bool {
        self.is_slow_ns(duration_nanos(duration))
    }

    /// A call lasting `duration_ns` nanoseconds is slow.
    #[inline]
    pub(crate) fn is_slow_ns(&self, duration_ns: u64) -> bool {
        self.slow_call_ns.is_some_and(|slow| duration_ns >= slow)
    }
}

/// What an admission is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Admit {
    /// `Ok((generation, probe))`, or the retry-after of the rejection.
    pub(crate) decision: Result<(u64, bool), Option<Duration>>,
    /// Open to half-open, when this admission caused it.
    pub(crate) transition: Option<CircuitTransition>,
}

/// The admission rule.
///
/// Closed and disabled admit. Isolated refuses without a hint. Open refuses
/// until the end of its cooldown, with the time left; the first call after
/// it half-opens the circuit and is its first probe. Half-open admits up to
/// `half_open_calls` probes and then refuses with the length of the
/// cooldown that just ended as the hint (the probes' verdict is due by
/// then): the cooldown of the trips, or after an explicit open
/// ([`State::opened_for`]) `opened_for`, the duration it was opened for,
/// which the store keeps beside the state (`None`: not known, the cooldown
/// of the trips). Unless the round of probes is over: with
/// `max_half_open`, once `now_ns` reaches `round_end_ms` (the end of the
/// current round, kept by the store beside the state; `None` when not
/// known yet, which never ends a round), the call starts a new round, a
/// new generation whose first probe it is
/// ([`CircuitTransition::ProbesExpired`]).
#[inline]
pub(crate) fn admit(
    s: State,
    p: &BreakerParams,
    now_ns: u64,
    round_end_ms: Option<u64>,
    opened_for: Option<Duration>,
) -> (Admit, Option<State>) {
    let refuse = |hint| Admit {
        decision: Err(hint),
        transition: None,
    };
    if s.kind.passes() {
        let admit = Admit {
            decision: Ok((s.generation, false)),
            transition: None,
        };
        return (admit, None);
    }
    match s.kind {
        Kind::Open => {
            if let Some(left) = open_refusal(s, now_ns) {
                return (refuse(Some(left)), None);
            }
            let next = s.first_probe();
            let admit = Admit {
                decision: Ok((next.generation, true)),
                transition: Some(CircuitTransition::HalfOpened),
            };
            (admit, Some(next))
        }
        Kind::HalfOpen => {
            let (admitted, succeeded) = s.probes();
            if admitted >= p.half_open_calls {
                let over = p.max_half_open.is_some()
                    && round_end_ms.is_some_and(|end| now_ns >= ms_instant(end));
                if !over {
                    let ended = match opened_for.filter(|_| s.opened_for) {
                        Some(d) => d,
                        None => p.spec.cooldown_for_trip(s.trips),
                    };
                    return (refuse(Some(ended)), None);
                }
                let next = s.first_probe();
                let admit = Admit {
                    decision: Ok((next.generation, true)),
                    transition: Some(CircuitTransition::ProbesExpired),
                };
                return (admit, Some(next));
            }
            let next = State {
                payload: probes_payload(admitted + 1, succeeded),
                ..s
            };
            let admit = Admit {
                decision: Ok((s.generation, true)),
                transition: None,
            };
            (admit, Some(next))
        }
        _ => (refuse(None), None),
    }
}

/// An open circuit refuses until the end of its cooldown: the time left,
/// `None` once it is over (the next admission half-opens it).
#[inline]
pub(crate) fn open_refusal(s: State, now_ns: u64) -> Option<Duration> {
    let until = s.open_until_ns();
    (now_ns < until).then(|| Duration::from_nanos(until - now_ns))
}

/// Giving back the probe slot of a half-open admission of `generation`
/// (a cancelled probe, or one whose outcome is ignored).
pub(crate) fn release_probe(s: State, generation: u64) -> Option<State> {
    let (admitted, succeeded) = s.probes();
    if s.kind != Kind::HalfOpen || s.generation != generation & GENERATION_MASK || admitted == 0 {
        return None;
    }
    Some(State {
        payload: probes_payload(admitted - 1, succeeded),
        ..s
    })
}

/// An outcome, as the circuit sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Not counted (a probe gives its slot back).
    Ignored,
    /// A counted call.
    Call {
        /// The call failed.
        failure: bool,
        /// The call lasted at least the slow-call duration (with a slow-call
        /// rate configured).
        slow: bool,
    },
}

impl Verdict {
    #[inline]
    pub(crate) fn of(p: &BreakerParams, outcome: Outcome, duration: Duration) -> Verdict {
        match outcome {
            Outcome::Ignored => Verdict::Ignored,
            Outcome::Success => Verdict::Call {
                failure: false,
                slow: p.is_slow(duration),
            },
            Outcome::Failure => Verdict::Call {
                failure: true,
                slow: p.is_slow(duration),
            },
        }
    }
}

/// What recording an outcome does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Record {
    /// Nothing changes.
    Nothing,
    /// The state becomes `next`, with `transition` to report.
    Move {
        next: State,
        transition: Option<CircuitTransition>,
    },
    /// A closed circuit in a window mode: the call goes into the window;
    /// when `judge`, the window's counts (this call included) then go to
    /// [`window_trips`], and a trip is [`trip`] from this very state.
    Window {
        failure: bool,
        slow: bool,
        judge: bool,
    },
}

/// The record rule, for a call admitted in `generation` (as a probe when
/// `probe`).
///
/// A call of an older generation changes nothing (it was admitted before a
/// transition). Closed, consecutive mode: a failure adds one to the run and
/// trips at the threshold, a success ends the run. Closed, window mode: the
/// call goes into the window and the rates are judged when it failed or
/// was slow. Half-open: a failed or slow probe trips again (one more trip,
/// a longer cooldown with growth); a successful one counts, and the last
/// of `half_open_calls` closes the circuit. Open, isolated and disabled
/// circuits record nothing.
#[inline]
pub(crate) fn record(
    s: State,
    p: &BreakerParams,
    generation: u64,
    probe: bool,
    verdict: Verdict,
    now_ns: u64,
) -> Record {
    if s.generation != generation & GENERATION_MASK {
        return Record::Nothing;
    }
    let (failure, slow) = match verdict {
        Verdict::Ignored => {
            return match release_probe(s, generation).filter(|_| probe) {
                Some(next) => Record::Move {
                    next,
                    transition: None,
                },
                None => Record::Nothing,
            }
        }
        Verdict::Call { failure, slow } => (failure, slow),
    };
    match s.kind {
        Kind::Closed => match p.spec.mode {
            BreakerMode::ConsecutiveFailures(limit) => {
                if !failure {
                    return if s.payload == 0 {
                        Record::Nothing
                    } else {
                        Record::Move {
                            next: State { payload: 0, ..s },
                            transition: None,
                        }
                    };
                }
                let in_a_row = s.payload.saturating_add(1);
                if in_a_row >= u64::from(limit) {
                    let (next, transition) = trip(s, p, now_ns);
                    Record::Move {
                        next,
                        transition: Some(transition),
                    }
                } else {
                    Record::Move {
                        next: State {
                            payload: in_a_row,
                            ..s
                        },
                        transition: None,
                    }
                }
            }
            _ => Record::Window {
                failure,
                slow,
                judge: failure || slow,
            },
        },
        Kind::HalfOpen => {
            if failure || slow {
                let (next, transition) = trip(s, p, now_ns);
                return Record::Move {
                    next,
                    transition: Some(transition),
                };
            }
            let (admitted, succeeded) = s.probes();
            let succeeded = succeeded + 1;
            if succeeded >= p.half_open_calls {
                Record::Move {
                    next: s.next(Kind::Closed, 0, 0),
                    transition: Some(CircuitTransition::Closed),
                }
            } else {
                Record::Move {
                    next: State {
                        payload: probes_payload(admitted, succeeded),
                        ..s
                    },
                    transition: None,
                }
            }
        }
        Kind::Open | Kind::Isolated | Kind::Disabled => Record::Nothing,
    }
}

/// The rates of a window's `(calls, failures, slow calls)` open the circuit:
/// at least `minimum_calls` calls and a failure rate or slow-call rate at
/// or above its threshold.
pub(crate) fn window_trips(p: &BreakerParams, (calls, failures, slow): (u64, u64, u64)) -> bool {
    if calls == 0 || calls < p.minimum_calls {
        return false;
    }
    let calls = calls as f64;
    failures as f64 / calls >= p.spec.failure_rate
        || p.spec
            .slow_call_rate
            .is_some_and(|threshold| slow as f64 / calls >= threshold)
}

/// Opening the circuit from closed (the first trip) or half-open (one more
/// trip, saturating at [`MAX_TRIPS`]): open until the end of the cooldown
/// for that trip.
pub(crate) fn trip(s: State, p: &BreakerParams, now_ns: u64) -> (State, CircuitTransition) {
    let trips = match s.kind {
        Kind::HalfOpen => s.trips.saturating_add(1),
        _ => 1,
    }
    .min(MAX_TRIPS);
    let cooldown = p.spec.cooldown_for_trip(trips);
    let next = s.next(Kind::Open, trips, open_until_ms(now_ns, cooldown));
    (next, CircuitTransition::Opened { cooldown })
}

/// Manual control at `now_ns`: the next state and the transition to
/// report, `None` when nothing changes. Isolating an isolated circuit,
/// disabling a disabled one or enabling one that is not disabled changes
/// nothing; a reset always starts a new generation with an empty window
/// and no trip history (reported when the circuit was not closed), and so
/// does enabling a disabled circuit. Isolating and disabling keep the
/// failures in a row on show (consecutive mode). Opening for `d` opens
/// until `now_ns + d` (whole milliseconds, rounded up) from any state,
/// keeping the trips; the store keeps `d` beside the state
/// ([`State::opened_for`]).
pub(crate) fn control(
    s: State,
    control: CircuitControl,
    now_ns: u64,
) -> Option<(State, Option<CircuitTransition>)> {
    match control {
        CircuitControl::OpenFor(d) => Some((
            State {
                opened_for: true,
                ..s.next(Kind::Open, s.trips, open_until_ms(now_ns, d))
            },
            Some(CircuitTransition::Opened { cooldown: d }),
        )),
        CircuitControl::Enable if s.kind != Kind::Disabled => None,
        CircuitControl::Enable => {
            Some((s.next(Kind::Closed, 0, 0), Some(CircuitTransition::Closed)))
        }
        CircuitControl::Isolate if s.kind == Kind::Isolated => None,
        CircuitControl::Isolate => Some((
            s.next(Kind::Isolated, s.trips, s.in_a_row()),
            Some(CircuitTransition::Opened {
                cooldown: Duration::MAX,
            }),
        )),
        CircuitControl::ForceClose if s.kind == Kind::Disabled => None,
        CircuitControl::ForceClose => Some((
            s.next(Kind::Disabled, s.trips, s.in_a_row()),
            Some(CircuitTransition::Closed),
        )),
        CircuitControl::Reset => Some((
            s.next(Kind::Closed, 0, 0),
            (s.kind != Kind::Closed).then_some(CircuitTransition::Closed),
        )),
    }
}

/// The `(calls, failures, slow calls)` that the metrics show.
///
/// Half-open: the probes' own counts (a failed or slow probe trips at once,
/// so those still counted are successes). Consecutive mode: the failures
/// in a row of a closed circuit, and those an isolated or disabled one was
/// entered with; nothing otherwise. Window modes: the window, `window`
/// (the one that opened the circuit while open; empty after a failed
/// probe; as it was when the circuit was isolated or disabled).
pub(crate) fn counts(
    s: State,
    p: &BreakerParams,
    window: Option<(u64, u64, u64)>,
) -> (u64, u64, u64) {
    if s.kind == Kind::HalfOpen {
        let (_, succeeded) = s.probes();
        return (u64::from(succeeded), 0, 0);
    }
    match (p.spec.mode, window) {
        (BreakerMode::ConsecutiveFailures(_), _) | (_, None) => {
            let in_a_row = s.in_a_row();
            (in_a_row, in_a_row, 0)
        }
        (_, Some(counts)) => counts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn params(b: CircuitBreaker) -> BreakerParams {
        BreakerParams::new(&b)
    }

    #[test]
    fn open_until_never_lands_before_the_end() {
        assert_eq!(open_until_ms(0, Duration::from_millis(100)), 100);
        assert_eq!(
            open_until_ms(NANOS_PER_MS / 2, Duration::from_millis(100)),
            101
        );
        assert_eq!(open_until_ms(u64::MAX, Duration::MAX), OPEN_FOREVER_MS);
        // The last representable millisecond, and the first that is not.
        let last = (OPEN_FOREVER_MS - 1) * NANOS_PER_MS;
        assert_eq!(open_until_ms(last, Duration::ZERO), OPEN_FOREVER_MS - 1);
        assert_eq!(open_until_ms(last + 1, Duration::ZERO), OPEN_FOREVER_MS);
    }

    #[test]
    fn a_trip_late_in_the_clock_stays_open_until_the_maximum_instant() {
        let p = params(CircuitBreaker::consecutive_failures(1).cooldown(Duration::from_secs(30)));
        for now in [
            u64::MAX,
            u64::MAX - 1,
            u64::MAX - 30 * S,
            u64::MAX - 30 * S + 1,
            OPEN_FOREVER_MS * NANOS_PER_MS - 10 * S,
            OPEN_FOREVER_MS * NANOS_PER_MS,
        ] {
            let (next, _) = trip(State::CLOSED, &p, now);
            let until = next.open_until_ns();
            assert!(
                until >= now.saturating_add(30 * S),
                "at {now}: open until {until}, before the end of the cooldown"
            );
            let later = now.saturating_add(29 * S).min(u64::MAX - 1);
            let (a, moved) = admit(next, &p, later, None, None);
            assert_eq!(moved, None, "at {now}: half-opened early");
            assert!(matches!(a.decision, Err(Some(_))), "at {now}: {a:?}");
        }
    }

    #[test]
    fn a_full_half_open_circuit_hints_the_cooldown() {
        let p = params(
            CircuitBreaker::consecutive_failures(1)
                .cooldown(Duration::from_secs(10))
                .cooldown_growth(2.0, Duration::from_secs(60)),
        );
        let (open, _) = trip(State::CLOSED, &p, 0);
        let (_, half) = admit(open, &p, 10 * S, None, None);
        let half = half.expect("half-opened");
        let (a, _) = admit(half, &p, 10 * S, None, None);
        assert_eq!(a.decision, Err(Some(Duration::from_secs(10))));
        let (reopened, _) = trip(half, &p, 10 * S);
        let (_, half) = admit(reopened, &p, 30 * S, None, None);
        let (a, _) = admit(half.expect("half-opened"), &p, 30 * S, None, None);
        assert_eq!(a.decision, Err(Some(Duration::from_secs(20))));
    }

    #[test]
    fn a_round_of_probes_gives_way_at_its_end_only() {
        let p = params(
            CircuitBreaker::consecutive_failures(1)
                .cooldown(Duration::from_secs(10))
                .half_open_calls(2)
                .max_half_open(Duration::from_millis(1500)),
        );
        let (open, _) = trip(State::CLOSED, &p, 0);
        let (first, half) = admit(open, &p, 10 * S, None, None);
        let half = half.expect("half-opened");
        let end = p.round_end_ms(10 * S).expect("limited");
        assert_eq!(end, 11_500);
        let (_, half) = admit(half, &p, 10 * S, Some(end), None);
        let half = half.expect("second probe");
        // Every slot taken: refused until the end of the round, whatever
        // is known of it; at the end, a new round if the end is known.
        let just_before = 11_500 * NANOS_PER_MS - 1;
        for round in [None, Some(end)] {
            let (a, next) = admit(half, &p, just_before, round, None);
            assert_eq!(
                (a.decision, next),
                (Err(Some(Duration::from_secs(10))), None)
            );
        }
        assert_eq!(
            admit(half, &p, 12 * S, None, None).1,
            None,
            "an unknown end"
        );
        let (a, next) = admit(half, &p, 11_500 * NANOS_PER_MS, Some(end), None);
        let next = next.expect("a new round");
        assert_eq!(a.transition, Some(CircuitTransition::ProbesExpired));
        assert_eq!(a.decision, Ok((next.generation, true)));
        assert_eq!(
            (next.kind, next.probes(), next.trips),
            (Kind::HalfOpen, (1, 0), 1)
        );
        assert!(half.moved_to(next) && half.starts_counts(next));
        // The old round's probes are of an older generation now.
        let (g, _) = first.decision.unwrap();
        let late = Verdict::Call {
            failure: true,
            slow: false,
        };
        assert_eq!(record(next, &p, g, true, late, 12 * S), Record::Nothing);
        // Without a limit, nothing ever ends a round.
        let unlimited = params(CircuitBreaker::consecutive_failures(1).half_open_calls(2));
        assert_eq!(admit(half, &unlimited, u64::MAX, Some(0), None).1, None);
    }

    #[test]
    fn after_an_explicit_open_a_full_half_open_circuit_hints_its_duration() {
        let p = params(
            CircuitBreaker::consecutive_failures(1)
                .cooldown(Duration::from_secs(10))
                .max_half_open(Duration::from_secs(1)),
        );
        let d = Duration::from_secs(60);
        let (open, _) = control(State::CLOSED, CircuitControl::OpenFor(d), 0).unwrap();
        assert!(open.opened_for);
        let (_, half) = admit(open, &p, 60 * S, None, Some(d));
        let half = half.expect("half-opened");
        assert!(half.opened_for, "half-open after the explicit open");
        let (a, _) = admit(half, &p, 60 * S, None, Some(d));
        assert_eq!(a.decision, Err(Some(d)));
        // Not known to the store: the cooldown of the trips.
        let (a, _) = admit(half, &p, 60 * S, None, None);
        assert_eq!(a.decision, Err(Some(Duration::from_secs(10))));
        // A new round of probes follows the same open period.
        let (_, round) = admit(half, &p, 61 * S, Some(61_000), Some(d));
        assert!(round.expect("a new round").opened_for);
        // A trip is a cooldown: the duration no longer counts.
        let (reopened, _) = trip(half, &p, 60 * S);
        assert!(!reopened.opened_for);
        let (_, half) = admit(reopened, &p, 70 * S, None, Some(d));
        let (a, _) = admit(half.expect("half-opened"), &p, 70 * S, None, Some(d));
        assert_eq!(a.decision, Err(Some(Duration::from_secs(10))));
    }

    #[test]
    fn isolating_or_disabling_keeps_the_failures_in_a_row() {
        let p = params(CircuitBreaker::consecutive_failures(5));
        let closed = State {
            payload: 2,
            ..State::CLOSED
        };
        assert_eq!(counts(closed, &p, None), (2, 2, 0));
        let (disabled, _) = control(closed, CircuitControl::ForceClose, 0).unwrap();
        assert_eq!(counts(disabled, &p, None), (2, 2, 0));
        let (isolated, _) = control(disabled, CircuitControl::Isolate, 0).unwrap();
        assert_eq!(counts(isolated, &p, None), (2, 2, 0));
        // Nothing is counted on.
        let failure = Verdict::Call {
            failure: true,
            slow: false,
        };
        assert_eq!(
            record(disabled, &p, disabled.generation, false, failure, 0),
            Record::Nothing
        );
        // An open circuit has none to keep.
        let (open, _) = trip(closed, &p, 0);
        let (isolated, _) = control(open, CircuitControl::Isolate, 0).unwrap();
        assert_eq!(counts(isolated, &p, None), (0, 0, 0));
        let (enabled, _) = control(disabled, CircuitControl::Enable, 0).unwrap();
        assert_eq!(counts(enabled, &p, None), (0, 0, 0));
    }

    #[test]
    fn open_for_enable_and_disable() {
        let p = params(CircuitBreaker::consecutive_failures(1).cooldown(Duration::from_secs(10)));
        let d = Duration::from_millis(2500);
        let (open, t) = control(State::CLOSED, CircuitControl::OpenFor(d), S / 2).unwrap();
        assert_eq!(t, Some(CircuitTransition::Opened { cooldown: d }));
        assert_eq!(
            (open.kind, open.payload, open.trips),
            (Kind::Open, 3_000, 0)
        );
        let (a, _) = admit(open, &p, S, None, None);
        assert_eq!(a.decision, Err(Some(Duration::from_secs(2))));
        let (a, half) = admit(open, &p, 3 * S, None, None);
        assert_eq!(a.transition, Some(CircuitTransition::HalfOpened));
        // A failed probe trips with the first trip's cooldown.
        let (reopened, _) = trip(half.unwrap(), &p, 3 * S);
        assert_eq!((reopened.trips, reopened.open_until_ns()), (1, 13 * S));
        // open_for replaces the end of an open circuit, keeping the trips.
        let (again, _) = control(reopened, CircuitControl::OpenFor(Duration::ZERO), 4 * S).unwrap();
        assert_eq!((again.open_until_ns(), again.trips), (4 * S, 1));
        assert_eq!(control(again, CircuitControl::Enable, 4 * S), None);
        let (disabled, t) = control(again, CircuitControl::ForceClose, 4 * S).unwrap();
        assert_eq!(
            (disabled.kind, t),
            (Kind::Disabled, Some(CircuitTransition::Closed))
        );
        assert_eq!(control(disabled, CircuitControl::ForceClose, 4 * S), None);
        let (enabled, t) = control(disabled, CircuitControl::Enable, 4 * S).unwrap();
        assert_eq!(
            (enabled.kind, enabled.trips, t),
            (Kind::Closed, 0, Some(CircuitTransition::Closed))
        );
        // The longest open ends at the maximum instant.
        let (forever, _) =
            control(State::CLOSED, CircuitControl::OpenFor(Duration::MAX), S).unwrap();
        assert_eq!(forever.open_until_ns(), u64::MAX);
    }
}
