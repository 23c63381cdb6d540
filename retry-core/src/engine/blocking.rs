//! The blocking door: one attempt as a plain call ([`attempt_blocking`]),
//! pauses with `std::thread::sleep` ([`sleep_until`]), and the loop
//! ([`__retries_drive_blocking!`](crate::__retries_drive_blocking)), which
//! drives the same engine as the async loop. Nothing here needs tokio.
//!
//! What differs from the async door, and only this: an attempt cannot be cut
//! off mid-way (a thread cannot be cancelled), so `attempt_timeout` is not
//! enforced (the macro refuses it on a blocking `fn`); the deadline is
//! checked before every attempt and pause, and an attempt that fails after
//! it has passed ends the call with `DeadlineExceeded`. A `reconcile`
//! look-up runs to its end and its answer is used. And the call reads the
//! system clock, even inside a runtime whose clock is paused: it sleeps the
//! thread, which that clock would not see (see `time`).

use std::time::Instant;

use crate::attempt::Attempt;
use crate::scope;

use super::{IsResult, Observed, Outcome};

/// Run one attempt of a blocking body, inside the attempt's scope (so the
/// calls it makes see its deadline and defer to this loop) and the call's span.
#[inline]
pub fn attempt_blocking<R: IsResult>(
    at: &Attempt,
    observed: Observed<'_>,
    body: impl FnOnce() -> R,
) -> Outcome<R::Ok, R::Err> {
    #[cfg(feature = "tracing")]
    let _span = observed.span.map(tracing::Span::enter);
    #[cfg(not(feature = "tracing"))]
    let _ = observed;
    let r = scope::enter(at, body);
    at.ended();
    Outcome::Done(r.into_result())
}

/// Block the thread until `until` (at once if it has passed).
pub fn sleep_until(until: Instant) {
    let left = until.saturating_duration_since(crate::time::now());
    if !left.is_zero() {
        std::thread::sleep(left);
    }
}

/// The blocking loop of one call, written once: `Retry::run_blocking` and
/// `#[retryable]` on a non-async `fn` both expand it. Not public API.
#[doc(hidden)]
#[macro_export]
macro_rules! __retries_drive_blocking {
    ($spec:expr, $ret:ty, |$at:ident| $body:expr) => {{
        // The system clock, whatever runtime this thread is in: the loop
        // sleeps the thread (see `time`).
        let _clock = $crate::__private::BlockingClock::enter();
        let mut engine = $crate::__private::Engine::new($spec);
        'slot: {
            // A free slot of a concurrency limit, or none: a thread does not queue.
            if let ::core::result::Result::Err(stop) = engine.slot_now() {
                break 'slot ::core::result::Result::Err(stop);
            }
            'call: loop {
                if let ::core::result::Result::Err(stop) = engine.admit() {
                    break ::core::result::Result::Err(stop);
                }
                let $at = engine.attempt();
                let outcome =
                    $crate::__private::attempt_blocking::<$ret>($at, engine.observed(), || $body);
                let pause = match engine.settle(outcome) {
                    $crate::__private::Step::Done(done) => break 'call done,
                    $crate::__private::Step::Retry(until) => until,
                    $crate::__private::Step::Reconcile(lookup, held) => {
                        let answer = $crate::__private::Resolved::resolved(lookup);
                        match engine.reconciled(::core::option::Option::Some(answer), held) {
                            $crate::__private::Step::Done(done) => break 'call done,
                            $crate::__private::Step::Retry(until) => until,
                            $crate::__private::Step::Reconcile(never, _) => match never {},
                        }
                    }
                };
                if let ::core::option::Option::Some(until) = pause {
                    $crate::__private::sleep_until(until);
                }
            }
        }
    }};
}
