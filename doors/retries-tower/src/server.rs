//! The server layer of the wire protocol ([`retries_core::wire`]): the
//! caller's deadline as the handler's scope, net of a reserve; requests
//! with too little time refused before the handler; the marker "I already
//! retried; don't retry me" on answers whose handler's retried calls gave
//! up.
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderValue, Response, StatusCode};

use retries_core::door::ServerScope;
use retries_core::wire::{CALLER_OWNS_NAME, NO_RETRY_NAME, incoming_timeout};

use crate::protocol::grpc;

/// The protocol a [`ServerLayer`] answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    Http,
    Grpc,
}

/// A tower layer for servers (axum, hyper, tonic): the caller's deadline
/// as the handler's scope, net of a reserve; requests with too little
/// time refused before the handler; the marker "I already retried; don't
/// retry me" on answers whose handler's retried calls gave up. See the
/// [`wire`](retries_core::wire) docs.
#[derive(Debug, Clone, Copy)]
pub struct ServerLayer {
    wire: Wire,
    reserve: Duration,
    min_remaining: Duration,
    advise: bool,
    caller_owns: bool,
}

impl ServerLayer {
    const fn new(wire: Wire) -> Self {
        Self {
            wire,
            reserve: Duration::ZERO,
            min_remaining: Duration::from_millis(1),
            advise: true,
            caller_owns: false,
        }
    }

    /// For an HTTP server (axum, hyper).
    #[must_use]
    pub const fn http() -> Self {
        Self::new(Wire::Http)
    }

    /// For a gRPC server (tonic): its answers carry the marker as gRFC
    /// A6's `grpc-retry-pushback-ms: -1`.
    #[must_use]
    pub const fn grpc() -> Self {
        Self::new(Wire::Grpc)
    }

    /// Time kept back from the caller's deadline for writing the answer:
    /// the handler's scope ends this much earlier (default zero).
    #[must_use]
    pub const fn reserve(mut self, reserve: Duration) -> Self {
        self.reserve = reserve;
        self
    }

    /// Refuse, before the handler runs, a request whose remaining time
    /// less the reserve is below this (default 1 ms).
    #[must_use]
    pub const fn min_remaining(mut self, min: Duration) -> Self {
        self.min_remaining = min;
        self
    }

    /// Add the marker to answers whose retried calls gave up (default
    /// `true`); see the [`wire`](retries_core::wire) docs for when to turn it off.
    #[must_use]
    pub const fn advise_no_retry(mut self, on: bool) -> Self {
        self.advise = on;
        self
    }

    /// Honour `retries-caller-owns: 1`: the handler's retried calls then
    /// defer to the caller (default `false`).
    #[must_use]
    pub const fn honour_caller_owns(mut self, on: bool) -> Self {
        self.caller_owns = on;
        self
    }
}

impl<S> tower_layer::Layer<S> for ServerLayer {
    type Service = ServerService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ServerService {
            inner,
            layer: *self,
        }
    }
}

/// The service of [`ServerLayer`].
#[derive(Debug, Clone)]
pub struct ServerService<S> {
    inner: S,
    layer: ServerLayer,
}

impl<S, B, RB> tower_service::Service<http::Request<B>> for ServerService<S>
where
    S: tower_service::Service<http::Request<B>, Response = Response<RB>>,
    RB: Default,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = ServerFuture<S::Future, RB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let layer = self.layer;
        let caller_owns = layer.caller_owns
            && request
                .headers()
                .get(&CALLER_OWNS_NAME)
                .is_some_and(|v| v.as_bytes().trim_ascii() == b"1");
        let deadline = match incoming_timeout(request.headers()) {
            Some(left) => {
                retries_core::door::observe::seconds("retry.server.deadline_at_entry", &[], left);
                let usable = left.saturating_sub(layer.reserve);
                if usable < layer.min_remaining {
                    retries_core::door::observe::counter(
                        "retry.server.refused",
                        &[("reason", "too_little_time")],
                    );
                    return ServerFuture::refused(refusal(layer.wire));
                }
                Some(retries_core::door::add(retries_core::door::now(), usable))
            }
            // No deadline: no bound, but the scope still collects the
            // marker.
            None => None,
        };
        let scope = ServerScope::new(deadline, caller_owns);
        let fut = scope.enter(|| self.inner.call(request));
        ServerFuture::running(scope, fut, layer)
    }
}

