//! Retry budgets. The token bucket follows gRPC `retryThrottling` (the
//! conformance cases come from the gRPC retry design, gRFC A6); the ratio
//! budget follows Finagle / tower `TpsBudget`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use retries::{
    Attempt, Backoff, Budget, BudgetError, Classify, Failure, Policy, RatioBudget, Reason,
    TokenBucket, retryable,
};

// `call(&policy)`: `retries::call` under this file's own name.
crate::common::named_call!();

#[derive(Debug, thiserror::Error, Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

const FIVE: Policy = Policy::new(Duration::from_mins(1))
    .with_max_attempts(5)
    .with_backoff(Backoff::NONE)
    .validated();

/// A call through `budget` whose first `fail` attempts are refused.
async fn call_with<B: Budget + Sync>(
    budget: &'static B,
    fail: u32,
) -> (Result<(), Failure<E>>, u32) {
    let mut attempts = 0;
    let r = call(&FIVE)
        .idempotent()
        .budget(budget)
        .outcome(async |_: &Attempt| {
            attempts += 1;
            if attempts <= fail {
                Err(E::Refused)
            } else {
                Ok(())
            }
        })
        .await;
    (r, attempts)
}

#[tokio::test(start_paused = true)]
async fn grpc_conformance_always_failing() {
    static B: TokenBucket = TokenBucket::new(10, 0.1);
    let (r, attempts) = call_with(&B, u32::MAX).await;
    assert_eq!(r.unwrap_err().reason(), Reason::Exhausted);
    assert_eq!((attempts, B.tokens_milli()), (5, 5_000));
    let (r, attempts) = call_with(&B, u32::MAX).await;
    assert_eq!(r.unwrap_err().reason(), Reason::BudgetExhausted);
    assert_eq!((attempts, B.tokens_milli()), (1, 4_000));
}

#[tokio::test(start_paused = true)]
async fn grpc_conformance_successes_refill_by_the_ratio() {
    static TEN: TokenBucket = TokenBucket::new(10, 0.1);
    static ELEVEN: TokenBucket = TokenBucket::new(10, 0.1);
    for (bucket, successes, retried) in [(&TEN, 10, false), (&ELEVEN, 11, true)] {
        for _ in 0..5 {
            bucket.on_transient_failure();
        }
        assert_eq!(bucket.tokens_milli(), 5_000);
        for _ in 0..successes {
            assert!(call_with(bucket, 0).await.0.is_ok());
        }
        let (r, attempts) = call_with(bucket, 1).await;
        assert_eq!(
            (r.is_ok(), attempts),
            (retried, if retried { 2 } else { 1 })
        );
    }
}

#[test]
fn tokens_stay_within_zero_and_max() {
    let b = TokenBucket::try_new(3, 0.5).unwrap();
    for _ in 0..10 {
        b.on_transient_failure();
    }
    assert_eq!(b.tokens_milli(), 0);
    for _ in 0..100 {
        b.on_success();
    }
    assert_eq!(b.tokens_milli(), 3_000);
}

#[test]
fn invalid_token_bucket_settings_are_rejected() {
    for (max, ratio) in [
        (0, 0.1),
        (1001, 0.1),
        (10, 0.0),
        (10, -1.0),
        (10, f64::NAN),
        (10, 0.0004),
    ] {
        assert!(TokenBucket::try_new(max, ratio).is_err(), "{max} {ratio}");
    }
    assert_eq!(
        TokenBucket::try_new(0, 0.1).unwrap_err(),
        BudgetError::MaxTokens
    );
    assert_eq!(
        TokenBucket::try_new(1000, 0.1239).unwrap().ratio_milli(),
        123
    );
    let default = TokenBucket::DEFAULT;
    assert_eq!(default.max_milli(), 100_000);
}

#[tokio::test(start_paused = true)]
async fn ratio_budget_floor_allows_that_many_retries_per_window() {
    static B: RatioBudget = RatioBudget::new(Duration::from_secs(1), 5, 100);
    let allowed = (0..10).filter(|_| B.try_retry()).count();
    assert_eq!(allowed, 5);
}

