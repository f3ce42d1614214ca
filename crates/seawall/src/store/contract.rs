//! The contract every [`StateStore`] must honour, as a reusable test suite.
//!
//! The suite is written once against `&dyn StateStore`, so the in-memory
//! store and a remote one (Redis) run the very same checks. Each check binds
//! resources under names of its own (unique per run), drives them through
//! [`ResourceState`], and panics with a message naming the check and the
//! rule when the store breaks it.
//!
//! Time is driven by a [`ContractClock`]: the in-memory store takes `now`
//! from the caller, so [`ManualClock`] simply moves a counter and every
//! duration is checked exactly; a store on a server's clock ignores `now`,
//! so its driver sleeps for real and reports
//! [`is_exact`](ContractClock::is_exact) `false`, and durations are then
//! checked as bounds. Every wait in the suite is at most 300 ms, and every
//! step a whole number of milliseconds (a store may keep the end of a
//! circuit's cooldown in whole milliseconds, rounded up).
//!
//! ```
//! use seawall::store::contract::{self, ManualClock};
//! use seawall::MemoryStore;
//!
//! contract::run_all(&MemoryStore::new(), &ManualClock::new());
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{
    Admission, AdmitRequest, Outcome, Permit, Record, Recorded, ResourceSpec, ResourceState,
    StateStore,
};
use crate::breaker::{
    CircuitBreaker, CircuitControl, CircuitMetrics, CircuitState, CircuitTransition,
};
use crate::bulkhead::Bulkhead;
use crate::context::PartitionKey;
use crate::cooldown::Cooldown;
use crate::error::{Rejection, RejectionReason};
use crate::rate_limit::RateLimiter;

/// Extra time a non-exact store may report on top of an expected wait
/// (rounding of its own clock).
const SLACK: Duration = Duration::from_millis(5);

/// The time driver of the contract suite.
pub trait ContractClock: Send + Sync {
    /// The time passed to the store as `now`.
    fn now(&self) -> Duration;
    /// Lets `by` pass. A counter moves at once; a driver for a store on
    /// its own clock sleeps (a few milliseconds more than asked is fine,
    /// and absorbs the store's clock granularity).
    fn advance(&self, by: Duration);
    /// `true` when the store's time is exactly [`now`](Self::now): waits and
    /// counts are then checked exactly, otherwise as bounds.
    fn is_exact(&self) -> bool;
}

/// A [`ContractClock`] that is a counter: for stores that take `now` from
/// the caller.
#[derive(Debug, Default)]
pub struct ManualClock {
    nanos: AtomicU64,
}

impl ManualClock {
    /// A clock at an arbitrary starting time (so that no check depends on
    /// starting at zero), a whole number of milliseconds like every step of
    /// the suite: stores may keep circuit deadlines in whole milliseconds.
    pub fn new() -> Self {
        ManualClock {
            nanos: AtomicU64::new(1_234_567_000_000),
        }
    }
}

impl ContractClock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }
    fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(by, Ordering::SeqCst);
    }
    fn is_exact(&self) -> bool {
        true
    }
}

/// Runs every check of the suite.
///
/// # Panics
/// When the store breaks the contract (the message names the check).
pub fn run_all(store: &dyn StateStore, clock: &dyn ContractClock) {
    admission_is_all_or_nothing(store, clock);
    circuit_opens_half_opens_and_closes(store, clock);
    circuit_window_modes_trip_on_their_rates(store, clock);
    half_open_admits_exactly_the_probe_count(store, clock);
    cooldown_extends_and_never_shrinks(store, clock);
    bulkhead_caps_and_releases(store, clock);
    fixed_window_admits_exactly_the_limit(store, clock);
    sliding_window_admits_exactly_the_limit(store, clock);
    gcra_admits_exactly_the_burst(store, clock);
    partitions_are_isolated(store, clock);
    same_name_and_spec_share_state(store, clock);
    manual_control(store, clock);
    half_open_hints_the_open_period_that_ended(store, clock);
    isolated_and_disabled_circuits_keep_their_counts(store, clock);
    a_circuit_counts_its_first_state_from_its_first_use(store, clock);
    a_call_shadowed_already_meets_no_policy_in_shadow_mode(store, clock);
}

/// A bound resource and the clock, with checking helpers.
struct Subject<'a> {
    check: &'static str,
    state: Arc<dyn ResourceState>,
    clock: &'a dyn ContractClock,
}

