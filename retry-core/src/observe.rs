//! What a retried call tells the outside world: `tracing` spans and events
//! (feature `tracing`, on by default) and `metrics` (feature `metrics`).
//!
//! # Tracing
//!
//! Levels follow tower, hyper and tonic: a call that succeeds at its first
//! attempt emits nothing above DEBUG; each retry is reported at DEBUG; a call
//! that gives up is one WARN event; a configuration that breaks a rule and
//! could not be rejected at compile time is one WARN event per name (or per
//! breaker), the first time it is used. Library code never prints.
//!
//! | what | level | name / message | fields |
//! |---|---|---|---|
//! | one span per logical call | DEBUG | span `retries` | `function`, `idempotent`, `deadline_ms`, then `outcome`, `attempts` |
//! | one span per attempt, under the call's | DEBUG | span `attempt` | see "Spans of attempts" below |
//! | an attempt ended | DEBUG | `attempt succeeded` / `attempt failed` | `attempt` (1-based), `verdict` (`ok`, `not_executed`, `unknown`, `permanent`, `cut_off`), `duration_ms`, `next` (`done`, `retry`, `reconcile` when a look-up runs, else `stop`), `pause_ms`, `remaining_ms` |
//! | the call succeeded | DEBUG | `call succeeded` | `outcome` (`ok`), `attempts`, `elapsed_ms` (the function is the span's field: this event is always inside it) |
//! | the call gave up | WARN | `call failed` | `function` (also without the span, so a WARN-only log names it; through the tower layer a gRPC call's method path, an HTTP call's `METHOD /route` when a route is given), `outcome` (a [`Reason`] name: `permanent`, `exhausted`, `deadline_exceeded`, `pause_exceeds_deadline`, `budget_exhausted`, `circuit_open`, `unknown_outcome`, `saturated`), `attempts`, `elapsed_ms` |
//! | a misconfiguration | WARN | `misconfigured …` | `what`, `rule`, `detail` |
//!
//! Every event has target `retries`, and the call's span as parent when that
//! span is enabled; the body of each attempt and `reconcile` run inside the
//! span. Durations are milliseconds as `f64`, to the microsecond. A body that
//! completes on its first poll is timed from when the engine first read the
//! clock (see [`attempt`](crate::attempt)), so its `duration_ms` may read 0.
//!
//! Without a subscriber at DEBUG for target `retries`, the cost on the happy
//! path is one level check: no span, no field computed, no clock read.
//!
//! # Spans of attempts, for OpenTelemetry
//!
//! Each attempt of the loop runs in a span of its own, `attempt`, a child of
//! the call's span (as the HTTP semantic conventions ask of an
//! instrumentation that resends, and as OpenTelemetry allows a library that
//! owns its retries). Its body, and everything it calls, runs inside it; a
//! `reconcile` look-up and a wait for a slot run in the call's span. Field
//! names are the conventions' own, so `tracing-opentelemetry` exports them as
//! those attributes; `otel.name` and `otel.kind` are set when the span is made
//! (OpenTelemetry fixes both when a span starts).
//!
//! | span | field | value | from |
//! |---|---|---|---|
//! | call | `otel.name` | the call's name; a gRPC method as `package.Service/Method` | |
//! | call | `function`, `idempotent`, `deadline_ms` | as above | |
//! | call | `remaining_at_entry_ms` | the time the call's deadline (its own, its caller's, a request's) left it at entry | |
//! | call | `outcome`, `attempts` | recorded when the call ends | |
//! | call | `otel.status_code` | `ERROR` when the call failed | |
//! | attempt | `otel.name` | the call's name | |
//! | attempt | `otel.kind` | `client` through the layer and the middleware, else `internal` | |
//! | attempt | `attempt` | 1-based | |
//! | attempt | `verdict`, `next`, `pause_ms` | as the attempt's event | |
//! | attempt | `otel.status_code` | `ERROR` for a failed attempt | |
//! | attempt (HTTP) | `http.request.method`, `server.address`, `url.template` (when a route is known), `http.response.status_code`, `http.request.resend_count` (from the second attempt on) | | HTTP client spans, semantic conventions |
//! | attempt (HTTP) | `error.type` | the status code for a status of 400 or more; `_OTHER` without a response | HTTP client spans |
//! | attempt (gRPC) | `rpc.system` (`grpc`), `rpc.service`, `rpc.method`, `rpc.grpc.status_code`, `server.address` (when the request's URI has it: a tonic `Channel` adds its origin below the layer, so there it has not) | | RPC spans, semantic conventions |
//! | attempt (gRPC) | `grpc.method`, `grpc.status` | `package.Service/Method`; `OK`, `UNAVAILABLE`, … | gRFC A66 |
//! | attempt (gRPC) | `error.type` | the status name, for a status other than `OK` | |
//!
//! Through the layer, a gRPC response that is not trailers-only is the
//! layer's success and reads `OK` (its real status arrives in the trailers,
//! after the layer has answered). A hedged call's copies run side by side
//! and have no span of their own; the call's span and events report them.
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
//! | `retry.call.stopped_early` | counter | calls | `reason` | calls stopped by `deadline_exceeded`, `pause_exceeds_deadline`, `budget_exhausted`, `circuit_open`, `unknown_outcome` or `saturated` |
//! | `retry.stream.delivered`, `retry.stream.skipped`, `retry.stream.reopened` | counter | items, items, connections | | resumed streams (see `retries::stream`, feature `stream`) |
//! | `retry.call.deadline_at_entry` | histogram | s | | the time the call's deadline (its own, its caller's, a request's) left it when it started |
//! | `retry.call.refused` | counter | calls | `reason` | calls stopped before their first attempt, nothing sent (`throttled`, `saturated`, `circuit_open`, `deadline_exceeded`) |
//! | `retry.server.deadline_at_entry` | histogram | s | | the time a request's caller left it, when a server layer (`wire::ServerLayer`, `tonic::DeadlineLayer`) takes a request that carries a deadline; no `function` label |
//! | `retry.server.refused` | counter | requests | `reason` (`too_little_time`) | requests a server layer refused before their handler; no `function` label |
//! | `retry.chaos.injected`, `retry.chaos.observed` | counter | faults | `kind` only (`refuse`, `delay`, `hang`, `drop_reply`, `fail_after`) | faults injected, and those that took effect (see `retries::chaos`, feature `chaos`) |
//! | `retry.attempt.started` | counter | attempts | | attempts started |
//! | `retry.attempt.duration` | histogram | s | `verdict` | attempt duration, by how it ended |
//! | `retry.pause.duration` | histogram | s | | each pause taken between attempts |
//!
//! Logical calls and attempts are counted separately: `retry.attempt.started`
//! minus `retry.call.started` is the number of retries. Label values are
//! bounded: `function` by the call names (at most
//! `MAX_CALL_NAMES` (256) made by the doors, plus the `#[retryable]` functions
//! and the names given), `outcome`, `reason` and `verdict` by their enums.
//!
//! # Metrics of the conventions
//!
//! A door asked for [`MetricNames::OpenTelemetry`]
//! (`RetryLayer::metric_names`, `RetryMiddleware::metric_names`) records,
//! besides the `retry.*` instruments above, the OpenTelemetry conventions'
//! instruments for its calls. The `retry.*` names stay the default and are
//! always recorded: they cover every door (the attribute and the builder
//! have no convention), and dashboards built on them keep working. Units are
//! the conventions' (seconds); the `metrics` facade carries none, so an
//! exporter that wants them takes them from the name.
//!
//! | name | kind | attributes | convention | recorded |
//! |---|---|---|---|---|
//! | `http.client.request.duration` | histogram (s) | `http.request.method`, `http.response.status_code`, `server.address`, `url.template` (with a route), `error.type` (the status for 400 or more, `_OTHER` without a response) | HTTP semantic conventions | per attempt (layer in HTTP mode, middleware) |
//! | `grpc.client.attempt.started` | counter | `grpc.method` | gRFC A66 | per attempt (layer in gRPC mode) |
//! | `grpc.client.attempt.duration` | histogram (s) | `grpc.method`, `grpc.status` | gRFC A66 | per attempt |
//! | `grpc.client.call.duration` | histogram (s) | `grpc.method`, `grpc.status` | gRFC A66 | per call |
//! | `grpc.client.call.retries` | histogram | `grpc.method` | gRFC A96 | per call that retried: attempts after the first |
//! | `grpc.client.call.retry_delay` | histogram (s) | `grpc.method` | gRFC A96 | per call that retried: the time between its attempts |
//!
//! `grpc.target` is left out: the layer sits above the channel and does not
//! know its target. A hedged call's copies are reported by the `retry.*`
//! instruments only (no `grpc.client.call.hedges` yet), and the layer makes
//! no transparent retries (no `grpc.client.call.transparent_retries`).
//! Label values are built per record in this mode (one allocation each);
//! the default names allocate nothing on the happy path.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::budget::TokenBucket;
use crate::failure::Reason;
use crate::policy::{Policy, PolicyError};

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

