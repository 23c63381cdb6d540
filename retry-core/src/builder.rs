//! [`call`]: the builder door. [`Retry`] describes one call (policy,
//! idempotency, hooks, budget, breaker, nesting); `.run(…)` drives the same
//! engine as `#[retryable]`, with the same defaults and rules.
//!
//! # The decision after a failed attempt
//!
//! | verdict | idempotent | `reconcile` given | what happens |
//! |---|---|---|---|
//! | `Permanent` | any | any | stop with [`Reason::Permanent`](crate::Reason::Permanent) |
//! | `NotExecuted` | any | any | retry (subject to attempts, deadline, budget) |
//! | `Unknown` | yes | — | retry (subject to attempts, deadline, budget) |
//! | `Unknown` | no | yes | `reconcile(key)`: `Ok(Some(v))` → the work was done, return `Ok(v)`; `Ok(None)` → it was not, retry as `NotExecuted`; `Err(_)` → stop with [`Reason::UnknownOutcome`](crate::Reason::UnknownOutcome) |
//! | `Unknown` | no | no | stop with [`Reason::UnknownOutcome`](crate::Reason::UnknownOutcome) |
//!
//! `reconcile` is consulted after every unknown outcome, the last allowed
//! attempt included: it can still turn the call into a success. It runs within
//! the call's deadline; if the deadline passes first, the call stops with
//! [`Reason::DeadlineExceeded`](crate::Reason::DeadlineExceeded).
//!
//! # Order of the checks before a retry
//!
//! 1. attempts left, else [`Reason::Exhausted`](crate::Reason::Exhausted);
//! 2. the pause: the server's `retry_after` if the verdict has one (and the
//!    backoff sequence restarts after it), else the next backoff delay;
//! 3. the pause plus `min_attempt` must end before the deadline less the
//!    reserve, else [`Reason::PauseExceedsDeadline`](crate::Reason::PauseExceedsDeadline) at once, without sleeping
//!    and before the deadline: the caller gets a [`Stopped`]
//!    that says so, the last error its source (see
//!    [`failure`](crate::failure) for every stop), and [`Failure::refused_pause`](crate::Failure::refused_pause)
//!    says how long the pause was (and whether the server asked for it) and
//!    how much time was left;
//! 4. the budget must allow the retry, else [`Reason::BudgetExhausted`](crate::Reason::BudgetExhausted) (at once:
//!    a refused retry never becomes a zero-delay retry);
//! 5. the `on_retry` hook runs, then the pause.
//!
//! # Deadlines
//!
//! An attempt runs until `min(start + attempt_timeout, deadline − reserve)`. An
//! attempt still running then is dropped (cancelled). Cut off by its own
//! `attempt_timeout`, its outcome is `Unknown` and the table above applies; cut
//! off by the call's deadline, the call stops with
//! [`Reason::DeadlineExceeded`](crate::Reason::DeadlineExceeded). So does an attempt that fails once the
//! deadline has passed, whatever its error (a server enforcing the propagated
//! deadline answers at that same moment, often with `CANCELLED`); the error is
//! kept as the source. No attempt starts at or after the deadline, nor with
//! less than `min_attempt` before it (a timer that wakes late cannot sneak an
//! attempt in) — the first one included: a call made under a deadline set
//! before it (an enclosing attempt's or server's scope, a request's
//! propagated deadline at a door) whose time is already up stops with
//! `DeadlineExceeded` and 0 attempts, counted in `retry.call.refused`, and
//! sends nothing. Without such a deadline the check reads no clock (the
//! policy's own deadline starts with the call). Dropping the call's future cancels the running attempt or
//! pause at once.
//!
//! # Unknown outcomes compose
//!
//! When a non-idempotent call made inside an attempt ends with an unresolved
//! unknown outcome ([`Reason::UnknownOutcome`](crate::Reason::UnknownOutcome):
//! no `reconcile`, or `reconcile` failed), that attempt is marked in the retry
//! scope. If the attempt then fails transiently, the outer loop treats it as a
//! non-idempotent `Unknown` outcome, whatever the outer call declares: its own
//! `reconcile` if it has one, else it stops with `UnknownOutcome` (and marks
//! its own enclosing attempt in turn). So no layering of idempotent callers
//! replays a non-idempotent effect blindly. A permanent failure stops the
//! outer loop as usual, and a success is a success.
//!
//! # Options on every door
//!
//! One set of call options, and where each can be given (`—`: not there
//! yet; `n/a`: cannot apply, and why).
//!
//! | option | `#[retryable]` | `retries::call` | tower `RetryLayer` | `RetryMiddleware` | streams (`resume`) | `retries-kafka` |
//! |---|---|---|---|---|---|---|
//! | policy: deadline, attempts, attempt timeout, reserve, backoff, jitter | keys, or `policy = P` | `call(&policy)` | `RetryLayer::new(policy)`; a gRPC service config per method | `RetryMiddleware::new(policy)` | the builder's, per reopen; `.deadline(d)` for the whole stream, `.idle(d)` | `.policy(p)` (in process), `.record_deadline(d)` |
//! | idempotency | `idempotent` / `idempotent = false` | `.idempotent()`, `.not_idempotent()`, `.idempotent_if(b)` | by request: `Idempotency` extension, `idempotent_with_header`, `idempotent_when`, the method (RFC 9110), `idempotent_methods` (gRPC) | by request: `Idempotency` extension, `idempotent_with_header`, `idempotent_when`, the method | `.idempotent()` (a reopen reads again) | idempotent unless `.not_idempotent()` |
//! | `reconcile` | `reconcile = \|key\| …` | `.reconcile(f)`, `.reconcile_blocking(f)` | `.reconcile(f)` with `.send_key(h)` | `.reconcile(f)` with `.send_key(h)` | n/a: a reopen is idempotent | `.run_reconciled(h, f)` |
//! | `send_key` | n/a: the body sends `at.idempotency_key()` | n/a: the same | `.send_key(h)` | `.send_key(h)` | n/a | the `retries-key` header, always |
//! | idempotent by key (the key sent, the server deduplicates: unknown outcomes sent again, a 409 waited out, a replay final) | `idempotent` with the body sending `at.idempotency_key()` | `.idempotent()`, the same | `.idempotent_by_key(h)` | `.idempotent_by_key(h)` | n/a | n/a: `reconcile`, or an idempotent handler |
//! | `classify` | `classify = f` | `.classify(f)` | the status tables (HTTP, gRPC), a service config's codes | the HTTP status table | the builder's `.classify(f)` | the handler error's `Classify` |
//! | `retry_if` (a value that is a failed attempt) | `retry_if = f` | `.retry_if(f)` | `.retry_if(f)` on status and headers (else the HTTP or gRPC table) | `.retry_if(f)` on status and headers (else the HTTP table) | n/a: items are data | n/a: the handler's `Result` says it |
//! | `on_retry` | `on_retry = f` | `.on_retry(f)` | `.on_retry(f)` (a `replay::FailedAttempt`) | `.on_retry(f)` (the same) | the builder's | `.after_republish(f)`, `.on_dead_letter(f)` |
//! | budget | `budget = B`, or the function's own | `.budget(b)`, or the name's | `.budget(b)` (before or after `service_config`), or one per layer (a service config's `retryThrottling`; none without it) | `.budget(b)`, or one per middleware | the builder's | `.budget(b)` |
//! | breaker | `breaker(…)`, `breaker = K` | `.breaker(k)` | `.breaker(k)` | `.breaker(k)` | the builder's | `.breaker(k)` (pauses the main topic) |
//! | concurrency | `concurrency = L` | `.concurrency(l)` | `.concurrency(l)` | `.concurrency(l)` | n/a: a slot held for a stream's life is not a limit on calls | `.concurrency(n)`: records in flight, each partition in order |
//! | hedging (a fixed delay, [`Hedging::new`](crate::Hedging::new), or one learned from the site's latencies under a cap on extra load, [`Hedging::learned`](crate::Hedging::learned)) | `hedge(…)`: `delay = "…"` or `learned = DELAY` | `.run_hedged(h, op)`: either | a service config's `hedgingPolicy`: a fixed delay | — (not yet) | n/a: one connection at a time | n/a: a record is handled once per level |
//! | another replica for the next attempt (the endpoints a call tried, read by the balancer) | n/a: the body picks its endpoint (`at.number()`) | n/a: the same | `.avoid_tried()` over a balancer that reads the `Tried` extension (`retries_tower::balance::P2c`; one small allocation per request) | n/a: reqwest has no balancer under it | n/a: the reopen picks | n/a: the broker assigns |
//! | nesting | `nested = "defer"` / `"own"` | `.nested(n)` | the scope of the caller (defers inside an attempt) | the same | the same | n/a: runs on its own |
//! | name (events, metrics, default budget) | the function's path | `.name(&NAME)` | per call: the gRPC method path, or `GET /route` from a `Route` extension or `.route(f)`; else `.name(&NAME)` (at most `observe::MAX_CALL_NAMES` names) | per call: `GET /route` from a `Route` extension or `.route(f)`; else `.name(&NAME)` | the builder's | — (the unnamed default) |
//! | metric names of the conventions (`observe::MetricNames`) | — (`retry.*`) | — (`retry.*`) | `.metric_names(MetricNames::OpenTelemetry)`: A66/A96 (gRPC), `http.client.request.duration` (HTTP) | `.metric_names(…)`: `http.client.request.duration` | — | — |
//! | a request body opened again for each attempt (HTTP: a file, a factory, bytes; nothing held between attempts) | n/a: the body makes what it sends | n/a: the same | a `Reopen` extension: `Reopen::file(path)`, `Reopen::with(f)`, `Reopen::bytes(b)` | the same; `retries_reqwest::multipart(f)` for a form | n/a | n/a: the record is the payload |
//! | a streaming request body copied as it is sent, up to a cap (past it, the call is committed to its attempt) | n/a | n/a | `.body_cap(n)` (64 KiB), a `BodyCap` extension per request | the same (a body of bytes is shared by every attempt, with no cap) | n/a | n/a |
//! | `recover` | `recover = f` | `.outcome(…)` returns the `Failure` | n/a: the answer is the last response | n/a: the same | `failure()` after the end | the dead letter and its reason |
//!
//! # Defaults
//!
//! The defaults are those of [`Policy`] and, for the budget, the token bucket
//! of the call's [`Name`] (see [`budget`](crate::budget)); `#[retryable]`
//! has the same ones.

