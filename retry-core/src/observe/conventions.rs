//! The conventions' instruments, recorded by the doors when asked
//! ([`MetricNames::OpenTelemetry`](super::MetricNames::OpenTelemetry)). Their labels are built per record.

use std::time::Duration;

use metrics::{Key, Label, Unit};

fn key(name: &'static str, labels: Vec<Label>) -> Key {
    Key::from_parts(name, labels)
}

fn label(k: &'static str, v: &str) -> Label {
    Label::new(k, v.to_owned())
}

/// Record `value` in the histogram `key`, described first: a bridge may
/// keep a unit only for the registration that follows a description
/// (metrics-exporter-opentelemetry 0.2 does), and this mode registers
/// per record.
fn histogram(key: &Key, unit: Unit, what: &'static str, value: f64) {
    metrics::with_recorder(|r| {
        r.describe_histogram(key.name_shared(), Some(unit), what.into());
    });
    super::record::record(key, value);
}

/// Count one in the counter `key`, described first (as [`histogram`]).
fn counter(key: &Key, what: &'static str) {
    metrics::with_recorder(|r| {
        r.describe_counter(key.name_shared(), Some(Unit::Count), what.into());
    });
    super::record::count(key);
}

/// One HTTP attempt: `http.client.request.duration` (s).
pub(crate) fn http_attempt(
    method: &str,
    host: Option<&str>,
    route: Option<&str>,
    status: Option<u16>,
    duration: Duration,
) {
    let mut labels = vec![label("http.request.method", method)];
    if let Some(host) = host {
        labels.push(label("server.address", host));
    }
    if let Some(route) = route {
        labels.push(label("url.template", route));
    }
    match status {
        Some(code) => {
            labels.push(Label::new("http.response.status_code", code.to_string()));
            if code >= 400 {
                labels.push(Label::new("error.type", code.to_string()));
            }
        }
        None => labels.push(Label::from_static_parts("error.type", "_OTHER")),
    }
    histogram(
        &key("http.client.request.duration", labels),
        Unit::Seconds,
        "duration of HTTP client requests",
        duration.as_secs_f64(),
    );
}

/// A gRPC attempt started: `grpc.client.attempt.started`.
pub(crate) fn grpc_attempt_started(method: &str) {
    counter(
        &key(
            "grpc.client.attempt.started",
            vec![label("grpc.method", method)],
        ),
        "gRPC attempts started",
    );
}

/// A gRPC attempt ended with `status`: `grpc.client.attempt.duration` (s).
pub(crate) fn grpc_attempt(method: &str, status: &'static str, duration: Duration) {
    histogram(
        &key(
            "grpc.client.attempt.duration",
            vec![
                label("grpc.method", method),
                Label::from_static_parts("grpc.status", status),
            ],
        ),
        Unit::Seconds,
        "end-to-end time of a gRPC attempt",
        duration.as_secs_f64(),
    );
}

/// A gRPC call ended with `status` after `attempts`, having paused
/// `delay` in all: `grpc.client.call.duration` (s), and for a call
/// that retried, `grpc.client.call.retries` and
/// `grpc.client.call.retry_delay` (s).
pub(crate) fn grpc_call(
    method: &str,
    status: &'static str,
    duration: Duration,
    attempts: u32,
    delay: Duration,
) {
    histogram(
        &key(
            "grpc.client.call.duration",
            vec![
                label("grpc.method", method),
                Label::from_static_parts("grpc.status", status),
            ],
        ),
        Unit::Seconds,
        "end-to-end time of a gRPC call",
        duration.as_secs_f64(),
    );
    if attempts > 1 {
        histogram(
            &key(
                "grpc.client.call.retries",
                vec![label("grpc.method", method)],
            ),
            Unit::Count,
            "retries of a gRPC call",
            f64::from(attempts - 1),
        );
        histogram(
            &key(
                "grpc.client.call.retry_delay",
                vec![label("grpc.method", method)],
            ),
            Unit::Seconds,
            "time a gRPC call waited between its attempts",
            delay.as_secs_f64(),
        );
    }
}
