//! Lock-free circuit state machine used by the memory store.
//!
//! The whole state of a circuit lives in one `AtomicU64`, so that every
//! transition is a single compare-and-swap and a closed circuit admits a call
//! with one atomic load:
//!
//! ```text
//! bits  0..3   kind        closed | open | half-open | isolated | disabled
//! bits  3..9   trips       trips since the circuit last closed (saturates at 63)
//! bits  9..22  generation  +1 on every transition (wraps at 2^13)
//! bits 22..64  payload     closed (consecutive mode): failures in a row
//!                          open: end of the cooldown, in whole milliseconds
//!                                (rounded up, saturating at 2^42 - 1 ms)
//!                          half-open: probes admitted (bits 0..21) and
//!                                     probes succeeded (bits 21..42)
//! ```
//!
//! Window modes keep their window beside the word: a lock-free ring of the
//! last N outcomes (count window) or one tagged counter per second and
//! measure (time window). The window is written only while the circuit is
//! closed and is cleared when it closes again.
//!
//! The parameters ([`BreakerParams`]) are kept apart from the state so that a
//! partitioned resource pays for them once, not once per key.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use super::{
    BreakerMode, CircuitBreaker, CircuitControl, CircuitMetrics, CircuitState, CircuitTransition,
};
use crate::clock::duration_nanos;
use crate::store::Outcome;

const NANOS_PER_MS: u64 = 1_000_000;
const NANOS_PER_SEC: u64 = 1_000_000_000;

const KIND_MASK: u64 = 0b111;
const TRIPS_SHIFT: u32 = 3;
const TRIPS_MASK: u64 = (1 << 6) - 1;
const GENERATION_SHIFT: u32 = 9;
/// Generations are counted modulo 2^13; a permit carries the masked value.
pub(crate) const GENERATION_MASK: u64 = (1 << 13) - 1;
const PAYLOAD_SHIFT: u32 = 22;
const PAYLOAD_MASK: u64 = (1 << 42) - 1;
const PROBE_BITS: u32 = 21;
const PROBE_MASK: u64 = (1 << PROBE_BITS) - 1;

/// Trips saturate here (cooldown growth stops growing past it).
pub(crate) const MAX_TRIPS: u32 = TRIPS_MASK as u32;
/// The latest representable end of an open cooldown, in milliseconds.
pub(crate) const MAX_OPEN_UNTIL_MS: u64 = PAYLOAD_MASK;
/// `half_open_calls` is clamped to this (the probe counters have 21 bits).
pub(crate) const MAX_HALF_OPEN_CALLS: u32 = PROBE_MASK as u32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Closed = 0,
    Open = 1,
    HalfOpen = 2,
    Isolated = 3,
    Disabled = 4,
}

impl Kind {
    fn from_bits(bits: u64) -> Kind {
        match bits & KIND_MASK {
            0 => Kind::Closed,
            1 => Kind::Open,
            2 => Kind::HalfOpen,
            3 => Kind::Isolated,
            _ => Kind::Disabled,
        }
    }

    fn state(self) -> CircuitState {
        match self {
            Kind::Closed => CircuitState::Closed,
            Kind::Open => CircuitState::Open,
            Kind::HalfOpen => CircuitState::HalfOpen,
            Kind::Isolated => CircuitState::Isolated,
            Kind::Disabled => CircuitState::Disabled,
        }
    }
}

/// The unpacked state word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Word {
    kind: Kind,
    trips: u32,
    generation: u64,
    payload: u64,
}

impl Word {
    fn unpack(bits: u64) -> Word {
        Word {
            kind: Kind::from_bits(bits),
            trips: ((bits >> TRIPS_SHIFT) & TRIPS_MASK) as u32,
            generation: (bits >> GENERATION_SHIFT) & GENERATION_MASK,
            payload: (bits >> PAYLOAD_SHIFT) & PAYLOAD_MASK,
        }
    }

