//! The call engine: one state machine for `run` (async) and `call` (sync).
//!
//! Every call goes through the same steps, whichever driver runs it:
//!
//! ```text
//! start ─▶ admit ─▶ (the driver runs the attempt) ─▶ ended ─▶ finish
//!            ▲  │ Wait: deferred                       │ Retry: backoff
//!            │  ▼                                      │
//!          waited ◀── (the driver sleeps) ◀────────────┘ retry
//! ```
//!
//! [`Call`] holds what the call has done so far and decides each step: the
//! admission through the stateful policies (circuit, bulkhead, cooldown, rate
//! limit, in one store operation), a deferral when a wait fits, the record
//! of an attempt's outcome, the retry decision, the fallback. It does no
//! I/O: running the operation, sleeping and asking a store that is not in
//! memory are the driver's ([`Admit::Ask`], [`Admit::Wait`], [`Ended::Record`],
//! [`Ended::Retry`]); the in-memory store never blocks and is called in
//! place. The drivers (`drive.rs`) are a few lines each, so sync and async
//! calls take the same decisions at the same instants.
//!
//! A pipeline has up to two gates, each its stateful policies bound to the
//! store: the attempt's (policies declared after the retry, or without
//! one) and the call's (declared before the retry, kept as the resource
//! `{name}#call`). Both go through the same steps ([`Level`] says which
//! gate a step is for): the call's gate admits the call once, before the
//! attempt's gate admits its first attempt (a refusal of either is
//! deferred the same way), and records the call's final outcome once, when
//! the retry decided it, before the fallback: a success, the final error's
//! verdict and retry-after hint, a timeout as a failure, measured from the
//! call's admission. A call that ends refused by the attempt's gate or the
//! retry budget after an attempt failed records that failure
//! ([`Call::refused`]); one refused before any attempt failed, or failed
//! by the store, gives the call's permit back without an outcome. A
//! pipeline with a call's gate takes the general loop from the start. In
//! shadow mode the same holds of the call a policy in shadow mode would
//! have refused, at any level (see
//! [`shadow`](crate::shadow#across-the-levels-of-a-pipeline)): from then
//! on its admissions are [shadowed already](crate::store::AdmitRequest::shadowed)
//! (the policies in shadow mode are not asked, an adaptive limit in shadow
//! mode lends no slot), and the call's gate keeps only what its enforcing
//! policies hold for it (`Shadow::split`), so that the policies in shadow
//! mode before it record nothing of it more than the enforcing pipeline
//! would.
//!
//! The common case is the engine's own entry, [`First`]: the first attempt
//! of a call nobody listens to, admitted in place by the memory store's
//! quick check (a closed circuit, a free slot, no cooldown, a permit) and,
//! when it succeeds, recorded in place. It keeps only the facts the engine
//! needs (when the attempt began, once read; its deadline) and applies the
//! same functions as [`Call`] (`admit_in_place`, `record_success_in_place`,
//! `context_of`, `watches_late`, `may_wait`); anything out of the ordinary
//! makes a [`Call`] of it where it stands ([`First::into_call`]) for the
//! general loop. A bare pipeline (no stateful policy, no timeout, no retry
//! budget) runs its first attempt as the operation itself. The clock is read
//! only when a policy needs the time; a record that may change the state (a
//! failure, a timeout, a hint, a probe) is stamped with the time it ended.
//! Whether anyone listens to events never changes a decision, an instant or
//! the stored state: it only adds the events.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::kind::{Fallen, Handles};
use super::{Gate, Kind, Pipeline};
use crate::adaptive::machine::{Lease, Limiter};
use crate::adaptive::rules::Signal;
use crate::bulkhead::queue::Place;
use crate::classify::{Verdict, VerdictKind};
use crate::context::{Context, PartitionKey};
use crate::error::{Error, Rejection, RejectionReason, StoreError, TimeoutError, TimeoutScope};
use crate::event::{AttemptOutcome, CallOutcome, EventKind, GiveUpReason};
use crate::fallback::BoxFallbackFuture;
use crate::shadow::{self, Shadow};
use crate::store::{
    Admission, AdmitRequest, BudgetStep, Outcome, Permit, Record, Recorded, Reservation, Reserve,
    ResourceState, Ticket,
};

/// The deadline binding an attempt, and where it comes from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    at: u64,
    scope: TimeoutScope,
    after: Duration,
    strict: bool,
}

/// The shortest and longest interval at which the oldest waiter of a
/// bulkhead queue asks the store again, the fallback for slots given back
/// by other processes sharing the store, which wake nobody in this process
/// (a release in this process wakes the oldest waiter at once, see
/// [`crate::bulkhead::queue`]). The interval doubles from the shortest to
/// the longest. The same on every store, so that a call observes the same
/// waits on each (the differential corpus compares them); on the memory
/// store, which only this process changes, the oldest waiter finds nothing
/// new there.
pub(crate) const QUEUE_POLL_MIN: Duration = Duration::from_millis(1);
pub(crate) const QUEUE_POLL_MAX: Duration = Duration::from_millis(20);

/// The waiting state of a deferred admission: since when it waits, the
/// place it holds in a queue of this process (the bulkhead's or the
/// adaptive limit's, left when the wait ends, see [`Call::stop_waiting`],
/// or when the call is dropped), the next interval at which it asks a
/// shared store again, the rate-limit permit it reserved (given back if it
/// is never used).
struct Waiting {
    since: u64,
    /// When the last wait began.
    last: u64,
    /// When the last wait ends unless the call's place is woken first.
    until: u64,
    queued: Option<Queued>,
    poll: Duration,
    /// The rate-limit permit reserved for this call, and when it is due on
    /// the pipeline's clock.
    reserved: Option<(Reservation, u64)>,
    /// The call's wait in a queue ran out and it took its last look (see
    /// [`queued`]).
    last_look: bool,
}

/// A deferred call's place in a queue of this process.
struct Queued {
    which: Queue,
    place: Place,
    /// When it joined the queue: its `max_wait` counts from then.
    joined: u64,
}

impl Waiting {
    /// The place the call holds in queue `which`, if any.
    fn place_in(&self, which: Queue) -> Option<&Place> {
        self.queued
            .as_ref()
            .filter(|q| q.which == which)
            .map(|q| &q.place)
    }

    /// The reserved rate-limit permit, if any.
    fn reservation(&self) -> Option<Reservation> {
        self.reserved.map(|(r, _)| r)
    }
}

/// A queue of this process a deferred call may wait in for a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    /// The bulkhead's, of the gate the call waits for.
    Bulkhead,
    /// The adaptive limit's.
    Adaptive,
}

/// Which gate of the pipeline a step is for: the stateful policies declared
/// before the retry (admitted once at the start of the call, given the
/// call's outcome once at its end) or those after it (each attempt).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Call,
    Attempt,
}

/// Which driver runs the call: the few rules that differ between blocking
/// and async code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Driver {
    /// `call`: timeouts are cooperative (a late result is noticed at the end
    /// of the attempt), a full bulkhead refuses at once.
    Sync,
    /// `run`: the future is dropped at its deadline, a full bulkhead may
    /// queue.
    Async,
}

/// The next step of an admission.
pub(crate) enum Admit<'g> {
    /// Admitted: run the attempt with this context, then call
    /// [`Call::ended`].
    Run(Context),
    /// Ask the store (not in memory) with this request, then call
    /// [`Call::admitted`] with its answer.
    Ask(AdmitRequest<'g>),
    /// Ask the store (not in memory) with this request and what the call
    /// may reserve or holds ([`ResourceState::admit_reserving`]), then call
    /// [`Call::admitted_reserving`] with its answer.
    AskReserving(AdmitRequest<'g>, Reserve),
    /// Deferred: sleep this long, then call [`Call::waited`].
    Wait(Duration),
    /// Refused: end the call with [`Call::refused`].
    Refused(Refused),
}

/// Why the ordinary admission did not decide.
pub(crate) enum Quick {
    /// The circuit is open and its cooldown not over.
    Refused(Rejection),
    /// The adaptive limit in shadow mode would refuse the attempt: it is
    /// reported, and the attempt goes on without a slot of it.
    Shadowed(Rejection),
    /// Anything else: the full admission decides.
    Other,
}

/// Why the gate did not admit an attempt.
pub(crate) enum Refused {
    Rejected(Rejection),
    Store(StoreError),
}

/// What an attempt that ended leaves to do.
pub(crate) enum Ended<'g, T, E> {
    /// The call's result, before the fallback: hand it to [`Call::finish`].
    Done(Result<T, Error<E>>),
    /// Give the outcome to the store (not in memory), then call
    /// [`Call::recorded`] with its answer and `Pending`.
    Record(Record<'g>, Pending<T, E>),
    /// Wait this long (an async driver yields when it is zero), then call
    /// [`Call::retry`] and admit the next attempt.
    Retry(Duration),
    /// A hedged attempt failed in a way hedging answers with a further
    /// attempt, and the call goes on: another attempt is under way or may
    /// start. The driver keeps the failure (the call's answer if no other
    /// comes: [`Call::hedges_exhausted`]) and tries the next hedge now if
    /// one is left ([`Call::hedge`]).
    Hedge(Failure<E>),
}

/// What a hedged call's timer is armed after ([`Call::hedge_timer`]).
#[derive(Clone, Copy)]
pub(crate) enum HedgeSince {
    /// The latest attempt started.
    Started,
    /// A hedge was refused.
    Refused,
}

/// An attempt's outcome waiting for the store to record it.
pub(crate) enum Pending<T, E> {
    Success(T),
    /// A value the operation judged itself ([`Call::ended`]): the call's
    /// value, its outcome for the call-level gate and its retry-after hint.
    Judged(T, Outcome, Option<Duration>),
    Failed(Failure<E>),
    /// The call's result, once the call-level gate recorded its outcome.
    Done(Result<T, Error<E>>),
}

/// A failed attempt: its verdict, its error (none when it timed out) and
/// the deadline it ran past.
pub(crate) struct Failure<E> {
    verdict: Verdict,
    error: Option<E>,
    timed_out: Option<Deadline>,
}

/// What the chaos policies inject into the attempt under way
/// ([`Call::inject`]): a delay to sleep on the pipeline's clock (inside the
/// attempt's deadline), then the attempt's result in place of the
/// operation's, if any.
pub(crate) struct Injection<T, E> {
    pub(crate) delay: Duration,
    pub(crate) result: Option<Result<T, E>>,
}

/// What [`Call::finish`] leaves to do.
pub(crate) enum Finish<T, E> {
    /// The call's result.
    Done(Result<T, Error<E>>),
    /// Await the async fallback, then hand its result to
    /// [`Call::fell_back`].
    Fallback(BoxFallbackFuture<T, E>),
}

/// What to do after a failed attempt.
enum Next {
    Retry(Duration),
    Stop(StopReason),
}

enum StopReason {
    /// Not retryable, or no retry policy.
    NotRetried,
    /// Attempts used up.
    Exhausted,
    /// The next wait would not fit the deadline.
    Deadline,
    /// The retry budget is empty.
    Budget,
}

/// One call through a pipeline. See the [module docs](self).
pub(crate) struct Call<'g, K: Kind> {
    pipeline: &'g Pipeline<K>,
    partition: Option<&'g PartitionKey>,
    driver: Driver,
    /// Someone listens to events (checked once per call).
    listening: bool,
    /// The attempt under way, from 1.
    attempt: u32,
    /// The previous backoff (decorrelated jitter grows from it).
    previous: Duration,
    /// Start of the call, for the `CallFinished` event (0 when nobody listens).
    started: u64,
    overall: Option<Deadline>,
    /// When the attempt under way began (its admission), once read.
    at: Option<u64>,
    deadline: Option<Deadline>,
    /// The permit of the attempt under way, given back if the call is
    /// dropped (a timeout, a cancelled future) or panics before the record.
    permit: Option<Permit>,
    /// The gate the admission under way (or the record handed to the
    /// driver) is for: the call's until it admitted the call.
    level: Level,
    /// The permit of the call-level gate, held from the call's admission
    /// to its end, given back like `permit`.
    call_permit: Option<Permit>,
    /// When the call-level gate admitted the call, once read.
    call_at: Option<u64>,
    /// The outcome (and retry-after hint) of the call's last failed
    /// attempt, kept while the call-level gate holds a permit: a call that
    /// ends with a refusal after an attempt failed records it
    /// ([`refused`](Self::refused)).
    call_failed: Option<(Outcome, Option<Duration>)>,
    /// The outcome the call-level gate records when the call ends, in
    /// place of the call's own: a call shadowed after an attempt failed
    /// ends, for the policies in shadow mode before the retry, as the
    /// enforcing pipeline ended it, with that failure ([`shadow_call`](Self::shadow_call)).
    call_ended_shadowed: Option<(Outcome, Option<Duration>)>,
    waiting: Option<Waiting>,
    /// The rate-limit permits each admission takes (1 unless weighted).
    weight: u32,
    /// The adaptive limit's slot of the attempt under way, given back with
    /// a sample when the attempt ends, without one if it never does.
    lease: Option<Lease>,
    /// Set when the fallback made the call's result (a coalesced call's
    /// leader asks, not to cache a fallback's value).
    fallback_seen: Option<&'g AtomicBool>,
    /// Hedging: the attempts started so far (the first included); the
    /// number of the latest.
    launched: u32,
    /// Hedging: the hedges tried and not yet admitted nor refused (at most
    /// `MAX_HEDGED_ATTEMPTS`).
    admitting: u8,
    /// Hedging: the attempts under way besides the one entered.
    others: u32,
    /// Hedging: no further attempt starts (its budget was empty).
    hedge_closed: bool,
    /// The attempt the call ended on was refused at its admission: it did
    /// not run, and [`attempts`](Self::attempts) does not count it.
    unstarted: bool,
    /// Hedging: why the hedge entered was tried, until it starts (`None`
    /// for the first attempt, or once started).
    trigger: Option<crate::event::HedgeTrigger>,
    /// The call's deposit to a retry budget kept in the store was made
    /// (with its first admission by the attempt's gate).
    earned: bool,
    /// A policy in shadow mode would have refused the call (at its gate,
    /// or an attempt of it, by its gate or the adaptive limit): the
    /// policies in shadow mode it meets from now on are not asked, and
    /// those before hold and record nothing of it (see
    /// [`shadow`](crate::shadow#across-the-levels-of-a-pipeline)).
    shadowed: bool,
    /// The adaptive limit in shadow mode would have refused the attempt
    /// under way: its gate's policies in shadow mode are not asked. (The
    /// call is shadowed too, unless the attempt is a hedge.)
    attempt_shadowed: bool,
}

