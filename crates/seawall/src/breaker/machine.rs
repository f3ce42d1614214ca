//! The memory store's circuit cell: a thin lock-free wrapper around the
//! rules of [`rules`](super::rules).
//!
//! The state of a circuit ([`State`]) lives packed in one `AtomicU64`:
//! every operation loads the word, decodes it, applies the rule and writes
//! the rule's next state with one compare-and-swap, retrying when another
//! thread moved first. A closed circuit admits a call with one atomic load.
//!
//! ```text
//! bits  0..3   kind        closed | open | half-open | isolated | disabled
//!                          | closed, not begun | open for a while | half-open after it
//! bits  3..9   trips       trips since the circuit last closed (saturates at 63)
//! bits  9..22  generation  +1 on every transition (wraps at 2^13)
//! bits 22..64  payload     see `rules::State`
//! ```
//!
//! A circuit is made closed and *not begun*: its time in state counts
//! from its first admission, record or control (the time of the others is
//! not known to the cell), which begins it. A circuit not begun is not a
//! kind that passes, so its first admission takes the full path, which
//! begins it; from then on a closed circuit admits with one load. Open by
//! [`CircuitControl::OpenFor`] and half-open after it are kinds of their
//! own (`rules::State::opened_for`), the duration kept beside the word.
//!
//! Window modes keep their window beside the word: a lock-free ring of the
//! last N outcomes (count window) or one tagged counter per second and
//! measure (time window). The window is written only while the circuit is
//! closed, and is cleared when the circuit half-opens or closes.
//!
//! A breaker with `max_half_open` keeps the end of the current round of
//! probes beside the word too (the word has no room for it): one
//! `AtomicU64` of `[end in whole milliseconds | generation (13 bits)]`,
//! written after the transition that starts the round. A round whose end
//! is tagged with another generation than the state's (the writer has not
//! stored it yet) is taken as not over, so a round never ends early.
//!
//! The parameters ([`BreakerParams`]) are kept apart from the state so that a
//! partitioned resource pays for them once, not once per key.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use super::rules::{self, Kind, Record, State, Verdict, GENERATION_MASK, PASS_KINDS};
pub(crate) use super::rules::{Admit as CircuitAdmit, BreakerParams};
use super::{BreakerMode, CircuitControl, CircuitMetrics, CircuitTransition};
use crate::store::Outcome;

const NANOS_PER_SEC: u64 = 1_000_000_000;

const KIND_MASK: u64 = 0b111;
/// Closed, not begun (see the module documentation).
const NOT_BEGUN: u64 = 5;
/// [`Kind::Open`] and [`Kind::HalfOpen`] after an explicit open.
const OPEN_FOR: u64 = 6;
const HALF_OPEN_FOR: u64 = 7;
/// `since` of a circuit not begun.
const SINCE_NOT_BEGUN: u64 = u64::MAX;
const TRIPS_SHIFT: u32 = 3;
const TRIPS_MASK: u64 = (1 << 6) - 1;
const GENERATION_SHIFT: u32 = 9;
const PAYLOAD_SHIFT: u32 = 22;
const PAYLOAD_MASK: u64 = (1 << 42) - 1;

fn kind_of(bits: u64) -> Kind {
    match bits & KIND_MASK {
        0 | NOT_BEGUN => Kind::Closed,
        1 | OPEN_FOR => Kind::Open,
        2 | HALF_OPEN_FOR => Kind::HalfOpen,
        3 => Kind::Isolated,
        _ => Kind::Disabled,
    }
}

#[inline]
fn decode(bits: u64) -> State {
    State {
        kind: kind_of(bits),
        trips: ((bits >> TRIPS_SHIFT) & TRIPS_MASK) as u32,
        generation: (bits >> GENERATION_SHIFT) & GENERATION_MASK,
        payload: (bits >> PAYLOAD_SHIFT) & PAYLOAD_MASK,
        opened_for: (bits & KIND_MASK) >= OPEN_FOR,
    }
}

#[inline]
fn encode(s: State) -> u64 {
    let kind = match (s.kind, s.opened_for) {
        (Kind::Open, true) => OPEN_FOR,
        (Kind::HalfOpen, true) => HALF_OPEN_FOR,
        (kind, _) => kind as u64,
    };
    kind | ((u64::from(s.trips) & TRIPS_MASK) << TRIPS_SHIFT)
        | ((s.generation & GENERATION_MASK) << GENERATION_SHIFT)
        | ((s.payload & PAYLOAD_MASK) << PAYLOAD_SHIFT)
}

/// One circuit: the state word, the time of the last transition (or of
/// the first use, [`SINCE_NOT_BEGUN`] before it), the duration of the last
/// explicit open and, in window modes or with `max_half_open`, what it
/// keeps beside them.
#[derive(Debug)]
pub(crate) struct Circuit {
    state: AtomicU64,
    since: AtomicU64,
    /// The duration of the last [`CircuitControl::OpenFor`] in nanoseconds
    /// (saturating), written before the state word that says it: the hint
    /// of a full half-open circuit after it.
    opened_for: AtomicU64,
    beside: Option<Box<Beside>>,
}

/// What a circuit keeps beside its state word, allocated only for the
/// breakers that need it.
#[derive(Debug)]
struct Beside {
    /// The window (window modes).
    window: Option<Window>,
    /// The end of the current round of probes (`max_half_open`):
    /// `[end in whole milliseconds | generation (13 bits)]`, raised with
    /// `fetch_max` so that a writer that stalled never puts back an older
    /// round (a later round always ends later on a clock that does not go
    /// backwards).
    round: AtomicU64,
}

const ROUND_GENERATION_BITS: u32 = 13;

