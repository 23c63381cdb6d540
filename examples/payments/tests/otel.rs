//! The spans of retried calls as OpenTelemetry receives them:
//! `tracing-opentelemetry` into the OpenTelemetry SDK's in-memory exporter,
//! for a gRPC call through the tower layer on a tonic channel, an HTTP call
//! through the reqwest middleware against an axum server (both real, on
//! loopback), and a `#[retryable]` function. Each call is one span, each
//! attempt a span of its own under it, with the semantic conventions'
//! names and values.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use opentelemetry::trace::{SpanId, SpanKind, Status, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use retries::{Backoff, Policy, retryable};
use retries_payments::pb::ChargeRequest;
use retries_payments::pb::payments_client::PaymentsClient;
use retries_payments::{Fault, Ledger, serve};
use retries_reqwest::RetryMiddleware;
use retries_tower::RetryLayer;
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;

mod common;

fn policy() -> Policy {
    Policy::new(Duration::from_secs(5))
        .with_max_attempts(3)
        .with_backoff(Backoff::constant(Duration::from_millis(20)))
}

/// Spans of `retries` exported through `tracing-opentelemetry` while the
/// returned guard lives.
fn pipeline() -> (
    InMemorySpanExporter,
    SdkTracerProvider,
    tracing::subscriber::DefaultGuard,
) {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("retries-tests"))
        .with_filter(Targets::new().with_target("retries", tracing::Level::DEBUG));
    let guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
    (exporter, provider, guard)
}

/// An attribute's value as text, if the span has it.
fn attr(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.as_str().into_owned())
}

/// Every attribute of `span` and of its events that holds a whole number
/// is exported as an integer (`I64`), as the semantic conventions type
/// `http.response.status_code`, `http.request.resend_count`,
/// `rpc.grpc.status_code` and as a backend must receive counts to compare
/// or sum them: never as a string of digits (tracing-opentelemetry 0.34
/// turns a `u64` field into one).
fn integers_are_integers(span: &SpanData) {
    use opentelemetry::Value;
    let events = span.events.iter().flat_map(|e| e.attributes.iter());
    for kv in span.attributes.iter().chain(events) {
        // `error.type` is a string by the conventions, the status code's
        // text for an HTTP error among others.
        if let Value::String(s) = &kv.value
            && kv.key.as_str() != "error.type"
        {
            assert!(
                s.as_str().parse::<i64>().is_err(),
                "{} = {:?} in span {:?}: an integer exported as a string",
                kv.key,
                s.as_str(),
                span.name
            );
        }
    }
    for key in [
        "attempt",
        "attempts",
        "http.response.status_code",
        "http.request.resend_count",
        "rpc.grpc.status_code",
    ] {
        if let Some(kv) = span.attributes.iter().find(|kv| kv.key.as_str() == key) {
            assert!(
                matches!(kv.value, Value::I64(_)),
                "{key} = {:?} in span {:?}: an integer",
                kv.value,
                span.name
            );
        }
    }
}

/// The exported spans: the one call span and its attempts, in order.
fn call_and_attempts(
    exporter: &InMemorySpanExporter,
    provider: &SdkTracerProvider,
) -> (SpanData, Vec<SpanData>) {
    provider.force_flush().expect("flushed");
    let spans = exporter.get_finished_spans().expect("the spans");
    for span in &spans {
        integers_are_integers(span);
    }
    let (calls, mut attempts): (Vec<SpanData>, Vec<SpanData>) = spans
        .into_iter()
        .partition(|s| s.parent_span_id == SpanId::INVALID);
    assert_eq!(calls.len(), 1, "one call span: {calls:?}");
    let call = calls.into_iter().next().expect("one");
    attempts.sort_by_key(|s| attr(s, "attempt"));
    for a in &attempts {
        assert_eq!(
            a.parent_span_id,
            call.span_context.span_id(),
            "an attempt is a child of its call"
        );
        assert_eq!(a.span_context.trace_id(), call.span_context.trace_id());
    }
    (call, attempts)
}

fn error(status: &Status) -> bool {
    matches!(status, Status::Error { .. })
}

