//! What an HTTP door applies, for the doors of this project and any other:
//! which requests are idempotent ([`declared`], [`method_is_idempotent`]),
//! the key on the wire ([`send_key`], [`sent_key`]), how a stopped call
//! answers ([`answers_with_stop`], [`committed`]), the door's `on_retry`
//! hook ([`DoorHook`], [`tell`]), and the [`Settings`] every HTTP door is
//! configured with. Users of a door never name these.

use std::sync::Arc;

use http::header::HeaderName;
use http::{Extensions, HeaderMap, Method};

use std::collections::HashMap;
use std::sync::{OnceLock, RwLock};

use retries_core::observe::{MetricNames, Name};
use retries_core::{Failure, IdempotencyKey, Reason, RetryEvent, Verdict};

use crate::{FailedAttempt, Idempotency, Lost};

/// The name of an HTTP call: its method and the route the user gave
/// (`GET /users/{id}`), made once per pair and kept for the process (at
/// most [`MAX_CALL_NAMES`](retries_core::observe::MAX_CALL_NAMES) names in all,
/// then `fallback`). Give a route template, never a raw path.
#[must_use]
pub fn route_name(method: &Method, route: &'static str, fallback: &'static Name) -> &'static Name {
    type Names = HashMap<(Method, &'static str), &'static Name>;
    static NAMES: OnceLock<RwLock<Names>> = OnceLock::new();
    let names = NAMES.get_or_init(RwLock::default);
    let key = (method.clone(), route);
    if let Some(name) = names.read().ok().and_then(|n| n.get(&key).copied()) {
        return name;
    }
    let name = retries_core::door::call_name(&format!("{method} {route}"), fallback);
    if let Ok(mut names) = names.write() {
        names.insert(key, name);
    }
    name
}

/// What every HTTP door is configured with, held once in the door; the
/// door's setters write it, its service reads it. The defaults are
/// [`Settings::new`]'s. Fields are private, so that a setting added later
/// breaks no door.
#[derive(Clone)]
pub struct Settings {
    name: &'static Name,
    cap: usize,
    key_header: Option<HeaderName>,
    send_key: Option<HeaderName>,
    by_key: bool,
    metric_names: MetricNames,
    limit: Option<Arc<retries_core::limit::Concurrency>>,
    rate: Option<Arc<retries_core::limit::RateLimit>>,
    rate_by: Option<(Arc<retries_core::limit::RateLimits>, RateKey)>,
    paces: Option<Arc<retries_core::limit::Paces>>,
    responses: Option<ResponseVerdict>,
    on_retry: Option<DoorHook>,
    dedup_declared: bool,
    proofs: Arc<crate::proof::Proofs>,
}

impl Settings {
    /// A door's defaults: calls named `name`, 64 KiB of body kept for
    /// replay ([`DEFAULT_CAP`](crate::DEFAULT_CAP)), no key header, this
    /// crate's metric names, no limit, the door's own table, no hook, and
    /// servers' announced quotas honoured (a pace per authority, at most
    /// [`PACED_AUTHORITIES`] kept).
    #[must_use]
    pub fn new(name: &'static Name) -> Self {
        Self {
            name,
            cap: crate::DEFAULT_CAP,
            key_header: None,
            send_key: None,
            by_key: false,
            metric_names: MetricNames::Retries,
            limit: None,
            rate: None,
            rate_by: None,
            paces: Some(Arc::new(retries_core::limit::Paces::new(PACED_AUTHORITIES))),
            responses: None,
            on_retry: None,
            dedup_declared: false,
            proofs: Arc::default(),
        }
    }

    /// Every server behind the door deduplicates by the key header without
    /// sending [`DEDUPLICATED`](crate::proof::DEDUPLICATED) (another
    /// vendor's API): keyed requests are idempotent without a proof.
    pub fn set_dedup_declared(&mut self) {
        self.dedup_declared = true;
    }

