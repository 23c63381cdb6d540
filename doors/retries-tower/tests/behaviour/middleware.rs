//! The middleware doors against a real axum server on loopback: the tower
//! layer over a real hyper-util client, and the reqwest middleware over a
//! real reqwest client. `Retry-After` honoured, a refused connection
//! retried, a POST never replayed after an unknown outcome (unless it carries
//! an idempotency key, or `reconcile` finds its work), a body over the cap not
//! retried, a streaming body replayed byte for byte (server-side checksum),
//! and the layer under `#[retryable]` making one attempt per outer attempt.
//! Real time, bounded (the longest test pauses one second).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::routing::{get, post, put};
use http::header::HeaderName;
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use retries::http::StatusError;
use retries_tower::ReplayBody;
use retries_tower::{BoxError, Deadline};

use retries::{Backoff, Policy, Reason, Stopped, retryable};
use retries_tower::RetryLayer;
use tower::{Service, ServiceExt};

#[derive(Default)]
struct Books {
    hits: Mutex<HashMap<String, u32>>,
    /// Jobs created, by the key the client sent.
    jobs: Mutex<HashMap<String, u32>>,
    /// (length, checksum) of every upload body received.
    uploads: Mutex<Vec<(usize, u64)>>,
}

impl Books {
    fn hit(&self, route: &str) -> u32 {
        let mut hits = self.hits.lock().unwrap();
        let n = hits.entry(route.to_string()).or_default();
        *n += 1;
        *n
    }
    fn hits(&self, route: &str) -> u32 {
        self.hits.lock().unwrap().get(route).copied().unwrap_or(0)
    }
}

type Shared = State<Arc<Books>>;

/// FNV-1a, enough to tell two bodies apart.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// 503 with `Retry-After: {secs}` for the first `n` requests, then 200.
async fn busy(State(b): Shared, Path((n, secs)): Path<(u32, u32)>) -> (StatusCode, HeaderMap) {
    let mut h = HeaderMap::new();
    if b.hit("busy") <= n {
        h.insert("retry-after", HeaderValue::from(secs));
        return (StatusCode::SERVICE_UNAVAILABLE, h);
    }
    (StatusCode::OK, h)
}

/// 503 without `Retry-After`, always: the outcome is unknown.
/// A 503 from a server that already retried below: the marker says so.
async fn marked(State(b): Shared) -> (StatusCode, [(&'static str, &'static str); 1]) {
    b.hit("/marked");
    (StatusCode::SERVICE_UNAVAILABLE, [("retries-no-retry", "1")])
}

async fn unknown(State(b): Shared) -> StatusCode {
    b.hit("unknown");
    StatusCode::SERVICE_UNAVAILABLE
}

/// Creates a job, then answers 502 the first time a key is seen (the reply
/// was lost), 200 after (the server deduplicates by key).
async fn create_job(State(b): Shared, headers: HeaderMap) -> StatusCode {
    b.hit("jobs");
    let key = headers
        .get("idempotency-key")
        .or_else(|| headers.get("x-call-key"))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let mut jobs = b.jobs.lock().unwrap();
    let seen = jobs.entry(key).or_default();
    *seen += 1;
    if *seen == 1 {
        StatusCode::BAD_GATEWAY
    } else {
        StatusCode::OK
    }
}

async fn find_job(State(b): Shared, Path(key): Path<String>) -> StatusCode {
    if b.jobs.lock().unwrap().contains_key(&key) {
        StatusCode::OK
    } else {
        StatusCode::NOT_FOUND
    }
}

/// Records the body's length and checksum; 503 (`Retry-After: 0`) the first
/// time, then 200 with the checksum.
async fn upload(State(b): Shared, body: Bytes) -> (StatusCode, HeaderMap, String) {
    let sum = checksum(&body);
    b.uploads.lock().unwrap().push((body.len(), sum));
    let mut h = HeaderMap::new();
    if b.hit("upload") == 1 {
        h.insert("retry-after", HeaderValue::from_static("0"));
        return (StatusCode::SERVICE_UNAVAILABLE, h, String::new());
    }
    (StatusCode::OK, h, sum.to_string())
}

