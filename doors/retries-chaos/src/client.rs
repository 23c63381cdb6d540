//! [`ClientFaultLayer`]: faults injected on a tower client's side of the
//! wire (a hyper client, a tonic channel).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};

use super::server::{FaultBody, grpc_answer, http_answer, is_grpc};
use super::{After, Applied, Chaos, FaultKind, Injected};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A tower layer that injects a [`Chaos`]'s faults into each request a
/// client sends, below the retry layer (`RetryLayer` outside it, the
/// transport inside), so that each attempt meets them:
///
/// | fault | what the layer above gets | verdict |
/// |---|---|---|
/// | `Refuse` | an error of kind `ConnectionRefused`; nothing is sent | not executed |
/// | `Delay` | the answer, late (the request is sent after the delay) | — |
/// | `Hang` | an error of kind `TimedOut` after `max`; nothing is sent | unknown |
/// | `DropReply` | the request is sent and its answer awaited, then dropped: an error of kind `ConnectionReset` | unknown |
/// | `FailAfter` | the request is sent, its answer replaced by the rule's status (HTTP, or gRPC trailers-only) | by that status |
///
/// The errors are `std::io::Error`s whose inner error is an [`Injected`];
/// with the feature `tonic`, a gRPC request's are `tonic::Status`es
/// (`UNAVAILABLE`, `DEADLINE_EXCEEDED`) with that `io::Error` as their
/// source, as a tonic channel's own would be.
///
/// ```
/// use retries_chaos::{Chaos, ClientFaultLayer, Fault, Rule};
///
/// let chaos = Chaos::builder().rule(Rule::new(Fault::DropReply).rate(0.05)).build()?;
/// // ServiceBuilder::new().layer(RetryLayer::new(policy)).layer(ClientFaultLayer::new(chaos)).service(client)
/// let layer = ClientFaultLayer::new(chaos);
/// # let _ = layer;
/// # Ok::<(), retries_chaos::ChaosError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ClientFaultLayer {
    chaos: Chaos,
}

impl ClientFaultLayer {
    /// Inject `chaos`'s faults.
    #[must_use]
    pub const fn new(chaos: Chaos) -> Self {
        Self { chaos }
    }
}

impl<S> tower_layer::Layer<S> for ClientFaultLayer {
    type Service = ClientFaultService<S>;

    fn layer(&self, inner: S) -> ClientFaultService<S> {
        ClientFaultService {
            inner,
            chaos: self.chaos.clone(),
        }
    }
}

/// The service of [`ClientFaultLayer`].
#[derive(Debug, Clone)]
pub struct ClientFaultService<S> {
    inner: S,
    chaos: Chaos,
}

type Faulted<RB> = Pin<Box<dyn Future<Output = Result<Response<FaultBody<RB>>, BoxError>> + Send>>;

pin_project_lite::pin_project! {
    /// The future of [`ClientFaultService`]: the transport's own when no
    /// fault was drawn.
    #[project = ClientProj]
    #[allow(missing_docs)]
    pub enum ClientFaultFuture<F, RB> {
        /// No fault.
        Pass { #[pin] fut: F },
        /// A faulted request.
        Faulted { fut: Faulted<RB> },
    }
}

impl<F, RB, E> Future for ClientFaultFuture<F, RB>
where
    F: Future<Output = Result<Response<RB>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<Response<FaultBody<RB>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            ClientProj::Pass { fut } => fut.poll(cx).map(|r| {
                r.map(|response| response.map(|body| FaultBody::Inner { body }))
                    .map_err(Into::into)
            }),
            ClientProj::Faulted { fut } => fut.as_mut().poll(cx),
        }
    }
}

impl<S, B, RB> tower_service::Service<Request<B>> for ClientFaultService<S>
where
    S: tower_service::Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: Send + 'static,
    RB: Send + 'static,
{
    type Response = Response<FaultBody<RB>>;
    type Error = BoxError;
    type Future = ClientFaultFuture<S::Future, RB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let plan = self
            .chaos
            .plan(Some(request.method().as_str()), request.uri().path());
        if plan.is_empty() {
            return ClientFaultFuture::Pass {
                fut: self.inner.call(request),
            };
        }
        // The service made ready is the one to call (after a delay, maybe);
        // a fresh clone stays for the next request.
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        let chaos = self.chaos.clone();
        let grpc = is_grpc(request.headers());
        ClientFaultFuture::Faulted {
            fut: Box::pin(async move {
                let work = || async move { inner.call(request).await.map_err(Into::into) };
                match chaos.apply(plan, work).await {
                    Applied::Ran(result) => {
                        result.map(|response| response.map(|body| FaultBody::Inner { body }))
                    }
                    Applied::Hung => Err(error(grpc, io::ErrorKind::TimedOut, FaultKind::Hang)),
                    Applied::Refused(_) => Err(error(
                        grpc,
                        io::ErrorKind::ConnectionRefused,
                        FaultKind::Refuse,
                    )),
                    Applied::After(After::Drop) => Err(error(
                        grpc,
                        io::ErrorKind::ConnectionReset,
                        FaultKind::DropReply,
                    )),
                    Applied::After(After::Fail {
                        http_status,
                        grpc_code,
                    }) => Ok(if grpc {
                        grpc_answer(grpc_code, "failed after the work (injected fault)", None)
                    } else {
                        http_answer(
                            http::StatusCode::from_u16(http_status)
                                .unwrap_or(http::StatusCode::SERVICE_UNAVAILABLE),
                            None,
                        )
                    }),
                }
            }),
        }
    }
}

/// The error of an injected fault: an `io::Error` of `kind` around the
/// [`Injected`]; for gRPC with the feature `tonic`, a status with it as
/// source.
#[cfg_attr(not(feature = "tonic"), allow(unused_variables))]
fn error(grpc: bool, kind: io::ErrorKind, fault: FaultKind) -> BoxError {
    let io = io::Error::new(kind, Injected::new(fault, None));
    #[cfg(feature = "tonic")]
    if grpc {
        let code = match fault {
            FaultKind::Hang => tonic::Code::DeadlineExceeded,
            _ => tonic::Code::Unavailable,
        };
        let mut status = tonic::Status::new(code, io.to_string());
        status.set_source(std::sync::Arc::new(io));
        return Box::new(status);
    }
    Box::new(io)
}
