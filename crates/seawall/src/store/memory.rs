//! The in-memory store.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::breaker::{CircuitControl, CircuitMetrics, CircuitTransition};

/// The default, process-local [`StateStore`]. Clones share state.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    _inner: Arc<()>,
}

impl MemoryStore {
    /// A new, empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The process-wide store used by pipelines that name no store.
    pub fn global() -> &'static MemoryStore {
        static GLOBAL: std::sync::OnceLock<MemoryStore> = std::sync::OnceLock::new();
        GLOBAL.get_or_init(MemoryStore::new)
    }
}

impl StateStore for MemoryStore {
    fn bind(&self, _spec: &ResourceSpec) -> Result<Arc<dyn ResourceState>, StoreError> {
        Ok(Arc::new(Stub))
    }
}

#[derive(Debug)]
struct Stub;

impl ResourceState for Stub {
    fn admit(&self, _r: &AdmitRequest<'_>) -> Result<Admission, StoreError> {
        Ok(Admission::admitted(Permit::default()))
    }
    fn record(&self, _r: &Record<'_>) -> Result<Recorded, StoreError> {
        Ok(Recorded::default())
    }
    fn release(&self, _p: Option<&PartitionKey>, _permit: Permit) {}
    fn circuit_metrics(
        &self,
        _p: Option<&PartitionKey>,
        _now: Duration,
    ) -> Result<CircuitMetrics, StoreError> {
        Ok(CircuitMetrics::closed_empty())
    }
    fn control_circuit(
        &self,
        _p: Option<&PartitionKey>,
        _c: CircuitControl,
        _now: Duration,
    ) -> Result<Option<CircuitTransition>, StoreError> {
        Ok(None)
    }
    fn in_flight(&self, _p: Option<&PartitionKey>, _now: Duration) -> Result<u32, StoreError> {
        Ok(0)
    }
}
