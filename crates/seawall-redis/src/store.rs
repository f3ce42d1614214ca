//! [`RedisStore`] and the state of one bound resource.

use std::fmt;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::task::Poll;
use std::time::{Duration, Instant};

use seawall::breaker::{CircuitControl, CircuitMetrics, CircuitState, CircuitTransition};
use seawall::store::{
    Admission, AdmitRequest, BudgetStep, Outcome, Permit, Record, Recorded, Reservation, Reserve,
    ResourceSpec, ResourceState, StoreFuture,
};
use seawall::{MemoryStore, PartitionKey, Rejection, RejectionReason, StateStore, StoreError};

use crate::config::{FailMode, RedisStoreBuilder, TimeSource};
use crate::error::{is_outage, RedisStoreError};
use crate::link::{Client, Link, LinkSettings, Outstanding, Restart};
use crate::refusals::{Answer, Refusals};
use crate::scripts::{self, Invocation, Keys, Lua, Scripts, SpecArgs, SpecScripts, SuccessArgs};

/// A [`StateStore`] on a Redis server, shared by every process that uses
/// the same server and key prefix.
///
/// Cheap to clone (clones share connections). See the [crate
/// documentation](crate) for the guarantees and the failure modes.
///
/// ```no_run
/// use std::time::Duration;
/// use seawall::{Bulkhead, CircuitBreaker, Pipeline};
/// use seawall_redis::RedisStore;
///
/// let store = RedisStore::builder("redis://127.0.0.1:6379")
///     .timeout(Duration::from_millis(250))
///     .fail_open()
///     .build()?;
/// let payments = Pipeline::builder("payments")
///     .circuit_breaker(CircuitBreaker::consecutive_failures(5))
///     .bulkhead(Bulkhead::new(20))
///     .store(store)
///     .build()?;
/// # let _ = payments;
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<StoreInner>,
}

struct StoreInner {
    link: Arc<Link>,
    prefix: String,
    fail_mode: FailMode,
    probe_lease: Duration,
    time_source: TimeSource,
    /// The process-local state answered from while Redis fails (fail-open).
    local: MemoryStore,
    /// Partitions per resource whose refusal with a known end is replayed
    /// locally (0: none).
    local_refusals: usize,
    /// Silent successes waiting for an admission to carry them.
    carrier: Arc<Carrier>,
    /// The resources admitted in leased mode (see `lease.rs`).
    leases: std::collections::HashMap<String, crate::lease::Leasing>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.inner;
        f.debug_struct("RedisStore")
            .field("address", &i.link.settings.address)
            .field("prefix", &i.prefix)
            .field("fail_mode", &i.fail_mode)
            .field("timeout", &i.link.settings.timeout)
            .field("available", &i.link.is_available())
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Starts configuring a store for the server at `url`
    /// (`redis://[user:password@]host[:port][/db]`, or `redis+unix://`;
    /// TLS, `rediss://`, is not supported: see the
    /// [crate documentation](crate#requirements)).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder::new(url.into())
    }

    /// Starts configuring a store for the Redis Cluster that `nodes` belong
    /// to (`redis://[user:password@]host[:port]` each; TLS, `rediss://`,
    /// is not supported; some of its nodes are enough: the others are found
    /// through them).
    /// Every resource's keys share one hash tag, hence one slot: each
    /// script runs on the master of that slot, atomically, as on a single
    /// server. See the [crate documentation](crate#redis-cluster).
    ///
    /// ```no_run
    /// use seawall_redis::RedisStore;
    ///
    /// let store = RedisStore::cluster([
    ///     "redis://10.0.0.1:7000",
    ///     "redis://10.0.0.2:7000",
    ///     "redis://10.0.0.3:7000",
    /// ])
    /// .prefix("shop")
    /// .fail_closed()
    /// .build()?;
    /// # let _ = store;
    /// # Ok::<_, seawall_redis::RedisStoreError>(())
    /// ```
    pub fn cluster<I>(nodes: I) -> RedisStoreBuilder
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        RedisStoreBuilder::new_cluster(nodes.into_iter().map(Into::into).collect())
    }

    /// A store with the default settings (see [`RedisStoreBuilder`]).
    ///
    /// # Errors
    /// As [`RedisStoreBuilder::build`].
    pub fn open(url: impl Into<String>) -> Result<RedisStore, RedisStoreError> {
        Self::builder(url).build()
    }

    pub(crate) fn from_parts(b: RedisStoreBuilder, client: Client) -> RedisStore {
        let settings = LinkSettings {
            address: b.target.redacted(),
            timeout: b.timeout,
            connect_timeout: b.connect_timeout.unwrap_or(b.timeout),
            reconnect_interval: b.reconnect_interval,
            max_idle: b.max_idle_connections,
        };
        RedisStore {
            inner: Arc::new(StoreInner {
                link: Link::new(client, settings),
                prefix: b.prefix,
                fail_mode: b.fail_mode,
                probe_lease: b.probe_lease,
                time_source: b.time_source,
                local: MemoryStore::new(),
                local_refusals: b.local_refusals,
                carrier: Arc::new(Carrier::new(b.success_delay)),
                leases: b.leases,
            }),
        }
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// What the store does when Redis fails.
    pub fn fail_mode(&self) -> FailMode {
        self.inner.fail_mode
    }

    /// `false` while Redis is being skipped after a failure (calls are then
    /// answered locally or refused, per the [`FailMode`], until the
    /// background reconnection succeeds). Sends nothing.
    pub fn is_available(&self) -> bool {
        self.inner.link.is_available()
    }

    /// Sends one `PING` on the blocking path and returns its round trip.
    ///
    /// # Errors
    /// When Redis cannot be reached, refuses, or does not answer in time.
    pub fn ping(&self) -> Result<Duration, StoreError> {
        self.inner.link.ping_sync()
    }

    /// Sends one `PING` on the async path (the connection the async calls
    /// use) and returns its round trip. Must run inside a tokio runtime.
    ///
    /// # Errors
    /// As [`ping`](Self::ping).
    pub async fn ping_async(&self) -> Result<Duration, StoreError> {
        self.inner.link.ping_async().await
    }
}

impl StateStore for RedisStore {
    /// Loads the scripts (one `SCRIPT LOAD` each, and on Redis 7 and later
    /// the library of functions, once per store), which also checks the
    /// password and the user's permissions. Where the scripts run by
    /// `EVALSHA` (a server before Redis 7, a user without functions), the
    /// two admission scripts compiled for the spec too.
    ///
    /// # Errors
    /// [`StoreError::Refused`] when authentication fails or the user may
    /// not run scripts; [`StoreError::Protocol`] when the server answers
    /// something unexpected. An unreachable or slow server is not an error
    /// here, in either mode: the pipeline builds, and its calls then follow
    /// the [`FailMode`] until Redis answers.
    fn bind(&self, spec: &ResourceSpec) -> Result<Arc<dyn ResourceState>, StoreError> {
        let inner = &self.inner;
        let local = match inner.fail_mode {
            FailMode::Closed => None,
            _ => Some(inner.local.bind(spec)?),
        };
        let args = Arc::new(SpecArgs::new(spec, inner.probe_lease));
        let compiled = OnceLock::new();
        // The spec's own admission scripts are compiled and loaded only
        // where the admissions run by `EVALSHA` (as functions, the library
        // has the admission of every spec).
        let evalsha_loads = || {
            let scripts = spec_scripts(&compiled, &inner.link, &args);
            scripts.loads().map(|(_, load)| load).to_vec()
        };
        match inner.link.load_scripts(evalsha_loads) {
            Err(e) if !is_outage(&e) => return Err(e),
            _ => {}
        }
        let keys = Keys::new(&inner.prefix, spec, None);
        let resource = RedisResource {
            shared: Arc::new(Shared {
                link: Arc::clone(&inner.link),
                prefix: inner.prefix.clone(),
                args,
                spec_sent: AtomicBool::new(false),
                compiled,
                success_args: SuccessArgs::new(spec),
                hold: restart_hold(spec),
                caller_hold: Mutex::new(CallerHold {
                    epoch: inner
                        .link
                        .restart_for(scripts::key_slot(keys.0[0].as_bytes()))
                        .map_or(0, |r| r.epoch),
                    until: Duration::ZERO,
                }),
                keys,
                budget_args: budget_args(spec),
                spec: spec.clone(),
                local,
                caller_clock: inner.time_source == TimeSource::Caller,
                circuit_in_shadow: scripts::circuit_in_shadow(spec),
                any_in_shadow: scripts::any_in_shadow(spec),
                refusals: Refusals::new(inner.local_refusals),
                born: Instant::now(),
                carrier: Arc::clone(&inner.carrier),
            }),
        };
        match inner.leases.get(&spec.name) {
            Some(leasing) => crate::lease::bind(Arc::clone(&resource.shared), resource, leasing),
            None => Ok(Arc::new(resource)),
        }
    }
}

/// The admission scripts compiled for the spec `args`, held in `cell`:
/// compiled on first need (the admissions run by `EVALSHA`: a server or
/// user without functions) and then [registered](Link::register) with
/// `link`, which loads them, with the others, wherever the scripts are
/// missing.
fn spec_scripts<'a>(
    cell: &'a OnceLock<SpecScripts>,
    link: &Link,
    args: &SpecArgs,
) -> &'a SpecScripts {
    cell.get_or_init(|| {
        let compiled = SpecScripts::new(args);
        link.register(compiled.loads());
        compiled
    })
}

