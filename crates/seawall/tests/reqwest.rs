//! The reqwest adapter against a real HTTP/1 server on 127.0.0.1 (random
//! port). Retry waits run on seawall's `VirtualClock`; the timeout tests use
//! real time, with delays of a few hundred milliseconds at most.
#![cfg(feature = "reqwest")]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use seawall::clock::BoxSleep;
use seawall::pipeline::Handles;
use seawall::reqwest::{SendError, SendThrough};
use seawall::testing::VirtualClock;
use seawall::{
    CircuitBreaker, CircuitState, Clock, Cooldown, Error, EventKind, Hedging, Pipeline,
    RejectionReason, Retry, Verdict,
};
use tokio::net::TcpListener;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// An HTTP/1 server on a random loopback port answering its n-th request
/// (from 1) with `answer(n)`; counts the requests it got.
struct Server {
    addr: SocketAddr,
    hits: Arc<AtomicU32>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One answer of the [`Server`]: a status and headers, sent after a delay.
struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    delay: Duration,
}

impl Reply {
    fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            delay: Duration::ZERO,
        }
    }

    fn header(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.push((name, value.into()));
        self
    }
}

impl Server {
    /// A server answering the n-th request with the status `answer(n).0`
    /// after `answer(n).1`.
    async fn start(answer: impl Fn(u32) -> (u16, Duration) + Send + Sync + 'static) -> Server {
        Server::replying(move |n| {
            let (status, delay) = answer(n);
            Reply {
                delay,
                ..Reply::status(status)
            }
        })
        .await
    }

    async fn replying(answer: impl Fn(u32) -> Reply + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicU32::new(0));
        let answer = Arc::new(answer);
        let counter = Arc::clone(&hits);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (answer, counter) = (Arc::clone(&answer), Arc::clone(&counter));
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |_: Request<Incoming>| {
                        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                        let reply = answer(n);
                        async move {
                            tokio::time::sleep(reply.delay).await;
                            let body = Full::new(Bytes::from(format!("reply #{n}")));
                            let mut response = Response::builder().status(reply.status);
                            for (name, value) in reply.headers {
                                response = response.header(name, value);
                            }
                            Ok::<_, Infallible>(response.body(body).unwrap())
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Server { addr, hits, task }
    }

    fn url(&self) -> String {
        format!("http://{}/items", self.addr)
    }

    fn hits(&self) -> u32 {
        self.hits.load(Ordering::SeqCst)
    }
}

fn now(status: u16) -> (u16, Duration) {
    (status, Duration::ZERO)
}

fn retrying(name: &str, clock: &VirtualClock) -> seawall::PipelineBuilder {
    Pipeline::builder(name)
        .retry(Retry::constant(ms(10)).max_attempts(3))
        .clock(clock.clone())
}

#[tokio::test]
async fn a_flaky_server_is_retried_to_success() {
    let server = Server::start(|n| now(if n <= 2 { 503 } else { 200 })).await;
    let clock = VirtualClock::new();
    let pipeline = retrying("reqwest-flaky", &clock)
        .classify(seawall::reqwest::classify)
        .build()
        .unwrap();

    let response = reqwest::Client::new()
        .get(server.url())
        .send_through(&pipeline)
        .await
        .unwrap();

    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "reply #3");
    assert_eq!(server.hits(), 3);
    assert_eq!(clock.now(), ms(20));
}

#[tokio::test]
async fn a_plain_pipeline_works_too() {
    let server = Server::start(|n| now(if n == 1 { 502 } else { 200 })).await;
    let clock = VirtualClock::new();
    let pipeline = retrying("reqwest-plain", &clock).build().unwrap();

    let response = reqwest::Client::new()
        .post(server.url())
        .body("{}")
        .send_through(&pipeline)
        .await
        .unwrap();

    assert_eq!(response.status(), 200);
    assert_eq!(server.hits(), 2);
}

