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

#[retryable(deadline = "1s")]
impl Client {
    #[retryable(max_attempts = 2)]
    async fn declared_nowhere(&self) -> Result<u32, E> {
        Ok(1)
    }

    #[retryable(idempotent)]
    async fn declared_here(&self) -> Result<u32, E> {
        Ok(2)
    }
}

fn main() {}
