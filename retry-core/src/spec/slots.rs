//! The slots of a [`Retry`](crate::Retry): the marker types and sealed
//! traits its type parameters take, one per thing a call may declare. Users
//! rarely name them: the setters of [`call`](crate::call()) and the code
//! `#[retryable]` generates choose them. They are public so that a
//! function can take or return a described call, and re-exported from
//! [`builder`](crate::builder), where they used to live.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;

use crate::attempt::IdempotencyKey;
use crate::spec::RetryEvent;
use crate::verdict::{Classify, Verdict};

/// Idempotency not declared yet: [`Retry::run`](crate::Retry::run) is not available.
#[derive(Debug, Clone, Copy)]
pub struct Undeclared;
/// Declared safe to repeat.
#[derive(Debug, Clone, Copy)]
pub struct Idempotent;
/// Declared not safe to repeat blindly.
#[derive(Debug, Clone, Copy)]
pub struct NotIdempotent;
/// Declared at run time, per call: safe to repeat when it holds `true`. The
/// tower layer declares each request this way, by its method.
#[derive(Debug, Clone, Copy)]
pub struct IdempotentIf(pub(crate) bool);

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Idempotent {}
    impl Sealed for super::NotIdempotent {}
    impl Sealed for super::IdempotentIf {}
    impl Sealed for super::ByClassify {}
    impl<F> Sealed for super::ClassifyWith<F> {}
    impl Sealed for super::NoReconcile {}
    impl<F> Sealed for super::ReconcileWith<F> {}
    impl<F> Sealed for super::ReconcileMaybe<F> {}
    impl<F> Sealed for super::ReconcileNow<F> {}
    impl Sealed for super::NoRetryIf {}
    impl Sealed for super::NoLimit {}
    #[cfg(feature = "tokio")]
    impl Sealed for &crate::limit::Concurrency {}
    #[cfg(feature = "tokio")]
    impl Sealed for Option<&crate::limit::Concurrency> {}
    impl<F, T> Sealed for super::RetryIfWith<F, T> {}
    impl<T> Sealed for std::future::Ready<T> {}
    impl<T, E> Sealed for super::NoLookup<T, E> {}
    /// Hooks: [`NoHook`](super::NoHook) and every `FnMut(&RetryEvent<'_, E>)`.
    pub trait SealedHook<E> {}
    impl<E> SealedHook<E> for super::NoHook {}
    impl<E, F: FnMut(&super::RetryEvent<'_, E>)> SealedHook<E> for F {}
}

/// The operation's idempotency has been declared. Sealed.
#[diagnostic::on_unimplemented(
    message = "declare whether the operation is safe to repeat before running it",
    label = "idempotency not declared",
    note = "call `.idempotent()` if repeating the operation is harmless, or `.not_idempotent()` (optionally with `.reconcile(…)`) if it is not"
)]
pub trait Declared: sealed::Sealed {
    /// `true` when the operation is safe to repeat.
    fn is_idempotent(&self) -> bool;
}
impl Declared for Idempotent {
    #[inline]
    fn is_idempotent(&self) -> bool {
        true
    }
}
impl Declared for NotIdempotent {
    #[inline]
    fn is_idempotent(&self) -> bool {
        false
    }
}
impl Declared for IdempotentIf {
    #[inline]
    fn is_idempotent(&self) -> bool {
        self.0
    }
}

/// The declarations after which [`Retry::reconcile`](crate::Retry::reconcile) may be given:
/// [`NotIdempotent`] and [`IdempotentIf`]. Sealed.
#[diagnostic::on_unimplemented(
    message = "`reconcile` is only for operations that are not idempotent",
    label = "declared idempotent here",
    note = "an idempotent operation is simply retried after an unknown outcome; drop `.reconcile(…)`, or declare `.not_idempotent()`"
)]
pub trait MayReconcile: Declared {}
impl MayReconcile for NotIdempotent {}
impl MayReconcile for IdempotentIf {}

/// Classify errors with their [`Classify`] implementation (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct ByClassify;
/// Classify errors with a function; see [`Retry::classify`](crate::Retry::classify).
#[derive(Debug, Clone, Copy)]
pub struct ClassifyWith<F>(pub(crate) F);

impl<F> ClassifyWith<F> {
    /// The classifier `f` (`Fn(&E) -> Verdict`), for a door that wraps the
    /// user's (see [`door::Parts`](crate::door::Parts)).
    pub const fn new(f: F) -> Self {
        Self(f)
    }
}

