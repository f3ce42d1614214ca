//! `SeawallMiddleware` in a `reqwest_middleware::ClientBuilder`, against a
//! real HTTP/1 server on 127.0.0.1 (random port). Retry waits and
//! retry-after hints run on seawall's `VirtualClock`.
#![cfg(feature = "reqwest-middleware")]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use seawall::reqwest::{SeawallMiddleware, SendError};
use seawall::testing::VirtualClock;
use seawall::{
    CircuitBreaker, CircuitState, Hedging, Pipeline, RateLimiter, RejectionReason, Retry, Verdict,
};
use tokio::net::TcpListener;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One answer of the [`Server`]: a status and headers.
struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
}

fn reply(status: u16) -> Reply {
    Reply {
        status,
        headers: Vec::new(),
    }
}

impl Reply {
    fn header(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.push((name, value.into()));
        self
    }
}

/// An HTTP/1 server on a random loopback port answering its n-th request
/// (from 1) with `answer(n, tenant)`, where `tenant` is the request's
/// `x-tenant` header; counts the requests it got.
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
    async fn start(answer: impl Fn(u32, &str) -> Reply + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicU32::new(0));
        let answer = Arc::new(answer);
        let counter = Arc::clone(&hits);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (answer, counter) = (Arc::clone(&answer), Arc::clone(&counter));
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                        let tenant = request.headers().get("x-tenant");
                        let tenant = tenant.and_then(|t| t.to_str().ok()).unwrap_or("");
                        let reply = answer(n, tenant);
                        let body = Full::new(Bytes::from(format!("reply #{n}")));
                        let mut response = Response::builder().status(reply.status);
                        for (name, value) in reply.headers {
                            response = response.header(name, value);
                        }
                        async move { Ok::<_, Infallible>(response.body(body).unwrap()) }
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

fn retrying(name: &str, clock: &VirtualClock) -> seawall::PipelineBuilder {
    Pipeline::builder(name)
        .retry(Retry::constant(ms(10)).max_attempts(3))
        .clock(clock.clone())
}

fn client(middleware: SeawallMiddleware) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new())
        .with(middleware)
        .build()
}

/// The `SendError` inside a middleware error.
fn send_error(error: &reqwest_middleware::Error) -> &SendError {
    match error {
        reqwest_middleware::Error::Middleware(e) => e.downcast_ref::<SendError>().unwrap(),
        other => panic!("not a middleware error: {other}"),
    }
}

#[tokio::test]
async fn a_flaky_server_is_retried_to_success() {
    let server = Server::start(|n, _| reply(if n <= 2 { 503 } else { 200 })).await;
    let clock = VirtualClock::new();
    let pipeline = retrying("mw-flaky", &clock).build().unwrap();
    let client = client(SeawallMiddleware::new(pipeline));

    let response = client.get(server.url()).send().await.unwrap();

    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "reply #3");
    assert_eq!(server.hits(), 3);
    assert_eq!(clock.now(), ms(20), "two backoff waits of 10 ms");
}

#[tokio::test]
async fn when_retries_run_out_the_last_response_comes_back() {
    let server = Server::start(|_, _| reply(502)).await;
    let clock = VirtualClock::new();
    let client = client(SeawallMiddleware::new(
        retrying("mw-exhausted", &clock).build().unwrap(),
    ));

    let response = client.get(server.url()).send().await.unwrap();

    assert_eq!(response.status(), 502);
    assert_eq!(response.text().await.unwrap(), "reply #3");
    assert_eq!(server.hits(), 3);
}

#[tokio::test]
async fn a_client_error_is_not_retried() {
    let server = Server::start(|_, _| reply(404)).await;
    let clock = VirtualClock::new();
    let client = client(SeawallMiddleware::new(
        retrying("mw-404", &clock).build().unwrap(),
    ));

    let response = client.get(server.url()).send().await.unwrap();

    assert_eq!(response.status(), 404);
    assert_eq!(server.hits(), 1);
    assert_eq!(clock.now(), Duration::ZERO);
}

