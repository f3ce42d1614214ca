//! The cell of an adaptive limit: the rules ([`rules`](super::rules))
//! applied to the state of one pipeline in this process. Admission is
//! lock-free (a compare-and-swap on the count of calls in flight against
//! the published limit, the bulkhead's slot rule); the end of a call gives
//! its slot back and, most of the time, only joins its sample to the
//! update window under way, lock-free too ([`Window`]: until the time
//! [`rules::joins_until`] gives, a sample does nothing else). Any other
//! sample is applied to the limit under a short lock, with the window's
//! samples joined before it; the lock's holder then publishes the limit
//! admissions read.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::rules::{self, Sample, Signal, Spec, State};
use super::{AdaptiveLimit, LimitSnapshot};
use crate::bulkhead::queue::{Place, WaitQueue};
use crate::bulkhead::rules::{give_back, take};
use crate::clock::{ClockHandle, Random};
use crate::context::PartitionKey;
use crate::error::{Rejection, RejectionReason};

/// A call admitted by the limit: what its end needs to give back and to
/// make a sample of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lease {
    /// When it was admitted: a reading of the pipeline's clock
    /// ([`ClockHandle::ticks`]), unscaled.
    start: u64,
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
        start: 0,
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

/// What a limit found (its estimate, its baseline), under the settings
/// of its rules: a limit of the same settings can go on from it
/// ([`Limiter::resuming`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Learned {
    spec: Spec,
    state: State,
}

impl Learned {
    /// The limit found, as [`LimitSnapshot::limit`] reads it.
    #[cfg(feature = "serde")]
    pub(crate) fn limit(&self) -> u32 {
        rules::whole(self.state.limit)
    }
}

/// The adaptive limit of one pipeline, per process.
///
/// Laid out so that what every call reads and writes (`view`,
/// `in_flight`, `window`) shares one cache line, the first: threads
/// calling at once then move one line between them, not three.
#[repr(C, align(64))]
pub(crate) struct Limiter {
    /// What admissions read: the admitted limit (high half) and the
    /// measurement window (low half), published after each change.
    view: AtomicU64,
    in_flight: AtomicU32,
    window: Window,
    spec: Spec,
    /// The partitions' names and shares.
    shares: Box<[(Box<str>, f64)]>,
    /// Calls in flight of each partition.
    busy: Box<[AtomicU32]>,
    /// The limit's state; its update window lacks the samples joined in
    /// `window` since the lock's last holder took them.
    state: Mutex<State>,
    /// The queues of async calls waiting for a slot in this process, one
    /// per partition share and the last for calls of no share (`None`: no
    /// queue, or shadow mode).
    queues: Option<Box<[Arc<WaitQueue>]>>,
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
    /// The cell of a validated limit, for a pipeline on `clock`.
    #[cfg(test)]
    pub(crate) fn new(settings: &AdaptiveLimit, clock: &ClockHandle) -> Self {
        Self::resuming(settings, clock, None)
    }