/// One resource bound to a [`RedisStore`].
pub(crate) struct RedisResource {
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    link: Arc<Link>,
    prefix: String,
    spec: ResourceSpec,
    args: Arc<SpecArgs>,
    /// An admission as a function sent the spec in full: the next ones
    /// name it by its id.
    spec_sent: AtomicBool,
    /// The admission scripts compiled for the spec, once the admissions
    /// run by `EVALSHA` (see [`spec_scripts`]).
    compiled: OnceLock<SpecScripts>,
    success_args: SuccessArgs,
    /// The keys of the unpartitioned state.
    keys: Keys,
    /// The admit script's argument for a deposit to the retry budget kept
    /// in the store, and for a withdrawal (`step:earn:cap`, see
    /// `admit.lua`); empty without one.
    budget_args: [String; 2],
    local: Option<Arc<dyn ResourceState>>,
    caller_clock: bool,
    /// The circuit runs in shadow mode: it records nothing of a shadowed
    /// call.
    circuit_in_shadow: bool,
    /// A policy runs in shadow mode: an admission of a call shadowed
    /// already ([`AdmitRequest::shadowed`]) leaves it out.
    any_in_shadow: bool,
    /// How long admissions wait after a restart of the server (see
    /// [`restart_hold`]).
    hold: Duration,
    /// On the caller's clock: the restart last seen, and the end of its
    /// hold.
    caller_hold: Mutex<CallerHold>,
    /// Refusals Redis gave with a known end, replayed until that end.
    refusals: Refusals,
    /// The origin of the store's clock on the server's time source (see
    /// [`Shared::clock`]).
    born: Instant,
    /// The store's silent successes waiting to be carried.
    carrier: Arc<Carrier>,
}

#[derive(Debug, Clone, Copy)]
struct CallerHold {
    epoch: u64,
    until: Duration,
}

/// The admit script's budget argument for a deposit and a withdrawal: the
/// budget's rule ([`seawall::retry::BudgetRule`]) as `step:earn:cap`.
fn budget_args(spec: &ResourceSpec) -> [String; 2] {
    match spec.retry_budget.as_ref().map(|b| b.rule()) {
        Some(rule) => [1, 2].map(|step| format!("{step}:{}:{}", rule.earn.max(0), rule.cap)),
        None => [String::new(), String::new()],
    }
}

/// How long the state lost in a restart of the server still matters to
/// `spec`: the rate limiter's window (for GCRA, the longest a burst
/// reaches ahead) and the bulkhead's lease, whichever is longer. Zero
/// without either: a circuit or a cooldown lost in a restart is not waited
/// for (see the crate documentation).
fn restart_hold(spec: &ResourceSpec) -> Duration {
    let rate = spec.rate_limit.as_ref().map_or(Duration::ZERO, |r| {
        let burst = r
            .emission_interval()
            .checked_mul(r.burst.max(1))
            .unwrap_or(Duration::MAX);
        r.period.max(burst)
    });
    let lease = spec.bulkhead.as_ref().map_or(Duration::ZERO, |b| b.lease);
    rate.max(lease)
}

impl fmt::Debug for RedisResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisResource")
            .field("name", &self.shared.spec.name)
            .field("prefix", &self.shared.prefix)
            .field("fail_open", &self.shared.local.is_some())
            .finish_non_exhaustive()
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A time or duration as the scripts take it to the nanosecond:
/// `microseconds:nanoseconds` (the nanoseconds past the whole microseconds,
/// 0..999).
fn micros_nanos(d: Duration) -> String {
    format!("{}:{}", micros(d), d.subsec_nanos() % 1000)
}

/// A wait as the admission script gives it: whole microseconds (`us`, at
/// least 0), less the nanoseconds the exact wait is shorter (`under_ns`:
/// GCRA keeps its times to the nanosecond).
fn exact_wait(us: i64, under_ns: i64) -> Option<Duration> {
    u64::try_from(us).ok().map(|us| {
        Duration::from_micros(us)
            .saturating_sub(Duration::from_nanos(u64::try_from(under_ns).unwrap_or(0)))
    })
}

/// The reason of an admission script's reply code: `Some(None)` for an
/// admission, `None` for a code it never gives.
fn rejection_reason(code: i64) -> Option<Option<RejectionReason>> {
    match code {
        scripts::ADMITTED => Some(None),
        scripts::CIRCUIT_OPEN => Some(Some(RejectionReason::CircuitOpen)),
        scripts::BULKHEAD_FULL => Some(Some(RejectionReason::BulkheadFull)),
        scripts::COOLDOWN_ACTIVE => Some(Some(RejectionReason::CooldownActive)),
        scripts::RATE_LIMITED => Some(Some(RejectionReason::RateLimited)),
        scripts::RETRY_BUDGET_EXHAUSTED => Some(Some(RejectionReason::RetryBudgetExhausted)),
        _ => None,
    }
}

fn protocol(what: &str, reply: &[i64]) -> StoreError {
    StoreError::Protocol(format!(
        "unexpected {what} reply from the store script: {reply:?}"
    ))
}

/// `true` when a task spawned now runs without the caller driving it: on a
/// multi-thread runtime.
pub(crate) fn background_runs() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// Starts the background thread `name` of `of`, for what runs in the
/// background outside a multi-thread runtime: `body` holds `of` weakly, so
/// that the thread can end with it. `None` when no thread can be started.
pub(crate) fn background_thread<T: Send + Sync + 'static>(
    name: &str,
    of: &Arc<T>,
    body: fn(&Weak<T>),
) -> Option<std::thread::Thread> {
    let weak = Arc::downgrade(of);
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || body(&weak))
        .ok()
        .map(|h| h.thread().clone())
}

/// The most successes one admission carries; the others wait for the next
/// admission or for their delay.
const MAX_CARRIED: usize = 32;

/// The record of a silent success (see [`Shared::record_is_silent`]) not
/// yet sent: it waits in the store's [`Carrier`]
/// for the next admission of its resource and partition, or is sent on its
/// own.
struct Pending {
    shared: Arc<Shared>,
    partition: Option<PartitionKey>,
    permit: Permit,
    /// The arguments of the Lua function `success` (`success.lua`), joined
    /// by `,`.
    args: String,
    /// When it was recorded.
    since: Instant,
}

impl Pending {
    /// The record sent on its own: the `success` script.
    fn invocation(&self) -> Invocation {
        let mut inv = Invocation::new(&Scripts::get().success, self.shared.link.functions());
        self.shared.keys_of(&mut inv, self.partition.as_ref());
        for a in self.args.split(',') {
            inv.arg(a);
        }
        inv
    }

    /// Gives its slot back on the blocking path (the release is idempotent;
    /// the success of a closed circuit is immaterial).
    fn give_back_sync(self) {
        if self.permit.slot.is_none() {
            return;
        }
        let args = ReleaseArgs {
            partition: self.partition,
            permit: self.permit,
            reserved: None,
        };
        let inv = self.shared.release_invocation(&args);
        let _ = self.shared.link.invoke_sync_unordered::<i64>(&inv);
    }
}

/// Records on their way to Redis (carried by an admission, or sent on their
/// own), counted as unawaited so that the blocking path waits for them. If
/// a batch is dropped before [`answered`](Batch::answered) (its command
/// failed, timed out, or was cancelled, and may not have run), the slots of
/// its records are given back by the release script: in a task inside a
/// tokio runtime, on the blocking path outside one or when that task cannot
/// run (the runtime shuts down). A slot is never left to its lease while
/// Redis answers.
struct Batch {
    records: Vec<Pending>,
    unawaited: Option<crate::link::Unawaited>,
    /// Already the give-back task's: its drop gives back on the blocking
    /// path.
    giving_back: bool,
}

impl Batch {
    fn new(records: Vec<Pending>) -> Batch {
        let unawaited = records.first().map(|p| p.shared.link.unawaited());
        Batch {
            records,
            unawaited,
            giving_back: false,
        }
    }

    /// Records carried by a command the caller awaits on the blocking
    /// path: not counted as unawaited (the blocking path would wait for
    /// its own command).
    fn awaited(records: Vec<Pending>) -> Batch {
        Batch {
            records,
            unawaited: None,
            giving_back: false,
        }
    }

    fn answered(&mut self) {
        self.records.clear();
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // First: the blocking path waits for unawaited records.
        drop(self.unawaited.take());
        let records = std::mem::take(&mut self.records);
        if records.iter().all(|p| p.permit.slot.is_none()) {
            return;
        }
        if !self.giving_back {
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                let mut batch = Batch {
                    records,
                    unawaited: None,
                    giving_back: true,
                };
                handle.spawn(async move {
                    while let Some(p) = batch.records.pop() {
                        if p.permit.slot.is_none() {
                            continue;
                        }
                        let args = ReleaseArgs {
                            partition: p.partition.clone(),
                            permit: p.permit,
                            reserved: None,
                        };
                        let inv = p.shared.release_invocation(&args);
                        if p.shared.link.invoke_async_quiet::<i64>(&inv).await.is_err() {
                            batch.records.push(p);
                            return;
                        }
                    }
                });
                return;
            }
        }
        for p in records {
            p.give_back_sync();
        }
    }
}

