//! The connections of one store: a small pool of blocking connections for
//! the sync path, one multiplexed connection per tokio runtime for the
//! async path, the health state that makes an outage cost the timeout once
//! rather than on every call, and the server's identity, which tells a
//! restarted (emptied) server from the one the state was kept on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, FromRedisValue, RedisResult, ServerErrorKind};
use seawall::StoreError;
use tokio::sync::OnceCell;

use crate::error::{is_outage, store_error, Redacted};
use crate::scripts::{Invocation, Scripts};

/// Settings the link needs from the builder.
#[derive(Debug, Clone)]
pub(crate) struct LinkSettings {
    /// The server's URL as it may be shown, and the secrets kept out of
    /// every message.
    pub(crate) address: Redacted,
    pub(crate) timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) reconnect_interval: Duration,
    pub(crate) max_idle: usize,
}

pub(crate) struct Link {
    client: redis::Client,
    pub(crate) settings: LinkSettings,
    pool: Mutex<Vec<redis::Connection>>,
    /// One async connection per tokio runtime that used the store: a
    /// connection's driver task lives on the runtime that created it. A
    /// connection that failed is forgotten; the next call makes (and
    /// identifies) a new one.
    managers: Mutex<Vec<(tokio::runtime::Id, AsyncSlot)>>,
    health: Health,
    /// The server last seen, and its last restart.
    server: Mutex<ServerState>,
    /// Restarts seen (0: none; read without the lock on every admission).
    restarts: AtomicU64,
    /// Records sent on the async connection whose answer is not awaited
    /// (see [`Link::unawaited`]); the blocking path waits for them.
    unawaited: Mutex<usize>,
    settled: Condvar,
    weak: Weak<Link>,
}

/// The async connection of one runtime, made once by the first call that
/// needs it.
type AsyncSlot = Arc<OnceCell<MultiplexedConnection>>;

/// Asked before an admission is sent while a restart of the server is known:
/// `Err` refuses the admission (see `Shared::restart_hold` in the store).
pub(crate) type HoldCheck<'a> = &'a (dyn Fn(Restart) -> Result<(), StoreError> + Sync);

/// A restart of the server, seen by this process: its identity (`run_id`
/// in `INFO server`) changed between two connections, or it lost its
/// scripts and its identity cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Restart {
    /// Restarts seen so far by this store (1 for the first).
    pub(crate) epoch: u64,
    /// When the restarted server started, on this process's monotonic
    /// clock: when it was seen, less its uptime (whole seconds, so at most
    /// a second late, never early). When the uptime is unknown, when the
    /// restart was seen.
    pub(crate) started: Instant,
}

/// Why a call through the link failed: Redis failed (an outage is noted,
/// the connection dropped), or the admission waits after a restart (Redis
/// is fine).
enum Failure {
    Store(StoreError),
    Held(StoreError),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        Failure::Store(e)
    }
}

impl Failure {
    fn into_error(self) -> StoreError {
        match self {
            Failure::Store(e) | Failure::Held(e) => e,
        }
    }
}

/// What is known of the server.
#[derive(Debug, Default)]
struct ServerState {
    run_id: Option<String>,
    last: Option<Restart>,
}

/// One record sent without waiting for its answer; dropped when the answer
/// (or an error) arrived.
pub(crate) struct Unawaited(Arc<Link>);

impl Drop for Unawaited {
    fn drop(&mut self) {
        let mut n = lock(&self.0.unawaited);
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.0.settled.notify_all();
        }
    }
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("address", &self.settings.address)
            .field("available", &self.is_available())
            .finish_non_exhaustive()
    }
}

