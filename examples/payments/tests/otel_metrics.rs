//! The metrics of a retried gRPC call through the layer, under the
//! OpenTelemetry conventions' names, as the OpenTelemetry SDK receives them
//! through the `metrics` exporter `metrics-exporter-opentelemetry` (a file
//! of its own: `tracing`'s callsite interest is per process, and the span
//! tests in `otel.rs` install their subscriber per thread).

use std::time::Duration;

use metrics_exporter_opentelemetry::Recorder;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use retries::{Backoff, Policy};
use retries_payments::pb::ChargeRequest;
use retries_payments::pb::payments_client::PaymentsClient;
use retries_payments::{Fault, Ledger, serve};
use retries_tower::RetryLayer;

mod common;

fn policy() -> Policy {
    Policy::new(Duration::from_secs(5))
        .with_max_attempts(3)
        .with_backoff(Backoff::constant(Duration::from_millis(20)))
}

/// Names, units and attributes.
/// Attributes, sorted.
type Attributes = Vec<(String, String)>;
/// A metric as exported: its name, its unit, and (attributes, count or
/// value) for each data point.
type Exported = (String, String, Vec<(Attributes, u64)>);

/// Every metric exported whose name starts with `prefix`, sorted.
fn exported(finished: &[ResourceMetrics], prefix: &str) -> Vec<Exported> {
    let attrs = |a: &mut dyn Iterator<Item = &opentelemetry::KeyValue>| {
        let mut v: Attributes = a
            .map(|kv| (kv.key.to_string(), kv.value.as_str().into_owned()))
            .collect();
        v.sort();
        v
    };
    let mut got = Vec::new();
    for rm in finished {
        for sm in rm.scope_metrics() {
            for m in sm.metrics().filter(|m| m.name().starts_with(prefix)) {
                let mut points: Vec<(Attributes, u64)> = match m.data() {
                    AggregatedMetrics::F64(MetricData::Histogram(h)) => h
                        .data_points()
                        .map(|p| (attrs(&mut p.attributes()), p.count()))
                        .collect(),
                    AggregatedMetrics::U64(MetricData::Sum(s)) => s
                        .data_points()
                        .map(|p| (attrs(&mut p.attributes()), p.value()))
                        .collect(),
                    other => panic!("{}: {other:?}", m.name()),
                };
                points.sort();
                got.push((m.name().to_owned(), m.unit().to_owned(), points));
            }
        }
    }
    got.sort();
    got
}

/// A `metrics` recorder into the OpenTelemetry SDK, its in-memory exporter,
/// and a runtime to run calls on.
fn pipeline() -> (
    InMemoryMetricExporter,
    SdkMeterProvider,
    Recorder,
    tokio::runtime::Runtime,
) {
    let exporter = InMemoryMetricExporter::default();
    let (provider, recorder) = Recorder::builder("retries-tests")
        .with_meter_provider(|b| b.with_reader(PeriodicReader::builder(exporter.clone()).build()))
        .build();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    (exporter, provider, recorder, rt)
}

#[test]
fn a_grpc_call_through_the_layer_exports_the_conventions_metrics() {
    let (exporter, provider, recorder, rt) = pipeline();
    let ledger = Ledger::with_faults(&[Fault::UnavailableBefore]);
    metrics::with_local_recorder(&recorder, || {
        retries::observe::describe_metrics();
        rt.block_on(async {
            let addr = serve(ledger.clone()).await;
            let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect_lazy();
            let layer = RetryLayer::grpc(policy())
                .idempotent_methods(["/payments.Payments/"])
                .metric_names(retries::observe::MetricNames::OpenTelemetry);
            let mut client = PaymentsClient::new(layer.layer(channel));
            let request = ChargeRequest {
                idempotency_key: "otel-metrics".into(),
                cents: 100,
            };
            client.charge(request).await.expect("charged on the retry");
        });
    });
    provider.force_flush().expect("flushed");
    let got = exported(
        &exporter.get_finished_metrics().expect("the metrics"),
        "grpc.",
    );
    let method = || {
        (
            "grpc.method".to_owned(),
            "payments.Payments/Charge".to_owned(),
        )
    };
    let status = |s: &str| ("grpc.status".to_owned(), s.to_owned());
    assert_eq!(
        got,
        [
            (
                "grpc.client.attempt.duration".to_owned(),
                "s".to_owned(),
                vec![
                    (vec![method(), status("OK")], 1),
                    (vec![method(), status("UNAVAILABLE")], 1),
                ]
            ),
            (
                "grpc.client.attempt.started".to_owned(),
                String::new(),
                vec![(vec![method()], 2)]
            ),
            (
                "grpc.client.call.duration".to_owned(),
                "s".to_owned(),
                vec![(vec![method(), status("OK")], 1)]
            ),
            (
                "grpc.client.call.retries".to_owned(),
                String::new(),
                vec![(vec![method()], 1)]
            ),
            (
                "grpc.client.call.retry_delay".to_owned(),
                "s".to_owned(),
                vec![(vec![method()], 1)]
            ),
        ]
    );
    assert_eq!(ledger.charges(), 1);
}

#[test]
fn an_http_call_through_the_middleware_exports_the_conventions_metric() {
    let (exporter, provider, recorder, rt) = pipeline();
    metrics::with_local_recorder(&recorder, || {
        retries::observe::describe_metrics();
        rt.block_on(async {
            let (addr, _) = common::flaky_users().await;
            let middleware = retries_reqwest::RetryMiddleware::new(policy())
                .route(|_| Some("/users/{id}"))
                .metric_names(retries::observe::MetricNames::OpenTelemetry);
            let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
                .with(middleware)
                .build();
            let response = client
                .get(format!("http://{addr}/users/7"))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
        });
    });
    provider.force_flush().expect("flushed");
    let got = exported(
        &exporter.get_finished_metrics().expect("the metrics"),
        "http.",
    );
    let attrs = |extra: &[(&str, &str)]| {
        let mut v: Attributes = [
            ("http.request.method", "GET"),
            ("server.address", "127.0.0.1"),
            ("url.template", "/users/{id}"),
        ]
        .iter()
        .chain(extra)
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        v.sort();
        v
    };
    assert_eq!(
        got,
        [(
            "http.client.request.duration".to_owned(),
            "s".to_owned(),
            vec![
                (
                    attrs(&[("error.type", "503"), ("http.response.status_code", "503")]),
                    1
                ),
                (attrs(&[("http.response.status_code", "200")]), 1),
            ]
        )]
    );
}