fn unique_name(check: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nonce = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "seawall-contract/{check}/{}-{nonce}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn bind<'a>(
    check: &'static str,
    store: &dyn StateStore,
    clock: &'a dyn ContractClock,
    spec: ResourceSpec,
) -> Subject<'a> {
    let state = store
        .bind(&spec)
        .unwrap_or_else(|e| panic!("{check}: bind failed: {e}"));
    Subject {
        check,
        state,
        clock,
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

impl Subject<'_> {
    fn admit(&self, key: Option<&PartitionKey>) -> Admission {
        self.admit_shadowed(key, false)
    }

    /// Admits a call [shadowed already](AdmitRequest::shadowed) or not.
    fn admit_shadowed(&self, key: Option<&PartitionKey>, shadowed: bool) -> Admission {
        let admission = self
            .state
            .admit(&AdmitRequest {
                partition: key,
                now: self.clock.now(),
                weight: 1,
                budget: None,
                shadowed,
            })
            .unwrap_or_else(|e| panic!("{}: admit failed: {e}", self.check));
        assert!(
            admission.degraded.is_none(),
            "{}: admission degraded: {:?}",
            self.check,
            admission.degraded
        );
        admission
    }

    /// Admits, expecting a permit.
    fn ok(&self, key: Option<&PartitionKey>, what: &str) -> Permit {
        match self.admit(key).decision {
            Ok(permit) => permit,
            Err(r) => panic!("{}: {what}: expected admission, got {r}", self.check),
        }
    }

    /// Admits, expecting a refusal for `reason`.
    fn refused(
        &self,
        key: Option<&PartitionKey>,
        reason: RejectionReason,
        what: &str,
    ) -> Rejection {
        self.refused_with(key, reason, what).0
    }

    fn refused_with(
        &self,
        key: Option<&PartitionKey>,
        reason: RejectionReason,
        what: &str,
    ) -> (Rejection, Option<CircuitTransition>) {
        let admission = self.admit(key);
        match admission.decision {
            Err(r) if r.reason == reason => (r, admission.transition),
            Err(r) => panic!("{}: {what}: expected {reason}, got {r}", self.check),
            Ok(p) => panic!(
                "{}: {what}: expected {reason}, got admitted {p:?}",
                self.check
            ),
        }
    }

    fn record_full(
        &self,
        key: Option<&PartitionKey>,
        permit: Permit,
        outcome: Outcome,
        duration: Duration,
        retry_after: Option<Duration>,
    ) -> Recorded {
        self.state
            .record(&Record {
                partition: key,
                permit,
                outcome,
                duration,
                retry_after,
                now: self.clock.now(),
            })
            .unwrap_or_else(|e| panic!("{}: record failed: {e}", self.check))
    }

    fn record(&self, key: Option<&PartitionKey>, permit: Permit, outcome: Outcome) -> Recorded {
        self.record_full(key, permit, outcome, Duration::ZERO, None)
    }

    /// Admits and records a failure; returns the transition.
    fn fail(&self, key: Option<&PartitionKey>, what: &str) -> Option<CircuitTransition> {
        let permit = self.ok(key, what);
        self.record(key, permit, Outcome::Failure).transition
    }

    fn succeed(&self, key: Option<&PartitionKey>, what: &str) -> Option<CircuitTransition> {
        let permit = self.ok(key, what);
        self.record(key, permit, Outcome::Success).transition
    }

    fn metrics(&self, key: Option<&PartitionKey>) -> CircuitMetrics {
        self.state
            .circuit_metrics(key, self.clock.now())
            .unwrap_or_else(|e| panic!("{}: circuit_metrics failed: {e}", self.check))
    }

    fn state_of(&self, key: Option<&PartitionKey>) -> CircuitState {
        self.metrics(key).state
    }

    fn in_flight(&self, key: Option<&PartitionKey>) -> u32 {
        self.state
            .in_flight(key, self.clock.now())
            .unwrap_or_else(|e| panic!("{}: in_flight failed: {e}", self.check))
    }

    fn control(
        &self,
        key: Option<&PartitionKey>,
        control: CircuitControl,
    ) -> Option<CircuitTransition> {
        self.state
            .control_circuit(key, control, self.clock.now())
            .unwrap_or_else(|e| panic!("{}: control_circuit failed: {e}", self.check))
    }

    /// Checks a reported wait: exactly `expected` on an exact clock, else in
    /// `(0, expected + SLACK]`.
    fn assert_wait(&self, got: Option<Duration>, expected: Duration, what: &str) {
        if self.clock.is_exact() {
            assert_eq!(got, Some(expected), "{}: {what}", self.check);
        } else {
            assert!(
                got.is_some_and(|d| !d.is_zero() && d <= expected + SLACK),
                "{}: {what}: expected a wait in (0, {expected:?}], got {got:?}",
                self.check
            );
        }
    }

    fn assert_opened(&self, got: Option<CircuitTransition>, cooldown: Duration, what: &str) {
        assert_eq!(
            got,
            Some(CircuitTransition::Opened { cooldown }),
            "{}: {what}",
            self.check
        );
    }
}

/// When a later check refuses, what earlier checks took is given back, and
/// the rate limiter takes a permit only when the call is admitted.
///
/// # Panics
/// When the store breaks the contract.
pub fn admission_is_all_or_nothing(store: &dyn StateStore, clock: &dyn ContractClock) {
    const CHECK: &str = "admission_is_all_or_nothing";

    // Bulkhead slot given back when the cooldown refuses.
    let s = bind(
        CHECK,
        store,
        clock,
        ResourceSpec::new(unique_name(CHECK))
            .with_bulkhead(Bulkhead::new(1))
            .with_cooldown(Cooldown::new().max_pause(ms(250))),
    );
    let p = s.ok(None, "first call");
    assert!(p.slot.is_some(), "{CHECK}: a bulkhead permit holds a slot");
    let recorded = s.record_full(None, p, Outcome::Failure, Duration::ZERO, Some(ms(200)));
    s.assert_wait(recorded.cooldown, ms(200), "cooldown opened by the hint");
    let r = s.refused(None, RejectionReason::CooldownActive, "during the cooldown");
    s.assert_wait(r.retry_after, ms(200), "cooldown retry_after");
    assert_eq!(
        s.in_flight(None),
        0,
        "{CHECK}: slot given back on a cooldown refusal"
    );
    s.refused(None, RejectionReason::CooldownActive, "not bulkhead_full");
    clock.advance(ms(200));
    let p = s.ok(None, "after the cooldown");
    s.record(None, p, Outcome::Success);

    // Rate permits are taken only on admission; slots given back on a rate refusal.
    let s = bind(
        CHECK,
        store,
        clock,
        ResourceSpec::new(unique_name(CHECK))
            .with_bulkhead(Bulkhead::new(1))
            .with_rate_limit(RateLimiter::sliding_window(2, Duration::from_secs(3600))),
    );
    let held = s.ok(None, "first permit");
    s.refused(None, RejectionReason::BulkheadFull, "bulkhead full");
    s.refused(None, RejectionReason::BulkheadFull, "bulkhead still full");
    s.state.release(None, held);
    let p = s.ok(None, "second permit: refusals by the bulkhead took none");
    s.record(None, p, Outcome::Success);
    s.refused(None, RejectionReason::RateLimited, "limit reached");
    assert_eq!(
        s.in_flight(None),
        0,
        "{CHECK}: slot given back on a rate refusal"
    );

    // Half-open probe slot given back when the cooldown refuses.
    let s = bind(
        CHECK,
        store,
        clock,
        ResourceSpec::new(unique_name(CHECK))
            .with_circuit(
                CircuitBreaker::consecutive_failures(1)
                    .cooldown(ms(100))
                    .half_open_calls(1),
            )
            .with_cooldown(Cooldown::new().max_pause(ms(300))),
    );
    let p = s.ok(None, "closed");
    let recorded = s.record_full(None, p, Outcome::Failure, Duration::ZERO, Some(ms(200)));
    s.assert_opened(recorded.transition, ms(100), "one failure opens");
    clock.advance(ms(100));
    let (r, transition) = s.refused_with(
        None,
        RejectionReason::CooldownActive,
        "half-opened, then cooldown",
    );
    assert_eq!(
        transition,
        Some(CircuitTransition::HalfOpened),
        "{CHECK}: the half-open transition is reported even when a later check refuses"
    );
    s.assert_wait(r.retry_after, ms(100), "cooldown left");
    clock.advance(ms(100));
    let probe = s.ok(None, "the probe slot was given back");
    assert!(probe.probe, "{CHECK}: admitted as a probe");
    assert_eq!(
        s.record(None, probe, Outcome::Success).transition,
        Some(CircuitTransition::Closed),
        "{CHECK}: the probe closes the circuit"
    );
}

