//! Per-tenant load shedding on an axum server: each tenant (the `x-tenant`
//! header) may send 5 requests a minute and run 2 at once, and has its own
//! circuit, opened by 5 server errors in a row; past that it gets a 429
//! (rate limited) or a 503 (bulkhead full, circuit open), each with a
//! `Retry-After`, answered by seawall's layer itself: no
//! `HandleErrorLayer`, no handler code.
//!
//! The example serves on 127.0.0.1 (a free port), sends 7 requests for
//! each of two tenants, prints what came back, and exits.
//!
//! ```text
//! cargo run -p seawall --example axum --features tower,http
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::routing::get;
use axum::Router;
use seawall::tower::{LayerPipeline, PipelineLayer};
use seawall::{Bulkhead, CircuitBreaker, ConfigError, Pipeline, PipelineBuilder, RateLimiter};
use tokio::net::TcpListener;

/// The policies guarding the handlers: for each tenant, a circuit that
/// opens after 5 server errors in a row, 2 requests at once, 5 a minute
/// (GCRA, bursts of 5).
pub(crate) fn orders_pipeline() -> PipelineBuilder {
    Pipeline::builder("orders-handler")
        .circuit_breaker(CircuitBreaker::consecutive_failures(5))
        .bulkhead(Bulkhead::new(2))
        .rate_limiter(RateLimiter::gcra(5, Duration::from_secs(60)).burst(5))
}

/// The tenant of a request: its `x-tenant` header (requests without one
/// share the pipeline's own limits).
pub(crate) fn tenant(request: &Request) -> Option<String> {
    let tenant = request.headers().get("x-tenant")?;
    tenant.to_str().ok().map(str::to_owned)
}

/// The application: `GET /orders`, behind the load-shedding layer. Returns
/// the layer's pipeline too, for its per-tenant state.
pub(crate) fn router(pipeline: PipelineBuilder) -> Result<(Router, LayerPipeline), ConfigError> {
    let shed_load = PipelineLayer::single_attempt(pipeline)?
        // The handlers' 5xx count against the tenant's circuit.
        .classify_response(seawall::http::classify_response::<Body>)
        .partition_by(tenant)
        .error_responses();
    let state = shed_load.pipeline().clone();
    let app = Router::new()
        .route("/orders", get(|| async { "orders: []" }))
        .layer(shed_load);
    Ok((app, state))
}

/// Serves `app` on a free port of 127.0.0.1 until the task is aborted.
pub(crate) async fn serve(
    app: Router,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move {
        // The server runs until the example (or test) aborts it.
        let _ = axum::serve(listener, app).await;
    });
    Ok((addr, server))
}

/// What one request got back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) tenant: &'static str,
    pub(crate) status: u16,
    pub(crate) retry_after: Option<String>,
}

/// Sends `per_tenant` requests for each tenant, one after the other, with
/// a plain HTTP/1 client.
pub(crate) async fn client_loop(
    addr: SocketAddr,
    tenants: &[&'static str],
    per_tenant: usize,
) -> Result<Vec<Answer>, Box<dyn std::error::Error + Send + Sync>> {
    let client = reqwest::Client::new();
    let mut answers = Vec::new();
    for &tenant in tenants {
        for _ in 0..per_tenant {
            let response = client
                .get(format!("http://{addr}/orders"))
                .header("x-tenant", tenant)
                .send()
                .await?;
            let retry_after = response.headers().get("retry-after");
            let retry_after = retry_after.and_then(|v| v.to_str().ok()).map(str::to_owned);
            answers.push(Answer {
                tenant,
                status: response.status().as_u16(),
                retry_after,
            });
        }
    }
    Ok(answers)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (app, _) = router(orders_pipeline())?;
    let (addr, server) = serve(app).await?;
    println!("serving on http://{addr}/orders");
    for answer in client_loop(addr, &["acme", "globex"], 7).await? {
        match answer.retry_after {
            Some(wait) => println!(
                "{:>6}: {} (Retry-After: {wait})",
                answer.tenant, answer.status
            ),
            None => println!("{:>6}: {}", answer.tenant, answer.status),
        }
    }
    server.abort();
    Ok(())
}
