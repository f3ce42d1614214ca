//! The queue of calls waiting in this process for a slot: one FIFO type
//! ([`WaitQueue`]) for the bulkhead's queues (one per bulkhead state and
//! partition, [`Queues`], shared by the pipelines of this process that
//! share the state: [`Queues::of`]) and the adaptive limit's (one per
//! partition share).
//!
//! Slots are counted by the store (or the limiter), not here: a queue only
//! says whose turn it is to ask for one. The rule, stated once:
//!
//! - A call that holds no place asks for a slot only while nobody waits in
//!   its queue; otherwise it joins the queue (or is refused when the queue
//!   is full or it may not wait), never taking a slot ahead of an older
//!   caller.
//! - A slot given back in this process wakes the oldest waiter not yet
//!   woken ([`WaitQueue::release`]) at once: its driver awaits the wake-up
//!   ([`Place::notified`]), and it asks for the slot again. A waiter asks
//!   only once woken, or, in a bulkhead's queue, when it is the oldest and
//!   its fallback interval ran out (slots freed by other processes sharing
//!   the store wake nobody here).
//! - A woken waiter refused again goes back to waiting, in its place
//!   ([`Place::refused`]); one that leaves without taking a slot (its wait
//!   ran out, its future was dropped, another policy refused it) passes its
//!   wake-up on to the next waiter ([`Place`]'s `Drop`), so no wake-up is
//!   lost and no place is left behind.
//! - A wake-up given while every waiter is already woken is kept (`spare`)
//!   for the next waiter that joins or is refused again.
//! - Slots that were free before anybody waited wake nobody: the first
//!   waiter of an empty queue is woken as it joins (a probe: the slot it
//!   was refused may have been given back before it joined), and a waiter
//!   woken by a probe that takes a slot wakes the next one the same way,
//!   until one is refused; so a queue never waits while a slot is free.
//!
//! Everything here is behind the queue's lock except [`WaitQueue::is_empty`],
//! the one load an admission makes when the queue is empty.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

use crate::clock::{ClockHandle, TimeHold};
use crate::context::PartitionKey;
use crate::store::ResourceState;

/// A FIFO of the calls waiting for a slot. See the [module docs](self).
#[derive(Debug)]
pub(crate) struct WaitQueue {
    /// The waiters: read without the lock by admissions (0: the queue is
    /// empty), written under it.
    len: AtomicU32,
    fifo: Mutex<Fifo>,
    /// The pipeline's clock: a virtual one is held from a waiter's wake-up
    /// until its turn, so that it runs at the instant it was woken.
    clock: ClockHandle,
}

#[derive(Debug, Default)]
struct Fifo {
    entries: VecDeque<Entry>,
    /// Wake-ups given while every waiter was woken already.
    spare: u32,
}

#[derive(Debug)]
struct Entry {
    waiter: Arc<Notify>,
    woken: Option<Wake>,
    /// The clock held since it was woken, until its turn.
    hold: Option<TimeHold>,
}

impl Entry {
    /// Wakes the waiter for `wake`, holding `clock` until its turn.
    fn wake(&mut self, wake: Wake, clock: &ClockHandle) {
        self.woken = Some(wake);
        self.hold = clock.hold();
        self.waiter.notify_one();
    }
}

/// Why a waiter was woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// A slot was given back.
    Release,
    /// A slot may have been free before the queue formed.
    Probe,
}

impl Fifo {
    fn position(&self, waiter: &Arc<Notify>) -> Option<usize> {
        self.entries
            .iter()
            .position(|e| Arc::ptr_eq(&e.waiter, waiter))
    }

    /// Wakes the oldest waiter not yet woken for `wake`; with none, keeps
    /// the wake-up for the next (`spare`) unless nobody waits.
    fn wake(&mut self, wake: Wake, clock: &ClockHandle) {
        if self.entries.is_empty() {
            return;
        }
        match self.entries.iter_mut().find(|e| e.woken.is_none()) {
            Some(e) => e.wake(wake, clock),
            None => self.spare = self.spare.saturating_add(1),
        }
    }
}

