//! The cell of an adaptive limit: the rules ([`rules`](super::rules))
//! applied to the state of one pipeline in this process. Admission is
//! lock-free (a compare-and-swap on the count of calls in flight against
//! the published limit, the bulkhead's slot rule); the end of a call gives
//! its slot back and applies the sample to the limit under a short lock,
//! then publishes the limit admissions read.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::rules::{self, Sample, Signal, Spec, State};
use super::{AdaptiveLimit, LimitSnapshot};
use crate::bulkhead::rules::{give_back, take};
use crate::clock::Random;
use crate::context::PartitionKey;
use crate::error::{Rejection, RejectionReason};

/// A call admitted by the limit: what its end needs to give back and to
/// make a sample of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lease {
    /// Calls in flight when it was admitted, itself included.
    in_flight: u32,
    /// The measurement window it was admitted in (0: none).
    window: u32,
    /// Its partition (`NO_PARTITION`: none).
    partition: u32,
}

const NO_PARTITION: u32 = u32::MAX;

impl Lease {
    /// What an attempt admitted over the limit in shadow mode holds:
    /// nothing to give back, no sample to make.
    pub(crate) const UNHELD: Lease = Lease {
        in_flight: 0,
        window: 0,
        partition: NO_PARTITION,
    };

    /// The lease holds a slot (every lease but [`UNHELD`](Self::UNHELD)).
    #[inline(always)]
    fn is_held(self) -> bool {
        self.in_flight != 0
    }
}

/// The adaptive limit of one pipeline, per process.
pub(crate) struct Limiter {
    spec: Spec,
    /// The partitions' names and shares.
    shares: Box<[(Box<str>, f64)]>,
    /// What admissions read: the admitted limit (high half) and the
    /// measurement window (low half), published after each change.
    view: AtomicU64,
    in_flight: AtomicU32,
    /// Calls in flight of each partition.
    busy: Box<[AtomicU32]>,
    state: Mutex<State>,
    /// Async calls queued for a slot in this process.
    pub(crate) waiters: AtomicU32,
    pub(crate) max_queued: u32,
    pub(crate) max_wait: Duration,
    /// Shadow mode: an attempt over the limit runs without a slot.
    shadow: bool,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("spec", &self.spec)
            .field("snapshot", &self.snapshot())
            .finish()
    }
}

fn pack(limit: u32, window: u32) -> u64 {
    (u64::from(limit) << 32) | u64::from(window)
}

impl Limiter {
    /// The cell of a validated limit.
    pub(crate) fn new(settings: &AdaptiveLimit) -> Self {
        let spec = settings.spec();
        let state = rules::initial(&spec);
        let shares: Box<[(Box<str>, f64)]> = settings
            .partitions
            .iter()
            .map(|(n, s)| (n.as_str().into(), *s))
            .collect();
        Limiter {
            view: AtomicU64::new(pack(
                rules::admitted_limit(&spec, &state),
                rules::window(&state),
            )),
            in_flight: AtomicU32::new(0),
            busy: shares.iter().map(|_| AtomicU32::new(0)).collect(),
            shares,
            spec,
            state: Mutex::new(state),
            waiters: AtomicU32::new(0),
            max_queued: settings.max_queued,
            max_wait: settings.max_wait,
            shadow: settings.shadow,
        }
    }

    /// The limit is in shadow mode: it reports, never refuses.
    #[inline(always)]
    pub(crate) fn shadow(&self) -> bool {
        self.shadow
    }

    /// The partition of a call: the index of the share its key names.
    fn partition_of(&self, key: Option<&PartitionKey>) -> u32 {
        if self.shares.is_empty() {
            return NO_PARTITION;
        }
        let Some(name) = key.and_then(PartitionKey::as_str) else {
            return NO_PARTITION;
        };
        self.shares
            .iter()
            .position(|(n, _)| &**n == name)
            .map_or(NO_PARTITION, |i| i as u32)
    }

