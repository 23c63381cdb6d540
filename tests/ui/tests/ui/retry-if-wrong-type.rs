use retries::retryable;
#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

#[retryable(deadline = "1s", idempotent, retry_if = |v: &String| v.is_empty().then(retries::Verdict::not_executed))]
async fn count() -> Result<u32, E> {
    Ok(1)
}

fn main() {}
