//! The engine as a tower layer (feature `tower`): [`RetryLayer`] over any
//! `Service<http::Request<B>>`, such as a hyper-util client or (with the
//! `tonic` feature and [`RetryLayer::grpc`]) a `tonic::transport::Channel`.
//!
//! Each request is one logical call of the same engine `#[retryable]` drives,
//! under the layer's [`Policy`]: one deadline for every attempt and pause,
//! the attempt timeout and reserve, the backoff, the decision table, the
//! layer's budget and optional breaker, and the server's pushback.
//!
//! ```
//! use std::time::Duration;
//! use http::header::HeaderName;
//! use retries::{Policy, tower::RetryLayer};
//!
//! let policy = Policy::new(Duration::from_secs(2)).with_max_attempts(3);
//! // For a hyper client: a POST is retried only with an idempotency key.
//! let http = RetryLayer::new(policy)
//!     .idempotent_with_header(HeaderName::from_static("idempotency-key"));
//! // `tower_layer::Layer::layer(&http, client)`, or `ServiceBuilder::new().layer(http)`.
//! # let _ = http;
//! ```
//!
//! For a tonic channel, `RetryLayer::grpc(policy)` (feature `tonic`), with
//! the methods that are safe to repeat named:
//! `.idempotent_methods(["/payments.Payments/GetCharge"])`, then
//! `PaymentsClient::new(layer.layer(channel))`.
//!
//! # Idempotency, per request, never assumed
//!
//! A request is safe to repeat when, in this order:
//!
//! 1. it carries an [`Idempotency`] extension: that says it;
//! 2. it carries the header named by [`RetryLayer::idempotent_with_header`]
//!    (an idempotency key the server deduplicates by): yes;
//! 3. the predicate of [`RetryLayer::idempotent_when`] holds: yes;
//! 4. otherwise, for HTTP, the methods RFC 9110 defines as idempotent
//!    (`GET`, `HEAD`, `OPTIONS`, `TRACE`, `PUT`, `DELETE`) are, the others
//!    (`POST`, `PATCH`, …) are not; for gRPC, only the methods named by
//!    [`RetryLayer::idempotent_methods`] are.
//!
//! A request that is not idempotent is never repeated after an unknown
//! outcome: [`RetryLayer::reconcile`] may look it up by key (with
//! [`RetryLayer::send_key`], every attempt carries the call's key), else the
//! layer returns what the attempt returned.
//!
//! # Responses are classified
//!
//! A response is an `Ok` of the inner service, whatever its status; the layer
//! classifies it. HTTP: a status of 400 or more by the
//! [status table](crate::http) with its `Retry-After`. gRPC: a trailers-only
//! response by its `grpc-status` ([status table](crate::tonic)) and
//! `grpc-retry-pushback-ms`; any other response commits the call (its
//! headers have arrived: gRFC A6). An error of the inner service is
//! classified by its source chain ([`classify_chain`](crate::classify_chain)); a refused connection
//! is `NotExecuted`, and an error nothing recognises is `Unknown` (it may have
//! come after the request was sent).
//!
//! When the call stops, the caller gets the last response if there was one
//! (a 503 after the last attempt is returned as the 503 it is), else the last
//! error; a call stopped by its deadline or an open breaker fails with
//! [`Stopped`] (in gRPC mode a `tonic::Status`, `DEADLINE_EXCEEDED` or
//! `UNAVAILABLE`, which tonic's client passes on as it is).
//!
//! # Bodies are replayed, within a cap
//!
//! The request body is copied as it is sent, up to [`RetryLayer::body_cap`]
//! bytes (64 KiB by default); a retry sends the same bytes, a streaming body
//! included. A body larger than the cap commits the call once the cap is
//! passed: no other attempt is made, a DEBUG event says why, and an error
//! that would have been retried comes back as [`NotReplayed`].
//!
//! # Deadlines on the wire
//!
//! A request may bring its own deadline: a `grpc-timeout` header (gRPC mode)
//! or a [`Deadline`] extension. The call's deadline is the earlier of it and
//! the policy's: never extended. In gRPC mode each attempt carries
//! `grpc-timeout` (the attempt's own time left) and, on retries,
//! `grpc-previous-rpc-attempts`.
//!
//! # One owner of retries
//!
//! A request made inside an attempt of a `#[retryable]` function (or any
//! retried call, in the same task) is not retried by the layer: it makes one
//! attempt, bounded by that attempt's deadline, and the outer loop decides,
//! as for nested `#[retryable]` calls. A request the layer could not resolve
//! (a non-idempotent unknown outcome) marks the outer attempt, so the outer
//! loop does not replay it blindly either. The layer must be polled in the
//! caller's task for this (it is, unless a `tower::buffer::Buffer` sits
//! above it).
//!
//! # Costs
//!
//! Per request: the body buffer (one shared allocation, plus the chunks kept)
//! and the response future, which is boxed (the loop is an `async` block,
//! which a `Service::Future` cannot name on stable Rust). In gRPC mode, each
//! attempt's body is also boxed by `tonic::body::Body::new`.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::HeaderName;
use http::request::Parts;
use http::{HeaderValue, Request, Response};
use http_body::Body;