/// The silent successes of one store waiting for an admission to carry
/// them. Each goes with the next admission of its resource (the same
/// binding) and partition through the store, async or blocking, or on its
/// own once it has waited `delay`, or before anything that must see it: a
/// record that may move the circuit, the circuit's metrics and controls,
/// the slots in flight. While one waits, a timer is armed: a task on a
/// multi-thread runtime that recorded it, the store's timer thread
/// otherwise (no runtime, or a current-thread one, which the caller may
/// keep from running a task). If that task is dropped (its runtime shuts
/// down), the slots waiting are given back on the blocking path.
struct Carrier {
    delay: Duration,
    state: Mutex<CarrierState>,
    /// Records waiting (read without the lock).
    waiting: AtomicUsize,
    /// The timer thread, started by the first record that arms the timer
    /// outside a multi-thread runtime (`None`: it could not be started).
    thread: OnceLock<Option<std::thread::Thread>>,
    /// Records the timer thread took and has not had answered: sent on a
    /// blocking connection, an async admission could overtake them (see
    /// [`Carrier::wait_for_thread`]).
    on_thread: Outstanding,
}

#[derive(Default)]
struct CarrierState {
    records: Vec<Pending>,
    /// A timer runs: a task ([`Carrier::flush_when_due`]) or the thread
    /// ([`carrier_thread`]).
    armed: bool,
}

impl Drop for Carrier {
    /// Ends the timer thread (it holds the carrier weakly).
    fn drop(&mut self) {
        if let Some(Some(thread)) = self.thread.get() {
            thread.unpark();
        }
    }
}