/// Whether Redis is believed reachable. While it is not, calls skip it and
/// one background thread tries to reconnect.
struct Health {
    origin: Instant,
    /// Nanoseconds since `origin` until which Redis is skipped; 0 when healthy.
    skip_until: AtomicU64,
    last_error: Mutex<Option<StoreError>>,
    reconnecting: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Health {
    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

impl Link {
    pub(crate) fn new(client: redis::Client, settings: LinkSettings) -> Arc<Link> {
        Arc::new_cyclic(|weak| Link {
            client,
            settings,
            pool: Mutex::new(Vec::new()),
            managers: Mutex::new(Vec::new()),
            unawaited: Mutex::new(0),
            settled: Condvar::new(),
            health: Health {
                origin: Instant::now(),
                skip_until: AtomicU64::new(0),
                last_error: Mutex::new(None),
                reconnecting: AtomicBool::new(false),
            },
            server: Mutex::new(ServerState::default()),
            restarts: AtomicU64::new(0),
            weak: weak.clone(),
        })
    }

    /// The last restart of the server seen by this store, if any.
    pub(crate) fn restart(&self) -> Option<Restart> {
        if self.restarts.load(Ordering::Acquire) == 0 {
            return None;
        }
        lock(&self.server).last
    }

    /// Reads the server's identity on a new connection (or on one whose
    /// server lost its scripts) and notes a restart.
    fn identify(&self, c: &mut redis::Connection, scripts_lost: bool) -> Result<(), StoreError> {
        let info = redis::cmd("INFO").arg("server").query::<String>(c);
        self.note_identity(info, scripts_lost)
    }

    async fn identify_async(
        &self,
        c: &mut MultiplexedConnection,
        scripts_lost: bool,
    ) -> Result<(), StoreError> {
        let info = redis::cmd("INFO")
            .arg("server")
            .query_async::<String>(c)
            .await;
        self.note_identity(info, scripts_lost)
    }

    /// A server whose `run_id` changed restarted; so did one that lost its
    /// scripts when its identity cannot be read (a user without `INFO`).
    /// A server that lost its scripts but kept its identity had them
    /// flushed (`SCRIPT FLUSH`): its state is intact.
    fn note_identity(
        &self,
        info: RedisResult<String>,
        scripts_lost: bool,
    ) -> Result<(), StoreError> {
        let seen = Instant::now();
        let (run_id, uptime) = match info {
            Ok(text) => parse_info(&text),
            Err(e) => {
                let e = self.error(&e, self.settings.timeout);
                if is_outage(&e) {
                    return Err(e);
                }
                // Refused (no permission for INFO): identity unknown.
                (None, None)
            }
        };
        let mut server = lock(&self.server);
        let restarted = match (&server.run_id, &run_id) {
            (Some(before), Some(now)) => before != now,
            _ => scripts_lost,
        };
        if run_id.is_some() {
            server.run_id = run_id;
        }
        if restarted {
            let epoch = self.restarts.load(Ordering::Acquire) + 1;
            let started = uptime.and_then(|u| seen.checked_sub(u)).unwrap_or(seen);
            server.last = Some(Restart { epoch, started });
            self.restarts.store(epoch, Ordering::Release);
            #[cfg(feature = "tracing")]
            tracing::warn!(target: "seawall_redis", address = %self.settings.address, uptime = ?uptime, "redis restarted and lost its state; admissions wait for the windows and leases it held to end");
        }
        Ok(())
    }

    fn check_hold(&self, hold: Option<HoldCheck<'_>>) -> Result<(), Failure> {
        match (hold, self.restart()) {
            (Some(check), Some(restart)) => check(restart).map_err(Failure::Held),
            _ => Ok(()),
        }
    }

    /// Counts a record sent on the async connection without waiting for its
    /// answer, until the returned guard is dropped.
    pub(crate) fn unawaited(self: &Arc<Self>) -> Unawaited {
        *lock(&self.unawaited) += 1;
        Unawaited(Arc::clone(self))
    }

    /// Blocks until every unawaited record was answered (at most connect
    /// timeout + timeout), so that the blocking path, on connections of its
    /// own, sees what the async path wrote before it.
    fn settle(&self) {
        let mut n = lock(&self.unawaited);
        if *n == 0 {
            return;
        }
        let deadline = Instant::now() + self.settings.connect_timeout + self.settings.timeout;
        while *n > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            n = self
                .settled
                .wait_timeout(n, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// A Redis error as a [`StoreError`], its message free of the URL's
    /// secrets.
    fn error(&self, e: &redis::RedisError, timeout: Duration) -> StoreError {
        self.settings.address.scrub_error(store_error(e, timeout))
    }

    /// `false` while Redis is skipped after a failure.
    pub(crate) fn is_available(&self) -> bool {
        self.health.skip_until.load(Ordering::Acquire) == 0
    }

    /// `Err` while Redis is skipped after a failure.
    fn gate(&self) -> Result<(), StoreError> {
        let until = self.health.skip_until.load(Ordering::Acquire);
        if until == 0 || self.health.now() >= until {
            return Ok(());
        }
        let last = lock(&self.health.last_error)
            .as_ref()
            .map_or_else(|| "unknown error".to_owned(), ToString::to_string);
        Err(StoreError::Unavailable(format!(
            "redis at {} is down ({last}); reconnecting in the background",
            self.settings.address
        )))
    }

    /// Notes a failure; an outage starts the background reconnection.
    fn failed(&self, e: &StoreError) {
        if !is_outage(e) {
            return;
        }
        let first = self.health.skip_until.load(Ordering::Acquire) == 0;
        *lock(&self.health.last_error) = Some(e.clone());
        // Every pooled connection may be as dead as the one that failed.
        lock(&self.pool).clear();
        self.extend_skip();
        if first {
            #[cfg(feature = "tracing")]
            tracing::warn!(target: "seawall_redis", address = %self.settings.address, error = %e, "redis unavailable; skipping it while reconnecting");
        }
        if !self.health.reconnecting.swap(true, Ordering::AcqRel) {
            let weak = self.weak.clone();
            let interval = self.settings.reconnect_interval;
            let spawned = std::thread::Builder::new()
                .name("seawall-redis-reconnect".into())
                .spawn(move || reconnect(weak, interval));
            if spawned.is_err() {
                // No thread: calls after the skip period try Redis themselves.
                self.health.reconnecting.store(false, Ordering::Release);
            }
        }
    }

    /// Skips Redis for two reconnect intervals plus one reconnection
    /// attempt (connect timeout + timeout), so that calls never find the
    /// skip over while the background thread is still trying.
    fn extend_skip(&self) {
        let s = &self.settings;
        let horizon = s
            .reconnect_interval
            .saturating_mul(2)
            .saturating_add(s.connect_timeout)
            .saturating_add(s.timeout);
        let horizon = u64::try_from(horizon.as_nanos()).unwrap_or(u64::MAX / 4);
        let until = self.health.now().saturating_add(horizon).max(1);
        self.health.skip_until.store(until, Ordering::Release);
    }

    fn recovered(&self) {
        // The async connections may be dead: start afresh.
        lock(&self.managers).clear();
        self.health.skip_until.store(0, Ordering::Release);
        #[cfg(feature = "tracing")]
        tracing::info!(target: "seawall_redis", address = %self.settings.address, "redis reachable again");
    }

    /// A new blocking connection, with timeouts, its server identified.
    fn connect_sync(&self) -> Result<redis::Connection, StoreError> {
        let t = self.settings.timeout;
        let mut conn = self
            .client
            .get_connection_with_timeout(self.settings.connect_timeout)
            .map_err(|e| self.error(&e, self.settings.connect_timeout))?;
        conn.set_read_timeout(Some(t))
            .map_err(|e| self.error(&e, t))?;
        conn.set_write_timeout(Some(t))
            .map_err(|e| self.error(&e, t))?;
        self.identify(&mut conn, false)?;
        Ok(conn)
    }

    fn pool_return(&self, conn: redis::Connection) {
        let mut pool = lock(&self.pool);
        if pool.len() < self.settings.max_idle {
            pool.push(conn);
        }
    }

    /// Runs `f` on a pooled blocking connection; a connection that failed is
    /// dropped, never reused. `hold` is asked once the connection is there
    /// (a new one has identified its server) and before `f` runs.
    fn with_sync<T>(
        &self,
        ordered: bool,
        hold: Option<HoldCheck<'_>>,
        f: impl FnOnce(&mut redis::Connection) -> Result<T, Failure>,
    ) -> Result<T, StoreError> {
        self.gate()?;
        if ordered {
            self.settle();
        }
        let pooled = lock(&self.pool).pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => match self.connect_sync() {
                Ok(c) => c,
                Err(e) => {
                    self.failed(&e);
                    return Err(e);
                }
            },
        };
        let result = self.check_hold(hold).and_then(|()| f(&mut conn));
        match result {
            Ok(v) => {
                self.pool_return(conn);
                Ok(v)
            }
            Err(Failure::Held(e)) => {
                self.pool_return(conn);
                Err(e)
            }
            Err(Failure::Store(e)) => {
                self.failed(&e);
                Err(e)
            }
        }
    }

    /// `EVALSHA`; after `NOSCRIPT` the server is identified again (a
    /// restart is noted), every script loaded, `hold` asked, and the call
    /// sent once more.
    fn eval_sync<T: FromRedisValue>(
        &self,
        c: &mut redis::Connection,
        inv: &Invocation,
        hold: Option<HoldCheck<'_>>,
    ) -> Result<T, Failure> {
        let t = self.settings.timeout;
        match inv.cmd.query::<T>(c) {
            Ok(v) => Ok(v),
            Err(e) if is_noscript(&e) => {
                self.identify(c, true)?;
                for s in Scripts::get().all() {
                    s.load(c).map_err(|e| self.error(&e, t))?;
                }
                self.check_hold(hold)?;
                Ok(inv.cmd.query(c).map_err(|e| self.error(&e, t))?)
            }
            Err(e) => Err(self.error(&e, t).into()),
        }
    }

    /// Runs a script on the blocking path.
    pub(crate) fn invoke_sync<T: FromRedisValue>(&self, inv: &Invocation) -> Result<T, StoreError> {
        self.with_sync(true, None, |c| self.eval_sync(c, inv, None))
    }

    /// [`invoke_sync`](Self::invoke_sync) for an admission: refused by
    /// `hold` while a restart of the server may have lost what it needs.
    pub(crate) fn admit_sync<T: FromRedisValue>(
        &self,
        inv: &Invocation,
        hold: HoldCheck<'_>,
    ) -> Result<T, StoreError> {
        self.with_sync(true, Some(hold), |c| self.eval_sync(c, inv, Some(hold)))
    }

    /// [`invoke_sync`](Self::invoke_sync) for releases, which are
    /// idempotent and need not wait for unawaited records first.
    pub(crate) fn invoke_sync_unordered<T: FromRedisValue>(
        &self,
        inv: &Invocation,
    ) -> Result<T, StoreError> {
        self.with_sync(false, None, |c| self.eval_sync(c, inv, None))
    }

    /// Loads every script (also checks authentication and permissions).
    pub(crate) fn load_scripts(&self) -> Result<(), StoreError> {
        let t = self.settings.timeout;
        self.with_sync(true, None, |c| {
            for s in Scripts::get().all() {
                s.load(c).map_err(|e| self.error(&e, t))?;
            }
            Ok(())
        })
    }

    /// One PING on the blocking path.
    pub(crate) fn ping_sync(&self) -> Result<Duration, StoreError> {
        self.with_sync(true, None, |c| {
            let start = Instant::now();
            redis::cmd("PING")
                .query::<()>(c)
                .map_err(|e| self.error(&e, self.settings.timeout))?;
            Ok(start.elapsed())
        })
    }

    /// The async connection of the current runtime, made (and its server
    /// identified) by the first call that needs it.
    async fn connection(&self) -> Result<(AsyncSlot, MultiplexedConnection), StoreError> {
        /// Runtimes remembered; the oldest is forgotten beyond this.
        const RUNTIMES: usize = 8;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| no_runtime())?
            .id();
        let slot = {
            let mut managers = lock(&self.managers);
            match managers.iter().find(|(id, _)| *id == runtime) {
                Some((_, slot)) => Arc::clone(slot),
                None => {
                    if managers.len() >= RUNTIMES {
                        managers.remove(0);
                    }
                    let slot = AsyncSlot::default();
                    managers.push((runtime, Arc::clone(&slot)));
                    slot
                }
            }
        };
        let conn = slot
            .get_or_try_init(|| async {
                let ct = self.settings.connect_timeout;
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(ct))
                    .set_response_timeout(Some(self.settings.timeout));
                let mut c = self
                    .client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map_err(|e| self.error(&e, ct))?;
                self.identify_async(&mut c, false).await?;
                Ok::<_, StoreError>(c)
            })
            .await?
            .clone();
        Ok((slot, conn))
    }

    /// Forgets a failed async connection (if it is still the current one).
    fn forget(&self, slot: &AsyncSlot) {
        lock(&self.managers).retain(|(_, s)| !Arc::ptr_eq(s, slot));
    }

    /// Runs a script on the async path. Must be polled inside a tokio
    /// runtime (with timers).
    pub(crate) async fn invoke_async<T: FromRedisValue>(
        &self,
        inv: &Invocation,
    ) -> Result<T, StoreError> {
        self.eval_async(inv, None).await.map_err(|f| self.noted(f))
    }

    /// The error of a failed call, an outage noted (not a hold).
    fn noted(&self, f: Failure) -> StoreError {
        if let Failure::Store(e) = &f {
            self.failed(e);
        }
        f.into_error()
    }

    /// [`invoke_async`](Self::invoke_async) for an admission (see
    /// [`admit_sync`](Self::admit_sync)).
    pub(crate) async fn admit_async<T: FromRedisValue>(
        &self,
        inv: &Invocation,
        hold: HoldCheck<'_>,
    ) -> Result<T, StoreError> {
        self.eval_async(inv, Some(hold))
            .await
            .map_err(|f| self.noted(f))
    }

    /// [`invoke_async`](Self::invoke_async) for work in the background
    /// (releases, unawaited records): its failures do not mark Redis as
    /// down, since a runtime shutting down fails them too.
    pub(crate) async fn invoke_async_quiet<T: FromRedisValue>(
        &self,
        inv: &Invocation,
    ) -> Result<T, StoreError> {
        self.eval_async(inv, None)
            .await
            .map_err(Failure::into_error)
    }

    /// [`eval_sync`](Self::eval_sync) on the async connection, within
    /// connect timeout + timeout.
    async fn eval_async<T: FromRedisValue>(
        &self,
        inv: &Invocation,
        hold: Option<HoldCheck<'_>>,
    ) -> Result<T, Failure> {
        self.gate()?;
        tokio::runtime::Handle::try_current().map_err(|_| no_runtime())?;
        let t = self.settings.timeout;
        let result = async {
            let (slot, mut c) = self.connection().await?;
            self.check_hold(hold)?;
            let result: Result<T, Failure> = match inv.cmd.query_async::<T>(&mut c).await {
                Ok(v) => Ok(v),
                Err(e) if is_noscript(&e) => {
                    async {
                        self.identify_async(&mut c, true).await?;
                        for s in Scripts::get().all() {
                            s.load_async(&mut c).await.map_err(|e| self.error(&e, t))?;
                        }
                        self.check_hold(hold)?;
                        Ok(inv
                            .cmd
                            .query_async(&mut c)
                            .await
                            .map_err(|e| self.error(&e, t))?)
                    }
                    .await
                }
                Err(e) => Err(self.error(&e, t).into()),
            };
            if let Err(Failure::Store(e)) = &result {
                if is_outage(e) {
                    self.forget(&slot);
                }
            }
            result
        };
        let limit = self.settings.connect_timeout + t;
        match tokio::time::timeout(limit, result).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout(t).into()),
        }
    }

    /// One PING on the async path.
    pub(crate) async fn ping_async(&self) -> Result<Duration, StoreError> {
        self.gate()?;
        tokio::runtime::Handle::try_current().map_err(|_| no_runtime())?;
        let limit = self.settings.connect_timeout + self.settings.timeout;
        let result = async {
            let (slot, mut c) = self.connection().await?;
            let start = Instant::now();
            let pong = redis::cmd("PING")
                .query_async::<()>(&mut c)
                .await
                .map_err(|e| self.error(&e, self.settings.timeout));
            if pong.as_ref().is_err_and(is_outage) {
                self.forget(&slot);
            }
            pong.map(|()| start.elapsed())
        };
        let result = match tokio::time::timeout(limit, result).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout(self.settings.timeout)),
        };
        if let Err(e) = &result {
            self.failed(e);
        }
        result
    }
}

fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) || e.code() == Some("NOSCRIPT")
}

/// `run_id` and `uptime_in_seconds` from `INFO server`.
fn parse_info(text: &str) -> (Option<String>, Option<Duration>) {
    let (mut run_id, mut uptime) = (None, None);
    for line in text.lines() {
        let line = line.trim_end();
        if let Some(id) = line.strip_prefix("run_id:") {
            run_id = Some(id.to_owned());
        } else if let Some(secs) = line.strip_prefix("uptime_in_seconds:") {
            uptime = secs.parse().ok().map(Duration::from_secs);
        }
    }
    (run_id, uptime)
}

fn no_runtime() -> StoreError {
    StoreError::Unavailable("the async path of the redis store needs a tokio runtime".into())
}

/// The background reconnection: one thread per outage, gone once Redis
/// answers or the store is dropped.
fn reconnect(weak: Weak<Link>, interval: Duration) {
    loop {
        std::thread::sleep(interval);
        let Some(link) = weak.upgrade() else { return };
        link.extend_skip();
        let attempt = link.connect_sync().and_then(|mut c| {
            redis::cmd("PING")
                .query::<()>(&mut c)
                .map_err(|e| link.error(&e, link.settings.timeout))?;
            Ok(c)
        });
        match attempt {
            Ok(conn) => {
                lock(&link.pool).push(conn);
                link.health.reconnecting.store(false, Ordering::Release);
                link.recovered();
                return;
            }
            // Reachable but refusing (a password changed, say): stop
            // skipping, so that calls report the refusal itself.
            Err(e) if !is_outage(&e) => {
                link.health.reconnecting.store(false, Ordering::Release);
                link.recovered();
                return;
            }
            Err(e) => {
                *lock(&link.health.last_error) = Some(e);
            }
        }
    }
}
