//! Backpressure on the client side (`retries::limit::Concurrency`), on the
//! paused clock: never more calls in progress than slots, bounded waiting
//! (the limit's own and the deadline's), first come first served, rejected
//! calls send nothing and cost no budget, retries keep their slot; the
//! attribute's `concurrency` key on a function and on a method.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use retries::limit::Concurrency;
use retries::{Attempt, Backoff, Classify, Policy, Reason, TokenBucket, Verdict, retryable};
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

/// Calls in progress now and the most seen, counted inside the bodies.
#[derive(Default)]
struct Gauge {
    now: Cell<u32>,
    max: Cell<u32>,
    bodies: Cell<u32>,
}

impl Gauge {
    async fn work(&self, d: Duration) {
        self.bodies.set(self.bodies.get() + 1);
        self.now.set(self.now.get() + 1);
        self.max.set(self.max.get().max(self.now.get()));
        tokio::time::sleep(d).await;
        self.now.set(self.now.get() - 1);
    }
}

#[tokio::test(start_paused = true)]
async fn a_thousand_callers_against_sixteen_slots() {
    // Bodies take 10 ms; a caller waits at most 45 ms for a slot. First come
    // first served: waves start at 0, 10, 20, 30 and 40 ms (16 each); the
    // rest are refused at exactly 45 ms, having sent nothing.
    let limit = Concurrency::new(16, Duration::from_millis(45));
    let budget = TokenBucket::new(10, 0.1);
    let policy = Policy::new(Duration::from_secs(2));
    let gauge = Rc::new(Gauge::default());
    let t0 = Instant::now();
    let calls = (0..1000).map(|_| {
        let (gauge, limit, budget) = (Rc::clone(&gauge), &limit, &budget);
        async move {
            let r = call(&policy)
                .idempotent()
                .budget(budget)
                .concurrency(limit)
                .outcome(async |_: &Attempt| {
                    gauge.work(Duration::from_millis(10)).await;
                    Ok::<_, E>(Instant::now())
                })
                .await;
            (r, t0.elapsed())
        }
    });
    let results = futures_util::future::join_all(calls).await;

    let mut done = 0;
    let mut refused = 0;
    for (i, (r, elapsed)) in results.into_iter().enumerate() {
        match r {
            Ok(end) => {
                done += 1;
                // The i-th caller ran in wave i / 16, and ended 10 ms later.
                let wave = u32::try_from(i / 16).unwrap();
                assert_eq!(
                    end - t0,
                    Duration::from_millis(10) * (wave + 1),
                    "caller {i}"
                );
            }
            Err(f) => {
                refused += 1;
                assert_eq!(f.reason(), Reason::Saturated, "caller {i}");
                assert_eq!(f.attempts(), 0);
                assert!(f.last_error().is_none());
                assert_eq!(
                    elapsed,
                    Duration::from_millis(45),
                    "caller {i} waited past its bound"
                );
            }
        }
    }
    assert_eq!((done, refused), (80, 920));
    assert_eq!(gauge.max.get(), 16, "never more than 16 in progress");
    assert_eq!(gauge.bodies.get(), 80, "a refused call sends nothing");
    assert_eq!(
        budget.tokens_milli(),
        budget.max_milli(),
        "refusals cost no budget"
    );
    assert_eq!(limit.in_flight(), 0, "every slot given back");
}

#[tokio::test(start_paused = true)]
async fn the_wait_ends_where_a_first_attempt_would_no_longer_fit() {
    // A 100 ms deadline with a 20 ms `min_attempt`: a caller queued behind a
    // 1 s call gives up after 80 ms, not after the limit's 1 s.
    let limit = Concurrency::new(1, Duration::from_secs(1));
    let long = Policy::new(Duration::from_secs(5));
    let short = Policy::new(Duration::from_millis(100)).with_min_attempt(Duration::from_millis(20));
    let t0 = Instant::now();
    let holder = call(&long)
        .idempotent()
        .concurrency(&limit)
        .outcome(async |_: &Attempt| {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok::<_, E>(())
        });
    let waiter = async {
        tokio::task::yield_now().await; // the holder takes the slot first
        let r = call(&short)
            .idempotent()
            .concurrency(&limit)
            .outcome(async |_: &Attempt| Ok::<_, E>(()))
            .await;
        (r, t0.elapsed())
    };
    let (held, (r, wait_ended)) = tokio::join!(holder, waiter);
    held.unwrap();
    assert_eq!(r.unwrap_err().reason(), Reason::Saturated);
    assert_eq!(wait_ended, Duration::from_millis(80));
}

