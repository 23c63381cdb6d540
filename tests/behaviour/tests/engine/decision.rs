//! Every row of the decision table (SPEC §3) through `retries::call`, on the
//! paused clock.

use crate::common;

use common::{Service, Step, SvcError, ms};
use retries::{Attempt, Backoff, Failure, Policy, Reason};
use tokio::time::Instant;

// `call(&policy)`: `retries::call` under this file's own name.
crate::common::named_call!();

const POLICY: Policy = Policy::new(std::time::Duration::from_secs(2))
    .with_max_attempts(3)
    .with_backoff(Backoff::constant(std::time::Duration::from_millis(10)))
    .validated();

async fn idempotent(svc: &Service) -> Result<u32, Failure<SvcError>> {
    call(&POLICY)
        .idempotent()
        .outcome(async |at: &Attempt| svc.call(at.number(), at.idempotency_key()).await)
        .await
}

async fn not_idempotent(svc: &Service) -> Result<u32, Failure<SvcError>> {
    call(&POLICY)
        .not_idempotent()
        .outcome(async |at: &Attempt| svc.call(at.number(), at.idempotency_key()).await)
        .await
}

async fn reconciled(svc: &Service) -> Result<u32, Failure<SvcError>> {
    call(&POLICY)
        .not_idempotent()
        .reconcile(async |key| svc.lookup(key).await)
        .outcome(async |at: &Attempt| svc.call(at.number(), at.idempotency_key()).await)
        .await
}

#[tokio::test(start_paused = true)]
async fn permanent_stops_whatever_the_declaration() {
    for run in 0..3 {
        let svc = Service::new(&[Step::FailPermanent]);
        let f = match run {
            0 => idempotent(&svc).await,
            1 => not_idempotent(&svc).await,
            _ => reconciled(&svc).await,
        }
        .unwrap_err();
        assert_eq!(f.reason(), Reason::Permanent);
        assert!(matches!(f.last_error(), Some(SvcError::Permanent)));
        assert_eq!((svc.attempts(), f.attempts()), (1, 1));
    }
}

