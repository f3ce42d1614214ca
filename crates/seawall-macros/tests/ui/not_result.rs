use seawall::resilient;

#[resilient(retry(max_attempts = 3))]
fn returns_a_number() -> u32 {
    7
}

#[resilient(retry(max_attempts = 3))]
async fn returns_an_option() -> Option<u32> {
    Some(7)
}

#[resilient(retry(max_attempts = 3))]
fn returns_nothing() {}

fn main() {}
