//! The connections of one store: a small pool of blocking connections for
//! the sync path, a `ConnectionManager` for the async path, and the health
//! state that makes an outage cost the timeout once rather than on every
//! call.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, ScriptInvocation};
use seawall::StoreError;

use crate::error::{is_outage, store_error};
use crate::scripts::Scripts;

/// Settings the link needs from the builder.
#[derive(Debug, Clone)]
pub(crate) struct LinkSettings {
    pub(crate) address: String,
    pub(crate) timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) reconnect_interval: Duration,
    pub(crate) max_idle: usize,
}

pub(crate) struct Link {
    client: redis::Client,
    pub(crate) settings: LinkSettings,
    pool: Mutex<Vec<redis::Connection>>,
    manager: Mutex<Option<ConnectionManager>>,
    health: Health,
    weak: Weak<Link>,
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
            manager: Mutex::new(None),
            health: Health {
                origin: Instant::now(),
                skip_until: AtomicU64::new(0),
                last_error: Mutex::new(None),
                reconnecting: AtomicBool::new(false),
            },
            weak: weak.clone(),
        })
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
        let interval = u64::try_from(self.settings.reconnect_interval.as_nanos()).unwrap_or(u64::MAX / 4);
        let until = self.health.now().saturating_add(interval.saturating_mul(2)).max(1);
        self.health.skip_until.store(until, Ordering::Release);
    }

    fn recovered(&self) {
        // The async connection may hold the error of its last attempt:
        // start afresh.
        lock(&self.manager).take();
        self.health.skip_until.store(0, Ordering::Release);
        #[cfg(feature = "tracing")]
        tracing::info!(target: "seawall_redis", address = %self.settings.address, "redis reachable again");
    }

    fn connect_sync(&self) -> Result<redis::Connection, StoreError> {
        let t = self.settings.timeout;
        let conn = self
            .client
            .get_connection_with_timeout(self.settings.connect_timeout)
            .map_err(|e| store_error(&e, self.settings.connect_timeout))?;
        conn.set_read_timeout(Some(t)).map_err(|e| store_error(&e, t))?;
        conn.set_write_timeout(Some(t)).map_err(|e| store_error(&e, t))?;
        Ok(conn)
    }

    /// Runs `f` on a pooled blocking connection; a connection that failed is
    /// dropped, never reused.
    fn with_sync<T>(
        &self,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T, StoreError> {
        self.gate()?;
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
                let e = store_error(&e, self.settings.timeout);
                self.failed(&e);
                Err(e)
            }
        }
    }

    /// Runs a script on the blocking path (EVALSHA, reloaded on NOSCRIPT).
    pub(crate) fn invoke_sync<T: FromRedisValue>(&self, inv: &ScriptInvocation<'_>) -> Result<T, StoreError> {
        self.with_sync(|c| inv.invoke(c))
    }

    /// Loads every script (also checks authentication and permissions).
    pub(crate) fn load_scripts(&self) -> Result<(), StoreError> {
        self.with_sync(|c| {
            for s in Scripts::get().all() {
                s.load(c)?;
            }
            Ok(())
        })
    }

    /// One PING on the blocking path.
    pub(crate) fn ping_sync(&self) -> Result<Duration, StoreError> {
        self.with_sync(|c| {
            let start = Instant::now();
            redis::cmd("PING").query::<()>(c)?;
            Ok(start.elapsed())
        })
    }

    fn manager(&self) -> Result<ConnectionManager, StoreError> {
        let mut slot = lock(&self.manager);
        if let Some(m) = slot.as_ref() {
            return Ok(m.clone());
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.settings.connect_timeout))
            .set_response_timeout(Some(self.settings.timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(self.settings.reconnect_interval);
        let m = ConnectionManager::new_lazy_with_config(self.client.clone(), config)
            .map_err(|e| store_error(&e, self.settings.timeout))?;
        *slot = Some(m.clone());
        Ok(m)
    }

    /// Runs a script on the async path. Must be polled inside a tokio
    /// runtime (with timers).
    pub(crate) async fn invoke_async<T: FromRedisValue>(&self, inv: &ScriptInvocation<'_>) -> Result<T, StoreError> {
        self.gate()?;
        let limit = self.settings.connect_timeout + self.settings.timeout;
        let result = async {
            let mut m = self.manager()?;
            inv.invoke_async(&mut m)
                .await
                .map_err(|e| store_error(&e, self.settings.timeout))
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

    /// One PING on the async path.
    pub(crate) async fn ping_async(&self) -> Result<Duration, StoreError> {
        self.gate()?;
        let limit = self.settings.connect_timeout + self.settings.timeout;
        let result = async {
            let mut m = self.manager()?;
            let start = Instant::now();
            redis::cmd("PING")
                .query_async::<()>(&mut m)
                .await
                .map_err(|e| store_error(&e, self.settings.timeout))?;
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
                .map_err(|e| store_error(&e, link.settings.timeout))?;
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