    /// The target of a keyed request, when the door is in keyed mode
    /// (`idempotent_by_key`), the request carries the key header, and no
    /// [`Idempotency`] extension says what it is: its idempotency is then
    /// [`proven`](Self::proven), and every answer to it is
    /// [`learn`](Self::learn)ed from; `target` makes it (only then). `None`
    /// for every other request.
    #[must_use]
    pub fn keyed_target(
        &self,
        extensions: &Extensions,
        headers: &HeaderMap,
        target: impl FnOnce() -> crate::proof::Target,
    ) -> Option<crate::proof::Target> {
        let header = self.send_key.as_ref().filter(|_| self.by_key)?;
        if !headers.contains_key(header) || extensions.get::<Idempotency>().is_some() {
            return None;
        }
        Some(target())
    }

    /// May a keyed request to `target` be sent again after an unknown
    /// outcome: has the server shown the mark there (or did the user
    /// declare it)? See [`proof`](crate::proof).
    #[must_use]
    pub fn proven(&self, target: &crate::proof::Target) -> bool {
        self.dedup_declared || self.proofs.proven(target)
    }

    /// Learn from an answer (`status`, `headers`) to a keyed request sent to
    /// `target` (see [`proof`](crate::proof)).
    pub fn learn(
        &self,
        target: &crate::proof::Target,
        status: http::StatusCode,
        headers: &HeaderMap,
    ) {
        if !self.dedup_declared {
            self.proofs.learn(target, status, headers);
        }
    }

    /// The names of the door's metrics (feature `metrics` of the core):
    /// `retry.*` only (the default), or also the OpenTelemetry conventions'
    /// instruments for HTTP and gRPC clients.
    pub fn set_metric_names(&mut self, names: MetricNames) {
        self.metric_names = names;
    }

    /// The name the calls report under when the request names no route.
    pub fn set_name(&mut self, name: &'static Name) {
        self.name = name;
    }

    /// The most bytes of a request body kept for replay.
    pub fn set_body_cap(&mut self, bytes: usize) {
        self.cap = bytes;
    }

    /// Requests carrying `header` (an idempotency key the server
    /// deduplicates by) are idempotent, whatever their method.
    pub fn set_idempotent_with_header(&mut self, header: HeaderName) {
        self.key_header = Some(header);
    }

    /// A request that is not idempotent and does not carry `header` already
    /// sends the call's [`IdempotencyKey`] in it, the same on every attempt.
    pub fn set_send_key(&mut self, header: HeaderName) {
        self.send_key = Some(header);
    }

    /// Requests not idempotent by their method are idempotent **by their
    /// key**, sent in `header` (see [`key_by_header`]).
    pub fn set_idempotent_by_key(&mut self, header: HeaderName) {
        self.key_header = Some(header.clone());
        self.send_key = Some(header);
        self.by_key = true;
    }

    /// The concurrency limit of every request through the door.
    pub fn set_concurrency(&mut self, limit: Arc<retries_core::limit::Concurrency>) {
        self.limit = Some(limit);
    }

    /// The rate limit every attempt through the door draws from (in place
    /// of a keyed one set before).
    pub fn set_rate_limit(&mut self, limit: Arc<retries_core::limit::RateLimit>) {
        self.rate = Some(limit);
        self.rate_by = None;
    }

    /// A rate limit per key: each request draws from `limits`' limit of
    /// the key `key` derives from it (per tenant, per API key, per
    /// authority); a request it gives no key draws from none. In place of
    /// a single rate limit set before.
    pub fn set_rate_limit_by(
        &mut self,
        limits: Arc<retries_core::limit::RateLimits>,
        key: RateKey,
    ) {
        self.rate_by = Some((limits, key));
        self.rate = None;
    }

    /// Where the quotas servers announce are kept (`None`: not read, no
    /// attempt paced by them); share one [`Paces`](retries_core::limit::Paces)
    /// between doors that call the same servers.
    pub fn set_paces(&mut self, paces: Option<Arc<retries_core::limit::Paces>>) {
        self.paces = paces;
    }

    /// Which responses are failed attempts, instead of the door's table.
    pub fn set_retry_if(&mut self, f: ResponseVerdict) {
        self.responses = Some(f);
    }

    /// The door's `on_retry` hook.
    pub fn set_on_retry(&mut self, hook: DoorHook) {
        self.on_retry = Some(hook);
    }

