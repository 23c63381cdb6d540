//! Fault injection by verdict, for running systems: the
//! faults a retry policy must survive, injected where they happen, including
//! the one behind double charges that outcome-replacing fault injectors cannot
//! make: **the work happened, then the reply was lost**.
//!
//! A [`Chaos`] holds the rules (a [`Fault`], a rate, a scope), a seeded
//! random source, a runtime switch and the counters. It is shared (cheap to
//! clone, `Send + Sync`) by the places that inject:
//!
//! | place | how | kinds |
//! |---|---|---|
//! | a server (axum, hyper, tonic) | [`FaultLayer`] (feature `tower`) | all five |
//! | a tower client (hyper, a tonic channel) | [`ClientFaultLayer`] (feature `tower`), under the retry layer | all five, on the client's side of the wire |
//! | an HTTP client (reqwest) | [`FaultMiddleware`] (feature `reqwest-middleware`), under the retry middleware | the same |
//! | code no network layer sees | [`Chaos::around`] inside a `#[retryable]` body or a `retries::call` closure | all five, around the future |
//!
//! # The faults, by verdict
//!
//! | [`Fault`] | when | server answer | the client sees | verdict |
//! |---|---|---|---|---|
//! | `Refuse` | before the handler | HTTP 503 with `Retry-After` (the pause given, else 0: a 503 without it reads as an unknown outcome to a client, which would not resend a `POST`); gRPC `UNAVAILABLE` (with `grpc-retry-pushback-ms` if given) | a refusal; a refused connection from the middleware | not executed |
//! | `Delay` | before the handler | the handler's, late | a slow answer | — |
//! | `Hang` | before the handler | none until the caller's deadline (`grpc-timeout`, `retries-timeout-ms`) or `max`, then HTTP 504 / gRPC `DEADLINE_EXCEEDED` | a timeout | unknown |
//! | `DropReply` | **after** the handler | none: the connection is closed (HTTP/1.1: not a byte of the answer is sent) or the stream reset (HTTP/2, gRPC) | a broken connection | unknown |
//! | `FailAfter` | **after** the handler | its error status (default HTTP 503, gRPC `UNAVAILABLE`) | an error that came after the work | unknown |
//!
//! Over plain HTTP/2 the head of a dropped reply is sent before the stream
//! is reset (hyper sends a response's head before its body, and an axum
//! service cannot fail): the client sees the status, then the body breaks.
//! Over HTTP/1.1 nothing of the answer is sent; over gRPC the reset comes
//! before any message, and a tonic client reports it as `INTERNAL`.
//!
//! # The demo
//!
//! `cargo run -p retries-payments --example chaos`: every kind at 20 % on
//! the charges of a payments service that does not deduplicate, 100 calls
//! of 4 attempts each, seed 2026, over gRPC (tonic) and HTTP (axum); the
//! same seed draws the same faults for the same request numbers on both, and
//! both callers meet them alike, so both protocols print the same figures:
//!
//! | caller | calls ok | requests | charges | charged twice | faults injected (delay, hang, refuse, drop, fail after) |
//! |---|---|---|---|---|---|
//! | a hand-written loop, every error retried with the same request | 84 | 202 | 130 | 31 | 43, 42, 30, 22, 24 |
//! | `retries`, not idempotent, `reconcile` by key | 90 | 208 (look-ups included) | 90 | 0 | 28, 25, 18, 13, 19 |
//!
//! Every charge of the second caller is a call that succeeded; its 10
//! failed calls charged nothing.
//!
//! # Rates, scopes, the switch
//!
//! Each [`Rule`] draws on its own for each request (an independent rate
//! per rule): several faults may meet in one request, in the order of the
//! table (a delay, then a hang or a refusal, and after the handler a dropped
//! reply before an error status). A draw depends only on the seed, the
//! request's number (every request is numbered as it arrives, from 0, with
//! the switch on or off) and the rule's index: a sequential run is
//! reproducible from its seed, and request 150 draws the same whether the
//! switch was off for the first 100 or not.
//!
//! A rule's scope is a list of patterns, `"METHOD /prefix"` or `"/prefix"`
//! (an HTTP request's method and path, a gRPC call's method path such as
//! `/payments.Payments/Charge`, or the name given to [`Chaos::around`]);
//! no pattern means every request. The switch ([`Chaos::set_enabled`]) and
//! the rates ([`Chaos::set_rate`]) change while running, from any task or
//! thread, and take effect on the next request; a disabled `Chaos` costs two
//! atomic operations per request (the request counter and the switch), and
//! a service without the layer nothing at all. A `Chaos` starts enabled (as
//! Polly's chaos strategies do), or disabled with
//! [`ChaosBuilder::start_disabled`], for an operator to turn on.
//!
//! # Counting what happened
//!
//! For each kind, **injected** counts the faults drawn and applied, and
//! **observed** those that took effect: a dropped reply whose connection
//! was really cut (not one whose handler failed by itself, or whose caller
//! left first), a delay that ran out, a hang that ended (by its caller
//! leaving or its bound). The server's handler reports each effect it
//! performs with [`Chaos::effect`] and the key that identifies it (a
//! charge's idempotency key, an order's external id); [`Chaos::report`]
//! gives requests, effects and **duplicate effects**: the figure that shows
//! whether idempotency keys and `reconcile` hold. The same counts go to the
//! `metrics` facade (`retry.chaos.injected`, `retry.chaos.observed`, label
//! `kind`) and to DEBUG events (target `retries::chaos`).
//!
//! ```
//! use std::time::Duration;
//! use retries_chaos::{Chaos, Fault, Rule};
//!
//! let chaos = Chaos::builder()
//!     .seed(7)
//!     .rule(Rule::new(Fault::DropReply).rate(0.2).only(["POST /charges"]))
//!     .rule(Rule::new(Fault::Refuse { retry_after: Some(Duration::from_secs(1)) }).rate(0.1))
//!     .build()?;
//! // From an admin endpoint, while running:
//! chaos.set_rate(retries_chaos::FaultKind::DropReply, 0.05)?;
//! chaos.set_enabled(false);
//! # Ok::<(), retries_chaos::ChaosError>(())
//! ```
#![cfg_attr(feature = "tower", doc = "[`FaultLayer`]: crate::FaultLayer")]
#![cfg_attr(
    not(feature = "tower"),
    doc = "[`FaultLayer`]: https://docs.rs/retries-core/latest/retries_core/chaos/struct.FaultLayer.html"
)]
#![cfg_attr(
    feature = "tower",
    doc = "[`ClientFaultLayer`]: crate::ClientFaultLayer"
)]
#![cfg_attr(
    not(feature = "tower"),
    doc = "[`ClientFaultLayer`]: https://docs.rs/retries-core/latest/retries_core/chaos/struct.ClientFaultLayer.html"
)]
#![cfg_attr(
    feature = "reqwest-middleware",
    doc = "[`FaultMiddleware`]: crate::FaultMiddleware"
)]
#![cfg_attr(
    not(feature = "reqwest-middleware"),
    doc = "[`FaultMiddleware`]: https://docs.rs/retries-core/latest/retries_core/chaos/struct.FaultMiddleware.html"
)]

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use retries_core::verdict::{Classify, Verdict};

