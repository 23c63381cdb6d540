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
//! before the breaker concludes the server is down). The rule is written once,
//! in [`Policy::check_breaker`](crate::Policy::check_breaker): `#[retryable]`
//! applies it at compile time to `breaker(failure_threshold = 2)` under a
//! literal `max_attempts = 3`; a shared breaker used by a loop that could open
//! it alone logs one WARN event (target `retries`) at the first such call.
//!
//! Only transient failures (`NotExecuted`, `Unknown`) count: a permanent error
//! (a bad request) says nothing about the server's health.
//!
//! # The protocol
//!
//! The engine asks [`Breaker::admit`] before each attempt; a refusal stops the
//! call with [`Reason::CircuitOpen`](crate::Reason::CircuitOpen) without
//! calling the body, and that is never retried. An admitted attempt carries
//! its [`Permit`] (whether it was admitted as a half-open probe), and after
//! the attempt the engine reports exactly one of [`Breaker::on_success`],
//! [`Breaker::on_transient_failure`] or [`Breaker::on_neutral`] (a permanent
//! error, or the attempt was cancelled) with that admission. Only an attempt
//! admitted as a probe of the current half-open episode gives a probe slot
//! back, closes the breaker by succeeding, or opens it again by failing: a
//! straggler admitted while the breaker was closed, or a probe of an earlier
//! episode still running after the breaker opened and went half-open again,
//! never does.
//!
//! A breaker is borrowed for the call, like a budget: a `static`, a field of a
//! client held in an `Arc`, or one built at run time with
//! [`CircuitBreaker::try_new`].

use std::sync::OnceLock;
use std::sync::atomic::Ordering;

use crate::sync::{AtomicBool, AtomicU64};
use std::time::{Duration, Instant};

/// How an attempt was admitted by a [`Breaker`] (its permit to run; the
/// SRE admission of a budget is [`limit::Admission`](crate::limit::Admission),
/// a different thing); handed back when its end is
/// reported. A probe carries the token of the half-open episode that admitted
/// it, so that a probe still running when its episode is over (the breaker
/// opened again, then went half-open anew) cannot hand back a slot of the
/// new episode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permit {
    probe: Option<u32>,
}

impl Permit {
    /// Admitted in the normal course (the breaker was closed).
    pub const NORMAL: Self = Self { probe: None };

    /// Admitted as a probe of the half-open episode `episode` (any token a
    /// breaker chooses to tell its episodes apart).
    #[must_use]
    pub const fn probe(episode: u32) -> Self {
        Self {
            probe: Some(episode),
        }
    }

    /// `true` for a probe.
    #[must_use]
    pub const fn is_probe(&self) -> bool {
        self.probe.is_some()
    }

    /// The episode of a probe.
    #[must_use]
    pub const fn episode(&self) -> Option<u32> {
        self.probe
    }
}

/// A circuit breaker consulted for every attempt.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a circuit breaker: it does not implement `retries::Breaker`",
    label = "not a breaker",
    note = "`breaker = …` takes a `retries::CircuitBreaker` (a `static` or a field of a client), or write the settings in place: `breaker(failure_threshold = 5, open_for = \"10s\")`"
)]
pub trait Breaker {
    /// May an attempt start now? `Some` admits one attempt, which is later
    /// reported with exactly one of the other methods, with this admission.
    fn admit(&self) -> Option<Permit>;

    /// The admitted attempt succeeded.
    fn on_success(&self, admission: Permit);

    /// The admitted attempt failed transiently.
    fn on_transient_failure(&self, admission: Permit);

    /// The admitted attempt ended in a way that says nothing about the
    /// server's health (a permanent error, or it was cancelled).
    fn on_neutral(&self, admission: Permit);

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
    fn admit(&self) -> Option<Permit> {
        Some(Permit::NORMAL)
    }
    #[inline]
    fn on_success(&self, _: Permit) {}
    #[inline]
    fn on_transient_failure(&self, _: Permit) {}
    #[inline]
    fn on_neutral(&self, _: Permit) {}
}

