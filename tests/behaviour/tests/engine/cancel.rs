//! Dropping the call's future cancels everything beneath it: no attempt starts
//! afterwards, and the running attempt is dropped at once.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use retries::testing::{Scripted, Step};
use retries::{Attempt, Backoff, Policy};

// `call(&policy)`: `retries::call` under this file's own name.
crate::common::named_call!();

const POLICY: Policy = Policy::new(Duration::from_secs(10))
    .with_max_attempts(5)
    .with_backoff(Backoff::constant(Duration::from_millis(100)))
    .validated();

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[tokio::test(start_paused = true)]
async fn dropped_during_a_pause() {
    let op = Scripted::new([Step::fail_before_effect(); 5]);
    let call = call(&POLICY)
        .idempotent()
        .outcome(async |at: &Attempt| op.call(at).await);
    // Attempt 1 fails at 0 and the call pauses until 100 ms; the caller leaves at 50.
    assert!(tokio::time::timeout(ms(50), call).await.is_err());
    tokio::time::sleep(Duration::from_mins(1)).await;
    assert_eq!(op.attempts(), 1);
}

struct Guard<'a>(&'a AtomicU32);
impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn dropped_during_an_attempt() {
    let op = Scripted::new([Step::fail_before_effect().after(ms(100)); 5]);
    let dropped = AtomicU32::new(0);
    let call = call(&POLICY).idempotent().outcome(async |at: &Attempt| {
        let _g = Guard(&dropped);
        op.call(at).await
    });
    // Attempt 1 ends at 100, pause to 200, attempt 2 runs; the caller leaves at 250.
    assert!(tokio::time::timeout(ms(250), call).await.is_err());
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        2,
        "attempt 2 was dropped with the call"
    );
    tokio::time::sleep(Duration::from_mins(1)).await;
    op.assert_schedule(&[0, 200]);
}

#[tokio::test(start_paused = true)]
async fn aborted_task_starts_nothing_more() {
    let op = std::sync::Arc::new(Scripted::new([Step::fail_before_effect(); 5]));
    let o = op.clone();
    let task = tokio::spawn(async move {
        call(&POLICY)
            .idempotent()
            .outcome(async move |at: &Attempt| o.call(at).await)
            .await
            .is_ok()
    });
    tokio::time::sleep(ms(150)).await; // attempts at 0 and 100; pausing until 200
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    tokio::time::sleep(Duration::from_mins(1)).await;
    op.assert_schedule(&[0, 100]);
}
