//! Whether PostgreSQL's server programs (13 or later) are on this machine,
//! looked up where the tests look: without them (and unless
//! `RETRIES_POSTGRES_REQUIRED` is set, as `.ci/run` sets it) the tests that
//! need a server are compiled as ignored, so `cargo test` reports them as
//! ignored, not as passed.

#[path = "src/binaries.rs"]
mod binaries;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(no_postgres)");
    println!("cargo::rerun-if-env-changed=PG_BIN");
    println!("cargo::rerun-if-env-changed=RETRIES_POSTGRES_REQUIRED");
    println!("cargo::rerun-if-env-changed=PATH");
    for p in binaries::candidates().iter().filter(|p| p.is_absolute()) {
        println!("cargo::rerun-if-changed={}", p.display());
    }
    if binaries::find().is_none() && std::env::var_os("RETRIES_POSTGRES_REQUIRED").is_none() {
        println!("cargo::rustc-cfg=no_postgres");
        println!(
            "cargo::warning=PostgreSQL's initdb and pg_ctl (13 or later) not found: the database tests are ignored (set PG_BIN to their folder)"
        );
    }
}
