//! The service: one pipeline run per call, one inner call per attempt.

use std::fmt;
use std::future::poll_fn;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context as TaskContext, Poll};

use tower_service::Service;

use super::classify::{
    AttemptFailure, ClassifyError, ClassifyResponse, CloneRequests, RetryableErrors,
    RetryableRequest, SingleAttempt, SuccessfulResponses,
};
use super::fallback::{Fallback, NoFallback};
use super::partition::{NoPartition, PartitionRequest};
use super::{LayerPipeline, ResponseFuture, ServiceError};
use crate::classify::Verdict;
use crate::context::{Context, PartitionKey};
use crate::pipeline::answer::LastAnswer;

impl<S, Req, R, E, P, F> Service<Req> for PipelineService<S, R, E, CloneRequests, P, F>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
    Req: RetryableRequest + Send + 'static,
    R: ClassifyResponse<S::Response> + Send + Sync + 'static,
    E: ClassifyError<S::Error> + Send + Sync + 'static,
    P: PartitionRequest<Req> + Send + Sync + 'static,
    F: Fallback<S::Response, S::Error> + Send + Sync + 'static,
{
    type Response = S::Response;
    type Error = F::Error;
    type Future = ResponseFuture<S::Response, F::Error>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        let fallback = &self.parts.fallback;
        self.inner.poll_ready(cx).map_err(|e| fallback.not_ready(e))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let key = self.parts.partition.partition_key(&request);
        self.call_with(key, move || request.clone_request())
    }
}

impl<S, Req, R, E, P, F> Service<Req> for PipelineService<S, R, E, SingleAttempt, P, F>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
    Req: Send + 'static,
    R: ClassifyResponse<S::Response> + Send + Sync + 'static,
    E: ClassifyError<S::Error> + Send + Sync + 'static,
    P: PartitionRequest<Req> + Send + Sync + 'static,
    F: Fallback<S::Response, S::Error> + Send + Sync + 'static,
{
    type Response = S::Response;
    type Error = F::Error;
    type Future = ResponseFuture<S::Response, F::Error>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        let fallback = &self.parts.fallback;
        self.inner.poll_ready(cx).map_err(|e| fallback.not_ready(e))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let key = self.parts.partition.partition_key(&request);
        let mut request = Some(request);
        // The layer refuses pipelines that may make more than one attempt.
        self.call_with(key, move || {
            request
                .take()
                .expect("a single-attempt layer makes one attempt")
        })
    }
}

impl<S, R, E, M, P, F> PipelineService<S, R, E, M, P, F> {
    fn call_with<Req>(
        &mut self,
        key: Option<PartitionKey>,
        next_request: impl FnMut() -> Req + Send + 'static,
    ) -> ResponseFuture<S::Response, F::Error>
    where
        S: Service<Req> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Response: Send + 'static,
        S::Error: Send + 'static,
        Req: Send + 'static,
        R: ClassifyResponse<S::Response> + Send + Sync + 'static,
        E: ClassifyError<S::Error> + Send + Sync + 'static,
        P: Send + Sync + 'static,
        F: Fallback<S::Response, S::Error> + Send + Sync + 'static,
    {
        // The ready service goes into the future; `self` keeps a clone,
        // which its caller must drive to readiness before the next call.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        let pipeline = self.pipeline.clone();
        let parts = Arc::clone(&self.parts);
        ResponseFuture::new(async move {
            let result = call_through(&pipeline, key, &parts, ready, next_request).await;
            result.or_else(|e| parts.fallback.fall_back(e))
        })
    }
}

/// The layer's classifiers, partitioning and fallback, shared by the
/// services it made.
pub(super) struct Parts<R, E, P, F> {
    pub(super) response: R,
    pub(super) error: E,
    pub(super) partition: P,
    pub(super) fallback: F,
}

