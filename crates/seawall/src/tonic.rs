//! gRPC helpers for tonic (feature `tonic`): which status codes are worth a
//! retry, how long the server asked us to wait, and each attempt's
//! `grpc-timeout` from the time left.
//!
//! | code | verdict |
//! | --- | --- |
//! | `UNAVAILABLE`, `UNKNOWN`, `DEADLINE_EXCEEDED`, `ABORTED`, `CANCELLED` | [`Verdict::retry`], with the server's pushback if any |
//! | `RESOURCE_EXHAUSTED` | [`Verdict::throttled`] (retried, not a failure of the dependency), with the server's pushback if any |
//! | `INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`, `PERMISSION_DENIED`, `UNAUTHENTICATED`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `UNIMPLEMENTED` | [`Verdict::abort`]: the request is wrong, the server is fine |
//! | `INTERNAL`, `DATA_LOSS`, and `OK` as an error | [`Verdict::failure`]: recorded, not retried |
//!
//! The table follows the HTTP one of `seawall::http` (feature `http`):
//! `UNAVAILABLE` is gRPC's 503, `RESOURCE_EXHAUSTED` its 429, the codes that
//! blame the request its 4xx. A `CANCELLED` that reaches the pipeline comes
//! from the other side (a server or proxy that dropped the call): the
//! caller's own cancellation drops the pipeline's future with it.
//!
//! # Pushback
//!
//! gRPC's retry design lets a server say when to try again in the trailer
//! [`RETRY_PUSHBACK`] (`grpc-retry-pushback-ms`): a number of milliseconds,
//! or a negative or unreadable value meaning "do not retry". Like HTTP's
//! `Retry-After`, a wait becomes the verdict's retry-after hint (the retry
//! waits at least that long, and the pipeline's [`Cooldown`](crate::Cooldown)
//! opens), cut to [`MAX_RETRY_AFTER`]; a zero wait gives no hint. "Do not
//! retry" turns a retryable code into [`Verdict::failure`], and
//! `RESOURCE_EXHAUSTED` into [`Verdict::ignore`] (not retried, and still not
//! a failure of the dependency). The trailer is read only on the retryable
//! codes.
//!
//! # Deadlines
//!
//! [`with_deadline`] gives a request the time left before the attempt's
//! deadline ([`Context::remaining`]) as its `grpc-timeout`, or keeps the
//! request's own when that is shorter, so the server stops working on an
//! answer nobody will wait for, and one budget spans every retry.
//!
//! ```
//! use std::time::Duration;
//! use seawall::{Pipeline, Retry, Verdict, VerdictKind};
//! use tonic::{Code, Status};
//!
//! let greeter = Pipeline::builder("greeter")
//!     .timeout(Duration::from_secs(2))
//!     .retry(Retry::exponential(Duration::from_millis(50)).max_attempts(3))
//!     .classify(seawall::tonic::classify)
//!     .build()?;
//! # let _ = greeter;
//!
//! assert_eq!(seawall::tonic::classify(&Status::unavailable("restarting")), Verdict::retry());
//! assert_eq!(seawall::tonic::classify(&Status::not_found("no such user")), Verdict::abort());
//!
//! let mut busy = Status::resource_exhausted("slow down");
//! busy.metadata_mut().insert("grpc-retry-pushback-ms", "250".parse().unwrap());
//! let verdict = seawall::tonic::classify(&busy);
//! assert_eq!(verdict.kind(), VerdictKind::Throttled);
//! assert_eq!(verdict.retry_after(), Some(Duration::from_millis(250)));
//! # Ok::<_, seawall::ConfigError>(())
//! ```
//!
//! A call through the pipeline: the generated client's method takes the
//! request [`with_deadline`] made.
//!
//! ```ignore
//! let reply = greeter
//!     .run(|ctx| {
//!         let mut client = client.clone();
//!         async move {
//!             let request = seawall::tonic::with_deadline(tonic::Request::new(hello()), &ctx);
//!             client.say_hello(request).await
//!         }
//!     })
//!     .await?;
//! ```

use std::time::Duration;

use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Status};

pub use crate::classify::MAX_RETRY_AFTER;
use crate::classify::{Verdict, VerdictKind};
use crate::context::Context;

/// The trailer of gRPC's server pushback: milliseconds to wait before the
/// next attempt, or a negative or unreadable value for "do not retry".
pub const RETRY_PUSHBACK: &str = "grpc-retry-pushback-ms";

/// The header (metadata) carrying a call's timeout.
pub const GRPC_TIMEOUT: &str = "grpc-timeout";

