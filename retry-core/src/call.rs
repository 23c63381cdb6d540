//! The engine that drives one logical call, and [`call`], its public entry.
//!
//! # The decision after a failed attempt
//!
//! | verdict | idempotent | `reconcile` given | what happens |
//! |---|---|---|---|
//! | `Permanent` | any | any | stop with [`Reason::Permanent`] |
//! | `NotExecuted` | any | any | retry (subject to attempts, deadline, budget) |
//! | `Unknown` | yes | — | retry (subject to attempts, deadline, budget) |
//! | `Unknown` | no | yes | `reconcile(key)`: `Ok(Some(v))` → the work was done, return `Ok(v)`; `Ok(None)` → it was not, retry as `NotExecuted`; `Err(_)` → stop with [`Reason::UnknownOutcome`] |
//! | `Unknown` | no | no | stop with [`Reason::UnknownOutcome`] |
//!
//! `reconcile` is consulted after every unknown outcome, the last allowed
//! attempt included: it can still turn the call into a success. It runs within
//! the call's deadline; if the deadline passes first, the call stops with
//! [`Reason::DeadlineExceeded`].
//!
//! # Order of the checks before a retry
//!
//! 1. attempts left, else [`Reason::Exhausted`];
//! 2. the pause: the server's `retry_after` if the verdict has one (and the
//!    backoff sequence restarts after it), else the next backoff delay;
//! 3. the pause plus `min_attempt` must end before the deadline less the
//!    reserve, else [`Reason::DeadlineExceeded`] at once, without sleeping;
//! 4. the budget must allow the retry, else [`Reason::BudgetExhausted`] (at once:
//!    a refused retry never becomes a zero-delay retry);
//! 5. the `on_retry` hook runs, then the pause.
//!
//! # Deadlines
//!
//! An attempt runs until `min(start + attempt_timeout, deadline − reserve)`. An
//! attempt still running then is dropped (cancelled). Cut off by its own
//! `attempt_timeout`, its outcome is `Unknown` and the table above applies; cut
//! off by the call's deadline, the call stops with
//! [`Reason::DeadlineExceeded`]. So does an attempt that fails once the
//! deadline has passed, whatever its error (a server enforcing the propagated
//! deadline answers at that same moment, often with `CANCELLED`); the error is
//! kept as the source. No attempt starts after the deadline, and
//! dropping the call's future cancels the running attempt or pause at once.

use std::future::Future;
use std::ops::ControlFlow;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use crate::attempt::{Attempt, IdempotencyKey, Plan, add};
use crate::breaker::{Breaker, NoBreaker};
use crate::budget::{Budget, Unlimited};
use crate::failure::{Failure, Reason, Stopped};
use crate::observe::{AfterAttempt, AttemptEnd, Name, Observer, UNNAMED};
use crate::policy::Policy;
use crate::scope::{self, Nested};
use crate::verdict::{Classify, Verdict, VerdictKind};

/// What the `on_retry` hook is told before each pause.
#[derive(Debug)]
pub struct RetryEvent<'a, E> {
    attempt: u32,
    error: Option<&'a E>,
    verdict: Verdict,
    delay: Duration,
    remaining: Duration,
}

impl<'a, E> RetryEvent<'a, E> {
    /// The number of the attempt that just failed (1-based).
    #[must_use]
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Its error; `None` when it was cut off by its `attempt_timeout`.
    #[must_use]
    pub fn error(&self) -> Option<&'a E> {
        self.error
    }

    /// How the failure was classified (after `reconcile`, if it ran: a
    /// reconciled `Unknown` that found nothing is reported as `NotExecuted`).
    #[must_use]
    pub fn verdict(&self) -> Verdict {
        self.verdict
    }

    /// The pause about to be taken.
    #[must_use]
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// Time left before the deadline (less the reserve), measured before the pause.
    #[must_use]
    pub fn remaining(&self) -> Duration {
        self.remaining
    }
}

/// What one attempt produced.
#[doc(hidden)]
pub enum Outcome<T, E> {
    Done(Result<T, E>),
    /// Cut off at its time limit; `true` when the limit was the call's deadline.
    CutOff(bool),
}

