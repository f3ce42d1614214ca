//! Configuration of a [`RedisStore`].

use std::time::Duration;

use std::sync::atomic::AtomicBool;

use crate::error::{Redacted, RedisStoreError};
use crate::lease::Leasing;
use crate::link::{Client, ClusterTarget};
use crate::RedisStore;

/// What a store does when Redis cannot be reached or does not answer in
/// time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum FailMode {
    /// Answer from process-local state (a [`seawall::MemoryStore`] with the
    /// same policies): calls go on, limits hold per process instead of
    /// across processes, and every call answered locally reports
    /// `StoreUnavailable { degraded: true }`. The default.
    #[default]
    Open,
    /// Refuse: the pipeline answers `Error::Store` and does not call the
    /// operation. A call whose weight the rate limiter can never grant is
    /// still refused as such (`rate_limited`, no `retry_after`): that
    /// answer needs no state.
    Closed,
}

/// Which clock decides windows, leases and open periods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum TimeSource {
    /// The Redis server's clock (`TIME`, read inside every script): one
    /// clock for every process. The default, and the only sound choice
    /// when several processes share state.
    #[default]
    Server,
    /// The pipeline's clock, as passed in each request. Only for
    /// single-process tests driven by a virtual clock: two processes'
    /// clocks have unrelated origins.
    Caller,
}

/// Builds a [`RedisStore`]; setters take and return the builder by value.
///
/// ```no_run
/// use std::time::Duration;
/// use seawall_redis::RedisStore;
///
/// let store = RedisStore::builder("redis://127.0.0.1:6379")
///     .prefix("checkout")
///     .timeout(Duration::from_millis(100))
///     .fail_closed()
///     .build()?;
/// # let _ = store;
/// # Ok::<_, seawall_redis::RedisStoreError>(())
/// ```
///
/// # Default
/// - prefix `seawall`
/// - timeout 250 ms for every command; connect timeout the same
/// - fail open
/// - after a failure, Redis is skipped and reconnected to in the
///   background every 500 ms until it answers
/// - up to 8 idle connections kept for the blocking `call` path
/// - half-open probes leased for 60 s (see [`probe_lease`](Self::probe_lease))
/// - the server's clock
/// - refusals with a known end replayed locally, for up to 4096
///   partitions per resource (see [`local_refusals`](Self::local_refusals))
/// - a silent success waits up to 1 ms for the next admission of its
///   partition to carry it (see [`success_delay`](Self::success_delay))
///
/// Its `Debug` output shows the URL (or the cluster's URLs) without
/// passwords.
#[derive(Clone)]
pub struct RedisStoreBuilder {
    pub(crate) target: Target,
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    pub(crate) connect_timeout: Option<Duration>,
    pub(crate) fail_mode: FailMode,
    pub(crate) reconnect_interval: Duration,
    pub(crate) max_idle_connections: usize,
    pub(crate) probe_lease: Duration,
    pub(crate) time_source: TimeSource,
    pub(crate) local_refusals: usize,
    pub(crate) success_delay: Duration,
    pub(crate) leases: std::collections::HashMap<String, Leasing>,
}

/// What a store talks to: one server, or the nodes of a cluster.
#[derive(Clone)]
pub(crate) enum Target {
    Server(String),
    Cluster(Vec<String>),
}

impl Target {
    /// The URL(s) as they may be shown, and their secrets.
    pub(crate) fn redacted(&self) -> Redacted {
        match self {
            Target::Server(url) => Redacted::new(url),
            Target::Cluster(urls) => Redacted::list(urls),
        }
    }
}

impl std::fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("RedisStoreBuilder");
        match &self.target {
            Target::Server(url) => d.field("url", &Redacted::new(url)),
            Target::Cluster(urls) => d.field(
                "cluster",
                &urls.iter().map(|u| Redacted::new(u)).collect::<Vec<_>>(),
            ),
        };
        d.field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("fail_mode", &self.fail_mode)
            .field("reconnect_interval", &self.reconnect_interval)
            .field("max_idle_connections", &self.max_idle_connections)
            .field("probe_lease", &self.probe_lease)
            .field("time_source", &self.time_source)
            .field("local_refusals", &self.local_refusals)
            .field("success_delay", &self.success_delay)
            .field("leases", &self.leases)
            .finish()
    }
}

