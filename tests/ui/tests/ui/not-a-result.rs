use retries::retryable;

#[retryable(deadline = "1s", idempotent)]
async fn fetch() -> u32 {
    1
}

fn main() {}
