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
//! This rule is stated once, by the memory store's admission (this
//! module's `Walk`); the Redis store's script restates it and the model
//! tests (`seawall::model::resource`) check both against a plain
//! statement of it.
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

/// An admission under way, through the policies in admission order: what
/// a refusal becomes (see [the rule](self#the-rule)).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Walk {
    shadow: Shadow,
    shadowed: Option<Rejection>,
}

impl Walk {
    /// An admission through the policies of a resource whose policies in
    /// shadow mode are `shadow`.
    #[inline(always)]
    pub(crate) fn new(shadow: Shadow) -> Walk {
        Walk {
            shadow,
            shadowed: None,
        }
    }

    /// Whether `policy` takes part in the call: an enforcing policy
    /// always; a policy in shadow mode until the call is shadowed. One
    /// that does not take part is not asked (a refusal would have ended
    /// the admission before it) and gives back what it took (it would have
    /// been given back on that refusal).
    #[inline(always)]
    pub(crate) fn takes_part(&self, policy: Policy) -> bool {
        self.shadowed.is_none() || !self.shadow.has(policy)
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
        self.shadowed.get_or_insert(rejection);
        Ok(())
    }

    /// The refusal of a policy in shadow mode that the call was admitted
    /// over, if any.
    #[inline(always)]
    pub(crate) fn shadowed(&self) -> Option<Rejection> {
        self.shadowed
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
        let mut walk = Walk::new(shadow);
        assert!(walk.takes_part(Policy::Circuit));
        let open = Rejection::new(RejectionReason::CircuitOpen, Some(Duration::from_secs(3)));
        assert_eq!(walk.refused(Policy::Circuit, open), Ok(()));
        // Shadowed: the shadow limiter is not asked, the shadow circuit
        // gives back what it took, the enforcing bulkhead goes on.
        assert!(!walk.takes_part(Policy::Rate) && !walk.takes_part(Policy::Circuit));
        assert!(walk.takes_part(Policy::Bulkhead));
        let full = Rejection::new(RejectionReason::BulkheadFull, None);
        assert_eq!(walk.refused(Policy::Bulkhead, full), Err(full));
        assert_eq!(walk.shadowed(), Some(open));
        let permit = Permit {
            shadowed: true,
            ..Permit::default()
        };
        assert!(!shadow.records(Policy::Circuit, &permit));
        assert!(shadow.records(Policy::Bulkhead, &permit));
        assert!(shadow.records(Policy::Circuit, &Permit::default()));
    }
}
