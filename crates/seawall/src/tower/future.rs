//! The response future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use super::ServiceError;

/// The future of a [`PipelineService`](super::PipelineService) call.
pub struct ResponseFuture<T, E> {
    inner: Pin<Box<dyn Future<Output = Result<T, ServiceError<E>>> + Send>>,
}

impl<T, E> ResponseFuture<T, E> {
    pub(super) fn new(
        future: impl Future<Output = Result<T, ServiceError<E>>> + Send + 'static,
    ) -> Self {
        ResponseFuture {
            inner: Box::pin(future),
        }
    }
}

impl<T, E> Future for ResponseFuture<T, E> {
    type Output = Result<T, ServiceError<E>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<T, E> fmt::Debug for ResponseFuture<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
