//! Resumed gRPC streams and backpressure against a real tonic server on
//! loopback (`retries_payments::events`): 200 random fault scripts (drops
//! mid-stream, refusals, repeats after a resume, silences) each deliver
//! exactly `0..N`; the stream stops with the right reason when attempts, the
//! budget or its deadline run out; a server behind `ShedLayer` answers
//! `RESOURCE_EXHAUSTED` with pushback, and a retried call waits exactly the
//! pushback; a client-side limit of 16 keeps the server at 16 requests at once.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use retries::limit::Concurrency;
use retries::stream::Error;
use retries::{Attempt, Backoff, NoBudget, Policy, Reason, RetryEvent, TokenBucket};
use retries_payments::events::pb::events_client::EventsClient;
use retries_payments::events::pb::{Event, WorkRequest};
use retries_payments::events::{Connection, Log, serve, subscribe};
use tonic::transport::Channel;
use tonic::{Code, Status};

async fn client(log: &std::sync::Arc<Log>, shed: Option<u32>) -> EventsClient<Channel> {
    let addr = serve(std::sync::Arc::clone(log), shed).await;
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    EventsClient::new(channel)
}

/// Read the resumed stream to its end: the sequence numbers, the error it
/// ended with, and its counts.
async fn read(
    client: EventsClient<Channel>,
    policy: Policy,
    budget: Option<&TokenBucket>,
    whole: Option<Duration>,
) -> (
    Vec<u64>,
    Option<Error<Status, u64>>,
    retries::stream::Counts,
) {
    let spec = retries::call(&policy).idempotent();
    let mut got = Vec::new();
    macro_rules! drain {
        ($s:expr) => {{
            let mut s = $s.idle(Duration::from_millis(30));
            if let Some(w) = whole {
                s = s.deadline(w);
            }
            let mut s = std::pin::pin!(s);
            let mut err = None;
            while let Some(r) = s.next().await {
                match r {
                    Ok(e) => got.push(e.seq),
                    Err(e) => {
                        err = Some(e);
                        break;
                    }
                }
            }
            (got, err, s.counts())
        }};
    }
    if let Some(b) = budget {
        drain!(
            spec.budget(b)
                .resume(|after| subscribe(&client, after), |e: &Event| e.seq)
        )
    } else {
        drain!(
            spec.budget(NoBudget)
                .resume(|after| subscribe(&client, after), |e: &Event| e.seq)
        )
    }
}

fn policy() -> Policy {
    Policy::new(Duration::from_secs(5))
        .with_max_attempts(4)
        .with_backoff(Backoff::constant(Duration::from_millis(1)))
}

/// Scripts `seeds`, ten at a time, each on its own server: every item
/// once, in order; the skipped repeats and reopens, summed.
async fn exactly_once_over(seeds: std::ops::Range<u64>) -> (u64, u64) {
    let mut tasks = tokio::task::JoinSet::new();
    let mut skipped = 0;
    let mut reopens = 0;
    for seed in seeds {
        let len = 20 + seed % 80;
        tasks.spawn(async move {
            let log = Log::random(len, seed);
            let client = client(&log, None).await;
            let (got, err, counts) = read(client, policy(), None, None).await;
            assert!(err.is_none(), "seed {seed}: {err:?}");
            assert_eq!(
                got,
                (0..len).collect::<Vec<_>>(),
                "seed {seed}: duplicates or gaps"
            );
            let opens = log.opens();
            assert_eq!(counts.reopens as usize, opens.len() - 1, "seed {seed}");
            assert_eq!(opens[0], None);
            // Every reopen from a cursor already delivered, never going back.
            for w in opens.windows(2) {
                assert!(w[0] <= w[1], "seed {seed}: {opens:?}");
            }
            assert!(opens.iter().flatten().all(|c| *c < len));
            counts
        });
        // Ten scripts at a time, each on its own server.
        if tasks.len() == 10 {
            while let Some(c) = tasks.join_next().await {
                let c = c.unwrap();
                skipped += c.skipped;
                reopens += c.reopens;
            }
        }
    }
    while let Some(c) = tasks.join_next().await {
        let c = c.unwrap();
        skipped += c.skipped;
        reopens += c.reopens;
    }
    (skipped, reopens)
}

