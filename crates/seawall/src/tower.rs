//! Tower integration (feature `tower`): [`PipelineLayer`] puts any
//! `tower::Service` behind a pipeline, so hyper, tonic or axum client stacks
//! get retry, circuit breaker, timeout, bulkhead, rate limiter and cooldown
//! from one layer.
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use seawall::tower::PipelineLayer;
//! use seawall::{CircuitBreaker, Pipeline, Retry};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = PipelineLayer::new(
//!     Pipeline::builder("inventory-api")
//!         .retry(Retry::exponential(Duration::from_millis(50)).max_attempts(3))
//!         .circuit_breaker(CircuitBreaker::consecutive_failures(5))
//!         .timeout(Duration::from_secs(2)),
//! )?
//! .classify_response(seawall::http::classify_response);
//!
//! let backend = service_fn(|request: http::Request<String>| async move {
//!     Ok::<_, Infallible>(http::Response::new(format!("stock for {}", request.uri())))
//! });
//! let client = ServiceBuilder::new().layer(layer).service(backend);
//!
//! let request = http::Request::builder().uri("/items/42").body(String::new())?;
//! let response = client.oneshot(request).await?;
//! assert_eq!(response.body(), "stock for /items/42");
//! # Ok(())
//! # }
//! ```
//!
//! # How a call runs
//! Each attempt clones the request ([`RetryableRequest`]: a request type
//! that is not `Clone` is a compile error naming the fix) and calls the inner
//! service through the pipeline, so the pipeline's policies guard every
//! attempt. The first attempt uses the service that `poll_ready` made ready
//! (the ready service is moved into the call's future and replaced by a
//! clone, as tower's own middleware do, so readiness is never lost on clone);
//! later attempts wait for the inner service to be ready again first.
//!
//! # Classification
//! The layer, not the pipeline, judges each attempt:
//! - an error of the inner service with
//!   [`classify_error`](PipelineLayer::classify_error) (default: every
//!   error is a retryable failure, [`RetryableErrors`]);
//! - a response with
//!   [`classify_response`](PipelineLayer::classify_response) (default:
//!   every response is a success, [`SuccessfulResponses`]); `None` means
//!   success, a [`Verdict`] makes the response a failed attempt, e.g. a 503,
//!   whose retry-after hint delays the retry and opens the cooldown.
//!
//! # What the caller gets
//! - The response of the last attempt, **also when that response was judged
//!   a failure** and no retry is left (or its verdict forbids one): the layer
//!   never turns a response into an error, so an HTTP client sees the last
//!   503 with its headers and body, as it would without the layer.
//! - [`ServiceError::Pipeline`] when the inner service failed (its error
//!   stays typed inside [`Error::Operation`] or [`Error::RetryExhausted`]),
//!   an attempt or the call timed out, a policy rejected the call (the inner
//!   service was not called for it) or the state store failed.
//! - [`ServiceError::NotReady`] when the inner service fails in `poll_ready`.
//!
//! The response future is `Send` (inner service, its future, request,
//! response and error must be `Send + 'static`).

use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context as TaskContext, Poll};

use tower_layer::Layer;
use tower_service::Service;

use crate::classify::Verdict;
use crate::context::Context;
use crate::error::{ConfigError, Error, Rejection};
use crate::pipeline::{ErrorType, Pipeline, PipelineBuilder};

/// The pipeline inside a [`PipelineLayer`]: the policies of the builder it
/// was made from, judging [`AttemptFailure`]s.
pub type LayerPipeline = Pipeline<ErrorType<AttemptFailure>>;

/// One failed attempt of a [`PipelineService`] as its pipeline sees it: the
/// verdict of the layer's classifiers. The failed response or error itself
/// goes back to the caller, not here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptFailure {
    verdict: Verdict,
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

