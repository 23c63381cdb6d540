//! `retries::testing` drives the loop, the budget, the breaker and the deadline
//! on one paused clock, with exact schedules.

use std::time::Duration;

use retries::testing::{ScriptError, Scripted, Step};
use retries::{
    Attempt, Backoff, BreakerState, CircuitBreaker, Failure, Policy, Reason, TokenBucket,
};

// `call(&policy)`: `retries::call` under this file's own name.
crate::common::named_call!();

const POLICY: Policy = Policy::new(Duration::from_secs(1))
    .with_max_attempts(4)
    .with_backoff(Backoff::constant(Duration::from_millis(100)))
    .validated();

static BUDGET: TokenBucket = TokenBucket::new(4, 0.1);
static BREAKER: CircuitBreaker = CircuitBreaker::new(5, Duration::from_secs(10));

async fn guarded(op: &Scripted) -> Result<u32, Failure<ScriptError>> {
    call(&POLICY)
        .idempotent()
        .budget(&BUDGET)
        .breaker(&BREAKER)
        .outcome(async |at: &Attempt| op.call(at).await)
        .await
}

#[tokio::test(start_paused = true)]
async fn loop_budget_breaker_and_deadline_on_one_clock() {
    // Budget 4 tokens: retries while more than 2 remain.
    let op = Scripted::new([Step::fail_before_effect(); 4]);
    assert_eq!(
        guarded(&op).await.unwrap_err().reason(),
        Reason::BudgetExhausted
    );
    op.assert_schedule(&[0, 100]);
    assert_eq!(BUDGET.tokens_milli(), 2_000);

    // A slow failure: the budget refuses at once, nothing sleeps.
    let op = Scripted::new([Step::fail_before_effect().after(Duration::from_millis(50))]);
    let t0 = tokio::time::Instant::now();
    assert_eq!(
        guarded(&op).await.unwrap_err().reason(),
        Reason::BudgetExhausted
    );
    assert_eq!(t0.elapsed(), Duration::from_millis(50));

    // Pushback longer than the deadline: stopped at once, by the pause.
    let op = Scripted::new([Step::pushback(Duration::from_secs(5))]);
    assert_eq!(
        guarded(&op).await.unwrap_err().reason(),
        Reason::PauseExceedsDeadline
    );
    op.assert_schedule(&[0]);

    // Four transient failures so far; the fifth opens the breaker.
    assert_eq!(BREAKER.state(), BreakerState::Closed { failures: 4 });
    let op = Scripted::new([Step::fail_after_effect()]);
    let _ = guarded(&op).await;
    assert_eq!(BREAKER.state(), BreakerState::Open);
    let op = Scripted::new([Step::succeed()]);
    let f = guarded(&op).await.unwrap_err();
    assert_eq!((f.reason(), op.attempts()), (Reason::CircuitOpen, 0));

    // After `open_for`, a probe succeeds and closes it; successes refill the budget.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let op = Scripted::new([Step::succeed()]);
    assert_eq!(guarded(&op).await.unwrap(), 1);
    assert_eq!(BREAKER.state(), BreakerState::Closed { failures: 0 });
    assert_eq!(op.effects(), 1);
}

#[tokio::test(start_paused = true)]
async fn reconcile_with_the_scripted_lookup_does_the_work_once() {
    let op = Scripted::new([Step::fail_after_effect()]);
    let v = call(&POLICY)
        .not_idempotent()
        .reconcile(|key| op.lookup(key))
        .outcome(async |at: &Attempt| op.call(at).await)
        .await;
    assert_eq!(v.unwrap(), 1);
    assert_eq!((op.attempts(), op.effects()), (1, 1));
}

#[test]
#[should_panic(
    expected = "attempt schedule (ms from the first attempt): expected [0, 50], got [0, 100]"
)]
fn a_wrong_schedule_fails_with_both_schedules() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let op = Scripted::new([Step::fail_before_effect()]);
    rt.block_on(async {
        let _ = call(&POLICY)
            .idempotent()
            .outcome(async |at: &Attempt| op.call(at).await)
            .await;
    });
    op.assert_schedule(&[0, 50]);
}
