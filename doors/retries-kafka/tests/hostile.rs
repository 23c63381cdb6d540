//! What a durable-retry runner must survive from its own handler and from
//! the producers of its main topic, against a real broker (tansu, on
//! loopback): a handler that panics, `retries-*` headers forged on the main
//! topic, and a handler slower than the record deadline.

// Scenario tests read top to bottom: long, with their constants where used.
#![allow(
    clippy::too_many_lines,
    clippy::items_after_statements,
    clippy::similar_names
)]

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{HandlerError, in_process, produce, wait_for};
use retries::{Attempt, Policy, Reason};
use retries_kafka::broker::Broker;
use retries_kafka::{DeadLetter, Record, RetryTopics, Topics};

fn payload(r: &Record) -> String {
    String::from_utf8_lossy(r.payload().unwrap_or_default()).into_owned()
}

/// `records` (key, payload) to `topic` through a producer that allows
/// records of 2 MB (the runner's allows 1 MB), each with a header of its
/// own (`trace-id`).
async fn produce_large(broker: &Broker, topic: &str, records: &[(&str, &str)]) {
    let producer: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", broker.address())
        .set("message.max.bytes", "2000000")
        .create()
        .unwrap();
    for (key, p) in records {
        let headers = rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
            key: "trace-id",
            value: Some("abc"),
        });
        producer
            .send(
                rdkafka::producer::FutureRecord::to(topic)
                    .key(*key)
                    .payload(*p)
                    .headers(headers),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
}

/// A runner whose handler fails the records `fails` picks, run until one
/// record is handled: the payloads handled, the dead letters handed to the
/// hook (offset and why), and the runner's counts.
async fn run_until_one_handled(
    broker: &Broker,
    group: &str,
    topics: &Topics,
    fails: fn(&Record) -> Option<HandlerError>,
) -> (
    Vec<String>,
    Vec<(i64, retries_kafka::DeadLetter)>,
    retries_kafka::Stats,
) {
    let handled = Arc::new(Mutex::new(Vec::new()));
    let h = Arc::clone(&handled);
    let handler = async move |r: &Record, _: &Attempt| -> Result<(), HandlerError> {
        if let Some(e) = fails(r) {
            return Err(e);
        }
        h.lock().unwrap().push(payload(r));
        Ok(())
    };
    let dead = Arc::new(Mutex::new(Vec::new()));
    let d = Arc::clone(&dead);
    let h2 = Arc::clone(&handled);
    let stats = RetryTopics::new(&broker.address(), group, topics.clone())
        .policy(in_process())
        .on_dead_letter(move |r, why| d.lock().unwrap().push((r.offset(), why.clone())))
        .run(handler, async move {
            wait_for(Duration::from_secs(30), || h2.lock().unwrap().len() == 1).await;
        })
        .await
        .expect("the consumer carries on");
    let handled = handled.lock().unwrap().clone();
    let dead = dead.lock().unwrap().clone();
    (handled, dead, stats)
}