/// Closed, open with `retry_after`, half-open, open again with a grown
/// cooldown, closed; outcomes of an older generation are not recorded.
///
/// # Panics
/// When the store breaks the contract.
pub fn circuit_opens_half_opens_and_closes(store: &dyn StateStore, clock: &dyn ContractClock) {
    const CHECK: &str = "circuit_opens_half_opens_and_closes";
    let s = bind(
        CHECK,
        store,
        clock,
        ResourceSpec::new(unique_name(CHECK)).with_circuit(
            CircuitBreaker::consecutive_failures(2)
                .cooldown(ms(150))
                .cooldown_growth(2.0, ms(300)),
        ),
    );
    assert_eq!(
        s.state_of(None),
        CircuitState::Closed,
        "{CHECK}: starts closed"
    );
    let stale = s.ok(None, "a call admitted while closed");
    assert_eq!(
        s.fail(None, "first failure"),
        None,
        "{CHECK}: one failure of two"
    );
    assert_eq!(s.succeed(None, "a success"), None);
    assert_eq!(
        s.fail(None, "failure after a success"),
        None,
        "{CHECK}: a success resets the run"
    );
    let opened = s.fail(None, "second failure in a row");
    s.assert_opened(opened, ms(150), "two failures in a row open");
    let m = s.metrics(None);
    assert_eq!(
        (m.state, m.trips),
        (CircuitState::Open, 1),
        "{CHECK}: open after one trip"
    );
    let r = s.refused(None, RejectionReason::CircuitOpen, "open");
    s.assert_wait(r.retry_after, ms(150), "open retry_after");
    assert_eq!(
        s.record(None, stale, Outcome::Success).transition,
        None,
        "{CHECK}: an outcome of the closed generation"
    );
    assert_eq!(
        s.state_of(None),
        CircuitState::Open,
        "{CHECK}: stale outcome ignored"
    );

    clock.advance(ms(150));
    let admission = s.admit(None);
    assert_eq!(
        admission.transition,
        Some(CircuitTransition::HalfOpened),
        "{CHECK}: the first call after the cooldown half-opens"
    );
    let probe = admission
        .decision
        .unwrap_or_else(|r| panic!("{CHECK}: expected a probe, got {r}"));
    assert!(probe.probe, "{CHECK}: a half-open admission is a probe");
    assert_eq!(
        s.state_of(None),
        CircuitState::HalfOpen,
        "{CHECK}: half-open"
    );
    let r = s.refused(None, RejectionReason::CircuitOpen, "probe slots taken");
    assert_eq!(
        r.retry_after,
        Some(ms(150)),
        "{CHECK}: while half-open, the cooldown that just ended is the hint"
    );
    let reopened = s.record(None, probe, Outcome::Failure).transition;
    s.assert_opened(
        reopened,
        ms(300),
        "a failed probe opens again, cooldown grown",
    );
    assert_eq!(s.metrics(None).trips, 2, "{CHECK}: second trip");

    clock.advance(ms(300));
    let probe = s.ok(None, "second half-open");
    assert_eq!(
        s.record(None, probe, Outcome::Success).transition,
        Some(CircuitTransition::Closed),
        "{CHECK}: a successful probe closes"
    );
    let m = s.metrics(None);
    assert_eq!(
        (m.state, m.trips, m.failures),
        (CircuitState::Closed, 0, 0),
        "{CHECK}: closed with no trips and an empty run"
    );
}