#[tokio::test]
async fn retry_after_in_seconds_delays_the_retry() {
    let server = Server::start(|n, _| match n {
        1 => reply(429).header("retry-after", "30"),
        _ => reply(200),
    })
    .await;
    let clock = VirtualClock::new();
    let pipeline = retrying("mw-429", &clock).build().unwrap();
    let client = client(SeawallMiddleware::new(pipeline));

    let response = client.get(server.url()).send().await.unwrap();

    assert_eq!(response.status(), 200);
    assert_eq!(server.hits(), 2);
    assert_eq!(clock.now(), Duration::from_secs(30));
}

#[tokio::test]
async fn retry_after_as_an_http_date_delays_the_retry() {
    let at = SystemTime::now() + Duration::from_secs(90);
    let date = httpdate::fmt_http_date(at);
    let server = Server::start(move |n, _| match n {
        1 => reply(503).header("retry-after", date.clone()),
        _ => reply(200),
    })
    .await;
    let clock = VirtualClock::new();
    let client = client(SeawallMiddleware::new(
        retrying("mw-503-date", &clock).build().unwrap(),
    ));

    let response = client.get(server.url()).send().await.unwrap();

    assert_eq!(response.status(), 200);
    let waited = clock.now();
    // The date has a one-second resolution.
    assert!(
        waited > Duration::from_secs(85) && waited <= Duration::from_secs(90),
        "{waited:?}"
    );
}

#[tokio::test]
async fn the_response_classification_can_be_replaced() {
    let server = Server::start(|n, _| match n {
        1 => reply(200).header("x-busy", "1"),
        _ => reply(200),
    })
    .await;
    let clock = VirtualClock::new();
    let middleware = SeawallMiddleware::new(retrying("mw-classify", &clock).build().unwrap())
        .classify_response(|response: &reqwest::Response| {
            if response.headers().contains_key("x-busy") {
                Some(Verdict::retry())
            } else {
                seawall::reqwest::classify_response(response)
            }
        });

    let response = client(middleware).get(server.url()).send().await.unwrap();

    assert_eq!(response.text().await.unwrap(), "reply #2");
    assert_eq!(server.hits(), 2);
}

#[tokio::test]
async fn tenants_have_separate_circuits() {
    let server = Server::start(|_, tenant| reply(if tenant == "a" { 500 } else { 200 })).await;
    let pipeline = Pipeline::builder("mw-tenants")
        .circuit_breaker(CircuitBreaker::consecutive_failures(2))
        .clock(VirtualClock::new())
        .build()
        .unwrap();
    let middleware = SeawallMiddleware::new(pipeline.clone()).partition_by(|request| {
        let tenant = request.headers().get("x-tenant")?;
        tenant.to_str().ok().map(str::to_owned)
    });
    let client = client(middleware);
    let send = |tenant: &'static str| client.get(server.url()).header("x-tenant", tenant).send();

    for _ in 0..2 {
        assert_eq!(send("a").await.unwrap().status(), 500);
    }
    let refused = send("a").await.unwrap_err();
    let refused = send_error(&refused).rejection().unwrap();
    assert_eq!(refused.reason, RejectionReason::CircuitOpen);
    for _ in 0..3 {
        assert_eq!(send("b").await.unwrap().status(), 200);
    }

    assert_eq!(
        server.hits(),
        5,
        "the refused call never reached the server"
    );
    let state = |tenant| pipeline.partition(tenant).circuit_metrics().unwrap().state;
    assert_eq!(state("a"), CircuitState::Open);
    assert_eq!(state("b"), CircuitState::Closed);
}

