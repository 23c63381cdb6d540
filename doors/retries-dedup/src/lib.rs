//! The server half of exactly-once for `retries`: requests deduplicated by
//! their idempotency key, whatever framework serves them.
//!
//! Every client door can put a call's key on the wire (`send_key`,
//! `idempotent_by_key`) and repeat a request whose outcome is unknown; that
//! is safe only if the server runs each key once and answers every later
//! request with that key from a record. This crate holds what such a
//! server needs, framework-free: the [`Store`] of key records (one trait; an
//! in-process [`MemoryStore`] here, a PostgreSQL store shared by every
//! replica in `retries-sqlx`), the [`Claim`] a request gets from it, the
//! [`Stored`] answer, and the request's [`Fingerprint`]. The server layer
//! that uses them for axum, hyper and tonic is `retries-tower`'s
//! `dedup::IdempotencyLayer`.
//!
//! # One key's life
//!
//! 1. **Claimed**: the first request with a key (in a [`Principal`]: a tenant,
//!    an API key, so no one is answered with another's record) takes the
//!    key with a random [`Token`] for a *lease*, and runs.
//! 2. **Done**: its answer is stored ([`Store::complete`], fenced by the
//!    token: a run whose lease passed to another request stores nothing)
//!    and kept for the *retention*. With a store that can, the answer is
//!    stored in the same database transaction as the handler's own writes
//!    (`retries-sqlx`'s `PgKeyStore::complete_in`): the effect and its
//!    record commit together or not at all.
//! 3. Every later request with the key and the same fingerprint gets the
//!    stored answer ([`Claim::Answered`]); one with another fingerprint (the
//!    key reused for a different request) [`Claim::Mismatch`]; one while
//!    the first still runs [`Claim::InProgress`] with the lease's time left.
//! 4. While the handler runs, the layer renews its lease
//!    ([`Store::renew`], every third of the lease), so a slow handler is
//!    never run twice side by side. A claim whose lease ran out with no
//!    answer stored (its process crashed) passes to the next request with
//!    the key and the same fingerprint, which runs. A record past its retention is
//!    collected ([`Store::collect`]) and its key is new again.
//!
//! What is guaranteed, by store and mode, is said where the layer is
//! (`retries_tower::dedup`).
//!
//! # Why a crate of its own
//!
//! Nothing here is the retry loop: a key store is what the server doors
//! share (`retries-tower`'s `IdempotencyLayer`, `retries-sqlx`'s
//! `PgKeyStore`, a store a third party writes), so it lives in a crate those
//! doors share, not in `retries-core` (its rule: the core holds the loop and
//! the words a call needs). It reads the core's clock alone
//! (`retries_core::door::now`), so a test's paused tokio clock moves leases.
//! Feature `http`: [`Stored`] built from an `http` 1 response. Feature
//! `axum-0.8`: [`Claimed`] as an axum extractor, whose rejection is the 400
//! of a missing key (`KeyRequired`), never the 500 of a missing extension.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "axum-0.8")]
mod axum;
#[cfg(feature = "axum-0.8")]
pub use axum::KeyRequired;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
#[cfg(not(loom))]
use std::sync::{Mutex, MutexGuard, atomic::AtomicBool};
use std::time::{Duration, Instant};

// The store's lock and the claim's flag are `loom`'s in the model-checking
// build (`loom_models.rs`; CI: `RUSTFLAGS="--cfg loom" cargo test -p
// retries-dedup --lib --release loom`).
#[cfg(loom)]
use loom::sync::{Mutex, MutexGuard, atomic::AtomicBool};

/// Who a key belongs to: keys are unique per principal, and a record is never
/// replayed to another principal. The empty principal is one for everyone.
pub type Principal = str;

/// The token of one claim: random, so a run that lost its lease cannot
/// store its answer over the run that took the key after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token(u64);

impl Token {
    /// A fresh random token.
    #[must_use]
    pub fn random() -> Self {
        Self(rand::random())
    }

