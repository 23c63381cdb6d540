use retries::retryable;

#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

static LIMITS: u32 = 5;

// Each reported at the value first, with what the key takes.
#[retryable(deadline = "1s", idempotent, budget = LIMITS)]
async fn budgeted() -> Result<(), E> {
    Err(E::Refused)
}

#[retryable(deadline = "1s", idempotent, breaker = LIMITS)]
async fn guarded() -> Result<(), E> {
    Err(E::Refused)
}

fn main() {}
