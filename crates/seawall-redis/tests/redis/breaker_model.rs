//! The circuit breaker of `RedisStore` against the reference model
//! (`seawall::model::breaker`), on the caller's clock so that every wait
//! and every time in state compares exactly.
//!
//! The same random sequences as the in-memory store's model test, in whole
//! milliseconds (the scripts keep time in microseconds). Records carry a
//! retry-after hint half of the time: the resource has no cooldown, so the
//! hint changes nothing, but it sends the record through the full record
//! script instead of the lean success script, and both must agree with the
//! model. Each sequence runs on the blocking path and on the async path
//! (where a silent success is queued without waiting for its answer).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use seawall::breaker::{
    CircuitBreaker, CircuitControl, CircuitMetrics, CircuitState, CircuitTransition,
};
use seawall::model::breaker::{check, strategy, Op, OPEN_FOREVER_MS};
use seawall::store::{
    Admission, AdmitRequest, Outcome, Permit, Record, Recorded, ResourceSpec, ResourceState,
};
use seawall::{PartitionKey, StateStore, StoreError};
use seawall_redis::RedisStore;

use crate::support::{unique, RedisServer};

/// One server for every case of this file.
fn server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

fn bound(breaker: &CircuitBreaker) -> Arc<dyn ResourceState> {
    let store = RedisStore::builder(server().url())
        .prefix(unique("model"))
        .caller_clock()
        // Probes never expire during a case (the in-memory store has no
        // probe lease).
        .probe_lease(Duration::from_secs(10_000_000))
        // Every case makes a runtime and an async connection of its own,
        // beside the other tests' servers: a generous timeout.
        .timeout(Duration::from_secs(2))
        .fail_closed()
        .build()
        .unwrap();
    store
        .bind(&ResourceSpec::new("model").with_circuit(breaker.clone()))
        .unwrap()
}

/// The async path of a bound resource (`admit_async`, `record_async` on a
/// multi-thread runtime, where a silent success is queued and not waited
/// for), seen through the blocking interface the model driver uses.
struct AsyncPath {
    inner: Arc<dyn ResourceState>,
    rt: tokio::runtime::Runtime,
}

impl std::fmt::Debug for AsyncPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncPath").finish_non_exhaustive()
    }
}

impl ResourceState for AsyncPath {
    fn admit(&self, request: &AdmitRequest<'_>) -> Result<Admission, StoreError> {
        // Made inside the runtime: made outside one, the futures answer on
        // the blocking path.
        self.rt
            .block_on(async { self.inner.admit_async(*request).await })
    }
    fn record(&self, record: &Record<'_>) -> Result<Recorded, StoreError> {
        self.rt
            .block_on(async { self.inner.record_async(*record).await })
    }
    fn release(&self, partition: Option<&PartitionKey>, permit: Permit) {
        self.inner.release(partition, permit);
    }
    fn circuit_metrics(
        &self,
        partition: Option<&PartitionKey>,
        now: Duration,
    ) -> Result<CircuitMetrics, StoreError> {
        self.inner.circuit_metrics(partition, now)
    }
    fn control_circuit(
        &self,
        partition: Option<&PartitionKey>,
        control: CircuitControl,
        now: Duration,
    ) -> Result<Option<CircuitTransition>, StoreError> {
        self.inner.control_circuit(partition, control, now)
    }
    fn in_flight(
        &self,
        partition: Option<&PartitionKey>,
        now: Duration,
    ) -> Result<u32, StoreError> {
        self.inner.in_flight(partition, now)
    }
}

fn agree(breaker: CircuitBreaker, partitioned: bool, start: Duration, ops: &[Op]) {
    let sync = bound(&breaker);
    let key = PartitionKey::from("tenant");
    let key = partitioned.then_some(&key);
    if let Err(e) = check(&*sync, key, breaker.clone(), start, ops) {
        panic!("blocking path: {e}");
    }
    let path = AsyncPath {
        inner: bound(&breaker),
        rt: crate::support::rt(),
    };
    if let Err(e) = check(&path, key, breaker, start, ops) {
        panic!("async path: {e}");
    }
}

