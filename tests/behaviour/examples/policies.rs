//! `cargo run -p retries-tests --example policies [FILE]`: a retry policy per
//! downstream service from a TOML file (default `policies.toml` beside this
//! example), validated when it is read, then one call per service with the
//! policy it was given. A bad file is reported with the field at fault.

use std::collections::BTreeMap;
use std::path::PathBuf;

use retries::{Attempt, Policy, TokenBucket};

#[derive(serde::Deserialize)]
struct Config {
    budget: TokenBucket,
    services: BTreeMap<String, Policy>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let path = std::env::args_os().nth(1).map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/policies.toml"),
        PathBuf::from,
    );
    let text = std::fs::read_to_string(&path).expect("read the policy file");
    let config: Config = match toml::from_str(&text) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{}: {e}", path.display());
            std::process::exit(1);
        }
    };
    for (service, policy) in &config.services {
        let b = policy.backoff();
        println!(
            "{service}: deadline {:?}, {} attempts, attempt timeout {:?}, reserve {:?}, backoff {:?} from {:?} to {:?}",
            policy.deadline(),
            policy.max_attempts(),
            policy.attempt_timeout(),
            policy.reserve(),
            b.kind(),
            b.initial(),
            b.max(),
        );
        // A call refused once (not executed), under this service's policy
        // and the shared budget.
        let answer: Result<u32, std::io::Error> = retries::call(policy)
            .idempotent()
            .budget(&config.budget)
            .run(async |at: &Attempt| {
                if at.number() < 2 {
                    Err(std::io::ErrorKind::ConnectionRefused.into())
                } else {
                    Ok(at.number())
                }
            })
            .await;
        println!("  call: {answer:?}");
    }
}