/// Count window, time window and slow calls trip on their rates once
/// `minimum_calls` calls are in the window, judged when a failed or slow
/// call is recorded.
///
/// # Panics
/// When the store breaks the contract.
pub fn circuit_window_modes_trip_on_their_rates(store: &dyn StateStore, clock: &dyn ContractClock) {
    const CHECK: &str = "circuit_window_modes_trip_on_their_rates";
    let cooldown = ms(100);

    let s = bind(
        CHECK,
        store,
        clock,
        ResourceSpec::new(unique_name(CHECK)).with_circuit(
            CircuitBreaker::failure_rate(0.5)
                .count_window(4)
                .minimum_calls(4)
                .cooldown(cooldown),
        ),
    );
    assert_eq!(s.fail(None, "count 1"), None);
    assert_eq!(
        s.fail(None, "count 2"),
        None,
        "{CHECK}: below minimum_calls"
    );
    assert_eq!(s.succeed(None, "count 3"), None);
    assert_eq!(
        s.succeed(None, "count 4"),
        None,
        "{CHECK}: a success is not judged"
    );
    let m = s.metrics(None);
    assert_eq!(
        (m.calls, m.failures, m.failure_rate),
        (4, 2, 0.5),
        "{CHECK}: count window metrics"
    );
    // The ring drops the oldest failure: still 2 of 4, judged now.
    s.assert_opened(s.fail(None, "count 5"), cooldown, "failure rate reached");

    let s = bind(
        CHECK,
        store,
        clock,
        ResourceSpec::new(unique_name(CHECK)).with_circuit(
            CircuitBreaker::failure_rate(0.5)
                .window(Duration::from_secs(60))
                .minimum_calls(2)
                .cooldown(cooldown),
        ),
    );
    assert_eq!(s.succeed(None, "time 1"), None);
    s.assert_opened(s.fail(None, "time 2"), cooldown, "time window rate reached");

    let s = bind(
        CHECK,
        store,
        clock,
        ResourceSpec::new(unique_name(CHECK)).with_circuit(
            CircuitBreaker::failure_rate(1.0)
                .count_window(10)
                .minimum_calls(2)
                .slow_calls(0.5, ms(100))
                .cooldown(cooldown),
        ),
    );
    let p = s.ok(None, "slow 1");
    assert_eq!(
        s.record_full(None, p, Outcome::Success, ms(99), None)
            .transition,
        None
    );
    let p = s.ok(None, "slow 2");
    let slow = s
        .record_full(None, p, Outcome::Success, ms(100), None)
        .transition;
    s.assert_opened(slow, cooldown, "slow-call rate reached by a slow success");
    assert_eq!(s.metrics(None).slow_calls, 1, "{CHECK}: one slow call");
    clock.advance(cooldown);
    let probe = s.ok(None, "slow probe");
    let reopened = s
        .record_full(None, probe, Outcome::Success, ms(100), None)
        .transition;
    s.assert_opened(reopened, cooldown, "a slow probe opens again");
}

/// Exactly `half_open_calls` probes are admitted; an ignored probe gives
/// its slot back; the circuit closes when every probe succeeded.
///
/// # Panics
/// When the store breaks the contract.
pub fn half_open_admits_exactly_the_probe_count(store: &dyn StateStore, clock: &dyn ContractClock) {
    const CHECK: &str = "half_open_admits_exactly_the_probe_count";
    let s = bind(
        CHECK,
        store,
        clock,
        ResourceSpec::new(unique_name(CHECK)).with_circuit(
            CircuitBreaker::consecutive_failures(1)
                .cooldown(ms(100))
                .half_open_calls(3),
        ),
    );
    assert!(s.fail(None, "trip").is_some(), "{CHECK}: opens");
    clock.advance(ms(100));
    let mut probes = Vec::new();
    let mut refused = 0;
    for _ in 0..5 {
        match s.admit(None).decision {
            Ok(p) => probes.push(p),
            Err(r) => {
                assert_eq!(
                    (r.reason, r.retry_after),
                    (RejectionReason::CircuitOpen, Some(ms(100))),
                    "{CHECK}: refusal while half-open, the cooldown as the hint"
                );
                refused += 1;
            }
        }
    }
    assert_eq!(
        (probes.len(), refused),
        (3, 2),
        "{CHECK}: exactly 3 probes of 5 calls"
    );
    assert!(
        probes.iter().all(|p| p.probe),
        "{CHECK}: every half-open permit is a probe"
    );
    assert_eq!(s.record(None, probes[0], Outcome::Ignored).transition, None);
    probes[0] = s.ok(None, "an ignored probe frees its slot");
    s.refused(None, RejectionReason::CircuitOpen, "slots taken again");
    for (i, p) in probes.iter().enumerate() {
        let t = s.record(None, *p, Outcome::Success).transition;
        let expected = (i == 2).then_some(CircuitTransition::Closed);
        assert_eq!(t, expected, "{CHECK}: probe {} of 3 succeeded", i + 1);
    }
    assert_eq!(s.state_of(None), CircuitState::Closed, "{CHECK}: closed");
}

/// A retry-after hint (any outcome) opens a cooldown capped at `max_pause`;
/// a shorter hint never shrinks it.
///
/// # Panics
/// When the store breaks the contract.
pub fn cooldown_extends_and_never_shrinks(store: &dyn StateStore, clock: &dyn ContractClock) {
    const CHECK: &str = "cooldown_extends_and_never_shrinks";
    let s = bind(
        CHECK,
        store,
        clock,
        ResourceSpec::new(unique_name(CHECK)).with_cooldown(Cooldown::new().max_pause(ms(250))),
    );
    let permits: Vec<Permit> = (0..3).map(|_| s.ok(None, "before the cooldown")).collect();
    let hinted =
        |p: Permit, outcome, hint| s.record_full(None, p, outcome, Duration::ZERO, Some(hint));
    s.assert_wait(
        hinted(permits[0], Outcome::Success, ms(200)).cooldown,
        ms(200),
        "opened",
    );
    let shorter = hinted(permits[1], Outcome::Failure, ms(50)).cooldown;
    if clock.is_exact() {
        assert_eq!(
            shorter,
            Some(ms(200)),
            "{CHECK}: a shorter hint keeps the end"
        );
    } else {
        assert!(
            shorter.is_some_and(|d| d > ms(50) + SLACK),
            "{CHECK}: shrunk to {shorter:?}"
        );
    }
    let r = s.refused(None, RejectionReason::CooldownActive, "during the cooldown");
    s.assert_wait(r.retry_after, ms(200), "retry_after is the time left");
    let capped = hinted(permits[2], Outcome::Ignored, Duration::from_secs(3600)).cooldown;
    s.assert_wait(capped, ms(250), "a long hint is capped at max_pause");
    clock.advance(ms(200));
    s.refused(
        None,
        RejectionReason::CooldownActive,
        "extended by the long hint",
    );
    clock.advance(ms(50));
    s.ok(None, "after the cooldown");
}

