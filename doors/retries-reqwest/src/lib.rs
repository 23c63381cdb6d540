//! The `retries` engine as `reqwest-middleware` middleware:
//! [`RetryMiddleware`]. Built on the core's public seam
//! ([`retries_core::door`]) alone, and versioned with
//! `reqwest-middleware`: its releases are releases of this crate, never of
//! `retries`. The request extensions a caller sets
//! ([`Idempotency`],
//! [`Deadline`],
//! [`Route`]) are the core's (`retries::http`),
//! shared with `retries-tower`.
//!
//! Each request is one logical call of the engine `#[retryable]` drives, with
//! the rules of the tower layer (`retries-tower`) for HTTP: idempotency by the
//! request ([`Idempotency`] extension, then an idempotency-key header you
//! name, then the RFC 9110 method), the [status table](retries_core::http) with
//! `Retry-After`, bodies replayed within a cap (streaming ones included), one
//! deadline (the policy's, or an earlier [`Deadline`] extension), the
//! middleware's budget (shared by every clone of the client), an optional
//! breaker, and one owner of retries: a request sent inside a retried call's
//! attempt makes one attempt and leaves retries to that call.
//!
//! When the call stops, the caller gets the last response if there was one
//! (the 503 it is), else the last error; a call stopped by its deadline or
//! an open breaker fails with a [`Stopped`] inside
//! `reqwest_middleware::Error::Middleware`.
//!
//! ```no_run
//! use std::time::Duration;
//! use retries::Policy;
//! use retries_reqwest::RetryMiddleware;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(RetryMiddleware::new(Policy::new(Duration::from_secs(5))))
//!     .build();
//!
//! // Where services live: a request in a spawned task (as an axum
//! // handler's future is, both need `Send`).
//! let task = tokio::spawn(async move { client.get("http://127.0.0.1:8080/orders").send().await });
//! # drop(task);
//! # }
//! ```
//!
//! # Bodies of any size
//!
//! A request's body is sent again for each attempt in one of three ways:
//!
//! * a body of bytes (`.body(vec)`, `.json(..)`) is shared by every attempt,
//!   whatever its size: it is in memory already;
//! * a streaming body is copied as it is sent, up to a cap (64 KiB,
//!   [`DEFAULT_CAP`]; [`RetryMiddleware::body_cap`], or per request a
//!   [`BodyCap`] extension); past it the call is committed to its attempt,
//!   and a failure of that attempt says so ([`NotReplayed`],
//!   [`Lost::OverCap`] with the cap and the bytes sent);
//! * a [`Reopen`] extension opens the body again for each attempt, nothing
//!   held between them: [`Reopen::file`] (read from its start; a file that
//!   changed is not sent again), [`Reopen::with`] (a factory of yours), and
//!   [`multipart`] (feature `multipart`: a form rebuilt).
//!
//! ```no_run
//! # async fn upload(client: reqwest_middleware::ClientWithMiddleware) -> reqwest_middleware::Result<()> {
//! // A 200 MB upload, retried without holding it in memory.
//! client
//!     .put("http://127.0.0.1:8080/backups/2026-12-05.tar")
//!     .with_extension(retries_reqwest::Reopen::file("/var/backups/2026-12-05.tar"))
//!     .send()
//!     .await?;
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "multipart")]
mod multipart;
#[cfg(feature = "multipart")]
#[cfg_attr(docsrs, doc(cfg(feature = "multipart")))]
pub use multipart::multipart;

use std::sync::Arc;

use http::Extensions;
use reqwest_middleware::{Middleware, Next};

use retries_core::RetryEvent;
use retries_core::attempt::Attempt;
use retries_core::attempt::IdempotencyKey;
use retries_core::breaker::{Breaker, NoBreaker};
use retries_core::budget::{Budget, TokenBucket};
use retries_core::call;
use retries_core::failure::{Failure, Reason, Stopped};
use retries_core::observe::Name;
use retries_core::policy::Policy;
use retries_core::verdict::{Classify, Verdict, classify_chain_or};
use retries_http::Replay;
use retries_http::door::{
    ResponseVerdict, Settings, answers_with_stop, committed, declared, method_is_idempotent, tell,
};
use std::future::Future;
use std::pin::Pin;

