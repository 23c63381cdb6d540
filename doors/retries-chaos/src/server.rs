//! [`FaultLayer`]: faults injected in a server (axum, hyper, tonic).

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};

use super::{After, Chaos, FaultKind, Plan};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A tower layer that injects a [`Chaos`]'s faults into a server's
/// requests: with axum `Router::layer`, hyper's `ServiceBuilder`, tonic's
/// `Server::builder().layer`. See the [module docs](super) for what each
/// fault does on the wire.
///
/// Put it outside the handler and inside what should see the faults as the
/// client would (a `wire::ServerLayer` outside it sees a refusal as the
/// handler's answer). The answer's body becomes a [`FaultBody`] around the
/// service's own.
///
/// **With `IdempotencyLayer`** (`retries_tower::dedup`), put `FaultLayer`
/// outside it: a reply dropped there is lost after the key's record was
/// stored, as a network loses it, and the client's retry gets the replay.
/// Inside it, the faults before the work (refuse, delay, hang) still apply
/// (a refusal releases the key), but a fault after the work would look to
/// the idempotency layer like a handler that failed (a lost reply: 500) or
/// refused (a 503: the key run again), so none is injected on a request
/// that carries its claim, and one WARN says so.
///
/// ```
/// use retries_chaos::{Chaos, Fault, FaultLayer, Rule};
///
/// let chaos = Chaos::builder()
///     .seed(1)
///     .rule(Rule::new(Fault::DropReply).rate(0.2).only(["POST /charges"]))
///     .build()?;
/// let layer = FaultLayer::new(chaos.clone());
/// // axum: Router::new().route("/charges", post(charge)).layer(layer);
/// // tonic: Server::builder().layer(layer).add_service(svc);
/// # let _ = layer;
/// # Ok::<(), retries_chaos::ChaosError>(())
/// ```
#[derive(Debug, Clone)]
pub struct FaultLayer {
    chaos: Chaos,
}

impl FaultLayer {
    /// Inject `chaos`'s faults.
    #[must_use]
    pub const fn new(chaos: Chaos) -> Self {
        Self { chaos }
    }
}

impl<S> tower_layer::Layer<S> for FaultLayer {
    type Service = FaultService<S>;

    fn layer(&self, inner: S) -> FaultService<S> {
        FaultService {
            inner,
            chaos: self.chaos.clone(),
        }
    }
}

/// The service of [`FaultLayer`].
#[derive(Debug, Clone)]
pub struct FaultService<S> {
    inner: S,
    chaos: Chaos,
}

impl<S, B, RB> tower_service::Service<Request<B>> for FaultService<S>
where
    S: tower_service::Service<Request<B>, Response = Response<RB>>,
{
    type Response = Response<FaultBody<RB>>;
    type Error = S::Error;
    type Future = FaultFuture<S::Future, RB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // Inside an idempotency layer (the request carries its claim), no
        // fault after the work: see `Chaos::plan_with`.
        let inside_dedup = request
            .extensions()
            .get::<retries_dedup::Claimed>()
            .is_some();
        let plan = self.chaos.plan_with(
            Some(request.method().as_str()),
            request.uri().path(),
            !inside_dedup,
        );
        if plan.is_empty() {
            return FaultFuture::pass(self.inner.call(request));
        }
        let grpc = is_grpc(request.headers());
        // A hang lasts until the caller's deadline on the wire, at most its
        // bound.
        let plan = Plan {
            hang: plan.hang.map(|(i, max)| {
                let wire = retries_core::wire::incoming_timeout(request.headers());
                (i, wire.map_or(max, |w| w.min(max)))
            }),
            ..plan
        };
        // The handler is called only when it will run.
        let fut = (plan.hang.is_none() && plan.refuse.is_none()).then(|| self.inner.call(request));
        FaultFuture {
            fut,
            sleep: None,
            step: Step::Start,
            plan,
            chaos: Some(self.chaos.clone()),
            grpc,
            hanging: None,
            arrived: Some(tokio::time::Instant::now()),
            _body: PhantomData,
        }
    }
}

/// Where a faulted request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Start,
    Delaying,
    Hanging,
    Handler,
}