#[cfg(feature = "tokio")]
use std::future::Future;

use crate::attempt::Attempt;
use crate::breaker::{Breaker, NoBreaker};
use crate::budget::Budget;
use crate::failure::{Failure, Stopped};
use crate::observe::{Name, unnamed};
use crate::policy::Policy;
use crate::scope::Nested;
use crate::verdict::Verdict;

use crate::spec::slots::{
    ByClassify, Classifier, ClassifyWith, Declared, Idempotent, IdempotentIf, LimitSlot,
    MayReconcile, NoHook, NoLimit, NoReconcile, NoRetryIf, NotIdempotent, OnRetry, ReconcileMaybe,
    ReconcileNow, ReconcileWith, Reconciler, Resolved, RetryIf, RetryIfWith, Undeclared,
};
use crate::spec::{Retry, SlotSet, Slots};

/// Start describing a retried call under `policy`. Declare whether the
/// operation is safe to repeat with [`Retry::idempotent`] or
/// [`Retry::not_idempotent`], then [`run`](Retry::run) it.
///
/// ```
/// use std::time::Duration;
/// use retries::{Attempt, Policy};
///
/// const POLICY: Policy = Policy::new(Duration::from_secs(2)).with_max_attempts(3).validated();
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let mut calls = 0;
/// let answer: Result<u32, std::io::Error> = retries::call(&POLICY)
///     .idempotent()
///     .run(async |at: &Attempt| {
///         calls += 1; // `&mut` captures work: the closure is `AsyncFnMut`
///         if at.number() < 3 {
///             Err(std::io::ErrorKind::ConnectionRefused.into()) // not executed: retried
///         } else {
///             Ok(42)
///         }
///     })
///     .await;
/// assert_eq!(answer.unwrap(), 42);
/// assert_eq!(calls, 3);
/// # }
/// ```
///
/// A non-idempotent operation is retried after an unknown outcome only if
/// `reconcile` shows the work was not done:
///
/// ```
/// use std::time::Duration;
/// use retries::{Attempt, IdempotencyKey, Policy, Reason};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let charged = std::sync::Mutex::new(None::<IdempotencyKey>);
/// let policy = Policy::new(Duration::from_secs(2));
/// let receipt = retries::call(&policy)
///     .not_idempotent()
///     .reconcile(async |key| Ok::<_, std::io::Error>((*charged.lock().unwrap() == Some(key)).then_some("receipt")))
///     .run(async |at: &Attempt| {
///         // The charge happens, then the connection breaks before the reply.
///         *charged.lock().unwrap() = Some(at.idempotency_key());
///         Err(std::io::ErrorKind::ConnectionReset.into())
///     })
///     .await;
/// assert_eq!(receipt.unwrap(), "receipt"); // found by its key: no second charge
/// # }
/// ```
#[track_caller]
#[inline]
pub fn call(policy: &Policy) -> Retry<'_> {
    let head = crate::spec::Head {
        policy,
        nested: Nested::Defer,
        name: unnamed(std::panic::Location::caller()),
        #[cfg(feature = "tokio")]
        rate: crate::rate::Starts::default(),
    };
    Retry::from_parts(
        head,
        Slots {
            idempotency: Undeclared,
            classify: ByClassify,
            reconcile: NoReconcile,
            on_retry: NoHook,
            budget: None,
            breaker: NoBreaker,
            retry_if: NoRetryIf,
            limit: NoLimit,
        },
    )
}

