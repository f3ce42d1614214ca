//! Serving workers: [`Orchestrator::serve`] runs submitted and abandoned
//! sagas until it is shut down.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{Halt, Inner, Orchestrator, SagaOutcome};
use crate::error::SagaError;
use crate::log::{Lease, Wakeups};
use crate::transition::SagaStatus;

/// Options of [`Orchestrator::serve`].
///
/// # Default
///
/// At most 32 sagas in flight, a poll every 5 s, a grace period of 30 s.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    max_in_flight: usize,
    poll_interval: Duration,
    grace: Duration,
}

impl ServeOptions {
    /// The defaults.
    pub fn new() -> Self {
        ServeOptions {
            max_in_flight: 32,
            poll_interval: Duration::from_secs(5),
            grace: Duration::from_secs(30),
        }
    }

    /// How many sagas this worker drives at the same time (at least 1). It
    /// claims no more until one of them ends.
    pub fn max_in_flight(mut self, max: usize) -> Self {
        self.max_in_flight = max.max(1);
        self
    }

    /// How often the worker looks for work when nothing woke it (at least
    /// 1 ms): it finds what a lost notification announced, sagas whose
    /// worker died once their lease has expired, and, on logs without
    /// notifications, everything submitted by other orchestrators.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// How long a shut-down worker lets the sagas it drives run on before it
    /// stops them and hands them back.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self::new()
    }
}

/// What a worker did, returned by [`Orchestrator::serve`] once it has shut down.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServeReport {
    /// Sagas driven to [`SagaStatus::Completed`].
    pub completed: u64,
    /// Sagas driven to [`SagaStatus::Compensated`].
    pub compensated: u64,
    /// Sagas left [`SagaStatus::Stuck`].
    pub stuck: u64,
    /// Sagas that could not be continued or whose driving failed (each is
    /// traced with its error); they keep their lease until it expires.
    pub failed: u64,
    /// Sagas still running when the grace period ended: stopped, and their
    /// leases handed back.
    pub handed_back: u64,
}

impl Orchestrator {
    /// Runs as a worker until `shutdown` resolves: claims submitted sagas
    /// ([`submit`](Self::submit)) and sagas whose worker died or handed them
    /// back, and drives up to [`ServeOptions::max_in_flight`] of them at once.
    ///
    /// The worker looks for work when it starts, whenever it is woken (a
    /// Postgres `NOTIFY` from [`submit`](Self::submit) or from a worker that
    /// handed sagas back, or a [`submit`](Self::submit) on this orchestrator),
    /// when one of its sagas ends while more may be waiting, and every
    /// [`poll_interval`](ServeOptions::poll_interval) otherwise.
    ///
    /// Once `shutdown` resolves, it claims nothing more and waits up to the
    /// [grace period](ServeOptions::grace) for the sagas it drives to end. Those
    /// still running are then stopped as a crash would stop them (their
    /// running steps aborted and awaited, the saga left as last committed),
    /// and their leases are released, so another worker continues them at
    /// once instead of after the lease expires. Dropping the returned future
    /// instead is a crash: the leases expire.
    ///
    /// Poll interval and grace period are measured by tokio's timer, like the
    /// lease renewals, not by the orchestrator's clock.
    ///
    /// On a [`SqliteLog`](crate::SqliteLog) (one process per file) the worker
    /// is woken by this orchestrator's own submissions and otherwise polls.
    ///
    /// # Errors
    ///
    /// [`SagaError::Log`] when the log cannot start listening. Later log
    /// errors (claims that fail while the database is away) are traced and
    /// the worker tries again at the next poll.
    pub async fn serve(
        &self,
        options: ServeOptions,
        shutdown: impl Future<Output = ()>,
    ) -> Result<ServeReport, SagaError> {
        let mut worker = Worker {
            inner: self.inner.clone(),
            running: JoinSet::new(),
            leases: HashMap::new(),
            report: ServeReport::default(),
            halt: watch::channel(false),
        };
        let mut wakeups = self.inner.log.listen().await?;
        let mut submitted = self.inner.submitted.subscribe();
        let mut work_waiting = true;
        let mut next_poll = poll_after(options.poll_interval);
        tokio::pin!(shutdown);
        loop {
            while work_waiting && worker.running.len() < options.max_in_flight {
                work_waiting = worker
                    .claim(options.max_in_flight - worker.running.len())
                    .await;
            }
            tokio::select! {
                () = &mut shutdown => break,
                Some(joined) = worker.running.join_next_with_id() => worker.ended(joined).await,
                woken = next_wakeup(&mut wakeups) => match woken {
                    Some(()) => work_waiting = true,
                    None => wakeups = None,
                },
                Ok(()) = submitted.changed() => work_waiting = true,
                () = tokio::time::sleep_until(next_poll) => {
                    work_waiting = true;
                    next_poll = poll_after(options.poll_interval);
                }
            }
        }
        drop(wakeups);
        let grace = tokio::time::sleep(options.grace);
        tokio::pin!(grace);
        loop {
            tokio::select! {
                joined = worker.running.join_next_with_id() => match joined {
                    Some(joined) => worker.ended(joined).await,
                    None => break,
                },
                () = &mut grace => {
                    worker.halt.0.send_replace(true);
                    break;
                }
            }
        }
        while let Some(joined) = worker.running.join_next_with_id().await {
            worker.ended(joined).await;
        }
        Ok(worker.report)
    }
}