/// What one attempt under way holds, apart from its call: a hedged call
/// has several attempts in flight, keeps each one's in a `Lane`, and
/// enters it into the call ([`Call::swap_lane`]) for each of the
/// attempt's steps, so every step is the engine's own. A lane dropped
/// before its attempt ended (a loser) gives back what it holds, as a
/// dropped call does.
pub(crate) struct Lane<'g> {
    gate: Option<&'g Gate>,
    partition: Option<&'g PartitionKey>,
    attempt: u32,
    at: Option<u64>,
    deadline: Option<Deadline>,
    permit: Option<Permit>,
    waiting: Option<Waiting>,
    /// The adaptive limit of the pipeline and the lane's slot of it.
    adaptive: Option<&'g Limiter>,
    lease: Option<Lease>,
    /// Why the hedge was tried, until it starts.
    trigger: Option<crate::event::HedgeTrigger>,
    /// The adaptive limit in shadow mode would have refused the attempt.
    attempt_shadowed: bool,
}

impl Drop for Lane<'_> {
    fn drop(&mut self) {
        if self.permit.is_some() || self.waiting.is_some() || self.lease.is_some() {
            // Its place in a queue is left as the waiting state goes.
            let reserved = self.waiting.take().and_then(|w| w.reservation());
            abandon_lease(self.adaptive, self.lease.take());
            abandon(self.gate, self.partition, self.permit.take(), reserved);
        }
    }
}

/// A call that gives back what it holds when it is dropped before its end
/// (a panic, a dropped future): the general loops own their call this way.
/// The ordinary path keeps its permit in a [`Held`], which gives it back
/// the same way.
pub(crate) struct Owned<'g, K: Kind>(pub(crate) Call<'g, K>);

impl<K: Kind> Drop for Owned<'_, K> {
    fn drop(&mut self) {
        let call = &mut self.0;
        if call.permit.is_some()
            || call.waiting.is_some()
            || call.call_permit.is_some()
            || call.lease.is_some()
        {
            let shared = &*call.pipeline.shared;
            // Its place in a queue is left as the waiting state goes.
            let reserved = call.waiting.take().and_then(|w| w.reservation());
            let level = call.level;
            abandon_lease(shared.adaptive.as_ref(), call.lease.take());
            abandon(
                shared.gate.as_ref(),
                call.partition,
                call.permit.take(),
                reserved.filter(|_| level == Level::Attempt),
            );
            abandon(
                shared.call_gate.as_ref(),
                call.partition,
                call.call_permit.take(),
                reserved.filter(|_| level == Level::Call),
            );
        }
    }
}

impl<'g, K: Kind> std::ops::Deref for Owned<'g, K> {
    type Target = Call<'g, K>;
    fn deref(&self) -> &Call<'g, K> {
        &self.0
    }
}

impl<'g, K: Kind> std::ops::DerefMut for Owned<'g, K> {
    fn deref_mut(&mut self) -> &mut Call<'g, K> {
        &mut self.0
    }
}

/// Gives back what a call dropped or panicking holds of `gate`: its permit
/// (without an outcome), its reserved rate-limit permit. (Its place in a
/// queue goes with its waiting state.)
#[cold]
#[inline(never)]
fn abandon(
    gate: Option<&Gate>,
    partition: Option<&PartitionKey>,
    permit: Option<Permit>,
    reserved: Option<Reservation>,
) {
    let Some(gate) = gate else { return };
    if let Some(p) = permit {
        gate.release(partition, p);
    }
    if let Some(reservation) = reserved {
        gate.state.give_back_reservation(partition, reservation);
    }
}

/// Marks the branch that calls it as the one laid out apart, so that a call
/// that skips it runs straight through: an adaptive limit, a retry budget,
/// a strict timeout, a clock read at the start or end of an attempt. Each is
/// configured on some pipelines and tested on every call; a call that takes
/// the branch pays a jump there and back, small beside what the branch does
/// (a clock read, an atomic update).
#[cold]
#[inline(never)]
fn apart() {}

/// The retry budget kept in this process, if any (a budget kept in the
/// store is earned and spent by the admissions).
#[inline(always)]
fn local_budget<K: Kind>(shared: &super::Shared<K>) -> Option<&crate::RetryBudget> {
    shared
        .retry
        .as_ref()
        .and_then(|r| r.budget.as_ref())
        .filter(|b| !b.is_shared())
}

/// Gives back what a call dropped or panicking holds of the adaptive
/// limit: its slot (without a sample). (Its place in the limit's queue
/// goes with its waiting state.)
#[cold]
#[inline(never)]
fn abandon_lease(adaptive: Option<&Limiter>, lease: Option<Lease>) {
    let (Some(limiter), Some(lease)) = (adaptive, lease) else {
        return;
    };
    limiter.give_back(lease);
}

impl<'g, K: Kind> Call<'g, K> {
    /// Starts a call: credits the retry budget, reads the clock if a policy
    /// (or a listener) needs the start of the call.
    #[inline(always)]
    pub(crate) fn start(
        pipeline: &'g Pipeline<K>,
        partition: Option<&'g PartitionKey>,
        driver: Driver,
    ) -> Self {
        let shared = &*pipeline.shared;
        if let Some(b) = local_budget(shared) {
            b.deposit();
        }
        if let Some(b) = shared.hedging.as_ref().and_then(|h| h.budget.as_ref()) {
            b.deposit();
        }
        Self::fresh(pipeline, partition, driver)
    }

    /// A call that starts now, without crediting the retry budget (a
    /// pass of the policies written in code around the call, whose call
    /// credited it).
    #[inline(always)]
    fn fresh(
        pipeline: &'g Pipeline<K>,
        partition: Option<&'g PartitionKey>,
        driver: Driver,
    ) -> Self {
        let shared = &*pipeline.shared;
        let listening = shared.listeners.enabled();
        let (started, overall, at, deadline) = begin(shared, partition, listening);
        Call {
            pipeline,
            partition,
            driver,
            listening,
            attempt: 1,
            previous: Duration::ZERO,
            started,
            overall,
            at,
            deadline,
            permit: None,
            level: if shared.call_gate.is_some() {
                Level::Call
            } else {
                Level::Attempt
            },
            call_permit: None,
            call_at: None,
            call_failed: None,
            call_ended_shadowed: None,
            waiting: None,
            weight: 1,
            lease: None,
            fallback_seen: None,
            launched: 1,
            admitting: 0,
            others: 0,
            hedge_closed: false,
            unstarted: false,
            trigger: None,
            earned: false,
            shadowed: false,
            attempt_shadowed: false,
        }
    }

    /// The call taking `weight` rate-limit permits per admission (by the
    /// same admission as any other, ordinary or not).
    pub(crate) fn weighted(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// A pass of the call that does not deposit to a retry budget kept in
    /// the store (the call's first pass did: one deposit per call).
    pub(crate) fn earned(mut self, earned: bool) -> Self {
        self.earned = earned;
        self
    }

    /// The call setting `seen` when its fallback makes its result.
    pub(crate) fn reporting_fallback(mut self, seen: Option<&'g AtomicBool>) -> Self {
        self.fallback_seen = seen;
        self
    }

    /// The start of an attempt must be read from the clock: a timeout, a
    /// policy that needs the time of the attempt (a rate limit, a slow-call
    /// or time-window breaker), a partition (its key's last use), a remote
    /// store, or someone listening (durations in events).
    #[inline(always)]
    fn needs_time(&self) -> bool {
        self.pipeline.shared.plan.needs_time || self.partition.is_some() || self.listening
    }

    #[inline(always)]
    fn read_clock(&self) -> u64 {
        self.pipeline.shared.clock.now_nanos()
    }

    /// The start of the attempt under way, read now if it was not yet.
    #[inline]
    fn now(&mut self) -> u64 {
        match self.at {
            Some(at) => at,
            None => {
                let now = self.read_clock();
                self.begin_at(now);
                now
            }
        }
    }

    /// The attempt under way begins at `now`: its deadline is the nearer of
    /// the overall one and its own.
    #[inline]
    fn begin_at(&mut self, now: u64) {
        // (The first attempt's are set by `begin` or `admit_in_place`.)
        self.at = Some(now);
        self.deadline = attempt_deadline(&self.pipeline.shared, now, self.overall);
    }

    /// The context of the attempt under way: a constant (dropped for free)
    /// for a first attempt without deadline or partition.
    #[inline(always)]
    fn context(&self) -> Context {
        context_of(
            &self.pipeline.shared,
            self.attempt,
            self.deadline,
            self.partition,
        )
    }

    /// The deadline of the attempt under way, in nanoseconds on the
    /// pipeline's clock (for the async driver's timer).
    #[inline(always)]
    pub(crate) fn deadline(&self) -> Option<u64> {
        self.deadline.map(|d| d.at)
    }

    #[inline]
    fn emit(&self, kind: impl FnOnce() -> EventKind) {
        if self.listening {
            self.pipeline.emit(self.partition, kind);
        }
    }

    /// The store of the gate, for the driver's [`Admit::Ask`] and
    /// [`Ended::Record`].
    pub(crate) fn store(&self) -> &'g dyn ResourceState {
        &*self.gate().state
    }

