//! Items used by the code `#[retryable]` generates. Not public API: reached
//! through `retries::__private`, free to change in any release.

use std::future::{Future, Ready, ready};

use crate::attempt::IdempotencyKey;
use crate::builder::call;
use crate::failure::{Failure, Stopped};
use crate::observe::Name;
use crate::policy::{Policy, PolicyError};
use crate::spec::{Retry, RetryEvent};
use crate::verdict::Verdict;

#[cfg(feature = "tokio")]
pub use crate::__retries_drive as drive;
pub use crate::__retries_drive_blocking as drive_blocking;
pub use crate::engine::{Engine, IsResult, Step, attempt_blocking, sleep_until};
#[cfg(feature = "tokio")]
pub use crate::engine::{Timer, attempt};
#[path = "private/lit.rs"]
pub mod lit;
pub use lit::{Lit, LitAll};

pub use crate::__retries_name as name;
pub use crate::observe::keys::{Keys, Labels};

/// The `&'static Name` of a `#[retryable]` fn: a `static` made at compile
/// time, and, with the `metrics` feature, the `static` keys of its happy
/// path over its labels (without the feature the keys are nothing, and
/// their `static` would only cost each fn's compilation: 1.3 % of a crate
/// of 200 annotated fns, `scripts/compile-time.sh --instructions`).
#[cfg(feature = "metrics")]
#[doc(hidden)]
#[macro_export]
macro_rules! __retries_name {
    ($name:expr) => {{
        static __RETRIES_NAME: $crate::observe::Name =
            $crate::observe::Name::new($name).with_keys(&__RETRIES_KEYS);
        static __RETRIES_KEYS: $crate::__private::Keys =
            $crate::__private::Keys::new(__RETRIES_NAME.labels());
        &__RETRIES_NAME
    }};
}

/// See the `metrics` form above.
#[cfg(not(feature = "metrics"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __retries_name {
    ($name:expr) => {{
        static __RETRIES_NAME: $crate::observe::Name = $crate::observe::Name::new($name);
        &__RETRIES_NAME
    }};
}
pub use crate::spec::slots::Resolved;
pub use crate::time::BlockingClock;

/// Without the `tokio` feature an `async fn` cannot be retried: say so where
/// the attribute is.
#[cfg(not(feature = "tokio"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __retries_no_async {
    ($($t:tt)*) => {
        ::core::compile_error!(
            "`#[retryable]` on an `async fn` needs the `tokio` feature of `retries` (on by default); without it, only blocking `fn`s can be retried"
        )
    };
}
#[cfg(not(feature = "tokio"))]
pub use crate::__retries_no_async as drive;

/// The first return edge of a `#[retryable]` body, `if false { return
/// fake_return::<R>(); }`: it makes the body's output `R` before the body
/// is checked, so that its `return`s and `?`s coerce as in the function
/// itself. Never called.
#[must_use]
pub fn fake_return<T>() -> T {
    unreachable!("the fake return edge of `#[retryable]` is never taken")
}

/// What the body of a hedged copy reads of its attempt: a copy it owns.
#[must_use]
pub fn snapshot(at: &crate::Attempt) -> crate::Attempt {
    at.snapshot()
}

/// Wrap a `reconcile = …` value of a blocking function, its types taken from
/// the return type `R`.
pub fn reconcile_blocking<R, F>(f: F) -> F
where
    R: IsResult,
    F: FnMut(IdempotencyKey) -> Result<Option<R::Ok>, R::Err>,
{
    f
}

/// The return value of a blocking function with `recover`: the value, or
/// what the hook (a plain function) makes of the stop.
pub fn recover_blocking<R, F>(r: Result<R::Ok, Failure<R::Err>>, hook: F) -> R
where
    R: IsResult,
    F: FnOnce(Failure<R::Err>) -> R,
{
    match r {
        Ok(v) => R::from_result(Ok(v)),
        Err(f) => hook(f),
    }
}
pub use std::time::Duration;

/// The description of a `#[retryable]` call: [`call`] under the function's
/// own name (and so its own default budget).
#[inline]
pub fn spec<'a>(policy: &'a Policy, name: &'static Name) -> Retry<'a> {
    call(policy).name(name)
}

/// Check a `budget = …` value; spanned on it, so a value that is not a
/// budget is reported there first. The opaque result keeps rustc's later
/// reports of the same fault to the same message (not "the method `settle`
/// exists but its trait bounds were not satisfied" on the engine's type).
#[inline]
pub fn budget<B: crate::Budget + ?Sized>(b: &B) -> impl crate::Budget + '_ {
    b
}

/// Check a `breaker = …` value, as [`budget`].
#[inline]
pub fn breaker<K: crate::breaker::Breaker + ?Sized>(k: &K) -> impl crate::breaker::Breaker + '_ {
    k
}

/// Check a `concurrency = …` value, as [`budget`].
#[cfg(feature = "tokio")]
#[inline]
pub fn concurrency(l: &crate::limit::Concurrency) -> &crate::limit::Concurrency {
    l
}

/// Check a `rate_limit = …` value, as [`budget`].
#[cfg(feature = "tokio")]
#[inline]
pub fn rate_limit(l: &crate::limit::RateLimit) -> &crate::limit::RateLimit {
    l
}

/// Wrap a `classify = …` value, with its argument type the function's error
/// type `E` (so closures need no annotation).
pub fn classify<E, F: Fn(&E) -> Verdict>(f: F) -> F {
    f
}

/// Wrap a `reconcile = …` value, its types taken from the return type `R`.
pub fn reconcile<R, F, Fut>(f: F) -> F
where
    R: IsResult,
    F: FnMut(IdempotencyKey) -> Fut,
    Fut: Future<Output = Result<Option<R::Ok>, R::Err>>,
{
    f
}

