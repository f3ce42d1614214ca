//! What a layered service answers when the call through its pipeline fails.

use super::ServiceError;

/// Turns the failure of a call into the service's answer, and says which
/// error the service returns. Set on a layer with
/// [`PipelineLayer::fallback`](super::PipelineLayer::fallback) (a closure)
/// or [`PipelineLayer::error_responses`](super::PipelineLayer::error_responses)
/// (HTTP statuses, feature `http`).
pub trait Fallback<Response, E> {
    /// The error of the layered service.
    type Error;
    /// The service's error when the inner service fails in `poll_ready`.
    fn not_ready(&self, error: E) -> Self::Error;
    /// The service's answer when the call through the pipeline failed.
    ///
    /// # Errors
    /// The error the service returns for `error`.
    fn fall_back(&self, error: ServiceError<E>) -> Result<Response, Self::Error>;
}

/// The default: no fallback, the service's error is [`ServiceError`].
#[derive(Debug, Clone, Copy, Default)]
pub struct NoFallback;

impl<Response, E> Fallback<Response, E> for NoFallback {
    type Error = ServiceError<E>;

    fn not_ready(&self, error: E) -> ServiceError<E> {
        ServiceError::NotReady(error)
    }

    fn fall_back(&self, error: ServiceError<E>) -> Result<Response, ServiceError<E>> {
        Err(error)
    }
}

/// A fallback made of a closure `Fn(ServiceError<E>) -> Response`, made by
/// [`PipelineLayer::fallback`](super::PipelineLayer::fallback): every
/// failed call gets the closure's response, and the service's error is the
/// inner service's own (returned only when it fails in `poll_ready`).
#[derive(Debug, Clone, Copy)]
pub struct RespondWith<F>(pub(super) F);

impl<Response, E, F> Fallback<Response, E> for RespondWith<F>
where
    F: Fn(ServiceError<E>) -> Response,
{
    type Error = E;

    fn not_ready(&self, error: E) -> E {
        error
    }

    fn fall_back(&self, error: ServiceError<E>) -> Result<Response, E> {
        Ok((self.0)(error))
    }
}
