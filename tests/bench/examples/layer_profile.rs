//! `valgrind --tool=callgrind target/release/examples/layer_profile N MODE`:
//! the work per request of `N` requests through a service that answers at
//! once (no network), for a profile of where a layer's cost goes. `MODE`:
//! `bare` (the service alone), `layer` (behind `retries_tower::RetryLayer`,
//! the default) or `tower` (behind tower's own `retry` with a policy that
//! clones the request). The layer's own cost is its count less `bare`'s.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use retries::Policy;
use retries_tower::ReplayBody;
use tower::{Service, ServiceExt};

fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let mode = std::env::args().nth(2).unwrap_or_else(|| "layer".into());
    rt.block_on(async {
        let inner = tower::service_fn(|_r: http::Request<ReplayBody<Empty<Bytes>>>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(()))
        });
        let mut svc =
            retries_tower::RetryLayer::new(Policy::new(Duration::from_secs(5))).layer(inner);
        let mut bare = tower::service_fn(|_r: http::Request<Empty<Bytes>>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(()))
        });
        let mut towered = tower::retry::Retry::new(
            CloneOnce,
            tower::service_fn(|_r: http::Request<Empty<Bytes>>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(()))
            }),
        );
        let uri: http::Uri = "http://127.0.0.1:8080/".parse().expect("a URI");
        for _ in 0..n {
            let request = http::Request::get(uri.clone())
                .body(Empty::new())
                .expect("a request");
            let r = match mode.as_str() {
                "bare" => bare.ready().await.expect("ready").call(request).await.ok(),
                "tower" => towered
                    .ready()
                    .await
                    .expect("ready")
                    .call(request)
                    .await
                    .ok(),
                _ => svc.ready().await.expect("ready").call(request).await.ok(),
            };
            std::hint::black_box(r.expect("an answer"));
        }
    });
}

/// tower's `retry` with the least a user writes: nothing that succeeded is
/// retried; the request (with an empty body) is cloned for a retry.
#[derive(Clone)]
struct CloneOnce;

impl tower::retry::Policy<http::Request<Empty<Bytes>>, http::Response<()>, std::convert::Infallible>
    for CloneOnce
{
    type Future = std::future::Ready<()>;

    fn retry(
        &mut self,
        _: &mut http::Request<Empty<Bytes>>,
        _: &mut Result<http::Response<()>, std::convert::Infallible>,
    ) -> Option<Self::Future> {
        None
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
