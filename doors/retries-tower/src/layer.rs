//! [`RetryLayer`]: the layer, its settings and setters (the HTTP ones over
//! `retries_http::door::Settings`, the gRPC ones, the breaker, the budget and
//! `reconcile`); its service is `service.rs`, the protocols `protocol.rs`.

#[allow(clippy::wildcard_imports)]
use super::*;

/// No `reconcile` look-up (the default). Named apart from the core's
/// `slots::NoReconcile`, the slot a spec takes: this is the layer's.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoLookup;

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

impl<Res: Send> Reconcile<Res> for NoLookup {
    // Never made (`lookup` answers `None`); `Pending` has no size, so the
    // call's future keeps no room for a look-up that cannot happen.
    type Fut = std::future::Pending<Result<Option<Res>, BoxError>>;
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

pub(crate) type Predicate = Arc<dyn Fn(&Parts) -> bool + Send + Sync>;
pub(crate) type RouteOf = Arc<dyn Fn(&Parts) -> Option<&'static str> + Send + Sync>;

/// The layer: see the [crate docs](crate). Its budget (by default a
/// [`TokenBucket`] with the default settings) is shared by every service it
/// makes and all their clones: one per channel, as gRPC keeps it.
pub struct RetryLayer<P = Http, B = TokenBucket, K = NoBreaker, R = NoLookup> {
    pub(crate) policy: Policy,
    /// What every HTTP door is configured with.
    pub(crate) http: Settings,
    pub(crate) when: Option<Predicate>,
    pub(crate) route: Option<RouteOf>,
    #[cfg(feature = "service-config")]
    pub(crate) service: Option<Arc<crate::service_config::ServiceConfig>>,
    pub(crate) methods: Arc<[String]>,
    pub(crate) budget: Arc<B>,
    /// [`budget`](RetryLayer::budget) was called: that budget applies,
    /// whatever a service config says, and in whichever order the two
    /// setters came.
    pub(crate) budget_given: bool,
    /// A service config's `retryThrottling`, for a layer without a budget
    /// given: gRFC A6 throttles only when the config says so.
    #[cfg(feature = "service-config")]
    pub(crate) config_bucket: Option<Arc<TokenBucket>>,
    pub(crate) breaker: K,
    pub(crate) reconcile: R,
    pub(crate) protocol: P,
    /// [`avoid_tried`](RetryLayer::avoid_tried) was called.
    pub(crate) avoid_tried: bool,
}

impl<P: Clone, B, K: Clone, R: Clone> Clone for RetryLayer<P, B, K, R> {
    fn clone(&self) -> Self {
        Self {
            policy: self.policy,
            http: self.http.clone(),
            when: self.when.clone(),
            route: self.route.clone(),
            #[cfg(feature = "service-config")]
            service: self.service.clone(),
            methods: Arc::clone(&self.methods),
            budget: Arc::clone(&self.budget),
            budget_given: self.budget_given,
            #[cfg(feature = "service-config")]
            config_bucket: self.config_bucket.clone(),
            breaker: self.breaker.clone(),
            reconcile: self.reconcile.clone(),
            protocol: self.protocol.clone(),
            avoid_tried: self.avoid_tried,
        }
    }
}

impl<P, B, K, R> std::fmt::Debug for RetryLayer<P, B, K, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryLayer")
            .field("protocol", &std::any::type_name::<P>())
            .field("policy", &self.policy)
            .field("http", &self.http)
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

#[cfg(feature = "service-config")]
impl<B, K, R> RetryLayer<Grpc, B, K, R> {
    /// Take the retry policy of each method from a gRPC service config
    /// (gRFC A6; see [`service_config`]). For a
    /// method the config names (by method, by service, or by its default
    /// entry): the deadline is its `timeout` (else the layer's policy's),
    /// and with a `retryPolicy` it is retried (it is declared safe to repeat
    /// by the config, unless the request's [`Idempotency`] says otherwise)
    /// up to `maxAttempts` with A6's backoff, on its `retryableStatusCodes`
    /// only (pushback honoured); with a `hedgingPolicy` it is hedged
    /// ([`Retry::run_hedged`](retries_core::Retry::run_hedged): copies after each
    /// `hedgingDelay`, at once after a `nonFatalStatusCodes` answer, the
    /// first answer wins, each copy on a clone of the inner service with the
    /// same replayed body), unless the request's [`Idempotency`] says it is
    /// not safe to repeat; with neither it is not retried.
    /// Methods the config does not name follow the layer's own rules. The
    /// config's `retryThrottling` becomes the layer's budget: one bucket per
    /// channel. A config without `retryThrottling` throttles nothing, as
    /// gRFC A6 says (the config is the user's explicit, standard statement);
    /// a layer built without a service config keeps its default bucket. A
    /// budget given with [`budget`](Self::budget) applies instead of
    /// either, whether it was set before this call or after it: the setters
    /// can come in any order.
    #[must_use]
    pub fn service_config(mut self, config: crate::service_config::ServiceConfig) -> Self {
        self.config_bucket = config.throttling().map(|t| Arc::new(t.bucket()));
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
            http: Settings::new(&NAME),
            when: None,
            route: None,
            #[cfg(feature = "service-config")]
            service: None,
            methods: Arc::from([]),
            budget: Arc::new(TokenBucket::DEFAULT),
            budget_given: false,
            #[cfg(feature = "service-config")]
            config_bucket: None,
            breaker: NoBreaker,
            reconcile: NoLookup,
            protocol,
            avoid_tried: false,
        }
    }
}

