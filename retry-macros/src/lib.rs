//! Implementation detail of the [`retries`](https://docs.rs/retries) crate: the
//! `#[retryable]` attribute and `#[derive(Classify)]`. Depend on `retries`, not
//! on this crate; its version is pinned by `retries`.
//!
//! This crate only reads the attribute and forwards what it says. Its files
//! form a DAG, bottom up: `ast.rs` (the parsed values and `KEYS`),
//! `duration.rs`, `diag.rs` (error collection and hints), `lit.rs` (the form
//! of literal values), `args.rs` (one setter per key), `valid.rs` (keys that
//! must or cannot go together), `item.rs` (the annotated fn), `expand.rs`
//! (the thin expansion), `fallback.rs` (what is emitted on error),
//! `impl_block.rs` (an annotated `impl` block, method by method),
//! `classify.rs` (the derive); this file holds the entry points and the
//! dispatch between a function and an `impl` block. Every default and every
//! rule about values lives in `retries-core`.

mod args;
mod ast;
mod classify;
mod diag;
mod duration;
mod expand;
mod fallback;
#[cfg(test)]
mod fuzz;
mod impl_block;
mod item;
mod lit;
mod valid;

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::quote;

use crate::diag::Errors;

/// Turn an `async fn` (or a blocking `fn`) into a deadline-bounded retry
/// loop. The function keeps its signature; callers do not know it retries.
///
/// ```
/// use retries::{retryable, Classify};
///
/// #[derive(Debug, thiserror::Error, Classify)]
/// enum PayError {
///     #[error("service unavailable")]
///     #[classify(unknown)]          // transient, but the charge may have happened
///     Unavailable,
///     #[error("invalid request")]
///     #[classify(permanent)]
///     Invalid,
///     #[error(transparent)]
///     Stopped(#[from] retries::Stopped), // delegated: a stopped call is permanent
/// }
///
/// struct Payments;
///
/// impl Payments {
///     #[retryable(
///         deadline = "2s",        // the whole call: all attempts and all pauses
///         max_attempts = 3,       // includes the first attempt
///         idempotent = false,     // charging is not safe to repeat blindly
///         reconcile = |key| self.lookup_charge(key), // resolves unknown outcomes
///         attempt = at,           // binds `&retries::Attempt` in the body
///     )]
///     async fn charge(&self, cents: u64) -> Result<String, PayError> {
///         self.send_charge(at.idempotency_key(), cents).await
///     }
/// #   async fn send_charge(&self, key: retries::IdempotencyKey, _: u64) -> Result<String, PayError> { Ok(key.to_string()) }
/// #   async fn lookup_charge(&self, _: retries::IdempotencyKey) -> Result<Option<String>, PayError> { Ok(None) }
/// }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() { assert_eq!(Payments.charge(5).await.unwrap().len(), 32); }
/// ```
///
/// The function must return a `Result<T, E>` whose `E`
/// implements [`Classify`](derive@Classify) (or pass `classify`), and, unless
/// `recover` is given, `From<retries::Stopped>` and `std::error::Error + Send +
/// Sync + 'static` (a [`Stopped`](../retries/struct.Stopped.html) keeps the last
/// error as its `source()`; a concrete error type derived with `thiserror`
/// has all of these, a generic one must say so in its bounds:
/// `E: Classify + From<Stopped> + std::error::Error + Send + Sync + 'static`).
/// Every misuse is a compile error naming the fix.
///
/// # Keys
///
/// Durations are literals such as `"250ms"`, `"2s"`, `"1.5s"`, `"1m"`, `"1m30s"`
/// (units `ns`, `us`, `ms`, `s`, `m`, `h`), checked at compile time, or any
/// expression of type `std::time::Duration`. Every value may be an expression;
/// rustc type-checks it and points its errors at it. Literal values are
/// validated against each other at compile time (for example `reserve` must be
/// shorter than `deadline`); values given as expressions are taken as they are
/// at run time, where the engine never panics (it treats `max_attempts = 0` as
/// 1).
///
/// Hidden in the examples below: `use retries::retryable;` and an error type `E`
/// with `Refused` (not executed), `Lost` (unknown) and `Invalid` (permanent)
/// variants and `From<retries::Stopped>`.
///
/// ## `deadline` (required unless `policy` gives one)
///
/// Bounds the whole call: every attempt and every pause. It becomes an instant
/// once, at entry; an attempt still running at the deadline is cancelled and the
/// call returns `E::from(Stopped)` with reason `DeadlineExceeded`.
///
/// ```
/// # use retries::retryable; #[derive(Debug, thiserror::Error, retries::Classify)] enum E { #[error("r")] #[classify(not_executed)] Refused, #[error(transparent)] Stopped(#[from] retries::Stopped) }
/// #[retryable(deadline = "100ms", idempotent)]
/// async fn hangs() -> Result<(), E> {
///     std::future::pending().await
/// }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let t0 = tokio::time::Instant::now();
/// assert!(matches!(hangs().await, Err(E::Stopped(_))));
/// assert_eq!(t0.elapsed(), std::time::Duration::from_millis(100));
/// # }
/// ```
///
/// ## `max_attempts` (default 3)
///
/// Attempts in all, the first one included: `max_attempts = 1` never retries.
///
/// ```
/// # use retries::retryable; #[derive(Debug, thiserror::Error, retries::Classify)] enum E { #[error("r")] #[classify(not_executed)] Refused, #[error(transparent)] Stopped(#[from] retries::Stopped) }
/// #[retryable(deadline = "1s", max_attempts = 2, idempotent, attempt = at)]
/// async fn refused(seen: &std::sync::Mutex<Vec<u32>>) -> Result<(), E> {
///     seen.lock().unwrap().push(at.number());
///     Err(E::Refused)
/// }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let seen = std::sync::Mutex::new(vec![]);
/// assert!(matches!(refused(&seen).await, Err(E::Refused)));
/// assert_eq!(*seen.lock().unwrap(), [1, 2]);
/// # }
/// ```
///
/// ## `attempt_timeout` (default: none)
///
/// Caps one attempt. Each attempt gets `min(attempt_timeout, remaining −
/// reserve)`. An attempt cut off by its timeout has an unknown outcome: an
/// idempotent function retries it, a non-idempotent one stops (or reconciles).
///
/// ```
/// # use retries::retryable; #[derive(Debug, thiserror::Error, retries::Classify)] enum E { #[error("r")] #[classify(not_executed)] Refused, #[error(transparent)] Stopped(#[from] retries::Stopped) }
/// #[retryable(deadline = "2s", attempt_timeout = "300ms", idempotent, attempt = at)]
/// async fn slow_first() -> Result<u32, E> {
///     if at.number() == 1 {
///         std::future::pending::<()>().await; // cut off at 300 ms
///     }
///     Ok(at.number())
/// }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// assert_eq!(slow_first().await.unwrap(), 2);
/// # }
/// ```
///
/// ## `reserve` (default 0)
///
/// Time kept back at the end of the deadline for the caller to use the answer:
/// no attempt or pause runs into it.
///
/// ```
/// # use retries::retryable; #[derive(Debug, thiserror::Error, retries::Classify)] enum E { #[error("r")] #[classify(not_executed)] Refused, #[error(transparent)] Stopped(#[from] retries::Stopped) }
/// #[retryable(deadline = "1s", reserve = "200ms", idempotent, attempt = at)]
/// async fn budgeted() -> Result<std::time::Duration, E> {
///     Ok(at.remaining())
/// }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// assert_eq!(budgeted().await.unwrap(), std::time::Duration::from_millis(800));
/// # }
/// ```
///
/// ## `min_attempt` (default 1 ms)
///
/// Before a pause, the loop checks that the pause plus this much attempt time
/// still fit before the deadline; if not, it stops at once with
/// `PauseExceedsDeadline` (a `Stopped` that says so, the last error its
/// source) instead of sleeping uselessly.
///
/// ```
/// # use retries::retryable; #[derive(Debug, thiserror::Error, retries::Classify)] enum E { #[error("r")] #[classify(not_executed)] Refused, #[error(transparent)] Stopped(#[from] retries::Stopped) }
/// #[retryable(deadline = "1s", min_attempt = "500ms", idempotent,
///             backoff = "constant", initial_backoff = "600ms")]
/// async fn refused() -> Result<(), E> {
///     Err(E::Refused)
/// }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let t0 = tokio::time::Instant::now();
/// let Err(E::Stopped(stop)) = refused().await else { panic!() };
/// assert_eq!(stop.reason(), retries::Reason::PauseExceedsDeadline); // not a bare refusal
/// assert_eq!(t0.elapsed(), std::time::Duration::ZERO); // no useless sleep
/// # }
/// ```
///
/// ## `backoff`, `initial_backoff`, `max_backoff`, `multiplier`, `jitter`
///
/// `backoff` is a kind (`"constant"`, `"linear"`, `"exponential"`,
/// `"decorrelated"`, or `"grpc"`: gRPC's own backoff as gRFC A6 states it,
/// see `retries::backoff`) or a `retries::Backoff` expression; the other keys change
/// one parameter each and keep the rest, whether it comes from `Policy`'s
/// default (exponential from 100 ms, ×2, capped at 1 s, full jitter), from
/// `backoff = …` or from `policy = …` (so `policy = P, jitter = "none"` keeps
/// `P`'s kind, first pause and cap). A kind brings its own default jitter
/// (none for constant and linear), which `jitter` overrides. A linear backoff
/// grows by `initial_backoff` each time; a constant one pauses
/// `initial_backoff`.
/// `jitter` is `"none"`, `"full"`, `"equal"`, `"decorrelated"`, or a factor `f`
/// in `[0, 1]` for proportional jitter (`d · U(1−f, 1+f)`). A server's
/// `retry_after` replaces the computed pause and restarts the sequence.
///
/// ```
/// # use retries::retryable; #[derive(Debug, thiserror::Error, retries::Classify)] enum E { #[error("r")] #[classify(not_executed)] Refused, #[error(transparent)] Stopped(#[from] retries::Stopped) }
/// #[retryable(deadline = "5s", max_attempts = 4, idempotent,
///             backoff = "exponential", initial_backoff = "100ms", multiplier = 3.0,
///             max_backoff = "2s", jitter = "none")]
/// async fn refused() -> Result<(), E> {
///     Err(E::Refused)
/// }
///
/// const SLOW: retries::Backoff = retries::Backoff::constant(std::time::Duration::from_millis(250));
///
/// #[retryable(deadline = "5s", max_attempts = 2, idempotent, backoff = SLOW)]
/// async fn refused_slowly() -> Result<(), E> {
///     Err(E::Refused)
/// }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let t0 = tokio::time::Instant::now();
/// let _ = refused().await;
/// assert_eq!(t0.elapsed(), std::time::Duration::from_millis(100 + 300 + 900));
/// let t0 = tokio::time::Instant::now();
/// let _ = refused_slowly().await;
/// assert_eq!(t0.elapsed(), std::time::Duration::from_millis(250));
/// # }
/// ```
///
/// ## `idempotent` (required)
///
/// Whether the operation is safe to repeat: the bare flag `idempotent` (or
/// `idempotent = true`), or `idempotent = false`. It must be a literal: it is
/// a declaration about the business operation, not something computed. After
/// an unknown outcome (the request may have been processed), an idempotent
/// function is retried; a non-idempotent one stops with the error, unless
/// `reconcile` finds out whether the work was done.
///
/// ```
/// # use retries::retryable; #[derive(Debug, thiserror::Error, retries::Classify)] enum E { #[error("r")] #[classify(not_executed)] Refused, #[error("l")] #[classify(unknown)] Lost, #[error(transparent)] Stopped(#[from] retries::Stopped) }
/// #[retryable(deadline = "1s", idempotent = false, attempt = at)]
/// async fn transfer(tries: &std::sync::atomic::AtomicU32) -> Result<(), E> {
///     tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
///     Err(E::Lost) // the reply was lost: the transfer may have happened
/// }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let tries = std::sync::atomic::AtomicU32::new(0);
/// assert!(matches!(transfer(&tries).await, Err(E::Lost)));
/// assert_eq!(tries.into_inner(), 1); // never blindly repeated
/// # }
/// ```
///
/// ## `reconcile` (only with `idempotent = false`)
///
/// A function of the call's [`IdempotencyKey`](../retries/struct.IdempotencyKey.html)
/// returning a future of `Result<Option<T>, E>`: after an unknown outcome,
/// `Ok(Some(v))` means the work was done (the call returns `Ok(v)`), `Ok(None)`
/// that it was not (the call retries as if not executed), `Err(_)` that the
/// outcome stays unknown (the call stops). It runs within the deadline.
///
/// Like every key's value, it is evaluated once, when the call starts, and
/// held for the whole call: it may borrow `self` in a `&self` method; in a
/// `&mut self` method whose body mutates `self`, give it what it needs by
/// value (an `Arc`, a clone) instead.
///
/// ```
/// # use retries::retryable; #[derive(Debug, thiserror::Error, retries::Classify)] enum E { #[error("r")] #[classify(not_executed)] Refused, #[error("l")] #[classify(unknown)] Lost, #[error(transparent)] Stopped(#[from] retries::Stopped) }
/// use std::sync::Mutex;
/// use retries::IdempotencyKey;
///
/// struct Bank { done: Mutex<Vec<IdempotencyKey>> }
///
/// impl Bank {
///     async fn find(&self, key: IdempotencyKey) -> Result<Option<u32>, E> {
///         Ok(self.done.lock().unwrap().contains(&key).then_some(1))
///     }
///
///     #[retryable(deadline = "1s", idempotent = false, reconcile = |key| self.find(key), attempt = at)]
///     async fn transfer(&self) -> Result<u32, E> {
///         self.done.lock().unwrap().push(at.idempotency_key()); // the work happens…
///         Err(E::Lost)                                          // …and the reply is lost
///     }
/// }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let bank = Bank { done: Mutex::new(vec![]) };
/// assert_eq!(bank.transfer().await.unwrap(), 1);
/// assert_eq!(bank.done.lock().unwrap().len(), 1); // done once
/// # }
/// ```
///
/// ## `recover`
///
/// Called with the [`Failure<E>`](../retries/struct.Failure.html) of a call that
/// did not succeed, and produces the function's return value (directly or as a
/// future). One generic function serves every return type, so no per-type
/// recover methods are needed; with `recover`, `E` need not implement
/// `From<Stopped>`.
///
/// ```
/// # use retries::retryable; #[derive(Debug, thiserror::Error, retries::Classify)] enum E { #[error("r")] #[classify(not_executed)] Refused, #[error("gave up after {0}")] #[classify(permanent)] GaveUp(u32) }
/// fn give_up<T>(f: retries::Failure<E>) -> Result<T, E> {
///     Err(E::GaveUp(f.attempts()))
/// }
///
/// #[retryable(deadline = "1s", idempotent, recover = give_up)]
/// async fn ping() -> Result<(), E> { Err(E::Refused) }
///
/// #[retryable(deadline = "1s", idempotent, recover = give_up)]
/// async fn count() -> Result<u64, E> { Err(E::Refused) }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// assert!(matches!(ping().await, Err(E::GaveUp(3))));
/// assert!(matches!(count().await, Err(E::GaveUp(3))));
/// # }
/// ```
///
/// ## `classify`
///
/// Overrides the error type's `Classify` for this function: a function or
/// closure `&E -> retries::Verdict`.
///
/// ```
/// # use retries::retryable; #[derive(Debug, thiserror::Error, retries::Classify)] enum E { #[error("r")] #[classify(not_executed)] Refused, #[error("i")] #[classify(permanent)] Invalid, #[error(transparent)] Stopped(#[from] retries::Stopped) }
/// #[retryable(deadline = "1s", idempotent, attempt = at,
///             classify = |_: &E| retries::Verdict::not_executed())]
/// async fn flaky_validation() -> Result<u32, E> {
///     if at.number() < 2 { Err(E::Invalid) } else { Ok(at.number()) }
/// }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// assert_eq!(flaky_validation().await.unwrap(), 2);
/// # }
/// ```
///
/// ## `retry_if`
///
/// Classifies successful values too: a function or closure `&T ->
/// Option<retries::Verdict>` (`T` the success type). `Some(verdict)` makes
/// the attempt a failure under the same decision table, with the verdict's
/// `retry_after` as the pause, for a poll-until-ready loop, a job that says
/// "not yet", a response object carrying a 503. When the call stops while the
/// last attempt was such a value, that value is the function's `Ok` result
/// (it is a real answer); `recover` is not called for it.
///
/// ```
/// # use retries::retryable; #[derive(Debug, thiserror::Error, retries::Classify)] enum E { #[error("r")] #[classify(not_executed)] Refused, #[error(transparent)] Stopped(#[from] retries::Stopped) }
/// #[retryable(deadline = "10s", max_attempts = 5, idempotent, attempt = at,
///             retry_if = |s: &&str| (*s == "pending").then(retries::Verdict::not_executed))]
/// async fn export_status() -> Result<&'static str, E> {
///     Ok(if at.number() < 3 { "pending" } else { "done" })
/// }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// assert_eq!(export_status().await.unwrap(), "done");
/// # }
/// ```
///
/// ## `hedge(max_attempts = …, delay = …)` (idempotent `async fn`s only)
///
/// Hedges the call instead of retrying it one attempt after another (gRFC
/// A6's hedging): the first copy starts at once, another after each `delay`
/// without an answer or at once after a transient failure, up to
/// `max_attempts` in all; the first success wins and the other copies are
/// cancelled, a permanent failure ends the call. All copies carry the call's
/// one idempotency key, the budget is asked before each copy after the first
/// (the default token bucket allows one only above half), and the deadline
/// bounds them all. A compile error with `idempotent = false`, on a blocking
/// `fn`, and with `max_attempts`, `attempt_timeout`, `retry_if` or `on_retry`
/// (which belong to a sequential loop). The body runs as an `async move`
/// block per copy: it may use references and `Copy` arguments, and `self`
/// by shared reference.
///
/// Instead of a fixed `delay`, `learned = DELAY` names a `static`
/// [`retries::LearnedDelay`](https://docs.rs/retries/latest/retries/struct.LearnedDelay.html):
/// the next copy goes after the latency all but a given share of the
/// function's recent calls stayed under (`hedge(max_attempts = 2, learned =
/// PRICE_DELAY)`).
///
/// ```
/// # use retries::retryable; #[derive(Debug, thiserror::Error, retries::Classify)] enum E { #[error("r")] #[classify(not_executed)] Refused, #[error(transparent)] Stopped(#[from] retries::Stopped) }
/// use std::time::Duration;
///
/// #[retryable(deadline = "2s", idempotent, attempt = at, hedge(max_attempts = 2, delay = "50ms"))]
/// async fn price(sku: u32) -> Result<u32, E> {
///     // The first copy hits a slow replica; the second answers in 10 ms.
///     let slow = at.number() == 1;
///     tokio::time::sleep(Duration::from_millis(if slow { 900 } else { 10 })).await;
///     Ok(sku * 100 + at.number())
/// }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let t0 = tokio::time::Instant::now();
/// assert_eq!(price(7).await.unwrap(), 702);
/// assert_eq!(t0.elapsed(), Duration::from_millis(60));
/// # }
/// ```
///
/// ## `on_retry`
///
/// Called before each pause with a [`RetryEvent`](../retries/struct.RetryEvent.html):
/// the failed attempt's number, its error, its verdict, the pause and the time
/// left. Never called after the last attempt.
///
/// ```
/// # use retries::retryable; #[derive(Debug, thiserror::Error, retries::Classify)] enum E { #[error("r")] #[classify(not_executed)] Refused, #[error(transparent)] Stopped(#[from] retries::Stopped) }
/// use std::sync::Mutex;
///
/// #[retryable(deadline = "1s", idempotent, backoff = "constant", initial_backoff = "10ms",
///             on_retry = |e: &retries::RetryEvent<'_, E>| log.lock().unwrap().push((e.attempt(), e.delay())))]
/// async fn refused(log: &Mutex<Vec<(u32, std::time::Duration)>>) -> Result<(), E> {
///     Err(E::Refused)
/// }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let log = Mutex::new(vec![]);
/// let _ = refused(&log).await;
/// let ms = std::time::Duration::from_millis(10);
/// assert_eq!(*log.lock().unwrap(), [(1, ms), (2, ms)]);
/// # }
/// ```
///
/// ## `attempt`
///
/// Names the binding of `&retries::Attempt` in the body: the attempt's
/// `number()` (1-based), the call's `idempotency_key()` (the same on every
/// attempt), `deadline()` and `remaining()`. A name that a parameter already
/// binds is a compile error (the binding would hide the parameter).
///
/// ```
/// # use retries::retryable; #[derive(Debug, thiserror::Error, retries::Classify)] enum E { #[error("r")] #[classify(not_executed)] Refused, #[error(transparent)] Stopped(#[from] retries::Stopped) }
/// #[retryable(deadline = "1s", idempotent, attempt = at)]
/// async fn keys(seen: &std::sync::Mutex<Vec<retries::IdempotencyKey>>) -> Result<(), E> {
///     seen.lock().unwrap().push(at.idempotency_key());
///     if at.is_retry() { Ok(()) } else { Err(E::Refused) }
/// }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let seen = std::sync::Mutex::new(vec![]);
/// keys(&seen).await.unwrap();
/// let seen = seen.lock().unwrap();
/// assert_eq!(seen[0], seen[1]);
/// # }
/// ```
///
/// ## `policy`
///
/// A [`Policy`](../retries/struct.Policy.html) shared by several functions;
/// the other keys override its values for this function, one setter each, and
/// keep the rest. A policy named in upper case (`policy = INVENTORY`,
/// `policy = limits::INVENTORY`) is taken as a `const`: with literal overrides
/// it is checked at compile time, like the keys themselves. Any other
/// expression (`policy = self.policy`, `policy = load()`) is evaluated at each
/// call; an invalid one is then run as `Policy`'s docs say and logged once as
/// a WARN event. A policy in a `static` named in upper case is read as a
/// `const` too, which rustc refuses ("constants cannot refer to statics"):
/// declare it `const`, or write `policy = { API }` to copy it at each call.
///
/// ```
/// # use retries::retryable; #[derive(Debug, thiserror::Error, retries::Classify)] enum E { #[error("r")] #[classify(not_executed)] Refused, #[error(transparent)] Stopped(#[from] retries::Stopped) }
/// const INVENTORY: retries::Policy = retries::Policy::new(std::time::Duration::from_secs(2))
///     .with_max_attempts(5)
///     .validated();
///
/// #[retryable(policy = INVENTORY, max_attempts = 2, idempotent, attempt = at)]
/// async fn stock() -> Result<u32, E> {
///     Err(E::Refused)
/// }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() { let _ = stock().await; }
/// ```
///
/// ## `budget` (default: a token bucket of the function's own)
///
/// Every function gets its own [`TokenBucket`](../retries/struct.TokenBucket.html)
/// (gRPC `retryThrottling` semantics, 100 tokens, ratio 0.1; it is the bucket
/// of the function's `observe::Name`, as `retries::call(…).name(…)` uses)
/// unless it names a budget shared with others, or opts out with
/// `budget = "none"`. The budget is borrowed for the call: a `static`
/// (`budget = PAYMENTS`), a field of the client (`budget = self.budget`, for
/// instance an `Arc<TokenBucket>` built from configuration), or any expression
/// whose reference implements `retries::Budget`. A budget never refuses a
/// first attempt, only retries.
///
/// ```
/// # use retries::retryable; #[derive(Debug, thiserror::Error, retries::Classify)] enum E { #[error("r")] #[classify(not_executed)] Refused, #[error(transparent)] Stopped(#[from] retries::Stopped) }
/// static PAYMENTS: retries::TokenBucket = retries::TokenBucket::new(10, 0.1);
///
/// #[retryable(deadline = "1s", idempotent, budget = PAYMENTS)]
/// async fn refused() -> Result<(), E> { Err(E::Refused) }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let _ = refused().await; // 3 failed attempts cost 3 tokens
/// assert_eq!(PAYMENTS.tokens_milli(), 7_000);
/// # }
/// ```
///
/// ## `concurrency`
///
/// `concurrency = LIMIT` takes a slot of a shared
/// [`limit::Concurrency`](../retries/limit/struct.Concurrency.html) (a
/// `static`, or a field: `concurrency = self.limit`, an `Arc` is fine) before
/// the first attempt and keeps it until the call ends, retries and pauses
/// included. A call that finds every slot taken queues, first come first
/// served, for at most the limit's `max_wait` and never past its deadline;
/// one that gets no slot stops with `Reason::Saturated` having sent nothing
/// (its error is `E::from(Stopped)`). Only on an `async fn`.
///
/// ```
/// # use retries::retryable; #[derive(Debug, thiserror::Error, retries::Classify)] enum E { #[error("r")] #[classify(not_executed)] Refused, #[error(transparent)] Stopped(#[from] retries::Stopped) }
/// use std::time::Duration;
/// use retries::limit::Concurrency;
///
/// static INVENTORY: Concurrency = Concurrency::new(16, Duration::from_millis(50));
///
/// #[retryable(deadline = "1s", idempotent, concurrency = INVENTORY)]
/// async fn stock() -> Result<u32, E> { Ok(7) }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// assert_eq!(stock().await.unwrap(), 7);
/// assert_eq!(INVENTORY.in_flight(), 0); // the slot is given back
/// # }
/// ```
///
/// ## `breaker`
///
/// A circuit breaker under the loop: it admits or refuses every attempt, and
/// counts transient failures only. `breaker(failure_threshold = N, open_for =
/// "30s", half_open_probes = 1)` gives the function a breaker of its own
/// (`open_for` defaults to `CircuitBreaker::DEFAULT_OPEN_FOR`, 30 s);
/// `breaker = EXPR` shares one (a `retries::CircuitBreaker` in a `static`, or
/// held by the client: `breaker = self.breaker`) among the functions calling
/// the same service. The threshold must exceed `max_attempts` (one bad call
/// would open it otherwise): a compile error with literals, logged once as a
/// WARN event at the first call otherwise.
///
/// ```
/// # use retries::retryable; #[derive(Debug, thiserror::Error, retries::Classify)] enum E { #[error("r")] #[classify(not_executed)] Refused, #[error(transparent)] Stopped(#[from] retries::Stopped) }
/// use std::time::Duration;
///
/// static STOCK: retries::CircuitBreaker = retries::CircuitBreaker::new(4, Duration::from_secs(30));
///
/// #[retryable(deadline = "1s", max_attempts = 3, idempotent, breaker = STOCK)]
/// async fn refused(calls: &std::sync::atomic::AtomicU32) -> Result<(), E> {
///     calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
///     Err(E::Refused)
/// }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let calls = std::sync::atomic::AtomicU32::new(0);
/// let _ = refused(&calls).await; // 3 failures: still closed
/// let _ = refused(&calls).await; // the 4th failure opens it; the call stops
/// assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 4);
/// assert_eq!(STOCK.state(), retries::BreakerState::Open);
/// assert!(matches!(refused(&calls).await, Err(E::Stopped(_)))); // refused at once
/// assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 4);
/// # }
/// ```
///
/// ## `nested` (default `"defer"`)
///
/// What the function does when it runs inside an attempt of another retried
/// call (see `retries::scope`). Either way its deadline is bounded by the outer
/// attempt's. `"defer"`: make one attempt and return its error unchanged, so
/// only the outermost loop retries (3 layers of 3 attempts make 3 calls, not
/// 27). `"own"`: retry here too.
///
/// ```
/// # use retries::retryable; #[derive(Debug, thiserror::Error, retries::Classify)] enum E { #[error("r")] #[classify(not_executed)] Refused, #[error(transparent)] Stopped(#[from] retries::Stopped) }
/// use std::sync::atomic::{AtomicU32, Ordering};
/// static BOTTOM: AtomicU32 = AtomicU32::new(0);
///
/// #[retryable(deadline = "1s", max_attempts = 3, idempotent)]
/// async fn inner() -> Result<(), E> {
///     BOTTOM.fetch_add(1, Ordering::SeqCst);
///     Err(E::Refused)
/// }
///
/// #[retryable(deadline = "1s", max_attempts = 3, idempotent)]
/// async fn outer() -> Result<(), E> {
///     inner().await
/// }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let _ = outer().await;
/// assert_eq!(BOTTOM.load(Ordering::SeqCst), 3); // not 9
/// # }
/// ```
///
/// ## `crate`
///
/// The path of the `retries` crate when it is renamed in `Cargo.toml` or
/// re-exported: every path the expansion generates starts with it.
///
/// ```
/// extern crate retries as my_retries;
///
/// #[derive(Debug, thiserror::Error, my_retries::Classify)]
/// #[classify(crate = "::my_retries")]
/// enum E {
///     #[error("refused")]
///     #[classify(not_executed)]
///     Refused,
///     #[error(transparent)]
///     Stopped(#[from] my_retries::Stopped),
/// }
///
/// #[my_retries::retryable(crate = "::my_retries", deadline = "1s", idempotent)]
/// async fn fetch() -> Result<u32, E> {
///     Ok(1)
/// }
///
/// #[tokio::main(flavor = "current_thread")]
/// async fn main() {
///     assert_eq!(fetch().await.unwrap(), 1);
/// }
/// ```
///
/// # Blocking functions
///
/// On a plain `fn` the attribute makes the same loop, on the same engine,
/// with the same keys and decision table: pauses are `std::thread::sleep`,
/// the deadline is measured on the std clock (tokio's, which follows a paused
/// test clock, when the `tokio` feature is on), nested calls, budgets,
/// breakers, `reconcile` and `recover` work the same, with plain functions
/// for the hooks. No runtime is needed, and with `default-features = false`
/// tokio is not a dependency at all.
///
/// A running thread cannot be cut off, so `attempt_timeout` is a compile
/// error on a blocking `fn` (a policy given with `policy = …` keeps its
/// attempt timeout unenforced); the deadline is checked before every attempt
/// and pause, and an attempt that fails after it has passed ends the call
/// with `DeadlineExceeded`. A `reconcile` look-up runs to its end.
///
/// ```
/// # use retries::retryable; #[derive(Debug, thiserror::Error, retries::Classify)] enum E { #[error("r")] #[classify(not_executed)] Refused, #[error(transparent)] Stopped(#[from] retries::Stopped) }
/// use std::cell::Cell;
///
/// #[retryable(deadline = "1s", max_attempts = 3, idempotent, attempt = at,
///             backoff = "constant", initial_backoff = "1ms")]
/// fn read_config(tries: &Cell<u32>) -> Result<String, E> {
///     tries.set(tries.get() + 1);
///     if at.number() < 3 { Err(E::Refused) } else { Ok("config".into()) }
/// }
///
/// let tries = Cell::new(0);
/// assert_eq!(read_config(&tries).unwrap(), "config");
/// assert_eq!(tries.get(), 3);
/// ```
///
/// # On an `impl` block
///
/// `#[retryable(...)]` on an `impl` block (inherent, or of a trait) gives its
/// keys to every `async fn` in it, as if each carried the attribute. A
/// method's own `#[retryable(...)]` overrides them key by key (and makes a
/// blocking method retried too); `#[retryable(skip)]` leaves a method as it
/// is; blocking methods without an attribute are left alone. Every method
/// must end up with `idempotent` declared (on the block or on the method);
/// if it does not, the error points at the method. An `async fn` of the
/// block that returns no `Result` is an error that asks for
/// `#[retryable(skip)]`. The block's `attempt = name` binds the context only
/// in the methods whose bodies use `name`.
///
/// The methods that set no `budget` (on the block or their own) share one
/// token bucket with the default settings, made for the block: one client
/// type, one budget, as gRPC keeps one per channel. Each method still
/// reports under its own name.
///
/// ```
/// # use retries::retryable; #[derive(Debug, thiserror::Error, retries::Classify)] enum E { #[error("r")] #[classify(not_executed)] Refused, #[error("l")] #[classify(unknown)] Lost, #[error(transparent)] Stopped(#[from] retries::Stopped) }
/// struct Inventory;
///
/// #[retryable(deadline = "2s", max_attempts = 3, idempotent, attempt = at)]
/// impl Inventory {
///     async fn stock(&self, sku: u32) -> Result<u32, E> {
///         if at.number() < 2 { Err(E::Refused) } else { Ok(sku * 10) }
///     }
///
///     #[retryable(idempotent = false)] // reserving is not safe to repeat
///     async fn reserve(&self, sku: u32) -> Result<u32, E> {
///         let _ = (at, sku);
///         Err(E::Lost)
///     }
///
///     #[retryable(skip)]
///     async fn ping(&self) -> Result<(), E> {
///         Ok(())
///     }
/// }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// assert_eq!(Inventory.stock(4).await.unwrap(), 40);
/// assert!(matches!(Inventory.reserve(4).await, Err(E::Lost))); // not repeated
/// # }
/// ```
///
/// # What the expansion does
///
/// The signature, attributes and doc comments are re-emitted unchanged; the
/// body is wrapped once, as the attempt of the engine's loop. For the `charge`
/// example at the top, with paths shortened (`__private::` items are not
/// public API) and the generated locals, which user code cannot name, spelled
/// plainly:
///
/// ```text
/// async fn charge(&self, cents: u64) -> Result<String, PayError> {
///     let policy: &Policy = {
///         const POLICY: Policy = Policy::new(Duration::from_nanos(2000000000)).with_max_attempts(3);
///         const GIVEN: &[&str] = &["deadline", "max_attempts"];  // Policy::validate, at compile time:
///         const _: () = { check(&POLICY, "deadline", GIVEN); check(&POLICY, "max_attempts", GIVEN); check_rest(&POLICY, GIVEN); };
///         &POLICY
///     };
///     let spec = spec(policy, { static NAME: Name = Name::new(concat!(module_path!(), "::charge")); &NAME })
///         .not_idempotent()
///         .classify(<<Result<String, PayError> as IsResult>::Err as Classify>::classify as fn(&_) -> Verdict)
///         .reconcile(reconcile::<Result<String, PayError>, _, _>(|key| self.lookup_charge(key)));
///     let result = drive!(spec, Result<String, PayError>, |attempt| async {
///         if false { let fake: Result<String, PayError> = loop {}; return fake; } // the return type drives inference
///         let at: &Attempt = &attempt;
///         { self.send_charge(at.idempotency_key(), cents).await }
///     });
///     finish::<Result<String, PayError>>(result)   // or: recover::<…>(result, hook).await
/// }
/// ```
///
/// Each `check` is spanned on its key, so a rule the literal values break is
/// reported there, with `Policy`'s message.
///
/// `drive!` is the one loop of `retries-core`, the same that
/// `retries::call(…).run(…)` runs: `start` (deadline check, breaker
/// admission), the attempt (polled inside the retry scope, cut off at its
/// limit), and `settle` (the decision table, `reconcile`, budget, pause).
///
/// So `self`, `&mut self`, generics and lifetimes keep their meaning, and `?`
/// and `return` in the body end the *attempt* (a `?` error is classified and
/// may be retried). Because the body runs once per attempt, an argument taken
/// by value and moved in the body is an error ("value moved here, in previous
/// iteration of loop"): borrow it, or clone it in the body. For the same
/// reason, a success value that borrows *mutably* from a parameter
/// (`async fn first(v: &mut Vec<u32>) -> Result<&mut u32, E>`) is rejected by
/// today's borrow checker ("two closures require unique access … in
/// different iterations of loop", the case its next version, Polonius,
/// accepts); return an index or an owned value instead. Shared borrows
/// (`-> Result<&str, E>` from `s: &str`) are fine.
///
/// The first attempt does no clock read, allocation or timer work when it
/// completes on its first poll; see `retries::attempt` for the lazy clock.
///
/// `#[async_trait]` methods are rejected with a message: use native `async fn`
/// in traits (supported, including default bodies), or call a `#[retryable]`
/// inherent method from the trait method.
#[proc_macro_attribute]
pub fn retryable(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand_tokens(attr.into(), item.into()).into()
}

