//! Durable calls, seen (issue 62, item 5): the counters and the oldest-due
//! histogram by name, and every attempt of a call in a span linked to the
//! enqueuing transaction's trace, through an OpenTelemetry pipeline as a
//! user installs it (`tracing-opentelemetry` over an SDK tracer provider,
//! its in-memory exporter).
//!
//! A test binary of its own: it installs a tracing subscriber, and
//! tracing's interest in a callsite is process-wide. A test beside it that
//! first used the worker's callsites while this one's subscriber was being
//! installed could leave them cached as "nobody listens" (tracing-core
//! computes a callsite's interest before it lists it, so a rebuild in
//! between misses it): the claim's span was then missing, once, in CI
//! under load.

#![cfg_attr(no_postgres, allow(unused))]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::{CompositeKey, MetricKind};
use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use retries::{Attempt, Policy, Verdict};
use retries_postgres_tests::Cluster;
use retries_sqlx::durable::{self, Call, Enqueue, Handler, HandlerError, Worker};
use sqlx::postgres::PgPoolOptions;
use tracing_subscriber::layer::SubscriberExt as _;

const TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

const QUICK: Policy = Policy::new(Duration::from_secs(5))
    .with_max_attempts(4)
    .with_initial_backoff(Duration::from_millis(10))
    .validated();

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv: &&KeyValue| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

/// The metric `name`'s values by their `name` label (and `reason`, if any).
type Snapshot = [(
    CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)];

fn by_label<'a>(
    snapshot: &'a Snapshot,
    kind: MetricKind,
    metric: &str,
) -> BTreeMap<String, Vec<&'a DebugValue>> {
    let mut out: BTreeMap<String, Vec<&DebugValue>> = BTreeMap::new();
    for (k, _, _, v) in snapshot {
        if k.kind() != kind || k.key().name() != metric {
            continue;
        }
        let labels: Vec<String> = k
            .key()
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        out.entry(labels.join(",")).or_default().push(v);
    }
    out
}

