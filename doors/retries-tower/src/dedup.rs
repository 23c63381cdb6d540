//! The server half of exactly-once: [`IdempotencyLayer`], for axum and
//! hyper servers, runs each request's `Idempotency-Key` once and answers
//! every later request with the key from its record, as the IETF draft
//! "The Idempotency-Key HTTP Header Field" (draft-ietf-httpapi-idempotency-key-header-06)
//! describes, on any [`Store`] (in process: [`MemoryStore`]; shared by
//! replicas: `retries_sqlx::PgKeyStore`). The store's words ([`Store`],
//! [`Claim`], [`Claimed`], [`Stored`], …) are the `retries-dedup` crate's,
//! re-exported here so that a server needs one import path.
//!
//! ```
//! use std::time::Duration;
//! use retries_tower::dedup::{IdempotencyLayer, MemoryStore};
//!
//! let keys = IdempotencyLayer::new(MemoryStore::new())
//!     .required() // a POST or PATCH without a key: 400
//!     .principal(|parts| {
//!         // Keys are per tenant: no one is answered with another's record.
//!         parts.headers.get("x-tenant").and_then(|v| v.to_str().ok()).unwrap_or("").to_string()
//!     })
//!     .retention(Duration::from_hours(24));
//! // axum: `Router::new().route("/charges", post(charge)).layer(keys)`
//! # let _ = keys;
//! ```
//!
//! # What a request gets
//!
//! Requests whose method is idempotent by RFC 9110 (`GET`, `HEAD`,
//! `OPTIONS`, `TRACE`, `PUT`, `DELETE`) pass through untouched. For the
//! others (`POST`, `PATCH`, …):
//!
//! | the request | the answer |
//! |---|---|
//! | no key, the layer [`required`](IdempotencyLayer::required) one | 400, a problem document |
//! | no key, not required | the handler's, nothing recorded |
//! | a key that is not 1–255 printable ASCII characters (visible ones and the space, as a structured-field string allows; quoted as one, or bare) | 400 |
//! | a body over [`request_cap`](IdempotencyLayer::request_cap) (1 MiB) | 413 |
//! | a new key | the handler runs; its answer is stored and returned |
//! | a key whose run is in progress (here or on another replica) | 409 with `Retry-After`: the time until the holder's next renewal is due (at most a third of the lease; 1 s at least, and 1 s while the holder's transaction, having stored the answer, is committing) |
//! | a key run before, with the same method, path and body | the stored answer (status, headers, body), with `Idempotent-Replayed: true` |
//! | a key run before with another method, path or body | 422 |
//! | the store failed | 503 with `Retry-After: 1`: nothing ran |
//!
//! The handler's answer is stored whatever its status (a 4xx or a 500 is
//! the request's answer too, as Stripe keeps them), except 429 and 503:
//! those are refusals (the work was not done), so the claim is released and
//! the next request with the key runs. The record is built by
//! [`Stored::from_parts`] (a handler storing its own answer uses
//! [`Stored::from_response`] on the response it sends, so the replay cannot
//! differ from it): the headers kept are all but the connection's own
//! (`connection`, `transfer-encoding`, `content-length`, `date`, …,
//! [`Stored::keeps`]); a body over [`response_cap`](IdempotencyLayer::response_cap)
//! (1 MiB) is returned in full but stored without its body (a replay then
//! has the status and headers, and `Idempotent-Replayed: body-dropped`).
//!
//! The service under the layer takes `Request<KeyedBody<B>>` and answers
//! with any body (axum's routes and tonic's take any body; a hyper
//! `service_fn` names [`KeyedBody`]); the layer answers with
//! `Response<KeyedBody<_>>`. A request without a key is passed through with
//! its body streaming; a request with a key is read whole (to fingerprint
//! it) and its answer too (to store it).
//!
//! The handler runs in a task of its own: a client that leaves (a dropped
//! connection, a deadline) does not cut it off between its effect and its
//! record. While it runs, its claim's lease is renewed every third of the
//! lease, so a handler slower than the lease is never run a second time
//! beside it; the lease bounds only how long a dead process's claim blocks
//! its key. A handler that panics, or a service that fails without an
//! answer, leaves the claim to its lease: the key runs again after it.
//!
//! # What is guaranteed
//!
//! * **With the record in the handler's transaction** (a PostgreSQL store
//!   and `PgKeyStore::complete_in` inside the handler's transaction): the
//!   effect and its record commit together or not at all, fenced by the
//!   claim's token. A crash at any moment, a lost reply, two replicas
//!   racing: the effect happens **at most once per key**, and every retry
//!   after the commit gets its answer. (A handler whose claim passed on
//!   anyway, its renewals failing, has its transaction rolled back by the
//!   fence when it tries to commit: no duplicate.)
//! * **With the record stored after the handler** (any store, no shared
//!   transaction): two requests with a key never run at once (the claim),
//!   a lost reply is answered from the record, a second replica sees the
//!   claim (renewed while the handler runs). A crash *between* the effect and
//!   the record (or a store that fails just then) lets the key run again
//!   once the lease ends: for effects outside the database, make the effect
//!   itself keyed where you can.
//! * **In memory**: the same, for one process; a restart forgets every key.
//!
//! Records are kept for [`retention`](IdempotencyLayer::retention) (24 h,
//! as Stripe keeps keys), claims for [`lease`](IdempotencyLayer::lease)
//! (30 s); the layer collects expired records at most once a minute, in a
//! task of its own.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use retries_core::http::BoxError;
pub use retries_dedup::{
    Claim, Claimed, Completed, Fingerprint, Key, MemoryStore, Principal, Store, StoreError, Stored,
    Terms, Token,
};

