//! The README's transaction snippet where services live: compiled, verbatim,
//! inside `tokio::spawn` (which needs a `Send` future, as an axum handler
//! does), and run against a real PostgreSQL cluster. The behaviour suite
//! (`tests/behaviour/tests/readme.rs`) fails when a README block is found in
//! neither file.

use std::time::Duration;

use retries::{Attempt, Policy};
use retries_postgres_tests::Cluster;
use retries_sqlx::{Transaction, Transactions, Tx};

const POLICY: Policy = Policy::new(Duration::from_secs(10)).validated();

async fn transfer(tx: &mut Tx) -> Result<(), retries_sqlx::Error> {
    sqlx::query("UPDATE accounts SET balance = balance - 5 WHERE id = 1")
        .execute(&mut *tx)
        .await?;
    sqlx::query("UPDATE accounts SET balance = balance + 5 WHERE id = 2")
        .execute(&mut *tx)
        .await?;
    Ok(())
}

#[rustfmt::skip]
async fn readme_transfer(pool: sqlx::PgPool) -> Result<(), retries_sqlx::Error> {
    retries::call(&POLICY)
        .transaction(Transaction::on(&pool).serializable(), async |tx: &mut Tx, _: &Attempt| transfer(tx).await)
        .await?;
    Ok(())
}

#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_transaction_runs_in_a_spawned_task() {
    let cluster = Cluster::start(&[]);
    let pool = sqlx::PgPool::connect(&cluster.url()).await.unwrap();
    sqlx::query("CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO accounts VALUES (1, 100), (2, 0)")
        .execute(&pool)
        .await
        .unwrap();
    let spawned = pool.clone();
    tokio::spawn(async move { readme_transfer(spawned).await })
        .await
        .unwrap()
        .unwrap();
    let balances: Vec<(i32, i64)> = sqlx::query_as("SELECT id, balance FROM accounts ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(balances, [(1, 95), (2, 5)]);
}

/// The README's server-half snippet, verbatim, in a spawned task: the
/// layer over `PgKeyStore` on an axum app, the client `idempotent_by_key`.
mod exactly_once {
    use std::sync::atomic::{AtomicU32, Ordering};

    use axum::Router;
    use axum::routing::post;
    use bytes::Bytes;
    use http::HeaderName;
    use http_body_util::Full;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use retries::Policy;
    use retries_postgres_tests::Cluster;
    use retries_sqlx::PgKeyStore;
    use retries_tower::RetryLayer;
    use retries_tower::dedup::IdempotencyLayer;
    use tower::ServiceExt;

    static CHARGES: AtomicU32 = AtomicU32::new(0);

    async fn charge() -> (http::StatusCode, &'static str) {
        CHARGES.fetch_add(1, Ordering::SeqCst);
        (http::StatusCode::CREATED, "receipt")
    }

    fn tenant_of(parts: &http::request::Parts) -> String {
        parts
            .headers
            .get("x-tenant")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    }

    type HyperClient = Client<
        hyper_util::client::legacy::connect::HttpConnector,
        retries_tower::ReplayBody<Full<Bytes>>,
    >;

    #[rustfmt::skip]
    fn readme_server_and_client(
        pool: sqlx::PgPool,
        policy: Policy,
        hyper_client: HyperClient,
    ) -> (Router, retries_tower::RetryService<HyperClient>) {
        let app = Router::new().route("/charges", post(charge))
            .layer(IdempotencyLayer::new(PgKeyStore::new(pool)).principal(tenant_of));
        let client = RetryLayer::new(policy)
            .idempotent_by_key(HeaderName::from_static("idempotency-key"))
            .layer(hyper_client);
        (app, client)
    }

    #[cfg_attr(
        no_postgres,
        ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
    )]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_readme_server_half_runs_in_a_spawned_task() {
        let cluster = Cluster::start(&[]);
        let pool = sqlx::PgPool::connect(&cluster.url()).await.unwrap();
        PgKeyStore::new(pool.clone()).migrate().await.unwrap();
        let hyper_client = Client::builder(TokioExecutor::new()).build_http();
        let policy = Policy::new(std::time::Duration::from_secs(5));
        let (app, client) = readme_server_and_client(pool.clone(), policy, hyper_client);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let response = tokio::spawn(async move {
            let request = http::Request::post(format!("http://{addr}/charges"))
                .body(Full::new(Bytes::from_static(b"100")))
                .unwrap();
            client.oneshot(request).await.unwrap()
        })
        .await
        .unwrap();
        assert_eq!(response.status(), http::StatusCode::CREATED);
        assert_eq!(CHARGES.load(Ordering::SeqCst), 1);
        let (records,): (i64,) =
            sqlx::query_as("SELECT count(*) FROM retries_idempotency_keys WHERE done")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(records, 1);
    }
}

/// The durable-calls pattern (`retries_sqlx::durable`'s docs; the README
/// links there): the order and its charge in one transaction, then a worker
/// until the charge is done.
mod durable_calls {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use retries::{Attempt, Policy};
    use retries_postgres_tests::Cluster;
    use retries_sqlx::durable::{self, Call, Enqueue, Handler, HandlerError, Worker};

    const POLICY: Policy = Policy::new(Duration::from_secs(5)).validated();
    static CHARGED: AtomicU32 = AtomicU32::new(0);

    async fn charge(call: &Call, _: &Attempt) -> Result<(), HandlerError> {
        let order: serde_json::Value = call.json()?;
        assert_eq!(order["cents"], 500);
        CHARGED.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn charged(_: &Call) -> Result<bool, HandlerError> {
        Ok(CHARGED.load(Ordering::Relaxed) > 0)
    }

    type BoxError = Box<dyn std::error::Error + Send + Sync>;

    #[rustfmt::skip]
    async fn order_and_charge(pool: sqlx::PgPool, id: i64, order: &serde_json::Value, shutdown: impl Future<Output = ()>) -> Result<(), BoxError> {
        let mut tx = pool.begin().await?;
        sqlx::query("INSERT INTO orders (id) VALUES ($1)").bind(id).execute(&mut *tx).await?;
        durable::enqueue(&mut tx, Enqueue::json("charge", &order)?).await?; // exists iff the order does
        tx.commit().await?;
        // In each worker process:
        Worker::new(pool).handle("charge", Handler::not_idempotent(POLICY, charge).reconcile(charged))
            .run(shutdown).await?;
        Ok(())
    }

    #[cfg_attr(
        no_postgres,
        ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
    )]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_readme_durable_call_is_charged_once() {
        let cluster = Cluster::start(&[]);
        let pool = sqlx::PgPool::connect(&cluster.url()).await.unwrap();
        sqlx::query("CREATE TABLE orders (id bigint PRIMARY KEY)")
            .execute(&pool)
            .await
            .unwrap();
        durable::migrate(&pool).await.unwrap();
        let watch = pool.clone();
        let done = async move {
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let s = durable::stats(&watch).await.unwrap();
                if s.first().is_some_and(|s| s.done == 1) {
                    return;
                }
            }
        };
        let order = serde_json::json!({"order": 42, "cents": 500});
        order_and_charge(pool, 42, &order, done).await.unwrap();
        assert_eq!(CHARGED.load(Ordering::Relaxed), 1);
    }
}
