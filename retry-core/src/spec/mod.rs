//! The call's description: [`Retry`], the value every door builds and the
//! engine reads, and [`RetryEvent`], what its `on_retry` hook is told. Its
//! type parameter is a [`Slots`] of what has been declared (idempotency,
//! classifier, `reconcile`, hook, budget, breaker, `retry_if`, concurrency
//! limit), each a marker type of [`slots`] or a value a setter took, so that
//! a call that sets nothing compiles to no check at all. The setters are
//! written once over [`SlotSet`] (each returns the same slots with one
//! replaced), so the rest of the crate and a user's compile errors name
//! `Retry<'a, S>`, never the eight slots. The setters are the door's, in
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

/// A retried call being described; made by [`call`](crate::call()). Its one
/// type parameter, `S`, records what has been declared: a [`Slots`] whose
/// own parameters are the idempotency, the classifier, `reconcile`, the
/// `on_retry` hook, the budget, the breaker, `retry_if` and the concurrency
/// limit. Users never write it (the setters choose it); a function that
/// takes or returns a described call writes `Retry<'a, S>` with
/// `S: SlotSet`, and a compile error about a call names `Retry<'a, S>`, not
/// eight parameters.
#[must_use = "a `Retry` does nothing until `.run(…)` or `.outcome(…)` is awaited"]
pub struct Retry<'a, S = Slots> {
    pub(crate) head: Head<'a>,
    pub(crate) slots: S,
}

/// What a [`Retry`] has declared, one type parameter per slot: the
/// idempotency (`I`), the classifier (`C`), the `reconcile` look-up (`R`),
/// the `on_retry` hook (`H`), the budget (`B`), the breaker (`K`), the
/// classifier of successful values (`O`) and the concurrency limit (`L`).
/// Each is a marker of the [`slots`] module or a value the setter took;
/// the defaults are what [`call`](crate::call()) starts from (nothing set:
/// no check at all is compiled in), so a described call is named by what
/// it declared:
///
/// ```
/// use std::time::Duration;
/// use retries::{Attempt, Policy, Retry, Slots};
/// use retries::slots::Idempotent;
///
/// /// Every read of the stock service, described once.
/// fn stock_read(policy: &Policy) -> Retry<'_, Slots<Idempotent>> {
///     retries::call(policy).idempotent()
/// }
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let policy = Policy::new(Duration::from_secs(1));
/// let n: Result<u32, std::io::Error> = stock_read(&policy).run(async |_: &Attempt| Ok(7)).await;
/// assert_eq!(n.unwrap(), 7);
/// # }
/// ```
pub struct Slots<
    I = Undeclared,
    C = ByClassify,
    R = NoReconcile,
    H = NoHook,
    B = NoBudget,
    K = NoBreaker,
    O = NoRetryIf,
    L = NoLimit,
> {
    pub(crate) idempotency: I,
    pub(crate) classify: C,
    pub(crate) reconcile: R,
    pub(crate) on_retry: H,
    /// `None`: the default bucket of the call's name.
    pub(crate) budget: Option<B>,
    pub(crate) breaker: K,
    pub(crate) retry_if: O,
    /// The concurrency limit: [`NoLimit`], or a limit.
    pub(crate) limit: L,
}

mod sealed {
    pub trait Sealed {}
    impl<I, C, R, H, B, K, O, L> Sealed for super::Slots<I, C, R, H, B, K, O, L> {}
}

/// The type parameter of a [`Retry`]: its [`Slots`], seen slot by slot.
/// Sealed: [`Slots`] is its one implementation. The associated types are
/// the slots' (named by the letters of [`Slots`]'s parameters); the generic
/// ones are the same slots with one slot replaced, what each setter returns.
pub trait SlotSet: sealed::Sealed + Sized {
    /// The idempotency declared.
    type I;
    /// The classifier.
    type C;
    /// The `reconcile` look-up.
    type R;
    /// The `on_retry` hook.
    type H;
    /// The budget.
    type B;
    /// The breaker.
    type K;
    /// The classifier of successful values (`retry_if`).
    type O;
    /// The concurrency limit.
    type L;
    /// These slots with the idempotency `X`.
    type WithI<X>: SlotSet;
    /// These slots with the classifier `X`.
    type WithC<X>: SlotSet;
    /// These slots with the `reconcile` look-up `X`.
    type WithR<X>: SlotSet;
    /// These slots with the hook `X`.
    type WithH<X>: SlotSet;
    /// These slots with the budget `X`.
    type WithB<X>: SlotSet;
    /// These slots with the breaker `X`.
    type WithK<X>: SlotSet;
    /// These slots with `retry_if` `X`.
    type WithO<X>: SlotSet;
    /// These slots with the concurrency limit `X`.
    type WithL<X>: SlotSet;

    // The `with_*` methods put a slot in and give the one it replaced.

