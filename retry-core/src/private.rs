//! Items used by the code `#[retryable]` generates. Not public API: reached
//! through `retry::__private`, free to change in any release.

use std::future::{Future, Ready, ready};

use crate::attempt::{Attempt, IdempotencyKey};
use crate::call::{ClassifyWith, ReconcileWith, RetryEvent, RunAttempt, run_attempt};
use crate::failure::{Failure, Stopped};
use crate::verdict::Classify;
use crate::verdict::Verdict;

pub use crate::call::{Call, IsResult, NoHook, NoReconcile};
pub use crate::scope::Nested;
pub use std::ops::ControlFlow;
pub use std::time::Duration;

/// Run one attempt whose body's output type is pinned to the function's
/// return type `R` (so `?` and `return` in the body infer as they would in
/// the function).
pub fn run_attempt_as<R, F>(at: &Attempt, fut: F) -> RunAttempt<'_, F>
where
    R: IsResult,
    F: Future<Output = R>,
{
    run_attempt(at, fut)
}

/// Classify with the error type's own `Classify`; spanned on the function's
/// return type, so a missing implementation is reported there, once. (A plain
/// function pointer: classification runs only on the failure path.)
#[must_use]
pub fn by_classify<R>() -> ClassifyWith<fn(&R::Err) -> Verdict>
where
    R: IsResult,
    R::Err: Classify,
{
    ClassifyWith::new(<R::Err as Classify>::classify)
}

/// The default mapping of a stop to the function's error type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot report a stopped call: it does not implement `From<retry::Stopped>`",
    label = "the error type of this `#[retryable]` function",
    note = "add a variant such as `#[error(transparent)] Stopped(#[from] retry::Stopped)` to the error type, or pass `recover = …` to handle every stop yourself"
)]
pub trait FromFailure: Sized {
    /// See [`Failure::into_error`].
    fn from_failure(f: Failure<Self>) -> Self;
}
impl<E> FromFailure for E
where
    E: From<Stopped> + Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn from_failure(f: Failure<Self>) -> Self {
        f.into_error()
    }
}

/// `f.into_error()`, through [`FromFailure`] for a clear diagnostic.
pub fn into_error<E: FromFailure>(f: Failure<E>) -> E {
    E::from_failure(f)
}

/// Marker: `recover` returns the value.
pub enum SyncRecover {}
/// Marker: `recover` returns a future of the value.
pub enum AsyncRecover {}

/// A `recover` hook producing `R` from a `Failure<E>`, directly or as a future.
#[diagnostic::on_unimplemented(
    message = "`recover` must turn a `retry::Failure<{E}>` into the function's return type `{R}`",
    label = "expected a function `Failure<{E}> -> {R}` (or returning a future of `{R}`)",
    note = "one generic function serves every return type: `fn fallback<T>(f: retry::Failure<MyError>) -> Result<T, MyError>`"
)]
pub trait Recover<E, R, M> {
    /// The future of the recovered value.
    type Fut: Future<Output = R>;
    /// Call the hook.
    fn recover(self, f: Failure<E>) -> Self::Fut;
}
impl<F, E, R> Recover<E, R, SyncRecover> for F
where
    F: FnOnce(Failure<E>) -> R,
{
    type Fut = Ready<R>;
    fn recover(self, f: Failure<E>) -> Ready<R> {
        ready(self(f))
    }
}
impl<F, E, R, Fut> Recover<E, R, AsyncRecover> for F
where
    F: FnOnce(Failure<E>) -> Fut,
    Fut: Future<Output = R>,
{
    type Fut = Fut;
    fn recover(self, f: Failure<E>) -> Fut {
        self(f)
    }
}

/// Call a `recover` hook.
pub fn recover<F, E, R, M>(hook: F, f: Failure<E>) -> F::Fut
where
    F: Recover<E, R, M>,
{
    hook.recover(f)
}

/// Wrap a `classify = …` value (so closures get their argument type inferred).
pub fn classify_with<E, F: Fn(&E) -> Verdict>(f: F) -> ClassifyWith<F> {
    ClassifyWith::new(f)
}

/// Wrap a `reconcile = …` value.
pub fn reconcile_with<T, E, F, Fut>(f: F) -> ReconcileWith<F>
where
    F: FnMut(IdempotencyKey) -> Fut,
    Fut: Future<Output = Result<Option<T>, E>>,
{
    ReconcileWith::new(f)
}

/// Check an `on_retry = …` value (so closures get their argument type inferred).
pub fn on_retry_hook<E, F: FnMut(&RetryEvent<'_, E>)>(f: F) -> F {
    f
}

/// A field usable as `#[classify(retry_after)]`: a `Duration` or an
/// `Option<Duration>`.
#[diagnostic::on_unimplemented(
    message = "a `#[classify(retry_after)]` field must be a `Duration` or an `Option<Duration>`, not `{Self}`"
)]
pub trait RetryAfterField {
    /// The pause, if any.
    fn pause(&self) -> Option<Duration>;
}
impl RetryAfterField for Duration {
    fn pause(&self) -> Option<Duration> {
        Some(*self)
    }
}
impl RetryAfterField for Option<Duration> {
    fn pause(&self) -> Option<Duration> {
        *self
    }
}

/// `verdict` with the field's pause, if it has one.
pub fn with_retry_after<F: RetryAfterField + ?Sized>(verdict: Verdict, field: &F) -> Verdict {
    match field.pause() {
        Some(p) => verdict.with_retry_after(p),
        None => verdict,
    }
}
