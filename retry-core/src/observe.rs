//! What a retried call tells the outside world: `tracing` spans and events
//! (feature `tracing`, on by default) and `metrics` (feature `metrics`).
//!
//! # Tracing
//!
//! | what | level | name / message | fields |
//! |---|---|---|---|
//! | one span per logical call | INFO | span `retry` | `function`, `idempotent`, `deadline_ms` |
//! | one event per attempt end | DEBUG (success), INFO (failure) | `attempt succeeded` / `attempt failed` | `attempt` (1-based), `verdict` (`ok`, `not_executed`, `unknown`, `permanent`, `cut_off`), `duration_ms`, `next` (`done`, `retry`, `reconcile`, `stop`), `pause_ms`, `remaining_ms` |
//! | one event per call end | INFO (success), WARN (failure) | `call succeeded` / `call failed` | `outcome` (`ok` or a [`Reason`] name), `attempts`, `elapsed_ms` |
//!
//! Every event has target `retry` and the call's span as parent; the body of
//! each attempt and `reconcile` run inside the span. Durations are
//! milliseconds as `f64`, to the microsecond.
//! A body that completes on its first poll is timed from when the engine first
//! read the clock (see [`attempt`](crate::attempt)), so its `duration_ms` may
//! read 0.
//!
//! Without a subscriber (or with the `retry` target disabled), the cost on the
//! happy path is the disabled-span check: no field is computed, no clock read.
//!
//! # Metrics
//!
//! Names follow the pattern of the gRPC OpenTelemetry metrics (gRFC A66 for
//! per-attempt and per-call instruments, A96 for retries). Every instrument
//! carries the label `function`.
//!
//! | name | kind | unit | extra labels | meaning |
//! |---|---|---|---|---|
//! | `retry.call.started` | counter | calls | | logical calls started |
//! | `retry.call.completed` | counter | calls | `outcome` | logical calls ended, by outcome (`ok` or a reason) |
//! | `retry.call.duration` | histogram | s | `outcome` | time from the call's entry to its end |
//! | `retry.call.retries` | histogram | attempts | | attempts after the first, per call |
//! | `retry.call.stopped_early` | counter | calls | `reason` | calls stopped by `deadline_exceeded`, `budget_exhausted`, `circuit_open` or `unknown_outcome` |
//! | `retry.attempt.started` | counter | attempts | | attempts started |
//! | `retry.attempt.duration` | histogram | s | `verdict` | attempt duration, by how it ended |
//! | `retry.pause.duration` | histogram | s | | each pause taken between attempts |
//!
//! Logical calls and attempts are counted separately: `retry.attempt.started`
//! minus `retry.call.started` is the number of retries.

use std::time::Duration;

use crate::failure::Reason;
use crate::policy::Policy;

/// The name a retried call reports under: the `function` field of its span
/// and the `function` label of its metrics. `const`-constructible, and meant
/// to be a `static`, so that the labels of the happy path's metrics are built
/// once, at compile time (the happy path allocates nothing, even with the
/// `metrics` feature on). `#[retryable]` declares one per function, named
/// `module::path::function`; with [`call`](crate::call()), pass one to
/// [`Retry::name`](crate::Retry::name).
///
/// ```
/// use retry_core::observe::Name;
/// static STOCK: Name = Name::new("inventory::stock");
/// assert_eq!(STOCK.as_str(), "inventory::stock");
/// ```
#[derive(Debug)]
pub struct Name {
    name: &'static str,
    #[cfg(feature = "metrics")]
    function: [metrics::Label; 1],
    #[cfg(feature = "metrics")]
    ok_outcome: [metrics::Label; 2],
    #[cfg(feature = "metrics")]
    ok_verdict: [metrics::Label; 2],
}