use crate::attempt::{Attempt, IdempotencyKey};
use crate::breaker::{Breaker, NoBreaker};
use crate::budget::{Budget, TokenBucket};
use crate::builder::call;
use crate::failure::{Failure, Stopped};
use crate::observe::Name;
use crate::policy::Policy;
use crate::replay::{
    Lost, Replay, ReplayBody, answers_with_stop, committed, declared, method_is_idempotent,
};
use crate::scope;
use crate::verdict::{Verdict, classify_chain_or};

pub use crate::replay::{BoxError, DEFAULT_CAP, Deadline, Idempotency, NotReplayed};

/// The name the layer's calls report under unless [`RetryLayer::name`] says
/// otherwise.
pub static NAME: Name = Name::new("retries::tower");

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Http {}
    #[cfg(feature = "tonic")]
    impl Sealed for super::Grpc {}
    impl Sealed for super::NoReconcile {}
    impl<F> Sealed for super::ReconcileFn<F> {}
}

/// The protocol of a [`RetryLayer`]: [`Http`] or [`Grpc`]. Sealed.
pub trait Protocol: sealed::Sealed + Clone + Send + Sync + 'static {
    /// The body of the requests the inner service takes.
    type Body<B>;
    /// The body of one attempt.
    fn body<B>(body: ReplayBody<B>) -> Self::Body<B>
    where
        B: Body + Unpin + Send + 'static,
        B::Error: Into<BoxError>;
    /// Idempotent by the protocol's own rule (after the layer's rules).
    fn idempotent(parts: &Parts, methods: &[String]) -> bool;
    /// The deadline the request brings with it, if any.
    fn request_deadline(parts: &Parts) -> Option<Duration>;
    /// Mark one attempt's request (deadline and attempt count on the wire).
    fn prepare(parts: &mut Parts, at: &Attempt);
    /// The verdict on a response, `None` for a success (or a committed call).
    fn classify<RB>(response: &Response<RB>) -> Option<Verdict>;
    /// A stop as the layer's error.
    fn stopped(stopped: Stopped) -> BoxError;
}

/// Plain HTTP: the inner service takes `http::Request<ReplayBody<B>>`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Http;

impl Protocol for Http {
    type Body<B> = ReplayBody<B>;

    fn body<B>(body: ReplayBody<B>) -> ReplayBody<B> {
        body
    }

    fn idempotent(parts: &Parts, _: &[String]) -> bool {
        method_is_idempotent(&parts.method)
    }

    fn request_deadline(_: &Parts) -> Option<Duration> {
        None
    }

    fn prepare(_: &mut Parts, _: &Attempt) {}

    fn classify<RB>(response: &Response<RB>) -> Option<Verdict> {
        let status = response.status();
        (status.is_client_error() || status.is_server_error()).then(|| {
            crate::http::classify_status(status, crate::http::retry_after(response.headers()))
        })
    }

    fn stopped(stopped: Stopped) -> BoxError {
        Box::new(stopped)
    }
}

/// gRPC over tonic (feature `tonic`): the inner service takes
/// `http::Request<tonic::body::Body>`, as a `tonic::transport::Channel` does.
#[cfg(feature = "tonic")]
#[derive(Debug, Clone, Copy, Default)]
pub struct Grpc;

#[cfg(feature = "tonic")]
impl Protocol for Grpc {
    type Body<B> = tonic::body::Body;

    fn body<B>(body: ReplayBody<B>) -> tonic::body::Body
    where
        B: Body + Unpin + Send + 'static,
        B::Error: Into<BoxError>,
    {
        tonic::body::Body::new(body)
    }

    fn idempotent(parts: &Parts, methods: &[String]) -> bool {
        let path = parts.uri.path();
        methods.iter().any(|m| {
            if m.ends_with('/') {
                path.starts_with(m.as_str())
            } else {
                path == m
            }
        })
    }

