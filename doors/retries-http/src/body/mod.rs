//! The body of a request, sent again for a retry, and the request
//! extensions a caller sets.
//!
//! A door gets each attempt's body from one [`Replay`] per call, in one of
//! two ways:
//!
//! * **copied as it is sent** (any body, the default): what the first
//!   attempt reads is kept, up to a cap ([`DEFAULT_CAP`], 64 KiB; per
//!   request with [`BodyCap`]), and replayed to the next; past the cap the
//!   call is committed to the attempt in flight ([`Lost::OverCap`]);
//! * **opened again for each attempt** ([`Reopen`], a request extension):
//!   from a file (re-opened and read from the start, and refused if it
//!   changed: [`Lost::Changed`]), from bytes, or from a factory of the
//!   caller's (a stream, a multipart form rebuilt, an object store read
//!   again). Nothing of the body is held between attempts, so a body of
//!   any size gets every attempt the policy allows.
//!
//! # What this crate chose where a body cannot be made again
//!
//! * A [`Reopen`] that fails to open (its factory returns an error, the file
//!   is gone) sends nothing and ends the call at once, as a permanent
//!   failure, with [`NotReplayed`] ([`Lost::Unopened`]) whose source is the
//!   factory's error: the factory is the caller's code, and its failures are
//!   not the server's to retry (a factory may retry inside itself).
//! * A file whose length, modification time or identity (device and inode,
//!   on Unix) differs from the first attempt's is not sent
//!   ([`Lost::Changed`]): a different body must never go out under the same
//!   idempotency key. A file that changes *while* it is sent is cut: its
//!   body fails after the last byte instead of ending, so the server never
//!   receives it whole.
//! * A request that carries a [`Reopen`] and a body of its own: the
//!   `Reopen` is sent, the request's body is dropped.

mod reopen;
mod replay;

use std::time::Instant;

use http::HeaderMap;

pub use reopen::{Opened, Reopen};
pub use replay::{Next, Replay, ReplayBody};

/// The error type of a [`ReplayBody`]: the caller's body's error, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The default cap on the bytes kept for replay: 64 KiB.
pub const DEFAULT_CAP: usize = 64 * 1024;

/// A request extension that declares whether this request is safe to repeat,
/// overriding every other rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Idempotency(pub bool);

/// A request extension carrying a deadline for the whole call (the earlier of
/// it and the layer's policy applies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(pub Instant);

/// A request extension naming the request's route template (`/users/{id}`):
/// the call then reports (in its events and metrics) as `GET /users/{id}`
/// instead of under the door's name. Give a template, never the raw path:
/// a path with ids in it would make a label per request. (A gRPC call
/// through the tower layer is named by its method path without it.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route(pub &'static str);

/// A request extension: the most bytes of this request's body kept for
/// replay, instead of the door's cap (`body_cap`, by default
/// [`DEFAULT_CAP`]). Memory is held for at most this many bytes per call
/// in flight; a body that can be opened again ([`Reopen`]) needs no cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyCap(pub usize);

/// An error that would have been retried, returned as it is because the
/// request's body could not be sent again.
#[derive(Debug, thiserror::Error)]
#[error("not retried: {lost}")]
pub struct NotReplayed {
    lost: Lost,
    #[source]
    source: BoxError,
}

impl NotReplayed {
    /// The error of a door that could not send `lost`'s body again;
    /// `source` is the error that would have been retried (or, for
    /// [`Lost::Unopened`] and [`Lost::Changed`], why the body could not be
    /// opened).
    #[must_use]
    pub fn new(lost: Lost, source: BoxError) -> Self {
        Self { lost, source }
    }

    /// Why the body could not be sent again.
    #[must_use]
    pub fn lost(&self) -> Lost {
        self.lost
    }
}

/// What a door's `on_retry` hook (the tower layer's, the reqwest
/// middleware's) is told of the attempt that failed, as the error of its
/// [`RetryEvent`](retries_core::RetryEvent).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum FailedAttempt<'a> {
    /// A response that counts as a failed attempt (by the status table, a
    /// service config's codes, or `retry_if`).
    Response {
        /// Its status.
        status: http::StatusCode,
        /// Its headers (`Retry-After`, `grpc-status`, …).
        headers: &'a HeaderMap,
    },
    /// An error: the connection, a timeout, the inner service, `reconcile`.
    Error(&'a (dyn std::error::Error + Send + Sync + 'static)),
    /// Nothing was sent: the request's body could no longer be replayed.
    NotSent(Lost),
}

/// Why a body cannot be sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Lost {
    /// More than the cap was read: the bytes sent are no longer held, and
    /// the call was committed to the attempt that read them.
    OverCap {
        /// The cap, in bytes ([`BodyCap`], or the door's `body_cap`).
        cap: usize,
        /// The bytes of the body read and sent when this was told.
        sent: u64,
    },
    /// The caller's body failed while it was read.
    Failed,
    /// The file of a [`Reopen::file`] is not the one the first attempt
    /// sent: its length, modification time or identity changed.
    Changed,
    /// A [`Reopen`] could not be opened: its factory failed, or its file
    /// could not be opened.
    Unopened,
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::OverCap { cap, sent } => write!(
                f,
                "the request body passed the replay cap of {cap} bytes ({sent} bytes sent), so the call was committed to its attempt; \
                 give the request a `Reopen` body or a larger `BodyCap` to retry it"
            ),
            Self::Failed => {
                f.write_str("the request body failed while it was sent, so it cannot be sent again")
            }
            Self::Changed => f.write_str(
                "the request body's file changed since the first attempt, so it is not sent again under the same request",
            ),
            Self::Unopened => f.write_str("the request body could not be opened for the attempt"),
        }
    }
}
