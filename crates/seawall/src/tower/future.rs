//! The response future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

/// The future of a [`PipelineService`](super::PipelineService) call: the
/// response, or the service's error `Err` ([`ServiceError`](super::ServiceError) unless the
/// layer has a [`Fallback`](super::Fallback) of another error type).
pub struct ResponseFuture<T, Err> {
    inner: Pin<Box<dyn Future<Output = Result<T, Err>> + Send>>,
}

impl<T, Err> ResponseFuture<T, Err> {
    pub(super) fn new(future: impl Future<Output = Result<T, Err>> + Send + 'static) -> Self {
        ResponseFuture {
            inner: Box::pin(future),
        }
    }
}

impl<T, Err> Future for ResponseFuture<T, Err> {
    type Output = Result<T, Err>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<T, Err> fmt::Debug for ResponseFuture<T, Err> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
