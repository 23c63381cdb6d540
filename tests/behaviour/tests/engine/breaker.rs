//! The circuit breaker under the loop, on the paused clock: it counts only
//! transient failures, opens at its threshold, refuses without calling the
//! body, half-opens after `open_for` with a bounded number of probes, and a
//! threshold that one call could reach is caught.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use retries::{
    Attempt, Breaker, BreakerError, BreakerState, CircuitBreaker, Classify, Permit, Policy,
    PolicyError, Reason, retryable,
};

// `call(&policy)`: `retries::call` under this file's own name.
crate::common::named_call!();

#[derive(Debug, thiserror::Error, Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error("invalid")]
    #[classify(permanent)]
    Invalid,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

const ONE: Policy = Policy::new(Duration::from_mins(1))
    .with_max_attempts(1)
    .validated();

/// One single-attempt call through `breaker` answering `answer`; returns the
/// stop reason (if any) and whether the body ran.
async fn once(
    breaker: &'static CircuitBreaker,
    answer: fn() -> Result<(), E>,
) -> (Option<Reason>, bool) {
    let mut ran = false;
    let r = call(&ONE)
        .idempotent()
        .breaker(breaker)
        .outcome(async |_: &Attempt| {
            ran = true;
            answer()
        })
        .await;
    (r.err().map(|f| f.reason()), ran)
}

fn refused() -> Result<(), E> {
    Err(E::Refused)
}
fn invalid() -> Result<(), E> {
    Err(E::Invalid)
}
#[allow(clippy::unnecessary_wraps)] // the shape every answer shares
fn ok() -> Result<(), E> {
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn opens_at_the_threshold_of_consecutive_transient_failures() {
    static B: CircuitBreaker = CircuitBreaker::new(3, Duration::from_secs(10));
    once(&B, refused).await;
    once(&B, refused).await;
    // A success resets the count; a permanent error neither counts nor resets.
    once(&B, ok).await;
    assert_eq!(B.state(), BreakerState::Closed { failures: 0 });
    once(&B, refused).await;
    once(&B, invalid).await;
    once(&B, refused).await;
    assert_eq!(B.state(), BreakerState::Closed { failures: 2 });
    once(&B, refused).await;
    assert_eq!(B.state(), BreakerState::Open);
    // Open: refused without calling the body, and never retried.
    assert_eq!(once(&B, ok).await, (Some(Reason::CircuitOpen), false));
}

#[tokio::test(start_paused = true)]
async fn half_open_after_open_for_then_a_probe_decides() {
    static B: CircuitBreaker = CircuitBreaker::new(1, Duration::from_secs(10));
    once(&B, refused).await;
    assert_eq!(B.state(), BreakerState::Open);
    tokio::time::sleep(Duration::from_millis(9_999)).await;
    assert_eq!(once(&B, ok).await, (Some(Reason::CircuitOpen), false));
    tokio::time::sleep(Duration::from_millis(1)).await;
    // The failed probe opens it again for a full `open_for`.
    assert_eq!(once(&B, refused).await, (Some(Reason::Exhausted), true));
    assert_eq!(B.state(), BreakerState::Open);
    tokio::time::sleep(Duration::from_secs(10)).await;
    // A successful probe closes it.
    assert_eq!(once(&B, ok).await, (None, true));
    assert_eq!(B.state(), BreakerState::Closed { failures: 0 });
}

#[tokio::test(start_paused = true)]
async fn half_open_admits_a_bounded_number_of_probes() {
    static B: CircuitBreaker =
        CircuitBreaker::new(1, Duration::from_secs(1)).with_half_open_probes(2);
    B.on_transient_failure(Permit::NORMAL);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let first = B.admit().unwrap();
    assert!(first.is_probe());
    assert!(B.admit().unwrap().is_probe());
    assert_eq!(B.admit(), None, "a third concurrent probe");
    assert_eq!(B.state(), BreakerState::HalfOpen { in_flight: 2 });
    // A straggler admitted while closed gives nothing back.
    B.on_neutral(Permit::NORMAL);
    assert_eq!(B.state(), BreakerState::HalfOpen { in_flight: 2 });
    // A probe that ends neutrally gives its slot back.
    B.on_neutral(first);
    assert!(B.admit().unwrap().is_probe());
}

#[tokio::test(start_paused = true)]
async fn a_call_dropped_mid_probe_returns_the_probe() {
    static B: CircuitBreaker = CircuitBreaker::new(1, Duration::from_secs(1));
    B.on_transient_failure(Permit::NORMAL);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let hang = call(&ONE)
        .idempotent()
        .breaker(&B)
        .outcome(async |_: &Attempt| std::future::pending::<Result<(), E>>().await);
    assert!(
        tokio::time::timeout(Duration::from_millis(5), hang)
            .await
            .is_err()
    );
    assert_eq!(B.state(), BreakerState::HalfOpen { in_flight: 0 });
}

static CHARGES: AtomicU32 = AtomicU32::new(0);
static ATTEMPTS: AtomicU32 = AtomicU32::new(0);

/// SPEC §13: breaker threshold 5 under 3 attempts; the first attempt fails,
/// the second succeeds.
#[retryable(
    deadline = "2s",
    max_attempts = 3,
    idempotent = false,
    attempt = at,
    backoff = "constant",
    initial_backoff = "10ms",
    breaker(failure_threshold = 5, open_for = "30s")
)]
async fn charge() -> Result<u32, E> {
    ATTEMPTS.fetch_add(1, Ordering::SeqCst);
    if at.number() == 1 {
        return Err(E::Refused); // refused before the handler ran
    }
    CHARGES.fetch_add(1, Ordering::SeqCst);
    Ok(at.number())
}