impl WaitQueue {
    /// An empty queue of a pipeline on `clock`.
    pub(crate) fn new(clock: ClockHandle) -> Self {
        WaitQueue {
            len: AtomicU32::new(0),
            fifo: Mutex::default(),
            clock,
        }
    }

    fn fifo(&self) -> MutexGuard<'_, Fifo> {
        // Every change is whole before the lock is let go.
        self.fifo.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Nobody waits: a call may ask for a slot without a place.
    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }

    /// Takes a place at the back of the queue, or `None` when `max` calls
    /// wait already. The first waiter of an empty queue is woken at once
    /// (see the [module docs](self)), the others when a slot is given back.
    pub(crate) fn join(self: &Arc<Self>, max: u32) -> Option<Place> {
        let waiter = Arc::new(Notify::new());
        {
            let mut fifo = self.fifo();
            if fifo.entries.len() >= max as usize {
                return None;
            }
            let woken = if fifo.entries.is_empty() {
                Some(Wake::Probe)
            } else if fifo.spare > 0 {
                fifo.spare -= 1;
                Some(Wake::Release)
            } else {
                None
            };
            let mut entry = Entry {
                waiter: Arc::clone(&waiter),
                woken: None,
                hold: None,
            };
            if let Some(wake) = woken {
                entry.wake(wake, &self.clock);
            }
            fifo.entries.push_back(entry);
            self.len.store(fifo.entries.len() as u32, Ordering::Release);
        }
        // Ordered with a release's fence: either the release sees this
        // waiter, or the waiter's next request sees the slot given back.
        fence(Ordering::SeqCst);
        Some(Place(Box::new(Seat {
            queue: Arc::clone(self),
            waiter,
            owner: None,
            admitted: false,
        })))
    }

    /// A slot was given back in this process: wakes the oldest waiter not
    /// yet woken. `false` when nobody waits.
    #[inline]
    pub(crate) fn release(&self) -> bool {
        // See `join`.
        fence(Ordering::SeqCst);
        if self.len.load(Ordering::Relaxed) == 0 {
            return false;
        }
        self.release_slow()
    }

    #[cold]
    #[inline(never)]
    fn release_slow(&self) -> bool {
        let mut fifo = self.fifo();
        if fifo.entries.is_empty() {
            return false;
        }
        fifo.wake(Wake::Release, &self.clock);
        true
    }

    /// Wakes up to `n` waiters not yet woken (more slots than before: a
    /// higher limit); the wake-ups left over.
    pub(crate) fn wake(&self, n: u32) -> u32 {
        if n == 0 || self.is_empty() {
            return n;
        }
        let mut fifo = self.fifo();
        let mut left = n;
        for e in fifo.entries.iter_mut().filter(|e| e.woken.is_none()) {
            if left == 0 {
                break;
            }
            e.wake(Wake::Release, &self.clock);
            left -= 1;
        }
        left
    }

    /// The place of `waiter` may ask for a slot now: it was woken, or it is
    /// the oldest and `oldest_asks` (a store shared with other processes,
    /// whose releases wake nobody here).
    fn may_ask(&self, waiter: &Arc<Notify>, oldest_asks: bool) -> bool {
        let mut fifo = self.fifo();
        match fifo.position(waiter) {
            Some(i) => {
                // Its turn came: the clock may move on.
                let entry = &mut fifo.entries[i];
                entry.hold = None;
                entry.woken.is_some() || (oldest_asks && i == 0)
            }
            None => false,
        }
    }

    /// The waiter of `waiter` had its turn after a wake-up: the clock may
    /// move on.
    fn awake(&self, waiter: &Arc<Notify>) {
        let mut fifo = self.fifo();
        if let Some(i) = fifo.position(waiter) {
            fifo.entries[i].hold = None;
        }
    }

    /// The woken place of `waiter` was refused a slot: it waits again in
    /// its place, or asks again at once when a wake-up was kept. Whether it
    /// had been woken.
    fn refused(&self, waiter: &Arc<Notify>) -> bool {
        let mut fifo = self.fifo();
        let Some(i) = fifo.position(waiter) else {
            return false;
        };
        let was = fifo.entries[i].woken.is_some();
        if fifo.spare > 0 {
            fifo.spare -= 1;
            fifo.entries[i].wake(Wake::Release, &self.clock);
        } else {
            fifo.entries[i].woken = None;
            fifo.entries[i].hold = None;
        }
        was
    }

    /// Removes the place of `waiter`: `admitted` when it took a slot. A
    /// wake-up it did not use goes to the next waiter; one that took a slot
    /// after a probe probes for the next. The waiters left.
    fn leave(&self, waiter: &Arc<Notify>, admitted: bool) -> usize {
        let mut fifo = self.fifo();
        let Some(i) = fifo.position(waiter) else {
            return fifo.entries.len();
        };
        let entry = fifo.entries.remove(i).expect("a position in the queue");
        self.len.store(fifo.entries.len() as u32, Ordering::Release);
        if fifo.entries.is_empty() {
            fifo.spare = 0;
            return 0;
        }
        match (admitted, entry.woken) {
            (_, None) | (true, Some(Wake::Release)) => {}
            (true, Some(Wake::Probe)) => {
                if let Some(e) = fifo.entries.iter_mut().find(|e| e.woken.is_none()) {
                    e.wake(Wake::Probe, &self.clock);
                }
            }
            (false, Some(wake)) => fifo.wake(wake, &self.clock),
        }
        fifo.entries.len()
    }

    /// The waiters (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.fifo().entries.len()
    }
}

