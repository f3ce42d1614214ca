//! Reference models of the stateful policies, for tests (feature
//! `test-util`).
//!
//! Each model states the documented rules of one policy as plainly as it
//! can: no atomics, no packed words, no shortcuts, straightforward
//! arithmetic. A store is correct when it answers every sequence of
//! operations exactly as the model does; the property tests of seawall and
//! seawall-redis drive random sequences into both and compare every answer
//! ([`resource::Differential`]). A third-party [`StateStore`] can be checked
//! the same way.
//!
//! - [`budget`]: the retry budget kept in a store, with a driver that
//!   checks a store against it.
//! - [`breaker`]: the circuit breaker in every mode, with a driver that
//!   checks a store against it.
//! - [`bulkhead`]: at most `max_concurrent` slots held; in a shared store a
//!   slot not given back within its lease is free again.
//! - [`cooldown`]: a pause opened or extended by retry-after hints.
//! - [`rate`]: GCRA, fixed window and exact sliding window.
//! - [`resource`]: all of them composed in admission order, with the
//!   operations of [`ResourceState`] and partitions.
//!
//! # Time
//! Instants are [`Duration`]s since the clock's origin, kept as stores keep
//! them: a `u64` of nanoseconds. An instant that would fall after the last
//! one, [`END`] (`u64::MAX` ns, about 584 years), is [`END`]: a deadline
//! that cannot be represented lands on the safe side, as late as possible.
//!
//! [`StateStore`]: crate::store::StateStore
//! [`ResourceState`]: crate::store::ResourceState

use std::time::Duration;

pub mod breaker;
pub mod budget;
pub mod bulkhead;
pub mod cooldown;
pub mod rate;
pub mod resource;

pub use resource::{CircuitModel, Differential, NoCircuit, Resource};

/// The last instant a store can represent: `u64::MAX` nanoseconds.
pub const END: Duration = Duration::from_nanos(u64::MAX);

/// `t` as an instant of the stores' range: at most [`END`].
pub fn instant(t: Duration) -> Duration {
    t.min(END)
}

/// The instant `by` after `now`, at most [`END`].
pub fn later(now: Duration, by: Duration) -> Duration {
    instant(now.saturating_add(by))
}
