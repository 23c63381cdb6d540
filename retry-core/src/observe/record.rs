//! How this crate emits: metric keys counted and recorded under its
//! metadata, and the one WARN for a misconfiguration.

use crate::policy::PolicyError;

/// One WARN event for a configuration that breaks `rule`.
#[cold]
#[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
pub(crate) fn misconfigured(
    what: &'static str,
    rule: PolicyError,
    detail: std::fmt::Arguments<'_>,
) {
    #[cfg(feature = "tracing")]
    tracing::warn!(
        target: "retries",
        what,
        rule = rule.message(),
        detail = %detail,
        "misconfigured {what}: {}",
        rule.message()
    );
}

#[cfg(feature = "metrics")]
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new("retries", metrics::Level::INFO, Some(module_path!()));

/// Set by [`metrics_through_zero_sized_recorders`].
#[cfg(feature = "metrics")]
static ZERO_SIZED_LISTENS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Records every call's metrics through a zero-sized `metrics` recorder
/// too, for the rest of the process.
///
/// `metrics` 0.24 gives no way to ask whether a recorder is installed: with
/// none, its macros and [`metrics::with_recorder`] reach its no-op recorder,
/// a zero-sized type. A call therefore takes a zero-sized recorder for that
/// one and records nothing, reading no clock for its metrics: a ready call
/// with the feature compiled in and no recorder costs what it costs without
/// the feature (`tests/bench/README.md`, "The price of telemetry"), not the
/// ~1,000 instructions of its clock reads and seven look-ups. Every
/// recorder that keeps its figures in itself (the Prometheus exporter's,
/// `metrics-util`'s debugging and layered recorders, OpenTelemetry's
/// bridge) has a size and is recorded to. A recorder of your own with no
/// fields (one that keeps its figures in statics) is zero-sized as well:
/// call this once at start-up, before or after installing it, and it is
/// recorded to.
#[cfg(feature = "metrics")]
pub fn metrics_through_zero_sized_recorders() {
    ZERO_SIZED_LISTENS.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// A call starts: counts `key()` if a recorder listens (see
/// [`metrics_through_zero_sized_recorders`]), and says whether one does.
/// With none, one look-up of the recorder and no key made; the look-up
/// only asks the size, so that it is inlined whole.
// Inlined always, its count out of line: left to the compiler, the
// observer's constructor became a call of ~30 instructions on every call's
// path (callgrind, `scripts/telemetry.sh`).
#[cfg(feature = "metrics")]
#[allow(clippy::inline_always)]
#[inline(always)]
pub(super) fn started<K: std::ops::Deref<Target = metrics::Key>>(key: impl FnOnce() -> K) -> bool {
    let listens = metrics::with_recorder(|r| std::mem::size_of_val(r) != 0)
        || ZERO_SIZED_LISTENS.load(std::sync::atomic::Ordering::Relaxed);
    if listens {
        count_cold(&key());
    }
    listens
}

#[cfg(feature = "metrics")]
#[cold]
#[inline(never)]
fn count_cold(key: &metrics::Key) {
    count(key);
}

#[cfg(feature = "metrics")]
pub(super) fn count(key: &metrics::Key) {
    metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
}

#[cfg(feature = "metrics")]
pub(super) fn record(key: &metrics::Key, value: f64) {
    metrics::with_recorder(|r| r.register_histogram(key, &METADATA).record(value));
}

/// A key whose labels are known only now (the failure path).
#[cfg(feature = "metrics")]
pub(super) fn dynamic(name: &'static str, labels: &[(&'static str, &'static str)]) -> metrics::Key {
    metrics::Key::from_parts(
        name,
        labels
            .iter()
            .map(|(k, v)| metrics::Label::from_static_parts(k, v))
            .collect::<Vec<_>>(),
    )
}