    fn request_deadline(parts: &Parts) -> Option<Duration> {
        parts
            .headers
            .get(GRPC_TIMEOUT)
            .and_then(|v| v.to_str().ok())
            .and_then(crate::tonic::parse_grpc_timeout)
    }

    fn prepare(parts: &mut Parts, at: &Attempt) {
        parts
            .headers
            .insert(GRPC_TIMEOUT, grpc_timeout(at.remaining()));
        if at.number() > 1 {
            parts.headers.insert(
                crate::tonic::PREVIOUS_ATTEMPTS,
                HeaderValue::from(at.number() - 1),
            );
        }
    }

    fn classify<RB>(response: &Response<RB>) -> Option<Verdict> {
        use crate::tonic::{PUSHBACK, classify_code, pushback_of};
        let headers = response.headers();
        match headers.get("grpc-status") {
            // Trailers-only: the call ended with this status.
            Some(code) => {
                let code = tonic::Code::from_bytes(code.as_bytes());
                (code != tonic::Code::Ok).then(|| {
                    let pushback =
                        pushback_of(headers.get_all(PUSHBACK).iter().map(|v| v.to_str().ok()));
                    classify_code(code, false, pushback)
                })
            }
            // Headers of a real response: committed (gRFC A6), unless the
            // HTTP status says no gRPC server answered.
            None if response.status().is_success() => None,
            None => Some(crate::http::classify_status(
                response.status(),
                crate::http::retry_after(headers),
            )),
        }
    }

    fn stopped(stopped: Stopped) -> BoxError {
        Box::new(tonic::Status::from(stopped))
    }
}

#[cfg(feature = "tonic")]
const GRPC_TIMEOUT: &str = "grpc-timeout";

/// `grpc-timeout` for `d`: at most 8 digits in the finest unit that holds it,
/// rounded down (never a longer timeout than the time left).
#[cfg(feature = "tonic")]
fn grpc_timeout(d: Duration) -> HeaderValue {
    const MAX: u128 = 99_999_999;
    let nanos = d.as_nanos();
    let (n, unit) = [
        (1, 'n'),
        (1_000, 'u'),
        (1_000_000, 'm'),
        (1_000_000_000, 'S'),
        (60_000_000_000, 'M'),
        (3_600_000_000_000, 'H'),
    ]
    .into_iter()
    .map(|(per, unit)| (nanos / per, unit))
    .find(|(n, _)| *n <= MAX)
    .unwrap_or((MAX, 'H'));
    HeaderValue::try_from(format!("{n}{unit}")).unwrap_or(HeaderValue::from_static("0n"))
}

/// No `reconcile` (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoReconcile;

/// A `reconcile` function; see [`RetryLayer::reconcile`].
#[derive(Debug)]
pub struct ReconcileFn<F>(Arc<F>);

impl<F> Clone for ReconcileFn<F> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

/// The `reconcile` slot of a layer whose inner service answers `Res`. Sealed.
pub trait Reconcile<Res>: sealed::Sealed + Clone + Send + Sync + 'static {
    /// One look-up.
    type Fut: Future<Output = Result<Option<Res>, BoxError>> + Send;
    /// Start a look-up for the request `parts` of the call with `key`.
    fn lookup(&self, key: IdempotencyKey, parts: &Parts) -> Option<Self::Fut>;
}

impl<Res: Send> Reconcile<Res> for NoReconcile {
    type Fut = std::future::Ready<Result<Option<Res>, BoxError>>;
    fn lookup(&self, _: IdempotencyKey, _: &Parts) -> Option<Self::Fut> {
        None
    }
}

impl<Res, F, Fut> Reconcile<Res> for ReconcileFn<F>
where
    F: Fn(IdempotencyKey, &Parts) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Option<Res>, BoxError>> + Send,
{
    type Fut = Fut;
    fn lookup(&self, key: IdempotencyKey, parts: &Parts) -> Option<Fut> {
        Some((self.0)(key, parts))
    }
}

type Predicate = Arc<dyn Fn(&Parts) -> bool + Send + Sync>;
type ResponseVerdict =
    Arc<dyn Fn(http::StatusCode, &http::HeaderMap) -> Option<Verdict> + Send + Sync>;

/// The layer: see the [module docs](self). Its budget (by default a
/// [`TokenBucket`] with the default settings) is shared by every service it
/// makes and all their clones: one per channel, as gRPC keeps it.
pub struct RetryLayer<P = Http, B = TokenBucket, K = NoBreaker, R = NoReconcile> {
    policy: Policy,
    name: &'static Name,
    cap: usize,
    key_header: Option<HeaderName>,
    send_key: Option<HeaderName>,
    when: Option<Predicate>,
    responses: Option<ResponseVerdict>,
    #[cfg(feature = "grpc-config")]
    service: Option<Arc<crate::service_config::ServiceConfig>>,
    methods: Arc<[String]>,
    limit: Option<Arc<crate::limit::Concurrency>>,
    budget: Arc<B>,
    breaker: K,
    reconcile: R,
    protocol: P,
}

