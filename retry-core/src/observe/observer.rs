//! The observers of one call and of one resumed stream: the spans, events
//! and `retry.*` metrics of the happy path and of every failure.

use std::time::Duration;

use super::Name;
use super::keys::End;
#[cfg(feature = "metrics")]
use super::record::{count, record, started};
use crate::failure::Reason;
use crate::policy::Policy;
#[cfg(feature = "metrics")]
use std::borrow::Cow;

#[cfg(feature = "metrics")]
use super::keys::{Failing, Which, failing};

/// The happy-path key `which` of the name `of`: its own, made at compile
/// time (see `keys`), or else made now from its labels.
#[cfg(feature = "metrics")]
#[inline]
fn key(of: &'static Name, which: Which) -> Cow<'static, metrics::Key> {
    match of.keys {
        Some(keys) => Cow::Borrowed(keys.get(which)),
        None => Cow::Owned(which.key(&of.labels)),
    }
}

/// What a resumed stream's consumer received, and how often the stream
/// reopened (see [`stream`](crate::stream)).
#[cfg(feature = "stream")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Items delivered to the consumer.
    pub delivered: u64,
    /// Repeated items skipped after a reopen.
    pub skipped: u64,
    /// Connections opened after the first.
    pub reopens: u64,
}

/// What follows a failed attempt, as observers report it (the `next` field
/// of an attempt's event).
// Only the tracing events read the pause.
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
#[derive(Debug, Clone, Copy)]
pub(crate) enum Then {
    /// Another attempt, after this pause.
    Retry(Duration),
    /// `reconcile` is asked first.
    Reconcile,
    /// The call stops.
    Stop,
}

/// The spans of a call that someone listens to: the call's, and the
/// running attempt's (`Span::none()` between attempts).
#[cfg(feature = "tracing")]
#[derive(Debug)]
struct Spans {
    call: tracing::Span,
    attempt: tracing::Span,
    /// `remaining_at_entry_ms`, known when the first attempt ends and
    /// recorded with the outcome (one record of the call's span, not two).
    at_entry_ms: Option<f64>,
}

/// The observers of one call. Zero-sized when both features are off.
#[derive(Debug)]
pub(crate) struct Observer {
    /// `None` when nothing listens at the `DEBUG` level: then no span is
    /// created and only a give-up is considered for an event. Boxed: a
    /// call's future carries one pointer for it, and only a call someone
    /// listens to allocates.
    #[cfg(feature = "tracing")]
    spans: Option<Box<Spans>>,
    /// Whether a `metrics` recorder listens (see [`started`]): when none
    /// does, the call records nothing and reads no clock for its metrics.
    /// A word (0 or 1), not a `bool`: [`watched`](Self::watched) is then
    /// one `or` of two words, the spans' pointer and this (2 instructions
    /// fewer on every call's path than two tests, `scripts/telemetry.sh`).
    #[cfg(feature = "metrics")]
    metered: usize,
    /// A resumed stream's reopen (see [`reopen`](Self::reopen)).
    #[cfg(all(feature = "stream", feature = "tracing"))]
    reopen: bool,
}

// Dropped in line, with the spans' drop out of line: left to the compiler,
// the whole drop was a call on every call's path (~10 instructions, seen
// with callgrind on `profile_ready`), for spans that a quiet call never has.
impl Drop for Observer {
    #[inline]
    fn drop(&mut self) {
        #[cfg(feature = "tracing")]
        if let Some(spans) = self.spans.take() {
            drop_spans(spans);
        }
    }
}

#[cfg(feature = "tracing")]
#[cold]
#[inline(never)]
#[allow(clippy::needless_pass_by_value, clippy::boxed_local)] // dropping it is the point
fn drop_spans(spans: Box<Spans>) {
    drop(spans);
}

