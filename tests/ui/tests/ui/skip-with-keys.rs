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

#[retryable(deadline = "1s", idempotent)]
impl Client {
    #[retryable(skip, max_attempts = 2)]
    async fn half_skipped(&self) -> Result<u32, E> {
        Ok(1)
    }
}

fn main() {}
