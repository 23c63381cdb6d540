//! Implementation detail of the [`retry`](https://docs.rs/retry) crate: the
//! `#[retryable]` attribute. Depend on `retry`, not on this crate.
