//! The attempt context ([`Attempt`]) and the call's [`IdempotencyKey`].
//!
//! # Lazy clock
//!
//! Reading the clock costs more than a whole successful call of a cheap body, so
//! the first attempt reads it only when something needs it: the body asks for
//! [`Attempt::deadline`] or [`Attempt::remaining`], the body returns `Pending`
//! (so a timer must be armed), or the attempt fails. The call's deadline is then
//! measured from that first reading. For a body whose synchronous stretch before
//! its first `.await` is short (microseconds), this is the call's entry within
//! the timer's resolution (1 ms); a body that computes for a long time before its
//! first suspension point effectively starts its deadline after that computation.
//! A body that completes on its first poll never reads the clock at all.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use std::time::Instant;

/// One key per logical call: 128 random bits, identical on every attempt of the
/// call, distinct across calls. Send it with the request so the server can
/// deduplicate, and use it in `reconcile` to look up whether the work was done.
///
/// Displayed as 32 lower-case hex digits, and parsed back from them:
///
/// ```
/// use retries::IdempotencyKey;
/// let k = IdempotencyKey::from_u128(0xfeed);
/// assert_eq!(k.to_string(), "0000000000000000000000000000feed");
/// assert_eq!("0000000000000000000000000000feed".parse::<IdempotencyKey>(), Ok(k));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
// Two halves (high first, so the order is the number's), not a `u128`: its
// 16-byte alignment would pad every future that holds a key.
pub struct IdempotencyKey {
    hi: u64,
    lo: u64,
}

impl IdempotencyKey {
    /// A fresh random key (from the thread-local generator of `rand`).
    #[must_use]
    pub fn random() -> Self {
        Self::from_u128(rand::random())
    }

    /// A key with the given value (for tests and for keys received from a peer).
    #[must_use]
    pub const fn from_u128(v: u128) -> Self {
        Self {
            hi: (v >> 64) as u64,
            lo: v as u64,
        }
    }

    /// The key's 128 bits.
    #[must_use]
    pub const fn as_u128(&self) -> u128 {
        ((self.hi as u128) << 64) | self.lo as u128
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}{:016x}", self.hi, self.lo)
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({self})")
    }
}

/// The text was not 32 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an idempotency key is exactly 32 hex digits")]
pub struct ParseKeyError;

impl FromStr for IdempotencyKey {
    type Err = ParseKeyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ParseKeyError);
        }
        u128::from_str_radix(s, 16)
            .map(Self::from_u128)
            .map_err(|_| ParseKeyError)
    }
}

/// When an attempt started and the limits it runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timing {
    /// When the attempt started (for the first attempt: the call's entry).
    pub(crate) start: Instant,
    /// The call's usable deadline (its deadline less the reserve).
    pub(crate) call_deadline: Instant,
    /// This attempt's own limit: `min(start + attempt_timeout, call_deadline)`.
    pub(crate) deadline: Instant,
}

/// How to compute an attempt's [`Timing`] once its start is known.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    /// Known for later attempts; for the first one it is `start + usable`.
    pub(crate) call_deadline: Option<Instant>,
    /// The deadline less the reserve, measured from the call's entry.
    pub(crate) usable: Duration,
    /// An outer bound (an enclosing scope), if any.
    pub(crate) cap: Option<Instant>,
    pub(crate) attempt_timeout: Option<Duration>,
}

/// `i + d`, saturating at a far future instead of panicking.
pub(crate) fn add(i: Instant, d: Duration) -> Instant {
    const FAR: Duration = Duration::from_hours(24 * 365 * 30);
    i.checked_add(d).or_else(|| i.checked_add(FAR)).unwrap_or(i)
}

/// What an attempt fixes on first use: its start (by the first reader of
/// its timing) and its idempotency key (minted by the first reader). One
/// `Mutex` for both rather than two `OnceLock`s: both are uncontended here;
/// the lock is cheaper on the path where a value is first set (measured with
/// callgrind: `Once`'s slow path cost ~180 instructions per call that
/// yields, the lock ~40), and, holding only `Copy` data, it has no drop glue
/// (each `OnceLock` cost an atomic load when the attempt was dropped).
#[derive(Debug)]
pub(crate) struct Lazy(std::sync::Mutex<Fixed>);

