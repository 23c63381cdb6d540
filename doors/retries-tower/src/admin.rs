//! An admin endpoint for the overrides of `retries::control` (feature
//! `admin`): a tower service to mount in axum or hyper, so that the people
//! on call can stop retries, stop resending unknown outcomes or force a
//! breaker without a deploy. Every route answers only a caller the
//! authorizer you give accepts; there is no way to build one without.
//!
//! | route | does |
//! |---|---|
//! | `GET …/overrides` | the overrides in force, with the time each has left (JSON) |
//! | `PUT …/overrides/{call}` | install one; the body is an override as a file's entry reads it (`{"ttl": "10m", "retries": "off"}`); `{call}` percent-encoded (`POST%20%2Fcharges`), or `*` |
//! | `DELETE …/overrides/{call}` | remove one (404 if there was none) |
//!
//! Answers: 200 (with the list, or the override installed), 204 after a
//! removal, 400 with the reason for a value that does not parse or
//! validate (nothing is changed), 401 without credentials and 403 with
//! wrong ones (as the authorizer says), 404 for another route, 413 for a
//! body over 64 KiB. Each change is told as every change of
//! `retries::control` is, with who made it (the authorizer's name for the
//! caller).
//!
//! ```
//! use retries_tower::admin::{AdminService, Refused};
//!
//! // A bearer token from the environment, compared in constant time.
//! let admin = AdminService::bearer("operator", "a-long-random-token");
//! // Or your own check (mTLS identity, a signed header, …):
//! let custom = AdminService::new(|parts: &http::request::Parts| {
//!     match parts.headers.get("x-operator") {
//!         Some(v) if v == "on-call" => Ok("on-call".to_owned()),
//!         Some(_) => Err(Refused::Forbidden),
//!         None => Err(Refused::Unauthorized),
//!     }
//! });
//! // axum: `Router::new().nest_service("/admin", admin)`.
//! # let _ = (admin, custom);
//! ```
//!
//! Security: mount it on a listener only operators reach (an admin port,
//! not the public one), behind TLS; a token is a credential, keep it out of
//! source control; the overrides' time to live (at most seven days) bounds
//! what a forgotten change costs.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full, Limited};
use retries_core::control::{self, Force, OneOverride, Source, Unknown};

/// Why the authorizer refused a caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No credentials: 401.
    Unauthorized,
    /// Credentials that do not allow this: 403.
    Forbidden,
}

type Authorize = Arc<dyn Fn(&http::request::Parts) -> Result<String, Refused> + Send + Sync>;

/// The admin endpoint: see the [module docs](self).
#[derive(Clone)]
pub struct AdminService {
    authorize: Authorize,
}

impl std::fmt::Debug for AdminService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminService").finish_non_exhaustive()
    }
}

/// The most bytes of a request body read.
const BODY_LIMIT: usize = 64 * 1024;

impl AdminService {
    /// An endpoint whose every request `authorize` must accept, naming the
    /// caller (the name goes into the change's event).
    pub fn new(
        authorize: impl Fn(&http::request::Parts) -> Result<String, Refused> + Send + Sync + 'static,
    ) -> Self {
        Self {
            authorize: Arc::new(authorize),
        }
    }

    /// An endpoint for callers that send `Authorization: Bearer {token}`
    /// (compared in constant time), named `who` in the events.
    #[must_use]
    pub fn bearer(who: &str, token: &str) -> Self {
        let (who, token) = (who.to_owned(), token.as_bytes().to_vec());
        Self::new(move |parts| {
            let Some(given) = parts
                .headers
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
            else {
                return Err(Refused::Unauthorized);
            };
            if same(given, &token) {
                Ok(who.clone())
            } else {
                Err(Refused::Forbidden)
            }
        })
    }
}

/// Equal, in a time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn answer(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    if response.body().size_hint().exact().is_none_or(|n| n != 0) {
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
    }
    response
}

fn problem(status: StatusCode, reason: &str) -> Response<Full<Bytes>> {
    answer(
        status,
        serde_json::json!({ "status": status.as_u16(), "reason": reason }).to_string(),
    )
}

