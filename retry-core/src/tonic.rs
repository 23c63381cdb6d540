//! gRPC with `tonic` 0.14 (feature `tonic-0.14`): status classification, server
//! pushback, deadlines across services.
//!
//! # Status table
//!
//! Following the gRPC status-code guidance (which codes a client may retry) and
//! the question this library adds: *may the work have happened?*
//!
//! | code | verdict | why |
//! |---|---|---|
//! | `RESOURCE_EXHAUSTED` | `NotExecuted` (pushback honoured) | a quota or admission check refused the call before the handler ran |
//! | `UNAVAILABLE`, transport proves nothing was sent | `NotExecuted` | the connection was refused: no request left the client |
//! | `UNAVAILABLE` otherwise | `Unknown` | the server (or a proxy) may have failed after the handler ran |
//! | `DEADLINE_EXCEEDED` | `Unknown` | the call timed out somewhere; the handler may have finished |
//! | `INTERNAL`, `UNKNOWN`, `DATA_LOSS` | `Permanent` | the handler ran and failed; the cause does not go away by itself |
//! | `ABORTED` | `Permanent` | a concurrency conflict: retry the whole transaction (read, decide, write), not the RPC |
//! | `CANCELLED` | `Permanent` | the caller left |
//! | `INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`, `PERMISSION_DENIED`, `UNAUTHENTICATED`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `UNIMPLEMENTED` | `Permanent` | the request is wrong, or not allowed: repeating it changes nothing |
//! | `OK` | `Permanent` | not an error |
//!
//! # Pushback
//!
//! A server answers with the trailer `grpc-retry-pushback-ms` (gRFC A6): a
//! single non-negative integer is the pause before the next attempt; a
//! negative, malformed or repeated value means "do not retry", and the call
//! stops ([`Verdict::server_refused`]).
//!
//! # Deadlines across services
//!
//! * client: [`request`] builds a `tonic::Request` whose `grpc-timeout` is the
//!   attempt's remaining time (its deadline is already net of the caller's
//!   reserve), and which carries `grpc-previous-rpc-attempts` on retries;
//! * server: the server layer of `retries-tower` (`ServerLayer::grpc()`)
//!   turns an incoming `grpc-timeout` into the [`scope`](crate::scope) of the
//!   handler, so retried calls the handler makes are bounded by the caller's
//!   deadline, and marks an answer whose retried calls gave up with
//!   `grpc-retry-pushback-ms: -1` (see [`wire`](crate::wire)).

use std::time::Duration;

#[cfg(test)]
use crate::wire::parse_grpc_timeout;

use tonic::{Code, Status};

use crate::attempt::Attempt;
use crate::failure::{Reason, Stopped};
use crate::verdict::{Classify, Verdict, classify_chain};

/// The metadata key of server pushback (gRFC A6): the wire's
/// [`GRPC_PUSHBACK`](crate::wire::GRPC_PUSHBACK), named here for tonic's
/// metadata.
pub const PUSHBACK: &str = crate::wire::GRPC_PUSHBACK;
/// The metadata key counting earlier attempts (gRFC A6).
pub const PREVIOUS_ATTEMPTS: &str = "grpc-previous-rpc-attempts";

/// What a status's pushback says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushback {
    /// No pushback.
    None,
    /// Wait this long before the next attempt.
    Pause(Duration),
    /// The server asks not to be retried (negative, malformed or repeated value).
    Stop,
}

/// Read `grpc-retry-pushback-ms` from a status's metadata.
#[must_use]
pub fn pushback(status: &Status) -> Pushback {
    pushback_of(
        status
            .metadata()
            .get_all(PUSHBACK)
            .iter()
            .map(|v| v.to_str().ok()),
    )
}

/// The pushback said by the values of `grpc-retry-pushback-ms` (`None`: a
/// value that is not text), for a door that reads them from headers.
pub fn pushback_of<'a>(mut values: impl Iterator<Item = Option<&'a str>>) -> Pushback {
    let Some(value) = values.next() else {
        return Pushback::None;
    };
    if values.next().is_some() {
        return Pushback::Stop;
    }
    match value.map(str::trim) {
        Some(v) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => {
            v.parse::<u64>().map_or(Pushback::Stop, |ms| {
                Pushback::Pause(Duration::from_millis(ms))
            })
        }
        _ => Pushback::Stop,
    }
}