/// A header of a record `common::read_all` read.
fn header(record: &(String, Vec<(String, String)>), name: &str) -> Option<String> {
    record
        .1
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn a_panicking_handler_is_a_failed_attempt_and_the_consumer_goes_on() {
    // Record 1's handler panics on every call. Each panic is a failed
    // attempt with an unknown outcome: retried in-process (idempotent),
    // republished to the one retry level, retried there, then
    // dead-lettered with the panic's message; the records around it are
    // handled, and `run` returns when asked.
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let topics = Topics::new("panics", &[Duration::from_millis(100)]);
    broker.create_topics(&topics.all(), 1).await.unwrap();
    let records = ["before", "boom", "after"].map(str::to_owned);
    produce(&broker, topics.main(), &records).await;
    let calls = Arc::new(Mutex::new(Vec::new()));
    let c = Arc::clone(&calls);
    let handler = async move |r: &Record, _: &Attempt| -> Result<(), HandlerError> {
        let p = payload(r);
        c.lock().unwrap().push((p.clone(), r.level()));
        assert!(p != "boom", "the handler's bug on record {}", r.offset());
        Ok(())
    };
    let dead = Arc::new(Mutex::new(Vec::<(String, DeadLetter)>::new()));
    let d = Arc::clone(&dead);
    let runner = RetryTopics::new(&broker.address(), "panics-app", topics.clone())
        .policy(in_process())
        .on_dead_letter(move |r, why| d.lock().unwrap().push((payload(r), why.clone())));
    let (c2, d2) = (Arc::clone(&calls), Arc::clone(&dead));
    let stats = runner
        .run(handler, async move {
            wait_for(Duration::from_secs(30), || {
                !d2.lock().unwrap().is_empty()
                    && c2
                        .lock()
                        .unwrap()
                        .iter()
                        .filter(|(p, _)| p != "boom")
                        .count()
                        == 2
            })
            .await;
        })
        .await
        .expect("the consumer carries on past a panicking handler");
    let calls = calls.lock().unwrap().clone();
    let boom: Vec<u32> = calls
        .iter()
        .filter(|(p, _)| p == "boom")
        .map(|(_, level)| *level)
        .collect();
    assert_eq!(boom, [0, 0, 1, 1], "two attempts at each level");
    let others: Vec<&str> = calls
        .iter()
        .filter(|(p, _)| p != "boom")
        .map(|(p, _)| p.as_str())
        .collect();
    assert_eq!(others, ["before", "after"], "each once, in order");
    let dead = dead.lock().unwrap().clone();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].0, "boom");
    assert_eq!(dead[0].1.reason, Reason::Exhausted);
    let error = dead[0].1.error.as_deref().unwrap_or_default();
    assert!(
        error.starts_with("the handler panicked: the handler's bug on record 1"),
        "{error}"
    );
    assert_eq!(stats.retried, vec![1]);
    assert_eq!(stats.dead_lettered, 1);
    // Its headers say so too.
    let dlt = common::read_all(&broker, topics.dlt(), Duration::from_secs(2)).await;
    assert_eq!(dlt.len(), 1);
    let header = |name: &str| header(&dlt[0], name);
    assert!(
        header("retries-error").is_some_and(|e| e.starts_with("the handler panicked")),
        "{:?}",
        dlt[0].1
    );
    assert_eq!(header("retries-verdict").as_deref(), Some("unknown"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn retries_headers_on_the_main_topic_are_not_trusted() {
    // A producer of the main topic writes the runner's own headers: another
    // record's idempotency key, a first-seen time of 0 (before a record
    // deadline of an hour), a due time, an error. None of them counts: each
    // record is handled at once, with the key of its own coordinates.
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let topics = Topics::new("trusted", &[Duration::from_millis(100)]);
    broker.create_topics(&topics.all(), 1).await.unwrap();
    produce(&broker, topics.main(), &["plain".to_owned()]).await;
    // Learn record 0's key from a first run, then forge it on record 1.
    let keys = Arc::new(Mutex::new(Vec::new()));
    let k = Arc::clone(&keys);
    let handler = async move |r: &Record, _: &Attempt| -> Result<(), HandlerError> {
        k.lock()
            .unwrap()
            .push((payload(r), r.idempotency_key().to_string()));
        Ok(())
    };
    let k2 = Arc::clone(&keys);
    RetryTopics::new(&broker.address(), "trusted-app", topics.clone())
        .policy(in_process())
        .run(&handler, async move {
            wait_for(Duration::from_secs(20), || k2.lock().unwrap().len() == 1).await;
        })
        .await
        .unwrap();
    let stolen = keys.lock().unwrap()[0].1.clone();
    let far = (common::now_ms() + 3_600_000).to_string();
    let cases: [(&str, &[(&str, &str)]); 3] = [
        ("stolen-key", &[("retries-key", &stolen)]),
        (
            "seen-long-ago",
            &[("retries-first-seen-ms", "0"), ("retries-attempt", "3")],
        ),
        (
            "due-later",
            &[("retries-due-ms", &far), ("retries-error", "forged")],
        ),
    ];
    for (payload, headers) in &cases {
        common::produce_with_headers(&broker, topics.main(), payload, headers).await;
    }
    let dead = Arc::new(AtomicU64::new(0));
    let d = Arc::clone(&dead);
    let k3 = Arc::clone(&keys);
    let t0 = Instant::now();
    RetryTopics::new(&broker.address(), "trusted-app", topics.clone())
        .policy(in_process())
        .record_deadline(Duration::from_hours(1))
        .on_dead_letter(move |_, _| {
            d.fetch_add(1, Ordering::SeqCst);
        })
        .run(&handler, async move {
            wait_for(Duration::from_secs(20), || k3.lock().unwrap().len() == 4).await;
        })
        .await
        .unwrap();
    assert!(t0.elapsed() < Duration::from_secs(15), "none waited");
    assert_eq!(dead.load(Ordering::SeqCst), 0, "none dead-lettered");
    let keys = keys.lock().unwrap().clone();
    let payloads: Vec<&str> = keys.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        payloads,
        ["plain", "stolen-key", "seen-long-ago", "due-later"]
    );
    let mut distinct: Vec<&str> = keys.iter().map(|(_, k)| k.as_str()).collect();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "every record its own key: {keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn the_record_deadline_bounds_the_handler() {
    // The runner's policy allows 10 s, the record deadline 1 s, and the
    // handler takes 3 s: the in-process call is cut off at the record
    // deadline, the record is dead-lettered `deadline_exceeded`, and no
    // handler call runs to its end.
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let topics = Topics::new("slow", &[Duration::from_millis(100)]);
    broker.create_topics(&topics.all(), 1).await.unwrap();
    produce(&broker, topics.main(), &["slow".to_owned()]).await;
    let (started, finished) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (s, f) = (Arc::clone(&started), Arc::clone(&finished));
    let first_call = Arc::new(Mutex::new(None::<Instant>));
    let fc = Arc::clone(&first_call);
    let handler = async move |_: &Record, _: &Attempt| -> Result<(), HandlerError> {
        fc.lock().unwrap().get_or_insert_with(Instant::now);
        s.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(3)).await;
        f.fetch_add(1, Ordering::SeqCst);
        Ok(())
    };
    let dead = Arc::new(Mutex::new(Vec::new()));
    let d = Arc::clone(&dead);
    let at = Arc::new(Mutex::new(None));
    let a = Arc::clone(&at);
    let d2 = Arc::clone(&dead);
    let stats = RetryTopics::new(&broker.address(), "slow-app", topics.clone())
        .policy(Policy::new(Duration::from_secs(10)).with_max_attempts(2))
        .record_deadline(Duration::from_secs(1))
        .on_dead_letter(move |_, why| {
            a.lock().unwrap().get_or_insert_with(Instant::now);
            d.lock().unwrap().push(why.clone());
        })
        .run(handler, async move {
            wait_for(Duration::from_secs(20), || !d2.lock().unwrap().is_empty()).await;
        })
        .await
        .unwrap();
    let dead = dead.lock().unwrap().clone();
    assert_eq!(dead[0].reason, Reason::DeadlineExceeded, "{dead:?}");
    assert_eq!(
        started.load(Ordering::SeqCst),
        1,
        "no attempt after the deadline"
    );
    assert_eq!(
        finished.load(Ordering::SeqCst),
        0,
        "cut off, not committed as done"
    );
    assert_eq!(
        stats.retried,
        Vec::<u64>::new(),
        "not republished past its deadline"
    );
    // The record is first seen just before its handler starts: it is
    // dead-lettered about 1 s after that, not after the handler's 3 s.
    let at = at.lock().unwrap().expect("dead-lettered");
    let first = first_call.lock().unwrap().expect("called");
    let after = at.duration_since(first);
    assert!(
        after < Duration::from_secs(2),
        "dead-lettered {after:?} after the handler started"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn a_record_too_large_to_republish_is_dead_lettered_without_its_payload() {
    // A record just under the producer's 1,000,000-byte limit fails: with
    // the runner's headers it is over the limit, so it can never be
    // republished, nor dead-lettered whole. It is dead-lettered without its
    // payload (key, headers, coordinates and reason kept), once, and the
    // record behind it is handled: no loop, no exit.
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let topics = Topics::new("large", &[Duration::from_millis(100)]);
    broker.create_topics(&topics.all(), 1).await.unwrap();
    let big = "x".repeat(999_950);
    produce_large(&broker, topics.main(), &[("big", &big), ("small", "after")]).await;
    let (handled, dead, stats) = run_until_one_handled(&broker, "large-app", &topics, |r| {
        (r.payload().map_or(0, <[u8]>::len) > 1000).then_some(HandlerError::Refused)
    })
    .await;
    assert_eq!(handled, ["after"]);
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].0, 0);
    assert_eq!(dead[0].1.reason, Reason::Exhausted);
    let error = dead[0].1.error.clone().unwrap_or_default();
    assert!(error.starts_with("too large to republish"), "{error}");
    assert!(error.contains("without its payload"), "{error}");
    assert_eq!(stats.retried, Vec::<u64>::new());
    let dlt = common::read_all(&broker, topics.dlt(), Duration::from_secs(2)).await;
    assert_eq!(dlt.len(), 1);
    assert_eq!(dlt[0].0, "", "no payload");
    let header = |name: &str| header(&dlt[0], name);
    assert_eq!(header("retries-payload").as_deref(), Some("dropped"));
    assert_eq!(header("retries-original-offset").as_deref(), Some("0"));
    assert_eq!(header("retries-reason").as_deref(), Some("exhausted"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn a_record_whose_key_is_too_large_gets_a_minimal_dead_letter() {
    // A 1.1 MB key: no write that keeps it fits the producer's limit, not
    // even a dead letter without the payload. It gets a minimal dead
    // letter (the runner's headers alone), counted and handed to the hook;
    // the record behind it is handled.
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let topics = Topics::new("bigkey", &[Duration::from_millis(100)]);
    broker.create_topics(&topics.all(), 1).await.unwrap();
    let key = "k".repeat(1_100_000);
    produce_large(
        &broker,
        topics.main(),
        &[(&key, "first"), ("small", "after")],
    )
    .await;
    let (handled, dead, stats) = run_until_one_handled(&broker, "bigkey-app", &topics, |r| {
        (r.key().map_or(0, <[u8]>::len) > 1000).then_some(HandlerError::Invalid)
    })
    .await;
    assert_eq!(handled, ["after"]);
    assert_eq!(stats.dead_lettered, 1, "counted");
    assert_eq!(dead.len(), 1, "handed to the hook: {dead:?}");
    assert_eq!(dead[0].0, 0);
    assert_eq!(dead[0].1.reason, Reason::Permanent);
    let error = dead[0].1.error.clone().unwrap_or_default();
    assert!(
        error.contains("without its key, headers and payload"),
        "{error}"
    );
    let dlt = common::read_all(&broker, topics.dlt(), Duration::from_secs(2)).await;
    assert_eq!(dlt.len(), 1, "one minimal dead letter");
    assert_eq!(dlt[0].0, "", "no payload");
    let header = |name: &str| header(&dlt[0], name);
    assert_eq!(header("retries-record").as_deref(), Some("dropped"));
    assert_eq!(header("retries-payload").as_deref(), Some("dropped"));
    assert_eq!(header("retries-original-topic").as_deref(), Some("bigkey"));
    assert_eq!(header("retries-original-offset").as_deref(), Some("0"));
    assert_eq!(header("retries-reason").as_deref(), Some("permanent"));
    assert_eq!(header("trace-id"), None, "none of its own headers");
    assert!(header("retries-error").is_some_and(|e| e.len() <= 1024));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn producer_settings_reach_the_producer() {
    // A producer setting librdkafka rejects makes `run` fail at once with the
    // client's error naming it: the setting reached the producer.
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let topics = Topics::new("settings", &[Duration::from_millis(100)]);
    broker.create_topics(&topics.all(), 1).await.unwrap();
    let handler = async |_: &Record, _: &Attempt| -> Result<(), HandlerError> { Ok(()) };
    let ended = tokio::time::timeout(
        Duration::from_secs(10),
        RetryTopics::new(&broker.address(), "settings-app", topics.clone())
            .producer_setting("message.max.bytes", "not-a-number")
            .run(handler, std::future::pending()),
    )
    .await
    .expect("fails at once");
    let error = ended.expect_err("an invalid producer setting").to_string();
    assert!(error.contains("message.max.bytes"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn records_written_to_a_retry_topic_by_others_never_take_another_records_key() {
    // Main records "a" and "b"; "b" fails once and is republished by the
    // runner (its copy signed). Someone else writes to the retry topic a
    // record with no headers and one claiming main record 0's origin
    // without a valid signature. The runner's copy of "b" keeps b's key;
    // the other two are keyed by their own coordinates in the retry topic,
    // never by a main record's (before: the headerless one took the key of
    // the main record at its offset, the forged one record 0's).
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let topics = Topics::new("forged", &[Duration::from_millis(100)]);
    broker.create_topics(&topics.all(), 1).await.unwrap();
    produce(&broker, topics.main(), &["a".to_owned(), "b".to_owned()]).await;
    let retry = topics.all()[1];
    common::produce_with_headers(&broker, retry, "headerless", &[]).await;
    common::produce_with_headers(
        &broker,
        retry,
        "forged",
        &[
            ("retries-original-topic", topics.main()),
            ("retries-original-partition", "0"),
            ("retries-original-offset", "0"),
            ("retries-first-seen-ms", "0"),
        ],
    )
    .await;
    let seen = Arc::new(Mutex::new(Vec::<(String, u32, String)>::new()));
    let s = Arc::clone(&seen);
    let b_first = Arc::new(Mutex::new(None::<String>));
    let b1 = Arc::clone(&b_first);
    let handler = async move |r: &Record, _: &Attempt| -> Result<(), HandlerError> {
        if payload(r) == "b" && r.level() == 0 {
            *b1.lock().unwrap() = Some(r.idempotency_key().to_string());
            return Err(HandlerError::Refused);
        }
        s.lock()
            .unwrap()
            .push((payload(r), r.level(), r.idempotency_key().to_string()));
        Ok(())
    };
    let s2 = Arc::clone(&seen);
    RetryTopics::new(&broker.address(), "forged-app", topics.clone())
        .policy(in_process())
        .origin_secret(*b"a deployment's secret, 32 bytes")
        .run(&handler, async move {
            wait_for(Duration::from_secs(30), || s2.lock().unwrap().len() == 4).await;
        })
        .await
        .unwrap();
    let seen = seen.lock().unwrap().clone();
    let key = |p: &str| {
        seen.iter()
            .find(|(q, _, _)| q == p)
            .map_or_else(|| panic!("{p} handled: {seen:?}"), |(_, _, k)| k.clone())
    };
    let level = |p: &str| seen.iter().find(|(q, _, _)| q == p).map(|(_, l, _)| *l);
    assert_eq!(
        level("b"),
        Some(1),
        "b handled from its signed copy: {seen:?}"
    );
    let mut keys: Vec<String> = ["a", "b", "headerless", "forged"].map(key).to_vec();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 4, "every record its own key: {seen:?}");
    // The runner's signed copy of b kept the key b had on the main topic.
    assert_eq!(Some(key("b")), b_first.lock().unwrap().clone());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn a_signed_copys_headers_moved_onto_another_payload_take_no_key() {
    // Main record "b" fails once and the runner republishes it, signed.
    // Someone who can write the retry topic (but has no secret) copies
    // that genuine copy's headers, every one of them, onto another payload
    // under the same Kafka key. The signature covers the payload: the
    // copy's claimed origin does not count, and it is keyed by its own
    // coordinates in the retry topic, never by b's.
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let topics = Topics::new("moved", &[Duration::from_millis(100)]);
    broker.create_topics(&topics.all(), 1).await.unwrap();
    produce(&broker, topics.main(), &["b".to_owned()]).await;
    let seen = Arc::new(Mutex::new(Vec::<(String, u32, String)>::new()));
    let runner = |until: &'static str| {
        let (s, s2) = (Arc::clone(&seen), Arc::clone(&seen));
        let handler = async move |r: &Record, _: &Attempt| -> Result<(), HandlerError> {
            if payload(r) == "b" && r.level() == 0 {
                s.lock()
                    .unwrap()
                    .push((payload(r), r.level(), r.idempotency_key().to_string()));
                return Err(HandlerError::Refused);
            }
            s.lock()
                .unwrap()
                .push((payload(r), r.level(), r.idempotency_key().to_string()));
            Ok(())
        };
        let broker = broker.address();
        let topics = topics.clone();
        async move {
            RetryTopics::new(&broker, "moved-app", topics)
                .policy(Policy::new(Duration::from_secs(1)).with_max_attempts(1))
                .origin_secret(*b"a deployment's secret, 32 bytes")
                .run(handler, async move {
                    wait_for(Duration::from_secs(30), || {
                        s2.lock()
                            .unwrap()
                            .iter()
                            .any(|(p, l, _)| p == until && *l == 1)
                    })
                    .await;
                })
                .await
                .unwrap()
        }
    };
    runner("b").await;
    let retry = topics.all()[1];
    let copies = common::read_all(&broker, retry, Duration::from_secs(2)).await;
    let genuine = copies
        .iter()
        .find(|(p, _)| p == "b")
        .expect("the runner's copy of b");
    assert!(
        header(genuine, "retries-origin-mac").is_some(),
        "{genuine:?}"
    );
    let headers: Vec<(&str, &str)> = genuine
        .1
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    // The same Kafka key ("0", b's), the same headers, another payload.
    common::produce_keyed_with_headers(&broker, retry, "0", "moved", &headers).await;
    runner("moved").await;

    let seen = seen.lock().unwrap().clone();
    let key = |p: &str, level: u32| {
        seen.iter()
            .find(|(q, l, _)| q == p && *l == level)
            .map_or_else(|| panic!("{p} at {level}: {seen:?}"), |(_, _, k)| k.clone())
    };
    // The genuine copy kept b's key; the moved headers gave none.
    assert_eq!(key("b", 1), key("b", 0), "{seen:?}");
    assert_ne!(key("moved", 1), key("b", 0), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn a_non_idempotent_handler_cut_by_its_deadline_is_an_unknown_outcome() {
    // A non-idempotent handler applies its effect, then outlives the
    // policy's deadline (1 s) by far. The cut attempt may have done its
    // work: without `reconcile` the record is dead-lettered
    // `unknown_outcome`, its error naming the cut, never republished and
    // run again; with one, its next owner asks `reconcile` first, which
    // finds the effect: committed, the handler not run again.
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    for reconciled in [false, true] {
        let name = if reconciled { "cut-rc" } else { "cut-dl" };
        let topics = Topics::new(name, &[Duration::from_millis(100)]);
        broker.create_topics(&topics.all(), 1).await.unwrap();
        produce(&broker, topics.main(), &["pay".to_owned()]).await;
        let effects = Arc::new(AtomicU64::new(0));
        let (e, e2) = (Arc::clone(&effects), Arc::clone(&effects));
        let calls = Arc::new(AtomicU64::new(0));
        let c = Arc::clone(&calls);
        let handler = async move |_: &Record, _: &Attempt| -> Result<(), HandlerError> {
            c.fetch_add(1, Ordering::SeqCst);
            e.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(())
        };
        let asked = Arc::new(AtomicU64::new(0));
        let a = Arc::clone(&asked);
        let reconcile = async move |_: &Record| -> Result<bool, HandlerError> {
            a.fetch_add(1, Ordering::SeqCst);
            Ok(e2.load(Ordering::SeqCst) > 0)
        };
        let dead = Arc::new(Mutex::new(Vec::<DeadLetter>::new()));
        let (d, d2) = (Arc::clone(&dead), Arc::clone(&dead));
        let runner = RetryTopics::new(&broker.address(), &format!("{name}-app"), topics.clone())
            .policy(Policy::new(Duration::from_secs(1)).with_max_attempts(3))
            .not_idempotent()
            .on_dead_letter(move |_, why| d.lock().unwrap().push(why.clone()));
        let stats = runner.stats();
        let finished = async move {
            wait_for(Duration::from_secs(30), || {
                !d2.lock().unwrap().is_empty() || stats.lock().unwrap().done.iter().sum::<u64>() > 0
            })
            .await;
        };
        let stats = if reconciled {
            runner.run_reconciled(handler, reconcile, finished).await
        } else {
            runner.run(handler, finished).await
        }
        .unwrap();
        let dead = dead.lock().unwrap().clone();
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{name}: run once");
        assert_eq!(effects.load(Ordering::SeqCst), 1, "{name}: applied once");
        if reconciled {
            assert!(dead.is_empty(), "{name}: {dead:?}");
            assert_eq!(asked.load(Ordering::SeqCst), 1, "{name}: looked up first");
            assert_eq!(stats.retried, [1], "{name}: on to the next level, marked");
            assert_eq!(stats.done, [0, 1], "{name}: committed at the next level");
        } else {
            assert_eq!(dead.len(), 1, "{name}: {dead:?}");
            assert_eq!(dead[0].reason, Reason::UnknownOutcome, "{name}: {dead:?}");
            let error = dead[0].error.as_deref().unwrap_or("");
            assert!(
                error.contains("deadline") && error.contains("unknown"),
                "{name}: {error}"
            );
            assert_eq!(asked.load(Ordering::SeqCst), 0);
            assert_eq!(
                stats.retried,
                Vec::<u64>::new(),
                "{name}: never republished"
            );
        }
    }
}