impl Name {
    /// A name.
    #[must_use]
    pub const fn new(name: &'static str) -> Self {
        Self {
            name,
            #[cfg(feature = "metrics")]
            function: [metrics::Label::from_static_parts("function", name)],
            #[cfg(feature = "metrics")]
            ok_outcome: [
                metrics::Label::from_static_parts("function", name),
                metrics::Label::from_static_parts("outcome", "ok"),
            ],
            #[cfg(feature = "metrics")]
            ok_verdict: [
                metrics::Label::from_static_parts("function", name),
                metrics::Label::from_static_parts("verdict", "ok"),
            ],
        }
    }

    /// The name.
    #[must_use]
    pub const fn as_str(&self) -> &'static str {
        self.name
    }
}

/// The name of calls made with [`call`](crate::call()) that set none.
pub(crate) static UNNAMED: Name = Name::new("retry::call");

#[cfg(feature = "metrics")]
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new("retry", metrics::Level::INFO, Some(module_path!()));

#[cfg(feature = "metrics")]
fn count(key: &metrics::Key) {
    metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
}

#[cfg(feature = "metrics")]
fn record(key: &metrics::Key, value: f64) {
    metrics::with_recorder(|r| r.register_histogram(key, &METADATA).record(value));
}

/// A key whose labels are known only now (the failure path).
#[cfg(feature = "metrics")]
fn dynamic(name: &'static str, labels: &[(&'static str, &'static str)]) -> metrics::Key {
    metrics::Key::from_parts(
        name,
        labels
            .iter()
            .map(|(k, v)| metrics::Label::from_static_parts(k, v))
            .collect::<Vec<_>>(),
    )
}

/// How an attempt ended, for observers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttemptEnd {
    Ok,
    Failed(crate::verdict::VerdictKind),
    CutOff,
}

impl AttemptEnd {
    #[cfg_attr(not(any(feature = "tracing", feature = "metrics")), allow(dead_code))]
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failed(k) => k.as_str(),
            Self::CutOff => "cut_off",
        }
    }
}

/// What happens after an attempt, for observers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterAttempt {
    Done,
    Retry(Duration),
    Reconcile,
    Stop,
}

/// The observers of one call. Zero-sized when both features are off.
#[derive(Debug)]
pub(crate) struct Observer {
    /// `None` when nothing listens at the `INFO` level: then no span is
    /// created and no event is considered for this call.
    #[cfg(feature = "tracing")]
    span: Option<tracing::Span>,
    #[cfg(feature = "metrics")]
    name: &'static Name,
}

// With a feature off, some hooks have nothing to do.
#[cfg_attr(
    not(all(feature = "tracing", feature = "metrics")),
    allow(unused_variables, clippy::unused_self)
)]
impl Observer {
    #[inline]
    pub(crate) fn new(name: &'static Name, policy: &Policy, idempotent: bool) -> Self {
        #[cfg(feature = "metrics")]
        count(&metrics::Key::from_static_parts(
            "retry.call.started",
            &name.function,
        ));
        Self {
            #[cfg(feature = "tracing")]
            span: tracing::level_enabled!(tracing::Level::INFO).then(|| {
                tracing::info_span!(
                    target: "retry",
                    "retry",
                    function = name.as_str(),
                    idempotent,
                    deadline_ms = ms(policy.deadline()),
                )
            }),
            #[cfg(feature = "metrics")]
            name,
        }
    }

    /// The span attempts run in, if anyone listens.
    #[cfg(feature = "tracing")]
    #[inline]
    pub(crate) fn span(&self) -> Option<&tracing::Span> {
        self.span.as_ref()
    }

    #[inline]
    pub(crate) fn attempt_started(&self) {
        #[cfg(feature = "metrics")]
        count(&metrics::Key::from_static_parts(
            "retry.attempt.started",
            &self.name.function,
        ));
    }

