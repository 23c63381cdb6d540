//! Tests only. This crate depends on `retries` under the name `renamed_retry`,
//! so nothing named `retries` exists here: every path the macros generate must
//! go through `crate = "…"`. It also defines modules named `core` and
//! `retries`, and denies every warning the generated code could cause.
#![deny(warnings, unused_qualifications, unused_results, missing_docs)]

/// Shadows the `core` crate for any path generated without a leading `::`.
pub mod core {}

/// A local module named like the library.
pub mod retries {
    /// Not the library's `call`.
    pub fn call() {}
}

use renamed_retry::{Attempt, Classify, retryable};

/// The error of this crate.
#[derive(Debug, thiserror::Error, Classify)]
#[classify(crate = "::renamed_retry")]
pub enum Error {
    /// Refused before sending.
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    /// Stopped by the library.
    #[error(transparent)]
    Stopped(#[from] renamed_retry::Stopped),
}

/// A client of a flaky service.
#[derive(Debug, Default)]
pub struct Client {
    /// Attempts seen.
    pub attempts: std::sync::atomic::AtomicU32,
}

impl Client {
    /// Refused twice, then answers with the attempt number.
    #[retryable(
        crate = "::renamed_retry",
        deadline = "1s",
        max_attempts = 3,
        idempotent,
        attempt = at,
        backoff = "constant",
        initial_backoff = "10ms"
    )]
    pub async fn fetch(&self) -> Result<u32, Error> {
        let _ = self
            .attempts
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        retries::call();
        if at.number() < 3 {
            return Err(Error::Refused);
        }
        Ok(at.number())
    }

    /// Never answers: the 50 ms deadline cuts the attempt off, and the stop
    /// maps through `From<Stopped>` with the renamed path.
    #[retryable(
        crate = "::renamed_retry",
        deadline = "50ms",
        idempotent,
        budget = "none",
        backoff = "constant",
        initial_backoff = "100ms"
    )]
    pub async fn never(&self, _at: Option<&Attempt>) -> Result<(), Error> {
        std::future::pending::<()>().await;
        Err(Error::Refused)
    }
}