#[tokio::test(start_paused = true)]
async fn ratio_budget_without_floor_refuses_the_first_retry() {
    static B: RatioBudget = RatioBudget::new(Duration::from_secs(1), 0, 100);
    assert!(!B.try_retry());
}

#[tokio::test(start_paused = true)]
async fn ratio_budget_two_calls_at_fifty_percent_allow_one_retry() {
    static B: RatioBudget = RatioBudget::new(Duration::from_secs(1), 0, 50);
    B.on_call();
    B.on_call();
    assert!(B.try_retry());
    assert!(!B.try_retry());
}

#[tokio::test(start_paused = true)]
async fn ratio_budget_deposits_expire_after_the_window() {
    static B: RatioBudget = RatioBudget::new(Duration::from_secs(1), 0, 100);
    B.on_call();
    B.on_call();
    assert_eq!(B.balance(), 2);
    tokio::time::sleep(Duration::from_millis(1001)).await;
    assert_eq!(B.balance(), 0);
    assert!(!B.try_retry());
    // and the window keeps working after the expiry
    B.on_call();
    assert!(B.try_retry());
}

#[tokio::test(start_paused = true)]
async fn a_decaying_floor_is_gone_within_an_outage_and_comes_back_with_successes() {
    // A floor of 10 retries per 10 s and no ratio: only the floor retries.
    static PLAIN: RatioBudget = RatioBudget::new(Duration::from_secs(10), 1, 0);
    static DECAYING: RatioBudget = RatioBudget::new(Duration::from_secs(10), 1, 0).decaying_floor();
    // The plain floor retries every failure until its 10 are spent.
    let mut attempts = Vec::new();
    for _ in 0..3 {
        let (r, n) = call_with(&PLAIN, u32::MAX).await;
        attempts.push((n, r.unwrap_err().reason()));
    }
    assert_eq!(
        attempts,
        [
            (5, Reason::Exhausted),
            (5, Reason::Exhausted),
            (3, Reason::BudgetExhausted)
        ]
    );
    // The decaying floor: health 7/8, 49/64, … after each failed attempt,
    // floors 7, 5, 3, 1: three retries, then the fourth is refused; the next
    // call's first failure leaves no floor at all.
    let mut attempts = Vec::new();
    for _ in 0..3 {
        let (r, n) = call_with(&DECAYING, u32::MAX).await;
        attempts.push((n, r.unwrap_err().reason()));
    }
    assert_eq!(
        attempts,
        [
            (4, Reason::BudgetExhausted),
            (1, Reason::BudgetExhausted),
            (1, Reason::BudgetExhausted)
        ]
    );
    assert_eq!(DECAYING.balance(), 0);
    // Twenty calls that succeed bring it back to 9 of its 10, once the
    // three retries have left the window.
    for _ in 0..20 {
        assert_eq!(call_with(&DECAYING, 0).await.1, 1);
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(DECAYING.balance(), 9);
    // And a sporadic failure is retried again.
    let (r, n) = call_with(&DECAYING, 1).await;
    assert!(r.is_ok());
    assert_eq!(n, 2);
}

#[test]
fn invalid_ratio_budget_settings_are_rejected() {
    assert_eq!(
        RatioBudget::try_new(Duration::ZERO, 1, 10).unwrap_err(),
        BudgetError::Window
    );
    assert_eq!(
        RatioBudget::try_new(Duration::from_secs(61), 1, 10).unwrap_err(),
        BudgetError::Window
    );
    assert_eq!(
        RatioBudget::try_new(Duration::from_secs(1), 1, 1001).unwrap_err(),
        BudgetError::Percent
    );
}

#[tokio::test(start_paused = true)]
async fn a_refused_retry_stops_at_once_without_spinning() {
    static B: RatioBudget = RatioBudget::new(Duration::from_secs(1), 0, 0);
    let t0 = tokio::time::Instant::now();
    let (r, attempts) = call_with(&B, u32::MAX).await;
    let f = r.unwrap_err();
    assert_eq!(
        (f.reason(), attempts, t0.elapsed()),
        (Reason::BudgetExhausted, 1, Duration::ZERO)
    );
    // The default mapping: a budget stop is a `Stopped` that says so, the
    // last error its source (never the bare error of one refusal).
    let E::Stopped(stop) = f.into_error() else {
        panic!("a stop")
    };
    assert_eq!(stop.reason(), Reason::BudgetExhausted);
    let last = std::error::Error::source(&stop).and_then(|e| e.downcast_ref::<E>());
    assert!(matches!(last, Some(E::Refused)));
}

static ATTEMPTS: AtomicU32 = AtomicU32::new(0);

/// The default budget of `#[retryable]`: a token bucket of its own.
#[retryable(
    deadline = "1s",
    max_attempts = 3,
    idempotent,
    backoff = "constant",
    initial_backoff = "0ms"
)]
async fn always_refused() -> Result<(), E> {
    ATTEMPTS.fetch_add(1, Ordering::SeqCst);
    Err(E::Refused)
}

