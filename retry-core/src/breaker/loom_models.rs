//! The breaker's state word under `loom` (CI: `RUSTFLAGS="--cfg loom" cargo
//! test -p retries-core --lib --release loom`): every interleaving of the
//! threads' loads and compare-exchanges. The models do not wait on the
//! clock: a breaker is opened, then its opening is stamped an hour back
//! (`open_for` is a nanosecond), so it is due for half-open at once.

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;

use super::*;

/// The breaker, its `loom` objects made on this thread before any other
/// thread is spawned (a `loom` object made on one thread and read on
/// another without an order between them is a causality error).
fn breaker(threshold: u32) -> Arc<CircuitBreaker> {
    let b = CircuitBreaker::new(threshold, Duration::from_nanos(1));
    let _ = b.origin.set(crate::time::now() - Duration::from_secs(3600));
    let _ = (
        b.state.load(Ordering::Relaxed),
        b.opened_at.load(Ordering::Relaxed),
    );
    let _ = b.warned.load(Ordering::Relaxed);
    Arc::new(b)
}

/// Open `b` with one failure, its opening stamped an hour back: due for
/// half-open.
fn open(b: &CircuitBreaker) {
    b.on_transient_failure(Permit::NORMAL);
    b.opened_at.store(0, Ordering::Release);
}

/// The breaker is open, in its `n`th episode.
fn open_in_episode(b: &CircuitBreaker, n: u32) -> bool {
    let s = b.state.load(Ordering::Acquire);
    s & TAG == OPEN && episode(s) == n
}

/// Failures racing from closed open the breaker exactly once: one episode.
#[test]
fn loom_racing_failures_open_the_breaker_once() {
    loom::model(|| {
        let b = breaker(3);
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let b = Arc::clone(&b);
                thread::spawn(move || b.on_transient_failure(Permit::NORMAL))
            })
            .collect();
        b.on_transient_failure(Permit::NORMAL);
        for t in threads {
            t.join().unwrap();
        }
        assert!(open_in_episode(&b, 1));
    });
}

/// Half-open with one probe: of two callers racing, exactly one is admitted.
#[test]
fn loom_half_open_admits_one_probe_of_two() {
    loom::model(|| {
        let b = breaker(1);
        open(&b);
        let other = Arc::clone(&b);
        let t = thread::spawn(move || other.admit());
        let mine = b.admit();
        let theirs = t.join().unwrap();
        assert!(mine.is_some() != theirs.is_some(), "{mine:?} {theirs:?}");
        let probe = mine.or(theirs).unwrap();
        assert_eq!(probe.episode(), Some(1));
        assert_eq!(b.state(), BreakerState::HalfOpen { in_flight: 1 });
        b.on_success(probe);
        assert_eq!(b.state(), BreakerState::Closed { failures: 0 });
    });
}

/// A failed probe opens the breaker again; a straggler's success (admitted
/// while closed) racing it never closes it.
#[test]
fn loom_a_straggler_success_never_closes_what_a_probe_reopens() {
    loom::model(|| {
        let b = breaker(1);
        open(&b);
        let probe = b.admit().unwrap();
        let other = Arc::clone(&b);
        let t = thread::spawn(move || other.on_success(Permit::NORMAL));
        b.on_transient_failure(probe);
        t.join().unwrap();
        assert!(open_in_episode(&b, 2));
    });
}

/// A probe that ends neutrally gives its slot back: a caller racing it gets
/// the slot or is refused, and the count of probes in flight is exact.
#[test]
fn loom_a_neutral_probe_gives_its_slot_back() {
    loom::model(|| {
        let b = breaker(1);
        open(&b);
        let probe = b.admit().unwrap();
        let other = Arc::clone(&b);
        let t = thread::spawn(move || other.admit());
        b.on_neutral(probe);
        let theirs = t.join().unwrap();
        let in_flight = u32::from(theirs.is_some());
        assert_eq!(b.state(), BreakerState::HalfOpen { in_flight });
    });
}
