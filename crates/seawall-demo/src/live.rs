//! The live run: start the flaky service, let both groups of clients call
//! it until the scenario ends (or Ctrl-C), print the summary.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use seawall::{Error, Random, StateStore, SystemRandom};
use tokio::task::JoinSet;

use crate::cli::LiveOptions;
use crate::client::{FetchError, HttpClient};
use crate::events::{short, EventLog};
use crate::protected::{self, Answer, LastGoodAnswer, Protected};
use crate::report::{Outcome, Stats, Summary};
use crate::scenario::{Group, Scenario};
use crate::service;
use crate::style::{Colour, Style};
use crate::{say, Failure};

/// Runs the live demo.
///
/// # Errors
/// When the service cannot start or the pipeline cannot be built (e.g. its
/// store is unreachable).
pub(crate) async fn run(options: &LiveOptions) -> Result<(), Failure> {
    let store = open_store(options.redis.as_deref()).await?;
    let style = Style::detect();
    let scenario = Scenario::new(options.duration);
    let service = service::start(scenario).await.map_err(|e| {
        Failure::Runtime(format!("cannot start the flaky service on 127.0.0.1: {e}"))
    })?;
    introduce(&scenario, options, service.addr, style);
    let stats = Arc::new(Stats::default());
    let log = EventLog::start(
        scenario,
        style,
        Arc::clone(&stats),
        Arc::clone(&service.hits),
    );
    let cache = LastGoodAnswer::default();
    let pipeline = protected::pipeline(&scenario, store, cache.clone(), log.listener())
        .map_err(|e| Failure::BadInput(format!("cannot build the protected pipeline: {e}")))?;

    let interrupted = Arc::new(AtomicBool::new(false));
    let mut callers = JoinSet::new();
    for i in 0..options.clients {
        // Spread the clients' first calls over one think time.
        let stagger = scenario.think_time * i as u32 / options.clients as u32;
        for group in Group::ALL {
            let client = HttpClient::new(service.addr, group);
            let caller = match group {
                Group::Unprotected => Caller::Unprotected { client },
                Group::Protected => Caller::Protected {
                    client,
                    pipeline: pipeline.clone(),
                    cache: cache.clone(),
                },
            };
            let (stats, interrupted) = (Arc::clone(&stats), Arc::clone(&interrupted));
            callers.spawn(async move {
                tokio::time::sleep(stagger).await;
                caller
                    .keep_calling(group, scenario, &stats, &interrupted)
                    .await;
            });
        }
    }

    tokio::select! {
        () = wait_all(&mut callers) => {}
        Ok(()) = tokio::signal::ctrl_c() => {
            interrupted.store(true, Ordering::Relaxed);
            say(&format!("{}\n", style.paint(Colour::Bold, "interrupted: finishing the calls in flight")));
            wait_all(&mut callers).await;
        }
    }
    log.finish().await;
    Summary::new(&stats, &service.hits, &scenario, options.clients).print(style);
    Ok(())
}

/// Where the protected pipeline keeps its state: in Redis with `--redis`,
/// else in this process's memory (`None`: seawall's default store).
///
/// # Errors
/// A malformed URL or an unreachable server (`BadInput`).
#[cfg(feature = "redis")]
async fn open_store(redis: Option<&str>) -> Result<Option<Arc<dyn StateStore>>, Failure> {
    let Some(url) = redis else {
        return Ok(None);
    };
    // A prefix of its own, so that no state is left over from an earlier run.
    let store = seawall_redis::RedisStore::builder(url)
        .prefix(format!("seawall-demo-{}", std::process::id()))
        .build()
        .map_err(|e| Failure::BadInput(format!("invalid --redis URL: {e}")))?;
    store
        .ping_async()
        .await
        .map_err(|e| Failure::BadInput(format!("cannot reach Redis at {}: {e}", redacted(url))))?;
    Ok(Some(Arc::new(store)))
}

