//! Pipelines from configuration files (feature `serde`): named pipelines in
//! TOML or YAML, loaded into a [`Registry`] that hands them out by name and
//! reloads them at run time.
//!
//! ```
//! use seawall::config::{Format, Registry};
//! use seawall::MemoryStore;
//!
//! const CONFIG: &str = r#"
//! [default.retry]
//! max_attempts = 3
//! backoff = "exponential"
//! delay = "100ms"
//! cap = "2s"
//! jitter = "full"
//!
//! [pipelines.payments]
//! policies = ["timeout", "retry", "attempt_timeout", "circuit_breaker"]
//! timeout = "10s"
//! attempt_timeout = "2s"
//! retry = { max_attempts = 5 }
//! circuit_breaker = { failure_rate = 0.5, minimum_calls = 20, window = "60s" }
//!
//! [pipelines.search]
//! timeout = "500ms"
//! "#;
//!
//! let registry = Registry::builder()
//!     .store(MemoryStore::new())
//!     .load_str(Format::Toml, CONFIG)?;
//! let payments = registry.pipeline("payments")?;
//! let n = payments.call(|_ctx| Ok::<_, std::io::Error>(42))?;
//! assert_eq!(n, 42);
//! assert!(registry.get("checkout").is_none());
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```
//!
//! # The file
//! Two top-level keys, both optional:
//! - `pipelines`: one entry per pipeline, keyed by its name (the resource
//!   name that keys the pipeline's shared state);
//! - `default`: the same settings as a pipeline entry, inherited by every
//!   pipeline **field by field**: a pipeline that sets `retry.max_attempts`
//!   keeps the `delay`, `backoff` and `jitter` of `default.retry`. `default`
//!   is a template, not a pipeline.
//!
//! Unknown keys are errors. Durations are strings: `"200ms"`, `"30s"`,
//! `"1m"`, `"1h 30m"` (any unit of [`humantime`]: `ns`, `us`, `ms`, `s`,
//! `m`, `h`, `d`, ...).
//!
//! ## Pipeline entry
//! | key | value |
//! | --- | --- |
//! | `policies` | the policies in force, in declaration order, outermost first (see below); it may list policies written in code by name |
//! | `coalesce` | table, below: concurrent calls with the same key share one execution (`{}` for sharing alone) |
//! | `timeout` | bounds the whole call: a duration, or `{ duration = "5s", strict = true }` |
//! | `attempt_timeout` | bounds each attempt (needs `retry` or `hedging`); same forms as `timeout` |
//! | `retry` | table, below |
//! | `hedging` | table, below: further attempts while earlier ones run (async calls only) |
//! | `circuit_breaker` | table, below |
//! | `bulkhead` | table, below |
//! | `cooldown` | table, below (`{}` for the defaults) |
//! | `rate_limiter` | table, below |
//! | `adaptive_limit` | table, below (`{}` for Gradient2's defaults): the adaptive concurrency limit of each attempt |
//! | `chaos` | table, below: latency injection into each attempt |
//! | `partition_idle` | duration: idle partitions are evicted after it (default `10m`) |
//! | `classifier` | the name of a classifier registered in code (below) |
//! | `fallback` | the name of a fallback registered in code (below) |
//! | `fallback_on` | the kinds of final error the fallback takes (below; default: every error) |
//!
//! `strict = true` makes a late synchronous success an error
//! ([`Timeout::strict`](crate::Timeout::strict)).
//!
//! ## Order of policies
//! `policies` lists the policies in force in declaration order, as the
//! builder would declare them: `["coalesce", "timeout", "retry",
//! "attempt_timeout", "circuit_breaker", "bulkhead", "cooldown",
//! "rate_limiter", "adaptive_limit", "chaos"]` is the full list with a
//! retry; `hedging` takes the place of `retry` (a pipeline lists one of the
//! two), so `["timeout", "hedging", "attempt_timeout", "circuit_breaker",
//! "bulkhead", "rate_limiter"]` is the standard hedging pipeline: one
//! timeout for the whole call, each hedged attempt with its own timeout,
//! breaker record and bulkhead slot. The list must read the way the
//! pipeline nests: `coalesce` first, `timeout` (the
//! whole call) before `retry`, `attempt_timeout` after it. Each stateful
//! policy is listed once, on either side: after `retry` (the default order)
//! it guards each attempt, before it the whole call (one admission and one
//! outcome per call, as in the builder: `["circuit_breaker", "retry",
//! "bulkhead"]`). On each side the stateful policies are always checked in
//! the order circuit breaker, bulkhead, cooldown, rate limiter.
//!
//! - Without `policies` (here or in `default`), every policy the pipeline
//!   configures (itself or through `default`) is in force, in the order of
//!   the full list above.
//! - With `policies`, exactly the listed policies are in force: a section
//!   inherited from `default` but not listed is left out (this is how a
//!   pipeline drops a default policy), a section the pipeline sets itself
//!   but does not list is an error, and a listed policy needs a section
//!   (`cooldown` and `coalesce` excepted: they have defaults for everything).
//! - `policies` itself is inherited from `default` as a whole.
//! - A name that is no policy of the file (a snake_case word) names a
//!   policy written in code, registered on the [`RegistryBuilder`] (see
//!   below); it has no section, and it is in force only where it is listed.
//!
//! ## `retry`
//! | key | value | default |
//! | --- | --- | --- |
//! | `max_attempts` | attempts in all, the first included | `3` |
//! | `backoff` | `"constant"`, `"linear"`, `"exponential"` or `"decorrelated"` | `"exponential"` |
//! | `delay` | the first delay (constant: every delay) | required |
//! | `multiplier` | growth factor, exponential only | `2.0` |
//! | `cap` | largest delay before jitter, not for constant | none |
//! | `jitter` | `"none"`, `"full"`, `"equal"` or a percentage `"20%"` (proportional, ±20%) | `"none"` |
//! | `budget` | `{ ratio = 0.2, max_tokens = 10, shared = true }`: retries limited to a share of calls (`ratio` from 0.001, a thousandth of a token per call, to 1000); `shared` keeps the bucket in the pipeline's store, one for every process on it (`RetryBudget::shared`) | none; `max_tokens` 10; `shared` false |
//!
//! A retry budget keeps its tokens across a reload that does not change it
//! (a hedging budget too).
//!
//! ## `hedging`
//! | key | value | default |
//! | --- | --- | --- |
//! | `mode` | `"latency"` (the next attempt when the previous one has not answered within `delay`), `"parallel"` (all at once) or `"fallback"` (the next attempt only after a failure) | `"latency"` |
//! | `delay` | the latency mode's delay (not for the other modes) | required in mode latency |
//! | `max_hedged_attempts` | attempts beyond the first, 1 to 10 | `1` |
//! | `budget` | `{ ratio = 0.1, max_tokens = 10 }`: hedged attempts limited to a share of calls (the retry budget's rule), kept in the process (`shared = true` is a `ConfigError`) | none; `max_tokens` 10 |
//!
//! The dynamic mode (a delay generator), `hedge_if` and the on-hedging hook
//! are code: declare them with the builder ([`crate::hedge`]). A pipeline
//! with hedging runs async calls only (`run`); its sync `call` returns
//! [`Error::Config`](crate::Error::Config).
//!
//! ## `circuit_breaker`
//! | key | value | default |
//! | --- | --- | --- |
//! | `consecutive_failures` | mode: opens after N failures in a row | |
//! | `count_window` | mode: judges the last N calls | `100` |
//! | `window` | mode: judges the calls of the last duration (whole seconds) | |
//! | `failure_rate` | opens at this failure rate, in (0, 1] (window modes) | `0.5` |
//! | `minimum_calls` | calls needed before judging (window modes) | `20` |
//! | `slow_call_rate` | opens at this slow-call rate, in (0, 1] (window modes) | none |
//! | `slow_call_duration` | a call at least this long is slow | `60s` |
//! | `cooldown` | open time before probes | `30s` |
//! | `cooldown_growth`, `max_cooldown` | cooldown factor per repeated trip, and its cap (set both) | none |
//! | `half_open_calls` | probes admitted while half-open | `1` |
//! | `max_half_open` | the longest a round of probes blocks the next one (> 0) | none |
//! | `shadow` | [shadow mode](crate::shadow): judged and reported, never refuses | `false` |
//!
//! Set one mode key at most (`count_window = 100` without one). A pipeline
//! that sets a mode key replaces the mode of `default` as a whole.
//!
//! ## `bulkhead`
//! `max_concurrent` (required), `max_queued` (default `0`), `max_wait`
//! (default `0s`: reject at once), `lease` (default `60s`), `shadow`
//! (default `false`).
//!
//! ## `cooldown`
//! `max_pause` (default `5m`), `max_wait` (default `30s`), `grace` (default
//! `60s`), `shadow` (default `false`).
//!
//! ## `rate_limiter`
//! `algorithm` (`"gcra"`, the default, `"fixed_window"` or
//! `"sliding_window"`), `limit` and `period` (required; `period` at most 292
//! years, [`RateLimiter::MAX_PERIOD`](crate::RateLimiter::MAX_PERIOD)),
//! `burst` (GCRA only, default `limit`), `max_wait` (default `0s`), `shadow`
//! (default `false`).
//!
//! `shadow = true` puts a stateful policy in [shadow mode](crate::shadow):
//! it keeps its state and reports what it would refuse
//! (`shadow_rejected` events) but never refuses nor delays a call; set it
//! back to `false` (a reload) to enforce the same limit.
//!
//! ## `coalesce`
//! `ttl` (default none: no cache; with it, successes are kept this long and
//! answer calls with the same key), `max_entries` (the cache's bound, with
//! `ttl`; default `1024`). A zero `ttl` or `max_entries` is refused, at the
//! key's line and column. Only calls made with a key share
//! (`pipeline.coalesce_key(k)`, `partition(p).coalesced()`): see
//! [`crate::coalesce`]; a pipeline without the section runs them as plain
//! calls.
//!
//! ## `chaos`
//! `rate` (required, `0` to `1`: the share of attempts that get the
//! latency), `latency` (required), `enabled` (default `true`). A file
//! declares a latency injection, listed after `retry` (the default order
//! puts it innermost); a fault injection, whose error comes from code, and
//! a switch flipped at run time are declared with the builder
//! ([`crate::chaos`]).
//!
//! ## `adaptive_limit`
//! The adaptive concurrency limit of each attempt, in this process
//! ([`crate::adaptive`], where the defaults of each algorithm are listed),
//! listed after `retry`:
//!
//! | key | value | applies to |
//! | --- | --- | --- |
//! | `algorithm` | `"aimd"`, `"vegas"` or `"gradient2"` (default) | |
//! | `initial_limit`, `min_limit`, `max_limit` | the limit's start and bounds | all |
//! | `update_interval` | samples gathered before each update (default `100ms`) | all |
//! | `backoff_ratio` | factor of a decrease, in [0.5, 1) | aimd |
//! | `rtt_timeout` | a latency above it is a drop | aimd |
//! | `smoothing` | weight of a new limit, in (0, 1] | vegas, gradient2 |
//! | `queue_size` | headroom added to the limit | gradient2 |
//! | `buffer` | share by which a latency may exceed the baseline | gradient2 |
//! | `min_rtt_interval`, `min_rtt_samples`, `min_rtt_concurrency`, `min_rtt_jitter` | the baseline's measurement: how often, over how many attempts, at which pinned concurrency, with which random share of the interval added | vegas, gradient2 |
//! | `max_queued`, `max_wait` | a queue for async calls (default none) | all |
//! | `partitions` | shares of the limit by partition key, adding up to 1: `{ live = 0.9, batch = 0.1 }` | all |
//! | `shadow` | [shadow mode](crate::shadow): adapts and reports, never refuses nor queues (default `false`) | all |
//!
//! A setting of another algorithm is an error at its key (say
//! `backoff_ratio` with `algorithm = "vegas"`), unless it is inherited from
//! `default` by a pipeline that chose its algorithm itself.
//!
//! A field that applies only to another kind (say `multiplier` with a
//! constant backoff, `burst` with a fixed window, `failure_rate` with
//! `consecutive_failures`) is an error, unless it is inherited from
//! `default` by a pipeline that picked another kind itself.
//!
//! ## Classifiers and fallbacks named in code
//! A classifier or a fallback is code, so the file names one that the
//! program registered on the [`RegistryBuilder`]:
//! [`classifier`](RegistryBuilder::classifier) (errors of type `E`),
//! [`fallback_sync`](RegistryBuilder::fallback_sync) or
//! [`fallback`](RegistryBuilder::fallback) (async) (`Result<T, E>`). The
//! entry's `classifier = "http"` and `fallback = "cached_quote"` (each
//! inherited from `default` when the entry has none) apply them as the
//! builder's [`classify`](PipelineBuilder::classify) and
//! [`fallback_sync`](PipelineBuilder::fallback_sync) /
//! [`fallback`](PipelineBuilder::fallback) would: the configured pipeline
//! classifies and falls back exactly as one built in code.
//!
//! Named handlers fix the pipeline's kind, so such a pipeline is looked up
//! typed, with [`Registry::typed`]: a `Pipeline<ErrorType<E>>` with a
//! classifier alone, a `Pipeline<WithFallback<T, E>>` (or
//! `WithAsyncFallback<T, E>`) with a fallback. The untyped lookups
//! ([`get`](Registry::get), [`pipeline`](Registry::pipeline),
//! [`handle`](Registry::handle)) refuse it rather than run it without its
//! handlers, and a typed lookup of another kind is a
//! [`LookupError::Kind`] naming both kinds.
//!
//! ```
//! use seawall::config::{Format, Registry};
//! use seawall::pipeline::WithFallback;
//! use seawall::{Error, MemoryStore, Verdict};
//!
//! #[derive(Debug)]
//! struct HttpError(u16);
//!
//! let registry = Registry::builder()
//!     .store(MemoryStore::new())
//!     .classifier("http", |e: &HttpError| match e.0 {
//!         429 | 500.. => Verdict::retry(),
//!         _ => Verdict::abort(),
//!     })
//!     .fallback_sync("cached_quote", |_e: Error<HttpError>, _ctx| Ok(100_u32))
//!     .load_str(Format::Toml, r#"
//! [pipelines.quotes]
//! retry = { max_attempts = 3, delay = "1ms" }
//! classifier = "http"
//! fallback = "cached_quote"
//! "#)?;
//! let quotes = registry.typed::<WithFallback<u32, HttpError>>("quotes")?;
//! assert_eq!(quotes.call(|_ctx| Err(HttpError(503))).ok(), Some(100));
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```
//!
//! `fallback_on` limits the fallback to some final errors, as
//! [`fallback_when`](PipelineBuilder::fallback_when) does; any other error
//! propagates unchanged. It lists kinds of [`Error`](crate::Error):
//! `"operation"`, `"retry_exhausted"`, `"timeout"`, `"rejected"`,
//! `"store"`, or a rejection of one reason: `"circuit_open"`,
//! `"bulkhead_full"`, `"rate_limited"`, `"cooldown_active"`,
//! `"cooldown_exceeds_deadline"`, `"retry_budget_exhausted"`,
//! `"concurrency_limited"`. So
//! `fallback_on = ["timeout", "circuit_open"]` answers from the cache
//! when the service is slow or known down, and lets its own errors
//! through. It needs a `fallback`, and must not be empty.
//!
//! ## Policies written in code
//! A policy written in code ([`crate::custom::Policy`]) registered with
//! [`RegistryBuilder::policy`] is listed in `policies` by its name, at the
//! place where it stands: `policies = ["audit", "timeout", "retry",
//! "count"]` declares `audit` around the whole call, outside the timeout,
//! and `count` around each attempt. Its place must fit the position it
//! declares, by the builder's rules (a load error at `policies` otherwise,
//! naming the policy, its position and the rule). Such a pipeline is
//! looked up typed, as `Pipeline<ValueType<T, E>>` for a policy of
//! `Result<T, E>`, or as its fallback's kind; a classifier, a fallback and
//! policies named together handle the same `T` and `E`.
//! [`Config::parse`] accepts the names without knowing them; a registry
//! that does not register a listed name refuses the load:
//!
//! ```text
//! seawall.toml:3:12: pipeline `quotes`: pipeline.policies lists `audti`, which is neither a policy of the file nor a policy registered in code (registered policies: `audit`, `count`); register it with `RegistryBuilder::policy`
//! ```
//!
//! A name that is not registered, or a classifier and a fallback of
//! different error types named together, fails the load (or the reload,
//! which keeps the old pipelines) with a [`LoadError::Invalid`] at the
//! key:
//!
//! ```text
//! seawall.toml:9:14: pipeline `quotes`: pipeline.classifier `grpc` is not registered (registered classifiers: `http`); register it with `RegistryBuilder::classifier`
//! ```
//!
//! A reload may name other registered handlers, or none: look the
//! pipeline up again after a reload to follow it. [`Config::builder`]
//! declares the policies of the file only; the handlers are added by the
//! registry (a builder of an entry that lists a policy written in code
//! refuses to build: only a registry can place it).
//!
//! ## YAML
//! The same structure:
//!
//! ```yaml
//! default:
//!   retry: { max_attempts: 3, delay: 100ms, jitter: full }
//! pipelines:
//!   payments:
//!     policies: [timeout, retry, circuit_breaker]
//!     timeout: 10s
//!     circuit_breaker:
//!       consecutive_failures: 5
//!       cooldown: 30s
//!     classifier: http
//! ```
//!
//! # Errors
//! Every error names the file (or `<string>`), the line and column, and the
//! field: a syntax error, an unknown field, a value of the wrong type or an
//! unparsable duration is a [`LoadError::Parse`]:
//!
//! ```text
//! seawall.toml:7:1: pipelines.payments.retry.max_attempt: unknown field `max_attempt`, expected one of ...
//! ```
//!
//! A file larger than 1 MiB is refused ([`LoadError::TooLarge`]) without
//! being read whole, and one whose collections nest more than 32 deep
//! ([`LoadError::TooDeep`], at the position where the limit is crossed) is
//! refused by a scan of its text before it is parsed, so that a bad file
//! (200 KB of `[[[[...` takes a YAML parser minutes) costs a millisecond.
//! The settings of a pipeline nest 5 deep at most.
//!
//! A value the pipeline builder refuses is a [`LoadError::Invalid`] with
//! the builder's own [`ConfigError`], located at the
//! offending key (in the pipeline's entry, or in `default` when inherited):
//!
//! ```text
//! seawall.toml:7:16: pipeline `payments`: retry.max_attempts must be >= 1, got 0
//! ```
//!
//! # Reloading
//! [`Registry::reload_file`] and [`Registry::reload_str`] replace every
//! pipeline at once, or none: a configuration that fails to load keeps the
//! old pipelines and returns the error. A configuration without any
//! pipeline (an empty or emptied file, one with only `default`) is such a
//! failure, [`LoadError::Empty`], on the first load as on a reload, unless
//! the registry was built with
//! [`allow_empty`](RegistryBuilder::allow_empty). New calls get the new settings
//! (re-[`get`](Registry::get) the pipeline, or hold a [`PipelineHandle`],
//! which always serves the latest); calls in flight finish on the pipeline
//! they started with. With the default [`MemoryStore`](crate::MemoryStore),
//! a reload that leaves a policy's settings unchanged keeps its state: an
//! open circuit stays open when only the retry changed. One that changes
//! the circuit breaker's settings starts closed circuits, and reports the
//! close of the pipeline's own (unpartitioned) circuit
//! ([`EventKind::CircuitClosed`](crate::EventKind::CircuitClosed), as
//! [`Pipeline::reset`](crate::Pipeline::reset) does) when the circuit it
//! replaces was in another state, so that the metrics' state gauge
//! follows. An adaptive limit, kept by the pipeline whatever the store,
//! goes on from the limit (and baseline) it found when its algorithm's
//! settings are unchanged: its `shadow`, queue and `partitions` may
//! change, so that a limit found in shadow mode is enforced as it stands.
//! One of other settings starts from its `initial_limit`, reported as a
//! change of the limit ([`EventKind::LimitChanged`](crate::EventKind::LimitChanged))
//! when that differs from the limit replaced. A coalescing cache starts
//! empty. A reload may name
//! other registered classifiers and fallbacks (or none): a pipeline looked
//! up with [`Registry::typed`] after it runs with them. With the feature
//! `watch`, `Registry::watch` polls the file and reloads it when it
//! changes.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use crate::error::{ConfigError, StoreError};
use crate::pipeline::PipelineBuilder;
use crate::store::{ResourceSpec, ResourceState, StateStore};
use crate::Pipeline;

mod error;
mod limits;
mod named;
mod policies;
mod raw;
mod registry;
mod source;

pub use error::{LoadError, Location, LookupError, UnknownPipeline};
#[cfg(feature = "watch")]
pub use registry::Watcher;
pub use registry::{PipelineHandle, Registry, RegistryBuilder};

use raw::Resolved;

/// The syntax of a configuration file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Format {
    /// TOML.
    Toml,
    /// YAML.
    Yaml,
}

impl Format {
    /// The format of a file by its extension: `.toml`, `.yaml` or `.yml`.
    ///
    /// ```
    /// use seawall::config::Format;
    /// assert_eq!(Format::from_path("conf/seawall.yml"), Some(Format::Yaml));
    /// assert_eq!(Format::from_path("seawall.ini"), None);
    /// ```
    pub fn from_path(path: impl AsRef<Path>) -> Option<Format> {
        let ext = path.as_ref().extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "toml" => Some(Format::Toml),
            "yaml" | "yml" => Some(Format::Yaml),
            _ => None,
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Toml => "TOML",
            Format::Yaml => "YAML",
        })
    }
}