impl<P: Clone, B, K: Clone, R: Clone> Clone for RetryLayer<P, B, K, R> {
    fn clone(&self) -> Self {
        Self {
            policy: self.policy,
            name: self.name,
            cap: self.cap,
            key_header: self.key_header.clone(),
            send_key: self.send_key.clone(),
            when: self.when.clone(),
            responses: self.responses.clone(),
            #[cfg(feature = "grpc-config")]
            service: self.service.clone(),
            methods: Arc::clone(&self.methods),
            limit: self.limit.clone(),
            budget: Arc::clone(&self.budget),
            breaker: self.breaker.clone(),
            reconcile: self.reconcile.clone(),
            protocol: self.protocol.clone(),
        }
    }
}

impl<P, B, K, R> std::fmt::Debug for RetryLayer<P, B, K, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryLayer")
            .field("protocol", &std::any::type_name::<P>())
            .field("policy", &self.policy)
            .field("name", &self.name.as_str())
            .field("body_cap", &self.cap)
            .field("idempotent_methods", &self.methods)
            .finish_non_exhaustive()
    }
}

impl RetryLayer {
    /// A layer for HTTP services under `policy`.
    #[must_use]
    pub fn new(policy: Policy) -> Self {
        Self::with_protocol(policy, Http)
    }
}

#[cfg(feature = "grpc-config")]
impl<K, R> RetryLayer<Grpc, TokenBucket, K, R> {
    /// Take the retry policy of each method from a gRPC service config
    /// (gRFC A6; see [`service_config`](crate::service_config)). For a
    /// method the config names (by method, by service, or by its default
    /// entry): the deadline is its `timeout` (else the layer's policy's),
    /// and with a `retryPolicy` it is retried (it is declared safe to repeat
    /// by the config, unless the request's [`Idempotency`] says otherwise)
    /// up to `maxAttempts` with A6's backoff, on its `retryableStatusCodes`
    /// only (pushback honoured); with a `hedgingPolicy` it is hedged
    /// ([`Retry::run_hedged`](crate::Retry::run_hedged): copies after each
    /// `hedgingDelay`, at once after a `nonFatalStatusCodes` answer, the
    /// first answer wins, each copy on a clone of the inner service with the
    /// same replayed body), unless the request's [`Idempotency`] says it is
    /// not safe to repeat; with neither it is not retried.
    /// Methods the config does not name follow the layer's own rules. The
    /// config's `retryThrottling` becomes the layer's budget: one bucket per
    /// channel.
    #[must_use]
    pub fn service_config(mut self, config: crate::service_config::ServiceConfig) -> Self {
        if let Some(t) = config.throttling() {
            self.budget = Arc::new(t.bucket());
        }
        self.service = Some(Arc::new(config));
        self
    }
}

#[cfg(feature = "tonic")]
impl RetryLayer<Grpc> {
    /// A layer for gRPC: tonic channels (feature `tonic`).
    #[must_use]
    pub fn grpc(policy: Policy) -> Self {
        Self::with_protocol(policy, Grpc)
    }
}

impl<P> RetryLayer<P> {
    fn with_protocol(policy: Policy, protocol: P) -> Self {
        Self {
            policy,
            name: &NAME,
            cap: DEFAULT_CAP,
            key_header: None,
            send_key: None,
            when: None,
            responses: None,
            #[cfg(feature = "grpc-config")]
            service: None,
            methods: Arc::from([]),
            limit: None,
            budget: Arc::new(TokenBucket::DEFAULT),
            breaker: NoBreaker,
            reconcile: NoReconcile,
            protocol,
        }
    }
}

impl<P, B, K, R> RetryLayer<P, B, K, R> {
    crate::replay::door_setters!();

    /// Every attempt of a request that does not carry this header already
    /// sends the call's [`IdempotencyKey`] in it: the same on every attempt,
    /// so the server can record it and [`reconcile`](Self::reconcile) look it up.
    #[must_use]
    pub fn send_key(mut self, header: HeaderName) -> Self {
        self.send_key = Some(header);
        self
    }

