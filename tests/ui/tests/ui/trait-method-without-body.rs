use retries::retryable;
#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

trait Store {
    #[retryable(deadline = "1s", idempotent)]
    async fn load(&self) -> Result<u32, E>;
}

fn main() {}