/// 1,000 calls against an operation that always fails, `max_attempts = 3`.
/// Without a budget: 3,000 attempts. With the default bucket (100 tokens,
/// retries while more than 50 remain): 16 calls make 3 attempts, one makes 2,
/// and the other 983 make 1: 1,033 attempts, a 3.3 % amplification.
#[tokio::test(start_paused = true)]
async fn amplification_under_a_sustained_outage() {
    for _ in 0..1000 {
        assert!(always_refused().await.is_err());
    }
    let attempts = ATTEMPTS.load(Ordering::SeqCst);
    println!("1000 calls, max_attempts = 3, default budget: {attempts} attempts");
    assert_eq!(attempts, 16 * 3 + 2 + 983);
    assert!(f64::from(attempts) <= 1000.0 * 1.1 + 50.0);
}

#[derive(Debug, thiserror::Error)]
enum Answer {
    #[error("do not retry")]
    Refused,
    #[error("unavailable")]
    Unavailable,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

/// The verdicts of [`Answer`]: a refusal is the server's "do not retry".
fn answer_verdict(e: &Answer) -> retries::Verdict {
    match e {
        Answer::Refused => retries::Verdict::server_refused(),
        Answer::Unavailable => retries::Verdict::not_executed(),
        Answer::Stopped(_) => retries::Verdict::permanent(),
    }
}

/// Five calls through `bucket`, each refused by its server at once.
async fn five_refusals(bucket: &'static TokenBucket) {
    for _ in 0..5 {
        let r: Result<(), Failure<Answer>> = call(&FIVE)
            .idempotent()
            .budget(bucket)
            .classify(answer_verdict)
            .outcome(async |_: &Attempt| Err(Answer::Refused))
            .await;
        assert_eq!(r.unwrap_err().attempts(), 1, "a refusal is never retried");
    }
}

/// gRFC A6: a "do not retry" answer (a negative pushback) counts as a
/// failure for throttling. With `maxTokens` 10, five refusals leave 5
/// tokens, not more than half: the next failing call makes one attempt (A6
/// and C-core: 1), where before it made three.
#[tokio::test(start_paused = true)]
async fn a_server_refusal_costs_a_throttling_token() {
    static BUCKET: TokenBucket = TokenBucket::new(10, 0.1);
    five_refusals(&BUCKET).await;
    assert_eq!(BUCKET.tokens_milli(), 5_000);
    let mut attempts = 0;
    let r: Result<(), Failure<Answer>> = call(&FIVE)
        .idempotent()
        .budget(&BUCKET)
        .classify(answer_verdict)
        .outcome(async |_: &Attempt| {
            attempts += 1;
            Err(Answer::Unavailable)
        })
        .await;
    assert_eq!(r.unwrap_err().reason(), Reason::BudgetExhausted);
    assert_eq!(attempts, 1);
}

/// The same for hedging: after five refusals, with 5 of 10 tokens left, a
/// hedged call sends no hedge (A6 sends none).
#[tokio::test(start_paused = true)]
async fn after_refusals_no_hedge_is_sent() {
    static BUCKET: TokenBucket = TokenBucket::new(10, 0.1);
    five_refusals(&BUCKET).await;
    let copies = AtomicU32::new(0);
    let r: Result<u32, Answer> = call(&FIVE)
        .idempotent()
        .budget(&BUCKET)
        .classify(answer_verdict)
        .run_hedged(
            retries::Hedging::new(3, Duration::from_millis(100)),
            |_: &Attempt| {
                copies.fetch_add(1, Ordering::SeqCst);
                async {
                    tokio::time::sleep(Duration::from_millis(350)).await;
                    Ok(7)
                }
            },
        )
        .await;
    assert_eq!(r.unwrap(), 7);
    assert_eq!(
        copies.load(Ordering::SeqCst),
        1,
        "no hedge after the bucket fell to half"
    );
}

/// Attempts of one `retries::call` made with no budget and no name, every
/// attempt failing with `verdict` (3 attempts allowed).
async fn unnamed_site_a(verdict: retries::Verdict) -> u32 {
    let policy = Policy::new(Duration::from_secs(5)).with_max_attempts(3);
    let attempts = AtomicU32::new(0);
    let _ = retries::call(&policy)
        .idempotent()
        .classify(move |_: &std::io::Error| verdict)
        .run(async |_: &retries::Attempt| {
            attempts.fetch_add(1, Ordering::Relaxed);
            Err::<(), _>(std::io::Error::other("down"))
        })
        .await;
    attempts.load(Ordering::Relaxed)
}

/// The same, written at another place in the source.
async fn unnamed_site_b() -> u32 {
    let policy = Policy::new(Duration::from_secs(5)).with_max_attempts(3);
    let attempts = AtomicU32::new(0);
    let _ = retries::call(&policy)
        .idempotent()
        .run(async |_: &retries::Attempt| {
            attempts.fetch_add(1, Ordering::Relaxed);
            Err::<(), _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
        })
        .await;
    attempts.load(Ordering::Relaxed)
}

/// An unnamed `retries::call` draws on the default bucket of its call
/// site, not on one bucket shared by every unnamed call of the process: a
/// site whose service is down drains its own bucket (100 tokens, retries
/// while more than 50 are left), and a call written elsewhere still
/// retries.
#[tokio::test(start_paused = true)]
async fn each_unnamed_call_site_has_its_own_default_budget() {
    let mut attempts = 0;
    for _ in 0..40 {
        attempts += unnamed_site_a(retries::Verdict::not_executed()).await;
    }
    assert!(
        attempts < 40 * 3,
        "site A's bucket ran dry: {attempts} attempts for 40 calls"
    );
    assert_eq!(
        unnamed_site_a(retries::Verdict::not_executed()).await,
        1,
        "no retry left at A"
    );
    assert_eq!(unnamed_site_b().await, 3, "site B retries: its own bucket");
}

/// A conflict with concurrent work (a serialization failure) draws on no
/// budget: 200 calls that each lose twice all get their three attempts,
/// where plain transient failures would have drained the bucket.
#[tokio::test(start_paused = true)]
async fn conflicts_draw_no_budget() {
    static BUCKET: TokenBucket = TokenBucket::DEFAULT;
    let policy = Policy::new(Duration::from_secs(5)).with_max_attempts(3);
    for i in 0..200 {
        let attempts = AtomicU32::new(0);
        let r = retries::call(&policy)
            .idempotent()
            .budget(&BUCKET)
            .classify(|_: &std::io::Error| retries::Verdict::not_executed().with_conflict())
            .run(async |_: &retries::Attempt| {
                if attempts.fetch_add(1, Ordering::Relaxed) < 2 {
                    return Err(std::io::Error::other("40001"));
                }
                Ok(())
            })
            .await;
        assert!(r.is_ok(), "call {i}: {r:?}");
    }
}