/// What a server's [`RETRY_PUSHBACK`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Pushback {
    /// Wait this long before the next attempt (at most [`MAX_RETRY_AFTER`]).
    After(Duration),
    /// Do not retry: the value was negative or unreadable.
    Stop,
}

/// Judges a `tonic::Status` by its code and pushback, for
/// `.classify(seawall::tonic::classify)`: the verdict from the table in the
/// [module docs](self).
///
/// # Examples
/// ```
/// use seawall::Verdict;
/// use tonic::Status;
///
/// assert_eq!(seawall::tonic::classify(&Status::unavailable("")), Verdict::retry());
/// assert_eq!(seawall::tonic::classify(&Status::invalid_argument("")), Verdict::abort());
/// assert_eq!(seawall::tonic::classify(&Status::data_loss("")), Verdict::failure());
/// ```
pub fn classify(status: &Status) -> Verdict {
    classify_code(status.code(), status.metadata())
}

/// Judges a gRPC status code and the metadata that came with it (its
/// trailers); see [`classify`].
///
/// # Examples
/// ```
/// use seawall::tonic::classify_code;
/// use seawall::{Verdict, VerdictKind};
/// use tonic::metadata::MetadataMap;
/// use tonic::Code;
///
/// let mut trailers = MetadataMap::new();
/// assert_eq!(classify_code(Code::Aborted, &trailers), Verdict::retry());
/// trailers.insert("grpc-retry-pushback-ms", "-1".parse().unwrap());
/// assert_eq!(classify_code(Code::Aborted, &trailers), Verdict::failure());
/// assert_eq!(classify_code(Code::ResourceExhausted, &trailers).kind(), VerdictKind::Ignore);
/// ```
pub fn classify_code(code: Code, metadata: &MetadataMap) -> Verdict {
    let verdict = match code {
        Code::Unavailable
        | Code::Unknown
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::Cancelled => Verdict::retry(),
        Code::ResourceExhausted => Verdict::throttled(),
        Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::Unauthenticated
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unimplemented => return Verdict::abort(),
        Code::Internal | Code::DataLoss | Code::Ok => return Verdict::failure(),
    };
    match retry_pushback(metadata) {
        None => verdict,
        Some(Pushback::After(wait)) if wait.is_zero() => verdict,
        Some(Pushback::After(wait)) => verdict.with_retry_after(wait),
        Some(Pushback::Stop) if verdict.kind() == VerdictKind::Throttled => Verdict::ignore(),
        Some(Pushback::Stop) => Verdict::failure(),
    }
}

/// The server's pushback in `metadata` (the first [`RETRY_PUSHBACK`] value,
/// if there are several); see [`parse_retry_pushback`].
///
/// # Examples
/// ```
/// use seawall::tonic::{retry_pushback, Pushback};
/// use std::time::Duration;
/// use tonic::metadata::MetadataMap;
///
/// let mut trailers = MetadataMap::new();
/// assert_eq!(retry_pushback(&trailers), None);
/// trailers.insert("grpc-retry-pushback-ms", "1500".parse().unwrap());
/// assert_eq!(retry_pushback(&trailers), Some(Pushback::After(Duration::from_millis(1500))));
/// ```
pub fn retry_pushback(metadata: &MetadataMap) -> Option<Pushback> {
    let value = metadata.get(RETRY_PUSHBACK)?;
    Some(parse_retry_pushback(value.as_bytes()))
}

/// Parses a [`RETRY_PUSHBACK`] value: ASCII digits are a wait in
/// milliseconds, cut to [`MAX_RETRY_AFTER`]; anything else (a minus sign,
/// a `+`, spaces, a fraction, an empty or non-ASCII value) is
/// [`Pushback::Stop`], as gRPC's retry design reads it. Never panics,
/// whatever the bytes.
///
/// # Examples
/// ```
/// use seawall::tonic::{parse_retry_pushback, Pushback, MAX_RETRY_AFTER};
/// use std::time::Duration;
///
/// assert_eq!(parse_retry_pushback("250"), Pushback::After(Duration::from_millis(250)));
/// assert_eq!(parse_retry_pushback("99999999999999999999"), Pushback::After(MAX_RETRY_AFTER));
/// assert_eq!(parse_retry_pushback("-1"), Pushback::Stop);
/// assert_eq!(parse_retry_pushback("soon"), Pushback::Stop);
/// ```
pub fn parse_retry_pushback(value: impl AsRef<[u8]>) -> Pushback {
    let value = value.as_ref();
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return Pushback::Stop;
    }
    // All digits, so parsing only fails on overflow: a wait that long is cut
    // like any other long wait.
    let millis = std::str::from_utf8(value)
        .ok()
        .and_then(|text| text.parse::<u64>().ok())
        .unwrap_or(u64::MAX);
    Pushback::After(Duration::from_millis(millis).min(MAX_RETRY_AFTER))
}

