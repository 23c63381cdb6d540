//! The quota a server announces on its answers, read as the HTTP doors
//! read it (issue 63): the fields, and [`heard`], which tells a door's
//! [`Pace`](retries_core::limit::Pace) of them so that the next attempts
//! to the same server are paced.
//!
//! * The IETF draft's fields (draft-ietf-httpapi-ratelimit-headers, the
//!   version of 2025–2026): `RateLimit` is a Structured Field List (RFC
//!   9651) whose members name a policy and carry `r` (the quota left) and
//!   `t` (seconds until it is whole again), optionally `pk` (a partition
//!   key, a Byte Sequence); `RateLimit-Policy` lists the policies with `q`
//!   (the quota), `w` (the window, seconds), `qu` (the unit) and `pk`.
//! * The widespread `X-RateLimit-Remaining` with `X-RateLimit-Reset` (and
//!   `X-RateLimit-Limit`), whose reset servers send either as seconds from
//!   now or as a Unix time: a value of at least 1,000,000,000 (September
//!   2001 as a Unix time, 31 years as a delay) is read as a Unix time, a
//!   smaller one as seconds.
//! * AWS's `x-amz-retry-after`, milliseconds to wait ([`amz_retry_after`]).
//!
//! Chosen where the drafts are silent, and said here: a field that does not
//! parse is ignored whole (RFC 9651's rule); a member with a negative `r`
//! or `t`, a reset in the past or more than a day away ([`MAX_RESET`]), or
//! more than 10¹⁵ left, is ignored, each with a DEBUG event (target
//! `retries::door`, door `http`), never a panic or a stall; of several
//! policies, the one whose quota runs out soonest at an even pace (the
//! largest [`Quota::spacing`]) is the one the response announces.
//!
//! **Per authority, not per partition.** The doors keep one pace per
//! server (`host:port`). The draft's partition key (`pk`) names the
//! partition an answer's quota is counted in, as the server derives it (a
//! hash of an API key, a tenant); a client cannot tell which partition a
//! request falls in before its answer names it, so it cannot pace by it.
//! It is read ([`Quota::partition`]) and not used for pacing: a client
//! that sends for several partitions to one server (several API keys)
//! gives each its own client (or its own `Paces`, through the doors'
//! `quotas`), so that each key's quota paces only its requests.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderMap;

mod sf;

use sf::{Bare, Member};

/// The furthest reset taken: a server's window is seconds to an hour in
/// practice, a day at most; a reset further away is a misreading (a Unix
/// time in milliseconds, a typo) and is ignored.
pub const MAX_RESET: Duration = Duration::from_hours(24);

/// The most quota left taken (RFC 9651's largest Integer is 15 digits).
const MAX_REMAINING: u64 = 1_000_000_000_000_000;

/// A reset of at least this is a Unix time, below it seconds from now.
const EPOCH_FROM: u64 = 1_000_000_000;

/// Where a [`Quota`] was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// The draft's `RateLimit` (with `RateLimit-Policy` where given).
    RateLimit,
    /// `X-RateLimit-Remaining` and `X-RateLimit-Reset`.
    XRateLimit,
}

/// What one response announced of the server's quota.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Quota {
    /// Requests (quota units) left before the reset.
    pub remaining: u64,
    /// Time from the response until the quota is whole again.
    pub reset: Duration,
    /// The window's whole quota, when announced (`RateLimit-Policy`'s `q`,
    /// `X-RateLimit-Limit`).
    pub limit: Option<u64>,
    /// The draft's policy name, when given.
    pub policy: Option<String>,
    /// The draft's partition key (`pk`), when given: the quota is this
    /// partition's (a tenant's, a key's), not the whole server's.
    pub partition: Option<Vec<u8>>,
    /// The fields it was read from.
    pub source: Source,
}

impl Quota {
    /// The pause between first attempts that makes what is left last until
    /// the reset: `reset / remaining`, or the whole reset when nothing is
    /// left.
    #[must_use]
    pub fn spacing(&self) -> Duration {
        match u32::try_from(self.remaining) {
            Ok(0) => self.reset,
            Ok(n) => self.reset / n,
            // More than 4 billion left: no pause worth a nanosecond.
            Err(_) => Duration::ZERO,
        }
    }
}

/// A quota policy the server announced (`RateLimit-Policy`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Policy {
    /// The policy's name.
    pub name: String,
    /// The quota per window (`q`).
    pub quota: u64,
    /// The window (`w`), when given.
    pub window: Option<Duration>,
    /// The quota's unit (`qu`: `"requests"` when not given, per the draft).
    pub unit: Option<String>,
    /// The partition key (`pk`), when given.
    pub partition: Option<Vec<u8>>,
}

