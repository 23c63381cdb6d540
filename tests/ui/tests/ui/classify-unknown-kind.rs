#[derive(Debug, retries::Classify)]
enum E {
    #[classify(retryable)]
    Lost,
}

fn main() {}
