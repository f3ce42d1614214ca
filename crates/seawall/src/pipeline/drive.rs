//! The two drivers of the call engine ([`Call`]): blocking and async. Each
//! runs the operation, sleeps and asks a remote store where the engine says
//! so; every decision is the engine's.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context as TaskContext, Poll};

use super::engine::{
    Admit, Call, CallArgs, Driver, Ended, Failure, Finish, First, HedgeSince, Lane, Owned, Pending,
    Quick, Refused,
};
use super::kind::{Handles, HandlesSync};
use super::{Kind, Pipeline};
use crate::classify::Verdict;
use crate::clock::Sleep;
use crate::context::Context;
use crate::error::{ConfigError, Error};
use crate::event::{HedgeTrigger, Listeners};
use crate::store::{Admission, Recorded, Reservation, StoreFuture};
use crate::timeout::WithDeadline;

/// What an attempt's future gives: the operation's result, and maybe the
/// operation's own verdict on its error (an adapter that saw more than the
/// error, such as the headers of a response).
pub(crate) trait AttemptOutput<T, E> {
    fn split(self) -> (Result<T, E>, Option<Verdict>);
}

impl<T, E> AttemptOutput<T, E> for Result<T, E> {
    #[inline(always)]
    fn split(self) -> (Result<T, E>, Option<Verdict>) {
        (self, None)
    }
}

/// An attempt's result with the operation's verdict on its error.
#[cfg_attr(not(feature = "reqwest"), allow(dead_code))]
pub(crate) struct Judged<T, E> {
    pub(crate) result: Result<T, E>,
    pub(crate) verdict: Option<Verdict>,
}

impl<T, E> AttemptOutput<T, E> for Judged<T, E> {
    #[inline(always)]
    fn split(self) -> (Result<T, E>, Option<Verdict>) {
        (self.result, self.verdict)
    }
}

use crate::clock::TimeHold;

pin_project_lite::pin_project! {
    /// The async wait of a deferred admission ([`Admit::Wait`], built by
    /// [`Call::wait`]): its sleep, ended early when the call's place in a
    /// queue is woken (a slot was given back for it). The wake-up is polled
    /// first, so a virtual clock is not moved past the instant the slot was
    /// given back.
    pub(crate) struct Wait {
        // Boxed: only a call in a queue has one, and every call's future
        // has room for the wait.
        notified: Option<Pin<Box<tokio::sync::futures::OwnedNotified>>>,
        #[pin]
        sleep: Sleep,
        // A wait of no time: it yields once, so that what else is due at
        // this instant runs first, holding a virtual clock at the instant
        // meanwhile (`Some(hold)`, taken when it is over).
        yields: Option<Option<TimeHold>>,
        yielded: bool,
    }
}

impl Wait {
    /// A wait of `sleep`, ended early by `notified` if any; a wait of no
    /// time (`yields`, with the hold of a virtual clock) lets the other
    /// work due at this instant run first.
    pub(crate) fn new(
        notified: Option<tokio::sync::futures::OwnedNotified>,
        sleep: Sleep,
        yields: Option<Option<TimeHold>>,
    ) -> Self {
        Wait {
            notified: notified.map(Box::pin),
            sleep,
            yields,
            yielded: false,
        }
    }
}

impl Future for Wait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<()> {
        let this = self.project();
        if let Some(hold) = this.yields {
            // First poll: yield, keeping the hold; the next ends the wait.
            if !*this.yielded {
                *this.yielded = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            drop(hold.take());
            return Poll::Ready(());
        }
        if let Some(notified) = this.notified {
            if notified.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
        }
        this.sleep.poll(cx)
    }
}

/// Where the general loop takes a call over from the ordinary first steps.
pub(super) enum From<T, E> {
    /// The ordinary admission did not decide.
    Admission(Quick),
    /// The attempt ended, not in the ordinary way.
    Ended(Option<Result<T, E>>, Option<Verdict>),
}

