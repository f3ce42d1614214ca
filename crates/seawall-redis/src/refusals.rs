//! Refusals whose end is known, replayed locally until that end.
//!
//! When Redis refuses an admission because a circuit is open until T, a
//! cooldown is active until T or a rate limit is exhausted until T, no
//! admission of the same partition (and weight) can pass before T, in any
//! process, except through a manual control of the circuit, a give-back of
//! a reserved rate-limit permit, or a restart of the server (see the crate
//! documentation). The store keeps that answer, one entry per partition,
//! and until T answers the same refusal without a round trip, its
//! `retry_after` counted down on the store's clock. Nothing here decides
//! whether a call is refused: an entry is only ever an answer Redis gave,
//! with the end Redis gave.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock};
use std::time::Duration;

use seawall::{PartitionKey, Rejection, RejectionReason};

/// One refusal replayed until `until` (the store's clock).
#[derive(Debug, Clone, Copy)]
struct Entry {
    reason: RejectionReason,
    until: Duration,
    /// The weight of the refused call: only calls of that weight are
    /// answered from the entry (a lighter one may fit in the rate limit,
    /// one that never fits gets another answer).
    weight: u32,
    /// The ticket of the admission that brought the answer.
    ticket: u64,
    /// The link's epoch when that admission was sent: after an outage or
    /// a restart seen since, the entry no longer answers.
    epoch: u64,
    /// The wait is counted from the clock's whole microsecond, as the
    /// script counted it (`until` is then a whole microsecond).
    micros: bool,
}

/// `d` down to its whole microsecond.
fn floor_micros(d: Duration) -> Duration {
    d - Duration::from_nanos(u64::from(d.subsec_nanos() % 1000))
}

#[derive(Debug, Default)]
struct Entries {
    whole: Option<Entry>,
    parts: HashMap<PartitionKey, Entry>,
    /// Answers to admissions of a ticket up to this one are not kept: a
    /// control of the circuit was made through this store after they were
    /// sent.
    cleared: u64,
}

impl Entries {
    fn len(&self) -> usize {
        self.parts.len() + usize::from(self.whole.is_some())
    }

    fn slot(&mut self, partition: Option<&PartitionKey>) -> Option<&mut Entry> {
        match partition {
            None => self.whole.as_mut(),
            Some(p) => self.parts.get_mut(p),
        }
    }

    fn remove(&mut self, partition: Option<&PartitionKey>) {
        match partition {
            None => self.whole = None,
            Some(p) => {
                self.parts.remove(p);
            }
        }
    }
}

/// The refusals of one bound resource, at most `capacity` partitions (plus
/// the unpartitioned state).
#[derive(Debug)]
pub(crate) struct Refusals {
    capacity: usize,
    /// Entries held, read without the lock: with none (the usual case), an
    /// admission takes no lock.
    len: AtomicUsize,
    tickets: AtomicU64,
    entries: RwLock<Entries>,
}

/// What Redis answered to an admission, as far as the cache is concerned.
pub(crate) enum Answer {
    /// Refused with this reason for exactly this long from when the
    /// admission was sent (from its whole microsecond when the flag is
    /// set: the script counted the wait so), by a state that cannot admit
    /// the same call sooner (see the module documentation).
    RefusedFor(RejectionReason, Duration, bool),
    /// Anything else: admitted, or refused without a known end.
    Other,
}

impl Refusals {
    pub(crate) fn new(capacity: usize) -> Refusals {
        Refusals {
            capacity,
            len: AtomicUsize::new(0),
            tickets: AtomicU64::new(0),
            entries: RwLock::new(Entries::default()),
        }
    }

