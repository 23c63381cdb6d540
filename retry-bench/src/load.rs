//! Load: many tasks sending through one client for a fixed time, requests
//! per second and latency quantiles (`examples/layer_throughput.rs`, and the
//! gRPC rows in `retries-payments`' `grpc_throughput` example).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Tasks sending at once.
pub const CONCURRENCY: usize = 64;
/// How long one round sends.
pub const ROUND: Duration = Duration::from_millis(1500);
/// Rounds per variant (alternating between the variants).
pub const ROUNDS: usize = 5;

/// One round's figures.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// Requests per second.
    pub per_sec: f64,
    /// The median latency.
    pub p50: Duration,
    /// The 99th percentile.
    pub p99: Duration,
}

/// Run `send` from `CONCURRENCY` tasks for `ROUND` and measure it.
///
/// # Panics
///
/// When a sending task panicked (a request failed).
pub async fn round<F, Fut>(send: F) -> Figures
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let end = Instant::now() + ROUND;
    let mut tasks = Vec::new();
    for _ in 0..CONCURRENCY {
        let send = send.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < end {
                let t0 = Instant::now();
                send().await;
                latencies.push(t0.elapsed());
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("a sender"));
    }
    all.sort();
    let at = |q: f64| all[((all.len() as f64 - 1.0) * q) as usize];
    Figures {
        per_sec: all.len() as f64 / ROUND.as_secs_f64(),
        p50: at(0.50),
        p99: at(0.99),
    }
}

/// Each figure's median over rounds.
#[must_use]
pub fn median(mut v: Vec<Figures>) -> Figures {
    let mid = v.len() / 2;
    let pick = |v: &mut Vec<Figures>, f: fn(&Figures) -> f64| {
        v.sort_by(|a, b| f(a).total_cmp(&f(b)));
        v[mid]
    };
    Figures {
        per_sec: pick(&mut v, |f| f.per_sec).per_sec,
        p50: pick(&mut v, |f| f.p50.as_secs_f64()).p50,
        p99: pick(&mut v, |f| f.p99.as_secs_f64()).p99,
    }
}

/// A client under test: its name, and one request through it.
pub type Variant = (
    &'static str,
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>,
);

/// Every variant warmed up (300 ms each: connections made), then
/// [`ROUNDS`] rounds alternating between them (A B C A B C …, so that a
/// slow stretch of the machine falls on all), each figure the median.
pub async fn measure(variants: &[Variant]) -> Vec<Figures> {
    for (_, send) in variants {
        let send = Arc::clone(send);
        let _ = tokio::time::timeout(Duration::from_millis(300), round(move || send())).await;
    }
    let mut rounds: Vec<Vec<Figures>> = vec![Vec::new(); variants.len()];
    for _ in 0..ROUNDS {
        for (i, (_, send)) in variants.iter().enumerate() {
            let send = Arc::clone(send);
            rounds[i].push(round(move || send()).await);
        }
    }
    rounds.into_iter().map(median).collect()
}

/// The table: each variant's figures and its ratios to the variant
/// `base(i)` (the bare client of its family).
pub fn print(variants: &[Variant], figures: &[Figures], base: impl Fn(usize) -> usize) {
    println!(
        "{CONCURRENCY} tasks, {ROUNDS} alternating rounds of {ROUND:?}, medians; ratios to the bare client of each family"
    );
    println!(
        "{:<40} {:>10} {:>8} {:>10} {:>10} {:>8} {:>8}",
        "client", "req/s", "× bare", "p50", "p99", "× p50", "× p99"
    );
    for (i, (name, _)) in variants.iter().enumerate() {
        let (b, f) = (figures[base(i)], figures[i]);
        println!(
            "{name:<40} {:>10.0} {:>8.3} {:>10.1?} {:>10.1?} {:>8.3} {:>8.3}",
            f.per_sec,
            f.per_sec / b.per_sec,
            f.p50,
            f.p99,
            f.p50.as_secs_f64() / b.p50.as_secs_f64(),
            f.p99.as_secs_f64() / b.p99.as_secs_f64(),
        );
    }
}

/// Run `f` on a multi-thread runtime of two workers (the machine's cores).
///
/// # Panics
///
/// When the runtime cannot be built.
pub fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(f)
}