/// Whole milliseconds: 0, the first 10 s, 10^6 s, and the neighbourhood of
/// the latest cooldown end kept in milliseconds (2^42 ms).
fn start_time() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(0u64),
        0u64..10_000,
        Just(1_000_000_000),
        (OPEN_FOREVER_MS - 20_000)..OPEN_FOREVER_MS,
    ]
    .prop_map(Duration::from_millis)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn redis_consecutive_mode_agrees_with_the_model(
        breaker in strategy::consecutive(),
        partitioned in any::<bool>(),
        start in start_time(),
        ops in strategy::ops(true, 120),
    ) {
        agree(breaker, partitioned, start, &ops);
    }

    #[test]
    fn redis_count_window_agrees_with_the_model(
        breaker in strategy::count_window(),
        partitioned in any::<bool>(),
        start in start_time(),
        ops in strategy::ops(true, 120),
    ) {
        agree(breaker, partitioned, start, &ops);
    }

    #[test]
    fn redis_time_window_agrees_with_the_model(
        breaker in strategy::time_window(),
        partitioned in any::<bool>(),
        start in start_time(),
        ops in strategy::ops(true, 120),
    ) {
        agree(breaker, partitioned, start, &ops);
    }
}

fn admit(
    state: &dyn ResourceState,
    now: Duration,
) -> Result<seawall::store::Permit, Option<Duration>> {
    state
        .admit(&AdmitRequest {
            partition: None,
            now,
            weight: 1,
            budget: None,
            shadowed: false,
        })
        .unwrap()
        .decision
        .map_err(|r| r.retry_after)
}

fn record(state: &dyn ResourceState, now: Duration, outcome: Outcome) -> Option<CircuitTransition> {
    let permit = admit(state, now).expect("admitted");
    state
        .record(&Record {
            partition: None,
            permit,
            outcome,
            duration: Duration::ZERO,
            retry_after: None,
            now,
        })
        .unwrap()
        .transition
}

/// As the in-memory store: a trip late in the caller's clock (beyond what
/// the scripts hold exactly, up to `u64::MAX` ns) stays open until the
/// latest instant, never half-opens early, never fails.
#[test]
fn redis_cooldown_end_saturates_on_the_safe_side() {
    let cooldown = Duration::from_secs(30);
    for trip_at in [
        Duration::from_nanos(u64::MAX - 1_000_000),
        Duration::from_nanos(u64::MAX) - cooldown,
        Duration::from_nanos(u64::MAX) - cooldown - Duration::from_secs(1),
        Duration::from_millis(OPEN_FOREVER_MS) - Duration::from_secs(10),
        Duration::from_millis(OPEN_FOREVER_MS),
    ] {
        let state = bound(&CircuitBreaker::consecutive_failures(1).cooldown(cooldown));
        assert!(record(&*state, trip_at, Outcome::Failure).is_some());
        for after in [0, 1, 29_000] {
            let now = (trip_at + Duration::from_millis(after))
                .min(Duration::from_nanos(u64::MAX - 1_000));
            match admit(&*state, now) {
                Err(Some(left)) => assert!(
                    !left.is_zero()
                        && (now + left).min(Duration::from_nanos(u64::MAX))
                            >= (trip_at + cooldown).min(Duration::from_nanos(u64::MAX)),
                    "trip at {trip_at:?}, {after} ms later: {left:?} left is short"
                ),
                other => panic!("trip at {trip_at:?}, {after} ms later: {other:?}, expected open"),
            }
        }
    }
}

/// A refusal while half-open carries the cooldown as its hint, and the
/// half-open metrics count the probes, not the window that opened.
#[test]
fn redis_half_open_hints_the_cooldown_and_counts_the_probes() {
    let state = bound(
        &CircuitBreaker::failure_rate(0.5)
            .count_window(4)
            .minimum_calls(2)
            .cooldown(Duration::from_secs(1))
            .half_open_calls(2),
    );
    let t0 = Duration::from_secs(1_000_000);
    record(&*state, t0, Outcome::Success);
    assert!(record(&*state, t0, Outcome::Failure).is_some());
    let m = state.circuit_metrics(None, t0).unwrap();
    assert_eq!((m.state, m.calls, m.failures), (CircuitState::Open, 2, 1));
    let t1 = t0 + Duration::from_secs(1);
    assert_eq!(record(&*state, t1, Outcome::Success), None);
    let m = state.circuit_metrics(None, t1).unwrap();
    assert_eq!(
        (m.state, m.calls, m.failures),
        (CircuitState::HalfOpen, 1, 0)
    );
    admit(&*state, t1).expect("second probe");
    assert_eq!(admit(&*state, t1), Err(Some(Duration::from_secs(1))));
}
