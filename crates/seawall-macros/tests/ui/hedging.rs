use seawall::resilient;

#[derive(Debug)]
struct E;

#[resilient(hedging(delay_ms = 10))]
fn hedging_on_a_sync_fn() -> Result<(), E> {
    Ok(())
}

#[resilient(retry, hedging(mode = "fallback"))]
async fn retry_and_hedging() -> Result<(), E> {
    Ok(())
}

#[resilient(hedging(mode = "parallel", delay_ms = 10))]
async fn a_delay_in_parallel_mode() -> Result<(), E> {
    Ok(())
}

#[resilient(hedging(max_hedged_attempts = 2))]
async fn no_delay_in_latency_mode() -> Result<(), E> {
    Ok(())
}

#[resilient(hedging(delay_ms = 10, budget(ratio = 0.1, max_tokens = 5, shared)))]
async fn a_shared_hedging_budget() -> Result<(), E> {
    Ok(())
}

fn main() {}
