//! Reference model of a resource's stateful policies, composed in admission
//! order, and a differential check of a store against it.
//!
//! [`Resource`] has the operations of [`ResourceState`] (admit, record,
//! release, in flight), on the unpartitioned state and on partitions, with
//! the rules of each policy's model:
//!
//! - **Admission** checks the circuit, the bulkhead, the cooldown and the
//!   rate limit, in that order. The first refusal is the answer (circuit:
//!   `circuit_open` with the circuit's `retry_after`; bulkhead:
//!   `bulkhead_full` without one; cooldown: `cooldown_active` with the time
//!   left; rate limit: `rate_limited` with its `retry_after`), and what the
//!   earlier checks took (a half-open probe, a bulkhead slot) is given back.
//!   The rate limit, last, takes a permit only when the call is admitted
//!   (the request's `weight` permits, all or none); a weight it can never
//!   grant is refused before anything else (`rate_limited` with no
//!   `retry_after`), taking nothing. A circuit transition caused by the admission (open to half-open) is
//!   reported even when a later check refuses. A policy in shadow mode
//!   does not refuse: the call is admitted instead ([`Admission::shadow`]
//!   says what it would have been told, the permit is
//!   [`shadowed`](Permit::shadowed)), the policies in shadow mode give back
//!   what they took and the later ones are not asked; the enforcing ones
//!   still are (see [`crate::shadow`]). A call
//!   [shadowed already](AdmitRequest::shadowed) meets no policy in shadow
//!   mode (when the resource has one, its permit is shadowed), and the
//!   admission reports no shadow refusal of its own.
//! - **Record** applies the retry-after hint to the cooldown (any outcome),
//!   the outcome to the circuit, and gives back the slot; a policy in
//!   shadow mode takes nothing from a shadowed call.
//! - **Release** gives back the slot and the probe, and records nothing.
//! - **In flight**: slots held at `now` (zero without a bulkhead).
//! - **Partitions**: each partition key has policies of its own, fresh on
//!   first use; no state is shared between keys or with the unpartitioned
//!   state. The model never forgets a key: a store may drop an idle key
//!   only when that changes no later answer.
//!
//! The circuit is a [`CircuitModel`] given as a type parameter (the model
//! of the breaker in `model::breaker`); [`NoCircuit`] models resources
//! without one.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use super::bulkhead::Bulkhead;
use super::cooldown::Cooldown;
use super::rate::RateLimit;
use super::{instant, END};
use crate::breaker::{CircuitBreaker, CircuitMetrics, CircuitTransition};
use crate::context::PartitionKey;
use crate::error::{Rejection, RejectionReason, StoreError};
use crate::store::{
    Admission, AdmitRequest, Outcome, Permit, Record, Recorded, ResourceSpec, ResourceState,
};
use crate::testing::VirtualClock;

/// What a circuit gives an admitted attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CircuitPermit {
    /// The circuit's generation at admission.
    pub generation: u64,
    /// The attempt holds a half-open probe slot.
    pub probe: bool,
}

/// The answer of [`CircuitModel::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitAdmission {
    /// The permit, or the `retry_after` of the refusal.
    pub decision: Result<CircuitPermit, Option<Duration>>,
    /// A transition caused by admitting (open to half-open).
    pub transition: Option<CircuitTransition>,
}

/// A reference model of a circuit breaker, as [`Resource`] composes it.
pub trait CircuitModel: fmt::Debug {
    /// A closed circuit configured by `spec`.
    fn new(spec: &CircuitBreaker) -> Self
    where
        Self: Sized;

    /// Admission of one attempt at `now`.
    fn admit(&mut self, now: Duration) -> CircuitAdmission;

    /// Gives back what `permit` holds (its probe slot) without recording an
    /// outcome: a later check refused, or the attempt was released.
    fn give_back(&mut self, permit: CircuitPermit);

    /// Records the outcome of an attempt admitted with `permit` that ran
    /// for `duration`, at `now`; returns the transition it caused.
    fn record(
        &mut self,
        permit: CircuitPermit,
        outcome: Outcome,
        duration: Duration,
        now: Duration,
    ) -> Option<CircuitTransition>;

    /// The circuit's metrics at `now`, as
    /// [`ResourceState::circuit_metrics`] reports them; `None` (the
    /// default) for a model that keeps none.
    fn metrics(&self, now: Duration) -> Option<CircuitMetrics> {
        let _ = now;
        None
    }
}

/// The circuit model of a resource without a circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NoCircuit;

impl CircuitModel for NoCircuit {
    /// # Panics
    /// Always: `NoCircuit` models no breaker. A resource with a circuit
    /// breaker needs a real circuit model.
    fn new(spec: &CircuitBreaker) -> Self {
        panic!("NoCircuit cannot model the circuit breaker {spec:?}: give Resource a circuit model")
    }

    fn admit(&mut self, _now: Duration) -> CircuitAdmission {
        CircuitAdmission {
            decision: Ok(CircuitPermit::default()),
            transition: None,
        }
    }

