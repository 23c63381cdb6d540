//! The server half of exactly-once with the in-process store: an axum
//! `POST /charges` behind `retries_tower::dedup::IdempotencyLayer` on
//! loopback, each rule of the IETF draft through a real client, the client
//! doors' `idempotent_by_key` against it (under `FaultLayer` dropping
//! replies after the charge), and the store's lease and retention on the
//! paused clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use retries::{Backoff, Policy};
use retries_tower::ReplayBody;
use retries_tower::RetryLayer;
use retries_tower::dedup::IdempotencyLayer;
use retries_tower::dedup::{Claim, Completed, Fingerprint, Key, MemoryStore, Store, Stored, Terms};
use tower::ServiceExt;

/// The charges made, by key; how long a charge takes; what it answers.
#[derive(Default)]
struct Bank {
    charges: std::sync::Mutex<Vec<String>>,
    calls: AtomicU32,
    slow: std::sync::Mutex<Duration>,
    /// Answer 503 to the next this-many calls, before charging.
    refuse: AtomicU32,
}

async fn charge(
    State(bank): State<Arc<Bank>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let n = bank.calls.fetch_add(1, Ordering::SeqCst);
    if bank
        .refuse
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |r| r.checked_sub(1))
        .is_ok()
    {
        return (StatusCode::SERVICE_UNAVAILABLE, "busy".into());
    }
    let slow = *bank.slow.lock().unwrap();
    tokio::time::sleep(slow).await;
    let key = headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    bank.charges.lock().unwrap().push(key);
    (
        StatusCode::CREATED,
        format!("receipt-{n} for {}", String::from_utf8_lossy(&body)),
    )
}

fn app(bank: &Arc<Bank>, keys: IdempotencyLayer<MemoryStore>) -> Router {
    Router::new()
        .route("/charges", post(charge).get(|| async { "ok" }))
        .layer(keys)
        .with_state(Arc::clone(bank))
}

