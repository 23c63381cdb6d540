//! `#[retryable]` itself: every function shape, `recover`, impl blocks, and
//! names resolved absolutely under strict lints.

mod macro_recover;
mod macro_shapes;
mod macro_edges;
mod hygiene;
mod impl_block;