/// Why a quota field was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// The field is not a Structured Field List (RFC 9651).
    #[error("not a structured field list at byte {at}: {why}")]
    Syntax {
        /// The byte where parsing stopped.
        at: usize,
        /// What was expected there.
        why: &'static str,
    },
    /// A value out of the range a quota can have.
    #[error("{field}: {why}")]
    Absurd {
        /// The field or parameter.
        field: &'static str,
        /// What is wrong with it.
        why: &'static str,
    },
}

impl From<sf::SyntaxError> for QuotaError {
    fn from(e: sf::SyntaxError) -> Self {
        Self::Syntax {
            at: e.at,
            why: e.why,
        }
    }
}

/// The members of a `RateLimit` field value, each a [`Quota`] (`limit`
/// unset: it is the policy's). A member without `r`, or whose values are
/// absurd, is an error of the whole field.
///
/// ```
/// use std::time::Duration;
/// use retries_http::quota::parse_rate_limit;
///
/// let q = parse_rate_limit(br#""per-second";r=5;t=1, "daily";r=900;t=3600"#).unwrap();
/// assert_eq!(q[0].remaining, 5);
/// assert_eq!(q[1].reset, Duration::from_secs(3600));
/// assert_eq!(q[1].spacing(), Duration::from_secs(4));
/// ```
///
/// # Errors
///
/// [`QuotaError`] when the value is not a list, or a member lacks `r` or
/// has a value out of range.
pub fn parse_rate_limit(value: &[u8]) -> Result<Vec<Quota>, QuotaError> {
    sf::parse_list(value)?
        .iter()
        .map(|m| {
            Ok(Quota {
                remaining: count(m, "r", "RateLimit r")?.ok_or(QuotaError::Absurd {
                    field: "RateLimit r",
                    why: "missing",
                })?,
                reset: seconds(m, "t", "RateLimit t")?.unwrap_or(Duration::ZERO),
                limit: None,
                policy: name(m),
                partition: partition(m),
                source: Source::RateLimit,
            })
        })
        .collect()
}

/// The members of a `RateLimit-Policy` field value.
///
/// ```
/// use std::time::Duration;
/// use retries_http::quota::parse_rate_limit_policy;
///
/// let p = parse_rate_limit_policy(br#""per-second";q=100;w=1"#).unwrap();
/// assert_eq!((p[0].quota, p[0].window), (100, Some(Duration::from_secs(1))));
/// ```
///
/// # Errors
///
/// [`QuotaError`] when the value is not a list, or a member lacks `q` or
/// has a value out of range.
pub fn parse_rate_limit_policy(value: &[u8]) -> Result<Vec<Policy>, QuotaError> {
    sf::parse_list(value)?
        .iter()
        .map(|m| {
            Ok(Policy {
                name: name(m).unwrap_or_default(),
                quota: count(m, "q", "RateLimit-Policy q")?.ok_or(QuotaError::Absurd {
                    field: "RateLimit-Policy q",
                    why: "missing",
                })?,
                window: seconds(m, "w", "RateLimit-Policy w")?,
                unit: match m.param("qu") {
                    Some(Bare::String(s) | Bare::Token(s)) => Some(s.clone()),
                    _ => None,
                },
                partition: partition(m),
            })
        })
        .collect()
}

fn name(m: &Member) -> Option<String> {
    match &m.item {
        Some(Bare::String(s) | Bare::Token(s)) => Some(s.clone()),
        _ => None,
    }
}

fn partition(m: &Member) -> Option<Vec<u8>> {
    match m.param("pk") {
        Some(Bare::Bytes(b)) => Some(b.clone()),
        _ => None,
    }
}

fn count(m: &Member, key: &str, field: &'static str) -> Result<Option<u64>, QuotaError> {
    match m.param(key) {
        None => Ok(None),
        Some(Bare::Integer(n)) => in_range(*n, field).map(Some),
        Some(_) => Err(QuotaError::Absurd {
            field,
            why: "not an integer",
        }),
    }
}

fn in_range(n: i64, field: &'static str) -> Result<u64, QuotaError> {
    let n = u64::try_from(n).map_err(|_| QuotaError::Absurd {
        field,
        why: "negative",
    })?;
    if n > MAX_REMAINING {
        return Err(QuotaError::Absurd {
            field,
            why: "too large",
        });
    }
    Ok(n)
}