/// The classifier slot of a [`Retry`](crate::Retry): [`ByClassify`] or [`ClassifyWith`].
/// Sealed.
#[diagnostic::on_unimplemented(
    message = "`{E}` cannot be classified: it does not implement `retries::Classify`",
    label = "the error type of this retried call",
    note = "implement `retries::Classify` for `{E}` (or `#[derive(retries::Classify)]`), or pass a function `&{E} -> Verdict` with `classify`"
)]
pub trait Classifier<E>: sealed::Sealed {
    /// The verdict for `e`.
    fn verdict(&self, e: &E) -> Verdict;
}
impl<E: Classify> Classifier<E> for ByClassify {
    #[inline]
    fn verdict(&self, e: &E) -> Verdict {
        e.classify()
    }
}
impl<E, F: Fn(&E) -> Verdict> Classifier<E> for ClassifyWith<F> {
    #[inline]
    fn verdict(&self, e: &E) -> Verdict {
        (self.0)(e)
    }
}

/// No `reconcile` (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoReconcile;
/// A `reconcile` function; see [`Retry::reconcile`](crate::Retry::reconcile).
#[derive(Debug, Clone, Copy)]
pub struct ReconcileWith<F>(pub(crate) F);

impl<F> ReconcileWith<F> {
    /// The look-up `f` (`FnMut(IdempotencyKey) -> impl Future<Output =
    /// Result<Option<T>, E>>`), for a door that puts its own in front of the
    /// user's (see [`door::Parts`](crate::door::Parts)).
    pub const fn new(f: F) -> Self {
        Self(f)
    }
}

/// The `reconcile` slot: [`NoReconcile`], or [`ReconcileWith`] around any
/// `FnMut(IdempotencyKey) -> impl Future<Output = Result<Option<T>, E>>` (an
/// `async` closure or a closure calling an `async fn`). Whether a call has a
/// reconcile function is known from this type alone. Sealed.
pub trait Reconciler<T, E>: sealed::Sealed {
    /// The future of one look-up.
    type Fut: Future<Output = Result<Option<T>, E>>;
    /// `false` for [`NoReconcile`]: [`lookup`](Self::lookup) never starts
    /// one (a door can skip what only a look-up would need).
    #[doc(hidden)]
    const LOOKS_UP: bool = true;
    /// Start a look-up for `key`; `None` when there is no function.
    fn lookup(&mut self, key: IdempotencyKey) -> Option<Self::Fut>;
}
impl<T, E> Reconciler<T, E> for NoReconcile {
    type Fut = NoLookup<T, E>;
    const LOOKS_UP: bool = false;
    #[inline]
    fn lookup(&mut self, _: IdempotencyKey) -> Option<Self::Fut> {
        None
    }
}

/// The look-up of [`NoReconcile`]: there is none, and no value of this type
/// exists. Code that knows a call has no `reconcile` needs no branch for
/// one (the loop `#[retryable]` expands for such a function has none).
pub struct NoLookup<T, E>(std::convert::Infallible, PhantomData<fn() -> (T, E)>);

impl<T, E> NoLookup<T, E> {
    /// A value of any type: this can never be called, since no `NoLookup`
    /// exists.
    #[must_use]
    pub fn absurd<X>(self) -> X {
        match self.0 {}
    }
}

impl<T, E> fmt::Debug for NoLookup<T, E> {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {}
    }
}

impl<T, E> Future for NoLookup<T, E> {
    type Output = Result<Option<T>, E>;
    fn poll(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match self.0 {}
    }
}

/// A look-up whose answer is known when it is asked for (a blocking
/// `reconcile`, or none): what the blocking loop can run. Sealed.
pub trait Resolved<T>: sealed::Sealed {
    /// The answer.
    fn resolved(self) -> T;
}
impl<T> Resolved<T> for std::future::Ready<T> {
    #[inline]
    fn resolved(self) -> T {
        self.into_inner()
    }
}
impl<T, E> Resolved<Result<Option<T>, E>> for NoLookup<T, E> {
    fn resolved(self) -> Result<Option<T>, E> {
        self.absurd()
    }
}
impl<T, E, F, Fut> Reconciler<T, E> for ReconcileWith<F>
where
    F: FnMut(IdempotencyKey) -> Fut,
    Fut: Future<Output = Result<Option<T>, E>>,
{
    type Fut = Fut;
    #[inline]
    fn lookup(&mut self, key: IdempotencyKey) -> Option<Fut> {
        Some((self.0)(key))
    }
}

/// A blocking `reconcile` function; see [`Retry::reconcile_blocking`](crate::Retry::reconcile_blocking).
#[derive(Debug, Clone, Copy)]
pub struct ReconcileNow<F>(pub(crate) F);

impl<T, E, F> Reconciler<T, E> for ReconcileNow<F>
where
    F: FnMut(IdempotencyKey) -> Result<Option<T>, E>,
{
    type Fut = std::future::Ready<Result<Option<T>, E>>;
    #[inline]
    fn lookup(&mut self, key: IdempotencyKey) -> Option<Self::Fut> {
        Some(std::future::ready((self.0)(key)))
    }
}

