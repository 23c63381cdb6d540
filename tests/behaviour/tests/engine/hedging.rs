//! Hedging (gRFC A6), every rule on the paused clock: copies after each
//! delay, at once after a non-fatal failure, the first success wins and the
//! rest are cancelled, a fatal failure ends all, one key for all, pushback
//! delays or stops copies, throttling allows a copy only above half and never
//! cancels one in flight, the deadline bounds all, dropping the call cancels
//! all, and the breaker gets every admission back.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use retries::{
    Attempt, BreakerState, CircuitBreaker, Classify, Failure, Hedging, IdempotencyKey, NoBudget,
    Policy, Reason, TokenBucket, Verdict,
};
use tokio::time::{Instant, sleep};

// `call(&policy)`: `retries::call` under this file's own name.
crate::common::named_call!();

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
enum E {
    #[error("unavailable")]
    Unavailable(Option<Duration>),
    /// A 409 for the call's key in progress: a conflict with its hint.
    #[error("in progress")]
    InProgress(Duration),
    #[error("stop")]
    DoNotRetry,
    #[error("invalid")]
    Invalid,
    #[error("stopped: {0}")]
    Stopped(String),
}

impl From<retries::Stopped> for E {
    fn from(s: retries::Stopped) -> Self {
        Self::Stopped(s.to_string())
    }
}

