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

#[cfg(loom)]
use loom::sync::atomic::{AtomicU8, AtomicU64};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU8, AtomicU64};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

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
///
/// Two cases, in 32 bytes rather than 64: the call's deadline is known
/// (`usable` is [`NONE`], `bound` is the deadline; a known deadline was
/// resolved under the outer bound already), or it is measured from the
/// start (`start + usable`, under `bound` if there is one). The two
/// durations are whole nanoseconds, [`NONE`] for none (a duration of
/// `u64::MAX - 1` ns or more, some 584 years, is kept as that).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    /// The call's deadline when `usable` is [`NONE`]; else an outer bound
    /// (an enclosing scope's, a door's), if any.
    pub(crate) bound: Option<Instant>,
    /// The deadline less the reserve, measured from the call's entry:
    /// [`NONE`] once the call's deadline is known.
    usable: u64,
    /// The attempt's own time limit, or [`NONE`].
    attempt_timeout: u64,
}

/// No duration, in [`Plan`].
pub(crate) const NONE: u64 = u64::MAX;

/// `d` in nanoseconds for [`Plan`] (saturating below [`NONE`]). A
/// [`Policy`](crate::Policy) keeps its durations so too, converted when it
/// is made: an attempt's plan copies them (the conversion was ~14
/// instructions on every call's path).
#[inline]
pub(crate) const fn nanos(d: Duration) -> u64 {
    let n = d.as_nanos();
    if n >= NONE as u128 {
        NONE - 1
    } else {
        n as u64
    }
}

/// `d`, if any, in nanoseconds ([`NONE`] for none).
pub(crate) const fn nanos_or_none(d: Option<Duration>) -> u64 {
    match d {
        Some(d) => nanos(d),
        None => NONE,
    }
}

impl Plan {
    /// An attempt of a call whose deadline is `call_deadline`, if known
    /// (else `usable` ns after the attempt's start, under `cap`), with its
    /// own limit `attempt_timeout` ns ([`NONE`]: none).
    #[inline]
    pub(crate) fn new(
        call_deadline: Option<Instant>,
        usable: u64,
        cap: Option<Instant>,
        attempt_timeout: u64,
    ) -> Self {
        match call_deadline {
            Some(d) => Self {
                bound: Some(d),
                usable: NONE,
                attempt_timeout,
            },
            None => Self {
                bound: cap,
                usable,
                attempt_timeout,
            },
        }
    }

    /// The call's deadline, if known (measured from the call's entry, or
    /// set with [`set_deadline`](Self::set_deadline)).
    #[inline]
    pub(crate) fn known_deadline(&self) -> Option<Instant> {
        if self.usable == NONE {
            self.bound
        } else {
            None
        }
    }

    /// The call's deadline is known from now on: `deadline`.
    #[inline]
    pub(crate) fn set_deadline(&mut self, deadline: Instant) {
        self.bound = Some(deadline);
        self.usable = NONE;
    }

    /// This plan without an attempt's own time limit.
    #[cfg(feature = "tokio")]
    #[inline]
    pub(crate) fn without_timeout(self) -> Self {
        Self {
            attempt_timeout: NONE,
            ..self
        }
    }

    /// What [`resolve`](Self::resolve) gives as the time from the start to
    /// the attempt's deadline, when it needs no instant to say so: no bound
    /// and the call's deadline measured from this start (a first attempt
    /// with no outer deadline). `None` otherwise.
    #[inline]
    pub(crate) fn left_at_start(&self) -> Option<Duration> {
        if self.bound.is_some() || self.usable == NONE {
            return None;
        }
        Some(Duration::from_nanos(self.usable.min(self.attempt_timeout)))
    }

    /// The timing of an attempt that started at `start`.
    #[inline]
    pub(crate) fn resolve(&self, start: Instant) -> Timing {
        let call_deadline = if self.usable == NONE {
            self.bound.unwrap_or(start)
        } else {
            let d = add(start, Duration::from_nanos(self.usable));
            self.bound.map_or(d, |b| d.min(b))
        };
        let deadline = if self.attempt_timeout == NONE {
            call_deadline
        } else {
            add(start, Duration::from_nanos(self.attempt_timeout)).min(call_deadline)
        };
        Timing {
            start,
            call_deadline,
            deadline,
        }
    }
}