#[tokio::test]
async fn a_grpc_call_through_the_layer_exports_a_span_per_attempt() {
    let ledger = Ledger::with_faults(&[Fault::UnavailableBefore]);
    let addr = serve(ledger.clone()).await;
    let (exporter, provider, _guard) = pipeline();
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let layer = RetryLayer::grpc(policy()).idempotent_methods(["/payments.Payments/"]);
    let mut client = PaymentsClient::new(layer.layer(channel));
    let request = ChargeRequest {
        idempotency_key: "otel-1".into(),
        cents: 100,
    };
    client.charge(request).await.expect("charged on the retry");
    let (call, attempts) = call_and_attempts(&exporter, &provider);
    assert_eq!(call.name, "payments.Payments/Charge");
    assert_eq!(attr(&call, "outcome").as_deref(), Some("ok"));
    assert_eq!(attr(&call, "attempts").as_deref(), Some("2"));
    assert_eq!(attempts.len(), 2);
    // `server.address`: a tonic channel adds its origin to the request
    // below the layer, so the layer sees none.
    let keys = [
        "rpc.system",
        "rpc.service",
        "rpc.method",
        "grpc.method",
        "server.address",
        "rpc.grpc.status_code",
        "grpc.status",
        "error.type",
        "verdict",
        "next",
    ];
    let got: Vec<Vec<Option<String>>> = attempts
        .iter()
        .map(|a| keys.iter().map(|k| attr(a, k)).collect())
        .collect();
    let s = |v: &str| Some(v.to_owned());
    assert_eq!(
        got,
        [
            vec![
                s("grpc"),
                s("payments.Payments"),
                s("Charge"),
                s("payments.Payments/Charge"),
                None,
                s("14"),
                s("UNAVAILABLE"),
                s("UNAVAILABLE"),
                s("unknown"),
                s("retry"),
            ],
            vec![
                s("grpc"),
                s("payments.Payments"),
                s("Charge"),
                s("payments.Payments/Charge"),
                None,
                s("0"),
                s("OK"),
                None,
                s("ok"),
                s("done"),
            ],
        ]
    );
    for a in &attempts {
        assert_eq!(a.name, "payments.Payments/Charge");
        assert_eq!(a.span_kind, SpanKind::Client);
    }
    assert!(error(&attempts[0].status));
    assert!(!error(&attempts[1].status));
    assert_eq!(ledger.charges(), 1);
}

#[tokio::test]
async fn an_http_call_through_the_middleware_exports_a_span_per_attempt() {
    let (addr, calls) = common::flaky_users().await;
    let (exporter, provider, _guard) = pipeline();
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy()).route(|_| Some("/users/{id}")))
        .build();
    let response = client
        .get(format!("http://{addr}/users/7"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (call, attempts) = call_and_attempts(&exporter, &provider);
    assert_eq!(call.name, "GET /users/{id}");
    assert_eq!(attempts.len(), 2);
    let keys = [
        "http.request.method",
        "server.address",
        "url.template",
        "http.response.status_code",
        "http.request.resend_count",
        "error.type",
    ];
    let got: Vec<Vec<Option<String>>> = attempts
        .iter()
        .map(|a| keys.iter().map(|k| attr(a, k)).collect())
        .collect();
    let s = |v: &str| Some(v.to_owned());
    assert_eq!(
        got,
        [
            vec![
                s("GET"),
                s("127.0.0.1"),
                s("/users/{id}"),
                s("503"),
                None,
                s("503")
            ],
            vec![
                s("GET"),
                s("127.0.0.1"),
                s("/users/{id}"),
                s("200"),
                s("1"),
                None
            ],
        ]
    );
    for a in &attempts {
        assert_eq!(a.name, "GET /users/{id}");
        assert_eq!(a.span_kind, SpanKind::Client);
    }
    assert!(error(&attempts[0].status));
    assert!(!error(&attempts[1].status));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

#[retryable(
    deadline = "5s",
    max_attempts = 3,
    idempotent,
    budget = "none",
    backoff = "constant",
    initial_backoff = "10ms"
)]
async fn stock(fails: &AtomicU32) -> Result<u32, E> {
    if fails.fetch_sub(1, Ordering::SeqCst) > 0 {
        Err(E::Refused)
    } else {
        Ok(7)
    }
}

#[tokio::test]
async fn a_retryable_fn_exports_a_span_per_attempt() {
    let (exporter, provider, _guard) = pipeline();
    let fails = AtomicU32::new(2);
    assert_eq!(stock(&fails).await.unwrap(), 7);
    let (call, attempts) = call_and_attempts(&exporter, &provider);
    assert_eq!(call.name, "otel::stock");
    assert_eq!(attr(&call, "function").as_deref(), Some("otel::stock"));
    assert_eq!(attr(&call, "attempts").as_deref(), Some("3"));
    let got: Vec<(Option<String>, Option<String>, Option<String>)> = attempts
        .iter()
        .map(|a| (attr(a, "attempt"), attr(a, "verdict"), attr(a, "pause_ms")))
        .collect();
    let s = |v: &str| Some(v.to_owned());
    assert_eq!(
        got,
        [
            (s("1"), s("not_executed"), s("10")),
            (s("2"), s("not_executed"), s("10")),
            (s("3"), s("ok"), s("0")),
        ]
    );
    for a in &attempts {
        assert_eq!(a.name, "otel::stock");
        assert_eq!(a.span_kind, SpanKind::Internal);
    }
}
