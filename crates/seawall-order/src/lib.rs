//! The policies of a [seawall](https://crates.io/crates/seawall) pipeline,
//! where each may stand and how its settings are written, stated once.
//!
//! A pipeline is a list of policies in declaration order, outermost first.
//! This crate holds the table of policies ([`PolicyKind`], one entry each):
//! each policy's name, where it may stand ([`Place`]) and its settings
//! ([`Setting`]: the key, the attribute's spelling, the kind of value). It
//! also states what a policy covers at its position ([`scope`]) and checks
//! a whole list ([`check`]). The pipeline builder, the configuration files
//! and the `#[resilient]` attribute all read this table and call these
//! functions, and only word the answer in their own vocabulary; none of
//! them restates a rule, a key or a value kind. It has no dependencies so
//! that the proc-macro crate can use it at compile time.
//!
//! The fallback is not part of the list: it is always outermost, wherever it
//! is declared.
//!
//! A policy written in code (`seawall::custom`) has no entry of its own: it
//! declares a position, one of the table's entries after `@custom`
//! ([`PolicyKind::CUSTOM`]: around the whole call, [`Place::AroundCall`];
//! around each attempt, [`Place::AroundAttempt`]), and is checked as that
//! entry, any number of times. These entries have no name of their own in
//! the surfaces (the builder and the files name such a policy by its own
//! name) and are not in [`PolicyKind::ALL`].
//!
//! # Adding a policy
//! 1. **Its module** in `seawall` (`src/<policy>/`): the settings type
//!    with its setters and `validate()` (the numeric rules, reached by every
//!    surface through `build()`), its pure rules and, for a policy that
//!    guards calls or attempts, its cell and its place in the engine and
//!    stores.
//! 2. **One entry in the `policies!` table below**: its name, its
//!    [`Place`], its name after the retry if it may stand on either side,
//!    and its settings (key, attribute spelling, [`Value`] kind). From it
//!    come the order check, the configuration file's section (its keys,
//!    value kinds, unknown-key errors, the names of `policies` and their
//!    default order) and the attribute's keys (units, value parsing,
//!    `expected one of` lists).
//! 3. **The compiler lists the rest**: exhaustive matches on
//!    [`PolicyKind`], each the policy worded in one surface's vocabulary:
//!    - `seawall/src/pipeline/declare.rs`: a line of `declared!`, its
//!      `Validate` impl (a call of its `validate()`) and its role in
//!      `sort`; its method in `builder.rs` (public API);
//!    - `seawall/src/config/policies.rs`, `resolve`: the section into
//!      the value (the file's defaults, required keys, keys that go
//!      together);
//!    - `seawall-macros/src/policies.rs`, `policy`: the same in the
//!      attribute's words, and the expression of the settings;
//!    - the registration tests (`every_registered_policy_is_*`): the
//!      smallest declaration of the policy in the builder, a file and the
//!      attribute.
//!
//!    The tests then check that the builder, the configuration files and
//!    the attribute know every entry, that each surface reads every
//!    registered setting, and that each setting is documented
//!    (`seawall/src/config/mod.rs`, `seawall-macros/src/resilient.md`).
//!
//! This crate is an implementation detail of seawall. Its enums are
//! exhaustive on purpose: a new policy or rule makes the compiler point at
//! every place that must word it.
//!
//! ```
//! use seawall_order::{check, guards, scope, PolicyKind, Rule, Scope};
//!
//! let declared = [PolicyKind::Timeout, PolicyKind::Retry, PolicyKind::Timeout];
//! assert_eq!(check(&declared), Ok(()));
//! assert_eq!(scope(&declared, 0), Scope::Call);
//! assert_eq!(scope(&declared, 2), Scope::Attempt);
//!
//! // A stateful policy guards the whole call before the retry, each
//! // attempt after it.
//! assert_eq!(check(&[PolicyKind::Bulkhead, PolicyKind::Retry]), Ok(()));
//! assert_eq!(guards(&[PolicyKind::Bulkhead, PolicyKind::Retry], 0), Scope::Call);
//! assert_eq!(guards(&[PolicyKind::Retry, PolicyKind::Bulkhead], 1), Scope::Attempt);
//!
//! let e = check(&[PolicyKind::Bulkhead, PolicyKind::Retry, PolicyKind::Bulkhead]).unwrap_err();
//! assert_eq!((e.at, e.kind), (2, PolicyKind::Bulkhead));
//! assert_eq!(e.rule, Rule::Twice { first: 0 });
//!
//! // A policy written in code around the call stands outside all but a
//! // timeout of the whole call.
//! let e = check(&[PolicyKind::CircuitBreaker, PolicyKind::CustomCall]).unwrap_err();
//! assert_eq!(e.rule, Rule::InsideCallPolicy { outer: 0 });
//! ```
#![forbid(unsafe_code)]

