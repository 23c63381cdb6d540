//! Retry topics and the dead-letter topic against a real broker (tansu, on
//! loopback): 1,000 records with a scripted mix of outcomes end where the
//! decision table says, with none lost; no record is handled before it is
//! due; an outage behind a breaker pauses the main topic and sends nothing to
//! the dead-letter topic; a non-idempotent unknown outcome is dead-lettered,
//! not republished, unless `reconcile` resolves it. The process-kill test is
//! in `kill.rs`.

// Scenario tests read top to bottom: long, with their constants where used.
#![allow(
    clippy::too_many_lines,
    clippy::items_after_statements,
    clippy::similar_names
)]

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{HandlerError, in_process, now_ms, produce, read_all, wait_for};
use retries::{Attempt, CircuitBreaker, IdempotencyKey};
use retries_kafka::broker::Broker;
use retries_kafka::{Record, RetryTopics, Topics};

/// What the handler saw and did.
#[derive(Default)]
struct Seen {
    /// Calls per record (by idempotency key).
    calls: HashMap<IdempotencyKey, u32>,
    /// The level each record succeeded at, by its index.
    done: HashMap<usize, u32>,
    /// Calls made before the record was due (must stay empty).
    early: Vec<(usize, u64, u64)>,
}

/// `"i:n"`: record `i` fails (refused) its first `n` calls, then succeeds;
/// `"i:p"`: permanently invalid.
fn script(i: usize) -> String {
    let kind = match i % 20 {
        0..=11 => "0".to_owned(),            // first time
        12..=14 => "1".to_owned(),           // in-process retry
        15 | 16 => format!("{}", 2 + i % 2), // level 1
        17 => format!("{}", 4 + i % 2),      // level 2
        18 => "9".to_owned(),                // never: dead-lettered, exhausted
        _ => "p".to_owned(),                 // permanent
    };
    format!("{i}:{kind}")
}

