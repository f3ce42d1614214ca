//! The tonic example against its scripted greeter, served by tonic on
//! 127.0.0.1: what each call got, how many attempts reached the server,
//! the wait before each retry, and the `grpc-timeout` the server saw on
//! each attempt.
#![cfg(feature = "tonic")]

use std::time::Duration;

use seawall::tonic::parse_grpc_timeout;
use seawall::{Pipeline, Retry};

#[allow(dead_code)]
#[path = "../examples/tonic.rs"]
mod example;

use example::{greeter_pipeline, run, Outcome};

/// The timeouts the server saw, read back.
fn timeouts(outcome: &Outcome) -> Vec<Duration> {
    outcome
        .timeouts
        .iter()
        .map(|t| {
            let t = t.as_deref().expect("every attempt has a grpc-timeout");
            parse_grpc_timeout(t).unwrap_or_else(|| panic!("unreadable grpc-timeout {t:?}"))
        })
        .collect()
}

#[tokio::test]
async fn unavailable_is_retried_exhausted_waits_the_pushback_and_wrong_requests_stop() {
    let outcomes = run(greeter_pipeline()).await.unwrap();
    let summary: Vec<_> = outcomes
        .iter()
        .map(|o| (o.result.clone(), o.timeouts.len(), o.waits.clone()))
        .collect();
    assert_eq!(
        summary,
        [
            // UNAVAILABLE, then the greeting: retried after the backoff.
            (
                Ok("hello, ada".to_owned()),
                2,
                vec![Duration::from_millis(20)]
            ),
            // RESOURCE_EXHAUSTED with a pushback of 150 ms: retried after
            // the pushback, longer than the backoff.
            (
                Ok("hello, grace".to_owned()),
                2,
                vec![Duration::from_millis(150)]
            ),
            // INVALID_ARGUMENT: not retried.
            (Err("InvalidArgument: scripted".to_owned()), 1, vec![]),
            // UNAVAILABLE with a negative pushback: not retried.
            (Err("Unavailable: scripted".to_owned()), 1, vec![]),
        ]
    );
}

#[tokio::test]
async fn each_attempt_sends_the_time_left_before_the_call_s_deadline() {
    let outcomes = run(greeter_pipeline()).await.unwrap();
    for (n, outcome) in outcomes.iter().enumerate() {
        let sent = timeouts(outcome);
        assert!(!sent.is_empty(), "call {n}");
        // The call's budget is 3 s; each attempt gets what is left of it.
        assert!(sent[0] <= Duration::from_secs(3), "call {n}: {sent:?}");
        for (i, wait) in outcome.waits.iter().enumerate() {
            // The next attempt started at least `wait` later, on the same
            // deadline, so it was sent at least `wait` less (tonic writes
            // the timeout in whole microseconds).
            assert!(
                sent[i + 1] + *wait <= sent[i] + Duration::from_micros(1),
                "call {n}: {sent:?} after waits {:?}",
                outcome.waits
            );
        }
    }
}

#[tokio::test]
async fn without_a_deadline_no_grpc_timeout_is_sent() {
    let pipeline = Pipeline::builder("greeter-without-deadline")
        .retry(Retry::constant(Duration::from_millis(20)).max_attempts(3))
        .classify(seawall::tonic::classify);
    let outcomes = run(pipeline).await.unwrap();
    let attempts: usize = outcomes.iter().map(|o| o.timeouts.len()).sum();
    assert_eq!(attempts, 6);
    for outcome in &outcomes {
        assert!(
            outcome.timeouts.iter().all(Option::is_none),
            "{:?}",
            outcome.timeouts
        );
    }
}

#[tokio::test]
async fn a_request_s_own_shorter_timeout_is_kept() {
    use example::{Greeter, GreeterClient, HelloRequest};
    let greeter = Greeter::new([]);
    let (addr, server) = greeter.serve().await.unwrap();
    let client = GreeterClient::connect(addr).await.unwrap();
    let pipeline = greeter_pipeline().build().unwrap();
    let reply = pipeline
        .run(|ctx| {
            let mut client = client.clone();
            async move {
                let mut request = tonic::Request::new(HelloRequest { name: "ada".into() });
                request.set_timeout(Duration::from_millis(250));
                client
                    .say_hello(seawall::tonic::with_deadline(request, &ctx))
                    .await
            }
        })
        .await
        .unwrap();
    server.abort();
    assert_eq!(reply.into_inner().message, "hello, ada");
    assert_eq!(
        *greeter.timeouts.lock().unwrap(),
        [Some("250000u".to_owned())]
    );
}

