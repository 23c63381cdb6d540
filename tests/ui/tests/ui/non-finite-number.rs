use retries::retryable;

#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

#[retryable(deadline = "1s", idempotent, multiplier = 1e400)]
async fn grows() -> Result<(), E> {
    Err(E::Refused)
}

#[retryable(deadline = "1s", idempotent, jitter = -1e400)]
async fn spreads() -> Result<(), E> {
    Err(E::Refused)
}

fn main() {}
