//! The metrics of calls and attempts, through a debugging recorder.

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::{CompositeKey, MetricKind};
use retries::testing::{Scripted, Step};
use retries::{Attempt, Backoff, Policy};

fn labels(k: &CompositeKey) -> Vec<(String, String)> {
    k.key()
        .labels()
        .map(|l| (l.key().to_string(), l.value().to_string()))
        .collect()
}

static STOCK: retries::observe::Name = retries::observe::Name::new("stock");

#[test]
fn calls_attempts_pauses_and_stops_are_counted_separately() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let policy = Policy::new(Duration::from_secs(1))
        .with_backoff(Backoff::constant(Duration::from_millis(100)));
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            // One call: two failures, then success.
            let op = Scripted::new([Step::fail_before_effect(), Step::fail_before_effect()]);
            retries::call(&policy)
                .name(&STOCK)
                .idempotent()
                .outcome(async |at: &Attempt| op.call(at).await)
                .await
                .unwrap();
            // One call stopped by its deadline.
            let op = Scripted::new([Step::hang()]);
            let _ = retries::call(&policy)
                .name(&STOCK)
                .idempotent()
                .outcome(async |at: &Attempt| op.call(at).await)
                .await;
        });
    });
    let snapshot = snapshotter.snapshot().into_vec();
    let find = |name: &str, extra: &[(&str, &str)]| {
        let found = snapshot.iter().find(|(k, _, _, _)| {
            let l = labels(k);
            k.key().name() == name
                && l.contains(&("function".into(), "stock".into()))
                && extra
                    .iter()
                    .all(|(a, b)| l.contains(&((*a).to_string(), (*b).to_string())))
        });
        let Some((k, _, _, v)) = found else {
            panic!("no {name} {extra:?}")
        };
        (k.kind(), v)
    };
    let counter = |name, extra| match find(name, extra) {
        (MetricKind::Counter, DebugValue::Counter(n)) => *n,
        other => panic!("{name}: {other:?}"),
    };
    let histogram = |name, extra| match find(name, extra) {
        (MetricKind::Histogram, DebugValue::Histogram(v)) => {
            v.iter().map(|x| x.into_inner()).collect::<Vec<f64>>()
        }
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(counter("retry.call.started", &[]), 2);
    assert_eq!(counter("retry.attempt.started", &[]), 4);
    assert_eq!(counter("retry.call.completed", &[("outcome", "ok")]), 1);
    assert_eq!(
        counter("retry.call.completed", &[("outcome", "deadline_exceeded")]),
        1
    );
    assert_eq!(
        counter(
            "retry.call.stopped_early",
            &[("reason", "deadline_exceeded")]
        ),
        1
    );
    assert_eq!(histogram("retry.pause.duration", &[]), [0.1, 0.1]);
    assert_eq!(histogram("retry.call.retries", &[]), [2.0, 0.0]);
    assert_eq!(
        histogram("retry.call.duration", &[("outcome", "deadline_exceeded")]),
        [1.0]
    );
    assert_eq!(
        histogram("retry.attempt.duration", &[("verdict", "cut_off")]),
        [1.0]
    );
    assert_eq!(
        histogram("retry.attempt.duration", &[("verdict", "not_executed")]).len(),
        2
    );
}
