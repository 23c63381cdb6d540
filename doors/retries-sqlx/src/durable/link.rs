//! The link from a durable call's span to the trace that enqueued it
//! (feature `opentelemetry-0.33`).
//!
//! A link, not a parent: a call's attempts may run hours after the
//! enqueuing request's trace ended, in another process and more than once
//! (a claim per crash or requeue); OpenTelemetry's messaging conventions
//! link a consumer's processing span to the producer's context the same
//! way. Each claim's span is the root of a trace of its own whose attempt
//! spans nest in it, and carries the link.

/// Reads a W3C `traceparent` (`00-<32 hex trace id>-<16 hex span id>-<2 hex
/// flags>`, trace context level 1; a later version's extra fields are
/// ignored as the recommendation asks). `None` for anything else: version
/// `ff`, a zero trace or span id, wrong lengths, non-hex digits.
#[cfg_attr(not(feature = "opentelemetry-0.33"), allow(dead_code))]
pub(super) fn parse(traceparent: &str) -> Option<([u8; 16], [u8; 8], u8)> {
    let mut parts = traceparent.trim().split('-');
    let version = hex::<1>(parts.next()?)?[0];
    let trace = hex::<16>(parts.next()?)?;
    let span = hex::<8>(parts.next()?)?;
    let flags = hex::<1>(parts.next()?)?[0];
    let rest_ok = if version == 0 {
        parts.next().is_none()
    } else {
        version != 0xff
    };
    (rest_ok && trace != [0; 16] && span != [0; 8]).then_some((trace, span, flags))
}

fn hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let s = s.as_bytes();
    if s.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        // The recommendation asks for lowercase; upper is read, not written.
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut out = [0; N];
    for (o, pair) in out.iter_mut().zip(s.chunks_exact(2)) {
        *o = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// Links `span` to the enqueuing trace, when `traceparent` is one.
#[cfg(feature = "opentelemetry-0.33")]
pub(super) fn link(span: &tracing::Span, traceparent: Option<&str>) {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let Some((trace, id, flags)) = traceparent.and_then(parse) else {
        return;
    };
    span.add_link(SpanContext::new(
        TraceId::from_bytes(trace),
        SpanId::from_bytes(id),
        TraceFlags::new(flags),
        true,
        TraceState::default(),
    ));
}

/// Without the feature, the trace stays a field of the span.
#[cfg(not(feature = "opentelemetry-0.33"))]
pub(super) fn link(_: &tracing::Span, _: Option<&str>) {}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn a_traceparent_is_read_and_anything_else_is_not() {
        let t = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let (trace, span, flags) = parse(t).unwrap();
        assert_eq!(trace[..2], [0x4b, 0xf9]);
        assert_eq!(span[7], 0xb7);
        assert_eq!(flags, 1);
        // A later version may add fields; version 00 may not.
        assert!(parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x").is_some());
        for bad in [
            "",
            "00",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01é",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
