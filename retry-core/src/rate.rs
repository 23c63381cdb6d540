//! [`RateLimit`]: a client-side rate limit every attempt draws from
//! (issue 63, item 2), re-exported from [`limit`](crate::limit).
//!
//! The bucket is kept as one number, the generic cell rate algorithm's
//! "theoretical arrival time" (ATM Forum TM 4.0; what a token bucket of
//! `burst` tokens refilled every `per / rate` computes, without a refill
//! step): an attempt at `now` may start at `max(now, tat − (burst − 1) ×
//! interval)`, and moves `tat` to `max(tat, now) + interval`. One
//! compare-exchange, no lock, no timer; a reservation says *when* the
//! attempt may start, so a caller waits exactly that long, and only when it
//! fits its deadline (a wait that does not fit reserves nothing).

use std::sync::OnceLock;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::sync::AtomicU64;

mod pace;

pub use pace::Pace;
pub(crate) use pace::Starts;

/// A rate limit shared by the calls that name it: at most `rate` attempts
/// per `per`, in bursts of at most `burst`. Every attempt draws from it,
/// first attempts, retries and hedged copies alike; an attempt that would
/// have to wait past its call's deadline (less the policy's `min_attempt`)
/// is not sent, and the call stops at once with
/// [`Reason::RateLimited`](crate::Reason::RateLimited) (nothing sent, its
/// `Stopped` classified not executed). `const`-constructible, for a
/// `static`; lock-free.
///
/// Unlike a [`Concurrency`](crate::limit::Concurrency) limit, which bounds
/// the calls in flight, this bounds how often attempts *start*: a
/// provider's quota ("100 requests a second") is kept by the client before
/// the server has to refuse.
///
/// ```
/// use std::time::Duration;
/// use retries::{Attempt, Policy};
/// use retries::limit::RateLimit;
///
/// // 10 a second, no burst: attempts are 100 ms apart.
/// static SEARCH: RateLimit = RateLimit::new(10, Duration::from_secs(1), 1);
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let policy = Policy::new(Duration::from_secs(1));
/// let t0 = tokio::time::Instant::now();
/// for _ in 0..3 {
///     let r: Result<(), std::io::Error> =
///         retries::call(&policy).idempotent().rate_limit(&SEARCH).run(async |_: &Attempt| Ok(())).await;
///     r.unwrap();
/// }
/// assert_eq!(t0.elapsed(), Duration::from_millis(200));
/// # }
/// ```
#[derive(Debug)]
pub struct RateLimit {
    /// Nanoseconds between two attempts at the steady rate.
    interval: u64,
    /// How far `tat` may run ahead of now without a wait: `(burst − 1) ×
    /// interval`.
    tolerance: u64,
    /// The theoretical arrival time, in nanoseconds from `origin`.
    tat: AtomicU64,
    origin: OnceLock<Instant>,
}

/// A bad setting for [`RateLimit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RateLimitError {
    /// A rate of zero, a `per` of zero, or an interval under a nanosecond.
    #[error(
        "a rate limit needs a rate of at least 1 per `per`, `per` longer than zero, and at most one attempt a nanosecond"
    )]
    Rate,
    /// A burst of zero (no attempt could ever start) or over a million.
    #[error("a rate limit's burst must be between 1 and 1,000,000")]
    Burst,
}

impl RateLimitError {
    const fn message(self) -> &'static str {
        match self {
            Self::Rate => {
                "a rate limit needs a rate of at least 1 per `per`, `per` longer than zero, and at most one attempt a nanosecond"
            }
            Self::Burst => "a rate limit's burst must be between 1 and 1,000,000",
        }
    }
}

impl RateLimit {
    /// At most `rate` attempts per `per`, in bursts of at most `burst`
    /// (`1`: evenly spaced). Panics (a compile error in a `const` or
    /// `static`) on a bad setting; use [`try_new`](Self::try_new) at run
    /// time.
    ///
    /// # Panics
    ///
    /// As [`try_new`](Self::try_new) fails.
    #[must_use]
    #[track_caller]
    pub const fn new(rate: u32, per: Duration, burst: u32) -> Self {
        // Checked apart from the value: a `const fn` cannot drop a
        // `Result` holding one (its `OnceLock` has a destructor).
        match Self::spacing(rate, per, burst) {
            Ok((interval, tolerance)) => Self::build(interval, tolerance),
            Err(e) => panic!("{}", e.message()),
        }
    }