    /// The pipeline's clock, for the driver's sleeps.
    pub(crate) fn clock(&self) -> &'g crate::clock::ClockHandle {
        &self.pipeline.shared.clock
    }

    /// The gate of the step under way.
    fn gate(&self) -> &'g Gate {
        self.gate_of(self.level)
            .expect("a permit comes from the gate")
    }

    fn gate_of(&self, level: Level) -> Option<&'g Gate> {
        let shared = &*self.pipeline.shared;
        match level {
            Level::Attempt => shared.gate.as_ref(),
            Level::Call => shared.call_gate.as_ref(),
        }
    }

    /// Keeps the permit of the gate that just admitted: the attempt's (the
    /// attempt may run), or the call's (the attempt's gate comes next:
    /// `false`).
    fn hold(&mut self, permit: Option<Permit>) -> bool {
        match self.level {
            Level::Attempt => {
                self.permit = permit;
                true
            }
            Level::Call => {
                self.call_permit = permit;
                self.call_at = self.at;
                self.level = Level::Attempt;
                false
            }
        }
    }

    /// Gives back the call-level permit without an outcome: the call ends
    /// with a refusal of its own (an attempt's gate, the retry budget)
    /// before any attempt failed, or a store error, which says nothing of
    /// the dependency.
    fn release_call(&mut self) {
        if let Some(permit) = self.call_permit.take() {
            if let Some(gate) = self.gate_of(Level::Call) {
                gate.release(self.partition, permit);
            }
        }
    }

    /// The wait of a deferred admission is over: `admitted` (the call took
    /// its slot) or not, its queue place is left (passing on a wake-up it
    /// did not use), and a reservation it did not use is given back.
    fn stop_waiting(&mut self, admitted: bool) {
        if let Some(w) = self.waiting.take() {
            if let Some((reservation, _)) = w.reserved {
                self.gate()
                    .state
                    .give_back_reservation(self.partition, reservation);
            }
            if let (Some(q), true) = (w.queued, admitted) {
                q.place.admitted();
            }
        }
    }

    /// A future that completes after `wait`, or as soon as the call's
    /// place in a queue is woken (a slot was given back for it): the
    /// driver's wait for [`Admit::Wait`], then it calls
    /// [`waited`](Self::waited).
    pub(crate) fn wait(&self, wait: Duration) -> super::drive::Wait {
        let notified = self
            .waiting
            .as_ref()
            .and_then(|w| w.queued.as_ref())
            .map(|q| q.place.notified());
        let yields = wait.is_zero().then(|| self.clock().hold());
        super::drive::Wait::new(notified, self.clock().sleep(wait), yields)
    }

    /// The call may ask for a bulkhead slot of the gate under way: nobody
    /// waits in its queue, or its place there was woken (see
    /// [`crate::bulkhead::queue`]); else it is refused as by a full
    /// bulkhead, and queues.
    fn held_back(&self) -> Option<Rejection> {
        let gate = self.gate_of(self.level)?;
        let queues = gate.queues.as_ref()?;
        let place = self
            .waiting
            .as_ref()
            .and_then(|w| w.place_in(Queue::Bulkhead));
        match queues.may_ask(self.partition, place, true) {
            true => None,
            false => Some(Rejection::new(RejectionReason::BulkheadFull, None)),
        }
    }

    /// The adaptive limit's slot of an attempt that does not run (a
    /// refusal, a wait): given back without a sample.
    fn give_back_lease(&mut self) {
        if let Some(lease) = self.lease.take() {
            if let Some(limiter) = &self.pipeline.shared.adaptive {
                limiter.give_back(lease);
            }
        }
    }

    /// The adaptive limit's slot of the attempt that ended at `end` (a
    /// reading of the clock, [`ClockHandle::ticks`](crate::clock::ClockHandle::ticks)),
    /// with its sample; a change of the limit is reported.
    fn release_lease(&mut self, signal: Signal, end: u64) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        let shared = &*self.pipeline.shared;
        let Some(limiter) = &shared.adaptive else {
            return;
        };
        let clock = &shared.clock;
        if let Some((previous, limit)) = limiter.release(lease, signal, end, clock, &*shared.random)
        {
            self.emit(|| EventKind::LimitChanged { previous, limit });
        }
    }

    // ------------------------------------------------------------ admission

    /// The ordinary admission, decided in place: no gate, or a memory gate
    /// whose quick check admits (a closed circuit, a free slot, no cooldown,
    /// a permit), reading the clock only if a policy needs it. Anything
    /// else is for [`admit_after`](Self::admit_after).
    ///
    /// The call-level gate, if any, admits the call first (once), then the
    /// attempt's gate the attempt.
    #[inline(always)]
    pub(crate) fn admit_ordinary(&mut self) -> Result<Context, Quick> {
        loop {
            self.admit_adaptive_slot()?;
            let gate = self.gate_of(self.level);
            if self.shadowed() && gate.is_some_and(|g| Shadow::of(&g.spec).any()) {
                // The quick check asks every policy: the full admission
                // leaves out those in shadow mode.
                return Err(Quick::Other);
            }
            let clock = &self.pipeline.shared.clock;
            let ticket = admit_in_place(gate, clock, self.partition, self.weight, self.at)?;
            if self.waiting.is_some() {
                self.stop_waiting(true);
            }
            if self.hold(ticket.map(Ticket::permit)) {
                return Ok(self.context());
            }
        }
    }

    /// The adaptive limit's slot of the attempt under way, taken first
    /// (at the attempt's level, once): every admission of an attempt goes
    /// through here, whichever way its gate is then asked.
    #[inline(always)]
    fn admit_adaptive_slot(&mut self) -> Result<(), Quick> {
        let shared = &*self.pipeline.shared;
        if let (Level::Attempt, None, Some(limiter)) = (self.level, &self.lease, &shared.adaptive) {
            self.lease = Some(if shadow::takes_part(limiter.shadow(), self.shadowed()) {
                let place = self
                    .waiting
                    .as_ref()
                    .and_then(|w| w.place_in(Queue::Adaptive));
                admit_adaptive(limiter, &shared.clock, self.partition, place)?
            } else {
                apart();
                Lease::UNHELD
            });
        }
        Ok(())
    }

    /// Admits the attempt under way.
    pub(crate) fn admit(&mut self) -> Admit<'g> {
        if self.pipeline.shared.plan.budget_in_store {
            // A retry budget kept in the store is asked in the full
            // admission, after the adaptive limit.
            return match self.admit_adaptive_slot() {
                Ok(()) => self.admit_after(Quick::Other),
                Err(quick) => self.admit_after(quick),
            };
        }
        match self.admit_ordinary() {
            Ok(ctx) => Admit::Run(ctx),
            Err(quick) => self.admit_after(quick),
        }
    }

    /// The admission, after the ordinary one did not decide it.
    pub(crate) fn admit_after(&mut self, quick: Quick) -> Admit<'g> {
        match quick {
            Quick::Refused(open) => self.refuse(open),
            Quick::Shadowed(r) => {
                self.shadow_rejected(r);
                self.lease = Some(Lease::UNHELD);
                self.attempt_shadowed = true;
                self.shadow_call();
                self.admit()
            }
            Quick::Other => {
                if let Some(full) = self.held_back() {
                    return self.refuse(full);
                }
                let gate = self.gate();
                let now = self.now();
                let request = self.request(now);
                match gate.memory.as_deref() {
                    Some(memory) if self.may_reserve() => {
                        self.admit_reserving(memory, request, None)
                    }
                    Some(memory) => self.admitted(memory.admit(&request)),
                    None if self.may_reserve() => {
                        Admit::AskReserving(request, self.reserve(now, None))
                    }
                    None => Admit::Ask(request),
                }
            }
        }
    }

    /// The store's request for the admission under way, at `now`.
    fn request(&mut self, now: u64) -> AdmitRequest<'g> {
        AdmitRequest {
            partition: self.partition,
            now: Duration::from_nanos(now),
            weight: self.weight,
            budget: self.budget_step(),
            shadowed: self.shadowed(),
        }
    }

    /// The admission under way is for a call or an attempt shadowed
    /// already.
    #[inline(always)]
    fn shadowed(&self) -> bool {
        self.shadowed || self.attempt_shadowed
    }

    /// The call is shadowed from now on (see
    /// [`shadow`](crate::shadow#across-the-levels-of-a-pipeline)): what the
    /// call-level policies in shadow mode hold for it is given back, and
    /// they will record nothing of it. A hedge shadows itself alone: a
    /// refused hedge does not end an enforcing call.
    fn shadow_call(&mut self) {
        if self.trigger.is_some() || self.shadowed {
            return;
        }
        self.shadowed = true;
        let Some(gate) = self.gate_of(Level::Call) else {
            return;
        };
        let shadow = Shadow::of(&gate.spec);
        match self.call_permit {
            Some(permit) if shadow.any() && !permit.shadowed => {
                let (mut kept, given) = shadow.split(permit);
                if let Some(failed) = self.call_failed {
                    // Enforcing, the call would end here with the failure
                    // of its last attempt, which the call's gate records
                    // (`refused`): the policies in shadow mode record it
                    // when the call ends, in place of its own outcome.
                    kept.shadowed = false;
                    self.call_ended_shadowed = Some(failed);
                }
                self.call_permit = Some(kept);
                if let Some(given) = given {
                    gate.state.release(self.partition, given);
                }
            }
            _ => {}
        }
    }

    /// An attempt admitted shadowed by its gate: the slot a shadow
    /// adaptive limit lent it is given back (it makes no sample).
    fn shadowed_attempt(&mut self) {
        if let (Some(limiter), Some(lease)) = (&self.pipeline.shared.adaptive, self.lease) {
            if limiter.shadow() {
                limiter.give_back(lease);
                self.lease = Some(Lease::UNHELD);
            }
        }
    }

    /// What the admission under way does to a retry budget kept in the
    /// store: the call's first admission by the attempt's gate deposits,
    /// a retry's admission withdraws; nothing without such a budget (or
    /// at the call's gate).
    fn budget_step(&mut self) -> Option<BudgetStep> {
        self.gate().spec.retry_budget.as_ref()?;
        if self.attempt > 1 {
            return Some(BudgetStep::Withdraw);
        }
        if self.earned {
            return None;
        }
        self.earned = true;
        Some(BudgetStep::Deposit)
    }

    /// The store's answer to [`Admit::Ask`] (or the memory store's).
    pub(crate) fn admitted(&mut self, answer: Result<Admission, StoreError>) -> Admit<'g> {
        self.admitted_with(answer, None)
    }

    /// The store's answer, with the rate-limit permit it reserved.
    fn admitted_with(
        &mut self,
        answer: Result<Admission, StoreError>,
        reserved: Option<Reservation>,
    ) -> Admit<'g> {
        let admission = match answer {
            Ok(a) => a,
            Err(e) => {
                self.emit(|| EventKind::StoreUnavailable {
                    error: e.to_string(),
                    degraded: false,
                });
                self.give_back_lease();
                return Admit::Refused(Refused::Store(e));
            }
        };
        if let Some(t) = admission.transition {
            self.emit(|| EventKind::of_transition(t));
        }
        if let Some(e) = &admission.degraded {
            self.emit(|| EventKind::StoreUnavailable {
                error: e.to_string(),
                degraded: true,
            });
        }
        if let (Some(r), Ok(_)) = (admission.shadow, &admission.decision) {
            self.shadow_rejected(r);
        }
        match admission.decision {
            Ok(permit) => {
                self.stop_waiting(true);
                let attempt = self.hold(Some(permit));
                if permit.shadowed {
                    if attempt {
                        self.shadowed_attempt();
                    }
                    self.shadow_call();
                }
                if attempt {
                    Admit::Run(self.context())
                } else {
                    self.admit()
                }
            }
            Err(r) => self.refuse_with(r, reserved),
        }
    }

    /// A policy in shadow mode would have refused `r`: reported, the call
    /// goes on.
    #[cold]
    #[inline(never)]
    fn shadow_rejected(&self, r: Rejection) {
        self.emit(|| EventKind::ShadowRejected {
            reason: r.reason,
            retry_after: r.retry_after,
        });
    }

    /// A refusal: deferred when a wait for it fits, final otherwise.
    fn refuse(&mut self, rejection: Rejection) -> Admit<'g> {
        self.refuse_with(rejection, None)
    }

    /// A refusal that may come with a reserved rate-limit permit: the call
    /// waits for it, or gives it back when it does not wait.
    fn refuse_with(&mut self, rejection: Rejection, reserved: Option<Reservation>) -> Admit<'g> {
        // No slot of the adaptive limit is held while the call waits or
        // after it was refused.
        self.give_back_lease();
        match self.deferral(rejection, reserved) {
            Ok((wait, reported)) => {
                if let Some(at_most) = reported {
                    self.emit(|| EventKind::Deferred {
                        reason: rejection.reason,
                        wait: at_most,
                    });
                }
                Admit::Wait(wait)
            }
            Err(r) => {
                if let Some(reservation) = reserved {
                    self.gate()
                        .state
                        .give_back_reservation(self.partition, reservation);
                }
                self.stop_waiting(false);
                Admit::Refused(Refused::Rejected(r))
            }
        }
    }

    /// After the wait of [`Admit::Wait`]: the attempt is admitted again,
    /// and runs from now; a call that reserved its rate-limit permit
    /// presents it, once it is due. The attempt's deadline stays the one it
    /// had before the wait, which the wait is part of. (Not ordinary: a
    /// deferred call is reported.)
    pub(crate) fn waited(&mut self) -> Admit<'g> {
        let now = self.read_clock();
        match self.at {
            Some(_) => self.at = Some(now),
            None => self.begin_at(now),
        }
        if let Some(q) = self.waiting.as_ref().and_then(|w| w.queued.as_ref()) {
            q.place.awake();
        }
        let held = self.waiting.as_mut().and_then(|w| w.reserved.take());
        let Some((reservation, due)) = held else {
            return self.admit();
        };
        if now < due {
            if let Some(w) = &mut self.waiting {
                w.reserved = Some((reservation, due));
            }
            return Admit::Wait(Duration::from_nanos(due - now));
        }
        if let Some(full) = self.held_back() {
            // The permit stays reserved while the call waits for its slot.
            if let Some(w) = &mut self.waiting {
                w.reserved = Some((reservation, due));
            }
            return self.refuse(full);
        }
        let request = self.request(now);
        match self.gate().memory.as_deref() {
            Some(memory) => self.admit_reserving(memory, request, Some(reservation)),
            None => Admit::AskReserving(request, self.reserve(now, Some(reservation))),
        }
    }

    /// The store's answer to [`Admit::AskReserving`].
    pub(crate) fn admitted_reserving(
        &mut self,
        answer: Result<(Admission, Option<Reservation>), StoreError>,
    ) -> Admit<'g> {
        match answer {
            Ok((admission, reserved)) => self.admitted_with(Ok(admission), reserved),
            Err(e) => self.admitted(Err(e)),
        }
    }

    /// What the call at `now` brings to an admission that may reserve: the
    /// lead ([`reserve_lead`](Self::reserve_lead)) and the due reservation
    /// it holds.
    fn reserve(&self, now: u64, held: Option<Reservation>) -> Reserve {
        Reserve {
            within: self.reserve_lead(now),
            held,
        }
    }

    /// The rate limiter lets calls wait for a permit: a refusal may reserve
    /// it.
    #[inline]
    fn may_reserve(&self) -> bool {
        self.gate()
            .spec
            .rate_limit
            .as_ref()
            .is_some_and(|r| !r.max_wait.is_zero() && !r.shadow)
    }

    /// The admission on the memory store of a call whose rate limiter lets
    /// it wait: a refusal reserves the next permit when the wait for it
    /// fits ([`reserve_lead`](Self::reserve_lead)); `held`, a due
    /// reservation, stands for the permit.
    #[cold]
    #[inline(never)]
    fn admit_reserving(
        &mut self,
        memory: &crate::store::MemoryResource,
        request: AdmitRequest<'_>,
        held: Option<Reservation>,
    ) -> Admit<'g> {
        let now = crate::clock::duration_nanos(request.now);
        let answer = memory.admit_reserving(&request, self.reserve(now, held));
        self.admitted_reserving(answer)
    }

    /// The longest wait for which the rate limiter may reserve this call's
    /// permit at `now`: what its `max_wait` still allows (the time already
    /// waited counts), up to the deadline ([`deferral`](Self::deferral)
    /// takes a wait that fits exactly these bounds). Zero when the call
    /// cannot wait again (a clock that did not move).
    fn reserve_lead(&self, now: u64) -> Duration {
        let Some(r) = &self.gate().spec.rate_limit else {
            return Duration::ZERO;
        };
        let waited = match &self.waiting {
            Some(w) if now <= w.last => return Duration::ZERO,
            Some(w) => now - w.since,
            None => 0,
        };
        let mut lead = r.max_wait.saturating_sub(Duration::from_nanos(waited));
        if let Some(d) = self.deadline {
            let room = d.at.saturating_sub(now);
            lead = lead.min(Duration::from_nanos(room));
        }
        lead
    }

    /// How long to wait before asking the gate again, and the wait to
    /// report (`Deferred`) when this one begins a wait, or the final
    /// refusal. A call never waits past its deadline. A wait for a cooldown
    /// or a permit is one wait, of its length, within the policy's
    /// `max_wait` counted from the call's first wait; a rate-limit refusal
    /// that `reserved` the call's permit waits for it (the caller gives it
    /// back on a refusal). A call refused for want of a slot waits in a
    /// queue of this process ([`queued`]) until its place is woken, at most
    /// the queue's `max_wait` from when it joined, and reports once, when
    /// it joins, the most it may wait.
    fn deferral(
        &mut self,
        rejection: Rejection,
        reserved: Option<Reservation>,
    ) -> Result<(Duration, Option<Duration>), Rejection> {
        let gate = self.gate_of(self.level);
        if !may_wait(rejection.reason, self.driver) {
            return Err(rejection);
        }
        let now = self.now();
        let deadline = self.deadline.map(|d| d.at);
        let room = deadline.map(|at| Duration::from_nanos(at.saturating_sub(now)));
        let fits = |wait: Duration| {
            deadline.is_none_or(|at| {
                crate::timeout::wait_fits(now, crate::clock::duration_nanos(wait), at)
            })
        };
        let first_wait = self.waiting.is_none();
        let adaptive = self.pipeline.shared.adaptive.as_ref();
        let partition = self.partition;
        let waiting = self.waiting.get_or_insert(Waiting {
            since: now,
            last: now,
            until: now,
            queued: None,
            poll: QUEUE_POLL_MIN,
            reserved: None,
            last_look: false,
        });
        let wanted = match rejection.reason {
            RejectionReason::ConcurrencyLimited => Some(Queue::Adaptive),
            RejectionReason::BulkheadFull => Some(Queue::Bulkhead),
            _ => None,
        };
        if let Some(wanted) = wanted {
            match waiting.place_in(wanted) {
                // Woken and refused again, or not yet its turn: it waits
                // again in its place.
                Some(place) => {
                    place.refused();
                }
                // Refused for want of a slot by one queue's policy after it
                // waited in the other's: it leaves the other queue.
                None => waiting.queued = None,
            }
        }
        // A clock that did not move while the call waited out a wait (a
        // virtual clock at the last instant of its range) has no later
        // instant to wait for: refused, never deferred in a loop. (A wait
        // for a slot ends early, at the same instant, when a slot is given
        // back.)
        if !first_wait && now <= waiting.last && now >= waiting.until {
            return Err(rejection);
        }
        waiting.last = now;
        // What a policy's `max_wait` still allows: the time already waited
        // counts.
        let waited = Duration::from_nanos(now.saturating_sub(waiting.since));
        let allowed = |max_wait: Duration| max_wait.saturating_sub(waited);
        let deferred = match rejection.reason {
            RejectionReason::CooldownActive => {
                let left = rejection.retry_after.unwrap_or(Duration::ZERO);
                if !fits(left) {
                    return Err(Rejection::new(
                        RejectionReason::CooldownExceedsDeadline,
                        rejection.retry_after,
                    ));
                }
                match gate.and_then(|g| g.spec.cooldown.as_ref()) {
                    Some(c) if left <= allowed(c.max_wait) => Ok((left, Some(left))),
                    _ => Err(rejection),
                }
            }
            // A limiter that refuses and says "now" (at the last instant of
            // the clock, when its next window cannot be told) gives no
            // wait: refused, never deferred in a loop.
            RejectionReason::RateLimited => match (
                gate.and_then(|g| g.spec.rate_limit.as_ref()),
                rejection.retry_after,
            ) {
                (Some(r), Some(left))
                    if !left.is_zero() && left <= allowed(r.max_wait) && fits(left) =>
                {
                    let due = now.saturating_add(crate::clock::duration_nanos(left));
                    waiting.reserved = reserved.map(|res| (res, due));
                    Ok((left, Some(left)))
                }
                _ => Err(rejection),
            },
            RejectionReason::ConcurrencyLimited => {
                let Some(limiter) = adaptive else {
                    return Err(rejection);
                };
                let join = || limiter.queue(partition)?.join(limiter.max_queued);
                let queue = (Queue::Adaptive, join, false);
                queued(waiting, queue, limiter.max_wait, room, now).ok_or(rejection)
            }
            _ => {
                let Some((g, b)) = gate.and_then(|g| Some((g, g.spec.bulkhead.as_ref()?))) else {
                    return Err(rejection);
                };
                let join = || g.queues.as_ref()?.join(partition, b.max_queued);
                // The oldest waiter asks again at the fallback interval.
                let queue = (Queue::Bulkhead, join, true);
                queued(waiting, queue, b.max_wait, room, now).ok_or(rejection)
            }
        };
        if let Ok((wait, _)) = deferred {
            waiting.until = now.saturating_add(crate::clock::duration_nanos(wait));
        }
        deferred
    }

    /// Ends a refused call: the error, reported; hand it to
    /// [`finish`](Self::finish).
    ///
    /// A refusal after an attempt failed (the retry or the hedge that
    /// followed it refused) ends the call with that failure as the call's
    /// outcome, as an exhausted retry would: the call-level gate records it
    /// (handed to the driver as [`Ended::Record`]). Before any attempt
    /// failed, or on a store error, the call's permit goes back without
    /// an outcome.
    pub(crate) fn refused<T, E>(&mut self, refused: Refused) -> Ended<'g, T, E> {
        // The attempt refused did not run (a hedged call's refused first
        // attempt is marked by `hedge_not_started`; a refused hedge never
        // counted).
        if self.pipeline.shared.hedging.is_none() {
            self.unstarted = true;
        }
        let failed = match refused {
            Refused::Rejected(_) => self.call_failed.take(),
            Refused::Store(_) => None,
        };
        if failed.is_none() {
            self.release_call();
        }
        if let Refused::Rejected(r) = &refused {
            if r.reason == RejectionReason::RetryBudgetExhausted {
                // The retry's admission found the budget in the store empty.
                let attempts = self.attempt.saturating_sub(1);
                self.emit(|| EventKind::RetryGaveUp {
                    attempts,
                    reason: GiveUpReason::Budget,
                });
            }
        }
        let err = match refused {
            Refused::Rejected(r) => self.reject(r),
            Refused::Store(e) => Error::Store(e),
        };
        match failed {
            Some((outcome, hint)) => self.done(Err(err), outcome, hint),
            None => Ended::Done(Err(err)),
        }
    }

    fn reject<E>(&self, r: Rejection) -> Error<E> {
        let r = r.for_resource(self.pipeline.shared.name);
        self.emit(|| EventKind::Rejected {
            reason: r.reason,
            retry_after: r.retry_after,
        });
        Error::Rejected(r)
    }

    // ---------------------------------------------------------------- chaos

    /// The pipeline has chaos policies: the driver asks [`inject`](Self::inject)
    /// before each attempt.
    #[inline(always)]
    pub(crate) fn has_chaos(&self) -> bool {
        !self.pipeline.shared.chaos.is_empty()
    }

    /// What the chaos policies inject into the attempt `ctx`, in
    /// declaration order (see [`crate::chaos`]): latencies add up, a
    /// behaviour runs its hook now, a fault or an outcome ends the attempt
    /// (the policies after it are not asked).
    pub(crate) fn inject<T, E>(&self, ctx: &Context) -> Injection<T, E>
    where
        K: Handles<T, E>,
    {
        use crate::chaos::Action;
        let shared = &*self.pipeline.shared;
        let mut delay = Duration::ZERO;
        for chaos in shared.chaos.iter() {
            if !chaos.injects(ctx, &*shared.random) {
                continue;
            }
            let attempt = self.attempt;
            self.emit(|| EventKind::ChaosInjected {
                kind: chaos.kind(),
                attempt,
            });
            match &chaos.action {
                Action::Latency(d) => delay = delay.saturating_add(*d),
                Action::Behavior(hook) => hook(ctx),
                Action::Fault(slot) => {
                    if let Some(e) = K::chaos_fault(&shared.handlers, *slot, ctx) {
                        return Injection {
                            delay,
                            result: Some(Err(e)),
                        };
                    }
                }
                Action::Outcome(slot) => {
                    if let Some(v) = K::chaos_outcome(&shared.handlers, *slot, ctx) {
                        return Injection {
                            delay,
                            result: Some(Ok(v)),
                        };
                    }
                }
            }
        }
        Injection {
            delay,
            result: None,
        }
    }

    // -------------------------------------------------------------- outcome

    /// The attempt under way ended: with the operation's result, or `None`
    /// when the async driver dropped it at its deadline. `judged` is the
    /// operation's own verdict on its result (an adapter that saw more than
    /// the result, such as the status of a response): on an error, used
    /// when the pipeline has no classifier of its own; on a value, see
    /// [`answered`](Self::answered).
    #[inline(always)]
    pub(crate) fn ended<T, E>(
        &mut self,
        result: Option<Result<T, E>>,
        judged: Option<Verdict>,
    ) -> Ended<'g, T, E>
    where
        K: Handles<T, E>,
    {
        match (result, judged) {
            (Some(Ok(v)), None) => self.succeeded(v),
            (Some(Ok(v)), Some(verdict)) => self.answered(v, verdict),
            (Some(Err(e)), judged) => self.failed(e, judged),
            (None, _) => self.timed_out(),
        }
    }

    /// A value the operation returns although it judged it `verdict` (an
    /// HTTP status that no error of the operation's type stands for, such
    /// as a 600): the value ends the call as a success does (it is never
    /// retried or hedged) and is recorded as the verdict says, a failure
    /// against the circuit, its retry-after hint honoured.
    #[cold]
    #[inline(never)]
    fn answered<T, E>(&mut self, v: T, verdict: Verdict) -> Ended<'g, T, E>
    where
        K: Handles<T, E>,
    {
        if self.listening {
            let outcome = match verdict.is_failure() {
                true => AttemptOutcome::Failure,
                false => AttemptOutcome::Success,
            };
            self.attempt_finished(outcome, None);
        }
        let (outcome, hint) = (outcome_of(verdict), verdict.retry_after());
        if self.permit.is_some() || self.lease.is_some() {
            let pending = Pending::Judged(v, outcome, hint);
            return self.ask_record(pending, outcome, hint, None, load_signal(verdict));
        }
        self.done(Ok(v), outcome, hint)
    }

    #[inline(always)]
    fn succeeded<T, E>(&mut self, v: T) -> Ended<'g, T, E>
    where
        K: Handles<T, E>,
    {
        if watches_late(
            &self.pipeline.shared,
            self.driver,
            self.listening,
            self.deadline,
        ) {
            if let Some(d) = self.deadline {
                return self.late_or_not(v, d);
            }
        }
        if self.listening {
            self.attempt_finished(AttemptOutcome::Success, None);
        }
        if self.permit.is_some() || self.lease.is_some() {
            let pending = Pending::Success(v);
            return self.ask_record(pending, Outcome::Success, None, None, Signal::Success);
        }
        self.done(Ok(v), Outcome::Success, None)
    }

    /// A sync attempt with a deadline that succeeded: on time, late (kept,
    /// reported), or late under a strict timeout (a timeout). One reading
    /// of the clock decides and reports.
    #[cold]
    #[inline(never)]
    fn late_or_not<T, E>(&mut self, v: T, d: Deadline) -> Ended<'g, T, E>
    where
        K: Handles<T, E>,
    {
        let end = self.read_clock();
        let late_by = crate::timeout::late_by(end, d.at);
        if late_by.is_some() && d.strict {
            if self.listening {
                self.attempt_finished(AttemptOutcome::Timeout, Some(end));
            }
            return self.timed_out_at(d, Some(end));
        }
        if self.listening {
            self.attempt_finished(AttemptOutcome::Success, Some(end));
        }
        let pending = self.record(Outcome::Success, None, Some(end), Signal::Success);
        if let Some(late_by) = late_by {
            let late_by = Duration::from_nanos(late_by);
            self.emit(|| EventKind::DeadlineExceeded { late_by });
        }
        match pending {
            Some(record) => Ended::Record(record, Pending::Success(v)),
            None => self.done(Ok(v), Outcome::Success, None),
        }
    }

    #[cold]
    #[inline(never)]
    fn failed<T, E>(&mut self, e: E, judged: Option<Verdict>) -> Ended<'g, T, E>
    where
        K: Handles<T, E>,
    {
        if self.listening {
            self.attempt_finished(AttemptOutcome::Failure, None);
        }
        let verdict = K::verdict_or(&self.pipeline.shared.handlers, &e, judged);
        let failure = Failure {
            verdict,
            error: Some(e),
            timed_out: None,
        };
        let outcome = outcome_of(verdict);
        self.ask_record(
            Pending::Failed(failure),
            outcome,
            verdict.retry_after(),
            None,
            load_signal(verdict),
        )
    }

    #[cold]
    #[inline(never)]
    fn timed_out<T, E>(&mut self) -> Ended<'g, T, E>
    where
        K: Handles<T, E>,
    {
        if self.listening {
            self.attempt_finished(AttemptOutcome::Timeout, None);
        }
        let d = self.deadline.expect("a timeout needs a deadline");
        self.timed_out_at(d, None)
    }

    fn timed_out_at<T, E>(&mut self, d: Deadline, end: Option<u64>) -> Ended<'g, T, E>
    where
        K: Handles<T, E>,
    {
        let attempt = self.attempt;
        self.emit(|| EventKind::TimedOut {
            attempt,
            after: d.after,
        });
        let failure = Failure {
            // The whole call is out of time: no retry can fit.
            verdict: if d.scope == TimeoutScope::Overall {
                Verdict::failure()
            } else {
                Verdict::retry()
            },
            error: None,
            timed_out: Some(d),
        };
        let pending = Pending::Failed(failure);
        self.ask_record(pending, Outcome::Failure, None, end, Signal::Dropped)
    }

    /// The store's answer to [`Ended::Record`].
    pub(crate) fn recorded<T, E>(
        &mut self,
        pending: Pending<T, E>,
        answer: Result<Recorded, StoreError>,
    ) -> Ended<'g, T, E>
    where
        K: Handles<T, E>,
    {
        // The store gave the slot back.
        if let Some(gate) = self.gate_of(self.level) {
            gate.freed(self.partition);
        }
        self.report_recorded(answer);
        self.go_on(pending)
    }

    /// How long the attempt under way ran until `end` (zero when its start
    /// was not read: nothing measures it then).
    #[inline(always)]
    fn duration_to(&self, end: u64) -> Duration {
        Duration::from_nanos(self.at.map_or(0, |at| end.saturating_sub(at)))
    }

    /// Takes the permit and records `outcome`: in place on a memory gate
    /// (`None`), or the record to hand to the store.
    fn record(
        &mut self,
        outcome: Outcome,
        hint: Option<Duration>,
        end: Option<u64>,
        signal: Signal,
    ) -> Option<Record<'g>> {
        let end = if self.lease.is_some() {
            // The adaptive limit measures every attempt to its end, on a
            // reading of its own (the same time as `end`'s on a virtual
            // clock).
            let clock = &self.pipeline.shared.clock;
            let ticks = clock.ticks();
            self.release_lease(signal, ticks);
            Some(end.unwrap_or_else(|| clock.nanos_at(ticks)))
        } else {
            end
        };
        let permit = self.permit.take()?;
        self.record_in(Level::Attempt, permit, self.at, outcome, hint, end)
    }

    /// Records `outcome` with `permit` on the gate of `level`, for the
    /// attempt or the call that began at `start`: in place on a memory
    /// gate (`None`), or the record to hand to the store.
    fn record_in(
        &mut self,
        level: Level,
        permit: Permit,
        start: Option<u64>,
        outcome: Outcome,
        hint: Option<Duration>,
        end: Option<u64>,
    ) -> Option<Record<'g>> {
        self.level = level;
        let gate = self.gate();
        if !gate.records {
            // Only a retry budget: an outcome changes nothing.
            return None;
        }
        // Anything but an ordinary success may change the state at the
        // time it ended (a trip, a cooldown): stamped with that time.
        let end = match end {
            Some(end) => end,
            None if outcome == Outcome::Success
                && !permit.probe
                && hint.is_none()
                && !gate.record_needs_time =>
            {
                start.unwrap_or(0)
            }
            None => self.read_clock(),
        };
        let record = Record {
            partition: self.partition,
            permit,
            outcome,
            duration: Duration::from_nanos(start.map_or(0, |s| end.saturating_sub(s))),
            retry_after: hint,
            now: Duration::from_nanos(end),
        };
        match gate.memory.as_deref() {
            Some(memory) => {
                let answer = memory.record(&record);
                gate.freed(self.partition);
                self.report_recorded(answer);
                None
            }
            None => Some(record),
        }
    }

    fn ask_record<T, E>(
        &mut self,
        pending: Pending<T, E>,
        outcome: Outcome,
        hint: Option<Duration>,
        end: Option<u64>,
        signal: Signal,
    ) -> Ended<'g, T, E>
    where
        K: Handles<T, E>,
    {
        match self.record(outcome, hint, end, signal) {
            Some(record) => Ended::Record(record, pending),
            None => self.go_on(pending),
        }
    }

    /// After an outcome was recorded: the success ends the call, a failure
    /// is decided.
    fn go_on<T, E>(&mut self, pending: Pending<T, E>) -> Ended<'g, T, E>
    where
        K: Handles<T, E>,
    {
        match pending {
            Pending::Success(v) => self.done(Ok(v), Outcome::Success, None),
            Pending::Judged(v, outcome, hint) => self.done(Ok(v), outcome, hint),
            Pending::Failed(f) => self.decide(f),
            Pending::Done(result) => Ended::Done(result),
        }
    }

    /// The call's result, before the fallback. The call-level gate, if it
    /// admitted the call, records the call's `outcome` (and the final
    /// error's retry-after `hint`) first, measured from the call's
    /// admission to now.
    #[inline(always)]
    fn done<T, E>(
        &mut self,
        result: Result<T, Error<E>>,
        outcome: Outcome,
        hint: Option<Duration>,
    ) -> Ended<'g, T, E> {
        let Some(permit) = self.call_permit.take() else {
            return Ended::Done(result);
        };
        let (outcome, hint) = self.call_ended_shadowed.take().unwrap_or((outcome, hint));
        match self.record_in(Level::Call, permit, self.call_at, outcome, hint, None) {
            Some(record) => Ended::Record(record, Pending::Done(result)),
            None => Ended::Done(result),
        }
    }

    fn report_recorded(&self, answer: Result<Recorded, StoreError>) {
        if !self.listening {
            return;
        }
        match answer {
            Ok(r) => {
                if let Some(t) = r.transition {
                    self.emit(|| EventKind::of_transition(t));
                }
                if let Some(duration) = r.cooldown {
                    self.emit(|| EventKind::CooldownStarted { duration });
                }
                if let Some(e) = r.degraded {
                    self.emit(|| EventKind::StoreUnavailable {
                        error: e.to_string(),
                        degraded: true,
                    });
                }
            }
            Err(e) => self.emit(|| EventKind::StoreUnavailable {
                error: e.to_string(),
                degraded: false,
            }),
        }
    }

    #[cold]
    fn attempt_finished(&self, outcome: AttemptOutcome, end: Option<u64>) {
        let end = end.unwrap_or_else(|| self.read_clock());
        let attempt = self.attempt;
        let duration = self.duration_to(end);
        self.emit(|| EventKind::AttemptFinished {
            attempt,
            duration,
            outcome,
        });
    }

    // ---------------------------------------------------------------- retry

    /// After a failed attempt (recorded): retry after a backoff, or the
    /// call's error.
    fn decide<T, E>(&mut self, failure: Failure<E>) -> Ended<'g, T, E>
    where
        K: Handles<T, E>,
    {
        if self.call_permit.is_some() {
            // Recorded by the call-level gate should the call end with a
            // refusal of the attempt that follows.
            self.call_failed = Some(failed_call(&failure));
        }
        if self.pipeline.shared.hedging.is_some() {
            return self.decide_hedged(failure);
        }
        match self.next(failure.verdict, failure.error.as_ref()) {
            Next::Retry(delay) => Ended::Retry(delay),
            Next::Stop(reason) => self.stop(failure, reason),
        }
    }

    /// After a failed hedged attempt (recorded): a failure that hedging
    /// answers ([`hedged`](Self::hedged)) lets the call go on while another
    /// attempt is under way or may start; any other ends the call.
    fn decide_hedged<T, E>(&mut self, failure: Failure<E>) -> Ended<'g, T, E>
    where
        K: Handles<T, E>,
    {
        let hedged = self.hedged(&failure);
        if hedged && (self.others > 0 || self.may_hedge()) {
            return Ended::Hedge(failure);
        }
        let reason = match hedged && self.launched > 1 {
            true => StopReason::Exhausted,
            false => StopReason::NotRetried,
        };
        self.stop(failure, reason)
    }

    /// Whether hedging answers `failure` with a further attempt: a
    /// retryable failure that `hedge_if` does not decline, or an attempt
    /// that timed out (not the whole call).
    fn hedged<T, E>(&self, failure: &Failure<E>) -> bool
    where
        K: Handles<T, E>,
    {
        failure.verdict.is_retryable()
            && failure
                .error
                .as_ref()
                .is_none_or(|e| K::hedges(&self.pipeline.shared.handlers, e))
    }

    /// The end of a hedged call whose attempts all failed: `failure`, the
    /// last one's, is the call's error.
    pub(crate) fn hedges_exhausted<T, E>(&mut self, failure: Failure<E>) -> Ended<'g, T, E>
    where
        K: Handles<T, E>,
    {
        let reason = match self.launched > 1 {
            true => StopReason::Exhausted,
            false => StopReason::NotRetried,
        };
        self.stop(failure, reason)
    }

    /// The attempts the call made so far: the attempt under way, or for a
    /// hedged call every attempt started; not the attempt the call ended
    /// on when its admission refused it.
    pub(crate) fn attempts(&self) -> u32 {
        let made = match self.pipeline.shared.hedging {
            Some(_) => self.launched,
            None => self.attempt,
        };
        made.saturating_sub(u32::from(self.unstarted))
    }

    /// The call ends with the failure of its last attempt.
    fn stop<T, E>(&mut self, failure: Failure<E>, reason: StopReason) -> Ended<'g, T, E>
    where
        K: Handles<T, E>,
    {
        let attempts = self.attempts();
        let (outcome, hint) = failed_call(&failure);
        let err = match (failure.error, failure.timed_out) {
            (Some(e), _) => match reason {
                StopReason::NotRetried => Error::Operation(e),
                StopReason::Exhausted | StopReason::Deadline => {
                    Error::RetryExhausted { attempts, last: e }
                }
                StopReason::Budget => self.budget_refusal(),
            },
            (None, Some(d)) => match reason {
                StopReason::Budget => self.budget_refusal(),
                _ => Error::Timeout(
                    TimeoutError::new(d.scope, d.after, attempts)
                        .for_resource(self.pipeline.shared.name),
                ),
            },
            (None, None) => unreachable!("a failed attempt has an error or a timeout"),
        };
        // A budget refusal too: the call's last attempt failed, and the
        // call-level gate records that failure.
        self.done(Err(err), outcome, hint)
    }

    fn budget_refusal<E>(&self) -> Error<E> {
        self.reject(Rejection::new(RejectionReason::RetryBudgetExhausted, None))
    }

    /// Whether the attempt that failed with `verdict` is followed by
    /// another, and after which wait.
    fn next<T, E>(&mut self, verdict: Verdict, error: Option<&E>) -> Next
    where
        K: Handles<T, E>,
    {
        let shared = &*self.pipeline.shared;
        let Some(retry) = &shared.retry else {
            return Next::Stop(StopReason::NotRetried);
        };
        if !verdict.is_retryable() {
            return Next::Stop(StopReason::NotRetried);
        }
        let attempt = self.attempt;
        if attempt >= retry.max_attempts {
            return Next::Stop(StopReason::Exhausted);
        }
        let mut delay = retry.delay(attempt, self.previous, &*shared.random);
        if let Some(hint) = verdict.retry_after() {
            delay = delay.max(hint);
        }
        if let Some(d) = self.overall {
            let now = self.read_clock();
            if !crate::timeout::wait_fits(now, crate::clock::duration_nanos(delay), d.at) {
                self.emit(|| EventKind::RetryGaveUp {
                    attempts: attempt,
                    reason: GiveUpReason::Deadline,
                });
                return Next::Stop(StopReason::Deadline);
            }
        }
        if let Some(b) = retry.budget.as_ref().filter(|b| !b.is_shared()) {
            if !b.withdraw() {
                self.emit(|| EventKind::RetryGaveUp {
                    attempts: attempt,
                    reason: GiveUpReason::Budget,
                });
                return Next::Stop(StopReason::Budget);
            }
        }
        self.previous = delay;
        self.emit(|| EventKind::RetryScheduled { attempt, delay });
        if let Some(e) = error {
            K::on_retry(&shared.handlers, e, attempt, delay);
        }
        Next::Retry(delay)
    }

    /// After the wait of [`Ended::Retry`]: the next attempt begins.
    pub(crate) fn retry(&mut self) {
        self.attempt += 1;
        self.attempt_shadowed = false;
        self.at = None;
        self.deadline = None;
        self.stop_waiting(false);
        if self.needs_time() {
            let now = self.read_clock();
            self.begin_at(now);
        }
    }

    // -------------------------------------------------------------- hedging

    /// The hedging of the pipeline (the hedged driver runs only with one).
    fn hedging(&self) -> &'g crate::hedge::Hedging {
        self.pipeline
            .shared
            .hedging
            .as_ref()
            .expect("the hedged driver runs a pipeline with hedging")
    }

    /// A further hedge may be tried: the attempts started and the hedges
    /// being admitted leave room under `max_hedged_attempts`, and the
    /// budget was not found empty.
    fn may_hedge(&self) -> bool {
        !self.hedge_closed
            && self.launched + u32::from(self.admitting) <= self.hedging().max_hedged_attempts
    }

    /// The attempts under way besides the one entered, for the decision on
    /// its failure (the driver counts its lanes).
    pub(crate) fn set_others(&mut self, others: u32) {
        self.others = others;
    }

    /// When the next hedge is tried, counted from now, `since` saying what
    /// just happened: the latest attempt started, or a hedge was refused.
    /// `Some(d)`: after `d` (zero: at once); `None`: only when an attempt
    /// fails (or no hedge is left). The generator is asked for the number
    /// the next attempt would have; after a refusal that is the refused
    /// one's number again, and a delay of zero waits for a failure instead,
    /// since a hedge tried at once would meet the same refusal.
    pub(crate) fn hedge_timer(&self, since: HedgeSince) -> Option<Duration> {
        if !self.may_hedge() {
            return None;
        }
        let next = self.launched + u32::from(self.admitting) + 1;
        match self.hedging().delay_before(next) {
            crate::hedge::HedgeDelay::After(d)
                if d.is_zero() && matches!(since, HedgeSince::Refused) =>
            {
                None
            }
            crate::hedge::HedgeDelay::After(d) => Some(d),
            crate::hedge::HedgeDelay::OnFailure => None,
        }
    }

    fn empty_lane(&self, attempt: u32) -> Lane<'g> {
        Lane {
            gate: self.pipeline.shared.gate.as_ref(),
            partition: self.partition,
            attempt,
            at: None,
            deadline: None,
            permit: None,
            waiting: None,
            adaptive: self.pipeline.shared.adaptive.as_ref(),
            lease: None,
            trigger: None,
            attempt_shadowed: false,
        }
    }

    /// Enters `lane` into the call for a step of its attempt, or takes it
    /// back out (the same swap): the call holds what the lane held, the
    /// lane what the call held.
    pub(crate) fn swap_lane(&mut self, lane: &mut Lane<'g>) {
        std::mem::swap(&mut self.attempt, &mut lane.attempt);
        std::mem::swap(&mut self.at, &mut lane.at);
        std::mem::swap(&mut self.deadline, &mut lane.deadline);
        std::mem::swap(&mut self.permit, &mut lane.permit);
        std::mem::swap(&mut self.waiting, &mut lane.waiting);
        std::mem::swap(&mut self.lease, &mut lane.lease);
        std::mem::swap(&mut self.trigger, &mut lane.trigger);
        std::mem::swap(&mut self.attempt_shadowed, &mut lane.attempt_shadowed);
    }

    /// Tries the next hedge, `trigger` saying why: `None` when none is left
    /// or the budget is empty (reported once; no further hedge is tried in
    /// this call). The hedge spends a budget token and begins now (its
    /// deadline from now); admit it like any attempt, entered into the
    /// call. It starts when admitted ([`hedge_started`](Self::hedge_started)),
    /// or is refused ([`hedge_refused`](Self::hedge_refused)).
    pub(crate) fn hedge(&mut self, trigger: crate::event::HedgeTrigger) -> Option<Lane<'g>> {
        if !self.may_hedge() {
            return None;
        }
        let hedging = self.hedging();
        if let Some(b) = &hedging.budget {
            if !b.withdraw() {
                self.hedge_closed = true;
                let attempt = self.launched + u32::from(self.admitting) + 1;
                self.emit(|| EventKind::HedgeBudgetExhausted { attempt });
                return None;
            }
        }
        self.admitting += 1;
        let now = self.read_clock();
        // Its number until it starts: the one it would have.
        let mut lane = self.empty_lane(self.launched + u32::from(self.admitting));
        lane.at = Some(now);
        lane.deadline = attempt_deadline(&self.pipeline.shared, now, self.overall);
        lane.trigger = Some(trigger);
        Some(lane)
    }

    /// The attempt entered was admitted with `ctx`: a hedge starts now and
    /// takes the next number (attempts are numbered in the order they
    /// start, a refused hedge taking none); the hook sees its context, the
    /// event reports it. The context to run the attempt with.
    pub(crate) fn hedge_started(&mut self, ctx: Context) -> Context {
        let Some(trigger) = self.trigger.take() else {
            return ctx;
        };
        self.admitting -= 1;
        self.launched += 1;
        let attempt = self.launched;
        self.attempt = attempt;
        let ctx = self.context();
        self.hedging().hedging_hook(&ctx);
        self.emit(|| EventKind::HedgeStarted { attempt, trigger });
        ctx
    }

    /// The hedged call is decided: the first attempt, if it lost, gives
    /// back what it holds (its state is the call's own), and the call's
    /// attempt is now the latest one started (for the fallback's context).
    pub(crate) fn hedging_decided(&mut self) {
        if self.permit.is_some() || self.waiting.is_some() {
            let reserved = self.waiting.take().and_then(|w| w.reservation());
            abandon(
                self.pipeline.shared.gate.as_ref(),
                self.partition,
                self.permit.take(),
                reserved,
            );
        }
        self.attempt = self.launched;
    }

    /// The attempt entered was refused by its gate: a hedge did not start.
    /// It gives its budget token back and leaves its number and its place
    /// under `max_hedged_attempts` to the next hedge
    /// ([`hedge_timer`](Self::hedge_timer) says when that one is tried).
    pub(crate) fn hedge_not_started(&mut self) {
        if self.trigger.take().is_some() {
            self.admitting -= 1;
            if let Some(b) = &self.hedging().budget {
                b.refund();
            }
        } else {
            // The first attempt, counted from the start, did not start.
            self.unstarted = true;
        }
    }

    /// A hedge refused while other attempts are under way: reported, the
    /// call goes on.
    pub(crate) fn hedge_refused(&mut self, refused: Refused) {
        if let Refused::Rejected(r) = refused {
            let _ = self.reject::<()>(r);
        }
    }

    // --------------------------------------------------------------- finish

    /// The end of the call: the fallback, if one applies, gets the error.
    #[inline(always)]
    pub(crate) fn finish<T, E>(&mut self, result: Result<T, Error<E>>) -> Finish<T, E>
    where
        K: Handles<T, E>,
    {
        match result {
            Ok(v) => {
                if self.listening {
                    self.call_finished(CallOutcome::Success);
                }
                Finish::Done(Ok(v))
            }
            Err(err) => self.finish_failed(err),
        }
    }

    #[cold]
    #[inline(never)]
    fn finish_failed<T, E>(&mut self, err: Error<E>) -> Finish<T, E>
    where
        K: Handles<T, E>,
    {
        if let Error::Rejected(_) = &err {
            self.pipeline.note_rejection::<T, E>();
        }
        let shared = &*self.pipeline.shared;
        if !K::HAS_FALLBACK || !K::falls_back_on(&shared.handlers, &err) {
            if self.listening {
                self.call_finished(call_outcome(&err));
            }
            return Finish::Done(Err(err));
        }
        // Reported before the handler runs, sync and async alike.
        self.emit(|| EventKind::FallbackExecuted);
        let ctx = self.pipeline.context(self.partition, self.attempt, None);
        match K::fall_back(&shared.handlers, err, ctx) {
            Fallen::NotApplied(e) => {
                if self.listening {
                    self.call_finished(call_outcome(&e));
                }
                Finish::Done(Err(e))
            }
            Fallen::Done(r) => Finish::Done(self.fell_back(r)),
            Fallen::Pending(f) => Finish::Fallback(f),
        }
    }

    /// The fallback's result is the call's.
    pub(crate) fn fell_back<T, E>(&mut self, result: Result<T, E>) -> Result<T, Error<E>> {
        if let Some(seen) = self.fallback_seen {
            seen.store(true, Ordering::Relaxed);
        }
        let result = result.map_err(Error::Fallback);
        if self.listening {
            self.call_finished(match &result {
                Ok(_) => CallOutcome::Fallback,
                Err(_) => CallOutcome::Failure,
            });
        }
        result
    }

    #[cold]
    fn call_finished(&self, outcome: CallOutcome) {
        let attempts = self.attempts();
        let duration = Duration::from_nanos(self.read_clock().saturating_sub(self.started));
        self.emit(|| EventKind::CallFinished {
            attempts,
            duration,
            outcome,
        });
    }
}