impl RedisStoreBuilder {
    pub(crate) fn new(url: String) -> Self {
        Self::with_target(Target::Server(url))
    }

    pub(crate) fn new_cluster(urls: Vec<String>) -> Self {
        Self::with_target(Target::Cluster(urls))
    }

    fn with_target(target: Target) -> Self {
        RedisStoreBuilder {
            target,
            prefix: "seawall".to_owned(),
            timeout: Duration::from_millis(250),
            connect_timeout: None,
            fail_mode: FailMode::Open,
            reconnect_interval: Duration::from_millis(500),
            max_idle_connections: 8,
            probe_lease: Duration::from_secs(60),
            time_source: TimeSource::Server,
            local_refusals: 4096,
            success_delay: Duration::from_millis(1),
            leases: std::collections::HashMap::new(),
        }
    }

    /// The first part of every key: `{prefix:resource}:…`. Stores with
    /// different prefixes on one server share nothing.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Longest wait for any answer from Redis (each command, sync and
    /// async). Also the connect timeout unless
    /// [`connect_timeout`](Self::connect_timeout) says otherwise. A store
    /// operation never takes longer than connect timeout + timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Longest wait for a new connection (TCP connect and handshake).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// When Redis fails, answer from process-local state (the default).
    pub fn fail_open(self) -> Self {
        self.fail_mode(FailMode::Open)
    }

    /// When Redis fails, refuse calls with `Error::Store`.
    pub fn fail_closed(self) -> Self {
        self.fail_mode(FailMode::Closed)
    }

    /// Sets what happens when Redis fails.
    pub fn fail_mode(mut self, mode: FailMode) -> Self {
        self.fail_mode = mode;
        self
    }

    /// After Redis failed (unreachable or too slow), calls skip it for this
    /// long while a background thread reconnects, so that an outage costs
    /// the timeout once, not on every call.
    pub fn reconnect_interval(mut self, interval: Duration) -> Self {
        self.reconnect_interval = interval;
        self
    }

    /// Idle connections kept for the blocking (`call`) path.
    pub fn max_idle_connections(mut self, n: usize) -> Self {
        self.max_idle_connections = n;
        self
    }

    /// For breakers without
    /// [`max_half_open`](seawall::CircuitBreaker::max_half_open): how long
    /// a round of half-open probes may stay unfinished before a new round
    /// starts (a process that died mid-probe never reports). Measured from
    /// the start of the round, as `max_half_open` is; a breaker that sets
    /// `max_half_open` uses its own. Keep it longer than the attempt
    /// timeout.
    pub fn probe_lease(mut self, lease: Duration) -> Self {
        self.probe_lease = lease;
        self
    }

    /// The scripts take the time from the pipeline's clock
    /// ([`AdmitRequest::now`](seawall::store::AdmitRequest::now),
    /// [`Record::now`](seawall::store::Record::now), the `now` of control
    /// and metrics calls) instead of the server's `TIME`: for tests on a
    /// virtual clock and for comparing the store with the reference models
    /// exactly. Production keeps the server clock (the default): two
    /// processes' clocks have unrelated origins.
    ///
    /// The same as `.time_source(TimeSource::Caller)`.
    ///
    /// ```no_run
    /// use seawall_redis::RedisStore;
    ///
    /// let store = RedisStore::builder("redis://127.0.0.1:6379")
    ///     .caller_clock()
    ///     .build()?;
    /// # let _ = store;
    /// # Ok::<_, seawall_redis::RedisStoreError>(())
    /// ```
    pub fn caller_clock(self) -> Self {
        self.time_source(TimeSource::Caller)
    }

    /// Which clock decides windows, leases and open periods (see
    /// [`caller_clock`](Self::caller_clock)).
    pub fn time_source(mut self, source: TimeSource) -> Self {
        self.time_source = source;
        self
    }

