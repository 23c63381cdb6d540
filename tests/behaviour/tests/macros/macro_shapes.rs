//! `#[retryable]` on every shape of function it supports, each exercised on
//! the paused clock: free fns, `&self`, `&mut self`, generics with where
//! clauses and lifetimes, `impl Trait` arguments, trait impl methods, default
//! bodies of `async fn` in traits, visibility, and `?`/`return` per attempt.

use std::fmt::Display;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use retries::{Classify, Verdict, retryable};
use tokio::time::Instant;

#[derive(Debug, thiserror::Error, Classify)]
enum Error {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error("lost after sending")]
    #[classify(unknown)]
    Lost,
    #[error("bad request")]
    #[classify(permanent)]
    Bad,
    #[error("stopped: {0}")]
    Stopped(#[from] retries::Stopped),
}

impl PartialEq for Error {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Error::Stopped(a), Error::Stopped(b)) => a.reason() == b.reason(),
            (a, b) => std::mem::discriminant(a) == std::mem::discriminant(b),
        }
    }
}

/// Fails with `err` until the `n`th call, then returns the call number.
struct Flaky {
    calls: AtomicU32,
    succeed_at: u32,
    err: fn() -> Error,
}

impl Flaky {
    fn new(succeed_at: u32, err: fn() -> Error) -> Self {
        Self {
            calls: AtomicU32::new(0),
            succeed_at,
            err,
        }
    }

    async fn hit(&self) -> Result<u32, Error> {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n < self.succeed_at {
            Err((self.err)())
        } else {
            Ok(n)
        }
    }

    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
}

// --- free function -----------------------------------------------------------

#[retryable(
    deadline = "1s",
    max_attempts = 3,
    idempotent,
    backoff = "constant",
    initial_backoff = "10ms"
)]
async fn free(f: &Flaky) -> Result<u32, Error> {
    f.hit().await
}

#[tokio::test(start_paused = true)]
async fn free_function() {
    let f = Flaky::new(3, || Error::Refused);
    let t0 = Instant::now();
    assert_eq!(free(&f).await, Ok(3));
    // three 1 ms attempts and two 10 ms pauses
    assert_eq!(t0.elapsed(), Duration::from_millis(23));
    let f = Flaky::new(9, || Error::Refused);
    assert_eq!(free(&f).await, Err(Error::Refused));
    assert_eq!(f.calls(), 3);
}

// --- methods -----------------------------------------------------------------

struct Client {
    flaky: Flaky,
    log: Vec<u32>,
}

impl Client {
    #[retryable(deadline = "1s", idempotent, attempt = at, backoff = "constant", initial_backoff = "1ms")]
    async fn shared(&self) -> Result<u32, Error> {
        let n = self.flaky.hit().await?;
        Ok(n * 100 + at.number())
    }

    #[retryable(deadline = "1s", idempotent, attempt = at, backoff = "constant", initial_backoff = "1ms")]
    async fn exclusive(&mut self) -> Result<usize, Error> {
        self.log.push(at.number());
        self.flaky.hit().await?;
        Ok(self.log.len())
    }
}

#[tokio::test(start_paused = true)]
async fn methods_with_shared_and_exclusive_self() {
    let c = Client {
        flaky: Flaky::new(2, || Error::Lost),
        log: Vec::new(),
    };
    assert_eq!(c.shared().await, Ok(202));
    let mut c = Client {
        flaky: Flaky::new(3, || Error::Refused),
        log: Vec::new(),
    };
    assert_eq!(c.exclusive().await, Ok(3));
    assert_eq!(c.log, [1, 2, 3]);
}

// --- generics, where clauses, lifetimes, impl Trait ---------------------------

#[retryable(
    deadline = "1s",
    idempotent,
    backoff = "constant",
    initial_backoff = "1ms"
)]
async fn generic<'a, T, F>(items: &'a [T], pick: F) -> Result<&'a T, Error>
where
    T: PartialEq + Sync,
    F: Fn(&T) -> bool,
{
    items.iter().find(|t| pick(t)).ok_or(Error::Bad)
}

#[retryable(
    deadline = "1s",
    idempotent,
    backoff = "constant",
    initial_backoff = "1ms"
)]
async fn impl_trait_arg(label: impl Display + Sync, f: &Flaky) -> Result<String, Error> {
    let n = f.hit().await?;
    Ok(format!("{label}#{n}"))
}