impl Carrier {
    fn new(delay: Duration) -> Carrier {
        Carrier {
            delay,
            state: Mutex::new(CarrierState::default()),
            waiting: AtomicUsize::new(0),
            thread: OnceLock::new(),
            on_thread: Outstanding::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CarrierState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `p` until an admission carries it or its delay ends.
    fn push(self: &Arc<Self>, p: Pending) {
        let arm = {
            let mut st = self.lock();
            st.records.push(p);
            self.waiting.store(st.records.len(), Ordering::Release);
            !std::mem::replace(&mut st.armed, true)
        };
        if !arm {
            return;
        }
        if background_runs() {
            // Spawned without the lock held: a runtime shutting down drops
            // the task at once, and its guard takes the lock.
            tokio::spawn(Carrier::flush_when_due(Armed(Some(Arc::clone(self)))));
            return;
        }
        let thread = self
            .thread
            .get_or_init(|| background_thread("seawall-redis-carrier", self, carrier_thread));
        match thread {
            Some(thread) => thread.unpark(),
            // No thread: sent now, each on its own.
            None => {
                self.lock().armed = false;
                self.flush_sync();
            }
        }
    }

    /// The records an admission of `shared`'s `partition` carries: its
    /// own, and those of any binding of the same state and spec (the same
    /// name and spec through this store: one state, the same records).
    fn take(&self, shared: &Arc<Shared>, partition: Option<&PartitionKey>) -> Vec<Pending> {
        if self.waiting.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let mut st = self.lock();
        let mut taken = Vec::new();
        let mut i = 0;
        while i < st.records.len() && taken.len() < MAX_CARRIED {
            let p = &st.records[i];
            if p.partition.as_ref() == partition && p.shared.same_state(shared) {
                taken.push(st.records.remove(i));
            } else {
                i += 1;
            }
        }
        self.waiting.store(st.records.len(), Ordering::Release);
        taken
    }

    /// The bulkhead slots waiting of `shared`'s `partition`: those of its
    /// records and of the records of every binding of the same state (the
    /// same name, through this store).
    fn slots(&self, shared: &Arc<Shared>, partition: Option<&PartitionKey>) -> Vec<u64> {
        if self.waiting.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        self.lock()
            .records
            .iter()
            .filter(|p| p.partition.as_ref() == partition && p.shared.keys == shared.keys)
            .filter_map(|p| p.permit.slot)
            .collect()
    }

    /// The records of `shared` waiting, of every partition.
    fn take_of(&self, shared: &Arc<Shared>) -> Vec<Pending> {
        if self.waiting.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let mut st = self.lock();
        let (taken, kept) = std::mem::take(&mut st.records)
            .into_iter()
            .partition(|p| Arc::ptr_eq(&p.shared, shared));
        st.records = kept;
        self.waiting.store(st.records.len(), Ordering::Release);
        taken
    }

    /// Every record waiting.
    fn take_all(&self) -> Vec<Pending> {
        if self.waiting.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let mut st = self.lock();
        self.waiting.store(0, Ordering::Release);
        std::mem::take(&mut st.records)
    }

    /// The records whose delay has ended at `now`, each a batch of its own,
    /// and when the next one's ends (`None`: nothing waits, the timer is
    /// disarmed). Each is counted as unawaited before the lock is let go:
    /// the blocking path, which no longer finds it waiting, waits for it.
    /// `by_thread`: for the timer thread, which counts them in
    /// `on_thread` too.
    fn take_due(&self, now: Instant, by_thread: bool) -> (Vec<Batch>, Option<Instant>) {
        let mut st = self.lock();
        let (due, kept): (Vec<Pending>, Vec<Pending>) = std::mem::take(&mut st.records)
            .into_iter()
            .partition(|p| p.since + self.delay <= now);
        st.records = kept;
        if by_thread {
            self.on_thread.add(due.len());
        }
        let due = due.into_iter().map(|p| Batch::new(vec![p])).collect();
        self.waiting.store(st.records.len(), Ordering::Release);
        let next = st.records.iter().map(|p| p.since + self.delay).min();
        if next.is_none() {
            st.armed = false;
        }
        (due, next)
    }

    /// The timer task: sends each record on its own once its delay ends,
    /// until nothing waits. `armed` is its argument, so that it is dropped
    /// with the task even if the task never ran.
    async fn flush_when_due(mut armed: Armed) {
        let Some(carrier) = armed.0.clone() else {
            return;
        };
        loop {
            let (due, next) = carrier.take_due(Instant::now(), false);
            for batch in due {
                send_alone(batch);
            }
            match next {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => {
                    armed.0 = None;
                    return;
                }
            }
        }
    }

    /// Waits (at most `bound`) until the records the timer thread took are
    /// answered: an async admission must not overtake them on its own
    /// connection (the blocking path waits for them as for every
    /// unawaited record). Returns at once when it sends none.
    fn wait_for_thread(&self, bound: Duration) {
        self.on_thread.wait(bound);
    }

    /// Sends every record waiting on the blocking path, before a call there
    /// that must see them.
    fn flush_sync(&self) {
        for p in self.take_all() {
            send_sync(Batch::awaited(vec![p]));
        }
    }

    /// Queues every record waiting on the async connection of the current
    /// runtime, each on its own, before a command that must see them.
    async fn flush_queued(&self) {
        for p in self.take_all() {
            send_queued(p).await;
        }
    }
}

/// The timer task of a [`Carrier`], while it runs: dropped before it ends
/// (its runtime shut down), it disarms the carrier and gives back the
/// slots of the records waiting, on the blocking path.
struct Armed(Option<Arc<Carrier>>);

impl Drop for Armed {
    fn drop(&mut self) {
        let Some(carrier) = self.0.take() else { return };
        let records = {
            let mut st = carrier.lock();
            st.armed = false;
            carrier.waiting.store(0, Ordering::Release);
            std::mem::take(&mut st.records)
        };
        for p in records {
            p.give_back_sync();
        }
    }
}

/// The timer thread of a [`Carrier`]: sends each record on its own once its
/// delay ends, on the blocking path; parked while nothing waits; ends with
/// the carrier.
fn carrier_thread(carrier: &Weak<Carrier>) {
    let mut next: Option<Instant> = None;
    loop {
        match next {
            Some(at) => std::thread::park_timeout(at.saturating_duration_since(Instant::now())),
            None => std::thread::park(),
        }
        let Some(c) = carrier.upgrade() else { return };
        let (due, later) = c.take_due(Instant::now(), true);
        next = later;
        for batch in due {
            send_sync(batch);
            c.on_thread.done();
        }
    }
}

/// Sends the record of `batch` on its own on the blocking path, its answer
/// awaited. A record that fails has its slot given back (by the batch).
fn send_sync(mut batch: Batch) {
    let Some(p) = batch.records.first() else {
        return;
    };
    let inv = p.invocation();
    if p.shared
        .link
        .invoke_sync_unordered::<Vec<i64>>(&inv)
        .is_ok()
    {
        batch.answered();
    }
}

/// Sends a record on its own in a task of its own.
fn send_alone(mut batch: Batch) {
    let Some(p) = batch.records.first() else {
        return;
    };
    let inv = p.invocation();
    let link = Arc::clone(&p.shared.link);
    tokio::spawn(async move {
        if link.invoke_async_quiet::<Vec<i64>>(&inv).await.is_ok() {
            batch.answered();
        }
    });
}

/// Sends a record on its own: queued on the connection before this
/// returns (the command is written before any sent later on the same
/// connection), its answer not awaited.
async fn send_queued(p: Pending) {
    let inv = p.invocation();
    let link = Arc::clone(&p.shared.link);
    let mut batch = Batch::new(vec![p]);
    // Unconstrained: tokio's cooperative budget must not keep the first
    // poll from queueing the command.
    let send = tokio::task::unconstrained(async move {
        // Answered, or failed: then the slot is given back when `batch`
        // drops (the runtime may be shutting down under it).
        if link.invoke_async_quiet::<Vec<i64>>(&inv).await.is_ok() {
            batch.answered();
        }
    });
    let mut send = Box::pin(send);
    let queued_only =
        std::future::poll_fn(|cx| Poll::Ready(send.as_mut().poll(cx).is_pending())).await;
    if queued_only {
        tokio::spawn(send);
    }
}

/// An admission about to be sent, as the refusals replayed locally need it.
#[derive(Debug, Clone, Copy)]
struct Sending {
    /// The store's clock.
    at: Duration,
    ticket: u64,
    /// The link's epoch.
    epoch: u64,
}

/// A release on its way in a task: dropped before the task has finished
/// (the runtime shut down), it is made on the blocking path.
struct Release(Option<(Arc<Shared>, ReleaseArgs)>);

impl Release {
    /// The task has made the release: nothing is left for the drop.
    fn sent(&mut self) {
        self.0 = None;
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        if let Some((shared, args)) = self.0.take() {
            let inv = shared.release_invocation(&args);
            let _ = shared.link.invoke_sync_unordered::<i64>(&inv);
        }
    }
}

/// The arguments of a release, owned so that it can run in the background.
struct ReleaseArgs {
    partition: Option<PartitionKey>,
    permit: Permit,
    /// A reserved rate-limit permit to give back.
    reserved: Option<Reservation>,
}

/// The answer of an admission script on its way from Redis.
type AdmitReply = std::pin::Pin<Box<dyn Future<Output = Result<Vec<i64>, StoreError>> + Send>>;

/// An admission sent on the async path, owned by its call's future: when
/// the call is dropped while the admission is in flight, the admission is
/// finished in a task of the runtime and what it took given back (see the
/// crate documentation).
struct Admitting {
    reply: Option<AdmitReply>,
    /// Polled once at least: the admission may have been sent.
    sent: bool,
    shared: Arc<Shared>,
    partition: Option<PartitionKey>,
    now: Duration,
    weight: u32,
    pre: bool,
}

impl Future for Admitting {
    type Output = Result<Vec<i64>, StoreError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Self::Output> {
        let this = &mut *self;
        let Some(reply) = this.reply.as_mut() else {
            return Poll::Ready(Err(StoreError::Unavailable(
                "admission polled after its answer".into(),
            )));
        };
        this.sent = true;
        let answer = std::task::ready!(reply.as_mut().poll(cx));
        this.reply = None;
        Poll::Ready(answer)
    }
}

impl Drop for Admitting {
    fn drop(&mut self) {
        let Some(reply) = self.reply.take() else {
            return;
        };
        if !self.sent {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let shared = Arc::clone(&self.shared);
        let partition = self.partition.take();
        let (now, weight, pre) = (self.now, self.weight, self.pre);
        handle.spawn(async move {
            if let Ok(reply) = reply.await {
                shared.give_back_admitted(&reply, partition, now, weight, pre);
            }
        });
    }
}

impl Shared {
    /// After a restart of the server (which lost the windows and leases it
    /// held), admissions are refused until the state lost can no longer
    /// matter: until the restarted server is [`restart_hold`] old (the
    /// server's clock), or, on the caller's clock, for that long from the
    /// first admission that saw the restart.
    fn restart_hold(&self, restart: Restart, now: Duration) -> Result<(), StoreError> {
        if self.hold.is_zero() {
            return Ok(());
        }
        let left = if self.caller_clock {
            let mut h = self
                .caller_hold
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if h.epoch != restart.epoch {
                h.epoch = restart.epoch;
                h.until = now.saturating_add(self.hold);
            }
            h.until.saturating_sub(now)
        } else {
            self.hold.saturating_sub(restart.started.elapsed())
        };
        if left.is_zero() {
            return Ok(());
        }
        Err(StoreError::Unavailable(format!(
            "redis at {} restarted and lost the windows and leases it held; \
             admissions to `{}` resume in {left:?}, when they can no longer matter",
            self.link.settings.address, self.spec.name
        )))
    }

    /// An invocation of `script` with the keys of `partition`, the time and
    /// the spec; the operation's own arguments are added by the caller.
    /// Adds the keys of `partition`.
    fn keys_of(&self, inv: &mut Invocation, partition: Option<&PartitionKey>) {
        match partition {
            None => {
                for k in &self.keys.0 {
                    inv.key(k.as_str());
                }
            }
            Some(p) => {
                for k in Keys::new(&self.prefix, &self.spec, Some(p)).0 {
                    inv.key(k);
                }
            }
        }
    }

    /// `now` is used only with [`TimeSource::Caller`]; `None` always means
    /// the server's clock.
    fn invocation(
        &self,
        script: &Lua,
        partition: Option<&PartitionKey>,
        now: Option<Duration>,
    ) -> Invocation {
        self.with_spec(self.head(script, self.link.functions(), partition, now))
    }

    /// `inv` with the spec's arguments (`ARGV[2..=27]`).
    fn with_spec(&self, mut inv: Invocation) -> Invocation {
        for a in &self.args.values {
            inv.arg(a.as_str());
        }
        inv
    }

    /// A call of `script` (as a function when `functions`) with its keys
    /// and time, without the spec's arguments: a script compiled for the
    /// spec ([`SpecScripts`]) has them.
    fn head(
        &self,
        script: &Lua,
        functions: bool,
        partition: Option<&PartitionKey>,
        now: Option<Duration>,
    ) -> Invocation {
        let mut inv = Invocation::new(script, functions);
        self.keys_of(&mut inv, partition);
        match now {
            // Whole microseconds and the nanoseconds past them (GCRA keeps
            // its times to the nanosecond).
            Some(now) if self.caller_clock => inv.arg(micros_nanos(now)),
            _ => inv.arg(""),
        };
        inv
    }

    fn admit_invocation(&self, request: &AdmitRequest<'_>, carried: &[Pending]) -> Invocation {
        self.admit_reserving_invocation(request, Reserve::default(), carried)
    }

    /// `true` when the rate limiter's calls may wait for a permit: every
    /// admission then passes a lead and a held reservation (see
    /// `admit.lua`).
    fn reserves(&self) -> bool {
        self.spec
            .rate_limit
            .as_ref()
            .is_some_and(|r| !r.max_wait.is_zero())
    }

    /// The admission; with `carried` records (of the same keys), the
    /// admission that applies them first (`carry.lua`), their arguments
    /// last.
    fn admit_reserving_invocation(
        &self,
        request: &AdmitRequest<'_>,
        reserve: Reserve,
        carried: &[Pending],
    ) -> Invocation {
        let (partition, now) = (request.partition, Some(request.now));
        // As a function, the one for every spec, the spec by its id (sent
        // in full where the library does not hold it yet); by `EVALSHA`,
        // the script compiled for the spec.
        let inv = if self.link.functions() {
            let scripts = Scripts::get();
            let every_spec = match carried.is_empty() {
                true => &scripts.admit,
                false => &scripts.admit_carrying,
            };
            let mut inv = self.head(every_spec, true, partition, now);
            // In full the first time: the library holds it from then on
            // (a library that lost it answers so, see `Link::eval_sync`).
            match self.spec_sent.swap(true, Ordering::Relaxed) {
                true => inv.spec_by_id(&self.args),
                false => inv.spec_in_full(&self.args),
            };
            inv
        } else {
            let compiled = spec_scripts(&self.compiled, &self.link, &self.args);
            let this_spec = match carried.is_empty() {
                true => &compiled.admit,
                false => &compiled.admit_carrying,
            };
            self.head(this_spec, false, partition, now)
        };
        self.admission_args(inv, request, reserve, carried)
    }

    /// An admission by `script` (`admit`, `admit_carrying`, or `lease`,
    /// which runs its rule), with `carried` records for `admit_carrying`.
    fn admission_invocation(
        &self,
        script: &Lua,
        request: &AdmitRequest<'_>,
        reserve: Reserve,
        carried: &[Pending],
    ) -> Invocation {
        let inv = self.invocation(script, request.partition, Some(request.now));
        self.admission_args(inv, request, reserve, carried)
    }

    /// Adds an admission's arguments to `inv`: the records it carries,
    /// then its own.
    fn admission_args(
        &self,
        mut inv: Invocation,
        request: &AdmitRequest<'_>,
        reserve: Reserve,
        carried: &[Pending],
    ) -> Invocation {
        if !carried.is_empty() {
            // First, how many records, then the seven arguments of each,
            // which the script reads where they are (see `carry.lua`).
            inv.arg(carried.len());
            for p in carried {
                for a in p.args.split(',') {
                    inv.arg(a);
                }
            }
        }
        let budget = match request.budget {
            Some(BudgetStep::Deposit) => self.budget_args[0].as_str(),
            Some(BudgetStep::Withdraw) => self.budget_args[1].as_str(),
            _ => "",
        };
        if self.pre_shadowed(request) {
            // A call shadowed already: `s` before the budget's argument
            // (see `admit.lua`).
            inv.arg(format!("s{budget}"));
        } else {
            inv.arg(budget);
        }
        // A held reservation is given back as it was taken.
        let weight = reserve.held.map_or(request.weight, |r| r.weight);
        if self.reserves() || weight != 1 {
            inv.arg(micros_nanos(reserve.within)).arg(
                reserve
                    .held
                    .map_or_else(|| "-1".to_owned(), |r| micros_nanos(r.at)),
            );
        }
        if weight != 1 {
            inv.arg(weight);
        }
        inv
    }

    fn record_invocation(self: &Arc<Self>, record: &Record<'_>) -> Invocation {
        if self.record_is_silent(record) {
            return self.success_invocation(record);
        }
        let mut inv = self.invocation(&Scripts::get().record, record.partition, Some(record.now));
        let p = record.permit;
        let outcome = match record.outcome {
            Outcome::Success => 0,
            Outcome::Failure => 1,
            _ => 2,
        };
        inv.arg(u8::from(p.probe))
            .arg(p.generation)
            .arg(p.slot.map_or(-1, |s| i64::try_from(s).unwrap_or(-1)))
            .arg(outcome)
            .arg(micros(record.duration))
            .arg(
                record
                    .retry_after
                    .map_or(-1, |d| i64::try_from(micros(d)).unwrap_or(i64::MAX)),
            );
        if p.shadowed {
            inv.arg(1);
        }
        inv
    }

    /// The lean record of a silent success (or ignored outcome).
    fn success_invocation(self: &Arc<Self>, record: &Record<'_>) -> Invocation {
        self.pending(record).invocation()
    }

    /// The circuit mode `success.lua` records a silent success in: "0"
    /// (nothing) without a circuit, for an ignored outcome, and for a
    /// shadowed call of a circuit in shadow mode (which records nothing of
    /// it).
    fn success_mode(&self, record: &Record<'_>) -> &'static str {
        match record.outcome {
            Outcome::Success if !(record.permit.shadowed && self.circuit_in_shadow) => {
                self.success_args.mode
            }
            _ => "0",
        }
    }

    /// `true` for a silent record that changes nothing on the server: no
    /// slot to free, nothing for the circuit (see `success.lua`). It is not
    /// sent.
    fn record_is_void(&self, record: &Record<'_>) -> bool {
        record.permit.slot.is_none()
            && self.record_is_silent(record)
            && self.success_mode(record) == "0"
    }

    /// A silent success (or ignored outcome) as it waits to be sent: the
    /// arguments of the Lua function `success` (`success.lua`).
    fn pending(self: &Arc<Self>, record: &Record<'_>) -> Pending {
        let p = record.permit;
        let mode = self.success_mode(record);
        let mut args = String::with_capacity(48);
        if self.caller_clock {
            let _ = write!(args, "{}", micros(record.now));
        }
        let _ = write!(
            args,
            ",{},{},{}",
            p.slot.map_or(-1, |s| i64::try_from(s).unwrap_or(-1)),
            p.generation,
            mode
        );
        for a in &self.success_args.rest {
            args.push(',');
            args.push_str(a);
        }
        Pending {
            shared: Arc::clone(self),
            partition: record.partition.cloned(),
            permit: p,
            args,
            since: Instant::now(),
        }
    }

    /// Sends the admission `inv` of `request` on the async connection (see
    /// [`Admitting`]).
    fn admitting(self: &Arc<Self>, inv: Invocation, request: &AdmitRequest<'_>) -> Admitting {
        let shared = Arc::clone(self);
        let now = request.now;
        let reply: AdmitReply = Box::pin(async move {
            let s = &*shared;
            let hold = move |r: Restart| s.restart_hold(r, now);
            s.link.admit_async::<Vec<i64>>(&inv, &hold).await
        });
        Admitting {
            reply: Some(reply),
            sent: false,
            shared: Arc::clone(self),
            partition: request.partition.cloned(),
            now,
            weight: request.weight,
            pre: self.pre_shadowed(request),
        }
    }

    /// Gives back what the admission answered by `reply` took (a slot, a
    /// probe, a reserved permit), for a call that is gone.
    fn give_back_admitted(
        self: &Arc<Self>,
        reply: &[i64],
        partition: Option<PartitionKey>,
        now: Duration,
        weight: u32,
        pre: bool,
    ) {
        let Ok((admission, reserved)) = self.admission_reserving(reply, now, weight, pre) else {
            return;
        };
        let permit = admission.decision.unwrap_or_default();
        if permit.slot.is_none() && !permit.probe && reserved.is_none() {
            return;
        }
        self.release_in_background(ReleaseArgs {
            partition,
            permit,
            reserved,
        });
    }

    fn release_invocation(&self, r: &ReleaseArgs) -> Invocation {
        let mut inv = self.invocation(&Scripts::get().release, r.partition.as_ref(), None);
        inv.arg(u8::from(r.permit.probe))
            .arg(r.permit.generation)
            .arg(r.permit.slot.map_or(-1, |s| i64::try_from(s).unwrap_or(-1)))
            .arg(
                r.reserved
                    .map_or_else(|| "-1".to_owned(), |res| micros_nanos(res.at)),
            );
        if let Some(res) = r.reserved.filter(|res| res.weight != 1) {
            inv.arg(res.weight);
        }
        inv
    }

    /// Runs the release script: spawned inside a tokio runtime, a blocking
    /// call bounded by the store's timeout outside one or when the task
    /// cannot run (the runtime shuts down before it has sent the release;
    /// the script is idempotent, so a release the task had sent already
    /// is harmless).
    fn release_in_background(self: &Arc<Self>, args: ReleaseArgs) {
        let s = self;
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let mut release = Release(Some((Arc::clone(s), args)));
                handle.spawn(async move {
                    if let Some((shared, args)) = &release.0 {
                        let inv = shared.release_invocation(args);
                        let _ = shared.link.invoke_async_quiet::<i64>(&inv).await;
                    }
                    release.sent();
                });
            }
            Err(_) => {
                let inv = s.release_invocation(&args);
                let _ = s.link.invoke_sync_unordered::<i64>(&inv);
            }
        }
    }

    /// The store's clock: the caller's `now` on the caller's time source;
    /// on the server's, a monotonic clock of this process (the server's
    /// `TIME` is not read without a round trip). Refusals kept locally
    /// expire on it.
    fn clock(&self, now: Duration) -> Duration {
        if self.caller_clock {
            now
        } else {
            self.born.elapsed()
        }
    }

    /// The refusal Redis gave an admission like `request` whose end has not
    /// come yet, answered without a round trip. Never for a call that
    /// presents a due reservation (Redis gives it back when it refuses),
    /// nor while Redis is skipped after a failure (the [`FailMode`]
    /// answers), nor after an outage or a restart seen since it was given,
    /// nor for an admission that moves a retry budget kept in the store
    /// (its deposit must reach Redis, and the script asks the budget
    /// before the rate limiter).
    fn replayed(&self, request: &AdmitRequest<'_>, reserve: Reserve) -> Option<Admission> {
        if reserve.held.is_some() || request.budget.is_some() || !self.link.is_available() {
            return None;
        }
        let rejection = self.refusals.lookup(
            request.partition,
            request.weight,
            self.clock(request.now),
            self.link.epoch(),
        )?;
        Some(Admission {
            decision: Err(rejection),
            transition: None,
            degraded: None,
            shadow: None,
        })
    }

    /// Before an admission is sent: the store's clock, its ticket and the
    /// link's epoch.
    fn sending(&self, request: &AdmitRequest<'_>) -> Sending {
        Sending {
            at: self.clock(request.now),
            ticket: self.refusals.ticket(),
            epoch: self.link.epoch(),
        }
    }

    /// A record was made through this store: one that may have changed
    /// the partition's circuit or cooldown (see [`Shared::record_is_silent`])
    /// ends the refusal replayed for it, and the answers to admissions
    /// sent before it are not kept.
    fn recorded_here(&self, record: &Record<'_>) {
        if !self.record_is_silent(record) {
            self.refusals.clear(record.partition);
        }
    }

    /// Learns Redis's `reply` to the admission `request` sent at `sent`
    /// with `ticket`. A refusal is kept until its end when no admission of
    /// the same partition and weight can pass before it, in any process,
    /// but through the exceptions the crate documentation lists: a circuit
    /// open until an instant (only a manual control or the end of the open
    /// period moves it), a cooldown (its end only moves later), a rate
    /// limit whose calls never wait (no reservation is ever given back, so
    /// its state only moves towards refusing longer). Anything else
    /// removes the partition's entry.
    fn learn(&self, request: &AdmitRequest<'_>, sent: Sending, reply: &[i64]) {
        if !self.refusals.enabled() {
            return;
        }
        let Some([reason, retry_us, _, _, _, _, _, under_ns, reserved_us, _, _, _, _]) =
            scripts::admit_reply(reply)
        else {
            return;
        };
        // An admission may move a circuit even when a later policy refuses
        // it (an open circuit half-opens, a round of probes expires): an
        // enforcing circuit that lets a call on to the cooldown or the rate
        // limit is closed, or half-open with a probe free (only admissions
        // take probes), so it does not; one in shadow mode may be open.
        let kept = match rejection_reason(reason) {
            _ if self.circuit_in_shadow => None,
            Some(Some(r @ (RejectionReason::CircuitOpen | RejectionReason::CooldownActive))) => {
                Some(r)
            }
            Some(Some(r @ RejectionReason::RateLimited)) if !self.reserves() && reserved_us < 0 => {
                Some(r)
            }
            _ => None,
        };
        // On the caller's clock, the script counts the waits of the circuit
        // and the cooldown from the clock's whole microsecond; the rate
        // limiter's (GCRA, the fixed window, the sliding log) from the
        // nanosecond.
        let micros = self.caller_clock && kept != Some(RejectionReason::RateLimited);
        let answer = match (kept, retry_us > 0) {
            (Some(r), true) => exact_wait(retry_us, under_ns)
                .map_or(Answer::Other, |wait| Answer::RefusedFor(r, wait, micros)),
            _ => Answer::Other,
        };
        self.refusals.learn(
            request.partition,
            request.weight,
            sent.at,
            sent.ticket,
            sent.epoch,
            answer,
            self.clock(request.now),
        );
    }

    /// Whether `request` is for a call shadowed already that meets a
    /// policy in shadow mode here: the script leaves such policies out and
    /// the permit is shadowed (see [`AdmitRequest::shadowed`]).
    fn pre_shadowed(&self, request: &AdmitRequest<'_>) -> bool {
        request.shadowed && self.any_in_shadow
    }

    /// The admission of a call shadowed already (`pre`, see
    /// [`pre_shadowed`](Self::pre_shadowed)) or not.
    fn admission(&self, reply: &[i64], now: Duration, pre: bool) -> Result<Admission, StoreError> {
        self.admission_reserving(reply, now, 1, pre).map(|(a, _)| a)
    }

    /// The admission, and the rate-limit permit it reserved.
    fn admission_reserving(
        &self,
        reply: &[i64],
        now: Duration,
        weight: u32,
        pre: bool,
    ) -> Result<(Admission, Option<Reservation>), StoreError> {
        let Some(
            [reason, retry_us, probe, generation, slot, transition, trips, under_ns, reserved_us, reserved_ns, shadow_reason, shadow_retry_us, shadow_under_ns],
        ) = scripts::admit_reply(reply)
        else {
            return Err(protocol("admit", reply));
        };
        // The instant of a reserved permit, to the nanosecond (GCRA's).
        let reservation = u64::try_from(reserved_us).ok().map(|us| Reservation {
            at: Duration::from_micros(us).saturating_add(Duration::from_nanos(
                u64::try_from(reserved_ns).unwrap_or(0),
            )),
            weight,
        });
        let retry_after = |retry_us: i64, under_ns: i64| match retry_us {
            // Half-open after an explicit open, every probe slot taken: the
            // duration it was opened for, as the in-memory store hints.
            us if us <= scripts::RETRY_OPENED_FOR => Some(Duration::from_micros(
                u64::try_from(scripts::RETRY_OPENED_FOR - us).unwrap_or(0),
            )),
            // Half-open with every probe slot taken: the cooldown of the
            // current trip, as the in-memory store hints.
            scripts::RETRY_COOLDOWN => self
                .spec
                .circuit
                .as_ref()
                .map(|c| c.cooldown_for_trip(u32::try_from(trips).unwrap_or(u32::MAX))),
            // Open until the latest instant of the clock.
            scripts::RETRY_FOREVER => Some(Duration::from_nanos(u64::MAX).saturating_sub(now)),
            us => exact_wait(us, under_ns),
        };
        let reason_of = |code: i64| rejection_reason(code).ok_or_else(|| protocol("admit", reply));
        let shadow = reason_of(shadow_reason)?
            .map(|r| Rejection::new(r, retry_after(shadow_retry_us, shadow_under_ns)));
        let decision = match reason_of(reason)? {
            None => Ok(Permit {
                probe: probe == 1,
                generation: u64::try_from(generation).unwrap_or(0),
                slot: u64::try_from(slot).ok(),
                local: false,
                shadowed: pre || shadow.is_some(),
            }),
            Some(reason) => Err(Rejection::new(reason, retry_after(retry_us, under_ns))),
        };
        let transition = match transition {
            scripts::HALF_OPENED => Some(CircuitTransition::HalfOpened),
            scripts::PROBES_EXPIRED => Some(CircuitTransition::ProbesExpired),
            _ => None,
        };
        let admission = Admission {
            decision,
            transition,
            degraded: None,
            shadow,
        };
        Ok((admission, reservation))
    }

    fn recorded(&self, reply: &[i64]) -> Result<Recorded, StoreError> {
        let &[transition, trips, cooldown_us] = reply else {
            return Err(protocol("record", reply));
        };
        let transition = match transition {
            0 => None,
            scripts::OPENED => {
                let trips = u32::try_from(trips).unwrap_or(u32::MAX);
                let cooldown = self
                    .spec
                    .circuit
                    .as_ref()
                    .map_or(Duration::ZERO, |c| c.cooldown_for_trip(trips));
                Some(CircuitTransition::Opened { cooldown })
            }
            scripts::CLOSED => Some(CircuitTransition::Closed),
            _ => return Err(protocol("record", reply)),
        };
        Ok(Recorded {
            transition,
            cooldown: u64::try_from(cooldown_us).ok().map(Duration::from_micros),
            degraded: None,
        })
    }

    /// Redis failed on admission: answer locally (fail-open) or refuse.
    fn admit_degraded(
        &self,
        request: &AdmitRequest<'_>,
        e: StoreError,
    ) -> Result<Admission, StoreError> {
        let Some(local) = &self.local else {
            return self.never_granted(request).ok_or(e);
        };
        let mut admission = local.admit(request)?;
        if let Ok(p) = &mut admission.decision {
            p.local = true;
        }
        admission.degraded = Some(e);
        Ok(admission)
    }

    /// Fail-closed, Redis failing: the refusal of a weight the rate limit
    /// can never grant ([`RateLimiter::grants`](seawall::RateLimiter::grants)),
    /// which the admission script gives before any other check and
    /// without reading its state, so that it does not depend on Redis.
    /// `None` for any other call, and for a limiter in shadow mode (the
    /// other policies would decide it).
    fn never_granted(&self, request: &AdmitRequest<'_>) -> Option<Admission> {
        let rate = self.spec.rate_limit.as_ref()?;
        (!rate.shadow && !rate.grants(request.weight))
            .then(|| Admission::rejected(Rejection::new(RejectionReason::RateLimited, None)))
    }

    /// Redis failed on a record: the outcome is lost (its slot comes back
    /// with the lease), reported as degraded (fail-open) or as an error.
    fn record_degraded(&self, e: StoreError) -> Result<Recorded, StoreError> {
        match self.local {
            Some(_) => Ok(Recorded {
                degraded: Some(e),
                ..Recorded::default()
            }),
            None => Err(e),
        }
    }

    fn record_local(&self, record: &Record<'_>) -> Result<Recorded, StoreError> {
        match &self.local {
            Some(local) => local.record(record),
            None => Ok(Recorded::default()),
        }
    }

    /// `true` when recording `record` can report nothing: a success (or an
    /// ignored outcome) of a permit that is not a probe, not slow, without
    /// a retry-after hint. Such a record never moves the circuit (rates are
    /// judged on failed or slow calls only) nor opens a cooldown.
    fn record_is_silent(&self, record: &Record<'_>) -> bool {
        let slow =
            self.spec.circuit.as_ref().is_some_and(|c| {
                c.slow_call_rate.is_some() && record.duration >= c.slow_call_duration
            });
        !record.permit.probe
            && record.retry_after.is_none()
            && !slow
            && matches!(record.outcome, Outcome::Success | Outcome::Ignored)
    }

    /// `other` binds the same state with the same spec through the same
    /// store: a record of either is a record of both.
    fn same_state(&self, other: &Shared) -> bool {
        std::ptr::eq(self, other) || (self.keys == other.keys && self.spec == other.spec)
    }

    /// `record` waits in the carrier for an admission to carry it: a silent
    /// success, with a delay to wait, while Redis answers.
    fn waits_to_be_carried(&self, record: &Record<'_>) -> bool {
        !self.carrier.delay.is_zero() && self.record_is_silent(record) && self.link.is_available()
    }

    /// The successes waiting that an async admission of `partition`
    /// carries (none while Redis is skipped: they wait for their delay),
    /// once those the timer thread is sending landed. (Waited for after
    /// the records are taken: the thread counts what it takes under the
    /// same lock, so a record is either carried or waited for.)
    fn carried(&self, me: &Arc<Shared>, partition: Option<&PartitionKey>) -> Batch {
        let batch = Batch::new(self.to_carry(me, partition));
        self.carrier.wait_for_thread(self.longest_wait());
        batch
    }

    /// [`carried`](Self::carried) by a blocking admission.
    fn carried_sync(&self, me: &Arc<Shared>, partition: Option<&PartitionKey>) -> Batch {
        Batch::awaited(self.to_carry(me, partition))
    }

    fn to_carry(&self, me: &Arc<Shared>, partition: Option<&PartitionKey>) -> Vec<Pending> {
        if !self.link.is_available() {
            return Vec::new();
        }
        self.carrier.take(me, partition)
    }

    fn in_flight_invocation(&self, partition: Option<&PartitionKey>, now: Duration) -> Invocation {
        self.invocation(&Scripts::get().in_flight, partition, Some(now))
    }
}

/// What leased mode (`lease.rs`) uses of the exact path: the lease is the
/// admission script's weighted admission, its give-back the release
/// script's, its failures the fail mode's.
impl Shared {
    /// The spec of the resource.
    pub(crate) fn spec(&self) -> &ResourceSpec {
        &self.spec
    }

    /// The lease of `batch` rate-limit permits: the reply of the lease
    /// script (the admission's, then the instant to give the batch back
    /// with, see `lua/lease.lua`), on the blocking path.
    pub(crate) fn lease_sync(&self, now: Duration, batch: u32) -> Result<Vec<i64>, StoreError> {
        let request = AdmitRequest::new(None, now).with_weight(batch);
        let inv =
            self.admission_invocation(&Scripts::get().lease, &request, Reserve::default(), &[]);
        let hold = |r: Restart| self.restart_hold(r, now);
        self.link.admit_sync::<Vec<i64>>(&inv, &hold)
    }

    /// [`lease_sync`](Self::lease_sync) on the async path.
    pub(crate) async fn lease_async(
        &self,
        now: Duration,
        batch: u32,
    ) -> Result<Vec<i64>, StoreError> {
        let request = AdmitRequest::new(None, now).with_weight(batch);
        let inv =
            self.admission_invocation(&Scripts::get().lease, &request, Reserve::default(), &[]);
        let hold = move |r: Restart| self.restart_hold(r, now);
        self.link.admit_async::<Vec<i64>>(&inv, &hold).await
    }

    /// The lease of up to `slots` bulkhead slots (see `lua/lease.lua`),
    /// on the blocking path: a refusal, or an admission and the slot ids
    /// from the 17th field on.
    pub(crate) fn slot_lease_sync(
        &self,
        now: Duration,
        slots: u32,
    ) -> Result<Vec<i64>, StoreError> {
        let inv = self.slot_lease_invocation(now, slots);
        let hold = |r: Restart| self.restart_hold(r, now);
        self.link.admit_sync::<Vec<i64>>(&inv, &hold)
    }

    /// [`slot_lease_sync`](Self::slot_lease_sync) on the async path.
    pub(crate) async fn slot_lease_async(
        &self,
        now: Duration,
        slots: u32,
    ) -> Result<Vec<i64>, StoreError> {
        let inv = self.slot_lease_invocation(now, slots);
        let hold = move |r: Restart| self.restart_hold(r, now);
        self.link.admit_async::<Vec<i64>>(&inv, &hold).await
    }

    fn slot_lease_invocation(&self, now: Duration, slots: u32) -> Invocation {
        let mut inv = self.invocation(&Scripts::get().lease, None, Some(now));
        // No budget step, no lead, no held reservation, weight 1.
        inv.arg("").arg("0:0").arg("-1").arg(1).arg(slots);
        inv
    }

    /// Extends the leases of the bulkhead slots `ids`: for each, whether it
    /// was still held.
    pub(crate) fn extend_slots(&self, now: Duration, ids: &[u64]) -> Result<Vec<i64>, StoreError> {
        let mut inv = self.invocation(&Scripts::get().extend, None, Some(now));
        for id in ids {
            inv.arg(*id);
        }
        self.link.invoke_sync::<Vec<i64>>(&inv)
    }

    /// Gives the bulkhead slot `id` back, in the background.
    pub(crate) fn give_back_slot(self: &Arc<Self>, id: u64) {
        if !self.link.is_available() {
            return;
        }
        self.release_in_background(ReleaseArgs {
            partition: None,
            permit: Permit {
                slot: Some(id),
                ..Permit::default()
            },
            reserved: None,
        });
    }

    /// The admission part of a lease script's reply.
    pub(crate) fn lease_admission(
        &self,
        reply: &[i64],
        now: Duration,
    ) -> Result<Admission, StoreError> {
        self.admission(reply.get(..13).unwrap_or(reply), now, false)
    }

    /// Gives `permits` of a batch back, as a reservation at `at` is given
    /// back (`rgive` in `lua/prelude.lua`), in the background.
    pub(crate) fn give_back_lease(self: &Arc<Self>, at: Duration, permits: u32) {
        if permits == 0 || !self.link.is_available() {
            return;
        }
        self.release_in_background(ReleaseArgs {
            partition: None,
            permit: Permit::default(),
            reserved: Some(Reservation {
                at,
                weight: permits,
            }),
        });
    }

    /// `false` while Redis is skipped after a failure.
    pub(crate) fn is_available(&self) -> bool {
        self.link.is_available()
    }

    /// The store's clock (see [`Shared::clock`]).
    pub(crate) fn store_clock(&self, now: Duration) -> Duration {
        self.clock(now)
    }

    /// Redis failed: the fail mode answers (see [`Shared::admit_degraded`]).
    pub(crate) fn degraded(
        &self,
        request: &AdmitRequest<'_>,
        e: StoreError,
    ) -> Result<Admission, StoreError> {
        self.admit_degraded(request, e)
    }

    /// The longest a store operation takes: connect timeout + timeout.
    pub(crate) fn longest_wait(&self) -> Duration {
        self.link
            .settings
            .connect_timeout
            .saturating_add(self.link.settings.timeout)
    }
}

impl Drop for RedisResource {
    /// Outside a multi-thread runtime, the resource's successes still
    /// waiting are sent now, on the blocking path: a process that drops
    /// its pipelines and exits right after loses none of them, nor leaves
    /// their slots taken until their leases end. (On a multi-thread
    /// runtime the timer task sends them after their delay, or gives their
    /// slots back when the runtime shuts down.)
    fn drop(&mut self) {
        if background_runs() {
            return;
        }
        for p in self.shared.carrier.take_of(&self.shared) {
            send_sync(Batch::awaited(vec![p]));
        }
    }
}

impl ResourceState for RedisResource {
    /// One round trip, or none while a refusal Redis gave with a known end
    /// still holds (see the crate documentation).
    fn admit(&self, request: &AdmitRequest<'_>) -> Result<Admission, StoreError> {
        let s = &*self.shared;
        if let Some(refused) = s.replayed(request, Reserve::default()) {
            return Ok(refused);
        }
        let mut carried = s.carried_sync(&self.shared, request.partition);
        let inv = s.admit_invocation(request, &carried.records);
        let hold = |r: Restart| s.restart_hold(r, request.now);
        let sent = s.sending(request);
        match s.link.admit_sync::<Vec<i64>>(&inv, &hold) {
            Ok(reply) => {
                carried.answered();
                s.learn(request, sent, &reply);
                s.admission(&reply, request.now, s.pre_shadowed(request))
            }
            Err(e) => {
                // The carried records may not have run: their slots are
                // given back.
                drop(carried);
                s.admit_degraded(request, e)
            }
        }
    }

    fn admit_async<'a>(&'a self, request: AdmitRequest<'a>) -> StoreFuture<'a, Admission> {
        if let Some(refused) = self.shared.replayed(&request, Reserve::default()) {
            return StoreFuture::ready(Ok(refused));
        }
        if tokio::runtime::Handle::try_current().is_err() {
            // Polled outside tokio: the blocking path still answers.
            return StoreFuture::ready(self.admit(&request));
        }
        StoreFuture::boxed(async move {
            let s = &*self.shared;
            let mut carried = s.carried(&self.shared, request.partition);
            let inv = s.admit_invocation(&request, &carried.records);
            let sent = s.sending(&request);
            match self.shared.admitting(inv, &request).await {
                Ok(reply) => {
                    carried.answered();
                    s.learn(&request, sent, &reply);
                    s.admission(&reply, request.now, s.pre_shadowed(&request))
                }
                Err(e) => {
                    // The carried records may not have run: their slots
                    // are given back.
                    drop(carried);
                    s.admit_degraded(&request, e)
                }
            }
        })
    }

    /// A success that cannot change anything the caller is told (not a
    /// probe, not slow, no retry-after hint) costs no round trip of its
    /// own: it waits in the store until the next admission of its
    /// partition carries it, or for
    /// [`success_delay`](crate::RedisStoreBuilder::success_delay), then is
    /// sent on its own (see the crate documentation). Any other record is
    /// one round trip, after the successes waiting were sent.
    fn record(&self, record: &Record<'_>) -> Result<Recorded, StoreError> {
        let s = &*self.shared;
        if record.permit.local {
            return s.record_local(record);
        }
        if s.record_is_void(record) {
            return Ok(Recorded::default());
        }
        if s.waits_to_be_carried(record) {
            s.carrier.push(self.shared.pending(record));
            return Ok(Recorded::default());
        }
        s.carrier.flush_sync();
        let inv = self.shared.record_invocation(record);
        let reply = s.link.invoke_sync::<Vec<i64>>(&inv);
        s.recorded_here(record);
        match reply {
            Ok(reply) => s.recorded(&reply),
            Err(e) => s.record_degraded(e),
        }
    }

    /// As [`record`](ResourceState::record): a success that cannot change
    /// anything the caller is told waits to be carried. Any other record
    /// is one round trip, after the successes waiting were queued on the
    /// connection. With a `success_delay` of zero, a silent success is
    /// queued on the connection on its own, its answer not awaited, on a
    /// multi-thread runtime (a current-thread runtime may not run again
    /// before the next call: there it is awaited).
    fn record_async<'a>(&'a self, record: Record<'a>) -> StoreFuture<'a, Recorded> {
        if record.permit.local || tokio::runtime::Handle::try_current().is_err() {
            return StoreFuture::ready(self.record(&record));
        }
        let s = &self.shared;
        if s.record_is_void(&record) {
            return StoreFuture::ready(Ok(Recorded::default()));
        }
        if s.waits_to_be_carried(&record) {
            s.carrier.push(s.pending(&record));
            return StoreFuture::ready(Ok(Recorded::default()));
        }
        if s.carrier.delay.is_zero()
            && s.record_is_silent(&record)
            && s.link.is_available()
            && background_runs()
        {
            let pending = s.pending(&record);
            return StoreFuture::boxed(async move {
                send_queued(pending).await;
                Ok(Recorded::default())
            });
        }
        StoreFuture::boxed(async move {
            let s = &self.shared;
            s.carrier.flush_queued().await;
            s.carrier.wait_for_thread(s.longest_wait());
            let inv = s.record_invocation(&record);
            let reply = s.link.invoke_async::<Vec<i64>>(&inv).await;
            s.recorded_here(&record);
            match reply {
                Ok(reply) => s.recorded(&reply),
                Err(e) => s.record_degraded(e),
            }
        })
    }

    /// Never blocks. Outside a multi-thread runtime, the slot of a permit
    /// that is not a probe waits in the store like a silent success (an
    /// ignored outcome: the slot freed, nothing recorded) for the next
    /// admission of its partition, or for its delay; otherwise the release
    /// is spawned inside a tokio runtime, and a blocking call bounded by the
    /// store's timeout outside one. While Redis is down the release is
    /// dropped: the slot comes back when its lease expires, the probe when
    /// the probe lease does.
    fn release(&self, partition: Option<&PartitionKey>, permit: Permit) {
        let s = &self.shared;
        if permit.local {
            if let Some(local) = &s.local {
                local.release(partition, permit);
            }
            return;
        }
        if permit.slot.is_none() && !permit.probe {
            return;
        }
        if !s.link.is_available() {
            return;
        }
        if !permit.probe && !s.carrier.delay.is_zero() && !background_runs() {
            // The time of an ignored outcome is never read.
            let ignored = Record {
                partition,
                permit,
                outcome: Outcome::Ignored,
                duration: Duration::ZERO,
                retry_after: None,
                now: Duration::ZERO,
            };
            s.carrier.push(self.shared.pending(&ignored));
            return;
        }
        let args = ReleaseArgs {
            partition: partition.cloned(),
            permit,
            reserved: None,
        };
        s.release_in_background(args);
    }

    /// The admission of a call that may wait for a rate-limit permit (see
    /// `admit.lua`): one round trip, the permit reserved in the script.
    /// While Redis is down the local answer reserves nothing.
    fn admit_reserving(
        &self,
        request: &AdmitRequest<'_>,
        reserve: Reserve,
    ) -> Result<(Admission, Option<Reservation>), StoreError> {
        let s = &*self.shared;
        if let Some(refused) = s.replayed(request, reserve) {
            return Ok((refused, None));
        }
        let mut carried = s.carried_sync(&self.shared, request.partition);
        let inv = s.admit_reserving_invocation(request, reserve, &carried.records);
        let hold = |r: Restart| s.restart_hold(r, request.now);
        let sent = s.sending(request);
        match s.link.admit_sync::<Vec<i64>>(&inv, &hold) {
            Ok(reply) => {
                carried.answered();
                s.learn(request, sent, &reply);
                s.admission_reserving(&reply, request.now, request.weight, s.pre_shadowed(request))
            }
            Err(e) => {
                drop(carried);
                s.admit_degraded(request, e).map(|a| (a, None))
            }
        }
    }

    fn admit_reserving_async<'a>(
        &'a self,
        request: AdmitRequest<'a>,
        reserve: Reserve,
    ) -> StoreFuture<'a, (Admission, Option<Reservation>)> {
        if let Some(refused) = self.shared.replayed(&request, reserve) {
            return StoreFuture::ready(Ok((refused, None)));
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return StoreFuture::ready(self.admit_reserving(&request, reserve));
        }
        StoreFuture::boxed(async move {
            let s = &*self.shared;
            let mut carried = s.carried(&self.shared, request.partition);
            let inv = s.admit_reserving_invocation(&request, reserve, &carried.records);
            let sent = s.sending(&request);
            match self.shared.admitting(inv, &request).await {
                Ok(reply) => {
                    carried.answered();
                    s.learn(&request, sent, &reply);
                    s.admission_reserving(
                        &reply,
                        request.now,
                        request.weight,
                        s.pre_shadowed(&request),
                    )
                }
                Err(e) => s.admit_degraded(&request, e).map(|a| (a, None)),
            }
        })
    }

