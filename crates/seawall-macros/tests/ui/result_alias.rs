use seawall::resilient;

#[derive(Debug)]
struct E;

type ApiResult<T> = Result<T, E>;

#[resilient(retry(max_attempts = 3))]
fn aliased() -> ApiResult<u32> {
    Ok(5)
}

fn main() {}
