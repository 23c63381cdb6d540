//! One owner of retries: nested `#[retryable]` calls, on the paused clock.
//! Three layers of `max_attempts = 3` make 3 bottom calls by default, 27 only
//! when every layer asks to own its retries; inner deadlines are bounded by
//! the outer attempt (and its caller's reserve); dropping the outer call
//! leaves nothing running.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use retries::{Classify, retryable, scope};
use tokio::time::Instant;

#[derive(Debug, thiserror::Error, Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Three layers over a bottom that always fails, in one nesting mode.
macro_rules! layers {
    ($bottom:ident, $l1:ident, $l2:ident, $top:ident, $mode:literal) => {
        static $bottom: AtomicU32 = AtomicU32::new(0);

        #[retryable(deadline = "10s", max_attempts = 3, idempotent, nested = $mode,
                                    budget = "none", backoff = "constant", initial_backoff = "1ms")]
        async fn $l1() -> Result<(), E> {
            $bottom.fetch_add(1, Ordering::SeqCst);
            Err(E::Refused)
        }

        #[retryable(deadline = "10s", max_attempts = 3, idempotent, nested = $mode,
                                    budget = "none", backoff = "constant", initial_backoff = "1ms")]
        async fn $l2() -> Result<(), E> {
            $l1().await
        }

        #[retryable(deadline = "10s", max_attempts = 3, idempotent, nested = $mode,
                                    budget = "none", backoff = "constant", initial_backoff = "1ms")]
        async fn $top() -> Result<(), E> {
            $l2().await
        }
    };
}

layers!(DEFER_BOTTOM, defer_1, defer_2, defer_top, "defer");
layers!(OWN_BOTTOM, own_1, own_2, own_top, "own");

#[tokio::test(start_paused = true)]
async fn three_layers_defer_to_the_top_three_bottom_calls() {
    assert!(matches!(defer_top().await, Err(E::Refused)));
    assert_eq!(DEFER_BOTTOM.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn three_layers_that_each_own_retries_make_twenty_seven() {
    assert!(matches!(own_top().await, Err(E::Refused)));
    assert_eq!(OWN_BOTTOM.load(Ordering::SeqCst), 27);
}

#[tokio::test(start_paused = true)]
async fn a_call_outside_any_scope_retries_as_configured() {
    static N: AtomicU32 = AtomicU32::new(0);
    #[retryable(deadline = "1s", max_attempts = 3, idempotent, budget = "none")]
    async fn alone() -> Result<(), E> {
        N.fetch_add(1, Ordering::SeqCst);
        Err(E::Refused)
    }
    let _ = alone().await;
    assert_eq!(N.load(Ordering::SeqCst), 3);
}

#[retryable(deadline = "5s", idempotent, attempt = at, nested = "own")]
async fn inner_deadlines() -> Result<(std::time::Instant, std::time::Instant), E> {
    Ok((at.call_deadline(), at.deadline()))
}

#[retryable(deadline = "1s", reserve = "200ms", idempotent, attempt = at)]
async fn outer_with_reserve()
-> Result<((std::time::Instant, std::time::Instant), std::time::Instant), E> {
    Ok((inner_deadlines().await?, at.deadline()))
}

#[tokio::test(start_paused = true)]
async fn the_inner_deadline_is_the_outer_attempt_deadline_net_of_the_reserve() {
    let t0 = Instant::now().into_std();
    let ((inner_call, inner_attempt), outer_attempt) = outer_with_reserve().await.unwrap();
    assert_eq!(outer_attempt - t0, ms(800));
    assert_eq!(inner_call, outer_attempt);
    assert_eq!(inner_attempt, outer_attempt);
}

#[retryable(
    deadline = "10s",
    idempotent,
    nested = "own",
    backoff = "constant",
    initial_backoff = "100ms"
)]
async fn slow_inner(started: &AtomicU32) -> Result<(), E> {
    started.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(ms(300)).await;
    Err(E::Refused)
}