impl<'a, S: SlotSet<I = Undeclared>> Retry<'a, S> {
    /// Declare the operation safe to repeat: `Unknown` outcomes are retried.
    pub fn idempotent(self) -> Retry<'a, S::WithI<Idempotent>> {
        self.declare(Idempotent)
    }

    /// Declare the operation not safe to repeat blindly: after an `Unknown`
    /// outcome it is retried only if [`reconcile`](Retry::reconcile) shows that
    /// the work was not done.
    pub fn not_idempotent(self) -> Retry<'a, S::WithI<NotIdempotent>> {
        self.declare(NotIdempotent)
    }

    /// Declare at run time whether the operation is safe to repeat:
    /// `idempotent_if(true)` acts as [`idempotent`](Self::idempotent),
    /// `idempotent_if(false)` as [`not_idempotent`](Self::not_idempotent).
    /// A [`reconcile`](Retry::reconcile) function may be given either way; it
    /// is consulted only when the call is not idempotent.
    ///
    /// ```
    /// use std::time::Duration;
    /// use retries::{Attempt, Policy, Reason};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let policy = Policy::new(Duration::from_secs(1));
    /// let method_is_safe = false; // e.g. a POST
    /// let r = retries::call(&policy)
    ///     .idempotent_if(method_is_safe)
    ///     .outcome(async |_: &Attempt| Err::<(), _>(std::io::Error::from(std::io::ErrorKind::ConnectionReset)))
    ///     .await;
    /// assert_eq!(r.unwrap_err().reason(), Reason::UnknownOutcome); // not replayed
    /// # }
    /// ```
    pub fn idempotent_if(self, idempotent: bool) -> Retry<'a, S::WithI<IdempotentIf>> {
        self.declare(IdempotentIf(idempotent))
    }

    fn declare<I>(self, idempotency: I) -> Retry<'a, S::WithI<I>> {
        self.with(|s| s.with_i(idempotency).0)
    }
}

