//! Retrying on `Ok` values (`retry_if`): a value the classifier rejects is a
//! failed attempt under the same decision table, with its hint as the pause;
//! when the call stops, the last value is the answer. Through the attribute,
//! the builder, the blocking door and the tower layer, on the paused clock.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use retries::{
    Attempt, Backoff, Classify, IdempotencyKey, Policy, Reason, RetryEvent, Verdict, retryable,
};
use tokio::time::Instant;

// `call(&policy)`: `retries::call` under this file's own name.
crate::common::named_call!();

#[derive(Debug, thiserror::Error, Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    #[classify(permanent)]
    Stopped(#[from] retries::Stopped),
}

/// What a job-status endpoint answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Job {
    Pending { retry_in: Duration },
    Done(u32),
    Failed,
}

fn not_ready(job: &Job) -> Option<Verdict> {
    match job {
        Job::Pending { retry_in } => Some(Verdict::not_executed().with_retry_after(*retry_in)),
        Job::Done(_) | Job::Failed => None,
    }
}

#[retryable(deadline = "10s", max_attempts = 5, idempotent, attempt = at, budget = "none",
            retry_if = not_ready)]
async fn poll(polls: &AtomicU32, ready_at: u32) -> Result<Job, E> {
    polls.fetch_add(1, Ordering::SeqCst);
    Ok(if at.number() < ready_at {
        Job::Pending {
            retry_in: Duration::from_millis(300),
        }
    } else {
        Job::Done(at.number())
    })
}

#[tokio::test(start_paused = true)]
async fn a_pending_value_is_polled_again_after_its_hint() {
    let polls = AtomicU32::new(0);
    let t0 = Instant::now();
    assert_eq!(poll(&polls, 3).await.unwrap(), Job::Done(3));
    assert_eq!(polls.load(Ordering::SeqCst), 3);
    assert_eq!(
        t0.elapsed(),
        Duration::from_millis(600),
        "two pauses of the hinted 300 ms"
    );
}

#[tokio::test(start_paused = true)]
async fn when_attempts_run_out_the_last_value_is_the_answer() {
    let polls = AtomicU32::new(0);
    let job = poll(&polls, 99).await.unwrap();
    assert_eq!(
        job,
        Job::Pending {
            retry_in: Duration::from_millis(300)
        }
    );
    assert_eq!(polls.load(Ordering::SeqCst), 5);
}

#[tokio::test(start_paused = true)]
async fn when_the_deadline_stops_the_call_the_last_value_is_the_answer() {
    let policy = Policy::new(Duration::from_millis(500)).with_max_attempts(10);
    let mut n = 0;
    let t0 = Instant::now();
    let job = call(&policy)
        .idempotent()
        .retry_if(not_ready)
        .run(async |_: &Attempt| {
            n += 1;
            Ok::<_, E>(Job::Pending {
                retry_in: Duration::from_millis(200),
            })
        })
        .await
        .unwrap();
    assert!(matches!(job, Job::Pending { .. }));
    // Attempts at 0, 200, 400 ms; a pause to 600 ms does not fit.
    assert_eq!((n, t0.elapsed()), (3, Duration::from_millis(400)));
}

#[tokio::test(start_paused = true)]
async fn a_value_judged_permanent_ends_the_call_at_once() {
    let policy = Policy::new(Duration::from_secs(1));
    let mut n = 0;
    let job = call(&policy)
        .idempotent()
        .retry_if(|j: &Job| (*j == Job::Failed).then(Verdict::permanent))
        .outcome(async |_: &Attempt| {
            n += 1;
            Ok::<_, E>(Job::Failed)
        })
        .await;
    assert_eq!(job.unwrap(), Job::Failed);
    assert_eq!(n, 1);
}