#[tokio::test]
async fn tenants_have_separate_rate_limits() {
    let server = Server::start(|_, _| reply(200)).await;
    let pipeline = Pipeline::builder("mw-tenant-limits")
        .rate_limiter(RateLimiter::fixed_window(1, Duration::from_secs(60)))
        .clock(VirtualClock::new())
        .build()
        .unwrap();
    let middleware = SeawallMiddleware::new(pipeline)
        .partition_by(|request| request.headers().get("x-tenant").map(|_| "tenant"));
    let client = client(middleware);

    // A request without the header is in the shared state, one with it in
    // the "tenant" partition: one permit each.
    assert!(client.get(server.url()).send().await.is_ok());
    let tenant = || client.get(server.url()).header("x-tenant", "t").send();
    assert!(tenant().await.is_ok());
    let limited = tenant().await.unwrap_err();
    let limited = send_error(&limited).rejection().unwrap();
    assert_eq!(limited.reason, RejectionReason::RateLimited);
    assert!(limited.retry_after.is_some());
    assert_eq!(server.hits(), 2);
}

fn stream_body() -> reqwest::Body {
    let chunk = futures_util::stream::once(async { Ok::<_, std::io::Error>(Bytes::from("x")) });
    reqwest::Body::wrap_stream(chunk)
}

#[tokio::test]
async fn a_stream_body_with_a_retrying_pipeline_is_a_typed_error() {
    let server = Server::start(|_, _| reply(200)).await;
    let clock = VirtualClock::new();
    let client = client(SeawallMiddleware::new(
        retrying("mw-stream", &clock).build().unwrap(),
    ));

    let error = client
        .post(server.url())
        .body(stream_body())
        .send()
        .await
        .unwrap_err();

    assert!(matches!(send_error(&error), SendError::BodyNotCloneable));
    assert_eq!(server.hits(), 0, "nothing was sent");
}

#[tokio::test]
async fn a_stream_body_with_a_hedging_pipeline_is_a_typed_error() {
    // Hedging makes more than one attempt: refused before anything is
    // sent, not sent once and then answered with an error.
    let server = Server::start(|_, _| reply(200)).await;
    for (name, hedging) in [
        ("mw-stream-hedge-parallel", Hedging::parallel()),
        ("mw-stream-hedge-latency", Hedging::latency(ms(1))),
    ] {
        let pipeline = Pipeline::builder(name).hedging(hedging).build().unwrap();
        let client = client(SeawallMiddleware::new(pipeline));

        let error = client
            .post(server.url())
            .body(stream_body())
            .send()
            .await
            .unwrap_err();

        assert!(
            matches!(send_error(&error), SendError::BodyNotCloneable),
            "{name}"
        );
    }
    assert_eq!(server.hits(), 0, "nothing was sent");
}

#[tokio::test]
async fn a_stream_body_is_sent_once_without_retry() {
    let server = Server::start(|_, _| reply(503)).await;
    let pipeline = Pipeline::builder("mw-stream-once")
        .circuit_breaker(CircuitBreaker::consecutive_failures(5))
        .build()
        .unwrap();
    let client = client(SeawallMiddleware::new(pipeline));

    let response = client
        .post(server.url())
        .body(stream_body())
        .send()
        .await
        .unwrap();

    assert_eq!(response.status(), 503);
    assert_eq!(server.hits(), 1);
}

#[tokio::test]
async fn connection_errors_are_retried_and_come_back_typed() {
    // A port nobody listens on.
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap().port()
    };
    let clock = VirtualClock::new();
    let client = client(SeawallMiddleware::new(
        retrying("mw-refused", &clock).build().unwrap(),
    ));

    let error = client
        .get(format!("http://127.0.0.1:{port}/"))
        .send()
        .await
        .unwrap_err();

    assert!(error.is_connect(), "{error}");
    assert_eq!(clock.now(), ms(20), "three attempts, two waits");
}

