//! `cargo run --release -p retries-bench --features examples --example future_sizes`: the size of the future each
//! way of retrying the same call returns, next to the body's own future.
//!
//! A future's size is what a caller stores (in its own future, or boxed when
//! spawned); nesting retried calls multiplies it.

use std::future::Future;
use std::hint::black_box;
use std::time::Duration;

use retries::{Attempt, Policy, TokenBucket, retryable};
use retries_bench::E;

async fn direct(x: u64) -> Result<u64, E> {
    tokio::task::yield_now().await;
    if x == u64::MAX {
        Err(E::Refused)
    } else {
        Ok(x + 1)
    }
}

#[retryable(deadline = "2s", max_attempts = 3, idempotent)]
async fn annotated(x: u64) -> Result<u64, E> {
    direct(x).await
}

#[retryable(
    deadline = "2s",
    max_attempts = 3,
    idempotent,
    breaker(failure_threshold = 5, open_for = "10s")
)]
async fn annotated_breaker(x: u64) -> Result<u64, E> {
    direct(x).await
}

#[retryable(deadline = "2s", max_attempts = 3, idempotent)]
async fn nested_outer(x: u64) -> Result<u64, E> {
    annotated(x).await
}

async fn hand_loop(x: u64) -> Result<u64, E> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let mut attempt = 1;
    loop {
        match tokio::time::timeout_at(deadline, direct(x)).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if attempt == 3 => return Err(e),
            Ok(Err(_)) => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(_) => return Err(E::TimedOut),
        }
    }
}

const POLICY: Policy = Policy::new(Duration::from_secs(2)).validated();
static BUDGET: TokenBucket = TokenBucket::DEFAULT;

#[allow(clippy::needless_pass_by_value)] // the future is measured where it is owned
fn size<F: Future>(f: F) -> usize {
    std::mem::size_of_val(&f)
}

fn main() {
    use backon::{ExponentialBuilder, Retryable};
    let pause = Duration::from_millis(100);
    let x = black_box(1);
    let rows = [
        ("direct", size(direct(x))),
        ("retryable", size(annotated(x))),
        ("retryable+breaker", size(annotated_breaker(x))),
        ("retryable_nested", size(nested_outer(x))),
        (
            "call",
            size(
                retries::call(&POLICY)
                    .idempotent()
                    .budget(&BUDGET)
                    .run(async move |_: &Attempt| direct(x).await),
            ),
        ),
        ("hand_loop", size(hand_loop(x))),
        (
            "backon",
            size((move || direct(x)).retry(ExponentialBuilder::default().with_max_times(2))),
        ),
        (
            "tokio-retry",
            size(tokio_retry::Retry::start(
                tokio_retry::strategy::FixedInterval::new(pause).take(2),
                move || direct(x),
            )),
        ),
        (
            "tryhard",
            size(
                tryhard::retry_fn(move || direct(x))
                    .retries(2)
                    .exponential_backoff(pause),
            ),
        ),
        (
            "again",
            size(
                again::RetryPolicy::exponential(pause)
                    .with_max_retries(2)
                    .retry(move || direct(x)),
            ),
        ),
    ];
    // One `name bytes` line per future: `retryable_nested` is a retried fn
    // calling another; `call` is `retries::call(…).run(async closure)`.
    for (name, bytes) in rows {
        println!("{name} {bytes}");
    }
}