/// An attempt that did not succeed: what [`Call::success`] hands to
/// [`Call::finish`].
#[doc(hidden)]
pub enum Failed<E> {
    /// The attempt returned an error.
    Error(E),
    /// Cut off at its time limit; `true` when the limit was the call's deadline.
    CutOff(bool),
}

/// What the driver does next.
enum Next<T, E> {
    Done(Result<T, Failure<E>>),
    Reconcile(IdempotencyKey),
    Pause { until: Instant, delay: Duration },
}

/// The state of one logical call. Every decision of the module docs is made
/// here; [`Retry::outcome`] and the code `#[retryable]` generates only drive it:
///
/// ```text
/// loop {
///     let at = call.start()?;                       // breaker admission, attempt context
///     let outcome = run_attempt(&at, body).await;   // lazy timer, cut off at the limit
///     if let Break(r) = call.finish(&at, outcome, …).await { return r }  // decide, pause
/// }
/// ```
#[doc(hidden)]
#[allow(clippy::struct_excessive_bools)] // four independent facts, not a state machine
pub struct Call<'p, E, B: Budget + 'static, K: Breaker + 'static> {
    policy: &'p Policy,
    idempotent: bool,
    reconcile: bool,
    budget: &'static B,
    breaker: Option<&'static K>,
    /// An admitted attempt not yet reported to the breaker.
    breaker_held: bool,
    attempts: u32,
    /// `max_attempts`, or 1 when deferring to an outer loop.
    max_attempts: u32,
    key: Option<IdempotencyKey>,
    entry: Option<Instant>,
    call_deadline: Option<Instant>,
    cap: Option<Instant>,
    /// Pauses since the backoff sequence last (re)started.
    pauses: u32,
    prev_pause: Duration,
    last_error: Option<E>,
    last_cut_off: bool,
    last_verdict: Verdict,
    observe: Observer,
}

impl<'p, E, B: Budget, K: Breaker> Call<'p, E, B, K> {
    /// A call under `policy`. `reconcile` says whether a `reconcile` function
    /// will be passed to [`finish`](Self::finish). Started inside another
    /// call's attempt, it takes that attempt's deadline as a bound and, with
    /// [`Nested::Defer`], makes a single attempt.
    #[must_use]
    #[inline]
    pub fn new(
        name: &'static Name,
        policy: &'p Policy,
        idempotent: bool,
        reconcile: bool,
        budget: &'static B,
        breaker: Option<&'static K>,
        nested: Nested,
    ) -> Self {
        let mut cap = None;
        let mut max_attempts = policy.max_attempts().max(1);
        if let Some((deadline, owner)) = scope::current() {
            cap = Some(deadline);
            if owner && nested == Nested::Defer {
                max_attempts = 1;
            }
        }
        budget.on_call();
        if let Some(k) = breaker {
            k.check_attempts(max_attempts);
        }
        Self {
            policy,
            idempotent,
            reconcile,
            budget,
            breaker,
            breaker_held: false,
            attempts: 0,
            max_attempts,
            key: None,
            entry: None,
            call_deadline: None,
            cap,
            pauses: 0,
            prev_pause: Duration::ZERO,
            last_error: None,
            last_cut_off: false,
            last_verdict: Verdict::permanent(),
            observe: Observer::new(name, policy, idempotent),
        }
    }

    /// Admit and describe the next attempt, or stop (open circuit).
    #[inline]
    pub fn start(&mut self) -> Result<Attempt, Failure<E>> {
        if let Some(k) = self.breaker {
            if !k.try_acquire() {
                return Err(self.stop(Reason::CircuitOpen));
            }
            self.breaker_held = true;
        }
        self.attempts += 1;
        self.observe.attempt_started();
        Ok(Attempt::new(
            self.attempts,
            self.key,
            Plan {
                call_deadline: self.call_deadline,
                usable: self.policy.usable(),
                cap: self.cap,
                attempt_timeout: self.policy.attempt_timeout(),
            },
            #[cfg(feature = "tracing")]
            self.observe.span().cloned(),
        ))
    }

    fn report_to_breaker(&mut self, f: impl FnOnce(&K)) {
        if let Some(k) = self.breaker
            && std::mem::take(&mut self.breaker_held)
        {
            f(k);
        }
    }