#[tokio::test(start_paused = true)]
async fn an_unknown_value_of_a_non_idempotent_call_is_reconciled() {
    let policy = Policy::new(Duration::from_secs(1))
        .with_backoff(Backoff::constant(Duration::from_millis(10)));
    let created = std::sync::Mutex::new(None::<IdempotencyKey>);
    // The server answers "accepted, status unknown" (a value) after creating.
    let mut n = 0;
    let r = call(&policy)
        .not_idempotent()
        .retry_if(|code: &u16| (*code == 202).then(Verdict::unknown))
        .reconcile(async |key| Ok::<_, E>((*created.lock().unwrap() == Some(key)).then_some(201)))
        .run(async |at: &Attempt| {
            n += 1;
            *created.lock().unwrap() = Some(at.idempotency_key());
            Ok::<u16, E>(202)
        })
        .await;
    assert_eq!(r.unwrap(), 201, "found by its key, not created again");
    assert_eq!(n, 1);
    // Without reconcile, the unknown value is not repeated and is the answer.
    let mut n = 0;
    let r = call(&policy)
        .not_idempotent()
        .retry_if(|code: &u16| (*code == 202).then(Verdict::unknown))
        .run(async |_: &Attempt| {
            n += 1;
            Ok::<u16, E>(202)
        })
        .await;
    assert_eq!((r.unwrap(), n), (202, 1));
}

#[tokio::test(start_paused = true)]
async fn errors_and_values_mix_and_the_hook_sees_no_error_for_a_value() {
    let policy = Policy::new(Duration::from_secs(1))
        .with_max_attempts(4)
        .with_backoff(Backoff::constant(Duration::from_millis(10)));
    let mut seen = Vec::new();
    let r = call(&policy)
        .idempotent()
        .retry_if(|v: &u32| (*v == 0).then(Verdict::not_executed))
        .on_retry(|e: &RetryEvent<'_, E>| seen.push((e.attempt(), e.error().is_some())))
        .run(async |at: &Attempt| match at.number() {
            1 => Err(E::Refused),
            2 => Ok(0),
            _ => Ok(7),
        })
        .await;
    assert_eq!(r.unwrap(), 7);
    assert_eq!(seen, [(1, true), (2, false)]);
}

#[test]
fn the_blocking_door_retries_on_values_too() {
    let policy = Policy::new(Duration::from_secs(1))
        .with_backoff(Backoff::constant(Duration::from_millis(1)));
    let r = call(&policy)
        .idempotent()
        .retry_if(|v: &Option<u32>| v.is_none().then(Verdict::not_executed))
        .outcome_blocking(|at: &Attempt| Ok::<_, E>((at.number() == 3).then_some(3)));
    assert_eq!(r.unwrap(), Some(3));
    let stopped = call(&policy)
        .idempotent()
        .retry_if(|v: &Option<u32>| v.is_none().then(Verdict::not_executed))
        .outcome_blocking(|_: &Attempt| Err::<Option<u32>, _>(E::Refused))
        .unwrap_err();
    assert_eq!(stopped.reason(), Reason::Exhausted);
}

#[tokio::test(start_paused = true)]
async fn the_layer_takes_its_own_rule_for_responses() {
    use tower::{Service, ServiceExt};
    type Body = http_body_util::Empty<bytes::Bytes>;
    let count = std::sync::Arc::new(AtomicU32::new(0));
    let c = count.clone();
    let inner = tower::service_fn(move |_r: http::Request<retries_tower::ReplayBody<Body>>| {
        let n = c.fetch_add(1, Ordering::SeqCst);
        async move {
            let status = if n < 2 { 409 } else { 200 };
            Ok::<_, std::convert::Infallible>(
                http::Response::builder().status(status).body(()).unwrap(),
            )
        }
    });
    let policy = Policy::new(Duration::from_secs(1))
        .with_backoff(Backoff::constant(Duration::from_millis(50)));
    let mut svc = retries_tower::RetryLayer::new(policy)
        .retry_if(|status, _| (status == http::StatusCode::CONFLICT).then(Verdict::not_executed))
        .layer(inner);
    let t0 = Instant::now();
    let request = http::Request::builder()
        .method("POST")
        .uri("http://x/")
        .body(Body::new())
        .unwrap();
    let response = svc.ready().await.unwrap().call(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(count.load(Ordering::SeqCst), 3);
    assert_eq!(t0.elapsed(), Duration::from_millis(100));
}
