//! Each registered policy in the words of the configuration files: its
//! defaults, its required keys and the keys that go together, resolved
//! from its section (and the one of `default`) through the policy's public
//! constructors. Keys and value kinds were read by the table (`raw.rs`);
//! the values are the builder's to judge at `build()`.

use std::time::Duration;

use seawall_order::PolicyKind;

use super::raw::Section;
use crate::adaptive::{AdaptiveLimit, LimitAlgorithm};
use crate::breaker::CircuitBreaker;
use crate::bulkhead::Bulkhead;
use crate::chaos::Chaos;
use crate::coalesce::Coalesce;
use crate::cooldown::Cooldown;
use crate::error::ConfigError;
use crate::hedge::Hedging;
use crate::pipeline::Declared;
use crate::rate_limit::{RateAlgorithm, RateLimiter};
use crate::retry::{BackoffKind, BackoffSetting, Retry, RetryBudget};
use crate::timeout::Timeout;

/// A registered policy from its section (and the one of `default`). The
/// match is exhaustive: a policy registered in `seawall_order` and not
/// resolved here does not compile.
pub(super) fn resolve(
    kind: PolicyKind,
    layers: Option<Layers<'_, Section>>,
    missing: impl FnOnce() -> ConfigError,
) -> Result<Declared, ConfigError> {
    Ok(match kind {
        PolicyKind::Timeout => Declared::Timeout(timeout(layers.ok_or_else(missing)?)),
        PolicyKind::Retry => Declared::Retry(retry(layers.ok_or_else(missing)?)?),
        PolicyKind::CircuitBreaker => {
            Declared::CircuitBreaker(breaker(layers.ok_or_else(missing)?)?)
        }
        PolicyKind::Bulkhead => Declared::Bulkhead(bulkhead(layers.ok_or_else(missing)?)?),
        // Defaults for everything: a listed cooldown needs no section.
        PolicyKind::Cooldown => Declared::Cooldown(cooldown(layers.unwrap_or(Layers {
            own: None,
            base: None,
        }))),
        PolicyKind::RateLimiter => {
            Declared::RateLimiter(rate_limiter(layers.ok_or_else(missing)?)?)
        }
        // Defaults for everything but the delay of the latency mode.
        PolicyKind::Hedging => Declared::Hedging(hedging(layers.unwrap_or(Layers {
            own: None,
            base: None,
        }))?),
        PolicyKind::Chaos => Declared::Chaos(chaos(layers.ok_or_else(missing)?)?),
        // Defaults for everything: a listed limit needs no section.
        PolicyKind::AdaptiveLimit => {
            Declared::AdaptiveLimit(adaptive_limit(layers.unwrap_or(Layers {
                own: None,
                base: None,
            })))
        }
        // Sharing alone needs no section: `coalesce = {}` or a listed name.
        PolicyKind::Coalesce => Declared::Coalesce(coalesce(layers.unwrap_or(Layers {
            own: None,
            base: None,
        }))),
        // No section: a policy written in code is listed by name and
        // declared by the registry that knows it.
        PolicyKind::CustomCall | PolicyKind::CustomAttempt => return Err(missing()),
    })
}