    /// The token from its stored form.
    #[must_use]
    pub const fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The token's stored form.
    #[must_use]
    pub const fn raw(self) -> u64 {
        self.0
    }
}

/// What identifies a request beside its key: its method, its path and its
/// body, hashed (128-bit FNV-1a: stable across processes, builds and Rust
/// versions, so replicas of different builds agree). A key sent again with
/// another fingerprint is a different request under a reused key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// The fingerprint of a request: `method`, `path` (the resource, with
    /// its query) and the whole `body`.
    #[must_use]
    pub fn of(method: &str, path: &str, body: &[u8]) -> Self {
        const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
        const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
        let hash = body
            .iter()
            .fold(OFFSET, |h, b| (h ^ u128::from(*b)).wrapping_mul(PRIME));
        Self(format!("{method} {path} {}:{hash:032x}", body.len()))
    }

    /// A fingerprint from its stored form.
    #[must_use]
    pub fn from_stored(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// Its stored form.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// One key of one principal, as a request brings it.
#[derive(Debug, Clone, Copy)]
pub struct Key<'a> {
    /// Whose key it is.
    pub principal: &'a Principal,
    /// The key, as sent.
    pub key: &'a str,
    /// The request that brought it.
    pub fingerprint: &'a Fingerprint,
}

/// How long a claim and a record last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    /// How long a claim holds the key without an answer stored: longer than
    /// the handler's longest run (a run past it may run twice).
    pub lease: Duration,
    /// How long an answer is kept and replayed.
    pub retention: Duration,
}

/// A stored answer: what every later request with the key gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The status code (an HTTP status; a gRPC answer is stored as the HTTP
    /// response that carries it).
    pub status: u16,
    /// The headers kept (names in lower case), in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body; empty when [`body_dropped`](Self::body_dropped).
    pub body: Vec<u8>,
    /// The trailers kept (a gRPC answer's `grpc-status`), in order.
    pub trailers: Vec<(String, Vec<u8>)>,
    /// The body was over the store's cap, so only the status and headers
    /// are kept.
    pub body_dropped: bool,
}

#[cfg(feature = "http")]
impl Stored {
    /// The record of `response`, exactly as the layer would keep it: the
    /// status, the headers but the connection's own and `date` (see
    /// [`keeps`](Self::keeps)), the body. The one way to build the answer a
    /// handler stores itself (`retries_sqlx::PgKeyStore::complete_in`):
    /// build the response first, store its record, send the same response,
    /// so the replay cannot differ from the first answer.
    ///
    /// ```
    /// use http::{Response, StatusCode, header::CONTENT_TYPE};
    /// use retries_dedup::Stored;
    ///
    /// let response = Response::builder()
    ///     .status(StatusCode::CREATED)
    ///     .header(CONTENT_TYPE, "application/json")
    ///     .header("connection", "keep-alive")
    ///     .body(r#"{"charge":7}"#)
    ///     .unwrap();
    /// let stored = Stored::from_response(&response);
    /// assert_eq!(stored.status, 201);
    /// assert_eq!(stored.headers, [("content-type".to_string(), b"application/json".to_vec())]);
    /// assert_eq!(stored.body, br#"{"charge":7}"#);
    /// ```
    #[must_use]
    pub fn from_response<B: AsRef<[u8]>>(response: &http::Response<B>) -> Self {
        Self::from_parts(
            response.status(),
            response.headers(),
            response.body().as_ref(),
            None,
            usize::MAX,
        )
    }

    /// The record of an answer's parts; a body over `cap` bytes is left out
    /// ([`body_dropped`](Self::body_dropped)).
    #[must_use]
    pub fn from_parts(
        status: http::StatusCode,
        headers: &http::HeaderMap,
        body: &[u8],
        trailers: Option<&http::HeaderMap>,
        cap: usize,
    ) -> Self {
        let body_dropped = body.len() > cap;
        let pairs = |map: &http::HeaderMap| {
            map.iter()
                .filter(|(n, _)| Self::keeps(n))
                .map(|(n, v)| (n.as_str().to_string(), v.as_bytes().to_vec()))
                .collect()
        };
        Self {
            status: status.as_u16(),
            headers: pairs(headers),
            body: if body_dropped {
                Vec::new()
            } else {
                body.to_vec()
            },
            trailers: trailers.map(pairs).unwrap_or_default(),
            body_dropped,
        }
    }

