use retry::retryable;
#[derive(Debug, thiserror::Error, retry::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retry::Stopped),
}

#[retryable(deadline = "1s", idempotent, nested = "inner")]
async fn fetch() -> Result<u32, E> {
    Ok(1)
}

fn main() {}
