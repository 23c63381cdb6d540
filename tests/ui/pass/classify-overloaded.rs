//! `#[classify(overloaded)]` and `#[classify(conflict)]`: a variant refused
//! by an overloaded service (what an `Admission` learns from) and a variant
//! lost to concurrent work (retried without drawing on the budget), both
//! not executed.
#![deny(warnings)]

use retries::{Classify, VerdictKind};

#[derive(Debug, retries::Classify)]
enum E {
    #[classify(overloaded)]
    TooManyRequests,
    #[classify(conflict)]
    SerializationFailure,
    #[classify(not_executed)]
    Refused,
}

fn main() {
    let overloaded = E::TooManyRequests.classify();
    assert_eq!(overloaded.kind(), VerdictKind::NotExecuted);
    assert!(overloaded.is_overloaded() && !overloaded.is_conflict());
    let conflict = E::SerializationFailure.classify();
    assert_eq!(conflict.kind(), VerdictKind::NotExecuted);
    assert!(conflict.is_conflict() && !conflict.is_overloaded());
    let plain = E::Refused.classify();
    assert!(!plain.is_overloaded() && !plain.is_conflict());
}
