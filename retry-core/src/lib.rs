//! The runtime of [`retry`](https://docs.rs/retry): everything that runs when a
//! retried call is made. Most users depend on the `retry` facade, which
//! re-exports this crate and adds the `#[retryable]` attribute.
//!
//! * [`verdict`]: three-way classification of failures ([`Verdict`], [`Classify`]).
//! * [`backoff`]: pauses between attempts ([`Backoff`], [`Jitter`]).
//! * [`policy`]: the limits of a call ([`Policy`]), `const`-constructible.
//! * [`attempt`]: the attempt context ([`Attempt`]) and [`IdempotencyKey`].
//! * [`call`](mod@call): the engine and its entry point [`call()`].
//! * [`failure`]: how a call ends ([`Failure`], [`Reason`], [`Stopped`]).
//! * [`budget`] and [`breaker`]: the shared limits under the loop.

pub mod attempt;
pub mod backoff;
pub mod breaker;
pub mod budget;
pub mod call;
pub mod failure;
#[cfg(feature = "http")]
pub mod http;
pub mod observe;
pub mod policy;
#[doc(hidden)]
pub mod private;
pub mod scope;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(feature = "tonic")]
pub mod tonic;
pub mod verdict;

pub use attempt::{Attempt, IdempotencyKey, ParseKeyError};
pub use backoff::{Backoff, BackoffKind, Jitter};
pub use breaker::{Breaker, BreakerError, BreakerState, CircuitBreaker, NoBreaker};
pub use budget::{Budget, BudgetError, RatioBudget, TokenBucket, Unlimited};
pub use call::{Retry, RetryEvent, call};
pub use failure::{Failure, Reason, Stopped};
pub use policy::{Policy, PolicyError};
pub use scope::Nested;
pub use verdict::{
    Classify, Verdict, VerdictKind, classify_chain, classify_chain_or, classify_io_kind,
};
