use retries::retryable;
#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

#[retryable(deadline = "1s", idempotent, attempt = 5)]
async fn fetch() -> Result<u32, E> {
    Ok(1)
}

fn main() {}
