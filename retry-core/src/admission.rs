//! [`Admission`]: adaptive admission of first attempts, the client-side
//! throttling of the Google SRE book ("Handling Overload"), re-exported from
//! [`limit`](crate::limit).

use std::sync::OnceLock;
use std::sync::atomic::Ordering;

use crate::sync::{AtomicBool, AtomicU64};
use std::time::{Duration, Instant};

use crate::budget::{Budget, TokenBucket, add_tagged, bump_tagged, epoch_of, read_tagged};

/// Slots of the sliding window.
const SLOTS: usize = 10;
/// One in fixed point, for the rejection accumulator.
const ONE: u64 = 1 << 32;

/// The counters of one slot of the window.
#[derive(Debug)]
struct Slot {
    /// Attempts sent: first attempts admitted and retries the budget allowed.
    sent: AtomicU64,
    /// Attempts the service refused as overloaded.
    overloaded: AtomicU64,
    /// First attempts refused here.
    refused: AtomicU64,
}

impl Slot {
    const fn new() -> Self {
        Self {
            sent: AtomicU64::new(0),
            overloaded: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }
}

/// A bad setting for an [`Admission`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AdmissionError {
    /// `K` is not a finite number above zero.
    #[error("an admission's K must be a finite number above 0")]
    K,
    /// The window is shorter than 10 ms or longer than an hour.
    #[error("an admission's window must be between 10 ms and 1 hour")]
    Window,
}

/// Adaptive admission of first attempts, shared like a budget (a `static`,
/// a field of a client, an `Arc`) and given where a budget is given
/// (`budget = ADMISSION` in the attribute, [`Retry::budget`](crate::Retry::budget),
/// the layer's and the middleware's `budget`): it gates a call's **first**
/// attempt, and the budget it wraps (a [`TokenBucket`] unless you give
/// another) gates its retries as before.
///
/// It learns only from refusals that say "overloaded" and are certainly
/// not executed ([`Verdict::is_overloaded`](crate::Verdict::is_overloaded):
/// HTTP 429, 503 with `Retry-After`, gRPC `RESOURCE_EXHAUSTED`, this
/// crate's `ShedLayer` answers, a downstream limit's `Saturated`, and a
/// variant of your own error marked `#[classify(overloaded)]` in the derive,
/// or a classifier returning `Verdict::not_executed().with_overload()`); a
/// variant marked only `not_executed`, an unknown outcome or a permanent
/// error never lowers the rate. Over a sliding window
/// (ten slots of a tenth each), with `requests` the attempts this client
/// made or refused there and `accepts` those the service did not refuse as
/// overloaded, a new call is refused locally at the rate
/// `max(0, (requests − K·accepts) / (requests + 1))`: under sustained
/// overload the service receives about `K` times what it accepts, instead
/// of every caller's full demand. As the refusals age out of the window the
/// rate falls back to zero.
///
/// Choices where the SRE book is silent:
///
/// * **Deterministic refusals**: the rate is applied by error diffusion
///   (each call adds the current rate to an accumulator and is refused when
///   it crosses a whole number), not by a random draw: the same fraction,
///   exact counts, reproducible runs.
/// * **Light when healthy**: until the service refuses a call as
///   overloaded, each attempt sent adds one to a single counter, and the
///   clock is not read (after the first call). At the first overloaded
///   refusal those attempts are spread evenly over the slots of the time
///   they were sent in, as accepted requests: the first rate of an episode
///   is what a window that counted all along would give (a service that
///   accepted 100 calls before refusing the 101st is not taken for one that
///   accepts nothing), and the episode reaches `K×` within its first
///   window slot.
/// * **Nothing forgotten between episodes**: counting stops once a whole
///   window has passed without an overloaded refusal, and the slots keep
///   what they counted; an episode that begins while they are still in the
///   window starts from them and from the attempts sent since, not from
///   "no accepts" (which would refuse nearly every call, starve the
///   service, and after the next window send the whole demand again: the
///   sawtooth of a service whose capacity is counted per second). A
///   service of 100 calls/s under 1,000/s, K = 2: 2.01× per call accepted
///   counted per call, 2.05× counted per second, 2.03× per 500 ms (test
///   `a_service_is_held_at_k_times_its_capacity_whatever_its_granularity`).
/// * A call refused locally sends nothing, costs no budget, and stops with
///   [`Reason::Throttled`](crate::Reason::Throttled), whose `Stopped`
///   classifies as not executed (overloaded), so an outer loop knows nothing
///   ran.
///
/// A WARN (target `retries`) says when it starts throttling, an INFO when
/// the overload has left its window; each local refusal is a DEBUG event and
/// counts in `retry.admission.refused`.
///
/// ```
/// use std::time::Duration;
/// use retries::limit::Admission;
/// use retries::{Attempt, Policy, Reason, Verdict};
///
/// static ADMISSION: Admission = Admission::new(2.0, Duration::from_secs(60));
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let policy = Policy::new(Duration::from_secs(1)).with_max_attempts(1);
/// // The service refuses everything as overloaded (a 429, say)...
/// let mut sent = 0;
/// let mut throttled = 0;
/// for _ in 0..100 {
///     let r = retries::call(&policy)
///         .idempotent()
///         .budget(&ADMISSION)
///         .classify(|_: &std::io::Error| Verdict::not_executed().with_overload())
///         .outcome(async |_: &Attempt| {
///             sent += 1;
///             Err::<(), _>(std::io::Error::other("429"))
///         })
///         .await;
///     if r.unwrap_err().reason() == Reason::Throttled {
///         throttled += 1;
///     }
/// }
/// // ...so most calls are refused here, before anything is sent.
/// assert_eq!(sent + throttled, 100);
/// assert!(throttled > 90, "{throttled}");
/// # }
/// ```
#[derive(Debug)]
pub struct Admission<B = TokenBucket> {
    budget: B,
    /// `K` in thousandths.
    k_milli: u64,
    origin: OnceLock<Instant>,
    slot_nanos: u64,
    slots: [Slot; SLOTS],
    /// Counting: an overloaded refusal was seen within the last window.
    active: AtomicBool,
    /// Attempts sent while not counting (the next episode's past).
    idle_sent: AtomicU64,
    /// The slot in which the current time of not counting began.
    idle_since: AtomicU64,
    /// The last slot an overloaded refusal was counted in.
    last_overload: AtomicU64,
    /// The rejection accumulator, in fixed point (`ONE` is one call).
    debt: AtomicU64,
}

