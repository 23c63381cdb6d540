#[derive(Debug, retries::Classify)]
enum E {
    #[classify(unknown)]
    Lost,
    Refused,
}

fn main() {}
