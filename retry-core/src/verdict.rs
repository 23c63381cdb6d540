//! Classification of a failed attempt: did the operation run, and may it be
//! retried?
//!
//! Most retry libraries sort errors into "retryable" and "fatal". That loses the
//! fact that matters for side effects: whether the server may already have done
//! the work. A [`Verdict`] therefore has three kinds:
//!
//! | kind | meaning | typical causes |
//! |---|---|---|
//! | [`VerdictKind::NotExecuted`] | transient, and the operation certainly did not run | connection refused before any byte was sent; a quota or admission check refused the request |
//! | [`VerdictKind::Unknown`] | transient, but the operation may have run | the connection broke after the request was sent; an attempt timed out |
//! | [`VerdictKind::Permanent`] | retrying changes nothing | the request is wrong; the handler ran and failed; the call was stopped |
//!
//! A verdict may also carry the server's hint: a pause to wait before the next
//! attempt ([`Verdict::retry_after`]), or an explicit "do not retry"
//! ([`Verdict::server_refused`]), which acts as [`VerdictKind::Permanent`].
//!
//! # The `std::io::Error` table
//!
//! [`Classify`] is implemented for [`std::io::Error`] by [`std::io::ErrorKind`]:
//!
//! | `ErrorKind` | verdict | why |
//! |---|---|---|
//! | `ConnectionRefused`, `AddrNotAvailable` | `NotExecuted` | no connection was made, so no request was sent |
//! | `TimedOut`, `ConnectionReset`, `ConnectionAborted`, `BrokenPipe`, `UnexpectedEof` | `Unknown` | the connection existed; the request may have been received and acted on |
//! | every other kind | `Permanent` | not a transient transport condition (bad input, permissions, missing files, …) |
//!
//! An `io::Error` that wraps a [`Stopped`] (as produced by
//! `From<Stopped> for io::Error`) is classified as the `Stopped` is
//! (`Permanent`, but `NotExecuted` for a call refused a concurrency slot) whatever its kind: a call that
//! was stopped by its deadline or an open circuit must not be retried by an
//! outer layer.

use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::time::Duration;

use crate::failure::Stopped;

/// The three kinds of a [`Verdict`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VerdictKind {
    /// Transient, and the operation certainly did not run: always safe to retry.
    NotExecuted,
    /// Transient, but the operation may have run: retried only when the
    /// operation is declared idempotent, otherwise resolved by `reconcile`.
    Unknown,
    /// Retrying changes nothing: the call stops with this error.
    Permanent,
}

impl VerdictKind {
    /// `true` for [`NotExecuted`](Self::NotExecuted) and [`Unknown`](Self::Unknown).
    #[must_use]
    pub const fn is_transient(self) -> bool {
        !matches!(self, Self::Permanent)
    }

    /// A short lower-case name (`"not_executed"`, `"unknown"`, `"permanent"`),
    /// stable for logs and metrics.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::NotExecuted => "not_executed",
            Self::Unknown => "unknown",
            Self::Permanent => "permanent",
        }
    }
}

impl fmt::Display for VerdictKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one failed attempt is classified; see the [module docs](self).
///
/// ```
/// use std::time::Duration;
/// use retries::{Verdict, VerdictKind};
///
/// let v = Verdict::not_executed().with_retry_after(Duration::from_millis(250));
/// assert_eq!(v.kind(), VerdictKind::NotExecuted);
/// assert_eq!(v.retry_after(), Some(Duration::from_millis(250)));
///
/// // The server said "do not retry": acts as permanent.
/// assert_eq!(Verdict::server_refused().kind(), VerdictKind::Permanent);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Verdict {
    kind: VerdictKind,
    /// The hint in nanoseconds, [`NO_HINT`] for none, kept as an attempt's
    /// plan keeps its durations (`attempt::nanos`): 16 bytes for the whole
    /// verdict instead of 24 (a call keeps its last one). A hint is at most
    /// `u64::MAX - 1` ns, some 584 years.
    retry_after: u64,
    server_refused: bool,
    overloaded: bool,
    conflict: bool,
}

/// [`Verdict::retry_after`] is `None`.
const NO_HINT: u64 = crate::attempt::NONE;

impl fmt::Debug for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verdict")
            .field("kind", &self.kind)
            .field("retry_after", &self.retry_after())
            .field("server_refused", &self.server_refused)
            .field("overloaded", &self.overloaded)
            .field("conflict", &self.conflict)
            .finish()
    }
}

impl Verdict {
    /// Transient; the operation certainly did not run.
    #[must_use]
    pub const fn not_executed() -> Self {
        Self::of(VerdictKind::NotExecuted)
    }

