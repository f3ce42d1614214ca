use seawall::resilient;

#[derive(Debug)]
struct E;

#[resilient(retry(max_attempts = 3))]
fn shown() -> Result<impl std::fmt::Display, E> {
    Ok(5)
}

#[resilient(retry(max_attempts = 3))]
async fn numbers() -> Result<Vec<impl Iterator<Item = u8>>, E> {
    Ok(vec![vec![1u8].into_iter()])
}

fn main() {}
