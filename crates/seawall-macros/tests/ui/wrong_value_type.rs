use seawall::resilient;

#[derive(Debug)]
struct E;

#[resilient(retry(max_attempts = "3"))]
fn string_for_a_count() -> Result<(), E> {
    Ok(())
}

#[resilient(retry(backoff = exponential))]
fn path_for_a_string() -> Result<(), E> {
    Ok(())
}

#[resilient(circuit_breaker(failure_rate = "half"))]
fn string_for_a_rate() -> Result<(), E> {
    Ok(())
}

#[resilient(fallback = "later")]
fn string_for_a_function() -> Result<(), E> {
    Ok(())
}

#[resilient(bulkhead(max_concurrent = 2, shadow = "yes"))]
fn string_for_a_flag() -> Result<(), E> {
    Ok(())
}

#[resilient(retry = 3)]
fn value_for_a_list() -> Result<(), E> {
    Ok(())
}

fn main() {}