impl Admission {
    /// An admission with the SRE rule's `k` (2.0 in the book) over
    /// `window`, around the default [`TokenBucket`] for retries. Panics (a
    /// compile error in a `static`) on invalid settings: `k` not a finite
    /// number above 0, a window outside 10 ms to 1 hour; use
    /// [`try_new`](Self::try_new) at run time.
    ///
    /// # Panics
    ///
    /// On invalid settings.
    #[must_use]
    #[track_caller]
    pub const fn new(k: f64, window: Duration) -> Self {
        Self::around(TokenBucket::DEFAULT, k, window)
    }

    /// An admission, or why the settings are invalid.
    ///
    /// # Errors
    ///
    /// [`AdmissionError::K`], [`AdmissionError::Window`].
    pub const fn try_new(k: f64, window: Duration) -> Result<Self, AdmissionError> {
        Self::try_around(TokenBucket::DEFAULT, k, window)
    }
}

impl<B: Budget> Admission<B> {
    /// An admission around `budget` (which gates the retries).
    ///
    /// # Panics
    ///
    /// On invalid settings, as [`Admission::new`].
    #[must_use]
    #[track_caller]
    pub const fn around(budget: B, k: f64, window: Duration) -> Self {
        if let Err(e) = validate(k, window) {
            std::mem::forget(budget);
            match e {
                AdmissionError::K => panic!("an admission's K must be a finite number above 0"),
                AdmissionError::Window => {
                    panic!("an admission's window must be between 10 ms and 1 hour")
                }
            }
        }
        Self::build(budget, k, window)
    }