    /// The cell of a validated limit that goes on from what `learned`
    /// found when its rules' settings are the same (its shadow mode, queue
    /// and partitions may differ); otherwise a new one.
    pub(crate) fn resuming(
        settings: &AdaptiveLimit,
        clock: &ClockHandle,
        learned: Option<&Learned>,
    ) -> Self {
        let spec = settings.spec();
        let state = learned
            .filter(|l| l.spec == spec)
            .map_or_else(|| rules::initial(&spec), |l| l.state);
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
            window: Window::default(),
            queues: (settings.max_queued > 0 && !settings.shadow).then(|| {
                (0..=settings.partitions.len())
                    .map(|_| Arc::new(WaitQueue::new(clock.clone())))
                    .collect()
            }),
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

    /// The queue of the calls of `key`'s share, if the limit has a queue.
    pub(crate) fn queue(&self, key: Option<&PartitionKey>) -> Option<&Arc<WaitQueue>> {
        let queues = self.queues.as_deref()?;
        queues
            .get(self.partition_of(key) as usize)
            .or(queues.last())
    }

    /// A call of `key` holding `place` in the limit's queue (if any) may
    /// ask for a slot: nobody waits in its queue, or its place was woken
    /// (see [`crate::bulkhead::queue`]). One branch without a queue.
    #[inline(always)]
    pub(crate) fn may_ask(&self, key: Option<&PartitionKey>, place: Option<&Place>) -> bool {
        match &self.queues {
            None => true,
            Some(_) => self.may_ask_queued(key, place),
        }
    }

    #[inline(never)]
    fn may_ask_queued(&self, key: Option<&PartitionKey>, place: Option<&Place>) -> bool {
        let Some(queue) = self.queue(key) else {
            return true;
        };
        if queue.is_empty() {
            return true;
        }
        place.is_some_and(|p| p.is_in(queue) && p.may_ask(false))
    }

    /// A slot of `partition` was given back: the oldest waiter of its
    /// share's queue asks for it, or, with none, the oldest of another
    /// queue (below the limit a slot is anyone's).
    #[cold]
    #[inline(never)]
    fn freed(&self, partition: u32) {
        let Some(queues) = self.queues.as_deref() else {
            return;
        };
        let own = (partition as usize).min(queues.len() - 1);
        if queues[own].release() {
            return;
        }
        for q in queues.iter().cycle().skip(own + 1).take(queues.len() - 1) {
            if q.release() {
                return;
            }
        }
    }

    /// The limit admits `more` calls than before: as many waiters ask.
    #[cold]
    #[inline(never)]
    fn raised(&self, more: u32) {
        let mut left = more;
        for q in self.queues.as_deref().unwrap_or_default() {
            left = q.wake(left);
        }
    }

    /// Admits a call when fewer calls than the limit are in flight, or,
    /// with partitions, when its partition has fewer than its share; an
    /// admitted call's latency is measured from now, on `clock`.
    #[inline(always)]
    pub(crate) fn acquire(
        &self,
        key: Option<&PartitionKey>,
        clock: &ClockHandle,
    ) -> Result<Lease, Rejection> {
        // Read before the compare-and-swap, not after: read right after
        // the locked instruction, the time-stamp counter cost 12 ns more
        // an async call (criterion, `peers`, 1 thread). A refused call
        // reads it for nothing.
        let start = clock.ticks();
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
            start,
            in_flight,
            window,
            partition,
        })
    }

    /// Gives the slot of `lease` back and applies the call's sample: it
    /// ended with `signal` at `end`, a reading of `clock`
    /// ([`ClockHandle::ticks`], the clock the lease was taken on). Returns
    /// the estimated limit before and after, when it changed.
    ///
    /// The latency is the distance between the two readings, scaled once;
    /// the end is scaled only when the sample does more than join the
    /// window (the window's bound is a reading: see [`Window`]).
    #[inline(always)]
    pub(crate) fn release(
        &self,
        lease: Lease,
        signal: Signal,
        end: u64,
        clock: &ClockHandle,
        random: &dyn Random,
    ) -> Option<(u32, u32)> {
        let rtt = clock.nanos_between(lease.start, end);
        self.sample(lease, signal, rtt, end, clock, random)
    }

    /// [`release`](Self::release) of a sample of `rtt` nanoseconds.
    ///
    /// Inlined into the call's end: most samples only join the window
    /// ([`Window::try_join`]); the others go to [`apply`](Self::apply),
    /// out of line, so that the common case pays for no call and saves no
    /// registers.
    #[inline(always)]
    fn sample(
        &self,
        lease: Lease,
        signal: Signal,
        rtt: u64,
        end: u64,
        clock: &ClockHandle,
        random: &dyn Random,
    ) -> Option<(u32, u32)> {
        if !lease.is_held() {
            return None;
        }
        self.free(lease);
        if signal == Signal::Ignored {
            return None;
        }
        if self
            .window
            .try_join(rtt, lease.in_flight, signal == Signal::Dropped, end)
        {
            // The limit stays: admissions read the same.
            return None;
        }
        self.apply(lease, signal, rtt, clock.nanos_at(end), clock, random)
    }

    /// Applies a sample that does not only join the window (see
    /// [`release`](Self::release)) under the lock.
    #[inline(never)]
    fn apply(
        &self,
        lease: Lease,
        signal: Signal,
        rtt: u64,
        now: u64,
        clock: &ClockHandle,
        random: &dyn Random,
    ) -> Option<(u32, u32)> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        // The samples joined since the last holder, before this one.
        let joined = self.window.take();
        let before = State {
            gathered: state.gathered.absorb(&joined),
            ..*state
        };
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
        // The bound as a reading of the clock: a sample's end is compared
        // with it unscaled.
        let until = clock.first_reading_at(rules::joins_until(&self.spec, &after));
        self.window.reopen(until);
        // Most samples only join the update window: what admissions read
        // changes with the limit or a measurement beginning or ending.
        if after.limit == before.limit && rules::window(&after) == rules::window(&before) {
            return None;
        }
        let admitted = rules::admitted_limit(&self.spec, &after);
        let view = pack(admitted, rules::window(&after));
        self.view.store(view, Ordering::Release);
        drop(state);
        let before_admitted = rules::admitted_limit(&self.spec, &before);
        if admitted > before_admitted && self.queues.is_some() {
            self.raised(admitted - before_admitted);
        }
        let (from, to) = (rules::whole(before.limit), rules::whole(after.limit));
        (from != to).then_some((from, to))
    }

    /// Gives the slot of `lease` back without a sample (a call dropped by
    /// its caller, refused by a later policy).
    #[inline]
    pub(crate) fn give_back(&self, lease: Lease) {
        if lease.is_held() {
            self.free(lease);
        }
    }

    /// Frees the slot of a lease that holds one.
    #[inline(always)]
    fn free(&self, lease: Lease) {
        let _ = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| Some(give_back(n)));
        if let Some(busy) = self.busy.get(lease.partition as usize) {
            let _ = busy.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| Some(give_back(n)));
        }
        if self.queues.is_some() {
            self.freed(lease.partition);
        }
    }

    /// What the limit found so far, for a limit that replaces it.
    #[cfg(feature = "serde")]
    pub(crate) fn learned(&self) -> Learned {
        Learned {
            spec: self.spec,
            state: *self.state.lock().unwrap_or_else(PoisonError::into_inner),
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

/// The samples joined to the update window without the lock, since its
/// holder last took them: a sample that ends before `until` (the first
/// reading of the clock at [`rules::joins_until`], so that a reading
/// before it is a time before that) adds its latency and its count to `joined` in
/// one compare-and-swap, and its calls in flight to `in_flight`
/// ([`Gathered::join`](rules::Gathered::join) on atomics); the holder of
/// the lock takes them ([`take`](Self::take)) before it applies a sample
/// of its own. Taking swaps `joined` for [`CLOSED`] in one step, so a
/// sample is in the window whole or not at all, and nobody waits: a join
/// that finds the window closed is applied under the lock instead. A drop
/// is always applied under the lock (it is rare, and applying it is the
/// same as joining it, by the rule).
#[derive(Debug, Default)]
struct Window {
    /// Samples ending before this reading of the clock may join (0: none
    /// may).
    until: AtomicU64,
    /// The samples joined: their count above [`SUM_BITS`], the sum of their
    /// latencies below; [`CLOSED`] while none may join.
    joined: AtomicU64,
    /// The most calls in flight of a sample joined (or applied since).
    in_flight: AtomicU32,
}

/// The window is closed to joins.
const CLOSED: u64 = 1 << 63;
/// The low bits of [`Window::joined`]: the sum of the latencies joined, in
/// nanoseconds (at most about 73 minutes; a sample that would pass it is
/// applied under the lock).
const SUM_BITS: u32 = 42;
const SUM_MASK: u64 = (1 << SUM_BITS) - 1;
/// One sample, in [`Window::joined`].
const ONE_SAMPLE: u64 = 1 << SUM_BITS;
/// At most this many samples join (the count's bits stay below
/// [`CLOSED`]); the next is applied under the lock.
const MAX_JOINED: u64 = (1 << (63 - SUM_BITS)) - 1;

impl Window {
    /// Joins a sample that ended at `end` (a reading of the clock) when it
    /// only joins the window: `false` when the lock's holder must apply it.
    #[inline(always)]
    fn try_join(&self, rtt: u64, in_flight: u32, dropped: bool, end: u64) -> bool {
        if dropped || end >= self.until.load(Ordering::Acquire) || rtt > SUM_MASK {
            return false;
        }
        // Before the sample joins, so that the holder who takes it takes
        // this too. Should the join fail, the call was in flight in the
        // window all the same.
        if in_flight > self.in_flight.load(Ordering::Relaxed) {
            self.in_flight.fetch_max(in_flight, Ordering::Relaxed);
        }
        let mut joined = self.joined.load(Ordering::Relaxed);
        loop {
            if joined & CLOSED != 0
                || joined >> SUM_BITS >= MAX_JOINED
                || (joined & SUM_MASK) + rtt > SUM_MASK
            {
                return false;
            }
            match self.joined.compare_exchange_weak(
                joined,
                joined + ONE_SAMPLE + rtt,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => joined = actual,
            }
        }
    }

    /// The samples joined since the last call, taken out of the window,
    /// which stays closed to joins until [`reopen`](Self::reopen). Called
    /// under the limit's lock.
    fn take(&self) -> rules::Gathered {
        let joined = self.joined.swap(CLOSED, Ordering::AcqRel);
        // Closed already: nothing joined since.
        let joined = if joined & CLOSED != 0 { 0 } else { joined };
        rules::Gathered {
            opened: None,
            sum: joined & SUM_MASK,
            samples: (joined >> SUM_BITS) as u32,
            in_flight: self.in_flight.swap(0, Ordering::Relaxed),
            dropped: false,
        }
    }

    /// Opens the window to the samples ending before `until` again (none
    /// when it is 0: the window stays closed, so that a join that read an
    /// earlier `until` does not slip in). Called under the limit's lock,
    /// after [`take`](Self::take).
    fn reopen(&self, until: u64) {
        self.until.store(until, Ordering::Release);
        if until != 0 {
            self.joined.store(0, Ordering::Release);
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
    use crate::testing::VirtualClock;

    impl Limiter {
        /// [`acquire`](Limiter::acquire) on a virtual clock, whose readings
        /// are nanoseconds.
        fn admit(&self, key: Option<&PartitionKey>) -> Result<Lease, Rejection> {
            self.acquire(key, &ClockHandle::from_clock(VirtualClock::new()))
        }

        /// The end of a call of `rtt` nanoseconds at `now` (nanoseconds,
        /// the readings of a virtual clock).
        fn end(
            &self,
            lease: Lease,
            signal: Signal,
            rtt: u64,
            now: u64,
            random: &dyn Random,
        ) -> Option<(u32, u32)> {
            let clock = ClockHandle::from_clock(VirtualClock::new());
            self.sample(lease, signal, rtt, now, &clock, random)
        }
    }

    #[test]
    fn admits_up_to_the_limit_and_partitions_up_to_their_share() {
        let l = Limiter::new(
            &AdaptiveLimit::aimd().limits(10, 10, 20),
            &ClockHandle::System,
        );
        let leases: Vec<_> = (0..10).map(|_| l.admit(None).unwrap()).collect();
        assert_eq!(leases[9].in_flight, 10);
        let r = l.admit(None).unwrap_err();
        assert_eq!(r.reason, RejectionReason::ConcurrencyLimited);
        l.give_back(leases[0]);
        assert!(l.admit(None).is_ok());

        let l = Limiter::new(
            &AdaptiveLimit::aimd()
                .limits(10, 10, 20)
                .partition("live", 0.9)
                .partition("batch", 0.1),
            &ClockHandle::System,
        );
        let batch = PartitionKey::from("batch");
        let live = PartitionKey::from("live");
        // Spare capacity is anyone's: batch takes all ten.
        let held: Vec<_> = (0..10).map(|_| l.admit(Some(&batch)).unwrap()).collect();
        assert!(l.admit(Some(&batch)).is_err());
        assert!(l.admit(None).is_err());
        // Live still has its share of nine.
        let lives: Vec<_> = (0..9).map(|_| l.admit(Some(&live)).unwrap()).collect();
        assert!(l.admit(Some(&live)).is_err());
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
            let cell = Limiter::new(&settings, &ClockHandle::System);
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
                        let got = cell.admit(key);
                        proptest::prop_assert_eq!(got.is_ok(), admits, "{:?} at {} {:?}", p, total, busy);
                        if let Ok(lease) = got {
                            total += 1;
                            if let Some(i) = p {
                                busy[i] += 1;
                            }
                            proptest::prop_assert_eq!(lease.in_flight, total);
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
                proptest::prop_assert_eq!(cell.snapshot().in_flight, total);
            }
        });
    }

    impl Limiter {
        /// The state with the samples joined without the lock absorbed:
        /// what the rules applied to every sample in turn give.
        fn settled(&self) -> State {
            let mut state = self.state.lock().unwrap();
            let joined = self.window.take();
            state.gathered = state.gathered.absorb(&joined);
            self.window.reopen(rules::joins_until(&self.spec, &state));
            *state
        }
    }

    proptest::proptest! {
        /// The cell decides as the rules applied to every sample in turn
        /// (the reference), whether a sample joined the window without the
        /// lock or not: the same changes of the limit reported, the same
        /// limit admitted, the same state; AIMD, Vegas and Gradient2, clocks
        /// from 0 and 10^6 s.
        #[test]
        fn the_cell_applies_the_rules_to_every_sample_in_turn(
            which in 0usize..3,
            update_ms in 1u64..30,
            base in proptest::sample::select(vec![0u64, 1_000_000_000_000_000]),
            steps in proptest::collection::vec((0u64..8_000, 1u64..40_000, 0u8..10, 0u32..4), 1..300),
        ) {
            let ms = Duration::from_millis;
            let settings = match which {
                0 => AdaptiveLimit::aimd().rtt_timeout(ms(20)),
                1 => AdaptiveLimit::vegas().min_rtt(ms(50), 2, 2),
                _ => AdaptiveLimit::gradient2().min_rtt(ms(50), 2, 2),
            }
            .limits(2, 6, 40)
            .update_interval(ms(update_ms));
            let cell = Limiter::new(&settings, &ClockHandle::System);
            let (random, model_random) = (SeededRandom::new(7), SeededRandom::new(7));
            let mut model = rules::initial(&cell.spec);
            let mut now = base;
            let mut held = Vec::new();
            for (step_us, rtt_us, kind, ends) in steps {
                now += step_us * 1_000;
                // A few calls in flight at once, so that samples carry
                // different counts; refused ones are skipped.
                if let Ok(lease) = cell.admit(None) {
                    proptest::prop_assert_eq!(lease.window, rules::window(&model));
                    held.push(lease);
                }
                for _ in 0..ends.min(held.len() as u32) {
                    let lease = held.remove(0);
                    let signal = match kind {
                        0 => Signal::Dropped,
                        1 => Signal::Ignored,
                        _ => Signal::Success,
                    };
                    let rtt = rtt_us * 1_000;
                    let got = cell.end(lease, signal, rtt, now, &random);
                    let before = model;
                    if signal != Signal::Ignored {
                        let sample = Sample {
                            rtt,
                            in_flight: lease.in_flight,
                            signal,
                            window: lease.window,
                            now,
                            draw: if rules::draws(&before) { model_random.next_f64() } else { 0.0 },
                        };
                        model = rules::update(&cell.spec, before, &sample);
                    }
                    let (from, to) = (rules::whole(before.limit), rules::whole(model.limit));
                    proptest::prop_assert_eq!(got, (from != to).then_some((from, to)), "at {}", now);
                    proptest::prop_assert_eq!(cell.snapshot().admitted, rules::admitted_limit(&cell.spec, &model));
                }
            }
            proptest::prop_assert_eq!(cell.settled(), model);
        }
    }

    /// On the system clock the cell compares raw readings with the
    /// window's bound turned into a reading: the samples ending at the
    /// readings just before the bound join without the lock, the one at
    /// the bound closes the window, and the cell decides as the rules
    /// applied to the scaled readings (the latency the distance between
    /// them, the end its time).
    #[test]
    fn on_the_system_clock_the_cell_decides_on_the_scaled_readings() {
        let clock = ClockHandle::System;
        let l = Limiter::new(
            &AdaptiveLimit::aimd()
                .limits(10, 10, 20)
                .update_interval(Duration::from_millis(1)),
            &ClockHandle::System,
        );
        let random = SeededRandom::new(1);
        let mut model = rules::initial(&l.spec);
        let mut release = |start: u64, end: u64, joins: bool| {
            let lease = Lease {
                start,
                ..l.acquire(None, &clock).unwrap()
            };
            let before = model;
            let sample = Sample {
                rtt: clock.nanos_between(start, end),
                in_flight: lease.in_flight,
                signal: Signal::Success,
                window: lease.window,
                now: clock.nanos_at(end),
                draw: 0.0,
            };
            model = rules::update(&l.spec, before, &sample);
            let got = l.release(lease, Signal::Success, end, &clock, &random);
            let (from, to) = (rules::whole(before.limit), rules::whole(model.limit));
            assert_eq!(got, (from != to).then_some((from, to)));
            let joined = l.window.joined.load(Ordering::Acquire);
            assert_eq!(joined & CLOSED == 0 && joined >> SUM_BITS > 0, joins);
        };
        let opened = clock.ticks() + 1_000;
        // Opens the window (under the lock).
        release(opened - 500, opened, false);
        let bound = clock.first_reading_at(clock.nanos_at(opened) + 1_000_000);
        assert_eq!(l.window.until.load(Ordering::Acquire), bound);
        release(opened, bound - 2, true);
        release(opened + 7, bound - 1, true);
        // At the bound: a millisecond after the window opened, it closes.
        release(opened + 9, bound, false);
        assert_eq!(l.settled(), model);
        assert_eq!(model.gathered, rules::Gathered::default());
    }

    /// Latencies whose sum would not fit the joined word are applied
    /// under the lock: the window's sum stays exact.
    #[test]
    fn latencies_too_long_to_join_are_applied_under_the_lock() {
        let l = Limiter::new(
            &AdaptiveLimit::aimd()
                .limits(10, 10, 10)
                .rtt_timeout(Duration::from_secs(1 << 20))
                .update_interval(Duration::from_secs(1 << 20)),
            &ClockHandle::System,
        );
        let random = SeededRandom::new(1);
        let long = 1u64 << 41;
        let mut model = rules::initial(&l.spec);
        for (i, rtt) in [1, long, long, long, 5, SUM_MASK + 1, 7]
            .into_iter()
            .enumerate()
        {
            let lease = l.admit(None).unwrap();
            let now = 1_000 + i as u64;
            l.end(lease, Signal::Success, rtt, now, &random);
            let sample = Sample {
                rtt,
                in_flight: lease.in_flight,
                signal: Signal::Success,
                window: lease.window,
                now,
                draw: 0.0,
            };
            model = rules::update(&l.spec, model, &sample);
        }
        let settled = l.settled();
        assert_eq!(settled, model);
        assert_eq!(settled.gathered.samples, 7);
        assert_eq!(settled.gathered.sum, 1 + 3 * long + 5 + SUM_MASK + 1 + 7);
    }

    #[test]
    fn samples_joined_by_many_threads_are_all_in_the_window() {
        let l = Limiter::new(
            &AdaptiveLimit::aimd()
                .limits(1_000, 1_000, 1_000)
                .update_interval(Duration::from_secs(1)),
            &ClockHandle::System,
        );
        let random = SeededRandom::new(1);
        // The first sample opens the window (at 5 s), under the lock.
        l.end(
            l.admit(None).unwrap(),
            Signal::Success,
            1,
            5_000_000_000,
            &random,
        );
        let (threads, each) = (8u32, 2_000u32);
        std::thread::scope(|s| {
            for t in 0..threads {
                let (l, random) = (&l, &random);
                s.spawn(move || {
                    for i in 0..each {
                        let lease = l.admit(None).unwrap();
                        let signal = if t == 3 && i == 7 {
                            Signal::Dropped
                        } else {
                            Signal::Success
                        };
                        // Every sample inside the window (5 s to 6 s).
                        let now = 5_000_000_000 + u64::from(i) * 1_000;
                        assert_eq!(l.end(lease, signal, 2 + u64::from(t), now, random), None);
                    }
                });
            }
        });
        let g = l.settled().gathered;
        assert_eq!(g.opened, Some(5_000_000_000));
        assert_eq!(g.samples, 1 + threads * each);
        let sum: u64 = (0..u64::from(threads))
            .map(|t| (2 + t) * u64::from(each))
            .sum();
        assert_eq!(g.sum, 1 + sum);
        assert!(g.dropped);
        assert!((1..=threads).contains(&g.in_flight), "{}", g.in_flight);
        assert_eq!(l.snapshot().in_flight, 0);
    }

    #[test]
    fn many_threads_never_exceed_the_limit() {
        let l = Arc::new(Limiter::new(
            &AdaptiveLimit::aimd().limits(8, 8, 8),
            &ClockHandle::System,
        ));
        let peak = Arc::new(AtomicU32::new(0));
        let random = SeededRandom::new(1);
        std::thread::scope(|s| {
            for _ in 0..8 {
                let (l, peak, random) = (&l, &peak, &random);
                s.spawn(move || {
                    for _ in 0..2_000 {
                        if let Ok(lease) = l.admit(None) {
                            let now = l.in_flight.load(Ordering::Acquire);
                            peak.fetch_max(now, Ordering::Relaxed);
                            l.end(lease, Signal::Success, 1, 1, random);
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
            &ClockHandle::System,
        );
        let random = SeededRandom::new(1);
        let ms = 1_000_000;
        let lease = l.admit(None).unwrap();
        // One in flight of ten, the window still open.
        assert_eq!(l.end(lease, Signal::Success, 1, ms, &random), None);
        let leases: Vec<_> = (0..5).map(|_| l.admit(None).unwrap()).collect();
        // The window closes: five in flight at most, half the limit.
        assert_eq!(
            l.end(leases[4], Signal::Success, 1, 2 * ms, &random),
            Some((10, 11))
        );
        assert_eq!(l.snapshot().admitted, 11);
        assert_eq!(l.end(leases[0], Signal::Ignored, 1, 9 * ms, &random), None);
        assert_eq!(l.snapshot().in_flight, 3);
    }
}