/// Where `script(i)` must end: `Ok(level)` or `Err(reason)`.
fn expected(i: usize) -> Result<u32, &'static str> {
    let s = script(i);
    let kind = s.split(':').nth(1).unwrap();
    match kind {
        "p" => Err("permanent"),
        n => match n.parse::<u32>().unwrap() {
            // Two attempts per level, levels 0, 1, 2.
            n if n < 6 => Ok(n / 2),
            _ => Err("exhausted"),
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn a_thousand_records_end_where_the_decision_table_says() {
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let topics = Topics::new(
        "orders",
        &[Duration::from_millis(100), Duration::from_millis(200)],
    );
    broker.create_topics(&topics.all(), 1).await.unwrap();
    const N: usize = 1000;
    let payloads: Vec<String> = (0..N).map(script).collect();
    produce(&broker, topics.main(), &payloads).await;

    let seen = Arc::new(Mutex::new(Seen::default()));
    let dead = Arc::new(AtomicU64::new(0));
    let d = Arc::clone(&dead);
    let runner = RetryTopics::new(&broker.address(), "orders-app", topics.clone())
        .policy(in_process())
        .budget(Arc::new(retries::TokenBucket::new(1000, 1.0))) // a refund per success: never below half here
        .on_dead_letter(move |_, _| {
            d.fetch_add(1, Ordering::SeqCst);
        });
    let stats = runner.stats();
    let s = Arc::clone(&seen);
    let handler = async move |r: &Record, _: &Attempt| -> Result<(), HandlerError> {
        let text = String::from_utf8_lossy(r.payload().unwrap()).into_owned();
        let (i, kind) = text.split_once(':').unwrap();
        let i: usize = i.parse().unwrap();
        let mut seen = s.lock().unwrap();
        if let Some(due) = r.due_ms() {
            let now = now_ms();
            if now < due {
                seen.early.push((i, now, due));
            }
        }
        let calls = seen.calls.entry(r.idempotency_key()).or_default();
        *calls += 1;
        let calls = *calls;
        if kind == "p" {
            return Err(HandlerError::Invalid);
        }
        if calls <= kind.parse().unwrap() {
            return Err(HandlerError::Refused);
        }
        seen.done.insert(i, r.level());
        Ok(())
    };
    let (s2, dead2) = (Arc::clone(&seen), Arc::clone(&dead));
    let all_accounted = async move {
        wait_for(Duration::from_mins(2), || {
            s2.lock().unwrap().done.len() as u64 + dead2.load(Ordering::SeqCst) == N as u64
        })
        .await;
    };
    let final_stats = runner.run(handler, all_accounted).await.unwrap();

    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(
        seen.early.is_empty(),
        "handled before due: {:?}",
        &seen.early[..seen.early.len().min(5)]
    );
    // Every record where the table says.
    let dlt = read_all(&broker, topics.dlt(), Duration::from_secs(2)).await;
    let mut dead_letters: HashMap<usize, String> = HashMap::new();
    for (payload, headers) in &dlt {
        let i: usize = payload.split(':').next().unwrap().parse().unwrap();
        let reason = headers
            .iter()
            .find(|(k, _)| k == "retries-reason")
            .unwrap()
            .1
            .clone();
        assert!(
            headers
                .iter()
                .any(|(k, v)| k == "retries-original-topic" && v == "orders")
        );
        assert!(
            dead_letters.insert(i, reason).is_none(),
            "dead-lettered twice: {i}"
        );
    }
    let mut lost = 0;
    for i in 0..N {
        match expected(i) {
            Ok(level) => assert_eq!(seen.done.get(&i), Some(&level), "record {i}"),
            Err(reason) => assert_eq!(
                dead_letters.get(&i).map(String::as_str),
                Some(reason),
                "record {i}"
            ),
        }
        if !seen.done.contains_key(&i) && !dead_letters.contains_key(&i) {
            lost += 1;
        }
    }
    assert_eq!(lost, 0);
    // The counts agree: per level done, republished per level, dead letters.
    let per_level = |l: u32| (0..N).filter(|i| expected(*i) == Ok(l)).count() as u64;
    assert_eq!(
        final_stats.done,
        vec![per_level(0), per_level(1), per_level(2)]
    );
    let exhausted = (0..N).filter(|i| expected(*i) == Err("exhausted")).count() as u64;
    assert_eq!(
        final_stats.retried,
        vec![
            per_level(1) + per_level(2) + exhausted,
            per_level(2) + exhausted
        ]
    );
    assert_eq!(final_stats.dead_lettered, dlt.len() as u64);
    assert_eq!(stats.lock().unwrap().main_pauses, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn republished_records_carry_the_headers_and_wait_until_due() {
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let topics = Topics::new("pay", &[Duration::from_millis(500)]);
    broker.create_topics(&topics.all(), 1).await.unwrap();
    produce(&broker, topics.main(), &["0:2".to_owned()]).await;
    let calls = Arc::new(Mutex::new(Vec::new()));
    let c = Arc::clone(&calls);
    let handler = async move |r: &Record, _: &Attempt| -> Result<(), HandlerError> {
        let mut calls = c.lock().unwrap();
        calls.push((now_ms(), r.level(), r.due_ms(), r.idempotency_key()));
        if calls.len() <= 2 {
            Err(HandlerError::Refused)
        } else {
            Ok(())
        }
    };
    let c2 = Arc::clone(&calls);
    RetryTopics::new(&broker.address(), "pay-app", topics.clone())
        .policy(in_process())
        .run(handler, async move {
            wait_for(Duration::from_secs(20), || c2.lock().unwrap().len() == 3).await;
        })
        .await
        .unwrap();
    let calls = calls.lock().unwrap().clone();
    // Two calls at level 0, then one at level 1, not before it was due, and
    // 500 ms after the failure at least.
    let (failed_at, _, _, key) = calls[1];
    let (handled_at, level, due, key_again) = calls[2];
    assert_eq!(level, 1);
    assert_eq!(key, key_again, "one idempotency key for every copy");
    let due = due.unwrap();
    assert!(handled_at >= due, "handled {handled_at} before due {due}");
    assert!(
        due >= failed_at + 500 && due <= failed_at + 1500,
        "due {due}, failed {failed_at}"
    );
    let copies = read_all(&broker, topics.level(0).unwrap(), Duration::from_secs(1)).await;
    assert_eq!(copies.len(), 1);
    let h: HashMap<_, _> = copies[0].1.iter().cloned().collect();
    assert_eq!(h["retries-attempt"], "1");
    assert_eq!(h["retries-original-topic"], "pay");
    assert_eq!(h["retries-original-partition"], "0");
    assert_eq!(h["retries-original-offset"], "0");
    assert_eq!(h["retries-key"], key.to_string());
    assert_eq!(h["retries-error"], "downstream refused");
    assert_eq!(h["retries-verdict"], "not_executed");
    assert!(h.contains_key("retries-due-ms") && h.contains_key("retries-first-seen-ms"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn an_outage_behind_a_breaker_pauses_the_main_topic_and_dead_letters_nothing() {
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let topics = Topics::new("stock", &[Duration::from_millis(100)]);
    broker.create_topics(&topics.all(), 1).await.unwrap();
    const N: usize = 50;
    produce(
        &broker,
        topics.main(),
        &(0..N).map(|i| format!("{i}:0")).collect::<Vec<_>>(),
    )
    .await;
    let down = Arc::new(AtomicBool::new(true));
    let calls = Arc::new(AtomicU64::new(0));
    let done = Arc::new(Mutex::new(std::collections::HashSet::new()));
    let (dn, cl, dd) = (Arc::clone(&down), Arc::clone(&calls), Arc::clone(&done));
    let handler = async move |r: &Record, _: &Attempt| -> Result<(), HandlerError> {
        cl.fetch_add(1, Ordering::SeqCst);
        if dn.load(Ordering::SeqCst) {
            return Err(HandlerError::Refused);
        }
        dd.lock().unwrap().insert(r.idempotency_key());
        Ok(())
    };
    // The breaker opens at the 3rd failure, and lets a probe through every 200 ms.
    let breaker = Arc::new(CircuitBreaker::new(3, Duration::from_millis(200)));
    let runner = RetryTopics::new(&broker.address(), "stock-app", topics.clone())
        .policy(in_process())
        .breaker(Arc::clone(&breaker))
        .probe_every(Duration::from_millis(100));
    let stats = runner.stats();
    let (dn2, dd2, cl2) = (Arc::clone(&down), Arc::clone(&done), Arc::clone(&calls));
    let stop = async move {
        // 1.5 s of outage from the first call (joining the group takes a while).
        wait_for(Duration::from_secs(20), || cl2.load(Ordering::SeqCst) > 0).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        dn2.store(false, Ordering::SeqCst); // the downstream is back
        wait_for(Duration::from_secs(30), || dd2.lock().unwrap().len() == N).await;
    };
    let s = runner.run(handler, stop).await.unwrap();
    assert_eq!(
        done.lock().unwrap().len(),
        N,
        "every record handled once the downstream is back"
    );
    assert_eq!(
        s.dead_lettered, 0,
        "nothing dead-lettered during the outage"
    );
    assert!(
        read_all(&broker, topics.dlt(), Duration::from_millis(500))
            .await
            .is_empty()
    );
    // Only what failed before the breaker opened went to the retry topic.
    assert!(s.retried.iter().sum::<u64>() <= 2, "{s:?}");
    assert!(
        s.main_pauses >= 1 && s.main_paused >= Duration::from_secs(1),
        "{s:?}"
    );
    // During 1.5 s of outage the handler was called a handful of times
    // (failures, then one probe per interval), not 50 × 2.
    assert!(
        calls.load(Ordering::SeqCst) < (N as u64) + 25,
        "{}",
        calls.load(Ordering::SeqCst)
    );
    assert_eq!(stats.lock().unwrap().dead_lettered, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn a_non_idempotent_unknown_outcome_is_dead_lettered_not_republished() {
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let topics = Topics::new("charges", &[Duration::from_millis(100)]);
    broker.create_topics(&topics.all(), 1).await.unwrap();
    produce(
        &broker,
        topics.main(),
        &["0:lost".to_owned(), "1:ok".to_owned()],
    )
    .await;
    let calls = Arc::new(AtomicU64::new(0));
    let reasons = Arc::new(Mutex::new(Vec::new()));
    let (c, rs) = (Arc::clone(&calls), Arc::clone(&reasons));
    let handled = Arc::new(AtomicU64::new(0));
    let h = Arc::clone(&handled);
    let handler = async move |r: &Record, _: &Attempt| -> Result<(), HandlerError> {
        c.fetch_add(1, Ordering::SeqCst);
        if r.payload() == Some(b"0:lost") {
            return Err(HandlerError::Lost); // sent, reply lost: may have charged
        }
        h.fetch_add(1, Ordering::SeqCst);
        Ok(())
    };
    let runner = RetryTopics::new(&broker.address(), "charges-app", topics.clone())
        .policy(in_process())
        .not_idempotent()
        .on_dead_letter(move |_, d| rs.lock().unwrap().push(d.clone()));
    let (h2, r2) = (Arc::clone(&handled), Arc::clone(&reasons));
    let s = runner
        .run(handler, async move {
            wait_for(Duration::from_secs(20), || {
                h2.load(Ordering::SeqCst) == 1 && r2.lock().unwrap().len() == 1
            })
            .await;
        })
        .await
        .unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the lost charge was called once, not retried"
    );
    assert_eq!(s.retried.iter().sum::<u64>(), 0, "nothing republished");
    let reasons = reasons.lock().unwrap().clone();
    assert_eq!(reasons[0].reason, retries::Reason::UnknownOutcome);
    let dlt = read_all(&broker, topics.dlt(), Duration::from_secs(1)).await;
    assert_eq!(dlt.len(), 1);
    assert!(
        dlt[0]
            .1
            .iter()
            .any(|(k, v)| k == "retries-reason" && v == "unknown_outcome")
    );
    assert!(
        read_all(
            &broker,
            topics.level(0).unwrap(),
            Duration::from_millis(500)
        )
        .await
        .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn reconcile_decides_a_non_idempotent_unknown_outcome() {
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let topics = Topics::new("refunds", &[Duration::from_millis(100)]);
    broker.create_topics(&topics.all(), 1).await.unwrap();
    // Record 0: the refund happened, the reply was lost. Record 1: the
    // request was lost before the refund. Reconcile asks the ledger.
    produce(
        &broker,
        topics.main(),
        &["0:done".to_owned(), "1:not-done".to_owned()],
    )
    .await;
    let ledger = Arc::new(Mutex::new(std::collections::HashSet::new()));
    let calls = Arc::new(AtomicU64::new(0));
    let (l, c) = (Arc::clone(&ledger), Arc::clone(&calls));
    let handler = async move |r: &Record, at: &Attempt| -> Result<(), HandlerError> {
        c.fetch_add(1, Ordering::SeqCst);
        let done = r.payload() == Some(b"0:done");
        if at.number() == 1 {
            if done {
                l.lock().unwrap().insert(r.idempotency_key());
            }
            return Err(HandlerError::Lost);
        }
        l.lock().unwrap().insert(r.idempotency_key());
        Ok(())
    };
    let l2 = Arc::clone(&ledger);
    let reconcile = async move |r: &Record| -> Result<bool, HandlerError> {
        Ok(l2.lock().unwrap().contains(&r.idempotency_key()))
    };
    let runner = RetryTopics::new(&broker.address(), "refunds-app", topics.clone())
        .policy(in_process())
        .not_idempotent();
    let stats = runner.stats();
    let st = Arc::clone(&stats);
    let s = runner
        .run_reconciled(handler, reconcile, async move {
            wait_for(Duration::from_secs(20), || {
                st.lock().unwrap().done.first().copied() == Some(2)
            })
            .await;
        })
        .await
        .unwrap();
    // Record 0: one call, found done. Record 1: one call, not found, retried once.
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(ledger.lock().unwrap().len(), 2);
    assert_eq!(s.dead_lettered, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn a_record_past_its_deadline_is_dead_lettered() {
    // Fails at once, goes to a level due 500 ms later; the whole-record
    // deadline is 300 ms, so when it comes due it is dead-lettered instead
    // of handled again.
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let topics = Topics::new("quotes", &[Duration::from_millis(500)]);
    broker.create_topics(&topics.all(), 1).await.unwrap();
    produce(&broker, topics.main(), &["0:refused".to_owned()]).await;
    let calls = Arc::new(AtomicU64::new(0));
    let c = Arc::clone(&calls);
    let handler = async move |_: &Record, _: &Attempt| -> Result<(), HandlerError> {
        c.fetch_add(1, Ordering::SeqCst);
        Err(HandlerError::Refused)
    };
    let dead = Arc::new(Mutex::new(Vec::new()));
    let d = Arc::clone(&dead);
    let runner = RetryTopics::new(&broker.address(), "quotes-app", topics.clone())
        .policy(in_process())
        .record_deadline(Duration::from_millis(300))
        .on_dead_letter(move |_, why| d.lock().unwrap().push(why.clone()));
    let d2 = Arc::clone(&dead);
    let s = runner
        .run(handler, async move {
            wait_for(Duration::from_secs(20), || !d2.lock().unwrap().is_empty()).await;
        })
        .await
        .unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "two in-process attempts, none after the deadline"
    );
    assert_eq!(s.retried, vec![1]);
    let dead = dead.lock().unwrap().clone();
    assert_eq!(dead[0].reason, retries::Reason::DeadlineExceeded);
    assert_eq!(dead[0].error.as_deref(), Some("downstream refused"));
}

/// A handler that is itself retried: inside the runner's in-process attempts
/// it defers to them (one attempt each), as any nested call does.
#[retries::retryable(deadline = "1s", max_attempts = 5, idempotent)]
async fn ship(calls: &AtomicU64) -> Result<(), HandlerError> {
    calls.fetch_add(1, Ordering::SeqCst);
    Err(HandlerError::Refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn a_retryable_handler_defers_to_the_runner() {
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let topics = Topics::new("ships", &[Duration::from_millis(100)]);
    broker.create_topics(&topics.all(), 1).await.unwrap();
    produce(&broker, topics.main(), &["0:refused".to_owned()]).await;
    let calls = Arc::new(AtomicU64::new(0));
    let c = Arc::clone(&calls);
    let handler = async move |_: &Record, _: &Attempt| ship(&c).await;
    let dead = Arc::new(Mutex::new(Vec::new()));
    let d = Arc::clone(&dead);
    let d2 = Arc::clone(&dead);
    RetryTopics::new(&broker.address(), "ships-app", topics.clone())
        .policy(in_process())
        .on_dead_letter(move |_, why| d.lock().unwrap().push(why.reason))
        .run(handler, async move {
            wait_for(Duration::from_secs(20), || !d2.lock().unwrap().is_empty()).await;
        })
        .await
        .unwrap();
    // 2 in-process attempts at level 0 and 2 at level 1, one call each: 4,
    // not 2 × 5 × 2.
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    assert_eq!(
        dead.lock().unwrap().clone(),
        vec![retries::Reason::Exhausted]
    );
}

/// Records in a retry topic whose headers someone else wrote: a negative or
/// unparsable due time, one centuries off (past what `Instant` can hold),
/// a partition past `i32`, a negative first-seen time. None stalls the
/// partition or stops the consumer: each is handled promptly, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn forged_headers_neither_stall_nor_crash_the_consumer() {
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let topics = Topics::new("forged", &[Duration::from_millis(300)]);
    broker.create_topics(&topics.all(), 1).await.unwrap();
    let retry = topics.level(0).unwrap();
    let far = (now_ms() + 10 * 365 * 24 * 3600 * 1000).to_string();
    let cases: [(&str, &[(&str, &str)]); 5] = [
        (
            "negative-due",
            &[("retries-due-ms", "-5"), ("retries-attempt", "1")],
        ),
        ("huge-due", &[("retries-due-ms", "18446744073709551615")]),
        ("far-due", &[("retries-due-ms", &far)]),
        (
            "bad-due",
            &[("retries-due-ms", "soon"), ("retries-key", "not-a-key")],
        ),
        (
            "bad-origin",
            &[
                ("retries-original-partition", "99999999999"),
                ("retries-original-offset", "-1"),
                ("retries-first-seen-ms", "-100"),
            ],
        ),
    ];
    for (payload, headers) in &cases {
        common::produce_with_headers(&broker, retry, payload, headers).await;
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    let handler = async move |r: &Record, _: &Attempt| -> Result<(), HandlerError> {
        let payload = String::from_utf8_lossy(r.payload().unwrap_or_default()).into_owned();
        s.lock().unwrap().push((payload, r.partition(), now_ms()));
        Ok(())
    };
    let s2 = Arc::clone(&seen);
    let t0 = now_ms();
    RetryTopics::new(&broker.address(), "forged-app", topics.clone())
        .policy(in_process())
        .run(handler, async move {
            wait_for(Duration::from_secs(20), || {
                s2.lock().unwrap().len() == cases.len()
            })
            .await;
        })
        .await
        .unwrap();
    let seen = seen.lock().unwrap().clone();
    let mut payloads: Vec<_> = seen.iter().map(|(p, _, _)| p.as_str()).collect();
    payloads.sort_unstable();
    assert_eq!(
        payloads,
        [
            "bad-due",
            "bad-origin",
            "far-due",
            "huge-due",
            "negative-due"
        ],
        "each once"
    );
    // The partition that does not fit an `i32` is taken as missing.
    assert!(
        seen.iter().all(|(_, partition, _)| *partition == 0),
        "{seen:?}"
    );
    // Handled as due: not after a stall of the level's delay per record.
    let last = seen.iter().map(|(_, _, at)| *at).max().unwrap();
    assert!(
        last - t0 < 10_000,
        "handled {} ms after the start",
        last - t0
    );
}

/// Settings at the edge of `Duration`: a retry level's delay, the probe
/// period and the record deadline all `Duration::MAX`. A record that fails
/// is republished due as late as a header can say, and waits there; nothing
/// overflows or panics, and the runner shuts down when asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn delays_of_duration_max_saturate() {
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let topics = Topics::new("forever", &[Duration::MAX]);
    broker.create_topics(&topics.all(), 1).await.unwrap();
    produce(&broker, topics.main(), &["0:9".to_owned()]).await;
    let calls = Arc::new(AtomicU64::new(0));
    let c = Arc::clone(&calls);
    let handler = async move |_: &Record, _: &Attempt| -> Result<(), HandlerError> {
        c.fetch_add(1, Ordering::SeqCst);
        Err(HandlerError::Refused)
    };
    let runner = RetryTopics::new(&broker.address(), "forever-app", topics.clone())
        .policy(in_process())
        .probe_every(Duration::MAX)
        .record_deadline(Duration::MAX);
    let stats = runner.stats();
    let s = Arc::clone(&stats);
    let stats = runner
        .run(handler, async move {
            wait_for(Duration::from_secs(20), || {
                s.lock().unwrap().retried.first() == Some(&1)
            })
            .await;
            // Long enough for the copy to be read back and left waiting.
            tokio::time::sleep(Duration::from_millis(500)).await;
        })
        .await
        .unwrap();
    assert_eq!(stats.retried, [1]);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "two in-process attempts, then it waits"
    );
    let copies = read_all(&broker, topics.level(0).unwrap(), Duration::from_secs(1)).await;
    assert_eq!(copies.len(), 1);
    let h: HashMap<_, _> = copies[0].1.iter().cloned().collect();
    assert_eq!(h["retries-due-ms"], u64::MAX.to_string());
}

/// A shutdown mid-batch of a non-idempotent handler, whose effect is done
/// at once and whose call then takes 2 s: the drain (100 ms) cuts the
/// records in flight after their effect. The next consumer of the group
/// runs every record, and no effect happens twice: with `reconcile` the cut
/// records come back marked and are found done; without it they are
/// dead-lettered `unknown_outcome`, never run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn a_shutdown_mid_batch_repeats_no_effect_of_a_non_idempotent_handler() {
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    for reconciled in [true, false] {
        let name = if reconciled { "payouts" } else { "payouts-nr" };
        let topics = Topics::new(name, &[Duration::from_millis(100)]);
        broker.create_topics(&topics.all(), 4).await.unwrap();
        let payloads: Vec<String> = (0..20).map(|i| i.to_string()).collect();
        produce(&broker, topics.main(), &payloads).await;
        // Effects by record, and whether the handler is slow (the first
        // consumer's is).
        let effects = Arc::new(Mutex::new(HashMap::<IdempotencyKey, u32>::new()));
        let slow = Arc::new(AtomicBool::new(true));
        let (e, sl) = (Arc::clone(&effects), Arc::clone(&slow));
        let handler = async move |r: &Record, _: &Attempt| -> Result<(), HandlerError> {
            *e.lock().unwrap().entry(r.idempotency_key()).or_default() += 1;
            if sl.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Ok(())
        };
        let e2 = Arc::clone(&effects);
        let reconcile = async move |r: &Record| -> Result<bool, HandlerError> {
            Ok(e2.lock().unwrap().contains_key(&r.idempotency_key()))
        };
        let policy = retries::Policy::new(Duration::from_secs(10)).with_max_attempts(2);
        let runner = || {
            RetryTopics::new(&broker.address(), &format!("{name}-app"), topics.clone())
                .policy(policy)
                .not_idempotent()
                .drain(Duration::from_millis(100))
        };
        // The first consumer: shut down once 4 records are in their call.
        let e3 = Arc::clone(&effects);
        let started = async move {
            wait_for(Duration::from_secs(20), || e3.lock().unwrap().len() >= 4).await;
        };
        let first = if reconciled {
            runner().run_reconciled(&handler, &reconcile, started).await
        } else {
            runner().run(&handler, started).await
        }
        .unwrap();
        assert!(first.cut >= 1, "records cut mid-call: {first:?}");
        // The next consumer of the group, fast.
        slow.store(false, Ordering::SeqCst);
        let e4 = Arc::clone(&effects);
        let all = async move {
            wait_for(Duration::from_secs(30), || e4.lock().unwrap().len() == 20).await;
            // Nothing more comes.
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let second = if reconciled {
            runner().run_reconciled(&handler, &reconcile, all).await
        } else {
            runner().run(&handler, all).await
        }
        .unwrap();
        let effects = effects.lock().unwrap().clone();
        assert_eq!(effects.len(), 20, "every record's effect: {effects:?}");
        assert!(
            effects.values().all(|&n| n == 1),
            "no effect twice ({name}): {effects:?}"
        );
        if reconciled {
            assert_eq!(first.dead_lettered + second.dead_lettered, 0);
        } else {
            assert_eq!(first.dead_lettered, first.cut, "dead-lettered as unknown");
        }
    }
}

/// The runner's `rate_limit`: every handler attempt, of every partition,
/// draws its start from it. Six records over three partitions at 5 starts
/// a second, no burst: the starts are 200 ms apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn the_rate_limit_spaces_every_handler_attempt() {
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let topics = Topics::new("paced", &[Duration::from_millis(100)]);
    broker.create_topics(&topics.all(), 3).await.unwrap();
    let payloads: Vec<String> = (0..6).map(|i| i.to_string()).collect();
    produce(&broker, topics.main(), &payloads).await;
    let starts = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&starts);
    let handler = async move |_: &Record, _: &Attempt| -> Result<(), HandlerError> {
        s.lock().unwrap().push(std::time::Instant::now());
        Ok(())
    };
    let s2 = Arc::clone(&starts);
    let limit = retries::limit::RateLimit::new(5, Duration::from_secs(1), 1);
    RetryTopics::new(&broker.address(), "paced-app", topics.clone())
        .concurrency(6)
        .rate_limit(limit)
        .run(handler, async move {
            wait_for(Duration::from_secs(30), || s2.lock().unwrap().len() >= 6).await;
        })
        .await
        .unwrap();
    let starts = starts.lock().unwrap().clone();
    assert_eq!(starts.len(), 6);
    // Each start at least 200 ms after the one before it was due (a start
    // may come late, never early; 20 ms allowed for the first's lateness).
    for (k, at) in starts.iter().enumerate() {
        let since = at.duration_since(starts[0]);
        let due = Duration::from_millis(200) * u32::try_from(k).unwrap();
        assert!(
            since + Duration::from_millis(20) >= due,
            "start {k} at {since:?}, due {due:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn redriven_dead_letters_keep_their_key_and_ask_reconcile_first() {
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let topics = Topics::new("payouts", &[Duration::from_millis(100)]);
    broker.create_topics(&topics.all(), 1).await.unwrap();
    produce(&broker, topics.main(), &["0".to_owned(), "1".to_owned()]).await;
    // A broken deploy: every record refused as invalid, dead-lettered. Its
    // keys are kept.
    let keys = Arc::new(Mutex::new(Vec::new()));
    let k = Arc::clone(&keys);
    let broken = async move |r: &Record, _: &Attempt| -> Result<(), HandlerError> {
        k.lock()
            .unwrap()
            .push((r.payload().unwrap().to_vec(), r.idempotency_key()));
        Err(HandlerError::Invalid)
    };
    let runner = || {
        RetryTopics::new(&broker.address(), "payouts-app", topics.clone())
            .policy(in_process())
            .not_idempotent()
    };
    let first = runner();
    let stats = first.stats();
    let st = Arc::clone(&stats);
    first
        .run(broken, async move {
            wait_for(Duration::from_secs(20), || {
                st.lock().unwrap().dead_lettered == 2
            })
            .await;
        })
        .await
        .unwrap();
    // The operator sends them again, at 20 a second; a second redrive
    // finds nothing left.
    let t = std::time::Instant::now();
    assert_eq!(
        runner().redrive(20, Duration::from_secs(3)).await.unwrap(),
        2
    );
    assert!(
        t.elapsed() >= Duration::from_millis(50),
        "paced: {:?}",
        t.elapsed()
    );
    assert_eq!(
        runner().redrive(20, Duration::from_secs(2)).await.unwrap(),
        0
    );
    // The fixed deploy: the payout of record 0 had in fact been made (the
    // ledger has its key), record 1's had not. `reconcile` is asked for
    // both before anything runs; only record 1 runs, under its old key.
    let ledger: HashMap<Vec<u8>, IdempotencyKey> = keys.lock().unwrap().iter().cloned().collect();
    let paid = ledger[&b"0".to_vec()];
    let events = Arc::new(Mutex::new(Vec::new()));
    let (e1, e2) = (Arc::clone(&events), Arc::clone(&events));
    let fixed = async move |r: &Record, _: &Attempt| -> Result<(), HandlerError> {
        e1.lock().unwrap().push(("run", r.idempotency_key()));
        Ok(())
    };
    let reconcile = async move |r: &Record| -> Result<bool, HandlerError> {
        e2.lock().unwrap().push(("asked", r.idempotency_key()));
        Ok(r.idempotency_key() == paid)
    };
    let second = runner();
    let stats = second.stats();
    let st = Arc::clone(&stats);
    let s = second
        .run_reconciled(fixed, reconcile, async move {
            wait_for(Duration::from_secs(20), || {
                st.lock().unwrap().done.iter().sum::<u64>() == 2
            })
            .await;
        })
        .await
        .unwrap();
    assert_eq!(s.dead_lettered, 0);
    let events = events.lock().unwrap().clone();
    let unpaid = ledger[&b"1".to_vec()];
    let mut asked: Vec<_> = events
        .iter()
        .filter(|e| e.0 == "asked")
        .map(|e| e.1)
        .collect();
    asked.sort();
    let mut both = vec![paid, unpaid];
    both.sort();
    assert_eq!(asked, both, "{events:?}");
    assert_eq!(
        events
            .iter()
            .filter(|e| e.0 == "run")
            .map(|e| e.1)
            .collect::<Vec<_>>(),
        [unpaid],
        "{events:?}"
    );
}