impl Circuit {
    /// A closed circuit with an empty window, not begun (window storage is
    /// allocated for window modes only).
    pub(crate) fn new(params: &BreakerParams) -> Self {
        let window = match params.spec.mode {
            BreakerMode::ConsecutiveFailures(_) => None,
            BreakerMode::CountWindow(n) => Some(Window::Count(CountWindow::new(n))),
            BreakerMode::TimeWindow(s) => Some(Window::Time(TimeWindow::new(
                s,
                params.slow_call_ns.is_some(),
            ))),
        };
        let beside = (window.is_some() || params.max_half_open.is_some()).then(|| {
            Box::new(Beside {
                window,
                round: AtomicU64::new(0),
            })
        });
        Circuit {
            state: AtomicU64::new(encode(State::CLOSED) | NOT_BEGUN),
            since: AtomicU64::new(SINCE_NOT_BEGUN),
            opened_for: AtomicU64::new(0),
            beside,
        }
    }

    /// The state word, the circuit begun at `now_ns` if it was not: its
    /// first admission, record or control.
    #[inline]
    fn load_begun(&self, now_ns: u64) -> u64 {
        let bits = self.load();
        if bits & KIND_MASK == NOT_BEGUN {
            self.begin(bits, now_ns)
        } else {
            bits
        }
    }

    /// Begins the circuit not begun whose word is `bits`: closed since
    /// `now_ns`. Returns the word then.
    #[cold]
    #[inline(never)]
    fn begin(&self, mut bits: u64, now_ns: u64) -> u64 {
        while bits & KIND_MASK == NOT_BEGUN {
            let begun = bits & !KIND_MASK;
            match self
                .state
                .compare_exchange(bits, begun, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    // Unless a transition wrote its time meanwhile.
                    let _ = self.since.compare_exchange(
                        SINCE_NOT_BEGUN,
                        now_ns,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                    return begun;
                }
                Err(actual) => bits = actual,
            }
        }
        bits
    }

    /// The window, in window modes.
    #[inline(always)]
    fn window(&self) -> Option<&Window> {
        self.beside.as_deref().and_then(|b| b.window.as_ref())
    }

    /// The end of the round of probes of `generation`, in whole
    /// milliseconds, when it is known.
    fn round_end_ms(&self, generation: u64) -> Option<u64> {
        let bits = self.beside.as_deref()?.round.load(Ordering::Acquire);
        let tag = bits & ((1 << ROUND_GENERATION_BITS) - 1);
        (tag == generation & GENERATION_MASK).then_some(bits >> ROUND_GENERATION_BITS)
    }

    /// Keeps the end of the round of probes that `generation` starts at
    /// `now_ns`.
    fn start_round(&self, params: &BreakerParams, generation: u64, now_ns: u64) {
        if let (Some(beside), Some(end)) = (self.beside.as_deref(), params.round_end_ms(now_ns)) {
            let bits = (end << ROUND_GENERATION_BITS) | (generation & GENERATION_MASK);
            beside.round.fetch_max(bits, Ordering::AcqRel);
        }
    }

    #[inline]
    fn load(&self) -> u64 {
        self.state.load(Ordering::Acquire)
    }

    /// Writes the rule's `next` over the exact word `current` and, on a
    /// transition, restarts the time in state and the counts the new state
    /// starts with. `Err` with the word found otherwise.
    #[inline]
    fn replace(&self, current: u64, next: State, now_ns: u64) -> Result<(), u64> {
        self.state
            .compare_exchange(current, encode(next), Ordering::AcqRel, Ordering::Acquire)?;
        let prev = decode(current);
        if prev.moved_to(next) {
            self.since.store(now_ns, Ordering::Relaxed);
            if prev.starts_counts(next) {
                if let Some(window) = self.window() {
                    window.clear();
                }
            }
        }
        Ok(())
    }

    /// Applies `rule` to the state `current` (the word as loaded) until
    /// its next state is written (or it has none); returns the rule's
    /// answer.
    #[inline]
    fn apply<T>(
        &self,
        mut current: u64,
        now_ns: u64,
        mut rule: impl FnMut(State) -> (T, Option<State>),
    ) -> T {
        loop {
            let (answer, next) = rule(decode(current));
            let Some(next) = next else {
                return answer;
            };
            match self.replace(current, next, now_ns) {
                Ok(()) => return answer,
                Err(actual) => current = actual,
            }
        }
    }

    /// The generation of a closed or disabled circuit, which admits every
    /// call and changes nothing when it does (one atomic load).
    /// `Err(Some(left))` while open with `left` of the cooldown to go (the
    /// time is read only then), `Err(None)` otherwise: the caller then asks
    /// [`admit`](Self::admit).
    #[inline(always)]
    pub(crate) fn quick_admit(
        &self,
        now: &mut impl FnMut() -> u64,
    ) -> Result<u64, Option<Duration>> {
        let bits = self.load();
        // The kinds that pass, straight from the bits (a bit test: no jump
        // table on the hot path).
        if (PASS_KINDS >> (bits & KIND_MASK)) & 1 == 1 {
            return Ok((bits >> GENERATION_SHIFT) & GENERATION_MASK);
        }
        if !matches!(bits & KIND_MASK, 1 | OPEN_FOR) {
            return Err(None);
        }
        Err(Self::quick_refusal(bits, now()))
    }

    /// [`quick_admit`](Self::quick_admit) of an open circuit: the time left
    /// of its cooldown at `now_ns`, `None` when it is over.
    #[inline(never)]
    fn quick_refusal(bits: u64, now_ns: u64) -> Option<Duration> {
        rules::open_refusal(decode(bits), now_ns)
    }

