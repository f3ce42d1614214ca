//! Tower integration (feature `tower`): [`PipelineLayer`] puts any
//! `tower::Service` behind a pipeline, so hyper, tonic or axum client stacks
//! get retry, circuit breaker, timeout, bulkhead, rate limiter and cooldown
//! from one layer.
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use seawall::tower::PipelineLayer;
//! use seawall::{CircuitBreaker, Pipeline, Retry, Verdict};
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
//! // `seawall::http::classify_response` (feature `http`) fits here too.
//! .classify_response(|response: &http::Response<String>| {
//!     response.status().is_server_error().then(Verdict::retry)
//! });
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
//! clone, as tower's own middleware do, so readiness is never lost on
//! clone); each later attempt calls a clone of the inner service once that
//! clone is ready, so hedged attempts that run at the same time each wait
//! for a service of their own.
//!
//! `poll_ready` is the inner service's: the layer is ready when the inner
//! service is, whatever the pipeline's state. Two consequences, unlike a
//! circuit-breaker layer that answers `poll_ready` itself: while the inner
//! service is not ready (a saturated `ConcurrencyLimit` or `Buffer` inside
//! the layer), a call waits for it even when the circuit is open, and is
//! refused only once it is made (`Rejected(CircuitOpen)`, without reaching
//! the inner service); and the pipeline's bulkhead, rate limiter and
//! adaptive limit never hold `poll_ready` back: they refuse (or queue) the
//! call when it is made. For backpressure in `poll_ready`, put tower's
//! `ConcurrencyLimit` outside the layer; to refuse at once while the
//! circuit is open, keep backpressure layers outside it too.
//!
//! A layer made by [`single_attempt`](PipelineLayer::single_attempt) moves
//! the request into the call's one attempt instead: no retry or hedging
//! (refused at build), but any
//! request type, such as the `Request<Incoming>` a hyper or axum server
//! hands to its handlers, behind a circuit breaker, bulkhead, rate limiter
//! or timeout.
//!
//! # Classification
//! The layer, not the pipeline, judges each attempt:
//! - an error of the inner service with
//!   [`classify_error`](PipelineLayer::classify_error) (default: every
//!   error is a retryable failure, [`RetryableErrors`]);
//! - a response with
//!   [`classify_response`](PipelineLayer::classify_response) (default:
//!   every response is a success, [`SuccessfulResponses`]): `None` means
//!   success, a [`Verdict`](crate::Verdict) makes the response a failed
//!   attempt, e.g. a 503, whose retry-after hint delays the retry and opens
//!   the cooldown.
//!
//! # Partitions
//! [`partition_by`](PipelineLayer::partition_by) takes the partition key
//! from each request (a tenant header, the host): each partition has its
//! own circuit, bulkhead, rate limit and cooldown, so one noisy tenant
//! cannot trip the circuit or spend the limit of another.
//!
//! # Fallbacks and HTTP answers
//! [`fallback`](PipelineLayer::fallback) turns every failed call into a
//! response made by a closure from its [`ServiceError`];
//! [`error_responses`](PipelineLayer::error_responses) (feature `http`)
//! answers with the status of [`error_response`]: 429 when rate limited,
//! 503 for the other rejections, both with `Retry-After`. With either, the
//! service's error is the inner service's own, so an axum `Router` takes
//! the layer as is, without a `HandleErrorLayer`:
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use seawall::tower::PipelineLayer;
//! use seawall::{Pipeline, RateLimiter};
//! use tower::{service_fn, Layer, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let per_tenant = PipelineLayer::single_attempt(
//!     Pipeline::builder("api").rate_limiter(RateLimiter::fixed_window(1, Duration::from_secs(60))),
//! )?
//! .partition_by(|request: &http::Request<String>| {
//!     request.headers().get("x-tenant")?.to_str().ok().map(str::to_owned)
//! })
//! .error_responses();
//! let handler = service_fn(|_: http::Request<String>| async {
//!     Ok::<_, Infallible>(http::Response::new(String::from("hello")))
//! });
//! let service = per_tenant.layer(handler);
//!
//! let request = || http::Request::builder().header("x-tenant", "acme").body(String::new());
//! assert_eq!(service.clone().oneshot(request()?).await?.status(), 200);
//! let limited = service.oneshot(request()?).await?;
//! assert_eq!(limited.status(), 429);
//! assert_eq!(limited.headers()["retry-after"], "60");
//! # Ok(())
//! # }
//! ```
//!
//! # What the caller gets
//! - The response of the last attempt, **also when that response was judged
//!   a failure** and no retry is left, its verdict forbids one, or a policy
//!   refused the retry (an open circuit, a full bulkhead, the retry budget):
//!   the layer never turns a response into an error, so an HTTP client sees
//!   the last 503 with its headers and body, as it would without the layer.
//! - [`ServiceError::Pipeline`] when the inner service failed (its error
//!   stays typed inside [`Error::Operation`](crate::Error::Operation) or
//!   [`Error::RetryExhausted`](crate::Error::RetryExhausted)),
//!   an attempt or the call timed out, a policy rejected the call (the inner
//!   service was not called for it, or its last attempt failed with an
//!   error and the policy refused the retry) or the state store failed.
//! - [`ServiceError::NotReady`] when the inner service fails in `poll_ready`.
//!
//! The response future is `Send` (inner service, its future, request,
//! response and error must be `Send + 'static`).

mod classify;
mod error;
mod fallback;
mod future;
mod layer;
mod partition;
#[cfg(feature = "http")]
mod response;
mod service;

pub use classify::{
    AttemptFailure, ClassifyError, ClassifyResponse, CloneRequests, RetryableErrors,
    RetryableRequest, SingleAttempt, SuccessfulResponses,
};
pub use error::ServiceError;
pub use fallback::{Fallback, NoFallback, RespondWith};
pub use future::ResponseFuture;
pub use layer::PipelineLayer;
pub use partition::{NoPartition, PartitionRequest};
#[cfg(feature = "http")]
pub use response::{error_response, ErrorResponses};
pub use service::PipelineService;

use crate::pipeline::{ErrorType, Pipeline};

/// The pipeline inside a [`PipelineLayer`]: the policies of the builder it
/// was made from, judging [`AttemptFailure`]s.
pub type LayerPipeline = Pipeline<ErrorType<AttemptFailure>>;
