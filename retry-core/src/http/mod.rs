//! HTTP (feature `http`): the status table for any client, `Retry-After`,
//! and `reqwest` errors and responses (feature `reqwest-0.13`): the words a
//! call needs to classify an HTTP answer. What only the HTTP doors share
//! (the request extensions a caller sets, the body that can be sent again,
//! the doors' settings) is the `retries-http` crate.
//!
//! # Status table
//!
//! | status | verdict | why |
//! |---|---|---|
//! | 429 Too Many Requests | `NotExecuted` (+ `Retry-After`) | refused by a rate limit or admission check, before any work |
//! | 503 Service Unavailable with `Retry-After` | `NotExecuted` (+ the hint) | the server says it did not take the request and when to come back |
//! | 503 without `Retry-After` | `Unknown` | an overloaded or half-up server may have started the work |
//! | 502 Bad Gateway, 504 Gateway Timeout | `Unknown` (+ `Retry-After` if any) | a proxy lost the upstream: the request may have reached it |
//! | 408 Request Timeout | `Unknown` | the server gave up waiting, possibly after reading part of the request |
//! | 409 Conflict with `Retry-After` | `NotExecuted`, a conflict (+ the hint) | a request with the same idempotency key is in progress (the IETF draft's answer; `retries-tower`'s `IdempotencyLayer` sends it): this one did not run. As a conflict ([`Verdict::with_conflict`]) it draws no budget, and its hint is waited out within the deadline: shortened to half the time left when it does not fit |
//! | 500 and every other 5xx | `Permanent` | the handler ran and failed: repeating it repeats the failure |
//! | every other 4xx | `Permanent` | the request is wrong |
//!
//! An error response carrying `retries-no-retry` (the marker of
//! [`wire`](crate::wire): its server already retried) stops the call
//! whatever its status ([`classify_response`], [`StatusError`]); so does one
//! carrying `Idempotent-Replayed` (the recorded answer of the key's first
//! run: sending the request again would replay it again).
//!
//! # `Retry-After`
//!
//! [`retry_after`] reads the header as delta-seconds (`120`) or as an HTTP
//! date (`Wed, 21 Oct 2026 07:28:00 GMT`, or the two obsolete formats); a date
//! in the past means no pause. A hostile value is never trusted blindly:
//!
//! * a huge value (`999999`) is taken at its word, and since it cannot fit in
//!   the call's deadline the call stops at once with `PauseExceedsDeadline`
//!   and the response as it came ("the server asked to wait 999999s; 2s were
//!   left"): never a sleep past the deadline;
//! * a negative, malformed, or repeated header (two `Retry-After` fields, or a
//!   list) is ignored, and the computed backoff applies;
//! * nothing panics, whatever the bytes.

use std::fmt;
use std::time::{Duration, SystemTime};

use http::header::RETRY_AFTER;
use http::{HeaderMap, StatusCode};

use crate::verdict::{Classify, Verdict};

/// The verdict for a response status, given its `Retry-After` (see the
/// [module docs](self)).
///
/// ```
/// use std::time::Duration;
/// use http::StatusCode;
/// use retries::{VerdictKind, http::classify_status};
///
/// let v = classify_status(StatusCode::SERVICE_UNAVAILABLE, Some(Duration::from_secs(2)));
/// assert_eq!((v.kind(), v.retry_after()), (VerdictKind::NotExecuted, Some(Duration::from_secs(2))));
/// assert_eq!(classify_status(StatusCode::BAD_GATEWAY, None).kind(), VerdictKind::Unknown);
/// assert_eq!(classify_status(StatusCode::INTERNAL_SERVER_ERROR, None).kind(), VerdictKind::Permanent);
/// ```
#[must_use]
pub fn classify_status(status: StatusCode, retry_after: Option<Duration>) -> Verdict {
    let hinted = |v: Verdict| match retry_after {
        Some(d) => v.with_retry_after(d),
        None => v,
    };
    match status.as_u16() {
        429 => hinted(Verdict::not_executed().with_overload()),
        503 if retry_after.is_some() => hinted(Verdict::not_executed().with_overload()),
        502..=504 => hinted(Verdict::unknown()),
        408 => Verdict::unknown(),
        409 if retry_after.is_some() => hinted(Verdict::not_executed().with_conflict()),
        _ => Verdict::permanent(),
    }
}