/// The answer to a request with too little time left.
fn refusal<RB: Default>(wire: Wire) -> Response<RB> {
    let mut response = Response::new(RB::default());
    match wire {
        Wire::Http => {
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            response
                .headers_mut()
                .insert(NO_RETRY_NAME, HeaderValue::from_static("1"));
        }
        Wire::Grpc => {
            // DEADLINE_EXCEEDED, with A6's "do not retry".
            return trailers_only(
                "4",
                "remaining%20deadline%20too%20short%20to%20start",
                HeaderValue::from_static("-1"),
            );
        }
    }
    response
}

/// A gRPC answer with no body, its status in the headers (trailers-only),
/// `message` percent-encoded, and `grpc-retry-pushback-ms`: how this
/// crate's servers refuse (this layer, `ShedLayer`).
pub(crate) fn trailers_only<RB: Default>(
    code: &'static str,
    message: &'static str,
    pushback: HeaderValue,
) -> Response<RB> {
    let mut response = Response::new(RB::default());
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(grpc::STATUS, HeaderValue::from_static(code));
    headers.insert(grpc::MESSAGE, HeaderValue::from_static(message));
    headers.insert(grpc::PUSHBACK, pushback);
    response
}

/// Add the marker to `response`, in its protocol's words.
fn mark<RB>(wire: Wire, response: &mut Response<RB>) {
    let headers = response.headers_mut();
    match wire {
        Wire::Http => {
            headers.insert(NO_RETRY_NAME, HeaderValue::from_static("1"));
        }
        // A status in the headers (trailers-only, as tonic answers an
        // error): the pushback joins it. A success has no status here
        // and needs no marker.
        Wire::Grpc => {
            if headers
                .get(&grpc::STATUS)
                .is_some_and(|s| s.as_bytes() != b"0")
            {
                headers.insert(grpc::PUSHBACK, HeaderValue::from_static("-1"));
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`ServerService`].
    #[must_use = "futures do nothing unless awaited"]
    pub struct ServerFuture<F, RB> {
        #[pin]
        state: State<F, RB>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<F, RB> {
        /// Refused before the handler: the answer, until it is taken.
        Refused { response: Option<Response<RB>> },
        /// The handler, polled inside its scope.
        Running {
            scope: ServerScope,
            layer: ServerLayer,
            #[pin]
            fut: F,
        },
    }
}

impl<F, RB> ServerFuture<F, RB> {
    fn refused(response: Response<RB>) -> Self {
        Self {
            state: State::Refused {
                response: Some(response),
            },
        }
    }

    fn running(scope: ServerScope, fut: F, layer: ServerLayer) -> Self {
        Self {
            state: State::Running { scope, layer, fut },
        }
    }
}

impl<F, RB, E> Future for ServerFuture<F, RB>
where
    F: Future<Output = Result<Response<RB>, E>>,
{
    type Output = Result<Response<RB>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Refused { response } => {
                Poll::Ready(Ok(response.take().expect("polled after completion")))
            }
            StateProj::Running { scope, layer, fut } => {
                let out = std::task::ready!(scope.enter(|| fut.poll(cx)));
                Poll::Ready(out.map(|mut response| {
                    if layer.advise && scope.gave_up_below() {
                        mark(layer.wire, &mut response);
                    }
                    response
                }))
            }
        }
    }
}

impl<F, RB> std::fmt::Debug for ServerFuture<F, RB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let refused = matches!(self.state, State::Refused { .. });
        f.debug_struct("ServerFuture")
            .field("refused", &refused)
            .finish_non_exhaustive()
    }
}