    /// The name the calls report under when the request names no route.
    #[must_use]
    pub fn name(&self) -> &'static Name {
        self.name
    }

    /// The most bytes of a request body kept for replay.
    #[must_use]
    pub fn body_cap(&self) -> usize {
        self.cap
    }

    /// The header whose presence makes a request idempotent, if any.
    #[must_use]
    pub fn key_header(&self) -> Option<&HeaderName> {
        self.key_header.as_ref()
    }

    /// The header the call's idempotency key is sent in, if any.
    #[must_use]
    pub fn send_key_header(&self) -> Option<&HeaderName> {
        self.send_key.as_ref()
    }

    /// Whether requests not idempotent by their method are idempotent by
    /// their key.
    #[must_use]
    pub fn by_key(&self) -> bool {
        self.by_key
    }

    /// The names of the door's metrics.
    #[must_use]
    pub fn metric_names(&self) -> MetricNames {
        self.metric_names
    }

    /// The concurrency limit of every request through the door, if any.
    #[must_use]
    pub fn limit(&self) -> Option<&retries_core::limit::Concurrency> {
        self.limit.as_deref()
    }

    /// The rate limit every attempt through the door draws from, if any
    /// (a keyed one is [`rate_limit_for`](Self::rate_limit_for)'s).
    #[must_use]
    pub fn rate_limit(&self) -> Option<&retries_core::limit::RateLimit> {
        self.rate.as_deref()
    }

    /// The keyed rate limit `request` draws from, if one is set and its
    /// key function gives the request a key.
    #[must_use]
    pub fn rate_limit_for(
        &self,
        request: &Outgoing<'_>,
    ) -> Option<Arc<retries_core::limit::RateLimit>> {
        let (limits, key) = self.rate_by.as_ref()?;
        Some(limits.get(&key(request)?))
    }

    /// Where the quotas servers announce are kept, if they are read.
    #[must_use]
    pub fn paces(&self) -> Option<&Arc<retries_core::limit::Paces>> {
        self.paces.as_ref()
    }

    /// The server a request goes to, when quotas are read (`None` when
    /// not): its URI's authority, else its `Host`, without credentials.
    ///
    /// ```
    /// use retries_core::observe::Name;
    /// use retries_http::door::Settings;
    ///
    /// static NAME: Name = Name::client("api");
    /// let settings = Settings::new(&NAME);
    /// let none = http::HeaderMap::new();
    /// let uri: http::Uri = "http://user:p%40ss@api.internal:8080/x".parse().unwrap();
    /// assert_eq!(settings.quota_authority(&uri, &none), Some("api.internal:8080"));
    /// let uri: http::Uri = "http://api.internal/x".parse().unwrap();
    /// assert_eq!(settings.quota_authority(&uri, &none), Some("api.internal"));
    /// let mut host = http::HeaderMap::new();
    /// host.insert(http::header::HOST, "me@backend:81".parse().unwrap());
    /// let path_only: http::Uri = "/x".parse().unwrap();
    /// assert_eq!(settings.quota_authority(&path_only, &host), Some("backend:81"));
    /// ```
    #[must_use]
    pub fn quota_authority<'r>(
        &self,
        uri: &'r http::Uri,
        headers: &'r HeaderMap,
    ) -> Option<&'r str> {
        self.paces.as_ref()?;
        let authority = match uri.authority() {
            Some(a) => a.as_str(),
            None => headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or(""),
        };
        // Credentials end at the last `@`; a byte scan of the few bytes
        // of an authority (`rsplit` took ~200 instructions a call in the
        // layer's profile, its searcher built for long haystacks).
        Some(match authority.bytes().rposition(|b| b == b'@') {
            Some(at) => &authority[at + 1..],
            None => authority,
        })
    }

    /// The pace of the server at `authority` (`host:port`), if it has
    /// announced a quota: every attempt of a request to it draws from it.
    /// A door whose servers never announce one pays an atomic load.
    #[must_use]
    pub fn pace_at(&self, authority: &str) -> Option<Arc<retries_core::limit::Pace>> {
        self.paces.as_ref()?.find(authority)
    }

    /// The pace of the server `uri` (or the `Host` in `headers`) names,
    /// if it has announced a quota: [`pace_at`](Self::pace_at) of its
    /// [`quota_authority`](Self::quota_authority), which is worked out
    /// only once some server has announced one (until then, an atomic
    /// load a request).
    ///
    /// ```
    /// use retries_core::observe::Name;
    /// use retries_http::door::Settings;
    ///
    /// static NAME: Name = Name::client("api");
    /// let settings = Settings::new(&NAME);
    /// let uri: http::Uri = "http://api.internal:8080/x".parse().unwrap();
    /// let request = http::HeaderMap::new();
    /// // No server has announced a quota: nothing to draw from.
    /// assert!(settings.pace_for(&uri, &request).is_none());
    /// assert!(!settings.paces().unwrap().any());
    /// // An answer of this server announces one; its next requests draw from it.
    /// let mut answer = http::HeaderMap::new();
    /// answer.insert("ratelimit", "\"default\";r=10;t=1".parse().unwrap());
    /// settings.heard_from(&uri, &request, &answer, std::time::Instant::now());
    /// assert!(settings.paces().unwrap().any());
    /// assert!(settings.pace_for(&uri, &request).is_some());
    /// // Another server's requests still draw from nothing.
    /// let other: http::Uri = "http://other.internal/x".parse().unwrap();
    /// assert!(settings.pace_for(&other, &request).is_none());
    /// ```
    #[must_use]
    pub fn pace_for(
        &self,
        uri: &http::Uri,
        headers: &HeaderMap,
    ) -> Option<Arc<retries_core::limit::Pace>> {
        if !self.paces.as_ref()?.any() {
            return None;
        }
        self.pace_at(self.quota_authority(uri, headers)?)
    }

    /// [`heard`](Self::heard) for an answer to the request to `uri` (with
    /// `request_headers`): its server's authority is worked out only when
    /// the answer announces a quota.
    pub fn heard_from(
        &self,
        uri: &http::Uri,
        request_headers: &HeaderMap,
        headers: &HeaderMap,
        sent: std::time::Instant,
    ) {
        // The authority (a scan of its bytes) only for an answer that
        // announces: `heard` then checks the few names again.
        if crate::quota::announces(headers)
            && let Some(authority) = self.quota_authority(uri, request_headers)
        {
            self.heard(authority, headers, sent);
        }
    }

    /// An answer of the server at `authority` to a request `sent` then:
    /// the quota it announces, if any, is told to that server's pace
    /// (made at its first announcement; see [`quota::heard`](crate::quota::heard)).
    pub fn heard(&self, authority: &str, headers: &HeaderMap, sent: std::time::Instant) {
        if let Some(paces) = &self.paces
            && crate::quota::announces(headers)
        {
            crate::quota::heard(&paces.get(authority), headers, sent);
        }
    }

    /// The door's `retry_if`, if set.
    #[must_use]
    pub fn retry_if(&self) -> Option<&ResponseVerdict> {
        self.responses.as_ref()
    }

    /// The door's `on_retry` hook, if set.
    #[must_use]
    pub fn on_retry(&self) -> Option<&DoorHook> {
        self.on_retry.as_ref()
    }
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("name", &self.name.as_str())
            .field("body_cap", &self.cap)
            .field("key_header", &self.key_header)
            .field("send_key", &self.send_key)
            .field("by_key", &self.by_key)
            .finish_non_exhaustive()
    }
}