/// A percent-decoded path segment.
fn decode(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn listed() -> Response<Full<Bytes>> {
    let all: Vec<serde_json::Value> = control::list()
        .into_iter()
        .map(|l| {
            let policy = l.what.replacement_policy().map(|p| {
                serde_json::json!({
                    "deadline_ms": millis(p.deadline()),
                    "max_attempts": p.max_attempts(),
                    "attempt_timeout_ms": p.attempt_timeout().map(millis),
                })
            });
            serde_json::json!({
                "call": l.call,
                "retries": if l.what.is_retries_off() { Some("off") } else { None },
                "unknown": l.what.unknown_outcomes().map(|u| match u {
                    Unknown::Stop => "stop",
                    Unknown::ReconcileOnly => "reconcile-only",
                }),
                "share": l.what.retry_share(),
                "breaker": l.what.forced_breaker().map(|f| match f {
                    Force::Open => "open",
                    Force::Closed => "closed",
                    Force::Auto => "auto",
                }),
                "policy": policy,
                "left_ms": millis(l.left),
                "source": l.source.to_string(),
            })
        })
        .collect();
    answer(StatusCode::OK, serde_json::Value::Array(all).to_string())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

async fn serve<B>(authorize: Authorize, request: Request<B>) -> Response<Full<Bytes>>
where
    B: Body,
    B::Error: Into<retries_http::BoxError>,
{
    let (parts, body) = request.into_parts();
    let who = match authorize(&parts) {
        Ok(who) => who,
        Err(Refused::Unauthorized) => {
            let mut r = problem(StatusCode::UNAUTHORIZED, "credentials required");
            r.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static("Bearer"),
            );
            return r;
        }
        Err(Refused::Forbidden) => return problem(StatusCode::FORBIDDEN, "not allowed"),
    };
    let path = parts.uri.path();
    let call = match path.find("/overrides") {
        Some(i) if path[i..] == *"/overrides" => None,
        Some(i) if path[i..].starts_with("/overrides/") => {
            match decode(&path[i + "/overrides/".len()..]) {
                Some(call) => Some(call),
                None => {
                    return problem(
                        StatusCode::BAD_REQUEST,
                        "the call name is not valid percent-encoded UTF-8",
                    );
                }
            }
        }
        _ => {
            return problem(
                StatusCode::NOT_FOUND,
                "routes: GET /overrides, PUT or DELETE /overrides/{call}",
            );
        }
    };
    let source = Source::Endpoint {
        who: Arc::from(who),
    };
    match (&parts.method, call) {
        (&http::Method::GET, None) => listed(),
        (&http::Method::PUT, Some(call)) => {
            let bytes = match Limited::new(body, BODY_LIMIT).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(e) => {
                    return problem(StatusCode::PAYLOAD_TOO_LARGE, &format!("the body: {e}"));
                }
            };
            let one: OneOverride = match serde_json::from_slice(&bytes) {
                Ok(one) => one,
                Err(e) => {
                    return problem(StatusCode::BAD_REQUEST, &format!("override `{call}`: {e}"));
                }
            };
            match control::set_by(&call, one.what, one.ttl, source) {
                Ok(()) => answer(
                    StatusCode::OK,
                    serde_json::json!({ "call": call, "override": one.what.to_string(), "ttl_ms": millis(one.ttl) })
                        .to_string(),
                ),
                Err(e) => problem(StatusCode::BAD_REQUEST, &format!("override `{call}`: {e}")),
            }
        }
        (&http::Method::DELETE, Some(call)) => {
            if control::remove_by(&call, &source) {
                answer(StatusCode::NO_CONTENT, Bytes::new())
            } else {
                problem(StatusCode::NOT_FOUND, &format!("no override for `{call}`"))
            }
        }
        _ => problem(
            StatusCode::METHOD_NOT_ALLOWED,
            "GET /overrides, PUT or DELETE /overrides/{call}",
        ),
    }
}

impl<B> tower_service::Service<Request<B>> for AdminService
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<retries_http::BoxError>,
{
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let authorize = Arc::clone(&self.authorize);
        Box::pin(async move { Ok(serve(authorize, request).await) })
    }
}
