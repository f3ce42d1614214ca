//! `seawall-demo`: watch seawall protect callers from a flaky service, live.
//!
//! ```text
//! cargo run --release -p seawall-demo                 # the live run, about 60 s
//! cargo run --release -p seawall-demo -- --web        # the same, drawn on a live page
//! cargo run --release -p seawall-demo -- --redis      # two processes, one circuit in Redis
//! cargo run --release -p seawall-demo -- --help       # every option
//! cargo run --release -p seawall-demo -- herd         # why backoff needs jitter
//! cargo run --release -p seawall-demo -- saga         # compensations and recovery
//! cargo run --release -p seawall-demo -- choreography # three services over Redis Streams
//! ```
//!
//! Where to read:
//! - [`protected`]: the seawall pipeline of the protected clients, the part
//!   to copy into your own code;
//! - [`client`]: the HTTP client and how its errors are classified;
//! - [`live`]: the run itself, both groups of clients side by side;
//! - [`service`] and [`scenario`]: the flaky service and its phases;
//! - [`events`] and [`report`]: the live log and the summary;
//! - [`timeline`] and `web`: the run second by second, drawn on a live page
//!   (feature `web`, on by default);
//! - `two_processes`: `--redis`, a second process refused by the circuit
//!   the first opened (feature `redis`, on by default);
//! - [`herd`] and [`chart`]: the thundering-herd simulation;
//! - `saga`: the place-order saga (feature `saga`, on by default);
//! - `choreography`: the store as three services talking through Redis
//!   Streams (feature `choreography`, on by default).
#![forbid(unsafe_code)]
// A few helpers serve only `--web` or `--redis`: a build without those
// features leaves them unused.
#![cfg_attr(not(all(feature = "redis", feature = "web")), allow(dead_code))]

mod chart;
#[cfg(feature = "choreography")]
mod choreography;
mod cli;
mod client;
mod events;
mod herd;
mod live;
mod protected;
#[cfg(any(feature = "redis", feature = "choreography"))]
mod redis_server;
mod report;
#[cfg(feature = "saga")]
mod saga;
mod scenario;
mod service;
#[cfg(feature = "choreography")]
#[path = "../../seawall-saga/examples/store/service.rs"]
mod store;
mod style;
mod timeline;
#[cfg(feature = "redis")]
mod two_processes;
#[cfg(feature = "web")]
mod web;

use std::io::Write;
use std::process::ExitCode;
use std::sync::OnceLock;

use crate::cli::{Command, LiveOptions};

/// Why the program stops before its end.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Bad input (an option, an unreachable store, an unwritable file):
    /// exit code 2.
    BadInput(String),
    /// Something went wrong while running: exit code 1.
    Runtime(String),
}

fn main() -> ExitCode {
    let result = match cli::parse() {
        Ok(Command::Help(text)) => {
            say(text);
            Ok(())
        }
        Ok(Command::Live(options)) => run_live(&options),
        Ok(Command::Herd(options)) => herd::run(&options),
        Ok(Command::Saga(options)) => run_saga(&options),
        Ok(Command::Choreography(options)) => run_choreography(&options),
        Ok(Command::Second(options)) => run_second(&options),
        Err(usage) => Err(Failure::BadInput(format!("{} (see --help)", usage.0))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::BadInput(message)) => {
            complain(&message);
            ExitCode::from(2)
        }
        Err(Failure::Runtime(message)) => {
            complain(&message);
            ExitCode::FAILURE
        }
    }
}

fn run_live(options: &LiveOptions) -> Result<(), Failure> {
    #[cfg(not(feature = "web"))]
    if options.web.is_some() {
        return Err(Failure::BadInput(
            "this build has no live page (build with the `web` feature)".to_owned(),
        ));
    }
    #[cfg(not(feature = "redis"))]
    if options.redis.is_some() {
        return Err(Failure::BadInput(
            "this build has no Redis support (build with the `redis` feature)".to_owned(),
        ));
    }
    #[cfg(feature = "redis")]
    let (_server, redis_url) = match &options.redis {
        None => (None, None),
        Some(cli::RedisMode::Url(url)) => (None, Some(url.clone())),
        Some(cli::RedisMode::Own) => {
            let dir =
                std::env::temp_dir().join(format!("seawall-demo-redis-{}", std::process::id()));
            let server = redis_server::RedisServer::start(&dir, "--redis")?;
            let url = server.url();
            (Some(server), Some(url))
        }
    };
    #[cfg(not(feature = "redis"))]
    let redis_url: Option<String> = None;
    if redis_url.is_some() {
        set_line_prefix(ROLE_FIRST);
    }
    let runtime = runtime()?;
    let result = runtime.block_on(live::run(options, redis_url.as_deref()));
    // Stops the page's server before the Redis server goes.
    drop(runtime);
    result
}

#[cfg(feature = "redis")]
fn run_second(options: &cli::SecondOptions) -> Result<(), Failure> {
    runtime()?.block_on(two_processes::second(options))
}

#[cfg(not(feature = "redis"))]
fn run_second(_options: &cli::SecondOptions) -> Result<(), Failure> {
    Err(Failure::BadInput(
        "this build has no Redis support (build with the `redis` feature)".to_owned(),
    ))
}

fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Runtime(format!("cannot start the async runtime: {e}")))
}

#[cfg(feature = "saga")]
fn run_saga(options: &cli::SagaOptions) -> Result<(), Failure> {
    saga::run(options)
}

#[cfg(not(feature = "saga"))]
fn run_saga(_options: &cli::SagaOptions) -> Result<(), Failure> {
    Err(Failure::BadInput(
        "this build has no saga support (build with the `saga` feature)".to_owned(),
    ))
}

#[cfg(feature = "choreography")]
fn run_choreography(options: &cli::ChoreographyOptions) -> Result<(), Failure> {
    choreography::run(options)
}

#[cfg(not(feature = "choreography"))]
fn run_choreography(_options: &cli::ChoreographyOptions) -> Result<(), Failure> {
    Err(Failure::BadInput(
        "this build has no choreography support (build with the `choreography` feature)".to_owned(),
    ))
}

/// What starts each line of the first process of `--redis`.
pub(crate) const ROLE_FIRST: &str = "first  | ";

/// What starts each line printed by [`say`], when set.
static LINE_PREFIX: OnceLock<&'static str> = OnceLock::new();

/// Starts every line [`say`] prints with `prefix` (once, before any).
fn set_line_prefix(prefix: &'static str) {
    let _ = LINE_PREFIX.set(prefix);
}

/// Prints `text` on stdout; a closed stdout is not worth a panic.
pub(crate) fn say(text: &str) {
    say_as(LINE_PREFIX.get().copied().unwrap_or(""), text);
}

/// Prints `text` on stdout, each line after `prefix`.
pub(crate) fn say_as(prefix: &str, text: &str) {
    let mut out = std::io::stdout().lock();
    if prefix.is_empty() {
        let _ = out.write_all(text.as_bytes());
    } else {
        for line in text.split_inclusive('\n') {
            let _ = out.write_all(prefix.as_bytes());
            let _ = out.write_all(line.as_bytes());
        }
    }
    let _ = out.flush();
}

/// Prints a one-line error on stderr.
fn complain(message: &str) {
    let _ = writeln!(std::io::stderr(), "seawall-demo: {message}");
}
