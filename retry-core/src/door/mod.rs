//! The seam a door is built on: what a crate that puts the engine in front
//! of a client or a server (a tower layer, an HTTP middleware, a database
//! transaction, a message consumer) needs from the core, and nothing else.
//!
//! The doors of this project (`retries-tower`, `retries-reqwest`,
//! `retries-sqlx`, `retries-chaos`, `retries-kafka`) are built on this
//! module alone, as a third party's door would be: no door reaches the
//! core's private items. A door crate depends on `retries-core` (or the
//! `retries` facade) and on its framework; the core depends on no framework,
//! so a framework's new release is a new release of its door only.
//!
//! # What a door does
//!
//! 1. **Builds a spec**: a [`Retry`] from
//!    [`call`](crate::call()) with the user's settings, or from its own
//!    settings. A door that must wrap what the user gave (its classifier,
//!    its `reconcile`) takes the spec apart with
//!    [`Retry::into_parts`](crate::Retry::into_parts) and puts it together
//!    again with [`Parts::into_retry`].
//! 2. **Drives the one loop** with [`drive`] (or [`drive_hedged`]), giving
//!    the deadline its request carries, if any, as the bound: every attempt,
//!    pause and look-up stays inside the earlier of it and the policy's
//!    deadline. The loop is the engine's: classification, budget, breaker,
//!    concurrency limit, `reconcile` and the pauses are not the door's to
//!    write.
//! 3. **Reads the attempt**: each attempt gets an [`Attempt`]
//!    (its number, its remaining time, the call's idempotency key) to put on
//!    the wire.
//! 4. **Names its calls and records what it sent**: [`observe`] holds the
//!    span attributes and metrics of the OpenTelemetry conventions, each a
//!    no-op when the core was built without `tracing` or `metrics`, so that
//!    a door needs no feature of its own for them; [`call_name`] makes one
//!    bounded, process-wide name per route.
//! 5. **Serves, on the server side**: [`ServerScope`] is the scope a server
//!    layer installs for a handler, with the caller's deadline and owner.
//!
//! What only some doors share is not here: the HTTP doors' request
//! extensions, replayable body and settings are the `retries-http` crate;
//! the key store of the server half of exactly-once is `retries-dedup`.
//! The rule: the core holds the loop and the words a call needs; what only
//! doors share lives in a crate those doors share.
//!
//! # A door in twenty lines
//!
//! A door for a blocking-free, made-up client, whose deadline comes from the
//! request:
//!
//! ```
//! use std::time::{Duration, Instant};
//! use retries::{Failure, Policy};
//! use retries_core::door;
//!
//! struct Client;
//! impl Client {
//!     async fn send(&self, body: &str, timeout: Duration) -> std::io::Result<String> {
//!         Ok(format!("{body} within {timeout:?}"))
//!     }
//! }
//!
//! const POLICY: Policy = Policy::new(Duration::from_secs(2)).validated();
//!
//! async fn send(client: &Client, body: &str, deadline: Option<Instant>) -> Result<String, Failure<std::io::Error>> {
//!     let spec = retries::call(&POLICY).idempotent();
//!     door::drive(spec, deadline, |at| client.send(body, at.remaining())).await
//! }
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! assert_eq!(send(&Client, "hi", None).await.unwrap(), "hi within 2s");
//! # }
//! ```
//!
//! `examples/ureq-door/` in the repository is a whole door for a
//! client none of this project's crates covers, written on this module alone.
//!
//! # Stability: exempt from semver, pinned with `=`
//!
//! This module is **not** covered by the core's semver promise, as
//! `sqlx-core` is not for the `sqlx` drivers: a release of `retries-core`
//! may change it in a patch version. Every door crate (this project's and a
//! third party's) therefore depends on `retries-core` with an exact
//! version (`retries-core = "=0.1.0"`), and is released with the core. The
//! facade `retries` does not re-export this module, so that a user of
//! `#[retryable]` never names it, and a change a door needs here is never
//! a breaking release for them (the facade pins the core with `=` too, and
//! its own API is the rest of the core, which is under semver).
//!
//! Why not a narrow, stable seam: the doors still move (hedging, durable
//! calls, run-time control each asked something of it this year), and a
//! promise of stability would freeze the first shape. The seam is kept
//! small instead, and counted: at 0.1.0 it has **27 public items**: 11
//! here ([`now`], [`since`], [`add`], [`Parts`] with
//! [`Retry::into_parts`](crate::Retry::into_parts), [`drive`],
//! [`door_loop!`](crate::door_loop), [`drive_hedged`],
//! [`unknown_at_deadline`], [`call_name`], [`ServerScope`], [`observe`]) and
//! 16 in [`observe`] (the conventions' span attributes and instruments, and
//! three generic hooks, [`observe::event`], [`observe::counter`],
//! [`observe::seconds`], that a door names itself: no hook is named after a
//! door). A setting of a door is the door's, never a struct of public
//! fields here.