#[tokio::test(start_paused = true)]
async fn reference_row_threshold_five_first_attempt_fails() {
    assert_eq!(charge().await.unwrap(), 2);
    assert_eq!(ATTEMPTS.load(Ordering::SeqCst), 2);
    assert_eq!(CHARGES.load(Ordering::SeqCst), 1);
}

/// SPEC §13: threshold 2 under 3 attempts. With literals in the attribute it
/// does not compile (tests/ui/breaker-threshold-not-above-attempts.rs); with a
/// shared `static` it is reported once, at the first call.
static TOO_LOW: CircuitBreaker = CircuitBreaker::new(2, Duration::from_secs(30));

#[retryable(deadline = "2s", max_attempts = 3, idempotent, breaker = TOO_LOW, budget = "none",
            backoff = "constant", initial_backoff = "1ms")]
async fn guarded() -> Result<(), E> {
    Err(E::Refused)
}

#[tokio::test(start_paused = true)]
async fn reference_row_threshold_two_under_three_attempts() {
    assert!(!TOO_LOW.misconfiguration_reported());
    let err = guarded().await.unwrap_err();
    assert!(TOO_LOW.misconfiguration_reported());
    // Exactly what the rule predicts: the one call opened its own breaker.
    assert!(matches!(err, E::Stopped(s) if s.reason() == Reason::CircuitOpen));
    assert_eq!(TOO_LOW.state(), BreakerState::Open);
    assert_eq!(
        ONE.with_max_attempts(3).check_breaker(2),
        Err(PolicyError::BreakerThreshold)
    );
    assert_eq!(ONE.with_max_attempts(3).check_breaker(4), Ok(()));
}

#[test]
fn invalid_breaker_settings_are_rejected() {
    assert_eq!(
        CircuitBreaker::try_new(0, Duration::from_secs(1), 1).unwrap_err(),
        BreakerError::Threshold
    );
    assert_eq!(
        CircuitBreaker::try_new(5, Duration::ZERO, 1).unwrap_err(),
        BreakerError::OpenFor
    );
    assert_eq!(
        CircuitBreaker::try_new(5, Duration::from_secs(1), 0).unwrap_err(),
        BreakerError::Probes
    );
}

#[tokio::test(start_paused = true)]
async fn an_optional_breaker_is_one_when_given_and_none_when_not() {
    // `Option<K>`: a breaker from configuration that may set none.
    static OPTIONAL: CircuitBreaker = CircuitBreaker::new(2, Duration::from_secs(30));
    let call = async |b: Option<&CircuitBreaker>| {
        call(&ONE)
            .idempotent()
            .breaker(b)
            .outcome(async |_: &Attempt| refused())
            .await
            .unwrap_err()
            .reason()
    };
    for _ in 0..3 {
        assert_eq!(
            call(None).await,
            Reason::Exhausted,
            "no breaker: every call runs"
        );
    }
    assert_eq!(call(Some(&OPTIONAL)).await, Reason::Exhausted);
    assert_eq!(call(Some(&OPTIONAL)).await, Reason::Exhausted);
    assert_eq!(OPTIONAL.state(), BreakerState::Open);
    assert_eq!(call(Some(&OPTIONAL)).await, Reason::CircuitOpen);
    assert_eq!(call(None).await, Reason::Exhausted);
}