    /// Transient; the operation may have run.
    #[must_use]
    pub const fn unknown() -> Self {
        Self::of(VerdictKind::Unknown)
    }

    /// Retrying changes nothing.
    #[must_use]
    pub const fn permanent() -> Self {
        Self::of(VerdictKind::Permanent)
    }

    /// The server explicitly asked not to be retried (a negative gRPC pushback,
    /// for instance). Acts as [`VerdictKind::Permanent`];
    /// [`is_server_refusal`](Self::is_server_refusal) tells it apart.
    #[must_use]
    pub const fn server_refused() -> Self {
        Self {
            kind: VerdictKind::Permanent,
            retry_after: NO_HINT,
            server_refused: true,
            overloaded: false,
            conflict: false,
        }
    }

    /// A verdict of the given kind, without a hint.
    #[must_use]
    pub const fn of(kind: VerdictKind) -> Self {
        Self {
            kind,
            retry_after: NO_HINT,
            server_refused: false,
            overloaded: false,
            conflict: false,
        }
    }

    /// Attach the server's requested pause (gRPC `grpc-retry-pushback-ms`, HTTP
    /// `Retry-After`). It replaces the computed backoff for the next pause, but
    /// never extends the call past its deadline. Ignored on a permanent verdict.
    /// A pause of `u64::MAX` nanoseconds or more (some 584 years) is kept as
    /// `u64::MAX - 1` nanoseconds.
    #[must_use]
    pub const fn with_retry_after(mut self, pause: Duration) -> Self {
        self.retry_after = crate::attempt::nanos(pause);
        self
    }

    /// Mark a `NotExecuted` verdict as "refused because the service is
    /// overloaded" (HTTP 429, 503 with `Retry-After`, gRPC
    /// `RESOURCE_EXHAUSTED`, this crate's `ShedLayer` answers, a downstream
    /// limit's `Saturated`): what an [`Admission`](crate::limit::Admission)
    /// learns from. Ignored on any other kind: an unknown outcome or a
    /// permanent error never says the service is overloaded.
    #[must_use]
    pub const fn with_overload(mut self) -> Self {
        self.overloaded = matches!(self.kind, VerdictKind::NotExecuted);
        self
    }

    /// Mark a `NotExecuted` verdict as a conflict with concurrent work: a
    /// serialization failure (`40001`), a deadlock victim (`40P01`), an
    /// optimistic-lock miss, a 409 for an idempotency key whose request is
    /// in progress. The service is healthy; the operation lost a race, and
    /// running it again is the documented remedy. So a retry after it draws
    /// nothing from the budget, the breaker counts it as neither a success
    /// nor a failure, and a call that retries at all (its `max_attempts`
    /// above one) may make up to 10 attempts in all after conflicts, if its
    /// policy allows fewer; the deadline still bounds it. A conflict's
    /// [`retry_after`](Self::retry_after) is when the other work is expected
    /// to be done, not a time before which the server refuses: a hint that
    /// does not fit the deadline is shortened to half the time left, where
    /// any other hint that does not fit stops the call
    /// ([`Reason::PauseExceedsDeadline`](crate::Reason::PauseExceedsDeadline)).
    /// Ignored on other kinds.
    #[must_use]
    pub const fn with_conflict(mut self) -> Self {
        self.conflict = matches!(self.kind, VerdictKind::NotExecuted);
        self
    }

    /// `true` for a `NotExecuted` verdict marked as a conflict (see
    /// [`with_conflict`](Self::with_conflict)).
    #[must_use]
    pub const fn is_conflict(&self) -> bool {
        self.conflict
    }

    /// `true` for a `NotExecuted` refusal that says the service is
    /// overloaded (see [`with_overload`](Self::with_overload)).
    #[must_use]
    pub const fn is_overloaded(&self) -> bool {
        self.overloaded
    }

    /// The kind of this verdict.
    #[must_use]
    pub const fn kind(&self) -> VerdictKind {
        self.kind
    }

    /// The server's requested pause, if any.
    #[must_use]
    pub const fn retry_after(&self) -> Option<Duration> {
        if self.retry_after == NO_HINT {
            None
        } else {
            Some(Duration::from_nanos(self.retry_after))
        }
    }

    /// `true` when the server explicitly asked not to be retried.
    #[must_use]
    pub const fn is_server_refusal(&self) -> bool {
        self.server_refused
    }

    /// `true` for `NotExecuted` and `Unknown`.
    #[must_use]
    pub const fn is_transient(&self) -> bool {
        self.kind.is_transient()
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.server_refused {
            return f.write_str("permanent (server refused retries)");
        }
        f.write_str(self.kind.as_str())?;
        if let Some(pause) = self.retry_after() {
            write!(f, " (retry after {pause:?})")?;
        }
        Ok(())
    }
}