/// The verdict for an error response: [`classify_status`] with its
/// `Retry-After`, unless it carries the marker `retries-no-retry`
/// ([`wire`](crate::wire)): the server already retried, or refused for want
/// of time, and the call stops ([`Verdict::server_refused`]).
#[must_use]
pub fn classify_response(status: StatusCode, headers: &HeaderMap) -> Verdict {
    if crate::wire::says_no_retry(headers) {
        return Verdict::server_refused();
    }
    if headers.contains_key(crate::wire::REPLAYED_NAME) {
        return Verdict::permanent();
    }
    classify_status(
        status,
        retry_after(headers).or_else(|| amz_retry_after(headers)),
    )
}

/// AWS's `x-amz-retry-after`: milliseconds to wait before the next
/// attempt, read as a pause hint where a response has no `Retry-After`
/// (which wins when both are sent). `None` when absent, repeated, not a
/// number of milliseconds, or more than a day.
///
/// ```
/// use std::time::Duration;
/// use retries::http::amz_retry_after;
///
/// let mut h = http::HeaderMap::new();
/// h.insert("x-amz-retry-after", "1500".parse().unwrap());
/// assert_eq!(amz_retry_after(&h), Some(Duration::from_millis(1500)));
/// h.insert("x-amz-retry-after", "-1".parse().unwrap());
/// assert_eq!(amz_retry_after(&h), None);
/// ```
#[must_use]
pub fn amz_retry_after(headers: &HeaderMap) -> Option<Duration> {
    let text = crate::wire::single(headers, AMZ_RETRY_AFTER)?.trim();
    if text.is_empty() || text.len() > 12 || !text.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let d = Duration::from_millis(text.parse().ok()?);
    (d <= Duration::from_hours(24)).then_some(d)
}

const AMZ_RETRY_AFTER: http::HeaderName = http::HeaderName::from_static("x-amz-retry-after");

/// `true` for the statuses the table treats as transient whatever their
/// headers: 408, 429, 502, 503, 504 (a 409 is, only with `Retry-After`).
#[must_use]
pub fn is_retryable_status(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 429 | 502 | 503 | 504)
}

/// The pause a response asks for, read from its `Retry-After` header(s) at
/// `now` (see the [module docs](self) for the rules). `None` when absent,
/// malformed, negative or repeated.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::HeaderMap;
/// use retries::http::retry_after_at;
///
/// let mut h = HeaderMap::new();
/// h.insert("retry-after", "3".parse().unwrap());
/// assert_eq!(retry_after_at(&h, SystemTime::now()), Some(Duration::from_secs(3)));
/// h.insert("retry-after", "-3".parse().unwrap());
/// assert_eq!(retry_after_at(&h, SystemTime::now()), None);
/// ```
#[must_use]
pub fn retry_after_at(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    // A singleton field given twice is ambiguous, and ignored.
    parse_retry_after(crate::wire::single(headers, RETRY_AFTER)?, now)
}

/// [`retry_after_at`] now.
#[must_use]
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    retry_after_at(headers, SystemTime::now())
}

/// One `Retry-After` value: delta-seconds or an HTTP date.
fn parse_retry_after(text: &str, now: SystemTime) -> Option<Duration> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        // Too many digits for u64 is malformed, not "forever".
        return text.parse::<u64>().ok().map(Duration::from_secs);
    }
    let when = httpdate::parse_http_date(text).ok()?;
    Some(when.duration_since(now).unwrap_or(Duration::ZERO))
}