#[cfg(feature = "tower")]
mod client;
#[cfg(feature = "reqwest-middleware")]
mod middleware;
#[cfg(feature = "tower")]
mod server;

#[cfg(feature = "tower")]
pub use client::{ClientFaultFuture, ClientFaultLayer, ClientFaultService};
#[cfg(feature = "reqwest-middleware")]
pub use middleware::FaultMiddleware;
#[cfg(feature = "tower")]
pub use server::{FaultBody, FaultFuture, FaultLayer, FaultService};

/// A fault to inject; see the [module docs](self) for what each does where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Refuse before the work: nothing runs (not executed). A server answers
    /// HTTP 503 with `Retry-After` (`retry_after`, else 0, so that the
    /// client's table reads "refused before the work"), or gRPC
    /// `UNAVAILABLE` with `grpc-retry-pushback-ms` when `retry_after` is
    /// given.
    Refuse {
        /// The pause the refusal asks for, if any.
        retry_after: Option<Duration>,
    },
    /// Wait this long before the work.
    Delay(Duration),
    /// Never answer: until the caller's deadline on the wire (a server), or
    /// `max`, whichever comes first; the work does not run.
    Hang {
        /// The longest hang (the blast radius when no deadline travels).
        max: Duration,
    },
    /// Do the work, then lose the reply.
    DropReply,
    /// Do the work, then answer an error.
    FailAfter {
        /// The HTTP status answered (default 503).
        http_status: u16,
        /// The gRPC status code answered (default 14, `UNAVAILABLE`).
        grpc_code: u8,
    },
}

