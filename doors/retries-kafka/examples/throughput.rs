//! The runner's throughput against a plain rdkafka consumer, on the same
//! broker (tansu, in memory, on loopback) and the same records, in one run:
//! a topic of 4 partitions, a handler that does nothing (so what is measured
//! is the consumer, not the work), each side in its own consumer group.
//!
//! * plain: a `StreamConsumer` loop, `recv`, the handler, then a commit of
//!   that record's offset, asynchronous (`CommitMode::Async`);
//! * plain, batched: the same loop committing the latest offset of each
//!   partition every 100 ms (asynchronously);
//! * plain, batched, on the runner's topics: the same, subscribed to the
//!   main topic and the retry level as the runner is (a consumer group
//!   joined over two topics reaches its first record about 0.3 s later on
//!   this broker than over one, whoever the consumer is);
//! * `retries-kafka`: `RetryTopics::run` with its defaults (the engine's
//!   in-process call around each record, 16 in flight, commits in batches).
//!
//! Each side reads every record from the start, three rounds, alternating.
//! Two views of each side, both printed:
//!
//! * from the first record: the rate from the first record handled to the
//!   last (the group join is not counted), and "all committed after" from
//!   the first record handled until the group's committed offsets cover
//!   every record;
//! * from the start: the time from the consumer's creation (before it
//!   subscribes and joins its group) to its first record, and to every
//!   offset committed: what a process that starts, works through a backlog
//!   and stops sees.
//!
//! `cargo run -p retries-kafka --release --example throughput`

// Counts of a benchmark: small constants, converted for rates and offsets.
#![allow(
    clippy::cast_possible_wrap,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation
)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::producer::FutureRecord;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use retries::{Attempt, Classify, Verdict};
use retries_kafka::broker::{self, Broker};
use retries_kafka::{Record, RetryTopics, Topics};

const RECORDS: usize = 20_000;
const PARTITIONS: i32 = 4;
const ROUNDS: usize = 3;

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

impl Classify for Never {
    fn classify(&self) -> Verdict {
        Verdict::permanent()
    }
}

/// The work: nothing, seen by the compiler as something.
fn handle(payload: Option<&[u8]>) {
    std::hint::black_box(payload);
}

/// What one side did in one round.
struct Side {
    /// Records per second, first record to last.
    rate: f64,
    /// First record to every offset committed.
    committed_after: Duration,
    /// Start to the first record.
    first_after: Duration,
    /// Start to every offset committed.
    from_start: Duration,
}

/// A plain loop (recv, handle, commit asynchronously: each record's
/// offset, or with `every` the latest offset of each partition that often).
async fn plain(broker: &Broker, topics: &[&str], group: &str, every: Option<Duration>) -> Side {
    let topic = topics[0];
    let started = Instant::now();
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.address())
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "50")
        .create()
        .expect("a consumer");
    consumer.subscribe(topics).expect("subscribed");
    let mut first = None;
    let mut last_commit = Instant::now();
    let mut latest = std::collections::HashMap::new();
    for i in 0..RECORDS {
        let m = consumer.recv().await.expect("a record");
        first.get_or_insert_with(Instant::now);
        handle(m.payload());
        latest.insert(m.partition(), m.offset() + 1);
        if every.is_none_or(|d| last_commit.elapsed() >= d) || i + 1 == RECORDS {
            let mut tpl = TopicPartitionList::new();
            for (p, o) in latest.drain() {
                tpl.add_partition_offset(topic, p, Offset::Offset(o))
                    .expect("an offset");
            }
            consumer.commit(&tpl, CommitMode::Async).expect("committed");
            last_commit = Instant::now();
        }
    }
    let first = first.expect("records");
    let took = first.elapsed();
    // The asynchronous commits land later: how much later is part of the
    // picture (until then a crash re-reads those records).
    while committed(broker, group) < RECORDS as i64 {
        assert!(
            first.elapsed() < Duration::from_mins(2),
            "commits never landed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Side {
        rate: RECORDS as f64 / took.as_secs_f64(),
        committed_after: first.elapsed(),
        first_after: first - started,
        from_start: started.elapsed(),
    }
}

/// The offsets `group` committed on the topic, summed.
fn committed(broker: &Broker, group: &str) -> i64 {
    committed_at(&broker.address(), group)
}

/// [`committed`], by the broker's address.
fn committed_at(address: &str, group: &str) -> i64 {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", address)
        .set("group.id", group)
        .create()
        .expect("a consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition("bench", p);
    }
    consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("the committed offsets")
        .elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(o) => o,
            _ => 0,
        })
        .sum()
}