#[tokio::test(start_paused = true)]
async fn a_zero_wait_refuses_at_once_and_a_free_slot_costs_no_wait() {
    let limit = Concurrency::new(1, Duration::ZERO);
    let policy = Policy::new(Duration::from_secs(1));
    let t0 = Instant::now();
    let first = call(&policy)
        .idempotent()
        .concurrency(&limit)
        .outcome(async |_: &Attempt| {
            tokio::time::sleep(Duration::from_millis(30)).await;
            Ok::<_, E>(t0.elapsed())
        });
    let second = async {
        tokio::task::yield_now().await;
        let r = call(&policy)
            .idempotent()
            .concurrency(&limit)
            .outcome(async |_: &Attempt| Ok::<_, E>(t0.elapsed()))
            .await;
        (r, t0.elapsed())
    };
    let (first, (second, refused_at)) = tokio::join!(first, second);
    assert_eq!(first.unwrap(), Duration::from_millis(30));
    assert_eq!(second.unwrap_err().reason(), Reason::Saturated);
    assert_eq!(refused_at, Duration::ZERO);
    // Free again: taken at once.
    let third = call(&policy)
        .idempotent()
        .concurrency(&limit)
        .outcome(async |_: &Attempt| Ok::<_, E>(t0.elapsed()))
        .await;
    assert_eq!(third.unwrap(), Duration::from_millis(30));
}

