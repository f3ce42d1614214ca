//! The execution engine shared by `run` (async) and `call` (sync).
//!
//! One attempt: admission through the stateful gate (circuit, bulkhead,
//! cooldown, rate limit, in one store operation), the operation under the
//! attempt's deadline, one record of the outcome. Around the attempts: the
//! retry loop with its backoff, deadline and budget; around everything: the
//! fallback.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::kind::{Fallen, Handles, HandlesSync};
use super::{Gate, Kind, Pipeline};
use crate::classify::Verdict;
use crate::context::{Context, PartitionKey};
use crate::error::{Error, Rejection, RejectionReason, TimeoutError, TimeoutScope};
use crate::event::{EventKind, GiveUpReason};
use crate::store::{
    Admission, AdmitRequest, MemoryResource, Outcome, Permit, Record, Recorded, ResourceState,
};
use crate::timeout::WithDeadline;

/// Gives a permit back if the attempt ends without recording an outcome
/// (panic, or the future dropped by a timeout or by the caller).
pub(crate) struct PermitGuard<'a> {
    pub(super) gate: &'a Gate,
    pub(super) partition: Option<&'a PartitionKey>,
    pub(super) permit: Option<Permit>,
}

impl<'a> PermitGuard<'a> {
    /// A guard of an attempt on `gate` (and `partition`), holding no
    /// permit yet.
    pub(super) fn new(gate: &'a Gate, partition: Option<&'a PartitionKey>) -> Self {
        PermitGuard {
            gate,
            partition,
            permit: None,
        }
    }
}

impl Drop for PermitGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(p) = self.permit.take() {
            self.gate.state.release(self.partition, p);
        }
    }
}

/// A place in the bounded bulkhead queue of this process.
struct QueueTicket<'a>(&'a Gate);

/// The waiting state of one admission: its queue place, since when it
/// waits, and the next poll interval.
struct Waiting<'g> {
    ticket: Option<QueueTicket<'g>>,
    since: u64,
    poll: Duration,
    may_queue: bool,
}

impl Waiting<'_> {
    fn new(since: u64, may_queue: bool) -> Self {
        Waiting {
            ticket: None,
            since,
            poll: QUEUE_POLL_MIN,
            may_queue,
        }
    }
}