    /// In the background, as [`release`](ResourceState::release); while
    /// Redis is down the reservation stays spent until its instant has
    /// passed.
    fn give_back_reservation(&self, partition: Option<&PartitionKey>, reservation: Reservation) {
        let s = &self.shared;
        if !s.link.is_available() {
            return;
        }
        s.release_in_background(ReleaseArgs {
            partition: partition.cloned(),
            permit: Permit::default(),
            reserved: Some(reservation),
        });
    }
    fn circuit_metrics(
        &self,
        partition: Option<&PartitionKey>,
        now: Duration,
    ) -> Result<CircuitMetrics, StoreError> {
        let s = &*self.shared;
        if s.spec.circuit.is_none() {
            return Ok(CircuitMetrics::closed_empty());
        }
        s.carrier.flush_sync();
        let inv = s.invocation(&Scripts::get().metrics, partition, Some(now));
        let reply: Vec<i64> = s.link.invoke_sync(&inv)?;
        let &[state, calls, failures, slow, in_state_us, trips] = &reply[..] else {
            return Err(protocol("metrics", &reply));
        };
        let state = match state {
            scripts::ST_CLOSED => CircuitState::Closed,
            scripts::ST_OPEN => CircuitState::Open,
            scripts::ST_HALF_OPEN => CircuitState::HalfOpen,
            scripts::ST_ISOLATED => CircuitState::Isolated,
            scripts::ST_DISABLED => CircuitState::Disabled,
            _ => return Err(protocol("metrics", &reply)),
        };
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        Ok(CircuitMetrics::from_counts(
            state,
            count(calls),
            count(failures),
            count(slow),
            Duration::from_micros(count(in_state_us)),
            u32::try_from(trips).unwrap_or(0),
        ))
    }

