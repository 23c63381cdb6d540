//! A key whose row the handler's own transaction holds: `IdempotencyLayer`
//! over `PgKeyStore` with the handler shape the docs show (the charge and
//! `complete_in` in one transaction through the transaction door), a
//! handler that works on after `complete_in` for longer than a third of the
//! lease (so a renewal comes due while its transaction holds the key's
//! row). The answer comes within the call's deadline, a duplicate meanwhile
//! is answered 409 at once, the key is free afterwards and no session is
//! left waiting on a lock; every statement of the store waits on a held row
//! for a bounded time; and a transaction the door opened, left idle by a
//! client that stopped polling it, is ended by the server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use retries::{Attempt, Policy};
use retries_postgres_tests::{Cluster, DoorCharge};
use retries_sqlx::{PgKeyStore, Transaction, Transactions, Tx};
use retries_tower::dedup::IdempotencyLayer;
use retries_tower::dedup::{Claim, Fingerprint, Key, Store, Stored, Terms};
use sqlx::postgres::PgPoolOptions;
use tokio::sync::Notify;

/// The door's policy in the handler: an 8 s deadline, as in the report.
const DOOR: Policy = Policy::new(Duration::from_secs(8)).validated();
/// The layer's lease: a renewal every 667 ms.
const LEASE: Duration = Duration::from_secs(2);
/// The handler's work after `complete_in`, inside its transaction: longer
/// than a third of the lease.
const AFTER: Duration = Duration::from_millis(1200);
/// The policy of a call whose client stalls.
const SHORT: Policy = Policy::new(Duration::from_millis(800)).validated();

async fn setup() -> (Cluster, sqlx::PgPool, PgKeyStore) {
    let cluster = Cluster::start(&[]);
    let pool = PgPoolOptions::new()
        .max_connections(8)
        // Generous: the bound under test is the server's, not the pool's.
        .acquire_timeout(Duration::from_secs(20))
        .connect(&cluster.url())
        .await
        .expect("a pool");
    let keys = DoorCharge::migrate(&pool).await;
    (cluster, pool, keys)
}

type Http = Client<HttpConnector, Full<Bytes>>;

async fn post_key(client: &Http, port: u16, key: &str) -> (StatusCode, String, Option<String>) {
    let request = http::Request::post(format!("http://127.0.0.1:{port}/charges"))
        .header("idempotency-key", key)
        .body(Full::new(Bytes::new()))
        .expect("a request");
    let response = client.request(request).await.expect("an answer");
    let status = response.status();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap_or("").to_string());
    let body = response.into_body().collect().await.expect("a body");
    (
        status,
        String::from_utf8_lossy(&body.to_bytes()).into_owned(),
        retry_after,
    )
}

/// Sessions of the cluster waiting on a lock, and sessions idle in a
/// transaction.
async fn waiting(pool: &sqlx::PgPool) -> (i64, i64) {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'),
                count(*) FILTER (WHERE state LIKE 'idle in transaction%')
         FROM pg_stat_activity WHERE pid <> pg_backend_pid()",
    )
    .fetch_one(pool)
    .await
    .expect("pg_stat_activity")
}

#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_after_complete_in_past_a_renewal_is_answered_in_time_and_frees_its_key() {
    let (_cluster, pool, keys) = setup().await;
    let door = DoorCharge {
        after: AFTER,
        ..DoorCharge::new(pool.clone(), keys.clone(), DOOR)
    };
    let stored = Arc::clone(&door.stored);
    let port = door.serve(IdempotencyLayer::new(keys).lease(LEASE)).await;
    let client: Http = Client::builder(TokioExecutor::new()).build_http();

    let started = Instant::now();
    let first = tokio::spawn({
        let client = client.clone();
        async move { post_key(&client, port, "k-1").await }
    });
    tokio::time::timeout(Duration::from_secs(10), stored.notified())
        .await
        .expect("the handler stored its answer");

    // A duplicate while the handler's transaction holds the key's row: 409,
    // after at most the store's lock wait (1 s), never held up.
    let asked = Instant::now();
    let (status, _, retry_after) =
        tokio::time::timeout(Duration::from_secs(5), post_key(&client, port, "k-1"))
            .await
            .expect("the duplicate is answered, not held up");
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "{:?}",
        asked.elapsed()
    );

    // The first answer, within the door's deadline (8 s): the work after
    // the record is 1.2 s, and two renewals came due meanwhile.
    let (status, receipt, _) = tokio::time::timeout(Duration::from_secs(8), first)
        .await
        .expect("an answer within the call's deadline")
        .unwrap();
    assert_eq!(status, StatusCode::CREATED, "{receipt}");
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );

    // The key is free: its record replays at once, one charge was made,
    // and no session is left waiting on a lock or idle in a transaction.
    let asked = Instant::now();
    let (status, replayed, _) = post_key(&client, port, "k-1").await;
    assert_eq!(
        (status, replayed.as_str()),
        (StatusCode::CREATED, receipt.as_str())
    );
    assert!(
        asked.elapsed() < Duration::from_millis(900),
        "{:?}",
        asked.elapsed()
    );
    let charges: i64 = sqlx::query_scalar("SELECT count(*) FROM charges")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(charges, 1);
    let done: bool =
        sqlx::query_scalar("SELECT done FROM retries_idempotency_keys WHERE key = 'k-1'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(done);
    assert_eq!(waiting(&pool).await, (0, 0));
}

