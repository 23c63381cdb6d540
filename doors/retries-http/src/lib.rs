//! What the HTTP doors of [`retries`](https://docs.rs/retries) share, on
//! `http` 1: the request extensions a caller sets ([`Idempotency`],
//! [`Deadline`], [`Route`], [`BodyCap`], [`Reopen`]), the body that can be
//! sent again ([`ReplayBody`]: copied as it is sent, or opened again for
//! each attempt, from a file, bytes or a factory; see [`Replay`]), the errors and events of a request that could not be
//! ([`NotReplayed`], [`Lost`], [`FailedAttempt`]), and, for door authors,
//! the rules and settings every HTTP door applies ([`door`]), the proof
//! of deduplication a keyed resend waits for ([`proof`]), and the quota a
//! server announces on its answers (`RateLimit`, `X-RateLimit-*`,
//! `x-amz-retry-after`: [`quota`]).
//!
//! `retries-tower` (hyper clients, tonic channels) and `retries-reqwest`
//! (`reqwest-middleware`) are built on it, and so is `retries-chaos`'s
//! HTTP side; each re-exports what its users name, so a user of one door
//! needs no import from here.
//!
//! # Why a crate of its own
//!
//! The rule of `retries-core` is that it holds the loop and the words a
//! call needs (the status table that classifies an HTTP answer stays there,
//! beside `Classify`); what only doors share lives in a crate those doors
//! share. So a change an HTTP door needs is a release of this crate and of
//! the doors, never of the `retries` facade a user of `#[retryable]`
//! depends on.
//!
//! # Versions
//!
//! Like every door crate, this one pins `retries-core` with `=`: it is
//! built on the core's door seam, which is exempt from semver (see
//! `retries_core::door`).
#![cfg_attr(docsrs, feature(doc_cfg))]

mod body;
pub mod door;
mod ended;
pub mod proof;
pub mod quota;

pub use ended::Ended;

pub use body::{
    BodyCap, BoxError, DEFAULT_CAP, Deadline, FailedAttempt, Idempotency, Lost, Next, NotReplayed,
    Opened, Reopen, Replay, ReplayBody, Route,
};
