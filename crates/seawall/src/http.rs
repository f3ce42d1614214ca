//! HTTP classification helpers (feature `http`): which statuses are worth a
//! retry, and how long a server asked us to wait.
//!
//! | status | verdict |
//! | --- | --- |
//! | 1xx, 2xx, 3xx | success (`None`) |
//! | 408 Request Timeout | [`Verdict::retry`] |
//! | 429 Too Many Requests | [`Verdict::throttled`] (retried, not a failure of the dependency), with the `Retry-After` hint if any |
//! | 503 Service Unavailable | [`Verdict::retry`], with the `Retry-After` hint if any |
//! | other 5xx | [`Verdict::retry`] |
//! | other 4xx | [`Verdict::abort`]: the request is wrong, the server is fine |
//! | anything else (600 to 999) | [`Verdict::failure`]: recorded, not retried |
//!
//! A retry-after hint makes the retry wait at least that long and opens the
//! pipeline's [`Cooldown`](crate::Cooldown) when there is one. `Retry-After`
//! is read in both of its forms, delta-seconds (`120`) and HTTP-date
//! (`Wed, 21 Oct 2015 07:28:00 GMT`, taken relative to the local system
//! time). A value that is neither (negative, fractional, garbage, not
//! ASCII) gives no hint; a date in the past gives a zero wait; a wait longer
//! than [`MAX_RETRY_AFTER`] is cut to it.
//!
//! ```
//! use http::{HeaderMap, HeaderValue, StatusCode};
//! use seawall::http::classify_status;
//! use seawall::{Verdict, VerdictKind};
//! use std::time::Duration;
//!
//! let mut headers = HeaderMap::new();
//! assert_eq!(classify_status(StatusCode::OK, &headers), None);
//! assert_eq!(classify_status(StatusCode::NOT_FOUND, &headers), Some(Verdict::abort()));
//! assert_eq!(classify_status(StatusCode::BAD_GATEWAY, &headers), Some(Verdict::retry()));
//!
//! headers.insert(http::header::RETRY_AFTER, HeaderValue::from_static("30"));
//! let busy = classify_status(StatusCode::TOO_MANY_REQUESTS, &headers).unwrap();
//! assert_eq!(busy.kind(), VerdictKind::Throttled);
//! assert_eq!(busy.retry_after(), Some(Duration::from_secs(30)));
//! ```

use std::time::{Duration, SystemTime};

use http::header::RETRY_AFTER;
use http::{HeaderMap, Response, StatusCode};

use crate::classify::Verdict;

pub use crate::classify::MAX_RETRY_AFTER;

/// Judges an HTTP status (and its `Retry-After` header): `None` for a
/// success, otherwise the verdict from the table in the [module
/// docs](self).
///
/// # Examples
/// ```
/// use http::{HeaderMap, StatusCode};
/// use seawall::http::classify_status;
/// use seawall::Verdict;
///
/// let none = HeaderMap::new();
/// assert_eq!(classify_status(StatusCode::CREATED, &none), None);
/// assert_eq!(classify_status(StatusCode::REQUEST_TIMEOUT, &none), Some(Verdict::retry()));
/// assert_eq!(classify_status(StatusCode::BAD_REQUEST, &none), Some(Verdict::abort()));
/// ```
pub fn classify_status(status: StatusCode, headers: &HeaderMap) -> Option<Verdict> {
    let code = status.as_u16();
    let verdict = match code {
        100..=399 => return None,
        408 => Verdict::retry(),
        429 | 503 => {
            // 429: the dependency is fine and asks us to slow down; 503: it is not.
            let verdict = if code == 429 {
                Verdict::throttled()
            } else {
                Verdict::retry()
            };
            return Some(match retry_after(headers) {
                Some(wait) if !wait.is_zero() => verdict.with_retry_after(wait),
                _ => verdict,
            });
        }
        400..=499 => Verdict::abort(),
        500..=599 => Verdict::retry(),
        _ => Verdict::failure(),
    };
    Some(verdict)
}

/// Judges an HTTP response by its status and headers; see
/// [`classify_status`]. Fits `PipelineLayer::classify_response` (feature
/// `tower`) as is.
///
/// # Examples
/// ```
/// use seawall::http::classify_response;
/// use seawall::Verdict;
///
/// let unavailable = http::Response::builder().status(503).body(()).unwrap();
/// assert_eq!(classify_response(&unavailable), Some(Verdict::retry()));
/// assert_eq!(classify_response(&http::Response::new(())), None);
/// ```
pub fn classify_response<B>(response: &Response<B>) -> Option<Verdict> {
    classify_status(response.status(), response.headers())
}

/// The wait asked for by the `Retry-After` header (the first one, if there
/// are several), relative to now; see [`parse_retry_after`].
///
/// # Examples
/// ```
/// use http::{header::RETRY_AFTER, HeaderMap, HeaderValue};
/// use seawall::http::retry_after;
/// use std::time::Duration;
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(retry_after(&headers), None);
/// headers.insert(RETRY_AFTER, HeaderValue::from_static("120"));
/// assert_eq!(retry_after(&headers), Some(Duration::from_secs(120)));
/// headers.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
/// assert_eq!(retry_after(&headers), None);
/// ```
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?;
    parse_retry_after(value, SystemTime::now())
}

