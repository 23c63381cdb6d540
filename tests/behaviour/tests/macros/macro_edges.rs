//! More shapes the attribute must keep working: `Result<Self, E>`, pattern
//! and `mut` parameters, const generics, generic impl blocks, type aliases,
//! policies built at run time in `&mut self` methods, hooks written as
//! closures without annotations, and async `recover`; `Arc<Self>` and
//! `Pin<&Self>` receivers, parameters named like the loop's locals, `FnMut`
//! and `&mut` parameters, borrowed and opaque return types, `instrument` on
//! either side, items and `select!` in bodies, generic and associated error
//! types, raw identifiers and patterns; every key at once still `Send`; and
//! a body that panics gives back its slot, its probe and its scope.

#![deny(warnings)]

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use retries::{Classify, Failure, Policy, Verdict, retryable};

#[derive(Debug, thiserror::Error, PartialEq, Classify)]
enum Error {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error("bad request")]
    #[classify(permanent)]
    Bad,
    #[error("gave up after {0} attempts")]
    #[classify(permanent)]
    GaveUp(u32),
    #[error("stopped")]
    #[classify(permanent)]
    Stopped,
}

impl From<retries::Stopped> for Error {
    fn from(_: retries::Stopped) -> Self {
        Error::Stopped
    }
}

type Res<T> = Result<T, Error>;

mod limits {
    use std::time::Duration;

    pub(crate) const API: retries::Policy = retries::Policy::new(Duration::from_secs(1))
        .with_max_attempts(5)
        .with_backoff(retries::Backoff::constant(Duration::from_millis(10)));
}

struct Conn {
    id: u32,
}

static DIALS: AtomicU32 = AtomicU32::new(0);

impl Conn {
    /// A constructor: `Result<Self, E>`, with a policy from another module
    /// and one override.
    #[retryable(policy = limits::API, max_attempts = 3, idempotent, attempt = at)]
    async fn dial() -> Result<Self, Error> {
        DIALS.fetch_add(1, Ordering::SeqCst);
        if at.number() < 3 {
            return Err(Error::Refused);
        }
        Ok(Self { id: at.number() })
    }
}

#[tokio::test(start_paused = true)]
async fn result_of_self_and_a_policy_path_with_an_override() {
    let t0 = tokio::time::Instant::now();
    assert_eq!(Conn::dial().await.map(|c| c.id), Ok(3));
    assert_eq!(DIALS.load(Ordering::SeqCst), 3);
    assert_eq!(t0.elapsed(), Duration::from_millis(20));
}

#[retryable(deadline = "1s", idempotent, attempt = at)]
async fn patterns((a, b): (u32, u32), mut acc: Vec<u32>) -> Res<Vec<u32>> {
    acc.push(a + b + at.number());
    if at.number() < 2 {
        return Err(Error::Refused);
    }
    Ok(acc.clone())
}

#[retryable(deadline = "1s", idempotent, attempt = at)]
async fn nth<const N: usize>(items: [u32; N]) -> Res<u32> {
    items.get(at.number() as usize).copied().ok_or(Error::Bad)
}

#[tokio::test(start_paused = true)]
async fn pattern_mut_and_const_generic_parameters() {
    // `acc` lives in the function, so each attempt sees what earlier ones pushed.
    assert_eq!(patterns((1, 2), vec![]).await, Ok(vec![4, 5]));
    assert_eq!(nth([7, 8, 9]).await, Ok(8));
    assert_eq!(nth([7]).await, Err(Error::Bad));
}

struct Store<T> {
    value: T,
    misses: AtomicU32,
}

impl<T: Clone + Send + Sync> Store<T> {
    #[retryable(
        deadline = "1s",
        max_attempts = 4,
        idempotent,
        backoff = "constant",
        initial_backoff = "5ms"
    )]
    async fn get(&self) -> Result<T, Error>
    where
        T: std::fmt::Debug,
    {
        if self.misses.fetch_add(1, Ordering::SeqCst) < 2 {
            return Err(Error::Refused);
        }
        Ok(self.value.clone())
    }
}