    /// Admits one call (closed: one atomic load).
    #[inline]
    pub(crate) fn admit(&self, params: &BreakerParams, now_ns: u64) -> CircuitAdmit {
        let current = self.load_begun(now_ns);
        let answer = self.apply(current, now_ns, |s| {
            let (round, opened_for) = match s.kind {
                Kind::HalfOpen => (
                    params
                        .max_half_open
                        .and_then(|_| self.round_end_ms(s.generation)),
                    s.opened_for.then(|| self.opened_for()),
                ),
                _ => (None, None),
            };
            rules::admit(s, params, now_ns, round, opened_for)
        });
        // A round of probes starts: its end is kept beside the state.
        if let (Some(_), Ok((generation, true))) = (answer.transition, answer.decision) {
            self.start_round(params, generation, now_ns);
        }
        answer
    }

    /// The duration of the last explicit open.
    fn opened_for(&self) -> Duration {
        Duration::from_nanos(self.opened_for.load(Ordering::Acquire))
    }

    /// Gives back the probe slot of a half-open admission of `generation`.
    pub(crate) fn release_probe(&self, generation: u64) {
        self.apply(self.load(), 0, |s| {
            ((), rules::release_probe(s, generation))
        });
    }

    /// [`record`](Self::record) of a success that is not a probe, with the
    /// common cases that change nothing answered from one load: a disabled
    /// circuit, a closed consecutive-mode circuit with no failure in a row,
    /// a full count window holding only fast successes (the record rule
    /// moves nothing there, and such a window is unchanged by one more fast
    /// success).
    #[inline(always)]
    pub(crate) fn record_success(
        &self,
        params: &BreakerParams,
        generation: u64,
        duration_ns: u64,
        now_ns: u64,
    ) -> Option<CircuitTransition> {
        let bits = self.load();
        let kind = bits & KIND_MASK;
        if kind == Kind::Disabled as u64 {
            return None;
        }
        let closed_in_generation =
            (Kind::Closed as u64) | ((generation & GENERATION_MASK) << GENERATION_SHIFT);
        let same = bits & (KIND_MASK | (GENERATION_MASK << GENERATION_SHIFT));
        if same == closed_in_generation && !params.is_slow_ns(duration_ns) {
            let unchanged = match self.window() {
                None => (bits >> PAYLOAD_SHIFT) & PAYLOAD_MASK == 0,
                Some(Window::Count(w)) => w.only_fast_successes(),
                Some(Window::Time(_)) => false,
            };
            if unchanged {
                return None;
            }
        }
        self.record_success_in_full(params, generation, duration_ns, now_ns)
    }

    /// [`record_success`](Self::record_success) when one load did not
    /// settle it: the record rule, out of line.
    #[inline(never)]
    fn record_success_in_full(
        &self,
        params: &BreakerParams,
        generation: u64,
        duration_ns: u64,
        now_ns: u64,
    ) -> Option<CircuitTransition> {
        self.record(
            params,
            generation,
            false,
            Outcome::Success,
            Duration::from_nanos(duration_ns),
            now_ns,
        )
    }

    /// Records the outcome of a call admitted in `generation`.
    #[inline]
    pub(crate) fn record(
        &self,
        params: &BreakerParams,
        generation: u64,
        probe: bool,
        outcome: Outcome,
        duration: Duration,
        now_ns: u64,
    ) -> Option<CircuitTransition> {
        let verdict = Verdict::of(params, outcome, duration);
        let mut current = self.load_begun(now_ns);
        loop {
            let state = decode(current);
            match rules::record(state, params, generation, probe, verdict, now_ns) {
                Record::Nothing => return None,
                Record::Move { next, transition } => match self.replace(current, next, now_ns) {
                    Ok(()) => return transition,
                    Err(actual) => current = actual,
                },
                Record::Window {
                    failure,
                    slow,
                    judge,
                } => {
                    let window = self.window()?;
                    window.record(failure, slow, now_ns);
                    if !judge || !rules::window_trips(params, window.snapshot(now_ns)) {
                        return None;
                    }
                    // Opens from the state the call was judged in; when it
                    // moved meanwhile, another call decided.
                    let (next, transition) = rules::trip(state, params, now_ns);
                    return self
                        .replace(current, next, now_ns)
                        .ok()
                        .map(|()| transition);
                }
            }
        }
    }

    /// Manual control; the transition when the state changed.
    pub(crate) fn control(
        &self,
        control: CircuitControl,
        now_ns: u64,
    ) -> Option<CircuitTransition> {
        let current = self.load_begun(now_ns);
        self.apply(current, now_ns, |s| {
            match rules::control(s, control, now_ns) {
                Some((next, transition)) => {
                    if let CircuitControl::OpenFor(d) = control {
                        // Written before the word that says it (every attempt
                        // writes it again: the duration of the last open wins
                        // with its word).
                        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
                        self.opened_for.store(ns, Ordering::Release);
                    }
                    (transition, Some(next))
                }
                None => (None, None),
            }
        })
    }

    /// State, counts and trips; a circuit not begun has been in its state
    /// for no time yet.
    pub(crate) fn metrics(&self, params: &BreakerParams, now_ns: u64) -> CircuitMetrics {
        let state = decode(self.load());
        let window = self.window().map(|w| w.snapshot(now_ns));
        let (calls, failures, slow_calls) = rules::counts(state, params, window);
        let since = match self.since.load(Ordering::Relaxed) {
            SINCE_NOT_BEGUN => now_ns,
            since => since,
        };
        CircuitMetrics::from_counts(
            state.kind.state(),
            calls,
            failures,
            slow_calls,
            Duration::from_nanos(now_ns.saturating_sub(since)),
            state.trips,
        )
    }

    /// `true` when the circuit holds nothing worth keeping for an idle
    /// partition: closed (a partial window may be lost), not open,
    /// half-open or under manual control.
    pub(crate) fn is_idle(&self) -> bool {
        kind_of(self.load()) == Kind::Closed
    }
}

/// The window of a window-mode breaker.
#[derive(Debug)]
enum Window {
    Count(CountWindow),
    Time(TimeWindow),
}