impl Classify for E {
    fn classify(&self) -> Verdict {
        match self {
            Self::Unavailable(None) => Verdict::unknown(),
            Self::Unavailable(Some(d)) => Verdict::unknown().with_retry_after(*d),
            Self::InProgress(d) => Verdict::not_executed().with_conflict().with_retry_after(*d),
            Self::DoNotRetry => Verdict::server_refused(),
            Self::Invalid | Self::Stopped(_) => Verdict::permanent(),
        }
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One scripted copy: how long it takes, then what it answers.
#[derive(Clone, Copy)]
enum Copy {
    Ok(u64, u32),
    Fail(u64, fn() -> E),
    Hang,
}

/// Records when each copy started, with its key, and counts the copies
/// that were cancelled (dropped before answering).
#[derive(Default)]
struct Log {
    started: Mutex<Vec<(Duration, u32, IdempotencyKey)>>,
    cancelled: AtomicU32,
}

struct CancelGuard<'a>(&'a AtomicU32, bool);
impl Drop for CancelGuard<'_> {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

async fn hedged<B: retries::Budget, K: retries::Breaker>(
    policy: &Policy,
    hedging: Hedging,
    script: &[Copy],
    log: &Log,
    budget: B,
    breaker: K,
) -> Result<u32, Failure<E>> {
    let t0 = Instant::now();
    call(policy)
        .idempotent()
        .budget(budget)
        .breaker(breaker)
        .outcome_hedged(hedging, |at: &Attempt| {
            let n = at.number();
            log.started
                .lock()
                .unwrap()
                .push((t0.elapsed(), n, at.idempotency_key()));
            let copy = script.get(n as usize - 1).copied().unwrap_or(Copy::Hang);
            async move {
                let mut guard = CancelGuard(&log.cancelled, false);
                let r = match copy {
                    Copy::Ok(d, v) => {
                        sleep(ms(d)).await;
                        Ok(v)
                    }
                    Copy::Fail(d, e) => {
                        sleep(ms(d)).await;
                        Err(e())
                    }
                    Copy::Hang => std::future::pending().await,
                };
                guard.1 = true;
                r
            }
        })
        .await
}

fn starts(log: &Log) -> Vec<u64> {
    log.started
        .lock()
        .unwrap()
        .iter()
        .map(|(t, _, _)| t.as_millis() as u64)
        .collect()
}

const POLICY: Policy = Policy::new(Duration::from_secs(2));

#[tokio::test(start_paused = true)]
async fn a_copy_after_each_delay_and_the_first_success_wins() {
    let log = Log::default();
    let t0 = Instant::now();
    let script = [
        Copy::Ok(500, 1),
        Copy::Ok(500, 2),
        Copy::Ok(30, 3),
        Copy::Ok(0, 4),
    ];
    let r = hedged(
        &POLICY,
        Hedging::new(4, ms(100)),
        &script,
        &log,
        NoBudget,
        retries::NoBreaker,
    )
    .await;
    assert_eq!(r.unwrap(), 3, "the third copy answered first");
    assert_eq!(t0.elapsed(), ms(230));
    assert_eq!(
        starts(&log),
        [0, 100, 200],
        "no fourth copy: an answer came first"
    );
    assert_eq!(
        log.cancelled.load(Ordering::SeqCst),
        2,
        "the two slow copies are cancelled"
    );
    let keys: Vec<_> = log
        .started
        .lock()
        .unwrap()
        .iter()
        .map(|(_, _, k)| *k)
        .collect();
    assert!(
        keys.windows(2).all(|w| w[0] == w[1]),
        "one key for every copy"
    );
}

#[tokio::test(start_paused = true)]
async fn a_non_fatal_failure_starts_the_next_copy_at_once() {
    let log = Log::default();
    let script = [
        Copy::Fail(10, || E::Unavailable(None)),
        Copy::Fail(5, || E::Unavailable(None)),
        Copy::Ok(5, 3),
    ];
    let r = hedged(
        &POLICY,
        Hedging::new(3, ms(100)),
        &script,
        &log,
        NoBudget,
        retries::NoBreaker,
    )
    .await;
    assert_eq!(r.unwrap(), 3);
    assert_eq!(starts(&log), [0, 10, 15]);
}

#[tokio::test(start_paused = true)]
async fn a_conflicts_hint_that_does_not_fit_delays_the_next_copy_by_half_the_time_left() {
    // The first copy is told at 100 ms that the key is in progress, expected
    // done in 30 s; the call has 2 s. The next copy goes after half the time
    // left (less the 1 ms `min_attempt`): a pause of 949.5 ms, ending on
    // tokio's next millisecond, at 1,050 ms. The same rule as the loop's.
    let log = Log::default();
    let script = [
        Copy::Fail(100, || E::InProgress(Duration::from_secs(30))),
        Copy::Ok(10, 7),
    ];
    let r = hedged(
        &POLICY,
        Hedging::new(2, ms(1900)),
        &script,
        &log,
        NoBudget,
        retries::NoBreaker,
    )
    .await;
    assert_eq!(r.unwrap(), 7);
    assert_eq!(starts(&log), [0, 1050]);
}

#[tokio::test(start_paused = true)]
async fn a_fatal_failure_ends_the_call_and_cancels_the_rest() {
    let log = Log::default();
    let script = [Copy::Hang, Copy::Fail(20, || E::Invalid), Copy::Hang];
    let t0 = Instant::now();
    let f = hedged(
        &POLICY,
        Hedging::new(3, ms(100)),
        &script,
        &log,
        NoBudget,
        retries::NoBreaker,
    )
    .await
    .unwrap_err();
    assert_eq!(
        (f.reason(), f.last_error()),
        (Reason::Permanent, Some(&E::Invalid))
    );
    assert_eq!(t0.elapsed(), ms(120));
    assert_eq!(starts(&log), [0, 100]);
    assert_eq!(log.cancelled.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn pushback_delays_the_next_copy_or_stops_copies() {
    let log = Log::default();
    let script = [
        Copy::Fail(10, || E::Unavailable(Some(ms(300)))),
        Copy::Ok(0, 2),
    ];
    let r = hedged(
        &POLICY,
        Hedging::new(3, ms(100)),
        &script,
        &log,
        NoBudget,
        retries::NoBreaker,
    )
    .await;
    assert_eq!(r.unwrap(), 2);
    assert_eq!(
        starts(&log),
        [0, 310],
        "the server's pause, not the 100 ms delay"
    );

    // "Do not retry": no more copies, but the one in flight may still win.
    let log = Log::default();
    let script = [Copy::Ok(400, 1), Copy::Fail(10, || E::DoNotRetry)];
    let r = hedged(
        &POLICY,
        Hedging::new(5, ms(100)),
        &script,
        &log,
        NoBudget,
        retries::NoBreaker,
    )
    .await;
    assert_eq!(r.unwrap(), 1);
    assert_eq!(starts(&log), [0, 100]);
}

#[tokio::test(start_paused = true)]
async fn throttling_allows_a_copy_only_above_half_and_never_cancels_one() {
    // 4 tokens: a copy is allowed while more than 2 are left.
    let bucket = TokenBucket::new(4, 0.1);
    let log = Log::default();
    let script = [
        Copy::Fail(10, || E::Unavailable(None)), // 4 → 3: a copy allowed
        Copy::Fail(10, || E::Unavailable(None)), // 3 → 2: no more copies
        Copy::Ok(0, 3),
    ];
    let f = hedged(
        &POLICY,
        Hedging::new(3, ms(100)),
        &script,
        &log,
        &bucket,
        retries::NoBreaker,
    )
    .await
    .unwrap_err();
    assert_eq!(f.reason(), Reason::BudgetExhausted);
    assert_eq!(starts(&log), [0, 10]);

    // Refused while a slow copy is in flight: that copy still answers.
    let bucket = TokenBucket::new(4, 0.1);
    let log = Log::default();
    let script = [
        Copy::Ok(300, 1),
        Copy::Fail(10, || E::Unavailable(None)),
        Copy::Fail(10, || E::Unavailable(None)),
    ];
    let r = hedged(
        &POLICY,
        Hedging::new(5, ms(100)),
        &script,
        &log,
        &bucket,
        retries::NoBreaker,
    )
    .await;
    assert_eq!(r.unwrap(), 1);
    assert_eq!(starts(&log), [0, 100, 110]);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_bounds_every_copy() {
    let log = Log::default();
    let policy = Policy::new(ms(250));
    let t0 = Instant::now();
    let f = hedged(
        &policy,
        Hedging::new(5, ms(100)),
        &[],
        &log,
        NoBudget,
        retries::NoBreaker,
    )
    .await
    .unwrap_err();
    assert_eq!(f.reason(), Reason::DeadlineExceeded);
    assert_eq!(t0.elapsed(), ms(250));
    assert_eq!(starts(&log), [0, 100, 200]);
    assert_eq!(log.cancelled.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn max_attempts_caps_the_copies() {
    let log = Log::default();
    let script = [Copy::Fail(10, || E::Unavailable(None)); 5];
    let f = hedged(
        &POLICY,
        Hedging::new(3, ms(100)),
        &script,
        &log,
        NoBudget,
        retries::NoBreaker,
    )
    .await
    .unwrap_err();
    assert_eq!(f.reason(), Reason::Exhausted);
    assert_eq!(f.attempts(), 3);
    assert_eq!(starts(&log), [0, 10, 20]);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_call_cancels_every_copy_and_returns_the_admissions() {
    static BREAKER: CircuitBreaker = CircuitBreaker::new(10, Duration::from_secs(30));
    let log = Log::default();
    let call = hedged(
        &POLICY,
        Hedging::new(3, ms(100)),
        &[],
        &log,
        NoBudget,
        &BREAKER,
    );
    assert!(tokio::time::timeout(ms(250), call).await.is_err());
    assert_eq!(starts(&log), [0, 100, 200]);
    assert_eq!(log.cancelled.load(Ordering::SeqCst), 3);
    assert_eq!(
        BREAKER.state(),
        BreakerState::Closed { failures: 0 },
        "cancelled copies count for nothing"
    );
}

/// The attribute's `hedge(…)`: the same engine, through the macro.
struct Replica {
    started: Mutex<Vec<u32>>,
}

#[retries::retryable(deadline = "2s", idempotent, attempt = at, budget = "none",
                     hedge(max_attempts = 3, delay = "50ms"))]
async fn read(replica: &Replica, slow: u32) -> Result<u32, E> {
    replica.started.lock().unwrap().push(at.number());
    let n = at.number();
    sleep(ms(if n <= slow { 1000 } else { 10 })).await;
    Ok(n)
}

#[tokio::test(start_paused = true)]
async fn the_attribute_hedges_an_idempotent_fn() {
    let replica = Replica {
        started: Mutex::new(Vec::new()),
    };
    let t0 = Instant::now();
    assert_eq!(
        read(&replica, 2).await.unwrap(),
        3,
        "the third copy answers first"
    );
    assert_eq!(t0.elapsed(), ms(110));
    assert_eq!(*replica.started.lock().unwrap(), [1, 2, 3]);
}