/// Declares the policies: one entry per policy,
/// `Kind = "name" [/ "name after the retry"], Place, [settings];`, then
/// after `@custom` the positions a policy written in code may declare,
/// `Kind = "name", Place;` (no settings: its settings are its code's).
macro_rules! policies {
    ($(
        $(#[$doc:meta])*
        $kind:ident = $name:literal $(/ $attempt:literal)?, $place:ident, [$($setting:expr),* $(,)?];
    )*
    @custom
    $(
        $(#[$cdoc:meta])*
        $ckind:ident = $cname:literal, $cplace:ident;
    )*) => {
        /// A policy a pipeline can declare: one of the table, or a policy
        /// written in code at the position it declares.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum PolicyKind {
            $( $(#[$doc])* $kind, )*
            $( $(#[$cdoc])* $ckind, )*
        }

        impl PolicyKind {
            /// Every policy of the table, in registration order: the order
            /// in which a pipeline nests them when nothing else says. The
            /// positions of policies written in code are in
            /// [`CUSTOM`](Self::CUSTOM), not here: they have no section, no
            /// key and no settings of their own.
            pub const ALL: &'static [PolicyKind] = &[$(PolicyKind::$kind),*];

            /// The positions a policy written in code may declare.
            pub const CUSTOM: &'static [PolicyKind] = &[$(PolicyKind::$ckind),*];

            /// The policy's name, as the builder method, the configuration
            /// key and the attribute key spell it (for a policy written in
            /// code, the name of its position: the builder and the
            /// configuration files name such a policy by its own name).
            pub const fn name(self) -> &'static str {
                match self {
                    $(PolicyKind::$kind => $name,)*
                    $(PolicyKind::$ckind => $cname,)*
                }
            }

            /// Where the policy may stand.
            pub const fn place(self) -> Place {
                match self {
                    $(PolicyKind::$kind => Place::$place,)*
                    $(PolicyKind::$ckind => Place::$cplace,)*
                }
            }

            /// The name of the policy's configuration section when it
            /// stands after the retry (`attempt_timeout`), for a policy of
            /// [`Place::EitherSide`] that has one.
            pub const fn attempt_name(self) -> Option<&'static str> {
                match self {
                    $(PolicyKind::$kind => optional!($($attempt)?),)*
                    $(PolicyKind::$ckind => None,)*
                }
            }

            /// The policy's settings, in the order the configuration files
            /// and the attribute list them (none for a policy written in
            /// code).
            pub const fn settings(self) -> &'static [Setting] {
                match self {
                    $(PolicyKind::$kind => {
                        const SETTINGS: &[Setting] = &[$($setting),*];
                        SETTINGS
                    })*
                    $(PolicyKind::$ckind => &[],)*
                }
            }

            /// `true` for the position of a policy written in code.
            pub const fn is_custom(self) -> bool {
                matches!(self, $(PolicyKind::$ckind)|*)
            }
        }
    };
}

macro_rules! optional {
    () => {
        None
    };
    ($x:literal) => {
        Some($x)
    };
}

const BACKOFFS: &[&str] = &["constant", "linear", "exponential", "decorrelated"];
/// The budget of a retry or hedging: `shared` keeps a retry's in the
/// pipeline's store (`RetryBudget::shared`); a hedging budget refuses it.
const BUDGET: &[Setting] = &[
    Setting::number("ratio"),
    Setting::count("max_tokens"),
    Setting::flag("shared"),
];
const ALGORITHMS: &[&str] = &["gcra", "fixed_window", "sliding_window"];
const LIMIT_ALGORITHMS: &[&str] = &["aimd", "vegas", "gradient2"];
const HEDGING_MODES: &[&str] = &["latency", "parallel", "fallback"];

policies! {
    /// Request coalescing: concurrent calls with the same key share one
    /// execution of the whole call, with an optional cache of successes
    /// (`ttl`, bounded to `max_entries`). Declared first: it wraps
    /// everything else (the fallback aside).
    Coalesce = "coalesce", Outermost, [
        Setting::duration("ttl"),
        Setting::count("max_entries"),
    ];
    /// A timeout: of the whole call before the retry, of each attempt after it.
    Timeout = "timeout" / "attempt_timeout", EitherSide, [
        Setting::duration("duration").attr("").shorthand(),
        Setting::flag("strict"),
    ];
    /// The retry.
    Retry = "retry", Retry, [
        Setting::count("max_attempts"),
        Setting::choice("backoff", BACKOFFS),
        Setting::duration("delay").attr("backoff"),
        Setting::number("multiplier"),
        Setting::duration("cap"),
        Setting::jitter("jitter"),
        Setting::table("budget", BUDGET),
    ];
    /// Hedging: further attempts of the call started while earlier ones
    /// run (after a delay, all at once, or after a failure), the first
    /// acceptable answer wins. It makes the attempts of a call, as the
    /// retry does: one of the two per pipeline.
    Hedging = "hedging", Retry, [
        Setting::count("max_hedged_attempts"),
        Setting::choice("mode", HEDGING_MODES),
        Setting::duration("delay"),
        Setting::table("budget", BUDGET),
    ];
    /// The circuit breaker.
    CircuitBreaker = "circuit_breaker", Stateful, [
        Setting::count("consecutive_failures"),
        Setting::count("count_window"),
        Setting::duration("window").in_seconds(),
        Setting::number("failure_rate"),
        Setting::count("minimum_calls"),
        Setting::number("slow_call_rate"),
        Setting::duration("slow_call_duration").attr("slow_call"),
        Setting::duration("cooldown"),
        Setting::number("cooldown_growth"),
        Setting::duration("max_cooldown"),
        Setting::count("half_open_calls"),
        Setting::duration("max_half_open"),
        Setting::flag("shadow"),
    ];
    /// The bulkhead.
    Bulkhead = "bulkhead", Stateful, [
        Setting::count("max_concurrent"),
        Setting::count("max_queued"),
        Setting::duration("max_wait"),
        Setting::duration("lease"),
        Setting::flag("shadow"),
    ];
    /// The cooldown opened by retry-after hints.
    Cooldown = "cooldown", Stateful, [
        Setting::duration("max_pause"),
        Setting::duration("max_wait"),
        Setting::duration("grace"),
        Setting::flag("shadow"),
    ];
    /// The rate limiter.
    RateLimiter = "rate_limiter", Stateful, [
        Setting::choice("algorithm", ALGORITHMS),
        Setting::count("limit"),
        Setting::duration("period").attr("per"),
        Setting::count("burst"),
        Setting::duration("max_wait"),
        Setting::flag("shadow"),
    ];
    /// Chaos injection into each attempt. The configuration files and the
    /// attribute declare a latency (`latency`, injected in a share `rate`
    /// of the attempts, while `enabled`); faults, whose error comes from
    /// code, are declared with the builder.
    Chaos = "chaos", Attempt, [
        Setting::number("rate"),
        Setting::duration("latency"),
        Setting::flag("enabled"),
    ];
    /// The adaptive concurrency limit of each attempt, in this process.
    AdaptiveLimit = "adaptive_limit", AttemptOnce, [
        Setting::choice("algorithm", LIMIT_ALGORITHMS),
        Setting::count("initial_limit"),
        Setting::count("min_limit"),
        Setting::count("max_limit"),
        Setting::duration("update_interval"),
        Setting::number("backoff_ratio"),
        Setting::duration("rtt_timeout"),
        Setting::number("smoothing"),
        Setting::count("queue_size"),
        Setting::number("buffer"),
        Setting::duration("min_rtt_interval"),
        Setting::count("min_rtt_samples"),
        Setting::count("min_rtt_concurrency"),
        Setting::number("min_rtt_jitter"),
        Setting::count("max_queued"),
        Setting::duration("max_wait"),
        Setting::shares("partitions"),
        Setting::flag("shadow"),
    ];
    @custom
    /// A policy written in code (`seawall::custom`) that stands around the
    /// whole call: before the retry, outside every policy of the call but a
    /// timeout of the whole call.
    CustomCall = "custom_call", AroundCall;
    /// A policy written in code that stands around each attempt: after the
    /// retry, inside the timeouts and the stateful policies that cover the
    /// attempt, outside chaos.
    CustomAttempt = "custom_attempt", AroundAttempt;
}

impl PolicyKind {
    /// The policy of the table named `name` (its [`name`](Self::name));
    /// the positions of policies written in code are not found by name.
    pub fn from_name(name: &str) -> Option<PolicyKind> {
        Self::ALL.iter().copied().find(|k| k.name() == name)
    }

    /// The setting whose configuration key is `key`.
    pub fn setting(self, key: &str) -> Option<&'static Setting> {
        self.settings().iter().find(|s| s.key == key)
    }

    /// The setting that may stand for the whole policy
    /// (`timeout = "5s"`, `timeout_ms = 500`), if any.
    pub fn shorthand(self) -> Option<&'static Setting> {
        self.settings().iter().find(|s| s.shorthand)
    }
}

