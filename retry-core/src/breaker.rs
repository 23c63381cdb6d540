//! Circuit breakers, placed *under* the retry loop: a breaker sees every
//! attempt, not every call.
//!
//! # The threshold rule, and why
//!
//! Because the breaker counts attempts, one call against a dead server reports
//! up to `max_attempts` consecutive failures. A breaker with
//! `failure_threshold <= max_attempts` therefore opens on the very first bad
//! call: a single unlucky request cuts every other caller off for `open_for`.
//! Keep `failure_threshold` above `max_attempts` (several calls must fail
//! before the breaker concludes the server is down). `#[retryable]` refuses to
//! compile `breaker(failure_threshold = 2)` under `max_attempts = 3`; a shared
//! `static` breaker used by a loop that could open it alone is reported once,
//! on standard error, at the first call; [`Policy::check_breaker`](crate::Policy::check_breaker)
//! makes the same check for your own configuration code.
//!
//! Only transient failures (`NotExecuted`, `Unknown`) count: a permanent error
//! (a bad request) says nothing about the server's health.
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

    /// Told once per call the `max_attempts` of the loop above it, so that a
    /// breaker that would open on a single bad call can say so. Default:
    /// nothing.
    #[inline]
    fn check_attempts(&self, max_attempts: u32) {
        let _ = max_attempts;
    }
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

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Why a breaker setting is invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BreakerError {
    /// `failure_threshold` is zero.
    #[error("`failure_threshold` must be at least 1")]
    Threshold,
    /// `open_for` is zero.
    #[error("`open_for` must be longer than zero")]
    OpenFor,
    /// `half_open_probes` is zero or above 1 000 000.
    #[error("`half_open_probes` must lie in 1..=1000000")]
    Probes,
}

impl BreakerError {
    /// The message, available in `const` contexts.
    #[must_use]
    pub const fn message(&self) -> &'static str {
        match self {
            Self::Threshold => "`failure_threshold` must be at least 1",
            Self::OpenFor => "`open_for` must be longer than zero",
            Self::Probes => "`half_open_probes` must lie in 1..=1000000",
        }
    }
}

/// The state of a [`CircuitBreaker`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Attempts pass; `failures` consecutive transient failures so far.
    Closed {
        /// Consecutive transient failures.
        failures: u32,
    },
    /// Attempts are refused until `open_for` has passed.
    Open,
    /// A bounded number of probe attempts are admitted; `in_flight` now.
    HalfOpen {
        /// Probes admitted and not yet reported.
        in_flight: u32,
    },
}

const CLOSED: u64 = 0;
const OPEN: u64 = 1 << 62;
const HALF_OPEN: u64 = 2 << 62;
const TAG: u64 = 3 << 62;
const COUNT: u64 = (1 << 32) - 1;

/// A consecutive-failure circuit breaker, lock-free and `const`-constructible.
///
/// * **Closed**: attempts pass. Each transient failure (`NotExecuted` or
///   `Unknown`) adds one to a count of consecutive failures; a success resets
///   it; a permanent error leaves it alone (it says nothing about the server's
///   health). At `failure_threshold` consecutive failures the breaker opens.
/// * **Open**: attempts are refused without calling the body; the call stops
///   with `CircuitOpen`, which is never retried. After `open_for`, the next
///   attempt finds the breaker half-open.
/// * **Half-open**: at most `half_open_probes` attempts (default 1) are
///   admitted at once. A successful probe closes the breaker; a failed one
///   opens it again for `open_for`; a probe that ends neutrally (permanent
///   error, cancelled) gives its slot back.
///
/// Under the retry loop, the breaker sees every attempt, so one bad call with
/// `max_attempts` attempts can count `max_attempts` failures: keep
/// `failure_threshold` above `max_attempts`, or a single call opens its own
/// breaker. `#[retryable]` rejects the mistake at compile time when both
/// numbers are literals, and otherwise reports it once, on standard error, at
/// the first call ([`Policy::check_breaker`](crate::Policy::check_breaker)
/// makes the same check).
///
/// On the healthy path (closed, no failures) admitting and reporting success
/// are one relaxed load each: no write, no clock read.
///
/// ```
/// use std::time::Duration;
/// use retry_core::breaker::{Breaker, BreakerState, CircuitBreaker};
///
/// static PAYMENTS: CircuitBreaker = CircuitBreaker::new(5, Duration::from_secs(10));
/// assert!(PAYMENTS.try_acquire());
/// PAYMENTS.on_success();
/// assert_eq!(PAYMENTS.state(), BreakerState::Closed { failures: 0 });
/// ```
#[derive(Debug)]
pub struct CircuitBreaker {
    state: AtomicU64,
    opened_at: AtomicU64,
    origin: OnceLock<Instant>,
    warned: AtomicBool,
    threshold: u32,
    open_for: Duration,
    probes: u32,
}

impl CircuitBreaker {
    /// A closed breaker opening after `failure_threshold` consecutive transient
    /// failures, for `open_for`, with one half-open probe. Panics (a compile
    /// error in a `static`) on invalid settings; use [`try_new`](Self::try_new)
    /// at run time.
    ///
    /// # Panics
    ///
    /// When `failure_threshold` or `open_for` is zero.
    #[must_use]
    #[track_caller]
    pub const fn new(failure_threshold: u32, open_for: Duration) -> Self {
        if let Err(e) = Self::validate(failure_threshold, open_for, 1) {
            panic!("{}", e.message());
        }
        Self::build(failure_threshold, open_for, 1)
    }

