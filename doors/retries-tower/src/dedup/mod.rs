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
//! | no key, not required | the handler's, nothing recorded; a handler that needs the claim takes [`Claimed`] as its axum extractor (feature `axum`), which answers 400 as above ([`KeyRequired`]), never a 500 |
//! | a key that is not 1–255 printable ASCII characters (visible ones and the space, as a structured-field string allows; quoted as one, or bare) | 400 |
//! | a body over [`request_cap`](IdempotencyLayer::request_cap) (1 MiB) | 413 |
//! | a new key | the handler runs; its answer is stored and returned |
//! | a key whose run is in progress (here or on another replica) | 409 with `Retry-After`: the time until the holder's next renewal is due (at most a third of the lease; 1 s at least, and 1 s while the holder's transaction, having stored the answer, is committing) |
//! | a key run before, with the same method, path and body | the stored answer (status, headers, body), with `Idempotent-Replayed: true` |
//! | a key run before with another method, path or body | 422 |
//! | the store failed | 503 with `Retry-After: 1`: nothing ran |
//!
//! Every answer to a request with a key, the layer's own included, carries
//! `retries-deduplicated: 1` (gRPC: the same response metadata), set when
//! it is sent and never stored: the mark by which a client in keyed mode
//! (`idempotent_by_key`) learns that this route deduplicates before it
//! sends an unknown outcome again (`retries_http::proof`). Put the layer
//! in front of every replica and every route that takes keyed requests:
//! a client that gets a successful answer without the mark stops resending
//! to that route, and says so in one WARN.
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
#[cfg(feature = "axum")]
pub use retries_dedup::KeyRequired;
pub use retries_dedup::{
    Claim, Claimed, Completed, Fingerprint, Key, MemoryStore, Principal, Store, StoreError, Stored,
    Terms, Token,
};
use retries_http::BoxError;

use crate::protocol::grpc;

mod answer;
mod service;

pub use answer::KeyedBody;
#[allow(clippy::wildcard_imports)]
use answer::*;
pub use service::IdempotencyService;

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
pub(crate) struct Settings {
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
pub(crate) struct Collector {
    /// Milliseconds since `epoch`, plus a minute (0: never).
    collected: AtomicU64,
    epoch: OnceLock<Instant>,
}

/// What a service of the layer reads.
pub(crate) struct Shared<St> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use service::{key_of, next_renewal};

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
