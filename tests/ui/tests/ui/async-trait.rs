use retries::retryable;
#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

#[async_trait::async_trait]
trait Store {
    async fn load(&self) -> Result<u32, E>;
}

struct Disk;

#[async_trait::async_trait]
impl Store for Disk {
    #[retryable(deadline = "1s", idempotent)]
    async fn load(&self) -> Result<u32, E> {
        Ok(1)
    }
}

fn main() {}
