//! Adaptive concurrency limit: a cap on concurrent attempts that finds
//! itself from the latency and the errors it measures, as Netflix's
//! concurrency-limits and Envoy's adaptive concurrency filter do.
//!
//! ```
//! use std::time::Duration;
//! use seawall::{AdaptiveLimit, Pipeline, Retry};
//!
//! let pipeline = Pipeline::builder("search-doc")
//!     .retry(Retry::constant(Duration::from_millis(5)).max_attempts(2))
//!     .adaptive_limit(
//!         AdaptiveLimit::gradient2()
//!             .limits(10, 20, 400)
//!             .queue(100, Duration::from_millis(50))
//!             .partition("live", 0.9)
//!             .partition("batch", 0.1),
//!     )
//!     .build()?;
//! let n = pipeline.partition("live").call(|_ctx| Ok::<_, std::io::Error>(7))?;
//! assert_eq!(n, 7);
//! let now = pipeline.concurrency_limit().expect("an adaptive limit");
//! assert_eq!(now.in_flight, 0);
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```
//!
//! # Semantics
//! - The limit guards **each attempt** in this process: an attempt is
//!   admitted while fewer attempts than the limit are in flight and is
//!   refused with [`RejectionReason::ConcurrencyLimited`](crate::RejectionReason::ConcurrencyLimited)
//!   otherwise (async calls may wait in a bounded queue first, oldest
//!   first, as for the [`Bulkhead`](crate::Bulkhead): see
//!   [`AdaptiveLimit::queue`]). It is declared after the retry, or in
//!   a pipeline without one; declared before it, `build()` refuses it. It
//!   is admitted before the stateful policies of the store (circuit
//!   breaker, bulkhead, cooldown, rate limiter); a refusal by one of them
//!   gives the slot back without a sample.
//! - When an attempt ends, its latency (from its admission) is a
//!   **sample**: a success, or an error judged [`Abort`](crate::VerdictKind::Abort)
//!   (the dependency answered), is its latency; a timeout, or an error
//!   judged a failure ([`Retry`](crate::VerdictKind::Retry),
//!   [`Failure`](crate::VerdictKind::Failure)) or
//!   [`Throttled`](crate::VerdictKind::Throttled), is a **drop**, the sign
//!   of overload; an error judged [`Ignore`](crate::VerdictKind::Ignore)
//!   and an attempt dropped by its caller give the slot back without a
//!   sample.
//! - Samples are gathered for `update_interval` (100 ms by default, Envoy's
//!   `concurrency_update_interval`, Netflix's windowed limit); then the
//!   algorithm turns them, as one sample (their mean latency, the most
//!   attempts in flight, a drop if any dropped), into a new limit between
//!   `min_limit` and `max_limit`:
//!   - [`aimd`](AdaptiveLimit::aimd): a drop or a latency above
//!     `rtt_timeout` multiplies the limit by `backoff_ratio`; a success
//!     while at least half the limit is in use adds one. It needs to be
//!     told what latency is too slow.
//!   - [`vegas`](AdaptiveLimit::vegas): estimates the calls queued at the
//!     dependency as `limit x (1 - baseline / latency)` and keeps that
//!     queue between `log10(limit)` and `3 log10(limit)` (at least 1 and
//!     3).
//!   - [`gradient2`](AdaptiveLimit::gradient2): scales the limit by the
//!     gradient `baseline x (1 + buffer) / latency`, clamped to
//!     `[0.5, 1]`, adds `queue_size` as headroom while the gradient is 1
//!     (the latency within the buffer), and smooths the result.
//!
//!   Vegas and Gradient2 compare each latency with a **baseline**, the
//!   latency without load, measured as Envoy does: the limit is pinned to
//!   `min_rtt_concurrency` (or `max_limit` when that is lower: the limit
//!   never exceeds `max_limit`, measuring included) until
//!   `min_rtt_samples` attempts admitted at that concurrency ended (their
//!   mean latency is the baseline), then measured again every
//!   `min_rtt_interval` plus up to `min_rtt_jitter` of it at random; a
//!   limit starts by measuring it. As in Envoy, a limit left at
//!   `min_limit` by 5 update windows in a row measures its baseline again
//!   at once: a baseline lower than the dependency's
//!   latency without load (measured while it was unusually fast, or before
//!   it became slower for good) makes every latency look queued and holds
//!   the limit at its minimum, which would otherwise last until the next
//!   `min_rtt_interval`. A window with fewer than half the limit in flight
//!   and no drop says nothing of the limit: it leaves the limit as it is
//!   (Netflix's "app limited") and does not count, so a light load that
//!   never moves the limit from `min_limit` (Gradient2's default
//!   `min_limit` is its initial limit) never measures its baseline again
//!   before `min_rtt_interval`. A dependency that cannot serve `min_limit`
//!   calls at once then has its baseline measured every 5 windows: set
//!   `min_limit` below its capacity.
//! - **Partitions** split the limit by shares that add up to 1 (`live`
//!   0.9, `batch` 0.1): below the limit any call is admitted; at the limit
//!   a call is still admitted while its partition has fewer than
//!   `ceil(limit x share)` in flight, so `live` always keeps nine tenths
//!   however much `batch` borrowed. A call's partition is its partition
//!   key ([`Pipeline::partition`](crate::Pipeline::partition)); a call
//!   with no key, or one that names no share, uses only what the limit
//!   leaves. The limit is one for the whole pipeline: partition keys
//!   choose a share, they do not get a limit each.
//! - Each change of the limit is an [`EventKind::LimitChanged`](crate::EventKind::LimitChanged)
//!   event, each refusal a `Rejected` event (reason `concurrency_limited`),
//!   each wait a `Deferred` one; with the `metrics` feature the limit is the
//!   gauge `resilience.seawall.concurrency.limit`.
//!
//! # Per process
//! The limit lives in memory, in this process, whatever store the pipeline
//! uses: each process finds its own limit from its own latencies, as
//! Netflix's and Envoy's limiters do. It is not shared through Redis.
//!
//! # Defaults
//! Netflix's, and Envoy's for the baseline:
//!
//! | | AIMD | Vegas | Gradient2 |
//! | --- | --- | --- | --- |
//! | `update_interval` | 100 ms | 100 ms | 100 ms |
//! | `initial_limit` | 20 | 20 | 20 |
//! | `min_limit` | 20 | 1 | 20 |
//! | `max_limit` | 200 | 1000 | 200 |
//! | `backoff_ratio` | 0.9 | | |
//! | `rtt_timeout` | 5 s | | |
//! | `smoothing` | | 1.0 | 0.2 |
//! | `queue_size` | | | 4 |
//! | `buffer` | | | 0.1 |
//! | `min_rtt_interval` | | 60 s | 60 s |
//! | `min_rtt_samples` | | 50 | 50 |
//! | `min_rtt_concurrency` | | 3 | 3 |
//! | `min_rtt_jitter` | | 0.1 | 0.1 |
//!
//! No queue (refused at once when full), no partitions. Four departures
//! from the sources, all for a limit that settles within 20 % of the
//! capacity of the dependency, from a capacity of about 20 calls up:
//! - Gradient2's baseline is Envoy's pinned measurement rather than
//!   Netflix's long average of the latency (which rises with the load it
//!   should detect), with a buffer of 10 % rather than a tolerance of 50 %.
//! - Gradient2 adds its headroom (`queue_size`) only while the latency is
//!   within the buffer. Netflix and Envoy add it on every update, so the
//!   limit settles where `limit x gradient + queue_size = limit`, that is
//!   at `(1 + buffer) x capacity + queue_size` calls: 23 % over a capacity
//!   of 30, 30 % over 20 (and Envoy's `sqrt(limit)` headroom is larger
//!   still). Added only while the dependency shows no queue, the headroom
//!   still makes the limit climb as fast (`smoothing x queue_size` per
//!   update), and it stops where the latency leaves the buffer: about
//!   `(1 + buffer) x capacity + 1` calls, 15 % over 20, 11 % over 150.
//! - Vegas keeps a queue of `log10(limit)` to `3 log10(limit)` calls (TCP
//!   Vegas's original `alpha = 1`, `beta = 3`, scaled as Netflix scales
//!   them) rather than Netflix's `3 log10(limit)` to `6 log10(limit)`: 3 to
//!   6 calls queued below a limit of 100 put the limit 30 % over a capacity
//!   of 20; 1 to 3 put it 11 % over.
//! - Vegas's baseline is measured as Gradient2's rather than taken from
//!   the next sample every `30 x limit` samples (which under steady load
//!   takes a queued latency for the baseline and lets the limit creep up).
//!
//! Settled limits against a simulated dependency (`tests/adaptive_sim.rs`,
//! update window of one round trip): Gradient2 23.1, 34.0, 66.7, 166.4 and
//! Vegas 22.2, 32.2, 62.2, 153.3 for capacities of 20, 30, 60 and 150.
//!
//! # Errors at `build()`
//! A [`ConfigError`] naming `adaptive_limit`, the field and the rule: a
//! limit of 0, `min_limit > max_limit`, an `initial_limit` outside
//! `[min_limit, max_limit]`, a zero `update_interval`, a `backoff_ratio` outside `[0.5, 1)`, a
//! `smoothing` outside `(0, 1]`, a negative `buffer`, a jitter outside
//! `[0, 1]`, a zero `rtt_timeout`, `min_rtt_interval`, `min_rtt_samples`
//! or `min_rtt_concurrency`, a queue without a wait, partition shares
//! outside `(0, 1]`, named twice or that do not add up to 1, and a setting
//! of another algorithm (`backoff_ratio` on a Vegas limit).

use std::time::Duration;

use crate::error::ConfigError;

pub(crate) mod machine;
pub(crate) mod rules;

/// The policy's name, as the builder, the configuration and the attribute
/// spell it.
pub(crate) const NAME: &str = "adaptive_limit";

/// The algorithm of an [`AdaptiveLimit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LimitAlgorithm {
    /// Additive increase, multiplicative decrease.
    Aimd,
    /// TCP Vegas: the estimated queue at the dependency.
    Vegas,
    /// The gradient of the latency against its baseline.
    Gradient2,
}

