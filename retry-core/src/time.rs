//! The one clock of the crate. Instants are `std::time::Instant`s; with the
//! `tokio` feature they are read from tokio's clock (`tokio::time::Instant`
//! converted), so that the async doors follow a paused test clock; without
//! it, from the system clock.
//!
//! The blocking door reads the system clock whatever the feature (for the
//! thread, while its call runs: [`BlockingClock`]). It sleeps the thread,
//! which a paused tokio clock would not see: read from that clock, its
//! pauses took no time and its deadline never came (a blocking call inside
//! `#[tokio::test(start_paused = true)]` made every attempt `max_attempts`
//! allows, in real time). Outside a paused runtime both clocks are the same.
//! The flag covers the body too (so the attempt's deadline, read there, is
//! on the same clock): an async call that the body runs on a runtime of its
//! own reads the system clock as well, which matters only if that runtime's
//! clock is paused.

use std::time::{Duration, Instant};

#[cfg(feature = "tokio")]
thread_local! {
    /// A blocking call runs on this thread: read the system clock.
    static BLOCKING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Now.
#[inline]
pub(crate) fn now() -> Instant {
    #[cfg(feature = "tokio")]
    {
        if BLOCKING.with(std::cell::Cell::get) {
            return Instant::now();
        }
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

/// The system clock for this thread while a blocking call runs (restored
/// when dropped, also on unwinding; a blocking call inside another keeps
/// it). Not public API: the blocking loop holds one.
#[derive(Debug)]
#[must_use]
pub struct BlockingClock {
    #[cfg(feature = "tokio")]
    was: bool,
}

impl BlockingClock {
    /// Read the system clock on this thread until dropped.
    #[inline]
    pub fn enter() -> Self {
        Self {
            #[cfg(feature = "tokio")]
            was: BLOCKING.with(|b| b.replace(true)),
        }
    }
}

impl Drop for BlockingClock {
    #[inline]
    fn drop(&mut self) {
        #[cfg(feature = "tokio")]
        BLOCKING.with(|b| b.set(self.was));
    }
}
