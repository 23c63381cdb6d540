//! The runner's metrics, per topic, through a debugging recorder, against a
//! real broker: records handled, republished per level, dead-lettered per
//! reason, and the time partitions stayed paused.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{HandlerError, produce, wait_for};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use retries::{Attempt, Backoff, Policy};
use retries_kafka::broker::Broker;
use retries_kafka::{Record, RetryTopics, Topics};

#[test]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
fn processed_retried_dead_lettered_and_paused_are_counted_per_topic() {
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // One thread: the runner's metrics are recorded where it is polled.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let topics = Topics::new("audit", &[Duration::from_millis(100)]);
            broker.create_topics(&topics.all(), 1).await.unwrap();
            // "ok" first time; "flaky" fails its 2 in-process attempts, then
            // succeeds from the retry topic; "bad" is invalid.
            let payloads = ["ok", "flaky", "bad", "ok"].map(str::to_owned);
            produce(&broker, topics.main(), &payloads).await;
            let calls = Arc::new(AtomicU64::new(0));
            let flaky_calls = Arc::new(AtomicU64::new(0));
            let (c, f) = (Arc::clone(&calls), Arc::clone(&flaky_calls));
            let handler = async move |r: &Record, _: &Attempt| -> Result<(), HandlerError> {
                c.fetch_add(1, Ordering::SeqCst);
                match r.payload() {
                    Some(b"bad") => Err(HandlerError::Invalid),
                    Some(b"flaky") if f.fetch_add(1, Ordering::SeqCst) < 2 => {
                        Err(HandlerError::Refused)
                    }
                    _ => Ok(()),
                }
            };
            let runner = RetryTopics::new(&broker.address(), "audit-app", topics).policy(
                Policy::new(Duration::from_secs(1))
                    .with_max_attempts(2)
                    .with_backoff(Backoff::constant(Duration::ZERO)),
            );
            let stats = runner.stats();
            let s = Arc::clone(&stats);
            runner
                .run(handler, async move {
                    wait_for(Duration::from_secs(20), || {
                        let s = s.lock().unwrap();
                        s.done.iter().sum::<u64>() == 3 && s.dead_lettered == 1
                    })
                    .await;
                })
                .await
                .unwrap();
        });
    });
    let snapshot = snapshotter.snapshot().into_vec();
    let find = |name: &str, labels: &[(&str, &str)]| {
        snapshot
            .iter()
            .filter(|(k, _, _, _)| {
                k.key().name() == name
                    && labels
                        .iter()
                        .all(|(a, b)| k.key().labels().any(|l| l.key() == *a && l.value() == *b))
            })
            .map(|(_, _, _, v)| v)
            .collect::<Vec<_>>()
    };
    let count = |name: &str, labels: &[(&str, &str)]| {
        find(name, labels)
            .iter()
            .map(|v| match v {
                DebugValue::Counter(n) => *n,
                other => panic!("{name}: {other:?}"),
            })
            .sum::<u64>()
    };
    assert_eq!(count("retry.kafka.processed", &[("topic", "audit")]), 2);
    assert_eq!(
        count("retry.kafka.processed", &[("topic", "audit-retry-0")]),
        1
    );
    assert_eq!(
        count("retry.kafka.retried", &[("topic", "audit"), ("level", "0")]),
        1
    );
    assert_eq!(
        count(
            "retry.kafka.dead_lettered",
            &[("topic", "audit"), ("reason", "permanent")]
        ),
        1
    );
    // The retry topic's partition was paused until the record was due.
    let paused = find("retry.kafka.paused", &[("topic", "audit-retry-0")]);
    let DebugValue::Histogram(samples) = &paused[0] else {
        panic!("{paused:?}")
    };
    assert!(samples.iter().any(|s| s.into_inner() > 0.0), "{samples:?}");
}
