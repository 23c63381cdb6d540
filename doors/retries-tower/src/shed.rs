//! [`ShedLayer`]: the server side of backpressure, a concurrency limit in
//! front of a service that answers at once when it is full. Also reachable
//! as `retries_tower::ShedLayer`, where it lived first.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode};

use retries_core::limit::{Concurrency, OwnedSlot};

/// The server side of backpressure: at most `slots` requests reach the
/// service at once; one that finds them all taken is answered at once
/// (it does not queue) with gRPC `RESOURCE_EXHAUSTED` (HTTP 200,
/// trailers-only, `grpc-retry-pushback-ms`) when its `content-type` is
/// `application/grpc…`, else HTTP 503 with `Retry-After` (whole seconds,
/// rounded up). The response body is the body type's `Default` (empty
/// for tonic's and axum's).
///
/// ```
/// use std::time::Duration;
/// use retries_tower::ShedLayer;
///
/// // 64 requests at once; beyond that, "come back in 50 ms".
/// let layer = ShedLayer::new(64, Duration::from_millis(50));
/// assert_eq!(layer.limit().slots(), 64);
/// ```
#[derive(Debug, Clone)]
pub struct ShedLayer {
    limit: Arc<Concurrency>,
    pushback: Duration,
}

impl ShedLayer {
    /// `slots` requests at once (0 counts as 1); a refused request is
    /// told to come back after `pushback`.
    #[must_use]
    pub fn new(slots: u32, pushback: Duration) -> Self {
        Self {
            limit: Arc::new(Concurrency::new(slots, Duration::ZERO)),
            pushback,
        }
    }

    /// The limit, shared by every service this layer makes.
    #[must_use]
    pub fn limit(&self) -> &Concurrency {
        &self.limit
    }
}

impl<S> tower_layer::Layer<S> for ShedLayer {
    type Service = ShedService<S>;
    fn layer(&self, inner: S) -> ShedService<S> {
        ShedService {
            inner,
            limit: Arc::clone(&self.limit),
            pushback: self.pushback,
        }
    }
}

/// The service of [`ShedLayer`].
#[derive(Debug, Clone)]
pub struct ShedService<S> {
    inner: S,
    limit: Arc<Concurrency>,
    pushback: Duration,
}

impl<S, B, ResB> tower_service::Service<Request<B>> for ShedService<S>
where
    S: tower_service::Service<Request<B>, Response = Response<ResB>>,
    ResB: Default,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ShedFuture<S::Future, ResB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        match Concurrency::try_own(&self.limit) {
            Some(slot) => ShedFuture::Admitted {
                fut: self.inner.call(request),
                _slot: slot,
            },
            None => ShedFuture::Refused {
                response: Some(refusal(&request, self.pushback)),
            },
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`ShedService`]: the service's own, holding a
    /// slot, or the refusal.
    #[project = ShedProj]
    #[allow(missing_docs)]
    pub enum ShedFuture<F, ResB> {
        /// Admitted: the service's future, with its slot.
        Admitted { #[pin] fut: F, _slot: OwnedSlot },
        /// Refused at once.
        Refused { response: Option<Response<ResB>> },
    }
}

impl<F, ResB, Er> Future for ShedFuture<F, ResB>
where
    F: Future<Output = Result<Response<ResB>, Er>>,
{
    type Output = Result<Response<ResB>, Er>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            ShedProj::Admitted { fut, .. } => fut.poll(cx),
            ShedProj::Refused { response } => match response.take() {
                Some(r) => Poll::Ready(Ok(r)),
                None => Poll::Pending,
            },
        }
    }
}

fn refusal<B, ResB: Default>(request: &Request<B>, pushback: Duration) -> Response<ResB> {
    let grpc = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        // RESOURCE_EXHAUSTED, and the pause to take.
        let ms = HeaderValue::from(u64::try_from(pushback.as_millis()).unwrap_or(u64::MAX));
        return crate::server::trailers_only("8", "server%20concurrency%20limit%20full", ms);
    }
    let mut response = Response::new(ResB::default());
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let secs = pushback
        .as_secs()
        .saturating_add(u64::from(pushback.subsec_nanos() > 0));
    response
        .headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
    response
}
