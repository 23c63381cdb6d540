//! A door of `retries` for [`ureq`](https://docs.rs/ureq), a blocking HTTP
//! client none of the project's crates covers, written only against public
//! items: the door seam ([`retries_core::door`]), the HTTP status table
//! ([`retries_core::http`]), the wire headers ([`retries_core::wire`]) and
//! the HTTP doors' shared rules ([`retries_http::door`]). It is the
//! proof that the seam is enough for a door: what a door needs from the
//! core is there, and the loop, the classification rules, the budget, the
//! breaker and the deadline are the engine's, not the door's.
//!
//! What the door does, per request:
//!
//! * declares the call idempotent by the request itself
//!   ([`retries_http::door::declared`]: an
//!   `Idempotency` extension, else the key header) or by its method
//!   (RFC 9110, [`retries_http::door::method_is_idempotent`]);
//! * names the call by method and route template
//!   ([`retries_http::door::route_name`]) when the
//!   caller gives a [`Route`];
//! * sends each attempt with the attempt's remaining time as its timeout and
//!   as `retries-timeout-ms` ([`wire::send_timeout`](retries_core::wire::send_timeout)),
//!   and records it on the attempt's span
//!   ([`door::observe`]);
//! * judges a response by the status table and the server's "don't retry
//!   me" marker ([`http::classify_response`](retries_core::http::classify_response)),
//!   and an error by whether anything was sent (a refused connection is
//!   not executed; a timeout or a broken connection after sending is
//!   unknown).
//!
//! The loop is [`Retry::run_blocking`](retries_core::Retry::run_blocking): the
//! engine's blocking door, on std's clock.

use std::time::Duration;

use http::{HeaderName, Method, Request, StatusCode};
use retries_core::door;
use retries_core::observe::Name;
use retries_core::{Classify, Failure, Policy, Verdict};
use retries_http::Route;

/// The name this door's calls report under when the request names no route.
pub static NAME: Name = Name::client("ureq");

/// A failed attempt of the door.
#[derive(Debug)]
pub enum Error {
    /// `ureq` failed: connecting, sending or reading.
    Transport(Box<ureq::Error>),
    /// The server answered with an error status (the body is kept).
    Status(StatusCode, Vec<u8>, Verdict),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Transport(e) => write!(f, "request failed: {e}"),
            Self::Status(status, _, _) => write!(f, "server answered {status}"),
        }
    }
}

impl std::error::Error for Error {}

impl Classify for Error {
    fn classify(&self) -> Verdict {
        match self {
            Self::Status(_, _, verdict) => *verdict,
            // Nothing left the client.
            Self::Transport(e) => match &**e {
                ureq::Error::ConnectionFailed
                | ureq::Error::HostNotFound
                | ureq::Error::BadUri(_) => Verdict::not_executed(),
                ureq::Error::Io(io) => retries_core::classify_io_kind(io.kind()),
                ureq::Error::Timeout(_) => Verdict::unknown(),
                _ => Verdict::permanent(),
            },
        }
    }
}

/// The door: a `ureq` agent behind one policy, and the header that carries
/// an idempotency key the server deduplicates by, if any.
#[derive(Debug)]
pub struct Door {
    agent: ureq::Agent,
    policy: Policy,
    key_header: Option<HeaderName>,
}

impl Door {
    /// A door over a new agent (statuses are answers, not errors: the door
    /// judges them itself).
    #[must_use]
    pub fn new(policy: Policy) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .new_agent();
        Self {
            agent,
            policy,
            key_header: None,
        }
    }

    /// Requests carrying this header are idempotent, whatever their method.
    #[must_use]
    pub fn idempotent_with_header(mut self, header: HeaderName) -> Self {
        self.key_header = Some(header);
        self
    }

    /// Send `request`, retried by the engine under the door's policy: the
    /// response (its status a success) and its body, or the [`Failure`]
    /// that says why the call stopped.
    #[allow(clippy::result_large_err)] // `Failure` is the engine's answer, as `outcome_blocking` gives it
    pub fn send(
        &self,
        request: &Request<Vec<u8>>,
    ) -> Result<(StatusCode, Vec<u8>), Failure<Error>> {
        let idempotent = retries_http::door::declared(
            request.extensions(),
            request.headers(),
            self.key_header.as_ref(),
        )
        .unwrap_or_else(|| retries_http::door::method_is_idempotent(request.method()));
        let route = request.extensions().get::<Route>().map(|r| r.0);
        let name = route.map_or(&NAME, |r| {
            retries_http::door::route_name(request.method(), r, &NAME)
        });
        retries_core::call(&self.policy)
            .name(name)
            .idempotent_if(idempotent)
            .outcome_blocking(|at| {
                door::observe::http_request(
                    request.method().as_str(),
                    request.uri().host(),
                    route,
                    at.number(),
                );
                self.attempt(request, at.remaining())
            })
    }

    fn attempt(
        &self,
        request: &Request<Vec<u8>>,
        left: Duration,
    ) -> Result<(StatusCode, Vec<u8>), Error> {
        let mut copy = Request::builder()
            .method(request.method().clone())
            .uri(request.uri().clone())
            .body(request.body().clone())
            .map_err(|e| Error::Transport(Box::new(ureq::Error::Http(e))))?;
        *copy.headers_mut() = request.headers().clone();
        retries_core::wire::send_timeout(copy.headers_mut(), left);
        let copy = self
            .agent
            .configure_request(copy)
            .timeout_global(Some(left))
            .build();
        let response = self
            .agent
            .run(copy)
            .map_err(|e| Error::Transport(Box::new(e)))?;
        let status = response.status();
        door::observe::http_status(status.as_u16());
        let verdict = (status.is_client_error() || status.is_server_error())
            .then(|| retries_core::http::classify_response(status, response.headers()));
        let body = response
            .into_body()
            .read_to_vec()
            .map_err(|e| Error::Transport(Box::new(e)))?;
        match verdict {
            Some(verdict) => Err(Error::Status(status, body, verdict)),
            None => Ok((status, body)),
        }
    }
}

/// A `POST` of `body` to `url`: not idempotent unless the door's key header
/// is set on it.
#[must_use]
pub fn post(url: &str, body: &[u8]) -> Request<Vec<u8>> {
    let mut request = Request::new(body.to_vec());
    *request.method_mut() = Method::POST;
    *request.uri_mut() = url.parse().unwrap_or_default();
    request
}
