//! The file's structure as serde reads it (every field optional, so that
//! `default` can fill the gaps), and its resolution into policy values built
//! through their public constructors.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use seawall_order::{check, scope, Misplaced, PolicyKind, Rule, Scope};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use crate::breaker::CircuitBreaker;
use crate::bulkhead::Bulkhead;
use crate::cooldown::Cooldown;
use crate::error::ConfigError;
use crate::pipeline::PipelineBuilder;
use crate::rate_limit::RateLimiter;
use crate::retry::{Jitter, Retry, RetryBudget};
use crate::timeout::Timeout;

/// A whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFile {
    #[serde(default)]
    pub(crate) default: Option<RawPipeline>,
    // `Option`s so that an empty YAML key (`pipelines:`, `users:`) reads
    // as nothing configured rather than as a type error.
    #[serde(default)]
    pipelines: Option<BTreeMap<String, Option<RawPipeline>>>,
}

impl RawFile {
    /// Every pipeline entry, an empty one as the default entry.
    pub(crate) fn pipelines(&self) -> impl Iterator<Item = (&str, RawPipeline)> + '_ {
        self.pipelines
            .iter()
            .flatten()
            .map(|(name, p)| (name.as_str(), p.clone().unwrap_or_default()))
    }
}

/// One pipeline entry (or `default`).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPipeline {
    policies: Option<Vec<PolicyName>>,
    timeout: Option<RawTimeout>,
    attempt_timeout: Option<RawTimeout>,
    retry: Option<RawRetry>,
    circuit_breaker: Option<RawBreaker>,
    bulkhead: Option<RawBulkhead>,
    cooldown: Option<RawCooldown>,
    rate_limiter: Option<RawRateLimiter>,
    partition_idle: Option<Dur>,
}

/// A policy, as named in `policies`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum PolicyName {
    Timeout,
    Retry,
    AttemptTimeout,
    CircuitBreaker,
    Bulkhead,
    Cooldown,
    RateLimiter,
}

impl PolicyName {
    /// Every policy, in the order used when `policies` is not given.
    const CANONICAL: [PolicyName; 7] = [
        PolicyName::Timeout,
        PolicyName::Retry,
        PolicyName::AttemptTimeout,
        PolicyName::CircuitBreaker,
        PolicyName::Bulkhead,
        PolicyName::Cooldown,
        PolicyName::RateLimiter,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            PolicyName::AttemptTimeout => "attempt_timeout",
            p => p.kind().name(),
        }
    }

    /// The policy declared on the builder. `timeout` and `attempt_timeout`
    /// are both timeouts: their position tells the builder what they bound,
    /// and [`order`] checks that it agrees with the name.
    fn kind(self) -> PolicyKind {
        match self {
            PolicyName::Timeout | PolicyName::AttemptTimeout => PolicyKind::Timeout,
            PolicyName::Retry => PolicyKind::Retry,
            PolicyName::CircuitBreaker => PolicyKind::CircuitBreaker,
            PolicyName::Bulkhead => PolicyKind::Bulkhead,
            PolicyName::Cooldown => PolicyKind::Cooldown,
            PolicyName::RateLimiter => PolicyKind::RateLimiter,
        }
    }

    fn configured(self, p: &RawPipeline) -> bool {
        match self {
            PolicyName::Timeout => p.timeout.is_some(),
            PolicyName::Retry => p.retry.is_some(),
            PolicyName::AttemptTimeout => p.attempt_timeout.is_some(),
            PolicyName::CircuitBreaker => p.circuit_breaker.is_some(),
            PolicyName::Bulkhead => p.bulkhead.is_some(),
            PolicyName::Cooldown => p.cooldown.is_some(),
            PolicyName::RateLimiter => p.rate_limiter.is_some(),
        }
    }
}

/// A duration written as a string: `"200ms"`, `"30s"`, `"1m"`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Dur(pub(crate) Duration);