#[tokio::test(start_paused = true)]
async fn not_executed_is_retried_whatever_the_declaration() {
    for run in 0..3 {
        let svc = Service::new(&[Step::FailBefore, Step::FailBefore]);
        let t0 = Instant::now();
        let v = match run {
            0 => idempotent(&svc).await,
            1 => not_idempotent(&svc).await,
            _ => reconciled(&svc).await,
        };
        assert_eq!(v.unwrap(), 7);
        assert_eq!(svc.starts(t0), [ms(0), ms(10), ms(20)]);
        assert_eq!(svc.effects(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn not_executed_every_time_exhausts_the_attempts() {
    let svc = Service::new(&[Step::FailBefore; 5]);
    let f = not_idempotent(&svc).await.unwrap_err();
    assert_eq!(f.reason(), Reason::Exhausted);
    assert_eq!((svc.attempts(), f.attempts()), (3, 3));
    assert!(matches!(f.into_error(), SvcError::NotExecuted(None)));
}

#[tokio::test(start_paused = true)]
async fn unknown_is_retried_when_idempotent() {
    let svc = Service::new(&[Step::FailAfter, Step::FailAfter]);
    assert_eq!(idempotent(&svc).await.unwrap(), 7);
    assert_eq!(svc.attempts(), 3);
    // Idempotent: repeating was declared harmless, and the key was the same.
    assert_eq!((svc.effects(), svc.distinct_effects()), (3, 1));
}

#[tokio::test(start_paused = true)]
async fn unknown_not_idempotent_without_reconcile_stops() {
    let svc = Service::new(&[Step::FailAfter]);
    let f = not_idempotent(&svc).await.unwrap_err();
    assert_eq!(f.reason(), Reason::UnknownOutcome);
    assert_eq!((svc.attempts(), svc.effects()), (1, 1));
    // The default mapping returns the error itself for an unknown outcome.
    assert!(matches!(f.into_error(), SvcError::Unknown));
}

#[tokio::test(start_paused = true)]
async fn unknown_reconciled_and_found_returns_the_done_work() {
    let svc = Service::new(&[Step::FailAfter]);
    let t0 = Instant::now();
    assert_eq!(reconciled(&svc).await.unwrap(), 7);
    assert_eq!((svc.attempts(), svc.effects()), (1, 1));
    assert_eq!(t0.elapsed(), ms(0), "found at once: no pause");
}

#[tokio::test(start_paused = true)]
async fn unknown_reconciled_and_not_found_is_retried_as_not_executed() {
    // A failure that looks unknown (connection lost) but the work was not done.
    let svc = Service::new(&[Step::After(ms(5), &Step::FailBefore)]);
    let unknown_but_not_done =
        async |at: &Attempt| match svc.call(at.number(), at.idempotency_key()).await {
            Err(SvcError::NotExecuted(_)) => Err(SvcError::Unknown),
            other => other,
        };
    let lookups = std::cell::Cell::new(0);
    let t0 = Instant::now();
    let v = call(&POLICY)
        .not_idempotent()
        .reconcile(|key| {
            lookups.set(lookups.get() + 1);
            svc.lookup(key)
        })
        .outcome(unknown_but_not_done)
        .await;
    assert_eq!(v.unwrap(), 7);
    assert_eq!(lookups.get(), 1);
    assert_eq!(svc.starts(t0), [ms(0), ms(15)]);
    assert_eq!(svc.effects(), 1);
}

#[tokio::test(start_paused = true)]
async fn unknown_reconcile_error_stops_with_unknown_outcome() {
    let svc = Service::new(&[Step::FailAfter]);
    let f = call(&POLICY)
        .not_idempotent()
        .reconcile(async |_key| Err::<Option<u32>, _>(SvcError::Lookup))
        .outcome(async |at: &Attempt| svc.call(at.number(), at.idempotency_key()).await)
        .await
        .unwrap_err();
    assert_eq!(f.reason(), Reason::UnknownOutcome);
    assert!(matches!(f.last_error(), Some(SvcError::Unknown)));
    assert!(matches!(f.reconcile_error(), Some(SvcError::Lookup)));
    assert_eq!((svc.attempts(), svc.effects()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn reconcile_runs_after_the_last_attempt_too() {
    let one = POLICY.with_max_attempts(1);
    let svc = Service::new(&[Step::FailAfter]);
    let v = call(&one)
        .not_idempotent()
        .reconcile(async |key| svc.lookup(key).await)
        .outcome(async |at: &Attempt| svc.call(at.number(), at.idempotency_key()).await)
        .await;
    assert_eq!(v.unwrap(), 7);
    // Not found on the last attempt: exhausted, not retried.
    let svc = Service::new(&[Step::FailBefore]);
    let f = call(&one)
        .not_idempotent()
        .reconcile(async |key| svc.lookup(key).await)
        .outcome(async |_: &Attempt| Err::<u32, _>(SvcError::Unknown))
        .await
        .unwrap_err();
    assert_eq!(f.reason(), Reason::Exhausted);
}

#[tokio::test(start_paused = true)]
async fn reconcile_is_bounded_by_the_deadline() {
    let svc = Service::new(&[Step::After(ms(1500), &Step::FailAfter)]);
    let t0 = Instant::now();
    let f = call(&POLICY)
        .not_idempotent()
        .reconcile(async |_key| {
            tokio::time::sleep(ms(10_000)).await;
            Ok::<Option<u32>, SvcError>(None)
        })
        .outcome(async |at: &Attempt| svc.call(at.number(), at.idempotency_key()).await)
        .await
        .unwrap_err();
    assert_eq!(f.reason(), Reason::DeadlineExceeded);
    assert_eq!(t0.elapsed(), ms(2000));
    assert_eq!(svc.attempts(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_key_is_the_same_on_every_attempt_and_new_per_call() {
    let mut keys = Vec::new();
    for _ in 0..2 {
        let _ = call(&POLICY)
            .idempotent()
            .outcome(async |at: &Attempt| {
                keys.push(at.idempotency_key());
                Err::<(), _>(SvcError::NotExecuted(None))
            })
            .await;
    }
    assert_eq!(keys.len(), 6);
    assert!(keys[..3].iter().all(|k| *k == keys[0]));
    assert!(keys[3..].iter().all(|k| *k == keys[3]));
    assert_ne!(keys[0], keys[3]);
    assert_eq!(keys[0].to_string().len(), 32);
}

#[tokio::test(start_paused = true)]
async fn a_classify_override_replaces_the_trait() {
    let svc = Service::new(&[Step::FailPermanent, Step::FailPermanent]);
    let v = call(&POLICY)
        .idempotent()
        .classify(|_: &SvcError| retries::Verdict::not_executed())
        .outcome(async |at: &Attempt| svc.call(at.number(), at.idempotency_key()).await)
        .await;
    assert_eq!(v.unwrap(), 7);
    assert_eq!(svc.attempts(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_server_refusal_is_not_retried() {
    let mut n = 0;
    let f = call(&POLICY)
        .idempotent()
        .classify(|_: &SvcError| retries::Verdict::server_refused())
        .outcome(async |_: &Attempt| {
            n += 1;
            Err::<(), _>(SvcError::NotExecuted(None))
        })
        .await
        .unwrap_err();
    assert_eq!((f.reason(), n), (Reason::Permanent, 1));
}
