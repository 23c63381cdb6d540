//! The protocols of the layer: plain HTTP and gRPC, how each marks an
//! attempt on the wire and judges a response.

use std::time::Duration;

#[cfg(feature = "tonic")]
use http::HeaderValue;
use http::Response;
use http::request::Parts;
use http_body::Body;

use retries_core::attempt::Attempt;
use retries_core::failure::Stopped;
use retries_core::verdict::Verdict;
use retries_http::door::method_is_idempotent;
use retries_http::{BoxError, ReplayBody};

use super::{ResponseVerdict, sealed};

/// The protocol of a [`RetryLayer`](super::RetryLayer): [`Http`] or [`Grpc`]. Sealed.
pub trait Protocol: sealed::Sealed + Clone + Send + Sync + 'static {
    /// The body of the requests the inner service takes.
    type Body<B>;
    /// The body of one attempt.
    fn body<B>(body: ReplayBody<B>) -> Self::Body<B>
    where
        B: Body + Unpin + Send + 'static,
        B::Error: Into<BoxError>;
    /// Idempotent by the protocol's own rule (after the layer's rules).
    fn idempotent(parts: &Parts, methods: &[String]) -> bool;
    /// The deadline the request brings with it, if any.
    fn request_deadline(parts: &Parts) -> Option<Duration>;
    /// Mark one attempt's request (deadline and attempt count on the wire).
    fn prepare(parts: &mut Parts, at: &Attempt);
    /// The verdict on a response, `None` for a success (or a committed call).
    fn classify<RB>(response: &Response<RB>) -> Option<Verdict>;
    /// A stop as the layer's error.
    fn stopped(stopped: Stopped) -> BoxError;
    /// The name a request's call reports under (events, metrics): its gRPC
    /// method, or its HTTP method and `route`, else `fallback`.
    fn call_name(
        parts: &Parts,
        route: Option<&'static str>,
        fallback: &'static retries_core::observe::Name,
    ) -> &'static retries_core::observe::Name;
    /// Record the request of an attempt on the attempt's span, if anyone
    /// listens (see [`observe`](retries_core::observe), "Spans of attempts").
    fn describe(parts: &Parts, route: Option<&'static str>, at: &Attempt);
    /// Record an attempt's response on its span, if anyone listens.
    fn describe_response<RB>(response: &Response<RB>);
    /// The conventions' metrics ([`MetricNames::OpenTelemetry`](retries_core::observe::MetricNames)):
    /// an attempt starts.
    fn metric_started(parts: &Parts);
    /// An attempt ended, with this response (`None`: no response).
    fn metric_attempt<RB>(
        parts: &Parts,
        route: Option<&'static str>,
        response: Option<&Response<RB>>,
        took: Duration,
    );
    /// A call ended, after `attempts` that took `busy` of its `took`.
    fn metric_call<RB>(
        parts: &Parts,
        answer: &Result<Response<RB>, BoxError>,
        took: Duration,
        attempts: u32,
        busy: Duration,
    );
}

/// Plain HTTP: the inner service takes `http::Request<ReplayBody<B>>`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Http;

impl Protocol for Http {
    type Body<B> = ReplayBody<B>;

    fn call_name(
        parts: &Parts,
        route: Option<&'static str>,
        fallback: &'static retries_core::observe::Name,
    ) -> &'static retries_core::observe::Name {
        route.map_or(fallback, |r| {
            retries_http::door::route_name(&parts.method, r, fallback)
        })
    }

    fn body<B>(body: ReplayBody<B>) -> ReplayBody<B> {
        body
    }

    fn describe(parts: &Parts, route: Option<&'static str>, at: &Attempt) {
        if retries_core::door::observe::listening() {
            retries_core::door::observe::http_request(
                parts.method.as_str(),
                parts.uri.host(),
                route,
                at.number(),
            );
        }
    }

    fn describe_response<RB>(response: &Response<RB>) {
        retries_core::door::observe::http_status(response.status().as_u16());
    }

    fn metric_started(_: &Parts) {}

    fn metric_attempt<RB>(
        parts: &Parts,
        route: Option<&'static str>,
        response: Option<&Response<RB>>,
        took: Duration,
    ) {
        retries_core::door::observe::http_attempt(
            parts.method.as_str(),
            parts.uri.host(),
            route,
            response.map(|r| r.status().as_u16()),
            took,
        );
    }

    fn metric_call<RB>(
        _: &Parts,
        _: &Result<Response<RB>, BoxError>,
        _: Duration,
        _: u32,
        _: Duration,
    ) {
    }

    fn idempotent(parts: &Parts, _: &[String]) -> bool {
        method_is_idempotent(&parts.method)
    }

    /// `retries-timeout-ms`, when the request carries one: it shortens the
    /// call (see [`wire`](retries_core::wire)).
    fn request_deadline(parts: &Parts) -> Option<Duration> {
        retries_core::wire::request_timeout(&parts.headers)
    }

    /// The attempt's remaining time as `retries-timeout-ms`.
    fn prepare(parts: &mut Parts, at: &Attempt) {
        retries_core::wire::send_timeout(&mut parts.headers, at.remaining());
    }

    fn classify<RB>(response: &Response<RB>) -> Option<Verdict> {
        let status = response.status();
        (status.is_client_error() || status.is_server_error())
            .then(|| retries_core::http::classify_response(status, response.headers()))
    }

    fn stopped(stopped: Stopped) -> BoxError {
        Box::new(stopped)
    }
}

