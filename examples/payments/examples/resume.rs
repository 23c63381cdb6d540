//! A numbered event stream over gRPC from a flaky server, read to its end
//! with `Retry::resume`: the server drops the stream at random points,
//! refuses some reopens, goes silent now and then, and resumes a little
//! early; the consumer still gets every event once, in order. Then
//! backpressure: 1,000 callers through a client-side limit of 16 slots.
//!
//! `cargo run -p retries-payments --example resume`

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use retries::limit::Concurrency;
use retries::{Attempt, Backoff, NoBudget, Policy, Reason, RetryEvent};
use retries_payments::events::pb::events_client::EventsClient;
use retries_payments::events::pb::{Event, WorkRequest};
use retries_payments::events::{Log, serve, subscribe};
use tonic::Status;
use tonic::transport::Channel;

const EVENTS: u64 = 1000;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let log = Log::random(EVENTS, 7);
    let addr = serve(Arc::clone(&log), None).await;
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let client = EventsClient::new(channel);
    read_the_stream(&client).await?;
    backpressure(&client, &log).await
}

/// The stream: every event once, in order, across the server's faults.
async fn read_the_stream(client: &EventsClient<Channel>) -> Result<(), Box<dyn std::error::Error>> {
    // The stream: reopened from the last delivered event after each drop.
    let policy = Policy::new(Duration::from_secs(2))
        .with_max_attempts(4)
        .with_backoff(Backoff::constant(Duration::from_millis(2)));
    let shown = Mutex::new(0);
    let events = retries::call(&policy)
        .idempotent()
        .budget(NoBudget)
        .on_retry(|e: &RetryEvent<'_, Status>| {
            let mut shown = shown.lock().unwrap();
            if *shown < 5 {
                *shown += 1;
                let why = e.error().map_or_else(
                    || "silent: cut off".to_owned(),
                    |s| format!("{:?}", s.code()),
                );
                println!(
                    "  reopen after {why} ({}), in {:?}",
                    e.verdict().kind().as_str(),
                    e.delay()
                );
            }
        })
        .resume(
            |after: Option<u64>| subscribe(client, after),
            |e: &Event| e.seq,
        )
        .idle(Duration::from_millis(50));
    let mut events = std::pin::pin!(events);
    let (mut delivered, mut duplicates, mut gaps, mut expected) = (0u64, 0u64, 0u64, 0u64);
    println!("reading {EVENTS} events from a flaky server:");
    while let Some(event) = events.next().await {
        let seq = event?.seq;
        delivered += 1;
        if seq < expected {
            duplicates += 1;
        } else {
            gaps += seq - expected;
            expected = seq + 1;
        }
    }
    let counts = events.counts();
    println!("  ...");
    println!(
        "delivered {delivered} of {EVENTS}, duplicates {duplicates}, gaps {gaps}, reopens {} (repeats skipped {})",
        counts.reopens, counts.skipped
    );
    Ok(())
}

/// Backpressure through a client-side limit.
async fn backpressure(
    client: &EventsClient<Channel>,
    log: &Log,
) -> Result<(), Box<dyn std::error::Error>> {
    // Backpressure: 1,000 callers, 20 ms of server work each, 16 slots, a
    // caller waits at most 200 ms for one.
    let limit = Arc::new(Concurrency::new(16, Duration::from_millis(200)));
    let policy = Policy::new(Duration::from_secs(2));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..1000 {
        let (client, limit) = (client.clone(), Arc::clone(&limit));
        tasks.spawn(async move {
            let t0 = Instant::now();
            let waited = Arc::new(Mutex::new(None));
            let w = Arc::clone(&waited);
            let r = retries::call(&policy)
                .idempotent()
                .concurrency(&limit)
                .outcome_fn(move |_: &Attempt| {
                    w.lock().unwrap().get_or_insert(t0.elapsed());
                    let mut c = client.clone();
                    async move { c.work(WorkRequest { millis: 20 }).await }
                })
                .await;
            let waited = *waited.lock().unwrap();
            (
                r.map(|_| ()).map_err(|f| f.reason()),
                waited.unwrap_or(t0.elapsed()),
            )
        });
    }
    let (mut served, mut rejected, mut waits) = (0, 0, Vec::new());
    while let Some(r) = tasks.join_next().await {
        let (r, waited) = r?;
        match r {
            Ok(()) => served += 1,
            Err(Reason::Saturated) => rejected += 1,
            Err(other) => println!("  a call stopped: {other}"),
        }
        waits.push(waited);
    }
    waits.sort();
    let p99 = waits[waits.len() * 99 / 100];
    println!(
        "in flight max {}, rejected {rejected}, waited p99 {:.1} ms (1000 callers, 16 slots, 200 ms wait; served {served}, each rejected one sent nothing: the server saw {} calls)",
        log.max_in_work(),
        p99.as_secs_f64() * 1000.0,
        log.works()
    );
    Ok(())
}