async fn serve() -> (String, Arc<Books>) {
    let books = Arc::new(Books::default());
    let app = Router::new()
        .route("/busy/{n}/{secs}", get(busy))
        .route("/unknown", get(unknown))
        .route("/marked", get(marked))
        .route("/jobs", post(create_job))
        .route("/jobs/{key}", get(find_job))
        .route("/upload", put(upload).post(upload))
        .with_state(books.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), books)
}

type Body = BoxBody<Bytes, BoxError>;
type HyperClient = Client<HttpConnector, ReplayBody<Body>>;

fn hyper_client() -> HyperClient {
    Client::builder(TokioExecutor::new()).build_http()
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|e| match e {}).boxed()
}

/// A body sent in `chunks` pieces, each read only when the client asks.
fn streaming(data: &[u8], chunks: usize) -> Body {
    let pieces: Vec<Result<Frame<Bytes>, BoxError>> = data
        .chunks(data.len().div_ceil(chunks))
        .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
        .collect();
    StreamBody::new(futures_util::stream::iter(pieces)).boxed()
}

fn policy() -> Policy {
    Policy::new(Duration::from_secs(5))
        .with_max_attempts(3)
        .with_backoff(Backoff::constant(Duration::from_millis(10)))
}

fn request(method: &str, uri: &str, body: Body) -> http::Request<Body> {
    http::Request::builder()
        .method(method)
        .uri(uri)
        .body(body)
        .unwrap()
}

/// The data of the test uploads: 10,000 bytes, none alike in a row.
fn upload_data() -> Vec<u8> {
    (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect()
}

#[tokio::test]
async fn layer_honours_retry_after() {
    let (base, books) = serve().await;
    let mut svc = RetryLayer::new(policy()).layer(hyper_client());
    let t0 = Instant::now();
    let response = svc
        .ready()
        .await
        .unwrap()
        .call(request("GET", &format!("{base}/busy/1/1"), full("")))
        .await
        .unwrap();
    let elapsed = t0.elapsed();
    assert_eq!(response.status(), 200);
    assert_eq!(books.hits("busy"), 2);
    assert!(elapsed >= Duration::from_secs(1), "paused only {elapsed:?}");
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
}

#[tokio::test]
async fn layer_returns_the_last_response_when_attempts_run_out() {
    let (base, books) = serve().await;
    let mut svc = RetryLayer::new(policy().with_max_attempts(2)).layer(hyper_client());
    let response = svc
        .ready()
        .await
        .unwrap()
        .call(request("GET", &format!("{base}/busy/5/0"), full("")))
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        503,
        "the 503 it is, not an invented error"
    );
    assert_eq!(books.hits("busy"), 2);
}

#[tokio::test]
async fn layer_retries_a_refused_connection_even_for_a_post() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    }; // closed again: connections are refused
    let sent = Arc::new(AtomicU32::new(0));
    let counted = {
        let sent = sent.clone();
        let client = hyper_client();
        tower::service_fn(move |r: http::Request<ReplayBody<Body>>| {
            sent.fetch_add(1, Ordering::SeqCst);
            client.request(r)
        })
    };
    let mut svc = RetryLayer::new(policy()).layer(counted);
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(request(
            "POST",
            &format!("http://127.0.0.1:{port}/jobs"),
            full("x"),
        ))
        .await
        .unwrap_err();
    assert_eq!(sent.load(Ordering::SeqCst), 3, "not executed: retried");
    let err = err.downcast::<hyper_util::client::legacy::Error>().unwrap();
    assert!(err.is_connect(), "{err}");
}

#[tokio::test]
async fn layer_never_replays_a_post_after_an_unknown_outcome() {
    let (base, books) = serve().await;
    let mut svc = RetryLayer::new(policy()).layer(hyper_client());
    let response = svc
        .ready()
        .await
        .unwrap()
        .call(request("POST", &format!("{base}/jobs"), full("job")))
        .await
        .unwrap();
    assert_eq!(response.status(), 502);
    assert_eq!(books.hits("jobs"), 1, "a 502 may hide a created job");
}

#[tokio::test]
async fn layer_retries_a_post_that_carries_an_idempotency_key() {
    let (base, books) = serve().await;
    let mut svc = RetryLayer::new(policy())
        .idempotent_with_header(HeaderName::from_static("idempotency-key"))
        .layer(hyper_client());
    let mut req = request("POST", &format!("{base}/jobs"), full("job"));
    req.headers_mut()
        .insert("idempotency-key", HeaderValue::from_static("order-7"));
    let response = svc.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(books.hits("jobs"), 2);
    assert_eq!(books.jobs.lock().unwrap()["order-7"], 2);
}