#[derive(Debug, Clone, Copy)]
struct Fixed {
    start: Option<Instant>,
    key: Option<IdempotencyKey>,
}

impl Lazy {
    const fn new(start: Option<Instant>, key: Option<IdempotencyKey>) -> Self {
        Self(std::sync::Mutex::new(Fixed { start, key }))
    }

    #[inline]
    fn lock(&self) -> std::sync::MutexGuard<'_, Fixed> {
        // Nothing panics while the lock is held: a poisoned lock is fine.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The start, set to `now()` if nobody set it yet (the first setter
    /// wins; a racing one reads the winner's).
    #[inline]
    fn start_or_set_with(&self, now: impl FnOnce() -> Instant) -> Instant {
        *self.lock().start.get_or_insert_with(now)
    }

    /// The key, minted if nobody asked for it yet.
    fn key_or_mint(&self) -> IdempotencyKey {
        *self.lock().key.get_or_insert_with(IdempotencyKey::random)
    }

    fn key(&self) -> Option<IdempotencyKey> {
        self.lock().key
    }
}

#[cfg(feature = "tokio")]
impl Timing {
    /// Which limit an attempt cut off at `deadline` reached: the call's
    /// deadline (the call is over) or its own time limit (outcome unknown).
    pub(crate) fn limit(&self) -> crate::engine::Limit {
        if self.deadline >= self.call_deadline {
            crate::engine::Limit::Call
        } else {
            crate::engine::Limit::Attempt
        }
    }
}

impl Plan {
    pub(crate) fn resolve(&self, start: Instant) -> Timing {
        let mut call_deadline = self
            .call_deadline
            .unwrap_or_else(|| add(start, self.usable));
        if let Some(cap) = self.cap {
            call_deadline = call_deadline.min(cap);
        }
        let deadline = match self.attempt_timeout {
            Some(t) => add(start, t).min(call_deadline),
            None => call_deadline,
        };
        Timing {
            start,
            call_deadline,
            deadline,
        }
    }
}

/// Who owns retries for the calls made in a scope.
#[derive(Debug)]
pub(crate) enum Owner {
    /// The retry loop this attempt belongs to. `running` is made only when a
    /// spawned task inherits the scope; it is cleared when the attempt's body
    /// ends, and goes away with the attempt if it is dropped first.
    Loop { running: OnceLock<Arc<AtomicBool>> },
    /// The loop of an attempt elsewhere (an inherited scope), while that
    /// attempt runs.
    While(Weak<AtomicBool>),
    /// Nobody: a deadline installed by a server, or an inherited scope whose
    /// attempt has no loop.
    Nobody,
}

/// What the body of a retried operation knows about its attempt.
///
/// Bound in a `#[retryable]` body with `attempt = name`, and passed by reference
/// to the closure of [`call`](crate::call()).
#[derive(Debug)]
pub struct Attempt {
    number: u32,
    /// When the attempt started, fixed at the first reading (the rest of
    /// its timing follows from the plan), and the call's key once minted.
    fixed: Lazy,
    plan: Plan,
    /// Who owns retries for calls made in this attempt.
    owner: Owner,
    /// A non-idempotent call made inside this attempt ended with an
    /// unresolved unknown outcome.
    unknown_below: AtomicBool,
}

impl Attempt {
    #[inline]
    pub(crate) fn new(number: u32, key: Option<IdempotencyKey>, plan: Plan) -> Self {
        Self {
            number,
            fixed: Lazy::new(None, key),
            plan,
            owner: Owner::Loop {
                running: OnceLock::new(),
            },
            unknown_below: AtomicBool::new(false),
        }
    }

    /// A stand-in attempt carrying a fixed deadline: the scope of
    /// [`inherit`](crate::scope::inherit) and
    /// [`with_deadline`](crate::scope::with_deadline).
    pub(crate) fn fixed(deadline: Instant, owner: Owner) -> Self {
        Self {
            number: 0,
            // With this plan, every instant of its timing is `deadline`.
            fixed: Lazy::new(Some(deadline), None),
            plan: Plan {
                call_deadline: Some(deadline),
                usable: Duration::ZERO,
                cap: None,
                attempt_timeout: None,
            },
            owner,
            unknown_below: AtomicBool::new(false),
        }
    }

