//! The next attempt on another replica (`RetryLayer::avoid_tried` over
//! `retries_tower::balance::P2c`), over real sockets: three axum replicas on
//! loopback, a hyper-util client aimed at each with `balance::At`, 16 calls
//! in flight. The good replicas take 2 ms a request; a bad one answers 503
//! at once (so a balancer counting requests in flight sees it idle and picks
//! it more). Every replica logs which call each request belongs to (an
//! `x-call` header), in order, so a call's attempts are read off the logs.
//!
//! Beside the option, in the same run: the same balancer without it (as
//! today), and tower's own p2c (`Balance` over `PendingRequests`), which
//! ignores the record, with the layer's option on: it still works as before.
//! No budget and up to 8 attempts in every mode, so what differs is the
//! balancer's pick alone. The table in `tests/bench/README.md` is this
//! test's output (`cargo test -p retries-tests --test behaviour
//! another_replica -- --nocapture --test-threads 1`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use retries::{Backoff, NoBudget, Policy};
use retries_tower::RetryLayer;
use retries_tower::balance::{At, P2c};
use retries_tower::{BoxError, ReplayBody};
use tower::discover::ServiceList;
use tower::{Service, ServiceExt};

const CALLS: usize = 400;
const IN_FLIGHT: usize = 16;
const MAX_ATTEMPTS: u32 = 8;

/// Which replica each request of each call reached, in arrival order.
#[derive(Default)]
struct Log(Mutex<Vec<(String, usize)>>);

struct Replica {
    index: usize,
    bad: bool,
    log: Arc<Log>,
}

async fn answer(State(r): State<Arc<Replica>>, headers: HeaderMap) -> StatusCode {
    let call = headers
        .get("x-call")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    r.log.0.lock().unwrap().push((call, r.index));
    if r.bad {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        tokio::time::sleep(Duration::from_millis(2)).await;
        StatusCode::OK
    }
}

/// Three replicas on loopback, those in `bad` answering 503 to everything.
async fn replicas(bad: &[usize], log: &Arc<Log>) -> Vec<SocketAddr> {
    let mut addrs = Vec::new();
    for index in 0..3 {
        let state = Arc::new(Replica {
            index,
            bad: bad.contains(&index),
            log: Arc::clone(log),
        });
        let app = Router::new().route("/", get(answer)).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
    }
    addrs
}

type Inner = Client<HttpConnector, ReplayBody<Full<Bytes>>>;

fn endpoints(addrs: &[SocketAddr]) -> Vec<At<Inner>> {
    let client: Inner = Client::builder(TokioExecutor::new()).build_http();
    addrs
        .iter()
        .map(|a| At::new(a.to_string().parse().unwrap(), client.clone()))
        .collect()
}

fn layer() -> RetryLayer<retries_tower::Http, NoBudget> {
    let policy = Policy::new(Duration::from_secs(10))
        .with_max_attempts(MAX_ATTEMPTS)
        .with_backoff(Backoff::constant(Duration::from_millis(1)));
    RetryLayer::new(policy).budget(NoBudget)
}

/// What one mode's run gave.
#[derive(Debug)]
struct Figures {
    ok: usize,
    /// Attempts of each call, by replica, in order.
    attempts: Vec<Vec<usize>>,
}

impl Figures {
    fn more_than(&self, n: usize) -> usize {
        self.attempts.iter().filter(|a| a.len() > n).count()
    }
    fn total(&self) -> usize {
        self.attempts.iter().map(Vec::len).sum()
    }
    fn on(&self, bad: &[usize]) -> usize {
        self.attempts
            .iter()
            .flatten()
            .filter(|r| bad.contains(r))
            .count()
    }
    /// Calls whose second attempt went to the replica of their first.
    fn same_again(&self) -> usize {
        self.attempts
            .iter()
            .filter(|a| a.len() > 1 && a[0] == a[1])
            .count()
    }
    fn row(&self, mode: &str, bad: &[usize]) -> String {
        let calls = self.attempts.len() as f64;
        format!(
            "| {mode} | {}/{} | {:.1} % | {:.1} % | {} | {:.2} | {:.1} % |",
            self.ok,
            self.attempts.len(),
            100.0 * self.more_than(2) as f64 / calls,
            100.0 * self.more_than(3) as f64 / calls,
            self.attempts.iter().map(Vec::len).max().unwrap_or(0),
            self.total() as f64 / calls,
            100.0 * self.on(bad) as f64 / self.total() as f64,
        )
    }
}

