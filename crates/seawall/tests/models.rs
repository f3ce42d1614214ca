//! `MemoryStore` against the reference models of the circuit breaker, the
//! bulkhead, the cooldown and the rate limiters (`seawall::model`),
//! composed in admission order.
//!
//! Random sequences of admit / record (success, failure, ignored, with or
//! without a retry-after hint, with durations) / release / clock advance
//! (small steps, big jumps, waits as told by a refusal) / eviction of idle
//! partitions (not with a circuit breaker, see `applicable`) run on the model
//! and on the store, through the blocking and the async methods; every
//! decision (admitted, or refused with which reason and `retry_after`),
//! every record's answer and the slots in flight must be the same, on the
//! unpartitioned state and on partitions, on clocks starting at 0, at
//! 10^6 s and near the end of the clock's range. Any of the policies may
//! run in shadow mode (`seawall::shadow`): admissions then also agree on
//! whether a call is shadowed and over which refusal.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use seawall::model::resource::strategy::{self, partition};
use seawall::model::resource::{Differential, Step, StoreCalls};
use seawall::model::{Resource, END};
use seawall::rate_limit::RateAlgorithm;
use seawall::store::{Admission, AdmitRequest, Outcome, Record, Recorded, ResourceSpec};
use seawall::store::{ResourceState, StateStore};
use seawall::testing::VirtualClock;
use seawall::{
    Bulkhead, CircuitBreaker, Cooldown, MemoryStore, PartitionKey, RateLimiter, StoreError,
};

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

/// Calls through `admit_async` / `record_async`, driven on a runtime.
#[derive(Debug)]
struct AsyncCalls(tokio::runtime::Runtime);

impl AsyncCalls {
    fn new() -> Self {
        AsyncCalls(
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
        )
    }
}

impl StoreCalls for AsyncCalls {
    fn admit(
        &self,
        state: &dyn ResourceState,
        request: AdmitRequest<'_>,
    ) -> Result<Admission, StoreError> {
        self.0.block_on(state.admit_async(request))
    }

    fn record(
        &self,
        state: &dyn ResourceState,
        record: Record<'_>,
    ) -> Result<Recorded, StoreError> {
        self.0.block_on(state.record_async(record))
    }
}

/// The circuit model composed into `Resource`: the breaker's model.
type Circuit = seawall::model::breaker::Model;

/// The circuit breaker of a spec, half of the time: a breaker of any mode
/// (consecutive failures, count window, time window; failure and slow-call
/// rates, minimum calls, growing cooldowns, one to three probes).
fn circuit() -> impl Strategy<Value = Option<CircuitBreaker>> {
    proptest::option::weighted(0.5, seawall::model::breaker::strategy::any_breaker())
}

fn bulkhead() -> impl Strategy<Value = Bulkhead> {
    (1u32..4, prop_oneof![Just(S), Just(5 * S), Just(60 * S)])
        .prop_map(|(max, lease)| Bulkhead::new(max).lease(lease))
}

/// Cooldowns capped at microseconds to minutes, or (`unbounded`) not
/// capped at all: a hint of `Duration::MAX` then pauses to the end of the
/// clock's range.
fn cooldown(unbounded: bool) -> impl Strategy<Value = Cooldown> {
    let longest = if unbounded { Duration::MAX } else { 100 * S };
    prop_oneof![
        (1u64..5_000).prop_map(Duration::from_micros),
        (1u64..100).prop_map(Duration::from_secs),
        Just(longest),
    ]
    .prop_map(|max_pause| Cooldown::new().max_pause(max_pause))
}

/// Limits with an emission interval of whole microseconds (the resolution
/// a shared store keeps), from one microsecond to seconds; for GCRA, which
/// keeps its times to the nanosecond, a period that is often no multiple
/// of the limit (an interval a fraction of a nanosecond more, rounded up).
fn rate_limiter(algorithms: u8) -> impl Strategy<Value = RateLimiter> {
    (
        0..algorithms,
        1u32..5,
        prop_oneof![
            1u64..10,
            100u64..5_000,
            (1u64..10).prop_map(|n| n * 1_000_000)
        ],
        1u32..4,
    )
        .prop_map(|(algorithm, limit, interval_us, burst)| {
            let period = Duration::from_micros(interval_us) * limit;
            let fraction = Duration::from_nanos(interval_us % u64::from(limit));
            match algorithm {
                0 => RateLimiter::gcra(limit, period + fraction).burst(burst),
                1 => RateLimiter::fixed_window(limit, period),
                _ => RateLimiter::sliding_window(limit, period),
            }
        })
}