/// The start of a call: its start, its overall deadline, the start and
/// deadline of its first attempt; the clock is read only if a policy (or a
/// listener) needs the time.
#[inline(always)]
fn begin<K: Kind>(
    shared: &super::Shared<K>,
    partition: Option<&PartitionKey>,
    listening: bool,
) -> (u64, Option<Deadline>, Option<u64>, Option<Deadline>) {
    if shared.plan.needs_time || partition.is_some() || listening {
        apart();
        let now = shared.clock.now_nanos();
        let overall = overall_deadline(shared, now);
        (
            now,
            overall,
            Some(now),
            attempt_deadline(shared, now, overall),
        )
    } else {
        (0, None, None, None)
    }
}

/// The overall deadline of a call that started at `now`.
#[inline(always)]
fn overall_deadline<K: Kind>(shared: &super::Shared<K>, now: u64) -> Option<Deadline> {
    shared.overall_timeout.map(|t| Deadline {
        at: now.saturating_add(t.nanos()),
        scope: TimeoutScope::Overall,
        after: t.duration,
        strict: t.strict,
    })
}

/// The ordinary admission of an attempt by `gate` (see
/// [`Call::admit_ordinary`]), on the facts of the attempt: when it began (read here if a policy needs
/// it, then its deadline is set) and the rate-limit permits it takes
/// (`weight`). What the attempt holds comes back (nothing without a gate).
#[inline(always)]
fn admit_in_place(
    gate: Option<&Gate>,
    clock: &crate::clock::ClockHandle,
    partition: Option<&PartitionKey>,
    weight: u32,
    at: Option<u64>,
) -> Result<Option<Ticket>, Quick> {
    let Some(gate) = gate else {
        return Ok(None);
    };
    let Some(memory) = gate.memory.as_deref() else {
        return Err(Quick::Other);
    };
    // Calls wait in the bulkhead's queue: the general admission decides
    // whose turn it is.
    if gate.queues.as_ref().is_some_and(|q| !q.is_empty(partition)) {
        return Err(Quick::Other);
    }
    // Read at most once here when the attempt's start was not read (no
    // policy needs it then, only a cooldown in effect or an open circuit);
    // a refusal hands the call on with its start unread, and the general
    // admission reads it.
    let started = at;
    let quick = memory.try_admit(partition, weight, &mut || {
        started.unwrap_or_else(|| clock.now_nanos())
    });
    match quick {
        Ok(ticket) => Ok(Some(ticket)),
        Err(Some(open)) => Err(Quick::Refused(open)),
        Err(None) => Err(Quick::Other),
    }
}