use std::time::{Duration, Instant};

use crate::attempt::{Attempt, Owner};
use crate::observe::Name;
use crate::policy::Policy;
use crate::scope::Nested;
use crate::spec::{Retry, SlotSet, Slots, Spec};
// What the loop's bounds name (the loop runs on tokio's timer).
#[cfg(feature = "tokio")]
use {
    crate::breaker::Breaker,
    crate::budget::Budget,
    crate::failure::Failure,
    crate::spec::slots::{Classifier, Declared, LimitSlot, OnRetry, Reconciler, RetryIf},
    std::future::Future,
};

/// Now, on the clock every door of the core reads (tokio's with the feature
/// `tokio`, so the paused clock of a test moves it; else std's).
#[must_use]
#[inline]
pub fn now() -> Instant {
    crate::time::now()
}

/// The time since `earlier`, on the same clock as [`now`] (zero if
/// `earlier` is later).
#[must_use]
#[inline]
pub fn since(earlier: Instant) -> Duration {
    crate::time::since(earlier)
}

/// `at + d`, saturating far in the future instead of overflowing (a wire
/// deadline of a day from now, a `Duration::MAX` bound).
#[must_use]
#[inline]
pub fn add(at: Instant, d: Duration) -> Instant {
    crate::attempt::add(at, d)
}

/// A call's spec taken apart: what a door changes before it drives the loop
/// (wraps the user's classifier, puts its own `reconcile` in front of the
/// user's, declares the idempotency its protocol implies), given back by
/// [`into_retry`](Self::into_retry). Made by
/// [`Retry::into_parts`](crate::Retry::into_parts).
///
/// The type parameters are the spec's [slots](crate::slots): idempotency
/// (`I`), classifier (`C`), `reconcile` (`R`), `on_retry` (`H`), budget
/// (`B`), breaker (`K`), `retry_if` (`O`) and concurrency limit (`L`).
#[derive(Debug)]
pub struct Parts<'a, I, C, R, H, B, K, O, L> {
    /// The limits of the call.
    pub policy: &'a Policy,
    /// The idempotency declared ([`Undeclared`](crate::slots::Undeclared),
    /// [`Idempotent`](crate::slots::Idempotent), …).
    pub idempotency: I,
    /// The classifier ([`ByClassify`](crate::slots::ByClassify) or
    /// [`ClassifyWith`](crate::slots::ClassifyWith)).
    pub classify: C,
    /// The `reconcile` look-up ([`NoReconcile`](crate::slots::NoReconcile)
    /// or [`ReconcileWith`](crate::slots::ReconcileWith)).
    pub reconcile: R,
    /// The `on_retry` hook.
    pub on_retry: H,
    /// The budget; `None` for the call site's default bucket.
    pub budget: Option<B>,
    /// The breaker.
    pub breaker: K,
    /// Whether the call retries when it runs inside another retried call.
    pub nested: Nested,
    /// The name the call reports under.
    pub name: &'static Name,
    /// Which successful values count as failed attempts.
    pub retry_if: O,
    /// The concurrency limit ([`NoLimit`](crate::slots::NoLimit), a
    /// `&Concurrency`, or an `Option<&Concurrency>`).
    pub slots: L,
    /// The rate limit every attempt draws from, if any.
    #[cfg(feature = "tokio")]
    pub rate: Option<&'a crate::limit::RateLimit>,
    /// The server's announced pace every attempt draws from, if any (the
    /// HTTP doors keep one per authority).
    #[cfg(feature = "tokio")]
    pub pace: Option<&'a crate::limit::Pace>,
}

impl<'a, I, C, R, H, B, K, O, L> Parts<'a, I, C, R, H, B, K, O, L> {
    /// The spec again, to drive with [`drive`].
    pub fn into_retry(self) -> Spec<'a, I, C, R, H, B, K, O, L> {
        let head = crate::spec::Head {
            policy: self.policy,
            nested: self.nested,
            name: self.name,
            #[cfg(feature = "tokio")]
            rate: crate::rate::Starts {
                rate: self.rate,
                pace: self.pace,
            },
        };
        Retry::from_parts(
            head,
            Slots {
                idempotency: self.idempotency,
                classify: self.classify,
                reconcile: self.reconcile,
                on_retry: self.on_retry,
                budget: self.budget,
                breaker: self.breaker,
                retry_if: self.retry_if,
                limit: self.slots,
            },
        )
    }
}

