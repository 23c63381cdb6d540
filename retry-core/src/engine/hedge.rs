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
use crate::spec::slots::{Classifier, Declared, LimitSlot, NoRetryIf};
use crate::spec::{Retry, SlotSet, Spec};

use super::Engine;

/// How a call is hedged: up to `max_attempts` copies, a new one after each
/// `delay` without an answer — a fixed delay ([`Hedging::new`]) or one
/// learned from the call site's own latencies ([`Hedging::learned`]); see
/// [`Retry::run_hedged`](crate::Retry::run_hedged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hedging {
    max_attempts: u32,
    delay: Delay,
}

/// The pause before the next copy.
#[derive(Debug, Clone, Copy)]
enum Delay {
    Fixed(Duration),
    Learned(&'static LearnedDelay),
}

impl PartialEq for Delay {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Fixed(a), Self::Fixed(b)) => a == b,
            (Self::Learned(a), Self::Learned(b)) => std::ptr::eq(*a, *b),
            _ => false,
        }
    }
}

impl Eq for Delay {}

impl Hedging {
    /// Up to `max_attempts` copies in all (the first included; 0 acts as
    /// 1), a new one after each `delay` without an answer.
    #[must_use]
    pub const fn new(max_attempts: u32, delay: Duration) -> Self {
        Self {
            max_attempts,
            delay: Delay::Fixed(delay),
        }
    }

    /// Up to `max_attempts` copies in all, a new one after the delay
    /// `delay` has learned from the latencies of the calls made with it
    /// (see [`LearnedDelay`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use retries::{Hedging, LearnedDelay};
    ///
    /// // At most about 5 % of the calls send a second copy; never sooner
    /// // than 2 ms, never later than 1 s.
    /// static STOCK_DELAY: LearnedDelay =
    ///     LearnedDelay::new(0.05, Duration::from_millis(2), Duration::from_secs(1));
    /// const HEDGING: Hedging = Hedging::learned(2, &STOCK_DELAY);
    /// // Before it has seen enough calls, the delay is the ceiling.
    /// assert_eq!(HEDGING.delay(), Duration::from_secs(1));
    /// ```
    #[must_use]
    pub const fn learned(max_attempts: u32, delay: &'static LearnedDelay) -> Self {
        Self {
            max_attempts,
            delay: Delay::Learned(delay),
        }
    }

    /// Copies in all, the first included.
    #[must_use]
    pub const fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The pause before the next copy when none has answered: the fixed
    /// delay, or what the learned one says now.
    #[must_use]
    pub fn delay(&self) -> Duration {
        match self.delay {
            Delay::Fixed(d) => d,
            Delay::Learned(l) => l.current(),
        }
    }

    /// A copy that started at `started` answered now. The clock is read
    /// only for a learned delay: a fixed one has nothing to record.
    fn answered(&self, started: Instant) {
        if let Delay::Learned(l) = self.delay {
            l.record(crate::time::since(started));
        }
    }
}

/// The latencies a [`LearnedDelay`] keeps: the most recent calls'.
const WINDOW: usize = 1024;
/// Calls seen before the delay is learned (until then: the ceiling).
const MIN_SAMPLES: usize = 64;
/// The delay is recomputed after this many new latencies.
const RECOMPUTE: u32 = 32;

/// A hedge delay learned from a call site's own latencies, as Finagle's
/// backup requests are sent: the next copy goes after the latency under
/// which `1 - max_extra_load` of the recent calls answered, so that about
/// `max_extra_load` of the calls send a second copy (5 %: after the 95th
/// percentile), clamped to `[floor, ceiling]`. The window holds the last
/// 1,024 calls' latencies (of the copy that answered, from its own start;
/// successes only: a copy cancelled by another's answer is not counted,
/// as tower's `hedge` counts); the delay is recomputed every 32 calls, and
/// is the ceiling until 64 calls were seen. It follows the latency as it moves,
/// within a window's worth of calls.
///
/// It is a `static` (one per call site, shared by its calls; see
/// [`Hedging::learned`]). It only decides *when* a copy goes: every copy
/// after the first still asks the budget (so a budget caps the extra load
/// whatever the latencies do), only idempotent calls are hedged, and the
/// deadline bounds every copy.
///
/// `max_extra_load` is a fraction, taken within `[0.001, 0.5]` (a value
/// outside, or not a number, is moved to the nearest end; NaN counts as
/// 0.05).
pub struct LearnedDelay {
    /// The quantile of the latencies the delay is, in per-mille (950 for
    /// an extra load of 5 %).
    quantile_permille: u32,
    floor: Duration,
    ceiling: Duration,
    window: crate::sync::Mutex<Window>,
    /// The delay now, in microseconds (`u64::MAX`: not learned yet).
    current_us: crate::sync::AtomicU64,
}