#[tokio::test(start_paused = true)]
async fn a_method_of_a_generic_impl_block() {
    let s = Store {
        value: "v".to_string(),
        misses: AtomicU32::new(0),
    };
    assert_eq!(s.get().await, Ok("v".to_string()));
    assert_eq!(s.misses.load(Ordering::SeqCst), 3);
}

/// A client whose limits come from configuration, with `&mut self` methods.
struct Client {
    policy: Policy,
    attempts: u32,
    log: Vec<u32>,
}

impl Client {
    #[retryable(policy = self.policy, max_attempts = self.attempts, idempotent, attempt = at)]
    async fn push(&mut self) -> Res<usize> {
        self.log.push(at.number());
        if at.number() < 3 {
            return Err(Error::Refused);
        }
        Ok(self.log.len())
    }
}

#[tokio::test(start_paused = true)]
async fn a_run_time_policy_in_a_mut_self_method() {
    let mut c = Client {
        policy: Policy::new(Duration::from_secs(1)).with_backoff(retries::Backoff::NONE),
        attempts: 3,
        log: vec![],
    };
    assert_eq!(c.push().await, Ok(3));
    c.log.clear();
    c.attempts = 2;
    assert_eq!(c.push().await, Err(Error::Refused));
    assert_eq!(c.log, [1, 2]);
}

static SEEN: Mutex<Vec<(u32, Duration)>> = Mutex::new(Vec::new());

#[retryable(
    deadline = "1s",
    max_attempts = 3,
    idempotent,
    backoff = "constant",
    initial_backoff = "7ms",
    classify = |e| if *e == Error::Bad { Verdict::not_executed() } else { e.classify() },
    on_retry = |ev| SEEN.lock().unwrap().push((ev.attempt(), ev.delay())),
    recover = async |f: Failure<Error>| Err(Error::GaveUp(f.attempts())),
)]
async fn unannotated_hooks() -> Res<()> {
    Err(Error::Bad)
}

#[tokio::test(start_paused = true)]
async fn hooks_as_closures_without_annotations_and_an_async_recover() {
    assert_eq!(unannotated_hooks().await, Err(Error::GaveUp(3)));
    let ms = Duration::from_millis(7);
    assert_eq!(*SEEN.lock().unwrap(), [(1, ms), (2, ms)]);
}

#[retryable(deadline = "1s", idempotent, attempt = at)]
async fn boxed(path: &str) -> Result<usize, Box<dyn std::error::Error + Send + Sync>> {
    if at.number() == 1 {
        // `?` on an io::Error converts it into the declared box; refused is
        // not executed, so the call is retried.
        Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))?;
    }
    if path.is_empty() {
        // A boxed error of an unknown type is permanent: not retried.
        return Err("empty path".into());
    }
    Ok(path.len() + at.number() as usize)
}

#[tokio::test(start_paused = true)]
async fn boxed_errors_are_classified_by_their_cause() {
    assert_eq!(boxed("abc").await.unwrap(), 5);
    assert_eq!(boxed("").await.unwrap_err().to_string(), "empty path");
}

static GRPC: Mutex<Vec<Duration>> = Mutex::new(Vec::new());

#[retryable(
    deadline = "5s",
    max_attempts = 5,
    idempotent,
    backoff = "grpc",
    initial_backoff = "100ms",
    multiplier = 2.0,
    max_backoff = "300ms",
    jitter = "none",
    on_retry = |ev| GRPC.lock().unwrap().push(ev.delay()),
)]
async fn grpc_backoff() -> Res<()> {
    Err(Error::Refused)
}

#[tokio::test(start_paused = true)]
async fn the_grpc_backoff_kind_from_the_attribute() {
    let t0 = tokio::time::Instant::now();
    assert_eq!(grpc_backoff().await, Err(Error::Refused));
    let ms = Duration::from_millis;
    assert_eq!(*GRPC.lock().unwrap(), [ms(100), ms(200), ms(300), ms(300)]);
    assert_eq!(t0.elapsed(), ms(900));
}

