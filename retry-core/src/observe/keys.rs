//! The metric keys of one [`Name`](super::Name), made once, at its first
//! report, and kept with the name: a call then builds no key and hashes no
//! label, whichever recorder (or none) is installed. A `metrics::Key`
//! carries the hash of its name and labels, computed when it is made: made
//! per call, seven keys cost a successful call ~1,500 instructions with no
//! recorder installed (callgrind, the gRPC layer's example). Handles are
//! not kept: a recorder can change (a local recorder in a test), a key
//! cannot.

use metrics::{Key, Label};

use super::observer::End;
use crate::failure::Reason;
#[cfg(test)]
use crate::verdict::VerdictKind;

const REASONS: [Reason; 9] = [
    Reason::Permanent,
    Reason::Exhausted,
    Reason::DeadlineExceeded,
    Reason::PauseExceedsDeadline,
    Reason::BudgetExhausted,
    Reason::CircuitOpen,
    Reason::UnknownOutcome,
    Reason::Saturated,
    Reason::Throttled,
];

/// `Ok` at 0, each reason after it, in the order of [`REASONS`].
const fn outcome_index(outcome: Result<(), Reason>) -> usize {
    match outcome {
        Ok(()) => 0,
        Err(r) => 1 + reason_index(r),
    }
}

const fn reason_index(r: Reason) -> usize {
    match r {
        Reason::Permanent => 0,
        Reason::Exhausted => 1,
        Reason::DeadlineExceeded => 2,
        Reason::PauseExceedsDeadline => 3,
        Reason::BudgetExhausted => 4,
        Reason::CircuitOpen => 5,
        Reason::UnknownOutcome => 6,
        Reason::Saturated => 7,
        Reason::Throttled => 8,
    }
}

/// Every key a call or a stream under one name reports to.
#[derive(Debug)]
pub(crate) struct Keys {
    pub(crate) call_started: Key,
    pub(crate) attempt_started: Key,
    pub(crate) deadline_at_entry: Key,
    pub(crate) pause_duration: Key,
    pub(crate) call_retries: Key,
    #[cfg_attr(not(feature = "stream"), allow(dead_code))]
    pub(crate) stream_delivered: Key,
    #[cfg_attr(not(feature = "stream"), allow(dead_code))]
    pub(crate) stream_skipped: Key,
    #[cfg_attr(not(feature = "stream"), allow(dead_code))]
    pub(crate) stream_reopened: Key,
    attempt_duration: [Key; 5],
    call_completed: [Key; 10],
    call_duration: [Key; 10],
    call_refused: [Key; 9],
    stopped_early: [Key; 9],
}

impl Keys {
    /// The keys of the name `function`.
    #[cold]
    pub(crate) fn new(function: &'static str) -> Self {
        let only = |name: &'static str| {
            Key::from_parts(name, vec![Label::from_static_parts("function", function)])
        };
        let with = |name: &'static str, label: &'static str, value: &'static str| {
            Key::from_parts(
                name,
                vec![
                    Label::from_static_parts("function", function),
                    Label::from_static_parts(label, value),
                ],
            )
        };
        let outcomes = |name| {
            std::array::from_fn(|i| {
                let outcome = if i == 0 {
                    "ok"
                } else {
                    REASONS[i - 1].as_str()
                };
                with(name, "outcome", outcome)
            })
        };
        let reasons = |name| std::array::from_fn(|i| with(name, "reason", REASONS[i].as_str()));
        Self {
            call_started: only("retry.call.started"),
            attempt_started: only("retry.attempt.started"),
            deadline_at_entry: only("retry.call.deadline_at_entry"),
            pause_duration: only("retry.pause.duration"),
            call_retries: only("retry.call.retries"),
            stream_delivered: only("retry.stream.delivered"),
            stream_skipped: only("retry.stream.skipped"),
            stream_reopened: only("retry.stream.reopened"),
            attempt_duration: End::ALL
                .map(|end| with("retry.attempt.duration", "verdict", end.as_str())),
            call_completed: outcomes("retry.call.completed"),
            call_duration: outcomes("retry.call.duration"),
            call_refused: reasons("retry.call.refused"),
            stopped_early: reasons("retry.call.stopped_early"),
        }
    }

    pub(crate) fn attempt_duration(&self, end: End) -> &Key {
        &self.attempt_duration[end.index()]
    }

    pub(crate) fn call_completed(&self, outcome: Result<(), Reason>) -> &Key {
        &self.call_completed[outcome_index(outcome)]
    }

    pub(crate) fn call_duration(&self, outcome: Result<(), Reason>) -> &Key {
        &self.call_duration[outcome_index(outcome)]
    }

    pub(crate) fn call_refused(&self, reason: Reason) -> &Key {
        &self.call_refused[reason_index(reason)]
    }

    pub(crate) fn stopped_early(&self, reason: Reason) -> &Key {
        &self.stopped_early[reason_index(reason)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_carries_its_labels() {
        let keys = Keys::new("f");
        let labels = |k: &Key| {
            k.labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect::<Vec<_>>()
                .join(",")
        };
        assert_eq!(labels(&keys.call_started), "function=f");
        assert_eq!(
            labels(keys.attempt_duration(End::CutOff)),
            "function=f,verdict=cut_off"
        );
        assert_eq!(
            labels(keys.attempt_duration(End::Failed(VerdictKind::Unknown))),
            "function=f,verdict=unknown"
        );
        for r in REASONS {
            assert_eq!(
                labels(keys.call_completed(Err(r))),
                format!("function=f,outcome={}", r.as_str())
            );
            assert_eq!(keys.call_duration(Err(r)).name(), "retry.call.duration");
            assert_eq!(
                labels(keys.stopped_early(r)),
                format!("function=f,reason={}", r.as_str())
            );
            assert_eq!(keys.call_refused(r).name(), "retry.call.refused");
        }
        assert_eq!(labels(keys.call_completed(Ok(()))), "function=f,outcome=ok");
    }
}
