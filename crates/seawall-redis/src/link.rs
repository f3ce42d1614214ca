//! The connections of one store: a small pool of blocking connections for
//! the sync path, one multiplexed connection per tokio runtime for the
//! async path (on a cluster: the redis client's cluster connections, which
//! route every command to the master of its slot and follow `MOVED` and
//! `ASK`), the health state that makes an outage cost the timeout once
//! rather than on every call, and the identity of the servers, which tells
//! a restarted (emptied) server from the one the state was kept on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, FromRedisValue, RedisResult, ServerErrorKind, Value,
};
use seawall::StoreError;
use tokio::sync::OnceCell;

use crate::cluster::{self, NodeIdentity, SlotRange, LAST_SLOT};
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

/// Where the store's state lives: one server, or a Redis Cluster.
pub(crate) enum Client {
    Server(redis::Client),
    Cluster(Box<ClusterTarget>),
}

/// A cluster: the redis client's cluster client, and the nodes it was
/// given, checked once before the first connection (see
/// [`cluster::check_nodes`]).
pub(crate) struct ClusterTarget {
    pub(crate) client: redis::cluster::ClusterClient,
    pub(crate) nodes: Vec<(redis::Client, Redacted)>,
    pub(crate) checked: AtomicBool,
}

/// A blocking connection: to the server, or to every master of the cluster.
enum SyncConn {
    Server(redis::Connection),
    Cluster(Box<redis::cluster::ClusterConnection>),
}

/// An async connection (cheap to clone).
#[derive(Clone)]
enum AsyncConn {
    Server(MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::ConnectionLike for SyncConn {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        match self {
            SyncConn::Server(c) => c.req_packed_command(cmd),
            SyncConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        match self {
            SyncConn::Server(c) => c.req_packed_commands(cmd, offset, count),
            SyncConn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    // The cluster connection routes a command by its keys here.
    fn req_command(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            SyncConn::Server(c) => c.req_command(cmd),
            SyncConn::Cluster(c) => c.req_command(cmd),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            SyncConn::Server(c) => c.get_db(),
            SyncConn::Cluster(c) => c.get_db(),
        }
    }

    fn check_connection(&mut self) -> bool {
        match self {
            SyncConn::Server(c) => c.check_connection(),
            SyncConn::Cluster(c) => c.check_connection(),
        }
    }

    fn is_open(&self) -> bool {
        match self {
            SyncConn::Server(c) => c.is_open(),
            SyncConn::Cluster(c) => c.is_open(),
        }
    }
}

impl redis::aio::ConnectionLike for AsyncConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            AsyncConn::Server(c) => c.req_packed_command(cmd),
            AsyncConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            AsyncConn::Server(c) => c.req_packed_commands(pipeline, offset, count),
            AsyncConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            AsyncConn::Server(c) => c.get_db(),
            AsyncConn::Cluster(c) => c.get_db(),
        }
    }
}

/// A command sent to every master of a cluster, each answer checked.
fn to_all_masters() -> RoutingInfo {
    RoutingInfo::MultiNode((
        MultipleNodeRoutingInfo::AllMasters,
        Some(ResponsePolicy::AllSucceeded),
    ))
}

/// A command sent to the master that serves `key`.
fn to_master_of(key: &[u8]) -> RoutingInfo {
    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(
        key,
        SlotAddr::Master,
    )))
}

/// A command sent to the node at `host:port`.
fn to_node(host: &str, port: u16) -> RoutingInfo {
    RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
        host: host.to_owned(),
        port,
    })
}

fn cluster_slots() -> Cmd {
    let mut c = redis::cmd("CLUSTER");
    c.arg("SLOTS");
    c
}

fn cluster_info() -> Cmd {
    let mut c = redis::cmd("CLUSTER");
    c.arg("INFO");
    c
}

/// Where scripts are loaded: on a cluster, every master when a pipeline
/// binds; after `NOSCRIPT`, the master that answered it.
#[derive(Clone, Copy)]
enum LoadOn<'a> {
    AllMasters,
    MasterOf(&'a [u8]),
}