impl<K: Kind> Pipeline<K> {
    /// Runs a blocking call made with `args`. The ordinary steps (an
    /// admission decided in place, a success that nobody watches) run here;
    /// anything else in the general loop, from where the call stands. Each
    /// admission takes the call's weight in rate-limit permits, on either
    /// path; a call that reports the use of its fallback (a coalesced
    /// call's leader) takes the general one.
    #[inline(always)]
    pub(crate) fn drive_sync<'a, T, E, Op>(
        &'a self,
        args: impl CallArgs<'a>,
        mut op: Op,
    ) -> Result<T, Error<E>>
    where
        K: HandlesSync<T, E>,
        Op: FnMut(Context) -> Result<T, E>,
    {
        let shared = &*self.shared;
        if self.runs_bare(&args) {
            return match op(Context::bare(shared.name)) {
                Ok(v) => Ok(v),
                Err(e) => {
                    let first = First::after_bare(self, args);
                    let mut held = first.hold();
                    let call = first.into_call(Driver::Sync, &mut held);
                    sync_loop(call, op, Some(From::Ended(Some(Err(e)), None)))
                }
            };
        }
        let (partition, weight, fallback_seen) =
            (args.partition(), args.weight(), args.fallback_seen());
        let first = fallback_seen
            .is_none()
            .then(|| First::start(self, args))
            .flatten();
        let Some(mut first) = first else {
            if shared.hedging.is_some() {
                return Err(Error::Config(Box::new(hedging_is_async())));
            }
            let call = Call::start(self, partition, Driver::Sync)
                .weighted(weight)
                .reporting_fallback(fallback_seen);
            return sync_loop(Owned(call), op, None);
        };
        // `held` holds the attempt's permit, given back on a panic.
        let mut held = first.hold();
        match first.admit(&mut held) {
            Ok(ctx) => {
                let result = op(ctx);
                match first.ended(result, &mut held, Driver::Sync) {
                    // Nobody listens on the ordinary path: the call is over.
                    Ok(v) => {
                        held.spent();
                        Ok(v)
                    }
                    Err(result) => {
                        let from = From::Ended(Some(result), None);
                        let call = first.into_call(Driver::Sync, &mut held);
                        sync_loop(call, op, Some(from))
                    }
                }
            }
            Err(quick) => {
                if let Some(err) = first.refused_at_once::<T, E>(&quick, Driver::Sync) {
                    return Err(err);
                }
                let from = From::Admission(quick);
                sync_loop(first.into_call(Driver::Sync, &mut held), op, Some(from))
            }
        }
    }

    /// Whether a call made with `args` runs the operation as given: a
    /// pipeline without admission policies, listeners or chaos, a call in
    /// no partition that reports no fallback, and no subscriber that wants
    /// the spans of `tracing`.
    #[inline(always)]
    fn runs_bare<'a>(&self, args: &impl CallArgs<'a>) -> bool {
        let shared = &*self.shared;
        // A bare pipeline is never general and has no registered listener:
        // `in_place` then says it has no chaos policy to ask.
        shared.plan.bare
            && args.fallback_seen().is_none()
            && args.partition().is_none()
            && !Listeners::tracing()
            && (shared.plan.in_place || !shared.chaos_may_inject())
    }

    /// Runs an async call made with `args`; see
    /// [`drive_sync`](Self::drive_sync). A call that runs the operation as
    /// given does so in a future of its own ([`async_bare`]), which holds
    /// nothing of the engine, so that its drop stays small; the ordinary
    /// steps run here, anything else in the general loop, from where the
    /// call stands.
    ///
    /// [`async_bare`]: Self::async_bare
    pub(crate) async fn drive_async<'a, T, E, Op, Fut>(
        &'a self,
        args: impl CallArgs<'a>,
        mut op: Op,
    ) -> Result<T, Error<E>>
    where
        K: Handles<T, E>,
        Op: FnMut(Context) -> Fut,
        Fut: Future,
        Fut::Output: AttemptOutput<T, E>,
    {
        if self.runs_bare(&args) {
            return self.async_bare(args, op).await;
        }
        let shared = &*self.shared;
        let (partition, weight, fallback_seen) =
            (args.partition(), args.weight(), args.fallback_seen());
        let first = fallback_seen
            .is_none()
            .then(|| First::start(self, args))
            .flatten();
        let Some(mut first) = first else {
            let mut call = Owned(
                Call::start(self, partition, Driver::Async)
                    .weighted(weight)
                    .reporting_fallback(fallback_seen),
            );
            if shared.hedging.is_some() && !call.wraps_call() {
                // By reference: the hedged loop's future stays small, so
                // the driver's does not grow for the calls that never hedge.
                return hedged_loop(&mut call, &mut op, true).await;
            }
            return async_loop(call, op, None).await;
        };
        let mut held = first.hold();
        let from = match first.admit(&mut held) {
            Ok(ctx) => {
                // Without a deadline the attempt's future is awaited as it
                // is: no timer to arm, nothing to wrap.
                let output = match first.deadline() {
                    None => Some(op(ctx).await),
                    deadline => WithDeadline::new(op(ctx), first.clock(), deadline).await,
                };
                match output {
                    Some(output) => {
                        let (result, judged) = output.split();
                        // A result the operation judged itself is recorded
                        // as its verdict says, in the general loop.
                        let ended = match judged {
                            None => first.ended(result, &mut held, Driver::Async),
                            Some(_) => Err(result),
                        };
                        match ended {
                            // Nobody listens on the ordinary path: the call
                            // is over.
                            Ok(v) => {
                                held.spent();
                                return Ok(v);
                            }
                            Err(result) => From::Ended(Some(result), judged),
                        }
                    }
                    None => From::Ended(None, None),
                }
            }
            Err(quick) => {
                if let Some(err) = first.refused_at_once::<T, E>(&quick, Driver::Async) {
                    return Err(err);
                }
                From::Admission(quick)
            }
        };
        async_loop(first.into_call(Driver::Async, &mut held), op, Some(from)).await
    }

    /// An async call that runs the operation as given (see
    /// [`runs_bare`](Self::runs_bare)): it ends here when the operation
    /// succeeds; anything else goes on in the general loop, in a future of
    /// its own ([`async_after_bare`](Self::async_after_bare)).
    async fn async_bare<'a, T, E, Op, Fut>(
        &'a self,
        args: impl CallArgs<'a>,
        mut op: Op,
    ) -> Result<T, Error<E>>
    where
        K: Handles<T, E>,
        Op: FnMut(Context) -> Fut,
        Fut: Future,
        Fut::Output: AttemptOutput<T, E>,
    {
        let (result, judged) = op(Context::bare(self.shared.name)).await.split();
        match result {
            Ok(v) => Ok(v),
            Err(e) => {
                let from = From::Ended(Some(Err(e)), judged);
                self.async_after_bare(args, op, from).await
            }
        }
    }

    /// The general loop of an async call whose first attempt, the
    /// operation itself, ended as `from` says.
    async fn async_after_bare<'a, T, E, Op, Fut>(
        &'a self,
        args: impl CallArgs<'a>,
        op: Op,
        from: From<T, E>,
    ) -> Result<T, Error<E>>
    where
        K: Handles<T, E>,
        Op: FnMut(Context) -> Fut,
        Fut: Future,
        Fut::Output: AttemptOutput<T, E>,
    {
        let first = First::after_bare(self, args);
        let mut held = first.hold();
        let call = first.into_call(Driver::Async, &mut held);
        async_loop(call, op, Some(from)).await
    }
}

