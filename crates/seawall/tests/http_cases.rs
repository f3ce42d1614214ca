//! HTTP (and gRPC) cases as seawall documents them: the status table of
//! `seawall::http`, `Retry-After` in both of its forms on 429 and 503, the
//! reqwest adapter (`send_through`) and `SeawallMiddleware` against a real
//! HTTP/1 server on 127.0.0.1, connection failures, bodies that cannot be
//! copied, blocking and async calls, the verdicts and pushback of
//! `seawall::tonic`, and the HTTP and gRPC answers of the tower layer.
//!
//! Retry waits, hints and cooldowns run on seawall's `VirtualClock`; only
//! request timeouts and the deadline cases use real time, a few hundred
//! milliseconds at most.
#![cfg(all(
    feature = "http",
    feature = "reqwest-middleware",
    feature = "tower",
    feature = "tonic"
))]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use seawall::error::TimeoutScope;
use seawall::http::{classify_status, parse_retry_after, MAX_RETRY_AFTER};
use seawall::pipeline::{ErrorType, Handles, HandlesSync};
use seawall::reqwest::{SeawallMiddleware, SendError, SendThrough};
use seawall::testing::VirtualClock;
use seawall::tower::{error_response, LayerPipeline, PipelineLayer, ServiceError};
use seawall::{
    CircuitBreaker, CircuitState, Cooldown, Error, EventKind, Hedging, Pipeline, PipelineBuilder,
    RateLimiter, Rejection, RejectionReason, Retry, StoreError, TimeoutError, Verdict, VerdictKind,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};
use tower::{Layer, ServiceExt};

mod support;

use support::{exec, ms, recorder, refusal, secs, unique, Flavor, Log, FLAVORS};

// ------------------------------------------------------------------ tools

/// The backoff of every retrying pipeline here: shorter than any hint.
const BACKOFF: Duration = Duration::from_millis(10);

/// Three attempts, `BACKOFF` apart, on `clock`. (Pipelines take a name of
/// their own from `unique`: pipelines of one name share their state in
/// the global store.)
fn retrying(tag: &str, clock: &VirtualClock) -> PipelineBuilder {
    Pipeline::builder(unique(tag))
        .retry(Retry::constant(BACKOFF).max_attempts(3))
        .clock(clock.clone())
}

/// A pipeline whose circuit opens on the first failure.
fn tripping(tag: &str) -> PipelineBuilder {
    Pipeline::builder(unique(tag))
        .circuit_breaker(CircuitBreaker::consecutive_failures(1))
        .clock(VirtualClock::new())
}

/// `builder` with a listener recording every event when `on` (the log
/// stays empty otherwise).
fn listened(builder: PipelineBuilder, on: bool) -> (PipelineBuilder, Log) {
    if !on {
        return (builder, Log::default());
    }
    let (log, listener) = recorder();
    (builder.on_event(listener), log)
}

/// What the listener saw of the events `pick` picks, in order.
fn logged<T>(log: &Log, pick: impl Fn(&EventKind) -> Option<T>) -> Vec<T> {
    log.lock().unwrap().iter().filter_map(pick).collect()
}

/// The waits before each retry the listener saw scheduled.
fn retry_waits(log: &Log) -> Vec<Duration> {
    logged(log, |e| match e {
        EventKind::RetryScheduled { delay, .. } => Some(*delay),
        _ => None,
    })
}

/// The pauses of the cooldowns the listener saw start.
fn cooldowns_started(log: &Log) -> Vec<Duration> {
    logged(log, |e| match e {
        EventKind::CooldownStarted { duration } => Some(*duration),
        _ => None,
    })
}

/// What `seawall::http` says of a status (its module docs' table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Doc {
    Success,
    Retried,
    Throttled,
    Abort,
    Failure,
}

fn documented(code: u16) -> Doc {
    match code {
        100..=399 => Doc::Success,
        408 => Doc::Retried,
        429 => Doc::Throttled,
        400..=499 => Doc::Abort,
        500..=599 => Doc::Retried,
        _ => Doc::Failure,
    }
}

impl Doc {
    fn retried(self) -> bool {
        matches!(self, Doc::Retried | Doc::Throttled)
    }
    /// Counted against the circuit breaker.
    fn fails_the_dependency(self) -> bool {
        matches!(self, Doc::Retried | Doc::Failure)
    }
}

/// Every status class, with the ones peers single out (408, 409, 429,
/// 501, 505, the 3xx a client may see when it does not follow redirects).
const CODES: [u16; 38] = [
    200, 201, 202, 204, 206, 226, 300, 301, 302, 303, 304, 307, 308, 400, 401, 403, 404, 405, 408,
    409, 410, 418, 422, 425, 429, 451, 499, 500, 501, 502, 503, 504, 505, 507, 511, 599, 600, 999,
];

// ---------------------------------------------------------------- servers

/// One answer of the [`Server`].
#[derive(Debug, Clone)]
struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    delay: Duration,
}

fn reply(status: u16) -> Reply {
    Reply {
        status,
        headers: Vec::new(),
        delay: Duration::ZERO,
    }
}

impl Reply {
    fn header(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.push((name, value.into()));
        self
    }

    fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }

    /// The response with this status and these headers (not the delay).
    fn response<B>(&self, body: B) -> Response<B> {
        let mut response = Response::builder().status(self.status);
        for (name, value) in &self.headers {
            response = response.header(*name, value.as_str());
        }
        response.body(body).unwrap()
    }
}

/// Answers `first` to the first request (n = 1), 200 to the others.
fn then_ok(first: Reply) -> impl Fn(u32) -> Reply + Clone + Send + Sync + 'static {
    move |n| match n {
        1 => first.clone(),
        _ => reply(200),
    }
}

/// Answers `code` with `Retry-After: value` first, then 200.
fn hinted(code: u16, value: &str) -> impl Fn(u32) -> Reply + Clone + Send + Sync + 'static {
    then_ok(reply(code).header("retry-after", value))
}

/// An HTTP/1 server on a random loopback port answering its n-th request
/// (from 1) with `answer(n)` and the body `reply #n: status`; counts the
/// requests and keeps the body of each.
struct Server {
    addr: SocketAddr,
    hits: Arc<AtomicU32>,
    bodies: Arc<Mutex<Vec<Bytes>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    async fn start(answer: impl Fn(u32) -> Reply + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicU32::new(0));
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let answer = Arc::new(answer);
        let (counter, kept) = (Arc::clone(&hits), Arc::clone(&bodies));
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (answer, counter, kept) =
                    (Arc::clone(&answer), Arc::clone(&counter), Arc::clone(&kept));
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                        let r = answer(n);
                        let kept = Arc::clone(&kept);
                        async move {
                            let body = request.into_body().collect().await;
                            let body = body.map(|b| b.to_bytes()).unwrap_or_default();
                            kept.lock().unwrap().push(body);
                            if !r.delay.is_zero() {
                                tokio::time::sleep(r.delay).await;
                            }
                            let text = format!("reply #{n}: {}", r.status);
                            Ok::<_, Infallible>(r.response(Full::new(Bytes::from(text))))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Server {
            addr,
            hits,
            bodies,
            task,
        }
    }

    async fn always(status: u16) -> Server {
        Server::start(move |_| reply(status)).await
    }

    fn url(&self) -> String {
        format!("http://{}/items", self.addr)
    }

    fn hits(&self) -> u32 {
        self.hits.load(Ordering::SeqCst)
    }

    fn bodies(&self) -> Vec<Bytes> {
        self.bodies.lock().unwrap().clone()
    }
}

/// How a [`RawServer`] fails every connection.
#[derive(Debug, Clone, Copy)]
enum Misbehaviour {
    /// Closes with the request unread: the peer gets a reset.
    Reset,
    /// Reads the request and closes without an answer.
    Close,
    /// Starts an answer and closes in the middle of its status line.
    Partial,
    /// Answers with bytes that are not HTTP.
    Garbage,
}

const MISBEHAVIOURS: [Misbehaviour; 4] = [
    Misbehaviour::Reset,
    Misbehaviour::Close,
    Misbehaviour::Partial,
    Misbehaviour::Garbage,
];

/// A TCP server on a random loopback port that fails every connection the
/// same way; counts the connections.
struct RawServer {
    addr: SocketAddr,
    hits: Arc<AtomicU32>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RawServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn read_head(stream: &mut tokio::net::TcpStream) {
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
}

impl RawServer {
    async fn start(how: Misbehaviour) -> RawServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicU32::new(0));
        let counter = Arc::clone(&hits);
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    match how {
                        Misbehaviour::Reset => {
                            let mut first = [0u8; 1];
                            let _ = stream.read(&mut first).await;
                        }
                        Misbehaviour::Close => read_head(&mut stream).await,
                        Misbehaviour::Partial => {
                            read_head(&mut stream).await;
                            let _ = stream.write_all(b"HTTP/1.1").await;
                        }
                        Misbehaviour::Garbage => {
                            read_head(&mut stream).await;
                            let _ = stream.write_all(b"SPAM SPAM SPAM\r\n\r\n").await;
                        }
                    }
                    drop(stream);
                });
            }
        });
        RawServer { addr, hits, task }
    }

    fn url(&self) -> String {
        format!("http://{}/items", self.addr)
    }

    fn hits(&self) -> u32 {
        self.hits.load(Ordering::SeqCst)
    }
}

/// A loopback port nobody listens on.
async fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

/// A client that gives 3xx back as they are (no redirects followed).
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

fn wrapped(middleware: SeawallMiddleware) -> ClientWithMiddleware {
    ClientBuilder::new(client()).with(middleware).build()
}

/// A client sending through `SeawallMiddleware` over `pipeline`.
fn via(pipeline: Pipeline) -> ClientWithMiddleware {
    wrapped(SeawallMiddleware::new(pipeline))
}

/// A GET of `url` sent through `pipeline` with `send_through`.
async fn get_through<K>(pipeline: &Pipeline<K>, url: String) -> Result<reqwest::Response, SendError>
where
    K: Handles<reqwest::Response, reqwest::Error>,
{
    client().get(url).send_through(pipeline).await
}

/// The `SendError` inside a middleware error.
fn send_error(error: &reqwest_middleware::Error) -> &SendError {
    match error {
        reqwest_middleware::Error::Middleware(e) => e
            .downcast_ref::<SendError>()
            .unwrap_or_else(|| panic!("not a SendError: {e}")),
        other => panic!("not a middleware error: {other}"),
    }
}

// ------------------------------------------- the pipelines of send_through

/// `send_through` runs with a plain pipeline, with
/// `seawall::reqwest::classify`, and with that classifier and a listener.
#[derive(Debug, Clone, Copy)]
enum Variant {
    Plain,
    Classified,
    Listened,
}

const VARIANTS: [Variant; 3] = [Variant::Plain, Variant::Classified, Variant::Listened];

enum Sender {
    Plain(Pipeline),
    Typed(Pipeline<ErrorType<reqwest::Error>>),
}

