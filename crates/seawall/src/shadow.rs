//! Shadow mode: a stateful policy that is judged and reported but never
//! refuses, for a safe rollout of a new limit (Resilience4j's
//! `METRICS_ONLY`, Lyft's shadow mode for its rate limits).
//!
//! Any stateful policy can run in shadow mode: [`CircuitBreaker::shadow`],
//! [`Bulkhead::shadow`], [`Cooldown::shadow`], [`RateLimiter::shadow`],
//! and the adaptive concurrency limit, [`AdaptiveLimit::shadow`];
//! `shadow = true` in a configuration file, `shadow` in `#[resilient]`.
//! Such a policy keeps its state exactly as it would if it enforced, so
//! that its events, its metrics and [`circuit_metrics`] say what would have
//! happened; but where it would refuse a call (or make it wait), the call
//! goes on at once, and an [`EventKind::ShadowRejected`] event (metric
//! `event.name = shadow_rejected`) names the reason and the `retry_after`
//! the refusal would have carried.
//!
//! ```
//! use std::time::Duration;
//! use seawall::{EventKind, Pipeline, RateLimiter};
//! use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
//!
//! let would_have = Arc::new(AtomicU32::new(0));
//! let seen = Arc::clone(&would_have);
//! let pipeline = Pipeline::builder("new-limit")
//!     .rate_limiter(RateLimiter::fixed_window(2, Duration::from_secs(60)).shadow(true))
//!     .on_event(move |e| {
//!         if let EventKind::ShadowRejected { .. } = e.kind {
//!             seen.fetch_add(1, Ordering::Relaxed);
//!         }
//!     })
//!     .build()?;
//! for _ in 0..5 {
//!     pipeline.call(|_ctx| Ok::<_, std::io::Error>(()))?; // never refused
//! }
//! assert_eq!(would_have.load(Ordering::Relaxed), 3);
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```
//!
//! # The rule
//! A resource admits a call as if every policy enforced: circuit, bulkhead,
//! cooldown, rate limit, in that order. The first refusal decides:
//! - by an enforcing policy, the call is refused, as without shadow mode;
//! - by a policy in shadow mode, the call is admitted instead. The
//!   policies in shadow mode then hold nothing for it (what they took is
//!   given back: a half-open probe slot, a bulkhead slot), as they would
//!   after a refusal, and the later ones are not asked (the call would not
//!   have reached them); the enforcing policies are still asked and still
//!   hold what they grant, since the call does run: a later enforcing
//!   refusal refuses it.
//!
//! Such a call is *shadowed* ([`Permit::shadowed`](crate::store::Permit::shadowed)):
//! when it ends, the policies in shadow mode record nothing of it (a
//! circuit counts no outcome, a cooldown takes no retry-after hint), since
//! an enforcing resource would not have let it run; the enforcing ones
//! record it as any call. A call admitted with no refusal is recorded by
//! every policy, as usual.
//!
//! ## Across the levels of a pipeline
//! A call meets the stateful policies at several levels: those declared
//! before the retry admit the call once (the resource `{name}#call`), then
//! each attempt meets the adaptive limit and the policies declared after
//! the retry. An enforcing refusal at any level ends the call (what the
//! earlier levels hold is given back without an outcome, or, after an
//! attempt failed, with that failure as the call's outcome), so the rule
//! goes on across them: **once a call is shadowed, the policies in shadow
//! mode it would not have reached are not asked and record nothing of it**.
//! - A call shadowed by its call-level policies meets the adaptive limit
//!   and the attempts' policies shadowed already: those in shadow mode
//!   are not asked (a shadow limiter takes no permit, a shadow bulkhead no
//!   slot, a shadow adaptive limit no slot and no sample), the enforcing
//!   ones are, for every attempt.
//! - An attempt shadowed by the adaptive limit meets the attempts'
//!   policies shadowed already, in the same way.
//! - An attempt shadowed by the attempts' policies gives back the slot the
//!   adaptive limit in shadow mode lent it (it takes no sample).
//! - Once an attempt is shadowed, the call is: the call-level policies in
//!   shadow mode give back what they hold for it (a probe slot, a bulkhead
//!   slot) and record nothing of it, and its later attempts are shadowed
//!   from the start. When an attempt had failed before, the enforcing
//!   call would have ended with that failure: the call's gate records it
//!   when the call ends, in place of the call's own outcome (for the
//!   enforcing policies before the retry too: they record one outcome per
//!   call). (A hedge is the exception: a refused hedge does not
//!   end an enforcing call, so a hedge shadowed shadows itself alone.)
//!
//! This rule is stated once, in this module: `Walk` for one admission
//! (started shadowed for a call shadowed already: the store's
//! [`AdmitRequest::shadowed`](crate::store::AdmitRequest::shadowed)),
//! `takes_part` for the adaptive limit and `Shadow::split` for what a
//! call-level permit keeps once the call is shadowed; the call engine
//! applies them. The memory store's admission walks with `Walk`; the
//! Redis store's script restates it and the model tests
//! (`seawall::model::resource`) check both against a plain statement of
//! it, admissions shadowed already included.
//!
//! # What it means for each policy
//! - **Circuit breaker**: it opens, half-opens (admitting its probes) and
//!   closes on the outcomes of the calls it admits, as an enforcing one
//!   would; calls it would refuse (open, isolated, every probe slot
//!   taken) run without a say in its state. Its transitions are reported
//!   as usual, and [`Pipeline::isolate`], [`Pipeline::open_for`] move its
//!   state without refusing anything.
//! - **Bulkhead**: a call over the limit runs **without a slot**: the slots
//!   count the calls an enforcing bulkhead would have let in, never more
//!   than the limit. Counting the extra calls would make the shadow
//!   bulkhead refuse (in shadow) calls that an enforcing one would admit
//!   once its own calls end, so its reports would overstate the refusals.
//!   [`in_flight`](crate::Pipeline::in_flight) thus reads at most the limit.
//! - **Cooldown**: a call during the pause runs at once instead of waiting
//!   or being refused; hints of calls it admitted unpaused open or extend
//!   the pause as usual.
//! - **Rate limiter**: a call over the limit runs without taking a permit
//!   (the limiter's state is that of an enforcing limiter that refused
//!   it). A shadow limiter never reserves a permit nor makes a call wait:
//!   with `max_wait`, an enforcing limiter would have made the call wait
//!   for its permit (taking it at that later instant), so it spends fewer
//!   permits than an enforcing one would for calls that would have waited.
//!   The event's `retry_after` is the wait the call would have been told.
//!
//! - **Adaptive limit** (per process, admitted before the store's
//!   policies): an attempt over the limit runs **without a slot** and
//!   gives **no sample**, like a call over a shadow bulkhead; the limit
//!   keeps adapting from the attempts it admits, as an enforcing one would,
//!   and [`concurrency_limit`](crate::Pipeline::concurrency_limit) reads at
//!   most the limit in flight. The dependency serves every attempt, though,
//!   so the latencies the limit measures are those of the whole load: it
//!   finds the limit of the load the dependency really sees.
//!
//! A policy in shadow mode never makes a call wait: the queue of a
//! bulkhead or of an adaptive limit, the `max_wait` of a cooldown or a
//! rate limiter apply only when it enforces.
//!
//! [`CircuitBreaker::shadow`]: crate::CircuitBreaker::shadow
//! [`Bulkhead::shadow`]: crate::Bulkhead::shadow
//! [`Cooldown::shadow`]: crate::Cooldown::shadow
//! [`RateLimiter::shadow`]: crate::RateLimiter::shadow
//! [`AdaptiveLimit::shadow`]: crate::AdaptiveLimit::shadow
//! [`circuit_metrics`]: crate::Pipeline::circuit_metrics
//! [`EventKind::ShadowRejected`]: crate::EventKind::ShadowRejected
//! [`Pipeline::isolate`]: crate::Pipeline::isolate
//! [`Pipeline::open_for`]: crate::Pipeline::open_for