/// One setting of a policy: its key, its spelling in the `#[resilient]`
/// attribute and the kind of value it takes. The configuration files and
/// the attribute both read their keys and value kinds from here.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Setting {
    /// The key in configuration files; also the setting's name.
    pub key: &'static str,
    /// The attribute's spelling: the key itself, or for a duration the
    /// base of `{attr}_ms` and `{attr}_s` (plain `ms` and `s` when empty).
    pub attr: &'static str,
    /// The kind of value.
    pub value: Value,
    /// The policy may be written as this value alone: `timeout = "5s"` in
    /// a file, `timeout_ms = 500` in the attribute.
    pub shorthand: bool,
}

/// The kind of value a [`Setting`] takes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// A whole number from 0 to `u32::MAX`.
    Count,
    /// A number, possibly fractional (a rate, a factor).
    Number,
    /// `true` or `false` (in the attribute, the bare key means `true`).
    Flag,
    /// A duration: a string such as `"200ms"` in a file; in the attribute
    /// a whole number under a key naming its unit.
    Duration(Units),
    /// One of the listed words.
    Choice(&'static [&'static str]),
    /// A jitter: `none`, `full`, `equal` or a percentage.
    Jitter,
    /// A nested table of settings.
    Table(&'static [Setting]),
    /// Names with their shares, fractions that add up to 1: a table
    /// `{ live = 0.9, batch = 0.1 }` in a file, a string
    /// `"live=0.9,batch=0.1"` in the attribute.
    Shares,
}

/// The units the attribute accepts for a duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Units {
    /// `{attr}_ms` or `{attr}_s`.
    MillisOrSeconds,
    /// `{attr}_s` only (whole seconds).
    Seconds,
}

/// The unit an attribute key gives a duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Milliseconds (`_ms`).
    Millis,
    /// Seconds (`_s`).
    Seconds,
}

impl Setting {
    const fn new(key: &'static str, value: Value) -> Setting {
        Setting {
            key,
            attr: key,
            value,
            shorthand: false,
        }
    }

    /// A whole number.
    pub const fn count(key: &'static str) -> Setting {
        Setting::new(key, Value::Count)
    }

    /// A number.
    pub const fn number(key: &'static str) -> Setting {
        Setting::new(key, Value::Number)
    }

    /// A flag.
    pub const fn flag(key: &'static str) -> Setting {
        Setting::new(key, Value::Flag)
    }

    /// A duration, in milliseconds or seconds in the attribute.
    pub const fn duration(key: &'static str) -> Setting {
        Setting::new(key, Value::Duration(Units::MillisOrSeconds))
    }

