//! Shared state held the way clients hold it: budgets and breakers in an `Arc`
//! inside a struct, built at run time from configuration, or reached through
//! a lazily built static; through the attribute and through `retries::call`.
//! And `policy = P` with overrides changes only what was overridden.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use retries::observe::Name;
use retries::{
    Attempt, Backoff, BreakerState, CircuitBreaker, Classify, Jitter, Policy, RatioBudget, Reason,
    TokenBucket, Verdict, retryable,
};
use tokio::time::Instant;

// `call(&policy)`: `retries::call` under this file's own name.
crate::common::named_call!();

#[derive(Debug, thiserror::Error, PartialEq)]
enum E {
    #[error("refused")]
    Refused,
    #[error("stopped: {0}")]
    Stopped(String),
}

impl From<retries::Stopped> for E {
    fn from(s: retries::Stopped) -> Self {
        E::Stopped(s.reason().as_str().to_string())
    }
}

impl Classify for E {
    fn classify(&self) -> Verdict {
        match self {
            E::Refused => Verdict::not_executed(),
            E::Stopped(_) => Verdict::permanent(),
        }
    }
}

/// What a service reads from its configuration file.
struct Config {
    max_tokens: u32,
    token_ratio: f64,
    failure_threshold: u32,
    open_for: Duration,
}

/// A client holding its budget and breaker as tower users do: in `Arc`s,
/// shared by its clones.
#[derive(Clone)]
struct Client {
    budget: Arc<TokenBucket>,
    breaker: Arc<CircuitBreaker>,
    calls: Arc<AtomicU32>,
}

impl Client {
    fn from_config(c: &Config) -> Self {
        Self {
            budget: Arc::new(TokenBucket::try_new(c.max_tokens, c.token_ratio).unwrap()),
            breaker: Arc::new(CircuitBreaker::try_new(c.failure_threshold, c.open_for, 1).unwrap()),
            calls: Arc::default(),
        }
    }

    #[retryable(
        deadline = "1s",
        max_attempts = 3,
        idempotent,
        budget = self.budget,
        breaker = self.breaker,
        backoff = "constant",
        initial_backoff = "10ms"
    )]
    async fn refused(&self) -> Result<(), E> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(E::Refused)
    }

    /// The same, through the builder.
    async fn refused_by_builder(&self) -> Result<(), E> {
        const P: Policy = Policy::new(Duration::from_secs(1))
            .with_max_attempts(3)
            .with_backoff(Backoff::constant(Duration::from_millis(10)))
            .validated();
        call(&P)
            .idempotent()
            .budget(Arc::clone(&self.budget))
            .breaker(&*self.breaker)
            .run(async |_: &Attempt| {
                self.calls.fetch_add(1, Ordering::SeqCst);
                Err(E::Refused)
            })
            .await
    }
}

const CONFIG: Config = Config {
    max_tokens: 10,
    token_ratio: 0.5,
    failure_threshold: 6,
    open_for: Duration::from_mins(1),
};

#[tokio::test(start_paused = true)]
async fn arc_held_budget_and_breaker_through_the_attribute() {
    let client = Client::from_config(&CONFIG);
    let clone = client.clone(); // shares the budget and the breaker
    // Call 1: three refused attempts; the bucket loses three tokens (10 → 7),
    // the breaker counts three consecutive failures.
    assert_eq!(client.refused().await, Err(E::Refused));
    assert_eq!(client.calls.load(Ordering::SeqCst), 3);
    assert_eq!(client.budget.tokens_milli(), 7_000);
    assert_eq!(client.breaker.state(), BreakerState::Closed { failures: 3 });
    // Call 2, from the clone: two failures (7 → 5 tokens); 5 is not above
    // half of 10, so the budget refuses the third attempt: a stop.
    assert_eq!(
        clone.refused().await,
        Err(E::Stopped("budget_exhausted".into()))
    );
    assert_eq!(client.calls.load(Ordering::SeqCst), 5);
    assert_eq!(client.budget.tokens_milli(), 5_000);
    assert_eq!(client.breaker.state(), BreakerState::Closed { failures: 5 });
    // Call 3: one attempt, the sixth failure in a row: the breaker opens;
    // the budget refuses the retry.
    assert_eq!(
        client.refused().await,
        Err(E::Stopped("budget_exhausted".into()))
    );
    assert_eq!(client.calls.load(Ordering::SeqCst), 6);
    assert_eq!(client.breaker.state(), BreakerState::Open);
    // Call 4: refused by the open breaker without calling the body.
    assert_eq!(
        clone.refused().await,
        Err(E::Stopped("circuit_open".into()))
    );
    assert_eq!(client.calls.load(Ordering::SeqCst), 6);
}

#[tokio::test(start_paused = true)]
async fn arc_held_budget_and_breaker_through_the_builder() {
    let client = Client::from_config(&CONFIG);
    assert_eq!(client.refused_by_builder().await, Err(E::Refused));
    assert_eq!(client.calls.load(Ordering::SeqCst), 3);
    assert_eq!(client.budget.tokens_milli(), 7_000);
    assert_eq!(client.breaker.state(), BreakerState::Closed { failures: 3 });
    assert_eq!(
        client.refused_by_builder().await,
        Err(E::Stopped("budget_exhausted".into()))
    );
    assert_eq!(client.calls.load(Ordering::SeqCst), 5);
    assert_eq!(client.budget.tokens_milli(), 5_000);
    assert_eq!(client.breaker.state(), BreakerState::Closed { failures: 5 });
}