    fn give_back(&mut self, _permit: CircuitPermit) {}

    fn record(
        &mut self,
        _permit: CircuitPermit,
        _outcome: Outcome,
        _duration: Duration,
        _now: Duration,
    ) -> Option<CircuitTransition> {
        None
    }
}

/// The policies of the unpartitioned state or of one partition, and which
/// of them run in shadow mode.
#[derive(Debug, Clone)]
struct Policies<C> {
    circuit: Option<C>,
    bulkhead: Option<Bulkhead>,
    cooldown: Option<Cooldown>,
    rate: Option<RateLimit>,
    shadow: ShadowModes,
}

/// Which policies run in shadow mode.
#[derive(Debug, Clone, Copy, Default)]
struct ShadowModes {
    circuit: bool,
    bulkhead: bool,
    cooldown: bool,
    rate: bool,
}

/// What an admission has taken so far, and the refusal of a policy in
/// shadow mode that the call goes on over.
#[derive(Debug, Default)]
struct Taken {
    permit: Permit,
    shadowed: Option<Rejection>,
}

impl<C: CircuitModel> Policies<C> {
    fn new(spec: &ResourceSpec, leases: bool) -> Self {
        Policies {
            circuit: spec.circuit.as_ref().map(C::new),
            bulkhead: spec
                .bulkhead
                .as_ref()
                .map(|b| Bulkhead::from_spec(b, leases)),
            cooldown: spec.cooldown.as_ref().map(Cooldown::from_spec),
            rate: spec.rate_limit.as_ref().map(RateLimit::new),
            shadow: ShadowModes {
                circuit: spec.circuit.as_ref().is_some_and(|c| c.shadow),
                bulkhead: spec.bulkhead.as_ref().is_some_and(|b| b.shadow),
                cooldown: spec.cooldown.as_ref().is_some_and(|c| c.shadow),
                rate: spec.rate_limit.as_ref().is_some_and(|r| r.shadow),
            },
        }
    }

    /// A refusal by a policy (`shadow`: in shadow mode). An enforcing
    /// refusal is the answer: what the call took is given back. A refusal
    /// in shadow mode lets the call go on: the first is kept, and what the
    /// policies in shadow mode took is given back.
    fn refusal(
        &mut self,
        taken: &mut Taken,
        shadow: bool,
        refusal: Rejection,
    ) -> Option<Rejection> {
        if !shadow {
            self.give_back(taken.permit);
            return Some(refusal);
        }
        taken.shadowed.get_or_insert(refusal);
        if self.shadow.bulkhead {
            if let (Some(slot), Some(bulkhead)) = (taken.permit.slot.take(), &mut self.bulkhead) {
                bulkhead.release(slot);
            }
        }
        if self.shadow.circuit && taken.permit.probe {
            if let Some(circuit) = &mut self.circuit {
                circuit.give_back(circuit_permit(taken.permit));
            }
            taken.permit.probe = false;
        }
        None
    }

    /// Admission: circuit, bulkhead, cooldown and rate limit in that order,
    /// the first enforcing refusal the answer; a refusal in shadow mode
    /// admits the call, and the policies in shadow mode after it are not
    /// asked. A call `shadowed` already is not asked by any policy in
    /// shadow mode.
    fn admit(&mut self, now: Duration, weight: u32, shadowed: bool) -> Admission {
        let mut taken = Taken::default();
        let s = self.shadow;
        let before = shadowed && (s.circuit || s.bulkhead || s.cooldown || s.rate);
        let mut transition = None;
        let refuse = |rejection, transition| Admission {
            decision: Err(rejection),
            transition,
            degraded: None,
            shadow: None,
        };
        // Whether a policy in shadow mode (`shadow`) is still asked.
        let asked = |taken: &Taken, shadow: bool| !(shadow && (before || taken.shadowed.is_some()));
        // A weight the rate limit never grants is refused first, taking
        // nothing.
        if asked(&taken, self.shadow.rate)
            && self.rate.as_ref().is_some_and(|rate| !rate.fits(weight))
        {
            let r = Rejection::new(RejectionReason::RateLimited, None);
            if let Some(r) = self.refusal(&mut taken, self.shadow.rate, r) {
                return refuse(r, None);
            }
        }
        if self.circuit.is_some() && asked(&taken, self.shadow.circuit) {
            let answer = self.circuit.as_mut().map(|c| c.admit(now));
            let answer = answer.expect("a circuit");
            transition = answer.transition;
            match answer.decision {
                Ok(p) => {
                    taken.permit.generation = p.generation;
                    taken.permit.probe = p.probe;
                }
                Err(retry_after) => {
                    let r = Rejection::new(RejectionReason::CircuitOpen, retry_after);
                    if let Some(r) = self.refusal(&mut taken, self.shadow.circuit, r) {
                        return refuse(r, transition);
                    }
                }
            }
        }
        if self.bulkhead.is_some() && asked(&taken, self.shadow.bulkhead) {
            match self.bulkhead.as_mut().and_then(|b| b.acquire(now)) {
                Some(slot) => taken.permit.slot = Some(slot),
                None => {
                    let r = Rejection::new(RejectionReason::BulkheadFull, None);
                    if let Some(r) = self.refusal(&mut taken, self.shadow.bulkhead, r) {
                        return refuse(r, transition);
                    }
                }
            }
        }
        if self.cooldown.is_some() && asked(&taken, self.shadow.cooldown) {
            if let Some(Err(left)) = self.cooldown.as_ref().map(|c| c.check(now)) {
                let r = Rejection::new(RejectionReason::CooldownActive, Some(left));
                if let Some(r) = self.refusal(&mut taken, self.shadow.cooldown, r) {
                    return refuse(r, transition);
                }
            }
        }
        if self.rate.is_some() && asked(&taken, self.shadow.rate) {
            let rate = self.rate.as_mut().expect("a rate limit");
            if let Err(retry_after) = rate.reserve_weighted(now, Duration::ZERO, weight) {
                let r = Rejection::new(RejectionReason::RateLimited, retry_after);
                if let Some(r) = self.refusal(&mut taken, self.shadow.rate, r) {
                    return refuse(r, transition);
                }
            }
        }
        taken.permit.shadowed = before || taken.shadowed.is_some();
        Admission {
            decision: Ok(taken.permit),
            transition,
            degraded: None,
            shadow: taken.shadowed,
        }
    }

