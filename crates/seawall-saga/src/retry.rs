//! Retrying compensations with a seawall [`Retry`].
//!
//! A failing compensation is retried under the orchestrator's
//! [`compensation_retry`](crate::OrchestratorBuilder::compensation_retry): a
//! `seawall::Retry`, whose attempts, backoff and jitter mean what they mean in
//! a pipeline, and whose delays come from
//! [`Retry::delay`](seawall::Retry::delay) through the orchestrator's clock and
//! random source. Once the attempts are spent, the saga is
//! [`Stuck`](crate::SagaStatus::Stuck).
//!
//! The attempts do not run *through* a seawall pipeline: each one is logged
//! (`compensation_started` with its number) before it runs and its failure
//! after, so the attempt count survives a restart and a compensation that
//! never succeeds is visible in the log. A pipeline's retry loop runs its
//! attempts out of the orchestrator's sight. For the same reason a retry
//! budget (a token bucket shared by a pipeline's calls) is refused: there is
//! no stream of calls for it to ration. To retry each attempt further, or put
//! a circuit breaker or timeout around it, run a pipeline inside the
//! compensation.
//!
//! Across a restart, a decorrelated backoff starts again from its base, as it
//! does not know the delay the dead process drew.

use std::time::Duration;

use seawall::{ConfigError, Retry};

/// The compensation retry of an orchestrator that was not given one:
/// exponential from 100 ms, doubling, capped at 60 s, 5 attempts, no jitter.
pub(crate) fn default_compensation_retry() -> Retry {
    Retry::exponential(Duration::from_millis(100))
        .cap(Duration::from_secs(60))
        .max_attempts(5)
}

/// Checks `retry` as a pipeline would (seawall states the rules), and refuses
/// a budget.
pub(crate) fn validate(retry: &Retry) -> Result<(), ConfigError> {
    if retry.budget.is_some() {
        return Err(ConfigError::new(
            "retry",
            "budget",
            "is not supported for compensations: each attempt is logged and counted, \
             there is no stream of calls to ration",
        ));
    }
    seawall::Pipeline::builder("seawall-saga-compensation")
        .retry(retry.clone())
        .build()
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use seawall::{RetryBudget, SystemRandom};

    #[test]
    fn the_default_grows_exponentially_to_its_cap() {
        let retry = default_compensation_retry();
        assert_eq!(retry.max_attempts, 5);
        let delays: Vec<_> = (1..=12)
            .map(|a| retry.delay(a, Duration::ZERO, &SystemRandom).as_millis())
            .collect();
        assert_eq!(&delays[..4], &[100, 200, 400, 800]);
        assert_eq!(delays[11], 60_000);
        assert!(validate(&retry).is_ok());
    }

    #[test]
    fn an_invalid_retry_or_a_budget_is_refused() {
        let zero = Retry::constant(Duration::from_secs(1)).max_attempts(0);
        assert_eq!(
            validate(&zero).unwrap_err().to_string(),
            "retry.max_attempts must be >= 1, got 0"
        );
        let budget = Retry::constant(Duration::from_secs(1)).budget(RetryBudget::new(0.1, 10));
        assert_eq!(validate(&budget).unwrap_err().field, "budget");
    }
}
