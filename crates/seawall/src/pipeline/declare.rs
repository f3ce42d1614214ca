//! The policies a builder declared, in declaration order: the order check
//! ([`seawall_order::check`], the one statement of the order rules), the
//! numeric rules (each policy's `validate()`), and the sorting into the
//! roles the engine knows (overall or attempt timeout, ...).

use std::time::Duration;

use seawall_order::{attempts_by, check, guards, scope, Misplaced, PolicyKind, Rule, Scope};

use crate::adaptive::AdaptiveLimit;
use crate::breaker::CircuitBreaker;
use crate::bulkhead::Bulkhead;
use crate::chaos::Chaos;
use crate::coalesce::Coalesce;
use crate::cooldown::Cooldown;
use crate::custom::Position;
use crate::error::ConfigError;
use crate::hedge::Hedging;
use crate::rate_limit::RateLimiter;
use crate::retry::Retry;
use crate::timeout::Timeout;

/// The run-time value of each policy registered in [`seawall_order`]:
/// one line per policy, `Kind(Type)`, `Kind` being its [`PolicyKind`]
/// variant. The configuration files resolve their sections into these
/// values and the builder methods declare them; [`sort`] gives each its
/// role (the compiler asks for a new one there).
macro_rules! declared {
    ($($kind:ident($ty:ty),)*) => {
        /// One declared policy with its settings.
        #[derive(Debug, Clone)]
        pub(crate) enum Declared {
            $($kind($ty),)*
        }

        impl Declared {
            /// The policy, as the order rules know it.
            pub(crate) fn kind(&self) -> PolicyKind {
                match self {
                    $(Declared::$kind(_) => PolicyKind::$kind,)*
                }
            }

            /// The numeric rules of the policy's settings.
            fn validate(&self, attempt_timeout: Option<Duration>) -> Result<(), ConfigError> {
                match self {
                    $(Declared::$kind(p) => Validate::validate_in(p, attempt_timeout),)*
                }
            }
        }
    };
}

declared! {
    Coalesce(Coalesce),
    Timeout(Timeout),
    Retry(Retry),
    CircuitBreaker(CircuitBreaker),
    Bulkhead(Bulkhead),
    Cooldown(Cooldown),
    RateLimiter(RateLimiter),
    Hedging(Hedging),
    Chaos(Chaos),
    AdaptiveLimit(AdaptiveLimit),
    CustomCall(Custom),
    CustomAttempt(Custom),
}

/// A policy written in code ([`crate::custom`]), as declared at the
/// position it declares (the variant of [`Declared`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Custom {
    /// The policy's name.
    pub(crate) name: &'static str,
    /// Where the pipeline's typed handlers keep it; `None` for a policy a
    /// configuration file names, until a registry binds it.
    pub(crate) slot: Option<usize>,
}

impl Declared {
    /// A policy written in code named `name`, at `position`.
    pub(crate) fn custom(name: &'static str, position: Position, slot: Option<usize>) -> Self {
        let custom = Custom { name, slot };
        match position {
            Position::Call => Declared::CustomCall(custom),
            Position::Attempt => Declared::CustomAttempt(custom),
        }
    }

    /// The policy written in code, if it is one.
    pub(crate) fn as_custom(&self) -> Option<&Custom> {
        match self {
            Declared::CustomCall(c) | Declared::CustomAttempt(c) => Some(c),
            _ => None,
        }
    }

    /// The policy written in code, if it is one, to bind it.
    pub(crate) fn as_custom_mut(&mut self) -> Option<&mut Custom> {
        match self {
            Declared::CustomCall(c) | Declared::CustomAttempt(c) => Some(c),
            _ => None,
        }
    }

    /// The name of the declaration in messages: a policy's registered
    /// name, or a policy written in code's own.
    fn name(&self) -> &'static str {
        match self.as_custom() {
            Some(c) => c.name,
            None => self.kind().name(),
        }
    }
}

/// A policy's numeric rules: its module's `validate()`, given what they
/// depend on beyond the policy's own settings (the timeout that bounds
/// each attempt). A policy type without it cannot be declared.
trait Validate {
    fn validate_in(&self, attempt_timeout: Option<Duration>) -> Result<(), ConfigError>;
}

impl Validate for Timeout {
    fn validate_in(&self, _: Option<Duration>) -> Result<(), ConfigError> {
        self.validate()
    }
}

impl Validate for Retry {
    fn validate_in(&self, _: Option<Duration>) -> Result<(), ConfigError> {
        self.validate()
    }
}

impl Validate for CircuitBreaker {
    fn validate_in(&self, _: Option<Duration>) -> Result<(), ConfigError> {
        self.validate()
    }
}

impl Validate for Bulkhead {
    fn validate_in(&self, attempt_timeout: Option<Duration>) -> Result<(), ConfigError> {
        self.validate(attempt_timeout)
    }
}

impl Validate for Cooldown {
    fn validate_in(&self, _: Option<Duration>) -> Result<(), ConfigError> {
        self.validate()
    }
}

impl Validate for Chaos {
    fn validate_in(&self, _: Option<Duration>) -> Result<(), ConfigError> {
        self.validate()
    }
}