impl Sender {
    fn build(variant: Variant, builder: PipelineBuilder) -> (Sender, Log) {
        match variant {
            Variant::Plain => (Sender::Plain(builder.build().unwrap()), Log::default()),
            Variant::Classified | Variant::Listened => {
                let (builder, log) = listened(builder, matches!(variant, Variant::Listened));
                let p = builder.classify(seawall::reqwest::classify).build();
                (Sender::Typed(p.unwrap()), log)
            }
        }
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response, SendError> {
        match self {
            Sender::Plain(p) => request.send_through(p).await,
            Sender::Typed(p) => request.send_through(p).await,
        }
    }

    fn circuit(&self) -> CircuitState {
        match self {
            Sender::Plain(p) => p.circuit_state().unwrap(),
            Sender::Typed(p) => p.circuit_state().unwrap(),
        }
    }
}

/// The middleware runs with and without a listener.
fn middleware_variants(
    builder: impl Fn() -> PipelineBuilder,
) -> Vec<(&'static str, Pipeline, Log)> {
    [("without listener", false), ("with listener", true)]
        .into_iter()
        .map(|(how, on)| {
            let (builder, log) = listened(builder(), on);
            (how, builder.build().unwrap(), log)
        })
        .collect()
}

// ------------------------------------------------------ the status table

#[test]
fn every_status_has_the_verdict_of_the_table() {
    let none = HeaderMap::new();
    for code in (100..=999).chain(CODES) {
        let status = StatusCode::from_u16(code).unwrap();
        let verdict = classify_status(status, &none);
        let expected = match documented(code) {
            Doc::Success => None,
            Doc::Retried => Some(Verdict::retry()),
            Doc::Throttled => Some(Verdict::throttled()),
            Doc::Abort => Some(Verdict::abort()),
            Doc::Failure => Some(Verdict::failure()),
        };
        assert_eq!(verdict, expected, "{code}");
        let response = http::Response::builder().status(code).body(()).unwrap();
        assert_eq!(
            seawall::http::classify_response(&response),
            expected,
            "{code}"
        );
        if let Some(v) = verdict {
            assert_eq!(v.is_retryable(), documented(code).retried(), "{code}");
            assert_eq!(
                v.is_failure(),
                documented(code).fails_the_dependency(),
                "{code}"
            );
        }
    }
}

/// `Retry-After` values and the hint they give on a 429 or a 503 (`None`:
/// no hint), read at a fixed `now`.
#[test]
fn retry_after_in_every_form_on_429_and_503() {
    // 2015-10-21 07:20:00 UTC
    let now = SystemTime::UNIX_EPOCH + secs(1_445_412_000);
    let cases: [(&str, Option<Duration>); 19] = [
        ("120", Some(secs(120))),
        ("0", Some(Duration::ZERO)),
        ("007", Some(secs(7))),
        (" 5\t", Some(secs(5))),
        ("3600", Some(MAX_RETRY_AFTER)),
        ("86400", Some(MAX_RETRY_AFTER)),
        ("99999999999999999999999", Some(MAX_RETRY_AFTER)),
        ("Wed, 21 Oct 2015 07:28:00 GMT", Some(secs(480))),
        ("Wednesday, 21-Oct-15 07:28:00 GMT", Some(secs(480))),
        ("Wed Oct 21 07:28:00 2015", Some(secs(480))),
        ("Wed, 21 Oct 2015 07:00:00 GMT", Some(Duration::ZERO)),
        ("Thu, 01 Jan 1970 00:00:00 GMT", Some(Duration::ZERO)),
        ("Fri, 31 Dec 9999 23:59:59 GMT", Some(MAX_RETRY_AFTER)),
        ("-5", None),
        ("+5", None),
        ("1.5", None),
        ("soon", None),
        ("Wed, 32 Oct 2015 07:28:00 GMT", None),
        ("", None),
    ];
    for (value, expected) in cases {
        assert_eq!(parse_retry_after(value, now), expected, "{value:?}");
    }
    assert_eq!(parse_retry_after([0xff, b'5'], now), None);

    // Through `classify_status`, relative to the system time: a zero wait
    // is no hint; a value that is not one is no hint either.
    let later = |d: Duration| httpdate::fmt_http_date(SystemTime::now() + d);
    let earlier = |d: Duration| httpdate::fmt_http_date(SystemTime::now() - d);
    let values: [(String, Option<(Duration, Duration)>); 9] = [
        ("30".into(), Some((secs(30), secs(30)))),
        ("0".into(), None),
        ("-30".into(), None),
        ("garbage".into(), None),
        (
            "99999999999".into(),
            Some((MAX_RETRY_AFTER, MAX_RETRY_AFTER)),
        ),
        (later(secs(120)), Some((secs(115), secs(120)))),
        (earlier(secs(120)), None),
        (
            "Fri, 31 Dec 9999 23:59:59 GMT".into(),
            Some((MAX_RETRY_AFTER, MAX_RETRY_AFTER)),
        ),
        ("Sun, 06 Nov 1994 25:49:37 GMT".into(), None),
    ];
    for code in [429, 503] {
        let kind = match code {
            429 => VerdictKind::Throttled,
            _ => VerdictKind::Retry,
        };
        for (value, hint) in &values {
            let mut headers = HeaderMap::new();
            headers.insert(RETRY_AFTER, HeaderValue::from_str(value).unwrap());
            let verdict = classify_status(StatusCode::from_u16(code).unwrap(), &headers).unwrap();
            assert_eq!(verdict.kind(), kind, "{code} {value:?}");
            match hint {
                None => assert_eq!(verdict.retry_after(), None, "{code} {value:?}"),
                Some((low, high)) => {
                    let got = verdict.retry_after().expect("a hint");
                    assert!(*low <= got && got <= *high, "{code} {value:?}: {got:?}");
                }
            }
        }
    }
}

#[test]
fn retry_after_is_read_only_on_429_and_503() {
    // Unlike Polly's `ShouldRetryAfterHeader`, which reads the header on any
    // retried response, seawall's table gives a hint on 429 and 503 only.
    let mut headers = HeaderMap::new();
    headers.insert(RETRY_AFTER, HeaderValue::from_static("30"));
    for code in [200, 301, 404, 408, 409, 500, 501, 502, 504, 505, 600] {
        let verdict = classify_status(StatusCode::from_u16(code).unwrap(), &headers);
        assert_eq!(verdict.and_then(|v| v.retry_after()), None, "{code}");
    }
    // Several headers: the first one counts.
    let mut two = HeaderMap::new();
    two.append(RETRY_AFTER, HeaderValue::from_static("garbage"));
    two.append(RETRY_AFTER, HeaderValue::from_static("30"));
    assert_eq!(seawall::http::retry_after(&two), None);
    assert_eq!(
        classify_status(StatusCode::TOO_MANY_REQUESTS, &two),
        Some(Verdict::throttled())
    );
}

// ------------------------------------------------ statuses over the wire

#[tokio::test]
async fn send_through_gives_every_status_its_documented_verdict() {
    for code in CODES {
        let doc = documented(code);
        for variant in VARIANTS {
            let server = Server::always(code).await;
            let clock = VirtualClock::new();
            let (sender, log) = Sender::build(variant, retrying("send-status", &clock));
            let case = format!("{code} {variant:?}");

            let result = sender.send(client().get(server.url())).await;

            if doc.retried() {
                let error = result.expect_err(&case);
                assert!(
                    matches!(
                        error,
                        SendError::Pipeline(Error::RetryExhausted { attempts: 3, .. })
                    ),
                    "{case}: {error:?}"
                );
                assert_eq!(error.status().map(|s| s.as_u16()), Some(code), "{case}");
                assert_eq!(server.hits(), 3, "{case}");
                assert_eq!(clock.now(), 2 * BACKOFF, "{case}");
            } else {
                let response = result.unwrap_or_else(|e| panic!("{case}: {e:?}"));
                assert_eq!(response.status().as_u16(), code, "{case}");
                assert_eq!(server.hits(), 1, "{case}");
                assert_eq!(clock.now(), Duration::ZERO, "{case}");
            }
            if let Variant::Listened = variant {
                let expected = match doc.retried() {
                    true => vec![BACKOFF, BACKOFF],
                    false => vec![],
                };
                assert_eq!(retry_waits(&log), expected, "{case}");
            }
        }
    }
}

#[tokio::test]
async fn the_middleware_gives_every_status_its_documented_verdict() {
    for code in CODES {
        let doc = documented(code);
        let clock = VirtualClock::new();
        for (how, pipeline, log) in middleware_variants(|| retrying("mw-status", &clock)) {
            let server = Server::always(code).await;
            let before = clock.now();
            let case = format!("{code} {how}");

            let response = via(pipeline)
                .get(server.url())
                .send()
                .await
                .unwrap_or_else(|e| panic!("{case}: {e}"));

            // The last response comes back, also when it was judged a
            // failure and no retry is left.
            assert_eq!(response.status().as_u16(), code, "{case}");
            let attempts = if doc.retried() { 3 } else { 1 };
            assert_eq!(server.hits(), attempts, "{case}");
            assert_eq!(clock.now() - before, BACKOFF * (attempts - 1), "{case}");
            if !matches!(code, 204 | 304) {
                let body = response.text().await.unwrap();
                assert_eq!(body, format!("reply #{attempts}: {code}"), "{case}");
            }
            if how == "with listener" {
                assert_eq!(
                    retry_waits(&log),
                    vec![BACKOFF; attempts as usize - 1],
                    "{case}"
                );
            }
        }
    }
}

/// Through the circuit breaker: which statuses count against the dependency
/// (one failure opens the circuit, no retry).
#[tokio::test]
async fn only_failures_of_the_dependency_open_the_circuit() {
    for code in CODES {
        let doc = documented(code);
        let expected = match doc.fails_the_dependency() {
            true => CircuitState::Open,
            false => CircuitState::Closed,
        };
        for variant in VARIANTS {
            let server = Server::always(code).await;
            let (sender, _) = Sender::build(variant, tripping("circuit"));
            let result = sender.send(client().get(server.url())).await;
            let case = format!("{code} {variant:?}");
            let status = match &result {
                Ok(response) => response.status().as_u16(),
                Err(e) => e
                    .status()
                    .unwrap_or_else(|| panic!("{case}: {e:?}"))
                    .as_u16(),
            };
            assert_eq!(status, code, "{case}");
            assert_eq!(result.is_err(), doc.retried(), "{case}: {result:?}");
            assert_eq!(sender.circuit(), expected, "{case}");
        }
        for (how, pipeline, _) in middleware_variants(|| tripping("circuit")) {
            let server = Server::always(code).await;
            let response = via(pipeline.clone())
                .get(server.url())
                .send()
                .await
                .unwrap();
            assert_eq!(response.status().as_u16(), code, "{code} {how}");
            assert_eq!(pipeline.circuit_state().unwrap(), expected, "{code} {how}");
        }
        // The tower layer with `seawall::http::classify_response`.
        let (response, pipeline) = through_layer(tripping("circuit"), move |_| reply(code)).await;
        assert_eq!(response.status().as_u16(), code, "{code} tower");
        assert_eq!(pipeline.circuit_state().unwrap(), expected, "{code} tower");
    }
}

/// An in-process service answering its n-th request (from 1) with
/// `answer(n)` (its delay aside) and the body `answer #n`.
fn backend(
    answer: impl Fn(u32) -> Reply + Clone + Send + 'static,
) -> impl tower::Service<
    Request<String>,
    Response = Response<String>,
    Error = Infallible,
    Future = impl Send + 'static,
> + Clone
       + Send
       + 'static {
    let calls = Arc::new(AtomicU32::new(0));
    tower::service_fn(move |_: Request<String>| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        let response = answer(n).response(format!("answer #{n}"));
        async move { Ok::<_, Infallible>(response) }
    })
}