    fn elapsed(&self, now: Instant) -> Duration {
        self.entry
            .map_or(Duration::ZERO, |e| now.saturating_duration_since(e))
    }

    fn stop(&mut self, reason: Reason) -> Failure<E> {
        Failure::new(
            reason,
            self.last_error.take(),
            self.last_cut_off,
            self.attempts,
            self.elapsed(Instant::now()),
        )
    }

    /// Settle an attempt: success, stop, reconcile, or pause.
    fn settle<T, C: Classifier<E>>(
        &mut self,
        at: &Attempt,
        failed: Failed<E>,
        classify: &C,
    ) -> (AttemptEnd, Next<T, E>) {
        let (error, verdict, by_deadline) = match failed {
            Failed::Error(e) => {
                let v = classify.verdict(&e);
                (Some(e), v, false)
            }
            Failed::CutOff(by_deadline) => (None, Verdict::unknown(), by_deadline),
        };
        let end = if error.is_some() {
            AttemptEnd::Failed(verdict.kind())
        } else {
            AttemptEnd::CutOff
        };
        // The failure path always needs the clock; this is where the first
        // attempt's lazy timing gets fixed if nothing needed it earlier.
        let timing = at.timing();
        if self.entry.is_none() {
            self.entry = Some(timing.start);
        }
        self.call_deadline = Some(timing.call_deadline);
        if self.key.is_none() {
            self.key = at.minted_key();
        }
        self.last_cut_off = error.is_none();
        if error.is_some() {
            self.last_error = error;
        }
        self.last_verdict = verdict;
        if verdict.is_transient() {
            self.report_to_breaker(Breaker::on_transient_failure);
            self.budget.on_transient_failure();
        } else {
            self.report_to_breaker(Breaker::on_neutral);
        }

        // Cut off by the deadline, or failed once it had passed (a server
        // enforcing the propagated deadline answers at the same moment): the
        // call's time is up, whatever the error says.
        if by_deadline || Instant::now() >= timing.call_deadline {
            return (end, Next::Done(Err(self.stop(Reason::DeadlineExceeded))));
        }
        let next = match verdict.kind() {
            VerdictKind::Permanent => Next::Done(Err(self.stop(Reason::Permanent))),
            VerdictKind::Unknown if !self.idempotent => {
                if self.reconcile {
                    let key = *self.key.get_or_insert_with(IdempotencyKey::random);
                    Next::Reconcile(key)
                } else {
                    Next::Done(Err(self.stop(Reason::UnknownOutcome)))
                }
            }
            VerdictKind::NotExecuted | VerdictKind::Unknown => self.plan_retry(),
        };
        (end, next)
    }

    /// The answer of `reconcile` (`None`: the call's deadline passed first).
    fn reconciled<T>(&mut self, answer: Option<Result<Option<T>, E>>) -> Next<T, E> {
        match answer {
            None => Next::Done(Err(self.stop(Reason::DeadlineExceeded))),
            Some(Ok(Some(v))) => {
                self.budget.on_success();
                Next::Done(Ok(v))
            }
            Some(Ok(None)) => {
                let hint = self.last_verdict.retry_after();
                self.last_verdict = Verdict::not_executed();
                if let Some(h) = hint {
                    self.last_verdict = self.last_verdict.with_retry_after(h);
                }
                self.plan_retry()
            }
            Some(Err(e)) => Next::Done(Err(self
                .stop(Reason::UnknownOutcome)
                .with_reconcile_error(e))),
        }
    }

    fn plan_retry<T>(&mut self) -> Next<T, E> {
        if self.attempts >= self.max_attempts {
            return Next::Done(Err(self.stop(Reason::Exhausted)));
        }
        let delay = if let Some(hint) = self.last_verdict.retry_after() {
            // The server's hint replaces the computed pause and restarts the
            // backoff sequence (as gRPC does after pushback).
            self.pauses = 0;
            self.prev_pause = Duration::ZERO;
            hint
        } else {
            self.pauses = self.pauses.saturating_add(1);
            let d = self
                .policy
                .backoff()
                .delay(self.pauses, self.prev_pause, &mut rand::rng());
            self.prev_pause = d;
            d
        };
        let now = Instant::now();
        let until = add(now, delay);
        let deadline = self.call_deadline.unwrap_or(now);
        if add(until, self.policy.min_attempt()) > deadline {
            return Next::Done(Err(self.stop(Reason::DeadlineExceeded)));
        }
        if !self.budget.try_retry() {
            return Next::Done(Err(self.stop(Reason::BudgetExhausted)));
        }
        Next::Pause { until, delay }
    }