    /// How many partitions of each resource (besides its unpartitioned
    /// state) may have a refusal replayed locally; 0 turns the replay off,
    /// and every admission is then a round trip.
    ///
    /// When Redis refuses an admission because the circuit is open until
    /// T, a cooldown is active until T, or a rate limit whose calls never
    /// wait is exhausted until T, the store refuses the admissions of that
    /// partition (and weight) in this process until T with the same
    /// reason, its `retry_after` counted down, without a round trip. Until
    /// T, Redis would refuse them too, except after a manual control of
    /// the circuit made by another process (or another binding of the
    /// resource) or a restart of the server: see the [crate
    /// documentation](crate#refusals-answered-locally) for the exact
    /// guarantee. Turn it off where such a control must be seen by every
    /// process at its next admission. Past the bound, the entries already
    /// expired go first, then any: an entry dropped costs its next
    /// admission a round trip, nothing else.
    pub fn local_refusals(mut self, partitions: usize) -> Self {
        self.local_refusals = partitions;
        self
    }

    /// How long the record of a silent success (see the [crate
    /// documentation](crate#how-it-works)) may wait for the next
    /// admission of its resource and partition through this store to carry
    /// it; past that it is sent on its own. At most 1 s. Zero sends every
    /// such record on its own at once (on the async path, its answer not
    /// awaited): one more script call per call, and a slot freed one round
    /// trip after its call ends.
    ///
    /// Its bulkhead slot is freed on the server by the next admission of
    /// the partition or after this delay (plus the timer's resolution of
    /// about 1 ms and the scheduling of the task or thread that sends it),
    /// whichever comes first.
    pub fn success_delay(mut self, delay: Duration) -> Self {
        self.success_delay = delay;
        self
    }

    /// Admits the calls of the resource (the pipeline) named `resource` in
    /// **leased mode**: this process leases a batch of rate-limit permits
    /// (or of bulkhead slots) from Redis at a time and admits from it
    /// locally, without a round trip, leasing the next batch in the
    /// background before it runs out. For a rate limit or a bulkhead shared
    /// by many processes at rates where a round trip per call is too much.
    /// A rate limit then holds up to a stated overshoot (at most the
    /// permits every process holds at once); a bulkhead is never exceeded,
    /// but the slots a process holds idle are not free to the others.
    /// Every other resource stays in exact mode (the default). See the
    /// [crate documentation](crate#leased-mode) for what holds.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use seawall::{Pipeline, RateLimiter};
    /// use seawall_redis::{Leasing, RedisStore};
    ///
    /// let store = RedisStore::builder("redis://127.0.0.1:6379")
    ///     .leased("search-api", Leasing::batch(500).ttl(Duration::from_secs(1)))
    ///     .build()?;
    /// let search = Pipeline::builder("search-api")
    ///     .rate_limiter(RateLimiter::gcra(100_000, Duration::from_secs(1)))
    ///     .store(store)
    ///     .build()?;
    /// # let _ = search;
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// `build()` refuses a batch of 0, a TTL of 0 and a low-water mark not
    /// below the batch ([`RedisStoreError::InvalidConfig`] naming
    /// `leased.batch`, `leased.ttl` or `leased.low_water`); binding the
    /// resource refuses a batch larger than the rate limiter's burst (GCRA)
    /// or limit (fixed window) or the bulkhead's `max_concurrent`, a TTL
    /// not below the bulkhead's lease, and a resource that has anything but
    /// a GCRA or fixed-window rate limiter whose calls never wait, or a
    /// bulkhead, alone (the pipeline's `build()` then fails with a
    /// `ConfigError` of the store's bind naming the field and the rule).
    pub fn leased(mut self, resource: impl Into<String>, leasing: Leasing) -> Self {
        self.leases.insert(resource.into(), leasing);
        self
    }

