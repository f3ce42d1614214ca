use seawall::resilient;

#[derive(Debug)]
struct E;

#[resilient(circuit_breaker(consecutive_failures = 5), retry(max_attempts = 3))]
fn breaker_before_retry() -> Result<(), E> {
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
