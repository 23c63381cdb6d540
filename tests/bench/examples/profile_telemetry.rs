//! The price of telemetry, in instructions per call, for
//! `valgrind --tool=callgrind` (all rows at once: `bash scripts/telemetry.sh`,
//! which builds this program twice, with and without the bench package's
//! feature `metrics`). Calls are polled by hand (no executor), as in
//! `profile_ready`.
//!
//! `target/release/examples/profile_telemetry N SETTING SUBJECT`:
//!
//! * SETTING, what listens: `none`; `fmt_info`, `fmt_debug` (tracing's
//!   formatter, writing to a sink, at that level); `otel_info`, `otel_debug`
//!   (`tracing-opentelemetry` into the OpenTelemetry SDK, a simple span
//!   processor and an exporter that drops what it is given); `registry` (a
//!   `metrics` recorder over `metrics-util`'s atomic `Registry`, the storage
//!   of the Prometheus exporter).
//! * SUBJECT: `retryable`, a ready `#[retryable]` call; `hand`, a hand loop
//!   with the same deadline and attempts under
//!   `#[tracing::instrument(level = "info")]`; `hand_metrics`, the hand loop
//!   reporting by hand the seven metrics a first-time success records.
//!
//! `profile_telemetry 0 visible` prints instead what a subscriber at INFO
//! receives for a first-time success, a call that retried and one that gave
//! up (spans and events, by level); `profile_telemetry 0 visible_debug`,
//! what a subscriber at DEBUG receives for a first-time success and for one
//! call of the instrumented hand loop.

// The operations are `async fn`s that complete at once, as the profile wants.
#![allow(clippy::unused_async)]

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use retries::retryable;
use retries_bench::{E, hand_loop, spin};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::{Layer, filter::LevelFilter};

#[retryable(deadline = "2s", max_attempts = 3, idempotent)]
async fn annotated(x: u64) -> Result<u64, E> {
    if x == u64::MAX {
        return Err(E::Refused);
    }
    Ok(black_box(x) + 1)
}

/// The hand-written loop: a deadline over at most three attempts.
#[tracing::instrument(level = "info")]
async fn hand(x: u64) -> Result<u64, E> {
    hand_loop(|| body(x), Duration::ZERO).await
}

/// `hand` again, for `visible_debug` (a second caller of `hand` would
/// change how the measured loop is inlined, as for `succeeds`).
#[tracing::instrument(level = "info")]
async fn hand_seen(x: u64) -> Result<u64, E> {
    hand_loop(|| body(x), Duration::ZERO).await
}

/// The body: ready at once.
async fn body(x: u64) -> Result<u64, E> {
    if x == u64::MAX {
        return Err(E::Refused);
    }
    Ok(black_box(x) + 1)
}

/// The hand loop reporting what a first-time success of `annotated`
/// records, under the same names and labels (the `retries` README's metrics
/// table): two counters and a histogram at the start, the attempt's
/// duration, the call's outcome, duration and retries at the end.
async fn hand_metrics(x: u64) -> Result<u64, E> {
    const F: &str = "profile_telemetry::annotated";
    let start = std::time::Instant::now();
    metrics::counter!("retry.call.started", "function" => F).increment(1);
    metrics::counter!("retry.attempt.started", "function" => F).increment(1);
    metrics::histogram!("retry.call.deadline_at_entry", "function" => F).record(2.0);
    let r = hand_loop(|| body(x), Duration::ZERO).await;
    let took = start.elapsed().as_secs_f64();
    metrics::histogram!("retry.attempt.duration", "function" => F, "verdict" => "ok").record(took);
    metrics::counter!("retry.call.completed", "function" => F, "outcome" => "ok").increment(1);
    metrics::histogram!("retry.call.duration", "function" => F, "outcome" => "ok").record(took);
    metrics::histogram!("retry.call.retries", "function" => F).record(0.0);
    r
}

/// `annotated` again, for `visible`: a second caller of `annotated` would
/// change how the measured loop is inlined (and its count).
#[retryable(deadline = "2s", max_attempts = 3, idempotent)]
async fn succeeds(x: u64) -> Result<u64, E> {
    Ok(black_box(x) + 1)
}

#[retryable(deadline = "2s", max_attempts = 3, idempotent, attempt = at, budget = "none",
            backoff = "constant", initial_backoff = "0ms")]
async fn retried_once(x: u64) -> Result<u64, E> {
    if at.number() == 1 {
        return Err(E::Refused);
    }
    Ok(black_box(x) + 1)
}

#[retryable(
    deadline = "2s",
    max_attempts = 3,
    idempotent,
    budget = "none",
    backoff = "constant",
    initial_backoff = "0ms"
)]
async fn gives_up(_x: u64) -> Result<u64, E> {
    Err(E::Refused)
}

/// A `metrics` recorder over `metrics-util`'s atomic registry: what the
/// Prometheus exporter keeps, without its rendering.
struct RegistryRecorder(
    metrics_util::registry::Registry<metrics::Key, metrics_util::registry::AtomicStorage>,
);

