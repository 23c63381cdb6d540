//! The blocking door: `#[retryable]` on a plain `fn` and
//! `call(…).run_blocking(…)`, on the same engine: the decision
//! table, the deadline (std clock, checked before every attempt and pause),
//! nested scopes, budgets, breakers and `reconcile`. Real time, bounded
//! (pauses of a few milliseconds).

use std::cell::Cell;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use retries::{
    Attempt, Backoff, CircuitBreaker, Classify, Failure, IdempotencyKey, Policy, Reason,
    TokenBucket, Verdict, retryable,
};

// `call(&policy)`: `retries::call` under this file's own name.
crate::common::named_call!();

#[derive(Debug, thiserror::Error, Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error("reset")]
    #[classify(unknown)]
    Reset,
    #[error("invalid")]
    #[classify(permanent)]
    Invalid,
    #[error(transparent)]
    #[classify(permanent)]
    Stopped(#[from] retries::Stopped),
}

thread_local! {
    static CALLS: Cell<u32> = const { Cell::new(0) };
}

fn calls() -> u32 {
    CALLS.with(Cell::get)
}

fn reset() {
    STARTS.with(|s| s.borrow_mut().clear());
    CALLS.with(|c| c.set(0));
}

/// Fails with `e` until attempt `ok_at`.
fn flaky(at: &Attempt, ok_at: u32, e: fn() -> E) -> Result<u32, E> {
    CALLS.with(|c| c.set(c.get() + 1));
    if at.number() < ok_at {
        Err(e())
    } else {
        Ok(at.number())
    }
}

#[retryable(deadline = "2s", max_attempts = 3, idempotent, attempt = at,
            backoff = "constant", initial_backoff = "5ms", budget = "none")]
fn lookup(ok_at: u32) -> Result<u32, E> {
    flaky(at, ok_at, || E::Reset)
}

#[test]
fn a_blocking_fn_is_retried_with_pauses() {
    reset();
    let t0 = Instant::now();
    assert_eq!(lookup(3).unwrap(), 3);
    assert_eq!(calls(), 3);
    assert!(t0.elapsed() >= Duration::from_millis(10), "two 5 ms pauses");
    reset();
    assert!(
        matches!(lookup(9), Err(E::Reset)),
        "exhausted: the last error"
    );
    assert_eq!(calls(), 3);
}

#[retryable(deadline = "2s", max_attempts = 3, idempotent = false, attempt = at, budget = "none",
            backoff = "constant", initial_backoff = "1ms")]
fn charge_unreconciled(ok_at: u32) -> Result<u32, E> {
    flaky(at, ok_at, || E::Reset)
}

#[retryable(deadline = "2s", max_attempts = 3, idempotent = false, attempt = at, budget = "none",
            backoff = "constant", initial_backoff = "1ms")]
fn charge_refused(ok_at: u32) -> Result<u32, E> {
    flaky(at, ok_at, || E::Refused)
}

#[test]
fn the_decision_table_holds() {
    reset();
    assert!(
        matches!(charge_unreconciled(2), Err(E::Reset)),
        "unknown: not repeated"
    );
    assert_eq!(calls(), 1);
    reset();
    assert_eq!(charge_refused(2).unwrap(), 2, "not executed: repeated");
    assert_eq!(calls(), 2);
}

static CHARGED: Mutex<Option<IdempotencyKey>> = Mutex::new(None);

#[allow(clippy::unnecessary_wraps)] // the shape `reconcile` takes
fn find(key: IdempotencyKey) -> Result<Option<u32>, E> {
    Ok((*CHARGED.lock().unwrap() == Some(key)).then_some(42))
}

#[retryable(deadline = "2s", max_attempts = 3, idempotent = false, attempt = at,
            reconcile = find)]
fn charge() -> Result<u32, E> {
    CALLS.with(|c| c.set(c.get() + 1));
    *CHARGED.lock().unwrap() = Some(at.idempotency_key());
    Err(E::Reset) // the reply is lost after the charge
}

#[test]
fn reconcile_finds_the_work_of_a_blocking_call() {
    reset();
    assert_eq!(charge().unwrap(), 42);
    assert_eq!(calls(), 1);
}