    /// Admits a call when fewer calls than the limit are in flight, or,
    /// with partitions, when its partition has fewer than its share.
    #[inline]
    pub(crate) fn acquire(&self, key: Option<&PartitionKey>) -> Result<Lease, Rejection> {
        let view = self.view.load(Ordering::Acquire);
        let (limit, window) = ((view >> 32) as u32, view as u32);
        let partition = if self.busy.is_empty() {
            NO_PARTITION
        } else {
            self.partition_of(key)
        };
        let taken = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| take(n, limit));
        let in_flight = match taken {
            Ok(before) => {
                if let Some(busy) = self.busy.get(partition as usize) {
                    busy.fetch_add(1, Ordering::AcqRel);
                }
                before + 1
            }
            Err(_) => {
                // Over the limit: a partition may still use its share.
                let Some(busy) = self.busy.get(partition as usize) else {
                    return Err(refusal());
                };
                let share = rules::share_limit(limit, Some(self.shares[partition as usize].1));
                busy.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| take(n, share))
                    .map_err(|_| refusal())?;
                self.in_flight.fetch_add(1, Ordering::AcqRel) + 1
            }
        };
        Ok(Lease {
            in_flight,
            window,
            partition,
        })
    }

    /// Gives the slot of `lease` back and applies the call's sample: it
    /// ran `rtt` nanoseconds and ended at `now` with `signal`. Returns the
    /// estimated limit before and after, when it changed.
    #[inline]
    pub(crate) fn release(
        &self,
        lease: Lease,
        signal: Signal,
        rtt: u64,
        now: u64,
        random: &dyn Random,
    ) -> Option<(u32, u32)> {
        if !lease.is_held() {
            return None;
        }
        self.give_back(lease);
        if signal == Signal::Ignored {
            return None;
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let before = *state;
        let sample = Sample {
            rtt,
            in_flight: lease.in_flight,
            signal,
            window: lease.window,
            now,
            draw: if rules::draws(&before) {
                random.next_f64()
            } else {
                0.0
            },
        };
        let after = rules::update(&self.spec, before, &sample);
        *state = after;
        // Most samples only join the update window: what admissions read
        // changes with the limit or a measurement beginning or ending.
        if after.limit == before.limit && rules::window(&after) == rules::window(&before) {
            return None;
        }
        let view = pack(
            rules::admitted_limit(&self.spec, &after),
            rules::window(&after),
        );
        self.view.store(view, Ordering::Release);
        drop(state);
        let (from, to) = (rules::whole(before.limit), rules::whole(after.limit));
        (from != to).then_some((from, to))
    }

    /// Gives the slot of `lease` back without a sample (a call dropped by
    /// its caller, refused by a later policy).
    #[inline]
    pub(crate) fn give_back(&self, lease: Lease) {
        if !lease.is_held() {
            return;
        }
        let _ = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| Some(give_back(n)));
        if let Some(busy) = self.busy.get(lease.partition as usize) {
            let _ = busy.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| Some(give_back(n)));
        }
    }

    /// The limit now.
    pub(crate) fn snapshot(&self) -> LimitSnapshot {
        let state = *self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (baseline, measuring) = match state.baseline {
            rules::Baseline::Unused => (None, false),
            rules::Baseline::Measuring { .. } => (None, true),
            rules::Baseline::Known { rtt, .. } => (Some(Duration::from_nanos(rtt)), false),
        };
        LimitSnapshot {
            limit: rules::whole(state.limit),
            admitted: rules::admitted_limit(&self.spec, &state),
            in_flight: self.in_flight.load(Ordering::Acquire),
            baseline,
            measuring,
        }
    }
}

