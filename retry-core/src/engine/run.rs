//! One attempt as a future ([`attempt`], [`RunAttempt`]), the one timer of a
//! call ([`Timer`]), and the loop every door expands
//! ([`__retries_drive!`](crate::__retries_drive)).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use crate::attempt::Attempt;
use crate::scope;

use super::{IsResult, Observed, Outcome};
use crate::attempt::Limit;

pin_project_lite::pin_project! {
    /// The one timer of a call, armed in turn at an attempt's limit (only
    /// once its body suspends), at the end of a pause, and at the deadline of
    /// a `reconcile` look-up: one `Sleep`, reset rather than made anew.
    #[derive(Debug)]
    pub struct Timer {
        #[pin]
        sleep: Option<tokio::time::Sleep>,
    }
}

impl Timer {
    /// A timer not armed yet (no clock read, no timer registered).
    #[must_use]
    #[inline]
    pub const fn new() -> Self {
        Self { sleep: None }
    }

    pub(crate) fn arm(self: Pin<&mut Self>, at: Instant) {
        let mut sleep = self.project().sleep;
        match sleep.as_mut().as_pin_mut() {
            Some(s) => s.reset(tokio::time::Instant::from_std(at)),
            None => sleep.set(Some(tokio::time::sleep_until(
                tokio::time::Instant::from_std(at),
            ))),
        }
    }

    pub(crate) fn poll_fired(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.project().sleep.as_pin_mut() {
            Some(s) => s.poll(cx),
            None => Poll::Pending,
        }
    }

    /// Arm the pause the settle step asked for, if any, for the next turn
    /// of the loop that awaits one future a turn (`#[retryable]`'s): that
    /// turn's attempt future waits it out and runs no body, and the attempt
    /// after it is admitted on the turn that follows
    /// ([`__retries_drive!`](crate::__retries_drive)'s `@turn` form).
    #[inline]
    pub fn pause_next(self: Pin<&mut Self>, at: &Attempt, until: Option<Instant>) {
        if let Some(until) = until {
            self.arm(until);
            at.set_pausing(true);
        }
    }

    /// Pause until `until`.
    pub fn pause(mut self: Pin<&mut Self>, until: Instant) -> Pause<'_> {
        self.as_mut().arm(until);
        Pause { timer: self }
    }

    /// Run `fut` (inside the call's span) until `deadline`: `None` when the
    /// deadline came first.
    pub fn within<'a, F: Future>(
        self: Pin<&'a mut Self>,
        deadline: Instant,
        observed: Observed<'a>,
        fut: F,
    ) -> Within<'a, F> {
        Within {
            timer: self,
            deadline: Some(deadline),
            observed,
            fut,
        }
    }
}

impl Default for Timer {
    fn default() -> Self {
        Self::new()
    }
}

/// The future of [`Timer::pause`].
#[must_use = "futures do nothing unless awaited"]
#[derive(Debug)]
pub struct Pause<'a> {
    timer: Pin<&'a mut Timer>,
}

impl Future for Pause<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.timer.as_mut().poll_fired(cx)
    }
}

pin_project_lite::pin_project! {
    /// The future of [`Timer::within`].
    #[must_use = "futures do nothing unless awaited"]
    pub struct Within<'a, F> {
        timer: Pin<&'a mut Timer>,
        // Set until the timer is armed (at the first `Pending`).
        deadline: Option<Instant>,
        observed: Observed<'a>,
        #[pin]
        fut: F,
    }
}

impl<F: Future> Future for Within<'_, F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        #[cfg(feature = "tracing")]
        let _span = this.observed.span.map(tracing::Span::enter);
        #[cfg(not(feature = "tracing"))]
        let _ = this.observed;
        if let Poll::Ready(v) = this.fut.poll(cx) {
            return Poll::Ready(Some(v));
        }
        if let Some(deadline) = this.deadline.take() {
            this.timer.as_mut().arm(deadline);
        }
        this.timer.as_mut().poll_fired(cx).map(|()| None)
    }
}

