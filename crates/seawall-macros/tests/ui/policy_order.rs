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

fn main() {}
