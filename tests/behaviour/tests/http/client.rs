//! HTTP against a real server on loopback (axum), with a real client
//! (reqwest): `Retry-After` honoured, statuses classified, non-idempotent
//! requests never blindly repeated, connection refused retried, and hostile
//! `Retry-After` values survived. Real time, bounded (the longest test pauses
//! one second).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::routing::{get, post};
use retries::http::{HttpError, check};
use retries::{IdempotencyKey, retryable};

// `call(&policy)`: `retries::call` under this file's own name.
crate::common::named_call!();

#[derive(Default)]
struct Server {
    hits: AtomicU32,
    charges: Mutex<HashSet<String>>,
}

type Shared = State<Arc<Server>>;

/// 503 with `Retry-After: 1` on the first request, then 200.
async fn busy_once(State(s): Shared) -> (StatusCode, HeaderMap, &'static str) {
    let mut h = HeaderMap::new();
    if s.hits.fetch_add(1, Ordering::SeqCst) == 0 {
        h.insert("retry-after", HeaderValue::from_static("1"));
        return (StatusCode::SERVICE_UNAVAILABLE, h, "busy");
    }
    (StatusCode::OK, h, "42")
}

async fn broken(State(s): Shared) -> StatusCode {
    s.hits.fetch_add(1, Ordering::SeqCst);
    StatusCode::INTERNAL_SERVER_ERROR
}

/// 503 with a hostile `Retry-After`, always.
async fn hostile(State(s): Shared, Path(mode): Path<String>) -> (StatusCode, HeaderMap) {
    s.hits.fetch_add(1, Ordering::SeqCst);
    let mut h = HeaderMap::new();
    match mode.as_str() {
        "huge" => drop(h.insert("retry-after", HeaderValue::from_static("999999"))),
        "negative" => drop(h.insert("retry-after", HeaderValue::from_static("-5"))),
        "garbage" => drop(h.insert("retry-after", HeaderValue::from_static("soon, promise"))),
        _ => {
            h.append("retry-after", HeaderValue::from_static("1"));
            h.append("retry-after", HeaderValue::from_static("2"));
        }
    }
    (StatusCode::SERVICE_UNAVAILABLE, h)
}

/// Records the charge, then answers 502: the proxy lost the reply.
async fn charge(State(s): Shared, headers: HeaderMap) -> StatusCode {
    s.hits.fetch_add(1, Ordering::SeqCst);
    let key = headers["idempotency-key"].to_str().unwrap().to_string();
    s.charges.lock().unwrap().insert(key);
    StatusCode::BAD_GATEWAY
}

async fn find_charge(State(s): Shared, Path(key): Path<String>) -> (StatusCode, String) {
    if s.charges.lock().unwrap().contains(&key) {
        (StatusCode::OK, format!("receipt-{key}"))
    } else {
        (StatusCode::NOT_FOUND, String::new())
    }
}

async fn serve() -> (String, Arc<Server>) {
    let state = Arc::new(Server::default());
    let app = Router::new()
        .route("/busy-once", get(busy_once))
        .route("/broken", get(broken))
        .route("/hostile/{mode}", get(hostile))
        .route("/charge", post(charge))
        .route("/charge/{key}", get(find_charge))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), state)
}

#[retryable(
    deadline = "5s",
    max_attempts = 3,
    idempotent,
    backoff = "constant",
    initial_backoff = "50ms",
    budget = "none"
)]
async fn fetch(client: &reqwest::Client, url: &str) -> Result<String, HttpError> {
    let response = check(client.get(url).send().await?)?;
    Ok(response.text().await?)
}

#[tokio::test]
async fn retry_after_is_honoured_then_the_call_succeeds() {
    let (base, server) = serve().await;
    let client = reqwest::Client::new();
    let t0 = Instant::now();
    let body = fetch(&client, &format!("{base}/busy-once")).await.unwrap();
    let elapsed = t0.elapsed();
    assert_eq!(body, "42");
    assert_eq!(server.hits.load(Ordering::SeqCst), 2);
    assert!(
        elapsed >= Duration::from_secs(1),
        "paused {elapsed:?}, not the server's 1 s"
    );
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
}

