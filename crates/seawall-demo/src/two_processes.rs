//! `--redis`: two processes, one circuit.
//!
//! The first process is the live run, its protected pipeline's state in
//! Redis. When its circuit opens, it starts a second process (this binary
//! again, with `--role second`): the same protected pipeline (same name,
//! same Redis, same key prefix) and clients of its own, calling the same
//! flaky service until the service's phase ends. The second process has
//! never seen the service fail, yet the circuit it finds open in Redis
//! refuses its calls before they leave the process, and its fallback serves
//! the last good answer, which the first process keeps in Redis. Only a
//! probe of the half-open circuit, when the second process is the one that
//! draws it, reaches the service. The first process prints the second's
//! lines after `second | `.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use seawall::{Event, EventKind, RejectionReason};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::cli::{LiveOptions, SecondOptions};
use crate::client::HttpClient;
use crate::events::{EventLog, View};
use crate::live::{self, redacted, Caller};
use crate::protected::{self, LastGoodAnswer};
use crate::report::{tally_json, Stats};
use crate::scenario::{Group, Scenario};
use crate::service::{Hits, SECOND_PROCESS};
use crate::style::{Colour, Style};
use crate::timeline::Timeline;
use crate::{say, say_as, Failure};

/// What starts each line of the second process, as the first prints them.
pub(crate) const ROLE_SECOND: &str = "second | ";

/// How often the first process puts its last good answer in Redis.
const PUBLISH_EVERY: Duration = Duration::from_millis(200);

/// How long the last good answer stays in Redis (every key expires).
const ANSWER_TTL_SECS: u64 = 3600;

/// The key of the last good answer, under the run's prefix.
fn answer_key(prefix: &str) -> String {
    format!("{prefix}:demo:last-good-answer")
}

/// What the first process needs to start the second.
#[derive(Debug)]
pub(crate) struct Arrangement {
    /// The shared Redis.
    pub(crate) redis_url: String,
    /// The key prefix of the shared state.
    pub(crate) prefix: String,
    /// The flaky service.
    pub(crate) service: SocketAddr,
    /// When the first process's run started.
    pub(crate) started: SystemTime,
    /// The first process's options (duration, clients).
    pub(crate) options: LiveOptions,
    /// Whether the output is painted.
    pub(crate) style: Style,
    /// Told when the first process's circuit opens.
    pub(crate) opened: Arc<Notify>,
    /// The first process's last good answer.
    pub(crate) cache: LastGoodAnswer,
}

/// The second process, started or waiting for the circuit to open.
#[derive(Debug)]
pub(crate) struct SecondProcess {
    publisher: JoinHandle<()>,
    starter: JoinHandle<Result<(), Failure>>,
    started: Arc<AtomicBool>,
}

/// Keeps the last good answer in Redis and starts the second process when
/// the circuit opens.
pub(crate) fn arrange(arrangement: Arrangement) -> SecondProcess {
    let publisher = tokio::spawn(publish_answers(
        arrangement.redis_url.clone(),
        answer_key(&arrangement.prefix),
        arrangement.cache.clone(),
    ));
    let started = Arc::new(AtomicBool::new(false));
    let starter = tokio::spawn(start_when_open(arrangement, Arc::clone(&started)));
    SecondProcess {
        publisher,
        starter,
        started,
    }
}

impl SecondProcess {
    /// Waits for the second process to end (if it started).
    ///
    /// # Errors
    /// When it could not start or failed.
    pub(crate) async fn finish(self) -> Result<(), Failure> {
        self.publisher.abort();
        if !self.started.load(Ordering::SeqCst) {
            self.starter.abort();
            say("the circuit never opened: no second process was started\n");
            return Ok(());
        }
        self.starter
            .await
            .map_err(|e| Failure::Runtime(format!("the second process's relay panicked: {e}")))?
    }
}

