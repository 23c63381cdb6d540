//! The `on_retry` hook: called before each pause, never after the last attempt,
//! with the failed attempt, its verdict, the pause and the time left.

use crate::common;

use std::time::Duration;

use common::{Service, Step, SvcError, ms};
use retries::{Attempt, Backoff, Policy, RetryEvent, VerdictKind};

// `call(&policy)`: `retries::call` under this file's own name.
crate::common::named_call!();

#[tokio::test(start_paused = true)]
async fn the_hook_sees_every_pause_and_only_pauses() {
    let policy = Policy::new(Duration::from_secs(1))
        .with_max_attempts(4)
        .with_backoff(Backoff::linear(ms(100), ms(50), ms(1000)));
    let svc = Service::new(&[
        Step::FailBefore,
        Step::Pushback(ms(30)),
        Step::FailAfter,
        Step::FailBefore,
    ]);
    let mut seen = Vec::new();
    let f = call(&policy)
        .idempotent()
        .on_retry(|e: &RetryEvent<'_, SvcError>| {
            seen.push((
                e.attempt(),
                e.verdict().kind(),
                e.delay(),
                e.remaining(),
                e.error().map(ToString::to_string),
            ));
        })
        .outcome(async |at: &Attempt| svc.call(at.number(), at.idempotency_key()).await)
        .await
        .unwrap_err();
    assert_eq!(f.attempts(), 4);
    let refused = Some("refused before running".to_string());
    assert_eq!(
        seen,
        [
            (
                1,
                VerdictKind::NotExecuted,
                ms(100),
                ms(1000),
                refused.clone()
            ),
            (2, VerdictKind::NotExecuted, ms(30), ms(900), refused),
            // the server's pause restarted the sequence: 100 ms again, not 150
            (
                3,
                VerdictKind::Unknown,
                ms(100),
                ms(870),
                Some("connection lost after sending".to_string())
            ),
        ]
    );
}
