//! A 409 that fits the caller's deadline (issue 59, row 2): handlers slower
//! than the client's attempt (2 s against 1 s), the layer's default 30 s
//! lease, a 5 s deadline, the client's `RetryLayer` in keyed mode with its
//! defaults otherwise. The key's next try finds the first run in progress
//! and is answered 409 with the time until the holder's next renewal (not
//! the lease's 30 s); the client waits within its deadline (a conflict's
//! pause is shortened to half the time left) and gets the first run's
//! answer. Every call succeeds, each charged once.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use retries::Policy;
use retries_postgres_tests::{Cluster, DoorCharge};
use retries_tower::ReplayBody;
use retries_tower::RetryLayer;
use retries_tower::dedup::IdempotencyLayer;
use sqlx::postgres::PgPoolOptions;
use tower::ServiceExt;

const DOOR: Policy = Policy::new(Duration::from_secs(10)).validated();
const WORK: Duration = Duration::from_secs(2);
const CALLS: usize = 20;
/// [`CALLS`], as the database counts.
const CALLS_I64: i64 = 20;

#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_slower_than_the_attempt_is_waited_out_within_the_deadline() {
    let cluster = Cluster::start(&[]);
    let pool = PgPoolOptions::new()
        .max_connections(24)
        .connect(&cluster.url())
        .await
        .expect("a pool");
    let keys = DoorCharge::migrate(&pool).await;
    let door = DoorCharge {
        before: WORK,
        ..DoorCharge::new(pool.clone(), keys.clone(), DOOR)
    };
    let runs = Arc::clone(&door.runs);
    // The layer's defaults: a 30 s lease.
    let port = door.serve(IdempotencyLayer::new(keys)).await;

    let client: Client<HttpConnector, ReplayBody<Full<Bytes>>> =
        Client::builder(TokioExecutor::new()).build_http();
    let policy = Policy::new(Duration::from_secs(5)).with_attempt_timeout(Duration::from_secs(1));
    let svc = RetryLayer::new(policy)
        .idempotent_by_key(http::HeaderName::from_static("idempotency-key"))
        .layer(client);
    // The route proves it deduplicates by any answer of the layer: here its
    // 400 to an empty key, which runs nothing (`retries_http::proof`).
    // Without a proof, the first attempts cut by their timeout would end
    // the calls unknown instead of waiting the 409s out.
    let probe = http::Request::post(format!("http://127.0.0.1:{port}/charges"))
        .header("idempotency-key", "\"\"")
        .body(Full::new(Bytes::from_static(b"0")))
        .unwrap();
    let answer = svc.clone().oneshot(probe).await.unwrap();
    assert_eq!(answer.status(), http::StatusCode::BAD_REQUEST);
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 0);
    let started = Instant::now();
    let answers = futures_util::future::join_all((0..CALLS).map(|n| {
        let svc = svc.clone();
        async move {
            let request = http::Request::post(format!("http://127.0.0.1:{port}/charges"))
                .body(Full::new(Bytes::from(format!("{}", 100 + n))))
                .unwrap();
            match svc.oneshot(request).await {
                Ok(response) => {
                    let status = response.status();
                    let body = response
                        .into_body()
                        .collect()
                        .await
                        .map(http_body_util::Collected::to_bytes);
                    (
                        status.as_u16(),
                        body.map(|b| String::from_utf8_lossy(&b).into_owned())
                            .unwrap_or_default(),
                    )
                }
                Err(e) => (0, e.to_string()),
            }
        }
    }))
    .await;
    let took = started.elapsed();
    let failed: Vec<_> = answers.iter().filter(|(s, _)| *s != 201).collect();
    assert!(
        failed.is_empty(),
        "{} of {CALLS} failed: {failed:?}",
        failed.len()
    );
    assert!(took < Duration::from_secs(6), "{took:?}");
    let (charges, keys_charged): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT key) FROM charges")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        (charges, keys_charged),
        (CALLS_I64, CALLS_I64),
        "each call charged once"
    );
    assert_eq!(runs.load(Ordering::Relaxed), CALLS, "each key run once");
}