    /// The one place a success is settled: an attempt that succeeded ends the
    /// call here (`Break` with the value); a failure is handed back for
    /// [`finish`](Self::finish).
    #[inline]
    pub fn success<T>(
        &mut self,
        at: &Attempt,
        outcome: Outcome<T, E>,
    ) -> ControlFlow<T, Failed<E>> {
        match outcome {
            Outcome::Done(Ok(v)) => {
                self.report_to_breaker(Breaker::on_success);
                self.budget.on_success();
                self.observe.attempt_ended(
                    at.number(),
                    AttemptEnd::Ok,
                    AfterAttempt::Done,
                    || at.timing().start.elapsed(),
                    || {
                        at.timing()
                            .call_deadline
                            .saturating_duration_since(Instant::now())
                    },
                );
                let entry = self.entry;
                self.observe.call_ended(Ok(()), self.attempts, || {
                    entry.unwrap_or_else(|| at.timing().start).elapsed()
                });
                ControlFlow::Break(v)
            }
            Outcome::Done(Err(e)) => ControlFlow::Continue(Failed::Error(e)),
            Outcome::CutOff(by_deadline) => ControlFlow::Continue(Failed::CutOff(by_deadline)),
        }
    }

    /// Settle a failed attempt: on a stop (or a success found by
    /// `reconcile`), `Break` with the call's result; otherwise call the hook,
    /// pause, and `Continue` to the next attempt.
    pub async fn finish<T, C, R, H>(
        &mut self,
        at: &Attempt,
        failed: Failed<E>,
        classify: &C,
        reconcile: &mut R,
        on_retry: &mut H,
    ) -> ControlFlow<Result<T, Failure<E>>>
    where
        C: Classifier<E>,
        R: Reconciler<T, E>,
        H: OnRetry<E>,
    {
        let (end, mut next) = self.settle(at, failed, classify);
        let after = match &next {
            Next::Done(Ok(_)) => AfterAttempt::Done,
            Next::Done(Err(_)) => AfterAttempt::Stop,
            Next::Reconcile(_) => AfterAttempt::Reconcile,
            Next::Pause { delay, .. } => AfterAttempt::Retry(*delay),
        };
        self.observe.attempt_ended(
            at.number(),
            end,
            after,
            || at.timing().start.elapsed(),
            || {
                at.timing()
                    .call_deadline
                    .saturating_duration_since(Instant::now())
            },
        );
        if let Next::Reconcile(key) = next {
            let answer = match reconcile.lookup(key) {
                Some(fut) => {
                    #[cfg(feature = "tracing")]
                    let fut = tracing::Instrument::instrument(
                        fut,
                        self.observe
                            .span()
                            .cloned()
                            .unwrap_or_else(tracing::Span::none),
                    );
                    tokio::time::timeout_at(at.call_deadline(), fut).await.ok()
                }
                None => None,
            };
            next = self.reconciled(answer);
        }
        match next {
            Next::Done(r) => {
                let entry = self.entry;
                self.observe.call_ended(
                    r.as_ref().map(|_| ()).map_err(Failure::reason),
                    self.attempts,
                    || entry.unwrap_or_else(|| at.timing().start).elapsed(),
                );
                ControlFlow::Break(r)
            }
            Next::Reconcile(_) => unreachable!("reconciled() never asks to reconcile again"),
            Next::Pause { until, delay } => {
                self.observe.paused(delay);
                on_retry.on_retry(&self.event(delay));
                if !delay.is_zero() {
                    tokio::time::sleep_until(until).await;
                }
                ControlFlow::Continue(())
            }
        }
    }

    fn event(&self, delay: Duration) -> RetryEvent<'_, E> {
        let now = Instant::now();
        RetryEvent {
            attempt: self.attempts,
            error: self.last_error.as_ref(),
            verdict: self.last_verdict,
            delay,
            remaining: self
                .call_deadline
                .map_or(Duration::ZERO, |d| d.saturating_duration_since(now)),
        }
    }
}

