//! Retry budgets: limits on retries across calls, so that a fleet of clients
//! does not multiply the load on a struggling server.
//!
//! A per-call limit (`max_attempts = 3`) does not stop a retry storm: when a
//! dependency is down, every caller triples its load on it. A budget is shared
//! by many calls and refuses retries once they stop paying off.
//!
//! # Which budget
//!
//! | | [`TokenBucket`] (default) | [`RatioBudget`] |
//! |---|---|---|
//! | semantics | gRPC `retryThrottling` | Finagle `RetryBudget`, tower `TpsBudget` |
//! | reacts to | the failure ratio: each transient failure costs a token, each success refunds `token_ratio` | the retry ratio: retries may add `retry_percent` % to the calls of the last `ttl` |
//! | sustained outage | retries stop after the first burst (about `max_tokens / 2` failures) | retries continue at `retry_percent` % of the traffic, plus the floor |
//! | partial failure | retries add at most about `token_ratio` (10 %) to the load | exactly bounded by `retry_percent` |
//! | cost on the happy path | one relaxed load (no write, no clock) | a clock read and one atomic increment per call |
//! | use it when | you want the safe default and no tuning | a service owner gives you a retry ratio to respect, or traffic is too low for the bucket to refill |
//!
//! # One budget per downstream service
//!
//! # The default, and sharing
//!
//! Every call has a budget unless it says `budget = "none"`
//! ([`NoBudget`]): by default, the token bucket of the call's
//! [`Name`](crate::observe::Name). `#[retryable]` gives each function a name
//! of its own, so each function has its own bucket; [`call`](crate::call())
//! uses the name given to [`Retry::name`](crate::Retry::name), and a call
//! that sets none gets the bucket of its call site (its place in the source,
//! found by `#[track_caller]`): the calls made at one line share a bucket,
//! as calls of one `#[retryable]` function do, and two unrelated call sites
//! do not drain each other's. The sites are hashed onto 256 buckets (no lock,
//! no allocation; two sites share one only when their addresses collide),
//! and all report under the name `retries::call`. A `retries::call` written
//! inside a helper function is one site for all its callers: give it a
//! [`Retry::name`](crate::Retry::name) or a budget of its own per service.
//!
//! A conflict with concurrent work (a verdict marked
//! [`with_conflict`](crate::Verdict::with_conflict): PostgreSQL's `40001` and
//! `40P01` in the `sqlx` table) draws nothing: it is the expected cost of
//! `SERIALIZABLE`, not a sign that the service is failing, and a storm of
//! them is bounded by `max_attempts` and the deadline.
//!
//! Functions that call the *same* service should share one budget, so that
//! together they respect its limits. A budget is borrowed for the call, so it
//! can live anywhere that outlives it: a `static`, a field of a client (held
//! in an `Arc`, as tower users hold shared state), or a value built at run
//! time from configuration (with [`TokenBucket::try_new`]).
//!
//! ```
//! use std::sync::Arc;
//! use retries::TokenBucket;
//!
//! /// Every call to the payments service draws on one budget.
//! static PAYMENTS: TokenBucket = TokenBucket::new(100, 0.1);
//! // #[retryable(…, budget = PAYMENTS)] on charge, refund, capture, …
//!
//! /// Or one per client, built from configuration:
//! struct Client { budget: Arc<TokenBucket> }
//! let client = Client { budget: Arc::new(TokenBucket::try_new(50, 0.2).unwrap()) };
//! // #[retryable(…, budget = self.budget)] on the client's methods
//! # let _ = (&PAYMENTS, client.budget);
//! ```
//!
//! Budgets are `const`-constructible (invalid settings in a `static` are a
//! compile error; `try_new` returns a typed error at run time and never
//! panics, whatever its input) and lock-free.
//!
//! # A fleet of clients
//!
//! Each process has budgets of its own, so a fleet's retries are the sum of
//! its clients'. A ratio composes: each client's retries at most 20 % of its
//! own calls is at most 20 % of the fleet's. A floor does not: the token
//! bucket's first half (retries are allowed while more than half its tokens
//! are left) and a ratio budget's `min_per_sec` are per client, so N clients
//! have N floors, and the same traffic spread over more, quieter clients is
//! retried more. Measured with `cargo run --example fleet` (a dead service,
//! 1,000 calls a second in all from N clients, `max_attempts = 3` so at most
//! 2 retries per call, 10 s, paused clock; retries per first attempt):
//!
//! | N clients | bucket, 1st s | bucket, 5–10 s | ratio 20 % + 10/s, 1st s | ratio, 5–10 s | decaying floor, 1st s | decaying, 5–10 s |
//! |---|---|---|---|---|---|---|
//! | 1 | 0.043 | 0 | 0.298 | 0.200 | 0.198 | 0.200 |
//! | 10 | 0.340 | 0 | 1.190 | 0.200 | 0.190 | 0.200 |
//! | 100 | 1.970 | 0 | 1.970 | 0.404 | 0.300 | 0.200 |
//! | 1,000 | 1.970 | 2.000 | 1.970 | 2.000 | 1.970 | 0 |
//!
//! At 1,000 clients (one call a second each) neither the bucket nor the
//! plain ratio budget says no within 10 s: each bucket sees 30 failures of
//! the 50 its upper half holds, each ratio budget's floor (100 retries per
//! 10 s) covers every retry. The decaying floor
//! ([`RatioBudget::decaying_floor`]) retries each client's first failed call
//! (one client cannot tell it from a sporadic failure), then leaves only the
//! ratio, whose window those first retries have already spent. What
//! holds today: share one budget among the clients of a process (a `static`
//! or one `Arc`), size floors for the fleet (`min_per_sec` per client is
//! `min_per_sec × N` for the service), or use a ratio budget without a
//! floor (`min_per_sec = 0`), which composes exactly, or with a floor that
//! decays while failures dominate ([`RatioBudget::decaying_floor`]): it
//! serves a quiet client's sporadic failure and is gone within six failed
//! attempts of an outage, so the fleet is left with the ratio.
//!
//! A budget is consulted only for retries: a first attempt is never refused
//! (unless the budget is an [`Admission`](crate::limit::Admission), which
//! gates first attempts while the service refuses calls as overloaded).
//! The engine reports to it in this order: [`Budget::on_call`] when a logical
//! call starts, [`Budget::on_transient_failure`] for every attempt that failed
//! transiently, [`Budget::try_retry`] once per retry it is about to make (after
//! every other check passed, so a refused retry costs nothing else), and
//! [`Budget::on_success`] when the call succeeds.

