//! Shared budgets and breakers under contention: many OS threads and many
//! tasks on the multi-thread runtime. State stays within its bounds, half-open
//! never admits more probes than allowed, and nothing deadlocks.

use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use retries::{
    Breaker, BreakerState, Budget, CircuitBreaker, Classify, Permit, TokenBucket, retryable,
};

const THREADS: usize = 8;

#[test]
fn half_open_admits_exactly_its_probes_under_contention() {
    static B: CircuitBreaker =
        CircuitBreaker::new(1, Duration::from_millis(20)).with_half_open_probes(3);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        B.on_transient_failure(Permit::NORMAL);
        assert_eq!(B.state(), BreakerState::Open);
        tokio::time::sleep(Duration::from_millis(25)).await;
    });
    let mut last = None;
    for round in 0..3 {
        let admitted = std::sync::Mutex::new(Vec::new());
        let barrier = Barrier::new(THREADS);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    let _guard = rt.enter();
                    barrier.wait();
                    for _ in 0..1000 {
                        if let Some(a) = B.admit() {
                            assert!(a.is_probe());
                            admitted.lock().unwrap().push(a);
                        }
                    }
                });
            }
        });
        let admitted = admitted.into_inner().unwrap();
        assert_eq!(admitted.len(), 3, "round {round}");
        assert_eq!(B.state(), BreakerState::HalfOpen { in_flight: 3 });
        // The probes end neutrally: their slots come back for the next round.
        for a in &admitted {
            B.on_neutral(*a);
        }
        last = admitted.first().copied();
    }
    B.on_success(last.unwrap());
    assert_eq!(B.state(), BreakerState::Closed { failures: 0 });
}

#[test]
fn token_bucket_stays_in_bounds_under_contention() {
    static B: TokenBucket = TokenBucket::new(50, 0.3);
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let barrier = &barrier;
            s.spawn(move || {
                barrier.wait();
                for i in 0..20_000 {
                    if (i + t) % 3 == 0 {
                        B.on_success();
                    } else {
                        B.on_transient_failure();
                    }
                    let tokens = B.tokens_milli();
                    assert!(tokens <= 50_000);
                    let _ = B.try_retry();
                }
            });
        }
    });
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| (0..1000).for_each(|_| B.on_success()));
        }
    });
    assert_eq!(B.tokens_milli(), 50_000);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| (0..100).for_each(|_| B.on_transient_failure()));
        }
    });
    assert_eq!(B.tokens_milli(), 0);
}

#[derive(Debug, thiserror::Error, Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

static SHARED_BUDGET: TokenBucket = TokenBucket::new(1000, 0.5);
static SHARED_BREAKER: CircuitBreaker = CircuitBreaker::new(1_000_000, Duration::from_secs(1));
static ATTEMPTS: AtomicU64 = AtomicU64::new(0);

#[retryable(deadline = "10s", max_attempts = 3, idempotent, attempt = at,
            budget = SHARED_BUDGET, breaker = SHARED_BREAKER,
            backoff = "constant", initial_backoff = "0ms")]
async fn flaky(seed: u64) -> Result<u32, E> {
    ATTEMPTS.fetch_add(1, Ordering::Relaxed);
    tokio::task::yield_now().await;
    if (seed + u64::from(at.number())).is_multiple_of(2) {
        Err(E::Refused)
    } else {
        Ok(at.number())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_tasks_share_one_budget_and_breaker() {
    const TASKS: u64 = 64;
    const CALLS: u64 = 200;
    let work = async {
        let handles: Vec<_> = (0..TASKS)
            .map(|t| {
                tokio::spawn(async move {
                    let mut ok = 0;
                    for c in 0..CALLS {
                        if flaky(t * CALLS + c).await.is_ok() {
                            ok += 1;
                        }
                    }
                    ok
                })
            })
            .collect();
        let mut ok = 0;
        for h in handles {
            ok += h.await.unwrap();
        }
        ok
    };
    let ok = tokio::time::timeout(Duration::from_mins(1), work)
        .await
        .expect("no deadlock");
    let attempts = ATTEMPTS.load(Ordering::Relaxed);
    // Even seeds fail once then succeed; odd seeds succeed at once.
    assert_eq!(ok, TASKS * CALLS);
    assert_eq!(attempts, TASKS * CALLS * 3 / 2);
    assert!(SHARED_BUDGET.tokens_milli() <= 1_000_000);
    assert_eq!(SHARED_BREAKER.state(), BreakerState::Closed { failures: 0 });
}
