//! The policies a builder declared, in declaration order: the order check
//! ([`seawall_order::check`], the one statement of the order rules), the
//! numeric rules (each policy's `validate()`), and the sorting into the
//! roles the engine knows (overall or attempt timeout, ...).

use std::time::Duration;

use seawall_order::{check, guards, scope, Misplaced, PolicyKind, Rule, Scope};

use crate::adaptive::AdaptiveLimit;
use crate::breaker::CircuitBreaker;
use crate::bulkhead::Bulkhead;
use crate::chaos::Chaos;
use crate::coalesce::Coalesce;
use crate::cooldown::Cooldown;
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
    let kinds: Vec<PolicyKind> = declared.iter().map(Declared::kind).collect();
    check(&kinds).map_err(misplaced)?;
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
        }
    }
    s
}

/// The builder's wording of a broken order rule: `pipeline.<policy> <rule>`.
pub(crate) fn misplaced(e: Misplaced) -> ConfigError {
    let rule = match e.rule {
        Rule::Twice { .. } => format!("is declared twice; {}", e.rule.reason()),
        Rule::SecondOnSide { scope, .. } => format!(
            "is declared twice for {}; {}",
            scope.describe(),
            e.rule.reason()
        ),
        Rule::BeforeRetry { retry } => {
            format!("is declared before `{}`; {}", retry.name(), e.rule.reason())
        }
        Rule::RetryAndHedging { .. } => format!(
            "is declared with `{}`; {}",
            other_maker(e.kind).name(),
            e.rule.reason()
        ),
        Rule::NotFirst => format!("is declared after another policy; {}", e.rule.reason()),
    };
    ConfigError::new("pipeline", e.kind.name(), rule)
}

/// The other policy that makes attempts: the retry for hedging, hedging
/// for the retry.
pub(crate) fn other_maker(kind: PolicyKind) -> PolicyKind {
    match kind {
        PolicyKind::Hedging => PolicyKind::Retry,
        _ => PolicyKind::Hedging,
    }
}