    fn control_circuit(
        &self,
        partition: Option<&PartitionKey>,
        control: CircuitControl,
        now: Duration,
    ) -> Result<Option<CircuitTransition>, StoreError> {
        let s = &*self.shared;
        if s.spec.circuit.is_none() {
            return Ok(None);
        }
        let op = match control {
            CircuitControl::Isolate => scripts::CONTROL_ISOLATE,
            CircuitControl::ForceClose => scripts::CONTROL_DISABLE,
            CircuitControl::Reset => scripts::CONTROL_RESET,
            CircuitControl::OpenFor(_) => scripts::CONTROL_OPEN_FOR,
            CircuitControl::Enable => scripts::CONTROL_ENABLE,
            other => {
                return Err(StoreError::Protocol(format!(
                    "circuit control {other:?} is not supported by this version of seawall-redis"
                )))
            }
        };
        s.carrier.flush_sync();
        let mut inv = s.invocation(&Scripts::get().control, partition, Some(now));
        inv.arg(op);
        if let CircuitControl::OpenFor(d) = control {
            inv.arg(micros(d));
        }
        let reply = s.link.invoke_sync::<Vec<i64>>(&inv);
        // Whatever came of it, the refusal kept for the partition may no
        // longer hold, nor may those of admissions sent before.
        s.refusals.clear(partition);
        let reply = reply?;
        let &[before, after] = &reply[..] else {
            return Err(protocol("control", &reply));
        };
        Ok(if let CircuitControl::OpenFor(cooldown) = control {
            Some(CircuitTransition::Opened { cooldown })
        } else if before == after {
            None
        } else if after == scripts::ST_ISOLATED {
            Some(CircuitTransition::Opened {
                cooldown: Duration::MAX,
            })
        } else {
            Some(CircuitTransition::Closed)
        })
    }

    fn in_flight(
        &self,
        partition: Option<&PartitionKey>,
        now: Duration,
    ) -> Result<u32, StoreError> {
        let s = &*self.shared;
        if s.spec.bulkhead.is_none() {
            return Ok(0);
        }
        // Successes waiting to be carried are finished: their slots are
        // not counted (they stay waiting).
        let mut inv = s.in_flight_invocation(partition, now);
        for slot in s.carrier.slots(&self.shared, partition) {
            inv.arg(slot);
        }
        let n: i64 = s.link.invoke_sync(&inv)?;
        Ok(u32::try_from(n).unwrap_or(0))
    }
}