/// A service behind a pipeline, made by
/// [`PipelineLayer`](super::PipelineLayer). Cloning it clones the inner
/// service (not ready, as tower expects) and shares the pipeline.
pub struct PipelineService<
    S,
    R = SuccessfulResponses,
    E = RetryableErrors,
    M = CloneRequests,
    P = NoPartition,
    F = NoFallback,
> {
    pub(super) inner: S,
    pub(super) pipeline: LayerPipeline,
    pub(super) parts: Arc<Parts<R, E, P, F>>,
    pub(super) mode: PhantomData<fn() -> M>,
}

impl<S, R, E, M, P, F> PipelineService<S, R, E, M, P, F> {
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

impl<S: Clone, R, E, M, P, F> Clone for PipelineService<S, R, E, M, P, F> {
    fn clone(&self) -> Self {
        PipelineService {
            inner: self.inner.clone(),
            pipeline: self.pipeline.clone(),
            parts: Arc::clone(&self.parts),
            mode: PhantomData,
        }
    }
}

impl<S: fmt::Debug, R, E, M, P, F> fmt::Debug for PipelineService<S, R, E, M, P, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PipelineService")
            .field("inner", &self.inner)
            .field("pipeline", &self.pipeline)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The inner service of one call. The first attempt to reach it calls the
/// service that `poll_ready` made ready; every later one calls a clone of
/// it, once that clone is ready. So attempts that run at the same time
/// (hedging) each wait for a service of their own, and none holds
/// another's.
struct Inner<S>(Mutex<Slot<S>>);

struct Slot<S> {
    service: S,
    /// `service` is ready and no attempt has called it yet.
    ready: bool,
}

impl<S> Inner<S> {
    fn new(ready: S) -> Self {
        Inner(Mutex::new(Slot {
            service: ready,
            ready: true,
        }))
    }

    /// Sends `request` to the ready service if no attempt did yet, or
    /// gives back a clone of the service (not ready) and the request.
    fn call_ready<Req>(&self, request: Req) -> Result<S::Future, (S, Req)>
    where
        S: Service<Req> + Clone,
    {
        let mut slot = lock(&self.0);
        if std::mem::take(&mut slot.ready) {
            return Ok(slot.service.call(request));
        }
        Err((slot.service.clone(), request))
    }
}

/// Keeps what a failed attempt produced and tells the pipeline its verdict.
fn failed<T, E>(
    last: &LastAnswer<T, E>,
    verdict: Verdict,
    outcome: Result<T, E>,
) -> AttemptFailure {
    last.keep(outcome);
    AttemptFailure { verdict }
}

async fn call_through<S, Req, R, E, P, F>(
    pipeline: &LayerPipeline,
    key: Option<PartitionKey>,
    parts: &Parts<R, E, P, F>,
    service: S,
    mut next_request: impl FnMut() -> Req,
) -> Result<S::Response, ServiceError<S::Error>>
where
    S: Service<Req> + Clone,
    R: ClassifyResponse<S::Response>,
    E: ClassifyError<S::Error>,
{
    let inner = Inner::new(service);
    let last = LastAnswer::new();
    let result = {
        let (inner, last) = (&inner, &last);
        let attempt = move |_: Context| {
            let request = next_request();
            async move {
                let future = match inner.call_ready(request) {
                    Ok(future) => future,
                    Err((mut service, request)) => {
                        if let Err(e) = poll_fn(|cx| service.poll_ready(cx)).await {
                            let verdict = parts.error.classify_error(&e);
                            return Err(failed(last, verdict, Err(e)));
                        }
                        service.call(request)
                    }
                };
                match future.await {
                    Ok(response) => match parts.response.classify_response(&response) {
                        None => Ok(response),
                        Some(verdict) => Err(failed(last, verdict, Ok(response))),
                    },
                    Err(e) => {
                        let verdict = parts.error.classify_error(&e);
                        Err(failed(last, verdict, Err(e)))
                    }
                }
            }
        };
        match key {
            Some(key) => pipeline.partition(key).run(attempt).await,
            None => pipeline.run(attempt).await,
        }
    };
    last.settle(result).map_err(ServiceError::Pipeline)
}
