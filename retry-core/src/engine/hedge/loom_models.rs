//! The learned delay's window under `loom` (CI: `RUSTFLAGS="--cfg loom"
//! cargo test -p retries-core --lib --release loom`): of two recomputations
//! racing (each sorts outside the lock), the delay left published is the
//! one of the newer window.

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;

use super::*;

/// A delay at the 95th percentile (5 % extra load), between 1 ms and 10 s,
/// its `loom` objects made on this thread before any other is spawned.
fn delay() -> Arc<LearnedDelay> {
    let d = LearnedDelay::new(0.05, Duration::from_millis(1), Duration::from_secs(10));
    let _ = d.current();
    drop(d.window.lock());
    Arc::new(d)
}

/// 63 calls of 10 ms are in; one more of 10 ms (the 64th: the first
/// recomputation, over 64 calls of 10 ms) races 32 of 1 s (the 96th: the
/// second, where the 95th percentile is 1 s). Whatever the interleaving,
/// the delay left is the last window's: 1 s.
#[test]
fn loom_the_delay_left_is_the_newest_windows() {
    let mut builder = loom::model::Builder::new();
    // The thread of 32 calls has 32 critical sections; two preemptions are
    // enough to put the other's whole recomputation inside its own.
    builder.preemption_bound = Some(2);
    builder.check(|| {
        let d = delay();
        for _ in 0..63 {
            d.record(Duration::from_millis(10));
        }
        let other = Arc::clone(&d);
        let t = thread::spawn(move || {
            for _ in 0..32 {
                other.record(Duration::from_secs(1));
            }
        });
        d.record(Duration::from_millis(10));
        t.join().unwrap();
        assert_eq!(d.current(), Duration::from_secs(1));
    });
}
