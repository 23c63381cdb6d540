//! `cargo run -p retries-payments --example middleware`: the tower layer on a
//! tonic channel and on a hyper client, one line each, against real servers
//! on loopback, with the attempt log (the library's DEBUG events).
//!
//! * gRPC: `Charge` is not idempotent unless configured; here `GetCharge` is
//!   named idempotent and `Charge` is not. An UNAVAILABLE after the charge
//!   is not replayed (its outcome is unknown: no second charge); the server's
//!   pushback on the next call is obeyed and that charge retried (nothing
//!   ran before the pushback).
//! * HTTP: a GET answered 503 with `Retry-After: 1` is retried after the
//!   server's pause; a POST answered 502 is not replayed.

use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retries::{Backoff, Policy};
use retries_payments::pb::ChargeRequest;
use retries_payments::pb::payments_client::PaymentsClient;
use retries_payments::{Fault, Ledger, serve};
use retries_tower::RetryLayer;
use tower::{Service, ServiceExt};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[tokio::main]
async fn main() {
    // The attempt log: `retries` at DEBUG, everything else at INFO.
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .without_time()
                .with_target(false)
                .compact(),
        )
        .with(
            Targets::new()
                .with_default(tracing::Level::INFO)
                .with_target("retries", tracing::Level::DEBUG),
        )
        .init();
    let policy = Policy::new(Duration::from_secs(2))
        .with_max_attempts(3)
        .with_backoff(Backoff::constant(Duration::from_millis(100)));

    // gRPC: one line of layer on the channel.
    let ledger = Ledger::with_faults(&[Fault::UnavailableAfter, Fault::Pushback("200")]);
    let addr = serve(ledger.clone()).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect_lazy();
    let channel = RetryLayer::grpc(policy)
        .idempotent_methods(["/payments.Payments/GetCharge"])
        .layer(channel);
    let mut payments = PaymentsClient::new(channel);
    for key in ["order-1", "order-2"] {
        let t0 = Instant::now();
        let request = ChargeRequest {
            idempotency_key: key.into(),
            cents: 1999,
        };
        let result = payments
            .charge(request)
            .await
            .map(|_| "OK")
            .map_err(|s| s.code());
        println!("gRPC Charge {key}: {result:?} in {:?}", t0.elapsed());
    }
    println!(
        "charges made: {} (calls received: {})\n",
        ledger.charges(),
        ledger.charge_calls()
    );

    // HTTP: one line of layer on a hyper client.
    let base = serve_http().await;
    let client = Client::builder(TokioExecutor::new()).build_http();
    let mut http = RetryLayer::new(policy).layer(client);
    for (method, path) in [("GET", "/busy-once"), ("POST", "/jobs")] {
        let request = http::Request::builder()
            .method(method)
            .uri(format!("{base}{path}"))
            .body(Full::new(axum::body::Bytes::from_static(b"{}")))
            .expect("request");
        let t0 = Instant::now();
        let response = http
            .ready()
            .await
            .expect("ready")
            .call(request)
            .await
            .expect("response");
        let status = response.status();
        let _ = response.into_body().collect().await;
        println!("HTTP {method} {path}: {status} in {:?}", t0.elapsed());
    }
}

/// A GET that answers 503 with `Retry-After: 1` once, and a POST that
/// answers 502 (a lost reply: the job may have been created).
async fn serve_http() -> String {
    use std::sync::atomic::{AtomicBool, Ordering};
    static BUSY: AtomicBool = AtomicBool::new(true);
    let app = axum::Router::new()
        .route(
            "/busy-once",
            axum::routing::get(|| async {
                let mut h = HeaderMap::new();
                if BUSY.swap(false, Ordering::SeqCst) {
                    h.insert("retry-after", HeaderValue::from_static("1"));
                    return (StatusCode::SERVICE_UNAVAILABLE, h);
                }
                (StatusCode::OK, h)
            }),
        )
        .route(
            "/jobs",
            axum::routing::post(|| async { StatusCode::BAD_GATEWAY }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    format!("http://{addr}")
}