#[inline(always)]
pub(super) fn finish_sync<K, T, E>(
    call: &mut Call<'_, K>,
    result: Result<T, Error<E>>,
) -> Result<T, Error<E>>
where
    K: HandlesSync<T, E>,
{
    match call.finish(result) {
        Finish::Done(result) => result,
        // `HandlesSync` kinds never have an async fallback.
        Finish::Fallback(_) => unreachable!("a sync pipeline kind returned an async fallback"),
    }
}

/// The general loop of a blocking call, from where `from` says it stands.
#[inline(never)]
fn sync_loop<K, T, E, Op>(
    mut call: Owned<'_, K>,
    op: Op,
    from: Option<From<T, E>>,
) -> Result<T, Error<E>>
where
    K: HandlesSync<T, E>,
    Op: FnMut(Context) -> Result<T, E>,
{
    // A call that has not started its attempts, wrapped by policies
    // written in code: its passes make them.
    if from.is_none() && call.wraps_call() {
        return super::chain::call_around(&mut call.0, op);
    }
    let result = sync_attempts(&mut call, op, from);
    finish_sync(&mut call.0, result)
}

/// The attempts of a blocking call, from where `from` says it stands, until
/// its result before the fallback.
#[inline(always)]
pub(super) fn sync_attempts<K, T, E, Op>(
    call: &mut Owned<'_, K>,
    mut op: Op,
    mut from: Option<From<T, E>>,
) -> Result<T, Error<E>>
where
    K: HandlesSync<T, E>,
    Op: FnMut(Context) -> Result<T, E>,
{
    'call: loop {
        let mut ended = match from.take() {
            Some(From::Ended(result, judged)) => call.ended(result, judged),
            from => {
                let mut admit = match from {
                    Some(From::Admission(quick)) => call.admit_after(quick),
                    _ => call.admit(),
                };
                let ctx = loop {
                    match admit {
                        Admit::Run(ctx) => break Ok(ctx),
                        Admit::Ask(request) => {
                            let answer = call.store().admit(&request);
                            admit = call.admitted(answer);
                        }
                        Admit::AskReserving(request, reserve) => {
                            let answer = call.store().admit_reserving(&request, reserve);
                            admit = call.admitted_reserving(answer);
                        }
                        Admit::Wait(wait) => {
                            call.clock().sleep_blocking(wait);
                            admit = call.waited();
                        }
                        Admit::Refused(r) => break Err(call.refused(r)),
                    }
                };
                match ctx {
                    Err(ended) => ended,
                    // A panic drops the call, which gives its permit back.
                    Ok(ctx) if call.has_custom_attempt() => {
                        let (result, judged) = super::chain::attempt_sync(call, ctx, &mut op);
                        call.ended_through(result, judged)
                    }
                    Ok(ctx) => {
                        let result = operate_sync(call, ctx, &mut op);
                        call.ended(Some(result), None)
                    }
                }
            }
        };
        loop {
            match ended {
                Ended::Done(result) => break 'call result,
                Ended::Record(record, pending) => {
                    let answer = call.store().record(&record);
                    ended = call.recorded(pending, answer);
                }
                Ended::Retry(delay) => {
                    if !delay.is_zero() {
                        call.clock().sleep_blocking(delay);
                    }
                    call.retry();
                    break;
                }
                Ended::Hedge(_) => unreachable!("a blocking call never hedges"),
            }
        }
    }
}