use std::sync::OnceLock;
use std::sync::atomic::Ordering;

use crate::sync::{AtomicU32, AtomicU64};
use std::time::{Duration, Instant};

/// A source of permission to retry. Implementations are shared by many calls
/// at once (usually as a `static`), so they take `&self`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a retry budget: it does not implement `retries::Budget`",
    label = "not a budget",
    note = "`budget = …` takes a `retries::TokenBucket`, a `retries::RatioBudget`, a `retries::limit::Admission` or `retries::NoBudget` (a `static`, a field of a client, or one built from configuration), or `\"none\"`"
)]
pub trait Budget {
    /// A logical call started. Default: nothing.
    #[inline]
    fn on_call(&self) {}

    /// A logical call succeeded. Default: nothing.
    #[inline]
    fn on_success(&self) {}

    /// An attempt failed transiently (`NotExecuted` or `Unknown`), or the
    /// server said not to retry (gRFC A6 counts that as a failure for
    /// throttling). Default: nothing.
    #[inline]
    fn on_transient_failure(&self) {}

    /// May the call make one more attempt now? A `true` answer may consume
    /// budget. A `false` answer stops the call with
    /// [`Reason::BudgetExhausted`](crate::Reason::BudgetExhausted).
    fn try_retry(&self) -> bool;

    /// May a new call make its first attempt? Asked once per call, before
    /// it; `false` stops the call with [`Reason::Throttled`](crate::Reason::Throttled),
    /// nothing sent. Default: `true` (a budget gates retries only; an
    /// [`Admission`](crate::limit::Admission) gates first attempts too).
    #[inline]
    fn admit(&self) -> bool {
        true
    }

    /// An attempt was refused because the service is overloaded (a
    /// `NotExecuted` verdict marked [`overloaded`](crate::Verdict::is_overloaded)).
    /// Default: nothing.
    #[inline]
    fn on_overloaded(&self) {}
}

/// No budget: every retry allowed by the policy is made (`budget = "none"`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoBudget;

impl Budget for NoBudget {
    #[inline]
    fn try_retry(&self) -> bool {
        true
    }
}