// What the middleware's users name, from the HTTP doors' shared crate:
// the request extensions and the errors of a request that could not be
// sent again.
pub use retries_http::{
    BodyCap, DEFAULT_CAP, Deadline, Ended, FailedAttempt, Idempotency, Lost, NotReplayed, Opened,
    Reopen, Route,
};

/// The name the middleware's calls report under unless
/// [`RetryMiddleware::name`] says otherwise.
pub static NAME: Name = Name::client("retries::reqwest");

/// The middleware: see the [module docs](self).
pub struct RetryMiddleware<B = TokenBucket, K = NoBreaker> {
    policy: Policy,
    /// What every HTTP door is configured with.
    http: Settings,
    when: Option<Predicate>,
    route: Option<RouteOf>,
    reconcile: Option<Lookup>,
    budget: Arc<B>,
    breaker: K,
}

type Predicate = Arc<dyn Fn(&reqwest::Request) -> bool + Send + Sync>;
type RouteOf = Arc<dyn Fn(&reqwest::Request) -> Option<&'static str> + Send + Sync>;

/// A `reconcile` look-up of the middleware.
type Lookup = Arc<
    dyn Fn(
            IdempotencyKey,
            &reqwest::Request,
        ) -> Pin<
            Box<dyn Future<Output = reqwest_middleware::Result<Option<reqwest::Response>>> + Send>,
        > + Send
        + Sync,
>;

impl<B, K> std::fmt::Debug for RetryMiddleware<B, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryMiddleware")
            .field("policy", &self.policy)
            .field("http", &self.http)
            .finish_non_exhaustive()
    }
}

impl RetryMiddleware {
    /// Middleware retrying under `policy`, with a token bucket of its own.
    #[must_use]
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            http: Settings::new(&NAME),
            when: None,
            route: None,
            reconcile: None,
            budget: Arc::new(TokenBucket::DEFAULT),
            breaker: NoBreaker,
        }
    }
}

impl<B, K> RetryMiddleware<B, K> {
    /// The names of this middleware's metrics (feature `metrics`): `retry.*`
    /// only (the default), or also the OpenTelemetry conventions'
    /// instruments for HTTP and gRPC clients (see `retries::observe`,
    /// "Metrics of the conventions").
    #[must_use]
    pub fn metric_names(mut self, names: retries_core::observe::MetricNames) -> Self {
        self.http.set_metric_names(names);
        self
    }

    /// The name the calls report under (events and metrics) when the
    /// request names no route; default [`NAME`].
    #[must_use]
    pub fn name(mut self, name: &'static Name) -> Self {
        self.http.set_name(name);
        self
    }

    /// The most bytes of a request body kept for replay (default 64 KiB,
    /// [`DEFAULT_CAP`]); a request whose body is
    /// longer is committed to its attempt once more was sent. Per request:
    /// a [`BodyCap`] extension; a body opened again for
    /// each attempt needs none ([`Reopen`]).
    #[must_use]
    pub fn body_cap(mut self, bytes: usize) -> Self {
        self.http.set_body_cap(bytes);
        self
    }

    /// Requests carrying this header (an idempotency key the server
    /// deduplicates by) are idempotent, whatever their method.
    #[must_use]
    pub fn idempotent_with_header(mut self, header: http::header::HeaderName) -> Self {
        self.http.set_idempotent_with_header(header);
        self
    }

    /// A request that is not idempotent and does not carry this header
    /// already sends the call's `IdempotencyKey` in it, the same on every
    /// attempt, so the server can record it (and a `reconcile` look it up
    /// by it).
    #[must_use]
    pub fn send_key(mut self, header: http::header::HeaderName) -> Self {
        self.http.set_send_key(header);
        self
    }