#[tokio::test]
async fn a_client_error_is_returned_as_is() {
    let server = Server::start(|_| now(404)).await;
    let clock = VirtualClock::new();
    let pipeline = retrying("reqwest-404", &clock)
        .classify(seawall::reqwest::classify)
        .build()
        .unwrap();

    let response = reqwest::Client::new()
        .get(server.url())
        .send_through(&pipeline)
        .await
        .unwrap();

    assert_eq!(response.status(), 404);
    assert_eq!(server.hits(), 1);
}

#[tokio::test]
async fn when_retries_run_out_the_status_error_comes_back() {
    let server = Server::start(|_| now(503)).await;
    let clock = VirtualClock::new();
    let pipeline = retrying("reqwest-exhausted", &clock)
        .classify(seawall::reqwest::classify)
        .build()
        .unwrap();

    let error = reqwest::Client::new()
        .get(server.url())
        .send_through(&pipeline)
        .await
        .unwrap_err();

    assert_eq!(
        error.status(),
        Some(reqwest::StatusCode::SERVICE_UNAVAILABLE)
    );
    assert!(
        matches!(
            error,
            SendError::Pipeline(Error::RetryExhausted { attempts: 3, .. })
        ),
        "{error:?}"
    );
    assert_eq!(server.hits(), 3);
}

#[tokio::test]
async fn connection_errors_are_retried() {
    let addr = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let clock = VirtualClock::new();
    let pipeline = retrying("reqwest-refused", &clock)
        .classify(seawall::reqwest::classify)
        .build()
        .unwrap();

    let error = reqwest::Client::new()
        .get(format!("http://{addr}/"))
        .send_through(&pipeline)
        .await
        .unwrap_err();

    match &error {
        SendError::Pipeline(Error::RetryExhausted { attempts, last }) => {
            assert_eq!(*attempts, 3);
            assert!(last.is_connect(), "{last:?}");
            assert_eq!(seawall::reqwest::classify(last), Verdict::retry());
        }
        other => panic!("expected a connect error after 3 attempts, got {other:?}"),
    }
}

#[tokio::test]
async fn an_open_circuit_rejects_without_sending() {
    let server = Server::start(|_| now(500)).await;
    let pipeline = Pipeline::builder("reqwest-breaker")
        .circuit_breaker(CircuitBreaker::consecutive_failures(2))
        .clock(VirtualClock::new())
        .classify(seawall::reqwest::classify)
        .build()
        .unwrap();
    let client = reqwest::Client::new();

    for _ in 0..2 {
        let error = client
            .get(server.url())
            .send_through(&pipeline)
            .await
            .unwrap_err();
        assert_eq!(
            error.status(),
            Some(reqwest::StatusCode::INTERNAL_SERVER_ERROR)
        );
    }
    let error = client
        .get(server.url())
        .send_through(&pipeline)
        .await
        .unwrap_err();

    assert_eq!(
        error.rejection().map(|r| r.reason),
        Some(RejectionReason::CircuitOpen)
    );
    assert_eq!(server.hits(), 2);
}

#[tokio::test]
async fn a_status_above_599_is_a_failure_returned_as_is() {
    // `classify_status` judges 600 to 999 a failure: recorded, not retried.
    // reqwest does not call such a status an error, so the caller gets the
    // response itself, as with the middleware.
    let server = Server::start(|_| now(600)).await;
    let pipeline = Pipeline::builder("reqwest-600")
        .retry(Retry::constant(ms(1)).max_attempts(3))
        .circuit_breaker(CircuitBreaker::consecutive_failures(1))
        .clock(VirtualClock::new())
        .classify(seawall::reqwest::classify)
        .build()
        .unwrap();

    let response = reqwest::Client::new()
        .get(server.url())
        .send_through(&pipeline)
        .await
        .unwrap();

    assert_eq!(response.status().as_u16(), 600);
    assert_eq!(server.hits(), 1, "a failure that is not retried");
    assert_eq!(pipeline.circuit_state().unwrap(), CircuitState::Open);
}