/// Parses a human-readable duration.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| {
        format!("invalid duration `{s}`: {e}; expected e.g. \"200ms\", \"30s\" or \"1m\"")
    })
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string such as \"200ms\", \"30s\" or \"1m\"")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Dur, E> {
                parse_duration(s).map(Dur).map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

/// Parses a jitter: `none`, `full`, `equal` or a percentage `20%`.
pub(crate) fn parse_jitter(s: &str) -> Result<Jitter, String> {
    let t = s.trim();
    match t {
        "none" => Ok(Jitter::None),
        "full" => Ok(Jitter::Full),
        "equal" => Ok(Jitter::Equal),
        _ => t
            .strip_suffix('%')
            .and_then(|p| p.trim().parse::<f64>().ok())
            .map(Jitter::Proportional)
            .ok_or_else(|| {
                format!(
                    "invalid jitter `{s}`: expected \"none\", \"full\", \"equal\" or a percentage such as \"20%\""
                )
            }),
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct JitterValue(Jitter);

impl<'de> Deserialize<'de> for JitterValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = JitterValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"none\", \"full\", \"equal\" or a percentage such as \"20%\"")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<JitterValue, E> {
                parse_jitter(s).map(JitterValue).map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

/// A timeout: `"5s"` or `{ duration = "5s", strict = true }`.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct RawTimeout {
    duration: Option<Dur>,
    strict: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TimeoutTable {
    duration: Option<Dur>,
    strict: Option<bool>,
}

impl<'de> Deserialize<'de> for RawTimeout {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawTimeout;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a duration string such as \"5s\", or a table with `duration` and `strict`",
                )
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<RawTimeout, E> {
                let d = parse_duration(s).map_err(E::custom)?;
                Ok(RawTimeout {
                    duration: Some(Dur(d)),
                    strict: None,
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawTimeout, A::Error> {
                let t = TimeoutTable::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(RawTimeout {
                    duration: t.duration,
                    strict: t.strict,
                })
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum BackoffKind {
    Constant,
    Linear,
    Exponential,
    Decorrelated,
}

impl BackoffKind {
    fn as_str(self) -> &'static str {
        match self {
            BackoffKind::Constant => "constant",
            BackoffKind::Linear => "linear",
            BackoffKind::Exponential => "exponential",
            BackoffKind::Decorrelated => "decorrelated",
        }
    }
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetry {
    max_attempts: Option<u32>,
    backoff: Option<BackoffKind>,
    delay: Option<Dur>,
    multiplier: Option<f64>,
    cap: Option<Dur>,
    jitter: Option<JitterValue>,
    budget: Option<RawBudget>,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBudget {
    ratio: Option<f64>,
    max_tokens: Option<u32>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBreaker {
    consecutive_failures: Option<u32>,
    count_window: Option<u32>,
    window: Option<Dur>,
    failure_rate: Option<f64>,
    minimum_calls: Option<u32>,
    slow_call_rate: Option<f64>,
    slow_call_duration: Option<Dur>,
    cooldown: Option<Dur>,
    cooldown_growth: Option<f64>,
    max_cooldown: Option<Dur>,
    half_open_calls: Option<u32>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBulkhead {
    max_concurrent: Option<u32>,
    max_queued: Option<u32>,
    max_wait: Option<Dur>,
    lease: Option<Dur>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCooldown {
    max_pause: Option<Dur>,
    max_wait: Option<Dur>,
    grace: Option<Dur>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Algorithm {
    Gcra,
    FixedWindow,
    SlidingWindow,
}

impl Algorithm {
    fn as_str(self) -> &'static str {
        match self {
            Algorithm::Gcra => "gcra",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
        }
    }
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimiter {
    algorithm: Option<Algorithm>,
    limit: Option<u32>,
    period: Option<Dur>,
    burst: Option<u32>,
    max_wait: Option<Dur>,
}

// ---------------------------------------------------------------- resolution

/// A pipeline's own section and the one of `default`, looked at together.
#[derive(Clone, Copy)]
struct Layers<'a, T> {
    own: Option<&'a T>,
    base: Option<&'a T>,
}

impl<'a, T> Layers<'a, T> {
    fn of(own: Option<&'a T>, base: Option<&'a T>) -> Option<Self> {
        (own.is_some() || base.is_some()).then_some(Layers { own, base })
    }

    /// The field from the pipeline's section, else from `default`.
    fn get<V: Copy>(&self, f: impl Fn(&T) -> Option<V>) -> Option<V> {
        self.own.and_then(&f).or_else(|| self.base.and_then(&f))
    }

    fn own_sets<V>(&self, f: impl Fn(&T) -> Option<V>) -> bool {
        self.own.and_then(f).is_some()
    }

    fn base_sets<V>(&self, f: impl Fn(&T) -> Option<V>) -> bool {
        self.base.and_then(f).is_some()
    }

    /// A field that does not apply to the chosen kind is a mistake, unless
    /// it is inherited from `default` while the pipeline chose the kind.
    fn stray<V: Copy>(&self, kind_from_own: bool, f: impl Fn(&T) -> Option<V>) -> bool {
        self.own_sets(&f) || (self.base_sets(&f) && !kind_from_own)
    }
}

fn required<V>(
    v: Option<V>,
    policy: &'static str,
    field: &'static str,
    example: &str,
) -> Result<V, ConfigError> {
    v.ok_or_else(|| ConfigError::new(policy, field, format!("must be set, e.g. {example}")))
}

/// A policy with its settings, ready to be declared on a builder.
#[derive(Debug, Clone)]
pub(crate) enum Policy {
    Timeout(Timeout),
    Retry(Retry),
    AttemptTimeout(Timeout),
    CircuitBreaker(CircuitBreaker),
    Bulkhead(Bulkhead),
    Cooldown(Cooldown),
    RateLimiter(RateLimiter),
}

/// A pipeline's configuration with `default` applied.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    policies: Vec<Policy>,
    partition_idle: Option<Duration>,
}

impl Resolved {
    pub(crate) fn new(
        own: &RawPipeline,
        base: Option<&RawPipeline>,
    ) -> Result<Resolved, ConfigError> {
        let order = order(own, base)?;
        let mut policies = Vec::with_capacity(order.len());
        for p in order {
            let missing = || {
                ConfigError::new(
                    "pipeline",
                    "policies",
                    format!(
                        "lists `{0}`, which has no `{0}` section here or in `default`",
                        p.as_str()
                    ),
                )
            };
            policies.push(match p {
                PolicyName::Timeout => Policy::Timeout(timeout(
                    Layers::of(own.timeout.as_ref(), base.and_then(|b| b.timeout.as_ref()))
                        .ok_or_else(missing)?,
                )),
                PolicyName::AttemptTimeout => Policy::AttemptTimeout(timeout(
                    Layers::of(
                        own.attempt_timeout.as_ref(),
                        base.and_then(|b| b.attempt_timeout.as_ref()),
                    )
                    .ok_or_else(missing)?,
                )),
                PolicyName::Retry => Policy::Retry(retry(
                    Layers::of(own.retry.as_ref(), base.and_then(|b| b.retry.as_ref()))
                        .ok_or_else(missing)?,
                )?),
                PolicyName::CircuitBreaker => Policy::CircuitBreaker(breaker(
                    Layers::of(
                        own.circuit_breaker.as_ref(),
                        base.and_then(|b| b.circuit_breaker.as_ref()),
                    )
                    .ok_or_else(missing)?,
                )?),
                PolicyName::Bulkhead => Policy::Bulkhead(bulkhead(
                    Layers::of(
                        own.bulkhead.as_ref(),
                        base.and_then(|b| b.bulkhead.as_ref()),
                    )
                    .ok_or_else(missing)?,
                )?),
                PolicyName::Cooldown => Policy::Cooldown(cooldown(Layers {
                    own: own.cooldown.as_ref(),
                    base: base.and_then(|b| b.cooldown.as_ref()),
                })),
                PolicyName::RateLimiter => Policy::RateLimiter(rate_limiter(
                    Layers::of(
                        own.rate_limiter.as_ref(),
                        base.and_then(|b| b.rate_limiter.as_ref()),
                    )
                    .ok_or_else(missing)?,
                )?),
            });
        }
        let partition_idle = own
            .partition_idle
            .or_else(|| base.and_then(|b| b.partition_idle))
            .map(|d| d.0);
        Ok(Resolved {
            policies,
            partition_idle,
        })
    }

    /// Declares the policies on `builder`, in order. `budget` replaces the
    /// retry budget (to keep the tokens of an unchanged budget on reload).
    pub(crate) fn apply(
        &self,
        mut builder: PipelineBuilder,
        budget: Option<&RetryBudget>,
    ) -> PipelineBuilder {
        for p in &self.policies {
            builder = match p {
                Policy::Timeout(t) | Policy::AttemptTimeout(t) => builder.timeout(*t),
                Policy::Retry(r) => match budget {
                    Some(b) => builder.retry(r.clone().budget(b.clone())),
                    None => builder.retry(r.clone()),
                },
                Policy::CircuitBreaker(c) => builder.circuit_breaker(c.clone()),
                Policy::Bulkhead(b) => builder.bulkhead(b.clone()),
                Policy::Cooldown(c) => builder.cooldown(c.clone()),
                Policy::RateLimiter(r) => builder.rate_limiter(r.clone()),
            };
        }
        if let Some(idle) = self.partition_idle {
            builder = builder.partition_idle(idle);
        }
        builder
    }

    /// The retry budget, if the retry has one.
    pub(crate) fn budget(&self) -> Option<&RetryBudget> {
        self.policies.iter().find_map(|p| match p {
            Policy::Retry(r) => r.budget.as_ref(),
            _ => None,
        })
    }

    /// `true` when the overall timeout is the one at fault for a
    /// `timeout.*` error of the builder (it checks the overall one first).
    pub(crate) fn overall_timeout_invalid(&self) -> bool {
        self.policies.iter().any(|p| match p {
            Policy::Timeout(t) => t.duration.is_zero(),
            _ => false,
        })
    }
}

/// The policies in force, in declaration order. The order rules are
/// [`seawall_order::check`]'s (applied again by the builder); here they are
/// only worded for the `policies` list, and a timeout's name is held to what
/// its position makes it bound ([`seawall_order::scope`]).
fn order(own: &RawPipeline, base: Option<&RawPipeline>) -> Result<Vec<PolicyName>, ConfigError> {
    let err = |rule: String| ConfigError::new("pipeline", "policies", rule);
    let listed = own
        .policies
        .as_ref()
        .or_else(|| base.and_then(|b| b.policies.as_ref()));
    let order: Vec<PolicyName> = match listed {
        Some(list) => {
            let kinds: Vec<PolicyKind> = list.iter().map(|p| p.kind()).collect();
            if let Err(Misplaced {
                at,
                rule: Rule::Twice { first } | Rule::SecondOnSide { first, .. },
                ..
            }) = check(&kinds)
            {
                if list[first] == list[at] {
                    return Err(err(format!("lists `{}` twice", list[at].as_str())));
                }
            }
            if let Some(p) = PolicyName::CANONICAL
                .into_iter()
                .find(|p| p.configured(own) && !list.contains(p))
            {
                return Err(err(format!(
                    "does not list `{0}`, which this pipeline configures: add it to `policies` or remove the `{0}` section",
                    p.as_str()
                )));
            }
            list.clone()
        }
        None => PolicyName::CANONICAL
            .into_iter()
            .filter(|p| p.configured(own) || base.is_some_and(|b| p.configured(b)))
            .collect(),
    };
    let kinds: Vec<PolicyKind> = order.iter().map(|p| p.kind()).collect();
    let bounds = |name: PolicyName| {
        order
            .iter()
            .enumerate()
            .filter(move |(_, p)| **p == name)
            .map(|(i, _)| scope(&kinds, i))
    };
    if bounds(PolicyName::Timeout).any(|s| s == Scope::Attempt) {
        return Err(err(
            "lists `timeout` after `retry`: `timeout` bounds the whole call and comes before `retry`; use `attempt_timeout` to bound each attempt".into(),
        ));
    }
    if bounds(PolicyName::AttemptTimeout).any(|s| s == Scope::Call) {
        if !order.contains(&PolicyName::Retry) {
            return Err(ConfigError::new(
                "pipeline",
                "attempt_timeout",
                "needs a `retry` policy; without retries use `timeout`",
            ));
        }
        return Err(err(
            "lists `attempt_timeout` before `retry`: it bounds each attempt and comes after `retry`".into(),
        ));
    }
    Ok(order)
}

fn timeout(l: Layers<'_, RawTimeout>) -> Timeout {
    // A missing duration is refused by the builder as zero.
    let duration = l.get(|t| t.duration).map_or(Duration::ZERO, |d| d.0);
    if l.get(|t| t.strict).unwrap_or(false) {
        Timeout::strict(duration)
    } else {
        Timeout::new(duration)
    }
}

fn retry(l: Layers<'_, RawRetry>) -> Result<Retry, ConfigError> {
    const P: &str = "retry";
    let kind_from_own = l.own_sets(|r| r.backoff);
    let kind = l.get(|r| r.backoff).unwrap_or(BackoffKind::Exponential);
    let delay = required(l.get(|r| r.delay), P, "delay", "\"200ms\"")?.0;
    if kind != BackoffKind::Exponential && l.stray(kind_from_own, |r| r.multiplier) {
        return Err(ConfigError::new(
            P,
            "multiplier",
            format!("applies only to exponential backoff, not {}", kind.as_str()),
        ));
    }
    if kind == BackoffKind::Constant && l.stray(kind_from_own, |r| r.cap) {
        return Err(ConfigError::new(
            P,
            "cap",
            "does not apply to constant backoff",
        ));
    }
    let mut r = match kind {
        BackoffKind::Constant => Retry::constant(delay),
        BackoffKind::Linear => Retry::linear(delay),
        BackoffKind::Exponential => Retry::exponential(delay),
        BackoffKind::Decorrelated => Retry::decorrelated(delay, Duration::MAX),
    };
    if kind == BackoffKind::Exponential {
        if let Some(m) = l.get(|r| r.multiplier) {
            r = r.multiplier(m);
        }
    }
    if kind != BackoffKind::Constant {
        if let Some(cap) = l.get(|r| r.cap) {
            r = r.cap(cap.0);
        }
    }
    if let Some(n) = l.get(|r| r.max_attempts) {
        r = r.max_attempts(n);
    }
    if let Some(j) = l.get(|r| r.jitter) {
        r = r.jitter(j.0);
    }
    if let Some(b) = Layers::of(
        l.own.and_then(|r| r.budget.as_ref()),
        l.base.and_then(|r| r.budget.as_ref()),
    ) {
        let ratio = required(b.get(|b| b.ratio), P, "budget.ratio", "0.2")?;
        let max_tokens = b.get(|b| b.max_tokens).unwrap_or(10);
        r = r.budget(RetryBudget::new(ratio, max_tokens));
    }
    Ok(r)
}

fn breaker(l: Layers<'_, RawBreaker>) -> Result<CircuitBreaker, ConfigError> {
    const P: &str = "circuit_breaker";
    let modes = |b: &RawBreaker| {
        let mut set = Vec::new();
        if b.consecutive_failures.is_some() {
            set.push("consecutive_failures");
        }
        if b.count_window.is_some() {
            set.push("count_window");
        }
        if b.window.is_some() {
            set.push("window");
        }
        set
    };
    let own_modes = l.own.map(modes).unwrap_or_default();
    let mode_from_own = !own_modes.is_empty();
    let set = if mode_from_own {
        own_modes
    } else {
        l.base.map(modes).unwrap_or_default()
    };
    if let [first, second, ..] = set[..] {
        return Err(ConfigError::new(
            P,
            second,
            format!(
                "conflicts with `{first}`: set one of consecutive_failures, count_window or window"
            ),
        ));
    }
    let mode = if mode_from_own { l.own } else { l.base };
    let mut b = if let Some(n) = mode.and_then(|m| m.consecutive_failures) {
        for (field, stray) in [
            (
                "failure_rate",
                l.stray(mode_from_own, |b| b.failure_rate.map(|_| ())),
            ),
            ("minimum_calls", l.stray(mode_from_own, |b| b.minimum_calls)),
            (
                "slow_call_rate",
                l.stray(mode_from_own, |b| b.slow_call_rate.map(|_| ())),
            ),
            (
                "slow_call_duration",
                l.stray(mode_from_own, |b| b.slow_call_duration),
            ),
        ] {
            if stray {
                return Err(ConfigError::new(
                    P,
                    field,
                    "applies only to a count or time window, not consecutive_failures",
                ));
            }
        }
        CircuitBreaker::consecutive_failures(n)
    } else {
        let mut b = CircuitBreaker::failure_rate(l.get(|b| b.failure_rate).unwrap_or(0.5));
        if let Some(n) = mode.and_then(|m| m.count_window) {
            b = b.count_window(n);
        } else if let Some(w) = mode.and_then(|m| m.window) {
            b = b.window(w.0);
        }
        if let Some(n) = l.get(|b| b.minimum_calls) {
            b = b.minimum_calls(n);
        }
        match l.get(|b| b.slow_call_rate) {
            Some(rate) => {
                let d = l
                    .get(|b| b.slow_call_duration)
                    .map_or(b.slow_call_duration, |d| d.0);
                b = b.slow_calls(rate, d);
            }
            None if l.own_sets(|b| b.slow_call_duration) => {
                return Err(ConfigError::new(
                    P,
                    "slow_call_duration",
                    "needs slow_call_rate",
                ))
            }
            None => {}
        }
        b
    };
    if let Some(c) = l.get(|b| b.cooldown) {
        b = b.cooldown(c.0);
    }
    match (l.get(|b| b.cooldown_growth), l.get(|b| b.max_cooldown)) {
        (Some(f), Some(max)) => b = b.cooldown_growth(f, max.0),
        (Some(_), None) => {
            return Err(ConfigError::new(
                P,
                "cooldown_growth",
                "needs max_cooldown, the longest cooldown",
            ))
        }
        (None, Some(_)) => {
            return Err(ConfigError::new(P, "max_cooldown", "needs cooldown_growth"))
        }
        (None, None) => {}
    }
    if let Some(n) = l.get(|b| b.half_open_calls) {
        b = b.half_open_calls(n);
    }
    Ok(b)
}

fn bulkhead(l: Layers<'_, RawBulkhead>) -> Result<Bulkhead, ConfigError> {
    let n = required(
        l.get(|b| b.max_concurrent),
        "bulkhead",
        "max_concurrent",
        "10",
    )?;
    let mut b = Bulkhead::new(n);
    let queued = l.get(|b| b.max_queued);
    let wait = l.get(|b| b.max_wait);
    if queued.is_some() || wait.is_some() {
        b = b.queue(queued.unwrap_or(0), wait.map_or(Duration::ZERO, |d| d.0));
    }
    if let Some(lease) = l.get(|b| b.lease) {
        b = b.lease(lease.0);
    }
    Ok(b)
}

fn cooldown(l: Layers<'_, RawCooldown>) -> Cooldown {
    let mut c = Cooldown::new();
    if let Some(d) = l.get(|c| c.max_pause) {
        c = c.max_pause(d.0);
    }
    if let Some(d) = l.get(|c| c.max_wait) {
        c = c.max_wait(d.0);
    }
    if let Some(d) = l.get(|c| c.grace) {
        c = c.grace(d.0);
    }
    c
}

fn rate_limiter(l: Layers<'_, RawRateLimiter>) -> Result<RateLimiter, ConfigError> {
    const P: &str = "rate_limiter";
    let kind_from_own = l.own_sets(|r| r.algorithm);
    let algorithm = l.get(|r| r.algorithm).unwrap_or(Algorithm::Gcra);
    let limit = required(l.get(|r| r.limit), P, "limit", "100")?;
    let period = required(l.get(|r| r.period), P, "period", "\"1s\"")?.0;
    if algorithm != Algorithm::Gcra && l.stray(kind_from_own, |r| r.burst) {
        return Err(ConfigError::new(
            P,
            "burst",
            format!("applies only to gcra, not {}", algorithm.as_str()),
        ));
    }
    let mut r = match algorithm {
        Algorithm::Gcra => RateLimiter::gcra(limit, period),
        Algorithm::FixedWindow => RateLimiter::fixed_window(limit, period),
        Algorithm::SlidingWindow => RateLimiter::sliding_window(limit, period),
    };
    if algorithm == Algorithm::Gcra {
        if let Some(b) = l.get(|r| r.burst) {
            r = r.burst(b);
        }
    }
    if let Some(w) = l.get(|r| r.max_wait) {
        r = r.max_wait(w.0);
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("200ms"), Ok(Duration::from_millis(200)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration(" 1h 30m "), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        let e = parse_duration("200").unwrap_err();
        assert!(e.starts_with("invalid duration `200`: "), "{e}");
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn policy_names_are_the_registered_names() {
        use serde::de::value::{Error, StrDeserializer};
        for p in PolicyName::CANONICAL {
            let read = PolicyName::deserialize(StrDeserializer::<Error>::new(p.as_str()));
            assert_eq!(read, Ok(p));
        }
        for k in PolicyKind::ALL {
            let read = PolicyName::deserialize(StrDeserializer::<Error>::new(k.name()));
            assert_eq!(read.map(PolicyName::kind), Ok(*k), "{k:?}");
        }
    }

    #[test]
    fn jitters() {
        assert_eq!(parse_jitter("none"), Ok(Jitter::None));
        assert_eq!(parse_jitter("full"), Ok(Jitter::Full));
        assert_eq!(parse_jitter("equal"), Ok(Jitter::Equal));
        assert_eq!(parse_jitter("20%"), Ok(Jitter::Proportional(20.0)));
        assert_eq!(parse_jitter("12.5 %"), Ok(Jitter::Proportional(12.5)));
        assert!(parse_jitter("20").is_err());
        assert!(parse_jitter("lots").is_err());
    }
}