/// What each attempt of `every_limit` saw: its number, its own time limit
/// and the call's usable deadline, both from the attempt's start.
static LIMITS: Mutex<Vec<(u32, Duration, Duration)>> = Mutex::new(Vec::new());

// Every duration key the attribute reads as a literal (a policy packed in
// `__private::LitAll`), with a proportional jitter of factor 0 (exact).
#[retryable(
    deadline = "2s",
    max_attempts = 3,
    idempotent,
    attempt_timeout = "150ms",
    reserve = "500ms",
    min_attempt = "20ms",
    backoff = "constant",
    initial_backoff = "40ms",
    jitter = 0.0,
    attempt = at,
)]
async fn every_limit() -> Res<()> {
    let start = std::time::Instant::from(tokio::time::Instant::now());
    LIMITS.lock().unwrap().push((
        at.number(),
        at.deadline() - start,
        at.call_deadline() - start,
    ));
    Err(Error::Refused)
}

#[tokio::test(start_paused = true)]
async fn every_literal_key_reaches_the_policy() {
    let t0 = tokio::time::Instant::now();
    assert_eq!(every_limit().await, Err(Error::Refused));
    let ms = Duration::from_millis;
    // Three attempts 40 ms apart; each limited to 150 ms; the usable
    // deadline is 2 s less the 500 ms reserve, counted from the call's start.
    assert_eq!(
        *LIMITS.lock().unwrap(),
        [
            (1, ms(150), ms(1_500)),
            (2, ms(150), ms(1_460)),
            (3, ms(150), ms(1_420)),
        ]
    );
    assert_eq!(t0.elapsed(), ms(80));
}

/// A policy in a `static`, copied at each call (`{ SHARED }`).
static SHARED: Policy = Policy::new(Duration::from_secs(1)).with_max_attempts(2);

static SHARED_TRIES: AtomicU32 = AtomicU32::new(0);

#[retryable(policy = { SHARED }, idempotent, backoff = "constant", initial_backoff = "1ms")]
async fn from_a_static() -> Res<()> {
    SHARED_TRIES.fetch_add(1, Ordering::SeqCst);
    Err(Error::Refused)
}

#[tokio::test(start_paused = true)]
async fn a_policy_in_a_static_copied_at_each_call() {
    assert_eq!(from_a_static().await, Err(Error::Refused));
    assert_eq!(SHARED_TRIES.load(Ordering::SeqCst), 2);
}

// ---- receivers, parameters and bodies of every shape -------------------------

struct Svc {
    tries: AtomicU32,
}

impl Svc {
    const FAILS: u32 = 2;

    fn next(&self) -> u32 {
        self.tries.fetch_add(1, Ordering::SeqCst)
    }

    /// `self: Arc<Self>`, and `Self::…` in the body.
    #[retryable(
        deadline = "1s",
        idempotent,
        backoff = "constant",
        initial_backoff = "1ms"
    )]
    async fn shared(self: std::sync::Arc<Self>) -> Res<u32> {
        if self.next() < Self::FAILS {
            return Err(Error::Refused);
        }
        Ok(Self::FAILS)
    }

    /// `self: Pin<&Self>`.
    #[retryable(deadline = "1s", idempotent)]
    async fn pinned(self: std::pin::Pin<&Self>) -> Res<u32> {
        Ok(self.next())
    }
}

/// Parameters named like the loop's own locals, one with an attribute.
#[retryable(deadline = "1s", idempotent, attempt = at, backoff = "constant", initial_backoff = "1ms")]
async fn loop_names(
    #[allow(unused_variables)] unused: u32,
    engine: u32,
    timer: u32,
    outcome: u32,
    stop: u32,
    pause: u32,
) -> Res<u32> {
    if at.number() == 1 {
        return Err(Error::Refused);
    }
    Ok(engine + timer + outcome + stop + pause + at.number())
}

