//! `cargo bench -p retries-bench --bench overhead`: the cost of a retried call
//! against its baselines, in the same run. Stable ids: groups `ready`, `yield`
//! and `retry_once`, members `direct`, `retryable`, `retryable+breaker`,
//! `call` (`retries::call`), `hand_loop`, `backon`, `tokio-retry`, `tryhard`
//! and `again`, where meaningful.
//!
//! * `ready`: the body completes on its first poll (the happy path);
//! * `yield`: the body yields once before succeeding, so a deadline timer is
//!   armed (closer to a real I/O call);
//! * `retry_once`: the first attempt fails, the second succeeds, zero pause.
//!
//! Every variant uses comparable settings: at most 3 attempts, exponential
//! backoff from 100 ms (constant 0 for `retry_once`). Only `retry` and the
//! hand-written loop also enforce a deadline (2 s). `#[retryable]` runs with its
//! default budget (and, in `+breaker`, a circuit breaker); `retry_once` uses no
//! budget, since a bench that fails forever would (rightly) exhaust it.

// The operations are `async fn`s that complete at once, as the benchmark wants.
#![allow(clippy::unused_async)]

use std::cell::Cell;
use std::future::Future;
use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use retries::{Attempt, Policy, TokenBucket, retryable};
use retries_bench::{E, YieldOnce, hand_loop, spin};

// ---- the operation, un-annotated ------------------------------------------------

async fn direct(x: u64) -> Result<u64, E> {
    Ok(black_box(x) + 1)
}

async fn direct_yield(x: u64) -> Result<u64, E> {
    YieldOnce::default().await;
    Ok(black_box(x) + 1)
}

// ---- retry ----------------------------------------------------------------------

#[retryable(deadline = "2s", max_attempts = 3, idempotent)]
async fn annotated(x: u64) -> Result<u64, E> {
    Ok(black_box(x) + 1)
}

#[retryable(
    deadline = "2s",
    max_attempts = 3,
    idempotent,
    breaker(failure_threshold = 5, open_for = "10s")
)]
async fn annotated_breaker(x: u64) -> Result<u64, E> {
    Ok(black_box(x) + 1)
}

#[retryable(deadline = "2s", max_attempts = 3, idempotent)]
async fn annotated_yield(x: u64) -> Result<u64, E> {
    YieldOnce::default().await;
    Ok(black_box(x) + 1)
}

#[retryable(
    deadline = "2s",
    max_attempts = 3,
    idempotent,
    breaker(failure_threshold = 5, open_for = "10s")
)]
async fn annotated_breaker_yield(x: u64) -> Result<u64, E> {
    YieldOnce::default().await;
    Ok(black_box(x) + 1)
}

#[retryable(
    deadline = "2s",
    max_attempts = 3,
    idempotent,
    attempt = at,
    budget = "none",
    backoff = "constant",
    initial_backoff = "0ms",
    breaker(failure_threshold = 5, open_for = "10s")
)]
async fn annotated_breaker_retry_once(x: u64) -> Result<u64, E> {
    if at.number() == 1 {
        return Err(E::Refused);
    }
    Ok(black_box(x) + 1)
}

#[retryable(deadline = "2s", max_attempts = 3, idempotent, attempt = at, budget = "none",
            backoff = "constant", initial_backoff = "0ms")]
async fn annotated_retry_once(x: u64) -> Result<u64, E> {
    if at.number() == 1 {
        return Err(E::Refused);
    }
    Ok(black_box(x) + 1)
}

const POLICY: Policy = Policy::new(Duration::from_secs(2)).validated();
static BUDGET: TokenBucket = TokenBucket::DEFAULT;

// ---- the peers ------------------------------------------------------------------

async fn with_backon<F, Fut>(op: F, pause: Duration) -> Result<u64, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<u64, E>>,
{
    use backon::{ExponentialBuilder, Retryable};
    op.retry(
        ExponentialBuilder::default()
            .with_min_delay(pause)
            .with_max_times(2),
    )
    .sleep(tokio::time::sleep)
    .await
}

async fn with_tokio_retry<F, Fut>(op: F, pause: Duration) -> Result<u64, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<u64, E>>,
{
    use tokio_retry::strategy::FixedInterval;
    tokio_retry::Retry::start(FixedInterval::new(pause).take(2), op).await
}

async fn with_tryhard<F, Fut>(op: F, pause: Duration) -> Result<u64, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<u64, E>>,
{
    tryhard::retry_fn(op)
        .retries(2)
        .exponential_backoff(pause)
        .await
}

async fn with_again<F, Fut>(op: F, pause: Duration) -> Result<u64, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<u64, E>>,
{
    again::RetryPolicy::exponential(pause)
        .with_max_retries(2)
        .retry(op)
        .await
}

fn criterion_config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
}