// With a feature off, some hooks have nothing to do.
#[cfg_attr(
    not(all(feature = "tracing", feature = "metrics")),
    allow(unused_variables, clippy::unused_self)
)]
impl Observer {
    // Inlined always: see `started`.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    pub(crate) fn new(name: &'static Name, policy: &Policy, idempotent: bool) -> Self {
        Self {
            #[cfg(feature = "tracing")]
            spans: tracing::level_enabled!(tracing::Level::DEBUG)
                .then(|| Self::spans(name, policy, idempotent)),
            #[cfg(feature = "metrics")]
            metered: usize::from(started(|| key(name, Which::CallStarted))),
            #[cfg(all(feature = "stream", feature = "tracing"))]
            reopen: false,
        }
    }

    /// The observer of a resumed stream's reopen: its success after the
    /// broken connection (attempt 1 of the new call) stays at DEBUG, as the
    /// stream reports the reopen itself (`stream reopened`).
    #[cfg(feature = "stream")]
    #[must_use]
    #[cfg_attr(not(feature = "tracing"), allow(unused_mut))]
    pub(crate) fn reopen(mut self) -> Self {
        #[cfg(feature = "tracing")]
        {
            self.reopen = true;
        }
        self
    }

    // Boxed here, out of line: the allocation stays off the inlined path.
    #[cfg(feature = "tracing")]
    #[cold]
    #[inline(never)]
    #[allow(clippy::unnecessary_box_returns)]
    fn spans(name: &'static Name, policy: &Policy, idempotent: bool) -> Box<Spans> {
        // OpenTelemetry's span name: the call's name (a gRPC method as
        // `package.Service/Method`).
        let otel_name = name.as_str();
        let otel_name = otel_name.strip_prefix('/').unwrap_or(otel_name);
        Box::new(Spans {
            call: tracing::debug_span!(
                target: "retries",
                "retries",
                "otel.name" = otel_name,
                function = name.as_str(),
                idempotent,
                deadline_ms = ms(policy.deadline()),
                remaining_at_entry_ms = tracing::field::Empty,
                outcome = tracing::field::Empty,
                attempts = tracing::field::Empty,
                "otel.status_code" = tracing::field::Empty,
                control = tracing::field::Empty,
            ),
            attempt: tracing::Span::none(),
            at_entry_ms: None,
        })
    }

    /// The call (named `name`) runs under an operator's override: its
    /// span says which.
    #[cold]
    #[inline(never)]
    #[cfg_attr(not(feature = "tracing"), allow(clippy::unused_self, unused_variables))]
    pub(crate) fn controlled(&self, name: &str) {
        #[cfg(feature = "tracing")]
        if let Some(spans) = self.spans.as_deref()
            && let Some(what) = crate::control::of(name)
        {
            spans.call.record("control", what.to_string().as_str());
        }
    }

    /// The span the running attempt's body is polled in: the attempt's own
    /// while one runs, else the call's (for `reconcile` and a wait for a
    /// slot), if anyone listens.
    #[cfg(feature = "tracing")]
    #[inline]
    pub(crate) fn span(&self) -> Option<&tracing::Span> {
        self.spans.as_deref().map(|s| {
            if s.attempt.is_none() {
                &s.call
            } else {
                &s.attempt
            }
        })
    }

    /// Attempt `number` of the call's loop starts: its span, a child of the
    /// call's, if anyone listens. (Hedged copies run side by side and are
    /// reported by the call's events only.)
    #[inline]
    pub(crate) fn attempt_span(&mut self, of: &'static Name, number: u32) {
        #[cfg(feature = "tracing")]
        if let Some(spans) = &mut self.spans {
            spans.attempt = Self::new_attempt(&spans.call, of, number);
        }
    }

    #[cfg(feature = "tracing")]
    #[cold]
    #[inline(never)]
    fn new_attempt(call: &tracing::Span, name: &'static Name, number: u32) -> tracing::Span {
        use tracing::field::Empty;
        // OpenTelemetry fixes a span's name and kind when it starts (the
        // first time it is entered): both are set here. A gRPC method's
        // span is named `package.Service/Method`.
        let otel_name = name.as_str();
        let otel_name = otel_name.strip_prefix('/').unwrap_or(otel_name);
        let kind = if name.client { "client" } else { "internal" };
        // Every field a door may record is declared here (a span's fields
        // are fixed when it is made); the doors fill in theirs.
        tracing::debug_span!(
            target: "retries",
            parent: call,
            "attempt",
            attempt = int(number),
            verdict = Empty,
            next = Empty,
            pause_ms = Empty,
            "http.request.method" = Empty,
            "http.response.status_code" = Empty,
            "http.request.resend_count" = Empty,
            "server.address" = Empty,
            "url.template" = Empty,
            "error.type" = Empty,
            "rpc.system" = Empty,
            "rpc.service" = Empty,
            "rpc.method" = Empty,
            "rpc.grpc.status_code" = Empty,
            "grpc.method" = Empty,
            "grpc.status" = Empty,
            "otel.name" = otel_name,
            "otel.kind" = kind,
            "otel.status_code" = Empty,
        )
    }

    /// Does anyone watch this call (a span, or a metrics recorder)? `false`
    /// on a quiet path, where no event is built at all.
    #[inline]
    fn watched(&self) -> bool {
        #[cfg(feature = "tracing")]
        let spanned = self
            .spans
            .as_deref()
            .map_or(0, |s| std::ptr::from_ref(s) as usize);
        #[cfg(not(feature = "tracing"))]
        let spanned = 0;
        #[cfg(feature = "metrics")]
        let metered = self.metered;
        #[cfg(not(feature = "metrics"))]
        let metered = 0;
        (spanned | metered) != 0
    }

    /// Does a `metrics` recorder listen to this call?
    #[cfg(feature = "metrics")]
    #[inline]
    fn metered(&self) -> bool {
        self.metered != 0
    }

    /// Attempt `at` failed (`end` says how) and the engine decided
    /// what follows (`then`). The events are built out of line, only when someone
    /// watches.
    #[inline]
    pub(crate) fn attempt_failed(
        &mut self,
        of: &'static Name,
        at: &crate::Attempt,
        end: End,
        then: impl FnOnce() -> Then,
    ) {
        if self.watched() {
            self.report_failed(of, at, end, then());
        }
    }

    /// A call succeeded on attempt `at` (its last), having entered at
    /// `entry()` (`None`: at the start of its first and only attempt).
    /// The events are built out of line, only when someone watches or the
    /// call retried (its INFO event); `entry` is not even read otherwise.
    #[inline]
    pub(crate) fn succeeded(
        &mut self,
        of: &'static Name,
        at: &crate::Attempt,
        entry: impl FnOnce() -> Option<std::time::Instant>,
    ) {
        let watched = self.watched();
        if watched || (at.number() > 1 && info_enabled()) {
            self.report_succeeded(of, at, entry(), watched);
        }
    }

    // Not generic: compiled once, whatever the call.
    #[cold]
    #[inline(never)]
    fn report_failed(&mut self, of: &'static Name, at: &crate::Attempt, end: End, then: Then) {
        self.report_attempt(of, at, end, Some(then));
    }

    #[cold]
    #[inline(never)]
    fn report_succeeded(
        &mut self,
        of: &'static Name,
        at: &crate::Attempt,
        entry: Option<std::time::Instant>,
        watched: bool,
    ) {
        // Not watched: here only for the INFO event of a call that retried.
        if watched {
            self.report_attempt(of, at, End::Ok, None);
        }
        self.call_ended(of, Ok(()), at.number(), || {
            crate::time::since(entry.unwrap_or_else(|| at.timing().start))
        });
    }

    // A hook of the observer like the others, though only metrics read it.
    #[allow(clippy::unused_self)]
    #[inline]
    pub(crate) fn attempt_started(&self, of: &'static Name) {
        #[cfg(feature = "metrics")]
        if self.metered() {
            count(&key(of, Which::AttemptStarted));
        }
    }

    /// Attempt `at` ended (`end`: `ok`, a verdict name, or `cut_off`), and
    /// what comes next (`None`: the call is done). Reached only when someone
    /// watches, and every watcher wants the attempt's duration: the clock is
    /// read once here, for it and for the time left.
    fn report_attempt(
        &mut self,
        of: &'static Name,
        at: &crate::Attempt,
        end: End,
        next: Option<Then>,
    ) {
        let timing = at.timing();
        let now = crate::time::now();
        let duration = now.saturating_duration_since(timing.start);
        // The first attempt starts at the call's entry: the time its
        // deadline left it then.
        let at_entry = (at.number() == 1)
            .then(|| timing.call_deadline.saturating_duration_since(timing.start));
        #[cfg(feature = "tracing")]
        if let (Some(spans), Some(left)) = (&mut self.spans, at_entry) {
            spans.at_entry_ms = Some(ms(left));
        }
        #[cfg(feature = "metrics")]
        if let Some(left) = at_entry.filter(|_| self.metered()) {
            record(&key(of, Which::DeadlineAtEntry), left.as_secs_f64());
        }
        #[cfg(feature = "tracing")]
        if let Some(spans) = &mut self.spans {
            let (next_name, pause) = match next {
                None => ("done", Duration::ZERO),
                Some(Then::Retry(delay)) => ("retry", delay),
                Some(Then::Reconcile) => ("reconcile", Duration::ZERO),
                Some(Then::Stop) => ("stop", Duration::ZERO),
            };
            // The attempt's span closes here, with how it ended: one record
            // of all four (a subscriber looks the span up once per record;
            // through the OpenTelemetry layer, ~900 instructions each).
            let attempt = std::mem::replace(&mut spans.attempt, tracing::Span::none());
            tracing::record_all!(
                attempt,
                verdict = end.as_str(),
                next = next_name,
                pause_ms = ms(pause),
                "otel.status_code" = (end != End::Ok).then_some("ERROR"),
            );
            drop(attempt);
            // The attempt of a call that succeeds at once has no event: the
            // call's says all it would (attempt 1, `ok`, `done`, no pause).
            if next.is_none() && at.number() == 1 {
                return self.record_attempt(of, end, duration);
            }
            let span = &spans.call;
            tracing::debug!(
                target: "retries",
                parent: span,
                attempt = int(at.number()),
                verdict = end.as_str(),
                duration_ms = ms(duration),
                next = next_name,
                pause_ms = ms(pause),
                remaining_ms = ms(timing.call_deadline.saturating_duration_since(now)),
                "attempt {}",
                if end == End::Ok { "succeeded" } else { "failed" }
            );
        }
        self.record_attempt(of, end, duration);
    }

    /// The attempt's duration, by how it ended, if a recorder listens.
    #[inline]
    fn record_attempt(&self, of: &'static Name, end: End, duration: Duration) {
        #[cfg(feature = "metrics")]
        if self.metered() {
            if end == End::Ok {
                record(&key(of, Which::AttemptOk), duration.as_secs_f64());
            } else {
                record(failing(of, Failing::Attempt(end)), duration.as_secs_f64());
            }
        }
    }

    /// A pause is about to be taken.
    #[allow(clippy::unused_self)] // as `attempt_started`
    #[inline]
    pub(crate) fn paused(&self, of: &'static Name, pause: Duration) {
        #[cfg(feature = "metrics")]
        if self.metered() {
            record(&key(of, Which::PauseDuration), pause.as_secs_f64());
        }
    }

    /// The call ended: `Ok` or the reason it stopped.
    #[inline]
    pub(crate) fn call_ended(
        &self,
        of: &'static Name,
        outcome: Result<(), Reason>,
        attempts: u32,
        elapsed: impl Fn() -> Duration,
    ) {
        let name = match outcome {
            Ok(()) => "ok",
            Err(r) => r.as_str(),
        };
        #[cfg(feature = "tracing")]
        {
            let function = of.as_str();
            // One callsite per level and parent: a tracing event's level is
            // fixed where it is written, and a give-up is reported even when
            // the call's DEBUG span is disabled. A give-up names the function
            // itself (it stands alone in a WARN-only log); a success is
            // always inside the span, which names it (a formatter prints the
            // span's fields after the event's: both printed it twice).
            macro_rules! outcome_event {
                ($level:ident $(in $parent:ident)? $(named $function:ident)?) => {
                    tracing::$level!(
                        target: "retries",
                        $(parent: $parent,)?
                        $($function,)?
                        outcome = name,
                        attempts = int(attempts),
                        elapsed_ms = ms(elapsed()),
                        "call {}",
                        if outcome.is_ok() { "succeeded" } else { "failed" }
                    )
                };
            }
            // A call that succeeded after a retry is one INFO event, seen
            // where DEBUG spans are not: it names the function, as a
            // give-up does.
            #[cfg(feature = "stream")]
            let retried = attempts > 1 && !self.reopen;
            #[cfg(not(feature = "stream"))]
            let retried = attempts > 1;
            let spans = self.spans.as_deref();
            let span = spans.map(|s| &s.call);
            match (span, outcome) {
                (Some(span), Ok(())) if retried => outcome_event!(info in span named function),
                (None, Ok(())) if retried => outcome_event!(info named function),
                (Some(span), Ok(())) => outcome_event!(debug in span),
                (None, Ok(())) => {}
                (Some(span), Err(_)) if of.owner_reports => {
                    outcome_event!(debug in span named function);
                }
                (None, Err(_)) if of.owner_reports => {}
                (Some(span), Err(_)) => outcome_event!(warn in span named function),
                (None, Err(_)) => outcome_event!(warn named function),
            }
            // Recorded on the span after its last event: a formatter prints
            // the span's fields after the event's, and the event already
            // says both (they were printed twice). With them, the time the
            // deadline left at entry, kept since the first attempt ended:
            // one record of the call's span in all.
            if let Some(Spans {
                call: span,
                at_entry_ms,
                ..
            }) = spans
            {
                tracing::record_all!(
                    span,
                    remaining_at_entry_ms = *at_entry_ms,
                    outcome = name,
                    attempts = int(attempts),
                    "otel.status_code" = outcome.is_err().then_some("ERROR"),
                );
            }
        }
        #[cfg(feature = "metrics")]
        if self.metered() {
            let n = of;
            match outcome {
                Ok(()) => {
                    count(&key(n, Which::CompletedOk));
                    record(&key(n, Which::DurationOk), elapsed().as_secs_f64());
                }
                Err(r) => {
                    count(failing(n, Failing::Completed(r)));
                    record(failing(n, Failing::Duration(r)), elapsed().as_secs_f64());
                }
            }
            if let Err(r) = outcome
                && attempts == 0
            {
                // Stopped before its first attempt: nothing was sent.
                count(failing(n, Failing::Refused(r)));
            }
            record(
                &key(n, Which::CallRetries),
                f64::from(attempts.saturating_sub(1)),
            );
            if let Err(
                r @ (Reason::DeadlineExceeded
                | Reason::PauseExceedsDeadline
                | Reason::BudgetExhausted
                | Reason::CircuitOpen
                | Reason::UnknownOutcome
                | Reason::Saturated
                | Reason::Throttled
                | Reason::RateLimited
                | Reason::OverQuota),
            ) = outcome
            {
                count(failing(n, Failing::StoppedEarly(r)));
            }
        }
        let _ = name;
    }
}

