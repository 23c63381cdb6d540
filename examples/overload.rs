//! `cargo run --example overload`: a service of fixed capacity overloaded
//! ten times over, with and without an `Admission` in its callers.
//!
//! The service accepts 100 calls a second (10 per 100 ms) and refuses the
//! rest as overloaded (an HTTP 429, a gRPC `RESOURCE_EXHAUSTED`). 200
//! callers each call it every 200 ms for 20 s: 1,000 calls a second, ten
//! times its capacity. Then the demand falls to half the capacity for 20 s.
//! Each call is `max_attempts = 3` under one token bucket shared by the
//! callers (the process's client), and in the second run also under an
//! `Admission` (K = 2, a 10 s window) around that bucket.
//!
//! It runs on tokio's paused clock: 40 simulated seconds in well under one
//! real second, and the same figures on every run (error diffusion, no
//! random draw). What it prints: the requests the service received per
//! second and per call it accepted during the overload (seconds 10 to 20,
//! steady state), the callers' success rate, and how long after the
//! overload ended calls were still refused locally.

use std::sync::Mutex;
use std::time::Duration;

use retries::limit::Admission;
use retries::{Attempt, Budget, Policy, Reason, TokenBucket, Verdict};
use tokio::time::Instant;

const CAPACITY_PER_TICK: u32 = 10; // per 100 ms: 100 calls a second
const CALLERS: u32 = 200;
const EVERY: Duration = Duration::from_millis(200);
const OVERLOAD: u64 = 20; // seconds at 10x
const CALM: u64 = 20; // seconds at 0.5x after it

#[derive(Debug, thiserror::Error)]
#[error("429 Too Many Requests")]
struct Refused;

/// Counts per simulated second.
#[derive(Default, Clone, Copy)]
struct Second {
    received: u64,
    accepted: u64,
    calls: u64,
    ok: u64,
    throttled: u64,
}

struct World {
    t0: Instant,
    tick: u64,
    tokens: u32,
    seconds: Vec<Second>,
}

impl World {
    fn second(&mut self) -> &mut Second {
        let s = usize::try_from(self.t0.elapsed().as_secs()).unwrap_or(usize::MAX);
        if self.seconds.len() <= s {
            self.seconds.resize(s + 1, Second::default());
        }
        &mut self.seconds[s]
    }

    /// The service: 10 calls per 100 ms tick, the rest refused.
    fn serve(&mut self) -> Result<(), Refused> {
        let tick = u64::try_from(self.t0.elapsed().as_millis() / 100).unwrap_or(u64::MAX);
        if tick != self.tick {
            self.tick = tick;
            self.tokens = CAPACITY_PER_TICK;
        }
        self.second().received += 1;
        if self.tokens == 0 {
            return Err(Refused);
        }
        self.tokens -= 1;
        self.second().accepted += 1;
        Ok(())
    }
}

async fn run<B: Budget + Sync>(budget: &B) -> Vec<Second> {
    let t0 = Instant::now();
    let world = Mutex::new(World {
        t0,
        tick: u64::MAX,
        tokens: 0,
        seconds: Vec::new(),
    });
    let policy = Policy::new(Duration::from_secs(1))
        .with_max_attempts(3)
        .with_backoff(retries::Backoff::constant(Duration::from_millis(50)));
    let callers = (0..CALLERS).map(|i| {
        let (world, policy) = (&world, &policy);
        async move {
            // Spread over the first period; from OVERLOAD on, only one
            // caller in twenty goes on (half the capacity).
            let mut next = t0 + EVERY * i / CALLERS;
            let end = t0 + Duration::from_secs(OVERLOAD + CALM);
            while next < end {
                tokio::time::sleep_until(next).await;
                next += EVERY;
                let calm = t0.elapsed() >= Duration::from_secs(OVERLOAD);
                if calm && i % 20 != 0 {
                    continue;
                }
                let r = retries::call(policy)
                    .idempotent()
                    .budget(budget)
                    .classify(|_: &Refused| Verdict::not_executed().with_overload())
                    .outcome(async |_: &Attempt| {
                        tokio::task::yield_now().await; // the round trip
                        world.lock().unwrap().serve()
                    })
                    .await;
                let mut w = world.lock().unwrap();
                let s = w.second();
                s.calls += 1;
                match r {
                    Ok(()) => s.ok += 1,
                    Err(f) if f.reason() == Reason::Throttled => s.throttled += 1,
                    Err(_) => {}
                }
            }
        }
    });
    futures_join_all(callers).await;
    world.into_inner().unwrap().seconds
}

/// Join every future on this task (the example keeps to tokio and the
/// facade: no futures crate).
async fn futures_join_all<F: std::future::Future<Output = ()>>(futures: impl Iterator<Item = F>) {
    let mut set = Vec::new();
    for f in futures {
        set.push(Box::pin(f));
    }
    std::future::poll_fn(|cx| {
        set.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if set.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
}

fn report(name: &str, seconds: &[Second]) {
    let steady = &seconds[10..usize::try_from(OVERLOAD).unwrap_or(20)];
    let sum = |f: fn(&Second) -> u64| steady.iter().map(f).sum::<u64>();
    let n = steady.len() as f64;
    let (received, accepted, calls, ok) = (
        sum(|s| s.received),
        sum(|s| s.accepted),
        sum(|s| s.calls),
        sum(|s| s.ok),
    );
    // The last second after the overload with a call refused locally.
    let calm_from = usize::try_from(OVERLOAD).unwrap_or(20);
    let last_throttled = seconds[calm_from..]
        .iter()
        .rposition(|s| s.throttled > 0)
        .map_or(0, |i| i + 1);
    println!(
        "{name:<22} {:>9.0} {:>9.0} {:>9.2}x {:>9.2}x {:>8.1}% {:>9} s",
        received as f64 / n,
        accepted as f64 / n,
        received as f64 / accepted as f64,
        received as f64 / (n * f64::from(CAPACITY_PER_TICK) * 10.0),
        100.0 * ok as f64 / calls as f64,
        last_throttled,
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    println!(
        "a service of 100 calls/s under 1,000 calls/s for {OVERLOAD} s (seconds 10 to {OVERLOAD}: steady state), then 50 calls/s"
    );
    println!(
        "{:<22} {:>9} {:>9} {:>10} {:>10} {:>9} {:>11}",
        "callers", "recv/s", "acc/s", "per acc", "per cap", "success", "throttled"
    );
    let bucket = TokenBucket::DEFAULT;
    let plain = rt.block_on(run(&bucket));
    report("token bucket", &plain);
    let admission = Admission::around(TokenBucket::DEFAULT, 2.0, Duration::from_secs(10));
    let admitted = rt.block_on(run(&admission));
    report("admission K=2 + bucket", &admitted);
    println!(
        "(\"per acc\": requests received per call accepted; \"per cap\": per unit of capacity; \"throttled\": seconds after the overload with a call still refused locally)"
    );
}
