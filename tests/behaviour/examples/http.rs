//! `cargo run --example http --features reqwest`: a `#[retryable]` HTTP client
//! against a flaky local server it starts itself.
//!
//! The server answers `503 Service Unavailable` with `Retry-After: 1` to the
//! first request, `502 Bad Gateway` to the second, and `200` after that. The
//! client's GET is idempotent, so both failures are retried: after the 503 it
//! pauses exactly as long as the server asked, after the 502 it uses its own
//! backoff.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::routing::get;
use retries::http::{HttpError, check};
use retries::retryable;

async fn flaky(State(hits): State<Arc<AtomicU32>>) -> (StatusCode, HeaderMap, &'static str) {
    let mut headers = HeaderMap::new();
    match hits.fetch_add(1, Ordering::SeqCst) {
        0 => {
            headers.insert("retry-after", HeaderValue::from_static("1"));
            (StatusCode::SERVICE_UNAVAILABLE, headers, "warming up")
        }
        1 => (StatusCode::BAD_GATEWAY, headers, "upstream lost"),
        _ => (
            StatusCode::OK,
            headers,
            "{\"sku\": \"sku-1234\", \"in_stock\": 56}",
        ),
    }
}

/// An idempotent GET: `check` turns a 503/502 response into a classified
/// error (with its `Retry-After`), so the loop can retry it.
#[retryable(deadline = "5s", max_attempts = 4, idempotent)]
async fn stock(client: &reqwest::Client, url: &str) -> Result<String, HttpError> {
    let response = check(client.get(url).send().await?)?;
    Ok(response.text().await?)
}

#[tokio::main]
async fn main() {
    // The attempt log: `retries` reports retries at DEBUG (and a call that
    // gives up at WARN); everything else at INFO.
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .without_time()
                .with_ansi(std::io::stdout().is_terminal())
                .with_target(false)
                .compact(),
        )
        .with(
            Targets::new()
                .with_default(tracing::Level::INFO)
                .with_target("retries", tracing::Level::DEBUG),
        )
        .init();

    let hits = Arc::new(AtomicU32::new(0));
    let app = Router::new()
        .route("/stock", get(flaky))
        .with_state(hits.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/stock", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });

    println!("GET {url} (503 + Retry-After: 1, then 502, then 200):");
    let client = reqwest::Client::new();
    let t0 = Instant::now();
    let body = stock(&client, &url).await;
    println!(
        "result: {body:?} after {} requests in {:.2?}",
        hits.load(Ordering::SeqCst),
        t0.elapsed()
    );
}
