//! The client-side rate limit (`retries::limit::RateLimit`, issue 63 item
//! 2) through `retries::call`, on the paused clock with exact instants:
//! first attempts spaced by the rate after the burst, retries drawing from
//! the same limit after their pause, a start that cannot fit the deadline
//! stopping the call at once (nothing sent, nothing reserved), the limit
//! beside a concurrency limit, and the blocking door sleeping for its
//! start.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use retries::limit::{Concurrency, RateLimit};
use retries::{Attempt, Backoff, Classify, Policy, Reason, Verdict};
use tokio::time::Instant;

// `call(&policy)`: `retries::call` under this file's own name.
crate::common::named_call!();

#[derive(Debug, thiserror::Error, Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    #[classify(transparent)]
    Stopped(#[from] retries::Stopped),
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[tokio::test(start_paused = true)]
async fn first_attempts_are_spaced_by_the_rate_after_the_burst() {
    // 10 a second in bursts of 2: six callers at once start at 0, 0, 100,
    // 200, 300 and 400 ms.
    let rate = RateLimit::new(10, Duration::from_secs(1), 2);
    let policy = Policy::new(Duration::from_secs(2));
    let t0 = Instant::now();
    let starts = Rc::new(RefCell::new(Vec::new()));
    let calls = (0..6).map(|_| {
        let starts = Rc::clone(&starts);
        let (rate, policy) = (&rate, &policy);
        async move {
            call(policy)
                .idempotent()
                .rate_limit(rate)
                .run(async |_: &Attempt| {
                    starts.borrow_mut().push(t0.elapsed());
                    Ok::<_, E>(())
                })
                .await
        }
    });
    for r in futures_util::future::join_all(calls).await {
        r.unwrap();
    }
    assert_eq!(
        *starts.borrow(),
        [ms(0), ms(0), ms(100), ms(200), ms(300), ms(400)]
    );
}

#[tokio::test(start_paused = true)]
async fn retries_draw_from_the_limit_after_their_pause() {
    // One start a second. The first attempt is refused; the backoff's 10 ms
    // pause ends long before the next start, so the retry starts at 1 s.
    // Another caller's first attempt, asking at 500 ms, then starts at 2 s.
    let rate = RateLimit::new(1, Duration::from_secs(1), 1);
    let policy = Policy::new(Duration::from_secs(5))
        .with_backoff(Backoff::constant(ms(10)))
        .with_max_attempts(3);
    let t0 = Instant::now();
    let starts = RefCell::new(Vec::new());
    let first = call(&policy)
        .idempotent()
        .rate_limit(&rate)
        .run(async |at: &Attempt| {
            starts
                .borrow_mut()
                .push(("first", at.number(), t0.elapsed()));
            if at.number() == 1 {
                Err(E::Refused)
            } else {
                Ok(())
            }
        });
    let second = async {
        tokio::time::sleep(ms(500)).await;
        call(&policy)
            .idempotent()
            .rate_limit(&rate)
            .run(async |at: &Attempt| {
                starts
                    .borrow_mut()
                    .push(("second", at.number(), t0.elapsed()));
                Ok::<_, E>(())
            })
            .await
    };
    let (a, b) = tokio::join!(first, second);
    a.unwrap();
    b.unwrap();
    assert_eq!(
        *starts.borrow(),
        [
            ("first", 1, ms(0)),
            ("first", 2, ms(1000)),
            ("second", 1, ms(2000))
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_start_too_late_for_the_deadline_stops_the_call_at_once() {
    // One start every 2 s, a deadline of 1 s: the second call's start would
    // come after its deadline, so it stops now, sends nothing, and takes no
    // start from a third call made with room to wait.
    let rate = RateLimit::new(1, Duration::from_secs(2), 1);
    let short = Policy::new(Duration::from_secs(1));
    let long = Policy::new(Duration::from_secs(5));
    let sent = RefCell::new(0);
    let body = async |_: &Attempt| {
        *sent.borrow_mut() += 1;
        Ok::<_, E>(())
    };
    call(&short)
        .idempotent()
        .rate_limit(&rate)
        .run(body)
        .await
        .unwrap();
    let t0 = Instant::now();
    let stopped = call(&short)
        .idempotent()
        .rate_limit(&rate)
        .outcome(body)
        .await
        .unwrap_err();
    assert_eq!(stopped.reason(), Reason::RateLimited);
    assert_eq!(stopped.attempts(), 0);
    assert_eq!(t0.elapsed(), Duration::ZERO);
    assert_eq!(*sent.borrow(), 1);
    // As the caller's error: a `Stopped` classified not executed.
    let e = call(&short)
        .idempotent()
        .rate_limit(&rate)
        .run(body)
        .await
        .unwrap_err();
    assert!(matches!(&e, E::Stopped(s) if s.reason() == Reason::RateLimited));
    assert_eq!(e.classify(), Verdict::not_executed());
    // The refusals took nothing: the next start is still at 2 s.
    call(&long)
        .idempotent()
        .rate_limit(&rate)
        .run(body)
        .await
        .unwrap();
    assert_eq!(t0.elapsed(), Duration::from_secs(2));
    assert_eq!(*sent.borrow(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_retry_whose_start_does_not_fit_stops_rate_limited() {
    // A start every 800 ms, a deadline of 1 s: the retry's start (800 ms)
    // leaves less than the policy's `min_attempt` (250 ms), so the call stops
    // after its first attempt, at once.
    let rate = RateLimit::new(1, ms(800), 1);
    let policy = Policy::new(Duration::from_secs(1))
        .with_backoff(Backoff::constant(ms(10)))
        .with_min_attempt(ms(250));
    let t0 = Instant::now();
    let f = call(&policy)
        .idempotent()
        .rate_limit(&rate)
        .outcome(async |_: &Attempt| Err::<(), _>(E::Refused))
        .await
        .unwrap_err();
    assert_eq!((f.reason(), f.attempts()), (Reason::RateLimited, 1));
    assert_eq!(t0.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn the_rate_beside_a_concurrency_limit() {
    // One slot, bodies of 50 ms, 10 starts a second: the slot is taken
    // first, then the start; four callers start at 0, 100, 200 and 300 ms
    // (the rate, not the slot, is what spaces them).
    let slots = Concurrency::new(1, Duration::from_secs(1));
    let rate = RateLimit::new(10, Duration::from_secs(1), 1);
    let policy = Policy::new(Duration::from_secs(2));
    let t0 = Instant::now();
    let starts = Rc::new(RefCell::new(Vec::new()));
    let calls = (0..4).map(|_| {
        let starts = Rc::clone(&starts);
        let (rate, slots, policy) = (&rate, &slots, &policy);
        async move {
            call(policy)
                .idempotent()
                .concurrency(slots)
                .rate_limit(rate)
                .run(async |_: &Attempt| {
                    starts.borrow_mut().push(t0.elapsed());
                    tokio::time::sleep(ms(50)).await;
                    Ok::<_, E>(())
                })
                .await
        }
    });
    for r in futures_util::future::join_all(calls).await {
        r.unwrap();
    }
    assert_eq!(*starts.borrow(), [ms(0), ms(100), ms(200), ms(300)]);
}

#[test]
fn the_blocking_door_sleeps_for_its_start() {
    // Real time, bounded: 20 starts a second, no burst; the third of three
    // blocking calls starts at least 100 ms after the first call began (two
    // waits of 50 ms), the second at least 50 ms after.
    let rate = RateLimit::new(20, Duration::from_secs(1), 1);
    let policy = Policy::new(Duration::from_secs(2));
    let t0 = std::time::Instant::now();
    let mut starts = Vec::new();
    for _ in 0..3 {
        call(&policy)
            .idempotent()
            .rate_limit(&rate)
            .run_blocking(|_: &Attempt| {
                starts.push(std::time::Instant::now());
                Ok::<_, E>(())
            })
            .unwrap();
    }
    assert!(starts[1] - t0 >= ms(50), "{:?}", starts[1] - t0);
    assert!(starts[2] - t0 >= ms(100), "{:?}", starts[2] - t0);
}

#[tokio::test(start_paused = true)]
async fn hedged_copies_draw_from_the_limit() {
    // Copies every 50 ms, but 10 starts a second: the copies start at 0,
    // 100 and 200 ms; the third answers 10 ms after its start.
    let rate = RateLimit::new(10, Duration::from_secs(1), 1);
    let policy = Policy::new(Duration::from_secs(2));
    let t0 = Instant::now();
    let starts = RefCell::new(Vec::new());
    let answer = call(&policy)
        .idempotent()
        .rate_limit(&rate)
        .run_hedged(retries::Hedging::new(3, ms(50)), |at: &Attempt| {
            starts.borrow_mut().push(t0.elapsed());
            let n = at.number();
            async move {
                tokio::time::sleep(if n == 3 { ms(10) } else { ms(1000) }).await;
                Ok::<_, E>(n)
            }
        })
        .await;
    assert_eq!(answer.unwrap(), 3);
    assert_eq!(*starts.borrow(), [ms(0), ms(100), ms(200)]);
    assert_eq!(t0.elapsed(), ms(210));
}

/// The attribute's `rate_limit` key, on an `async fn` beside `concurrency`
/// and on a method of an `impl` block whose calls share the limit.
mod attribute {
    use super::*;
    use retries::retryable;

    static SLOTS: Concurrency = Concurrency::new(4, Duration::from_secs(1));
    static SEARCH: RateLimit = RateLimit::new(5, Duration::from_secs(1), 1);

    #[retryable(deadline = "2s", idempotent, concurrency = SLOTS, rate_limit = SEARCH)]
    async fn search(started: &RefCell<Vec<Duration>>, t0: Instant) -> Result<(), E> {
        started.borrow_mut().push(t0.elapsed());
        Ok(())
    }

    struct Client {
        limit: RateLimit,
    }

    #[retryable(deadline = "300ms", idempotent, rate_limit = self.limit)]
    impl Client {
        async fn get(&self) -> Result<u32, E> {
            Ok(1)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn on_a_function_and_on_a_method() {
        let t0 = Instant::now();
        let started = RefCell::new(Vec::new());
        for _ in 0..3 {
            search(&started, t0).await.unwrap();
        }
        assert_eq!(*started.borrow(), [ms(0), ms(200), ms(400)]);

        // One start a second, a deadline of 300 ms: the second call cannot
        // start in time and stops at once.
        let client = Client {
            limit: RateLimit::new(1, Duration::from_secs(1), 1),
        };
        let t1 = Instant::now();
        assert_eq!(client.get().await.unwrap(), 1);
        let e = client.get().await.unwrap_err();
        assert!(
            matches!(&e, E::Stopped(s) if s.reason() == Reason::RateLimited),
            "{e:?}"
        );
        assert_eq!(t1.elapsed(), Duration::ZERO);
    }
}

/// Keyed limits (`RateLimits`): a tenant's calls wait for their own
/// starts only, through the attribute with the key taken from an argument.
mod keyed {
    use super::*;
    use retries::limit::RateLimits;
    use retries::retryable;
    use std::sync::LazyLock;

    // Each tenant: 2 a second, no burst; at most 1,000 tenants kept.
    static PER_TENANT: LazyLock<RateLimits> =
        LazyLock::new(|| RateLimits::new(2, Duration::from_secs(1), 1, 1_000));

    #[retryable(deadline = "5s", idempotent, rate_limit = PER_TENANT.get(tenant))]
    async fn quote(
        tenant: &str,
        log: &RefCell<Vec<(String, Duration)>>,
        t0: Instant,
    ) -> Result<(), E> {
        log.borrow_mut().push((tenant.to_owned(), t0.elapsed()));
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn each_tenant_waits_for_its_own_starts() {
        let t0 = Instant::now();
        let log = RefCell::new(Vec::new());
        let calls =
            ["acme", "acme", "globex", "acme", "globex"].map(|tenant| quote(tenant, &log, t0));
        for r in futures_util::future::join_all(calls).await {
            r.unwrap();
        }
        let mut seen = log.into_inner();
        seen.sort_by_key(|(t, at)| (t.clone(), *at));
        let seen: Vec<_> = seen.iter().map(|(t, at)| (t.as_str(), *at)).collect();
        assert_eq!(
            seen,
            [
                ("acme", ms(0)),
                ("acme", ms(500)),
                ("acme", ms(1000)),
                ("globex", ms(0)),
                ("globex", ms(500)),
            ]
        );
        assert_eq!(PER_TENANT.len(), 2);
    }
}

/// A server's announced quota (`retries::limit::Pace`) through
/// `retries::call`: what the attempt's own answer announces paces the
/// retry; a retry that cannot start before the deadline stops the call
/// with `Reason::OverQuota`, and a rate limit beside it keeps its own
/// reason.
#[tokio::test(start_paused = true)]
async fn an_announced_quota_paces_the_retry_and_stops_over_quota() {
    use retries::limit::Pace;
    let pace = Pace::new();
    let policy = Policy::new(Duration::from_secs(5))
        .with_backoff(Backoff::constant(ms(10)))
        .with_max_attempts(3);
    let t0 = Instant::now();
    let starts = RefCell::new(Vec::new());
    // The first answer is a refusal announcing nothing left for 2 s: the
    // retry waits until then, not the backoff's 10 ms.
    let r = call(&policy)
        .idempotent()
        .pace(&pace)
        .run(async |at: &Attempt| {
            starts.borrow_mut().push(t0.elapsed());
            if at.number() == 1 {
                let now = Instant::now().into_std();
                pace.announce(0, Duration::from_secs(2), now, now);
                Err(E::Refused)
            } else {
                Ok(())
            }
        })
        .await;
    r.unwrap();
    assert_eq!(*starts.borrow(), [ms(0), ms(2000)]);
    // Nothing left for 30 s: a call with 5 s stops at once, unsent.
    let now = Instant::now().into_std();
    pace.announce(0, Duration::from_secs(30), now, now);
    let t1 = Instant::now();
    let r: Result<(), E> = call(&policy)
        .idempotent()
        .pace(&pace)
        .run(async |_: &Attempt| panic!("nothing is sent"))
        .await;
    let Err(E::Stopped(s)) = r else {
        panic!("{r:?}")
    };
    assert_eq!(
        (s.reason(), t1.elapsed()),
        (Reason::OverQuota, Duration::ZERO)
    );
    assert_eq!(s.classify().kind(), retries::VerdictKind::NotExecuted);
    // A quota with room and a rate limit without: the rate's reason.
    let roomy = Pace::new();
    roomy.announce(100, Duration::from_secs(10), now, now);
    let rate = RateLimit::new(1, Duration::from_mins(1), 1);
    let r: Result<(), E> = call(&policy)
        .idempotent()
        .pace(&roomy)
        .rate_limit(&rate)
        .run(async |_: &Attempt| Ok(()))
        .await;
    r.unwrap();
    let r: Result<(), E> = call(&policy)
        .idempotent()
        .pace(&roomy)
        .rate_limit(&rate)
        .run(async |_: &Attempt| Ok(()))
        .await;
    let Err(E::Stopped(s)) = r else {
        panic!("{r:?}")
    };
    assert_eq!(s.reason(), Reason::RateLimited);
}
