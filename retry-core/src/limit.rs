//! Backpressure: a [`Concurrency`] limit shared by calls, with bounded
//! waiting, a [`RateLimit`] every attempt draws from (one per key with
//! [`RateLimits`]), and `retries_tower::ShedLayer` (the `retries-tower`
//! crate), the server-side half.
//!
//! | what | for | set with | a call that cannot go |
//! |---|---|---|---|
//! | [`Concurrency::new`] | calls in flight against a service, fixed | `concurrency = LIMIT`, [`Retry::concurrency`](crate::Retry::concurrency), the doors' `concurrency` | waits up to `max_wait`, then [`Reason::Saturated`](crate::Reason::Saturated) |
//! | [`Concurrency::adaptive`] | the same, between a floor and a ceiling, moved by round trips and overloaded verdicts to the service's capacity | the same | the same |
//! | [`RateLimit`] | attempts started per second (a provider's quota) | `rate_limit = LIMIT`, [`Retry::rate_limit`](crate::Retry::rate_limit), the HTTP doors' `rate_limit` | waits for its start within the deadline, else [`Reason::RateLimited`](crate::Reason::RateLimited) |
//! | [`RateLimits`] | the same per key (tenant, authority) | a key's [`RateLimits::get`] given as a `RateLimit` | the same |
//! | [`Pace`] | the quota a server announces (`RateLimit`, `X-RateLimit-*`) | the HTTP doors, on by default (`quotas`); [`Retry::pace`](crate::Retry::pace) | waits for its start within the deadline, else [`Reason::OverQuota`](crate::Reason::OverQuota) |
//! | [`Admission`] | first attempts while the service refuses as overloaded | given as the budget (`budget = ADMISSION`) | [`Reason::Throttled`](crate::Reason::Throttled) |
//! | `retries_tower::ShedLayer` | a server's requests in flight | the server's tower stack | answered 503 / `RESOURCE_EXHAUSTED` with a pause |
//!
//! # The client side
//!
//! A [`Concurrency`] is a number of slots shared by every call given it (a
//! `static`, a field of a client, an `Arc`): `#[retryable(concurrency =
//! LIMIT)]`, [`Retry::concurrency`](crate::Retry::concurrency), or
//! `retries_tower::RetryLayer::concurrency` (the `retries-tower` crate). Before
//! its first attempt a call takes a slot:
//!
//! * a free slot is taken at once (no clock read, no allocation);
//! * otherwise the call queues, first come first served, for at most the
//!   limit's `max_wait`, and never past the point where its first attempt
//!   would no longer fit before the call's deadline (less `min_attempt`). The
//!   wait counts against the call's deadline;
//! * a call that gets no slot in that time stops at once with
//!   [`Reason::Saturated`](crate::Reason::Saturated): nothing was sent (its
//!   [`Stopped`](crate::Stopped) classifies as `NotExecuted`, so an outer
//!   loop knows the work did not run), no attempt was made, and its budget is
//!   neither charged nor credited for a failure.
//!
//! **A call keeps its slot for its whole life, retries and pauses included.**
//! Chosen over queuing again for every retry because a retry that joined the
//! back of the queue could be refused a slot after its first attempt already
//! had an effect, turning a recoverable failure into a stop; and because the
//! limit then bounds what it is meant to bound, the calls in progress against
//! the service, retry storms included (a retry never adds a caller). The
//! price is a slot idle during a pause; keep pauses short against a
//! saturated service, or let the budget stop them.
//!
//! A call nested inside another call's attempt takes a slot only if it is
//! given a limit itself. The blocking door (`run_blocking`) takes a free slot
//! or stops with `Saturated` at once: a thread waiting in a queue holds its
//! resources anyway, so it does not wait (the attribute refuses `concurrency`
//! on a blocking `fn`). A hedged call takes one slot for all its copies.
//!
//! ```
//! use std::time::Duration;
//! use retries::limit::Concurrency;
//! use retries::{Attempt, Policy, Reason};
//!
//! static LIMIT: Concurrency = Concurrency::new(1, Duration::from_millis(100));
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let policy = Policy::new(Duration::from_secs(2));
//! let slow = retries::call(&policy).idempotent().concurrency(&LIMIT).outcome(async |_: &Attempt| {
//!     tokio::time::sleep(Duration::from_secs(1)).await;
//!     Ok::<_, std::io::Error>("slow")
//! });
//! let waiting = retries::call(&policy).idempotent().concurrency(&LIMIT).outcome(async |_: &Attempt| {
//!     Ok::<_, std::io::Error>("never sent")
//! });
//! let (slow, waiting) = tokio::join!(slow, waiting);
//! assert_eq!(slow.unwrap(), "slow");
//! assert_eq!(waiting.unwrap_err().reason(), Reason::Saturated); // after 100 ms of waiting
//! # }
//! ```
//!
//! # Rates
//!
//! A [`RateLimit`] bounds how often attempts *start* (a provider's quota:
//! "100 a second, bursts of 10"), where a [`Concurrency`] bounds how many
//! are in flight. Every attempt draws a start: first attempts, retries
//! after their pause, hedged copies. The start is reserved only when it
//! fits the call's deadline (less `min_attempt`) and waited for on the
//! call's timer; one that would not fit stops the call at once with
//! [`Reason::RateLimited`](crate::Reason::RateLimited), nothing sent and
//! nothing reserved. Set with `#[retryable(rate_limit = LIMIT)]`,
//! [`Retry::rate_limit`](crate::Retry::rate_limit) or the HTTP doors'
//! `rate_limit`; beside a concurrency limit, the slot is taken first, then
//! the start. [`RateLimits`] keeps one per key a caller derives (a tenant,
//! an authority).
//!
//! # First attempts: adaptive admission
//!
//! Budgets and limits bound retries and calls in progress; an overloaded
//! service that refuses calls still receives every *first* attempt of every
//! caller. An [`Admission`], given where a budget is given, refuses first
//! attempts locally at the SRE book's rate while the service refuses calls
//! as overloaded, so it receives about `K` times what it accepts (see
//! [`Admission`]).
//!
//! # The server side
//!
//! `retries_tower::ShedLayer` puts a limit in front of a server's
//! service: a request that finds it full is answered at once, without
//! reaching the service, with gRPC `RESOURCE_EXHAUSTED` and
//! `grpc-retry-pushback-ms` (for `application/grpc` requests) or HTTP 503
//! with `Retry-After`. Both are read by this crate's clients as "not
//! executed, retry after the hint", so an overloaded server says so honestly
//! instead of queueing calls without bound.

