//! A [`StateStore`](seawall::StateStore) on Redis: many processes calling
//! the same dependency see one circuit breaker, one bulkhead, one rate
//! limit and one cooldown.
//!
//! ```no_run
//! use std::time::Duration;
//! use seawall::{Bulkhead, CircuitBreaker, Cooldown, Pipeline, RateLimiter, Retry};
//! use seawall_redis::RedisStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::builder("redis://127.0.0.1:6379")
//!     .prefix("shop")
//!     .timeout(Duration::from_millis(250))
//!     .fail_open()
//!     .build()?;
//!
//! let inventory = Pipeline::builder("inventory-api")
//!     .retry(Retry::exponential(Duration::from_millis(100)).max_attempts(3))
//!     .circuit_breaker(CircuitBreaker::failure_rate(0.5).minimum_calls(20))
//!     .timeout(Duration::from_secs(2))
//!     .bulkhead(Bulkhead::new(50).lease(Duration::from_secs(10)))
//!     .cooldown(Cooldown::new())
//!     .rate_limiter(RateLimiter::gcra(1000, Duration::from_secs(1)))
//!     .store(store)
//!     .build()?;
//!
//! let stock = inventory.run(|_ctx| async { Ok::<_, std::io::Error>(42) }).await?;
//! # let _ = stock;
//! # Ok(())
//! # }
//! ```
//!
//! # How it works
//! - **One round trip to admit, one to record.** An attempt is admitted
//!   through circuit, bulkhead, cooldown and rate limit by one Lua script,
//!   and its outcome recorded by another; each is a single `EVALSHA`,
//!   atomic on the server. Nothing is read, changed and written back from
//!   the client. Scripts are loaded when a pipeline binds the store and
//!   reloaded automatically after `NOSCRIPT` (a server restart or
//!   `SCRIPT FLUSH`). A cancelled attempt gives its permit back with one
//!   more script call, in the background.
//! - **Successes are not waited for.** On a multi-thread tokio runtime, the
//!   record of a success that can change nothing the caller is told (not a
//!   half-open probe, not a slow call, no retry-after hint) is queued on the
//!   connection and its answer is not awaited, so an async call costs one
//!   round trip of latency. Such records (the most frequent) also run a
//!   lean script of their own. The caller's next admission follows it on the
//!   same connection; the blocking path waits for such records before it
//!   sends anything, so `call`, `in_flight` and the circuit controls see
//!   them too. If the runtime shuts down first, the slot is given back on
//!   the blocking path.
//! - **The server's clock decides** windows, leases and open periods (the
//!   scripts read `TIME`), so processes on hosts with skewed clocks agree.
//!   The `now` a pipeline passes is ignored, except with
//!   [`RedisStoreBuilder::caller_clock`] ([`TimeSource::Caller`]), meant for
//!   single-process tests with a virtual clock and for comparing the store
//!   with the reference models exactly.
//! - **Keys** are `{prefix:resource}:suffix`, or
//!   `{prefix:resource:s:key}:suffix` / `{prefix:resource:i:7}:suffix` for
//!   a partition: one hash tag, so a resource's keys share a cluster slot.
//!   A resource has at most six keys: its state hash (circuit and cooldown),
//!   its count-window ring or time-window buckets, its bulkhead leases and
//!   its rate limiter. Every key written has a TTL: circuit state lives for
//!   the resource's `partition_idle` (plus what is left of an open period),
//!   a cooldown for its pause plus `grace`, leases and rate state for their
//!   lease or period.
//! - **Bulkhead slots are leases**: a sorted set of slot ids (named after
//!   the microsecond they were taken in) scored by their expiry
//!   (`Bulkhead::lease`). A process killed while holding a slot loses it
//!   when the lease ends; give attempts a timeout shorter than the lease
//!   (the pipeline checks this). Half-open probes are leased likewise
//!   ([`RedisStoreBuilder::probe_lease`]).
//! - **Same semantics as the in-memory store**: the store passes the
//!   contract suite `seawall::store::contract` both with the server's clock
//!   and with a caller's clock (where every wait is checked exactly), and
//!   its circuit agrees with the reference model `seawall::model::breaker`
//!   on random sequences of calls, step by step. Resolutions: times are
//!   kept in microseconds; the end of a circuit's cooldown in whole
//!   milliseconds, rounded up, as in memory.
//! - **Rate-limit reservations** as in memory: a call that may wait for
//!   a permit (`RateLimiter::max_wait`) reserves it in the admission
//!   script, so that concurrent callers, in every process, queue behind it
//!   or are refused at once; a reservation its call does not use is given
//!   back by the release script. A GCRA whose emission interval is not a
//!   whole number of microseconds cannot tell its reservations apart
//!   exactly: one given back stays spent (stricter) until the queue has
//!   passed. While Redis is down (fail-open), the local answer reserves
//!   nothing.
//!
//! # When Redis fails
//! Every command has a timeout ([`RedisStoreBuilder::timeout`]; connecting
//! has [`RedisStoreBuilder::connect_timeout`]), on the async path and the
//! blocking one. After a connection failure or a timeout, Redis is
//! skipped, and a background thread reconnects every
//! [`reconnect_interval`](RedisStoreBuilder::reconnect_interval): an outage
//! costs the timeout once, not on every call. Meanwhile:
//! - [`FailMode::Open`] (default): calls are admitted on process-local
//!   state (a [`seawall::MemoryStore`] resource with the same policies;
//!   such permits carry `Permit::local` and are recorded locally), and the
//!   pipeline emits `StoreUnavailable { degraded: true }`. Limits then hold
//!   per process.
//! - [`FailMode::Closed`]: calls fail with `Error::Store` and the operation
//!   is not called.
//!
//! An outcome that cannot be recorded is lost (fail-open) or reported as
//! an error event (fail-closed); its slot comes back with its lease. An
//! admission that timed out may still have been executed by a slow server:
//! its slot, too, comes back with its lease. A
//! wrong password or a user without the `@scripting` commands is a
//! [`StoreError::Refused`](seawall::StoreError::Refused), reported when the
//! pipeline is built; an unreachable server at that time is not an error.
//!
//! # Requirements
//! Redis 6.2 or later, or Valkey; plain `EVALSHA`, no functions API. The
//! async path (`Pipeline::run`) needs a tokio runtime with timers enabled;
//! the blocking path (`Pipeline::call`) needs no runtime.
//!
//! # Features
//! - `tracing`: outages and recoveries are logged as `tracing` events
//!   (target `seawall_redis`).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod config;
mod error;
mod link;
mod scripts;
mod store;

pub use config::{FailMode, RedisStoreBuilder, TimeSource};
pub use error::RedisStoreError;
pub use store::RedisStore;
