//! The tower layer against a real HTTP/1 server on 127.0.0.1 (random port),
//! called through hyper-util's client wrapped by `PipelineLayer`.
//!
//! Retry waits and retry-after hints run on seawall's `VirtualClock`, so a
//! 30 s hint costs no wall time; only the per-attempt timeout test uses the
//! real clock, with delays of a few tens of milliseconds.
#![cfg(all(feature = "tower", feature = "http"))]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use seawall::testing::VirtualClock;
use seawall::tower::{
    PipelineLayer, PipelineService, RetryableErrors, ServiceError, SingleAttempt,
    SuccessfulResponses,
};
use seawall::{
    CircuitBreaker, CircuitState, Error, Hedging, Pipeline, RateLimiter, RejectionReason, Retry,
};
use tokio::net::TcpListener;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// What the server answers to its n-th request (from 1).
#[derive(Clone)]
struct Reply {
    status: u16,
    body: String,
    retry_after: Option<String>,
    delay: Duration,
}

fn reply(status: u16, body: impl Into<String>) -> Reply {
    Reply {
        status,
        body: body.into(),
        retry_after: None,
        delay: Duration::ZERO,
    }
}

/// An HTTP/1 server on a random loopback port; counts the requests it got.
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
    async fn start(answer: impl Fn(u32) -> Reply + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicU32::new(0));
        let answer = Arc::new(answer);
        let counter = Arc::clone(&hits);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (answer, counter) = (Arc::clone(&answer), Arc::clone(&counter));
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |_req: Request<Incoming>| {
                        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                        let r = answer(n);
                        async move {
                            if !r.delay.is_zero() {
                                tokio::time::sleep(r.delay).await;
                            }
                            let mut response = Response::builder().status(r.status);
                            if let Some(v) = &r.retry_after {
                                response = response.header(RETRY_AFTER, v);
                            }
                            Ok::<_, Infallible>(
                                response.body(Full::new(Bytes::from(r.body))).unwrap(),
                            )
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

    fn hits(&self) -> u32 {
        self.hits.load(Ordering::SeqCst)
    }

    fn get(&self, path: &str) -> Request<Full<Bytes>> {
        Request::get(format!("http://{}{path}", self.addr))
            .body(Full::default())
            .unwrap()
    }
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn body(response: Response<Incoming>) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

type ClassifyHttp = fn(&Response<Incoming>) -> Option<seawall::Verdict>;

/// A layer judging responses with `seawall::http::classify_response`.
fn http_layer(builder: seawall::PipelineBuilder) -> PipelineLayer<ClassifyHttp> {
    PipelineLayer::new(builder)
        .unwrap()
        .classify_response(seawall::http::classify_response::<Incoming> as fn(&_) -> _)
}

fn retrying(name: &str, clock: &VirtualClock, attempts: u32) -> seawall::PipelineBuilder {
    Pipeline::builder(name)
        .retry(Retry::constant(ms(10)).max_attempts(attempts))
        .clock(clock.clone())
}

#[tokio::test]
async fn a_flaky_server_is_retried_to_success() {
    let server = Server::start(|n| match n {
        1 | 2 => reply(503, "busy"),
        _ => reply(200, "ok"),
    })
    .await;
    let clock = VirtualClock::new();
    let service = ServiceBuilder::new()
        .layer(http_layer(retrying("tower-flaky", &clock, 3)))
        .service(client());

    let response = service.oneshot(server.get("/flaky")).await.unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body(response).await, "ok");
    assert_eq!(server.hits(), 3);
    assert_eq!(clock.now(), ms(20), "two backoff waits of 10 ms");
}

#[tokio::test]
async fn when_retries_run_out_the_last_response_comes_back() {
    let server = Server::start(|n| reply(503, format!("down #{n}"))).await;
    let clock = VirtualClock::new();
    let service = http_layer(retrying("tower-exhausted", &clock, 3)).layer(client());

    let response = service.oneshot(server.get("/down")).await.unwrap();

    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body(response).await, "down #3");
    assert_eq!(server.hits(), 3);
}