/// A response whose status is an error, with its `Retry-After`; classified by
/// the [status table](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusError {
    status: StatusCode,
    retry_after: Option<Duration>,
    no_retry: bool,
}

impl StatusError {
    /// From a status and the response's headers.
    #[must_use]
    pub fn new(status: StatusCode, headers: &HeaderMap) -> Self {
        Self {
            status,
            retry_after: retry_after(headers),
            no_retry: crate::wire::says_no_retry(headers),
        }
    }

    /// The status.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The pause the server asked for, if it asked validly.
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
}

impl fmt::Display for StatusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HTTP status {}", self.status)?;
        if let Some(d) = self.retry_after {
            write!(f, " (retry after {d:?})")?;
        }
        Ok(())
    }
}

impl std::error::Error for StatusError {}

impl Classify for StatusError {
    fn classify(&self) -> Verdict {
        if self.no_retry {
            Verdict::server_refused()
        } else {
            classify_status(self.status, self.retry_after)
        }
    }
}

#[cfg(feature = "reqwest-0.13")]
mod client {
    use super::{StatusError, classify_status};
    use crate::failure::Stopped;
    use crate::verdict::{Classify, Verdict};

    /// `reqwest` errors: a failure to connect (the request was never sent) is
    /// `NotExecuted`; a timeout, a reset or a broken body after sending is
    /// `Unknown` (`reqwest` reports a body cut mid-way as a decode error
    /// caused by an I/O error: that cause decides); a bad request (builder),
    /// a redirect loop or an undecodable body (bad JSON, bad compression) is
    /// `Permanent`; a status error follows the status table (without
    /// `Retry-After`, which `reqwest` drops: use [`check`] to keep it).
    impl Classify for reqwest::Error {
        fn classify(&self) -> Verdict {
            if self.is_decode() || self.is_body() {
                // Cut off (an I/O cause such as `UnexpectedEof`), or really
                // undecodable.
                return std::error::Error::source(self)
                    .and_then(crate::verdict::classify_chain)
                    .filter(Verdict::is_transient)
                    .map_or_else(Verdict::permanent, |_| Verdict::unknown());
            }
            if self.is_builder() || self.is_redirect() {
                Verdict::permanent()
            } else if self.is_connect() {
                Verdict::not_executed()
            } else if let Some(status) = self.status() {
                classify_status(status, None)
            } else {
                Verdict::unknown()
            }
        }
    }

