use retries::retryable;
#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

fn consume(_: String) {}

#[retryable(deadline = "1s", idempotent)]
async fn send(body: String) -> Result<(), E> {
    consume(body);
    Ok(())
}

fn main() {}