    /// Validates the settings and creates the store. Nothing is sent to
    /// Redis yet: the connection is checked (and the scripts are loaded)
    /// when a pipeline binds the store.
    ///
    /// # Errors
    /// [`RedisStoreError::InvalidUrl`] for a malformed URL or an
    /// unsupported scheme, and, in a cluster's list, naming the node: a
    /// unix socket, a database other than 0, a user, password or protocol
    /// other than the first node's; a TLS URL (`rediss://`, `valkeys://`:
    /// TLS is not supported by this build);
    /// [`RedisStoreError::InvalidConfig`] naming the setting and its rule
    /// otherwise (`cluster` for an empty list; `leased.batch`,
    /// `leased.ttl`, `leased.low_water` for a [`Leasing`] out of range).
    pub fn build(self) -> Result<RedisStore, RedisStoreError> {
        let invalid =
            |field: &'static str, rule: String| RedisStoreError::InvalidConfig { field, rule };
        if self.timeout.is_zero() {
            return Err(invalid("timeout", "must be > 0".into()));
        }
        if self.connect_timeout.is_some_and(|t| t.is_zero()) {
            return Err(invalid("connect_timeout", "must be > 0".into()));
        }
        if self.reconnect_interval.is_zero() {
            return Err(invalid("reconnect_interval", "must be > 0".into()));
        }
        if self.success_delay > Duration::from_secs(1) {
            return Err(invalid("success_delay", "must be <= 1 s".into()));
        }
        if self.probe_lease < Duration::from_millis(1) {
            return Err(invalid("probe_lease", "must be >= 1 ms".into()));
        }
        if self.prefix.is_empty() || self.prefix.contains(['{', '}']) {
            return Err(invalid(
                "prefix",
                format!(
                    "must be non-empty and free of `{{` and `}}`, got {:?}",
                    self.prefix
                ),
            ));
        }
        for leasing in self.leases.values() {
            leasing.validate()?;
        }
        let client = match &self.target {
            Target::Server(url) => Client::Server(open(url)?),
            Target::Cluster(urls) => Client::Cluster(Box::new(self.open_cluster(urls)?)),
        };
        Ok(RedisStore::from_parts(self, client))
    }

    /// The cluster client of `urls`, each node checked on its own and
    /// against the first.
    fn open_cluster(&self, urls: &[String]) -> Result<ClusterTarget, RedisStoreError> {
        if urls.is_empty() {
            return Err(RedisStoreError::InvalidConfig {
                field: "cluster",
                rule: "must list at least one node of the cluster, got none".into(),
            });
        }
        let mut nodes = Vec::with_capacity(urls.len());
        let mut infos = Vec::with_capacity(urls.len());
        for url in urls {
            let client = open(url)?;
            let shown = Redacted::new(url);
            let invalid = |reason: String| RedisStoreError::InvalidUrl {
                url: shown.shown().to_owned(),
                reason,
            };
            let info = client.get_connection_info().clone();
            if matches!(info.addr(), redis::ConnectionAddr::Unix(_)) {
                return Err(invalid(
                    "a cluster node is reached over TCP (the cluster announces its nodes by \
                     address): a unix socket cannot be one"
                        .into(),
                ));
            }
            let db = info.redis_settings().db();
            if db != 0 {
                return Err(invalid(format!(
                    "a cluster has database 0 only, got database {db}"
                )));
            }
            if let (Some((_, first_shown)), Some(first)) = (nodes.first(), infos.first()) {
                let first: &redis::ConnectionInfo = first;
                let (a, b) = (first.redis_settings(), info.redis_settings());
                let differs = |what: &str| {
                    invalid(format!(
                        "its {what} differs from the first node's (`{first_shown}`): every node \
                         of one cluster is reached with the same user, password and protocol"
                    ))
                };
                if a.username() != b.username() {
                    return Err(differs("user"));
                }
                if a.password() != b.password() {
                    return Err(differs("password"));
                }
                if a.protocol() != b.protocol() {
                    return Err(differs("protocol"));
                }
            }
            infos.push(info);
            nodes.push((client, shown));
        }
        let connect_timeout = self.connect_timeout.unwrap_or(self.timeout);
        // A command is tried once more after a redirection (`MOVED`, `ASK`),
        // a short wait (`TRYAGAIN`) or a failed connection: enough to follow
        // a redirection, and a blocking call stays within twice connect
        // timeout + timeout. What is still failing then is the store's
        // outage (or, for `TRYAGAIN`, the migration's wait).
        let max_wait = u64::try_from(self.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(20);
        let client = redis::cluster::ClusterClientBuilder::new(infos)
            .connection_timeout(connect_timeout)
            .response_timeout(self.timeout)
            .retries(1)
            .min_retry_wait(10)
            .max_retry_wait(max_wait)
            .build()
            .map_err(|e| {
                let all = Redacted::list(urls);
                RedisStoreError::InvalidUrl {
                    reason: all.scrub(&e.to_string()),
                    url: all.shown().to_owned(),
                }
            })?;
        Ok(ClusterTarget {
            client,
            nodes,
            checked: AtomicBool::new(false),
        })
    }
}

/// The client of one server's URL.
fn open(url: &str) -> Result<redis::Client, RedisStoreError> {
    if let Some(scheme) = tls_scheme(url) {
        let shown = Redacted::new(url);
        return Err(RedisStoreError::InvalidUrl {
            reason: format!(
                "TLS (`{scheme}://`) is not supported by this build of seawall-redis; {}",
                expected()
            ),
            url: shown.shown().to_owned(),
        });
    }
    redis::Client::open(url).map_err(|e| {
        let shown = Redacted::new(url);
        RedisStoreError::InvalidUrl {
            reason: shown.scrub(&url_problem(url, &e)),
            url: shown.shown().to_owned(),
        }
    })
}

/// The schemes the store takes (the redis client is built without TLS).
const SCHEMES: [&str; 5] = ["redis", "valkey", "redis+unix", "valkey+unix", "unix"];

/// The TLS schemes, which this build refuses.
const TLS_SCHEMES: [&str; 2] = ["rediss", "valkeys"];

/// The TLS scheme `url` names, if any (as the redis client reads a scheme:
/// case-insensitively, after surrounding whitespace).
fn tls_scheme(url: &str) -> Option<&'static str> {
    let scheme = url.trim().split_once(':')?.0;
    TLS_SCHEMES
        .into_iter()
        .find(|tls| scheme.eq_ignore_ascii_case(tls))
}