#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[test]
#[allow(clippy::too_many_lines)] // one pipeline, one run, what it saw
fn each_attempt_nests_in_a_span_linked_to_the_enqueuing_trace_and_metrics_go_by_name() {
    let cluster = Cluster::start(&[]);
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("durable-test")));
    let _spans = tracing::subscriber::set_default(subscriber);
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // One thread: the subscriber and the recorder are this thread's.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tries = Arc::new(AtomicU32::new(0));
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let db = PgPoolOptions::new()
                .max_connections(2)
                .acquire_timeout(Duration::from_secs(10))
                .connect(&cluster.url())
                .await
                .expect("a pool");
            durable::migrate(&db).await.unwrap();
            let mut tx = db.begin().await.unwrap();
            durable::enqueue(
                &mut tx,
                Enqueue::new("seen-flaky", b"{}".to_vec()).trace(TRACE),
            )
            .await
            .unwrap();
            durable::enqueue(&mut tx, Enqueue::new("seen-refused", b"{}".to_vec()))
                .await
                .unwrap();
            tx.commit().await.unwrap();
            let t = Arc::clone(&tries);
            let worker = Worker::new(db.clone())
                .poll(Duration::from_millis(20))
                .handle(
                    "seen-flaky",
                    Handler::idempotent(QUICK, async move |_: &Call, _: &Attempt| {
                        if t.fetch_add(1, Ordering::SeqCst) < 2 {
                            Err(HandlerError::new(Verdict::not_executed(), "busy"))
                        } else {
                            Ok(())
                        }
                    }),
                )
                .handle(
                    "seen-refused",
                    Handler::idempotent(QUICK, async |_: &Call, _: &Attempt| {
                        Err::<(), _>(HandlerError::new(Verdict::permanent(), "400"))
                    }),
                );
            // The tests beside this one use the engine on their threads with
            // no subscriber: a callsite they registered while this thread's
            // subscriber was being installed may have cached "nobody
            // listens" (tracing-core computes a callsite's interest once, at
            // its first use, over the subscribers it sees then). Computed
            // again now, with this one in place.
            tracing::callsite::rebuild_interest_cache();
            let db2 = db.clone();
            worker
                .run(async move {
                    loop {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        let s = durable::stats(&db2).await.unwrap();
                        if s.iter().all(|s| s.ready == 0) {
                            return;
                        }
                    }
                })
                .await
                .unwrap();
        });
    });
    assert_eq!(tries.load(Ordering::SeqCst), 3);

    // Metrics, by name.
    let snapshot = snapshotter.snapshot().into_vec();
    let counter = |metric: &str| {
        by_label(&snapshot, MetricKind::Counter, metric)
            .into_iter()
            .map(|(k, v)| {
                let n: u64 = v
                    .iter()
                    .map(|v| match v {
                        DebugValue::Counter(n) => *n,
                        other => panic!("{other:?}"),
                    })
                    .sum();
                (k, n)
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        counter("retry.durable.enqueued"),
        [
            ("name=seen-flaky".to_owned(), 1),
            ("name=seen-refused".to_owned(), 1)
        ]
    );
    assert_eq!(
        counter("retry.durable.retried"),
        [("name=seen-flaky".to_owned(), 2)]
    );
    assert_eq!(
        counter("retry.durable.done"),
        [("name=seen-flaky".to_owned(), 1)]
    );
    assert_eq!(
        counter("retry.durable.dead"),
        [("name=seen-refused,reason=permanent".to_owned(), 1)]
    );
    let ages = by_label(
        &snapshot,
        MetricKind::Histogram,
        "retry.durable.oldest_due_age",
    );
    assert_eq!(
        ages.keys().collect::<Vec<_>>(),
        ["name=seen-flaky", "name=seen-refused"],
        "one series per name"
    );
    for (name, values) in &ages {
        for v in values {
            let DebugValue::Histogram(v) = v else {
                panic!("{v:?}")
            };
            // Each claim records the oldest due age it saw: seconds, small
            // here (the worker claims within its 20 ms poll of each due).
            assert!(
                !v.is_empty() && v.iter().all(|s| (0.0..5.0).contains(&s.into_inner())),
                "{name}: {v:?}"
            );
        }
    }

    // Spans: the flaky call's claim span links to the enqueuing trace, and
    // its three attempts are in the claim's trace, under it.
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let claims: Vec<&SpanData> = spans
        .iter()
        .filter(|s| {
            s.name == "durable call"
                && attribute(s, "name").map(Value::as_str).as_deref() == Some("seen-flaky")
        })
        .collect();
    assert_eq!(claims.len(), 1, "one claim of the flaky call");
    let claim = claims[0];
    let enqueued = (
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
        SpanId::from_hex("00f067aa0ba902b7").unwrap(),
    );
    let links: Vec<_> = claim
        .links
        .iter()
        .map(|l| (l.span_context.trace_id(), l.span_context.span_id()))
        .collect();
    assert_eq!(links, [enqueued], "the claim links to the enqueuing trace");
    assert_eq!(
        attribute(claim, "enqueued_trace")
            .map(Value::as_str)
            .as_deref(),
        Some(TRACE)
    );
    let own = claim.span_context.trace_id();
    assert_ne!(own, enqueued.0, "a link, not the parent");
    let mut attempts: Vec<i64> = spans
        .iter()
        .filter(|s| s.span_context.trace_id() == own)
        .filter_map(|s| match attribute(s, "attempt") {
            Some(Value::I64(n)) => Some(*n),
            _ => None,
        })
        .collect();
    attempts.sort_unstable();
    assert_eq!(
        attempts,
        [1, 2, 3],
        "every attempt under the claim's span: {:#?}",
        spans
            .iter()
            .map(|s| (
                &s.name,
                s.span_context.trace_id(),
                s.span_context.span_id(),
                s.parent_span_id,
                &s.attributes
            ))
            .collect::<Vec<_>>()
    );
    // The refused call was enqueued without a trace: its claim links to
    // nothing.
    let refused = spans
        .iter()
        .find(|s| {
            s.name == "durable call"
                && attribute(s, "name").map(Value::as_str).as_deref() == Some("seen-refused")
        })
        .expect("the refused call's claim");
    assert!(refused.links.is_empty());
}