/// A tonic client over a tower layer answering with `status_errors()`: a
/// refusal reaches the caller as the status `seawall::tonic::status` gives
/// it, with the policy's wait as `grpc-retry-pushback-ms`, not as
/// `UNKNOWN`.
#[cfg(feature = "tower")]
mod through_a_layer {
    use std::net::SocketAddr;

    use seawall::tower::PipelineLayer;
    use seawall::{CircuitBreaker, Pipeline, PipelineBuilder, RateLimiter};
    use tonic::transport::Endpoint;
    use tonic::{Code, Status};
    use tower::Layer;

    use super::example::{Answer, Greeter, HelloReply, HelloRequest};
    use super::*;

    /// One `SayHello` through `builder` as a single-attempt layer over a
    /// channel to `addr`, whose failed gRPC answers the layer judges by
    /// their status; every call of `names` in turn.
    async fn calls(
        builder: PipelineBuilder,
        addr: SocketAddr,
        names: &[&str],
    ) -> Vec<Result<String, Status>> {
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let layer = PipelineLayer::single_attempt(builder)
            .unwrap()
            .classify_response(|r: &http::Response<tonic::body::Body>| {
                let status = Status::from_header_map(r.headers())?;
                (status.code() != Code::Ok).then(|| seawall::tonic::classify(&status))
            })
            .status_errors();
        let mut grpc = tonic::client::Grpc::new(layer.layer(channel));
        let mut out = Vec::new();
        for name in names {
            grpc.ready().await.unwrap();
            let request = tonic::Request::new(HelloRequest {
                name: (*name).to_owned(),
            });
            let path = http::uri::PathAndQuery::from_static("/seawall.example.Greeter/SayHello");
            let codec = tonic_prost::ProstCodec::<HelloRequest, HelloReply>::default();
            let reply = grpc.unary(request, path, codec).await;
            out.push(reply.map(|r| r.into_inner().message));
        }
        out
    }

    fn pushback(status: &Status) -> Option<&str> {
        status
            .metadata()
            .get(seawall::tonic::RETRY_PUSHBACK)
            .map(|v| v.to_str().unwrap())
    }

    #[tokio::test]
    async fn an_open_circuit_answers_unavailable_with_its_cooldown_as_pushback() {
        let greeter = Greeter::new([
            Answer::Fail(Code::Unavailable, None),
            Answer::Fail(Code::Unavailable, None),
        ]);
        let (addr, server) = greeter.serve().await.unwrap();
        let builder = Pipeline::builder("greeter-layer-circuit").circuit_breaker(
            CircuitBreaker::consecutive_failures(2).cooldown(Duration::from_secs(30)),
        );
        let got = calls(builder, addr, &["a", "b", "c"]).await;
        server.abort();
        // The server's two UNAVAILABLE, as they were; then the circuit's.
        for answer in &got[..2] {
            let status = answer.as_ref().unwrap_err();
            assert_eq!(
                (status.code(), status.message()),
                (Code::Unavailable, "scripted")
            );
        }
        let refused = got[2].as_ref().unwrap_err();
        assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
        assert!(refused.message().contains("circuit_open"), "{refused:?}");
        let ms: u64 = pushback(refused).unwrap().parse().unwrap();
        // The cooldown ends on a whole millisecond, rounded up.
        assert!((29_000..=30_001).contains(&ms), "{ms}");
        assert_eq!(
            greeter.timeouts.lock().unwrap().len(),
            2,
            "the third call never left"
        );
    }

    #[tokio::test]
    async fn a_rate_limited_call_answers_resource_exhausted_with_its_wait() {
        let greeter = Greeter::new([]);
        let (addr, server) = greeter.serve().await.unwrap();
        let builder = Pipeline::builder("greeter-layer-rate")
            .rate_limiter(RateLimiter::gcra(1, Duration::from_secs(10)));
        let got = calls(builder, addr, &["a", "b"]).await;
        server.abort();
        assert_eq!(got[0].as_ref().unwrap(), "hello, a");
        let refused = got[1].as_ref().unwrap_err();
        assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
        let ms: u64 = pushback(refused).unwrap().parse().unwrap();
        assert!((9_000..=10_000).contains(&ms), "{ms}");
        // The client's own retry policy reads it as throttling, with the wait.
        let verdict = seawall::tonic::classify(refused);
        assert_eq!(verdict.retry_after(), Some(Duration::from_millis(ms)));
        assert_eq!(greeter.timeouts.lock().unwrap().len(), 1);
    }
}
