static PAYMENTS: retry::TokenBucket = retry::TokenBucket::new(0, 0.1);

fn main() {
    let _ = &PAYMENTS;
}