    /// One of `choices`.
    pub const fn choice(key: &'static str, choices: &'static [&'static str]) -> Setting {
        Setting::new(key, Value::Choice(choices))
    }

    /// A jitter.
    pub const fn jitter(key: &'static str) -> Setting {
        Setting::new(key, Value::Jitter)
    }

    /// Names with their shares.
    pub const fn shares(key: &'static str) -> Setting {
        Setting::new(key, Value::Shares)
    }

    /// A nested table.
    pub const fn table(key: &'static str, settings: &'static [Setting]) -> Setting {
        Setting::new(key, Value::Table(settings))
    }

    /// Spelled `attr` in the attribute.
    pub const fn attr(mut self, attr: &'static str) -> Setting {
        self.attr = attr;
        self
    }

    /// A duration the attribute takes in whole seconds only.
    pub const fn in_seconds(mut self) -> Setting {
        self.value = Value::Duration(Units::Seconds);
        self
    }

    /// May stand for the whole policy.
    pub const fn shorthand(mut self) -> Setting {
        self.shorthand = true;
        self
    }

    /// The attribute's keys for this setting, e.g. `backoff_ms` and
    /// `backoff_s` for the retry's `delay`.
    pub fn attribute_keys(&self) -> Vec<String> {
        let with = |unit: &str| match self.attr {
            "" => unit.to_owned(),
            base => format!("{base}_{unit}"),
        };
        match self.value {
            Value::Duration(Units::MillisOrSeconds) => vec![with("ms"), with("s")],
            Value::Duration(Units::Seconds) => vec![with("s")],
            _ => vec![self.attr.to_owned()],
        }
    }

    /// Whether the attribute key `key` spells this setting: `None` if not,
    /// `Some(None)` for a plain key, `Some(Some(unit))` for a duration key.
    pub fn attribute_unit(&self, key: &str) -> Option<Option<Unit>> {
        let Value::Duration(units) = self.value else {
            return (key == self.attr).then_some(None);
        };
        let unit = match self.attr {
            "" => key,
            base => key.strip_prefix(base)?.strip_prefix('_')?,
        };
        match (unit, units) {
            ("ms", Units::MillisOrSeconds) => Some(Some(Unit::Millis)),
            ("s", _) => Some(Some(Unit::Seconds)),
            _ => None,
        }
    }
}

/// The attribute's keys of a list of settings, comma-separated: the
/// `expected one of` of an unknown key.
pub fn attribute_keys(settings: &[Setting]) -> String {
    let keys: Vec<String> = settings.iter().flat_map(Setting::attribute_keys).collect();
    keys.join(", ")
}

impl PolicyKind {
    /// `true` for the policies that keep state in the pipeline's store.
    pub const fn is_stateful(self) -> bool {
        matches!(self.place(), Place::Stateful)
    }
}

/// Where a policy may stand in the declared list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// A policy that makes the attempts of a call: the retry, or hedging.
    /// A pipeline declares at most one of them, once. It splits the list:
    /// what comes before it covers the whole call, what comes after it
    /// each attempt. ([`PolicyKind::Retry`] is this place's first policy;
    /// the rules' messages name the one declared.)
    Retry,
    /// On either side of the retry, at most once on each side: before it
    /// (or without a retry) it covers the whole call, after it each attempt.
    EitherSide,
    /// Once, on either side of the retry: a stateful policy, kept in the
    /// pipeline's store. After the retry (or in a pipeline without one) it
    /// guards each attempt; before it, the whole call, retries and their
    /// waits included ([`guards`]).
    Stateful,
    /// After the retry (or in a pipeline without one), any number of times:
    /// it acts on each attempt (chaos injection).
    Attempt,
    /// After the retry (or in a pipeline without one), once: it guards
    /// each attempt with state of this process (the adaptive limit).
    AttemptOnce,
    /// First in the list, once: it wraps the whole call, every other
    /// policy included (request coalescing).
    Outermost,
    /// A policy written in code around the whole call, any number of
    /// times: before the retry, and declared before every other policy of
    /// the call but a timeout of the whole call (which may stand on either
    /// side of it: around it, one deadline bounds the policy and every
    /// pass it makes through the rest of the call; inside it, each pass
    /// gets the whole timeout).
    AroundCall,
    /// A policy written in code around each attempt, any number of times:
    /// after the retry (or in a pipeline without one), declared after the
    /// timeouts and the stateful policies that cover the attempt, and
    /// before chaos (which acts on the operation itself, inside it).
    AroundAttempt,
}

/// What a policy covers at its position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The whole call, retries included.
    Call,
    /// Each attempt.
    Attempt,
}

impl Scope {
    /// `"the whole call"` or `"each attempt"`.
    pub const fn describe(self) -> &'static str {
        match self {
            Scope::Call => "the whole call",
            Scope::Attempt => "each attempt",
        }
    }
}

/// What the policy at `at` covers in `declared`: each attempt when it is
/// declared after the retry, the whole call otherwise.
///
/// # Panics
/// Never; an `at` past the end is read as "after everything".
pub fn scope(declared: &[PolicyKind], at: usize) -> Scope {
    match declared.iter().position(|k| k.place() == Place::Retry) {
        Some(retry) if at > retry => Scope::Attempt,
        _ => Scope::Call,
    }
}

/// What the stateful policy at `at` guards in `declared`: the whole call
/// (one admission, one outcome for all its attempts) when it is declared
/// before the retry, each attempt otherwise. Without a retry a call is one
/// attempt: the policy guards it as an attempt.
///
/// # Panics
/// Never; an `at` past the end is read as "after everything".
pub fn guards(declared: &[PolicyKind], at: usize) -> Scope {
    let has_retry = declared.iter().any(|k| k.place() == Place::Retry);
    match scope(declared, at) {
        Scope::Call if has_retry => Scope::Call,
        _ => Scope::Attempt,
    }
}

/// The policy that makes the attempts of a call in `declared` (the retry
/// or hedging, the first declared), if any.
pub fn attempts_by(declared: &[PolicyKind]) -> Option<PolicyKind> {
    declared.iter().copied().find(|k| k.place() == Place::Retry)
}

/// A policy that may not stand where it was declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Misplaced {
    /// The index of the offending declaration.
    pub at: usize,
    /// Its policy.
    pub kind: PolicyKind,
    /// The rule it breaks.
    pub rule: Rule,
}

