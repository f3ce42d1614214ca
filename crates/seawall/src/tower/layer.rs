//! The layer.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use tower_layer::Layer;

use super::classify::{
    AttemptFailure, CloneRequests, RetryableErrors, SingleAttempt, SuccessfulResponses,
};
use super::fallback::{NoFallback, RespondWith};
use super::partition::NoPartition;
use super::service::{Parts, PipelineService};
use super::LayerPipeline;
use crate::error::ConfigError;
use crate::pipeline::PipelineBuilder;

/// A `tower::Layer` running every request of the wrapped service through a
/// pipeline; see the [module docs](super).
///
/// The layer builds its pipeline from a [`PipelineBuilder`] without a
/// classifier or fallback: classification belongs to the layer
/// ([`classify_response`](Self::classify_response),
/// [`classify_error`](Self::classify_error)), which sees both responses and
/// errors. Every service made by one layer shares its pipeline; pipelines of
/// the same name in the same store share their circuit, bulkhead, rate limit
/// and cooldown anyway.
///
/// `M` says how requests are sent: [`CloneRequests`] (made by
/// [`new`](PipelineLayer::new)) or [`SingleAttempt`] (made by
/// [`single_attempt`](PipelineLayer::single_attempt)).
///
/// `P` gives each request's partition ([`partition_by`](Self::partition_by)),
/// `F` answers failed calls ([`fallback`](Self::fallback),
/// [`error_responses`](Self::error_responses)).
///
/// # Default
/// Every response is a success ([`SuccessfulResponses`]), every error a
/// retryable failure ([`RetryableErrors`]); every request shares the
/// pipeline's state ([`NoPartition`]); a failed call is the service's
/// [`ServiceError`](super::ServiceError) ([`NoFallback`]).
pub struct PipelineLayer<
    R = SuccessfulResponses,
    E = RetryableErrors,
    M = CloneRequests,
    P = NoPartition,
    F = NoFallback,
> {
    pipeline: LayerPipeline,
    classify_response: R,
    classify_error: E,
    partition: P,
    fallback: F,
    mode: PhantomData<fn() -> M>,
}

fn layer_pipeline(builder: PipelineBuilder) -> Result<LayerPipeline, ConfigError> {
    builder
        .classify(|failure: &AttemptFailure| failure.verdict())
        .build()
}

impl PipelineLayer {
    /// Builds the pipeline from `builder` and makes a layer of it. Each
    /// attempt sends a clone of the request, so requests must be `Clone`
    /// ([`RetryableRequest`](super::RetryableRequest)).
    ///
    /// # Errors
    /// The [`ConfigError`] of [`PipelineBuilder::build`].
    pub fn new(builder: PipelineBuilder) -> Result<Self, ConfigError> {
        Ok(PipelineLayer {
            pipeline: layer_pipeline(builder)?,
            classify_response: SuccessfulResponses,
            classify_error: RetryableErrors,
            partition: NoPartition,
            fallback: NoFallback,
            mode: PhantomData,
        })
    }
}

impl PipelineLayer<SuccessfulResponses, RetryableErrors, SingleAttempt> {
    /// Builds the pipeline from `builder`, which must make one attempt per
    /// call (no retry of more than one attempt, no hedging), and makes a
    /// layer that moves each request into the call's one attempt: for
    /// requests that are not `Clone`, such as those an axum or hyper server
    /// hands to its services, guarded by a circuit breaker, bulkhead, rate
    /// limiter, cooldown or timeout.
    ///
    /// ```
    /// use seawall::tower::PipelineLayer;
    /// use seawall::{Bulkhead, Pipeline};
    ///
    /// let shed_load = PipelineLayer::single_attempt(
    ///     Pipeline::builder("checkout-handler").bulkhead(Bulkhead::new(64)),
    /// )?;
    /// # let _ = shed_load;
    /// # Ok::<_, seawall::ConfigError>(())
    /// ```
    ///
    /// # Errors
    /// The [`ConfigError`] of [`PipelineBuilder::build`], or one for a
    /// builder whose calls may make more than one attempt
    /// ([`Pipeline::may_attempt_more_than_once`](crate::Pipeline::may_attempt_more_than_once)):
    /// `pipeline.retry ...` for a retry allowing more than one attempt,
    /// `pipeline.hedging ...` for hedging.
    pub fn single_attempt(builder: PipelineBuilder) -> Result<Self, ConfigError> {
        let pipeline = layer_pipeline(builder)?;
        if pipeline.may_attempt_more_than_once() {
            return Err(match pipeline.shared.hedging {
                Some(_) => ConfigError::new(
                    "pipeline",
                    "hedging",
                    "must not be declared in `PipelineLayer::single_attempt`: hedged \
                     attempts each send the request, which is not copied, so it cannot be \
                     sent more than once",
                ),
                None => ConfigError::new(
                    "pipeline",
                    "retry",
                    "must allow one attempt at most in `PipelineLayer::single_attempt`: \
                     its requests are not copied, so they cannot be sent again",
                ),
            });
        }
        Ok(PipelineLayer {
            pipeline,
            classify_response: SuccessfulResponses,
            classify_error: RetryableErrors,
            partition: NoPartition,
            fallback: NoFallback,
            mode: PhantomData,
        })
    }
}

