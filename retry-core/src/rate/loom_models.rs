//! The rate limit's one word under `loom` (CI: `RUSTFLAGS="--cfg loom"
//! cargo test -p retries-core --lib --release loom`): two attempts racing
//! for one bucket get distinct starts, exactly one interval apart at the
//! steady rate, and a refusal takes nothing.

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;

use super::*;

fn limit(rate: u32, burst: u32) -> Arc<RateLimit> {
    let r = RateLimit::new(rate, Duration::from_secs(1), burst);
    let _ = r.tat.load(Ordering::Relaxed);
    Arc::new(r)
}

/// No burst: of two racing at one instant, one starts then, the other one
/// interval later, whichever wins.
#[test]
fn loom_racing_reservations_start_one_interval_apart() {
    loom::model(|| {
        let r = limit(10, 1);
        let now = crate::time::now();
        let far = now + Duration::from_mins(1);
        let other = Arc::clone(&r);
        let t = thread::spawn(move || other.reserve(now, far).unwrap());
        let mine = r.reserve(now, far).unwrap();
        let theirs = t.join().unwrap();
        let (first, second) = if mine <= theirs {
            (mine, theirs)
        } else {
            (theirs, mine)
        };
        assert_eq!(first, now);
        assert_eq!(second - first, Duration::from_millis(100));
        // The third is one more interval on.
        assert_eq!(
            r.reserve(now, far).unwrap() - now,
            Duration::from_millis(200)
        );
    });
}

/// A reservation refused (it would start too late) racing one that fits:
/// the refusal takes nothing, so the next start is the fitting one's next.
#[test]
fn loom_a_refusal_takes_nothing() {
    loom::model(|| {
        let r = limit(10, 1);
        let now = crate::time::now();
        assert_eq!(r.reserve(now, now), Some(now));
        let other = Arc::clone(&r);
        // Too soon: the next start is 100 ms away.
        let t = thread::spawn(move || other.reserve(now, now + Duration::from_millis(50)));
        let fits = r.reserve(now, now + Duration::from_secs(1)).unwrap();
        assert_eq!(t.join().unwrap(), None);
        assert_eq!(fits - now, Duration::from_millis(100));
        assert_eq!(
            r.reserve(now, now + Duration::from_secs(1)).unwrap() - now,
            Duration::from_millis(200)
        );
    });
}