/// The settings of one algorithm or some, and the algorithms each applies
/// to; every other setting applies to all.
const ALGORITHM_SETTINGS: [(&str, &[LimitAlgorithm]); 9] = {
    use LimitAlgorithm::{Aimd, Gradient2, Vegas};
    [
        ("backoff_ratio", &[Aimd]),
        ("rtt_timeout", &[Aimd]),
        ("smoothing", &[Vegas, Gradient2]),
        ("queue_size", &[Gradient2]),
        ("buffer", &[Gradient2]),
        ("min_rtt_interval", &[Vegas, Gradient2]),
        ("min_rtt_samples", &[Vegas, Gradient2]),
        ("min_rtt_concurrency", &[Vegas, Gradient2]),
        ("min_rtt_jitter", &[Vegas, Gradient2]),
    ]
};

impl LimitAlgorithm {
    /// The algorithms `setting` (a field of [`AdaptiveLimit`], as named in
    /// configuration files) applies to: `None` when it applies to all.
    pub(crate) fn takers(setting: &str) -> Option<&'static [LimitAlgorithm]> {
        ALGORITHM_SETTINGS
            .iter()
            .find(|(name, _)| *name == setting)
            .map(|(_, to)| *to)
    }

    /// `setting` applies to this algorithm.
    pub(crate) fn takes(self, setting: &str) -> bool {
        Self::takers(setting).is_none_or(|to| to.contains(&self))
    }

    /// Its name in configuration files: `aimd`, `vegas`, `gradient2`.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitAlgorithm::Aimd => "aimd",
            LimitAlgorithm::Vegas => "vegas",
            LimitAlgorithm::Gradient2 => "gradient2",
        }
    }
}

