//! The live run: start the flaky service, let both groups of clients call
//! it until the scenario ends (or Ctrl-C), print the summary. With `--web`
//! the same run is drawn on a page; with `--redis` its circuit is shared
//! with a second process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use seawall::{Error, Event, EventKind, Random, StateStore, SystemRandom};
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::cli::LiveOptions;
use crate::client::{FetchError, HttpClient};
use crate::events::{short, EventLog, View};
use crate::protected::{self, Answer, LastGoodAnswer, Protected};
use crate::report::{Outcome, Stats, Summary};
use crate::scenario::{Group, Scenario};
use crate::service;
use crate::style::{Colour, Style};
use crate::timeline::Timeline;
use crate::{say, Failure};

/// Runs the live demo; `redis_url`: the Redis of `--redis`.
///
/// # Errors
/// When the service cannot start or the pipeline cannot be built (e.g. its
/// store is unreachable), or the page's port cannot be bound.
pub(crate) async fn run(options: &LiveOptions, redis_url: Option<&str>) -> Result<(), Failure> {
    // A prefix of its own, so that no state is left over from an earlier run.
    let prefix = format!("seawall-demo-{}", std::process::id());
    let store = match redis_url {
        Some(url) => Some(open_store(url, &prefix).await?),
        None => None,
    };
    let style = Style::detect();
    let scenario = Scenario::new(options.duration);
    let started = std::time::SystemTime::now();
    let service = service::start(scenario).await.map_err(|e| {
        Failure::Runtime(format!("cannot start the flaky service on 127.0.0.1: {e}"))
    })?;
    let stats = Arc::new(Stats::default());
    let timeline = Arc::new(Timeline::default());
    #[cfg(feature = "web")]
    let page = match options.web {
        Some(port) => Some(
            crate::web::serve(
                port,
                crate::web::Run {
                    scenario,
                    clients: options.clients,
                    stats: Arc::clone(&stats),
                    hits: Arc::clone(&service.hits),
                    timeline: Arc::clone(&timeline),
                    second_process: redis_url.is_some(),
                },
            )
            .await?
            .url(),
        ),
        None => None,
    };
    // Without the feature, `--web` is refused before the run.
    #[cfg(not(feature = "web"))]
    let page: Option<String> = None;
    introduce(&scenario, options, redis_url, service.addr, style);
    if let Some(url) = &page {
        say(&format!(
            "{}\n",
            style.paint(Colour::Bold, &format!("live page: {url}"))
        ));
    }
    let log = EventLog::start(
        scenario,
        style,
        Arc::clone(&stats),
        Arc::clone(&service.hits),
        Arc::clone(&timeline),
        View::BOTH_GROUPS,
    );
    let cache = LastGoodAnswer::default();
    // Told when the circuit opens (`--redis` starts its second process then).
    let opened = Arc::new(Notify::new());
    let listener = {
        let (show, opened) = (log.listener(), Arc::clone(&opened));
        move |event: &Event<'_>| {
            show(event);
            if matches!(event.kind, EventKind::CircuitOpened { .. }) {
                opened.notify_one();
            }
        }
    };
    let pipeline = protected::pipeline(&scenario, store, cache.clone(), listener)
        .map_err(|e| Failure::BadInput(format!("cannot build the protected pipeline: {e}")))?;
    #[cfg(feature = "redis")]
    let second = redis_url.map(|url| {
        crate::two_processes::arrange(crate::two_processes::Arrangement {
            redis_url: url.to_owned(),
            prefix: prefix.clone(),
            service: service.addr,
            started,
            options: options.clone(),
            style,
            opened,
            cache: cache.clone(),
        })
    });
    // Without the feature, `--redis` is refused before the run.
    #[cfg(not(feature = "redis"))]
    let second: Option<NoSecondProcess> = {
        let _ = (opened, started);
        None
    };

    let mut callers = Vec::new();
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
            callers.push((group, stagger, caller));
        }
    }
    let interrupted = call_until(callers, scenario, scenario.end(), &stats, style).await;
    log.finish().await;
    let two_processes = second.is_some();
    if let Some(second) = second {
        second.finish().await?;
    }
    // From here on nothing changes: the page shows the run as done.
    timeline.finish(scenario.elapsed(Instant::now()));
    let mut summary = Summary::new(&stats, &service.hits, &scenario, options.clients);
    if two_processes {
        summary = summary.with_second_process();
    }
    summary.print(style);
    if let Some(url) = page {
        if !interrupted {
            say(&format!("the live page stays up at {url} until Ctrl-C\n"));
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    Ok(())
}

/// No second process without the `redis` feature.
#[cfg(not(feature = "redis"))]
enum NoSecondProcess {}

#[cfg(not(feature = "redis"))]
impl NoSecondProcess {
    async fn finish(self) -> Result<(), Failure> {
        match self {}
    }
}

/// Lets every caller call, each after its stagger, until `until` or Ctrl-C;
/// `true` when interrupted.
pub(crate) async fn call_until(
    callers: Vec<(Group, Duration, Caller)>,
    scenario: Scenario,
    until: Instant,
    stats: &Arc<Stats>,
    style: Style,
) -> bool {
    let interrupted = Arc::new(AtomicBool::new(false));
    let mut tasks = JoinSet::new();
    for (group, stagger, caller) in callers {
        let (stats, interrupted) = (Arc::clone(stats), Arc::clone(&interrupted));
        tasks.spawn(async move {
            tokio::time::sleep(stagger).await;
            caller
                .keep_calling(group, scenario, until, &stats, &interrupted)
                .await;
        });
    }
    tokio::select! {
        () = wait_all(&mut tasks) => {}
        Ok(()) = tokio::signal::ctrl_c() => {
            interrupted.store(true, Ordering::Relaxed);
            say(&format!("{}\n", style.paint(Colour::Bold, "interrupted: finishing the calls in flight")));
            wait_all(&mut tasks).await;
        }
    }
    interrupted.load(Ordering::Relaxed)
}

/// The Redis store of `--redis`, keys under `prefix`.
///
/// # Errors
/// A malformed URL or an unreachable server (`BadInput`).
#[cfg(feature = "redis")]
pub(crate) async fn open_store(url: &str, prefix: &str) -> Result<Arc<dyn StateStore>, Failure> {
    let store = seawall_redis::RedisStore::builder(url)
        .prefix(prefix)
        .build()
        .map_err(|e| Failure::BadInput(format!("invalid --redis-url: {e}")))?;
    store
        .ping_async()
        .await
        .map_err(|e| Failure::BadInput(format!("cannot reach Redis at {}: {e}", redacted(url))))?;
    Ok(Arc::new(store))
}

/// Without the `redis` feature, `--redis` is refused.
#[cfg(not(feature = "redis"))]
pub(crate) async fn open_store(_url: &str, _prefix: &str) -> Result<Arc<dyn StateStore>, Failure> {
    Err(Failure::BadInput(
        "this build has no Redis support".to_owned(),
    ))
}

/// `url` without its password, if it has one.
pub(crate) fn redacted(url: &str) -> String {
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

fn introduce(
    scenario: &Scenario,
    options: &LiveOptions,
    redis_url: Option<&str>,
    addr: std::net::SocketAddr,
    style: Style,
) {
    let store = match redis_url {
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
    let lines = lines.into_iter().chain(redis_url.map(|_| {
        "once the circuit opens, a second process starts with the same pipeline and the same \
         Redis: its lines start with `second | `"
            .to_owned()
    }));
    for line in lines {
        say(&format!("{}\n", style.paint(Colour::Bold, &line)));
    }
}

/// One client of either group.
pub(crate) enum Caller {
    /// A plain client.
    Unprotected {
        /// The client.
        client: HttpClient,
    },
    /// The same client through the protected pipeline.
    Protected {
        /// The client.
        client: HttpClient,
        /// The pipeline.
        pipeline: Protected,
        /// The fallback's last good answer.
        cache: LastGoodAnswer,
    },
}

impl Caller {
    /// Calls, records, pauses, again, until `until`.
    async fn keep_calling(
        &self,
        group: Group,
        scenario: Scenario,
        until: Instant,
        stats: &Stats,
        interrupted: &AtomicBool,
    ) {
        while Instant::now() < until && !interrupted.load(Ordering::Relaxed) {
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