// `I: MayReconcile` is on each method, not on the block, for the error's
// sake (as `I: Declared` on the run methods): E0277 with the trait's own
// message, not E0599 pointing at the private field of the same name.
impl<'a, S: SlotSet<R = NoReconcile>> Retry<'a, S> {
    /// Resolve unknown outcomes: `f(key)` looks up whether the work of the call
    /// with this idempotency key was done. `Ok(Some(v))`: it was, and `v` is the
    /// call's result; `Ok(None)`: it was not, so it is retried; `Err(_)`: the
    /// call stops with [`Reason::UnknownOutcome`](crate::Reason::UnknownOutcome).
    ///
    /// Only for non-idempotent operations (and those declared at run time with
    /// [`idempotent_if`](Retry::idempotent_if)): an idempotent one is simply
    /// retried.
    pub fn reconcile<F>(self, f: F) -> Retry<'a, S::WithR<ReconcileWith<F>>>
    where
        S::I: MayReconcile,
    {
        self.reconciler(ReconcileWith(f))
    }

    /// [`reconcile`](Self::reconcile) for [`run_blocking`](Retry::run_blocking):
    /// `f(key)` is a plain function returning the answer. It runs to its end
    /// (a thread cannot be cut off) and its answer is used.
    pub fn reconcile_blocking<F>(self, f: F) -> Retry<'a, S::WithR<ReconcileNow<F>>>
    where
        S::I: MayReconcile,
    {
        self.reconciler(ReconcileNow(f))
    }

    fn reconciler<R>(self, reconcile: R) -> Retry<'a, S::WithR<R>> {
        self.with(|s| s.with_r(reconcile).0)
    }
}

impl<'a, S: SlotSet<I = IdempotentIf, R = NoReconcile>> Retry<'a, S> {
    /// A `reconcile` function that may return no look-up (see
    /// [`ReconcileMaybe`]): for a door whose requests each declare their
    /// idempotency ([`idempotent_if`](Self::idempotent_if)) and may or may
    /// not be looked up.
    pub fn reconcile_maybe<F>(self, f: F) -> Retry<'a, S::WithR<ReconcileMaybe<F>>> {
        self.with(|s| s.with_r(ReconcileMaybe(f)).0)
    }
}