    /// An admission around `budget`, or why the settings are invalid.
    ///
    /// # Errors
    ///
    /// [`AdmissionError::K`], [`AdmissionError::Window`].
    pub const fn try_around(budget: B, k: f64, window: Duration) -> Result<Self, AdmissionError> {
        if let Err(e) = validate(k, window) {
            // (A const fn cannot drop a generic value: it is forgotten.)
            std::mem::forget(budget);
            return Err(e);
        }
        Ok(Self::build(budget, k, window))
    }

    const fn build(budget: B, k: f64, window: Duration) -> Self {
        Self {
            budget,
            // At least one thousandth.
            k_milli: {
                let m = (k * 1000.0) as u64;
                if m == 0 { 1 } else { m }
            },
            origin: OnceLock::new(),
            slot_nanos: window.as_nanos() as u64 / SLOTS as u64,
            slots: [const { Slot::new() }; SLOTS],
            active: AtomicBool::new(false),
            idle_sent: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            last_overload: AtomicU64::new(0),
            debt: AtomicU64::new(0),
        }
    }
}

/// `k` a finite number above 0 (at most 10¹²), the window 10 ms to 1 hour.
const fn validate(k: f64, window: Duration) -> Result<(), AdmissionError> {
    if !(k.is_finite() && k > 0.0) || k > 1e12 {
        return Err(AdmissionError::K);
    }
    let nanos = window.as_nanos();
    if nanos < 10_000_000 || nanos > 3_600_000_000_000 {
        return Err(AdmissionError::Window);
    }
    Ok(())
}

impl<B> Admission<B> {
    /// The budget for retries it wraps.
    pub fn budget(&self) -> &B {
        &self.budget
    }

    fn epoch(&self) -> u64 {
        epoch_of(&self.origin, self.slot_nanos)
    }

    fn slot(&self, epoch: u64) -> &Slot {
        &self.slots[(epoch % SLOTS as u64) as usize]
    }

    fn totals(&self, epoch: u64) -> (u64, u64, u64) {
        let total = |pick: fn(&Slot) -> &AtomicU64| -> u64 {
            self.slots
                .iter()
                .map(|s| read_tagged(pick(s), epoch, SLOTS as u64))
                .sum()
        };
        (
            total(|s| &s.sent),
            total(|s| &s.overloaded),
            total(|s| &s.refused),
        )
    }

    /// The rate at which new calls are refused now, in `[0, 1)`: zero while
    /// no overloaded refusal is in the window.
    #[must_use]
    pub fn refusal_rate(&self) -> f64 {
        if !self.active.load(Ordering::Relaxed) {
            return 0.0;
        }
        let (sent, overloaded, refused) = self.totals(self.epoch());
        rate(sent, overloaded, refused, self.k_milli) as f64 / ONE as f64
    }

    /// `true` while it counts (an overloaded refusal within the last window).
    #[must_use]
    pub fn is_throttling(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }
}

/// `max(0, (requests − K·accepts) / (requests + 1))` in fixed point, with
/// `requests = sent + refused`, `accepts = sent − overloaded`.
fn rate(sent: u64, overloaded: u64, refused: u64, k_milli: u64) -> u64 {
    let requests = u128::from(sent) + u128::from(refused);
    let accepts = u128::from(sent.saturating_sub(overloaded));
    let excess = (requests * 1000).saturating_sub(u128::from(k_milli) * accepts);
    let r = excess * u128::from(ONE) / ((requests + 1) * 1000);
    u64::try_from(r).unwrap_or(ONE - 1).min(ONE - 1)
}

impl<B: Budget> Budget for Admission<B> {
    #[inline]
    fn on_call(&self) {
        self.budget.on_call();
    }

    #[inline]
    fn on_success(&self) {
        self.budget.on_success();
    }

    #[inline]
    fn on_transient_failure(&self) {
        self.budget.on_transient_failure();
    }