/// The name a retried call reports under: the `function` field of its span
/// and the `function` label of its metrics. `const`-constructible, and meant
/// to be a `static`, so that the labels of the happy path's metrics are built
/// once, at compile time (the happy path allocates nothing, even with the
/// `metrics` feature on). `#[retryable]` declares one per function, named
/// `module::path::function`; with [`call`](crate::call()), pass one to
/// [`Retry::name`](crate::Retry::name).
///
/// A name also carries the default budget of the calls made under it (a
/// [`TokenBucket::DEFAULT`], see [`budget`](crate::budget)), and remembers
/// whether an invalid run-time policy was already reported for it.
///
/// ```
/// use retries::observe::Name;
/// static STOCK: Name = Name::new("inventory::stock");
/// assert_eq!(STOCK.as_str(), "inventory::stock");
/// ```
#[derive(Debug)]
pub struct Name {
    name: &'static str,
    /// A door's name (the layer's, the middleware's, a call name they
    /// made): its attempts are client spans for OpenTelemetry.
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    client: bool,
    bucket: TokenBucket,
    warned: AtomicBool,
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
        Self::of(name, false)
    }

    /// The name of a door's calls: their attempts are OpenTelemetry client
    /// spans (`otel.kind = "client"`), as a door that sends requests
    /// declares them (see [`door`](crate::door)).
    #[must_use]
    pub const fn client(name: &'static str) -> Self {
        Self::of(name, true)
    }

    const fn of(name: &'static str, client: bool) -> Self {
        Self {
            name,
            client,
            bucket: TokenBucket::DEFAULT,
            warned: AtomicBool::new(false),
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

    /// The default budget of the calls made under this name.
    #[must_use]
    pub const fn budget(&self) -> &TokenBucket {
        &self.bucket
    }

    /// Log `e` once for this name: the policy of a call made under it breaks
    /// a rule (the engine then runs it as the module docs of
    /// [`policy`](crate::policy) say).
    #[cold]
    pub(crate) fn report_invalid_policy(&self, e: PolicyError) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            misconfigured("policy", e, format_args!("function {}", self.name));
        }
    }
}

