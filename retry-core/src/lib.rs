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
//!   across services, and the server layer that carries them; [`chaos`]
//!   (feature `chaos`): faults injected by verdict in running systems,
//!   counted (a layer above the doors: it uses no engine);
//!   [`sqlx`] (feature `sqlx-postgres`) is both: a door, `Retry::transaction`,
//!   and `Classify` for `sqlx::Error`.
//!
//! One re-export points up: `retries::limit::ShedLayer`, the first path of
//! [`tower::ShedLayer`], kept for users who have it.
//!
//! The engine that every door drives is private.
//!
// Links to the modules behind features: to the module when it is compiled,
// else to its page on docs.rs (built with every feature on).
#![cfg_attr(feature = "stream", doc = "[`stream`]: crate::stream")]
#![cfg_attr(
    not(feature = "stream"),
    doc = "[`stream`]: https://docs.rs/retries-core/latest/retries_core/stream/index.html"
)]
#![cfg_attr(feature = "tower", doc = "[`tower`]: crate::tower")]
#![cfg_attr(
    not(feature = "tower"),
    doc = "[`tower`]: https://docs.rs/retries-core/latest/retries_core/tower/index.html"
)]
#![cfg_attr(
    feature = "reqwest-middleware",
    doc = "[`reqwest_middleware`]: crate::reqwest_middleware"
)]
#![cfg_attr(
    not(feature = "reqwest-middleware"),
    doc = "[`reqwest_middleware`]: https://docs.rs/retries-core/latest/retries_core/reqwest_middleware/index.html"
)]
#![cfg_attr(feature = "http", doc = "[`http`]: crate::http")]
#![cfg_attr(
    not(feature = "http"),
    doc = "[`http`]: https://docs.rs/retries-core/latest/retries_core/http/index.html"
)]
#![cfg_attr(feature = "reqwest", doc = "[`reqwest`]: crate::reqwest")]
#![cfg_attr(
    not(feature = "reqwest"),
    doc = "[`reqwest`]: https://docs.rs/retries-core/latest/retries_core/reqwest/index.html"
)]
#![cfg_attr(feature = "tonic", doc = "[`tonic`]: crate::tonic")]
#![cfg_attr(
    not(feature = "tonic"),
    doc = "[`tonic`]: https://docs.rs/retries-core/latest/retries_core/tonic/index.html"
)]
#![cfg_attr(feature = "config", doc = "[`config`]: crate::config")]
#![cfg_attr(
    not(feature = "config"),
    doc = "[`config`]: https://docs.rs/retries-core/latest/retries_core/config/index.html"
)]
#![cfg_attr(
    feature = "service-config",
    doc = "[`service_config`]: crate::service_config"
)]
#![cfg_attr(
    not(feature = "service-config"),
    doc = "[`service_config`]: https://docs.rs/retries-core/latest/retries_core/service_config/index.html"
)]
#![cfg_attr(feature = "testing", doc = "[`testing`]: crate::testing")]
#![cfg_attr(
    not(feature = "testing"),
    doc = "[`testing`]: https://docs.rs/retries-core/latest/retries_core/testing/index.html"
)]
#![cfg_attr(feature = "chaos", doc = "[`chaos`]: crate::chaos")]
#![cfg_attr(
    not(feature = "chaos"),
    doc = "[`chaos`]: https://docs.rs/retries-core/latest/retries_core/chaos/index.html"
)]
#![cfg_attr(feature = "sqlx-postgres", doc = "[`sqlx`]: crate::sqlx")]
#![cfg_attr(
    not(feature = "sqlx-postgres"),
    doc = "[`sqlx`]: https://docs.rs/retries-core/latest/retries_core/sqlx/index.html"
)]
#![cfg_attr(
    any(feature = "http", feature = "tonic"),
    doc = "[`wire`]: crate::wire"
)]
#![cfg_attr(
    not(any(feature = "http", feature = "tonic")),
    doc = "[`wire`]: https://docs.rs/retries-core/latest/retries_core/wire/index.html"
)]
#![cfg_attr(
    feature = "tower",
    doc = "[`tower::ShedLayer`]: crate::tower::ShedLayer"
)]
#![cfg_attr(
    not(feature = "tower"),
    doc = "[`tower::ShedLayer`]: https://docs.rs/retries-core/latest/retries_core/tower/struct.ShedLayer.html"
)]
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
#[cfg(feature = "chaos")]
pub mod chaos;
#[cfg(feature = "config")]
pub mod config;
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
pub use failure::{Failure, Reason, RefusedPause, Stopped};
pub use policy::{Policy, PolicyError};
pub use scope::Nested;
pub use spec::slots;
pub use spec::{Retry, RetryEvent};
pub use verdict::{
    Classify, Verdict, VerdictKind, classify_chain, classify_chain_or, classify_io_kind,
};
