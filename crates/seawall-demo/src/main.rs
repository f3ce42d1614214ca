//! `seawall-demo`: watch seawall protect callers from a flaky service, live.
//!
//! ```text
//! cargo run --release -p seawall-demo                 # the live run, about 60 s
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
//! - [`herd`] and [`chart`]: the thundering-herd simulation;
//! - `saga`: the place-order saga (feature `saga`, on by default);
//! - `choreography`: the store as three services talking through Redis
//!   Streams (feature `choreography`, on by default).
#![forbid(unsafe_code)]

mod chart;
#[cfg(feature = "choreography")]
mod choreography;
mod cli;
mod client;
mod events;
mod herd;
mod live;
mod protected;
mod report;
#[cfg(feature = "saga")]
mod saga;
mod scenario;
mod service;
#[cfg(feature = "choreography")]
#[path = "../../seawall-saga/examples/store/service.rs"]
mod store;
mod style;

use std::io::Write;
use std::process::ExitCode;

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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Runtime(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(live::run(options))
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

/// Prints `text` on stdout; a closed stdout is not worth a panic.
pub(crate) fn say(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// Prints a one-line error on stderr.
fn complain(message: &str) {
    let _ = writeln!(std::io::stderr(), "seawall-demo: {message}");
}
