//! The error of a layered service.

use std::fmt;

use crate::error::{Error, Rejection};

/// The error of a [`PipelineService`](super::PipelineService); `E` is the inner service's error.
#[derive(Debug)]
#[non_exhaustive]
pub enum ServiceError<E> {
    /// The inner service failed in `poll_ready`: it cannot take requests.
    NotReady(E),
    /// The call through the pipeline failed: the inner service's error
    /// (typed, in [`Error::Operation`] or [`Error::RetryExhausted`]), a
    /// timeout, a rejection by a policy, or a store failure.
    Pipeline(Error<E>),
}

impl<E> ServiceError<E> {
    /// The inner service's error, if this error carries one.
    pub fn inner_error(&self) -> Option<&E> {
        match self {
            ServiceError::NotReady(e) => Some(e),
            ServiceError::Pipeline(e) => e.operation_error(),
        }
    }

    /// Consumes the error and returns the inner service's error, if any.
    pub fn into_inner_error(self) -> Option<E> {
        match self {
            ServiceError::NotReady(e) => Some(e),
            ServiceError::Pipeline(e) => e.into_operation_error(),
        }
    }

    /// The pipeline's error, unless the inner service failed in `poll_ready`.
    pub fn pipeline_error(&self) -> Option<&Error<E>> {
        match self {
            ServiceError::Pipeline(e) => Some(e),
            ServiceError::NotReady(_) => None,
        }
    }

    /// The rejection, when a policy refused the call.
    pub fn rejection(&self) -> Option<&Rejection> {
        self.pipeline_error().and_then(Error::rejection)
    }

    /// `true` when a policy refused the call (the inner service was not
    /// called for it).
    pub fn is_rejected(&self) -> bool {
        self.rejection().is_some()
    }

    /// `true` when the call or an attempt timed out.
    pub fn is_timeout(&self) -> bool {
        self.pipeline_error().is_some_and(Error::is_timeout)
    }
}

impl<E> From<Error<E>> for ServiceError<E> {
    fn from(e: Error<E>) -> Self {
        ServiceError::Pipeline(e)
    }
}

impl<E: fmt::Display> fmt::Display for ServiceError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServiceError::NotReady(e) => write!(f, "inner service not ready: {e}"),
            ServiceError::Pipeline(e) => e.fmt(f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for ServiceError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ServiceError::NotReady(e) => Some(e),
            ServiceError::Pipeline(e) => e.source(),
        }
    }
}