/// `i + d`, saturating at a far future instead of panicking.
#[inline]
pub(crate) fn add(i: Instant, d: Duration) -> Instant {
    // A zero pause, or no `min_attempt`: nothing to add (the checked
    // addition costs ~30 instructions, measured with callgrind).
    if d.is_zero() {
        return i;
    }
    add_checked(i, d)
}

#[inline]
fn add_checked(i: Instant, d: Duration) -> Instant {
    const FAR: Duration = Duration::from_hours(24 * 365 * 30);
    i.checked_add(d).or_else(|| i.checked_add(FAR)).unwrap_or(i)
}

/// Which time limit cut an attempt off. Not public API: it is public only
/// because the engine's attempt outcome, which the code `#[retryable]`
/// generates passes along, carries it.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Its own `attempt_timeout`: the outcome is unknown.
    Attempt,
    /// The call's deadline: the call is over.
    Call,
}

#[cfg(feature = "tokio")]
impl Timing {
    /// Which limit an attempt cut off at `deadline` reached: the call's
    /// deadline (the call is over) or its own time limit (outcome unknown).
    pub(crate) fn limit(&self) -> Limit {
        if self.deadline >= self.call_deadline {
            Limit::Call
        } else {
            Limit::Attempt
        }
    }
}

/// The flag "this attempt's body still runs" that scopes inherited from it
/// watch, made only when one is inherited. A `OnceLock<Arc<_>>` (issue 58:
/// the `AtomicPtr` of `Arc::into_raw` it replaces saved 8 bytes).
pub(crate) struct Running(OnceLock<Arc<AtomicBool>>);

impl Running {
    const fn new() -> Self {
        Self(OnceLock::new())
    }

    /// The flag, if a scope was inherited.
    #[inline]
    fn get(&self) -> Option<&AtomicBool> {
        self.0.get().map(|r| &**r)
    }

    /// No flag (the one made, if any, goes: its watchers see no owner).
    #[inline]
    fn reset(&mut self) {
        drop(self.0.take());
    }

    /// A watch on the flag (made now, set, if none was yet).
    #[cold]
    fn watch(&self) -> Weak<AtomicBool> {
        Arc::downgrade(self.0.get_or_init(|| Arc::new(AtomicBool::new(true))))
    }
}

impl fmt::Debug for Running {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Running")
            .field(&self.get().map(|r| r.load(Ordering::Relaxed)))
            .finish()
    }
}

/// Who owns retries for the calls made in a scope.
#[derive(Debug)]
pub(crate) enum Owner {
    /// The retry loop this attempt belongs to. `running` is made only when a
    /// spawned task inherits the scope; it is cleared when the attempt's body
    /// ends, and goes away with the attempt if it is dropped first.
    Loop { running: Running },
    /// The loop of an attempt elsewhere (an inherited scope), while that
    /// attempt runs.
    While(Weak<AtomicBool>),
    /// Nobody: a deadline installed by a server, or an inherited scope whose
    /// attempt has no loop.
    Nobody,
    /// The caller in another process, which said it owns retries (a server
    /// layer's scope, opted in): calls made here defer to it.
    Caller,
}

/// The number of an [unbounded](Attempt::unbounded) scope.
const UNBOUNDED: u32 = u32::MAX;
/// The number of the mark that stands for "no scope" ([`Attempt::none`]).
const NO_SCOPE: u32 = u32::MAX - 1;

/// What the body of a retried operation knows about its attempt.
///
/// Bound in a `#[retryable]` body with `attempt = name`, and passed by reference
/// to the closure of [`call`](crate::call()).
pub struct Attempt {
    number: u32,
    /// [`UNKNOWN_BELOW`], [`GAVE_UP_BELOW`], `TIMER_ARMED`, and the states
    /// of the key ([`KEY_WRITING`], [`KEY_SET`]): one byte beside `number`.
    flags: AtomicU8,
    /// The call's key, in halves, valid once `KEY_SET` is in `flags`.
    key_hi: AtomicU64,
    key_lo: AtomicU64,
    /// When the attempt started, fixed at the first reading; the rest of its
    /// timing follows from the plan. A `OnceLock` (issue 58: no `unsafe`
    /// where it saves less than 2 % of a call over loopback; the hand-made
    /// write-once cell it replaces saved 8 bytes and a few instructions,
    /// see `tests/bench/README.md`).
    start: OnceLock<Instant>,
    plan: Plan,
    /// Who owns retries for calls made in this attempt.
    owner: Owner,
}