/// The next wake-up, or never when the log has none.
async fn next_wakeup(wakeups: &mut Option<Wakeups>) -> Option<()> {
    match wakeups {
        Some(wakeups) => wakeups.next().await,
        None => std::future::pending().await,
    }
}

type Joined = Result<(tokio::task::Id, Result<SagaOutcome, SagaError>), tokio::task::JoinError>;

/// One serving worker's sagas in flight.
struct Worker {
    inner: std::sync::Arc<Inner>,
    running: JoinSet<Result<SagaOutcome, SagaError>>,
    leases: HashMap<tokio::task::Id, Lease>,
    report: ServeReport,
    halt: (watch::Sender<bool>, watch::Receiver<bool>),
}

impl Worker {
    /// Claims and starts up to `want` sagas; true when there may be more.
    async fn claim(&mut self, want: usize) -> bool {
        let batch = match self.inner.log.claim_unfinished(None, want).await {
            Ok(batch) => batch,
            Err(e) => {
                tracing::warn!(
                    target: "seawall_saga", error = %e,
                    "claiming sagas failed; trying again at the next poll"
                );
                return false;
            }
        };
        let more = batch.len() >= want;
        for claimed in batch {
            let lease = claimed.lease.clone();
            let inner = self.inner.clone();
            let halt = Halt::on(self.halt.1.clone());
            let handle = self
                .running
                .spawn(async move { Inner::drive_claimed(inner, claimed, false, halt).await });
            self.leases.insert(handle.id(), lease);
        }
        more
    }

    /// Accounts for a saga that is no longer driven; hands back its lease
    /// when it was stopped by the shutdown.
    async fn ended(&mut self, joined: Joined) {
        let (task, result) = match joined {
            Ok((task, result)) => (task, result),
            Err(join) => {
                let lease = self.leases.remove(&join.id());
                self.report.failed += 1;
                tracing::warn!(
                    target: "seawall_saga", saga_id = ?lease.map(|l| l.saga_id().clone()),
                    error = %join, "the task driving a saga ended abnormally"
                );
                return;
            }
        };
        let lease = self.leases.remove(&task);
        match result {
            Ok(outcome) => match outcome.status {
                SagaStatus::Completed => self.report.completed += 1,
                SagaStatus::Compensated => self.report.compensated += 1,
                _ => self.report.stuck += 1,
            },
            Err(SagaError::Halted(saga_id)) => {
                self.report.handed_back += 1;
                let Some(lease) = lease else { return };
                if let Err(e) = self.inner.log.release(&lease).await {
                    tracing::warn!(
                        target: "seawall_saga", saga_id = %saga_id, error = %e,
                        "could not hand a saga back; it is taken over when its lease expires"
                    );
                }
            }
            Err(error) => {
                self.report.failed += 1;
                tracing::warn!(
                    target: "seawall_saga", saga_id = ?lease.map(|l| l.saga_id().clone()),
                    error = %super::error_chain(&error), "a saga could not be driven"
                );
            }
        }
    }
}

/// The instant `interval` from now; an interval past the clock's range is
/// taken as a century (never, for a worker).
fn poll_after(interval: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(interval)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400))
}
