use retry::retryable;
#[derive(Debug, thiserror::Error, retry::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retry::Stopped),
}

#[retryable(deadline = "1s", idempotent, breaker(threshold = 5))]
async fn fetch() -> Result<u32, E> {
    Ok(1)
}

fn main() {}