/// A non-idempotent call made inside this attempt ended with an unresolved
/// unknown outcome.
const UNKNOWN_BELOW: u8 = 1;
/// A call made inside this attempt gave up after retrying (or was told by
/// its server not to retry): read by a server layer's scope.
const GAVE_UP_BELOW: u8 = 2;
/// One thread is writing the key (it won this bit).
const KEY_WRITING: u8 = 4;
/// The key is written (stored with `Release` after its halves).
const KEY_SET: u8 = 8;
/// The call's timer is armed at this attempt's limit (its body suspended).
#[cfg(feature = "tokio")]
const TIMER_ARMED: u8 = 16;
/// The call's timer is armed at the end of the pause before the next
/// attempt, which the next attempt's future waits out before its body
/// runs (`Timer::pause_next`).
#[cfg(feature = "tokio")]
const PAUSING: u8 = 32;

// The flags and the key's halves are shown as what they mean.
#[allow(clippy::missing_fields_in_debug)]
impl fmt::Debug for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attempt")
            .field("number", &self.number)
            .field("key", &self.minted_key())
            .field("start", &self.start())
            .field("plan", &self.plan)
            .field("owner", &self.owner)
            .field("unknown_below", &self.unknown_effect_below())
            .field("gave_up_below", &self.gave_up_below())
            .finish()
    }
}

impl Attempt {
    #[inline]
    pub(crate) fn new(number: u32, key: Option<IdempotencyKey>, plan: Plan) -> Self {
        let (flags, hi, lo) = match key {
            Some(k) => (KEY_WRITING | KEY_SET, k.hi, k.lo),
            None => (0, 0, 0),
        };
        Self {
            number,
            flags: AtomicU8::new(flags),
            key_hi: AtomicU64::new(hi),
            key_lo: AtomicU64::new(lo),
            start: OnceLock::new(),
            plan,
            owner: Owner::Loop {
                running: Running::new(),
            },
        }
    }

    /// The context the next attempt of a call runs with, made in place
    /// (the engine keeps one for the whole call, so that a call stores one
    /// context and builds none per attempt): its number is the next, its
    /// start is read anew, the marks of calls beneath are cleared, its own
    /// time limit is `attempt_timeout` ns ([`NONE`]: none), and scopes
    /// inherited from the attempt before no longer see an owner. The key
    /// and the call's deadline, if known, stay.
    #[inline]
    pub(crate) fn renew(&mut self, attempt_timeout: u64) {
        self.number += 1;
        // The start goes with the other marks: the next reader sets it.
        // `&mut self`: no other thread sees the flags; a relaxed load and
        // store are plain moves (and `loom`'s atomics have no `get_mut`).
        let flags = self.flags.load(Ordering::Relaxed);
        self.flags
            .store(flags & (KEY_WRITING | KEY_SET), Ordering::Relaxed);
        self.start.take();
        self.plan.attempt_timeout = attempt_timeout;
        if let Owner::Loop { running } = &mut self.owner {
            running.reset();
        }
    }

    /// The number of attempts made, for the hedge driver (which counts its
    /// copies here).
    #[cfg(feature = "tokio")]
    #[inline]
    pub(crate) fn number_mut(&mut self) -> &mut u32 {
        &mut self.number
    }

    /// The call's key is `key` (given, or minted by the engine).
    #[inline]
    pub(crate) fn set_key(&mut self, key: IdempotencyKey) {
        self.key_hi.store(key.hi, Ordering::Relaxed);
        self.key_lo.store(key.lo, Ordering::Relaxed);
        let flags = self.flags.load(Ordering::Relaxed);
        self.flags
            .store(flags | KEY_WRITING | KEY_SET, Ordering::Relaxed);
    }

    /// The plan of the attempt's timing (the call's deadline, once known).
    #[inline]
    pub(crate) fn plan(&self) -> Plan {
        self.plan
    }

    /// See [`plan`](Self::plan).
    #[inline]
    pub(crate) fn plan_mut(&mut self) -> &mut Plan {
        &mut self.plan
    }