/// A parsed and validated configuration: the settings of every named
/// pipeline, with `default` applied.
///
/// A [`Registry`] builds its pipelines from it; [`Config::builder`] hands out
/// a pipeline's builder, to which code-only parts (a classifier, a fallback)
/// can still be added.
///
/// ```
/// use seawall::config::{Config, Format};
///
/// let config = Config::parse(Format::Yaml, "
/// pipelines:
///   users:
///     retry: { delay: 50ms }
/// ")?;
/// assert_eq!(config.names().collect::<Vec<_>>(), ["users"]);
/// let users = config
///     .builder("users")
///     .expect("configured")
///     .classify(|_: &std::io::Error| seawall::Verdict::retry())
///     .build()?;
/// # let _ = users;
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Config {
    origin: Arc<str>,
    format: Format,
    text: Arc<str>,
    pipelines: BTreeMap<String, Resolved>,
}

impl Config {
    /// Parses and validates a configuration held in a string (reported as
    /// `<string>` in errors).
    ///
    /// # Errors
    /// A [`LoadError::Parse`] for bad syntax, unknown fields, wrong types
    /// and bad durations; a [`LoadError::Invalid`] for values the pipeline
    /// builder refuses.
    pub fn parse(format: Format, text: &str) -> Result<Config, LoadError> {
        Self::parse_from("<string>", format, text)
    }