impl Drop for QueueTicket<'_> {
    fn drop(&mut self) {
        self.0.waiters.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The deadline binding an attempt, and where it comes from.
#[derive(Clone, Copy)]
struct Deadline {
    at: u64,
    scope: TimeoutScope,
    after: Duration,
    strict: bool,
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

const QUEUE_POLL_MIN: Duration = Duration::from_millis(1);
const QUEUE_POLL_MAX: Duration = Duration::from_millis(20);

impl<K: Kind> Pipeline<K> {
    #[inline]
    pub(super) fn needs_time(&self) -> bool {
        self.shared.plan.needs_time || crate::event::Listeners::tracing()
    }

    #[inline]
    pub(super) fn now_nanos(&self) -> u64 {
        self.shared.clock.now_nanos()
    }

    fn overall_deadline(&self, start: u64) -> Option<Deadline> {
        self.shared.overall_timeout.map(|t| Deadline {
            at: start.saturating_add(t.nanos()),
            scope: TimeoutScope::Overall,
            after: t.duration,
            strict: t.strict,
        })
    }

    fn attempt_deadline(&self, now: u64, overall: Option<Deadline>) -> Option<Deadline> {
        let own = self.shared.attempt_timeout.map(|t| Deadline {
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

    #[inline]
    pub(super) fn context(
        &self,
        partition: Option<&PartitionKey>,
        attempt: u32,
        deadline: Option<u64>,
    ) -> Context {
        Context::new(
            self.shared.name,
            attempt,
            deadline,
            &self.shared.clock,
            partition,
        )
    }

    /// Start of a call or attempt for the `*Finished` events (0 when nobody listens).
    #[inline]
    fn event_clock(&self) -> u64 {
        if self.shared.listeners.enabled() {
            self.now_nanos()
        } else {
            0
        }
    }

    fn attempt_finished(
        &self,
        partition: Option<&PartitionKey>,
        attempt: u32,
        started: u64,
        outcome: crate::event::AttemptOutcome,
    ) {
        if self.shared.listeners.enabled() {
            let duration = Duration::from_nanos(self.now_nanos().saturating_sub(started));
            self.emit(partition, || EventKind::AttemptFinished {
                attempt,
                duration,
                outcome,
            });
        }
    }

    #[inline]
    fn call_finished<T, E>(
        &self,
        partition: Option<&PartitionKey>,
        started: u64,
        attempts: u32,
        result: &Result<T, Error<E>>,
        fell_back: bool,
    ) {
        if self.shared.listeners.enabled() {
            self.report_call(partition, started, attempts, result, fell_back);
        }
    }

    #[cold]
    fn report_call<T, E>(
        &self,
        partition: Option<&PartitionKey>,
        started: u64,
        attempts: u32,
        result: &Result<T, Error<E>>,
        fell_back: bool,
    ) {
        use crate::event::CallOutcome;
        let outcome = match result {
            Ok(_) if fell_back => CallOutcome::Fallback,
            Ok(_) => CallOutcome::Success,
            Err(Error::Timeout(_)) => CallOutcome::Timeout,
            Err(Error::Rejected(r)) => CallOutcome::Rejected(r.reason),
            Err(Error::Store(_)) => CallOutcome::StoreFailure,
            Err(_) => CallOutcome::Failure,
        };
        let duration = Duration::from_nanos(self.now_nanos().saturating_sub(started));
        self.emit(partition, || EventKind::CallFinished {
            attempts,
            duration,
            outcome,
        });
    }

    fn emit_admission(&self, partition: Option<&PartitionKey>, adm: &Admission) {
        if let Some(t) = adm.transition {
            self.emit_transition(partition, t);
        }
        if let Some(e) = &adm.degraded {
            self.emit(partition, || EventKind::StoreUnavailable {
                error: e.to_string(),
                degraded: true,
            });
        }
    }

    fn emit_recorded(
        &self,
        partition: Option<&PartitionKey>,
        rec: Result<Recorded, crate::StoreError>,
    ) {
        match rec {
            Ok(r) => {
                if let Some(t) = r.transition {
                    self.emit_transition(partition, t);
                }
                if let Some(duration) = r.cooldown {
                    self.emit(partition, || EventKind::CooldownStarted { duration });
                }
                if let Some(e) = r.degraded {
                    self.emit(partition, || EventKind::StoreUnavailable {
                        error: e.to_string(),
                        degraded: true,
                    });
                }
            }
            Err(e) => self.emit(partition, || EventKind::StoreUnavailable {
                error: e.to_string(),
                degraded: false,
            }),
        }
    }

    fn reject<E>(&self, partition: Option<&PartitionKey>, r: Rejection) -> Error<E> {
        self.emit(partition, || EventKind::Rejected {
            reason: r.reason,
            retry_after: r.retry_after,
        });
        Error::Rejected(r)
    }

    /// How long to wait before asking the gate again, or the final refusal.
    fn deferral<'g>(
        &self,
        gate: &'g Gate,
        rejection: Rejection,
        now: u64,
        deadline: Option<Deadline>,
        waiting: &mut Waiting<'g>,
    ) -> Result<Duration, Rejection> {
        let room = deadline.map(|d| Duration::from_nanos(d.at.saturating_sub(now)));
        let fits = |wait: Duration| room.is_none_or(|r| wait < r);
        match rejection.reason {
            RejectionReason::CooldownActive => {
                let left = rejection.retry_after.unwrap_or(Duration::ZERO);
                if !fits(left) {
                    return Err(Rejection::new(
                        RejectionReason::CooldownExceedsDeadline,
                        rejection.retry_after,
                    ));
                }
                match &gate.spec.cooldown {
                    Some(c) if left <= c.max_wait => Ok(left),
                    _ => Err(rejection),
                }
            }
            RejectionReason::RateLimited => match (&gate.spec.rate_limit, rejection.retry_after) {
                (Some(r), Some(left)) if left <= r.max_wait && fits(left) => Ok(left),
                _ => Err(rejection),
            },
            RejectionReason::BulkheadFull if waiting.may_queue => {
                let Some(b) = &gate.spec.bulkhead else {
                    return Err(rejection);
                };
                if b.max_queued == 0 {
                    return Err(rejection);
                }
                if waiting.ticket.is_none() {
                    let before = gate.waiters.fetch_add(1, Ordering::Relaxed);
                    let ticket = QueueTicket(gate);
                    if before >= b.max_queued {
                        return Err(rejection);
                    }
                    waiting.ticket = Some(ticket);
                }
                let waited = Duration::from_nanos(now.saturating_sub(waiting.since));
                let Some(left) = b.max_wait.checked_sub(waited).filter(|l| !l.is_zero()) else {
                    return Err(rejection);
                };
                let mut wait = waiting.poll.min(left);
                if let Some(r) = room {
                    if r.is_zero() {
                        return Err(rejection);
                    }
                    wait = wait.min(r);
                }
                waiting.poll = (waiting.poll * 2).min(QUEUE_POLL_MAX);
                Ok(wait)
            }
            _ => Err(rejection),
        }
    }

    /// Decides whether attempt `attempt` is followed by another.
    fn next<T, E>(
        &self,
        partition: Option<&PartitionKey>,
        attempt: u32,
        previous: &mut Duration,
        verdict: Verdict,
        error: Option<&E>,
        overall: Option<Deadline>,
    ) -> Next
    where
        K: Handles<T, E>,
    {
        let Some(retry) = &self.shared.retry else {
            return Next::Stop(StopReason::NotRetried);
        };
        if !verdict.is_retryable() {
            return Next::Stop(StopReason::NotRetried);
        }
        if attempt >= retry.max_attempts {
            return Next::Stop(StopReason::Exhausted);
        }
        let mut delay = retry.delay(attempt, *previous, &*self.shared.random);
        if let Some(hint) = verdict.retry_after() {
            delay = delay.max(hint);
        }
        if let Some(d) = overall {
            let now = self.now_nanos();
            if now.saturating_add(crate::clock::duration_nanos(delay)) >= d.at {
                self.emit(partition, || EventKind::RetryGaveUp {
                    attempts: attempt,
                    reason: GiveUpReason::Deadline,
                });
                return Next::Stop(StopReason::Deadline);
            }
        }
        if let Some(b) = &retry.budget {
            if !b.withdraw() {
                self.emit(partition, || EventKind::RetryGaveUp {
                    attempts: attempt,
                    reason: GiveUpReason::Budget,
                });
                return Next::Stop(StopReason::Budget);
            }
        }
        *previous = delay;
        self.emit(partition, || EventKind::RetryScheduled { attempt, delay });
        if let Some(e) = error {
            K::on_retry(&self.shared.handlers, e, attempt, delay);
        }
        Next::Retry(delay)
    }

    fn stop<E>(
        &self,
        partition: Option<&PartitionKey>,
        reason: StopReason,
        attempts: u32,
        e: E,
    ) -> Error<E> {
        match reason {
            StopReason::NotRetried => Error::Operation(e),
            StopReason::Exhausted | StopReason::Deadline => {
                Error::RetryExhausted { attempts, last: e }
            }
            StopReason::Budget => self.reject(
                partition,
                Rejection::new(RejectionReason::RetryBudgetExhausted, None),
            ),
        }
    }

    fn stop_timeout<E>(
        &self,
        partition: Option<&PartitionKey>,
        reason: StopReason,
        attempts: u32,
        d: Deadline,
    ) -> Error<E> {
        match reason {
            StopReason::Budget => self.reject(
                partition,
                Rejection::new(RejectionReason::RetryBudgetExhausted, None),
            ),
            _ => Error::Timeout(TimeoutError {
                scope: d.scope,
                after: d.after,
                attempts,
            }),
        }
    }

    fn outcome_of(verdict: Verdict) -> Outcome {
        match verdict.kind() {
            crate::VerdictKind::Ignore | crate::VerdictKind::Throttled => Outcome::Ignored,
            _ if verdict.is_failure() => Outcome::Failure,
            _ => Outcome::Success,
        }
    }

    /// Records the success of a lean admission started at `started`.
    #[inline]
    pub(super) fn lean_success(
        &self,
        gate: &Gate,
        memory: &MemoryResource,
        partition: Option<&PartitionKey>,
        permit: Permit,
        started: u64,
    ) {
        if !gate.success_recorded {
            return;
        }
        let end = if gate.record_needs_time {
            self.now_nanos()
        } else {
            started
        };
        let duration = Duration::from_nanos(end.saturating_sub(started));
        if let Some(t) = memory.record_success(partition, permit, duration, end) {
            self.emit_transition(partition, t);
        }
    }

    #[inline]
    fn start(&self) -> (u64, Option<Deadline>) {
        if let Some(r) = &self.shared.retry {
            if let Some(b) = &r.budget {
                b.deposit();
            }
        }
        if self.needs_time() {
            let now = self.now_nanos();
            (now, self.overall_deadline(now))
        } else {
            (0, None)
        }
    }

    /// Where the general engine starts: the start of the call, its overall
    /// deadline and the first attempt already run, if any.
    fn resume<'g, R>(
        &self,
        resume: Resume<'g, R>,
    ) -> (u64, Option<Deadline>, Option<FirstAttempt<'g, R>>) {
        match resume {
            Resume::Start => {
                let (now, overall) = self.start();
                (now, overall, None)
            }
            Resume::Started(now) => (now, self.overall_deadline(now), None),
            Resume::Ran { now, guard, result } => {
                (now, self.overall_deadline(now), Some((guard, result)))
            }
        }
    }

    /// The lean admission of a first attempt started at `now` on an
    /// unpartitioned memory gate, its permit written into `permit` (see
    /// [`MemoryResource::try_admit`]). The clock is read only if a policy
    /// needs the time and `now` was not read already.
    #[inline(always)]
    pub(super) fn lean_admit(
        &self,
        memory: &MemoryResource,
        partition: Option<&PartitionKey>,
        now: u64,
        permit: &mut Option<Permit>,
    ) -> Result<(), Option<Rejection>> {
        let mut read = (self.needs_time() || partition.is_some()).then_some(now);
        memory.try_admit(
            partition,
            &mut || *read.get_or_insert_with(|| self.now_nanos()),
            permit,
        )
    }

    // ---------------------------------------------------------------- async

    async fn admit_async<'g>(
        &'g self,
        gate: &'g Gate,
        partition: Option<&'g PartitionKey>,
        mut now: u64,
        deadline: Option<Deadline>,
    ) -> Result<(Permit, u64), Refused>
    where
        K: 'g,
    {
        let mut waiting = Waiting::new(now, true);
        loop {
            let request = AdmitRequest {
                partition,
                now: Duration::from_nanos(now),
            };
            let admission = match &gate.memory {
                Some(m) => m.admit(&request),
                None => gate.state.admit_async(request).await,
            };
            let admission = match admission {
                Ok(a) => a,
                Err(e) => return Err(self.store_failed(partition, e)),
            };
            self.emit_admission(partition, &admission);
            match admission.decision {
                Ok(p) => return Ok((p, now)),
                Err(r) => {
                    let wait = self.deferral(gate, r, now, deadline, &mut waiting)?;
                    self.emit(partition, || EventKind::Deferred {
                        reason: r.reason,
                        wait,
                    });
                    self.shared.clock.sleep(wait).await;
                    now = self.now_nanos();
                }
            }
        }
    }

    /// Reports a failed store: the call is refused with `Error::Store`.
    fn store_failed(&self, partition: Option<&PartitionKey>, e: crate::StoreError) -> Refused {
        self.emit(partition, || EventKind::StoreUnavailable {
            error: e.to_string(),
            degraded: false,
        });
        Refused::Store(e)
    }

    fn refusal<E>(&self, partition: Option<&PartitionKey>, r: Refused) -> Error<E> {
        match r {
            Refused::Rejected(r) => self.reject(partition, r),
            Refused::Store(e) => Error::Store(e),
        }
    }

    /// Runs an async call through the general engine, from where `resume`
    /// says it stands.
    pub(crate) async fn run_in<'g, T, E, Op, Fut>(
        &'g self,
        partition: Option<&'g PartitionKey>,
        mut op: Op,
        resume: Resume<'g, Option<Result<T, E>>>,
    ) -> Result<T, Error<E>>
    where
        K: Handles<T, E>,
        Op: FnMut(Context) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let started = self.event_clock();
        let (result, attempts) = self.execute_async(partition, &mut op, resume).await;
        let (result, fell_back) = match result {
            Ok(v) => (Ok(v), false),
            Err(err) => self.fall_back_async(partition, err, attempts).await,
        };
        self.call_finished(partition, started, attempts, &result, fell_back);
        result
    }

    /// The start of a lean call: the retry budget credited, the clock read
    /// if a policy needs it.
    #[inline(always)]
    pub(super) fn lean_start(&self, partition: Option<&PartitionKey>) -> u64 {
        if let Some(b) = self.shared.retry.as_ref().and_then(|r| r.budget.as_ref()) {
            b.deposit();
        }
        // A partition counts each use of its key: it needs the time.
        if self.needs_time() || partition.is_some() {
            self.now_nanos()
        } else {
            0
        }
    }

    /// The deadline of a first attempt started at `now`.
    #[inline(always)]
    pub(super) fn first_deadline(&self, now: u64) -> Option<u64> {
        self.shared
            .plan
            .first_timeout
            .map(|t| now.saturating_add(t))
    }

    /// A lean async call refused at once (an open circuit).
    #[cold]
    async fn lean_refused<T, E>(
        &self,
        partition: Option<&PartitionKey>,
        r: Rejection,
    ) -> Result<T, Error<E>>
    where
        K: Handles<T, E>,
    {
        let err = self.reject(partition, r);
        let (result, fell_back) = self.fall_back_async(partition, err, 1).await;
        self.call_finished(partition, 0, 1, &result, fell_back);
        result
    }

    /// An async call when the plan allows the lean path (memory gate or
    /// none, nobody listening): admit, run, record a success, here;
    /// anything else is handed to the general engine where it stands.
    pub(crate) async fn run_keyed<T, E, Op, Fut>(
        &self,
        partition: Option<&PartitionKey>,
        mut op: Op,
    ) -> Result<T, Error<E>>
    where
        K: Handles<T, E>,
        Op: FnMut(Context) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let shared = &*self.shared;
        let tracing = crate::event::Listeners::tracing();
        if !shared.plan.lean_async || tracing {
            return self.run_in(partition, op, Resume::Start).await;
        }
        if partition.is_none() && shared.plan.bare_first {
            // No policy, or a retry alone: the first attempt runs as is.
            let result = op(Context::bare(shared.name)).await;
            return match result {
                Ok(v) => Ok(v),
                Err(e) => {
                    self.run_in(None, op, Resume::first_failed(Some(Err(e))))
                        .await
                }
            };
        }
        let now = self.lean_start(partition);
        let at = self.first_deadline(now);
        let Some(gate) = &shared.gate else {
            // A timeout or a retry budget, no stateful policy.
            let ctx = self.context(partition, 1, at);
            let result = WithDeadline::new(op(ctx), &shared.clock, at).await;
            return match result {
                Some(Ok(v)) => Ok(v),
                result => {
                    let resume = Resume::first_ran(now, None, result);
                    self.run_in(partition, op, resume).await
                }
            };
        };
        let Some(memory) = gate.memory.as_deref() else {
            return self.run_in(partition, op, Resume::Started(now)).await;
        };
        // The guard holds the permit from the start: it is written in place.
        let mut guard = PermitGuard::new(gate, partition);
        match self.lean_admit(memory, partition, now, &mut guard.permit) {
            Ok(()) => {}
            Err(None) => return self.run_in(partition, op, Resume::Started(now)).await,
            // Nobody listens on the lean path: a refusal with no fallback
            // is returned as is.
            Err(Some(r)) if !K::HAS_FALLBACK => return Err(Error::Rejected(r)),
            Err(Some(r)) => return self.lean_refused(partition, r).await,
        };
        // Without a deadline or a key the context is a constant, dropped
        // for free.
        let result = match (at, partition) {
            (None, None) => Some(op(Context::bare(shared.name)).await),
            _ => {
                let ctx = self.context(partition, 1, at);
                WithDeadline::new(op(ctx), &shared.clock, at).await
            }
        };
        match result {
            Some(Ok(v)) => {
                if let Some(permit) = guard.permit.take() {
                    self.lean_success(gate, memory, partition, permit, now);
                }
                Ok(v)
            }
            result => {
                let resume = Resume::first_ran(now, Some(guard), result);
                self.run_in(partition, op, resume).await
            }
        }
    }

    async fn execute_async<'g, T, E, Op, Fut>(
        &'g self,
        partition: Option<&'g PartitionKey>,
        op: &mut Op,
        resume: Resume<'g, Option<Result<T, E>>>,
    ) -> (Result<T, Error<E>>, u32)
    where
        K: Handles<T, E>,
        Op: FnMut(Context) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let shared = &*self.shared;
        let (mut now, overall, mut first) = self.resume(resume);
        let mut attempt = 1u32;
        let mut previous = Duration::ZERO;
        loop {
            let mut deadline = self.attempt_deadline(now, overall);
            let mut guard = None;
            let result = if let Some((lean, result)) = first.take() {
                // The lean first attempt ran (see `call_lean`/`run_lean`).
                guard = lean;
                result
            } else {
                if let Some(gate) = &shared.gate {
                    if !self.needs_time() {
                        now = self.now_nanos();
                        deadline = self.attempt_deadline(now, overall);
                    }
                    match self.admit_async(gate, partition, now, deadline).await {
                        Ok((permit, admitted_at)) => {
                            if admitted_at != now {
                                now = admitted_at;
                                deadline = self.attempt_deadline(now, overall);
                            }
                            guard = Some(PermitGuard {
                                gate,
                                partition,
                                permit: Some(permit),
                            });
                        }
                        Err(r) => return (Err(self.refusal(partition, r)), attempt),
                    }
                }
                let at = deadline.map(|d| d.at);
                let ctx = self.context(partition, attempt, at);
                WithDeadline::new(op(ctx), &shared.clock, at).await
            };
            if shared.listeners.enabled() {
                let outcome = match &result {
                    Some(Ok(_)) => crate::event::AttemptOutcome::Success,
                    Some(Err(_)) => crate::event::AttemptOutcome::Failure,
                    None => crate::event::AttemptOutcome::Timeout,
                };
                self.attempt_finished(partition, attempt, now, outcome);
            }
            let (verdict, error) = match result {
                Some(Ok(v)) => {
                    if let Some(g) = guard.as_mut() {
                        self.record_either(g, now, Outcome::Success, None).await;
                    }
                    return (Ok(v), attempt);
                }
                Some(Err(e)) => {
                    let v = K::verdict(&shared.handlers, &e);
                    if let Some(g) = guard.as_mut() {
                        self.record_either(g, now, Self::outcome_of(v), v.retry_after())
                            .await;
                    }
                    (v, Some(e))
                }
                None => {
                    let d = deadline.expect("a timeout needs a deadline");
                    if let Some(g) = guard.as_mut() {
                        self.record_either(g, now, Outcome::Failure, None).await;
                    }
                    self.emit(partition, || EventKind::TimedOut {
                        attempt,
                        after: d.after,
                    });
                    (Verdict::retry(), None)
                }
            };
            drop(guard);
            let timed_out = error.is_none();
            let verdict = if timed_out && deadline.is_some_and(|d| d.scope == TimeoutScope::Overall)
            {
                Verdict::failure()
            } else {
                verdict
            };
            match self.next::<T, E>(
                partition,
                attempt,
                &mut previous,
                verdict,
                error.as_ref(),
                overall,
            ) {
                Next::Retry(delay) => {
                    if !delay.is_zero() {
                        shared.clock.sleep(delay).await;
                    }
                    attempt += 1;
                    now = if self.needs_time() {
                        self.now_nanos()
                    } else {
                        0
                    };
                }
                Next::Stop(reason) => {
                    let err = match error {
                        Some(e) => self.stop(partition, reason, attempt, e),
                        None => self.stop_timeout(
                            partition,
                            reason,
                            attempt,
                            deadline.expect("deadline"),
                        ),
                    };
                    return (Err(err), attempt);
                }
            }
        }
    }

    /// Records an async attempt: a memory gate directly, a shared store
    /// through its async API.
    #[inline]
    async fn record_either(
        &self,
        guard: &mut PermitGuard<'_>,
        started: u64,
        outcome: Outcome,
        retry_after: Option<Duration>,
    ) {
        if guard.gate.memory.is_some() {
            self.record_sync(guard, started, None, outcome, retry_after);
        } else {
            self.record_async(guard, started, outcome, retry_after)
                .await;
        }
    }

    /// The record of an attempt admitted at `started` that ended at `end`
    /// (read from the clock only when the store needs it).
    fn record_of<'g>(
        &self,
        guard: &PermitGuard<'g>,
        permit: Permit,
        started: u64,
        end: Option<u64>,
        outcome: Outcome,
        retry_after: Option<Duration>,
    ) -> Record<'g> {
        let end = match end {
            Some(e) => e,
            None if guard.gate.record_needs_time || retry_after.is_some() => self.now_nanos(),
            None => started,
        };
        Record {
            partition: guard.partition,
            permit,
            outcome,
            duration: Duration::from_nanos(end.saturating_sub(started)),
            retry_after,
            now: Duration::from_nanos(end),
        }
    }

    async fn record_async(
        &self,
        guard: &mut PermitGuard<'_>,
        started: u64,
        outcome: Outcome,
        retry_after: Option<Duration>,
    ) {
        let Some(permit) = guard.permit else { return };
        let gate = guard.gate;
        let record = self.record_of(guard, permit, started, None, outcome, retry_after);
        let result = match &gate.memory {
            Some(m) => m.record(&record),
            None => gate.state.record_async(record).await,
        };
        guard.permit = None;
        self.emit_recorded(guard.partition, result);
    }

    // ----------------------------------------------------------------- sync

    fn admit_sync<'g>(
        &'g self,
        gate: &'g Gate,
        partition: Option<&'g PartitionKey>,
        mut now: u64,
        deadline: Option<Deadline>,
    ) -> Result<(Permit, u64), Refused> {
        let mut waiting = Waiting::new(now, false);
        loop {
            let request = AdmitRequest {
                partition,
                now: Duration::from_nanos(now),
            };
            let admission = match &gate.memory {
                Some(m) => m.admit(&request),
                None => gate.state.admit(&request),
            };
            let admission = match admission {
                Ok(a) => a,
                Err(e) => return Err(self.store_failed(partition, e)),
            };
            self.emit_admission(partition, &admission);
            match admission.decision {
                Ok(p) => return Ok((p, now)),
                Err(r) => {
                    let wait = self.deferral(gate, r, now, deadline, &mut waiting)?;
                    self.emit(partition, || EventKind::Deferred {
                        reason: r.reason,
                        wait,
                    });
                    self.shared.clock.sleep_blocking(wait);
                    now = self.now_nanos();
                }
            }
        }
    }

    fn record_sync(
        &self,
        guard: &mut PermitGuard<'_>,
        started: u64,
        end: Option<u64>,
        outcome: Outcome,
        retry_after: Option<Duration>,
    ) {
        let Some(permit) = guard.permit.take() else {
            return;
        };
        let gate = guard.gate;
        let record = self.record_of(guard, permit, started, end, outcome, retry_after);
        let result = match &gate.memory {
            Some(m) => m.record(&record),
            None => gate.state.record(&record),
        };
        self.emit_recorded(guard.partition, result);
    }

    /// Hands a final error to the fallback of a sync call; `true` when the
    /// fallback ran.
    fn fall_back_sync<T, E>(
        &self,
        partition: Option<&PartitionKey>,
        err: Error<E>,
        attempts: u32,
    ) -> (Result<T, Error<E>>, bool)
    where
        K: HandlesSync<T, E>,
    {
        match self.fallen(partition, err, attempts) {
            Fallen::NotApplied(e) => (Err(e), false),
            Fallen::Done(r) => (r.map_err(Error::Fallback), true),
            // `HandlesSync` kinds never return a pending fallback.
            Fallen::Pending(_) => unreachable!("a sync pipeline kind returned an async fallback"),
        }
    }

    /// What the fallback, if the pipeline has one, makes of a final error
    /// (reported by an event when it applies).
    fn fallen<T, E>(
        &self,
        partition: Option<&PartitionKey>,
        err: Error<E>,
        attempts: u32,
    ) -> Fallen<T, E>
    where
        K: Handles<T, E>,
    {
        if !K::HAS_FALLBACK {
            return Fallen::NotApplied(err);
        }
        let ctx = self.context(partition, attempts, None);
        let fallen = K::fall_back(&self.shared.handlers, err, ctx);
        if !matches!(fallen, Fallen::NotApplied(_)) {
            self.emit(partition, || EventKind::FallbackExecuted);
        }
        fallen
    }

    /// Hands a final error to the fallback of an async call; `true` when the
    /// fallback ran.
    async fn fall_back_async<T, E>(
        &self,
        partition: Option<&PartitionKey>,
        err: Error<E>,
        attempts: u32,
    ) -> (Result<T, Error<E>>, bool)
    where
        K: Handles<T, E>,
    {
        match self.fallen(partition, err, attempts) {
            Fallen::NotApplied(e) => (Err(e), false),
            Fallen::Done(r) => (r.map_err(Error::Fallback), true),
            Fallen::Pending(f) => (f.await.map_err(Error::Fallback), true),
        }
    }

    /// Runs a sync call through the general engine, from where `resume`
    /// says it stands.
    pub(crate) fn call_in<'g, T, E, Op>(
        &'g self,
        partition: Option<&'g PartitionKey>,
        mut op: Op,
        resume: Resume<'g, Result<T, E>>,
    ) -> Result<T, Error<E>>
    where
        K: HandlesSync<T, E>,
        Op: FnMut(Context) -> Result<T, E>,
    {
        let started = self.event_clock();
        let (result, attempts) = self.execute_sync(partition, &mut op, resume);
        let (result, fell_back) = match result {
            Ok(v) => (Ok(v), false),
            Err(err) => self.fall_back_sync(partition, err, attempts),
        };
        self.call_finished(partition, started, attempts, &result, fell_back);
        result
    }

    /// [`call_in`](Self::call_in) out of line: where a lean call goes on
    /// after anything but a first success.
    #[inline(never)]
    pub(super) fn call_resumed<'g, T, E, Op>(
        &'g self,
        partition: Option<&'g PartitionKey>,
        op: Op,
        resume: Resume<'g, Result<T, E>>,
    ) -> Result<T, Error<E>>
    where
        K: HandlesSync<T, E>,
        Op: FnMut(Context) -> Result<T, E>,
    {
        self.call_in(partition, op, resume)
    }

    /// An unpartitioned sync call when the plan allows the lean path
    /// (memory gate or none, nobody listening, no strict timeout): admit,
    /// run, record a success, inline; anything else is handed to the
    /// general engine where it stands.
    #[inline]
    pub(crate) fn call_lean<'g, T, E, Op>(
        &'g self,
        partition: Option<&'g PartitionKey>,
        mut op: Op,
    ) -> Result<T, Error<E>>
    where
        K: HandlesSync<T, E>,
        Op: FnMut(Context) -> Result<T, E>,
    {
        let shared = &*self.shared;
        let now = self.lean_start(partition);
        let Some(gate) = &shared.gate else {
            // A timeout or a retry budget, no stateful policy.
            let result = op(self.context(partition, 1, self.first_deadline(now)));
            return match result {
                Ok(v) => Ok(v),
                Err(e) => {
                    let resume = Resume::first_ran(now, None, Err(e));
                    self.call_resumed(partition, op, resume)
                }
            };
        };
        let Some(memory) = gate.memory.as_deref() else {
            return self.call_resumed(partition, op, Resume::Started(now));
        };
        // The guard holds the permit from the start: it is written in place.
        let mut guard = PermitGuard::new(gate, partition);
        match self.lean_admit(memory, partition, now, &mut guard.permit) {
            Ok(()) => {}
            Err(None) => return self.call_resumed(partition, op, Resume::Started(now)),
            // Nobody listens on the lean path: a refusal with no fallback
            // is returned as is.
            Err(Some(r)) if !K::HAS_FALLBACK => return Err(Error::Rejected(r)),
            Err(Some(r)) => return self.lean_refused_sync(partition, r),
        };
        // Without a deadline or a key the context is a constant, dropped
        // for free.
        let result = match (self.first_deadline(now), partition) {
            (None, None) => op(Context::bare(shared.name)),
            (at, _) => op(self.context(partition, 1, at)),
        };
        match result {
            Ok(v) => {
                if let Some(permit) = guard.permit.take() {
                    self.lean_success(gate, memory, partition, permit, now);
                }
                Ok(v)
            }
            Err(e) => {
                let resume = Resume::first_ran(now, Some(guard), Err(e));
                self.call_resumed(partition, op, resume)
            }
        }
    }

    /// A lean sync call refused at once (an open circuit).
    #[cold]
    #[inline(never)]
    fn lean_refused_sync<T, E>(
        &self,
        partition: Option<&PartitionKey>,
        r: Rejection,
    ) -> Result<T, Error<E>>
    where
        K: HandlesSync<T, E>,
    {
        let err = self.reject(partition, r);
        let (result, fell_back) = self.fall_back_sync(partition, err, 1);
        self.call_finished(partition, 0, 1, &result, fell_back);
        result
    }

    fn execute_sync<'g, T, E, Op>(
        &'g self,
        partition: Option<&'g PartitionKey>,
        op: &mut Op,
        resume: Resume<'g, Result<T, E>>,
    ) -> (Result<T, Error<E>>, u32)
    where
        K: HandlesSync<T, E>,
        Op: FnMut(Context) -> Result<T, E>,
    {
        let shared = &*self.shared;
        let (mut now, overall, mut first) = self.resume(resume);
        let mut attempt = 1u32;
        let mut previous = Duration::ZERO;
        loop {
            let mut deadline = self.attempt_deadline(now, overall);
            let mut guard = None;
            let result = if let Some((lean, result)) = first.take() {
                // The lean first attempt ran (see `call_lean`/`run_lean`).
                guard = lean;
                result
            } else {
                if let Some(gate) = &shared.gate {
                    if !self.needs_time() {
                        now = self.now_nanos();
                        deadline = self.attempt_deadline(now, overall);
                    }
                    match self.admit_sync(gate, partition, now, deadline) {
                        Ok((permit, admitted_at)) => {
                            if admitted_at != now {
                                now = admitted_at;
                                deadline = self.attempt_deadline(now, overall);
                            }
                            guard = Some(PermitGuard {
                                gate,
                                partition,
                                permit: Some(permit),
                            });
                        }
                        Err(r) => return (Err(self.refusal(partition, r)), attempt),
                    }
                }
                op(self.context(partition, attempt, deadline.map(|d| d.at)))
            };
            if shared.listeners.enabled() {
                let strict_late = deadline.is_some_and(|d| d.strict && self.now_nanos() > d.at);
                let outcome = match &result {
                    Ok(_) if strict_late => crate::event::AttemptOutcome::Timeout,
                    Ok(_) => crate::event::AttemptOutcome::Success,
                    Err(_) => crate::event::AttemptOutcome::Failure,
                };
                self.attempt_finished(partition, attempt, now, outcome);
            }
            // Cooperative timeout: is the attempt late?
            let (end, late) = match deadline {
                Some(d) if shared.plan.watch_late || crate::event::Listeners::tracing() => {
                    let end = self.now_nanos();
                    (Some(end), (end > d.at).then(|| (d, end - d.at)))
                }
                _ => (None, None),
            };
            let (verdict, error, timed_out) = match result {
                Ok(v) => match late {
                    Some((d, _)) if d.strict => {
                        if let Some(g) = guard.as_mut() {
                            self.record_sync(g, now, end, Outcome::Failure, None);
                        }
                        self.emit(partition, || EventKind::TimedOut {
                            attempt,
                            after: d.after,
                        });
                        (Verdict::retry(), None, Some(d))
                    }
                    _ => {
                        if let Some(g) = guard.as_mut() {
                            self.record_sync(g, now, end, Outcome::Success, None);
                        }
                        if let Some((_, late_by)) = late {
                            let late_by = Duration::from_nanos(late_by);
                            self.emit(partition, || EventKind::DeadlineExceeded { late_by });
                        }
                        return (Ok(v), attempt);
                    }
                },
                Err(e) => {
                    let v = K::verdict(&shared.handlers, &e);
                    if let Some(g) = guard.as_mut() {
                        self.record_sync(g, now, end, Self::outcome_of(v), v.retry_after());
                    }
                    (v, Some(e), None)
                }
            };
            drop(guard);
            let verdict = match timed_out {
                // The whole call is out of time: no retry can fit.
                Some(d) if d.scope == TimeoutScope::Overall => Verdict::failure(),
                _ => verdict,
            };
            match self.next::<T, E>(
                partition,
                attempt,
                &mut previous,
                verdict,
                error.as_ref(),
                overall,
            ) {
                Next::Retry(delay) => {
                    if !delay.is_zero() {
                        shared.clock.sleep_blocking(delay);
                    }
                    attempt += 1;
                    now = if self.needs_time() {
                        self.now_nanos()
                    } else {
                        0
                    };
                }
                Next::Stop(reason) => {
                    let err = match (error, timed_out) {
                        (Some(e), _) => self.stop(partition, reason, attempt, e),
                        (None, Some(d)) => self.stop_timeout(partition, reason, attempt, d),
                        (None, None) => unreachable!("a failed attempt has an error or a timeout"),
                    };
                    return (Err(err), attempt);
                }
            }
        }
    }
}

