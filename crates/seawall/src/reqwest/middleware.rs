//! The reqwest-middleware adapter (feature `reqwest-middleware`).

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};

use super::{classify, classify_response, limit_to_deadline, SendError};
use crate::classify::Verdict;
use crate::context::{Context, PartitionKey};
use crate::error::Error;
use crate::pipeline::answer::LastAnswer;
use crate::pipeline::{Judged, Pipeline};

type ClassifyResponseFn = dyn Fn(&Response) -> Option<Verdict> + Send + Sync;
type ClassifyErrorFn = dyn Fn(&reqwest_middleware::Error) -> Verdict + Send + Sync;
type PartitionFn = dyn Fn(&Request) -> Option<PartitionKey> + Send + Sync;

/// A [`reqwest_middleware::Middleware`] sending every request of a client
/// through a pipeline, so a client is wrapped once, as with reqwest-retry
/// or reqwest-tracing:
///
/// ```no_run
/// use std::time::Duration;
/// use reqwest_middleware::ClientBuilder;
/// use seawall::reqwest::SeawallMiddleware;
/// use seawall::{CircuitBreaker, Pipeline, Retry};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let pipeline = Pipeline::builder("users-api")
///     .retry(Retry::exponential(Duration::from_millis(100)).max_attempts(3))
///     .circuit_breaker(CircuitBreaker::consecutive_failures(5))
///     .timeout(Duration::from_secs(2))
///     .build()?;
/// let client = ClientBuilder::new(reqwest::Client::new())
///     .with(SeawallMiddleware::new(pipeline))
///     .build();
///
/// let response = client.get("http://127.0.0.1:8080/users/42").send().await?;
/// println!("{}", response.status());
/// # Ok(())
/// # }
/// ```
///
/// # Classification
/// The middleware, not the pipeline, judges each attempt (so the pipeline
/// is a plain one, without `.classify`):
/// - a response with [`classify_response`](super::classify_response) by
///   default: 408, 429 and 5xx are retried, a 429 is not a failure of the
///   dependency, `Retry-After` (seconds or HTTP-date) delays the retry and
///   opens the pipeline's [`Cooldown`](crate::Cooldown); replace it with
///   [`classify_response`](Self::classify_response);
/// - an error with [`classify`](super::classify) for reqwest's errors, and
///   [`Verdict::failure`] for an error of another middleware (a refusal by
///   a nested seawall pipeline is ignored); replace it with
///   [`classify_error`](Self::classify_error).
///
/// A response judged but not retried (a 4xx, a status of 600 and up) ends
/// the call as it is, a success for the caller and the listeners, and is
/// recorded as its verdict says (a 600 counts against the circuit), as
/// `send_through` keeps it.
///
/// # What the caller gets
/// - The response of the last attempt, **also when it was judged a
///   failure** and no retry is left, or a policy refused the retry (a
///   retry budget with no token left, a circuit the earlier attempts
///   opened, a full bulkhead): the caller sees the last 503 with its
///   headers and body, as reqwest-retry gives it, and as the
///   tower layer (feature `tower`) does.
/// - The last attempt's error, as the next middleware (or reqwest) gave it.
/// - `reqwest_middleware::Error::Middleware` holding a
///   [`SendError`] when the pipeline refused the call (nothing sent) or the
///   retry of an attempt that ended in an error, timed out or its store
///   failed ([`SendError::Pipeline`]), or when the body cannot be copied
///   ([`SendError::BodyNotCloneable`]); find it with
///   `anyhow::Error::downcast_ref::<SendError>()`.
///
/// # Bodies
/// Each attempt sends its own copy of the request (`Request::try_clone`).
/// A streaming body cannot be copied: with a pipeline that may make more
/// than one attempt (a retry or hedging, see
/// [`Pipeline::may_attempt_more_than_once`]), the call fails at once with
/// [`SendError::BodyNotCloneable`], nothing sent; any other pipeline sends
/// it once.
///
/// # Extensions
/// Every attempt hands the call's extensions to the next middleware, and
/// what it writes there reaches the caller. An attempt that runs beside
/// another (a hedge) gets a copy of them as the call began; what the next
/// middleware writes in that copy is dropped with it.
///
/// # Timeouts
/// As for [`send_through`](super::SendThrough::send_through) (see [the
/// reqwest adapter](super#timeouts)): each attempt's request timeout is the
/// time left before the attempt's deadline, or the request's own timeout
/// when that is shorter, in the place of the client's own timeout.
#[derive(Clone)]
pub struct SeawallMiddleware {
    pipeline: Pipeline,
    classify_response: Arc<ClassifyResponseFn>,
    classify_error: Arc<ClassifyErrorFn>,
    partition: Option<Arc<PartitionFn>>,
}