/// One run of the operation in the attempt under way of a blocking call,
/// with the chaos policies' injection: a latency slept on the pipeline's
/// clock, then the injected result or the operation's.
#[inline(always)]
pub(super) fn operate_sync<K, T, E, Op>(call: &Call<'_, K>, ctx: Context, op: Op) -> Result<T, E>
where
    K: Handles<T, E>,
    Op: FnOnce(Context) -> Result<T, E>,
{
    if !call.has_chaos() {
        return op(ctx);
    }
    let injection = call.inject::<T, E>(&ctx);
    if !injection.delay.is_zero() {
        call.clock().sleep_blocking(injection.delay);
    }
    match injection.result {
        Some(result) => result,
        None => op(ctx),
    }
}

/// One run of the operation in the attempt under way of an async call,
/// with the chaos policies' injection: a latency slept on the pipeline's
/// clock (inside the attempt's deadline), then the injected result or the
/// operation's, with its own verdict on its error.
pub(super) fn operate_async<'c, K, T, E, Op, Fut>(
    call: &Call<'c, K>,
    ctx: Context,
    op: Op,
) -> impl Future<Output = (Result<T, E>, Option<Verdict>)> + use<'c, K, T, E, Op, Fut>
where
    K: Handles<T, E>,
    Op: FnOnce(Context) -> Fut,
    Fut: Future,
    Fut::Output: AttemptOutput<T, E>,
{
    let attempt = Attempt::<Fut, T, E>::injected(call, ctx);
    async move {
        match attempt.await {
            Due::Outcome(outcome) => outcome,
            Due::Call(ctx) => op(ctx).await.split(),
        }
    }
}

/// The general loop of an async call, from where `from` says it stands.
async fn async_loop<K, T, E, Op, Fut>(
    mut call: Owned<'_, K>,
    op: Op,
    from: Option<From<T, E>>,
) -> Result<T, Error<E>>
where
    K: Handles<T, E>,
    Op: FnMut(Context) -> Fut,
    Fut: Future,
    Fut::Output: AttemptOutput<T, E>,
{
    // A call that has not started its attempts, wrapped by policies
    // written in code: its passes make them.
    if from.is_none() && call.wraps_call() {
        return Box::pin(super::chain::run_around(&mut call.0, op)).await;
    }
    let result = async_attempts(&mut call, op, from).await;
    match call.finish(result) {
        Finish::Done(result) => result,
        Finish::Fallback(fallback) => {
            let result = fallback.await;
            call.fell_back(result)
        }
    }
}