impl metrics::Recorder for RegistryRecorder {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        self.0
            .get_or_create_counter(key, |c| metrics::Counter::from_arc(c.clone()))
    }
    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        self.0
            .get_or_create_gauge(key, |g| metrics::Gauge::from_arc(g.clone()))
    }
    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        self.0
            .get_or_create_histogram(key, |h| metrics::Histogram::from_arc(h.clone()))
    }
}

/// An exporter that drops every span: the SDK's work is measured, not a
/// backend's.
#[derive(Debug)]
struct Drop_;

impl opentelemetry_sdk::trace::SpanExporter for Drop_ {
    async fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        black_box(batch);
        Ok(())
    }
}

fn run(n: u64, mut call: impl FnMut(u64) -> Result<u64, E>) -> u64 {
    let mut sum = 0;
    for i in 0..n {
        sum += call(black_box(i)).unwrap_or(0);
    }
    sum
}

/// Sets the process's subscriber or recorder for `setting`; the provider,
/// when there is one, is returned so that it lives as long as the calls.
fn listen(setting: &str) -> Option<opentelemetry_sdk::trace::SdkTracerProvider> {
    use opentelemetry::trace::TracerProvider as _;
    let fmt = |level: LevelFilter| {
        tracing_subscriber::fmt()
            .with_writer(std::io::sink)
            .with_max_level(level)
            .finish()
    };
    let otel = |level: LevelFilter| {
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_simple_exporter(Drop_)
            .build();
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("profile"))
            .with_filter(level);
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .expect("one subscriber");
        provider
    };
    match setting {
        "none" => None,
        "fmt_info" => {
            tracing::subscriber::set_global_default(fmt(LevelFilter::INFO))
                .expect("one subscriber");
            None
        }
        "fmt_debug" => {
            tracing::subscriber::set_global_default(fmt(LevelFilter::DEBUG))
                .expect("one subscriber");
            None
        }
        "otel_info" => Some(otel(LevelFilter::INFO)),
        "otel_debug" => Some(otel(LevelFilter::DEBUG)),
        "registry" => {
            metrics::set_global_recorder(RegistryRecorder(
                metrics_util::registry::Registry::atomic(),
            ))
            .expect("one recorder");
            None
        }
        other => panic!("profile_telemetry: no setting {other:?}"),
    }
}

/// Spans and events by level, as an INFO subscriber receives them.
#[derive(Clone, Default)]
struct Count(Arc<Mutex<BTreeMap<String, u32>>>);

impl<S: Subscriber> Layer<S> for Count {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: Context<'_, S>,
    ) {
        *self
            .0
            .lock()
            .unwrap()
            .entry(format!("{} span", attrs.metadata().level()))
            .or_default() += 1;
    }
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        *self
            .0
            .lock()
            .unwrap()
            .entry(format!("{} event", event.metadata().level()))
            .or_default() += 1;
    }
}

/// A kind of call, and one call of it.
type Kind<'a> = (&'a str, &'a dyn Fn() -> Result<u64, E>);

/// What a subscriber at `level` receives for each kind of call, one line
/// each: `kind what=count …` (`nothing` when it receives nothing).
fn visible(level: LevelFilter, kinds: &[Kind<'_>]) {
    let count = Count::default();
    let subscriber = tracing_subscriber::registry().with(count.clone().with_filter(level));
    let _guard = tracing::subscriber::set_default(subscriber);
    for &(kind, call) in kinds {
        count.0.lock().unwrap().clear();
        let _ = call();
        let seen = count.0.lock().unwrap();
        let line: Vec<String> = seen
            .iter()
            .map(|(k, v)| format!("{}={v}", k.replace(' ', "_")))
            .collect();
        println!(
            "{kind} {}",
            if line.is_empty() {
                "nothing".into()
            } else {
                line.join(" ")
            }
        );
    }
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let setting = std::env::args().nth(2).unwrap_or_else(|| "none".into());
    let subject = std::env::args()
        .nth(3)
        .unwrap_or_else(|| "retryable".into());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    if setting == "visible" {
        visible(
            LevelFilter::INFO,
            &[
                ("first_time_success", &|| spin(succeeds(1))),
                ("retried_success", &|| spin(retried_once(1))),
                ("gave_up", &|| spin(gives_up(1))),
            ],
        );
        return;
    }
    if setting == "visible_debug" {
        visible(
            LevelFilter::DEBUG,
            &[
                ("debug_first_time_success", &|| spin(succeeds(1))),
                ("debug_hand", &|| spin(hand_seen(1))),
            ],
        );
        return;
    }
    let provider = listen(&setting);
    let sum = match subject.as_str() {
        "retryable" => run(n, |i| spin(annotated(i))),
        "hand" => run(n, |i| spin(hand(i))),
        "hand_metrics" => run(n, |i| spin(hand_metrics(i))),
        other => panic!("profile_telemetry: no subject {other:?}"),
    };
    black_box(sum);
    drop(provider);
}