    /// `false` when the cache is turned off (capacity 0).
    pub(crate) fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// The refusal Redis gave an admission of `partition` and `weight`,
    /// while its end is after `now` and the link's `epoch` is the one it
    /// was given in, its `retry_after` counted down to `now`.
    pub(crate) fn lookup(
        &self,
        partition: Option<&PartitionKey>,
        weight: u32,
        now: Duration,
        epoch: u64,
    ) -> Option<Rejection> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let entries = self.entries.read().unwrap_or_else(PoisonError::into_inner);
        let e = match partition {
            None => entries.whole.as_ref(),
            Some(p) => entries.parts.get(p),
        }?;
        let now = if e.micros { floor_micros(now) } else { now };
        (e.weight == weight && e.epoch == epoch && now < e.until)
            .then(|| Rejection::new(e.reason, Some(e.until - now)))
    }

    /// The ticket of an admission about to be sent: answers are kept in
    /// the order their admissions were sent.
    pub(crate) fn ticket(&self) -> u64 {
        if !self.enabled() {
            return 0;
        }
        self.tickets.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Learns Redis's `answer` to the admission of `partition` and
    /// `weight` sent at `sent` (the store's clock) with `ticket`, in the
    /// link's `epoch`. `now` is the store's clock on arrival (for dropping
    /// expired entries when the cache is full).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn learn(
        &self,
        partition: Option<&PartitionKey>,
        weight: u32,
        sent: Duration,
        ticket: u64,
        epoch: u64,
        answer: Answer,
        now: Duration,
    ) {
        if !self.enabled() {
            return;
        }
        match answer {
            Answer::Other => {
                if self.len.load(Ordering::Acquire) == 0 {
                    return;
                }
                let mut entries = self.entries.write().unwrap_or_else(PoisonError::into_inner);
                if entries.slot(partition).is_some_and(|e| e.ticket < ticket) {
                    entries.remove(partition);
                }
                self.len.store(entries.len(), Ordering::Release);
            }
            Answer::RefusedFor(reason, wait, micros) => {
                let from = if micros { floor_micros(sent) } else { sent };
                let until = from.saturating_add(wait);
                if until <= now {
                    return;
                }
                let entry = Entry {
                    reason,
                    until,
                    weight,
                    ticket,
                    epoch,
                    micros,
                };
                let mut entries = self.entries.write().unwrap_or_else(PoisonError::into_inner);
                if ticket <= entries.cleared {
                    return;
                }
                if let Some(e) = entries.slot(partition) {
                    if e.ticket < ticket {
                        *e = entry;
                    }
                } else {
                    match partition {
                        None => entries.whole = Some(entry),
                        Some(p) => {
                            if entries.parts.len() >= self.capacity {
                                entries.parts.retain(|_, e| e.until > now);
                            }
                            if entries.parts.len() >= self.capacity {
                                // Every entry still refuses: one of them
                                // goes (it only costs its next admission a
                                // round trip).
                                if let Some(k) = entries.parts.keys().next().cloned() {
                                    entries.parts.remove(&k);
                                }
                            }
                            entries.parts.insert(p.clone(), entry);
                        }
                    }
                }
                self.len.store(entries.len(), Ordering::Release);
            }
        }
    }

    /// A control of `partition`'s circuit, or a record that may have
    /// changed its state (a failure, a probe, a slow call, a retry-after
    /// hint), was made through this store: its entry goes, and the answers
    /// to admissions sent before it are not kept.
    pub(crate) fn clear(&self, partition: Option<&PartitionKey>) {
        if !self.enabled() {
            return;
        }
        let mut entries = self.entries.write().unwrap_or_else(PoisonError::into_inner);
        entries.cleared = self.tickets.load(Ordering::Acquire);
        entries.remove(partition);
        self.len.store(entries.len(), Ordering::Release);
    }

    /// Entries held (expired ones included, until they are replaced).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn refused(wait: Duration) -> Answer {
        Answer::RefusedFor(RejectionReason::CircuitOpen, wait, false)
    }

    #[test]
    fn a_refusal_is_replayed_until_its_end_counted_down() {
        for origin in [Duration::ZERO, Duration::from_secs(1_000_000)] {
            let r = Refusals::new(4);
            let t = r.ticket();
            r.learn(None, 1, origin, t, 0, refused(5 * S), origin + S);
            let at = |d| r.lookup(None, 1, origin + d, 0);
            assert_eq!(at(S).unwrap().retry_after, Some(4 * S));
            assert_eq!(
                at(5 * S - Duration::from_nanos(1)).unwrap().retry_after,
                Some(Duration::from_nanos(1))
            );
            assert!(at(5 * S).is_none(), "ends at the instant Redis gave");
            assert!(
                r.lookup(None, 2, origin + S, 0).is_none(),
                "another weight asks Redis"
            );
            let p = PartitionKey::from(7u64);
            assert!(
                r.lookup(Some(&p), 1, origin + S, 0).is_none(),
                "another partition asks Redis"
            );
        }
    }

    #[test]
    fn an_admission_answered_later_removes_the_entry_an_older_one_does_not() {
        let r = Refusals::new(4);
        let (t1, t2) = (r.ticket(), r.ticket());
        r.learn(
            None,
            1,
            Duration::ZERO,
            t2,
            0,
            refused(5 * S),
            Duration::ZERO,
        );
        r.learn(
            None,
            1,
            Duration::ZERO,
            t1,
            0,
            Answer::Other,
            Duration::ZERO,
        );
        assert!(
            r.lookup(None, 1, S, 0).is_some(),
            "an older answer changes nothing"
        );
        let t3 = r.ticket();
        r.learn(None, 1, S, t3, 0, Answer::Other, S);
        assert!(r.lookup(None, 1, S, 0).is_none());
        assert_eq!(r.held(), 0);
    }

    #[test]
    fn a_control_drops_the_entry_and_the_answers_sent_before_it() {
        let r = Refusals::new(4);
        let t1 = r.ticket();
        r.learn(
            None,
            1,
            Duration::ZERO,
            t1,
            0,
            refused(5 * S),
            Duration::ZERO,
        );
        let in_flight = r.ticket();
        r.clear(None);
        assert!(r.lookup(None, 1, S, 0).is_none());
        r.learn(
            None,
            1,
            Duration::ZERO,
            in_flight,
            0,
            refused(5 * S),
            Duration::ZERO,
        );
        assert!(r.lookup(None, 1, S, 0).is_none(), "sent before the control");
        let after = r.ticket();
        r.learn(None, 1, S, after, 0, refused(5 * S), S);
        assert!(r.lookup(None, 1, 2 * S, 0).is_some());
    }

    #[test]
    fn the_partitions_held_are_bounded() {
        let r = Refusals::new(3);
        for k in 0..10u64 {
            let t = r.ticket();
            r.learn(
                Some(&PartitionKey::from(k)),
                1,
                Duration::ZERO,
                t,
                0,
                refused(S * (k as u32 + 1)),
                Duration::ZERO,
            );
            assert!(r.held() <= 3);
        }
        // Expired entries go first when the cache is full.
        let t = r.ticket();
        r.learn(
            Some(&PartitionKey::from(100u64)),
            1,
            20 * S,
            t,
            0,
            refused(S),
            20 * S,
        );
        assert_eq!(r.held(), 1);
        let t = r.ticket();
        r.learn(None, 1, 20 * S, t, 0, refused(S), 20 * S);
        assert_eq!(
            r.held(),
            2,
            "the unpartitioned entry is not counted against the bound"
        );
    }

    #[test]
    fn a_wait_in_whole_microseconds_is_counted_from_the_whole_microsecond() {
        let r = Refusals::new(4);
        let t = r.ticket();
        let sent = S + Duration::from_nanos(400);
        let wait = Answer::RefusedFor(RejectionReason::CircuitOpen, 2 * S, true);
        r.learn(None, 1, sent, t, 0, wait, sent);
        let at = |d: Duration| r.lookup(None, 1, d, 0).map(|r| r.retry_after.unwrap());
        assert_eq!(at(sent), Some(2 * S));
        assert_eq!(
            at(3 * S - Duration::from_nanos(1)),
            Some(Duration::from_micros(1))
        );
        assert_eq!(at(3 * S), None);
    }

    #[test]
    fn an_outage_or_a_restart_seen_since_ends_the_replay() {
        let r = Refusals::new(4);
        let t = r.ticket();
        r.learn(
            None,
            1,
            Duration::ZERO,
            t,
            3,
            refused(5 * S),
            Duration::ZERO,
        );
        assert!(r.lookup(None, 1, S, 3).is_some());
        assert!(r.lookup(None, 1, S, 4).is_none());
    }

    #[test]
    fn turned_off_it_keeps_nothing() {
        let r = Refusals::new(0);
        let t = r.ticket();
        r.learn(
            None,
            1,
            Duration::ZERO,
            t,
            0,
            refused(5 * S),
            Duration::ZERO,
        );
        assert!(r.lookup(None, 1, S, 0).is_none());
    }

    #[test]
    fn many_threads_learn_and_look_up_without_losing_the_bound() {
        let r = std::sync::Arc::new(Refusals::new(16));
        let threads: Vec<_> = (0..8u64)
            .map(|i| {
                let r = std::sync::Arc::clone(&r);
                std::thread::spawn(move || {
                    for k in 0..500u64 {
                        let p = PartitionKey::from(i * 1000 + k % 40);
                        let t = r.ticket();
                        if k % 3 == 0 {
                            r.learn(
                                Some(&p),
                                1,
                                Duration::ZERO,
                                t,
                                0,
                                Answer::Other,
                                Duration::ZERO,
                            );
                        } else {
                            r.learn(
                                Some(&p),
                                1,
                                Duration::ZERO,
                                t,
                                0,
                                refused(10 * S),
                                Duration::ZERO,
                            );
                        }
                        if let Some(rej) = r.lookup(Some(&p), 1, S, 0) {
                            assert_eq!(rej.retry_after, Some(9 * S));
                        }
                        assert!(r.held() <= 17);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}
