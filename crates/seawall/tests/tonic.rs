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
