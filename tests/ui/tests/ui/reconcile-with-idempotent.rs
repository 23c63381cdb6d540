use retries::{retryable, IdempotencyKey};
#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

async fn lookup(_: IdempotencyKey) -> Result<Option<u32>, E> {
    Ok(None)
}

#[retryable(deadline = "1s", idempotent = true, reconcile = lookup)]
async fn fetch() -> Result<u32, E> {
    Ok(1)
}

fn main() {}
