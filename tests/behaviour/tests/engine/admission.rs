//! Adaptive admission of first attempts (`retries::limit::Admission`) on the
//! paused clock, with exact counts: the SRE rule applied by error diffusion
//! to a pattern of overloaded refusals, unknown outcomes and permanent
//! errors that never move it, recovery once the overload has left its
//! window, a local refusal that sends nothing and classifies as not
//! executed, and bad settings as typed errors.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use retries::limit::{Admission, AdmissionError};
use retries::{Attempt, Classify, NoBudget, Policy, Reason, Verdict, VerdictKind};

#[derive(Debug, Clone, Copy)]
enum Answer {
    Overloaded,
    Unknown,
    Permanent,
    Ok,
}

/// One call through `admission`, one attempt, answered `answer`; `true`
/// when it was sent (not refused locally).
async fn one(admission: &Admission<NoBudget>, answer: Answer) -> (bool, Option<Reason>) {
    let policy = Policy::new(Duration::from_secs(1)).with_max_attempts(1);
    let sent = AtomicBool::new(false);
    let r = retries::call(&policy)
        .idempotent()
        .budget(admission)
        .classify(|a: &Answer| match a {
            Answer::Overloaded => Verdict::not_executed().with_overload(),
            // An unknown outcome marked overloaded is not overloaded.
            Answer::Unknown => Verdict::unknown().with_overload(),
            Answer::Permanent | Answer::Ok => Verdict::permanent(),
        })
        .outcome(async |_: &Attempt| {
            sent.store(true, Ordering::Relaxed);
            match answer {
                Answer::Ok => Ok(()),
                other => Err(other),
            }
        })
        .await;
    (sent.load(Ordering::Relaxed), r.err().map(|f| f.reason()))
}

fn admission() -> Admission<NoBudget> {
    Admission::around(NoBudget, 2.0, Duration::from_secs(10))
}

#[tokio::test(start_paused = true)]
async fn overloaded_refusals_throttle_first_attempts_at_the_sre_rate() {
    // Every call refused as overloaded. With K = 2 and no accepts the rate
    // after n requests is n / (n + 1); error diffusion refuses call 3, 5,
    // 6, 7, 8, 9, 10 and sends call 11 (worked by hand from the rule).
    let a = admission();
    let mut pattern = String::new();
    for _ in 0..11 {
        let (sent, reason) = one(&a, Answer::Overloaded).await;
        if sent {
            pattern.push('s');
        } else {
            assert_eq!(reason, Some(Reason::Throttled));
            pattern.push('-');
        }
    }
    assert_eq!(pattern, "ss-s------s");
    assert!(a.is_throttling());
}

#[tokio::test(start_paused = true)]
async fn unknown_outcomes_permanent_errors_and_successes_never_throttle() {
    let a = admission();
    for answer in [Answer::Unknown, Answer::Permanent, Answer::Ok] {
        for _ in 0..50 {
            assert!(one(&a, answer).await.0, "{answer:?}");
        }
    }
    assert!(!a.is_throttling());
    assert!(a.refusal_rate().abs() < f64::EPSILON);
}

#[tokio::test(start_paused = true)]
async fn accepts_keep_the_rate_at_zero_while_k_times_them_exceeds_the_requests() {
    // One call in three refused as overloaded, the others answered (here:
    // permanent errors, which the service did take): K · accepts ≥
    // requests, so the rate stays at zero (one early 0.5 never crosses a
    // whole call) and nothing is refused.
    let a = admission();
    for i in 0..100 {
        let answer = if i % 3 == 0 {
            Answer::Overloaded
        } else {
            Answer::Permanent
        };
        assert!(one(&a, answer).await.0, "call {i} refused");
    }
    assert!(a.is_throttling());
}

#[tokio::test(start_paused = true)]
async fn the_rate_recovers_once_the_overload_has_left_its_window() {
    let a = admission();
    for _ in 0..11 {
        one(&a, Answer::Overloaded).await;
    }
    assert!(a.refusal_rate() > 0.8);
    // Half a window later it still throttles...
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!one(&a, Answer::Ok).await.0, "still refused");
    // ...and a whole window after the last overloaded refusal it has
    // stopped: every call is sent again.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for _ in 0..20 {
        assert!(one(&a, Answer::Ok).await.0);
    }
    assert!(!a.is_throttling());
}

#[tokio::test(start_paused = true)]
async fn a_local_refusal_sends_nothing_and_classifies_as_not_executed() {
    let a = admission();
    let policy = Policy::new(Duration::from_secs(1)).with_max_attempts(1);
    for _ in 0..11 {
        one(&a, Answer::Overloaded).await;
    }
    // The next call is refused (call 12: rate 11/12 on a debt of 7.98).
    let f = retries::call(&policy)
        .idempotent()
        .budget(&a)
        .outcome(async |_: &Attempt| -> Result<(), std::io::Error> { panic!("nothing is sent") })
        .await
        .unwrap_err();
    assert_eq!((f.reason(), f.attempts()), (Reason::Throttled, 0));
    let stopped = f.into_stopped();
    let v = stopped.classify();
    assert_eq!(v.kind(), VerdictKind::NotExecuted);
    assert!(v.is_overloaded(), "an outer admission learns from it too");
}