    /// Whether a record keeps the header `name`: every header but the
    /// connection's own (hop-by-hop: `connection`, `keep-alive`,
    /// `proxy-connection`, `transfer-encoding`, `te`, `trailer`, `upgrade`),
    /// `content-length` (the replay's framing is its own) and `date` (a
    /// replay is dated when it is sent).
    #[must_use]
    pub fn keeps(name: &http::HeaderName) -> bool {
        !matches!(
            name.as_str(),
            "connection"
                | "keep-alive"
                | "proxy-connection"
                | "transfer-encoding"
                | "te"
                | "trailer"
                | "upgrade"
                | "content-length"
                | "date"
        )
    }
}

impl Stored {
    /// Header pairs (the headers, or the trailers) in one byte string, as
    /// a store keeps them: for each, the name's length (2 bytes), the
    /// name, the value's length (4 bytes), the value; big-endian.
    #[must_use]
    pub fn encode_headers(pairs: &[(String, Vec<u8>)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, value) in pairs {
            out.extend_from_slice(&(name.len() as u16).to_be_bytes());
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&(value.len() as u32).to_be_bytes());
            out.extend_from_slice(value);
        }
        out
    }

    /// The headers from [`encode_headers`](Self::encode_headers)'s form.
    pub fn decode_headers(mut bytes: &[u8]) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        fn take<'b>(bytes: &mut &'b [u8], n: usize) -> Result<&'b [u8], StoreError> {
            if bytes.len() < n {
                return Err(StoreError::Corrupt("a stored header is cut short"));
            }
            let (head, rest) = bytes.split_at(n);
            *bytes = rest;
            Ok(head)
        }
        let mut headers = Vec::new();
        while !bytes.is_empty() {
            let n = u16::from_be_bytes(take(&mut bytes, 2)?.try_into().unwrap_or_default());
            let name = std::str::from_utf8(take(&mut bytes, usize::from(n))?)
                .map_err(|_| StoreError::Corrupt("a stored header name is not UTF-8"))?
                .to_string();
            let n = u32::from_be_bytes(take(&mut bytes, 4)?.try_into().unwrap_or_default());
            let value = take(&mut bytes, n as usize)?.to_vec();
            headers.push((name, value));
        }
        Ok(headers)
    }
}

/// The title and detail of the answer to a request that needs a key and
/// carries none: the idempotency layer's 400 and `KeyRequired`'s (feature
/// `axum-0.8`) are one text.
pub const KEY_MISSING: (&str, &str) = (
    "Idempotency-Key is missing",
    "This operation requires an Idempotency-Key.",
);

/// A problem document (RFC 9457, `application/problem+json`) of a server
/// door's own answer: `status`, `title`, `detail` (plain text, no quotes).
#[must_use]
pub fn problem(status: u16, title: &str, detail: &str) -> String {
    format!(
        "{{\"type\":\"about:blank\",\"title\":\"{title}\",\"status\":{status},\"detail\":\"{detail}\"}}"
    )
}

/// What a request with a key gets from the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The key is this request's: run it, then store its answer with the
    /// token.
    Run(Token),
    /// The key was run: this is its answer.
    Answered(Stored),
    /// Another request with the key is running; its lease ends in
    /// `retry_after`.
    InProgress {
        /// The time left on the running request's lease.
        retry_after: Duration,
    },
    /// The key was used for a request with another fingerprint.
    Mismatch,
}

