//! Across services: the caller's deadline on the wire, and "I already
//! retried; don't retry me" from the server back up the chain (features
//! `http` or `tonic`; the server layer with `tower` or `tonic`).
//!
//! A chain client → A → B → store, each hop retrying 3 times around its call
//! to the next, makes 3 × 3 × 3 = 27 store calls for one client call when
//! every hop owns its retries. The SRE rule (Google SRE book, "Handling
//! Overload"): retry only at the layer right above the one that failed, and
//! answer "overloaded / already retried: don't retry" so the layers above do
//! not multiply. [`ServerLayer`] does it for a server, bottom-up and by
//! default; every client door of this crate honours the answer.
//!
//! # On the wire
//!
//! | what | gRPC | HTTP |
//! |---|---|---|
//! | the caller's remaining time, sent with every attempt | `grpc-timeout` (the standard) | `retries-timeout-ms: <milliseconds>` ([`TIMEOUT_MS`]); [`ServerLayer`] also reads Envoy's `x-envoy-expected-rq-timeout-ms` and `grpc-timeout` |
//! | "I already retried; don't retry me" | `grpc-retry-pushback-ms: -1` (gRFC A6's own "do not retry"), the handler's status code kept | `retries-no-retry: 1` ([`NO_RETRY`]), the handler's status kept |
//! | "I, the caller, own retries" (opt-in) | `retries-caller-owns: 1` ([`CALLER_OWNS`]) | the same |
//!
//! No HTTP header for a deadline is standard. `retries-timeout-ms` is a
//! relative time in milliseconds (no clock is shared between machines), the
//! shape Envoy uses for `x-envoy-expected-rq-timeout-ms`; a client of this
//! crate sends its own header rather than Envoy's so that an Envoy in between
//! keeps its meaning of its own. The marker is this crate's: HTTP has none;
//! on gRPC it is A6's, so grpc-go, grpc-java and C-core clients stop on it
//! too (a negative pushback: no retry, and a throttling failure).
//!
//! Hostile values are ignored, never a panic: a header given twice, a value
//! that is not 1–10 ASCII digits (a sign, a fraction, text), or one over
//! [`MAX_WIRE_TIMEOUT`] (clamped to it). A request's header can only shorten
//! a call, never lengthen it: a client door takes the earlier of its policy's
//! deadline and the header's (and sends the earlier of the two).
//!
//! # The server layer
//!
//! For each request, [`ServerLayer`]:
//!
//! 1. reads the caller's remaining time; without one, the handler runs with
//!    no scope (as before), and the marker is still added;
//! 2. refuses the request before the handler runs when that time, less the
//!    server's **reserve** (kept for writing the answer), is below the
//!    **minimum** (a handler started with less than that cannot do useful
//!    work): HTTP `503` with `retries-no-retry: 1`, gRPC `DEADLINE_EXCEEDED`
//!    with `grpc-retry-pushback-ms: -1`; this crate's clients stop on it at
//!    once (nothing ran, and the caller's deadline is as good as gone);
//! 3. else runs the handler with the deadline, net of the reserve, as its
//!    [`scope`](crate::scope): retried calls the handler makes stop with it;
//! 4. and when a retried call the handler made **gave up after retrying**
//!    (attempts or budget exhausted, breaker open, deadline), or was told by
//!    its own server not to retry, adds the marker to the handler's answer,
//!    however the handler mapped its error. The handler needs no code for it.
//!
//! Defaults: reserve 0, minimum 1 ms (a request that arrives with its
//! deadline spent is refused), marker on, caller ownership not honoured.
//! Turn the marker off (`advise_no_retry(false)`) for a replicated stateless
//! tier whose callers should retry on another replica: they then retry what
//! this server already retried, which multiplies the calls below it.
//!
//! The opt-in top-down rule: with `honour_caller_owns(true)`, a request
//! carrying `retries-caller-owns: 1` runs its handler's retried calls as
//! deferring (one attempt each, `nested = "defer"` across the wire): the
//! caller retries the whole request instead. Off by default: re-running the
//! whole handler is dearer than retrying its cheap leaf call.
//!
//! ```
//! # #[cfg(feature = "tower")]
//! # fn main() {
//! use std::time::Duration;
//! use retries::wire::ServerLayer;
//!
//! let layer = ServerLayer::http()
//!     .reserve(Duration::from_millis(20))
//!     .min_remaining(Duration::from_millis(50));
//! // axum: Router::new().route(…).layer(layer); hyper: ServiceBuilder::new().layer(layer)
//! # let _ = layer;
//! # }
//! # #[cfg(not(feature = "tower"))]
//! # fn main() {}
//! ```
//!
//! # Measured
//!
//! Measured with real processes, one per server, 5 client calls per row
//! (`cargo run -p retries-payments --example chain`; pinned by
//! `retry-payments/tests/chain_processes.rs`, and in-process with exact counts
//! by `retry-payments/tests/across.rs` and `tests/behaviour/tests/http/across.rs`):
//!
//! | protocol | hops retrying | mode | store calls per client call | phantom calls | deadline each hop saw (ms) |
//! |---|---|---|---|---|---|
//! | gRPC | client, A | naive | 9 | 0 | 4949 |
//! | gRPC | client, A | with the layers | 3 | 0 | 4949 |
//! | gRPC | client, A, B | naive | 27 | 0 | 4949 / 4899 |
//! | gRPC | client, A, B | with the layers | 3 | 0 | 4949 / 4899 |
//! | HTTP | client, A | naive | 9 | 0 | 4948 |
//! | HTTP | client, A | with the layers | 3 | 0 | 4948 |
//! | HTTP | client, A, B | naive | 27 | 0 | 4948 / 4897 |
//! | HTTP | client, A, B | with the layers | 3 | 0 | 4948 / 4897 |
//!
//! (5 s client deadline, 50 ms reserve per hop.) A caller that leaves stops the
//! loop beneath it: the stream reset (gRPC, HTTP/2) or the closed connection
//! (HTTP/1.1) drops the handler and its retry loop, with no store call after
//! (`a_caller_that_leaves_stops_the_loop_beneath_it…`); where a proxy in between
//! keeps the connection open, the propagated deadline bounds the work.