    /// Requests for which `f` holds are idempotent.
    #[must_use]
    pub fn idempotent_when(mut self, f: impl Fn(&Parts) -> bool + Send + Sync + 'static) -> Self {
        self.when = Some(Arc::new(f));
        self
    }

    /// Which responses are failed attempts: `f(status, headers)` returning
    /// `Some(verdict)` (a `retry_after` in it sets the pause), instead of the
    /// protocol's table. Responses are values: when the call stops, the last
    /// one is the answer, as with the table.
    ///
    /// ```
    /// use std::time::Duration;
    /// use retries::{Policy, Verdict, tower::RetryLayer};
    ///
    /// // This service answers 409 while a resource is being created: retry it.
    /// let layer = RetryLayer::new(Policy::new(Duration::from_secs(2))).retry_if(|status, _headers| {
    ///     (status == http::StatusCode::CONFLICT).then(Verdict::not_executed)
    /// });
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn retry_if(
        mut self,
        f: impl Fn(http::StatusCode, &http::HeaderMap) -> Option<Verdict> + Send + Sync + 'static,
    ) -> Self {
        self.responses = Some(Arc::new(f));
        self
    }

    /// gRPC methods that are idempotent: a full path
    /// (`"/payments.Payments/GetCharge"`), or a service's prefix ending in
    /// `/` (`"/payments.Catalog/"`) for all its methods.
    #[must_use]
    pub fn idempotent_methods<I, S>(mut self, methods: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.methods = methods.into_iter().map(Into::into).collect();
        self
    }

    /// Limit the requests in progress through this layer's services (all
    /// their clones, retries included) to `limit`'s slots; a request that
    /// gets no slot within its wait fails without being sent (see
    /// [`limit`](crate::limit)): a [`Stopped`] with
    /// [`Reason::Saturated`](crate::Reason::Saturated), in gRPC mode a
    /// `RESOURCE_EXHAUSTED` status. Pass an `Arc` to share one limit with
    /// other layers or calls.
    #[must_use]
    pub fn concurrency(mut self, limit: impl Into<Arc<crate::limit::Concurrency>>) -> Self {
        self.limit = Some(limit.into());
        self
    }

    /// Use `budget` (any [`Budget`]) instead of a token bucket of the layer's own.
    #[must_use]
    pub fn budget<B2>(self, budget: B2) -> RetryLayer<P, B2, K, R> {
        RetryLayer {
            policy: self.policy,
            name: self.name,
            cap: self.cap,
            key_header: self.key_header,
            send_key: self.send_key,
            when: self.when,
            responses: self.responses,
            #[cfg(feature = "grpc-config")]
            service: self.service,
            methods: self.methods,
            limit: self.limit,
            budget: Arc::new(budget),
            breaker: self.breaker,
            reconcile: self.reconcile,
            protocol: self.protocol,
        }
    }

    /// Put `breaker` under the loop (a reference to a `static`, or an `Arc`).
    #[must_use]
    pub fn breaker<K2>(self, breaker: K2) -> RetryLayer<P, B, K2, R> {
        RetryLayer {
            policy: self.policy,
            name: self.name,
            cap: self.cap,
            key_header: self.key_header,
            send_key: self.send_key,
            when: self.when,
            responses: self.responses,
            #[cfg(feature = "grpc-config")]
            service: self.service,
            methods: self.methods,
            limit: self.limit,
            budget: self.budget,
            breaker,
            reconcile: self.reconcile,
            protocol: self.protocol,
        }
    }

    /// Resolve an unknown outcome of a non-idempotent request: `f(key,
    /// parts)` looks up whether the work was done. `Ok(Some(response))`: it
    /// was, and that is the answer; `Ok(None)`: it was not, so the request is
    /// sent again; `Err(_)`: the layer returns the last attempt's answer.
    #[must_use]
    pub fn reconcile<F>(self, f: F) -> RetryLayer<P, B, K, ReconcileFn<F>> {
        RetryLayer {
            policy: self.policy,
            name: self.name,
            cap: self.cap,
            key_header: self.key_header,
            send_key: self.send_key,
            when: self.when,
            responses: self.responses,
            #[cfg(feature = "grpc-config")]
            service: self.service,
            methods: self.methods,
            limit: self.limit,
            budget: self.budget,
            breaker: self.breaker,
            reconcile: ReconcileFn(Arc::new(f)),
            protocol: self.protocol,
        }
    }
}

impl<S, P, B, K, R> tower_layer::Layer<S> for RetryLayer<P, B, K, R>
where
    P: Clone,
    K: Clone,
    R: Clone,
{
    type Service = RetryService<S, P, B, K, R>;

    fn layer(&self, inner: S) -> Self::Service {
        RetryService {
            inner,
            layer: Arc::new(self.clone()),
        }
    }
}