    fn pack(self) -> u64 {
        (self.kind as u64)
            | ((u64::from(self.trips.min(MAX_TRIPS))) << TRIPS_SHIFT)
            | ((self.generation & GENERATION_MASK) << GENERATION_SHIFT)
            | ((self.payload & PAYLOAD_MASK) << PAYLOAD_SHIFT)
    }

    /// The word after a transition to `kind`: next generation.
    fn next(self, kind: Kind, trips: u32, payload: u64) -> Word {
        Word {
            kind,
            trips: trips.min(MAX_TRIPS),
            generation: (self.generation + 1) & GENERATION_MASK,
            payload,
        }
    }

    fn probes(self) -> (u32, u32) {
        (
            (self.payload & PROBE_MASK) as u32,
            ((self.payload >> PROBE_BITS) & PROBE_MASK) as u32,
        )
    }
}

fn probes_payload(admitted: u32, succeeded: u32) -> u64 {
    (u64::from(admitted) & PROBE_MASK) | ((u64::from(succeeded) & PROBE_MASK) << PROBE_BITS)
}

/// The end of a cooldown starting at `now_ns`, in whole milliseconds rounded
/// up (a circuit never half-opens before its cooldown is over).
pub(crate) fn open_until_ms(now_ns: u64, cooldown: Duration) -> u64 {
    let end = now_ns.saturating_add(duration_nanos(cooldown));
    end.div_ceil(NANOS_PER_MS).min(MAX_OPEN_UNTIL_MS)
}

/// A circuit breaker configuration, prepared for the state machine.
#[derive(Debug, Clone)]
pub(crate) struct BreakerParams {
    spec: CircuitBreaker,
    half_open_calls: u32,
    slow_call_ns: Option<u64>,
}

impl BreakerParams {
    pub(crate) fn new(spec: &CircuitBreaker) -> Self {
        BreakerParams {
            spec: spec.clone(),
            half_open_calls: spec.half_open_calls.clamp(1, MAX_HALF_OPEN_CALLS),
            slow_call_ns: spec
                .slow_call_rate
                .map(|_| duration_nanos(spec.slow_call_duration)),
        }
    }

    #[inline]
    fn is_slow(&self, duration: Duration) -> bool {
        self.slow_call_ns
            .is_some_and(|slow| duration_nanos(duration) >= slow)
    }

    /// The rates of a window decide to open.
    fn should_trip(&self, calls: u64, failures: u64, slow: u64, minimum_calls: u64) -> bool {
        if calls == 0 || calls < minimum_calls {
            return false;
        }
        let calls = calls as f64;
        failures as f64 / calls >= self.spec.failure_rate
            || self
                .spec
                .slow_call_rate
                .is_some_and(|threshold| slow as f64 / calls >= threshold)
    }
}

/// What the circuit answers to an admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CircuitAdmit {
    /// `Ok((generation, probe))`, or the retry-after of the rejection.
    pub(crate) decision: Result<(u64, bool), Option<Duration>>,
    /// Open to half-open, when this admission caused it.
    pub(crate) transition: Option<CircuitTransition>,
}

/// One circuit: the state word, the time of the last transition and, in
/// window modes, the window.
#[derive(Debug)]
pub(crate) struct Circuit {
    state: AtomicU64,
    since: AtomicU64,
    window: Option<Box<Window>>,
}

impl Circuit {
    /// A closed circuit with an empty window (window storage is allocated
    /// for window modes only).
    pub(crate) fn new(params: &BreakerParams) -> Self {
        let window = match params.spec.mode {
            BreakerMode::ConsecutiveFailures(_) => None,
            BreakerMode::CountWindow(n) => Some(Box::new(Window::Count(CountWindow::new(n)))),
            BreakerMode::TimeWindow(s) => Some(Box::new(Window::Time(TimeWindow::new(
                s,
                params.slow_call_ns.is_some(),
            )))),
        };
        Circuit {
            state: AtomicU64::new(0),
            since: AtomicU64::new(0),
            window,
        }
    }