#[tokio::test]
async fn a_client_error_is_not_a_failure_of_the_server() {
    // A 404 blames the request: returned as is, not retried, and the
    // circuit counts it as an answer of a healthy server.
    let server = Server::start(|_| now(404)).await;
    let pipeline = Pipeline::builder("reqwest-404-circuit")
        .retry(Retry::constant(ms(1)).max_attempts(3))
        .circuit_breaker(CircuitBreaker::consecutive_failures(1))
        .clock(VirtualClock::new())
        .build()
        .unwrap();

    for _ in 0..2 {
        let response = reqwest::Client::new()
            .get(server.url())
            .send_through(&pipeline)
            .await
            .unwrap();
        assert_eq!(response.status(), 404);
    }
    assert_eq!(server.hits(), 2);
    assert_eq!(pipeline.circuit_state().unwrap(), CircuitState::Closed);
}

#[tokio::test]
async fn a_request_that_cannot_be_built_is_not_sent() {
    let clock = VirtualClock::new();
    let pipeline = retrying("reqwest-build", &clock).build().unwrap();

    let error = reqwest::Client::new()
        .get("not a url")
        .send_through(&pipeline)
        .await
        .unwrap_err();

    assert!(matches!(error, SendError::Build(_)), "{error:?}");
    assert!(error.to_string().starts_with("request could not be built"));
}

fn streaming_body() -> reqwest::Body {
    let chunks = vec![Ok::<_, std::io::Error>(Bytes::from_static(b"chunk"))];
    reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))
}

#[tokio::test]
async fn a_streaming_body_is_refused_when_the_pipeline_may_retry() {
    let server = Server::start(|_| now(200)).await;
    let clock = VirtualClock::new();
    let pipeline = retrying("reqwest-stream-retry", &clock).build().unwrap();

    let error = reqwest::Client::new()
        .post(server.url())
        .body(streaming_body())
        .send_through(&pipeline)
        .await
        .unwrap_err();

    assert!(matches!(error, SendError::BodyNotCloneable), "{error:?}");
    assert!(error
        .to_string()
        .contains("cannot be sent once per attempt"));
    assert_eq!(server.hits(), 0);
}

#[tokio::test]
async fn a_streaming_body_is_refused_when_the_pipeline_hedges() {
    // Hedging makes more than one attempt, each with its own copy of the
    // request: a stream cannot be copied, so nothing is sent.
    let server = Server::start(|_| (200, ms(200))).await;
    for (name, hedging) in [
        ("reqwest-stream-hedge-latency", Hedging::latency(ms(1))),
        ("reqwest-stream-hedge-parallel", Hedging::parallel()),
    ] {
        let pipeline = Pipeline::builder(name).hedging(hedging).build().unwrap();

        let error = reqwest::Client::new()
            .post(server.url())
            .body(streaming_body())
            .send_through(&pipeline)
            .await
            .unwrap_err();

        assert!(
            matches!(error, SendError::BodyNotCloneable),
            "{name}: {error:?}"
        );
    }
    assert_eq!(server.hits(), 0);
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
async fn a_streaming_body_is_refused_when_a_policy_written_in_code_may_run_it_again() {
    let server = Server::start(|_| now(503)).await;
    let pipeline = Pipeline::builder("reqwest-stream-policy")
        .policy::<reqwest::Response, reqwest::Error, _>(RunsTwice)
        .build()
        .unwrap();

    // In a task of its own: a panic shows as an error of the task.
    let url = server.url();
    let sent = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .body(streaming_body())
            .send_through(&pipeline)
            .await
            .map(|response| response.status())
    })
    .await
    .expect("the call ends without a panic");

    assert!(matches!(sent, Err(SendError::BodyNotCloneable)), "{sent:?}");
    assert_eq!(server.hits(), 0, "nothing was sent");
}

#[tokio::test]
async fn a_streaming_body_is_sent_once_without_retry() {
    let server = Server::start(|_| now(200)).await;
    let pipeline = Pipeline::builder("reqwest-stream-once")
        .circuit_breaker(CircuitBreaker::consecutive_failures(5))
        .build()
        .unwrap();

    let response = reqwest::Client::new()
        .post(server.url())
        .body(streaming_body())
        .send_through(&pipeline)
        .await
        .unwrap();

    assert_eq!(response.status(), 200);
    assert_eq!(server.hits(), 1);
}

