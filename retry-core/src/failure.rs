//! How a call that did not succeed ends: [`Failure`], its [`Reason`], and the
//! library's own error [`Stopped`].
//!
//! # The default mapping to the function's error
//!
//! Without a `recover` hook, [`Failure::into_error`] turns a failure into the
//! operation's error type `E`:
//!
//! | reason | the caller gets |
//! |---|---|
//! | `Permanent`, `Exhausted` | the last attempt's error, unchanged: the call ended on it |
//! | `UnknownOutcome` | the last attempt's error, unchanged: your classifier calls it unknown, so an enclosing loop resolves it by its own `reconcile` or stops unknown too, never replays it |
//! | `PauseExceedsDeadline`, `BudgetExhausted`, `DeadlineExceeded`, `CircuitOpen`, `Saturated`, `Throttled`, `RateLimited`, `OverQuota` | `E::from(Stopped)`, with the last error (if any) as its `source()` |
//!
//! When the last attempt produced no error of type `E` (it was cut off by its
//! `attempt_timeout`), the caller gets `E::from(Stopped)` for every reason.
//!
//! So a call that the library stopped (a pause that did not fit, the budget,
//! the deadline, the breaker, a full limit, admission) never reaches its
//! caller as a bare error that reads like one failed attempt: it is a
//! [`Stopped`] that says why, and the last error is its `source()`
//! (`stop.source().and_then(|e| e.downcast_ref::<E>())`). The last error
//! alone is the answer when the error itself ended the call (it was
//! permanent, or the attempts the policy allows were spent) and for an
//! outcome nobody resolved: that error is one the caller's classifier calls
//! unknown, which is what tells it apart, and what an enclosing retried call
//! must see to resolve it (a `Stopped` classifies permanent). `outcome`
//! and `outcome_fn` give the [`Failure`] and its reason for every row.
//!
//! # What each door returns, by stop
//!
//! | the call ended by | `run`, `run_fn`, `run_blocking`, `#[retryable]` (`E: From<Stopped>`) | `outcome`, `outcome_fn` (any `E`) | `retries-tower` `RetryLayer`, `retries-reqwest` `RetryMiddleware` | `retries-sqlx` transactions | `retries-kafka` runner |
//! |---|---|---|---|---|---|
//! | a permanent error | the error | `Failure`, `Permanent` | the response as it came (no response: the error) | the error | dead letter, reason `permanent` |
//! | the attempts spent | the last error | `Failure`, `Exhausted` | the last response (no response: the error) | the last error | the next retry topic; after the last, dead letter `exhausted` |
//! | a pause that did not fit | `Stopped` (`PauseExceedsDeadline`, with `refused_pause`), source the last error | `Failure`, `PauseExceedsDeadline` | the last response, its extensions holding `retries_http::Ended`; no response: a `Stopped` | `Stopped`, source the last error | as the attempts spent |
//! | the budget | `Stopped` (`BudgetExhausted`), source the last error | `Failure`, `BudgetExhausted` | as above | `Stopped` | as the attempts spent |
//! | an unknown outcome not resolved | the last error (classified unknown) | `Failure`, `UnknownOutcome` (and `reconcile_error`) | the last response with `Ended`; no response: a `Stopped` | the look-up's error (SQLSTATE `40003`: the `COMMIT`'s outcome is unknown), else a `Stopped` | dead letter `unknown_outcome` |
//! | the deadline, the breaker, a full limit, admission | `Stopped` | `Failure` with the reason | a `Stopped` (gRPC mode: its status) | `Stopped` | the breaker holds the record until it closes; the others as the attempts spent (a deadline that cut a handler that is not idempotent: dead letter `unknown_outcome`, or the next topic marked, with a `reconcile`) |
//!
//! A caller tells every row apart: by the error's type (`Stopped` or its
//! own), by `Failure::reason`, by the `Ended` extension of an HTTP answer.

use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::time::Duration;

