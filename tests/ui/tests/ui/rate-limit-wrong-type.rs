use retries::retryable;
#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

// A concurrency limit where a rate limit is expected: the error points at it.
static LIMIT: retries::limit::Concurrency = retries::limit::Concurrency::new(4, std::time::Duration::from_millis(10));

#[retryable(deadline = "1s", idempotent, rate_limit = LIMIT)]
async fn fetch() -> Result<u32, E> {
    Ok(1)
}

fn main() {}
