use retries::retryable;

#[retryable(deadline = "1s", idempotent)]
struct Client;

fn main() {}
