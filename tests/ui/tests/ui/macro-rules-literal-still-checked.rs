use retries::retryable;
#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

macro_rules! retried {
    ($deadline:literal) => {
        #[retryable(deadline = $deadline, idempotent)]
        async fn fetch() -> Result<u32, E> {
            Ok(1)
        }
    };
}

retried!("2x");

fn main() {}