/// gRPC over tonic (feature `tonic`): the inner service takes
/// `http::Request<tonic::body::Body>`, as a `tonic::transport::Channel` does.
#[cfg(feature = "tonic")]
#[derive(Debug, Clone, Copy, Default)]
pub struct Grpc;

#[cfg(feature = "tonic")]
impl Protocol for Grpc {
    type Body<B> = tonic::body::Body;

    fn call_name(
        parts: &Parts,
        _: Option<&'static str>,
        fallback: &'static retries_core::observe::Name,
    ) -> &'static retries_core::observe::Name {
        // A method path names a bounded set (the service's methods); the
        // cap of `MAX_CALL_NAMES` holds against any other.
        retries_core::door::call_name(parts.uri.path(), fallback)
    }

    fn body<B>(body: ReplayBody<B>) -> tonic::body::Body
    where
        B: Body + Unpin + Send + 'static,
        B::Error: Into<BoxError>,
    {
        tonic::body::Body::new(body)
    }

    fn describe(parts: &Parts, _: Option<&'static str>, _: &Attempt) {
        if retries_core::door::observe::listening() {
            retries_core::door::observe::grpc_request(parts.uri.path(), parts.uri.host());
        }
    }

    /// A trailers-only answer's `grpc-status`; the headers of a real
    /// response are the layer's success (`OK`: its status comes in the
    /// trailers, after the layer has answered); an HTTP error from
    /// something that is not a gRPC server, its HTTP status.
    fn describe_response<RB>(response: &Response<RB>) {
        match response.headers().get(&grpc::STATUS) {
            Some(code) => {
                let code = tonic::Code::from_bytes(code.as_bytes());
                retries_core::door::observe::grpc_status(code as i32, grpc_status_name(code));
            }
            None if response.status().is_success() => {
                retries_core::door::observe::grpc_status(0, "OK");
            }
            None => retries_core::door::observe::http_status(response.status().as_u16()),
        }
    }

    fn metric_started(parts: &Parts) {
        retries_core::door::observe::grpc_attempt_started(method_of(parts));
    }

    fn metric_attempt<RB>(
        parts: &Parts,
        _: Option<&'static str>,
        response: Option<&Response<RB>>,
        took: Duration,
    ) {
        retries_core::door::observe::grpc_attempt(
            method_of(parts),
            response.map_or("UNAVAILABLE", answered_status),
            took,
        );
    }

    fn metric_call<RB>(
        parts: &Parts,
        answer: &Result<Response<RB>, BoxError>,
        took: Duration,
        attempts: u32,
        busy: Duration,
    ) {
        let status = match answer {
            Ok(response) => answered_status(response),
            Err(e) => e
                .downcast_ref::<tonic::Status>()
                .map_or("UNAVAILABLE", |s| grpc_status_name(s.code())),
        };
        retries_core::door::observe::grpc_call(
            method_of(parts),
            status,
            took,
            attempts,
            took.saturating_sub(busy),
        );
    }

    fn idempotent(parts: &Parts, methods: &[String]) -> bool {
        let path = parts.uri.path();
        methods.iter().any(|m| {
            if m.ends_with('/') {
                path.starts_with(m.as_str())
            } else {
                path == m
            }
        })
    }

    fn request_deadline(parts: &Parts) -> Option<Duration> {
        parts
            .headers
            .get(&grpc::TIMEOUT)
            .and_then(|v| v.to_str().ok())
            .and_then(retries_core::wire::parse_grpc_timeout)
    }

    fn prepare(parts: &mut Parts, at: &Attempt) {
        parts
            .headers
            .insert(grpc::TIMEOUT, grpc_timeout(at.remaining()));
        if at.number() > 1 {
            parts
                .headers
                .insert(grpc::PREVIOUS_ATTEMPTS, HeaderValue::from(at.number() - 1));
        }
    }

    fn classify<RB>(response: &Response<RB>) -> Option<Verdict> {
        use retries_core::tonic::{classify_code, pushback_of};
        let headers = response.headers();
        match headers.get(&grpc::STATUS) {
            // Trailers-only: the call ended with this status.
            Some(code) => {
                let code = tonic::Code::from_bytes(code.as_bytes());
                (code != tonic::Code::Ok).then(|| {
                    // A key's recorded answer (`Idempotent-Replayed`): sent
                    // again, it would be replayed again.
                    if headers.contains_key(retries_core::wire::REPLAYED_NAME) {
                        return Verdict::permanent();
                    }
                    let pushback = pushback_of(
                        headers
                            .get_all(&grpc::PUSHBACK)
                            .iter()
                            .map(|v| v.to_str().ok()),
                    );
                    classify_code(code, false, pushback)
                })
            }
            // Headers of a real response: committed (gRFC A6), unless the
            // HTTP status says no gRPC server answered.
            None if response.status().is_success() => None,
            None => Some(retries_core::http::classify_response(
                response.status(),
                headers,
            )),
        }
    }

    fn stopped(stopped: Stopped) -> BoxError {
        Box::new(tonic::Status::from(stopped))
    }
}