/// Records the success of an ordinary attempt in place on a memory gate:
/// what [`Call::record`] does for it (such an attempt is never a probe).
/// A success that can change the circuit (a slow call, a time window) is
/// stamped with the time it ended and measured; an ordinary one needs no
/// time (a partition's is its key's use, read at the start).
#[inline(always)]
fn record_success_in_place(
    gate: &Gate,
    partition: Option<&PartitionKey>,
    ticket: Ticket,
    at: Option<u64>,
    clock: &crate::clock::ClockHandle,
) -> Option<crate::breaker::CircuitTransition> {
    let memory = gate.memory.as_deref()?;
    if !gate.success_recorded {
        // Only a rate limit or a cooldown: a success changes nothing.
        return None;
    }
    let (end, duration_ns) = if gate.record_needs_time {
        apart();
        let end = clock.now_nanos();
        (end, at.map_or(0, |at| end.saturating_sub(at)))
    } else {
        (at.unwrap_or(0), 0)
    };
    let transition = memory.record_success(partition, ticket, duration_ns, end);
    gate.freed(partition);
    transition
}

/// The context of attempt `attempt` with `deadline`: a constant (dropped
/// for free) for a first attempt without deadline or partition.
#[inline(always)]
fn context_of<K: Kind>(
    shared: &super::Shared<K>,
    attempt: u32,
    deadline: Option<Deadline>,
    partition: Option<&PartitionKey>,
) -> Context {
    match (attempt, deadline, partition) {
        (1, None, None) => Context::bare(shared.name),
        (attempt, deadline, partition) => Context::new(
            shared.name,
            attempt,
            deadline.map(|d| d.at),
            &shared.clock,
            partition,
        ),
    }
}

