//! The adaptive concurrency limit against a real server (issue 63, item
//! 4): an axum server on loopback that works on 40 requests at a time (150
//! ms each) and queues the rest, so that its latency rises past 40 in
//! flight. 200 callers share one tower layer over hyper: with an adaptive
//! limit, the limit settles within 2 s at 40 ± 20 % and the p99 latency of
//! the attempts started after that stays within 1.5× the unloaded one (an
//! attempt started earlier may have queued behind the first overshoot); with a fixed limit of 200,
//! side by side, the server's queue is in every latency.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty, combinators::BoxBody};
use retries::Policy;
use retries::limit::Concurrency;
use retries_tower::{BoxError, ReplayBody, RetryLayer};
use tokio::time::Instant;
use tower::{Service, ServiceExt, service_fn};

type Body = BoxBody<Bytes, BoxError>;

const CAPACITY: usize = 40;
const WORK: Duration = Duration::from_millis(150);
const CALLERS: usize = 200;

/// The server: `CAPACITY` requests worked on at once, the rest queued.
async fn server() -> String {
    let slots = Arc::new(tokio::sync::Semaphore::new(CAPACITY));
    let app = Router::new()
        .route(
            "/",
            get(
                |State(slots): State<Arc<tokio::sync::Semaphore>>| async move {
                    let _slot = slots.acquire().await.unwrap();
                    tokio::time::sleep(WORK).await;
                    "done"
                },
            ),
        )
        .with_state(slots);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/")
}

/// A hyper client whose every request's round trip is recorded (with the
/// time it started), under a retry layer with `limit`.
fn client(
    limit: Arc<Concurrency>,
    trips: Arc<Mutex<Vec<(Instant, Duration)>>>,
) -> impl Service<
    Request<Body>,
    Response = http::Response<hyper::body::Incoming>,
    Error = BoxError,
    Future = impl Future<Output = Result<http::Response<hyper::body::Incoming>, BoxError>> + Send,
> + Clone
+ Send
+ 'static {
    let hyper: hyper_util::client::legacy::Client<_, ReplayBody<Body>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_max_idle_per_host(400)
            .build_http();
    let timed = service_fn(move |r: Request<ReplayBody<Body>>| {
        let (hyper, trips) = (hyper.clone(), Arc::clone(&trips));
        async move {
            let t = Instant::now();
            let response = hyper.request(r).await?;
            trips.lock().unwrap().push((t, t.elapsed()));
            Ok::<_, BoxError>(response)
        }
    });
    RetryLayer::new(Policy::new(Duration::from_secs(10)))
        .concurrency(limit)
        .layer(timed)
}

fn request(uri: &str) -> Request<Body> {
    Request::builder()
        .uri(uri)
        .body(Empty::new().map_err(|e| match e {}).boxed())
        .unwrap()
}

fn p99(mut d: Vec<Duration>) -> Duration {
    d.sort();
    d[(d.len() * 99 / 100).min(d.len() - 1)]
}

/// `CALLERS` callers through one client with `limit` for `run`: the limit
/// sampled every 100 ms, and the round trips.
async fn load(
    uri: &str,
    limit: Arc<Concurrency>,
    run: Duration,
) -> (Vec<u32>, Vec<(Instant, Duration)>) {
    let trips = Arc::new(Mutex::new(Vec::new()));
    let svc = client(Arc::clone(&limit), Arc::clone(&trips));
    let stop = Arc::new(AtomicBool::new(false));
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (mut svc, uri, stop) = (svc.clone(), uri.to_string(), Arc::clone(&stop));
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(r) = svc.ready().await.unwrap().call(request(&uri)).await {
                        let _ = r.into_body().collect().await;
                    }
                }
            })
        })
        .collect();
    let t0 = Instant::now();
    let mut limits = Vec::new();
    while t0.elapsed() < run {
        tokio::time::sleep(Duration::from_millis(100)).await;
        limits.push(limit.slots());
    }
    stop.store(true, Ordering::Relaxed);
    for c in callers {
        c.abort();
    }
    let trips = trips.lock().unwrap().clone();
    (limits, trips)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adaptive_limit_finds_a_servers_capacity() {
    let uri = server().await;
    // Unloaded: one caller, one request at a time.
    let trips = Arc::new(Mutex::new(Vec::new()));
    let mut one = client(
        Arc::new(Concurrency::new(1, Duration::from_secs(1))),
        Arc::clone(&trips),
    );
    for _ in 0..20 {
        let r = one
            .ready()
            .await
            .unwrap()
            .call(request(&uri))
            .await
            .unwrap();
        let _ = r.into_body().collect().await;
    }
    let unloaded = p99(trips.lock().unwrap().iter().map(|t| t.1).collect());

    let adaptive = Arc::new(Concurrency::adaptive(10, 400, Duration::from_secs(10)));
    let t0 = Instant::now();
    let (limits, trips) = load(&uri, adaptive, Duration::from_secs(4)).await;
    let settled = &limits[20..];
    let adaptive_p99 = p99(trips
        .iter()
        .filter(|(at, _)| at.duration_since(t0) >= Duration::from_secs(2))
        .map(|t| t.1)
        .collect());

    let fixed = Arc::new(Concurrency::new(200, Duration::from_secs(10)));
    let t1 = Instant::now();
    let (_, trips) = load(&uri, fixed, Duration::from_secs(2)).await;
    let fixed_p99 = p99(trips
        .iter()
        .filter(|(at, _)| at.duration_since(t1) >= Duration::from_secs(1))
        .map(|t| t.1)
        .collect());
    eprintln!(
        "unloaded p99 {unloaded:?}; adaptive: limit {limits:?}, p99 {adaptive_p99:?}; fixed 200: p99 {fixed_p99:?}"
    );
    let band = (CAPACITY * 8 / 10) as u32..=(CAPACITY * 12 / 10) as u32;
    assert!(
        settled.iter().all(|n| band.contains(n)),
        "the limit after 2 s: {settled:?}"
    );
    assert!(
        adaptive_p99 <= unloaded * 3 / 2,
        "adaptive p99 {adaptive_p99:?} against unloaded {unloaded:?}"
    );
    // The fixed limit lets the server's queue into every call.
    assert!(
        fixed_p99 >= unloaded * 2,
        "fixed p99 {fixed_p99:?} against unloaded {unloaded:?}"
    );
}
