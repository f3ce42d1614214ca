//! Where each policy of a [seawall](https://crates.io/crates/seawall)
//! pipeline may stand, stated once.
//!
//! A pipeline is a list of policies in declaration order, outermost first.
//! This crate holds the list of policies ([`PolicyKind`], one registration
//! line each), where each may stand ([`Place`]), what a policy covers at its
//! position ([`scope`]) and the check of a whole list ([`check`]). The
//! pipeline builder, the configuration files and the `#[resilient]` attribute
//! all call these functions and only word the answer in their own
//! vocabulary; none of them restates a rule. It has no dependencies so that
//! the proc-macro crate can use it at compile time.
//!
//! The fallback is not part of the list: it is always outermost, wherever it
//! is declared.
//!
//! # Adding a policy
//! Its module in `seawall` (the settings, their `validate()` and the
//! policy's rules), one line in the list below, then the ways to declare
//! it: a variant of `Declared` and a builder method in `seawall`'s
//! `pipeline/`, a section in the configuration files (`config/raw.rs`) and
//! a key of `#[resilient]` (`seawall-macros`). None of them states where
//! the policy may stand or what its values may be.
//!
//! This crate is an implementation detail of seawall. Its enums are
//! exhaustive on purpose: a new policy or rule makes the compiler point at
//! every place that must word it.
//!
//! ```
//! use seawall_order::{check, scope, PolicyKind, Rule, Scope};
//!
//! let declared = [PolicyKind::Timeout, PolicyKind::Retry, PolicyKind::Timeout];
//! assert_eq!(check(&declared), Ok(()));
//! assert_eq!(scope(&declared, 0), Scope::Call);
//! assert_eq!(scope(&declared, 2), Scope::Attempt);
//!
//! let e = check(&[PolicyKind::Bulkhead, PolicyKind::Retry]).unwrap_err();
//! assert_eq!((e.at, e.kind), (0, PolicyKind::Bulkhead));
//! assert_eq!(e.rule, Rule::BeforeRetry { retry: 1 });
//! ```
#![forbid(unsafe_code)]

/// Declares the policies: one line per policy, `Kind = "name", Place;`.
macro_rules! policies {
    ($( $(#[$doc:meta])* $kind:ident = $name:literal, $place:ident; )*) => {
        /// A policy a pipeline can declare.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum PolicyKind {
            $( $(#[$doc])* $kind, )*
        }

        impl PolicyKind {
            /// Every policy, in registration order.
            pub const ALL: &'static [PolicyKind] = &[$(PolicyKind::$kind),*];

            /// The policy's name, as the builder method, the configuration
            /// key and the attribute key spell it.
            pub const fn name(self) -> &'static str {
                match self {
                    $(PolicyKind::$kind => $name,)*
                }
            }

            /// Where the policy may stand.
            pub const fn place(self) -> Place {
                match self {
                    $(PolicyKind::$kind => Place::$place,)*
                }
            }
        }
    };
}

policies! {
    /// A timeout: of the whole call before the retry, of each attempt after it.
    Timeout = "timeout", EitherSide;
    /// The retry.
    Retry = "retry", Retry;
    /// The circuit breaker.
    CircuitBreaker = "circuit_breaker", AfterRetry;
    /// The bulkhead.
    Bulkhead = "bulkhead", AfterRetry;
    /// The cooldown opened by retry-after hints.
    Cooldown = "cooldown", AfterRetry;
    /// The rate limiter.
    RateLimiter = "rate_limiter", AfterRetry;
}

impl PolicyKind {
    /// `true` for the policies that keep state in the pipeline's store.
    pub const fn is_stateful(self) -> bool {
        matches!(self.place(), Place::AfterRetry)
    }
}

/// Where a policy may stand in the declared list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The retry itself, declared once. It splits the list: what comes
    /// before it covers the whole call, what comes after it each attempt.
    Retry,
    /// On either side of the retry, at most once on each side: before it
    /// (or without a retry) it covers the whole call, after it each attempt.
    EitherSide,
    /// After the retry (or in a pipeline without one), once: the policy
    /// guards each attempt through the store.
    AfterRetry,
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
    /// A policy of [`Place::AfterRetry`] declared before the retry at
    /// index `retry`.
    BeforeRetry {
        /// The retry's declaration.
        retry: usize,
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
            Rule::BeforeRetry { .. } => "stateful policies guard each attempt",
        }
    }
}

/// Checks a declared list, outermost first. The first declaration (in
/// list order) that breaks a rule is reported; a policy declared before the
/// retry is reported when the retry is reached.
///
/// # Errors
/// The first [`Misplaced`] policy.
pub fn check(declared: &[PolicyKind]) -> Result<(), Misplaced> {
    for (i, &kind) in declared.iter().enumerate() {
        let here = scope(declared, i);
        let earlier = |j: &usize| {
            declared[*j] == kind
                && (kind.place() != Place::EitherSide || scope(declared, *j) == here)
        };
        if let Some(first) = (0..i).find(earlier) {
            let rule = match kind.place() {
                Place::EitherSide => Rule::SecondOnSide { scope: here, first },
                Place::Retry | Place::AfterRetry => Rule::Twice { first },
            };
            return Err(Misplaced { at: i, kind, rule });
        }
        if kind.place() == Place::Retry {
            if let Some(j) = (0..i).find(|&j| declared[j].place() == Place::AfterRetry) {
                return Err(Misplaced {
                    at: j,
                    kind: declared[j],
                    rule: Rule::BeforeRetry { retry: i },
                });
            }
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
    fn stateful_policies_come_after_the_retry() {
        assert_eq!(check(&[Bulkhead, CircuitBreaker]), Ok(()));
        assert_eq!(check(&[Retry, RateLimiter, Cooldown]), Ok(()));
        let e = check(&[Timeout, Cooldown, Bulkhead, Retry]).unwrap_err();
        assert_eq!(e.at, 1, "the first one declared is named");
        assert_eq!(e.kind, Cooldown);
        assert_eq!(e.rule, Rule::BeforeRetry { retry: 3 });
    }

    #[test]
    fn the_first_broken_rule_in_list_order_is_reported() {
        let e = check(&[CircuitBreaker, CircuitBreaker, Retry]).unwrap_err();
        assert_eq!(e.rule, Rule::Twice { first: 0 });
        let e = check(&[CircuitBreaker, Retry, Retry]).unwrap_err();
        assert_eq!(e.rule, Rule::BeforeRetry { retry: 1 });
    }

    /// Every list of up to four declarations, against the rules counted
    /// per side of the first retry.
    #[test]
    fn agrees_with_a_count_of_each_side() {
        fn accepted(d: &[PolicyKind]) -> bool {
            let retry = d.iter().position(|k| *k == Retry);
            let (before, after) = d.split_at(retry.unwrap_or(d.len()));
            let count = |s: &[PolicyKind], k| s.iter().filter(|x| **x == k).count();
            let stateful_before = retry.is_some() && before.iter().any(|k| k.is_stateful());
            PolicyKind::ALL.iter().all(|&k| match k {
                Timeout => count(before, k) <= 1 && count(after, k) <= 1,
                _ => count(d, k) <= 1,
            }) && !stateful_before
        }
        let all = PolicyKind::ALL;
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
        assert_eq!(lists.len(), 1 + 6 + 36 + 216 + 1296);
        for l in &lists {
            assert_eq!(check(l).is_ok(), accepted(l), "{l:?}");
        }
    }
}
