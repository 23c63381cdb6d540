//! Tests only: what a sync-only user writes. A blocking client of a
//! key-value store whose `get` is refused while the store starts, retried by
//! `#[retryable]` on a plain `fn`, with `retries` built without its `tokio`
//! feature, so tokio is not in this crate's dependency tree.

use std::cell::Cell;

use retries::{Classify, retryable};

/// The store's errors.
#[derive(Debug, thiserror::Error, Classify)]
pub enum StoreError {
    /// The store refused the connection: nothing was read.
    #[error("connection refused")]
    #[classify(not_executed)]
    Refused,
    /// The call was stopped (deadline, open circuit, …).
    #[error(transparent)]
    #[classify(permanent)]
    Stopped(#[from] retries::Stopped),
}

/// A store that refuses its first `refusals` calls.
#[derive(Debug)]
pub struct Store {
    refusals: Cell<u32>,
    /// Calls received.
    pub calls: Cell<u32>,
}

impl Store {
    /// A store that refuses `refusals` calls, then answers.
    #[must_use]
    pub fn new(refusals: u32) -> Self {
        Self {
            refusals: Cell::new(refusals),
            calls: Cell::new(0),
        }
    }

    fn raw_get(&self, key: &str) -> Result<String, StoreError> {
        self.calls.set(self.calls.get() + 1);
        if self.refusals.get() > 0 {
            self.refusals.set(self.refusals.get() - 1);
            return Err(StoreError::Refused);
        }
        Ok(format!("value of {key}"))
    }

    /// `get`, retried: three attempts within one second.
    #[retryable(
        deadline = "1s",
        max_attempts = 3,
        idempotent,
        backoff = "constant",
        initial_backoff = "2ms"
    )]
    pub fn get(&self, key: &str) -> Result<String, StoreError> {
        self.raw_get(key)
    }
}