impl<'a, S: SlotSet> Retry<'a, S> {
    /// Classify errors with `f` instead of the error type's [`Classify`](crate::Classify).
    pub fn classify<F>(self, f: F) -> Retry<'a, S::WithC<ClassifyWith<F>>> {
        self.with(|s| s.with_c(ClassifyWith(f)).0)
    }

    /// Classify successful values too: `f(&value)` returning `Some(verdict)`
    /// makes the attempt a failure with that verdict, under the same decision
    /// table (a `retry_after` in the verdict sets the pause, as a server hint
    /// does). A poll-until-ready loop, a "not ready yet" answer, a response
    /// object with a 503 in it.
    ///
    /// When the call stops while the last attempt was such a value (attempts
    /// exhausted, the deadline, the budget, a permanent verdict, an unknown
    /// outcome of a non-idempotent call that `reconcile` did not resolve),
    /// that value is the call's `Ok` result: it is a real answer, and the
    /// caller decides what to make of it. A `recover` hook is not called for
    /// it. The `on_retry` hook sees no error for such an attempt.
    ///
    /// ```
    /// use std::time::Duration;
    /// use retries::{Attempt, Backoff, Policy, Verdict};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let policy = Policy::new(Duration::from_secs(10))
    ///     .with_max_attempts(5)
    ///     .with_backoff(Backoff::constant(Duration::from_secs(1)));
    /// // A job that reports "pending" twice, then "done".
    /// let status = retries::call(&policy)
    ///     .idempotent()
    ///     .retry_if(|s: &&str| (*s == "pending").then(Verdict::not_executed))
    ///     .run(async |at: &Attempt| Ok::<_, std::io::Error>(if at.number() < 3 { "pending" } else { "done" }))
    ///     .await;
    /// assert_eq!(status.unwrap(), "done");
    /// # }
    /// ```
    pub fn retry_if<T, F>(self, f: F) -> Retry<'a, S::WithO<RetryIfWith<F, T>>>
    where
        F: Fn(&T) -> Option<Verdict>,
    {
        self.with(|s| s.with_o(RetryIfWith(f, |f: &F, v: &T| f(v))).0)
    }

    /// Call `hook` before each pause with the failed attempt, its verdict and
    /// the pause chosen. The error type is known only from the operation
    /// given to `run`, so a closure names its parameter's type:
    ///
    /// ```
    /// use std::time::Duration;
    /// use retries::{Attempt, Policy, RetryEvent};
    ///
    /// const POLICY: Policy = Policy::new(Duration::from_secs(1));
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let mut pauses = Vec::new();
    /// let mut calls = 0;
    /// let r = retries::call(&POLICY)
    ///     .idempotent()
    ///     .on_retry(|ev: &RetryEvent<'_, std::io::Error>| pauses.push((ev.attempt(), ev.delay())))
    ///     .run(async |_: &Attempt| {
    ///         calls += 1;
    ///         if calls < 3 { Err(std::io::ErrorKind::ConnectionRefused.into()) } else { Ok(calls) }
    ///     })
    ///     .await;
    /// assert_eq!(r.unwrap(), 3);
    /// assert_eq!(pauses.iter().map(|p| p.0).collect::<Vec<_>>(), [1, 2]);
    /// # }
    /// ```
    pub fn on_retry<F>(self, hook: F) -> Retry<'a, S::WithH<F>> {
        self.with(|s| s.with_h(hook).0)
    }

    /// Ask `budget` before every retry instead of the default bucket of the
    /// call's name. Any [`Budget`]: a reference (`&PAYMENTS`,
    /// `&self.budget`), an `Arc`, or [`NoBudget`](crate::NoBudget) for none.
    pub fn budget<B2: Budget>(self, budget: B2) -> Retry<'a, S::WithB<B2>> {
        self.with(|s| s.with_b(Some(budget)).0)
    }

    /// Put `breaker` under the loop: it admits or refuses every attempt. Any
    /// [`Breaker`]: a reference (`&BREAKER`, `&self.breaker`) or an `Arc`.
    pub fn breaker<K2: Breaker>(self, breaker: K2) -> Retry<'a, S::WithK<K2>> {
        self.with(|s| s.with_k(breaker).0)
    }

    /// The name this call reports under (the `function` field of its events
    /// and the `function` label of its metrics), a `static` [`Name`]; its
    /// token bucket is the call's default budget. Default: calls that set
    /// no name all report as `"retries::call"`, but each call site (its
    /// place in the source) has a default budget of its own: 256 buckets
    /// picked by a hash of the site, so two sites share one only when their
    /// hashes collide. Name the calls whose budgets must be apart for sure.
    pub fn name(mut self, name: &'static Name) -> Self {
        self.head.name = name;
        self
    }

    /// What to do when started inside another retried call's attempt (see
    /// [`scope`](crate::scope)): [`Nested::Defer`] (the default) makes one
    /// attempt and leaves retries to the outer loop; [`Nested::Own`] retries
    /// as configured, within the outer attempt's deadline.
    pub fn nested(mut self, nested: Nested) -> Self {
        self.head.nested = nested;
        self
    }

    /// Take a slot of `limit` before the first attempt, and keep it until
    /// the call ends; wait for one at most the limit's `max_wait`, else stop
    /// with [`Reason::Saturated`](crate::Reason::Saturated) having sent
    /// nothing (see [`limit`](crate::limit)). A `static`, a field, or the
    /// contents of an `Arc` (`&*arc`).
    #[cfg(feature = "tokio")]
    pub fn concurrency(
        self,
        limit: &'a crate::limit::Concurrency,
    ) -> Retry<'a, S::WithL<&'a crate::limit::Concurrency>> {
        self.limited(limit)
    }

    /// [`concurrency`](Self::concurrency), when there may be none.
    /// [`concurrency`](Self::concurrency) when `limit` is `Some`: for a
    /// door whose calls may or may not have a limit, with one type either
    /// way.
    #[cfg(feature = "tokio")]
    pub fn concurrency_opt(
        self,
        limit: Option<&'a crate::limit::Concurrency>,
    ) -> Retry<'a, S::WithL<Option<&'a crate::limit::Concurrency>>> {
        self.limited(limit)
    }

    /// Draw every attempt of the call (first attempts, retries) from
    /// `limit`, a [`RateLimit`](crate::limit::RateLimit) shared by the
    /// calls that name it: an attempt waits for its start, and a call whose
    /// next start would come too late for its deadline stops at once with
    /// [`Reason::RateLimited`](crate::Reason::RateLimited), nothing sent.
    /// Combines with [`concurrency`](Self::concurrency) (the slot is taken
    /// first, then the start). Hedged copies draw from it too (a copy waits
    /// for its start; none fits: no more copies).
    #[cfg(feature = "tokio")]
    pub fn rate_limit(mut self, limit: &'a crate::limit::RateLimit) -> Self {
        self.head.rate.rate = Some(limit);
        self
    }

    /// [`rate_limit`](Self::rate_limit) when `limit` is `Some`; `None`
    /// removes one set before.
    #[cfg(feature = "tokio")]
    pub fn rate_limit_opt(mut self, limit: Option<&'a crate::limit::RateLimit>) -> Self {
        self.head.rate.rate = limit;
        self
    }

    /// Draw every attempt of the call from `pace`, the quota a server
    /// announced ([`Pace`](crate::limit::Pace), told each announcement by
    /// the caller or a door): as [`rate_limit`](Self::rate_limit), an
    /// attempt waits for its start, and a call whose next start would come
    /// too late for its deadline stops at once with
    /// [`Reason::OverQuota`](crate::Reason::OverQuota). Combines with a
    /// rate limit (the later of the two starts).
    #[cfg(feature = "tokio")]
    pub fn pace(mut self, pace: &'a crate::limit::Pace) -> Self {
        self.head.rate.pace = Some(pace);
        self
    }

    /// [`pace`](Self::pace) when `pace` is `Some`; `None` removes one set
    /// before.
    #[cfg(feature = "tokio")]
    pub fn pace_opt(mut self, pace: Option<&'a crate::limit::Pace>) -> Self {
        self.head.rate.pace = pace;
        self
    }

    #[cfg(feature = "tokio")]
    fn limited<L2>(self, limit: L2) -> Retry<'a, S::WithL<L2>> {
        self.with(|s| s.with_l(limit).0)
    }
}