use crate::error::Rejection;
use crate::store::{Permit, ResourceSpec};

/// A stateful policy, as a bit of [`Shadow`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Policy {
    Circuit = 1,
    Bulkhead = 2,
    Cooldown = 4,
    Rate = 8,
}

/// The policies of a resource that run in shadow mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Shadow(u8);

impl Shadow {
    /// The policies of `spec` in shadow mode.
    pub(crate) fn of(spec: &ResourceSpec) -> Shadow {
        let mut bits = 0;
        if spec.circuit.as_ref().is_some_and(|c| c.shadow) {
            bits |= Policy::Circuit as u8;
        }
        if spec.bulkhead.as_ref().is_some_and(|b| b.shadow) {
            bits |= Policy::Bulkhead as u8;
        }
        if spec.cooldown.as_ref().is_some_and(|c| c.shadow) {
            bits |= Policy::Cooldown as u8;
        }
        if spec.rate_limit.as_ref().is_some_and(|r| r.shadow) {
            bits |= Policy::Rate as u8;
        }
        Shadow(bits)
    }

    /// `policy` runs in shadow mode.
    #[inline(always)]
    pub(crate) fn has(self, policy: Policy) -> bool {
        self.0 & policy as u8 != 0
    }

    /// Whether `policy` records the outcome of a call admitted with
    /// `permit`: not when it runs in shadow mode and the call was shadowed.
    #[inline(always)]
    pub(crate) fn records(self, policy: Policy, permit: &Permit) -> bool {
        !(permit.shadowed && self.has(policy))
    }
}

