//! Keyed resends only where the server proved it deduplicates (issue 59,
//! row 1): an axum server on loopback whose `POST /charges` is behind
//! `IdempotencyLayer` and whose `POST /refunds` is not, both behind
//! `FaultLayer` dropping 30 % of replies after the work, and the client
//! doors in keyed mode (`idempotent_by_key`). The answers of `/charges`
//! carry the mark `retries-deduplicated`, so its unknown outcomes are sent
//! again and answered from the record; `/refunds` never shows the mark, so
//! its unknown outcomes stop as unknown instead of running twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use retries::{Backoff, Policy, Reason, Stopped};
use retries_chaos::{Chaos, Fault, FaultLayer, Rule};
use retries_tower::RetryLayer;
use retries_tower::dedup::{IdempotencyLayer, MemoryStore};
use tower::ServiceExt;

/// The keys each route ran, in order.
#[derive(Default)]
struct Ledger(Mutex<Vec<(&'static str, String)>>);

impl Ledger {
    /// How many times each key ran on `route`.
    fn runs(&self, route: &str) -> HashMap<String, usize> {
        let mut runs = HashMap::new();
        for (r, key) in self.0.lock().unwrap().iter() {
            if *r == route {
                *runs.entry(key.clone()).or_default() += 1;
            }
        }
        runs
    }
}

fn work(
    route: &'static str,
) -> impl Fn(State<Arc<Ledger>>, HeaderMap) -> std::future::Ready<StatusCode> + Clone {
    move |State(ledger): State<Arc<Ledger>>, headers: HeaderMap| {
        let key = headers
            .get("idempotency-key")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        ledger.0.lock().unwrap().push((route, key));
        std::future::ready(StatusCode::CREATED)
    }
}

/// `/charges` behind the idempotency layer, `/refunds` not, both behind a
/// fault layer dropping 30 % of replies after the handler ran.
async fn serve(seed: u64) -> (Arc<Ledger>, std::net::SocketAddr, Chaos) {
    let ledger = Arc::new(Ledger::default());
    let chaos = Chaos::builder()
        .seed(seed)
        .rule(Rule::new(Fault::DropReply).rate(0.3))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/charges", post(work("/charges")))
        .layer(IdempotencyLayer::new(MemoryStore::new()))
        .route("/refunds", post(work("/refunds")))
        .with_state(Arc::clone(&ledger))
        .layer(FaultLayer::new(chaos.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (ledger, addr, chaos)
}

fn policy() -> Policy {
    Policy::new(Duration::from_secs(10))
        .with_max_attempts(6)
        .with_backoff(Backoff::constant(Duration::from_millis(5)))
}

type Inner = Client<HttpConnector, retries_tower::ReplayBody<Full<Bytes>>>;

/// What the calls to one route ended with.
#[derive(Debug, Default, PartialEq, Eq)]
struct Ends {
    ok: usize,
    unknown: usize,
    other: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tower_layer_resends_by_key_only_where_the_mark_was_seen() {
    let (ledger, addr, chaos) = serve(5901).await;
    let client: Inner = Client::builder(TokioExecutor::new()).build_http();
    let svc = RetryLayer::new(policy())
        .budget(retries::NoBudget)
        .idempotent_by_key(http::HeaderName::from_static("idempotency-key"))
        .layer(client);
    let mut ends: HashMap<&str, Ends> = HashMap::new();
    for i in 0..150 {
        for route in ["/charges", "/refunds"] {
            let request = http::Request::post(format!("http://{addr}{route}"))
                .body(Full::new(Bytes::from(format!("{i}"))))
                .unwrap();
            let end = ends.entry(route).or_default();
            match svc.clone().oneshot(request).await {
                Ok(r) if r.status() == StatusCode::CREATED => end.ok += 1,
                Err(e)
                    if e.downcast_ref::<Stopped>().map(Stopped::reason)
                        == Some(Reason::UnknownOutcome) =>
                {
                    end.unknown += 1;
                }
                _ => end.other += 1,
            }
        }
    }
    // No key ran twice anywhere: the route without the layer never showed
    // the mark, so none of its unknown outcomes was sent again.
    for route in ["/charges", "/refunds"] {
        let twice: Vec<_> = ledger
            .runs(route)
            .into_iter()
            .filter(|(_, n)| *n > 1)
            .collect();
        assert!(twice.is_empty(), "{route}: keys run twice: {twice:?}");
    }
    let refunds = &ends["/refunds"];
    assert_eq!(refunds.ok + refunds.unknown, 150, "{refunds:?}");
    assert!(
        refunds.unknown >= 20,
        "the lost replies of /refunds end unknown: {refunds:?}"
    );
    // `/charges` proved itself by its first answer: from then on every lost
    // reply was sent again and answered from the record. Only calls before
    // the first answer can have ended unknown.
    let charges = &ends["/charges"];
    assert_eq!(charges.other, 0, "{charges:?}");
    let runs = ledger.runs("/charges");
    assert_eq!(runs.len(), 150 - charges.unknown, "{charges:?}");
    assert!(
        charges.unknown <= 3,
        "only before the first answer: {charges:?}"
    );
    assert!(chaos.report().observed(retries_chaos::FaultKind::DropReply) >= 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reqwest_middleware_resends_by_key_only_where_the_mark_was_seen() {
    use retries_reqwest::RetryMiddleware;
    let (ledger, addr, _chaos) = serve(5902).await;
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(
            RetryMiddleware::new(policy())
                .budget(retries::NoBudget)
                .idempotent_by_key(http::HeaderName::from_static("idempotency-key")),
        )
        .build();
    let mut ok = HashMap::<&str, usize>::new();
    for i in 0..60 {
        for route in ["/charges", "/refunds"] {
            let sent = client
                .post(format!("http://{addr}{route}"))
                .body(format!("{i}"))
                .send()
                .await;
            if sent.is_ok_and(|r| r.status() == StatusCode::CREATED) {
                *ok.entry(route).or_default() += 1;
            }
        }
    }
    for route in ["/charges", "/refunds"] {
        let twice: Vec<_> = ledger
            .runs(route)
            .into_iter()
            .filter(|(_, n)| *n > 1)
            .collect();
        assert!(twice.is_empty(), "{route}: keys run twice: {twice:?}");
    }
    assert!(ok["/charges"] >= 57, "{ok:?}");
    assert!(
        ok["/refunds"] <= 52,
        "lost replies of /refunds are not resent: {ok:?}"
    );
}

/// A server of another vendor deduplicates without the mark: declared, its
/// keyed requests are resent from the first call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_server_is_trusted_from_the_first_call() {
    let (ledger, addr, _chaos) = serve(5903).await;
    let client: Inner = Client::builder(TokioExecutor::new()).build_http();
    let svc = RetryLayer::new(policy())
        .budget(retries::NoBudget)
        .idempotent_by_key(http::HeaderName::from_static("idempotency-key"))
        .dedup_declared()
        .layer(client);
    for i in 0..40 {
        let request = http::Request::post(format!("http://{addr}/charges"))
            .body(Full::new(Bytes::from(format!("{i}"))))
            .unwrap();
        let response = svc.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::CREATED, "call {i}");
    }
    let runs = ledger.runs("/charges");
    assert_eq!(runs.len(), 40);
    assert!(runs.values().all(|n| *n == 1));
}
