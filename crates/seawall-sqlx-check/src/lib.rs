//! A workspace crate that depends on both `seawall-saga` and `sqlx` (SQLite
//! and Postgres drivers), as a service on sqlx would. That it builds proves
//! the two link one SQLite library; its tests run sagas whose steps write
//! their state and their outbox events in sqlx transactions, on a real SQLite
//! file and on Postgres (`SEAWALL_TEST_POSTGRES_URL`).
//!
//! It has no code of its own; see `tests/`.
#![forbid(unsafe_code)]
