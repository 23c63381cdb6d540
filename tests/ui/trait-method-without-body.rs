use retry::retryable;
#[derive(Debug, thiserror::Error, retry::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retry::Stopped),
}

trait Store {
    #[retryable(deadline = "1s", idempotent)]
    async fn load(&self) -> Result<u32, E>;
}

fn main() {}