    /// Reads, parses and validates a file; the format is chosen by its
    /// extension (`.toml`, `.yaml`, `.yml`).
    ///
    /// # Errors
    /// As for [`parse`](Self::parse), plus [`LoadError::Io`] and
    /// [`LoadError::UnknownFormat`].
    pub fn from_file(path: impl AsRef<Path>) -> Result<Config, LoadError> {
        let (format, text) = source::read(path.as_ref())?;
        Self::parse_from(&path.as_ref().display().to_string(), format, &text)
    }

    fn empty() -> Config {
        Config {
            origin: "<none>".into(),
            format: Format::Toml,
            text: "".into(),
            pipelines: BTreeMap::new(),
        }
    }

    pub(crate) fn parse_from(
        origin: &str,
        format: Format,
        text: &str,
    ) -> Result<Config, LoadError> {
        let raw = source::parse(origin, format, text)?;
        let mut config = Config {
            origin: origin.into(),
            format,
            text: text.into(),
            pipelines: BTreeMap::new(),
        };
        for (name, own) in raw.pipelines() {
            let resolved =
                Resolved::new(&own, raw.default.as_ref()).map_err(|e| config.invalid(name, e))?;
            config.pipelines.insert(name.to_owned(), resolved);
        }
        for (name, resolved) in &config.pipelines {
            // The policies written in code are checked by the registry
            // that knows them.
            validate(resolved.apply(Pipeline::builder(name.as_str()), None, None))
                .map_err(|e| config.invalid(name, e))?;
        }
        Ok(config)
    }