/// The service of [`RetryLayer`].
pub struct RetryService<S, P = Http, B = TokenBucket, K = NoBreaker, R = NoReconcile> {
    inner: S,
    layer: Arc<RetryLayer<P, B, K, R>>,
}

impl<S: Clone, P, B, K, R> Clone for RetryService<S, P, B, K, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: Arc::clone(&self.layer),
        }
    }
}

impl<S: std::fmt::Debug, P, B, K, R> std::fmt::Debug for RetryService<S, P, B, K, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryService")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

/// Who judges a response.
#[derive(Clone, Copy)]
enum Judge<'a> {
    /// The protocol's table.
    Protocol,
    /// The layer's `retry_if`.
    Custom(&'a ResponseVerdict),
    /// A service config's `retryableStatusCodes`.
    #[cfg(feature = "grpc-config")]
    Codes(crate::service_config::Codes),
}

/// A trailers-only gRPC response judged by a retry policy's codes: retried
/// (as an unknown outcome of a method the config declares safe to repeat,
/// with its pushback) when its code is listed, permanent otherwise; any
/// other response as the protocol judges it.
#[cfg(feature = "grpc-config")]
fn by_codes<P: Protocol, RB>(
    codes: crate::service_config::Codes,
    response: &Response<RB>,
) -> Option<Verdict> {
    use crate::tonic::{PUSHBACK, Pushback, pushback_of};
    let headers = response.headers();
    let Some(code) = headers.get("grpc-status") else {
        return P::classify(response);
    };
    let code = tonic::Code::from_bytes(code.as_bytes());
    if code == tonic::Code::Ok {
        return None;
    }
    if !codes.contains(code) {
        return Some(Verdict::permanent());
    }
    Some(
        match pushback_of(headers.get_all(PUSHBACK).iter().map(|v| v.to_str().ok())) {
            Pushback::None => Verdict::unknown(),
            Pushback::Pause(d) => Verdict::unknown().with_retry_after(d),
            Pushback::Stop => Verdict::server_refused(),
        },
    )
}

/// How one attempt failed.
enum Failed<Res> {
    /// A response classified as a failure.
    Response(Res, Verdict),
    /// The inner service failed.
    Inner(BoxError),
    /// `reconcile` failed.
    Reconcile(BoxError),
    /// A hedge was not sent: the body passed the cap.
    NotSent(Lost),
}

impl<Res> Failed<Res> {
    fn verdict(&self) -> Verdict {
        match self {
            Self::Response(_, v) => *v,
            Self::Inner(e) => classify_chain_or(&**e, Verdict::unknown()),
            Self::Reconcile(_) => Verdict::permanent(),
            // No more copies can be sent; those in flight go on.
            Self::NotSent(_) => Verdict::server_refused(),
        }
    }
}

impl<S, P, B, K, R, ReqB, ResB> tower_service::Service<Request<ReqB>>
    for RetryService<S, P, B, K, R>
where
    S: tower_service::Service<Request<P::Body<ReqB>>, Response = Response<ResB>>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    P: Protocol,
    P::Body<ReqB>: Send,
    B: Budget + Send + Sync + 'static,
    K: Breaker + Clone + Send + Sync + 'static,
    R: Reconcile<Response<ResB>>,
    ReqB: Body + Unpin + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: Send + 'static,
{
    type Response = Response<ResB>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResB>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        // The service made ready is the one to use first; keep a fresh clone.
        let fresh = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, fresh);
        Box::pin(run(Arc::clone(&self.layer), inner, request))
    }
}

/// Is this request safe to repeat (see the module docs for the order)?
fn idempotent<P: Protocol, B, K, R>(layer: &RetryLayer<P, B, K, R>, parts: &Parts) -> bool {
    if let Some(said) = declared(&parts.extensions, &parts.headers, layer.key_header.as_ref()) {
        return said;
    }
    layer.when.as_ref().is_some_and(|f| f(parts)) || P::idempotent(parts, &layer.methods)
}

