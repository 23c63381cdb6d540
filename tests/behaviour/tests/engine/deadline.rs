//! The deadline rules of SPEC §5 and the pushback rules of §6, with exact
//! schedules on the paused clock.

use crate::common;

use std::error::Error as _;
use std::time::Duration;

use common::{Service, Step, SvcError, ms};
use retries::{Attempt, Backoff, Failure, Policy, Reason, Stopped};
use tokio::time::Instant;

// `call(&policy)`: `retries::call` under this file's own name.
crate::common::named_call!();

async fn run(policy: &Policy, svc: &Service) -> Result<u32, Failure<SvcError>> {
    call(policy)
        .idempotent()
        .outcome(async |at: &Attempt| svc.call(at.number(), at.idempotency_key()).await)
        .await
}

const SLOW_UNAVAILABLE: Step = Step::After(Duration::from_millis(1500), &Step::FailAfter);

/// SPEC §5: handler sleeps 1.5 s then UNAVAILABLE; deadline 2 s; 3 attempts;
/// backoff 100 ms; idempotent.
#[tokio::test(start_paused = true)]
async fn reference_case_stops_at_exactly_two_seconds() {
    let policy = Policy::new(Duration::from_secs(2))
        .with_max_attempts(3)
        .with_backoff(Backoff::constant(ms(100)));
    let svc = Service::new(&[SLOW_UNAVAILABLE; 3]);
    let t0 = Instant::now();
    let mut remaining = Vec::new();
    let f = call(&policy)
        .idempotent()
        .outcome(async |at: &Attempt| {
            remaining.push(at.remaining());
            svc.call(at.number(), at.idempotency_key()).await
        })
        .await
        .unwrap_err();
    assert_eq!(t0.elapsed(), Duration::from_secs(2));
    assert_eq!(f.elapsed(), Duration::from_secs(2));
    assert_eq!(f.reason(), Reason::DeadlineExceeded);
    assert_eq!(f.attempts(), 2);
    assert_eq!(
        svc.starts(t0),
        [ms(0), ms(1600)],
        "the third attempt never started"
    );
    assert_eq!(remaining, [ms(2000), ms(400)]);
    assert!(f.last_attempt_cut_off());
    // The caller sees DeadlineExceeded, with attempt 1's error as the source.
    let err: SvcError = f.into_error();
    let SvcError::Stopped(stopped) = &err else {
        panic!("expected Stopped, got {err:?}")
    };
    assert_eq!(stopped.reason(), Reason::DeadlineExceeded);
    assert_eq!(stopped.attempts(), 2);
    let source = stopped
        .source()
        .expect("the last error is kept as the source");
    assert!(matches!(
        source.downcast_ref::<SvcError>(),
        Some(SvcError::Unknown)
    ));
}

#[tokio::test(start_paused = true)]
async fn reserve_is_never_used_by_attempts_or_pauses() {
    let policy = Policy::new(ms(1000)).with_reserve(ms(200));
    let svc = Service::new(&[Step::Hang]);
    let t0 = Instant::now();
    let mut seen = None;
    let f = call(&policy)
        .idempotent()
        .outcome(async |at: &Attempt| {
            seen = Some((
                at.deadline() - t0.into_std(),
                at.call_deadline() - t0.into_std(),
            ));
            svc.call(at.number(), at.idempotency_key()).await
        })
        .await
        .unwrap_err();
    assert_eq!(seen, Some((ms(800), ms(800))));
    assert_eq!(
        (f.reason(), t0.elapsed()),
        (Reason::DeadlineExceeded, ms(800))
    );

    // A pause that would end inside the reserve is not taken: 450 + 400 ms fits
    // in the 1 s deadline, but not in the 800 ms before the reserve.
    let policy = policy.with_backoff(Backoff::constant(ms(400)));
    let svc = Service::new(&[Step::After(ms(450), &Step::FailBefore), Step::Succeed]);
    let t0 = Instant::now();
    let f = run(&policy, &svc).await.unwrap_err();
    assert_eq!(
        (f.reason(), t0.elapsed(), svc.attempts()),
        (Reason::PauseExceedsDeadline, ms(450), 1)
    );
    // Left: the 350 ms before the reserve's start, not the 550 ms before the
    // deadline itself.
    assert_eq!(f.refused_pause().unwrap().left(), ms(350));
}

