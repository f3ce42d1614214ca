//! How the layer judges attempts, and which requests it can repeat.

use std::fmt;

use crate::classify::Verdict;

/// One failed attempt of a [`PipelineService`](super::PipelineService) as its pipeline sees it: the
/// verdict of the layer's classifiers. The failed response or error itself
/// goes back to the caller, not here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptFailure {
    pub(super) verdict: Verdict,
}

impl AttemptFailure {
    /// The verdict the layer gave the attempt.
    pub fn verdict(&self) -> Verdict {
        self.verdict
    }
}

impl fmt::Display for AttemptFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "attempt failed ({:?})", self.verdict.kind())
    }
}

impl std::error::Error for AttemptFailure {}

/// Judges the responses of the inner service: `None` for a success, a
/// [`Verdict`] for a failed attempt. Implemented by every
/// `Fn(&Response) -> Option<Verdict>`, such as
/// `seawall::http::classify_response` (feature `http`).
pub trait ClassifyResponse<Response> {
    /// The verdict on one response, `None` when it is a success.
    fn classify_response(&self, response: &Response) -> Option<Verdict>;
}

impl<Response, F> ClassifyResponse<Response> for F
where
    F: Fn(&Response) -> Option<Verdict>,
{
    fn classify_response(&self, response: &Response) -> Option<Verdict> {
        self(response)
    }
}

/// Judges the errors of the inner service. Implemented by every
/// `Fn(&Error) -> Verdict`.
pub trait ClassifyError<E> {
    /// The verdict on one error.
    fn classify_error(&self, error: &E) -> Verdict;
}

impl<E, F> ClassifyError<E> for F
where
    F: Fn(&E) -> Verdict,
{
    fn classify_error(&self, error: &E) -> Verdict {
        self(error)
    }
}

/// The default response classifier: every response is a success.
#[derive(Debug, Clone, Copy, Default)]
pub struct SuccessfulResponses;

impl<Response> ClassifyResponse<Response> for SuccessfulResponses {
    fn classify_response(&self, _: &Response) -> Option<Verdict> {
        None
    }
}

/// The default error classifier: every error of the inner service is a
/// retryable failure.
#[derive(Debug, Clone, Copy, Default)]
pub struct RetryableErrors;

impl<E> ClassifyError<E> for RetryableErrors {
    fn classify_error(&self, _: &E) -> Verdict {
        Verdict::retry()
    }
}

/// A request that a [`PipelineService`](super::PipelineService) can send
/// once per attempt: every `Clone` type.
///
/// A request type that is not `Clone` is refused at compile time, with a
/// message naming the fix wherever a stack asks for a `Service<Request>`
/// (a server, a client, a function of yours):
///
/// ```compile_fail,E0277
/// use std::convert::Infallible;
/// use seawall::tower::PipelineLayer;
/// use seawall::Pipeline;
/// use tower::{service_fn, Layer, Service};
///
/// struct Upload(Vec<u8>); // not Clone
///
/// fn send_uploads<S: Service<Upload>>(_service: S) {}
///
/// let layer = PipelineLayer::new(Pipeline::builder("uploads")).unwrap();
/// send_uploads(layer.layer(service_fn(|_: Upload| async { Ok::<_, Infallible>(()) })));
/// ```
///
/// ```text
/// error[E0277]: `Upload` is not `Clone`, so a seawall `PipelineService` cannot send it once per attempt
/// ```
///
/// A method call on the service itself (`service.call(upload)`,
/// `service.oneshot(upload)`) is reported by rustc's method lookup instead,
/// as "the method exists but its trait bounds were not satisfied".
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not `Clone`, so a seawall `PipelineService` cannot send it once per attempt",
    label = "requests sent through a `PipelineLayer` must be `Clone`",
    note = "every attempt sends its own copy of the request: derive or implement `Clone` for the request type (for `http::Request<B>`, use a body that is `Clone`, such as `http_body_util::Full<Bytes>` or `String`), or, for a pipeline without retry or hedging, make the layer with `PipelineLayer::single_attempt`"
)]
pub trait RetryableRequest: Sized {
    /// The copy sent by one attempt.
    fn clone_request(&self) -> Self;
}

#[diagnostic::do_not_recommend]
impl<T: Clone> RetryableRequest for T {
    fn clone_request(&self) -> Self {
        self.clone()
    }
}

/// How a [`PipelineLayer`](super::PipelineLayer) made with
/// [`PipelineLayer::new`](super::PipelineLayer::new) sends requests: each
/// attempt sends a clone ([`RetryableRequest`]), so the pipeline may retry
/// or hedge.
#[derive(Debug, Clone, Copy, Default)]
pub struct CloneRequests;

/// How a [`PipelineLayer`](super::PipelineLayer) made with
/// [`PipelineLayer::single_attempt`](super::PipelineLayer::single_attempt)
/// sends requests: the request is moved into the call's one attempt, so it
/// need not be `Clone` (a server's `http::Request<hyper::body::Incoming>`,
/// say), and the pipeline makes one attempt per call (no retry, no
/// hedging).
#[derive(Debug, Clone, Copy, Default)]
pub struct SingleAttempt;