/// Why a call stopped without success.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// The last error was classified permanent (or the server refused retries).
    Permanent,
    /// Every allowed attempt was made and failed.
    Exhausted,
    /// The deadline passed: an attempt was cut off by it, failed once it
    /// had passed, or no attempt could start before it (a pause that ended
    /// too close to it, a `reconcile` look-up it cut short). Never reported
    /// before the deadline has come, except for an attempt that could not
    /// start with the policy's `min_attempt` left.
    DeadlineExceeded,
    /// The call stopped at once, before its deadline, because the next pause
    /// (the computed backoff, or the server's `Retry-After` or gRPC pushback)
    /// and an attempt after it could not fit before the deadline. The caller
    /// gets a [`Stopped`] whose source is the last error (from the layer and
    /// the middleware, the last response, marked `retries_http::Ended`);
    /// [`Failure::refused_pause`] and
    /// [`Stopped::refused_pause`] say how long the pause was and how much
    /// time was left.
    PauseExceedsDeadline,
    /// The retry budget refused a retry.
    BudgetExhausted,
    /// The circuit breaker refused an attempt.
    CircuitOpen,
    /// A non-idempotent operation failed with an unknown outcome, and it could
    /// not be resolved (no `reconcile`, or `reconcile` failed).
    UnknownOutcome,
    /// No slot of the call's concurrency limit came free within its wait
    /// (see [`limit`](crate::limit)): no attempt was made, nothing was sent.
    Saturated,
    /// The call's [`Admission`](crate::limit::Admission) refused its first
    /// attempt locally, because the service has been refusing calls as
    /// overloaded: no attempt was made, nothing was sent, no budget spent.
    /// Its [`Stopped`] classifies as not executed.
    Throttled,
    /// The call's [`RateLimit`](crate::limit::RateLimit) had no start for
    /// an attempt before the deadline (less the policy's `min_attempt`):
    /// the call stopped at once, without waiting for a start it could not
    /// use, and that attempt was not sent. Its [`Stopped`] classifies as
    /// not executed.
    RateLimited,
    /// The quota the server announced ([`Pace`](crate::limit::Pace): the
    /// HTTP doors read `RateLimit`, `X-RateLimit-*`) had no start for an
    /// attempt before the deadline (less the policy's `min_attempt`): the
    /// call stopped at once, and that attempt was not sent. Its
    /// [`Stopped`] classifies as not executed.
    OverQuota,
}

impl Reason {
    /// Did a call that stopped for this reason, after `attempts`, give up
    /// after retrying (attempts run out, the budget, the breaker, the
    /// deadline)? What a server across the wire is told as "I already
    /// retried; don't retry me" (see `retries::wire`).
    pub(crate) const fn gave_up_retrying(self, attempts: u32) -> bool {
        match self {
            Self::Exhausted | Self::PauseExceedsDeadline => attempts > 1,
            Self::BudgetExhausted | Self::CircuitOpen | Self::DeadlineExceeded => true,
            Self::Permanent
            | Self::UnknownOutcome
            | Self::Saturated
            | Self::Throttled
            | Self::RateLimited
            | Self::OverQuota => false,
        }
    }

    /// A short lower-case name, stable for logs and metrics.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Permanent => "permanent",
            Self::Exhausted => "exhausted",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::PauseExceedsDeadline => "pause_exceeds_deadline",
            Self::BudgetExhausted => "budget_exhausted",
            Self::CircuitOpen => "circuit_open",
            Self::UnknownOutcome => "unknown_outcome",
            Self::Saturated => "saturated",
            Self::Throttled => "throttled",
            Self::RateLimited => "rate_limited",
            Self::OverQuota => "over_quota",
        }
    }

    /// `true` for the reasons whose default mapping returns the last error
    /// itself rather than `E::from(Stopped)`.
    #[must_use]
    pub const fn returns_last_error(self) -> bool {
        matches!(
            self,
            Self::Permanent | Self::Exhausted | Self::UnknownOutcome
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Permanent => "permanent error",
            Self::Exhausted => "attempts exhausted",
            Self::DeadlineExceeded => "deadline exceeded",
            Self::PauseExceedsDeadline => "the next pause does not fit before the deadline",
            Self::BudgetExhausted => "retry budget exhausted",
            Self::CircuitOpen => "circuit open",
            Self::UnknownOutcome => "outcome unknown",
            Self::Saturated => "concurrency limit full",
            Self::Throttled => "throttled locally: the service is refusing calls as overloaded",
            Self::RateLimited => "the rate limit has no start for an attempt before the deadline",
            Self::OverQuota => {
                "the server's announced quota has no start for an attempt before the deadline"
            }
        })
    }
}

/// The pause a call did not take because it could not fit before the
/// deadline ([`Reason::PauseExceedsDeadline`]): how long it was, whether the
/// server asked for it, and how much time was left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefusedPause {
    pause: Duration,
    left: Duration,
    asked: bool,
}

impl RefusedPause {
    pub(crate) fn new(pause: Duration, left: Duration, asked: bool) -> Self {
        Self { pause, left, asked }
    }

    /// The pause: the server's hint when [`asked_by_server`](Self::asked_by_server),
    /// the computed backoff otherwise.
    #[must_use]
    pub fn pause(&self) -> Duration {
        self.pause
    }

    /// The time that was left before the deadline when the call stopped.
    #[must_use]
    pub fn left(&self) -> Duration {
        self.left
    }

