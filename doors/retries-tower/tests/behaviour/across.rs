//! Across services over HTTP, with real axum servers and reqwest on
//! loopback: a chain client → A → B → store where every hop retries 3 times
//! (`#[retryable]`) makes 27 store calls per client call when each hop owns
//! its retries, and 3 behind `retries_tower::ServerLayer`, whose answers say
//! "I already retried; don't retry me". The caller's deadline travels in
//! `retries-timeout-ms` and bounds each hop; a request with too little time is
//! refused before its handler; hostile deadline headers are ignored.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use retries::http::{HttpError, check};
use retries::wire::{NO_RETRY, TIMEOUT_MS, timeout_value};
use retries_chaos::{Chaos, Fault, FaultLayer, Rule};

use retries::{Reason, retryable, scope};
use retries_tower::ServerLayer;

/// What the store and the hops saw.
#[derive(Default)]
struct Seen {
    /// The store's faults: every request it gets is counted there.
    store: OnceLock<Chaos>,
    /// `(hop, the scope's remaining time at the handler's entry)`.
    deadlines: Mutex<Vec<(&'static str, Option<Duration>)>>,
    handler_runs: AtomicU32,
}

impl Seen {
    /// Requests that reached the store.
    fn store_calls(&self) -> u32 {
        self.store.get().map_or(0, |c| c.report().requests as u32)
    }
}

/// One hop's call to the next, as a user writes it: three attempts, its
/// remaining time on the wire.
#[retryable(deadline = "5s", max_attempts = 3, idempotent, backoff = "constant", initial_backoff = "1ms",
            budget = "none", attempt = at)]
async fn forward(client: &reqwest::Client, url: &str) -> Result<String, HttpError> {
    let request = client
        .get(url)
        .header(TIMEOUT_MS, timeout_value(at.remaining()));
    Ok(check(request.send().await?)?.text().await?)
}

async fn listen(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/")
}

/// The store: down (503 without `Retry-After`: unknown, retried when idempotent).
async fn store(seen: Arc<Seen>) -> String {
    slow_store(seen, Duration::ZERO).await
}

/// The store, answering its 503 after `slow`: a fault layer that refuses
/// every request (after a delay) in front of a handler that never runs.
async fn slow_store(seen: Arc<Seen>, slow: Duration) -> String {
    // A second store of the same test counts with the first.
    let chaos = seen.store.get_or_init(|| {
        Chaos::builder()
            .rule(Rule::new(Fault::Delay(slow)))
            .rule(Rule::new(Fault::Refuse { retry_after: None }))
            .build()
            .unwrap()
    });
    let app = Router::new()
        // Never reached: a 200 here would show in every test.
        .route("/", get(|| async { StatusCode::OK }))
        .layer(FaultLayer::new(chaos.clone()));
    listen(app).await
}

/// A hop: its handler forwards to `next` and answers a plain 503 when that
/// fails (a handler that knows nothing of the marker).
async fn hop(
    name: &'static str,
    next: String,
    seen: Arc<Seen>,
    layer: Option<ServerLayer>,
) -> String {
    let client = reqwest::Client::new();
    let handler = move |State(seen): State<Arc<Seen>>| {
        let (client, next) = (client.clone(), next.clone());
        async move {
            seen.handler_runs.fetch_add(1, Ordering::SeqCst);
            seen.deadlines
                .lock()
                .unwrap()
                .push((name, scope::remaining()));
            match forward(&client, &next).await {
                Ok(body) => (StatusCode::OK, body),
                Err(_) => (StatusCode::SERVICE_UNAVAILABLE, String::new()),
            }
        }
    };
    let app = Router::new().route("/", get(handler)).with_state(seen);
    match layer {
        Some(layer) => listen(app.layer(layer)).await,
        None => listen(app).await,
    }
}

