//! The names calls report under: [`Name`], the names the doors make per
//! route or method (bounded), and the names a door's metrics go under
//! ([`MetricNames`]).

use std::sync::atomic::{AtomicBool, Ordering};

use super::record::misconfigured;
use crate::budget::TokenBucket;
use crate::policy::PolicyError;

/// The name a retried call reports under: the `function` field of its span
/// and the `function` label of its metrics. `const`-constructible, and meant
/// to be a `static`, so that the labels of the happy path's metrics are built
/// once, at compile time (the happy path allocates nothing, even with the
/// `metrics` feature on). `#[retryable]` declares one per function, named
/// `module::path::function`; with [`call`](crate::call()), pass one to
/// [`Retry::name`](crate::Retry::name).
///
/// A name also carries the default budget of the calls made under it (a
/// [`TokenBucket::DEFAULT`], see [`budget`](crate::budget)), and remembers
/// whether an invalid run-time policy was already reported for it.
///
/// ```
/// use retries::observe::Name;
/// static STOCK: Name = Name::new("inventory::stock");
/// assert_eq!(STOCK.as_str(), "inventory::stock");
/// ```
#[derive(Debug)]
pub struct Name {
    name: &'static str,
    /// A door's name (the layer's, the middleware's, a call name they
    /// made): its attempts are client spans for OpenTelemetry.
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    pub(super) client: bool,
    /// The owner of the calls reports their give-up ([`Name::give_up_reported_by_owner`]):
    /// the engine's `call failed` event is DEBUG, not WARN.
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    pub(super) owner_reports: bool,
    bucket: TokenBucket,
    warned: AtomicBool,
    /// The labels of the happy path's metrics, built at compile time
    /// (empty without the `metrics` feature).
    pub(super) labels: super::keys::Labels,
    /// The keys of the happy path, made once, when the name is made by
    /// this crate (see `keys`); else made per report from the labels.
    #[cfg(feature = "metrics")]
    pub(super) keys: Option<&'static super::keys::Keys>,
    /// The keys of the failure paths, each made at its first report.
    #[cfg(feature = "metrics")]
    pub(super) failure_keys: std::sync::OnceLock<Box<super::keys::FailureKeys>>,
}

impl Name {
    /// A name.
    #[must_use]
    pub const fn new(name: &'static str) -> Self {
        Self::of(name, false)
    }

    /// The name of a door's calls: their attempts are OpenTelemetry client
    /// spans (`otel.kind = "client"`), as a door that sends requests
    /// declares them (see [`door`](crate::door)).
    #[must_use]
    pub const fn client(name: &'static str) -> Self {
        Self::of(name, true)
    }

    const fn of(name: &'static str, client: bool) -> Self {
        Self {
            name,
            client,
            owner_reports: false,
            bucket: TokenBucket::DEFAULT,
            warned: AtomicBool::new(false),
            labels: super::keys::Labels::new(name),
            #[cfg(feature = "metrics")]
            keys: None,
            #[cfg(feature = "metrics")]
            failure_keys: std::sync::OnceLock::new(),
        }
    }

    /// The labels of this name's metrics, for its [`Keys`](super::keys::Keys).
    /// Not public API.
    #[doc(hidden)]
    #[must_use]
    pub const fn labels(&'static self) -> &'static super::keys::Labels {
        &self.labels
    }

    /// The same name, reporting under `keys` (made over this name's labels,
    /// at compile time): what `#[retryable]` declares. Not public API.
    #[doc(hidden)]
    #[must_use]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables, unused_mut))]
    pub const fn with_keys(mut self, keys: &'static super::keys::Keys) -> Self {
        #[cfg(feature = "metrics")]
        {
            self.keys = Some(keys);
        }
        self
    }

    /// The same name, for calls whose give-up their owner reports: the
    /// engine's `call failed` event is at DEBUG instead of WARN (see
    /// [`observe`](crate::observe)). For a door that goes on after a call
    /// gives up and says what it did instead, once (a Kafka runner that
    /// republishes the record to a retry topic, and logs a WARN only when it
    /// dead-letters it): one WARN per thing that gave up, not two.
    ///
    /// ```
    /// use retries::observe::Name;
    /// static HANDLER: Name = Name::new("orders::handle").give_up_reported_by_owner();
    /// assert_eq!(HANDLER.as_str(), "orders::handle");
    /// ```
    #[must_use]
    pub const fn give_up_reported_by_owner(mut self) -> Self {
        self.owner_reports = true;
        self
    }

    /// The name.
    #[must_use]
    pub const fn as_str(&self) -> &'static str {
        self.name
    }

    /// The default budget of the calls made under this name.
    #[must_use]
    pub const fn budget(&self) -> &TokenBucket {
        &self.bucket
    }

    /// Log `e` once for this name: the policy of a call made under it breaks
    /// a rule (the engine then runs it as the module docs of
    /// [`policy`](crate::policy) say).
    #[cold]
    pub(crate) fn report_invalid_policy(&self, e: PolicyError) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            misconfigured("policy", e, format_args!("function {}", self.name));
        }
    }
}

/// The name of calls made with [`call`](crate::call()) that set none, one
/// of [`CALL_SITES`] by the call's place in the source: each has its own
/// default budget, and all report as `retries::call`.
pub(crate) static UNNAMED: [Name; CALL_SITES] =
    [const { Name::new("retries::call").with_keys(&UNNAMED_KEYS) }; CALL_SITES];

