//! The one clock of the crate. Instants are `std::time::Instant`s; with the
//! `tokio` feature they are read from tokio's clock (`tokio::time::Instant`
//! converted), so that every door, the blocking one included, follows a
//! paused test clock; without it, from the system clock.

use std::time::{Duration, Instant};

/// Now.
#[inline]
pub(crate) fn now() -> Instant {
    #[cfg(feature = "tokio")]
    {
        tokio::time::Instant::now().into_std()
    }
    #[cfg(not(feature = "tokio"))]
    {
        Instant::now()
    }
}

/// Time since `earlier` (zero if it is in the future).
#[inline]
pub(crate) fn since(earlier: Instant) -> Duration {
    now().saturating_duration_since(earlier)
}
