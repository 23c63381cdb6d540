//! scratch facade
pub use retry_core::*;