/// Run one attempt whose body's output is the function's return type `R`:
/// poll once without touching the clock; only a body that suspends gets a
/// timer, armed at the attempt's deadline. Every poll runs inside the
/// attempt's scope, so calls made by the body see its deadline and defer to
/// this loop.
#[inline]
pub fn attempt<'a, R, F>(
    at: &'a Attempt,
    observed: Observed<'a>,
    timer: Pin<&'a mut Timer>,
    fut: F,
) -> RunAttempt<'a, F>
where
    R: IsResult,
    F: Future<Output = R>,
{
    RunAttempt {
        at,
        observed,
        timer,
        fut,
    }
}

pin_project_lite::pin_project! {
    /// The future of one attempt (stores the body's future once; an `async fn`
    /// would store it twice, which adds up when retried calls nest).
    #[must_use = "futures do nothing unless awaited"]
    pub struct RunAttempt<'a, F> {
        at: &'a Attempt,
        observed: Observed<'a>,
        // Armed at the attempt's limit after the first poll that returns
        // `Pending` (the attempt records it: a flag here took 8 bytes).
        timer: Pin<&'a mut Timer>,
        #[pin]
        fut: F,
    }
}

impl<F> Future for RunAttempt<'_, F>
where
    F: Future,
    F::Output: IsResult,
{
    type Output = Outcome<<F::Output as IsResult>::Ok, <F::Output as IsResult>::Err>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let at = *this.at;
        if at.pausing() {
            // A turn of the pause before the next attempt: no body runs.
            return paused(at, this.timer.as_mut(), cx).map(|()| Outcome::Paused);
        }
        let polled = {
            let _inside = Inside::enter(*this.observed);
            scope::enter(at, || this.fut.as_mut().poll(cx))
        };
        if let Poll::Ready(r) = polled {
            at.ended();
            return Poll::Ready(Outcome::Done(r.into_result()));
        }
        match suspended(at, this.timer.as_mut(), cx) {
            Some(limit) => Poll::Ready(Outcome::CutOff(limit)),
            None => Poll::Pending,
        }
    }
}

/// Inside an attempt, for one poll of its body: the call's span entered (if
/// anyone listens); the attempt's scope is entered by [`scope::enter`]. Not
/// generic over the body, so it is compiled once (measured with `cargo
/// llvm-lines`: this and [`suspended`] took the per-function IR of the
/// attempt future down by about a third).
struct Inside<'a> {
    #[cfg(feature = "tracing")]
    _span: Option<tracing::span::Entered<'a>>,
    #[cfg(not(feature = "tracing"))]
    _span: std::marker::PhantomData<&'a ()>,
}

impl<'a> Inside<'a> {
    #[inline]
    fn enter(observed: Observed<'a>) -> Self {
        #[cfg(not(feature = "tracing"))]
        let _ = observed;
        Self {
            #[cfg(feature = "tracing")]
            _span: observed.span.map(tracing::Span::enter),
            #[cfg(not(feature = "tracing"))]
            _span: std::marker::PhantomData,
        }
    }
}

/// The pause before the next attempt, waited out by a turn's future
/// ([`Timer::pause_next`]): ready once the
/// call's timer has fired, the pause then over. Not generic, out of line.
#[cold]
#[inline(never)]
fn paused(at: &Attempt, timer: Pin<&mut Timer>, cx: &mut Context<'_>) -> Poll<()> {
    let fired = timer.poll_fired(cx);
    if fired.is_ready() {
        at.set_pausing(false);
    }
    fired
}

/// The attempt's body returned `Pending`: arm its time limit (once) and
/// report it if it has passed (the attempt then ends). Not generic.
#[inline]
fn suspended(at: &Attempt, timer: Pin<&mut Timer>, cx: &mut Context<'_>) -> Option<Limit> {
    let timing = at.timing();
    let was_armed = at.timer_armed();
    let mut armed = was_armed;
    let fired = cut_off(timer, &mut armed, timing.deadline, timing.limit(), cx);
    // Recorded once, when armed: not a read-modify-write on every poll.
    if armed && !was_armed {
        at.set_timer_armed();
    }
    let limit = fired?;
    at.ended();
    Some(limit)
}