    /// A stand-in attempt carrying a fixed deadline: the scope of
    /// [`inherit`](crate::scope::inherit) and
    /// [`with_deadline`](crate::scope::with_deadline).
    pub(crate) fn fixed(deadline: Instant, owner: Owner) -> Self {
        // With this plan, every instant of its timing is `deadline`.
        Self {
            owner,
            ..Self::new(0, None, Plan::new(Some(deadline), 0, None, NONE))
        }
        .started_at(deadline)
    }

    /// This attempt, started at `start` (fixed: no reader sets it).
    fn started_at(mut self, start: Instant) -> Self {
        self.start = OnceLock::from(start);
        self
    }

    /// A scope with no deadline of its own (a server layer's, for a request
    /// without one): it collects what calls beneath it report, and
    /// [`scope::deadline`](crate::scope::deadline) does not show its far-off
    /// bound.
    pub(crate) fn unbounded(now: Instant, owner: Owner) -> Self {
        let far = add(now, Duration::from_hours(100 * 365 * 24));
        let mut scope = Self::fixed(far, owner);
        scope.number = UNBOUNDED;
        scope
    }

    /// The mark of "no scope": entered as the current scope, it hides any
    /// scope around it ([`scope::detach`](crate::scope::detach)); the scope's
    /// readers see none.
    pub(crate) fn none(now: Instant) -> Self {
        let mut mark = Self::fixed(now, Owner::Nobody);
        mark.number = NO_SCOPE;
        mark
    }

    /// See [`none`](Self::none).
    #[inline]
    pub(crate) fn is_none(&self) -> bool {
        self.number == NO_SCOPE
    }

    /// See [`unbounded`](Self::unbounded).
    pub(crate) fn is_unbounded(&self) -> bool {
        self.number == UNBOUNDED
    }

    /// A copy to read from (number, key, deadlines), for a body that must own
    /// its attempt context (a hedged copy); the scope stays with the
    /// original.
    pub(crate) fn snapshot(&self) -> Self {
        Self {
            owner: Owner::Nobody,
            ..Self::new(self.number, Some(self.idempotency_key()), self.plan)
        }
        .started_at(self.timing().start)
    }

    /// Does a loop own retries for calls made here (and is it still there)?
    // A loop here and a caller elsewhere both own them: two arms, one answer.
    #[allow(clippy::match_same_arms)]
    pub(crate) fn owns_retries(&self) -> bool {
        match &self.owner {
            Owner::Loop { .. } => true,
            Owner::While(running) => running.upgrade().is_some_and(|r| r.load(Ordering::Acquire)),
            Owner::Nobody => false,
            Owner::Caller => true,
        }
    }