/// The policy, idempotency and judge of responses of one request: a service
/// config's for the methods it names, the layer's own otherwise.
fn plan<'a, P: Protocol, B, K, R>(
    layer: &'a RetryLayer<P, B, K, R>,
    parts: &Parts,
) -> (Policy, bool, Judge<'a>, Option<crate::Hedging>) {
    let judge = match &layer.responses {
        Some(f) => Judge::Custom(f),
        None => Judge::Protocol,
    };
    #[cfg(feature = "grpc-config")]
    if let Some(m) = layer
        .service
        .as_deref()
        .and_then(|c| c.method(parts.uri.path()))
    {
        let declared = declared(&parts.extensions, &parts.headers, None).unwrap_or(true);
        return match (m.retry_policy(), m.hedging_policy()) {
            (Some(r), _) => (
                m.policy(layer.policy),
                declared,
                Judge::Codes(r.retryable_codes()),
                None,
            ),
            (None, Some(h)) => (
                m.policy(layer.policy),
                declared,
                Judge::Codes(h.non_fatal_codes()),
                declared.then(|| crate::Hedging::new(h.max_attempts(), h.delay())),
            ),
            (None, None) => (
                m.policy(layer.policy),
                idempotent(layer, parts),
                judge,
                None,
            ),
        };
    }
    (layer.policy, idempotent(layer, parts), judge, None)
}

/// One request: one logical call of the engine.
async fn run<S, P, B, K, R, ReqB, ResB>(
    layer: Arc<RetryLayer<P, B, K, R>>,
    mut svc: S,
    request: Request<ReqB>,
) -> Result<Response<ResB>, BoxError>
where
    S: tower_service::Service<Request<P::Body<ReqB>>, Response = Response<ResB>> + Clone,
    S::Error: Into<BoxError>,
    P: Protocol,
    B: Budget,
    K: Breaker + Clone,
    R: Reconcile<Response<ResB>>,
    ReqB: Body + Unpin + Send + 'static,
    ReqB::Error: Into<BoxError>,
{
    let (mut parts, body) = request.into_parts();
    let (policy, idempotent, judge, hedging) = plan(&layer, &parts);
    let mut deadline = parts.extensions.get::<Deadline>().map(|d| d.0);
    if let Some(wire) = P::request_deadline(&parts) {
        let wire = crate::attempt::add(crate::time::now(), wire);
        deadline = Some(deadline.map_or(wire, |d| d.min(wire)));
    }
    if !idempotent
        && let Some(header) = &layer.send_key
        && !parts.headers.contains_key(header)
    {
        // Minted here, not by the engine: the key must be on the first
        // attempt's wire already.
        let key = IdempotencyKey::random();
        if let Ok(v) = HeaderValue::try_from(key.to_string()) {
            parts.headers.insert(header.clone(), v);
        }
    }
    let replay = Replay::new(body, layer.cap);
    let parts = parts;

    if let Some(hedging) = hedging {
        let spec = call(&policy)
            .name(layer.name)
            .idempotent()
            .budget(&*layer.budget)
            .breaker(layer.breaker.clone())
            .concurrency_opt(layer.limit.as_deref())
            .classify(|e: &Failed<Response<ResB>>| e.verdict());
        let (head, buffer) = (&parts, &replay);
        let hedged = spec.outcome_hedged(hedging, move |at: &Attempt| {
            // Each copy on a clone of the service, its body read from the
            // one replay buffer; none once the body passed the cap.
            let mut copy = svc.clone();
            let lost = buffer.lost().filter(|_| at.is_retry());
            let request = request_for::<P, ReqB>(head, buffer, at);
            async move {
                match lost {
                    Some(lost) => Err(Failed::NotSent(lost)),
                    None => send::<S, P, ReqB, ResB>(&mut copy, request, judge).await,
                }
            }
        });
        let outcome = match deadline {
            Some(d) => scope::with_deadline(d, hedged).await,
            None => hedged.await,
        };
        return outcome.or_else(|failure| answer::<P, _>(failure, replay.lost()));
    }

    let spec = call(&policy)
        .name(layer.name)
        .idempotent_if(idempotent)
        .budget(&*layer.budget)
        .breaker(layer.breaker.clone())
        .concurrency_opt(layer.limit.as_deref())
        .classify(|e: &Failed<Response<ResB>>| {
            let v = e.verdict();
            if v.is_transient() && replay.lost().is_some() {
                Verdict::permanent() // committed: the body cannot be sent again
            } else {
                v
            }
        })
        .reconcile_maybe(|key| {
            let key = sent_key(&layer, &parts).unwrap_or(key);
            layer
                .reconcile
                .lookup(key, &parts)
                .map(|fut| async move { fut.await.map_err(Failed::Reconcile) })
        });
    let drive = async {
        crate::__retries_drive!(spec, Result<Response<ResB>, Failed<Response<ResB>>>, |at| {
            attempt::<S, P, ReqB, ResB>(&mut svc, &parts, &replay, judge, &at)
        })
    };
    let outcome = match deadline {
        Some(d) => scope::with_deadline(d, drive).await,
        None => drive.await,
    };
    outcome.or_else(|failure| answer::<P, _>(failure, replay.lost()))
}

