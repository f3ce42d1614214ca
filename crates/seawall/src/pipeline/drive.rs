//! The two drivers of the call engine ([`Call`]): blocking and async. Each
//! runs the operation, sleeps and asks a remote store where the engine says
//! so; every decision is the engine's.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use super::engine::{Admit, Call, Driver, Ended, Finish};
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

impl<K: Kind> Pipeline<K> {
    /// Runs a blocking call.
    #[inline(always)]
    pub(crate) fn drive_sync<T, E, Op>(
        &self,
        partition: Option<&PartitionKey>,
        mut op: Op,
    ) -> Result<T, Error<E>>
    where
        K: HandlesSync<T, E>,
        Op: FnMut(Context) -> Result<T, E>,
    {
        let mut call = Call::start(self, partition, Driver::Sync);
        let result = 'call: loop {
            let mut admit = call.admit();
            let ctx = loop {
                match admit {
                    Admit::Run(ctx) => break ctx,
                    Admit::Ask(request) => admit = call.admitted(call.store().admit(&request)),
                    Admit::Wait(wait) => {
                        call.clock().sleep_blocking(wait);
                        admit = call.waited();
                    }
                    Admit::Refused(r) => break 'call Err(call.refused(r)),
                }
            };
            let mut ended = call.ended(Some(op(ctx)), None);
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
        };
        match call.finish(result) {
            Finish::Done(result) => result,
            // `HandlesSync` kinds never have an async fallback.
            Finish::Fallback(_) => unreachable!("a sync pipeline kind returned an async fallback"),
        }
    }

    /// Runs an async call.
    pub(crate) async fn drive_async<T, E, Op, Fut>(
        &self,
        partition: Option<&PartitionKey>,
        mut op: Op,
    ) -> Result<T, Error<E>>
    where
        K: Handles<T, E>,
        Op: FnMut(Context) -> Fut,
        Fut: Future,
        Fut::Output: AttemptOutput<T, E>,
    {
        let mut call = Call::start(self, partition, Driver::Async);
        let result = 'call: loop {
            let mut admit = call.admit();
            let ctx = loop {
                match admit {
                    Admit::Run(ctx) => break ctx,
                    Admit::Ask(request) => {
                        let answer = call.store().admit_async(request).await;
                        admit = call.admitted(answer);
                    }
                    Admit::Wait(wait) => {
                        call.clock().sleep(wait).await;
                        admit = call.waited();
                    }
                    Admit::Refused(r) => break 'call Err(call.refused(r)),
                }
            };
            let deadline = call.deadline();
            let output = WithDeadline::new(op(ctx), call.clock(), deadline).await;
            let mut ended = match output.map(AttemptOutput::split) {
                Some((result, judged)) => call.ended(Some(result), judged),
                None => call.ended(None, None),
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
                            // Each attempt after the first is a point where
                            // the task can be cancelled and others can run.
                            YieldNow(false).await;
                        } else {
                            call.clock().sleep(delay).await;
                        }
                        call.retry();
                        break;
                    }
                }
            }
        };
        match call.finish(result) {
            Finish::Done(result) => result,
            Finish::Fallback(fallback) => {
                let result = fallback.await;
                call.fell_back(result)
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
