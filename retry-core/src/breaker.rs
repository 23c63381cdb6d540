//! Circuit breakers, placed *under* the retry loop: a breaker sees every
//! attempt, not every call.
//!
//! The engine asks [`Breaker::try_acquire`] before each attempt; a refusal stops
//! the call with [`Reason::CircuitOpen`](crate::Reason::CircuitOpen) without
//! calling the body, and that is never retried. After the attempt it reports
//! exactly one of [`Breaker::on_success`], [`Breaker::on_transient_failure`]
//! (only `NotExecuted`/`Unknown` count against the server's health) or
//! [`Breaker::on_neutral`] (a permanent error, or the attempt was abandoned),
//! so a breaker that hands out a limited number of probes gets each back.

/// A circuit breaker consulted for every attempt.
pub trait Breaker {
    /// May an attempt start now? `true` admits one attempt, which is later
    /// reported with exactly one of the other methods.
    fn try_acquire(&self) -> bool;

    /// The admitted attempt succeeded.
    fn on_success(&self);

    /// The admitted attempt failed transiently.
    fn on_transient_failure(&self);

    /// The admitted attempt ended in a way that says nothing about the
    /// server's health (a permanent error, or it was cancelled).
    fn on_neutral(&self);
}

/// No breaker: every attempt is admitted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoBreaker;

impl Breaker for NoBreaker {
    #[inline]
    fn try_acquire(&self) -> bool {
        true
    }
    #[inline]
    fn on_success(&self) {}
    #[inline]
    fn on_transient_failure(&self) {}
    #[inline]
    fn on_neutral(&self) {}
}