    fn give_back(&mut self, permit: Permit) {
        if let (Some(slot), Some(bulkhead)) = (permit.slot, &mut self.bulkhead) {
            bulkhead.release(slot);
        }
        if let Some(circuit) = &mut self.circuit {
            circuit.give_back(circuit_permit(permit));
        }
    }

    /// Records the outcome: the hint to the cooldown, the outcome to the
    /// circuit (a policy in shadow mode takes neither from a shadowed
    /// call), the slot given back.
    fn record(&mut self, record: &Record<'_>, now: Duration) -> Recorded {
        let mut recorded = Recorded::default();
        let shadowed = record.permit.shadowed;
        if let (Some(hint), Some(cooldown)) = (record.retry_after, &mut self.cooldown) {
            if !(shadowed && self.shadow.cooldown) {
                recorded.cooldown = cooldown.hint(hint, now);
            }
        }
        if let Some(circuit) = &mut self.circuit {
            if !(shadowed && self.shadow.circuit) {
                recorded.transition = circuit.record(
                    circuit_permit(record.permit),
                    record.outcome,
                    record.duration,
                    now,
                );
            }
        }
        if let (Some(slot), Some(bulkhead)) = (record.permit.slot, &mut self.bulkhead) {
            bulkhead.release(slot);
        }
        recorded
    }

    fn in_flight(&self, now: Duration) -> u32 {
        self.bulkhead.as_ref().map_or(0, |b| b.in_flight(now))
    }
}

fn circuit_permit(permit: Permit) -> CircuitPermit {
    CircuitPermit {
        generation: permit.generation,
        probe: permit.probe,
    }
}

/// The reference model of one resource bound to a store.
///
/// ```
/// use std::time::Duration;
/// use seawall::model::Resource;
/// use seawall::store::{AdmitRequest, ResourceSpec};
/// use seawall::{Bulkhead, RateLimiter, RejectionReason};
///
/// let spec = ResourceSpec::new("api")
///     .with_bulkhead(Bulkhead::new(5))
///     .with_rate_limit(RateLimiter::fixed_window(1, Duration::from_secs(1)));
/// let mut model: Resource = Resource::new(&spec);
/// let at = |now| AdmitRequest { partition: None, now, weight: 1, budget: None, shadowed: false };
/// assert!(model.admit(&at(Duration::ZERO)).decision.is_ok());
/// let refused = model.admit(&at(Duration::ZERO)).decision.unwrap_err();
/// assert_eq!(refused.reason, RejectionReason::RateLimited);
/// // The refused call gave its bulkhead slot back.
/// assert_eq!(model.in_flight(None, Duration::ZERO), 1);
/// ```
#[derive(Debug, Clone)]
pub struct Resource<C = NoCircuit> {
    spec: ResourceSpec,
    leases: bool,
    root: Policies<C>,
    partitions: HashMap<PartitionKey, Policies<C>>,
}

impl<C: CircuitModel> Resource<C> {
    /// The model of `spec` in a process-local store: a bulkhead slot is
    /// held until it is given back (no lease).
    ///
    /// # Panics
    /// When the spec has a circuit breaker and `C` is [`NoCircuit`].
    pub fn new(spec: &ResourceSpec) -> Self {
        Self::build(spec, false)
    }

    /// The model of `spec` in a shared store: each bulkhead slot is leased
    /// for [`Bulkhead::lease`](crate::Bulkhead::lease).
    ///
    /// # Panics
    /// When the spec has a circuit breaker and `C` is [`NoCircuit`].
    pub fn with_leases(spec: &ResourceSpec) -> Self {
        Self::build(spec, true)
    }