/// The attempts of an async call, from where `from` says it stands, until
/// its result before the fallback.
pub(super) async fn async_attempts<K, T, E, Op, Fut>(
    call: &mut Owned<'_, K>,
    mut op: Op,
    mut from: Option<From<T, E>>,
) -> Result<T, Error<E>>
where
    K: Handles<T, E>,
    Op: FnMut(Context) -> Fut,
    Fut: Future,
    Fut::Output: AttemptOutput<T, E>,
{
    'call: loop {
        let mut ended = match from.take() {
            Some(From::Ended(result, judged)) => call.ended(result, judged),
            from => {
                let mut admit = match from {
                    Some(From::Admission(quick)) => call.admit_after(quick),
                    _ => call.admit(),
                };
                let ctx = loop {
                    match admit {
                        Admit::Run(ctx) => break Ok(ctx),
                        Admit::Ask(request) => {
                            let answer = call.store().admit_async(request).await;
                            admit = call.admitted(answer);
                        }
                        Admit::AskReserving(request, reserve) => {
                            let answer = call.store().admit_reserving_async(request, reserve).await;
                            admit = call.admitted_reserving(answer);
                        }
                        Admit::Wait(wait) => {
                            call.wait(wait).await;
                            admit = call.waited();
                        }
                        Admit::Refused(r) => break Err(call.refused(r)),
                    }
                };
                match ctx {
                    Err(ended) => ended,
                    Ok(ctx) => {
                        let deadline = call.deadline();
                        let clock = call.clock();
                        if call.has_custom_attempt() {
                            // The policies' passes run inside the attempt's deadline.
                            let through = super::chain::attempt_async(call, ctx, &mut op);
                            match WithDeadline::new(Box::pin(through), clock, deadline).await {
                                Some((result, judged)) => call.ended_through(result, judged),
                                None => call.ended(None, None),
                            }
                        } else {
                            let output = if call.has_chaos() {
                                // The injected latency runs inside the attempt's
                                // deadline.
                                let attempt = operate_async(call, ctx, &mut op);
                                WithDeadline::new(attempt, clock, deadline).await
                            } else {
                                WithDeadline::new(op(ctx), clock, deadline)
                                    .await
                                    .map(AttemptOutput::split)
                            };
                            match output {
                                Some((result, judged)) => call.ended(Some(result), judged),
                                None => call.ended(None, None),
                            }
                        }
                    }
                }
            }
        };
        loop {
            match ended {
                Ended::Done(result) => break 'call result,
                Ended::Record(record, pending) => {
                    let answer = call.store().record_async(record).await;
                    ended = call.recorded(pending, answer);
                }
                Ended::Retry(delay) => {
                    if delay.is_zero() {
                        // Each attempt after the first is a point where the
                        // task can be cancelled and others can run.
                        YieldNow(false).await;
                    } else {
                        call.clock().sleep(delay).await;
                    }
                    call.retry();
                    break;
                }
                Ended::Hedge(_) => {
                    unreachable!("only the hedged loop runs a pipeline with hedging")
                }
            }
        }
    }
}

/// Gives the runtime a turn: pending once, woken at once.
struct YieldNow(bool);

impl Future for YieldNow {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// The refusal of a blocking call on a pipeline with hedging.
#[cold]
pub(super) fn hedging_is_async() -> ConfigError {
    ConfigError::new(
        crate::hedge::NAME,
        "call",
        "is async only: hedged attempts run concurrently and the losers are dropped, which a \
         blocking call on one thread cannot do; call `run`",
    )
}

pin_project_lite::pin_project! {
    /// One attempt of an async call with chaos policies, or of a hedged
    /// call: the latency they injected, then the result they injected or
    /// the operation's (the one statement of that order for both async
    /// paths; the sync path sleeps and calls in `operate_sync`). The
    /// operation is called once the latency is over (its context then
    /// tells the time left): until then the attempt holds the context to
    /// call it with, and gives it back when the latency ends
    /// ([`Due::Call`]).
    struct Attempt<Fut, T, E> {
        #[pin]
        delay: Option<Sleep>,
        injected: Option<Result<T, E>>,
        ctx: Option<Context>,
        #[pin]
        op: Option<Fut>,
    }
}

impl<Fut, T, E> Attempt<Fut, T, E> {
    /// An attempt as the chaos policies decide it for `ctx`: their latency
    /// first, then their result or the call of the operation.
    fn injected<K: Handles<T, E>>(call: &Call<'_, K>, ctx: Context) -> Self {
        let injection = call.inject::<T, E>(&ctx);
        let delay = (!injection.delay.is_zero()).then(|| call.clock().sleep(injection.delay));
        Attempt {
            delay,
            ctx: injection.result.is_none().then_some(ctx),
            injected: injection.result,
            op: None,
        }
    }

    /// An attempt whose operation was called, with nothing injected.
    fn calling(op: Fut) -> Self {
        Attempt {
            delay: None,
            injected: None,
            ctx: None,
            op: Some(op),
        }
    }
}

/// What an [`Attempt`] comes to: its outcome, or the call of its operation,
/// due now that its injected latency is over.
enum Due<T, E> {
    Outcome((Result<T, E>, Option<Verdict>)),
    Call(Context),
}

impl<Fut, T, E> Future for Attempt<Fut, T, E>
where
    Fut: Future,
    Fut::Output: AttemptOutput<T, E>,
{
    type Output = Due<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Some(delay) = this.delay.as_mut().as_pin_mut() {
            ready!(delay.poll(cx));
            this.delay.set(None);
        }
        if let Some(result) = this.injected.take() {
            return Poll::Ready(Due::Outcome((result, None)));
        }
        if let Some(ctx) = this.ctx.take() {
            return Poll::Ready(Due::Call(ctx));
        }
        match this.op.as_pin_mut() {
            Some(op) => op.poll(cx).map(|out| Due::Outcome(out.split())),
            // An attempt holds an operation, its context or an injected
            // result; the last two are taken when they are given back.
            None => Poll::Pending,
        }
    }
}

