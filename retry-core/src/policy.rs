//! [`Policy`]: the limits of one logical call, `const`-constructible so that one
//! policy can be shared as a `const` by many functions.
//!
//! | setting | default | meaning |
//! |---|---|---|
//! | `deadline` | required | bounds the whole call: every attempt and every pause |
//! | `max_attempts` | 3 | attempts in all, the first included |
//! | `attempt_timeout` | none | caps one attempt; each attempt gets `min(attempt_timeout, remaining − reserve)` |
//! | `reserve` | 0 | time kept back at the end of the deadline for the caller to use the answer |
//! | `min_attempt` | 1 ms | a pause is taken only if the pause plus this much attempt time still fit |
//! | `backoff` | [`Backoff::DEFAULT`] | pauses between attempts |
//!
//! Validation happens in one place, [`Policy::validate`]. In a `const` item use
//! [`Policy::validated`], which turns an invalid policy into a compile error; at
//! run time use [`Policy::try_validated`], which returns a [`PolicyError`]:
//!
//! ```
//! use std::time::Duration;
//! use retries::{Policy, PolicyError};
//!
//! const API: Policy = Policy::new(Duration::from_secs(2))
//!     .with_max_attempts(4)
//!     .with_attempt_timeout(Duration::from_millis(500))
//!     .validated();
//!
//! let bad = Policy::new(Duration::from_secs(1)).with_reserve(Duration::from_secs(1));
//! assert_eq!(bad.try_validated(), Err(PolicyError::ReserveNotBelowDeadline));
//! ```
//!
//! ```compile_fail
//! use std::time::Duration;
//! use retries::Policy;
//! // error[E0080]: evaluation of constant value failed: `max_attempts` must be at least 1
//! const P: Policy = Policy::new(Duration::from_secs(1)).with_max_attempts(0).validated();
//! ```
//!
//! The engine never panics on an unvalidated policy: it treats `max_attempts = 0`
//! as 1, and a reserve at or beyond the deadline as leaving no time after the
//! first attempt; the first call under an invalid policy logs one WARN event
//! (target `retries`) naming the rule it breaks.
//!
//! Every default and every rule lives here (and in [`Backoff`]):
//! `#[retryable]` forwards only the keys it was given, as calls to the
//! setters below, and checks a policy whose values are all literals in a
//! `const` at compile time through [`Policy::validate`].

use std::fmt;
use std::time::Duration;

use crate::backoff::{Backoff, BackoffKind, Jitter};
pub use crate::rules::PolicyError;
use crate::rules::breaker_rule;

/// The limits of one logical call; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    deadline: Duration,
    /// `deadline − reserve`, kept up to date by the setters.
    usable: Duration,
    max_attempts: u32,
    attempt_timeout: Option<Duration>,
    reserve: Duration,
    min_attempt: Duration,
    backoff: Backoff,
    /// The first rule this policy breaks, kept up to date by the setters, so
    /// that a call checks a policy with one load.
    error: Option<PolicyError>,
    /// `usable` and `attempt_timeout` in nanoseconds, as an attempt's plan
    /// keeps them, kept up to date by the setters (see `attempt::nanos`).
    usable_ns: u64,
    attempt_timeout_ns: u64,
}

impl Policy {
    /// A policy with the given whole-call deadline and the defaults of the
    /// [module docs](self).
    #[must_use]
    pub const fn new(deadline: Duration) -> Self {
        Self {
            deadline,
            usable: deadline,
            max_attempts: 3,
            attempt_timeout: None,
            reserve: Duration::ZERO,
            min_attempt: Duration::from_millis(1),
            backoff: Backoff::DEFAULT,
            error: None,
            usable_ns: 0,
            attempt_timeout_ns: 0,
        }
        .checked()
    }

