//! A charge service for the exactly-once test (`tests/exactly_once.rs`):
//! axum `POST /charges` on loopback, its charges in PostgreSQL, behind
//! `FaultLayer` with every kind of fault: 20 % of replies dropped after the
//! handler, 5 % failed after it (503), 5 % refused before it, 5 % delayed
//! 30 ms, 2 % hung (until the caller's attempt ends). One process per
//! replica; the test kills one with `SIGKILL`.
//!
//! `charge_server URL PORT MODE SEED`, `MODE` one of:
//! * `layer`: `IdempotencyLayer` over `PgKeyStore`, the record written in
//!   the charge's transaction (`complete_in`);
//! * `cache`: the pattern of the crates that exist: a cached answer is
//!   returned if there is one, else the charge runs, then its answer is
//!   cached;
//! * `none`: no deduplication.
//!
//! Every charge works 20 ms after its effect (rendering, a call out) before
//! it answers, one charge in twenty 400 ms (a slow call out: longer than
//! the client's attempt, which gives up and sends the key again while the
//! first still runs): in `layer` mode inside its transaction, in the others after
//! the charge committed. Prints `listening PORT` once it accepts.

use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Router, body::Bytes};
use retries_chaos::{Chaos, Fault, FaultLayer, Rule};
use retries_sqlx::PgKeyStore;
use retries_tower::dedup::IdempotencyLayer;
use retries_tower::dedup::{Claimed, Stored};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// Charges this process has run.
static RUN: AtomicU64 = AtomicU64::new(0);

/// The work after the charge: 400 ms for every twentieth charge this
/// process runs, else 20 ms.
fn after_effect() -> Duration {
    if RUN.fetch_add(1, Ordering::Relaxed) % 20 == 19 {
        Duration::from_millis(400)
    } else {
        Duration::from_millis(20)
    }
}

#[derive(Clone)]
struct App {
    pool: PgPool,
    keys: PgKeyStore,
}

fn key_of(headers: &HeaderMap) -> String {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

fn fail(e: impl std::fmt::Display) -> Response {
    (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
}

/// `layer` mode: the charge and the key's record in one transaction.
async fn charge_in_tx(
    State(app): State<App>,
    claim: Claimed,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let cents: i64 = String::from_utf8_lossy(&body).parse().unwrap_or(0);
    let run = async {
        let mut tx = app.pool.begin().await?;
        let id: i64 =
            sqlx::query_scalar("INSERT INTO charges (key, cents) VALUES ($1, $2) RETURNING id")
                .bind(key_of(&headers))
                .bind(cents)
                .fetch_one(&mut *tx)
                .await?;
        tokio::time::sleep(after_effect()).await;
        let receipt = format!("receipt {id}");
        let answer = Stored {
            status: 201,
            headers: vec![],
            body: receipt.clone().into_bytes(),
            trailers: vec![],
            body_dropped: false,
        };
        app.keys.complete_in(&mut *tx, &claim, &answer).await?;
        tx.commit().await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(receipt)
    };
    match run.await {
        Ok(receipt) => (StatusCode::CREATED, receipt).into_response(),
        Err(e) => fail(e),
    }
}

/// `cache` mode: a cached answer, else charge, then cache the answer.
async fn charge_then_cache(State(app): State<App>, headers: HeaderMap, body: Bytes) -> Response {
    let key = key_of(&headers);
    let cents: i64 = String::from_utf8_lossy(&body).parse().unwrap_or(0);
    let run = async {
        let cached: Option<String> = sqlx::query_scalar("SELECT answer FROM cache WHERE key = $1")
            .bind(&key)
            .fetch_optional(&app.pool)
            .await?;
        if let Some(answer) = cached {
            return Ok((answer, true));
        }
        let id: i64 =
            sqlx::query_scalar("INSERT INTO charges (key, cents) VALUES ($1, $2) RETURNING id")
                .bind(&key)
                .bind(cents)
                .fetch_one(&app.pool)
                .await?;
        tokio::time::sleep(after_effect()).await;
        let receipt = format!("receipt {id}");
        sqlx::query("INSERT INTO cache (key, answer) VALUES ($1, $2) ON CONFLICT DO NOTHING")
            .bind(&key)
            .bind(&receipt)
            .execute(&app.pool)
            .await?;
        Ok::<_, sqlx::Error>((receipt, false))
    };
    match run.await {
        Ok((receipt, false)) => (StatusCode::CREATED, receipt).into_response(),
        Ok((receipt, true)) => (
            StatusCode::CREATED,
            [("idempotent-replayed", "true")],
            receipt,
        )
            .into_response(),
        Err(e) => fail(e),
    }
}

/// `none` mode: charge.
async fn charge_plain(State(app): State<App>, headers: HeaderMap, body: Bytes) -> Response {
    let cents: i64 = String::from_utf8_lossy(&body).parse().unwrap_or(0);
    let charged: Result<i64, sqlx::Error> =
        sqlx::query_scalar("INSERT INTO charges (key, cents) VALUES ($1, $2) RETURNING id")
            .bind(key_of(&headers))
            .bind(cents)
            .fetch_one(&app.pool)
            .await;
    tokio::time::sleep(after_effect()).await;
    match charged {
        Ok(id) => (StatusCode::CREATED, format!("receipt {id}")).into_response(),
        Err(e) => fail(e),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, port, mode, seed] = &args[..] else {
        eprintln!("usage: charge_server URL PORT layer|cache|none SEED");
        std::process::exit(2);
    };
    let pool = PgPoolOptions::new()
        .max_connections(12)
        .acquire_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .expect("the database");
    let app = App {
        keys: PgKeyStore::new(pool.clone()),
        pool,
    };
    let chaos = Chaos::builder()
        .seed(seed.parse().expect("a seed"))
        .rule(Rule::new(Fault::DropReply).rate(0.2))
        .rule(Rule::new(Fault::FAIL_AFTER).rate(0.05))
        .rule(Rule::new(Fault::Refuse { retry_after: None }).rate(0.05))
        .rule(Rule::new(Fault::Delay(Duration::from_millis(30))).rate(0.05))
        .rule(
            Rule::new(Fault::Hang {
                max: Duration::from_secs(2),
            })
            .rate(0.02),
        )
        .build()
        .expect("a chaos");
    let router = match mode.as_str() {
        "layer" => Router::new()
            .route("/charges", post(charge_in_tx))
            .layer(IdempotencyLayer::new(app.keys.clone()).lease(Duration::from_secs(1)))
            .with_state(app),
        "cache" => Router::new()
            .route("/charges", post(charge_then_cache))
            .with_state(app),
        "none" => Router::new()
            .route("/charges", post(charge_plain))
            .with_state(app),
        other => panic!("no mode {other}"),
    }
    .layer(FaultLayer::new(chaos));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port.parse().expect("a port")))
        .await
        .expect("the port");
    let port = listener.local_addr().expect("bound").port();
    let mut out = std::io::stdout();
    // One write: the test reads the line whole.
    out.write_all(format!("listening {port}\n").as_bytes())
        .and_then(|()| out.flush())
        .expect("stdout");
    axum::serve(listener, router).await.expect("serving");
}
