//! The behaviour tests of the chaos door: faults in code under the engine
//! on the paused clock (`engine.rs`), and on the wire through both HTTP
//! doors against a real axum server on loopback (`http.rs`).
//!
//! They use the door's `tower`, `tonic` and `reqwest-middleware` features.
//! `cargo test --workspace` turns them on (the workspace's own behaviour
//! tests ask for them), as does `cargo test -p retries-chaos
//! --all-features`; built without them, this binary is empty and
//! `features.rs` reports one ignored test that says so, never a pass.
#![cfg(all(feature = "tower", feature = "tonic", feature = "reqwest-middleware"))]

mod engine;
mod http;
