//! The behaviour tests of the tower door, through its public API against
//! real servers on loopback (axum, hyper, tonic): the retry layer and,
//! beside it, the reqwest middleware (the two HTTP doors meet the same
//! cases), the layer on the paused clock and under gRPC service configs,
//! the next attempt on another replica, the idempotency layer and its
//! proof, the stops a caller sees, the admin endpoint of the overrides, and
//! uploads of any size. One binary; the memory of a large upload is a
//! process of its own (`upload_memory.rs`).
//!
//! They use every feature of the door. `cargo test --workspace` turns them
//! on (the workspace's own behaviour tests ask for them), as does `cargo
//! test -p retries-tower --all-features`; built without them, this binary
//! is empty and `features.rs` reports one ignored test that says so, never
//! a pass.
#![cfg(all(
    feature = "tonic",
    feature = "service-config",
    feature = "axum",
    feature = "admin"
))]

#[path = "../support/uploads.rs"]
mod support;

mod across;
mod adaptive;
mod admin;
mod another_replica;
mod dedup;
mod middleware;
mod proof;
mod quota;
mod service_config;
mod stops;
mod tower_paused;
mod uploads;
