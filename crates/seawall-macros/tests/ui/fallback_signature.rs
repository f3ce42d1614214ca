use seawall::{resilient, Error};

#[derive(Debug)]
struct E;

struct Client;

impl Client {
    #[resilient(retry(max_attempts = 3), fallback = Self::missing_argument)]
    async fn arity(&self, id: u32) -> Result<u32, E> {
        Ok(id)
    }

    async fn missing_argument(&self, err: Error<E>) -> Result<u32, E> {
        Err(err.into_operation_error().unwrap_or(E))
    }

    #[resilient(retry(max_attempts = 3), fallback = Self::other_type)]
    async fn return_type(&self, id: u32) -> Result<u32, E> {
        Ok(id)
    }

    async fn other_type(&self, _id: u32, _err: Error<E>) -> Result<String, E> {
        Ok(String::new())
    }

    #[resilient(retry(max_attempts = 3), fallback = Self::blocking)]
    async fn not_async(&self, id: u32) -> Result<u32, E> {
        Ok(id)
    }

    fn blocking(&self, id: u32, _err: Error<E>) -> Result<u32, E> {
        Ok(id)
    }
}

fn main() {}
