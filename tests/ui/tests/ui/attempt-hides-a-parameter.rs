use retries::retryable;

#[derive(Debug, thiserror::Error, retries::Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

#[retryable(deadline = "1s", idempotent, attempt = at)]
async fn by_name(at: u32) -> Result<u32, E> {
    Ok(at + 1)
}

#[derive(Clone, Copy)]
struct Pair {
    left: u32,
    right: u32,
}

// A name bound inside a pattern counts too.
#[retryable(deadline = "1s", idempotent, attempt = right)]
async fn in_a_pattern(Pair { left, right }: Pair) -> Result<u32, E> {
    if left == 0 {
        return Err(E::Refused);
    }
    Ok(left + right)
}

fn main() {}