    fn build(spec: &ResourceSpec, leases: bool) -> Self {
        Resource {
            spec: spec.clone(),
            leases,
            root: Policies::new(spec, leases),
            partitions: HashMap::new(),
        }
    }

    /// The spec modelled.
    pub fn spec(&self) -> &ResourceSpec {
        &self.spec
    }

    /// Partition keys used so far.
    pub fn partitions(&self) -> usize {
        self.partitions.len()
    }

    fn policies(&mut self, partition: Option<&PartitionKey>) -> &mut Policies<C> {
        match partition {
            None => &mut self.root,
            Some(key) => {
                let (spec, leases) = (&self.spec, self.leases);
                self.partitions
                    .entry(key.clone())
                    .or_insert_with(|| Policies::new(spec, leases))
            }
        }
    }

    /// [`ResourceState::admit`]: admits one attempt through circuit,
    /// bulkhead, cooldown and rate limit, all or nothing.
    pub fn admit(&mut self, request: &AdmitRequest<'_>) -> Admission {
        let now = instant(request.now);
        self.policies(request.partition)
            .admit(now, request.weight, request.shadowed)
    }

    /// [`ResourceState::record`]: records the outcome of an admitted
    /// attempt and gives back its slot.
    pub fn record(&mut self, record: &Record<'_>) -> Recorded {
        let now = instant(record.now);
        self.policies(record.partition).record(record, now)
    }

    /// [`ResourceState::release`]: gives back a permit without an outcome.
    pub fn release(&mut self, partition: Option<&PartitionKey>, permit: Permit) {
        let policies = match partition {
            None => Some(&mut self.root),
            Some(key) => self.partitions.get_mut(key),
        };
        if let Some(policies) = policies {
            policies.give_back(permit);
        }
    }

    /// [`ResourceState::circuit_metrics`]: the circuit's metrics at `now`
    /// (a partition not used yet has a fresh circuit); `None` without a
    /// circuit breaker, or when the circuit model keeps none.
    pub fn circuit_metrics(
        &self,
        partition: Option<&PartitionKey>,
        now: Duration,
    ) -> Option<CircuitMetrics> {
        let now = instant(now);
        let policies = match partition {
            None => Some(&self.root),
            Some(key) => self.partitions.get(key),
        };
        match policies {
            Some(p) => p.circuit.as_ref()?.metrics(now),
            None => C::new(self.spec.circuit.as_ref()?).metrics(now),
        }
    }

    /// [`ResourceState::in_flight`]: slots held at `now`.
    pub fn in_flight(&self, partition: Option<&PartitionKey>, now: Duration) -> u32 {
        let now = instant(now);
        match partition {
            None => self.root.in_flight(now),
            Some(key) => self.partitions.get(key).map_or(0, |p| p.in_flight(now)),
        }
    }
}

/// One operation of a [`Differential`] run.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Step {
    /// Admits one attempt; an admitted one is held until recorded or
    /// released.
    Admit {
        /// The partition of the call.
        partition: Option<PartitionKey>,
    },
    /// Admits one attempt of a call
    /// [shadowed already](AdmitRequest::shadowed), as `Admit` does
    /// otherwise.
    AdmitShadowed {
        /// The partition of the call.
        partition: Option<PartitionKey>,
    },
    /// Records the outcome of held permit number `permit` (modulo the
    /// number held; nothing when none is held).
    Record {
        /// Which held permit.
        permit: usize,
        /// How the attempt ended.
        outcome: Outcome,
        /// How long it ran.
        duration: Duration,
        /// A retry-after hint.
        retry_after: Option<Duration>,
    },
    /// Releases held permit number `permit` (as for `Record`).
    Release {
        /// Which held permit.
        permit: usize,
    },
    /// Moves the clock forward (never past [`END`]).
    Advance(Duration),
    /// Moves the clock forward by the `retry_after` of the last refusal,
    /// as a caller told to wait would (nothing without one): the instants
    /// where a decision changes are met exactly.
    WaitAsTold,
    /// Lets the store drop its idle partitions
    /// ([`ResourceState::evict_idle`]); the model keeps them.
    EvictIdle,
}

/// How a [`Differential`] run calls the store: [`Blocking`] uses the
/// blocking methods; an implementation driving
/// [`admit_async`](ResourceState::admit_async) and
/// [`record_async`](ResourceState::record_async) on a runtime checks the
/// async path.
pub trait StoreCalls: fmt::Debug {
    /// Admits, as [`ResourceState::admit`].
    ///
    /// # Errors
    /// The store's.
    fn admit(
        &self,
        state: &dyn ResourceState,
        request: AdmitRequest<'_>,
    ) -> Result<Admission, StoreError>;

