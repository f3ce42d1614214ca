//! The reqwest adapter against a real HTTP/1 server on 127.0.0.1 (random
//! port). Retry waits run on seawall's `VirtualClock`; the timeout tests use
//! real time, with delays of a few hundred milliseconds at most.
#![cfg(feature = "reqwest")]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use seawall::clock::BoxSleep;
use seawall::reqwest::{SendError, SendThrough};
use seawall::testing::VirtualClock;
use seawall::{CircuitBreaker, Clock, Error, Pipeline, RejectionReason, Retry, Verdict};
use tokio::net::TcpListener;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// An HTTP/1 server on a random loopback port answering its n-th request
/// (from 1) with `answer(n)` after `delay(n)`; counts the requests it got.
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

impl Server {
    async fn start(answer: impl Fn(u32) -> (u16, Duration) + Send + Sync + 'static) -> Server {
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
                        let (status, delay) = answer(n);
                        async move {
                            tokio::time::sleep(delay).await;
                            let body = Full::new(Bytes::from(format!("reply #{n}")));
                            let response = Response::builder().status(status).body(body);
                            Ok::<_, Infallible>(response.unwrap())
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
