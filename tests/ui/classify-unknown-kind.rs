#[derive(Debug, retry::Classify)]
enum E {
    #[classify(retryable)]
    Lost,
}

fn main() {}