thread_local! {
    static STARTS: std::cell::RefCell<Vec<Instant>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[retryable(deadline = "300ms", max_attempts = 100, idempotent, attempt = at,
            backoff = "constant", initial_backoff = "100ms", budget = "none")]
fn slow_refused() -> Result<(), E> {
    CALLS.with(|c| c.set(c.get() + 1));
    STARTS.with(|s| s.borrow_mut().push(Instant::now()));
    let _ = at;
    Err(E::Refused)
}

#[test]
fn the_deadline_covers_attempts_and_pauses() {
    deadline_covers_attempts_and_pauses();
}

/// Inside a runtime whose clock is paused (a test), a blocking call still
/// keeps its deadline: it sleeps the thread, which the paused clock does
/// not see, so it reads the system clock. (It used to read the paused one,
/// where its pauses took no time: all 100 attempts were made.)
#[tokio::test(start_paused = true)]
async fn the_deadline_holds_inside_a_paused_runtime() {
    let paused_at = tokio::time::Instant::now();
    deadline_covers_attempts_and_pauses();
    assert_eq!(
        paused_at.elapsed(),
        Duration::ZERO,
        "the paused clock is left alone"
    );
}

fn deadline_covers_attempts_and_pauses() {
    reset();
    let t0 = Instant::now();
    let err = slow_refused().unwrap_err();
    let elapsed = t0.elapsed();
    // The pause that cannot fit ends the call before its deadline: a stop
    // that says so (not "deadline exceeded", nor the bare last error), the
    // last error its source.
    let E::Stopped(stop) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(stop.reason(), retries::Reason::PauseExceedsDeadline);
    let last = std::error::Error::source(stop).and_then(|e| e.downcast_ref::<E>());
    assert!(matches!(last, Some(E::Refused)), "{err:?}");
    // Attempts at about 0, 100 and 200 ms; a pause to 300 ms no longer fits.
    // Checked against the instants the attempts really started, so a thread
    // that oversleeps (a loaded machine) changes the count, not the verdict:
    // every pause is whole, and the call stops when the next pause plus
    // `min_attempt` (1 ms) would pass the deadline, without sleeping it.
    let starts = STARTS.with(std::cell::RefCell::take);
    assert_eq!(starts.len() as u32, calls());
    // The first pause (to about 100 ms) always fits; three on a quiet machine.
    assert!((2..=3).contains(&starts.len()), "{starts:?}");
    for w in starts.windows(2) {
        assert!(w[1] - w[0] >= Duration::from_millis(100), "{starts:?}");
    }
    let last = *starts.last().unwrap() - t0;
    assert!(
        last + Duration::from_millis(101) > Duration::from_millis(300),
        "another attempt would have fitted: {starts:?}"
    );
    assert!(
        elapsed < Duration::from_millis(300),
        "stopped without sleeping: {elapsed:?}"
    );
}

#[retryable(deadline = "2s", max_attempts = 3, idempotent, attempt = at, budget = "none",
            backoff = "constant", initial_backoff = "1ms")]
fn inner() -> Result<u32, E> {
    flaky(at, 99, || E::Refused)
}

#[retryable(
    deadline = "2s",
    max_attempts = 3,
    idempotent,
    budget = "none",
    backoff = "constant",
    initial_backoff = "1ms"
)]
fn outer() -> Result<u32, E> {
    inner()
}

#[test]
fn nested_blocking_calls_have_one_owner() {
    reset();
    assert!(outer().is_err());
    assert_eq!(calls(), 3, "3 outer attempts × 1 inner attempt, not 9");
}

static BUCKET: TokenBucket = TokenBucket::new(4, 0.1);

#[retryable(deadline = "2s", max_attempts = 3, idempotent, attempt = at, budget = BUCKET,
            backoff = "constant", initial_backoff = "1ms")]
fn budgeted() -> Result<u32, E> {
    flaky(at, 99, || E::Reset)
}

#[test]
fn a_shared_budget_stops_retries() {
    reset();
    assert!(budgeted().is_err());
    assert_eq!(calls(), 2, "4 → 3 → 2 tokens: the second retry is refused");
    assert!(budgeted().is_err());
    assert_eq!(calls(), 3);
}

static BREAKER: CircuitBreaker = CircuitBreaker::new(4, Duration::from_secs(30));

#[retryable(deadline = "2s", max_attempts = 3, idempotent, attempt = at, breaker = BREAKER,
            budget = "none", backoff = "constant", initial_backoff = "1ms")]
fn guarded() -> Result<u32, E> {
    flaky(at, 99, || E::Reset)
}

#[test]
fn the_breaker_sits_under_a_blocking_loop() {
    reset();
    assert!(matches!(guarded(), Err(E::Reset)));
    assert_eq!(calls(), 3);
    let err = guarded().unwrap_err(); // one attempt opens it (4 failures), then refused
    assert!(
        matches!(&err, E::Stopped(s) if s.reason() == Reason::CircuitOpen),
        "{err:?}"
    );
    assert_eq!(calls(), 4);
}

#[allow(clippy::unnecessary_wraps, clippy::needless_pass_by_value)] // the shape `recover` takes
fn zero<T: Default>(f: Failure<E>) -> Result<T, E> {
    assert_eq!(f.reason(), Reason::Permanent);
    Ok(T::default())
}

#[retryable(deadline = "1s", idempotent, recover = zero)]
fn invalid() -> Result<u64, E> {
    Err(E::Invalid)
}

#[test]
fn recover_serves_a_blocking_fn() {
    assert_eq!(invalid().unwrap(), 0);
}

#[test]
fn the_builder_has_a_blocking_form() {
    let policy = Policy::new(Duration::from_secs(1))
        .with_backoff(Backoff::constant(Duration::from_millis(1)));
    let charged = Mutex::new(None);
    let r = call(&policy)
        .not_idempotent()
        .reconcile_blocking(|key| {
            Ok::<_, E>((*charged.lock().unwrap() == Some(key)).then_some("receipt"))
        })
        .run_blocking(|at: &Attempt| {
            *charged.lock().unwrap() = Some(at.idempotency_key());
            Err(E::Reset)
        });
    assert_eq!(r.unwrap(), "receipt");
    let v = call(&policy)
        .idempotent()
        .classify(|e: &E| match e {
            E::Invalid => Verdict::not_executed(),
            other => other.classify(),
        })
        .outcome_blocking(|at: &Attempt| {
            if at.number() < 2 {
                Err(E::Invalid)
            } else {
                Ok(at.number())
            }
        });
    assert_eq!(v.unwrap(), 2);
}
