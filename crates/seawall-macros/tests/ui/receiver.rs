use seawall::resilient;

#[derive(Debug)]
struct E;

struct Client;

impl Client {
    #[resilient(retry(max_attempts = 3))]
    fn by_value(self) -> Result<(), E> {
        Ok(())
    }

    #[resilient(retry(max_attempts = 3))]
    async fn exclusive(&mut self) -> Result<(), E> {
        Ok(())
    }

    #[resilient(retry(max_attempts = 3))]
    async fn exclusive_argument(&self, buffer: &mut Vec<u8>) -> Result<(), E> {
        buffer.clear();
        Ok(())
    }
}

fn main() {}
