//! The runtime of [`retries`](https://docs.rs/retries): everything that runs
//! when a retried call is made. Most users depend on the `retries` facade,
//! which re-exports this crate and adds the `#[retryable]` attribute; the
//! examples here are written as a facade user writes them.
//!
//! # The crate boundary
//!
//! This crate names no 0.x framework in its API: a framework's release can
//! break only that framework's door, never this crate or a user who writes
//! `#[retryable]` on a function. The doors are crates of their own, each
//! built on the public seam [`door`] alone and versioned with its framework:
//!
//! | stack | crate | what it holds |
//! |---|---|---|
//! | any async or blocking code | `retries` (this crate, re-exported) | `#[retryable]`, [`call()`], streams and the outbox, budgets, breaker, limits, scope, `config`, `testing` |
//! | tower: hyper clients, tonic channels, axum/hyper/tonic servers | `retries-tower` | `RetryLayer`, `ShedLayer`, the server layer of `wire`, `IdempotencyLayer`, a balancer honouring tried endpoints, gRPC service configs |
//! | `reqwest-middleware` clients | `retries-reqwest` | `RetryMiddleware` |
//! | PostgreSQL on `sqlx` | `retries-sqlx` | transactions rerun whole, a lost `COMMIT` resolved; idempotency-key records (`PgKeyStore`) |
//! | fault injection in running systems | `retries-chaos` | server and client faults by verdict, counted |
//! | what the HTTP doors share | `retries-http` | the request extensions, the replayable body, an HTTP door's settings and rules |
//! | what the server doors share | `retries-dedup` | the idempotency-key store (`Store`, `MemoryStore`, `Claim`, `Stored`) |
//! | Kafka (`rdkafka`) | `retries-kafka` | durable retry topics and a dead-letter topic |
//!
//! What stays here of the frameworks is their errors' classification, which
//! the orphan rule keeps beside [`Classify`]: each behind a feature named
//! after the version it integrates, so that the next version is a new
//! feature, not a breaking change: `reqwest-0.13` (`Classify` for
//! `reqwest::Error`, `http::check`), `tonic-0.14` (`Classify` for
//! `tonic::Status`, pushback), `sqlx-0.9` (`Classify` for `sqlx::Error`,
//! the SQLSTATE table). The feature `http` names only the `http`,
//! `http-body` and `bytes` crates, which are 1.0.
//!
//! # Its modules, bottom up
//!
//! An import never points up a floor:
//!
//! * the clock (private), [`failure`]: how a call ends ([`Failure`],
//!   [`Reason`], [`Stopped`]); the policy rules (private, their error is
//!   [`PolicyError`]).
//! * [`verdict`]: three-way classification of failures ([`Verdict`],
//!   [`Classify`]); [`backoff`]: pauses between attempts ([`Backoff`],
//!   [`Jitter`]); [`budget`]: the token bucket and ratio budgets;
//!   [`attempt`]: the attempt context ([`Attempt`]) and [`IdempotencyKey`].
//! * [`policy`]: the limits of a call ([`Policy`]), `const`-constructible;
//!   the one place defaults live. [`scope`]: deadlines and retry ownership
//!   across nested calls.
//! * [`observe`]: tracing events and metrics, in its own words.
//! * [`breaker`] and `limit`: the shared state under the loop, borrowed for
//!   a call (a `static`, a field, an `Arc`).
//! * The call's description: [`Retry`], its [`Slots`] (seen through
//!   [`SlotSet`]), [`RetryEvent`] and the [`slots`] markers.
//! * The engine (private): the call's state, its one settle step, the loop.
//! * [`door`]: the seam every door is built on (drive the loop with a
//!   bound, take a spec apart, name calls, record the conventions'
//!   attributes, a server's scope); exempt from semver, pinned with `=`
//!   by the doors, not re-exported by the facade.
//! * The doors of this crate: [`builder`] ([`call()`] and the decision
//!   table) and `stream` (streams that resume from their last delivered
//!   cursor, feature `stream`).
//! * The integrations, one module per feature: `http` (the status table,
//!   `Retry-After`), `wire` (feature `http`: deadlines and "don't retry me" across
//!   services), `tonic` (feature `tonic-0.14`), `sqlx` (feature `sqlx-0.9`),
//!   `config`, `testing`.
//!
//! The engine that every door drives is private.
//!
#![cfg_attr(docsrs, feature(doc_cfg))]

/// Not public API: the items the code `#[retryable]` generates refers to,
/// reached as `retries::__private` through the facade.
#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;
#[cfg(feature = "tokio")]
mod admission;
pub mod attempt;
pub mod backoff;
pub mod breaker;
pub mod budget;
pub mod builder;
#[cfg(feature = "config")]
pub mod config;
pub mod control;
pub mod door;
mod engine;
pub mod failure;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "tokio")]
pub mod limit;
pub mod observe;
#[cfg(feature = "stream")]
mod outbox;
pub mod policy;
#[cfg(feature = "tokio")]
mod rate;
mod rules;
pub mod scope;
mod spec;
#[cfg(feature = "sqlx-0.9")]
pub mod sqlx;
#[cfg(feature = "stream")]
pub mod stream;
mod sync;
#[cfg(feature = "testing")]
pub mod testing;
mod time;
#[cfg(feature = "tonic-0.14")]
pub mod tonic;
pub mod verdict;
#[cfg(feature = "http")]
pub mod wire;

pub use attempt::{Attempt, IdempotencyKey, ParseKeyError};
pub use backoff::{Backoff, BackoffKind, Jitter};
pub use breaker::{Breaker, BreakerError, BreakerState, CircuitBreaker, NoBreaker, Permit};
pub use budget::{Budget, BudgetError, NoBudget, RatioBudget, TokenBucket};
pub use builder::call;
#[cfg(feature = "tokio")]
pub use engine::{Hedging, LearnedDelay};
pub use failure::{Failure, Reason, RefusedPause, Stopped};
pub use policy::{Policy, PolicyError};
pub use scope::Nested;
pub use spec::slots;
pub use spec::{Retry, RetryEvent, SlotSet, Slots};
pub use verdict::{
    Classify, Verdict, VerdictKind, classify_chain, classify_chain_or, classify_io_kind,
};
