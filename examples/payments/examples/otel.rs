//! `cargo run -p retries-payments --example otel`: the spans of one retried
//! gRPC call as OpenTelemetry receives them (`tracing-opentelemetry` into
//! the SDK's in-memory exporter), printed as a tree: the call, and each
//! attempt under it with its attributes. The server refuses the first
//! attempt (UNAVAILABLE, before any work) and accepts the second.

use std::time::Duration;

use opentelemetry::trace::{SpanId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use retries::{Backoff, Policy};
use retries_payments::pb::ChargeRequest;
use retries_payments::pb::payments_client::PaymentsClient;
use retries_payments::{Fault, Ledger, serve};
use retries_tower::RetryLayer;
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;

/// The attributes printed, in this order, when a span has them.
const SHOWN: [&str; 18] = [
    "function",
    "outcome",
    "attempts",
    "deadline_ms",
    "attempt",
    "verdict",
    "next",
    "pause_ms",
    "rpc.system",
    "rpc.service",
    "rpc.method",
    "grpc.method",
    "rpc.grpc.status_code",
    "grpc.status",
    "server.address",
    "http.request.method",
    "http.response.status_code",
    "error.type",
];

fn line(span: &SpanData) -> String {
    let ms = span
        .end_time
        .duration_since(span.start_time)
        .unwrap_or_default()
        .as_secs_f64()
        * 1000.0;
    let attrs: Vec<String> = SHOWN
        .iter()
        .filter_map(|key| {
            span.attributes
                .iter()
                .find(|kv| kv.key.as_str() == *key)
                .map(|kv| format!("{key}={}", kv.value.as_str()))
        })
        .collect();
    format!(
        "{} [{:?}, {:?}, {ms:.1} ms] {}",
        span.name,
        span.span_kind,
        span.status,
        attrs.join(" ")
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let ledger = Ledger::with_faults(&[Fault::UnavailableBefore]);
    let addr = serve(ledger.clone()).await;

    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let otel = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("example"))
        .with_filter(Targets::new().with_target("retries", tracing::Level::DEBUG));
    let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(otel));

    let policy = Policy::new(Duration::from_secs(2))
        .with_max_attempts(3)
        .with_backoff(Backoff::constant(Duration::from_millis(50)));
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("a valid URI")
        .connect_lazy();
    let layer = RetryLayer::grpc(policy).idempotent_methods(["/payments.Payments/"]);
    let mut payments = PaymentsClient::new(layer.layer(channel));
    let request = ChargeRequest {
        idempotency_key: "order-1".into(),
        cents: 1999,
    };
    let result = payments.charge(request).await.map(|_| "OK");
    println!("Charge: {result:?}; charges made: {}\n", ledger.charges());

    provider.force_flush().expect("flushed");
    let spans = exporter.get_finished_spans().expect("the spans");
    for call in spans.iter().filter(|s| s.parent_span_id == SpanId::INVALID) {
        println!("{}", line(call));
        let children: Vec<&SpanData> = spans
            .iter()
            .filter(|s| s.parent_span_id == call.span_context.span_id())
            .collect();
        for (i, attempt) in children.iter().enumerate() {
            let branch = if i + 1 == children.len() {
                "└─"
            } else {
                "├─"
            };
            println!("{branch} {}", line(attempt));
        }
    }
}