/// Configuration of an adaptive concurrency limit (see the [module
/// docs](self)).
///
/// # Default
/// See [Defaults](self#defaults): each constructor takes its algorithm's.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AdaptiveLimit {
    /// The algorithm.
    pub algorithm: LimitAlgorithm,
    /// The limit at the start.
    pub initial_limit: u32,
    /// The lowest limit.
    pub min_limit: u32,
    /// The highest limit.
    pub max_limit: u32,
    /// How long samples are gathered before the limit is updated once.
    pub update_interval: Duration,
    /// AIMD: the factor of a decrease (`None`: 0.9).
    pub backoff_ratio: Option<f64>,
    /// AIMD: a latency above it counts as a drop (`None`: 5 s).
    pub rtt_timeout: Option<Duration>,
    /// Vegas and Gradient2: the weight of a new limit against the old
    /// (`None`: 1.0 for Vegas, 0.2 for Gradient2).
    pub smoothing: Option<f64>,
    /// Gradient2: calls added to the limit as headroom (`None`: 4).
    pub queue_size: Option<u32>,
    /// Gradient2: the share by which a latency may exceed the baseline
    /// before the limit shrinks (`None`: 0.1).
    pub buffer: Option<f64>,
    /// Vegas and Gradient2: time between measurements of the baseline
    /// (`None`: 60 s).
    pub min_rtt_interval: Option<Duration>,
    /// Vegas and Gradient2: samples that make a baseline (`None`: 50).
    pub min_rtt_samples: Option<u32>,
    /// Vegas and Gradient2: the limit while the baseline is measured
    /// (`None`: 3).
    pub min_rtt_concurrency: Option<u32>,
    /// Vegas and Gradient2: the share of `min_rtt_interval` added at
    /// random to it (`None`: 0.1).
    pub min_rtt_jitter: Option<f64>,
    /// Async calls allowed to wait for a slot at the same time, first in,
    /// first out (see [`queue`](Self::queue)).
    pub max_queued: u32,
    /// How long a queued call waits at most, from when it joins the queue.
    pub max_wait: Duration,
    /// The partitions and their shares of the limit, in declaration order.
    pub partitions: Vec<(String, f64)>,
    /// Shadow mode: the limit adapts and reports the attempts it would
    /// refuse, but never refuses nor queues one (see [`shadow`](Self::shadow)).
    pub shadow: bool,
}