/// A call's place in a [`WaitQueue`], left when it is dropped (passing on
/// a wake-up it did not use) or when the call took its slot
/// ([`admitted`](Self::admitted)). One word (a call's state carries it).
#[derive(Debug)]
pub(crate) struct Place(Box<Seat>);

/// What a [`Place`] holds.
#[derive(Debug)]
struct Seat {
    queue: Arc<WaitQueue>,
    waiter: Arc<Notify>,
    /// The partition queues the queue belongs to, and its key: the queue
    /// goes from them once empty.
    owner: Option<(Arc<Partitioned>, PartitionKey)>,
    admitted: bool,
}

impl Place {
    /// Completes when the place is woken (at once if it was woken since
    /// the last wake-up was awaited).
    pub(crate) fn notified(&self) -> OwnedNotified {
        Arc::clone(&self.0.waiter).notified_owned()
    }

    /// The call may ask for a slot now (see [`WaitQueue::may_ask`]).
    pub(crate) fn may_ask(&self, oldest_asks: bool) -> bool {
        self.0.queue.may_ask(&self.0.waiter, oldest_asks)
    }

    /// The call's wait ended (woken or not): a clock held for its turn
    /// may move on.
    pub(crate) fn awake(&self) {
        self.0.queue.awake(&self.0.waiter);
    }

    /// The call was refused a slot again (see [`WaitQueue::refused`]):
    /// whether it had been woken.
    pub(crate) fn refused(&self) -> bool {
        self.0.queue.refused(&self.0.waiter)
    }

    /// The call took its slot: it leaves the queue without passing a
    /// wake-up on.
    pub(crate) fn admitted(mut self) {
        self.0.admitted = true;
    }

    /// The place is in `queue`.
    pub(crate) fn is_in(&self, queue: &Arc<WaitQueue>) -> bool {
        Arc::ptr_eq(&self.0.queue, queue)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let seat = &*self.0;
        let left = seat.queue.leave(&seat.waiter, seat.admitted);
        if let Some((owner, key)) = &seat.owner {
            owner.waiting.fetch_sub(1, Ordering::AcqRel);
            if left == 0 {
                owner.forget_if_empty(key, &seat.queue);
            }
        }
    }
}

