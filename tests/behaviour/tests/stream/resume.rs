//! Resumed streams (`retries::stream`) on the paused clock, against an
//! in-memory source driven by fault scripts: every item once and in order,
//! reopened from the last delivered cursor, repeats skipped, a rewind an
//! error; the pauses, the idle limit, `attempt_timeout`, the whole-stream
//! deadline, the budget, the breaker, classification and metrics, with exact
//! counts and times. The same over real gRPC and HTTP streams is in
//! `stream_http.rs` and in `examples/payments/tests/stream.rs`.

use crate::scoped;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use proptest::prelude::*;
use retries::stream::{Counts, Error};
use retries::{Backoff, CircuitBreaker, Classify, NoBudget, Policy, Reason, TokenBucket};
use tokio::time::Instant;

// `call(&policy)`: `retries::call` under this file's own name.
crate::common::named_call!();

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error("reset")]
    #[classify(unknown)]
    Reset,
    #[error("gone")]
    #[classify(permanent)]
    Gone,
}

/// How one connection behaves.
#[derive(Debug, Clone)]
struct Conn {
    /// `open` fails with this error instead.
    refuse: Option<E>,
    /// Items at or before the cursor sent again first.
    replay: u64,
    /// New items sent, each after `gap`.
    items: u64,
    gap: Duration,
    /// After them: an error, or silence (`None`) if the log is not finished.
    then: Option<E>,
}

impl Conn {
    fn new(items: u64) -> Self {
        Self {
            refuse: None,
            replay: 0,
            items,
            gap: Duration::ZERO,
            then: Some(E::Reset),
        }
    }
    fn refused(e: E) -> Self {
        Self {
            refuse: Some(e),
            ..Self::new(0)
        }
    }
}

/// An event log `0..len` served by scripted connections (the last one is
/// reused when the script runs out); records every `open`'s cursor.
#[derive(Clone)]
struct Source {
    len: u64,
    script: Rc<RefCell<Vec<Conn>>>,
    opens: Rc<RefCell<Vec<Option<u64>>>>,
}

impl Source {
    fn new(len: u64, script: Vec<Conn>) -> Self {
        Self {
            len,
            script: Rc::new(RefCell::new(script)),
            opens: Rc::default(),
        }
    }

    fn opens(&self) -> Vec<Option<u64>> {
        self.opens.borrow().clone()
    }

    fn open(
        &self,
        from: Option<u64>,
    ) -> impl Future<
        Output = Result<futures_util::stream::LocalBoxStream<'static, Result<u64, E>>, E>,
    > + use<> {
        self.opens.borrow_mut().push(from);
        let conn = {
            let mut script = self.script.borrow_mut();
            if script.len() > 1 {
                script.remove(0)
            } else {
                script[0].clone()
            }
        };
        let len = self.len;
        async move {
            if let Some(e) = conn.refuse {
                return Err(e);
            }
            let next = from.map_or(0, |c| c + 1);
            let first = next.saturating_sub(conn.replay);
            let end = (next + conn.items).min(len);
            let items = (first..end).map(Ok);
            let tail: Option<Result<u64, E>> = if end == len {
                None
            } else {
                conn.then.clone().map(Err)
            };
            let silent = end < len && conn.then.is_none();
            let gap = conn.gap;
            let s = futures_util::stream::iter(items.chain(tail))
                .then(move |i| async move {
                    tokio::time::sleep(gap).await;
                    i
                })
                .chain(
                    futures_util::stream::iter(silent.then_some(())).filter_map(|()| async {
                        std::future::pending::<()>().await;
                        None
                    }),
                );
            Ok(s.boxed_local())
        }
    }
}

/// Collect a resumed stream: the items, then the error it ended with.
async fn drain<S>(s: S) -> (Vec<u64>, Option<Error<E, u64>>)
where
    S: futures_util::Stream<Item = Result<u64, Error<E, u64>>>,
{
    let mut s = std::pin::pin!(s);
    let mut got = Vec::new();
    while let Some(r) = s.next().await {
        match r {
            Ok(i) => got.push(i),
            Err(e) => {
                assert!(s.next().await.is_none(), "an error ends the stream");
                return (got, Some(e));
            }
        }
    }
    (got, None)
}

