//! The protected group's seawall pipeline: this is the part to copy.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use seawall::pipeline::WithFallback;
use seawall::{
    Bulkhead, CircuitBreaker, ConfigError, Context, Cooldown, Error, Event, Jitter, Pipeline,
    RejectionReason, Retry, StateStore,
};

use crate::client::{self, FetchError, HttpClient};
use crate::scenario::Scenario;

/// What a protected caller gets back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A fresh answer from the service.
    Fresh(String),
    /// The last good answer, served by the fallback.
    Cached {
        /// The answer.
        body: String,
        /// Why the service was not asked, or did not answer.
        cause: FallbackCause,
    },
}

/// Why the fallback answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FallbackCause {
    /// A seawall policy refused the call before it reached the service.
    Rejected(RejectionReason),
    /// Every attempt failed, or the time budget ran out.
    Failed,
}

/// The protected pipeline: its answers are [`Answer`]s, its errors
/// [`FetchError`]s. Clones share one circuit, bulkhead and cooldown.
pub(crate) type Protected = Pipeline<WithFallback<Answer, FetchError>>;

/// The last answer the service gave, shared by every protected caller.
#[derive(Debug, Clone, Default)]
pub(crate) struct LastGoodAnswer(Arc<Mutex<Option<String>>>);

impl LastGoodAnswer {
    /// Keeps `body` as the last good answer.
    pub(crate) fn keep(&self, body: &str) {
        let mut last = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if last.as_deref() != Some(body) {
            *last = Some(body.to_owned());
        }
    }

    /// The last good answer, if any.
    pub(crate) fn get(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Builds the pipeline, outermost policy first:
///
/// - a budget of `call_budget` for the whole call, retries included;
/// - up to 3 attempts, exponential backoff from 100 ms with full jitter
///   (and never sooner than a `Retry-After` says);
/// - each attempt bounded by the client timeout;
/// - a circuit breaker that opens when half of the last 20 attempts failed;
/// - a bulkhead of 8 attempts in flight (the 9th is refused at once);
/// - a cooldown that a `Retry-After` opens for every caller: a call waits
///   for its end when it is at most 100 ms away, and is refused otherwise;
/// - a fallback serving the last good answer.
///
/// `store` holds the state of the circuit, bulkhead and cooldown (default:
/// in this process's memory); `on_event` sees everything that happens.
///
/// # Errors
/// When the configuration is invalid or the store cannot be prepared.
pub(crate) fn pipeline(
    scenario: &Scenario,
    store: Option<Arc<dyn StateStore>>,
    cache: LastGoodAnswer,
    on_event: impl Fn(&Event<'_>) + Send + Sync + 'static,
) -> Result<Protected, ConfigError> {
    let builder = Pipeline::builder("flaky-service")
        .timeout(scenario.call_budget)
        .retry(
            Retry::exponential(Duration::from_millis(100))
                .max_attempts(3)
                .cap(Duration::from_secs(1))
                .jitter(Jitter::Full),
        )
        .timeout(scenario.client_timeout)
        .circuit_breaker(
            CircuitBreaker::failure_rate(0.5)
                .count_window(20)
                .minimum_calls(10)
                .cooldown(scenario.circuit_cooldown)
                .half_open_calls(1),
        )
        .bulkhead(Bulkhead::new(8))
        .cooldown(Cooldown::new().max_wait(Duration::from_millis(100)))
        .classify(client::classify)
        .on_event(on_event)
        .fallback_sync(move |error: Error<FetchError>, _ctx: Context| {
            let cause = match error.rejection() {
                Some(rejection) => FallbackCause::Rejected(rejection.reason),
                None => FallbackCause::Failed,
            };
            match cache.get() {
                Some(body) => Ok(Answer::Cached { body, cause }),
                None => Err(FetchError::NoCachedAnswer),
            }
        });
    match store {
        Some(store) => builder.store(store).build(),
        None => builder.build(),
    }
}

/// One protected call: the pipeline runs the request, and each attempt hands
/// the time it has left (`ctx.remaining()`: its own timeout or what is left
/// of the call's budget, whichever ends first) to the client as its timeout.
///
/// # Errors
/// Only when the fallback had nothing to serve.
pub(crate) async fn call(
    pipeline: &Protected,
    client: &HttpClient,
    cache: &LastGoodAnswer,
) -> Result<Answer, Error<FetchError>> {
    pipeline
        .run(|ctx| async move {
            let timeout = ctx.remaining().unwrap_or(Duration::from_secs(1));
            let body = client.get(timeout).await?;
            cache.keep(&body);
            Ok(Answer::Fresh(body))
        })
        .await
}