#[tokio::test(start_paused = true)]
async fn generics_lifetimes_and_impl_trait() {
    let xs = [1, 2, 3];
    assert_eq!(generic(&xs, |x| *x == 2).await, Ok(&2));
    assert_eq!(generic(&xs, |x| *x == 9).await, Err(Error::Bad));
    let f = Flaky::new(2, || Error::Refused);
    assert_eq!(impl_trait_arg("item", &f).await, Ok("item#2".to_string()));
}

// --- traits ------------------------------------------------------------------

trait Store {
    fn flaky(&self) -> &Flaky;

    /// A default body, retried.
    #[retryable(
        deadline = "1s",
        idempotent,
        backoff = "constant",
        initial_backoff = "1ms"
    )]
    async fn load(&self) -> Result<u32, Error> {
        self.flaky().hit().await
    }

    async fn save(&self, v: u32) -> Result<u32, Error>;
}

struct Disk(Flaky);

impl Store for Disk {
    fn flaky(&self) -> &Flaky {
        &self.0
    }

    #[retryable(
        deadline = "1s",
        idempotent,
        backoff = "constant",
        initial_backoff = "1ms"
    )]
    async fn save(&self, v: u32) -> Result<u32, Error> {
        Ok(self.0.hit().await? + v)
    }
}

#[tokio::test(start_paused = true)]
async fn trait_default_bodies_and_impl_methods() {
    let d = Disk(Flaky::new(3, || Error::Lost));
    assert_eq!(d.load().await, Ok(3));
    assert_eq!(d.save(10).await, Ok(14));
}

// --- visibility --------------------------------------------------------------

mod inner {
    use super::{Error, Flaky, retryable};

    #[retryable(deadline = "1s", idempotent)]
    pub(crate) async fn visible(f: &Flaky) -> Result<u32, Error> {
        f.hit().await
    }
}

#[tokio::test(start_paused = true)]
async fn visibility_is_kept() {
    assert_eq!(inner::visible(&Flaky::new(1, || Error::Bad)).await, Ok(1));
}

// --- `?` and `return` mean the same per attempt -------------------------------

#[retryable(deadline = "1s", idempotent, attempt = at, backoff = "constant", initial_backoff = "1ms")]
async fn early_return(f: &Flaky) -> Result<&'static str, Error> {
    if at.number() == 2 {
        return Err(Error::Refused); // ends attempt 2 only
    }
    let n = f.hit().await?; // a failure ends this attempt only
    if n >= 2 {
        return Ok("returned early"); // ends the call with success
    }
    Ok("fell through")
}

#[tokio::test(start_paused = true)]
async fn question_mark_and_return_end_the_attempt() {
    // attempt 1: hit #1 fails (?); attempt 2: early Err; attempt 3: hit #2 ok.
    let f = Flaky::new(2, || Error::Refused);
    let started = Instant::now();
    assert_eq!(early_return(&f).await, Ok("returned early"));
    assert_eq!(f.calls(), 2);
    assert_eq!(started.elapsed(), Duration::from_millis(4));
}

// --- a retried fn is an ordinary future: spawn it ----------------------------

#[tokio::test(start_paused = true)]
async fn spawned_tasks_work() {
    let c = std::sync::Arc::new(Client {
        flaky: Flaky::new(2, || Error::Refused),
        log: Vec::new(),
    });
    let task = tokio::spawn(async move { c.shared().await });
    assert_eq!(task.await.unwrap(), Ok(202));
}

#[test]
fn error_classification_is_derived() {
    assert_eq!(Error::Refused.classify(), Verdict::not_executed());
    assert_eq!(Error::Lost.classify(), Verdict::unknown());
    assert_eq!(Error::Bad.classify(), Verdict::permanent());
}

// --- regression: literals substituted by `macro_rules!` ---------------------

/// `$d:literal` reaches the attribute wrapped in an invisible group; the
/// literal checks must still see (and check) the literal inside.
macro_rules! retried_with {
    ($name:ident, $deadline:literal, $attempts:literal, $backoff:literal) => {
        #[retryable(deadline = $deadline, max_attempts = $attempts, idempotent,
                                            backoff = "constant", initial_backoff = $backoff,
                                            breaker(failure_threshold = 10, open_for = $deadline))]
        async fn $name(f: &Flaky) -> Result<u32, Error> {
            f.hit().await
        }
    };
}

retried_with!(through_macro_rules, "1s", 4, "20ms");

#[tokio::test(start_paused = true)]
async fn regression_literals_from_macro_rules_are_parsed_as_literals() {
    let f = Flaky::new(4, || Error::Refused);
    let t0 = Instant::now();
    assert_eq!(through_macro_rules(&f).await, Ok(4));
    assert_eq!(t0.elapsed(), Duration::from_millis(4 + 3 * 20));
}