use crate::protocol::grpc;

type PrincipalOf = Arc<dyn Fn(&Parts) -> String + Send + Sync>;

/// The layer: see the [module docs](self). Its clones share one store.
pub struct IdempotencyLayer<St> {
    store: Arc<St>,
    settings: Settings,
    collector: Arc<Collector>,
}

impl<St> Clone for IdempotencyLayer<St> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            settings: self.settings.clone(),
            collector: Arc::clone(&self.collector),
        }
    }
}

impl<St> std::fmt::Debug for IdempotencyLayer<St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("grpc", &self.settings.grpc)
            .field("header", &self.settings.header)
            .field("required", &self.settings.required)
            .field("terms", &self.settings.terms)
            .field("request_cap", &self.settings.request_cap)
            .field("response_cap", &self.settings.response_cap)
            .finish_non_exhaustive()
    }
}

/// The layer's settings.
#[derive(Clone)]
struct Settings {
    /// Answers in gRPC's vocabulary.
    grpc: bool,
    header: HeaderName,
    required: bool,
    principal: Option<PrincipalOf>,
    terms: Terms,
    request_cap: usize,
    response_cap: usize,
}

/// When expired records were last collected, for every service of a layer.
struct Collector {
    /// Milliseconds since `epoch`, plus a minute (0: never).
    collected: AtomicU64,
    epoch: OnceLock<Instant>,
}

/// What a service of the layer reads.
struct Shared<St> {
    store: Arc<St>,
    settings: Settings,
    collector: Arc<Collector>,
}