impl Window {
    #[inline]
    fn record(&self, failure: bool, slow: bool, now_ns: u64) {
        match self {
            Window::Count(w) => w.record(failure, slow),
            Window::Time(w) => w.record(failure, slow, now_ns),
        }
    }

    /// `(calls, failures, slow calls)` in the window at `now_ns`.
    fn snapshot(&self, now_ns: u64) -> (u64, u64, u64) {
        match self {
            Window::Count(w) => w.snapshot(),
            Window::Time(w) => w.snapshot(now_ns),
        }
    }

    fn clear(&self) {
        match self {
            Window::Count(w) => w.clear(),
            Window::Time(w) => w.clear(),
        }
    }
}

const SLOT_SET: u8 = 1;
const SLOT_FAILURE: u8 = 2;
const SLOT_SLOW: u8 = 4;

/// The last N outcomes: a ring of slots, plus failure and slow-call totals
/// adjusted only when an overwritten slot differs from the new one.
///
/// `head` packs the index of the next slot (low 32 bits) and a flag set
/// once the ring has wrapped around (`FULL`). A success recorded into a
/// full ring holding no failure and no slow call changes nothing (every
/// slot already holds a success), so it writes nothing at all.
#[derive(Debug)]
struct CountWindow {
    head: AtomicU64,
    slots: Box<[AtomicU8]>,
    failures: AtomicU32,
    slow: AtomicU32,
}

/// Set in `CountWindow::head` once every slot has been written.
const FULL: u64 = 1 << 32;
const INDEX: u64 = FULL - 1;

impl CountWindow {
    fn new(size: u32) -> Self {
        CountWindow {
            head: AtomicU64::new(0),
            slots: (0..size.max(1)).map(|_| AtomicU8::new(0)).collect(),
            failures: AtomicU32::new(0),
            slow: AtomicU32::new(0),
        }
    }

    /// `true` when the ring is full and holds no failure and no slow call:
    /// recording a fast success would change nothing.
    #[inline]
    fn only_fast_successes(&self) -> bool {
        self.head.load(Ordering::Acquire) & FULL != 0
            && self.failures.load(Ordering::Acquire) == 0
            && self.slow.load(Ordering::Acquire) == 0
    }

    #[inline]
    fn record(&self, failure: bool, slow: bool) {
        if !(failure || slow) && self.only_fast_successes() {
            return;
        }
        let mut head = self.head.load(Ordering::Acquire);
        let len = self.slots.len() as u64;
        let index = loop {
            let index = head & INDEX;
            let next = if index + 1 >= len {
                FULL
            } else {
                (head & FULL) | (index + 1)
            };
            match self
                .head
                .compare_exchange_weak(head, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break index as usize,
                Err(actual) => head = actual,
            }
        };
        let value =
            SLOT_SET | if failure { SLOT_FAILURE } else { 0 } | if slow { SLOT_SLOW } else { 0 };
        let old = self.slots[index].swap(value, Ordering::AcqRel);
        if old != value {
            adjust(&self.failures, old & SLOT_FAILURE != 0, failure);
            adjust(&self.slow, old & SLOT_SLOW != 0, slow);
        }
    }

    fn snapshot(&self) -> (u64, u64, u64) {
        let head = self.head.load(Ordering::Acquire);
        let calls = if head & FULL != 0 {
            self.slots.len() as u64
        } else {
            head & INDEX
        };
        // The totals may be transiently off by the calls racing with this
        // read; clamp them into a consistent range.
        let total = |c: &AtomicU32| (c.load(Ordering::Acquire) as i32).max(0) as u64;
        (
            calls,
            total(&self.failures).min(calls),
            total(&self.slow).min(calls),
        )
    }

    fn clear(&self) {
        for slot in self.slots.iter() {
            slot.store(0, Ordering::Relaxed);
        }
        self.failures.store(0, Ordering::Relaxed);
        self.slow.store(0, Ordering::Relaxed);
        self.head.store(0, Ordering::Release);
    }
}

fn adjust(total: &AtomicU32, was: bool, is: bool) {
    match (was, is) {
        (false, true) => {
            total.fetch_add(1, Ordering::AcqRel);
        }
        (true, false) => {
            total.fetch_sub(1, Ordering::AcqRel);
        }
        _ => {}
    }
}

/// The calls of the last W whole seconds: per second, one counter per
/// measure (calls, failures and, when a slow-call rate is configured, slow
/// calls), each an `AtomicU64` of `[second: 35 bits | count: 29 bits]`.
/// The tag is the whole second of the clock (every second up to
/// `u64::MAX` nanoseconds fits in 35 bits), so a counter left from any
/// earlier second, however long ago, is never read as a current one. A
/// counter tagged with an older second is reset by the first write of its
/// new second; counts saturate at 2^29 - 1 per second.
#[derive(Debug)]
struct TimeWindow {
    seconds: u32,
    measures: usize,
    counters: Box<[AtomicU64]>,
}

const CALLS: usize = 0;
const FAILURES: usize = 1;
const SLOW: usize = 2;

/// Bits of a time-window counter's count; the second takes the others.
const COUNT_BITS: u32 = 29;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;

/// A time-window counter's `(second, count)`.
fn unpack(bits: u64) -> (u64, u64) {
    (bits >> COUNT_BITS, bits & COUNT_MAX)
}

