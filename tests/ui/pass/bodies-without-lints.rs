//! A body written on one line (`{ Ok(1) }`) gets no lint of its own from the
//! expansion (`unused_braces` used to fire on it, in the user's code), and a
//! body's inner attributes (`#![allow(…)]`) still apply to it (they used to
//! be moved outside the function, a syntax error). `rustfmt` is kept off the
//! one-line bodies: they are the point.
#![deny(warnings)]

use retries::retryable;

#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

#[rustfmt::skip]
#[retryable(deadline = "1s", idempotent)]
async fn ready() -> Result<u32, E> { Ok(1) }

#[rustfmt::skip]
#[retryable(deadline = "1s", idempotent, attempt = at)]
async fn numbered() -> Result<u32, E> { Ok(at.number()) }

#[rustfmt::skip]
#[retryable(deadline = "1s", idempotent)]
fn blocking() -> Result<u32, E> { Err(E::Refused) }

#[rustfmt::skip]
#[retryable(deadline = "1s", idempotent, hedge(max_attempts = 2, delay = "10ms"))]
async fn hedged() -> Result<u32, E> { Ok(2) }

#[retryable(deadline = "1s", idempotent, attempt = at)]
async fn inner_attribute() -> Result<u32, E> {
    #![allow(unused_variables)]
    let unused = 1;
    Ok(at.number())
}

#[retryable(deadline = "1s", idempotent)]
fn blocking_inner_attribute() -> Result<u32, E> {
    #![allow(unused_variables)]
    let unused = 1;
    Ok(2)
}

struct Client;

#[rustfmt::skip]
#[retryable(deadline = "1s", idempotent)]
impl Client {
    async fn get(&self) -> Result<u32, E> { Ok(3) }
}

fn main() {
    let _ = (ready(), numbered(), blocking(), hedged(), Client.get());
    let _ = (inner_attribute(), blocking_inner_attribute());
}

/// The block's `attempt = at` binds the context only where a method uses it
/// (elsewhere it would be an unused variable, in the user's code).
struct Store;

#[retryable(deadline = "1s", idempotent, attempt = at)]
impl Store {
    async fn numbered(&self) -> Result<u32, E> {
        Ok(at.number())
    }

    async fn formatted(&self) -> Result<String, E> {
        Ok(format!("{at:?}"))
    }

    async fn unnumbered(&self) -> Result<u32, E> {
        Ok(0)
    }
}

/// Calls each method once, so none is dead code.
pub fn use_store() {
    let _ = (Store.numbered(), Store.formatted(), Store.unnumbered());
}
