//! The HTTP part of the door seam (feature `http`): what the two HTTP doors
//! of this project (the tower layer, the reqwest middleware) share, for any
//! HTTP door. The request extensions, the replayable body and the errors a
//! user names are in [`crate::http`]; here are the rules a door applies:
//! which requests are idempotent ([`declared`], [`method_is_idempotent`]),
//! the key on the wire ([`send_key`], [`sent_key`]), how a stopped call
//! answers ([`answers_with_stop`], [`committed`]), the door's `on_retry`
//! hook ([`DoorHook`], [`tell`]), and the setters every HTTP door has
//! ([`setters!`](crate::__door_http_setters)).

use std::sync::Arc;

use http::header::HeaderName;
use http::{Extensions, HeaderMap, Method};

use crate::http::{FailedAttempt, Idempotency, Lost};

/// The name of an HTTP call: its method and the route the user gave
/// (`GET /users/{id}`), made once per pair and kept for the process (at
/// most [`MAX_CALL_NAMES`](crate::observe::MAX_CALL_NAMES) names in all,
/// then `fallback`). Give a route template, never a raw path.
#[must_use]
pub fn route_name(
    method: &Method,
    route: &'static str,
    fallback: &'static crate::observe::Name,
) -> &'static crate::observe::Name {
    crate::observe::call_names::http(method, route, fallback)
}

/// What every HTTP door is configured with, held once: the door keeps one
/// in a field named `http` and gets its setters from [`setters!`]. The
/// defaults are [`Settings::new`]'s.
#[derive(Clone)]
pub struct Settings {
    /// The name the calls report under when the request names no route.
    pub name: &'static crate::observe::Name,
    /// The most bytes of a request body kept for replay.
    pub cap: usize,
    /// Requests carrying this header are idempotent.
    pub key_header: Option<HeaderName>,
    /// The header the call's idempotency key is sent in, if any.
    pub send_key: Option<HeaderName>,
    /// `idempotent_by_key`: requests not idempotent by method carry the
    /// call's key in `send_key`'s header and are idempotent by it.
    pub by_key: bool,
    /// The names of the door's metrics.
    pub metric_names: crate::observe::MetricNames,
    /// The concurrency limit of every request through the door.
    #[cfg(feature = "tokio")]
    pub limit: Option<Arc<crate::limit::Concurrency>>,
    /// Which responses are failed attempts, instead of the door's table.
    pub responses: Option<ResponseVerdict>,
    /// The door's `on_retry` hook.
    pub on_retry: Option<DoorHook>,
}