/// The runner with its defaults; "committed" is measured as for the plain
/// loops: when the group's committed offsets cover every record (looked up
/// off the runner's thread, every 50 ms once the last record is handled),
/// not when `run` has returned (which also leaves the group).
async fn runner(broker: &Broker, topics: &Topics, group: &str) -> Side {
    let started = Instant::now();
    let done = Arc::new(AtomicUsize::new(0));
    let first = Arc::new(Mutex::new(None::<Instant>));
    let last = Arc::new(Mutex::new(None::<Instant>));
    let (d, f, l) = (Arc::clone(&done), Arc::clone(&first), Arc::clone(&last));
    let handler = async move |r: &Record, _: &Attempt| -> Result<(), Never> {
        f.lock().unwrap().get_or_insert_with(Instant::now);
        handle(r.payload());
        if d.fetch_add(1, Ordering::Relaxed) + 1 == RECORDS {
            *l.lock().unwrap() = Some(Instant::now());
        }
        Ok(())
    };
    let d = Arc::clone(&done);
    let all_committed = Arc::new(Mutex::new(None::<Instant>));
    let a = Arc::clone(&all_committed);
    let (address, name) = (broker.address(), group.to_owned());
    let stats = RetryTopics::new(&broker.address(), group, topics.clone())
        .run(handler, async move {
            while d.load(Ordering::Relaxed) < RECORDS {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            loop {
                let (address, name) = (address.clone(), name.clone());
                let offsets = tokio::task::spawn_blocking(move || committed_at(&address, &name))
                    .await
                    .expect("the look-up");
                if offsets >= RECORDS as i64 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            *a.lock().unwrap() = Some(Instant::now());
        })
        .await
        .expect("the runner");
    let returned = all_committed.lock().unwrap().expect("all committed");
    assert_eq!(stats.done, [RECORDS as u64], "each record handled once");
    assert_eq!(
        committed(broker, group),
        RECORDS as i64,
        "every offset committed"
    );
    let first = first.lock().unwrap().expect("started");
    let took = last.lock().unwrap().expect("done") - first;
    Side {
        rate: RECORDS as f64 / took.as_secs_f64(),
        committed_after: returned - first,
        first_after: first - started,
        from_start: returned - started,
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let Ok(broker) = Broker::start() else {
        println!(
            "tansu 0.6.0 not found; install it with: {}",
            broker::INSTALL
        );
        return;
    };
    let topics = Topics::new("bench", &[Duration::from_secs(1)]);
    broker
        .create_topics(&topics.all(), PARTITIONS)
        .await
        .expect("topics");
    let producer = broker.producer().expect("a producer");
    let payload = vec![b'x'; 100];
    let sends = (0..RECORDS).map(|i| {
        let key = i.to_string();
        let producer = &producer;
        let payload = &payload;
        async move {
            producer
                .send(
                    FutureRecord::to("bench")
                        .partition((i % PARTITIONS as usize) as i32)
                        .key(&key)
                        .payload(payload),
                    Duration::from_secs(30),
                )
                .await
                .expect("produced");
        }
    });
    futures_util::future::join_all(sends).await;
    println!(
        "{RECORDS} records of 100 bytes in {PARTITIONS} partitions, a handler that does nothing"
    );
    println!("From the first record:");
    println!(
        "| round | plain loop, a commit per record: records/s (all committed after) | plain loop, a commit per 100 ms: records/s (all committed after) | retries-kafka: records/s (all committed after) | ratio to the first | ratio to the second |"
    );
    println!("|---|---|---|---|---|---|");
    let mut rounds = Vec::new();
    for round in 0..ROUNDS {
        let p = plain(&broker, &["bench"], &format!("plain-{round}"), None).await;
        let every = Some(Duration::from_millis(100));
        let b = plain(&broker, &["bench"], &format!("batched-{round}"), every).await;
        let same = &topics.all()[..2];
        let t = plain(&broker, same, &format!("two-topics-{round}"), every).await;
        let r = runner(&broker, &topics, &format!("runner-{round}")).await;
        println!(
            "| {} | {:.0} ({:.1} s) | {:.0} ({:.1} s) | {:.0} ({:.1} s) | {:.2} | {:.2} |",
            round + 1,
            p.rate,
            p.committed_after.as_secs_f64(),
            b.rate,
            b.committed_after.as_secs_f64(),
            r.rate,
            r.committed_after.as_secs_f64(),
            r.rate / p.rate,
            r.rate / b.rate
        );
        rounds.push((p, b, t, r));
    }
    println!(
        "median ratios: {:.2} to a commit per record, {:.2} to a commit per 100 ms",
        median(rounds.iter().map(|(p, _, _, r)| r.rate / p.rate).collect()),
        median(rounds.iter().map(|(_, b, _, r)| r.rate / b.rate).collect())
    );
    println!();
    from_start(&rounds);
}

/// The median of `v`.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The second table: each side from its start to every offset committed.
fn from_start(rounds: &[(Side, Side, Side, Side)]) {
    println!(
        "From the start (the consumer created, before it joins its group): first record after, all {RECORDS} committed after, and the rate over that whole time"
    );
    println!(
        "| round | plain loop, a commit per record | plain loop, a commit per 100 ms | the same on the runner's two topics | retries-kafka | ratio to the first | ratio to the second | ratio to the third |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let whole = |s: &Side| RECORDS as f64 / s.from_start.as_secs_f64();
    let cell = |s: &Side| {
        format!(
            "{:.2} s, {:.2} s, {:.0}/s",
            s.first_after.as_secs_f64(),
            s.from_start.as_secs_f64(),
            whole(s)
        )
    };
    for (round, (p, b, t, r)) in rounds.iter().enumerate() {
        println!(
            "| {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} |",
            round + 1,
            cell(p),
            cell(b),
            cell(t),
            cell(r),
            whole(r) / whole(p),
            whole(r) / whole(b),
            whole(r) / whole(t)
        );
    }
    println!(
        "median ratios from the start: {:.2} to a commit per record, {:.2} to a commit per 100 ms, {:.2} to the same on the runner's topics",
        median(
            rounds
                .iter()
                .map(|(p, _, _, r)| whole(r) / whole(p))
                .collect()
        ),
        median(
            rounds
                .iter()
                .map(|(_, b, _, r)| whole(r) / whole(b))
                .collect()
        ),
        median(
            rounds
                .iter()
                .map(|(_, _, t, r)| whole(r) / whole(t))
                .collect()
        )
    );
}