    /// [`new`](Self::new), or why the settings are invalid.
    ///
    /// # Errors
    ///
    /// [`RateLimitError`] for a zero rate or `per`, more than one attempt a
    /// nanosecond, or a burst outside `1..=1_000_000`.
    pub const fn try_new(rate: u32, per: Duration, burst: u32) -> Result<Self, RateLimitError> {
        match Self::spacing(rate, per, burst) {
            Ok((interval, tolerance)) => Ok(Self::build(interval, tolerance)),
            Err(e) => Err(e),
        }
    }

    const fn build(interval: u64, tolerance: u64) -> Self {
        Self {
            interval,
            tolerance,
            tat: AtomicU64::new(0),
            origin: OnceLock::new(),
        }
    }

    /// The interval and the tolerance of the settings, or why they are bad.
    const fn spacing(rate: u32, per: Duration, burst: u32) -> Result<(u64, u64), RateLimitError> {
        if burst == 0 || burst > 1_000_000 {
            return Err(RateLimitError::Burst);
        }
        let per = per.as_nanos();
        if rate == 0 || per < rate as u128 {
            return Err(RateLimitError::Rate);
        }
        let interval = per / rate as u128;
        // At most 2^63 ns (292 years) between attempts, and the tolerance
        // within `u64` (a million bursts of at most 2^43 ns, 2.4 hours).
        let interval = if interval > (1 << 63) {
            1 << 63
        } else {
            interval as u64
        };
        let tolerance = interval.saturating_mul(burst as u64 - 1);
        Ok((interval, tolerance))
    }

    /// The time between two attempts at the steady rate.
    #[must_use]
    pub const fn interval(&self) -> Duration {
        Duration::from_nanos(self.interval)
    }

    fn nanos(&self, at: Instant) -> u64 {
        // The first instant asked about is the origin; `tat` starts there:
        // the bucket starts full.
        let origin = *self.origin.get_or_init(|| at);
        u64::try_from(at.saturating_duration_since(origin).as_nanos()).unwrap_or(u64::MAX)
    }

    fn instant(&self, nanos: u64) -> Instant {
        // `reserve` read the origin first (`nanos`), so it is set.
        let origin = self.origin.get().copied().unwrap_or_else(crate::time::now);
        crate::attempt::add(origin, Duration::from_nanos(nanos))
    }

    /// Reserve the start of one attempt at `now` or later, but no later
    /// than `latest`: the instant it may start, or `None` (nothing
    /// reserved) when that would be after `latest`.
    pub(crate) fn reserve(&self, now: Instant, latest: Instant) -> Option<Instant> {
        let now_ns = self.nanos(now);
        let latest_ns = self.nanos(latest);
        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            let start = now_ns.max(tat.saturating_sub(self.tolerance));
            if start > latest_ns {
                return None;
            }
            let next = tat.max(now_ns).saturating_add(self.interval);
            match self
                .tat
                .compare_exchange_weak(tat, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    return Some(if start == now_ns {
                        now
                    } else {
                        self.instant(start)
                    });
                }
                Err(actual) => tat = actual,
            }
        }
    }
}

/// One [`RateLimit`] per key the caller derives from a request (a tenant,
/// an API key, a server's authority), all of the same rate, made at a
/// key's first use: the quota a provider gives each of its clients, kept
/// by each apart.
///
/// At most `max_keys` keys are kept; a new key past that evicts the key
/// used least recently (its next call finds a full bucket again: chosen so
/// that a stream of hostile keys cannot grow the map, at the price of a
/// burst for a key gone quiet long enough to be evicted).
///
/// ```
/// use std::time::Duration;
/// use retries::{Attempt, Policy};
/// use retries::limit::RateLimits;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // Each tenant: 2 a second, no burst.
/// let per_tenant = RateLimits::new(2, Duration::from_secs(1), 1, 10_000);
/// let policy = Policy::new(Duration::from_secs(5));
/// let t0 = tokio::time::Instant::now();
/// for tenant in ["a", "b", "a"] {
///     let limit = per_tenant.get(tenant);
///     let r: Result<(), std::io::Error> =
///         retries::call(&policy).idempotent().rate_limit(&limit).run(async |_: &Attempt| Ok(())).await;
///     r.unwrap();
/// }
/// // "a" twice: its second start waits 500 ms; "b" did not wait.
/// assert_eq!(t0.elapsed(), Duration::from_millis(500));
/// # }
/// ```
#[derive(Debug)]
pub struct RateLimits {
    interval: u64,
    tolerance: u64,
    keys: Keyed<RateLimit>,
}

