use retry::{retryable, Backoff};
use std::time::Duration;
#[derive(Debug, thiserror::Error, retry::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retry::Stopped),
}

const SLOW: Backoff = Backoff::constant(Duration::from_millis(500));

#[retryable(deadline = "1s", idempotent, backoff = SLOW, max_backoff = "2s")]
async fn fetch() -> Result<u32, E> {
    Ok(1)
}

fn main() {}
