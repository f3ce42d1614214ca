//! The layer.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use tower_layer::Layer;

use super::classify::{
    AttemptFailure, CloneRequests, RetryableErrors, SingleAttempt, SuccessfulResponses,
};
use super::service::{Classifiers, PipelineService};
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
/// # Default
/// Every response is a success ([`SuccessfulResponses`]), every error a
/// retryable failure ([`RetryableErrors`]).
pub struct PipelineLayer<R = SuccessfulResponses, E = RetryableErrors, M = CloneRequests> {
    pipeline: LayerPipeline,
    classify_response: R,
    classify_error: E,
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
            mode: PhantomData,
        })
    }
}

impl PipelineLayer<SuccessfulResponses, RetryableErrors, SingleAttempt> {
    /// Builds the pipeline from `builder`, which must not retry, and makes
    /// a layer that moves each request into the call's one attempt: for
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
    /// The [`ConfigError`] of [`PipelineBuilder::build`], or
    /// `pipeline.retry ...` when the builder has a retry allowing more than
    /// one attempt.
    pub fn single_attempt(builder: PipelineBuilder) -> Result<Self, ConfigError> {
        let pipeline = layer_pipeline(builder)?;
        if pipeline
            .shared
            .retry
            .as_ref()
            .is_some_and(|r| r.max_attempts > 1)
        {
            return Err(ConfigError::new(
                "pipeline",
                "retry",
                "must allow one attempt at most in `PipelineLayer::single_attempt`: \
                 its requests are not copied, so they cannot be sent again",
            ));
        }
        Ok(PipelineLayer {
            pipeline,
            classify_response: SuccessfulResponses,
            classify_error: RetryableErrors,
            mode: PhantomData,
        })
    }
}

impl<R, E, M> PipelineLayer<R, E, M> {
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
    pub fn classify_response<R2>(self, classify: R2) -> PipelineLayer<R2, E, M> {
        PipelineLayer {
            pipeline: self.pipeline,
            classify_response: classify,
            classify_error: self.classify_error,
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
    pub fn classify_error<E2>(self, classify: E2) -> PipelineLayer<R, E2, M> {
        PipelineLayer {
            pipeline: self.pipeline,
            classify_response: self.classify_response,
            classify_error: classify,
            mode: PhantomData,
        }
    }

    /// The layer's pipeline: its circuit state, metrics, manual controls.
    pub fn pipeline(&self) -> &LayerPipeline {
        &self.pipeline
    }
}

impl<R: Clone, E: Clone, M> Clone for PipelineLayer<R, E, M> {
    fn clone(&self) -> Self {
        PipelineLayer {
            pipeline: self.pipeline.clone(),
            classify_response: self.classify_response.clone(),
            classify_error: self.classify_error.clone(),
            mode: PhantomData,
        }
    }
}

impl<R, E, M> fmt::Debug for PipelineLayer<R, E, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PipelineLayer")
            .field("pipeline", &self.pipeline)
            .finish_non_exhaustive()
    }
}

impl<S, R: Clone, E: Clone, M> Layer<S> for PipelineLayer<R, E, M> {
    type Service = PipelineService<S, R, E, M>;

    fn layer(&self, inner: S) -> Self::Service {
        PipelineService {
            inner,
            pipeline: self.pipeline.clone(),
            classifiers: Arc::new(Classifiers {
                response: self.classify_response.clone(),
                error: self.classify_error.clone(),
            }),
            mode: PhantomData,
        }
    }
}
