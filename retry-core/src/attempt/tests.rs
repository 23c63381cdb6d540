//! The attempt context: its key, its start, its marks, its owner.

use super::*;

fn plan() -> Plan {
    Plan::new(None, nanos(Duration::from_secs(2)), None, NONE)
}

#[test]
fn racing_readers_agree_on_one_start() {
    for _ in 0..200 {
        let at = Attempt::new(1, None, plan());
        let seen: Vec<Instant> = std::thread::scope(|s| {
            let readers: Vec<_> = (0..4).map(|_| s.spawn(|| at.timing().start)).collect();
            readers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        assert!(seen.iter().all(|&i| i == seen[0]), "{seen:?}");
        assert_eq!(at.timing().start, seen[0]);
        assert_eq!(at.call_deadline(), seen[0] + Duration::from_secs(2));
    }
}

#[test]
fn racing_threads_mint_one_key() {
    for _ in 0..200 {
        let at = Attempt::new(1, None, plan());
        assert_eq!(at.minted_key(), None);
        let seen: Vec<IdempotencyKey> = std::thread::scope(|s| {
            let minters: Vec<_> = (0..4).map(|_| s.spawn(|| at.idempotency_key())).collect();
            minters.into_iter().map(|m| m.join().unwrap()).collect()
        });
        assert!(seen.iter().all(|&k| k == seen[0]), "{seen:?}");
        assert_eq!(at.minted_key(), Some(seen[0]));
    }
    let given = IdempotencyKey::from_u128(7);
    assert_eq!(
        Attempt::new(2, Some(given), plan()).idempotency_key(),
        given
    );
}

#[test]
fn the_flags_of_calls_below_stay_apart() {
    let at = Attempt::new(1, None, plan());
    at.mark_gave_up();
    assert!(at.gave_up_below());
    assert!(!at.unknown_effect_below());
    assert_eq!(at.minted_key(), None, "a flag is not the key's state");
    at.mark_unknown_effect();
    assert!(at.unknown_effect_below());
    let key = at.idempotency_key();
    assert_eq!(at.minted_key(), Some(key));
    assert!(at.gave_up_below() && at.unknown_effect_below());
}

#[test]
fn a_watch_sees_the_body_end_and_the_attempt_go() {
    let at = Attempt::new(1, None, plan());
    let Owner::While(first) = at.inherited_owner() else {
        panic!("an attempt's loop owns its scope");
    };
    let Owner::While(second) = at.inherited_owner() else {
        panic!("an attempt's loop owns its scope");
    };
    assert!(Weak::ptr_eq(&first, &second), "one flag per attempt");
    assert!(first.upgrade().unwrap().load(Ordering::Acquire));
    at.ended();
    assert!(!first.upgrade().unwrap().load(Ordering::Acquire));
    drop(at);
    assert!(first.upgrade().is_none(), "the flag goes with the attempt");
}

#[test]
fn a_renewed_attempt_is_the_next_with_the_calls_key_and_fresh_marks() {
    let mut at = Attempt::new(1, None, plan());
    let key = at.idempotency_key();
    let t0 = Instant::now();
    assert_eq!(at.timing_at(t0).start, t0);
    at.mark_unknown_effect();
    at.mark_gave_up();
    let Owner::While(watch) = at.inherited_owner() else {
        panic!("an attempt's loop owns its scope");
    };
    at.ended();

    at.renew(nanos(Duration::from_millis(300)));
    assert_eq!(at.number(), 2);
    assert_eq!(at.minted_key(), Some(key), "the call's key stays");
    assert!(!at.unknown_effect_below() && !at.gave_up_below());
    assert_eq!(at.start(), None, "the next reader fixes the start");
    let t1 = t0 + Duration::from_secs(1);
    let timing = at.timing_at(t1);
    assert_eq!(timing.start, t1);
    assert_eq!(timing.deadline, t1 + Duration::from_millis(300));
    assert!(
        watch.upgrade().is_none(),
        "scopes inherited from the attempt before have no owner"
    );
    let Owner::While(again) = at.inherited_owner() else {
        panic!("an attempt's loop owns its scope");
    };
    assert!(again.upgrade().unwrap().load(Ordering::Acquire));
}

#[test]
fn the_first_reading_fixes_the_start() {
    let at = Attempt::new(1, None, plan());
    assert_eq!(at.start(), None);
    let t0 = Instant::now();
    assert_eq!(at.timing_at(t0).start, t0);
    assert_eq!(at.timing_at(t0 + Duration::from_secs(1)).start, t0);
    assert_eq!(at.start(), Some(t0));
    let fixed = Attempt::fixed(t0, Owner::Nobody);
    assert_eq!(fixed.deadline(), t0);
}

/// The time left at the start, from the plan alone, is what the timing
/// resolved from that start says, for every plan it answers for; the
/// plans it leaves to `resolve` are those with a bound or a known deadline.
#[test]
fn left_at_start_agrees_with_the_resolved_timing() {
    let start = Instant::now();
    let ms = |n: u64| nanos(Duration::from_millis(n));
    let later = Some(start + Duration::from_secs(1));
    for usable in [0, 1, ms(300), ms(2_000), NONE - 1] {
        for timeout in [0, ms(100), ms(300), ms(5_000), NONE] {
            let plan = Plan::new(None, usable, None, timeout);
            let left = plan.left_at_start().expect("no bound, no known deadline");
            assert_eq!(
                left,
                plan.resolve(start)
                    .deadline
                    .saturating_duration_since(start),
                "usable {usable} timeout {timeout}"
            );
            assert_eq!(
                Plan::new(None, usable, later, timeout).left_at_start(),
                None
            );
            assert_eq!(
                Plan::new(later, usable, None, timeout).left_at_start(),
                None
            );
        }
    }
}

/// `remaining` on the reading that fixes the start (from the plan alone),
/// on later readings (from the clock), and with a bound (from the clock).
#[cfg(feature = "tokio")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn remaining_from_the_plan_then_from_the_clock() {
    let ms = Duration::from_millis;
    let at = Attempt::new(
        1,
        None,
        Plan::new(None, nanos(ms(2_000)), None, nanos(ms(300))),
    );
    assert_eq!(at.remaining(), ms(300));
    let start = at.start().expect("fixed by the first reading");
    tokio::time::advance(ms(100)).await;
    assert_eq!(at.remaining(), ms(200));
    assert_eq!(at.deadline(), start + ms(300));
    tokio::time::advance(ms(250)).await;
    assert_eq!(at.remaining(), Duration::ZERO);

    let no_limit = Attempt::new(1, None, Plan::new(None, nanos(ms(2_000)), None, NONE));
    assert_eq!(no_limit.remaining(), ms(2_000));

    let bound = crate::time::now() + ms(700);
    let bounded = Attempt::new(
        1,
        None,
        Plan::new(None, nanos(ms(2_000)), Some(bound), NONE),
    );
    assert_eq!(bounded.remaining(), ms(700));
    tokio::time::advance(ms(700)).await;
    assert_eq!(bounded.remaining(), Duration::ZERO);
}