/// A first attempt that ran before the general engine took the call over:
/// its permit guard (if there is a gate) and its result.
type FirstAttempt<'g, R> = (Option<PermitGuard<'g>>, R);

/// Where a call stands when the general engine takes it over.
pub(crate) enum Resume<'g, R> {
    /// Nothing happened yet.
    Start,
    /// The call started at this time (the retry budget credited); its
    /// first attempt is not admitted yet.
    Started(u64),
    /// The lean first attempt, admitted at `now` (holding `guard`'s permit
    /// when there is a gate), ended with `result` and was not a success.
    Ran {
        now: u64,
        guard: Option<PermitGuard<'g>>,
        result: R,
    },
}

impl<'g, R> Resume<'g, R> {
    /// A first attempt that ran with no gate at the start of the call (no
    /// clock read) and ended with `result`, not a success.
    pub(crate) fn first_failed(result: R) -> Self {
        Self::first_ran(0, None, result)
    }

    /// A first attempt admitted at `now` (on `guard`'s permit, if there is
    /// a gate) that ended with `result`, not a success.
    #[inline]
    pub(crate) fn first_ran(now: u64, guard: Option<PermitGuard<'g>>, result: R) -> Self {
        Resume::Ran { now, guard, result }
    }
}

/// Why the gate did not admit an attempt.
enum Refused {
    Rejected(Rejection),
    Store(crate::StoreError),
}

impl From<Rejection> for Refused {
    fn from(r: Rejection) -> Self {
        Refused::Rejected(r)
    }
}
