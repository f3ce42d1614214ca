//! The layer.

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::classify::{AttemptFailure, RetryableErrors, SuccessfulResponses};
use super::service::{Classifiers, PipelineService};
use super::LayerPipeline;
use crate::error::ConfigError;
use crate::pipeline::PipelineBuilder;

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
            .classify(|failure: &AttemptFailure| failure.verdict())
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