/// A door's key function for a keyed rate limit
/// ([`Settings::set_rate_limit_by`]): the key of a request, or `None` for
/// a request that draws from no keyed limit.
pub type RateKey = Arc<dyn Fn(&Outgoing<'_>) -> Option<String> + Send + Sync>;

/// A request about to go through an HTTP door, as a key function sees it
/// (whichever client the door is for).
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    method: &'a Method,
    authority: &'a str,
    path: &'a str,
    headers: &'a HeaderMap,
}

impl<'a> Outgoing<'a> {
    /// A request of `method` to `authority` (`host:port`) at `path`, with
    /// `headers`.
    #[must_use]
    pub fn new(
        method: &'a Method,
        authority: &'a str,
        path: &'a str,
        headers: &'a HeaderMap,
    ) -> Self {
        Self {
            method,
            authority,
            path,
            headers,
        }
    }

    /// Its method.
    #[must_use]
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// The server it goes to: `host:port` (or `host`), without
    /// credentials.
    #[must_use]
    pub fn authority(&self) -> &'a str {
        self.authority.rsplit('@').next().unwrap_or(self.authority)
    }

    /// Its path (without the query).
    #[must_use]
    pub fn path(&self) -> &'a str {
        self.path
    }

    /// Its headers.
    #[must_use]
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The value of header `name`, if it is there once and is text.
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&'a str> {
        let mut values = self.headers.get_all(name).iter();
        let v = values.next()?;
        if values.next().is_some() {
            return None;
        }
        v.to_str().ok()
    }
}

