//! [`Claimed`] as an axum extractor (feature `axum-0.8`): a handler that
//! takes `claim: Claimed` needs the key's claim, so a request that reached
//! it without one (no `Idempotency-Key`, on a layer that does not require
//! it) is answered 400 with the layer's own problem document for a missing
//! key, never the 500 of a missing `Extension`.

use axum_core::extract::FromRequestParts;
use axum_core::response::{IntoResponse, Response};
use http::request::Parts;
use http::{HeaderValue, StatusCode};

use crate::Claimed;

/// The rejection of [`Claimed`] as an extractor: the request carried no
/// key, so the handler that needs its claim cannot run. Answered 400 with
/// a problem document (RFC 9457), as the idempotency layer answers a
/// missing key when it requires one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRequired;

impl std::fmt::Display for KeyRequired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("this operation requires an Idempotency-Key")
    }
}

impl std::error::Error for KeyRequired {}

impl IntoResponse for KeyRequired {
    fn into_response(self) -> Response {
        let (title, detail) = crate::KEY_MISSING;
        let body = crate::problem(StatusCode::BAD_REQUEST.as_u16(), title, detail);
        let mut response = (StatusCode::BAD_REQUEST, body).into_response();
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Claimed {
    type Rejection = KeyRequired;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, KeyRequired> {
        parts.extensions.get::<Self>().cloned().ok_or(KeyRequired)
    }
}