/// Real time, but timers that fire ten times late: a call can only end on
/// time if the request's own timeout was set from `ctx.remaining()`.
#[derive(Debug)]
struct LateTimers(Instant);

impl Clock for LateTimers {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
    fn sleep(&self, duration: Duration) -> BoxSleep {
        Box::pin(tokio::time::sleep(duration * 10))
    }
    fn sleep_blocking(&self, duration: Duration) {
        std::thread::sleep(duration * 10)
    }
}

#[tokio::test]
async fn the_time_left_becomes_the_request_timeout() {
    let server = Server::start(|_| (200, ms(3_000))).await;
    let pipeline = Pipeline::builder("reqwest-remaining")
        .timeout(ms(150))
        .clock(LateTimers(Instant::now()))
        .classify(seawall::reqwest::classify)
        .build()
        .unwrap();

    let started = Instant::now();
    let error = reqwest::Client::new()
        .get(server.url())
        .send_through(&pipeline)
        .await
        .unwrap_err();

    // The pipeline's own timer would fire after 1.5 s: ending at about
    // 150 ms is reqwest's timeout at work. Its error reaches the pipeline
    // when the deadline has passed, so the pipeline may report either.
    let elapsed = started.elapsed();
    assert!(elapsed < ms(1_000), "{elapsed:?}");
    assert!(error.is_timeout(), "{error:?}");
}

#[tokio::test]
async fn a_shorter_request_timeout_is_kept() {
    let server = Server::start(|_| (200, ms(3_000))).await;
    let pipeline = Pipeline::builder("reqwest-own-timeout")
        .timeout(Duration::from_secs(60))
        .classify(seawall::reqwest::classify)
        .build()
        .unwrap();

    let started = Instant::now();
    let error = reqwest::Client::new()
        .get(server.url())
        .timeout(ms(100))
        .send_through(&pipeline)
        .await
        .unwrap_err();

    assert!(started.elapsed() < ms(1_000), "{:?}", started.elapsed());
    assert!(error
        .reqwest_error()
        .is_some_and(reqwest::Error::is_timeout));
}

#[tokio::test]
async fn without_a_deadline_the_clients_timeout_holds() {
    let server = Server::start(|_| (200, ms(3_000))).await;
    let pipeline = Pipeline::builder("reqwest-client-timeout")
        .circuit_breaker(CircuitBreaker::consecutive_failures(5))
        .classify(seawall::reqwest::classify)
        .build()
        .unwrap();
    let client = reqwest::Client::builder().timeout(ms(100)).build().unwrap();

    let started = Instant::now();
    let error = client
        .get(server.url())
        .send_through(&pipeline)
        .await
        .unwrap_err();

    assert!(started.elapsed() < ms(1_000), "{:?}", started.elapsed());
    assert!(error.is_timeout(), "{error:?}");
}

#[test]
fn the_future_is_send() {
    fn send<T: Send>(_: &T) {}
    let pipeline = Pipeline::builder("reqwest-send").build().unwrap();
    let future = reqwest::Client::new()
        .get("http://127.0.0.1:9/")
        .send_through(&pipeline);
    send(&future);
    let typed = Pipeline::builder("reqwest-send-typed")
        .classify(seawall::reqwest::classify)
        .build()
        .unwrap();
    send(
        &reqwest::Client::new()
            .get("http://127.0.0.1:9/")
            .send_through(&typed),
    );
}

#[test]
fn the_error_is_a_std_error() {
    fn boxed(e: SendError) -> Box<dyn std::error::Error + Send + Sync> {
        Box::new(e)
    }
    let e = boxed(SendError::BodyNotCloneable);
    assert!(e.source().is_none());
}

// 429 Too Many Requests and its `Retry-After`.

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Where the virtual clocks of the 429 tests start: at zero and far from it.
const STARTS: [Duration; 2] = [Duration::ZERO, Duration::from_secs(1_000_000)];

