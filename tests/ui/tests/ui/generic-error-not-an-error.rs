use retries::{Classify, Stopped, retryable};

#[retryable(deadline = "1s", idempotent)]
async fn fetch<E: Classify + From<Stopped>>(f: impl Fn() -> Result<u32, E>) -> Result<u32, E> {
    f()
}

fn main() {}
