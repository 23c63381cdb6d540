//! The sync-only crate's retried `get`, with no runtime anywhere.

use retries_sync::{Store, StoreError};

#[test]
fn a_refused_get_is_retried_without_a_runtime() {
    let store = Store::new(2);
    assert_eq!(store.get("a").unwrap(), "value of a");
    assert_eq!(store.calls.get(), 3);
}

#[test]
fn the_last_error_after_the_last_attempt() {
    let store = Store::new(5);
    assert!(matches!(store.get("a"), Err(StoreError::Refused)));
    assert_eq!(store.calls.get(), 3);
}