#[derive(Debug, Clone, PartialEq)]
struct Tenant(&'static str);

/// A middleware behind seawall's: notes the `Tenant` extension each attempt
/// carries, and holds the first attempt until the second has started.
#[derive(Clone, Default)]
struct HoldsTheFirst {
    seen: Arc<std::sync::Mutex<Vec<Option<Tenant>>>>,
    second: Arc<tokio::sync::Notify>,
}

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for HoldsTheFirst {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let nth = {
            let mut seen = self.seen.lock().unwrap();
            seen.push(extensions.get::<Tenant>().cloned());
            seen.len()
        };
        if nth == 1 {
            let _ = tokio::time::timeout(Duration::from_secs(5), self.second.notified()).await;
        } else {
            self.second.notify_one();
        }
        next.run(request, extensions).await
    }
}

#[tokio::test]
async fn a_hedged_attempt_carries_the_callers_extensions() {
    let server = Server::start(|_, _| reply(200)).await;
    let pipeline = Pipeline::builder("mw-hedge-extensions")
        .hedging(Hedging::latency(ms(10)).max_hedged_attempts(1))
        .clock(VirtualClock::new())
        .build()
        .unwrap();
    let inner = HoldsTheFirst::default();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(SeawallMiddleware::new(pipeline))
        .with(inner.clone())
        .build();

    let response = client
        .get(server.url())
        .with_extension(Tenant("acme"))
        .send()
        .await
        .unwrap();

    assert_eq!(response.status(), 200);
    // The hedge ran while the first attempt held the call's extensions.
    assert_eq!(
        *inner.seen.lock().unwrap(),
        [Some(Tenant("acme")), Some(Tenant("acme"))]
    );
}

/// A retry refused by a policy (here an empty retry budget) ends the call
/// with the response the last attempt got, as when no retry is left.
#[tokio::test]
async fn a_retry_refused_by_the_budget_gives_back_the_last_response() {
    let server = Server::start(|_, _| reply(503)).await;
    let clock = VirtualClock::new();
    // One token: one retry, then the budget refuses the next one.
    let budget = seawall::RetryBudget::new(0.001, 1);
    let pipeline = Pipeline::builder("mw-budget-refusal")
        .retry(Retry::constant(ms(10)).max_attempts(3).budget(budget))
        .clock(clock.clone())
        .build()
        .unwrap();
    let client = client(SeawallMiddleware::new(pipeline));

    let response = client.get(server.url()).send().await.unwrap();

    assert_eq!(response.status(), 503);
    assert_eq!(server.hits(), 2, "the first attempt and its one retry");
}

/// A retry refused by a circuit the earlier attempts opened: the caller
/// gets the last 503; the next call is refused before anything is sent.
#[tokio::test]
async fn a_retry_refused_by_an_open_circuit_gives_back_the_last_response() {
    let server = Server::start(|_, _| reply(503)).await;
    let pipeline = Pipeline::builder("mw-open-refusal")
        .retry(Retry::constant(ms(10)).max_attempts(3))
        .circuit_breaker(CircuitBreaker::consecutive_failures(2))
        .clock(VirtualClock::new())
        .build()
        .unwrap();
    let client = client(SeawallMiddleware::new(pipeline));

    let response = client.get(server.url()).send().await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(server.hits(), 2, "two attempts open the circuit");

    let error = client.get(server.url()).send().await.unwrap_err();
    let refused = send_error(&error).rejection().unwrap();
    assert_eq!(refused.reason, RejectionReason::CircuitOpen);
    assert_eq!(server.hits(), 2, "nothing sent while the circuit is open");
}