impl<'a, S: SlotSet> Retry<'a, S> {
    /// The spec taken apart, for a door that changes it before it drives
    /// the loop (see [`door`](crate::door)).
    #[allow(clippy::type_complexity)] // the seam's one literal of the parts
    pub fn into_parts(self) -> Parts<'a, S::I, S::C, S::R, S::H, S::B, S::K, S::O, S::L> {
        let Retry { head, slots } = self.into_spec();
        Parts {
            policy: head.policy,
            idempotency: slots.idempotency,
            classify: slots.classify,
            reconcile: slots.reconcile,
            on_retry: slots.on_retry,
            budget: slots.budget,
            breaker: slots.breaker,
            nested: head.nested,
            name: head.name,
            retry_if: slots.retry_if,
            slots: slots.limit,
            #[cfg(feature = "tokio")]
            rate: head.rate.rate,
            #[cfg(feature = "tokio")]
            pace: head.rate.pace,
        }
    }
}

/// Drive the one loop of the engine for `spec`: `op` is one attempt, given
/// the attempt's context; the call ends with its value or with the
/// [`Failure`] that describes the stop. `bound` is a deadline the door's
/// request carries (a `retries-timeout-ms` header, a `Deadline` extension):
/// the call then ends at the earlier of it and the policy's deadline, and no
/// attempt starts at or after it.
///
/// This is the loop `retries::call(…).outcome_fn(op)` runs; a door calls it
/// instead when it has a bound, or a spec it built itself.
#[cfg(feature = "tokio")]
pub async fn drive<'a, T, E, I, C, R, H, B, K, O, L, F, Fut>(
    spec: Spec<'a, I, C, R, H, B, K, O, L>,
    bound: Option<Instant>,
    mut op: F,
) -> Result<T, Failure<E>>
where
    I: Declared,
    B: Budget,
    K: Breaker,
    L: LimitSlot<'a>,
    C: Classifier<E>,
    R: Reconciler<T, E>,
    H: OnRetry<E>,
    O: RetryIf<T>,
    F: FnMut(&Attempt) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    crate::__retries_drive!(@[limit][reconcile][bound] spec, Result<T, E>, |at| op(at))
}

/// [`drive`] written in place, for a door whose attempt borrows what the
/// call's future holds (the request, the inner service, `&mut` state), and
/// the attempt itself, across its `await`s: `door_loop!(spec, bound, T,
/// |at| attempt_future)` is an expression of type `Result<T, Failure<E>>`
/// to `.await`-free use inside an `async` block, where `T` is the attempt's
/// output type (`Result<_, E>`) and `at` names the [`Attempt`] (a
/// `&Attempt`, the engine's own context of the attempt). The loop is the same as [`drive`]'s; the
/// tower layer and the transaction door use it.
///
/// `door_loop!(spec, bound, key: Some(k), T, |at| …)` gives the call its
/// idempotency key `k` (an `Option<IdempotencyKey>`): a door that must put
/// the key on the wire before the first attempt (an `Idempotency-Key`
/// header) mints it once, and every attempt, `reconcile` and hook sees that
/// same key ([`Attempt::idempotency_key`]); no second key is made.
///
/// ```
/// use std::time::Duration;
/// use retries::{Failure, IdempotencyKey, Policy};
///
/// const POLICY: Policy = Policy::new(Duration::from_secs(1)).validated();
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let on_the_wire = IdempotencyKey::random();
/// let mut seen = Vec::new();
/// let spec = retries::call(&POLICY).not_idempotent();
/// let out: Result<(), Failure<std::io::Error>> = retries_core::door::door_loop!(spec, None, key: Some(on_the_wire), Result<(), std::io::Error>, |at| async {
///     seen.push(at.idempotency_key());
///     Err(std::io::ErrorKind::ConnectionRefused.into()) // not executed: tried again
/// });
/// assert!(out.is_err());
/// assert!(seen.len() > 1 && seen.iter().all(|k| *k == on_the_wire));
/// # }
/// ```
///
/// ```
/// use std::time::Duration;
/// use retries::{Failure, Policy};
///
/// const POLICY: Policy = Policy::new(Duration::from_secs(1)).validated();
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let mut sent = Vec::new();
/// let spec = retries::call(&POLICY).idempotent();
/// let out: Result<u32, Failure<std::io::Error>> = retries_core::door::door_loop!(spec, None, Result<u32, std::io::Error>, |at| async {
///     sent.push(at.number()); // `&mut` state and the attempt, borrowed across awaits
///     if at.number() < 3 { Err(std::io::ErrorKind::ConnectionRefused.into()) } else { Ok(7) }
/// });
/// assert_eq!(out.unwrap(), 7);
/// assert_eq!(sent, [1, 2, 3]);
/// # }
/// ```
#[cfg(feature = "tokio")]
#[doc(inline)]
pub use crate::door_loop;

