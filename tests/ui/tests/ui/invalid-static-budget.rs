static PAYMENTS: retries::TokenBucket = retries::TokenBucket::new(0, 0.1);

fn main() {
    let _ = &PAYMENTS;
}
