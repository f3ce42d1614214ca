//! Saga ids, step phases and idempotency keys.

use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The id of one saga instance. Unique within a log.
///
/// Generated ids ([`SagaId::generate`]) start with the creation time in hex, so
/// they sort roughly by creation. Callers may also bring their own id (an order
/// number, say) with [`StartOptions::id`](crate::StartOptions::id); starting a
/// saga with an id that already exists fails with
/// [`LogError::AlreadyExists`](crate::LogError::AlreadyExists), which makes
/// starting idempotent.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SagaId(String);

impl SagaId {
    /// Wraps an existing id.
    pub fn new(id: impl Into<String>) -> Self {
        SagaId(id.into())
    }

    /// A new unique id: creation time, process id, a counter and random bits.
    pub fn generate() -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let count = COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(count);
        hasher.write_u64(millis);
        let random = hasher.finish() as u32;
        SagaId(format!(
            "{millis:011x}-{:06x}-{count:06x}-{random:08x}",
            std::process::id()
        ))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SagaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for SagaId {
    fn from(id: String) -> Self {
        SagaId(id)
    }
}

impl From<&str> for SagaId {
    fn from(id: &str) -> Self {
        SagaId(id.to_owned())
    }
}

/// Whether user code runs a step's action or its compensation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Phase {
    /// The step's forward action.
    Action,
    /// The step's compensation (undo).
    Compensation,
}

impl Phase {
    /// `"action"` or `"compensation"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Action => "action",
            Phase::Compensation => "compensation",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A key that names one effect: saga id + step + phase.
///
/// The key is the same every time the orchestrator runs that step's action (or
/// compensation) for that saga, in this process or after a restart. Pass it to
/// the external system (as an `Idempotency-Key` header, a unique column, a
/// payment reference) so that a repeated execution after a crash is recognised
/// as the same request. Its format is `{saga_id}/{step_index}/{step_name}/{phase}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The key for `phase` of step `index` (named `step`) of saga `saga_id`.
    pub fn new(saga_id: &SagaId, index: usize, step: &str, phase: Phase) -> Self {
        IdempotencyKey(format!("{saga_id}/{index}/{step}/{}", phase.as_str()))
    }

    /// The key as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_unique() {
        let ids: std::collections::HashSet<_> = (0..1000).map(|_| SagaId::generate()).collect();
        assert_eq!(ids.len(), 1000);
    }

    #[test]
    fn key_is_stable_and_names_its_parts() {
        let id = SagaId::new("order-7");
        let a = IdempotencyKey::new(&id, 1, "charge", Phase::Compensation);
        let b = IdempotencyKey::new(&id, 1, "charge", Phase::Compensation);
        assert_eq!(a, b);
        assert_eq!(a.as_str(), "order-7/1/charge/compensation");
        assert_ne!(a, IdempotencyKey::new(&id, 1, "charge", Phase::Action));
    }
}
