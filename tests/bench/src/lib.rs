//! Benchmarks only. `benches/overhead.rs` and `benches/shared_state.rs`
//! (criterion) measure `retries` against a direct call, a hand-written loop
//! and the peer crates in the same run; `examples/future_sizes.rs` reports
//! future sizes and `examples/profile_ready.rs` runs calls for callgrind. A
//! package of its own, so the peers and criterion stay out of the facade's
//! dev-dependencies. This library holds what they share.

pub mod load;

use std::future::Future;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};

use retries::Classify;

/// The error of every measured operation.
#[derive(Debug, thiserror::Error, Classify)]
pub enum E {
    /// Refused before running: retried.
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    /// Cut off (the hand-written loop's deadline).
    #[error("timed out")]
    #[classify(unknown)]
    TimedOut,
    /// A stopped call.
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

/// Poll to completion on this thread (the bodies measured never wait on I/O,
/// so a spin on a no-op waker drives them; no executor cost). Inlined, as a
/// local function would be, so the harness adds no move of the future.
#[inline]
pub fn spin<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

/// The hand-written loop the measurements compare with: `op` under one
/// 2 s deadline (tokio's `timeout_at`), at most three attempts, `pause`
/// between them (none when zero). The only baseline besides `retries` that
/// bounds a call by a deadline.
pub async fn hand_loop<F, Fut>(mut op: F, pause: std::time::Duration) -> Result<u64, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<u64, E>>,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
    let mut attempt = 1;
    loop {
        match tokio::time::timeout_at(deadline, op()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if attempt == 3 => return Err(e),
            Ok(Err(_)) => {
                attempt += 1;
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
            Err(_) => return Err(E::TimedOut),
        }
    }
}

/// Returns `Pending` once, like an I/O call that is not ready at first.
#[derive(Debug, Default)]
pub struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}