impl AdaptiveLimit {
    fn new(algorithm: LimitAlgorithm, min_limit: u32, max_limit: u32) -> Self {
        AdaptiveLimit {
            algorithm,
            initial_limit: 20,
            min_limit,
            max_limit,
            update_interval: Duration::from_millis(100),
            backoff_ratio: None,
            rtt_timeout: None,
            smoothing: None,
            queue_size: None,
            buffer: None,
            min_rtt_interval: None,
            min_rtt_samples: None,
            min_rtt_concurrency: None,
            min_rtt_jitter: None,
            max_queued: 0,
            max_wait: Duration::ZERO,
            partitions: Vec::new(),
            shadow: false,
        }
    }

    /// AIMD: limits 20 (min, initial) to 200, backoff ratio 0.9, latency
    /// timeout 5 s.
    pub fn aimd() -> Self {
        Self::new(LimitAlgorithm::Aimd, 20, 200)
    }

    /// Vegas: limits 1 to 1000, initial 20, smoothing 1.0; the baseline
    /// measured at 3 calls over 50 samples every 60 s (+10 % jitter).
    pub fn vegas() -> Self {
        Self::new(LimitAlgorithm::Vegas, 1, 1000)
    }

    /// Gradient2: limits 20 (min, initial) to 200, smoothing 0.2, queue
    /// size 4, buffer 0.1; the baseline measured at 3 calls over 50
    /// samples every 60 s (+10 % jitter).
    pub fn gradient2() -> Self {
        Self::new(LimitAlgorithm::Gradient2, 20, 200)
    }

