use retries::retryable;

#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

#[retryable(deadline = "1s", idempotent)]
fn fetch() -> impl std::future::Future<Output = Result<u32, E>> {
    async { Err(E::Refused) }
}

fn main() {}