/// Does anyone listen at INFO (for the event of a call that succeeded after
/// retrying)? A level check, no clock read: without it, a retried call
/// with no subscriber took ~370 instructions more (`scripts/instructions.sh`,
/// `once`).
#[inline]
fn info_enabled() -> bool {
    #[cfg(feature = "tracing")]
    return tracing::level_enabled!(tracing::Level::INFO);
    #[cfg(not(feature = "tracing"))]
    false
}

/// A whole number as the `i64` it is recorded as: `tracing-opentelemetry`
/// (0.34) exports a `u64` field as a string, an `i64` as an integer, as
/// the semantic conventions type their counts and codes. Saturating.
#[cfg(feature = "tracing")]
#[inline]
pub(crate) fn int(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// Milliseconds, to the microsecond.
#[cfg(feature = "tracing")]
fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1_000_000.0).round() / 1000.0
}

/// The observers of a resumed stream (see [`stream`](crate::stream)), beside
/// those of its calls. Zero-sized but for the name.
#[cfg(feature = "stream")]
#[derive(Debug)]
pub(crate) struct StreamObserver {
    #[cfg_attr(not(any(feature = "tracing", feature = "metrics")), allow(dead_code))]
    name: &'static Name,
}

#[cfg(feature = "stream")]
#[cfg_attr(
    not(all(feature = "tracing", feature = "metrics")),
    allow(unused_variables, clippy::unused_self)
)]
impl StreamObserver {
    pub(crate) fn new(name: &'static Name) -> Self {
        Self { name }
    }