// `I: Declared` is on each method, not on the block: a call that never
// declared its idempotency then fails with E0277 and the trait's own
// message naming `.idempotent()` and `.not_idempotent()`, not with E0599
// ("the method exists but its trait bounds were not satisfied").
impl<'a, S: SlotSet> Retry<'a, S>
where
    S::B: Budget,
    S::K: Breaker,
    S::L: LimitSlot<'a>,
{
    /// Run `op` until it succeeds or the call stops, and return the result or
    /// the [`Failure`] describing the stop.
    // Not an `async fn`, as `run` (see there).
    #[cfg(feature = "tokio")]
    #[allow(clippy::manual_async_fn)]
    pub fn outcome<T, E, F>(self, mut op: F) -> impl Future<Output = Result<T, Failure<E>>>
    where
        S::I: Declared,
        F: AsyncFnMut(&Attempt) -> Result<T, E>,
        S::C: Classifier<E>,
        S::R: Reconciler<T, E>,
        S::H: OnRetry<E>,
        S::O: RetryIf<T>,
    {
        async move { crate::__retries_drive!(self.into_spec(), Result<T, E>, |at| op(at)) }
    }

    /// Like [`outcome`](Self::outcome), for an `op` that returns a future
    /// which does not borrow the attempt: read what the body needs from the
    /// [`Attempt`] first, then return the future
    /// (`|at| { let key = at.idempotency_key(); client.charge(key) }`). This
    /// form is `Send` wherever its future is, including inside `tokio::spawn`
    /// with a closure that borrows the task's locals, where an `async`
    /// closure currently is not (rust-lang/rust#138207).
    // Not an `async fn`, as `run` (see there).
    #[cfg(feature = "tokio")]
    #[allow(clippy::manual_async_fn)]
    pub fn outcome_fn<T, E, F, Fut>(self, mut op: F) -> impl Future<Output = Result<T, Failure<E>>>
    where
        S::I: Declared,
        F: FnMut(&Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        S::C: Classifier<E>,
        S::R: Reconciler<T, E>,
        S::H: OnRetry<E>,
        S::O: RetryIf<T>,
    {
        async move { crate::__retries_drive!(self.into_spec(), Result<T, E>, |at| op(at)) }
    }

    /// [`run`](Self::run) for an `op` whose future does not borrow the
    /// attempt; see [`outcome_fn`](Self::outcome_fn).
    ///
    /// ```
    /// use std::time::Duration;
    /// use retries::{Attempt, Policy};
    ///
    /// struct Client;
    /// impl Client {
    ///     async fn stock(&self, attempt: u32) -> std::io::Result<u32> {
    ///         if attempt < 2 { Err(std::io::ErrorKind::ConnectionRefused.into()) } else { Ok(7) }
    ///     }
    /// }
    ///
    /// const POLICY: Policy = Policy::new(Duration::from_secs(1)).validated();
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let task = tokio::spawn(async {
    ///     let client = Client; // a local of the task, borrowed by every attempt
    ///     retries::call(&POLICY)
    ///         .idempotent()
    ///         .run_fn(|at: &Attempt| client.stock(at.number()))
    ///         .await
    /// });
    /// assert_eq!(task.await.unwrap().unwrap(), 7);
    /// # }
    /// ```
    // Not an `async fn`, as `run` (see there).
    #[cfg(feature = "tokio")]
    #[allow(clippy::manual_async_fn)]
    pub fn run_fn<T, E, F, Fut>(self, mut op: F) -> impl Future<Output = Result<T, E>>
    where
        S::I: Declared,
        F: FnMut(&Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        S::C: Classifier<E>,
        S::R: Reconciler<T, E>,
        S::H: OnRetry<E>,
        S::O: RetryIf<T>,
        E: From<Stopped> + Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        async move {
            let r: Result<T, Failure<E>> =
                crate::__retries_drive!(self.into_spec(), Result<T, E>, |at| op(at));
            r.map_err(Failure::into_error)
        }
    }

    /// Run `op` until it succeeds or the call stops. A stop is mapped to `E` by
    /// [`Failure::into_error`]: the last error, or `E::from(Stopped)` when the
    /// deadline or the breaker stopped the call.
    #[cfg(feature = "tokio")]
    // Not an `async fn`: one stores each argument twice (captured, then
    // bound again as a local; rust-lang/rust#62958). The block captures
    // them once: 8 bytes less per call (`future_sizes`, `call`: 616 → 608).
    #[allow(clippy::manual_async_fn)] // see above
    pub fn run<T, E, F>(self, mut op: F) -> impl Future<Output = Result<T, E>>
    where
        S::I: Declared,
        F: AsyncFnMut(&Attempt) -> Result<T, E>,
        S::C: Classifier<E>,
        S::R: Reconciler<T, E>,
        S::H: OnRetry<E>,
        S::O: RetryIf<T>,
        E: From<Stopped> + Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        async move {
            // The loop itself, not a call to `outcome`: one future fewer to nest.
            let r: Result<T, Failure<E>> =
                crate::__retries_drive!(self.into_spec(), Result<T, E>, |at| op(at));
            r.map_err(Failure::into_error)
        }
    }

    /// The blocking door: run `op` on this thread until it succeeds or the
    /// call stops, pausing with `std::thread::sleep`. Needs no tokio (works
    /// without the `tokio` feature). An attempt cannot be cut off mid-way,
    /// so the policy's `attempt_timeout` is not enforced; the deadline is
    /// checked before every attempt and pause. A `reconcile` for this door is
    /// given with [`reconcile_blocking`](Retry::reconcile_blocking).
    ///
    /// ```
    /// use std::time::Duration;
    /// use retries::{Attempt, Backoff, Policy};
    ///
    /// let policy = Policy::new(Duration::from_secs(1))
    ///     .with_backoff(Backoff::constant(Duration::from_millis(5)));
    /// let mut tries = 0;
    /// let n: Result<u32, std::io::Error> = retries::call(&policy)
    ///     .idempotent()
    ///     .run_blocking(|at: &Attempt| {
    ///         tries += 1;
    ///         if at.number() < 3 { Err(std::io::ErrorKind::ConnectionRefused.into()) } else { Ok(7) }
    ///     });
    /// assert_eq!((n.unwrap(), tries), (7, 3));
    /// ```
    pub fn run_blocking<T, E, F>(self, op: F) -> Result<T, E>
    where
        S::I: Declared,
        F: FnMut(&Attempt) -> Result<T, E>,
        S::C: Classifier<E>,
        S::R: Reconciler<T, E>,
        <S::R as Reconciler<T, E>>::Fut: Resolved<Result<Option<T>, E>>,
        S::H: OnRetry<E>,
        S::O: RetryIf<T>,
        E: From<Stopped> + Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.outcome_blocking(op).map_err(Failure::into_error)
    }

    /// [`run_blocking`](Self::run_blocking), returning the [`Failure`]
    /// describing a stop.
    pub fn outcome_blocking<T, E, F>(self, mut op: F) -> Result<T, Failure<E>>
    where
        S::I: Declared,
        F: FnMut(&Attempt) -> Result<T, E>,
        S::C: Classifier<E>,
        S::R: Reconciler<T, E>,
        <S::R as Reconciler<T, E>>::Fut: Resolved<Result<Option<T>, E>>,
        S::H: OnRetry<E>,
        S::O: RetryIf<T>,
    {
        crate::__retries_drive_blocking!(self.into_spec(), Result<T, E>, |at| op(at))
    }
}

#[cfg(feature = "tokio")]
impl<'a, S: SlotSet<I = Idempotent, O = NoRetryIf>> Retry<'a, S>
where
    S::B: Budget,
    S::K: Breaker,
    S::L: LimitSlot<'a>,
{
    /// Hedge the call (gRFC A6's hedging, for idempotent operations only):
    /// the first attempt starts at once, another after each
    /// [`Hedging::delay`](crate::Hedging::delay) without an answer or at
    /// once after a transient failure, up to
    /// [`Hedging::max_attempts`](crate::Hedging::max_attempts) in all; the
    /// first success wins and the others are cancelled, a permanent failure
    /// ends the call. Every copy carries the call's one idempotency key;
    /// pushback delays or stops further copies; the budget is asked before
    /// every copy after the first (a token bucket allows one only above half)
    /// and a refusal never cancels a copy in flight; the deadline bounds them
    /// all. `op` returns a future that does not borrow the attempt, as for
    /// [`run_fn`](Self::run_fn). The policy's `max_attempts`, backoff and
    /// `attempt_timeout` do not apply; `on_retry` is not called.
    ///
    /// ```
    /// use std::time::Duration;
    /// use retries::{Attempt, Hedging, Policy};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let policy = Policy::new(Duration::from_secs(2));
    /// let t0 = tokio::time::Instant::now();
    /// // The first copy is stuck for a second; the second, sent after 50 ms, answers in 10.
    /// let answer = retries::call(&policy)
    ///     .idempotent()
    ///     .run_hedged(Hedging::new(3, Duration::from_millis(50)), |at: &Attempt| {
    ///         let slow = at.number() == 1;
    ///         async move {
    ///             tokio::time::sleep(Duration::from_millis(if slow { 1000 } else { 10 })).await;
    ///             Ok::<_, std::io::Error>(if slow { "first" } else { "second" })
    ///         }
    ///     })
    ///     .await;
    /// assert_eq!(answer.unwrap(), "second");
    /// assert_eq!(t0.elapsed(), Duration::from_millis(60));
    /// # }
    /// ```
    pub async fn run_hedged<T, E, F, Fut>(self, hedging: crate::Hedging, op: F) -> Result<T, E>
    where
        F: FnMut(&Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        S::C: Classifier<E>,
        E: From<Stopped> + Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.outcome_hedged(hedging, op)
            .await
            .map_err(Failure::into_error)
    }

    /// [`run_hedged`](Self::run_hedged), returning the [`Failure`]
    /// describing a stop.
    pub async fn outcome_hedged<T, E, F, Fut>(
        self,
        hedging: crate::Hedging,
        op: F,
    ) -> Result<T, Failure<E>>
    where
        F: FnMut(&Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        S::C: Classifier<E>,
    {
        crate::engine::run_hedged(self.into_spec(), hedging, None, op).await
    }
}

impl<S: SlotSet> std::fmt::Debug for Retry<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retry")
            .field("policy", &self.head.policy)
            .field("idempotency", &std::any::type_name::<S::I>())
            .field("name", &self.head.name.as_str())
            .field("nested", &self.head.nested)
            .finish_non_exhaustive()
    }
}
