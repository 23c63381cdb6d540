#[derive(Debug, retries::Classify)]
enum E {
    #[classify(transparent)]
    Io(std::io::Error, u32),
}

fn main() {}
