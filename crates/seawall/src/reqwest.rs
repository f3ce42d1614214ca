//! reqwest adapter (feature `reqwest`): send a request through a pipeline
//! in one line with [`SendThrough::send_through`].
//!
//! ```no_run
//! use std::time::Duration;
//! use seawall::reqwest::SendThrough;
//! use seawall::{CircuitBreaker, Pipeline, Retry};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let users = Pipeline::builder("users-api")
//!     .retry(Retry::exponential(Duration::from_millis(100)).max_attempts(3))
//!     .circuit_breaker(CircuitBreaker::consecutive_failures(5))
//!     .timeout(Duration::from_secs(2))
//!     .classify(seawall::reqwest::classify)
//!     .build()?;
//!
//! let client = reqwest::Client::new();
//! let response = client
//!     .get("http://127.0.0.1:8080/users/42")
//!     .send_through(&users)
//!     .await?;
//! println!("{}", response.status());
//! # Ok(())
//! # }
//! ```
//!
//! A whole client can be wrapped once instead, with
//! `SeawallMiddleware` in a `reqwest_middleware::ClientBuilder` (feature
//! `reqwest-middleware`): the same classification of responses, the last
//! response given back after the retries.
//!
//! # Pipelines
//! `send_through` takes any pipeline that runs
//! `Result<reqwest::Response, reqwest::Error>`:
//! - one built with `.classify(seawall::reqwest::classify)` (the
//!   recommended one: see [`classify`] for the verdicts), or with a
//!   classifier of your own for `reqwest::Error`;
//! - a plain one (no classifier): every error, including a request that
//!   cannot be built or a redirect loop, is then retried;
//! - one with a fallback producing a `reqwest::Response`.
//!
//! # Responses
//! Each response is judged by its status and headers with
//! [`classify_status`]. A retryable one (408, 429, 5xx) becomes reqwest's
//! own status error (`error_for_status`), so the pipeline retries it; when
//! retries run out, the call fails with that error in
//! [`Error::RetryExhausted`]. A 5xx counts against the circuit breaker; a
//! 429 does not (the dependency is healthy and asks to slow down). The
//! `Retry-After` of the response, in either form (`120` or an HTTP-date),
//! reaches the pipeline with the error: the retry waits at least that long
//! and the pipeline's [`Cooldown`](crate::Cooldown), if any, pauses every
//! call for that long. This holds with or without a classifier: a
//! classifier of your own decides the kind, the response's hint is added
//! when it gives none. Every other response (2xx, 3xx, and the 4xx a retry
//! cannot fix) is returned as is, as reqwest itself does; so is a status of
//! 600 to 999, which reqwest does not call an error, but the pipeline
//! records it as the failure `classify_status` judges it (not retried), as
//! `SeawallMiddleware` does.
//!
//! # Timeouts
//! Each attempt's request timeout is the time left before the attempt's
//! deadline ([`Context::remaining`]), or the request's own timeout when
//! that is shorter; so one budget spans every retry. A request timeout
//! takes the place of the client's (`ClientBuilder::timeout`), which
//! reqwest does not let the adapter read: with a pipeline that has a
//! deadline, set the timeout on the request (`RequestBuilder::timeout`) or
//! give the pipeline an attempt timeout; without a deadline the request is
//! sent as it is and the client's timeout holds.
//!
//! # Bodies
//! Each attempt sends its own copy of the request (`Request::try_clone`). A
//! streaming body cannot be copied: with a pipeline that may make more than
//! one attempt (a retry or hedging, see
//! [`Pipeline::may_attempt_more_than_once`]) or that has a [policy written
//! in code](crate::custom) (which may run its attempt again), the call
//! fails at once with [`SendError::BodyNotCloneable`], nothing sent; any
//! other pipeline sends it once.

use std::future::Future;

use reqwest::{Client, Request, RequestBuilder, Response, StatusCode};

use crate::classify::Verdict;
use crate::context::Context;
use crate::error::{Error, Rejection};
use crate::http::classify_status;
use crate::pipeline::{Handles, Judged, Pipeline};

