//! What a handler is given ([`Call`]) and what it fails with
//! ([`HandlerError`]).

use std::fmt;

use retries_core::{Classify, IdempotencyKey, Verdict};

/// One durable call as its handler sees it.
#[derive(Debug, Clone)]
pub struct Call {
    pub(super) id: i64,
    pub(super) name: String,
    pub(super) key: IdempotencyKey,
    pub(super) payload: Vec<u8>,
    pub(super) attempts: u32,
    pub(super) trace: Option<String>,
}

impl Call {
    /// The handler's name it was enqueued for.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The call's idempotency key (also every attempt's
    /// [`Attempt::idempotency_key`](retries_core::Attempt::idempotency_key)).
    #[must_use]
    pub fn key(&self) -> IdempotencyKey {
        self.key
    }

    /// The payload, as enqueued.
    #[must_use]
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The payload read as JSON.
    ///
    /// # Errors
    ///
    /// A payload that is not a `T` in JSON: a permanent [`HandlerError`]
    /// (the call is dead, `permanent`, never retried).
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, HandlerError> {
        serde_json::from_slice(&self.payload).map_err(|e| {
            HandlerError::new(
                Verdict::permanent(),
                format!("the payload is not the handler's JSON: {e}"),
            )
        })
    }

    /// Attempts started for it before this claim, in any worker.
    #[must_use]
    pub fn earlier_attempts(&self) -> u32 {
        self.attempts
    }

    /// The enqueuing transaction's trace (`traceparent`), if given.
    #[must_use]
    pub fn trace(&self) -> Option<&str> {
        self.trace.as_deref()
    }
}

/// A handler's failure, with its verdict: what the engine classifies. Any
/// error that classifies converts into it (`?` in a handler returning
/// `Result<(), HandlerError>`), keeping its verdict and its text.
#[derive(Debug, Clone)]
pub struct HandlerError {
    pub(super) message: String,
    pub(super) verdict: Verdict,
    pub(super) fenced: bool,
}

impl HandlerError {
    /// A failure with `verdict`, said by `message`.
    pub fn new(verdict: Verdict, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            verdict,
            fenced: false,
        }
    }

    /// Any classified error, its verdict kept.
    pub fn from_error<E: Classify + fmt::Display>(e: &E) -> Self {
        Self::new(e.classify(), e.to_string())
    }

    pub(super) fn cut() -> Self {
        Self::new(
            Verdict::unknown(),
            "an attempt started in a worker that died, or was cut mid-call: the outcome is unknown",
        )
    }

    pub(super) fn fenced() -> Self {
        Self {
            fenced: true,
            ..Self::new(
                Verdict::permanent(),
                "the call's lease was taken over by another worker",
            )
        }
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for HandlerError {}

impl Classify for HandlerError {
    fn classify(&self) -> Verdict {
        self.verdict
    }
}

impl From<sqlx_core::Error> for HandlerError {
    fn from(e: sqlx_core::Error) -> Self {
        Self::from_error(&e)
    }
}

impl From<std::io::Error> for HandlerError {
    fn from(e: std::io::Error) -> Self {
        Self::from_error(&e)
    }
}