/// A virtual clock starting at `start` that logs each sleep taken on it
/// (the pipeline's waits) and, when the server calls [`arrived`], the time
/// each request reached the server (both relative to `start`).
///
/// [`arrived`]: LoggedClock::arrived
#[derive(Debug, Clone)]
struct LoggedClock {
    clock: VirtualClock,
    start: Duration,
    sleeps: Arc<Mutex<Vec<Duration>>>,
    arrivals: Arc<Mutex<Vec<Duration>>>,
}

impl LoggedClock {
    fn at(start: Duration) -> LoggedClock {
        let clock = VirtualClock::new();
        clock.advance(start);
        LoggedClock {
            clock,
            start,
            sleeps: Arc::default(),
            arrivals: Arc::default(),
        }
    }

    fn elapsed(&self) -> Duration {
        self.clock.now() - self.start
    }

    fn arrived(&self) {
        self.arrivals.lock().unwrap().push(self.elapsed());
    }

    fn sleeps(&self) -> Vec<Duration> {
        self.sleeps.lock().unwrap().clone()
    }

    fn arrivals(&self) -> Vec<Duration> {
        self.arrivals.lock().unwrap().clone()
    }
}

impl Clock for LoggedClock {
    fn now(&self) -> Duration {
        self.clock.now()
    }
    fn sleep(&self, duration: Duration) -> BoxSleep {
        self.sleeps.lock().unwrap().push(duration);
        Clock::sleep(&self.clock, duration)
    }
    fn sleep_blocking(&self, duration: Duration) {
        self.sleeps.lock().unwrap().push(duration);
        self.clock.sleep_blocking(duration)
    }
}

/// A server answering with `answer(n)` that notes on `clock` when each
/// request arrives.
async fn timed_server(
    clock: &LoggedClock,
    answer: impl Fn(u32) -> Reply + Send + Sync + 'static,
) -> Server {
    let clock = clock.clone();
    Server::replying(move |n| {
        clock.arrived();
        answer(n)
    })
    .await
}

fn too_many(retry_after: impl Into<String>) -> Reply {
    Reply::status(429).header("retry-after", retry_after)
}

/// The name of a pipeline of the 429 tests: one per test, variant and
/// start, since pipelines of one name share state in the global store.
fn named(test: &str, variant: Variant, start: Duration) -> String {
    format!("reqwest-429-{test}-{variant:?}-{}", start.as_secs())
}

fn retrying_on(name: String, clock: &LoggedClock) -> seawall::PipelineBuilder {
    Pipeline::builder(name)
        .retry(Retry::constant(ms(10)).max_attempts(3))
        .clock(clock.clone())
}

/// Each 429 test runs with a plain pipeline, with `seawall::reqwest::classify`,
/// and with that classifier and a listener.
#[derive(Debug, Clone, Copy)]
enum Variant {
    Plain,
    Classified,
    Listened,
}

const VARIANTS: [Variant; 3] = [Variant::Plain, Variant::Classified, Variant::Listened];

type Retries = Arc<Mutex<Vec<Duration>>>;

/// Runs `check` with the pipeline `builder` makes in `variant`, and the
/// waits the listener saw scheduled (always empty without a listener).
async fn with_variant<F>(variant: Variant, builder: seawall::PipelineBuilder, check: F)
where
    F: AsyncFnOnce(&dyn Sender, Retries),
{
    let retries = Retries::default();
    match variant {
        Variant::Plain => check(&builder.build().unwrap(), retries).await,
        Variant::Classified => {
            let pipeline = builder
                .classify(seawall::reqwest::classify)
                .build()
                .unwrap();
            check(&pipeline, retries).await
        }
        Variant::Listened => {
            let log = Arc::clone(&retries);
            let pipeline = builder
                .on_event(move |event| {
                    if let EventKind::RetryScheduled { delay, .. } = event.kind {
                        log.lock().unwrap().push(delay);
                    }
                })
                .classify(seawall::reqwest::classify)
                .build()
                .unwrap();
            check(&pipeline, retries).await
        }
    }
}

