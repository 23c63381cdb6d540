//! The runtime of [`retries`](https://docs.rs/retries): everything that runs
//! when a retried call is made. Most users depend on the `retries` facade,
//! which re-exports this crate and adds the `#[retryable]` attribute; the
//! examples here are written as a facade user writes them.
//!
//! Its files are floors, bottom up; an import never points up a floor:
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
//! * [`breaker`] and [`limit`]: the shared state under the loop, borrowed
//!   for a call (a `static`, a field, an `Arc`).
//! * The call's description: [`Retry`], [`RetryEvent`] and the [`slots`] its
//!   type parameters take.
//! * The engine (private): the call's state, its one settle step, the loop.
//! * The doors: [`builder`] ([`call()`] and the decision table), [`stream`]
//!   (streams that resume from their last delivered cursor), [`tower`] (the
//!   layer and `ShedLayer`), [`reqwest_middleware`].
//! * The integrations, one module per feature, named after it: [`http`],
//!   [`reqwest`], [`tonic`], [`config`], [`service_config`], [`testing`];
//!   [`wire`] (features `http` or `tonic`): deadlines and "don't retry me"
//!   across services, and the server layer that carries them;
//!   [`sqlx`] (feature `sqlx-postgres`) is both: a door, `Retry::transaction`,
//!   and `Classify` for `sqlx::Error`.
//!
//! One re-export points up: `retries::limit::ShedLayer`, the first path of
//! [`tower::ShedLayer`], kept for users who have it.
//!
//! The engine that every door drives is private.

/// Not public API: the items the code `#[retryable]` generates refers to,
/// reached as `retries::__private` through the facade.
#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;
pub mod attempt;
pub mod backoff;
pub mod breaker;
pub mod budget;
pub mod builder;
#[cfg(feature = "config")]
pub mod config;
mod engine;
pub mod failure;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "tokio")]
pub mod limit;
pub mod observe;
pub mod policy;
#[cfg(any(feature = "tower", feature = "reqwest-middleware"))]
pub mod replay;
#[cfg(feature = "reqwest")]
pub mod reqwest;
#[cfg(feature = "reqwest-middleware")]
pub mod reqwest_middleware;
mod rules;
pub mod scope;
#[cfg(feature = "service-config")]
pub mod service_config;
mod spec;
#[cfg(feature = "sqlx-postgres")]
pub mod sqlx;
#[cfg(feature = "stream")]
pub mod stream;
#[cfg(feature = "testing")]
pub mod testing;
mod time;
#[cfg(feature = "tonic")]
pub mod tonic;
#[cfg(feature = "tower")]
pub mod tower;
pub mod verdict;
#[cfg(any(feature = "http", feature = "tonic"))]
pub mod wire;

pub use attempt::{Attempt, IdempotencyKey, ParseKeyError};
pub use backoff::{Backoff, BackoffKind, Jitter};
pub use breaker::{Admission, Breaker, BreakerError, BreakerState, CircuitBreaker, NoBreaker};
pub use budget::{Budget, BudgetError, NoBudget, RatioBudget, TokenBucket};
pub use builder::call;
#[cfg(feature = "tokio")]
pub use engine::Hedging;
pub use failure::{Failure, Reason, Stopped};
pub use policy::{Policy, PolicyError};
pub use scope::Nested;
pub use spec::slots;
pub use spec::{Retry, RetryEvent};
pub use verdict::{
    Classify, Verdict, VerdictKind, classify_chain, classify_chain_or, classify_io_kind,
};