impl TimeWindow {
    fn new(seconds: u32, with_slow: bool) -> Self {
        let seconds = seconds.max(1);
        let measures = if with_slow { 3 } else { 2 };
        TimeWindow {
            seconds,
            measures,
            counters: (0..seconds as usize * measures)
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    fn counter(&self, second: u64, measure: usize) -> &AtomicU64 {
        let bucket = (second % u64::from(self.seconds)) as usize;
        &self.counters[bucket * self.measures + measure]
    }

    fn record(&self, failure: bool, slow: bool, now_ns: u64) {
        let second = now_ns / NANOS_PER_SEC;
        bump(self.counter(second, CALLS), second);
        if failure {
            bump(self.counter(second, FAILURES), second);
        }
        if slow && self.measures > SLOW {
            bump(self.counter(second, SLOW), second);
        }
    }

    fn snapshot(&self, now_ns: u64) -> (u64, u64, u64) {
        let second_now = now_ns / NANOS_PER_SEC;
        let mut sums = [0u64; 3];
        for bucket in self.counters.chunks(self.measures) {
            for (measure, counter) in bucket.iter().enumerate() {
                let (second, count) = unpack(counter.load(Ordering::Acquire));
                // Seconds (now - W, now]; a second ahead of `now` (time
                // went backwards for this caller) wraps to a huge distance.
                if second_now.wrapping_sub(second) < u64::from(self.seconds) {
                    sums[measure] = sums[measure].saturating_add(count);
                }
            }
        }
        let calls = sums[CALLS];
        (calls, sums[FAILURES].min(calls), sums[SLOW].min(calls))
    }

    fn clear(&self) {
        for counter in self.counters.iter() {
            counter.store(0, Ordering::Relaxed);
        }
    }
}

/// Adds one to a `[second | count]` counter for `second`. A counter at
/// zero is empty whatever its tag (a new one is tagged 0).
fn bump(counter: &AtomicU64, second: u64) {
    let mut current = counter.load(Ordering::Acquire);
    loop {
        let (old_second, count) = unpack(current);
        let next = if count != 0 && old_second >= second {
            // This second (or a later one, when time went backwards for
            // this caller: count into it rather than wipe it).
            (old_second << COUNT_BITS) | (count + 1).min(COUNT_MAX)
        } else {
            (second << COUNT_BITS) | 1
        };
        if next == current {
            return;
        }
        match counter.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(actual) => current = actual,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::{CircuitBreaker, CircuitState};

    const MS: u64 = 1_000_000;
    const S: u64 = NANOS_PER_SEC;

    fn params(spec: CircuitBreaker) -> BreakerParams {
        BreakerParams::new(&spec)
    }

    fn consecutive(n: u32) -> BreakerParams {
        params(
            CircuitBreaker::consecutive_failures(n)
                .cooldown(Duration::from_secs(10))
                .cooldown_growth(2.0, Duration::from_secs(30)),
        )
    }

    fn admit_ok(c: &Circuit, p: &BreakerParams, now: u64) -> (u64, bool) {
        c.admit(p, now).decision.expect("admitted")
    }

    fn fail(c: &Circuit, p: &BreakerParams, now: u64) -> Option<CircuitTransition> {
        let (generation, probe) = admit_ok(c, p, now);
        c.record(p, generation, probe, Outcome::Failure, Duration::ZERO, now)
    }

    fn succeed(c: &Circuit, p: &BreakerParams, now: u64) -> Option<CircuitTransition> {
        let (generation, probe) = admit_ok(c, p, now);
        c.record(p, generation, probe, Outcome::Success, Duration::ZERO, now)
    }

    #[test]
    fn the_word_round_trips() {
        for kind in [
            Kind::Closed,
            Kind::Open,
            Kind::HalfOpen,
            Kind::Isolated,
            Kind::Disabled,
        ] {
            for opened_for in [false, true] {
                let s = State {
                    kind,
                    trips: rules::MAX_TRIPS,
                    generation: GENERATION_MASK,
                    payload: PAYLOAD_MASK,
                    opened_for: opened_for && matches!(kind, Kind::Open | Kind::HalfOpen),
                };
                assert_eq!(decode(encode(s)), s);
            }
        }
        assert_eq!(decode(encode(State::CLOSED)), State::CLOSED);
        assert_eq!(decode(encode(State::CLOSED) | NOT_BEGUN), State::CLOSED);
    }

    #[test]
    fn a_circuit_begins_with_its_first_admission_record_or_control() {
        let p = consecutive(3);
        let c = Circuit::new(&p);
        assert_eq!(c.quick_admit(&mut || 0), Err(None), "the full path first");
        assert_eq!(c.metrics(&p, 5 * S).time_in_state, Duration::ZERO);
        assert!(c.is_idle());
        let (generation, probe) = admit_ok(&c, &p, 5 * S);
        assert_eq!((generation, probe), (0, false));
        assert_eq!(c.quick_admit(&mut || 0), Ok(0), "then one load");
        assert_eq!(c.metrics(&p, 7 * S).time_in_state, Duration::from_secs(2));
        for first in [
            |c: &Circuit, p: &BreakerParams| {
                c.record(p, 0, false, Outcome::Failure, Duration::ZERO, 5 * S);
            },
            |c: &Circuit, _: &BreakerParams| {
                c.control(CircuitControl::Enable, 5 * S);
            },
        ] {
            let c = Circuit::new(&p);
            first(&c, &p);
            assert_eq!(c.metrics(&p, 7 * S).time_in_state, Duration::from_secs(2));
        }
        // A transition is a use too.
        let c = Circuit::new(&p);
        c.control(CircuitControl::Isolate, 5 * S);
        assert_eq!(c.metrics(&p, 6 * S).time_in_state, Duration::from_secs(1));
    }

    #[test]
    fn the_duration_of_an_explicit_open_is_the_hint_of_a_full_half_open_circuit() {
        let p = consecutive(1);
        let c = Circuit::new(&p);
        let d = Duration::from_millis(60_250);
        c.control(CircuitControl::OpenFor(d), 0);
        assert_eq!(
            c.quick_admit(&mut || S),
            Err(Some(Duration::from_millis(59_250))),
            "refused at once with the time left"
        );
        let (g, probe) = admit_ok(&c, &p, 61 * S);
        assert!(probe);
        assert_eq!(c.admit(&p, 61 * S).decision, Err(Some(d)));
        // The probe fails: the next round hints the cooldown of the trip.
        c.record(&p, g, true, Outcome::Failure, Duration::ZERO, 61 * S);
        admit_ok(&c, &p, 71 * S);
        assert_eq!(
            c.admit(&p, 71 * S).decision,
            Err(Some(Duration::from_secs(10)))
        );
    }

    #[test]
    fn consecutive_failures_open_then_probe_then_close() {
        let p = consecutive(3);
        let c = Circuit::new(&p);
        assert_eq!(fail(&c, &p, 0), None);
        assert_eq!(succeed(&c, &p, 0), None, "a success resets the run");
        assert_eq!(fail(&c, &p, 0), None);
        assert_eq!(fail(&c, &p, 0), None);
        assert_eq!(c.metrics(&p, 0).failures, 2);
        assert_eq!(
            fail(&c, &p, S),
            Some(CircuitTransition::Opened {
                cooldown: Duration::from_secs(10)
            })
        );
        let m = c.metrics(&p, 3 * S);
        assert_eq!(
            (m.state, m.trips, m.time_in_state),
            (CircuitState::Open, 1, Duration::from_secs(2))
        );
        assert_eq!(
            c.admit(&p, 3 * S).decision,
            Err(Some(Duration::from_secs(8)))
        );
        let a = c.admit(&p, 11 * S);
        assert_eq!(a.transition, Some(CircuitTransition::HalfOpened));
        let (generation, probe) = a.decision.unwrap();
        assert!(probe);
        assert_eq!(
            c.admit(&p, 11 * S).decision,
            Err(Some(Duration::from_secs(10))),
            "one probe only, the cooldown as the hint"
        );
        // A failed probe trips again with a doubled cooldown.
        assert_eq!(
            c.record(
                &p,
                generation,
                true,
                Outcome::Failure,
                Duration::ZERO,
                11 * S
            ),
            Some(CircuitTransition::Opened {
                cooldown: Duration::from_secs(20)
            })
        );
        assert_eq!(c.metrics(&p, 11 * S).trips, 2);
        let (generation, probe) = admit_ok(&c, &p, 31 * S);
        assert_eq!(
            c.record(
                &p,
                generation,
                probe,
                Outcome::Success,
                Duration::ZERO,
                31 * S
            ),
            Some(CircuitTransition::Closed)
        );
        let m = c.metrics(&p, 31 * S);
        assert_eq!((m.state, m.trips, m.calls), (CircuitState::Closed, 0, 0));
    }

    #[test]
    fn stale_generation_is_ignored() {
        let p = consecutive(1);
        let c = Circuit::new(&p);
        let (old, _) = admit_ok(&c, &p, 0);
        assert!(fail(&c, &p, 0).is_some());
        // The call admitted before the trip finishes late: not a probe result.
        assert_eq!(
            c.record(&p, old, false, Outcome::Success, Duration::ZERO, 0),
            None
        );
        assert_eq!(c.metrics(&p, 0).state, CircuitState::Open);
    }

    #[test]
    fn ignored_probe_frees_its_slot() {
        let p = params(
            CircuitBreaker::consecutive_failures(1)
                .cooldown(Duration::from_millis(5))
                .half_open_calls(2),
        );
        let c = Circuit::new(&p);
        fail(&c, &p, 0);
        let (g, probe) = admit_ok(&c, &p, 5 * MS);
        assert!(probe);
        let _second = admit_ok(&c, &p, 5 * MS);
        assert_eq!(
            c.admit(&p, 5 * MS).decision,
            Err(Some(5 * Duration::from_millis(1)))
        );
        assert_eq!(
            c.record(&p, g, true, Outcome::Ignored, Duration::ZERO, 5 * MS),
            None
        );
        assert!(c.admit(&p, 5 * MS).decision.is_ok());
    }

    #[test]
    fn count_window_judges_on_failure_only() {
        let p = params(
            CircuitBreaker::failure_rate(0.5)
                .count_window(4)
                .minimum_calls(4)
                .cooldown(Duration::from_secs(1)),
        );
        let c = Circuit::new(&p);
        assert_eq!(fail(&c, &p, 0), None);
        assert_eq!(fail(&c, &p, 0), None, "2 calls < minimum_calls");
        assert_eq!(succeed(&c, &p, 0), None);
        // 4 calls, 2 failures: the rate is only judged on a failure.
        assert_eq!(succeed(&c, &p, 0), None);
        let m = c.metrics(&p, 0);
        assert_eq!((m.calls, m.failures, m.failure_rate), (4, 2, 0.5));
        // The ring overwrites the oldest (a failure) with a failure: 5th call.
        assert!(matches!(
            fail(&c, &p, 0),
            Some(CircuitTransition::Opened { .. })
        ));
    }

    #[test]
    fn count_window_ring_keeps_totals_exact() {
        let p = params(
            CircuitBreaker::failure_rate(1.0)
                .count_window(3)
                .minimum_calls(100)
                .slow_calls(1.0, Duration::from_millis(10)),
        );
        let c = Circuit::new(&p);
        let outcomes = [
            (Outcome::Failure, 0),
            (Outcome::Success, 20),
            (Outcome::Success, 0),
            (Outcome::Failure, 20),
            (Outcome::Success, 0),
            (Outcome::Success, 0),
        ];
        for (outcome, ms) in outcomes {
            let (g, probe) = admit_ok(&c, &p, 0);
            c.record(&p, g, probe, outcome, Duration::from_millis(ms), 0);
        }
        // The last three: failure+slow, success, success.
        let m = c.metrics(&p, 0);
        assert_eq!((m.calls, m.failures, m.slow_calls), (3, 1, 1));
    }

    #[test]
    fn time_window_forgets_old_seconds() {
        let p = params(
            CircuitBreaker::failure_rate(0.6)
                .window(Duration::from_secs(2))
                .minimum_calls(3),
        );
        let c = Circuit::new(&p);
        fail(&c, &p, 0);
        fail(&c, &p, S / 2);
        succeed(&c, &p, S);
        assert_eq!(c.metrics(&p, S).calls, 3);
        // At t = 2 s the first second (0) has left the window.
        let m = c.metrics(&p, 2 * S);
        assert_eq!((m.calls, m.failures), (1, 0));
        assert_eq!(fail(&c, &p, 2 * S), None, "2 calls < minimum");
        assert!(fail(&c, &p, 2 * S + 1).is_some(), "3 calls, 2/3 failed");
    }

    #[test]
    fn time_window_tolerates_time_going_backwards() {
        let p = params(CircuitBreaker::failure_rate(1.0).window(Duration::from_secs(3)));
        let c = Circuit::new(&p);
        succeed(&c, &p, 10 * S);
        succeed(&c, &p, 4 * S);
        assert_eq!(c.metrics(&p, 10 * S).calls, 2);
        assert_eq!(c.metrics(&p, 0).time_in_state, Duration::ZERO);
    }

    #[test]
    fn control_reports_state_changes_only() {
        let p = consecutive(1);
        let c = Circuit::new(&p);
        assert_eq!(
            c.control(CircuitControl::Isolate, 0),
            Some(CircuitTransition::Opened {
                cooldown: Duration::MAX
            })
        );
        assert_eq!(c.control(CircuitControl::Isolate, 0), None);
        assert_eq!(c.admit(&p, u64::MAX).decision, Err(None));
        assert_eq!(
            c.control(CircuitControl::ForceClose, 0),
            Some(CircuitTransition::Closed)
        );
        assert_eq!(c.control(CircuitControl::ForceClose, 0), None);
        assert_eq!(fail(&c, &p, 0), None, "disabled records nothing");
        assert_eq!(c.metrics(&p, 0).state, CircuitState::Disabled);
        assert_eq!(
            c.control(CircuitControl::Reset, 0),
            Some(CircuitTransition::Closed)
        );
        assert_eq!(c.control(CircuitControl::Reset, 0), None);
        assert_eq!(c.metrics(&p, 0).state, CircuitState::Closed);
    }

    #[test]
    fn half_open_admits_exactly_the_probe_count_under_contention() {
        let p = params(
            CircuitBreaker::consecutive_failures(1)
                .cooldown(Duration::from_millis(1))
                .half_open_calls(3),
        );
        for _ in 0..50 {
            let c = Circuit::new(&p);
            fail(&c, &p, 0);
            let admitted = AtomicU32::new(0);
            std::thread::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| {
                        for _ in 0..10 {
                            if c.admit(&p, MS).decision.is_ok() {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    });
                }
            });
            assert_eq!(admitted.load(Ordering::Relaxed), 3);
        }
    }
}

/// Races on one cell: each transition is reported exactly once.
#[cfg(test)]
mod races {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::breaker::{CircuitBreaker, CircuitState};