#[tokio::test(start_paused = true)]
async fn attempt_timeout_cuts_an_attempt_off_as_unknown() {
    let policy = Policy::new(Duration::from_secs(2))
        .with_attempt_timeout(ms(300))
        .with_backoff(Backoff::constant(ms(10)));
    // Idempotent: an attempt cut off is retried.
    let svc = Service::new(&[Step::Hang, Step::Hang, Step::Succeed]);
    let t0 = Instant::now();
    assert_eq!(run(&policy, &svc).await.unwrap(), 7);
    assert_eq!(svc.starts(t0), [ms(0), ms(310), ms(620)]);

    // Not idempotent: the outcome of the cut-off attempt is unknown, so it stops.
    let svc = Service::new(&[Step::Hang, Step::Succeed]);
    let t0 = Instant::now();
    let f = call(&policy)
        .not_idempotent()
        .outcome(async |at: &Attempt| svc.call(at.number(), at.idempotency_key()).await)
        .await
        .unwrap_err();
    assert_eq!(
        (f.reason(), f.attempts(), t0.elapsed()),
        (Reason::UnknownOutcome, 1, ms(300))
    );
    assert!(f.last_attempt_cut_off() && f.last_error().is_none());
    // No error of the operation's type exists, so the default mapping says Stopped.
    let SvcError::Stopped(s) = f.into_error() else {
        panic!("expected Stopped")
    };
    assert_eq!(s.reason(), Reason::UnknownOutcome);
}

#[tokio::test(start_paused = true)]
async fn each_attempt_gets_the_lesser_of_its_timeout_and_the_remaining_time() {
    let policy = Policy::new(ms(1000))
        .with_attempt_timeout(ms(600))
        .with_backoff(Backoff::constant(ms(100)));
    let svc = Service::new(&[Step::Hang, Step::Hang]);
    let t0 = Instant::now();
    let f = run(&policy, &svc).await.unwrap_err();
    // 0..600 cut by its timeout (unknown, retried); 700..1000 cut by the deadline.
    assert_eq!(svc.starts(t0), [ms(0), ms(700)]);
    assert_eq!(
        (f.reason(), t0.elapsed()),
        (Reason::DeadlineExceeded, ms(1000))
    );
}