/// A retry refused by a policy (the circuit the failed attempt opened, an
/// empty retry budget) gives the caller the response that attempt got, as
/// when the retries run out; with and without a listener.
#[tokio::test]
async fn when_a_policy_refuses_the_retry_the_last_response_comes_back() {
    for listener in [false, true] {
        let layers = [
            (
                "circuit",
                Pipeline::builder(format!("tower-refused-retry-circuit-{listener}"))
                    .retry(Retry::constant(ms(10)).max_attempts(3))
                    .circuit_breaker(CircuitBreaker::consecutive_failures(1)),
                1,
            ),
            (
                "budget",
                Pipeline::builder(format!("tower-refused-retry-budget-{listener}")).retry(
                    Retry::constant(ms(10))
                        .max_attempts(3)
                        .budget(seawall::RetryBudget::new(0.001, 1)),
                ),
                2,
            ),
        ];
        for (policy, builder, hits) in layers {
            let server = Server::start(|n| reply(503, format!("down #{n}"))).await;
            let clock = VirtualClock::starting_at(Duration::from_secs(1_000_000));
            let mut builder = builder.clock(clock.clone());
            if listener {
                builder = builder.on_event(|_| {});
            }
            let service = http_layer(builder).layer(client());

            let response = service.oneshot(server.get("/down")).await.unwrap();

            assert_eq!(
                response.status(),
                StatusCode::SERVICE_UNAVAILABLE,
                "{policy}"
            );
            assert_eq!(body(response).await, format!("down #{hits}"), "{policy}");
            assert_eq!(server.hits(), hits, "{policy}");
        }
    }
}

#[tokio::test]
async fn a_client_error_is_not_retried() {
    let server = Server::start(|_| reply(404, "no such item")).await;
    let clock = VirtualClock::new();
    let service = http_layer(retrying("tower-404", &clock, 3)).layer(client());

    let response = service.oneshot(server.get("/missing")).await.unwrap();

    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(server.hits(), 1);
    assert_eq!(clock.now(), Duration::ZERO);
}

#[tokio::test]
async fn without_a_response_classifier_every_response_is_a_success() {
    let server = Server::start(|_| reply(503, "busy")).await;
    let clock = VirtualClock::new();
    let layer = PipelineLayer::new(retrying("tower-default", &clock, 3)).unwrap();

    let response = layer
        .layer(client())
        .oneshot(server.get("/"))
        .await
        .unwrap();

    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(server.hits(), 1);
}

#[tokio::test]
async fn a_retry_after_in_seconds_delays_the_retry() {
    let server = Server::start(|n| match n {
        1 => Reply {
            retry_after: Some("30".into()),
            ..reply(503, "maintenance")
        },
        _ => reply(200, "back"),
    })
    .await;
    let clock = VirtualClock::new();
    let service = http_layer(retrying("tower-retry-after", &clock, 2)).layer(client());

    let response = service.oneshot(server.get("/")).await.unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.hits(), 2);
    // The hint (30 s) wins over the 10 ms backoff.
    assert_eq!(clock.now(), Duration::from_secs(30));
}

#[tokio::test]
async fn a_retry_after_as_a_date_delays_the_retry() {
    let server = Server::start(|n| match n {
        1 => Reply {
            retry_after: Some(httpdate::fmt_http_date(
                SystemTime::now() + Duration::from_secs(90),
            )),
            ..reply(429, "slow down")
        },
        _ => reply(200, "ok"),
    })
    .await;
    let clock = VirtualClock::new();
    let service = http_layer(retrying("tower-retry-date", &clock, 2)).layer(client());

    let response = service.oneshot(server.get("/")).await.unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.hits(), 2);
    // The date has a one-second resolution and is read a little later.
    let waited = clock.now();
    assert!(
        waited > Duration::from_secs(85) && waited <= Duration::from_secs(90),
        "{waited:?}"
    );
}

