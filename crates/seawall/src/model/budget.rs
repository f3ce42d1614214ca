//! Reference model of the retry budget kept in a store
//! ([`RetryBudget::shared`](crate::RetryBudget::shared)), and a driver that
//! checks a store against it.
//!
//! # Rules
//! - The bucket holds thousandths of a token; it starts full, at
//!   `max_tokens x 1000`.
//! - A call's first admission ([`BudgetStep::Deposit`]) adds
//!   `round(ratio x 1000)`, never above `max_tokens x 1000`, whatever the
//!   admission's answer.
//! - A retry's admission ([`BudgetStep::Withdraw`]) is refused with
//!   `retry_budget_exhausted` while the bucket holds less than 1000; when
//!   the policies asked before the budget (circuit, bulkhead, cooldown)
//!   refuse, or the rate limiter asked after it does, nothing is taken;
//!   otherwise 1000 is taken.
//!
//! Over any sequence, the withdrawals are therefore at most
//! `max_tokens + ratio x deposits`.
//!
//! [`check`] runs a sequence of [`Op`]s on a resource with the budget, a
//! bulkhead of `slots` and a fixed window of `permits` (a period of an
//! hour, every operation at one instant: the window never turns), and
//! compares each answer with the model's.

use std::collections::VecDeque;
use std::time::Duration;

use crate::error::RejectionReason;
use crate::store::{AdmitRequest, BudgetStep, Permit, ResourceSpec, ResourceState};
use crate::{Bulkhead, RateLimiter, RetryBudget};

/// The budget's bucket, as plainly as it can be said.
///
/// ```
/// use seawall::model::budget::Bucket;
///
/// let mut b = Bucket::new(0.5, 1);
/// assert!(b.withdraw());
/// assert!(!b.withdraw());
/// b.deposit();
/// b.deposit();
/// assert!(b.withdraw());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    earn: i64,
    cap: i64,
    tokens: i64,
}

impl Bucket {
    /// A full bucket earning `ratio` per call, holding `max_tokens`.
    pub fn new(ratio: f64, max_tokens: u32) -> Self {
        let cap = i64::from(max_tokens) * 1000;
        Bucket {
            earn: (ratio * 1000.0).round() as i64,
            cap,
            tokens: cap,
        }
    }

    /// The thousandths of a token held.
    pub fn tokens(&self) -> i64 {
        self.tokens
    }

    /// Whether a withdrawal would be granted now.
    pub fn has_token(&self) -> bool {
        self.tokens >= 1000
    }

    /// A call's deposit.
    pub fn deposit(&mut self) {
        if self.tokens < self.cap {
            self.tokens = std::cmp::min(self.tokens + self.earn, self.cap);
        }
    }

    /// A retry's withdrawal: `false` (and nothing taken) below one token.
    pub fn withdraw(&mut self) -> bool {
        if self.tokens < 1000 {
            return false;
        }
        self.tokens -= 1000;
        true
    }
}

/// One operation of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// An admission doing `step` (none: an admission of a call's later
    /// pass, which leaves the budget alone).
    Admit(Option<BudgetStep>),
    /// The oldest admitted attempt gives its permit back.
    Release,
}

/// The resource [`check`] runs on: the budget, and optionally a bulkhead
/// and a fixed window.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The budget.
    pub budget: RetryBudget,
    /// The bulkhead's slots, if any.
    pub slots: Option<u32>,
    /// The fixed window's permits, if any.
    pub permits: Option<u32>,
}

impl Setup {
    /// The spec of the resource `name`.
    pub fn spec(&self, name: &str) -> ResourceSpec {
        let mut spec = ResourceSpec::new(name).with_retry_budget(self.budget.clone());
        if let Some(n) = self.slots {
            spec = spec.with_bulkhead(Bulkhead::new(n));
        }
        if let Some(n) = self.permits {
            spec = spec.with_rate_limit(RateLimiter::fixed_window(n, Duration::from_secs(3600)));
        }
        spec
    }
}