#[cfg(feature = "reqwest-middleware")]
mod middleware;
#[cfg(feature = "reqwest-middleware")]
pub use middleware::SeawallMiddleware;

mod sealed {
    pub trait Sealed {}
    impl Sealed for reqwest::RequestBuilder {}
}

/// Sends a reqwest request through a pipeline. Implemented by
/// `reqwest::RequestBuilder`; see the [module docs](self).
pub trait SendThrough: sealed::Sealed {
    /// Builds the request and sends it through `pipeline`: one copy of the
    /// request per attempt, each with the time left as its timeout, each
    /// response judged by its status.
    ///
    /// # Errors
    /// [`SendError::Build`] when the request cannot be built,
    /// [`SendError::BodyNotCloneable`] when its body is a stream and the
    /// pipeline may run it more than once (see [Bodies](self#bodies)),
    /// [`SendError::Pipeline`]
    /// when the call through the pipeline fails.
    fn send_through<K>(
        self,
        pipeline: &Pipeline<K>,
    ) -> impl Future<Output = Result<Response, SendError>> + Send
    where
        K: Handles<Response, reqwest::Error>;
}

impl SendThrough for RequestBuilder {
    async fn send_through<K>(self, pipeline: &Pipeline<K>) -> Result<Response, SendError>
    where
        K: Handles<Response, reqwest::Error>,
    {
        let (client, request) = self.build_split();
        let request = request.map_err(SendError::Build)?;
        let copy = request.try_clone();
        if copy.is_none() && pipeline.may_run_operation_more_than_once() {
            return Err(SendError::BodyNotCloneable);
        }
        let mut first = Some(request);
        pipeline
            .drive_async(crate::pipeline::Plain, |ctx| {
                // The first attempt sends the request itself; later ones
                // (which exist only when it could be copied) send copies.
                let request = first
                    .take()
                    .or_else(|| copy.as_ref().and_then(Request::try_clone))
                    .expect("a pipeline that may run its operation again has a copy");
                attempt(client.clone(), request, ctx)
            })
            .await
            .map_err(SendError::Pipeline)
    }
}

/// Gives `request` the time left before the attempt's deadline as its
/// timeout, or keeps its own when that is shorter.
fn limit_to_deadline(request: &mut Request, ctx: &Context) {
    if let Some(left) = ctx.remaining() {
        let timeout = request.timeout_mut();
        *timeout = Some(timeout.map_or(left, |own| own.min(left)));
    }
}

async fn attempt(
    client: Client,
    mut request: Request,
    ctx: Context,
) -> Judged<Response, reqwest::Error> {
    limit_to_deadline(&mut request, &ctx);
    let response = match client.execute(request).await {
        Ok(response) => response,
        Err(e) => {
            return Judged {
                result: Err(e),
                verdict: None,
            }
        }
    };
    let verdict = classify_response(&response);
    let result = match verdict {
        // A retryable status (408, 429, 5xx) or a failure becomes reqwest's
        // status error, if reqwest has one for it; with its verdict, and so
        // its `Retry-After`.
        Some(v) if v.is_retryable() || v.is_failure() => response.error_for_status(),
        _ => Ok(response),
    };
    // A response kept as is goes with its verdict too: a status reqwest does
    // not call an error (600 and up) is still recorded as a failure.
    Judged { result, verdict }
}

/// Judges a response by its status and `Retry-After` header, as
/// [`classify_status`] does: `None` for a success, the verdict otherwise.
/// It is how [`SendThrough::send_through`] judges every response, and the
/// default of `SeawallMiddleware` (feature `reqwest-middleware`).
pub fn classify_response(response: &Response) -> Option<Verdict> {
    classify_status(response.status(), response.headers())
}

