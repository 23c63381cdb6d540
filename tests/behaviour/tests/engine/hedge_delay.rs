//! A hedge delay learned from latency ([`LearnedDelay`]) against fixed
//! delays and tower's `hedge` (its 95th percentile, from a rotating
//! histogram), on the paused clock: each copy's latency is drawn (seeded) as
//! 1 s with probability 5 %, else the fast latency; 2,000 calls one after
//! another, at most 2 copies each, no budget (so what is measured is the
//! delay alone). The table `tests/bench/README.md` shows is this test's
//! output (`cargo test -p retries-tests --test behaviour hedge_delay --
//! --nocapture`); each figure it claims is pinned here.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use retries::{Attempt, Hedging, LearnedDelay, NoBudget, Policy};

const CALLS: usize = 2000;
const SLOW: Duration = Duration::from_secs(1);

/// Copy latencies: [`SLOW`] for 5 % of the draws, else `fast`.
struct Latencies {
    state: Mutex<u64>,
    fast: Duration,
}

impl Latencies {
    fn next(&self) -> Duration {
        let mut s = self.state.lock().unwrap();
        *s = s
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        if (*s >> 33) % 100 < 5 {
            SLOW
        } else {
            self.fast
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Figures {
    p50: Duration,
    p99: Duration,
    copies_per_call: f64,
}

async fn run(hedging: Option<Hedging>, fast: Duration) -> Figures {
    let latencies = Latencies {
        state: Mutex::new(0x00c0_ffee),
        fast,
    };
    let copies = AtomicUsize::new(0);
    let policy = Policy::new(Duration::from_secs(5)).with_max_attempts(1);
    let mut took = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let t0 = tokio::time::Instant::now();
        let op = |_: &Attempt| {
            copies.fetch_add(1, Ordering::Relaxed);
            let d = latencies.next();
            async move {
                tokio::time::sleep(d).await;
                Ok::<_, std::io::Error>(())
            }
        };
        let spec = retries::call(&policy).idempotent().budget(NoBudget);
        match hedging {
            Some(h) => spec.run_hedged(h, op).await,
            None => spec.run_fn(op).await,
        }
        .unwrap();
        took.push(t0.elapsed());
    }
    figures(took, copies.load(Ordering::Relaxed))
}

/// The same calls through tower's `hedge`: a second request after the
/// latency percentile (its quantile 0.95, from at least 64 data points, over a rotating
/// histogram of 30 s periods), no budget either.
async fn run_tower(fast: Duration) -> Figures {
    use tower::{Service, ServiceExt};

    #[derive(Clone)]
    struct Always;
    impl tower::hedge::Policy<()> for Always {
        fn clone_request(&self, (): &()) -> Option<()> {
            Some(())
        }
        fn can_retry(&self, (): &()) -> bool {
            true
        }
    }

    let latencies = Arc::new(Latencies {
        state: Mutex::new(0x00c0_ffee),
        fast,
    });
    let copies = Arc::new(AtomicUsize::new(0));
    let (l, c) = (Arc::clone(&latencies), Arc::clone(&copies));
    let service = tower::service_fn(move |()| {
        c.fetch_add(1, Ordering::Relaxed);
        let d = l.next();
        async move {
            tokio::time::sleep(d).await;
            Ok::<_, tower::BoxError>(())
        }
    });
    let mut hedge = tower::hedge::Hedge::new(service, Always, 64, 0.95, Duration::from_secs(30));
    let mut took = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let t0 = tokio::time::Instant::now();
        hedge.ready().await.unwrap().call(()).await.unwrap();
        took.push(t0.elapsed());
    }
    figures(took, copies.load(Ordering::Relaxed))
}

/// One latency distribution's figures, each way.
#[derive(Clone, Copy)]
struct Row {
    fast: Duration,
    none: Figures,
    fixed_10: Figures,
    fixed_500: Figures,
    learned: Figures,
    delay: Duration,
    tower: Figures,
}

/// The figures of `CALLS` calls that took `took` and sent `copies`.
fn figures(mut took: Vec<Duration>, copies: usize) -> Figures {
    took.sort_unstable();
    #[allow(clippy::cast_precision_loss)]
    let copies_per_call = copies as f64 / CALLS as f64;
    Figures {
        p50: took[CALLS / 2],
        p99: took[CALLS * 99 / 100],
        copies_per_call,
    }
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

static LEARNED_10: LearnedDelay =
    LearnedDelay::new(0.05, Duration::from_millis(1), Duration::from_secs(1));
static LEARNED_50: LearnedDelay =
    LearnedDelay::new(0.05, Duration::from_millis(1), Duration::from_secs(1));

#[tokio::test(start_paused = true)]
async fn a_learned_delay_keeps_the_extra_load_near_its_cap_where_a_fixed_one_cannot() {
    let mut rows = Vec::new();
    for (fast, learned) in [(10, &LEARNED_10), (50, &LEARNED_50)] {
        let fast = Duration::from_millis(fast);
        let none = run(None, fast).await;
        let fixed_10 = run(Some(Hedging::new(2, Duration::from_millis(10))), fast).await;
        let fixed_500 = run(Some(Hedging::new(2, Duration::from_millis(500))), fast).await;
        let learned_run = run(Some(Hedging::learned(2, learned)), fast).await;
        let tower = run_tower(fast).await;
        rows.push(Row {
            fast,
            none,
            fixed_10,
            fixed_500,
            learned: learned_run,
            delay: learned.current(),
            tower,
        });
    }
    eprintln!(
        "| copies: 95 % at | no hedging: p99, copies per call | fixed 10 ms | fixed 500 ms | learned, 5 % cap | delay learned | tower's `hedge`, p95 |"
    );
    eprintln!("|---|---|---|---|---|---|---|");
    for r in &rows {
        let cell = |f: &Figures| format!("{} ms, {:.3}", ms(f.p99), f.copies_per_call);
        eprintln!(
            "| {} ms (5 % at 1 s) | {} | {} | {} | {} | {} ms | {} |",
            ms(r.fast),
            cell(&r.none),
            cell(&r.fixed_10),
            cell(&r.fixed_500),
            cell(&r.learned),
            ms(r.delay),
            cell(&r.tower)
        );
    }

    let Row {
        none,
        fixed_10: f10,
        fixed_500: f500,
        learned,
        delay,
        ..
    } = rows[0];
    // 95 % at 10 ms: the 95th percentile is the fast latency, so the
    // learned delay is about 10 ms and behaves as the best fixed one.
    assert_eq!(none.p99, SLOW);
    assert!(delay <= Duration::from_millis(20), "{delay:?}");
    assert!(learned.p99 <= Duration::from_millis(20), "{learned:?}");
    assert!(learned.copies_per_call <= 1.07, "{learned:?}");
    assert!(f10.p99 <= Duration::from_millis(20), "{f10:?}");
    assert!(f500.p99 >= Duration::from_millis(500), "{f500:?}");
    assert!(none.p50 == Duration::from_millis(10) && learned.p50 == Duration::from_millis(10));

    let Row {
        none,
        fixed_10: f10,
        fixed_500: f500,
        learned,
        delay,
        ..
    } = rows[1];
    // 95 % at 50 ms: a fixed 10 ms sends a second copy for every call
    // (twice the load); the learned delay moved to the fast latency and
    // keeps the extra load near 5 %, at the p99 of a delay fixed at the
    // fast latency (one fast copy after it).
    assert_eq!(none.p99, SLOW);
    assert!(f10.copies_per_call >= 1.9, "{f10:?}");
    assert!(
        delay >= Duration::from_millis(50) && delay <= Duration::from_millis(100),
        "{delay:?}"
    );
    assert!(learned.copies_per_call <= 1.07, "{learned:?}");
    assert!(learned.p99 <= Duration::from_millis(100), "{learned:?}");
    assert!(f500.p99 >= Duration::from_millis(550), "{f500:?}");
}

#[test]
fn an_unlearned_delay_is_the_ceiling_and_the_bounds_hold() {
    static FRESH: LearnedDelay =
        LearnedDelay::new(0.05, Duration::from_millis(3), Duration::from_millis(700));
    // A floor above the ceiling: the floor wins.
    static CROSSED: LearnedDelay =
        LearnedDelay::new(f64::NAN, Duration::from_millis(9), Duration::from_millis(2));
    assert_eq!(
        Hedging::learned(2, &FRESH).delay(),
        Duration::from_millis(700)
    );
    assert_eq!(CROSSED.current(), Duration::from_millis(9));
}