    /// Records, as [`ResourceState::record`].
    ///
    /// # Errors
    /// The store's.
    fn record(&self, state: &dyn ResourceState, record: Record<'_>)
        -> Result<Recorded, StoreError>;
}

/// [`StoreCalls`] through the blocking methods.
#[derive(Debug, Clone, Copy, Default)]
pub struct Blocking;

impl StoreCalls for Blocking {
    fn admit(
        &self,
        state: &dyn ResourceState,
        request: AdmitRequest<'_>,
    ) -> Result<Admission, StoreError> {
        state.admit(&request)
    }

    fn record(
        &self,
        state: &dyn ResourceState,
        record: Record<'_>,
    ) -> Result<Recorded, StoreError> {
        state.record(&record)
    }
}

/// A store's answer that differs from the model's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The number of the step (from 0).
    pub step: usize,
    /// The step.
    pub action: String,
    /// The clock when it ran.
    pub now: Duration,
    /// What was compared.
    pub what: String,
    /// The model's answer.
    pub model: String,
    /// The store's answer.
    pub store: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "step {} ({}, at {:?}): {} differs: model {}, store {}",
            self.step, self.action, self.now, self.what, self.model, self.store
        )
    }
}

impl std::error::Error for Mismatch {}

/// A permit held by both sides.
#[derive(Debug, Clone)]
struct Held {
    partition: Option<PartitionKey>,
    model: Permit,
    store: Permit,
}

/// Runs the same steps on a model and on a store, and compares every
/// answer: each admission (admitted with which probe and generation,
/// modulo 2^13, whether it holds a slot and whether it is shadowed, with
/// which refusal of a policy in shadow mode; or refused with which reason
/// and `retry_after`; the transition), each record (transition, cooldown), and
/// the slots in flight, of the partition a step touched after each step and
/// of every partition used after the clock moves or idle partitions are
/// evicted. An answer the store gives from local state (degraded) is a
/// mismatch too.
///
/// The time is a [`VirtualClock`], moved by [`Step::Advance`] and never
/// past [`END`].
///
/// ```
/// use std::time::Duration;
/// use seawall::model::resource::{Differential, Step};
/// use seawall::model::Resource;
/// use seawall::store::ResourceSpec;
/// use seawall::testing::VirtualClock;
/// use seawall::{Bulkhead, MemoryStore, StateStore};
///
/// let spec = ResourceSpec::new("checked").with_bulkhead(Bulkhead::new(1));
/// let store = MemoryStore::new().bind(&spec).unwrap();
/// let model: Resource = Resource::new(&spec);
/// let mut run = Differential::new(model, &*store, VirtualClock::new());
/// let admit = Step::Admit { partition: None };
/// run.run(&[admit.clone(), admit, Step::Release { permit: 0 }]).unwrap();
/// assert_eq!(run.held(), 0);
/// ```
#[derive(Debug)]
pub struct Differential<'a, C: CircuitModel = NoCircuit> {
    model: Resource<C>,
    store: &'a dyn ResourceState,
    calls: &'a dyn StoreCalls,
    clock: VirtualClock,
    held: Vec<Held>,
    keys: Vec<PartitionKey>,
    steps: usize,
    told: Option<Duration>,
}

impl<'a, C: CircuitModel> Differential<'a, C> {
    /// A run of `model` against `store` on `clock`, through the blocking
    /// methods.
    pub fn new(model: Resource<C>, store: &'a dyn ResourceState, clock: VirtualClock) -> Self {
        Differential {
            model,
            store,
            calls: &Blocking,
            clock,
            held: Vec::new(),
            keys: Vec::new(),
            steps: 0,
            told: None,
        }
    }

    /// Calls the store through `calls` (e.g. its async methods).
    pub fn with_calls(mut self, calls: &'a dyn StoreCalls) -> Self {
        self.calls = calls;
        self
    }

    /// The model, as it stands.
    pub fn model(&self) -> &Resource<C> {
        &self.model
    }

    /// Permits held (admitted, not yet recorded or released).
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// The clock.
    pub fn clock(&self) -> &VirtualClock {
        &self.clock
    }

    /// Runs `steps` in order.
    ///
    /// # Errors
    /// The first answer of the store that differs from the model's, or the
    /// first error of the store.
    pub fn run(&mut self, steps: &[Step]) -> Result<(), Mismatch> {
        steps.iter().try_for_each(|s| self.step(s))
    }