/// Puts the last good answer in Redis whenever it changed, until aborted.
/// A Redis that does not answer only leaves the second process without it.
async fn publish_answers(url: String, key: String, cache: LastGoodAnswer) {
    let Ok(client) = redis::Client::open(url) else {
        return;
    };
    let Ok(mut connection) = client.get_multiplexed_async_connection().await else {
        return;
    };
    let mut published = None;
    let mut tick = tokio::time::interval(PUBLISH_EVERY);
    loop {
        tick.tick().await;
        let answer = cache.get();
        if answer.is_none() || answer == published {
            continue;
        }
        let set: redis::RedisResult<()> = redis::cmd("SET")
            .arg(&key)
            .arg(answer.as_deref())
            .arg("EX")
            .arg(ANSWER_TTL_SECS)
            .query_async(&mut connection)
            .await;
        if set.is_ok() {
            published = answer;
        }
    }
}

/// The last good answer in Redis, if any.
async fn fetch_answer(url: &str, key: &str) -> Result<Option<String>, redis::RedisError> {
    let client = redis::Client::open(url)?;
    let mut connection = client.get_multiplexed_async_connection().await?;
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut connection)
        .await
}

/// Time since the Unix epoch.
fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Waits for the circuit to open, starts the second process, prints its
/// lines and waits for its end.
async fn start_when_open(a: Arrangement, started: Arc<AtomicBool>) -> Result<(), Failure> {
    a.opened.notified().await;
    started.store(true, Ordering::SeqCst);
    let exe = std::env::current_exe().map_err(|e| {
        Failure::Runtime(format!("cannot find this program to start it again: {e}"))
    })?;
    let since = a
        .started
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let mut command = Command::new(exe);
    command
        .args(["--role", "second", "--service", &a.service.to_string()])
        .args(["--redis-url", &a.redis_url, "--prefix", &a.prefix])
        .args(["--since-unix-ms", &since.to_string()])
        .args(["--duration", &a.options.duration.as_secs().to_string()])
        .args(["--clients", &a.options.clients.to_string()]);
    if a.style.is_coloured() {
        command.arg("--colour");
    }
    command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .map_err(|e| Failure::Runtime(format!("cannot start the second process: {e}")))?;
    say(&format!(
        "{}\n",
        a.style.paint(
            Colour::Bold,
            &format!(
                ">> the circuit is open: second process started (pid {}), same pipeline, same Redis",
                child.id().unwrap_or_default()
            )
        )
    ));
    let relays = [relay(child.stdout.take()), relay(child.stderr.take())];
    let status = child
        .wait()
        .await
        .map_err(|e| Failure::Runtime(format!("cannot wait for the second process: {e}")))?;
    for relay in relays {
        let _ = relay.await;
    }
    if status.success() {
        Ok(())
    } else {
        Err(Failure::Runtime(format!(
            "the second process failed ({status})"
        )))
    }
}

/// Prints each line of `stream` after [`ROLE_SECOND`].
fn relay(stream: Option<impl AsyncRead + Unpin + Send + 'static>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let Some(stream) = stream else {
            return;
        };
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            say_as(ROLE_SECOND, &format!("{line}\n"));
        }
    })
}

