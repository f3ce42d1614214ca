use seawall::resilient;

#[derive(Debug)]
struct E;

#[resilient(retries = 3)]
fn top_level() -> Result<(), E> {
    Ok(())
}

#[resilient(retry(max_tries = 3))]
fn inside_a_policy() -> Result<(), E> {
    Ok(())
}

#[resilient(retry(backoff_ms = 100, backoff_s = 1))]
fn given_twice() -> Result<(), E> {
    Ok(())
}

#[resilient(timeout = 100)]
fn timeout_without_unit() -> Result<(), E> {
    Ok(())
}

fn main() {}
