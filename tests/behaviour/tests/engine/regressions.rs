//! Regression tests for the defects an independent suite found (issue #11),
//! each named after the defect it pins, through the public API. The gRPC ones
//! (`grpc-timeout`, pushback, `tonic::Status` in a chain) live in
//! `examples/payments/tests/headers.rs`, where tonic is at hand.

use std::fmt::Display;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use retries::{
    Attempt, Backoff, Breaker, BreakerState, CircuitBreaker, Classify, Failure, Nested, NoBudget,
    Permit, Policy, RatioBudget, Reason, TokenBucket, Verdict, retryable, scope,
};
use tokio::time::Instant;

// `call(&policy)`: `retries::call` under this file's own name.
crate::common::named_call!();

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[derive(Debug, thiserror::Error, PartialEq)]
enum E {
    #[error("refused")]
    Refused,
    #[error("reply lost")]
    Lost,
    #[error("invalid")]
    Invalid,
    #[error("stopped: {0}")]
    Stopped(&'static str),
}

impl From<retries::Stopped> for E {
    fn from(s: retries::Stopped) -> Self {
        E::Stopped(s.reason().as_str())
    }
}

impl Classify for E {
    fn classify(&self) -> Verdict {
        match self {
            E::Refused => Verdict::not_executed(),
            E::Lost => Verdict::unknown(),
            E::Invalid | E::Stopped(_) => Verdict::permanent(),
        }
    }
}

// --- 1. a half-open breaker admits no more probes than configured -----------

/// What a call through the breaker does.
#[derive(Clone, Copy)]
enum Act {
    /// Ends 10 s later with a permanent error.
    Straggle,
    Refuse,
    Hang,
    Succeed,
    /// Yields once, then fails permanently (a neutral end).
    Invalid,
}

async fn act(a: Act) -> Result<(), E> {
    match a {
        Act::Straggle => {
            tokio::time::sleep(Duration::from_secs(10)).await;
            Err(E::Invalid)
        }
        Act::Refuse => Err(E::Refused),
        Act::Hang => std::future::pending().await,
        Act::Succeed => Ok(()),
        Act::Invalid => {
            tokio::task::yield_now().await;
            Err(E::Invalid)
        }
    }
}

static HALF: CircuitBreaker = CircuitBreaker::new(2, Duration::from_secs(1));

#[retryable(deadline = "1m", max_attempts = 1, idempotent, budget = "none", breaker = HALF)]
async fn through_half(a: Act) -> Result<(), E> {
    act(a).await
}

#[tokio::test(start_paused = true)]
async fn half_open_breaker_admits_no_extra_probe_when_a_straggler_ends() {
    // S: admitted while closed; ends 10 s later with a permanent error.
    let straggler = tokio::spawn(through_half(Act::Straggle));
    tokio::task::yield_now().await;
    // Two refused calls open the breaker.
    for _ in 0..2 {
        assert_eq!(through_half(Act::Refuse).await, Err(E::Refused));
    }
    assert_eq!(HALF.state(), BreakerState::Open);
    // After `open_for`, probe P1 is admitted and hangs.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let probe = tokio::spawn(through_half(Act::Hang));
    tokio::task::yield_now().await;
    assert_eq!(HALF.state(), BreakerState::HalfOpen { in_flight: 1 });
    // S ends: it was not a probe, so it returns no probe slot.
    assert_eq!(straggler.await.unwrap(), Err(E::Invalid));
    assert_eq!(HALF.state(), BreakerState::HalfOpen { in_flight: 1 });
    // A new call while P1 is in flight is refused without running.
    assert_eq!(
        through_half(Act::Succeed).await,
        Err(E::Stopped("circuit_open"))
    );
    probe.abort();
}

/// Counts the probes a `CircuitBreaker` has admitted and not yet taken back,
/// per half-open episode: the bound holds per episode (a probe of an earlier
/// episode may still run when the next one starts; it returns no slot).
struct Counting {
    inner: CircuitBreaker,
    in_flight: AtomicU32,
    per_episode: std::sync::Mutex<std::collections::HashMap<u32, u32>>,
    most: AtomicU32,
    probes: AtomicU32,
}

impl Counting {
    fn ended(&self, a: Permit) {
        if let Some(episode) = a.episode() {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            *self.per_episode.lock().unwrap().entry(episode).or_default() -= 1;
        }
    }
}

impl Breaker for Counting {
    fn admit(&self) -> Option<Permit> {
        // Counted under the lock, so an admission and its count are seen
        // together by the other tasks.
        let mut per_episode = self.per_episode.lock().unwrap();
        let a = self.inner.admit();
        if let Some(episode) = a.and_then(|a| a.episode()) {
            self.in_flight.fetch_add(1, Ordering::SeqCst);
            let now = per_episode.entry(episode).or_default();
            *now += 1;
            self.most.fetch_max(*now, Ordering::SeqCst);
            self.probes.fetch_add(1, Ordering::SeqCst);
        }
        a
    }
    fn on_success(&self, a: Permit) {
        self.ended(a);
        self.inner.on_success(a);
    }
    fn on_transient_failure(&self, a: Permit) {
        self.ended(a);
        self.inner.on_transient_failure(a);
    }
    fn on_neutral(&self, a: Permit) {
        self.ended(a);
        self.inner.on_neutral(a);
    }
}

#[retryable(deadline = "1m", max_attempts = 1, idempotent, budget = "none", breaker = breaker)]
async fn through_counting(breaker: &Counting, a: Act) -> Result<(), E> {
    act(a).await
}

#[test]
fn half_open_breaker_never_has_more_probes_in_flight_than_configured_under_64_tasks() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    for probes in [1, 2] {
        let breaker = Arc::new(Counting {
            inner: CircuitBreaker::try_new(2, Duration::from_millis(1), probes).unwrap(),
            in_flight: AtomicU32::new(0),
            per_episode: std::sync::Mutex::default(),
            most: AtomicU32::new(0),
            probes: AtomicU32::new(0),
        });
        rt.block_on(async {
            let tasks: Vec<_> = (0..64u32)
                .map(|t| {
                    let breaker = Arc::clone(&breaker);
                    tokio::spawn(async move {
                        for i in 0..300u32 {
                            // A mix of ends: transient failures, successes,
                            // neutral ends (permanent errors), and calls
                            // dropped mid-attempt.
                            let a = match (t * 7 + i) % 5 {
                                0 | 1 => Act::Refuse,
                                2 => Act::Invalid,
                                _ => Act::Succeed,
                            };
                            let call = through_counting(&breaker, a);
                            if i % 11 == 0 {
                                let _ = tokio::time::timeout(Duration::ZERO, call).await;
                            } else {
                                let _ = call.await;
                            }
                            tokio::task::yield_now().await;
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        });
        let most = breaker.most.load(Ordering::SeqCst);
        assert!(
            most <= probes,
            "{most} probes in flight at once, {probes} allowed"
        );
        assert!(
            breaker.probes.load(Ordering::SeqCst) > 0,
            "the breaker never went half-open"
        );
        assert_eq!(breaker.in_flight.load(Ordering::SeqCst), 0);
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_probe_reopens_the_breaker_even_when_a_straggler_succeeds() {
    static B: CircuitBreaker = CircuitBreaker::new(1, Duration::from_secs(1));
    let straggler = B.admit().unwrap();
    B.on_transient_failure(Permit::NORMAL); // opens
    tokio::time::sleep(Duration::from_secs(1)).await;
    let probe = B.admit().unwrap();
    assert!(probe.is_probe());
    // The straggler's success says nothing about the half-open test.
    B.on_success(straggler);
    assert_eq!(B.state(), BreakerState::HalfOpen { in_flight: 1 });
    B.on_transient_failure(probe);
    assert_eq!(B.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn a_probe_of_an_earlier_half_open_episode_returns_no_slot_of_a_later_one() {
    static B: CircuitBreaker =
        CircuitBreaker::new(1, Duration::from_secs(1)).with_half_open_probes(2);
    B.on_transient_failure(Permit::NORMAL); // opens (episode 1)
    tokio::time::sleep(Duration::from_secs(1)).await;
    let p1 = B.admit().unwrap();
    let p2 = B.admit().unwrap();
    B.on_transient_failure(p1); // opens again (episode 2); p2 is still running
    assert_eq!(B.state(), BreakerState::Open);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let p3 = B.admit().unwrap();
    assert_ne!(p3.episode(), p2.episode());
    // p2 ends neutrally, or even fails or succeeds: it belongs to episode 1.
    B.on_neutral(p2);
    B.on_transient_failure(p2);
    B.on_success(p2);
    assert_eq!(B.state(), BreakerState::HalfOpen { in_flight: 1 });
    assert!(B.admit().is_some()); // the second probe of episode 2
    assert_eq!(B.admit(), None); // and no third
    B.on_success(p3);
    assert_eq!(B.state(), BreakerState::Closed { failures: 0 });
}

// --- 2. a non-idempotent call under an idempotent loop is not replayed ------

static CHARGES: AtomicU32 = AtomicU32::new(0);
static CHECKOUTS: AtomicU32 = AtomicU32::new(0);

#[retryable(deadline = "2s", max_attempts = 3, idempotent = false)]
async fn charge() -> Result<u32, E> {
    CHARGES.fetch_add(1, Ordering::SeqCst); // the server charges…
    Err(E::Lost) //                            …and the reply is lost
}

#[retryable(deadline = "5s", max_attempts = 3, idempotent)]
async fn checkout() -> Result<u32, E> {
    CHECKOUTS.fetch_add(1, Ordering::SeqCst);
    charge().await
}

#[tokio::test(start_paused = true)]
async fn an_unknown_outcome_below_an_idempotent_loop_is_not_replayed() {
    assert_eq!(checkout().await, Err(E::Lost));
    assert_eq!(CHARGES.load(Ordering::SeqCst), 1);
    assert_eq!(CHECKOUTS.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn an_unknown_outcome_below_is_resolved_by_the_outer_reconcile() {
    let charged = AtomicU32::new(0);
    let p = Policy::new(Duration::from_secs(5)).with_max_attempts(3);
    let inner = Policy::new(Duration::from_secs(2));
    let lookups = AtomicU32::new(0);
    let r: Result<&str, E> = call(&p)
        .not_idempotent()
        .reconcile(async |_key| {
            lookups.fetch_add(1, Ordering::SeqCst);
            Ok((charged.load(Ordering::SeqCst) > 0).then_some("found"))
        })
        .run(async |_: &Attempt| {
            // An idempotent-looking inner layer that owns its retries, over a
            // non-idempotent charge: the unknown outcome still reaches here.
            call(&inner)
                .not_idempotent()
                .nested(Nested::Own)
                .run(async |_: &Attempt| {
                    charged.fetch_add(1, Ordering::SeqCst);
                    Err::<&str, E>(E::Lost)
                })
                .await
        })
        .await;
    assert_eq!(r, Ok("found"));
    assert_eq!(charged.load(Ordering::SeqCst), 1);
    assert_eq!(lookups.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn an_unknown_outcome_below_propagates_through_every_layer() {
    let charged = AtomicU32::new(0);
    let p = Policy::new(Duration::from_secs(5)).with_max_attempts(3);
    let r: Result<(), Failure<E>> = call(&p)
        .idempotent()
        .outcome(async |_: &Attempt| {
            call(&p)
                .idempotent()
                .run(async |_: &Attempt| {
                    call(&p)
                        .not_idempotent()
                        .run(async |_: &Attempt| {
                            charged.fetch_add(1, Ordering::SeqCst);
                            Err::<(), E>(E::Lost)
                        })
                        .await
                })
                .await
        })
        .await;
    let f = r.unwrap_err();
    assert_eq!((f.reason(), f.attempts()), (Reason::UnknownOutcome, 1));
    assert_eq!(charged.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_resolved_or_idempotent_failure_below_is_still_retried() {
    // The inner call is idempotent: its unknown outcome is an ordinary error
    // for the outer loop, which retries it.
    let tries = AtomicU32::new(0);
    let p = Policy::new(Duration::from_secs(5))
        .with_max_attempts(3)
        .with_backoff(Backoff::NONE);
    let r: Result<u32, E> = call(&p)
        .idempotent()
        .run(async |at: &Attempt| {
            call(&p)
                .idempotent()
                .run(async |_: &Attempt| {
                    tries.fetch_add(1, Ordering::SeqCst);
                    if at.number() < 3 {
                        Err(E::Lost)
                    } else {
                        Ok(at.number())
                    }
                })
                .await
        })
        .await;
    assert_eq!(r, Ok(3));
    assert_eq!(tries.load(Ordering::SeqCst), 3);
}

// --- 5. no attempt starts at or after the deadline --------------------------

#[tokio::test(start_paused = true)]
async fn no_attempt_starts_after_the_deadline_when_min_attempt_is_zero() {
    let p = Policy::new(Duration::from_micros(10_500))
        .with_min_attempt(Duration::ZERO)
        .with_max_attempts(5)
        .with_backoff(Backoff::constant(Duration::from_micros(10_300)));
    let starts = std::sync::Mutex::new(Vec::new());
    let t0 = Instant::now();
    let f = call(&p)
        .idempotent()
        .budget(NoBudget)
        .outcome(async |_: &Attempt| {
            starts.lock().unwrap().push(t0.elapsed());
            Err::<(), E>(E::Refused)
        })
        .await
        .unwrap_err();
    // The pause ends at 10.3 ms, but the timer wakes at 11 ms: past the
    // 10.5 ms deadline, so the second attempt never starts.
    assert_eq!(*starts.lock().unwrap(), [Duration::ZERO]);
    assert_eq!((f.reason(), f.attempts()), (Reason::DeadlineExceeded, 1));
    assert_eq!(f.last_error(), Some(&E::Refused));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn no_attempt_ever_starts_at_or_after_the_deadline(
        deadline_us in 500u64..30_000,
        pause_us in 0u64..12_000,
        min_attempt_us in 0u64..2_000,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let p = Policy::new(Duration::from_micros(deadline_us))
            .with_min_attempt(Duration::from_micros(min_attempt_us))
            .with_max_attempts(50)
            .with_backoff(Backoff::constant(Duration::from_micros(pause_us)));
        let starts = rt.block_on(async {
            let t0 = Instant::now();
            let starts = std::sync::Mutex::new(Vec::new());
            let _ = call(&p)
                .idempotent()
                .budget(NoBudget)
                .outcome(async |_: &Attempt| {
                    starts.lock().unwrap().push(t0.elapsed());
                    Err::<(), E>(E::Refused)
                })
                .await;
            starts.into_inner().unwrap()
        });
        for s in starts {
            prop_assert!(s < Duration::from_micros(deadline_us), "attempt at {s:?}, deadline {deadline_us} µs");
        }
    }
}

// --- 6, 7. budget constructors ------------------------------------------------

#[test]
fn token_ratio_keeps_exactly_three_decimals() {
    for (ratio, milli) in [
        (2.01, 2010),
        (1.001, 1001),
        (1.005, 1005),
        (0.1, 100),
        (0.001, 1),
        (0.0019, 1),
        (2.0019, 2001),
        (999.999, 999_999),
    ] {
        assert_eq!(TokenBucket::new(10, ratio).ratio_milli(), milli, "{ratio}");
    }
}

#[test]
fn ratio_budget_constructors_never_panic() {
    let b = RatioBudget::try_new(Duration::from_mins(1), u32::MAX, 1000).unwrap();
    assert!(retries::Budget::try_retry(&b));
    let b = RatioBudget::try_new(Duration::from_mins(1), 400_000_000, 0).unwrap();
    assert!(b.balance() > 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn no_budget_or_breaker_constructor_panics(
        ttl_ns in any::<u64>(),
        per_sec in any::<u32>(),
        percent in any::<u32>(),
        tokens in any::<u32>(),
        ratio in any::<f64>(),
        threshold in any::<u32>(),
        probes in any::<u32>(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let _g = rt.enter();
        if let Ok(b) = RatioBudget::try_new(Duration::from_nanos(ttl_ns), per_sec, percent) {
            for _ in 0..3 {
                retries::Budget::on_call(&b);
            }
            let _ = retries::Budget::try_retry(&b);
            let _ = b.balance();
        }
        if let Ok(b) = TokenBucket::try_new(tokens, ratio) {
            retries::Budget::on_transient_failure(&b);
            retries::Budget::on_success(&b);
            prop_assert!(b.tokens_milli() <= b.max_milli());
        }
        let _ = CircuitBreaker::try_new(threshold, Duration::from_nanos(ttl_ns), probes);
        let _ = Policy::new(Duration::from_nanos(ttl_ns)).with_max_attempts(threshold).try_validated();
    }
}

// --- 8. generated locals cannot collide with parameters --------------------

#[allow(clippy::too_many_arguments, clippy::similar_names)]
#[retryable(deadline = "1s", idempotent, attempt = at)]
async fn parameters_named_like_the_expansion(
    __retry_attempt: u32,
    __retry_policy: u32,
    __retry_call: u32,
    __retries_attempt: u32,
    __retries_policy: u32,
    __retries_spec: u32,
    __retries_result: u32,
    engine: u32,
    outcome: u32,
) -> Result<u32, E> {
    Ok(__retry_attempt
        + __retry_policy
        + __retry_call
        + __retries_attempt
        + __retries_policy
        + __retries_spec
        + __retries_result
        + engine
        + outcome
        + at.number())
}

#[tokio::test(start_paused = true)]
async fn macro_hygiene_parameters_named_like_generated_locals() {
    assert_eq!(
        parameters_named_like_the_expansion(1, 2, 3, 4, 5, 6, 7, 8, 9).await,
        Ok(46)
    );
}

// --- 9. the declared return type drives the body ---------------------------

#[retryable(deadline = "1s", idempotent, attempt = at)]
async fn boxed() -> Result<u32, Box<dyn std::error::Error + Send + Sync>> {
    if at.number() == 1 {
        // Coerced to the declared `Box<dyn Error + Send + Sync>`; classified
        // by its cause (refused: not executed), so retried.
        return Err(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
    }
    Ok(at.number())
}

struct Named {
    name: String,
    bytes: Vec<u8>,
}

impl Named {
    #[retryable(deadline = "1s", idempotent)]
    async fn name(&self) -> Result<&str, E> {
        Ok(&self.name)
    }

    #[retryable(deadline = "1s", idempotent)]
    async fn bytes(&self) -> Result<&[u8], E> {
        Ok(&self.bytes)
    }
}

#[tokio::test(start_paused = true)]
async fn the_signature_is_kept_at_coercion_sites() {
    assert_eq!(boxed().await.unwrap(), 2);
    let n = Named {
        name: "sku".into(),
        bytes: vec![1, 2],
    };
    assert_eq!(n.name().await, Ok("sku"));
    assert_eq!(n.bytes().await, Ok(&[1u8, 2][..]));
}

// --- 10. `Result<impl Trait, E>` ---------------------------------------------

#[retryable(deadline = "1s", idempotent, attempt = at)]
async fn shown() -> Result<impl Display, E> {
    if at.number() < 2 {
        return Err(E::Refused);
    }
    Ok(format!("attempt {}", at.number()))
}

#[tokio::test(start_paused = true)]
async fn result_of_impl_trait_compiles_and_retries() {
    assert_eq!(shown().await.unwrap().to_string(), "attempt 2");
}

// --- scope hazards, decided and documented (retries::scope) -----------------

static INNER: AtomicU32 = AtomicU32::new(0);

#[retryable(
    deadline = "1s",
    max_attempts = 3,
    idempotent,
    backoff = "constant",
    initial_backoff = "10ms"
)]
async fn inner_refused() -> Result<(), E> {
    INNER.fetch_add(1, Ordering::SeqCst);
    Err(E::Refused)
}

#[tokio::test(start_paused = true)]
async fn a_future_polled_inside_an_attempt_joins_it_unless_detached() {
    let p = Policy::new(Duration::from_secs(5)).with_max_attempts(1);
    // Created outside any attempt, polled inside one: it defers to that
    // attempt's loop (one inner attempt) — the documented rule.
    INNER.store(0, Ordering::SeqCst);
    let mut shared = Some(inner_refused());
    let _ = call(&p)
        .idempotent()
        .outcome(async |_: &Attempt| shared.take().unwrap().await)
        .await;
    assert_eq!(INNER.load(Ordering::SeqCst), 1);
    // Detached, it owns its retries wherever it is polled.
    INNER.store(0, Ordering::SeqCst);
    let mut shared = Some(scope::detach(inner_refused()));
    let _ = call(&p)
        .idempotent()
        .outcome(async |_: &Attempt| shared.take().unwrap().await)
        .await;
    assert_eq!(INNER.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn an_inherited_scope_defers_only_while_its_attempt_runs() {
    let p = Policy::new(Duration::from_secs(5)).with_max_attempts(1);
    INNER.store(0, Ordering::SeqCst);
    // Awaited inside the attempt: deferring (one inner attempt), as before.
    let _ = call(&p)
        .idempotent()
        .outcome(async |_: &Attempt| tokio::spawn(scope::inherit(inner_refused())).await.unwrap())
        .await;
    assert_eq!(INNER.load(Ordering::SeqCst), 1);
    // Detached from the attempt, which ends at once: no loop is left to
    // retry for the task, so its call owns its retries (3 attempts), still
    // bounded by the inherited deadline.
    INNER.store(0, Ordering::SeqCst);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let mut tx = Some(tx);
    let _ = call(&p)
        .idempotent()
        .outcome(async |_: &Attempt| {
            let task = scope::inherit(async {
                tokio::time::sleep(ms(1)).await; // after the attempt has ended
                let left = scope::remaining();
                (inner_refused().await, left)
            });
            let handle = tokio::spawn(task);
            let _ = tx.take().unwrap().send(handle);
            Ok::<(), E>(())
        })
        .await;
    let (r, left) = rx.await.unwrap().await.unwrap();
    assert_eq!(r, Err(E::Refused));
    assert_eq!(INNER.load(Ordering::SeqCst), 3);
    assert_eq!(left, Some(ms(4_999)));
}