macro_rules! forward_budget {
    ($($ty:ty),*) => {$(
        impl<B: Budget + ?Sized> Budget for $ty {
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
            #[inline]
            fn admit(&self) -> bool {
                (**self).admit()
            }
            #[inline]
            fn on_overloaded(&self) {
                (**self).on_overloaded();
            }
        }
    )*};
}
// A budget is shared: borrowed for a call, or held in an `Arc` by a client.
forward_budget!(&B, std::sync::Arc<B>);

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
/// use retries::budget::{Budget, TokenBucket};
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
        // Three decimals exactly, as gRFC A6 keeps them: 2.01 is stored as
        // 2010 milli-tokens although `2.01 * 1000.0` is 2009.999…; digits past
        // the third decimal are dropped.
        let milli = token_ratio * 1000.0;
        let nearest = milli.round();
        let ratio = if (milli - nearest).abs() < 1e-6 {
            nearest
        } else {
            milli.floor()
        };
        let ratio = if ratio > u32::MAX as f64 {
            u32::MAX
        } else {
            ratio as u32
        };
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

const SLOTS: usize = 10;
const EPOCH_BITS: u32 = 40;
const EPOCH_MASK: u64 = (1 << EPOCH_BITS) - 1;
const COUNT_MASK: u64 = (1 << (64 - EPOCH_BITS)) - 1;

/// Add one to a counter tagged with the time slot (`epoch`) it counts: a
/// counter of an older slot starts again at 1. Lock-free; saturates. Shared
/// by [`RatioBudget`] and [`Admission`](crate::limit::Admission).
#[inline]
pub(crate) fn bump_tagged(counter: &AtomicU64, epoch: u64) {
    add_tagged(counter, epoch, 1);
}

/// Add `n` to a counter tagged with the time slot `epoch` (saturating): a
/// counter of an older slot starts again at `n`; a counter already tagged
/// with a later slot is left alone (the count was made before the slot
/// moved on, and belongs to a slot that is gone; found by the `loom` model,
/// where such a late write took a newer slot back to the older one and
/// lost its counts). One compare-exchange loop, so no concurrent add is
/// lost (the window's seeding used a load and a store, which lost an
/// attempt counted between them; also found by the model).
pub(crate) fn add_tagged(counter: &AtomicU64, epoch: u64, n: u64) {
    let epoch = epoch & EPOCH_MASK;
    let mut v = counter.load(Ordering::Relaxed);
    loop {
        let tag = v >> (64 - EPOCH_BITS);
        let next = if tag == epoch {
            let count = v & COUNT_MASK;
            if count == COUNT_MASK {
                return; // saturated
            }
            (epoch << (64 - EPOCH_BITS)) | count.saturating_add(n).min(COUNT_MASK)
        } else if later(tag, epoch) {
            return;
        } else {
            (epoch << (64 - EPOCH_BITS)) | n.min(COUNT_MASK)
        };
        match counter.compare_exchange_weak(v, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return,
            Err(actual) => v = actual,
        }
    }
}

/// `tag` is a later time slot than `epoch` (epochs wrap after 2^40 slots;
/// of two, the one at most half the range ahead is the later).
fn later(tag: u64, epoch: u64) -> bool {
    let ahead = tag.wrapping_sub(epoch) & EPOCH_MASK;
    ahead != 0 && ahead <= EPOCH_MASK / 2
}

/// A tagged counter's count as of `epoch`: zero when it counts a slot
/// `window` slots old or older.
pub(crate) fn read_tagged(counter: &AtomicU64, epoch: u64, window: u64) -> u64 {
    let v = counter.load(Ordering::Relaxed);
    let age = epoch.wrapping_sub(v >> (64 - EPOCH_BITS)) & EPOCH_MASK;
    if age < window { v & COUNT_MASK } else { 0 }
}

/// The time slot `now` is in, counted in slots of `slot_nanos` from
/// `origin` (set at the first use), as tagged counters want it.
pub(crate) fn epoch_of(origin: &OnceLock<Instant>, slot_nanos: u64) -> u64 {
    let origin = *origin.get_or_init(crate::time::now);
    let nanos = u64::try_from(crate::time::since(origin).as_nanos()).unwrap_or(u64::MAX);
    (nanos / slot_nanos) & EPOCH_MASK
}

/// One slot of a [`RatioBudget`]: a counter tagged with the time slot it
/// counts, so a stale slot reads as zero and is reset by the next write.
#[derive(Debug)]
struct Slot {
    deposits: AtomicU64,
    withdrawals: AtomicU64,
}

impl Slot {
    const fn new() -> Self {
        Self {
            deposits: AtomicU64::new(0),
            withdrawals: AtomicU64::new(0),
        }
    }
}