#[tokio::test]
async fn a_500_is_not_retried() {
    let (base, server) = serve().await;
    let client = reqwest::Client::new();
    let err = fetch(&client, &format!("{base}/broken")).await.unwrap_err();
    assert!(
        matches!(&err, HttpError::Status(s) if s.status() == StatusCode::INTERNAL_SERVER_ERROR)
    );
    assert_eq!(server.hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn connection_refused_is_retried_as_not_executed() {
    // A port with nothing listening: bind, note it, close it.
    let addr: SocketAddr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let client = reqwest::Client::new();
    let attempts = AtomicU32::new(0);
    let t0 = Instant::now();
    let r = call(
        &retries::Policy::new(Duration::from_secs(5))
            .with_backoff(retries::Backoff::constant(Duration::from_millis(20))),
    )
    .not_idempotent() // even a non-idempotent call: the request was never sent
    .run(async |_: &retries::Attempt| -> Result<String, HttpError> {
        attempts.fetch_add(1, Ordering::SeqCst);
        Ok(
            check(client.post(format!("http://{addr}/charge")).send().await?)?
                .text()
                .await?,
        )
    })
    .await;
    let err = r.unwrap_err();
    assert!(
        matches!(&err, HttpError::Transport(e) if e.is_connect()),
        "{err:?}"
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    assert!(t0.elapsed() < Duration::from_secs(2));
}

async fn find(
    client: &reqwest::Client,
    base: &str,
    key: IdempotencyKey,
) -> Result<Option<String>, HttpError> {
    let response = client.get(format!("{base}/charge/{key}")).send().await?;
    if response.status() == StatusCode::NOT_FOUND {
        return Ok(None);
    }
    Ok(Some(check(response)?.text().await?))
}

#[retryable(deadline = "5s", max_attempts = 3, idempotent = false, attempt = at)]
async fn charge_blind(client: &reqwest::Client, base: &str) -> Result<String, HttpError> {
    let request = client
        .post(format!("{base}/charge"))
        .header("idempotency-key", at.idempotency_key().to_string());
    Ok(check(request.send().await?)?.text().await?)
}

#[retryable(deadline = "5s", max_attempts = 3, idempotent = false, attempt = at,
            reconcile = |key| find(client, base, key))]
async fn charge_reconciled(client: &reqwest::Client, base: &str) -> Result<String, HttpError> {
    let request = client
        .post(format!("{base}/charge"))
        .header("idempotency-key", at.idempotency_key().to_string());
    Ok(check(request.send().await?)?.text().await?)
}

#[tokio::test]
async fn a_non_idempotent_post_answered_502_is_not_repeated() {
    let (base, server) = serve().await;
    let client = reqwest::Client::new();
    let err = charge_blind(&client, &base).await.unwrap_err();
    assert!(matches!(&err, HttpError::Status(s) if s.status() == StatusCode::BAD_GATEWAY));
    assert_eq!(server.hits.load(Ordering::SeqCst), 1);
    assert_eq!(server.charges.lock().unwrap().len(), 1);

    // With `reconcile`, the charge is found by its key: success, still one charge.
    let receipt = charge_reconciled(&client, &base).await.unwrap();
    assert!(receipt.starts_with("receipt-"));
    assert_eq!(server.hits.load(Ordering::SeqCst), 2);
    assert_eq!(server.charges.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn a_retry_after_beyond_the_deadline_stops_at_once() {
    let (base, server) = serve().await;
    let client = reqwest::Client::new();
    let t0 = Instant::now();
    let err = fetch(&client, &format!("{base}/hostile/huge"))
        .await
        .unwrap_err();
    // Stopped before the deadline, by the pause: the caller gets a stop
    // that says so (not "deadline exceeded", nor a bare 503 that reads like
    // one refusal), the 503 it came with as its source.
    let HttpError::Stopped(stop) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(stop.reason(), retries::Reason::PauseExceedsDeadline);
    let last = std::error::Error::source(stop).and_then(|e| e.downcast_ref::<HttpError>());
    assert!(
        matches!(last, Some(HttpError::Status(s)) if s.status() == StatusCode::SERVICE_UNAVAILABLE),
        "{err:?}"
    );
    assert_eq!(server.hits.load(Ordering::SeqCst), 1);
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "slept on a hostile hint"
    );
}

#[tokio::test]
async fn negative_garbage_and_repeated_retry_after_fall_back_to_backoff() {
    let (base, server) = serve().await;
    let client = reqwest::Client::new();
    for (i, mode) in ["negative", "garbage", "repeated"].into_iter().enumerate() {
        let t0 = Instant::now();
        let err = fetch(&client, &format!("{base}/hostile/{mode}"))
            .await
            .unwrap_err();
        let elapsed = t0.elapsed();
        // 503 without a valid hint is `Unknown`: an idempotent GET retries it,
        // with the computed 50 ms pauses, three attempts in all.
        assert!(
            matches!(&err, HttpError::Status(s) if s.retry_after().is_none()),
            "{mode}"
        );
        assert_eq!(
            server.hits.load(Ordering::SeqCst),
            3 * (i as u32 + 1),
            "{mode}"
        );
        assert!(
            elapsed >= Duration::from_millis(100) && elapsed < Duration::from_secs(1),
            "{mode}: {elapsed:?}"
        );
    }
}
