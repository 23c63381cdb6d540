//! A scripted in-process service for the behaviour tests: each attempt takes
//! the next step of a script, and the service counts attempts and effects.

#![allow(dead_code, unreachable_pub)]

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use retries::{Classify, IdempotencyKey, Stopped, Verdict};

/// What one attempt does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    /// Do the work and answer.
    Succeed,
    /// Fail before doing the work (classified not executed).
    FailBefore,
    /// Do the work, then fail (classified unknown).
    FailAfter,
    /// Fail in a way retrying cannot fix, without doing the work.
    FailPermanent,
    /// Fail before the work, asking for a pause.
    Pushback(Duration),
    /// Never answer.
    Hang,
    /// Wait, then take the inner step.
    After(Duration, &'static Step),
}

/// The error of the scripted service.
#[derive(Debug, thiserror::Error)]
pub enum SvcError {
    #[error("refused before running")]
    NotExecuted(Option<Duration>),
    #[error("connection lost after sending")]
    Unknown,
    #[error("invalid request")]
    Permanent,
    #[error("lookup failed")]
    Lookup,
    #[error(transparent)]
    Stopped(#[from] Stopped),
}

impl Classify for SvcError {
    fn classify(&self) -> Verdict {
        match self {
            SvcError::NotExecuted(None) => Verdict::not_executed(),
            SvcError::NotExecuted(Some(d)) => Verdict::not_executed().with_retry_after(*d),
            SvcError::Unknown => Verdict::unknown(),
            SvcError::Permanent | SvcError::Lookup | SvcError::Stopped(_) => Verdict::permanent(),
        }
    }
}

/// The service: a script, an attempt log and the set of keys whose work was done.
#[derive(Default)]
pub struct Service {
    script: Mutex<VecDeque<Step>>,
    log: Mutex<Vec<(u32, tokio::time::Instant)>>,
    /// For each attempt: `Some(true)` if it ended with an unknown outcome,
    /// `Some(false)` for any other end, `None` while running or if it was cut off.
    ends: Mutex<Vec<Option<bool>>>,
    done: Mutex<Vec<IdempotencyKey>>,
}

impl Service {
    pub fn new(steps: &[Step]) -> Self {
        Self {
            script: Mutex::new(steps.iter().copied().collect()),
            ..Self::default()
        }
    }

    /// One attempt: follows the next step (an exhausted script succeeds).
    pub async fn call(&self, attempt: u32, key: IdempotencyKey) -> Result<u32, SvcError> {
        self.log
            .lock()
            .unwrap()
            .push((attempt, tokio::time::Instant::now()));
        let idx = {
            let mut ends = self.ends.lock().unwrap();
            ends.push(None);
            ends.len() - 1
        };
        let step = self
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Step::Succeed);
        let r = self.follow(step, key).await;
        self.ends.lock().unwrap()[idx] = Some(matches!(r, Err(SvcError::Unknown)));
        r
    }

    /// The first attempt (0-based) whose outcome was unknown: it failed after
    /// the work, or it was cut off before it ended.
    pub fn first_unknown_outcome(&self) -> Option<usize> {
        self.ends
            .lock()
            .unwrap()
            .iter()
            .position(|e| *e != Some(false))
    }

    async fn follow(&self, mut step: Step, key: IdempotencyKey) -> Result<u32, SvcError> {
        loop {
            return match step {
                Step::Succeed => {
                    self.done.lock().unwrap().push(key);
                    Ok(7)
                }
                Step::FailBefore => Err(SvcError::NotExecuted(None)),
                Step::Pushback(d) => Err(SvcError::NotExecuted(Some(d))),
                Step::FailAfter => {
                    self.done.lock().unwrap().push(key);
                    Err(SvcError::Unknown)
                }
                Step::FailPermanent => Err(SvcError::Permanent),
                Step::Hang => std::future::pending().await,
                Step::After(d, inner) => {
                    tokio::time::sleep(d).await;
                    step = *inner;
                    continue;
                }
            };
        }
    }

    /// A correct `reconcile`: was the work for `key` done? (`async` like a real
    /// look-up, though this one never waits.)
    #[allow(clippy::unused_async)]
    pub async fn lookup(&self, key: IdempotencyKey) -> Result<Option<u32>, SvcError> {
        Ok(self.done.lock().unwrap().contains(&key).then_some(7))
    }

    /// Attempts made.
    pub fn attempts(&self) -> usize {
        self.log.lock().unwrap().len()
    }

    /// The start instant of each attempt, relative to `t0`.
    pub fn starts(&self, t0: tokio::time::Instant) -> Vec<Duration> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .map(|(_, t)| *t - t0)
            .collect()
    }

    /// Times the work was done, in all.
    pub fn effects(&self) -> usize {
        self.done.lock().unwrap().len()
    }

    /// Distinct keys whose work was done.
    pub fn distinct_effects(&self) -> usize {
        self.done
            .lock()
            .unwrap()
            .iter()
            .collect::<HashSet<_>>()
            .len()
    }
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Declares `fn call(policy)`: [`retries::call`] under the name of the file
/// that expands it. Unnamed calls share one default budget per process, and
/// this binary holds the tests of every door: a file's calls keep to their
/// own bucket, as they did when each file was a binary of its own.
macro_rules! named_call {
    () => {
        fn call(policy: &retries::Policy) -> retries::Retry<'_> {
            static NAME: retries::observe::Name = retries::observe::Name::new(module_path!());
            retries::call(policy).name(&NAME)
        }
    };
}
pub(crate) use named_call;
