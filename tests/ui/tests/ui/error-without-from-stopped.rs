use retries::retryable;

#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
}

#[retryable(deadline = "1s", idempotent)]
async fn fetch() -> Result<u32, E> {
    Err(E::Refused)
}

fn main() {}