/// The bulkhead queues of one bulkhead state: the unpartitioned calls' and
/// one per partition key with waiters (a partition has slots, and so a
/// queue, of its own); a partition's queue goes once empty.
#[derive(Debug)]
pub(crate) struct Queues {
    whole: Arc<WaitQueue>,
    partitions: Arc<Partitioned>,
    clock: ClockHandle,
}

/// The queues of the partitions of one gate, each created when a call of
/// its key queues and dropped once empty.
#[derive(Debug, Default)]
pub(crate) struct Partitioned {
    /// The calls waiting in every partition's queue: 0, and admissions and
    /// releases of partitions look no further.
    waiting: AtomicU32,
    queues: Mutex<HashMap<PartitionKey, Arc<WaitQueue>>>,
}

impl Partitioned {
    fn queues(&self) -> MutexGuard<'_, HashMap<PartitionKey, Arc<WaitQueue>>> {
        // Inserts and removals only: whole after a panic.
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The queue of `key`, if anybody waits in it.
    fn queue(&self, key: &PartitionKey) -> Option<Arc<WaitQueue>> {
        if self.waiting.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.queues().get(key).cloned()
    }

    /// Removes the queue of `key` if it is `queue` and empty: places are
    /// taken under the same lock, so none is being taken.
    fn forget_if_empty(&self, key: &PartitionKey, queue: &Arc<WaitQueue>) {
        let mut queues = self.queues();
        if let Some(q) = queues.get(key) {
            if Arc::ptr_eq(q, queue) && q.is_empty() {
                queues.remove(key);
            }
        }
    }
}

/// The bulkhead queues of this process by the state whose slots they wait
/// for (its address: a live entry's state is held by the gates that hold
/// its queues, so the address is not reused meanwhile).
static SHARED: Mutex<Vec<(usize, Weak<Queues>)>> = Mutex::new(Vec::new());

impl Queues {
    /// The queues for the bulkhead slots counted by `state`, of a pipeline
    /// on `clock`: a slot is waited for in one queue whichever pipeline of
    /// this process takes it, so the queues are those of the other live
    /// pipelines bound to the same state (pipelines of one name and equal
    /// settings on one memory store) when there are any, and new ones
    /// otherwise. (Pipelines on two virtual clocks keep queues of their
    /// own: a woken waiter holds its queue's clock.)
    pub(crate) fn of(state: &Arc<dyn ResourceState>, clock: &ClockHandle) -> Arc<Queues> {
        let key = Arc::as_ptr(state).cast::<()>() as usize;
        let mut shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        shared.retain(|(_, queues)| queues.strong_count() > 0);
        let live = shared
            .iter()
            .filter(|(k, _)| *k == key)
            .filter_map(|(_, queues)| queues.upgrade())
            .find(|queues| queues.clock.holds_as(clock));
        if let Some(queues) = live {
            return queues;
        }
        let queues = Arc::new(Queues::new(clock.clone()));
        shared.push((key, Arc::downgrade(&queues)));
        queues
    }

    /// New queues of a pipeline on `clock`.
    pub(crate) fn new(clock: ClockHandle) -> Self {
        Queues {
            whole: Arc::new(WaitQueue::new(clock.clone())),
            partitions: Arc::default(),
            clock,
        }
    }

    /// The queue of `partition`, if it exists (an unpartitioned call's
    /// always does).
    fn queue(&self, partition: Option<&PartitionKey>) -> Option<Arc<WaitQueue>> {
        match partition {
            None => Some(Arc::clone(&self.whole)),
            Some(key) => self.partitions.queue(key),
        }
    }