/// [`drive`] with hedging: a copy of the attempt after each of `hedging`'s
/// delays while none has answered (gRFC A6's hedging; for idempotent calls
/// only, throttled by the budget), inside the same deadline and `bound`.
/// A hedged call has no `reconcile` and no `retry_if` (a copy in flight
/// cannot be looked up), so neither slot is taken.
#[cfg(feature = "tokio")]
pub async fn drive_hedged<'a, T, E, I, C, R, H, B, K, L, F, Fut>(
    spec: Spec<'a, I, C, R, H, B, K, crate::slots::NoRetryIf, L>,
    hedging: crate::Hedging,
    bound: Option<Instant>,
    op: F,
) -> Result<T, Failure<E>>
where
    I: Declared,
    B: Budget,
    K: Breaker,
    L: LimitSlot<'a>,
    C: Classifier<E>,
    F: FnMut(&Attempt) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    crate::engine::run_hedged(spec, hedging, bound, op).await
}

/// A call the loop stopped with [`Reason::DeadlineExceeded`](crate::Reason::DeadlineExceeded)
/// while the door knows that its last attempt had sent work whose outcome
/// nobody resolved (a `COMMIT` in flight, a look-up cut short): the stop
/// becomes [`Reason::UnknownOutcome`](crate::Reason::UnknownOutcome), with
/// `why` as the look-up's error ([`Failure::reconcile_error`]). Any other
/// stop is returned as it is. "Deadline exceeded" would tell a caller that
/// nothing happened in time, and a caller that retries at a higher level
/// would then apply the work twice.
#[cfg(feature = "tokio")]
#[must_use]
pub fn unknown_at_deadline<E>(failure: Failure<E>, why: impl FnOnce() -> E) -> Failure<E> {
    if failure.reason() == crate::Reason::DeadlineExceeded {
        failure.into_unknown(why())
    } else {
        failure
    }
}