pin_project_lite::pin_project! {
    /// The future of [`FaultService`].
    #[project = FaultProj]
    pub struct FaultFuture<F, RB> {
        #[pin]
        fut: Option<F>,
        #[pin]
        sleep: Option<tokio::time::Sleep>,
        step: Step,
        plan: Plan,
        // `None` on a request with no fault.
        chaos: Option<Chaos>,
        grpc: bool,
        // The rule of a hang in progress (counted as observed when it ends,
        // also by a caller leaving).
        hanging: Option<usize>,
        // When a faulted request arrived (a hang ends by the caller's
        // deadline counted from then, after any delay).
        arrived: Option<tokio::time::Instant>,
        _body: PhantomData<fn() -> RB>,
    }

    impl<F, RB> PinnedDrop for FaultFuture<F, RB> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let (Some(rule), Some(chaos)) = (this.hanging.take(), this.chaos.as_ref()) {
                chaos.observed(rule);
            }
        }
    }
}

impl<F, RB> FaultFuture<F, RB> {
    fn pass(fut: F) -> Self {
        Self {
            fut: Some(fut),
            sleep: None,
            step: Step::Handler,
            plan: Plan::default(),
            chaos: None,
            grpc: false,
            hanging: None,
            arrived: None,
            _body: PhantomData,
        }
    }
}

impl<F, RB, E> Future for FaultFuture<F, RB>
where
    F: Future<Output = Result<Response<RB>, E>>,
{
    type Output = Result<Response<FaultBody<RB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match *this.step {
                Step::Start => {
                    if let Some((_, d)) = this.plan.delay {
                        this.sleep.set(Some(tokio::time::sleep(d)));
                        *this.step = Step::Delaying;
                    } else {
                        *this.step = Step::Handler;
                        if let Some(answer) = before(&mut this) {
                            return Poll::Ready(Ok(answer));
                        }
                    }
                }
                Step::Delaying => {
                    if let Some(sleep) = this.sleep.as_mut().as_pin_mut() {
                        ready!(sleep.poll(cx));
                    }
                    this.sleep.set(None);
                    if let (Some((i, _)), Some(chaos)) = (this.plan.delay, this.chaos.as_ref()) {
                        chaos.observed(i);
                    }
                    *this.step = Step::Handler;
                    if let Some(answer) = before(&mut this) {
                        return Poll::Ready(Ok(answer));
                    }
                }
                Step::Hanging => {
                    if let Some(sleep) = this.sleep.as_mut().as_pin_mut() {
                        ready!(sleep.poll(cx));
                    }
                    this.sleep.set(None);
                    if let (Some(rule), Some(chaos)) = (this.hanging.take(), this.chaos.as_ref()) {
                        chaos.observed(rule);
                    }
                    return Poll::Ready(Ok(if *this.grpc {
                        grpc_answer(4, "no answer in time (injected fault)", None)
                    } else {
                        http_answer(StatusCode::GATEWAY_TIMEOUT, None)
                    }));
                }
                Step::Handler => {
                    let Some(fut) = this.fut.as_mut().as_pin_mut() else {
                        // Not reached: a hang or a refusal answered first.
                        return Poll::Pending;
                    };
                    let response = ready!(fut.poll(cx))?;
                    this.fut.set(None);
                    let (Some(chaos), Some((rule, after))) = (this.chaos.as_ref(), this.plan.after)
                    else {
                        return Poll::Ready(Ok(response.map(|body| FaultBody::Inner { body })));
                    };
                    return Poll::Ready(Ok(match after {
                        After::Drop => response.map(|_| FaultBody::Cut {
                            chaos: Some((chaos.clone(), rule)),
                        }),
                        After::Fail {
                            http_status,
                            grpc_code,
                        } => {
                            // The handler's answer is dropped: its work is done.
                            drop(response);
                            chaos.observed(rule);
                            if *this.grpc {
                                grpc_answer(
                                    grpc_code,
                                    "failed after the work (injected fault)",
                                    None,
                                )
                            } else {
                                http_answer(
                                    StatusCode::from_u16(http_status)
                                        .unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
                                    None,
                                )
                            }
                        }
                    }));
                }
            }
        }
    }
}

