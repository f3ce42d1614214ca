//! Parsing of the attribute's arguments.
//!
//! The policies, their keys, units and value kinds are `seawall_order`'s
//! table: a policy's key list is read by [`read`] from its registered
//! settings, and the order of policies is checked by
//! [`seawall_order::check`] (the builder's own check) so that an error
//! points at the key. Each policy's own words (its defaults, the keys that
//! go together, its expression) are in [`crate::policies`]. The values are
//! not checked here: the expansion hands them to the builder, whose
//! `build()` applies each policy's rules.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use seawall_order::{
    self as order, attribute_keys, check, PolicyKind, Rule, Scope, Setting, Value,
};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, ExprPath, Ident, Lit, LitStr, Meta, Token};

use crate::policies::{policy, Built};

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
    /// `coalesce_key = expr`: the key of a coalesced call, an expression of
    /// the function's arguments (`Into<seawall::PartitionKey>`).
    pub(crate) coalesce_key: Option<(Ident, Expr)>,
}

/// One policy and the key that declared it (errors point at the key).
pub(crate) struct Step {
    pub(crate) key: Ident,
    pub(crate) kind: PolicyKind,
    /// The expression of its settings and whether it can refuse calls.
    pub(crate) policy: Built,
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
    pub(crate) fn millis(value: u64) -> Self {
        Dur {
            value,
            unit: Unit::Millis,
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

#[derive(Clone, Copy)]
pub(crate) enum JitterKind {
    None,
    Full,
    Equal,
    Percent(f64),
}

/// The keys of `#[resilient(...)]` that are not policies.
const OTHER_KEYS: &str = "policy, fallback, classify, retry_if, abort_if, name, store, clock, \
     on_event, context, coalesce_key";

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

pub(crate) fn err<T>(span: Span, msg: impl std::fmt::Display) -> syn::Result<T> {
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
        coalesce_key: None,
    };
    let mut seen = Seen::default();
    for meta in &metas {
        let key = key_of(meta)?;
        let text = key.to_string();
        if let Some(kind) = PolicyKind::from_name(&text) {
            let policy = policy(kind, &read_policy(meta, kind)?, meta.span(), &key)?;
            config.steps.push(Step { key, kind, policy });
            continue;
        }
        if let Some((kind, given)) = shorthand(meta, &key)? {
            let policy = policy(kind, &Given(vec![given]), meta.span(), &key)?;
            config.steps.push(Step { key, kind, policy });
            continue;
        }
        match text.as_str() {
            // A policy written in code: a function returning it, declared
            // here in list order; its position is its own, checked by
            // `build()` (the attribute cannot know it).
            "policy" => {
                let make = path(
                    meta,
                    &key,
                    "a function returning a `seawall::custom::Policy`",
                )?;
                let value = quote::quote!(#make());
                config.steps.push(Step {
                    key,
                    kind: PolicyKind::CustomCall,
                    policy: Built {
                        value,
                        rejects: true,
                    },
                });
            }
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
            "coalesce_key" => {
                seen.add(&key, "coalesce_key")?;
                let expr = value(meta, &key)?.clone();
                config.coalesce_key = Some((key.clone(), expr));
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
    if let Some((key, _)) = &config.coalesce_key {
        if !config.steps.iter().any(|s| s.kind == PolicyKind::Coalesce) {
            return err(
                key.span(),
                "`coalesce_key` is the key of coalesced calls: declare `coalesce` first, \
                 e.g. `coalesce(ttl_s = 30), coalesce_key = *id`",
            );
        }
    }
    if let Some(store) = &config.store {
        if !config.steps.iter().any(|s| s.kind.is_stateful()) {
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
    // Policies written in code declare their position in code: `build()`
    // checks them; the rest is checked here.
    let steps: Vec<&Step> = steps.iter().filter(|s| !s.kind.is_custom()).collect();
    let kinds: Vec<PolicyKind> = steps.iter().map(|s| s.kind).collect();
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
        Rule::BeforeRetry { retry } => format!(
            "`{}` is declared before `{}`; {reason}",
            e.kind.name(),
            retry.name()
        ),
        Rule::RetryAndHedging { .. } => {
            let other = match e.kind {
                PolicyKind::Hedging => PolicyKind::Retry,
                _ => PolicyKind::Hedging,
            };
            format!(
                "`{}` is declared with `{}`; {reason}",
                e.kind.name(),
                other.name()
            )
        }
        Rule::NotFirst => format!(
            "`{}` is declared after another policy; {reason}",
            e.kind.name()
        ),
        // Rules of policies written in code, which the attribute does not
        // declare.
        Rule::AfterRetry
        | Rule::InsideCallPolicy { .. }
        | Rule::OutsideAttemptPolicy { .. }
        | Rule::InsideChaos { .. } => format!("`{}` is misplaced; {reason}", e.kind.name()),
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
    Shares(Vec<(String, f64)>),
}

/// The settings of one list, in the order written.
pub(crate) struct Given(Vec<Written>);

impl Given {
    pub(crate) fn get(&self, key: &str) -> Option<&Written> {
        self.0.iter().find(|w| w.setting.key == key)
    }

    pub(crate) fn count(&self, key: &str) -> Option<u32> {
        match self.get(key)?.value {
            Read::Count(n) => Some(n),
            _ => None,
        }
    }

    pub(crate) fn number(&self, key: &str) -> Option<f64> {
        match self.get(key)?.value {
            Read::Number(v) => Some(v),
            _ => None,
        }
    }

    pub(crate) fn flag(&self, key: &str) -> Option<bool> {
        match self.get(key)?.value {
            Read::Flag(b) => Some(b),
            _ => None,
        }
    }

    pub(crate) fn duration(&self, key: &str) -> Option<Dur> {
        match self.get(key)?.value {
            Read::Duration(d) => Some(d),
            _ => None,
        }
    }

    pub(crate) fn choice(&self, key: &str) -> Option<&str> {
        match &self.get(key)?.value {
            Read::Choice(c) => Some(c),
            _ => None,
        }
    }

    pub(crate) fn shares(&self, key: &str) -> Option<&[(String, f64)]> {
        match &self.get(key)?.value {
            Read::Shares(s) => Some(s),
            _ => None,
        }
    }

    pub(crate) fn jitter(&self, key: &str) -> Option<JitterKind> {
        match self.get(key)?.value {
            Read::Jitter(j) => Some(j),
            _ => None,
        }
    }

    pub(crate) fn table(&self, key: &str) -> Option<(&Given, Span)> {
        let w = self.get(key)?;
        match &w.value {
            Read::Table(t) => Some((t, w.whole)),
            _ => None,
        }
    }

    /// The key's span, where an error about the setting points.
    pub(crate) fn key_span(&self, key: &str) -> Option<Span> {
        self.get(key).map(|w| w.key.span())
    }

    pub(crate) fn value_span(&self, key: &str) -> Option<Span> {
        self.get(key).map(|w| w.span)
    }

    /// The key of the first of `keys` written.
    pub(crate) fn first_of(&self, keys: &[&str]) -> Option<&Ident> {
        self.0
            .iter()
            .find(|w| keys.contains(&w.setting.key))
            .map(|w| &w.key)
    }

    /// Two settings that set the same value (the second one written is
    /// named).
    pub(crate) fn exclusive(&self, a: &str, b: &str) -> syn::Result<()> {
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
        Value::Shares => Read::Shares(shares(meta, key)?),
    })
}

/// Names with their shares, `"live=0.9,batch=0.1"`: the syntax is checked
/// here, the values by `build()`.
fn shares(meta: &Meta, key: &Ident) -> syn::Result<Vec<(String, f64)>> {
    let s = string(meta, key)?;
    let text = s.value();
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let parsed = part
            .split_once('=')
            .and_then(|(n, v)| Some((n.trim(), v.trim().parse::<f64>().ok()?)))
            .filter(|(n, _)| !n.is_empty());
        let Some((name, share)) = parsed else {
            return err(
                s.span(),
                format!(
                    "`{key}` expects names with shares, e.g. `{key} = \"live=0.9,batch=0.1\"`; \
                     got `{part}`"
                ),
            );
        };
        out.push((name.to_owned(), share));
    }
    Ok(out)
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

    /// A step's expression, without spaces.
    fn value(step: &Step) -> String {
        step.policy.value.to_string().replace(' ', "")
    }

    #[test]
    fn bare_policies_take_defaults() {
        let c = parse_str("retry, cooldown").unwrap();
        assert!(value(&c.steps[0]).starts_with(
            "::seawall::Retry::exponential(::core::time::Duration::from_millis(100u64)).max_attempts(3u32)"
        ));
        assert_eq!(value(&c.steps[1]), "::seawall::Cooldown::new()");
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
        let retry = value(&c.steps[1]);
        assert!(retry.contains(".max_attempts(0u32)"), "{retry}");
        assert!(
            retry.contains(".cap(::core::time::Duration::from_millis(100u64))"),
            "{retry}"
        );
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
                PolicyKind::Chaos => "chaos(rate = 0.5, latency_ms = 1)",
                PolicyKind::AdaptiveLimit => "adaptive_limit(algorithm = \"aimd\")",
                PolicyKind::Coalesce => "coalesce",
                PolicyKind::Hedging => "hedging(delay_ms = 10)",
                // Not in the table's `ALL`: policies written in code are
                // declared with the builder.
                PolicyKind::CustomCall | PolicyKind::CustomAttempt => continue,
            };
            let c = parse_str(minimal).unwrap();
            assert_eq!(c.steps.len(), 1);
            assert_eq!(c.steps[0].kind, kind);
            assert_eq!(c.steps[0].key, name);
        }
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
            "unknown key `tokens` in `budget(...)`; expected one of: ratio, max_tokens, shared"
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
    fn coalesce_is_written_first_with_its_key() {
        let c = parse_str("coalesce(ttl_s = 30, max_entries = 100), retry, coalesce_key = *id")
            .unwrap();
        assert_eq!(c.steps.len(), 2);
        let v = c.steps[0].policy.value.to_string();
        assert!(
            v.contains(". ttl (:: core :: time :: Duration :: from_secs (30u64))"),
            "{v}"
        );
        assert!(v.contains(". max_entries (100u32)"), "{v}");
        assert!(c.coalesce_key.is_some());
        let e = message("retry, coalesce");
        assert!(
            e.starts_with("`coalesce` is declared after another policy"),
            "{e}"
        );
        let e = message("retry, coalesce_key = id");
        assert!(
            e.starts_with("`coalesce_key` is the key of coalesced calls"),
            "{e}"
        );
    }

    #[test]
    fn chaos_is_written_after_the_retry() {
        assert!(parse_str("retry, chaos(rate = 0.5, latency_ms = 10)").is_ok());
        assert!(parse_str("chaos(rate = 0.5, latency_ms = 10)").is_ok());
        let e = message("chaos(rate = 0.5, latency_ms = 10), retry");
        assert!(e.starts_with("`chaos` is declared before `retry`"), "{e}");
        let e = message("retry, chaos(rate = 0.5)");
        assert!(e.contains("needs `rate` and a latency"), "{e}");
    }

    #[test]
    fn checks_the_order_of_policies() {
        // A stateful policy may stand on either side of the retry, once.
        assert!(parse_str("circuit_breaker(consecutive_failures = 3), retry").is_ok());
        let twice = message("bulkhead(max_concurrent = 1), retry, bulkhead(max_concurrent = 2)");
        assert!(twice.contains("twice"), "{twice}");
        assert!(message("retry, retry").contains("declared twice"));
        assert!(message("timeout_ms = 1, timeout_ms = 2").contains("already declared"));
        assert!(parse_str("timeout_ms = 1000, retry, timeout_ms = 100").is_ok());
        assert!(message("retry, timeout_ms = 1, timeout_ms = 2").contains("after `retry`"));
        assert!(
            parse_str("retry, circuit_breaker(consecutive_failures = 3), timeout_ms = 5").is_ok()
        );
        assert!(parse_str(
            "bulkhead(max_concurrent = 1), circuit_breaker(consecutive_failures = 3), retry",
        )
        .is_ok());
        assert!(message("timeout_ms = 1, timeout_s = 2, retry").contains("already declared:"));
    }
}