    /// The slots themselves (they are a [`Slots`]).
    #[doc(hidden)]
    fn into_slots(self) -> SlotsOf<Self>;
    #[doc(hidden)]
    fn with_i<X>(self, x: X) -> (Self::WithI<X>, Self::I);
    #[doc(hidden)]
    fn with_c<X>(self, x: X) -> (Self::WithC<X>, Self::C);
    #[doc(hidden)]
    fn with_r<X>(self, x: X) -> (Self::WithR<X>, Self::R);
    #[doc(hidden)]
    fn with_h<X>(self, x: X) -> (Self::WithH<X>, Self::H);
    #[doc(hidden)]
    fn with_b<X>(self, x: Option<X>) -> (Self::WithB<X>, Option<Self::B>);
    #[doc(hidden)]
    fn with_k<X>(self, x: X) -> (Self::WithK<X>, Self::K);
    #[doc(hidden)]
    fn with_o<X>(self, x: X) -> (Self::WithO<X>, Self::O);
    #[doc(hidden)]
    fn with_l<X>(self, x: X) -> (Self::WithL<X>, Self::L);
}

// Each `with_*` moves the other seven slots by name (struct update syntax
// cannot change a field's type): one line of this macro per slot. The
// field names come from the call site with the slot's, so that they are
// the same identifiers to `macro_rules!`' hygiene.
macro_rules! with_slot {
    ([$($all:ident),*] $fn:ident $field:ident $With:ident $arg:ty, $old:ty; $($rest:tt)*) => {
        #[inline]
        fn $fn<X>(self, x: $arg) -> (Self::$With<X>, $old) {
            let Self { $($all),* } = self;
            let old = $field;
            let $field = x;
            (Slots { $($all),* }, old)
        }
        with_slot!([$($all),*] $($rest)*);
    };
    ([$($all:ident),*]) => {};
}

impl<I, C, R, H, B, K, O, L> SlotSet for Slots<I, C, R, H, B, K, O, L> {
    type I = I;
    type C = C;
    type R = R;
    type H = H;
    type B = B;
    type K = K;
    type O = O;
    type L = L;
    type WithI<X> = Slots<X, C, R, H, B, K, O, L>;
    type WithC<X> = Slots<I, X, R, H, B, K, O, L>;
    type WithR<X> = Slots<I, C, X, H, B, K, O, L>;
    type WithH<X> = Slots<I, C, R, X, B, K, O, L>;
    type WithB<X> = Slots<I, C, R, H, X, K, O, L>;
    type WithK<X> = Slots<I, C, R, H, B, X, O, L>;
    type WithO<X> = Slots<I, C, R, H, B, K, X, L>;
    type WithL<X> = Slots<I, C, R, H, B, K, O, X>;

    #[inline]
    fn into_slots(self) -> Self {
        self
    }

    with_slot! {
        [idempotency, classify, reconcile, on_retry, budget, breaker, retry_if, limit]
        with_i idempotency WithI X, I;
        with_c classify WithC X, C;
        with_r reconcile WithR X, R;
        with_h on_retry WithH X, H;
        with_b budget WithB Option<X>, Option<B>;
        with_k breaker WithK X, K;
        with_o retry_if WithO X, O;
        with_l limit WithL X, L;
    }
}

impl<'a, S: SlotSet> Retry<'a, S> {
    /// The spec with its slots as a [`Slots`]: what the engine takes.
    #[inline]
    pub(crate) fn into_spec(self) -> Retry<'a, SlotsOf<S>> {
        Retry {
            head: self.head,
            slots: self.slots.into_slots(),
        }
    }

    /// The spec with its slots changed by `f` (a setter's one line).
    #[inline]
    pub(crate) fn with<S2>(self, f: impl FnOnce(S) -> S2) -> Retry<'a, S2> {
        Retry {
            head: self.head,
            slots: f(self.slots),
        }
    }
}

/// The slots of `S` as a [`Slots`] (which they are: [`SlotSet`] has no
/// other implementation).
pub(crate) type SlotsOf<S> = Slots<
    <S as SlotSet>::I,
    <S as SlotSet>::C,
    <S as SlotSet>::R,
    <S as SlotSet>::H,
    <S as SlotSet>::B,
    <S as SlotSet>::K,
    <S as SlotSet>::O,
    <S as SlotSet>::L,
>;

/// A spec whose slots are written out: what the engine and the doors' seam
/// take (`Retry<'a, Slots<I, C, R, H, B, K, O, L>>`).
pub(crate) type Spec<'a, I, C, R, H, B, K, O, L> = Retry<'a, Slots<I, C, R, H, B, K, O, L>>;

/// What a spec holds besides its slots: the same whichever slots are set.
#[derive(Clone, Copy)]
pub(crate) struct Head<'a> {
    pub(crate) policy: &'a Policy,
    pub(crate) nested: Nested,
    pub(crate) name: &'static Name,
    /// The rate limit and the server's pace every attempt draws from, if
    /// any (values, not slots: they combine with any concurrency limit,
    /// and cost a call without them a branch).
    #[cfg(feature = "tokio")]
    pub(crate) rate: crate::rate::Starts<'a>,
}

/// A spec of `head` with `slots`.
impl<'a, S> Retry<'a, S> {
    #[inline]
    pub(crate) fn from_parts(head: Head<'a>, slots: S) -> Self {
        Self { head, slots }
    }
}
