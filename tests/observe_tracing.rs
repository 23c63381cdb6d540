//! The tracing output of a call: one span, one event per attempt end, one for
//! the outcome, with the documented fields, in order.
#![cfg(all(feature = "tracing", feature = "testing"))]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use retry::{Attempt, Backoff, Policy, testing::Scripted, testing::Step};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// Everything seen: ("span" | "event", message or name, fields, parent span).
type Seen = Arc<Mutex<Vec<(String, String, Vec<(String, String)>, Option<String>)>>>;

#[derive(Default)]
struct Fields(Vec<(String, String)>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .push((field.name().to_string(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_string(), value.to_string()));
    }
}

struct Recorder(Seen);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, _id: &Id, _ctx: Context<'_, S>) {
        let mut f = Fields::default();
        attrs.record(&mut f);
        let name = attrs.metadata().name().to_string();
        self.0
            .lock()
            .unwrap()
            .push(("span".into(), name, f.0, None));
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut f = Fields::default();
        event.record(&mut f);
        let message =
            f.0.iter()
                .position(|(k, _)| k == "message")
                .map(|i| f.0.remove(i).1)
                .unwrap_or_default();
        let parent = ctx.event_span(event).map(|s| s.name().to_string());
        self.0
            .lock()
            .unwrap()
            .push(("event".into(), message, f.0, parent));
    }
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> &'a str {
    fields.iter().find(|(k, _)| k == name).map_or_else(
        || panic!("no field {name} in {fields:?}"),
        |(_, v)| v.as_str(),
    )
}

static STOCK: retry::observe::Name = retry::observe::Name::new("inventory::stock");

#[test]
fn one_span_one_event_per_attempt_and_one_outcome() {
    let seen: Seen = Arc::default();
    let subscriber = tracing_subscriber::registry().with(Recorder(seen.clone()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let policy = Policy::new(Duration::from_secs(2))
        .with_backoff(Backoff::constant(Duration::from_millis(100)));
    let op = Scripted::new([
        Step::fail_before_effect().after(Duration::from_millis(30)),
        Step::fail_after_effect(),
        Step::succeed(),
    ]);
    tracing::subscriber::with_default(subscriber, || {
        rt.block_on(async {
            retry::call(&policy)
                .name(&STOCK)
                .idempotent()
                .outcome(async |at: &Attempt| op.call(at).await)
                .await
                .unwrap();
        });
    });
    let seen = seen.lock().unwrap();
    let kinds: Vec<(&str, &str)> = seen
        .iter()
        .map(|(k, m, _, _)| (k.as_str(), m.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("span", "retry"),
            ("event", "attempt failed"),
            ("event", "attempt failed"),
            ("event", "attempt succeeded"),
            ("event", "call succeeded"),
        ]
    );
    let span = &seen[0].2;
    assert_eq!(field(span, "function"), "inventory::stock");
    assert_eq!(field(span, "idempotent"), "true");
    assert_eq!(field(span, "deadline_ms"), "2000.0");

    let a1 = &seen[1].2;
    assert_eq!(field(a1, "attempt"), "1");
    assert_eq!(field(a1, "verdict"), "not_executed");
    assert_eq!(field(a1, "duration_ms"), "30.0");
    assert_eq!(field(a1, "next"), "retry");
    assert_eq!(field(a1, "pause_ms"), "100.0");
    assert_eq!(field(a1, "remaining_ms"), "1970.0");
    let a2 = &seen[2].2;
    assert_eq!(
        (field(a2, "attempt"), field(a2, "verdict")),
        ("2", "unknown")
    );
    assert_eq!(field(a2, "remaining_ms"), "1870.0");
    let a3 = &seen[3].2;
    assert_eq!(
        (
            field(a3, "attempt"),
            field(a3, "verdict"),
            field(a3, "next")
        ),
        ("3", "ok", "done")
    );
    let end = &seen[4].2;
    assert_eq!(field(end, "outcome"), "ok");
    assert_eq!(field(end, "attempts"), "3");
    assert_eq!(field(end, "elapsed_ms"), "230.0");
    // Every event belongs to the call's span.
    assert!(
        seen[1..]
            .iter()
            .all(|(_, _, _, parent)| parent.as_deref() == Some("retry"))
    );
}

#[test]
fn a_failed_call_reports_its_reason() {
    let seen: Seen = Arc::default();
    let subscriber = tracing_subscriber::registry().with(Recorder(seen.clone()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let policy = Policy::new(Duration::from_millis(500));
    let op = Scripted::new([Step::hang()]);
    tracing::subscriber::with_default(subscriber, || {
        rt.block_on(async {
            let f = retry::call(&policy)
                .not_idempotent()
                .outcome(async |at: &Attempt| op.call(at).await)
                .await
                .unwrap_err();
            assert_eq!(f.reason(), retry::Reason::DeadlineExceeded);
        });
    });
    let seen = seen.lock().unwrap();
    let (_, message, fields, _) = seen.last().unwrap();
    assert_eq!(message, "call failed");
    assert_eq!(field(fields, "outcome"), "deadline_exceeded");
    assert_eq!(field(fields, "elapsed_ms"), "500.0");
    let (_, message, fields, _) = &seen[seen.len() - 2];
    assert_eq!(message, "attempt failed");
    assert_eq!(
        (field(fields, "verdict"), field(fields, "next")),
        ("cut_off", "stop")
    );
}
