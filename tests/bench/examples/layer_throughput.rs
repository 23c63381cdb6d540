//! `cargo run --release -p retries-bench --features examples --example layer_throughput`: what a
//! retry layer costs on every request of a busy client, side by side in one
//! run. An axum server on loopback answers `200 ok` at once; 64 tasks send
//! requests through each client for a fixed time (after a warm-up), and the
//! requests per second and the p50/p99 latency are printed, with ratios to
//! the bare client of the same family:
//!
//! * hyper (hyper-util's client, HTTP/1.1): bare; behind
//!   `retries_tower::RetryLayer`; behind tower's own `retry` with a
//!   minimal policy that clones the request; the same under tower's
//!   `timeout` (a deadline, which tower's retry lacks and the layer has);
//!   the same again writing the call's remaining time on the request in
//!   the header the layer sends (`retries-timeout-ms`): tower's pair doing
//!   the layer's wire work, so that what the header costs (client and
//!   server) is told apart from what the layer's own work costs;
//! * reqwest: bare; with `retries`' `RetryMiddleware`; with reqwest-retry's
//!   `RetryTransientMiddleware`; the same under the client's timeout,
//!   writing the middleware's deadline header (its wire work).
//!
//! No request fails, so no variant retries: this is the happy path's cost.
//!
//! `layer_throughput VARIANT REQUESTS` sends `REQUESTS` requests through
//! variant number `VARIANT` alone (0–8, in the order above; one at a time)
//! and exits: run under `valgrind --tool=callgrind` at two counts, the
//! difference over the difference of the counts is the instructions one
//! request costs, client and server, with no neighbour's noise in it
//! (`bash scripts/layer-instructions.sh` does that for every variant).
//! The rounds alternate between variants (A B C A B C …) so that a slow
//! stretch of the machine falls on all of them; each figure is the median
//! of the rounds.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use retries::Policy;
use retries_bench::load::{Variant, block_on, measure, only, only_args, print};
use retries_tower::ReplayBody;
use tower::{Service, ServiceExt};

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

/// What the peers put in the deadline header: the time left of a 5 s
/// deadline, from one clock read, as the layer's `Attempt::remaining`
/// reads one (the peers' deadline starts with the request, so it is 5 s
/// less the few nanoseconds since).
fn time_left() -> Duration {
    let now = std::time::Instant::now();
    (now + Duration::from_secs(5)).saturating_duration_since(now)
}

/// The header the layer and the middleware write (`retries::wire`).
static TIMEOUT: http::HeaderName = http::HeaderName::from_static(retries::wire::TIMEOUT_MS);

fn variants(addr: SocketAddr) -> Vec<Variant> {
    let uri: http::Uri = format!("http://{addr}/").parse().expect("a URI");
    let url = format!("http://{addr}/");
    let backoff = reqwest_retry::policies::ExponentialBackoff::builder().build_with_max_retries(2);
    vec![
        service("hyper", hyper_client::<Empty<Bytes>>(), &uri),
        service(
            "hyper + retries RetryLayer",
            retries_tower::RetryLayer::new(policy())
                .layer(hyper_client::<ReplayBody<Empty<Bytes>>>()),
            &uri,
        ),
        service(
            "hyper + tower retry",
            tower::retry::Retry::new(CloneAndRetry(2), hyper_client::<Empty<Bytes>>()),
            &uri,
        ),
        // tower's retry has no deadline; with one (a timeout over the
        // whole call, as the layer's policy has) it pays for a timer too.
        service(
            "hyper + tower retry + timeout",
            tower::timeout::Timeout::new(
                tower::retry::Retry::new(CloneAndRetry(2), hyper_client::<Empty<Bytes>>()),
                Duration::from_secs(5),
            ),
            &uri,
        ),
        service(
            "hyper + tower retry + timeout + deadline header",
            tower::timeout::Timeout::new(
                tower::util::MapRequest::new(
                    tower::retry::Retry::new(CloneAndRetry(2), hyper_client::<Empty<Bytes>>()),
                    |mut request: http::Request<Empty<Bytes>>| {
                        // The deadline the timeout above enforces, as the
                        // time left when the request goes out, in the
                        // layer's header (the attempts' copies carry it).
                        retries::wire::send_timeout(request.headers_mut(), time_left());
                        request
                    },
                ),
                Duration::from_secs(5),
            ),
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
                .with(retries_reqwest::RetryMiddleware::new(policy()))
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
        // reqwest-retry has no deadline; with one (the client's timeout) and
        // the layer's header written on each request, it does the
        // middleware's wire work.
        reqwest_client(
            "reqwest + reqwest-retry + timeout + deadline header",
            reqwest_middleware::ClientBuilder::new(
                reqwest::Client::builder()
                    .timeout(Duration::from_secs(5))
                    .build()
                    .expect("a client"),
            )
            .with_init(|request: reqwest_middleware::RequestBuilder| {
                request.header(TIMEOUT.clone(), retries::wire::timeout_value(time_left()))
            })
            .with(reqwest_retry::RetryTransientMiddleware::new_with_policy(
                backoff,
            ))
            .build(),
            &url,
        ),
    ]
}

fn main() {
    let only_one = only_args();
    block_on(only_one.is_some(), async {
        let variants = variants(serve().await);
        if let Some((variant, n)) = only_one {
            return only(&variants, variant, n).await;
        }
        let figures = measure(&variants).await;
        // The bare client of each family: hyper, then reqwest.
        print(&variants, &figures, |i| if i < 5 { 0 } else { 5 });
    });
}