/// A rule of the order of policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// The policy is declared a second time; `first` is the index of the
    /// first declaration.
    Twice {
        /// The first declaration.
        first: usize,
    },
    /// A second policy of [`Place::EitherSide`] on the same side of the
    /// retry; `first` is the index of the first one.
    SecondOnSide {
        /// What both cover.
        scope: Scope,
        /// The first declaration.
        first: usize,
    },
    /// A policy of [`Place::Attempt`], [`Place::AttemptOnce`] or
    /// [`Place::AroundAttempt`] declared before the retry (or hedging),
    /// `retry` being the one declared.
    BeforeRetry {
        /// The policy that makes the attempts.
        retry: PolicyKind,
    },
    /// Both the retry and hedging; `first` is the index of the first one.
    RetryAndHedging {
        /// The first declaration.
        first: usize,
    },
    /// A policy of [`Place::Outermost`] declared after another policy.
    NotFirst,
    /// A policy of [`Place::AroundCall`] declared after the retry (or
    /// hedging).
    AfterRetry,
    /// A policy of [`Place::AroundCall`] declared after `outer`, a policy
    /// of the call it must stand around (anything but request coalescing,
    /// a timeout or another policy around the call).
    InsideCallPolicy {
        /// The policy it is declared inside of.
        outer: usize,
    },
    /// A policy of [`Place::AroundAttempt`] declared before `inner`, a
    /// policy covering the attempt that it must stand inside of (anything
    /// but chaos or another policy around the attempt).
    OutsideAttemptPolicy {
        /// The policy it is declared around.
        inner: usize,
    },
    /// A policy of [`Place::AroundAttempt`] declared after chaos (`chaos`,
    /// its index), which acts on the operation inside it.
    InsideChaos {
        /// The chaos policy.
        chaos: usize,
    },
}

impl Rule {
    /// The reason behind the rule, to follow a message that says what was
    /// declared where.
    pub const fn reason(&self) -> &'static str {
        match self {
            Rule::Twice { .. } => "declare each policy once",
            Rule::SecondOnSide { .. } => {
                "declare at most one timeout before `retry` (whole call) and one after it \
                 (each attempt)"
            }
            Rule::BeforeRetry { .. } => {
                "it acts on each attempt: declare it after the policy that makes the attempts \
                 (acting once around the whole call is not supported)"
            }
            Rule::RetryAndHedging { .. } => {
                "hedging makes the further attempts of a call itself (its `fallback` mode is a \
                 retry without a wait): declare either `retry` or `hedging`"
            }
            Rule::NotFirst => {
                "it shares one execution of the whole call among concurrent callers: \
                 declare it first, before every other policy"
            }
            Rule::AfterRetry => {
                "it acts once around the whole call: declare it before the policy that makes \
                 the attempts (a policy around each attempt declares that position)"
            }
            Rule::InsideCallPolicy { .. } => {
                "a policy around the whole call stands outside every other policy of the \
                 call but request coalescing and a timeout of the whole call: declare it \
                 before them"
            }
            Rule::OutsideAttemptPolicy { .. } => {
                "a policy around each attempt stands inside the timeouts and the stateful \
                 policies that cover the attempt: declare it after them"
            }
            Rule::InsideChaos { .. } => {
                "chaos acts on the operation itself, inside the policies around each \
                 attempt: declare it after them"
            }
        }
    }

    /// The other declaration the rule is about (the first of a policy
    /// declared twice, the policy it is wrongly inside of or around), if
    /// any.
    pub const fn other(&self) -> Option<usize> {
        match *self {
            Rule::Twice { first } | Rule::SecondOnSide { first, .. } => Some(first),
            Rule::InsideCallPolicy { outer } => Some(outer),
            Rule::OutsideAttemptPolicy { inner } => Some(inner),
            Rule::InsideChaos { chaos } => Some(chaos),
            Rule::RetryAndHedging { first } => Some(first),
            Rule::BeforeRetry { .. } | Rule::AfterRetry | Rule::NotFirst => None,
        }
    }
}

