//! The loop that awaits one future a turn, `#[retryable]`'s
//! ([`__retries_drive!`](crate::__retries_drive)'s `@turn` forms): the
//! pause the settle step asks for is armed on the call's timer
//! ([`Timer::pause_next`]), and the next turn's attempt future waits it out
//! and returns [`Outcome::Paused`] without running its body; the attempt
//! after it is admitted on the turn that follows. The order stays settle,
//! pause, admit, attempt, with one `.await` in each generated function
//! where the loop of the doors has two.
//!
//! Why: rustc's work for a function grows with every suspension point and
//! every call in the coroutine it builds. For 200 `#[retryable]` functions
//! (`scripts/compile-time.sh --instructions`), the pause's own `.await` was
//! 0.5 G of rustc's 10.8 G instructions, and each call the loop makes in
//! the function ~0.07 G: the methods here make the loop of a function that
//! neither names its attempt nor reconciles two calls and one `.await`. At
//! run time a call that succeeds first time pays two tests of a flag.

use std::pin::Pin;
use std::time::Instant;

use super::run::Timer;
use super::{Engine, Outcome, Step};
use crate::breaker::Breaker;
use crate::budget::Budget;
use crate::failure::Failure;
use crate::spec::slots::{Classifier, Declared, LimitSlot, NoLookup, OnRetry, Reconciler, RetryIf};

impl<'a, E, I, C, R, H, B, K, O, L> Engine<'a, E, I, C, R, H, B, K, O, L>
where
    I: Declared,
    B: Budget,
    K: Breaker,
    L: LimitSlot<'a>,
{
    /// [`admit`](Self::admit) on a turn: while the call pauses before its
    /// next attempt, nothing is admitted (that turn's future waits out the
    /// pause and runs no body); the attempt is admitted on the turn after
    /// it, once the pause is over.
    #[allow(clippy::inline_always)]
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub fn admit_next(&mut self) -> Result<(), Failure<E>> {
        if self.at.pausing() {
            return Ok(());
        }
        self.admit()
    }

    /// The pause the settle step asked for, if any, armed on the call's
    /// timer for the next turn to wait out.
    #[inline]
    pub fn pause_next(&self, timer: Pin<&mut Timer>, until: Option<Instant>) {
        timer.pause_next(&self.at, until);
    }

    /// [`settle`](Self::settle) on a turn of a call without `reconcile`:
    /// the call's result, or `None` with the pause before the next attempt
    /// armed ([`pause_next`](Self::pause_next)).
    #[allow(clippy::inline_always)]
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub fn settle_turn<T>(
        &mut self,
        outcome: Outcome<T, E>,
        timer: Pin<&mut Timer>,
    ) -> Option<Result<T, Failure<E>>>
    where
        C: Classifier<E>,
        R: Reconciler<T, E, Fut = NoLookup<T, E>>,
        H: OnRetry<E>,
        O: RetryIf<T>,
    {
        match self.settle(outcome) {
            Step::Done(done) => Some(done),
            Step::Retry(until) => {
                self.pause_next(timer, until);
                None
            }
            Step::Reconcile(never, _) => never.absurd(),
        }
    }
}
