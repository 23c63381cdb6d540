//! The memory store's claims under `loom` (CI: `RUSTFLAGS="--cfg loom"
//! cargo test -p retries-dedup --lib --release loom`): every interleaving
//! of two requests with one key, through the store's lock.

use std::task::{Context, Poll, Waker};
use std::time::Duration;

use loom::sync::Arc;
use loom::thread;

use super::*;

/// The memory store answers at once.
fn now<T>(f: impl Future<Output = Result<T, StoreError>>) -> T {
    let mut cx = Context::from_waker(Waker::noop());
    match std::pin::pin!(f).poll(&mut cx) {
        Poll::Ready(r) => r.unwrap(),
        Poll::Pending => unreachable!("the memory store never waits"),
    }
}

const TERMS: Terms = Terms {
    lease: Duration::from_secs(3600),
    retention: Duration::from_secs(3600),
};

fn store() -> Arc<MemoryStore> {
    let s = MemoryStore::new();
    let _ = s.len();
    Arc::new(s)
}

fn claim(store: &MemoryStore, fingerprint: &Fingerprint) -> Claim {
    let key = Key {
        principal: "tenant",
        key: "k-1",
        fingerprint,
    };
    now(store.claim(key, TERMS))
}

fn answer() -> Stored {
    Stored {
        status: 201,
        headers: vec![],
        body: b"charged".to_vec(),
        trailers: vec![],
        body_dropped: false,
    }
}

/// Two requests with one key claim it together: exactly one runs, the
/// other is told the first is in progress.
#[test]
fn loom_two_claims_of_one_key_run_it_once() {
    loom::model(|| {
        let s = store();
        let other = Arc::clone(&s);
        let t = thread::spawn(move || claim(&other, &Fingerprint::of("POST", "/c", b"1")));
        let mine = claim(&s, &Fingerprint::of("POST", "/c", b"1"));
        let theirs = t.join().unwrap();
        let runs = [&mine, &theirs]
            .iter()
            .filter(|c| matches!(c, Claim::Run(_)))
            .count();
        assert_eq!(runs, 1, "{mine:?} {theirs:?}");
        assert!(
            [&mine, &theirs]
                .iter()
                .any(|c| matches!(c, Claim::InProgress { .. }))
        );
    });
}

/// The run completes while a retry of the same request claims the key:
/// the retry is told "in progress" or gets the stored answer, never a run
/// of its own; afterwards every claim gets the answer.
#[test]
fn loom_a_claim_racing_the_completion_never_runs_again() {
    loom::model(|| {
        let s = store();
        let fingerprint = Fingerprint::of("POST", "/c", b"1");
        let Claim::Run(token) = claim(&s, &fingerprint) else {
            panic!("the first claim runs");
        };
        let other = Arc::clone(&s);
        let t = thread::spawn(move || claim(&other, &Fingerprint::of("POST", "/c", b"1")));
        let key = Key {
            principal: "tenant",
            key: "k-1",
            fingerprint: &fingerprint,
        };
        let done = now(s.complete(key, token, &answer(), TERMS));
        assert!(matches!(done, Completed::Stored));
        match t.join().unwrap() {
            Claim::InProgress { .. } => {}
            Claim::Answered(a) => assert_eq!(a, answer()),
            c => panic!("a retry during the run got {c:?}"),
        }
        assert!(matches!(claim(&s, &fingerprint), Claim::Answered(a) if a == answer()));
    });
}
