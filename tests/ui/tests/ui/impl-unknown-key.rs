use retries::retryable;
#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

struct Client;

#[retryable(deadline = "1s", idempotent, attempt = at, max_attempt = 3)]
impl Client {
    async fn uses_the_attempt(&self) -> Result<u32, E> {
        Ok(at.number())
    }
}

fn main() {}
