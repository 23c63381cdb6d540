//! Instructions per call, for `valgrind --tool=callgrind` (or all modes at
//! once: `bash scripts/instructions.sh`): runs N calls (default 100 000),
//! polled by hand (no executor), so the count per call is the engine's.
//! `target/release/examples/profile_ready N MODE`, MODE one of:
//!
//! * `ready` (the default): a `#[retryable]` fn whose body is ready at once;
//!   `breaker`, the same with a circuit breaker; `call`, the same through
//!   `retries::call`; `direct`, the body alone; `again`, the fastest peer;
//! * `yield`: the body returns `Pending` once, so the deadline timer is
//!   armed; `hand_yield`, the hand-written `timeout_at` loop with that body;
//! * `once`: the first attempt fails, the second succeeds (zero pause);
//!   `hand_once`, the hand-written loop doing the same.

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

#[retryable(deadline = "2s", max_attempts = 3, idempotent, attempt = at, budget = "none",
            backoff = "constant", initial_backoff = "0ms")]
async fn annotated_once(x: u64) -> Result<u64, E> {
    if at.number() == 1 {
        return Err(E::Refused);
    }
    Ok(black_box(x) + 1)
}

/// The hand-written loop of the `retry_once` bench: a deadline, 3 attempts,
/// the first fails.
async fn hand_once(x: u64) -> Result<u64, E> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
    let mut attempt = 1;
    loop {
        let n = attempt;
        match tokio::time::timeout_at(deadline, async move {
            if n == 1 {
                Err(E::Refused)
            } else {
                Ok(black_box(x) + 1)
            }
        })
        .await
        {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if attempt == 3 => return Err(e),
            Ok(Err(_)) => attempt += 1,
            Err(_) => return Err(E::TimedOut),
        }
    }
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

fn run(n: u64, mut call: impl FnMut(u64) -> Result<u64, E>) -> u64 {
    let mut sum = 0;
    for i in 0..n {
        sum += call(black_box(i)).unwrap_or(0);
    }
    sum
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
    // `ready_ctl`: a ready call while an operator's override is installed
    // for another call name (the set read and one hash look-up;
    // `retries::control`). The same arm as `ready`: a second copy of the
    // loop would be compiled apart, and count apart.
    if mode == "ready_ctl" {
        retries::control::set(
            "another::call",
            retries::control::Override::new().retries_off(),
            std::time::Duration::from_hours(1),
        )
        .expect("a valid override");
    }
    // The mode is matched once, outside the loop, so the count per call is
    // the call's alone.
    let sum = match mode.as_str() {
        "yield" => run(n, |i| spin(annotated_yield(i))),
        "breaker" => run(n, |i| spin(annotated_breaker(i))),
        "hand_yield" => run(n, |i| spin(hand_yield(i))),
        "again" => run(n, |i| {
            spin(
                again::RetryPolicy::exponential(std::time::Duration::from_millis(100))
                    .with_max_retries(2)
                    .retry(|| body(i)),
            )
        }),
        "direct" => run(n, |i| spin(body(i))),
        "once" => run(n, |i| spin(annotated_once(i))),
        "hand_once" => run(n, |i| spin(hand_once(i))),
        "call" => run(n, |i| {
            spin(
                retries::call(&POLICY)
                    .idempotent()
                    .budget(&BUDGET)
                    .run(async |_: &Attempt| body(i).await),
            )
        }),
        _ => run(n, |i| spin(annotated(i))),
    };
    black_box(sum);
}