/// Hedging's modes, by their registered words.
const HEDGING_MODES: [(&str, HedgingModeKind); 3] = [
    ("latency", HedgingModeKind::Latency),
    ("parallel", HedgingModeKind::Parallel),
    ("fallback", HedgingModeKind::Fallback),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HedgingModeKind {
    Latency,
    Parallel,
    Fallback,
}

/// The backoffs, by their registered words (the retry module's).
fn backoffs() -> [(&'static str, BackoffKind); 4] {
    BackoffKind::ALL.map(|k| (k.word(), k))
}

/// The rate limiter's algorithms, by their registered words (the rate
/// limiter module's).
fn algorithms() -> [(&'static str, RateAlgorithm); 3] {
    RateAlgorithm::ALL.map(|a| (a.word(), a))
}

/// The meaning of a registered word (`default` when none is given).
fn chosen<T: Copy>(words: &[(&'static str, T)], word: Option<&str>, default: T) -> T {
    word.and_then(|w| words.iter().find(|(c, _)| *c == w))
        .map_or(default, |(_, v)| *v)
}

/// The word of a meaning, for messages.
fn word<T: PartialEq>(words: &[(&'static str, T)], value: T) -> &'static str {
    words
        .iter()
        .find(|(_, v)| *v == value)
        .map_or("", |(w, _)| w)
}

/// A pipeline's own section and the one of `default`, looked at together.
#[derive(Clone, Copy)]
pub(super) struct Layers<'a, T> {
    pub(super) own: Option<&'a T>,
    pub(super) base: Option<&'a T>,
}

impl<'a, T> Layers<'a, T> {
    pub(super) fn of(own: Option<&'a T>, base: Option<&'a T>) -> Option<Self> {
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

fn timeout(l: Layers<'_, Section>) -> Timeout {
    // A missing duration is refused by the builder as zero.
    let duration = l
        .get(|t| t.duration("duration"))
        .map_or(Duration::ZERO, |d| d.0);
    if l.get(|t| t.flag("strict")).unwrap_or(false) {
        Timeout::strict(duration)
    } else {
        Timeout::new(duration)
    }
}

fn retry(l: Layers<'_, Section>) -> Result<Retry, ConfigError> {
    const P: &str = "retry";
    let kind_from_own = l.own_sets(|r| r.choice("backoff"));
    let kind = chosen(
        &backoffs(),
        l.get(|r| r.choice("backoff")),
        BackoffKind::Exponential,
    );
    let delay = required(l.get(|r| r.duration("delay")), P, "delay", "\"200ms\"")?.0;
    let mut r = match kind {
        BackoffKind::Constant => Retry::constant(delay),
        BackoffKind::Linear => Retry::linear(delay),
        BackoffKind::Exponential => Retry::exponential(delay),
        BackoffKind::Decorrelated => Retry::decorrelated(delay, Duration::MAX),
    };
    // A setting that does not apply to the backoff (the retry module
    // says which) is passed on for `build()` to refuse by name, unless it
    // is inherited from `default` by a pipeline that chose its backoff
    // itself: then it is left out.
    let passed = |setting: BackoffSetting| {
        setting.applies_to(kind) || l.stray(kind_from_own, |r| r.has(setting.field()).then_some(()))
    };
    if let Some(m) = l.get(|r| r.number("multiplier")) {
        if passed(BackoffSetting::Multiplier) {
            r = r.multiplier(m);
        }
    }
    if let Some(cap) = l.get(|r| r.duration("cap")) {
        if passed(BackoffSetting::Cap) {
            r = r.cap(cap.0);
        }
    }
    if let Some(n) = l.get(|r| r.count("max_attempts")) {
        r = r.max_attempts(n);
    }
    if let Some(j) = l.get(|r| r.jitter("jitter")) {
        r = r.jitter(j);
    }
    if let Some(b) = budget(&l, P)? {
        r = r.budget(b);
    }
    Ok(r)
}

/// The budget table of the retry or hedging (`policy`).
fn budget(
    l: &Layers<'_, Section>,
    policy: &'static str,
) -> Result<Option<RetryBudget>, ConfigError> {
    let Some(b) = Layers::of(
        l.own.and_then(|r| r.table("budget")),
        l.base.and_then(|r| r.table("budget")),
    ) else {
        return Ok(None);
    };
    let ratio = required(b.get(|b| b.number("ratio")), policy, "budget.ratio", "0.2")?;
    let max_tokens = b.get(|b| b.count("max_tokens")).unwrap_or(10);
    let budget = RetryBudget::new(ratio, max_tokens);
    // A hedging budget refuses `shared` when the pipeline is built.
    Ok(Some(match b.get(|b| b.flag("shared")) {
        Some(true) => budget.shared(),
        _ => budget,
    }))
}

/// Hedging: the latency mode unless `mode` says otherwise; its `delay`
/// only for the latency mode (the dynamic mode's generator comes from
/// code).
fn hedging(l: Layers<'_, Section>) -> Result<Hedging, ConfigError> {
    const P: &str = crate::hedge::NAME;
    let kind_from_own = l.own_sets(|h| h.choice("mode"));
    let mode = chosen(
        &HEDGING_MODES,
        l.get(|h| h.choice("mode")),
        HedgingModeKind::Latency,
    );
    let mut h = match mode {
        HedgingModeKind::Latency => {
            let delay = required(l.get(|h| h.duration("delay")), P, "delay", "\"100ms\"")?.0;
            Hedging::latency(delay)
        }
        other => {
            if l.stray(kind_from_own, |h| h.duration("delay")) {
                return Err(ConfigError::new(
                    P,
                    "delay",
                    format!(
                        "applies only to mode latency, not {}",
                        word(&HEDGING_MODES, other)
                    ),
                ));
            }
            match other {
                HedgingModeKind::Parallel => Hedging::parallel(),
                _ => Hedging::fallback(),
            }
        }
    };
    if let Some(n) = l.get(|h| h.count("max_hedged_attempts")) {
        h = h.max_hedged_attempts(n);
    }
    if let Some(b) = budget(&l, P)? {
        h = h.budget(b);
    }
    Ok(h)
}

fn breaker(l: Layers<'_, Section>) -> Result<CircuitBreaker, ConfigError> {
    const P: &str = "circuit_breaker";
    const MODES: [&str; 3] = ["consecutive_failures", "count_window", "window"];
    let modes =
        |b: &Section| -> Vec<&'static str> { MODES.into_iter().filter(|m| b.has(m)).collect() };
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
    let mut b = if let Some(n) = mode.and_then(|m| m.count("consecutive_failures")) {
        // A setting of the window modes is refused whatever its value (the
        // breaker itself can only tell one that differs from what
        // `consecutive_failures` sets); left out when inherited from
        // `default` by a pipeline that chose its mode itself.
        let stray = |field: &str| l.stray(mode_from_own, |s| s.has(field).then_some(()));
        if let Some(field) = CircuitBreaker::WINDOW_SETTINGS
            .into_iter()
            .find(|f| stray(f))
        {
            return Err(CircuitBreaker::window_only(field));
        }
        CircuitBreaker::consecutive_failures(n)
    } else {
        let mut b =
            CircuitBreaker::failure_rate(l.get(|b| b.number("failure_rate")).unwrap_or(0.5));
        if let Some(n) = mode.and_then(|m| m.count("count_window")) {
            b = b.count_window(n);
        } else if let Some(w) = mode.and_then(|m| m.duration("window")) {
            b = b.window(w.0);
        }
        if let Some(n) = l.get(|b| b.count("minimum_calls")) {
            b = b.minimum_calls(n);
        }
        match l.get(|b| b.number("slow_call_rate")) {
            Some(rate) => {
                let d = l
                    .get(|b| b.duration("slow_call_duration"))
                    .map_or(b.slow_call_duration, |d| d.0);
                b = b.slow_calls(rate, d);
            }
            None if l.own_sets(|b| b.duration("slow_call_duration")) => {
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
    if let Some(c) = l.get(|b| b.duration("cooldown")) {
        b = b.cooldown(c.0);
    }
    match (
        l.get(|b| b.number("cooldown_growth")),
        l.get(|b| b.duration("max_cooldown")),
    ) {
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
    if let Some(n) = l.get(|b| b.count("half_open_calls")) {
        b = b.half_open_calls(n);
    }
    if let Some(d) = l.get(|b| b.duration("max_half_open")) {
        b = b.max_half_open(d.0);
    }
    if let Some(shadow) = l.get(|b| b.flag("shadow")) {
        b = b.shadow(shadow);
    }
    Ok(b)
}

fn bulkhead(l: Layers<'_, Section>) -> Result<Bulkhead, ConfigError> {
    let n = required(
        l.get(|b| b.count("max_concurrent")),
        "bulkhead",
        "max_concurrent",
        "10",
    )?;
    let mut b = Bulkhead::new(n);
    let queued = l.get(|b| b.count("max_queued"));
    let wait = l.get(|b| b.duration("max_wait"));
    if queued.is_some() || wait.is_some() {
        b = b.queue(queued.unwrap_or(0), wait.map_or(Duration::ZERO, |d| d.0));
    }
    if let Some(lease) = l.get(|b| b.duration("lease")) {
        b = b.lease(lease.0);
    }
    if let Some(shadow) = l.get(|b| b.flag("shadow")) {
        b = b.shadow(shadow);
    }
    Ok(b)
}

fn cooldown(l: Layers<'_, Section>) -> Cooldown {
    let mut c = Cooldown::new();
    if let Some(d) = l.get(|c| c.duration("max_pause")) {
        c = c.max_pause(d.0);
    }
    if let Some(d) = l.get(|c| c.duration("max_wait")) {
        c = c.max_wait(d.0);
    }
    if let Some(d) = l.get(|c| c.duration("grace")) {
        c = c.grace(d.0);
    }
    if let Some(shadow) = l.get(|c| c.flag("shadow")) {
        c = c.shadow(shadow);
    }
    c
}

/// Request coalescing; a `ttl` adds the cache, `max_entries` bounds it
/// (the builder judges both).
fn coalesce(l: Layers<'_, Section>) -> Coalesce {
    let mut c = Coalesce::new();
    if let Some(d) = l.get(|c| c.duration("ttl")) {
        c = c.ttl(d.0);
    }
    if let Some(n) = l.get(|c| c.count("max_entries")) {
        c = c.max_entries(n);
    }
    c
}

/// A latency injection: the files cannot give a fault's typed error.
fn chaos(l: Layers<'_, Section>) -> Result<Chaos, ConfigError> {
    const P: &str = crate::chaos::NAME;
    let rate = required(l.get(|c| c.number("rate")), P, "rate", "0.1")?;
    let latency = required(l.get(|c| c.duration("latency")), P, "latency", "\"200ms\"")?.0;
    let enabled = l.get(|c| c.flag("enabled")).unwrap_or(true);
    Ok(Chaos::latency(rate, latency).enabled(enabled))
}

/// The adaptive limit's algorithms, by their registered words.
const LIMIT_ALGORITHMS: [(&str, LimitAlgorithm); 3] = [
    ("aimd", LimitAlgorithm::Aimd),
    ("vegas", LimitAlgorithm::Vegas),
    ("gradient2", LimitAlgorithm::Gradient2),
];

/// An adaptive limit, Gradient2 unless `algorithm` says otherwise. A
/// setting of another algorithm is kept, for `build()` to refuse by name;
/// one inherited from `default` by a pipeline that chose its own algorithm
/// is left out (one of that algorithm is inherited, field by field).
fn adaptive_limit(l: Layers<'_, Section>) -> AdaptiveLimit {
    let kind_from_own = l.own_sets(|a| a.choice("algorithm"));
    let algorithm = chosen(
        &LIMIT_ALGORITHMS,
        l.get(|a| a.choice("algorithm")),
        LimitAlgorithm::Gradient2,
    );
    let mut a = match algorithm {
        LimitAlgorithm::Aimd => AdaptiveLimit::aimd(),
        LimitAlgorithm::Vegas => AdaptiveLimit::vegas(),
        _ => AdaptiveLimit::gradient2(),
    };
    if let Some(n) = l.get(|a| a.count("initial_limit")) {
        a = a.initial_limit(n);
    }
    if let Some(n) = l.get(|a| a.count("min_limit")) {
        a = a.min_limit(n);
    }
    if let Some(n) = l.get(|a| a.count("max_limit")) {
        a = a.max_limit(n);
    }
    if let Some(d) = l.get(|a| a.duration("update_interval")) {
        a = a.update_interval(d.0);
    }
    // An algorithm's setting from the pipeline's own section, or from
    // `default` when it applies to the algorithm or the pipeline did not
    // choose its algorithm itself.
    let from = |key: &'static str| {
        algorithm.takes(key) || l.stray(kind_from_own, |s| s.has(key).then_some(()))
    };
    if from("backoff_ratio") {
        if let Some(v) = l.get(|a| a.number("backoff_ratio")) {
            a = a.backoff_ratio(v);
        }
    }
    if from("rtt_timeout") {
        if let Some(d) = l.get(|a| a.duration("rtt_timeout")) {
            a = a.rtt_timeout(d.0);
        }
    }
    if from("smoothing") {
        if let Some(v) = l.get(|a| a.number("smoothing")) {
            a = a.smoothing(v);
        }
    }
    if from("queue_size") {
        if let Some(n) = l.get(|a| a.count("queue_size")) {
            a = a.queue_size(n);
        }
    }
    if from("buffer") {
        if let Some(v) = l.get(|a| a.number("buffer")) {
            a = a.buffer(v);
        }
    }
    if from("min_rtt_interval") {
        a.min_rtt_interval = l.get(|a| a.duration("min_rtt_interval")).map(|d| d.0);
    }
    if from("min_rtt_samples") {
        a.min_rtt_samples = l.get(|a| a.count("min_rtt_samples"));
    }
    if from("min_rtt_concurrency") {
        a.min_rtt_concurrency = l.get(|a| a.count("min_rtt_concurrency"));
    }
    if from("min_rtt_jitter") {
        if let Some(v) = l.get(|a| a.number("min_rtt_jitter")) {
            a = a.min_rtt_jitter(v);
        }
    }
    let queued = l.get(|a| a.count("max_queued"));
    let wait = l.get(|a| a.duration("max_wait"));
    if queued.is_some() || wait.is_some() {
        a = a.queue(queued.unwrap_or(0), wait.map_or(Duration::ZERO, |d| d.0));
    }
    let partitions = l.own.and_then(|s| s.shares("partitions"));
    let partitions = partitions.or_else(|| l.base.and_then(|s| s.shares("partitions")));
    for (name, share) in partitions.unwrap_or_default() {
        a = a.partition(name.clone(), *share);
    }
    if let Some(shadow) = l.get(|a| a.flag("shadow")) {
        a = a.shadow(shadow);
    }
    a
}

fn rate_limiter(l: Layers<'_, Section>) -> Result<RateLimiter, ConfigError> {
    const P: &str = "rate_limiter";
    let kind_from_own = l.own_sets(|r| r.choice("algorithm"));
    let algorithm = chosen(
        &algorithms(),
        l.get(|r| r.choice("algorithm")),
        RateAlgorithm::Gcra,
    );
    let limit = required(l.get(|r| r.count("limit")), P, "limit", "100")?;
    let period = required(l.get(|r| r.duration("period")), P, "period", "\"1s\"")?.0;
    let mut r = match algorithm {
        RateAlgorithm::FixedWindow => RateLimiter::fixed_window(limit, period),
        RateAlgorithm::SlidingWindow => RateLimiter::sliding_window(limit, period),
        _ => RateLimiter::gcra(limit, period),
    };
    // A burst of a window (the rate limiter module says which algorithms
    // take one) is passed on for `build()` to refuse by name, unless it is
    // inherited from `default` by a pipeline that chose its algorithm
    // itself: then it is left out.
    if let Some(b) = l.get(|r| r.count("burst")) {
        if algorithm.takes_burst() || l.stray(kind_from_own, |r| r.count("burst")) {
            r = r.burst(b);
        }
    }
    if let Some(w) = l.get(|r| r.duration("max_wait")) {
        r = r.max_wait(w.0);
    }
    if let Some(shadow) = l.get(|r| r.flag("shadow")) {
        r = r.shadow(shadow);
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use seawall_order::{Setting, Value};

    use super::*;

    /// The words this file gives a meaning are the table's choices.
    #[test]
    fn choices_are_the_registered_ones() {
        let choices = |kind: PolicyKind, key| match kind.setting(key).map(|s| s.value) {
            Some(Value::Choice(c)) => c.to_vec(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            backoffs().map(|(w, _)| w).to_vec(),
            choices(PolicyKind::Retry, "backoff")
        );
        assert_eq!(
            algorithms().map(|(w, _)| w).to_vec(),
            choices(PolicyKind::RateLimiter, "algorithm")
        );
        assert_eq!(
            LIMIT_ALGORITHMS.map(|(w, _)| w).to_vec(),
            choices(PolicyKind::AdaptiveLimit, "algorithm")
        );
    }

    /// Every registered setting is read by the resolution above (a key
    /// of the table nobody reads would be accepted and ignored).
    #[test]
    fn every_registered_setting_is_read() {
        let source = include_str!("policies.rs");
        let resolution = &source[..source.find("#[cfg(test)]").expect("tests")];
        fn keys(settings: &[Setting], out: &mut Vec<&'static str>) {
            for s in settings {
                out.push(s.key);
                if let Value::Table(nested) = s.value {
                    keys(nested, out);
                }
            }
        }
        for kind in PolicyKind::ALL {
            let mut all = Vec::new();
            keys(kind.settings(), &mut all);
            for key in all {
                assert!(
                    resolution.contains(&format!("\"{key}\"")),
                    "{kind:?}.{key} is never read"
                );
            }
        }
    }
}