    /// Nobody waits in the queue of `partition`: the one check of an
    /// ordinary admission (a load; a lock only while someone waits in a
    /// partition's queue).
    #[inline(always)]
    pub(crate) fn is_empty(&self, partition: Option<&PartitionKey>) -> bool {
        match partition {
            None => self.whole.is_empty(),
            Some(_) if self.partitions.waiting.load(Ordering::Acquire) == 0 => true,
            Some(key) => self.partitions.queue(key).is_none_or(|q| q.is_empty()),
        }
    }

    /// A call of `partition` holding `place` (if any) may ask for a slot:
    /// nobody waits in its queue, or its place may ask
    /// ([`Place::may_ask`]).
    pub(crate) fn may_ask(
        &self,
        partition: Option<&PartitionKey>,
        place: Option<&Place>,
        oldest_asks: bool,
    ) -> bool {
        let Some(queue) = self.queue(partition) else {
            return true;
        };
        match place {
            Some(place) if place.is_in(&queue) => place.may_ask(oldest_asks),
            _ => queue.is_empty(),
        }
    }

    /// Takes a place in the queue of `partition`, or `None` when `max`
    /// calls wait in it already.
    pub(crate) fn join(&self, partition: Option<&PartitionKey>, max: u32) -> Option<Place> {
        let Some(key) = partition else {
            return self.whole.join(max);
        };
        let mut queues = self.partitions.queues();
        let queue = Arc::clone(
            queues
                .entry(key.clone())
                .or_insert_with(|| Arc::new(WaitQueue::new(self.clock.clone()))),
        );
        let mut place = queue.join(max);
        match &mut place {
            Some(place) => {
                self.partitions.waiting.fetch_add(1, Ordering::AcqRel);
                place.0.owner = Some((Arc::clone(&self.partitions), key.clone()));
            }
            None if queue.is_empty() => {
                queues.remove(key);
            }
            None => {}
        }
        drop(queues);
        // See `WaitQueue::join`: the count read by releases is raised too.
        fence(Ordering::SeqCst);
        place
    }