/// Specs of every combination of bulkhead, cooldown and rate limiter
/// (GCRA, fixed window, and sliding window unless `sliding` is false).
///
/// The unpartitioned sliding window of the memory store disagrees with
/// the model once an admission is less than a period before the end of the
/// clock's range (see `sliding_window_retry_after_is_capped_at_the_end_of_the_range`):
/// runs that may reach the end (`unbounded` cooldowns, or a start near it)
/// leave it out.
fn spec_with(sliding: bool, unbounded: bool) -> impl Strategy<Value = ResourceSpec> {
    (
        circuit(),
        proptest::option::weighted(0.7, bulkhead()),
        proptest::option::weighted(0.6, cooldown(unbounded)),
        proptest::option::weighted(0.7, rate_limiter(if sliding { 3 } else { 2 })),
        prop_oneof![Just(Duration::ZERO), Just(MS), Just(S), Just(600 * S)],
        shadow_modes(),
    )
        .prop_map(|(circuit, bulkhead, cooldown, rate, idle, shadow)| {
            let mut spec = ResourceSpec::new("models").with_partition_idle(idle);
            spec.circuit = circuit.map(|c| c.shadow(shadow[0]));
            spec.bulkhead = bulkhead.map(|b| b.shadow(shadow[1]));
            spec.cooldown = cooldown.map(|c| c.shadow(shadow[2]));
            spec.rate_limit = rate.map(|r| r.shadow(shadow[3]));
            spec
        })
}

/// Which of circuit, bulkhead, cooldown and rate limiter run in shadow
/// mode: none half of the time, else each one time in three.
fn shadow_modes() -> impl Strategy<Value = [bool; 4]> {
    prop_oneof![
        Just([false; 4]),
        prop::array::uniform4(prop::bool::weighted(0.35)),
    ]
}

fn spec() -> impl Strategy<Value = ResourceSpec> {
    spec_with(true, false)
}

/// The steps of a run (see `seawall::model::resource::strategy`).
fn steps() -> impl Strategy<Value = Vec<Step>> {
    strategy::steps(150, 1000)
}

/// The last whole microsecond 3000 s before the end of the clock's range.
fn near_the_end() -> Duration {
    let end = END - 3_000 * S;
    Duration::from_micros(end.as_micros() as u64)
}

/// `steps` as they apply to `spec`: with a circuit breaker, no eviction of
/// idle partitions (the memory store may then drop a closed circuit's
/// partial window, as it documents; the model never forgets).
fn applicable(spec: &ResourceSpec, steps: &[Step]) -> Vec<Step> {
    steps
        .iter()
        .filter(|s| spec.circuit.is_none() || **s != Step::EvictIdle)
        .cloned()
        .collect()
}