    /// The lowest, initial and highest limits.
    pub fn limits(mut self, min: u32, initial: u32, max: u32) -> Self {
        self.min_limit = min;
        self.initial_limit = initial;
        self.max_limit = max;
        self
    }

    /// The limit at the start.
    pub fn initial_limit(mut self, n: u32) -> Self {
        self.initial_limit = n;
        self
    }

    /// The lowest limit.
    pub fn min_limit(mut self, n: u32) -> Self {
        self.min_limit = n;
        self
    }

    /// The highest limit.
    pub fn max_limit(mut self, n: u32) -> Self {
        self.max_limit = n;
        self
    }

    /// How long samples are gathered before the limit is updated once
    /// (on their mean latency, the most calls in flight, a drop if any).
    pub fn update_interval(mut self, interval: Duration) -> Self {
        self.update_interval = interval;
        self
    }

    /// AIMD: the factor of a decrease, in `[0.5, 1)`.
    pub fn backoff_ratio(mut self, ratio: f64) -> Self {
        self.backoff_ratio = Some(ratio);
        self
    }

    /// AIMD: a latency above `timeout` counts as a drop.
    pub fn rtt_timeout(mut self, timeout: Duration) -> Self {
        self.rtt_timeout = Some(timeout);
        self
    }

    /// Vegas and Gradient2: the weight of a new limit, in `(0, 1]`.
    pub fn smoothing(mut self, smoothing: f64) -> Self {
        self.smoothing = Some(smoothing);
        self
    }

    /// Gradient2: calls added to the limit as headroom.
    pub fn queue_size(mut self, n: u32) -> Self {
        self.queue_size = Some(n);
        self
    }

    /// Gradient2: the share by which a latency may exceed the baseline
    /// before the limit shrinks (0.1: 10 %).
    pub fn buffer(mut self, buffer: f64) -> Self {
        self.buffer = Some(buffer);
        self
    }

    /// Vegas and Gradient2: measure the baseline every `interval` (plus
    /// the jitter), over `samples` attempts admitted at `concurrency` (at
    /// most `max_limit`).
    pub fn min_rtt(mut self, interval: Duration, samples: u32, concurrency: u32) -> Self {
        self.min_rtt_interval = Some(interval);
        self.min_rtt_samples = Some(samples);
        self.min_rtt_concurrency = Some(concurrency);
        self
    }

    /// Vegas and Gradient2: the share of the interval added at random
    /// before each measurement, in `[0, 1]`.
    pub fn min_rtt_jitter(mut self, jitter: f64) -> Self {
        self.min_rtt_jitter = Some(jitter);
        self
    }

    /// Lets up to `max_queued` async calls wait at most `max_wait` for a
    /// slot, counted from when a call joins the queue (time it spent
    /// waiting for other policies, a cooldown or a rate limit, does not
    /// count) and never past the call's deadline; a slot given back at the
    /// very instant the wait runs out (its `max_wait` or the deadline) is
    /// still the waiter's. A call whose wait runs out without a slot is
    /// refused (`concurrency_limited`), whichever ran out: a timeout of the whole
    /// call declared before this policy bounds the wait, and the call then
    /// ends with the refusal, not with `Error::Timeout` (the operation did
    /// not run). Sync calls never wait: they are refused at once.
    ///
    /// The queue is first in, first out, in this process: each partition
    /// share has one, and calls of no share one more. A slot given back
    /// (or a higher limit) is handed to the oldest waiter at once, and a
    /// call does not take a slot while older calls wait in its queue: it
    /// queues behind them, or is refused when the queue is full or it may
    /// not wait. A slot given back by a partition whose queue is empty
    /// goes to the oldest waiter of another (below the limit a slot is
    /// anyone's). A waiter dropped, or whose wait or deadline runs out,
    /// leaves its place and passes a slot handed to it on to the next.
    /// `max_queued` 0 is no queue whatever `max_wait` says.
    pub fn queue(mut self, max_queued: u32, max_wait: Duration) -> Self {
        self.max_queued = max_queued;
        self.max_wait = max_wait;
        self
    }

