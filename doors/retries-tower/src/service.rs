//! The per-request service of the layer: one call of the engine per
//! request, its body replayed per attempt.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::request::Parts;
use http::{Request, Response};
use http_body::Body;

use retries_core::RetryEvent;
use retries_core::attempt::{Attempt, IdempotencyKey};
use retries_core::breaker::{Breaker, NoBreaker};
use retries_core::budget::{Budget, TokenBucket};
use retries_core::failure::Failure;
use retries_core::policy::Policy;
use retries_core::verdict::{Verdict, classify_chain_or};
use retries_http::door::{answers_with_stop, committed, declared, tell};
use retries_http::{BoxError, Deadline, FailedAttempt, Lost, NotReplayed, Replay};

use super::protocol::Judge;
#[cfg(feature = "service-config")]
use super::protocol::by_codes;
use super::{Http, NoLookup, Protocol, Reconcile, RetryLayer};

/// The service of [`RetryLayer`].
pub struct RetryService<S, P = Http, B = TokenBucket, K = NoBreaker, R = NoLookup> {
    pub(super) inner: S,
    pub(super) layer: Arc<RetryLayer<P, B, K, R>>,
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

/// How one attempt failed.
enum Failed<Res> {
    /// A response classified as a failure. Boxed: the engine keeps the
    /// last failure in every call's future, and a response (over 100
    /// bytes) would size it for the rare case.
    Response(Box<Res>, Verdict),
    /// The inner service failed.
    Inner(BoxError),
    /// `reconcile` failed.
    Reconcile(BoxError),
    /// A hedge was not sent: the body passed the cap.
    NotSent(Lost),
}

impl<ResB> retries_http::door::View for Failed<Response<ResB>> {
    fn view(&self) -> FailedAttempt<'_> {
        match self {
            Self::Response(r, _) => FailedAttempt::Response {
                status: r.status(),
                headers: r.headers(),
            },
            Self::Inner(e) | Self::Reconcile(e) => FailedAttempt::Error(&**e),
            Self::NotSent(lost) => FailedAttempt::NotSent(*lost),
        }
    }
}

