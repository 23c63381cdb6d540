//! What the Kafka tests share: the handler's error, producing records,
//! reading a topic to its end, and a wait with a bound.

#![allow(dead_code, unreachable_pub)] // each test file uses a part

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::Message;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Headers;
use rdkafka::producer::{FutureProducer, FutureRecord};
use retries::{Backoff, Classify, Policy, Verdict};
use retries_kafka::broker::Broker;

/// The handler's error.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    #[error("downstream refused")]
    Refused,
    #[error("downstream timed out after the request was sent")]
    Lost,
    #[error("invalid record")]
    Invalid,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

impl Classify for HandlerError {
    fn classify(&self) -> Verdict {
        match self {
            Self::Refused => Verdict::not_executed(),
            Self::Lost => Verdict::unknown(),
            Self::Invalid => Verdict::permanent(),
            Self::Stopped(s) => s.classify(),
        }
    }
}

/// Produce `payloads` to `topic`, keyed by index, one per batch.
pub async fn produce(broker: &Broker, topic: &str, payloads: &[String]) {
    let producer: FutureProducer = broker.producer().unwrap();
    for (i, p) in payloads.iter().enumerate() {
        let key = i.to_string();
        producer
            .send(
                FutureRecord::to(topic).key(&key).payload(p),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
}

/// Every record of `topic` (one partition) until it is quiet for `quiet`:
/// payloads with their headers.
pub async fn read_all(
    broker: &Broker,
    topic: &str,
    quiet: Duration,
) -> Vec<(String, Vec<(String, String)>)> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.address())
        .set("group.id", format!("reader-{topic}"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut out = Vec::new();
    while let Ok(Ok(m)) = tokio::time::timeout(quiet, consumer.recv()).await {
        let payload = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
        let headers = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| {
                        (
                            h.key.to_owned(),
                            String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push((payload, headers));
    }
    out
}

/// Wait until `done()` holds, at most `limit`.
pub async fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < limit, "not done within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Produce one record with `headers` to `topic`, keyed by its payload.
pub async fn produce_with_headers(
    broker: &Broker,
    topic: &str,
    payload: &str,
    headers: &[(&str, &str)],
) {
    produce_keyed_with_headers(broker, topic, payload, payload, headers).await;
}

/// Produce one record with `key`, `payload` and `headers` to `topic`.
pub async fn produce_keyed_with_headers(
    broker: &Broker,
    topic: &str,
    key: &str,
    payload: &str,
    headers: &[(&str, &str)],
) {
    let producer: FutureProducer = broker.producer().unwrap();
    let mut h = rdkafka::message::OwnedHeaders::new();
    for (k, v) in headers {
        h = h.insert(rdkafka::message::Header {
            key: k,
            value: Some(*v),
        });
    }
    producer
        .send(
            FutureRecord::to(topic).key(key).payload(payload).headers(h),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
}

/// The runner's in-process retry in these tests: two attempts, no pause,
/// per level.
pub fn in_process() -> Policy {
    Policy::new(Duration::from_secs(1))
        .with_max_attempts(2)
        .with_backoff(Backoff::constant(Duration::ZERO))
}

/// Every event: its level, target and message.
pub type Events = Arc<Mutex<Vec<(tracing::Level, String, String)>>>;

pub struct Capture(pub Events);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message<'a>(&'a mut String);
        impl tracing::field::Visit for Message<'_> {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    *self.0 = format!("{v:?}");
                }
            }
        }
        let mut message = String::new();
        event.record(&mut Message(&mut message));
        let meta = event.metadata();
        self.0
            .lock()
            .unwrap()
            .push((*meta.level(), meta.target().to_owned(), message));
    }
}
