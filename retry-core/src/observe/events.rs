//! Events that belong to no call, named by the door that observed them (a
//! server layer's entries and refusals, a key store's answers, injected
//! faults): the generic hooks of `door::observe`.

use std::fmt;
use std::time::Duration;

#[cfg(feature = "metrics")]
use super::record::{count, dynamic, record};

/// How loud a door's event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Level {
    /// The door's ordinary work (a keyed request answered, a fault
    /// injected): DEBUG, never above it for a request that succeeds.
    Debug,
    /// Something that may cost the guarantee (a key record not stored):
    /// WARN.
    Warn,
}

#[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
pub(crate) fn event(
    level: Level,
    door: &'static str,
    message: &'static str,
    detail: &dyn fmt::Display,
) {
    #[cfg(feature = "tracing")]
    match level {
        Level::Debug => {
            tracing::debug!(target: "retries::door", door, detail = %detail, "{message}");
        }
        Level::Warn => {
            tracing::warn!(target: "retries::door", door, detail = %detail, "{message}");
        }
    }
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn counter(name: &'static str, labels: &[(&'static str, &'static str)]) {
    #[cfg(feature = "metrics")]
    count(&dynamic(name, labels));
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn seconds(
    name: &'static str,
    labels: &[(&'static str, &'static str)],
    value: Duration,
) {
    #[cfg(feature = "metrics")]
    record(&dynamic(name, labels), value.as_secs_f64());
}
