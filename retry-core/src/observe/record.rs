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