/// At most `max_concurrent` permits hold a slot; `release` and `record`
/// give it back.
///
/// # Panics
/// When the store breaks the contract.
pub fn bulkhead_caps_and_releases(store: &dyn StateStore, clock: &dyn ContractClock) {
    const CHECK: &str = "bulkhead_caps_and_releases";
    let s = bind(
        CHECK,
        store,
        clock,
        ResourceSpec::new(unique_name(CHECK)).with_bulkhead(Bulkhead::new(2)),
    );
    let a = s.ok(None, "slot 1");
    let b = s.ok(None, "slot 2");
    assert!(
        a.slot.is_some() && b.slot.is_some(),
        "{CHECK}: permits hold slots"
    );
    let r = s.refused(None, RejectionReason::BulkheadFull, "full");
    assert_eq!(r.retry_after, None, "{CHECK}: no retry_after when full");
    assert_eq!(s.in_flight(None), 2, "{CHECK}: two in flight");
    s.state.release(None, a);
    assert_eq!(s.in_flight(None), 1, "{CHECK}: release gives the slot back");
    let c = s.ok(None, "slot freed by release");
    s.refused(None, RejectionReason::BulkheadFull, "full again");
    s.record(None, b, Outcome::Success);
    assert_eq!(s.in_flight(None), 1, "{CHECK}: record gives the slot back");
    s.record(None, c, Outcome::Failure);
    assert_eq!(s.in_flight(None), 0, "{CHECK}: all slots back");
    let d = s.ok(None, "empty bulkhead");
    s.record(None, d, Outcome::Ignored);
    assert_eq!(
        s.in_flight(None),
        0,
        "{CHECK}: an ignored outcome gives the slot back"
    );
}

/// Admits until refused (at most `tries` calls); returns the admissions and
/// the refusal.
fn drain(s: &Subject<'_>, tries: u32) -> (u32, Rejection) {
    let mut admitted = 0;
    for _ in 0..tries {
        match s.admit(None).decision {
            Ok(_) => admitted += 1,
            Err(r) => {
                assert_eq!(
                    r.reason,
                    RejectionReason::RateLimited,
                    "{}: refusal reason",
                    s.check
                );
                return (admitted, r);
            }
        }
    }
    panic!("{}: {tries} calls admitted, expected a refusal", s.check);
}

fn assert_count(s: &Subject<'_>, got: u32, expected: u32, what: &str) {
    if s.clock.is_exact() {
        assert_eq!(got, expected, "{}: {what}", s.check);
    } else {
        assert!(
            got >= expected.min(1) && got <= expected * 2,
            "{}: {what}: {got}",
            s.check
        );
    }
}

/// A fixed window admits exactly `limit` calls per window and tells how long
/// until the next window.
///
/// # Panics
/// When the store breaks the contract.
pub fn fixed_window_admits_exactly_the_limit(store: &dyn StateStore, clock: &dyn ContractClock) {
    const CHECK: &str = "fixed_window_admits_exactly_the_limit";
    let hour = Duration::from_secs(3600);
    let s = bind(
        CHECK,
        store,
        clock,
        ResourceSpec::new(unique_name(CHECK)).with_rate_limit(RateLimiter::fixed_window(3, hour)),
    );
    // A window edge falling inside these few calls is all but impossible
    // with an hour-long window, even on a real clock.
    let (admitted, r) = drain(&s, 10);
    assert_eq!(admitted, 3, "{CHECK}: exactly the limit");
    let into_window = Duration::from_nanos((clock.now().as_nanos() % hour.as_nanos()) as u64);
    s.assert_wait(r.retry_after, hour - into_window, "until the next window");

    let period = ms(200);
    let s = bind(
        CHECK,
        store,
        clock,
        ResourceSpec::new(unique_name(CHECK)).with_rate_limit(RateLimiter::fixed_window(2, period)),
    );
    let (admitted, r) = drain(&s, 10);
    assert_count(&s, admitted, 2, "a short window");
    let wait = r
        .retry_after
        .unwrap_or_else(|| panic!("{CHECK}: a rate refusal tells when to retry"));
    assert!(
        !wait.is_zero() && wait <= period + SLACK,
        "{CHECK}: wait {wait:?}"
    );
    clock.advance(wait);
    let (admitted, _) = drain(&s, 10);
    assert_count(&s, admitted, 2, "the next window");
}

