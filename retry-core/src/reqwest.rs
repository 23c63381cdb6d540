//! reqwest (feature `reqwest`): what the crate knows of `reqwest`, in one
//! place. [`Classify`](crate::Classify) is implemented for
//! `reqwest::Error` (a failure to connect is `NotExecuted`, a timeout or a
//! reset `Unknown`, a builder error `Permanent`), and [`check`] turns a
//! response into a classified error by the [status table](crate::http),
//! with `Retry-After`. The items live in [`http`](crate::http), which serves
//! any client; the middleware for `reqwest-middleware` clients is
//! [`reqwest_middleware`](crate::reqwest_middleware) (feature
//! `reqwest-middleware`), re-exported here under its first path.

#[doc(inline)]
pub use crate::http::{HttpError, check};

#[cfg(feature = "reqwest-middleware")]
#[doc(no_inline)]
pub use crate::reqwest_middleware::{
    DEFAULT_CAP, Deadline, Idempotency, NAME, NotReplayed, RetryMiddleware,
};