/// The name of calls made with [`call`](crate::call()) that set none.
pub(crate) static UNNAMED: Name = Name::new("retries::call");

/// At most this many names are made for the calls of the doors (gRPC
/// methods, HTTP routes), for the process: past it a call reports under
/// its door's own name, so no request can grow the set of labels without
/// limit.
pub const MAX_CALL_NAMES: usize = 256;

/// The names of the doors' calls, made once each (and kept for the
/// process: at most [`MAX_CALL_NAMES`]).
pub(crate) mod call_names {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{OnceLock, RwLock};

    use super::{MAX_CALL_NAMES, Name};

    static MADE: AtomicUsize = AtomicUsize::new(0);
    static FULL: AtomicBool = AtomicBool::new(false);

    /// The name of the calls labelled `path` (a gRPC method's
    /// `/pkg.Service/Method`, a route a door names).
    pub(crate) fn named(path: &str, fallback: &'static Name) -> &'static Name {
        static NAMES: OnceLock<RwLock<HashMap<Box<str>, &'static Name>>> = OnceLock::new();
        let names = NAMES.get_or_init(RwLock::default);
        if let Some(name) = names.read().ok().and_then(|n| n.get(path).copied()) {
            return name;
        }
        make(names, path.into(), || path.to_owned(), fallback)
    }

    /// The name of an HTTP call: its method and the route the user gave
    /// (`GET /users/{id}`), never the raw path.
    #[cfg(feature = "http")]
    pub(crate) fn http(
        method: &http::Method,
        route: &'static str,
        fallback: &'static Name,
    ) -> &'static Name {
        type Names = HashMap<(http::Method, &'static str), &'static Name>;
        static NAMES: OnceLock<RwLock<Names>> = OnceLock::new();
        let names = NAMES.get_or_init(RwLock::default);
        let key = (method.clone(), route);
        if let Some(name) = names.read().ok().and_then(|n| n.get(&key).copied()) {
            return name;
        }
        make(names, key, || format!("{method} {route}"), fallback)
    }

    #[cold]
    fn make<K: std::hash::Hash + Eq>(
        names: &RwLock<HashMap<K, &'static Name>>,
        key: K,
        text: impl FnOnce() -> String,
        fallback: &'static Name,
    ) -> &'static Name {
        let Ok(mut names) = names.write() else {
            return fallback;
        };
        if let Some(name) = names.get(&key) {
            return name;
        }
        if MADE.fetch_add(1, Ordering::Relaxed) >= MAX_CALL_NAMES {
            MADE.fetch_sub(1, Ordering::Relaxed);
            if !FULL.swap(true, Ordering::Relaxed) {
                #[cfg(feature = "tracing")]
                tracing::debug!(
                    target: "retries",
                    max = MAX_CALL_NAMES,
                    "too many call names: further calls report under their door's name"
                );
            }
            return fallback;
        }
        // Made once per method or route, at most MAX_CALL_NAMES for the
        // process: the leak is bounded.
        let text: &'static str = Box::leak(text().into_boxed_str());
        let name: &'static Name = Box::leak(Box::new(Name::client(text)));
        names.insert(key, name);
        name
    }

