//! What each of this crate's instruments measures, told to the recorder
//! once ([`describe_metrics`]).

/// The counters of this crate, and what each counts.
#[cfg(feature = "metrics")]
const COUNTERS: [(&str, &str); 12] = [
    ("retry.call.started", "logical calls started"),
    ("retry.call.completed", "logical calls ended, by outcome"),
    (
        "retry.call.stopped_early",
        "calls stopped before their attempts ran out, by reason",
    ),
    (
        "retry.call.refused",
        "calls stopped before their first attempt, by reason",
    ),
    ("retry.attempt.started", "attempts started"),
    (
        "retry.server.refused",
        "requests a server layer refused before their handler",
    ),
    ("retry.stream.delivered", "items a resumed stream delivered"),
    (
        "retry.stream.skipped",
        "repeated items a resumed stream skipped",
    ),
    (
        "retry.stream.reopened",
        "connections a resumed stream reopened",
    ),
    (
        "retry.chaos.injected",
        "faults injected (the retries-chaos crate), by kind",
    ),
    (
        "retry.chaos.observed",
        "injected faults that took effect, by kind",
    ),
    (
        "retry.control.changes",
        "operator overrides set, changed, removed or expired (retries::control), by change",
    ),
];
/// The histograms of this crate, their units, and what each measures.
#[cfg(feature = "metrics")]
const HISTOGRAMS: [(&str, metrics::Unit, &str); 11] = [
    (
        "retry.call.duration",
        metrics::Unit::Seconds,
        "time from a call's entry to its end",
    ),
    (
        "retry.call.deadline_at_entry",
        metrics::Unit::Seconds,
        "the time a call's deadline left it at entry",
    ),
    (
        "retry.call.retries",
        metrics::Unit::Count,
        "attempts after the first, per call",
    ),
    (
        "retry.attempt.duration",
        metrics::Unit::Seconds,
        "attempt duration, by how it ended",
    ),
    (
        "retry.pause.duration",
        metrics::Unit::Seconds,
        "each pause between attempts",
    ),
    (
        "retry.server.deadline_at_entry",
        metrics::Unit::Seconds,
        "the time a request's caller left it",
    ),
    (
        "http.client.request.duration",
        metrics::Unit::Seconds,
        "duration of HTTP client requests",
    ),
    (
        "grpc.client.attempt.duration",
        metrics::Unit::Seconds,
        "end-to-end time of a gRPC attempt",
    ),
    (
        "grpc.client.call.duration",
        metrics::Unit::Seconds,
        "end-to-end time of a gRPC call",
    ),
    (
        "grpc.client.call.retries",
        metrics::Unit::Count,
        "retries of a gRPC call",
    ),
    (
        "grpc.client.call.retry_delay",
        metrics::Unit::Seconds,
        "time a gRPC call waited between its attempts",
    ),
];

/// Describe every instrument this crate records (its unit and what it
/// means) to the current `metrics` recorder: call it once after installing
/// the recorder, as the `metrics` ecosystem does, so that an exporter that
/// keeps units and descriptions (OpenTelemetry's, Prometheus') has them.
#[cfg(feature = "metrics")]
pub fn describe_metrics() {
    use metrics::Unit::Count;
    metrics::with_recorder(|r| {
        for (name, what) in COUNTERS {
            r.describe_counter(name.into(), Some(Count), what.into());
        }
        r.describe_counter(
            "grpc.client.attempt.started".into(),
            Some(Count),
            "gRPC attempts started".into(),
        );
        r.describe_counter(
            "retry.admission.refused".into(),
            Some(Count),
            "first attempts an admission refused locally".into(),
        );
        for (name, unit, what) in HISTOGRAMS {
            r.describe_histogram(name.into(), Some(unit), what.into());
        }
        r.describe_gauge(
            "retry.admission.refusal_rate".into(),
            None,
            "the share of first attempts an admission refuses now".into(),
        );
        r.describe_gauge(
            "retry.control.overrides".into(),
            Some(Count),
            "operator overrides in force (retries::control)".into(),
        );
    });
}