/// Derive `retries::Classify` for an error enum (or struct): every variant is
/// classified explicitly, so the classification is exhaustive by construction
/// (a variant left out is a compile error).
///
/// * `#[classify(not_executed)]`, `#[classify(unknown)]`,
///   `#[classify(permanent)]`, `#[classify(server_refused)]` on a variant;
/// * `#[classify(overloaded)]`: not executed, refused by a service that says
///   it is overloaded (an HTTP 429, a `RESOURCE_EXHAUSTED`): what an
///   `Admission` learns from (`Verdict::with_overload`); a variant marked
///   only `not_executed` teaches it nothing;
/// * `#[classify(conflict)]`: not executed, lost to concurrent work (a
///   serialization failure, an optimistic-lock miss): retried without
///   drawing on the budget (`Verdict::with_conflict`);
/// * `#[classify(transparent)]` on a one-field variant delegates to that
///   field's own `Classify`; so does a variant whose single `#[from]` field
///   (thiserror's attribute) is the only candidate;
/// * `#[classify(retry_after)]` on a field of type `Duration` or
///   `Option<Duration>` attaches the server's requested pause;
/// * `#[classify(crate = "::my_retries")]` on the type when `retries` is renamed.
///
/// ```
/// use std::time::Duration;
/// use retries::{Classify, VerdictKind};
///
/// #[derive(Debug, thiserror::Error, Classify)]
/// enum FetchError {
///     #[error("rate limited")]
///     #[classify(not_executed)]
///     RateLimited { #[classify(retry_after)] after: Option<Duration> },
///     #[error("connection reset")]
///     #[classify(unknown)]
///     Reset,
///     #[error("not found")]
///     #[classify(permanent)]
///     NotFound,
///     #[error(transparent)]
///     Io(#[from] std::io::Error), // classified by the io::Error table
///     #[error(transparent)]
///     Stopped(#[from] retries::Stopped),
/// }
///
/// let e = FetchError::RateLimited { after: Some(Duration::from_secs(1)) };
/// assert_eq!(e.classify().kind(), VerdictKind::NotExecuted);
/// assert_eq!(e.classify().retry_after(), Some(Duration::from_secs(1)));
/// let io = FetchError::Io(std::io::ErrorKind::ConnectionRefused.into());
/// assert_eq!(io.classify().kind(), VerdictKind::NotExecuted);
/// ```
#[proc_macro_derive(Classify, attributes(classify))]
pub fn derive_classify(input: TokenStream) -> TokenStream {
    classify::derive(input.into()).into()
}