/// Parses a `Retry-After` value, in either form, into a wait from `now`.
///
/// - delta-seconds (`"120"`, leading and trailing spaces allowed): that many
///   seconds;
/// - an HTTP-date (IMF-fixdate, RFC 850 or asctime, as `httpdate` reads
///   them): the time from `now` to that date, zero when it is past;
/// - anything else (`"-5"`, `"1.5"`, `"+3"`, an empty or non-ASCII value,
///   an impossible date): `None`.
///
/// The result is at most [`MAX_RETRY_AFTER`]. Never panics, whatever the
/// bytes.
///
/// # Examples
/// ```
/// use seawall::http::{parse_retry_after, MAX_RETRY_AFTER};
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
///
/// let now = UNIX_EPOCH + Duration::from_secs(1_445_412_000); // 2015-10-21 07:20:00 UTC
/// assert_eq!(parse_retry_after("90", now), Some(Duration::from_secs(90)));
/// assert_eq!(
///     parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now),
///     Some(Duration::from_secs(480)),
/// );
/// assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now), Some(Duration::ZERO));
/// assert_eq!(parse_retry_after("86400000", now), Some(MAX_RETRY_AFTER));
/// assert_eq!(parse_retry_after("-1", now), None);
/// ```
pub fn parse_retry_after(value: impl AsRef<[u8]>, now: SystemTime) -> Option<Duration> {
    let text = std::str::from_utf8(value.as_ref()).ok()?;
    let text = text.trim_matches(|c| c == ' ' || c == '\t');
    if text.is_empty() {
        return None;
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        // All digits, so parsing only fails on overflow: a wait that long
        // is capped like any other long wait.
        let seconds = text.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(seconds).min(MAX_RETRY_AFTER));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    let wait = at.duration_since(now).unwrap_or(Duration::ZERO);
    Some(wait.min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::VerdictKind;
    use http::HeaderValue;
    use std::time::UNIX_EPOCH;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn with_retry_after(value: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_static(value));
        h
    }

    #[test]
    fn statuses_map_to_the_table() {
        let none = HeaderMap::new();
        let kind = |code: u16| {
            classify_status(StatusCode::from_u16(code).unwrap(), &none).map(|v| v.kind())
        };
        for code in [100, 101, 200, 204, 301, 304, 399] {
            assert_eq!(kind(code), None, "{code}");
        }
        for code in [408, 500, 502, 503, 504, 599] {
            assert_eq!(kind(code), Some(VerdictKind::Retry), "{code}");
        }
        assert_eq!(kind(429), Some(VerdictKind::Throttled));
        for code in [400, 401, 403, 404, 409, 422, 499] {
            assert_eq!(kind(code), Some(VerdictKind::Abort), "{code}");
        }
        for code in [600, 999] {
            assert_eq!(kind(code), Some(VerdictKind::Failure), "{code}");
        }
    }

    #[test]
    fn hints_only_on_429_and_503() {
        let h = with_retry_after("7");
        let hint = |code: u16| {
            classify_status(StatusCode::from_u16(code).unwrap(), &h).and_then(|v| v.retry_after())
        };
        assert_eq!(hint(429), Some(Duration::from_secs(7)));
        assert_eq!(hint(503), Some(Duration::from_secs(7)));
        assert_eq!(hint(500), None);
        assert_eq!(hint(502), None);
        assert_eq!(hint(200), None);
    }

    #[test]
    fn zero_and_garbage_hints_are_dropped() {
        for value in ["0", "garbage", "-3", ""] {
            let v = classify_status(StatusCode::SERVICE_UNAVAILABLE, &with_retry_after(value));
            assert_eq!(v, Some(Verdict::retry()), "{value:?}");
        }
    }

    #[test]
    fn delta_seconds() {
        let now = at(0);
        assert_eq!(parse_retry_after("0", now), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after(" 120\t", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after("007", now), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after("3600", now), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("3601", now), Some(MAX_RETRY_AFTER));
        assert_eq!(
            parse_retry_after("99999999999999999999999999", now),
            Some(MAX_RETRY_AFTER)
        );
        for bad in ["-1", "+1", "1.5", "1e3", "12 s", "0x10", " ", "", "١٢"] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad:?}");
        }
    }

    #[test]
    fn http_dates_in_all_three_forms() {
        // 1994-11-06 08:49:37 UTC
        let date = at(784_111_777);
        let now = date - Duration::from_secs(60);
        for form in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            assert_eq!(
                parse_retry_after(form, now),
                Some(Duration::from_secs(60)),
                "{form}"
            );
        }
    }

    #[test]
    fn past_far_and_impossible_dates() {
        let now = at(784_111_777);
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:48:37 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(
            parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now),
            Some(MAX_RETRY_AFTER)
        );
        assert_eq!(
            parse_retry_after("Sun, 32 Nov 1994 08:49:37 GMT", now),
            None
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 25:49:37 GMT", now),
            None
        );
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994", now), None);
    }

    #[test]
    fn non_utf8_bytes_give_no_hint() {
        assert_eq!(parse_retry_after([0xff, 0xfe, b'1'], at(0)), None);
        let value = HeaderValue::from_bytes(&[b'1', 0xe9]).unwrap();
        assert_eq!(parse_retry_after(&value, at(0)), None);
    }

    #[test]
    fn dates_relative_to_now() {
        let in_two_minutes = SystemTime::now() + Duration::from_secs(120);
        let mut h = HeaderMap::new();
        h.insert(
            RETRY_AFTER,
            HeaderValue::from_str(&httpdate::fmt_http_date(in_two_minutes)).unwrap(),
        );
        let wait = retry_after(&h).unwrap();
        // The date has a one-second resolution.
        assert!(
            wait > Duration::from_secs(115) && wait <= Duration::from_secs(120),
            "{wait:?}"
        );
    }
}
