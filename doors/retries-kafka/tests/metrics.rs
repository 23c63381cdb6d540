//! What the runner tells, against a real broker: its metrics, per topic,
//! through a debugging recorder (records handled, republished per level,
//! dead-lettered per reason, the time partitions stayed paused), and its log:
//! one WARN per record that gives up, none from the engine for the
//! in-process calls the runner owns.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Capture, HandlerError, produce, wait_for};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use retries::{Attempt, Backoff, Policy};
use retries_kafka::broker::Broker;
use retries_kafka::{Record, RetryTopics, Topics};
use tracing_subscriber::layer::SubscriberExt;

#[test]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
fn processed_retried_dead_lettered_and_paused_are_counted_per_topic_and_logged_once() {
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let events = Arc::new(Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(Capture(Arc::clone(&events)));
    let _log = tracing::subscriber::set_default(subscriber);
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
    logged_once(&events.lock().unwrap());

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

/// One WARN, for the dead letter; the engine's give-ups of the in-process
/// calls ("flaky" twice, "bad" once) are DEBUG, as the runner's own line
/// says what became of each record.
fn logged_once(events: &[(tracing::Level, String, String)]) {
    let warnings: Vec<_> = events
        .iter()
        .filter(|(level, _, _)| *level <= tracing::Level::WARN)
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert_eq!(warnings[0].1, "retries_kafka");
    assert!(
        warnings[0].2.contains("record dead-lettered"),
        "{warnings:?}"
    );
    let engine_give_ups = events
        .iter()
        .filter(|(_, target, message)| target == "retries" && message.contains("call failed"))
        .count();
    assert_eq!(engine_give_ups, 2, "at DEBUG: {events:#?}");
}

/// A handler slower than `max.poll.interval.ms` (1 s here) with every slot
/// taken: the consumer is not polled in time. The log says so ("too
/// slow", not "broker error"), and the partitions the group takes back are
/// logged at INFO.
#[test]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
fn a_handler_too_slow_for_the_poll_interval_is_said_so() {
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let events = Arc::new(Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(Capture(Arc::clone(&events)));
    let _log = tracing::subscriber::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let topics = Topics::new("sluggish", &[Duration::from_millis(100)]);
        broker.create_topics(&topics.all(), 1).await.unwrap();
        produce(&broker, topics.main(), &["slow".to_owned()]).await;
        let calls = Arc::new(AtomicU64::new(0));
        let c = Arc::clone(&calls);
        let handler = async move |_: &Record, _: &Attempt| -> Result<(), HandlerError> {
            if c.fetch_add(1, Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(2500)).await;
            }
            Ok(())
        };
        let runner = RetryTopics::new(&broker.address(), "sluggish-app", topics)
            .concurrency(1)
            .policy(Policy::new(Duration::from_secs(10)))
            .consumer_setting("session.timeout.ms", "1000")
            .consumer_setting("heartbeat.interval.ms", "300")
            .consumer_setting("max.poll.interval.ms", "1000");
        let e = Arc::clone(&events);
        runner
            .run(handler, async move {
                wait_for(Duration::from_secs(30), || {
                    let seen = e.lock().unwrap();
                    seen.iter().any(|(_, _, m)| m.contains("too slow"))
                        && seen
                            .iter()
                            .any(|(_, _, m)| m.contains("partitions revoked"))
                })
                .await;
            })
            .await
            .unwrap();
    });
    let events = events.lock().unwrap().clone();
    let said = |level: tracing::Level, text: &str| {
        events
            .iter()
            .any(|(l, t, m)| *l == level && t == "retries_kafka" && m.contains(text))
    };
    assert!(said(tracing::Level::WARN, "too slow"), "{events:#?}");
    assert!(!said(tracing::Level::WARN, "broker error"), "{events:#?}");
    assert!(
        said(tracing::Level::INFO, "partitions revoked"),
        "{events:#?}"
    );
}
