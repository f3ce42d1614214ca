//! Reference models of the stateful policies, for tests (feature
//! `test-util`).
//!
//! A model states a policy's rules plainly, with no concern for speed or
//! concurrency: every store (the in-memory one, Redis, your own) can be
//! driven with the same operations as the model and must give the same
//! answers. Each model comes with a driver that does exactly that.
pub mod breaker;