/// The key sent on the wire by [`RetryLayer::send_key`], if any.
fn sent_key<P, B, K, R>(layer: &RetryLayer<P, B, K, R>, parts: &Parts) -> Option<IdempotencyKey> {
    let header = layer.send_key.as_ref()?;
    parts.headers.get(header)?.to_str().ok()?.parse().ok()
}

/// One attempt: the request as it goes on the wire, sent when the service is ready.
async fn attempt<S, P, ReqB, ResB>(
    svc: &mut S,
    parts: &Parts,
    replay: &Replay<ReqB>,
    judge: Judge<'_>,
    at: &Attempt,
) -> Result<Response<ResB>, Failed<Response<ResB>>>
where
    S: tower_service::Service<Request<P::Body<ReqB>>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
    P: Protocol,
    ReqB: Body + Unpin + Send + 'static,
    ReqB::Error: Into<BoxError>,
{
    if at.is_retry()
        && let Some(lost) = replay.lost()
    {
        // The previous attempt was cut off at its time limit after the body
        // passed the cap: nothing can be sent again.
        return Err(Failed::Inner(Box::new(NotReplayed {
            lost,
            source: "the previous attempt was cut off at its time limit".into(),
        })));
    }
    send::<S, P, ReqB, ResB>(svc, request_for::<P, ReqB>(parts, replay, at), judge).await
}

/// The request of one attempt: the head as it goes on the wire, the body
/// replayed.
fn request_for<P: Protocol, ReqB>(
    parts: &Parts,
    replay: &Replay<ReqB>,
    at: &Attempt,
) -> Request<P::Body<ReqB>>
where
    ReqB: Body + Unpin + Send + 'static,
    ReqB::Error: Into<BoxError>,
{
    let mut parts = parts.clone();
    P::prepare(&mut parts, at);
    Request::from_parts(parts, P::body(replay.body()))
}

/// Send one request when the service is ready, and judge its response.
async fn send<S, P, ReqB, ResB>(
    svc: &mut S,
    request: Request<P::Body<ReqB>>,
    judge: Judge<'_>,
) -> Result<Response<ResB>, Failed<Response<ResB>>>
where
    S: tower_service::Service<Request<P::Body<ReqB>>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
    P: Protocol,
{
    poll_fn(|cx| svc.poll_ready(cx))
        .await
        .map_err(|e| Failed::Inner(e.into()))?;
    let response = svc
        .call(request)
        .await
        .map_err(|e| Failed::Inner(e.into()))?;
    let verdict = match judge {
        Judge::Protocol => P::classify(&response),
        Judge::Custom(f) => f(response.status(), response.headers()),
        #[cfg(feature = "grpc-config")]
        Judge::Codes(codes) => by_codes::<P, _>(codes, &response),
    };
    match verdict {
        None => Ok(response),
        Some(verdict) => Err(Failed::Response(response, verdict)),
    }
}

/// The failed attempt as an error (the source of a [`Stopped`]).
fn into_box<ResB>(failed: Failed<Response<ResB>>) -> BoxError {
    match failed {
        Failed::Response(r, _) => Box::new(crate::http::StatusError::new(r.status(), r.headers())),
        Failed::Inner(e) | Failed::Reconcile(e) => e,
        Failed::NotSent(lost) => Box::new(NotReplayed {
            lost,
            source: "a hedge was not sent".into(),
        }),
    }
}

/// What the caller gets when the call stopped without success: the last
/// response if there was one, else the last error; a [`Stopped`] when the
/// deadline or the breaker stopped the call.
fn answer<P: Protocol, ResB>(
    failure: Failure<Failed<Response<ResB>>>,
    lost: Option<Lost>,
) -> Result<Response<ResB>, BoxError> {
    let reason = failure.reason();
    let committed = committed(reason, lost);
    if answers_with_stop(&failure) {
        return Err(P::stopped(failure.map_err(into_box).into_stopped()));
    }
    match failure.into_last_error() {
        Some(Failed::Response(response, _)) => Ok(response),
        Some(Failed::Inner(source)) => Err(match committed {
            Some(lost) if !source.is::<NotReplayed>() => Box::new(NotReplayed { lost, source }),
            _ => source,
        }),
        Some(Failed::Reconcile(e)) => Err(e),
        Some(failed @ Failed::NotSent(_)) => Err(into_box(failed)),
        None => Err("no attempt was made".into()),
    }
}
