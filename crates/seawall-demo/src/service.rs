//! The flaky HTTP service: healthy, then failing, slow, throttling and
//! healthy again, following the [`Scenario`]. It counts the requests that
//! reach it, per group of clients and per phase.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::scenario::{Group, Phase, Scenario};

/// The header naming the group of the caller.
pub(crate) const GROUP_HEADER: &str = "x-group";

/// The value of [`GROUP_HEADER`] sent by the second process of `--redis`.
pub(crate) const SECOND_PROCESS: &str = "second-process";

/// Requests that reached the service, per group and phase, and those of
/// the second process of `--redis`.
#[derive(Debug, Default)]
pub(crate) struct Hits {
    counts: [[AtomicU64; Phase::ALL.len()]; Group::ALL.len()],
    second_process: [AtomicU64; Phase::ALL.len()],
}

impl Hits {
    /// Counts one request of `group` during `phase`.
    pub(crate) fn add(&self, group: Group, phase: Phase) {
        self.counts[group.index()][phase.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests of the second process that arrived during `phase`.
    pub(crate) fn second_process(&self, phase: Phase) -> u64 {
        self.second_process[phase.index()].load(Ordering::Relaxed)
    }

    /// Requests of the second process, all phases together.
    pub(crate) fn second_process_total(&self) -> u64 {
        Phase::ALL.into_iter().map(|p| self.second_process(p)).sum()
    }

    /// Requests of `group` that arrived during `phase`.
    pub(crate) fn get(&self, group: Group, phase: Phase) -> u64 {
        self.counts[group.index()][phase.index()].load(Ordering::Relaxed)
    }

    /// Requests of `group`, all phases together.
    pub(crate) fn total(&self, group: Group) -> u64 {
        Phase::ALL.into_iter().map(|p| self.get(group, p)).sum()
    }
}

/// A running flaky service.
#[derive(Debug)]
pub(crate) struct FlakyService {
    /// Where it listens (127.0.0.1, a free port).
    pub(crate) addr: SocketAddr,
    /// What reached it.
    pub(crate) hits: Arc<Hits>,
}

/// Starts the service on a free port of 127.0.0.1. It runs until the
/// runtime shuts down.
///
/// # Errors
/// When no port can be bound.
pub(crate) async fn start(scenario: Scenario) -> io::Result<FlakyService> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let hits = Arc::new(Hits::default());
    let counted = Arc::clone(&hits);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let hits = Arc::clone(&counted);
            let service = service_fn(move |request| answer(request, scenario, Arc::clone(&hits)));
            tokio::spawn(async move {
                // A client that gave up closes its connection mid-answer:
                // that is part of the show, not an error of the service.
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(FlakyService { addr, hits })
}

/// Answers one request according to the current phase.
async fn answer(
    request: Request<Incoming>,
    scenario: Scenario,
    hits: Arc<Hits>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let arrived = Instant::now();
    let phase = scenario.phase_at(arrived);
    match request.headers().get(GROUP_HEADER).map(|v| v.as_bytes()) {
        Some(name) if name == SECOND_PROCESS.as_bytes() => {
            hits.second_process[phase.index()].fetch_add(1, Ordering::Relaxed);
        }
        Some(name) => {
            if let Some(group) = Group::from_name(name) {
                hits.add(group, phase);
            }
        }
        None => {}
    }
    let response = match phase {
        Phase::Healthy | Phase::Recovered => quote(&scenario, arrived),
        Phase::Failing => plain(StatusCode::SERVICE_UNAVAILABLE, "service unavailable\n"),
        Phase::Slow => {
            tokio::time::sleep(scenario.slow_answer).await;
            quote(&scenario, arrived)
        }
        Phase::Throttling => {
            let mut response = plain(StatusCode::TOO_MANY_REQUESTS, "slow down\n");
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(scenario.retry_after_secs));
            response
        }
    };
    Ok(response)
}

/// A successful answer: a price quote stamped with the time it was made.
fn quote(scenario: &Scenario, at: Instant) -> Response<Full<Bytes>> {
    let elapsed = scenario.elapsed(at).as_secs_f64();
    plain(
        StatusCode::OK,
        &format!("EUR/USD 1.0842 as of t+{elapsed:.1}s\n"),
    )
}

fn plain(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_owned())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    response
}