/// A ratio budget, as in Finagle's `RetryBudget` and tower's `TpsBudget`:
/// retries may add at most `retry_percent` % to the calls made in the last
/// `ttl`, plus a floor of `min_per_sec` retries per second (so that a quiet
/// client can still retry).
///
/// Every logical call deposits; every retry withdraws one, if the balance
/// (`min_per_sec · ttl + calls · retry_percent / 100 − retries`, over the last
/// `ttl`) allows it. The window is ten slots of `ttl / 10`: a deposit expires
/// between `0.9 · ttl` and `ttl` after it was made. Lock-free (each slot is one
/// atomic tagged with its time slot) and `const`-constructible; under heavy
/// contention two racing retries may both take the last unit of balance.
///
/// Compared with the default [`TokenBucket`], it needs the clock on every
/// call, and it bounds the retry *ratio* precisely over a time window rather
/// than reacting to the failure ratio; prefer it when the downstream service
/// publishes a retry ratio it tolerates.
///
/// ```
/// use std::time::Duration;
/// use retries::budget::{Budget, RatioBudget};
///
/// // 20 % extra load at most, and 10 retries per second whatever the traffic.
/// static SEARCH: RatioBudget = RatioBudget::new(Duration::from_secs(10), 10, 20);
/// # let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
/// # rt.block_on(async {
/// SEARCH.on_call();
/// assert!(SEARCH.try_retry());
/// # });
/// ```
#[derive(Debug)]
pub struct RatioBudget {
    origin: OnceLock<Instant>,
    slots: [Slot; SLOTS],
    slot_nanos: u64,
    percent: u64,
    reserve: u64,
    /// `Some` for a [decaying floor](Self::decaying_floor): how well calls
    /// have gone, a moving average in `0..=HEALTHY`.
    health: Option<AtomicU32>,
}

/// Whole health (every recent call succeeded) of a decaying floor, in
/// fixed point.
const HEALTHY: u32 = 1 << 16;
/// The weight of the latest outcome in a decaying floor's health: 1/8.
const HEALTH_SHIFT: u32 = 3;

impl RatioBudget {
    /// A budget over `ttl` (1 ms to 60 s), with a floor of `min_per_sec`
    /// retries per second and at most `retry_percent` (0 to 1000) retries per
    /// 100 calls. Panics (a compile error in a `static`) on invalid settings;
    /// use [`try_new`](Self::try_new) at run time.
    ///
    /// # Panics
    ///
    /// When `ttl` or `retry_percent` is out of range.
    #[must_use]
    #[track_caller]
    pub const fn new(ttl: Duration, min_per_sec: u32, retry_percent: u32) -> Self {
        if let Err(e) = Self::validate(ttl, retry_percent) {
            panic!("{}", e.message());
        }
        Self::build(ttl, min_per_sec, retry_percent)
    }

    /// A budget, or why the settings are invalid.
    pub const fn try_new(
        ttl: Duration,
        min_per_sec: u32,
        retry_percent: u32,
    ) -> Result<Self, BudgetError> {
        match Self::validate(ttl, retry_percent) {
            Ok(()) => Ok(Self::build(ttl, min_per_sec, retry_percent)),
            Err(e) => Err(e),
        }
    }

    const fn validate(ttl: Duration, retry_percent: u32) -> Result<(), BudgetError> {
        if ttl.as_nanos() < 1_000_000 || ttl.as_nanos() > 60_000_000_000 {
            return Err(BudgetError::Window);
        }
        if retry_percent > 1000 {
            return Err(BudgetError::Percent);
        }
        Ok(())
    }

    const fn build(ttl: Duration, min_per_sec: u32, retry_percent: u32) -> Self {
        let ttl_nanos = ttl.as_nanos() as u64;
        Self {
            origin: OnceLock::new(),
            slots: [const { Slot::new() }; SLOTS],
            slot_nanos: ttl_nanos / SLOTS as u64,
            percent: retry_percent as u64,
            health: None,
            // Saturating: `u32::MAX` retries per second over 60 s overflows u64.
            reserve: {
                let r = min_per_sec as u128 * ttl_nanos as u128 / 1_000_000_000;
                if r > u64::MAX as u128 {
                    u64::MAX
                } else {
                    r as u64
                }
            },
        }
    }

