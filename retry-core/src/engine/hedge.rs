//! Hedging (gRFC A6's `hedgingPolicy`), for idempotent calls: the first
//! attempt starts at once; another starts after each `delay` without an
//! answer, or at once after a non-fatal (transient) failure, up to
//! `max_attempts` in all. The first success wins and the others are
//! cancelled; a fatal (permanent) failure ends the call and cancels the
//! others. Every hedge carries the call's one idempotency key. A server's
//! pushback delays the next hedge by its pause, or stops further hedges
//! (those in flight go on). The budget is asked before each hedge after the
//! first (a token bucket allows one only while above half, as A6's
//! throttling does); a refusal stops further hedges and never cancels one in
//! flight. The breaker admits each hedge. The deadline bounds them all, and
//! dropping the call cancels everything in flight.
//!
//! The driver is the engine's: it uses its start-of-call state, its
//! observers and its one way of giving up; only the bookkeeping of several
//! attempts at once is here.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::attempt::{Attempt, IdempotencyKey, add};
use crate::breaker::{Breaker, Permit};
use crate::budget::Budget;
use crate::failure::{Failure, Reason};
use crate::scope;
use crate::spec::Retry;
use crate::spec::slots::{Classifier, Declared, LimitSlot, NoRetryIf};

use super::Engine;

/// How a call is hedged: up to `max_attempts` copies, a new one after each
/// `delay` without an answer; see [`Retry::run_hedged`](crate::Retry::run_hedged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hedging {
    max_attempts: u32,
    delay: Duration,
}

impl Hedging {
    /// Up to `max_attempts` copies in all (the first included; 0 acts as
    /// 1), a new one after each `delay` without an answer.
    #[must_use]
    pub const fn new(max_attempts: u32, delay: Duration) -> Self {
        Self {
            max_attempts,
            delay,
        }
    }

    /// Copies in all, the first included.
    #[must_use]
    pub const fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The pause before the next copy when none has answered.
    #[must_use]
    pub const fn delay(&self) -> Duration {
        self.delay
    }
}

pin_project_lite::pin_project! {
    /// One hedge in flight: its attempt context and the body's future,
    /// polled inside the attempt's scope.
    struct InFlight<F> {
        at: Attempt,
        admission: Permit,
        #[pin]
        fut: F,
    }
}

impl<F: Future> Future for InFlight<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let at: &Attempt = this.at;
        scope::enter(at, || this.fut.poll(cx))
    }
}

/// The hedges in flight. Those still there when it is dropped (the call was
/// answered, stopped, or dropped by its caller) are cancelled: their
/// admissions go back to the breaker as saying nothing about the server.
struct Flight<'k, K: Breaker, F> {
    breaker: &'k K,
    list: Vec<Pin<Box<InFlight<F>>>>,
}

impl<K: Breaker, F> Drop for Flight<'_, K, F> {
    fn drop(&mut self) {
        for f in self.list.drain(..) {
            self.breaker.on_neutral(f.admission);
        }
    }
}

/// What ends the wait for the next event.
enum Event<T, E> {
    /// Hedge `i` answered.
    Answer(usize, Result<T, E>),
    /// The time for the next hedge has come.
    NextHedge,
    /// The call's deadline has come.
    Deadline,
}

