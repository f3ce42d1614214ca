//! The code `#[resilient(...)]` generates raises no warning in the user's
//! crate: this file compiles under `#![deny(warnings)]`, with bodies
//! written on one line, which rustc would lint as redundant braces if the
//! expansion nested them.
#![deny(warnings)]

use seawall::{resilient, Rejection};

#[derive(Debug, PartialEq)]
struct LookupError;

impl From<Rejection> for LookupError {
    fn from(_: Rejection) -> Self {
        LookupError
    }
}

#[rustfmt::skip]
#[resilient(circuit_breaker(consecutive_failures = 5))]
fn lookup() -> Result<u64, LookupError> { Ok(3) }

#[rustfmt::skip]
#[resilient(retry(max_attempts = 2, backoff_ms = 1))]
fn double(n: u64) -> Result<u64, LookupError> { Ok(n * 2) }

#[rustfmt::skip]
#[resilient(retry(max_attempts = 2, backoff_ms = 1))]
async fn fetch(n: &u64) -> Result<u64, LookupError> { Ok(*n + 1) }

struct Catalog(u64);

impl Catalog {
    #[rustfmt::skip]
    #[resilient(circuit_breaker(consecutive_failures = 5))]
    fn size(&self) -> Result<u64, LookupError> { Ok(self.0) }
}

#[test]
fn one_line_bodies_compile_without_warnings() {
    assert_eq!(lookup(), Ok(3));
    assert_eq!(double(4), Ok(8));
    assert_eq!(Catalog(9).size(), Ok(9));
}

#[tokio::test]
async fn a_one_line_async_body_compiles_without_warnings() {
    assert_eq!(fetch(&1).await, Ok(2));
}