use std::time::Duration;

use http::HeaderMap;

/// The HTTP header carrying the caller's remaining time, in milliseconds.
pub const TIMEOUT_MS: &str = "retries-timeout-ms";
/// Envoy's header for the time an upstream request may take, read by
/// [`ServerLayer`] too.
pub const ENVOY_TIMEOUT_MS: &str = "x-envoy-expected-rq-timeout-ms";
/// The HTTP header of the marker "I already retried; don't retry me".
pub const NO_RETRY: &str = "retries-no-retry";
/// The header by which a caller says it owns retries (honoured only where a
/// [`ServerLayer`] opts in).
pub const CALLER_OWNS: &str = "retries-caller-owns";
// The same names as `HeaderName`s, made at compile time: looked up and
// inserted without parsing a string on every request.
const TIMEOUT_NAME: http::HeaderName = http::HeaderName::from_static(TIMEOUT_MS);
const ENVOY_NAME: http::HeaderName = http::HeaderName::from_static(ENVOY_TIMEOUT_MS);
const NO_RETRY_NAME: http::HeaderName = http::HeaderName::from_static(NO_RETRY);
#[cfg(any(feature = "tower", feature = "tonic"))]
const CALLER_OWNS_NAME: http::HeaderName = http::HeaderName::from_static(CALLER_OWNS);

/// The longest wire deadline taken: longer ones are clamped to it (a day).
pub const MAX_WIRE_TIMEOUT: Duration = Duration::from_hours(24);

/// One `retries-timeout-ms` (or Envoy) value: 1 to 10 ASCII digits, in
/// milliseconds, clamped to [`MAX_WIRE_TIMEOUT`]. Anything else is `None`.
///
/// ```
/// use std::time::Duration;
/// use retries::wire::parse_timeout_ms;
///
/// assert_eq!(parse_timeout_ms("250"), Some(Duration::from_millis(250)));
/// assert_eq!(parse_timeout_ms("-1"), None);
/// assert_eq!(parse_timeout_ms("1.5"), None);
/// assert_eq!(parse_timeout_ms("9999999999"), Some(retries::wire::MAX_WIRE_TIMEOUT));
/// ```
#[must_use]
pub fn parse_timeout_ms(value: &str) -> Option<Duration> {
    let digits = value.trim().as_bytes();
    if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let ms = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(Duration::from_millis(ms).min(MAX_WIRE_TIMEOUT))
}

