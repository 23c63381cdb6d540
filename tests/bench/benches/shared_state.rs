//! `cargo bench --bench shared_state`: throughput of the budget and breaker
//! operations on the hot path, from 1 and 2 threads sharing one `static`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use retries::{Breaker, Budget, CircuitBreaker, RatioBudget, TokenBucket};

static BUCKET: TokenBucket = TokenBucket::DEFAULT;
static BREAKER: CircuitBreaker = CircuitBreaker::new(1_000_000, Duration::from_secs(10));
static RATIO: RatioBudget = RatioBudget::new(Duration::from_secs(10), 10, 20);

/// Time `iters` runs of `op` on each of `threads` threads at once.
fn threaded(threads: usize, iters: u64, op: fn()) -> Duration {
    let barrier = std::sync::Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let t0 = Instant::now();
                    for _ in 0..iters {
                        op();
                    }
                    t0.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .max()
            .unwrap_or_default()
    })
}

fn ops() -> [(&'static str, fn()); 5] {
    [
        // The happy path: a full bucket, a closed breaker. No write.
        ("bucket.on_success (full)", || BUCKET.on_success()),
        ("breaker.acquire+success (closed)", || {
            if let Some(a) = black_box(BREAKER.admit()) {
                BREAKER.on_success(a);
            }
        }),
        // Under failures: writes to shared memory.
        ("bucket.failure+success", || {
            BUCKET.on_transient_failure();
            BUCKET.on_success();
        }),
        ("bucket.try_retry", || {
            black_box(BUCKET.try_retry());
        }),
        ("ratio.on_call", || RATIO.on_call()),
    ]
}

fn shared_state(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    for threads in [1, 2] {
        let mut g = c.benchmark_group(format!("shared/{threads}-thread"));
        for (name, op) in ops() {
            g.bench_function(name, |b| {
                b.iter_custom(|iters| threaded(threads, iters, op));
            });
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(30);
    targets = shared_state
}
criterion_main!(benches);