#[tokio::test(start_paused = true)]
async fn a_call_keeps_its_slot_through_its_retries_and_pauses() {
    // The first call fails twice (100 ms pauses) then succeeds at 200 ms;
    // the second, queued behind it, starts only then.
    let limit = Concurrency::new(1, Duration::from_secs(1));
    let policy = Policy::new(Duration::from_secs(2))
        .with_max_attempts(3)
        .with_backoff(Backoff::constant(Duration::from_millis(100)));
    let t0 = Instant::now();
    let first = call(&policy)
        .idempotent()
        .concurrency(&limit)
        .outcome(async |at: &Attempt| {
            if at.number() < 3 {
                Err(E::Refused)
            } else {
                Ok(t0.elapsed())
            }
        });
    let second = async {
        tokio::task::yield_now().await;
        call(&policy)
            .idempotent()
            .concurrency(&limit)
            .outcome(async |_: &Attempt| Ok::<_, E>(t0.elapsed()))
            .await
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!(first.unwrap(), Duration::from_millis(200));
    assert_eq!(second.unwrap(), Duration::from_millis(200));
}

#[tokio::test(start_paused = true)]
async fn the_wait_counts_against_the_deadline() {
    // Queued for 300 ms of a 500 ms deadline, a call that fails has 200 ms
    // left: its 150 ms pause fits, a second one does not.
    let limit = Concurrency::new(1, Duration::from_secs(1));
    let policy = Policy::new(Duration::from_millis(500))
        .with_max_attempts(5)
        .with_min_attempt(Duration::ZERO)
        .with_backoff(Backoff::constant(Duration::from_millis(150)));
    let t0 = Instant::now();
    let holder = call(&policy)
        .idempotent()
        .concurrency(&limit)
        .outcome(async |_: &Attempt| {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok::<_, E>(())
        });
    let failing = async {
        tokio::task::yield_now().await;
        let r = call(&policy)
            .idempotent()
            .concurrency(&limit)
            .outcome(async |_: &Attempt| Err::<(), _>(E::Refused))
            .await;
        (r, t0.elapsed())
    };
    let (held, (r, ended)) = tokio::join!(holder, failing);
    held.unwrap();
    let f = r.unwrap_err();
    assert_eq!(f.reason(), Reason::PauseExceedsDeadline);
    assert_eq!(f.attempts(), 2);
    assert_eq!(ended, Duration::from_millis(450));
    assert_eq!(f.refused_pause().unwrap().left(), Duration::from_millis(50));
}

#[test]
fn a_refused_call_is_not_executed_for_an_outer_loop() {
    let stopped = retries::Stopped::new(Reason::Saturated, 0, Duration::ZERO);
    // Not executed, and overloaded: an admission above learns from it.
    assert_eq!(stopped.classify(), Verdict::not_executed().with_overload());
    let io: std::io::Error = retries::Stopped::new(Reason::Saturated, 0, Duration::ZERO).into();
    assert_eq!(io.classify(), Verdict::not_executed().with_overload());
    let other = retries::Stopped::new(Reason::CircuitOpen, 0, Duration::ZERO);
    assert_eq!(other.classify(), Verdict::permanent());
    let status: tonic::Status = retries::Stopped::new(Reason::Saturated, 0, Duration::ZERO).into();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert_eq!(status.classify(), Verdict::not_executed().with_overload());
    assert!(Concurrency::try_new(0, Duration::ZERO).is_err());
    assert_eq!(Concurrency::new(0, Duration::ZERO).slots(), 1);
    let huge = Concurrency::new(u32::MAX, Duration::MAX);
    assert_eq!(huge.in_flight(), 0);
    assert_eq!(huge.max_wait(), Duration::MAX);
}

static LIMIT: Concurrency = Concurrency::new(2, Duration::from_millis(20));
static RAN: AtomicU32 = AtomicU32::new(0);

#[retryable(deadline = "1s", idempotent, concurrency = LIMIT)]
async fn limited(d: Duration) -> Result<(), E> {
    RAN.fetch_add(1, Ordering::Relaxed);
    tokio::time::sleep(d).await;
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn the_attribute_takes_a_limit() {
    let t0 = Instant::now();
    let (a, b, c) = tokio::join!(
        limited(Duration::from_millis(50)),
        limited(Duration::from_millis(50)),
        limited(Duration::from_millis(50))
    );
    a.unwrap();
    b.unwrap();
    // The third waited 20 ms for a slot, then was refused: `E::from(Stopped)`.
    match c.unwrap_err() {
        E::Stopped(s) => assert_eq!(s.reason(), Reason::Saturated),
        other @ E::Refused => panic!("expected a stop, got {other:?}"),
    }
    assert_eq!(RAN.load(Ordering::Relaxed), 2);
    assert_eq!(t0.elapsed(), Duration::from_millis(50));
}

struct Client {
    limit: Arc<Concurrency>,
    calls: AtomicU32,
}

#[retryable(deadline = "1s", idempotent)]
impl Client {
    #[retryable(concurrency = self.limit)]
    async fn get(&self) -> Result<u32, E> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(10)).await;
        Ok(n)
    }
}

#[tokio::test(start_paused = true)]
async fn a_method_takes_its_clients_limit() {
    let client = Client {
        limit: Arc::new(Concurrency::new(1, Duration::from_secs(1))),
        calls: AtomicU32::new(0),
    };
    let t0 = Instant::now();
    let (a, b) = tokio::join!(client.get(), client.get());
    assert_eq!((a.unwrap(), b.unwrap()), (0, 1));
    // One at a time: 10 ms each.
    assert_eq!(t0.elapsed(), Duration::from_millis(20));
}