/// The keys every unnamed call reports under (their labels are the same).
static UNNAMED_LABELS: super::keys::Labels = super::keys::Labels::new("retries::call");
static UNNAMED_KEYS: super::keys::Keys = super::keys::Keys::new(&UNNAMED_LABELS);

/// How many default budgets the unnamed calls of a process spread over
/// (see [`unnamed`]).
pub(crate) const CALL_SITES: usize = 256;

/// The name (and so the default budget) of an unnamed call made at `site`:
/// its line, column and file name's length, hashed onto [`CALL_SITES`]
/// names. No lock, no allocation, a few instructions, and the same on every
/// run (an address would move with ASLR); two sites share a budget only
/// when their hashes collide (with 20 sites in a program, about one chance
/// in seven that some two do).
#[inline]
pub(crate) fn unnamed(site: &'static std::panic::Location<'static>) -> &'static Name {
    let key = (u64::from(site.line()) << 32)
        ^ (u64::from(site.column()) << 16)
        ^ site.file().len() as u64;
    // Fibonacci hashing: the product's high bits pick the name.
    let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    &UNNAMED[(h >> (64 - CALL_SITES.trailing_zeros())) as usize]
}

/// At most this many names are made for the calls of the doors (gRPC
/// methods, HTTP routes), for the process: past it a call reports under
/// its door's own name, so no request can grow the set of labels without
/// limit.
pub const MAX_CALL_NAMES: usize = 256;

/// The names of the doors' calls, made once each (and kept for the
/// process: at most [`MAX_CALL_NAMES`]).
pub(crate) mod call_names {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{OnceLock, RwLock};

    use super::{MAX_CALL_NAMES, Name};

    static MADE: AtomicUsize = AtomicUsize::new(0);
    static FULL: AtomicBool = AtomicBool::new(false);

    /// The name of the calls labelled `path` (a gRPC method's
    /// `/pkg.Service/Method`, a route a door names).
    pub(crate) fn named(path: &str, fallback: &'static Name) -> &'static Name {
        static NAMES: OnceLock<RwLock<HashMap<Box<str>, &'static Name>>> = OnceLock::new();
        let names = NAMES.get_or_init(RwLock::default);
        if let Some(name) = names.read().ok().and_then(|n| n.get(path).copied()) {
            return name;
        }
        make(names, path.into(), || path.to_owned(), fallback)
    }

    #[cold]
    fn make<K: std::hash::Hash + Eq>(
        names: &RwLock<HashMap<K, &'static Name>>,
        key: K,
        text: impl FnOnce() -> String,
        fallback: &'static Name,
    ) -> &'static Name {
        let Ok(mut names) = names.write() else {
            return fallback;
        };
        if let Some(name) = names.get(&key) {
            return name;
        }
        if MADE.fetch_add(1, Ordering::Relaxed) >= MAX_CALL_NAMES {
            MADE.fetch_sub(1, Ordering::Relaxed);
            if !FULL.swap(true, Ordering::Relaxed) {
                #[cfg(feature = "tracing")]
                tracing::debug!(
                    target: "retries",
                    max = crate::observe::observer::int(MAX_CALL_NAMES),
                    "too many call names: further calls report under their door's name"
                );
            }
            return fallback;
        }
        // Made once per method or route, at most MAX_CALL_NAMES for the
        // process: the leak is bounded.
        let text: &'static str = Box::leak(text().into_boxed_str());
        let labels = Box::leak(Box::new(super::super::keys::Labels::new(text)));
        let keys = Box::leak(Box::new(super::super::keys::Keys::new(labels)));
        let name: &'static Name = Box::leak(Box::new(Name::client(text).with_keys(keys)));
        names.insert(key, name);
        name
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        static DOOR: Name = Name::new("door");

        #[test]
        fn names_are_made_once_each_and_no_more_than_the_cap() {
            let first = named("/a.S/M0", &DOOR);
            assert_eq!(first.as_str(), "/a.S/M0");
            assert!(std::ptr::eq(first, named("/a.S/M0", &DOOR)), "made once");
            let route = named("GET /users/{id}", &DOOR);
            assert_eq!(route.as_str(), "GET /users/{id}");
            for i in 1..MAX_CALL_NAMES - 1 {
                assert_eq!(
                    named(&format!("/a.S/M{i}"), &DOOR).as_str(),
                    format!("/a.S/M{i}")
                );
            }
            // The cap is reached: a new name is the door's, known ones stay.
            assert!(std::ptr::eq(
                named("/a.S/one-too-many", &DOOR),
                &raw const DOOR
            ));
            assert!(std::ptr::eq(named("PUT /x", &DOOR), &raw const DOOR));
            assert_eq!(named("/a.S/M7", &DOOR).as_str(), "/a.S/M7");
        }
    }
}

/// The names a door's metrics go under (`RetryLayer::metric_names`,
/// `RetryMiddleware::metric_names`; feature `metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetricNames {
    /// This crate's `retry.*` instruments only (the default).
    #[default]
    Retries,
    /// The `retry.*` instruments, and the OpenTelemetry conventions'
    /// instruments for the door's calls: gRFC A66's and A96's for gRPC,
    /// the HTTP semantic conventions' `http.client.request.duration` for
    /// HTTP (see "Metrics of the conventions" above).
    OpenTelemetry,
}