impl Fault {
    /// [`Fault::FailAfter`] with HTTP 503 and gRPC `UNAVAILABLE`: the
    /// answer that most often arrives after the work was done.
    pub const FAIL_AFTER: Self = Self::FailAfter {
        http_status: 503,
        grpc_code: 14,
    };

    /// Its kind.
    #[must_use]
    pub const fn kind(&self) -> FaultKind {
        match self {
            Self::Refuse { .. } => FaultKind::Refuse,
            Self::Delay(_) => FaultKind::Delay,
            Self::Hang { .. } => FaultKind::Hang,
            Self::DropReply => FaultKind::DropReply,
            Self::FailAfter { .. } => FaultKind::FailAfter,
        }
    }
}

/// The kinds of [`Fault`], for counters and [`Chaos::set_rate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// [`Fault::Refuse`].
    Refuse,
    /// [`Fault::Delay`].
    Delay,
    /// [`Fault::Hang`].
    Hang,
    /// [`Fault::DropReply`].
    DropReply,
    /// [`Fault::FailAfter`].
    FailAfter,
}

impl FaultKind {
    /// Every kind, in the order faults meet in a request.
    pub const ALL: [Self; 5] = [
        Self::Delay,
        Self::Hang,
        Self::Refuse,
        Self::DropReply,
        Self::FailAfter,
    ];

    /// Its name in metrics and events: `refuse`, `delay`, `hang`,
    /// `drop_reply`, `fail_after`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Refuse => "refuse",
            Self::Delay => "delay",
            Self::Hang => "hang",
            Self::DropReply => "drop_reply",
            Self::FailAfter => "fail_after",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A bad chaos setting: never a panic.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ChaosError {
    /// A rate outside `0.0..=1.0`, or not a number.
    #[error("the rate of rule {rule} ({kind}) must be a number from 0 to 1, not {rate}")]
    Rate {
        /// The rule's index (in the order given).
        rule: usize,
        /// Its kind.
        kind: FaultKind,
        /// The rate given.
        rate: f64,
    },
    /// A scope pattern that is not `"METHOD /prefix"` or `"prefix"`.
    #[error("rule {rule}: bad scope pattern {pattern:?}: {why}")]
    Pattern {
        /// The rule's index.
        rule: usize,
        /// The pattern given.
        pattern: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A `FailAfter` whose HTTP status is not from 100 to 599, or whose gRPC
    /// code is not from 1 to 16.
    #[error(
        "rule {rule}: FailAfter needs an HTTP status from 100 to 599 and a gRPC code from 1 to 16, not {http_status} and {grpc_code}"
    )]
    Status {
        /// The rule's index.
        rule: usize,
        /// The HTTP status given.
        http_status: u16,
        /// The gRPC code given.
        grpc_code: u8,
    },
    /// [`Chaos::set_rate`] for a kind no rule has.
    #[error("no rule injects {0}")]
    NoRule(FaultKind),
}

/// One scope pattern: an optional method and a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pattern {
    method: Option<String>,
    prefix: String,
}

impl Pattern {
    fn parse(rule: usize, text: &str) -> Result<Self, ChaosError> {
        let bad = |why| ChaosError::Pattern {
            rule,
            pattern: text.to_string(),
            why,
        };
        let mut words = text.split(' ');
        let (method, prefix) = match (words.next(), words.next(), words.next()) {
            (Some(p), None, _) => (None, p),
            (Some(m), Some(p), None) => (Some(m), p),
            _ => return Err(bad("at most one space, between the method and the prefix")),
        };
        if prefix.is_empty() {
            return Err(bad("an empty prefix"));
        }
        if let Some(m) = method
            && (m.is_empty() || !m.bytes().all(|b| b.is_ascii_alphabetic()))
        {
            return Err(bad("a method is letters only, such as POST"));
        }
        Ok(Self {
            method: method.map(str::to_ascii_uppercase),
            prefix: prefix.to_string(),
        })
    }