/// Run `op` hedged under `spec` (see the [module docs](self)).
#[allow(clippy::too_many_lines)] // one loop, its states side by side
pub(crate) async fn run<'a, T, E, I, C, R, H, B, K, L, F, Fut>(
    spec: Retry<'a, I, C, R, H, B, K, NoRetryIf, L>,
    hedging: Hedging,
    bound: Option<Instant>,
    mut op: F,
) -> Result<T, Failure<E>>
where
    I: Declared,
    C: Classifier<E>,
    B: Budget,
    K: Breaker,
    L: LimitSlot<'a>,
    F: FnMut(&Attempt) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    // The breaker is borrowed by the engine and by the hedges in flight.
    let Retry {
        policy,
        idempotency,
        classify,
        reconcile,
        on_retry,
        budget,
        breaker,
        nested,
        name,
        retry_if,
        slots,
    } = spec;
    let defer = nested == crate::scope::Nested::Defer && scope::owned_by_outer_loop();
    let spec = Retry {
        policy,
        idempotency,
        classify,
        reconcile,
        on_retry,
        budget,
        breaker: &breaker,
        nested,
        name,
        retry_if,
        slots,
    };
    let mut engine = Engine::new(spec);
    if let Some(at) = bound {
        engine.bound(at);
    }
    // The admission's word on the call, as for any call's first attempt.
    engine.admit_call()?;
    // One slot for all the copies, taken as for any call.
    if engine.take_slot().is_err() {
        engine.queue(std::pin::pin!(super::Timer::new())).await?;
    }
    // Inside an attempt of an outer loop: one attempt, as for any nested call.
    let max = if defer {
        1
    } else {
        hedging.max_attempts.max(1)
    };
    let now = crate::time::now();
    // A call that queued for its slot has its entry and deadline already.
    let deadline = engine.enter_now(now);
    let key = IdempotencyKey::random();
    engine.key = Some(key);

    let mut flight = Flight {
        breaker: &breaker,
        list: Vec::new(),
    };
    let mut more = true; // further hedges may start
    let mut stopped_by: Option<Reason> = None;
    let mut next_at = now;
    let mut hedge_timer = Box::pin(tokio::time::sleep_until(tokio::time::Instant::from_std(
        now,
    )));
    let mut deadline_timer = Box::pin(tokio::time::sleep_until(tokio::time::Instant::from_std(
        deadline,
    )));

    loop {
        // Start what is due: the first at once, the next when its time has
        // come (after `delay`, or at once after a non-fatal failure).
        let now = crate::time::now();
        if more && next_at <= now {
            // (`more` is cleared as soon as `max` copies have started.)
            if !engine.fits(now, deadline) {
                more = false;
                stopped_by.get_or_insert(Reason::DeadlineExceeded);
            } else if engine.attempts > 0 && !engine.budget().try_retry() {
                more = false;
                stopped_by.get_or_insert(Reason::BudgetExhausted);
            } else if let Some(admission) = breaker.admit() {
                engine.attempts += 1;
                engine.observe.attempt_started();
                // The call's deadline is fixed (`enter_now`): every copy
                // shares it.
                let at = Attempt::new(engine.attempts, Some(key), engine.plan(None));
                let fut = op(&at);
                flight.list.push(Box::pin(InFlight { at, admission, fut }));
                next_at = add(now, hedging.delay);
                if engine.attempts >= max {
                    more = false;
                }
            } else {
                more = false;
                stopped_by.get_or_insert(Reason::CircuitOpen);
            }
        }
        if flight.list.is_empty() {
            if !more {
                return Err(engine.give_up(stopped_by.unwrap_or(Reason::Exhausted), None));
            }
            // Nothing in flight, the next copy after a server's pause: it
            // must fit before the deadline, or the call stops now.
            if !engine.fits(next_at, deadline) {
                let reason = if engine.last_verdict.retry_after().is_some() {
                    Reason::PauseExceedsDeadline
                } else {
                    Reason::DeadlineExceeded
                };
                return Err(engine.give_up(reason, None));
            }
        }
        if more {
            hedge_timer
                .as_mut()
                .reset(tokio::time::Instant::from_std(next_at));
        }
        let event = std::future::poll_fn(|cx| {
            for (i, f) in flight.list.iter_mut().enumerate() {
                if let Poll::Ready(r) = f.as_mut().poll(cx) {
                    return Poll::Ready(Event::Answer(i, r));
                }
            }
            if deadline_timer.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Event::Deadline);
            }
            if more && hedge_timer.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Event::NextHedge);
            }
            Poll::Pending
        })
        .await;
        let (i, result) = match event {
            Event::NextHedge => continue,
            Event::Deadline => return Err(engine.give_up(Reason::DeadlineExceeded, None)),
            Event::Answer(i, result) => (i, result),
        };
        let done = flight.list.swap_remove(i);
        done.at.ended();
        let admission = done.admission;
        match result {
            Ok(v) => {
                breaker.on_success(admission);
                engine.budget().on_success();
                let entry = engine.entry;
                engine.observe.call_ended(Ok(()), engine.attempts, || {
                    entry.map_or(Duration::ZERO, crate::time::since)
                });
                return Ok(v);
            }
            Err(e) => {
                let verdict = engine.spec.classify.verdict(&e);
                if verdict.is_transient() {
                    breaker.on_transient_failure(admission);
                } else {
                    breaker.on_neutral(admission);
                }
                engine.charge_budget(verdict);
                engine.last_error = Some(e);
                engine.last_verdict = verdict;
                if verdict.is_server_refusal() {
                    // The server asks for no more copies; those in flight
                    // may still answer.
                    more = false;
                    stopped_by.get_or_insert(Reason::Permanent);
                } else if !verdict.is_transient() {
                    return Err(engine.give_up(Reason::Permanent, None));
                } else if more {
                    // Non-fatal: the next copy now, or after the server's
                    // pause.
                    let now = crate::time::now();
                    next_at = verdict.retry_after().map_or(now, |d| add(now, d));
                }
            }
        }
    }
}