/// One request to `backend(answer)` behind `builder`'s tower layer, which
/// judges responses with `seawall::http::classify_response`; with the
/// layer's pipeline.
async fn through_layer(
    builder: PipelineBuilder,
    answer: impl Fn(u32) -> Reply + Clone + Send + 'static,
) -> (Response<String>, LayerPipeline) {
    let layer = PipelineLayer::new(builder)
        .unwrap()
        .classify_response(seawall::http::classify_response::<String>);
    let pipeline = layer.pipeline().clone();
    let request = Request::new(String::new());
    let response = layer.layer(backend(answer)).oneshot(request).await.unwrap();
    (response, pipeline)
}

#[tokio::test]
async fn the_tower_layer_gives_every_status_its_documented_verdict() {
    for code in CODES {
        let doc = documented(code);
        for with_listener in [false, true] {
            let clock = VirtualClock::new();
            let (builder, log) = listened(retrying("tower-status", &clock), with_listener);
            let (response, _) = through_layer(builder, move |_| reply(code)).await;
            let case = format!("{code} listener {with_listener}");
            let attempts = if doc.retried() { 3 } else { 1 };
            assert_eq!(response.status().as_u16(), code, "{case}");
            assert_eq!(response.body(), &format!("answer #{attempts}"), "{case}");
            assert_eq!(clock.now(), BACKOFF * (attempts - 1), "{case}");
            if with_listener {
                assert_eq!(retry_waits(&log).len(), attempts as usize - 1, "{case}");
            }
        }
    }
}

// ------------------------------------------- Retry-After over the wire

/// A `Retry-After` value and the wait it must give the retry: exactly, or
/// within a range (an HTTP-date has a one-second resolution).
struct Hint {
    value: String,
    low: Duration,
    high: Duration,
}

fn hint(value: impl Into<String>, wait: Duration) -> Hint {
    Hint {
        value: value.into(),
        low: wait,
        high: wait,
    }
}

/// The values of the header every retry-after test sends, on 429 and 503.
fn hints() -> Vec<Hint> {
    let date = |at: SystemTime| httpdate::fmt_http_date(at);
    vec![
        hint("2", secs(2)),
        hint("30", secs(30)),
        // No hint: the backoff.
        hint("0", BACKOFF),
        hint("-5", BACKOFF),
        hint("1.5", BACKOFF),
        hint("+3", BACKOFF),
        hint("soon", BACKOFF),
        hint("Sun, 32 Nov 1994 08:49:37 GMT", BACKOFF),
        hint(date(SystemTime::now() - secs(60)), BACKOFF),
        hint("Sunday, 06-Nov-94 08:49:37 GMT", BACKOFF),
        // Capped at `MAX_RETRY_AFTER`.
        hint("86400", MAX_RETRY_AFTER),
        hint("99999999999999999999", MAX_RETRY_AFTER),
        hint("Fri, 31 Dec 9999 23:59:59 GMT", MAX_RETRY_AFTER),
        Hint {
            value: date(SystemTime::now() + secs(3)),
            low: secs(1),
            high: secs(3),
        },
    ]
}

/// A server answering `code` with `Retry-After: value` first, then 200.
async fn hinting(code: u16, value: &str) -> Server {
    Server::start(hinted(code, value)).await
}

fn assert_waited(waited: Duration, hint: &Hint, case: &str) {
    assert!(
        hint.low <= waited && waited <= hint.high,
        "{case}: waited {waited:?}, expected {:?}..={:?}",
        hint.low,
        hint.high
    );
}

#[tokio::test]
async fn send_through_waits_the_retry_after_of_a_429_or_503() {
    for code in [429, 503] {
        for hint in hints() {
            for variant in VARIANTS {
                let server = hinting(code, &hint.value).await;
                let clock = VirtualClock::new();
                let (sender, log) = Sender::build(variant, retrying("send-hint", &clock));
                let case = format!("{code} {:?} {variant:?}", hint.value);

                let response = sender
                    .send(client().get(server.url()))
                    .await
                    .unwrap_or_else(|e| panic!("{case}: {e:?}"));

                assert_eq!(response.status(), 200, "{case}");
                assert_eq!(server.hits(), 2, "{case}");
                assert_waited(clock.now(), &hint, &case);
                if let Variant::Listened = variant {
                    assert_eq!(retry_waits(&log), [clock.now()], "{case}");
                }
            }
        }
    }
}

#[tokio::test]
async fn the_middleware_waits_the_retry_after_of_a_429_or_503() {
    for code in [429, 503] {
        for hint in hints() {
            let clock = VirtualClock::new();
            for (how, pipeline, log) in middleware_variants(|| retrying("mw-hint", &clock)) {
                let server = hinting(code, &hint.value).await;
                let before = clock.now();
                let case = format!("{code} {:?} {how}", hint.value);

                let response = via(pipeline)
                    .get(server.url())
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("{case}: {e}"));

                assert_eq!(response.status(), 200, "{case}");
                assert_eq!(server.hits(), 2, "{case}");
                let waited = clock.now() - before;
                assert_waited(waited, &hint, &case);
                if how == "with listener" {
                    assert_eq!(retry_waits(&log), [waited], "{case}");
                }
            }
        }
    }
}

#[tokio::test]
async fn the_tower_layer_waits_the_retry_after_of_a_429_or_503() {
    for code in [429u16, 503] {
        for hint in hints() {
            let clock = VirtualClock::new();
            let calls = Arc::new(AtomicU32::new(0));
            let counter = Arc::clone(&calls);
            let answer = hinted(code, &hint.value);
            let counted = move |n| {
                counter.fetch_add(1, Ordering::SeqCst);
                answer(n)
            };
            let case = format!("{code} {:?}", hint.value);

            let (response, _) = through_layer(retrying("tower-hint", &clock), counted).await;

            assert_eq!(response.status(), 200, "{case}");
            assert_eq!(calls.load(Ordering::SeqCst), 2, "{case}");
            assert_waited(clock.now(), &hint, &case);
        }
    }
}

#[tokio::test]
async fn retry_after_on_other_statuses_leaves_the_backoff() {
    for code in [408, 500, 502, 504] {
        let server = hinting(code, "30").await;
        let clock = VirtualClock::new();
        let (sender, _) = Sender::build(Variant::Classified, retrying("send-other", &clock));
        let response = sender.send(client().get(server.url())).await.unwrap();
        assert_eq!(response.status(), 200, "{code}");
        assert_eq!(clock.now(), BACKOFF, "{code}");

        let server = hinting(code, "30").await;
        let clock = VirtualClock::new();
        let pipeline = retrying("mw-other", &clock).build().unwrap();
        let response = via(pipeline).get(server.url()).send().await.unwrap();
        assert_eq!(response.status(), 200, "{code}");
        assert_eq!(clock.now(), BACKOFF, "{code}");
    }
}

#[tokio::test]
async fn a_hint_shorter_than_the_backoff_does_not_shorten_it() {
    for code in [429, 503] {
        let server = hinting(code, "1").await;
        let clock = VirtualClock::new();
        let pipeline = Pipeline::builder(unique("short-hint"))
            .retry(Retry::constant(secs(5)).max_attempts(2))
            .clock(clock.clone())
            .classify(seawall::reqwest::classify)
            .build()
            .unwrap();
        let response = get_through(&pipeline, server.url()).await.unwrap();
        assert_eq!(response.status(), 200, "{code}");
        assert_eq!(clock.now(), secs(5), "{code}");
    }
}

/// A hint the call's deadline cannot wait for ends the call at once with
/// the response's error (send_through) or the response (the middleware).
/// On the system clock, with a deadline of 20 s and a hint of 30 s: the
/// call ends well before the deadline (a wait would reach it).
#[tokio::test]
async fn a_hint_past_the_deadline_ends_the_call_at_once() {
    for code in [429u16, 503] {
        let server = || Server::start(move |_| reply(code).header("retry-after", "30"));
        let deadline = |tag: &str| {
            Pipeline::builder(unique(tag))
                .timeout(secs(20))
                .retry(Retry::constant(BACKOFF).max_attempts(3))
        };
        let quick = |started: Instant| {
            assert!(
                started.elapsed() < secs(10),
                "{code}: {:?}",
                started.elapsed()
            );
        };

        let server_1 = server().await;
        let pipeline = deadline("deadline-hint")
            .classify(seawall::reqwest::classify)
            .build()
            .unwrap();
        let started = Instant::now();
        let error = get_through(&pipeline, server_1.url()).await.unwrap_err();
        quick(started);
        assert_eq!(
            error.status().map(|s| s.as_u16()),
            Some(code),
            "{code}: {error:?}"
        );
        assert!(!error.is_timeout(), "{code}: {error:?}");
        assert_eq!(server_1.hits(), 1, "{code}");

        let server_2 = server().await;
        let pipeline = deadline("mw-deadline-hint").build().unwrap();
        let started = Instant::now();
        let response = via(pipeline).get(server_2.url()).send().await.unwrap();
        quick(started);
        assert_eq!(response.status().as_u16(), code);
        assert_eq!(response.headers()["retry-after"], "30");
        assert_eq!(server_2.hits(), 1, "{code}");
    }
}

// ------------------------------------------------------------ cooldown

/// What a `Retry-After` value makes of the cooldown: the pause a refused
/// call is told to wait (`None`: no pause, the next call goes through).
fn cooldown_cases() -> Vec<(String, Option<Duration>)> {
    vec![
        ("30".into(), Some(secs(30))),
        // A hint of an hour (the cap) opens a pause of `max_pause`: 5 min.
        ("86400".into(), Some(secs(300))),
        ("Fri, 31 Dec 9999 23:59:59 GMT".into(), Some(secs(300))),
        ("0".into(), None),
        ("soon".into(), None),
        ("-30".into(), None),
        (httpdate::fmt_http_date(SystemTime::now() - secs(60)), None),
    ]
}

fn cooling(tag: &str, clock: &VirtualClock) -> PipelineBuilder {
    Pipeline::builder(unique(tag))
        .cooldown(Cooldown::new().max_wait(Duration::ZERO))
        .clock(clock.clone())
}

/// Checks the second call after a first that got the hint `value`.
fn check_pause(
    second: Result<u16, Option<Rejection>>,
    pause: Option<Duration>,
    hits: u32,
    case: &str,
) {
    match pause {
        Some(pause) => {
            let rejection = second
                .expect_err(case)
                .unwrap_or_else(|| panic!("{case}: not a refusal"));
            assert_eq!(rejection.reason, RejectionReason::CooldownActive, "{case}");
            assert_eq!(rejection.retry_after, Some(pause), "{case}");
            assert_eq!(hits, 1, "{case}: nothing sent during the pause");
        }
        None => {
            assert_eq!(second, Ok(200), "{case}");
            assert_eq!(hits, 2, "{case}");
        }
    }
}

