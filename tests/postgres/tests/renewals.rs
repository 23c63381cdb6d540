//! Renewals that hold on a busy machine: three replicas (three
//! `IdempotencyLayer`s over `PgKeyStore`, each with its own pool, one
//! database), a 1.5 s lease, handlers of 3 s in the docs' shape (the charge
//! and `complete_in` in one transaction through the transaction door, the
//! record written at the end, when a renewal comes due too), and clients
//! that give up on an attempt after 1 s and send the key again to the next
//! replica, beside a CPU hog of three spinning processes a core. Every key
//! is charged once, and no handler runs a second time beside the first (a
//! claim that lapsed would let the next try run it, to be fenced at its
//! `complete_in`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use retries::Policy;
use retries_postgres_tests::{Cluster, DoorCharge, Hog};
use retries_sqlx::PgKeyStore;
use retries_tower::dedup::IdempotencyLayer;
use sqlx::postgres::PgPoolOptions;

const DOOR: Policy = Policy::new(Duration::from_secs(10)).validated();
const LEASE: Duration = Duration::from_millis(1500);
/// The handler's work before its record.
const WORK: Duration = Duration::from_secs(3);
const KEYS: usize = 9;

async fn replica(url: &str, runs: &Arc<AtomicUsize>) -> u16 {
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(30))
        .connect(url)
        .await
        .expect("a pool");
    let keys = PgKeyStore::new(pool.clone());
    let door = DoorCharge {
        before: WORK,
        runs: Arc::clone(runs),
        ..DoorCharge::new(pool, keys.clone(), DOOR)
    };
    door.serve(IdempotencyLayer::new(keys).lease(LEASE)).await
}

/// One client's call: tries to the replicas in turn, each given up after
/// 1 s, a 409 waited out for its `Retry-After` (at most 1 s); the answer,
/// or the statuses seen by 30 s.
async fn call(
    client: &Client<HttpConnector, Full<Bytes>>,
    ports: &[u16],
    n: usize,
) -> Result<String, Vec<u16>> {
    let key = format!("key-{n}");
    let started = Instant::now();
    let mut seen = Vec::new();
    for attempt in 0.. {
        if started.elapsed() > Duration::from_secs(30) {
            return Err(seen);
        }
        let port = ports[(n + attempt) % ports.len()];
        let request = http::Request::post(format!("http://127.0.0.1:{port}/charges"))
            .header("idempotency-key", &key)
            .body(Full::new(Bytes::new()))
            .unwrap();
        match tokio::time::timeout(Duration::from_secs(1), client.request(request)).await {
            Ok(Ok(response)) if response.status() == StatusCode::CREATED => {
                use http_body_util::BodyExt;
                let body = response.into_body().collect().await.unwrap().to_bytes();
                return Ok(String::from_utf8_lossy(&body).into_owned());
            }
            Ok(Ok(response)) => {
                seen.push(response.status().as_u16());
                let pause = response
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                    .unwrap_or(0)
                    .min(1);
                tokio::time::sleep(Duration::from_secs(pause)).await;
            }
            Ok(Err(_)) => seen.push(0),
            // The attempt given up: the handler goes on on its replica.
            Err(_) => seen.push(1),
        }
    }
    unreachable!()
}

#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_hold_for_slow_handlers_on_three_replicas_beside_a_cpu_hog() {
    let cluster = Cluster::start(&[]);
    let url = cluster.url();
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&url)
        .await
        .expect("a pool");
    DoorCharge::migrate(&pool).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let mut ports = Vec::new();
    for _ in 0..3 {
        ports.push(replica(&url, &runs).await);
    }
    let client = Client::builder(TokioExecutor::new()).build_http();

    let hog = Hog::start();
    let answers = futures_util::future::join_all((0..KEYS).map(|n| {
        let (client, ports) = (client.clone(), ports.clone());
        async move { call(&client, &ports, n).await }
    }))
    .await;
    drop(hog);

    for (n, answer) in answers.iter().enumerate() {
        assert!(
            answer.as_ref().is_ok_and(|a| a.starts_with("charge ")),
            "key {n}: {answer:?}"
        );
    }
    let charged: Vec<(String, i64)> =
        sqlx::query_as("SELECT key, count(*) FROM charges GROUP BY key ORDER BY key")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(charged.len(), KEYS, "{charged:?}");
    assert!(charged.iter().all(|(_, n)| *n == 1), "{charged:?}");
    assert_eq!(
        runs.load(Ordering::Relaxed),
        KEYS,
        "a handler ran beside another of its key: a claim lapsed"
    );
}
