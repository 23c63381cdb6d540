//! The server half of exactly-once over gRPC: the payments service behind
//! `retries_tower::dedup::IdempotencyLayer::grpc()` (the key in the
//! `idempotency-key` metadata) and `FaultLayer` dropping replies after the
//! charge; the client's layer in gRPC mode, `idempotent_by_key`. Real
//! tonic on loopback.

use std::time::Duration;

use retries::{Backoff, Policy};
use retries_chaos::{Chaos, Fault, Rule};
use retries_payments::pb::ChargeRequest;
use retries_payments::pb::payments_client::PaymentsClient;
use retries_payments::{Ledger, serve_deduplicated};
use retries_tower::RetryLayer;
use tonic::Code;
use tonic::transport::Channel;

fn channel(addr: std::net::SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy()
}

fn policy() -> Policy {
    Policy::new(Duration::from_secs(10))
        .with_max_attempts(8)
        .with_backoff(Backoff::constant(Duration::from_millis(5)))
}

fn charge(cents: u64) -> ChargeRequest {
    ChargeRequest {
        // The layer's key goes in the metadata; the message's is unused.
        idempotency_key: String::new(),
        cents,
    }
}

#[tokio::test]
async fn over_grpc_each_key_charges_once_and_a_lost_reply_is_replayed() {
    let chaos = Chaos::builder()
        .seed(4747)
        .rule(Rule::new(Fault::DropReply).rate(0.3))
        .build()
        .unwrap();
    let ledger = Ledger::with_faults(&[]);
    let addr = serve_deduplicated(ledger.clone(), chaos.clone(), Duration::from_secs(5)).await;
    let layer = RetryLayer::grpc(policy())
        .budget(retries::NoBudget)
        .idempotent_by_key(http::HeaderName::from_static("idempotency-key"));
    let mut client = PaymentsClient::new(layer.layer(channel(addr)));
    // The service proves it deduplicates by its first answer (the mark
    // `retries-deduplicated` in the response metadata); until then a lost
    // reply ends unknown instead of being sent again.
    let mut proving: u32 = 0;
    loop {
        proving += 1;
        if client
            .charge(charge(1000 + u64::from(proving)))
            .await
            .is_ok()
        {
            break;
        }
    }
    for cents in 0..60 {
        let receipt = client.charge(charge(cents)).await.unwrap().into_inner();
        assert_eq!(receipt.cents, cents);
    }
    let dropped = chaos.report().observed(retries_chaos::FaultKind::DropReply);
    assert!(dropped >= 5, "{dropped} replies dropped");
    // Every lost reply was sent again; none charged twice.
    assert_eq!(ledger.charges(), 60 + usize::try_from(proving).unwrap());
    assert_eq!(ledger.charge_calls(), 60 + proving);
}

#[tokio::test]
async fn over_grpc_a_refusal_is_released_and_a_reused_key_is_failed_precondition() {
    use retries_payments::Fault as LedgerFault;
    let chaos = Chaos::builder().build().unwrap();
    let ledger = Ledger::with_faults(&[LedgerFault::UnavailableBefore]);
    let addr = serve_deduplicated(ledger.clone(), chaos, Duration::from_secs(5)).await;
    // One key, sent by hand twice: the handler's UNAVAILABLE (before the
    // charge) released the key, so the second request runs.
    let mut raw = PaymentsClient::new(channel(addr));
    let keyed = || {
        let mut request = tonic::Request::new(charge(7));
        request
            .metadata_mut()
            .insert("idempotency-key", "\"by-hand\"".parse().unwrap());
        request
    };
    let first = raw.charge(keyed()).await.unwrap_err();
    assert_eq!(first.code(), Code::Unavailable);
    raw.charge(keyed()).await.unwrap();
    // The third is the record, marked.
    let replay = raw.charge(keyed()).await.unwrap();
    assert_eq!(
        replay.metadata().get("idempotent-replayed").unwrap(),
        "true"
    );
    assert_eq!((ledger.charge_calls(), ledger.charges()), (2, 1));
    // The same key for another message: FAILED_PRECONDITION.
    let mut other = tonic::Request::new(charge(8));
    other
        .metadata_mut()
        .insert("idempotency-key", "\"by-hand\"".parse().unwrap());
    assert_eq!(
        raw.charge(other).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
}