    fn matches(&self, method: Option<&str>, path: &str) -> bool {
        let method_ok = match (&self.method, method) {
            (None, _) => true,
            (Some(want), Some(got)) => want.eq_ignore_ascii_case(got),
            (Some(_), None) => false,
        };
        method_ok && path.starts_with(self.prefix.as_str())
    }
}

/// A fault, how often, and where: one rule of a [`Chaos`].
#[derive(Debug, Clone)]
pub struct Rule {
    fault: Fault,
    rate: f64,
    only: Vec<String>,
}

impl Rule {
    /// `fault` on every request in scope (rate 1, every request).
    #[must_use]
    pub const fn new(fault: Fault) -> Self {
        Self {
            fault,
            rate: 1.0,
            only: Vec::new(),
        }
    }

    /// The share of requests it applies to, from 0 to 1 (checked by
    /// [`ChaosBuilder::build`]).
    #[must_use]
    pub const fn rate(mut self, rate: f64) -> Self {
        self.rate = rate;
        self
    }

    /// Only requests matching one of `patterns` (`"POST /charges"`,
    /// `"/payments.Payments/Charge"`, a name given to [`Chaos::around`]):
    /// see the [module docs](self#rates-scopes-the-switch).
    #[must_use]
    pub fn only<I, P>(mut self, patterns: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: AsRef<str>,
    {
        self.only
            .extend(patterns.into_iter().map(|p| p.as_ref().to_owned()));
        self
    }
}

/// Builds a [`Chaos`]: [`Chaos::builder`].
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct ChaosBuilder {
    seed: u64,
    rules: Vec<Rule>,
    disabled: bool,
}

impl ChaosBuilder {
    /// The seed of the random source (default 0).
    pub const fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Add a rule.
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }

    /// Start switched off: nothing is injected until
    /// [`Chaos::set_enabled`]`(true)`.
    pub const fn start_disabled(mut self) -> Self {
        self.disabled = true;
        self
    }

    /// Check every rule: rates from 0 to 1, well-formed patterns.
    pub fn build(self) -> Result<Chaos, ChaosError> {
        let mut rules = Vec::with_capacity(self.rules.len());
        for (i, rule) in self.rules.into_iter().enumerate() {
            let ppm = ppm(i, rule.fault.kind(), rule.rate)?;
            if let Fault::FailAfter {
                http_status,
                grpc_code,
            } = rule.fault
                && (!(100..=599).contains(&http_status) || !(1..=16).contains(&grpc_code))
            {
                return Err(ChaosError::Status {
                    rule: i,
                    http_status,
                    grpc_code,
                });
            }
            let scope = rule
                .only
                .iter()
                .map(|p| Pattern::parse(i, p))
                .collect::<Result<Vec<_>, _>>()?;
            rules.push(Live {
                fault: rule.fault,
                ppm: AtomicU32::new(ppm),
                scope,
                injected: AtomicU64::new(0),
                observed: AtomicU64::new(0),
            });
        }
        Ok(Chaos {
            inner: Arc::new(Inner {
                seed: self.seed,
                enabled: AtomicBool::new(!self.disabled),
                requests: AtomicU64::new(0),
                rules: rules.into_boxed_slice(),
                effects: AtomicU64::new(0),
                keys: Mutex::new(HashSet::new()),
            }),
        })
    }
}

/// A rate as parts per million.
fn ppm(rule: usize, kind: FaultKind, rate: f64) -> Result<u32, ChaosError> {
    if !(0.0..=1.0).contains(&rate) {
        return Err(ChaosError::Rate { rule, kind, rate });
    }
    Ok((rate * 1_000_000.0).round() as u32)
}

/// One rule as it runs: its rate may change.
#[derive(Debug)]
struct Live {
    fault: Fault,
    ppm: AtomicU32,
    scope: Vec<Pattern>,
    injected: AtomicU64,
    observed: AtomicU64,
}

struct Inner {
    seed: u64,
    enabled: AtomicBool,
    /// Requests seen, enabled or not: the next request's number.
    requests: AtomicU64,
    rules: Box<[Live]>,
    effects: AtomicU64,
    /// Hashes of the keys of effects reported (for duplicates).
    keys: Mutex<HashSet<u64>>,
}