/// What a URL should look like.
fn expected() -> String {
    format!(
        "expected one server's URL, `{}://…`, as in `redis://127.0.0.1:6379`",
        SCHEMES.join("://…`, `")
    )
}

/// Why the redis client refused `url` (its error `client`), in words that
/// name the problem.
fn url_problem(url: &str, client: &redis::RedisError) -> String {
    if url.trim().is_empty() {
        return format!("the URL is empty; {}", expected());
    }
    let after_credentials = url.rfind('@').map_or(url, |at| &url[at + 1..]);
    let list = after_credentials.contains([',', ' ', '\t', '\n', ';']);
    match url::Url::parse(url) {
        Err(url::ParseError::RelativeUrlWithoutBase) => {
            format!("the URL has no scheme; {}", expected())
        }
        Err(_) if list => format!(
            "the URL holds a list (`,`, `;` or whitespace); {}: the nodes of a cluster \
             are given one URL each, to `RedisStore::cluster`",
            expected()
        ),
        Err(e) => format!("{e}; {}", expected()),
        Ok(u) if !SCHEMES.contains(&u.scheme()) => {
            format!("unsupported scheme `{}`; {}", u.scheme(), expected())
        }
        Ok(_) => {
            let said = client.to_string();
            said.replace(" - InvalidClientConfig", "")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_validates_without_touching_the_network() {
        let e = RedisStore::builder("redis://127.0.0.1:1")
            .timeout(Duration::ZERO)
            .build()
            .unwrap_err();
        assert_eq!(e.to_string(), "redis_store.timeout must be > 0");
        let e = RedisStore::builder("redis://127.0.0.1:1")
            .prefix("a{b")
            .build()
            .unwrap_err();
        assert!(matches!(
            e,
            RedisStoreError::InvalidConfig {
                field: "prefix",
                ..
            }
        ));
        let e = RedisStore::builder("http://127.0.0.1:1")
            .build()
            .unwrap_err();
        assert!(matches!(e, RedisStoreError::InvalidUrl { .. }), "{e}");
        let e = RedisStore::builder("redis://:secret@[::1")
            .build()
            .unwrap_err();
        assert!(!e.to_string().contains("secret"), "{e}");
        assert!(RedisStore::builder("redis://127.0.0.1:1").build().is_ok());
    }
}