impl<Res> Failed<Res> {
    fn verdict(&self) -> Verdict {
        match self {
            Self::Response(_, v) => *v,
            // Nothing was sent: the body could not be made (a `Reopen` that
            // failed to open, a file that changed, a body past the cap).
            Self::Inner(e) if e.is::<NotReplayed>() => Verdict::permanent(),
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
        let layer = Arc::clone(&self.layer);
        // What needs no await is done here, before the future is made: the
        // future holds the head once and no copy of the request (its size
        // is copied into the box, then moved by the executor).
        let (mut parts, body) = request.into_parts();
        retries_http::door::key_by_header(
            &layer.http,
            retries_http::door::method_is_idempotent(&parts.method),
            &parts.extensions,
            &mut parts.headers,
        );
        let route = parts
            .extensions
            .get::<retries_http::Route>()
            .map(|r| r.0)
            .or_else(|| layer.route.as_ref().and_then(|f| f(&parts)));
        let keyed = layer
            .http
            .keyed_target(&parts.extensions, &parts.headers, || {
                retries_http::proof::Target::of(&parts.uri, &parts.headers, route)
            })
            .map(Box::new);
        let planned = plan(&layer, &parts, keyed.as_deref());
        let mut deadline = parts.extensions.get::<Deadline>().map(|d| d.0);
        if let Some(wire) = P::request_deadline(&parts) {
            let wire = retries_core::door::add(retries_core::door::now(), wire);
            deadline = Some(deadline.map_or(wire, |d| d.min(wire)));
        }
        if !planned.idempotent
            && let Some(header) = layer.http.send_key_header()
        {
            retries_http::door::send_key(&mut parts.headers, header);
        }
        if layer.avoid_tried && parts.extensions.get::<crate::balance::Tried>().is_none() {
            parts.extensions.insert(crate::balance::Tried::new());
        }
        let replay = Replay::for_request(body, &parts.extensions, layer.http.body_cap());
        let name = P::call_name(&parts, route, layer.http.name());
        let pace = layer.http.pace_for(&parts.uri, &parts.headers);
        let keyed_rate = layer
            .http
            .rate_limit_for(&retries_http::door::Outgoing::new(
                &parts.method,
                parts.uri.authority().map_or("", |a| a.as_str()),
                parts.uri.path(),
                &parts.headers,
            ));
        let call = Call {
            layer,
            parts: Box::new(parts),
            replay,
            route,
            name,
            deadline,
            planned,
            keyed,
            pace,
            keyed_rate,
        };
        match call.planned.hedging {
            // Rare: its own future, so the common one is not as large.
            Some(hedging) => Box::pin(hedged(call, inner, hedging)),
            None => Box::pin(single(call, inner)),
        }
    }
}

/// One request as the layer took it, before its first attempt.
struct Call<P, B, K, R, ReqB> {
    layer: Arc<RetryLayer<P, B, K, R>>,
    /// Boxed: with the head inline (224 bytes), a hyper client's call
    /// future passes 1,032 bytes, the most glibc's allocator serves from
    /// its per-thread cache; its general path costs about 600 instructions
    /// for an allocation and its free, a small one a few dozen (see
    /// `tests/bench`'s README, "The layer on a busy client").
    parts: Box<Parts>,
    replay: Replay<ReqB>,
    route: Option<&'static str>,
    name: &'static retries_core::observe::Name,
    /// The request's own deadline (extension, wire), if any.
    deadline: Option<std::time::Instant>,
    planned: Planned,
    /// A keyed request's target, learned from by every answer (boxed: most
    /// requests have none, and the future stays small).
    keyed: Option<Box<retries_http::proof::Target>>,
    /// The announced quota of the server the request goes to, if it has
    /// announced one: every attempt draws from it.
    pace: Option<Arc<retries_core::limit::Pace>>,
    /// The request's own limit of a keyed rate limit, if one is set.
    keyed_rate: Option<Arc<retries_core::limit::RateLimit>>,
}

/// The policy, idempotency, judge of responses and hedging of one request.
struct Planned {
    /// A service config's policy for the request's method; `None`: the
    /// layer's own (not copied: the call's future stays small).
    policy: Option<Box<Policy>>,
    idempotent: bool,
    /// A service config's `retryableStatusCodes` or `nonFatalStatusCodes`;
    /// `None`: the layer's own judge.
    #[cfg(feature = "service-config")]
    codes: Option<crate::service_config::Codes>,
    hedging: Option<retries_core::Hedging>,
}

impl Planned {
    /// The policy of this request's call.
    fn policy<'a, P, B, K, R>(&'a self, layer: &'a RetryLayer<P, B, K, R>) -> &'a Policy {
        self.policy.as_deref().unwrap_or(&layer.policy)
    }

    /// Who judges the responses of this request.
    #[cfg_attr(not(feature = "service-config"), allow(clippy::unused_self))]
    fn judge<'a, P, B, K, R>(&self, layer: &'a RetryLayer<P, B, K, R>) -> Judge<'a> {
        #[cfg(feature = "service-config")]
        if let Some(codes) = self.codes {
            return Judge::Codes(codes);
        }
        match layer.http.retry_if() {
            Some(f) => Judge::Custom(f),
            None => Judge::Protocol,
        }
    }
}

/// Is this request safe to repeat (see the module docs for the order)? A
/// keyed request is, once its target has shown the server's mark of
/// deduplication (`retries_http::proof`).
fn idempotent<P: Protocol, B, K, R>(
    layer: &RetryLayer<P, B, K, R>,
    parts: &Parts,
    keyed: Option<&retries_http::proof::Target>,
) -> bool {
    if let Some(target) = keyed {
        return layer.http.proven(target);
    }
    if let Some(said) = declared(&parts.extensions, &parts.headers, layer.http.key_header()) {
        return said;
    }
    layer.when.as_ref().is_some_and(|f| f(parts)) || P::idempotent(parts, &layer.methods)
}