/// Faults to inject, shared by every place that injects them: see the
/// [module docs](self).
#[derive(Clone)]
pub struct Chaos {
    inner: Arc<Inner>,
}

/// The settings and the switch; not the keys of the effects seen.
impl fmt::Debug for Chaos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        f.debug_struct("Chaos")
            .field("seed", &inner.seed)
            .field("enabled", &inner.enabled)
            .field("rules", &inner.rules)
            .field("requests", &inner.requests)
            .finish_non_exhaustive()
    }
}

/// The counts of a [`Chaos`]: [`Chaos::report`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Report {
    /// Requests (and [`Chaos::around`] calls) seen, with the switch on or off.
    pub requests: u64,
    /// Effects reported with [`Chaos::effect`].
    pub effects: u64,
    /// Effects whose key had been reported before.
    pub duplicate_effects: u64,
    /// Per kind, in [`FaultKind::ALL`]'s order: (kind, injected, observed).
    pub faults: Vec<(FaultKind, u64, u64)>,
}

impl Report {
    /// Faults of `kind` injected.
    #[must_use]
    pub fn injected(&self, kind: FaultKind) -> u64 {
        self.faults.iter().find(|f| f.0 == kind).map_or(0, |f| f.1)
    }

    /// Faults of `kind` that took effect.
    #[must_use]
    pub fn observed(&self, kind: FaultKind) -> u64 {
        self.faults.iter().find(|f| f.0 == kind).map_or(0, |f| f.2)
    }
}

/// What to do to one request: the rule behind each fault, and its fault.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Plan {
    pub(crate) delay: Option<(usize, Duration)>,
    pub(crate) hang: Option<(usize, Duration)>,
    pub(crate) refuse: Option<(usize, Option<Duration>)>,
    pub(crate) after: Option<(usize, After)>,
}

/// What happens after the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum After {
    Drop,
    Fail { http_status: u16, grpc_code: u8 },
}

impl Plan {
    pub(crate) const fn is_empty(&self) -> bool {
        self.delay.is_none() && self.hang.is_none() && self.refuse.is_none() && self.after.is_none()
    }
}