pub(crate) struct Link {
    client: Client,
    pub(crate) settings: LinkSettings,
    pool: Mutex<Vec<SyncConn>>,
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
    /// Failures that made Redis be skipped (see [`Link::epoch`]).
    outages: AtomicU64,
    /// Records sent on the async connection whose answer is not awaited
    /// (see [`Link::unawaited`]); the blocking path waits for them.
    unawaited: Outstanding,
    /// `SCRIPT LOAD` of the scripts compiled for the specs bound so far
    /// (see [`Link::register`]), by hash, each once.
    compiled: Mutex<Vec<(String, redis::Cmd)>>,
    /// The scripts run as functions (`FCALL`): the servers took the
    /// library at the last load. Else (a server before Redis 7, a user
    /// without `FUNCTION LOAD` or `FCALL`) by `EVALSHA`.
    functions: AtomicBool,
    /// The library was loaded (on every master) by this store: a pipeline
    /// that binds loads its spec's scripts only. Loaded again wherever a
    /// function is missing.
    library: AtomicBool,
    weak: Weak<Link>,
}

/// The async connection of one runtime, made once by the first call that
/// needs it.
type AsyncSlot = Arc<OnceCell<AsyncConn>>;

/// Asked before an admission is sent while a restart of the server is known:
/// `Err` refuses the admission (see `Shared::restart_hold` in the store).
pub(crate) type HoldCheck<'a> = &'a (dyn Fn(Restart) -> Result<(), StoreError> + Sync);

/// A restart of the server that serves a slot, seen by this process: the
/// server that serves it now does not continue the data of the one seen
/// there before (see [`NodeIdentity::continues`]), or it lost its scripts
/// and its identity cannot be read.
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
/// is fine), or Redis is skipped after an outage already noted (nothing
/// new is noted: the skip's error names that outage).
enum Failure {
    Store(StoreError),
    Held(StoreError),
    Skipped(StoreError),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        Failure::Store(e)
    }
}

impl Failure {
    fn into_error(self) -> StoreError {
        match self {
            Failure::Store(e) | Failure::Held(e) | Failure::Skipped(e) => e,
        }
    }
}

/// What is known of the servers: who served which slots when last seen,
/// and the restarts seen, each over the slots it concerns.
#[derive(Debug, Default)]
struct ServerState {
    view: Vec<Owner>,
    restarts: Vec<(u16, u16, Restart)>,
}

/// Slots `start..=end` and the identity of the master that serves them
/// (`None` when it cannot be read: a user without `INFO`).
#[derive(Debug, Clone)]
struct Owner {
    start: u16,
    end: u16,
    node: Option<NodeIdentity>,
}

/// One record sent without waiting for its answer; dropped when the answer
/// (or an error) arrived.
pub(crate) struct Unawaited(Arc<Link>);

impl Drop for Unawaited {
    fn drop(&mut self) {
        self.0.unawaited.done();
    }
}

/// A count of things on their way (records sent whose answer is not
/// awaited), and a wait until none is.
#[derive(Debug, Default)]
pub(crate) struct Outstanding {
    n: Mutex<usize>,
    settled: Condvar,
}

impl Outstanding {
    /// `k` more on their way.
    pub(crate) fn add(&self, k: usize) {
        *lock(&self.n) += k;
    }