/// The gRPC headers the layers read and write, named once and made at
/// compile time: a lookup or insertion by `&str` parses the name on every
/// request (callgrind: ~900 instructions per gRPC call for the four lookups
/// of a call).
pub(crate) mod grpc {
    use http::HeaderName;

    pub(crate) const STATUS: HeaderName = HeaderName::from_static("grpc-status");
    pub(crate) const MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
    pub(crate) const PUSHBACK: HeaderName =
        HeaderName::from_static(retries_core::wire::GRPC_PUSHBACK);
    #[cfg(feature = "tonic")]
    pub(crate) const TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
    #[cfg(feature = "tonic")]
    pub(crate) const PREVIOUS_ATTEMPTS: HeaderName =
        HeaderName::from_static(retries_core::tonic::PREVIOUS_ATTEMPTS);
}

/// The method of a gRPC request, as gRFC A66's `grpc.method` writes it
/// (`package.Service/Method`).
#[cfg(feature = "tonic")]
fn method_of(parts: &Parts) -> &str {
    let path = parts.uri.path();
    path.strip_prefix('/').unwrap_or(path)
}

/// The status a gRPC response's headers say: a trailers-only answer's
/// `grpc-status`, else `OK` for the headers of a real response (its status
/// comes in the trailers, after the layer answered), else `UNAVAILABLE`
/// for an HTTP error from something that is not a gRPC server.
#[cfg(feature = "tonic")]
fn answered_status<RB>(response: &Response<RB>) -> &'static str {
    match response.headers().get(&grpc::STATUS) {
        Some(code) => grpc_status_name(tonic::Code::from_bytes(code.as_bytes())),
        None if response.status().is_success() => "OK",
        None => "UNAVAILABLE",
    }
}

/// A gRPC status code's name, as gRFC A66's `grpc.status` writes it.
#[cfg(feature = "tonic")]
fn grpc_status_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// `grpc-timeout` for `d`: at most 8 digits in the finest unit that holds it,
/// rounded down (never a longer timeout than the time left).
#[cfg(feature = "tonic")]
fn grpc_timeout(d: Duration) -> HeaderValue {
    const MAX: u128 = 99_999_999;
    let nanos = d.as_nanos();
    let (n, unit) = [
        (1, 'n'),
        (1_000, 'u'),
        (1_000_000, 'm'),
        (1_000_000_000, 'S'),
        (60_000_000_000, 'M'),
        (3_600_000_000_000, 'H'),
    ]
    .into_iter()
    .map(|(per, unit)| (nanos / per, unit))
    .find(|(n, _)| *n <= MAX)
    .unwrap_or((MAX, 'H'));
    HeaderValue::try_from(format!("{n}{unit}")).unwrap_or(HeaderValue::from_static("0n"))
}

/// Who judges a response.
#[derive(Clone, Copy)]
pub(super) enum Judge<'a> {
    /// The protocol's table.
    Protocol,
    /// The layer's `retry_if`.
    Custom(&'a ResponseVerdict),
    /// A service config's `retryableStatusCodes`.
    #[cfg(feature = "service-config")]
    Codes(crate::service_config::Codes),
}

/// A trailers-only gRPC response judged by a retry policy's codes: retried
/// (as an unknown outcome of a method the config declares safe to repeat,
/// with its pushback) when its code is listed, permanent otherwise; any
/// other response as the protocol judges it.
#[cfg(feature = "service-config")]
pub(super) fn by_codes<P: Protocol, RB>(
    codes: crate::service_config::Codes,
    response: &Response<RB>,
) -> Option<Verdict> {
    use retries_core::tonic::{Pushback, pushback_of};
    let headers = response.headers();
    let Some(code) = headers.get(&grpc::STATUS) else {
        return P::classify(response);
    };
    let code = tonic::Code::from_bytes(code.as_bytes());
    if code == tonic::Code::Ok {
        return None;
    }
    if !codes.contains(code) {
        return Some(Verdict::permanent());
    }
    Some(
        match pushback_of(
            headers
                .get_all(&grpc::PUSHBACK)
                .iter()
                .map(|v| v.to_str().ok()),
        ) {
            Pushback::None => Verdict::unknown(),
            Pushback::Pause(d) => Verdict::unknown().with_retry_after(d),
            Pushback::Stop => Verdict::server_refused(),
        },
    )
}