impl<E, B: Budget, K: Breaker> Drop for Call<'_, E, B, K> {
    fn drop(&mut self) {
        // The call was dropped during an attempt: give the breaker its permit back.
        self.report_to_breaker(Breaker::on_neutral);
    }
}

/// The output of an attempt: a `Result`. A trait so that the code
/// `#[retryable]` generates can name a function's `Ok` and `Err` types through
/// its return type, and report a non-`Result` return type clearly.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`#[retryable]` functions must return a `Result`, not `{Self}`",
    label = "not a `Result`",
    note = "a retry loop needs failures to classify: return `Result<T, E>` where `E: retry::Classify`"
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

/// Run one attempt: poll once without touching the clock; only a body that
/// suspends gets a timer, armed at the attempt's deadline. Every poll runs
/// inside the attempt's scope, so calls made by the body see its deadline and
/// defer to this loop.
#[doc(hidden)]
pub fn run_attempt<F>(at: &Attempt, fut: F) -> RunAttempt<'_, F>
where
    F: Future,
    F::Output: IsResult,
{
    RunAttempt {
        at,
        fut,
        limit: None,
    }
}

pin_project_lite::pin_project! {
    /// The future of one attempt (stores the body's future once; an `async fn`
    /// would store it twice, which adds up when retried calls nest).
    #[doc(hidden)]
    #[must_use = "futures do nothing unless awaited"]
    pub struct RunAttempt<'a, F> {
        at: &'a Attempt,
        #[pin]
        fut: F,
        // Armed after the first poll that returns `Pending`.
        #[pin]
        limit: Option<tokio::time::Sleep>,
    }
}

impl<F> Future for RunAttempt<'_, F>
where
    F: Future,
    F::Output: IsResult,
{
    type Output = Outcome<<F::Output as IsResult>::Ok, <F::Output as IsResult>::Err>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let at = *this.at;
        #[cfg(feature = "tracing")]
        let _span = at.span().map(tracing::Span::enter);
        if let Poll::Ready(r) = scope::enter(at, || this.fut.as_mut().poll(cx)) {
            return Poll::Ready(Outcome::Done(r.into_result()));
        }
        let timing = at.timing();
        if this.limit.as_mut().as_pin_mut().is_none() {
            this.limit
                .set(Some(tokio::time::sleep_until(timing.deadline)));
        }
        let limit = this.limit.as_pin_mut().expect("armed above");
        if limit.poll(cx).is_ready() {
            return Poll::Ready(Outcome::CutOff(timing.deadline >= timing.call_deadline));
        }
        Poll::Pending
    }
}

// ---------------------------------------------------------------------------
// The builder.

/// Start describing a retried call under `policy`. Declare whether the
/// operation is safe to repeat with [`Retry::idempotent`] or
/// [`Retry::not_idempotent`], then [`run`](Retry::run) it.
///
/// ```
/// use std::time::Duration;
/// use retry_core::{Attempt, Policy};
///
/// const POLICY: Policy = Policy::new(Duration::from_secs(2)).with_max_attempts(3).validated();
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let mut calls = 0;
/// let answer: Result<u32, std::io::Error> = retry_core::call(&POLICY)
///     .idempotent()
///     .run(async |at: &Attempt| {
///         calls += 1; // `&mut` captures work: the closure is `AsyncFnMut`
///         if at.number() < 3 {
///             Err(std::io::ErrorKind::ConnectionRefused.into()) // not executed: retried
///         } else {
///             Ok(42)
///         }
///     })
///     .await;
/// assert_eq!(answer.unwrap(), 42);
/// assert_eq!(calls, 3);
/// # }
/// ```
///
/// A non-idempotent operation is retried after an unknown outcome only if
/// `reconcile` shows the work was not done:
///
/// ```
/// use std::time::Duration;
/// use retry_core::{Attempt, IdempotencyKey, Policy, Reason};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let charged = std::sync::Mutex::new(None::<IdempotencyKey>);
/// let policy = Policy::new(Duration::from_secs(2));
/// let receipt = retry_core::call(&policy)
///     .not_idempotent()
///     .reconcile(async |key| Ok::<_, std::io::Error>((*charged.lock().unwrap() == Some(key)).then_some("receipt")))
///     .run(async |at: &Attempt| {
///         // The charge happens, then the connection breaks before the reply.
///         *charged.lock().unwrap() = Some(at.idempotency_key());
///         Err(std::io::ErrorKind::ConnectionReset.into())
///     })
///     .await;
/// assert_eq!(receipt.unwrap(), "receipt"); // found by its key: no second charge
/// # }
/// ```
pub fn call(policy: &Policy) -> Retry {
    Retry {
        policy: *policy,
        idempotency: Undeclared,
        classify: ByClassify,
        reconcile: NoReconcile,
        on_retry: NoHook,
        budget: &Unlimited,
        breaker: None,
        nested: Nested::Defer,
        name: &UNNAMED,
    }
}