#[tokio::test(start_paused = true)]
async fn a_pause_that_cannot_fit_stops_the_call_at_once() {
    let policy = Policy::new(ms(1000)).with_backoff(Backoff::constant(ms(500)));
    let svc = Service::new(&[Step::After(ms(600), &Step::FailBefore)]);
    let t0 = Instant::now();
    let f = run(&policy, &svc).await.unwrap_err();
    // Stopped at 600 ms, 400 ms before the deadline: the reason is the
    // pause, never "deadline exceeded", and it says what did not fit.
    assert_eq!(
        (f.reason(), t0.elapsed(), svc.attempts()),
        (Reason::PauseExceedsDeadline, ms(600), 1)
    );
    let refused = f.refused_pause().unwrap();
    assert_eq!(
        (refused.pause(), refused.left(), refused.asked_by_server()),
        (ms(500), ms(400), false)
    );
    assert_eq!(
        refused.to_string(),
        "the next pause of 500ms does not fit in the 400ms left"
    );
    assert!(matches!(f.last_error(), Some(SvcError::NotExecuted(None))));
    assert!(
        f.to_string()
            .starts_with("stopped after 1 attempt in 600ms: the next pause of 500ms does not fit in the 400ms left: "),
        "{f}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_refused_pause_after_a_cut_off_attempt_says_so_in_its_stopped() {
    // Cut off by its 600 ms attempt timeout (unknown, idempotent: retried),
    // then a 500 ms pause does not fit in the 400 ms left: no error of the
    // operation's type exists, so the caller gets a `Stopped` that says
    // what did not fit, 400 ms before the deadline.
    let policy = Policy::new(ms(1000))
        .with_attempt_timeout(ms(600))
        .with_backoff(Backoff::constant(ms(500)));
    let svc = Service::new(&[Step::Hang]);
    let t0 = Instant::now();
    let f = run(&policy, &svc).await.unwrap_err();
    assert_eq!(
        (f.reason(), t0.elapsed()),
        (Reason::PauseExceedsDeadline, ms(600))
    );
    let SvcError::Stopped(s) = f.into_error() else {
        panic!("expected Stopped")
    };
    assert_eq!(s.refused_pause().unwrap().pause(), ms(500));
    assert_eq!(
        s.to_string(),
        "retry stopped after 1 attempt in 600ms: the next pause of 500ms does not fit in the 400ms left"
    );
}

#[tokio::test(start_paused = true)]
async fn the_pause_must_leave_room_for_a_minimal_attempt() {
    let policy = Policy::new(ms(1000))
        .with_backoff(Backoff::constant(ms(350)))
        .with_min_attempt(ms(100));
    // 600 + 350 + 100 > 1000: no pause.
    let svc = Service::new(&[Step::After(ms(600), &Step::FailBefore)]);
    let t0 = Instant::now();
    let f = run(&policy, &svc).await.unwrap_err();
    assert_eq!(
        (f.reason(), t0.elapsed()),
        (Reason::PauseExceedsDeadline, ms(600))
    );
    assert_eq!(f.refused_pause().unwrap().left(), ms(400));
    // 550 + 350 + 100 = 1000: it fits exactly, and the attempt gets its 100 ms.
    let svc = Service::new(&[Step::After(ms(550), &Step::FailBefore), Step::Hang]);
    let t0 = Instant::now();
    let f = run(&policy, &svc).await.unwrap_err();
    assert_eq!(svc.starts(t0), [ms(0), ms(900)]);
    assert_eq!(
        (f.reason(), t0.elapsed()),
        (Reason::DeadlineExceeded, ms(1000))
    );
}

#[tokio::test(start_paused = true)]
async fn pushback_longer_than_the_remaining_time_stops_at_once() {
    let policy = Policy::new(ms(1000));
    let svc = Service::new(&[Step::Pushback(ms(2000))]);
    let t0 = Instant::now();
    let f = run(&policy, &svc).await.unwrap_err();
    assert_eq!(
        (f.reason(), t0.elapsed(), svc.attempts()),
        (Reason::PauseExceedsDeadline, ms(0), 1)
    );
    let refused = f.refused_pause().unwrap();
    assert_eq!(
        refused.to_string(),
        "the server asked to wait 2s; 1s was left"
    );
    assert!(refused.asked_by_server());
}

#[tokio::test(start_paused = true)]
async fn pushback_replaces_the_pause_and_restarts_the_backoff_sequence() {
    let policy = Policy::new(Duration::from_secs(10))
        .with_max_attempts(5)
        .with_backoff(
            Backoff::exponential(ms(100), 2.0, Duration::from_secs(5))
                .with_jitter(retries::Jitter::None),
        );
    let svc = Service::new(&[
        Step::FailBefore,       // pause 100
        Step::FailBefore,       // pause 200
        Step::Pushback(ms(50)), // pause 50 (the server's), sequence restarts
        Step::FailBefore,       // pause 100 again, not 400
        Step::Succeed,
    ]);
    let t0 = Instant::now();
    assert_eq!(run(&policy, &svc).await.unwrap(), 7);
    assert_eq!(svc.starts(t0), [ms(0), ms(100), ms(300), ms(350), ms(450)]);
}

#[tokio::test(start_paused = true)]
async fn one_attempt_never_retries() {
    let policy = Policy::new(ms(1000)).with_max_attempts(1);
    let svc = Service::new(&[Step::FailBefore, Step::Succeed]);
    let t0 = Instant::now();
    let f = run(&policy, &svc).await.unwrap_err();
    assert_eq!(
        (f.reason(), f.attempts(), svc.attempts(), t0.elapsed()),
        (Reason::Exhausted, 1, 1, ms(0))
    );
}

#[tokio::test(start_paused = true)]
async fn the_clock_is_not_needed_by_a_body_that_is_ready_at_once() {
    // Nothing sleeps and nothing fails: the call takes no virtual time and the
    // deadline never matters, however short.
    let policy = Policy::new(Duration::from_nanos(1)).with_min_attempt(Duration::ZERO);
    let t0 = Instant::now();
    let v: Result<u8, std::io::Error> = call(&policy)
        .idempotent()
        .run(async |_: &Attempt| Ok(1))
        .await;
    assert_eq!((v.unwrap(), t0.elapsed()), (1, ms(0)));
}

#[tokio::test(start_paused = true)]
async fn io_errors_map_deadline_to_timed_out_and_stay_permanent() {
    use retries::Classify;
    let policy = Policy::new(ms(100));
    let err = call(&policy)
        .idempotent()
        .run(async |_: &Attempt| -> Result<(), std::io::Error> { std::future::pending().await })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    let stopped = err
        .get_ref()
        .and_then(|e| e.downcast_ref::<Stopped>())
        .expect("a Stopped inside");
    assert_eq!(stopped.reason(), Reason::DeadlineExceeded);
    // An outer layer must not retry a call an inner one stopped.
    assert_eq!(err.classify(), retries::Verdict::permanent());
}

/// No first attempt at or after a deadline set before the call (here an
/// enclosing scope's, as a server layer or an outer attempt installs it),
/// nor with less than `min_attempt` (1 ms) left: the builder and the
/// attribute stop with `DeadlineExceeded` and 0 attempts, and the body never
/// runs. With the time left, the same call runs.
#[tokio::test(start_paused = true)]
async fn no_first_attempt_at_or_after_a_deadline_set_before_the_call() {
    let policy = Policy::new(Duration::from_secs(1)).with_max_attempts(3);
    let runs = std::sync::atomic::AtomicU32::new(0);
    let body = async |_: &Attempt| {
        runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok::<_, SvcError>(7)
    };
    for left in [None, Some(Duration::ZERO), Some(Duration::from_micros(500))] {
        let deadline = match left {
            // Passed 5 ms ago.
            None => Instant::now().into_std(),
            Some(d) => (Instant::now() + d).into_std(),
        };
        if left.is_none() {
            tokio::time::advance(ms(5)).await;
        }
        let stopped =
            retries::scope::with_deadline(deadline, call(&policy).idempotent().outcome(body))
                .await
                .expect_err("no attempt");
        assert_eq!(stopped.reason(), Reason::DeadlineExceeded, "{left:?}");
        assert_eq!(stopped.attempts(), 0, "{left:?}");
        assert_eq!(
            runs.load(std::sync::atomic::Ordering::Relaxed),
            0,
            "{left:?}"
        );
    }
    // The attribute, the same rule.
    #[retries::retryable(policy = POLICY, idempotent)]
    async fn stock(runs: &std::sync::atomic::AtomicU32) -> Result<u32, Stopped> {
        runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(7)
    }
    const POLICY: Policy = Policy::new(Duration::from_secs(1)).validated();
    let passed = Instant::now().into_std();
    tokio::time::advance(ms(5)).await;
    let err = retries::scope::with_deadline(passed, stock(&runs))
        .await
        .expect_err("no attempt");
    assert_eq!(err.reason(), Reason::DeadlineExceeded);
    assert_eq!(err.attempts(), 0);
    assert_eq!(runs.load(std::sync::atomic::Ordering::Relaxed), 0);
    // With 2 ms left the call runs, once.
    let soon = (Instant::now() + ms(2)).into_std();
    let ran = retries::scope::with_deadline(soon, call(&policy).idempotent().outcome(body)).await;
    assert_eq!(ran.ok(), Some(7));
    assert_eq!(runs.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn a_conflicts_hint_that_does_not_fit_is_shortened_to_half_the_time_left() {
    // A 409 for a key in progress: "the other run is expected done in
    // 30 s", where the call has 5 s. As a conflict the call looks again
    // within its deadline, each time after half the time left (less the
    // 1 ms `min_attempt`): a pause of 2,499.5 ms, then one of 1,249.5 ms,
    // each ending on tokio's next millisecond: at 2,500 ms and 3,750 ms.
    let policy = Policy::new(ms(5000));
    let in_progress = retries::Verdict::not_executed()
        .with_conflict()
        .with_retry_after(Duration::from_secs(30));
    let t0 = Instant::now();
    let mut starts = Vec::new();
    let done = call(&policy)
        .idempotent()
        .classify(move |_: &SvcError| in_progress)
        .outcome(async |at: &Attempt| {
            starts.push(t0.elapsed());
            if at.number() < 3 {
                Err(SvcError::NotExecuted(None))
            } else {
                Ok(at.number())
            }
        })
        .await;
    assert_eq!(done.unwrap(), 3);
    assert_eq!(starts, [ms(0), ms(2500), ms(3750)]);

    // The same hint on a refusal that is not a conflict (a 429, a 503) is
    // a time before which the server will not take the call: it stops at
    // once, having waited for nothing.
    let refused = retries::Verdict::not_executed().with_retry_after(Duration::from_secs(30));
    let t0 = Instant::now();
    let f = call(&policy)
        .idempotent()
        .classify(move |_: &SvcError| refused)
        .outcome(async |_: &Attempt| Err::<u32, _>(SvcError::NotExecuted(None)))
        .await
        .unwrap_err();
    assert_eq!(
        (f.reason(), f.attempts(), t0.elapsed()),
        (Reason::PauseExceedsDeadline, 1, ms(0))
    );
}