    const THREADS: usize = 8;

    fn hammer(c: &Circuit, p: &BreakerParams, now: u64, outcome: Outcome) -> [u32; 2] {
        let opened = AtomicU32::new(0);
        let closed = AtomicU32::new(0);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    for _ in 0..2_000 {
                        let Ok((g, probe)) = c.admit(p, now).decision else {
                            continue;
                        };
                        match c.record(p, g, probe, outcome, Duration::ZERO, now) {
                            Some(CircuitTransition::Opened { .. }) => {
                                opened.fetch_add(1, Ordering::Relaxed);
                            }
                            Some(CircuitTransition::Closed) => {
                                closed.fetch_add(1, Ordering::Relaxed);
                            }
                            _ => {}
                        }
                    }
                });
            }
        });
        [opened.into_inner(), closed.into_inner()]
    }

    #[test]
    fn racing_failures_trip_once_and_racing_probes_close_once() {
        let hour = Duration::from_secs(3600);
        for breaker in [
            CircuitBreaker::consecutive_failures(5),
            CircuitBreaker::failure_rate(0.5)
                .count_window(20)
                .minimum_calls(10),
            CircuitBreaker::failure_rate(0.5)
                .window(Duration::from_secs(10))
                .minimum_calls(10),
        ] {
            let p = BreakerParams::new(&breaker.cooldown(hour).half_open_calls(4));
            for _ in 0..20 {
                let c = Circuit::new(&p);
                assert_eq!(hammer(&c, &p, 0, Outcome::Failure), [1, 0], "{p:?}");
                assert_eq!(c.metrics(&p, 0).state, CircuitState::Open);
                let later = 3600 * NANOS_PER_SEC;
                assert_eq!(hammer(&c, &p, later, Outcome::Success), [0, 1], "{p:?}");
                assert_eq!(c.metrics(&p, later).state, CircuitState::Closed);
            }
        }
    }
}

