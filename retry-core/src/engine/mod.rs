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
//! single owner, unknown outcomes beneath) is a method here.

mod blocking;
#[cfg(feature = "tokio")]
mod hedge;
#[cfg(feature = "tokio")]
mod run;

use std::time::{Duration, Instant};

use crate::attempt::{Attempt, IdempotencyKey, Limit, Plan, add};
use crate::breaker::{Breaker, Permit};
use crate::budget::{Budget, TokenBucket};
use crate::failure::{Failure, Reason, RefusedPause};
use crate::observe::{End, Observer, Then};
use crate::scope::{self, Nested};
use crate::spec::slots::{Classifier, Declared, LimitSlot, OnRetry, Reconciler, RetryIf};
use crate::spec::{Retry, RetryEvent};
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

/// The state of one logical call, described by one [`Retry`] value. Every
/// decision of the crate docs is made here; the doors only drive it.
pub struct Engine<'a, E, I, C, R, H, B, K: Breaker, O, L: LimitSlot<'a>> {
    spec: Retry<'a, I, C, R, H, B, K, O, L>,
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
    pub fn new(spec: Retry<'a, I, C, R, H, B, K, O, L>) -> Self {
        let policy = spec.policy;
        if let Err(e) = policy.validate() {
            spec.name.report_invalid_policy(e);
        }
        let mut cap = None;
        let mut max_attempts = policy.max_attempts().max(1);
        if let Some((deadline, owner)) = scope::current() {
            cap = Some(deadline);
            if owner && spec.nested == Nested::Defer {
                max_attempts = 1;
            }
        }
        spec.breaker.check_attempts(max_attempts);
        let observe = Observer::new(spec.name, policy, spec.idempotency.is_idempotent());
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
        match &self.spec.budget {
            Some(b) => BudgetOf::Given(b),
            None => BudgetOf::Named(self.spec.name.budget()),
        }
    }

    /// Take the call's slot, when it has a concurrency limit: `Ok` without
    /// one or when a slot is free now (no clock read), [`Full`] when the
    /// call must [`queue`](Self::queue). The engine holds the slot until the
    /// call ends.
    #[cfg(feature = "tokio")]
    #[inline]
    pub fn take_slot(&mut self) -> Result<(), Full> {
        if let Some(limit) = self.spec.slots.limit() {
            self.hold(limit.try_take().ok_or(Full)?);
        }
        Ok(())
    }

    /// Hold `slot` until the call ends (given back when the engine drops).
    #[cfg(feature = "tokio")]
    #[inline]
    fn hold(&mut self, slot: crate::limit::Slot<'_>) {
        slot.keep();
        self.holds_slot = true;
    }

