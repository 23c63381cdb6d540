use retries::retryable;

#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

#[retryable(deadline = "1s", idempotent)]
#[retries::retryable(deadline = "2s", max_attempts = 5, idempotent)]
async fn fetch() -> Result<u32, E> {
    Err(E::Refused)
}

fn main() {}