impl<St: Store> IdempotencyLayer<St> {
    /// A layer over `store`: the key in `Idempotency-Key`, optional, one
    /// scope for everyone, a 30 s lease, 24 h retention, 1 MiB caps.
    pub fn new(store: St) -> Self {
        Self {
            store: Arc::new(store),
            settings: Settings {
                grpc: false,
                header: HeaderName::from_static("idempotency-key"),
                required: false,
                principal: None,
                terms: Terms {
                    lease: Duration::from_secs(30),
                    retention: Duration::from_hours(24),
                },
                request_cap: 1 << 20,
                response_cap: 1 << 20,
            },
            collector: Arc::new(Collector {
                collected: AtomicU64::new(0),
                epoch: OnceLock::new(),
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Settings)) -> Self {
        f(&mut self.settings);
        self
    }

    /// For gRPC servers (tonic): the key from the `idempotency-key`
    /// metadata, the layer's own answers as trailers-only statuses (see
    /// the [module docs](self)), a handler's `RESOURCE_EXHAUSTED` or
    /// `UNAVAILABLE` released instead of recorded, and a record keeps the
    /// answer's trailers (its `grpc-status`).
    #[must_use]
    pub fn grpc(self) -> Self {
        self.edit(|s| s.grpc = true)
    }

    /// Read the key from `header` instead of `Idempotency-Key`.
    #[must_use]
    pub fn header(self, header: HeaderName) -> Self {
        self.edit(|s| s.header = header)
    }

    /// A `POST` or `PATCH` (any method not idempotent by RFC 9110) without
    /// a key is answered 400, as the draft says of a required key.
    #[must_use]
    pub fn required(self) -> Self {
        self.edit(|s| s.required = true)
    }

    /// Scope each key by `f(parts)` (a tenant, an API key): keys are unique
    /// per scope, and no request is answered with another scope's record.
    /// Without it every key is in one scope.
    #[must_use]
    pub fn principal(self, f: impl Fn(&Parts) -> String + Send + Sync + 'static) -> Self {
        self.edit(|s| s.principal = Some(Arc::new(f)))
    }

    /// How long a claim holds a key without being renewed (default 30 s):
    /// the layer renews it every third of the lease while the handler runs,
    /// so this is how long the key of a process that died stays blocked
    /// (409 to every request with it).
    #[must_use]
    pub fn lease(self, lease: Duration) -> Self {
        self.edit(|s| s.terms.lease = lease)
    }

    /// How long an answer is kept and replayed (default 24 h).
    #[must_use]
    pub fn retention(self, retention: Duration) -> Self {
        self.edit(|s| s.terms.retention = retention)
    }

    /// The largest request body taken with a key (default 1 MiB; larger:
    /// 413). The whole body is read to fingerprint it.
    #[must_use]
    pub fn request_cap(self, bytes: usize) -> Self {
        self.edit(|s| s.request_cap = bytes)
    }

    /// The largest response body stored (default 1 MiB; a larger one is
    /// stored without its body).
    #[must_use]
    pub fn response_cap(self, bytes: usize) -> Self {
        self.edit(|s| s.response_cap = bytes)
    }

    /// Wrap `inner` (an axum `Router`'s routes, a hyper service): the same
    /// as `tower_layer::Layer::layer`, without importing the trait.
    pub fn layer<S>(&self, inner: S) -> IdempotencyService<S, St> {
        IdempotencyService {
            inner,
            shared: Arc::new(Shared {
                store: Arc::clone(&self.store),
                settings: self.settings.clone(),
                collector: Arc::clone(&self.collector),
            }),
        }
    }
}

impl<S, St: Store> tower_layer::Layer<S> for IdempotencyLayer<St> {
    type Service = IdempotencyService<S, St>;
    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyLayer::layer(self, inner)
    }
}

/// The service of [`IdempotencyLayer`].
pub struct IdempotencyService<S, St> {
    inner: S,
    shared: Arc<Shared<St>>,
}

impl<S: Clone, St> Clone for IdempotencyService<S, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: std::fmt::Debug, St> std::fmt::Debug for IdempotencyService<S, St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

pin_project_lite::pin_project! {
    /// A body the layer passes on or holds whole: the request body the
    /// inner service gets (the caller's, or, for a request with a key, the
    /// bytes read to fingerprint it), and the response body of
    /// [`IdempotencyService`] (the handler's, or the one the layer holds:
    /// the handler's answer read to be stored, a replay, its own refusal).
    pub struct KeyedBody<B> {
        #[pin]
        inner: Either<B>,
    }
}

pin_project_lite::pin_project! {
    #[project = EitherProj]
    enum Either<B> {
        Passed { #[pin] body: B },
        Whole { data: Option<Bytes>, trailers: Option<HeaderMap> },
    }
}

impl<B> KeyedBody<B> {
    fn passed(body: B) -> Self {
        Self {
            inner: Either::Passed { body },
        }
    }

    fn whole(data: impl Into<Bytes>, trailers: Option<HeaderMap>) -> Self {
        let data: Bytes = data.into();
        Self {
            inner: Either::Whole {
                data: (!data.is_empty()).then_some(data),
                trailers,
            },
        }
    }
}

impl<B> Body for KeyedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().inner.project() {
            EitherProj::Passed { body } => body.poll_frame(cx).map_err(Into::into),
            EitherProj::Whole { data, trailers } => Poll::Ready(
                data.take()
                    .map(Frame::data)
                    .or_else(|| trailers.take().map(Frame::trailers))
                    .map(Ok),
            ),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Either::Passed { body } => body.is_end_stream(),
            Either::Whole { data, trailers } => data.is_none() && trailers.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Either::Passed { body } => body.size_hint(),
            Either::Whole { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

type Answer<RB, E> = Result<Response<KeyedBody<RB>>, E>;

impl<S, St, B, RB> tower_service::Service<Request<B>> for IdempotencyService<S, St>
where
    S: tower_service::Service<Request<KeyedBody<B>>, Response = Response<RB>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: Store,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<KeyedBody<RB>>;
    /// The inner service's: the layer's own failures are answers (an
    /// unreadable body 400, a handler that panicked 500), so under axum the
    /// service stays infallible.
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Answer<RB, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        let shared = Arc::clone(&self.shared);
        let (parts, body) = request.into_parts();
        let keyed = !retries_core::door::http::method_is_idempotent(&parts.method);
        let key = keyed.then(|| parts.headers.get(&shared.settings.header).cloned());
        let pass = |parts, body, mut inner: S| -> Self::Future {
            Box::pin(async move {
                let response = inner
                    .call(Request::from_parts(parts, KeyedBody::passed(body)))
                    .await?;
                Ok(response.map(KeyedBody::passed))
            })
        };
        match key {
            // Idempotent by method: nothing to deduplicate.
            None => pass(parts, body, inner),
            Some(None) if !shared.settings.required => pass(parts, body, inner),
            Some(None) => {
                retries_core::door::observe::dedup("missing");
                Box::pin(std::future::ready(Ok(shared.refuse(Refusal::Missing))))
            }
            Some(Some(value)) => Box::pin(async move {
                let Some(key) = key_of(&value) else {
                    retries_core::door::observe::dedup("missing");
                    return Ok(shared.refuse(Refusal::Malformed));
                };
                let bytes = match read(body, shared.settings.request_cap).await {
                    Ok(Some(bytes)) => bytes,
                    Ok(None) => return Ok(shared.refuse(Refusal::TooLarge)),
                    Err(_) => return Ok(shared.refuse(Refusal::Unreadable)),
                };
                poll_fn(|cx| inner.poll_ready(cx)).await?;
                keyed_call(&shared, inner, parts, bytes, &key).await
            }),
        }
    }
}

/// A request with a key: claimed, run once, answered from the record.
async fn keyed_call<S, St, B, RB>(
    shared: &Arc<Shared<St>>,
    mut inner: S,
    mut parts: Parts,
    body: Bytes,
    key: &str,
) -> Answer<RB, S::Error>
where
    S: tower_service::Service<Request<KeyedBody<B>>, Response = Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: Store,
    B: Send + 'static,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let fingerprint = Fingerprint::of(parts.method.as_str(), path, &body);
    let principal = shared.settings.principal.as_ref().map(|f| f(&parts));
    let at = Key {
        principal: principal.as_deref().unwrap_or(""),
        key,
        fingerprint: &fingerprint,
    };
    collect_if_due(shared);
    let claim = match shared.store.claim(at, shared.settings.terms).await {
        Ok(claim) => claim,
        Err(e) => {
            retries_core::door::observe::dedup_store_failed("claim", &e);
            retries_core::door::observe::dedup("refused");
            return Ok(shared.refuse(Refusal::StoreDown));
        }
    };
    let token = match claim {
        Claim::Run(token) => token,
        Claim::Answered(stored) => {
            retries_core::door::observe::dedup("replayed");
            return Ok(replay(stored));
        }
        Claim::InProgress { retry_after } => {
            retries_core::door::observe::dedup("in_progress");
            let pause = next_renewal(retry_after, shared.settings.terms.lease);
            return Ok(shared.refuse(Refusal::InProgress(pause)));
        }
        Claim::Mismatch => {
            retries_core::door::observe::dedup("mismatch");
            return Ok(shared.refuse(Refusal::Mismatch));
        }
    };
    retries_core::door::observe::dedup("run");
    let claimed = Claimed::new(at, token, shared.settings.terms);
    parts.extensions.insert(claimed.clone());
    let handler = inner.call(Request::from_parts(parts, KeyedBody::whole(body, None)));
    let task = Arc::clone(shared);
    // Its own task: a caller that leaves does not cut the handler off
    // between its effect and its record.
    let run = tokio::spawn(async move {
        let response = renewing(&task, &claimed, handler).await?;
        let (head, body) = response.into_parts();
        let Ok(body) = body.collect().await else {
            // The answer broke off: what the handler did is unknown, so the
            // claim waits out its lease.
            return Ok(task.refuse(Refusal::HandlerFailed));
        };
        let trailers = body.trailers().cloned();
        let body = body.to_bytes();
        let key = claimed.key();
        if task.refused(&head, trailers.as_ref()) {
            // A refusal: the work was not done; the next request runs it.
            if let Err(e) = task.store.release(key, token).await {
                retries_core::door::observe::dedup_store_failed("release", &e);
            }
        } else if !claimed.is_stored() {
            let answer = Stored::from_parts(
                head.status,
                &head.headers,
                &body,
                trailers.as_ref(),
                task.settings.response_cap,
            );
            if let Err(e) = task
                .store
                .complete(key, token, &answer, task.settings.terms)
                .await
            {
                retries_core::door::observe::dedup_store_failed("complete", &e);
            }
        }
        Ok(Response::from_parts(head, KeyedBody::whole(body, trailers)))
    });
    match run.await {
        Ok(answer) => answer,
        // A panic in the handler: the claim waits out its lease.
        Err(_) => Ok(shared.refuse(Refusal::HandlerFailed)),
    }
}

/// Run `handler`, renewing its claim every third of the lease while it
/// runs: a handler slower than the lease keeps its key. The renewals run
/// beside the handler, never instead of it: the handler is polled while a
/// renewal waits (on a busy store, or on the key's row that the handler's
/// own transaction holds after `complete_in`), so a renewal can neither
/// stall the handler nor be stalled by it. Each renewal is due a third of
/// the lease after the previous one *started*, so a slow store does not
/// stretch the cadence; one that fails is tried again after a twelfth of
/// the lease. A renewal that finds the claim gone is said at DEBUG
/// (`lease_lost`) and renewing stops; one that fails is said at WARN.
async fn renewing<St: Store, F: Future>(
    shared: &Shared<St>,
    claimed: &Claimed,
    handler: F,
) -> F::Output {
    let lease = shared.settings.terms.lease;
    let every = (lease / 3).max(Duration::from_millis(10));
    let again = (lease / 12).max(Duration::from_millis(5));
    let renewals = async {
        let mut due = tokio::time::Instant::now() + every;
        loop {
            tokio::time::sleep_until(due).await;
            let started = tokio::time::Instant::now();
            match shared
                .store
                .renew(claimed.key(), claimed.token(), shared.settings.terms)
                .await
            {
                Ok(true) => due = started + every,
                Ok(false) => {
                    retries_core::door::observe::dedup("lease_lost");
                    return std::future::pending::<std::convert::Infallible>().await;
                }
                Err(e) => {
                    retries_core::door::observe::dedup_store_failed("renew", &e);
                    due = tokio::time::Instant::now() + again;
                }
            }
        }
    };
    let mut handler = std::pin::pin!(handler);
    let mut renewals = std::pin::pin!(renewals);
    poll_fn(|cx| {
        if let Poll::Ready(output) = handler.as_mut().poll(cx) {
            return Poll::Ready(output);
        }
        // Never ready: it ends when the handler does.
        let _ = renewals.as_mut().poll(cx);
        Poll::Pending
    })
    .await
}

/// The pause a request is told to take while the key's holder runs: the
/// time until the holder is next expected to renew its claim (a third of
/// the lease after its last renewal, so `lease_left - 2/3 lease`). Not the
/// lease's whole time left: the holder
/// usually finishes well before its lease would run out, and a client told
/// to wait 30 s gives up instead of waiting inside a 5 s deadline.
fn next_renewal(lease_left: Duration, lease: Duration) -> Duration {
    lease_left.saturating_sub(lease.saturating_sub(lease / 3))
}

/// Collect expired records, at most once a minute, in a task of its own.
fn collect_if_due<St: Store>(shared: &Arc<Shared<St>>) {
    const EVERY_MS: u64 = 60_000;
    let epoch = *shared.collector.epoch.get_or_init(retries_core::door::now);
    let now = retries_core::door::since(epoch).as_millis() as u64 + EVERY_MS;
    let last = shared.collector.collected.load(Ordering::Relaxed);
    if now.saturating_sub(last) < EVERY_MS
        || shared
            .collector
            .collected
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        if let Err(e) = shared.store.collect().await {
            retries_core::door::observe::dedup_store_failed("collect", &e);
        }
    });
}

