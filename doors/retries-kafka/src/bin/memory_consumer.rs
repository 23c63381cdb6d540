//! Test support only (for `tests/memory.rs`): a process that consumes
//! `COUNT` records of `TOPIC` with a slow handler (`HANDLER_MS` a record),
//! then prints its peak resident memory (`VmHWM`, Linux) as `peak_kib N`.
//!
//! `memory_consumer BROKERS GROUP TOPIC COUNT HANDLER_MS runner QUEUED_BYTES`: through
//! `RetryTopics` (one record in flight per partition, at most `QUEUED_BYTES`
//! queued behind them);
//! `memory_consumer BROKERS GROUP TOPIC COUNT HANDLER_MS plain`: a plain consumer loop
//! (one record at a time, offsets committed every 100 ms), the baseline.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use retries::{Attempt, Classify, Verdict};
use retries_kafka::{Record, RetryTopics, Topics};

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

impl Classify for Never {
    fn classify(&self) -> Verdict {
        Verdict::permanent()
    }
}

/// The process's peak resident memory in KiB (0 where `/proc` has none).
fn peak_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, brokers, group, topic, count, handler_ms, mode, rest @ ..] = args.as_slice() else {
        return Err(
            "memory_consumer BROKERS GROUP TOPIC COUNT HANDLER_MS runner QUEUED_BYTES | plain"
                .into(),
        );
    };
    let count: usize = count.parse()?;
    let pause = Duration::from_millis(handler_ms.parse()?);
    if mode == "plain" {
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", group)
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()?;
        consumer.subscribe(&[topic])?;
        let mut last_commit = Instant::now();
        for _ in 0..count {
            let m = consumer.recv().await?;
            tokio::time::sleep(pause).await;
            consumer.store_offset_from_message(&m)?;
            if last_commit.elapsed() >= Duration::from_millis(100) {
                consumer.commit_consumer_state(CommitMode::Async)?;
                last_commit = Instant::now();
            }
        }
    } else {
        let bytes: usize = rest.first().ok_or("QUEUED_BYTES")?.parse()?;
        let done = Arc::new(AtomicUsize::new(0));
        let d = Arc::clone(&done);
        let handler = async move |_: &Record, _: &Attempt| -> Result<(), Never> {
            tokio::time::sleep(pause).await;
            d.fetch_add(1, Ordering::Relaxed);
            Ok(())
        };
        RetryTopics::new(
            brokers,
            group,
            Topics::new(topic, &[Duration::from_secs(1)]),
        )
        .max_queued_bytes(bytes)
        .run(handler, async move {
            while done.load(Ordering::Relaxed) < count {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await?;
    }
    println!("peak_kib {}", peak_kib());
    Ok(())
}
