use retries::{retryable, Failure};
#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

fn to_zero(_: Failure<E>) -> u32 {
    0
}

#[retryable(deadline = "1s", idempotent, recover = to_zero)]
async fn fetch() -> Result<u32, E> {
    Ok(1)
}

fn main() {}
