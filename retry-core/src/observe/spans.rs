//! What a door records on the span of the attempt it is sending, under the
//! OpenTelemetry names (HTTP client spans and RPC spans of the semantic
//! conventions, gRFC A66's `grpc.*`). Each does nothing unless the current
//! span is an attempt's span of this crate: no one listens, or the door
//! runs outside the loop (a hedged copy).

use super::observer::int;
use tracing::Span;

/// Does anyone listen to spans of attempts at all? A level check, read
/// before a door computes what it would record.
#[inline]
pub(crate) fn listening() -> bool {
    tracing::level_enabled!(tracing::Level::DEBUG)
}

/// The current attempt's span, if that is what runs now.
fn attempt() -> Option<Span> {
    if !tracing::level_enabled!(tracing::Level::DEBUG) {
        return None;
    }
    let span = Span::current();
    span.metadata()
        .is_some_and(|m| m.target() == "retries" && m.name() == "attempt")
        .then_some(span)
}

/// An HTTP request: its method, the server, the route template when
/// known, how many times it was sent before.
pub(crate) fn http_request(method: &str, host: Option<&str>, route: Option<&str>, number: u32) {
    let Some(span) = attempt() else { return };
    span.record("http.request.method", method);
    if let Some(host) = host {
        span.record("server.address", host);
    }
    if let Some(route) = route {
        span.record("url.template", route);
    }
    if number > 1 {
        span.record("http.request.resend_count", int(number - 1));
    }
}

/// An HTTP response's status; a status of 400 or more is the error
/// type, as the conventions say.
pub(crate) fn http_status(status: u16) {
    let Some(span) = attempt() else { return };
    span.record("http.response.status_code", int(status));
    if status >= 400 {
        span.record("error.type", status.to_string().as_str());
    }
}

/// A gRPC call of `path` (`/package.Service/Method`).
pub(crate) fn grpc_request(path: &str, host: Option<&str>) {
    let Some(span) = attempt() else { return };
    span.record("rpc.system", "grpc");
    let method = path.strip_prefix('/').unwrap_or(path);
    span.record("grpc.method", method);
    if let Some((service, name)) = method.split_once('/') {
        span.record("rpc.service", service);
        span.record("rpc.method", name);
    }
    if let Some(host) = host {
        span.record("server.address", host);
    }
}

/// A gRPC status, by number (`grpc-status`) and name.
pub(crate) fn grpc_status(code: i32, name: &'static str) {
    let Some(span) = attempt() else { return };
    span.record("rpc.grpc.status_code", code);
    span.record("grpc.status", name);
    if code != 0 {
        span.record("error.type", name);
    }
}

/// The attempt failed without a response (a connection or transport
/// error): the conventions' fallback error type.
pub(crate) fn no_response() {
    let Some(span) = attempt() else { return };
    span.record("error.type", "_OTHER");
}