    /// A slot of `partition` was given back in this process: wakes the
    /// oldest waiter of its queue.
    #[inline(never)]
    pub(crate) fn release(&self, partition: Option<&PartitionKey>) {
        match partition {
            None => {
                self.whole.release();
            }
            Some(key) => {
                fence(Ordering::SeqCst);
                if self.partitions.waiting.load(Ordering::Relaxed) != 0 {
                    self.release_partition(key);
                }
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn release_partition(&self, key: &PartitionKey) {
        if let Some(queue) = self.partitions.queues().get(key) {
            queue.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn woken(place: &Place) -> bool {
        place.may_ask(false)
    }

    #[test]
    fn the_first_waiter_probes_and_the_others_wait_their_turn() {
        let q = Arc::new(WaitQueue::new(ClockHandle::System));
        let a = q.join(3).unwrap();
        let b = q.join(3).unwrap();
        let c = q.join(3).unwrap();
        assert!(q.join(3).is_none(), "full");
        assert!(woken(&a) && !woken(&b) && !woken(&c));
        // A refused: waits again. A release wakes the oldest, A.
        assert!(a.refused());
        assert!(!woken(&a));
        assert!(q.release());
        assert!(woken(&a) && !woken(&b));
        // The next releases wake B, then C; one more is kept for the next.
        q.release();
        assert!(woken(&b) && !woken(&c));
        q.release();
        q.release();
        assert!(woken(&c));
        a.admitted();
        // C leaves without taking a slot: its wake-up is kept too.
        drop(c);
        let d = q.join(3).unwrap();
        let e = q.join(3).unwrap();
        assert!(
            woken(&d) && woken(&e),
            "the kept wake-ups go to the next to join"
        );
        let f = q.join(4).unwrap();
        assert!(!woken(&f));
        drop((b, d, e, f));
        assert_eq!(q.len(), 0);
        assert!(q.is_empty() && !q.release());
    }

    #[test]
    fn a_woken_waiter_that_leaves_passes_its_wake_up_on() {
        let q = Arc::new(WaitQueue::new(ClockHandle::System));
        let a = q.join(3).unwrap();
        let b = q.join(3).unwrap();
        assert!(a.refused());
        q.release();
        assert!(woken(&a) && !woken(&b));
        drop(a);
        assert!(woken(&b));
        // A probe taken passes a probe on; a release taken does not.
        let q = Arc::new(WaitQueue::new(ClockHandle::System));
        let a = q.join(3).unwrap();
        let b = q.join(3).unwrap();
        a.admitted();
        assert!(woken(&b), "probe passed on");
        assert!(b.refused());
        let c = q.join(3).unwrap();
        q.release();
        assert!(woken(&b) && !woken(&c));
        b.admitted();
        assert!(!woken(&c));
    }

    #[test]
    fn a_refused_waiter_uses_a_kept_wake_up() {
        let q = Arc::new(WaitQueue::new(ClockHandle::System));
        let a = q.join(2).unwrap();
        // Given back while A was asking: kept, and A asks again.
        q.release();
        assert!(a.refused());
        assert!(woken(&a));
        assert!(a.refused());
        assert!(!woken(&a));
    }

    #[test]
    fn partition_queues_go_once_empty() {
        let qs = Queues::new(ClockHandle::System);
        let k = PartitionKey::from("k");
        assert!(qs.is_empty(Some(&k)) && qs.is_empty(None));
        let a = qs.join(Some(&k), 1).unwrap();
        assert!(qs.join(Some(&k), 1).is_none());
        assert!(!qs.is_empty(Some(&k)) && qs.is_empty(None));
        assert!(qs.may_ask(Some(&k), Some(&a), false));
        assert!(!qs.may_ask(Some(&k), None, false));
        assert!(qs.may_ask(Some(&PartitionKey::from("other")), None, false));
        drop(a);
        assert!(qs.is_empty(Some(&k)));
        assert!(qs.partitions.queues().is_empty());
        assert_eq!(qs.partitions.waiting.load(Ordering::Relaxed), 0);
    }

    /// Many threads joining, asking, giving back and leaving at once: no
    /// wake-up is lost (every waiter is woken while a slot is free) and no
    /// place is left behind.
    #[test]
    fn no_wake_up_is_lost_across_threads() {
        use std::sync::atomic::AtomicU32 as Count;
        let q = Arc::new(WaitQueue::new(ClockHandle::System));
        let slots = Arc::new(Count::new(2));
        let take = |slots: &Count| {
            slots
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
        };
        std::thread::scope(|s| {
            for t in 0..8u32 {
                let (q, slots) = (Arc::clone(&q), Arc::clone(&slots));
                s.spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_time()
                        .build()
                        .unwrap();
                    for i in 0..300u32 {
                        let mut place = None;
                        loop {
                            let asks = match &place {
                                Some(p) => Place::may_ask(p, false),
                                None => q.is_empty(),
                            };
                            if asks && take(&slots) {
                                if let Some(p) = place.take() {
                                    p.admitted();
                                }
                                break;
                            }
                            match &place {
                                Some(p) => {
                                    p.refused();
                                }
                                None => place = q.join(u32::MAX),
                            }
                            let p = place.as_ref().unwrap();
                            if (t + i) % 7 == 0 {
                                // Leaves without waiting: passes any wake-up on.
                                place = None;
                                continue;
                            }
                            // Bounded: a lost wake-up fails the test instead of hanging.
                            let woke = rt.block_on(async {
                                tokio::time::timeout(
                                    std::time::Duration::from_secs(5),
                                    p.notified(),
                                )
                                .await
                            });
                            assert!(woke.is_ok(), "a waiter was never woken");
                        }
                        std::hint::spin_loop();
                        slots.fetch_add(1, Ordering::AcqRel);
                        q.release();
                    }
                });
            }
        });
        assert_eq!(q.len(), 0);
        assert_eq!(slots.load(Ordering::Relaxed), 2);
    }
}
