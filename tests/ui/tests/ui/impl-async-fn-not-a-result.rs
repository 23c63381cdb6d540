use retries::retryable;

#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

struct Client;

// Every `async fn` of the block is retried; one that returns no `Result`
// must say it is left alone.
#[retryable(deadline = "1s", idempotent)]
impl Client {
    async fn get(&self) -> Result<u32, E> {
        Err(E::Refused)
    }

    async fn warm_up(&self) {}

    async fn size(&self) -> usize {
        0
    }
}

fn main() {}