struct Window {
    /// Latencies in microseconds (saturating at about 71 minutes).
    samples: [u32; WINDOW],
    len: usize,
    next: usize,
    since: u32,
    /// Recomputations begun, and the number of the one whose delay is
    /// published: a recomputation that finishes after a newer one was
    /// published leaves it (the window is sorted outside the lock, so two
    /// can race; the `loom` model found the older delay left in place).
    begun: u64,
    published: u64,
}

impl LearnedDelay {
    /// A delay that keeps about `max_extra_load` of the calls sending a
    /// second copy, never below `floor` nor above `ceiling`.
    #[must_use]
    pub const fn new(max_extra_load: f64, floor: Duration, ceiling: Duration) -> Self {
        let load = if max_extra_load.is_nan() {
            0.05
        } else if max_extra_load < 0.001 {
            0.001
        } else if max_extra_load > 0.5 {
            0.5
        } else {
            max_extra_load
        };
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let quantile_permille = 1000 - (load * 1000.0 + 0.5) as u32;
        Self {
            quantile_permille,
            floor,
            ceiling,
            window: crate::sync::Mutex::new(Window {
                samples: [0; WINDOW],
                len: 0,
                next: 0,
                since: 0,
                begun: 0,
                published: 0,
            }),
            current_us: crate::sync::AtomicU64::new(u64::MAX),
        }
    }

    /// The delay now: the learned quantile within `[floor, ceiling]`, or
    /// the ceiling while fewer than 64 calls were seen.
    #[must_use]
    pub fn current(&self) -> Duration {
        match self.current_us.load(std::sync::atomic::Ordering::Relaxed) {
            u64::MAX => self.ceiling.max(self.floor),
            us => Duration::from_micros(us).clamp(self.floor, self.ceiling.max(self.floor)),
        }
    }

