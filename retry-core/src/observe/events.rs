//! Events that belong to no call: a server layer's entries and refusals, and
//! the faults a fault-injection layer injects.

use std::time::Duration;

#[cfg(feature = "metrics")]
use super::record::{count, dynamic, record};

/// A server layer took a request whose caller left it `left`:
/// `retry.server.deadline_at_entry` (s).
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn server_entry(left: Duration) {
    #[cfg(feature = "metrics")]
    {
        // Made at compile time: a request builds no key.
        static KEY: metrics::Key = metrics::Key::from_static_name("retry.server.deadline_at_entry");
        record(&KEY, left.as_secs_f64());
    }
}

/// A server layer refused a request with too little time left, before its
/// handler: `retry.server.refused` (`reason` = `too_little_time`).
pub(crate) fn dedup(outcome: &'static str) {
    #[cfg(feature = "tracing")]
    tracing::debug!(target: "retries::dedup", outcome, "keyed request");
    #[cfg(feature = "metrics")]
    count(&dynamic("retry.server.dedup", &[("outcome", outcome)]));
    #[cfg(not(any(feature = "tracing", feature = "metrics")))]
    let _ = outcome;
}

pub(crate) fn dedup_store_failed(step: &'static str, error: &dyn std::error::Error) {
    #[cfg(feature = "tracing")]
    tracing::warn!(target: "retries::dedup", step, error = %error, "idempotency store failed");
    #[cfg(not(feature = "tracing"))]
    let _ = (step, error);
}

pub(crate) fn server_refused() {
    #[cfg(feature = "metrics")]
    {
        static KEY: metrics::Key =
            metrics::Key::from_static_parts("retry.server.refused", &SERVER_REFUSED);
        count(&KEY);
    }
}

#[cfg(feature = "metrics")]
static SERVER_REFUSED: [metrics::Label; 1] = [metrics::Label::from_static_parts(
    "reason",
    "too_little_time",
)];

/// A fault injected (`observed` false) or one that took effect: a DEBUG
/// event (target `retries::chaos`) and `retry.chaos.injected` /
/// `retry.chaos.observed` by `kind`.
#[cfg_attr(
    not(all(feature = "metrics", feature = "tracing")),
    allow(unused_variables)
)]
pub(crate) fn fault(kind: &'static str, observed: bool, request: &str) {
    #[cfg(feature = "tracing")]
    if observed {
        tracing::debug!(target: "retries::chaos", kind, "fault took effect");
    } else {
        tracing::debug!(target: "retries::chaos", kind, request, "fault injected");
    }
    #[cfg(feature = "metrics")]
    count(&dynamic(
        if observed {
            "retry.chaos.observed"
        } else {
            "retry.chaos.injected"
        },
        &[("kind", kind)],
    ));
}