/// The one value of a singleton header; `None` when absent, repeated or not
/// text.
pub(crate) fn single<K: http::header::AsHeaderName>(headers: &HeaderMap, name: K) -> Option<&str> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    value.to_str().ok()
}

/// The caller's remaining time a request carries: the earliest of
/// `retries-timeout-ms`, Envoy's `x-envoy-expected-rq-timeout-ms` and (with
/// `grpc`) `grpc-timeout`, each ignored when hostile (see the
/// [module docs](self)).
#[must_use]
pub fn incoming_timeout(headers: &HeaderMap) -> Option<Duration> {
    let ours = single(headers, &TIMEOUT_NAME).and_then(parse_timeout_ms);
    let envoy = single(headers, &ENVOY_NAME).and_then(parse_timeout_ms);
    let grpc = grpc_timeout(headers);
    [ours, envoy, grpc].into_iter().flatten().min()
}

#[cfg(feature = "tonic")]
fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    single(headers, "grpc-timeout")
        .and_then(crate::tonic::parse_grpc_timeout)
        .map(|d| d.min(MAX_WIRE_TIMEOUT))
}

#[cfg(not(feature = "tonic"))]
fn grpc_timeout(_: &HeaderMap) -> Option<Duration> {
    None
}

/// `true` when an answer carries the marker `retries-no-retry` (any value
/// but `0`).
#[must_use]
pub fn says_no_retry(headers: &HeaderMap) -> bool {
    headers
        .get_all(&NO_RETRY_NAME)
        .iter()
        .any(|v| v.as_bytes().trim_ascii() != b"0")
}

/// `retries-timeout-ms` for an attempt with `left` to go, for a client this
/// crate does not wrap (the layer and the middleware send it themselves):
/// `client.get(url).header(TIMEOUT_MS, timeout_value(at.remaining()))`.
#[must_use]
pub fn timeout_value(left: Duration) -> http::HeaderValue {
    // The digits on the stack, then one allocation of exactly their size
    // (`HeaderValue::from(u64)` allocates a larger buffer, then shrinks it).
    let total = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
    let mut ms = total;
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (ms % 10) as u8;
        ms /= 10;
        if ms == 0 {
            break;
        }
    }
    // ASCII digits are always a valid value; the fallback is never taken.
    http::HeaderValue::from_bytes(&digits[at..]).unwrap_or_else(|_| http::HeaderValue::from(total))
}

/// Put an attempt's remaining time `left` on an HTTP request, replacing a
/// `retries-timeout-ms` it carries: the doors that call this took that
/// header as a bound of the call already ([`request_timeout`]), so `left`
/// is never more than it said.
#[cfg(any(feature = "tower", feature = "reqwest-middleware"))]
pub(crate) fn send_timeout(headers: &mut HeaderMap, left: Duration) {
    // A name made at compile time: no allocation, no parsing.
    headers.insert(TIMEOUT_NAME, timeout_value(left));
}

/// The time a request's own `retries-timeout-ms` allows, if it carries one
/// (the client doors take the earlier of it and their policy's deadline).
#[must_use]
pub fn request_timeout(headers: &HeaderMap) -> Option<Duration> {
    single(headers, &TIMEOUT_NAME).and_then(parse_timeout_ms)
}

#[cfg(feature = "tower")]
pub(crate) use server::trailers_only;
#[cfg(any(feature = "tower", feature = "tonic"))]
pub use server::{ServerFuture, ServerLayer, ServerService};

#[cfg(any(feature = "tower", feature = "tonic"))]
mod server {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use http::{HeaderValue, Response, StatusCode};

    use super::{CALLER_OWNS_NAME, NO_RETRY_NAME, incoming_timeout};
    use crate::attempt::{Attempt, Owner};

