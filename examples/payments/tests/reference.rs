//! SPEC §13's reference table against a real tonic server on loopback: every
//! expected cell asserted. No row charges more than once, and the rows where
//! the work was done report success. Real time: about 3 s in all.

use std::time::Duration;

use retries_payments::run_row;

async fn row(i: usize, result: &str, attempts: u32, charges: usize) -> Duration {
    let r = run_row(i).await;
    assert!(
        r.result.starts_with(result),
        "row {}: {r:?}, expected {result}",
        i + 1
    );
    assert_eq!(
        (r.attempts, r.charges),
        (attempts, charges),
        "row {}: {r:?}",
        i + 1
    );
    r.elapsed
}

#[tokio::test]
async fn row1_unavailable_before_the_handler_then_ok() {
    row(0, "OK", 2, 1).await;
}

#[tokio::test]
async fn row2_internal_after_the_charge_default() {
    row(1, "Internal", 1, 1).await;
}

#[tokio::test]
async fn row3_internal_marked_transient_is_reconciled() {
    row(2, "OK", 1, 1).await;
}

#[tokio::test]
async fn row4_unavailable_after_the_charge_is_reconciled() {
    row(3, "OK", 1, 1).await;
}

#[tokio::test]
async fn row5_unavailable_after_the_charge_without_reconcile() {
    row(4, "Unavailable", 1, 1).await;
}

#[tokio::test]
async fn row6_slow_unavailable_stops_at_the_deadline() {
    let elapsed = row(5, "DeadlineExceeded", 2, 0).await;
    assert!(
        elapsed >= Duration::from_millis(1990) && elapsed < Duration::from_millis(2300),
        "{elapsed:?}"
    );
}

#[tokio::test]
async fn row7_threshold_not_above_attempts_is_reported_at_first_use() {
    // Threshold 2 under 3 attempts: reported, and the one call opens its own
    // breaker: the third attempt is refused without reaching the server.
    row(6, "Unavailable (rejected at first use", 2, 0).await;
}

#[tokio::test]
async fn row8_breaker_threshold_five_first_attempt_fails() {
    row(7, "OK", 2, 1).await;
}
