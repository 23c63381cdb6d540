//! The `ureq` door against a real axum server on loopback: what it retries,
//! what it does not, and what the server is told.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use http::HeaderName;
use retries_core::{Policy, Reason};
use retries_ureq_door::{Door, Error, post as post_request};

/// A server on a free loopback port, run by its own runtime thread: `GET
/// /flaky` answers 503 with `Retry-After: 0` twice then 200; `POST /charge`
/// answers 502 (the proxy lost the upstream: unknown) to every request.
/// Returns its address, the requests each route got, and the last
/// `retries-timeout-ms` seen.
fn server() -> (String, Arc<AtomicU32>, Arc<AtomicU32>, Arc<AtomicU32>) {
    let flaky = Arc::new(AtomicU32::new(0));
    let charges = Arc::new(AtomicU32::new(0));
    let timeout_ms = Arc::new(AtomicU32::new(0));
    let (f, c, t) = (flaky.clone(), charges.clone(), timeout_ms.clone());
    let app = Router::new()
        .route(
            "/flaky",
            get(move |headers: HeaderMap| {
                let n = f.fetch_add(1, Ordering::SeqCst) + 1;
                let ms = headers
                    .get("retries-timeout-ms")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(0);
                t.store(ms, Ordering::SeqCst);
                async move {
                    if n <= 2 {
                        (
                            StatusCode::SERVICE_UNAVAILABLE,
                            [("retry-after", "0")],
                            "busy",
                        )
                    } else {
                        (StatusCode::OK, [("x-n", "3")], "stock 7")
                    }
                }
            }),
        )
        .route(
            "/charge",
            post(move || {
                c.fetch_add(1, Ordering::SeqCst);
                async { StatusCode::BAD_GATEWAY }
            }),
        );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    (format!("http://{addr}"), flaky, charges, timeout_ms)
}

fn policy() -> Policy {
    // Generous for a busy machine: the deadline is never what ends these calls.
    Policy::new(Duration::from_secs(30))
        .with_max_attempts(4)
        .with_backoff(retries_core::Backoff::constant(Duration::from_millis(1)))
}

#[test]
fn a_get_is_retried_through_503s_and_sends_its_time_left() {
    let (url, flaky, _, timeout_ms) = server();
    let door = Door::new(policy());
    let request = http::Request::get(format!("{url}/flaky"))
        .body(Vec::new())
        .unwrap();
    let (status, body) = door.send(&request).unwrap();
    assert_eq!(
        (status, body.as_slice()),
        (http::StatusCode::OK, b"stock 7".as_slice())
    );
    assert_eq!(flaky.load(Ordering::SeqCst), 3, "two 503s, then the answer");
    let ms = timeout_ms.load(Ordering::SeqCst);
    assert!(
        ms > 0 && ms <= 30_000,
        "the attempt's time left on the wire: {ms} ms"
    );
}

#[test]
fn a_post_with_an_unknown_outcome_is_not_repeated() {
    let (url, _, charges, _) = server();
    let door = Door::new(policy());
    let failure = door
        .send(&post_request(&format!("{url}/charge"), b"5 EUR"))
        .unwrap_err();
    assert_eq!(
        charges.load(Ordering::SeqCst),
        1,
        "a 502 may have charged: never sent again"
    );
    assert_eq!(failure.reason(), Reason::UnknownOutcome);
    assert!(matches!(failure.last_error(), Some(Error::Status(s, _, _)) if s.as_u16() == 502));
}

#[test]
fn a_post_carrying_the_key_header_is_idempotent_and_retried() {
    let (url, _, charges, _) = server();
    let key = HeaderName::from_static("idempotency-key");
    let door = Door::new(policy()).idempotent_with_header(key.clone());
    let mut request = post_request(&format!("{url}/charge"), b"5 EUR");
    request.headers_mut().insert(key, "k-1".parse().unwrap());
    let failure = door.send(&request).unwrap_err();
    assert_eq!(
        charges.load(Ordering::SeqCst),
        4,
        "every attempt sent: the server deduplicates by key"
    );
    assert_eq!(failure.reason(), Reason::Exhausted);
}

#[test]
fn a_refused_connection_is_not_executed_and_retried() {
    // A port with nothing listening: every attempt is refused before sending.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let door = Door::new(policy());
    let failure = door
        .send(&post_request(
            &format!("http://127.0.0.1:{port}/charge"),
            b"5 EUR",
        ))
        .unwrap_err();
    assert_eq!(
        failure.attempts(),
        4,
        "not executed: even a POST is retried"
    );
    assert_eq!(failure.reason(), Reason::Exhausted);
}
