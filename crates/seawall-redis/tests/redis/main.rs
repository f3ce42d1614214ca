//! Tests of `seawall-redis` against a real `redis-server`, started per test
//! on a free loopback port (see `support.rs`), and against a real Redis
//! Cluster of six nodes (`cluster.rs`: one cluster shared by the tests that
//! leave its nodes alone; `failover.rs` and the restart test start their
//! own).
//!
//! The server's clock decides windows and leases, so the time-based checks
//! use short real durations (at most a few seconds) and check bounds;
//! `contract.rs` and `models.rs` also run on the caller's clock, where
//! every duration is checked exactly.

mod bad_input;
mod breaker_model;
mod budget;
mod carried;
mod cluster;
mod contract;
mod cross_process;
mod differential;
mod failover;
mod leased;
mod local_refusals;
mod models;
mod outage;
mod pipeline;
mod redaction;
mod restart;
mod round_trips;
mod support;
