//! One attempt as a future ([`attempt`], [`RunAttempt`]) and the loop every
//! door expands ([`__retries_drive!`](crate::__retries_drive)).

use std::future::Future;
use std::task::Poll;

use crate::attempt::Attempt;
use crate::scope;

use super::{Limit, Outcome};

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

/// Run one attempt whose body's output is the function's return type `R`:
/// poll once without touching the clock; only a body that suspends gets a
/// timer, armed at the attempt's deadline. Every poll runs inside the
/// attempt's scope, so calls made by the body see its deadline and defer to
/// this loop.
#[inline]
pub fn attempt<R, F>(at: &Attempt, fut: F) -> RunAttempt<'_, F>
where
    R: IsResult,
    F: Future<Output = R>,
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
            at.ended();
            return Poll::Ready(Outcome::Done(r.into_result()));
        }
        let timing = at.timing();
        if this.limit.as_mut().as_pin_mut().is_none() {
            this.limit
                .set(Some(tokio::time::sleep_until(timing.deadline)));
        }
        if let Some(limit) = this.limit.as_pin_mut()
            && limit.poll(cx).is_ready()
        {
            let by = if timing.deadline >= timing.call_deadline {
                Limit::Call
            } else {
                Limit::Attempt
            };
            at.ended();
            return Poll::Ready(Outcome::CutOff(by));
        }
        Poll::Pending
    }
}

/// The loop of one call, written once: `Retry::outcome` and `#[retryable]`
/// both expand it. `$spec` is a `Retry` value, `$ret` the body's output type,
/// `$at` the name the body uses for the attempt. Not public API.
#[doc(hidden)]
#[macro_export]
macro_rules! __retries_drive {
    ($spec:expr, $ret:ty, |$at:ident| $body:expr) => {{
        let mut engine = $crate::private::Engine::new($spec);
        loop {
            let $at = match engine.start() {
                ::core::result::Result::Ok(at) => at,
                ::core::result::Result::Err(stop) => break ::core::result::Result::Err(stop),
            };
            let outcome = $crate::private::attempt::<$ret, _>(&$at, $body).await;
            if let ::core::ops::ControlFlow::Break(done) = engine.settle(&$at, outcome).await {
                break done;
            }
        }
    }};
}