/// The policy, idempotency, judge of responses and hedging of one request:
/// a service config's for the methods it names, the layer's own otherwise.
fn plan<P: Protocol, B, K, R>(
    layer: &RetryLayer<P, B, K, R>,
    parts: &Parts,
    keyed: Option<&retries_http::proof::Target>,
) -> Planned {
    #[cfg(feature = "service-config")]
    if let Some(m) = layer
        .service
        .as_deref()
        .and_then(|c| c.method(parts.uri.path()))
    {
        let declared = declared(&parts.extensions, &parts.headers, None).unwrap_or(true);
        let policy = Some(Box::new(m.policy(layer.policy)));
        return match (m.retry_policy(), m.hedging_policy()) {
            (Some(r), _) => Planned {
                policy,
                idempotent: declared,
                codes: Some(r.retryable_codes()),
                hedging: None,
            },
            (None, Some(h)) => Planned {
                policy,
                idempotent: declared,
                codes: Some(h.non_fatal_codes()),
                hedging: declared.then(|| retries_core::Hedging::new(h.max_attempts(), h.delay())),
            },
            (None, None) => Planned {
                policy,
                idempotent: idempotent(layer, parts, keyed),
                codes: None,
                hedging: None,
            },
        };
    }
    Planned {
        policy: None,
        idempotent: idempotent(layer, parts, keyed),
        #[cfg(feature = "service-config")]
        codes: None,
        hedging: None,
    }
}

/// A hedged request: copies sent on clones of the service, each reading
/// the one replay buffer.
#[allow(clippy::manual_async_fn)] // an `async fn` would hold `req` twice
fn hedged<S, P, B, K, R, ReqB, ResB>(
    req: Call<P, B, K, R, ReqB>,
    svc: S,
    hedging: retries_core::Hedging,
) -> impl Future<Output = Result<Response<ResB>, BoxError>>
where
    S: tower_service::Service<Request<P::Body<ReqB>>, Response = Response<ResB>> + Clone,
    S::Error: Into<BoxError>,
    P: Protocol,
    B: Budget,
    K: Breaker + Clone,
    ReqB: Body + Unpin + Send + 'static,
    ReqB::Error: Into<BoxError>,
{
    async move {
        let layer = &*req.layer;
        let judge = req.planned.judge(layer);
        let spec = retries_core::call(req.planned.policy(layer))
            .name(req.name)
            .idempotent()
            .budget(Throttle::of(layer))
            .breaker(layer.breaker.clone())
            .concurrency_opt(layer.http.limit())
            .rate_limit_opt(req.keyed_rate.as_deref().or(layer.http.rate_limit()))
            .pace_opt(req.pace.as_deref())
            .on_retry(|ev: &RetryEvent<'_, Failed<Response<ResB>>>| {
                tell(layer.http.on_retry(), ev);
            })
            .classify(|e: &Failed<Response<ResB>>| e.verdict());
        let (head, buffer) = (&req.parts, &req.replay);
        let learn: Learn<'_> = (&layer.http, req.keyed.as_deref(), &req.parts);
        let hedged =
            retries_core::door::drive_hedged(spec, hedging, req.deadline, move |at: &Attempt| {
                // Each copy on a clone of the service, its body read from the
                // one replay buffer; none once the body passed the cap.
                let mut copy = svc.clone();
                let lost = buffer.lost().filter(|_| at.is_retry());
                let (head, body) = (prepared::<P>(head, at), buffer.next());
                async move {
                    if let Some(lost) = lost {
                        return Err(Failed::NotSent(lost));
                    }
                    let body = body.await.map_err(|e| Failed::Inner(Box::new(e)))?;
                    let request = move || request_for::<P, ReqB>(head, body);
                    send::<S, P, ReqB, ResB>(&mut copy, request, judge, learn).await
                }
            });
        hedged
            .await
            .or_else(|failure| answer::<P, _>(failure, req.replay.lost()))
    }
}

