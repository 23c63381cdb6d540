//! `cargo run --example storm`: how retries multiply through layers, and what
//! stops them.
//!
//! Three layers of `#[retryable]` functions, each `max_attempts = 3`, call a
//! bottom service that is down (every call fails, not executed). The table
//! counts the calls that reach the bottom:
//!
//! * `nested = "defer"` (the default): only the top layer retries, so one
//!   top-level call makes 3 bottom calls;
//! * `nested = "own"` at every layer: 3 × 3 × 3 = 27;
//! * then N concurrent callers, with each layer's default retry budget versus
//!   no budget at all.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use retries::{Classify, retryable};

#[derive(Debug, thiserror::Error, Classify)]
enum Error {
    #[error("connection refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

/// Three layers over a dead bottom, with the nesting mode and budget given.
macro_rules! stack {
    ($module:ident, $mode:literal $(, $budget:tt)?) => {
        mod $module {
            use super::{retryable, Error, Ordering};

            pub(crate) static BOTTOM_CALLS: super::AtomicU64 = super::AtomicU64::new(0);

            async fn bottom() -> Result<(), Error> {
                BOTTOM_CALLS.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await; // a (failing) round trip
                Err(Error::Refused)
            }

            #[retryable(deadline = "10s", max_attempts = 3, idempotent, nested = $mode,
                        backoff = "constant", initial_backoff = "1ms" $(, budget = $budget)?)]
            async fn storage() -> Result<(), Error> {
                bottom().await
            }

            #[retryable(deadline = "10s", max_attempts = 3, idempotent, nested = $mode,
                        backoff = "constant", initial_backoff = "1ms" $(, budget = $budget)?)]
            async fn orders() -> Result<(), Error> {
                storage().await
            }

            #[retryable(deadline = "10s", max_attempts = 3, idempotent, nested = $mode,
                        backoff = "constant", initial_backoff = "1ms" $(, budget = $budget)?)]
            pub(crate) async fn checkout() -> Result<(), Error> {
                orders().await
            }
        }
    };
}

stack!(defer_budget, "defer");
stack!(own_budget, "own");
stack!(defer_unlimited, "defer", "none");
stack!(own_unlimited, "own", "none");

/// A scenario: its name, how many concurrent callers, the bottom counter of
/// its stack, and how to start one top-level call.
type Row = (
    &'static str,
    u64,
    &'static AtomicU64,
    fn() -> tokio::task::JoinHandle<Result<(), Error>>,
);

/// Run `callers` concurrent top-level calls; return the bottom calls made.
async fn storm<F, Fut>(callers: u64, counter: &'static AtomicU64, call: F) -> (u64, f64)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), Error>> + Send + 'static,
{
    let before = counter.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..callers).map(|_| tokio::spawn(call())).collect();
    for t in tasks {
        let _ = t.await.expect("task");
    }
    let calls = counter.load(Ordering::Relaxed) - before;
    (calls, t0.elapsed().as_secs_f64() * 1000.0)
}

#[tokio::main]
async fn main() {
    const CALLERS: u64 = 200;
    println!("three layers × max_attempts = 3 over a dead bottom service\n");
    println!(
        "{:<44} {:>8} {:>14} {:>10}",
        "scenario", "callers", "bottom calls", "per call"
    );
    let rows: [Row; 6] = [
        (
            "nested = \"defer\" (default), default budget",
            1,
            &defer_budget::BOTTOM_CALLS,
            || tokio::spawn(defer_budget::checkout()),
        ),
        (
            "nested = \"own\" at every layer, no budget",
            1,
            &own_unlimited::BOTTOM_CALLS,
            || tokio::spawn(own_unlimited::checkout()),
        ),
        (
            "nested = \"defer\", no budget",
            CALLERS,
            &defer_unlimited::BOTTOM_CALLS,
            || tokio::spawn(defer_unlimited::checkout()),
        ),
        (
            "nested = \"defer\", default budget",
            CALLERS,
            &defer_budget::BOTTOM_CALLS,
            || tokio::spawn(defer_budget::checkout()),
        ),
        (
            "nested = \"own\" at every layer, no budget",
            CALLERS,
            &own_unlimited::BOTTOM_CALLS,
            || tokio::spawn(own_unlimited::checkout()),
        ),
        (
            "nested = \"own\" at every layer, default budget",
            CALLERS,
            &own_budget::BOTTOM_CALLS,
            || tokio::spawn(own_budget::checkout()),
        ),
    ];
    for (name, callers, counter, call) in rows {
        let (calls, ms) = storm(callers, counter, move || async move {
            call().await.expect("task")
        })
        .await;
        println!(
            "{name:<44} {callers:>8} {calls:>14} {:>10.2}   ({ms:.0} ms)",
            calls as f64 / callers as f64
        );
    }
}