    /// A copy to read from (number, key, deadlines), for a body that must own
    /// its attempt context (a hedged copy); the scope stays with the
    /// original.
    pub(crate) fn snapshot(&self) -> Self {
        let mut copy = Self::fixed(self.call_deadline(), Owner::Nobody);
        copy.number = self.number;
        copy.fixed = Lazy::new(Some(self.timing().start), Some(self.idempotency_key()));
        copy.plan = self.plan;
        copy
    }

    /// Does a loop own retries for calls made here (and is it still there)?
    pub(crate) fn owns_retries(&self) -> bool {
        match &self.owner {
            Owner::Loop { .. } => true,
            Owner::While(running) => running.upgrade().is_some_and(|r| r.load(Ordering::Acquire)),
            Owner::Nobody => false,
        }
    }

    /// The owner of a scope inherited from this one: the same loop, for as
    /// long as this attempt runs.
    pub(crate) fn inherited_owner(&self) -> Owner {
        match &self.owner {
            Owner::Loop { running } => Owner::While(Arc::downgrade(
                running.get_or_init(|| Arc::new(AtomicBool::new(true))),
            )),
            Owner::While(running) => Owner::While(Weak::clone(running)),
            Owner::Nobody => Owner::Nobody,
        }
    }

    /// The attempt's body has ended: scopes inherited from it no longer have
    /// an owner to defer to (nor once the attempt is dropped, which drops
    /// the flag they watch).
    #[inline]
    pub(crate) fn ended(&self) {
        if let Owner::Loop { running } = &self.owner
            && let Some(running) = running.get()
        {
            running.store(false, Ordering::Release);
        }
    }

    /// Record that a non-idempotent call inside this attempt ended with an
    /// unresolved unknown outcome.
    pub(crate) fn mark_unknown_effect(&self) {
        self.unknown_below.store(true, Ordering::Relaxed);
    }

    /// `true` when a non-idempotent call inside this attempt ended with an
    /// unresolved unknown outcome: the attempt may have had an effect that
    /// must not be repeated blindly.
    #[must_use]
    pub fn unknown_effect_below(&self) -> bool {
        self.unknown_below.load(Ordering::Relaxed)
    }

    /// This attempt's number, 1-based.
    #[must_use]
    pub fn number(&self) -> u32 {
        self.number
    }

    /// `true` for attempts after the first.
    #[must_use]
    pub fn is_retry(&self) -> bool {
        self.number > 1
    }

    /// The call's idempotency key: the same on every attempt of this call.
    pub fn idempotency_key(&self) -> IdempotencyKey {
        self.fixed.key_or_mint()
    }

    /// The key if one has been minted already.
    pub(crate) fn minted_key(&self) -> Option<IdempotencyKey> {
        self.fixed.key()
    }

    #[inline]
    pub(crate) fn timing(&self) -> Timing {
        self.plan
            .resolve(self.fixed.start_or_set_with(crate::time::now))
    }

    /// [`timing`](Self::timing), taking `now` as the start if it is not
    /// fixed yet (one clock read serves the caller and the attempt).
    #[inline]
    pub(crate) fn timing_at(&self, now: Instant) -> Timing {
        self.plan.resolve(self.fixed.start_or_set_with(|| now))
    }

    /// The instant by which this attempt must finish: the earlier of its own
    /// timeout and the call's deadline less the reserve. A
    /// `std::time::Instant` read from tokio's clock when the `tokio` feature
    /// is on (so it follows a paused test clock); for tokio's timers,
    /// `tokio::time::Instant::from_std(at.deadline())`.
    pub fn deadline(&self) -> Instant {
        self.timing().deadline
    }

    /// The call's deadline less the reserve: no attempt or pause runs past it.
    pub fn call_deadline(&self) -> Instant {
        self.timing().call_deadline
    }

    /// Time left for this attempt (zero once its deadline has passed).
    pub fn remaining(&self) -> Duration {
        self.deadline()
            .saturating_duration_since(crate::time::now())
    }
}
