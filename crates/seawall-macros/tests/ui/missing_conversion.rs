use seawall::resilient;

/// Can hold none of seawall's own errors.
#[derive(Debug)]
struct E;

#[resilient(retry(max_attempts = 3), circuit_breaker(consecutive_failures = 5))]
fn rejections() -> Result<(), E> {
    Ok(())
}

#[resilient(timeout_ms = 500)]
async fn timeouts() -> Result<(), E> {
    Ok(())
}

fn store() -> seawall::MemoryStore {
    seawall::MemoryStore::new()
}

#[derive(Debug)]
struct CanReject;

impl From<seawall::Rejection> for CanReject {
    fn from(_: seawall::Rejection) -> Self {
        CanReject
    }
}

#[resilient(bulkhead(max_concurrent = 2), store = store)]
fn store_failures() -> Result<(), CanReject> {
    Ok(())
}

fn main() {}
