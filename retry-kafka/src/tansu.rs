//! Where the Kafka test broker is looked for: shared by the crate's
//! [`broker`](crate::broker) module and its build script (which marks the
//! broker's tests ignored when none is found).

use std::path::PathBuf;
use std::process::Command;

/// The command that installs the broker where it is looked for first after `$TANSU`.
// Public through `broker::INSTALL`; the build script compiles this file too.
#[allow(unreachable_pub)]
pub const INSTALL: &str = "cargo install tansu --version 0.6.0 --locked --debug --no-default-features --features dynostore,libsql --root ~/.cache/retries-ci/tansu && echo dynostore,libsql > ~/.cache/retries-ci/tansu/features";

/// The places looked at, in order: `$TANSU`, the cache `.ci/run` installs
/// into, then `tansu` on the `PATH`.
pub(crate) fn candidates() -> Vec<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os("TANSU") {
        candidates.push(PathBuf::from(p));
    }
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(PathBuf::from(home).join(".cache/retries-ci/tansu/bin/tansu"));
    }
    candidates.push(PathBuf::from("tansu"));
    candidates
}

/// The first candidate that reports version 0.6.0.
pub(crate) fn find() -> Option<PathBuf> {
    candidates().into_iter().find(|p| {
        Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("0.6.0"))
    })
}