/// The key in a header's value: a structured-field string (`"…"`, as the
/// draft writes it) or the bare characters; 1 to 255 printable ASCII
/// (visible characters and the space, the characters a structured-field
/// string may hold; a bare key is trimmed of spaces at its ends).
fn key_of(value: &HeaderValue) -> Option<String> {
    let text = value.to_str().ok()?.trim();
    let key = match text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        Some(quoted) => {
            let mut key = String::with_capacity(quoted.len());
            let mut chars = quoted.chars();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => key.push(chars.next().filter(|c| matches!(c, '"' | '\\'))?),
                    '"' => return None,
                    c => key.push(c),
                }
            }
            key
        }
        None => text.to_string(),
    };
    let visible = key.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
    (visible && (1..=255).contains(&key.len())).then_some(key)
}

/// A body read whole, or `None` past `cap`.
async fn read<B>(body: B, cap: usize) -> Result<Option<Bytes>, BoxError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut out = BytesMut::new();
    while let Some(frame) = body.frame().await {
        if let Ok(mut data) = frame.map_err(Into::into)?.into_data() {
            if out.len() + data.remaining() > cap {
                return Ok(None);
            }
            while data.has_remaining() {
                let chunk = data.chunk();
                out.extend_from_slice(chunk);
                let n = chunk.len();
                data.advance(n);
            }
        }
    }
    Ok(Some(out.freeze()))
}