/// A request that a [`PipelineService`] can send once per attempt:
/// every `Clone` type.
///
/// A request type that is not `Clone` is refused at compile time:
///
/// ```compile_fail,E0277
/// use std::convert::Infallible;
/// use seawall::tower::PipelineLayer;
/// use seawall::Pipeline;
/// use tower::{service_fn, Layer, ServiceExt};
///
/// struct Upload(Vec<u8>); // not Clone
///
/// # async fn demo() {
/// let layer = PipelineLayer::new(Pipeline::builder("uploads")).unwrap();
/// let service = layer.layer(service_fn(|_: Upload| async { Ok::<_, Infallible>(()) }));
/// let _ = service.oneshot(Upload(vec![1, 2, 3])).await;
/// # }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not `Clone`, so a seawall `PipelineService` cannot send it once per attempt",
    label = "requests sent through a `PipelineLayer` must be `Clone`",
    note = "every attempt sends its own copy of the request: derive or implement `Clone` for the request type (for `http::Request<B>`, use a body that is `Clone`, such as `http_body_util::Full<Bytes>` or `String`)"
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

/// A `tower::Layer` running every request of the wrapped service through a
/// pipeline; see the [module docs](self).
///
/// The layer builds its pipeline from a [`PipelineBuilder`] without a
/// classifier or fallback: classification belongs to the layer
/// ([`classify_response`](Self::classify_response),
/// [`classify_error`](Self::classify_error)), which sees both responses and
/// errors. Every service made by one layer shares its pipeline; pipelines of
/// the same name in the same store share their circuit, bulkhead, rate limit
/// and cooldown anyway.
///
/// # Default
/// Every response is a success ([`SuccessfulResponses`]), every error a
/// retryable failure ([`RetryableErrors`]).
pub struct PipelineLayer<R = SuccessfulResponses, E = RetryableErrors> {
    pipeline: LayerPipeline,
    classify_response: R,
    classify_error: E,
}

impl PipelineLayer {
    /// Builds the pipeline from `builder` and makes a layer of it.
    ///
    /// # Errors
    /// The [`ConfigError`] of [`PipelineBuilder::build`].
    pub fn new(builder: PipelineBuilder) -> Result<Self, ConfigError> {
        let pipeline = builder
            .classify(|failure: &AttemptFailure| failure.verdict)
            .build()?;
        Ok(PipelineLayer {
            pipeline,
            classify_response: SuccessfulResponses,
            classify_error: RetryableErrors,
        })
    }
}

impl<R, E> PipelineLayer<R, E> {
    /// Judges the inner service's responses with `classify`: `None` for a
    /// success, a [`Verdict`] for a failed attempt (retried when the verdict
    /// says so, recorded by the circuit breaker, its retry-after hint
    /// honoured). When no retry follows, the caller still gets the response.
    ///
    /// ```
    /// use seawall::tower::PipelineLayer;
    /// use seawall::{Pipeline, Verdict};
    ///
    /// let layer = PipelineLayer::new(Pipeline::builder("search"))?
    ///     .classify_response(|response: &http::Response<String>| {
    ///         response.body().contains("try again").then(Verdict::retry)
    ///     });
    /// # Ok::<_, seawall::ConfigError>(())
    /// ```
    pub fn classify_response<R2>(self, classify: R2) -> PipelineLayer<R2, E> {
        PipelineLayer {
            pipeline: self.pipeline,
            classify_response: classify,
            classify_error: self.classify_error,
        }
    }

    /// Judges the inner service's errors with `classify` (default: every
    /// error is a retryable failure).
    ///
    /// ```
    /// use seawall::tower::PipelineLayer;
    /// use seawall::{Pipeline, Verdict};
    ///
    /// let layer = PipelineLayer::new(Pipeline::builder("files"))?
    ///     .classify_error(|e: &std::io::Error| match e.kind() {
    ///         std::io::ErrorKind::NotFound => Verdict::abort(),
    ///         _ => Verdict::retry(),
    ///     });
    /// # Ok::<_, seawall::ConfigError>(())
    /// ```
    pub fn classify_error<E2>(self, classify: E2) -> PipelineLayer<R, E2> {
        PipelineLayer {
            pipeline: self.pipeline,
            classify_response: self.classify_response,
            classify_error: classify,
        }
    }

    /// The layer's pipeline: its circuit state, metrics, manual controls.
    pub fn pipeline(&self) -> &LayerPipeline {
        &self.pipeline
    }
}

