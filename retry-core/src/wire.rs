//! Across services: the caller's deadline on the wire, and "I already
//! retried; don't retry me" from the server back up the chain (feature
//! `http`): the headers, their parsing and their limits. The server layer
//! that applies them to a server is `retries_tower::ServerLayer`.
//!
//! A chain client → A → B → store, each hop retrying 3 times around its call
//! to the next, makes 3 × 3 × 3 = 27 store calls for one client call when
//! every hop owns its retries. The SRE rule (Google SRE book, "Handling
//! Overload"): retry only at the layer right above the one that failed, and
//! answer "overloaded / already retried: don't retry" so the layers above do
//! not multiply. The server layer does it for a server, bottom-up and by
//! default; every client door of this crate honours the answer.
//!
//! # On the wire
//!
//! | what | gRPC | HTTP |
//! |---|---|---|
//! | the caller's remaining time, sent with every attempt | `grpc-timeout` (the standard) | `retries-timeout-ms: <milliseconds>` ([`TIMEOUT_MS`]); the server layer also reads Envoy's `x-envoy-expected-rq-timeout-ms` and `grpc-timeout` |
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
//! For each request, the server layer:
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
//! ```text
//! use retries_tower::ServerLayer;
//!
//! let layer = ServerLayer::http()
//!     .reserve(Duration::from_millis(20))
//!     .min_remaining(Duration::from_millis(50));
//! // axum: Router::new().route(…).layer(layer); hyper: ServiceBuilder::new().layer(layer)
//! ```
//!
//! # Measured
//!
//! Measured with real processes, one per server, 5 client calls per row
//! (`cargo run -p retries-payments --example chain`; pinned by
//! `examples/payments/tests/chain_processes.rs`, and in-process with exact counts
//! by `examples/payments/tests/across.rs` and `tests/behaviour/tests/http/across.rs`):
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
/// the server layer too.
pub const ENVOY_TIMEOUT_MS: &str = "x-envoy-expected-rq-timeout-ms";
/// The HTTP header of the marker "I already retried; don't retry me".
pub const NO_RETRY: &str = "retries-no-retry";
/// The header by which a caller says it owns retries (honoured only where a
/// the server layer opts in).
pub const CALLER_OWNS: &str = "retries-caller-owns";
/// The header of an answer replayed from an idempotency key's record
/// (`true`, or `body-dropped`): the key's first answer, final for the
/// client doors (the key store is the `retries-dedup` crate).
pub const REPLAYED: &str = "idempotent-replayed";
// The same names as `HeaderName`s, made at compile time: looked up and
// inserted without parsing a string on every request.
const TIMEOUT_NAME: http::HeaderName = http::HeaderName::from_static(TIMEOUT_MS);
const ENVOY_NAME: http::HeaderName = http::HeaderName::from_static(ENVOY_TIMEOUT_MS);
/// [`NO_RETRY`] as a `HeaderName`.
pub const NO_RETRY_NAME: http::HeaderName = http::HeaderName::from_static(NO_RETRY);
/// [`REPLAYED`] as a `HeaderName`.
pub const REPLAYED_NAME: http::HeaderName = http::HeaderName::from_static(REPLAYED);
/// [`CALLER_OWNS`] as a `HeaderName`.
pub const CALLER_OWNS_NAME: http::HeaderName = http::HeaderName::from_static(CALLER_OWNS);

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
    // A request without headers (a client's `Request::get(uri)`, before
    // hyper adds `Host`) is common: ~80 instructions of look-up saved.
    if headers.is_empty() {
        return None;
    }
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

fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    const GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");
    single(headers, &GRPC_TIMEOUT)
        .and_then(parse_grpc_timeout)
        .map(|d| d.min(MAX_WIRE_TIMEOUT))
}

/// Parse a `grpc-timeout` header value: up to 8 digits and a unit (`H`, `M`,
/// `S`, `m`, `u`, `n`). Any other text, including non-ASCII, is `None`.
#[must_use]
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    // Read as bytes: a unit is one ASCII byte, so any other last character
    // (a multi-byte one included) is malformed, never a panic.
    let (&unit, digits) = value.as_bytes().split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
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
pub fn send_timeout(headers: &mut HeaderMap, left: Duration) {
    // A name made at compile time: no allocation, no parsing.
    headers.insert(TIMEOUT_NAME, timeout_value(left));
}

/// The time a request's own `retries-timeout-ms` allows, if it carries one
/// (the client doors take the earlier of it and their policy's deadline).
#[must_use]
pub fn request_timeout(headers: &HeaderMap) -> Option<Duration> {
    single(headers, &TIMEOUT_NAME).and_then(parse_timeout_ms)
}

/// gRFC A6's pushback trailer.
pub const GRPC_PUSHBACK: &str = "grpc-retry-pushback-ms";
