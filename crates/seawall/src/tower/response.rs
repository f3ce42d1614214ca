//! HTTP answers for failed calls (features `tower` and `http`): load
//! shedding for servers without a hand-written error handler.

use std::time::Duration;

use http::header::RETRY_AFTER;
use http::{HeaderValue, Response, StatusCode};

use super::{Fallback, ServiceError};
use crate::error::{Error, RejectionReason};

/// The HTTP answer to a failed call, with an empty body:
///
/// | failure | status | `Retry-After` |
/// | --- | --- | --- |
/// | rate limited | 429 Too Many Requests | the limiter's wait |
/// | any other rejection (circuit open, bulkhead full, cooldown, retry budget) | 503 Service Unavailable | the policy's wait, when it knows one |
/// | the state store failed | 503 Service Unavailable | 1 |
/// | the call or an attempt timed out | 504 Gateway Timeout | none |
/// | the inner service failed | 500 Internal Server Error | none |
///
/// Every 429 and 503 carries a `Retry-After` in whole seconds, rounded up,
/// at least 1 (a bulkhead knows no wait: 1).
///
/// # Examples
/// ```
/// use seawall::tower::{error_response, ServiceError};
/// use seawall::{Error, Rejection, RejectionReason};
/// use std::time::Duration;
///
/// let limited = Rejection::new(RejectionReason::RateLimited, Some(Duration::from_millis(1500)));
/// let error: ServiceError<()> = Error::Rejected(limited).into();
/// let response: http::Response<String> = error_response(&error);
/// assert_eq!(response.status(), 429);
/// assert_eq!(response.headers()["retry-after"], "2");
/// ```
pub fn error_response<B: Default, E>(error: &ServiceError<E>) -> Response<B> {
    let (status, retry_after) = match error.pipeline_error() {
        Some(Error::Rejected(r)) => {
            let status = match r.reason {
                RejectionReason::RateLimited => StatusCode::TOO_MANY_REQUESTS,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            (status, Some(r.retry_after.unwrap_or(Duration::ZERO)))
        }
        Some(Error::Store(_)) => (StatusCode::SERVICE_UNAVAILABLE, Some(Duration::ZERO)),
        Some(Error::Timeout(_)) => (StatusCode::GATEWAY_TIMEOUT, None),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, None),
    };
    let mut response = Response::new(B::default());
    *response.status_mut() = status;
    if let Some(wait) = retry_after {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(whole_seconds(wait)));
    }
    response
}

/// `wait` in whole seconds, rounded up (saturating: the longest wait is
/// `u64::MAX` seconds), at least 1.
fn whole_seconds(wait: Duration) -> u64 {
    let seconds = wait
        .as_secs()
        .saturating_add(u64::from(wait.subsec_nanos() > 0));
    seconds.max(1)
}

/// The fallback of
/// [`PipelineLayer::error_responses`](super::PipelineLayer::error_responses):
/// every failed call is answered by [`error_response`]; the service's error
/// is the inner service's own (`Infallible` for an axum router).
#[derive(Debug, Clone, Copy, Default)]
pub struct ErrorResponses;

impl<B: Default, E> Fallback<Response<B>, E> for ErrorResponses {
    type Error = E;

    fn not_ready(&self, error: E) -> E {
        error
    }

    fn fall_back(&self, error: ServiceError<E>) -> Result<Response<B>, E> {
        Ok(error_response(&error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Rejection, TimeoutError, TimeoutScope};

    fn answer(error: Error<&'static str>) -> Response<()> {
        error_response(&ServiceError::Pipeline(error))
    }

    fn retry_after(r: &Response<()>) -> Option<&str> {
        r.headers().get(RETRY_AFTER).map(|v| v.to_str().unwrap())
    }

    #[test]
    fn rejections_are_429_or_503_with_retry_after() {
        let limited = answer(Error::Rejected(Rejection::new(
            RejectionReason::RateLimited,
            Some(Duration::from_secs(7)),
        )));
        assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(retry_after(&limited), Some("7"));
        let open = answer(Error::Rejected(Rejection::new(
            RejectionReason::CircuitOpen,
            Some(Duration::from_millis(30_001)),
        )));
        assert_eq!(open.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry_after(&open), Some("31"));
        let full = answer(Error::Rejected(Rejection::new(
            RejectionReason::BulkheadFull,
            None,
        )));
        assert_eq!(full.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry_after(&full), Some("1"));
    }

    #[test]
    fn timeouts_and_inner_errors() {
        let late = answer(Error::Timeout(TimeoutError::new(
            TimeoutScope::Overall,
            Duration::from_secs(1),
            1,
        )));
        assert_eq!(late.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(retry_after(&late), None);
        let failed = answer(Error::Operation("boom"));
        assert_eq!(failed.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let not_ready: Response<()> = error_response(&ServiceError::NotReady("down"));
        assert_eq!(not_ready.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(whole_seconds(Duration::ZERO), 1);
        assert_eq!(whole_seconds(Duration::from_millis(1)), 1);
        assert_eq!(whole_seconds(Duration::from_secs(2)), 2);
        assert_eq!(whole_seconds(Duration::from_millis(2001)), 3);
    }
}