impl SeawallMiddleware {
    /// A middleware sending every request through `pipeline`.
    ///
    /// # Default
    /// Responses judged by [`classify_response`](super::classify_response),
    /// errors as in the [type docs](Self); every request in the pipeline's
    /// shared state (no partition).
    pub fn new(pipeline: Pipeline) -> Self {
        SeawallMiddleware {
            pipeline,
            classify_response: Arc::new(classify_response),
            classify_error: Arc::new(classify_middleware_error),
            partition: None,
        }
    }

    /// Judges responses with `classify`: `None` for a success, a
    /// [`Verdict`] otherwise (retried when the verdict says so, recorded by
    /// the circuit breaker as it says, its retry-after hint honoured; a
    /// response that is not retried ends the call as it is, see
    /// [Classification](Self#classification)).
    ///
    /// ```
    /// use seawall::reqwest::{classify_response, SeawallMiddleware};
    /// use seawall::{Pipeline, Verdict};
    ///
    /// // The API answers 409 while a resource is being created: retry it.
    /// let middleware = SeawallMiddleware::new(Pipeline::builder("jobs-api").build()?)
    ///     .classify_response(|response: &reqwest::Response| match response.status().as_u16() {
    ///         409 => Some(Verdict::retry()),
    ///         _ => classify_response(response),
    ///     });
    /// # Ok::<_, seawall::ConfigError>(())
    /// ```
    pub fn classify_response(
        mut self,
        classify: impl Fn(&Response) -> Option<Verdict> + Send + Sync + 'static,
    ) -> Self {
        self.classify_response = Arc::new(classify);
        self
    }

    /// Judges the errors of the next middleware (or of reqwest) with
    /// `classify`.
    pub fn classify_error(
        mut self,
        classify: impl Fn(&reqwest_middleware::Error) -> Verdict + Send + Sync + 'static,
    ) -> Self {
        self.classify_error = Arc::new(classify);
        self
    }

    /// Runs each request in the partition `partition` gives it (a tenant, a
    /// host): each partition has its own circuit, bulkhead, rate limit and
    /// cooldown. `None` puts the request in the pipeline's shared state.
    ///
    /// ```
    /// use seawall::reqwest::SeawallMiddleware;
    /// use seawall::Pipeline;
    ///
    /// // One circuit per host.
    /// let middleware = SeawallMiddleware::new(Pipeline::builder("partners").build()?)
    ///     .partition_by(|request: &reqwest::Request| request.url().host_str().map(str::to_owned));
    /// # Ok::<_, seawall::ConfigError>(())
    /// ```
    pub fn partition_by<K: Into<PartitionKey>>(
        mut self,
        partition: impl Fn(&Request) -> Option<K> + Send + Sync + 'static,
    ) -> Self {
        self.partition = Some(Arc::new(move |request| partition(request).map(Into::into)));
        self
    }

    /// The middleware's pipeline: its circuit state, metrics, manual
    /// controls.
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// One attempt's outcome as the pipeline sees it; a failed attempt's
    /// response or error is kept in `last` for the caller.
    fn judge(
        &self,
        last: &LastAnswer<Response, reqwest_middleware::Error>,
        result: reqwest_middleware::Result<Response>,
    ) -> Judged<Response, Failed> {
        let (result, verdict) = match result {
            Ok(response) => match (self.classify_response)(&response) {
                None => (Ok(response), None),
                // A response that is not retried (a 4xx, a 600) ends the
                // call as it is, recorded as its verdict says, as
                // `send_through` keeps it.
                Some(verdict) if !verdict.is_retryable() => (Ok(response), Some(verdict)),
                Some(verdict) => {
                    last.keep(Ok(response));
                    (Err(Failed), Some(verdict))
                }
            },
            Err(e) => {
                let verdict = (self.classify_error)(&e);
                last.keep(Err(e));
                (Err(Failed), Some(verdict))
            }
        };
        Judged { result, verdict }
    }
}