/// Checks a declared list, outermost first. The first declaration (in
/// list order) that breaks a rule is reported.
///
/// # Errors
/// The first [`Misplaced`] policy.
pub fn check(declared: &[PolicyKind]) -> Result<(), Misplaced> {
    let retry = attempts_by(declared);
    for (i, &kind) in declared.iter().enumerate() {
        let here = scope(declared, i);
        let misplaced = |rule| Err(Misplaced { at: i, kind, rule });
        match kind.place() {
            Place::Attempt | Place::AttemptOnce | Place::AroundAttempt
                if here == Scope::Call && retry.is_some() =>
            {
                let retry = retry.unwrap_or(PolicyKind::Retry);
                return misplaced(Rule::BeforeRetry { retry });
            }
            Place::Attempt => continue,
            Place::AroundCall => {
                if here == Scope::Attempt {
                    return misplaced(Rule::AfterRetry);
                }
                // Only request coalescing, a timeout of the whole call, or
                // another policy around it, may stand outside.
                let inside = |j: &usize| {
                    !matches!(
                        declared[*j].place(),
                        Place::Outermost | Place::EitherSide | Place::AroundCall
                    )
                };
                if let Some(outer) = (0..i).find(inside) {
                    return misplaced(Rule::InsideCallPolicy { outer });
                }
                continue;
            }
            Place::AroundAttempt => {
                if let Some(chaos) = (0..i).find(|&j| declared[j].place() == Place::Attempt) {
                    return misplaced(Rule::InsideChaos { chaos });
                }
                // Only chaos, or another policy around the attempt, may
                // stand inside (a policy around the call declared later is
                // misplaced by its own rule).
                let around = |j: &usize| {
                    !matches!(
                        declared[*j].place(),
                        Place::Attempt | Place::AroundAttempt | Place::AroundCall
                    )
                };
                if let Some(inner) = (i + 1..declared.len()).find(around) {
                    return misplaced(Rule::OutsideAttemptPolicy { inner });
                }
                continue;
            }
            Place::Retry => {
                let other =
                    |j: &usize| declared[*j].place() == Place::Retry && declared[*j] != kind;
                if let Some(first) = (0..i).find(other) {
                    return misplaced(Rule::RetryAndHedging { first });
                }
            }
            Place::EitherSide | Place::Stateful | Place::AttemptOnce | Place::Outermost => {}
        }
        let earlier = |j: &usize| {
            declared[*j] == kind
                && (kind.place() != Place::EitherSide || scope(declared, *j) == here)
        };
        if let Some(first) = (0..i).find(earlier) {
            let rule = match kind.place() {
                Place::EitherSide => Rule::SecondOnSide { scope: here, first },
                _ => Rule::Twice { first },
            };
            return misplaced(rule);
        }
        if kind.place() == Place::Outermost && i != 0 {
            return misplaced(Rule::NotFirst);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use PolicyKind::*;

    #[test]
    fn names_are_unique_and_snake_case() {
        for (i, a) in PolicyKind::ALL.iter().enumerate() {
            assert!(a
                .name()
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'_'));
            for b in &PolicyKind::ALL[i + 1..] {
                assert_ne!(a.name(), b.name());
            }
        }
    }

    #[test]
    fn every_policy_is_found_by_its_name() {
        for &k in PolicyKind::ALL {
            assert_eq!(PolicyKind::from_name(k.name()), Some(k));
            assert_eq!(k.attempt_name().is_some(), k.place() == Place::EitherSide);
        }
        assert_eq!(PolicyKind::from_name("fallback"), None);
    }

    #[test]
    fn settings_are_spelled_once_per_policy() {
        fn check(settings: &[Setting]) {
            let mut keys: Vec<&str> = settings.iter().map(|s| s.key).collect();
            let mut attr: Vec<String> = settings.iter().flat_map(Setting::attribute_keys).collect();
            let (k, a) = (keys.len(), attr.len());
            keys.sort_unstable();
            keys.dedup();
            attr.sort_unstable();
            attr.dedup();
            assert_eq!((keys.len(), attr.len()), (k, a), "{settings:?}");
            for s in settings {
                for key in s.attribute_keys() {
                    assert!(s.attribute_unit(&key).is_some(), "{key}");
                    let others = settings.iter().filter(|o| o.attribute_unit(&key).is_some());
                    assert_eq!(others.count(), 1, "{key}");
                }
                if let Value::Table(nested) = s.value {
                    check(nested);
                }
            }
            assert!(settings.iter().filter(|s| s.shorthand).count() <= 1);
        }
        for k in PolicyKind::ALL {
            check(k.settings());
        }
    }

    #[test]
    fn attribute_spellings() {
        assert_eq!(
            attribute_keys(Retry.settings()),
            "max_attempts, backoff, backoff_ms, backoff_s, multiplier, cap_ms, cap_s, jitter, budget"
        );
        assert_eq!(attribute_keys(Timeout.settings()), "ms, s, strict");
        let window = CircuitBreaker.setting("window").unwrap();
        assert_eq!(window.attribute_keys(), ["window_s"]);
        assert_eq!(window.attribute_unit("window_ms"), None);
        assert_eq!(window.attribute_unit("window_s"), Some(Some(Unit::Seconds)));
        let delay = Retry.setting("delay").unwrap();
        assert_eq!(delay.attribute_unit("backoff_ms"), Some(Some(Unit::Millis)));
        assert_eq!(delay.attribute_unit("backoff"), None);
        assert_eq!(delay.attribute_unit("backoff_min"), None);
        let max_attempts = Retry.setting("max_attempts").unwrap();
        assert_eq!(max_attempts.attribute_unit("max_attempts"), Some(None));
        assert_eq!(Timeout.shorthand().map(|s| s.key), Some("duration"));
        assert_eq!(Retry.shorthand(), None);
    }

    #[test]
    fn a_timeout_covers_the_call_before_the_retry_and_each_attempt_after_it() {
        let d = [Timeout, Retry, Timeout];
        assert_eq!(scope(&d, 0), Scope::Call);
        assert_eq!(scope(&d, 1), Scope::Call);
        assert_eq!(scope(&d, 2), Scope::Attempt);
        assert_eq!(scope(&[Timeout], 0), Scope::Call);
        assert_eq!(scope(&[Retry, Bulkhead], 1), Scope::Attempt);
    }

    #[test]
    fn each_policy_once() {
        let e = check(&[Retry, Bulkhead, Bulkhead]).unwrap_err();
        assert_eq!(e.at, 2);
        assert_eq!(e.kind, Bulkhead);
        assert_eq!(e.rule, Rule::Twice { first: 1 });
        let e = check(&[Retry, Retry]).unwrap_err();
        assert_eq!((e.at, e.rule), (1, Rule::Twice { first: 0 }));
    }

    #[test]
    fn one_timeout_on_each_side_of_the_retry() {
        assert_eq!(check(&[Timeout, Retry, Timeout]), Ok(()));
        let e = check(&[Retry, Timeout, CircuitBreaker, Timeout]).unwrap_err();
        assert_eq!(e.at, 3);
        assert_eq!(
            e.rule,
            Rule::SecondOnSide {
                scope: Scope::Attempt,
                first: 1
            }
        );
        let e = check(&[Timeout, Timeout, Retry]).unwrap_err();
        assert_eq!(
            e.rule,
            Rule::SecondOnSide {
                scope: Scope::Call,
                first: 0
            }
        );
        let e = check(&[Timeout, Timeout]).unwrap_err();
        assert_eq!(e.at, 1);
    }

    #[test]
    fn stateful_policies_stand_once_on_either_side_of_the_retry() {
        assert_eq!(check(&[Bulkhead, CircuitBreaker]), Ok(()));
        assert_eq!(check(&[Retry, RateLimiter, Cooldown]), Ok(()));
        assert_eq!(check(&[Timeout, Cooldown, Bulkhead, Retry]), Ok(()));
        assert_eq!(check(&[CircuitBreaker, Retry, Bulkhead]), Ok(()));
        let e = check(&[CircuitBreaker, Retry, CircuitBreaker]).unwrap_err();
        assert_eq!((e.at, e.rule), (2, Rule::Twice { first: 0 }));
    }

    #[test]
    fn a_stateful_policy_guards_the_call_only_before_a_retry() {
        let d = [CircuitBreaker, Timeout, Retry, Bulkhead];
        assert_eq!(guards(&d, 0), Scope::Call);
        assert_eq!(guards(&d, 3), Scope::Attempt);
        assert_eq!(guards(&[CircuitBreaker, Bulkhead], 0), Scope::Attempt);
        assert_eq!(guards(&[CircuitBreaker], 0), Scope::Attempt);
    }

    #[test]
    fn chaos_acts_on_each_attempt_any_number_of_times() {
        assert_eq!(check(&[Retry, Chaos, Chaos]), Ok(()));
        assert_eq!(check(&[Chaos, Chaos]), Ok(()));
        let e = check(&[Chaos, Retry]).unwrap_err();
        assert_eq!((e.at, e.rule), (0, Rule::BeforeRetry { retry: Retry }));
        let e = check(&[Chaos, Hedging]).unwrap_err();
        assert_eq!((e.at, e.rule), (0, Rule::BeforeRetry { retry: Hedging }));
        assert_eq!(check(&[Hedging, Chaos]), Ok(()));
    }

    #[test]
    fn hedging_splits_the_list_like_the_retry_and_excludes_it() {
        let d = [Timeout, CircuitBreaker, Hedging, Bulkhead, Timeout];
        assert_eq!(check(&d), Ok(()));
        assert_eq!(scope(&d, 0), Scope::Call);
        assert_eq!(guards(&d, 1), Scope::Call);
        assert_eq!(guards(&d, 3), Scope::Attempt);
        assert_eq!(scope(&d, 4), Scope::Attempt);
        assert_eq!(attempts_by(&d), Some(Hedging));
        let e = check(&[Retry, Timeout, Hedging]).unwrap_err();
        assert_eq!((e.at, e.rule), (2, Rule::RetryAndHedging { first: 0 }));
        let e = check(&[Hedging, Retry]).unwrap_err();
        assert_eq!((e.at, e.rule), (1, Rule::RetryAndHedging { first: 0 }));
        let e = check(&[Hedging, Hedging]).unwrap_err();
        assert_eq!((e.at, e.rule), (1, Rule::Twice { first: 0 }));
    }

    #[test]
    fn the_adaptive_limit_guards_each_attempt_once() {
        assert_eq!(check(&[Retry, AdaptiveLimit]), Ok(()));
        assert_eq!(check(&[AdaptiveLimit, Bulkhead]), Ok(()));
        let e = check(&[AdaptiveLimit, Retry]).unwrap_err();
        assert_eq!((e.at, e.rule), (0, Rule::BeforeRetry { retry: Retry }));
        let e = check(&[Retry, AdaptiveLimit, AdaptiveLimit]).unwrap_err();
        assert_eq!((e.at, e.rule), (2, Rule::Twice { first: 1 }));
    }

    #[test]
    fn coalescing_stands_first_once() {
        assert_eq!(check(&[Coalesce, Timeout, Retry, CircuitBreaker]), Ok(()));
        assert_eq!(check(&[Coalesce]), Ok(()));
        let e = check(&[Retry, Coalesce]).unwrap_err();
        assert_eq!((e.at, e.rule), (1, Rule::NotFirst));
        let e = check(&[Coalesce, Coalesce]).unwrap_err();
        assert_eq!((e.at, e.rule), (1, Rule::Twice { first: 0 }));
        assert_eq!(scope(&[Coalesce, Retry], 0), Scope::Call);
        assert!(!Coalesce.is_stateful());
    }

    #[test]
    fn a_policy_around_the_call_stands_outside_all_but_a_timeout() {
        assert_eq!(check(&[CustomCall, CustomCall, Retry]), Ok(()));
        assert_eq!(check(&[Timeout, CustomCall, Retry, Timeout]), Ok(()));
        assert_eq!(check(&[CustomCall, Timeout, CustomCall]), Ok(()));
        assert_eq!(check(&[CustomCall, CircuitBreaker, Retry, Chaos]), Ok(()));
        let e = check(&[Retry, CustomCall]).unwrap_err();
        assert_eq!((e.at, e.rule), (1, Rule::AfterRetry));
        let e = check(&[Bulkhead, CustomCall, Retry]).unwrap_err();
        assert_eq!((e.at, e.rule), (1, Rule::InsideCallPolicy { outer: 0 }));
        // Without a retry too: the stateful policies guard the one attempt,
        // inside the policy.
        let e = check(&[Timeout, Chaos, CustomCall]).unwrap_err();
        assert_eq!((e.at, e.rule), (2, Rule::InsideCallPolicy { outer: 1 }));
        assert_eq!(e.rule.other(), Some(1));
    }

    #[test]
    fn a_policy_around_the_attempt_stands_inside_all_but_chaos() {
        assert_eq!(check(&[Retry, CustomAttempt, CustomAttempt, Chaos]), Ok(()));
        assert_eq!(
            check(&[
                CircuitBreaker,
                Timeout,
                Retry,
                Timeout,
                Bulkhead,
                CustomAttempt
            ]),
            Ok(())
        );
        assert_eq!(check(&[Timeout, RateLimiter, CustomAttempt, Chaos]), Ok(()));
        assert_eq!(check(&[CustomCall, Retry, CustomAttempt]), Ok(()));
        let e = check(&[CustomAttempt, Retry]).unwrap_err();
        assert_eq!((e.at, e.rule), (0, Rule::BeforeRetry { retry: Retry }));
        let e = check(&[Retry, CustomAttempt, Timeout]).unwrap_err();
        assert_eq!((e.at, e.rule), (1, Rule::OutsideAttemptPolicy { inner: 2 }));
        let e = check(&[CustomAttempt, CircuitBreaker]).unwrap_err();
        assert_eq!((e.at, e.rule), (0, Rule::OutsideAttemptPolicy { inner: 1 }));
        let e = check(&[Retry, Chaos, CustomAttempt]).unwrap_err();
        assert_eq!((e.at, e.rule), (2, Rule::InsideChaos { chaos: 1 }));
        // A policy around the call declared after one around the attempt
        // is the one misplaced.
        let e = check(&[Retry, CustomAttempt, CustomCall]).unwrap_err();
        assert_eq!((e.at, e.rule), (2, Rule::AfterRetry));
        let e = check(&[CustomAttempt, CustomCall]).unwrap_err();
        assert_eq!((e.at, e.rule), (1, Rule::InsideCallPolicy { outer: 0 }));
    }

    #[test]
    fn policies_of_code_meet_coalescing_hedging_and_the_adaptive_limit() {
        assert_eq!(check(&[Coalesce, CustomCall, Retry]), Ok(()));
        assert_eq!(
            check(&[Coalesce, Timeout, CustomCall, Hedging, CustomAttempt]),
            Ok(())
        );
        assert_eq!(check(&[Retry, AdaptiveLimit, CustomAttempt, Chaos]), Ok(()));
        let e = check(&[CustomCall, Coalesce]).unwrap_err();
        assert_eq!((e.at, e.rule), (1, Rule::NotFirst));
        let e = check(&[Hedging, CustomCall]).unwrap_err();
        assert_eq!((e.at, e.rule), (1, Rule::AfterRetry));
        let e = check(&[CustomAttempt, Hedging]).unwrap_err();
        assert_eq!((e.at, e.rule), (0, Rule::BeforeRetry { retry: Hedging }));
        let e = check(&[Retry, CustomAttempt, AdaptiveLimit]).unwrap_err();
        assert_eq!((e.at, e.rule), (1, Rule::OutsideAttemptPolicy { inner: 2 }));
        let e = check(&[Retry, Hedging]).unwrap_err();
        assert_eq!(e.rule.other(), Some(0));
    }

    #[test]
    fn positions_of_code_are_not_in_the_table() {
        for k in PolicyKind::CUSTOM {
            assert!(k.is_custom() && !PolicyKind::ALL.contains(k));
            assert_eq!(PolicyKind::from_name(k.name()), None);
            assert!(k.settings().is_empty() && k.attempt_name().is_none());
        }
        assert!(PolicyKind::ALL.iter().all(|k| !k.is_custom()));
    }

    #[test]
    fn the_first_broken_rule_in_list_order_is_reported() {
        let e = check(&[CircuitBreaker, CircuitBreaker, Retry]).unwrap_err();
        assert_eq!(e.rule, Rule::Twice { first: 0 });
        let e = check(&[CircuitBreaker, Retry, Retry, CircuitBreaker]).unwrap_err();
        assert_eq!((e.at, e.rule), (2, Rule::Twice { first: 1 }));
    }

    /// Every list of up to four declarations, against the rules counted
    /// per side of the first retry, and the positions of policies written
    /// in code stated as what stands before and after them.
    #[test]
    fn agrees_with_a_count_of_each_side() {
        fn accepted(d: &[PolicyKind]) -> bool {
            let retry = d.iter().position(|k| matches!(k, Retry | Hedging));
            let (before, after) = d.split_at(retry.unwrap_or(d.len()));
            let count = |s: &[PolicyKind], k| s.iter().filter(|x| **x == k).count();
            let counted = count(d, Retry) + count(d, Hedging) <= 1
                && PolicyKind::ALL.iter().all(|&k| match k {
                    Timeout => count(before, k) <= 1 && count(after, k) <= 1,
                    Chaos => retry.is_none() || count(before, k) == 0,
                    AdaptiveLimit => count(d, k) <= 1 && (retry.is_none() || count(before, k) == 0),
                    Coalesce => count(d, k) <= 1 && d.iter().skip(1).all(|x| *x != k),
                    _ => count(d, k) <= 1,
                });
            let placed = d.iter().enumerate().all(|(i, k)| match k {
                CustomCall => {
                    retry.is_none_or(|r| i < r)
                        && d[..i]
                            .iter()
                            .all(|o| matches!(o, Coalesce | Timeout | CustomCall))
                }
                CustomAttempt => {
                    retry.is_none_or(|r| i > r)
                        && d[i + 1..]
                            .iter()
                            .all(|o| matches!(o, Chaos | CustomAttempt))
                        && !d[..i].contains(&Chaos)
                }
                _ => true,
            });
            counted && placed
        }
        let all: Vec<PolicyKind> = PolicyKind::ALL
            .iter()
            .chain(PolicyKind::CUSTOM)
            .copied()
            .collect();
        let mut lists: Vec<Vec<PolicyKind>> = vec![Vec::new()];
        for _ in 0..4 {
            let longer: Vec<Vec<PolicyKind>> = lists
                .iter()
                .filter(|l| l.len() == lists.last().map_or(0, Vec::len))
                .flat_map(|l| {
                    all.iter().map(move |k| {
                        let mut l = l.clone();
                        l.push(*k);
                        l
                    })
                })
                .collect();
            lists.extend(longer);
        }
        let n = all.len();
        assert_eq!(lists.len(), 1 + n + n * n + n * n * n + n * n * n * n);
        for l in &lists {
            assert_eq!(check(l).is_ok(), accepted(l), "{l:?}");
        }
    }
}
