#[derive(Debug, retry::Classify)]
enum E {
    #[classify(unknown)]
    Lost,
    Refused,
}

fn main() {}