/// The most servers (authorities) whose announced quotas a door keeps by
/// default; past that, the one heard from least recently is forgotten.
pub const PACED_AUTHORITIES: usize = 1024;

/// A door's `on_retry` hook.
pub type DoorHook = Arc<dyn Fn(&RetryEvent<'_, FailedAttempt<'_>>) + Send + Sync + 'static>;

/// A door's `retry_if`: which responses are failed attempts.
pub type ResponseVerdict =
    Arc<dyn Fn(http::StatusCode, &HeaderMap) -> Option<Verdict> + Send + Sync>;

/// A response judged by a door's `retry_if` (`f`), with the marker
/// `retries-no-retry` ([`wire`](retries_core::wire)) honoured first: a response
/// `f` calls a failed attempt that carries the marker stops the call
/// ([`Verdict::server_refused`](Verdict::server_refused)), as with
/// the door's own table; the server (a `ServerLayer`) already retried below,
/// or refused for want of time, and every client door honours that. A
/// response `f` calls a success is one, marker or not.
#[must_use]
pub fn judged(
    f: &ResponseVerdict,
    status: http::StatusCode,
    headers: &HeaderMap,
) -> Option<Verdict> {
    let verdict = f(status, headers)?;
    if retries_core::wire::says_no_retry(headers) {
        return Some(Verdict::server_refused());
    }
    Some(verdict)
}

/// A door's failed attempt, seen by its `on_retry` hook.
pub trait View {
    /// The failed attempt as the hook sees it.
    fn view(&self) -> FailedAttempt<'_>;
}

/// Tell a door's hook, if it has one, about the retry `event` announces.
pub fn tell<E: View>(hook: Option<&DoorHook>, event: &RetryEvent<'_, E>) {
    if let Some(hook) = hook {
        let view = event.error().map(View::view);
        hook(&event.with_error(view.as_ref()));
    }
}

/// The key a request carries in the header `send_key` named (put there by
/// the door, or by the caller), if any: what `reconcile` looks up.
#[must_use]
pub fn sent_key(headers: &HeaderMap, header: Option<&HeaderName>) -> Option<IdempotencyKey> {
    headers.get(header?)?.to_str().ok()?.parse().ok()
}

/// A request's idempotency as the request itself declares it: by an
/// [`Idempotency`] extension, else `true` when it carries `key_header`.
#[must_use]
pub fn declared(
    extensions: &Extensions,
    headers: &HeaderMap,
    key_header: Option<&HeaderName>,
) -> Option<bool> {
    if let Some(Idempotency(said)) = extensions.get::<Idempotency>() {
        return Some(*said);
    }
    key_header
        .is_some_and(|h| headers.contains_key(h))
        .then_some(true)
}

/// A door's first step with `idempotent_by_key`: a request that is not
/// idempotent by its method ([`method_is_idempotent`] said
/// `by_method`) and declares nothing by an [`Idempotency`] extension gets
/// the call's key in the header (a key the caller put there is kept), so
/// that [`declared`] then finds it idempotent by its key. Nothing without
/// `idempotent_by_key`.
pub fn key_by_header(
    settings: &Settings,
    by_method: bool,
    extensions: &Extensions,
    headers: &mut HeaderMap,
) {
    if let (true, Some(header)) = (settings.by_key, &settings.send_key)
        && !by_method
        && extensions.get::<Idempotency>().is_none()
    {
        send_key(headers, header);
    }
}