/// What a call brings besides its operation: its partition, the rate-limit
/// permits each admission takes, and where a coalesced call's leader
/// reports the use of its fallback. [`Plain`], a call of `run` or `call`,
/// states them as constants, so that the ordinary path of such a call
/// carries none of them; [`Given`] holds them.
pub(crate) trait CallArgs<'g>: Copy {
    /// The partition the call was made in.
    fn partition(self) -> Option<&'g PartitionKey>;
    /// The rate-limit permits each admission takes.
    fn weight(self) -> u32;
    /// Where the call reports the use of its fallback (a coalesced call's
    /// leader).
    fn fallback_seen(self) -> Option<&'g AtomicBool>;
}

/// A call without partition, of weight 1, reporting nothing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plain;

impl<'g> CallArgs<'g> for Plain {
    #[inline(always)]
    fn partition(self) -> Option<&'g PartitionKey> {
        None
    }
    #[inline(always)]
    fn weight(self) -> u32 {
        1
    }
    #[inline(always)]
    fn fallback_seen(self) -> Option<&'g AtomicBool> {
        None
    }
}

/// A call's partition, weight and fallback report, as given.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Given<'g> {
    pub(crate) partition: Option<&'g PartitionKey>,
    pub(crate) weight: u32,
    pub(crate) fallback_seen: Option<&'g AtomicBool>,
}

