use retries::retryable;

#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

// One error each, at the value: not a second one saying the setting is missing.
#[retryable(deadline = "1s", idempotent, breaker(failure_threshold = 99999999999))]
async fn tripped() -> Result<(), E> {
    Err(E::Refused)
}

#[retryable(deadline = "1s", idempotent, hedge(max_attempts = 2, delay = "2x"))]
async fn hedged() -> Result<(), E> {
    Err(E::Refused)
}

fn main() {}