#[tokio::test]
async fn an_open_circuit_rejects_without_reaching_the_server() {
    let server = Server::start(|_| reply(500, "broken")).await;
    let layer = http_layer(
        Pipeline::builder("tower-breaker")
            .circuit_breaker(CircuitBreaker::consecutive_failures(3))
            .clock(VirtualClock::new()),
    );
    let mut service = layer.layer(client());

    for _ in 0..3 {
        let response = service
            .ready()
            .await
            .unwrap()
            .call(server.get("/"))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
    assert_eq!(
        service.pipeline().circuit_state().unwrap(),
        CircuitState::Open
    );

    for _ in 0..5 {
        let error = service
            .ready()
            .await
            .unwrap()
            .call(server.get("/"))
            .await
            .unwrap_err();
        assert!(error.is_rejected(), "{error}");
        assert_eq!(
            error.rejection().unwrap().reason,
            RejectionReason::CircuitOpen
        );
    }
    assert_eq!(server.hits(), 3, "rejected calls never reach the server");
}

#[tokio::test]
async fn errors_of_the_inner_service_stay_typed() {
    // A port nobody listens on.
    let addr = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let clock = VirtualClock::new();
    let service = http_layer(retrying("tower-refused", &clock, 3)).layer(client());
    let request = Request::get(format!("http://{addr}/"))
        .body(Full::default())
        .unwrap();

    let error = service.oneshot(request).await.unwrap_err();

    match error {
        ServiceError::Pipeline(Error::RetryExhausted { attempts, last }) => {
            assert_eq!(attempts, 3);
            assert!(last.is_connect(), "{last:?}");
        }
        other => panic!("expected the client's error after 3 attempts, got {other:?}"),
    }
}

#[tokio::test]
async fn errors_can_be_classified_by_the_layer() {
    let addr = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let clock = VirtualClock::new();
    let service = http_layer(retrying("tower-classify-error", &clock, 3))
        .classify_error(|_: &hyper_util::client::legacy::Error| seawall::Verdict::failure())
        .layer(client());
    let request = Request::get(format!("http://{addr}/"))
        .body(Full::default())
        .unwrap();

    let error = service.oneshot(request).await.unwrap_err();

    assert!(
        matches!(error, ServiceError::Pipeline(Error::Operation(_))),
        "not retried: {error:?}"
    );
    assert_eq!(clock.now(), Duration::ZERO);
}

#[tokio::test]
async fn a_slow_attempt_is_cut_by_the_attempt_timeout_and_retried() {
    // Real time: the server really sleeps on its first request.
    let server = Server::start(|n| match n {
        1 => Reply {
            delay: ms(500),
            ..reply(200, "late")
        },
        _ => reply(200, "on time"),
    })
    .await;
    let service = http_layer(
        Pipeline::builder("tower-attempt-timeout")
            .retry(Retry::constant(ms(1)).max_attempts(2))
            .timeout(ms(50)),
    )
    .layer(client());

    let started = std::time::Instant::now();
    let response = service.oneshot(server.get("/")).await.unwrap();

    assert_eq!(body(response).await, "on time");
    assert_eq!(server.hits(), 2);
    assert!(started.elapsed() < ms(450), "{:?}", started.elapsed());
}

#[tokio::test]
async fn a_server_sheds_load_with_a_single_attempt_layer() {
    // Server side: the requests a hyper server hands over are not Clone.
    let handled = Arc::new(AtomicU32::new(0));
    let counter = Arc::clone(&handled);
    let handler = tower::service_fn(move |_: Request<Incoming>| {
        counter.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("hello")))) }
    });
    let layer = PipelineLayer::single_attempt(
        Pipeline::builder("tower-server-rate-limit")
            .rate_limiter(RateLimiter::fixed_window(2, Duration::from_secs(60)))
            .clock(VirtualClock::new()),
    )
    .unwrap();
    let service = layer.layer(handler);

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = service.clone();
            let hyper_service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let service = service.clone();
                async move {
                    Ok::<_, Infallible>(match service.oneshot(request).await {
                        Ok(response) => response,
                        Err(e) if e.is_rejected() => Response::builder()
                            .status(StatusCode::TOO_MANY_REQUESTS)
                            .body(Full::default())
                            .unwrap(),
                        Err(e) => panic!("{e}"),
                    })
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), hyper_service),
            );
        }
    });

    let client = client();
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let request = Request::get(format!("http://{addr}/"))
            .body(Full::default())
            .unwrap();
        statuses.push(client.request(request).await.unwrap().status().as_u16());
    }
    server.abort();

    assert_eq!(statuses, [200, 200, 429]);
    assert_eq!(handled.load(Ordering::SeqCst), 2);
}

