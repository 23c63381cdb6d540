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

use crate::verdict::VerdictKind;

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

/// How an attempt ended, as the `verdict` label of
/// `retry.attempt.duration` says it (and the attempt's span).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// It succeeded.
    Ok,
    /// It failed and was classified so.
    Failed(VerdictKind),
    /// Its time limit cut it off.
    CutOff,
}

impl End {
    #[cfg_attr(not(any(feature = "tracing", feature = "metrics")), allow(dead_code))]
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failed(kind) => kind.as_str(),
            Self::CutOff => "cut_off",
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

/// One key of a failure path: its label (a verdict, a reason) is known
/// only when it is reported.
#[cfg(feature = "metrics")]
#[derive(Debug, Clone, Copy)]
pub(crate) enum Failing {
    /// `retry.attempt.duration` of an attempt that failed, by how.
    Attempt(End),
    /// `retry.call.completed` of a call that stopped, by why.
    Completed(crate::failure::Reason),
    /// `retry.call.duration` of a call that stopped.
    Duration(crate::failure::Reason),
    /// `retry.call.refused`: stopped before its first attempt.
    Refused(crate::failure::Reason),
    /// `retry.call.stopped_early`: stopped with retries left.
    StoppedEarly(crate::failure::Reason),
}

/// The reasons a call stops, as many as [`Reason`](crate::failure::Reason)
/// has.
#[cfg(feature = "metrics")]
const REASONS: usize = 11;

/// The ways an attempt ends, as many as [`End`] has (`Ok` included, though
/// its key is the happy path's: a place of its own, never shared).
#[cfg(feature = "metrics")]
const ENDS: usize = 5;

/// The failure keys of one name: one per way an attempt ends, and four
/// metrics by each of the [`REASONS`].
#[cfg(feature = "metrics")]
const FAILING: usize = ENDS + 4 * REASONS;

#[cfg(feature = "metrics")]
impl Failing {
    /// Its place in [`FailureKeys`].
    fn slot(self) -> usize {
        let reason = |r: crate::failure::Reason| {
            use crate::failure::Reason as R;
            match r {
                R::Permanent => 0,
                R::Exhausted => 1,
                R::DeadlineExceeded => 2,
                R::PauseExceedsDeadline => 3,
                R::BudgetExhausted => 4,
                R::CircuitOpen => 5,
                R::UnknownOutcome => 6,
                R::Saturated => 7,
                R::Throttled => 8,
                R::RateLimited => 9,
                R::OverQuota => 10,
            }
        };
        match self {
            Self::Attempt(End::Failed(VerdictKind::NotExecuted)) => 0,
            Self::Attempt(End::Failed(VerdictKind::Unknown)) => 1,
            Self::Attempt(End::Failed(VerdictKind::Permanent)) => 2,
            Self::Attempt(End::CutOff) => 3,
            Self::Attempt(End::Ok) => 4,
            Self::Completed(r) => ENDS + reason(r),
            Self::Duration(r) => ENDS + REASONS + reason(r),
            Self::Refused(r) => ENDS + 2 * REASONS + reason(r),
            Self::StoppedEarly(r) => ENDS + 3 * REASONS + reason(r),
        }
    }

    /// The key for the name `function`.
    fn key(self, function: &'static str) -> Key {
        let (name, label, value) = match self {
            Self::Attempt(end) => (Which::AttemptOk.name(), "verdict", end.as_str()),
            Self::Completed(r) => (Which::CompletedOk.name(), "outcome", r.as_str()),
            Self::Duration(r) => (Which::DurationOk.name(), "outcome", r.as_str()),
            Self::Refused(r) => ("retry.call.refused", "reason", r.as_str()),
            Self::StoppedEarly(r) => ("retry.call.stopped_early", "reason", r.as_str()),
        };
        Key::from_parts(
            name,
            vec![
                Label::from_static_parts("function", function),
                Label::from_static_parts(label, value),
            ],
        )
    }
}

/// The keys of one name's failure paths, each made the first time it is
/// reported and kept with the name: a failed call builds no key and
/// allocates nothing for its metrics after its name's first such report
/// (the table itself is made at the name's first failure).
#[cfg(feature = "metrics")]
pub(crate) struct FailureKeys {
    slots: [std::sync::OnceLock<Key>; FAILING],
}

#[cfg(feature = "metrics")]
impl FailureKeys {
    fn new() -> Self {
        Self {
            slots: std::array::from_fn(|_| std::sync::OnceLock::new()),
        }
    }
}

#[cfg(feature = "metrics")]
impl std::fmt::Debug for FailureKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let made = self.slots.iter().filter(|k| k.get().is_some()).count();
        f.debug_struct("FailureKeys").field("made", &made).finish()
    }
}

/// The key `which` of the name `of`, made now if it is its first report.
#[cfg(feature = "metrics")]
pub(crate) fn failing(of: &'static super::Name, which: Failing) -> &'static Key {
    let table = of.failure_keys.get_or_init(|| Box::new(FailureKeys::new()));
    table.slots[which.slot()].get_or_init(|| which.key(of.as_str()))
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
    fn each_failure_key_has_a_place_of_its_own() {
        use crate::failure::Reason;
        let reasons = [
            Reason::Permanent,
            Reason::Exhausted,
            Reason::DeadlineExceeded,
            Reason::PauseExceedsDeadline,
            Reason::BudgetExhausted,
            Reason::CircuitOpen,
            Reason::UnknownOutcome,
            Reason::Saturated,
            Reason::Throttled,
            Reason::RateLimited,
            Reason::OverQuota,
        ];
        assert_eq!(reasons.len(), REASONS);
        let ends = [
            End::Failed(VerdictKind::NotExecuted),
            End::Failed(VerdictKind::Unknown),
            End::Failed(VerdictKind::Permanent),
            End::CutOff,
            End::Ok,
        ];
        assert_eq!(ends.len(), ENDS);
        let mut all: Vec<Failing> = ends.into_iter().map(Failing::Attempt).collect();
        for r in reasons {
            all.extend([
                Failing::Completed(r),
                Failing::Duration(r),
                Failing::Refused(r),
                Failing::StoppedEarly(r),
            ]);
        }
        let mut seen = std::collections::HashMap::new();
        for which in all {
            let key = which.key("f");
            if let Some(other) = seen.insert(which.slot(), key.clone()) {
                panic!("{which:?} shares its place with {other:?}");
            }
        }
        assert_eq!(seen.len(), FAILING);
        let name: &'static super::super::Name = Box::leak(Box::new(super::super::Name::new("g")));
        let key = failing(name, Failing::Completed(Reason::Exhausted));
        assert_eq!(labels(key), "function=g,outcome=exhausted");
        assert_eq!(key.name(), "retry.call.completed");
        assert!(
            std::ptr::eq(key, failing(name, Failing::Completed(Reason::Exhausted))),
            "made once, kept with the name"
        );
        let key = failing(name, Failing::Attempt(End::CutOff));
        assert_eq!(labels(key), "function=g,verdict=cut_off");
    }

    #[test]
    fn each_key_sits_at_its_place_in_the_table() {
        for which in Which::ALL {
            assert_eq!(*KEYS.get(which), which.key(&LABELS), "{which:?}");
        }
    }
}
