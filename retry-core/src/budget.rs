//! Retry budgets: limits on retries across calls, so that a fleet of clients
//! does not multiply the load on a struggling server.
//!
//! A budget is consulted only for retries: a first attempt is never refused.
//! The engine reports to it in this order: [`Budget::on_call`] when a logical
//! call starts, [`Budget::on_transient_failure`] for every attempt that failed
//! transiently, [`Budget::try_retry`] once per retry it is about to make (after
//! every other check passed, so a refused retry costs nothing else), and
//! [`Budget::on_success`] when the call succeeds.

/// A source of permission to retry. Implementations are shared by many calls
/// at once (usually as a `static`), so they take `&self`.
pub trait Budget {
    /// A logical call started. Default: nothing.
    #[inline]
    fn on_call(&self) {}

    /// A logical call succeeded. Default: nothing.
    #[inline]
    fn on_success(&self) {}

    /// An attempt failed transiently (`NotExecuted` or `Unknown`). Default: nothing.
    #[inline]
    fn on_transient_failure(&self) {}

    /// May the call make one more attempt now? A `true` answer may consume
    /// budget. A `false` answer stops the call with
    /// [`Reason::BudgetExhausted`](crate::Reason::BudgetExhausted).
    fn try_retry(&self) -> bool;
}

/// No budget: every retry allowed by the policy is made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unlimited;

impl Budget for Unlimited {
    #[inline]
    fn try_retry(&self) -> bool {
        true
    }
}

impl<B: Budget + ?Sized> Budget for &B {
    #[inline]
    fn on_call(&self) {
        (**self).on_call();
    }
    #[inline]
    fn on_success(&self) {
        (**self).on_success();
    }
    #[inline]
    fn on_transient_failure(&self) {
        (**self).on_transient_failure();
    }
    #[inline]
    fn try_retry(&self) -> bool {
        (**self).try_retry()
    }
}
