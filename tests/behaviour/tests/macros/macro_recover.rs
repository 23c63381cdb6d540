//! `recover`: one generic function serves functions of any return type,
//! including `()` and primitives; an async recover works too.

use std::sync::atomic::{AtomicU32, Ordering};

use retries::{Classify, Failure, Reason, retryable};

#[derive(Debug, thiserror::Error, Classify)]
enum PayError {
    #[error("service unavailable")]
    #[classify(unknown)]
    Unavailable,
    #[error("invalid request")]
    #[classify(permanent)]
    Invalid,
    #[error("stopped after {0} attempts")]
    #[classify(permanent)]
    GaveUp(u32),
}

/// The one recover function: every stop becomes `GaveUp(attempts)`. Note that
/// `PayError` has no `From<Stopped>`: with `recover`, it does not need one.
#[allow(clippy::needless_pass_by_value)] // a recover hook owns the failure
fn give_up<T>(f: Failure<PayError>) -> Result<T, PayError> {
    Err(PayError::GaveUp(f.attempts()))
}

static CALLS: AtomicU32 = AtomicU32::new(0);

async fn unavailable() -> Result<(), PayError> {
    CALLS.fetch_add(1, Ordering::SeqCst);
    tokio::task::yield_now().await;
    Err(PayError::Unavailable)
}

#[retryable(deadline = "1s", max_attempts = 2, idempotent, recover = give_up)]
async fn unit() -> Result<(), PayError> {
    unavailable().await
}

#[retryable(deadline = "1s", max_attempts = 2, idempotent, recover = give_up)]
async fn number() -> Result<u64, PayError> {
    unavailable().await?;
    Ok(1)
}

#[retryable(deadline = "1s", max_attempts = 2, idempotent, recover = give_up)]
async fn flag() -> Result<bool, PayError> {
    unavailable().await.map(|()| true)
}

#[retryable(deadline = "1s", max_attempts = 2, idempotent, recover = give_up)]
async fn text() -> Result<String, PayError> {
    unavailable().await?;
    Ok(String::new())
}

#[retryable(deadline = "1s", max_attempts = 3, idempotent, recover = give_up)]
async fn invalid() -> Result<Vec<u8>, PayError> {
    Err(PayError::Invalid)
}

#[tokio::test(start_paused = true)]
async fn one_generic_recover_for_every_return_type() {
    assert!(matches!(unit().await, Err(PayError::GaveUp(2))));
    assert!(matches!(number().await, Err(PayError::GaveUp(2))));
    assert!(matches!(flag().await, Err(PayError::GaveUp(2))));
    assert!(matches!(text().await, Err(PayError::GaveUp(2))));
    assert!(matches!(invalid().await, Err(PayError::GaveUp(1))));
    assert_eq!(CALLS.load(Ordering::SeqCst), 8);
}

/// A recover that answers from a cache, asynchronously, and only for stops it
/// understands.
async fn from_cache(f: Failure<PayError>) -> Result<u64, PayError> {
    tokio::task::yield_now().await;
    match f.reason() {
        Reason::Exhausted | Reason::DeadlineExceeded => Ok(42),
        _ => Err(f.into_last_error().unwrap_or(PayError::Invalid)),
    }
}

#[retryable(deadline = "1s", max_attempts = 2, idempotent, recover = from_cache)]
async fn cached_price() -> Result<u64, PayError> {
    tokio::task::yield_now().await;
    Err(PayError::Unavailable)
}

#[retryable(deadline = "1s", idempotent, recover = from_cache)]
async fn rejected_price() -> Result<u64, PayError> {
    Err(PayError::Invalid)
}

#[tokio::test(start_paused = true)]
async fn async_recover() {
    assert_eq!(cached_price().await.unwrap(), 42);
    assert!(matches!(rejected_price().await, Err(PayError::Invalid)));
}

#[tokio::test(start_paused = true)]
async fn a_closure_recover_sees_the_failure() {
    #[retryable(
        deadline = "50ms",
        idempotent,
        recover = |f: Failure<PayError>| -> Result<(u32, Reason), PayError> { Ok((f.attempts(), f.reason())) }
    )]
    async fn hangs() -> Result<(u32, Reason), PayError> {
        std::future::pending().await
    }
    assert_eq!(hangs().await.unwrap(), (1, Reason::DeadlineExceeded));
}