#[test]
fn a_single_attempt_layer_refuses_a_pipeline_that_hedges() {
    // Hedging makes more than one attempt, which a request moved into the
    // call's one attempt cannot have: refused at build, never a panic at
    // the first hedge.
    for hedging in [
        Hedging::latency(ms(10)),
        Hedging::parallel().max_hedged_attempts(3),
        Hedging::fallback(),
    ] {
        let error =
            PipelineLayer::single_attempt(Pipeline::builder("tower-single-hedge").hedging(hedging))
                .unwrap_err();
        assert_eq!((error.policy, error.field), ("pipeline", "hedging"));
        assert!(
            error
                .to_string()
                .starts_with("pipeline.hedging must not be declared"),
            "{error}"
        );
    }
}

#[test]
fn a_single_attempt_layer_refuses_a_pipeline_that_retries() {
    let error = PipelineLayer::single_attempt(
        Pipeline::builder("tower-single-retry").retry(Retry::constant(ms(1)).max_attempts(2)),
    )
    .unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("pipeline.retry must allow one attempt"),
        "{error}"
    );
    let one = Retry::constant(ms(1)).max_attempts(1);
    assert!(
        PipelineLayer::single_attempt(Pipeline::builder("tower-single-one").retry(one)).is_ok()
    );
}

/// A service that must be driven to readiness before each call, and whose
/// clones start not ready: calling it otherwise is the readiness-lost-on-
/// clone bug (tower-resilience #286). Fails its first `failures` calls.
struct StrictReadiness {
    ready: bool,
    calls: Arc<AtomicU32>,
    polls: Arc<AtomicU32>,
    failures: u32,
}

impl Clone for StrictReadiness {
    fn clone(&self) -> Self {
        StrictReadiness {
            ready: false,
            calls: Arc::clone(&self.calls),
            polls: Arc::clone(&self.polls),
            failures: self.failures,
        }
    }
}

impl Service<u32> for StrictReadiness {
    type Response = u32;
    type Error = &'static str;
    type Future = Pin<Box<dyn Future<Output = Result<u32, &'static str>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.polls.fetch_add(1, Ordering::SeqCst);
        self.ready = true;
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: u32) -> Self::Future {
        assert!(self.ready, "called without poll_ready");
        self.ready = false;
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let failures = self.failures;
        Box::pin(async move {
            if n <= failures {
                Err("not yet")
            } else {
                Ok(request * 2)
            }
        })
    }
}

#[tokio::test]
async fn readiness_is_not_lost_on_clone_or_retry() {
    // Regression guard for tower-resilience #286.
    let calls = Arc::new(AtomicU32::new(0));
    let polls = Arc::new(AtomicU32::new(0));
    let inner = StrictReadiness {
        ready: false,
        calls: Arc::clone(&calls),
        polls: Arc::clone(&polls),
        failures: 2,
    };
    let clock = VirtualClock::new();
    let layer = PipelineLayer::new(retrying("tower-readiness", &clock, 3)).unwrap();
    let mut service = layer.layer(inner);

    service.ready().await.unwrap();
    // A clone taken between poll_ready and call must not steal readiness.
    let mut other = service.clone();
    let doubled = service.call(21).await.unwrap();

    assert_eq!(doubled, 42);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // One poll before the call, one before each of the two retries.
    assert_eq!(polls.load(Ordering::SeqCst), 3);
    // The clone works once driven to readiness itself.
    assert_eq!(other.ready().await.unwrap().call(5).await.unwrap(), 10);
}

/// Ready 20 ms after the first poll following a call, as a service behind
/// a buffer or a concurrency limit may be; a clone starts where its
/// original stands. The first call answers after a second, the others
/// after 50 ms.
#[derive(Clone, Default)]
struct SlowToBeReady {
    since: Option<std::time::Instant>,
    calls: Arc<AtomicU32>,
}

impl Service<u32> for SlowToBeReady {
    type Response = String;
    type Error = &'static str;
    type Future = Pin<Box<dyn Future<Output = Result<String, &'static str>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let since = *self.since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() < ms(20) {
            let waker = cx.waker().clone();
            tokio::spawn(async move {
                tokio::time::sleep(ms(2)).await;
                waker.wake();
            });
            return Poll::Pending;
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: u32) -> Self::Future {
        self.since = None;
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        Box::pin(async move {
            tokio::time::sleep(ms(if n == 1 { 1000 } else { 50 })).await;
            Ok(format!("call {n}"))
        })
    }
}