    /// A partition named `name` keeps `share` of the limit (the shares add
    /// up to 1).
    pub fn partition(mut self, name: impl Into<String>, share: f64) -> Self {
        self.partitions.push((name.into(), share));
        self
    }

    /// Shadow mode ([`crate::shadow`]): an attempt over the limit is not
    /// refused nor queued; it runs at once, without a slot and without
    /// giving a sample (the limit measures the attempts it admits, as an
    /// enforcing limit would), and a
    /// [`ShadowRejected`](crate::EventKind::ShadowRejected) event with
    /// [`ConcurrencyLimited`](crate::RejectionReason::ConcurrencyLimited)
    /// reports it. [`concurrency_limit`](crate::Pipeline::concurrency_limit)
    /// shows the limit it finds; mind that the dependency then serves every
    /// attempt, so the latencies it measures are those of the load it
    /// really sees, not of the load an enforcing limit would let through.
    ///
    /// ```
    /// use seawall::{AdaptiveLimit, Pipeline};
    ///
    /// let pipeline = Pipeline::builder("rollout")
    ///     .adaptive_limit(AdaptiveLimit::aimd().limits(1, 1, 10).shadow(true))
    ///     .build()?;
    /// // One attempt in flight, a second one nested in it: over the limit
    /// // of 1, it runs anyway.
    /// let n = pipeline.call(|_| pipeline.call(|_| Ok::<_, std::io::Error>(2)))?;
    /// assert_eq!(n, 2);
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// The settings the rules read, with each algorithm's defaults.
    pub(crate) fn spec(&self) -> rules::Spec {
        let baseline = rules::Measure {
            concurrency: self.min_rtt_concurrency.unwrap_or(3),
            samples: self.min_rtt_samples.unwrap_or(50),
            interval: rules::nanos(self.min_rtt_interval.unwrap_or(Duration::from_secs(60))),
            jitter: self.min_rtt_jitter.unwrap_or(0.1),
        };
        let algorithm = match self.algorithm {
            LimitAlgorithm::Aimd => rules::Algorithm::Aimd {
                backoff_ratio: self.backoff_ratio.unwrap_or(0.9),
                rtt_timeout: rules::nanos(self.rtt_timeout.unwrap_or(Duration::from_secs(5))),
            },
            LimitAlgorithm::Vegas => rules::Algorithm::Vegas {
                smoothing: self.smoothing.unwrap_or(1.0),
                baseline,
            },
            LimitAlgorithm::Gradient2 => rules::Algorithm::Gradient2 {
                smoothing: self.smoothing.unwrap_or(0.2),
                queue_size: self.queue_size.unwrap_or(4),
                buffer: self.buffer.unwrap_or(0.1),
                baseline,
            },
        };
        rules::Spec {
            algorithm,
            update_interval: rules::nanos(self.update_interval),
            min_limit: self.min_limit,
            max_limit: self.max_limit,
            initial_limit: self.initial_limit,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        const P: &str = NAME;
        let err = |field, rule: String| Err(ConfigError::new(P, field, rule));
        if self.min_limit == 0 {
            return err("min_limit", "must be >= 1, got 0".into());
        }
        if self.max_limit < self.min_limit {
            return err(
                "max_limit",
                format!(
                    "must be >= min_limit ({}), got {}",
                    self.min_limit, self.max_limit
                ),
            );
        }
        if !(self.min_limit..=self.max_limit).contains(&self.initial_limit) {
            return err(
                "initial_limit",
                format!(
                    "must be within [min_limit, max_limit] = [{}, {}], got {}",
                    self.min_limit, self.max_limit, self.initial_limit
                ),
            );
        }
        if self.update_interval.is_zero() {
            return err("update_interval", "must be > 0".into());
        }
        // A setting of another algorithm is a mistake, never ignored.
        let applies = |field: &'static str, set: bool| {
            if set && !self.algorithm.takes(field) {
                let to = LimitAlgorithm::takers(field).unwrap_or_default();
                let names: Vec<_> = to.iter().map(|a| a.as_str()).collect();
                return err(
                    field,
                    format!(
                        "applies only to {}, not {}",
                        names.join(" and "),
                        self.algorithm.as_str()
                    ),
                );
            }
            Ok(())
        };
        let set = [
            ("backoff_ratio", self.backoff_ratio.is_some()),
            ("rtt_timeout", self.rtt_timeout.is_some()),
            ("smoothing", self.smoothing.is_some()),
            ("queue_size", self.queue_size.is_some()),
            ("buffer", self.buffer.is_some()),
            ("min_rtt_interval", self.min_rtt_interval.is_some()),
            ("min_rtt_samples", self.min_rtt_samples.is_some()),
            ("min_rtt_concurrency", self.min_rtt_concurrency.is_some()),
            ("min_rtt_jitter", self.min_rtt_jitter.is_some()),
        ];
        for (field, set) in set {
            applies(field, set)?;
        }
        if let Some(r) = self.backoff_ratio {
            if !(0.5..1.0).contains(&r) {
                return err("backoff_ratio", format!("must be in [0.5, 1), got {r}"));
            }
        }
        if self.rtt_timeout.is_some_and(|t| t.is_zero()) {
            return err("rtt_timeout", "must be > 0".into());
        }
        if let Some(s) = self.smoothing {
            if !(s > 0.0 && s <= 1.0) {
                return err("smoothing", format!("must be in (0, 1], got {s}"));
            }
        }
        if let Some(b) = self.buffer {
            if !(b.is_finite() && b >= 0.0) {
                return err("buffer", format!("must be a number >= 0, got {b}"));
            }
        }
        if self.min_rtt_interval.is_some_and(|t| t.is_zero()) {
            return err("min_rtt_interval", "must be > 0".into());
        }
        if self.min_rtt_samples == Some(0) {
            return err("min_rtt_samples", "must be >= 1, got 0".into());
        }
        if self.min_rtt_concurrency == Some(0) {
            return err("min_rtt_concurrency", "must be >= 1, got 0".into());
        }
        if let Some(j) = self.min_rtt_jitter {
            if !(0.0..=1.0).contains(&j) {
                return err("min_rtt_jitter", format!("must be in [0, 1], got {j}"));
            }
        }
        if self.max_queued > 0 && self.max_wait.is_zero() {
            return err(
                "max_wait",
                format!("must be > 0 when max_queued is {}", self.max_queued),
            );
        }
        self.validate_partitions()
    }

