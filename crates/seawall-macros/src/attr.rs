//! Parsing of the attribute's arguments.
//!
//! The policies, their keys, units and value kinds are `seawall_order`'s
//! table: a policy's key list is read by [`read`] from its registered
//! settings, and the order of policies is checked by
//! [`seawall_order::check`] (the builder's own check) so that an error
//! points at the key. Here are only the attribute's own words: its
//! defaults and the keys that go together, one function per policy. The
//! values are not checked here: the expansion hands them to the builder,
//! whose `build()` applies each policy's rules.

#[cfg(test)]
use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use quote::quote;
use seawall_order::{
    self as order, attribute_keys, check, PolicyKind, Rule, Scope, Setting, Value,
};
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
    Duration(Dur),
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

/// The keys of `#[resilient(...)]` that are not policies.
const OTHER_KEYS: &str =
    "fallback, classify, retry_if, abort_if, name, store, clock, on_event, context";

/// Every top-level key: each registered policy (a policy with a shorthand
/// also as `{name}_ms` and `{name}_s`), then the other keys.
fn top_keys() -> String {
    let mut keys: Vec<String> = Vec::new();
    for kind in PolicyKind::ALL {
        if let Some(s) = shorthand_setting(*kind) {
            keys.extend(s.attribute_keys());
        }
        keys.push(kind.name().to_owned());
    }
    keys.push(OTHER_KEYS.to_owned());
    keys.join(", ")
}