#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_statement_of_the_store_waits_on_a_held_row_without_limit() {
    let (_cluster, pool, keys) = setup().await;
    let terms = Terms {
        lease: Duration::from_millis(300),
        retention: Duration::from_mins(1),
    };
    let fp = Fingerprint::of("POST", "/charges", b"");
    let key = Key {
        principal: "",
        key: "held",
        fingerprint: &fp,
    };
    let Claim::Run(token) = keys.claim(key, terms).await.unwrap() else {
        panic!("a new key runs")
    };
    // A second key, kept no longer than its lease: expired when collected.
    let brief = Terms {
        lease: Duration::from_millis(300),
        retention: Duration::ZERO,
    };
    let gone = Key { key: "gone", ..key };
    assert!(matches!(
        keys.claim(gone, brief).await.unwrap(),
        Claim::Run(_)
    ));
    // Another transaction holds both rows (as a handler's does after
    // `complete_in`), and the leases run out meanwhile.
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM retries_idempotency_keys WHERE key IN ('held', 'gone') FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;

    let bounded = |what: &str, asked: Instant| {
        let took = asked.elapsed();
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(3),
            "{what} waited {took:?}"
        );
    };
    // A claim past the lease would take the key: it waits for the row, at
    // most the lock wait, and says "in progress".
    let asked = Instant::now();
    let claim = tokio::time::timeout(Duration::from_secs(5), keys.claim(key, terms))
        .await
        .expect("a bounded wait")
        .unwrap();
    bounded("a claim", asked);
    assert!(
        matches!(claim, Claim::InProgress { retry_after } if retry_after == Duration::from_secs(1)),
        "{claim:?}"
    );
    // A renewal counts as held: the lock keeps every other request out.
    let asked = Instant::now();
    let renewed = tokio::time::timeout(Duration::from_secs(5), keys.renew(key, token, terms))
        .await
        .expect("a bounded wait");
    assert!(renewed.unwrap());
    bounded("a renewal", asked);
    // Storing the answer and giving the key up fail after the wait.
    let asked = Instant::now();
    let answer = Stored {
        status: 201,
        headers: vec![],
        body: b"late".to_vec(),
        trailers: vec![],
        body_dropped: false,
    };
    assert!(keys.complete(key, token, &answer, terms).await.is_err());
    bounded("a completion", asked);
    let asked = Instant::now();
    assert!(keys.release(key, token).await.is_err());
    bounded("a release", asked);
    // The collection of expired rows skips a held one at once.
    let asked = Instant::now();
    assert_eq!(keys.collect().await.unwrap(), 0);
    assert!(
        asked.elapsed() < Duration::from_millis(900),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(waiting(&pool).await.0, 0, "no statement still waits");

    // Once the holder is gone, the key is the claim's again, and the
    // expired row is collected.
    holder.rollback().await.unwrap();
    assert!(keys.renew(key, token, terms).await.unwrap());
    assert_eq!(keys.collect().await.unwrap(), 1);
}

#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_door_transaction_left_idle_by_its_client_ends_on_the_server() {
    let (_cluster, pool, _keys) = setup().await;
    sqlx::query("INSERT INTO charges (id, key) VALUES (1, 'held')")
        .execute(&pool)
        .await
        .unwrap();
    let locked = Arc::new(Notify::new());
    let signal = Arc::clone(&locked);
    let call = retries::call(&SHORT).transaction_fn(
        Transaction::on(&pool),
        move |tx: &mut Tx, _: &Attempt| {
            let signal = Arc::clone(&signal);
            Box::pin(async move {
                sqlx::query("SELECT id FROM charges WHERE id = 1 FOR UPDATE")
                    .execute(&mut *tx)
                    .await?;
                signal.notify_one();
                tokio::time::sleep(Duration::from_mins(1)).await;
                Ok::<_, retries_sqlx::Error>(())
            })
        },
    );
    let mut call = std::pin::pin!(call);
    // Polled until the row is locked, then never again: a client that
    // stalled (a task not polled, a process frozen).
    tokio::select! {
        _ = call.as_mut() => panic!("the call ended while its row was held"),
        () = locked.notified() => {}
    }
    assert_eq!(waiting(&pool).await.1, 1, "the transaction sits idle");
    // Past the attempt's time the server ends the session: the row is free.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(waiting(&pool).await.1, 0, "no transaction left idle");
    let free: Option<i64> =
        sqlx::query_scalar("SELECT id FROM charges WHERE id = 1 FOR UPDATE NOWAIT")
            .fetch_optional(&pool)
            .await
            .expect("the row is free");
    assert_eq!(free, Some(1));
}
