//! The span `seawall.call` in which each attempt of the operation runs
//! (feature `tracing`), so that the operation's own events carry the
//! pipeline, the partition and the attempt.
//!
//! The public entry points check once per call whether a subscriber wants
//! the span (a cached interest); only then do they wrap the operation, so a
//! call that nobody traces runs the operation as given.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use tracing::instrument::{Instrument, Instrumented};
use tracing::Span;

use crate::context::{Context, PartitionKey};

/// `true` when a subscriber wants the span now.
#[inline(always)]
pub(super) fn wanted() -> bool {
    tracing::span_enabled!(
        target: "seawall",
        tracing::Level::INFO,
        pipeline,
        partition,
        attempt
    )
}

/// The span of one attempt.
fn span(pipeline: &'static str, partition: Option<&PartitionKey>, attempt: u32) -> Span {
    tracing::info_span!(
        target: "seawall",
        "seawall.call",
        pipeline,
        partition = partition.map(tracing::field::display),
        attempt
    )
}

/// `op`, each call of which runs inside the span of its attempt.
pub(super) fn sync_op<'a, T, E, Op>(
    pipeline: &'static str,
    partition: Option<&'a PartitionKey>,
    mut op: Op,
) -> impl FnMut(Context) -> Result<T, E> + use<'a, T, E, Op>
where
    Op: FnMut(Context) -> Result<T, E>,
{
    move |ctx| span(pipeline, partition, ctx.attempt()).in_scope(|| op(ctx))
}

/// `op`, each future of which (its creation included) runs inside the span
/// of its attempt.
pub(super) fn async_op<'a, Fut, Op>(
    pipeline: &'static str,
    partition: Option<&'a PartitionKey>,
    mut op: Op,
) -> impl FnMut(Context) -> Instrumented<Fut> + use<'a, Fut, Op>
where
    Fut: Future,
    Op: FnMut(Context) -> Fut,
{
    move |ctx| {
        let span = span(pipeline, partition, ctx.attempt());
        span.in_scope(|| op(ctx)).instrument(span)
    }
}

pin_project_lite::pin_project! {
    /// The future of a call, traced or not.
    #[project = EitherProj]
    pub(super) enum Either<Plain, Traced> {
        /// Nobody wanted the span.
        Plain { #[pin] future: Plain },
        /// The operation runs in spans.
        Traced { #[pin] future: Traced },
    }
}

impl<O, Plain, Traced> Future for Either<Plain, Traced>
where
    Plain: Future<Output = O>,
    Traced: Future<Output = O>,
{
    type Output = O;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<O> {
        match self.project() {
            EitherProj::Plain { future } => future.poll(cx),
            EitherProj::Traced { future } => future.poll(cx),
        }
    }
}
