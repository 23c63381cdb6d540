//! `cargo run --example fleet`: how per-client retry budgets add up across a
//! fleet.
//!
//! One service, dead (every call refused, not executed), and the same total
//! demand, 1,000 calls a second, spread over N clients (N = 1, 10, 100,
//! 1,000: one client calling every millisecond, or a thousand calling once a
//! second each). Every client has a budget of its own, as separate processes
//! do; every call is `max_attempts = 3`, so at most 2 retries per call.
//! Printed: retries per first attempt in the outage's first second and in
//! its steady state (seconds 5 to 10), for the default token bucket, for
//! a ratio budget (20 %, a floor of 10 retries per second over 10 s), and
//! for the same ratio budget with a floor that decays while failures
//! dominate (`RatioBudget::decaying_floor`).
//!
//! A ratio composes: each client's retries at most 20 % of its own calls is
//! at most 20 % of the fleet's. A floor does not: each client's floor is its
//! own, so the fleet's is N times one, and spread over quiet clients it is
//! every retry they ask for. The token bucket's first half (retries are
//! allowed while more than half its tokens are left) is such a floor too.
//! A decaying floor is gone after a client's first few failed attempts, so
//! the fleet is left with the ratio, whatever N.
//! On tokio's paused clock: the same figures on every run.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use retries::budget::RatioBudget;
use retries::{Attempt, Budget, Policy, TokenBucket};
use tokio::time::Instant;

const TOTAL_PER_SEC: u32 = 1_000;
const SECONDS: u32 = 10;

#[derive(Debug, thiserror::Error)]
#[error("connection refused")]
struct Refused;

impl retries::Classify for Refused {
    fn classify(&self) -> retries::Verdict {
        retries::Verdict::not_executed()
    }
}

/// First attempts and retries in each second.
#[derive(Default, Clone, Copy)]
struct Second {
    first: u64,
    retries: u64,
}

/// The policy of every call: at most 2 retries, 10 ms apart.
const POLICY: Policy = Policy::new(Duration::from_secs(1))
    .with_max_attempts(3)
    .with_backoff(retries::Backoff::constant(Duration::from_millis(10)));

/// Run the outage with one client per budget; each call runs on its own
/// (local) task, so a client keeps its schedule whatever its calls take.
async fn outage<B: Budget + 'static>(budgets: Vec<B>) -> Vec<Second> {
    let n = u32::try_from(budgets.len()).unwrap_or(u32::MAX);
    let budgets = Rc::new(budgets);
    let t0 = Instant::now();
    let seconds = Rc::new(Cell::new([Second::default(); SECONDS as usize + 2]));
    // Each client calls every n ms: 1,000 calls a second together.
    let period = Duration::from_millis(u64::from(n)) * 1_000 / TOTAL_PER_SEC;
    let end = t0 + Duration::from_secs(u64::from(SECONDS));
    let mut calls = Vec::new();
    // The clients' schedules, merged in time order: (when, client).
    let mut queue: std::collections::VecDeque<(Instant, usize)> = (0..budgets.len())
        .map(|i| (t0 + period * u32::try_from(i).unwrap_or(0) / n, i))
        .collect();
    while let Some((at, client)) = queue.pop_front() {
        if at >= end {
            continue;
        }
        tokio::time::sleep_until(at).await;
        queue.push_back((at + period, client));
        let (budgets, seconds) = (Rc::clone(&budgets), Rc::clone(&seconds));
        calls.push(tokio::task::spawn_local(async move {
            let _ = retries::call(&POLICY)
                .idempotent()
                .budget(&budgets[client])
                .outcome(async |at: &Attempt| {
                    // A call's retries end within its 1 s deadline.
                    let s = usize::try_from(t0.elapsed().as_secs())
                        .unwrap_or(0)
                        .min(SECONDS as usize + 1);
                    let mut all = seconds.get();
                    if at.is_retry() {
                        all[s].retries += 1;
                    } else {
                        all[s].first += 1;
                    }
                    seconds.set(all);
                    tokio::task::yield_now().await; // the refused round trip
                    Err::<(), _>(Refused)
                })
                .await;
        }));
    }
    for call in calls {
        call.await.expect("a call");
    }
    seconds.get().to_vec()
}

fn per_first(seconds: &[Second]) -> f64 {
    let first: u64 = seconds.iter().map(|s| s.first).sum();
    let retries: u64 = seconds.iter().map(|s| s.retries).sum();
    retries as f64 / first.max(1) as f64
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    println!(
        "a dead service, {TOTAL_PER_SEC} calls/s in all from N clients, each with its own budget; retries per first attempt (at most 2)"
    );
    println!(
        "{:>6}  {:>14} {:>14}  {:>14} {:>14}  {:>16} {:>16}",
        "N",
        "bucket, 1st s",
        "bucket, 5-10 s",
        "ratio, 1st s",
        "ratio, 5-10 s",
        "decaying, 1st s",
        "decaying, 5-10 s"
    );
    for n in [1usize, 10, 100, 1_000] {
        let buckets: Vec<TokenBucket> = (0..n).map(|_| TokenBucket::DEFAULT).collect();
        let ratios: Vec<RatioBudget> = (0..n)
            .map(|_| RatioBudget::new(Duration::from_secs(10), 10, 20))
            .collect();
        let decaying: Vec<RatioBudget> = (0..n)
            .map(|_| RatioBudget::new(Duration::from_secs(10), 10, 20).decaying_floor())
            .collect();
        let local = tokio::task::LocalSet::new();
        let b = local.block_on(&rt, outage(buckets));
        let r = local.block_on(&rt, outage(ratios));
        let d = local.block_on(&rt, outage(decaying));
        println!(
            "{n:>6}  {:>14.3} {:>14.3}  {:>14.3} {:>14.3}  {:>16.3} {:>16.3}",
            per_first(&b[..1]),
            per_first(&b[5..10]),
            per_first(&r[..1]),
            per_first(&r[5..10]),
            per_first(&d[..1]),
            per_first(&d[5..10]),
        );
    }
}