#[test]
fn bad_settings_are_typed_errors() {
    for k in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert_eq!(
            Admission::try_new(k, Duration::from_secs(10)).unwrap_err(),
            AdmissionError::K,
            "{k}"
        );
    }
    for window in [
        Duration::ZERO,
        Duration::from_millis(5),
        Duration::from_hours(2),
    ] {
        assert_eq!(
            Admission::try_new(2.0, window).unwrap_err(),
            AdmissionError::Window,
            "{window:?}"
        );
    }
    assert!(Admission::try_new(1.1, Duration::from_mins(2)).is_ok());
}

/// Calls sent out of `n` calls through `a`, every one refused as
/// overloaded, from `threads` threads at once (each its own runtime).
fn sent_under_overload(a: &'static Admission<NoBudget>, n: u32, threads: u32) -> u32 {
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let mut sent = 0;
                    for _ in 0..n / threads {
                        if one(a, Answer::Overloaded).await.0 {
                            sent += 1;
                        }
                    }
                    sent
                })
            })
        })
        .collect();
    workers.into_iter().map(|w| w.join().unwrap()).sum()
}

#[test]
fn under_contention_no_more_are_sent_than_the_rule_allows() {
    // Sequentially, 4,000 calls refused as overloaded send few (the rate
    // tends to n / (n + 1)); from four threads at once the counters race
    // (relaxed atomics, no lock), and the stated tolerance is twice the
    // sequential count plus one per thread.
    static ALONE: Admission<NoBudget> = Admission::around(NoBudget, 2.0, Duration::from_mins(1));
    static SHARED: Admission<NoBudget> = Admission::around(NoBudget, 2.0, Duration::from_mins(1));
    let alone = sent_under_overload(&ALONE, 4_000, 1);
    let shared = sent_under_overload(&SHARED, 4_000, 4);
    assert!(alone < 40, "{alone}");
    assert!(
        shared <= 2 * alone + 4,
        "{shared} sent from four threads, {alone} alone"
    );
}

/// A service that accepts `per_second` calls a second, counted per window
/// of `granularity` (the first `per_second × granularity` calls of each
/// window accepted, the rest refused as overloaded), under 1,000 calls a
/// second (one a millisecond, one attempt each) through an admission with
/// `k` over a 10 s window, for `seconds`: the calls it received and
/// accepted, second by second.
async fn under_fixed_capacity(granularity: Duration, k: f64, seconds: u64) -> Vec<(u64, u64)> {
    const PER_SECOND: u128 = 100;
    let admission = Admission::around(NoBudget, k, Duration::from_secs(10));
    let policy = Policy::new(Duration::from_secs(1)).with_max_attempts(1);
    let per_window = u64::try_from(PER_SECOND * granularity.as_millis() / 1000).unwrap();
    let t0 = tokio::time::Instant::now();
    let mut seconds_seen = vec![(0u64, 0u64); usize::try_from(seconds).unwrap()];
    let (mut window, mut taken) = (u128::MAX, 0u64);
    for _ in 0..seconds * 1000 {
        let at = t0.elapsed();
        let second = usize::try_from(at.as_secs()).unwrap();
        let _ = retries::call(&policy)
            .idempotent()
            .budget(&admission)
            .classify(|_: &Answer| Verdict::not_executed().with_overload())
            .outcome(async |_: &Attempt| {
                let w = at.as_millis() / granularity.as_millis();
                if w != window {
                    (window, taken) = (w, 0);
                }
                seconds_seen[second].0 += 1;
                if taken == per_window {
                    return Err(Answer::Overloaded);
                }
                taken += 1;
                seconds_seen[second].1 += 1;
                Ok(())
            })
            .await;
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    seconds_seen
}

/// Received and accepted per second over seconds `from..to`.
fn average(per_second: &[(u64, u64)], from: usize, to: usize) -> (f64, f64) {
    let n = (to - from) as f64;
    let (r, a) = per_second[from..to]
        .iter()
        .fold((0, 0), |(r, a), &(x, y)| (r + x, a + y));
    (r as f64 / n, a as f64 / n)
}

#[tokio::test(start_paused = true)]
async fn a_service_is_held_at_k_times_its_capacity_whatever_its_granularity() {
    // K = 2 against 100 calls/s counted per second, per 500 ms and per
    // 100 ms: about 200 received and 100 accepted a second, from the first
    // seconds on (the onset is not mistaken for a service that accepts
    // nothing), with no sawtooth of starved seconds.
    for granularity in [1000, 500, 100].map(Duration::from_millis) {
        let seen = under_fixed_capacity(granularity, 2.0, 20).await;
        let (received, accepted) = average(&seen, 10, 20);
        assert!(
            (190.0..=215.0).contains(&received) && (95.0..=100.0).contains(&accepted),
            "{granularity:?}: {received}/s received, {accepted}/s accepted: {seen:?}"
        );
        for (second, &(received, accepted)) in seen.iter().enumerate().skip(1) {
            assert!(
                accepted >= 90 && received <= 320,
                "{granularity:?}, second {second}: {received} received, {accepted} accepted: {seen:?}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn the_onset_settles_within_seconds_for_k_from_one_and_a_half_to_three() {
    for k in [1.5, 2.0, 3.0] {
        let seen = under_fixed_capacity(Duration::from_secs(1), k, 12).await;
        let (received, accepted) = average(&seen, 2, 12);
        let ratio = received / accepted;
        assert!(
            (k * 0.9..=k * 1.1).contains(&ratio) && accepted >= 95.0,
            "K = {k}: {received}/s received, {accepted}/s accepted: {seen:?}"
        );
        let (second_one, _) = seen[1];
        assert!(
            second_one as f64 <= 100.0 * k * 1.6,
            "K = {k}: no burst after the onset: {seen:?}"
        );
    }
}