/// Races on a round of probes with `max_half_open`: threads that see a new
/// round before its end is stored beside the state never end it early,
/// and an expired round gives way to exactly one new round.
#[cfg(test)]
mod round_races {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::breaker::CircuitBreaker;

    const THREADS: usize = 8;
    const MS: u64 = 1_000_000;

    /// Every thread admits `tries` times at `now`: (admitted, new rounds).
    fn race(c: &Circuit, p: &BreakerParams, now: u64, tries: usize) -> (u32, u32) {
        let admitted = AtomicU32::new(0);
        let rounds = AtomicU32::new(0);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    for _ in 0..tries {
                        let a = c.admit(p, now);
                        if a.decision.is_ok() {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                        if a.transition == Some(CircuitTransition::ProbesExpired) {
                            rounds.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        (admitted.into_inner(), rounds.into_inner())
    }

    #[test]
    fn a_round_ends_once_and_never_early() {
        let p = BreakerParams::new(
            &CircuitBreaker::consecutive_failures(1)
                .cooldown(Duration::from_millis(1))
                .half_open_calls(3)
                .max_half_open(Duration::from_millis(10)),
        );
        for _ in 0..30 {
            let c = Circuit::new(&p);
            // Round 1 half-opens at 1 ms; its probe fails at 1 ms.
            let (g, _) = c.admit(&p, 0).decision.unwrap();
            c.record(&p, g, false, Outcome::Failure, Duration::ZERO, 0);
            let (g, probe) = c.admit(&p, MS).decision.unwrap();
            assert!(probe);
            c.record(&p, g, true, Outcome::Failure, Duration::ZERO, MS);
            // Round 2 starts at 20 ms, after round 1's end (11 ms), which
            // is still the end kept beside the state when the threads race
            // to half-open: exactly three probes, no new round.
            assert_eq!(race(&c, &p, 20 * MS, 50), (3, 0));
            // Before its own end (30 ms) nothing gives way either.
            assert_eq!(race(&c, &p, 30 * MS - 1, 50), (0, 0));
            // At its end: one new round, three probes in it.
            assert_eq!(race(&c, &p, 30 * MS, 50), (3, 1));
        }
    }

    /// The window of the race above, held open: the state is a new round
    /// whose end is not stored yet (the word beside it still holds the end
    /// of the previous round, which is past). The round is not over.
    #[test]
    fn an_end_of_another_generation_ends_nothing() {
        let p = BreakerParams::new(
            &CircuitBreaker::consecutive_failures(1)
                .cooldown(Duration::from_millis(1))
                .max_half_open(Duration::from_millis(10)),
        );
        let c = Circuit::new(&p);
        let (g, _) = c.admit(&p, 0).decision.unwrap();
        c.record(&p, g, false, Outcome::Failure, Duration::ZERO, 0);
        let (g, _) = c.admit(&p, MS).decision.unwrap();
        let stale = c.beside.as_deref().unwrap().round.load(Ordering::Acquire);
        c.record(&p, g, true, Outcome::Failure, Duration::ZERO, MS);
        let (g, _) = c.admit(&p, 20 * MS).decision.unwrap();
        assert_eq!(c.round_end_ms(g), Some(30));
        c.beside
            .as_deref()
            .unwrap()
            .round
            .store(stale, Ordering::Release);
        assert_eq!(c.round_end_ms(g), None, "tagged with round 1's generation");
        assert!(
            c.admit(&p, 25 * MS).decision.is_err(),
            "round 1's end is past"
        );
        // Once stored, the end counts.
        c.start_round(&p, g, 20 * MS);
        assert_eq!(
            c.admit(&p, 30 * MS).transition,
            Some(CircuitTransition::ProbesExpired)
        );
    }
}

/// The cell's lean paths (`quick_admit`, `record_success`) against the
/// reference model: what the pipeline's fast path runs.
#[cfg(test)]
mod lean_paths {
    use proptest::prelude::*;

    use super::*;
    use crate::breaker::CircuitBreaker;
    use crate::model::breaker::{strategy, Model, Op};

    fn drive(breaker: CircuitBreaker, start: u64, ops: &[Op]) {
        let p = BreakerParams::new(&breaker);
        let c = Circuit::new(&p);
        let mut model = Model::new(breaker.clone());
        let mut now = start;
        let mut permits: Vec<(u64, bool)> = Vec::new();
        let slow = breaker.slow_call_duration;
        for (step, &op) in ops.iter().enumerate() {
            let at = Duration::from_nanos(now);
            match op {
                Op::Admit => {
                    let (expected, transition) = model.admit(at);
                    let mut clock = || now;
                    let got = match c.quick_admit(&mut clock) {
                        Ok(generation) => (Ok((generation, false)), None),
                        Err(Some(left)) => (Err(Some(left)), None),
                        Err(None) => {
                            let a = c.admit(&p, now);
                            (a.decision, a.transition)
                        }
                    };
                    assert_eq!(got, (expected, transition), "step {step}: admit");
                    if let Ok(permit) = expected {
                        permits.push(permit);
                    }
                }
                Op::Record {
                    pick,
                    outcome,
                    speed,
                    ..
                } => {
                    if permits.is_empty() {
                        continue;
                    }
                    let (generation, probe) = permits.swap_remove(pick % permits.len());
                    let duration = match speed {
                        0 => Duration::ZERO,
                        1 => slow - Duration::from_nanos(1),
                        2 => slow,
                        _ => slow * 2,
                    };
                    let expected = model.record(generation, probe, outcome, duration, at);
                    let got = if outcome == Outcome::Success && !probe {
                        c.record_success(
                            &p,
                            generation,
                            crate::clock::duration_nanos(duration),
                            now,
                        )
                    } else {
                        c.record(&p, generation, probe, outcome, duration, now)
                    };
                    assert_eq!(got, expected, "step {step}: record {outcome:?}");
                }
                Op::Release { pick } => {
                    if permits.is_empty() {
                        continue;
                    }
                    let (generation, probe) = permits.swap_remove(pick % permits.len());
                    if probe {
                        c.release_probe(generation);
                    }
                    model.release(generation, probe);
                }
                Op::Advance(by) => now = now.saturating_add(by.as_nanos() as u64),
                Op::Control(control) => {
                    assert_eq!(
                        c.control(control, now),
                        model.control(control, at),
                        "step {step}: {control:?}"
                    );
                }
            }
            assert_eq!(
                c.metrics(&p, now),
                model.metrics(Duration::from_nanos(now)),
                "step {step}: metrics"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 200,
            ..ProptestConfig::default()
        })]

        #[test]
        fn lean_paths_agree_with_the_model(
            breaker in strategy::any_breaker(),
            start in prop_oneof![Just(0u64), Just(1_000_000_000_000_000), (u64::MAX - 3_600_000_000_000)..u64::MAX],
            ops in strategy::ops(false, 200),
        ) {
            drive(breaker, start, &ops);
        }
    }
}