/// Whether a policy takes part in a call that is shadowed (`shadowed`)
/// or not: an enforcing one (`in_shadow` false) always, one in shadow
/// mode until the call is shadowed. One that does not take part is not
/// asked (a refusal would have ended the call before it), gives back what
/// it took and records nothing. The one statement of
/// [the rule](self#across-the-levels-of-a-pipeline), for every level.
#[inline(always)]
pub(crate) fn takes_part(in_shadow: bool, shadowed: bool) -> bool {
    !(shadowed && in_shadow)
}

/// An admission under way, through the policies in admission order: what
/// a refusal becomes (see [the rule](self#the-rule)).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Walk {
    shadow: Shadow,
    /// The call is shadowed (by this walk or before it).
    shadowed: bool,
    /// The refusal of a policy in shadow mode this walk met first.
    refusal: Option<Rejection>,
}

impl Walk {
    /// An admission through the policies of a resource whose policies in
    /// shadow mode are `shadow`, for a call `shadowed` already or not (by
    /// a policy in shadow mode it met before this resource: see
    /// [across the levels](self#across-the-levels-of-a-pipeline)). A
    /// resource without a policy in shadow mode takes no notice of it.
    #[inline(always)]
    pub(crate) fn new(shadow: Shadow, shadowed: bool) -> Walk {
        Walk {
            shadow,
            shadowed: shadowed && shadow.any(),
            refusal: None,
        }
    }

    /// Whether `policy` takes part in the call (see [`takes_part`]). One
    /// that does not take part is not asked and gives back what it took
    /// (it would have been given back on that refusal).
    #[inline(always)]
    pub(crate) fn takes_part(&self, policy: Policy) -> bool {
        takes_part(self.shadow.has(policy), self.shadowed)
    }

    /// `policy` refuses the call with `rejection`. `Err`: the admission
    /// ends with it (an enforcing policy). `Ok`: the call goes on, shadowed
    /// (a policy in shadow mode); the caller then gives back what the
    /// policies that no longer [take part](Self::takes_part) took for it.
    #[inline(always)]
    pub(crate) fn refused(
        &mut self,
        policy: Policy,
        rejection: Rejection,
    ) -> Result<(), Rejection> {
        if !self.shadow.has(policy) {
            return Err(rejection);
        }
        self.shadowed = true;
        self.refusal.get_or_insert(rejection);
        Ok(())
    }

    /// Whether the call is shadowed: the permit's
    /// [`shadowed`](Permit::shadowed).
    #[inline(always)]
    pub(crate) fn shadowed(&self) -> bool {
        self.shadowed
    }

    /// The refusal of a policy in shadow mode that this admission went on
    /// over, if any (none for a call shadowed before it: that refusal was
    /// reported where it happened).
    #[inline(always)]
    pub(crate) fn refusal(&self) -> Option<Rejection> {
        self.refusal
    }
}

impl Shadow {
    /// `permit`, admitted unshadowed, once its call is shadowed at a later
    /// level: what it keeps (shadowed: the policies in shadow mode will
    /// record nothing of it) and what the policies in shadow mode held for
    /// it, to give back now with
    /// [`ResourceState::release`](crate::store::ResourceState::release)
    /// (`None` when they held nothing).
    pub(crate) fn split(self, permit: Permit) -> (Permit, Option<Permit>) {
        let mut kept = permit;
        kept.shadowed = true;
        let mut given = Permit {
            probe: false,
            slot: None,
            ..permit
        };
        if self.has(Policy::Circuit) && permit.probe {
            kept.probe = false;
            given.probe = true;
        }
        if self.has(Policy::Bulkhead) {
            given.slot = kept.slot.take();
        }
        let holds = given.probe || given.slot.is_some();
        (kept, holds.then_some(given))
    }