fn policy() -> Policy {
    Policy::new(Duration::from_secs(10))
        .with_max_attempts(4)
        .with_backoff(Backoff::constant(Duration::from_millis(100)))
}

#[tokio::test(start_paused = true)]
async fn reopens_from_the_last_delivered_cursor_and_skips_repeats() {
    let source = Source::new(
        10,
        vec![
            Conn::new(3),
            Conn {
                replay: 2,
                ..Conn::new(4)
            },
            Conn {
                replay: 1,
                ..Conn::new(100)
            },
        ],
    );
    let policy = policy();
    let s = call(&policy)
        .idempotent()
        .budget(NoBudget)
        .resume(|from| source.open(from), |i: &u64| *i);
    let mut s = std::pin::pin!(s);
    let mut got = Vec::new();
    while let Some(r) = s.next().await {
        got.push(r.unwrap());
    }
    assert_eq!(got, (0..10).collect::<Vec<_>>());
    assert_eq!(source.opens(), vec![None, Some(2), Some(6)]);
    assert_eq!(
        s.counts(),
        Counts {
            delivered: 10,
            skipped: 3,
            reopens: 2
        }
    );
    assert_eq!(s.cursor(), Some(&9));
}

#[tokio::test(start_paused = true)]
async fn pauses_follow_the_policy_and_restart_after_progress() {
    // Refused twice (pauses of 100 and 200 ms), then 2 items and a reset:
    // the backoff starts again at 100 ms for the next call.
    let source = Source::new(
        4,
        vec![
            Conn::refused(E::Refused),
            Conn::refused(E::Refused),
            Conn::new(2),
            Conn::new(10),
        ],
    );
    let policy = Policy::new(Duration::from_secs(10))
        .with_max_attempts(4)
        .with_backoff(Backoff::linear(
            Duration::from_millis(100),
            Duration::from_millis(100),
            Duration::from_secs(1),
        ));
    let t0 = Instant::now();
    let times = RefCell::new(Vec::new());
    let s = call(&policy).idempotent().budget(NoBudget).resume(
        |from| {
            times.borrow_mut().push(t0.elapsed());
            source.open(from)
        },
        |i: &u64| *i,
    );
    let (got, err) = drain(s).await;
    assert!(err.is_none());
    assert_eq!(got, vec![0, 1, 2, 3]);
    assert_eq!(
        *times.borrow(),
        vec![
            Duration::ZERO,
            Duration::from_millis(100),
            Duration::from_millis(300),
            Duration::from_millis(400)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn progress_is_never_stopped_by_the_attempt_limit() {
    // 20 connections of one item each, with max_attempts 2: every failure
    // is the first attempt of a new call, so the stream never runs out.
    let source = Source::new(20, vec![Conn::new(1)]);
    let policy = Policy::new(Duration::from_secs(1))
        .with_max_attempts(2)
        .with_backoff(Backoff::constant(Duration::from_millis(10)));
    let s = call(&policy)
        .idempotent()
        .budget(NoBudget)
        .resume(|from| source.open(from), |i: &u64| *i);
    let t0 = Instant::now();
    let (got, err) = drain(s).await;
    assert!(err.is_none());
    assert_eq!(got, (0..20).collect::<Vec<_>>());
    assert_eq!(source.opens().len(), 20);
    assert_eq!(t0.elapsed(), Duration::from_millis(190));
}

#[tokio::test(start_paused = true)]
async fn attempts_without_a_new_item_are_exhausted() {
    // One item, then every reopen is refused: 1 + 3 reopens, then Exhausted.
    let source = Source::new(10, vec![Conn::new(1), Conn::refused(E::Refused)]);
    let policy = policy();
    let s = call(&policy)
        .idempotent()
        .budget(NoBudget)
        .resume(|from| source.open(from), |i: &u64| *i);
    let (got, err) = drain(s).await;
    assert_eq!(got, vec![0]);
    let Some(Error::Stopped(f)) = err else {
        panic!("{err:?}")
    };
    assert_eq!(f.reason(), Reason::Exhausted);
    assert_eq!(f.attempts(), 4, "the broken connection and 3 reopens");
    assert_eq!(f.last_error(), Some(&E::Refused));
    assert_eq!(source.opens(), vec![None, Some(0), Some(0), Some(0)]);
}

#[tokio::test(start_paused = true)]
async fn a_permanent_error_ends_the_stream_with_it() {
    let source = Source::new(
        10,
        vec![Conn {
            then: Some(E::Gone),
            ..Conn::new(3)
        }],
    );
    let policy = policy();
    let s = call(&policy)
        .idempotent()
        .resume(|from| source.open(from), |i: &u64| *i);
    let (got, err) = drain(s).await;
    assert_eq!(got, vec![0, 1, 2]);
    let f = err.as_ref().and_then(Error::failure).unwrap();
    assert_eq!(f.reason(), Reason::Permanent);
    assert_eq!(f.last_error(), Some(&E::Gone));
    assert_eq!(source.opens().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_silent_connection_is_cut_off_at_the_idle_limit() {
    // Three items 10 ms apart, then silence: cut off 500 ms after the third,
    // reopened at once (an unknown outcome of an idempotent read, zero
    // backoff), and the rest follows.
    let source = Source::new(
        6,
        vec![
            Conn {
                then: None,
                gap: Duration::from_millis(10),
                ..Conn::new(3)
            },
            Conn::new(100),
        ],
    );
    let policy =
        Policy::new(Duration::from_secs(10)).with_backoff(Backoff::constant(Duration::ZERO));
    let t0 = Instant::now();
    let times = RefCell::new(Vec::new());
    let s = call(&policy)
        .idempotent()
        .budget(NoBudget)
        .resume(
            |from| {
                times.borrow_mut().push(t0.elapsed());
                source.open(from)
            },
            |i: &u64| *i,
        )
        .idle(Duration::from_millis(500));
    let (got, err) = drain(s).await;
    assert!(err.is_none());
    assert_eq!(got, (0..6).collect::<Vec<_>>());
    assert_eq!(
        *times.borrow(),
        vec![Duration::ZERO, Duration::from_millis(530)]
    );
}

#[tokio::test(start_paused = true)]
async fn attempt_timeout_bounds_the_open_and_the_first_item() {
    // The first connection sends its first item after 300 ms, past the
    // 200 ms attempt timeout: cut off, reopened after 100 ms.
    let source = Source::new(
        3,
        vec![
            Conn {
                gap: Duration::from_millis(300),
                ..Conn::new(3)
            },
            Conn::new(3),
        ],
    );
    let policy = policy().with_attempt_timeout(Duration::from_millis(200));
    let t0 = Instant::now();
    let times = RefCell::new(Vec::new());
    let s = call(&policy).idempotent().budget(NoBudget).resume(
        |from| {
            times.borrow_mut().push(t0.elapsed());
            source.open(from)
        },
        |i: &u64| *i,
    );
    let (got, err) = drain(s).await;
    assert!(err.is_none());
    assert_eq!(got, vec![0, 1, 2]);
    assert_eq!(
        *times.borrow(),
        vec![Duration::ZERO, Duration::from_millis(300)]
    );
}

#[tokio::test(start_paused = true)]
async fn the_whole_stream_deadline_ends_it() {
    // One item every 150 ms (the log is long): the 1 s deadline ends the
    // stream after the six items that came before it.
    let source = Source::new(
        1000,
        vec![Conn {
            gap: Duration::from_millis(150),
            ..Conn::new(1000)
        }],
    );
    let policy = policy();
    let t0 = Instant::now();
    let s = call(&policy)
        .idempotent()
        .resume(|from| source.open(from), |i: &u64| *i)
        .deadline(Duration::from_secs(1));
    let (got, err) = drain(s).await;
    assert_eq!(got, (0..6).collect::<Vec<_>>());
    assert_eq!(
        err.as_ref().and_then(Error::failure).unwrap().reason(),
        Reason::DeadlineExceeded
    );
    assert_eq!(t0.elapsed(), Duration::from_secs(1));
    assert_eq!(source.opens().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_budget_stops_a_stream_that_keeps_failing() {
    // A bucket of 3 tokens allows retries above half: two failed opens
    // leave 1 token, and the second retry is refused.
    let budget = TokenBucket::new(3, 0.1);
    let source = Source::new(10, vec![Conn::refused(E::Refused)]);
    let policy = Policy::new(Duration::from_secs(10)).with_max_attempts(10);
    let s = call(&policy)
        .idempotent()
        .budget(&budget)
        .resume(|from| source.open(from), |i: &u64| *i);
    let (got, err) = drain(s).await;
    assert!(got.is_empty());
    let f = err.as_ref().and_then(Error::failure).unwrap();
    assert_eq!(f.reason(), Reason::BudgetExhausted);
    assert_eq!(f.attempts(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_breaker_counts_connections_that_deliver_nothing() {
    let breaker = CircuitBreaker::new(3, Duration::from_secs(30));
    let source = Source::new(10, vec![Conn::refused(E::Refused)]);
    let policy = Policy::new(Duration::from_secs(10)).with_max_attempts(10);
    let s = call(&policy)
        .idempotent()
        .budget(NoBudget)
        .breaker(&breaker)
        .resume(|from| source.open(from), |i: &u64| *i);
    let (_, err) = drain(s).await;
    let f = err.as_ref().and_then(Error::failure).unwrap();
    assert_eq!(f.reason(), Reason::CircuitOpen);
    assert_eq!(source.opens().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_goes_back_is_an_error() {
    // Delivers 0, 1, 2, then sends 1 again on the same connection.
    let opened = Rc::new(RefCell::new(0));
    let policy = policy();
    let s = call(&policy).idempotent().resume(
        |_from: Option<u64>| {
            *opened.borrow_mut() += 1;
            async { Ok::<_, E>(futures_util::stream::iter([0u64, 1, 2, 1, 3].map(Ok))) }
        },
        |i: &u64| *i,
    );
    let (got, err) = drain(s).await;
    assert_eq!(got, vec![0, 1, 2]);
    assert!(
        matches!(err, Some(Error::Rewound { last: 2, got: 1 })),
        "{err:?}"
    );
    assert_eq!(*opened.borrow(), 1);
}

#[tokio::test(start_paused = true)]
async fn starts_after_a_saved_cursor() {
    let source = Source::new(
        6,
        vec![Conn {
            replay: 2,
            ..Conn::new(100)
        }],
    );
    let policy = policy();
    let s = call(&policy)
        .idempotent()
        .resume(|from| source.open(from), |i: &u64| *i)
        .after(2);
    let (got, err) = drain(s).await;
    assert!(err.is_none());
    assert_eq!(got, vec![3, 4, 5]);
    assert_eq!(source.opens(), vec![Some(2)]);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_stream_drops_the_connection() {
    struct Guard(Rc<RefCell<bool>>);
    impl Drop for Guard {
        fn drop(&mut self) {
            *self.0.borrow_mut() = true;
        }
    }
    let dropped = Rc::new(RefCell::new(false));
    let policy = policy();
    let d = Rc::clone(&dropped);
    let s = call(&policy).idempotent().resume(
        move |_from: Option<u64>| {
            let guard = Guard(Rc::clone(&d));
            async move {
                Ok::<_, E>(
                    futures_util::stream::iter([Ok(0u64)])
                        .chain(futures_util::stream::pending())
                        .map(move |i| {
                            let _ = &guard;
                            i
                        }),
                )
            }
        },
        |i: &u64| *i,
    );
    let mut s = Box::pin(s);
    assert_eq!(s.next().await.unwrap().unwrap(), 0);
    assert!(!*dropped.borrow());
    drop(s);
    assert!(*dropped.borrow());
}

#[test]
fn reopens_skips_and_deliveries_are_counted_in_metrics() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    static EVENTS: retries::observe::Name = retries::observe::Name::new("events");
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let source = Source::new(
                5,
                vec![
                    Conn::new(2),
                    Conn {
                        replay: 1,
                        ..Conn::new(100)
                    },
                ],
            );
            let policy = policy();
            let s = call(&policy)
                .name(&EVENTS)
                .idempotent()
                .resume(|from| source.open(from), |i: &u64| *i);
            let (got, _) = drain(s).await;
            assert_eq!(got.len(), 5);
        });
    });
    let snapshot = snapshotter.snapshot().into_vec();
    let counter = |name: &str| {
        snapshot
            .iter()
            .find(|(k, _, _, _)| k.key().name() == name)
            .map_or(0, |(_, _, _, v)| match v {
                DebugValue::Counter(n) => *n,
                other => panic!("{other:?}"),
            })
    };
    assert_eq!(counter("retry.stream.delivered"), 5);
    assert_eq!(counter("retry.stream.skipped"), 1);
    assert_eq!(counter("retry.stream.reopened"), 1);
}

/// One random connection: maybe refused (not executed), else a few repeats,
/// 1 to 4 new items, then a reset, a refusal-like reset or silence.
fn conn() -> impl Strategy<Value = Conn> {
    (0u8..10, 0u64..3, 1u64..5, 0u64..30, 0u8..3).prop_map(|(refuse, replay, items, gap, then)| {
        Conn {
            refuse: (refuse == 0).then_some(E::Refused),
            replay,
            items,
            gap: Duration::from_millis(gap),
            then: match then {
                0 => None,
                1 => Some(E::Refused),
                _ => Some(E::Reset),
            },
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Over random fault scripts: exactly `0..N` in order, no duplicates,
    /// no gaps; one open per scripted connection used; every reopen from the
    /// last delivered cursor; skipped = repeats sent before a new item.
    #[test]
    fn every_item_exactly_once_over_random_fault_scripts(
        len in 1u64..60,
        script in prop::collection::vec(conn(), 1..40),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        // Never more than two refusals in a row, so `max_attempts = 4` holds.
        let mut script = script;
        let mut run = 0;
        for c in &mut script {
            if c.refuse.is_some() { run += 1; if run > 2 { c.refuse = None; run = 0; } } else { run = 0; }
        }
        script.push(Conn::new(1000)); // the log always completes eventually
        let source = Source::new(len, script);
        let policy = Policy::new(Duration::from_secs(10))
            .with_max_attempts(4)
            .with_backoff(Backoff::constant(Duration::from_millis(5)));
        let (got, err, counts) = rt.block_on(async {
            let s = call(&policy)
                .idempotent()
                .budget(NoBudget)
                .resume(|from| source.open(from), |i: &u64| *i)
                .idle(Duration::from_millis(100));
            let mut s = std::pin::pin!(s);
            let mut got = Vec::new();
            let mut err = None;
            while let Some(r) = s.next().await {
                match r { Ok(i) => got.push(i), Err(e) => { err = Some(e); break; } }
            }
            (got, err, s.counts())
        });
        prop_assert!(err.is_none(), "{:?}", err);
        prop_assert_eq!(&got, &(0..len).collect::<Vec<_>>());
        prop_assert_eq!(counts.delivered, len);
        let opens = source.opens();
        prop_assert_eq!(counts.reopens as usize, opens.len() - 1);
        // Each open's cursor is the last item delivered before it.
        for w in opens.windows(2) {
            prop_assert!(w[0] <= w[1], "cursors never go back: {:?}", opens);
        }
        prop_assert_eq!(opens[0], None);
    }
}

/// A stream made inside an attempt of another call (a retried function that
/// returns it) is not part of that call: it reopens under its own policy,
/// not as a nested call deferring to the loop around it (it made a single
/// connection and stopped), and is not cut off at that attempt's deadline
/// (it is read long after the attempt ended).
#[tokio::test(start_paused = true)]
async fn a_stream_made_inside_an_attempt_keeps_its_own_policy() {
    let source = Source::new(
        6,
        vec![
            Conn::new(0),
            Conn {
                gap: Duration::from_millis(400),
                ..Conn::new(2)
            },
        ],
    );
    let outer = Policy::new(Duration::from_secs(1));
    let inner = policy();
    let made = call(&outer)
        .idempotent()
        .outcome(async |_: &retries::Attempt| {
            Ok::<_, E>(
                call(&inner)
                    .idempotent()
                    .budget(NoBudget)
                    .resume(|from| source.open(from), |i: &u64| *i),
            )
        })
        .await;
    let Ok(stream) = made else {
        panic!("the outer call failed")
    };
    let t0 = Instant::now();
    let (got, err) = drain(stream).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(got, [0, 1, 2, 3, 4, 5]);
    // Opens: the one that failed at once, then a reopen after each pair.
    assert_eq!(source.opens(), [None, None, Some(1), Some(3)]);
    // A 100 ms pause, then connections sending two items and a reset 400 ms
    // apart (1.2 s each, the last one ends after its two items), a 100 ms
    // pause before each reopen: far past the outer call's second.
    assert_eq!(
        t0.elapsed(),
        Duration::from_millis(100 + 1200 + 100 + 1200 + 100 + 800)
    );
}

/// The events a resumed stream emits, as (level, message) pairs.
fn stream_events(source: &Source, policy: &Policy) -> Vec<(tracing::Level, String)> {
    use tracing_subscriber::layer::SubscriberExt;
    struct Events(Arc<std::sync::Mutex<Vec<(tracing::Level, String)>>>);
    struct Message(String);
    impl tracing::field::Visit for Message {
        fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
            if f.name() == "message" {
                self.0 = format!("{v:?}");
            }
        }
    }
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Events {
        fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            if e.metadata().target() == "retries" {
                let mut m = Message(String::new());
                e.record(&mut m);
                self.0.lock().unwrap().push((*e.metadata().level(), m.0));
            }
        }
    }
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(Events(Arc::clone(&seen)));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    scoped::with_scoped(subscriber, || {
        rt.block_on(async {
            let s = call(policy)
                .idempotent()
                .budget(NoBudget)
                .resume(|from| source.open(from), |i: &u64| *i);
            let (_, err) = drain(s).await;
            assert!(err.is_none());
        });
    });
    let mut events = seen.lock().unwrap();
    std::mem::take(&mut *events)
}

#[test]
fn a_healthy_stream_logs_nothing_above_debug_and_reopens_are_debug_events() {
    let healthy = stream_events(&Source::new(5, vec![Conn::new(100)]), &policy());
    assert!(
        healthy.iter().all(|(l, _)| *l >= tracing::Level::DEBUG),
        "{healthy:?}"
    );
    assert!(
        healthy.iter().any(|(_, m)| m == "stream ended"),
        "{healthy:?}"
    );
    assert!(!healthy.iter().any(|(_, m)| m == "stream reopened"));

    let flaky = stream_events(
        &Source::new(
            5,
            vec![
                Conn::new(2),
                Conn {
                    replay: 1,
                    ..Conn::new(100)
                },
            ],
        ),
        &policy(),
    );
    let reopened: Vec<_> = flaky
        .iter()
        .filter(|(_, m)| m == "stream reopened")
        .collect();
    assert_eq!(reopened.len(), 1, "{flaky:?}");
    assert_eq!(reopened[0].0, tracing::Level::DEBUG);
    assert_eq!(flaky.iter().filter(|(_, m)| m == "item skipped").count(), 1);
    assert!(
        flaky.iter().all(|(l, _)| *l >= tracing::Level::DEBUG),
        "nothing above DEBUG: {flaky:?}"
    );
}

/// A stream whose whole-stream deadline leaves no time opens no
/// connection: its first item is the stop, `DeadlineExceeded` with 0
/// attempts. (A stream is not bound by the scope it is made in, whose
/// call it usually outlives: see the module docs.)
#[tokio::test(start_paused = true)]
async fn no_connection_without_time_left() {
    let source = Source::new(4, vec![Conn::new(10)]);
    let policy = policy();
    let s = call(&policy)
        .idempotent()
        .budget(NoBudget)
        .resume(|from| source.open(from), |i: &u64| *i)
        .deadline(Duration::ZERO);
    let mut s = std::pin::pin!(s);
    let err = s.next().await.expect("an item").expect_err("the stop");
    let failure = err.failure().expect("a stopped call");
    assert_eq!(failure.reason(), Reason::DeadlineExceeded);
    assert_eq!(failure.attempts(), 0);
    assert!(source.opens().is_empty(), "{:?}", source.opens());
}