/// Judges a `reqwest::Error`, for `.classify(seawall::reqwest::classify)`:
///
/// | error | verdict |
/// | --- | --- |
/// | a status error | as [`classify_status`] (408, 429, 5xx retry; other 4xx abort) |
/// | the request could not be built, too many redirects | [`Verdict::abort`] |
/// | connect, timeout, sending the request | [`Verdict::retry`] |
/// | reading or decoding the body | [`Verdict::failure`] |
/// | anything else | [`Verdict::retry`] |
///
/// # Examples
/// ```
/// use seawall::{Pipeline, Retry};
///
/// let pipeline = Pipeline::builder("search-api")
///     .retry(Retry::constant(std::time::Duration::from_millis(50)))
///     .classify(seawall::reqwest::classify)
///     .build()?;
/// # let _ = pipeline;
/// # Ok::<_, seawall::ConfigError>(())
/// ```
pub fn classify(error: &reqwest::Error) -> Verdict {
    if let Some(status) = error.status() {
        return classify_status(status, &::http::HeaderMap::new()).unwrap_or(Verdict::failure());
    }
    if error.is_builder() || error.is_redirect() {
        Verdict::abort()
    } else if error.is_body() || error.is_decode() {
        Verdict::failure()
    } else {
        Verdict::retry()
    }
}

/// The error of [`SendThrough::send_through`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The request could not be built (an invalid URL or header); nothing
    /// was sent.
    #[error("request could not be built: {0}")]
    Build(#[source] reqwest::Error),
    /// The request's body is a stream, which cannot be sent twice, and the
    /// pipeline may make more than one attempt (a retry or hedging) or has
    /// a policy written in code (which may run its attempt again); nothing
    /// was sent. Give the request a body made of bytes, or send it through
    /// a pipeline without retry or hedging.
    #[error(
        "request body is a stream and cannot be sent once per attempt: \
         buffer it, or use a pipeline without retry, hedging or policies written in code"
    )]
    BodyNotCloneable,
    /// The call through the pipeline failed: reqwest's error (typed, in
    /// [`Error::Operation`] or [`Error::RetryExhausted`]), a timeout, a
    /// rejection by a policy, or a store failure.
    #[error(transparent)]
    Pipeline(Error<reqwest::Error>),
}

impl SendError {
    /// reqwest's error, if this error carries one.
    pub fn reqwest_error(&self) -> Option<&reqwest::Error> {
        match self {
            SendError::Build(e) => Some(e),
            SendError::Pipeline(e) => e.operation_error(),
            SendError::BodyNotCloneable => None,
        }
    }

    /// The status of the last response, when the call failed on one (a 503
    /// after the retries, say).
    pub fn status(&self) -> Option<StatusCode> {
        self.reqwest_error().and_then(reqwest::Error::status)
    }

    /// The pipeline's error, if the call went through the pipeline.
    pub fn pipeline_error(&self) -> Option<&Error<reqwest::Error>> {
        match self {
            SendError::Pipeline(e) => Some(e),
            _ => None,
        }
    }

    /// Consumes the error and returns the pipeline's error, if any.
    pub fn into_pipeline_error(self) -> Option<Error<reqwest::Error>> {
        match self {
            SendError::Pipeline(e) => Some(e),
            _ => None,
        }
    }

    /// The rejection, when a policy refused the call (nothing was sent) or
    /// one of its retries (a retry budget with no token left, a circuit the
    /// earlier attempts opened: they were sent).
    pub fn rejection(&self) -> Option<&Rejection> {
        self.pipeline_error().and_then(Error::rejection)
    }

    /// `true` when a policy refused the call or one of its retries; see
    /// [`rejection`](Self::rejection).
    pub fn is_rejected(&self) -> bool {
        self.rejection().is_some()
    }

    /// `true` when the call or an attempt ran out of time, by the
    /// pipeline's deadline or by the request's timeout.
    pub fn is_timeout(&self) -> bool {
        self.pipeline_error().is_some_and(Error::is_timeout)
            || self.reqwest_error().is_some_and(reqwest::Error::is_timeout)
    }
}

impl From<Error<reqwest::Error>> for SendError {
    fn from(e: Error<reqwest::Error>) -> Self {
        SendError::Pipeline(e)
    }
}
