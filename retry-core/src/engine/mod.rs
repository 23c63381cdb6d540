//! The engine (private): one logical call's state, its one settle step, the
//! attempt future, and the one loop every door drives.
//!
//! ```text
//! let mut engine = Engine::new(spec);            // reads the scope: outer deadline, owner
//! let mut timer = pin!(Timer::new());            // one timer for the whole call
//! loop {
//!     engine.admit()?;                           // deadline check, breaker admission
//!     let at = engine.attempt();                 // the engine's own context, renewed
//!     let outcome = attempt(at, …, timer, body(at)).await; // cut off at the limit
//!     match engine.settle(outcome) {             // the decision table, synchronous
//!         Step::Done(r) => return r,             // at once on success
//!         Step::Retry(pause) => timer.pause(pause).await,
//!         Step::Reconcile(lookup, held) => …engine.reconciled(timer.within(deadline, lookup).await, held)…
//!     }
//! }
//! ```
//!
//! The engine keeps one [`Attempt`] for the whole call and renews it in place
//! before each attempt: the attempt's number, the call's key and its deadline
//! live there once, and nothing is built per attempt. What a call keeps once
//! an attempt has failed (the last error and verdict, the backoff sequence,
//! the entry) is made at the first failure, out of line ([`Retrying`]).
//!
//! The loop is written once, as [`__retries_drive!`](crate::__retries_drive),
//! and expanded by [`Retry::outcome`] and by the code `#[retryable]`
//! generates; every rule (the decision table, deadlines, budget, breaker,
//! single owner, unknown outcomes beneath) is a method here. `#[retryable]`
//! expands its `@turn` forms, which await one future a turn: the pause is
//! a turn of its own (the `turn` module says how, and why).

mod blocking;
#[cfg(feature = "tokio")]
mod hedge;
#[cfg(feature = "tokio")]
mod run;
mod settle;
#[cfg(feature = "tokio")]
mod turn;

use std::time::{Duration, Instant};

use crate::attempt::{Attempt, IdempotencyKey, Limit, Plan, add};
use crate::breaker::{Breaker, Permit};
use crate::budget::{Budget, TokenBucket};
use crate::failure::{Failure, Reason, RefusedPause};
use crate::observe::{End, Observer, Then};
use crate::scope::{self, Nested};
use crate::spec::slots::{Classifier, Declared, LimitSlot, OnRetry, Reconciler, RetryIf};
use crate::spec::{RetryEvent, Spec};
use crate::verdict::{Verdict, VerdictKind};

pub use blocking::{attempt_blocking, sleep_until};
#[cfg(feature = "tokio")]
pub(crate) use hedge::run as run_hedged;
#[cfg(feature = "tokio")]
pub use hedge::{Hedging, LearnedDelay};
#[cfg(feature = "stream")]
pub(crate) use run::cut_off;
#[cfg(feature = "tokio")]
pub use run::{Timer, attempt};

/// The output of an attempt: a `Result`. A trait so that the code
/// `#[retryable]` generates can name a function's `Ok` and `Err` types through
/// its return type, and report a non-`Result` return type clearly.
#[diagnostic::on_unimplemented(
    message = "`#[retryable]` functions must return a `Result`, not `{Self}`",
    label = "not a `Result`",
    note = "a retry loop needs failures to classify: return `Result<T, E>` where `E: retries::Classify`"
)]
pub trait IsResult: Sized {
    /// The success type.
    type Ok;
    /// The error type.
    type Err;
    /// As a `Result`.
    fn into_result(self) -> Result<Self::Ok, Self::Err>;
    /// From a `Result`.
    fn from_result(r: Result<Self::Ok, Self::Err>) -> Self;
}

impl<T, E> IsResult for Result<T, E> {
    type Ok = T;
    type Err = E;
    #[inline]
    fn into_result(self) -> Self {
        self
    }
    #[inline]
    fn from_result(r: Self) -> Self {
        r
    }
}

/// What an attempt is observed by: the call's span, if anyone listens.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    #[cfg(feature = "tracing")]
    pub(crate) span: Option<&'a tracing::Span>,
    pub(crate) _engine: std::marker::PhantomData<&'a ()>,
}

/// How one attempt ended.
pub enum Outcome<T, E> {
    /// The body returned.
    Done(Result<T, E>),
    /// The body was cut off at its time limit.
    CutOff(Limit),
    /// No attempt ran: the pause the settle step asked for
    /// ([`Timer::pause_next`]) ended, and the next attempt is to be
    /// admitted (the loop of a `#[retryable]` function, which awaits one
    /// future a turn).
    Paused,
}