/// A retried call being described; made by [`call`].
#[must_use = "a `Retry` does nothing until `.run(…)` or `.outcome(…)` is awaited"]
pub struct Retry<
    I = Undeclared,
    C = ByClassify,
    R = NoReconcile,
    H = NoHook,
    B: 'static = Unlimited,
    K: 'static = NoBreaker,
> {
    policy: Policy,
    idempotency: I,
    classify: C,
    reconcile: R,
    on_retry: H,
    budget: &'static B,
    breaker: Option<&'static K>,
    nested: Nested,
    name: &'static Name,
}

/// Idempotency not declared yet: [`Retry::run`] is not available.
#[derive(Debug, Clone, Copy)]
pub struct Undeclared;
/// Declared safe to repeat.
#[derive(Debug, Clone, Copy)]
pub struct Idempotent;
/// Declared not safe to repeat blindly.
#[derive(Debug, Clone, Copy)]
pub struct NotIdempotent;

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Idempotent {}
    impl Sealed for super::NotIdempotent {}
}

/// The operation's idempotency has been declared.
#[diagnostic::on_unimplemented(
    message = "declare whether the operation is safe to repeat before running it",
    label = "idempotency not declared",
    note = "call `.idempotent()` if repeating the operation is harmless, or `.not_idempotent()` (optionally with `.reconcile(…)`) if it is not"
)]
pub trait Declared: sealed::Sealed {
    /// `true` for [`Idempotent`].
    const IDEMPOTENT: bool;
}
impl Declared for Idempotent {
    const IDEMPOTENT: bool = true;
}
impl Declared for NotIdempotent {
    const IDEMPOTENT: bool = false;
}

/// Classify errors with their [`Classify`] implementation (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct ByClassify;
/// Classify errors with a function; see [`Retry::classify`].
#[derive(Debug, Clone, Copy)]
pub struct ClassifyWith<F>(F);

impl<F> ClassifyWith<F> {
    /// Wrap `f`.
    pub fn new(f: F) -> Self {
        Self(f)
    }
}

/// How the engine classifies an error of type `E`.
pub trait Classifier<E> {
    /// The verdict for `e`.
    fn verdict(&self, e: &E) -> Verdict;
}
impl<E: Classify> Classifier<E> for ByClassify {
    #[inline]
    fn verdict(&self, e: &E) -> Verdict {
        e.classify()
    }
}
impl<E, F: Fn(&E) -> Verdict> Classifier<E> for ClassifyWith<F> {
    #[inline]
    fn verdict(&self, e: &E) -> Verdict {
        (self.0)(e)
    }
}

/// No `reconcile` (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoReconcile;
/// A `reconcile` function; see [`Retry::reconcile`].
#[derive(Debug, Clone, Copy)]
pub struct ReconcileWith<F>(F);

impl<F> ReconcileWith<F> {
    /// Wrap `f`.
    pub fn new(f: F) -> Self {
        Self(f)
    }
}