/// The finaliser of `SplitMix64`: a well-mixed 64-bit value from any input.
const fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Chaos {
    /// A builder: seed, rules, the switch's first position.
    pub fn builder() -> ChaosBuilder {
        ChaosBuilder::default()
    }

    /// Turn injection on or off, for the next requests.
    pub fn set_enabled(&self, on: bool) {
        self.inner.enabled.store(on, Ordering::Relaxed);
    }

    /// Whether injection is on.
    #[must_use]
    pub fn is_enabled(&self) -> bool {
        self.inner.enabled.load(Ordering::Relaxed)
    }

    /// Set the rate of every rule of `kind`, for the next requests.
    pub fn set_rate(&self, kind: FaultKind, rate: f64) -> Result<(), ChaosError> {
        let mut found = false;
        for (i, rule) in self.inner.rules.iter().enumerate() {
            if rule.fault.kind() == kind {
                rule.ppm.store(ppm(i, kind, rate)?, Ordering::Relaxed);
                found = true;
            }
        }
        if found {
            Ok(())
        } else {
            Err(ChaosError::NoRule(kind))
        }
    }

    /// Report an effect the service performed (a charge written, a message
    /// sent), identified by `key`: the same key twice is a duplicate effect.
    /// Keys are kept as 64-bit hashes (8 bytes each), until the `Chaos` is
    /// dropped.
    pub fn effect<K: Hash + ?Sized>(&self, key: &K) {
        // Fixed keys: the same key hashes the same throughout the process.
        let mut hasher = std::hash::DefaultHasher::new();
        key.hash(&mut hasher);
        let h = hasher.finish();
        self.inner.effects.fetch_add(1, Ordering::Relaxed);
        self.inner
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(h);
    }

    /// Requests, effects, duplicate effects, and each kind's injected and
    /// observed faults.
    #[must_use]
    pub fn report(&self) -> Report {
        let inner = &*self.inner;
        let effects = inner.effects.load(Ordering::Relaxed);
        let distinct = inner
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len() as u64;
        let faults = FaultKind::ALL
            .iter()
            .map(|&kind| {
                inner.rules.iter().filter(|r| r.fault.kind() == kind).fold(
                    (kind, 0, 0),
                    |(k, i, o), r| {
                        (
                            k,
                            i + r.injected.load(Ordering::Relaxed),
                            o + r.observed.load(Ordering::Relaxed),
                        )
                    },
                )
            })
            .collect();
        Report {
            requests: inner.requests.load(Ordering::Relaxed),
            effects,
            duplicate_effects: effects.saturating_sub(distinct),
            faults,
        }
    }

    /// What to do to a request with `method` (HTTP) and `path` (or a
    /// name): one draw per rule in scope.
    pub(crate) fn plan(&self, method: Option<&str>, path: &str) -> Plan {
        let inner = &*self.inner;
        // Every request is numbered, the switch on or off: a draw depends
        // on the seed, this number and the rule, never on the switch's past.
        let n = inner.requests.fetch_add(1, Ordering::Relaxed);
        let mut plan = Plan::default();
        if !inner.enabled.load(Ordering::Relaxed) || inner.rules.is_empty() {
            return plan;
        }
        let base = mix(inner.seed ^ mix(n));
        for (i, rule) in inner.rules.iter().enumerate() {
            let ppm = rule.ppm.load(Ordering::Relaxed);
            if ppm == 0
                || !(rule.scope.is_empty() || rule.scope.iter().any(|p| p.matches(method, path)))
            {
                continue;
            }
            if mix(base ^ (i as u64)) % 1_000_000 >= u64::from(ppm) {
                continue;
            }
            match rule.fault {
                Fault::Delay(d) => set(&mut plan.delay, (i, d)),
                Fault::Hang { max } => set(&mut plan.hang, (i, max)),
                Fault::Refuse { retry_after } => set(&mut plan.refuse, (i, retry_after)),
                Fault::DropReply => set(&mut plan.after, (i, After::Drop)),
                Fault::FailAfter {
                    http_status,
                    grpc_code,
                } => set(
                    &mut plan.after,
                    (
                        i,
                        After::Fail {
                            http_status,
                            grpc_code,
                        },
                    ),
                ),
            }
        }
        // A hang comes before a refusal, and after either the work never
        // runs: nothing after it.
        if plan.hang.is_some() {
            plan.refuse = None;
        }
        if plan.hang.is_some() || plan.refuse.is_some() {
            plan.after = None;
        }
        let rules = [
            plan.delay.map(|p| p.0),
            plan.hang.map(|p| p.0),
            plan.refuse.map(|p| p.0),
            plan.after.map(|p| p.0),
        ];
        for i in rules.into_iter().flatten() {
            let rule = &inner.rules[i];
            rule.injected.fetch_add(1, Ordering::Relaxed);
            retries_core::door::observe::fault(rule.fault.kind().as_str(), false, path);
        }
        plan
    }

    /// The fault of rule `rule` took effect.
    pub(crate) fn observed(&self, rule: usize) {
        if let Some(r) = self.inner.rules.get(rule) {
            r.observed.fetch_add(1, Ordering::Relaxed);
            retries_core::door::observe::fault(r.fault.kind().as_str(), true, "");
        }
    }

    /// Run `work` (a future resolving to a `Result`) under the faults in
    /// scope for `name`, for code no network layer sees: inside a
    /// `#[retryable]` body or a `retries::call` closure, around the part
    /// that has the effect.
    ///
    /// `Refuse` fails before `work` runs ([`Injected`], not executed);
    /// `Delay` waits first; `Hang` waits `max` (an attempt timeout or the
    /// call's deadline usually ends it first) and fails, unknown;
    /// `DropReply` and `FailAfter` run `work` and, when it succeeded, drop
    /// its value and fail, unknown. The error type takes an [`Injected`]
    /// through `From` (with `#[derive(Classify)]`, a
    /// `#[classify(transparent)] Chaos(#[from] Injected)` variant).
    ///
    /// ```
    /// use retries_chaos::{Chaos, Fault, Injected, Rule};
    ///
    /// #[derive(Debug, thiserror::Error, retries::Classify)]
    /// enum Error {
    ///     #[error(transparent)] #[classify(transparent)] Chaos(#[from] Injected),
    ///     #[error(transparent)] Stopped(#[from] retries::Stopped),
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let chaos = Chaos::builder().rule(Rule::new(Fault::DropReply)).build().unwrap();
    /// let mut effects = 0;
    /// let r: Result<u32, Error> = chaos.around("ledger.write", async { effects += 1; Ok(7) }).await;
    /// assert!(matches!(r, Err(Error::Chaos(_))));
    /// assert_eq!(effects, 1); // the work ran; its answer was lost
    /// # }
    /// ```
    pub async fn around<T, E, F>(&self, name: &str, work: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        E: From<Injected>,
    {
        let plan = self.plan(None, name);
        if plan.is_empty() {
            return work.await;
        }
        let kind = match self.apply(plan, || work).await {
            Applied::Ran(result) => return result,
            Applied::Hung => FaultKind::Hang,
            Applied::Refused(retry_after) => {
                return Err(Injected::new(FaultKind::Refuse, retry_after).into());
            }
            Applied::After(After::Drop) => FaultKind::DropReply,
            Applied::After(After::Fail { .. }) => FaultKind::FailAfter,
        };
        Err(Injected::new(kind, None).into())
    }

    /// The faults of `plan` around `work`, in their one order: a delay, then
    /// a hang or a refusal (the work never starts: `work` makes its future
    /// only when it runs), and after a successful work its answer dropped or
    /// replaced. Each place maps the result to its own errors; the server
    /// layer, whose future is a named type, follows the same order by hand.
    pub(crate) async fn apply<T, E, W, F>(&self, plan: Plan, work: W) -> Applied<Result<T, E>>
    where
        W: FnOnce() -> F,
        F: Future<Output = Result<T, E>>,
    {
        if let Some((rule, d)) = plan.delay {
            tokio::time::sleep(d).await;
            self.observed(rule);
        }
        if let Some((rule, max)) = plan.hang {
            let _ended = Ended(self, rule);
            tokio::time::sleep(max).await;
            return Applied::Hung;
        }
        if let Some((rule, retry_after)) = plan.refuse {
            self.observed(rule);
            return Applied::Refused(retry_after);
        }
        match (work().await, plan.after) {
            (Ok(answer), Some((rule, after))) => {
                // The answer came: it is lost here.
                drop(answer);
                self.observed(rule);
                Applied::After(after)
            }
            (result, _) => Applied::Ran(result),
        }
    }
}

/// What became of a request under its plan: [`Chaos::apply`].
pub(crate) enum Applied<R> {
    /// The work ran and its result stands (an error, or no fault after it).
    Ran(R),
    /// It hung for its bound; the work never ran.
    Hung,
    /// It was refused (with the pause asked for); the work never ran.
    Refused(Option<Duration>),
    /// The work succeeded, and its answer was then dropped or replaced.
    After(After),
}

/// Counts a hang as observed when it ends, however it ends (its bound, or
/// its caller dropping the future).
struct Ended<'a>(&'a Chaos, usize);

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        self.0.observed(self.1);
    }
}

