//! Tests of `seawall-redis` against a real `redis-server`, started per test
//! on a free loopback port (see `support.rs`).
//!
//! The server's clock decides windows and leases, so the time-based checks
//! use short real durations (at most a few seconds) and check bounds.

mod bad_input;
mod breaker_model;
mod contract;
mod cross_process;
mod outage;
mod pipeline;
mod round_trips;
mod support;