pin_project_lite::pin_project! {
    /// Where one attempt of a hedged call stands: each state awaits what
    /// the engine asked for (a wait, the store) or the attempt itself.
    #[project = StepProj]
    enum Step<'g, Fut, T, E> {
        /// To be admitted.
        Start,
        /// A deferred admission, waiting.
        Waiting { #[pin] wait: Wait },
        Asking { future: StoreFuture<'g, Admission> },
        AskingReserving { future: StoreFuture<'g, (Admission, Option<Reservation>)> },
        Running { #[pin] attempt: WithDeadline<'g, Attempt<Fut, T, E>> },
        /// The attempt's outcome, given to the store.
        Recording { future: StoreFuture<'g, Recorded>, pending: Option<Pending<T, E>> },
    }
}

pin_project_lite::pin_project! {
    /// An attempt of a hedged call: what it holds (entered into the call
    /// for each step) and where it stands.
    struct HedgedLane<'g, Fut, T, E> {
        lane: Lane<'g>,
        #[pin]
        step: Step<'g, Fut, T, E>,
    }
}

impl<'g, Fut, T, E> HedgedLane<'g, Fut, T, E> {
    fn new(lane: Lane<'g>) -> Self {
        HedgedLane {
            lane,
            step: Step::Start,
        }
    }
}

/// What a step of a hedged attempt came to.
enum Progress<'g, T, E> {
    /// Still under way; `started` when its operation started in this step
    /// (the next hedge is timed from then).
    Pending { started: bool },
    /// The call is decided (its result, or its outcome for the call's gate
    /// to record first).
    Decided(Ended<'g, T, E>),
    /// The attempt failed; hedging goes on.
    Failed(Failure<E>),
    /// The attempt's gate refused it.
    Refused(Refused),
}

/// Takes one attempt of a hedged call as far as it goes, entered into the
/// call for its steps.
fn poll_lane<'g, K, T, E, Op, Fut>(
    call: &mut Call<'g, K>,
    op: &mut Op,
    lane: Pin<&mut HedgedLane<'g, Fut, T, E>>,
    cx: &mut TaskContext<'_>,
) -> Progress<'g, T, E>
where
    K: Handles<T, E>,
    Op: FnMut(Context) -> Fut,
    Fut: Future,
    Fut::Output: AttemptOutput<T, E>,
{
    let this = lane.project();
    call.swap_lane(this.lane);
    let progress = step_lane(call, op, this.step, cx);
    call.swap_lane(this.lane);
    progress
}

fn step_lane<'g, K, T, E, Op, Fut>(
    call: &mut Call<'g, K>,
    op: &mut Op,
    mut step: Pin<&mut Step<'g, Fut, T, E>>,
    cx: &mut TaskContext<'_>,
) -> Progress<'g, T, E>
where
    K: Handles<T, E>,
    Op: FnMut(Context) -> Fut,
    Fut: Future,
    Fut::Output: AttemptOutput<T, E>,
{
    let mut started = false;
    loop {
        let admit = match step.as_mut().project() {
            StepProj::Start => call.admit(),
            StepProj::Waiting { wait } => match wait.poll(cx) {
                Poll::Ready(()) => call.waited(),
                Poll::Pending => return Progress::Pending { started },
            },
            StepProj::Asking { future } => match Pin::new(future).poll(cx) {
                Poll::Ready(answer) => call.admitted(answer),
                Poll::Pending => return Progress::Pending { started },
            },
            StepProj::AskingReserving { future } => match Pin::new(future).poll(cx) {
                Poll::Ready(answer) => call.admitted_reserving(answer),
                Poll::Pending => return Progress::Pending { started },
            },
            StepProj::Running { attempt } => {
                let ended = match attempt.poll(cx) {
                    Poll::Ready(Some(Due::Outcome((result, judged)))) => {
                        call.ended(Some(result), judged)
                    }
                    // Its injected latency over (within the deadline), the
                    // operation is called, under the same deadline.
                    Poll::Ready(Some(Due::Call(ctx))) => {
                        let attempt = Attempt::calling(op(ctx));
                        let attempt = WithDeadline::new(attempt, call.clock(), call.deadline());
                        step.set(Step::Running { attempt });
                        continue;
                    }
                    Poll::Ready(None) => call.ended(None, None),
                    Poll::Pending => return Progress::Pending { started },
                };
                match after_attempt(call, step.as_mut(), ended) {
                    Some(progress) => return progress,
                    None => continue,
                }
            }
            StepProj::Recording { future, pending } => {
                let answer = match Pin::new(future).poll(cx) {
                    Poll::Ready(answer) => answer,
                    Poll::Pending => return Progress::Pending { started },
                };
                let pending = pending.take().expect("a record waits with its outcome");
                let ended = call.recorded(pending, answer);
                match after_attempt(call, step.as_mut(), ended) {
                    Some(progress) => return progress,
                    None => continue,
                }
            }
        };
        match admit {
            Admit::Run(ctx) => {
                let ctx = call.hedge_started(ctx);
                let attempt = match call.has_chaos() {
                    true => Attempt::injected(call, ctx),
                    false => Attempt::calling(op(ctx)),
                };
                let attempt = WithDeadline::new(attempt, call.clock(), call.deadline());
                step.set(Step::Running { attempt });
                started = true;
            }
            Admit::Ask(request) => step.set(Step::Asking {
                future: call.store().admit_async(request),
            }),
            Admit::AskReserving(request, reserve) => step.set(Step::AskingReserving {
                future: call.store().admit_reserving_async(request, reserve),
            }),
            Admit::Wait(wait) => step.set(Step::Waiting {
                wait: call.wait(wait),
            }),
            Admit::Refused(r) => {
                call.hedge_not_started();
                return Progress::Refused(r);
            }
        }
    }
}

/// What the end of an attempt (or of its record) leaves to the lane: a
/// progress to report, or `None` when the lane goes on (a record to await).
fn after_attempt<'g, K, Fut, T, E>(
    call: &mut Call<'g, K>,
    mut step: Pin<&mut Step<'g, Fut, T, E>>,
    ended: Ended<'g, T, E>,
) -> Option<Progress<'g, T, E>>
where
    K: Handles<T, E>,
{
    match ended {
        Ended::Done(result) => Some(Progress::Decided(Ended::Done(result))),
        // The call is decided (a success wins when it is seen, not once a
        // remote store has recorded it): the other attempts are dropped,
        // then the store records the outcome.
        Ended::Record(
            record,
            pending @ (Pending::Done(_) | Pending::Success(_) | Pending::Judged(..)),
        ) => Some(Progress::Decided(Ended::Record(record, pending))),
        // A failure is decided once recorded.
        Ended::Record(record, pending) => {
            step.set(Step::Recording {
                future: call.store().record_async(record),
                pending: Some(pending),
            });
            None
        }
        Ended::Hedge(failure) => Some(Progress::Failed(failure)),
        Ended::Retry(_) => unreachable!("a pipeline with hedging has no retry"),
    }
}