    /// Runs one step.
    ///
    /// # Errors
    /// As [`run`](Self::run).
    pub fn step(&mut self, step: &Step) -> Result<(), Mismatch> {
        let n = self.steps;
        self.steps += 1;
        let now = self.clock.now();
        let mismatch = |what: &str, model: String, store: String| Mismatch {
            step: n,
            action: format!("{step:?}"),
            now,
            what: what.to_owned(),
            model,
            store,
        };
        let compare = |what: &str, model: String, store: String| {
            if model == store {
                Ok(())
            } else {
                Err(mismatch(what, model, store))
            }
        };
        let touched = match step {
            Step::Admit { partition } | Step::AdmitShadowed { partition } => {
                let request = AdmitRequest {
                    partition: partition.as_ref(),
                    now,
                    weight: 1,
                    budget: None,
                    shadowed: matches!(step, Step::AdmitShadowed { .. }),
                };
                let expected = self.model.admit(&request);
                let got = self
                    .calls
                    .admit(self.store, request)
                    .map_err(|e| mismatch("admit", "an answer".into(), format!("error {e}")))?;
                compare(
                    "degraded",
                    "None".into(),
                    format!("{:?}", got.degraded.as_ref().map(|e| e.to_string())),
                )?;
                compare(
                    "decision",
                    decision(&expected.decision),
                    decision(&got.decision),
                )?;
                compare(
                    "shadow refusal",
                    format!("{:?}", expected.shadow),
                    format!("{:?}", got.shadow),
                )?;
                compare(
                    "admission transition",
                    format!("{:?}", expected.transition),
                    format!("{:?}", got.transition),
                )?;
                match (expected.decision, got.decision) {
                    (Ok(model), Ok(store)) => self.held.push(Held {
                        partition: partition.clone(),
                        model,
                        store,
                    }),
                    (_, Err(refused)) => self.told = refused.retry_after,
                    _ => {}
                }
                if let Some(key) = partition {
                    if !self.keys.contains(key) {
                        self.keys.push(key.clone());
                    }
                }
                Some(partition.clone())
            }
            Step::Record {
                permit,
                outcome,
                duration,
                retry_after,
            } => match self.take(*permit) {
                None => None,
                Some(held) => {
                    let record = |permit| Record {
                        partition: held.partition.as_ref(),
                        permit,
                        outcome: *outcome,
                        duration: *duration,
                        retry_after: *retry_after,
                        now,
                    };
                    let expected = self.model.record(&record(held.model));
                    let got = self
                        .calls
                        .record(self.store, record(held.store))
                        .map_err(|e| {
                            mismatch("record", "an answer".into(), format!("error {e}"))
                        })?;
                    compare(
                        "degraded",
                        "None".into(),
                        format!("{:?}", got.degraded.as_ref().map(|e| e.to_string())),
                    )?;
                    compare(
                        "record transition",
                        format!("{:?}", expected.transition),
                        format!("{:?}", got.transition),
                    )?;
                    compare(
                        "cooldown",
                        format!("{:?}", expected.cooldown),
                        format!("{:?}", got.cooldown),
                    )?;
                    Some(held.partition)
                }
            },
            Step::Release { permit } => match self.take(*permit) {
                None => None,
                Some(held) => {
                    self.model.release(held.partition.as_ref(), held.model);
                    self.store.release(held.partition.as_ref(), held.store);
                    Some(held.partition)
                }
            },
            Step::Advance(by) => {
                self.clock.advance((*by).min(END - now));
                None
            }
            Step::WaitAsTold => {
                let by = self.told.take().unwrap_or_default();
                self.clock.advance(by.min(END - now));
                None
            }
            Step::EvictIdle => {
                self.store.evict_idle(now);
                None
            }
        };
        let now = self.clock.now();
        let check = |key: Option<&PartitionKey>| {
            let expected = self.model.in_flight(key, now);
            let got = self
                .store
                .in_flight(key, now)
                .map_err(|e| mismatch("in_flight", expected.to_string(), format!("error {e}")))?;
            compare(
                &format!("in_flight of {key:?}"),
                expected.to_string(),
                got.to_string(),
            )
        };
        match touched {
            Some(key) => check(key.as_ref()),
            None => {
                check(None)?;
                self.keys.iter().try_for_each(|k| check(Some(k)))
            }
        }
    }

    fn take(&mut self, index: usize) -> Option<Held> {
        if self.held.is_empty() {
            return None;
        }
        let index = index % self.held.len();
        Some(self.held.remove(index))
    }
}

/// Circuit generations are compared modulo 2^13: stores keep at least
/// that many bits (the memory store exactly 13), as `model::breaker` says.
const GENERATION_MASK: u64 = (1 << 13) - 1;

/// A decision as compared: the slot's id is the store's own business.
fn decision(d: &Result<Permit, Rejection>) -> String {
    match d {
        Ok(p) => format!(
            "admitted (probe {}, generation {}, slot {}, shadowed {})",
            p.probe,
            p.generation & GENERATION_MASK,
            p.slot.is_some(),
            p.shadowed
        ),
        Err(r) => format!("refused ({}, retry after {:?})", r.reason, r.retry_after),
    }
}

/// The breaker model as the circuit of a composed [`Resource`].
impl CircuitModel for super::breaker::Model {
    fn new(spec: &CircuitBreaker) -> Self {
        super::breaker::Model::new(spec.clone())
    }

    fn admit(&mut self, now: Duration) -> CircuitAdmission {
        let (decision, transition) = super::breaker::Model::admit(self, now);
        CircuitAdmission {
            decision: decision.map(|(generation, probe)| CircuitPermit { generation, probe }),
            transition,
        }
    }

