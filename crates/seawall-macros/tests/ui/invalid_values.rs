use seawall::resilient;

#[derive(Debug)]
struct E;

#[resilient(retry(jitter = "random"))]
fn unknown_jitter() -> Result<(), E> {
    Ok(())
}

#[resilient(retry(backoff = "constant", cap_ms = 100))]
fn constant_with_cap() -> Result<(), E> {
    Ok(())
}

#[resilient(retry(max_attempts = 4294967296))]
fn attempts_beyond_u32() -> Result<(), E> {
    Ok(())
}

#[resilient(rate_limiter(limit = 10, per_s = 1, algorithm = "fixed_window", burst = 2))]
fn burst_of_a_window() -> Result<(), E> {
    Ok(())
}

#[resilient(adaptive_limit(partitions = "live:0.9"))]
fn shares_without_equals() -> Result<(), E> {
    Ok(())
}

#[resilient(adaptive_limit(algorithm = "vegas", min_rtt_samples = 10))]
fn half_a_baseline_measurement() -> Result<(), E> {
    Ok(())
}

fn main() {}
