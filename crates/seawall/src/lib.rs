//! Seawall: a resilience toolbox for Rust.
//!
//! Retry (backoff + jitter + budget), circuit breaker, timeout, bulkhead,
//! rate limiter, cooldown, adaptive concurrency limit (AIMD, Vegas,
//! Gradient2), chaos injection, fallback and request coalescing (with a
//! small cache of successes), composed into one [`Pipeline`] with policies
//! of your own ([`custom`]), with state that can be shared across processes
//! through a [`StateStore`] (in-memory by default, Redis with
//! `seawall-redis`).
//!
//! ```
//! use std::time::Duration;
//! use seawall::{CircuitBreaker, Jitter, Pipeline, Retry};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let users = Pipeline::builder("users-api")
//!     .retry(Retry::exponential(Duration::from_millis(200)).max_attempts(3).jitter(Jitter::Full))
//!     .circuit_breaker(CircuitBreaker::failure_rate(0.5).minimum_calls(10))
//!     .timeout(Duration::from_secs(5))
//!     .build()?;
//!
//! let user = users
//!     .run(|ctx| async move {
//!         // feed ctx.remaining() to the client's own timeout
//!         let _budget = ctx.remaining();
//!         Ok::<_, std::io::Error>("ada")
//!     })
//!     .await?;
//! assert_eq!(user, "ada");
//! # Ok(())
//! # }
//! ```
//!
//! # Features
//! - `tracing`: every event is also a `tracing` event (target `seawall`),
//!   at a level by how much it matters (circuit openings, overload and
//!   store outages at `WARN`, per-call summaries at `TRACE`: the table is in
//!   [`event`]); each attempt of the operation runs in a span
//!   `seawall.call` (`pipeline`, `partition`, `attempt`).
//! - `macros`: the `#[resilient(...)]` attribute, which runs a function or
//!   method through a pipeline declared on it (`seawall::resilient`).
//! - `serde`: named pipelines from TOML or YAML files, in a reloadable
//!   registry (`seawall::config`).
//! - `watch` (with `serde`): `config::Registry::watch` reloads a file when
//!   it changes.
//! - `metrics`: counters, gauges and histograms through the `metrics`
//!   facade (`seawall::metrics`).
//! - `http`: HTTP classification helpers and `Retry-After` parsing
//!   (`seawall::http`).
//! - `tower`: a `tower::Layer` putting any service behind a pipeline
//!   (`seawall::tower`).
//! - `reqwest` (with `http`): `client.get(url).send_through(&pipeline)`
//!   (`seawall::reqwest`).
//! - `reqwest-middleware` (with `reqwest`): `SeawallMiddleware` for
//!   `reqwest_middleware::ClientBuilder` (`seawall::reqwest`).
//! - `tonic`: gRPC classification for tonic (`tonic::Status` codes, the
//!   server's `grpc-retry-pushback-ms`) and each attempt's `grpc-timeout`
//!   from the time left (`seawall::tonic`).
//! - `test-util`: tools for testing code that uses seawall
//!   (`seawall::testing`: a virtual clock, fixed random sequences, contexts
//!   for unit tests of an operation), the contract suite of state stores
//!   (`seawall::store::contract`) and the reference models of the stateful
//!   policies (`seawall::model`), to check a store against them. Enable it
//!   in `[dev-dependencies]` only.
//! - `full`: all of the above.
//!
//! # Order of policies
//! Policies nest in the order they are declared, outermost first:
//! a timeout declared before the retry bounds the whole call, one declared
//! after it bounds each attempt. The stateful policies (circuit breaker,
//! bulkhead, cooldown, rate limiter; each declared once) guard each attempt
//! when declared after the retry (or without one), and the whole call when
//! declared before it: one admission and one outcome per call (see
//! [`PipelineBuilder`]). On each side they are checked in that order. The
//! adaptive concurrency limit ([`adaptive`]) guards each attempt, in this
//! process, before them. [Hedging](hedge) (async only) takes the retry's
//! place: a pipeline makes its attempts with one or the other, and what is
//! declared after hedging acts on each hedged attempt. The fallback is
//! always outermost; request coalescing ([`coalesce`]), when declared, is
//! declared first and shares one execution of the whole call. A policy
//! written in code declares whether it stands around the whole call or
//! around each attempt, and the same order rules place it ([`custom`]).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod adaptive;
pub mod breaker;
pub mod bulkhead;
pub mod chaos;
pub mod classify;
pub mod clock;
pub mod coalesce;
#[cfg(feature = "serde")]
pub mod config;
pub mod context;
pub mod cooldown;
pub mod custom;
pub mod error;
pub mod event;
pub mod fallback;
pub mod hedge;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(any(test, feature = "test-util"))]
pub mod model;
pub mod pipeline;
pub mod rate_limit;
#[cfg(feature = "reqwest")]
pub mod reqwest;
pub mod retry;
pub mod shadow;
pub mod store;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod timeout;
#[cfg(feature = "tonic")]
pub mod tonic;
#[cfg(feature = "tower")]
pub mod tower;

pub use adaptive::{AdaptiveLimit, LimitAlgorithm, LimitSnapshot};
pub use breaker::{CircuitBreaker, CircuitMetrics, CircuitState};
pub use bulkhead::Bulkhead;
pub use chaos::{Chaos, ChaosSwitch};
pub use classify::{Verdict, VerdictKind};
pub use clock::{Clock, Random, SystemClock, SystemRandom};
pub use coalesce::Coalesce;
pub use context::{Context, PartitionKey};
pub use cooldown::Cooldown;
pub use error::{ConfigError, Error, Rejection, RejectionReason, StoreError, TimeoutError};
pub use event::{AttemptOutcome, CallOutcome, Event, EventKind, HedgeTrigger};
pub use hedge::Hedging;
pub use pipeline::{Pipeline, PipelineBuilder};
pub use rate_limit::RateLimiter;
pub use retry::{Backoff, Jitter, Retry, RetryBudget};
pub use store::{MemoryStore, StateStore};
pub use timeout::Timeout;

#[cfg(feature = "macros")]
pub use seawall_macros::resilient;