    /// The protocol a [`ServerLayer`] answers in.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Wire {
        Http,
        Grpc,
    }

    /// A tower layer for servers (axum, hyper, tonic): the caller's deadline
    /// as the handler's scope, net of a reserve; requests with too little
    /// time refused before the handler; the marker "I already retried; don't
    /// retry me" on answers whose handler's retried calls gave up. See the
    /// [module docs](crate::wire).
    #[derive(Debug, Clone, Copy)]
    pub struct ServerLayer {
        wire: Wire,
        reserve: Duration,
        min_remaining: Duration,
        advise: bool,
        caller_owns: bool,
    }

    impl ServerLayer {
        const fn new(wire: Wire) -> Self {
            Self {
                wire,
                reserve: Duration::ZERO,
                min_remaining: Duration::from_millis(1),
                advise: true,
                caller_owns: false,
            }
        }

        /// For an HTTP server (axum, hyper).
        #[must_use]
        pub const fn http() -> Self {
            Self::new(Wire::Http)
        }

        /// For a gRPC server (tonic): its answers carry the marker as gRFC
        /// A6's `grpc-retry-pushback-ms: -1`. `retries::tonic::DeadlineLayer`
        /// is this with the defaults.
        #[must_use]
        pub const fn grpc() -> Self {
            Self::new(Wire::Grpc)
        }

        /// Time kept back from the caller's deadline for writing the answer:
        /// the handler's scope ends this much earlier (default zero).
        #[must_use]
        pub const fn reserve(mut self, reserve: Duration) -> Self {
            self.reserve = reserve;
            self
        }

        /// Refuse, before the handler runs, a request whose remaining time
        /// less the reserve is below this (default 1 ms).
        #[must_use]
        pub const fn min_remaining(mut self, min: Duration) -> Self {
            self.min_remaining = min;
            self
        }

        /// Add the marker to answers whose retried calls gave up (default
        /// `true`); see the [module docs](crate::wire) for when to turn it off.
        #[must_use]
        pub const fn advise_no_retry(mut self, on: bool) -> Self {
            self.advise = on;
            self
        }

        /// Honour `retries-caller-owns: 1`: the handler's retried calls then
        /// defer to the caller (default `false`).
        #[must_use]
        pub const fn honour_caller_owns(mut self, on: bool) -> Self {
            self.caller_owns = on;
            self
        }
    }

    impl<S> tower_layer::Layer<S> for ServerLayer {
        type Service = ServerService<S>;

        fn layer(&self, inner: S) -> Self::Service {
            ServerService {
                inner,
                layer: *self,
            }
        }
    }

    /// The service of [`ServerLayer`].
    #[derive(Debug, Clone)]
    pub struct ServerService<S> {
        inner: S,
        layer: ServerLayer,
    }

    impl<S, B, RB> tower_service::Service<http::Request<B>> for ServerService<S>
    where
        S: tower_service::Service<http::Request<B>, Response = Response<RB>>,
        RB: Default,
    {
        type Response = Response<RB>;
        type Error = S::Error;
        type Future = ServerFuture<S::Future, RB>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            self.inner.poll_ready(cx)
        }

        fn call(&mut self, request: http::Request<B>) -> Self::Future {
            let layer = self.layer;
            let now = crate::time::now();
            let owner = if layer.caller_owns
                && request
                    .headers()
                    .get(&CALLER_OWNS_NAME)
                    .is_some_and(|v| v.as_bytes().trim_ascii() == b"1")
            {
                Owner::Caller
            } else {
                Owner::Nobody
            };
            let scope = match incoming_timeout(request.headers()) {
                Some(left) => {
                    crate::observe::server_entry(left);
                    let usable = left.saturating_sub(layer.reserve);
                    if usable < layer.min_remaining {
                        crate::observe::server_refused();
                        return ServerFuture::refused(refusal(layer.wire));
                    }
                    Attempt::fixed(crate::attempt::add(now, usable), owner)
                }
                // No deadline: no bound, but the scope still collects the
                // marker.
                None => Attempt::unbounded(now, owner),
            };
            let fut = crate::scope::enter(&scope, || self.inner.call(request));
            ServerFuture::running(scope, fut, layer)
        }
    }

    /// The answer to a request with too little time left.
    fn refusal<RB: Default>(wire: Wire) -> Response<RB> {
        let mut response = Response::new(RB::default());
        match wire {
            Wire::Http => {
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                response
                    .headers_mut()
                    .insert(NO_RETRY_NAME, HeaderValue::from_static("1"));
            }
            Wire::Grpc => {
                // DEADLINE_EXCEEDED, with A6's "do not retry".
                return trailers_only(
                    "4",
                    "remaining%20deadline%20too%20short%20to%20start",
                    HeaderValue::from_static("-1"),
                );
            }
        }
        response
    }

    /// A gRPC answer with no body, its status in the headers (trailers-only),
    /// `message` percent-encoded, and `grpc-retry-pushback-ms`: how this
    /// crate's servers refuse (this layer, `ShedLayer`).
    pub(crate) fn trailers_only<RB: Default>(
        code: &'static str,
        message: &'static str,
        pushback: HeaderValue,
    ) -> Response<RB> {
        let mut response = Response::new(RB::default());
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert("grpc-status", HeaderValue::from_static(code));
        headers.insert("grpc-message", HeaderValue::from_static(message));
        headers.insert(crate::wire::GRPC_PUSHBACK, pushback);
        response
    }

    /// Add the marker to `response`, in its protocol's words.
    fn mark<RB>(wire: Wire, response: &mut Response<RB>) {
        let headers = response.headers_mut();
        match wire {
            Wire::Http => {
                headers.insert(NO_RETRY_NAME, HeaderValue::from_static("1"));
            }
            // A status in the headers (trailers-only, as tonic answers an
            // error): the pushback joins it. A success has no status here
            // and needs no marker.
            Wire::Grpc => {
                if headers
                    .get("grpc-status")
                    .is_some_and(|s| s.as_bytes() != b"0")
                {
                    headers.insert(crate::wire::GRPC_PUSHBACK, HeaderValue::from_static("-1"));
                }
            }
        }
    }

    pin_project_lite::pin_project! {
        /// The future of [`ServerService`].
        #[must_use = "futures do nothing unless awaited"]
        pub struct ServerFuture<F, RB> {
            #[pin]
            state: State<F, RB>,
        }
    }

    pin_project_lite::pin_project! {
        #[project = StateProj]
        enum State<F, RB> {
            /// Refused before the handler: the answer, until it is taken.
            Refused { response: Option<Response<RB>> },
            /// The handler, polled inside its scope.
            Running {
                scope: Attempt,
                layer: ServerLayer,
                #[pin]
                fut: F,
            },
        }
    }

    impl<F, RB> ServerFuture<F, RB> {
        fn refused(response: Response<RB>) -> Self {
            Self {
                state: State::Refused {
                    response: Some(response),
                },
            }
        }

        fn running(scope: Attempt, fut: F, layer: ServerLayer) -> Self {
            Self {
                state: State::Running { scope, layer, fut },
            }
        }
    }

    impl<F, RB, E> Future for ServerFuture<F, RB>
    where
        F: Future<Output = Result<Response<RB>, E>>,
    {
        type Output = Result<Response<RB>, E>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            match self.project().state.project() {
                StateProj::Refused { response } => {
                    Poll::Ready(Ok(response.take().expect("polled after completion")))
                }
                StateProj::Running { scope, layer, fut } => {
                    let out = std::task::ready!(crate::scope::enter(scope, || fut.poll(cx)));
                    Poll::Ready(out.map(|mut response| {
                        if layer.advise && scope.gave_up_below() {
                            mark(layer.wire, &mut response);
                        }
                        response
                    }))
                }
            }
        }
    }

    impl<F, RB> std::fmt::Debug for ServerFuture<F, RB> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            let refused = matches!(self.state, State::Refused { .. });
            f.debug_struct("ServerFuture")
                .field("refused", &refused)
                .finish_non_exhaustive()
        }
    }
}

/// gRFC A6's pushback trailer (also `retries::tonic::PUSHBACK`).
#[cfg(any(feature = "tower", feature = "tonic"))]
const GRPC_PUSHBACK: &str = "grpc-retry-pushback-ms";