    /// An attempt ended. `duration` and `remaining` are only computed when an
    /// observer wants them.
    #[inline]
    pub(crate) fn attempt_ended(
        &self,
        number: u32,
        end: AttemptEnd,
        next: AfterAttempt,
        duration: impl Fn() -> Duration,
        remaining: impl Fn() -> Duration,
    ) {
        #[cfg(feature = "tracing")]
        if let Some(span) = &self.span {
            let (next_name, pause) = match next {
                AfterAttempt::Done => ("done", Duration::ZERO),
                AfterAttempt::Retry(p) => ("retry", p),
                AfterAttempt::Reconcile => ("reconcile", Duration::ZERO),
                AfterAttempt::Stop => ("stop", Duration::ZERO),
            };
            // One callsite per level: a tracing event's level is fixed where it is written.
            macro_rules! attempt_event {
                ($level:ident, $message:literal) => {
                    tracing::$level!(
                        target: "retry",
                        parent: span,
                        attempt = number,
                        verdict = end.as_str(),
                        duration_ms = ms(duration()),
                        next = next_name,
                        pause_ms = ms(pause),
                        remaining_ms = ms(remaining()),
                        $message
                    )
                };
            }
            if end == AttemptEnd::Ok {
                attempt_event!(debug, "attempt succeeded");
            } else {
                attempt_event!(info, "attempt failed");
            }
        }
        #[cfg(feature = "metrics")]
        {
            let key = if end == AttemptEnd::Ok {
                metrics::Key::from_static_parts("retry.attempt.duration", &self.name.ok_verdict)
            } else {
                dynamic(
                    "retry.attempt.duration",
                    &[("function", self.name.as_str()), ("verdict", end.as_str())],
                )
            };
            record(&key, duration().as_secs_f64());
        }
    }

    /// A pause is about to be taken.
    #[inline]
    pub(crate) fn paused(&self, pause: Duration) {
        #[cfg(feature = "metrics")]
        record(
            &metrics::Key::from_static_parts("retry.pause.duration", &self.name.function),
            pause.as_secs_f64(),
        );
    }

    /// The call ended: `Ok` or the reason it stopped.
    #[inline]
    pub(crate) fn call_ended(
        &self,
        outcome: Result<(), Reason>,
        attempts: u32,
        elapsed: impl Fn() -> Duration,
    ) {
        let name = match outcome {
            Ok(()) => "ok",
            Err(r) => r.as_str(),
        };
        #[cfg(feature = "tracing")]
        if let Some(span) = &self.span {
            macro_rules! outcome_event {
                ($level:ident, $message:literal) => {
                    tracing::$level!(
                        target: "retry",
                        parent: span,
                        outcome = name,
                        attempts,
                        elapsed_ms = ms(elapsed()),
                        $message
                    )
                };
            }
            if outcome.is_ok() {
                outcome_event!(info, "call succeeded");
            } else {
                outcome_event!(warn, "call failed");
            }
        }
        #[cfg(feature = "metrics")]
        {
            let n = self.name;
            let (completed, duration) = if outcome.is_ok() {
                (
                    metrics::Key::from_static_parts("retry.call.completed", &n.ok_outcome),
                    metrics::Key::from_static_parts("retry.call.duration", &n.ok_outcome),
                )
            } else {
                let labels = [("function", n.as_str()), ("outcome", name)];
                (
                    dynamic("retry.call.completed", &labels),
                    dynamic("retry.call.duration", &labels),
                )
            };
            count(&completed);
            record(&duration, elapsed().as_secs_f64());
            record(
                &metrics::Key::from_static_parts("retry.call.retries", &n.function),
                f64::from(attempts.saturating_sub(1)),
            );
            if let Err(
                r @ (Reason::DeadlineExceeded
                | Reason::BudgetExhausted
                | Reason::CircuitOpen
                | Reason::UnknownOutcome),
            ) = outcome
            {
                count(&dynamic(
                    "retry.call.stopped_early",
                    &[("function", n.as_str()), ("reason", r.as_str())],
                ));
            }
        }
        let _ = name;
    }
}

/// Milliseconds, to the microsecond.
#[cfg(feature = "tracing")]
fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1_000_000.0).round() / 1000.0
}
