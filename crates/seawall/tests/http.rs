//! The HTTP helpers on arbitrary input: no header value, however broken,
//! makes them panic or ask for more than `MAX_RETRY_AFTER`.
#![cfg(feature = "http")]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderValue, StatusCode};
use proptest::prelude::*;
use seawall::http::{classify_status, parse_retry_after, retry_after, MAX_RETRY_AFTER};
use seawall::VerdictKind;

/// Any instant from 1970 to the year 9999, to the second.
fn instant() -> impl Strategy<Value = SystemTime> {
    (0u64..253_402_300_799).prop_map(|s| UNIX_EPOCH + Duration::from_secs(s))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64), now in instant()) {
        if let Some(wait) = parse_retry_after(&bytes, now) {
            prop_assert!(wait <= MAX_RETRY_AFTER);
        }
    }

    #[test]
    fn arbitrary_header_values_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..64),
        code in 100u16..1000,
    ) {
        // Only the bytes a header value may hold get this far.
        if let Ok(value) = HeaderValue::from_bytes(&bytes) {
            let mut headers = HeaderMap::new();
            headers.insert(RETRY_AFTER, value);
            let status = StatusCode::from_u16(code).unwrap();
            let verdict = classify_status(status, &headers);
            if let Some(hint) = verdict.and_then(|v| v.retry_after()) {
                prop_assert!(hint > Duration::ZERO && hint <= MAX_RETRY_AFTER);
                prop_assert!(code == 429 || code == 503);
            }
            prop_assert!(retry_after(&headers).is_none_or(|w| w <= MAX_RETRY_AFTER));
        }
    }

    #[test]
    fn text_that_looks_like_a_header_never_panics(text in "[ -~]{0,40}", now in instant()) {
        let _ = parse_retry_after(text.as_bytes(), now);
    }

    #[test]
    fn delta_seconds_are_read_and_capped(seconds in any::<u64>(), pad in "[ \t]{0,3}", now in instant()) {
        let value = format!("{pad}{seconds}{pad}");
        prop_assert_eq!(
            parse_retry_after(value, now),
            Some(Duration::from_secs(seconds).min(MAX_RETRY_AFTER))
        );
    }

    #[test]
    fn negative_and_fractional_seconds_give_no_hint(seconds in any::<u32>(), frac in 0u32..1000) {
        let now = UNIX_EPOCH;
        prop_assert_eq!(parse_retry_after(format!("-{seconds}"), now), None);
        prop_assert_eq!(parse_retry_after(format!("{seconds}.{frac}"), now), None);
    }

    #[test]
    fn dates_are_read_relative_to_now(date in instant(), now in instant()) {
        let value = httpdate::fmt_http_date(date);
        let expected = date.duration_since(now).unwrap_or(Duration::ZERO).min(MAX_RETRY_AFTER);
        prop_assert_eq!(parse_retry_after(value, now), Some(expected));
    }

    #[test]
    fn every_status_has_one_verdict(code in 100u16..1000) {
        let verdict = classify_status(StatusCode::from_u16(code).unwrap(), &HeaderMap::new());
        let expected = match code {
            100..=399 => None,
            429 => Some(VerdictKind::Throttled),
            408 | 500..=599 => Some(VerdictKind::Retry),
            400..=499 => Some(VerdictKind::Abort),
            _ => Some(VerdictKind::Failure),
        };
        prop_assert_eq!(verdict.map(|v| v.kind()), expected);
    }
}

#[test]
fn a_429_with_a_date_gets_a_hint_from_now() {
    let mut headers = HeaderMap::new();
    let later = SystemTime::now() + Duration::from_secs(600);
    headers.insert(
        RETRY_AFTER,
        HeaderValue::from_str(&httpdate::fmt_http_date(later)).unwrap(),
    );
    let verdict = classify_status(StatusCode::TOO_MANY_REQUESTS, &headers).unwrap();
    assert_eq!(verdict.kind(), VerdictKind::Throttled);
    let hint = verdict.retry_after().unwrap();
    assert!(
        hint > Duration::from_secs(595) && hint <= Duration::from_secs(600),
        "{hint:?}"
    );
}

#[test]
fn a_503_with_a_past_date_gets_no_hint() {
    let mut headers = HeaderMap::new();
    headers.insert(
        RETRY_AFTER,
        HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT"),
    );
    let verdict = classify_status(StatusCode::SERVICE_UNAVAILABLE, &headers).unwrap();
    assert_eq!(verdict.retry_after(), None);
    assert_eq!(retry_after(&headers), Some(Duration::ZERO));
}

#[test]
fn the_first_of_several_retry_after_headers_counts() {
    let mut headers = HeaderMap::new();
    headers.append(RETRY_AFTER, HeaderValue::from_static("5"));
    headers.append(RETRY_AFTER, HeaderValue::from_static("500"));
    assert_eq!(retry_after(&headers), Some(Duration::from_secs(5)));
}
