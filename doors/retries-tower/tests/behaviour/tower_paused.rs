//! The tower layer on tokio's paused clock, over an in-process service: the
//! exact schedule of attempts, what each attempt carries on the wire
//! (`grpc-timeout`, `grpc-previous-rpc-attempts`), the per-layer budget shared
//! by every clone of the service, and the breaker under the loop.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, combinators::BoxBody};
use retries_tower::{BoxError, Idempotency};

use retries::{Backoff, CircuitBreaker, Policy, Reason, Stopped, TokenBucket};
use retries_tower::RetryLayer;
use tokio::time::Instant;
use tower::{Service, ServiceExt, service_fn};

type Body = BoxBody<Bytes, BoxError>;

fn empty() -> Body {
    Empty::new().map_err(|e| match e {}).boxed()
}

fn policy() -> Policy {
    Policy::new(Duration::from_secs(2))
        .with_max_attempts(3)
        .with_backoff(Backoff::constant(Duration::from_millis(100)))
}

/// What the inner service saw of each attempt: when, and the two headers.
type Seen = Arc<Mutex<Vec<(Duration, Option<String>, Option<String>)>>>;

/// An inner gRPC service answering trailers-only `UNAVAILABLE` to the first
/// `fails` requests, then OK.
fn grpc_service(
    fails: usize,
    seen: Seen,
) -> impl Service<
    Request<tonic::body::Body>,
    Response = Response<tonic::body::Body>,
    Error = BoxError,
    Future = impl Send,
> + Clone {
    let t0 = Instant::now();
    service_fn(move |r: Request<tonic::body::Body>| {
        let header = |name: &str| {
            r.headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_string())
        };
        let mut seen = seen.lock().unwrap();
        seen.push((
            t0.elapsed(),
            header("grpc-timeout"),
            header("grpc-previous-rpc-attempts"),
        ));
        let status = if seen.len() <= fails { "14" } else { "0" };
        let response = Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", status)
            .body(tonic::body::Body::empty())
            .unwrap();
        async move { Ok::<_, BoxError>(response) }
    })
}

