//! Parsing of the attribute's arguments.
//!
//! Here are the attribute's own rules: its syntax (keys, literals, units,
//! keys that go together) and the order of policies, checked by
//! [`seawall_order::check`] (the builder's own check) so that an error
//! points at the key. The values are not checked here: the expansion hands
//! them to the builder, whose `build()` applies each policy's rules.

#[cfg(test)]
use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use quote::quote;
use seawall_order::{check, PolicyKind, Rule, Scope};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, ExprPath, Ident, Lit, LitStr, Meta, Token};

/// Everything the attribute says.
pub(crate) struct Config {
    /// The resource name, when given.
    pub(crate) name: Option<LitStr>,
    /// The policies, in declaration order (outermost first).
    pub(crate) steps: Vec<Step>,
    /// The function called with the arguments and the error on failure.
    pub(crate) fallback: Option<ExprPath>,
    /// A function returning the state store.
    pub(crate) store: Option<ExprPath>,
    /// A function returning the clock.
    pub(crate) clock: Option<ExprPath>,
    /// A function receiving every event.
    pub(crate) on_event: Option<ExprPath>,
    /// The name under which the body sees the attempt's `Context`.
    pub(crate) context: Option<Ident>,
    /// `classify`, `retry_if`, `abort_if`: functions judging the body's
    /// errors, with the key that gave each.
    pub(crate) judges: Vec<(Ident, ExprPath)>,
}

/// One policy and the key that declared it (errors point at the key).
pub(crate) struct Step {
    pub(crate) key: Ident,
    pub(crate) policy: Policy,
}

pub(crate) enum Policy {
    Retry(Retry),
    Timeout(Timeout),
    CircuitBreaker(CircuitBreaker),
    Bulkhead(Bulkhead),
    RateLimiter(RateLimiter),
    Cooldown(Cooldown),
}

impl Policy {
    /// The policy, as the order rules know it.
    pub(crate) fn kind(&self) -> PolicyKind {
        match self {
            Policy::Retry(_) => PolicyKind::Retry,
            Policy::Timeout(_) => PolicyKind::Timeout,
            Policy::CircuitBreaker(_) => PolicyKind::CircuitBreaker,
            Policy::Bulkhead(_) => PolicyKind::Bulkhead,
            Policy::RateLimiter(_) => PolicyKind::RateLimiter,
            Policy::Cooldown(_) => PolicyKind::Cooldown,
        }
    }

    /// Policies that guard each attempt through the state store.
    pub(crate) fn is_stateful(&self) -> bool {
        self.kind().is_stateful()
    }

    /// Policies that can refuse a call with a `Rejection`.
    pub(crate) fn can_reject(&self) -> bool {
        match self {
            Policy::Retry(r) => r.budget.is_some(),
            other => other.is_stateful(),
        }
    }
}

/// A duration as written: a number and its unit.
#[derive(Clone, Copy)]
pub(crate) struct Dur {
    value: u64,
    unit: Unit,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Unit {
    Millis,
    Secs,
}

impl Dur {
    fn millis(value: u64) -> Self {
        Dur {
            value,
            unit: Unit::Millis,
        }
    }

    #[cfg(test)]
    pub(crate) fn duration(self) -> Duration {
        match self.unit {
            Unit::Millis => Duration::from_millis(self.value),
            Unit::Secs => Duration::from_secs(self.value),
        }
    }