#[tokio::test]
async fn the_retry_after_of_a_429_or_503_opens_the_cooldown() {
    for code in [429, 503] {
        for (value, pause) in cooldown_cases() {
            for variant in VARIANTS {
                let server = hinting(code, &value).await;
                let clock = VirtualClock::new();
                let (sender, log) = Sender::build(variant, cooling("send-cool", &clock));
                let case = format!("{code} {value:?} {variant:?}");

                let first = sender.send(client().get(server.url())).await.unwrap_err();
                assert_eq!(first.status().map(|s| s.as_u16()), Some(code), "{case}");
                let second = sender.send(client().get(server.url())).await;
                let second = second
                    .map(|r| r.status().as_u16())
                    .map_err(|e| e.rejection().copied());
                check_pause(second, pause, server.hits(), &case);
                if let Variant::Listened = variant {
                    let expected: Vec<_> = pause.into_iter().collect();
                    assert_eq!(cooldowns_started(&log), expected, "{case}");
                }
            }
            let clock = VirtualClock::new();
            for (how, pipeline, _) in middleware_variants(|| cooling("mw-cool", &clock)) {
                let server = hinting(code, &value).await;
                let client = via(pipeline);
                let case = format!("{code} {value:?} middleware {how}");

                let first = client.get(server.url()).send().await.unwrap();
                assert_eq!(first.status().as_u16(), code, "{case}");
                let second = client.get(server.url()).send().await;
                let second = second
                    .map(|r| r.status().as_u16())
                    .map_err(|e| send_error(&e).rejection().copied());
                check_pause(second, pause, server.hits(), &case);
            }
        }
    }
}

// ------------------------------------------------- connection failures

#[tokio::test]
async fn connection_failures_are_retried_by_send_through() {
    for how in MISBEHAVIOURS {
        for variant in VARIANTS {
            let server = RawServer::start(how).await;
            let clock = VirtualClock::new();
            let (sender, _) = Sender::build(variant, retrying("send-broken", &clock));
            let case = format!("{how:?} {variant:?}");

            let error = sender.send(client().get(server.url())).await.unwrap_err();

            match &error {
                SendError::Pipeline(Error::RetryExhausted { attempts, last }) => {
                    assert_eq!(*attempts, 3, "{case}");
                    assert_eq!(last.status(), None, "{case}");
                    assert_eq!(
                        seawall::reqwest::classify(last),
                        Verdict::retry(),
                        "{case}: {last:?}"
                    );
                }
                other => panic!("{case}: {other:?}"),
            }
            assert_eq!(server.hits(), 3, "{case}");
            assert_eq!(clock.now(), 2 * BACKOFF, "{case}");
        }
    }
    // Refused: nobody listens.
    let port = closed_port().await;
    for variant in VARIANTS {
        let clock = VirtualClock::new();
        let (sender, _) = Sender::build(variant, retrying("send-refused", &clock));
        let error = sender
            .send(client().get(format!("http://127.0.0.1:{port}/")))
            .await
            .unwrap_err();
        match &error {
            SendError::Pipeline(Error::RetryExhausted { attempts: 3, last }) => {
                assert!(last.is_connect(), "{variant:?}: {last:?}");
                assert_eq!(seawall::reqwest::classify(last), Verdict::retry());
            }
            other => panic!("{variant:?}: {other:?}"),
        }
        assert_eq!(clock.now(), 2 * BACKOFF, "{variant:?}");
    }
}

#[tokio::test]
async fn connection_failures_are_retried_by_the_middleware() {
    for how in MISBEHAVIOURS {
        let server = RawServer::start(how).await;
        let clock = VirtualClock::new();
        let pipeline = retrying("mw-broken", &clock).build().unwrap();

        let error = via(pipeline).get(server.url()).send().await.unwrap_err();

        // The last attempt's error, as reqwest gave it.
        assert!(
            matches!(error, reqwest_middleware::Error::Reqwest(_)),
            "{how:?}: {error:?}"
        );
        assert_eq!(server.hits(), 3, "{how:?}");
        assert_eq!(clock.now(), 2 * BACKOFF, "{how:?}");
    }
}

/// Real time: the server answers after 10 s, each request gives up after
/// 100 ms; the backoff runs on the virtual clock.
#[tokio::test]
async fn a_request_timeout_is_retried() {
    let server = Server::start(|_| reply(200).after(secs(10))).await;
    let started = Instant::now();
    for variant in [Variant::Plain, Variant::Classified] {
        let clock = VirtualClock::new();
        let (sender, _) = Sender::build(variant, retrying("send-timeout", &clock));
        let error = sender
            .send(client().get(server.url()).timeout(ms(100)))
            .await
            .unwrap_err();
        assert!(error.is_timeout(), "{variant:?}: {error:?}");
        match &error {
            SendError::Pipeline(Error::RetryExhausted { attempts: 3, last }) => {
                assert!(last.is_timeout(), "{variant:?}: {last:?}");
                assert_eq!(seawall::reqwest::classify(last), Verdict::retry());
            }
            other => panic!("{variant:?}: {other:?}"),
        }
    }
    assert_eq!(server.hits(), 6);

    let clock = VirtualClock::new();
    let pipeline = retrying("mw-timeout", &clock).build().unwrap();
    let error = via(pipeline)
        .get(server.url())
        .timeout(ms(100))
        .send()
        .await
        .unwrap_err();
    assert!(error.is_timeout(), "{error:?}");
    assert_eq!(server.hits(), 9);
    assert!(started.elapsed() < secs(8), "{:?}", started.elapsed());
}

#[tokio::test]
async fn a_redirect_loop_is_an_abort_with_the_classifier_and_retried_without() {
    let looping = || Server::start(|n| reply(302).header("location", format!("/loop/{n}")));
    let following = || {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::limited(2))
            .build()
            .unwrap()
    };

    let server = looping().await;
    let clock = VirtualClock::new();
    let (sender, _) = Sender::build(Variant::Classified, retrying("send-redirect", &clock));
    let error = sender
        .send(following().get(server.url()))
        .await
        .unwrap_err();
    let once = server.hits();
    match &error {
        SendError::Pipeline(Error::Operation(e)) => {
            assert!(e.is_redirect(), "{e:?}");
            assert_eq!(seawall::reqwest::classify(e), Verdict::abort());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(clock.now(), Duration::ZERO);

    // A plain pipeline retries every error, a redirect loop included.
    let server = looping().await;
    let clock = VirtualClock::new();
    let (sender, _) = Sender::build(Variant::Plain, retrying("send-redirect-plain", &clock));
    let error = sender
        .send(following().get(server.url()))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            SendError::Pipeline(Error::RetryExhausted { attempts: 3, .. })
        ),
        "{error:?}"
    );
    assert_eq!(server.hits(), 3 * once);

    // The middleware judges reqwest's errors with `classify`: not retried.
    let server = looping().await;
    let clock = VirtualClock::new();
    let pipeline = retrying("mw-redirect", &clock).build().unwrap();
    let error = ClientBuilder::new(following())
        .with(SeawallMiddleware::new(pipeline))
        .build()
        .get(server.url())
        .send()
        .await
        .unwrap_err();
    assert!(error.is_redirect(), "{error:?}");
    assert_eq!(server.hits(), once);
}

#[tokio::test]
async fn a_request_that_cannot_be_built_is_a_clear_error() {
    let server = Server::always(200).await;
    let clock = VirtualClock::new();
    for variant in VARIANTS {
        let (sender, _) = Sender::build(variant, retrying("send-build", &clock));
        for request in [
            client().get("not a url"),
            client().get("http://"),
            client().get(server.url()).header("bad header", "x"),
            client().get(server.url()).header("x-ok", "bad\nvalue"),
        ] {
            let error = sender.send(request).await.unwrap_err();
            assert!(
                matches!(error, SendError::Build(_)),
                "{variant:?}: {error:?}"
            );
            assert!(error.to_string().starts_with("request could not be built"));
            assert!(error
                .reqwest_error()
                .is_some_and(reqwest::Error::is_builder));
            assert_eq!(error.status(), None);
            assert!(!error.is_rejected() && !error.is_timeout());
        }
    }
    assert_eq!(server.hits(), 0);
    assert_eq!(clock.now(), Duration::ZERO);
}

// ------------------------------------------------------------- bodies

fn stream_body() -> reqwest::Body {
    let chunks = vec![
        Ok::<_, std::io::Error>(Bytes::from_static(b"first ")),
        Ok(Bytes::from_static(b"second")),
    ];
    reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))
}

/// A POST of `stream_body()` to `url` sent through `pipeline` with
/// `send_through`.
async fn post_stream<K>(pipeline: &Pipeline<K>, url: String) -> Result<reqwest::Response, SendError>
where
    K: Handles<reqwest::Response, reqwest::Error>,
{
    client()
        .post(url)
        .body(stream_body())
        .send_through(pipeline)
        .await
}

/// A POST of `stream_body()` to `url` through the middleware over
/// `pipeline`.
async fn post_stream_via(
    pipeline: Pipeline,
    url: String,
) -> reqwest_middleware::Result<reqwest::Response> {
    via(pipeline).post(url).body(stream_body()).send().await
}

/// A policy written in code that runs what it wraps again after a failure.
struct RunsTwice;

impl<T: Send + 'static, E: Send + 'static> seawall::custom::Policy<T, E> for RunsTwice {
    fn name(&self) -> &str {
        "runs_twice"
    }
    fn position(&self) -> seawall::custom::Position {
        seawall::custom::Position::Attempt
    }
    fn call<'a>(
        &'a self,
        _ctx: seawall::Context,
        next: seawall::custom::Next<'a, T, E>,
    ) -> seawall::custom::PolicyFuture<'a, T, E> {
        Box::pin(async move {
            match next.run().await {
                Ok(v) => Ok(v),
                Err(_) => next.run().await,
            }
        })
    }
}

#[tokio::test]
async fn a_stream_body_is_refused_where_it_could_be_sent_twice_and_sent_once_elsewhere() {
    let server = Server::always(503).await;
    let refusing = [
        ("retry", retrying("stream-retry", &VirtualClock::new())),
        (
            "hedging",
            Pipeline::builder(unique("stream-hedge")).hedging(Hedging::parallel()),
        ),
    ];
    for (what, builder) in refusing {
        let pipeline = builder.build().unwrap();
        let error = post_stream(&pipeline, server.url()).await.unwrap_err();
        assert!(
            matches!(error, SendError::BodyNotCloneable),
            "{what}: {error:?}"
        );
        let error = post_stream_via(pipeline, server.url()).await.unwrap_err();
        assert!(
            matches!(send_error(&error), SendError::BodyNotCloneable),
            "{what}: {error:?}"
        );
    }
    // send_through also refuses it with a policy written in code.
    let custom = Pipeline::builder(unique("stream-custom"))
        .policy::<reqwest::Response, reqwest::Error, _>(RunsTwice)
        .build()
        .unwrap();
    let error = post_stream(&custom, server.url()).await.unwrap_err();
    assert!(matches!(error, SendError::BodyNotCloneable), "{error:?}");
    assert_eq!(server.hits(), 0, "nothing was sent");

    // One attempt at most: sent once, whole.
    let once = [
        (
            "timeout",
            Pipeline::builder(unique("stream-timeout")).timeout(secs(5)),
        ),
        (
            "one attempt",
            Pipeline::builder(unique("stream-one")).retry(Retry::constant(BACKOFF).max_attempts(1)),
        ),
        (
            "breaker",
            Pipeline::builder(unique("stream-breaker"))
                .circuit_breaker(CircuitBreaker::consecutive_failures(5)),
        ),
    ];
    for (what, builder) in once {
        let pipeline = builder.build().unwrap();
        let before = server.hits();
        let error = post_stream(&pipeline, server.url()).await.unwrap_err();
        assert_eq!(
            error.status(),
            Some(reqwest::StatusCode::SERVICE_UNAVAILABLE),
            "{what}"
        );
        let response = post_stream_via(pipeline, server.url()).await.unwrap();
        assert_eq!(response.status(), 503, "{what}");
        assert_eq!(server.hits(), before + 2, "{what}");
    }
    for body in server.bodies() {
        assert_eq!(&body[..], b"first second");
    }
}