/// Arms the timer of the next hedge after an attempt started or a hedge
/// was refused, as the engine says ([`Call::hedge_timer`]): a wait, polled
/// once to register it (`armed` set: not polled again in this poll of the
/// call); no wait (only a failure starts the next); or a hedge to try at
/// once, returned.
fn arm<'g, K: Kind>(
    call: &mut Call<'g, K>,
    mut timer: Pin<&mut Option<Sleep>>,
    armed: &mut bool,
    cx: &mut TaskContext<'_>,
    since: HedgeSince,
) -> Option<Lane<'g>> {
    timer.set(None);
    match call.hedge_timer(since)? {
        d if d.is_zero() => call.hedge(HedgeTrigger::Delay),
        d => {
            timer.set(Some(call.clock().sleep(d)));
            if let Some(sleep) = timer.as_pin_mut() {
                // Registers it.
                let _ = sleep.poll(cx);
                *armed = true;
            }
            None
        }
    }
}

/// The loop of a hedged call (async only): the first attempt, then hedged
/// ones as the engine says (after a delay from the start of the latest or
/// from a hedge's refusal, at once after a failure), until an answer wins;
/// the other attempts are dropped then. Each attempt's steps are the engine's, entered into the
/// call ([`Call::swap_lane`]). The first attempt lives in this future; a
/// hedged one is boxed when it starts, so a call that never hedges does
/// not allocate.
///
/// With `end`, the call then ends (the fallback); without, the loop gives
/// the result before the fallback: what a pass of a policy written in code
/// around the call runs. One function for both, so an ordinary hedged call
/// awaits no nested future.
pub(super) async fn hedged_loop<K, T, E, Op, Fut>(
    call: &mut Owned<'_, K>,
    op: &mut Op,
    end: bool,
) -> Result<T, Error<E>>
where
    K: Handles<T, E>,
    Op: FnMut(Context) -> Fut,
    Fut: Future,
    Fut::Output: AttemptOutput<T, E>,
{
    // The first attempt's state stays in the call (a hedge's is swapped in
    // for its steps and out again); only its step lives here.
    let mut primary = std::pin::pin!(Step::<'_, Fut, T, E>::Start);
    let mut primary_running = true;
    let mut hedges: Vec<Pin<Box<HedgedLane<'_, Fut, T, E>>>> = Vec::new();
    let mut timer = std::pin::pin!(None::<Sleep>);
    let mut last: Option<Failure<E>> = None;
    let decided = std::future::poll_fn(|cx| {
        let call = &mut call.0;
        // A spurious poll of a sleep on the virtual clock moves the clock
        // to the earliest sleep it knows of, so each attempt started and
        // each timer armed is polled (registered) before any other lane:
        // a new lane goes right after the one that started it, the timer
        // is armed as soon as the latest attempt starts, and a lane started
        // by the timer is polled in a pass of its own.
        let mut from = 0;
        let mut first_pass = true;
        // A timer armed in this poll was polled then: polled again at
        // once, a sleep on the virtual clock would move the clock before
        // the other tasks' sleeps of this round are registered.
        let mut armed = false;
        loop {
            let mut i = if first_pass { 0 } else { from + 1 };
            // The first attempt (index 0 while it runs), then the hedges.
            while i < 1 + hedges.len() {
                let on_primary = i == 0;
                if on_primary && !primary_running {
                    i += 1;
                    continue;
                }
                let running = usize::from(primary_running) + hedges.len();
                call.set_others(u32::try_from(running - 1).unwrap_or(u32::MAX));
                let progress = match on_primary {
                    true => step_lane(call, op, primary.as_mut(), cx),
                    false => poll_lane(call, op, hedges[i - 1].as_mut(), cx),
                };
                let mut next = None;
                let done = match progress {
                    Progress::Pending { started } => {
                        // An attempt started (attempts are numbered as they
                        // start: it is the latest): the next hedge is timed
                        // from now.
                        if started {
                            next = arm(call, timer.as_mut(), &mut armed, cx, HedgeSince::Started);
                        }
                        false
                    }
                    Progress::Decided(ended) => return Poll::Ready(ended),
                    Progress::Failed(failure) => {
                        last = Some(failure);
                        if let Some(lane) = call.hedge(HedgeTrigger::Failure) {
                            timer.set(None);
                            next = Some(lane);
                        }
                        true
                    }
                    // A refused hedge did not start: the next one is timed
                    // from the refusal, never tried at once.
                    Progress::Refused(r) if running > 1 => {
                        call.hedge_refused(r);
                        next = arm(call, timer.as_mut(), &mut armed, cx, HedgeSince::Refused);
                        true
                    }
                    Progress::Refused(r) => return Poll::Ready(call.refused(r)),
                };
                match (done, on_primary) {
                    (false, _) => i += 1,
                    (true, true) => {
                        primary_running = false;
                        primary.set(Step::Start);
                        i += 1;
                    }
                    (true, false) => drop(hedges.remove(i - 1)),
                }
                // Polled next.
                if let Some(lane) = next {
                    hedges.insert(i.max(1) - 1, Box::pin(HedgedLane::new(lane)));
                    i = i.max(1);
                }
            }
            first_pass = false;
            from = hedges.len();
            if let Some(sleep) = timer.as_mut().as_pin_mut().filter(|_| !armed) {
                if sleep.poll(cx).is_ready() {
                    timer.set(None);
                    if let Some(lane) = call.hedge(HedgeTrigger::Delay) {
                        hedges.push(Box::pin(HedgedLane::new(lane)));
                    }
                }
            }
            if !primary_running && hedges.is_empty() {
                let failure = last
                    .take()
                    .expect("an attempt that ended without deciding failed");
                return Poll::Ready(call.hedges_exhausted(failure));
            }
            if hedges.len() == from {
                return Poll::Pending;
            }
        }
    })
    .await;
    // The losers are dropped before the call's outcome is recorded and the
    // fallback runs: they give back what they hold, without an outcome.
    drop(hedges);
    if primary_running {
        primary.set(Step::Start);
    }
    call.hedging_decided();
    let mut ended = decided;
    let result = loop {
        match ended {
            Ended::Done(result) => break result,
            Ended::Record(record, pending) => {
                let answer = call.store().record_async(record).await;
                ended = call.recorded(pending, answer);
            }
            Ended::Retry(_) | Ended::Hedge(_) => unreachable!("a decided hedged call"),
        }
    };
    if !end {
        return result;
    }
    match call.finish(result) {
        Finish::Done(result) => result,
        Finish::Fallback(fallback) => {
            let result = fallback.await;
            call.fell_back(result)
        }
    }
}