impl<R: Clone, E: Clone> Clone for PipelineLayer<R, E> {
    fn clone(&self) -> Self {
        PipelineLayer {
            pipeline: self.pipeline.clone(),
            classify_response: self.classify_response.clone(),
            classify_error: self.classify_error.clone(),
        }
    }
}

impl<R, E> fmt::Debug for PipelineLayer<R, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PipelineLayer")
            .field("pipeline", &self.pipeline)
            .finish_non_exhaustive()
    }
}

impl<S, R: Clone, E: Clone> Layer<S> for PipelineLayer<R, E> {
    type Service = PipelineService<S, R, E>;

    fn layer(&self, inner: S) -> Self::Service {
        PipelineService {
            inner,
            pipeline: self.pipeline.clone(),
            classifiers: Arc::new(Classifiers {
                response: self.classify_response.clone(),
                error: self.classify_error.clone(),
            }),
        }
    }
}

struct Classifiers<R, E> {
    response: R,
    error: E,
}

/// A service behind a pipeline, made by [`PipelineLayer`]. Cloning it
/// clones the inner service (not ready, as tower expects) and shares the
/// pipeline.
pub struct PipelineService<S, R = SuccessfulResponses, E = RetryableErrors> {
    inner: S,
    pipeline: LayerPipeline,
    classifiers: Arc<Classifiers<R, E>>,
}

impl<S, R, E> PipelineService<S, R, E> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes the service and returns the inner one.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The service's pipeline.
    pub fn pipeline(&self) -> &LayerPipeline {
        &self.pipeline
    }
}

impl<S: Clone, R, E> Clone for PipelineService<S, R, E> {
    fn clone(&self) -> Self {
        PipelineService {
            inner: self.inner.clone(),
            pipeline: self.pipeline.clone(),
            classifiers: Arc::clone(&self.classifiers),
        }
    }
}

impl<S: fmt::Debug, R, E> fmt::Debug for PipelineService<S, R, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PipelineService")
            .field("inner", &self.inner)
            .field("pipeline", &self.pipeline)
            .finish_non_exhaustive()
    }
}

impl<S, Req, R, E> Service<Req> for PipelineService<S, R, E>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
    Req: RetryableRequest + Send + 'static,
    R: ClassifyResponse<S::Response> + Send + Sync + 'static,
    E: ClassifyError<S::Error> + Send + Sync + 'static,
{
    type Response = S::Response;
    type Error = ServiceError<S::Error>;
    type Future = ResponseFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(ServiceError::NotReady)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        // The ready service goes into the future; `self` keeps a clone,
        // which its caller must drive to readiness before the next call.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        let pipeline = self.pipeline.clone();
        let classifiers = Arc::clone(&self.classifiers);
        ResponseFuture {
            inner: Box::pin(call_through(pipeline, classifiers, ready, request)),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The inner service, taken by one attempt and put back when the attempt
/// is done with it (or dropped, e.g. by a timeout).
struct Lease<'a, S> {
    slot: &'a Mutex<Option<S>>,
    service: Option<S>,
}

impl<'a, S> Lease<'a, S> {
    fn take(slot: &'a Mutex<Option<S>>) -> Self {
        let service = lock(slot).take();
        Lease { slot, service }
    }

    fn service(&mut self) -> &mut S {
        self.service
            .as_mut()
            .expect("attempts run one at a time and each gives the service back")
    }
}

impl<S> Drop for Lease<'_, S> {
    fn drop(&mut self) {
        if let Some(s) = self.service.take() {
            *lock(self.slot) = Some(s);
        }
    }
}

/// Keeps what a failed attempt produced and tells the pipeline its verdict.
fn failed<T, E>(
    last: &Mutex<Option<Result<T, E>>>,
    verdict: Verdict,
    outcome: Result<T, E>,
) -> AttemptFailure {
    *lock(last) = Some(outcome);
    AttemptFailure { verdict }
}