/// The `reconcile` slot: implemented by [`NoReconcile`] and [`ReconcileWith`]
/// around any `FnMut(IdempotencyKey) -> impl Future<Output = Result<Option<T>, E>>`
/// (an `async` closure or a closure calling an `async fn`).
pub trait Reconciler<T, E> {
    /// The future of one look-up.
    type Fut: Future<Output = Result<Option<T>, E>>;
    /// `true` when there is a function.
    const PRESENT: bool;
    /// Start a look-up for `key`, if there is a function.
    fn lookup(&mut self, key: IdempotencyKey) -> Option<Self::Fut>;
}
impl<T, E> Reconciler<T, E> for NoReconcile {
    type Fut = std::future::Ready<Result<Option<T>, E>>;
    const PRESENT: bool = false;
    #[inline]
    fn lookup(&mut self, _: IdempotencyKey) -> Option<Self::Fut> {
        None
    }
}
impl<T, E, F, Fut> Reconciler<T, E> for ReconcileWith<F>
where
    F: FnMut(IdempotencyKey) -> Fut,
    Fut: Future<Output = Result<Option<T>, E>>,
{
    type Fut = Fut;
    const PRESENT: bool = true;
    #[inline]
    fn lookup(&mut self, key: IdempotencyKey) -> Option<Fut> {
        Some((self.0)(key))
    }
}

/// No `on_retry` hook (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHook;

/// The `on_retry` slot of a [`Retry`]: implemented by [`NoHook`] and by every
/// `FnMut(&RetryEvent<'_, E>)`.
pub trait OnRetry<E> {
    /// Called before each pause.
    fn on_retry(&mut self, event: &RetryEvent<'_, E>);
}
impl<E> OnRetry<E> for NoHook {
    #[inline]
    fn on_retry(&mut self, _: &RetryEvent<'_, E>) {}
}
impl<E, F: FnMut(&RetryEvent<'_, E>)> OnRetry<E> for F {
    #[inline]
    fn on_retry(&mut self, event: &RetryEvent<'_, E>) {
        self(event);
    }
}

impl<C, R, H, B: 'static, K: 'static> Retry<Undeclared, C, R, H, B, K> {
    /// Declare the operation safe to repeat: `Unknown` outcomes are retried.
    pub fn idempotent(self) -> Retry<Idempotent, C, R, H, B, K> {
        self.declare(Idempotent)
    }

    /// Declare the operation not safe to repeat blindly: after an `Unknown`
    /// outcome it is retried only if [`reconcile`](Retry::reconcile) shows that
    /// the work was not done.
    pub fn not_idempotent(self) -> Retry<NotIdempotent, C, R, H, B, K> {
        self.declare(NotIdempotent)
    }

    fn declare<I>(self, idempotency: I) -> Retry<I, C, R, H, B, K> {
        Retry {
            policy: self.policy,
            idempotency,
            classify: self.classify,
            reconcile: self.reconcile,
            on_retry: self.on_retry,
            budget: self.budget,
            breaker: self.breaker,
            nested: self.nested,
            name: self.name,
        }
    }
}

impl<C, H, B: 'static, K: 'static> Retry<NotIdempotent, C, NoReconcile, H, B, K> {
    /// Resolve unknown outcomes: `f(key)` looks up whether the work of the call
    /// with this idempotency key was done. `Ok(Some(v))`: it was, and `v` is the
    /// call's result; `Ok(None)`: it was not, so it is retried; `Err(_)`: the
    /// call stops with [`Reason::UnknownOutcome`].
    ///
    /// Only for non-idempotent operations: an idempotent one is simply retried.
    pub fn reconcile<F>(self, f: F) -> Retry<NotIdempotent, C, ReconcileWith<F>, H, B, K> {
        Retry {
            policy: self.policy,
            idempotency: self.idempotency,
            classify: self.classify,
            reconcile: ReconcileWith(f),
            on_retry: self.on_retry,
            budget: self.budget,
            breaker: self.breaker,
            nested: self.nested,
            name: self.name,
        }
    }
}

impl<I, C, R, H, B: 'static, K: 'static> Retry<I, C, R, H, B, K> {
    /// Classify errors with `f` instead of the error type's [`Classify`].
    pub fn classify<F>(self, f: F) -> Retry<I, ClassifyWith<F>, R, H, B, K> {
        Retry {
            policy: self.policy,
            idempotency: self.idempotency,
            classify: ClassifyWith(f),
            reconcile: self.reconcile,
            on_retry: self.on_retry,
            budget: self.budget,
            breaker: self.breaker,
            nested: self.nested,
            name: self.name,
        }
    }