/// Runs `ops` at `now` on `state` (bound to [`Setup::spec`]) and on the
/// model; the first answer that differs is the error. Returns the
/// withdrawals granted.
///
/// # Errors
/// A description of the first operation the store answered differently.
pub fn check(
    setup: &Setup,
    state: &dyn ResourceState,
    ops: &[Op],
    now: Duration,
) -> Result<u32, String> {
    let mut bucket = Bucket::new(setup.budget.ratio(), setup.budget.max_tokens());
    let mut held: VecDeque<Permit> = VecDeque::new();
    let mut counted = 0u32;
    let mut granted = 0u32;
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Release => {
                if let Some(p) = held.pop_front() {
                    state.release(None, p);
                }
            }
            Op::Admit(step) => {
                if step == Some(BudgetStep::Deposit) {
                    bucket.deposit();
                }
                let expected = if setup.slots.is_some_and(|n| held.len() as u32 >= n) {
                    Some(RejectionReason::BulkheadFull)
                } else if step == Some(BudgetStep::Withdraw) && !bucket.has_token() {
                    Some(RejectionReason::RetryBudgetExhausted)
                } else if setup.permits.is_some_and(|n| counted >= n) {
                    Some(RejectionReason::RateLimited)
                } else {
                    None
                };
                let mut request = AdmitRequest::new(None, now);
                request.budget = step;
                let answer = state
                    .admit(&request)
                    .map_err(|e| format!("op {i} {op:?}: the store failed: {e}"))?;
                let got = answer.decision.as_ref().err().map(|r| r.reason);
                if got != expected {
                    return Err(format!(
                        "op {i} {op:?}: the store answered {got:?}, the model {expected:?} \
                         (bucket {} thousandths, {} held, {counted} permits counted)",
                        bucket.tokens(),
                        held.len()
                    ));
                }
                if let Ok(permit) = answer.decision {
                    if step == Some(BudgetStep::Withdraw) {
                        assert!(bucket.withdraw(), "the model granted a token it has");
                        granted += 1;
                    }
                    if setup.permits.is_some() {
                        counted += 1;
                    }
                    if setup.slots.is_some() {
                        held.push_back(permit);
                    }
                }
            }
        }
    }
    for p in held {
        state.release(None, p);
    }
    Ok(granted)
}

/// Strategies for [`check`] runs.
pub mod strategy {
    use proptest::prelude::*;

    use super::{Op, Setup};
    use crate::store::BudgetStep;
    use crate::RetryBudget;

    /// A budget: ratios from a thousandth (earning 1 per call) to 2, a few
    /// tokens; a bulkhead and a fixed window half of the time each.
    pub fn setup() -> impl Strategy<Value = Setup> {
        (
            prop_oneof![
                Just(0.001),
                Just(0.1),
                Just(0.25),
                Just(0.333),
                Just(1.0),
                Just(2.0),
                (1u32..2000).prop_map(|m| f64::from(m) / 1000.0),
            ],
            1u32..5,
            proptest::option::of(1u32..4),
            proptest::option::of(1u32..40),
        )
            .prop_map(|(ratio, max_tokens, slots, permits)| Setup {
                budget: RetryBudget::new(ratio, max_tokens).shared(),
                slots,
                permits,
            })
    }

    /// Operations: withdrawals more often than deposits, so that the
    /// bucket runs dry and fills again.
    pub fn ops(len: usize) -> impl Strategy<Value = Vec<Op>> {
        proptest::collection::vec(
            prop_oneof![
                3 => Just(Op::Admit(Some(BudgetStep::Deposit))),
                4 => Just(Op::Admit(Some(BudgetStep::Withdraw))),
                1 => Just(Op::Admit(None)),
                3 => Just(Op::Release),
            ],
            1..len,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StateStore;
    use crate::MemoryStore;

    #[test]
    fn a_rate_limit_refusal_gives_the_token_back() {
        let setup = Setup {
            budget: RetryBudget::new(0.5, 1).shared(),
            slots: None,
            permits: Some(1),
        };
        let store = MemoryStore::new();
        let state = store.bind(&setup.spec("refund")).unwrap();
        let ops = [
            Op::Admit(Some(BudgetStep::Withdraw)),
            Op::Admit(Some(BudgetStep::Deposit)),
            Op::Admit(Some(BudgetStep::Deposit)),
            // The window is spent: refused by the rate limiter, the token
            // stays for the next retry.
            Op::Admit(Some(BudgetStep::Withdraw)),
        ];
        assert_eq!(check(&setup, &*state, &ops, Duration::ZERO), Ok(1));
    }
}
