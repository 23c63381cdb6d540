//! Memory bounded by bytes, against a real broker: 4 partitions of 400 kB
//! records under a slow handler, each consumer in a process of its own,
//! measured by its peak resident memory. The runner's queues hold at most
//! `max_queued_bytes` (here 16 MiB) on top of what a plain consumer loop
//! holds (librdkafka's prefetch); unbounded (as before the bound), they held
//! every record fetched, 1,024 a partition.

use std::process::Command;
use std::time::Duration;

use rdkafka::producer::FutureRecord;
use retries_kafka::Topics;
use retries_kafka::broker::Broker;

const PARTITIONS: i32 = 4;
const PER_PARTITION: usize = 60;
const RECORD: usize = 400_000;
const BOUND: usize = 16 << 20;
/// The runner's own memory beyond its queues: the records in flight (one a
/// partition), the producer, the run loop, and the allocator's slack.
const CONSTANT: u64 = 32 << 10;

fn peak_kib(broker: &Broker, group: &str, topic: &str, mode: &[&str]) -> u64 {
    let count = (PER_PARTITION * 4).to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_memory_consumer"))
        .args([broker.address().as_str(), group, topic, &count])
        .args(mode)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("peak_kib "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no peak: {stdout}"))
}

#[test]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
fn queued_records_are_bounded_by_bytes() {
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let topics = Topics::new("heavy", &[Duration::from_secs(1)]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        broker
            .create_topics(&topics.all(), PARTITIONS)
            .await
            .unwrap();
        let producer = broker.producer().unwrap();
        let payload = vec![b'x'; RECORD];
        for i in 0..PARTITIONS * i32::try_from(PER_PARTITION).unwrap() {
            producer
                .send(
                    FutureRecord::<str, [u8]>::to(topics.main())
                        .partition(i % PARTITIONS)
                        .payload(&payload),
                    Duration::from_secs(10),
                )
                .await
                .unwrap();
        }
    });
    let topic = topics.main();
    // The plain loop's memory is librdkafka's prefetch, whatever its
    // handler's pace (slower than the fetches); the runner's handler is
    // slower still, so that its queues fill.
    let plain = peak_kib(&broker, "plain", topic, &["5", "plain"]);
    let bound = BOUND.to_string();
    let bounded = peak_kib(&broker, "bounded", topic, &["50", "runner", &bound]);
    let none = usize::MAX.to_string();
    let unbounded = peak_kib(&broker, "unbounded", topic, &["50", "runner", &none]);
    eprintln!(
        "peak RSS, KiB: plain {plain}, runner bounded to 16 MiB {bounded}, unbounded {unbounded}"
    );
    let bound_kib = u64::try_from(BOUND >> 10).unwrap();
    assert!(
        bounded <= plain + bound_kib + CONSTANT,
        "plain {plain} KiB, bounded {bounded} KiB"
    );
    // The bound is what holds it: without it, the queues take what the
    // handler has not reached yet.
    assert!(
        unbounded > bounded + bound_kib,
        "bounded {bounded} KiB, unbounded {unbounded} KiB"
    );
}
