use seawall::resilient;

#[derive(Debug)]
struct E;

#[resilient(retry(max_attempts = 0))]
fn no_attempts() -> Result<(), E> {
    Ok(())
}

#[resilient(circuit_breaker(failure_rate = 1.5))]
fn rate_above_one() -> Result<(), E> {
    Ok(())
}

#[resilient(retry(backoff_ms = 500, cap_ms = 100))]
fn cap_below_backoff() -> Result<(), E> {
    Ok(())
}

#[resilient(retry(jitter = "random"))]
fn unknown_jitter() -> Result<(), E> {
    Ok(())
}

#[resilient(timeout_s = 60, bulkhead(max_concurrent = 4))]
fn lease_shorter_than_timeout() -> Result<(), E> {
    Ok(())
}

#[resilient(rate_limiter(limit = 0, per_s = 1))]
fn no_permits() -> Result<(), E> {
    Ok(())
}

fn main() {}
