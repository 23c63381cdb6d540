//! Stops the caller can see (issue 59, item 5): every way a call ends is
//! told apart by what its door returns. The HTTP doors answer with the
//! last response as it came, marked with `Ended` (why, after how many
//! attempts); `run_fn` returns a `Stopped` (the last error its source) for
//! a pause that did not fit and for the budget, never the bare error of one
//! refusal. An axum server on loopback; the table is in
//! `retries::failure`'s docs.

use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::routing::get;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use retries::{Backoff, Policy, Reason, Stopped, TokenBucket};
use retries_tower::{Ended, RetryLayer};
use tower::ServiceExt;

fn retry_after(secs: &'static str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(http::header::RETRY_AFTER, HeaderValue::from_static(secs));
    h
}

async fn serve() -> std::net::SocketAddr {
    let app = Router::new()
        // A pause the server asks for that no deadline fits.
        .route(
            "/hostile",
            get(|| async {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    retry_after("999999"),
                    "busy",
                )
            }),
        )
        // A refusal with no pause: retried until the attempts are spent.
        .route(
            "/busy",
            get(|| async { (StatusCode::SERVICE_UNAVAILABLE, retry_after("0"), "busy") }),
        )
        .route(
            "/broken",
            get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "no") }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn policy() -> Policy {
    Policy::new(Duration::from_secs(5))
        .with_max_attempts(3)
        .with_backoff(Backoff::constant(Duration::from_millis(1)))
}

type Inner = Client<HttpConnector, retries_tower::ReplayBody<Full<Bytes>>>;

/// A bucket of one token: a failure leaves it at half or less, so it lends
/// no retry.
static EMPTY: TokenBucket = TokenBucket::new(1, 0.1);

#[tokio::test]
async fn the_tower_layer_marks_each_stop_on_its_answer() {
    let addr = serve().await;
    let ended = |budget: Option<&'static TokenBucket>, route: &'static str| async move {
        let client: Inner = Client::builder(TokioExecutor::new()).build_http();
        let request = http::Request::get(format!("http://{addr}{route}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let layer = RetryLayer::new(policy());
        let response = match budget {
            Some(b) => layer.budget(b).layer(client).oneshot(request).await,
            None => layer.layer(client).oneshot(request).await,
        }
        .unwrap();
        let ended = response.extensions().get::<Ended>().copied();
        (
            response.status().as_u16(),
            ended.map(|e| (e.reason(), e.attempts())),
        )
    };
    assert_eq!(
        ended(None, "/hostile").await,
        (503, Some((Reason::PauseExceedsDeadline, 1)))
    );
    assert_eq!(
        ended(None, "/busy").await,
        (503, Some((Reason::Exhausted, 3)))
    );
    assert_eq!(
        ended(None, "/broken").await,
        (500, Some((Reason::Permanent, 1)))
    );
    // A budget with no token left for a retry: the first refusal stops it.
    assert_eq!(
        ended(Some(&EMPTY), "/busy").await,
        (503, Some((Reason::BudgetExhausted, 1)))
    );
}

#[tokio::test]
async fn the_reqwest_middleware_marks_each_stop_on_its_answer() {
    use retries_reqwest::RetryMiddleware;
    let addr = serve().await;
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy()))
        .build();
    for (route, status, reason, attempts) in [
        ("/hostile", 503, Reason::PauseExceedsDeadline, 1),
        ("/busy", 503, Reason::Exhausted, 3),
        ("/broken", 500, Reason::Permanent, 1),
    ] {
        let response = client
            .get(format!("http://{addr}{route}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), status, "{route}");
        let ended = response
            .extensions()
            .get::<retries_reqwest::Ended>()
            .copied();
        assert_eq!(
            ended.map(|e| (e.reason(), e.attempts())),
            Some((reason, attempts)),
            "{route}"
        );
    }
}

/// `run_fn` with `io::Error` (issue 59, row 6): stopped early because the
/// next pause did not fit, the caller gets a stop that says so, not the bare
/// error of one refusal; the last error stays reachable as its source.
#[tokio::test(start_paused = true)]
async fn run_fn_returns_a_stop_for_a_pause_that_does_not_fit() {
    const POLICY: Policy = Policy::new(Duration::from_secs(1))
        .with_backoff(Backoff::constant(Duration::from_secs(2)))
        .validated();
    let err = retries::call(&POLICY)
        .idempotent()
        .run_fn(|_| async {
            Err::<(), _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
        })
        .await
        .unwrap_err();
    let stop = err
        .get_ref()
        .and_then(|e| e.downcast_ref::<Stopped>())
        .expect("a stop, not the bare refusal");
    assert_eq!(stop.reason(), Reason::PauseExceedsDeadline);
    let last = std::error::Error::source(stop).and_then(|e| e.downcast_ref::<std::io::Error>());
    assert_eq!(
        last.map(std::io::Error::kind),
        Some(std::io::ErrorKind::ConnectionRefused)
    );
}
