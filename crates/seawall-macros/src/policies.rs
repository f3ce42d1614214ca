//! Each registered policy in the attribute's words: its defaults, the keys
//! that go together, and the expression of its settings through seawall's
//! public constructors. Keys, units and value kinds were read by the table
//! (`attr::read`); the values are the builder's to judge at `build()`.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use seawall_order::PolicyKind;
use syn::Ident;

use crate::attr::{err, Dur, Given, JitterKind};

/// A policy as the attribute declares it.
pub(crate) struct Built {
    /// The expression of its settings, handed to the builder method named
    /// after the policy (`.retry(#value)`).
    pub(crate) value: TokenStream,
    /// The policy can refuse a call with a `Rejection`.
    pub(crate) rejects: bool,
}

impl Built {
    fn new(kind: PolicyKind, value: TokenStream) -> Built {
        Built {
            value,
            rejects: kind.is_stateful() || kind == PolicyKind::AdaptiveLimit,
        }
    }
}

/// A registered policy from its settings. The match is exhaustive: a
/// policy registered in `seawall_order` and not worded here does not
/// compile.
pub(crate) fn policy(
    kind: PolicyKind,
    given: &Given,
    span: Span,
    key: &Ident,
) -> syn::Result<Built> {
    let value = match kind {
        PolicyKind::Timeout => timeout(given, span, key)?,
        PolicyKind::Retry => return retry(given),
        PolicyKind::CircuitBreaker => circuit_breaker(given, span, key)?,
        PolicyKind::Bulkhead => bulkhead(given, span, key)?,
        PolicyKind::Cooldown => cooldown(given),
        PolicyKind::RateLimiter => rate_limiter(given, span, key)?,
        PolicyKind::Hedging => hedging(given, span, key)?,
        PolicyKind::Chaos => chaos(given, span, key)?,
        PolicyKind::AdaptiveLimit => adaptive_limit(given, span)?,
        PolicyKind::Coalesce => coalesce(given),
        // Not found by name: a policy written in code has no key here.
        PolicyKind::CustomCall | PolicyKind::CustomAttempt => return Err(syn::Error::new(
            span,
            "a policy written in code is declared with `policy = path`, a function returning it",
        )),
    };
    Ok(Built::new(kind, value))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum BackoffKind {
    Constant,
    Linear,
    Exponential,
    Decorrelated,
}

/// The attribute's words for the retry's backoffs (the table's choices).
const BACKOFFS: [(&str, BackoffKind); 4] = [
    ("constant", BackoffKind::Constant),
    ("linear", BackoffKind::Linear),
    ("exponential", BackoffKind::Exponential),
    ("decorrelated", BackoffKind::Decorrelated),
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Algorithm {
    Gcra,
    FixedWindow,
    SlidingWindow,
}

/// The attribute's words for the rate limiter's algorithms.
const ALGORITHMS: [(&str, Algorithm); 3] = [
    ("gcra", Algorithm::Gcra),
    ("fixed_window", Algorithm::FixedWindow),
    ("sliding_window", Algorithm::SlidingWindow),
];

fn chosen<T: Copy>(words: &[(&str, T)], word: Option<&str>, default: T) -> T {
    word.and_then(|w| words.iter().find(|(c, _)| *c == w))
        .map_or(default, |(_, v)| *v)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum HedgingMode {
    Latency,
    Parallel,
    Fallback,
}

/// The attribute's words for hedging's modes (the table's choices).
const HEDGING_MODES: [(&str, HedgingMode); 3] = [
    ("latency", HedgingMode::Latency),
    ("parallel", HedgingMode::Parallel),
    ("fallback", HedgingMode::Fallback),
];

/// The `budget(ratio = .., max_tokens = ..)` of the retry or hedging.
fn budget(g: &Given) -> syn::Result<Option<Budget>> {
    match g.table("budget") {
        None => Ok(None),
        Some((b, span)) => match (b.number("ratio"), b.count("max_tokens")) {
            (Some(ratio), Some(tokens)) => Ok(Some(Budget {
                ratio,
                tokens,
                shared: b.flag("shared").unwrap_or(false).then(|| {
                    b.key_span("shared").unwrap_or(span)
                }),
            })),
            _ => err(
                span,
                "`budget` needs both `ratio` and `max_tokens`, e.g. `budget(ratio = 0.2, max_tokens = 10)`",
            ),
        },
    }
}

/// A `budget(ratio = .., max_tokens = .., shared)` table; `shared`: where
/// it was set to true.
#[derive(Clone, Copy)]
struct Budget {
    ratio: f64,
    tokens: u32,
    shared: Option<Span>,
}

impl Budget {
    fn tokens(self) -> TokenStream {
        let (ratio, tokens) = (self.ratio, self.tokens);
        let mut b = quote!(::seawall::RetryBudget::new(#ratio, #tokens));
        if self.shared.is_some() {
            b.extend(quote!(.shared()));
        }
        b
    }
}

/// Hedging: the latency mode (with its `delay_ms`/`delay_s`) unless `mode`
/// says `parallel` or `fallback`. Async fns only (checked by the
/// expansion).
fn hedging(g: &Given, span: Span, key: &Ident) -> syn::Result<TokenStream> {
    let mode = chosen(&HEDGING_MODES, g.choice("mode"), HedgingMode::Latency);
    let mut h = match (mode, g.duration("delay")) {
        (HedgingMode::Latency, Some(d)) => {
            let d = d.tokens();
            quote!(::seawall::Hedging::latency(#d))
        }
        (HedgingMode::Latency, None) => {
            return err(
                span,
                format!(
                    "`{key}` needs a delay in mode latency, e.g. `{key}(delay_ms = 100)`, or \
                     `mode = \"parallel\"` or `mode = \"fallback\"`"
                ),
            )
        }
        (_, Some(_)) => {
            let at = g.value_span("delay").unwrap_or(span);
            return err(at, "`delay` applies to mode latency only: remove it");
        }
        (HedgingMode::Parallel, None) => quote!(::seawall::Hedging::parallel()),
        (HedgingMode::Fallback, None) => quote!(::seawall::Hedging::fallback()),
    };
    if let Some(n) = g.count("max_hedged_attempts") {
        h.extend(quote!(.max_hedged_attempts(#n)));
    }
    if let Some(b) = budget(g)? {
        if let Some(at) = b.shared {
            return err(
                at,
                "`shared` applies to a retry's budget only: a hedging budget is kept in the process",
            );
        }
        let b = b.tokens();
        h.extend(quote!(.budget(#b)));
    }
    Ok(h)
}

fn retry(g: &Given) -> syn::Result<Built> {
    let backoff = chosen(&BACKOFFS, g.choice("backoff"), BackoffKind::Exponential);
    if let Some(span) = g.value_span("multiplier") {
        if backoff != BackoffKind::Exponential {
            return err(
                span,
                "`multiplier` applies to `backoff = \"exponential\"` only",
            );
        }
    }
    if let (Some(span), BackoffKind::Constant) = (g.value_span("cap"), backoff) {
        return err(span, "a constant backoff has no cap: remove `cap_ms`");
    }
    let budget = budget(g)?;
    let base = g.duration("delay").unwrap_or(Dur::millis(100)).tokens();
    let cap = g.duration("cap");
    let mut retry = match backoff {
        BackoffKind::Constant => quote!(::seawall::Retry::constant(#base)),
        BackoffKind::Linear => quote!(::seawall::Retry::linear(#base)),
        BackoffKind::Exponential => quote!(::seawall::Retry::exponential(#base)),
        BackoffKind::Decorrelated => {
            let cap = cap.map_or_else(|| quote!(::core::time::Duration::MAX), Dur::tokens);
            quote!(::seawall::Retry::decorrelated(#base, #cap))
        }
    };
    let attempts = g.count("max_attempts").unwrap_or(3);
    retry.extend(quote!(.max_attempts(#attempts)));
    if let Some(m) = g.number("multiplier") {
        retry.extend(quote!(.multiplier(#m)));
    }
    if let (Some(cap), false) = (cap, backoff == BackoffKind::Decorrelated) {
        let cap = cap.tokens();
        retry.extend(quote!(.cap(#cap)));
    }
    let jitter = match g.jitter("jitter").unwrap_or(JitterKind::None) {
        JitterKind::None => quote!(::seawall::Jitter::None),
        JitterKind::Full => quote!(::seawall::Jitter::Full),
        JitterKind::Equal => quote!(::seawall::Jitter::Equal),
        JitterKind::Percent(p) => quote!(::seawall::Jitter::Proportional(#p)),
    };
    retry.extend(quote!(.jitter(#jitter)));
    if let Some(b) = budget {
        let b = b.tokens();
        retry.extend(quote!(.budget(#b)));
    }
    Ok(Built {
        value: retry,
        // Only a retry budget refuses calls.
        rejects: budget.is_some(),
    })
}

fn timeout(g: &Given, span: Span, key: &Ident) -> syn::Result<TokenStream> {
    let Some(after) = g.duration("duration") else {
        return err(
            span,
            format!("`{key}` needs a duration: `timeout(ms = ..)` or `timeout(s = ..)`"),
        );
    };
    let d = after.tokens();
    Ok(if g.flag("strict").unwrap_or(false) {
        quote!(::seawall::Timeout::strict(#d))
    } else {
        quote!(::seawall::Timeout::new(#d))
    })
}

fn circuit_breaker(g: &Given, span: Span, key: &Ident) -> syn::Result<TokenStream> {
    g.exclusive("consecutive_failures", "failure_rate")?;
    g.exclusive("count_window", "window")?;
    let consecutive = g.count("consecutive_failures");
    let mut b = match (consecutive, g.number("failure_rate")) {
        (Some(n), _) => quote!(::seawall::CircuitBreaker::consecutive_failures(#n)),
        (None, Some(r)) => quote!(::seawall::CircuitBreaker::failure_rate(#r)),
        (None, None) => {
            return err(
                span,
                format!(
                    "`{key}` needs `consecutive_failures = N` or `failure_rate = R`, \
                     e.g. `{key}(failure_rate = 0.5, cooldown_s = 30)`"
                ),
            )
        }
    };
    // Settings that only mean something with a failure rate.
    if let (Some(_), Some(k)) = (
        consecutive,
        g.first_of(&[
            "count_window",
            "window",
            "minimum_calls",
            "slow_call_rate",
            "slow_call_duration",
        ]),
    ) {
        return err(
            k.span(),
            format!("`{k}` applies to `failure_rate` only, not `consecutive_failures`"),
        );
    }
    let slow_rate = g.number("slow_call_rate");
    if let (None, Some(span)) = (slow_rate, g.key_span("slow_call_duration")) {
        return err(span, "a slow-call duration needs `slow_call_rate`");
    }
    let growth = match (g.number("cooldown_growth"), g.duration("max_cooldown")) {
        (Some(f), Some(max)) => Some((f, max)),
        (Some(_), None) => {
            return err(
                g.key_span("cooldown_growth").unwrap_or(span),
                "`cooldown_growth` needs `max_cooldown_s` (or `max_cooldown_ms`)",
            )
        }
        (None, Some(_)) => {
            return err(
                g.value_span("max_cooldown").unwrap_or(span),
                "`max_cooldown` needs `cooldown_growth`",
            )
        }
        (None, None) => None,
    };
    if let Some(n) = g.count("count_window") {
        b.extend(quote!(.count_window(#n)));
    } else if let Some(d) = g.duration("window") {
        let d = d.tokens();
        b.extend(quote!(.window(#d)));
    }
    if let Some(n) = g.count("minimum_calls") {
        b.extend(quote!(.minimum_calls(#n)));
    }
    if let Some(rate) = slow_rate {
        let d = g.duration("slow_call_duration").map_or_else(
            || quote!(::core::time::Duration::from_secs(60)),
            Dur::tokens,
        );
        b.extend(quote!(.slow_calls(#rate, #d)));
    }
    if let Some(d) = g.duration("cooldown") {
        let d = d.tokens();
        b.extend(quote!(.cooldown(#d)));
    }
    if let Some((f, max)) = growth {
        let max = max.tokens();
        b.extend(quote!(.cooldown_growth(#f, #max)));
    }
    if let Some(n) = g.count("half_open_calls") {
        b.extend(quote!(.half_open_calls(#n)));
    }
    if let Some(d) = g.duration("max_half_open") {
        let d = d.tokens();
        b.extend(quote!(.max_half_open(#d)));
    }
    b.extend(shadow(g));
    Ok(b)
}

fn bulkhead(g: &Given, span: Span, key: &Ident) -> syn::Result<TokenStream> {
    let Some(n) = g.count("max_concurrent") else {
        return err(
            span,
            format!("`{key}` needs `max_concurrent`, e.g. `{key}(max_concurrent = 10)`"),
        );
    };
    let mut b = quote!(::seawall::Bulkhead::new(#n));
    match (g.count("max_queued"), g.duration("max_wait")) {
        (Some(0) | None, None) => {}
        (Some(q), Some(w)) => {
            let w = w.tokens();
            b.extend(quote!(.queue(#q, #w)));
        }
        (Some(q), None) => {
            return err(
                g.key_span("max_queued").unwrap_or(span),
                format!("a queue of {q} needs `max_wait_ms` (or `max_wait_s`)"),
            )
        }
        (None, Some(_)) => {
            return err(
                g.key_span("max_wait").unwrap_or(span),
                "`max_wait` needs `max_queued`: only queued calls wait",
            )
        }
    }
    if let Some(lease) = g.duration("lease") {
        let lease = lease.tokens();
        b.extend(quote!(.lease(#lease)));
    }
    b.extend(shadow(g));
    Ok(b)
}

fn rate_limiter(g: &Given, span: Span, key: &Ident) -> syn::Result<TokenStream> {
    let (Some(limit), Some(per)) = (g.count("limit"), g.duration("period")) else {
        return err(
            span,
            format!("`{key}` needs `limit` and `per_s` (or `per_ms`), e.g. `{key}(limit = 100, per_s = 1)`"),
        );
    };
    let algorithm = chosen(&ALGORITHMS, g.choice("algorithm"), Algorithm::Gcra);
    if let (Some(span), false) = (g.key_span("burst"), algorithm == Algorithm::Gcra) {
        return err(span, "`burst` applies to `algorithm = \"gcra\"` only");
    }
    let per = per.tokens();
    let mut r = match algorithm {
        Algorithm::Gcra => quote!(::seawall::RateLimiter::gcra(#limit, #per)),
        Algorithm::FixedWindow => quote!(::seawall::RateLimiter::fixed_window(#limit, #per)),
        Algorithm::SlidingWindow => quote!(::seawall::RateLimiter::sliding_window(#limit, #per)),
    };
    if let Some(b) = g.count("burst") {
        r.extend(quote!(.burst(#b)));
    }
    if let Some(w) = g.duration("max_wait") {
        let w = w.tokens();
        r.extend(quote!(.max_wait(#w)));
    }
    r.extend(shadow(g));
    Ok(r)
}

/// A latency injection: the attribute cannot give a fault's typed error
/// (the builder's `chaos_fault` does).
fn chaos(g: &Given, span: Span, key: &Ident) -> syn::Result<TokenStream> {
    let (Some(rate), Some(latency)) = (g.number("rate"), g.duration("latency")) else {
        return err(
            span,
            format!(
                "`{key}` needs `rate` and a latency, e.g. `{key}(rate = 0.1, latency_ms = 200)`"
            ),
        );
    };
    let latency = latency.tokens();
    let enabled = g.flag("enabled").unwrap_or(true);
    Ok(quote!(::seawall::Chaos::latency(#rate, #latency).enabled(#enabled)))
}

/// The attribute's words for the adaptive limit's algorithms.
const LIMIT_ALGORITHMS: [(&str, &str); 3] = [
    ("aimd", "aimd"),
    ("vegas", "vegas"),
    ("gradient2", "gradient2"),
];

/// An adaptive limit (Gradient2 unless `algorithm` says otherwise); a
/// setting of another algorithm is refused by `build()`.
fn adaptive_limit(g: &Given, span: Span) -> syn::Result<TokenStream> {
    let algorithm = chosen(&LIMIT_ALGORITHMS, g.choice("algorithm"), "gradient2");
    let constructor = Ident::new(algorithm, Span::call_site());
    let mut a = quote!(::seawall::AdaptiveLimit::#constructor());
    for key in ["initial_limit", "min_limit", "max_limit", "queue_size"] {
        if let Some(n) = g.count(key) {
            let setter = Ident::new(key, Span::call_site());
            a.extend(quote!(.#setter(#n)));
        }
    }
    for key in ["backoff_ratio", "smoothing", "buffer", "min_rtt_jitter"] {
        if let Some(v) = g.number(key) {
            let setter = Ident::new(key, Span::call_site());
            a.extend(quote!(.#setter(#v)));
        }
    }
    if let Some(d) = g.duration("update_interval") {
        let d = d.tokens();
        a.extend(quote!(.update_interval(#d)));
    }
    if let Some(d) = g.duration("rtt_timeout") {
        let d = d.tokens();
        a.extend(quote!(.rtt_timeout(#d)));
    }
    let min_rtt = [
        g.duration("min_rtt_interval")
            .map(|_| "min_rtt_interval_ms"),
        g.count("min_rtt_samples").map(|_| "min_rtt_samples"),
        g.count("min_rtt_concurrency")
            .map(|_| "min_rtt_concurrency"),
    ];
    match (
        g.duration("min_rtt_interval"),
        g.count("min_rtt_samples"),
        g.count("min_rtt_concurrency"),
    ) {
        (None, None, None) => {}
        (Some(i), Some(n), Some(c)) => {
            let i = i.tokens();
            a.extend(quote!(.min_rtt(#i, #n, #c)));
        }
        _ => {
            let given: Vec<_> = min_rtt.iter().flatten().copied().collect();
            return err(
                g.first_of(&["min_rtt_interval", "min_rtt_samples", "min_rtt_concurrency"])
                    .map_or(span, |k| k.span()),
                format!(
                    "the baseline's measurement needs `min_rtt_interval_ms` (or `_s`), \
                     `min_rtt_samples` and `min_rtt_concurrency` together; got only {}",
                    given.join(", ")
                ),
            );
        }
    }
    match (g.count("max_queued"), g.duration("max_wait")) {
        (Some(0) | None, None) => {}
        (Some(q), Some(w)) => {
            let w = w.tokens();
            a.extend(quote!(.queue(#q, #w)));
        }
        (Some(q), None) => {
            return err(
                g.key_span("max_queued").unwrap_or(span),
                format!("a queue of {q} needs `max_wait_ms` (or `max_wait_s`)"),
            )
        }
        (None, Some(_)) => {
            return err(
                g.key_span("max_wait").unwrap_or(span),
                "`max_wait` needs `max_queued`: only queued calls wait",
            )
        }
    }
    for (name, share) in g.shares("partitions").unwrap_or_default() {
        a.extend(quote!(.partition(#name, #share)));
    }
    a.extend(shadow(g));
    Ok(a)
}

/// Request coalescing; with `ttl_ms` / `ttl_s`, a cache of successes
/// (`max_entries` bounds it). The key is the attribute's `coalesce_key`.
fn coalesce(g: &Given) -> TokenStream {
    let mut c = quote!(::seawall::Coalesce::new());
    if let Some(d) = g.duration("ttl") {
        let d = d.tokens();
        c.extend(quote!(.ttl(#d)));
    }
    if let Some(n) = g.count("max_entries") {
        c.extend(quote!(.max_entries(#n)));
    }
    c
}

fn cooldown(g: &Given) -> TokenStream {
    let mut c = quote!(::seawall::Cooldown::new());
    if let Some(d) = g.duration("max_pause") {
        let d = d.tokens();
        c.extend(quote!(.max_pause(#d)));
    }
    if let Some(d) = g.duration("max_wait") {
        let d = d.tokens();
        c.extend(quote!(.max_wait(#d)));
    }
    if let Some(d) = g.duration("grace") {
        let d = d.tokens();
        c.extend(quote!(.grace(#d)));
    }
    c.extend(shadow(g));
    c
}

/// Shadow mode, for every stateful policy: `.shadow(true)` when the
/// attribute says `shadow` (or `shadow = true`), nothing otherwise.
fn shadow(g: &Given) -> TokenStream {
    match g.flag("shadow") {
        Some(true) => quote!(.shadow(true)),
        _ => TokenStream::new(),
    }
}

#[cfg(test)]
mod tests {
    use seawall_order::{Setting, Value};

    use super::*;
    use crate::attr::{parse, Step};

    fn steps(s: &str) -> Vec<Step> {
        parse(s.parse().expect("tokens")).expect("accepted").steps
    }

    /// A step's expression, without spaces.
    fn value(step: &Step) -> String {
        step.policy.value.to_string().replace(' ', "")
    }

    /// Every setting of the table reaches the expression.
    #[test]
    fn every_registered_setting_is_read() {
        let s = steps(
            r#"timeout(s = 1, strict = false),
               retry(max_attempts = 2, backoff = "decorrelated", backoff_s = 1, cap_ms = 9,
                     jitter = "equal", budget(ratio = 0.5, max_tokens = 2)),
               circuit_breaker(failure_rate = 0.5, count_window = 10, minimum_calls = 1,
                     slow_call_rate = 0.5, slow_call_s = 1, cooldown_ms = 1,
                     cooldown_growth = 2, max_cooldown_s = 3, half_open_calls = 2),
               bulkhead(max_concurrent = 1, max_queued = 1, max_wait_s = 1, lease_ms = 5),
               cooldown(max_pause_ms = 1, max_wait_ms = 2, grace_ms = 3),
               rate_limiter(algorithm = "sliding_window", limit = 1, per_ms = 10, max_wait_s = 2)"#,
        );
        let d = |unit: &str, n: u64| format!("::core::time::Duration::from_{unit}({n}u64)");
        let expected = [
            format!("::seawall::Timeout::new({})", d("secs", 1)),
            format!(
                "::seawall::Retry::decorrelated({},{}).max_attempts(2u32).jitter(::seawall::Jitter::Equal).budget(::seawall::RetryBudget::new(0.5f64,2u32))",
                d("secs", 1),
                d("millis", 9)
            ),
            format!(
                "::seawall::CircuitBreaker::failure_rate(0.5f64).count_window(10u32).minimum_calls(1u32).slow_calls(0.5f64,{}).cooldown({}).cooldown_growth(2f64,{}).half_open_calls(2u32)",
                d("secs", 1),
                d("millis", 1),
                d("secs", 3)
            ),
            format!(
                "::seawall::Bulkhead::new(1u32).queue(1u32,{}).lease({})",
                d("secs", 1),
                d("millis", 5)
            ),
            format!(
                "::seawall::Cooldown::new().max_pause({}).max_wait({}).grace({})",
                d("millis", 1),
                d("millis", 2),
                d("millis", 3)
            ),
            format!(
                "::seawall::RateLimiter::sliding_window(1u32,{}).max_wait({})",
                d("millis", 10),
                d("secs", 2)
            ),
        ];
        assert_eq!(s.len(), expected.len());
        for (step, expected) in s.iter().zip(expected) {
            assert_eq!(value(step), expected);
        }
        assert!(s[1].policy.rejects, "a retry budget refuses calls");
        assert!(!steps("retry").remove(0).policy.rejects);
        assert!(!s[0].policy.rejects && s[2..].iter().all(|s| s.policy.rejects));
    }

    /// Every registered setting is read by a function above (a key of
    /// the table nobody reads would be accepted and ignored).
    #[test]
    fn every_registered_setting_is_used() {
        let source = include_str!("policies.rs");
        let code = &source[..source.find("#[cfg(test)]\nmod tests").expect("tests")];
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
                    code.contains(&format!("\"{key}\"")),
                    "{kind:?}.{key} is never read"
                );
            }
        }
    }

    /// The attribute's documentation names every registered key.
    #[test]
    fn every_registered_key_is_documented() {
        let docs = include_str!("resilient.md");
        fn keys(settings: &[Setting], out: &mut Vec<String>) {
            for s in settings {
                out.extend(s.attribute_keys());
                if let Value::Table(nested) = s.value {
                    keys(nested, out);
                }
            }
        }
        for kind in PolicyKind::ALL {
            assert!(docs.contains(&format!("`{}", kind.name())), "{kind:?}");
            let mut all = Vec::new();
            keys(kind.settings(), &mut all);
            for key in all {
                let documented = [
                    format!("`{key}`"),
                    format!("`{key} "),
                    format!("({key} "),
                    format!(" {key} = "),
                    format!("\n{key} = "),
                ]
                .iter()
                .any(|spelled| docs.contains(spelled));
                assert!(documented, "{kind:?}: `{key}` is not documented");
            }
        }
    }

    /// The attribute's words for a choice are the table's.
    #[test]
    fn choices_are_the_registered_ones() {
        let choices = |kind: PolicyKind, key| match kind.setting(key).map(|s| s.value) {
            Some(Value::Choice(c)) => c.to_vec(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            BACKOFFS.map(|(w, _)| w).to_vec(),
            choices(PolicyKind::Retry, "backoff")
        );
        assert_eq!(
            ALGORITHMS.map(|(w, _)| w).to_vec(),
            choices(PolicyKind::RateLimiter, "algorithm")
        );
    }
}