    /// The owner of a scope inherited from this one: the same loop, for as
    /// long as this attempt runs.
    pub(crate) fn inherited_owner(&self) -> Owner {
        match &self.owner {
            Owner::Loop { running } => Owner::While(running.watch()),
            Owner::While(running) => Owner::While(Weak::clone(running)),
            Owner::Nobody => Owner::Nobody,
            Owner::Caller => Owner::Caller,
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

    /// Is the call's timer armed at this attempt's limit yet?
    #[cfg(feature = "tokio")]
    #[inline]
    pub(crate) fn timer_armed(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & TIMER_ARMED != 0
    }

    /// The call's timer is armed at this attempt's limit.
    #[cfg(feature = "tokio")]
    #[inline]
    pub(crate) fn set_timer_armed(&self) {
        self.flags.fetch_or(TIMER_ARMED, Ordering::Relaxed);
    }

    /// Is the call pausing before its next attempt (the attempt's future then
    /// waits out the pause and runs no body)?
    #[cfg(feature = "tokio")]
    #[inline]
    pub(crate) fn pausing(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & PAUSING != 0
    }

    /// The call pauses before its next attempt (`pausing` set), or the pause
    /// is over (cleared).
    #[cfg(feature = "tokio")]
    #[inline]
    pub(crate) fn set_pausing(&self, on: bool) {
        if on {
            self.flags.fetch_or(PAUSING, Ordering::Relaxed);
        } else {
            self.flags.fetch_and(!PAUSING, Ordering::Relaxed);
        }
    }

    /// Record that a call inside this attempt gave up after retrying.
    pub(crate) fn mark_gave_up(&self) {
        self.flags.fetch_or(GAVE_UP_BELOW, Ordering::Relaxed);
    }

    /// `true` when a call inside this attempt gave up after retrying, or was
    /// told by its server not to retry.
    pub(crate) fn gave_up_below(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & GAVE_UP_BELOW != 0
    }

    /// Record that a non-idempotent call inside this attempt ended with an
    /// unresolved unknown outcome.
    pub(crate) fn mark_unknown_effect(&self) {
        self.flags.fetch_or(UNKNOWN_BELOW, Ordering::Relaxed);
    }

    /// `true` when a non-idempotent call inside this attempt ended with an
    /// unresolved unknown outcome: the attempt may have had an effect that
    /// must not be repeated blindly.
    #[must_use]
    pub fn unknown_effect_below(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & UNKNOWN_BELOW != 0
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
        match self.minted_key() {
            Some(key) => key,
            None => self.mint_key(),
        }
    }

    /// Mint the key: the first thread to claim [`KEY_WRITING`] writes it;
    /// a racing one waits for it (a few instructions, unless the writer
    /// was preempted between its claim and its store).
    #[cold]
    fn mint_key(&self) -> IdempotencyKey {
        let fresh = IdempotencyKey::random();
        self.write_once(
            (KEY_WRITING, KEY_SET),
            fresh,
            |k| {
                self.key_hi.store(k.hi, Ordering::Relaxed);
                self.key_lo.store(k.lo, Ordering::Relaxed);
            },
            || self.minted_key(),
        )
    }

    /// The attempt's write-once key, set by
    /// whichever thread first needs it: the one that claims the `writing`
    /// bit of the flags writes `fresh` (`write`) and then sets the `set`
    /// bit (`Release`, so that a reader that sees it with `Acquire` sees
    /// the value); a thread that loses the claim waits for the winner's
    /// value (`read`: `Some` once `set` is there).
    fn write_once<T>(
        &self,
        (writing, set): (u8, u8),
        fresh: T,
        write: impl FnOnce(&T),
        read: impl Fn() -> Option<T>,
    ) -> T {
        if self.flags.fetch_or(writing, Ordering::Acquire) & writing == 0 {
            write(&fresh);
            self.flags.fetch_or(set, Ordering::Release);
            return fresh;
        }
        // The winner is between its claim and its store: a few
        // instructions, unless it was preempted right there.
        loop {
            if let Some(won) = read() {
                return won;
            }
            #[cfg(not(loom))]
            std::thread::yield_now();
            #[cfg(loom)]
            loom::thread::yield_now();
        }
    }

    /// The key if one has been minted already.
    pub(crate) fn minted_key(&self) -> Option<IdempotencyKey> {
        // `Acquire`, paired with the writer's `Release` of `KEY_SET`: the
        // halves stored before it are seen.
        (self.flags.load(Ordering::Acquire) & KEY_SET != 0).then(|| IdempotencyKey {
            hi: self.key_hi.load(Ordering::Relaxed),
            lo: self.key_lo.load(Ordering::Relaxed),
        })
    }

    #[inline]
    pub(crate) fn timing(&self) -> Timing {
        self.plan.resolve(self.start_or_set_with(crate::time::now))
    }

    /// [`timing`](Self::timing), taking `now` as the start if it is not
    /// fixed yet (one clock read serves the caller and the attempt).
    #[inline]
    pub(crate) fn timing_at(&self, now: Instant) -> Timing {
        self.plan.resolve(self.start_or_set_with(|| now))
    }

    /// The start if it is fixed.
    pub(crate) fn start(&self) -> Option<Instant> {
        self.start.get().copied()
    }

    /// The start, fixed at `now()` if nobody fixed it yet (the first
    /// setter wins; a racing one reads the winner's).
    #[inline]
    pub(crate) fn start_or_set_with(&self, now: impl FnOnce() -> Instant) -> Instant {
        *self.start.get_or_init(now)
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
        // One clock read: it fixes the start if this is the first reading.
        let now = crate::time::now();
        let mut started_now = false;
        let start = *self.start.get_or_init(|| {
            started_now = true;
            now
        });
        // Started by this reading (a door's header for a first attempt): the
        // time left may follow from the plan alone, without the instants
        // (~120 instructions a request through the layer, callgrind).
        if started_now && let Some(left) = self.plan.left_at_start() {
            return left;
        }
        self.plan
            .resolve(start)
            .deadline
            .saturating_duration_since(now)
    }
}

#[cfg(test)]
mod tests;

/// The attempt's write-once key under `loom` (CI: `--cfg loom`).
#[cfg(all(test, loom))]
mod loom_models;