/// The second process: protected clients of its own, sharing the first
/// process's circuit, until the service's current phase ends. Prints its
/// live view, a summary and a `SECOND {json}` line.
///
/// # Errors
/// When Redis cannot be reached or the pipeline cannot be built.
pub(crate) async fn second(options: &SecondOptions) -> Result<(), Failure> {
    let style = Style::with_colour(options.colour);
    let now = Instant::now();
    let behind = unix_now().saturating_sub(Duration::from_millis(options.since_unix_ms));
    let scenario = Scenario::starting_at(options.duration, now.checked_sub(behind).unwrap_or(now));
    let phase = scenario.phase_at(now);
    let until = scenario.ends(phase);
    let store = live::open_store(&options.redis_url, &options.prefix).await?;
    let cache = LastGoodAnswer::default();
    let seeded = fetch_answer(&options.redis_url, &answer_key(&options.prefix)).await;
    let seeded = match seeded {
        Ok(Some(answer)) => {
            cache.keep(&answer);
            format!("the fallback's last good answer, from Redis: {answer}")
        }
        Ok(None) => "no last good answer in Redis: the fallback has nothing to serve".to_owned(),
        Err(e) => format!("cannot read the last good answer from Redis ({e})"),
    };
    let intro = [
        format!(
            "second process (pid {}): {} protected clients, the same pipeline, state in Redis at {} \
             (prefix {}); it calls the service while it is {}, {:.1} s",
            std::process::id(),
            options.clients,
            redacted(&options.redis_url),
            options.prefix,
            phase.label(),
            until.saturating_duration_since(now).as_secs_f64()
        ),
        seeded,
    ];
    for line in intro {
        say(&format!("{}\n", style.paint(Colour::Bold, &line)));
    }

    let stats = Arc::new(Stats::default());
    // The requests this process sends, counted as it sends them.
    let sent = Arc::new(Hits::default());
    let log = EventLog::start(
        scenario,
        style,
        Arc::clone(&stats),
        Arc::clone(&sent),
        Arc::new(Timeline::default()),
        View {
            groups: &[Group::Protected],
            shared_circuit: true,
        },
    );
    let probes = Arc::new(AtomicU64::new(0));
    let listener = {
        let (show, probes) = (log.listener(), Arc::clone(&probes));
        move |event: &Event<'_>| {
            show(event);
            // The call admitted as the half-open circuit's probe.
            if matches!(event.kind, EventKind::CircuitHalfOpened) {
                probes.fetch_add(1, Ordering::Relaxed);
            }
        }
    };
    let pipeline = protected::pipeline(&scenario, Some(store), cache.clone(), listener)
        .map_err(|e| Failure::BadInput(format!("cannot build the protected pipeline: {e}")))?;
    let callers = (0..options.clients)
        .map(|i| {
            let stagger = scenario.think_time * i as u32 / options.clients as u32;
            let client = HttpClient::labelled(options.service, SECOND_PROCESS).counting(
                Arc::clone(&sent),
                Group::Protected,
                scenario,
            );
            let caller = Caller::Protected {
                client,
                pipeline: pipeline.clone(),
                cache: cache.clone(),
            };
            (Group::Protected, stagger, caller)
        })
        .collect();
    live::call_until(callers, scenario, until, &stats, style).await;
    log.finish().await;

    let total = stats.total(Group::Protected);
    let (sent, probes) = (sent.total(Group::Protected), probes.load(Ordering::Relaxed));
    let answers = total.answers();
    let refused = total.refused(RejectionReason::CircuitOpen);
    let requests = match (sent, probes) {
        (0, _) => "it sent the service no request".to_owned(),
        (1, 1) => "it sent the service 1 request: the probe of the half-open circuit, \
                   when this process drew it"
            .to_owned(),
        (sent, probes) if sent == probes => format!(
            "it sent the service {sent} requests, each a probe of the half-open circuit \
             this process drew"
        ),
        (sent, probes) => format!(
            "it sent the service {sent} request{}, {probes} of them probes of the half-open circuit",
            plural(sent)
        ),
    };
    let text = format!(
        "\nsecond process: {} calls; {} fresh answers, {} from the fallback, {} errors;\n\
         {refused} calls refused by the circuit the first process opened in Redis, \
         answered by the fallback; {requests}.\n",
        total.calls(),
        answers.fresh,
        answers.fallback,
        answers.errors,
    );
    say(&format!("{}\n", style.paint(Colour::Bold, &text)));
    say(&format!(
        "SECOND {{\"phase\":\"{}\",\"probes\":{probes},{}}}\n",
        phase.name(),
        tally_json(&total, sent)
    ));
    Ok(())
}

/// `s` unless `n` is 1.
fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
