//! Which partition a request belongs to.

use crate::context::PartitionKey;

/// Gives the partition of a request: each partition (a tenant, a host) has
/// its own circuit, bulkhead, rate limit and cooldown. Implemented by every
/// `Fn(&Request) -> Option<K>` with `K: Into<PartitionKey>` (a `String`, a
/// `&'static str`, an integer); `None` puts the request in the pipeline's
/// shared state, as a call without partition.
///
/// Set on a layer with
/// [`PipelineLayer::partition_by`](super::PipelineLayer::partition_by).
pub trait PartitionRequest<Request> {
    /// The partition key of `request`, `None` for the shared state.
    fn partition_key(&self, request: &Request) -> Option<PartitionKey>;
}

impl<Request, F, K> PartitionRequest<Request> for F
where
    F: Fn(&Request) -> Option<K>,
    K: Into<PartitionKey>,
{
    fn partition_key(&self, request: &Request) -> Option<PartitionKey> {
        self(request).map(Into::into)
    }
}

/// The default partitioning: every request shares the pipeline's state.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoPartition;

impl<Request> PartitionRequest<Request> for NoPartition {
    fn partition_key(&self, _: &Request) -> Option<PartitionKey> {
        None
    }
}
