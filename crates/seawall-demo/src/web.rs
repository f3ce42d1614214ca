//! `--web`: the live page, served on 127.0.0.1 by the process that runs
//! the scenario.
//!
//! - `/` is one self-contained HTML file (`web/page.html`: inline CSS, JS
//!   and SVG; nothing is fetched from anywhere else);
//! - `/summary.json` is what the page draws: the run second by second and
//!   the circuit's changes ([`Timeline::json`]), the summary (the very
//!   object of the `SUMMARY` line) and the herd comparison (the object of
//!   the `HERD` line); the page polls it once a second until the run is over;
//! - `/herd.svg` is the herd chart of the `herd` subcommand.
//!
//! The page writes each figure it shows into the `data-*` attributes of an
//! element with an `id` as well, so that a test can read them from the DOM.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use crate::report::{Stats, Summary};
use crate::scenario::Scenario;
use crate::service::Hits;
use crate::timeline::Timeline;
use crate::{chart, herd, Failure};

/// The page.
const PAGE: &str = include_str!("web/page.html");

/// What the page shows of the run.
#[derive(Debug)]
pub(crate) struct Run {
    /// The run's timeline.
    pub(crate) scenario: Scenario,
    /// Clients per group.
    pub(crate) clients: usize,
    /// The callers' calls.
    pub(crate) stats: Arc<Stats>,
    /// The requests that reached the service.
    pub(crate) hits: Arc<Hits>,
    /// The run second by second.
    pub(crate) timeline: Arc<Timeline>,
    /// Whether a second process calls the service too (`--redis`).
    pub(crate) second_process: bool,
}

/// What the handlers share.
#[derive(Debug)]
struct Shared {
    run: Run,
    herd_json: String,
    herd_svg: String,
}

/// The live page, being served.
#[derive(Debug)]
pub(crate) struct Page {
    addr: SocketAddr,
}

impl Page {
    /// Where to open it.
    pub(crate) fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }
}

/// Binds 127.0.0.1:`port` (0: any free port), runs the herd comparison and
/// serves the page until the runtime shuts down.
///
/// # Errors
/// [`Failure::BadInput`] when the port cannot be bound.
pub(crate) async fn serve(port: u16, run: Run) -> Result<Page, Failure> {
    let listener = TcpListener::bind(("127.0.0.1", port)).await.map_err(|e| {
        Failure::BadInput(format!(
            "cannot serve the live page on 127.0.0.1:{port}: {e} (--port 0 takes any free port)"
        ))
    })?;
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::Runtime(format!("the page's socket has no address: {e}")))?;
    let series = herd::compare(herd::DEFAULT_CLIENTS, herd::DEFAULT_SEED)?;
    let shared = Arc::new(Shared {
        run,
        herd_json: herd::json(&series, herd::DEFAULT_CLIENTS, herd::DEFAULT_SEED),
        herd_svg: chart::render(&series, herd::DEFAULT_CLIENTS),
    });
    let app = Router::new()
        .route("/", get(page))
        .route("/summary.json", get(summary))
        .route("/herd.svg", get(herd_chart))
        .with_state(shared);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(Page { addr })
}

async fn page() -> Html<&'static str> {
    Html(PAGE)
}

async fn summary(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "application/json"),
            (CACHE_CONTROL, "no-store"),
        ],
        json(&shared),
    )
}

async fn herd_chart(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    ([(CONTENT_TYPE, "image/svg+xml")], shared.herd_svg.clone())
}

/// The document `/summary.json` serves.
fn json(shared: &Shared) -> String {
    let run = &shared.run;
    let mut summary = Summary::new(&run.stats, &run.hits, &run.scenario, run.clients);
    if run.second_process {
        summary = summary.with_second_process();
    }
    let now = run.scenario.elapsed(Instant::now());
    format!(
        "{{{},\"summary\":{},\"herd\":{}}}",
        run.timeline.json(now, run.scenario.total()),
        summary.json(),
        shared.herd_json
    )
}