/// A sliding window admits exactly `limit` calls in any span of `period`.
///
/// # Panics
/// When the store breaks the contract.
pub fn sliding_window_admits_exactly_the_limit(store: &dyn StateStore, clock: &dyn ContractClock) {
    const CHECK: &str = "sliding_window_admits_exactly_the_limit";
    let s = bind(
        CHECK,
        store,
        clock,
        ResourceSpec::new(unique_name(CHECK))
            .with_rate_limit(RateLimiter::sliding_window(3, ms(300))),
    );
    s.ok(None, "first, at t");
    clock.advance(ms(100));
    let (admitted, r) = drain(&s, 10);
    assert_eq!(admitted, 2, "{CHECK}: two more at t + 100 ms");
    s.assert_wait(r.retry_after, ms(200), "until the first call is 300 ms old");
    clock.advance(ms(200));
    let (admitted, r) = drain(&s, 10);
    if clock.is_exact() {
        assert_eq!(admitted, 1, "{CHECK}: only the first call left the window");
        s.assert_wait(r.retry_after, ms(100), "until the next two leave");
    } else {
        assert!(admitted >= 1, "{CHECK}: the first call left the window");
    }
}

/// GCRA admits exactly `burst` calls at once, then one per emission
/// interval, and tells exactly when the next one conforms.
///
/// # Panics
/// When the store breaks the contract.
pub fn gcra_admits_exactly_the_burst(store: &dyn StateStore, clock: &dyn ContractClock) {
    const CHECK: &str = "gcra_admits_exactly_the_burst";
    let s = bind(
        CHECK,
        store,
        clock,
        // One call per 50 ms, bursts of 2.
        ResourceSpec::new(unique_name(CHECK))
            .with_rate_limit(RateLimiter::gcra(4, ms(200)).burst(2)),
    );
    let (admitted, r) = drain(&s, 10);
    assert_eq!(admitted, 2, "{CHECK}: exactly the burst");
    s.assert_wait(r.retry_after, ms(50), "one emission interval");
    clock.advance(ms(50));
    let (admitted, r) = drain(&s, 10);
    assert_count(&s, admitted, 1, "one more after an interval");
    if clock.is_exact() {
        s.assert_wait(r.retry_after, ms(50), "the next interval");
    }
}

/// Each partition has its own circuit and bulkhead, apart from the others
/// and from the unpartitioned state; keys compare by value.
///
/// # Panics
/// When the store breaks the contract.
pub fn partitions_are_isolated(store: &dyn StateStore, clock: &dyn ContractClock) {
    const CHECK: &str = "partitions_are_isolated";
    let s = bind(
        CHECK,
        store,
        clock,
        ResourceSpec::new(unique_name(CHECK))
            .with_circuit(CircuitBreaker::consecutive_failures(1).cooldown(ms(200)))
            .with_bulkhead(Bulkhead::new(1)),
    );
    let a = PartitionKey::from("tenant-a");
    let b = PartitionKey::from("tenant-b");
    let b_again = PartitionKey::from(String::from("tenant-b"));
    let seven = PartitionKey::from(7u64);
    assert!(
        s.fail(Some(&a), "fail tenant-a").is_some(),
        "{CHECK}: tenant-a opens"
    );
    assert_eq!(
        s.state_of(Some(&a)),
        CircuitState::Open,
        "{CHECK}: tenant-a open"
    );
    assert_eq!(
        s.state_of(Some(&b)),
        CircuitState::Closed,
        "{CHECK}: tenant-b closed"
    );
    assert_eq!(
        s.state_of(None),
        CircuitState::Closed,
        "{CHECK}: root closed"
    );
    s.refused(Some(&a), RejectionReason::CircuitOpen, "tenant-a open");
    let held_b = s.ok(Some(&b), "tenant-b admits");
    let held_root = s.ok(None, "root admits");
    s.refused(
        Some(&b_again),
        RejectionReason::BulkheadFull,
        "tenant-b's slot, by an equal key",
    );
    let held_seven = s.ok(Some(&seven), "key 7 has its own slot");
    assert_eq!(
        (
            s.in_flight(Some(&a)),
            s.in_flight(Some(&b)),
            s.in_flight(None),
            s.in_flight(Some(&seven))
        ),
        (0, 1, 1, 1),
        "{CHECK}: in flight per partition"
    );
    s.record(Some(&b), held_b, Outcome::Failure);
    assert_eq!(
        s.state_of(Some(&b)),
        CircuitState::Open,
        "{CHECK}: tenant-b opens"
    );
    assert_eq!(
        s.state_of(Some(&seven)),
        CircuitState::Closed,
        "{CHECK}: key 7 untouched"
    );
    s.record(None, held_root, Outcome::Success);
    s.state.release(Some(&seven), held_seven);
    assert_eq!(
        s.in_flight(Some(&seven)),
        0,
        "{CHECK}: released in its own partition"
    );
    assert_eq!(
        s.control(Some(&seven), CircuitControl::Isolate),
        Some(CircuitTransition::Opened {
            cooldown: Duration::MAX
        }),
        "{CHECK}: a partition can be isolated"
    );
    assert_eq!(
        s.state_of(None),
        CircuitState::Closed,
        "{CHECK}: root still closed"
    );
}

/// Binding the same name with the same spec twice shares one state.
///
/// # Panics
/// When the store breaks the contract.
pub fn same_name_and_spec_share_state(store: &dyn StateStore, clock: &dyn ContractClock) {
    const CHECK: &str = "same_name_and_spec_share_state";
    let spec = ResourceSpec::new(unique_name(CHECK))
        .with_circuit(CircuitBreaker::consecutive_failures(1).cooldown(ms(200)))
        .with_bulkhead(Bulkhead::new(1));
    let first = bind(CHECK, store, clock, spec.clone());
    let second = bind(CHECK, store, clock, spec);
    let held = first.ok(None, "first handle");
    second.refused(
        None,
        RejectionReason::BulkheadFull,
        "slot held through the first handle",
    );
    second.state.release(None, held);
    assert_eq!(
        first.in_flight(None),
        0,
        "{CHECK}: released through the second handle"
    );
    assert!(second
        .fail(None, "trip through the second handle")
        .is_some());
    assert_eq!(
        first.state_of(None),
        CircuitState::Open,
        "{CHECK}: one circuit"
    );
    first.refused(
        None,
        RejectionReason::CircuitOpen,
        "open through the other handle",
    );
}

