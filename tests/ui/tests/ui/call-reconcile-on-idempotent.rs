// `reconcile` after `.idempotent()`: an idempotent call is simply retried.
use std::time::Duration;

use retries::{Attempt, IdempotencyKey, Policy};

#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("lost")]
    #[classify(unknown)]
    Lost,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

const POLICY: Policy = Policy::new(Duration::from_secs(1)).validated();

async fn charge() -> Result<u32, E> {
    Err(E::Lost)
}

async fn find(_key: IdempotencyKey) -> Result<Option<u32>, E> {
    Ok(None)
}

async fn caller() -> Result<u32, E> {
    retries::call(&POLICY)
        .idempotent()
        .reconcile(find)
        .run_fn(|_: &Attempt| charge())
        .await
}

fn main() {
    let _ = caller();
}
