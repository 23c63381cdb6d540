//! The protocols of the layer: plain HTTP and gRPC, how each marks an
//! attempt on the wire and judges a response.

use std::time::Duration;

#[cfg(feature = "tonic")]
use http::HeaderValue;
use http::Response;
use http::request::Parts;
use http_body::Body;

use crate::attempt::Attempt;
use crate::failure::Stopped;
use crate::replay::{ReplayBody, method_is_idempotent};
use crate::verdict::Verdict;

use super::{BoxError, ResponseVerdict, sealed};

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
        fallback: &'static crate::observe::Name,
    ) -> &'static crate::observe::Name;
    /// Record the request of an attempt on the attempt's span, if anyone
    /// listens (see [`observe`](crate::observe), "Spans of attempts").
    fn describe(parts: &Parts, route: Option<&'static str>, at: &Attempt);
    /// Record an attempt's response on its span, if anyone listens.
    fn describe_response<RB>(response: &Response<RB>);
    /// The conventions' metrics ([`MetricNames::OpenTelemetry`](crate::observe::MetricNames)):
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
        fallback: &'static crate::observe::Name,
    ) -> &'static crate::observe::Name {
        route.map_or(fallback, |r| {
            crate::observe::call_names::http(&parts.method, r, fallback)
        })
    }

    fn body<B>(body: ReplayBody<B>) -> ReplayBody<B> {
        body
    }

    #[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
    fn describe(parts: &Parts, route: Option<&'static str>, at: &Attempt) {
        #[cfg(feature = "tracing")]
        if crate::observe::door::listening() {
            crate::observe::door::http_request(
                parts.method.as_str(),
                parts.uri.host(),
                route,
                at.number(),
            );
        }
    }

    #[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
    fn describe_response<RB>(response: &Response<RB>) {
        #[cfg(feature = "tracing")]
        crate::observe::door::http_status(response.status().as_u16());
    }

    fn metric_started(_: &Parts) {}

    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    fn metric_attempt<RB>(
        parts: &Parts,
        route: Option<&'static str>,
        response: Option<&Response<RB>>,
        took: Duration,
    ) {
        #[cfg(feature = "metrics")]
        crate::observe::conventions::http_attempt(
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
    /// call (see [`wire`](crate::wire)).
    fn request_deadline(parts: &Parts) -> Option<Duration> {
        crate::wire::request_timeout(&parts.headers)
    }

    /// The attempt's remaining time as `retries-timeout-ms`.
    fn prepare(parts: &mut Parts, at: &Attempt) {
        crate::wire::send_timeout(&mut parts.headers, at.remaining());
    }

    fn classify<RB>(response: &Response<RB>) -> Option<Verdict> {
        let status = response.status();
        (status.is_client_error() || status.is_server_error())
            .then(|| crate::http::classify_response(status, response.headers()))
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
        fallback: &'static crate::observe::Name,
    ) -> &'static crate::observe::Name {
        // A method path names a bounded set (the service's methods); the
        // cap of `MAX_CALL_NAMES` holds against any other.
        crate::observe::call_names::grpc(parts.uri.path(), fallback)
    }

    fn body<B>(body: ReplayBody<B>) -> tonic::body::Body
    where
        B: Body + Unpin + Send + 'static,
        B::Error: Into<BoxError>,
    {
        tonic::body::Body::new(body)
    }

    #[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
    fn describe(parts: &Parts, _: Option<&'static str>, _: &Attempt) {
        #[cfg(feature = "tracing")]
        if crate::observe::door::listening() {
            crate::observe::door::grpc_request(parts.uri.path(), parts.uri.host());
        }
    }

    /// A trailers-only answer's `grpc-status`; the headers of a real
    /// response are the layer's success (`OK`: its status comes in the
    /// trailers, after the layer has answered); an HTTP error from
    /// something that is not a gRPC server, its HTTP status.
    #[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
    fn describe_response<RB>(response: &Response<RB>) {
        #[cfg(feature = "tracing")]
        match response.headers().get("grpc-status") {
            Some(code) => {
                let code = tonic::Code::from_bytes(code.as_bytes());
                crate::observe::door::grpc_status(code as i32, grpc_status_name(code));
            }
            None if response.status().is_success() => {
                crate::observe::door::grpc_status(0, "OK");
            }
            None => crate::observe::door::http_status(response.status().as_u16()),
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    fn metric_started(parts: &Parts) {
        #[cfg(feature = "metrics")]
        crate::observe::conventions::grpc_attempt_started(method_of(parts));
    }

    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    fn metric_attempt<RB>(
        parts: &Parts,
        _: Option<&'static str>,
        response: Option<&Response<RB>>,
        took: Duration,
    ) {
        #[cfg(feature = "metrics")]
        crate::observe::conventions::grpc_attempt(
            method_of(parts),
            response.map_or("UNAVAILABLE", answered_status),
            took,
        );
    }

    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    fn metric_call<RB>(
        parts: &Parts,
        answer: &Result<Response<RB>, BoxError>,
        took: Duration,
        attempts: u32,
        busy: Duration,
    ) {
        #[cfg(feature = "metrics")]
        {
            let status = match answer {
                Ok(response) => answered_status(response),
                Err(e) => e
                    .downcast_ref::<tonic::Status>()
                    .map_or("UNAVAILABLE", |s| grpc_status_name(s.code())),
            };
            crate::observe::conventions::grpc_call(
                method_of(parts),
                status,
                took,
                attempts,
                took.saturating_sub(busy),
            );
        }
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
            .get(GRPC_TIMEOUT)
            .and_then(|v| v.to_str().ok())
            .and_then(crate::tonic::parse_grpc_timeout)
    }

    fn prepare(parts: &mut Parts, at: &Attempt) {
        parts
            .headers
            .insert(GRPC_TIMEOUT, grpc_timeout(at.remaining()));
        if at.number() > 1 {
            parts.headers.insert(
                crate::tonic::PREVIOUS_ATTEMPTS,
                HeaderValue::from(at.number() - 1),
            );
        }
    }

    fn classify<RB>(response: &Response<RB>) -> Option<Verdict> {
        use crate::tonic::{PUSHBACK, classify_code, pushback_of};
        let headers = response.headers();
        match headers.get("grpc-status") {
            // Trailers-only: the call ended with this status.
            Some(code) => {
                let code = tonic::Code::from_bytes(code.as_bytes());
                (code != tonic::Code::Ok).then(|| {
                    let pushback =
                        pushback_of(headers.get_all(PUSHBACK).iter().map(|v| v.to_str().ok()));
                    classify_code(code, false, pushback)
                })
            }
            // Headers of a real response: committed (gRFC A6), unless the
            // HTTP status says no gRPC server answered.
            None if response.status().is_success() => None,
            None => Some(crate::http::classify_response(response.status(), headers)),
        }
    }

    fn stopped(stopped: Stopped) -> BoxError {
        Box::new(tonic::Status::from(stopped))
    }
}

#[cfg(feature = "tonic")]
const GRPC_TIMEOUT: &str = "grpc-timeout";

/// The method of a gRPC request, as gRFC A66's `grpc.method` writes it
/// (`package.Service/Method`).
#[cfg(all(feature = "tonic", feature = "metrics"))]
fn method_of(parts: &Parts) -> &str {
    let path = parts.uri.path();
    path.strip_prefix('/').unwrap_or(path)
}

/// The status a gRPC response's headers say: a trailers-only answer's
/// `grpc-status`, else `OK` for the headers of a real response (its status
/// comes in the trailers, after the layer answered), else `UNAVAILABLE`
/// for an HTTP error from something that is not a gRPC server.
#[cfg(all(feature = "tonic", feature = "metrics"))]
fn answered_status<RB>(response: &Response<RB>) -> &'static str {
    match response.headers().get("grpc-status") {
        Some(code) => grpc_status_name(tonic::Code::from_bytes(code.as_bytes())),
        None if response.status().is_success() => "OK",
        None => "UNAVAILABLE",
    }
}

/// A gRPC status code's name, as gRFC A66's `grpc.status` writes it.
#[cfg(all(feature = "tonic", any(feature = "tracing", feature = "metrics")))]
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
    use crate::tonic::{PUSHBACK, Pushback, pushback_of};
    let headers = response.headers();
    let Some(code) = headers.get("grpc-status") else {
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
        match pushback_of(headers.get_all(PUSHBACK).iter().map(|v| v.to_str().ok())) {
            Pushback::None => Verdict::unknown(),
            Pushback::Pause(d) => Verdict::unknown().with_retry_after(d),
            Pushback::Stop => Verdict::server_refused(),
        },
    )
}
