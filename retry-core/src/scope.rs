//! The retry scope: what code running inside an attempt knows about the loop
//! around it.
//!
//! Every attempt runs inside a scope holding the attempt's deadline (already
//! net of the caller's `reserve`) and the fact that a loop above owns retries.
//! A retried call started inside a scope:
//!
//! * takes `min(its own deadline, the scope's deadline)`, so an inner call never
//!   runs past the outer attempt, nor into the outer caller's reserve;
//! * with [`Nested::Defer`] (the default), makes exactly one attempt and
//!   returns its error unchanged, so only the outermost loop retries: three
//!   layers that each allow 3 attempts make 3 bottom-level calls, not 27;
//! * with [`Nested::Own`], retries as configured (still within the deadline).
//!
//! Plain async code reads the scope with [`deadline`] and [`remaining`] to
//! bound its own work. The scope follows the task's call stack; a task spawned
//! from inside an attempt does not inherit it unless its future is wrapped in
//! [`inherit`]. A server can install an incoming deadline (gRPC's
//! `grpc-timeout`) as the scope of a handler with [`with_deadline`].
//!
//! Dropping the outermost future drops everything beneath it: the running
//! attempt, any inner call and any pause; nothing keeps running after the
//! caller left.
//!
//! # Which code is "inside" an attempt
//!
//! The scope is a property of *polling*, not of where a future was created:
//! code runs inside the attempt whose body is polling it. Two consequences,
//! decided this way on purpose:
//!
//! * **A future polled on behalf of others** (a shared future such as
//!   `futures::Shared`, a cache fill that several callers await, or an
//!   executor that polls inline) runs inside whichever attempt polls it, so a
//!   retried call in it defers to that attempt and takes its deadline, even
//!   though the work is not that attempt's own. Wrap such a future in
//!   [`detach`]: it then runs in no scope, and the calls it makes own their
//!   retries and their deadlines.
//! * **A task spawned with [`inherit`]** shares the attempt's deadline, and
//!   defers to the attempt's loop only *while that attempt runs*: once the
//!   attempt has ended (its body returned, was cut off, or was dropped), no
//!   loop is left to retry for the task, so its calls own their retries again
//!   (still bounded by the inherited deadline).
//!
//! ```
//! use std::time::Duration;
//! use retries::{Attempt, Policy, scope};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let policy = Policy::new(Duration::from_secs(1)).with_reserve(Duration::from_millis(200));
//! let left: Result<_, std::io::Error> = retries::call(&policy)
//!     .idempotent()
//!     .run(async |_: &Attempt| Ok(scope::remaining()))
//!     .await;
//! assert_eq!(left.unwrap(), Some(Duration::from_millis(800)));
//! assert_eq!(scope::remaining(), None); // outside any attempt
//! # }
//! ```

use std::future::Future;
use std::time::{Duration, Instant};

use crate::attempt::{Attempt, Owner};

/// What a retried call does when it starts inside another one's attempt.
/// More modes may be added, so a `match` needs a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Nested {
    /// Make exactly one attempt and return its error unchanged: the outer loop
    /// decides whether to retry. The default.
    #[default]
    Defer,
    /// Retry as configured, within the outer attempt's deadline.
    Own,
}

// The current scope is the running attempt, made visible for the duration of
// each poll of its body: nested calls read the attempt's own (lazily fixed)
// deadline, so both layers agree without copying anything.
//
// A scoped thread-local (`scoped-tls`: a `const`-initialised pointer set only
// for the extent of a closure that borrows the attempt, restored on unwind).
// Issue 58: the core keeps no `unsafe` of its own here; the hand-written
// pointer this replaces did the same work in the same instructions.
scoped_tls::scoped_thread_local!(static CURRENT: Attempt);

/// Run `f` (one poll of an attempt's body) with `at` as the current scope.
#[inline]
pub(crate) fn enter<R>(at: &Attempt, f: impl FnOnce() -> R) -> R {
    CURRENT.set(at, f)
}

/// Run `f` outside any scope.
#[cfg(feature = "stream")]
pub(crate) fn leave<R>(f: impl FnOnce() -> R) -> R {
    if CURRENT.is_set() {
        enter(&Attempt::none(crate::time::now()), f)
    } else {
        f()
    }
}

/// Read the current scope's attempt, if any.
#[inline]
fn with_current<R>(f: impl FnOnce(&Attempt) -> R) -> Option<R> {
    if !CURRENT.is_set() {
        return None;
    }
    CURRENT.with(|at| (!at.is_none()).then(|| f(at)))
}

/// The current scope's deadline and ownership, fixing the deadline now if the
/// enclosing attempt has not read the clock yet.
#[inline]
pub(crate) fn current() -> Option<(Instant, bool)> {
    with_current(|at| (at.deadline(), at.owns_retries()))
}

/// Mark the enclosing attempt, if any: a non-idempotent call inside it ended
/// with an unresolved unknown outcome.
pub(crate) fn mark_unknown_effect() {
    with_current(Attempt::mark_unknown_effect);
}

