//! A body written on one line (`{ Ok(1) }`) gets no lint of its own from the
//! expansion: `unused_braces` used to fire on it, in the user's code.
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

#[retryable(deadline = "1s", idempotent)]
async fn ready() -> Result<u32, E> { Ok(1) }

#[retryable(deadline = "1s", idempotent, attempt = at)]
async fn numbered() -> Result<u32, E> { Ok(at.number()) }

#[retryable(deadline = "1s", idempotent)]
fn blocking() -> Result<u32, E> { Err(E::Refused) }

#[retryable(deadline = "1s", idempotent, hedge(max_attempts = 2, delay = "10ms"))]
async fn hedged() -> Result<u32, E> { Ok(2) }

struct Client;

#[retryable(deadline = "1s", idempotent)]
impl Client {
    async fn get(&self) -> Result<u32, E> { Ok(3) }
}

fn main() {
    let _ = (ready(), numbered(), blocking(), hedged(), Client.get());
}