/// Isolate, force-close and reset, each reported once.
///
/// # Panics
/// When the store breaks the contract.
pub fn manual_control(store: &dyn StateStore, clock: &dyn ContractClock) {
    const CHECK: &str = "manual_control";
    let s = bind(
        CHECK,
        store,
        clock,
        ResourceSpec::new(unique_name(CHECK))
            .with_circuit(CircuitBreaker::consecutive_failures(1).cooldown(ms(100))),
    );
    assert_eq!(
        s.control(None, CircuitControl::Isolate),
        Some(CircuitTransition::Opened {
            cooldown: Duration::MAX
        }),
        "{CHECK}: isolate"
    );
    assert_eq!(
        s.control(None, CircuitControl::Isolate),
        None,
        "{CHECK}: isolated already"
    );
    assert_eq!(
        s.state_of(None),
        CircuitState::Isolated,
        "{CHECK}: isolated"
    );
    let r = s.refused(None, RejectionReason::CircuitOpen, "isolated");
    assert_eq!(r.retry_after, None, "{CHECK}: no retry_after when isolated");
    clock.advance(ms(200));
    s.refused(
        None,
        RejectionReason::CircuitOpen,
        "isolation has no cooldown",
    );

    assert_eq!(
        s.control(None, CircuitControl::ForceClose),
        Some(CircuitTransition::Closed),
        "{CHECK}: force close"
    );
    assert_eq!(
        s.control(None, CircuitControl::ForceClose),
        None,
        "{CHECK}: disabled already"
    );
    assert_eq!(
        s.fail(None, "disabled"),
        None,
        "{CHECK}: a disabled circuit records nothing"
    );
    assert_eq!(s.fail(None, "disabled"), None, "{CHECK}: still nothing");
    assert_eq!(
        s.state_of(None),
        CircuitState::Disabled,
        "{CHECK}: disabled"
    );

    assert_eq!(
        s.control(None, CircuitControl::Reset),
        Some(CircuitTransition::Closed),
        "{CHECK}: reset"
    );
    assert_eq!(
        s.control(None, CircuitControl::Reset),
        None,
        "{CHECK}: closed already"
    );
    let m = s.metrics(None);
    assert_eq!(
        (m.state, m.trips, m.calls),
        (CircuitState::Closed, 0, 0),
        "{CHECK}: reset state"
    );
    assert!(
        s.fail(None, "closed again").is_some(),
        "{CHECK}: judges again after a reset"
    );
}

/// A half-open circuit with every probe slot taken refuses with the length
/// of the open period that just ended: the duration of an explicit open
/// (`open_for`), else the cooldown of the trips.
///
/// # Panics
/// When the store breaks the contract.
pub fn half_open_hints_the_open_period_that_ended(
    store: &dyn StateStore,
    clock: &dyn ContractClock,
) {
    const CHECK: &str = "half_open_hints_the_open_period_that_ended";
    let s = bind(
        CHECK,
        store,
        clock,
        ResourceSpec::new(unique_name(CHECK))
            .with_circuit(CircuitBreaker::consecutive_failures(1).cooldown(ms(100))),
    );
    let p = PartitionKey::from("p");
    for key in [None, Some(&p)] {
        s.assert_opened(
            s.control(key, CircuitControl::OpenFor(ms(150))),
            ms(150),
            "open for 150 ms",
        );
        clock.advance(ms(150));
        let probe = s.ok(key, "the probe after the explicit open");
        assert!(probe.probe, "{CHECK}: a probe");
        let r = s.refused(key, RejectionReason::CircuitOpen, "every probe slot taken");
        assert_eq!(
            r.retry_after,
            Some(ms(150)),
            "{CHECK}: the duration the circuit was opened for"
        );
        // The probe fails: a trip, for the cooldown.
        s.assert_opened(
            s.record(key, probe, Outcome::Failure).transition,
            ms(100),
            "the probe fails",
        );
        clock.advance(ms(100));
        let probe = s.ok(key, "the probe after the cooldown");
        let r = s.refused(key, RejectionReason::CircuitOpen, "every probe slot taken");
        assert_eq!(
            r.retry_after,
            Some(ms(100)),
            "{CHECK}: the cooldown of the trip"
        );
        s.record(key, probe, Outcome::Success);
        assert_eq!(s.state_of(key), CircuitState::Closed, "{CHECK}: closed");
    }
}

/// Isolated and disabled circuits keep showing the counts they had:
/// consecutive mode, the failures in a row of the closed circuit; a
/// window mode, its window.
///
/// # Panics
/// When the store breaks the contract.
pub fn isolated_and_disabled_circuits_keep_their_counts(
    store: &dyn StateStore,
    clock: &dyn ContractClock,
) {
    const CHECK: &str = "isolated_and_disabled_circuits_keep_their_counts";
    fn shown(s: &Subject<'_>, key: Option<&PartitionKey>) -> (CircuitState, u64, u64) {
        let m = s.metrics(key);
        (m.state, m.calls, m.failures)
    }
    for breaker in [
        CircuitBreaker::consecutive_failures(5).cooldown(ms(100)),
        CircuitBreaker::failure_rate(1.0)
            .count_window(10)
            .minimum_calls(10)
            .cooldown(ms(100)),
    ] {
        let s = bind(
            CHECK,
            store,
            clock,
            ResourceSpec::new(unique_name(CHECK)).with_circuit(breaker),
        );
        let p = PartitionKey::from("p");
        for key in [None, Some(&p)] {
            s.fail(key, "first failure");
            s.fail(key, "second failure");
            assert_eq!(shown(&s, key), (CircuitState::Closed, 2, 2), "{CHECK}");
            s.control(key, CircuitControl::ForceClose);
            assert_eq!(
                shown(&s, key),
                (CircuitState::Disabled, 2, 2),
                "{CHECK}: disabled"
            );
            assert_eq!(s.fail(key, "disabled"), None, "{CHECK}: nothing recorded");
            assert_eq!(
                shown(&s, key),
                (CircuitState::Disabled, 2, 2),
                "{CHECK}: still"
            );
            s.control(key, CircuitControl::Isolate);
            assert_eq!(
                shown(&s, key),
                (CircuitState::Isolated, 2, 2),
                "{CHECK}: isolated"
            );
            s.control(key, CircuitControl::Reset);
            assert_eq!(
                shown(&s, key),
                (CircuitState::Closed, 0, 0),
                "{CHECK}: reset"
            );
        }
    }
}

