//! `#[retryable]` itself: every function shape, `recover`, impl blocks, and
//! names resolved absolutely under strict lints.

mod hygiene;
mod impl_block;
mod macro_edges;
mod macro_recover;
mod macro_shapes;
mod turns;
