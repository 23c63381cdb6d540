use retries::retryable;
#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

static LIMIT: retries::limit::Concurrency = retries::limit::Concurrency::new(4, std::time::Duration::from_millis(10));

#[retryable(deadline = "1s", idempotent, concurrency = LIMIT)]
fn fetch() -> Result<u32, E> {
    Ok(1)
}

fn main() {}
