//! The token bucket and the tagged slot counters under `loom` (CI:
//! `RUSTFLAGS="--cfg loom" cargo test -p retries-core --lib --release
//! loom`): no update of either is lost whatever the interleaving.

use loom::sync::Arc;
use loom::thread;

use super::*;

/// A bucket, its `loom` atomic made on this thread before any other thread
/// is spawned (see the breaker's models).
fn bucket(max_tokens: u32, ratio: f64) -> Arc<TokenBucket> {
    let b = TokenBucket::new(max_tokens, ratio);
    let _ = b.tokens_milli();
    Arc::new(b)
}

fn counter(v: u64) -> Arc<AtomicU64> {
    let c = AtomicU64::new(v);
    let _ = c.load(Ordering::Relaxed);
    Arc::new(c)
}

/// A success and a failure racing on the bucket: both land (500 either
/// way: 1,000 + 500 − 1,000 or 1,000 − 1,000 + 500).
#[test]
fn loom_the_bucket_loses_no_deposit_or_withdrawal() {
    loom::model(|| {
        let b = bucket(2, 0.5);
        b.on_transient_failure();
        assert_eq!(b.tokens_milli(), 1_000);
        let other = Arc::clone(&b);
        let t = thread::spawn(move || other.on_success());
        b.on_transient_failure();
        t.join().unwrap();
        assert_eq!(b.tokens_milli(), 500);
    });
}

/// Two failures racing: two tokens withdrawn, none twice, none lost.
#[test]
fn loom_racing_failures_withdraw_one_token_each() {
    loom::model(|| {
        let b = bucket(3, 0.1);
        let other = Arc::clone(&b);
        let t = thread::spawn(move || other.on_transient_failure());
        b.on_transient_failure();
        t.join().unwrap();
        assert_eq!(b.tokens_milli(), 1_000);
        assert!(b.try_retry() == false);
    });
}

fn tagged(epoch: u64, count: u64) -> u64 {
    (epoch << (64 - EPOCH_BITS)) | count
}

/// Two bumps of a slot's new time slot racing over its old count: the
/// slot starts again once and counts both.
#[test]
fn loom_racing_bumps_of_a_new_slot_count_both() {
    loom::model(|| {
        let c = counter(tagged(4, 7));
        let other = Arc::clone(&c);
        let t = thread::spawn(move || bump_tagged(&other, 5));
        bump_tagged(&c, 5);
        t.join().unwrap();
        assert_eq!(read_tagged(&c, 5, 1), 2);
    });
}

/// A bump computed in the slot's previous time slot that lands after the
/// slot moved on does not take it back: the newer time slot's count stays.
#[test]
fn loom_a_late_bump_of_an_older_slot_does_not_reset_a_newer_one() {
    loom::model(|| {
        let c = counter(tagged(4, 7));
        let other = Arc::clone(&c);
        let t = thread::spawn(move || bump_tagged(&other, 5));
        bump_tagged(&c, 15);
        t.join().unwrap();
        assert_eq!(read_tagged(&c, 15, 1), 1);
    });
}