impl Settings {
    /// A door's defaults: calls named `name`, 64 KiB of body kept for
    /// replay ([`DEFAULT_CAP`](crate::http::DEFAULT_CAP)), no key header,
    /// this crate's metric names, no limit, the door's own table, no hook.
    #[must_use]
    pub fn new(name: &'static crate::observe::Name) -> Self {
        Self {
            name,
            cap: crate::http::DEFAULT_CAP,
            key_header: None,
            send_key: None,
            by_key: false,
            metric_names: crate::observe::MetricNames::Retries,
            #[cfg(feature = "tokio")]
            limit: None,
            responses: None,
            on_retry: None,
        }
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

/// The setters every HTTP door has, written once: `metric_names`, `name`,
/// `body_cap`, `idempotent_with_header`, `send_key`, `idempotent_by_key`, `concurrency`,
/// `retry_if`, `on_retry`. Expanded inside the door's `impl` block, on a
/// type whose field `http` is the door's [`Settings`].
pub use crate::__door_http_setters as setters;

/// A door's `on_retry` hook.
pub type DoorHook = Arc<dyn Fn(&crate::RetryEvent<'_, FailedAttempt<'_>>) + Send + Sync + 'static>;

/// A door's `retry_if`: which responses are failed attempts.
pub type ResponseVerdict =
    Arc<dyn Fn(http::StatusCode, &HeaderMap) -> Option<crate::Verdict> + Send + Sync>;

/// A response judged by a door's `retry_if` (`f`), with the marker
/// `retries-no-retry` ([`wire`](crate::wire)) honoured first: a response
/// `f` calls a failed attempt that carries the marker stops the call
/// ([`Verdict::server_refused`](crate::Verdict::server_refused)), as with
/// the door's own table; the server (a `ServerLayer`) already retried below,
/// or refused for want of time, and every client door honours that. A
/// response `f` calls a success is one, marker or not.
#[must_use]
pub fn judged(
    f: &ResponseVerdict,
    status: http::StatusCode,
    headers: &HeaderMap,
) -> Option<crate::Verdict> {
    let verdict = f(status, headers)?;
    if crate::wire::says_no_retry(headers) {
        return Some(crate::Verdict::server_refused());
    }
    Some(verdict)
}

/// A door's failed attempt, seen by its `on_retry` hook.
pub trait View {
    /// The failed attempt as the hook sees it.
    fn view(&self) -> FailedAttempt<'_>;
}

/// Tell a door's hook, if it has one, about the retry `event` announces.
pub fn tell<E: View>(hook: Option<&DoorHook>, event: &crate::RetryEvent<'_, E>) {
    if let Some(hook) = hook {
        let view = event.error().map(View::view);
        hook(&crate::RetryEvent::new(
            event.attempt(),
            view.as_ref(),
            event.verdict(),
            event.delay(),
            event.remaining(),
        ));
    }
}

/// The key a request carries in the header `send_key` named (put there by
/// the door, or by the caller), if any: what `reconcile` looks up.
#[must_use]
pub fn sent_key(headers: &HeaderMap, header: Option<&HeaderName>) -> Option<crate::IdempotencyKey> {
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
/// caller gets a [`Stopped`](crate::Stopped) (the deadline or the breaker
/// stopped it, or no attempt left an answer), `false` when it gets the last
/// attempt's answer (its response, or its error).
#[must_use]
pub fn answers_with_stop<E>(failure: &crate::Failure<E>) -> bool {
    !failure.reason().returns_last_error()
        || failure.last_attempt_cut_off()
        || failure.last_error().is_none()
}

/// Why a call that stopped as permanent was not retried, if its body is the
/// reason (the classifiers of the doors turn a lost body into a permanent
/// verdict); said at DEBUG.
#[must_use]
pub fn committed(reason: crate::Reason, lost: Option<Lost>) -> Option<Lost> {
    let lost = lost.filter(|_| reason == crate::Reason::Permanent)?;
    #[cfg(feature = "tracing")]
    tracing::debug!(target: "retries", %lost, "request not retried");
    Some(lost)
}

/// The setters both doors have, written once: `name`, `body_cap`,
/// `idempotent_with_header` (on a type with the fields `name`, `cap` and
/// `key_header`).
#[doc(hidden)]
#[macro_export]
macro_rules! __door_http_setters {
    () => {
        /// The names of this door's metrics (feature `metrics`): this
        /// crate's `retry.*` only (the default), or also the OpenTelemetry
        /// conventions' instruments for HTTP and gRPC clients (see
        /// `retries::observe`, "Metrics of the conventions").
        #[must_use]
        pub fn metric_names(mut self, names: $crate::observe::MetricNames) -> Self {
            self.http.metric_names = names;
            self
        }

        /// The name the calls report under (events and metrics); default
        /// the door's `NAME`.
        #[must_use]
        pub fn name(mut self, name: &'static $crate::observe::Name) -> Self {
            self.http.name = name;
            self
        }

        /// The most bytes of a request body kept for replay (default 64 KiB).
        #[must_use]
        pub fn body_cap(mut self, bytes: usize) -> Self {
            self.http.cap = bytes;
            self
        }

        /// Requests carrying this header (an idempotency key the server
        /// deduplicates by) are idempotent, whatever their method.
        #[must_use]
        pub fn idempotent_with_header(mut self, header: http::header::HeaderName) -> Self {
            self.http.key_header = Some(header);
            self
        }

        /// A request that is not idempotent and does not carry this header
        /// already sends the call's `IdempotencyKey`
        /// in it, the same on every attempt, so the server can record it
        /// (and a `reconcile` look it up by it).
        #[must_use]
        pub fn send_key(mut self, header: http::header::HeaderName) -> Self {
            self.http.send_key = Some(header);
            self
        }

        /// Requests that are not idempotent by their method (`POST`,
        /// `PATCH`) are idempotent **by their key**: each carries the call's
        /// `IdempotencyKey` in `header` (minted once, the same on every
        /// attempt; a key the caller put there is kept), for a server that
        /// runs each key once and answers later requests from its record
        /// (`retries_tower::dedup::IdempotencyLayer`). So an unknown
        /// outcome is sent again without a `reconcile`, a 409 with
        /// `Retry-After` (the key's first request still running) is waited
        /// out as not executed, and a replayed answer (`Idempotent-Replayed`)
        /// is the answer. Choose it over `send_key` + `reconcile` when the
        /// server deduplicates; choose `reconcile` when it only records
        /// keys you can look up. A request's `Idempotency` extension still
        /// says what it is.
        #[must_use]
        pub fn idempotent_by_key(mut self, header: http::header::HeaderName) -> Self {
            self.http.key_header = Some(header.clone());
            self.http.send_key = Some(header);
            self.http.by_key = true;
            self
        }

        /// Limit the requests in progress through this door (every clone,
        /// retries included) to `limit`'s slots; a request that gets no slot
        /// within its wait fails without being sent (see
        /// `retries::limit`): a `Stopped` with
        /// `Reason::Saturated` (in the layer's
        /// gRPC mode a `RESOURCE_EXHAUSTED` status). Pass an `Arc` to share
        /// one limit with other doors or calls.
        #[must_use]
        pub fn concurrency(
            mut self,
            limit: impl Into<std::sync::Arc<$crate::limit::Concurrency>>,
        ) -> Self {
            self.http.limit = Some(limit.into());
            self
        }

        /// Which responses are failed attempts: `f(status, headers)`
        /// returning `Some(verdict)` (a `retry_after` in it sets the pause),
        /// instead of the door's table. Responses are values: when the call
        /// stops, the last one is the answer, as with the table. A failed
        /// attempt whose response carries the marker `retries-no-retry`
        /// stops the call whatever `f`'s verdict (the server already
        /// retried below, or refused for want of time: see
        /// `retries::wire`).
        #[must_use]
        pub fn retry_if(
            mut self,
            f: impl Fn(http::StatusCode, &http::HeaderMap) -> Option<$crate::Verdict>
            + Send
            + Sync
            + 'static,
        ) -> Self {
            self.http.responses = Some(std::sync::Arc::new(f));
            self
        }

        /// Call `hook` before each pause, with the attempt that failed (its
        /// response's status and headers, or its error), its verdict, the
        /// pause and the time left: as `on_retry` of `#[retryable]` and
        /// `retries::call`. Not called for the first attempt, nor when the
        /// call stops.
        #[must_use]
        pub fn on_retry(
            mut self,
            hook: impl Fn(&$crate::RetryEvent<'_, $crate::http::FailedAttempt<'_>>)
            + Send
            + Sync
            + 'static,
        ) -> Self {
            self.http.on_retry = Some(std::sync::Arc::new(hook));
            self
        }
    };
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
) -> Option<crate::IdempotencyKey> {
    if headers.contains_key(header) {
        return sent_key(headers, Some(header));
    }
    let key = crate::IdempotencyKey::random();
    let v = http::HeaderValue::try_from(key.to_string()).ok()?;
    headers.insert(header.clone(), v);
    Some(key)
}
