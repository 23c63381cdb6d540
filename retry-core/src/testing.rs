//! Test your retry flows (feature `testing`): a [`Scripted`] operation follows
//! a script of [`Step`]s, counts the effects it performs, and records when each
//! attempt started, so a test on tokio's paused clock can assert the exact
//! schedule of attempts, pauses, budget and breaker decisions and deadline.
//!
//! # The five branches of a retry flow
//!
//! ```
//! use std::time::Duration;
//! use retries::testing::{Scripted, ScriptError, Step};
//! use retries::{Attempt, Backoff, Failure, Policy, Reason};
//!
//! const POLICY: Policy = Policy::new(Duration::from_secs(2))
//!     .with_max_attempts(3)
//!     .with_backoff(Backoff::constant(Duration::from_millis(100)))
//!     .validated();
//!
//! async fn fetch(op: &Scripted) -> Result<u32, Failure<ScriptError>> {
//!     retries::call(&POLICY)
//!         .idempotent()
//!         .outcome(async |at: &Attempt| op.call(at).await)
//!         .await
//! }
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! // 1. First-try success: one attempt, no pause.
//! let op = Scripted::new([Step::succeed()]);
//! assert_eq!(fetch(&op).await.unwrap(), 1);
//! op.assert_schedule(&[0]);
//!
//! // 2. Success after retries: attempts 100 ms apart, one effect.
//! let op = Scripted::new([Step::fail_before_effect(), Step::fail_before_effect(), Step::succeed()]);
//! assert_eq!(fetch(&op).await.unwrap(), 3);
//! op.assert_schedule(&[0, 100, 200]);
//! assert_eq!(op.effects(), 1);
//!
//! // 3. Permanent failure: no retry.
//! let op = Scripted::new([Step::fail_permanent()]);
//! assert_eq!(fetch(&op).await.unwrap_err().reason(), Reason::Permanent);
//! op.assert_schedule(&[0]);
//!
//! // 4. Exhausted: every attempt failed.
//! let op = Scripted::new([Step::fail_before_effect(); 3]);
//! assert_eq!(fetch(&op).await.unwrap_err().reason(), Reason::Exhausted);
//! op.assert_schedule(&[0, 100, 200]);
//!
//! // 5. Recovered: the failure becomes a fallback value.
//! let op = Scripted::new([Step::fail_before_effect(); 3]);
//! let price = fetch(&op).await.or_else(|f| match f.reason() {
//!     Reason::Exhausted => Ok::<_, Failure<ScriptError>>(0),
//!     _ => Err(f),
//! });
//! assert_eq!(price.unwrap(), 0);
//! # }
//! ```

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::attempt::{Attempt, IdempotencyKey};
use crate::failure::Stopped;
use crate::verdict::{Classify, Verdict};

/// What one scripted attempt does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// Do the work and answer `Ok(attempt number)`.
    Succeed,
    /// Fail before doing the work: [`ScriptError::NotExecuted`].
    FailBeforeEffect,
    /// Do the work, then fail: [`ScriptError::AfterEffect`] (outcome unknown).
    FailAfterEffect,
    /// Fail without doing the work, permanently: [`ScriptError::Permanent`].
    FailPermanent,
    /// Fail before the work, asking for this pause (server pushback).
    Pushback(Duration),
    /// Never answer (until cut off).
    Hang,
}

/// One step of a script: an optional delay, then a [`StepKind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    delay: Duration,
    kind: StepKind,
}

impl Step {
    const fn of(kind: StepKind) -> Self {
        Self {
            delay: Duration::ZERO,
            kind,
        }
    }

    /// Do the work and succeed.
    #[must_use]
    pub const fn succeed() -> Self {
        Self::of(StepKind::Succeed)
    }

    /// Fail before the work (not executed).
    #[must_use]
    pub const fn fail_before_effect() -> Self {
        Self::of(StepKind::FailBeforeEffect)
    }

    /// Do the work, then fail (outcome unknown).
    #[must_use]
    pub const fn fail_after_effect() -> Self {
        Self::of(StepKind::FailAfterEffect)
    }

    /// Fail permanently, without the work.
    #[must_use]
    pub const fn fail_permanent() -> Self {
        Self::of(StepKind::FailPermanent)
    }

    /// Fail before the work, asking for `pause` before the next attempt.
    #[must_use]
    pub const fn pushback(pause: Duration) -> Self {
        Self::of(StepKind::Pushback(pause))
    }