    /// `true` when the pause was the server's (`Retry-After`, gRPC pushback).
    #[must_use]
    pub fn asked_by_server(&self) -> bool {
        self.asked
    }
}

/// "the server asked to wait 120s; 2s were left", or "the next pause of
/// 480ms does not fit in the 79ms left".
impl fmt::Display for RefusedPause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.asked {
            write!(
                f,
                "the server asked to wait {:?}; {:?} {} left",
                self.pause,
                self.left,
                if self.left == Duration::from_secs(1) {
                    "was"
                } else {
                    "were"
                }
            )
        } else {
            write!(
                f,
                "the next pause of {:?} does not fit in the {:?} left",
                self.pause, self.left
            )
        }
    }
}

/// "{reason} after 2 attempts in 1.2s", or for a refused pause "stopped after
/// 1 attempt in 689µs: the server asked to wait 120s; 2s were left".
fn write_stop(
    f: &mut fmt::Formatter<'_>,
    reason: Reason,
    refused: Option<&RefusedPause>,
    attempts: u32,
    elapsed: Duration,
) -> fmt::Result {
    let s = if attempts == 1 { "" } else { "s" };
    match refused {
        Some(r) => write!(f, "stopped after {attempts} attempt{s} in {elapsed:?}: {r}"),
        None => write!(f, "{reason} after {attempts} attempt{s} in {elapsed:?}"),
    }
}

/// A call that did not succeed: why, the last error, how many attempts, how long.
///
/// It is what a `recover` hook receives, and what
/// [`Retry::outcome`](crate::Retry::outcome) returns.
pub struct Failure<E> {
    reason: Reason,
    last_error: Option<E>,
    /// Boxed: only a failed `reconcile` sets it, and inline it made every
    /// call's result an error wider (an error holding a `Stopped` is 48
    /// bytes), which the ready path copied whole (~6 instructions).
    reconcile_error: Option<Box<E>>,
    last_attempt_cut_off: bool,
    attempts: u32,
    elapsed: Duration,
    /// Boxed: it is there only for one cold stop, and inline it made every
    /// call's future 40 bytes larger and the ready path ~20 instructions
    /// longer (measured with `future_sizes` and `scripts/instructions.sh`).
    refused: Option<Box<RefusedPause>>,
}

impl<E> Failure<E> {
    pub(crate) fn new(
        reason: Reason,
        last_error: Option<E>,
        reconcile_error: Option<E>,
        last_attempt_cut_off: bool,
        attempts: u32,
        elapsed: Duration,
    ) -> Self {
        Self {
            reason,
            last_error,
            reconcile_error: reconcile_error.map(Box::new),
            last_attempt_cut_off,
            attempts,
            elapsed,
            refused: None,
        }
    }

    pub(crate) fn with_refused_pause(mut self, refused: RefusedPause) -> Self {
        self.refused = Some(Box::new(refused));
        self
    }

    /// The pause that could not fit before the deadline, when the reason is
    /// [`Reason::PauseExceedsDeadline`].
    #[must_use]
    pub fn refused_pause(&self) -> Option<RefusedPause> {
        self.refused.as_deref().copied()
    }

    /// Why the call stopped.
    #[must_use]
    pub fn reason(&self) -> Reason {
        self.reason
    }

    /// The most recent error an attempt returned, if any attempt returned one.
    #[must_use]
    pub fn last_error(&self) -> Option<&E> {
        self.last_error.as_ref()
    }

    /// Take the most recent error.
    #[must_use]
    pub fn into_last_error(self) -> Option<E> {
        self.last_error
    }

    /// The error `reconcile` returned, when the reason is `UnknownOutcome`
    /// because reconciliation failed.
    #[must_use]
    pub fn reconcile_error(&self) -> Option<&E> {
        self.reconcile_error.as_deref()
    }

    /// Take the error `reconcile` returned, if any.
    #[must_use]
    pub fn into_reconcile_error(self) -> Option<E> {
        self.reconcile_error.map(|e| *e)
    }

    /// The same stop as [`Reason::UnknownOutcome`], with `why` as the
    /// look-up's error: for a door whose attempt had sent work (a `COMMIT`)
    /// when the deadline stopped the call, so that the stop does not read as
    /// "nothing happened in time" (see [`door::unknown_at_deadline`](crate::door::unknown_at_deadline)).
    #[cfg(feature = "tokio")]
    pub(crate) fn into_unknown(mut self, why: E) -> Self {
        self.reason = Reason::UnknownOutcome;
        self.reconcile_error = Some(Box::new(why));
        self
    }

    /// `true` when the last attempt was cut off by a time limit rather than
    /// returning an error.
    #[must_use]
    pub fn last_attempt_cut_off(&self) -> bool {
        self.last_attempt_cut_off
    }

