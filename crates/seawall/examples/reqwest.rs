//! A reqwest client wrapped once with seawall's middleware: retry with
//! backoff and a circuit breaker for every request it sends.
//!
//! The example starts a flaky server on 127.0.0.1 (a free port) that fails
//! two requests out of three, sends three requests through the client
//! (each retried to success), then takes the server down: the first call
//! gets the last 500 after its retries, and the circuit, now open, refuses
//! the next ones without sending anything. It prints what happened and
//! exits.
//!
//! ```text
//! cargo run -p seawall --example reqwest --features reqwest-middleware
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use seawall::reqwest::{SeawallMiddleware, SendError};
use seawall::{CircuitBreaker, Pipeline, PipelineBuilder, Retry};
use tokio::net::TcpListener;

/// The policies of every request: 3 attempts 50 ms then 100 ms apart, and
/// a circuit that opens after 3 failed attempts in a row.
pub(crate) fn users_pipeline() -> PipelineBuilder {
    Pipeline::builder("users-api")
        .retry(Retry::exponential(Duration::from_millis(50)).max_attempts(3))
        .circuit_breaker(CircuitBreaker::consecutive_failures(3))
}

/// A reqwest client whose every request goes through `pipeline`; each
/// attempt gives up after 2 s (reqwest's own timeout).
pub(crate) fn client(
    pipeline: PipelineBuilder,
) -> Result<ClientWithMiddleware, Box<dyn std::error::Error>> {
    let middleware = SeawallMiddleware::new(pipeline.build()?);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    Ok(ClientBuilder::new(client).with(middleware).build())
}

/// The flaky server: a 503 for two requests out of three while up, a 500
/// for every request while down; counts the requests it got.
#[derive(Debug, Clone, Default)]
pub(crate) struct FlakyServer {
    pub(crate) hits: Arc<AtomicU32>,
    pub(crate) down: Arc<AtomicBool>,
}

impl FlakyServer {
    /// Serves on a free port of 127.0.0.1 until the task is aborted.
    pub(crate) async fn serve(&self) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let server = self.clone();
        let app = Router::new().route(
            "/users/42",
            get(move || async move {
                let n = server.hits.fetch_add(1, Ordering::SeqCst) + 1;
                if server.down.load(Ordering::SeqCst) {
                    (StatusCode::INTERNAL_SERVER_ERROR, "down")
                } else if !n.is_multiple_of(3) {
                    (StatusCode::SERVICE_UNAVAILABLE, "busy")
                } else {
                    (StatusCode::OK, "user 42")
                }
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            // The server runs until the example (or test) aborts it.
            let _ = axum::serve(listener, app).await;
        });
        Ok((addr, task))
    }
}

/// Sends `calls` requests one after the other; says what each got and how
/// many requests reached the server for it.
pub(crate) async fn send(
    client: &ClientWithMiddleware,
    server: &FlakyServer,
    addr: SocketAddr,
    calls: usize,
) -> Vec<String> {
    let mut outcomes = Vec::new();
    for _ in 0..calls {
        let before = server.hits.load(Ordering::SeqCst);
        let result = client.get(format!("http://{addr}/users/42")).send().await;
        let sent = server.hits.load(Ordering::SeqCst) - before;
        outcomes.push(match result {
            Ok(response) => format!("{} after {sent} attempt(s)", response.status()),
            Err(reqwest_middleware::Error::Middleware(e)) => {
                match e.downcast_ref::<SendError>().and_then(SendError::rejection) {
                    Some(refused) => format!("refused: {} ({sent} sent)", refused.reason.as_str()),
                    None => format!("failed: {e}"),
                }
            }
            Err(e) => format!("failed: {e}"),
        });
    }
    outcomes
}

/// The whole run: three calls to the flaky server, then three while it is
/// down.
pub(crate) async fn run(
    pipeline: PipelineBuilder,
) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let client = client(pipeline)?;
    let server = FlakyServer::default();
    let (addr, task) = server.serve().await?;
    let mut outcomes = send(&client, &server, addr, 3).await;
    server.down.store(true, Ordering::SeqCst);
    outcomes.extend(send(&client, &server, addr, 3).await);
    task.abort();
    Ok(outcomes)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    for (n, outcome) in run(users_pipeline()).await?.iter().enumerate() {
        println!("call {}: {outcome}", n + 1);
    }
    Ok(())
}