    pub(crate) fn tokens(self) -> TokenStream {
        let v = self.value;
        match self.unit {
            Unit::Millis => quote!(::core::time::Duration::from_millis(#v)),
            Unit::Secs => quote!(::core::time::Duration::from_secs(#v)),
        }
    }
}

pub(crate) struct Retry {
    pub(crate) max_attempts: u32,
    pub(crate) backoff: BackoffKind,
    pub(crate) base: Dur,
    pub(crate) multiplier: Option<f64>,
    pub(crate) cap: Option<Dur>,
    pub(crate) jitter: JitterKind,
    pub(crate) budget: Option<(f64, u32)>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum BackoffKind {
    Constant,
    Linear,
    Exponential,
    Decorrelated,
}

#[derive(Clone, Copy)]
pub(crate) enum JitterKind {
    None,
    Full,
    Equal,
    Percent(f64),
}

pub(crate) struct Timeout {
    pub(crate) after: Dur,
    pub(crate) strict: bool,
}

pub(crate) enum BreakerMode {
    Consecutive(u32),
    Rate(f64),
}

pub(crate) enum Window {
    Count(u32),
    Seconds(u32),
}

pub(crate) struct CircuitBreaker {
    pub(crate) mode: BreakerMode,
    pub(crate) window: Option<Window>,
    pub(crate) minimum_calls: Option<u32>,
    pub(crate) slow_calls: Option<(f64, Option<Dur>)>,
    pub(crate) cooldown: Option<Dur>,
    pub(crate) growth: Option<(f64, Dur)>,
    pub(crate) half_open_calls: Option<u32>,
}

pub(crate) struct Bulkhead {
    pub(crate) max_concurrent: u32,
    pub(crate) queue: Option<(u32, Dur)>,
    pub(crate) lease: Option<Dur>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algorithm {
    Gcra,
    FixedWindow,
    SlidingWindow,
}

pub(crate) struct RateLimiter {
    pub(crate) limit: u32,
    pub(crate) per: Dur,
    pub(crate) algorithm: Algorithm,
    pub(crate) burst: Option<u32>,
    pub(crate) max_wait: Option<Dur>,
}

#[derive(Default)]
pub(crate) struct Cooldown {
    pub(crate) max_pause: Option<Dur>,
    pub(crate) max_wait: Option<Dur>,
    pub(crate) grace: Option<Dur>,
}

const TOP_KEYS: &str = "retry, timeout_ms, timeout_s, timeout, circuit_breaker, bulkhead, \
     rate_limiter, cooldown, fallback, classify, retry_if, abort_if, name, store, clock, \
     on_event, context";
const RETRY_KEYS: &str =
    "max_attempts, backoff, backoff_ms, backoff_s, multiplier, cap_ms, cap_s, jitter, budget";
const TIMEOUT_KEYS: &str = "ms, s, strict";
const BREAKER_KEYS: &str = "consecutive_failures, failure_rate, count_window, window_s, \
     minimum_calls, slow_call_rate, slow_call_ms, slow_call_s, cooldown_ms, cooldown_s, \
     cooldown_growth, max_cooldown_ms, max_cooldown_s, half_open_calls";
const BULKHEAD_KEYS: &str =
    "max_concurrent, max_queued, max_wait_ms, max_wait_s, lease_ms, lease_s";
const RATE_KEYS: &str = "limit, per_ms, per_s, algorithm, burst, max_wait_ms, max_wait_s";
const COOLDOWN_KEYS: &str = "max_pause_ms, max_pause_s, max_wait_ms, max_wait_s, grace_ms, grace_s";
const BUDGET_KEYS: &str = "ratio, max_tokens";

fn err<T>(span: Span, msg: impl std::fmt::Display) -> syn::Result<T> {
    Err(syn::Error::new(span, msg))
}

/// The key of an argument: a single identifier.
fn key_of(meta: &Meta) -> syn::Result<Ident> {
    match meta.path().get_ident() {
        Some(i) => Ok(i.clone()),
        None => err(
            meta.path().span(),
            "expected a key, e.g. `max_attempts = 3`",
        ),
    }
}

/// Keys seen so far in one list, to refuse a key given twice (also under
/// another unit: `backoff_ms` then `backoff_s`).
#[derive(Default)]
struct Seen(Vec<(String, String)>);

impl Seen {
    fn add(&mut self, key: &Ident, canonical: &str) -> syn::Result<()> {
        let text = key.to_string();
        if let Some((_, first)) = self.0.iter().find(|(c, _)| c == canonical) {
            if *first == text {
                return err(key.span(), format!("`{text}` is given twice"));
            }
            return err(
                key.span(),
                format!("`{text}` and `{first}` set the same value: give one of them"),
            );
        }
        self.0.push((canonical.to_owned(), text));
        Ok(())
    }
}

/// The unit of a duration key `{base}_ms` / `{base}_s`, if `key` is one.
fn unit_of(key: &str, base: &str) -> Option<Unit> {
    let rest = key.strip_prefix(base)?;
    match rest {
        "_ms" => Some(Unit::Millis),
        "_s" => Some(Unit::Secs),
        _ => None,
    }
}

fn value<'m>(meta: &'m Meta, key: &Ident) -> syn::Result<&'m Expr> {
    match meta {
        Meta::NameValue(nv) => Ok(&nv.value),
        _ => err(meta.span(), format!("expected `{key} = <value>`")),
    }
}

fn literal(expr: &Expr) -> Option<&Lit> {
    match expr {
        Expr::Lit(ExprLit { lit, .. }) => Some(lit),
        Expr::Group(g) => literal(&g.expr),
        _ => None,
    }
}

fn int<T>(meta: &Meta, key: &Ident) -> syn::Result<T>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    let expr = value(meta, key)?;
    match literal(expr) {
        Some(Lit::Int(i)) if !i.base10_digits().starts_with('-') => i.base10_parse(),
        _ => err(
            expr.span(),
            format!("`{key}` expects a non-negative integer literal, e.g. `{key} = 3`"),
        ),
    }
}

fn float(meta: &Meta, key: &Ident) -> syn::Result<(f64, Span)> {
    let expr = value(meta, key)?;
    let v = match literal(expr) {
        Some(Lit::Float(f)) => f.base10_parse()?,
        Some(Lit::Int(i)) => i.base10_parse::<u64>()? as f64,
        _ => {
            return err(
                expr.span(),
                format!("`{key}` expects a number literal, e.g. `{key} = 0.5`"),
            )
        }
    };
    Ok((v, expr.span()))
}

fn string(meta: &Meta, key: &Ident) -> syn::Result<LitStr> {
    let expr = value(meta, key)?;
    match literal(expr) {
        Some(Lit::Str(s)) => Ok(s.clone()),
        _ => err(
            expr.span(),
            format!("`{key}` expects a string literal, e.g. `{key} = \"...\"`"),
        ),
    }
}

fn path(meta: &Meta, key: &Ident, what: &str) -> syn::Result<ExprPath> {
    let expr = value(meta, key)?;
    match expr {
        Expr::Path(p) => Ok(p.clone()),
        _ => err(
            expr.span(),
            format!("`{key}` expects the path of {what}, e.g. `{key} = Self::{key}`"),
        ),
    }
}

fn duration(meta: &Meta, key: &Ident, unit: Unit) -> syn::Result<(Dur, Span)> {
    let value = int::<u64>(meta, key)?;
    let span = self::value(meta, key)?.span();
    Ok((Dur { value, unit }, span))
}

/// A count.
fn count(meta: &Meta, key: &Ident) -> syn::Result<u32> {
    int::<u32>(meta, key)
}

/// A flag: `strict` or `strict = true|false`.
fn flag(meta: &Meta, key: &Ident) -> syn::Result<bool> {
    match meta {
        Meta::Path(_) => Ok(true),
        Meta::NameValue(nv) => match literal(&nv.value) {
            Some(Lit::Bool(b)) => Ok(b.value),
            _ => err(
                nv.value.span(),
                format!("`{key}` expects `true` or `false`"),
            ),
        },
        Meta::List(l) => err(l.span(), format!("expected `{key}` or `{key} = true`")),
    }
}

/// The arguments of `policy(...)`; a bare `policy` has none.
fn nested(meta: &Meta) -> syn::Result<Vec<Meta>> {
    match meta {
        Meta::Path(_) => Ok(Vec::new()),
        Meta::List(l) => {
            let list = Punctuated::<Meta, Token![,]>::parse_terminated.parse2(l.tokens.clone())?;
            Ok(list.into_iter().collect())
        }
        Meta::NameValue(nv) => {
            let key = key_of(meta)?;
            err(
                nv.eq_token.span,
                format!("`{key}` takes a list of settings: `{key}(...)`"),
            )
        }
    }
}

fn unknown<T>(key: &Ident, list: &str, keys: &str) -> syn::Result<T> {
    err(
        key.span(),
        format!("unknown key `{key}` in {list}; expected one of: {keys}"),
    )
}

/// Parses and checks the attribute's arguments.
pub(crate) fn parse(args: TokenStream) -> syn::Result<Config> {
    let metas = Punctuated::<Meta, Token![,]>::parse_terminated.parse2(args)?;
    let mut config = Config {
        name: None,
        steps: Vec::new(),
        fallback: None,
        store: None,
        clock: None,
        on_event: None,
        context: None,
        judges: Vec::new(),
    };
    let mut seen = Seen::default();
    for meta in &metas {
        let key = key_of(meta)?;
        let text = key.to_string();
        let policy = match text.as_str() {
            "retry" => Some(Policy::Retry(retry(meta)?)),
            "timeout" => Some(Policy::Timeout(timeout(meta, &key)?)),
            "timeout_ms" | "timeout_s" => {
                let unit = unit_of(&text, "timeout").unwrap_or(Unit::Millis);
                Some(Policy::Timeout(Timeout {
                    after: duration(meta, &key, unit)?.0,
                    strict: false,
                }))
            }
            "circuit_breaker" => Some(Policy::CircuitBreaker(circuit_breaker(meta, &key)?)),
            "bulkhead" => Some(Policy::Bulkhead(bulkhead(meta, &key)?)),
            "rate_limiter" => Some(Policy::RateLimiter(rate_limiter(meta, &key)?)),
            "cooldown" => Some(Policy::Cooldown(cooldown(meta)?)),
            "fallback" => {
                seen.add(&key, "fallback")?;
                config.fallback = Some(path(meta, &key, "a function")?);
                None
            }
            "name" => {
                seen.add(&key, "name")?;
                config.name = Some(string(meta, &key)?);
                None
            }
            "store" => {
                seen.add(&key, "store")?;
                config.store = Some(path(meta, &key, "a function returning the store")?);
                None
            }
            "clock" => {
                seen.add(&key, "clock")?;
                config.clock = Some(path(meta, &key, "a function returning the clock")?);
                None
            }
            "on_event" => {
                seen.add(&key, "on_event")?;
                config.on_event = Some(path(meta, &key, "a function taking `&seawall::Event`")?);
                None
            }
            "classify" | "retry_if" | "abort_if" => {
                seen.add(&key, &text)?;
                let what = if text == "classify" {
                    "a function `fn(&E) -> seawall::Verdict`"
                } else {
                    "a function `fn(&E) -> bool`"
                };
                let judge = path(meta, &key, what)?;
                config.judges.push((key.clone(), judge));
                None
            }
            "context" => {
                seen.add(&key, "context")?;
                let expr = value(meta, &key)?;
                let ident = match expr {
                    Expr::Path(p) if p.qself.is_none() => p.path.get_ident().cloned(),
                    _ => None,
                };
                match ident {
                    Some(i) => config.context = Some(i),
                    None => {
                        return err(
                            expr.span(),
                            "`context` expects a variable name, e.g. `context = ctx`",
                        )
                    }
                }
                None
            }
            _ => return unknown(&key, "#[resilient(...)]", TOP_KEYS),
        };
        if let Some(policy) = policy {
            config.steps.push(Step { key, policy });
        }
    }
    check_order(&config.steps)?;
    if let Some(store) = &config.store {
        if !config.steps.iter().any(|s| s.policy.is_stateful()) {
            let stateful: Vec<String> = PolicyKind::ALL
                .iter()
                .filter(|k| k.is_stateful())
                .map(|k| format!("`{}`", k.name()))
                .collect();
            let list = match stateful.split_last() {
                Some((last, others)) if !others.is_empty() => {
                    format!("{} and {last}", others.join(", "))
                }
                _ => stateful.concat(),
            };
            return err(
                store.span(),
                format!(
                    "`store` keeps the state of {list}, and this function declares none of them"
                ),
            );
        }
    }
    Ok(config)
}

/// The order of policies, checked by the builder's own rules; the error
/// points at the key of the misplaced policy.
fn check_order(steps: &[Step]) -> syn::Result<()> {
    let kinds: Vec<PolicyKind> = steps.iter().map(|s| s.policy.kind()).collect();
    let Err(e) = check(&kinds) else {
        return Ok(());
    };
    let key = &steps[e.at].key;
    let reason = e.rule.reason();
    let msg = match e.rule {
        Rule::Twice { .. } => format!("`{}` is declared twice; {reason}", e.kind.name()),
        Rule::SecondOnSide {
            scope: Scope::Attempt,
            ..
        } => format!("a timeout is already declared after `retry`: {reason}"),
        Rule::SecondOnSide {
            scope: Scope::Call, ..
        } => format!("a timeout is already declared: {reason}"),
        Rule::BeforeRetry { .. } => format!("`{key}` must be declared after `retry`: {reason}"),
    };
    err(key.span(), msg)
}

fn retry(meta: &Meta) -> syn::Result<Retry> {
    let mut r = Retry {
        max_attempts: 3,
        backoff: BackoffKind::Exponential,
        base: Dur::millis(100),
        multiplier: None,
        cap: None,
        jitter: JitterKind::None,
        budget: None,
    };
    let mut seen = Seen::default();
    let mut multiplier_span = None;
    let mut cap_span = None;
    for m in nested(meta)? {
        let key = key_of(&m)?;
        let text = key.to_string();
        if let Some(unit) = unit_of(&text, "backoff") {
            seen.add(&key, "backoff_ms")?;
            r.base = duration(&m, &key, unit)?.0;
            continue;
        }
        if let Some(unit) = unit_of(&text, "cap") {
            seen.add(&key, "cap_ms")?;
            let (d, span) = duration(&m, &key, unit)?;
            r.cap = Some(d);
            cap_span = Some(span);
            continue;
        }
        seen.add(&key, &text)?;
        match text.as_str() {
            "max_attempts" => r.max_attempts = count(&m, &key)?,
            "backoff" => {
                let s = string(&m, &key)?;
                r.backoff = match s.value().as_str() {
                    "constant" => BackoffKind::Constant,
                    "linear" => BackoffKind::Linear,
                    "exponential" => BackoffKind::Exponential,
                    "decorrelated" => BackoffKind::Decorrelated,
                    other => {
                        return err(
                            s.span(),
                            format!(
                                "unknown backoff \"{other}\"; expected \"constant\", \
                                 \"linear\", \"exponential\" or \"decorrelated\""
                            ),
                        )
                    }
                }
            }
            "multiplier" => {
                let (v, span) = float(&m, &key)?;
                r.multiplier = Some(v);
                multiplier_span = Some(span);
            }
            "jitter" => {
                let expr = value(&m, &key)?;
                r.jitter = match literal(expr) {
                    Some(Lit::Str(s)) => match s.value().as_str() {
                        "none" => JitterKind::None,
                        "full" => JitterKind::Full,
                        "equal" => JitterKind::Equal,
                        other => {
                            return err(
                                s.span(),
                                format!(
                                    "unknown jitter \"{other}\"; expected \"none\", \"full\", \
                                     \"equal\" or a percentage such as `jitter = 20`"
                                ),
                            )
                        }
                    },
                    Some(Lit::Int(_) | Lit::Float(_)) => JitterKind::Percent(float(&m, &key)?.0),
                    _ => {
                        return err(
                            expr.span(),
                            "`jitter` expects \"none\", \"full\", \"equal\" or a percentage, e.g. `jitter = 20`",
                        )
                    }
                };
            }
            "budget" => r.budget = Some(budget(&m)?),
            _ => return unknown(&key, "`retry(...)`", RETRY_KEYS),
        }
    }
    if let Some(span) = multiplier_span {
        if r.backoff != BackoffKind::Exponential {
            return err(
                span,
                "`multiplier` applies to `backoff = \"exponential\"` only",
            );
        }
    }
    if let (Some(_), Some(span)) = (r.cap, cap_span) {
        if r.backoff == BackoffKind::Constant {
            return err(span, "a constant backoff has no cap: remove `cap_ms`");
        }
    }
    Ok(r)
}

fn budget(meta: &Meta) -> syn::Result<(f64, u32)> {
    let mut ratio = None;
    let mut max_tokens = None;
    let mut seen = Seen::default();
    for m in nested(meta)? {
        let key = key_of(&m)?;
        seen.add(&key, &key.to_string())?;
        match key.to_string().as_str() {
            "ratio" => ratio = Some(float(&m, &key)?.0),
            "max_tokens" => max_tokens = Some(count(&m, &key)?),
            _ => return unknown(&key, "`budget(...)`", BUDGET_KEYS),
        }
    }
    match (ratio, max_tokens) {
        (Some(r), Some(t)) => Ok((r, t)),
        _ => err(
            meta.span(),
            "`budget` needs both `ratio` and `max_tokens`, e.g. `budget(ratio = 0.2, max_tokens = 10)`",
        ),
    }
}

fn timeout(meta: &Meta, key: &Ident) -> syn::Result<Timeout> {
    if let Meta::NameValue(nv) = meta {
        return err(
            nv.eq_token.span,
            "write `timeout_ms = ..`, `timeout_s = ..` or `timeout(ms = .., strict)`",
        );
    }
    let mut after = None;
    let mut strict = false;
    let mut seen = Seen::default();
    for m in nested(meta)? {
        let k = key_of(&m)?;
        match k.to_string().as_str() {
            "ms" => {
                seen.add(&k, "duration")?;
                after = Some(duration(&m, &k, Unit::Millis)?.0);
            }
            "s" => {
                seen.add(&k, "duration")?;
                after = Some(duration(&m, &k, Unit::Secs)?.0);
            }
            "strict" => {
                seen.add(&k, "strict")?;
                strict = flag(&m, &k)?;
            }
            _ => return unknown(&k, "`timeout(...)`", TIMEOUT_KEYS),
        }
    }
    match after {
        Some(after) => Ok(Timeout { after, strict }),
        None => err(
            meta.span(),
            format!("`{key}` needs a duration: `timeout(ms = ..)` or `timeout(s = ..)`"),
        ),
    }
}

fn circuit_breaker(meta: &Meta, key: &Ident) -> syn::Result<CircuitBreaker> {
    let mut mode = None;
    let mut window = None;
    let mut minimum_calls = None;
    let mut slow_rate = None;
    let mut slow_duration: Option<(Dur, Span)> = None;
    let mut cooldown = None;
    let mut growth = None;
    let mut max_cooldown: Option<(Dur, Span)> = None;
    let mut half_open_calls = None;
    let mut seen = Seen::default();
    // Settings that only mean something with a failure rate.
    let mut window_only: Vec<Ident> = Vec::new();
    for m in nested(meta)? {
        let k = key_of(&m)?;
        let text = k.to_string();
        if let Some(unit) = unit_of(&text, "slow_call") {
            seen.add(&k, "slow_call_ms")?;
            slow_duration = Some((duration(&m, &k, unit)?.0, k.span()));
            window_only.push(k);
            continue;
        }
        if let Some(unit) = unit_of(&text, "cooldown") {
            seen.add(&k, "cooldown_ms")?;
            cooldown = Some(duration(&m, &k, unit)?.0);
            continue;
        }
        if let Some(unit) = unit_of(&text, "max_cooldown") {
            seen.add(&k, "max_cooldown_ms")?;
            let (d, span) = duration(&m, &k, unit)?;
            max_cooldown = Some((d, span));
            continue;
        }
        match text.as_str() {
            "consecutive_failures" | "failure_rate" => seen.add(&k, "mode")?,
            "count_window" | "window_s" => seen.add(&k, "window")?,
            _ => seen.add(&k, &text)?,
        }
        match text.as_str() {
            "consecutive_failures" => {
                mode = Some(BreakerMode::Consecutive(count(&m, &k)?));
            }
            "failure_rate" => mode = Some(BreakerMode::Rate(float(&m, &k)?.0)),
            "count_window" => {
                window = Some(Window::Count(count(&m, &k)?));
                window_only.push(k);
            }
            "window_s" => {
                window = Some(Window::Seconds(count(&m, &k)?));
                window_only.push(k);
            }
            "minimum_calls" => {
                minimum_calls = Some(count(&m, &k)?);
                window_only.push(k);
            }
            "slow_call_rate" => {
                slow_rate = Some(float(&m, &k)?.0);
                window_only.push(k);
            }
            "cooldown_growth" => growth = Some((float(&m, &k)?.0, k.span())),
            "half_open_calls" => half_open_calls = Some(count(&m, &k)?),
            _ => return unknown(&k, "`circuit_breaker(...)`", BREAKER_KEYS),
        }
    }
    let Some(mode) = mode else {
        return err(
            meta.span(),
            format!(
                "`{key}` needs `consecutive_failures = N` or `failure_rate = R`, \
                 e.g. `{key}(failure_rate = 0.5, cooldown_s = 30)`"
            ),
        );
    };
    if let (BreakerMode::Consecutive(_), Some(k)) = (&mode, window_only.first()) {
        return err(
            k.span(),
            format!("`{k}` applies to `failure_rate` only, not `consecutive_failures`"),
        );
    }
    if let (None, Some((_, span))) = (slow_rate, slow_duration) {
        return err(span, "a slow-call duration needs `slow_call_rate`");
    }
    let growth = match (growth, max_cooldown) {
        (Some((g, _)), Some((max, _))) => Some((g, max)),
        (Some((_, span)), None) => {
            return err(
                span,
                "`cooldown_growth` needs `max_cooldown_s` (or `max_cooldown_ms`)",
            )
        }
        (None, Some((_, span))) => return err(span, "`max_cooldown` needs `cooldown_growth`"),
        (None, None) => None,
    };
    Ok(CircuitBreaker {
        mode,
        window,
        minimum_calls,
        slow_calls: slow_rate.map(|r| (r, slow_duration.map(|(d, _)| d))),
        cooldown,
        growth,
        half_open_calls,
    })
}

fn bulkhead(meta: &Meta, key: &Ident) -> syn::Result<Bulkhead> {
    let mut max_concurrent = None;
    let mut max_queued: Option<(u32, Span)> = None;
    let mut max_wait: Option<(Dur, Span)> = None;
    let mut lease = None;
    let mut seen = Seen::default();
    for m in nested(meta)? {
        let k = key_of(&m)?;
        let text = k.to_string();
        if let Some(unit) = unit_of(&text, "max_wait") {
            seen.add(&k, "max_wait_ms")?;
            max_wait = Some((duration(&m, &k, unit)?.0, k.span()));
            continue;
        }
        if let Some(unit) = unit_of(&text, "lease") {
            seen.add(&k, "lease_ms")?;
            lease = Some(duration(&m, &k, unit)?.0);
            continue;
        }
        seen.add(&k, &text)?;
        match text.as_str() {
            "max_concurrent" => max_concurrent = Some(count(&m, &k)?),
            "max_queued" => max_queued = Some((int(&m, &k)?, k.span())),
            _ => return unknown(&k, "`bulkhead(...)`", BULKHEAD_KEYS),
        }
    }
    let Some(max_concurrent) = max_concurrent else {
        return err(
            meta.span(),
            format!("`{key}` needs `max_concurrent`, e.g. `{key}(max_concurrent = 10)`"),
        );
    };
    let queue = match (max_queued, max_wait) {
        (Some((0, _)), None) | (None, None) => None,
        (Some((q, _)), Some((w, _))) => Some((q, w)),
        (Some((q, span)), None) => {
            return err(
                span,
                format!("a queue of {q} needs `max_wait_ms` (or `max_wait_s`)"),
            )
        }
        (None, Some((_, span))) => {
            return err(
                span,
                "`max_wait` needs `max_queued`: only queued calls wait",
            )
        }
    };
    Ok(Bulkhead {
        max_concurrent,
        queue,
        lease,
    })
}

fn rate_limiter(meta: &Meta, key: &Ident) -> syn::Result<RateLimiter> {
    let mut limit = None;
    let mut per = None;
    let mut algorithm = Algorithm::Gcra;
    let mut burst: Option<(u32, Span)> = None;
    let mut max_wait = None;
    let mut seen = Seen::default();
    for m in nested(meta)? {
        let k = key_of(&m)?;
        let text = k.to_string();
        if let Some(unit) = unit_of(&text, "per") {
            seen.add(&k, "per_ms")?;
            per = Some(duration(&m, &k, unit)?.0);
            continue;
        }
        if let Some(unit) = unit_of(&text, "max_wait") {
            seen.add(&k, "max_wait_ms")?;
            max_wait = Some(duration(&m, &k, unit)?.0);
            continue;
        }
        seen.add(&k, &text)?;
        match text.as_str() {
            "limit" => limit = Some(count(&m, &k)?),
            "burst" => burst = Some((count(&m, &k)?, k.span())),
            "algorithm" => {
                let s = string(&m, &k)?;
                algorithm = match s.value().as_str() {
                    "gcra" => Algorithm::Gcra,
                    "fixed_window" => Algorithm::FixedWindow,
                    "sliding_window" => Algorithm::SlidingWindow,
                    other => {
                        return err(
                            s.span(),
                            format!(
                                "unknown algorithm \"{other}\"; expected \"gcra\", \
                                 \"fixed_window\" or \"sliding_window\""
                            ),
                        )
                    }
                };
            }
            _ => return unknown(&k, "`rate_limiter(...)`", RATE_KEYS),
        }
    }
    let (Some(limit), Some(per)) = (limit, per) else {
        return err(
            meta.span(),
            format!("`{key}` needs `limit` and `per_s` (or `per_ms`), e.g. `{key}(limit = 100, per_s = 1)`"),
        );
    };
    if let (Some((_, span)), false) = (burst, algorithm == Algorithm::Gcra) {
        return err(span, "`burst` applies to `algorithm = \"gcra\"` only");
    }
    Ok(RateLimiter {
        limit,
        per,
        algorithm,
        burst: burst.map(|(b, _)| b),
        max_wait,
    })
}

fn cooldown(meta: &Meta) -> syn::Result<Cooldown> {
    let mut c = Cooldown::default();
    let mut seen = Seen::default();
    for m in nested(meta)? {
        let k = key_of(&m)?;
        let text = k.to_string();
        if let Some(unit) = unit_of(&text, "max_pause") {
            seen.add(&k, "max_pause_ms")?;
            c.max_pause = Some(duration(&m, &k, unit)?.0);
        } else if let Some(unit) = unit_of(&text, "max_wait") {
            seen.add(&k, "max_wait_ms")?;
            c.max_wait = Some(duration(&m, &k, unit)?.0);
        } else if let Some(unit) = unit_of(&text, "grace") {
            seen.add(&k, "grace_ms")?;
            c.grace = Some(duration(&m, &k, unit)?.0);
        } else {
            return unknown(&k, "`cooldown(...)`", COOLDOWN_KEYS);
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(s: &str) -> syn::Result<Config> {
        parse(s.parse().expect("tokens"))
    }

    fn message(s: &str) -> String {
        match parse_str(s) {
            Ok(_) => panic!("`{s}` was accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn accepts_every_key() {
        let c = parse_str(
            r#"name = "x", timeout_s = 10,
               retry(max_attempts = 5, backoff = "exponential", backoff_ms = 10, multiplier = 3,
                     cap_s = 2, jitter = 20, budget(ratio = 0.2, max_tokens = 10)),
               timeout(ms = 500, strict),
               circuit_breaker(failure_rate = 0.5, window_s = 60, minimum_calls = 10,
                     slow_call_rate = 0.8, slow_call_ms = 900, cooldown_s = 30,
                     cooldown_growth = 2, max_cooldown_s = 300, half_open_calls = 2),
               bulkhead(max_concurrent = 4, max_queued = 8, max_wait_ms = 100, lease_s = 30),
               rate_limiter(limit = 100, per_s = 1, algorithm = "gcra", burst = 10, max_wait_ms = 5),
               cooldown(max_pause_s = 60, max_wait_s = 1, grace_s = 5),
               fallback = Self::later, store = crate::store, clock = crate::clock,
               on_event = crate::log, context = ctx, classify = judge, retry_if = Self::transient,
               abort_if = fatal"#,
        )
        .unwrap();
        assert_eq!(c.steps.len(), 7);
        assert!(c.fallback.is_some() && c.store.is_some() && c.clock.is_some());
        assert_eq!(c.context.unwrap().to_string(), "ctx");
        assert_eq!(c.name.unwrap().value(), "x");
        assert_eq!(c.judges.len(), 3);
    }

    #[test]
    fn bare_policies_take_defaults() {
        let c = parse_str("retry, cooldown").unwrap();
        match &c.steps[0].policy {
            Policy::Retry(r) => {
                assert_eq!(r.max_attempts, 3);
                assert!(r.backoff == BackoffKind::Exponential);
                assert_eq!(r.base.duration(), Duration::from_millis(100));
            }
            _ => panic!("retry expected"),
        }
    }

    #[test]
    fn rejects_bad_syntax() {
        assert!(message("retry(backoff = \"cubic\")").contains("unknown backoff"));
        assert!(message("retry(backoff = \"linear\", multiplier = 2)").contains("exponential"));
        assert!(message("retry(backoff = \"constant\", cap_ms = 5)").contains("no cap"));
        assert!(message("retry(jitter = \"lots\")").contains("unknown jitter"));
        assert!(message("retry(budget(ratio = 0.1))").contains("max_tokens"));
        assert!(message("circuit_breaker(cooldown_s = 3)").contains("needs `consecutive_failures"));
        assert!(
            message("circuit_breaker(consecutive_failures = 3, minimum_calls = 2)")
                .contains("applies to `failure_rate` only")
        );
        assert!(
            message("circuit_breaker(failure_rate = 0.5, cooldown_growth = 2)")
                .contains("max_cooldown")
        );
        assert!(
            message("circuit_breaker(failure_rate = 0.5, slow_call_ms = 10)")
                .contains("slow_call_rate")
        );
        assert!(message("bulkhead(max_queued = 3)").contains("needs `max_concurrent`"));
        assert!(message("bulkhead(max_concurrent = 1, max_queued = 3)").contains("max_wait"));
        assert!(message("rate_limiter(limit = 10)").contains("per_s"));
        assert!(message(
            "rate_limiter(limit = 10, per_s = 1, algorithm = \"fixed_window\", burst = 2)"
        )
        .contains("gcra"));
        assert_eq!(
            message("retry, store = s"),
            "`store` keeps the state of `circuit_breaker`, `bulkhead`, `cooldown` and \
             `rate_limiter`, and this function declares none of them"
        );
        assert!(message("classify = 3").contains("Verdict"));
        assert!(message("timeout = 5").contains("timeout_ms"));
        assert!(message("context = a.b").contains("variable name"));
        assert!(message("retry(max_attempts = \"3\")").contains("integer"));
        assert!(message("retry(max_attempts = -1)").contains("integer"));
        assert!(message("retry(max_attempts = 4294967296)").contains("too large"));
    }

    /// Values are the builder's to judge at `build()`: the attribute passes
    /// them on as written.
    #[test]
    fn leaves_values_to_the_builder() {
        let c = parse_str(
            "timeout_ms = 0, retry(max_attempts = 0, backoff_ms = 500, cap_ms = 100, jitter = 150),
             bulkhead(max_concurrent = 0, lease_s = 1), rate_limiter(limit = 0, per_s = 0)",
        )
        .unwrap();
        assert_eq!(c.steps.len(), 4);
        match &c.steps[1].policy {
            Policy::Retry(r) => {
                assert_eq!(r.max_attempts, 0);
                assert_eq!(r.cap.map(Dur::duration), Some(Duration::from_millis(100)));
            }
            _ => panic!("retry expected"),
        }
        assert!(parse_str("name = \" \"").is_ok());
    }

    #[test]
    fn every_registered_policy_is_a_key() {
        let keys: Vec<&str> = TOP_KEYS.split(',').map(str::trim).collect();
        for kind in PolicyKind::ALL {
            assert!(keys.contains(&kind.name()), "{kind:?}");
            // Known: the error is about its settings, not an unknown key.
            let e = parse_str(&format!("{}(x = 1)", kind.name())).err();
            assert!(
                e.is_none_or(|e| !e.to_string().contains("#[resilient(...)]")),
                "{kind:?}"
            );
        }
    }

    #[test]
    fn rejects_unknown_and_repeated_keys() {
        assert!(message("retries = 3").contains("unknown key `retries`"));
        assert!(message("retry(max_tries = 3)").contains("unknown key `max_tries` in `retry(...)`"));
        assert!(message("retry(backoff_ms = 1, backoff_s = 1)").contains("set the same value"));
        assert!(message("retry(max_attempts = 2, max_attempts = 3)").contains("given twice"));
        assert!(message("fallback = a, fallback = b").contains("given twice"));
    }

    #[test]
    fn checks_the_order_of_policies() {
        assert!(message("circuit_breaker(consecutive_failures = 3), retry")
            .contains("must be declared after `retry`"));
        assert!(message("retry, retry").contains("declared twice"));
        assert!(message("timeout_ms = 1, timeout_ms = 2").contains("already declared"));
        assert!(parse_str("timeout_ms = 1000, retry, timeout_ms = 100").is_ok());
        assert!(message("retry, timeout_ms = 1, timeout_ms = 2").contains("after `retry`"));
        assert!(
            parse_str("retry, circuit_breaker(consecutive_failures = 3), timeout_ms = 5").is_ok()
        );
        // The first stateful policy written before the retry is the one named.
        let e = message(
            "bulkhead(max_concurrent = 1), circuit_breaker(consecutive_failures = 3), retry",
        );
        assert!(
            e.starts_with("`bulkhead` must be declared after `retry`"),
            "{e}"
        );
        assert!(message("timeout_ms = 1, timeout_s = 2, retry").contains("already declared:"));
    }
}
