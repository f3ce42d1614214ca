//! The axum example's router, served in-process on 127.0.0.1: per-tenant
//! rate limits and bulkheads answered with 429 / 503 and `Retry-After` by
//! the layer itself. The pipeline runs on seawall's `VirtualClock`, which
//! stands still here, so every wait is exact, and on a store of its own per
//! test, so the tests running at once do not share limits.
#![cfg(all(feature = "tower", feature = "http"))]

use seawall::testing::VirtualClock;
use seawall::tower::AttemptFailure;
use seawall::{MemoryStore, PipelineBuilder};

#[allow(dead_code)]
#[path = "../examples/axum.rs"]
mod example;

use example::{client_loop, orders_pipeline, router, serve, Answer};

/// The example's pipeline, on a virtual clock and a store of its own.
fn isolated() -> PipelineBuilder {
    orders_pipeline()
        .clock(VirtualClock::new())
        .store(MemoryStore::new())
}

fn answer(tenant: &'static str, status: u16, retry_after: Option<&str>) -> Answer {
    Answer {
        tenant,
        status,
        retry_after: retry_after.map(str::to_owned),
    }
}

#[tokio::test]
async fn each_tenant_is_rate_limited_with_429_and_retry_after() {
    let (app, _) = router(isolated()).unwrap();
    let (addr, server) = serve(app).await.unwrap();

    let answers = client_loop(addr, &["acme", "globex"], 7).await.unwrap();
    server.abort();

    let mut expected = Vec::new();
    for tenant in ["acme", "globex"] {
        // A burst of 5, then one permit every 12 s.
        expected.extend((0..5).map(|_| answer(tenant, 200, None)));
        expected.extend((0..2).map(|_| answer(tenant, 429, Some("12"))));
    }
    assert_eq!(answers, expected);
}

#[tokio::test]
async fn a_full_bulkhead_answers_503_with_retry_after_for_that_tenant_only() {
    let (app, pipeline) = router(isolated()).unwrap();
    let (addr, server) = serve(app).await.unwrap();
    // Two slow calls of tenant acme hold its two slots.
    let (release, released) = tokio::sync::watch::channel(false);
    let mut holders = Vec::new();
    for _ in 0..2 {
        let (pipeline, released) = (pipeline.clone(), released.clone());
        holders.push(tokio::spawn(async move {
            let slow = pipeline.partition("acme");
            slow.run(|_| {
                let mut released = released.clone();
                async move {
                    let _ = released.wait_for(|done| *done).await;
                    Ok::<_, AttemptFailure>(())
                }
            })
            .await
        }));
    }
    drop(released);
    while pipeline.partition("acme").in_flight().unwrap() < 2 {
        tokio::task::yield_now().await;
    }

    let answers = client_loop(addr, &["acme", "globex"], 1).await.unwrap();

    assert_eq!(
        answers,
        [answer("acme", 503, Some("1")), answer("globex", 200, None)]
    );
    release.send(true).unwrap();
    for holder in holders {
        holder.await.unwrap().unwrap();
    }
    let after = client_loop(addr, &["acme"], 1).await.unwrap();
    assert_eq!(after, [answer("acme", 200, None)]);
    server.abort();
}

#[tokio::test]
async fn an_open_circuit_answers_503_with_retry_after_for_that_tenant_only() {
    let (app, pipeline) = router(isolated()).unwrap();
    let (addr, server) = serve(app).await.unwrap();
    pipeline.partition("acme").isolate().unwrap();

    let answers = client_loop(addr, &["acme", "globex"], 1).await.unwrap();
    server.abort();

    assert_eq!(
        answers,
        [answer("acme", 503, Some("1")), answer("globex", 200, None)]
    );
}

#[test]
fn the_layered_router_service_is_send_sync_and_clone() {
    let layer = seawall::tower::PipelineLayer::single_attempt(isolated())
        .unwrap()
        .partition_by(example::tenant)
        .error_responses();
    fn check<L>(_: &L)
    where
        L: tower::Layer<axum::routing::Route>,
        L::Service: tower::Service<axum::extract::Request> + Send + Sync + Clone + 'static,
        <L::Service as tower::Service<axum::extract::Request>>::Future: Send,
    {
    }
    check(&layer);
}
