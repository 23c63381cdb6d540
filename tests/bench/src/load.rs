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
pub const ROUND: Duration = Duration::from_secs(1);
/// Rounds per variant (alternating between the variants).
pub const ROUNDS: usize = 9;

/// One round's figures.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// Requests per second.
    pub per_sec: f64,
    /// The median latency.
    pub p50: Duration,
    /// The 99th percentile.
    pub p99: Duration,
    /// The process's CPU time (user and system, client and server, every
    /// thread) per request: the work a request costs, which time stolen by
    /// the machine's neighbours does not inflate as it does the rates.
    pub cpu: Duration,
}

/// The CPU time this process has used so far, every thread.
fn cpu_time() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec; the clock id is a constant
    // every Linux and macOS knows.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &raw mut t) };
    assert_eq!(rc, 0, "the process CPU clock");
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
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
    let cpu0 = cpu_time();
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
    let cpu = cpu_time().saturating_sub(cpu0);
    all.sort();
    let at = |q: f64| all[((all.len() as f64 - 1.0) * q) as usize];
    Figures {
        per_sec: all.len() as f64 / ROUND.as_secs_f64(),
        p50: at(0.50),
        p99: at(0.99),
        cpu: cpu / u32::try_from(all.len().max(1)).unwrap_or(u32::MAX),
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
        cpu: pick(&mut v, |f| f.cpu.as_secs_f64()).cpu,
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

/// Send `n` requests through variant number `i` alone, one after another,
/// for a count of instructions under callgrind (one at a time: with many in
/// flight, how a client's connection pool happens to be filled changes its
/// work per request by more than a layer costs). Prints the variant's name
/// first, which `scripts/layer-instructions.sh` reads; prints nothing when
/// there is no variant `i`.
pub async fn only(variants: &[Variant], i: usize, n: usize) {
    let Some((name, send)) = variants.get(i) else {
        return;
    };
    println!("{name}");
    for _ in 0..n {
        send().await;
    }
}

/// `VARIANT REQUESTS` from the command line, when given: the mode of
/// [`only`].
///
/// # Panics
///
/// When an argument is not a number.
#[must_use]
pub fn only_args() -> Option<(usize, usize)> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("VARIANT REQUESTS, two numbers"))
        .collect();
    match args[..] {
        [variant, n] => Some((variant, n)),
        _ => None,
    }
}

/// The table: each variant's figures and its ratios to the variant
/// `base(i)` (the bare client of its family).
pub fn print(variants: &[Variant], figures: &[Figures], base: impl Fn(usize) -> usize) {
    println!(
        "{CONCURRENCY} tasks, {ROUNDS} alternating rounds of {ROUND:?}, medians; ratios to the bare client of each family"
    );
    println!(
        "{:<40} {:>10} {:>8} {:>10} {:>10} {:>8} {:>8} {:>9} {:>7}",
        "client", "req/s", "× bare", "p50", "p99", "× p50", "× p99", "CPU/req", "× CPU"
    );
    for (i, (name, _)) in variants.iter().enumerate() {
        let (b, f) = (figures[base(i)], figures[i]);
        println!(
            "{name:<40} {:>10.0} {:>8.3} {:>10.1?} {:>10.1?} {:>8.3} {:>8.3} {:>9.1?} {:>7.3}",
            f.per_sec,
            f.per_sec / b.per_sec,
            f.p50,
            f.p99,
            f.p50.as_secs_f64() / b.p50.as_secs_f64(),
            f.p99.as_secs_f64() / b.p99.as_secs_f64(),
            f.cpu,
            f.cpu.as_secs_f64() / b.cpu.as_secs_f64(),
        );
    }
}

/// Run `f` on a multi-thread runtime of two workers (the machine's cores),
/// or on one thread when `one_thread` (the mode of [`only`], what
/// `scripts/layer-instructions.sh` counts under callgrind): client and
/// server then take turns in one order every run, where two workers'
/// wake-ups moved the count per request by a few per cent run to run.
///
/// # Panics
///
/// When the runtime cannot be built.
pub fn block_on<F: Future>(one_thread: bool, f: F) -> F::Output {
    let mut builder = if one_thread {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(2);
        b
    };
    builder.enable_all().build().expect("a runtime").block_on(f)
}
