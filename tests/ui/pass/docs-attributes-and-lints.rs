//! Generated code is warning-free under strict lints, and the function keeps
//! its docs and attributes (a dropped doc comment would trip `missing_docs`).
#![deny(warnings, missing_docs, unused_qualifications, unused_results)]

use retries::{Attempt, Failure, retryable};

/// The error.
#[derive(Debug, thiserror::Error, retries::Classify)]
pub enum E {
    /// Refused.
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    /// Stopped.
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

/// Documented.
#[retryable(deadline = "1s", idempotent)]
#[must_use = "the answer matters"]
#[inline]
pub async fn fetch() -> Result<u32, E> {
    Ok(1)
}

/// Every key at once.
#[retryable(
    deadline = "2s",
    max_attempts = 4,
    attempt_timeout = "500ms",
    reserve = "100ms",
    min_attempt = "5ms",
    backoff = "exponential",
    initial_backoff = "50ms",
    max_backoff = "400ms",
    multiplier = 3.0,
    jitter = 0.2,
    idempotent = false,
    reconcile = lookup,
    recover = keep,
    classify = |_e: &E| retries::Verdict::unknown(),
    on_retry = |_ev: &retries::RetryEvent<'_, E>| {},
    attempt = at,
    budget = "none",
    crate = "::retries"
)]
pub async fn everything(x: u32) -> Result<u32, E> {
    Ok(x + at.number())
}

// The hook's signature is the attribute's, whatever this stand-in does.
#[allow(clippy::unused_async)]
async fn lookup(_: retries::IdempotencyKey) -> Result<Option<u32>, E> {
    Ok(None)
}

fn keep<T>(f: Failure<E>) -> Result<T, E> {
    Err(f.into_error())
}

/// A shared policy with a per-function override.
const POLICY: retries::Policy = retries::Policy::new(std::time::Duration::from_secs(1)).validated();

/// Uses the shared policy.
#[retryable(policy = POLICY, max_attempts = 2, idempotent, attempt = _at)]
pub async fn shared(_unused: &Attempt) -> Result<(), E> {
    Ok(())
}

/// A blocking fn, every key a blocking fn takes at once.
#[retryable(
    deadline = "2s",
    max_attempts = 4,
    reserve = "100ms",
    backoff = "constant",
    initial_backoff = "1ms",
    idempotent = false,
    reconcile = lookup_now,
    recover = keep,
    on_retry = |_ev: &retries::RetryEvent<'_, E>| {},
    attempt = at,
    budget = "none"
)]
#[must_use = "the answer matters"]
pub fn blocking(x: u32) -> Result<u32, E> {
    if x == 0 {
        return Err(E::Refused);
    }
    Ok(x + at.number())
}

#[allow(clippy::unnecessary_wraps)]
fn lookup_now(_: retries::IdempotencyKey) -> Result<Option<u32>, E> {
    Ok(None)
}

fn main() {}