/// The verdict for a status (see the [module docs](self)).
#[must_use]
pub fn classify_status(status: &Status) -> Verdict {
    if let Some(stopped) = stopped_inside(status) {
        return stopped.classify();
    }
    classify_code(status.code(), never_sent(status), pushback(status))
}

/// The table of the [module docs](self) for a code, whether the transport
/// proved nothing was sent, and the pushback, for a door that reads a
/// status from headers (a trailers-only answer) rather than a [`Status`].
#[must_use]
pub fn classify_code(code: Code, never_sent: bool, pushback: Pushback) -> Verdict {
    let verdict = match code {
        Code::ResourceExhausted => Verdict::not_executed().with_overload(),
        Code::Unavailable if never_sent => Verdict::not_executed(),
        Code::Unavailable | Code::DeadlineExceeded => Verdict::unknown(),
        _ => Verdict::permanent(),
    };
    if !verdict.is_transient() {
        return verdict;
    }
    match pushback {
        Pushback::None => verdict,
        Pushback::Pause(d) => verdict.with_retry_after(d),
        Pushback::Stop => Verdict::server_refused(),
    }
}

/// The [`Stopped`] a status carries: an inner retried call gave up, and an
/// outer loop in the same process must not retry it (unless it was refused a
/// concurrency slot: then nothing was sent).
fn stopped_inside(status: &Status) -> Option<&Stopped> {
    let mut cur = std::error::Error::source(status);
    while let Some(e) = cur {
        if let Some(s) = e.downcast_ref::<Stopped>() {
            return Some(s);
        }
        cur = e.source();
    }
    None
}

/// `true` when the status's source chain shows the connection was never made.
fn never_sent(status: &Status) -> bool {
    std::error::Error::source(status)
        .and_then(classify_chain)
        .is_some_and(|v| v.kind() == crate::VerdictKind::NotExecuted)
}

impl Classify for Status {
    fn classify(&self) -> Verdict {
        classify_status(self)
    }
}

/// A stopped call as a status: the deadline as `DEADLINE_EXCEEDED`, an open
/// circuit or an exhausted budget as `UNAVAILABLE` (the service is being
/// spared, not down), an unknown outcome as `UNKNOWN`, attempts exhausted as
/// `UNAVAILABLE`, a call refused a concurrency slot as `RESOURCE_EXHAUSTED`,
/// a pause that could not fit before the deadline as `UNAVAILABLE` (a door
/// that has the last status returns that status itself; a `Stopped` for it
/// exists only when the last attempt was cut off without one).
/// The message names the reason, and the `Stopped` stays
/// attached as the status's source, so an outer loop in the same process
/// classifies it as permanent. A call that gave up after retrying (attempts
/// or budget exhausted, breaker open, deadline) also carries
/// `grpc-retry-pushback-ms: -1`, gRFC A6's "do not retry", so a caller across
/// the network (of this crate or any A6 client) does not retry it either.
impl From<Stopped> for Status {
    fn from(s: Stopped) -> Self {
        let code = match s.reason() {
            Reason::DeadlineExceeded => Code::DeadlineExceeded,
            Reason::UnknownOutcome => Code::Unknown,
            Reason::Permanent => Code::Internal,
            Reason::Saturated => Code::ResourceExhausted,
            _ => Code::Unavailable,
        };
        let message = match s.reason() {
            Reason::CircuitOpen => {
                format!("{s} (the circuit breaker is open: the service is being spared)")
            }
            _ => s.to_string(),
        };
        let gave_up = s.reason().gave_up_retrying(s.attempts());
        let mut status = Status::new(code, message);
        if gave_up {
            // Retried already: gRFC A6's "do not retry" for the caller.
            status
                .metadata_mut()
                .insert(PUSHBACK, tonic::metadata::MetadataValue::from_static("-1"));
        }
        status.set_source(std::sync::Arc::new(s));
        status
    }
}