    /// An HTTP call's error: the transport, an error status, or a stop.
    /// Classified as its parts are; convertible from each, so a
    /// `#[retryable]` function can return `Result<T, HttpError>` and use `?`.
    #[derive(Debug, thiserror::Error)]
    pub enum HttpError {
        /// The request failed in `reqwest`.
        #[error(transparent)]
        Transport(#[from] reqwest::Error),
        /// The response had an error status.
        #[error(transparent)]
        Status(#[from] StatusError),
        /// The call was stopped (deadline, open circuit, …).
        #[error(transparent)]
        Stopped(#[from] Stopped),
    }

    impl Classify for HttpError {
        fn classify(&self) -> Verdict {
            match self {
                Self::Transport(e) => e.classify(),
                Self::Status(e) => e.classify(),
                Self::Stopped(e) => e.classify(),
            }
        }
    }

    /// The response if its status is a success (or 1xx/3xx), else a
    /// [`StatusError`] carrying the status and its `Retry-After`, so that
    /// `Ok(response)` with a 503 becomes a retryable error.
    ///
    /// ```no_run
    /// use retries::http::{HttpError, check};
    /// use retries::{Attempt, Policy};
    ///
    /// async fn price(client: &reqwest::Client, url: &str) -> Result<String, HttpError> {
    ///     let policy = Policy::new(std::time::Duration::from_secs(5));
    ///     retries::call(&policy)
    ///         .idempotent()
    ///         .run(async |_: &Attempt| {
    ///             let response = check(client.get(url).send().await?)?; // a 503 is an error
    ///             Ok(response.text().await?)
    ///         })
    ///         .await
    /// }
    /// ```
    pub fn check(response: reqwest::Response) -> Result<reqwest::Response, StatusError> {
        let status = response.status();
        if status.is_client_error() || status.is_server_error() {
            Err(StatusError::new(status, response.headers()))
        } else {
            Ok(response)
        }
    }
}

#[cfg(feature = "reqwest-0.13")]
pub use client::{HttpError, check};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::VerdictKind;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(RETRY_AFTER, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn table() {
        use VerdictKind::*;
        let hint = Some(Duration::from_secs(1));
        for (code, hint, kind) in [
            (429, None, NotExecuted),
            (429, hint, NotExecuted),
            (503, hint, NotExecuted),
            (503, None, Unknown),
            (502, None, Unknown),
            (504, None, Unknown),
            (408, None, Unknown),
            (500, None, Permanent),
            (501, hint, Permanent),
            (400, None, Permanent),
            (401, None, Permanent),
            (403, None, Permanent),
            (404, None, Permanent),
            (409, None, Permanent),
            (422, None, Permanent),
        ] {
            let s = StatusCode::from_u16(code).unwrap();
            assert_eq!(classify_status(s, hint).kind(), kind, "{code}");
            assert_eq!(is_retryable_status(s), kind != Permanent, "{code}");
        }
        assert_eq!(
            classify_status(StatusCode::TOO_MANY_REQUESTS, hint).retry_after(),
            hint
        );
        // "In progress" under an idempotency key: not run, come back later.
        let in_progress = classify_status(StatusCode::CONFLICT, hint);
        assert_eq!(
            (in_progress.kind(), in_progress.retry_after()),
            (NotExecuted, hint)
        );
        assert!(in_progress.is_conflict());
        // A replayed record is the answer, whatever its status.
        let mut replayed = headers(&["1"]);
        replayed.insert("idempotent-replayed", "true".parse().unwrap());
        assert_eq!(
            classify_response(StatusCode::SERVICE_UNAVAILABLE, &replayed).kind(),
            Permanent
        );
    }

    #[test]
    fn retry_after_rules() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        let at = |v: &[&str]| retry_after_at(&headers(v), now);
        assert_eq!(at(&["120"]), Some(Duration::from_mins(2)));
        assert_eq!(at(&[" 7 "]), Some(Duration::from_secs(7)));
        assert_eq!(at(&["999999"]), Some(Duration::from_secs(999_999)));
        // An HTTP date, in each of its three formats; in the past: no pause.
        assert_eq!(
            at(&["Sun, 06 Nov 1994 08:49:47 GMT"]),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            at(&["Sunday, 06-Nov-94 08:49:47 GMT"]),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            at(&["Sun Nov  6 08:49:47 1994"]),
            Some(Duration::from_secs(10))
        );
        assert_eq!(at(&["Sat, 05 Nov 1994 08:49:37 GMT"]), Some(Duration::ZERO));
        // Hostile: ignored.
        for bad in [
            &["-5"][..],
            &["1.5"],
            &[""],
            &["soon"],
            &["1, 2"],
            &["99999999999999999999999"],
            &["1", "2"],
            &["1", "1"],
        ] {
            assert_eq!(at(bad), None, "{bad:?}");
        }
        assert_eq!(retry_after_at(&HeaderMap::new(), now), None);
    }

    #[test]
    fn status_error_carries_its_hint() {
        let e = StatusError::new(StatusCode::SERVICE_UNAVAILABLE, &headers(&["2"]));
        assert_eq!(e.classify().kind(), VerdictKind::NotExecuted);
        assert_eq!(e.classify().retry_after(), Some(Duration::from_secs(2)));
        assert_eq!(
            e.to_string(),
            "HTTP status 503 Service Unavailable (retry after 2s)"
        );
    }
}