// The dispatch: a function or an `impl` block; for a function, parse, check,
// then expand or fall back.

/// Expand `#[retryable(args)] f` (or an `impl` block), or emit the errors
/// and a fallback.
fn expand_tokens(attr: TokenStream2, item: TokenStream2) -> TokenStream2 {
    if let Ok(syn::Item::Impl(block)) = syn::parse2::<syn::Item>(item.clone()) {
        return crate::impl_block::expand(attr, block);
    }
    retryable_at(attr, item, Span::call_site())
}

/// [`expand_tokens`] for one function, missing keys reported at `site`.
pub(crate) fn retryable_at(attr: TokenStream2, item: TokenStream2, site: Span) -> TokenStream2 {
    let mut errors = Errors::default();
    let args = crate::args::parse(attr, &mut errors);
    let f = match item::parse(item, &mut errors) {
        Ok(f) => f,
        Err(tokens) => {
            let errors = errors.into_tokens();
            return quote!(#errors #tokens);
        }
    };
    let shape_ok = item::check(&f, &mut errors);
    let at_named = item::check_attempt_name(&f, args.attempt.as_ref(), &mut errors);
    crate::valid::validate(&args, &mut errors, site);
    if f.sig.asyncness.is_none() {
        crate::valid::blocking(&args, &mut errors);
    }
    let krate = args
        .krate
        .clone()
        .unwrap_or_else(|| syn::parse_quote!(::retries));
    if !shape_ok || !errors.is_empty() {
        let fallback = fallback::fallback(&f, &args, &krate, shape_ok && at_named);
        let errors = errors.into_tokens();
        return quote!(#errors #fallback);
    }
    expand::generate(&f, &args, &krate)
}