/// A policy's shorthand setting, spelled at the top level after the
/// policy (`timeout_ms`, `timeout_s`).
fn shorthand_setting(kind: PolicyKind) -> Option<Setting> {
    kind.shorthand().map(|s| s.attr(kind.name()))
}

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
        if let Some(kind) = PolicyKind::from_name(&text) {
            let policy = policy(kind, read_policy(meta, kind)?, meta.span(), &key)?;
            config.steps.push(Step { key, policy });
            continue;
        }
        if let Some((kind, given)) = shorthand(meta, &key)? {
            let policy = policy(kind, Given(vec![given]), meta.span(), &key)?;
            config.steps.push(Step { key, policy });
            continue;
        }
        match text.as_str() {
            "fallback" => {
                seen.add(&key, "fallback")?;
                config.fallback = Some(path(meta, &key, "a function")?);
            }
            "name" => {
                seen.add(&key, "name")?;
                config.name = Some(string(meta, &key)?);
            }
            "store" => {
                seen.add(&key, "store")?;
                config.store = Some(path(meta, &key, "a function returning the store")?);
            }
            "clock" => {
                seen.add(&key, "clock")?;
                config.clock = Some(path(meta, &key, "a function returning the clock")?);
            }
            "on_event" => {
                seen.add(&key, "on_event")?;
                config.on_event = Some(path(meta, &key, "a function taking `&seawall::Event`")?);
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
            }
            _ => return unknown(&key, "#[resilient(...)]", &top_keys()),
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

// ------------------------------------------------------------ settings

/// One setting as written, read by its entry in `seawall_order`'s table.
pub(crate) struct Written {
    setting: &'static Setting,
    key: Ident,
    /// The value's span (the key's for a bare flag).
    span: Span,
    /// The span of the whole `key = value` or `key(...)`.
    whole: Span,
    value: Read,
}

enum Read {
    Count(u32),
    Number(f64),
    Flag(bool),
    Duration(Dur),
    Choice(String),
    Jitter(JitterKind),
    Table(Given),
}

/// The settings of one list, in the order written.
pub(crate) struct Given(Vec<Written>);

impl Given {
    fn get(&self, key: &str) -> Option<&Written> {
        self.0.iter().find(|w| w.setting.key == key)
    }

    fn count(&self, key: &str) -> Option<u32> {
        match self.get(key)?.value {
            Read::Count(n) => Some(n),
            _ => None,
        }
    }

    fn number(&self, key: &str) -> Option<f64> {
        match self.get(key)?.value {
            Read::Number(v) => Some(v),
            _ => None,
        }
    }

    fn flag(&self, key: &str) -> Option<bool> {
        match self.get(key)?.value {
            Read::Flag(b) => Some(b),
            _ => None,
        }
    }

    fn duration(&self, key: &str) -> Option<Dur> {
        match self.get(key)?.value {
            Read::Duration(d) => Some(d),
            _ => None,
        }
    }

    fn choice(&self, key: &str) -> Option<&str> {
        match &self.get(key)?.value {
            Read::Choice(c) => Some(c),
            _ => None,
        }
    }

    fn jitter(&self, key: &str) -> Option<JitterKind> {
        match self.get(key)?.value {
            Read::Jitter(j) => Some(j),
            _ => None,
        }
    }

    fn table(&self, key: &str) -> Option<(&Given, Span)> {
        let w = self.get(key)?;
        match &w.value {
            Read::Table(t) => Some((t, w.whole)),
            _ => None,
        }
    }

    /// The key's span, where an error about the setting points.
    fn key_span(&self, key: &str) -> Option<Span> {
        self.get(key).map(|w| w.key.span())
    }

    fn value_span(&self, key: &str) -> Option<Span> {
        self.get(key).map(|w| w.span)
    }

    /// Two settings that set the same value (the second one written is
    /// named).
    fn exclusive(&self, a: &str, b: &str) -> syn::Result<()> {
        let mut both = self
            .0
            .iter()
            .filter(|w| w.setting.key == a || w.setting.key == b);
        if let (Some(first), Some(second)) = (both.next(), both.next()) {
            return err(
                second.key.span(),
                format!(
                    "`{}` and `{}` set the same value: give one of them",
                    second.key, first.key
                ),
            );
        }
        Ok(())
    }
}

/// Reads the settings of `policy(...)` by the policy's entry in the table.
fn read_policy(meta: &Meta, kind: PolicyKind) -> syn::Result<Given> {
    if let (Meta::NameValue(nv), Some(short)) = (meta, shorthand_setting(kind)) {
        let name = kind.name();
        let spelled: Vec<String> = short
            .attribute_keys()
            .iter()
            .map(|k| format!("`{k} = ..`"))
            .collect();
        let listed: Vec<String> = kind
            .settings()
            .iter()
            .map(|s| match s.value {
                Value::Flag => s.attr.to_owned(),
                _ => format!("{} = ..", s.attribute_keys()[0]),
            })
            .collect();
        return err(
            nv.eq_token.span,
            format!(
                "write {} or `{name}({})`",
                spelled.join(", "),
                listed.join(", ")
            ),
        );
    }
    read(meta, &format!("`{}(...)`", kind.name()), kind.settings())
}

/// A top-level `{policy}_ms = ..` / `{policy}_s = ..`: the policy given by
/// its shorthand setting alone.
fn shorthand(meta: &Meta, key: &Ident) -> syn::Result<Option<(PolicyKind, Written)>> {
    let text = key.to_string();
    for &kind in PolicyKind::ALL {
        let (Some(spelled), Some(setting)) = (shorthand_setting(kind), kind.shorthand()) else {
            continue;
        };
        if let Some(unit) = spelled.attribute_unit(&text) {
            let value = read_value(meta, key, setting, unit)?;
            let span = self::value(meta, key).map_or(key.span(), |v| v.span());
            return Ok(Some((
                kind,
                Written {
                    setting,
                    key: key.clone(),
                    span,
                    whole: meta.span(),
                    value,
                },
            )));
        }
    }
    Ok(None)
}

/// Reads a list of settings: every key must be one of `settings`, given
/// once, with a value of its kind.
fn read(meta: &Meta, list: &str, settings: &'static [Setting]) -> syn::Result<Given> {
    let mut seen = Seen::default();
    let mut given = Vec::new();
    for m in nested(meta)? {
        let key = key_of(&m)?;
        let text = key.to_string();
        let Some((setting, unit)) = settings
            .iter()
            .find_map(|s| s.attribute_unit(&text).map(|u| (s, u)))
        else {
            return unknown(&key, list, &attribute_keys(settings));
        };
        seen.add(&key, setting.key)?;
        let value = read_value(&m, &key, setting, unit)?;
        let span = match &m {
            Meta::NameValue(nv) => nv.value.span(),
            _ => key.span(),
        };
        given.push(Written {
            setting,
            key,
            span,
            whole: m.span(),
            value,
        });
    }
    Ok(Given(given))
}

fn read_value(
    meta: &Meta,
    key: &Ident,
    setting: &'static Setting,
    unit: Option<order::Unit>,
) -> syn::Result<Read> {
    Ok(match setting.value {
        Value::Count => Read::Count(count(meta, key)?),
        Value::Number => Read::Number(float(meta, key)?.0),
        Value::Flag => Read::Flag(flag(meta, key)?),
        Value::Duration(_) => {
            let unit = match unit {
                Some(order::Unit::Seconds) => Unit::Secs,
                _ => Unit::Millis,
            };
            Read::Duration(duration(meta, key, unit)?.0)
        }
        Value::Choice(choices) => {
            let s = string(meta, key)?;
            let v = s.value();
            if !choices.contains(&v.as_str()) {
                let quoted: Vec<String> = choices.iter().map(|c| format!("\"{c}\"")).collect();
                let list = match quoted.split_last() {
                    Some((last, others)) if !others.is_empty() => {
                        format!("{} or {last}", others.join(", "))
                    }
                    _ => quoted.concat(),
                };
                return err(s.span(), format!("unknown {key} \"{v}\"; expected {list}"));
            }
            Read::Choice(v)
        }
        Value::Jitter => Read::Jitter(jitter(meta, key)?),
        Value::Table(nested) => Read::Table(read(meta, &format!("`{key}(...)`"), nested)?),
    })
}

fn jitter(meta: &Meta, key: &Ident) -> syn::Result<JitterKind> {
    let expr = value(meta, key)?;
    Ok(match literal(expr) {
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
        Some(Lit::Int(_) | Lit::Float(_)) => JitterKind::Percent(float(meta, key)?.0),
        _ => {
            return err(
                expr.span(),
                format!(
                "`{key}` expects \"none\", \"full\", \"equal\" or a percentage, e.g. `{key} = 20`"
            ),
            )
        }
    })
}

// ------------------------------------------------------------ policies

/// A registered policy from its settings: the attribute's defaults and the
/// rules between its keys. The match is exhaustive: a policy registered in
/// `seawall_order` and not worded here does not compile.
fn policy(kind: PolicyKind, given: Given, span: Span, key: &Ident) -> syn::Result<Policy> {
    Ok(match kind {
        PolicyKind::Timeout => Policy::Timeout(timeout(&given, span, key)?),
        PolicyKind::Retry => Policy::Retry(retry(&given)?),
        PolicyKind::CircuitBreaker => Policy::CircuitBreaker(circuit_breaker(&given, span, key)?),
        PolicyKind::Bulkhead => Policy::Bulkhead(bulkhead(&given, span, key)?),
        PolicyKind::Cooldown => Policy::Cooldown(cooldown(&given)),
        PolicyKind::RateLimiter => Policy::RateLimiter(rate_limiter(&given, span, key)?),
    })
}

/// The attribute's words for the retry's backoffs (the table's choices).
const BACKOFFS: [(&str, BackoffKind); 4] = [
    ("constant", BackoffKind::Constant),
    ("linear", BackoffKind::Linear),
    ("exponential", BackoffKind::Exponential),
    ("decorrelated", BackoffKind::Decorrelated),
];

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

fn retry(g: &Given) -> syn::Result<Retry> {
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
    let budget = match g.table("budget") {
        None => None,
        Some((b, span)) => match (b.number("ratio"), b.count("max_tokens")) {
            (Some(r), Some(t)) => Some((r, t)),
            _ => {
                return err(
                    span,
                    "`budget` needs both `ratio` and `max_tokens`, e.g. `budget(ratio = 0.2, max_tokens = 10)`",
                )
            }
        },
    };
    Ok(Retry {
        max_attempts: g.count("max_attempts").unwrap_or(3),
        backoff,
        base: g.duration("delay").unwrap_or(Dur::millis(100)),
        multiplier: g.number("multiplier"),
        cap: g.duration("cap"),
        jitter: g.jitter("jitter").unwrap_or(JitterKind::None),
        budget,
    })
}

fn timeout(g: &Given, span: Span, key: &Ident) -> syn::Result<Timeout> {
    match g.duration("duration") {
        Some(after) => Ok(Timeout {
            after,
            strict: g.flag("strict").unwrap_or(false),
        }),
        None => err(
            span,
            format!("`{key}` needs a duration: `timeout(ms = ..)` or `timeout(s = ..)`"),
        ),
    }
}

fn circuit_breaker(g: &Given, span: Span, key: &Ident) -> syn::Result<CircuitBreaker> {
    g.exclusive("consecutive_failures", "failure_rate")?;
    g.exclusive("count_window", "window")?;
    let mode = match (g.count("consecutive_failures"), g.number("failure_rate")) {
        (Some(n), _) => BreakerMode::Consecutive(n),
        (None, Some(r)) => BreakerMode::Rate(r),
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
    const WINDOW_ONLY: [&str; 5] = [
        "count_window",
        "window",
        "minimum_calls",
        "slow_call_rate",
        "slow_call_duration",
    ];
    if let (BreakerMode::Consecutive(_), Some(w)) = (
        &mode,
        g.0.iter().find(|w| WINDOW_ONLY.contains(&w.setting.key)),
    ) {
        let k = &w.key;
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
    let window = match (g.count("count_window"), g.duration("window")) {
        (Some(n), _) => Some(Window::Count(n)),
        (None, Some(d)) => Some(Window::Duration(d)),
        (None, None) => None,
    };
    Ok(CircuitBreaker {
        mode,
        window,
        minimum_calls: g.count("minimum_calls"),
        slow_calls: slow_rate.map(|r| (r, g.duration("slow_call_duration"))),
        cooldown: g.duration("cooldown"),
        growth,
        half_open_calls: g.count("half_open_calls"),
    })
}

fn bulkhead(g: &Given, span: Span, key: &Ident) -> syn::Result<Bulkhead> {
    let Some(max_concurrent) = g.count("max_concurrent") else {
        return err(
            span,
            format!("`{key}` needs `max_concurrent`, e.g. `{key}(max_concurrent = 10)`"),
        );
    };
    let queue = match (g.count("max_queued"), g.duration("max_wait")) {
        (Some(0) | None, None) => None,
        (Some(q), Some(w)) => Some((q, w)),
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
    };
    Ok(Bulkhead {
        max_concurrent,
        queue,
        lease: g.duration("lease"),
    })
}

fn rate_limiter(g: &Given, span: Span, key: &Ident) -> syn::Result<RateLimiter> {
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
    Ok(RateLimiter {
        limit,
        per,
        algorithm,
        burst: g.count("burst"),
        max_wait: g.duration("max_wait"),
    })
}

fn cooldown(g: &Given) -> Cooldown {
    Cooldown {
        max_pause: g.duration("max_pause"),
        max_wait: g.duration("max_wait"),
        grace: g.duration("grace"),
    }
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

    /// Every policy of `seawall_order`'s table is a key of the attribute,
    /// reads its settings by the table (an unknown setting lists exactly
    /// the table's keys) and becomes a step of its kind.
    #[test]
    fn every_registered_policy_is_a_key() {
        let top = top_keys();
        let keys: Vec<&str> = top.split(',').map(str::trim).collect();
        for &kind in PolicyKind::ALL {
            let name = kind.name();
            assert!(keys.contains(&name), "{kind:?}");
            assert_eq!(
                message(&format!("{name}(x = 1)")),
                format!(
                    "unknown key `x` in `{name}(...)`; expected one of: {}",
                    attribute_keys(kind.settings())
                )
            );
            // The smallest declaration of each policy; a new policy fails
            // to compile here until it is given one.
            let minimal = match kind {
                PolicyKind::Timeout => "timeout(ms = 10)",
                PolicyKind::Retry => "retry",
                PolicyKind::CircuitBreaker => "circuit_breaker(consecutive_failures = 3)",
                PolicyKind::Bulkhead => "bulkhead(max_concurrent = 1)",
                PolicyKind::Cooldown => "cooldown",
                PolicyKind::RateLimiter => "rate_limiter(limit = 1, per_s = 1)",
            };
            let c = parse_str(minimal).unwrap();
            assert_eq!(c.steps.len(), 1);
            assert_eq!(c.steps[0].policy.kind(), kind);
            assert_eq!(c.steps[0].key, name);
        }
    }

    /// Every setting of the table is read by the attribute.
    #[test]
    fn every_registered_setting_is_read() {
        let c = parse_str(
            r#"timeout(s = 1, strict = false),
               retry(max_attempts = 2, backoff = "decorrelated", backoff_s = 1, cap_ms = 9,
                     jitter = "equal", budget(ratio = 0.5, max_tokens = 2)),
               circuit_breaker(failure_rate = 0.5, count_window = 10, minimum_calls = 1,
                     slow_call_rate = 0.5, slow_call_s = 1, cooldown_ms = 1,
                     cooldown_growth = 2, max_cooldown_s = 3, half_open_calls = 2),
               bulkhead(max_concurrent = 1, max_queued = 1, max_wait_s = 1, lease_ms = 5),
               cooldown(max_pause_ms = 1, max_wait_ms = 2, grace_ms = 3),
               rate_limiter(algorithm = "sliding_window", limit = 1, per_ms = 10, max_wait_s = 2)"#,
        )
        .unwrap();
        assert_eq!(c.steps.len(), 6);
        match &c.steps[5].policy {
            Policy::RateLimiter(r) => {
                assert!(r.algorithm == Algorithm::SlidingWindow);
                assert_eq!(r.per.duration(), Duration::from_millis(10));
                assert_eq!(r.max_wait.map(Dur::duration), Some(Duration::from_secs(2)));
            }
            _ => panic!("rate limiter expected"),
        }
        match &c.steps[4].policy {
            Policy::Cooldown(c) => {
                let got = [c.max_pause, c.max_wait, c.grace].map(|d| d.map(Dur::duration));
                assert_eq!(got, [1, 2, 3].map(|ms| Some(Duration::from_millis(ms))));
            }
            _ => panic!("cooldown expected"),
        }
        match &c.steps[0].policy {
            Policy::Timeout(t) => assert_eq!(
                (t.after.duration(), t.strict),
                (Duration::from_secs(1), false)
            ),
            _ => panic!("timeout expected"),
        }
    }

    /// Every registered setting is read by an assembler above (a key of
    /// the table nobody reads would be accepted and ignored).
    #[test]
    fn every_registered_setting_is_used() {
        let source = include_str!("attr.rs");
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
                    code.contains(&format!("(\"{key}\")")),
                    "{kind:?}.{key} is never read"
                );
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

    #[test]
    fn a_setting_given_twice_under_two_keys() {
        assert!(
            message("circuit_breaker(failure_rate = 0.5, consecutive_failures = 3)")
                .starts_with("`consecutive_failures` and `failure_rate` set the same value")
        );
        assert!(
            message("circuit_breaker(failure_rate = 0.5, window_s = 3, count_window = 3)")
                .starts_with("`count_window` and `window_s` set the same value")
        );
        assert!(message("rate_limiter(limit = 1, per_s = 1, per_ms = 3)")
            .starts_with("`per_ms` and `per_s` set the same value"));
        assert!(
            message("circuit_breaker(failure_rate = 0.5, window_ms = 3)")
                .starts_with("unknown key `window_ms` in `circuit_breaker(...)`")
        );
        assert_eq!(
            message("retry(budget(ratio = 1, tokens = 2))"),
            "unknown key `tokens` in `budget(...)`; expected one of: ratio, max_tokens"
        );
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