#[tokio::test]
async fn hedged_attempts_each_wait_for_a_ready_service() {
    // Parallel: both hedges start at once, while the first attempt runs;
    // latency: the third attempt starts while the second still waits for
    // the inner service to be ready.
    for (name, hedging) in [
        (
            "tower-hedge-parallel",
            Hedging::parallel().max_hedged_attempts(2),
        ),
        (
            "tower-hedge-latency",
            Hedging::latency(ms(5)).max_hedged_attempts(2),
        ),
    ] {
        let layer = PipelineLayer::new(Pipeline::builder(name).hedging(hedging)).unwrap();
        let inner = SlowToBeReady::default();
        let calls = Arc::clone(&inner.calls);
        let service = layer.layer(inner);

        let started = std::time::Instant::now();
        let answer = tokio::spawn(service.oneshot(7)).await;

        let answer = answer.expect("the call does not panic").unwrap();
        assert_ne!(answer, "call 1", "{name}: a hedge answers first");
        assert!(
            started.elapsed() < ms(600),
            "{name}: {:?}",
            started.elapsed()
        );
        assert_eq!(calls.load(Ordering::SeqCst), 3, "{name}");
    }
}

#[test]
fn services_and_futures_are_send_and_sync() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    fn clone<T: Clone>() {}
    type Http = PipelineService<HttpClient>;
    send::<Http>();
    sync::<Http>();
    clone::<Http>();
    send::<<Http as Service<Request<Full<Bytes>>>>::Future>();
    type Once = PipelineService<HttpClient, SuccessfulResponses, RetryableErrors, SingleAttempt>;
    send::<<Once as Service<Request<Full<Bytes>>>>::Future>();
    send::<PipelineLayer>();
    sync::<PipelineLayer>();
    clone::<PipelineLayer>();
    send::<ServiceError<hyper_util::client::legacy::Error>>();
    sync::<ServiceError<hyper_util::client::legacy::Error>>();
    // With a partition key and a fallback.
    type Tenant = fn(&Request<Full<Bytes>>) -> Option<String>;
    type Answer = fn(ServiceError<hyper_util::client::legacy::Error>) -> Response<Incoming>;
    type Keyed = PipelineService<
        HttpClient,
        SuccessfulResponses,
        RetryableErrors,
        seawall::tower::CloneRequests,
        Tenant,
        seawall::tower::RespondWith<Answer>,
    >;
    send::<Keyed>();
    sync::<Keyed>();
    clone::<Keyed>();
    send::<<Keyed as Service<Request<Full<Bytes>>>>::Future>();
}

#[test]
fn the_service_error_is_a_std_error() {
    fn boxed(e: ServiceError<std::io::Error>) -> Box<dyn std::error::Error + Send + Sync> {
        Box::new(e)
    }
    let e = boxed(ServiceError::NotReady(std::io::Error::other("closed")));
    assert_eq!(e.to_string(), "inner service not ready: closed");
    assert_eq!(e.source().unwrap().to_string(), "closed");
}

#[test]
fn a_request_that_is_not_clone_is_a_compile_error() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/tower_request_not_clone.rs");
}

fn tenant_get(server: &Server, tenant: &'static str) -> Request<Full<Bytes>> {
    let mut request = server.get("/");
    request
        .headers_mut()
        .insert("x-tenant", http::HeaderValue::from_static(tenant));
    request
}

fn tenant_of<B>(request: &Request<B>) -> Option<String> {
    let tenant = request.headers().get("x-tenant")?;
    tenant.to_str().ok().map(str::to_owned)
}

#[tokio::test]
async fn two_tenants_have_separate_circuits() {
    let server = Server::start(|_| reply(500, "broken")).await;
    let layer = http_layer(
        Pipeline::builder("tower-tenant-circuits")
            .circuit_breaker(CircuitBreaker::consecutive_failures(2))
            .clock(VirtualClock::new()),
    )
    .partition_by(tenant_of::<Full<Bytes>> as fn(&_) -> _);
    let mut service = layer.layer(client());
    let mut send = async |tenant| {
        let request = tenant_get(&server, tenant);
        service.ready().await.unwrap().call(request).await
    };

    // Tenant a trips its circuit...
    for _ in 0..2 {
        assert_eq!(send("a").await.unwrap().status(), 500);
    }
    let error = send("a").await.unwrap_err();
    assert_eq!(
        error.rejection().unwrap().reason,
        RejectionReason::CircuitOpen
    );
    // ...tenant b still reaches the server, and so would a request without
    // a tenant.
    assert_eq!(send("b").await.unwrap().status(), 500);
    assert_eq!(server.hits(), 3);
    let pipeline = layer.pipeline();
    let state = |tenant| pipeline.partition(tenant).circuit_metrics().unwrap().state;
    assert_eq!(state("a"), CircuitState::Open);
    assert_eq!(state("b"), CircuitState::Closed);
    assert_eq!(pipeline.circuit_state().unwrap(), CircuitState::Closed);
}

