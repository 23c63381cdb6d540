//! Retry budgets: limits on retries across calls, so that a fleet of clients
//! does not multiply the load on a struggling server.
//!
//! A budget is consulted only for retries: a first attempt is never refused.
//! The engine reports to it in this order: [`Budget::on_call`] when a logical
//! call starts, [`Budget::on_transient_failure`] for every attempt that failed
//! transiently, [`Budget::try_retry`] once per retry it is about to make (after
//! every other check passed, so a refused retry costs nothing else), and
//! [`Budget::on_success`] when the call succeeds.

use std::sync::atomic::{AtomicU32, Ordering};

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

/// Why a budget setting is invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BudgetError {
    /// `max_tokens` outside `1..=1000`.
    #[error("`max_tokens` must lie in 1..=1000")]
    MaxTokens,
    /// `token_ratio` not a positive number of at least 0.001.
    #[error("`token_ratio` must be at least 0.001 (digits past the third decimal are ignored)")]
    TokenRatio,
    /// A ratio-budget percentage outside `0..=1000`.
    #[error("the retry percentage must lie in 0..=1000")]
    Percent,
    /// A ratio-budget window of zero or more than 60 s.
    #[error("the window must be between 1 ms and 60 s")]
    Window,
}

impl BudgetError {
    /// The message, available in `const` contexts.
    #[must_use]
    pub const fn message(&self) -> &'static str {
        match self {
            Self::MaxTokens => "`max_tokens` must lie in 1..=1000",
            Self::TokenRatio => {
                "`token_ratio` must be at least 0.001 (digits past the third decimal are ignored)"
            }
            Self::Percent => "the retry percentage must lie in 0..=1000",
            Self::Window => "the window must be between 1 ms and 60 s",
        }
    }
}

/// The default budget: gRPC `retryThrottling` semantics, which need no clock.
///
/// Tokens start at `max_tokens`; every transient attempt failure costs one
/// token, every successful call adds `token_ratio`; retries are allowed only
/// while more than half the tokens remain; tokens stay within `[0, max_tokens]`.
/// Kept as integer milli-tokens (so `token_ratio` digits past the third decimal
/// are ignored, as gRPC specifies).
///
/// With the defaults (`max_tokens = 100`, `token_ratio = 0.1`), a sustained
/// outage stops retries after the first burst (about 50 failed attempts), and
/// under partial failure retries add at most about 10% to the load.
///
/// In the healthy state the bucket is full and a success is a single relaxed
/// load: no shared-memory write.
///
/// ```
/// use retry_core::budget::{Budget, TokenBucket};
///
/// static PAYMENTS: TokenBucket = TokenBucket::new(10, 0.1);
/// for _ in 0..5 { PAYMENTS.on_transient_failure(); }
/// assert_eq!(PAYMENTS.tokens_milli(), 5_000);
/// assert!(!PAYMENTS.try_retry()); // 5 is not more than 10 / 2
/// ```
#[derive(Debug)]
pub struct TokenBucket {
    tokens: AtomicU32,
    max: u32,
    ratio: u32,
}

impl TokenBucket {
    /// `max_tokens = 100`, `token_ratio = 0.1`. Meant to initialise a
    /// `static` (`static B: TokenBucket = TokenBucket::DEFAULT;`).
    #[allow(clippy::declare_interior_mutable_const)]
    pub const DEFAULT: Self = Self::new(100, 0.1);

    /// A full bucket. Panics (a compile error in a `const` or `static`) on
    /// invalid settings; use [`try_new`](Self::try_new) at run time.
    ///
    /// # Panics
    ///
    /// When `max_tokens` is outside `1..=1000` or `token_ratio < 0.001`.
    #[must_use]
    #[track_caller]
    pub const fn new(max_tokens: u32, token_ratio: f64) -> Self {
        match Self::try_new(max_tokens, token_ratio) {
            Ok(b) => b,
            Err(e) => panic!("{}", e.message()),
        }
    }

    /// A full bucket, or why the settings are invalid.
    pub const fn try_new(max_tokens: u32, token_ratio: f64) -> Result<Self, BudgetError> {
        if max_tokens == 0 || max_tokens > 1000 {
            return Err(BudgetError::MaxTokens);
        }
        if token_ratio.is_nan() || token_ratio < 0.001 || token_ratio.is_infinite() {
            return Err(BudgetError::TokenRatio);
        }
        let ratio = (token_ratio * 1000.0) as u32;
        let max = max_tokens * 1000;
        Ok(Self {
            tokens: AtomicU32::new(max),
            max,
            ratio,
        })
    }

    /// Current tokens, in thousandths.
    pub fn tokens_milli(&self) -> u32 {
        self.tokens.load(Ordering::Relaxed)
    }

    /// `max_tokens`, in thousandths.
    #[must_use]
    pub const fn max_milli(&self) -> u32 {
        self.max
    }

    /// `token_ratio`, in thousandths.
    #[must_use]
    pub const fn ratio_milli(&self) -> u32 {
        self.ratio
    }
}

impl Default for TokenBucket {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl Budget for TokenBucket {
    #[inline]
    fn on_success(&self) {
        // Healthy: full bucket, nothing to write.
        if self.tokens.load(Ordering::Relaxed) >= self.max {
            return;
        }
        let _ = self
            .tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                (t < self.max).then(|| t.saturating_add(self.ratio).min(self.max))
            });
    }

    #[inline]
    fn on_transient_failure(&self) {
        let _ = self
            .tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                (t > 0).then(|| t.saturating_sub(1000))
            });
    }

    #[inline]
    fn try_retry(&self) -> bool {
        self.tokens.load(Ordering::Relaxed) > self.max / 2
    }
}