impl Validate for AdaptiveLimit {
    fn validate_in(&self, _: Option<Duration>) -> Result<(), ConfigError> {
        self.validate()
    }
}

impl Validate for Coalesce {
    fn validate_in(&self, _: Option<Duration>) -> Result<(), ConfigError> {
        self.validate()
    }
}

impl Validate for Hedging {
    fn validate_in(&self, _: Option<Duration>) -> Result<(), ConfigError> {
        self.validate()
    }
}

impl Validate for RateLimiter {
    fn validate_in(&self, _: Option<Duration>) -> Result<(), ConfigError> {
        self.validate()
    }
}

impl Validate for Custom {
    fn validate_in(&self, _: Option<Duration>) -> Result<(), ConfigError> {
        let name = self.name;
        if name.trim().is_empty() {
            return Err(ConfigError::new("policy", "name", "must not be empty"));
        }
        let builtin = PolicyKind::ALL
            .iter()
            .any(|k| k.name() == name || k.attempt_name() == Some(name));
        if builtin {
            return Err(ConfigError::new(
                name,
                "name",
                format!(
                    "`{name}` is the name of a built-in policy: give the policy a name of its own"
                ),
            ));
        }
        Ok(())
    }
}

/// The declared policies by role.
#[derive(Default)]
pub(crate) struct Sorted {
    pub(crate) retry: Option<Retry>,
    pub(crate) hedging: Option<Hedging>,
    pub(crate) overall_timeout: Option<Timeout>,
    pub(crate) attempt_timeout: Option<Timeout>,
    /// The stateful policies declared before the retry: they guard the
    /// whole call ([`seawall_order::guards`]).
    pub(crate) call: Guards,
    /// The stateful policies that guard each attempt.
    pub(crate) attempt: Guards,
    /// The chaos policies, in declaration order (each attempt).
    pub(crate) chaos: Vec<Chaos>,
    /// The adaptive concurrency limit (each attempt).
    pub(crate) adaptive: Option<AdaptiveLimit>,
    /// Request coalescing (outermost).
    pub(crate) coalesce: Option<Coalesce>,
    /// The policies written in code around the whole call, in declaration
    /// order (outermost first).
    pub(crate) custom_call: Vec<Custom>,
    /// How many of them stand outside the timeout of the whole call, when
    /// it is declared among them (the others share its deadline).
    pub(crate) custom_outside_timeout: Option<usize>,
    /// The policies written in code around each attempt, in declaration
    /// order.
    pub(crate) custom_attempt: Vec<Custom>,
}

/// The stateful policies of one level (the whole call or each attempt).
#[derive(Default)]
pub(crate) struct Guards {
    pub(crate) circuit: Option<CircuitBreaker>,
    pub(crate) bulkhead: Option<Bulkhead>,
    pub(crate) cooldown: Option<Cooldown>,
    pub(crate) rate_limit: Option<RateLimiter>,
}

/// Checks the order of `declared` ([`seawall_order::check`]) and gives
/// the policies as the order rules know them.
pub(crate) fn check_order(declared: &[Declared]) -> Result<Vec<PolicyKind>, ConfigError> {
    // A policy a file names is bound by the registry that knows it.
    if let Some(c) = declared
        .iter()
        .filter_map(Declared::as_custom)
        .find(|c| c.slot.is_none())
    {
        return Err(ConfigError::new(
            "pipeline",
            "policies",
            format!(
                "lists `{}`, a policy written in code that its registry did not bind",
                c.name
            ),
        ));
    }
    let kinds: Vec<PolicyKind> = declared.iter().map(Declared::kind).collect();
    check(&kinds).map_err(|e| misplaced(e, declared))?;
    // A policy written in code is its name in events, metrics and files:
    // each is declared once.
    for (i, d) in declared.iter().enumerate() {
        let Some(c) = d.as_custom() else { continue };
        let twice = declared[..i]
            .iter()
            .any(|o| o.as_custom().is_some_and(|o| o.name == c.name));
        if twice {
            return Err(ConfigError::new(
                c.name,
                "name",
                "is declared twice; declare each policy once (a policy is known by its name in events, metrics and files)",
            ));
        }
    }
    // A hedged attempt's steps are the engine's, interleaved with the
    // other attempts' on one task: a policy written in code cannot yet
    // wrap one of them.
    if kinds.contains(&PolicyKind::Hedging) {
        if let Some(c) = declared.iter().find_map(|d| match d {
            Declared::CustomAttempt(c) => Some(c),
            _ => None,
        }) {
            return Err(ConfigError::new(
                c.name,
                "position",
                "is `attempt` (around each attempt) in a pipeline with `hedging`, which does \
                 not run hedged attempts through policies written in code: give it the \
                 position `call` (around the whole call, hedged attempts included), or \
                 use `retry`",
            ));
        }
    }
    Ok(kinds)
}