impl RateLimits {
    /// `rate` per `per` in bursts of `burst` for each key, at most
    /// `max_keys` keys kept (at least 1).
    ///
    /// # Panics
    ///
    /// On the settings [`RateLimit::try_new`] refuses; use
    /// [`try_new`](Self::try_new) at run time.
    #[must_use]
    #[track_caller]
    pub fn new(rate: u32, per: Duration, burst: u32, max_keys: usize) -> Self {
        match Self::try_new(rate, per, burst, max_keys) {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        }
    }

    /// [`new`](Self::new), or why the settings are invalid.
    ///
    /// # Errors
    ///
    /// As [`RateLimit::try_new`].
    pub fn try_new(
        rate: u32,
        per: Duration,
        burst: u32,
        max_keys: usize,
    ) -> Result<Self, RateLimitError> {
        let (interval, tolerance) = RateLimit::spacing(rate, per, burst)?;
        Ok(Self {
            interval,
            tolerance,
            keys: Keyed::new(max_keys),
        })
    }

    /// The limit of `key`, made full at its first use.
    #[must_use]
    pub fn get(&self, key: &str) -> std::sync::Arc<RateLimit> {
        self.keys
            .get_or(key, || RateLimit::build(self.interval, self.tolerance))
    }

    /// The keys kept now.
    #[must_use]
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// No key kept.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One [`Pace`] per key (a server's authority): what a door keeps of the
/// quotas servers announced, at most `max_keys` of them, the least
/// recently used evicted past that (its next request paced by nothing
/// until the server announces again).
#[derive(Debug)]
pub struct Paces {
    keys: Keyed<Pace>,
    /// A pace was ever made: until then [`find`](Self::find) takes no lock.
    any: std::sync::atomic::AtomicBool,
}

impl Paces {
    /// At most `max_keys` paces kept (at least 1).
    #[must_use]
    pub fn new(max_keys: usize) -> Self {
        Self {
            keys: Keyed::new(max_keys),
            any: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The pace of `key`, made (with nothing announced) at its first use.
    #[must_use]
    pub fn get(&self, key: &str) -> std::sync::Arc<Pace> {
        self.any.store(true, std::sync::atomic::Ordering::Relaxed);
        self.keys.get_or(key, Pace::new)
    }

    /// The pace of `key` if one was made ([`get`](Self::get)); while none
    /// was made for any key, no lock is taken: a door whose servers never
    /// announce a quota pays one atomic load a request.
    #[must_use]
    pub fn find(&self, key: &str) -> Option<std::sync::Arc<Pace>> {
        if !self.any.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        self.keys.find(key)
    }

    /// Was a pace ever made ([`get`](Self::get))? One atomic load: a door
    /// asks it before it works out a request's key, which most requests
    /// (to servers that never announced a quota) then do not need.
    #[must_use]
    pub fn any(&self) -> bool {
        self.any.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The keys kept now.
    #[must_use]
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// No key kept.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Values by key, made at a key's first use, at most `max_keys` kept: a new
/// key past that evicts the key used least recently (so that a stream of
/// hostile keys cannot grow the map).
#[derive(Debug)]
struct Keyed<T> {
    max_keys: usize,
    keys: std::sync::Mutex<Keys<T>>,
}

#[derive(Debug)]
struct Keys<T> {
    map: std::collections::HashMap<String, (std::sync::Arc<T>, u64)>,
    /// A counter of uses, for "least recently used".
    clock: u64,
}

impl<T> Keyed<T> {
    fn new(max_keys: usize) -> Self {
        Self {
            max_keys: max_keys.max(1),
            keys: std::sync::Mutex::new(Keys {
                map: std::collections::HashMap::new(),
                clock: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Keys<T>> {
        self.keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn get_or(&self, key: &str, make: impl FnOnce() -> T) -> std::sync::Arc<T> {
        let mut keys = self.lock();
        keys.clock += 1;
        let now = keys.clock;
        if let Some((value, used)) = keys.map.get_mut(key) {
            *used = now;
            return std::sync::Arc::clone(value);
        }
        if keys.map.len() >= self.max_keys
            && let Some(oldest) = keys
                .map
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
        {
            keys.map.remove(&oldest);
        }
        let value = std::sync::Arc::new(make());
        keys.map
            .insert(key.to_owned(), (std::sync::Arc::clone(&value), now));
        value
    }

    fn find(&self, key: &str) -> Option<std::sync::Arc<T>> {
        let mut keys = self.lock();
        keys.clock += 1;
        let now = keys.clock;
        let (value, used) = keys.map.get_mut(key)?;
        *used = now;
        Some(std::sync::Arc::clone(value))
    }

    fn len(&self) -> usize {
        self.lock().map.len()
    }
}

#[cfg(all(test, not(loom), feature = "tokio"))]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_then_the_steady_rate() {
        let r = RateLimit::new(10, Duration::from_secs(1), 3);
        let t0 = crate::time::now();
        let far = t0 + Duration::from_mins(1);
        // Three at once (the burst), then one every 100 ms.
        let starts: Vec<_> = (0..6).map(|_| r.reserve(t0, far).unwrap() - t0).collect();
        assert_eq!(starts, [ms(0), ms(0), ms(0), ms(100), ms(200), ms(300)]);
        // After a quiet second the bucket is full again.
        tokio::time::advance(Duration::from_secs(2)).await;
        let t1 = crate::time::now();
        let again: Vec<_> = (0..4).map(|_| r.reserve(t1, far).unwrap() - t1).collect();
        assert_eq!(again, [ms(0), ms(0), ms(0), ms(100)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_start_after_latest_reserves_nothing() {
        let r = RateLimit::new(1, Duration::from_secs(1), 1);
        let t0 = crate::time::now();
        assert_eq!(r.reserve(t0, t0), Some(t0));
        // The next start is a second away: not before 500 ms, and nothing
        // is taken by asking, so asking again with room gets that second.
        assert_eq!(r.reserve(t0, t0 + ms(500)), None);
        assert_eq!(r.reserve(t0, t0 + ms(500)), None);
        assert_eq!(r.reserve(t0, t0 + ms(1000)), Some(t0 + ms(1000)));
    }

    #[tokio::test(start_paused = true)]
    async fn each_key_its_own_bucket_and_the_least_recent_evicted() {
        let limits = RateLimits::new(1, Duration::from_secs(1), 1, 2);
        let t0 = crate::time::now();
        let far = t0 + Duration::from_mins(1);
        assert_eq!(limits.get("a").reserve(t0, far), Some(t0));
        assert_eq!(limits.get("b").reserve(t0, far), Some(t0));
        // "a" again: its own next start, a second on.
        assert_eq!(limits.get("a").reserve(t0, far), Some(t0 + ms(1000)));
        // A third key evicts "b" (used least recently), not "a".
        assert_eq!(limits.get("c").reserve(t0, far), Some(t0));
        assert_eq!(limits.len(), 2);
        assert_eq!(limits.get("a").reserve(t0, far), Some(t0 + ms(2000)));
        // "b" comes back full.
        assert_eq!(limits.get("b").reserve(t0, far), Some(t0));
        assert!(RateLimits::try_new(0, Duration::from_secs(1), 1, 5).is_err());
    }

    #[test]
    fn paces_are_found_only_once_made() {
        let paces = Paces::new(2);
        assert!(paces.find("a").is_none());
        let a = paces.get("a");
        assert!(std::sync::Arc::ptr_eq(&paces.find("a").unwrap(), &a));
        assert!(paces.find("b").is_none());
        assert_eq!(paces.len(), 1);
    }

    #[test]
    fn bad_settings_are_typed_errors() {
        assert_eq!(
            RateLimit::try_new(0, Duration::from_secs(1), 1).unwrap_err(),
            RateLimitError::Rate
        );
        assert_eq!(
            RateLimit::try_new(5, Duration::ZERO, 1).unwrap_err(),
            RateLimitError::Rate
        );
        assert_eq!(
            RateLimit::try_new(10, Duration::from_nanos(5), 1).unwrap_err(),
            RateLimitError::Rate
        );
        assert_eq!(
            RateLimit::try_new(1, Duration::from_secs(1), 0).unwrap_err(),
            RateLimitError::Burst
        );
        assert_eq!(
            RateLimit::new(3, Duration::from_secs(1), 1).interval(),
            Duration::from_nanos(333_333_333)
        );
    }
}

/// The rate limit under `loom` (CI: `--cfg loom`).
#[cfg(all(test, loom))]
mod loom_models;