// 200 random fault scripts, in four tests of 50 (side by side).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_over_random_fault_scripts_0_to_49() {
    let (skipped, reopens) = exactly_once_over(0..50).await;
    eprintln!("0..50: skipped {skipped}, reopens {reopens}");
    // The scripts did exercise repeats and reopens.
    assert!(skipped > 100 && reopens > 400, "{skipped} {reopens}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_over_random_fault_scripts_50_to_99() {
    let (skipped, reopens) = exactly_once_over(50..100).await;
    eprintln!("50..100: skipped {skipped}, reopens {reopens}");
    assert!(skipped > 100 && reopens > 400, "{skipped} {reopens}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_over_random_fault_scripts_100_to_149() {
    let (skipped, reopens) = exactly_once_over(100..150).await;
    eprintln!("100..150: skipped {skipped}, reopens {reopens}");
    assert!(skipped > 100 && reopens > 400, "{skipped} {reopens}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_over_random_fault_scripts_150_to_199() {
    let (skipped, reopens) = exactly_once_over(150..200).await;
    eprintln!("150..200: skipped {skipped}, reopens {reopens}");
    assert!(skipped > 100 && reopens > 400, "{skipped} {reopens}");
}

#[tokio::test]
async fn stops_when_reopens_without_progress_run_out() {
    // Five events, then every reopen refused: the broken connection and
    // three refused reopens, then `Exhausted` with the last status.
    let mut script = vec![Connection::new(5)];
    script.extend(std::iter::repeat_n(
        Connection {
            refuse: true,
            ..Connection::new(0)
        },
        10,
    ));
    let log = Log::new(100, Duration::ZERO, script);
    let client = client(&log, None).await;
    let (got, err, _) = read(client, policy(), None, None).await;
    assert_eq!(got, (0..5).collect::<Vec<_>>());
    let f = err.as_ref().and_then(Error::failure).unwrap();
    assert_eq!(f.reason(), Reason::Exhausted);
    assert_eq!(f.attempts(), 4);
    assert_eq!(f.last_error().unwrap().code(), Code::Unavailable);
    assert_eq!(log.opens(), vec![None, Some(4), Some(4), Some(4)]);
}

#[tokio::test]
async fn stops_when_the_budget_runs_out() {
    // 3 tokens, retries allowed above half: the connection that broke and a
    // refused reopen spend two, and the next reopen is refused.
    let budget = TokenBucket::new(3, 0.1);
    let script = [
        Connection::new(5),
        Connection {
            refuse: true,
            ..Connection::new(0)
        },
    ];
    let log = Log::new(100, Duration::ZERO, script);
    let client = client(&log, None).await;
    let (got, err, _) = read(client, policy().with_max_attempts(10), Some(&budget), None).await;
    assert_eq!(got, (0..5).collect::<Vec<_>>());
    assert_eq!(
        err.as_ref().and_then(Error::failure).unwrap().reason(),
        Reason::BudgetExhausted
    );
    assert_eq!(log.opens().len(), 2);
}

#[tokio::test]
async fn stops_at_the_whole_stream_deadline() {
    // One event every 50 ms, a 400 ms deadline: a prefix, then
    // `DeadlineExceeded` at 400 ms (real time, bounded).
    let log = Log::new(1000, Duration::from_millis(50), [Connection::new(1000)]);
    let client = client(&log, None).await;
    let t0 = Instant::now();
    let (got, err, _) = read(client, policy(), None, Some(Duration::from_millis(400))).await;
    let elapsed = t0.elapsed();
    assert_eq!(got, (0..got.len() as u64).collect::<Vec<_>>());
    // About 8 events in 400 ms; fewer on a loaded machine, never all.
    assert!((1..=8).contains(&got.len()), "{got:?}");
    assert_eq!(
        err.as_ref().and_then(Error::failure).unwrap().reason(),
        Reason::DeadlineExceeded
    );
    assert!(
        elapsed >= Duration::from_millis(400) && elapsed < Duration::from_secs(2),
        "{elapsed:?}"
    );
}

#[tokio::test]
async fn an_overloaded_server_pushes_back_and_the_client_waits_exactly_that() {
    // One slot on the server; a 400 ms call holds it.
    let log = Log::new(0, Duration::ZERO, []);
    let client = client(&log, Some(1)).await;
    let mut holder = client.clone();
    let held = tokio::spawn(async move { holder.work(WorkRequest { millis: 400 }).await });
    tokio::time::sleep(Duration::from_millis(50)).await;

    // A plain call is refused at once, with the server's pushback.
    let refused = client
        .clone()
        .work(WorkRequest { millis: 0 })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(
        refused.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "100"
    );

    // A retried call pauses exactly the pushback each time, until the slot frees.
    let policy = Policy::new(Duration::from_secs(3)).with_max_attempts(10);
    let pauses = std::sync::Mutex::new(Vec::new());
    let t0 = Instant::now();
    let reply = retries::call(&policy)
        .idempotent()
        .budget(NoBudget)
        .on_retry(|e: &RetryEvent<'_, Status>| pauses.lock().unwrap().push(e.delay()))
        .run_fn(|_: &Attempt| {
            let mut c = client.clone();
            async move { c.work(WorkRequest { millis: 0 }).await }
        })
        .await
        .unwrap();
    let elapsed = t0.elapsed();
    held.await.unwrap().unwrap();
    let pauses = pauses.into_inner().unwrap();
    // The slot frees at ~400 ms: 3 or 4 refusals, a few more on a loaded machine.
    assert!((2..=10).contains(&pauses.len()), "{pauses:?}");
    assert!(
        pauses.iter().all(|p| *p == Duration::from_millis(100)),
        "{pauses:?}"
    );
    assert_eq!(reply.into_inner().in_flight, 1);
    assert!(
        elapsed >= Duration::from_millis(300) && elapsed < Duration::from_secs(2),
        "{elapsed:?}"
    );
    assert_eq!(
        log.works(),
        2,
        "the refused attempts never reached the handler"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_limit_of_16_keeps_the_server_at_16() {
    // 200 callers, 20 ms of work each, 16 slots and a 1 s wait: all served,
    // never more than 16 in the handler. Then with a 25 ms wait: some are
    // refused, and none of those reached the server.
    let log = Log::new(0, Duration::ZERO, []);
    let client = client(&log, None).await;
    let policy = Policy::new(Duration::from_secs(5));
    for (wait, all_served) in [
        (Duration::from_secs(1), true),
        (Duration::from_millis(25), false),
    ] {
        let limit = std::sync::Arc::new(Concurrency::new(16, wait));
        let before = log.works();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..200 {
            let (client, limit) = (client.clone(), std::sync::Arc::clone(&limit));
            tasks.spawn(async move {
                retries::call(&policy)
                    .idempotent()
                    .concurrency(&limit)
                    .outcome_fn(|_: &Attempt| {
                        let mut c = client.clone();
                        async move { c.work(WorkRequest { millis: 20 }).await }
                    })
                    .await
            });
        }
        let (mut ok, mut refused) = (0, 0);
        while let Some(r) = tasks.join_next().await {
            match r.unwrap() {
                Ok(_) => ok += 1,
                Err(f) => {
                    assert_eq!(f.reason(), Reason::Saturated);
                    refused += 1;
                }
            }
        }
        assert_eq!(log.max_in_work(), 16);
        assert_eq!(log.works() - before, ok, "a refused call sends nothing");
        if all_served {
            assert_eq!((ok, refused), (200, 0));
        } else {
            assert!(refused > 0 && ok >= 16, "ok {ok}, refused {refused}");
        }
    }
}