#[tokio::test(start_paused = true)]
async fn each_attempt_carries_its_own_time_left_and_the_count_before_it() {
    let seen = Seen::default();
    let layer = RetryLayer::grpc(policy()).idempotent_methods(["/payments.Payments/Charge"]);
    let mut svc = layer.layer(grpc_service(2, seen.clone()));
    let request = Request::builder()
        .uri("http://payments/payments.Payments/Charge")
        .body(tonic::body::Body::empty())
        .unwrap();
    let t0 = Instant::now();
    let response = ServiceExt::<Request<tonic::body::Body>>::ready(&mut svc)
        .await
        .unwrap()
        .call(request)
        .await
        .unwrap();
    assert_eq!(response.headers()["grpc-status"], "0");
    assert_eq!(t0.elapsed(), Duration::from_millis(200));
    let s = |v: &str| Some(v.to_string());
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (Duration::ZERO, s("2000000u"), None),
            (Duration::from_millis(100), s("1900000u"), s("1")),
            (Duration::from_millis(200), s("1800000u"), s("2")),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_grpc_method_not_configured_is_not_idempotent() {
    let seen = Seen::default();
    let mut svc = RetryLayer::grpc(policy()).layer(grpc_service(2, seen.clone()));
    let request = || {
        Request::builder()
            .uri("http://payments/payments.Payments/Charge")
            .body(tonic::body::Body::empty())
            .unwrap()
    };
    let response = ServiceExt::<Request<tonic::body::Body>>::ready(&mut svc)
        .await
        .unwrap()
        .call(request())
        .await
        .unwrap();
    assert_eq!(
        response.headers()["grpc-status"],
        "14",
        "UNAVAILABLE: unknown, not replayed"
    );
    assert_eq!(seen.lock().unwrap().len(), 1);
    // The request itself may say it is safe to repeat.
    let mut r = request();
    r.extensions_mut().insert(Idempotency(true));
    let response = ServiceExt::<Request<tonic::body::Body>>::ready(&mut svc)
        .await
        .unwrap()
        .call(r)
        .await
        .unwrap();
    assert_eq!(response.headers()["grpc-status"], "0");
    assert_eq!(seen.lock().unwrap().len(), 3);
}

/// An inner HTTP service answering 503 (no `Retry-After`: unknown) always,
/// counting requests.
fn unavailable(
    count: Arc<Mutex<u32>>,
) -> impl Service<
    Request<retries_tower::ReplayBody<Body>>,
    Response = Response<Body>,
    Error = BoxError,
    Future = impl Send,
> + Clone {
    answering_503(count, &[])
}

/// An inner HTTP service answering 503 with `headers` always, counting
/// requests.
fn answering_503(
    count: Arc<Mutex<u32>>,
    headers: &'static [(&'static str, &'static str)],
) -> impl Service<
    Request<retries_tower::ReplayBody<Body>>,
    Response = Response<Body>,
    Error = BoxError,
    Future = impl Send,
> + Clone {
    service_fn(move |_r| {
        *count.lock().unwrap() += 1;
        let response = headers
            .iter()
            .fold(Response::builder().status(503), |b, (k, v)| {
                b.header(*k, *v)
            })
            .body(empty())
            .unwrap();
        async move { Ok::<_, BoxError>(response) }
    })
}

fn get() -> Request<Body> {
    Request::builder().uri("http://x/").body(empty()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn one_budget_per_layer_shared_by_every_clone() {
    let count = Arc::new(Mutex::new(0));
    // 4 tokens: retries are allowed while more than 2 are left.
    let layer = RetryLayer::new(policy()).budget(TokenBucket::new(4, 0.1));
    let mut a = layer.layer(unavailable(count.clone()));
    let mut b = a.clone();
    a.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(
        *count.lock().unwrap(),
        2,
        "4 → 3 → 2 tokens: the second retry is refused"
    );
    b.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(
        *count.lock().unwrap(),
        3,
        "the clone sees the same bucket: no retry"
    );
}

#[tokio::test(start_paused = true)]
async fn the_breaker_sits_under_the_loop() {
    static BREAKER: CircuitBreaker = CircuitBreaker::new(4, Duration::from_secs(30));
    let count = Arc::new(Mutex::new(0));
    let mut svc = RetryLayer::new(policy())
        .budget(retries::NoBudget)
        .breaker(&BREAKER)
        .layer(unavailable(count.clone()));
    let response = svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(*count.lock().unwrap(), 3);
    // The fourth failure opens it; then no request is sent at all.
    let err = svc.ready().await.unwrap().call(get()).await.unwrap_err();
    assert_eq!(*count.lock().unwrap(), 4);
    assert_eq!(
        err.downcast::<Stopped>().unwrap().reason(),
        Reason::CircuitOpen
    );
    let err = svc.ready().await.unwrap().call(get()).await.unwrap_err();
    assert_eq!(*count.lock().unwrap(), 4);
    assert_eq!(
        err.downcast::<Stopped>().unwrap().reason(),
        Reason::CircuitOpen
    );
}

#[tokio::test(start_paused = true)]
async fn the_deadline_covers_every_attempt_and_pause() {
    let count = Arc::new(Mutex::new(0));
    let policy = Policy::new(Duration::from_millis(250))
        .with_max_attempts(10)
        .with_backoff(Backoff::constant(Duration::from_millis(100)));
    let mut svc = RetryLayer::new(policy)
        .budget(retries::NoBudget)
        .layer(unavailable(count.clone()));
    let t0 = Instant::now();
    let response = svc.ready().await.unwrap().call(get()).await.unwrap();
    // Attempts at 0, 100, 200 ms; a third pause would end at 300 > 250 ms:
    // the call stops at once instead of sleeping, before the deadline, with
    // the last response as it came.
    assert_eq!(response.status(), 503);
    assert_eq!(*count.lock().unwrap(), 3);
    assert_eq!(t0.elapsed(), Duration::from_millis(200));
}

/// A request whose propagated deadline has passed (`retries-timeout-ms:
/// 0`, the caller's time used up on the way) is not sent: the layer stops
/// with `DeadlineExceeded` before its first attempt.
#[tokio::test(start_paused = true)]
async fn a_request_whose_deadline_has_passed_is_not_sent() {
    let count = Arc::new(Mutex::new(0));
    let mut svc = RetryLayer::new(policy())
        .budget(retries::NoBudget)
        .layer(unavailable(count.clone()));
    let request = Request::builder()
        .uri("http://x/")
        .header("retries-timeout-ms", "0")
        .body(empty())
        .unwrap();
    let err = svc.ready().await.unwrap().call(request).await.unwrap_err();
    let stopped = err.downcast::<Stopped>().unwrap();
    assert_eq!(stopped.reason(), Reason::DeadlineExceeded);
    assert_eq!(stopped.attempts(), 0);
    assert_eq!(*count.lock().unwrap(), 0, "nothing sent");
}

#[tokio::test(start_paused = true)]
async fn the_layer_limits_requests_in_progress() {
    // One slot, 50 ms of waiting: while a 200 ms request holds the slot
    // (through the layer's clones), a second one waits 50 ms and fails
    // `Saturated` without reaching the inner service; a third, after the
    // first ended, takes the slot at once.
    let count = Arc::new(Mutex::new(0u32));
    let c = Arc::clone(&count);
    let inner = service_fn(move |_r: Request<retries_tower::ReplayBody<Body>>| {
        *c.lock().unwrap() += 1;
        async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok::<_, BoxError>(Response::new(empty()))
        }
    });
    let layer = RetryLayer::new(policy()).concurrency(retries::limit::Concurrency::new(
        1,
        Duration::from_millis(50),
    ));
    let mut a = layer.layer(inner);
    let mut b = a.clone();
    let t0 = Instant::now();
    let first = a.ready().await.unwrap().call(get());
    let second = async {
        tokio::task::yield_now().await;
        let r = b.ready().await.unwrap().call(get()).await;
        (r, t0.elapsed())
    };
    let (first, (second, refused_at)) = tokio::join!(first, second);
    assert_eq!(first.unwrap().status(), 200);
    let err = second.unwrap_err();
    assert_eq!(
        err.downcast::<Stopped>().unwrap().reason(),
        Reason::Saturated
    );
    assert_eq!(refused_at, Duration::from_millis(50));
    assert_eq!(
        *count.lock().unwrap(),
        1,
        "the refused request was not sent"
    );
    let mut c2 = a.clone();
    let t1 = Instant::now();
    c2.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(t1.elapsed(), Duration::from_millis(200));
    assert_eq!(*count.lock().unwrap(), 2);
}

/// An inner gRPC service answering a trailers-only `UNAVAILABLE` with the
/// marker `retries-no-retry: 1`, counting requests.
fn marked_grpc(
    count: Arc<Mutex<u32>>,
) -> impl Service<
    Request<tonic::body::Body>,
    Response = Response<tonic::body::Body>,
    Error = BoxError,
    Future = impl Send,
> + Clone {
    service_fn(move |_r: Request<tonic::body::Body>| {
        *count.lock().unwrap() += 1;
        let response = Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", "14")
            .header("retries-no-retry", "1")
            .body(tonic::body::Body::empty())
            .unwrap();
        async move { Ok::<_, BoxError>(response) }
    })
}

/// `retry_if` decides which responses are failed attempts; the marker
/// `retries-no-retry` (a server that already retried below, or refused for
/// want of time) still stops the call, on HTTP and gRPC alike: one request,
/// the marked response as the answer.
#[tokio::test(start_paused = true)]
async fn the_marker_is_honoured_before_retry_if() {
    let always = |_: http::StatusCode, _: &http::HeaderMap| Some(retries::Verdict::not_executed());
    let request = || {
        Request::builder()
            .uri("http://x/payments.Payments/Charge")
            .body(empty())
            .unwrap()
    };
    let count = Arc::new(Mutex::new(0));
    let mut svc = RetryLayer::new(policy())
        .budget(retries::NoBudget)
        .retry_if(always)
        .layer(answering_503(count.clone(), &[("retries-no-retry", "1")]));
    let response = svc.ready().await.unwrap().call(request()).await.unwrap();
    assert_eq!(*count.lock().unwrap(), 1, "HTTP: not retried");
    assert_eq!(response.status(), 503);

    let count = Arc::new(Mutex::new(0));
    let mut svc = RetryLayer::grpc(policy())
        .budget(retries::NoBudget)
        .retry_if(always)
        .layer(marked_grpc(count.clone()));
    let grpc_request = Request::builder()
        .uri("http://x/payments.Payments/Charge")
        .body(tonic::body::Body::empty())
        .unwrap();
    let response = ServiceExt::<Request<tonic::body::Body>>::ready(&mut svc)
        .await
        .unwrap()
        .call(grpc_request)
        .await
        .unwrap();
    assert_eq!(*count.lock().unwrap(), 1, "gRPC: not retried");
    assert_eq!(response.headers()["grpc-status"], "14");
}

/// The layer's `rate_limit`: every attempt through it (every clone, retries
/// included) draws a start; a request whose start is too late for its
/// deadline fails at once, unsent, `Reason::RateLimited`.
#[tokio::test(start_paused = true)]
async fn the_layers_rate_limit_spaces_every_attempt() {
    // 5 starts a second, no burst. The inner service answers 503 to the
    // first request (retried after the policy's 100 ms pause, which ends
    // before its start at 200 ms), then 200.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let inner_seen = Arc::clone(&seen);
    let t0 = Instant::now();
    let inner = service_fn(move |_r: Request<retries_tower::ReplayBody<Body>>| {
        let n = {
            let mut seen = inner_seen.lock().unwrap();
            seen.push(t0.elapsed());
            seen.len()
        };
        async move {
            let status = if n == 1 { 503 } else { 200 };
            Ok::<_, BoxError>(Response::builder().status(status).body(empty()).unwrap())
        }
    });
    let rate = Arc::new(retries::limit::RateLimit::new(5, Duration::from_secs(1), 1));
    let layer = RetryLayer::new(policy()).rate_limit(Arc::clone(&rate));
    let mut first = layer.layer(inner);
    let mut second = first.clone();
    first.ready().await.unwrap().call(get()).await.unwrap();
    second.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        [
            Duration::ZERO,
            Duration::from_millis(200),
            Duration::from_millis(400)
        ]
    );
    // A request with 100 ms left cannot have the next start (at 600 ms).
    let mut third = first.clone();
    let short = RetryLayer::new(Policy::new(Duration::from_millis(100))).rate_limit(rate);
    let mut hurried = short.layer(service_fn(
        |_r: Request<retries_tower::ReplayBody<Body>>| async {
            Ok::<_, BoxError>(Response::new(empty()))
        },
    ));
    let t1 = Instant::now();
    let err = hurried
        .ready()
        .await
        .unwrap()
        .call(get())
        .await
        .unwrap_err();
    assert_eq!(
        err.downcast::<Stopped>().unwrap().reason(),
        Reason::RateLimited
    );
    assert_eq!(t1.elapsed(), Duration::ZERO);
    // The refusal took nothing: the next start through the first layer is
    // at 600 ms.
    third.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(
        seen.lock().unwrap().last(),
        Some(&Duration::from_millis(600))
    );
}

/// The layer's `rate_limit_by`: each tenant (its `x-tenant` header) draws
/// from a limit of its own; a request without the header from none.
#[tokio::test(start_paused = true)]
async fn the_layers_keyed_rate_limit_spaces_each_tenant_apart() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let inner_seen = Arc::clone(&seen);
    let t0 = Instant::now();
    let inner = service_fn(move |r: Request<retries_tower::ReplayBody<Body>>| {
        let tenant = r
            .headers()
            .get("x-tenant")
            .map_or("-".to_string(), |v| v.to_str().unwrap().to_string());
        inner_seen.lock().unwrap().push((tenant, t0.elapsed()));
        async move { Ok::<_, BoxError>(Response::new(empty())) }
    });
    // One start a second per tenant.
    let per_tenant = retries::limit::RateLimits::new(1, Duration::from_secs(1), 1, 100);
    let mut svc = RetryLayer::new(policy())
        .rate_limit_by(per_tenant, |r| r.header("x-tenant").map(str::to_owned))
        .layer(inner);
    let for_tenant = |t: Option<&str>| {
        let mut b = Request::builder().uri("http://x/");
        if let Some(t) = t {
            b = b.header("x-tenant", t);
        }
        b.body(empty()).unwrap()
    };
    for t in [Some("a"), Some("b"), Some("a"), None, None, Some("b")] {
        svc.ready()
            .await
            .unwrap()
            .call(for_tenant(t))
            .await
            .unwrap();
    }
    let ms = |t: &str, n: u64| (t.to_string(), Duration::from_millis(n));
    assert_eq!(
        *seen.lock().unwrap(),
        [
            ms("a", 0),
            ms("b", 0),
            ms("a", 1000),
            ms("-", 1000),
            ms("-", 1000),
            // b's next start was due at 1 s: it is past.
            ms("b", 1000),
        ]
    );
}
