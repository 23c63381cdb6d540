//! Benchmarks only. `benches/overhead.rs` and `benches/shared_state.rs`
//! (criterion) measure `retries` against a direct call, a hand-written loop
//! and the peer crates in the same run; `examples/future_sizes.rs` reports
//! future sizes. A package of its own, so the peers and criterion stay out of
//! the facade's dev-dependencies.
