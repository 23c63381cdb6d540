//! What a retried call tells the outside world: `tracing` spans and events
//! (feature `tracing`, on by default) and `metrics` (feature `metrics`).
//!
//! # Tracing
//!
//! Levels follow tower, hyper and tonic: a call that succeeds at its first
//! attempt emits nothing above DEBUG; each retry is reported at DEBUG; a call
//! that succeeded after retrying is one INFO event and a call that gives up
//! one WARN event, so that both are in a trace kept at INFO (where the
//! DEBUG spans are not); a configuration that breaks a rule and could not
//! be rejected at compile time is one WARN event per name (or per
//! breaker), the first time it is used. Library code never prints.
//!
//! | what | level | name / message | fields |
//! |---|---|---|---|
//! | one span per logical call | DEBUG | span `retries` | `function`, `idempotent`, `deadline_ms`, then `outcome`, `attempts` |
//! | one span per attempt, under the call's | DEBUG | span `attempt` | see "Spans of attempts" below |
//! | an attempt ended (but the one attempt of a first-time success: the call's event says all it would) | DEBUG | `attempt succeeded` / `attempt failed` | `attempt` (1-based), `verdict` (`ok`, `not_executed`, `unknown`, `permanent`, `cut_off`), `duration_ms`, `next` (`done`, `retry`, `reconcile` when a look-up runs, else `stop`), `pause_ms`, `remaining_ms` |
//! | the call succeeded at its first attempt | DEBUG | `call succeeded` | `outcome` (`ok`), `attempts`, `elapsed_ms` (the function is the span's field: this event is always inside it) |
//! | the call succeeded after more than one attempt (a retry, or a hedged copy sent; not a resumed stream's reopen, which is the stream's own `stream reopened`; not a call whose one attempt's unknown outcome `reconcile` found done) | INFO | `call succeeded` | `function` (also without the span, as a give-up), `outcome` (`ok`), `attempts`, `elapsed_ms` |
//! | the call gave up | WARN (DEBUG under a name whose owner reports it: [`Name::give_up_reported_by_owner`]) | `call failed` | `function` (also without the span, so a WARN-only log names it; through the tower layer a gRPC call's method path, an HTTP call's `METHOD /route` when a route is given), `outcome` (a [`Reason`](crate::Reason) name: `permanent`, `exhausted`, `deadline_exceeded`, `pause_exceeds_deadline`, `budget_exhausted`, `circuit_open`, `unknown_outcome`, `saturated`), `attempts`, `elapsed_ms` |
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
//! What this costs, in instructions per call beside a hand loop under
//! `#[tracing::instrument]` (`tests/bench/README.md`, "The price of
//! telemetry"; `bash scripts/telemetry.sh`): at INFO a first-time success
//! costs what it costs with no subscriber. At DEBUG a first-time success is
//! two spans (the call's, and its attempt's, in which the body runs: the
//! structure gRPC's OpenTelemetry guidance asks for, kept so that a trace
//! has one shape whether a call retried or not), one event and one record
//! on each span (its fields recorded together); through the OpenTelemetry
//! SDK that is about 2.2 times the one span of the hand loop's
//! `#[instrument]`, the price of seeing each attempt apart.
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
//! (OpenTelemetry fixes both when a span starts). Whole numbers (status
//! codes, `attempt`, `attempts`, the resend count, a stream's counts) are
//! recorded as `i64`, so that they are exported as integers, as the
//! conventions type them (`tracing-opentelemetry` 0.34 exports a `u64` field
//! as a string); durations in milliseconds are `f64`.
//!
//! | span | field | value | from |
//! |---|---|---|---|
//! | call | `otel.name` | the call's name; a gRPC method as `package.Service/Method` | |
//! | call | `function`, `idempotent`, `deadline_ms` | as above | |
//! | call | `remaining_at_entry_ms` | the time the call's deadline (its own, its caller's, a request's) left it at entry; recorded when the call ends, with `outcome` and `attempts` (one record of the span) | |
//! | call | `outcome`, `attempts` | recorded when the call ends | |
//! | call | `otel.status_code` | `ERROR` when the call failed | |
//! | attempt | `otel.name` | the call's name | |
//! | attempt | `otel.kind` | `client` through the layer and the middleware, else `internal` | |
//! | attempt | `attempt` | 1-based | |
//! | attempt | `verdict`, `next`, `pause_ms` | as the attempt's event; recorded together when the attempt ends | |
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
//! A call records only when a recorder is installed (globally or for the
//! thread): with the feature compiled in and none, a call makes one
//! look-up of the recorder, reads no clock and records nothing (about a tenth
//! over a call without the feature). `metrics` 0.24 has no way to ask
//! whether a recorder is installed; its no-op recorder is zero-sized, so a
//! zero-sized recorder is taken for it: a recorder of your own without
//! fields needs `metrics_through_zero_sized_recorders()` once.
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
//! | `retry.chaos.injected`, `retry.chaos.observed` | counter | faults | `kind` only (`refuse`, `delay`, `hang`, `drop_reply`, `fail_after`) | faults injected, and those that took effect (see the `retries-chaos` crate) |
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

#[cfg(feature = "metrics")]
pub(crate) mod conventions;
#[cfg(feature = "metrics")]
mod descriptions;
pub(crate) mod events;
pub(crate) mod keys;
mod names;
mod observer;
mod record;
#[cfg(feature = "tracing")]
pub(crate) mod spans;

#[cfg(feature = "metrics")]
pub use descriptions::describe_metrics;
pub(crate) use keys::End;
pub use names::{MAX_CALL_NAMES, MetricNames, Name};
pub(crate) use names::{call_names, unnamed};
#[cfg(feature = "stream")]
pub use observer::Counts;
#[cfg(feature = "stream")]
pub(crate) use observer::StreamObserver;
pub(crate) use observer::{Observer, Then};
#[cfg(feature = "metrics")]
pub use record::metrics_through_zero_sized_recorders;
pub(crate) use record::misconfigured;