    /// Requests that are not idempotent by their method (`POST`, `PATCH`)
    /// are idempotent **by their key**: each carries the call's
    /// `IdempotencyKey` in `header` (minted once, the same on every
    /// attempt; a key the caller put there is kept), for a server that runs
    /// each key once and answers later requests from its record
    /// (`retries_tower::dedup::IdempotencyLayer`). So an unknown outcome is
    /// sent again without a `reconcile`, a 409 with `Retry-After` (the
    /// key's first request still running) is waited out as not executed,
    /// and a replayed answer (`Idempotent-Replayed`) is the answer. Choose
    /// it over `send_key` + `reconcile` when the server deduplicates;
    /// choose `reconcile` when it only records keys you can look up. A
    /// request's `Idempotency` extension still says what it is.
    #[must_use]
    pub fn idempotent_by_key(mut self, header: http::header::HeaderName) -> Self {
        self.http.set_idempotent_by_key(header);
        self
    }

    /// Every server behind this middleware deduplicates by the key header of
    /// [`idempotent_by_key`](Self::idempotent_by_key) although it does not
    /// send the mark `retries-deduplicated` (another vendor's API): keyed
    /// requests are idempotent from the first one. Without it, a keyed
    /// request is resent after an unknown outcome only to a route whose
    /// answers have shown the mark (see `retries_http::proof`), so a route
    /// deployed without `IdempotencyLayer` never charges twice.
    #[must_use]
    pub fn dedup_declared(mut self) -> Self {
        self.http.set_dedup_declared();
        self
    }

    /// Limit the requests in progress through this middleware (every clone,
    /// retries included) to `limit`'s slots; a request that gets no slot
    /// within its wait fails without being sent (see `retries::limit`): a
    /// `Stopped` with `Reason::Saturated`. Pass an `Arc` to share one limit
    /// with other doors or calls.
    #[must_use]
    pub fn concurrency(mut self, limit: impl Into<Arc<retries_core::limit::Concurrency>>) -> Self {
        self.http.set_concurrency(limit.into());
        self
    }

    /// Draw every attempt through this middleware (first attempts, retries,
    /// hedged copies; every clone) from `limit` (see
    /// `retries::limit::RateLimit`): an attempt waits for its start, and a
    /// request whose next start would come too late for its deadline fails
    /// at once without being sent, a `Stopped` with `Reason::RateLimited`.
    /// Pass an `Arc` to share one limit with other doors or calls.
    #[must_use]
    pub fn rate_limit(mut self, limit: impl Into<Arc<retries_core::limit::RateLimit>>) -> Self {
        self.http.set_rate_limit(limit.into());
        self
    }