    /// Never answer.
    #[must_use]
    pub const fn hang() -> Self {
        Self::of(StepKind::Hang)
    }

    /// The same step, taking `delay` first (a slow server).
    #[must_use]
    pub const fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// What the step does after its delay.
    #[must_use]
    pub const fn kind(&self) -> StepKind {
        self.kind
    }
}

/// The errors of a [`Scripted`] operation, classified as their names say.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    /// Refused before the work: `NotExecuted` (with the pushback, if any).
    #[error("refused before the work")]
    NotExecuted {
        /// The server's requested pause.
        retry_after: Option<Duration>,
    },
    /// Failed after the work: `Unknown`.
    #[error("failed after the work")]
    AfterEffect,
    /// Failed permanently: `Permanent`.
    #[error("permanent failure")]
    Permanent,
    /// The call was stopped: `Permanent`.
    #[error(transparent)]
    Stopped(#[from] Stopped),
}

impl Classify for ScriptError {
    fn classify(&self) -> Verdict {
        match self {
            Self::NotExecuted { retry_after: None } => Verdict::not_executed(),
            Self::NotExecuted {
                retry_after: Some(p),
            } => Verdict::not_executed().with_retry_after(*p),
            Self::AfterEffect => Verdict::unknown(),
            Self::Permanent | Self::Stopped(_) => Verdict::permanent(),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    script: VecDeque<Step>,
    starts: Vec<Instant>,
    effects: Vec<IdempotencyKey>,
}

/// An operation that follows a script: attempt *n* takes step *n* (an
/// exhausted script succeeds). It records when each attempt started and the
/// idempotency key of every effect it performed.
#[derive(Debug, Default)]
pub struct Scripted {
    state: Mutex<State>,
}

impl Scripted {
    /// An operation following `steps`.
    pub fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        Self {
            state: Mutex::new(State {
                script: steps.into_iter().collect(),
                ..State::default()
            }),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// One attempt, under `at`'s idempotency key.
    pub async fn call(&self, at: &Attempt) -> Result<u32, ScriptError> {
        let key = at.idempotency_key();
        let step = self.with(|s| {
            s.starts.push(Instant::now());
            s.script.pop_front().unwrap_or(Step::succeed())
        });
        if !step.delay.is_zero() {
            tokio::time::sleep(step.delay).await;
        }
        match step.kind {
            StepKind::Succeed => {
                self.with(|s| s.effects.push(key));
                Ok(at.number())
            }
            StepKind::FailBeforeEffect => Err(ScriptError::NotExecuted { retry_after: None }),
            StepKind::Pushback(p) => Err(ScriptError::NotExecuted {
                retry_after: Some(p),
            }),
            StepKind::FailAfterEffect => {
                self.with(|s| s.effects.push(key));
                Err(ScriptError::AfterEffect)
            }
            StepKind::FailPermanent => Err(ScriptError::Permanent),
            StepKind::Hang => std::future::pending().await,
        }
    }

    /// A correct `reconcile`: `Some(1)` if the work for `key` was done.
    /// (`async` like a real look-up, though this one never waits.)
    #[allow(clippy::unused_async)]
    pub async fn lookup(&self, key: IdempotencyKey) -> Result<Option<u32>, ScriptError> {
        Ok(self.with(|s| s.effects.contains(&key)).then_some(1))
    }

    /// Attempts started.
    pub fn attempts(&self) -> usize {
        self.with(|s| s.starts.len())
    }

    /// Effects performed (work done), in all.
    pub fn effects(&self) -> usize {
        self.with(|s| s.effects.len())
    }

    /// When each attempt started, relative to the first.
    pub fn schedule(&self) -> Vec<Duration> {
        self.with(|s| {
            let first = s.starts.first().copied();
            s.starts
                .iter()
                .map(|t| first.map_or(Duration::ZERO, |f| *t - f))
                .collect()
        })
    }

    /// Assert the attempt schedule, in whole milliseconds from the first
    /// attempt.
    ///
    /// # Panics
    ///
    /// When the schedule differs, with both schedules in the message.
    #[track_caller]
    pub fn assert_schedule(&self, expected_ms: &[u64]) {
        let actual: Vec<u64> = self
            .schedule()
            .iter()
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .collect();
        assert_eq!(
            actual, expected_ms,
            "attempt schedule (ms from the first attempt): expected {expected_ms:?}, got {actual:?}"
        );
    }
}