macro_rules! forward_breaker {
    ($($ty:ty),*) => {$(
        impl<K: Breaker + ?Sized> Breaker for $ty {
            #[inline]
            fn admit(&self) -> Option<Permit> {
                (**self).admit()
            }
            #[inline]
            fn on_success(&self, a: Permit) {
                (**self).on_success(a);
            }
            #[inline]
            fn on_transient_failure(&self, a: Permit) {
                (**self).on_transient_failure(a);
            }
            #[inline]
            fn on_neutral(&self, a: Permit) {
                (**self).on_neutral(a);
            }
            #[inline]
            fn check_attempts(&self, max_attempts: u32) {
                (**self).check_attempts(max_attempts);
            }
        }
    )*};
}
// A breaker is shared: borrowed for a call, or held in an `Arc` by a client.
forward_breaker!(&K, std::sync::Arc<K>);

/// A breaker that may not be there (configuration that sets none): `None`
/// admits every attempt, as [`NoBreaker`] does.
impl<K: Breaker> Breaker for Option<K> {
    #[inline]
    fn admit(&self) -> Option<Permit> {
        match self {
            Some(k) => k.admit(),
            None => Some(Permit::NORMAL),
        }
    }
    #[inline]
    fn on_success(&self, a: Permit) {
        if let Some(k) = self {
            k.on_success(a);
        }
    }
    #[inline]
    fn on_transient_failure(&self, a: Permit) {
        if let Some(k) = self {
            k.on_transient_failure(a);
        }
    }
    #[inline]
    fn on_neutral(&self, a: Permit) {
        if let Some(k) = self {
            k.on_neutral(a);
        }
    }
    #[inline]
    fn check_attempts(&self, max_attempts: u32) {
        if let Some(k) = self {
            k.check_attempts(max_attempts);
        }
    }
}

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

/// The state of a [`CircuitBreaker`]. More states may be added (a
/// failure-rate window), so a `match` needs a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
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

// The state word: a tag (2 bits), the episode (30 bits: incremented each
// time the breaker opens, so each half-open episode has its own number), and
// a count (32 bits: consecutive failures when closed, probes in flight when
// half-open).
const CLOSED: u64 = 0;
const OPEN: u64 = 1 << 62;
const HALF_OPEN: u64 = 2 << 62;
const TAG: u64 = 3 << 62;
const COUNT: u64 = (1 << 32) - 1;
const EPISODE_SHIFT: u32 = 32;
const EPISODE: u64 = ((1 << 30) - 1) << EPISODE_SHIFT;

fn episode(s: u64) -> u32 {
    ((s & EPISODE) >> EPISODE_SHIFT) as u32
}

