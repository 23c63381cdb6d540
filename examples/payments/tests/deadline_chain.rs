//! A deadline across two services: client → A → B, real tonic servers on
//! loopback. A's handler retries its calls to B; under `DeadlineLayer`, B sees
//! the time A's caller has left, and A's retries stop when it runs out (not at
//! A's own 10 s deadline). Real time: about 2.5 s.

use std::time::{Duration, Instant};

use retries::Policy;
use retries_payments::{Client, Fault, Ledger, serve, serve_relay};
use tonic::Code;

const ONE_SECOND: Policy = Policy::new(Duration::from_secs(1))
    .with_max_attempts(1)
    .validated();

#[tokio::test]
async fn the_downstream_handler_sees_the_callers_remaining_deadline() {
    let b = serve(Ledger::with_faults(&[])).await;
    let (a, _relay) = serve_relay(b).await;
    let receipt = Client::new(a)
        .charge_within(&ONE_SECOND, 500)
        .await
        .unwrap();
    // B's scope came from A's request, which carried what A's caller had left
    // (1 s less two loopback hops; generous for a loaded CI machine).
    assert!(
        (500..=1000).contains(&receipt.server_budget_ms),
        "B saw {} ms",
        receipt.server_budget_ms
    );
}

#[tokio::test]
async fn retries_in_the_middle_stop_when_the_callers_deadline_runs_out() {
    let ledger = Ledger::with_faults(&[Fault::UnavailableBefore; 100]);
    let b = serve(ledger.clone()).await;
    let (a, relay) = serve_relay(b).await;
    let t0 = Instant::now();
    let err = Client::new(a)
        .charge_within(&ONE_SECOND, 500)
        .await
        .unwrap_err();
    let elapsed = t0.elapsed();
    // A stops when its next pause no longer fits in the caller's time (the
    // last status it got, UNAVAILABLE, with A6's "do not retry": A retried
    // already), or the deadline cuts it off first.
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled)
            || (err.code() == Code::Unavailable
                && err
                    .metadata()
                    .get("grpc-retry-pushback-ms")
                    .is_some_and(|v| v == "-1")),
        "{err:?}"
    );
    assert!(elapsed < Duration::from_millis(1300), "{elapsed:?}");
    // A retried every 100 ms within the caller's second: about 10 attempts
    // (fewer on a loaded machine), far from its own 50, and none after the
    // caller gave up.
    let attempts = relay.attempts();
    assert!((3..=11).contains(&attempts), "A made {attempts} attempts");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        relay.attempts(),
        attempts,
        "A kept retrying after the deadline"
    );
    assert_eq!(ledger.charge_calls(), attempts);
}
