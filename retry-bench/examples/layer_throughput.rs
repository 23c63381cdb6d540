//! `cargo run --release -p retries-bench --example layer_throughput`: what a
//! retry layer costs on every request of a busy client, side by side in one
//! run. An axum server on loopback answers `200 ok` at once; 64 tasks send
//! requests through each client for a fixed time (after a warm-up), and the
//! requests per second and the p50/p99 latency are printed, with ratios to
//! the bare client of the same family:
//!
//! * hyper (hyper-util's client, HTTP/1.1): bare; behind
//!   `retries::tower::RetryLayer`; behind tower's own `retry` with a
//!   minimal policy that clones the request;
//! * reqwest: bare; with `retries`' `RetryMiddleware`; with reqwest-retry's
//!   `RetryTransientMiddleware`.
//!
//! No request fails, so no variant retries: this is the happy path's cost.
//! The rounds alternate between variants (A B C A B C …) so that a slow
//! stretch of the machine falls on all of them; each figure is the median
//! of the rounds.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use retries::Policy;
use retries::replay::ReplayBody;
use tower::{Service, ServiceExt};

const CONCURRENCY: usize = 64;
const ROUND: Duration = Duration::from_millis(1500);
const ROUNDS: usize = 5;

/// One round's figures.
#[derive(Debug, Clone, Copy)]
struct Figures {
    per_sec: f64,
    p50: Duration,
    p99: Duration,
}

/// Run `send` from `CONCURRENCY` tasks for `ROUND` and measure it.
async fn round<F, Fut>(send: F) -> Figures
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let end = Instant::now() + ROUND;
    let mut tasks = Vec::new();
    for _ in 0..CONCURRENCY {
        let send = send.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < end {
                let t0 = Instant::now();
                send().await;
                latencies.push(t0.elapsed());
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("a sender"));
    }
    all.sort();
    let at = |q: f64| all[((all.len() as f64 - 1.0) * q) as usize];
    Figures {
        per_sec: all.len() as f64 / ROUND.as_secs_f64(),
        p50: at(0.50),
        p99: at(0.99),
    }
}

fn median(mut v: Vec<Figures>) -> Figures {
    let mid = v.len() / 2;
    let pick = |v: &mut Vec<Figures>, f: fn(&Figures) -> f64| {
        v.sort_by(|a, b| f(a).total_cmp(&f(b)));
        v[mid]
    };
    Figures {
        per_sec: pick(&mut v, |f| f.per_sec).per_sec,
        p50: pick(&mut v, |f| f.p50.as_secs_f64()).p50,
        p99: pick(&mut v, |f| f.p99.as_secs_f64()).p99,
    }
}

