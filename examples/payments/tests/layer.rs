//! The tower layer on a real `tonic::transport::Channel`, under the generated
//! client, against the payments server with fault injection: no charge is
//! ever made twice, idempotent methods are retried, pushback is obeyed, and
//! the deadline travels as `grpc-timeout` on every attempt and is enforced by
//! the server. Real time, bounded (the longest test takes 2 s).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use retries::{Backoff, Policy};
use retries_payments::pb::ChargeRequest;
use retries_payments::pb::payments_client::PaymentsClient;
use retries_payments::{Fault, Ledger, serve};
use retries_tower::{Grpc, RetryLayer, RetryService};
use tonic::Code;
use tonic::transport::Channel;

fn policy() -> Policy {
    Policy::new(Duration::from_secs(2))
        .with_max_attempts(3)
        .with_backoff(Backoff::constant(Duration::from_millis(100)))
}

fn client(
    addr: SocketAddr,
    layer: &RetryLayer<Grpc>,
) -> PaymentsClient<RetryService<Channel, Grpc>> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    PaymentsClient::new(layer.layer(channel))
}

fn charge(key: &str) -> ChargeRequest {
    ChargeRequest {
        idempotency_key: key.to_string(),
        cents: 1999,
    }
}

#[tokio::test]
async fn a_charge_whose_reply_was_lost_is_not_replayed() {
    let ledger = Ledger::with_faults(&[Fault::UnavailableAfter]);
    let mut c = client(serve(ledger.clone()).await, &RetryLayer::grpc(policy()));
    let err = c.charge(charge("k1")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!((ledger.charge_calls(), ledger.charges()), (1, 1));
}

#[tokio::test]
async fn internal_after_the_charge_is_permanent() {
    let ledger = Ledger::with_faults(&[Fault::InternalAfter]);
    let layer = RetryLayer::grpc(policy()).idempotent_methods(["/payments.Payments/"]);
    let mut c = client(serve(ledger.clone()).await, &layer);
    let err = c.charge(charge("k2")).await.unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    assert_eq!((ledger.charge_calls(), ledger.charges()), (1, 1));
}

#[tokio::test]
async fn an_idempotent_method_is_retried_with_the_attempt_count_on_the_wire() {
    let ledger = Ledger::with_faults(&[Fault::UnavailableBefore, Fault::UnavailableBefore]);
    let layer = RetryLayer::grpc(policy()).idempotent_methods(["/payments.Payments/Charge"]);
    let mut c = client(serve(ledger.clone()).await, &layer);
    let receipt = c.charge(charge("k3")).await.unwrap().into_inner();
    assert_eq!((ledger.charge_calls(), ledger.charges()), (3, 1));
    assert_eq!(
        ledger.previous_attempts(),
        [None, Some("1".to_string()), Some("2".to_string())]
    );
    // The server saw the call's remaining time as its deadline: after two
    // 100 ms pauses, less than 1.8 s of the 2 s.
    assert!(
        (1..=1800).contains(&receipt.server_budget_ms),
        "{}",
        receipt.server_budget_ms
    );
}

#[tokio::test]
async fn pushback_is_obeyed_even_for_a_charge() {
    let ledger = Ledger::with_faults(&[Fault::Pushback("300")]);
    let mut c = client(serve(ledger.clone()).await, &RetryLayer::grpc(policy()));
    let t0 = Instant::now();
    c.charge(charge("k4")).await.unwrap();
    let elapsed = t0.elapsed();
    assert_eq!((ledger.charge_calls(), ledger.charges()), (2, 1));
    assert!(
        elapsed >= Duration::from_millis(300) && elapsed < Duration::from_millis(900),
        "{elapsed:?}"
    );

    let ledger = Ledger::with_faults(&[Fault::Pushback("-1")]);
    let mut c = client(serve(ledger.clone()).await, &RetryLayer::grpc(policy()));
    let err = c.charge(charge("k5")).await.unwrap_err();
    assert_eq!(
        err.code(),
        Code::ResourceExhausted,
        "the server said: do not retry"
    );
    assert_eq!(ledger.charge_calls(), 1);
}

#[tokio::test]
async fn the_deadline_bounds_every_attempt_and_the_server_enforces_it() {
    let ledger =
        Ledger::with_faults(&[Fault::SleepThenUnavailable(Duration::from_millis(1500)); 3]);
    let layer = RetryLayer::grpc(policy()).idempotent_methods(["/payments.Payments/Charge"]);
    let mut c = client(serve(ledger.clone()).await, &layer);
    let t0 = Instant::now();
    let err = c.charge(charge("k6")).await.unwrap_err();
    let elapsed = t0.elapsed();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert_eq!(ledger.charge_calls(), 2, "attempt 3 never starts");
    assert_eq!(ledger.charges(), 0);
    assert!(
        elapsed >= Duration::from_millis(1950) && elapsed < Duration::from_millis(2300),
        "{elapsed:?}"
    );
}

#[tokio::test]
async fn a_shorter_deadline_from_the_request_is_kept() {
    let ledger = Ledger::with_faults(&[Fault::SleepThenUnavailable(Duration::from_millis(1500))]);
    let layer = RetryLayer::grpc(policy()).idempotent_methods(["/payments.Payments/Charge"]);
    let mut c = client(serve(ledger.clone()).await, &layer);
    let mut request = tonic::Request::new(charge("k7"));
    request.set_timeout(Duration::from_millis(300));
    let t0 = Instant::now();
    let err = c.charge(request).await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert_eq!(ledger.charge_calls(), 1);
    assert!(
        t0.elapsed() < Duration::from_millis(600),
        "{:?}",
        t0.elapsed()
    );
}

/// `reconcile` for the layer: ask the same channel's `GetCharge` for the
/// key the layer sent; its raw response carries a `Receipt`, the message
/// `Charge` answers with, so it can stand for the charge's answer.
fn reconciling(
    channel: Channel,
) -> RetryLayer<
    Grpc,
    retries::TokenBucket,
    retries::NoBreaker,
    impl retries_tower::Reconcile<http::Response<tonic::body::Body>>,
> {
    use prost::Message;
    RetryLayer::grpc(policy())
        .send_key(http::HeaderName::from_static(
            retries_payments::IDEMPOTENCY_KEY,
        ))
        .reconcile(
            move |key: retries::IdempotencyKey, _: &http::request::Parts| {
                let message = retries_payments::pb::GetChargeRequest {
                    idempotency_key: key.to_string(),
                }
                .encode_to_vec();
                let mut frame = vec![0u8];
                frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
                frame.extend_from_slice(&message);
                let request = http::Request::builder()
                    .method("POST")
                    .uri("http://payments/payments.Payments/GetCharge")
                    .header("content-type", "application/grpc")
                    .header("te", "trailers")
                    .body(tonic::body::Body::new(http_body_util::Full::new(
                        bytes::Bytes::from(frame),
                    )))
                    .expect("request");
                let channel = channel.clone();
                async move {
                    let response = tower::ServiceExt::oneshot(channel, request).await?;
                    let not_found = response
                        .headers()
                        .get("grpc-status")
                        .is_some_and(|s| s.as_bytes() == b"5");
                    Ok::<_, retries_tower::BoxError>((!not_found).then_some(response))
                }
            },
        )
}

#[tokio::test]
async fn reconcile_finds_nothing_and_the_charge_is_retried_once() {
    let ledger = Ledger::with_faults(&[Fault::UnavailableBefore]);
    let addr = serve(ledger.clone()).await;
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let mut c = PaymentsClient::new(reconciling(channel.clone()).layer(channel));
    let receipt = c.charge(charge("ignored")).await.unwrap().into_inner();
    assert_eq!((ledger.charge_calls(), ledger.charges()), (2, 1));
    assert!(receipt.id.starts_with("receipt-"), "{}", receipt.id);
}

#[tokio::test]
async fn reconcile_finds_the_charge_whose_reply_was_lost() {
    let ledger = Ledger::with_faults(&[Fault::UnavailableAfter]);
    let addr = serve(ledger.clone()).await;
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let mut c = PaymentsClient::new(reconciling(channel.clone()).layer(channel));
    let receipt = c.charge(charge("ignored")).await.unwrap().into_inner();
    assert_eq!(
        (ledger.charge_calls(), ledger.charges()),
        (1, 1),
        "found, not charged again"
    );
    assert_eq!(receipt.cents, 1999);
}

/// The retry policy of gRPC's own retry example (grpc/grpc
/// `examples/cpp/retry`: four attempts on UNAVAILABLE), for the payments
/// service, with A6's backoff values, driving a tonic channel.
const SERVICE_CONFIG: &str = r#"{
  "methodConfig": [{
    "name": [{"service": "payments.Payments"}],
    "waitForReady": true,
    "retryPolicy": {
      "maxAttempts": 4,
      "initialBackoff": "0.1s",
      "maxBackoff": "1s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }],
  "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
}"#;

#[tokio::test]
async fn a_service_config_drives_a_tonic_channel() {
    let config = retries_tower::service_config::ServiceConfig::from_json(SERVICE_CONFIG).unwrap();
    let ledger = Ledger::with_faults(&[Fault::UnavailableBefore, Fault::UnavailableBefore]);
    let layer =
        RetryLayer::grpc(Policy::new(Duration::from_secs(5))).service_config(config.clone());
    let mut c = client(serve(ledger.clone()).await, &layer);
    let t0 = Instant::now();
    c.charge(charge("k8")).await.unwrap();
    let elapsed = t0.elapsed();
    assert_eq!((ledger.charge_calls(), ledger.charges()), (3, 1));
    // Two pauses: 0.1 s and 0.2 s, each within ±20 %.
    assert!(
        elapsed >= Duration::from_millis(240) && elapsed < Duration::from_millis(800),
        "{elapsed:?}"
    );
    // INTERNAL is not in retryableStatusCodes: one attempt, one charge.
    let ledger = Ledger::with_faults(&[Fault::InternalAfter]);
    let layer = RetryLayer::grpc(Policy::new(Duration::from_secs(5))).service_config(config);
    let mut c = client(serve(ledger.clone()).await, &layer);
    assert_eq!(
        c.charge(charge("k9")).await.unwrap_err().code(),
        Code::Internal
    );
    assert_eq!((ledger.charge_calls(), ledger.charges()), (1, 1));
}

/// Under a tonic client, the layer's `avoid_tried` over
/// `retries_tower::balance::P2c` of two channels, one to a replica that
/// answers UNAVAILABLE (before charging) to everything: each call's retry
/// goes to the other replica, so no call takes a third attempt (the good
/// replica sees `grpc-previous-rpc-attempts` of at most 1).
#[tokio::test]
async fn under_a_tonic_client_a_retry_goes_to_the_other_replica() {
    use retries_tower::balance::P2c;
    use tower::discover::ServiceList;

    let bad = Ledger::with_faults(&vec![Fault::UnavailableBefore; 100]);
    let good = Ledger::with_faults(&[]);
    let mut channels = Vec::new();
    for ledger in [&bad, &good] {
        let addr = serve(Arc::clone(ledger)).await;
        channels.push(
            Channel::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect_lazy(),
        );
    }
    let layer = RetryLayer::grpc(
        Policy::new(Duration::from_secs(5))
            .with_max_attempts(5)
            .with_backoff(Backoff::constant(Duration::from_millis(1))),
    )
    .budget(retries::NoBudget)
    .idempotent_methods(["/payments.Payments/Charge"])
    .avoid_tried();
    let mut c = PaymentsClient::new(layer.layer(P2c::new(ServiceList::new(channels))));
    for i in 0..40 {
        c.charge(charge(&format!("spread-{i}"))).await.unwrap();
    }
    assert_eq!((good.charge_calls(), good.charges()), (40, 40));
    assert_eq!(bad.charges(), 0);
    // About half the calls tried the bad replica first; none twice.
    assert!(
        (1..=40).contains(&bad.charge_calls()),
        "{}",
        bad.charge_calls()
    );
    let retried = good
        .previous_attempts()
        .iter()
        .filter(|p| p.as_deref() == Some("1"))
        .count();
    assert_eq!(retried as u32, bad.charge_calls());
    assert!(
        good.previous_attempts()
            .iter()
            .all(|p| p.is_none() || p.as_deref() == Some("1")),
        "{:?}",
        good.previous_attempts()
    );
}
