use retries::retryable;
#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

const TIMEOUT_SECS: u64 = 2;

#[retryable(deadline = TIMEOUT_SECS, idempotent)]
async fn fetch() -> Result<u32, E> {
    Ok(1)
}

fn main() {}