/// The time limit of a suspended attempt (or stream item): the timer is armed
/// at `until` on the first call (`armed` records it), and `Some(limit)` once
/// it has fired. Not generic: compiled once, whatever the body.
#[inline]
pub(crate) fn cut_off(
    mut timer: Pin<&mut Timer>,
    armed: &mut bool,
    until: Instant,
    limit: Limit,
    cx: &mut Context<'_>,
) -> Option<Limit> {
    if !*armed {
        *armed = true;
        timer.as_mut().arm(until);
    }
    timer.poll_fired(cx).is_ready().then_some(limit)
}

/// The loop of one call, written once: `Retry::outcome` and `#[retryable]`
/// both expand it. `$spec` is a `Retry` value, `$ret` the body's output type,
/// `$at` the name the body uses for the attempt. Not public API.
///
/// `#[retryable]` knows from its keys whether the call can have a
/// concurrency limit (`concurrency`) and a `reconcile` look-up, and asks for
/// the loop without the steps it cannot take: `@[unlimited]` leaves out the
/// wait for a slot (`NoLimit` has none to wait for), `@[no_reconcile]` the
/// look-up (`NoReconcile`'s is a `NoLookup`, of which no value exists). Each
/// left-out step cost ~4 ms of compile time per function (0.8 s of 4.4 for 200
/// functions, `scripts/compile-time.sh`); what runs is the same.
#[doc(hidden)]
#[macro_export]
macro_rules! __retries_drive {
    ($spec:expr, $ret:ty, |$at:ident| $body:expr) => {
        $crate::__retries_drive!(@[limit][reconcile][] $spec, $ret, |$at| $body)
    };
    // The full form: `#[retryable]` emits it without the steps its keys rule
    // out; a door with a deadline of its own (the layer, the middleware)
    // passes it as the bound, an `Option<Instant>`.
    (@[$slot:ident][$lookup:ident][$($bound:expr $(, $key:expr)?)?] $spec:expr, $ret:ty, |$at:ident| $body:expr) => {{
        let mut engine = $crate::__private::Engine::new($spec);
        $(if let ::core::option::Option::Some(at) = $bound {
            engine.bound(at);
        }
        $(if let ::core::option::Option::Some(key) = $key {
            engine.seed_key(key);
        })?)?
        let mut timer = ::core::pin::pin!($crate::__private::Timer::new());
        $crate::__retries_slot!($slot, engine, timer, 'call: loop {
            if let ::core::result::Result::Err(stop) = engine.admit() {
                break ::core::result::Result::Err(stop);
            }
            // The attempt's context is the engine's own, renewed by `admit`.
            let $at = engine.attempt();
            let outcome = $crate::__private::attempt::<$ret, _>(
                $at,
                engine.observed(),
                timer.as_mut(),
                $body,
            )
            .await;
            let pause = $crate::__retries_settle!($lookup, engine, timer, outcome, 'call);
            if let ::core::option::Option::Some(until) = pause {
                timer.as_mut().pause(until).await;
            }
        })
    }};
    // `#[retryable]`'s forms: one `.await` a turn (see the `turn` module).
    // Only for a body that is an `async` block (evaluating it runs nothing):
    // the body expression is evaluated on a pause's turn too. A body that
    // names its attempt, or a call with `reconcile`, takes this form.
    (@turn[$slot:ident][$lookup:ident] $spec:expr, $ret:ty, |$at:ident| $body:expr) => {{
        let mut engine = $crate::__private::Engine::new($spec);
        let mut timer = ::core::pin::pin!($crate::__private::Timer::new());
        $crate::__retries_slot!($slot, engine, timer, 'call: loop {
            if let ::core::result::Result::Err(stop) = engine.admit_next() {
                break ::core::result::Result::Err(stop);
            }
            let $at = engine.attempt();
            let outcome = $crate::__private::attempt::<$ret, _>(
                $at,
                engine.observed(),
                timer.as_mut(),
                $body,
            )
            .await;
            let pause = $crate::__retries_settle!($lookup, engine, timer, outcome, 'call);
            engine.pause_next(timer.as_mut(), pause);
        })
    }};
    // The rest: settled, and the pause armed, in one call.
    (@turn[$slot:ident] $spec:expr, $ret:ty, $body:expr) => {{
        let mut engine = $crate::__private::Engine::new($spec);
        let mut timer = ::core::pin::pin!($crate::__private::Timer::new());
        $crate::__retries_slot!($slot, engine, timer, loop {
            if let ::core::result::Result::Err(stop) = engine.admit_next() {
                break ::core::result::Result::Err(stop);
            }
            let outcome = $crate::__private::attempt::<$ret, _>(
                engine.attempt(),
                engine.observed(),
                timer.as_mut(),
                $body,
            )
            .await;
            if let ::core::option::Option::Some(done) = engine.settle_turn(outcome, timer.as_mut()) {
                break done;
            }
        })
    }};
}

