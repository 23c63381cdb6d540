//! What `#[retryable(...)]` says, parsed: [`Args`] (one slot per key, each a
//! literal or an expression as written) and the list of accepted [`KEYS`].
//! Shared vocabulary of the parser (`args`), the literal readers (`lit`), the
//! checks (`valid`), the error hints (`diag`) and the expansion; it imports
//! nothing of the crate.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Expr, Ident, Path};

/// Every accepted key, in the order the docs list them.
pub(crate) const KEYS: &[&str] = &[
    "deadline",
    "max_attempts",
    "attempt_timeout",
    "reserve",
    "min_attempt",
    "backoff",
    "initial_backoff",
    "max_backoff",
    "multiplier",
    "jitter",
    "idempotent",
    "reconcile",
    "recover",
    "classify",
    "retry_if",
    "on_retry",
    "attempt",
    "policy",
    "budget",
    "breaker",
    "concurrency",
    "rate_limit",
    "nested",
    "hedge",
    "crate",
];

/// A value that is either checked at compile time or left to rustc.
pub(crate) enum Value<T> {
    Lit(T, Span),
    Expr(Expr),
}

impl<T> Value<T> {
    pub(crate) fn lit(&self) -> Option<&T> {
        match self {
            Value::Lit(v, _) => Some(v),
            Value::Expr(_) => None,
        }
    }

    pub(crate) fn span(&self) -> Span {
        match self {
            Value::Lit(_, s) => *s,
            Value::Expr(e) => e.span(),
        }
    }
}

/// Backoff kinds that can be named in the attribute.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Constant,
    Linear,
    Exponential,
    Decorrelated,
    Grpc,
}

pub(crate) enum BackoffArg {
    Kind(Kind, Span),
    Expr(Expr),
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum JitterLit {
    None,
    Full,
    Equal,
    Decorrelated,
    Proportional(f64),
}

/// `breaker = STATIC` or `breaker(failure_threshold = …, open_for = …, half_open_probes = …)`.
#[allow(clippy::large_enum_variant)] // one per attribute, parsed once
pub(crate) enum BreakerArg {
    Static(Expr),
    Inline {
        threshold: Value<u32>,
        open_for: Option<Value<u64>>,
        probes: Option<Value<u32>>,
    },
}

pub(crate) enum BudgetArg {
    Off(Span),
    Expr(Expr),
}

/// The parsed attribute.
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) deadline: Option<Value<u64>>,
    pub(crate) max_attempts: Option<Value<u32>>,
    pub(crate) attempt_timeout: Option<Value<u64>>,
    pub(crate) reserve: Option<Value<u64>>,
    pub(crate) min_attempt: Option<Value<u64>>,
    pub(crate) backoff: Option<BackoffArg>,
    pub(crate) initial_backoff: Option<Value<u64>>,
    pub(crate) max_backoff: Option<Value<u64>>,
    pub(crate) multiplier: Option<Value<f64>>,
    pub(crate) jitter: Option<Value<JitterLit>>,
    pub(crate) idempotent: Option<(bool, Span)>,
    pub(crate) reconcile: Option<Expr>,
    pub(crate) recover: Option<Expr>,
    pub(crate) classify: Option<Expr>,
    pub(crate) retry_if: Option<Expr>,
    pub(crate) on_retry: Option<Expr>,
    pub(crate) attempt: Option<Ident>,
    pub(crate) policy: Option<Expr>,
    pub(crate) budget: Option<BudgetArg>,
    pub(crate) breaker: Option<BreakerArg>,
    /// `concurrency = LIMIT`: a `retries::limit::Concurrency`, borrowed.
    pub(crate) concurrency: Option<Expr>,
    /// `rate_limit = LIMIT`: a `retries::limit::RateLimit`, borrowed.
    pub(crate) rate_limit: Option<Expr>,
    pub(crate) krate: Option<Path>,
    /// `true` for `nested = "own"`.
    pub(crate) nested_own: Option<bool>,
    /// `hedge(max_attempts = …, delay = …)` or `hedge(max_attempts = …,
    /// learned = …)`, with the key's span.
    pub(crate) hedge: Option<(Value<u32>, HedgeDelay, Span)>,
    /// Every key written, valid or not (so a malformed value is not also
    /// reported as missing).
    pub(crate) seen: Vec<String>,
    /// The attribute did not parse to the end: cross-key checks would only
    /// add noise.
    pub(crate) incomplete: bool,
}

impl Args {
    /// Whether `key` was written, whatever its value.
    pub(crate) fn saw(&self, key: &str) -> bool {
        self.seen.iter().any(|k| k == key)
    }
}

/// The wait before the next copy of a hedged call.
pub(crate) enum HedgeDelay {
    /// `delay = "50ms"`.
    Fixed(Value<u64>),
    /// `learned = DELAY`: a `static retries::LearnedDelay`, borrowed.
    Learned(Expr),
}