/// Check an `on_retry = …` value, its error type the function's error type `E`.
pub fn on_retry<E, F: FnMut(&RetryEvent<'_, E>)>(f: F) -> F {
    f
}

/// The error type can stand for a stopped call: `From<Stopped>`. One of the
/// two bounds of [`finish`], each with its own message, so that a generic
/// error type missing the other one is not told it lacks this one.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot report a stopped call: it does not implement `From<retries::Stopped>`",
    label = "the error type of this `#[retryable]` function",
    note = "add a variant such as `#[error(transparent)] Stopped(#[from] retries::Stopped)` to the error type, or pass `recover = …` to handle every stop yourself"
)]
pub trait FromStopped: From<Stopped> {}
impl<E: From<Stopped>> FromStopped for E {}

/// The error type can be the `source()` of a [`Stopped`] (which keeps the
/// last attempt's error): an `Error + Send + Sync + 'static`. The other
/// bound of [`finish`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the source of a stopped call: it must be a `std::error::Error + Send + Sync + 'static`",
    label = "the error type of this `#[retryable]` function",
    note = "a `retries::Stopped` keeps the last attempt's error as its `source()`; bound a generic error type with `std::error::Error + Send + Sync + 'static` as well as `From<retries::Stopped>`, or pass `recover = …` to handle every stop yourself"
)]
pub trait ErrorSource: Into<Box<dyn std::error::Error + Send + Sync>> {}
impl<E: Into<Box<dyn std::error::Error + Send + Sync>>> ErrorSource for E {}

/// The function's return value without `recover`: the value, or the stop
/// mapped by [`Failure::into_error`].
#[inline]
pub fn finish<R>(r: Result<R::Ok, Failure<R::Err>>) -> R
where
    R: IsResult,
    R::Err: FromStopped + ErrorSource,
{
    R::from_result(r.map_err(Failure::into_error))
}

/// Marker: `recover` returns the value.
pub enum SyncRecover {}
/// Marker: `recover` returns a future of the value.
pub enum AsyncRecover {}

/// A `recover` hook producing `R` from a `Failure<E>`, directly or as a future.
#[diagnostic::on_unimplemented(
    message = "`recover` must turn a `retries::Failure<{E}>` into the function's return type `{R}`",
    label = "expected a function `Failure<{E}> -> {R}` (or returning a future of `{R}`)",
    note = "one generic function serves every return type: `fn fallback<T>(f: retries::Failure<MyError>) -> Result<T, MyError>`"
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

/// The function's return value with `recover`: the value, or what the hook
/// makes of the stop.
pub async fn recover<R, F, M>(r: Result<R::Ok, Failure<R::Err>>, hook: F) -> R
where
    R: IsResult,
    F: Recover<R::Err, R, M>,
{
    match r {
        Ok(v) => R::from_result(Ok(v)),
        Err(f) => hook.recover(f).await,
    }
}

/// What a `const` policy breaks, found once at compile time: the first
/// rule it breaks, and the first of the keys the attribute wrote (`given`)
/// that the rule concerns (`None`: none of them, the rule comes from
/// `policy = …`). `None` when the policy is valid.
pub type Broken = Option<(Option<&'static str>, PolicyError)>;

/// Validate a `const` policy once, for [`check`] and [`check_rest`]: one
/// item holding the keys written and the verdict, where each check used to
/// scan a `const` of the keys itself (with the attribute's cheaper look
/// for an `impl` block: 11.79 → 11.56 G of rustc's instructions for 200
/// functions, `scripts/compile-time.sh --instructions`).
#[must_use]
pub const fn broken(policy: &Policy, given: &[&str]) -> Broken {
    broken_by(policy, Written::Names(given))
}

/// The keys an attribute wrote: by name (a `const` policy's), or as the
/// bits of a literal policy's type ([`lit`]).
#[derive(Clone, Copy)]
enum Written<'a> {
    Names(&'a [&'a str]),
    Bits(u32),
}

impl Written<'_> {
    const fn has(self, key: &str) -> bool {
        match self {
            Written::Names(names) => {
                let mut i = 0;
                while i < names.len() {
                    if str_eq(names[i], key) {
                        return true;
                    }
                    i += 1;
                }
                false
            }
            Written::Bits(bits) => lit::written(bits, key),
        }
    }
}

/// [`broken`] for the keys `written`.
const fn broken_by(policy: &Policy, written: Written<'_>) -> Broken {
    match policy.validate() {
        Ok(()) => None,
        Err(e) => Some((blamed(e, written), e)),
    }
}

/// Compile-time check of a `const` policy for one key the attribute wrote:
/// fails (a compile error spanned on that key) when the first rule the
/// policy breaks concerns `key` first among the keys written.
pub const fn check(broken: Broken, key: &str) {
    if let Some((Some(blamed), e)) = broken
        && str_eq(blamed, key)
    {
        panic!("{}", e.message());
    }
}

/// Compile-time check of a `const` policy for the rules that concern none of
/// the keys the attribute wrote (they come from `policy = …`).
pub const fn check_rest(broken: Broken) {
    if let Some((None, e)) = broken {
        panic!("{}", e.message());
    }
}

/// Compile-time check of the breaker rule for `breaker(failure_threshold = …)`.
pub const fn check_breaker(policy: &Policy, failure_threshold: u32) {
    if let Err(e) = policy.check_breaker(failure_threshold) {
        panic!("{}", e.message());
    }
}

/// The first of `e`'s keys that the attribute wrote.
const fn blamed(e: PolicyError, written: Written<'_>) -> Option<&'static str> {
    let keys = e.keys();
    let mut i = 0;
    while i < keys.len() {
        if written.has(keys[i]) {
            return Some(keys[i]);
        }
        i += 1;
    }
    None
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
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