/// The loop of one call written in place, for a door: see
/// [`door::door_loop`](crate::door::door_loop).
#[doc(hidden)]
#[macro_export]
macro_rules! door_loop {
    ($spec:expr, $bound:expr, key: $key:expr, $ret:ty, |$at:ident| $body:expr) => {
        $crate::__retries_drive!(@[limit][reconcile][$bound, $key] $spec, $ret, |$at| $body)
    };
    ($spec:expr, $bound:expr, $ret:ty, |$at:ident| $body:expr) => {
        $crate::__retries_drive!(@[limit][reconcile][$bound] $spec, $ret, |$at| $body)
    };
}

/// The wait for a concurrency slot in [`__retries_drive!`](crate::__retries_drive).
#[doc(hidden)]
#[macro_export]
macro_rules! __retries_slot {
    (limit, $engine:ident, $timer:ident, $($call:tt)*) => {
        'slot: {
            // A concurrency limit's slot, held by the engine until the call ends.
            // Waiting is the slow path: its future is boxed, not stored in every call's.
            if $engine.take_slot().is_err() {
                if let ::core::result::Result::Err(stop) =
                    ::std::boxed::Box::pin($engine.queue($timer.as_mut())).await
                {
                    break 'slot ::core::result::Result::Err(stop);
                }
            }
            $($call)*
        }
    };
    // No limit: the loop alone, in no block of its own.
    (unlimited, $engine:ident, $timer:ident, $($call:tt)*) => { $($call)* };
}

/// The settle step of [`__retries_drive!`](crate::__retries_drive): the
/// pause before the next attempt (if any), or the call's result (`break`).
#[doc(hidden)]
#[macro_export]
macro_rules! __retries_settle {
    (reconcile, $engine:ident, $timer:ident, $outcome:ident, $call:lifetime) => {
        // No step is kept across an await (a `let mut step` in a loop was:
        // 104 bytes of every call's future, by `-Zprint-type-sizes`); the
        // `let` drops the settled step before the look-up runs.
        'step: {
            let (lookup, held) = match $engine.settle($outcome) {
                $crate::__private::Step::Done(done) => break $call done,
                $crate::__private::Step::Retry(until) => break 'step until,
                $crate::__private::Step::Reconcile(lookup, held) => (lookup, held),
            };
            let deadline = $engine.lookup_deadline();
            let answer = $timer
                .as_mut()
                .within(deadline, $engine.observed(), lookup)
                .await;
            match $engine.reconciled(answer, held) {
                $crate::__private::Step::Done(done) => break $call done,
                $crate::__private::Step::Retry(until) => until,
                $crate::__private::Step::Reconcile(never, _) => match never {},
            }
        }
    };
    (no_reconcile, $engine:ident, $timer:ident, $outcome:ident, $call:lifetime) => {
        match $engine.settle($outcome) {
            $crate::__private::Step::Done(done) => break $call done,
            $crate::__private::Step::Retry(until) => until,
            $crate::__private::Step::Reconcile(lookup, _) => lookup.absurd(),
        }
    };
}