    /// Call `hook` before each pause with the failed attempt, its verdict and
    /// the pause chosen.
    pub fn on_retry<F>(self, hook: F) -> Retry<I, C, R, F, B, K> {
        Retry {
            policy: self.policy,
            idempotency: self.idempotency,
            classify: self.classify,
            reconcile: self.reconcile,
            on_retry: hook,
            budget: self.budget,
            breaker: self.breaker,
            nested: self.nested,
            name: self.name,
        }
    }

    /// Ask `budget` before every retry (usually a `static` shared by the calls
    /// to one downstream service).
    pub fn budget<B2: Budget + 'static>(self, budget: &'static B2) -> Retry<I, C, R, H, B2, K> {
        Retry {
            policy: self.policy,
            idempotency: self.idempotency,
            classify: self.classify,
            reconcile: self.reconcile,
            on_retry: self.on_retry,
            budget,
            breaker: self.breaker,
            nested: self.nested,
            name: self.name,
        }
    }

    /// Put `breaker` under the loop: it admits or refuses every attempt.
    pub fn breaker<K2: Breaker + 'static>(self, breaker: &'static K2) -> Retry<I, C, R, H, B, K2> {
        Retry {
            policy: self.policy,
            idempotency: self.idempotency,
            classify: self.classify,
            reconcile: self.reconcile,
            on_retry: self.on_retry,
            budget: self.budget,
            breaker: Some(breaker),
            nested: self.nested,
            name: self.name,
        }
    }

    /// The name this call reports under (the `function` field of its span and
    /// the `function` label of its metrics), a `static`
    /// [`Name`]. Default: `"retry::call"`.
    pub fn name(mut self, name: &'static Name) -> Self {
        self.name = name;
        self
    }

    /// What to do when started inside another retried call's attempt (see
    /// [`scope`]): [`Nested::Defer`] (the default) makes one
    /// attempt and leaves retries to the outer loop; [`Nested::Own`] retries
    /// as configured, within the outer attempt's deadline.
    pub fn nested(mut self, nested: Nested) -> Self {
        self.nested = nested;
        self
    }
}

impl<I, C, R, H, B, K> Retry<I, C, R, H, B, K>
where
    I: Declared,
    B: Budget + 'static,
    K: Breaker + 'static,
{
    /// Run `op` until it succeeds or the call stops, and return the result or
    /// the [`Failure`] describing the stop.
    pub async fn outcome<T, E, F>(mut self, mut op: F) -> Result<T, Failure<E>>
    where
        F: AsyncFnMut(&Attempt) -> Result<T, E>,
        C: Classifier<E>,
        R: Reconciler<T, E>,
        H: OnRetry<E>,
    {
        let mut call = Call::new(
            self.name,
            &self.policy,
            I::IDEMPOTENT,
            R::PRESENT,
            self.budget,
            self.breaker,
            self.nested,
        );
        loop {
            let at = call.start()?;
            let outcome = match call.success(&at, run_attempt(&at, op(&at)).await) {
                ControlFlow::Break(v) => return Ok(v),
                ControlFlow::Continue(outcome) => outcome,
            };
            let step = call
                .finish(
                    &at,
                    outcome,
                    &self.classify,
                    &mut self.reconcile,
                    &mut self.on_retry,
                )
                .await;
            if let ControlFlow::Break(r) = step {
                return r;
            }
        }
    }

    /// Run `op` until it succeeds or the call stops. A stop is mapped to `E` by
    /// [`Failure::into_error`]: the last error, or `E::from(Stopped)` when the
    /// deadline or the breaker stopped the call.
    pub async fn run<T, E, F>(self, op: F) -> Result<T, E>
    where
        F: AsyncFnMut(&Attempt) -> Result<T, E>,
        C: Classifier<E>,
        R: Reconciler<T, E>,
        H: OnRetry<E>,
        E: From<Stopped> + Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.outcome(op).await.map_err(Failure::into_error)
    }
}

impl<I, C, R, H, B: 'static, K: 'static> std::fmt::Debug for Retry<I, C, R, H, B, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retry")
            .field("policy", &self.policy)
            .field("idempotency", &std::any::type_name::<I>())
            .finish_non_exhaustive()
    }
}