/// After the delay: a hang starts, a refusal answers, or the handler runs.
fn before<F, RB>(this: &mut FaultProj<'_, F, RB>) -> Option<Response<FaultBody<RB>>> {
    let chaos = this.chaos.as_ref()?;
    // A hang is counted as observed when it ends (also by its caller
    // leaving: see the drop).
    if let Some((rule, wait)) = this.plan.hang {
        *this.hanging = Some(rule);
        // From arrival; a bound too far to add is as good as forever.
        let sleep = match this.arrived.and_then(|t| t.checked_add(wait)) {
            Some(until) => tokio::time::sleep_until(until),
            None => tokio::time::sleep(wait),
        };
        this.sleep.set(Some(sleep));
        *this.step = Step::Hanging;
        return None;
    }
    let (rule, retry_after) = this.plan.refuse?;
    chaos.observed(rule);
    Some(if *this.grpc {
        grpc_answer(14, "refused before the work (injected fault)", retry_after)
    } else {
        // Always with `Retry-After` (0 unless a pause is given): without it
        // a 503 is an unknown outcome to a client, which would not resend a
        // `POST` that was refused before any work.
        http_answer(
            StatusCode::SERVICE_UNAVAILABLE,
            Some(retry_after.unwrap_or_default()),
        )
    })
}

/// Whether a request is gRPC (by its `content-type`).
pub(super) fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// An HTTP answer with an empty body, and `Retry-After` (whole seconds,
/// rounded up) when given.
pub(super) fn http_answer<RB>(
    status: StatusCode,
    retry_after: Option<Duration>,
) -> Response<FaultBody<RB>> {
    let mut response = Response::new(FaultBody::Empty);
    *response.status_mut() = status;
    if let Some(d) = retry_after {
        let secs = d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0));
        response
            .headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// A trailers-only gRPC answer with `code`, and `grpc-retry-pushback-ms`
/// when a pause is given.
pub(super) fn grpc_answer<RB>(
    code: u8,
    message: &'static str,
    pushback: Option<Duration>,
) -> Response<FaultBody<RB>> {
    let mut response = Response::new(FaultBody::Empty);
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", HeaderValue::from(u16::from(code)));
    if let Ok(v) = HeaderValue::from_str(&message.replace(' ', "%20")) {
        headers.insert("grpc-message", v);
    }
    if let Some(d) = pushback {
        headers.insert(
            http::HeaderName::from_static("grpc-retry-pushback-ms"),
            HeaderValue::from(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        );
    }
    response
}

pin_project_lite::pin_project! {
    /// The body of an answer through [`FaultLayer`]: the service's own, an
    /// injected answer's (empty), or a reply being dropped (an error at its
    /// first frame, which makes hyper close the connection or reset the
    /// stream).
    #[project = BodyProj]
    #[allow(missing_docs)]
    pub enum FaultBody<B> {
        /// The service's body.
        Inner { #[pin] body: B },
        /// An injected answer's.
        Empty,
        /// A reply being dropped.
        Cut { chaos: Option<(Chaos, usize)> },
    }
}

impl<B: std::fmt::Debug> std::fmt::Debug for FaultBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Inner { body } => f.debug_tuple("Inner").field(body).finish(),
            Self::Empty => f.write_str("Empty"),
            Self::Cut { .. } => f.write_str("Cut"),
        }
    }
}

/// An empty body (an injected answer's), so that layers which make their
/// own answers (`wire::ServerLayer`, `ShedLayer`) can sit outside this one.
impl<B> Default for FaultBody<B> {
    fn default() -> Self {
        Self::Empty
    }
}

impl<B> Body for FaultBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, BoxError>>> {
        match self.project() {
            BodyProj::Inner { body } => body.poll_frame(cx).map_err(Into::into),
            BodyProj::Empty => Poll::Ready(None),
            BodyProj::Cut { chaos } => {
                if let Some((chaos, rule)) = chaos.take() {
                    chaos.observed(rule);
                }
                Poll::Ready(Some(Err(Box::new(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    super::Injected::new(FaultKind::DropReply, None),
                )))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Inner { body } => body.is_end_stream(),
            Self::Empty => true,
            Self::Cut { .. } => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Inner { body } => body.size_hint(),
            Self::Empty => SizeHint::with_exact(0),
            Self::Cut { .. } => SizeHint::default(),
        }
    }
}