    fn give_back(&mut self, permit: CircuitPermit) {
        self.release(permit.generation, permit.probe)
    }

    fn record(
        &mut self,
        permit: CircuitPermit,
        outcome: Outcome,
        duration: Duration,
        now: Duration,
    ) -> Option<CircuitTransition> {
        super::breaker::Model::record(
            self,
            permit.generation,
            permit.probe,
            outcome,
            duration,
            now,
        )
    }

    fn metrics(&self, now: Duration) -> Option<CircuitMetrics> {
        Some(super::breaker::Model::metrics(self, now))
    }
}

/// proptest strategies for [`Step`] sequences, shared by every store's
/// model tests (the in-memory store's and Redis's).
pub mod strategy {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::Step;
    use crate::context::PartitionKey;
    use crate::store::Outcome;

    /// No partition most of the time, a few integer keys, and one string
    /// key spelled two ways (static and shared strings are equal).
    pub fn partition() -> impl Strategy<Value = Option<PartitionKey>> {
        prop_oneof![
            3 => Just(None),
            1 => (0u64..3).prop_map(|k| Some(PartitionKey::from(k))),
            1 => Just(Some(PartitionKey::from("tenant"))),
            1 => Just(Some(PartitionKey::from("tenant".to_owned()))),
        ]
    }

    /// A retry-after hint: none, zero, microseconds, seconds, the longest.
    pub fn hint() -> impl Strategy<Value = Option<Duration>> {
        prop_oneof![
            4 => Just(None),
            1 => Just(Some(Duration::ZERO)),
            2 => (1u64..5_000).prop_map(|n| Some(Duration::from_micros(n))),
            1 => (1u64..200).prop_map(|n| Some(Duration::from_secs(n))),
            1 => Just(Some(Duration::MAX)),
        ]
    }

    /// An attempt's outcome.
    pub fn outcome() -> impl Strategy<Value = Outcome> {
        prop_oneof![
            Just(Outcome::Success),
            Just(Outcome::Failure),
            Just(Outcome::Ignored)
        ]
    }

    /// How long an attempt ran: mostly microseconds, sometimes around the
    /// slow-call duration of the breaker strategies (50 ms), exactly it
    /// included.
    pub fn duration() -> impl Strategy<Value = Duration> {
        prop_oneof![
            4 => (0u64..10_000).prop_map(Duration::from_micros),
            1 => Just(Duration::from_millis(50)),
            1 => (45_000u64..55_000).prop_map(Duration::from_micros),
            1 => (1u64..200).prop_map(Duration::from_millis),
        ]
    }

    /// A clock advance: microseconds, milliseconds, up to `max_secs`
    /// seconds, or a jump of 10^6 s.
    pub fn advance(max_secs: u64) -> impl Strategy<Value = Duration> {
        prop_oneof![
            4 => (0u64..3_000).prop_map(Duration::from_micros),
            2 => (1u64..3_000).prop_map(Duration::from_millis),
            1 => (1u64..max_secs.max(2)).prop_map(Duration::from_secs),
            1 => Just(Duration::from_secs(1_000_000)),
        ]
    }

    /// One step of a run; see [`advance`] for `max_secs`.
    pub fn step(max_secs: u64) -> impl Strategy<Value = Step> {
        prop_oneof![
            5 => partition().prop_map(|partition| Step::Admit { partition }),
            1 => partition().prop_map(|partition| Step::AdmitShadowed { partition }),
            3 => (any::<usize>(), outcome(), duration(), hint())
                .prop_map(|(permit, outcome, duration, retry_after)| Step::Record {
                    permit,
                    outcome,
                    duration,
                    retry_after,
                }),
            1 => any::<usize>().prop_map(|permit| Step::Release { permit }),
            3 => advance(max_secs).prop_map(Step::Advance),
            2 => Just(Step::WaitAsTold),
            1 => Just(Step::EvictIdle),
        ]
    }