#[tokio::test]
async fn a_byte_body_is_sent_whole_on_every_attempt() {
    let server = Server::start(|n| reply(if n < 3 { 503 } else { 201 })).await;
    let clock = VirtualClock::new();
    let (sender, _) = Sender::build(Variant::Classified, retrying("bytes", &clock));
    let response = sender
        .send(client().post(server.url()).body("{\"id\":42}"))
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(server.bodies(), vec![Bytes::from_static(b"{\"id\":42}"); 3]);
}

#[tokio::test]
async fn the_last_failed_response_comes_back_with_its_headers_and_body() {
    let server = Server::start(|n| {
        reply(503)
            .header("x-attempt", n.to_string())
            .header("retry-after", "1")
    })
    .await;
    let clock = VirtualClock::new();
    let pipeline = retrying("mw-last", &clock).build().unwrap();
    let response = via(pipeline).get(server.url()).send().await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["x-attempt"], "3");
    assert_eq!(response.headers()["retry-after"], "1");
    assert_eq!(response.text().await.unwrap(), "reply #3: 503");
    assert_eq!(clock.now(), secs(2), "two waits of the 1 s hint");

    // send_through: the status error of the last response.
    let (sender, _) = Sender::build(Variant::Classified, retrying("send-last", &clock));
    let error = sender.send(client().get(server.url())).await.unwrap_err();
    assert_eq!(
        error.status(),
        Some(reqwest::StatusCode::SERVICE_UNAVAILABLE)
    );
    let last = error.reqwest_error().unwrap();
    assert!(last.is_status());
    assert_eq!(last.url().map(|u| u.path()), Some("/items"));
}

// ---------------------------------------------- blocking and async calls

/// A response judged a failure, as an operation of one's own returns it.
#[derive(Debug)]
struct Answered {
    status: StatusCode,
    headers: HeaderMap,
}

impl std::fmt::Display for Answered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "answered {}", self.status)
    }
}

impl std::error::Error for Answered {}

fn judge(answer: &Answered) -> Verdict {
    classify_status(answer.status, &answer.headers).unwrap_or_else(Verdict::failure)
}

/// The n-th answer (from 1) of a server that answers `code` with
/// `Retry-After: value` first, then 200.
fn scripted(n: u32, code: u16, value: Option<&str>) -> Result<StatusCode, Answered> {
    let status = StatusCode::from_u16(if n == 1 { code } else { 200 }).unwrap();
    let mut headers = HeaderMap::new();
    if let (1, Some(value)) = (n, value) {
        headers.insert(RETRY_AFTER, HeaderValue::from_str(value).unwrap());
    }
    match classify_status(status, &headers) {
        None => Ok(status),
        Some(_) => Err(Answered { status, headers }),
    }
}

/// Makes `calls` calls through `pipeline` (sync or async) with an
/// operation answering its n-th run (from 1) with `answer(n)`; gives the
/// results and the number of runs.
fn run_scripted<K, T, E>(
    pipeline: &Pipeline<K>,
    flavor: Flavor,
    calls: usize,
    answer: impl Fn(u32) -> Result<T, E>,
) -> (Vec<Result<T, Error<E>>>, u32)
where
    K: HandlesSync<T, E>,
{
    let runs = AtomicU32::new(0);
    let results = (0..calls)
        .map(|_| {
            exec(pipeline, flavor, |_| {
                answer(runs.fetch_add(1, Ordering::SeqCst) + 1)
            })
        })
        .collect();
    (results, runs.into_inner())
}

#[test]
fn blocking_and_async_calls_judge_statuses_and_hints_alike() {
    let cases: Vec<(u16, Option<&str>)> = CODES
        .iter()
        .map(|&c| (c, None))
        .chain([
            (429, Some("7")),
            (503, Some("7")),
            (503, Some("soon")),
            (429, Some("99999999999")),
            (500, Some("7")),
        ])
        .collect();
    for (code, value) in cases {
        let doc = documented(code);
        let wait = match (code, value) {
            (429 | 503, Some("7")) => secs(7),
            (429 | 503, Some("99999999999")) => MAX_RETRY_AFTER,
            _ => BACKOFF,
        };
        for with_listener in [false, true] {
            for flavor in FLAVORS {
                let clock = VirtualClock::new();
                let (builder, log) = listened(retrying("own", &clock), with_listener);
                let pipeline = builder.classify(judge).build().unwrap();
                let (mut results, calls) =
                    run_scripted(&pipeline, flavor, 1, |n| scripted(n, code, value));
                let result = results.remove(0);
                let case = format!("{code} {value:?} {flavor:?} listener {with_listener}");
                match doc {
                    Doc::Success => assert_eq!(result.unwrap().as_u16(), code, "{case}"),
                    Doc::Retried | Doc::Throttled => {
                        assert_eq!(result.unwrap().as_u16(), 200, "{case}");
                        assert_eq!(calls, 2, "{case}");
                        assert_eq!(clock.now(), wait, "{case}");
                        if with_listener {
                            assert_eq!(retry_waits(&log), [wait], "{case}");
                        }
                    }
                    Doc::Abort | Doc::Failure => {
                        let error = result.unwrap_err();
                        assert!(matches!(error, Error::Operation(_)), "{case}: {error:?}");
                        assert_eq!(calls, 1, "{case}");
                    }
                }
            }
        }
    }
}

#[test]
fn blocking_and_async_calls_open_the_cooldown_and_spare_the_circuit_on_429() {
    for flavor in FLAVORS {
        let clock = VirtualClock::new();
        let pipeline = cooling("own-cool", &clock)
            .circuit_breaker(CircuitBreaker::consecutive_failures(1))
            .classify(judge)
            .build()
            .unwrap();
        let (results, calls) = run_scripted(&pipeline, flavor, 2, |n| scripted(n, 429, Some("30")));
        let case = format!("{flavor:?}");
        assert!(matches!(results[0], Err(Error::Operation(_))), "{case}");
        assert_eq!(
            refusal(&results[1]),
            Some((RejectionReason::CooldownActive, Some(secs(30)))),
            "{case}"
        );
        assert_eq!(calls, 1, "{case}");
        assert_eq!(
            pipeline.circuit_state().unwrap(),
            CircuitState::Closed,
            "{case}"
        );
    }
}

// ---------------------------------------------------------------- tonic

fn pushback(value: &str) -> MetadataMap {
    let mut metadata = MetadataMap::new();
    metadata.insert(seawall::tonic::RETRY_PUSHBACK, value.parse().unwrap());
    metadata
}

const GRPC_CODES: [Code; 17] = [
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

fn grpc_documented(code: Code) -> VerdictKind {
    match code {
        Code::Unavailable
        | Code::Unknown
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::Cancelled => VerdictKind::Retry,
        Code::ResourceExhausted => VerdictKind::Throttled,
        Code::Internal | Code::DataLoss | Code::Ok => VerdictKind::Failure,
        _ => VerdictKind::Abort,
    }
}

#[test]
fn grpc_codes_and_pushback_have_the_verdicts_of_the_table() {
    for code in GRPC_CODES {
        let kind = grpc_documented(code);
        let plain = seawall::tonic::classify(&Status::new(code, "x"));
        assert_eq!(plain, Verdict::of(kind), "{code:?}");
        let waiting = Status::with_metadata(code, "x", pushback("250"));
        let verdict = seawall::tonic::classify(&waiting);
        match kind {
            VerdictKind::Retry | VerdictKind::Throttled => {
                assert_eq!(
                    verdict,
                    Verdict::of(kind).with_retry_after(ms(250)),
                    "{code:?}"
                )
            }
            _ => assert_eq!(verdict, plain, "{code:?}"),
        }
        for stop in ["-1", "soon", "", "1.5", " 5"] {
            let verdict =
                seawall::tonic::classify(&Status::with_metadata(code, "x", pushback(stop)));
            let expected = match kind {
                VerdictKind::Retry => Verdict::failure(),
                VerdictKind::Throttled => Verdict::ignore(),
                _ => plain,
            };
            assert_eq!(verdict, expected, "{code:?} {stop:?}");
        }
        let zero = seawall::tonic::classify(&Status::with_metadata(code, "x", pushback("0")));
        assert_eq!(zero, plain, "{code:?}");
        let huge = seawall::tonic::classify(&Status::with_metadata(
            code,
            "x",
            pushback("99999999999999999999"),
        ));
        if plain.is_retryable() {
            assert_eq!(huge.retry_after(), Some(MAX_RETRY_AFTER), "{code:?}");
        }
    }
}

/// A gRPC call that answers `first` (with its trailers) once, then `Ok`.
fn grpc_scripted(n: u32, first: &Status) -> Result<&'static str, Status> {
    match n {
        1 => Err(first.clone()),
        _ => Ok("hello"),
    }
}

#[test]
fn grpc_pushback_delays_or_stops_the_retry_on_both_paths() {
    let cases: Vec<(Status, Option<Duration>)> = vec![
        (
            Status::with_metadata(Code::Unavailable, "", pushback("250")),
            Some(ms(250)),
        ),
        (
            Status::with_metadata(Code::ResourceExhausted, "", pushback("1500")),
            Some(ms(1500)),
        ),
        (
            Status::with_metadata(Code::Unavailable, "", pushback("0")),
            Some(BACKOFF),
        ),
        (
            Status::with_metadata(Code::Aborted, "", pushback("1")),
            Some(BACKOFF),
        ),
        (
            Status::with_metadata(Code::Unavailable, "", pushback("99999999999")),
            Some(MAX_RETRY_AFTER),
        ),
        (Status::cancelled(""), Some(BACKOFF)),
        (Status::deadline_exceeded(""), Some(BACKOFF)),
        (Status::unknown(""), Some(BACKOFF)),
        (
            Status::with_metadata(Code::Unavailable, "", pushback("-1")),
            None,
        ),
        (
            Status::with_metadata(Code::ResourceExhausted, "", pushback("-1")),
            None,
        ),
        (
            Status::with_metadata(Code::NotFound, "", pushback("250")),
            None,
        ),
        (Status::internal(""), None),
        (Status::unimplemented(""), None),
    ];
    for (first, wait) in cases {
        for flavor in FLAVORS {
            for with_listener in [false, true] {
                let clock = VirtualClock::new();
                let (builder, log) = listened(retrying("grpc", &clock), with_listener);
                let pipeline = builder.classify(seawall::tonic::classify).build().unwrap();
                let (mut results, calls) =
                    run_scripted(&pipeline, flavor, 1, |n| grpc_scripted(n, &first));
                let result = results.remove(0);
                let case = format!("{first:?} {flavor:?} listener {with_listener}");
                match wait {
                    Some(wait) => {
                        assert_eq!(result.unwrap(), "hello", "{case}");
                        assert_eq!(clock.now(), wait, "{case}");
                        if with_listener {
                            assert_eq!(retry_waits(&log), [wait], "{case}");
                        }
                    }
                    None => {
                        let error = result.unwrap_err();
                        let status = error.operation_error().expect("the server's status");
                        assert_eq!(status.code(), first.code(), "{case}");
                        assert_eq!(calls, 1, "{case}");
                        assert_eq!(clock.now(), Duration::ZERO, "{case}");
                    }
                }
            }
        }
    }
}