    /// Attempts started (the body was called this many times).
    #[must_use]
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Time from the call's entry to the stop.
    #[must_use]
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// The failure as a [`Stopped`], with the last error as its source.
    pub fn into_stopped(self) -> Stopped
    where
        E: Into<Box<dyn StdError + Send + Sync>>,
    {
        Stopped {
            reason: self.reason,
            attempts: self.attempts,
            elapsed: self.elapsed,
            refused: self.refused,
            source: self.last_error.map(Into::into),
        }
    }

    /// The default mapping of the [module docs](self): the last error for
    /// `Permanent`, `Exhausted` and `UnknownOutcome`; `E::from(Stopped)`
    /// (the last error its source) for every other reason, and whenever the
    /// last attempt was cut off without an error.
    pub fn into_error(self) -> E
    where
        E: From<Stopped> + Into<Box<dyn StdError + Send + Sync>>,
    {
        if self.reason.returns_last_error()
            && !self.last_attempt_cut_off
            && let Some(e) = self.last_error
        {
            return e;
        }
        E::from(self.into_stopped())
    }

    /// Convert the errors with `f`, keeping everything else.
    pub fn map_err<F, E2>(self, mut f: F) -> Failure<E2>
    where
        F: FnMut(E) -> E2,
    {
        Failure {
            reason: self.reason,
            last_error: self.last_error.map(&mut f),
            reconcile_error: self.reconcile_error.map(|e| Box::new(f(*e))),
            last_attempt_cut_off: self.last_attempt_cut_off,
            attempts: self.attempts,
            elapsed: self.elapsed,
            refused: self.refused,
        }
    }
}

impl<E: fmt::Debug> fmt::Debug for Failure<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Failure")
            .field("reason", &self.reason)
            .field("attempts", &self.attempts)
            .field("elapsed", &self.elapsed)
            .field("last_error", &self.last_error)
            .field("reconcile_error", &self.reconcile_error)
            .field("last_attempt_cut_off", &self.last_attempt_cut_off)
            .field("refused_pause", &self.refused)
            .finish()
    }
}

impl<E: fmt::Display> fmt::Display for Failure<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_stop(
            f,
            self.reason,
            self.refused.as_deref(),
            self.attempts,
            self.elapsed,
        )?;
        if let Some(e) = &self.last_error {
            write!(f, ": {e}")?;
        }
        Ok(())
    }
}

impl<E: StdError + 'static> StdError for Failure<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.last_error
            .as_ref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

/// The library's own error: the call was stopped (deadline, open circuit, …).
/// Carries the reason and the last attempt's error as its [`source()`](StdError::source).
///
/// Error types returned by retried functions implement `From<Stopped>` so the
/// default mapping can produce them; it is provided for [`std::io::Error`].
/// A `Stopped` is always classified permanent, so an outer retry loop does not
/// retry a call that an inner one stopped.
#[derive(Debug)]
pub struct Stopped {
    reason: Reason,
    attempts: u32,
    elapsed: Duration,
    refused: Option<Box<RefusedPause>>,
    source: Option<Box<dyn StdError + Send + Sync>>,
}

impl Stopped {
    /// A `Stopped` without a source (for tests and integrations).
    #[must_use]
    pub fn new(reason: Reason, attempts: u32, elapsed: Duration) -> Self {
        Self {
            reason,
            attempts,
            elapsed,
            refused: None,
            source: None,
        }
    }

    /// The pause that could not fit before the deadline, when the reason is
    /// [`Reason::PauseExceedsDeadline`].
    #[must_use]
    pub fn refused_pause(&self) -> Option<RefusedPause> {
        self.refused.as_deref().copied()
    }

    /// Why the call stopped.
    #[must_use]
    pub fn reason(&self) -> Reason {
        self.reason
    }

    /// Attempts started.
    #[must_use]
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Time from the call's entry to the stop.
    #[must_use]
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }
}

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.refused.is_some() {
            "retry "
        } else {
            "retry stopped: "
        })?;
        write_stop(
            f,
            self.reason,
            self.refused.as_deref(),
            self.attempts,
            self.elapsed,
        )
    }
}

impl StdError for Stopped {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

/// `DeadlineExceeded` becomes [`io::ErrorKind::TimedOut`]; every other reason
/// [`io::ErrorKind::Other`]. The `Stopped` stays inside (`get_ref`), and the
/// `io::Error` is classified permanent because of it.
impl From<Stopped> for io::Error {
    fn from(s: Stopped) -> Self {
        let kind = match s.reason {
            Reason::DeadlineExceeded => io::ErrorKind::TimedOut,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, s)
    }
}