    /// A run of 1 to `max_len - 1` steps.
    pub fn steps(max_len: usize, max_secs: u64) -> impl Strategy<Value = Vec<Step>> {
        proptest::collection::vec(step(max_secs), 1..max_len.max(2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Bulkhead, Cooldown, RateLimiter};

    const S: Duration = Duration::from_secs(1);

    fn at(now: Duration) -> AdmitRequest<'static> {
        AdmitRequest {
            partition: None,
            now,
            weight: 1,
            budget: None,
            shadowed: false,
        }
    }

    #[test]
    fn a_later_refusal_gives_back_the_slot() {
        let spec = ResourceSpec::new("r")
            .with_bulkhead(Bulkhead::new(1))
            .with_cooldown(Cooldown::new())
            .with_rate_limit(RateLimiter::gcra(1, S));
        let mut m: Resource = Resource::new(&spec);
        let p = m.admit(&at(S)).decision.unwrap();
        assert_eq!(
            m.admit(&at(S)).decision.unwrap_err().reason,
            RejectionReason::BulkheadFull
        );
        let recorded = m.record(&Record {
            partition: None,
            permit: p,
            outcome: Outcome::Failure,
            duration: Duration::ZERO,
            retry_after: Some(10 * S),
            now: S,
        });
        assert_eq!(recorded.cooldown, Some(10 * S));
        assert_eq!(
            m.admit(&at(2 * S)).decision.unwrap_err(),
            Rejection::new(RejectionReason::CooldownActive, Some(9 * S))
        );
        assert_eq!(m.in_flight(None, 2 * S), 0);
        // The rate limit refuses last, and takes nothing then.
        assert!(m.admit(&at(11 * S)).decision.is_ok());
        assert_eq!(m.in_flight(None, 11 * S), 1);
    }

    #[test]
    fn partitions_share_nothing() {
        let spec = ResourceSpec::new("r").with_rate_limit(RateLimiter::fixed_window(1, S));
        let mut m: Resource = Resource::new(&spec);
        let a = PartitionKey::from(1u64);
        let b = PartitionKey::from("b");
        for key in [None, Some(&a), Some(&b)] {
            let request = AdmitRequest {
                partition: key,
                now: S,
                weight: 1,
                budget: None,
                shadowed: false,
            };
            assert!(m.admit(&request).decision.is_ok());
            assert!(m.admit(&request).decision.is_err());
        }
        assert_eq!(m.partitions(), 2);
    }

    /// A circuit that half-opens on the first admission and admits one
    /// probe at a time, and remembers what it was given back.
    #[derive(Debug, Default)]
    struct OneProbe {
        out: u32,
        given_back: u32,
        recorded: Vec<Outcome>,
    }

    impl CircuitModel for OneProbe {
        fn new(_spec: &CircuitBreaker) -> Self {
            OneProbe::default()
        }
        fn admit(&mut self, _now: Duration) -> CircuitAdmission {
            if self.out > 0 {
                return CircuitAdmission {
                    decision: Err(Some(S)),
                    transition: None,
                };
            }
            self.out += 1;
            CircuitAdmission {
                decision: Ok(CircuitPermit {
                    generation: 3,
                    probe: true,
                }),
                transition: Some(CircuitTransition::HalfOpened),
            }
        }
        fn give_back(&mut self, permit: CircuitPermit) {
            if permit.probe {
                self.out -= 1;
                self.given_back += 1;
            }
        }
        fn record(
            &mut self,
            permit: CircuitPermit,
            outcome: Outcome,
            _duration: Duration,
            _now: Duration,
        ) -> Option<CircuitTransition> {
            assert_eq!(permit.generation, 3);
            self.out -= 1;
            self.recorded.push(outcome);
            Some(CircuitTransition::Closed)
        }
    }

    #[test]
    fn the_circuit_comes_first_and_gets_its_probe_back_on_a_later_refusal() {
        let spec = ResourceSpec::new("r")
            .with_circuit(CircuitBreaker::consecutive_failures(1))
            .with_cooldown(Cooldown::new());
        let mut m: Resource<OneProbe> = Resource::new(&spec);
        let p = m.admit(&at(S));
        assert_eq!(p.transition, Some(CircuitTransition::HalfOpened));
        let p = p.decision.unwrap();
        assert!(p.probe);
        assert_eq!(p.generation, 3);
        // The circuit refuses first, with its own retry_after.
        assert_eq!(
            m.admit(&at(S)).decision.unwrap_err(),
            Rejection::new(RejectionReason::CircuitOpen, Some(S))
        );
        let recorded = m.record(&Record {
            partition: None,
            permit: p,
            outcome: Outcome::Failure,
            duration: Duration::ZERO,
            retry_after: Some(S),
            now: S,
        });
        assert_eq!(recorded.transition, Some(CircuitTransition::Closed));
        assert_eq!(recorded.cooldown, Some(S));
        // The cooldown refuses: the probe the circuit gave is given back,
        // and the half-open transition is still reported.
        let refused = m.admit(&at(S));
        assert_eq!(refused.transition, Some(CircuitTransition::HalfOpened));
        assert_eq!(
            refused.decision.unwrap_err().reason,
            RejectionReason::CooldownActive
        );
        let circuit = m.root.circuit.as_ref().unwrap();
        assert_eq!((circuit.out, circuit.given_back), (0, 1));
        assert_eq!(circuit.recorded, [Outcome::Failure]);
        // A release gives the probe back too.
        let p = m.admit(&at(2 * S)).decision.unwrap();
        m.release(None, p);
        let circuit = m.root.circuit.as_ref().unwrap();
        assert_eq!((circuit.out, circuit.given_back), (0, 2));
    }

    #[test]
    #[should_panic(expected = "NoCircuit cannot model")]
    fn no_circuit_refuses_to_model_a_breaker() {
        let spec = ResourceSpec::new("r").with_circuit(CircuitBreaker::consecutive_failures(1));
        let _: Resource = Resource::new(&spec);
    }
}