#[tokio::test]
async fn resource_exhausted_spares_the_circuit_and_its_pushback_opens_the_cooldown() {
    let cases = [
        (Status::resource_exhausted(""), CircuitState::Closed),
        (
            Status::with_metadata(Code::ResourceExhausted, "", pushback("-1")),
            CircuitState::Closed,
        ),
        (Status::unavailable(""), CircuitState::Open),
        (
            Status::with_metadata(Code::Unavailable, "", pushback("-1")),
            CircuitState::Open,
        ),
        (Status::not_found(""), CircuitState::Closed),
        (Status::internal(""), CircuitState::Open),
    ];
    for (status, expected) in cases {
        let pipeline = tripping("grpc-circuit")
            .classify(seawall::tonic::classify)
            .build()
            .unwrap();
        let _ = pipeline.call(|_| Err::<(), _>(status.clone()));
        assert_eq!(pipeline.circuit_state().unwrap(), expected, "{status:?}");
    }

    let clock = VirtualClock::new();
    let pipeline = cooling("grpc-cool", &clock)
        .classify(seawall::tonic::classify)
        .build()
        .unwrap();
    let busy = Status::with_metadata(Code::ResourceExhausted, "busy", pushback("30000"));
    let first = pipeline
        .run(|_| std::future::ready(Err::<(), _>(busy.clone())))
        .await;
    assert_eq!(
        first.unwrap_err().operation_error().map(Status::code),
        Some(Code::ResourceExhausted)
    );
    let second = pipeline
        .run(|_| std::future::ready(Ok::<_, Status>(())))
        .await;
    assert_eq!(
        refusal(&second),
        Some((RejectionReason::CooldownActive, Some(secs(30))))
    );
    let refused = second.unwrap_err();
    // Answered to a gRPC client: UNAVAILABLE with the wait as pushback,
    // which seawall's own classifier reads back as a retry after 30 s.
    let answer = Status::from(refused);
    assert_eq!(answer.code(), Code::Unavailable);
    assert_eq!(
        answer
            .metadata()
            .get(seawall::tonic::RETRY_PUSHBACK)
            .unwrap(),
        "30000"
    );
    assert_eq!(
        seawall::tonic::classify(&answer),
        Verdict::retry().with_retry_after(secs(30))
    );
}

fn pushback_of(status: &Status) -> Option<String> {
    status
        .metadata()
        .get(seawall::tonic::RETRY_PUSHBACK)
        .map(|v| v.to_str().unwrap().to_owned())
}

#[test]
fn a_failed_call_answers_the_grpc_status_of_the_table() {
    for reason in RejectionReason::ALL {
        let code = match reason {
            RejectionReason::RateLimited => Code::ResourceExhausted,
            _ => Code::Unavailable,
        };
        for (wait, expected) in [
            (None, None),
            (Some(Duration::ZERO), None),
            (Some(Duration::from_nanos(1)), Some("1")),
            (Some(ms(1500)), Some("1500")),
            (Some(Duration::from_micros(2_500_001)), Some("2501")),
        ] {
            let status =
                seawall::tonic::status(Error::<Status>::Rejected(Rejection::new(reason, wait)));
            assert_eq!(status.code(), code, "{reason:?}");
            assert_eq!(
                pushback_of(&status).as_deref(),
                expected,
                "{reason:?} {wait:?}"
            );
            assert!(status.message().contains(reason.as_str()), "{status:?}");
        }
        // However long the wait: a status, no panic.
        let status = seawall::tonic::status(Error::<Status>::Rejected(Rejection::new(
            reason,
            Some(Duration::MAX),
        )));
        assert_eq!(status.code(), code);
        assert!(pushback_of(&status).is_some());
    }
    let late = seawall::tonic::status(Error::<Status>::Timeout(TimeoutError::new(
        TimeoutScope::Overall,
        secs(1),
        1,
    )));
    assert_eq!(
        (late.code(), pushback_of(&late)),
        (Code::DeadlineExceeded, None)
    );
    let store = seawall::tonic::status(Error::<Status>::Store(StoreError::Unavailable(
        "down".into(),
    )));
    assert_eq!(
        (store.code(), pushback_of(&store)),
        (Code::Unavailable, None)
    );
    let own = Status::with_metadata(Code::Unavailable, "own", pushback("7"));
    for error in [
        Error::Operation(own.clone()),
        Error::RetryExhausted {
            attempts: 3,
            last: own.clone(),
        },
    ] {
        let status = Status::from(error);
        assert_eq!(
            (status.code(), status.message()),
            (Code::Unavailable, "own")
        );
        assert_eq!(pushback_of(&status).as_deref(), Some("7"));
    }
    let io = seawall::tonic::status(Error::Operation(std::io::Error::other("reset")));
    assert_eq!(io.code(), Code::Unknown);
}

#[tokio::test]
async fn a_tower_layer_with_status_errors_answers_grpc_statuses() {
    let clock = VirtualClock::new();
    let calls = Arc::new(AtomicU32::new(0));
    let counter = Arc::clone(&calls);
    let service = tower::service_fn(move |_: u32| {
        counter.fetch_add(1, Ordering::SeqCst);
        async {
            Err::<u32, _>(Status::with_metadata(
                Code::Unavailable,
                "down",
                pushback("250"),
            ))
        }
    });
    let layered = PipelineLayer::new(retrying("grpc-layer", &clock))
        .unwrap()
        .classify_error(seawall::tonic::classify)
        .status_errors()
        .layer(service);
    let status = layered.oneshot(1).await.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (Code::Unavailable, "down")
    );
    assert_eq!(pushback_of(&status).as_deref(), Some("250"));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(clock.now(), ms(500));

    let limited = PipelineLayer::new(
        Pipeline::builder(unique("grpc-layer-rate"))
            .rate_limiter(RateLimiter::fixed_window(1, ms(1500)))
            .clock(VirtualClock::new()),
    )
    .unwrap()
    .status_errors()
    .layer(tower::service_fn(
        |n: u32| async move { Ok::<_, Status>(n) },
    ));
    assert_eq!(limited.clone().oneshot(1).await.unwrap(), 1);
    let refused = limited.oneshot(2).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(pushback_of(&refused).as_deref(), Some("1500"));
}

// ------------------------------------------------ the layer's HTTP answers

#[test]
fn error_response_answers_the_status_of_the_table() {
    for reason in RejectionReason::ALL {
        let status = match reason {
            RejectionReason::RateLimited => 429,
            _ => 503,
        };
        for (wait, seconds) in [
            (None, "1"),
            (Some(Duration::ZERO), "1"),
            (Some(ms(1)), "1"),
            (Some(secs(2)), "2"),
            (Some(ms(2001)), "3"),
            (Some(secs(300)), "300"),
        ] {
            let error: ServiceError<()> = Error::Rejected(Rejection::new(reason, wait)).into();
            let response: Response<String> = error_response(&error);
            assert_eq!(response.status().as_u16(), status, "{reason:?}");
            assert_eq!(
                response.headers()[RETRY_AFTER],
                seconds,
                "{reason:?} {wait:?}"
            );
            assert_eq!(response.body(), "", "an empty body");
        }
    }
    let store: ServiceError<()> = Error::Store(StoreError::Unavailable("down".into())).into();
    let response: Response<String> = error_response(&store);
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()[RETRY_AFTER], "1");
    for scope in [TimeoutScope::Overall, TimeoutScope::Attempt] {
        let late: ServiceError<()> = Error::Timeout(TimeoutError::new(scope, secs(1), 1)).into();
        let response: Response<String> = error_response(&late);
        assert_eq!(response.status(), 504);
        assert!(response.headers().get(RETRY_AFTER).is_none());
    }
    for failed in [
        ServiceError::Pipeline(Error::Operation(())),
        ServiceError::Pipeline(Error::RetryExhausted {
            attempts: 3,
            last: (),
        }),
        ServiceError::NotReady(()),
    ] {
        let response: Response<String> = error_response(&failed);
        assert_eq!(response.status(), 500);
        assert!(response.headers().get(RETRY_AFTER).is_none());
    }
}

#[test]
fn error_response_gives_any_wait_a_retry_after_without_panicking() {
    // A wait as long as a `Duration` can be (a policy written in code may
    // refuse with any): still a 503 with a `Retry-After` in whole seconds.
    let outcome = std::panic::catch_unwind(|| {
        let error: ServiceError<()> = Error::Rejected(Rejection::new(
            RejectionReason::PolicyRefused,
            Some(Duration::MAX),
        ))
        .into();
        let response: Response<String> = error_response(&error);
        (
            response.status().as_u16(),
            response.headers().get(RETRY_AFTER).cloned(),
        )
    });
    let (status, retry_after) = outcome.expect("error_response panicked on Duration::MAX");
    assert_eq!(status, 503);
    assert!(retry_after.is_some());
}

/// Serves `service` over HTTP/1 on a random loopback port.
async fn serve<S>(service: S) -> (SocketAddr, tokio::task::JoinHandle<()>)
where
    S: tower::Service<Request<Incoming>, Response = Response<Full<Bytes>>> + Clone + Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::Future: Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = service.clone();
            let hyper_service = hyper::service::service_fn(move |request| {
                let service = service.clone();
                async move { service.oneshot(request).await }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), hyper_service),
            );
        }
    });
    (addr, task)
}

/// A handler answering its n-th request with `answer(n)`: a status and a
/// `Retry-After` value, after a real delay; or an error.
#[derive(Debug, Clone)]
enum Handled {
    Status(u16, Option<&'static str>),
    Slow(Duration),
    Fails,
}

fn handler(
    answer: impl Fn(u32) -> Handled + Clone + Send + Sync + 'static,
) -> impl tower::Service<
    Request<Incoming>,
    Response = Response<Full<Bytes>>,
    Error = std::io::Error,
    Future = impl Send + 'static,
> + Clone
       + Send
       + 'static {
    let calls = Arc::new(AtomicU32::new(0));
    tower::service_fn(move |_: Request<Incoming>| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        let what = answer(n);
        async move {
            let (status, retry_after) = match what {
                Handled::Status(status, retry_after) => (status, retry_after),
                Handled::Slow(delay) => {
                    tokio::time::sleep(delay).await;
                    (200, None)
                }
                Handled::Fails => return Err(std::io::Error::other("handler failed")),
            };
            let mut response = Response::builder().status(status);
            if let Some(value) = retry_after {
                response = response.header(RETRY_AFTER, value);
            }
            Ok(response
                .body(Full::new(Bytes::from(format!("handler #{n}"))))
                .unwrap())
        }
    })
}

/// What a client got: status, `Retry-After`, body.
async fn get(addr: SocketAddr) -> (u16, Option<String>, String) {
    let response = reqwest::get(format!("http://{addr}/orders")).await.unwrap();
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .map(|v| v.to_str().unwrap().to_owned());
    (status, retry_after, response.text().await.unwrap())
}

fn answer(status: u16, retry_after: Option<&str>, body: &str) -> (u16, Option<String>, String) {
    (status, retry_after.map(str::to_owned), body.to_owned())
}