impl<'g> Given<'g> {
    /// A call in `partition`, of weight 1, reporting nothing.
    pub(crate) fn partitioned(partition: &'g PartitionKey) -> Self {
        Self::partitioned_in(Some(partition))
    }

    /// A call in `partition`, if any, of weight 1, reporting nothing.
    pub(crate) fn partitioned_in(partition: Option<&'g PartitionKey>) -> Self {
        Self::reporting(partition, None)
    }

    /// A call in `partition`, if any, of weight 1, reporting the use of
    /// its fallback in `fallback_seen`.
    pub(crate) fn reporting(
        partition: Option<&'g PartitionKey>,
        fallback_seen: Option<&'g AtomicBool>,
    ) -> Self {
        Given {
            partition,
            weight: 1,
            fallback_seen,
        }
    }
}

impl<'g> CallArgs<'g> for Given<'g> {
    #[inline(always)]
    fn partition(self) -> Option<&'g PartitionKey> {
        self.partition
    }
    #[inline(always)]
    fn weight(self) -> u32 {
        self.weight
    }
    #[inline(always)]
    fn fallback_seen(self) -> Option<&'g AtomicBool> {
        self.fallback_seen
    }
}

/// The first attempt of a call that nobody listens to, on the ordinary
/// path: only the facts the engine needs to admit, run and record it in
/// place (when it began, its deadline, the rate-limit permits it takes,
/// its permit), kept in registers. Anything out of the ordinary makes a
/// [`Call`] of it ([`First::into_call`]) where it stands, for the general
/// loop: the same steps, on the same facts.
pub(crate) struct First<'g, K: Kind, A: CallArgs<'g>> {
    pipeline: &'g Pipeline<K>,
    args: A,
    at: Option<u64>,
    deadline: Option<Deadline>,
}

/// What the ordinary first attempt holds, given back if it never ends (a
/// panic, a dropped future). Kept apart from the [`First`] facts so that
/// only this small guard lives in memory for the unwinding path.
pub(crate) struct Held<'g, K: Kind, A: CallArgs<'g>> {
    shared: &'g super::Shared<K>,
    args: A,
    ticket: Option<Ticket>,
    lease: Option<Lease>,
}

impl<'g, K: Kind, A: CallArgs<'g>> Drop for Held<'g, K, A> {
    #[inline(always)]
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            abandon(
                self.shared.gate.as_ref(),
                self.args.partition(),
                Some(ticket.permit()),
                None,
            );
        }
        if let Some(lease) = self.take_lease() {
            abandon_lease(self.shared.adaptive.as_ref(), Some(lease));
        }
    }
}

impl<'g, K: Kind, A: CallArgs<'g>> Held<'g, K, A> {
    /// The adaptive limit's lease, if the attempt holds one. Its tag is
    /// read first: the lease is read only when there is one, so a call
    /// that holds none never reads the whole field back right after
    /// writing its tag (a load the processor could not forward from that
    /// store).
    #[inline(always)]
    fn take_lease(&mut self) -> Option<Lease> {
        if self.lease.is_some() {
            apart();
            self.lease.take()
        } else {
            None
        }
    }

    /// The guard of an attempt whose end [`First::ended`] recorded: what
    /// it held is spent, and the guard goes without being looked at again.
    #[inline(always)]
    pub(crate) fn spent(self) {
        std::mem::forget(self);
    }
}

impl<'g, K: Kind, A: CallArgs<'g>> First<'g, K, A> {
    /// Starts a call made with `args` on the ordinary path, or `None` when
    /// someone listens,
    /// the pipeline has a call-level gate, hedging or policies written in
    /// code ([`Plan::general`](super::Plan::general)) or chaos policies that
    /// may inject (the general loop then runs it from the start).
    #[inline(always)]
    pub(crate) fn start(pipeline: &'g Pipeline<K>, args: A) -> Option<Self> {
        let shared = &*pipeline.shared;
        let taken_over = if shared.plan.in_place {
            crate::event::Listeners::tracing()
        } else {
            shared.listeners.enabled() || shared.plan.general || shared.chaos_may_inject()
        };
        if taken_over {
            return None;
        }
        if let Some(b) = local_budget(shared) {
            apart();
            b.deposit();
        }
        let (_, _, at, deadline) = begin(shared, args.partition(), false);
        Some(First {
            pipeline,
            args,
            at,
            deadline,
        })
    }

    /// A call of a bare pipeline (see [`Plan::bare`](super::Plan::bare))
    /// made with `args` whose first attempt, the operation itself, did not
    /// succeed.
    #[inline(always)]
    pub(crate) fn after_bare(pipeline: &'g Pipeline<K>, args: A) -> Self {
        First {
            pipeline,
            args,
            at: None,
            deadline: None,
        }
    }

    /// Nothing held yet, for this call's attempt.
    #[inline(always)]
    pub(crate) fn hold(&self) -> Held<'g, K, A> {
        Held {
            shared: &self.pipeline.shared,
            args: self.args,
            ticket: None,
            lease: None,
        }
    }

    /// The ordinary admission (see [`Call::admit_ordinary`]); what the
    /// attempt holds goes into `held` until it ends.
    #[inline(always)]
    pub(crate) fn admit(&mut self, held: &mut Held<'g, K, A>) -> Result<Context, Quick> {
        let shared = &*self.pipeline.shared;
        let partition = self.args.partition();
        if let Some(limiter) = &shared.adaptive {
            apart();
            held.lease = Some(admit_adaptive(limiter, &shared.clock, partition, None)?);
        }
        held.ticket = admit_in_place(
            shared.gate.as_ref(),
            &shared.clock,
            partition,
            self.args.weight(),
            self.at,
        )?;
        Ok(context_of(shared, 1, self.deadline, partition))
    }

    /// The deadline of the attempt, for the async driver's timer.
    #[inline(always)]
    pub(crate) fn deadline(&self) -> Option<u64> {
        self.deadline.map(|d| d.at)
    }

    /// The pipeline's clock.
    #[inline(always)]
    pub(crate) fn clock(&self) -> &'g crate::clock::ClockHandle {
        &self.pipeline.shared.clock
    }

    /// The ordinary end of the attempt: a success with nothing to watch,
    /// recorded in place as [`Call::ended`] would, which spends what `held`
    /// holds (the caller then lets it go by [`Held::spent`]); anything else
    /// comes back, with `held` as it was.
    #[inline(always)]
    pub(crate) fn ended<T, E>(
        &mut self,
        result: Result<T, E>,
        held: &mut Held<'g, K, A>,
        driver: Driver,
    ) -> Result<T, Result<T, E>> {
        let shared = &*self.pipeline.shared;
        match result {
            Ok(v) if !watches_late(shared, driver, false, self.deadline) => {
                if let (Some(lease), Some(limiter)) = (held.take_lease(), &shared.adaptive) {
                    // Nobody listens: a change of the limit has no one to
                    // tell.
                    let clock = &shared.clock;
                    let end = clock.ticks();
                    let _ = limiter.release(lease, Signal::Success, end, clock, &*shared.random);
                }
                if let (Some(ticket), Some(gate)) = (held.ticket, &shared.gate) {
                    // Nobody listens: a transition has no one to tell.
                    let _ = record_success_in_place(
                        gate,
                        self.args.partition(),
                        ticket,
                        self.at,
                        &shared.clock,
                    );
                }
                Ok(v)
            }
            other => Err(other),
        }
    }

    /// A refusal of the ordinary admission that ends the call at once: one
    /// that cannot be waited out, with no fallback to take it (nobody
    /// listens on the ordinary path, so there is nothing to report).
    #[inline(always)]
    pub(crate) fn refused_at_once<T, E>(&self, quick: &Quick, driver: Driver) -> Option<Error<E>>
    where
        K: Handles<T, E>,
    {
        match quick {
            Quick::Refused(r) if !K::HAS_FALLBACK && !may_wait(r.reason, driver) => {
                self.pipeline.note_rejection::<T, E>();
                Some(Error::Rejected(r.for_resource(self.pipeline.shared.name)))
            }
            _ => None,
        }
    }

    /// The call, where the first attempt stands, for the general loop.
    #[inline(always)]
    pub(crate) fn into_call(self, driver: Driver, held: &mut Held<'g, K, A>) -> Owned<'g, K> {
        let shared = &*self.pipeline.shared;
        let overall = self.at.and_then(|at| overall_deadline(shared, at));
        Owned(Call {
            pipeline: self.pipeline,
            partition: self.args.partition(),
            driver,
            listening: false,
            attempt: 1,
            previous: Duration::ZERO,
            started: self.at.unwrap_or(0),
            overall,
            at: self.at,
            deadline: self.deadline,
            permit: held.ticket.take().map(Ticket::permit),
            level: Level::Attempt,
            call_permit: None,
            call_at: None,
            call_failed: None,
            call_ended_shadowed: None,
            waiting: None,
            weight: self.args.weight(),
            lease: held.take_lease(),
            fallback_seen: None,
            launched: 1,
            admitting: 0,
            others: 0,
            hedge_closed: false,
            unstarted: false,
            trigger: None,
            earned: false,
            shadowed: false,
            attempt_shadowed: false,
        })
    }
}