    /// A rate limit per key instead of one for all: each request draws
    /// (every attempt, as with [`rate_limit`](Self::rate_limit)) from
    /// `limits`' limit of the key `key` derives from it (a tenant's header,
    /// the authority), made full at the key's first use; a request `key`
    /// gives `None` draws from none. Replaces a `rate_limit` set before,
    /// and is replaced by one set after.
    ///
    /// ```
    /// use std::time::Duration;
    /// use retries::Policy;
    /// use retries::limit::RateLimits;
    /// use retries_reqwest::RetryMiddleware;
    ///
    /// // Each server: 100 requests a second, bursts of 10.
    /// let per_server = RateLimits::new(100, Duration::from_secs(1), 10, 1_000);
    /// let middleware = RetryMiddleware::new(Policy::new(Duration::from_secs(2)))
    ///     .rate_limit_by(per_server, |r| Some(r.authority().to_owned()));
    /// # let _ = middleware;
    /// ```
    #[must_use]
    pub fn rate_limit_by(
        mut self,
        limits: impl Into<Arc<retries_core::limit::RateLimits>>,
        key: impl Fn(&retries_http::door::Outgoing<'_>) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.http.set_rate_limit_by(limits.into(), Arc::new(key));
        self
    }

    /// Where this middleware keeps the quotas servers announce on their answers
    /// (the IETF draft's `RateLimit` and `RateLimit-Policy`,
    /// `X-RateLimit-Remaining` with `X-RateLimit-Reset`; see
    /// `retries_http::quota`), one pace per authority, made at the
    /// server's first announcement: every attempt of a request sent after
    /// it draws from its pace, so that the quota left lasts until it is
    /// whole again (see `retries::limit::Pace`; a request already under way
    /// when its server first announces one is not paced by it), and a request that cannot
    /// start in time fails at once without being sent, a `Stopped` with
    /// `Reason::OverQuota`. On by default, with a store of this middleware's
    /// own (shared by its clones); pass a shared `Paces` to pace several
    /// clients of the same servers together, or `None` to read no quota.
    #[must_use]
    pub fn quotas(mut self, paces: Option<Arc<retries_core::limit::Paces>>) -> Self {
        self.http.set_paces(paces);
        self
    }

    /// Which responses are failed attempts: `f(status, headers)` returning
    /// `Some(verdict)` (a `retry_after` in it sets the pause), instead of
    /// the middleware's table. Responses are values: when the call stops, the
    /// last one is the answer, as with the table. A failed attempt whose
    /// response carries the marker `retries-no-retry` stops the call
    /// whatever `f`'s verdict (the server already retried below, or
    /// refused for want of time: see `retries::wire`).
    #[must_use]
    pub fn retry_if(
        mut self,
        f: impl Fn(http::StatusCode, &http::HeaderMap) -> Option<retries_core::Verdict>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.http.set_retry_if(Arc::new(f));
        self
    }

    /// Call `hook` before each pause, with the attempt that failed
    /// (its response's status and headers, or the `reqwest` error), its verdict, the pause and the time left: as `on_retry`
    /// of `#[retryable]` and `retries::call`. Not called for the first
    /// attempt, nor when the call stops.
    #[must_use]
    pub fn on_retry(
        mut self,
        hook: impl Fn(&retries_core::RetryEvent<'_, retries_http::FailedAttempt<'_>>)
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.http.set_on_retry(Arc::new(hook));
        self
    }

    /// Requests for which `f` holds are idempotent (after an
    /// [`Idempotency`] extension and [`idempotent_with_header`](Self::idempotent_with_header),
    /// before the method's rule).
    #[must_use]
    pub fn idempotent_when(
        mut self,
        f: impl Fn(&reqwest::Request) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.when = Some(Arc::new(f));
        self
    }

    /// Name each request's call by its method and the route template `f`
    /// returns (`GET /users/{id}`) in events and metrics, when the request
    /// carries no [`Route`] extension (`.with_extension(Route("/users/{id}"))`
    /// on reqwest-middleware's request builder); `None` keeps the
    /// middleware's name. Return a template, never the raw path.
    #[must_use]
    pub fn route(
        mut self,
        f: impl Fn(&reqwest::Request) -> Option<&'static str> + Send + Sync + 'static,
    ) -> Self {
        self.route = Some(Arc::new(f));
        self
    }

    /// Resolve an unknown outcome of a non-idempotent request: `f(key,
    /// request)` looks up whether the work was done (the key is the one
    /// [`send_key`](Self::send_key) put on the wire, when set).
    /// `Ok(Some(response))`: it was, and that is the answer; `Ok(None)`: it
    /// was not, so the request is sent again; `Err(_)`: the call stops with
    /// [`Reason::UnknownOutcome`] and the caller gets the last attempt's
    /// answer, as from the tower layer. The
    /// future owns what it needs (clone the client, the URL): it runs after
    /// the attempt, within the call's deadline.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use http::header::HeaderName;
    /// use retries::Policy;
    /// use retries_reqwest::RetryMiddleware;
    ///
    /// let lookup = reqwest::Client::new();
    /// let middleware = RetryMiddleware::new(Policy::new(Duration::from_secs(5)))
    ///     .send_key(HeaderName::from_static("idempotency-key"))
    ///     .reconcile(move |key, request| {
    ///         let (client, url) = (lookup.clone(), request.url().join(&format!("/payments/{key}")));
    ///         async move {
    ///             let url = url.map_err(|e| reqwest_middleware::Error::Middleware(e.into()))?;
    ///             let found = client.get(url).send().await?;
    ///             // Only a 404 means "not done": a failed look-up (a 5xx, a
    ///             // timeout) must not be read as "not charged", or the
    ///             // request is sent again and charges twice.
    ///             match found.status() {
    ///                 s if s.is_success() => Ok(Some(found)),
    ///                 reqwest::StatusCode::NOT_FOUND => Ok(None),
    ///                 s => Err(reqwest_middleware::Error::middleware(std::io::Error::other(format!("look-up failed: {s}")))),
    ///             }
    ///         }
    ///     });
    /// # let _ = middleware;
    /// ```
    #[must_use]
    pub fn reconcile<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(IdempotencyKey, &reqwest::Request) -> Fut + Send + Sync + 'static,
        Fut:
            Future<Output = reqwest_middleware::Result<Option<reqwest::Response>>> + Send + 'static,
    {
        self.reconcile = Some(Arc::new(move |key, request| Box::pin(f(key, request))));
        self
    }

    /// Use `budget` (any [`Budget`]) instead of a token bucket of its own.
    #[must_use]
    pub fn budget<B2>(self, budget: B2) -> RetryMiddleware<B2, K> {
        RetryMiddleware {
            policy: self.policy,
            http: self.http,
            when: self.when,
            route: self.route,
            reconcile: self.reconcile,
            budget: Arc::new(budget),
            breaker: self.breaker,
        }
    }

    /// Put `breaker` under the loop (a reference to a `static`, or an `Arc`).
    #[must_use]
    pub fn breaker<K2>(self, breaker: K2) -> RetryMiddleware<B, K2> {
        RetryMiddleware {
            policy: self.policy,
            http: self.http,
            when: self.when,
            route: self.route,
            reconcile: self.reconcile,
            budget: self.budget,
            breaker,
        }
    }
}

/// How one attempt failed.
enum Failed {
    Response(reqwest::Response, Verdict),
    Inner(reqwest_middleware::Error),
}

impl retries_http::door::View for Failed {
    fn view(&self) -> FailedAttempt<'_> {
        match self {
            Self::Response(r, _) => FailedAttempt::Response {
                status: r.status(),
                headers: r.headers(),
            },
            Self::Inner(e) => FailedAttempt::Error(e),
        }
    }
}