/// Mark the enclosing attempt, if any: a call inside it gave up after
/// retrying, or its server said not to retry (what a server layer's answer
/// passes on).
pub(crate) fn mark_gave_up() {
    with_current(Attempt::mark_gave_up);
}

/// The deadline of the enclosing attempt (or of [`with_deadline`]), if any.
#[must_use]
pub fn deadline() -> Option<Instant> {
    with_current(|at| (!at.is_unbounded()).then(|| at.deadline())).flatten()
}

/// Time left before the enclosing deadline, if there is one (zero once it
/// has passed).
#[must_use]
pub fn remaining() -> Option<Duration> {
    deadline().map(|d| d.saturating_duration_since(crate::time::now()))
}

/// `true` inside an attempt of a retry loop: a retried call started here
/// defers to it (unless it says [`Nested::Own`]).
#[must_use]
pub fn owned_by_outer_loop() -> bool {
    current().is_some_and(|(_, owner)| owner)
}

/// Carry the current scope into `fut`, typically a future handed to
/// `tokio::spawn`: calls made by it are bounded by the same deadline, and defer
/// to the same loop while the attempt that spawned it runs (after that, they
/// own their retries; see the [module docs](self)). Outside any scope, `fut`
/// runs without one.
///
/// ```
/// use std::time::Duration;
/// use retries::{Attempt, Policy, scope};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let policy = Policy::new(Duration::from_secs(1));
/// let r: Result<_, std::io::Error> = retries::call(&policy)
///     .idempotent()
///     .run(async |_: &Attempt| {
///         let plain = tokio::spawn(async { scope::remaining() });
///         let carried = tokio::spawn(scope::inherit(async { scope::remaining() }));
///         Ok((plain.await.unwrap(), carried.await.unwrap()))
///     })
///     .await;
/// assert_eq!(r.unwrap(), (None, Some(Duration::from_secs(1))));
/// # }
/// ```
pub fn inherit<F: Future>(fut: F) -> Scoped<F> {
    let scope = with_current(|at| Attempt::fixed(at.deadline(), at.inherited_owner()));
    Scoped {
        scope: scope.map_or(Mode::AsIs, Mode::Enter),
        fut,
    }
}

/// Run `fut` in no scope at all, wherever it is polled: the calls it makes
/// own their retries and their deadlines. For a future that does work on
/// behalf of several callers (a shared future, a cache fill), which would
/// otherwise run inside the attempt of whichever caller polls it.
///
/// ```
/// use std::time::Duration;
/// use retries::{Attempt, Policy, scope};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let policy = Policy::new(Duration::from_secs(1));
/// let r: Result<_, std::io::Error> = retries::call(&policy)
///     .idempotent()
///     .run(async |_: &Attempt| Ok((scope::remaining(), scope::detach(async { scope::remaining() }).await)))
///     .await;
/// assert_eq!(r.unwrap(), (Some(Duration::from_secs(1)), None));
/// # }
/// ```
pub fn detach<F: Future>(fut: F) -> Scoped<F> {
    Scoped {
        scope: Mode::Leave(Attempt::none(crate::time::now())),
        fut,
    }
}

/// Run `fut` with `deadline` as its scope (the earlier of it and any enclosing
/// scope's). Retried calls inside keep their own retries (the loop that set
/// the deadline is in another process), bounded by it, unless an enclosing
/// attempt's loop owns them. Meant for servers: the tonic integration
/// installs a request's `grpc-timeout` this way.
pub fn with_deadline<F: Future>(deadline: Instant, fut: F) -> Scoped<F> {
    let scope =
        with_current(|at| Attempt::fixed(at.deadline().min(deadline), at.inherited_owner()))
            .unwrap_or_else(|| Attempt::fixed(deadline, Owner::Nobody));
    Scoped {
        scope: Mode::Enter(scope),
        fut,
    }
}

/// How a [`Scoped`] future is polled.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one per scoped future, never moved after it is pinned
enum Mode {
    /// In whatever scope polls it.
    AsIs,
    /// Inside this scope.
    Enter(Attempt),
    /// Outside any scope: this mark ([`Attempt::none`]) hides the scope
    /// around it.
    Leave(Attempt),
}

pin_project_lite::pin_project! {
    /// A future run inside a scope, or outside any: made by [`inherit`],
    /// [`with_deadline`] and [`detach`].
    #[must_use = "futures do nothing unless awaited"]
    pub struct Scoped<F> {
        scope: Mode,
        #[pin]
        fut: F,
    }
}

impl<F: Future> Future for Scoped<F> {
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let this = self.project();
        match this.scope {
            Mode::Enter(scope) | Mode::Leave(scope) => enter(scope, || this.fut.poll(cx)),
            Mode::AsIs => this.fut.poll(cx),
        }
    }
}

impl<F> std::fmt::Debug for Scoped<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let deadline = match &self.scope {
            Mode::Enter(scope) => Some(scope.deadline()),
            Mode::AsIs | Mode::Leave(_) => None,
        };
        f.debug_struct("Scoped")
            .field("deadline", &deadline)
            .finish_non_exhaustive()
    }
}
