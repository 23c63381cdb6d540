//! What the client learns from the transport and the server: a refused
//! connection is "not executed" (so even a charge is retried), pushback sets
//! the pause or stops the call, and retries say how many attempts came before.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use retries_payments::{Client, Fault, Ledger, serve};
use tonic::Code;

#[tokio::test]
async fn a_refused_connection_is_retried_even_for_a_charge() {
    let dead: SocketAddr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let client = Client::new(dead);
    let err = client.charge_unreconciled(100).await.unwrap_err();
    // Not idempotent and no reconcile, yet retried: nothing was ever sent.
    assert_eq!(client.attempts(), 3, "{err:?}");
    assert_eq!(err.code(), Code::Unavailable);
}

#[tokio::test]
async fn retries_carry_the_count_of_previous_attempts() {
    let ledger = Ledger::with_faults(&[Fault::UnavailableBefore, Fault::UnavailableBefore]);
    let client = Client::new(serve(ledger.clone()).await);
    client.charge(100).await.unwrap();
    assert_eq!(
        ledger.previous_attempts(),
        [None, Some("1".to_string()), Some("2".to_string())]
    );
}

#[tokio::test]
async fn pushback_sets_the_pause_or_stops_the_call() {
    // A valid pushback: the pause is the server's 300 ms, not the 100 ms backoff.
    let ledger = Ledger::with_faults(&[Fault::Pushback("300")]);
    let client = Client::new(serve(ledger.clone()).await);
    let t0 = Instant::now();
    client.charge(100).await.unwrap();
    let elapsed = t0.elapsed();
    assert_eq!(client.attempts(), 2);
    assert!(
        elapsed >= Duration::from_millis(300) && elapsed < Duration::from_millis(900),
        "{elapsed:?}"
    );

    // A negative pushback: "do not retry".
    let ledger = Ledger::with_faults(&[Fault::Pushback("-1")]);
    let client = Client::new(serve(ledger.clone()).await);
    let err = client.charge(100).await.unwrap_err();
    assert_eq!(
        (err.code(), client.attempts()),
        (Code::ResourceExhausted, 1)
    );
}