/// Fill `slot` if empty: the first rule of a kind wins.
fn set<T>(slot: &mut Option<T>, value: T) {
    if slot.is_none() {
        *slot = Some(value);
    }
}

/// The error an injected fault gives [`Chaos::around`]'s caller (and the
/// source of the middleware's errors): `Refuse` classifies as not executed
/// (with its pause), the others as unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injected {
    kind: FaultKind,
    retry_after: Option<Duration>,
}

impl Injected {
    pub(crate) const fn new(kind: FaultKind, retry_after: Option<Duration>) -> Self {
        Self { kind, retry_after }
    }

    /// The fault's kind.
    #[must_use]
    pub const fn kind(&self) -> FaultKind {
        self.kind
    }
}

impl fmt::Display for Injected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            FaultKind::Refuse => f.write_str("refused before the work (injected fault)"),
            FaultKind::Delay => f.write_str("delayed (injected fault)"),
            FaultKind::Hang => f.write_str("no answer in time (injected fault)"),
            FaultKind::DropReply => {
                f.write_str("the reply was lost after the work (injected fault)")
            }
            FaultKind::FailAfter => f.write_str("failed after the work (injected fault)"),
        }
    }
}

impl std::error::Error for Injected {}

impl Classify for Injected {
    fn classify(&self) -> Verdict {
        match (self.kind, self.retry_after) {
            (FaultKind::Refuse, Some(d)) => Verdict::not_executed().with_retry_after(d),
            (FaultKind::Refuse, None) => Verdict::not_executed(),
            _ => Verdict::unknown(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chaos(rules: Vec<Rule>) -> Chaos {
        rules
            .into_iter()
            .fold(Chaos::builder().seed(42), ChaosBuilder::rule)
            .build()
            .unwrap()
    }

    #[test]
    fn rates_hold_over_ten_thousand_draws_and_repeat_with_the_seed() {
        let make = || {
            chaos(vec![
                Rule::new(Fault::DropReply).rate(0.2),
                Rule::new(Fault::Refuse { retry_after: None }).rate(0.05),
            ])
        };
        let (a, b) = (make(), make());
        let mut seq_a = Vec::new();
        for _ in 0..10_000 {
            let p = a.plan(Some("POST"), "/x");
            seq_a.push((p.after.is_some(), p.refuse.is_some()));
            let q = b.plan(Some("POST"), "/x");
            assert_eq!(
                (q.after.is_some(), q.refuse.is_some()),
                *seq_a.last().unwrap()
            );
        }
        let r = a.report();
        // A refusal takes the dropped reply's place: 0.2 * 0.95 = 0.19.
        let drop = r.injected(FaultKind::DropReply);
        let refuse = r.injected(FaultKind::Refuse);
        assert!((1_800..=2_000).contains(&drop), "{drop}");
        assert!((420..=580).contains(&refuse), "{refuse}");
        assert_eq!(r.requests, 10_000);
    }

    #[test]
    fn scopes_switch_and_rates() {
        let c = chaos(vec![
            Rule::new(Fault::DropReply).only(["POST /charges", "/pay.P/"]),
        ]);
        assert!(c.plan(Some("POST"), "/charges/1").after.is_some());
        assert!(c.plan(Some("GET"), "/charges/1").after.is_none());
        assert!(c.plan(Some("POST"), "/pay.P/Charge").after.is_some());
        assert!(c.plan(None, "charge").after.is_none());
        c.set_enabled(false);
        assert!(c.plan(Some("POST"), "/charges/1").is_empty());
        c.set_enabled(true);
        c.set_rate(FaultKind::DropReply, 0.0).unwrap();
        assert!(c.plan(Some("POST"), "/charges/1").is_empty());
        assert_eq!(
            c.set_rate(FaultKind::Hang, 0.5),
            Err(ChaosError::NoRule(FaultKind::Hang))
        );
        assert!(matches!(
            c.set_rate(FaultKind::DropReply, f64::NAN),
            Err(ChaosError::Rate { .. })
        ));
    }

    #[test]
    fn bad_settings_are_errors() {
        for rate in [-0.1, 1.5, f64::NAN, f64::INFINITY] {
            let e = Chaos::builder()
                .rule(Rule::new(Fault::DropReply).rate(rate))
                .build()
                .unwrap_err();
            assert!(matches!(e, ChaosError::Rate { rule: 0, .. }), "{e}");
        }
        for p in ["", "POST", "POST  /x", "PO5T /x", "a b c"] {
            let built = Chaos::builder()
                .rule(Rule::new(Fault::DropReply))
                .rule(Rule::new(Fault::DropReply).only([p]))
                .build();
            if p == "POST" {
                // A bare word is a prefix (a name for `around`).
                assert!(built.is_ok());
                continue;
            }
            assert!(
                matches!(built, Err(ChaosError::Pattern { rule: 1, .. })),
                "{p:?}"
            );
        }
    }

    #[test]
    fn a_fail_after_status_out_of_range_is_an_error() {
        for (http_status, grpc_code) in [(99, 14), (600, 14), (503, 0), (503, 17)] {
            let e = Chaos::builder()
                .rule(Rule::new(Fault::FailAfter {
                    http_status,
                    grpc_code,
                }))
                .build()
                .unwrap_err();
            assert!(matches!(e, ChaosError::Status { rule: 0, .. }), "{e}");
        }
    }

    #[test]
    fn effects_count_duplicates() {
        let c = chaos(vec![]);
        c.effect("k1");
        c.effect("k2");
        c.effect("k1");
        let r = c.report();
        assert_eq!((r.effects, r.duplicate_effects), (3, 1));
    }
}