/// A client reached through a lazily built static (`budget = &*CLIENT.budget`).
static SEARCH: LazyLock<Client> = LazyLock::new(|| Client::from_config(&CONFIG));

#[retryable(
    deadline = "1s",
    max_attempts = 2,
    idempotent,
    budget = &*SEARCH.budget,
    backoff = "constant",
    initial_backoff = "1ms"
)]
async fn search() -> Result<(), E> {
    Err(E::Refused)
}

#[tokio::test(start_paused = true)]
async fn a_budget_reached_through_a_lazy_static() {
    assert_eq!(search().await, Err(E::Refused));
    assert_eq!(SEARCH.budget.tokens_milli(), 8_000);
}

#[retryable(deadline = "1s", max_attempts = 5, idempotent, budget = budget, attempt = at,
            backoff = "constant", initial_backoff = "1ms")]
async fn with_budget(budget: &RatioBudget, fail: u32) -> Result<u32, E> {
    if at.number() <= fail {
        return Err(E::Refused);
    }
    Ok(at.number())
}

#[tokio::test(start_paused = true)]
async fn a_budget_built_at_run_time_passed_as_an_argument() {
    // From configuration: at most 50 % extra, no floor.
    let budget = RatioBudget::try_new(Duration::from_secs(10), 0, 50).unwrap();
    // Two calls deposit two units worth one retry between them.
    assert_eq!(with_budget(&budget, 0).await, Ok(1));
    assert_eq!(with_budget(&budget, 1).await, Ok(2)); // the one retry
    // 3 calls allow 1 retry: the budget stops this one.
    assert_eq!(
        with_budget(&budget, 1).await,
        Err(E::Stopped("budget_exhausted".into()))
    );
    assert_eq!(budget.balance(), 0);
}

static NAMED: Name = Name::new("owned_state::named");

#[tokio::test(start_paused = true)]
async fn the_builder_defaults_to_the_bucket_of_its_name_as_the_attribute_does() {
    let p = Policy::new(Duration::from_secs(1))
        .with_max_attempts(2)
        .with_backoff(Backoff::NONE);
    let r: Result<(), E> = call(&p)
        .name(&NAMED)
        .idempotent()
        .run(async |_: &Attempt| Err(E::Refused))
        .await;
    assert_eq!(r, Err(E::Refused));
    assert_eq!(NAMED.budget().tokens_milli(), 98_000);
    // `NoBudget` opts out, like `budget = "none"`.
    let r: Result<(), E> = call(&p)
        .name(&NAMED)
        .idempotent()
        .budget(retries::NoBudget)
        .run(async |_: &Attempt| Err(E::Refused))
        .await;
    assert_eq!(r, Err(E::Refused));
    assert_eq!(NAMED.budget().tokens_milli(), 98_000);
}

// --- `policy = P` plus overrides changes only what was overridden -----------

/// Exponential from 10 ms, ×3, capped at 50 ms, full jitter.
const P: Policy = Policy::new(Duration::from_secs(5))
    .with_max_attempts(5)
    .with_backoff(Backoff::exponential(
        Duration::from_millis(10),
        3.0,
        Duration::from_millis(50),
    ))
    .validated();

static PAUSES: Mutex<Vec<Duration>> = Mutex::new(Vec::new());

#[retryable(
    policy = P,
    jitter = "none",
    idempotent,
    on_retry = |e| PAUSES.lock().unwrap().push(e.delay())
)]
async fn no_jitter() -> Result<(), E> {
    Err(E::Refused)
}

#[tokio::test(start_paused = true)]
async fn policy_with_jitter_none_keeps_the_backoff_kind_base_and_cap() {
    PAUSES.lock().unwrap().clear();
    let t0 = Instant::now();
    assert_eq!(no_jitter().await, Err(E::Refused));
    let ms = Duration::from_millis;
    // Exponential (×3) from 10 ms, capped at 50 ms: P's backoff, jitter off.
    assert_eq!(*PAUSES.lock().unwrap(), [ms(10), ms(30), ms(50), ms(50)]);
    assert_eq!(t0.elapsed(), ms(140));
}

static SHORT: Mutex<Vec<Duration>> = Mutex::new(Vec::new());

#[retryable(
    policy = P,
    jitter = "none",
    initial_backoff = "2ms",
    max_attempts = 4,
    idempotent,
    on_retry = |e| SHORT.lock().unwrap().push(e.delay())
)]
async fn smaller_first_pause() -> Result<(), E> {
    Err(E::Refused)
}

#[tokio::test(start_paused = true)]
async fn policy_with_one_backoff_override_keeps_the_rest() {
    assert_eq!(smaller_first_pause().await, Err(E::Refused));
    let ms = Duration::from_millis;
    // Still ×3 and capped at 50 ms; only the first pause changed.
    assert_eq!(*SHORT.lock().unwrap(), [ms(2), ms(6), ms(18)]);
}

#[tokio::test(start_paused = true)]
async fn policy_setters_are_the_same_through_the_builder() {
    let p = P.with_jitter(Jitter::None).with_max_attempts(3);
    let seen = Mutex::new(Vec::new());
    let f = call(&p)
        .idempotent()
        .budget(retries::NoBudget)
        .on_retry(|e: &retries::RetryEvent<'_, E>| seen.lock().unwrap().push(e.delay()))
        .outcome(async |_: &Attempt| Err::<(), E>(E::Refused))
        .await
        .unwrap_err();
    assert_eq!(f.reason(), Reason::Exhausted);
    let ms = Duration::from_millis;
    assert_eq!(*seen.lock().unwrap(), [ms(10), ms(30)]);
}