/// The name of a door's call to a route or method, made once per distinct
/// `label` and kept for the process: at most
/// [`MAX_CALL_NAMES`](crate::observe::MAX_CALL_NAMES) of them, after which
/// `fallback` is returned (and one warning logged). `label` must come from
/// a bounded set (a route template, a gRPC method path), never from raw
/// request data.
#[must_use]
pub fn call_name(label: &str, fallback: &'static Name) -> &'static Name {
    crate::observe::call_names::named(label, fallback)
}

/// The scope a server layer installs for its handler: the caller's
/// deadline (net of the server's reserve), and who owns retries below it.
/// A retried call made inside it (through any door) ends by its deadline,
/// and defers to the caller when the caller said it owns retries; when such
/// a call gives up, the scope remembers it ([`gave_up_below`](Self::gave_up_below)),
/// for the layer to tell its caller not to retry.
#[derive(Debug)]
pub struct ServerScope {
    at: Attempt,
}

impl ServerScope {
    /// A scope ending at `deadline` (`None`: no deadline, the scope still
    /// collects "gave up"); `caller_owns`: the caller retries, calls below
    /// do not.
    #[must_use]
    pub fn new(deadline: Option<Instant>, caller_owns: bool) -> Self {
        let owner = if caller_owns {
            Owner::Caller
        } else {
            Owner::Nobody
        };
        let at = match deadline {
            Some(deadline) => Attempt::fixed(deadline, owner),
            None => Attempt::unbounded(now(), owner),
        };
        Self { at }
    }

    /// Run `f` (a handler's call, one poll of its future) inside the scope.
    pub fn enter<T>(&self, f: impl FnOnce() -> T) -> T {
        crate::scope::enter(&self.at, f)
    }

    /// Did a retried call inside the scope give up after retrying?
    #[must_use]
    pub fn gave_up_below(&self) -> bool {
        self.at.gave_up_below()
    }
}

/// What a door records, under the OpenTelemetry conventions' names: on the
/// span of the attempt it is sending (HTTP client spans, RPC spans, gRFC
/// A66's `grpc.*`), and as the conventions' instruments. Each function does
/// nothing when the core was built without the feature it needs
/// (`tracing` for the span attributes, `metrics` for the instruments), or
/// when the current span is not an attempt's span of this crate.
pub mod observe {
    use std::time::Duration;

    /// `true` when the core records spans (feature `tracing`).
    pub const TRACING: bool = cfg!(feature = "tracing");
    /// `true` when the core records metrics (feature `metrics`).
    pub const METRICS: bool = cfg!(feature = "metrics");

    /// Does anyone listen to the spans of attempts? Read before computing
    /// what would be recorded.
    #[must_use]
    #[inline]
    pub fn listening() -> bool {
        #[cfg(feature = "tracing")]
        return crate::observe::spans::listening();
        #[cfg(not(feature = "tracing"))]
        false
    }

    /// An HTTP request: its method, the server, the route template when
    /// known, and the attempt's number (`http.request.resend_count` from the
    /// second).
    #[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
    pub fn http_request(method: &str, host: Option<&str>, route: Option<&str>, number: u32) {
        #[cfg(feature = "tracing")]
        crate::observe::spans::http_request(method, host, route, number);
    }

    /// An HTTP response's status (`error.type` from 400).
    #[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
    pub fn http_status(status: u16) {
        #[cfg(feature = "tracing")]
        crate::observe::spans::http_status(status);
    }

    /// A gRPC call of `path` (`/package.Service/Method`).
    #[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
    pub fn grpc_request(path: &str, host: Option<&str>) {
        #[cfg(feature = "tracing")]
        crate::observe::spans::grpc_request(path, host);
    }

    /// A gRPC status, by number and name.
    #[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
    pub fn grpc_status(code: i32, name: &'static str) {
        #[cfg(feature = "tracing")]
        crate::observe::spans::grpc_status(code, name);
    }

    /// The attempt failed without a response (the conventions' `_OTHER`).
    pub fn no_response() {
        #[cfg(feature = "tracing")]
        crate::observe::spans::no_response();
    }

    /// One HTTP attempt: `http.client.request.duration` (s).
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub fn http_attempt(
        method: &str,
        host: Option<&str>,
        route: Option<&str>,
        status: Option<u16>,
        duration: Duration,
    ) {
        #[cfg(feature = "metrics")]
        crate::observe::conventions::http_attempt(method, host, route, status, duration);
    }

    /// A gRPC attempt started: `grpc.client.attempt.started`.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub fn grpc_attempt_started(method: &str) {
        #[cfg(feature = "metrics")]
        crate::observe::conventions::grpc_attempt_started(method);
    }

    /// A gRPC attempt ended with `status`: `grpc.client.attempt.duration` (s).
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub fn grpc_attempt(method: &str, status: &'static str, duration: Duration) {
        #[cfg(feature = "metrics")]
        crate::observe::conventions::grpc_attempt(method, status, duration);
    }

    /// A gRPC call ended: `grpc.client.call.duration` (s), and for a call
    /// that retried `grpc.client.call.retries` and
    /// `grpc.client.call.retry_delay` (s).
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub fn grpc_call(
        method: &str,
        status: &'static str,
        duration: Duration,
        attempts: u32,
        delay: Duration,
    ) {
        #[cfg(feature = "metrics")]
        crate::observe::conventions::grpc_call(method, status, duration, attempts, delay);
    }

    pub use crate::observe::events::Level;

    /// One event of a door, named by the door: at `level`, with target
    /// `retries::door`, the field `door` (the door's own name: `dedup`,
    /// `chaos`, `server`, …), `message`, and `detail`. Nothing without the
    /// feature `tracing`. A door says at DEBUG what it does for a request
    /// that succeeds, and at WARN only what may cost the guarantee.
    pub fn event(
        level: Level,
        door: &'static str,
        message: &'static str,
        detail: &dyn std::fmt::Display,
    ) {
        crate::observe::events::event(level, door, message, detail);
    }

    /// A door's counter `name` (`retry.server.dedup`, `retry.chaos.injected`,
    /// …: the door names it, under `retry.`), by `labels` from a bounded
    /// set, incremented by one. Nothing without the feature `metrics`.
    pub fn counter(name: &'static str, labels: &[(&'static str, &'static str)]) {
        crate::observe::events::counter(name, labels);
    }

    /// A door's histogram `name`, in seconds (`retry.server.deadline_at_entry`,
    /// `retry.durable.oldest_due_age`), by `labels` from a bounded set (none
    /// is `&[]`). Nothing without the feature `metrics`.
    pub fn seconds(name: &'static str, labels: &[(&'static str, &'static str)], value: Duration) {
        crate::observe::events::seconds(name, labels, value);
    }
}
