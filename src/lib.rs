//! Retries that are safe by construction.
//!
//! A retry is a bet that the server did not do the work yet and that doing it
//! again costs nothing. Most retry code loses that bet silently: three attempts
//! with a 10 s timeout each turn a 10 s call into 30 s; retrying a failure that
//! happened *after* the server charged the card charges it again; three layers
//! that each retry three times send 27 requests to the bottom one.
//!
//! `retries` gets these right:
//!
//! * **Three-way classification.** A failed attempt is [`Verdict::not_executed`]
//!   (the operation certainly did not run), [`Verdict::unknown`] (it may have
//!   run) or [`Verdict::permanent`] (retrying changes nothing). Error types
//!   implement [`Classify`] once.
//! * **Idempotency is declared, never assumed.** An operation that is not safe
//!   to repeat is never retried after an unknown outcome; a `reconcile` function
//!   can look the outcome up by the call's [`IdempotencyKey`] instead.
//! * **One deadline per call**, covering every attempt and every pause, with an
//!   optional per-attempt timeout and a reserve kept for the caller.
//! * **Budgets and breakers** plug in under the loop ([`Budget`], [`Breaker`]).
//! * **Every door, one engine**: `#[retryable]` on an `async fn`, a blocking
//!   `fn` or a whole `impl` block; [`call()`] with [`Retry::run`] or
//!   [`Retry::run_blocking`]; streams. Without the default `tokio` feature
//!   only the blocking door is there, and tokio is not a dependency.
//!
//! # One crate per stack
//!
//! This crate names no 0.x framework in its API; each framework's door is a
//! crate of its own, on the core's door seam (`retries_core::door`, for door
//! authors: this crate does not export it). Add the one for your stack
//! beside `retries`:
//!
//! | stack | add | one line |
//! |---|---|---|
//! | hyper clients, tonic channels (tower) | `retries-tower` | `ServiceBuilder::new().layer(retries_tower::RetryLayer::new(policy))` |
//! | axum, hyper, tonic servers | `retries-tower` | `.layer(retries_tower::ServerLayer::http())`, `ShedLayer` |
//! | `reqwest-middleware` | `retries-reqwest` | `.with(retries_reqwest::RetryMiddleware::new(policy))` |
//! | PostgreSQL on `sqlx` | `retries-sqlx` | `retries::call(&P).transaction(Transaction::on(&pool), …)` with `use retries_sqlx::Transactions` |
//! | fault injection | `retries-chaos` | `.layer(FaultLayer::new(chaos))` |
//! | Kafka | `retries-kafka` | `Runner::new(…)` |
//!
//! The classification of those frameworks' errors stays here, behind a
//! feature named after the version it integrates (`reqwest-0.13`,
//! `tonic-0.14`, `sqlx-0.9`), so supporting the next version is a new
//! feature, not a breaking release.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use retries::{Attempt, Policy};
//!
//! const POLICY: Policy = Policy::new(Duration::from_secs(2)).with_max_attempts(3).validated();
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let stock: Result<u32, std::io::Error> = retries::call(&POLICY)
//!     .idempotent() // reading stock is safe to repeat
//!     .run(async |at: &Attempt| {
//!         if at.number() < 3 {
//!             // refused before anything was sent: certainly not executed
//!             Err(std::io::ErrorKind::ConnectionRefused.into())
//!         } else {
//!             Ok(42)
//!         }
//!     })
//!     .await;
//! assert_eq!(stock.unwrap(), 42);
//! # }
//! ```
//!
//! # The decision after a failed attempt
//!
//! | verdict | idempotent | `reconcile` | what happens |
//! |---|---|---|---|
//! | `Permanent` | any | any | stop, return this error |
//! | `NotExecuted` | any | any | retry (subject to attempts, deadline, budget) |
//! | `Unknown` | yes | — | retry (subject to attempts, deadline, budget) |
//! | `Unknown` | no | yes | `reconcile(key)`: found → success; not found → retry; error → stop |
//! | `Unknown` | no | no | stop, return this error (outcome unknown) |
//!
//! The details (order of checks, deadlines, pushback, unknown outcomes of
//! nested calls) are in [`builder`]; the
//! `std::io::Error` classification table is in [`verdict`]; how a stopped call
//! maps to the function's error is in [`failure`].
//!
//! # Using `retries::call` inside `tokio::spawn`
//!
//! [`Retry::run`] takes an `async` closure (`AsyncFnMut`), so the closure may
//! mutate what it captures. Current rustc cannot prove such a call `Send` when
//! the closure captures *references* and the call runs in a spawned task
//! (rust-lang/rust#138207, an open compiler issue): the error reads
//! "implementation of `Send` is not general enough". Two fixes:
//!
//! * [`Retry::run_fn`] takes a plain closure returning a future that does
//!   not borrow the attempt (`|at| client.stock(at.number())`): it is `Send`
//!   wherever that future is, borrowing the task's locals included;
//! * or capture owned values (`Arc`s, clones) with `async move |at: &Attempt| …`.
//!
//! `#[retryable]` generates no closure and is not affected.
#![cfg_attr(docsrs, feature(doc_cfg))]

// Everything public in the runtime, whatever features it was built with
// (including `retries::__private`, the items the code `#[retryable]`
// generates refers to, which is not public API), but its door seam.
pub use retries_core::*;

// The door seam (`retries_core::door`) is for door authors and exempt from
// semver: this private module shadows it, so that the glob above does not
// export it, a user's docs and completions do not show it, and
// `use retries::door` is an error ("module `door` is private"). A glob
// keeps the re-exports exactly the core's, whatever features cargo
// unified for it; a list here would follow the facade's features instead.
#[allow(dead_code, hidden_glob_reexports)]
mod door {}

pub use retries_macros::{Classify, retryable};

/// The attribute's documentation (`retry-macros/src/retryable.md`), its
/// examples compiled and run as doctests here, beside the crate users
/// depend on (`retries-macros` runs no doctests of its own).
#[cfg(doctest)]
#[doc = include_str!("../retry-macros/src/retryable.md")]
pub struct RetryableDocs;

/// The derive's example (`retry-macros/src/classify.md`), run here.
#[cfg(doctest)]
#[doc = include_str!("../retry-macros/src/classify.md")]
pub struct ClassifyDocs;

/// The README's first example, compiled and run as a doctest (the other
/// snippets there are fragments, marked `ignore`).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeExample;