/// The attempts a call that retries at all may make, in all, when its
/// failures are conflicts with concurrent work ([`Verdict::with_conflict`]),
/// if its policy allows fewer.
pub(crate) const CONFLICT_ATTEMPTS: u32 = 10;

/// What the loop does after [`Engine::settle`].
pub enum Step<T, E, F> {
    /// The call is over.
    Done(Result<T, Failure<E>>),
    /// Make another attempt, after pausing until the instant, if any.
    Retry(Option<Instant>),
    /// Run this `reconcile` look-up within the deadline, then hand its answer
    /// to [`Engine::reconciled`], with the value held (an attempt's value
    /// that `retry_if` rejected, the call's answer if the look-up settles
    /// nothing).
    Reconcile(F, Option<T>),
}

/// [`Engine::take_slot`]: every slot is taken; the call must queue.
#[cfg(feature = "tokio")]
#[derive(Debug, Clone, Copy)]
pub struct Full;

/// How an attempt failed.
enum Failed<T, E> {
    /// It returned an error.
    Error(E),
    /// It returned a value that `retry_if` rejected.
    Value(T),
    /// It was cut off at this limit.
    CutOff(Limit),
}

/// What the engine decided after a failed attempt: the decision table's
/// answer, before `reconcile` (if asked) has run.
#[derive(Debug, Clone, Copy)]
enum Decision {
    /// The call stops.
    Stop(Reason),
    /// The call pauses until `until`, then makes another attempt.
    Pause { until: Instant, delay: Duration },
    /// Ask `reconcile` first (only when there is a look-up to run).
    Reconcile,
}

impl Decision {
    /// What observers are told (in their own words).
    #[inline]
    fn then(self) -> Then {
        match self {
            Self::Stop(_) => Then::Stop,
            Self::Pause { delay, .. } => Then::Retry(delay),
            Self::Reconcile => Then::Reconcile,
        }
    }
}

/// The call's budget: the one given, or the default bucket of its name.
enum BudgetOf<'x, B> {
    Given(&'x B),
    Named(&'x TokenBucket),
}

impl<B: Budget> Budget for BudgetOf<'_, B> {
    #[inline]
    fn on_call(&self) {
        match self {
            Self::Given(b) => b.on_call(),
            Self::Named(b) => b.on_call(),
        }
    }
    #[inline]
    fn on_success(&self) {
        match self {
            Self::Given(b) => b.on_success(),
            Self::Named(b) => b.on_success(),
        }
    }
    #[inline]
    fn on_transient_failure(&self) {
        match self {
            Self::Given(b) => b.on_transient_failure(),
            Self::Named(b) => b.on_transient_failure(),
        }
    }
    #[inline]
    fn try_retry(&self) -> bool {
        match self {
            Self::Given(b) => b.try_retry(),
            Self::Named(b) => b.try_retry(),
        }
    }
    #[inline]
    fn admit(&self) -> bool {
        match self {
            Self::Given(b) => b.admit(),
            Self::Named(b) => b.admit(),
        }
    }
    #[inline]
    fn on_overloaded(&self) {
        match self {
            Self::Given(b) => b.on_overloaded(),
            Self::Named(b) => b.on_overloaded(),
        }
    }
}

/// What a call keeps once an attempt has failed: the last failure (for the
/// [`Failure`], the hooks and the next decision) and the backoff sequence.
/// Made at the first failure and kept out of line, so that a call that
/// succeeds at once neither stores nor writes it: its error alone may be
/// large (a `tonic::Status` is 176 bytes), and every call's future held it.
/// The price is one allocation per call that fails at all (measured in
/// `tests/bench/README.md`).
struct Retrying<E> {
    /// The call's entry (its first attempt's start), once fixed.
    entry: Option<Instant>,
    last_error: Option<E>,
    last_verdict: Verdict,
    /// The pause before the last attempt (the backoff's previous value).
    prev_pause: Duration,
    /// Pauses since the backoff sequence last (re)started.
    pauses: u32,
    /// The last attempt was cut off at its time limit.
    last_cut_off: bool,
}

/// The call's entry, once fixed (see [`Engine::entry`]).
#[inline]
fn entry_of<E>(retrying: Option<&Retrying<E>>) -> Option<Instant> {
    retrying.and_then(|r| r.entry)
}