    /// Whether any policy runs in shadow mode.
    #[inline(always)]
    pub(crate) fn any(self) -> bool {
        self.0 != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::RejectionReason;
    use crate::{Bulkhead, CircuitBreaker, RateLimiter};
    use std::time::Duration;

    #[test]
    fn the_first_shadow_refusal_is_kept_and_enforcing_refusals_end_the_walk() {
        let spec = ResourceSpec::new("r")
            .with_circuit(CircuitBreaker::consecutive_failures(1).shadow(true))
            .with_bulkhead(Bulkhead::new(1))
            .with_rate_limit(RateLimiter::gcra(1, Duration::from_secs(1)).shadow(true));
        let shadow = Shadow::of(&spec);
        assert!(shadow.has(Policy::Circuit) && shadow.has(Policy::Rate));
        assert!(!shadow.has(Policy::Bulkhead) && !shadow.has(Policy::Cooldown));
        let mut walk = Walk::new(shadow, false);
        assert!(walk.takes_part(Policy::Circuit));
        let open = Rejection::new(RejectionReason::CircuitOpen, Some(Duration::from_secs(3)));
        assert_eq!(walk.refused(Policy::Circuit, open), Ok(()));
        // Shadowed: the shadow limiter is not asked, the shadow circuit
        // gives back what it took, the enforcing bulkhead goes on.
        assert!(!walk.takes_part(Policy::Rate) && !walk.takes_part(Policy::Circuit));
        assert!(walk.takes_part(Policy::Bulkhead));
        let full = Rejection::new(RejectionReason::BulkheadFull, None);
        assert_eq!(walk.refused(Policy::Bulkhead, full), Err(full));
        assert_eq!(walk.refusal(), Some(open));
        assert!(walk.shadowed());
        let permit = Permit {
            shadowed: true,
            ..Permit::default()
        };
        assert!(!shadow.records(Policy::Circuit, &permit));
        assert!(shadow.records(Policy::Bulkhead, &permit));
        assert!(shadow.records(Policy::Circuit, &Permit::default()));
    }

    #[test]
    fn a_walk_of_a_call_shadowed_already_asks_only_the_enforcing_policies() {
        let spec = ResourceSpec::new("r")
            .with_circuit(CircuitBreaker::consecutive_failures(1).shadow(true))
            .with_bulkhead(Bulkhead::new(1))
            .with_rate_limit(RateLimiter::gcra(1, Duration::from_secs(1)).shadow(true));
        let walk = Walk::new(Shadow::of(&spec), true);
        assert!(walk.shadowed() && walk.refusal().is_none());
        assert!(!walk.takes_part(Policy::Circuit) && !walk.takes_part(Policy::Rate));
        assert!(walk.takes_part(Policy::Bulkhead));
        // Without a policy in shadow mode, the flag changes nothing.
        let enforcing = ResourceSpec::new("e").with_bulkhead(Bulkhead::new(1));
        assert!(!Walk::new(Shadow::of(&enforcing), true).shadowed());
        // The adaptive limit: the same rule.
        assert!(takes_part(false, true) && takes_part(true, false));
        assert!(!takes_part(true, true));
    }

    #[test]
    fn a_permit_split_gives_back_what_the_shadow_policies_hold() {
        let permit = Permit {
            probe: true,
            generation: 7,
            slot: Some(3),
            ..Permit::default()
        };
        let both = ResourceSpec::new("r")
            .with_circuit(CircuitBreaker::consecutive_failures(1).shadow(true))
            .with_bulkhead(Bulkhead::new(1).shadow(true));
        let (kept, given) = Shadow::of(&both).split(permit);
        assert!(kept.shadowed && !kept.probe && kept.slot.is_none());
        let given = given.expect("a probe and a slot to give back");
        assert!(given.probe && given.slot == Some(3) && given.generation == 7);
        // An enforcing bulkhead keeps its slot; a circuit in shadow mode
        // with no probe holds nothing.
        let circuit = ResourceSpec::new("c")
            .with_circuit(CircuitBreaker::consecutive_failures(1).shadow(true))
            .with_bulkhead(Bulkhead::new(1));
        let plain = Permit {
            probe: false,
            ..permit
        };
        let (kept, given) = Shadow::of(&circuit).split(plain);
        assert!(kept.shadowed && kept.slot == Some(3));
        assert_eq!(given, None);
    }
}