/// A request for one attempt: `grpc-timeout` is the attempt's remaining time
/// (net of the caller's reserve), and a retry carries
/// `grpc-previous-rpc-attempts`.
pub fn request<T>(at: &Attempt, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(at.remaining());
    if at.number() > 1 {
        request
            .metadata_mut()
            .insert(PREVIOUS_ATTEMPTS, (at.number() - 1).into());
    }
    request
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::VerdictKind;
    use tonic::metadata::MetadataMap;

    fn with_pushback(code: Code, values: &[&str]) -> Status {
        let mut md = MetadataMap::new();
        for v in values {
            md.append(PUSHBACK, v.parse().unwrap());
        }
        Status::with_metadata(code, "x", md)
    }

    #[test]
    fn a_stop_after_retrying_says_do_not_retry_across_the_wire() {
        let as_status = |reason| Status::from(Stopped::new(reason, 3, Duration::from_millis(9)));
        for reason in [
            Reason::Exhausted,
            Reason::BudgetExhausted,
            Reason::CircuitOpen,
            Reason::DeadlineExceeded,
        ] {
            assert_eq!(pushback(&as_status(reason)), Pushback::Stop, "{reason:?}");
        }
        for reason in [Reason::Permanent, Reason::UnknownOutcome, Reason::Saturated] {
            assert_eq!(pushback(&as_status(reason)), Pushback::None, "{reason:?}");
        }
        // In this process the `Stopped` inside still decides (permanent).
        assert_eq!(
            as_status(Reason::Exhausted).classify().kind(),
            VerdictKind::Permanent
        );
    }

    #[test]
    fn table() {
        use VerdictKind::*;
        for (code, kind) in [
            (Code::ResourceExhausted, NotExecuted),
            (Code::Unavailable, Unknown),
            (Code::DeadlineExceeded, Unknown),
            (Code::Internal, Permanent),
            (Code::Unknown, Permanent),
            (Code::DataLoss, Permanent),
            (Code::Aborted, Permanent),
            (Code::Cancelled, Permanent),
            (Code::InvalidArgument, Permanent),
            (Code::NotFound, Permanent),
            (Code::AlreadyExists, Permanent),
            (Code::PermissionDenied, Permanent),
            (Code::Unauthenticated, Permanent),
            (Code::FailedPrecondition, Permanent),
            (Code::OutOfRange, Permanent),
            (Code::Unimplemented, Permanent),
        ] {
            assert_eq!(Status::new(code, "x").classify().kind(), kind, "{code:?}");
        }
    }

    #[test]
    fn unavailable_from_a_refused_connection_was_never_sent() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let s = Status::from_error(Box::new(refused));
        assert_eq!(
            s.code(),
            Code::Unknown,
            "tonic maps a bare io error to UNKNOWN"
        );
        let mut s = Status::new(Code::Unavailable, "connect failed");
        s.set_source(std::sync::Arc::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        assert_eq!(s.classify().kind(), VerdictKind::NotExecuted);
    }

    #[test]
    fn pushback_rules() {
        let v = with_pushback(Code::ResourceExhausted, &["250"]).classify();
        assert_eq!(
            (v.kind(), v.retry_after()),
            (VerdictKind::NotExecuted, Some(Duration::from_millis(250)))
        );
        for bad in [
            &["-1"][..],
            &["soon"],
            &["1", "2"],
            &[""],
            &["99999999999999999999999"],
        ] {
            let v = with_pushback(Code::Unavailable, bad).classify();
            assert!(v.is_server_refusal(), "{bad:?}");
        }
        // Pushback on a permanent status changes nothing.
        assert!(
            !with_pushback(Code::Internal, &["-1"])
                .classify()
                .is_server_refusal()
        );
    }

    #[test]
    fn grpc_timeout_values() {
        assert_eq!(parse_grpc_timeout("1S"), Some(Duration::from_secs(1)));
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_hours(2)));
        for bad in ["", "S", "123456789S", "1x", "-1S", "1.5S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad}");
        }
    }

    #[test]
    fn stopped_maps_to_a_status() {
        let s: Status = Stopped::new(Reason::DeadlineExceeded, 2, Duration::from_secs(2)).into();
        assert_eq!(s.code(), Code::DeadlineExceeded);
        let s: Status = Stopped::new(Reason::CircuitOpen, 0, Duration::ZERO).into();
        assert_eq!(s.code(), Code::Unavailable);
        assert!(s.message().contains("circuit breaker"));
        // A stopped call's status is never retried by an outer layer.
        let s: Status = Stopped::new(Reason::Exhausted, 3, Duration::ZERO).into();
        assert_eq!(s.code(), Code::Unavailable);
        assert_eq!(s.classify().kind(), VerdictKind::Permanent);
    }
}