/// A pipeline of any kind, to run one test body over the variants.
trait Sender {
    fn send<'a>(
        &'a self,
        request: reqwest::RequestBuilder,
    ) -> Pin<Box<dyn Future<Output = Result<reqwest::Response, SendError>> + 'a>>;
    fn circuit(&self) -> CircuitState;
}

impl<K: Handles<reqwest::Response, reqwest::Error>> Sender for Pipeline<K> {
    fn send<'a>(
        &'a self,
        request: reqwest::RequestBuilder,
    ) -> Pin<Box<dyn Future<Output = Result<reqwest::Response, SendError>> + 'a>> {
        Box::pin(request.send_through(self))
    }
    fn circuit(&self) -> CircuitState {
        self.circuit_state().unwrap()
    }
}

fn expected_retries(variant: Variant, waits: &[Duration]) -> Vec<Duration> {
    match variant {
        Variant::Listened => waits.to_vec(),
        Variant::Plain | Variant::Classified => Vec::new(),
    }
}

#[tokio::test]
async fn a_429_is_retried_after_its_retry_after_in_seconds() {
    for start in STARTS {
        for variant in VARIANTS {
            let clock = LoggedClock::at(start);
            let server = timed_server(&clock, |n| {
                if n == 1 {
                    too_many("2")
                } else {
                    Reply::status(200)
                }
            })
            .await;
            let builder = retrying_on(named("seconds", variant, clock.start), &clock);
            with_variant(variant, builder, async |pipeline, retries| {
                let response = pipeline
                    .send(reqwest::Client::new().get(server.url()))
                    .await
                    .unwrap();

                let case = format!("{variant:?} from {start:?}");
                assert_eq!(response.status(), 200, "{case}");
                assert_eq!(response.text().await.unwrap(), "reply #2", "{case}");
                assert_eq!(server.hits(), 2, "{case}");
                // The hint (2 s), not the backoff (10 ms), set the wait.
                assert_eq!(clock.sleeps(), [secs(2)], "{case}");
                assert_eq!(clock.arrivals(), [Duration::ZERO, secs(2)], "{case}");
                assert_eq!(
                    *retries.lock().unwrap(),
                    expected_retries(variant, &[secs(2)]),
                    "{case}"
                );
            })
            .await;
        }
    }
}

#[tokio::test]
async fn a_429_is_retried_after_its_retry_after_as_a_date() {
    for start in STARTS {
        for variant in VARIANTS {
            let clock = LoggedClock::at(start);
            let server = timed_server(&clock, |n| {
                if n == 1 {
                    too_many(httpdate::fmt_http_date(SystemTime::now() + secs(3)))
                } else {
                    Reply::status(200)
                }
            })
            .await;
            let builder = retrying_on(named("date", variant, clock.start), &clock);
            with_variant(variant, builder, async |pipeline, retries| {
                let response = pipeline
                    .send(reqwest::Client::new().get(server.url()))
                    .await
                    .unwrap();

                let case = format!("{variant:?} from {start:?}");
                assert_eq!(response.status(), 200, "{case}");
                assert_eq!(server.hits(), 2, "{case}");
                // The date has a resolution of one second: 3 s from now is
                // read as 2 to 3 s, less the time the answer took to arrive.
                let sleeps = clock.sleeps();
                assert_eq!(sleeps.len(), 1, "{case}: {sleeps:?}");
                assert!(
                    (secs(1)..=secs(3)).contains(&sleeps[0]),
                    "{case}: {sleeps:?}"
                );
                assert_eq!(clock.arrivals(), [Duration::ZERO, sleeps[0]], "{case}");
                assert_eq!(
                    *retries.lock().unwrap(),
                    expected_retries(variant, &sleeps),
                    "{case}"
                );
            })
            .await;
        }
    }
}