impl<E> Retrying<E> {
    const fn new() -> Self {
        Self {
            entry: None,
            last_error: None,
            last_verdict: Verdict::permanent(),
            prev_pause: Duration::ZERO,
            pauses: 0,
            last_cut_off: false,
        }
    }
}

/// The state of one logical call, described by one [`Retry`](crate::Retry) value. Every
/// decision of the crate docs is made here; the doors only drive it.
pub struct Engine<'a, E, I, C, R, H, B, K: Breaker, O, L: LimitSlot<'a>> {
    spec: Spec<'a, I, C, R, H, B, K, O, L>,
    /// The context of the current attempt (of the next, before it starts),
    /// kept for the whole call and renewed in place for each attempt: the
    /// attempts made (its number), the call's key once minted or given, and
    /// its deadline once known (its plan) are its own, not copies.
    at: Attempt,
    /// `max_attempts`, or 1 when deferring to an outer loop.
    max_attempts: u32,
    /// What the call keeps once an attempt has failed, made then (see
    /// [`Retrying`]).
    retrying: Option<Box<Retrying<E>>>,
    /// The breaker's admission of the running attempt, not yet reported.
    admission: Option<Permit>,
    /// The next attempt follows a zero pause planned against a fresh clock
    /// reading (no time to check again before starting it).
    checked: bool,
    /// What an operator's override changes for this call
    /// ([`control`](crate::control); `control::applied` flags), 0 without.
    ctl: u8,
    observe: Observer,
    /// The call holds a slot of its concurrency limit (given back when the
    /// engine is dropped).
    #[cfg(feature = "tokio")]
    holds_slot: bool,
}