use std::time::Duration;

mod adaptive;

pub(crate) use adaptive::Sample;
pub use adaptive::TOLERANCE;

pub use crate::admission::{Admission, AdmissionError};
pub use crate::rate::{Pace, Paces, RateLimit, RateLimitError, RateLimits};

/// A concurrency limit with bounded waiting, shared by the calls given it;
/// see the [module docs](self). `const`-constructible for a `static`.
#[derive(Debug)]
pub struct Concurrency {
    pub(crate) semaphore: tokio::sync::Semaphore,
    slots: u32,
    max_wait: Duration,
    /// The adaptive kind's learning state; `None` for a fixed limit.
    adaptive: Option<adaptive::Adaptive>,
}

/// The number of slots was 0 (no call could ever run), or an adaptive
/// limit's ceiling was under its floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a concurrency limit needs at least one slot, and a ceiling no lower than its floor")]
pub struct LimitError;

impl Concurrency {
    /// `slots` calls at once (0 counts as 1: use [`try_new`](Self::try_new)
    /// to have it refused; more than tokio's semaphore holds counts as its
    /// maximum); a call waits at most `max_wait` for a slot
    /// (zero: it takes a free slot or stops at once).
    #[must_use]
    pub const fn new(slots: u32, max_wait: Duration) -> Self {
        let slots = if slots == 0 { 1 } else { slots };
        // tokio's ceiling (2^61 − 1 on 64-bit targets, 2^29 − 1 on 32-bit).
        let max = tokio::sync::Semaphore::MAX_PERMITS;
        let slots = if slots as usize > max {
            max as u32
        } else {
            slots
        };
        Self {
            semaphore: tokio::sync::Semaphore::const_new(slots as usize),
            slots,
            max_wait,
            adaptive: None,
        }
    }

    /// An **adaptive** limit: between `floor` and `ceiling` slots, moved by
    /// what the attempts of the calls holding them tell (an overloaded
    /// verdict shrinks it at once, a round trip rising past the unloaded
    /// one by more than [`TOLERANCE`] shrinks it gradually, successes at
    /// the unloaded round trip grow it; see the [module docs](self)). It
    /// starts at twice the floor (within the ceiling). A call waits at most
    /// `max_wait` for a slot, as with a fixed limit. A `floor` of 0 counts
    /// as 1, a `ceiling` under the floor as the floor: use
    /// [`try_adaptive`](Self::try_adaptive) to have them refused.
    ///
    /// ```
    /// use std::time::Duration;
    /// use retries::limit::Concurrency;
    ///
    /// let limit = Concurrency::adaptive(4, 256, Duration::from_millis(200));
    /// assert_eq!((limit.slots(), limit.floor(), limit.ceiling()), (8, 4, 256));
    /// assert!(limit.is_adaptive());
    /// ```
    #[must_use]
    pub fn adaptive(floor: u32, ceiling: u32, max_wait: Duration) -> Self {
        let max = u32::try_from(tokio::sync::Semaphore::MAX_PERMITS).unwrap_or(u32::MAX);
        let floor = floor.clamp(1, max);
        let ceiling = ceiling.clamp(floor, max);
        let start = floor.saturating_mul(2).min(ceiling);
        Self {
            semaphore: tokio::sync::Semaphore::new(start as usize),
            slots: ceiling,
            max_wait,
            adaptive: Some(adaptive::Adaptive::new(floor, ceiling, start)),
        }
    }

