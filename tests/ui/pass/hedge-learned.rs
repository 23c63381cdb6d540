//! `hedge(max_attempts = N, learned = DELAY)`: the next copy after a delay
//! learned from the function's latencies (a `static LearnedDelay`), the
//! ceiling until it has seen enough calls.
#![deny(warnings)]

use std::time::Duration;

use retries::{LearnedDelay, retryable};

static PRICE_DELAY: LearnedDelay =
    LearnedDelay::new(0.05, Duration::from_millis(1), Duration::from_millis(30));

#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

#[retryable(deadline = "2s", idempotent, attempt = at, hedge(max_attempts = 2, learned = PRICE_DELAY))]
async fn price(sku: u32) -> Result<u32, E> {
    // The first copy is stuck; the second, sent after the delay (the
    // ceiling, 30 ms: nothing learned yet), answers in 10 ms.
    let slow = at.number() == 1;
    tokio::time::sleep(Duration::from_millis(if slow { 900 } else { 10 })).await;
    if sku == 0 {
        return Err(E::Refused);
    }
    Ok(sku * 100 + at.number())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let t0 = std::time::Instant::now();
    assert_eq!(price(7).await.unwrap(), 702);
    assert!(
        t0.elapsed() < Duration::from_millis(600),
        "{:?}",
        t0.elapsed()
    );
}