#[tokio::test]
async fn error_responses_answer_refusals_timeouts_and_failures_over_http() {
    type Layered = PipelineLayer<
        fn(&Response<Full<Bytes>>) -> Option<Verdict>,
        seawall::tower::RetryableErrors,
        seawall::tower::SingleAttempt,
        seawall::tower::NoPartition,
        seawall::tower::ErrorResponses,
    >;
    let layer = |builder: PipelineBuilder| -> Layered {
        PipelineLayer::single_attempt(builder)
            .unwrap()
            .classify_response(
                seawall::http::classify_response::<Full<Bytes>>
                    as fn(&Response<Full<Bytes>>) -> Option<Verdict>,
            )
            .error_responses()
    };
    let clock = VirtualClock::new();

    // Rate limited: 429, the window's end in whole seconds, rounded up.
    let limited = layer(
        Pipeline::builder(unique("shed-rate"))
            .rate_limiter(RateLimiter::fixed_window(1, ms(1500)))
            .clock(clock.clone()),
    );
    let (addr, rate) = serve(limited.layer(handler(|_| Handled::Status(200, None)))).await;
    assert_eq!(get(addr).await, answer(200, None, "handler #1"));
    assert_eq!(get(addr).await, answer(429, Some("2"), ""));
    rate.abort();

    // A circuit the handler's 500 opened: 503 with the circuit's wait.
    let breaker = layer(
        Pipeline::builder(unique("shed-circuit"))
            .circuit_breaker(CircuitBreaker::consecutive_failures(1).cooldown(secs(30)))
            .clock(clock.clone()),
    );
    let (addr, circuit) = serve(breaker.layer(handler(|_| Handled::Status(500, None)))).await;
    assert_eq!(get(addr).await, answer(500, None, "handler #1"));
    assert_eq!(get(addr).await, answer(503, Some("30"), ""));
    circuit.abort();

    // A cooldown the handler's 429 opened: that 429 as it was, then 503
    // with the time left of the pause.
    let cooled = layer(cooling("shed-cooldown", &clock));
    let (addr, cooldown) = serve(cooled.layer(handler(|n| match n {
        1 => Handled::Status(429, Some("30")),
        _ => Handled::Status(200, None),
    })))
    .await;
    assert_eq!(get(addr).await, answer(429, Some("30"), "handler #1"));
    assert_eq!(get(addr).await, answer(503, Some("30"), ""));
    cooldown.abort();

    // The handler's own 4xx and 5xx go back as they are.
    let own = layer(Pipeline::builder(unique("shed-own")).clock(clock.clone()));
    let (addr, statuses) = serve(own.layer(handler(|n| match n {
        1 => Handled::Status(404, None),
        2 => Handled::Status(503, Some("7")),
        _ => Handled::Status(200, None),
    })))
    .await;
    assert_eq!(get(addr).await, answer(404, None, "handler #1"));
    assert_eq!(get(addr).await, answer(503, Some("7"), "handler #2"));
    statuses.abort();

    // The handler's error: 500, no Retry-After.
    let failing = layer(Pipeline::builder(unique("shed-error")).clock(clock.clone()));
    let (addr, errors) = serve(failing.layer(handler(|_| Handled::Fails))).await;
    assert_eq!(get(addr).await, answer(500, None, ""));
    errors.abort();

    // Too slow: 504, no Retry-After (real time, 100 ms; the handler would
    // take 10 s).
    let slow = layer(Pipeline::builder(unique("shed-timeout")).timeout(ms(100)));
    let (addr, timeout) = serve(slow.layer(handler(|_| Handled::Slow(secs(10))))).await;
    let started = Instant::now();
    assert_eq!(get(addr).await, answer(504, None, ""));
    assert!(started.elapsed() < secs(5), "{:?}", started.elapsed());
    timeout.abort();
}

// ------------------------------------- classifiers, fallbacks, interplay

/// A GET through a retrying pipeline judging reqwest's errors with `judge`,
/// to a server answering `code` with `Retry-After: 4` first, then 200;
/// gives the result, the server's hits and the time waited.
async fn judged_by(
    code: u16,
    tag: &str,
    judge: impl Fn(&reqwest::Error) -> Verdict + Send + Sync + 'static,
) -> (Result<reqwest::Response, SendError>, u32, Duration) {
    let server = hinting(code, "4").await;
    let clock = VirtualClock::new();
    let pipeline = retrying(tag, &clock).classify(judge).build().unwrap();
    let result = get_through(&pipeline, server.url()).await;
    (result, server.hits(), clock.now())
}

#[tokio::test]
async fn a_classifier_of_ones_own_decides_the_kind_and_the_response_adds_its_hint() {
    // No hint of its own: the response's `Retry-After` stands.
    let (result, _, waited) = judged_by(503, "own-classifier", |_| Verdict::retry()).await;
    assert_eq!(result.unwrap().status(), 200);
    assert_eq!(waited, secs(4));

    // A hint of its own wins over the response's.
    let (result, _, waited) = judged_by(429, "own-hint", |_| {
        Verdict::throttled().with_retry_after(secs(9))
    })
    .await;
    assert_eq!(result.unwrap().status(), 200);
    assert_eq!(waited, secs(9));

    // It may refuse to retry what the table retries.
    let (result, hits, waited) = judged_by(503, "own-abort", |_| Verdict::abort()).await;
    let error = result.unwrap_err();
    assert!(
        matches!(error, SendError::Pipeline(Error::Operation(_))),
        "{error:?}"
    );
    assert_eq!(hits, 1);
    assert_eq!(waited, Duration::ZERO);
}

#[tokio::test]
async fn the_middleware_honours_its_own_response_classifier() {
    // A 200 judged a retryable failure with a hint: retried after it.
    let server = Server::start(then_ok(reply(200).header("x-busy", "1"))).await;
    let clock = VirtualClock::new();
    let middleware = SeawallMiddleware::new(retrying("mw-own-hint", &clock).build().unwrap())
        .classify_response(|r: &reqwest::Response| {
            r.headers()
                .contains_key("x-busy")
                .then(|| Verdict::retry().with_retry_after(secs(6)))
        });
    let response = wrapped(middleware).get(server.url()).send().await.unwrap();
    assert_eq!(response.text().await.unwrap(), "reply #2: 200");
    assert_eq!(clock.now(), secs(6));

    // A 200 judged a failure that is not retried: returned as is, counted
    // against the circuit. One judged ignored: returned, not counted.
    for (verdict, expected) in [
        (Verdict::failure(), CircuitState::Open),
        (Verdict::ignore(), CircuitState::Closed),
        (Verdict::abort(), CircuitState::Closed),
    ] {
        let server = Server::always(200).await;
        let pipeline = Pipeline::builder(unique("mw-own-verdict"))
            .retry(Retry::constant(BACKOFF).max_attempts(3))
            .circuit_breaker(CircuitBreaker::consecutive_failures(1))
            .clock(VirtualClock::new())
            .build()
            .unwrap();
        let middleware =
            SeawallMiddleware::new(pipeline.clone()).classify_response(move |_| Some(verdict));
        let response = wrapped(middleware).get(server.url()).send().await.unwrap();
        assert_eq!(response.status(), 200, "{verdict:?}");
        assert_eq!(server.hits(), 1, "{verdict:?}");
        assert_eq!(pipeline.circuit_state().unwrap(), expected, "{verdict:?}");
    }
}

#[tokio::test]
async fn a_fallback_answers_when_the_retries_run_out() {
    for code in [503u16, 429, 404, 600] {
        let server = Server::always(code).await;
        let clock = VirtualClock::new();
        let pipeline = retrying("send-fallback", &clock)
            .classify(seawall::reqwest::classify)
            .fallback(|error: Error<reqwest::Error>, _ctx| async move {
                let status = error.operation_error().and_then(reqwest::Error::status);
                let text = format!("cached after {status:?}");
                Ok::<_, reqwest::Error>(reqwest::Response::from(
                    http::Response::builder().status(200).body(text).unwrap(),
                ))
            })
            .build()
            .unwrap();
        let response = get_through(&pipeline, server.url()).await.unwrap();
        let doc = documented(code);
        if doc.retried() {
            assert_eq!(response.status(), 200, "{code}");
            assert_eq!(
                response.text().await.unwrap(),
                format!("cached after Some({code})"),
                "{code}"
            );
            assert_eq!(server.hits(), 3, "{code}");
        } else {
            // Kept as it is: no error, so no fallback.
            assert_eq!(response.status().as_u16(), code, "{code}");
            assert_eq!(server.hits(), 1, "{code}");
        }
    }
}

#[tokio::test]
async fn a_retry_and_a_cooldown_wait_for_the_same_hint_once() {
    for code in [429, 503] {
        let server = hinting(code, "30").await;
        let clock = VirtualClock::new();
        let (sender, log) = Sender::build(
            Variant::Listened,
            retrying("retry-cool", &clock).cooldown(Cooldown::new()),
        );
        let response = sender.send(client().get(server.url())).await.unwrap();
        assert_eq!(response.status(), 200, "{code}");
        assert_eq!(server.hits(), 2, "{code}");
        assert_eq!(clock.now(), secs(30), "{code}");
        assert_eq!(retry_waits(&log), [secs(30)], "{code}");

        let server = hinting(code, "30").await;
        let clock = VirtualClock::new();
        let pipeline = retrying("mw-retry-cool", &clock)
            .cooldown(Cooldown::new())
            .build()
            .unwrap();
        let response = via(pipeline).get(server.url()).send().await.unwrap();
        assert_eq!(response.status(), 200, "{code}");
        assert_eq!(clock.now(), secs(30), "{code}");
    }
}

#[tokio::test]
async fn a_throttled_probe_gives_its_place_back() {
    // 503 opens the circuit; after the cooldown a probe gets a 429, which
    // the circuit does not record; the next call probes again and closes it.
    let server = Server::start(|n| match n {
        1 => reply(503),
        2 => reply(429),
        _ => reply(200),
    })
    .await;
    let clock = VirtualClock::new();
    let pipeline = Pipeline::builder(unique("throttled-probe"))
        .circuit_breaker(
            CircuitBreaker::consecutive_failures(1)
                .cooldown(secs(5))
                .half_open_calls(1),
        )
        .clock(clock.clone())
        .build()
        .unwrap();
    let client = via(pipeline.clone());
    assert_eq!(client.get(server.url()).send().await.unwrap().status(), 503);
    assert_eq!(pipeline.circuit_state().unwrap(), CircuitState::Open);
    clock.advance(secs(5));
    assert_eq!(client.get(server.url()).send().await.unwrap().status(), 429);
    assert_ne!(pipeline.circuit_state().unwrap(), CircuitState::Open);
    assert_eq!(client.get(server.url()).send().await.unwrap().status(), 200);
    assert_eq!(pipeline.circuit_state().unwrap(), CircuitState::Closed);
    assert_eq!(server.hits(), 3);
}

