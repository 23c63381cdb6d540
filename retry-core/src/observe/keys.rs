//! The metric keys of a call's happy path, made at compile time.
//!
//! A `metrics::Key` carries the hash of its name and labels, computed when
//! it is made: made per call, a successful call's seven keys cost ~1,200
//! instructions with no recorder installed (callgrind, the gRPC layer's
//! example). So the names the crate makes itself carry their keys, made
//! once: in a `static` for each `#[retryable]` function and for the calls of
//! [`call`](crate::call()) that set no name (all named `retries::call`), at
//! compile time; with each name a door makes for a route or a method, once
//! (and kept with it, as the name is). A name made with [`Name::new`]
//! (`super::Name`) builds its keys per report, as before: without an
//! allocation on the happy path, with the hash. The keys of the failure
//! paths, whose labels are known only then, are built when reported.
//!
//! The types exist without the `metrics` feature, empty, so that the code
//! `#[retryable]` generates is the same either way.

#[cfg(feature = "metrics")]
use metrics::{Key, Label};

/// The labels of one name's happy-path keys. Not public API.
#[doc(hidden)]
#[derive(Debug)]
pub struct Labels {
    #[cfg(feature = "metrics")]
    function: [Label; 1],
    #[cfg(feature = "metrics")]
    ok_outcome: [Label; 2],
    #[cfg(feature = "metrics")]
    ok_verdict: [Label; 2],
}

impl Labels {
    /// The labels of the name `function`.
    #[must_use]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub const fn new(function: &'static str) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            function: [Label::from_static_parts("function", function)],
            #[cfg(feature = "metrics")]
            ok_outcome: [
                Label::from_static_parts("function", function),
                Label::from_static_parts("outcome", "ok"),
            ],
            #[cfg(feature = "metrics")]
            ok_verdict: [
                Label::from_static_parts("function", function),
                Label::from_static_parts("verdict", "ok"),
            ],
        }
    }
}

/// The keys of one name's happy path (and of its streams). Not public API.
#[doc(hidden)]
#[derive(Debug)]
pub struct Keys {
    #[cfg(feature = "metrics")]
    pub(crate) call_started: Key,
    #[cfg(feature = "metrics")]
    pub(crate) attempt_started: Key,
    #[cfg(feature = "metrics")]
    pub(crate) deadline_at_entry: Key,
    #[cfg(feature = "metrics")]
    pub(crate) pause_duration: Key,
    #[cfg(feature = "metrics")]
    pub(crate) call_retries: Key,
    #[cfg(feature = "metrics")]
    pub(crate) attempt_ok: Key,
    #[cfg(feature = "metrics")]
    pub(crate) completed_ok: Key,
    #[cfg(feature = "metrics")]
    pub(crate) duration_ok: Key,
    #[cfg(feature = "metrics")]
    #[cfg_attr(not(feature = "stream"), allow(dead_code))]
    pub(crate) stream_delivered: Key,
    #[cfg(feature = "metrics")]
    #[cfg_attr(not(feature = "stream"), allow(dead_code))]
    pub(crate) stream_skipped: Key,
    #[cfg(feature = "metrics")]
    #[cfg_attr(not(feature = "stream"), allow(dead_code))]
    pub(crate) stream_reopened: Key,
}

impl Keys {
    /// The keys over `labels` (a `static`'s, or a name's that lives as
    /// long).
    #[must_use]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub const fn new(labels: &'static Labels) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            call_started: Key::from_static_parts("retry.call.started", &labels.function),
            #[cfg(feature = "metrics")]
            attempt_started: Key::from_static_parts("retry.attempt.started", &labels.function),
            #[cfg(feature = "metrics")]
            deadline_at_entry: Key::from_static_parts(
                "retry.call.deadline_at_entry",
                &labels.function,
            ),
            #[cfg(feature = "metrics")]
            pause_duration: Key::from_static_parts("retry.pause.duration", &labels.function),
            #[cfg(feature = "metrics")]
            call_retries: Key::from_static_parts("retry.call.retries", &labels.function),
            #[cfg(feature = "metrics")]
            attempt_ok: Key::from_static_parts("retry.attempt.duration", &labels.ok_verdict),
            #[cfg(feature = "metrics")]
            completed_ok: Key::from_static_parts("retry.call.completed", &labels.ok_outcome),
            #[cfg(feature = "metrics")]
            duration_ok: Key::from_static_parts("retry.call.duration", &labels.ok_outcome),
            #[cfg(feature = "metrics")]
            stream_delivered: Key::from_static_parts("retry.stream.delivered", &labels.function),
            #[cfg(feature = "metrics")]
            stream_skipped: Key::from_static_parts("retry.stream.skipped", &labels.function),
            #[cfg(feature = "metrics")]
            stream_reopened: Key::from_static_parts("retry.stream.reopened", &labels.function),
        }
    }
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use super::*;

    static LABELS: Labels = Labels::new("f");
    static KEYS: Keys = Keys::new(&LABELS);

    fn labels(k: &Key) -> String {
        k.labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect::<Vec<_>>()
            .join(",")
    }

    #[test]
    fn the_keys_made_at_compile_time_are_those_made_at_run_time() {
        let f = [Label::from_static_parts("function", "f")];
        let made = Key::from_parts("retry.call.started", f.to_vec());
        assert_eq!(KEYS.call_started, made, "same name, labels and hash");
        assert_eq!(labels(&KEYS.completed_ok), "function=f,outcome=ok");
        assert_eq!(labels(&KEYS.attempt_ok), "function=f,verdict=ok");
        assert_eq!(KEYS.duration_ok.name(), "retry.call.duration");
        assert_eq!(KEYS.stream_reopened.name(), "retry.stream.reopened");
    }
}