/// `request` with the time left before the attempt's deadline as its
/// `grpc-timeout`, or with its own timeout when that is shorter; unchanged
/// when the attempt has no deadline. A `grpc-timeout` that cannot be read
/// is replaced.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use seawall::testing::VirtualClock;
/// use seawall::tonic::{grpc_timeout, with_deadline};
/// use seawall::Context;
///
/// // The context of an attempt with 1.5 s left (a virtual clock stands still).
/// let ctx = Context::builder("greeter")
///     .deadline_in(Duration::from_millis(1500))
///     .clock(VirtualClock::new())
///     .build();
/// let request = with_deadline(tonic::Request::new(()), &ctx);
/// assert_eq!(grpc_timeout(request.metadata()), Some(Duration::from_millis(1500)));
///
/// let mut short = tonic::Request::new(());
/// short.set_timeout(Duration::from_millis(200));
/// let request = with_deadline(short, &ctx);
/// assert_eq!(grpc_timeout(request.metadata()), Some(Duration::from_millis(200)));
/// ```
pub fn with_deadline<T>(mut request: Request<T>, ctx: &Context) -> Request<T> {
    if let Some(left) = ctx.remaining() {
        let own = grpc_timeout(request.metadata());
        if own.is_none_or(|own| left < own) {
            request.set_timeout(left);
        }
    }
    request
}

/// The timeout of a call, read from its [`GRPC_TIMEOUT`] metadata (for a
/// server that bounds its work by its caller's deadline, or a test); see
/// [`parse_grpc_timeout`].
pub fn grpc_timeout(metadata: &MetadataMap) -> Option<Duration> {
    let value = metadata.get(GRPC_TIMEOUT)?;
    parse_grpc_timeout(value.as_bytes())
}

