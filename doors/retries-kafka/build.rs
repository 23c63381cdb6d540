//! Whether the Kafka test broker (tansu 0.6.0) is installed, looked up where
//! `retries_kafka::broker::binary` looks: without it (and unless
//! `RETRIES_KAFKA_REQUIRED` is set, as `.ci/run` sets it) the tests that need
//! it are compiled as ignored, so `cargo test` reports them as ignored, not
//! as passed.

#[path = "src/tansu.rs"]
mod tansu;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(no_kafka_broker)");
    println!("cargo::rustc-check-cfg=cfg(no_durable_kafka_broker)");
    println!("cargo::rerun-if-env-changed=TANSU");
    println!("cargo::rerun-if-env-changed=RETRIES_KAFKA_REQUIRED");
    println!("cargo::rerun-if-env-changed=PATH");
    // Looked at again when an install appears (a missing path counts as
    // changed, so a machine without the broker checks on every build).
    for p in tansu::candidates().iter().filter(|p| p.is_absolute()) {
        println!("cargo::rerun-if-changed={}", p.display());
    }
    let required = std::env::var_os("RETRIES_KAFKA_REQUIRED").is_some();
    let found = tansu::find();
    if let Some(bin) = &found {
        // The stamp of its features, beside `bin/`.
        if let Some(root) = bin.parent().and_then(std::path::Path::parent) {
            println!(
                "cargo::rerun-if-changed={}",
                root.join("features").display()
            );
        }
    }
    if !required && found.as_deref().is_some_and(|bin| !tansu::durable(bin)) {
        println!("cargo::rustc-cfg=no_durable_kafka_broker");
        println!(
            "cargo::warning=tansu 0.6.0 found without a features stamp naming libsql (durable storage): the broker-restart test is ignored (install: {})",
            tansu::INSTALL
        );
    }
    if found.is_none() && !required {
        println!("cargo::rustc-cfg=no_kafka_broker");
        println!(
            "cargo::warning=tansu 0.6.0 not found: the Kafka tests are ignored (install: {})",
            tansu::INSTALL
        );
    }
}