    #[inline]
    fn load(&self) -> u64 {
        self.state.load(Ordering::Acquire)
    }

    fn cas(&self, current: u64, next: Word) -> Result<(), u64> {
        self.state
            .compare_exchange(current, next.pack(), Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
    }

    /// The generation of a closed or disabled circuit, which admits every
    /// call and changes nothing when it does. `Err(Some(left))` while open
    /// with `left` of the cooldown to go (the time is read only then),
    /// `Err(None)` otherwise.
    #[inline]
    pub(crate) fn quick_admit(
        &self,
        now: &mut impl FnMut() -> u64,
    ) -> Result<u64, Option<Duration>> {
        let bits = self.load();
        // Closed or disabled, the common case, straight from the bits (a
        // bit test: no jump table on the hot path).
        const PASS: u64 = (1 << Kind::Closed as u64) | (1 << Kind::Disabled as u64);
        if (PASS >> (bits & KIND_MASK)) & 1 == 1 {
            return Ok((bits >> GENERATION_SHIFT) & GENERATION_MASK);
        }
        Self::quick_refusal(bits, now)
    }

    /// [`quick_admit`](Self::quick_admit) of a circuit that is not closed.
    #[inline(never)]
    fn quick_refusal(bits: u64, now: &mut impl FnMut() -> u64) -> Result<u64, Option<Duration>> {
        let word = Word::unpack(bits);
        match word.kind {
            Kind::Closed | Kind::Disabled => Ok(word.generation),
            Kind::Open => {
                let until_ns = word.payload.saturating_mul(NANOS_PER_MS);
                let now_ns = now();
                if now_ns < until_ns {
                    Err(Some(Duration::from_nanos(until_ns - now_ns)))
                } else {
                    Err(None)
                }
            }
            Kind::HalfOpen | Kind::Isolated => Err(None),
        }
    }

    /// Admits one call (closed: one atomic load).
    #[inline]
    pub(crate) fn admit(&self, params: &BreakerParams, now_ns: u64) -> CircuitAdmit {
        let mut current = self.load();
        loop {
            let word = Word::unpack(current);
            match word.kind {
                Kind::Closed | Kind::Disabled => {
                    return CircuitAdmit {
                        decision: Ok((word.generation, false)),
                        transition: None,
                    }
                }
                Kind::Isolated => {
                    return CircuitAdmit {
                        decision: Err(None),
                        transition: None,
                    }
                }
                Kind::Open => {
                    let until_ns = word.payload.saturating_mul(NANOS_PER_MS);
                    if now_ns < until_ns {
                        return CircuitAdmit {
                            decision: Err(Some(Duration::from_nanos(until_ns - now_ns))),
                            transition: None,
                        };
                    }
                    let next = word.next(Kind::HalfOpen, word.trips, probes_payload(1, 0));
                    match self.cas(current, next) {
                        Ok(()) => {
                            self.since.store(now_ns, Ordering::Relaxed);
                            return CircuitAdmit {
                                decision: Ok((next.generation, true)),
                                transition: Some(CircuitTransition::HalfOpened),
                            };
                        }
                        Err(actual) => current = actual,
                    }
                }
                Kind::HalfOpen => {
                    let (admitted, succeeded) = word.probes();
                    if admitted >= params.half_open_calls {
                        return CircuitAdmit {
                            decision: Err(None),
                            transition: None,
                        };
                    }
                    let next = Word {
                        payload: probes_payload(admitted + 1, succeeded),
                        ..word
                    };
                    match self.cas(current, next) {
                        Ok(()) => {
                            return CircuitAdmit {
                                decision: Ok((word.generation, true)),
                                transition: None,
                            }
                        }
                        Err(actual) => current = actual,
                    }
                }
            }
        }
    }

    /// Gives back the probe slot of a half-open admission of `generation`.
    pub(crate) fn release_probe(&self, generation: u64) {
        let mut current = self.load();
        loop {
            let word = Word::unpack(current);
            let (admitted, succeeded) = word.probes();
            if word.kind != Kind::HalfOpen || word.generation != generation || admitted == 0 {
                return;
            }
            let next = Word {
                payload: probes_payload(admitted - 1, succeeded),
                ..word
            };
            match self.cas(current, next) {
                Ok(()) => return,
                Err(actual) => current = actual,
            }
        }
    }

    /// [`record`](Self::record) of a success that is not a probe, with the
    /// common cases that change nothing answered inline: a disabled circuit,
    /// a closed consecutive-mode circuit with no failure in a row, a full
    /// count window holding only fast successes.
    #[inline]
    pub(crate) fn record_success(
        &self,
        params: &BreakerParams,
        generation: u64,
        duration: Duration,
        now_ns: u64,
    ) -> Option<CircuitTransition> {
        let bits = self.load();
        let kind = bits & KIND_MASK;
        if kind == Kind::Disabled as u64 {
            return None;
        }
        // Closed in the admitting generation, a fast call: nothing changes
        // when no failure is counted in a row (consecutive mode) or the
        // count window holds only fast successes.
        let closed_in_generation =
            (Kind::Closed as u64) | ((generation & GENERATION_MASK) << GENERATION_SHIFT);
        let same = bits & (KIND_MASK | (GENERATION_MASK << GENERATION_SHIFT));
        if same == closed_in_generation && !params.is_slow(duration) {
            let unchanged = match self.window.as_deref() {
                None => (bits >> PAYLOAD_SHIFT) & PAYLOAD_MASK == 0,
                Some(Window::Count(w)) => w.only_fast_successes(),
                Some(Window::Time(_)) => false,
            };
            if unchanged {
                return None;
            }
        }
        self.record(
            params,
            generation,
            false,
            Outcome::Success,
            duration,
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
        let current = self.load();
        let word = Word::unpack(current);
        if word.generation != generation & GENERATION_MASK {
            return None;
        }
        let failure = match outcome {
            Outcome::Ignored => {
                if probe {
                    self.release_probe(word.generation);
                }
                return None;
            }
            Outcome::Success => false,
            Outcome::Failure => true,
        };
        let slow = params.is_slow(duration);
        match word.kind {
            Kind::Closed => match (&params.spec.mode, self.window.as_deref()) {
                (BreakerMode::ConsecutiveFailures(limit), _) => {
                    self.record_consecutive(params, current, failure, *limit, now_ns)
                }
                (_, Some(window)) => {
                    window.record(failure, slow, now_ns);
                    if !(failure || slow) {
                        return None;
                    }
                    let (calls, failures, slow_calls) = window.snapshot(now_ns);
                    let minimum = match params.spec.mode {
                        BreakerMode::CountWindow(n) => params.spec.minimum_calls.min(n),
                        _ => params.spec.minimum_calls,
                    };
                    if params.should_trip(calls, failures, slow_calls, u64::from(minimum)) {
                        self.trip(params, current, 1, now_ns)
                    } else {
                        None
                    }
                }
                (_, None) => None,
            },
            Kind::HalfOpen => self.record_probe(params, current, failure || slow, now_ns),
            Kind::Open | Kind::Isolated | Kind::Disabled => None,
        }
    }

    fn record_consecutive(
        &self,
        params: &BreakerParams,
        mut current: u64,
        failure: bool,
        limit: u32,
        now_ns: u64,
    ) -> Option<CircuitTransition> {
        let generation = Word::unpack(current).generation;
        loop {
            let word = Word::unpack(current);
            if word.kind != Kind::Closed || word.generation != generation {
                return None;
            }
            if !failure {
                // The common case: nothing to reset, nothing written.
                if word.payload == 0 {
                    return None;
                }
                match self.cas(current, Word { payload: 0, ..word }) {
                    Ok(()) => return None,
                    Err(actual) => {
                        current = actual;
                        continue;
                    }
                }
            }
            let in_a_row = word.payload.saturating_add(1);
            if in_a_row >= u64::from(limit) {
                match self.trip(params, current, 1, now_ns) {
                    Some(t) => return Some(t),
                    None => current = self.load(),
                }
            } else {
                match self.cas(
                    current,
                    Word {
                        payload: in_a_row,
                        ..word
                    },
                ) {
                    Ok(()) => return None,
                    Err(actual) => current = actual,
                }
            }
        }
    }

    fn record_probe(
        &self,
        params: &BreakerParams,
        mut current: u64,
        bad: bool,
        now_ns: u64,
    ) -> Option<CircuitTransition> {
        let generation = Word::unpack(current).generation;
        loop {
            let word = Word::unpack(current);
            if word.kind != Kind::HalfOpen || word.generation != generation {
                return None;
            }
            if bad {
                match self.trip(params, current, word.trips.saturating_add(1), now_ns) {
                    Some(t) => return Some(t),
                    None => {
                        current = self.load();
                        continue;
                    }
                }
            }
            let (admitted, succeeded) = word.probes();
            let succeeded = succeeded + 1;
            if succeeded >= params.half_open_calls {
                let next = word.next(Kind::Closed, 0, 0);
                match self.cas(current, next) {
                    Ok(()) => {
                        self.since.store(now_ns, Ordering::Relaxed);
                        self.clear_window();
                        return Some(CircuitTransition::Closed);
                    }
                    Err(actual) => current = actual,
                }
            } else {
                let next = Word {
                    payload: probes_payload(admitted, succeeded),
                    ..word
                };
                match self.cas(current, next) {
                    Ok(()) => return None,
                    Err(actual) => current = actual,
                }
            }
        }
    }

    /// Opens the circuit from the exact state word `current`; `None` when
    /// the word changed in the meantime.
    fn trip(
        &self,
        params: &BreakerParams,
        current: u64,
        trips: u32,
        now_ns: u64,
    ) -> Option<CircuitTransition> {
        let trips = trips.min(MAX_TRIPS);
        let cooldown = params.spec.cooldown_for_trip(trips);
        let next = Word::unpack(current).next(Kind::Open, trips, open_until_ms(now_ns, cooldown));
        self.cas(current, next).ok()?;
        self.since.store(now_ns, Ordering::Relaxed);
        Some(CircuitTransition::Opened { cooldown })
    }

    fn clear_window(&self) {
        if let Some(window) = &self.window {
            window.clear();
        }
    }

    /// Manual control; the transition when the state changed.
    pub(crate) fn control(
        &self,
        control: CircuitControl,
        now_ns: u64,
    ) -> Option<CircuitTransition> {
        let mut current = self.load();
        loop {
            let word = Word::unpack(current);
            let (next, transition) = match control {
                CircuitControl::Isolate => {
                    if word.kind == Kind::Isolated {
                        return None;
                    }
                    (
                        word.next(Kind::Isolated, word.trips, 0),
                        Some(CircuitTransition::Opened {
                            cooldown: Duration::MAX,
                        }),
                    )
                }
                CircuitControl::ForceClose => {
                    if word.kind == Kind::Disabled {
                        return None;
                    }
                    (
                        word.next(Kind::Disabled, word.trips, 0),
                        Some(CircuitTransition::Closed),
                    )
                }
                CircuitControl::Reset => (
                    word.next(Kind::Closed, 0, 0),
                    (word.kind != Kind::Closed).then_some(CircuitTransition::Closed),
                ),
            };
            match self.cas(current, next) {
                Ok(()) => {
                    self.since.store(now_ns, Ordering::Relaxed);
                    if next.kind == Kind::Closed {
                        self.clear_window();
                    }
                    return transition;
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// State, window and trips.
    pub(crate) fn metrics(&self, params: &BreakerParams, now_ns: u64) -> CircuitMetrics {
        let word = Word::unpack(self.load());
        let (calls, failures, slow_calls) = match (&params.spec.mode, self.window.as_deref()) {
            (BreakerMode::ConsecutiveFailures(_), _) | (_, None) => {
                let in_a_row = if word.kind == Kind::Closed {
                    word.payload
                } else {
                    0
                };
                (in_a_row, in_a_row, 0)
            }
            (_, Some(window)) => window.snapshot(now_ns),
        };
        let rate = |n: u64| {
            if calls == 0 {
                0.0
            } else {
                n as f64 / calls as f64
            }
        };
        let since = self.since.load(Ordering::Relaxed);
        CircuitMetrics {
            state: word.kind.state(),
            calls,
            failures,
            slow_calls,
            failure_rate: rate(failures),
            slow_call_rate: rate(slow_calls),
            time_in_state: Duration::from_nanos(now_ns.saturating_sub(since)),
            trips: word.trips,
        }
    }

    /// `true` when the circuit holds nothing worth keeping for an idle
    /// partition: closed (a partial window may be lost), not open,
    /// half-open or under manual control.
    pub(crate) fn is_idle(&self) -> bool {
        Word::unpack(self.load()).kind == Kind::Closed
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
/// calls), each an `AtomicU64` of `[second: 32 bits | count: 32 bits]`. A
/// counter tagged with an older second is reset by the first write of its
/// new second; counts saturate.
#[derive(Debug)]
struct TimeWindow {
    seconds: u32,
    measures: usize,
    counters: Box<[AtomicU64]>,
}

const CALLS: usize = 0;
const FAILURES: usize = 1;
const SLOW: usize = 2;

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
        let tag_now = (now_ns / NANOS_PER_SEC) as u32;
        let mut sums = [0u64; 3];
        for bucket in self.counters.chunks(self.measures) {
            for (measure, counter) in bucket.iter().enumerate() {
                let bits = counter.load(Ordering::Acquire);
                let (tag, count) = ((bits >> 32) as u32, bits & u64::from(u32::MAX));
                // Seconds (now - W, now]; a tag ahead of `now` (time went
                // backwards for this caller) wraps to a huge distance.
                if tag_now.wrapping_sub(tag) < self.seconds {
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

/// Adds one to a `[second | count]` counter for `second`.
fn bump(counter: &AtomicU64, second: u64) {
    let tag = second as u32;
    let mut current = counter.load(Ordering::Acquire);
    loop {
        let (old_tag, count) = ((current >> 32) as u32, current & u64::from(u32::MAX));
        let next = if old_tag == tag || (old_tag.wrapping_sub(tag) as i32) > 0 {
            // This second (or a later one, when time went backwards for
            // this caller: count into it rather than wipe it).
            (u64::from(old_tag) << 32) | (count + 1).min(u64::from(u32::MAX))
        } else {
            (u64::from(tag) << 32) | 1
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

    const MS: u64 = NANOS_PER_MS;
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
    fn word_round_trips() {
        let w = Word {
            kind: Kind::HalfOpen,
            trips: 63,
            generation: GENERATION_MASK,
            payload: probes_payload(MAX_HALF_OPEN_CALLS, 7),
        };
        assert_eq!(Word::unpack(w.pack()), w);
        assert_eq!(w.probes(), (MAX_HALF_OPEN_CALLS, 7));
        let wrapped = w.next(Kind::Open, 99, MAX_OPEN_UNTIL_MS);
        assert_eq!(wrapped.generation, 0);
        assert_eq!(wrapped.trips, MAX_TRIPS);
        assert_eq!(Word::unpack(wrapped.pack()), wrapped);
    }

    #[test]
    fn open_until_rounds_up_and_saturates() {
        assert_eq!(open_until_ms(0, Duration::from_millis(100)), 100);
        assert_eq!(open_until_ms(MS / 2, Duration::from_millis(100)), 101);
        assert_eq!(open_until_ms(u64::MAX, Duration::MAX), MAX_OPEN_UNTIL_MS);
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
        assert_eq!(c.admit(&p, 11 * S).decision, Err(None), "one probe only");
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
        assert_eq!(c.admit(&p, 5 * MS).decision, Err(None));
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