impl fmt::Debug for SeawallMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SeawallMiddleware")
            .field("pipeline", &self.pipeline)
            .field("partitioned", &self.partition.is_some())
            .finish_non_exhaustive()
    }
}

/// The default error classifier; see [`SeawallMiddleware`].
fn classify_middleware_error(error: &reqwest_middleware::Error) -> Verdict {
    match error {
        reqwest_middleware::Error::Reqwest(e) => classify(e),
        reqwest_middleware::Error::Middleware(e) => {
            let refused = e
                .downcast_ref::<SendError>()
                .is_some_and(SendError::is_rejected);
            if refused {
                Verdict::ignore()
            } else {
                Verdict::failure()
            }
        }
    }
}

/// A failed attempt, as the pipeline sees it: its response or error waits
/// in the call's [`LastAnswer`].
struct Failed;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The call's extensions, taken by one attempt and put back when the
/// attempt is done with them (or dropped, e.g. by a timeout). An attempt
/// that finds them taken (a hedge running beside the attempt that holds
/// them) runs with a copy of them as the call began.
struct Lease<'s, 'e> {
    slot: &'s Mutex<Option<&'e mut Extensions>>,
    extensions: Option<&'e mut Extensions>,
}

impl<'s, 'e> Lease<'s, 'e> {
    fn take(slot: &'s Mutex<Option<&'e mut Extensions>>) -> Self {
        let extensions = lock(slot).take();
        Lease { slot, extensions }
    }
}

impl Drop for Lease<'_, '_> {
    fn drop(&mut self) {
        if let Some(e) = self.extensions.take() {
            *lock(self.slot) = Some(e);
        }
    }
}

#[async_trait::async_trait]
impl Middleware for SeawallMiddleware {
    async fn handle(
        &self,
        request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let key = self.partition.as_ref().and_then(|p| p(&request));
        let copy = request.try_clone();
        if copy.is_none() && self.pipeline.may_attempt_more_than_once() {
            return Err(reqwest_middleware::Error::middleware(
                SendError::BodyNotCloneable,
            ));
        }
        // An attempt that runs while another holds the call's extensions
        // (a hedge) gets a copy of them as the call began.
        let initial = self
            .pipeline
            .may_overlap_attempts()
            .then(|| extensions.clone());
        let mut first = Some(request);
        let slot = Mutex::new(Some(extensions));
        let last = LastAnswer::new();
        let (slot, next, initial, last_ref) = (&slot, &next, &initial, &last);
        let result = self
            .pipeline
            .drive_async(
                crate::pipeline::Given::partitioned_in(key.as_ref()),
                |ctx: Context| {
                    // The first attempt sends the request itself; later ones
                    // (which exist only when it could be copied) send copies.
                    let request = first
                        .take()
                        .or_else(|| copy.as_ref().and_then(Request::try_clone));
                    async move {
                        let Some(mut request) = request else {
                            let refused = SendError::BodyNotCloneable;
                            let refused = Err(reqwest_middleware::Error::middleware(refused));
                            return self.judge(last_ref, refused);
                        };
                        limit_to_deadline(&mut request, &ctx);
                        let mut lease = Lease::take(slot);
                        let mut copy;
                        let extensions = match lease.extensions.as_deref_mut() {
                            Some(extensions) => extensions,
                            None => {
                                copy = initial.clone().unwrap_or_default();
                                &mut copy
                            }
                        };
                        let result = next.clone().run(request, extensions).await;
                        drop(lease);
                        self.judge(last_ref, result)
                    }
                },
            )
            .await;
        settle(last.settle(result))
    }
}

/// The call's result as the middleware's: the last failed attempt's
/// response or error (see [`LastAnswer::settle`]); the pipeline's own
/// failures become a [`SendError`].
fn settle(
    result: Result<Response, Error<reqwest_middleware::Error>>,
) -> reqwest_middleware::Result<Response> {
    let pipeline_error = match result {
        Ok(response) => return Ok(response),
        Err(Error::Operation(e) | Error::RetryExhausted { last: e, .. } | Error::Fallback(e)) => {
            return Err(e)
        }
        Err(Error::Timeout(t)) => Error::Timeout(t),
        Err(Error::Rejected(r)) => Error::Rejected(r),
        Err(Error::Store(s)) => Error::Store(s),
        Err(Error::Config(c)) => Error::Config(c),
    };
    Err(reqwest_middleware::Error::middleware(SendError::Pipeline(
        pipeline_error,
    )))
}