impl Failed {
    fn verdict(&self) -> Verdict {
        match self {
            Self::Response(_, v) => *v,
            Self::Inner(reqwest_middleware::Error::Reqwest(e)) => e.classify(),
            // Nothing was sent: the body could not be made (a `Reopen` that
            // failed to open, a file that changed, a body past the cap).
            Self::Inner(reqwest_middleware::Error::Middleware(e)) if e.is::<NotReplayed>() => {
                Verdict::permanent()
            }
            Self::Inner(reqwest_middleware::Error::Middleware(e)) => {
                classify_chain_or(&**e, Verdict::unknown())
            }
        }
    }

    fn into_box(self) -> Box<dyn std::error::Error + Send + Sync> {
        match self {
            Self::Response(r, _) => Box::new(retries_core::http::StatusError::new(
                r.status(),
                r.headers(),
            )),
            Self::Inner(e) => Box::new(e),
        }
    }
}

#[async_trait::async_trait]
impl<B, K> Middleware for RetryMiddleware<B, K>
where
    B: Budget + Send + Sync + 'static,
    K: Breaker + Clone + Send + Sync + 'static,
{
    async fn handle(
        &self,
        mut request: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        retries_http::door::key_by_header(
            &self.http,
            method_is_idempotent(request.method()),
            extensions,
            request.headers_mut(),
        );
        let route = extensions
            .get::<Route>()
            .map(|r| r.0)
            .or_else(|| self.route.as_ref().and_then(|f| f(&request)));
        // A keyed request is idempotent once its target has shown the
        // server's mark of deduplication (`retries_http::proof`).
        let url = request.url();
        let keyed = self.http.keyed_target(extensions, request.headers(), || {
            retries_http::proof::Target::new(url.authority(), route.unwrap_or_else(|| url.path()))
        });
        let idempotent = match &keyed {
            Some(target) => self.http.proven(target),
            None => declared(extensions, request.headers(), self.http.key_header()).unwrap_or_else(
                || {
                    self.when.as_ref().is_some_and(|f| f(&request))
                        || method_is_idempotent(request.method())
                },
            ),
        };
        // The call's key, minted once and put on the wire; the loop is given
        // it, so attempts, `reconcile` and hooks see the same.
        let mut key = None;
        if !idempotent && let Some(header) = self.http.send_key_header() {
            key = retries_http::door::send_key(request.headers_mut(), header);
        }
        let mut deadline = extensions.get::<Deadline>().map(|d| d.0);
        // A request's own `retries-timeout-ms` shortens the call.
        if let Some(wire) = retries_core::wire::request_timeout(request.headers()) {
            let wire = retries_core::door::add(retries_core::door::now(), wire);
            deadline = Some(deadline.map_or(wire, |d| d.min(wire)));
        }
        // A request's body for each attempt: its `Reopen`, opened again; a
        // body of bytes, shared by the copies `try_clone` makes (no cap:
        // it is in memory already); else the body copied as it is sent,
        // up to the cap.
        let replay = if let Some(reopen) = extensions.get::<Reopen>() {
            request.body_mut().take();
            Some(Replay::reopen(reopen.clone()))
        } else if request.body().is_some_and(|b| b.as_bytes().is_none()) {
            request
                .body_mut()
                .take()
                .map(|body| Replay::for_request(body, extensions, self.http.body_cap()))
        } else {
            None
        };
        let name = route.map_or(self.http.name(), |r| {
            retries_http::door::route_name(request.method(), r, self.http.name())
        });
        // The server, when quotas are read; its pace once it has announced one.
        let authority = self
            .http
            .paces()
            .map(|_| request.url().authority())
            .map(|a| a.rsplit('@').next().unwrap_or(a));
        let pace = authority.and_then(|a| self.http.pace_at(a));
        let keyed_rate = self.http.rate_limit_for(&retries_http::door::Outgoing::new(
            request.method(),
            request.url().authority(),
            request.url().path(),
            request.headers(),
        ));
        let spec = call(&self.policy)
            .name(name)
            .idempotent_if(idempotent)
            .budget(&*self.budget)
            .breaker(self.breaker.clone())
            .concurrency_opt(self.http.limit())
            .rate_limit_opt(keyed_rate.as_deref().or(self.http.rate_limit()))
            .pace_opt(pace.as_deref())
            .on_retry(|ev: &RetryEvent<'_, Failed>| tell(self.http.on_retry(), ev))
            .classify(|e: &Failed| {
                let v = e.verdict();
                if v.is_transient() && replay.as_ref().and_then(Replay::lost).is_some() {
                    Verdict::permanent() // committed: the body cannot be sent again
                } else {
                    v
                }
            });
        let request = &request;
        let spec = spec.reconcile_maybe(|key| {
            let key = retries_http::door::sent_key(request.headers(), self.http.send_key_header())
                .unwrap_or(key);
            self.reconcile.as_ref().map(|f| {
                let lookup = f(key, request);
                async move { lookup.await.map_err(Failed::Inner) }
            })
        });
        let judge = self.http.retry_if();
        // The conventions' metrics only when the core records metrics at all:
        // otherwise no clock is read for them.
        let otel = retries_core::door::observe::METRICS
            && self.http.metric_names() == retries_core::observe::MetricNames::OpenTelemetry;
        let outcome: Result<_, _> = retries_core::door::door_loop!(spec, deadline, key: key, Result<reqwest::Response, Failed>, |at| {
            let learn = Learn { settings: &self.http, target: keyed.as_ref(), authority };
            attempt(request, route, replay.as_ref(), next.clone(), &mut *extensions, judge, learn, otel, at)
        });
        outcome.or_else(|f| answer(f, replay.as_ref().and_then(Replay::lost)))
    }
}

/// One attempt: a copy of the request with the body replayed, measured for
/// the conventions' metrics when `otel`. One `async fn`, not one inside
/// another: each level would hold its own copy of the arguments in every
/// call's future.
#[allow(clippy::too_many_arguments)] // private; the parts of one call
async fn attempt(
    request: &reqwest::Request,
    route: Option<&'static str>,
    replay: Option<&Replay<reqwest::Body>>,
    next: Next<'_>,
    extensions: &mut Extensions,
    judge: Option<&ResponseVerdict>,
    learn: Learn<'_>,
    otel: bool,
    at: &Attempt,
) -> Result<reqwest::Response, Failed> {
    let t0 = otel.then(retries_core::door::now);
    let r = 'sent: {
        if retries_core::door::observe::listening() {
            retries_core::door::observe::http_request(
                request.method().as_str(),
                request.url().host_str(),
                route,
                at.number(),
            );
        }
        // Without a body `try_clone` always succeeds.
        let Some(mut copy) = request.try_clone() else {
            break 'sent Err(Failed::Inner(reqwest_middleware::Error::middleware(
                Stopped::new(Reason::Permanent, at.number(), std::time::Duration::ZERO),
            )));
        };
        if let Some(replay) = replay {
            if at.is_retry()
                && let Some(lost) = replay.lost()
            {
                break 'sent Err(Failed::Inner(reqwest_middleware::Error::middleware(
                    NotReplayed::new(
                        lost,
                        "the previous attempt was cut off at its time limit".into(),
                    ),
                )));
            }
            let body = match replay.next().await {
                Ok(body) => body,
                // Nothing can be sent: a `Reopen` that did not open.
                Err(not_sent) => {
                    break 'sent Err(Failed::Inner(reqwest_middleware::Error::middleware(
                        not_sent,
                    )));
                }
            };
            if let Some(content_type) = body.content_type() {
                copy.headers_mut()
                    .insert(http::header::CONTENT_TYPE, content_type.clone());
            }
            *copy.body_mut() = Some(reqwest::Body::wrap(body));
        }
        retries_core::wire::send_timeout(copy.headers_mut(), at.remaining());
        let sent = learn.authority.map(|_| retries_core::door::now());
        let response = match next.run(copy, extensions).await {
            Ok(response) => response,
            Err(e) => {
                retries_core::door::observe::no_response();
                break 'sent Err(Failed::Inner(e));
            }
        };
        let status = response.status();
        retries_core::door::observe::http_status(status.as_u16());
        if let Some(target) = learn.target {
            learn.settings.learn(target, status, response.headers());
        }
        if let (Some(authority), Some(sent)) = (learn.authority, sent) {
            learn.settings.heard(authority, response.headers(), sent);
        }
        let verdict = match judge {
            Some(f) => retries_http::door::judged(f, status, response.headers()),
            None => (status.is_client_error() || status.is_server_error())
                .then(|| retries_core::http::classify_response(status, response.headers())),
        };
        match verdict {
            Some(verdict) => Err(Failed::Response(response, verdict)),
            None => Ok(response),
        }
    };
    if let Some(t0) = t0 {
        let status = match &r {
            Ok(response) | Err(Failed::Response(response, _)) => Some(response.status().as_u16()),
            Err(_) => None,
        };
        retries_core::door::observe::http_attempt(
            request.method().as_str(),
            request.url().host_str(),
            route,
            status,
            retries_core::door::since(t0),
        );
    }
    r
}

