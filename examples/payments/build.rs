//! Generate the gRPC code with `protox`, a protobuf compiler in pure Rust, so a
//! fresh machine builds with plain `cargo`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/payments.proto");
    println!("cargo:rerun-if-changed=proto/events.proto");
    let descriptors = protox::compile(["proto/payments.proto", "proto/events.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
