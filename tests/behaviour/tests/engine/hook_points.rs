//! The hook points where budgets and breakers plug in: a custom `Budget` and a
//! custom `Breaker` through the public traits, observed call by call.

use crate::common;

use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

use common::{Service, Step, ms};
use retries::{Attempt, Backoff, Breaker, Budget, Permit, Policy, Reason};

// `call(&policy)`: `retries::call` under this file's own name.
crate::common::named_call!();

const POLICY: Policy = Policy::new(std::time::Duration::from_secs(5))
    .with_max_attempts(5)
    .with_backoff(Backoff::constant(std::time::Duration::from_millis(10)))
    .validated();

/// Allows a fixed number of retries in all, and counts what it is told.
struct Tickets {
    left: AtomicI32,
    calls: AtomicU32,
    successes: AtomicU32,
    failures: AtomicU32,
}

impl Budget for Tickets {
    fn on_call(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
    fn on_success(&self) {
        self.successes.fetch_add(1, Ordering::SeqCst);
    }
    fn on_transient_failure(&self) {
        self.failures.fetch_add(1, Ordering::SeqCst);
    }
    fn try_retry(&self) -> bool {
        self.left.fetch_sub(1, Ordering::SeqCst) > 0
    }
}

static TICKETS: Tickets = Tickets {
    left: AtomicI32::new(2),
    calls: AtomicU32::new(0),
    successes: AtomicU32::new(0),
    failures: AtomicU32::new(0),
};

#[tokio::test(start_paused = true)]
async fn a_budget_is_told_everything_and_refuses_only_retries() {
    let svc = Service::new(&[Step::FailBefore; 10]);
    let f = call(&POLICY)
        .idempotent()
        .budget(&TICKETS)
        .outcome(async |at: &Attempt| svc.call(at.number(), at.idempotency_key()).await)
        .await
        .unwrap_err();
    // Two retries granted, the third refused: 3 attempts, stopped by the budget.
    assert_eq!((f.reason(), f.attempts()), (Reason::BudgetExhausted, 3));
    assert_eq!(TICKETS.calls.load(Ordering::SeqCst), 1);
    assert_eq!(TICKETS.failures.load(Ordering::SeqCst), 3);
    // The budget is empty, yet a first attempt is never refused.
    let svc = Service::new(&[]);
    let v = call(&POLICY)
        .idempotent()
        .budget(&TICKETS)
        .outcome(async |at: &Attempt| svc.call(at.number(), at.idempotency_key()).await)
        .await;
    assert_eq!(v.unwrap(), 7);
    assert_eq!(TICKETS.successes.load(Ordering::SeqCst), 1);
}

/// Admits a fixed number of attempts, then refuses; records what it is told.
struct Gate {
    admits: AtomicI32,
    log: std::sync::Mutex<Vec<&'static str>>,
}

impl Breaker for Gate {
    fn admit(&self) -> Option<Permit> {
        (self.admits.fetch_sub(1, Ordering::SeqCst) > 0).then_some(Permit::NORMAL)
    }
    fn on_success(&self, _: Permit) {
        self.log.lock().unwrap().push("success");
    }
    fn on_transient_failure(&self, _: Permit) {
        self.log.lock().unwrap().push("transient");
    }
    fn on_neutral(&self, _: Permit) {
        self.log.lock().unwrap().push("neutral");
    }
}

static GATE: Gate = Gate {
    admits: AtomicI32::new(3),
    log: std::sync::Mutex::new(Vec::new()),
};

#[tokio::test(start_paused = true)]
async fn a_breaker_sees_every_attempt_and_can_refuse_one() {
    let svc = Service::new(&[Step::FailBefore, Step::FailPermanent]);
    let f = call(&POLICY)
        .idempotent()
        .breaker(&GATE)
        .outcome(async |at: &Attempt| svc.call(at.number(), at.idempotency_key()).await)
        .await
        .unwrap_err();
    assert_eq!(f.reason(), Reason::Permanent);
    // Then an attempt that is dropped mid-flight gives its admission back as neutral.
    let svc = Service::new(&[Step::Hang]);
    let hanging = call(&POLICY)
        .idempotent()
        .breaker(&GATE)
        .outcome(async |at: &Attempt| svc.call(at.number(), at.idempotency_key()).await);
    assert!(tokio::time::timeout(ms(50), hanging).await.is_err());
    // The gate is now closed: the body is not called and the call stops at once.
    let svc = Service::new(&[]);
    let f = call(&POLICY)
        .idempotent()
        .breaker(&GATE)
        .outcome(async |at: &Attempt| svc.call(at.number(), at.idempotency_key()).await)
        .await
        .unwrap_err();
    assert_eq!(
        (f.reason(), f.attempts(), svc.attempts()),
        (Reason::CircuitOpen, 0, 0)
    );
    assert_eq!(
        *GATE.log.lock().unwrap(),
        ["transient", "neutral", "neutral"]
    );
    // Without recover, an open circuit maps to `E::from(Stopped)`.
    assert!(
        matches!(f.into_error(), common::SvcError::Stopped(s) if s.reason() == Reason::CircuitOpen)
    );
}