impl<R, E, M, P, F> PipelineLayer<R, E, M, P, F> {
    /// Judges the inner service's responses with `classify`: `None` for a
    /// success, a [`Verdict`](crate::Verdict) for a failed attempt (retried
    /// when the verdict says so, recorded by the circuit breaker, its
    /// retry-after hint honoured). When no retry follows, the caller still
    /// gets the response.
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
    pub fn classify_response<R2>(self, classify: R2) -> PipelineLayer<R2, E, M, P, F> {
        PipelineLayer {
            pipeline: self.pipeline,
            classify_response: classify,
            classify_error: self.classify_error,
            partition: self.partition,
            fallback: self.fallback,
            mode: PhantomData,
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
    pub fn classify_error<E2>(self, classify: E2) -> PipelineLayer<R, E2, M, P, F> {
        PipelineLayer {
            pipeline: self.pipeline,
            classify_response: self.classify_response,
            classify_error: classify,
            partition: self.partition,
            fallback: self.fallback,
            mode: PhantomData,
        }
    }

    /// Runs each request in the partition `partition` gives it: each tenant,
    /// host or route gets its own circuit, bulkhead, rate limit and
    /// cooldown. The closure takes the request and returns its key (a
    /// `String`, a `&'static str`, an integer: anything
    /// `Into<PartitionKey>`), or `None` for the pipeline's shared state;
    /// see [`PartitionRequest`](super::PartitionRequest).
    ///
    /// ```
    /// use seawall::tower::PipelineLayer;
    /// use seawall::{Pipeline, RateLimiter};
    /// use std::time::Duration;
    ///
    /// // 100 requests a second for each tenant.
    /// let per_tenant = PipelineLayer::new(
    ///     Pipeline::builder("orders-api").rate_limiter(RateLimiter::gcra(100, Duration::from_secs(1))),
    /// )?
    /// .partition_by(|request: &http::Request<String>| {
    ///     let tenant = request.headers().get("x-tenant")?;
    ///     tenant.to_str().ok().map(str::to_owned)
    /// });
    /// # Ok::<_, seawall::ConfigError>(())
    /// ```
    pub fn partition_by<P2>(self, partition: P2) -> PipelineLayer<R, E, M, P2, F> {
        PipelineLayer {
            pipeline: self.pipeline,
            classify_response: self.classify_response,
            classify_error: self.classify_error,
            partition,
            fallback: self.fallback,
            mode: PhantomData,
        }
    }

    /// Answers every failed call (a rejection, a timeout, the inner
    /// service's error after the retries, a store failure) with the
    /// response `fallback` makes of its
    /// [`ServiceError`](super::ServiceError). The service's error type
    /// becomes the inner service's own, returned only when the inner
    /// service fails in `poll_ready` (so `Infallible` stays `Infallible`).
    ///
    /// ```
    /// use seawall::tower::{PipelineLayer, ServiceError};
    /// use seawall::{CircuitBreaker, Pipeline};
    ///
    /// let layer = PipelineLayer::new(
    ///     Pipeline::builder("prices-api").circuit_breaker(CircuitBreaker::consecutive_failures(5)),
    /// )?
    /// .fallback(|error: ServiceError<std::io::Error>| {
    ///     http::Response::new(format!("cached prices ({error})"))
    /// });
    /// # Ok::<_, seawall::ConfigError>(())
    /// ```
    pub fn fallback<G>(self, fallback: G) -> PipelineLayer<R, E, M, P, RespondWith<G>> {
        self.with_fallback(RespondWith(fallback))
    }

    /// Answers every failed call with its HTTP status (429 when rate
    /// limited, 503 for the other rejections, each with `Retry-After`; 504
    /// for a timeout; 500 for the inner service's error), as
    /// [`error_response`](super::error_response) does: load shedding for a
    /// server without a hand-written error handler (feature `http`).
    ///
    /// ```
    /// use seawall::tower::PipelineLayer;
    /// use seawall::{Bulkhead, Pipeline};
    ///
    /// // At most 64 requests at once; the others get a 503 with Retry-After.
    /// let shed_load = PipelineLayer::single_attempt(
    ///     Pipeline::builder("checkout-handler").bulkhead(Bulkhead::new(64)),
    /// )?
    /// .error_responses();
    /// # let _ = shed_load;
    /// # Ok::<_, seawall::ConfigError>(())
    /// ```
    #[cfg(feature = "http")]
    pub fn error_responses(self) -> PipelineLayer<R, E, M, P, super::ErrorResponses> {
        self.with_fallback(super::ErrorResponses)
    }

    /// Makes the layered service fail with the gRPC status of each failed
    /// call, as [`seawall::tonic::status`](crate::tonic::status) gives it
    /// (`RESOURCE_EXHAUSTED` when rate limited, `UNAVAILABLE` for the other
    /// rejections, each with `grpc-retry-pushback-ms` when the policy knows
    /// its wait; `DEADLINE_EXCEEDED` for a timeout; the inner service's own
    /// status otherwise): a tonic client or server over the layer hands the
    /// caller that status as it is, not as `UNKNOWN` (feature `tonic`).
    ///
    /// ```
    /// use seawall::tower::PipelineLayer;
    /// use seawall::{CircuitBreaker, Pipeline};
    ///
    /// // Over a tonic `Channel`: an open circuit answers UNAVAILABLE.
    /// let layer = PipelineLayer::single_attempt(
    ///     Pipeline::builder("greeter").circuit_breaker(CircuitBreaker::consecutive_failures(5)),
    /// )?
    /// .status_errors();
    /// # let _ = layer;
    /// # Ok::<_, seawall::ConfigError>(())
    /// ```
    #[cfg(feature = "tonic")]
    pub fn status_errors(self) -> PipelineLayer<R, E, M, P, crate::tonic::StatusErrors> {
        self.with_fallback(crate::tonic::StatusErrors)
    }

    fn with_fallback<G>(self, fallback: G) -> PipelineLayer<R, E, M, P, G> {
        PipelineLayer {
            pipeline: self.pipeline,
            classify_response: self.classify_response,
            classify_error: self.classify_error,
            partition: self.partition,
            fallback,
            mode: PhantomData,
        }
    }

    /// The layer's pipeline: its circuit state, metrics, manual controls.
    pub fn pipeline(&self) -> &LayerPipeline {
        &self.pipeline
    }
}

impl<R: Clone, E: Clone, M, P: Clone, F: Clone> Clone for PipelineLayer<R, E, M, P, F> {
    fn clone(&self) -> Self {
        PipelineLayer {
            pipeline: self.pipeline.clone(),
            classify_response: self.classify_response.clone(),
            classify_error: self.classify_error.clone(),
            partition: self.partition.clone(),
            fallback: self.fallback.clone(),
            mode: PhantomData,
        }
    }
}

impl<R, E, M, P, F> fmt::Debug for PipelineLayer<R, E, M, P, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PipelineLayer")
            .field("pipeline", &self.pipeline)
            .finish_non_exhaustive()
    }
}

impl<S, R: Clone, E: Clone, M, P: Clone, F: Clone> Layer<S> for PipelineLayer<R, E, M, P, F> {
    type Service = PipelineService<S, R, E, M, P, F>;

    fn layer(&self, inner: S) -> Self::Service {
        PipelineService {
            inner,
            pipeline: self.pipeline.clone(),
            parts: Arc::new(Parts {
                response: self.classify_response.clone(),
                error: self.classify_error.clone(),
                partition: self.partition.clone(),
                fallback: self.fallback.clone(),
            }),
            mode: PhantomData,
        }
    }
}