/// Applies each policy's numeric rules, in declaration order.
pub(crate) fn validate(declared: &[Declared], kinds: &[PolicyKind]) -> Result<(), ConfigError> {
    let timeout = |wanted: Scope| {
        declared.iter().enumerate().find_map(|(i, d)| match d {
            Declared::Timeout(t) if scope(kinds, i) == wanted => Some(t.duration),
            _ => None,
        })
    };
    // What bounds each attempt: the timeout after the retry, else the one
    // of the whole call; a policy that guards the whole call is bounded by
    // the timeout of the whole call.
    let attempt_timeout = timeout(Scope::Attempt).or_else(|| timeout(Scope::Call));
    declared.iter().enumerate().try_for_each(|(i, d)| {
        let bound = match (d.kind().is_stateful(), guards(kinds, i)) {
            (true, Scope::Call) => timeout(Scope::Call),
            _ => attempt_timeout,
        };
        d.validate(bound)
    })
}

/// Sorts the policies of a checked declaration by role.
pub(crate) fn sort(declared: Vec<Declared>, kinds: &[PolicyKind]) -> Sorted {
    let mut s = Sorted::default();
    for (i, d) in declared.into_iter().enumerate() {
        let level = match guards(kinds, i) {
            Scope::Call => &mut s.call,
            Scope::Attempt => &mut s.attempt,
        };
        match d {
            Declared::Timeout(t) => match scope(kinds, i) {
                Scope::Call => s.overall_timeout = Some(t),
                Scope::Attempt => s.attempt_timeout = Some(t),
            },
            Declared::Retry(r) => s.retry = Some(r),
            Declared::Hedging(h) => s.hedging = Some(h),
            Declared::CircuitBreaker(c) => level.circuit = Some(c),
            Declared::Bulkhead(b) => level.bulkhead = Some(b),
            Declared::Cooldown(c) => level.cooldown = Some(c),
            Declared::RateLimiter(r) => level.rate_limit = Some(r),
            Declared::Chaos(c) => s.chaos.push(c),
            Declared::AdaptiveLimit(a) => s.adaptive = Some(a),
            Declared::Coalesce(c) => s.coalesce = Some(c),
            Declared::CustomCall(c) => s.custom_call.push(c),
            Declared::CustomAttempt(c) => s.custom_attempt.push(c),
        }
    }
    // The timeout of the whole call among the policies around it: those
    // declared before it stand outside it.
    let overall = (0..kinds.len())
        .find(|&i| kinds[i] == PolicyKind::Timeout && scope(kinds, i) == Scope::Call);
    if let Some(at) = overall {
        let outside = kinds[..at]
            .iter()
            .filter(|k| **k == PolicyKind::CustomCall)
            .count();
        if outside < s.custom_call.len() {
            s.custom_outside_timeout = Some(outside);
        }
    }
    s
}

/// The builder's wording of a broken order rule: `pipeline.<policy> <rule>`,
/// or for a policy written in code `<name>.position <rule>`.
pub(crate) fn misplaced(e: Misplaced, declared: &[Declared]) -> ConfigError {
    let other = e.rule.other().map_or("", |j| declared[j].name());
    let reason = e.rule.reason();
    let rule = match e.rule {
        Rule::Twice { .. } => format!("is declared twice; {reason}"),
        Rule::SecondOnSide { scope, .. } => {
            format!("is declared twice for {}; {reason}", scope.describe())
        }
        Rule::BeforeRetry { retry } if e.kind.is_custom() => format!(
            "is `attempt` (around each attempt) but the policy is declared before `{}`; \
             declare it after `{}`, or give it the position `call` to act once around \
             the whole call",
            retry.name(),
            retry.name()
        ),
        Rule::BeforeRetry { retry } => {
            format!("is declared before `{}`; {reason}", retry.name())
        }
        Rule::RetryAndHedging { .. } => format!(
            "is declared with `{}`; {reason}",
            other_maker(e.kind).name()
        ),
        Rule::NotFirst => format!("is declared after another policy; {reason}"),
        Rule::AfterRetry => {
            let retry = attempts_by(&declared.iter().map(Declared::kind).collect::<Vec<_>>())
                .unwrap_or(PolicyKind::Retry)
                .name();
            format!(
                "is `call` (around the whole call) but the policy is declared after `{retry}`; \
                 it acts once around the whole call: declare it before `{retry}` (a policy \
                 around each attempt declares that position)"
            )
        }
        Rule::InsideCallPolicy { .. } => format!(
            "is `call` (around the whole call) but the policy is declared after `{other}`; {reason}"
        ),
        Rule::OutsideAttemptPolicy { .. } => format!(
            "is `attempt` (around each attempt) but the policy is declared before `{other}`; {reason}"
        ),
        Rule::InsideChaos { .. } => format!(
            "is `attempt` (around each attempt) but the policy is declared after `{other}`; {reason}"
        ),
    };
    match declared[e.at].as_custom() {
        Some(c) => ConfigError::new(c.name, "position", rule),
        None => ConfigError::new("pipeline", e.kind.name(), rule),
    }
}

/// The other policy that makes attempts: the retry for hedging, hedging
/// for the retry.
pub(crate) fn other_maker(kind: PolicyKind) -> PolicyKind {
    match kind {
        PolicyKind::Hedging => PolicyKind::Retry,
        _ => PolicyKind::Hedging,
    }
}