    /// One call's latency, to the window.
    fn record(&self, latency: Duration) {
        let us = u32::try_from(latency.as_micros()).unwrap_or(u32::MAX);
        let mut w = self
            .window
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let next = w.next;
        w.samples[next] = us;
        w.next = (next + 1) % WINDOW;
        w.len = (w.len + 1).min(WINDOW);
        w.since += 1;
        if w.len < MIN_SAMPLES || (w.since < RECOMPUTE && w.len > MIN_SAMPLES) {
            return;
        }
        w.since = 0;
        w.begun += 1;
        let this = w.begun;
        let mut sorted = [0u32; WINDOW];
        let len = w.len;
        sorted[..len].copy_from_slice(&w.samples[..len]);
        drop(w);
        // The smallest latency at or above which `1 - quantile` of the
        // calls answered.
        let rank = (len * self.quantile_permille as usize)
            .div_ceil(1000)
            .clamp(1, len)
            - 1;
        let (_, at, _) = sorted[..len].select_nth_unstable(rank);
        let mut w = self
            .window
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if this > w.published {
            w.published = this;
            self.current_us
                .store(u64::from(*at), std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl std::fmt::Debug for LearnedDelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LearnedDelay")
            .field("quantile_permille", &self.quantile_permille)
            .field("floor", &self.floor)
            .field("ceiling", &self.ceiling)
            .field("current", &self.current())
            .finish_non_exhaustive()
    }
}

pin_project_lite::pin_project! {
    /// One hedge in flight: its attempt context and the body's future,
    /// polled inside the attempt's scope.
    struct InFlight<F> {
        at: Attempt,
        admission: Permit,
        started: Instant,
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

/// The word of the rate limit and the pace on the copy due at `now`:
/// start it (`Ok`; its start is taken), or not yet (`Err(None)`, `next_at`
/// moved to its reserved start), or never (`Err` with the reason to stop:
/// no start fits by `latest`).
fn paced(
    rate: crate::rate::Starts<'_>,
    reserved: &mut bool,
    now: Instant,
    latest: Instant,
    next_at: &mut Instant,
) -> Result<(), Option<Reason>> {
    if !rate.is_set() || *reserved {
        return Ok(());
    }
    let start = rate.reserve(now, latest).map_err(Some)?;
    *reserved = true;
    if start > now {
        *next_at = start;
        Err(None)
    } else {
        Ok(())
    }
}

/// Run `op` hedged under `spec` (see the [module docs](self)).
#[allow(clippy::too_many_lines)] // one loop, its states side by side
pub(crate) async fn run<'a, T, E, I, C, R, H, B, K, L, F, Fut>(
    spec: Spec<'a, I, C, R, H, B, K, NoRetryIf, L>,
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
    let defer = spec.head.nested == crate::scope::Nested::Defer && scope::owned_by_outer_loop();
    let Retry { head, slots } = spec;
    let (slots, breaker) = slots.with_k(());
    let spec = Retry::from_parts(head, slots.with_k(&breaker).0);
    let mut engine = Engine::new(spec);
    if let Some(at) = bound {
        engine.bound(at);
    }
    // An operator's override, before the copies are counted.
    if crate::control::installed() {
        engine.apply_control();
    }
    // The admission's word on the call, as for any call's first attempt.
    engine.admit_call()?;
    // One slot for all the copies, taken as for any call.
    if engine.take_slot().is_err() {
        engine.queue(std::pin::pin!(super::Timer::new())).await?;
    }
    // Inside an attempt of an outer loop: one attempt, as for any nested call.
    let max = if defer || engine.one_attempt_only() {
        1
    } else {
        hedging.max_attempts.max(1)
    };
    let now = crate::time::now();
    // A call that queued for its slot has its entry and deadline already.
    let deadline = engine.enter_now(now);
    let key = IdempotencyKey::random();
    engine.set_key(key);
    // One delay for the whole call (a learned one may move meanwhile).
    let delay = hedging.delay();

    let mut flight = Flight {
        breaker: &breaker,
        list: Vec::new(),
    };
    let mut more = true; // further hedges may start
    let mut stopped_by: Option<Reason> = None;
    let mut next_at = now;
    // The rate limit's start is reserved for the copy due (waited for): the
    // first copy's by `take_slot` or `queue` above, as any call's.
    let mut reserved = engine.spec.head.rate.is_set();
    let latest = deadline
        .checked_sub(engine.spec.head.policy.min_attempt())
        .unwrap_or(now);
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
            } else if !reserved && engine.attempts() > 0 && !engine.budget().try_retry() {
                more = false;
                stopped_by.get_or_insert(Reason::BudgetExhausted);
            } else if let Err(never) = paced(
                engine.spec.head.rate,
                &mut reserved,
                now,
                latest,
                &mut next_at,
            ) {
                // Its start is later (`next_at` moved to it), or none fits.
                if let Some(reason) = never {
                    more = false;
                    stopped_by.get_or_insert(reason);
                }
            } else if let Some(admission) = breaker.admit() {
                reserved = false;
                *engine.at.number_mut() += 1;
                engine.observe.attempt_started(engine.spec.head.name);
                // The call's deadline is fixed (`enter_now`): every copy
                // shares it.
                let at = Attempt::new(
                    engine.attempts(),
                    Some(key),
                    engine.at.plan().without_timeout(),
                );
                let fut = op(&at);
                flight.list.push(Box::pin(InFlight {
                    at,
                    admission,
                    started: now,
                    fut,
                }));
                next_at = add(now, delay);
                if engine.attempts() >= max {
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
                let reason = if engine.last_verdict().retry_after().is_some() {
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
                hedging.answered(done.started);
                breaker.on_success(admission);
                engine.budget().on_success();
                let entry = engine.entry();
                engine
                    .observe
                    .call_ended(engine.spec.head.name, Ok(()), engine.attempts(), || {
                        entry.map_or(Duration::ZERO, crate::time::since)
                    });
                return Ok(v);
            }
            Err(e) => {
                let verdict = engine.spec.slots.classify.verdict(&e);
                if verdict.is_transient() {
                    breaker.on_transient_failure(admission);
                } else {
                    breaker.on_neutral(admission);
                }
                engine.charge_budget(verdict);
                let retrying = engine.retrying();
                retrying.last_error = Some(e);
                retrying.last_verdict = verdict;
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
                    next_at = verdict
                        .retry_after()
                        .map_or(now, |d| add(now, engine.hinted_pause(verdict, d, now)));
                }
            }
        }
    }
}

/// The learned delay's window under `loom` (CI: `--cfg loom`).
#[cfg(all(test, loom))]
mod loom_models;