/// One request: one logical call of the engine. The future captures `call`
/// and reads it in place (an `async fn` would hold its arguments twice).
#[allow(clippy::manual_async_fn)]
fn single<S, P, B, K, R, ReqB, ResB>(
    req: Call<P, B, K, R, ReqB>,
    mut svc: S,
) -> impl Future<Output = Result<Response<ResB>, BoxError>>
where
    S: tower_service::Service<Request<P::Body<ReqB>>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
    P: Protocol,
    B: Budget,
    K: Breaker + Clone,
    R: Reconcile<Response<ResB>>,
    ReqB: Body + Unpin + Send + 'static,
    ReqB::Error: Into<BoxError>,
{
    async move {
        // Every part read from `req` in place: a local copy of a reference
        // is 8 more bytes in every call's future.
        let layer = &*req.layer;
        let spec = retries_core::call(req.planned.policy(layer))
            .name(req.name)
            .idempotent_if(req.planned.idempotent)
            .budget(Throttle::of(layer))
            .breaker(layer.breaker.clone())
            .concurrency_opt(layer.http.limit())
            .rate_limit_opt(req.keyed_rate.as_deref().or(layer.http.rate_limit()))
            .pace_opt(req.pace.as_deref())
            .on_retry(|ev: &RetryEvent<'_, Failed<Response<ResB>>>| {
                tell(layer.http.on_retry(), ev);
            })
            .classify(|e: &Failed<Response<ResB>>| {
                let v = e.verdict();
                if v.is_transient() && req.replay.lost().is_some() {
                    Verdict::permanent() // committed: the body cannot be sent again
                } else {
                    v
                }
            })
            .reconcile_maybe(|key| {
                let key = sent_key(layer, &req.parts).unwrap_or(key);
                layer
                    .reconcile
                    .lookup(key, &req.parts)
                    .map(|fut| async move { fut.await.map_err(Failed::Reconcile) })
            });
        // The conventions' metrics, when asked for: the call's clock and what
        // its attempts took.
        let tally = (retries_core::door::observe::METRICS
            && layer.http.metric_names() == retries_core::observe::MetricNames::OpenTelemetry)
            .then(Tally::start);
        let deadline = req.deadline;
        // The key on the wire (minted once by `send_key`, or the caller's):
        // the loop's too, so attempts, `reconcile` and hooks see the same.
        let key = sent_key(&req.layer, &req.parts);
        let outcome: Result<_, _> = retries_core::door::door_loop!(
            spec,
            deadline,
            key: key,
            Result<Response<ResB>, Failed<Response<ResB>>>,
            |at| { attempt(&mut svc, &req, tally.as_ref(), at) }
        );
        let answer = outcome.or_else(|failure| answer::<P, _>(failure, req.replay.lost()));
        if let Some(tally) = &tally {
            let busy = Duration::from_nanos(tally.busy.load(Ordering::Relaxed));
            let attempts = tally.attempts.load(Ordering::Relaxed);
            P::metric_call(
                &req.parts,
                &answer,
                retries_core::door::since(tally.t0),
                attempts,
                busy,
            );
        }
        answer
    }
}

/// What a call's attempts took, for the conventions' metrics.
struct Tally {
    /// When the call started.
    t0: std::time::Instant,
    attempts: AtomicU32,
    busy: AtomicU64,
}

impl Tally {
    fn start() -> Self {
        Self {
            t0: retries_core::door::now(),
            attempts: AtomicU32::new(0),
            busy: AtomicU64::new(0),
        }
    }
}

