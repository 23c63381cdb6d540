//! The behaviour tests of `retries`, through its public API with every
//! feature of the facade on: one test binary, one module per door (see
//! `tests/README.md`). Run one door with `cargo test -p retries-tests --test
//! behaviour engine::` (or any test name). The zero-allocation test is a
//! binary of its own (`alloc.rs`): it installs a counting global allocator.

mod common;
mod scoped;

mod config;
mod engine;
mod http;
mod macros;
mod observe;
mod readme;
mod stream;
