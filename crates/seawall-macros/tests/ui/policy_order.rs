use seawall::resilient;

#[derive(Debug)]
struct E;

#[resilient(bulkhead(max_concurrent = 1), retry, bulkhead(max_concurrent = 2))]
fn bulkhead_on_both_sides() -> Result<(), E> {
    Ok(())
}

#[resilient(retry, retry)]
fn retry_twice() -> Result<(), E> {
    Ok(())
}

#[resilient(retry, timeout_ms = 100, timeout_ms = 200)]
fn two_attempt_timeouts() -> Result<(), E> {
    Ok(())
}

#[resilient(retry, coalesce)]
fn coalesce_after_retry() -> Result<(), E> {
    Ok(())
}

#[resilient(coalesce(ttl_s = 1), retry)]
fn coalesce_without_a_key(id: u64) -> Result<u64, E> {
    Ok(id)
}

fn main() {}