#[tokio::test]
async fn an_endless_429_ends_in_retry_exhausted_with_its_status() {
    for (header, wait) in [(Some("1"), secs(1)), (None, ms(10))] {
        for variant in VARIANTS {
            let clock = LoggedClock::at(STARTS[1]);
            let server = timed_server(&clock, move |_| match header {
                Some(value) => too_many(value),
                None => Reply::status(429),
            })
            .await;
            let builder = retrying_on(named("endless", variant, clock.start), &clock);
            with_variant(variant, builder, async |pipeline, retries| {
                let error = pipeline
                    .send(reqwest::Client::new().get(server.url()))
                    .await
                    .unwrap_err();

                let case = format!("{variant:?} with Retry-After {header:?}");
                assert!(
                    matches!(
                        error,
                        SendError::Pipeline(Error::RetryExhausted { attempts: 3, .. })
                    ),
                    "{case}: {error:?}"
                );
                assert_eq!(
                    error.status(),
                    Some(reqwest::StatusCode::TOO_MANY_REQUESTS),
                    "{case}"
                );
                assert_eq!(server.hits(), 3, "{case}");
                assert_eq!(clock.sleeps(), [wait, wait], "{case}");
                assert_eq!(
                    *retries.lock().unwrap(),
                    expected_retries(variant, &[wait, wait]),
                    "{case}"
                );
            })
            .await;
        }
    }
}

#[tokio::test]
async fn a_429_does_not_open_the_circuit_a_503_does() {
    for variant in VARIANTS {
        let clock = LoggedClock::at(STARTS[1]);
        let throttling = timed_server(&clock, |_| too_many("1")).await;
        let failing = Server::start(|_| now(503)).await;
        let builder = retrying_on(named("breaker", variant, clock.start), &clock)
            .circuit_breaker(CircuitBreaker::consecutive_failures(1));
        with_variant(variant, builder, async |pipeline, _| {
            let client = reqwest::Client::new();
            let case = format!("{variant:?}");
            for call in 1..=2 {
                let error = pipeline
                    .send(client.get(throttling.url()))
                    .await
                    .unwrap_err();
                assert!(
                    matches!(
                        error,
                        SendError::Pipeline(Error::RetryExhausted { attempts: 3, .. })
                    ),
                    "{case}, call {call}: {error:?}"
                );
                assert_eq!(error.status(), Some(reqwest::StatusCode::TOO_MANY_REQUESTS));
                assert_eq!(pipeline.circuit(), CircuitState::Closed, "{case}");
                assert_eq!(throttling.hits(), 3 * call, "{case}");
            }

            // The first 503 opens the circuit: the retry that follows is
            // refused by it, without a second request.
            let error = pipeline.send(client.get(failing.url())).await.unwrap_err();
            assert!(
                error.status() == Some(reqwest::StatusCode::SERVICE_UNAVAILABLE)
                    || error.rejection().map(|r| r.reason) == Some(RejectionReason::CircuitOpen),
                "{case}: {error:?}"
            );
            assert_eq!(pipeline.circuit(), CircuitState::Open, "{case}");
            assert_eq!(failing.hits(), 1, "{case}");
            let error = pipeline.send(client.get(failing.url())).await.unwrap_err();
            assert_eq!(
                error.rejection().map(|r| r.reason),
                Some(RejectionReason::CircuitOpen),
                "{case}: {error:?}"
            );
            assert_eq!(failing.hits(), 1, "{case}");
        })
        .await;
    }
}

/// The first call gets a 429 with `Retry-After: 30` and fails with it
/// (no retry); every later request is answered 200.
fn throttled_first(n: u32) -> Reply {
    if n == 1 {
        too_many("30")
    } else {
        Reply::status(200)
    }
}

async fn throttled_call(pipeline: &dyn Sender, server: &Server) {
    let error = pipeline
        .send(reqwest::Client::new().get(server.url()))
        .await
        .unwrap_err();
    assert!(
        matches!(error, SendError::Pipeline(Error::Operation(_))),
        "{error:?}"
    );
    assert_eq!(error.status(), Some(reqwest::StatusCode::TOO_MANY_REQUESTS));
    assert_eq!(server.hits(), 1);
}

