//! The proof of deduplication that a keyed resend waits for.
//!
//! A client door in keyed mode (`idempotent_by_key`) puts the call's key on
//! every attempt and, when the server runs each key once, may send a request
//! whose outcome is unknown again: the server answers it from its record.
//! Against a server (or one route of it) deployed without the idempotency
//! layer, that resend runs the work twice. So the client does not take the
//! server's deduplication on faith: `retries-tower`'s `IdempotencyLayer`
//! marks every answer to a keyed request, first runs and replays alike,
//! with [`DEDUPLICATED`], and a door resends an unknown outcome by key only
//! to a [`Target`] (authority and route) whose answers have shown the mark.
//!
//! The rules, per target:
//!
//! * **proven** by any answer that carries the mark;
//! * **demoted** by a successful answer (2xx) to a keyed request that does
//!   not carry it: the request ran without deduplication, so the route (or
//!   a replica behind it) does not deduplicate (gRPC: an answer whose
//!   headers carry an error `grpc-status` is an error). One WARN per
//!   target says so; the target stays unproven for [`DEMOTED_FOR`] after its last
//!   unmarked success, whatever marks come meanwhile (replicas of two kinds
//!   behind one authority keep it unproven). Error answers without the mark
//!   (a proxy's 502, a shed 503) neither prove nor demote;
//! * **declared** by the user for servers of other vendors, which
//!   deduplicate by key without this project's mark
//!   (`RetryLayer::dedup_declared`, `RetryMiddleware::dedup_declared`).
//!
//! Until a target is proven, a keyed request is **not idempotent**: its key
//! still travels (the server may record it, a `reconcile` may look it up),
//! a refusal before any work is retried as for any call, and an unknown
//! outcome is resolved by `reconcile` if the door has one, else the call
//! stops with `Reason::UnknownOutcome`. So the first calls to a route whose
//! replies are lost end unknown instead of being resent: the price of
//! never charging twice where the server was never seen to deduplicate.
//!
//! What stays a window: replicas of one authority, some with the layer and
//! some without, look proven until the first unmarked success is seen. A
//! deployment that is consistent (every route of an authority behind the
//! layer, or none) has no window.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::header::{HOST, HeaderName};
use http::{HeaderMap, StatusCode, Uri};

/// The mark of a deduplicated answer: `retries-deduplicated: 1` on every
/// answer the idempotency layer gives a keyed request (gRPC: the same
/// response metadata).
pub const DEDUPLICATED: HeaderName = HeaderName::from_static("retries-deduplicated");

/// How long a target stays unproven after a keyed request to it succeeded
/// without the mark: 10 minutes (a rolling deploy that adds the layer is
/// trusted once it has been over that long).
pub const DEMOTED_FOR: Duration = Duration::from_mins(10);

/// The most targets a door keeps proofs for; past it a new target is never
/// proven (and so never resent by key), with one DEBUG event.
pub const MAX_TARGETS: usize = 1024;

/// Where a keyed request goes, as its proof is kept: the authority (the
/// URI's, else the `Host` header) and the route template when the request
/// names one, else the path without its query. Name routes whose paths
/// carry ids (`Route("/charges/{id}")`), so that one proof covers them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target(Box<str>);

impl Target {
    /// The target of a request to `uri` with `headers`, on `route` if the
    /// request names one.
    #[must_use]
    pub fn of(uri: &Uri, headers: &HeaderMap, route: Option<&str>) -> Self {
        let authority = uri
            .authority()
            .map(http::uri::Authority::as_str)
            .or_else(|| headers.get(HOST).and_then(|h| h.to_str().ok()))
            .unwrap_or("");
        Self::new(authority, route.unwrap_or_else(|| uri.path()))
    }

    /// The target `route` (a template, or a path without its query) of
    /// `authority`, for a client whose requests are not `http::Uri`s.
    #[must_use]
    pub fn new(authority: &str, route: &str) -> Self {
        Self(format!("{authority} {route}").into_boxed_str())
    }