#[tokio::test]
async fn layer_reconciles_an_unknown_post_by_its_key() {
    let (base, books) = serve().await;
    let lookups = Arc::new(AtomicU32::new(0));
    let lookup_client: Client<HttpConnector, Body> =
        Client::builder(TokioExecutor::new()).build_http();
    let lookup_base = base.clone();
    let seen = lookups.clone();
    let mut svc = RetryLayer::new(policy())
        .send_key(HeaderName::from_static("x-call-key"))
        .reconcile(move |key, _parts: &http::request::Parts| {
            seen.fetch_add(1, Ordering::SeqCst);
            let uri = format!("{lookup_base}/jobs/{key}");
            let client = lookup_client.clone();
            async move {
                let found = client.request(request("GET", &uri, full(""))).await?;
                Ok((found.status() == 200).then_some(found))
            }
        })
        .layer(hyper_client());
    let response = svc
        .ready()
        .await
        .unwrap()
        .call(request("POST", &format!("{base}/jobs"), full("job")))
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "the job was found by its key");
    assert_eq!(books.hits("jobs"), 1, "and not created twice");
    assert_eq!(lookups.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn layer_replays_a_streaming_body_byte_for_byte() {
    let (base, books) = serve().await;
    let data = upload_data();
    let mut svc = RetryLayer::new(policy()).layer(hyper_client());
    let response = svc
        .ready()
        .await
        .unwrap()
        .call(request(
            "PUT",
            &format!("{base}/upload"),
            streaming(&data, 10),
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let expected = (data.len(), checksum(&data));
    assert_eq!(*books.uploads.lock().unwrap(), vec![expected, expected]);
    let answer = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(answer, checksum(&data).to_string());
}

#[tokio::test]
async fn layer_does_not_retry_a_body_over_the_cap() {
    let (base, books) = serve().await;
    let data = upload_data();
    let mut svc = RetryLayer::new(policy())
        .body_cap(4096)
        .layer(hyper_client());
    let response = svc
        .ready()
        .await
        .unwrap()
        .call(request(
            "PUT",
            &format!("{base}/upload"),
            streaming(&data, 10),
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), 503, "committed: returned as it came");
    assert_eq!(books.uploads.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn layer_keeps_a_deadline_the_request_brings() {
    let (base, books) = serve().await;
    let mut svc = RetryLayer::new(policy().with_max_attempts(10)).layer(hyper_client());
    let mut req = request("GET", &format!("{base}/busy/10/1"), full(""));
    req.extensions_mut().insert(Deadline(
        (tokio::time::Instant::now() + Duration::from_millis(500)).into_std(),
    ));
    let t0 = Instant::now();
    let response = svc.ready().await.unwrap().call(req).await.unwrap();
    // Stopped before the deadline: the 503 and its hint, as they came.
    assert_eq!(response.status(), 503);
    assert_eq!(books.hits("busy"), 1, "a 1 s pause does not fit in 500 ms");
    assert!(t0.elapsed() < Duration::from_millis(500), "stopped at once");
}

#[retryable(
    deadline = "5s",
    max_attempts = 3,
    idempotent,
    backoff = "constant",
    initial_backoff = "10ms",
    budget = "none"
)]
async fn outer(
    svc: &mut retries_tower::RetryService<HyperClient>,
    uri: &str,
) -> Result<u16, BoxedError> {
    let response = svc
        .ready()
        .await?
        .call(request("GET", uri, full("")))
        .await?;
    if response.status().is_server_error() {
        return Err(StatusError::new(response.status(), response.headers()).into());
    }
    Ok(response.status().as_u16())
}

/// The error of [`outer`].
#[derive(Debug, thiserror::Error)]
enum BoxedError {
    #[error(transparent)]
    Status(#[from] StatusError),
    #[error("{0}")]
    Other(BoxError),
    #[error(transparent)]
    Stopped(#[from] Stopped),
}

impl retries::Classify for BoxedError {
    fn classify(&self) -> retries::Verdict {
        match self {
            Self::Status(e) => e.classify(),
            Self::Other(_) | Self::Stopped(_) => retries::Verdict::permanent(),
        }
    }
}

impl From<BoxError> for BoxedError {
    fn from(e: BoxError) -> Self {
        Self::Other(e)
    }
}

#[tokio::test]
async fn layer_under_retryable_makes_one_attempt_per_outer_attempt() {
    let (base, books) = serve().await;
    let mut svc = RetryLayer::new(policy()).layer(hyper_client());
    let err = outer(&mut svc, &format!("{base}/unknown"))
        .await
        .unwrap_err();
    assert!(matches!(err, BoxedError::Status(_)), "{err}");
    assert_eq!(books.hits("unknown"), 3, "3 outer attempts, not 3 × 3");
}

/// POST a job with the idempotency key `key` through `client`: the first
/// answer is a 502 (the reply lost), so it succeeds on its one retry.
async fn post_job_retried_once(
    client: &reqwest_middleware::ClientWithMiddleware,
    base: &str,
    books: &Books,
    key: &str,
) {
    let response = client
        .post(format!("{base}/jobs"))
        .header("idempotency-key", key)
        .body("job")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(books.hits("jobs"), 2);
}

mod reqwest_door {
    use super::*;
    use reqwest_middleware::ClientBuilder;
    use retries_reqwest::RetryMiddleware;

    fn client(m: RetryMiddleware) -> reqwest_middleware::ClientWithMiddleware {
        ClientBuilder::new(reqwest::Client::new()).with(m).build()
    }

    /// With `retry_if` set, a response carrying `retries-no-retry` still
    /// stops the call: one request, the marked 503 as the answer.
    #[tokio::test]
    async fn the_marker_is_honoured_before_retry_if() {
        let (base, books) = serve().await;
        let client = client(RetryMiddleware::new(policy()).retry_if(|status, _| {
            status
                .is_server_error()
                .then(retries::Verdict::not_executed)
        }));
        let response = client.get(format!("{base}/marked")).send().await.unwrap();
        assert_eq!(response.status(), 503);
        assert_eq!(books.hits("/marked"), 1, "not retried");
    }

    /// The middleware's `rate_limit`, against the real server: 20 starts a
    /// second, no burst, so three requests end at least 100 ms after the
    /// first began (two waits of 50 ms) and each reaches the server.
    #[tokio::test]
    async fn rate_limit_spaces_requests() {
        let (base, books) = serve().await;
        let rate = retries::limit::RateLimit::new(20, Duration::from_secs(1), 1);
        let client = client(RetryMiddleware::new(policy()).rate_limit(rate));
        let t0 = std::time::Instant::now();
        for _ in 0..3 {
            let r = client.get(format!("{base}/busy/0/0")).send().await.unwrap();
            assert_eq!(r.status(), 200);
        }
        assert!(
            t0.elapsed() >= Duration::from_millis(100),
            "{:?}",
            t0.elapsed()
        );
        assert_eq!(books.hits("busy"), 3);
    }

    /// Inside a scope whose deadline has passed (a server handler whose
    /// caller's time is up): no request is sent.
    #[tokio::test]
    async fn no_request_after_the_deadline() {
        let (base, books) = serve().await;
        let client = client(RetryMiddleware::new(policy()));
        let passed = std::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(5)).await;
        let err =
            retries::scope::with_deadline(passed, client.get(format!("{base}/unknown")).send())
                .await
                .unwrap_err();
        let stopped = std::error::Error::source(&err)
            .and_then(|e| e.downcast_ref::<Stopped>())
            .or_else(|| match &err {
                reqwest_middleware::Error::Middleware(e) => e.downcast_ref::<Stopped>(),
                reqwest_middleware::Error::Reqwest(_) => None,
            })
            .unwrap_or_else(|| panic!("a stop: {err:?}"));
        assert_eq!(stopped.reason(), Reason::DeadlineExceeded);
        assert_eq!(stopped.attempts(), 0);
        assert_eq!(books.hits("/unknown"), 0, "nothing sent");
    }

    #[tokio::test]
    async fn honours_retry_after() {
        let (base, books) = serve().await;
        let client = client(RetryMiddleware::new(policy()));
        let t0 = Instant::now();
        let response = client.get(format!("{base}/busy/1/1")).send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(books.hits("busy"), 2);
        assert!(t0.elapsed() >= Duration::from_secs(1), "{:?}", t0.elapsed());
    }

    #[tokio::test]
    async fn never_replays_a_post_after_an_unknown_outcome() {
        let (base, books) = serve().await;
        let client = client(RetryMiddleware::new(policy()));
        let response = client
            .post(format!("{base}/jobs"))
            .body("job")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 502);
        assert_eq!(books.hits("jobs"), 1);
    }

    #[tokio::test]
    async fn retries_a_post_with_an_idempotency_key() {
        let (base, books) = serve().await;
        let client = client(
            RetryMiddleware::new(policy())
                .idempotent_with_header(HeaderName::from_static("idempotency-key")),
        );
        post_job_retried_once(&client, &base, &books, "order-9").await;
    }

    #[tokio::test]
    async fn replays_a_streaming_body_byte_for_byte() {
        let (base, books) = serve().await;
        let data = upload_data();
        let client = client(RetryMiddleware::new(policy()));
        let response = client
            .put(format!("{base}/upload"))
            .body(reqwest::Body::wrap(streaming(&data, 10)))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let expected = (data.len(), checksum(&data));
        assert_eq!(*books.uploads.lock().unwrap(), vec![expected, expected]);
    }

    #[tokio::test]
    async fn does_not_retry_a_streaming_body_over_the_cap() {
        let (base, books) = serve().await;
        let data = upload_data();
        let client = client(RetryMiddleware::new(policy()).body_cap(4096));
        let response = client
            .put(format!("{base}/upload"))
            .body(reqwest::Body::wrap(streaming(&data, 10)))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 503);
        assert_eq!(books.uploads.lock().unwrap().len(), 1);
        let ended = response
            .extensions()
            .get::<retries_reqwest::Ended>()
            .unwrap();
        assert!(matches!(
            ended.lost(),
            Some(retries_reqwest::Lost::OverCap { cap: 4096, .. })
        ));
    }

    /// A body of bytes is in memory already: every attempt shares it, so
    /// the cap (a bound on memory held for replay) does not apply.
    #[tokio::test]
    async fn retries_a_body_of_bytes_over_the_cap_without_a_copy() {
        let (base, books) = serve().await;
        let data = upload_data();
        let client = client(RetryMiddleware::new(policy()).body_cap(4096));
        let response = client
            .put(format!("{base}/upload"))
            .body(data.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let expected = (data.len(), checksum(&data));
        assert_eq!(*books.uploads.lock().unwrap(), vec![expected, expected]);
    }

    #[tokio::test]
    async fn refused_connection_is_retried_then_reported() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let client = client(RetryMiddleware::new(policy()));
        let t0 = Instant::now();
        let err = client
            .post(format!("http://127.0.0.1:{port}/jobs"))
            .send()
            .await
            .unwrap_err();
        assert!(err.is_connect(), "{err}");
        // Three attempts, two 10 ms pauses.
        assert!(
            t0.elapsed() >= Duration::from_millis(20),
            "{:?}",
            t0.elapsed()
        );
    }
}

/// Tower services run in spawned tasks: every layer configuration the docs
/// show is `Send` there, `reconcile` included.
#[tokio::test]
async fn every_layer_configuration_runs_inside_tokio_spawn() {
    let (base, books) = serve().await;
    let lookup_client: Client<HttpConnector, Body> =
        Client::builder(TokioExecutor::new()).build_http();
    let lookup_base = base.clone();
    let reconciled = RetryLayer::new(policy())
        .send_key(HeaderName::from_static("x-call-key"))
        .reconcile(move |key, _parts| {
            let uri = format!("{lookup_base}/jobs/{key}");
            let client = lookup_client.clone();
            async move {
                let found = client.request(request("GET", &uri, full(""))).await?;
                Ok((found.status() == 200).then_some(found))
            }
        })
        .layer(hyper_client());
    let post = format!("{base}/jobs");
    let task = tokio::spawn(async move {
        let mut svc = reconciled;
        let response = svc
            .ready()
            .await
            .unwrap()
            .call(request("POST", &post, full("job")))
            .await
            .unwrap();
        response.status()
    });
    assert_eq!(
        task.await.unwrap(),
        200,
        "found by its key, in a spawned task"
    );
    assert_eq!(books.hits("jobs"), 1);

    let plain = RetryLayer::new(policy())
        .idempotent_with_header(HeaderName::from_static("idempotency-key"))
        .layer(hyper_client());
    let get = format!("{base}/busy/1/0");
    let task = tokio::spawn(async move {
        let mut svc = plain;
        svc.ready()
            .await
            .unwrap()
            .call(request("GET", &get, full("")))
            .await
            .unwrap()
            .status()
    });
    assert_eq!(task.await.unwrap(), 200);
}

/// The middleware has the layer's `send_key` and `concurrency`, from the
/// same shared setters.
mod middleware_parity {
    use super::*;
    use reqwest_middleware::ClientBuilder;
    use retries::limit::Concurrency;
    use retries_reqwest::RetryMiddleware;

    /// Echoes the `x-call-key` header it got (empty when none), after `ms`.
    async fn echo() -> (String, Arc<AtomicU32>) {
        let hits = Arc::new(AtomicU32::new(0));
        let seen = hits.clone();
        let app = Router::new().route(
            "/{ms}",
            post(move |Path(ms): Path<u64>, headers: HeaderMap| {
                let seen = seen.clone();
                async move {
                    seen.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    headers
                        .get("x-call-key")
                        .map(|v| v.to_str().unwrap().to_string())
                        .unwrap_or_default()
                }
            })
            .get(|headers: HeaderMap| async move {
                headers
                    .get("x-call-key")
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default()
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (format!("http://{addr}"), hits)
    }

    #[tokio::test]
    async fn send_key_puts_the_calls_key_on_a_non_idempotent_request() {
        let (base, _) = echo().await;
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(RetryMiddleware::new(policy()).send_key(HeaderName::from_static("x-call-key")))
            .build();
        let sent = client
            .post(format!("{base}/0"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            sent.parse::<retries::IdempotencyKey>().is_ok(),
            "a key: {sent:?}"
        );
        // A key the request carries is kept; an idempotent GET gets none.
        let own = client
            .post(format!("{base}/0"))
            .header("x-call-key", "mine")
            .send()
            .await
            .unwrap();
        assert_eq!(own.text().await.unwrap(), "mine");
        let get = client.get(format!("{base}/0")).send().await.unwrap();
        assert_eq!(get.text().await.unwrap(), "");
    }

    #[tokio::test]
    async fn concurrency_refuses_without_sending_when_no_slot_comes_free() {
        let (base, hits) = echo().await;
        let limit = Arc::new(Concurrency::new(1, Duration::from_millis(50)));
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(RetryMiddleware::new(policy()).concurrency(limit.clone()))
            .build();
        let slow = client.post(format!("{base}/300")).send();
        let refused = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            client.post(format!("{base}/0")).send().await
        };
        let (slow, refused) = tokio::join!(slow, refused);
        assert_eq!(slow.unwrap().status(), 200);
        let err = refused.expect_err("no slot within 50 ms");
        let stopped = match &err {
            reqwest_middleware::Error::Middleware(e) => {
                e.downcast_ref::<Stopped>().map(Stopped::reason)
            }
            reqwest_middleware::Error::Reqwest(_) => None,
        };
        assert_eq!(stopped, Some(Reason::Saturated), "{err}");
        assert_eq!(
            hits.load(Ordering::SeqCst),
            1,
            "the refused request was never sent"
        );
    }

    #[tokio::test]
    async fn reconcile_finds_an_unknown_post_by_the_key_it_sent() {
        // The POST creates the job, then its reply is lost (502: unknown);
        // the look-up by the key `send_key` put on the wire finds it, so
        // it is not created twice and the answer is the look-up's.
        let (base, books) = serve().await;
        let lookups = Arc::new(AtomicU32::new(0));
        let seen = lookups.clone();
        let lookup = reqwest::Client::new();
        let lookup_base = base.clone();
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(
                RetryMiddleware::new(policy())
                    .send_key(HeaderName::from_static("x-call-key"))
                    .reconcile(move |key, request: &reqwest::Request| {
                        assert_eq!(
                            request.headers()["x-call-key"].to_str().unwrap(),
                            key.to_string(),
                            "the key on the wire is the one looked up"
                        );
                        seen.fetch_add(1, Ordering::SeqCst);
                        let (client, url) = (lookup.clone(), format!("{lookup_base}/jobs/{key}"));
                        async move {
                            let found = client.get(url).send().await?;
                            Ok((found.status() == 200).then_some(found))
                        }
                    }),
            )
            .build();
        let response = client
            .post(format!("{base}/jobs"))
            .body("job")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "found by its key");
        assert_eq!(books.hits("jobs"), 1, "and not created twice");
        assert_eq!(lookups.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn retry_if_decides_which_responses_failed() {
        // `/jobs/{key}` answers 404 until the job exists: with `retry_if`
        // a 404 is "not yet" (not executed); the table alone would stop.
        let (base, books) = serve().await;
        let creator = books.clone();
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(RetryMiddleware::new(policy()).retry_if(|status, _| {
                (status == StatusCode::NOT_FOUND).then(retries::Verdict::not_executed)
            }))
            .build();
        let lookup = client.get(format!("{base}/jobs/late")).send();
        let create = async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            creator.jobs.lock().unwrap().insert("late".into(), 1);
        };
        let (response, ()) = tokio::join!(lookup, create);
        assert_eq!(response.unwrap().status(), 200);
        // And a status the table would retry is an answer once `retry_if`
        // says so: the 503 comes back after one attempt.
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(RetryMiddleware::new(policy()).retry_if(|_, _| None))
            .build();
        let response = client.get(format!("{base}/unknown")).send().await.unwrap();
        assert_eq!(response.status(), 503);
        assert_eq!(books.hits("unknown"), 1);
    }

    #[tokio::test]
    async fn idempotent_when_lets_a_post_be_retried() {
        // A POST is not idempotent by its method; `idempotent_when` says
        // this one is, so its unknown 502 is retried.
        let (base, books) = serve().await;
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(
                RetryMiddleware::new(policy())
                    .idempotent_when(|r: &reqwest::Request| r.url().path() == "/jobs"),
            )
            .build();
        post_job_retried_once(&client, &base, &books, "order-11").await;
    }

    #[tokio::test]
    async fn on_retry_sees_each_failed_attempt_on_both_doors() {
        // Two 503s with `Retry-After: 0`, then 200: the hook runs before
        // each of the two pauses, with the status, the verdict and the pause.
        type Log = Arc<Mutex<Vec<(u32, u16, Duration)>>>;
        fn record(
            log: &Log,
        ) -> impl Fn(&retries::RetryEvent<'_, retries_tower::FailedAttempt<'_>>) + Send + Sync + 'static
        {
            let log = log.clone();
            move |ev| {
                let status = match ev.error() {
                    Some(retries_tower::FailedAttempt::Response { status, .. }) => status.as_u16(),
                    other => panic!("a response, not {other:?}"),
                };
                assert!(ev.verdict().is_transient());
                log.lock().unwrap().push((ev.attempt(), status, ev.delay()));
            }
        }
        let (base, _) = serve().await;
        let middleware_log = Arc::new(Mutex::new(Vec::new()));
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(RetryMiddleware::new(policy()).on_retry(record(&middleware_log)))
            .build();
        let response = client.get(format!("{base}/busy/2/0")).send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(
            *middleware_log.lock().unwrap(),
            [(1, 503, Duration::ZERO), (2, 503, Duration::ZERO)]
        );

        let (base, _) = serve().await;
        let layer_log = Arc::new(Mutex::new(Vec::new()));
        let mut svc = RetryLayer::new(policy())
            .on_retry(record(&layer_log))
            .layer(hyper_client());
        let response = svc
            .ready()
            .await
            .unwrap()
            .call(request("GET", &format!("{base}/busy/2/0"), full("")))
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(*layer_log.lock().unwrap(), *middleware_log.lock().unwrap());

        // An error (a refused connection) is seen as an error.
        let refused = Arc::new(Mutex::new(Vec::<String>::new()));
        let seen = refused.clone();
        let mut svc = RetryLayer::new(policy().with_max_attempts(2))
            .on_retry(move |ev| {
                if let Some(retries_tower::FailedAttempt::Error(e)) = ev.error() {
                    seen.lock().unwrap().push(e.to_string());
                }
            })
            .layer(hyper_client());
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let _ = svc
            .ready()
            .await
            .unwrap()
            .call(request("GET", &format!("http://{closed}/"), full("")))
            .await;
        assert_eq!(refused.lock().unwrap().len(), 1, "{refused:?}");
    }
}
