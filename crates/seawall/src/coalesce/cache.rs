//! The cache of successes in front of the coalescing table: bounded in
//! entries, each entry kept until its expiry on the pipeline's clock, the
//! least recently used entry evicted when a new one needs room.
//!
//! A slab of nodes linked from the most to the least recently used, and a
//! map from key to node: a lookup, an insertion and an eviction are each
//! one hash lookup and a few index moves, and the slab never grows past
//! the bound (an evicted node's slot is reused at once).

use std::hash::Hash;

use hashbrown::HashMap;

/// No node.
const NIL: usize = usize::MAX;

struct Node<K, V> {
    key: K,
    value: V,
    /// The instant (nanoseconds on the pipeline's clock) from which the
    /// entry is stale.
    expires: u64,
    /// Towards the most recently used.
    newer: usize,
    /// Towards the least recently used.
    older: usize,
}

/// A bounded map whose entries expire, evicting the least recently used.
pub(crate) struct Cache<K, V> {
    map: HashMap<K, usize>,
    nodes: Vec<Node<K, V>>,
    /// Slots of the slab freed by expired entries.
    free: Vec<usize>,
    /// The most recently used node.
    newest: usize,
    /// The least recently used node: the next one evicted.
    oldest: usize,
    capacity: usize,
}

impl<K: Hash + Eq + Clone, V> Cache<K, V> {
    /// An empty cache of at most `capacity` entries (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Cache {
            map: HashMap::new(),
            nodes: Vec::new(),
            free: Vec::new(),
            newest: NIL,
            oldest: NIL,
            capacity,
        }
    }

    /// The entries held, stale ones included until a lookup finds them.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// The value of `key` if it is still fresh at `now`, made the most
    /// recently used; a stale entry is dropped.
    pub(crate) fn get(&mut self, key: &K, now: u64) -> Option<&V> {
        let at = *self.map.get(key)?;
        if now >= self.nodes[at].expires {
            self.unlink(at);
            self.map.remove(key);
            self.free.push(at);
            return None;
        }
        self.touch(at);
        Some(&self.nodes[at].value)
    }

    /// Keeps `value` for `key` until `expires`, as the most recently used
    /// entry; returns whether an entry was evicted to make room.
    pub(crate) fn insert(&mut self, key: K, value: V, expires: u64) -> bool {
        if let Some(&at) = self.map.get(&key) {
            let node = &mut self.nodes[at];
            node.value = value;
            node.expires = expires;
            self.touch(at);
            return false;
        }
        let mut evicted = false;
        let at = if self.map.len() >= self.capacity {
            // Full: the least recently used entry makes room.
            let at = self.oldest;
            self.unlink(at);
            self.map.remove(&self.nodes[at].key);
            evicted = true;
            let node = &mut self.nodes[at];
            node.key = key.clone();
            node.value = value;
            node.expires = expires;
            at
        } else if let Some(at) = self.free.pop() {
            let node = &mut self.nodes[at];
            node.key = key.clone();
            node.value = value;
            node.expires = expires;
            at
        } else {
            self.nodes.push(Node {
                key: key.clone(),
                value,
                expires,
                newer: NIL,
                older: NIL,
            });
            self.nodes.len() - 1
        };
        self.push_newest(at);
        self.map.insert(key, at);
        evicted
    }

    /// Makes `at` the most recently used.
    fn touch(&mut self, at: usize) {
        if self.newest != at {
            self.unlink(at);
            self.push_newest(at);
        }
    }

    fn push_newest(&mut self, at: usize) {
        let node = &mut self.nodes[at];
        node.newer = NIL;
        node.older = self.newest;
        if self.newest != NIL {
            self.nodes[self.newest].newer = at;
        }
        self.newest = at;
        if self.oldest == NIL {
            self.oldest = at;
        }
    }

    fn unlink(&mut self, at: usize) {
        let (newer, older) = (self.nodes[at].newer, self.nodes[at].older);
        match newer {
            NIL => self.newest = older,
            n => self.nodes[n].older = older,
        }
        match older {
            NIL => self.oldest = newer,
            o => self.nodes[o].newer = newer,
        }
        self.nodes[at].newer = NIL;
        self.nodes[at].older = NIL;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keeps_fresh_entries_and_drops_stale_ones() {
        let mut c = Cache::new(2);
        c.insert("a", 1, 10);
        assert_eq!(c.get(&"a", 9), Some(&1));
        assert_eq!(c.get(&"a", 10), None);
        assert_eq!(c.len(), 0);
        // The freed slot is reused.
        c.insert("b", 2, 20);
        assert_eq!(c.nodes.len(), 1);
    }

    #[test]
    fn evicts_the_least_recently_used() {
        let mut c = Cache::new(2);
        assert!(!c.insert("a", 1, u64::MAX));
        assert!(!c.insert("b", 2, u64::MAX));
        assert_eq!(c.get(&"a", 0), Some(&1));
        assert!(c.insert("c", 3, u64::MAX));
        assert_eq!(c.get(&"b", 0), None);
        assert_eq!(c.get(&"a", 0), Some(&1));
        assert_eq!(c.get(&"c", 0), Some(&3));
        assert_eq!(c.nodes.len(), 2);
    }

    /// The reference model: a list from the least to the most recently
    /// used entry.
    #[derive(Default)]
    struct Model(Vec<(u8, u32, u64)>);

    impl Model {
        fn get(&mut self, key: u8, now: u64) -> Option<u32> {
            let i = self.0.iter().position(|e| e.0 == key)?;
            let e = self.0.remove(i);
            if now >= e.2 {
                return None;
            }
            self.0.push(e);
            Some(e.1)
        }
        fn insert(&mut self, key: u8, value: u32, expires: u64, capacity: usize) -> bool {
            if let Some(i) = self.0.iter().position(|e| e.0 == key) {
                self.0.remove(i);
                self.0.push((key, value, expires));
                return false;
            }
            let evicted = self.0.len() >= capacity;
            if evicted {
                self.0.remove(0);
            }
            self.0.push((key, value, expires));
            evicted
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Get(u8),
        Insert(u8, u32, u64),
        Advance(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..6).prop_map(Op::Get),
            (0u8..6, any::<u32>(), 0u64..40).prop_map(|(k, v, ttl)| Op::Insert(k, v, ttl)),
            (0u64..15).prop_map(Op::Advance),
        ]
    }

    proptest! {
        /// Every lookup, insertion and eviction agrees with the model, on
        /// clocks near 0 and far from it.
        #[test]
        fn agrees_with_the_model(
            capacity in 1usize..5,
            start in prop_oneof![Just(0u64), Just(1_000_000_000_000_000u64)],
            ops in proptest::collection::vec(op(), 1..80),
        ) {
            let mut cache = Cache::new(capacity);
            let mut model = Model::default();
            let mut now = start;
            for op in ops {
                match op {
                    Op::Get(k) => prop_assert_eq!(cache.get(&k, now).copied(), model.get(k, now)),
                    Op::Insert(k, v, ttl) => {
                        let expires = now.saturating_add(ttl);
                        prop_assert_eq!(cache.insert(k, v, expires), model.insert(k, v, expires, capacity));
                    }
                    Op::Advance(by) => now += by,
                }
                prop_assert!(cache.len() <= capacity);
                prop_assert!(cache.nodes.len() <= capacity);
            }
        }
    }
}