    fn validate_partitions(&self) -> Result<(), ConfigError> {
        let err = |rule: String| Err(ConfigError::new(NAME, "partitions", rule));
        if self.partitions.is_empty() {
            return Ok(());
        }
        let mut total = 0.0;
        for (i, (name, share)) in self.partitions.iter().enumerate() {
            if name.is_empty() {
                return err("must have names, got an empty one".into());
            }
            if self.partitions[..i].iter().any(|(n, _)| n == name) {
                return err(format!("must name each partition once, got `{name}` twice"));
            }
            if !(*share > 0.0 && *share <= 1.0) {
                return err(format!(
                    "must have shares in (0, 1], got {share} for `{name}`"
                ));
            }
            total += share;
        }
        if (total - 1.0f64).abs() > 1e-9 {
            return err(format!("must have shares that add up to 1, got {total}"));
        }
        Ok(())
    }
}

/// An adaptive limit as it stands; see
/// [`Pipeline::concurrency_limit`](crate::Pipeline::concurrency_limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimitSnapshot {
    /// The estimated limit.
    pub limit: u32,
    /// The limit attempts are admitted against now: the estimated one, or
    /// the pinned concurrency while the baseline is measured.
    pub admitted: u32,
    /// Attempts in flight.
    pub in_flight: u32,
    /// The baseline latency, once measured (Vegas, Gradient2).
    pub baseline: Option<Duration>,
    /// The baseline is being measured.
    pub measuring: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(l: AdaptiveLimit) -> String {
        let e = l.validate().unwrap_err();
        assert_eq!(e.policy, "adaptive_limit");
        e.to_string()
    }

    #[test]
    fn bad_settings_name_the_field_and_the_rule() {
        assert_eq!(
            rule(AdaptiveLimit::aimd().limits(0, 0, 10)),
            "adaptive_limit.min_limit must be >= 1, got 0"
        );
        assert_eq!(
            rule(AdaptiveLimit::aimd().limits(10, 10, 5)),
            "adaptive_limit.max_limit must be >= min_limit (10), got 5"
        );
        assert_eq!(
            rule(AdaptiveLimit::gradient2().limits(10, 50, 40)),
            "adaptive_limit.initial_limit must be within [min_limit, max_limit] = [10, 40], got 50"
        );
        assert_eq!(
            rule(AdaptiveLimit::aimd().backoff_ratio(1.0)),
            "adaptive_limit.backoff_ratio must be in [0.5, 1), got 1"
        );
        assert_eq!(
            rule(AdaptiveLimit::vegas().backoff_ratio(0.9)),
            "adaptive_limit.backoff_ratio applies only to aimd, not vegas"
        );
        assert_eq!(
            rule(AdaptiveLimit::gradient2().smoothing(0.0)),
            "adaptive_limit.smoothing must be in (0, 1], got 0"
        );
        assert_eq!(
            rule(AdaptiveLimit::gradient2().smoothing(f64::NAN)),
            "adaptive_limit.smoothing must be in (0, 1], got NaN"
        );
        assert_eq!(
            rule(AdaptiveLimit::gradient2().buffer(-0.1)),
            "adaptive_limit.buffer must be a number >= 0, got -0.1"
        );
        assert_eq!(
            rule(AdaptiveLimit::aimd().min_rtt_jitter(0.1)),
            "adaptive_limit.min_rtt_jitter applies only to vegas and gradient2, not aimd"
        );
        assert_eq!(
            rule(AdaptiveLimit::vegas().min_rtt(Duration::from_secs(1), 0, 3)),
            "adaptive_limit.min_rtt_samples must be >= 1, got 0"
        );
        assert_eq!(
            rule(AdaptiveLimit::aimd().queue(5, Duration::ZERO)),
            "adaptive_limit.max_wait must be > 0 when max_queued is 5"
        );
        assert_eq!(
            rule(
                AdaptiveLimit::aimd()
                    .partition("live", 0.9)
                    .partition("batch", 0.2)
            ),
            "adaptive_limit.partitions must have shares that add up to 1, got 1.1"
        );
        assert_eq!(
            rule(
                AdaptiveLimit::aimd()
                    .partition("live", 0.5)
                    .partition("live", 0.5)
            ),
            "adaptive_limit.partitions must name each partition once, got `live` twice"
        );
        assert_eq!(
            rule(AdaptiveLimit::aimd().partition("live", 1.5)),
            "adaptive_limit.partitions must have shares in (0, 1], got 1.5 for `live`"
        );
        for ok in [
            AdaptiveLimit::aimd(),
            AdaptiveLimit::vegas(),
            AdaptiveLimit::gradient2()
                .partition("live", 0.9)
                .partition("batch", 0.1),
            AdaptiveLimit::gradient2()
                .partition("a", 0.7)
                .partition("b", 0.2)
                .partition("c", 0.1),
        ] {
            ok.validate().unwrap();
        }
    }
}