fn ready(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let pause = Duration::from_millis(100);
    let mut g = c.benchmark_group("ready");
    g.bench_function("direct", |b| b.iter(|| spin(direct(black_box(1)))));
    g.bench_function("retryable", |b| b.iter(|| spin(annotated(black_box(1)))));
    g.bench_function("retryable+breaker", |b| {
        b.iter(|| spin(annotated_breaker(black_box(1))));
    });
    g.bench_function("call", |b| {
        b.iter(|| {
            spin(
                retries::call(&POLICY)
                    .idempotent()
                    .budget(&BUDGET)
                    .run(async |_: &Attempt| direct(black_box(1)).await),
            )
        });
    });
    g.bench_function("hand_loop", |b| {
        b.iter(|| spin(hand_loop(|| direct(black_box(1)), pause)));
    });
    g.bench_function("backon", |b| {
        b.iter(|| spin(with_backon(|| direct(black_box(1)), pause)));
    });
    g.bench_function("tokio-retry", |b| {
        b.iter(|| spin(with_tokio_retry(|| direct(black_box(1)), pause)));
    });
    g.bench_function("tryhard", |b| {
        b.iter(|| spin(with_tryhard(|| direct(black_box(1)), pause)));
    });
    g.bench_function("again", |b| {
        b.iter(|| spin(with_again(|| direct(black_box(1)), pause)));
    });
    // The two fastest peers bounded by a deadline as their users bound
    // them: the retry future under tokio's `timeout` (none of the peers
    // has a deadline of its own).
    let deadline = Duration::from_secs(2);
    g.bench_function("tokio-retry+timeout", |b| {
        b.iter(|| {
            spin(tokio::time::timeout(
                deadline,
                with_tokio_retry(|| direct(black_box(1)), pause),
            ))
        });
    });
    g.bench_function("tryhard+timeout", |b| {
        b.iter(|| {
            spin(tokio::time::timeout(
                deadline,
                with_tryhard(|| direct(black_box(1)), pause),
            ))
        });
    });
    g.finish();
}

fn yielding(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let pause = Duration::from_millis(100);
    let mut g = c.benchmark_group("yield");
    g.bench_function("direct", |b| b.iter(|| spin(direct_yield(black_box(1)))));
    g.bench_function("retryable", |b| {
        b.iter(|| spin(annotated_yield(black_box(1))));
    });
    g.bench_function("retryable+breaker", |b| {
        b.iter(|| spin(annotated_breaker_yield(black_box(1))));
    });
    g.bench_function("call", |b| {
        b.iter(|| {
            spin(
                retries::call(&POLICY)
                    .idempotent()
                    .budget(&BUDGET)
                    .run(async |_: &Attempt| direct_yield(black_box(1)).await),
            )
        });
    });
    g.bench_function("hand_loop", |b| {
        b.iter(|| spin(hand_loop(|| direct_yield(black_box(1)), pause)));
    });
    g.bench_function("backon", |b| {
        b.iter(|| spin(with_backon(|| direct_yield(black_box(1)), pause)));
    });
    g.bench_function("tokio-retry", |b| {
        b.iter(|| spin(with_tokio_retry(|| direct_yield(black_box(1)), pause)));
    });
    g.bench_function("tryhard", |b| {
        b.iter(|| spin(with_tryhard(|| direct_yield(black_box(1)), pause)));
    });
    g.bench_function("again", |b| {
        b.iter(|| spin(with_again(|| direct_yield(black_box(1)), pause)));
    });
    g.finish();
}

/// Fails on every other call: the first attempt of each retried call.
async fn flaky(state: &Cell<bool>) -> Result<u64, E> {
    let fail = !state.replace(!state.get());
    if fail {
        Err(E::Refused)
    } else {
        Ok(black_box(2))
    }
}

fn retry_once(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let zero = Duration::ZERO;
    let mut g = c.benchmark_group("retry_once");
    g.bench_function("retryable", |b| {
        b.iter(|| rt.block_on(annotated_retry_once(black_box(1))));
    });
    g.bench_function("retryable+breaker", |b| {
        b.iter(|| rt.block_on(annotated_breaker_retry_once(black_box(1))));
    });
    g.bench_function("call", |b| {
        const ZERO_PAUSE: Policy = Policy::new(Duration::from_secs(2))
            .with_backoff(retries::Backoff::NONE)
            .validated();
        b.iter(|| {
            rt.block_on(
                retries::call(&ZERO_PAUSE)
                    .idempotent()
                    .budget(retries::NoBudget)
                    .run(async |at: &Attempt| {
                        if at.number() == 1 {
                            Err(E::Refused)
                        } else {
                            Ok(black_box(2))
                        }
                    }),
            )
        });
    });
    g.bench_function("hand_loop", |b| {
        let s = Cell::new(false);
        b.iter(|| rt.block_on(hand_loop(|| flaky(&s), zero)));
    });
    g.bench_function("backon", |b| {
        let s = Cell::new(false);
        b.iter(|| rt.block_on(with_backon(|| flaky(&s), zero)));
    });
    g.bench_function("tokio-retry", |b| {
        let s = Cell::new(false);
        b.iter(|| rt.block_on(with_tokio_retry(|| flaky(&s), zero)));
    });
    g.bench_function("tryhard", |b| {
        let s = Cell::new(false);
        b.iter(|| rt.block_on(with_tryhard(|| flaky(&s), zero)));
    });
    g.bench_function("again", |b| {
        let s = Cell::new(false);
        b.iter(|| rt.block_on(with_again(|| flaky(&s), zero)));
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = criterion_config();
    targets = ready, yielding, retry_once
}
criterion_main!(benches);