    /// `authority route`, as events name it.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a door saw of one target.
#[derive(Debug, Default)]
struct Seen {
    marked: bool,
    unmarked_at: Option<Instant>,
    warned: bool,
}

/// The proofs one door (every clone of it) has learned.
#[derive(Debug, Default)]
pub(crate) struct Proofs {
    seen: Mutex<HashMap<Target, Seen>>,
}

impl Proofs {
    /// Has `target` shown the mark, and no unmarked success for
    /// [`DEMOTED_FOR`]?
    pub(crate) fn proven(&self, target: &Target) -> bool {
        let Ok(seen) = self.seen.lock() else {
            return false;
        };
        seen.get(target).is_some_and(|s| {
            s.marked
                && s.unmarked_at
                    .is_none_or(|at| retries_core::door::since(at) >= DEMOTED_FOR)
        })
    }

    /// Learn from an answer to a keyed request sent to `target`.
    pub(crate) fn learn(&self, target: &Target, status: StatusCode, headers: &HeaderMap) {
        let marked = headers.contains_key(DEDUPLICATED);
        // gRPC: a trailers-only answer with an error status in its headers
        // is an error, whatever its HTTP status.
        let grpc_error = headers.get("grpc-status").is_some_and(|s| s != "0");
        if !marked && (!status.is_success() || grpc_error) {
            return; // a proxy's or a shedder's error proves nothing
        }
        let Ok(mut seen) = self.seen.lock() else {
            return;
        };
        let full = seen.len() >= MAX_TARGETS;
        let entry = match seen.get_mut(target) {
            Some(entry) => entry,
            None if full => {
                drop(seen);
                retries_core::door::observe::event(
                    retries_core::door::observe::Level::Debug,
                    "http",
                    "too many targets to keep proofs of deduplication for; not learned",
                    target,
                );
                return;
            }
            None => seen.entry(target.clone()).or_default(),
        };
        if marked {
            entry.marked = true;
            return;
        }
        entry.unmarked_at = Some(retries_core::door::now());
        if !std::mem::replace(&mut entry.warned, true) {
            drop(seen);
            retries_core::door::observe::event(
                retries_core::door::observe::Level::Warn,
                "http",
                "a keyed request succeeded without the mark retries-deduplicated: this route does \
                 not deduplicate by key (is IdempotencyLayer in front of every replica?), so its \
                 unknown outcomes are not sent again",
                target,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marked() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(DEDUPLICATED, http::HeaderValue::from_static("1"));
        h
    }

    #[test]
    fn a_target_is_its_authority_and_route() {
        let uri: Uri = "http://pay.example:8080/charges/7?x=1".parse().unwrap();
        let h = HeaderMap::new();
        assert_eq!(
            Target::of(&uri, &h, None).as_str(),
            "pay.example:8080 /charges/7"
        );
        assert_eq!(
            Target::of(&uri, &h, Some("/charges/{id}")).as_str(),
            "pay.example:8080 /charges/{id}"
        );
        let mut host = HeaderMap::new();
        host.insert(HOST, http::HeaderValue::from_static("pay.example"));
        let relative: Uri = "/charges".parse().unwrap();
        assert_eq!(
            Target::of(&relative, &host, None).as_str(),
            "pay.example /charges"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn proven_by_a_mark_demoted_by_an_unmarked_success_for_ten_minutes() {
        let p = Proofs::default();
        let t = Target("a /charges".into());
        assert!(!p.proven(&t), "nothing seen: not proven");
        p.learn(&t, StatusCode::BAD_GATEWAY, &HeaderMap::new());
        let mut unavailable = HeaderMap::new();
        unavailable.insert("grpc-status", http::HeaderValue::from_static("14"));
        p.learn(&t, StatusCode::OK, &unavailable);
        assert!(!p.proven(&t), "an unmarked error proves nothing");
        assert!(
            !p.seen.lock().unwrap().get(&t).is_some_and(|s| s.warned),
            "nor demotes"
        );
        p.learn(&t, StatusCode::CREATED, &marked());
        assert!(p.proven(&t));
        p.learn(&t, StatusCode::OK, &HeaderMap::new());
        assert!(!p.proven(&t), "an unmarked success demotes");
        assert!(p.seen.lock().unwrap()[&t].warned, "and says so, once");
        p.learn(&t, StatusCode::OK, &marked());
        assert!(!p.proven(&t), "a mark meanwhile does not lift it");
        tokio::time::advance(Duration::from_secs(599)).await;
        assert!(!p.proven(&t));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(p.proven(&t), "ten minutes after the last unmarked success");
        let other = Target("a /refunds".into());
        assert!(!p.proven(&other), "a proof is per route");
    }
}
