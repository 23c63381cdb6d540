use retries::retryable;

#[derive(Debug, thiserror::Error)]
enum E {
    #[error("refused")]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

#[retryable(deadline = "1s", idempotent)]
async fn fetch() -> Result<u32, E> {
    Err(E::Refused)
}

fn main() {}
