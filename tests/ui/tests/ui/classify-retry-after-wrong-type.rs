#[derive(Debug, retries::Classify)]
enum E {
    #[classify(not_executed)]
    Busy {
        #[classify(retry_after)]
        seconds: u64,
    },
}

fn main() {}