/// An `FnMut` taken by value and called on every attempt.
#[retryable(
    deadline = "1s",
    idempotent,
    backoff = "constant",
    initial_backoff = "1ms"
)]
async fn calls_fn_mut(mut next: impl FnMut() -> u32) -> Res<u32> {
    match next() {
        n if n < 3 => Err(Error::Refused),
        n => Ok(n),
    }
}

/// A `&mut` parameter, borrowed again by every attempt.
#[retryable(
    deadline = "1s",
    idempotent,
    backoff = "constant",
    initial_backoff = "1ms"
)]
async fn pushes(log: &mut Vec<u32>) -> Res<usize> {
    log.push(1);
    if log.len() < 3 {
        return Err(Error::Refused);
    }
    Ok(log.len())
}

/// A value borrowed from a parameter, and `impl Trait` in the return type.
#[retryable(deadline = "1s", idempotent)]
async fn tail(s: &str) -> Res<&str> {
    Ok(&s[1..])
}

#[retryable(deadline = "1s", idempotent)]
async fn opaque() -> Res<impl std::fmt::Display> {
    Ok(5_u32)
}

/// `#[tracing::instrument]` on either side of the attribute.
#[retryable(deadline = "1s", idempotent)]
#[tracing::instrument]
async fn instrumented_inside(x: u32) -> Res<u32> {
    Ok(x)
}

#[tracing::instrument]
#[retryable(deadline = "1s", idempotent)]
async fn instrumented_outside(x: u32) -> Res<u32> {
    Ok(x)
}

/// Items, labelled loops, `select!` and closures inside the body.
#[retryable(deadline = "1s", idempotent, attempt = at, backoff = "constant", initial_backoff = "1ms")]
async fn busy_body(stop_at: u32) -> Res<u32> {
    const STEP: u32 = 10;
    fn scaled(n: u32) -> u32 {
        n * STEP
    }
    let mut n = 0;
    'outer: loop {
        for i in 0.. {
            if i == stop_at {
                break 'outer;
            }
            n += 1;
        }
    }
    let quick = tokio::select! {
        v = async { n } => v,
        () = tokio::time::sleep(Duration::from_millis(5)) => 0,
    };
    let add = |m: u32| m + at.number();
    if at.number() < 2 {
        return Err(Error::Refused);
    }
    Ok(add(scaled(quick)))
}

/// A generic error type: it says in its bounds what a stop needs.
#[retryable(
    deadline = "1s",
    idempotent,
    backoff = "constant",
    initial_backoff = "1ms"
)]
async fn generic_error<E>(mut op: impl FnMut() -> Result<u32, E>) -> Result<u32, E>
where
    E: Classify + From<retries::Stopped> + std::error::Error + Send + Sync + 'static,
{
    op()
}

trait Backend {
    type Error: Classify + From<retries::Stopped> + std::error::Error + Send + Sync + 'static;
    fn get(&self) -> Result<u32, Self::Error>;
}

struct Shelf;

impl Backend for Shelf {
    type Error = Error;
    fn get(&self) -> Res<u32> {
        Ok(7)
    }
}

/// An associated error type, and a higher-ranked bound.
#[retryable(deadline = "1s", idempotent)]
async fn through<S: Backend + Sync, F>(s: &S, f: F) -> Result<u32, <S as Backend>::Error>
where
    F: for<'a> Fn(&'a str) -> u32,
{
    Ok(s.get()? + f("abc"))
}

