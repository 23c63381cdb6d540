// `retries::call` without `.idempotent()` or `.not_idempotent()`: the error
// names both.
use std::time::Duration;

use retries::{Attempt, Policy};

#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

const POLICY: Policy = Policy::new(Duration::from_secs(1)).validated();

async fn fetch() -> Result<u32, E> {
    Err(E::Refused)
}

async fn caller() -> Result<u32, E> {
    retries::call(&POLICY).run_fn(|_: &Attempt| fetch()).await
}

fn main() {
    let _ = caller();
}
