//! Fault injection on a real gRPC server (tonic, loopback): each kind of
//! `retries_chaos::FaultLayer` as a tonic client meets it, with the
//! ledger's charges (the handler's effect) counted.

use std::time::{Duration, Instant};

use retries::tonic::{Pushback, pushback};
use retries_chaos::{Chaos, Fault, FaultKind, Rule};
use retries_payments::chaos::{Caller, grpc, http};
use retries_payments::{Client, Ledger, serve_with_faults};
use tonic::Code;

async fn charge_once(fault: Fault) -> (tonic::Status, std::sync::Arc<Ledger>, Chaos) {
    let chaos = Chaos::builder()
        .rule(Rule::new(fault).only(["/payments.Payments/Charge"]))
        .build()
        .unwrap();
    let ledger = Ledger::reporting_to(chaos.clone());
    let client = Client::new(serve_with_faults(ledger.clone(), chaos.clone()).await);
    let status = client
        .charge_without_deadline(100)
        .await
        .expect_err("a fault on every charge");
    (status, ledger, chaos)
}

#[tokio::test]
async fn a_dropped_reply_resets_the_stream_after_the_charge() {
    let (status, ledger, chaos) = charge_once(Fault::DropReply).await;
    // The stream is reset before any message: tonic reports INTERNAL.
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert_eq!(ledger.charges(), 1);
    let report = chaos.report();
    assert_eq!(
        (report.effects, report.observed(FaultKind::DropReply)),
        (1, 1)
    );
}

#[tokio::test]
async fn a_refusal_is_unavailable_with_its_pushback_before_the_charge() {
    let (status, ledger, _) = charge_once(Fault::Refuse {
        retry_after: Some(Duration::from_millis(50)),
    })
    .await;
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        pushback(&status),
        Pushback::Pause(Duration::from_millis(50))
    );
    assert_eq!(ledger.charges(), 0);
}

#[tokio::test]
async fn fail_after_is_unavailable_after_the_charge() {
    let (status, ledger, chaos) = charge_once(Fault::FAIL_AFTER).await;
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(ledger.charges(), 1);
    assert_eq!(chaos.report().observed(FaultKind::FailAfter), 1);
}

#[tokio::test]
async fn a_hang_ends_at_the_callers_grpc_timeout_without_charging() {
    let chaos = Chaos::builder()
        .rule(Rule::new(Fault::Hang {
            max: Duration::from_secs(30),
        }))
        .build()
        .unwrap();
    let ledger = Ledger::reporting_to(chaos.clone());
    let client = Client::new(serve_with_faults(ledger.clone(), chaos.clone()).await);
    let policy = retries::Policy::new(Duration::from_millis(400)).with_max_attempts(1);
    let t0 = Instant::now();
    let status = client.charge_within(&policy, 100).await.unwrap_err();
    let took = t0.elapsed();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        took >= Duration::from_millis(390) && took < Duration::from_secs(5),
        "{took:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while chaos.report().observed(FaultKind::Hang) < 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(chaos.report().observed(FaultKind::Hang), 1);
    assert_eq!(ledger.charges(), 0);
}

/// The demo's claim, on `protocol`: under every fault kind at 20 %, the
/// hand-written loop charges some calls twice, `retries` with `reconcile`
/// never does (and makes at least as many calls succeed).
async fn the_naive_loop_duplicates_and_retries_never_does(protocol: &str) {
    let run = async |caller| match protocol {
        "gRPC" => grpc(caller, 40, 4, 7).await,
        _ => http(caller, 40, 4, 7).await,
    };
    let naive = run(Caller::Naive).await;
    let safe = run(Caller::Retries).await;
    assert!(naive.report.duplicate_effects > 0, "{protocol}: {naive:?}");
    assert_eq!(safe.report.duplicate_effects, 0, "{protocol}: {safe:?}");
    assert!(
        safe.ok >= naive.ok,
        "{protocol}: {safe:?} against {naive:?}"
    );
    // Every kind was injected and took effect.
    for kind in FaultKind::ALL {
        assert!(
            safe.report.observed(kind) > 0,
            "{protocol} {kind}: {safe:?}"
        );
    }
    // Each call that succeeded charged exactly once.
    assert_eq!(
        u64::from(safe.ok),
        safe.report.effects,
        "{protocol}: {safe:?}"
    );
}

#[tokio::test]
async fn under_every_fault_over_grpc_the_naive_loop_duplicates_and_retries_never_does() {
    the_naive_loop_duplicates_and_retries_never_does("gRPC").await;
}

#[tokio::test]
async fn under_every_fault_over_http_the_naive_loop_duplicates_and_retries_never_does() {
    the_naive_loop_duplicates_and_retries_never_does("HTTP").await;
}

/// The client layer on a tonic channel: a refusal is `UNAVAILABLE` before
/// anything is sent, a lost answer `UNAVAILABLE` after the charge, each
/// with the injected `io::Error` behind it.
#[tokio::test]
async fn the_client_layer_on_a_tonic_channel() {
    use retries_chaos::ClientFaultLayer;
    use retries_payments::pb::ChargeRequest;
    use retries_payments::pb::payments_client::PaymentsClient;

    let server = Chaos::builder().build().unwrap();
    let ledger = Ledger::reporting_to(server.clone());
    let addr = serve_with_faults(ledger.clone(), server).await;
    for (fault, charges) in [
        (Fault::Refuse { retry_after: None }, 0),
        (Fault::DropReply, 1),
    ] {
        let chaos = Chaos::builder().rule(Rule::new(fault)).build().unwrap();
        let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy();
        let svc = tower::ServiceBuilder::new()
            .layer(ClientFaultLayer::new(chaos.clone()))
            .service(channel);
        let status = PaymentsClient::new(svc)
            .charge(ChargeRequest {
                idempotency_key: format!("{fault:?}"),
                cents: 100,
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert_eq!(ledger.charges(), charges);
        assert_eq!(chaos.report().observed(fault.kind()), 1);
    }
}