    /// The names of the configured pipelines, in sorted order.
    pub fn names(&self) -> impl Iterator<Item = &str> + '_ {
        self.pipelines.keys().map(String::as_str)
    }

    /// `true` when a pipeline of this name is configured.
    pub fn contains(&self, name: &str) -> bool {
        self.pipelines.contains_key(name)
    }

    /// The format the configuration was written in.
    pub fn format(&self) -> Format {
        self.format
    }

    /// A builder with the configured policies of pipeline `name`, in their
    /// configured order, on the default store and clock; `None` when no
    /// such pipeline is configured. A `classifier` or `fallback` the entry
    /// names is not applied (a [`Registry`] applies them): add them to the
    /// builder. An entry that lists a policy written in code gives a
    /// builder that refuses to build (`pipeline.policies`): only a registry
    /// that registers the policy can declare it at its place.
    pub fn builder(&self, name: &str) -> Option<PipelineBuilder> {
        let resolved = self.pipelines.get(name)?;
        Some(resolved.apply(Pipeline::builder(name), None, Some(&|_| None)))
    }

    pub(crate) fn resolved(&self) -> impl Iterator<Item = (&str, &Resolved)> + '_ {
        self.pipelines.iter().map(|(n, r)| (n.as_str(), r))
    }

    /// The refusal of this configuration for having no pipeline.
    pub(crate) fn empty_error(&self) -> LoadError {
        LoadError::Empty {
            location: Location::new(self.origin.to_string(), None),
        }
    }

    /// Wraps a builder's refusal of pipeline `name`, located at the key it
    /// names.
    pub(crate) fn invalid(&self, name: &str, error: ConfigError) -> LoadError {
        let overall_timeout_invalid = self
            .pipelines
            .get(name)
            .is_some_and(Resolved::overall_timeout_invalid);
        let position = source::locate_config_error(
            self.format,
            &self.text,
            name,
            &error,
            overall_timeout_invalid,
        );
        LoadError::Invalid {
            location: Location::new(self.origin.to_string(), position),
            pipeline: name.to_owned(),
            error,
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("origin", &self.origin)
            .field("format", &self.format)
            .field("pipelines", &self.pipelines)
            .finish()
    }
}

/// A store that refuses to bind: building with it runs every check of
/// `build()` without touching the real store.
#[derive(Debug)]
struct ValidationStore;

const VALIDATION_ONLY: &str = "validation only";

impl StateStore for ValidationStore {
    fn bind(&self, _spec: &ResourceSpec) -> Result<Arc<dyn ResourceState>, StoreError> {
        Err(StoreError::Refused(VALIDATION_ONLY.into()))
    }
}

/// Runs every check of `build()` on `builder` without binding its stateful
/// policies to a store.
pub(crate) fn validate(builder: PipelineBuilder) -> Result<(), ConfigError> {
    validate_by(builder, |b| b.build().map(drop))
}

/// Runs every check of `build`, which builds the pipeline of `builder`
/// (typed by the handlers named in code), without binding its stateful
/// policies to a store.
pub(crate) fn validate_by(
    builder: PipelineBuilder,
    build: impl FnOnce(PipelineBuilder) -> Result<(), ConfigError>,
) -> Result<(), ConfigError> {
    match build(builder.store(ValidationStore)) {
        Ok(()) => Ok(()),
        Err(e) if e.policy == "store" && e.rule.contains(VALIDATION_ONLY) => Ok(()),
        Err(e) => Err(e),
    }
}
