use retries::retryable;

type Count = u32;

#[retryable(deadline = "1s", idempotent)]
async fn fetch() -> Count {
    1
}

fn main() {}
