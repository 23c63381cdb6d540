//! `#[retryable(...)]` on whole `impl` blocks, inherent and trait impls: the
//! block's keys are every `async fn`'s defaults, a method's own attribute
//! overrides them key by key, `skip` opts out, blocking methods are left
//! alone unless annotated, and methods that set no budget share one.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use retries::{Classify, retryable};
use tokio::time::Instant;

#[derive(Debug, thiserror::Error, Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error("reset")]
    #[classify(unknown)]
    Reset,
    #[error(transparent)]
    #[classify(permanent)]
    Stopped(#[from] retries::Stopped),
}

#[derive(Default)]
struct Client {
    calls: AtomicU32,
}

impl Client {
    fn hit(&self) -> u32 {
        self.calls.fetch_add(1, Ordering::SeqCst) + 1
    }
    fn calls(&self) -> u32 {
        self.calls.swap(0, Ordering::SeqCst)
    }
}

#[retryable(
    deadline = "5s",
    max_attempts = 3,
    idempotent,
    backoff = "constant",
    initial_backoff = "100ms",
    budget = "none"
)]
impl Client {
    /// Refused twice, then answers: the block's keys apply.
    async fn stock(&self) -> Result<u32, E> {
        if self.hit() < 3 {
            Err(E::Refused)
        } else {
            Ok(7)
        }
    }

    /// Its own keys override the block's: five attempts, 10 ms apart.
    #[retryable(max_attempts = 5, initial_backoff = "10ms")]
    async fn slow_to_start(&self) -> Result<u32, E> {
        if self.hit() < 5 {
            Err(E::Refused)
        } else {
            Ok(5)
        }
    }

    /// Not idempotent here: an unknown outcome is not repeated.
    #[retryable(idempotent = false)]
    async fn charge(&self) -> Result<u32, E> {
        self.hit();
        Err(E::Reset)
    }

    /// Opted out: one call, no loop (so a plain `async fn` with no await).
    #[retryable(skip)]
    #[allow(clippy::unused_async)]
    async fn raw(&self) -> Result<u32, E> {
        self.hit();
        Err(E::Refused)
    }

    /// A blocking method without an attribute: left alone.
    fn plain(&self) -> Result<u32, E> {
        self.hit();
        Err(E::Refused)
    }

    /// A blocking method with one: retried on the std clock.
    #[retryable(initial_backoff = "1ms")]
    fn blocking(&self) -> Result<u32, E> {
        if self.hit() < 2 {
            Err(E::Refused)
        } else {
            Ok(2)
        }
    }
}

#[tokio::test(start_paused = true)]
async fn the_blocks_keys_are_every_methods_defaults() {
    let c = Client::default();
    let t0 = Instant::now();
    assert_eq!(c.stock().await.unwrap(), 7);
    assert_eq!((c.calls(), t0.elapsed()), (3, Duration::from_millis(200)));
}

#[tokio::test(start_paused = true)]
async fn a_methods_own_keys_override_the_blocks() {
    let c = Client::default();
    let t0 = Instant::now();
    assert_eq!(c.slow_to_start().await.unwrap(), 5);
    assert_eq!((c.calls(), t0.elapsed()), (5, Duration::from_millis(40)));
    assert!(matches!(c.charge().await, Err(E::Reset)));
    assert_eq!(c.calls(), 1, "idempotent = false on the method wins");
}

#[tokio::test(start_paused = true)]
async fn skipped_and_unannotated_methods_are_left_alone() {
    let c = Client::default();
    assert!(c.raw().await.is_err());
    assert_eq!(c.calls(), 1);
    assert!(c.plain().is_err());
    assert_eq!(c.calls(), 1);
    assert_eq!(c.blocking().unwrap(), 2);
    assert_eq!(c.calls(), 2);
}

/// A block without a `budget` key: its methods share one token bucket.
struct Shared {
    calls: AtomicU32,
}

#[retryable(
    deadline = "5s",
    max_attempts = 3,
    idempotent,
    backoff = "constant",
    initial_backoff = "1ms"
)]
impl Shared {
    async fn a(&self) -> Result<(), E> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(E::Reset)
    }

    async fn b(&self) -> Result<(), E> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(E::Reset)
    }
}

#[tokio::test(start_paused = true)]
async fn methods_without_a_budget_share_the_blocks() {
    let s = Shared {
        calls: AtomicU32::new(0),
    };
    // The default bucket: 100 tokens, retries while more than 50 are left.
    // Each failed attempt costs one, on either method.
    let mut attempts = Vec::new();
    for i in 0..40 {
        let before = s.calls.load(Ordering::SeqCst);
        let _ = if i % 2 == 0 { s.a().await } else { s.b().await };
        attempts.push(s.calls.load(Ordering::SeqCst) - before);
    }
    // 100 → 51 takes 49 failures: 16 calls of 3 attempts (48), then one
    // retry allowed at 52 → 51; from then on every call makes 1 attempt.
    assert_eq!(&attempts[..16], &[3; 16]);
    assert_eq!(attempts[16], 2);
    assert!(attempts[17..].iter().all(|&n| n == 1), "{attempts:?}");
}

/// A trait implemented with the attribute on the impl.
trait Inventory {
    async fn count(&self) -> Result<u32, E>;
}

#[retryable(
    deadline = "1s",
    idempotent,
    backoff = "constant",
    initial_backoff = "10ms",
    budget = "none"
)]
impl Inventory for Client {
    async fn count(&self) -> Result<u32, E> {
        if self.hit() < 2 {
            Err(E::Refused)
        } else {
            Ok(11)
        }
    }
}

#[tokio::test(start_paused = true)]
async fn trait_impls_take_the_attribute_too() {
    let c = Client::default();
    assert_eq!(c.count().await.unwrap(), 11);
    assert_eq!(c.calls(), 2);
}