/// One attempt: the request as it goes on the wire, sent when the service
/// is ready, its response judged; measured for the conventions' metrics
/// when `tally` is given. The future reads its arguments in place: an
/// `async fn` would copy them into locals, and each level of nesting would
/// hold its own copy, in every call's future.
#[allow(clippy::manual_async_fn)]
fn attempt<'a, S, P, B, K, R, ReqB, ResB>(
    svc: &'a mut S,
    req: &'a Call<P, B, K, R, ReqB>,
    tally: Option<&'a Tally>,
    at: &'a Attempt,
) -> impl Future<Output = Result<Response<ResB>, Failed<Response<ResB>>>> + 'a
where
    S: tower_service::Service<Request<P::Body<ReqB>>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
    P: Protocol,
    ReqB: Body + Unpin + Send + 'static,
    ReqB::Error: Into<BoxError>,
{
    async move {
        let t0 = tally.map(|_| {
            P::metric_started(&req.parts);
            retries_core::door::now()
        });
        P::describe(&req.parts, req.route, at);
        let r = if at.is_retry()
            && let Some(lost) = req.replay.lost()
        {
            // The previous attempt was cut off at its time limit after the
            // body passed the cap: nothing can be sent again.
            Err(Failed::Inner(Box::new(NotReplayed::new(
                lost,
                "the previous attempt was cut off at its time limit".into(),
            ))))
        } else {
            // The head is cloned once the service is ready, so the time it
            // took to get ready is off the deadline the request carries.
            match req.replay.next().await {
                Ok(body) => {
                    let judge = req.planned.judge(&req.layer);
                    send::<S, P, ReqB, ResB>(
                        svc,
                        || request_for::<P, ReqB>(prepared::<P>(&req.parts, at), body),
                        judge,
                        (&req.layer.http, req.keyed.as_deref(), &req.parts),
                    )
                    .await
                }
                // Nothing can be sent: a `Reopen` that did not open.
                Err(not_sent) => Err(Failed::Inner(Box::new(not_sent))),
            }
        };
        if let (Some(tally), Some(t0)) = (tally, t0) {
            let took = retries_core::door::since(t0);
            tally.attempts.fetch_add(1, Ordering::Relaxed);
            tally.busy.fetch_add(
                u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
            let response = match &r {
                Ok(response) => Some(response),
                Err(Failed::Response(response, _)) => Some(&**response),
                Err(_) => None,
            };
            P::metric_attempt(&req.parts, req.route, response, took);
        }
        r
    }
}

/// The key sent on the wire by [`RetryLayer::send_key`], if any.
fn sent_key<P, B, K, R>(layer: &RetryLayer<P, B, K, R>, parts: &Parts) -> Option<IdempotencyKey> {
    retries_http::door::sent_key(&parts.headers, layer.http.send_key_header())
}

/// The head of one attempt's request as it goes on the wire.
fn prepared<P: Protocol>(parts: &Parts, at: &Attempt) -> Parts {
    let mut parts = parts.clone();
    P::prepare(&mut parts, at);
    parts
}

/// The request of one attempt: its head, and its body (replayed or
/// opened again, with the content type an opened body brings).
fn request_for<P: Protocol, ReqB>(
    mut parts: Parts,
    body: retries_http::ReplayBody<ReqB>,
) -> Request<P::Body<ReqB>>
where
    ReqB: Body + Unpin + Send + 'static,
    ReqB::Error: Into<BoxError>,
{
    if let Some(content_type) = body.content_type() {
        parts
            .headers
            .insert(http::header::CONTENT_TYPE, content_type.clone());
    }
    Request::from_parts(parts, P::body(body))
}

/// Send the request `make` makes when the service is ready, and judge its
/// response.
async fn send<S, P, ReqB, ResB>(
    svc: &mut S,
    make: impl FnOnce() -> Request<P::Body<ReqB>>,
    judge: Judge<'_>,
    learn: Learn<'_>,
) -> Result<Response<ResB>, Failed<Response<ResB>>>
where
    S: tower_service::Service<Request<P::Body<ReqB>>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
    P: Protocol,
{
    poll_fn(|cx| svc.poll_ready(cx))
        .await
        .map_err(|e| Failed::Inner(e.into()))?;
    let sent = learn.0.paces().map(|_| retries_core::door::now());
    let response = svc.call(make()).await.map_err(|e| {
        retries_core::door::observe::no_response();
        Failed::Inner(e.into())
    })?;
    P::describe_response(&response);
    if let (settings, Some(target), _) = learn {
        settings.learn(target, response.status(), response.headers());
    }
    if let Some(sent) = sent {
        let head = learn.2;
        learn
            .0
            .heard_from(&head.uri, &head.headers, response.headers(), sent);
    }
    let verdict = match judge {
        Judge::Protocol => P::classify(&response),
        Judge::Custom(f) => retries_http::door::judged(f, response.status(), response.headers()),
        #[cfg(feature = "service-config")]
        Judge::Codes(codes) => by_codes::<P, _>(codes, &response),
    };
    match verdict {
        None => Ok(response),
        Some(verdict) => Err(Failed::Response(Box::new(response), verdict)),
    }
}

/// What learns from an answer: the door's settings and the request's
/// target, if it is keyed (the proof of deduplication); the request's
/// head, whose server a quota announced in the answer is kept for (its
/// authority worked out only then).
type Learn<'a> = (
    &'a retries_http::door::Settings,
    Option<&'a retries_http::proof::Target>,
    &'a Parts,
);