impl<P, B, K, R> RetryLayer<P, B, K, R> {
    /// The names of this layer's metrics (feature `metrics`): `retry.*`
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

    /// Every server behind this layer deduplicates by the key header of
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

    /// Limit the requests in progress through this layer (every clone,
    /// retries included) to `limit`'s slots; a request that gets no slot
    /// within its wait fails without being sent (see `retries::limit`): a
    /// `Stopped` with `Reason::Saturated`. Pass an `Arc` to share one limit
    /// with other doors or calls.
    #[must_use]
    pub fn concurrency(mut self, limit: impl Into<Arc<retries_core::limit::Concurrency>>) -> Self {
        self.http.set_concurrency(limit.into());
        self
    }

    /// Draw every attempt through this layer (first attempts, retries,
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
    /// use retries_tower::RetryLayer;
    ///
    /// // Each tenant: 10 requests a second, bursts of 5.
    /// let per_tenant = RateLimits::new(10, Duration::from_secs(1), 5, 10_000);
    /// let layer = RetryLayer::new(Policy::new(Duration::from_secs(2)))
    ///     .rate_limit_by(per_tenant, |r| r.header("x-tenant").map(str::to_owned));
    /// # let _ = layer;
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

    /// Where this layer keeps the quotas servers announce on their answers
    /// (the IETF draft's `RateLimit` and `RateLimit-Policy`,
    /// `X-RateLimit-Remaining` with `X-RateLimit-Reset`; see
    /// `retries_http::quota`), one pace per authority, made at the
    /// server's first announcement: every attempt of a request sent after
    /// it draws from its pace, so that the quota left lasts until it is
    /// whole again (see `retries::limit::Pace`; a request already under way
    /// when its server first announces one is not paced by it), and a request that cannot
    /// start in time fails at once without being sent, a `Stopped` with
    /// `Reason::OverQuota`. On by default, with a store of this layer's
    /// own (shared by its clones); pass a shared `Paces` to pace several
    /// clients of the same servers together, or `None` to read no quota.
    #[must_use]
    pub fn quotas(mut self, paces: Option<Arc<retries_core::limit::Paces>>) -> Self {
        self.http.set_paces(paces);
        self
    }

    /// Which responses are failed attempts: `f(status, headers)` returning
    /// `Some(verdict)` (a `retry_after` in it sets the pause), instead of
    /// the layer's table. Responses are values: when the call stops, the
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
    /// (its response's status and headers, or its error), its verdict, the pause and the time left: as `on_retry`
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

    /// Name each HTTP request's call by its method and the route template
    /// `f` returns (`GET /users/{id}`) in events and metrics, when the
    /// request carries no [`Route`] extension; `None` keeps the layer's
    /// name. Return a template, never the raw path (a label per id is an
    /// unbounded set). A gRPC call is named by its method path without it.
    #[must_use]
    pub fn route(
        mut self,
        f: impl Fn(&Parts) -> Option<&'static str> + Send + Sync + 'static,
    ) -> Self {
        self.route = Some(Arc::new(f));
        self
    }

