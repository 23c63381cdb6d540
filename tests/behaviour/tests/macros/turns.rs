//! `#[retryable]`'s loop awaits one future a turn: the pause before a
//! retry is a turn of its own, which runs no body and admits nothing; the
//! attempt after it is admitted once the pause is over. On tokio's paused
//! clock, exactly: each pause is as long as the policy says, an attempt's
//! time limit counts from its own start (after the pause), and the body
//! runs once per attempt, never on a pause's turn.

#![deny(warnings)]

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use retries::{Classify, retryable};
use tokio::time::Instant;

#[derive(Debug, thiserror::Error, PartialEq, Classify)]
enum Error {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error("stopped")]
    #[classify(permanent)]
    Stopped,
}

impl From<retries::Stopped> for Error {
    fn from(_: retries::Stopped) -> Self {
        Error::Stopped
    }
}

/// Refused first, then too slow for its 50 ms (cut off: an unknown
/// outcome, retried since idempotent), then done.
#[retryable(
    deadline = "10s",
    max_attempts = 3,
    attempt_timeout = "50ms",
    backoff = "constant",
    initial_backoff = "100ms",
    jitter = "none",
    idempotent
)]
async fn third_time(runs: &AtomicU32, starts: &Mutex<Vec<Instant>>) -> Result<u32, Error> {
    starts.lock().unwrap().push(Instant::now());
    match runs.fetch_add(1, Ordering::SeqCst) + 1 {
        1 => Err(Error::Refused),
        2 => {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok(2)
        }
        n => Ok(n),
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn pauses_are_turns_of_their_own() {
    let runs = AtomicU32::new(0);
    let starts = Mutex::new(Vec::new());
    let t0 = Instant::now();
    assert_eq!(third_time(&runs, &starts).await, Ok(3));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "the body ran on a pause's turn"
    );
    let offsets: Vec<Duration> = starts.lock().unwrap().iter().map(|s| *s - t0).collect();
    assert_eq!(
        offsets,
        [
            Duration::ZERO,
            Duration::from_millis(100),
            // 100 + the second attempt's 50 ms limit, from its own start,
            // + the second pause.
            Duration::from_millis(250),
        ]
    );
    assert_eq!(t0.elapsed(), Duration::from_millis(250));
}

/// A call dropped during a pause runs no further attempt.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn dropped_during_a_pause_runs_nothing_more() {
    let runs = AtomicU32::new(0);
    let starts = Mutex::new(Vec::new());
    let cut = tokio::time::timeout(Duration::from_millis(60), third_time(&runs, &starts)).await;
    assert!(cut.is_err());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