/// Raw identifiers, patterns of slices and structs, `dyn` arguments, and a
/// type parameter only the caller names.
#[retryable(deadline = "1s", idempotent)]
async fn odd_parameters(
    r#type: u32,
    &[a, b]: &[u32; 2],
    Pair { left, right }: Pair,
    shown: &(dyn std::fmt::Display + Sync),
) -> Res<String> {
    Ok(format!("{} {shown}", r#type + a + b + left + right))
}

#[derive(Clone, Copy)]
struct Pair {
    left: u32,
    right: u32,
}

#[retryable(deadline = "1s", idempotent)]
async fn made<T: Default + Send>() -> Res<T> {
    Ok(T::default())
}

#[tokio::test(start_paused = true)]
async fn receivers_parameters_and_bodies_of_every_shape() {
    let svc = std::sync::Arc::new(Svc {
        tries: AtomicU32::new(0),
    });
    assert_eq!(std::sync::Arc::clone(&svc).shared().await, Ok(2));
    assert_eq!(svc.tries.load(Ordering::SeqCst), 3, "two refused, then one");
    assert_eq!(std::pin::Pin::new(&*svc).pinned().await, Ok(3));

    assert_eq!(loop_names(0, 1, 2, 3, 4, 5).await, Ok(17));

    let mut calls = 0;
    let next = || {
        calls += 1;
        calls
    };
    assert_eq!(calls_fn_mut(next).await, Ok(3));
    assert_eq!(calls, 3);

    let mut log = Vec::new();
    assert_eq!(pushes(&mut log).await, Ok(3));
    assert_eq!(log, [1, 1, 1]);

    assert_eq!(tail("abc").await, Ok("bc"));
    assert_eq!(opaque().await.unwrap().to_string(), "5");
    assert_eq!(instrumented_inside(4).await, Ok(4));
    assert_eq!(instrumented_outside(4).await, Ok(4));
    assert_eq!(busy_body(3).await, Ok(32));

    let mut left = 2;
    let t0 = tokio::time::Instant::now();
    let op = || {
        left -= 1;
        if left > 0 { Err(Error::Refused) } else { Ok(9) }
    };
    assert_eq!(generic_error(op).await, Ok(9));
    assert_eq!(t0.elapsed(), Duration::from_millis(1), "one pause");
    assert_eq!(
        generic_error(|| Err::<u32, _>(std::io::Error::from(std::io::ErrorKind::NotFound)))
            .await
            .unwrap_err()
            .kind(),
        std::io::ErrorKind::NotFound
    );

    assert_eq!(through(&Shelf, |s: &str| s.len() as u32).await, Ok(10));
    assert_eq!(
        odd_parameters(1, &[2, 3], Pair { left: 4, right: 5 }, &"x").await,
        Ok("15 x".to_owned())
    );
    assert_eq!(made::<u8>().await, Ok(0));
}

// ---- every key at once still gives a `Send` future ------------------------------

static SEND_BUDGET: retries::TokenBucket = retries::TokenBucket::DEFAULT;
static SEND_BREAKER: retries::CircuitBreaker =
    retries::CircuitBreaker::new(10, Duration::from_secs(1));
static SEND_LIMIT: retries::limit::Concurrency =
    retries::limit::Concurrency::new(4, Duration::from_millis(50));

async fn lookup_sent(_: retries::IdempotencyKey) -> Res<Option<u32>> {
    Ok(None)
}

async fn recover_sent<T>(f: Failure<Error>) -> Result<T, Error> {
    Err(Error::GaveUp(f.attempts()))
}

#[retryable(
    deadline = "1s",
    max_attempts = 3,
    idempotent = false,
    reconcile = lookup_sent,
    recover = recover_sent,
    on_retry = |_| {},
    retry_if = |v: &u32| (*v == 0).then(retries::Verdict::not_executed),
    classify = |e: &Error| e.classify(),
    budget = SEND_BUDGET,
    breaker = SEND_BREAKER,
    concurrency = SEND_LIMIT,
    backoff = "constant",
    initial_backoff = "1ms",
    attempt = at,
    nested = "own"
)]
async fn every_key(n: u32) -> Res<u32> {
    let number = at.number();
    tokio::task::yield_now().await;
    if number < 2 {
        return Err(Error::Refused);
    }
    Ok(n + number)
}