impl<'a, E, I, C, R, H, B, K, O, L> Engine<'a, E, I, C, R, H, B, K, O, L>
where
    I: Declared,
    B: Budget,
    K: Breaker,
    L: LimitSlot<'a>,
{
    /// A call described by `spec`. Started inside another call's attempt, it
    /// takes that attempt's deadline as a bound and, with [`Nested::Defer`],
    /// makes a single attempt.
    // Inlined always: left to the compiler, it was outlined in some
    // monomorphizations (the `+breaker` bench), and the spec then reached the
    // engine through a stack temporary written and read back in pieces of
    // different sizes: two store-forwarding stalls took ~40 ns per call
    // (seen with `perf record`/`perf annotate` on the bench binary).
    //
    // Each `inline(always)` of the engine is for optimised builds only (no
    // `debug_assertions`): in a debug build LLVM's always-inliner still runs
    // and copied these bodies into every retried function's state machine,
    // which was a quarter of a debug build's time (200 annotated fns:
    // 3.35 s, 2.59 s without; `scripts/compile-time.sh`). Release counts are
    // the same (`scripts/instructions.sh`).
    #[must_use]
    #[allow(clippy::inline_always)]
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub fn new(spec: Spec<'a, I, C, R, H, B, K, O, L>) -> Self {
        let policy = spec.head.policy;
        if let Err(e) = policy.validate() {
            spec.head.name.report_invalid_policy(e);
        }
        let mut cap = None;
        let mut max_attempts = policy.max_attempts().max(1);
        if let Some((deadline, owner)) = scope::current() {
            cap = Some(deadline);
            if owner && spec.head.nested == Nested::Defer {
                max_attempts = 1;
            }
        }
        spec.slots.breaker.check_attempts(max_attempts);
        let observe = Observer::new(
            spec.head.name,
            policy,
            spec.slots.idempotency.is_idempotent(),
        );
        let plan = Plan::new(
            None,
            policy.usable_nanos(),
            cap,
            policy.attempt_timeout_nanos(),
        );
        let engine = Self {
            spec,
            at: Attempt::new(0, None, plan),
            max_attempts,
            retrying: None,
            admission: None,
            checked: false,
            ctl: 0,
            observe,
            #[cfg(feature = "tokio")]
            holds_slot: false,
        };
        engine.budget().on_call();
        engine
    }

    #[inline]
    pub(crate) fn set_key(&mut self, key: IdempotencyKey) {
        self.at.set_key(key);
    }

    /// An operator's override allows this call one attempt only (no
    /// hedges).
    #[cfg(feature = "tokio")]
    #[inline]
    pub(crate) fn one_attempt_only(&self) -> bool {
        self.ctl & crate::control::applied::ONE_ATTEMPT != 0
    }

    /// The attempts made so far.
    #[inline]
    pub(crate) fn attempts(&self) -> u32 {
        self.at.number()
    }

    /// The call's deadline (less the reserve), once known.
    #[inline]
    pub(crate) fn call_deadline(&self) -> Option<Instant> {
        self.at.plan().known_deadline()
    }

    /// The call's deadline is `deadline` from now on.
    #[inline]
    fn set_call_deadline(&mut self, deadline: Instant) {
        self.at.plan_mut().set_deadline(deadline);
    }

    /// The state kept since the first failure, made now if none failed yet.
    #[inline]
    fn retrying(&mut self) -> &mut Retrying<E> {
        self.retrying
            .get_or_insert_with(|| Box::new(Retrying::new()))
    }

    /// The call's entry, once fixed: by its first failure, or before its
    /// first attempt by a door that needs its deadline then. A call that
    /// succeeds at once has its first attempt's start instead.
    #[inline]
    fn entry(&self) -> Option<Instant> {
        entry_of(self.retrying.as_deref())
    }

    /// The last failed attempt's verdict (before any failed: permanent,
    /// which no rule reads as a reason to go on).
    #[inline]
    pub(crate) fn last_verdict(&self) -> Verdict {
        self.retrying
            .as_ref()
            .map_or(Verdict::permanent(), |r| r.last_verdict)
    }

    #[inline]
    fn budget(&self) -> BudgetOf<'_, B> {
        match &self.spec.slots.budget {
            Some(b) => BudgetOf::Given(b),
            None => BudgetOf::Named(self.spec.head.name.budget()),
        }
    }

    /// Take the call's slot, when it has a concurrency limit: `Ok` without
    /// one or when a slot is free now (no clock read), [`Full`] when the
    /// call must [`queue`](Self::queue). The engine holds the slot until the
    /// call ends.
    #[cfg(feature = "tokio")]
    #[inline]
    pub fn take_slot(&mut self) -> Result<(), Full> {
        if let Some(limit) = self.spec.slots.limit.limit() {
            self.hold(limit.try_take().ok_or(Full)?);
        }
        // A rate limit's start now, or the wait in `queue`.
        let rate = self.spec.head.rate;
        if rate.is_set() {
            let now = crate::time::now();
            rate.reserve(now, now).map_err(|_| Full)?;
        }
        Ok(())
    }

    /// The last instant a first attempt may start (`min_attempt` before the
    /// deadline), fixing the call's entry at `now`.
    #[cfg(feature = "tokio")]
    fn latest_first(&mut self, now: Instant) -> (Instant, Instant) {
        let deadline = self.enter_now(now);
        let latest = deadline
            .checked_sub(self.spec.head.policy.min_attempt())
            .unwrap_or(now);
        (deadline, latest)
    }

    /// Hold `slot` until the call ends (given back when the engine drops).
    #[cfg(feature = "tokio")]
    #[inline]
    fn hold(&mut self, slot: crate::limit::Slot<'_>) {
        slot.keep();
        self.holds_slot = true;
    }

    /// Does the call hold an adaptive limit's slot (each attempt's start is
    /// read, and its end taught to the limit)? Without a limit slot, known
    /// at compile time.
    #[cfg(feature = "tokio")]
    #[inline]
    pub(crate) fn learns(&self) -> bool {
        self.holds_slot
            && self
                .spec
                .slots
                .limit
                .limit()
                .is_some_and(crate::limit::Concurrency::is_adaptive)
    }

    /// Tell an adaptive limit what the attempt just ended showed: a round
    /// trip (success, or cut off at its time limit), or an overloaded
    /// refusal (`failed`'s verdict); other failures tell nothing.
    #[cfg(feature = "tokio")]
    #[cold]
    #[inline(never)]
    pub(crate) fn teach(&self, failed: Option<Verdict>, cut_off: bool) {
        let Some(limit) = self.spec.slots.limit.limit() else {
            return;
        };
        let sample = match failed {
            Some(v) if v.is_overloaded() => crate::limit::Sample::Overloaded,
            Some(_) if !cut_off => return,
            _ => match self.at.start() {
                Some(start) => crate::limit::Sample::RoundTrip(crate::time::since(start)),
                None => return,
            },
        };
        limit.learn(sample);
    }

    /// The slot for the blocking door: a free one or none; a thread does not
    /// queue, so a full limit stops the call with [`Reason::Saturated`].
    #[cfg(feature = "tokio")]
    #[inline]
    pub fn slot_now(&mut self) -> Result<(), Failure<E>> {
        if let Some(limit) = self.spec.slots.limit.limit() {
            let slot = limit
                .try_take()
                .ok_or_else(|| self.give_up(Reason::Saturated, None))?;
            self.hold(slot);
        }
        // A rate limit's start: the thread sleeps until it.
        let rate = self.spec.head.rate;
        if rate.is_set() {
            let now = crate::time::now();
            let (_, latest) = self.latest_first(now);
            let start = rate
                .reserve(now, latest)
                .map_err(|reason| self.give_up(reason, None))?;
            std::thread::sleep(start.saturating_duration_since(now));
        }
        Ok(())
    }

    /// Without tokio there is no concurrency limit.
    #[cfg(not(feature = "tokio"))]
    #[inline]
    #[allow(clippy::unnecessary_wraps, clippy::unused_self)]
    pub fn slot_now(&mut self) -> Result<(), Failure<E>> {
        Ok(())
    }

    /// Wait in turn for a slot, for at most the limit's `max_wait` and only
    /// while a first attempt would still fit before the deadline; the wait
    /// counts against the deadline (the call's entry is fixed now). No
    /// slot in that time: the call stops with [`Reason::Saturated`], no
    /// attempt made.
    // The wait runs on the call's one timer, and the loop boxes this future:
    // the path allocates (once, only when the call must wait) so that it
    // adds one pointer, not a waiter and a timer, to every call's future
    // (measured: +288 bytes inline, +120 with the timer shared).
    #[cfg(feature = "tokio")]
    #[cold]
    pub async fn queue(&mut self, mut timer: std::pin::Pin<&mut Timer>) -> Result<(), Failure<E>> {
        if let Some(limit) = self.spec.slots.limit.limit()
            && !self.holds_slot
        {
            let now = crate::time::now();
            let (deadline, latest) = self.latest_first(now);
            let until = add(now, limit.max_wait()).min(latest);
            let mut held = false;
            if until > now {
                let waited = timer
                    .as_mut()
                    .within(until, self.observed(), limit.take())
                    .await;
                if let Some(slot) = waited
                    && self.fits(crate::time::now(), deadline)
                {
                    self.hold(slot);
                    held = true;
                }
            }
            // A zero wait, a wait that ended, or a slot too late for an attempt.
            if !held {
                match limit.try_take() {
                    Some(slot) if self.fits(crate::time::now(), deadline) => self.hold(slot),
                    _ => return Err(self.give_up(Reason::Saturated, None)),
                }
            }
        }
        // The rate limit's start for the first attempt, waited for on the
        // call's timer when it fits; else the call stops, nothing reserved.
        let rate = self.spec.head.rate;
        if rate.is_set() {
            let now = crate::time::now();
            let (_, latest) = self.latest_first(now);
            let start = match rate.reserve(now, latest) {
                Ok(start) => start,
                Err(reason) => return Err(self.give_up(reason, None)),
            };
            if start > now {
                timer.pause(start).await;
            }
        }
        Ok(())
    }

    /// Admit the next attempt, or stop: the deadline has come (no attempt
    /// starts at or after it, nor with less than `min_attempt` left), or the
    /// breaker is open. Admitted, the attempt's context is the engine's own
    /// ([`attempt`](Self::attempt)), renewed in place: nothing is built or
    /// moved per attempt.
    // Measured (callgrind, `profile_ready`): left to the compiler, this is
    // not inlined into the generated state machine and costs ~45
    // instructions and ~7 ns per call more.
    #[allow(clippy::inline_always)]
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub fn admit(&mut self) -> Result<(), Failure<E>> {
        if self.attempts() > 0
            && !std::mem::take(&mut self.checked)
            && let Some(deadline) = self.call_deadline()
        {
            let now = crate::time::now();
            if !self.fits(now, deadline) {
                return Err(self.give_up(Reason::DeadlineExceeded, None));
            }
        }
        if self.attempts() == 0 {
            // An operator's override: one atomic load without one.
            if crate::control::installed() {
                self.apply_control();
            }
            // A bound set before the call (an enclosing attempt's or a
            // server's deadline, a door's request deadline) may have passed
            // already: no first attempt then. Without one, the policy's own
            // deadline starts now, and the clock is not read here.
            if let Some(bound) = self.at.plan().bound {
                self.first_in_time(bound)?;
            }
            self.admit_call()?;
        }
        if self.ctl == 0 {
            match self.spec.slots.breaker.admit() {
                Some(admission) => self.admission = Some(admission),
                None => return Err(self.give_up(Reason::CircuitOpen, None)),
            }
        } else {
            self.admit_controlled()?;
        }
        self.at.renew(self.spec.head.policy.attempt_timeout_nanos());
        #[cfg(feature = "tokio")]
        if self.learns() {
            self.at.start_or_set_with(crate::time::now);
        }
        self.observe.attempt_started(self.spec.head.name);
        self.observe
            .attempt_span(self.spec.head.name, self.attempts());
        Ok(())
    }

    /// Apply the operator's override of this call, if it has one and none
    /// was applied yet ([`control`](crate::control)): its flags, and a
    /// replacement policy (its deadline too, unless the call's deadline was
    /// fixed already by a wait for a slot). Out of line, before the first
    /// attempt, so that a call without one is built and run as before.
    #[cold]
    #[inline(never)]
    pub(crate) fn apply_control(&mut self) {
        use crate::control::applied::{APPLIES, ONE_ATTEMPT};
        if self.ctl != 0 {
            return;
        }
        let (ctl, replaced) = crate::control::applied(self.spec.head.name.as_str());
        self.ctl = ctl;
        if let Some(policy) = replaced {
            self.spec.head.policy = policy;
            if self.at.plan().known_deadline().is_none() {
                let bound = self.at.plan().bound;
                *self.at.plan_mut() = Plan::new(
                    None,
                    policy.usable_nanos(),
                    bound,
                    policy.attempt_timeout_nanos(),
                );
            }
            let deferring = scope::current().is_some_and(|(_, owner)| owner)
                && self.spec.head.nested == Nested::Defer;
            self.max_attempts = if deferring {
                1
            } else {
                policy.max_attempts().max(1)
            };
        }
        if ctl & ONE_ATTEMPT != 0 {
            self.max_attempts = 1;
        }
        if ctl & APPLIES != 0 {
            self.spec.slots.breaker.check_attempts(self.max_attempts);
            self.observe.controlled(self.spec.head.name.as_str());
        }
    }

    /// The breaker's word on an attempt of a call under an operator's
    /// override: a breaker forced open refuses, one forced closed is not
    /// consulted (neither is told: its state is kept for when the override
    /// ends).
    #[cold]
    #[inline(never)]
    fn admit_controlled(&mut self) -> Result<(), Failure<E>> {
        use crate::control::applied::{BREAKER_CLOSED, BREAKER_OPEN};
        if self.ctl & BREAKER_OPEN != 0 {
            return Err(self.give_up(Reason::CircuitOpen, None));
        }
        if self.ctl & BREAKER_CLOSED == 0 {
            match self.spec.slots.breaker.admit() {
                Some(admission) => self.admission = Some(admission),
                None => return Err(self.give_up(Reason::CircuitOpen, None)),
            }
        }
        Ok(())
    }

    /// The context of the attempt just admitted: the body's, and the scope
    /// that calls made inside it find.
    #[inline]
    pub fn attempt(&self) -> &Attempt {
        &self.at
    }

    /// The deadline of a `reconcile` look-up: the call's (known once an
    /// attempt has failed).
    #[inline]
    pub fn lookup_deadline(&self) -> Instant {
        self.at.call_deadline()
    }

    /// What the running attempt is observed by (the call's span, if anyone
    /// listens), for [`attempt`].
    #[inline]
    pub fn observed(&self) -> Observed<'_> {
        Observed {
            #[cfg(feature = "tracing")]
            span: self.observe.span(),
            _engine: std::marker::PhantomData,
        }
    }
}

impl<'a, E, I, C, R, H, B, K: Breaker, O, L: LimitSlot<'a>> Drop
    for Engine<'a, E, I, C, R, H, B, K, O, L>
{
    #[inline]
    fn drop(&mut self) {
        // Dropped during an attempt: the breaker gets its admission back.
        if let Some(admission) = self.admission.take() {
            self.spec.slots.breaker.on_neutral(admission);
        }
        #[cfg(feature = "tokio")]
        if self.holds_slot
            && let Some(limit) = self.spec.slots.limit.limit()
        {
            limit.give_back();
        }
    }
}
