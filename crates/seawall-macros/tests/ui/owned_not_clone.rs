use seawall::resilient;

#[derive(Debug)]
struct E;

struct Order {
    id: u32,
}

#[resilient(retry(max_attempts = 3))]
fn submit(order: Order) -> Result<u32, E> {
    Ok(order.id)
}

fn main() {}
