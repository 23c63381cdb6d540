//! Durable retries on Kafka against a real broker started here (tansu, in
//! memory, on loopback): 1,000 order records, some of which fail for a
//! while, some for good, with a one-second outage of the downstream in the
//! middle, behind a breaker. Prints where every record ended.
//!
//! `cargo run -p retries-kafka --example retry_topics`

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::producer::FutureRecord;
use retries::{Attempt, Backoff, CircuitBreaker, Classify, Policy, TokenBucket, Verdict};
use retries_kafka::broker::{self, Broker};
use retries_kafka::{Record, RetryTopics, Topics};

#[derive(Debug, thiserror::Error)]
enum ShipError {
    #[error("warehouse unavailable")]
    Unavailable,
    #[error("unknown product")]
    UnknownProduct,
}

impl Classify for ShipError {
    fn classify(&self) -> Verdict {
        match self {
            Self::Unavailable => Verdict::not_executed(),
            Self::UnknownProduct => Verdict::permanent(),
        }
    }
}

const RECORDS: usize = 1000;

/// Record `i` fails this many calls before it succeeds (`None`: never, it is invalid).
fn failures(i: usize) -> Option<u32> {
    match i % 25 {
        0..=17 => Some(0),
        18..=20 => Some(1),
        21 | 22 => Some(3),
        23 => Some(5),
        _ => None,
    }
}

#[tokio::main]
#[allow(clippy::too_many_lines)] // a demo, read top to bottom
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let broker = match Broker::start() {
        Ok(b) => b,
        Err(e) => {
            println!(
                "no broker: {e}\ninstall it once with:\n  {}",
                broker::INSTALL
            );
            return Ok(());
        }
    };
    let topics = Topics::new(
        "orders",
        &[Duration::from_millis(200), Duration::from_millis(500)],
    );
    broker.create_topics(&topics.all(), 1).await?;
    let producer = broker.producer()?;
    for i in 0..RECORDS {
        let payload = i.to_string();
        producer
            .send(
                FutureRecord::<str, str>::to(topics.main()).payload(&payload),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)?;
    }
    println!(
        "{RECORDS} records in `orders`; retry topics {} (200 ms) and {} (500 ms); dead letters in {}",
        topics.level(0).unwrap_or_default(),
        topics.level(1).unwrap_or_default(),
        topics.dlt()
    );

    // The downstream: per-record failures, an outage of 1 s once 300
    // records are through, and effects applied once per idempotency key.
    let calls: Arc<Mutex<HashMap<retries::IdempotencyKey, u32>>> = Arc::default();
    let effects: Arc<Mutex<HashSet<retries::IdempotencyKey>>> = Arc::default();
    let done_at: Arc<Mutex<Vec<u32>>> = Arc::default();
    let duplicates = Arc::new(Mutex::new(0u64));
    let down = Arc::new(AtomicBool::new(false));
    let handler = {
        let (calls, effects, done_at, duplicates, down) = (
            calls.clone(),
            effects.clone(),
            done_at.clone(),
            duplicates.clone(),
            down.clone(),
        );
        async move |r: &Record, _: &Attempt| -> Result<(), ShipError> {
            if down.load(Ordering::SeqCst) {
                return Err(ShipError::Unavailable);
            }
            let i: usize = String::from_utf8_lossy(r.payload().unwrap_or_default())
                .parse()
                .unwrap_or(0);
            let n = {
                let mut calls = calls.lock().unwrap();
                let n = calls.entry(r.idempotency_key()).or_default();
                *n += 1;
                *n
            };
            match failures(i) {
                None => Err(ShipError::UnknownProduct),
                Some(f) if n <= f => Err(ShipError::Unavailable),
                Some(_) => {
                    if !effects.lock().unwrap().insert(r.idempotency_key()) {
                        *duplicates.lock().unwrap() += 1;
                    }
                    done_at.lock().unwrap().push(r.level());
                    Ok(())
                }
            }
        }
    };
    // Opens after 20 transient failures in a row: the flaky records alone do
    // not open it, the outage does.
    let breaker = Arc::new(CircuitBreaker::new(20, Duration::from_millis(300)));
    let reasons: Arc<Mutex<HashMap<&'static str, u64>>> = Arc::default();
    let r2 = reasons.clone();
    let runner = RetryTopics::new(&broker.address(), "shipping", topics.clone())
        .on_dead_letter(move |_, d| *r2.lock().unwrap().entry(d.reason.as_str()).or_default() += 1)
        .policy(
            Policy::new(Duration::from_millis(500))
                .with_max_attempts(2)
                .with_backoff(Backoff::constant(Duration::from_millis(5))),
        )
        .budget(Arc::new(TokenBucket::new(1000, 1.0)))
        .breaker(breaker)
        .probe_every(Duration::from_millis(200));
    let stats = runner.stats();
    let t0 = Instant::now();
    let watch = {
        let (stats, down, done_at) = (stats.clone(), down.clone(), done_at.clone());
        async move {
            let accounted =
                || done_at.lock().unwrap().len() as u64 + stats.lock().unwrap().dead_lettered;
            while accounted() < 300 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            down.store(true, Ordering::SeqCst);
            println!(
                "outage: the warehouse is down for 1 s ({} records accounted)",
                accounted()
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
            down.store(false, Ordering::SeqCst);
            println!("outage over");
            while accounted() < RECORDS as u64 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let s = runner.run(handler, watch).await?;
    let elapsed = t0.elapsed();

    let levels = done_at.lock().unwrap().clone();
    let at = |l: u32| levels.iter().filter(|x| **x == l).count();
    let lost = RECORDS - levels.len() - s.dead_lettered as usize;
    println!();
    println!(
        "| records in | done first time | after retry-0 | after retry-1 | dead-lettered | lost | duplicate effects | main topic paused |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    println!(
        "| {RECORDS} | {} | {} | {} | {} | {lost} | {} | {} time(s), {} ms |",
        at(0),
        at(1),
        at(2),
        s.dead_lettered,
        duplicates.lock().unwrap(),
        s.main_pauses,
        s.main_paused.as_millis()
    );
    println!();
    println!(
        "republished: {:?} (to retry-0, retry-1); {:.1} s in all",
        s.retried,
        elapsed.as_secs_f64()
    );
    let mut reasons: Vec<_> = reasons
        .lock()
        .unwrap()
        .iter()
        .map(|(r, n)| format!("{r} {n}"))
        .collect();
    reasons.sort();
    println!("dead letters by reason: {}", reasons.join(", "));
    println!("lost {lost}");
    Ok(())
}