async fn call_through<S, Req, R, E>(
    pipeline: LayerPipeline,
    classifiers: Arc<Classifiers<R, E>>,
    service: S,
    request: Req,
) -> Result<S::Response, ServiceError<S::Error>>
where
    S: Service<Req>,
    Req: RetryableRequest,
    R: ClassifyResponse<S::Response>,
    E: ClassifyError<S::Error>,
{
    let service = Mutex::new(Some(service));
    let last = Mutex::new(None);
    let result = {
        let (service, last, classifiers) = (&service, &last, &*classifiers);
        pipeline
            .run(move |ctx: Context| {
                let request = request.clone_request();
                async move {
                    let mut lease = Lease::take(service);
                    if !ctx.is_first_attempt() {
                        if let Err(e) = poll_fn(|cx| lease.service().poll_ready(cx)).await {
                            let verdict = classifiers.error.classify_error(&e);
                            return Err(failed(last, verdict, Err(e)));
                        }
                    }
                    let future = lease.service().call(request);
                    drop(lease);
                    match future.await {
                        Ok(response) => match classifiers.response.classify_response(&response) {
                            None => Ok(response),
                            Some(verdict) => Err(failed(last, verdict, Ok(response))),
                        },
                        Err(e) => {
                            let verdict = classifiers.error.classify_error(&e);
                            Err(failed(last, verdict, Err(e)))
                        }
                    }
                }
            })
            .await
    };
    let last = lock(&last).take();
    settle(result, last)
}

/// Turns the pipeline's result back into the inner service's types: the
/// last failed attempt's response or error replaces its verdict.
fn settle<T, E>(
    result: Result<T, Error<AttemptFailure>>,
    last: Option<Result<T, E>>,
) -> Result<T, ServiceError<E>> {
    let error = match result {
        Ok(response) => return Ok(response),
        Err(error) => error,
    };
    let error = match error {
        Error::Operation(_) | Error::RetryExhausted { .. } | Error::Fallback(_) => match last {
            Some(Ok(response)) => return Ok(response),
            Some(Err(e)) => error.map(|_| e),
            None => unreachable!("a failed attempt always leaves its response or error"),
        },
        Error::Timeout(t) => Error::Timeout(t),
        Error::Rejected(r) => Error::Rejected(r),
        Error::Store(s) => Error::Store(s),
    };
    Err(ServiceError::Pipeline(error))
}

/// The future of a [`PipelineService`] call.
pub struct ResponseFuture<T, E> {
    inner: Pin<Box<dyn Future<Output = Result<T, ServiceError<E>>> + Send>>,
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

/// The error of a [`PipelineService`]; `E` is the inner service's error.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Rejection, RejectionReason, TimeoutError, TimeoutScope};
    use std::time::Duration;

    fn fail(kind: Verdict) -> AttemptFailure {
        AttemptFailure { verdict: kind }
    }

    #[test]
    fn a_failed_response_goes_back_to_the_caller() {
        let r: Result<&str, ServiceError<&str>> = settle(
            Err(Error::RetryExhausted {
                attempts: 3,
                last: fail(Verdict::retry()),
            }),
            Some(Ok("503")),
        );
        assert_eq!(r.unwrap(), "503");
        let r: Result<&str, ServiceError<&str>> = settle(
            Err(Error::Operation(fail(Verdict::abort()))),
            Some(Ok("404")),
        );
        assert_eq!(r.unwrap(), "404");
    }

    #[test]
    fn a_failed_error_keeps_its_type_and_attempts() {
        let r: Result<(), ServiceError<&str>> = settle(
            Err(Error::RetryExhausted {
                attempts: 2,
                last: fail(Verdict::retry()),
            }),
            Some(Err("refused")),
        );
        match r {
            Err(ServiceError::Pipeline(Error::RetryExhausted { attempts, last })) => {
                assert_eq!((attempts, last), (2, "refused"))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn errors_without_an_attempt_pass_through() {
        let rejection = Rejection::new(RejectionReason::CircuitOpen, None);
        let r: Result<(), ServiceError<&str>> =
            settle(Err(Error::Rejected(rejection)), Some(Err("stale")));
        let e = r.unwrap_err();
        assert!(e.is_rejected() && !e.is_timeout());
        assert_eq!(e.to_string(), "call rejected: circuit_open");
        let timeout = TimeoutError {
            scope: TimeoutScope::Attempt,
            after: Duration::from_millis(5),
            attempts: 1,
        };
        let r: Result<(), ServiceError<&str>> = settle(Err(Error::Timeout(timeout)), None);
        assert!(r.unwrap_err().is_timeout());
    }
}
