//! The expansion resolves every name absolutely: a test crate with modules
//! named `core` and `retries` at its root, under strict lints.
#![deny(warnings, unused_qualifications)]

mod core {}

mod retries {
    #[allow(dead_code)]
    pub(crate) struct Policy;
}

#[derive(Debug, thiserror::Error, ::retries::Classify)]
enum Error {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] ::retries::Stopped),
}

#[::retries::retryable(deadline = "1s", max_attempts = 2, idempotent, attempt = at)]
async fn twice() -> Result<u32, Error> {
    if at.number() == 1 {
        return Err(Error::Refused);
    }
    Ok(at.number())
}

#[tokio::test(start_paused = true)]
async fn shadowing_modules_do_not_capture_generated_paths() {
    assert_eq!(twice().await.unwrap(), 2);
}