/// What learns from an answer: the middleware's settings with the
/// request's target, if it is keyed (the proof of deduplication); the
/// server's authority, if quotas are read.
#[derive(Clone, Copy)]
struct Learn<'a> {
    settings: &'a Settings,
    target: Option<&'a retries_http::proof::Target>,
    authority: Option<&'a str>,
}

/// What the caller gets when the call stopped without success (as for the
/// tower layer).
fn answer(
    failure: Failure<Failed>,
    lost: Option<Lost>,
) -> reqwest_middleware::Result<reqwest::Response> {
    let reason = failure.reason();
    let committed = committed(reason, lost);
    if answers_with_stop(&failure, |f| matches!(f, Failed::Response(..))) {
        let stopped = failure.map_err(Failed::into_box).into_stopped();
        return Err(reqwest_middleware::Error::middleware(stopped));
    }
    let attempts = failure.attempts();
    match failure.into_last_error() {
        Some(Failed::Response(mut response, _)) => {
            response
                .extensions_mut()
                .insert(retries_http::Ended::new(reason, attempts).with_lost(committed));
            Ok(response)
        }
        Some(Failed::Inner(e)) => Err(match committed {
            Some(lost) if !is_not_replayed(&e) => {
                reqwest_middleware::Error::middleware(NotReplayed::new(lost, Box::new(e)))
            }
            _ => e,
        }),
        None => Err(reqwest_middleware::Error::middleware(Stopped::new(
            reason,
            0,
            std::time::Duration::ZERO,
        ))),
    }
}

fn is_not_replayed(e: &reqwest_middleware::Error) -> bool {
    matches!(e, reqwest_middleware::Error::Middleware(m) if m.is::<NotReplayed>())
}
