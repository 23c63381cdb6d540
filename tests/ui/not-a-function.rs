use retry::retryable;

#[retryable(deadline = "1s", idempotent)]
struct Client;

fn main() {}