/// How an error type classifies itself. Implement it once for an error type and
/// every retried function returning that error uses it.
///
/// ```
/// use retries::{Classify, Verdict};
///
/// #[derive(Debug)]
/// enum PayError { Unavailable, Invalid }
///
/// impl Classify for PayError {
///     fn classify(&self) -> Verdict {
///         match self {
///             PayError::Unavailable => Verdict::unknown(),
///             PayError::Invalid => Verdict::permanent(),
///         }
///     }
/// }
/// assert!(PayError::Unavailable.classify().is_transient());
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not say how its failures are classified",
    label = "`{Self}` does not implement `retries::Classify`",
    note = "pass `classify = …` to classify this function's errors (the way for a type of another crate, such as `anyhow::Error` or `String`: the orphan rule keeps you from implementing `Classify` for it), or return an error enum of your own with `#[derive(retries::Classify)]`, or implement `retries::Classify` for `{Self}` if it is yours"
)]
pub trait Classify {
    /// The verdict for this error.
    fn classify(&self) -> Verdict;
}

impl<T: Classify + ?Sized> Classify for &T {
    fn classify(&self) -> Verdict {
        (**self).classify()
    }
}

impl<T: Classify + ?Sized> Classify for Box<T> {
    fn classify(&self) -> Verdict {
        (**self).classify()
    }
}

impl Classify for Stopped {
    /// Permanent: a call that was stopped (deadline, open circuit, exhausted
    /// budget) must not be retried by an outer layer. The exceptions are
    /// [`Reason::Saturated`](crate::Reason::Saturated) (no slot of a
    /// concurrency limit came free) and [`Reason::Throttled`](crate::Reason::Throttled)
    /// (an admission refused it): nothing was sent, so it is `NotExecuted`,
    /// and overloaded; [`Reason::RateLimited`](crate::Reason::RateLimited)
    /// is `NotExecuted` too (the client's own limit, not an overload).
    ///
    /// And [`Reason::UnknownOutcome`](crate::Reason::UnknownOutcome) is
    /// `Unknown`: the work below may have run, so an enclosing retried call
    /// resolves it by its own `reconcile` or stops unknown too (an HTTP door
    /// answers a lost reply of a call that is not idempotent with such a
    /// `Stopped`).
    fn classify(&self) -> Verdict {
        match self.reason() {
            crate::Reason::Saturated | crate::Reason::Throttled => {
                Verdict::not_executed().with_overload()
            }
            crate::Reason::UnknownOutcome => Verdict::unknown(),
            // Nothing was sent, and the server did not refuse anything.
            crate::Reason::RateLimited | crate::Reason::OverQuota => Verdict::not_executed(),
            _ => Verdict::permanent(),
        }
    }
}

impl Classify for io::Error {
    /// By the error it wraps when that is a known type (a [`Stopped`] is
    /// permanent; see [`classify_chain`]), else by its kind (the table above).
    fn classify(&self) -> Verdict {
        if let Some(inner) = self.get_ref()
            && let Some(v) = classify_known(inner)
        {
            return v;
        }
        classify_io_kind(self.kind())
    }
}

/// A boxed error (`Box<dyn Error + Send + Sync>`, as many applications return)
/// is classified by the first known cause in its chain ([`classify_chain`]);
/// a chain of unknown causes is `Permanent`: nothing shows that repeating the
/// call could help, so it is not repeated blindly.
impl Classify for dyn StdError + Send + Sync + 'static {
    fn classify(&self) -> Verdict {
        classify_chain_or(self, Verdict::permanent())
    }
}

/// As for `dyn Error + Send + Sync`.
impl Classify for dyn StdError + 'static {
    fn classify(&self) -> Verdict {
        classify_chain_or(self, Verdict::permanent())
    }
}

/// The [`std::io::Error`] table of the [module docs](self), by kind alone.
#[must_use]
pub const fn classify_io_kind(kind: io::ErrorKind) -> Verdict {
    use io::ErrorKind as K;
    match kind {
        K::ConnectionRefused | K::AddrNotAvailable => Verdict::not_executed(),
        K::TimedOut
        | K::ConnectionReset
        | K::ConnectionAborted
        | K::BrokenPipe
        | K::UnexpectedEof => Verdict::unknown(),
        _ => Verdict::permanent(),
    }
}