async fn serve(app: Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn tenant(parts: &http::request::Parts) -> String {
    parts
        .headers
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// One POST, no retry layer: status, headers, body.
async fn post_once(
    addr: std::net::SocketAddr,
    headers: &[(&str, &str)],
    body: &'static str,
) -> (StatusCode, HeaderMap, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = http::Request::post(format!("http://{addr}/charges"));
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = client
        .request(
            request
                .body(Full::new(Bytes::from_static(body.as_bytes())))
                .unwrap(),
        )
        .await
        .unwrap();
    let (head, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (
        head.status,
        head.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

#[tokio::test]
async fn a_key_runs_once_and_every_later_request_gets_its_answer() {
    let bank = Arc::new(Bank::default());
    let addr = serve(app(&bank, IdempotencyLayer::new(MemoryStore::new()))).await;
    let key = [("idempotency-key", "\"k-1\"")];
    let (s1, h1, b1) = post_once(addr, &key, "100").await;
    assert_eq!(s1, StatusCode::CREATED);
    assert!(h1.get("idempotent-replayed").is_none());
    for _ in 0..3 {
        let (s, h, b) = post_once(addr, &key, "100").await;
        assert_eq!((s, b.as_str()), (s1, b1.as_str()));
        assert_eq!(h["idempotent-replayed"], "true");
        assert_eq!(h["content-type"], h1["content-type"]);
    }
    assert_eq!(bank.charges.lock().unwrap().len(), 1);
    // The same key bare (not quoted) is the same key.
    let (s, h, _) = post_once(addr, &[("idempotency-key", "k-1")], "100").await;
    assert_eq!(
        (s, h["idempotent-replayed"].to_str().unwrap()),
        (s1, "true")
    );
    // Without a key, no record: each POST runs.
    post_once(addr, &[], "100").await;
    post_once(addr, &[], "100").await;
    assert_eq!(bank.charges.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn a_reused_key_is_422_a_missing_one_400_and_a_bad_one_400() {
    let bank = Arc::new(Bank::default());
    let addr = serve(app(
        &bank,
        IdempotencyLayer::new(MemoryStore::new()).required(),
    ))
    .await;
    let key = [("idempotency-key", "k-2")];
    assert_eq!(post_once(addr, &key, "100").await.0, StatusCode::CREATED);
    let (status, headers, body) = post_once(addr, &key, "999").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(headers["content-type"], "application/problem+json");
    assert!(body.contains("\"status\":422"), "{body}");
    let (status, _, _) = post_once(addr, &[], "100").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _, _) = post_once(addr, &[("idempotency-key", "\"\"")], "100").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(bank.charges.lock().unwrap().len(), 1);
    // A GET needs no key.
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let get = client
        .get(format!("http://{addr}/charges").parse().unwrap())
        .await
        .unwrap();
    assert_eq!(get.status(), StatusCode::OK);
}

#[tokio::test]
async fn keys_are_scoped_by_principal() {
    let bank = Arc::new(Bank::default());
    let layer = IdempotencyLayer::new(MemoryStore::new()).principal(tenant);
    let addr = serve(app(&bank, layer)).await;
    let a = [("idempotency-key", "same"), ("x-tenant", "acme")];
    let b = [("idempotency-key", "same"), ("x-tenant", "globex")];
    let (_, ha, ba) = post_once(addr, &a, "1").await;
    let (_, hb, bb) = post_once(addr, &b, "1").await;
    assert!(ha.get("idempotent-replayed").is_none() && hb.get("idempotent-replayed").is_none());
    assert_ne!(ba, bb, "globex was answered with acme's record");
    assert_eq!(bank.charges.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn a_duplicate_while_the_first_runs_is_409_until_the_holders_next_renewal() {
    let bank = Arc::new(Bank::default());
    *bank.slow.lock().unwrap() = Duration::from_millis(600);
    let layer = IdempotencyLayer::new(MemoryStore::new()).lease(Duration::from_secs(5));
    let addr = serve(app(&bank, layer)).await;
    let first = tokio::spawn(post_once(addr, &[("idempotency-key", "k-3")], "1"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, headers, _) = post_once(addr, &[("idempotency-key", "k-3")], "1").await;
    assert_eq!(status, StatusCode::CONFLICT);
    // Not the lease's 4.8 s left: the holder renews a third of the lease
    // (1.67 s) after its claim, due in about 1.47 s: `Retry-After: 2`.
    let secs: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&secs), "{secs}");
    assert_eq!(first.await.unwrap().0, StatusCode::CREATED);
    assert_eq!(bank.charges.lock().unwrap().len(), 1);
}

/// A handler slower than the lease keeps its key: the layer renews the
/// claim while it runs, so a duplicate at twice the lease gets 409, not a
/// second run.
#[tokio::test]
async fn a_handler_slower_than_its_lease_keeps_its_key() {
    let bank = Arc::new(Bank::default());
    *bank.slow.lock().unwrap() = Duration::from_millis(900);
    let layer = IdempotencyLayer::new(MemoryStore::new()).lease(Duration::from_millis(300));
    let addr = serve(app(&bank, layer)).await;
    let first = tokio::spawn(post_once(addr, &[("idempotency-key", "k-7")], "1"));
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (status, _, _) = post_once(addr, &[("idempotency-key", "k-7")], "1").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(first.await.unwrap().0, StatusCode::CREATED);
    let (status, headers, _) = post_once(addr, &[("idempotency-key", "k-7")], "1").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(bank.charges.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_refusal_is_not_recorded_and_the_key_runs_again() {
    let bank = Arc::new(Bank::default());
    bank.refuse.store(1, Ordering::SeqCst);
    let addr = serve(app(&bank, IdempotencyLayer::new(MemoryStore::new()))).await;
    let key = [("idempotency-key", "k-4")];
    assert_eq!(
        post_once(addr, &key, "1").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let (status, headers, _) = post_once(addr, &key, "1").await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(headers.get("idempotent-replayed").is_none());
    assert_eq!(bank.charges.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_client_that_leaves_does_not_cut_the_handler_off_before_its_record() {
    let bank = Arc::new(Bank::default());
    *bank.slow.lock().unwrap() = Duration::from_millis(300);
    let addr = serve(app(&bank, IdempotencyLayer::new(MemoryStore::new()))).await;
    let key = [("idempotency-key", "k-5")];
    // The client gives up after 50 ms: its connection closes mid-handler.
    let left = tokio::time::timeout(Duration::from_millis(50), post_once(addr, &key, "1")).await;
    assert!(left.is_err());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, headers, _) = post_once(addr, &key, "1").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(bank.charges.lock().unwrap().len(), 1);
}

type Inner = Client<HttpConnector, ReplayBody<Full<Bytes>>>;

/// The bank behind the layer (in-process store) behind `FaultLayer`
/// dropping 30 % of replies after the charge, seeded.
async fn serve_losing_replies(
    seed: u64,
) -> (Arc<Bank>, std::net::SocketAddr, retries_chaos::Chaos) {
    use retries_chaos::{Chaos, Fault, FaultLayer, Rule};
    let bank = Arc::new(Bank::default());
    let chaos = Chaos::builder()
        .seed(seed)
        .rule(Rule::new(Fault::DropReply).rate(0.3))
        .build()
        .unwrap();
    let app =
        app(&bank, IdempotencyLayer::new(MemoryStore::new())).layer(FaultLayer::new(chaos.clone()));
    (bank, serve(app).await, chaos)
}

fn retrying() -> Policy {
    Policy::new(Duration::from_secs(10))
        .with_max_attempts(6)
        .with_backoff(Backoff::constant(Duration::from_millis(5)))
}

/// 100 charges through the tower layer, `idempotent_by_key`, against the
/// server behind `FaultLayer` dropping 30 % of replies after the charge:
/// every call ok, every charge once, the lost replies answered by replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_by_key_over_lost_replies_charges_each_call_once() {
    let (bank, addr, chaos) = serve_losing_replies(47).await;
    let client: Inner = Client::builder(TokioExecutor::new()).build_http();
    let replays = Arc::new(AtomicU32::new(0));
    let svc = RetryLayer::new(retrying())
        .budget(retries::NoBudget)
        .idempotent_by_key(http::HeaderName::from_static("idempotency-key"))
        .layer(client);
    // The route proves it deduplicates by its first answer (the mark
    // `retries-deduplicated`); until then a lost reply ends unknown, never
    // resent (`retries_http::proof`).
    let mut proving = 0;
    loop {
        proving += 1;
        let request = http::Request::post(format!("http://{addr}/charges"))
            .body(Full::new(Bytes::from(format!("proof {proving}"))))
            .unwrap();
        if svc.clone().oneshot(request).await.is_ok() {
            break;
        }
    }
    let mut ok = 0;
    for i in 0..100 {
        let request = http::Request::post(format!("http://{addr}/charges"))
            .body(Full::new(Bytes::from(format!("{i}"))))
            .unwrap();
        let response = svc.clone().oneshot(request).await.unwrap();
        if response.headers().contains_key("idempotent-replayed") {
            replays.fetch_add(1, Ordering::Relaxed);
        }
        ok += u32::from(response.status() == StatusCode::CREATED);
    }
    let charges = bank.charges.lock().unwrap().clone();
    let mut keys = charges.clone();
    keys.sort();
    keys.dedup();
    assert_eq!(ok, 100);
    assert_eq!(charges.len(), keys.len(), "a key charged twice");
    assert_eq!(
        charges.len(),
        100 + proving,
        "{proving} calls to prove the route"
    );
    let replayed = replays.load(Ordering::Relaxed);
    assert!(replayed >= 10, "{replayed} replays for 30 % lost replies");
    // Without the layer the same client would have charged each lost reply
    // again: the chaos counts say how many replies were lost.
    assert!(chaos.report().injected(retries_chaos::FaultKind::DropReply) >= u64::from(replayed));
}

/// A 409 "in progress" is waited out as not executed: the first attempt
/// is cut by its attempt timeout while the handler runs; the second meets
/// the claim and waits its `Retry-After`; the third gets the replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_409_in_progress_is_waited_out_and_the_replay_is_the_answer() {
    let bank = Arc::new(Bank::default());
    let layer = IdempotencyLayer::new(MemoryStore::new()).lease(Duration::from_secs(1));
    let addr = serve(app(&bank, layer)).await;
    let client: Inner = Client::builder(TokioExecutor::new()).build_http();
    let statuses = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&statuses);
    let policy = Policy::new(Duration::from_secs(10))
        .with_max_attempts(5)
        .with_attempt_timeout(Duration::from_millis(100))
        .with_backoff(Backoff::constant(Duration::from_millis(10)));
    let svc = RetryLayer::new(policy)
        .budget(retries::NoBudget)
        .idempotent_by_key(http::HeaderName::from_static("idempotency-key"))
        .on_retry(move |ev| {
            let what = match ev.error() {
                Some(retries_tower::FailedAttempt::Response { status, .. }) => status.as_u16(),
                _ => 0,
            };
            seen.lock().unwrap().push((what, ev.delay()));
        })
        .layer(client);
    // One answer proves the route deduplicates (`retries_http::proof`):
    // without it, the cut first attempt would end the call unknown.
    let request = http::Request::post(format!("http://{addr}/charges"))
        .body(Full::new(Bytes::from_static(b"6")))
        .unwrap();
    assert_eq!(
        svc.clone().oneshot(request).await.unwrap().status(),
        StatusCode::CREATED
    );
    statuses.lock().unwrap().clear();
    *bank.slow.lock().unwrap() = Duration::from_millis(400);
    let request = http::Request::post(format!("http://{addr}/charges"))
        .body(Full::new(Bytes::from_static(b"7")))
        .unwrap();
    let t0 = std::time::Instant::now();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(response.headers()["idempotent-replayed"], "true");
    assert_eq!(bank.charges.lock().unwrap().len(), 2);
    let statuses = statuses.lock().unwrap().clone();
    // The cut attempt (no response), then the 409 with its 1 s pause.
    assert_eq!(statuses[0].0, 0, "{statuses:?}");
    assert_eq!(statuses[1], (409, Duration::from_secs(1)), "{statuses:?}");
    assert!(t0.elapsed() >= Duration::from_secs(1));
}

/// The store's lease and retention, on the paused clock.
#[tokio::test(start_paused = true)]
async fn a_lease_run_out_passes_the_key_on_and_a_record_expires_after_its_retention() {
    let store = MemoryStore::new();
    let terms = Terms {
        lease: Duration::from_secs(2),
        retention: Duration::from_mins(1),
    };
    let fp = Fingerprint::of("POST", "/charges", b"1");
    let key = Key {
        principal: "acme",
        key: "k",
        fingerprint: &fp,
    };
    let Claim::Run(first) = store.claim(key, terms).await.unwrap() else {
        panic!("a new key runs")
    };
    tokio::time::advance(Duration::from_millis(1500)).await;
    assert_eq!(
        store.claim(key, terms).await.unwrap(),
        Claim::InProgress {
            retry_after: Duration::from_millis(500)
        }
    );
    // Another request under the key while it runs: 422, not 409.
    let other = Fingerprint::of("POST", "/charges", b"2");
    let reused = Key {
        fingerprint: &other,
        ..key
    };
    assert_eq!(store.claim(reused, terms).await.unwrap(), Claim::Mismatch);
    tokio::time::advance(Duration::from_millis(600)).await;
    let Claim::Run(second) = store.claim(key, terms).await.unwrap() else {
        panic!("a lease run out passes the key on")
    };
    let answer = Stored {
        status: 201,
        headers: vec![],
        body: b"receipt".to_vec(),
        trailers: vec![],
        body_dropped: false,
    };
    // The first run lost its lease: it stores nothing.
    assert_eq!(
        store.complete(key, first, &answer, terms).await.unwrap(),
        Completed::NotHeld
    );
    assert_eq!(
        store.complete(key, second, &answer, terms).await.unwrap(),
        Completed::Stored
    );
    assert_eq!(
        store.claim(key, terms).await.unwrap(),
        Claim::Answered(answer)
    );
    tokio::time::advance(Duration::from_secs(59)).await;
    assert_eq!(store.collect().await.unwrap(), 0);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(store.collect().await.unwrap(), 1);
    assert!(matches!(
        store.claim(key, terms).await.unwrap(),
        Claim::Run(_)
    ));
}

/// The reqwest middleware, `idempotent_by_key`, against the same server
/// behind `FaultLayer` dropping 30 % of replies: each call charged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reqwest_middleware_idempotent_by_key_charges_each_call_once() {
    use retries_reqwest::RetryMiddleware;
    let (bank, addr, chaos) = serve_losing_replies(4748).await;
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(
            RetryMiddleware::new(retrying())
                .budget(retries::NoBudget)
                .idempotent_by_key(http::HeaderName::from_static("idempotency-key")),
        )
        .build();
    // Proven by the route's first answer, as in the layer's test above.
    let mut proving = 0;
    loop {
        proving += 1;
        let sent = client
            .post(format!("http://{addr}/charges"))
            .body(format!("proof {proving}"));
        if sent.send().await.is_ok() {
            break;
        }
    }
    let mut replays = 0;
    for i in 0..60 {
        let response = client
            .post(format!("http://{addr}/charges"))
            .body(format!("{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
        replays += usize::from(response.headers().contains_key("idempotent-replayed"));
    }
    let mut keys = bank.charges.lock().unwrap().clone();
    keys.sort();
    keys.dedup();
    assert_eq!(
        (bank.charges.lock().unwrap().len(), keys.len()),
        (60 + proving, 60 + proving)
    );
    assert!(replays >= 5, "{replays}");
    assert!(chaos.report().observed(retries_chaos::FaultKind::DropReply) >= 5);
}

/// The caps: a body over the request cap is 413 (and runs nothing); an
/// answer over the response cap is returned whole the first time and
/// replayed without its body, marked.
#[tokio::test]
async fn over_the_caps_413_and_a_record_without_its_body() {
    let bank = Arc::new(Bank::default());
    let layer = IdempotencyLayer::new(MemoryStore::new())
        .request_cap(8)
        .response_cap(4);
    let addr = serve(app(&bank, layer)).await;
    let (status, _, _) = post_once(addr, &[("idempotency-key", "big")], "123456789").await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(bank.calls.load(Ordering::SeqCst), 0);
    let key = [("idempotency-key", "k-6")];
    let (status, _, body) = post_once(addr, &key, "12").await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(body.starts_with("receipt-"), "{body}");
    let (status, headers, body) = post_once(addr, &key, "12").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["idempotent-replayed"], "body-dropped");
    assert_eq!(body, "");
    assert_eq!(bank.charges.lock().unwrap().len(), 1);
}

/// A handler that needs the claim takes `Claimed` as its extractor: a POST
/// without a key, on a layer that does not require one, reaches it and is
/// answered the layer's 400 for a missing key, never a 500; with a key it
/// runs.
#[tokio::test]
async fn a_keyless_request_to_a_handler_that_needs_the_claim_is_400() {
    use retries_tower::dedup::Claimed;
    async fn needs_claim(claim: Claimed) -> (StatusCode, String) {
        (StatusCode::CREATED, format!("ran {}", claim.key().key))
    }
    let app = Router::new()
        .route("/charges", post(needs_claim))
        .layer(IdempotencyLayer::new(MemoryStore::new()));
    let addr = serve(app).await;
    let (status, headers, body) = post_once(addr, &[], "100").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(headers["content-type"], "application/problem+json");
    assert!(body.contains("Idempotency-Key is missing"), "{body}");
    let (status, headers, body) = post_once(addr, &[("idempotency-key", "k-7")], "100").await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, "ran k-7"));
    assert_eq!(headers["retries-deduplicated"], "1");
}

/// `FaultLayer` inside `IdempotencyLayer`: the faults before the work
/// (a refusal) still apply and compose (the key is released and runs on
/// the retry), the faults after the work are not injected on keyed
/// requests (a lost reply there would read as a failed handler, 500): every
/// call ok, each key charged once, no 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_layer_inside_the_idempotency_layer_composes() {
    use retries_chaos::{Chaos, Fault, FaultKind, FaultLayer, Rule};
    let bank = Arc::new(Bank::default());
    let chaos = Chaos::builder()
        .seed(59)
        .rule(Rule::new(Fault::DropReply).rate(0.3))
        .rule(Rule::new(Fault::Refuse { retry_after: None }).rate(0.2))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/charges", post(charge))
        .layer(FaultLayer::new(chaos.clone()))
        .layer(IdempotencyLayer::new(MemoryStore::new()))
        .with_state(Arc::clone(&bank));
    let addr = serve(app).await;
    let client: Inner = Client::builder(TokioExecutor::new()).build_http();
    let svc = RetryLayer::new(retrying())
        .budget(retries::NoBudget)
        .idempotent_by_key(http::HeaderName::from_static("idempotency-key"))
        .layer(client);
    for i in 0..60 {
        let request = http::Request::post(format!("http://{addr}/charges"))
            .body(Full::new(Bytes::from(format!("{i}"))))
            .unwrap();
        let response = svc.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::CREATED, "call {i}");
    }
    let mut keys = bank.charges.lock().unwrap().clone();
    keys.sort();
    keys.dedup();
    assert_eq!((bank.charges.lock().unwrap().len(), keys.len()), (60, 60));
    let report = chaos.report();
    assert_eq!(
        report.injected(FaultKind::DropReply),
        0,
        "none after the work, inside"
    );
    assert!(
        report.injected(FaultKind::Refuse) >= 5,
        "refusals still apply"
    );
}