/// What storing an answer did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completed {
    /// The answer is the key's record.
    Stored,
    /// The claim had passed to another request (its lease ran out), or the
    /// record was already stored under the token (in the handler's own
    /// transaction): nothing was written.
    NotHeld,
}

/// A store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A bounded store is full of records still kept and claims still held.
    #[error("the idempotency store is full ({0} keys)")]
    Full(usize),
    /// A stored record cannot be read.
    #[error("a stored idempotency record is corrupt: {0}")]
    Corrupt(&'static str),
    /// The store's backend failed (a database error, a lost connection).
    #[error("the idempotency store failed: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Where key records live: one trait for every backend. Each method is one
/// atomic step: two replicas claiming the same key at once get one
/// [`Claim::Run`] between them.
pub trait Store: Send + Sync + 'static {
    /// Claim `key` for a run, or say why not (see [`Claim`]).
    fn claim(
        &self,
        key: Key<'_>,
        terms: Terms,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Store `answer` as the record of `key`, if `token` still holds it.
    fn complete(
        &self,
        key: Key<'_>,
        token: Token,
        answer: &Stored,
        terms: Terms,
    ) -> impl Future<Output = Result<Completed, StoreError>> + Send;

    /// Give `key` up without an answer (the run did nothing: it was refused,
    /// or failed before its effect), if `token` still holds it: the next
    /// request with the key runs.
    fn release(
        &self,
        key: Key<'_>,
        token: Token,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Extend the lease of `key` to `terms.lease` from now, if `token` still
    /// holds it and no answer is stored: `true` if it did. The layer renews
    /// a running handler's claim, so that a handler slower than the lease is
    /// not run a second time beside it; a process that dies stops renewing,
    /// and its claim runs out.
    fn renew(
        &self,
        key: Key<'_>,
        token: Token,
        terms: Terms,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Remove the records past their retention; how many went.
    fn collect(&self) -> impl Future<Output = Result<usize, StoreError>> + Send;
}

/// A request's claim, as its handler sees it (the layer puts it in the
/// request's extensions): the key, the token, and whether the answer was
/// already stored in the handler's own transaction.
#[derive(Debug, Clone)]
pub struct Claimed(Arc<ClaimedParts>);

#[derive(Debug)]
struct ClaimedParts {
    principal: String,
    key: String,
    fingerprint: Fingerprint,
    token: Token,
    terms: Terms,
    stored: AtomicBool,
}

impl Claimed {
    /// The claim `token` holds on `key`.
    #[must_use]
    pub fn new(key: Key<'_>, token: Token, terms: Terms) -> Self {
        Self(Arc::new(ClaimedParts {
            principal: key.principal.to_string(),
            key: key.key.to_string(),
            fingerprint: key.fingerprint.clone(),
            token,
            terms,
            stored: AtomicBool::new(false),
        }))
    }

    /// The key, with its principal and fingerprint.
    #[must_use]
    pub fn key(&self) -> Key<'_> {
        Key {
            principal: &self.0.principal,
            key: &self.0.key,
            fingerprint: &self.0.fingerprint,
        }
    }

    /// The claim's token.
    #[must_use]
    pub fn token(&self) -> Token {
        self.0.token
    }

    /// The lease and retention the claim was taken with.
    #[must_use]
    pub fn terms(&self) -> Terms {
        self.0.terms
    }

    /// The answer was stored in the handler's own transaction (a store's
    /// in-transaction completion says so once its statement succeeded): the
    /// layer stores nothing after the handler.
    pub fn mark_stored(&self) {
        self.0.stored.store(true, Ordering::Release);
    }

    /// Was the answer stored in the handler's own transaction?
    #[must_use]
    pub fn is_stored(&self) -> bool {
        self.0.stored.load(Ordering::Acquire)
    }
}

/// One key's record in a [`MemoryStore`].
#[derive(Debug)]
struct Entry {
    fingerprint: Fingerprint,
    state: State,
    /// Past this the record is collected (and its key new again).
    expires: Instant,
}

#[derive(Debug)]
enum State {
    Running { token: Token, lease_until: Instant },
    Done(Stored),
}

/// Key records in this process: the embedded default, for a single
/// replica (replicas need a shared store, such as `retries-sqlx`'s
/// `PgKeyStore`). Bounded: at most `capacity` keys; when full, records past
/// their retention are collected, and if none is, a new key is refused with
/// [`StoreError::Full`] (the layer answers 503: not executed). Its clock is
/// the crate's (tokio's when the `tokio` feature is on, so a paused test
/// clock moves it).
#[derive(Debug)]
pub struct MemoryStore {
    entries: Mutex<HashMap<(String, String), Entry>>,
    capacity: usize,
}

impl MemoryStore {
    /// The default bound: 100,000 keys.
    pub const DEFAULT_CAPACITY: usize = 100_000;

    /// A store of at most [`DEFAULT_CAPACITY`](Self::DEFAULT_CAPACITY) keys.
    #[must_use]
    pub fn new() -> Self {
        Self::with_capacity(Self::DEFAULT_CAPACITY)
    }

    /// A store of at most `capacity` keys.
    #[must_use]
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            capacity,
        }
    }

    /// How many keys it holds (claims and records).
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries().len()
    }

    /// Does it hold no key?
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<(String, String), Entry>> {
        // Every change is one insert or remove: a panic elsewhere while the
        // lock was held left the map valid.
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn claim_now(&self, key: Key<'_>, terms: Terms) -> Result<Claim, StoreError> {
        let now = retries_core::door::now();
        let mut entries = self.entries();
        let id = (key.principal.to_string(), key.key.to_string());
        if let Some(e) = entries.get(&id).filter(|e| e.expires > now) {
            let same = e.fingerprint == *key.fingerprint;
            match &e.state {
                State::Done(answer) if same => return Ok(Claim::Answered(answer.clone())),
                State::Running { lease_until, .. } if *lease_until > now => {
                    return Ok(if same {
                        Claim::InProgress {
                            retry_after: lease_until.saturating_duration_since(now),
                        }
                    } else {
                        Claim::Mismatch
                    });
                }
                // A lease run out: the key passes on, to the same request only.
                State::Running { .. } if same => {}
                _ => return Ok(Claim::Mismatch),
            }
        }
        if !entries.contains_key(&id) && entries.len() >= self.capacity {
            entries.retain(|_, e| e.expires > now);
            if entries.len() >= self.capacity {
                return Err(StoreError::Full(self.capacity));
            }
        }
        let token = Token::random();
        entries.insert(
            id,
            Entry {
                fingerprint: key.fingerprint.clone(),
                state: State::Running {
                    token,
                    lease_until: retries_core::door::add(now, terms.lease),
                },
                expires: retries_core::door::add(now, terms.lease.max(terms.retention)),
            },
        );
        Ok(Claim::Run(token))
    }

    fn held<'m>(
        entries: &'m mut HashMap<(String, String), Entry>,
        key: Key<'_>,
        token: Token,
    ) -> Option<&'m mut Entry> {
        entries
            .get_mut(&(key.principal.to_string(), key.key.to_string()))
            .filter(|e| matches!(e.state, State::Running { token: t, .. } if t == token))
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl Store for MemoryStore {
    fn claim(
        &self,
        key: Key<'_>,
        terms: Terms,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send {
        std::future::ready(self.claim_now(key, terms))
    }

    fn complete(
        &self,
        key: Key<'_>,
        token: Token,
        answer: &Stored,
        terms: Terms,
    ) -> impl Future<Output = Result<Completed, StoreError>> + Send {
        let mut entries = self.entries();
        let done = match Self::held(&mut entries, key, token) {
            Some(e) => {
                e.state = State::Done(answer.clone());
                e.expires = retries_core::door::add(retries_core::door::now(), terms.retention);
                Completed::Stored
            }
            None => Completed::NotHeld,
        };
        std::future::ready(Ok(done))
    }

    fn release(
        &self,
        key: Key<'_>,
        token: Token,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let mut entries = self.entries();
        if Self::held(&mut entries, key, token).is_some() {
            entries.remove(&(key.principal.to_string(), key.key.to_string()));
        }
        std::future::ready(Ok(()))
    }

    fn renew(
        &self,
        key: Key<'_>,
        token: Token,
        terms: Terms,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let now = retries_core::door::now();
        let mut entries = self.entries();
        let renewed = match Self::held(&mut entries, key, token) {
            Some(e) => {
                let until = retries_core::door::add(now, terms.lease);
                e.state = State::Running {
                    token,
                    lease_until: until,
                };
                e.expires = e.expires.max(until);
                true
            }
            None => false,
        };
        std::future::ready(Ok(renewed))
    }

    fn collect(&self) -> impl Future<Output = Result<usize, StoreError>> + Send {
        let now = retries_core::door::now();
        let mut entries = self.entries();
        let before = entries.len();
        entries.retain(|_, e| e.expires > now);
        std::future::ready(Ok(before - entries.len()))
    }
}

/// The key store's claims under `loom` (CI: `--cfg loom`).
#[cfg(all(test, loom))]
mod loom_models;

#[cfg(test)]
mod tests {
    use super::*;

    fn run(f: impl Future<Output = Result<Claim, StoreError>>) -> Claim {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match std::pin::pin!(f).poll(&mut cx) {
            std::task::Poll::Ready(r) => r.unwrap(),
            std::task::Poll::Pending => unreachable!("the memory store never waits"),
        }
    }

    #[test]
    fn a_fingerprint_is_stable_and_tells_requests_apart() {
        let a = Fingerprint::of("POST", "/charges", b"{\"cents\":100}");
        assert_eq!(a, Fingerprint::of("POST", "/charges", b"{\"cents\":100}"));
        assert_ne!(a, Fingerprint::of("POST", "/charges", b"{\"cents\":101}"));
        assert_ne!(a, Fingerprint::of("PATCH", "/charges", b"{\"cents\":100}"));
        assert_ne!(a, Fingerprint::of("POST", "/refunds", b"{\"cents\":100}"));
        // The stored form is the same in every process and build.
        assert_eq!(
            Fingerprint::of("POST", "/x", b"").as_str(),
            "POST /x 0:6c62272e07bb014262b821756295c58d"
        );
    }

    #[test]
    fn headers_survive_their_stored_form_and_a_cut_one_is_an_error() {
        let answer = Stored {
            status: 201,
            headers: vec![
                ("content-type".into(), b"application/json".to_vec()),
                ("x-empty".into(), Vec::new()),
            ],
            body: b"{}".to_vec(),
            trailers: vec![],
            body_dropped: false,
        };
        let bytes = Stored::encode_headers(&answer.headers);
        assert_eq!(Stored::decode_headers(&bytes).unwrap(), answer.headers);
        assert!(matches!(
            Stored::decode_headers(&bytes[..bytes.len() - 3]),
            Err(StoreError::Corrupt(_))
        ));
    }

    #[test]
    fn a_full_memory_store_refuses_a_new_key_but_serves_the_ones_it_holds() {
        let store = MemoryStore::with_capacity(1);
        let fp = Fingerprint::of("POST", "/a", b"");
        let terms = Terms {
            lease: Duration::from_secs(5),
            retention: Duration::from_mins(1),
        };
        let a = Key {
            principal: "",
            key: "a",
            fingerprint: &fp,
        };
        assert!(matches!(run(store.claim(a, terms)), Claim::Run(_)));
        let b = Key { key: "b", ..a };
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let refused = std::pin::pin!(store.claim(b, terms)).poll(&mut cx);
        assert!(matches!(
            refused,
            std::task::Poll::Ready(Err(StoreError::Full(1)))
        ));
        assert!(matches!(
            run(store.claim(a, terms)),
            Claim::InProgress { .. }
        ));
    }
}
