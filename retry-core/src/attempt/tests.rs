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