/// The attempt and call outcomes a listener sees.
fn outcomes(events: &std::sync::Mutex<Vec<seawall::EventKind>>) -> Vec<String> {
    events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|event| match event {
            seawall::EventKind::AttemptFinished { outcome, .. } => {
                Some(format!("attempt {}", outcome.as_str()))
            }
            seawall::EventKind::CallFinished { outcome, .. } => {
                Some(format!("call {}", outcome.as_str()))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_response_kept_as_is_is_reported_as_send_through_reports_it() {
    use seawall::reqwest::SendThrough;

    // A 404 is not a failure; a 600 is one, not retried; both reach the
    // caller as they are, on both adapters alike.
    for (status, attempt) in [(404, "success"), (600, "failure")] {
        let server = Server::start(move |_, _| reply(status)).await;
        let listened = |name: &str| {
            let events = Arc::new(std::sync::Mutex::new(Vec::new()));
            let log = Arc::clone(&events);
            let pipeline = retrying(name, &VirtualClock::new())
                .on_event(move |e| log.lock().unwrap().push(e.kind.clone()))
                .build()
                .unwrap();
            (pipeline, events)
        };
        let (pipeline, sent) = listened(&format!("mw-kept-send-through-{status}"));
        let response = reqwest::Client::new()
            .get(server.url())
            .send_through(&pipeline)
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), status);
        let (pipeline, wrapped) = listened(&format!("mw-kept-middleware-{status}"));
        let response = client(SeawallMiddleware::new(pipeline))
            .get(server.url())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), status);

        let expected = [format!("attempt {attempt}"), "call success".to_string()];
        assert_eq!(outcomes(&sent), expected, "{status}");
        assert_eq!(outcomes(&wrapped), expected, "{status}");
        assert_eq!(server.hits(), 2, "not retried");
    }
}

#[test]
fn the_middleware_is_send_sync_and_clone() {
    fn bounds<T: Send + Sync + Clone + 'static>() {}
    bounds::<SeawallMiddleware>();
}

#[allow(dead_code)]
#[path = "../examples/reqwest.rs"]
mod example;

#[tokio::test]
async fn the_example_retries_then_the_circuit_opens() {
    let clock = VirtualClock::new();
    let pipeline = example::users_pipeline()
        .clock(clock.clone())
        .store(seawall::MemoryStore::new());

    let outcomes = example::run(pipeline).await.unwrap();

    assert_eq!(
        outcomes,
        [
            "200 OK after 3 attempt(s)",
            "200 OK after 3 attempt(s)",
            "200 OK after 3 attempt(s)",
            "500 Internal Server Error after 3 attempt(s)",
            "refused: circuit_open (0 sent)",
            "refused: circuit_open (0 sent)",
        ]
    );
    // Four calls of two backoff waits each: 50 ms, then 100 ms.
    assert_eq!(clock.now(), ms(4 * 150));
}

#[tokio::test]
async fn a_refusal_by_an_inner_seawall_middleware_is_not_retried() {
    let server = Server::start(|_, _| reply(200)).await;
    let clock = VirtualClock::new();
    let inner = Pipeline::builder("mw-inner")
        .circuit_breaker(CircuitBreaker::consecutive_failures(5))
        .build()
        .unwrap();
    inner.isolate().unwrap();
    let outer = retrying("mw-outer", &clock)
        .circuit_breaker(CircuitBreaker::consecutive_failures(1))
        .build()
        .unwrap();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(SeawallMiddleware::new(outer.clone()))
        .with(SeawallMiddleware::new(inner))
        .build();

    let error = client.get(server.url()).send().await.unwrap_err();

    let refused = send_error(&error).rejection().unwrap();
    assert_eq!(refused.reason, RejectionReason::CircuitOpen);
    assert_eq!(clock.now(), Duration::ZERO, "no retry");
    assert_eq!(server.hits(), 0);
    // Nor is it a failure of the dependency for the outer circuit.
    assert_eq!(outer.circuit_state().unwrap(), CircuitState::Closed);
}

#[tokio::test]
async fn the_error_classification_can_be_replaced() {
    // A port nobody listens on.
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap().port()
    };
    let clock = VirtualClock::new();
    let middleware = SeawallMiddleware::new(retrying("mw-classify-error", &clock).build().unwrap())
        .classify_error(|_: &reqwest_middleware::Error| Verdict::abort());
    let client = client(middleware);

    let error = client
        .get(format!("http://127.0.0.1:{port}/"))
        .send()
        .await
        .unwrap_err();

    assert!(error.is_connect(), "{error}");
    assert_eq!(clock.now(), Duration::ZERO, "one attempt, no wait");
}
