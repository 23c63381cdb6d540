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
//! (`super::Name`) builds the key it reports to, per report: without an
//! allocation on the happy path, with the hash. The keys of the failure
//! paths, whose labels are known only then, are built when reported.
//!
//! Each key is named once, in [`Which`]. The types exist without the
//! `metrics` feature, empty, so that the code `#[retryable]` generates is
//! the same either way.

#[cfg(feature = "metrics")]
use metrics::{Key, Label};

/// The labels of one name's happy-path keys: a [`Name`](super::Name)'s
/// own, and what its [`Keys`] are made over. Not public API.
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

/// One key of the happy path (and of a resumed stream).
#[cfg(feature = "metrics")]
#[derive(Debug, Clone, Copy)]
pub(crate) enum Which {
    CallStarted,
    AttemptStarted,
    DeadlineAtEntry,
    PauseDuration,
    CallRetries,
    AttemptOk,
    CompletedOk,
    DurationOk,
    StreamDelivered,
    StreamSkipped,
    StreamReopened,
}

#[cfg(feature = "metrics")]
impl Which {
    /// Every key, in the order of [`Keys`]'s table.
    #[cfg(test)]
    const ALL: [Self; 11] = [
        Self::CallStarted,
        Self::AttemptStarted,
        Self::DeadlineAtEntry,
        Self::PauseDuration,
        Self::CallRetries,
        Self::AttemptOk,
        Self::CompletedOk,
        Self::DurationOk,
        Self::StreamDelivered,
        Self::StreamSkipped,
        Self::StreamReopened,
    ];

    /// The metric's name.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Self::CallStarted => "retry.call.started",
            Self::AttemptStarted => "retry.attempt.started",
            Self::DeadlineAtEntry => "retry.call.deadline_at_entry",
            Self::PauseDuration => "retry.pause.duration",
            Self::CallRetries => "retry.call.retries",
            Self::AttemptOk => "retry.attempt.duration",
            Self::CompletedOk => "retry.call.completed",
            Self::DurationOk => "retry.call.duration",
            Self::StreamDelivered => "retry.stream.delivered",
            Self::StreamSkipped => "retry.stream.skipped",
            Self::StreamReopened => "retry.stream.reopened",
        }
    }

    /// The key over `labels`.
    pub(crate) const fn key(self, labels: &'static Labels) -> Key {
        let labels: &'static [Label] = match self {
            Self::AttemptOk => &labels.ok_verdict,
            Self::CompletedOk | Self::DurationOk => &labels.ok_outcome,
            _ => &labels.function,
        };
        Key::from_static_parts(self.name(), labels)
    }
}

/// The keys of one name's happy path, by [`Which`]. Not public API.
#[doc(hidden)]
#[derive(Debug)]
pub struct Keys {
    #[cfg(feature = "metrics")]
    keys: [Key; 11],
}

impl Keys {
    /// The keys over `labels` (a `static`'s, or a name's that lives as
    /// long).
    #[must_use]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub const fn new(labels: &'static Labels) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            keys: [
                Which::CallStarted.key(labels),
                Which::AttemptStarted.key(labels),
                Which::DeadlineAtEntry.key(labels),
                Which::PauseDuration.key(labels),
                Which::CallRetries.key(labels),
                Which::AttemptOk.key(labels),
                Which::CompletedOk.key(labels),
                Which::DurationOk.key(labels),
                Which::StreamDelivered.key(labels),
                Which::StreamSkipped.key(labels),
                Which::StreamReopened.key(labels),
            ],
        }
    }

    /// The key `which`.
    #[cfg(feature = "metrics")]
    #[inline]
    pub(crate) fn get(&self, which: Which) -> &Key {
        &self.keys[which as usize]
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
        assert_eq!(
            *KEYS.get(Which::CallStarted),
            made,
            "same name, labels and hash"
        );
        assert_eq!(
            labels(KEYS.get(Which::CompletedOk)),
            "function=f,outcome=ok"
        );
        assert_eq!(labels(KEYS.get(Which::AttemptOk)), "function=f,verdict=ok");
        assert_eq!(KEYS.get(Which::DurationOk).name(), "retry.call.duration");
        assert_eq!(
            KEYS.get(Which::StreamReopened).name(),
            "retry.stream.reopened"
        );
    }

    #[test]
    fn each_key_sits_at_its_place_in_the_table() {
        for which in Which::ALL {
            assert_eq!(*KEYS.get(which), which.key(&LABELS), "{which:?}");
        }
    }
}