    #[cfg(all(test, feature = "http"))]
    mod tests {
        use super::*;

        static DOOR: Name = Name::new("door");

        #[test]
        fn names_are_made_once_each_and_no_more_than_the_cap() {
            let first = named("/a.S/M0", &DOOR);
            assert_eq!(first.as_str(), "/a.S/M0");
            assert!(std::ptr::eq(first, named("/a.S/M0", &DOOR)), "made once");
            let route = http(&http::Method::GET, "/users/{id}", &DOOR);
            assert_eq!(route.as_str(), "GET /users/{id}");
            for i in 1..MAX_CALL_NAMES - 1 {
                assert_eq!(
                    named(&format!("/a.S/M{i}"), &DOOR).as_str(),
                    format!("/a.S/M{i}")
                );
            }
            // The cap is reached: a new name is the door's, known ones stay.
            assert!(std::ptr::eq(
                named("/a.S/one-too-many", &DOOR),
                &raw const DOOR
            ));
            assert!(std::ptr::eq(
                http(&http::Method::PUT, "/x", &DOOR),
                &raw const DOOR
            ));
            assert_eq!(named("/a.S/M7", &DOOR).as_str(), "/a.S/M7");
        }
    }
}

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

/// The spans of a call that someone listens to: the call's, and the
/// running attempt's (`Span::none()` between attempts).
#[cfg(feature = "tracing")]
#[derive(Debug)]
struct Spans {
    call: tracing::Span,
    attempt: tracing::Span,
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
    #[cfg_attr(not(any(feature = "tracing", feature = "metrics")), allow(dead_code))]
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
            spans: tracing::level_enabled!(tracing::Level::DEBUG)
                .then(|| Self::spans(name, policy, idempotent)),
            name,
        }
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
            ),
            attempt: tracing::Span::none(),
        })
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
    pub(crate) fn attempt_span(&mut self, number: u32) {
        #[cfg(feature = "tracing")]
        if let Some(spans) = &mut self.spans {
            spans.attempt = Self::new_attempt(&spans.call, self.name, number);
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
            attempt = number,
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

    /// Does anyone watch this call (a span, or metrics)? `false` on a
    /// quiet path, where no event is built at all.
    #[inline]
    fn watched(&self) -> bool {
        #[cfg(feature = "tracing")]
        let spanned = self.spans.is_some();
        #[cfg(not(feature = "tracing"))]
        let spanned = false;
        spanned || cfg!(feature = "metrics")
    }

    /// Attempt `at` failed (`end` says how) and the engine decided
    /// what follows (`then`). The events are built out of line, only when someone
    /// watches.
    #[inline]
    pub(crate) fn attempt_failed(
        &mut self,
        at: &crate::Attempt,
        end: &'static str,
        then: impl FnOnce() -> Then,
    ) {
        if self.watched() {
            self.report_failed(at, end, then());
        }
    }

    /// A call succeeded on attempt `at` (its `attempts`-th), having entered
    /// at `entry` (`None`: at the start of its first and only attempt). The
    /// events are built out of line, only when someone watches.
    #[inline]
    pub(crate) fn succeeded(
        &mut self,
        at: &crate::Attempt,
        attempts: u32,
        entry: Option<std::time::Instant>,
    ) {
        if self.watched() {
            self.report_succeeded(at, attempts, entry);
        }
    }

    // Not generic: compiled once, whatever the call.
    #[cold]
    #[inline(never)]
    fn report_failed(&mut self, at: &crate::Attempt, end: &'static str, then: Then) {
        self.report_attempt(at, end, Some(then));
    }

    #[cold]
    #[inline(never)]
    fn report_succeeded(
        &mut self,
        at: &crate::Attempt,
        attempts: u32,
        entry: Option<std::time::Instant>,
    ) {
        self.report_attempt(at, "ok", None);
        self.call_ended(Ok(()), attempts, || {
            crate::time::since(entry.unwrap_or_else(|| at.timing().start))
        });
    }

    #[inline]
    pub(crate) fn attempt_started(&self) {
        #[cfg(feature = "metrics")]
        count(&metrics::Key::from_static_parts(
            "retry.attempt.started",
            &self.name.function,
        ));
    }

    /// Attempt `at` ended (`end`: `ok`, a verdict name, or `cut_off`), and
    /// what comes next (`None`: the call is done). Reached only when someone
    /// watches, and every watcher wants the attempt's duration: the clock is
    /// read once here, for it and for the time left.
    fn report_attempt(&mut self, at: &crate::Attempt, end: &'static str, next: Option<Then>) {
        let timing = at.timing();
        let now = crate::time::now();
        let duration = now.saturating_duration_since(timing.start);
        // The first attempt starts at the call's entry: the time its
        // deadline left it then.
        let at_entry = (at.number() == 1)
            .then(|| timing.call_deadline.saturating_duration_since(timing.start));
        #[cfg(feature = "tracing")]
        if let (Some(spans), Some(left)) = (&self.spans, at_entry) {
            spans.call.record("remaining_at_entry_ms", ms(left));
        }
        #[cfg(feature = "metrics")]
        if let Some(left) = at_entry {
            record(
                &metrics::Key::from_static_parts(
                    "retry.call.deadline_at_entry",
                    &self.name.function,
                ),
                left.as_secs_f64(),
            );
        }
        #[cfg(feature = "tracing")]
        if let Some(spans) = &mut self.spans {
            let (next_name, pause) = match next {
                None => ("done", Duration::ZERO),
                Some(Then::Retry(delay)) => ("retry", delay),
                Some(Then::Reconcile) => ("reconcile", Duration::ZERO),
                Some(Then::Stop) => ("stop", Duration::ZERO),
            };
            // The attempt's span closes here, with how it ended.
            let attempt = std::mem::replace(&mut spans.attempt, tracing::Span::none());
            attempt.record("verdict", end);
            attempt.record("next", next_name);
            attempt.record("pause_ms", ms(pause));
            if end != "ok" {
                attempt.record("otel.status_code", "ERROR");
            }
            drop(attempt);
            let span = &spans.call;
            tracing::debug!(
                target: "retries",
                parent: span,
                attempt = at.number(),
                verdict = end,
                duration_ms = ms(duration),
                next = next_name,
                pause_ms = ms(pause),
                remaining_ms = ms(timing.call_deadline.saturating_duration_since(now)),
                "attempt {}",
                if end == "ok" { "succeeded" } else { "failed" }
            );
        }
        #[cfg(feature = "metrics")]
        {
            let key = if end == "ok" {
                metrics::Key::from_static_parts("retry.attempt.duration", &self.name.ok_verdict)
            } else {
                dynamic(
                    "retry.attempt.duration",
                    &[("function", self.name.as_str()), ("verdict", end)],
                )
            };
            record(&key, duration.as_secs_f64());
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
        {
            let function = self.name.as_str();
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
                        attempts,
                        elapsed_ms = ms(elapsed()),
                        "call {}",
                        if outcome.is_ok() { "succeeded" } else { "failed" }
                    )
                };
            }
            let span = self.spans.as_deref().map(|s| &s.call);
            if let Some(span) = span {
                span.record("outcome", name);
                span.record("attempts", attempts);
                if outcome.is_err() {
                    span.record("otel.status_code", "ERROR");
                }
            }
            match (span, outcome) {
                (Some(span), Ok(())) => outcome_event!(debug in span),
                (None, Ok(())) => {}
                (Some(span), Err(_)) => outcome_event!(warn in span named function),
                (None, Err(_)) => outcome_event!(warn named function),
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
            if let Err(r) = outcome
                && attempts == 0
            {
                // Stopped before its first attempt: nothing was sent.
                count(&dynamic(
                    "retry.call.refused",
                    &[("function", n.as_str()), ("reason", r.as_str())],
                ));
            }
            record(
                &metrics::Key::from_static_parts("retry.call.retries", &n.function),
                f64::from(attempts.saturating_sub(1)),
            );
            if let Err(
                r @ (Reason::DeadlineExceeded
                | Reason::PauseExceedsDeadline
                | Reason::BudgetExhausted
                | Reason::CircuitOpen
                | Reason::UnknownOutcome
                | Reason::Saturated
                | Reason::Throttled),
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
        count(&metrics::Key::from_static_parts(
            "retry.stream.delivered",
            &self.name.function,
        ));
    }

    pub(crate) fn skipped(&self) {
        #[cfg(feature = "tracing")]
        tracing::debug!(target: "retries", function = self.name.as_str(), "item skipped");
        #[cfg(feature = "metrics")]
        count(&metrics::Key::from_static_parts(
            "retry.stream.skipped",
            &self.name.function,
        ));
    }

    pub(crate) fn reopened(&self, cursor: bool, counts: Counts) {
        #[cfg(feature = "tracing")]
        tracing::debug!(
            target: "retries",
            function = self.name.as_str(),
            cursor,
            delivered = counts.delivered,
            skipped = counts.skipped,
            reopens = counts.reopens,
            "stream reopened"
        );
        #[cfg(feature = "metrics")]
        count(&metrics::Key::from_static_parts(
            "retry.stream.reopened",
            &self.name.function,
        ));
    }

    pub(crate) fn rewound(&self, counts: Counts) {
        #[cfg(feature = "tracing")]
        tracing::warn!(
            target: "retries",
            function = self.name.as_str(),
            delivered = counts.delivered,
            "stream rewound"
        );
    }

    pub(crate) fn ended(&self, counts: Counts) {
        #[cfg(feature = "tracing")]
        tracing::debug!(
            target: "retries",
            function = self.name.as_str(),
            delivered = counts.delivered,
            skipped = counts.skipped,
            reopens = counts.reopens,
            "stream ended"
        );
    }
}

/// What a door records on the span of the attempt it is sending, under the
/// OpenTelemetry names (HTTP client spans and RPC spans of the semantic
/// conventions, gRFC A66's `grpc.*`). Each does nothing unless the current
/// span is an attempt's span of this crate: no one listens, or the door
/// runs outside the loop (a hedged copy).
#[cfg(feature = "tracing")]
pub(crate) mod door {
    use tracing::Span;

    /// Does anyone listen to spans of attempts at all? A level check, read
    /// before a door computes what it would record.
    #[inline]
    pub(crate) fn listening() -> bool {
        tracing::level_enabled!(tracing::Level::DEBUG)
    }

    /// The current attempt's span, if that is what runs now.
    fn attempt() -> Option<Span> {
        if !tracing::level_enabled!(tracing::Level::DEBUG) {
            return None;
        }
        let span = Span::current();
        span.metadata()
            .is_some_and(|m| m.target() == "retries" && m.name() == "attempt")
            .then_some(span)
    }

    /// An HTTP request: its method, the server, the route template when
    /// known, how many times it was sent before.
    pub(crate) fn http_request(method: &str, host: Option<&str>, route: Option<&str>, number: u32) {
        let Some(span) = attempt() else { return };
        span.record("http.request.method", method);
        if let Some(host) = host {
            span.record("server.address", host);
        }
        if let Some(route) = route {
            span.record("url.template", route);
        }
        if number > 1 {
            span.record("http.request.resend_count", number - 1);
        }
    }

    /// An HTTP response's status; a status of 400 or more is the error
    /// type, as the conventions say.
    pub(crate) fn http_status(status: u16) {
        let Some(span) = attempt() else { return };
        span.record("http.response.status_code", status);
        if status >= 400 {
            span.record("error.type", status.to_string().as_str());
        }
    }

    /// A gRPC call of `path` (`/package.Service/Method`).
    pub(crate) fn grpc_request(path: &str, host: Option<&str>) {
        let Some(span) = attempt() else { return };
        span.record("rpc.system", "grpc");
        let method = path.strip_prefix('/').unwrap_or(path);
        span.record("grpc.method", method);
        if let Some((service, name)) = method.split_once('/') {
            span.record("rpc.service", service);
            span.record("rpc.method", name);
        }
        if let Some(host) = host {
            span.record("server.address", host);
        }
    }

    /// A gRPC status, by number (`grpc-status`) and name.
    pub(crate) fn grpc_status(code: i32, name: &'static str) {
        let Some(span) = attempt() else { return };
        span.record("rpc.grpc.status_code", code);
        span.record("grpc.status", name);
        if code != 0 {
            span.record("error.type", name);
        }
    }

    /// The attempt failed without a response (a connection or transport
    /// error): the conventions' fallback error type.
    pub(crate) fn no_response() {
        let Some(span) = attempt() else { return };
        span.record("error.type", "_OTHER");
    }
}

/// A server layer took a request whose caller left it `left`:
/// `retry.server.deadline_at_entry` (s).
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn server_entry(left: Duration) {
    #[cfg(feature = "metrics")]
    record(
        &metrics::Key::from_static_name("retry.server.deadline_at_entry"),
        left.as_secs_f64(),
    );
}

/// A server layer refused a request with too little time left, before its
/// handler: `retry.server.refused` (`reason` = `too_little_time`).
pub(crate) fn server_refused() {
    #[cfg(feature = "metrics")]
    count(&metrics::Key::from_static_parts(
        "retry.server.refused",
        &SERVER_REFUSED,
    ));
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

/// The counters of this crate, and what each counts.
#[cfg(feature = "metrics")]
const COUNTERS: [(&str, &str); 11] = [
    ("retry.call.started", "logical calls started"),
    ("retry.call.completed", "logical calls ended, by outcome"),
    (
        "retry.call.stopped_early",
        "calls stopped before their attempts ran out, by reason",
    ),
    (
        "retry.call.refused",
        "calls stopped before their first attempt, by reason",
    ),
    ("retry.attempt.started", "attempts started"),
    (
        "retry.server.refused",
        "requests a server layer refused before their handler",
    ),
    ("retry.stream.delivered", "items a resumed stream delivered"),
    (
        "retry.stream.skipped",
        "repeated items a resumed stream skipped",
    ),
    (
        "retry.stream.reopened",
        "connections a resumed stream reopened",
    ),
    (
        "retry.chaos.injected",
        "faults injected (feature chaos), by kind",
    ),
    (
        "retry.chaos.observed",
        "injected faults that took effect, by kind",
    ),
];
/// The histograms of this crate, their units, and what each measures.
#[cfg(feature = "metrics")]
const HISTOGRAMS: [(&str, metrics::Unit, &str); 11] = [
    (
        "retry.call.duration",
        metrics::Unit::Seconds,
        "time from a call's entry to its end",
    ),
    (
        "retry.call.deadline_at_entry",
        metrics::Unit::Seconds,
        "the time a call's deadline left it at entry",
    ),
    (
        "retry.call.retries",
        metrics::Unit::Count,
        "attempts after the first, per call",
    ),
    (
        "retry.attempt.duration",
        metrics::Unit::Seconds,
        "attempt duration, by how it ended",
    ),
    (
        "retry.pause.duration",
        metrics::Unit::Seconds,
        "each pause between attempts",
    ),
    (
        "retry.server.deadline_at_entry",
        metrics::Unit::Seconds,
        "the time a request's caller left it",
    ),
    (
        "http.client.request.duration",
        metrics::Unit::Seconds,
        "duration of HTTP client requests",
    ),
    (
        "grpc.client.attempt.duration",
        metrics::Unit::Seconds,
        "end-to-end time of a gRPC attempt",
    ),
    (
        "grpc.client.call.duration",
        metrics::Unit::Seconds,
        "end-to-end time of a gRPC call",
    ),
    (
        "grpc.client.call.retries",
        metrics::Unit::Count,
        "retries of a gRPC call",
    ),
    (
        "grpc.client.call.retry_delay",
        metrics::Unit::Seconds,
        "time a gRPC call waited between its attempts",
    ),
];

/// Describe every instrument this crate records (its unit and what it
/// means) to the current `metrics` recorder: call it once after installing
/// the recorder, as the `metrics` ecosystem does, so that an exporter that
/// keeps units and descriptions (OpenTelemetry's, Prometheus') has them.
#[cfg(feature = "metrics")]
pub fn describe_metrics() {
    use metrics::Unit::Count;
    metrics::with_recorder(|r| {
        for (name, what) in COUNTERS {
            r.describe_counter(name.into(), Some(Count), what.into());
        }
        r.describe_counter(
            "grpc.client.attempt.started".into(),
            Some(Count),
            "gRPC attempts started".into(),
        );
        r.describe_counter(
            "retry.admission.refused".into(),
            Some(Count),
            "first attempts an admission refused locally".into(),
        );
        for (name, unit, what) in HISTOGRAMS {
            r.describe_histogram(name.into(), Some(unit), what.into());
        }
        r.describe_gauge(
            "retry.admission.refusal_rate".into(),
            None,
            "the share of first attempts an admission refuses now".into(),
        );
    });
}

/// The names a door's metrics go under (`RetryLayer::metric_names`,
/// `RetryMiddleware::metric_names`; feature `metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetricNames {
    /// This crate's `retry.*` instruments only (the default).
    #[default]
    Retries,
    /// The `retry.*` instruments, and the OpenTelemetry conventions'
    /// instruments for the door's calls: gRFC A66's and A96's for gRPC,
    /// the HTTP semantic conventions' `http.client.request.duration` for
    /// HTTP (see "Metrics of the conventions" above).
    OpenTelemetry,
}

/// The conventions' instruments, recorded by the doors when asked
/// ([`MetricNames::OpenTelemetry`]). Their labels are built per record.
#[cfg(feature = "metrics")]
pub(crate) mod conventions {
    use std::time::Duration;

    use metrics::{Key, Label, Unit};

    fn key(name: &'static str, labels: Vec<Label>) -> Key {
        Key::from_parts(name, labels)
    }

    fn label(k: &'static str, v: &str) -> Label {
        Label::new(k, v.to_owned())
    }

    /// Record `value` in the histogram `key`, described first: a bridge may
    /// keep a unit only for the registration that follows a description
    /// (metrics-exporter-opentelemetry 0.2 does), and this mode registers
    /// per record.
    fn histogram(key: &Key, unit: Unit, what: &'static str, value: f64) {
        metrics::with_recorder(|r| {
            r.describe_histogram(key.name_shared(), Some(unit), what.into());
        });
        super::record(key, value);
    }

    /// Count one in the counter `key`, described first (as [`histogram`]).
    fn counter(key: &Key, what: &'static str) {
        metrics::with_recorder(|r| {
            r.describe_counter(key.name_shared(), Some(Unit::Count), what.into());
        });
        super::count(key);
    }

    /// One HTTP attempt: `http.client.request.duration` (s).
    pub(crate) fn http_attempt(
        method: &str,
        host: Option<&str>,
        route: Option<&str>,
        status: Option<u16>,
        duration: Duration,
    ) {
        let mut labels = vec![label("http.request.method", method)];
        if let Some(host) = host {
            labels.push(label("server.address", host));
        }
        if let Some(route) = route {
            labels.push(label("url.template", route));
        }
        match status {
            Some(code) => {
                labels.push(Label::new("http.response.status_code", code.to_string()));
                if code >= 400 {
                    labels.push(Label::new("error.type", code.to_string()));
                }
            }
            None => labels.push(Label::from_static_parts("error.type", "_OTHER")),
        }
        histogram(
            &key("http.client.request.duration", labels),
            Unit::Seconds,
            "duration of HTTP client requests",
            duration.as_secs_f64(),
        );
    }

    /// A gRPC attempt started: `grpc.client.attempt.started`.
    pub(crate) fn grpc_attempt_started(method: &str) {
        counter(
            &key(
                "grpc.client.attempt.started",
                vec![label("grpc.method", method)],
            ),
            "gRPC attempts started",
        );
    }

    /// A gRPC attempt ended with `status`: `grpc.client.attempt.duration` (s).
    pub(crate) fn grpc_attempt(method: &str, status: &'static str, duration: Duration) {
        histogram(
            &key(
                "grpc.client.attempt.duration",
                vec![
                    label("grpc.method", method),
                    Label::from_static_parts("grpc.status", status),
                ],
            ),
            Unit::Seconds,
            "end-to-end time of a gRPC attempt",
            duration.as_secs_f64(),
        );
    }

    /// A gRPC call ended with `status` after `attempts`, having paused
    /// `delay` in all: `grpc.client.call.duration` (s), and for a call
    /// that retried, `grpc.client.call.retries` and
    /// `grpc.client.call.retry_delay` (s).
    pub(crate) fn grpc_call(
        method: &str,
        status: &'static str,
        duration: Duration,
        attempts: u32,
        delay: Duration,
    ) {
        histogram(
            &key(
                "grpc.client.call.duration",
                vec![
                    label("grpc.method", method),
                    Label::from_static_parts("grpc.status", status),
                ],
            ),
            Unit::Seconds,
            "end-to-end time of a gRPC call",
            duration.as_secs_f64(),
        );
        if attempts > 1 {
            histogram(
                &key(
                    "grpc.client.call.retries",
                    vec![label("grpc.method", method)],
                ),
                Unit::Count,
                "retries of a gRPC call",
                f64::from(attempts - 1),
            );
            histogram(
                &key(
                    "grpc.client.call.retry_delay",
                    vec![label("grpc.method", method)],
                ),
                Unit::Seconds,
                "time a gRPC call waited between its attempts",
                delay.as_secs_f64(),
            );
        }
    }
}