/// Stored pairs as a header map (a pair that is not a valid header is
/// left out).
fn header_map(pairs: Vec<(String, Vec<u8>)>) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(&value),
        ) {
            map.append(n, v);
        }
    }
    map
}

/// A record as the answer to a later request.
fn replay<RB>(stored: Stored) -> Response<KeyedBody<RB>> {
    let trailers = (!stored.trailers.is_empty()).then(|| header_map(stored.trailers));
    let mut response = Response::new(KeyedBody::whole(stored.body, trailers));
    *response.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let headers = response.headers_mut();
    headers.extend(header_map(stored.headers));
    headers.insert(
        retries_core::wire::REPLAYED_NAME,
        HeaderValue::from_static(if stored.body_dropped {
            "body-dropped"
        } else {
            "true"
        }),
    );
    response
}

/// Why the layer answers itself.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    Missing,
    Malformed,
    TooLarge,
    Unreadable,
    StoreDown,
    InProgress(Duration),
    Mismatch,
    HandlerFailed,
}

impl Refusal {
    /// HTTP status, gRPC code, title, detail.
    fn words(self) -> (StatusCode, u8, &'static str, &'static str) {
        match self {
            Self::Missing => (
                StatusCode::BAD_REQUEST,
                3,
                "Idempotency-Key is missing",
                "This operation requires an Idempotency-Key.",
            ),
            Self::Malformed => (
                StatusCode::BAD_REQUEST,
                3,
                "Idempotency-Key is malformed",
                "The key must be 1 to 255 printable ASCII characters (visible ones and spaces).",
            ),
            Self::TooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                3,
                "Request body too large",
                "A request with an Idempotency-Key must fit the server's cap.",
            ),
            Self::Unreadable => (
                StatusCode::BAD_REQUEST,
                3,
                "Request body unreadable",
                "The request body ended in an error.",
            ),
            Self::StoreDown => (
                StatusCode::SERVICE_UNAVAILABLE,
                14,
                "Idempotency store unavailable",
                "The request was not run; send it again later.",
            ),
            Self::InProgress(_) => (
                StatusCode::CONFLICT,
                14,
                "A request with this Idempotency-Key is being processed",
                "Send it again after the pause given.",
            ),
            Self::Mismatch => (
                StatusCode::UNPROCESSABLE_ENTITY,
                9,
                "Idempotency-Key reused",
                "This key was used for a different request.",
            ),
            Self::HandlerFailed => (
                StatusCode::INTERNAL_SERVER_ERROR,
                13,
                "Handler failed",
                "The handler stopped without a whole answer.",
            ),
        }
    }

    /// The pause a client should take before sending the key again.
    fn pause(self) -> Option<Duration> {
        match self {
            Self::InProgress(left) => Some(left),
            Self::StoreDown => Some(Duration::from_secs(1)),
            _ => None,
        }
    }
}