/// Walk `err` and its [`source()`](StdError::source) chain and classify the
/// first cause of a type this crate knows: [`Stopped`], [`std::io::Error`],
/// and, with their features on, `tonic::Status` (feature `tonic`, with its
/// pushback) and `reqwest::Error` (feature `reqwest`). An `io::Error` that
/// wraps one of these is classified by what it wraps. `None` when no cause is
/// known.
///
/// Use it to classify wrapper errors (`anyhow`-style or hand-written) by their
/// root cause:
///
/// ```
/// use retries::{classify_chain, VerdictKind};
///
/// #[derive(Debug, thiserror::Error)]
/// #[error("fetching the price list")]
/// struct Fetch(#[source] std::io::Error);
///
/// let err = Fetch(std::io::ErrorKind::ConnectionRefused.into());
/// assert_eq!(classify_chain(&err).map(|v| v.kind()), Some(VerdictKind::NotExecuted));
/// ```
#[must_use]
pub fn classify_chain(err: &(dyn StdError + 'static)) -> Option<Verdict> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(v) = classify_known(e) {
            return Some(v);
        }
        cur = e.source();
    }
    None
}

/// Like [`classify_chain`], with a fallback for chains of unknown causes.
#[must_use]
pub fn classify_chain_or(err: &(dyn StdError + 'static), fallback: Verdict) -> Verdict {
    classify_chain(err).unwrap_or(fallback)
}

fn classify_known(e: &(dyn StdError + 'static)) -> Option<Verdict> {
    if let Some(s) = e.downcast_ref::<Stopped>() {
        return Some(s.classify());
    }
    #[cfg(feature = "tonic-0.14")]
    if let Some(s) = e.downcast_ref::<tonic::Status>() {
        return Some(s.classify());
    }
    #[cfg(feature = "sqlx-0.9")]
    if let Some(s) = e.downcast_ref::<sqlx_core::Error>() {
        return Some(s.classify());
    }
    #[cfg(feature = "reqwest-0.13")]
    if let Some(r) = e.downcast_ref::<reqwest::Error>() {
        return Some(r.classify());
    }
    if let Some(io) = e.downcast_ref::<io::Error>() {
        // An io::Error that merely wraps another error is classified by that
        // error when it is known (it may be a Stopped, or an integration type).
        if let Some(inner) = io.get_ref()
            && let Some(v) = classify_known(inner)
        {
            return Some(v);
        }
        return Some(classify_io_kind(io.kind()));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hint_is_kept_to_the_nanosecond_and_saturates() {
        let v = Verdict::not_executed().with_retry_after(Duration::new(3, 7));
        assert_eq!(v.retry_after(), Some(Duration::new(3, 7)));
        assert_eq!(Verdict::unknown().retry_after(), None);
        let far = Verdict::not_executed().with_retry_after(Duration::MAX);
        assert_eq!(far.retry_after(), Some(Duration::from_nanos(u64::MAX - 1)));
        assert_eq!(
            Verdict::not_executed()
                .with_retry_after(Duration::ZERO)
                .retry_after(),
            Some(Duration::ZERO),
            "a zero hint is a hint"
        );
        assert!(format!("{v:?}").contains("retry_after: Some(3.000000007s)"));
    }

    #[test]
    fn io_table() {
        use io::ErrorKind as K;
        for k in [K::ConnectionRefused, K::AddrNotAvailable] {
            assert_eq!(
                io::Error::from(k).classify().kind(),
                VerdictKind::NotExecuted,
                "{k:?}"
            );
        }
        for k in [
            K::TimedOut,
            K::ConnectionReset,
            K::ConnectionAborted,
            K::BrokenPipe,
            K::UnexpectedEof,
        ] {
            assert_eq!(
                io::Error::from(k).classify().kind(),
                VerdictKind::Unknown,
                "{k:?}"
            );
        }
        for k in [K::NotFound, K::PermissionDenied, K::InvalidInput, K::Other] {
            assert_eq!(
                io::Error::from(k).classify().kind(),
                VerdictKind::Permanent,
                "{k:?}"
            );
        }
    }

    #[test]
    fn server_refusal_is_permanent_and_distinct() {
        let v = Verdict::server_refused();
        assert_eq!(v.kind(), VerdictKind::Permanent);
        assert!(v.is_server_refusal());
        assert!(!Verdict::permanent().is_server_refusal());
    }

    #[test]
    fn chain_finds_io_cause_behind_wrappers() {
        #[derive(Debug)]
        struct Outer(io::Error);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("outer")
            }
        }
        impl StdError for Outer {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        let e = Outer(io::ErrorKind::ConnectionReset.into());
        assert_eq!(classify_chain(&e).unwrap().kind(), VerdictKind::Unknown);
        let plain = fmt::Error;
        assert_eq!(classify_chain(&plain), None);
        assert_eq!(
            classify_chain_or(&plain, Verdict::unknown()).kind(),
            VerdictKind::Unknown
        );
    }
}