/// The store calls one client call makes through client → A → B → store.
async fn chain(layer: Option<ServerLayer>) -> (u32, Arc<Seen>, Result<String, HttpError>) {
    let seen = Arc::new(Seen::default());
    let store = store(seen.clone()).await;
    let b = hop("B", store, seen.clone(), layer).await;
    let a = hop("A", b, seen.clone(), layer).await;
    let answer = forward(&reqwest::Client::new(), &a).await;
    (seen.store_calls(), seen, answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hops_of_three_attempts_make_three_store_calls_not_27() {
    let (naive, _, answer) = chain(Some(ServerLayer::http().advise_no_retry(false))).await;
    assert_eq!(naive, 27, "each hop owning its retries multiplies them");
    assert!(answer.is_err());

    let (layered, seen, answer) = chain(Some(ServerLayer::http())).await;
    assert_eq!(layered, 3, "only the hop above the store retries");
    assert_eq!(
        seen.handler_runs.load(Ordering::SeqCst),
        2,
        "A and B ran once each"
    );
    // The client saw B's marker through A, and stopped at once.
    let err = answer.expect_err("the store is down");
    let status = match &err {
        HttpError::Status(s) => s.status(),
        other => panic!("a status error, not {other}"),
    };
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);

    let (without_layers, _, _) = chain(None).await;
    assert_eq!(
        without_layers, 27,
        "no layer: the same storm as with the marker off"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_hop_is_bounded_by_its_callers_time_less_the_reserve() {
    let reserve = Duration::from_millis(100);
    let (_, seen, _) = chain(Some(ServerLayer::http().reserve(reserve))).await;
    let deadlines = seen.deadlines.lock().unwrap().clone();
    let a = deadlines
        .iter()
        .find(|(h, _)| *h == "A")
        .and_then(|(_, d)| *d)
        .expect("A had a deadline");
    let b = deadlines
        .iter()
        .find(|(h, _)| *h == "B")
        .and_then(|(_, d)| *d)
        .expect("B had a deadline");
    // The client's call allows 5 s; A's scope is that less the reserve, and
    // B's is A's less the reserve again (and the time A spent before calling).
    assert!(a + reserve <= Duration::from_secs(5), "A: {a:?}");
    assert!(
        a + reserve + Duration::from_millis(500) > Duration::from_secs(5),
        "A: {a:?}"
    );
    assert!(b + reserve <= a, "B: {b:?} after A: {a:?}");
}

async fn probe(layer: ServerLayer) -> (String, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let app = Router::new()
        .route(
            "/",
            get(|State(seen): State<Arc<Seen>>| async move {
                seen.handler_runs.fetch_add(1, Ordering::SeqCst);
                let left = scope::remaining().map(|d| d.as_millis().to_string());
                left.unwrap_or_else(|| "none".into())
            }),
        )
        .with_state(seen.clone());
    (listen(app.layer(layer)).await, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_little_time_is_refused_before_the_handler_and_not_retried() {
    let layer = ServerLayer::http()
        .reserve(Duration::from_millis(20))
        .min_remaining(Duration::from_millis(50));
    let (url, seen) = probe(layer).await;
    let client = reqwest::Client::new();
    // 60 ms less a 20 ms reserve leaves 40 ms: below the 50 ms minimum.
    let refused = client
        .get(&url)
        .header(TIMEOUT_MS, "60")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        refused.headers().get(NO_RETRY).map(|v| v.to_str().unwrap()),
        Some("1")
    );
    assert_eq!(seen.handler_runs.load(Ordering::SeqCst), 0);
    // 200 ms: the handler runs with 180 ms at most.
    let ran = client
        .get(&url)
        .header(TIMEOUT_MS, "200")
        .send()
        .await
        .unwrap();
    let left: u64 = ran.text().await.unwrap().parse().unwrap();
    assert!((100..=180).contains(&left), "{left} ms");
    // A retried client stops on the refusal at once: one request, no retry.
    let before = seen.handler_runs.load(Ordering::SeqCst);
    let err = retries::call(&retries::Policy::new(Duration::from_millis(65)).with_max_attempts(5))
        .idempotent()
        .outcome_fn(|at: &retries::Attempt| {
            let request = client
                .get(&url)
                .header(TIMEOUT_MS, timeout_value(at.remaining()));
            async move { check(request.send().await?).map_err(HttpError::from) }
        })
        .await
        .expect_err("refused");
    assert_eq!((err.reason(), err.attempts()), (Reason::Permanent, 1));
    assert_eq!(seen.handler_runs.load(Ordering::SeqCst), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_deadline_headers_are_ignored_or_clamped() {
    let (url, _) = probe(ServerLayer::http()).await;
    let client = reqwest::Client::new();
    let left = async |headers: &[(&str, &str)]| {
        let mut request = client.get(&url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.send().await.unwrap().text().await.unwrap()
    };
    for hostile in ["-5", "1.5", "soon", "", "99999999999", "0x10", "+100"] {
        assert_eq!(left(&[(TIMEOUT_MS, hostile)]).await, "none", "{hostile:?}");
    }
    // Given twice: ambiguous, ignored.
    assert_eq!(
        left(&[(TIMEOUT_MS, "100"), (TIMEOUT_MS, "200")]).await,
        "none"
    );
    // Huge: clamped to a day.
    let huge: u128 = left(&[(TIMEOUT_MS, "9999999999")]).await.parse().unwrap();
    assert!(
        huge <= retries::wire::MAX_WIRE_TIMEOUT.as_millis() && huge > 86_000_000,
        "{huge}"
    );
    // Envoy's header is read too; the earlier of the two wins.
    let both: u64 = left(&[
        (TIMEOUT_MS, "5000"),
        ("x-envoy-expected-rq-timeout-ms", "300"),
    ])
    .await
    .parse()
    .unwrap();
    assert!((200..=300).contains(&both), "{both}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_owns_retries_makes_the_hops_defer_when_they_opt_in() {
    let seen = Arc::new(Seen::default());
    let store = store(seen.clone()).await;
    let b = hop(
        "B",
        store,
        seen.clone(),
        Some(ServerLayer::http().honour_caller_owns(true)),
    )
    .await;
    let client = reqwest::Client::new();
    let response = client
        .get(&b)
        .header(retries::wire::CALLER_OWNS, "1")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        seen.store_calls(),
        1,
        "B's call deferred to its caller: one attempt"
    );
    // A deferring call did not give up on its own: no marker, the caller decides.
    assert!(response.headers().get(NO_RETRY).is_none());
    // Without the opt-in, the header changes nothing.
    let plain = hop(
        "B",
        store_again(&seen).await,
        seen.clone(),
        Some(ServerLayer::http()),
    )
    .await;
    let _ = client
        .get(&plain)
        .header(retries::wire::CALLER_OWNS, "1")
        .send()
        .await
        .unwrap();
    assert_eq!(seen.store_calls(), 4);
}

async fn store_again(seen: &Arc<Seen>) -> String {
    store(seen.clone()).await
}

/// The caller leaves (its future dropped, no deadline on the wire) once B
/// is in its second of three attempts against a store that fails after
/// 150 ms: the connection (HTTP/1.1) or the stream (HTTP/2) closes, the
/// server drops B's handler, and with it B's retry loop: no store call
/// after the caller left.
async fn caller_leaves(client: reqwest::Client) {
    let seen = Arc::new(Seen::default());
    let store = slow_store(seen.clone(), Duration::from_millis(150)).await;
    let b = hop("B", store, seen.clone(), Some(ServerLayer::http())).await;
    // The caller leaves as soon as B's second attempt has reached the store
    // (150 ms before that attempt can end): on the count, not on a clock,
    // so a busy machine that slows B cannot make it leave during the first.
    let request = client.get(&b).send();
    let second = async {
        while seen.store_calls() < 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    let left = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::select! {
            biased;
            () = second => None,
            answer = request => Some(answer),
        }
    })
    .await
    .expect("B reached its second attempt");
    assert!(left.is_none(), "the caller left before an answer");
    let at_leave = seen.store_calls();
    assert_eq!(at_leave, 2, "B was in its second attempt");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        seen.store_calls(),
        at_leave,
        "no store call after the caller left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_leaves_stops_the_loop_beneath_it_over_http1() {
    caller_leaves(reqwest::Client::builder().http1_only().build().unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_leaves_stops_the_loop_beneath_it_over_http2() {
    caller_leaves(
        reqwest::Client::builder()
            .http2_prior_knowledge()
            .build()
            .unwrap(),
    )
    .await;
}

/// A server that records each request's `retries-timeout-ms` and answers
/// 503 with the marker.
async fn marked() -> (String, Arc<Mutex<Vec<Option<u64>>>>) {
    let sent = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new()
        .route(
            "/",
            get(
                |State(sent): State<Arc<Mutex<Vec<Option<u64>>>>>,
                 headers: axum::http::HeaderMap| async move {
                    let ms = headers
                        .get(TIMEOUT_MS)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse().ok());
                    sent.lock().unwrap().push(ms);
                    (StatusCode::SERVICE_UNAVAILABLE, [(NO_RETRY, "1")])
                },
            ),
        )
        .with_state(sent.clone());
    (listen(app).await, sent)
}

fn policy() -> retries::Policy {
    retries::Policy::new(Duration::from_secs(5))
        .with_max_attempts(3)
        .with_backoff(retries::Backoff::constant(Duration::from_millis(1)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_sends_its_time_left_and_stops_on_the_marker() {
    use http_body_util::{BodyExt, Empty};
    use tower::{Service, ServiceExt};
    type Body = http_body_util::combinators::BoxBody<bytes::Bytes, retries_tower::BoxError>;
    let (url, sent) = marked().await;
    let client: hyper_util::client::legacy::Client<_, retries_tower::ReplayBody<Body>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let mut svc = retries_tower::RetryLayer::new(policy()).layer(client);
    let get = |own: Option<&str>| {
        let mut request = http::Request::get(url.as_str());
        if let Some(own) = own {
            request = request.header(TIMEOUT_MS, own);
        }
        request
            .body(Empty::new().map_err(|e| match e {}).boxed())
            .unwrap()
    };
    let response = svc.ready().await.unwrap().call(get(None)).await.unwrap();
    assert_eq!(
        response.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "the server's answer"
    );
    let first = sent.lock().unwrap().clone();
    assert_eq!(first.len(), 1, "one request: the marker stops the call");
    let ms = first[0].expect("the header");
    assert!((4_000..=5_000).contains(&ms), "{ms}");
    // A request's own header shortens the call: what is sent is never more.
    let _ = svc
        .ready()
        .await
        .unwrap()
        .call(get(Some("120")))
        .await
        .unwrap();
    let ms = sent.lock().unwrap()[1].expect("the header");
    assert!(ms <= 120, "{ms}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_middleware_sends_its_time_left_and_stops_on_the_marker() {
    let (url, sent) = marked().await;
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(retries_reqwest::RetryMiddleware::new(policy()))
        .build();
    let response = client.get(&url).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let ms = {
        let sent = sent.lock().unwrap();
        assert_eq!(sent.len(), 1, "one request: the marker stops the call");
        sent[0].expect("the header")
    };
    assert!((4_000..=5_000).contains(&ms), "{ms}");
    let _ = client
        .get(&url)
        .header(TIMEOUT_MS, "80")
        .send()
        .await
        .unwrap();
    let ms = sent.lock().unwrap()[1].expect("the header");
    assert!(ms <= 80, "{ms}");
}