    fn try_retry(&self) -> bool {
        let allowed = self.budget.try_retry();
        if allowed {
            if self.active.load(Ordering::Relaxed) {
                let epoch = self.epoch();
                bump_tagged(&self.slot(epoch).sent, epoch);
            } else {
                self.idle_sent.fetch_add(1, Ordering::Relaxed);
            }
        }
        allowed
    }

    #[inline]
    fn admit(&self) -> bool {
        if !self.active.load(Ordering::Relaxed) {
            self.admit_idle();
            return true;
        }
        self.admit_counted()
    }

    fn on_overloaded(&self) {
        let epoch = self.epoch();
        let slot = self.slot(epoch);
        if !self.active.swap(true, Ordering::Relaxed) {
            // The first of an episode: the attempts sent since counting
            // stopped (this one among them) become the window's past.
            self.seed(epoch);
            #[cfg(feature = "tracing")]
            tracing::warn!(
                target: "retries",
                "the service refuses calls as overloaded: first attempts are throttled"
            );
        }
        bump_tagged(&slot.overloaded, epoch);
        self.last_overload.store(epoch, Ordering::Relaxed);
    }
}

impl<B> Admission<B> {
    /// `admit` while not counting: one more attempt sent. The clock's origin
    /// is fixed at the first call, so that the time these attempts span is
    /// known when an episode begins.
    #[inline]
    fn admit_idle(&self) {
        if self.origin.get().is_none() {
            let _ = self.epoch();
        }
        self.idle_sent.fetch_add(1, Ordering::Relaxed);
    }

    /// Spread the attempts sent while not counting evenly over the slots
    /// they were sent in (those still in the window), as sent and
    /// accepted; the slots before that keep what they counted.
    #[cold]
    fn seed(&self, epoch: u64) {
        let n = self.idle_sent.swap(0, Ordering::Relaxed);
        let since = self.idle_since.load(Ordering::Relaxed).min(epoch);
        let span = epoch - since + 1;
        let share = n / span;
        let first = since.max(epoch.saturating_sub(SLOTS as u64 - 1));
        for e in first..=epoch {
            // The current slot also takes the remainder of the division.
            let extra = if e == epoch { n % span } else { 0 };
            add_tagged(&self.slot(e).sent, e, share + extra);
        }
    }

    /// `admit` while counting: the rule, applied by error diffusion.
    #[cold]
    fn admit_counted(&self) -> bool {
        let epoch = self.epoch();
        let last = self.last_overload.load(Ordering::Relaxed);
        let (sent, overloaded, refused) = self.totals(epoch);
        if epoch.wrapping_sub(last) >= SLOTS as u64 {
            // A whole window without an overloaded refusal: healthy again.
            // The slots keep what they counted, for the next episode.
            if self.active.swap(false, Ordering::Relaxed) {
                self.idle_since.store(epoch, Ordering::Relaxed);
                self.idle_sent.store(1, Ordering::Relaxed);
                #[cfg(feature = "tracing")]
                tracing::info!(target: "retries", "the overload has passed: first attempts are no longer throttled");
            }
            return true;
        }
        let rate = rate(sent, overloaded, refused, self.k_milli);
        #[cfg(feature = "metrics")]
        metrics::gauge!("retry.admission.refusal_rate").set(rate as f64 / ONE as f64);
        let before = self.debt.fetch_add(rate, Ordering::Relaxed);
        let slot = self.slot(epoch);
        if (before.wrapping_add(rate) >> 32) != (before >> 32) {
            bump_tagged(&slot.refused, epoch);
            #[cfg(feature = "tracing")]
            tracing::debug!(
                target: "retries",
                rate = rate as f64 / ONE as f64,
                "call refused locally: the service is overloaded"
            );
            #[cfg(feature = "metrics")]
            metrics::counter!("retry.admission.refused").increment(1);
            return false;
        }
        bump_tagged(&slot.sent, epoch);
        true
    }
}

/// The slots under `loom` (CI: `--cfg loom`).
#[cfg(all(test, loom))]
mod loom_models;