#[tokio::test]
async fn a_shed_layer_with_hostile_settings_answers_without_panicking() {
    use tower::{Layer, Service, ServiceExt};
    // 0 slots count as 1; a pushback of `Duration::MAX` saturates.
    let layer = retries_tower::ShedLayer::new(0, Duration::MAX);
    assert_eq!(layer.limit().slots(), 1);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let rx = std::sync::Mutex::new(Some(rx));
    let inner = tower::service_fn(move |_: http::Request<()>| {
        let rx = rx.lock().unwrap().take();
        async move {
            if let Some(rx) = rx {
                let _ = rx.await; // the first request holds the slot
            }
            Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
        }
    });
    let mut svc = layer.layer(inner);
    let held = svc.ready().await.unwrap().call(http::Request::new(()));
    let grpc = http::Request::builder()
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let refused = svc.ready().await.unwrap().call(grpc).await.unwrap();
    assert_eq!(refused.headers()["grpc-status"], "8");
    assert_eq!(
        refused.headers()["grpc-retry-pushback-ms"],
        u64::MAX.to_string().as_str()
    );
    let refused = svc
        .ready()
        .await
        .unwrap()
        .call(http::Request::new(()))
        .await
        .unwrap();
    assert_eq!(refused.status(), http::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        refused.headers()["retry-after"],
        u64::MAX.to_string().as_str()
    );
    tx.send(()).unwrap();
    assert_eq!(held.await.unwrap().status(), http::StatusCode::OK);
    assert_eq!(layer.limit().in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn every_way_a_call_ends_gives_its_slot_back() {
    let limit = Concurrency::new(1, Duration::from_millis(10));
    let policy = Policy::new(Duration::from_secs(1))
        .with_backoff(Backoff::constant(Duration::from_millis(100)));

    // Dropped while its body runs.
    let mut running = Box::pin(call(&policy).idempotent().concurrency(&limit).run(
        async |_: &Attempt| {
            std::future::pending::<()>().await;
            Ok::<_, E>(())
        },
    ));
    assert!(futures_poll_once(running.as_mut()).await.is_none());
    assert_eq!(limit.in_flight(), 1);
    drop(running);
    assert_eq!(limit.in_flight(), 0, "dropped during an attempt");

    // Dropped during a pause.
    let mut pausing = Box::pin(
        call(&policy)
            .idempotent()
            .concurrency(&limit)
            .run(async |_: &Attempt| Err::<(), _>(E::Refused)),
    );
    assert!(futures_poll_once(pausing.as_mut()).await.is_none());
    assert_eq!(limit.in_flight(), 1);
    drop(pausing);
    assert_eq!(limit.in_flight(), 0, "dropped during a pause");

    // Stopped (exhausted after its pauses) and succeeded.
    let stopped = call(&policy.with_max_attempts(2))
        .idempotent()
        .concurrency(&limit)
        .outcome(async |_: &Attempt| Err::<(), _>(E::Refused))
        .await;
    assert_eq!(stopped.unwrap_err().reason(), Reason::Exhausted);
    assert_eq!(limit.in_flight(), 0, "stopped");
    let ok: Result<u32, E> = call(&policy)
        .idempotent()
        .concurrency(&limit)
        .run(async |_: &Attempt| Ok(7))
        .await;
    assert_eq!(ok.unwrap(), 7);
    assert_eq!(limit.in_flight(), 0, "succeeded");
}

/// Poll `f` once: `Some` if it completed.
async fn futures_poll_once<F: std::future::Future + Unpin>(mut f: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut f).poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

/// Many threads, a small limit, calls that succeed, fail, stop and are
/// cancelled half-way: never more bodies running than slots, and every slot
/// given back at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slots_hold_under_contention_and_all_come_back() {
    static LIMIT: Concurrency = Concurrency::new(3, Duration::from_secs(5));
    static RUNNING: AtomicU32 = AtomicU32::new(0);
    static MAX: AtomicU32 = AtomicU32::new(0);
    let policy = Policy::new(Duration::from_secs(10)).with_backoff(Backoff::NONE);
    let mut tasks = Vec::new();
    for t in 0..16_u32 {
        tasks.push(tokio::spawn(async move {
            for i in 0..200_u32 {
                let call = call(&policy)
                    .idempotent()
                    .budget(retries::NoBudget)
                    .concurrency(&LIMIT)
                    .outcome(async move |at: &Attempt| {
                        // Counted out on drop too: a cancelled body never
                        // reaches its end.
                        struct Running;
                        impl Drop for Running {
                            fn drop(&mut self) {
                                RUNNING.fetch_sub(1, Ordering::SeqCst);
                            }
                        }
                        let now = RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
                        let running = Running;
                        MAX.fetch_max(now, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        drop(running);
                        if (t + i + at.number()).is_multiple_of(3) {
                            Err(E::Refused)
                        } else {
                            Ok(())
                        }
                    });
                if i.is_multiple_of(7) {
                    // Cancelled after its first poll, whatever it was doing.
                    let mut call = Box::pin(call);
                    let _ = futures_poll_once(call.as_mut()).await;
                } else {
                    let _ = call.await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(MAX.load(Ordering::SeqCst) <= 3, "at most 3 bodies at once");
    assert!(MAX.load(Ordering::SeqCst) >= 2, "the calls did overlap");
    assert_eq!(RUNNING.load(Ordering::SeqCst), 0);
    assert_eq!(LIMIT.in_flight(), 0, "every slot given back");
}

/// The adaptive kind (`Concurrency::adaptive`, issue 63 item 3) through
/// `retries::call`, on the paused clock, against a service of capacity 8:
/// it works on 8 attempts at a time, 10 ms each, and queues the rest. 32
/// callers call without pause for 3 s: the limit finds the capacity
/// (within 20 %) and holds it; then the service refuses as overloaded, and
/// the limit is cut at once.
#[tokio::test(start_paused = true)]
async fn the_adaptive_kind_finds_the_capacity_and_is_cut_by_an_overload() {
    #[derive(Debug, thiserror::Error, Classify)]
    enum Busy {
        #[error("overloaded")]
        #[classify(overloaded)]
        Overloaded,
        #[error(transparent)]
        #[classify(transparent)]
        Stopped(#[from] retries::Stopped),
    }
    let limit = Rc::new(Concurrency::adaptive(2, 64, Duration::from_secs(1)));
    assert_eq!(limit.slots(), 4);
    let server = Rc::new(tokio::sync::Semaphore::new(8));
    let refusing = Rc::new(Cell::new(false));
    let policy = Policy::new(Duration::from_secs(2)).with_max_attempts(1);
    let t0 = Instant::now();
    let run = Duration::from_secs(3);
    let callers = (0..32).map(|_| {
        let (limit, server, refusing) = (limit.clone(), server.clone(), refusing.clone());
        async move {
            while t0.elapsed() < run {
                let r: Result<(), Busy> = call(&policy)
                    .idempotent()
                    .concurrency(&limit)
                    .run(async |_: &Attempt| {
                        if refusing.get() {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            return Err(Busy::Overloaded);
                        }
                        let _working = server.acquire().await.unwrap();
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        Ok(())
                    })
                    .await;
                if refusing.get() {
                    let _ = r;
                    break;
                }
            }
        }
    });
    let watch = async {
        let mut seen = Vec::new();
        while t0.elapsed() < run {
            tokio::time::sleep(Duration::from_millis(100)).await;
            seen.push(limit.slots());
        }
        seen
    };
    let (seen, ()) = tokio::join!(watch, async {
        futures_util::future::join_all(callers).await;
    });
    // Settled within the first second, and held there.
    let settled = &seen[10..];
    assert!(
        settled.iter().all(|&n| (7..=9).contains(&n)),
        "the limit over time: {seen:?}"
    );
    // The service refuses as overloaded: the next refusal (a round trip
    // after the last cut) cuts the limit to four fifths at once.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = limit.slots();
    refusing.set(true);
    let r: Result<(), Busy> = call(&policy)
        .idempotent()
        .concurrency(&limit)
        .run(async |_: &Attempt| Err(Busy::Overloaded))
        .await;
    assert!(r.is_err());
    // (The limit is fractional: four fifths of 7.6 is 6.)
    let after = limit.slots();
    assert!(
        after < before && after >= before * 4 / 5,
        "{before} to {after}"
    );
}