fn seconds(m: &Member, key: &str, field: &'static str) -> Result<Option<Duration>, QuotaError> {
    let Some(n) = count(m, key, field)? else {
        return Ok(None);
    };
    let d = Duration::from_secs(n);
    if d > MAX_RESET {
        return Err(QuotaError::Absurd {
            field,
            why: "more than a day",
        });
    }
    Ok(Some(d))
}

/// The values of every `name` field of `headers`, joined as one list
/// (RFC 9110 §5.3; RFC 9651 §4.2: a list split over several fields).
fn joined(headers: &HeaderMap, name: &str) -> Option<Vec<u8>> {
    let mut out: Option<Vec<u8>> = None;
    for v in headers.get_all(name) {
        let out = out.get_or_insert_with(Vec::new);
        if !out.is_empty() {
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(v.as_bytes());
    }
    out
}

fn ignored(field: &'static str, e: &dyn std::fmt::Display) {
    retries_core::door::observe::event(retries_core::door::observe::Level::Debug, "http", field, e);
}

/// The quota `headers` announce, read at wall-clock `now` (for a reset
/// sent as a Unix time): the draft's `RateLimit` (joined with
/// `RateLimit-Policy` by policy name for the limit, and the window when a
/// member has no `t`), else `X-RateLimit-Remaining` with
/// `X-RateLimit-Reset`; of several members, the one whose quota runs out
/// soonest at an even pace. `None` when no quota is announced or its
/// fields are ignored (each with a DEBUG event: see the module docs).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::HeaderMap;
/// use retries_http::quota::{announced, Source};
///
/// let mut h = HeaderMap::new();
/// h.insert("ratelimit", r#""burst";r=2;t=1, "hourly";r=10;t=3600"#.parse().unwrap());
/// h.insert("ratelimit-policy", r#""burst";q=10;w=1, "hourly";q=1000;w=3600"#.parse().unwrap());
/// let q = announced(&h, SystemTime::now()).unwrap();
/// assert_eq!((q.policy.as_deref(), q.remaining, q.limit), (Some("hourly"), 10, Some(1000)));
/// assert_eq!(q.spacing(), Duration::from_secs(360));
///
/// let mut h = HeaderMap::new();
/// h.insert("x-ratelimit-remaining", "0".parse().unwrap());
/// h.insert("x-ratelimit-reset", "30".parse().unwrap());
/// let q = announced(&h, SystemTime::now()).unwrap();
/// assert_eq!((q.remaining, q.reset, q.source), (0, Duration::from_secs(30), Source::XRateLimit));
/// ```
#[must_use]
pub fn announced(headers: &HeaderMap, now: SystemTime) -> Option<Quota> {
    if let Some(value) = joined(headers, "ratelimit") {
        match parse_rate_limit(&value) {
            Ok(members) => {
                let policies = joined(headers, "ratelimit-policy")
                    .and_then(|p| match parse_rate_limit_policy(&p) {
                        Ok(p) => Some(p),
                        Err(e) => {
                            ignored("RateLimit-Policy ignored", &e);
                            None
                        }
                    })
                    .unwrap_or_default();
                let tightest = members
                    .into_iter()
                    .map(|mut q| {
                        let policy = policies
                            .iter()
                            .find(|p| q.policy.as_deref() == Some(p.name.as_str()));
                        if let Some(p) = policy {
                            q.limit = Some(p.quota);
                            if q.reset.is_zero() {
                                q.reset = p.window.unwrap_or_default();
                            }
                        }
                        q
                    })
                    .max_by_key(Quota::spacing);
                if tightest.is_some() {
                    return tightest;
                }
            }
            Err(e) => ignored("RateLimit ignored", &e),
        }
    }
    match x_rate_limit(headers, now) {
        Ok(q) => q,
        Err(e) => {
            ignored("X-RateLimit ignored", &e);
            None
        }
    }
}

/// `X-RateLimit-Remaining` with `X-RateLimit-Reset` (and
/// `X-RateLimit-Limit`), if both are there. A fraction is taken to the
/// millisecond for the reset (`1.25`, or a Unix time such as
/// `1767225600.250`: servers with windows of a second send them) and
/// dropped from a count (a fraction of a request is not one).
fn x_rate_limit(headers: &HeaderMap, now: SystemTime) -> Result<Option<Quota>, QuotaError> {
    let (Some((remaining, _)), Some((whole, millis))) = (
        decimal(headers, "x-ratelimit-remaining")?,
        decimal(headers, "x-ratelimit-reset")?,
    ) else {
        return Ok(None);
    };
    let reset = Duration::from_secs(whole) + Duration::from_millis(u64::from(millis));
    let reset = if whole >= EPOCH_FROM {
        (UNIX_EPOCH + reset)
            .duration_since(now)
            .map_err(|_| QuotaError::Absurd {
                field: "x-ratelimit-reset",
                why: "a Unix time in the past",
            })?
    } else {
        reset
    };
    if reset > MAX_RESET {
        return Err(QuotaError::Absurd {
            field: "x-ratelimit-reset",
            why: "more than a day away",
        });
    }
    Ok(Some(Quota {
        remaining,
        reset,
        limit: decimal(headers, "x-ratelimit-limit")
            .ok()
            .flatten()
            .map(|(n, _)| n),
        policy: None,
        partition: None,
        source: Source::XRateLimit,
    }))
}

/// The non-negative decimal number of header `name`: its whole part and
/// its thousandths (a finer fraction rounded up); `None` when absent.
fn decimal(headers: &HeaderMap, name: &'static str) -> Result<Option<(u64, u32)>, QuotaError> {
    let Some(v) = headers.get(name) else {
        return Ok(None);
    };
    let bad = |why| QuotaError::Absurd { field: name, why };
    let text = v.to_str().map_err(|_| bad("not text"))?.trim();
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty()
        || whole.len() > 16
        || frac.len() > 16
        || !whole.bytes().all(|c| c.is_ascii_digit())
        || !frac.bytes().all(|c| c.is_ascii_digit())
    {
        return Err(bad("not a non-negative number"));
    }
    let whole: u64 = whole.parse().map_err(|_| bad("not a number"))?;
    if whole > MAX_REMAINING {
        return Err(bad("too large"));
    }
    let mut millis = frac
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(3)
        .fold(0u32, |n, c| n * 10 + u32::from(c - b'0'));
    if frac.bytes().skip(3).any(|c| c != b'0') {
        millis += 1;
    }
    Ok(Some(if millis == 1000 {
        (whole + 1, 0)
    } else {
        (whole, millis)
    }))
}

/// AWS's `x-amz-retry-after`: milliseconds to wait before the next
/// attempt, as a pause hint (the doors take it where a response has no
/// `Retry-After`: `retries_core::http::amz_retry_after`, which this
/// calls). `None` when absent, not a number of milliseconds, or more than
/// [`MAX_RESET`] (a DEBUG event then).
///
/// ```
/// use std::time::Duration;
/// use retries_http::quota::amz_retry_after;
///
/// let mut h = http::HeaderMap::new();
/// h.insert("x-amz-retry-after", "1500".parse().unwrap());
/// assert_eq!(amz_retry_after(&h), Some(Duration::from_millis(1500)));
/// ```
#[must_use]
pub fn amz_retry_after(headers: &HeaderMap) -> Option<Duration> {
    if !headers.contains_key("x-amz-retry-after") {
        return None;
    }
    let d = retries_core::http::amz_retry_after(headers);
    if d.is_none() {
        ignored(
            "x-amz-retry-after ignored",
            &"not one number of milliseconds up to a day",
        );
    }
    d
}

/// Tell `pace` the quota `headers` announce, if they announce one (see
/// [`announced`]), on the answer to a request `sent` then: what the HTTP
/// doors do with every answer, so that the next attempts to the same
/// server are paced by it. Cheap when no quota field is there (two
/// look-ups).
pub fn heard(pace: &retries_core::limit::Pace, headers: &HeaderMap, sent: std::time::Instant) {
    if !announces(headers) {
        return;
    }
    if let Some(q) = announced(headers, SystemTime::now()) {
        pace.announce(q.remaining, q.reset, sent, retries_core::door::now());
    }
}

/// Do `headers` carry a quota field (`RateLimit`, `X-RateLimit-Remaining`)?
/// What [`heard`] checks before it parses anything, on every answer: the
/// names of a few headers are compared (the answers of most servers carry
/// a handful), a longer map is looked up twice (each look-up hashes the
/// name: about 80 instructions, `scripts/layer-instructions.sh`).
#[must_use]
pub fn announces(headers: &HeaderMap) -> bool {
    if headers.keys_len() <= 8 {
        return headers
            .keys()
            .any(|name| *name == RATELIMIT || *name == X_REMAINING);
    }
    headers.contains_key(RATELIMIT) || headers.contains_key(X_REMAINING)
}

const RATELIMIT: http::HeaderName = http::HeaderName::from_static("ratelimit");
const X_REMAINING: http::HeaderName = http::HeaderName::from_static("x-ratelimit-remaining");

#[cfg(test)]
mod tests;