    /// [`adaptive`](Self::adaptive), refusing a floor of 0 or a ceiling
    /// under the floor (for limits read from configuration).
    ///
    /// # Errors
    ///
    /// [`LimitError`] for a floor of 0 or a ceiling under the floor.
    pub fn try_adaptive(floor: u32, ceiling: u32, max_wait: Duration) -> Result<Self, LimitError> {
        if floor == 0 || ceiling < floor {
            return Err(LimitError);
        }
        Ok(Self::adaptive(floor, ceiling, max_wait))
    }

    /// Is this an adaptive limit ([`adaptive`](Self::adaptive))?
    #[must_use]
    pub const fn is_adaptive(&self) -> bool {
        self.adaptive.is_some()
    }

    /// The fewest slots an adaptive limit shrinks to; a fixed limit's slots.
    #[must_use]
    pub fn floor(&self) -> u32 {
        self.adaptive.as_ref().map_or(self.slots, |a| a.floor)
    }

    /// The most slots an adaptive limit grows to; a fixed limit's slots.
    #[must_use]
    pub const fn ceiling(&self) -> u32 {
        self.slots
    }

    /// Learn from an attempt of a call holding a slot (adaptive limits).
    pub(crate) fn learn(&self, sample: Sample) {
        if let Some(a) = &self.adaptive {
            a.learn(sample, crate::time::now(), &self.semaphore);
        }
    }

    /// [`new`](Self::new), refusing 0 slots (for limits read from configuration).
    pub const fn try_new(slots: u32, max_wait: Duration) -> Result<Self, LimitError> {
        if slots == 0 {
            return Err(LimitError);
        }
        Ok(Self::new(slots, max_wait))
    }

    /// The number of slots: an adaptive limit's now.
    #[must_use]
    pub fn slots(&self) -> u32 {
        match &self.adaptive {
            Some(a) => a.current().0,
            None => self.slots,
        }
    }

    /// The longest a call waits for a slot.
    #[must_use]
    pub const fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// Calls holding a slot now.
    #[must_use]
    pub fn in_flight(&self) -> u32 {
        let issued = match &self.adaptive {
            Some(a) => a.current().1,
            None => self.slots,
        };
        issued.saturating_sub(u32::try_from(self.semaphore.available_permits()).unwrap_or(u32::MAX))
    }

    /// A free slot, if there is one now.
    #[inline]
    pub(crate) fn try_take(&self) -> Option<Slot<'_>> {
        self.semaphore.try_acquire().ok().map(Slot)
    }

    /// A slot, waiting in turn (first come first served) for one.
    pub(crate) async fn take(&self) -> Slot<'_> {
        match self.semaphore.acquire().await {
            Ok(permit) => Slot(permit),
            // The semaphore is never closed.
            Err(_) => unreachable!("a `Concurrency` is never closed"),
        }
    }

    /// A free slot now, held apart from any call (a server's request in
    /// flight) until the [`OwnedSlot`] is dropped; `None` when the limit is
    /// full. It keeps the limit alive.
    #[must_use]
    pub fn try_own(self: &std::sync::Arc<Self>) -> Option<OwnedSlot> {
        // The permit is forgotten here and given back on drop: the
        // semaphore is owned by value, so that a limit can be a `static`.
        let permit = self.semaphore.try_acquire().ok()?;
        permit.forget();
        Some(OwnedSlot(std::sync::Arc::clone(self)))
    }

    /// Give back a slot that a call [kept](Slot::keep).
    #[inline]
    pub(crate) fn give_back(&self) {
        match &self.adaptive {
            Some(a) => a.give_back(&self.semaphore),
            None => self.semaphore.add_permits(1),
        }
    }
}

/// A slot of a [`Concurrency`] held apart from any call
/// ([`Concurrency::try_own`]), given back when dropped.
#[derive(Debug)]
pub struct OwnedSlot(std::sync::Arc<Concurrency>);

impl Drop for OwnedSlot {
    fn drop(&mut self) {
        self.0.give_back();
    }
}

/// A slot of a [`Concurrency`], just taken.
#[derive(Debug)]
#[must_use = "a slot is given back when dropped, unless kept"]
pub struct Slot<'a>(tokio::sync::SemaphorePermit<'a>);

impl Slot<'_> {
    /// Keep the slot until [`Concurrency::give_back`]: the engine records
    /// that it holds one in a flag (in its padding) rather than storing the
    /// permit, so a call without a limit stores nothing for it.
    #[inline]
    pub(crate) fn keep(self) {
        self.0.forget();
    }
}