    const fn validate(threshold: u32, open_for: Duration, probes: u32) -> Result<(), BreakerError> {
        if threshold == 0 {
            return Err(BreakerError::Threshold);
        }
        if open_for.is_zero() {
            return Err(BreakerError::OpenFor);
        }
        if probes == 0 || probes > 1_000_000 {
            return Err(BreakerError::Probes);
        }
        Ok(())
    }

    const fn build(threshold: u32, open_for: Duration, probes: u32) -> Self {
        Self {
            state: AtomicU64::new(CLOSED),
            opened_at: AtomicU64::new(0),
            origin: OnceLock::new(),
            warned: AtomicBool::new(false),
            threshold,
            open_for,
            probes,
        }
    }

    /// A closed breaker, or why the settings are invalid.
    pub const fn try_new(
        failure_threshold: u32,
        open_for: Duration,
        half_open_probes: u32,
    ) -> Result<Self, BreakerError> {
        match Self::validate(failure_threshold, open_for, half_open_probes) {
            Ok(()) => Ok(Self::build(failure_threshold, open_for, half_open_probes)),
            Err(e) => Err(e),
        }
    }

    /// The same breaker admitting `n` probes at once when half-open.
    ///
    /// # Panics
    ///
    /// When `n` is zero or above 1 000 000 (a compile error in a `static`).
    #[must_use]
    #[track_caller]
    pub const fn with_half_open_probes(mut self, n: u32) -> Self {
        if let Err(e) = Self::validate(self.threshold, self.open_for, n) {
            panic!("{}", e.message());
        }
        self.probes = n;
        self
    }

    /// Consecutive transient failures that open the breaker.
    #[must_use]
    pub const fn failure_threshold(&self) -> u32 {
        self.threshold
    }

    /// How long the breaker stays open.
    #[must_use]
    pub const fn open_for(&self) -> Duration {
        self.open_for
    }

    /// Probes admitted at once when half-open.
    #[must_use]
    pub const fn half_open_probes(&self) -> u32 {
        self.probes
    }

    /// `true` once a loop whose `max_attempts` reaches `failure_threshold`
    /// has used this breaker (and the problem was reported on standard error).
    pub fn misconfiguration_reported(&self) -> bool {
        self.warned.load(Ordering::Relaxed)
    }

    /// The current state.
    pub fn state(&self) -> BreakerState {
        let s = self.state.load(Ordering::Acquire);
        match s & TAG {
            OPEN => BreakerState::Open,
            HALF_OPEN => BreakerState::HalfOpen {
                in_flight: (s & COUNT) as u32,
            },
            _ => BreakerState::Closed {
                failures: (s & COUNT) as u32,
            },
        }
    }

    fn now_nanos(&self) -> u64 {
        let origin = *self.origin.get_or_init(Instant::now);
        u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn open(&self, from: u64) {
        self.opened_at.store(self.now_nanos(), Ordering::Release);
        let _ = self
            .state
            .compare_exchange(from, OPEN, Ordering::AcqRel, Ordering::Acquire);
    }
}

impl Breaker for CircuitBreaker {
    fn try_acquire(&self) -> bool {
        let mut s = self.state.load(Ordering::Acquire);
        loop {
            let next = match s & TAG {
                CLOSED => return true,
                OPEN => {
                    let since = self.opened_at.load(Ordering::Acquire);
                    let open_ns = u64::try_from(self.open_for.as_nanos()).unwrap_or(u64::MAX);
                    if self.now_nanos().saturating_sub(since) < open_ns {
                        return false;
                    }
                    HALF_OPEN | 1
                }
                _ => {
                    if (s & COUNT) >= u64::from(self.probes) {
                        return false;
                    }
                    s + 1
                }
            };
            match self
                .state
                .compare_exchange_weak(s, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(actual) => s = actual,
            }
        }
    }

    fn on_success(&self) {
        let s = self.state.load(Ordering::Acquire);
        if s == CLOSED {
            return; // healthy: nothing to write
        }
        // Closed with failures, or a successful half-open probe: close.
        if s & TAG != OPEN {
            let _ = self
                .state
                .compare_exchange(s, CLOSED, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    fn on_transient_failure(&self) {
        let mut s = self.state.load(Ordering::Acquire);
        loop {
            match s & TAG {
                CLOSED => {
                    let failures = (s & COUNT) + 1;
                    if failures >= u64::from(self.threshold) {
                        return self.open(s);
                    }
                    match self.state.compare_exchange_weak(
                        s,
                        CLOSED | failures,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => return,
                        Err(actual) => s = actual,
                    }
                }
                HALF_OPEN => return self.open(s),
                _ => return,
            }
        }
    }

    fn on_neutral(&self) {
        let mut s = self.state.load(Ordering::Acquire);
        while s & TAG == HALF_OPEN && s & COUNT > 0 {
            match self
                .state
                .compare_exchange_weak(s, s - 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(actual) => s = actual,
            }
        }
    }

    fn check_attempts(&self, max_attempts: u32) {
        if self.threshold <= max_attempts && !self.warned.swap(true, Ordering::Relaxed) {
            eprintln!(
                "retry: MISCONFIGURED circuit breaker: failure_threshold = {} is not above max_attempts = {}; \
                 one failing call can open it by itself. Raise failure_threshold above max_attempts.",
                self.threshold, max_attempts
            );
        }
    }
}
