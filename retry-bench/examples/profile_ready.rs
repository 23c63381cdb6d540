//! Instructions per happy call, for `valgrind --tool=callgrind`:
//! `cargo build --release -p retries-bench --example profile_ready` then
//! `valgrind --tool=callgrind target/release/examples/profile_ready N`.
//! Runs N calls (default 100 000) of a `#[retryable]` fn whose body is ready at
//! once (or, with a second argument `call`, the same through `retries::call`;
//! `breaker`, the `ready` fn with a breaker;
//! `yield`, a body that returns `Pending` once, so the deadline timer is
//! armed; `hand`, the hand-written `timeout_at` loop with that body), polled by
//! hand (no executor), so the count per call is the engine's.

// The operations are `async fn`s that complete at once, as the profile wants.
#![allow(clippy::unused_async)]

use std::hint::black_box;

use retries::{Attempt, Policy, TokenBucket, retryable};
use retries_bench::{E, YieldOnce, spin};

#[retryable(deadline = "2s", max_attempts = 3, idempotent)]
async fn annotated(x: u64) -> Result<u64, E> {
    if x == u64::MAX {
        return Err(E::Refused);
    }
    Ok(black_box(x) + 1)
}

const POLICY: Policy = Policy::new(std::time::Duration::from_secs(2)).validated();
static BUDGET: TokenBucket = TokenBucket::DEFAULT;

async fn body(x: u64) -> Result<u64, E> {
    if x == u64::MAX {
        return Err(E::Refused);
    }
    Ok(black_box(x) + 1)
}

#[retryable(
    deadline = "2s",
    max_attempts = 3,
    idempotent,
    breaker(failure_threshold = 5, open_for = "10s")
)]
async fn annotated_breaker(x: u64) -> Result<u64, E> {
    if x == u64::MAX {
        return Err(E::Refused);
    }
    Ok(black_box(x) + 1)
}

#[retryable(deadline = "2s", max_attempts = 3, idempotent)]
async fn annotated_yield(x: u64) -> Result<u64, E> {
    YieldOnce::default().await;
    Ok(black_box(x) + 1)
}

async fn hand_yield(x: u64) -> Result<u64, E> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
    match tokio::time::timeout_at(deadline, async {
        YieldOnce::default().await;
        Ok(black_box(x) + 1)
    })
    .await
    {
        Ok(r) => r,
        Err(_) => Err(E::Refused),
    }
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let mode = std::env::args().nth(2).unwrap_or_default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let mut sum = 0;
    for i in 0..n {
        sum += if mode == "yield" {
            spin(annotated_yield(black_box(i))).unwrap_or(0)
        } else if mode == "breaker" {
            spin(annotated_breaker(black_box(i))).unwrap_or(0)
        } else if mode == "hand" {
            spin(hand_yield(black_box(i))).unwrap_or(0)
        } else if mode == "call" {
            spin(
                retries::call(&POLICY)
                    .idempotent()
                    .budget(&BUDGET)
                    .run(async |_: &Attempt| body(black_box(i)).await),
            )
            .unwrap_or(0)
        } else {
            spin(annotated(black_box(i))).unwrap_or(0)
        };
    }
    black_box(sum);
}