/// A `reconcile` function that may have nothing to look up for a call
/// (`FnMut(IdempotencyKey) -> Option<impl Future>`): a door's, whose
/// requests allow a look-up or not (see
/// [`Retry::reconcile_maybe`](crate::Retry::reconcile_maybe)).
#[derive(Debug, Clone, Copy)]
pub struct ReconcileMaybe<F>(pub(crate) F);

impl<T, E, F, Fut> Reconciler<T, E> for ReconcileMaybe<F>
where
    F: FnMut(IdempotencyKey) -> Option<Fut>,
    Fut: Future<Output = Result<Option<T>, E>>,
{
    type Fut = Fut;
    #[inline]
    fn lookup(&mut self, key: IdempotencyKey) -> Option<Fut> {
        (self.0)(key)
    }
}

/// Every successful value is a success (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoRetryIf;
/// A classifier of successful values of type `T`; see [`Retry::retry_if`](crate::Retry::retry_if).
pub struct RetryIfWith<F, T>(pub(crate) F, pub(crate) fn(&F, &T) -> Option<Verdict>);

impl<F: std::fmt::Debug, T> std::fmt::Debug for RetryIfWith<F, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RetryIfWith").field(&self.0).finish()
    }
}

/// The `retry_if` slot: [`NoRetryIf`], or [`RetryIfWith`] around any
/// `Fn(&T) -> Option<Verdict>`. Sealed.
pub trait RetryIf<T>: sealed::Sealed {
    /// `Some(verdict)`: treat `value` as a failed attempt with this verdict.
    fn verdict(&self, value: &T) -> Option<Verdict>;
}
impl<T> RetryIf<T> for NoRetryIf {
    #[inline]
    fn verdict(&self, _: &T) -> Option<Verdict> {
        None
    }
}
// No bound on `F` here: the setter that made the value checked it (and
// stored the call), so a closure of the wrong type is reported once, at
// `retry_if`, not again wherever the engine asks for a verdict.
impl<T, F> RetryIf<T> for RetryIfWith<F, T> {
    #[inline]
    fn verdict(&self, value: &T) -> Option<Verdict> {
        (self.1)(&self.0, value)
    }
}

/// No concurrency limit (the default): nothing to check, not even a branch.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoLimit;

/// The concurrency-limit slot of a [`Retry`](crate::Retry): [`NoLimit`], or (with
/// `tokio`) a [`Concurrency`](crate::limit::Concurrency) given by
/// [`Retry::concurrency`](crate::Retry::concurrency). Known from the type, so a call without a limit
/// compiles to no check at all. Sealed.
pub trait LimitSlot<'a>: sealed::Sealed {
    /// The limit, if any.
    #[cfg(feature = "tokio")]
    fn limit(&self) -> Option<&'a crate::limit::Concurrency>;
}
// Without tokio the trait has no method, so `'a` is not used.
#[cfg_attr(not(feature = "tokio"), allow(clippy::elidable_lifetime_names))]
impl<'a> LimitSlot<'a> for NoLimit {
    #[cfg(feature = "tokio")]
    #[inline]
    fn limit(&self) -> Option<&'a crate::limit::Concurrency> {
        None
    }
}
#[cfg(feature = "tokio")]
impl<'a> LimitSlot<'a> for &'a crate::limit::Concurrency {
    #[inline]
    fn limit(&self) -> Option<&'a crate::limit::Concurrency> {
        Some(self)
    }
}
#[cfg(feature = "tokio")]
impl<'a> LimitSlot<'a> for Option<&'a crate::limit::Concurrency> {
    #[inline]
    fn limit(&self) -> Option<&'a crate::limit::Concurrency> {
        *self
    }
}

/// No `on_retry` hook (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHook;

/// The `on_retry` slot of a [`Retry`](crate::Retry): [`NoHook`] and every
/// `FnMut(&RetryEvent<'_, E>)`. Sealed.
pub trait OnRetry<E>: sealed::SealedHook<E> {
    /// `false` for [`NoHook`]: no event is built for it.
    const ACTIVE: bool = true;
    /// Called before each pause.
    fn on_retry(&mut self, event: &RetryEvent<'_, E>);
}
impl<E> OnRetry<E> for NoHook {
    const ACTIVE: bool = false;
    #[inline]
    fn on_retry(&mut self, _: &RetryEvent<'_, E>) {}
}
impl<E, F: FnMut(&RetryEvent<'_, E>)> OnRetry<E> for F {
    #[inline]
    fn on_retry(&mut self, event: &RetryEvent<'_, E>) {
        self(event);
    }
}