    /// Set the whole-call deadline.
    #[must_use]
    pub const fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self.usable = deadline.saturating_sub(self.reserve);
        self.checked()
    }

    /// Set the number of attempts, the first included.
    #[must_use]
    pub const fn with_max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self.checked()
    }

    /// Cap each attempt at `timeout` (still bounded by the remaining deadline).
    #[must_use]
    pub const fn with_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self.checked()
    }

    /// Remove the per-attempt cap: attempts are bounded by the deadline alone.
    #[must_use]
    pub const fn without_attempt_timeout(mut self) -> Self {
        self.attempt_timeout = None;
        self.checked()
    }

    /// Keep `reserve` at the end of the deadline for the caller.
    #[must_use]
    pub const fn with_reserve(mut self, reserve: Duration) -> Self {
        self.reserve = reserve;
        self.usable = self.deadline.saturating_sub(reserve);
        self.checked()
    }

    /// The least attempt time worth pausing for.
    #[must_use]
    pub const fn with_min_attempt(mut self, min_attempt: Duration) -> Self {
        self.min_attempt = min_attempt;
        self.checked()
    }

    /// Set the backoff.
    #[must_use]
    pub const fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self.checked()
    }

    /// Change the backoff's kind, keeping its other parameters (see
    /// [`Backoff::with_kind`]).
    #[must_use]
    pub const fn with_backoff_kind(mut self, kind: BackoffKind) -> Self {
        self.backoff = self.backoff.with_kind(kind);
        self.checked()
    }

    /// Change the backoff's first pause, keeping its other parameters.
    #[must_use]
    pub const fn with_initial_backoff(mut self, initial: Duration) -> Self {
        self.backoff = self.backoff.with_initial(initial);
        self.checked()
    }

    /// Change the backoff's cap, keeping its other parameters.
    #[must_use]
    pub const fn with_max_backoff(mut self, max: Duration) -> Self {
        self.backoff = self.backoff.with_max(max);
        self.checked()
    }

    /// Change the backoff's growth factor, keeping its other parameters.
    #[must_use]
    pub const fn with_multiplier(mut self, multiplier: f64) -> Self {
        self.backoff = self.backoff.with_multiplier(multiplier);
        self.checked()
    }

    /// Change the backoff's jitter, keeping its other parameters.
    #[must_use]
    pub const fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.backoff = self.backoff.with_jitter(jitter);
        self.checked()
    }

    /// The whole-call deadline.
    #[must_use]
    pub const fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Attempts in all, the first included.
    #[must_use]
    pub const fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The per-attempt cap, if any.
    #[must_use]
    pub const fn attempt_timeout(&self) -> Option<Duration> {
        self.attempt_timeout
    }

    /// Time kept back for the caller.
    #[must_use]
    pub const fn reserve(&self) -> Duration {
        self.reserve
    }

    /// The least attempt time worth pausing for.
    #[must_use]
    pub const fn min_attempt(&self) -> Duration {
        self.min_attempt
    }

    /// The backoff.
    #[must_use]
    pub const fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// The deadline less the reserve: the time attempts and pauses may use.
    #[must_use]
    pub const fn usable(&self) -> Duration {
        self.usable
    }

    /// [`usable`](Self::usable) in nanoseconds (saturating).
    #[inline]
    pub(crate) const fn usable_nanos(&self) -> u64 {
        self.usable_ns
    }

    /// [`attempt_timeout`](Self::attempt_timeout) in nanoseconds, or
    /// `attempt::NONE`.
    #[inline]
    pub(crate) const fn attempt_timeout_nanos(&self) -> u64 {
        self.attempt_timeout_ns
    }

    /// Check every rule; the first violation is returned. (The answer is
    /// kept by the setters, so this is one load.)
    #[inline]
    pub const fn validate(&self) -> Result<(), PolicyError> {
        match self.error {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// `self` with its validity recorded.
    const fn checked(mut self) -> Self {
        self.usable_ns = crate::attempt::nanos(self.usable);
        self.attempt_timeout_ns = crate::attempt::nanos_or_none(self.attempt_timeout);
        self.error = match self.rules() {
            Ok(()) => None,
            Err(e) => Some(e),
        };
        self
    }

    /// The rules, in the order [`validate`](Self::validate) reports them.
    const fn rules(&self) -> Result<(), PolicyError> {
        if self.deadline.is_zero() {
            return Err(PolicyError::ZeroDeadline);
        }
        if self.max_attempts == 0 {
            return Err(PolicyError::ZeroAttempts);
        }
        if let Some(t) = self.attempt_timeout
            && t.is_zero()
        {
            return Err(PolicyError::ZeroAttemptTimeout);
        }
        if self.reserve.as_nanos() >= self.deadline.as_nanos() {
            return Err(PolicyError::ReserveNotBelowDeadline);
        }
        if self.reserve.as_nanos() + self.min_attempt.as_nanos() > self.deadline.as_nanos() {
            return Err(PolicyError::MinAttemptDoesNotFit);
        }
        self.backoff.validate()
    }

    /// The circuit-breaker rule, the one place it is written: a breaker under
    /// the loop sees every attempt, so its `failure_threshold` must exceed
    /// `max_attempts`, or one failing call opens it by itself. `#[retryable]`
    /// applies it at compile time to `breaker(failure_threshold = …)` under a
    /// literal policy; a [`CircuitBreaker`](crate::CircuitBreaker) applies it
    /// at the first call of a loop that could open it alone.
    pub const fn check_breaker(&self, failure_threshold: u32) -> Result<(), PolicyError> {
        breaker_rule(failure_threshold, self.max_attempts)
    }

    /// This policy if valid; otherwise a panic, which in a `const` item is a
    /// compile error carrying the [`PolicyError`] message. Meant for `const`
    /// items; for values built at run time use [`try_validated`](Self::try_validated).
    ///
    /// # Panics
    ///
    /// When the policy is invalid (at compile time, in a `const` item).
    #[must_use]
    #[track_caller]
    pub const fn validated(self) -> Self {
        match self.validate() {
            Ok(()) => self,
            Err(e) => panic!("{}", e.message()),
        }
    }

    /// This policy if valid, else the first rule it breaks.
    pub const fn try_validated(self) -> Result<Self, PolicyError> {
        match self.validate() {
            Ok(()) => Ok(self),
            Err(e) => Err(e),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "deadline {:?}, {} attempts, backoff {}",
            self.deadline, self.max_attempts, self.backoff
        )?;
        if let Some(t) = self.attempt_timeout {
            write!(f, ", attempt timeout {t:?}")?;
        }
        if !self.reserve.is_zero() {
            write!(f, ", reserve {:?}", self.reserve)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn each_rule() {
        let p = Policy::new(S);
        assert_eq!(p.validate(), Ok(()));
        let cases = [
            (Policy::new(Duration::ZERO), PolicyError::ZeroDeadline),
            (p.with_max_attempts(0), PolicyError::ZeroAttempts),
            (
                p.with_attempt_timeout(Duration::ZERO),
                PolicyError::ZeroAttemptTimeout,
            ),
            (p.with_reserve(S), PolicyError::ReserveNotBelowDeadline),
            (
                p.with_reserve(Duration::from_micros(999_500)),
                PolicyError::MinAttemptDoesNotFit,
            ),
            (
                p.with_backoff(Backoff::exponential(S, 0.0, S)),
                PolicyError::Multiplier,
            ),
        ];
        for (policy, err) in cases {
            assert_eq!(policy.try_validated(), Err(err), "{policy}");
            assert!(!err.to_string().is_empty());
            assert_eq!(err.to_string(), err.message());
        }
    }
}
