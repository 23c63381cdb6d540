// `retries::call` over an error type without `Classify`: the error names
// the trait and the `classify` alternative.
use std::time::Duration;

use retries::{Attempt, Policy};

#[derive(Debug, thiserror::Error)]
enum E {
    #[error("refused")]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

const POLICY: Policy = Policy::new(Duration::from_secs(1)).validated();

async fn fetch() -> Result<u32, E> {
    Err(E::Refused)
}

async fn caller() -> Result<u32, E> {
    retries::call(&POLICY)
        .idempotent()
        .run_fn(|_: &Attempt| fetch())
        .await
}

fn main() {
    let _ = caller();
}
