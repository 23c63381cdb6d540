//! The rules a policy's settings must keep, shared by [`Policy`](crate::Policy),
//! [`Backoff`](crate::Backoff) and the breaker: [`PolicyError`] names each
//! one, with its message and the `#[retryable]` keys it concerns, all usable in
//! `const` contexts. A leaf: it imports nothing of the crate, so the settings
//! that apply the rules (`backoff`, `policy`, `breaker`) all sit above it.

/// Why a [`Policy`](crate::Policy) (or [`Backoff`](crate::Backoff)) is invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// `deadline` is zero.
    #[error("{}", self.message())]
    ZeroDeadline,
    /// `max_attempts` is zero.
    #[error("{}", self.message())]
    ZeroAttempts,
    /// `attempt_timeout` is zero.
    #[error("{}", self.message())]
    ZeroAttemptTimeout,
    /// `reserve` is not below `deadline`.
    #[error("{}", self.message())]
    ReserveNotBelowDeadline,
    /// `reserve + min_attempt` exceeds `deadline`.
    #[error("{}", self.message())]
    MinAttemptDoesNotFit,
    /// An exponential multiplier below 1, infinite or NaN.
    #[error("{}", self.message())]
    Multiplier,
    /// A proportional jitter factor outside `[0, 1]`.
    #[error("{}", self.message())]
    JitterFactor,
    /// A backoff cap below its first pause.
    #[error("{}", self.message())]
    CapBelowInitial,
    /// A circuit breaker's `failure_threshold` not above `max_attempts`.
    #[error("{}", self.message())]
    BreakerThreshold,
}

impl PolicyError {
    /// The message, available in `const` contexts.
    #[must_use]
    pub const fn message(&self) -> &'static str {
        match self {
            Self::ZeroDeadline => "`deadline` must be greater than zero",
            Self::ZeroAttempts => {
                "`max_attempts` must be at least 1: it counts the first attempt (1 means no retries)"
            }
            Self::ZeroAttemptTimeout => "`attempt_timeout` must be greater than zero",
            Self::ReserveNotBelowDeadline => {
                "`reserve` must be shorter than `deadline`: it is kept back from the deadline for the caller, so nothing would be left for attempts"
            }
            Self::MinAttemptDoesNotFit => "`reserve` plus `min_attempt` must fit in `deadline`",
            Self::Multiplier => {
                "the backoff multiplier must be a finite number of at least 1: a smaller one would shrink the pauses"
            }
            Self::JitterFactor => {
                "the jitter factor must lie in [0, 1]: proportional jitter multiplies each pause by a factor in [1 − f, 1 + f]"
            }
            Self::CapBelowInitial => {
                "the backoff cap (`max_backoff`) must not be below the first pause (`initial_backoff`)"
            }
            Self::BreakerThreshold => {
                "the breaker's `failure_threshold` must exceed `max_attempts`: the breaker sits under the retry loop and counts every attempt, so one failing call would open it by itself; raise `failure_threshold` above `max_attempts`"
            }
        }
    }
}

impl PolicyError {
    /// The settings (as `#[retryable]` keys) this rule concerns, the one most
    /// likely to be wrong first: a compile-time check points at the first of
    /// them that the attribute wrote.
    #[must_use]
    pub const fn keys(&self) -> &'static [&'static str] {
        match self {
            Self::ZeroDeadline => &["deadline"],
            Self::ZeroAttempts => &["max_attempts"],
            Self::ZeroAttemptTimeout => &["attempt_timeout"],
            Self::ReserveNotBelowDeadline => &["reserve", "deadline"],
            Self::MinAttemptDoesNotFit => &["min_attempt", "reserve", "deadline"],
            Self::Multiplier => &["multiplier", "backoff"],
            Self::JitterFactor => &["jitter", "backoff"],
            Self::CapBelowInitial => &["max_backoff", "initial_backoff", "backoff"],
            Self::BreakerThreshold => &["failure_threshold", "max_attempts"],
        }
    }
}

/// The breaker rule itself (see [`Policy::check_breaker`](crate::Policy::check_breaker)), for callers that
/// have the two numbers but no policy.
pub(crate) const fn breaker_rule(
    failure_threshold: u32,
    max_attempts: u32,
) -> Result<(), PolicyError> {
    if failure_threshold <= max_attempts {
        Err(PolicyError::BreakerThreshold)
    } else {
        Ok(())
    }
}
