//! The two drivers of the call engine ([`Call`]): blocking and async. Each
//! runs the operation, sleeps and asks a remote store where the engine says
//! so; every decision is the engine's.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use super::engine::{Admit, Call, Driver, Ended, Finish, First, Owned, Quick};
use super::kind::{Handles, HandlesSync};
use super::{Kind, Pipeline};
use crate::classify::Verdict;
use crate::context::{Context, PartitionKey};
use crate::error::Error;
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

/// Where the general loop takes a call over from the ordinary first steps.
pub(super) enum From<T, E> {
    /// The ordinary admission did not decide.
    Admission(Quick),
    /// The attempt ended, not in the ordinary way.
    Ended(Option<Result<T, E>>, Option<Verdict>),
}

impl<K: Kind> Pipeline<K> {
    /// Runs a blocking call. The ordinary steps (an admission decided in
    /// place, a success that nobody watches) run here; anything else in
    /// the general loop, from where the call stands. Each admission takes
    /// `weight` rate-limit permits; a weighted call (not 1) takes the
    /// general path.
    #[inline(always)]
    pub(crate) fn drive_sync_weighted<T, E, Op>(
        &self,
        partition: Option<&PartitionKey>,
        weight: u32,
        mut op: Op,
    ) -> Result<T, Error<E>>
    where
        K: HandlesSync<T, E>,
        Op: FnMut(Context) -> Result<T, E>,
    {
        let shared = &*self.shared;
        if shared.plan.bare
            && partition.is_none()
            && !shared.listeners.enabled()
            && !shared.chaos_may_inject()
        {
            return match op(Context::bare(shared.name)) {
                Ok(v) => Ok(v),
                Err(e) => {
                    let first = First::after_bare(self);
                    let mut held = first.hold();
                    let call = first.into_call(Driver::Sync, &mut held);
                    sync_loop(call, op, Some(From::Ended(Some(Err(e)), None)))
                }
            };
        }
        let first = (weight == 1)
            .then(|| First::start(self, partition))
            .flatten();
        let Some(mut first) = first else {
            let call = Owned(Call::start(self, partition, Driver::Sync).weighted(weight));
            return sync_loop(call, op, None);
        };
        // `held` holds the attempt's permit, given back on a panic.
        let mut held = first.hold();
        match first.admit(&mut held) {
            Ok(ctx) => {
                let result = op(ctx);
                match first.ended(result, &mut held, Driver::Sync) {
                    // Nobody listens on the ordinary path: the call is over.
                    Ok(v) => Ok(v),
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

    /// Runs an async call; see [`drive_sync_weighted`](Self::drive_sync_weighted).
    #[inline(always)]
    #[cfg_attr(not(feature = "reqwest"), allow(dead_code))]
    pub(crate) fn drive_async<'a, T, E, Op, Fut>(
        &'a self,
        partition: Option<&'a PartitionKey>,
        op: Op,
    ) -> impl Future<Output = Result<T, Error<E>>> + use<'a, K, T, E, Op, Fut>
    where
        K: Handles<T, E>,
        Op: FnMut(Context) -> Fut,
        Fut: Future,
        Fut::Output: AttemptOutput<T, E>,
    {
        self.drive_async_weighted(partition, 1, op)
    }

    /// [`drive_async`](Self::drive_async) of a call taking `weight`
    /// rate-limit permits per admission (a weighted call takes the general
    /// path).
    pub(crate) async fn drive_async_weighted<T, E, Op, Fut>(
        &self,
        partition: Option<&PartitionKey>,
        weight: u32,
        mut op: Op,
    ) -> Result<T, Error<E>>
    where
        K: Handles<T, E>,
        Op: FnMut(Context) -> Fut,
        Fut: Future,
        Fut::Output: AttemptOutput<T, E>,
    {
        let shared = &*self.shared;
        if shared.plan.bare
            && partition.is_none()
            && !shared.listeners.enabled()
            && !shared.chaos_may_inject()
        {
            let (result, judged) = op(Context::bare(shared.name)).await.split();
            return match result {
                Ok(v) => Ok(v),
                Err(e) => {
                    let first = First::after_bare(self);
                    let mut held = first.hold();
                    let call = first.into_call(Driver::Async, &mut held);
                    async_loop(call, op, Some(From::Ended(Some(Err(e)), judged))).await
                }
            };
        }
        let first = (weight == 1)
            .then(|| First::start(self, partition))
            .flatten();
        let Some(mut first) = first else {
            let call = Owned(Call::start(self, partition, Driver::Async).weighted(weight));
            return async_loop(call, op, None).await;
        };
        let mut held = first.hold();
        let from = match first.admit(&mut held) {
            Ok(ctx) => {
                let deadline = first.deadline();
                let output = WithDeadline::new(op(ctx), first.clock(), deadline).await;
                match output {
                    Some(output) => {
                        let (result, judged) = output.split();
                        match first.ended(result, &mut held, Driver::Async) {
                            // Nobody listens on the ordinary path: the call
                            // is over.
                            Ok(v) => return Ok(v),
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
                        Admit::Run(ctx) => break ctx,
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
                        Admit::Refused(r) => break 'call Err(call.refused(r)),
                    }
                };
                // A panic drops the call, which gives its permit back.
                if call.has_custom_attempt() {
                    let (result, judged) = super::chain::attempt_sync(call, ctx, &mut op);
                    call.ended_through(result, judged)
                } else {
                    let result = operate_sync(call, ctx, &mut op);
                    call.ended(Some(result), None)
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
    let injection = call.inject::<T, E>(&ctx);
    let clock = call.clock();
    async move {
        if !injection.delay.is_zero() {
            clock.sleep(injection.delay).await;
        }
        match injection.result {
            Some(result) => (result, None),
            None => op(ctx).await.split(),
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
                        Admit::Run(ctx) => break ctx,
                        Admit::Ask(request) => {
                            let answer = call.store().admit_async(request).await;
                            admit = call.admitted(answer);
                        }
                        Admit::AskReserving(request, reserve) => {
                            let answer = call.store().admit_reserving_async(request, reserve).await;
                            admit = call.admitted_reserving(answer);
                        }
                        Admit::Wait(wait) => {
                            call.clock().sleep(wait).await;
                            admit = call.waited();
                        }
                        Admit::Refused(r) => break 'call Err(call.refused(r)),
                    }
                };
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