    /// The same budget with a floor that does not multiply across a fleet.
    ///
    /// The floor (`min_per_sec · ttl`) is scaled by how well calls have
    /// gone: a moving average of outcomes, `h`, starts at 1, moves 1/8 of the
    /// way to 1 with each call that succeeds and 1/8 of the way to 0 with
    /// each attempt that fails transiently, and the floor is multiplied by
    /// `max(0, 2h − 1)`: whole while calls succeed, zero once failures weigh
    /// as much as successes. A quiet client keeps its floor for a sporadic
    /// failure (one failure after a run of successes leaves 3/4 of it);
    /// in an outage six failed attempts in a row take it away, and only the
    /// ratio is left. A ratio composes: N clients that each retry at most
    /// `retry_percent` % of their calls retry at most `retry_percent` % of
    /// the fleet's, however many they are (`cargo run --example fleet`).
    ///
    /// The average forgets by outcomes, not by time: a client that saw an
    /// outage and has made no call since has no floor until its calls
    /// succeed again. Cost: one compare-and-swap on each success and each
    /// failed attempt; a plain ratio budget (without this) has neither.
    ///
    /// ```
    /// use std::time::Duration;
    /// use retries::budget::{Budget, RatioBudget};
    ///
    /// static SEARCH: RatioBudget = RatioBudget::new(Duration::from_secs(10), 1, 0).decaying_floor();
    /// # let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    /// # rt.block_on(async {
    /// assert_eq!(SEARCH.balance(), 10); // the whole floor
    /// SEARCH.on_transient_failure();
    /// assert_eq!(SEARCH.balance(), 7); // 10 · (2 · 7/8 − 1)
    /// for _ in 0..5 { SEARCH.on_transient_failure(); }
    /// assert_eq!(SEARCH.balance(), 0); // failures dominate: no floor
    /// # });
    /// ```
    #[must_use]
    pub const fn decaying_floor(mut self) -> Self {
        self.health = Some(AtomicU32::new(HEALTHY));
        self
    }

    fn epoch(&self) -> u64 {
        epoch_of(&self.origin, self.slot_nanos)
    }

    /// The floor now: whole, or scaled by `max(0, 2h − 1)` for a
    /// [decaying floor](Self::decaying_floor).
    fn floor(&self) -> u64 {
        let Some(health) = &self.health else {
            return self.reserve;
        };
        let h = u64::from(health.load(Ordering::Relaxed));
        let scale = (2 * h).saturating_sub(u64::from(HEALTHY));
        let floor = u128::from(self.reserve) * u128::from(scale) / u128::from(HEALTHY);
        u64::try_from(floor).unwrap_or(u64::MAX)
    }

    /// Move a decaying floor's health 1/8 of the way to 1 (`up`) or to 0.
    fn weigh(&self, up: bool) {
        if let Some(health) = &self.health {
            let _ = health.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                Some(if up {
                    h + ((HEALTHY - h) >> HEALTH_SHIFT)
                } else {
                    h - (h >> HEALTH_SHIFT)
                })
            });
        }
    }

    fn slot(&self, epoch: u64) -> &Slot {
        &self.slots[(epoch % SLOTS as u64) as usize]
    }

    fn bump(counter: &AtomicU64, epoch: u64) {
        bump_tagged(counter, epoch);
    }

    fn total(&self, epoch: u64, pick: impl Fn(&Slot) -> &AtomicU64) -> u64 {
        self.slots
            .iter()
            .map(|s| read_tagged(pick(s), epoch, SLOTS as u64))
            .sum()
    }

    /// Retries allowed in a window holding `deposits` calls (saturating).
    fn allowance(&self, deposits: u64) -> u64 {
        self.floor()
            .saturating_add(deposits.saturating_mul(self.percent) / 100)
    }

    /// Retries the budget would allow now.
    pub fn balance(&self) -> u64 {
        let epoch = self.epoch();
        let deposits = self.total(epoch, |s| &s.deposits);
        let withdrawals = self.total(epoch, |s| &s.withdrawals);
        self.allowance(deposits).saturating_sub(withdrawals)
    }
}

impl Budget for RatioBudget {
    fn on_call(&self) {
        let epoch = self.epoch();
        Self::bump(&self.slot(epoch).deposits, epoch);
    }

    fn try_retry(&self) -> bool {
        let epoch = self.epoch();
        let deposits = self.total(epoch, |s| &s.deposits);
        let withdrawals = self.total(epoch, |s| &s.withdrawals);
        if withdrawals >= self.allowance(deposits) {
            return false;
        }
        Self::bump(&self.slot(epoch).withdrawals, epoch);
        true
    }

    fn on_success(&self) {
        self.weigh(true);
    }

    fn on_transient_failure(&self) {
        self.weigh(false);
    }
}

/// The bucket and the tagged slots under `loom` (CI: `--cfg loom`).
#[cfg(all(test, loom))]
mod loom_models;