    /// Send each retry (and each hedged copy) to an endpoint this request has
    /// not tried yet, when the balancer under the layer honours it: every
    /// request gets one [`Tried`](balance::Tried) record, shared by its
    /// attempts, which a balancer such as [`P2c`](balance::P2c) writes its
    /// picks into and avoids while any endpoint is left untried. With a
    /// single endpoint, or once every endpoint was tried, the pick is as
    /// without it; a balancer that ignores the record works as before. Cost:
    /// one small allocation per request. See [`balance`].
    #[must_use]
    pub fn avoid_tried(mut self) -> Self {
        self.avoid_tried = true;
        self
    }

    /// Requests for which `f` holds are idempotent.
    #[must_use]
    pub fn idempotent_when(mut self, f: impl Fn(&Parts) -> bool + Send + Sync + 'static) -> Self {
        self.when = Some(Arc::new(f));
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

    /// Use `budget` (any [`Budget`](retries_core::Budget)) instead of a token bucket of the layer's own.
    #[must_use]
    pub fn budget<B2>(self, budget: B2) -> RetryLayer<P, B2, K, R> {
        // A budget given is the user's statement: it applies.
        let mut layer = self.with_slots(|p, _, k, r| (p, Arc::new(budget), k, r));
        layer.budget_given = true;
        layer
    }

    /// Put `breaker` under the loop (a reference to a `static`, or an `Arc`).
    #[must_use]
    pub fn breaker<K2>(self, breaker: K2) -> RetryLayer<P, B, K2, R> {
        self.with_slots(|p, b, _, r| (p, b, breaker, r))
    }

    /// Resolve an unknown outcome of a non-idempotent request: `f(key,
    /// parts)` looks up whether the work was done. `Ok(Some(response))`: it
    /// was, and that is the answer; `Ok(None)`: it was not, so the request is
    /// sent again; `Err(_)`: the layer returns the last attempt's answer.
    ///
    /// The bound is stated here, not only where the layer is applied, so
    /// that a closure written in place (`|key, parts| async move { … }`, no
    /// annotations) is inferred for every borrow of `parts`: the service it
    /// makes then runs anywhere, `tokio::spawn` included.
    #[must_use]
    pub fn reconcile<F, Fut, Res>(self, f: F) -> RetryLayer<P, B, K, ReconcileFn<F>>
    where
        F: Fn(IdempotencyKey, &Parts) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<Res>, BoxError>> + Send,
    {
        self.with_slots(|p, b, k, _| (p, b, k, ReconcileFn(Arc::new(f))))
    }
}

impl<P, B, K, R> RetryLayer<P, B, K, R> {
    /// The layer with its typed slots (protocol, budget, breaker,
    /// `reconcile`) replaced by `f`'s: the one place its fields are listed
    /// for a setter that changes a slot's type.
    fn with_slots<P2, B2, K2, R2>(
        self,
        f: impl FnOnce(P, Arc<B>, K, R) -> (P2, Arc<B2>, K2, R2),
    ) -> RetryLayer<P2, B2, K2, R2> {
        let (protocol, budget, breaker, reconcile) =
            f(self.protocol, self.budget, self.breaker, self.reconcile);
        RetryLayer {
            policy: self.policy,
            http: self.http,
            when: self.when,
            route: self.route,
            #[cfg(feature = "service-config")]
            service: self.service,
            methods: self.methods,
            budget,
            budget_given: self.budget_given,
            #[cfg(feature = "service-config")]
            config_bucket: self.config_bucket,
            breaker,
            reconcile,
            protocol,
            avoid_tried: self.avoid_tried,
        }
    }
}

impl<P: Clone, B, K: Clone, R: Clone> RetryLayer<P, B, K, R> {
    /// Wrap `inner` (a hyper client, a tonic channel): the same as
    /// `tower_layer::Layer::layer`, without importing the trait.
    pub fn layer<S>(&self, inner: S) -> RetryService<S, P, B, K, R> {
        RetryService {
            inner,
            layer: Arc::new(self.clone()),
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
        RetryLayer::layer(self, inner)
    }
}