    /// The slot for the blocking door: a free one or none; a thread does not
    /// queue, so a full limit stops the call with [`Reason::Saturated`].
    #[cfg(feature = "tokio")]
    #[inline]
    pub fn slot_now(&mut self) -> Result<(), Failure<E>> {
        self.take_slot()
            .map_err(|Full| self.give_up(Reason::Saturated, None))
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
    pub async fn queue(&mut self, timer: std::pin::Pin<&mut Timer>) -> Result<(), Failure<E>> {
        let Some(limit) = self.spec.slots.limit() else {
            unreachable!("`queue` follows `slot()` returning `Full`");
        };
        let now = crate::time::now();
        let deadline = self.enter_now(now);
        // The last instant at which a first attempt still fits.
        let latest = deadline
            .checked_sub(self.spec.policy.min_attempt())
            .unwrap_or(now);
        let until = add(now, limit.max_wait()).min(latest);
        if until > now {
            let waited = timer.within(until, self.observed(), limit.take()).await;
            if let Some(slot) = waited
                && self.fits(crate::time::now(), deadline)
            {
                self.hold(slot);
                return Ok(());
            }
        }
        // A zero wait, a wait that ended, or a slot too late for an attempt.
        if let Some(slot) = limit.try_take()
            && self.fits(crate::time::now(), deadline)
        {
            self.hold(slot);
            return Ok(());
        }
        Err(self.give_up(Reason::Saturated, None))
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
            // A bound set before the call (an enclosing attempt's or a
            // server's deadline, a door's request deadline) may have passed
            // already: no first attempt then. Without one, the policy's own
            // deadline starts now, and the clock is not read here.
            if let Some(bound) = self.at.plan().bound {
                self.first_in_time(bound)?;
            }
            self.admit_call()?;
        }
        match self.spec.breaker.admit() {
            Some(admission) => self.admission = Some(admission),
            None => return Err(self.give_up(Reason::CircuitOpen, None)),
        }
        self.at.renew(self.spec.policy.attempt_timeout_nanos());
        self.observe.attempt_started(self.spec.name);
        self.observe.attempt_span(self.spec.name, self.attempts());
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

    /// Settle an attempt, the one step after each attempt: the call's
    /// result (at once on success), a retry (with the pause to take), or a
    /// look-up for `reconcile` to run first (its answer goes to
    /// [`reconciled`](Self::reconciled)). The loop only awaits what it is told.
    // Only the success test is inlined always; the failure path is a call.
    #[allow(clippy::inline_always)]
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub fn settle<T>(&mut self, outcome: Outcome<T, E>) -> Step<T, E, R::Fut>
    where
        C: Classifier<E>,
        R: Reconciler<T, E>,
        H: OnRetry<E>,
        O: RetryIf<T>,
    {
        match outcome {
            Outcome::Done(Ok(v)) => match self.spec.retry_if.verdict(&v) {
                None => Step::Done(Ok(self.succeeded(v))),
                Some(verdict) => self.settle_failed(Failed::Value(v), verdict),
            },
            Outcome::Done(Err(e)) => {
                let v = self.spec.classify.verdict(&e);
                self.settle_failed(Failed::Error(e), v)
            }
            Outcome::CutOff(limit) => self.settle_failed(Failed::CutOff(limit), Verdict::unknown()),
        }
    }

    /// [`settle`](Self::settle) for a failed attempt.
    fn settle_failed<T>(&mut self, failed: Failed<T, E>, verdict: Verdict) -> Step<T, E, R::Fut>
    where
        R: Reconciler<T, E>,
        H: OnRetry<E>,
    {
        let end = match failed {
            Failed::Error(_) | Failed::Value(_) => End::Failed(verdict.kind()),
            Failed::CutOff(_) => End::CutOff,
        };
        let (decision, lookup, held) = self.decide(failed, verdict);
        self.observe
            .attempt_failed(self.spec.name, &self.at, end, || decision.then());
        match (decision, lookup) {
            (Decision::Reconcile, Some(lookup)) => Step::Reconcile(lookup, held),
            (decision, _) => self.next(decision, held),
        }
    }

    /// The answer of `reconcile` (`None`: the call's deadline passed first),
    /// and the value held since the attempt, if any. Never a second look-up
    /// (the `Reconcile` step of the answer cannot be built).
    pub fn reconciled<T>(
        &mut self,
        answer: Option<Result<Option<T>, E>>,
        held: Option<T>,
    ) -> Step<T, E, std::convert::Infallible>
    where
        R: Reconciler<T, E>,
        H: OnRetry<E>,
    {
        match answer {
            None => self.next(Decision::Stop(Reason::DeadlineExceeded), held),
            Some(Ok(Some(found))) => {
                self.budget().on_success();
                let entry = self.entry();
                self.observe
                    .call_ended(self.spec.name, Ok(()), self.attempts(), || {
                        entry.map_or(Duration::ZERO, crate::time::since)
                    });
                Step::Done(Ok(found))
            }
            Some(Ok(None)) => {
                // Not done: retry as not executed, keeping any server hint.
                let last = &mut self.retrying().last_verdict;
                let hint = last.retry_after();
                *last = Verdict::not_executed();
                if let Some(h) = hint {
                    *last = last.with_retry_after(h);
                }
                let decision = self.plan_retry(crate::time::now());
                self.next(decision, held)
            }
            Some(Err(e)) => {
                let failure = self.give_up(Reason::UnknownOutcome, Some(e));
                Step::Done(held.ok_or(failure))
            }
        }
    }

    /// Carry out a decision: stop, or tell the hook and observers about the
    /// pause and hand it to the loop.
    /// When the call stops, a value `held` (the last attempt's, rejected by
    /// `retry_if`) is its answer; before a pause it is dropped.
    fn next<T, F>(&mut self, decision: Decision, held: Option<T>) -> Step<T, E, F>
    where
        H: OnRetry<E>,
    {
        match decision {
            Decision::Stop(reason) => self.stop(reason, held),
            // `decide` asks for a look-up only with one to run; without, the
            // outcome stays unknown.
            Decision::Reconcile => self.stop(Reason::UnknownOutcome, held),
            Decision::Pause { until, delay } => {
                self.observe.paused(self.spec.name, delay);
                if H::ACTIVE {
                    let event = RetryEvent::new(
                        self.attempts(),
                        self.retrying.as_ref().and_then(|r| r.last_error.as_ref()),
                        self.last_verdict(),
                        delay,
                        self.call_deadline().map_or(Duration::ZERO, |d| {
                            d.saturating_duration_since(crate::time::now())
                        }),
                    );
                    self.spec.on_retry.on_retry(&event);
                }
                Step::Retry((!delay.is_zero()).then_some(until))
            }
        }
    }

    /// The budget's share of a failed attempt: a transient failure, and a
    /// server's "do not retry" (a negative pushback), which gRFC A6 counts
    /// as a failure for throttling: the server says it is overloaded.
    #[inline]
    pub(crate) fn charge_budget(&self, verdict: Verdict) {
        // A conflict with concurrent work is no sign of an unhealthy service.
        if verdict.is_conflict() {
            return;
        }
        if verdict.is_transient() || verdict.is_server_refusal() {
            self.budget().on_transient_failure();
        }
        if verdict.is_overloaded() {
            self.budget().on_overloaded();
        }
    }

    /// Does this stop say "retried already; don't retry me" to a server
    /// layer above? A call that owned its retries and ran out of them (its
    /// attempts, its budget, its breaker, its deadline), or that its server
    /// told not to retry; not a call deferring to a loop in this process,
    /// whose error that loop decides on, nor a permanent failure.
    fn gave_up_retrying(&self, reason: Reason) -> bool {
        let deferring = self.max_attempts == 1
            && scope::owned_by_outer_loop()
            && self.spec.nested == Nested::Defer;
        !deferring
            && (reason.gave_up_retrying(self.attempts())
                || (reason == Reason::Permanent && self.last_verdict().is_server_refusal()))
    }

    /// Stop with `reason`; a value `held` is the answer.
    fn stop<T, F>(&mut self, reason: Reason, held: Option<T>) -> Step<T, E, F> {
        let failure = self.give_up(reason, None);
        Step::Done(held.ok_or(failure))
    }

    /// The one place a success is settled. Observers are asked first whether
    /// anyone listens (nothing does on a quiet happy path: no span, no
    /// metrics), so the events are built out of line, only when needed.
    #[inline]
    fn succeeded<T>(&mut self, v: T) -> T {
        self.report_to_breaker(Breaker::on_success);
        self.budget().on_success();
        let retrying = self.retrying.as_deref();
        self.observe
            .succeeded(self.spec.name, &self.at, || entry_of(retrying));
        v
    }

    fn report_to_breaker(&mut self, f: impl FnOnce(&K, Permit)) {
        if let Some(admission) = self.admission.take() {
            f(&self.spec.breaker, admission);
        }
    }

    /// The decision table for a failed attempt (before `reconcile` runs); also
    /// hands back the attempt's value, if it was one.
    fn decide<T>(
        &mut self,
        failed: Failed<T, E>,
        verdict: Verdict,
    ) -> (Decision, Option<R::Fut>, Option<T>)
    where
        R: Reconciler<T, E>,
    {
        // The failure path always needs the clock (read once here); this is
        // where the first attempt's lazy timing gets fixed if nothing needed
        // it earlier.
        // (A key the body minted is the call's already: the attempt is the
        // engine's.)
        let now = crate::time::now();
        let timing = self.at.timing_at(now);
        self.set_call_deadline(timing.call_deadline);
        let unknown_below = self.at.unknown_effect_below();
        let retrying = self.retrying();
        retrying.entry.get_or_insert(timing.start);
        retrying.last_cut_off = matches!(failed, Failed::CutOff(_));
        let (held, by_deadline) = match failed {
            Failed::Error(e) => {
                retrying.last_error = Some(e);
                (None, false)
            }
            Failed::Value(v) => {
                // The attempt answered: no error of its own to report.
                retrying.last_error = None;
                (Some(v), false)
            }
            Failed::CutOff(limit) => (None, limit == Limit::Call),
        };
        // A non-idempotent call beneath this attempt ended with an unresolved
        // unknown outcome: whatever this call declares, the attempt may have
        // had an effect that must not be repeated blindly.
        let verdict = if unknown_below && verdict.is_transient() {
            Verdict::unknown()
        } else {
            verdict
        };
        retrying.last_verdict = verdict;
        if verdict.is_transient() && !verdict.is_conflict() {
            self.report_to_breaker(Breaker::on_transient_failure);
        } else {
            self.report_to_breaker(Breaker::on_neutral);
        }
        self.charge_budget(verdict);

        // Cut off by the deadline, or failed once it had passed (a server
        // enforcing the propagated deadline answers at the same moment): the
        // call's time is up, whatever the error says.
        if by_deadline || now >= timing.call_deadline {
            return (Decision::Stop(Reason::DeadlineExceeded), None, held);
        }
        let decision = match verdict.kind() {
            VerdictKind::Permanent => Decision::Stop(Reason::Permanent),
            VerdictKind::Unknown if !self.spec.idempotency.is_idempotent() || unknown_below => {
                // The body's, if it minted one; else minted now.
                let key = self.at.idempotency_key();
                match self.spec.reconcile.lookup(key) {
                    Some(lookup) => return (Decision::Reconcile, Some(lookup), held),
                    // No look-up to run: the outcome stays unknown.
                    None => Decision::Stop(Reason::UnknownOutcome),
                }
            }
            VerdictKind::NotExecuted | VerdictKind::Unknown => self.plan_retry(now),
        };
        (decision, None, held)
    }

    /// Fix the call's entry at `now` (unless already fixed) and return its
    /// deadline: for the doors that need it before any attempt (the wait for
    /// a slot, the hedge driver).
    #[cfg(feature = "tokio")]
    pub(crate) fn enter_now(&mut self, now: Instant) -> Instant {
        let entry = *self.retrying().entry.get_or_insert(now);
        let deadline = self.at.plan().resolve(entry).call_deadline;
        self.set_call_deadline(deadline);
        deadline
    }

    /// Can an attempt start at `at` and still have `min_attempt` before
    /// `deadline`? The one rule for every attempt, after a pause or not.
    #[inline]
    /// The pause a server's `hint` on `verdict` asks for, from `now`: the
    /// hint itself, but a conflict's (a 409: the same key in progress) that
    /// does not fit the deadline is shortened to half the time left. A
    /// conflict's hint says when the other work is expected to be done, not
    /// when the server will take a request again, so the call looks again
    /// before its deadline; any other hint that does not fit stops the call
    /// (the caller's check). For the loop and the hedge driver alike.
    pub(crate) fn hinted_pause(&self, verdict: Verdict, hint: Duration, now: Instant) -> Duration {
        let Some(deadline) = self.call_deadline() else {
            return hint;
        };
        if !verdict.is_conflict() || self.fits(add(now, hint), deadline) {
            return hint;
        }
        let left = deadline
            .saturating_duration_since(now)
            .saturating_sub(self.spec.policy.min_attempt());
        hint.min(left / 2)
    }

    fn fits(&self, at: Instant, deadline: Instant) -> bool {
        at < deadline && add(at, self.spec.policy.min_attempt()) <= deadline
    }

    /// The call's idempotency key, given by a door that had to put it on the
    /// wire before the first attempt (see `door::door_loop!`): every
    /// attempt, `reconcile` and hook then sees that key, and none is minted.
    pub fn seed_key(&mut self, key: IdempotencyKey) {
        self.set_key(key);
    }

    /// Bound the call (and every call after it, for a stream) by `at`: the
    /// one way a door's own deadline enters the engine (a request's deadline
    /// for the layer and the middleware, a whole-stream limit for a stream),
    /// mined with the enclosing scope's, which is for nesting only. Not a
    /// field of the spec: there it would cost every `retries::call` future
    /// 16 bytes. Nor kept beside the plan: until the call's deadline is
    /// known, the plan's bound is it (a stream keeps its own copy for the
    /// calls after the first, see [`restart`](Self::restart)).
    #[cfg(feature = "tokio")]
    pub fn bound(&mut self, at: Instant) {
        let plan = self.at.plan_mut();
        plan.bound = Some(plan.bound.map_or(at, |b| b.min(at)));
    }

    /// The bound set by [`bound`](Self::bound) or by an enclosing attempt,
    /// before the call's deadline is known (after: the deadline).
    #[cfg(feature = "stream")]
    pub(crate) fn cap(&self) -> Option<Instant> {
        self.at.plan().bound
    }

    /// A stream's connection that had delivered (so its call ended as a
    /// success) failed with `outcome`: a new call begins, with its own
    /// deadline from now, its own attempts and backoff sequence, and that
    /// connection is its first attempt, settled at once. The breaker is not
    /// told (it admitted the connection, which succeeded); the budget is, as
    /// for any call. `cap` bounds the new call, as [`cap`](Self::cap) did
    /// the first.
    #[cfg(feature = "stream")]
    pub(crate) fn restart<T>(
        &mut self,
        outcome: Outcome<T, E>,
        cap: Option<Instant>,
    ) -> Step<T, E, R::Fut>
    where
        C: Classifier<E>,
        R: Reconciler<T, E>,
        H: OnRetry<E>,
        O: RetryIf<T>,
    {
        // The call was reset: its deadline is measured anew.
        let plan = Plan::new(
            None,
            self.spec.policy.usable_nanos(),
            cap,
            crate::attempt::NONE,
        );
        self.at = Attempt::new(1, None, plan);
        // (Kept out of line as it is: the stream's next failure reuses it.)
        if let Some(r) = self.retrying.as_deref_mut() {
            *r = Retrying::new();
        }
        self.checked = false;
        self.observe = Observer::new(
            self.spec.name,
            self.spec.policy,
            self.spec.idempotency.is_idempotent(),
        );
        self.budget().on_call();
        self.settle(outcome)
    }

    /// The checks before a retry, in the documented order, as of `now`.
    fn plan_retry(&mut self, now: Instant) -> Decision {
        // A conflict with concurrent work (see `Verdict::with_conflict`) is
        // retried up to `CONFLICT_ATTEMPTS` in all when the call retries at
        // all: under contention three attempts leave one transfer in twenty
        // failed, and the deadline still bounds the call.
        let last_verdict = self.last_verdict();
        let max = if last_verdict.is_conflict() && self.max_attempts > 1 {
            self.max_attempts.max(CONFLICT_ATTEMPTS)
        } else {
            self.max_attempts
        };
        if self.attempts() >= max {
            return Decision::Stop(Reason::Exhausted);
        }
        let backoff = self.spec.policy.backoff();
        let retrying = self.retrying();
        let delay = if let Some(hint) = last_verdict.retry_after() {
            // The server's hint replaces the computed pause and restarts the
            // backoff sequence (as gRPC does after pushback).
            retrying.pauses = 0;
            retrying.prev_pause = Duration::ZERO;
            self.hinted_pause(last_verdict, hint, now)
        } else {
            retrying.pauses = retrying.pauses.saturating_add(1);
            let d = backoff.delay(retrying.pauses, retrying.prev_pause);
            retrying.prev_pause = d;
            d
        };
        let until = add(now, delay);
        let deadline = self.call_deadline().unwrap_or(now);
        if !self.fits(until, deadline) {
            // Before the deadline (a failure at or after it stopped the call
            // as `DeadlineExceeded` already): the pause is what stops it.
            return Decision::Stop(Reason::PauseExceedsDeadline);
        }
        // A conflict's retry draws on no budget (see `Verdict::with_conflict`).
        if !last_verdict.is_conflict() && !self.budget().try_retry() {
            return Decision::Stop(Reason::BudgetExhausted);
        }
        // Without a pause, the check above is the one before the next
        // attempt: `start` need not read the clock again.
        self.checked = delay.is_zero();
        Decision::Pause { until, delay }
    }

    /// The first attempt may start only with `min_attempt` left before the
    /// bound `cap`, by the rule every later attempt follows.
    #[inline(never)]
    fn first_in_time(&mut self, cap: Instant) -> Result<(), Failure<E>> {
        let now = crate::time::now();
        if self.fits(now, cap) {
            return Ok(());
        }
        // No attempt made: the call took no time, unless it waited for a
        // slot (its entry was fixed then).
        Err(self.give_up(Reason::DeadlineExceeded, None))
    }

    /// The budget's word on a call's first attempt (an `Admission` may
    /// refuse it: nothing is sent), for every door that starts attempts.
    #[inline]
    pub(crate) fn admit_call(&mut self) -> Result<(), Failure<E>> {
        if self.budget().admit() {
            Ok(())
        } else {
            Err(self.give_up(Reason::Throttled, None))
        }
    }

    /// End the call without success: observers are told, and an unresolved
    /// unknown outcome marks the enclosing attempt, if any.
    #[cold]
    fn give_up(&mut self, reason: Reason, reconcile_error: Option<E>) -> Failure<E> {
        if reason == Reason::UnknownOutcome {
            scope::mark_unknown_effect();
        }
        if self.gave_up_retrying(reason) {
            scope::mark_gave_up();
        }
        let now = crate::time::now();
        let elapsed = self
            .entry()
            .map_or(Duration::ZERO, |e| now.saturating_duration_since(e));
        self.observe
            .call_ended(self.spec.name, Err(reason), self.attempts(), || elapsed);
        let attempts = self.attempts();
        let (last_error, cut_off, hint, prev_pause) = match self.retrying.as_deref_mut() {
            Some(r) => (
                r.last_error.take(),
                r.last_cut_off,
                r.last_verdict.retry_after(),
                r.prev_pause,
            ),
            None => (None, false, None, Duration::ZERO),
        };
        let failure = Failure::new(
            reason,
            last_error,
            reconcile_error,
            cut_off,
            attempts,
            elapsed,
        );
        if reason != Reason::PauseExceedsDeadline {
            return failure;
        }
        // The pause `plan_retry` (or the hedge driver) refused: the server's
        // hint if it gave one, else the backoff it computed.
        let left = self
            .call_deadline()
            .map_or(Duration::ZERO, |d| d.saturating_duration_since(now));
        failure.with_refused_pause(RefusedPause::new(
            hint.unwrap_or(prev_pause),
            left,
            hint.is_some(),
        ))
    }
}

impl<'a, E, I, C, R, H, B, K: Breaker, O, L: LimitSlot<'a>> Drop
    for Engine<'a, E, I, C, R, H, B, K, O, L>
{
    #[inline]
    fn drop(&mut self) {
        // Dropped during an attempt: the breaker gets its admission back.
        if let Some(admission) = self.admission.take() {
            self.spec.breaker.on_neutral(admission);
        }
        #[cfg(feature = "tokio")]
        if self.holds_slot
            && let Some(limit) = self.spec.slots.limit()
        {
            limit.give_back();
        }
    }
}