/// A circuit that never moved has been in its first state since its first
/// admission, record or control (not since the clock's origin); before
/// that, for no time.
///
/// # Panics
/// When the store breaks the contract.
pub fn a_circuit_counts_its_first_state_from_its_first_use(
    store: &dyn StateStore,
    clock: &dyn ContractClock,
) {
    const CHECK: &str = "a_circuit_counts_its_first_state_from_its_first_use";
    let s = bind(
        CHECK,
        store,
        clock,
        ResourceSpec::new(unique_name(CHECK))
            .with_circuit(CircuitBreaker::consecutive_failures(3).cooldown(ms(100))),
    );
    let in_state = |key, expected: Duration, what: &str| {
        let got = s.metrics(key).time_in_state;
        if clock.is_exact() || expected.is_zero() {
            assert_eq!(got, expected, "{CHECK}: {what}");
        } else {
            assert!(
                got >= expected && got <= expected + ms(50),
                "{CHECK}: {what}: expected about {expected:?}, got {got:?}"
            );
        }
    };
    let p = PartitionKey::from("p");
    for key in [None, Some(&p)] {
        in_state(key, Duration::ZERO, "not used yet");
        clock.advance(ms(20));
        in_state(key, Duration::ZERO, "still not used");
        s.succeed(key, "first use");
        clock.advance(ms(30));
        s.fail(key, "a failure moves nothing");
        in_state(key, ms(30), "since the first use");
    }
    let controlled = PartitionKey::from("controlled");
    let key = Some(&controlled);
    clock.advance(ms(10));
    assert_eq!(
        s.control(key, CircuitControl::Enable),
        None,
        "{CHECK}: not disabled"
    );
    clock.advance(ms(40));
    in_state(key, ms(40), "since the first control");
}

/// A call [shadowed already](AdmitRequest::shadowed) meets no policy in
/// shadow mode (see [`crate::shadow`]): they are not asked, take nothing
/// (no bulkhead slot) and record nothing of it (no circuit outcome); the
/// enforcing ones are asked (a full rate limiter refuses it) and take their
/// permits. Its permit is shadowed, and the admission reports no shadow
/// refusal of its own.
///
/// # Panics
/// When the store breaks the contract.
pub fn a_call_shadowed_already_meets_no_policy_in_shadow_mode(
    store: &dyn StateStore,
    clock: &dyn ContractClock,
) {
    const CHECK: &str = "a_call_shadowed_already_meets_no_policy_in_shadow_mode";
    let s = bind(
        CHECK,
        store,
        clock,
        ResourceSpec::new(unique_name(CHECK))
            .with_circuit(CircuitBreaker::consecutive_failures(1).shadow(true))
            .with_bulkhead(Bulkhead::new(1).shadow(true))
            .with_rate_limit(RateLimiter::fixed_window(2, Duration::from_secs(3600))),
    );
    for key in [None, Some(&PartitionKey::from("shadowed"))] {
        let admission = s.admit_shadowed(key, true);
        assert_eq!(
            admission.shadow, None,
            "{CHECK}: no shadow refusal of its own"
        );
        let permit = match admission.decision {
            Ok(p) => p,
            Err(r) => panic!("{CHECK}: expected admission, got {r}"),
        };
        assert!(permit.shadowed, "{CHECK}: the permit is shadowed");
        assert_eq!(
            permit.slot, None,
            "{CHECK}: the shadow bulkhead is not asked"
        );
        assert_eq!(s.in_flight(key), 0, "{CHECK}: no slot taken");
        // The shadow circuit records nothing of it.
        s.record(key, permit, Outcome::Failure);
        assert_eq!(
            s.metrics(key).state,
            CircuitState::Closed,
            "{CHECK}: a shadow circuit takes no outcome of a shadowed call"
        );
        // An ordinary call is asked by every policy: the slot is free.
        let plain = s.ok(key, "an ordinary call");
        assert!(
            !plain.shadowed && plain.slot.is_some(),
            "{CHECK}: {plain:?}"
        );
        // The enforcing limiter was asked by both: the next is refused,
        // shadowed already or not.
        match s.admit_shadowed(key, true).decision {
            Err(r) => assert_eq!(r.reason, RejectionReason::RateLimited, "{CHECK}"),
            Ok(p) => panic!("{CHECK}: the enforcing limiter admitted {p:?}"),
        }
        s.state.release(key, plain);
        assert_eq!(s.in_flight(key), 0, "{CHECK}: all slots back");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    #[test]
    fn memory_store_honours_the_contract() {
        run_all(&MemoryStore::new(), &ManualClock::new());
    }

    #[test]
    fn checks_share_one_store_without_interfering() {
        let store = MemoryStore::new();
        let clock = ManualClock::new();
        run_all(&store, &clock);
        run_all(&store, &clock);
    }
}