/// Without the `redis` feature, `--redis` is refused.
#[cfg(not(feature = "redis"))]
async fn open_store(redis: Option<&str>) -> Result<Option<Arc<dyn StateStore>>, Failure> {
    match redis {
        None => Ok(None),
        Some(_) => Err(Failure::BadInput(
            "this build has no Redis support".to_owned(),
        )),
    }
}

/// `url` without its password, if it has one.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***{}", &url[..scheme], &url[at..])
        }
        _ => url.to_owned(),
    }
}

async fn wait_all(callers: &mut JoinSet<()>) {
    while callers.join_next().await.is_some() {}
}

fn introduce(scenario: &Scenario, options: &LiveOptions, addr: std::net::SocketAddr, style: Style) {
    let store = match &options.redis {
        Some(url) => format!("state in Redis at {}", redacted(url)),
        None => "state in memory".to_owned(),
    };
    let lines = [
        format!(
            "flaky service on http://{addr}/quote, {} s in 5 phases",
            options.duration.as_secs()
        ),
        format!(
            "{} unprotected clients: plain HTTP client, timeout {}, no retry",
            options.clients,
            short(scenario.client_timeout)
        ),
        format!(
            "{} protected clients: the same client through a seawall pipeline ({store}):",
            options.clients
        ),
        format!(
            "  {} per call, 3 attempts with jittered backoff, {} per attempt, circuit breaker, \
             bulkhead of 8, cooldown on Retry-After, fallback to the last good answer",
            short(scenario.call_budget),
            short(scenario.client_timeout)
        ),
        "once a second, per group: requests that reached the service, and the answers callers got \
         (fresh, fallback, errors); >> marks a change of the circuit or a cooldown, as it happens"
            .to_owned(),
    ];
    for line in lines {
        say(&format!("{}\n", style.paint(Colour::Bold, &line)));
    }
}

/// One client of either group.
enum Caller {
    Unprotected {
        client: HttpClient,
    },
    Protected {
        client: HttpClient,
        pipeline: Protected,
        cache: LastGoodAnswer,
    },
}

impl Caller {
    /// Calls, records, pauses, again, until the scenario ends.
    async fn keep_calling(
        &self,
        group: Group,
        scenario: Scenario,
        stats: &Stats,
        interrupted: &AtomicBool,
    ) {
        while Instant::now() < scenario.end() && !interrupted.load(Ordering::Relaxed) {
            let started = Instant::now();
            let outcome = self.call(scenario.client_timeout).await;
            stats.record(
                group,
                scenario.phase_at(started),
                outcome,
                started.elapsed(),
            );
            // Half to one and a half think times: callers that wake together
            // (after a cooldown, say) drift apart again.
            let think = scenario.think_time.mul_f64(0.5 + SystemRandom.next_f64());
            tokio::time::sleep(think).await;
        }
    }

    async fn call(&self, timeout: Duration) -> Outcome {
        match self {
            Caller::Unprotected { client } => match client.get(timeout).await {
                Ok(_) => Outcome::Answered,
                Err(e) => Outcome::Error(e.kind()),
            },
            Caller::Protected {
                client,
                pipeline,
                cache,
            } => match protected::call(pipeline, client, cache).await {
                Ok(Answer::Fresh(_)) => Outcome::Answered,
                Ok(Answer::Cached { cause, .. }) => Outcome::Fallback(cause),
                Err(e) => Outcome::Error(error_kind(&e)),
            },
        }
    }
}

/// A short name for an error that reached a protected caller.
fn error_kind(e: &Error<FetchError>) -> &'static str {
    match e {
        Error::Rejected(_) => "rejected",
        Error::Timeout(_) => "timeout",
        Error::Store(_) => "store",
        other => other.operation_error().map_or("other", FetchError::kind),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_not_printed() {
        assert_eq!(
            redacted("redis://user:secret@127.0.0.1:6379/0"),
            "redis://***@127.0.0.1:6379/0"
        );
        assert_eq!(redacted("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
    }
}
