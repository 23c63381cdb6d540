//! The call's description: [`Retry`], the value every door builds and the
//! engine reads, and [`RetryEvent`], what its `on_retry` hook is told. Its
//! type parameters are the [`slots`]: what has been declared (idempotency,
//! classifier, `reconcile`, hook, budget, breaker, `retry_if`, concurrency
//! limit), each a marker type or a sealed trait, so that a call that sets
//! nothing compiles to no check at all. The setters are the door's, in
//! [`builder`](crate::builder).

use std::time::Duration;

use crate::observe::Name;
use crate::scope::Nested;
use crate::verdict::Verdict;

pub mod slots;

use slots::{ByClassify, NoHook, NoLimit, NoReconcile, NoRetryIf, Undeclared};

use crate::breaker::NoBreaker;
use crate::budget::NoBudget;
use crate::policy::Policy;

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
    pub(crate) fn new(
        attempt: u32,
        error: Option<&'a E>,
        verdict: Verdict,
        delay: Duration,
        remaining: Duration,
    ) -> Self {
        Self {
            attempt,
            error,
            verdict,
            delay,
            remaining,
        }
    }

    /// The same event with its error seen as another type (`view`): what a
    /// door gives its user's hook when the attempt's own error type is the
    /// door's (`retries_http::door::tell`).
    #[must_use]
    pub fn with_error<'b, F>(&self, view: Option<&'b F>) -> RetryEvent<'b, F> {
        RetryEvent {
            attempt: self.attempt,
            error: view,
            verdict: self.verdict,
            delay: self.delay,
            remaining: self.remaining,
        }
    }

    /// The number of the attempt that just failed (1-based).
    #[must_use]
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The error of the failed attempt; `None` when it returned a value that
    /// `retry_if` rejected, or when no attempt of this call returned an error
    /// yet (every attempt so far was cut off by its `attempt_timeout`).
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

/// A retried call being described; made by [`call`](crate::call()). Its type parameters
/// record what has been set: the idempotency (`I`), the classifier (`C`), the
/// reconcile function (`R`), the `on_retry` hook (`H`), the budget (`B`),
/// the breaker (`K`) and the classifier of successful values (`O`).
#[must_use = "a `Retry` does nothing until `.run(…)` or `.outcome(…)` is awaited"]
pub struct Retry<
    'a,
    I = Undeclared,
    C = ByClassify,
    R = NoReconcile,
    H = NoHook,
    B = NoBudget,
    K = NoBreaker,
    O = NoRetryIf,
    L = NoLimit,
> {
    pub(crate) policy: &'a Policy,
    pub(crate) idempotency: I,
    pub(crate) classify: C,
    pub(crate) reconcile: R,
    pub(crate) on_retry: H,
    /// `None`: the default bucket of `name`.
    pub(crate) budget: Option<B>,
    pub(crate) breaker: K,
    pub(crate) nested: Nested,
    pub(crate) name: &'static Name,
    pub(crate) retry_if: O,
    /// The concurrency limit: [`NoLimit`], or a limit.
    pub(crate) slots: L,
}

/// What a spec holds besides its slots: the same whichever slots are set.
#[derive(Clone, Copy)]
pub(crate) struct Head<'a> {
    pub(crate) policy: &'a Policy,
    pub(crate) nested: Nested,
    pub(crate) name: &'static Name,
}

/// A spec's slots, in the order of its type parameters: idempotency,
/// classifier, `reconcile`, `on_retry`, budget (`None`: the call site's
/// bucket), breaker, `retry_if`, concurrency limit.
pub(crate) type SlotSet<I, C, R, H, B, K, O, L> = (I, C, R, H, Option<B>, K, O, L);

/// A spec taken apart: its head and its slots.
pub(crate) type Apart<'a, I, C, R, H, B, K, O, L> = (Head<'a>, SlotSet<I, C, R, H, B, K, O, L>);

impl<'a, I, C, R, H, B, K, O, L> Retry<'a, I, C, R, H, B, K, O, L> {
    /// The spec taken apart into its head and its slots: with
    /// [`from_slots`](Self::from_slots), the one place its fields are
    /// listed. A setter that changes a slot's type takes the spec apart and
    /// puts it together with the new slot.
    #[inline]
    pub(crate) fn into_slots(self) -> Apart<'a, I, C, R, H, B, K, O, L> {
        let Self {
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
        } = self;
        (
            Head {
                policy,
                nested,
                name,
            },
            (
                idempotency,
                classify,
                reconcile,
                on_retry,
                budget,
                breaker,
                retry_if,
                slots,
            ),
        )
    }

    /// The same spec with its slots mapped by `f`: what a setter that
    /// changes one slot (and its type) writes, e.g.
    /// `self.map_slots(|(i, _, r, h, b, k, o, l)| (i, ClassifyWith(f), r, h, b, k, o, l))`.
    #[inline]
    pub(crate) fn map_slots<I2, C2, R2, H2, B2, K2, O2, L2>(
        self,
        f: impl FnOnce(SlotSet<I, C, R, H, B, K, O, L>) -> SlotSet<I2, C2, R2, H2, B2, K2, O2, L2>,
    ) -> Retry<'a, I2, C2, R2, H2, B2, K2, O2, L2> {
        let (head, slots) = self.into_slots();
        Retry::from_slots(head, f(slots))
    }

    /// The spec of `head` with `slots`.
    #[inline]
    pub(crate) fn from_slots(
        head: Head<'a>,
        (idempotency, classify, reconcile, on_retry, budget, breaker, retry_if, slots): SlotSet<
            I,
            C,
            R,
            H,
            B,
            K,
            O,
            L,
        >,
    ) -> Self {
        Self {
            policy: head.policy,
            idempotency,
            classify,
            reconcile,
            on_retry,
            budget,
            breaker,
            nested: head.nested,
            name: head.name,
            retry_if,
            slots,
        }
    }
}
