//! [`Ended`]: how a call that did not succeed ended, on the response an
//! HTTP door answers it with.

use retries_core::Reason;

use crate::Lost;

/// On the response an HTTP door returns for a call that did not succeed
/// (a status its table or `retry_if` calls a failed attempt): why the call
/// ended and after how many attempts, in the response's extensions. So a
/// caller tells a single 503 (`Permanent` or `Exhausted` after one) from a
/// call the library stopped early (`PauseExceedsDeadline`: the server's
/// `Retry-After` did not fit; `BudgetExhausted`; `UnknownOutcome`) although
/// both answer with the server's response as it came. A call that was not
/// retried because its body could not be sent again (past the replay cap)
/// says so in [`lost`](Self::lost).
///
/// ```
/// # fn check(response: &http::Response<()>) {
/// use retries_http::Ended;
///
/// if let Some(ended) = response.extensions().get::<Ended>() {
///     println!("stopped: {} after {} attempts", ended.reason(), ended.attempts());
/// }
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    reason: Reason,
    attempts: u32,
    lost: Option<Lost>,
}

impl Ended {
    /// A call that ended for `reason` after `attempts`.
    #[must_use]
    pub const fn new(reason: Reason, attempts: u32) -> Self {
        Self {
            reason,
            attempts,
            lost: None,
        }
    }

    /// The same, for a call that was not retried because its body could
    /// not be sent again.
    #[must_use]
    pub const fn with_lost(mut self, lost: Option<Lost>) -> Self {
        self.lost = lost;
        self
    }

    /// Why the call ended.
    #[must_use]
    pub const fn reason(&self) -> Reason {
        self.reason
    }

    /// The attempts it made.
    #[must_use]
    pub const fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Why the request's body could not be sent again, when that is what
    /// ended the call ([`Lost::OverCap`]: the cap and the bytes sent).
    #[must_use]
    pub const fn lost(&self) -> Option<Lost> {
        self.lost
    }
}
