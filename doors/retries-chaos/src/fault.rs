//! The faults a rule injects ([`Fault`], [`FaultKind`]), the error of a
//! configuration ([`ChaosError`]), and the error an injected fault stands
//! for ([`Injected`]).

#[allow(clippy::wildcard_imports)]
use super::*;

/// A fault to inject; see the [module docs](crate) for what each does where.
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
