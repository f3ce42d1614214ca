//! The HTTP client both groups use, its error type, and how seawall judges
//! those errors.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::header::RETRY_AFTER;
use hyper::{Request, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use seawall::Verdict;

use crate::scenario::{Group, Scenario};
use crate::service::{Hits, GROUP_HEADER};

/// Why a request did not bring back an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FetchError {
    /// The service answered with an error status.
    Status {
        /// The status code.
        status: StatusCode,
        /// The `Retry-After` header, when the service sent one.
        retry_after: Option<Duration>,
    },
    /// No answer within the timeout.
    Timeout(Duration),
    /// The connection failed or broke.
    Transport(String),
    /// The fallback had no earlier answer to serve.
    NoCachedAnswer,
}

impl FetchError {
    /// A short, stable name of the error, for the summary.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            FetchError::Status { status, .. } => match status.as_u16() {
                429 => "http_429",
                503 => "http_503",
                500..=599 => "http_5xx",
                _ => "http_4xx",
            },
            FetchError::Timeout(_) => "timeout",
            FetchError::Transport(_) => "transport",
            FetchError::NoCachedAnswer => "no_cached_answer",
        }
    }
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchError::Status { status, .. } => write!(f, "service answered {status}"),
            FetchError::Timeout(after) => write!(f, "no answer within {after:?}"),
            FetchError::Transport(e) => write!(f, "connection failed: {e}"),
            FetchError::NoCachedAnswer => f.write_str("no cached answer to fall back on"),
        }
    }
}

impl std::error::Error for FetchError {}

/// How seawall should treat a [`FetchError`]: server errors, timeouts and
/// broken connections are worth another try; a 429 or 503 with
/// `Retry-After` is too, but not before the service said, and the hint
/// opens the pipeline's cooldown for every caller; any other 4xx is our
/// own mistake and retrying would not help.
pub(crate) fn classify(error: &FetchError) -> Verdict {
    match error {
        FetchError::Status {
            status,
            retry_after,
        } => {
            let verdict = if *status == StatusCode::TOO_MANY_REQUESTS {
                // healthy but busy: retried later, not held against it
                Verdict::throttled()
            } else if status.is_server_error() {
                Verdict::retry()
            } else {
                Verdict::abort()
            };
            match retry_after {
                Some(after) => verdict.with_retry_after(*after),
                None => verdict,
            }
        }
        FetchError::Timeout(_) | FetchError::Transport(_) => Verdict::retry(),
        FetchError::NoCachedAnswer => Verdict::abort(),
    }
}

/// A pooled HTTP/1 client for one group, calling the flaky service.
#[derive(Debug, Clone)]
pub(crate) struct HttpClient {
    inner: Client<HttpConnector, Empty<Bytes>>,
    uri: Uri,
    /// Sent in the [`GROUP_HEADER`]: who is calling.
    label: &'static str,
    /// Where the client counts the requests it sends, if anywhere.
    counted: Option<(Arc<Hits>, Group, Scenario)>,
}

impl HttpClient {
    /// A client of `group` for the service at `addr`.
    pub(crate) fn new(addr: SocketAddr, group: Group) -> Self {
        Self::labelled(addr, group.name())
    }

    /// A client for the service at `addr` that introduces itself as `label`.
    pub(crate) fn labelled(addr: SocketAddr, label: &'static str) -> Self {
        let uri = format!("http://{addr}/quote")
            .parse()
            .expect("a socket address makes a valid URI");
        let inner = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build_http();
        HttpClient {
            inner,
            uri,
            label,
            counted: None,
        }
    }

    /// Counts every request the client sends in `hits`, as `group`'s,
    /// under the phase of `scenario` it is sent in (for a process that does
    /// not run the service, and so cannot count what reaches it).
    pub(crate) fn counting(mut self, hits: Arc<Hits>, group: Group, scenario: Scenario) -> Self {
        self.counted = Some((hits, group, scenario));
        self
    }

    /// GETs a quote, giving up after `timeout`.
    ///
    /// # Errors
    /// An error status, a timeout or a broken connection.
    pub(crate) async fn get(&self, timeout: Duration) -> Result<String, FetchError> {
        let request = Request::get(self.uri.clone())
            .header(GROUP_HEADER, self.label)
            .body(Empty::new())
            .expect("a GET with a valid URI is a valid request");
        if let Some((hits, group, scenario)) = &self.counted {
            hits.add(*group, scenario.phase_at(Instant::now()));
        }
        let exchange = async {
            let response = self.inner.request(request).await.map_err(transport)?;
            let status = response.status();
            let retry_after = response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(transport)?
                .to_bytes();
            if status.is_success() {
                Ok(String::from_utf8_lossy(&body).trim_end().to_owned())
            } else {
                Err(FetchError::Status {
                    status,
                    retry_after,
                })
            }
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or(Err(FetchError::Timeout(timeout)))
    }
}

fn transport(e: impl fmt::Display) -> FetchError {
    FetchError::Transport(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use seawall::VerdictKind;

    fn status(code: u16, retry_after: Option<u64>) -> FetchError {
        FetchError::Status {
            status: StatusCode::from_u16(code).unwrap(),
            retry_after: retry_after.map(Duration::from_secs),
        }
    }

    #[test]
    fn server_errors_and_throttling_are_retried_with_their_hint() {
        let v = classify(&status(429, Some(2)));
        assert_eq!(
            (v.kind(), v.retry_after()),
            (VerdictKind::Throttled, Some(Duration::from_secs(2)))
        );
        assert!(v.is_retryable() && !v.is_failure());
        let v = classify(&status(503, None));
        assert_eq!((v.kind(), v.retry_after()), (VerdictKind::Retry, None));
        assert!(classify(&FetchError::Timeout(Duration::from_millis(5))).is_retryable());
        assert!(classify(&FetchError::Transport("reset".into())).is_retryable());
    }

    #[test]
    fn client_errors_are_not_retried() {
        assert_eq!(classify(&status(404, None)).kind(), VerdictKind::Abort);
        assert_eq!(status(404, None).kind(), "http_4xx");
    }
}