async fn serve() -> SocketAddr {
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn policy() -> Policy {
    Policy::new(Duration::from_secs(5)).with_max_attempts(3)
}

/// tower's own `retry` with the least a user writes: retry nothing that
/// succeeded, clone the request (its body is empty).
#[derive(Clone)]
struct CloneAndRetry(u32);

impl<B>
    tower::retry::Policy<
        http::Request<Empty<Bytes>>,
        http::Response<B>,
        hyper_util::client::legacy::Error,
    > for CloneAndRetry
{
    type Future = std::future::Ready<()>;

    fn retry(
        &mut self,
        _: &mut http::Request<Empty<Bytes>>,
        result: &mut Result<http::Response<B>, hyper_util::client::legacy::Error>,
    ) -> Option<Self::Future> {
        match result {
            Ok(r) if !r.status().is_server_error() => None,
            _ if self.0 == 0 => None,
            _ => {
                self.0 -= 1;
                Some(std::future::ready(()))
            }
        }
    }

    fn clone_request(
        &mut self,
        req: &http::Request<Empty<Bytes>>,
    ) -> Option<http::Request<Empty<Bytes>>> {
        let mut copy = http::Request::new(Empty::new());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.headers_mut() = req.headers().clone();
        Some(copy)
    }
}

fn get(uri: &http::Uri) -> http::Request<Empty<Bytes>> {
    http::Request::get(uri.clone())
        .body(Empty::new())
        .expect("a request")
}

/// A client under test: its name, and one request through it.
type Variant = (
    &'static str,
    Arc<dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync>,
);

/// A tower service for `http::Request<B>` as a variant.
fn service<S, B>(name: &'static str, svc: S, uri: &http::Uri) -> Variant
where
    S: Service<http::Request<Empty<Bytes>>, Response = http::Response<B>>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug,
{
    let uri = uri.clone();
    (
        name,
        Arc::new(move || {
            let (mut s, uri) = (svc.clone(), uri.clone());
            Box::pin(async move {
                let r = s
                    .ready()
                    .await
                    .expect("ready")
                    .call(get(&uri))
                    .await
                    .expect("a response");
                assert!(r.status().is_success());
            })
        }),
    )
}

/// A reqwest-middleware client as a variant (a bare client too, through
/// no middleware).
fn reqwest_client(
    name: &'static str,
    client: reqwest_middleware::ClientWithMiddleware,
    url: &str,
) -> Variant {
    let url = url.to_owned();
    (
        name,
        Arc::new(move || {
            let (c, url) = (client.clone(), url.clone());
            Box::pin(async move {
                let r = c.get(url).send().await.expect("a response");
                assert!(r.status().is_success());
            })
        }),
    )
}

fn hyper_client<B: http_body::Body + Send + 'static>() -> Client<HttpConnector, B>
where
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    Client::builder(TokioExecutor::new()).build_http()
}

fn variants(addr: SocketAddr) -> Vec<Variant> {
    let uri: http::Uri = format!("http://{addr}/").parse().expect("a URI");
    let url = format!("http://{addr}/");
    let backoff = reqwest_retry::policies::ExponentialBackoff::builder().build_with_max_retries(2);
    vec![
        service("hyper", hyper_client::<Empty<Bytes>>(), &uri),
        service(
            "hyper + retries RetryLayer",
            retries::tower::RetryLayer::new(policy())
                .layer(hyper_client::<ReplayBody<Empty<Bytes>>>()),
            &uri,
        ),
        service(
            "hyper + tower retry",
            tower::retry::Retry::new(CloneAndRetry(2), hyper_client::<Empty<Bytes>>()),
            &uri,
        ),
        reqwest_client(
            "reqwest (no middleware)",
            reqwest_middleware::ClientBuilder::new(reqwest::Client::new()).build(),
            &url,
        ),
        reqwest_client(
            "reqwest + retries RetryMiddleware",
            reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
                .with(retries::reqwest_middleware::RetryMiddleware::new(policy()))
                .build(),
            &url,
        ),
        reqwest_client(
            "reqwest + reqwest-retry",
            reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
                .with(reqwest_retry::RetryTransientMiddleware::new_with_policy(
                    backoff,
                ))
                .build(),
            &url,
        ),
    ]
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let addr = serve().await;
        let variants = variants(addr);
        // Warm-up: every client connects and runs a little.
        for (_, send) in &variants {
            let send = Arc::clone(send);
            let _ = tokio::time::timeout(Duration::from_millis(300), round(move || send())).await;
        }
        let mut rounds: Vec<Vec<Figures>> = vec![Vec::new(); variants.len()];
        for _ in 0..ROUNDS {
            for (i, (_, send)) in variants.iter().enumerate() {
                let send = Arc::clone(send);
                rounds[i].push(round(move || send()).await);
            }
        }
        let figures: Vec<Figures> = rounds.into_iter().map(median).collect();
        println!(
            "{CONCURRENCY} tasks, {ROUNDS} alternating rounds of {ROUND:?}, medians; ratios to the bare client of each family"
        );
        println!(
            "{:<36} {:>10} {:>8} {:>10} {:>10} {:>8} {:>8}",
            "client", "req/s", "× bare", "p50", "p99", "× p50", "× p99"
        );
        for (i, (name, _)) in variants.iter().enumerate() {
            let base = if i < 3 { figures[0] } else { figures[3] };
            let f = figures[i];
            println!(
                "{name:<36} {:>10.0} {:>8.3} {:>10.1?} {:>10.1?} {:>8.3} {:>8.3}",
                f.per_sec,
                f.per_sec / base.per_sec,
                f.p50,
                f.p99,
                f.p50.as_secs_f64() / base.p50.as_secs_f64(),
                f.p99.as_secs_f64() / base.p99.as_secs_f64(),
            );
        }
    });
}