    pub(crate) fn delivered(&self) {
        #[cfg(feature = "metrics")]
        count(&key(self.name, Which::StreamDelivered));
    }

    pub(crate) fn skipped(&self) {
        #[cfg(feature = "tracing")]
        tracing::debug!(target: "retries", function = self.name.as_str(), "item skipped");
        #[cfg(feature = "metrics")]
        count(&key(self.name, Which::StreamSkipped));
    }

    pub(crate) fn reopened(&self, cursor: bool, counts: Counts) {
        #[cfg(feature = "tracing")]
        tracing::debug!(
            target: "retries",
            function = self.name.as_str(),
            cursor,
            delivered = int(counts.delivered),
            skipped = int(counts.skipped),
            reopens = int(counts.reopens),
            "stream reopened"
        );
        #[cfg(feature = "metrics")]
        count(&key(self.name, Which::StreamReopened));
    }

    pub(crate) fn rewound(&self, counts: Counts) {
        #[cfg(feature = "tracing")]
        tracing::warn!(
            target: "retries",
            function = self.name.as_str(),
            delivered = int(counts.delivered),
            "stream rewound"
        );
    }

    pub(crate) fn ended(&self, counts: Counts) {
        #[cfg(feature = "tracing")]
        tracing::debug!(
            target: "retries",
            function = self.name.as_str(),
            delivered = int(counts.delivered),
            skipped = int(counts.skipped),
            reopens = int(counts.reopens),
            "stream ended"
        );
    }
}