#[retryable(deadline = "1s", idempotent, hedge(max_attempts = 2, delay = "5ms"))]
async fn hedged_sent(n: u32) -> Res<u32> {
    tokio::task::yield_now().await;
    Ok(n)
}

fn spawnable<F: Future + Send + 'static>(f: F) -> F {
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_at_once_gives_a_send_future() {
    let a = tokio::spawn(spawnable(every_key(1)));
    let b = tokio::spawn(spawnable(hedged_sent(7)));
    assert_eq!(a.await.unwrap(), Ok(3));
    assert_eq!(b.await.unwrap(), Ok(7));
}

// ---- a body that panics --------------------------------------------------------

static PANIC_LIMIT: retries::limit::Concurrency =
    retries::limit::Concurrency::new(1, Duration::ZERO);
static PANIC_TRIES: AtomicU32 = AtomicU32::new(0);

#[retryable(
    deadline = "1s",
    max_attempts = 3,
    idempotent,
    attempt = at,
    budget = "none",
    backoff = "constant",
    initial_backoff = "1ms",
    concurrency = PANIC_LIMIT
)]
async fn may_panic(panics: bool) -> Res<u32> {
    PANIC_TRIES.fetch_add(1, Ordering::SeqCst);
    assert!(!panics, "the body panicked");
    if at.number() == 1 {
        return Err(Error::Refused);
    }
    Ok(at.number())
}

/// A panic unwinds through the loop: the slot comes back, and the attempt's
/// scope is taken off the thread (a later call on it is not mistaken for a
/// nested one, which would make a single attempt).
#[tokio::test(start_paused = true)]
async fn a_panicking_body_gives_back_its_slot_and_scope() {
    let joined = tokio::spawn(may_panic(true)).await;
    assert!(joined.unwrap_err().is_panic());
    assert_eq!(PANIC_LIMIT.in_flight(), 0, "the slot came back");
    // Caught on this very thread: the scope the attempt had entered is gone.
    let caught = CatchUnwind(Box::pin(may_panic(true))).await;
    assert!(caught.is_err());
    assert!(retries::scope::deadline().is_none(), "no scope left behind");
    assert_eq!(PANIC_LIMIT.in_flight(), 0);
    PANIC_TRIES.store(0, Ordering::SeqCst);
    assert_eq!(may_panic(false).await, Ok(2), "a loop of its own");
    assert_eq!(PANIC_TRIES.load(Ordering::SeqCst), 2);
}

static PROBED: retries::CircuitBreaker =
    retries::CircuitBreaker::new(2, Duration::from_millis(100));

#[retryable(deadline = "1s", max_attempts = 1, idempotent, budget = "none", breaker = PROBED)]
async fn probe(step: u8) -> Res<u32> {
    match step {
        0 => Err(Error::Refused),
        1 => panic!("the probe panicked"),
        _ => Ok(1),
    }
}

/// A half-open breaker's probe that panics gives its probe slot back: the
/// next call is admitted as the probe, not refused as `CircuitOpen`.
#[tokio::test(start_paused = true)]
async fn a_panicking_probe_gives_its_probe_back() {
    assert_eq!(probe(0).await, Err(Error::Refused));
    assert_eq!(probe(0).await, Err(Error::Refused));
    assert_eq!(probe(2).await, Err(Error::Stopped), "open");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(CatchUnwind(Box::pin(probe(1))).await.is_err());
    assert_eq!(
        probe(2).await,
        Ok(1),
        "admitted as the probe, and closes it"
    );
    assert_eq!(probe(2).await, Ok(1));
}

/// A future's panic, caught on this thread.
struct CatchUnwind<F>(std::pin::Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = std::thread::Result<F::Output>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let fut = self.0.as_mut();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(std::task::Poll::Ready(v)) => std::task::Poll::Ready(Ok(v)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(p) => std::task::Poll::Ready(Err(p)),
        }
    }
}