/// The failed attempt as an error (the source of a [`Stopped`]).
fn into_box<ResB>(failed: Failed<Response<ResB>>) -> BoxError {
    match failed {
        Failed::Response(r, _) => Box::new(retries_core::http::StatusError::new(
            r.status(),
            r.headers(),
        )),
        Failed::Inner(e) | Failed::Reconcile(e) => e,
        Failed::NotSent(lost) => Box::new(NotReplayed::new(lost, "a hedge was not sent".into())),
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
    if answers_with_stop(&failure, |f| matches!(f, Failed::Response(..))) {
        return Err(P::stopped(failure.map_err(into_box).into_stopped()));
    }
    let attempts = failure.attempts();
    match failure.into_last_error() {
        Some(Failed::Response(mut response, _)) => {
            response
                .extensions_mut()
                .insert(retries_http::Ended::new(reason, attempts).with_lost(committed));
            Ok(*response)
        }
        Some(Failed::Inner(source)) => Err(match committed {
            Some(lost) if !source.is::<NotReplayed>() => Box::new(NotReplayed::new(lost, source)),
            _ => source,
        }),
        Some(Failed::Reconcile(e)) => Err(e),
        Some(failed @ Failed::NotSent(_)) => Err(into_box(failed)),
        None => Err("no attempt was made".into()),
    }
}

/// The budget a layer's call runs under: the one given with
/// [`RetryLayer::budget`] (or the layer's default bucket), a service
/// config's `retryThrottling`, or none (a service config without it).
enum Throttle<'b, B> {
    Layer(&'b B),
    #[cfg(feature = "service-config")]
    Config(&'b TokenBucket),
    #[cfg(feature = "service-config")]
    Off,
}

impl<'b, B> Throttle<'b, B> {
    fn of<P, K, R>(layer: &'b RetryLayer<P, B, K, R>) -> Self {
        #[cfg(feature = "service-config")]
        if !layer.budget_given && layer.service.is_some() {
            return layer
                .config_bucket
                .as_deref()
                .map_or(Self::Off, Self::Config);
        }
        Self::Layer(&layer.budget)
    }
}

impl<B: Budget> Budget for Throttle<'_, B> {
    #[inline]
    fn on_call(&self) {
        match self {
            Self::Layer(b) => b.on_call(),
            #[cfg(feature = "service-config")]
            Self::Config(b) => b.on_call(),
            #[cfg(feature = "service-config")]
            Self::Off => {}
        }
    }
    #[inline]
    fn on_success(&self) {
        match self {
            Self::Layer(b) => b.on_success(),
            #[cfg(feature = "service-config")]
            Self::Config(b) => b.on_success(),
            #[cfg(feature = "service-config")]
            Self::Off => {}
        }
    }
    #[inline]
    fn on_transient_failure(&self) {
        match self {
            Self::Layer(b) => b.on_transient_failure(),
            #[cfg(feature = "service-config")]
            Self::Config(b) => b.on_transient_failure(),
            #[cfg(feature = "service-config")]
            Self::Off => {}
        }
    }
    #[inline]
    fn try_retry(&self) -> bool {
        match self {
            Self::Layer(b) => b.try_retry(),
            #[cfg(feature = "service-config")]
            Self::Config(b) => b.try_retry(),
            #[cfg(feature = "service-config")]
            Self::Off => true,
        }
    }
    // A service config's throttling never gates first attempts: an
    // admission is the layer's own budget, given with `budget`.
    #[inline]
    fn admit(&self) -> bool {
        match self {
            Self::Layer(b) => b.admit(),
            #[cfg(feature = "service-config")]
            Self::Config(_) | Self::Off => true,
        }
    }
    #[inline]
    fn on_overloaded(&self) {
        match self {
            Self::Layer(b) => b.on_overloaded(),
            #[cfg(feature = "service-config")]
            Self::Config(_) | Self::Off => {}
        }
    }
}
