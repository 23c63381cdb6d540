//! Admission's slots under `loom` (CI: `RUSTFLAGS="--cfg loom" cargo test
//! -p retries-core --lib --release loom`): the first overloaded refusal of
//! an episode carries the attempts counted while idle into the window once,
//! and an attempt admitted meanwhile is counted exactly once.

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;

use super::*;

/// Admission over an hour's window (every step of a model is in one time
/// slot), its `loom` objects made on this thread before any other thread is
/// spawned (see the breaker's models).
fn admission() -> Arc<Admission> {
    let a = Admission::new(2.0, Duration::from_secs(3600));
    let _ = a.budget().tokens_milli();
    for s in &a.slots {
        let _ = (
            s.sent.load(Ordering::Relaxed),
            s.overloaded.load(Ordering::Relaxed),
        );
        let _ = s.refused.load(Ordering::Relaxed);
    }
    let _ = (
        a.active.load(Ordering::Relaxed),
        a.idle_sent.load(Ordering::Relaxed),
    );
    let _ = (
        a.idle_since.load(Ordering::Relaxed),
        a.last_overload.load(Ordering::Relaxed),
    );
    let _ = a.debt.load(Ordering::Relaxed);
    Arc::new(a)
}

/// Sends in the window, refusals and sends still counted as idle, summed.
fn counted(a: &Admission) -> u64 {
    let (sent, _, refused) = a.totals(a.epoch());
    sent + refused + a.idle_sent.load(Ordering::Relaxed)
}

/// The first overloaded refusal (seeding the window) races a first attempt:
/// every attempt is counted once.
#[test]
fn loom_an_attempt_during_the_seeding_is_counted_once() {
    loom::model(|| {
        let a = admission();
        for _ in 0..3 {
            assert!(a.admit());
        }
        let other = Arc::clone(&a);
        let t = thread::spawn(move || {
            other.admit();
        });
        a.on_overloaded();
        t.join().unwrap();
        assert!(a.is_throttling());
        assert_eq!(counted(&a), 4);
    });
}

/// Two overloaded refusals racing: the window is seeded once.
#[test]
fn loom_racing_refusals_seed_the_window_once() {
    loom::model(|| {
        let a = admission();
        for _ in 0..3 {
            assert!(a.admit());
        }
        let other = Arc::clone(&a);
        let t = thread::spawn(move || other.on_overloaded());
        a.on_overloaded();
        t.join().unwrap();
        let (sent, overloaded, refused) = a.totals(a.epoch());
        assert_eq!((sent, overloaded, refused), (3, 2, 0));
        assert_eq!(a.idle_sent.load(Ordering::Relaxed), 0);
    });
}