/// Runs `steps` on a fresh memory store and the model of `spec`, from
/// `start`, through the blocking or the async methods.
fn check(spec: &ResourceSpec, start: Duration, steps: &[Step], async_calls: bool) {
    let steps = &applicable(spec, steps)[..];
    let store = MemoryStore::new();
    let state: Arc<dyn ResourceState> = store.bind(spec).unwrap();
    let clock = VirtualClock::new();
    clock.advance(start);
    let model: Resource<Circuit> = Resource::new(spec);
    let calls = AsyncCalls::new();
    let mut run = Differential::new(model, &*state, clock);
    if async_calls {
        run = run.with_calls(&calls);
    }
    if let Err(mismatch) = run.run(steps) {
        panic!("{mismatch}\nspec: {spec:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn memory_store_agrees_with_the_models_from_zero(
        spec in spec(), steps in steps(), async_calls in any::<bool>(),
    ) {
        check(&spec, Duration::ZERO, &steps, async_calls);
    }

    #[test]
    fn memory_store_agrees_with_the_models_from_a_million_seconds(
        spec in spec(), steps in steps(), async_calls in any::<bool>(),
    ) {
        check(&spec, 1_000_000 * S, &steps, async_calls);
    }

    #[test]
    fn memory_store_agrees_with_the_models_near_the_end_of_the_clock(
        spec in spec_with(false, true), steps in steps(), async_calls in any::<bool>(),
    ) {
        check(&spec, near_the_end(), &steps, async_calls);
    }
}

/// Specs and steps off the microsecond grid: periods, clock steps and
/// hints with nanoseconds added (the emission interval `period / limit`
/// then truncates to the nanosecond, as documented). The unpartitioned
/// sliding window keeps its log in whole microseconds, rounded up (its
/// documented resolution): with one, the unpartitioned calls go to a
/// partition instead.
fn to_the_nanosecond() -> impl Strategy<Value = (ResourceSpec, Vec<Step>)> {
    (
        spec(),
        0u64..1_000,
        steps(),
        proptest::collection::vec(0u64..1_000, 150),
    )
        .prop_map(|(mut spec, extra, steps, jitter)| {
            let ns = Duration::from_nanos;
            let sliding = spec
                .rate_limit
                .as_ref()
                .is_some_and(|r| r.algorithm == RateAlgorithm::SlidingWindow);
            if let Some(rate) = &mut spec.rate_limit {
                rate.period += ns(extra);
            }
            let steps = steps
                .into_iter()
                .zip(jitter)
                .map(|(step, j)| match step {
                    Step::Advance(by) => Step::Advance(by.saturating_add(ns(j))),
                    Step::Record {
                        permit,
                        outcome,
                        duration,
                        retry_after,
                    } => Step::Record {
                        permit,
                        outcome,
                        duration,
                        retry_after: retry_after.map(|h| h.saturating_add(ns(j))),
                    },
                    Step::Admit { partition: None } if sliding => Step::Admit {
                        partition: Some(PartitionKey::from(9u64)),
                    },
                    Step::AdmitShadowed { partition: None } if sliding => Step::AdmitShadowed {
                        partition: Some(PartitionKey::from(9u64)),
                    },
                    other => other,
                })
                .collect();
            (spec, steps)
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn memory_store_agrees_with_the_models_to_the_nanosecond(
        (spec, steps) in to_the_nanosecond(), async_calls in any::<bool>(),
    ) {
        check(&spec, 1_000_000 * S + Duration::from_nanos(1), &steps, async_calls);
    }
}

/// The memory store keeps a slot until it is given back, whatever the
/// lease says (a lease is for slots of processes that may die).
#[test]
fn memory_slots_are_held_past_their_lease() {
    let spec = ResourceSpec::new("no-lease").with_bulkhead(Bulkhead::new(1).lease(S));
    for partition in [None, Some(PartitionKey::from(7u64))] {
        let state = MemoryStore::new().bind(&spec).unwrap();
        let model: Resource<Circuit> = Resource::new(&spec);
        let mut run = Differential::new(model, &*state, VirtualClock::new());
        let admit = Step::Admit {
            partition: partition.clone(),
        };
        run.run(&[
            admit.clone(),
            Step::Advance(10 * S),
            admit.clone(),
            Step::Release { permit: 0 },
            admit,
        ])
        .unwrap();
        assert_eq!(run.held(), 1);
        assert_eq!(state.in_flight(partition.as_ref(), 10 * S).unwrap(), 1);
    }
}

/// Each policy up to and at the last instant of the range: nothing
/// panics, deadlines past the range end at its last instant, and the store
/// still agrees with the model.
#[test]
fn the_last_instant_of_the_range_is_an_instant_like_any_other() {
    let base = ResourceSpec::new("end");
    let specs = [
        base.clone().with_bulkhead(Bulkhead::new(2)),
        base.clone()
            .with_cooldown(Cooldown::new().max_pause(Duration::MAX)),
        base.clone().with_rate_limit(RateLimiter::gcra(2, S)),
        base.clone()
            .with_rate_limit(RateLimiter::fixed_window(2, S)),
        base.with_rate_limit(RateLimiter::sliding_window(2, S)),
    ];
    for spec in specs {
        let partitions = match spec.rate_limit.as_ref().map(|r| r.algorithm) {
            // The unpartitioned sliding window: see the next test.
            Some(RateAlgorithm::SlidingWindow) => vec![Some(PartitionKey::from("k"))],
            _ => vec![None, Some(PartitionKey::from("k"))],
        };
        for partition in partitions {
            let clock = VirtualClock::new();
            clock.advance(END - 2 * S);
            let state = MemoryStore::new().bind(&spec).unwrap();
            let model: Resource<Circuit> = Resource::new(&spec);
            let mut run = Differential::new(model, &*state, clock);
            let admit = Step::Admit {
                partition: partition.clone(),
            };
            let record = Step::Record {
                permit: 0,
                outcome: Outcome::Failure,
                duration: Duration::MAX,
                retry_after: Some(Duration::MAX),
            };
            let mut steps = vec![admit.clone(), record.clone(), admit.clone(), admit.clone()];
            steps.push(Step::Advance(S + S / 2));
            steps.extend([admit.clone(), admit.clone(), Step::Release { permit: 0 }]);
            steps.push(Step::Advance(Duration::MAX));
            steps.extend([admit.clone(), record, admit.clone(), Step::EvictIdle, admit]);
            if let Err(mismatch) = run.run(&steps) {
                panic!("{mismatch}\nspec: {spec:?}");
            }
        }
    }
}

/// A sliding-window refusal whose oldest admission stops counting after
/// the end of the range: the partition's log (a deque) tells the caller to
/// retry at the last instant, the unpartitioned log (the lock-free ring)
/// tells it to retry a full period later, past the end of the range.
#[test]
#[ignore = "MemoryStore: the lock-free sliding-window ring does not cap retry_after at the end of the clock range (rate_limit/machine.rs, Ring::acquire)"]
fn sliding_window_retry_after_is_capped_at_the_end_of_the_range() {
    let spec = ResourceSpec::new("ring-end").with_rate_limit(RateLimiter::sliding_window(1, S));
    for partition in [Some(PartitionKey::from(1u64)), None] {
        let clock = VirtualClock::new();
        clock.advance(END - S / 2);
        let state = MemoryStore::new().bind(&spec).unwrap();
        let model: Resource<Circuit> = Resource::new(&spec);
        let mut run = Differential::new(model, &*state, clock);
        let admit = Step::Admit { partition };
        // Model and deque: refused, retry after 500 ms (the last instant).
        // Ring: refused, retry after 1 s.
        if let Err(mismatch) = run.run(&[admit.clone(), admit]) {
            panic!("{mismatch}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    /// Many threads admitting at one instant: the store admits exactly as
    /// many attempts as the model admits from the same number of requests
    /// (at one instant the count does not depend on their order), on the
    /// unpartitioned state and on a partition, after the same history;
    /// every request of a weight of 1 to 4.
    #[test]
    fn concurrent_admissions_at_one_instant_admit_what_the_model_admits(
        spec in spec(),
        history in steps(),
        partition in partition(),
        per_thread in 1usize..20,
        weight in 1u32..5,
    ) {
        const THREADS: usize = 8;
        let store = MemoryStore::new();
        let state = store.bind(&spec).unwrap();
        let model: Resource<Circuit> = Resource::new(&spec);
        let mut run = Differential::new(model, &*state, VirtualClock::new());
        if let Err(mismatch) = run.run(&applicable(&spec, &history)) {
            panic!("{mismatch}\nspec: {spec:?}");
        }
        let now = run.clock().now();
        // Weighted admissions are exact under contention except on the
        // lock-free sliding ring (unpartitioned), which is stricter.
        let ring = partition.is_none()
            && spec.rate_limit.as_ref().is_some_and(|r| {
                r.algorithm == seawall::rate_limit::RateAlgorithm::SlidingWindow
                    && r.max_wait.is_zero()
            });
        let weight = if ring { 1 } else { weight };
        let request = AdmitRequest { partition: partition.as_ref(), now, weight, budget: None, shadowed: false };
        let mut model = run.model().clone();
        let expected = (0..THREADS * per_thread)
            .filter(|_| model.admit(&request).decision.is_ok())
            .count();
        let admitted: usize = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..THREADS)
                .map(|_| {
                    scope.spawn(|| {
                        (0..per_thread)
                            .filter(|_| state.admit(&request).unwrap().decision.is_ok())
                            .count()
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).sum()
        });
        prop_assert_eq!(admitted, expected, "spec {:?}", spec);
        prop_assert_eq!(
            state.in_flight(partition.as_ref(), now).unwrap(),
            model.in_flight(partition.as_ref(), now)
        );
    }
}
