//! The attempt's write-once key, model-checked with `loom` (every
//! interleaving of two threads asking for it, the claim's `fetch_or`, the
//! halves' stores and the `Release`/`Acquire` pair of `KEY_SET`): both get
//! the same key, and it is the attempt's from then on. Run by CI:
//! `RUSTFLAGS="--cfg loom" cargo test -p retries-core --lib --release loom`.

use super::*;

#[test]
fn loom_one_key_is_minted_whoever_asks_first() {
    loom::model(|| {
        let plan = Plan::new(None, 0, None, NONE);
        let at = loom::sync::Arc::new(Attempt::new(1, None, plan));
        let other = loom::sync::Arc::clone(&at);
        let t = loom::thread::spawn(move || other.idempotency_key());
        let mine = at.idempotency_key();
        let theirs = t.join().unwrap();
        assert_eq!(mine, theirs);
        assert_eq!(at.minted_key(), Some(mine));
    });
}

#[test]
fn loom_a_key_given_is_never_replaced() {
    loom::model(|| {
        let given = IdempotencyKey::random();
        let plan = Plan::new(None, 0, None, NONE);
        let at = loom::sync::Arc::new(Attempt::new(1, Some(given), plan));
        let other = loom::sync::Arc::clone(&at);
        let t = loom::thread::spawn(move || other.idempotency_key());
        assert_eq!(at.idempotency_key(), given);
        assert_eq!(t.join().unwrap(), given);
    });
}
