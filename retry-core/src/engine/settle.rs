//! The one settle step of a call, after each attempt: the decision table
//! (success, retry with its pause, a `reconcile` look-up first, or a stop),
//! the budget's and the breaker's share in it, the pause that must fit
//! before the deadline, and the failure that ends the call. The engine's
//! state and its start are in the parent module.

#[allow(clippy::wildcard_imports)]
use super::*;

impl<'a, E, I, C, R, H, B, K, O, L> Engine<'a, E, I, C, R, H, B, K, O, L>
where
    I: Declared,
    B: Budget,
    K: Breaker,
    L: LimitSlot<'a>,
{
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
            Outcome::Done(Ok(v)) => match self.spec.slots.retry_if.verdict(&v) {
                None => Step::Done(Ok(self.succeeded(v))),
                Some(verdict) => self.settle_failed(Failed::Value(v), verdict),
            },
            Outcome::Done(Err(e)) => {
                let v = self.spec.slots.classify.verdict(&e);
                self.settle_failed(Failed::Error(e), v)
            }
            Outcome::CutOff(limit) => self.settle_failed(Failed::CutOff(limit), Verdict::unknown()),
            // The pause is over: admit the next attempt, no pause more.
            Outcome::Paused => Step::Retry(None),
        }
    }

    /// [`settle`](Self::settle) for a failed attempt.
    pub(super) fn settle_failed<T>(
        &mut self,
        failed: Failed<T, E>,
        verdict: Verdict,
    ) -> Step<T, E, R::Fut>
    where
        R: Reconciler<T, E>,
        H: OnRetry<E>,
    {
        let end = match failed {
            Failed::Error(_) | Failed::Value(_) => End::Failed(verdict.kind()),
            Failed::CutOff(_) => End::CutOff,
        };
        #[cfg(feature = "tokio")]
        if self.learns() {
            self.teach(Some(verdict), matches!(end, End::CutOff));
        }
        let (decision, lookup, held) = self.decide(failed, verdict);
        self.observe
            .attempt_failed(self.spec.head.name, &self.at, end, || decision.then());
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
                    .call_ended(self.spec.head.name, Ok(()), self.attempts(), || {
                        entry.map_or(Duration::ZERO, crate::time::since)
                    });
                Step::Done(Ok(found))
            }
            // Not done, but an operator stopped every resend of an unknown
            // outcome: the call stops, its outcome still unknown.
            Some(Ok(None)) if self.ctl & crate::control::applied::UNKNOWN_STOP != 0 => {
                self.next(Decision::Stop(Reason::UnknownOutcome), held)
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
    pub(super) fn next<T, F>(&mut self, decision: Decision, held: Option<T>) -> Step<T, E, F>
    where
        H: OnRetry<E>,
    {
        match decision {
            Decision::Stop(reason) => self.stop(reason, held),
            // `decide` asks for a look-up only with one to run; without, the
            // outcome stays unknown.
            Decision::Reconcile => self.stop(Reason::UnknownOutcome, held),
            Decision::Pause { until, delay } => {
                self.observe.paused(self.spec.head.name, delay);
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
                    self.spec.slots.on_retry.on_retry(&event);
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
    pub(super) fn gave_up_retrying(&self, reason: Reason) -> bool {
        let deferring = self.max_attempts == 1
            && scope::owned_by_outer_loop()
            && self.spec.head.nested == Nested::Defer;
        !deferring
            && (reason.gave_up_retrying(self.attempts())
                || (reason == Reason::Permanent && self.last_verdict().is_server_refusal()))
    }

    /// Stop with `reason`; a value `held` is the answer.
    pub(super) fn stop<T, F>(&mut self, reason: Reason, held: Option<T>) -> Step<T, E, F> {
        let failure = self.give_up(reason, None);
        Step::Done(held.ok_or(failure))
    }

    /// The one place a success is settled. Observers are asked first whether
    /// anyone listens (nothing does on a quiet happy path: no span, no
    /// metrics), so the events are built out of line, only when needed.
    #[inline]
    pub(super) fn succeeded<T>(&mut self, v: T) -> T {
        #[cfg(feature = "tokio")]
        if self.learns() {
            self.teach(None, false);
        }
        self.report_to_breaker(Breaker::on_success);
        self.budget().on_success();
        let retrying = self.retrying.as_deref();
        self.observe
            .succeeded(self.spec.head.name, &self.at, || entry_of(retrying));
        v
    }

    pub(super) fn report_to_breaker(&mut self, f: impl FnOnce(&K, Permit)) {
        if let Some(admission) = self.admission.take() {
            f(&self.spec.slots.breaker, admission);
        }
    }

    /// The decision table for a failed attempt (before `reconcile` runs); also
    /// hands back the attempt's value, if it was one.
    pub(super) fn decide<T>(
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
            VerdictKind::Unknown
                if !self.spec.slots.idempotency.is_idempotent()
                    || unknown_below
                    || self.ctl
                        & (crate::control::applied::UNKNOWN_STOP
                            | crate::control::applied::UNKNOWN_RECONCILE)
                        != 0 =>
            {
                // The body's, if it minted one; else minted now.
                let key = self.at.idempotency_key();
                match self.spec.slots.reconcile.lookup(key) {
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
            .saturating_sub(self.spec.head.policy.min_attempt());
        hint.min(left / 2)
    }

    pub(super) fn fits(&self, at: Instant, deadline: Instant) -> bool {
        at < deadline && add(at, self.spec.head.policy.min_attempt()) <= deadline
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
            self.spec.head.policy.usable_nanos(),
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
            self.spec.head.name,
            self.spec.head.policy,
            self.spec.slots.idempotency.is_idempotent(),
        )
        .reopen();
        self.budget().on_call();
        self.settle(outcome)
    }

    /// The checks before a retry, in the documented order, as of `now`.
    pub(super) fn plan_retry(&mut self, now: Instant) -> Decision {
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
        let backoff = self.spec.head.policy.backoff();
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
        // The rate limit's start for the retry, at the end of the pause or
        // later, if it still fits; else the call stops, nothing reserved.
        #[cfg(feature = "tokio")]
        let (until, delay) = {
            let rate = self.spec.head.rate;
            if rate.is_set() {
                let latest = deadline
                    .checked_sub(self.spec.head.policy.min_attempt())
                    .unwrap_or(now);
                match rate.reserve(until, latest) {
                    Ok(start) => (start, start.saturating_duration_since(now)),
                    Err(reason) => return Decision::Stop(reason),
                }
            } else {
                (until, delay)
            }
        };
        // Without a pause, the check above is the one before the next
        // attempt: `start` need not read the clock again.
        self.checked = delay.is_zero();
        Decision::Pause { until, delay }
    }

    /// The first attempt may start only with `min_attempt` left before the
    /// bound `cap`, by the rule every later attempt follows.
    #[inline(never)]
    pub(super) fn first_in_time(&mut self, cap: Instant) -> Result<(), Failure<E>> {
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
    pub(super) fn give_up(&mut self, reason: Reason, reconcile_error: Option<E>) -> Failure<E> {
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
            .call_ended(self.spec.head.name, Err(reason), self.attempts(), || {
                elapsed
            });
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