/// RFC 9110, section 9.2.2: `PUT`, `DELETE` and the safe methods are
/// idempotent.
#[must_use]
pub fn method_is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// How the doors end a call that stopped without success: `true` when the
/// caller gets a [`Stopped`](retries_core::Stopped), `false` when it gets
/// the last attempt's answer. `answered` says whether a failed attempt is a
/// response (an answer the caller gets as it came, marked with
/// [`Ended`](crate::Ended)).
///
/// * The last attempt is a response: it is the answer, unless the deadline,
///   the breaker, a full limit or admission stopped the call (a `Stopped`).
/// * The last attempt is an error (no response): the error itself only
///   when it ended the call (permanent, or the attempts spent); for every
///   stop of the library's (a pause that did not fit, the budget, an
///   unknown outcome, the deadline, …) a `Stopped` whose source is that
///   error: the bare error would read like one refused connection, and a
///   caller that retries it at a higher level could repeat work that may
///   be done.
/// * No attempt left anything, or the last was cut off: a `Stopped`.
#[must_use]
pub fn answers_with_stop<E>(failure: &Failure<E>, answered: impl FnOnce(&E) -> bool) -> bool {
    let reason = failure.reason();
    if failure.last_attempt_cut_off() {
        return true;
    }
    match failure.last_error() {
        None => true,
        Some(last) if answered(last) => matches!(
            reason,
            Reason::DeadlineExceeded | Reason::CircuitOpen | Reason::Saturated | Reason::Throttled
        ),
        Some(_) => !matches!(reason, Reason::Permanent | Reason::Exhausted),
    }
}

/// Why a call that stopped as permanent was not retried, if its body is the
/// reason (the classifiers of the doors turn a lost body into a permanent
/// verdict); said at DEBUG.
#[must_use]
pub fn committed(reason: Reason, lost: Option<Lost>) -> Option<Lost> {
    let lost = lost.filter(|_| reason == Reason::Permanent)?;
    retries_core::door::observe::event(
        retries_core::door::observe::Level::Debug,
        "http",
        "request not retried",
        &lost,
    );
    Some(lost)
}

/// The call's idempotency key on the wire: the one the request carries in
/// `header` already (the caller's, if it parses as a key), else a fresh one
/// put there. Minted by the door, once per call, because the key must be on
/// the first attempt's wire already; the door gives it to the loop
/// (`door_loop!(spec, bound, key: …)`), so that the engine mints no other
/// and every attempt, `reconcile` and hook sees this one. `None` when the
/// request carries a value in `header` that is not a key (it is left as
/// the caller wrote it). Both doors with `send_key` call it.
pub fn send_key(
    headers: &mut http::HeaderMap,
    header: &http::header::HeaderName,
) -> Option<IdempotencyKey> {
    if headers.contains_key(header) {
        return sent_key(headers, Some(header));
    }
    let key = IdempotencyKey::random();
    let v = http::HeaderValue::try_from(key.to_string()).ok()?;
    headers.insert(header.clone(), v);
    Some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    static DOOR: Name = Name::new("door");

    #[test]
    fn a_route_is_named_once_by_method_and_template() {
        let first = route_name(&Method::GET, "/users/{id}", &DOOR);
        assert_eq!(first.as_str(), "GET /users/{id}");
        assert!(std::ptr::eq(
            first,
            route_name(&Method::GET, "/users/{id}", &DOOR)
        ));
        let other = route_name(&Method::POST, "/users/{id}", &DOOR);
        assert_eq!(other.as_str(), "POST /users/{id}");
    }

    #[test]
    fn settings_setters_are_read_back() {
        let mut s = Settings::new(&DOOR);
        assert_eq!(
            (s.body_cap(), s.by_key(), s.key_header()),
            (crate::DEFAULT_CAP, false, None)
        );
        s.set_idempotent_by_key(HeaderName::from_static("idempotency-key"));
        s.set_body_cap(10);
        assert_eq!(s.body_cap(), 10);
        assert!(s.by_key());
        assert_eq!(
            s.key_header().map(HeaderName::as_str),
            Some("idempotency-key")
        );
        assert_eq!(
            s.send_key_header().map(HeaderName::as_str),
            Some("idempotency-key")
        );
    }
}