#[tokio::test]
async fn a_cooldown_holds_the_next_call_until_the_retry_after_ends() {
    for start in STARTS {
        for variant in VARIANTS {
            let clock = LoggedClock::at(start);
            let server = timed_server(&clock, throttled_first).await;
            let builder = Pipeline::builder(named("cooldown-wait", variant, start))
                .cooldown(Cooldown::new())
                .clock(clock.clone());
            with_variant(variant, builder, async |pipeline, _| {
                throttled_call(pipeline, &server).await;

                let response = pipeline
                    .send(reqwest::Client::new().get(server.url()))
                    .await
                    .unwrap();

                let case = format!("{variant:?} from {start:?}");
                assert_eq!(response.status(), 200, "{case}");
                assert_eq!(server.hits(), 2, "{case}");
                // The second request left only when the pause had ended.
                assert_eq!(clock.sleeps(), [secs(30)], "{case}");
                assert_eq!(clock.arrivals(), [Duration::ZERO, secs(30)], "{case}");
            })
            .await;
        }
    }
}

#[tokio::test]
async fn a_cooldown_refuses_a_call_that_may_not_wait() {
    for start in STARTS {
        for variant in VARIANTS {
            let clock = LoggedClock::at(start);
            let server = timed_server(&clock, throttled_first).await;
            let builder = Pipeline::builder(named("cooldown-refuse", variant, start))
                .cooldown(Cooldown::new().max_wait(Duration::ZERO))
                .clock(clock.clone());
            with_variant(variant, builder, async |pipeline, _| {
                let client = reqwest::Client::new();
                throttled_call(pipeline, &server).await;

                let case = format!("{variant:?} from {start:?}");
                let error = pipeline.send(client.get(server.url())).await.unwrap_err();
                let rejection = error.rejection().expect("a refusal");
                assert_eq!(rejection.reason, RejectionReason::CooldownActive, "{case}");
                assert_eq!(rejection.retry_after, Some(secs(30)), "{case}");
                assert_eq!(server.hits(), 1, "{case}");

                clock.clock.advance(secs(29));
                let error = pipeline.send(client.get(server.url())).await.unwrap_err();
                assert_eq!(
                    error.rejection().map(|r| (r.reason, r.retry_after)),
                    Some((RejectionReason::CooldownActive, Some(secs(1)))),
                    "{case}"
                );
                assert_eq!(server.hits(), 1, "{case}");

                clock.clock.advance(secs(1));
                let response = pipeline.send(client.get(server.url())).await.unwrap();
                assert_eq!(response.status(), 200, "{case}");
                assert_eq!(server.hits(), 2, "{case}");
                assert!(clock.sleeps().is_empty(), "{case}: {:?}", clock.sleeps());
            })
            .await;
        }
    }
}

/// On the system clock: a virtual one would let the timeout's timer run
/// ahead of the real server.
#[tokio::test]
async fn a_cooldown_longer_than_the_deadline_refuses_at_once() {
    for variant in VARIANTS {
        let server = Server::replying(throttled_first).await;
        let builder = Pipeline::builder(named("cooldown-deadline", variant, Duration::ZERO))
            .cooldown(Cooldown::new())
            .timeout(secs(5));
        with_variant(variant, builder, async |pipeline, _| {
            throttled_call(pipeline, &server).await;

            let started = Instant::now();
            let error = pipeline
                .send(reqwest::Client::new().get(server.url()))
                .await
                .unwrap_err();

            let case = format!("{variant:?}");
            assert!(
                started.elapsed() < secs(1),
                "{case}: {:?}",
                started.elapsed()
            );
            let rejection = error.rejection().expect("a refusal");
            assert_eq!(
                rejection.reason,
                RejectionReason::CooldownExceedsDeadline,
                "{case}"
            );
            let left = rejection.retry_after.expect("the time left");
            assert!(secs(25) < left && left <= secs(30), "{case}: {left:?}");
            assert_eq!(server.hits(), 1, "{case}");
        })
        .await;
    }
}
