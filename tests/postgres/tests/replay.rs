//! One source of truth for the stored answer (issue 59, row 3): a handler
//! that stores its own answer with `PgKeyStore::complete_in` builds the
//! response first and stores `Stored::from_response` of it. The replay of
//! the key is the first answer: the same status, headers (`content-type`
//! and the handler's own) and body, marked `Idempotent-Replayed`.

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{Response, StatusCode, header::CONTENT_TYPE};
use axum::routing::post;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retries_postgres_tests::Cluster;
use retries_sqlx::PgKeyStore;
use retries_tower::dedup::IdempotencyLayer;
use retries_tower::dedup::{Claimed, Stored};

#[derive(Clone)]
struct App {
    pool: sqlx::PgPool,
    keys: PgKeyStore,
}

async fn charge(State(app): State<App>, claim: Claimed) -> Response<Body> {
    let mut tx = app.pool.begin().await.expect("a transaction");
    let id: i64 = sqlx::query_scalar("INSERT INTO charges DEFAULT VALUES RETURNING id")
        .fetch_one(&mut *tx)
        .await
        .expect("a charge");
    let response = Response::builder()
        .status(StatusCode::CREATED)
        .header(CONTENT_TYPE, "application/json")
        .header("x-receipt", format!("r-{id}"))
        .body(format!("{{\"charge\":{id}}}"))
        .expect("a response");
    app.keys
        .complete_in(&mut *tx, &claim, &Stored::from_response(&response))
        .await
        .expect("the record");
    tx.commit().await.expect("committed");
    response.map(Body::from)
}

#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_is_the_first_answer() {
    let cluster = Cluster::start(&[]);
    let pool = sqlx::PgPool::connect(&cluster.url()).await.unwrap();
    sqlx::query("CREATE TABLE charges (id bigserial PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();
    let keys = PgKeyStore::new(pool.clone());
    keys.migrate().await.unwrap();
    let router = Router::new()
        .route("/charges", post(charge))
        .with_state(App {
            pool: pool.clone(),
            keys: keys.clone(),
        })
        .layer(IdempotencyLayer::new(keys));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await });
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let send = || async {
        let request = http::Request::post(format!("http://127.0.0.1:{port}/charges"))
            .header("idempotency-key", "k-replay")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = client.request(request).await.expect("an answer");
        let (head, body) = response.into_parts();
        (head, body.collect().await.unwrap().to_bytes())
    };
    let (first, first_body) = send().await;
    let (replay, replay_body) = send().await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(first.headers.get("idempotent-replayed").is_none());
    assert_eq!(replay.headers["idempotent-replayed"], "true");
    assert_eq!(replay.status, first.status);
    assert_eq!(replay_body, first_body);
    for name in ["content-type", "x-receipt"] {
        assert_eq!(replay.headers.get(name), first.headers.get(name), "{name}");
    }
    assert_eq!(first.headers["content-type"], "application/json");
    let charges: i64 = sqlx::query_scalar("SELECT count(*) FROM charges")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(charges, 1);
}