impl<St> Shared<St> {
    /// The layer's own answer: a problem document (RFC 9457) with
    /// `Retry-After` over HTTP; a trailers-only status with
    /// `grpc-retry-pushback-ms` over gRPC.
    fn refuse<RB>(&self, why: Refusal) -> Response<KeyedBody<RB>> {
        let (status, code, title, detail) = why.words();
        if self.settings.grpc {
            let mut response = Response::new(KeyedBody::whole(Bytes::new(), None));
            let h = response.headers_mut();
            h.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            h.insert(grpc::STATUS, HeaderValue::from(u16::from(code)));
            h.insert(grpc::MESSAGE, HeaderValue::from_static(title));
            if let Some(pause) = why.pause() {
                let ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX).max(1);
                h.insert(grpc::PUSHBACK, HeaderValue::from(ms));
            }
            return response;
        }
        let body = format!(
            "{{\"type\":\"about:blank\",\"title\":\"{title}\",\"status\":{},\"detail\":\"{detail}\"}}",
            status.as_u16()
        );
        let mut response = Response::new(KeyedBody::whole(body, None));
        *response.status_mut() = status;
        let h = response.headers_mut();
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(pause) = why.pause() {
            let secs = pause.as_secs() + u64::from(pause.subsec_nanos() > 0);
            h.insert(http::header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        response
    }

    /// Did the handler refuse (the work not done), so that the key is
    /// released instead of recorded? HTTP 429 and 503; gRPC
    /// `RESOURCE_EXHAUSTED` and `UNAVAILABLE`.
    fn refused(&self, head: &http::response::Parts, trailers: Option<&HeaderMap>) -> bool {
        if self.settings.grpc {
            let code = head
                .headers
                .get(&grpc::STATUS)
                .or_else(|| trailers.and_then(|t| t.get(&grpc::STATUS)));
            return code.is_some_and(|c| c == "8" || c == "14");
        }
        matches!(head.status.as_u16(), 429 | 503)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_on_a_clone_applies_to_that_clone_and_the_store_is_shared() {
        let a = IdempotencyLayer::new(MemoryStore::new());
        let b = a.clone().lease(Duration::from_secs(5)).required();
        assert_eq!(a.settings.terms.lease, Duration::from_secs(30));
        assert_eq!(b.settings.terms.lease, Duration::from_secs(5));
        assert!(b.settings.required && !a.settings.required);
        assert!(Arc::ptr_eq(&a.store, &b.store));
    }

    #[test]
    fn a_key_in_progress_is_polled_at_the_holders_next_renewal() {
        let lease = Duration::from_secs(30);
        let secs = Duration::from_secs;
        // Renewed just now: next renewal in 10 s.
        assert_eq!(next_renewal(secs(30), lease), secs(10));
        // Renewed 4 s ago: in 6 s.
        assert_eq!(next_renewal(secs(26), lease), secs(6));
        // A renewal overdue (the holder slow or gone): at once (the answer
        // says 1 s), never the lease's time left.
        assert_eq!(next_renewal(secs(15), lease), Duration::ZERO);
        assert_eq!(next_renewal(Duration::ZERO, lease), Duration::ZERO);
    }

    #[test]
    fn a_key_is_a_structured_string_or_bare_visible_ascii() {
        let key = |s: &str| key_of(&HeaderValue::from_str(s).unwrap());
        assert_eq!(key("\"8e03978e-40d5\"").as_deref(), Some("8e03978e-40d5"));
        assert_eq!(key("8e03978e-40d5").as_deref(), Some("8e03978e-40d5"));
        assert_eq!(key("\"a\\\"b\"").as_deref(), Some("a\"b"));
        assert_eq!(
            key("\"a b\"").as_deref(),
            Some("a b"),
            "a space is printable"
        );
        assert_eq!(key("\"\""), None);
        assert_eq!(key("\"a\"b\""), None);
        assert_eq!(key(&"k".repeat(256)), None);
        assert_eq!(key(&"k".repeat(255)).map(|k| k.len()), Some(255));
    }
}