/// The outer body never reads the clock; the inner call fixes the shared
/// deadline, and the outer attempt adopts it.
#[retryable(deadline = "1s", idempotent, max_attempts = 1)]
async fn outer_lazy(started: &AtomicU32) -> Result<(), E> {
    slow_inner(started).await
}

#[tokio::test(start_paused = true)]
async fn an_inner_loop_stops_at_the_outer_deadline() {
    let started = AtomicU32::new(0);
    let t0 = Instant::now();
    let err = outer_lazy(&started).await.unwrap_err();
    // Inner attempts at 0, 400, 800 (300 ms each + 100 ms pause); the third is
    // cut off at the outer deadline, 1 s.
    assert_eq!(t0.elapsed(), ms(1000));
    assert_eq!(started.load(Ordering::SeqCst), 3);
    assert!(matches!(err, E::Stopped(s) if s.reason() == retries::Reason::DeadlineExceeded));
}

#[tokio::test(start_paused = true)]
async fn dropping_the_outer_call_stops_every_layer() {
    let started = AtomicU32::new(0);
    // At 350 ms the inner loop is pausing between attempts 1 and 2.
    assert!(
        tokio::time::timeout(ms(350), outer_lazy(&started))
            .await
            .is_err()
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(started.load(Ordering::SeqCst), 1);
    // Dropped in the middle of the inner's second attempt this time.
    let started = AtomicU32::new(0);
    assert!(
        tokio::time::timeout(ms(550), outer_lazy(&started))
            .await
            .is_err()
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(started.load(Ordering::SeqCst), 2);
}

#[retryable(deadline = "2s", idempotent, attempt = at)]
async fn reads_the_scope() -> Result<(Option<Duration>, Option<Duration>, bool), E> {
    let plain = tokio::spawn(async { scope::remaining() }).await.unwrap();
    let carried = tokio::spawn(scope::inherit(async {
        (scope::remaining(), scope::owned_by_outer_loop())
    }))
    .await
    .unwrap();
    let _ = at;
    Ok((plain, carried.0, carried.1))
}

#[tokio::test(start_paused = true)]
async fn plain_code_and_spawned_tasks_read_the_scope() {
    assert_eq!(scope::remaining(), None);
    assert!(!scope::owned_by_outer_loop());
    let (plain, carried, owned) = reads_the_scope().await.unwrap();
    assert_eq!(plain, None, "a spawned task does not inherit by itself");
    assert_eq!(carried, Some(Duration::from_secs(2)));
    assert!(owned);
}

#[tokio::test(start_paused = true)]
async fn a_server_deadline_bounds_the_handler_without_taking_its_retries() {
    static N: AtomicU32 = AtomicU32::new(0);
    #[retryable(
        deadline = "10s",
        max_attempts = 5,
        idempotent,
        budget = "none",
        backoff = "constant",
        initial_backoff = "100ms"
    )]
    async fn handler_call() -> Result<(), E> {
        N.fetch_add(1, Ordering::SeqCst);
        Err(E::Refused)
    }
    let t0 = Instant::now();
    let r = scope::with_deadline((t0 + ms(250)).into_std(), handler_call()).await;
    // Retries stay with the handler (attempts at 0, 100, 200), within 250 ms.
    assert_eq!(N.load(Ordering::SeqCst), 3);
    // The fourth attempt's pause does not fit in the 50 ms left: a stop
    // that says so, the handler's last error its source.
    let Err(E::Stopped(stop)) = &r else {
        panic!("{r:?}")
    };
    assert_eq!(stop.reason(), retries::Reason::PauseExceedsDeadline);
    let last = std::error::Error::source(stop).and_then(|e| e.downcast_ref::<E>());
    assert!(matches!(last, Some(E::Refused)), "{r:?}");
    assert_eq!(t0.elapsed(), ms(200));
}