/// The state `OPEN` one episode after `s`.
fn reopened(s: u64) -> u64 {
    let next = (s & EPISODE).wrapping_add(1 << EPISODE_SHIFT) & EPISODE;
    OPEN | next
}

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
/// numbers are literals, and otherwise it is logged once, as a WARN event, at
/// the first call ([`Policy::check_breaker`](crate::Policy::check_breaker)
/// is the rule).
///
/// On the healthy path (closed, no failures) admitting and reporting success
/// are one relaxed load each: no write, no clock read.
///
/// ```
/// use std::time::Duration;
/// use retries::breaker::{Breaker, BreakerState, CircuitBreaker};
///
/// static PAYMENTS: CircuitBreaker = CircuitBreaker::new(5, Duration::from_secs(10));
/// let admitted = PAYMENTS.admit().unwrap();
/// PAYMENTS.on_success(admitted);
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
    /// How long a breaker stays open when `breaker(…)` in `#[retryable]` does
    /// not say: 30 s.
    pub const DEFAULT_OPEN_FOR: Duration = Duration::from_secs(30);

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
    /// has used this breaker (and the problem was logged as a WARN event).
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
        let origin = *self.origin.get_or_init(crate::time::now);
        u64::try_from(crate::time::since(origin).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Log the breaker rule broken by a loop of `max_attempts`, once.
    #[cold]
    fn misconfigured(&self, e: crate::PolicyError, max_attempts: u32) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            crate::observe::misconfigured(
                "circuit breaker",
                e,
                format_args!(
                    "failure_threshold = {} under max_attempts = {max_attempts}",
                    self.threshold
                ),
            );
        }
    }

    /// `admit` past the closed state: open (or due for half-open), or half-open.
    fn admit_slow(&self, mut s: u64) -> Option<Permit> {
        loop {
            let next = match s & TAG {
                CLOSED => return Some(Permit::NORMAL),
                OPEN => {
                    let since = self.opened_at.load(Ordering::Acquire);
                    let open_ns = u64::try_from(self.open_for.as_nanos()).unwrap_or(u64::MAX);
                    if self.now_nanos().saturating_sub(since) < open_ns {
                        return None;
                    }
                    HALF_OPEN | (s & EPISODE) | 1
                }
                _ => {
                    if (s & COUNT) >= u64::from(self.probes) {
                        return None;
                    }
                    s + 1
                }
            };
            match self
                .state
                .compare_exchange_weak(s, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(Permit::probe(episode(next))),
                Err(actual) => s = actual,
            }
        }
    }

    /// `on_success` past the healthy state.
    fn on_success_slow(&self, mut s: u64, admission: Permit) {
        loop {
            let close = match s & TAG {
                // Healthy: nothing to write.
                CLOSED if s & COUNT == 0 => return,
                // A success resets the count of consecutive failures.
                CLOSED => true,
                // A successful probe of this episode closes the breaker; a
                // straggler admitted while closed, or a probe of an earlier
                // episode, says nothing about the half-open test.
                HALF_OPEN => admission.episode() == Some(episode(s)),
                _ => false,
            };
            if !close {
                return;
            }
            match self.state.compare_exchange_weak(
                s,
                CLOSED | (s & EPISODE),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(actual) => s = actual,
            }
        }
    }
}

impl Breaker for CircuitBreaker {
    #[inline]
    fn admit(&self) -> Option<Permit> {
        // Healthy: one load, inlined into the caller.
        let s = self.state.load(Ordering::Acquire);
        if s & TAG == CLOSED {
            return Some(Permit::NORMAL);
        }
        self.admit_slow(s)
    }

    #[inline]
    fn on_success(&self, admission: Permit) {
        // Healthy (closed, no failures): one load, nothing to write.
        let s = self.state.load(Ordering::Acquire);
        if s & TAG == CLOSED && s & COUNT == 0 {
            return;
        }
        self.on_success_slow(s, admission);
    }

    fn on_transient_failure(&self, admission: Permit) {
        let mut s = self.state.load(Ordering::Acquire);
        loop {
            let next = match s & TAG {
                CLOSED => {
                    let failures = (s & COUNT) + 1;
                    if failures >= u64::from(self.threshold) {
                        reopened(s)
                    } else {
                        CLOSED | (s & EPISODE) | failures
                    }
                }
                // A failed probe of this episode opens the breaker again; a
                // straggler's failure, or a probe of an earlier episode,
                // changes nothing now.
                HALF_OPEN if admission.episode() == Some(episode(s)) => reopened(s),
                _ => return,
            };
            if next & TAG == OPEN {
                // Stamp the opening first, so that no reader of OPEN sees an old stamp.
                self.opened_at.store(self.now_nanos(), Ordering::Release);
            }
            match self
                .state
                .compare_exchange_weak(s, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(actual) => s = actual,
            }
        }
    }

    fn on_neutral(&self, admission: Permit) {
        let Some(probe_episode) = admission.episode() else {
            return;
        };
        let mut s = self.state.load(Ordering::Acquire);
        while s & TAG == HALF_OPEN && episode(s) == probe_episode && s & COUNT > 0 {
            match self
                .state
                .compare_exchange_weak(s, s - 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(actual) => s = actual,
            }
        }
    }

    #[inline]
    fn check_attempts(&self, max_attempts: u32) {
        if let Err(e) = crate::rules::breaker_rule(self.threshold, max_attempts) {
            self.misconfigured(e, max_attempts);
        }
    }
}

/// The state word under `loom` (CI: `--cfg loom`).
#[cfg(all(test, loom))]
mod loom_models;
