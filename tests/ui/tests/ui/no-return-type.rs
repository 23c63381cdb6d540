use retries::retryable;

#[retryable(deadline = "1s", idempotent)]
async fn fire() {}

fn main() {}