    /// One arrived.
    pub(crate) fn done(&self) {
        let mut n = lock(&self.n);
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.settled.notify_all();
        }
    }

    /// Blocks until none is on its way, for at most `bound`.
    pub(crate) fn wait(&self, bound: Duration) {
        let mut n = lock(&self.n);
        if *n == 0 {
            return;
        }
        // A deadline past what an Instant holds: wait without one.
        let deadline = Instant::now().checked_add(bound);
        while *n > 0 {
            let left = deadline.map_or(bound, |d| d.saturating_duration_since(Instant::now()));
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
    pub(crate) fn new(client: Client, settings: LinkSettings) -> Arc<Link> {
        Arc::new_cyclic(|weak| Link {
            client,
            settings,
            pool: Mutex::new(Vec::new()),
            managers: Mutex::new(Vec::new()),
            unawaited: Outstanding::default(),
            compiled: Mutex::new(Vec::new()),
            functions: AtomicBool::new(false),
            library: AtomicBool::new(false),
            health: Health {
                origin: Instant::now(),
                skip_until: AtomicU64::new(0),
                last_error: Mutex::new(None),
                reconnecting: AtomicBool::new(false),
            },
            server: Mutex::new(ServerState::default()),
            restarts: AtomicU64::new(0),
            outages: AtomicU64::new(0),
            weak: weak.clone(),
        })
    }

    /// The last restart seen of the server that serves `slot` (a single
    /// server serves every slot), if any.
    pub(crate) fn restart_for(&self, slot: u16) -> Option<Restart> {
        if self.restarts.load(Ordering::Acquire) == 0 {
            return None;
        }
        lock(&self.server)
            .restarts
            .iter()
            .filter(|(start, end, _)| (*start..=*end).contains(&slot))
            .map(|(_, _, r)| *r)
            .max_by_key(|r| r.epoch)
    }

    /// The identity of a server from its `INFO` answer: `None` when it may
    /// not be read (a user without `INFO`), `Err` for an outage.
    fn identity(
        &self,
        info: RedisResult<String>,
        seen: Instant,
    ) -> Result<Option<NodeIdentity>, StoreError> {
        match info {
            Ok(text) => Ok(cluster::parse_info(&text, seen)),
            Err(e) => {
                let e = self.error(&e, self.settings.timeout);
                if is_outage(&e) {
                    Err(e)
                } else {
                    Ok(None)
                }
            }
        }
    }

    /// Reads who serves which slots and their identities on a new
    /// connection (or on one that met `NOSCRIPT` for slot `lost`), and
    /// notes the restarts. On a cluster, a master that does not report
    /// `cluster_state:ok` is an outage.
    fn identify(&self, c: &mut SyncConn, lost: Option<u16>) -> Result<(), StoreError> {
        let t = self.settings.timeout;
        let seen = Instant::now();
        let view = match c {
            SyncConn::Server(c) => {
                let info = redis::cmd("INFO").query::<String>(c);
                vec![Owner {
                    start: 0,
                    end: LAST_SLOT,
                    node: self.identity(info, seen)?,
                }]
            }
            SyncConn::Cluster(c) => {
                let reply = c
                    .route_command(
                        &cluster_slots(),
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
                    )
                    .map_err(|e| self.error(&e, t))?;
                let ranges = cluster::parse_slots(&reply)?;
                let mut nodes: Vec<((String, u16), Option<NodeIdentity>)> = Vec::new();
                for r in &ranges {
                    if nodes.iter().any(|((h, p), _)| *h == r.host && *p == r.port) {
                        continue;
                    }
                    let state = c
                        .route_command(&cluster_info(), to_node(&r.host, r.port))
                        .and_then(text)
                        .map_err(|e| self.error(&e, t))?;
                    cluster::check_state(&format!("{}:{}", r.host, r.port), &state)?;
                    let info = c
                        .route_command(&redis::cmd("INFO"), to_node(&r.host, r.port))
                        .and_then(text);
                    nodes.push(((r.host.clone(), r.port), self.identity(info, seen)?));
                }
                owners(&ranges, &nodes)
            }
        };
        self.note_view(view, lost, seen);
        Ok(())
    }

    /// [`identify`](Self::identify) on an async connection.
    async fn identify_async(&self, c: &mut AsyncConn, lost: Option<u16>) -> Result<(), StoreError> {
        let t = self.settings.timeout;
        let seen = Instant::now();
        let view = match c {
            AsyncConn::Server(c) => {
                let info = redis::cmd("INFO").query_async::<String>(c).await;
                vec![Owner {
                    start: 0,
                    end: LAST_SLOT,
                    node: self.identity(info, seen)?,
                }]
            }
            AsyncConn::Cluster(c) => {
                let reply = c
                    .route_command(
                        cluster_slots(),
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
                    )
                    .await
                    .map_err(|e| self.error(&e, t))?;
                let ranges = cluster::parse_slots(&reply)?;
                let mut nodes: Vec<((String, u16), Option<NodeIdentity>)> = Vec::new();
                for r in &ranges {
                    if nodes.iter().any(|((h, p), _)| *h == r.host && *p == r.port) {
                        continue;
                    }
                    let state = c
                        .route_command(cluster_info(), to_node(&r.host, r.port))
                        .await
                        .and_then(text)
                        .map_err(|e| self.error(&e, t))?;
                    cluster::check_state(&format!("{}:{}", r.host, r.port), &state)?;
                    let info = c
                        .route_command(redis::cmd("INFO"), to_node(&r.host, r.port))
                        .await
                        .and_then(text);
                    nodes.push(((r.host.clone(), r.port), self.identity(info, seen)?));
                }
                owners(&ranges, &nodes)
            }
        };
        self.note_view(view, lost, seen);
        Ok(())
    }

    /// Compares who serves each slot now with who served it when last seen:
    /// a slot whose master does not continue the data of the one before
    /// (see [`NodeIdentity::continues`]) was emptied by a restart, dated to
    /// when its new master started. Where an identity cannot be read, a
    /// master that lost its scripts (the one that serves slot `lost`) is
    /// taken as restarted; one that kept its identity had them flushed
    /// (`SCRIPT FLUSH`) and its state is intact.
    fn note_view(&self, view: Vec<Owner>, lost: Option<u16>, seen: Instant) {
        let mut server = lock(&self.server);
        let mut found: Vec<(u16, u16, Instant)> = Vec::new();
        for now in &view {
            let lost_here = |start: u16, end: u16| lost.is_some_and(|s| (start..=end).contains(&s));
            let mut known = false;
            for before in server
                .view
                .iter()
                .filter(|b| b.start <= now.end && now.start <= b.end)
            {
                known = true;
                let (start, end) = (now.start.max(before.start), now.end.min(before.end));
                let restarted = match (&before.node, &now.node) {
                    (Some(b), Some(n)) => !n.continues(b),
                    _ => lost_here(start, end),
                };
                if restarted {
                    let started = now.node.as_ref().map_or(seen, |n| n.started);
                    found.push((start, end, started));
                }
            }
            if !known && lost_here(now.start, now.end) {
                found.push((now.start, now.end, seen));
            }
        }
        server.view = view;
        for (start, end, started) in found {
            let epoch = self.restarts.load(Ordering::Acquire) + 1;
            // A restart over these slots replaces those seen before.
            server
                .restarts
                .retain(|(s, e, _)| !(start <= *s && *e <= end));
            server
                .restarts
                .push((start, end, Restart { epoch, started }));
            self.restarts.store(epoch, Ordering::Release);
            #[cfg(feature = "tracing")]
            tracing::warn!(target: "seawall_redis", address = %self.settings.address, slots = %format!("{start}-{end}"), "redis restarted and lost its state; admissions wait for the windows and leases it held to end");
        }
    }

    /// `Err` (a hold) when the server that serves `inv`'s slot restarted
    /// and `hold` says the admission must wait.
    fn check_hold(&self, hold: Option<HoldCheck<'_>>, inv: &Invocation) -> Result<(), Failure> {
        let Some(check) = hold else { return Ok(()) };
        if self.restarts.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        match self.restart_for(inv.slot()) {
            Some(restart) => check(restart).map_err(Failure::Held),
            None => Ok(()),
        }
    }

    /// Counts a record sent on the async connection without waiting for its
    /// answer, until the returned guard is dropped.
    pub(crate) fn unawaited(self: &Arc<Self>) -> Unawaited {
        self.unawaited.add(1);
        Unawaited(Arc::clone(self))
    }

    /// Blocks until every unawaited record was answered (at most connect
    /// timeout + timeout), so that the blocking path, on connections of its
    /// own, sees what the async path wrote before it.
    fn settle(&self) {
        self.unawaited.wait(
            self.settings
                .connect_timeout
                .saturating_add(self.settings.timeout),
        );
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

    /// Changes with every outage and every restart of the server seen:
    /// what was learned of the server's state before may no longer hold.
    pub(crate) fn epoch(&self) -> u64 {
        self.outages
            .load(Ordering::Acquire)
            .wrapping_add(self.restarts.load(Ordering::Acquire))
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
        self.outages.fetch_add(1, Ordering::AcqRel);
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

    /// Checks a cluster's node list once (see [`cluster::check_nodes`]);
    /// nothing for a single server.
    fn check_nodes(&self) -> Result<(), StoreError> {
        let Client::Cluster(target) = &self.client else {
            return Ok(());
        };
        if target.checked.load(Ordering::Acquire) {
            return Ok(());
        }
        cluster::check_nodes(
            &target.nodes,
            self.settings.connect_timeout,
            self.settings.timeout,
            |node, e, d| node.scrub_error(self.error(e, d)),
        )?;
        target.checked.store(true, Ordering::Release);
        Ok(())
    }

    /// A new blocking connection, with timeouts, its servers identified.
    fn connect_sync(&self) -> Result<SyncConn, StoreError> {
        let t = self.settings.timeout;
        let ct = self.settings.connect_timeout;
        let mut conn = match &self.client {
            Client::Server(client) => {
                let conn = client
                    .get_connection_with_timeout(ct)
                    .map_err(|e| self.error(&e, ct))?;
                conn.set_read_timeout(Some(t))
                    .map_err(|e| self.error(&e, t))?;
                conn.set_write_timeout(Some(t))
                    .map_err(|e| self.error(&e, t))?;
                SyncConn::Server(conn)
            }
            Client::Cluster(target) => {
                self.check_nodes()?;
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(ct)
                    .set_response_timeout(t);
                let conn = target
                    .client
                    .get_connection_with_config(config)
                    .map_err(|e| self.error(&e, ct))?;
                conn.set_write_timeout(Some(t))
                    .map_err(|e| self.error(&e, t))?;
                SyncConn::Cluster(Box::new(conn))
            }
        };
        self.identify(&mut conn, None)?;
        Ok(conn)
    }

    fn pool_return(&self, conn: SyncConn) {
        let mut pool = lock(&self.pool);
        if pool.len() < self.settings.max_idle {
            pool.push(conn);
        }
    }

    /// Runs `f` on a pooled blocking connection; a connection that failed is
    /// dropped, never reused. `hold` is asked once the connection is there
    /// (a new one has identified its servers) and before `f` runs.
    fn with_sync<T>(
        &self,
        ordered: bool,
        hold: Option<(HoldCheck<'_>, &Invocation)>,
        f: impl FnOnce(&mut SyncConn) -> Result<T, Failure>,
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
        let held = match hold {
            Some((check, inv)) => self.check_hold(Some(check), inv),
            None => Ok(()),
        };
        let result = held.and_then(|()| f(&mut conn));
        match result {
            Ok(v) => {
                self.pool_return(conn);
                Ok(v)
            }
            Err(Failure::Held(e) | Failure::Skipped(e)) => {
                self.pool_return(conn);
                Err(e)
            }
            Err(Failure::Store(e)) => {
                self.failed(&e);
                Err(e)
            }
        }
    }

    /// Remembers scripts compiled for one spec (`loads`: their hash and
    /// `SCRIPT LOAD`), loaded from now on with the others after `NOSCRIPT`
    /// (a server that lost its scripts lost them all); a script already
    /// known is not added twice.
    pub(crate) fn register(&self, loads: impl IntoIterator<Item = (String, redis::Cmd)>) {
        let mut compiled = lock(&self.compiled);
        for (hash, load) in loads {
            if !compiled.iter().any(|(h, _)| *h == hash) {
                compiled.push((hash, load));
            }
        }
    }

    /// `true` when the scripts run as functions (`FCALL`), else by
    /// `EVALSHA`.
    pub(crate) fn functions(&self) -> bool {
        self.functions.load(Ordering::Acquire)
    }

    /// The `SCRIPT LOAD` of every script: the store's, then those compiled
    /// for the specs bound so far.
    fn all_loads(&self) -> Vec<redis::Cmd> {
        let compiled = lock(&self.compiled);
        let scripts = Scripts::get().script_loads();
        let mut loads = Vec::with_capacity(scripts.len() + compiled.len());
        loads.extend(scripts.iter().cloned());
        loads.extend(compiled.iter().map(|(_, load)| load.clone()));
        loads
    }

    /// After the scripts' `SCRIPT LOAD`, the outcome of the library's
    /// `FUNCTION LOAD`: taken, or there already (a library is named after
    /// the hash of its text, so one of that name is this one: the server
    /// does not compile it again), the scripts run as functions from now
    /// on; refused (a server without functions, a user without the right),
    /// by `EVALSHA`. A server that cannot be reached is an error.
    fn functions_loaded(&self, loaded: RedisResult<()>) -> Result<(), StoreError> {
        let there = |e: &redis::RedisError| {
            e.detail()
                .is_some_and(|d| d.starts_with("Library '") && d.ends_with("already exists"))
        };
        let e = match loaded {
            Err(e) if !there(&e) => self.error(&e, self.settings.timeout),
            _ => {
                self.functions.store(true, Ordering::Release);
                self.library.store(true, Ordering::Release);
                return Ok(());
            }
        };
        if is_outage(&e) {
            return Err(e);
        }
        self.functions.store(false, Ordering::Release);
        Ok(())
    }

    /// Loads every script: on a single server, on it; on a cluster, on
    /// `on`.
    fn load_sync(&self, c: &mut SyncConn, on: LoadOn<'_>) -> Result<(), StoreError> {
        self.load_these_sync(c, on, &self.all_loads(), true)
    }

    /// Loads `loads`, and the library when `library`: on a single
    /// server, on it; on a cluster, on `on`.
    fn load_these_sync(
        &self,
        c: &mut SyncConn,
        on: LoadOn<'_>,
        loads: &[redis::Cmd],
        library: bool,
    ) -> Result<(), StoreError> {
        let t = self.settings.timeout;
        let mut send = |load: &redis::Cmd| match c {
            SyncConn::Server(c) => load.query::<Value>(c).map(drop),
            SyncConn::Cluster(c) => c.route_command(load, on.routing()).map(drop),
        };
        for load in loads {
            send(load).map_err(|e| self.error(&e, t))?;
        }
        if !library {
            return Ok(());
        }
        // After the scripts: a client the server has not authenticated
        // was refused by them (the library is longer than the server reads
        // from such a client, and would fail with a protocol error).
        let library = send(Scripts::get().library_load());
        self.functions_loaded(library)
    }

    /// [`load_sync`](Self::load_sync) on an async connection.
    async fn load_async(&self, c: &mut AsyncConn, on: LoadOn<'_>) -> Result<(), StoreError> {
        let t = self.settings.timeout;
        async fn send(c: &mut AsyncConn, on: LoadOn<'_>, load: &redis::Cmd) -> RedisResult<()> {
            match c {
                AsyncConn::Server(c) => load.query_async::<Value>(c).await.map(drop),
                AsyncConn::Cluster(c) => {
                    c.route_command(load.clone(), on.routing()).await.map(drop)
                }
            }
        }
        for load in &self.all_loads() {
            send(c, on, load).await.map_err(|e| self.error(&e, t))?;
        }
        let library = send(c, on, Scripts::get().library_load()).await;
        self.functions_loaded(library)
    }

    /// `FCALL` or `EVALSHA`; after `NOSCRIPT` or a function not found the
    /// servers are identified again (a restart is noted), the scripts and
    /// library loaded on the server that lacked them, `hold` asked, and
    /// the call sent once more. A call that names its spec by id, to a
    /// library that does not hold that spec (loaded again, a restarted
    /// server, another node), is sent once more with its spec in full.
    fn eval_sync<T: FromRedisValue>(
        &self,
        c: &mut SyncConn,
        inv: &Invocation,
        hold: Option<HoldCheck<'_>>,
    ) -> Result<T, Failure> {
        let sent = match inv.cmd.query::<T>(c) {
            Err(e) if is_noscript(&e) => {
                self.identify(c, Some(inv.slot()))?;
                self.load_sync(c, LoadOn::MasterOf(inv.first_key()))?;
                self.check_hold(hold, inv)?;
                match inv.cmd.query(c) {
                    Err(e) if is_spec_missing(&e) => Err(e),
                    sent => return sent.map_err(|e| self.failure_after_load(&e)),
                }
            }
            sent => sent,
        };
        match sent {
            Err(e) if is_spec_missing(&e) => match inv.in_full() {
                Some(full) => full.query(c).map_err(|e| self.failure(&e)),
                None => Err(self.failure(&e)),
            },
            sent => sent.map_err(|e| self.failure(&e)),
        }
    }

    /// [`failure`](Self::failure) of a call sent again right after its
    /// scripts were loaded: `NOSCRIPT` once more means the call reached
    /// another node than the one they were loaded on, the cluster changing
    /// hands (a failover): an outage.
    fn failure_after_load(&self, e: &redis::RedisError) -> Failure {
        if is_noscript(e) {
            return Failure::Store(self.settings.address.scrub_error(StoreError::Unavailable(
                format!(
                    "the scripts were missing again right after they were loaded ({e}): the \
                     slot changed hands"
                ),
            )));
        }
        self.failure(e)
    }

    /// A failed script call: Redis failed, or (`TRYAGAIN`, once the client's
    /// own retries are spent) the slot of its keys is migrating between
    /// cluster nodes. A script declares all six keys of its resource and
    /// a migrating slot serves a command on several keys only when every
    /// one of them exists, so calls on that resource wait for the end of
    /// the migration: they follow the fail mode, without marking Redis as
    /// down for the other resources.
    fn failure(&self, e: &redis::RedisError) -> Failure {
        let t = self.settings.timeout;
        if e.kind() == ErrorKind::Server(ServerErrorKind::TryAgain) || e.code() == Some("TRYAGAIN")
        {
            return Failure::Held(self.settings.address.scrub_error(StoreError::Unavailable(
                format!(
                    "the cluster slot of these keys is migrating between nodes ({e}); calls \
                     on them go through again once the migration ends"
                ),
            )));
        }
        self.error(e, t).into()
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
        self.with_sync(true, Some((hold, inv)), |c| {
            self.eval_sync(c, inv, Some(hold))
        })
    }

    /// [`invoke_sync`](Self::invoke_sync) for releases, which are
    /// idempotent and need not wait for unawaited records first.
    pub(crate) fn invoke_sync_unordered<T: FromRedisValue>(
        &self,
        inv: &Invocation,
    ) -> Result<T, StoreError> {
        self.with_sync(false, None, |c| self.eval_sync(c, inv, None))
    }

    /// Loads the store's scripts, and the library once per store, on a
    /// cluster on every master (also checks authentication and
    /// permissions, and a cluster's node list); then, where the scripts
    /// run by `EVALSHA` (a server or user without functions), the scripts
    /// `evalsha_loads` gives: those compiled for the spec being bound,
    /// which it [registers](Self::register) (as functions, the library
    /// holds the admission of every spec).
    pub(crate) fn load_scripts(
        &self,
        evalsha_loads: impl Fn() -> Vec<redis::Cmd>,
    ) -> Result<(), StoreError> {
        // The library: loaded once, and again where a function is missing
        // (`load_sync`).
        let library = !self.library.load(Ordering::Acquire);
        self.with_sync(true, None, |c| {
            let scripts = Scripts::get().script_loads();
            self.load_these_sync(c, LoadOn::AllMasters, scripts, library)?;
            if !self.functions() {
                self.load_these_sync(c, LoadOn::AllMasters, &evalsha_loads(), false)?;
            }
            Ok(())
        })
    }

    /// One PING on the blocking path (on a cluster, to every master).
    pub(crate) fn ping_sync(&self) -> Result<Duration, StoreError> {
        self.with_sync(true, None, |c| {
            let start = Instant::now();
            redis::cmd("PING")
                .query::<()>(c)
                .map_err(|e| self.error(&e, self.settings.timeout))?;
            Ok(start.elapsed())
        })
    }

    /// A new async connection, its servers identified.
    async fn connect_async(&self) -> Result<AsyncConn, StoreError> {
        let ct = self.settings.connect_timeout;
        let t = self.settings.timeout;
        let mut conn = match &self.client {
            Client::Server(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(ct))
                    .set_response_timeout(Some(t));
                AsyncConn::Server(
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                        .map_err(|e| self.error(&e, ct))?,
                )
            }
            Client::Cluster(target) => {
                if !target.checked.load(Ordering::Acquire) {
                    // On connections of its own, without blocking the
                    // runtime.
                    let link = self.weak.upgrade().ok_or_else(no_runtime)?;
                    tokio::task::spawn_blocking(move || link.check_nodes())
                        .await
                        .map_err(|e| StoreError::Unavailable(e.to_string()))??;
                }
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(ct)
                    .set_response_timeout(t);
                AsyncConn::Cluster(
                    target
                        .client
                        .get_async_connection_with_config(config)
                        .await
                        .map_err(|e| self.error(&e, ct))?,
                )
            }
        };
        self.identify_async(&mut conn, None).await?;
        Ok(conn)
    }

    /// The async connection of the current runtime, made (and its servers
    /// identified) by the first call that needs it.
    async fn connection(&self) -> Result<(AsyncSlot, AsyncConn), StoreError> {
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
        let conn = slot.get_or_try_init(|| self.connect_async()).await?.clone();
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
        self.gate().map_err(Failure::Skipped)?;
        tokio::runtime::Handle::try_current().map_err(|_| no_runtime())?;
        let t = self.settings.timeout;
        let result = async {
            let (slot, mut c) = self.connection().await?;
            self.check_hold(hold, inv)?;
            let result: Result<T, Failure> = async {
                let sent = match inv.cmd.query_async::<T>(&mut c).await {
                    Err(e) if is_noscript(&e) => {
                        self.identify_async(&mut c, Some(inv.slot())).await?;
                        self.load_async(&mut c, LoadOn::MasterOf(inv.first_key()))
                            .await?;
                        self.check_hold(hold, inv)?;
                        match inv.cmd.query_async(&mut c).await {
                            Err(e) if is_spec_missing(&e) => Err(e),
                            sent => return sent.map_err(|e| self.failure_after_load(&e)),
                        }
                    }
                    sent => sent,
                };
                // As `eval_sync`: the spec in full where it was missing.
                match sent {
                    Err(e) if is_spec_missing(&e) => match inv.in_full() {
                        Some(full) => full.query_async(&mut c).await.map_err(|e| self.failure(&e)),
                        None => Err(self.failure(&e)),
                    },
                    sent => sent.map_err(|e| self.failure(&e)),
                }
            }
            .await;
            if let Err(Failure::Store(e)) = &result {
                if is_outage(e) {
                    self.forget(&slot);
                }
            }
            result
        };
        let limit = self.settings.connect_timeout.saturating_add(t);
        match tokio::time::timeout(limit, result).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout(t).into()),
        }
    }

    /// One PING on the async path (on a cluster, to every master).
    pub(crate) async fn ping_async(&self) -> Result<Duration, StoreError> {
        self.gate()?;
        tokio::runtime::Handle::try_current().map_err(|_| no_runtime())?;
        let limit = self
            .settings
            .connect_timeout
            .saturating_add(self.settings.timeout);
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

impl LoadOn<'_> {
    fn routing(self) -> RoutingInfo {
        match self {
            LoadOn::AllMasters => to_all_masters(),
            LoadOn::MasterOf(key) => to_master_of(key),
        }
    }
}

/// The slot ranges of a cluster and the identities of their masters.
fn owners(ranges: &[SlotRange], nodes: &[((String, u16), Option<NodeIdentity>)]) -> Vec<Owner> {
    ranges
        .iter()
        .map(|r| Owner {
            start: r.start,
            end: r.end,
            node: nodes
                .iter()
                .find(|((h, p), _)| *h == r.host && *p == r.port)
                .and_then(|(_, n)| n.clone()),
        })
        .collect()
}

/// A reply as a string (an `INFO`-style text).
fn text(v: Value) -> RedisResult<String> {
    redis::from_redis_value::<String>(v).map_err(redis::RedisError::from)
}

/// The script called is missing: `NOSCRIPT` for `EVALSHA`, "Function not
/// found" for `FCALL` (the libraries go with the data, and with `FUNCTION
/// FLUSH`).
fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
        || e.code() == Some("NOSCRIPT")
        || e.detail()
            .is_some_and(|d| d.starts_with("Function not found"))
}

/// The error of a call that named a spec its server's library does not
/// hold ([`SPEC_MISSING`](crate::script_text::SPEC_MISSING)).
fn is_spec_missing(e: &redis::RedisError) -> bool {
    e.code() == Some(crate::script_text::SPEC_MISSING)
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