/// A refusal for `reason` may be waited out (a cooldown, a rate limit, a
/// full bulkhead's or adaptive limit's queue in async code); any other is
/// final at once.
#[inline(always)]
fn may_wait(reason: RejectionReason, driver: Driver) -> bool {
    match reason {
        RejectionReason::CooldownActive | RejectionReason::RateLimited => true,
        RejectionReason::BulkheadFull | RejectionReason::ConcurrencyLimited => {
            driver == Driver::Async
        }
        _ => false,
    }
}

/// The wait of a call refused for want of a slot in a queue of this
/// process (`queue`: which, how to take a place in it, `None` when it is
/// full or there is none, and whether its oldest waiter asks a store shared
/// with other processes again at the fallback interval) that lets a call
/// wait `max_wait` at most from when it joins: until its place is woken, at
/// most what is left of `max_wait`, short of the deadline (`room`), and,
/// when the call joins now, the most it may wait; once `max_wait` is over,
/// a wait of no time for a last look (a slot given back at that instant is
/// the call's); or `None` when the call may not wait (no queue, the queue
/// full, its wait over and looked at, or the deadline over).
/// The call takes its place once.
fn queued(
    waiting: &mut Waiting,
    queue: (Queue, impl FnOnce() -> Option<Place>, bool),
    max_wait: Duration,
    room: Option<Duration>,
    now: u64,
) -> Option<(Duration, Option<Duration>)> {
    let (which, join, polls) = queue;
    let joins = waiting.place_in(which).is_none();
    if joins {
        let place = join()?;
        waiting.queued = Some(Queued {
            which,
            place,
            joined: now,
        });
        waiting.poll = QUEUE_POLL_MIN;
    }
    let joined = waiting.queued.as_ref()?.joined;
    let left = max_wait.saturating_sub(Duration::from_nanos(now.saturating_sub(joined)));
    let deadline_over = room.is_some_and(|r| r.is_zero());
    if left.is_zero() || deadline_over {
        // The wait ran out, its `max_wait` or the call's deadline: a slot
        // given back at this very instant is still within both (what
        // happens at the deadline is on time). One last look, once the
        // work due now has run (a wait of no time yields), then the
        // refusal. A call that finds its deadline over as it joins never
        // waited: refused at once.
        if waiting.last_look || (joins && deadline_over) {
            return None;
        }
        waiting.last_look = true;
        return Some((Duration::ZERO, None));
    }
    let at_most = match room {
        Some(r) => left.min(r),
        None => left,
    };
    let wait = if polls {
        let wait = waiting.poll.min(at_most);
        waiting.poll = (waiting.poll * 2).min(QUEUE_POLL_MAX);
        wait
    } else {
        at_most
    };
    Some((wait, joins.then_some(at_most)))
}

/// The admission of an attempt by the adaptive `limiter`, for a call
/// holding `place` in its queue (if any): refused while older calls wait
/// in the queue ([`Limiter::may_ask`]).
#[inline(always)]
fn admit_adaptive(
    limiter: &Limiter,
    clock: &crate::clock::ClockHandle,
    partition: Option<&PartitionKey>,
    place: Option<&Place>,
) -> Result<Lease, Quick> {
    if !limiter.may_ask(partition, place) {
        let r = Rejection::new(RejectionReason::ConcurrencyLimited, None);
        return Err(Quick::Refused(r));
    }
    match limiter.acquire(partition, clock) {
        Ok(lease) => Ok(lease),
        Err(r) if limiter.shadow() => Err(Quick::Shadowed(r)),
        Err(r) => Err(Quick::Refused(r)),
    }
}

/// What an attempt judged `verdict` tells the adaptive limit: an answer
/// of the dependency (an abort) is a sample of its latency, a failure or a
/// request to slow down is a drop, an ignored error nothing.
fn load_signal(verdict: Verdict) -> Signal {
    match verdict.kind() {
        VerdictKind::Ignore => Signal::Ignored,
        VerdictKind::Abort => Signal::Success,
        _ => Signal::Dropped,
    }
}

/// A sync success must be checked against its deadline: a strict timeout,
/// or someone listening (a late success is reported).
#[inline(always)]
fn watches_late<K: Kind>(
    shared: &super::Shared<K>,
    driver: Driver,
    listening: bool,
    deadline: Option<Deadline>,
) -> bool {
    let watches = driver == Driver::Sync && (listening || shared.plan.watch_late);
    if watches && deadline.is_some() {
        apart();
        return true;
    }
    false
}

/// The deadline of an attempt beginning at `now`: the nearer of the call's
/// (`overall`) and the attempt's own.
#[inline(always)]
fn attempt_deadline<K: Kind>(
    shared: &super::Shared<K>,
    now: u64,
    overall: Option<Deadline>,
) -> Option<Deadline> {
    let own = shared.attempt_timeout.map(|t| Deadline {
        at: now.saturating_add(t.nanos()),
        scope: TimeoutScope::Attempt,
        after: t.duration,
        strict: t.strict,
    });
    match (own, overall) {
        (Some(a), Some(o)) => Some(if o.at <= a.at { o } else { a }),
        (a, o) => a.or(o),
    }
}

fn call_outcome<E>(err: &Error<E>) -> CallOutcome {
    match err {
        Error::Timeout(_) => CallOutcome::Timeout,
        Error::Rejected(r) => CallOutcome::Rejected(r.reason),
        Error::Store(_) => CallOutcome::StoreFailure,
        _ => CallOutcome::Failure,
    }
}

/// How the store records an attempt judged `verdict`.
/// What a call that ends with the failure of its last attempt records at
/// the call level: a timeout is a failure, an error is judged by its
/// verdict; and the error's retry-after hint.
fn failed_call<E>(failure: &Failure<E>) -> (Outcome, Option<Duration>) {
    let outcome = match failure.error {
        Some(_) => outcome_of(failure.verdict),
        None => Outcome::Failure,
    };
    (outcome, failure.verdict.retry_after())
}

fn outcome_of(verdict: Verdict) -> Outcome {
    match verdict.kind() {
        VerdictKind::Ignore | VerdictKind::Throttled => Outcome::Ignored,
        _ if verdict.is_failure() => Outcome::Failure,
        _ => Outcome::Success,
    }
}

// ------------------------------------------------- policies written in code

/// The steps of a call that policies written in code wrap (`chain.rs`):
/// around the whole call, the call the caller sees admits and runs nothing
/// (each pass of a policy is a call of its own, [`Call::start_within`]),
/// it only ends ([`Call::wraps_call`], [`Call::ran`]); around each attempt,
/// the attempt ends with the policies' result ([`Call::ended_through`]).
/// The engine's rules are the same: only where they start and what they
/// are given.
impl<'g, K: Kind> Call<'g, K> {
    /// Policies written in code wrap this call, which has not started its
    /// attempts: its passes run them, it only ends
    /// ([`finish`](Self::finish): the fallback, the call's event).
    #[inline(always)]
    pub(crate) fn wraps_call(&self) -> bool {
        self.pipeline.shared.custom.around_call()
    }

    /// The attempts the passes of the policies made, for the call's end.
    pub(crate) fn ran(&mut self, attempts: u32) {
        self.attempt = attempts;
    }

    /// The rate-limit permits each admission of the call takes.
    pub(crate) fn weight(&self) -> u32 {
        self.weight
    }

    /// Policies written in code wrap each attempt: the drivers run the
    /// attempt through them.
    #[inline(always)]
    pub(crate) fn has_custom_attempt(&self) -> bool {
        self.pipeline.shared.custom.around_attempt()
    }

    /// The pipeline of the call.
    pub(crate) fn pipeline(&self) -> &'g Pipeline<K> {
        self.pipeline
    }

    /// The partition of the call.
    pub(crate) fn partition(&self) -> Option<&'g PartitionKey> {
        self.partition
    }

    /// The deadline of the attempt under way.
    pub(crate) fn bound(&self) -> Option<Deadline> {
        self.deadline
    }

    /// A pass through the rest of the call, bound by `overall`, the
    /// deadline of a timeout of the whole call declared around the policy
    /// that makes the pass (else the pass starts its own, as any call). The
    /// call it is a pass of credited the retry budget.
    pub(crate) fn start_within(
        pipeline: &'g Pipeline<K>,
        partition: Option<&'g PartitionKey>,
        driver: Driver,
        overall: Option<Deadline>,
    ) -> Self {
        let mut call = Self::fresh(pipeline, partition, driver);
        if let Some(d) = overall {
            call.overall = Some(d);
            let now = call.now();
            call.begin_at(now);
        }
        call
    }

    /// The attempt under way ended through the policies around it: their
    /// result, in the pipeline's terms. An error of the operation, however
    /// a policy returns it, is the attempt's failure (`judged`: the
    /// operation's own verdict on it); a timeout is the attempt's timeout;
    /// a rejection or a store error ends the call at once, not retried, the
    /// attempt's permit and the call's given back without an outcome: a
    /// policy's refusal says nothing of the dependency.
    pub(crate) fn ended_through<T, E>(
        &mut self,
        result: Result<T, Error<E>>,
        judged: Option<Verdict>,
    ) -> Ended<'g, T, E>
    where
        K: Handles<T, E>,
    {
        match result {
            Ok(v) => self.ended(Some(Ok(v)), None),
            Err(
                Error::Operation(e) | Error::RetryExhausted { last: e, .. } | Error::Fallback(e),
            ) => self.ended(Some(Err(e)), judged),
            Err(Error::Timeout(t)) => {
                let end = self.read_clock();
                if self.listening {
                    self.attempt_finished(AttemptOutcome::Timeout, Some(end));
                }
                let d = Deadline {
                    at: end,
                    scope: t.scope,
                    after: t.after,
                    strict: false,
                };
                self.timed_out_at(d, Some(end))
            }
            Err(err) => {
                if let Some(permit) = self.permit.take() {
                    self.gate().release(self.partition, permit);
                }
                self.release_call();
                Ended::Done(Err(err))
            }
        }
    }
}

impl Deadline {
    /// The deadline of a timeout of the whole call for a pass that starts
    /// at `now`.
    pub(crate) fn overall<K: Kind>(pipeline: &Pipeline<K>, now: u64) -> Option<Deadline> {
        overall_deadline(&pipeline.shared, now)
    }

    /// The instant, in nanoseconds on the pipeline's clock.
    pub(crate) fn at(&self) -> u64 {
        self.at
    }

    /// The error of a pass refused for this deadline, after `attempts`
    /// attempts, of `resource`.
    pub(crate) fn error(&self, attempts: u32, resource: &'static str) -> TimeoutError {
        TimeoutError::new(self.scope, self.after, attempts).for_resource(resource)
    }
}