fn refusal() -> Rejection {
    Rejection::new(RejectionReason::ConcurrencyLimited, None)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::clock::SeededRandom;

    #[test]
    fn admits_up_to_the_limit_and_partitions_up_to_their_share() {
        let l = Limiter::new(&AdaptiveLimit::aimd().limits(10, 10, 20));
        let leases: Vec<_> = (0..10).map(|_| l.acquire(None).unwrap()).collect();
        assert_eq!(leases[9].in_flight, 10);
        let r = l.acquire(None).unwrap_err();
        assert_eq!(r.reason, RejectionReason::ConcurrencyLimited);
        l.give_back(leases[0]);
        assert!(l.acquire(None).is_ok());

        let l = Limiter::new(
            &AdaptiveLimit::aimd()
                .limits(10, 10, 20)
                .partition("live", 0.9)
                .partition("batch", 0.1),
        );
        let batch = PartitionKey::from("batch");
        let live = PartitionKey::from("live");
        // Spare capacity is anyone's: batch takes all ten.
        let held: Vec<_> = (0..10).map(|_| l.acquire(Some(&batch)).unwrap()).collect();
        assert!(l.acquire(Some(&batch)).is_err());
        assert!(l.acquire(None).is_err());
        // Live still has its share of nine.
        let lives: Vec<_> = (0..9).map(|_| l.acquire(Some(&live)).unwrap()).collect();
        assert!(l.acquire(Some(&live)).is_err());
        assert_eq!(l.snapshot().in_flight, 19);
        for x in held.into_iter().chain(lives) {
            l.give_back(x);
        }
        assert_eq!(l.snapshot().in_flight, 0);
    }

    /// The cell's admissions against a plain model of the partition rule
    /// (below the limit anyone; at it, a partition below
    /// `ceil(limit x share)`), on random sequences of admissions and
    /// releases.
    #[test]
    fn admissions_agree_with_a_model_of_the_shares() {
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            Acquire(Option<usize>),
            Release(usize),
        }
        let op = prop_oneof![
            3 => proptest::option::of(0usize..3).prop_map(Op::Acquire),
            2 => any::<usize>().prop_map(Op::Release),
        ];
        let shares = [("live", 0.7), ("batch", 0.2), ("rest", 0.1)];
        proptest!(|(limit in 1u32..12, ops in proptest::collection::vec(op, 0..80))| {
            let mut settings = AdaptiveLimit::aimd().limits(limit, limit, limit);
            for (name, share) in shares {
                settings = settings.partition(name, share);
            }
            let cell = Limiter::new(&settings);
            let keys: Vec<PartitionKey> = shares.iter().map(|(n, _)| PartitionKey::from(*n)).collect();
            let (mut total, mut busy) = (0u32, [0u32; 3]);
            let mut held: Vec<(Lease, Option<usize>)> = Vec::new();
            for op in ops {
                match op {
                    Op::Acquire(p) => {
                        let key = p.map(|i| &keys[i]);
                        let admits = total < limit
                            || p.is_some_and(|i| {
                                let share = (f64::from(limit) * shares[i].1).ceil().max(1.0);
                                f64::from(busy[i]) < share
                            });
                        let got = cell.acquire(key);
                        prop_assert_eq!(got.is_ok(), admits, "{:?} at {} {:?}", p, total, busy);
                        if let Ok(lease) = got {
                            total += 1;
                            if let Some(i) = p {
                                busy[i] += 1;
                            }
                            prop_assert_eq!(lease.in_flight, total);
                            held.push((lease, p));
                        }
                    }
                    Op::Release(k) if !held.is_empty() => {
                        let (lease, p) = held.swap_remove(k % held.len());
                        cell.give_back(lease);
                        total -= 1;
                        if let Some(i) = p {
                            busy[i] -= 1;
                        }
                    }
                    Op::Release(_) => {}
                }
                prop_assert_eq!(cell.snapshot().in_flight, total);
            }
        });
    }

    #[test]
    fn many_threads_never_exceed_the_limit() {
        let l = Arc::new(Limiter::new(&AdaptiveLimit::aimd().limits(8, 8, 8)));
        let peak = Arc::new(AtomicU32::new(0));
        let random = SeededRandom::new(1);
        std::thread::scope(|s| {
            for _ in 0..8 {
                let (l, peak, random) = (&l, &peak, &random);
                s.spawn(move || {
                    for _ in 0..2_000 {
                        if let Ok(lease) = l.acquire(None) {
                            let now = l.in_flight.load(Ordering::Acquire);
                            peak.fetch_max(now, Ordering::Relaxed);
                            l.release(lease, Signal::Success, 1, 1, random);
                        }
                    }
                });
            }
        });
        assert!(peak.load(Ordering::Relaxed) <= 8);
        assert_eq!(l.snapshot().in_flight, 0);
    }

    #[test]
    fn a_release_reports_a_change_of_the_limit() {
        let l = Limiter::new(
            &AdaptiveLimit::aimd()
                .limits(10, 10, 20)
                .update_interval(Duration::from_millis(1)),
        );
        let random = SeededRandom::new(1);
        let ms = 1_000_000;
        let lease = l.acquire(None).unwrap();
        // One in flight of ten, the window still open.
        assert_eq!(l.release(lease, Signal::Success, 1, ms, &random), None);
        let leases: Vec<_> = (0..5).map(|_| l.acquire(None).unwrap()).collect();
        // The window closes: five in flight at most, half the limit.
        assert_eq!(
            l.release(leases[4], Signal::Success, 1, 2 * ms, &random),
            Some((10, 11))
        );
        assert_eq!(l.snapshot().admitted, 11);
        assert_eq!(
            l.release(leases[0], Signal::Ignored, 1, 9 * ms, &random),
            None
        );
        assert_eq!(l.snapshot().in_flight, 3);
    }
}