/// `CALLS` GETs through `svc`, `IN_FLIGHT` at a time; each call's attempts
/// read off the replicas' log.
async fn run<S, RB>(svc: S, mode: &str, log: &Arc<Log>) -> Figures
where
    S: Service<http::Request<Full<Bytes>>, Response = http::Response<RB>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
{
    log.0.lock().unwrap().clear();
    let next = Arc::new(AtomicUsize::new(0));
    let ok = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..IN_FLIGHT {
        let (svc, next, ok, mode) = (svc.clone(), next.clone(), ok.clone(), mode.to_string());
        workers.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= CALLS {
                    break;
                }
                let request = http::Request::get("/")
                    .header("x-call", format!("{mode}-{n}"))
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                let response = svc.clone().oneshot(request).await.map_err(Into::into);
                if response.is_ok_and(|r| r.status() == StatusCode::OK) {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    let mut by_call: HashMap<String, Vec<usize>> = HashMap::new();
    for (call, replica) in log.0.lock().unwrap().iter() {
        by_call.entry(call.clone()).or_default().push(*replica);
    }
    let attempts = (0..CALLS)
        .map(|n| by_call.remove(&format!("{mode}-{n}")).unwrap_or_default())
        .collect();
    Figures {
        ok: ok.load(Ordering::Relaxed),
        attempts,
    }
}

/// The three balancers under the same layer, over replicas with `bad` bad.
async fn side_by_side(bad: &[usize]) -> [Figures; 3] {
    let log = Arc::new(Log::default());
    let addrs = replicas(bad, &log).await;

    let ours = layer()
        .avoid_tried()
        .layer(P2c::new(ServiceList::new(endpoints(&addrs))));
    let ours = run(ours, "avoid", &log).await;

    let today = layer().layer(P2c::new(ServiceList::new(endpoints(&addrs))));
    let today = run(today, "today", &log).await;

    let loaded = endpoints(&addrs)
        .into_iter()
        .map(|e| tower::load::PendingRequests::new(e, tower::load::CompleteOnResponse::default()));
    let balance = tower::balance::p2c::Balance::new(ServiceList::new(loaded.collect::<Vec<_>>()));
    let towers = layer()
        .avoid_tried()
        .layer(tower::buffer::Buffer::new(balance, 64));
    let towers = run(towers, "tower", &log).await;

    println!(
        "\n{} of 3 replicas bad, {CALLS} calls, {IN_FLIGHT} in flight, up to {MAX_ATTEMPTS} attempts:",
        bad.len()
    );
    println!(
        "| balancer | calls ok | calls over 2 attempts | over 3 | most attempts | attempts per call | attempts on a bad replica |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!("{}", ours.row("`P2c` + `avoid_tried`", bad));
    println!("{}", today.row("`P2c`, without (today)", bad));
    println!(
        "{}",
        towers.row(
            "tower's p2c (`PendingRequests`), `avoid_tried` ignored",
            bad
        )
    );
    [ours, today, towers]
}

/// The balancer's own choice failed a call only if every attempt of it
/// reached a bad replica: a balancer that ignores the record works as
/// before (an attempt on a good replica always succeeds here).
fn fails_only_by_its_picks(f: &Figures, bad: &[usize]) {
    let all_bad = f
        .attempts
        .iter()
        .filter(|a| a.iter().all(|r| bad.contains(r)))
        .count();
    assert_eq!(f.ok + all_bad, CALLS, "{f:?}");
    for a in &f.attempts {
        assert!(!a.is_empty() && a.len() <= MAX_ATTEMPTS as usize, "{a:?}");
        // Each call stops at its first good replica.
        assert!(a[..a.len() - 1].iter().all(|r| bad.contains(r)), "{a:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_replica_bad_a_retry_never_returns_to_it() {
    let bad = [1];
    let [ours, today, towers] = side_by_side(&bad).await;

    assert_eq!(ours.ok, CALLS);
    for a in &ours.attempts {
        assert!(a.len() <= 2, "a call needed {a:?}");
        if a.len() == 2 {
            assert_ne!(a[0], a[1], "the second attempt went back: {a:?}");
        }
    }
    assert_eq!(ours.same_again(), 0);
    fails_only_by_its_picks(&ours, &bad);

    // Without the record the same balancer sends some retries back to the
    // bad replica: calls over 2 attempts happen (about one failed first
    // attempt in two or three is sent back; the run has ~100 of them).
    fails_only_by_its_picks(&today, &bad);
    assert!(today.more_than(2) > 0, "{today:?}");
    assert!(today.same_again() > 0);
    fails_only_by_its_picks(&towers, &bad);
    assert!(towers.more_than(2) > 0, "{towers:?}");
    // The fast-failing replica looks idle to a balancer counting requests
    // in flight: it draws more than its third of the attempts.
    assert!(3 * towers.on(&bad) > towers.total(), "{towers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_replicas_bad_every_call_succeeds_within_three_attempts() {
    let bad = [0, 2];
    let [ours, today, towers] = side_by_side(&bad).await;

    assert_eq!(ours.ok, CALLS);
    for a in &ours.attempts {
        assert!(a.len() <= 3, "a call needed {a:?}");
        let mut seen = a.clone();
        seen.dedup();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), a.len(), "a replica was tried twice: {a:?}");
    }
    fails_only_by_its_picks(&ours, &bad);
    fails_only_by_its_picks(&today, &bad);
    assert!(today.more_than(3) > 0, "{today:?}");
    fails_only_by_its_picks(&towers, &bad);
    assert!(towers.more_than(3) > 0, "{towers:?}");
}

/// A single endpoint: every attempt goes to it, as without the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_single_endpoint_every_retry_goes_to_it() {
    let log = Arc::new(Log::default());
    let addrs = replicas(&[0], &log).await;
    let one = layer()
        .avoid_tried()
        .layer(P2c::new(ServiceList::new(endpoints(&addrs[..1]))));
    let mut svc = one.clone();
    let request = http::Request::get("/")
        .header("x-call", "single-0")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = svc.ready().await.unwrap().call(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let log = log.0.lock().unwrap();
    assert_eq!(log.len(), MAX_ATTEMPTS as usize);
    assert!(log.iter().all(|(_, r)| *r == 0));
}