#[tokio::test]
async fn a_pipeline_deadline_ends_a_slow_request_as_a_timeout() {
    // Real time: the server answers after 10 s, the call may take 150 ms.
    let server = Server::start(|_| reply(200).after(secs(10))).await;
    let started = Instant::now();
    let pipeline = Pipeline::builder(unique("send-deadline"))
        .timeout(ms(150))
        .classify(seawall::reqwest::classify)
        .build()
        .unwrap();
    let error = get_through(&pipeline, server.url()).await.unwrap_err();
    assert!(error.is_timeout(), "{error:?}");

    let pipeline = Pipeline::builder(unique("mw-deadline"))
        .timeout(ms(150))
        .build()
        .unwrap();
    let error = via(pipeline).get(server.url()).send().await.unwrap_err();
    let timed_out = match &error {
        reqwest_middleware::Error::Reqwest(e) => e.is_timeout(),
        reqwest_middleware::Error::Middleware(_) => send_error(&error).is_timeout(),
    };
    assert!(timed_out, "{error:?}");
    assert!(started.elapsed() < secs(5), "{:?}", started.elapsed());
}

#[tokio::test]
async fn each_grpc_attempt_gets_the_time_left_as_its_grpc_timeout() {
    let deadline = |tag: &str, clock: &VirtualClock| {
        Pipeline::builder(unique(tag))
            .timeout(secs(2))
            .retry(Retry::constant(BACKOFF).max_attempts(3))
            .clock(clock.clone())
            .classify(seawall::tonic::classify)
            .build()
            .unwrap()
    };
    let clock = VirtualClock::new();
    let pipeline = deadline("grpc-deadline", &clock);
    let sent = Mutex::new(Vec::new());
    let result = pipeline
        .run(|ctx| {
            let request = seawall::tonic::with_deadline(tonic::Request::new(()), &ctx);
            let mut sent = sent.lock().unwrap();
            sent.push(seawall::tonic::grpc_timeout(request.metadata()));
            let answer = match sent.len() {
                1 => Err(Status::with_metadata(
                    Code::Unavailable,
                    "",
                    pushback("250"),
                )),
                _ => Ok(()),
            };
            std::future::ready(answer)
        })
        .await;
    result.unwrap();
    assert_eq!(*sent.lock().unwrap(), [Some(secs(2)), Some(ms(1750))]);

    // A pushback the deadline cannot wait for: no retry.
    let clock = VirtualClock::new();
    let pipeline = deadline("grpc-deadline-long", &clock);
    let calls = AtomicU32::new(0);
    let error = pipeline
        .run(|_| {
            calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Err::<(), _>(Status::with_metadata(
                Code::ResourceExhausted,
                "",
                pushback("5000"),
            )))
        })
        .await
        .unwrap_err();
    assert_eq!(
        error.operation_error().map(Status::code),
        Some(Code::ResourceExhausted)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(clock.now(), Duration::ZERO);
}

// ------------------------------------------------ refused retries, tenants

#[tokio::test]
async fn a_retry_refused_by_a_policy_is_a_rejection_after_errors_and_the_response_after_statuses() {
    // Connection refused twice opens the circuit: the third attempt is
    // refused, and the caller is told so.
    let port = closed_port().await;
    let breaking = || {
        Pipeline::builder(unique("refused-retry"))
            .retry(Retry::constant(BACKOFF).max_attempts(3))
            .circuit_breaker(CircuitBreaker::consecutive_failures(2))
            .clock(VirtualClock::new())
    };
    for variant in VARIANTS {
        let (sender, _) = Sender::build(variant, breaking());
        let error = sender
            .send(client().get(format!("http://127.0.0.1:{port}/")))
            .await
            .unwrap_err();
        assert_eq!(
            error.rejection().map(|r| r.reason),
            Some(RejectionReason::CircuitOpen),
            "{variant:?}: {error:?}"
        );
        assert!(error.is_rejected());
    }
    let error = via(breaking().build().unwrap())
        .get(format!("http://127.0.0.1:{port}/"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        send_error(&error).rejection().map(|r| r.reason),
        Some(RejectionReason::CircuitOpen),
        "{error:?}"
    );

    // Two 503 open it: send_through reports the refusal of the retry (the
    // attempts were sent), the middleware gives back the last 503.
    for variant in VARIANTS {
        let server = Server::always(503).await;
        let (sender, _) = Sender::build(variant, breaking());
        let error = sender.send(client().get(server.url())).await.unwrap_err();
        assert_eq!(
            error.rejection().map(|r| r.reason),
            Some(RejectionReason::CircuitOpen),
            "{variant:?}: {error:?}"
        );
        assert_eq!(server.hits(), 2, "{variant:?}");
    }
    let server = Server::always(503).await;
    let response = via(breaking().build().unwrap())
        .get(server.url())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.text().await.unwrap(), "reply #2: 503");

    // The tower layer: an inner error whose retry is refused is the
    // rejection; a response whose retry is refused is that response.
    let layer = PipelineLayer::new(breaking()).unwrap();
    let failing =
        tower::service_fn(|_: u32| async { Err::<u32, _>(std::io::Error::other("down")) });
    let error = layer.layer(failing).oneshot(1).await.unwrap_err();
    assert_eq!(
        error.rejection().map(|r| r.reason),
        Some(RejectionReason::CircuitOpen),
        "{error:?}"
    );
    let (response, _) = through_layer(breaking(), |_| reply(503)).await;
    assert_eq!(
        (response.status().as_u16(), response.body().as_str()),
        (503, "answer #2")
    );
}

#[tokio::test]
async fn each_tenant_has_its_own_cooldown() {
    // Tenant "a" is told to wait 30 s; tenant "b" is not held back.
    let server = hinting(429, "30").await;
    let clock = VirtualClock::new();
    let middleware = SeawallMiddleware::new(cooling("mw-tenant-cool", &clock).build().unwrap())
        .partition_by(|r: &reqwest::Request| {
            r.headers()
                .get("x-tenant")
                .and_then(|t| t.to_str().ok())
                .map(str::to_owned)
        });
    let client = wrapped(middleware);
    let send = |tenant: &'static str| client.get(server.url()).header("x-tenant", tenant).send();
    assert_eq!(send("a").await.unwrap().status(), 429);
    let refused = send("a").await.unwrap_err();
    assert_eq!(
        send_error(&refused)
            .rejection()
            .map(|r| (r.reason, r.retry_after)),
        Some((RejectionReason::CooldownActive, Some(secs(30))))
    );
    assert_eq!(send("b").await.unwrap().status(), 200);
    assert_eq!(server.hits(), 2);

    // The same through the tower layer.
    let layer = PipelineLayer::single_attempt(cooling("tower-tenant-cool", &clock))
        .unwrap()
        .classify_response(seawall::http::classify_response::<String>)
        .partition_by(|r: &Request<String>| Some(r.body().clone()))
        .error_responses();
    let service = layer.layer(backend(hinted(429, "30")));
    let call = |tenant: &str| service.clone().oneshot(Request::new(tenant.to_owned()));
    assert_eq!(call("a").await.unwrap().status(), 429);
    let refused = call("a").await.unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()[RETRY_AFTER], "30");
    assert_eq!(call("b").await.unwrap().status(), 200);
}

#[tokio::test]
async fn a_request_reqwest_refuses_to_send_is_retried_only_without_the_classifier() {
    // A scheme reqwest does not send: a builder error at send time.
    for variant in VARIANTS {
        let clock = VirtualClock::new();
        let (sender, _) = Sender::build(variant, retrying("send-scheme", &clock));
        let error = sender
            .send(client().get("ftp://127.0.0.1/file"))
            .await
            .unwrap_err();
        let last = error.reqwest_error().expect("reqwest's error");
        assert!(last.is_builder(), "{variant:?}: {last:?}");
        let attempts = match &error {
            SendError::Pipeline(Error::RetryExhausted { attempts, .. }) => *attempts,
            SendError::Pipeline(Error::Operation(_)) => 1,
            other => panic!("{variant:?}: {other:?}"),
        };
        let expected = match variant {
            Variant::Plain => 3,
            Variant::Classified | Variant::Listened => 1,
        };
        assert_eq!(attempts, expected, "{variant:?}");
    }
}

/// A middleware behind seawall's that fails every request with an error
/// of its own.
struct Broken;

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for Broken {
    async fn handle(
        &self,
        _: reqwest::Request,
        _: &mut http::Extensions,
        _: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        Err(reqwest_middleware::Error::middleware(
            std::io::Error::other("broken"),
        ))
    }
}

#[tokio::test]
async fn an_error_of_another_middleware_is_a_failure_not_retried() {
    let server = Server::always(200).await;
    let clock = VirtualClock::new();
    let pipeline = retrying("mw-other-error", &clock)
        .circuit_breaker(CircuitBreaker::consecutive_failures(1))
        .build()
        .unwrap();
    let client = ClientBuilder::new(client())
        .with(SeawallMiddleware::new(pipeline.clone()))
        .with(Broken)
        .build();
    let error = client.get(server.url()).send().await.unwrap_err();
    assert!(
        matches!(error, reqwest_middleware::Error::Middleware(_)),
        "{error:?}"
    );
    assert_eq!(error.to_string(), "broken");
    assert_eq!(clock.now(), Duration::ZERO, "not retried");
    assert_eq!(pipeline.circuit_state().unwrap(), CircuitState::Open);
    assert_eq!(server.hits(), 0);
}

#[test]
fn a_call_during_a_pause_waits_for_it_when_it_may() {
    for flavor in FLAVORS {
        for (value, outcome) in [("10", Ok(secs(10))), ("60", Err(secs(60)))] {
            let clock = VirtualClock::new();
            // The default cooldown: a call may wait up to 30 s.
            let pipeline = Pipeline::builder(unique("own-cool-wait"))
                .cooldown(Cooldown::new())
                .clock(clock.clone())
                .classify(judge)
                .build()
                .unwrap();
            let (results, _) =
                run_scripted(&pipeline, flavor, 2, |n| scripted(n, 503, Some(value)));
            let case = format!("{flavor:?} Retry-After {value}");
            assert!(results[0].is_err(), "{case}");
            match outcome {
                Ok(waited) => {
                    assert_eq!(results[1].as_ref().unwrap().as_u16(), 200, "{case}");
                    assert_eq!(clock.now(), waited, "{case}");
                }
                Err(left) => {
                    assert_eq!(
                        refusal(&results[1]),
                        Some((RejectionReason::CooldownActive, Some(left))),
                        "{case}"
                    );
                    assert_eq!(clock.now(), Duration::ZERO, "{case}");
                }
            }
        }
    }
}

/// Hedging takes the retry's place: a retryable status is answered by a
/// further attempt at once, a 4xx ends the call. On the system clock, with
/// a hedging delay (10 s) no case waits for.
#[tokio::test]
async fn hedged_requests_judge_statuses_as_retries_do() {
    let started = Instant::now();
    for (first, expected, hits) in [(503u16, 200u16, 2u32), (429, 200, 2), (404, 404, 1)] {
        let hedged = || {
            Pipeline::builder(unique("hedged"))
                .hedging(Hedging::latency(secs(10)).max_hedged_attempts(1))
        };
        let server = Server::start(then_ok(reply(first))).await;
        let (sender, _) = Sender::build(Variant::Classified, hedged());
        let response = sender.send(client().get(server.url())).await.unwrap();
        assert_eq!(response.status().as_u16(), expected, "{first}");
        assert_eq!(server.hits(), hits, "{first}");

        let server = Server::start(then_ok(reply(first))).await;
        let response = via(hedged().build().unwrap())
            .get(server.url())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), expected, "{first}");
        assert_eq!(server.hits(), hits, "{first}");
    }
    assert!(started.elapsed() < secs(5), "{:?}", started.elapsed());
}