#[tokio::test]
async fn two_tenants_have_separate_rate_limits() {
    let server = Server::start(|_| reply(200, "ok")).await;
    let layer = PipelineLayer::new(
        Pipeline::builder("tower-tenant-limits")
            .rate_limiter(RateLimiter::fixed_window(2, Duration::from_secs(60)))
            .clock(VirtualClock::new()),
    )
    .unwrap()
    .partition_by(tenant_of::<Full<Bytes>> as fn(&_) -> _);
    let mut service = layer.layer(client());

    let mut outcomes = Vec::new();
    for tenant in ["a", "a", "a", "b", "b", "b"] {
        let request = tenant_get(&server, tenant);
        let result = service.ready().await.unwrap().call(request).await;
        outcomes.push(match result {
            Ok(response) => response.status().as_u16().to_string(),
            Err(e) => e.rejection().unwrap().reason.as_str().to_owned(),
        });
    }

    assert_eq!(
        outcomes,
        ["200", "200", "rate_limited", "200", "200", "rate_limited"]
    );
    assert_eq!(server.hits(), 4);
}

type BoxBody = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

#[tokio::test]
async fn the_fallback_answers_when_the_circuit_is_open() {
    let server = Server::start(|_| reply(503, "down")).await;
    let layer = PipelineLayer::new(
        Pipeline::builder("tower-fallback")
            .circuit_breaker(CircuitBreaker::consecutive_failures(2))
            .clock(VirtualClock::new()),
    )
    .unwrap()
    .classify_response(seawall::http::classify_response::<BoxBody> as fn(&_) -> _)
    .fallback(|error: ServiceError<hyper_util::client::legacy::Error>| {
        let text = format!("cached ({error})");
        let body = Full::new(Bytes::from(text)).map_err(|never| match never {});
        Response::new(BodyExt::boxed(body))
    });
    let client = ServiceBuilder::new()
        .map_response(|response: Response<Incoming>| response.map(BodyExt::boxed))
        .service(client());
    let mut service = layer.layer(client);

    let mut bodies = Vec::new();
    for _ in 0..4 {
        let response = service
            .ready()
            .await
            .unwrap()
            .call(server.get("/"))
            .await
            .unwrap();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        bodies.push(String::from_utf8(bytes.to_vec()).unwrap());
    }

    assert_eq!(
        bodies,
        [
            "down",
            "down",
            "cached (tower-fallback: call rejected: circuit_open (retry after 30s))",
            "cached (tower-fallback: call rejected: circuit_open (retry after 30s))"
        ]
    );
    assert_eq!(server.hits(), 2);
}

#[tokio::test]
async fn the_fallback_answers_errors_of_the_inner_service() {
    // A port nobody listens on.
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap().port()
    };
    let clock = VirtualClock::new();
    let layer = PipelineLayer::new(retrying("tower-fallback-refused", &clock, 2))
        .unwrap()
        .fallback(|error: ServiceError<hyper_util::client::legacy::Error>| {
            let attempts = match error.pipeline_error() {
                Some(Error::RetryExhausted { attempts, .. }) => *attempts,
                _ => 0,
            };
            Response::builder()
                .status(StatusCode::BAD_GATEWAY)
                .body(attempts)
                .unwrap()
        });
    let client = ServiceBuilder::new()
        .map_response(|response: Response<Incoming>| response.map(|_| 0u32))
        .service(client());
    let request = Request::get(format!("http://127.0.0.1:{port}/"))
        .body(Full::<Bytes>::default())
        .unwrap();

    let response = layer.layer(client).oneshot(request).await.unwrap();

    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(*response.body(), 2, "both attempts ran before the fallback");
}
