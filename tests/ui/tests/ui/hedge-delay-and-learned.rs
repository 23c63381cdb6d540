use retries::{LearnedDelay, retryable};
use std::time::Duration;

static DELAY: LearnedDelay = LearnedDelay::new(0.05, Duration::from_millis(1), Duration::from_secs(1));

#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

#[retryable(deadline = "1s", idempotent, hedge(max_attempts = 2, delay = "50ms", learned = DELAY))]
async fn price() -> Result<u32, E> {
    Err(E::Refused)
}

fn main() {}