/// Parses a `grpc-timeout` value: one to eight ASCII digits and a unit,
/// `H` (hours), `M` (minutes), `S` (seconds), `m` (milliseconds), `u`
/// (microseconds) or `n` (nanoseconds). Anything else is `None`. Never
/// panics, whatever the bytes.
///
/// # Examples
/// ```
/// use seawall::tonic::parse_grpc_timeout;
/// use std::time::Duration;
///
/// assert_eq!(parse_grpc_timeout("1500000u"), Some(Duration::from_millis(1500)));
/// assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
/// assert_eq!(parse_grpc_timeout("123456789n"), None); // nine digits
/// assert_eq!(parse_grpc_timeout("5s"), None);
/// ```
pub fn parse_grpc_timeout(value: impl AsRef<[u8]>) -> Option<Duration> {
    let (unit, digits) = value.as_ref().split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // At most eight digits: fits a u64 with room to spare.
    let n = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pushback(value: &'static str) -> MetadataMap {
        let mut metadata = MetadataMap::new();
        metadata.insert(RETRY_PUSHBACK, value.parse().unwrap());
        metadata
    }

    const ALL: [Code; 17] = [
        Code::Ok,
        Code::Cancelled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    #[test]
    fn codes_map_to_the_table() {
        let none = MetadataMap::new();
        let kind = |code| classify_code(code, &none).kind();
        for code in ALL {
            let expected = match code {
                Code::Unavailable
                | Code::Unknown
                | Code::DeadlineExceeded
                | Code::Aborted
                | Code::Cancelled => VerdictKind::Retry,
                Code::ResourceExhausted => VerdictKind::Throttled,
                Code::Internal | Code::DataLoss | Code::Ok => VerdictKind::Failure,
                _ => VerdictKind::Abort,
            };
            assert_eq!(kind(code), expected, "{code:?}");
            assert_eq!(classify_code(code, &none).retry_after(), None, "{code:?}");
        }
        // Every code of gRPC (0 to 16) is in the table.
        for (i, code) in ALL.iter().enumerate() {
            assert_eq!(*code as i32, i as i32);
        }
    }

    #[test]
    fn pushback_only_on_retryable_codes() {
        let wait = pushback("300");
        for code in ALL {
            let verdict = classify_code(code, &wait);
            if verdict.is_retryable() {
                assert_eq!(
                    verdict.retry_after(),
                    Some(Duration::from_millis(300)),
                    "{code:?}"
                );
            } else {
                assert_eq!(verdict.retry_after(), None, "{code:?}");
                assert_eq!(
                    verdict,
                    classify_code(code, &MetadataMap::new()),
                    "{code:?}"
                );
            }
        }
        let throttled = classify_code(Code::ResourceExhausted, &wait);
        assert_eq!(
            throttled,
            Verdict::throttled().with_retry_after(Duration::from_millis(300))
        );
    }

    #[test]
    fn stop_means_no_retry_and_keeps_throttling_out_of_failures() {
        for value in ["-1", "-0", "soon", "1.5", "+3", " 3", ""] {
            let stop = pushback(value);
            assert_eq!(
                classify_code(Code::Unavailable, &stop),
                Verdict::failure(),
                "{value:?}"
            );
            assert_eq!(
                classify_code(Code::ResourceExhausted, &stop),
                Verdict::ignore(),
                "{value:?}"
            );
            assert_eq!(
                classify_code(Code::NotFound, &stop),
                Verdict::abort(),
                "{value:?}"
            );
        }
    }

    #[test]
    fn zero_pushback_gives_no_hint() {
        assert_eq!(
            classify_code(Code::Unavailable, &pushback("0")),
            Verdict::retry()
        );
        assert_eq!(
            classify_code(Code::ResourceExhausted, &pushback("000")),
            Verdict::throttled()
        );
    }

    #[test]
    fn pushback_values() {
        assert_eq!(parse_retry_pushback("0"), Pushback::After(Duration::ZERO));
        assert_eq!(
            parse_retry_pushback("007"),
            Pushback::After(Duration::from_millis(7))
        );
        assert_eq!(
            parse_retry_pushback("3600000"),
            Pushback::After(MAX_RETRY_AFTER)
        );
        assert_eq!(
            parse_retry_pushback("3600001"),
            Pushback::After(MAX_RETRY_AFTER)
        );
        assert_eq!(
            parse_retry_pushback("99999999999999999999999999"),
            Pushback::After(MAX_RETRY_AFTER)
        );
        for bad in ["-5", "1e3", "0x10", "12 ", "١٢"] {
            assert_eq!(parse_retry_pushback(bad), Pushback::Stop, "{bad:?}");
        }
        assert_eq!(parse_retry_pushback([0xff, b'1']), Pushback::Stop);
    }

    #[test]
    fn grpc_timeout_units_and_bad_values() {
        let cases = [
            ("1H", Duration::from_secs(3600)),
            ("2M", Duration::from_secs(120)),
            ("3S", Duration::from_secs(3)),
            ("4m", Duration::from_millis(4)),
            ("5u", Duration::from_micros(5)),
            ("6n", Duration::from_nanos(6)),
            ("0n", Duration::ZERO),
            ("99999999H", Duration::from_secs(99_999_999 * 3600)),
        ];
        for (value, expected) in cases {
            assert_eq!(parse_grpc_timeout(value), Some(expected), "{value}");
        }
        for bad in [
            "",
            "S",
            "5",
            "5s",
            "5 S",
            "-5S",
            "+5S",
            "123456789n",
            "5.0S",
            "５S",
        ] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
        assert_eq!(parse_grpc_timeout([b'1', 0xff]), None);
    }

    #[test]
    fn tonic_s_own_encoding_reads_back() {
        // tonic picks the finest unit that fits eight digits: the value read
        // back is the duration cut to that unit.
        for d in [
            Duration::from_nanos(1),
            Duration::from_micros(99_999),
            Duration::from_millis(1500),
            Duration::from_secs(5),
            Duration::from_secs(86_400),
            Duration::from_secs(1_000_000),
        ] {
            let mut request = Request::new(());
            request.set_timeout(d);
            let read = grpc_timeout(request.metadata()).unwrap();
            assert!(
                read <= d && d - read < d / 10_000_000 + Duration::from_nanos(1),
                "{d:?} read {read:?}"
            );
        }
    }

    #[test]
    fn with_deadline_keeps_the_shorter_timeout() {
        let ctx = Context::builder("greeter")
            .deadline_in(Duration::from_secs(2))
            .clock(crate::testing::VirtualClock::starting_at(
                Duration::from_secs(1_000_000),
            ))
            .build();
        let mut longer = Request::new(());
        longer.set_timeout(Duration::from_secs(30));
        assert_eq!(
            grpc_timeout(with_deadline(longer, &ctx).metadata()),
            Some(Duration::from_secs(2))
        );
        let mut unreadable = Request::new(());
        unreadable
            .metadata_mut()
            .insert(GRPC_TIMEOUT, "soon".parse().unwrap());
        assert_eq!(
            grpc_timeout(with_deadline(unreadable, &ctx).metadata()),
            Some(Duration::from_secs(2))
        );
        let no_deadline = Context::builder("greeter").build();
        let untouched = with_deadline(Request::new(()), &no_deadline);
        assert!(untouched.metadata().get(GRPC_TIMEOUT).is_none());
    }
}
