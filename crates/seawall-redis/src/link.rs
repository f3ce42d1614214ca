//! The connections of one store: a small pool of blocking connections for
//! the sync path, a `ConnectionManager` for the async path, and the health
//! state that makes an outage cost the timeout once rather than on every
//! call.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, ScriptInvocation};
use seawall::StoreError;

use crate::error::{is_outage, store_error, Redacted};
use crate::scripts::Scripts;

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
    /// connection's driver task lives on the runtime that created it.
    managers: Mutex<Vec<(tokio::runtime::Id, ConnectionManager)>>,
    health: Health,
    /// Records sent on the async connection whose answer is not awaited
    /// (see [`Link::unawaited`]); the blocking path waits for them.
    unawaited: Mutex<usize>,
    settled: Condvar,
    weak: Weak<Link>,
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
            weak: weak.clone(),
        })
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

    fn extend_skip(&self) {
        let interval =
            u64::try_from(self.settings.reconnect_interval.as_nanos()).unwrap_or(u64::MAX / 4);
        let until = self
            .health
            .now()
            .saturating_add(interval.saturating_mul(2))
            .max(1);
        self.health.skip_until.store(until, Ordering::Release);
    }

    fn recovered(&self) {
        // The async connection may hold the error of its last attempt:
        // start afresh.
        lock(&self.managers).clear();
        self.health.skip_until.store(0, Ordering::Release);
        #[cfg(feature = "tracing")]
        tracing::info!(target: "seawall_redis", address = %self.settings.address, "redis reachable again");
    }

    fn connect_sync(&self) -> Result<redis::Connection, StoreError> {
        let t = self.settings.timeout;
        let conn = self
            .client
            .get_connection_with_timeout(self.settings.connect_timeout)
            .map_err(|e| self.error(&e, self.settings.connect_timeout))?;
        conn.set_read_timeout(Some(t))
            .map_err(|e| self.error(&e, t))?;
        conn.set_write_timeout(Some(t))
            .map_err(|e| self.error(&e, t))?;
        Ok(conn)
    }

    /// Runs `f` on a pooled blocking connection; a connection that failed is
    /// dropped, never reused.
    fn with_sync<T>(
        &self,
        ordered: bool,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
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
        match f(&mut conn) {
            Ok(v) => {
                let mut pool = lock(&self.pool);
                if pool.len() < self.settings.max_idle {
                    pool.push(conn);
                }
                Ok(v)
            }
            Err(e) => {
                let e = self.error(&e, self.settings.timeout);
                self.failed(&e);
                Err(e)
            }
        }
    }

    /// Runs a script on the blocking path (EVALSHA, reloaded on NOSCRIPT).
    pub(crate) fn invoke_sync<T: FromRedisValue>(
        &self,
        inv: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        self.with_sync(true, |c| inv.invoke(c))
    }

    /// [`invoke_sync`](Self::invoke_sync) for releases, which are
    /// idempotent and need not wait for unawaited records first.
    pub(crate) fn invoke_sync_unordered<T: FromRedisValue>(
        &self,
        inv: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        self.with_sync(false, |c| inv.invoke(c))
    }

    /// Loads every script (also checks authentication and permissions).
    pub(crate) fn load_scripts(&self) -> Result<(), StoreError> {
        self.with_sync(true, |c| {
            for s in Scripts::get().all() {
                s.load(c)?;
            }
            Ok(())
        })
    }

    /// One PING on the blocking path.
    pub(crate) fn ping_sync(&self) -> Result<Duration, StoreError> {
        self.with_sync(true, |c| {
            let start = Instant::now();
            redis::cmd("PING").query::<()>(c)?;
            Ok(start.elapsed())
        })
    }

    /// The async connection of the current runtime (created on first use;
    /// it connects, and reconnects, by itself).
    fn manager(&self) -> Result<ConnectionManager, StoreError> {
        /// Runtimes remembered; the oldest is forgotten beyond this.
        const RUNTIMES: usize = 8;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| no_runtime())?
            .id();
        let mut managers = lock(&self.managers);
        if let Some((_, m)) = managers.iter().find(|(id, _)| *id == runtime) {
            return Ok(m.clone());
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.settings.connect_timeout))
            .set_response_timeout(Some(self.settings.timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(self.settings.reconnect_interval);
        let m = ConnectionManager::new_lazy_with_config(self.client.clone(), config)
            .map_err(|e| self.error(&e, self.settings.timeout))?;
        if managers.len() >= RUNTIMES {
            managers.remove(0);
        }
        managers.push((runtime, m.clone()));
        Ok(m)
    }

    /// Runs a script on the async path. Must be polled inside a tokio
    /// runtime (with timers).
    pub(crate) async fn invoke_async<T: FromRedisValue>(
        &self,
        inv: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        tokio::runtime::Handle::try_current().map_err(|_| no_runtime())?;
        let result = self.invoke_async_quiet(inv).await;
        if let Err(e) = &result {
            self.failed(e);
        }
        result
    }

    /// [`invoke_async`](Self::invoke_async) for work in the background
    /// (releases, unawaited records): its failures do not mark Redis as
    /// down, since a runtime shutting down fails them too.
    pub(crate) async fn invoke_async_quiet<T: FromRedisValue>(
        &self,
        inv: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        self.gate()?;
        tokio::runtime::Handle::try_current().map_err(|_| no_runtime())?;
        let limit = self.settings.connect_timeout + self.settings.timeout;
        let result = async {
            let mut m = self.manager()?;
            inv.invoke_async(&mut m)
                .await
                .map_err(|e| self.error(&e, self.settings.timeout))
        };
        match tokio::time::timeout(limit, result).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout(self.settings.timeout)),
        }
    }

    /// One PING on the async path.
    pub(crate) async fn ping_async(&self) -> Result<Duration, StoreError> {
        self.gate()?;
        tokio::runtime::Handle::try_current().map_err(|_| no_runtime())?;
        let limit = self.settings.connect_timeout + self.settings.timeout;
        let result = async {
            let mut m = self.manager()?;
            let start = Instant::now();
            redis::cmd("PING")
                .query_async::<()>(&mut m)
                .await
                .map_err(|e| self.error(&e, self.settings.timeout))?;
            Ok(start.elapsed())
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
